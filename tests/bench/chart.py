#!/usr/bin/python3
"""chart: make bench's results as a table and a chart. Reads run.sh's output (the summary
table it prints after the DRAM rows: test, kvstashd, raw TCP, kv/raw, redis-server and
memcached medians) and writes into OUT_DIR:

  summary.txt  the summary table as run.sh printed it
  summary.dat  one row per GB/s test: name and GB/s of kvstashd, raw TCP, Redis, memcached
               ("?" where a peer did not run), for gnuplot or a spreadsheet
  summary.png  the same as a clustered bar chart (gnuplot, pngcairo or png terminal)

It only parses and plots; it never runs a benchmark. A keys/s row (exists) is in the table
and left out of the GB/s chart. Exit 1 when the output holds no summary table.

usage: chart.py RUN_LOG OUT_DIR
"""
import os
import re
import shutil
import subprocess
import sys

CELL = re.compile(r"[\d.]+ (?:GB/s|keys/s), p99 \d+ us(?:, \S+ core-s/GB)?|n/a|failed|-|[\d.]+")
SYSTEMS = ["kvstashd", "raw TCP", "redis-server", "memcached"]


def parse(lines):
    """[(name, [kv, raw, ratio, redis, mc] cells)] of the summary table, and its lines."""
    rows, table, inside = [], [], False
    for line in lines:
        line = line.rstrip("\n")
        if not inside:
            if line.startswith("test ") and "kvstashd (median)" in line:
                inside = True
                table.append(line)
            continue
        if not line.strip():
            break
        table.append(line)
        name, _, rest = line.partition(" ")
        cells = CELL.findall(rest)
        if len(cells) == 5:
            rows.append((name, cells))
    return rows, table


def gbs(cell):
    m = re.match(r"([\d.]+) GB/s", cell)
    return m.group(1) if m else "?"


def main():
    if len(sys.argv) != 3:
        sys.exit("usage: chart.py RUN_LOG OUT_DIR")
    with open(sys.argv[1], encoding="utf-8", errors="replace") as f:
        rows, table = parse(f)
    if not rows:
        sys.exit(f"chart.py: {sys.argv[1]}: no summary table (run.sh did not finish?)")
    out = sys.argv[2]
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "summary.txt"), "w", encoding="utf-8") as f:
        f.write("\n".join(table) + "\n")
    dat = os.path.join(out, "summary.dat")
    plotted = [(n, c) for n, c in rows if "GB/s" in c[0]]
    with open(dat, "w", encoding="utf-8") as f:
        f.write("# test " + " ".join(f'"{s}"' for s in SYSTEMS) + "  (GB/s, median)\n")
        for name, c in plotted:
            f.write(f"{name} {gbs(c[0])} {gbs(c[1])} {gbs(c[3])} {gbs(c[4])}\n")
    png = os.path.join(out, "summary.png")
    if shutil.which("gnuplot") is None:
        print("chart.py: gnuplot not installed (make bench-deps installs gnuplot-nox); "
              f"wrote {dat} only", file=sys.stderr)
        return
    terms = subprocess.run(["gnuplot", "-e", "set terminal"], capture_output=True,
                           text=True).stderr
    term = "pngcairo size 1100,560 font ',10'" if "pngcairo" in terms else "png size 1100,560"
    script = f"""
set terminal {term}
set output '{png}'
set title 'make bench: GB/s per test (median), higher is better'
set style data histogram
set style histogram clustered gap 1
set style fill solid 0.85 border -1
set boxwidth 0.9
set datafile missing '?'
set ylabel 'GB/s'
set yrange [0:*]
set grid ytics
set key top left
set xtics rotate by -30
plot '{dat}' using 2:xtic(1) title 'kvstashd', '' using 3 title 'raw TCP', \\
     '' using 4 title 'redis-server', '' using 5 title 'memcached'
"""
    # a peer that never ran leaves its column empty: gnuplot warns and draws the others
    r = subprocess.run(["gnuplot"], input=script, text=True, capture_output=True)
    if r.returncode != 0:
        sys.exit(f"chart.py: gnuplot failed:\n{r.stderr}")
    print(f"chart.py: {os.path.join(out, 'summary.txt')}, {dat}, {png}")


if __name__ == "__main__":
    main()
