"""tests/bench/chart.py on a saved sample of run.sh's output (tests/data/bench-summary.log, the
summary of a real make bench run without the peers): the table, the .dat gnuplot reads and
the PNG. Also a summary with every peer, built from run.sh's printf formats."""

import shutil
import subprocess

import pytest

from kvtest import ROOT

CHART = ROOT / "tests/bench/chart.py"
SAMPLE = ROOT / "tests/data/bench-summary.log"


def run(log, out):
    return subprocess.run(["/usr/bin/python3", str(CHART), str(log), str(out)],
                          capture_output=True, text=True)


def dat_rows(out):
    return [ln.split() for ln in (out / "summary.dat").read_text().splitlines()
            if not ln.startswith("#")]


def test_saved_run_gives_table_dat_and_png(tmp_path):
    r = run(SAMPLE, tmp_path)
    assert r.returncode == 0, r.stderr
    rows = dat_rows(tmp_path)
    names = [x[0] for x in rows]
    assert names == ["get-1m-c1", "get-1m-c8", "put-1m-c1", "put-1m-c8", "get-64k-c8",
                     "put-64k-c8", "get-4m-c8", "put-4m-c8"]  # exists (keys/s) and probes out
    assert rows[0] == ["get-1m-c1", "4.253", "4.657", "?", "?"]
    table = (tmp_path / "summary.txt").read_text()
    assert "exists-128-c4" in table and table.startswith("test ")
    if shutil.which("gnuplot") is None:
        pytest.skip("gnuplot not installed (make bench-deps installs gnuplot-nox)")
    png = (tmp_path / "summary.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 5000


def test_every_peer_lands_in_its_column(tmp_path):
    log = tmp_path / "run.log"
    fmt = "%-15s %-46s %-30s %-9s %-46s %s"
    lines = [fmt % ("test", "kvstashd (median)", "raw TCP (median)", "kv/raw",
                    "redis-server (median)", "memcached (median)"),
             fmt % ("get-64k-c8", "4.182 GB/s, p99 45089 us, 0.193 core-s/GB",
                    "5.408 GB/s, p99 30933 us, 0.180 core-s/GB", "0.77",
                    "1.250 GB/s, p99 900 us, 0.500 core-s/GB",
                    "2.500 GB/s, p99 800 us, 0.300 core-s/GB"),
             fmt % ("put-1m-c8", "4.818 GB/s, p99 115343 us, 0.129 core-s/GB", "-", "-",
                    "failed", "n/a"),
             ""]
    log.write_text("noise before\n" + "\n".join(lines) + "\nnoise after\n")
    assert run(log, tmp_path / "out").returncode == 0
    assert dat_rows(tmp_path / "out") == [["get-64k-c8", "4.182", "5.408", "1.250", "2.500"],
                                          ["put-1m-c8", "4.818", "?", "?", "?"]]


def test_no_summary_is_an_error(tmp_path):
    log = tmp_path / "run.log"
    log.write_text("== kvstashd\nrun.sh: 1 kvstash-bench run(s) failed\n")
    r = run(log, tmp_path / "out")
    assert r.returncode == 1 and "no summary table" in r.stderr
