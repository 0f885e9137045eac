"""The operators' port and logs: /metrics, /healthz, /readyz and /stats on metrics_listen,
log_format json, SIGUSR1 after logrotate's rename, and the Grafana dashboard.

/metrics must pass `promtool check metrics` and parse with prometheus_client; its counters
must move as traffic flows (hits, misses, bytes by transport, histogram counts); /stats must
be the stats map the msgpack `stats` method answers; /readyz must say 503 and why until the
listeners are up and the SSD index is open, then 200; every expression of
packaging/grafana/kvstash.json must name a metric that /metrics serves.
"""

import hashlib
import json
import os
import re
import signal
import subprocess
import time
import urllib.error
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

redis = pytest.importorskip("redis", reason="python3-redis is not installed")

from kvtest import ROOT, Daemon, free_port, wait_for

DASHBOARD = os.path.join(ROOT, "packaging", "grafana", "kvstash.json")
ADMIN_TOKEN = "metrics-admin-token"


def sha(token):
    return hashlib.sha256(token.encode()).hexdigest()


def http(port, path, token=None, timeout=10):
    """(status, body text, headers) of GET http://127.0.0.1:port/path."""
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}")
    if token is not None:
        req.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, r.read().decode(), r.headers
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode(), e.headers


def scrape(port, token=None):
    """/metrics as {(name, frozenset(labels)): value}, after promtool and the parser agree."""
    status, text, headers = http(port, "/metrics", token)
    assert status == 200, text
    assert headers["Content-Type"].startswith("text/plain; version=0.0.4"), headers
    p = subprocess.run(["promtool", "check", "metrics"], input=text.encode(),
                       capture_output=True, timeout=60)
    assert p.returncode == 0, f"promtool check metrics:\n{p.stdout.decode()}{p.stderr.decode()}"
    samples = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            samples[(s.name, frozenset(s.labels.items()))] = s.value
    return samples


def val(samples, name, **labels):
    return samples[(name, frozenset(labels.items()))]


@pytest.fixture
def kv(daemons, work):
    port = free_port()
    d = daemons([f"--metrics_listen=127.0.0.1:{port}", "--memory_size=64m"])
    d.metrics_port = port
    return d


def test_metrics_parse_and_move_with_traffic(kv):
    before = scrape(kv.metrics_port)
    c = kv.tcp()
    u = kv.unix()
    c.call("put", b"m-key", b"x" * 5000)
    assert c.call("get", b"m-key") == b"x" * 5000
    assert c.call("get", b"m-absent") is None
    assert u.call("get", b"m-key") == b"x" * 5000
    c.call("put", b"m-b", b"y")
    assert c.call("prefix_match", [b"m-key", b"m-b", b"m-absent", b"m-key"]) == 2
    after = scrape(kv.metrics_port)

    def delta(name, **labels):
        return val(after, name, **labels) - val(before, name, **labels)

    assert delta("kvstash_requests_total", method="get") == 3
    assert delta("kvstash_request_duration_seconds_count", method="get") == 3
    assert delta("kvstash_request_duration_seconds_bucket", method="get", le="+Inf") == 3
    assert delta("kvstash_request_duration_seconds_sum", method="get") > 0
    assert delta("kvstash_hits_total", tier="dram") == 2
    assert delta("kvstash_misses_total", tier="dram") == 1
    assert delta("kvstash_prefix_blocks_asked_total") == 4
    assert delta("kvstash_prefix_blocks_found_total") == 2
    assert delta("kvstash_received_bytes_total", transport="tcp") > 5000
    assert delta("kvstash_sent_bytes_total", transport="tcp") > 5000
    assert delta("kvstash_sent_bytes_total", transport="unix") > 5000
    assert val(after, "kvstash_objects", tier="dram") >= 2
    assert val(after, "kvstash_connections") >= 2
    assert val(after, "kvstash_build_info", version=val_version(after)) == 1
    assert val(after, "kvstash_process_resident_memory_bytes") > 0
    assert abs(val(after, "kvstash_process_start_time_seconds") - time.time()) < 3600
    # an error is counted by method and code
    err, _ = c.call_raw("get", 42)
    assert err is not None
    again = scrape(kv.metrics_port)
    assert val(again, "kvstash_request_errors_total", method="get", code="INVALID_ARGUMENT") == 1


def test_hits_and_misses_by_tier_counted_at_each_lookup(work):
    """Reads over both ports against objects on the SSD only, in DRAM, and absent: each
    lookup moves exactly one of hits{dram}, hits{ssd}, misses, at the place it resolved.

    The SSD-only objects are made by a restart: put with write_through, wait until the tier
    has them, restart (DRAM starts empty; the index knows them). A second read of a loaded
    one is a DRAM hit. prefix_match and batch_is_exist probe and are not counted here."""
    port, rport = free_port(), free_port()
    data = os.path.join(work, "tier-data")
    args = ["--memory_size=64m", "--ssd_offload=write_through", f"--metrics_listen=127.0.0.1:{port}",
            f"--resp_listen=127.0.0.1:{rport}"]
    value = lambda i: bytes([i]) * 20000   # noqa: E731
    d = Daemon(work, args, data_dir=data)
    try:
        d.wait_ready()
        c = d.tcp()
        keys = [b"t%02d" % i for i in range(12)]
        c.call("batch_put", keys, [value(i) for i in range(12)])
        wait_for(lambda: c.call("stats")["ssd_objects"] >= 12, 60, "the 12 objects on SSD")
        d.stop()
    finally:
        d.reap()
    d = Daemon(work, args, data_dir=data)
    try:
        d.wait_ready()
        c = d.tcp()
        before = scrape(port)
        assert c.call("stats")["dram_objects"] == 0          # all 12 on the SSD only
        c.call("put", b"dram-only", b"d" * 20000)            # in DRAM (and written through)
        assert c.call("get", keys[0]) == value(0)             # ssd hit (loaded)
        assert c.call("get", keys[0]) == value(0)             # dram hit (now resident)
        assert c.call("get", b"dram-only") == b"d" * 20000    # dram hit
        assert c.call("get", b"absent") is None               # miss
        got = c.call("batch_get", [keys[1], keys[2], b"dram-only", b"absent", keys[9]])
        assert got == [value(1), value(2), b"d" * 20000, None, value(9)]
        # ssd: keys 1, 2 and 9; dram: dram-only; miss: absent (no key twice in the batch: its
        # second lookup is the SSD's or DRAM's by whether the first one's load has finished)
        assert c.call("prefix_match", [keys[3], keys[4], b"absent"]) == 2      # not counted
        assert c.call("batch_is_exist", [keys[5], b"absent"]) == [True, False]  # not counted
        r = redis.Redis(port=rport)
        assert r.get(keys[6]) == value(6)                      # ssd hit over RESP
        assert r.mget([keys[7], b"absent", keys[6], keys[8]]) == [
            value(7), None, value(6), value(8)]                # ssd, miss, dram, ssd
        r.close()
        after = scrape(port)
    finally:
        d.stop()
        d.reap()

    def delta(name, **labels):
        return val(after, name, **labels) - val(before, name, **labels)

    hits_ssd, hits_dram, misses = 1 + 3 + 1 + 2, 1 + 1 + 1 + 1, 1 + 1 + 1
    assert delta("kvstash_hits_total", tier="ssd") == hits_ssd
    assert delta("kvstash_hits_total", tier="dram") == hits_dram
    # a read looks in DRAM, then on the SSD: DRAM missed the SSD's hits and the misses
    assert delta("kvstash_misses_total", tier="dram") == hits_ssd + misses
    assert delta("kvstash_misses_total", tier="ssd") == misses


def val_version(samples):
    return next(dict(k[1])["version"] for k in samples if k[0] == "kvstash_build_info")


def test_probes_and_unknown_paths(kv):
    assert http(kv.metrics_port, "/healthz")[:2] == (200, "ok\n")
    wait_for(lambda: http(kv.metrics_port, "/readyz")[:2] == (200, "ready\n"), 30,
             "/readyz 200 ready")
    assert http(kv.metrics_port, "/nope")[0] == 404
    assert http(kv.metrics_port, "/metrics?x=1")[0] == 200


def test_stats_json_is_the_stats_method(kv):
    c = kv.tcp()
    c.call("put", b"s-key", b"v" * 100)
    c.call("get", b"s-key")
    status, text, headers = http(kv.metrics_port, "/stats")
    assert status == 200 and headers["Content-Type"] == "application/json"
    web = json.loads(text)
    rpc = c.call("stats")
    rpc = {k.decode() if isinstance(k, bytes) else k: v for k, v in rpc.items()}
    assert set(web) == set(rpc)
    moving = {"uptime_s", "ops.stats", "bytes_in", "bytes_out", "memory_prefaulted"}
    for k in set(rpc) - moving:
        assert web[k] == rpc[k], k


def fill_ssd(d, n):
    """n small objects written through to the SSD tier (so that a restart has an index)."""
    c = d.tcp()
    batch = 2000
    for i in range(0, n, batch):
        c.call("batch_put", [b"r%09d" % j for j in range(i, i + batch)], [b"v" * 16] * batch)
    wait_for(lambda: c.call("stats")["ssd_objects"] >= n, 120, "the offloads indexed")


def test_readyz_follows_startup(work):
    """/readyz answers 503 with the reason until the SSD index is open and the listeners are
    up, then 200; the reasons follow start-up in order, never back."""
    port = free_port()
    data = os.path.join(work, "ready-data")
    d = Daemon(work, ["--memory_size=64m", "--ssd_offload=write_through"], data_dir=data)
    try:
        d.wait_ready()
        fill_ssd(d, 20000)
        d.stop()
    finally:
        d.reap()
    d = Daemon(work, [f"--metrics_listen=127.0.0.1:{port}", "--memory_size=64m"],
               data_dir=data)
    order = ["starting: the listeners are not up yet", "starting: the SSD index is loading",
             "starting: populating the arena", "ready"]
    seen = []
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            assert d.alive(), d.tail()
            try:
                status, body, _ = http(port, "/readyz", timeout=5)
            except OSError:
                time.sleep(0.002)
                continue
            body = body.strip()
            phase = next(i for i, p in enumerate(order) if body.startswith(p))
            assert (status == 200) == (body == "ready"), (status, body)
            if not seen or seen[-1][0] != phase:
                seen.append((phase, body))
            if status == 200:
                break
            time.sleep(0.002)
        assert seen and seen[-1][1] == "ready", seen
        print("readyz seen", seen)
        phases = [p for p, _ in seen]
        assert phases == sorted(phases), f"/readyz went back: {seen}"
        d.wait_ready()
        c = d.tcp()
        stats = c.call("stats")
        assert stats["ssd_start_objects"] >= 20000
        if stats["ssd_start_ms"] >= 100:
            # the load lasted 50 polls: /readyz must have said so
            assert 1 in phases, (seen, stats["ssd_start_ms"])
        # once ready, it stays ready; /healthz answers throughout
        assert http(port, "/readyz")[0] == 200
        assert http(port, "/healthz")[0] == 200
        d.stop()
    finally:
        d.reap()


def test_require_auth_wants_the_admin_bearer_token(work, daemons):
    conf = os.path.join(work, "auth.conf")
    with open(conf, "w") as f:
        f.write("require_auth yes\n"
                f"tenant admin token_sha256={sha(ADMIN_TOKEN)}\n"
                f"tenant alpha token_sha256={sha('alpha-token')}\n")
    port = free_port()
    d = daemons([f"--config={conf}", f"--metrics_listen=127.0.0.1:{port}", "--memory_size=32m"])
    assert http(port, "/metrics")[0] == 401
    assert http(port, "/stats", token="alpha-token")[0] == 401
    assert http(port, "/metrics", token="wrong")[0] == 401
    assert http(port, "/healthz")[0] == 200
    wait_for(lambda: http(port, "/readyz")[0] == 200, 30, "/readyz 200")
    s = scrape(port, token=ADMIN_TOKEN)
    assert val(s, "kvstash_tenant_quota_bytes", tenant="alpha", tier="dram") == 0
    assert ("kvstash_tenant_objects", frozenset({("tenant", "admin")})) in s
    assert http(port, "/stats", token=ADMIN_TOKEN)[0] == 200
    d.assert_alive()


def test_refused_starts_explain_themselves_in_one_line(work):
    # off loopback without require_auth
    d = Daemon(work, ["--metrics_listen=0.0.0.0:1"])
    assert d.exit_code() != 0
    out = d.output().strip().splitlines()
    assert len(out) == 1 and "metrics_listen" in out[0] and "loopback" in out[0], out
    # the port is taken
    taken = Daemon(work, [f"--metrics_listen=127.0.0.1:{free_port()}"])
    try:
        taken.wait_ready()
        port = taken.cmd[-1].rsplit(":", 1)[1]
        d = Daemon(work, [f"--metrics_listen=127.0.0.1:{port}"])
        assert d.exit_code() != 0
        errors = [ln for ln in d.output().splitlines() if " ERROR " in ln]
        assert len(errors) == 1 and port in errors[0] and "in use" in errors[0], d.output()
    finally:
        taken.reap()


def test_json_logs_parse_line_by_line(daemons, work):
    d = daemons(["--log_format=json", "--log_level=debug"])
    c = d.tcp()
    c.call("put", b"j", b"1")
    c.close()
    err, _ = d.tcp().call_raw("hello", {"tenant": "x", "token": "y"})
    d.stop()
    lines = d.output().splitlines()
    assert lines
    objs = []
    for ln in lines:
        o = json.loads(ln)         # every line is one object
        assert {"ts", "level", "msg", "pid"} <= set(o), o
        assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", o["ts"]), o
        assert o["level"] in ("error", "warn", "info", "debug"), o
        objs.append(o)
    start = next(o for o in objs if o["msg"] == "kvstashd started")
    for k in ("version", "config", "listen", "unix_socket", "metrics_listen", "tiers",
              "transports"):
        assert k in start, start
    assert "dram" in start["tiers"] and "tcp" in start["transports"]
    opened = [o for o in objs if o["msg"] == "connection open"]
    assert opened and isinstance(opened[0]["conn"], int) and opened[0]["peer"], opened


def test_sigusr1_reopens_the_log_after_a_rename(daemons, work):
    log = os.path.join(work, "kv.log")
    d = daemons([f"--log_file={log}", "--log_format=json"])
    wait_for(lambda: os.path.exists(log) and "kvstashd started" in open(log).read(), 10,
             "the start-up line in log_file")
    os.rename(log, log + ".1")
    os.kill(d.pid, signal.SIGUSR1)
    wait_for(lambda: os.path.exists(log) and "reopened" in open(log).read(), 10,
             "a new log_file after SIGUSR1")
    old = open(log + ".1").read()
    assert "kvstashd started" in old and "reopened" not in old
    for ln in open(log).read().splitlines():
        json.loads(ln)


def dashboard_metrics():
    """Every kvstash_* metric name the dashboard's expressions use."""
    with open(DASHBOARD) as f:
        dash = json.load(f)
    exprs = []

    def walk(o):
        if isinstance(o, dict):
            for k, v in o.items():
                if k in ("expr", "definition") and isinstance(v, str):
                    exprs.append(v)
                else:
                    walk(v)
        elif isinstance(o, list):
            for v in o:
                walk(v)

    walk(dash)
    assert exprs, "no expressions in the dashboard"
    names = set()
    for e in exprs:
        found = re.findall(r"\bkvstash_[a-z0-9_]+", e)
        assert found, f"an expression naming no kvstash metric: {e}"
        names.update(found)
    return names


def test_dashboard_names_only_served_metrics(work, daemons):
    conf = os.path.join(work, "dash.conf")
    with open(conf, "w") as f:
        f.write(f"tenant alpha token_sha256={sha('alpha-token')} memory_quota=8m\n")
    port = free_port()
    d = daemons([f"--config={conf}", f"--metrics_listen=127.0.0.1:{port}", "--memory_size=32m"])
    c = d.tcp()
    c.call("put", b"d", b"1")
    c.call("get", b"d")
    assert c.call_raw("get", 42)[0] is not None    # error series appear once non-zero
    served = {name for name, _ in scrape(port)}
    # the parser reports a counter's samples with _total, histograms with their suffixes
    missing = sorted(n for n in dashboard_metrics() if n not in served)
    assert not missing, f"the dashboard names metrics /metrics does not serve: {missing}"
