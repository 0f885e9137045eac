"""kvstash stats, top and bench as an operator uses them: stats grouped in human units with
--json and --raw agreeing, bench's result lines (and its keys gone afterwards), top as plain
lines when piped, and top on a real terminal (tmux) showing traffic as it flows and quitting
on q."""

import json
import os
import re
import shutil
import subprocess
import time
import uuid

import pytest

from kvtest import ROOT, wait_for

CLI = os.environ.get("KVSTASH_CLI") or str(ROOT / "build/release/kvstash")


def cli(d, *args, timeout=60):
    return subprocess.run([CLI, "-H", f"127.0.0.1:{d.port}", "-t", "10000", *args],
                          capture_output=True, text=True, timeout=timeout)


def test_stats_grouped_human_json_raw(daemons):
    d = daemons(["--memory_size=64m", "--ssd_dir="])
    c = d.client()
    c.call("put", "k", b"x" * 3000)
    c.call("get", "k")
    r = cli(d, "stats")
    assert r.returncode == 0, r.stderr
    for group in ["process", "requests", "DRAM tier", "requests by method"]:
        assert re.search(rf"^{group}$", r.stdout, re.M), r.stdout
    assert re.search(r"^\s+bytes_in\s+[\d.]+ (B|KiB)$", r.stdout, re.M), r.stdout
    assert re.search(r"^\s+memory_capacity\s+64\.00 MiB$", r.stdout, re.M), r.stdout
    assert re.search(r"^\s+hit ratio\s+100\.0%", r.stdout, re.M), r.stdout
    j = cli(d, "stats", "--json")
    assert j.returncode == 0, j.stderr
    obj = json.loads(j.stdout)
    raw = dict(line.split() for line in cli(d, "stats", "--raw").stdout.splitlines())
    assert set(obj) == set(raw) and obj["memory_capacity"] == 64 << 20
    assert obj["hits"] == 1 and int(raw["hits"]) == 1
    assert cli(d, "stats", "--bogus").returncode == 2


def test_stats_hit_ratio_per_tier(daemons, work):
    """One SSD hit, one DRAM hit, two misses: stats shows 50% overall, DRAM 25% of the
    lookups, SSD 33.3% of what DRAM missed (the dashboard's per-tier ratios)."""
    data = os.path.join(work, "ratio-data")
    args = ["--memory_size=64m", "--ssd_offload=write_through"]
    d = daemons(args, data_dir=data)
    c = d.client()
    c.call("put", "on-ssd", b"s" * 8192)
    wait_for(lambda: c.call("stats")["ssd_objects"] >= 1, 60, "the object on the SSD")
    d.stop()
    d = daemons(args, data_dir=data)          # restarted: the object is on the SSD only
    c = d.client()
    assert c.call("get", "on-ssd") == b"s" * 8192           # SSD hit (loaded)
    assert c.call("get", "on-ssd") == b"s" * 8192           # DRAM hit
    assert c.call("batch_get", ["gone", "also-gone"]) == [None, None]
    obj = json.loads(cli(d, "stats", "--json").stdout)
    assert (obj["hits_dram"], obj["hits_ssd"], obj["misses"], obj["hits"]) == (1, 1, 2, 2)
    r = cli(d, "stats")
    assert r.returncode == 0, r.stderr
    assert re.search(r"^\s+hit ratio\s+50\.0% \(DRAM 25\.0% of lookups, SSD 33\.3% of what "
                     r"DRAM missed\)$", r.stdout, re.M), r.stdout


def test_bench_prints_kvstash_bench_lines_and_cleans_up(daemons):
    d = daemons(["--memory_size=64m", "--ssd_dir="])
    r = cli(d, "bench", "-n", "300", "-s", "4k")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert [ln.split()[0] for ln in lines] == ["mode=put", "mode=get"], r.stdout
    for ln in lines:
        f = dict(kv.split("=", 1) for kv in ln.split())
        assert f["size"] == "4096" and f["misses"] == "0" and f["errors"] == "0", ln
        assert float(f["keys/s"]) > 0 and float(f["p99_us"]) >= float(f["p50_us"]) > 0, ln
    obj = json.loads(cli(d, "stats", "--json").stdout)
    assert obj["objects"] == 0 and obj["hits"] == 300
    assert cli(d, "bench", "-n", "0").returncode == 2


def test_top_plain_lines_when_piped(daemons):
    d = daemons(["--memory_size=64m", "--ssd_dir="])
    r = cli(d, "top", "-n", "3", "-d", "0.2")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert len(lines) == 3 and "\033" not in r.stdout
    assert all(ln.startswith("requests/s=") and " conns=1 " in ln for ln in lines), r.stdout


def test_top_in_a_terminal_shows_traffic_and_quits_on_q(daemons):
    if shutil.which("tmux") is None:
        pytest.skip("tmux is not installed")
    d = daemons(["--memory_size=64m", "--ssd_dir="])
    sock = f"kvstash-test-{uuid.uuid4().hex[:8]}"  # a private tmux server
    tmux = ["tmux", "-L", sock]
    subprocess.run(tmux + ["-f", "/dev/null", "new-session", "-d", "-x", "100", "-y", "30",
                           f"{CLI} -H 127.0.0.1:{d.port} top -d 0.3; echo top-exited=$?; "
                           "sleep 30"], check=True)

    def screen():
        return subprocess.run(tmux + ["capture-pane", "-p"], capture_output=True,
                              text=True).stdout

    try:
        wait_for(lambda: "kvstash top" in screen(), 20, "top's screen")
        c = d.client()
        c.call("put", "t", b"v" * 1000)
        stop = time.monotonic() + 30

        def hits_shown():
            # keep traffic flowing until a refresh shows it (bounded by the wait)
            for _ in range(50):
                c.call("get", "t")
                c.call("get", "missing")
            m = re.search(r"hits/s\s+(\d+)", screen())
            return m is not None and int(m.group(1)) > 0 and time.monotonic() < stop

        wait_for(hits_shown, 30, "hits/s above 0 on top's screen")
        s = screen()
        assert re.search(r"hit ratio\s+[\d.]+%", s), s
        assert re.search(r"conns\s+2\b", s), s
        subprocess.run(tmux + ["send-keys", "q"], check=True)
        wait_for(lambda: "top-exited=0" in screen(), 20, "top to exit on q")
        assert "kvstash top" not in screen()  # the alternate screen is gone
    finally:
        subprocess.run(tmux + ["kill-server"], capture_output=True)
