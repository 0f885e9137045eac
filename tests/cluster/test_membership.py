"""Membership of the pool in etcd (docs/cluster.md), against a real etcd on loopback and
kvstashd daemons on 127.0.0.x addresses: boot and one view, duplicate node_id and a
different pool config refused, etcd stopped and SIGSTOPped (the daemons go on serving and
rejoin), a lease lost (registered again), a watch idle past its timeout, a compaction past
the watch's revision (a full re-read), drain visible, placement equal to the reference.
Every wait is bounded; the bounds are generous guards, not performance targets.
"""

import os
import random
import signal
import sys
import time

import pytest

sys.path.insert(0, os.path.dirname(__file__))
from clusterlib import Proxy, free_port  # noqa: E402
from kvtest import wait_for  # noqa: E402
import place_ref  # noqa: E402


def put_get(node, key, value):
    """A plain put then get on node: what an engine does whatever etcd is doing."""
    c = node.tcp()
    c.call("put", key, value)
    assert c.call("get", key) == value


def counters(node):
    return node.info()["counters"]


@pytest.mark.quick
def test_boot_three_nodes_one_view(pool):
    t0 = time.monotonic()
    nodes = [pool.start() for _ in range(3)]
    view = pool.wait_view(3, timeout=5.0)   # the bound, generous here
    assert view == {"n1": "active", "n2": "active", "n3": "active"}
    assert time.monotonic() - t0 < 15
    revs = set()
    for i, n in enumerate(nodes):
        info = n.info()
        revs.add(info["revision"])
        assert info["cluster"] == "pool" and info["node_id"] == f"n{i + 1}"
        assert info["replicas"] == 2 and info["registered"] and info["etcd_ok"]
        assert info["state"] == "active"
        assert [x["id"] for x in info["nodes"]] == ["n1", "n2", "n3"]
        assert info["nodes"][info["self"]]["id"] == n.node_id
        assert {x["id"]: x["addr"] for x in info["nodes"]} == \
            {m.node_id: m.addr for m in nodes}, "each advertises its listen address"
        assert all(x["weight"] == 1.0 for x in info["nodes"])
    assert len(revs) == 1, f"one view, one revision: {revs}"
    # what etcd holds: one key per node, each under a lease, and the pool's config
    keys = pool.etcd.get_prefix("/kvstash/pool/")
    assert sorted(keys) == ["/kvstash/pool/config", "/kvstash/pool/nodes/n1",
                            "/kvstash/pool/nodes/n2", "/kvstash/pool/nodes/n3"]
    assert b'"replicas":2' in keys["/kvstash/pool/config"]
    for n in nodes:
        assert pool.etcd.lease_of(f"/kvstash/pool/nodes/{n.node_id}") > 0
        # joining until the SSD index is loaded (here: none), then active
        out = n.output()
        joined = out.index(f"registered /kvstash/pool/nodes/{n.node_id} (joining")
        assert out.index(f"cluster: {n.node_id} is active") > joined


@pytest.mark.quick
def test_duplicate_node_id_refused(pool):
    first = pool.start("dup")
    pool.wait_view(1)
    second = pool.start("dup", ready=False)
    assert second.exit_code() != 0
    lines = [ln for ln in second.output().splitlines() if "already registered" in ln]
    assert len(lines) == 1, second.output()
    assert "ERROR" in lines[0] and "node_id dup" in lines[0]
    first.assert_alive()
    assert pool.wait_view(1) == {"dup": "active"}
    assert first.info()["nodes"][0]["addr"] == first.addr, "the first one's key is untouched"


@pytest.mark.quick
def test_placement_equals_the_reference(pool):
    weights = {"n1": 1, "n2": 2.5, "n3": 0.5, "n4": 1}
    nodes = [pool.start(weight=w) for w in weights.values()]
    pool.wait_view(4)
    rng = random.Random(22)
    keys = [bytes(rng.randrange(256) for _ in range(rng.randrange(1, 40))) for _ in range(300)]
    keys += [b"k%d" % i for i in range(200)]
    info = nodes[0].info(keys)
    ids = [x["id"] for x in info["nodes"]]
    ref_nodes = [(i, weights[i]) for i in ids]
    for key, owners in zip(keys, info["owners"]):
        assert owners == place_ref.owners(ref_nodes, key, 2), key
    # every daemon places the same
    assert nodes[3].info(keys)["owners"] == info["owners"]
    # a draining node owns nothing
    nodes[1].drain()
    # draining, then gone once its keys are handed off (rebalance.c; it has none here)
    wait_for(lambda: nodes[0].view()[1].get("n2", "gone") in ("draining", "gone"), 10,
             "n2 draining")
    info = nodes[0].info(keys)
    ids = [x["id"] for x in info["nodes"]]
    active = [(x["id"], weights[x["id"]]) if x["state"] == "active" else (x["id"], 0)
              for x in info["nodes"]]
    for key, owners in zip(keys, info["owners"]):
        assert owners == place_ref.owners(active, key, 2)
        assert "n2" not in [ids[o] for o in owners]


def test_restart_inside_the_lease_is_not_a_duplicate(pool):
    nodes = [pool.start() for _ in range(3)]
    pool.wait_view(3)
    nodes[1].kill9()
    again = pool.restart(nodes[1])
    assert again.alive()
    pool.wait_view(3, nodes=[nodes[0], again, nodes[2]])
    assert "revoked lease" in again.output()


def test_two_live_daemons_on_one_data_dir_are_duplicates(pool):
    """The lease file lets a restart take its own key back; it must not let a second live
    daemon on the same data dir (same node_id) take the first one's."""
    first = pool.start("same")
    pool.wait_view(1)
    second = pool.start("same", data_dir=first.data_dir, ready=False)
    assert second.exit_code() != 0
    assert "already registered" in second.output()
    first.assert_alive()
    assert first.info()["registered"]
    assert pool.etcd.lease_of("/kvstash/pool/nodes/same") > 0


def test_endpoint_failover_and_https_to_plain_etcd(pool, work):
    dead = f"http://127.0.0.1:{free_port()}"
    n = pool.start(args=[f"--etcd_endpoints={dead},{pool.etcd.endpoint}"])
    assert pool.wait_view(1) == {n.node_id: "active"}
    assert n.info()["etcd_endpoint"] == pool.etcd.endpoint
    # https:// to an etcd that speaks plain HTTP: no session, the node serves alone
    # (TLS to etcd itself: test_etcd_tls.py)
    https = pool.etcd.endpoint.replace("http://", "https://")
    tls = pool.start(args=[f"--etcd_endpoints={https}"])
    wait_for(lambda: "TLS refused" in tls.output(), 15, "the TLS failure logged")
    assert not tls.info()["registered"]
    assert pool.wait_view(1, nodes=[n]) == {n.node_id: "active"}


def test_cli_on_a_single_node(daemon_single):
    import subprocess
    cli = os.environ.get("KVSTASH_CLI") or os.path.join(os.path.dirname(__file__), "..", "..",
                                                        "build", "release", "kvstash")
    out = subprocess.run([cli, "-H", f"127.0.0.1:{daemon_single.port}", "cluster"],
                         capture_output=True, text=True, timeout=30)
    assert out.returncode == 0 and "single node" in out.stdout, out
    info = daemon_single.tcp().call("cluster_info", [b"k"])
    assert info["cluster"] == "" and info["nodes"] == [] and info["owners"] == [[]]
    assert info["self"] == -1
    err, _ = daemon_single.tcp().call_raw("cluster_drain")
    assert err is not None and err[0] == 15, err      # UNSUPPORTED: not in a pool


def test_different_config_refused(pool):
    pool.start()
    pool.wait_view(1)
    other = pool.start("other", replicas=3, ready=False)
    assert other.exit_code() != 0
    lines = [ln for ln in other.output().splitlines() if "config differs" in ln]
    assert len(lines) == 1 and "replicas 2" in lines[0] and "replicas 3" in lines[0], \
        other.output()
    assert pool.wait_view(1) == {"n1": "active"}


def test_drain_state_visible(pool):
    nodes = [pool.start() for _ in range(3)]
    pool.wait_view(3)
    # a drained node hands its keys off (none here) and then leaves: draining, then gone
    assert nodes[1].drain() == "draining"
    wait_for(lambda: all(n.view()[1].get("n2", "draining") == "draining"
                         and n.view()[1]["n1"] == "active" for n in nodes), 10,
             "n2 draining (or handed off and gone) in every view")
    assert nodes[1].info()["state"] == "draining"
    os.kill(nodes[2].pid, signal.SIGUSR2)
    wait_for(lambda: all(n.view()[1].get("n3", "draining") == "draining" for n in nodes), 10,
             "n3 draining after SIGUSR2")
    assert nodes[2].info()["state"] == "draining"
    pool.wait_view(1, nodes=[nodes[0]], timeout=20)   # both handed off and left
    # a node leaves the pool on SIGTERM: the others drop it at once (lease revoked)
    n4 = pool.start()
    pool.wait_view(2, nodes=[nodes[0], n4])
    n4.stop()
    pool.wait_view(1, nodes=[nodes[0]])


@pytest.mark.parametrize("how", ["stopped", "sigstopped"])
def test_etcd_down_daemons_serve_then_rejoin(pool, how):
    nodes = [pool.start() for _ in range(3)]
    pool.wait_view(3)
    rev_before = nodes[0].info()["revision"]
    if how == "stopped":
        pool.etcd.stop()
    else:
        pool.etcd.pause()
    try:
        # past a keepalive period and a lease ttl: the calls fail, the daemons go on
        deadline = time.monotonic() + 5
        i = 0
        while time.monotonic() < deadline:
            for n in nodes:
                put_get(n, b"k-%s-%d" % (n.node_id.encode(), i), b"v%d" % i * 100)
            i += 1
            time.sleep(0.1)
        wait_for(lambda: all(counters(n)["etcd_errors"] > 0 for n in nodes), 15,
                 "every node to notice etcd is gone")
        for n in nodes:
            info = n.info()
            assert not info["etcd_ok"]
            assert [x["id"] for x in info["nodes"]] == ["n1", "n2", "n3"], "the last view stays"
            assert info["revision"] == rev_before
    finally:
        if how == "stopped":
            pool.etcd.start()
        else:
            pool.etcd.resume()
    pool.wait_view(3, timeout=30)
    wait_for(lambda: all(n.info()["etcd_ok"] for n in nodes), 30, "etcd_ok again")
    # a lease that ran out while etcd was away is granted again after etcd answers
    wait_for(lambda: all(n.info()["registered"] for n in nodes), 30, "every node registered")
    pool.wait_view(3, timeout=30)
    for n in nodes:
        put_get(n, b"after", b"x" * 1000)


def test_node_started_while_etcd_down_joins_later(pool):
    pool.start()
    pool.wait_view(1)
    pool.etcd.stop()
    late = pool.start()                 # ready: it serves alone
    put_get(late, b"alone", b"1" * 64)
    assert late.info()["nodes"] == [] and not late.info()["registered"]
    assert "serving alone" in late.output()
    pool.etcd.start()
    assert pool.wait_view(2, timeout=30) == {"n1": "active", "n2": "active"}


def test_lease_lost_registers_again(pool):
    nodes = [pool.start() for _ in range(3)]
    pool.wait_view(3)
    lease = pool.etcd.lease_of("/kvstash/pool/nodes/n2")
    pool.etcd.revoke(lease)             # n2 cut from etcd: its key and lease are gone
    wait_for(lambda: counters(nodes[1])["lease_lost"] >= 1, 15, "n2 finds its lease lost")
    pool.wait_view(3)
    assert pool.etcd.lease_of("/kvstash/pool/nodes/n2") not in (None, lease)
    assert counters(nodes[1])["registrations"] >= 2
    assert "registering again" in nodes[1].output()


def test_node_cut_from_etcd_only(pool):
    """One daemon reaches etcd through a proxy that is then cut: it goes on serving (its
    engine's puts and gets, its last view), its lease expires and the others drop it; when
    the proxy lets it through again it finds the lease lost and registers again."""
    proxy = Proxy(("127.0.0.1", pool.etcd.client_port))
    try:
        nodes = [pool.start(), pool.start(),
                 pool.start(args=[f"--etcd_endpoints={proxy.endpoint}"])]
        pool.wait_view(3)
        proxy.cut()
        pool.wait_view(2, nodes=nodes[:2], timeout=20)
        for i in range(20):
            put_get(nodes[2], b"cut-%d" % i, b"x" * 4096)
        info = nodes[2].info()
        assert not info["etcd_ok"] and len(info["nodes"]) == 3, "the last view stays"
        proxy.restore()
        pool.wait_view(3, timeout=30)
        assert counters(nodes[2])["lease_lost"] >= 1
        assert counters(nodes[2])["registrations"] >= 2
    finally:
        proxy.close()


def test_node_stopped_past_its_lease_reregisters(pool):
    """SIGSTOP one daemon past its lease: etcd drops it, the others see it leave; once it
    runs again it finds its lease lost and registers again."""
    nodes = [pool.start() for _ in range(3)]
    pool.wait_view(3)
    nodes[2].pause()
    try:
        pool.wait_view(2, nodes=nodes[:2], timeout=20)
    finally:
        nodes[2].resume()
    pool.wait_view(3, timeout=20)
    assert counters(nodes[2])["lease_lost"] >= 1


def test_watch_idle_past_its_timeout(pool):
    nodes = [pool.start() for _ in range(2)]
    pool.wait_view(2)
    time.sleep(10)                      # ttl 2 s: the watch's idle timeout is 4 s
    assert all(counters(n)["watch_rearms"] >= 2 for n in nodes)
    pool.start()
    assert pool.wait_view(3, timeout=10) == {"n1": "active", "n2": "active", "n3": "active"}
    for n in nodes:
        assert "watch on" not in n.output(), "no watch ended on its idle timeout"


def test_compaction_past_the_watch_revision(pool):
    """n1's watch is cut (etcd restarted) while it is stopped; meanwhile the members change
    and etcd compacts its history. n1 watches again from its old revision, etcd cancels
    that (compacted), and n1 reads the members whole: its view is right."""
    nodes = [pool.start() for _ in range(3)]
    pool.wait_view(3)
    before = counters(nodes[0])["full_reads"]
    nodes[0].pause()
    try:
        pool.etcd.stop()
        pool.etcd.start()
        nodes[2].stop()                 # leaves: its key goes
        pool.start("n4")
        pool.wait_view(3, nodes=[nodes[1], pool.nodes[-1]])
        pool.etcd.compact(pool.etcd.revision())
    finally:
        nodes[0].resume()
    view = pool.wait_view(3, nodes=[nodes[0], nodes[1]], timeout=20)
    assert view == {"n1": "active", "n2": "active", "n4": "active"}
    assert counters(nodes[0])["full_reads"] > before
    assert "compacted" in nodes[0].output()


def test_cli_cluster_and_metrics(pool):
    import subprocess
    import urllib.request
    from clusterlib import free_port

    cli = os.environ.get("KVSTASH_CLI") or os.path.join(os.path.dirname(__file__), "..", "..",
                                                        "build", "release", "kvstash")
    mport = free_port("127.0.0.2")
    nodes = [pool.start(args=[f"--metrics_listen=127.0.0.2:{mport}"]), pool.start(weight=2)]
    pool.wait_view(2)

    def run(node, *args):
        return subprocess.run([cli, "-H", node.addr, "cluster", *args], capture_output=True,
                              text=True, timeout=30)

    out = run(nodes[0])
    assert out.returncode == 0, out.stderr
    assert "pool pool:" in out.stdout and "2 members" in out.stdout
    assert "n1" in out.stdout and nodes[1].addr in out.stdout and "(this node)" in out.stdout
    where = run(nodes[0], "where", "k1", "k2")
    assert where.returncode == 0, where.stderr
    ids = [x["id"] for x in nodes[0].info()["nodes"]]
    weights = {"n1": 1, "n2": 2}
    for key in ("k1", "k2"):
        want = [ids[i] for i in place_ref.owners([(i, weights[i]) for i in ids], key.encode(), 2)]
        line = [ln for ln in where.stdout.splitlines() if ln.startswith(key + ":")][0]
        assert [p.split()[0] for p in line.split(":", 1)[1].split(",")] == want, line
    assert run(nodes[0], "bogus").returncode == 2
    # the Python package's call: the same view
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "client", "python"))
    import kvstash
    with kvstash.Client(nodes[1].addr) as c:
        info = c.cluster_info([b"k1"])
    assert [x["id"] for x in info["nodes"]] == ids and info["node_id"] == "n2"
    assert [ids[i] for i in info["owners"][0]] == \
        [ids[i] for i in place_ref.owners([(i, weights[i]) for i in ids], b"k1", 2)]
    # /metrics: the members by state, the revision, lease renewals going up
    url = f"http://127.0.0.2:{mport}/metrics"

    def metric(series):
        """The value of one series (name with its labels, as /metrics writes it)."""
        text = urllib.request.urlopen(url, timeout=10).read().decode()
        values = dict(ln.rsplit(" ", 1) for ln in text.splitlines() if not ln.startswith("#"))
        return float(values[series]) if series in values else None

    assert metric('kvstash_cluster_members{state="active"}') == 2
    assert metric("kvstash_cluster_view_revision") == nodes[0].info()["revision"]
    assert metric("kvstash_cluster_registered") == 1
    wait_for(lambda: metric("kvstash_cluster_lease_renewals_total") >= 2, 10, "renewals")
    assert run(nodes[1], "drain").returncode == 0
    # draining, or already handed off and gone (rebalance.c leaves once its keys moved)
    wait_for(lambda: metric('kvstash_cluster_members{state="draining"}') == 1
             or (metric('kvstash_cluster_members{state="active"}') == 1
                 and metric("kvstash_cluster_view_revision") > 0), 10,
             "a draining member in /metrics")


def test_many_members_written_to_etcd(pool):
    """Members put straight into etcd (as 300 other daemons would): the list read at start,
    then a burst of watch events in one message (a range delete), and a value that is not a
    kvstash node ignored with a log line. Placement over 301 members still equals the
    reference."""
    import json as _json
    fake = {f"f{i:03d}": 1 + (i % 4) for i in range(300)}
    for nid, w in list(fake.items())[:150]:
        pool.etcd.put(f"/kvstash/pool/nodes/{nid}", _json.dumps(
            {"id": nid, "addr": f"10.9.{i_of(nid) // 256}.{i_of(nid) % 256}:7431", "weight": w,
             "state": "active", "tls": ""}))
    pool.etcd.put("/kvstash/pool/nodes/junk", "not json")
    n = pool.start()
    wait_for(lambda: len(n.view()[1]) == 151, 15, "151 members")
    for nid, w in list(fake.items())[150:]:
        pool.etcd.put(f"/kvstash/pool/nodes/{nid}", _json.dumps(
            {"id": nid, "addr": "10.9.9.9:7431", "weight": w, "state": "active"}))
    wait_for(lambda: len(n.view()[1]) == 301, 15, "301 members")
    assert "ignoring member junk" in n.output()
    keys = [b"key-%d" % i for i in range(300)]
    info = n.info(keys)
    weights = {**fake, "n1": 1}
    ref = [(x["id"], weights[x["id"]]) for x in info["nodes"]]
    for key, owners in zip(keys, info["owners"]):
        assert owners == place_ref.owners(ref, key, 2)
    # one delete of 200 keys: one watch message with 200 events
    b64 = __import__("base64").b64encode
    pool.etcd.call("/v3/kv/deleterange", {"key": b64(b"/kvstash/pool/nodes/f").decode(),
                                          "range_end": b64(b"/kvstash/pool/nodes/f2").decode()})
    wait_for(lambda: sorted(n.view()[1]) == ["f200", *[f"f{i}" for i in range(201, 300)],
                                              "n1"], 15, "the 200 deleted gone")


def i_of(nid):
    return int(nid[1:])
