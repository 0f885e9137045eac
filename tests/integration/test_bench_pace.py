"""The load generators' -r (tests/bench/kvstash_bench.c, mc_bench.c): a paced run stays at
its rate against a daemon that answers far faster, with every request answered, while the
same run unpaced goes past it. resp.sh's like-for-like rows (RESP and msgpack at one rate)
rest on it. kvstash-bench is built by `make all`, mc-bench for `make test-python` and
`make bench`."""

import pathlib
import subprocess

import pytest

from kvtest import KVSTASHD, free_port

BIN = pathlib.Path(KVSTASHD).parent
RATE = 200  # requests/s in all: far below what either port answers
UNPACED = ["-t", "1", "-n", "1000"]  # 4,000 values of 4 KiB at most: no eviction in 64 MiB


def run(cmd):
    r = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    return dict(kv.split("=", 1) for kv in r.stdout.strip().splitlines()[-1].split())


def check_paced(paced, unpaced):
    # each of the 4 threads sends at most ceil(2 s x RATE / 4) requests, over >= 2 s
    assert int(paced["errors"]) == 0 and int(paced["misses"]) == 0
    assert 0 < float(paced["req/s"]) <= RATE * 1.05, paced
    assert float(unpaced["req/s"]) > RATE * 1.05, unpaced


def tool(name):
    path = BIN / name
    if not path.exists():
        pytest.skip(f"{path} not built (make {name})")
    return path


def test_kvstash_bench_rate(daemons):
    bench = tool("kvstash-bench")
    d = daemons(["--memory_size=64m", "--ssd_dir="])
    base = [bench, "-H", f"127.0.0.1:{d.port}", "-c", "4", "-d", "16", "-b", "1", "-s", "4k",
            "-q"]
    for mode in (["-m", "put", "-C"], ["-m", "get", "-k", "64"]):
        check_paced(run(base + mode + ["-t", "2", "-r", str(RATE)]),
                    run(base + mode + UNPACED))


def test_mc_bench_rate_on_resp(daemons):
    bench = tool("mc-bench")
    port = free_port()
    daemons(["--memory_size=64m", "--ssd_dir=", f"--resp_listen=127.0.0.1:{port}"])
    base = [bench, "-P", "resp", "-H", f"127.0.0.1:{port}", "-c", "4", "-d", "16", "-b", "1",
            "-s", "4k", "-C", "-q"]
    for mode in (["-m", "set"], ["-m", "get", "-k", "64"]):
        check_paced(run(base + mode + ["-t", "2", "-r", str(RATE)]),
                    run(base + mode + UNPACED))
