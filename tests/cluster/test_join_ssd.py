"""A member is `joining` until its SSD index is loaded (docs/cluster.md, "States"): a real
etcd and two daemons on 127.0.0.x; n1 has an SSD tier whose index is deleted while it is
stopped, so that its restart rebuilds the index from the bucket files in the background,
slowed by the test hook KVSTASH_TEST_REBUILD_PAUSE_MS. Meanwhile n1 serves its engine from
DRAM but owns no key: it is joining in its own cluster_info, in n2's view, in etcd and in
`kvstash cluster`, placement on n2 never names it, and its /readyz answers 503 with the
reason; once the tier is ready it goes active (and /readyz 200), and the objects of its SSD
tier are served byte-exact. Every wait bounded.
"""

import hashlib
import json
import os
import shutil
import subprocess
import urllib.error
import urllib.request

import pytest

from clusterlib import free_port, wait_until

N = 40
LOADING, READY = 1, 2
CLI = os.environ.get("KVSTASH_CLI") or os.path.join(os.path.dirname(__file__), "..", "..",
                                                    "build", "release", "kvstash")


def readyz(host, port):
    try:
        with urllib.request.urlopen(f"http://{host}:{port}/readyz", timeout=10) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


@pytest.mark.quick
def test_joining_until_the_ssd_index_is_loaded(pool, work):
    data = os.path.join(work, "n1-data")
    mport = free_port("127.0.0.2")
    ssd_args = [f"--ssd_dir={data}/ssd", "--ssd_offload=write_through", "--ssd_size=256m",
                "--ssd_bucket_size=4m", f"--metrics_listen=127.0.0.2:{mport}"]
    n1 = pool.start(args=ssd_args, data_dir=data)
    n2 = pool.start()
    pool.wait_view(2)
    c = n1.tcp()
    table = {}
    for i in range(N):
        k = b"joining-%03d" % i
        v = hashlib.sha256(k).digest() * (100 + 37 * i)
        assert c.call("put", k, v) == 0
        table[k] = hashlib.sha256(v).digest()
    wait_until(lambda: c.call("stats")["ssd_objects"] >= N, "every object on n1's SSD tier")
    n1.stop()
    shutil.rmtree(os.path.join(data, "ssd", "index"))     # the restart rebuilds it

    n1 = pool.restart(n1, env={"KVSTASH_TEST_REBUILD_PAUSE_MS": "4000"})
    c = n1.tcp()
    assert c.call("stats")["ssd_state"] == LOADING
    seen_loading = 0
    keys = list(table)

    def check_while_loading():
        """While n1's tier loads: n1 joining everywhere, owning nothing. True once ready."""
        nonlocal seen_loading
        state = c.call("stats")["ssd_state"]
        if state != LOADING:
            return state == READY
        info = n1.info()
        assert info["state"] == "joining", info
        v2 = n2.info(keys)
        if c.call("stats")["ssd_state"] != LOADING:
            return False        # it went ready between the two looks: judge the next round
        states = {n["id"]: n["state"] for n in v2["nodes"]}
        assert states.get("n1") in (None, "joining"), states
        idx = [i for i, n in enumerate(v2["nodes"]) if n["id"] == "n1"]
        assert not any(i in own for own in v2["owners"] for i in idx), v2["owners"]
        code, body = readyz("127.0.0.2", mport)
        if c.call("stats")["ssd_state"] == LOADING:
            assert code == 503 and "joining the pool" in body and "SSD index" in body, body
            seen_loading += 1
        return False

    # the first look, with the rebuild paused: everything says joining
    assert not check_while_loading()
    out = subprocess.run([CLI, "-H", n1.addr, "cluster"], capture_output=True, text=True,
                         timeout=30)
    assert out.returncode == 0 and "this node: n1, joining" in out.stdout, out
    assert json.loads(pool.etcd.get("/kvstash/pool/nodes/n1"))["state"] == "joining"
    assert c.call("put", b"fresh", b"x" * 3000) == 0                 # DRAM serves meanwhile
    assert c.call("get", b"fresh") == b"x" * 3000
    wait_until(check_while_loading, "n1's SSD tier ready", timeout=60)
    assert seen_loading >= 1
    assert "stays joining until its SSD index is loaded" in n1.output(), n1.tail()

    # then active: in every view, in etcd, on /readyz; the SSD objects come back
    assert pool.wait_view(2) == {"n1": "active", "n2": "active"}
    assert json.loads(pool.etcd.get("/kvstash/pool/nodes/n1"))["state"] == "active"
    wait_until(lambda: readyz("127.0.0.2", mport)[0] == 200, "/readyz 200")
    for k, d in table.items():
        got = c.call("get", k)
        assert got is not None and hashlib.sha256(got).digest() == d, k
