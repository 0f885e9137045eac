"""Faults on the cluster's data paths (docs/cluster.md, "Checksums", "Failure behaviour").
Every value is checked against a table of SHA-256 digests; every wait is bounded.

  - a corrupted replica: an owner's copy on its SSD tier damaged while it is stopped (a
    byte of each value flipped in its bucket file); after its restart a read on another
    node gets the right bytes from the other owner, the bad copy is counted and dropped at
    the damaged owner, which then serves the key again from the good replica;
  - a node cut from its peers but not from etcd (a network namespace joined by a veth
    pair; blackhole routes and a rule cut the member traffic both ways, etcd stays
    reachable): reads and writes on the other nodes go on with the right bytes, the cut
    node serves what it holds and misses the rest, nothing wrong is returned anywhere;
    once the cut is undone it fetches from its peers again.
"""

import hashlib
import os
import shutil
import subprocess
import sys
import time

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "integration"))
sys.path.insert(0, HERE)

import kvtest  # noqa: E402
from clusterlib import Proxy, ViewPool, metric_total, wait_until  # noqa: E402
from place_ref import owners  # noqa: E402
from test_ssd import bucket_files, flip_byte, walk_records  # noqa: E402

R = 2


# ---------------------------------------------------------------------------------------
# A corrupted replica (fixed view, SSD tiers)


@pytest.fixture
def ssd_pool(view_pools):
    """ssd_pool(n=3): n daemons with a fixed view and an SSD tier each (write-through), on
    fixed ports and data dirs so a node can be stopped and started again as itself."""
    return lambda n=3: view_pools(ViewPool, n, data_prefix="faults-data",
                                  extra=["--ssd_size=256m", "--ssd_bucket_size=16m",
                                         "--ssd_offload=write_through"])


def test_a_corrupted_replica_is_detected_and_routed_around(ssd_pool):
    p = ssd_pool()
    # keys whose first owner is node 1 and second node 2, written on node 0 (not an owner)
    keys = [k for k in (b"bad-replica-%d" % i for i in range(400)) if p.owners(k) == [1, 2]]
    keys = keys[:12]
    assert len(keys) >= 6, "placement gave fewer than 6 of 400 keys the owners [1, 2]"
    vals = {k: os.urandom(20000 + 4099 * j) for j, k in enumerate(keys)}
    digest = {k: hashlib.sha256(v).digest() for k, v in vals.items()}
    c0 = p.daemons[0].tcp()
    # write_ack all: both owners answered before the reply
    assert c0.call("batch_put", keys, [vals[k] for k in keys]) == [0] * len(keys)
    assert all(p.has(1, keys)) and all(p.has(2, keys))
    # node 0 keeps cache copies of what it wrote: drop them, so a read there asks the owners
    assert c0.call("batch_remove", keys) == [0] * len(keys)

    # node 1's copies reach its SSD (write-through), then node 1 stops
    c1 = p.daemons[1].tcp()
    wait_until(lambda: c1.call("stats")["ssd_objects"] >= len(keys), "node 1's SSD copies")
    wait_until(lambda: c1.call("stats")["ssd_offload_queue"] == 0, "node 1's offload queue")
    p.daemons[1].stop()

    # flip one byte in the middle of every value in node 1's bucket files
    found = {}
    for path in bucket_files(os.path.join(p.data[1], "ssd")):
        for key, voff, vlen in walk_records(path):
            if key in vals:
                assert vlen == len(vals[key])
                found[key] = (path, voff + vlen // 2)
    assert set(found) == set(keys), f"records found: {sorted(found)}"
    for key, (path, pos) in found.items():
        flip_byte(path, pos, 0xA5)

    p.start(1)
    wait_until(lambda: all(p.has(1, keys)), "node 1's index loaded")     # listed, not yet read

    # node 0 asks node 1 first: its copy fails the record's CRC there (a miss at node 1),
    # and node 2's copy answers; never the damaged bytes
    for k in keys:
        got = c0.call("get", k)
        assert got is not None and hashlib.sha256(got).digest() == digest[k], k
    assert p.metric(0, "kvstash_cluster_remote_hits_total") == len(keys)
    assert p.metric(1, "kvstash_ssd_checksum_failures_total") == len(keys)
    assert p.metric(0, "kvstash_cluster_checksum_mismatches_total") == 0
    # the bad copies are gone from node 1 (quarantined: dropped from its tier's index)
    assert not any(p.has(1, keys))
    # node 1, an owner lacking them now, gets them back from the good replica when read
    c1 = p.daemons[1].tcp()
    for k in keys:
        got = c1.call("get", k)
        assert got is not None and hashlib.sha256(got).digest() == digest[k], k
    assert all(p.has(1, keys))
    assert p.metric(1, "kvstash_cluster_remote_hits_total") == len(keys)


# ---------------------------------------------------------------------------------------
# A node cut from its peers, not from etcd (a network namespace and a veth pair)


def run(*cmd, ns=None):
    full = (["ip", "netns", "exec", ns] if ns else []) + list(cmd)
    r = subprocess.run(full, capture_output=True, text=True, timeout=30)
    if r.returncode != 0:
        raise RuntimeError(f"{' '.join(full)}: {r.stderr.strip()}")
    return r.stdout


def netns_unavailable():
    if os.geteuid() != 0:
        return "network namespaces need root"
    if shutil.which("ip") is None:
        return "no ip(8) (iproute2)"
    return None


class NetNs:
    """A namespace joined to the host's by a veth pair: host side HOST (the other members'
    advertised address, and ETCD, the forwarder to etcd), namespace side NODE."""

    def __init__(self):
        tag = os.getpid() % 250 + 3
        self.name = f"kvcut{os.getpid()}"
        self.vh, self.vn = f"kvh{os.getpid()}"[:15], f"kvn{os.getpid()}"[:15]
        net = f"10.213.{tag}"
        self.host, self.node, self.etcd = f"{net}.1", f"{net}.2", f"{net}.9"
        self.rules = []
        run("ip", "netns", "add", self.name)
        try:
            run("ip", "link", "add", self.vh, "type", "veth", "peer", "name", self.vn)
            run("ip", "link", "set", self.vn, "netns", self.name)
            run("ip", "addr", "add", f"{self.host}/24", "dev", self.vh)
            run("ip", "addr", "add", f"{self.etcd}/32", "dev", self.vh)
            run("ip", "link", "set", self.vh, "up")
            run("ip", "addr", "add", f"{self.node}/24", "dev", self.vn, ns=self.name)
            run("ip", "link", "set", self.vn, "up", ns=self.name)
            run("ip", "link", "set", "lo", "up", ns=self.name)
            run("ip", "route", "add", f"{self.etcd}/32", "dev", self.vn, ns=self.name)
        except Exception:
            self.close()
            raise

    def cut(self, node_port):
        """Members cut both ways; etcd (through self.etcd) still reached from the node."""
        run("ip", "route", "add", "blackhole", f"{self.host}/32", ns=self.name)
        rule = ["to", self.node, "ipproto", "tcp", "dport", str(node_port), "blackhole"]
        run("ip", "rule", "add", *rule)
        self.rules.append(rule)

    def restore(self):
        run("ip", "route", "del", "blackhole", f"{self.host}/32", ns=self.name)
        for rule in self.rules:
            run("ip", "rule", "del", *rule)
        self.rules = []

    def close(self):
        for rule in self.rules:
            subprocess.run(["ip", "rule", "del", *rule], capture_output=True, timeout=30)
        subprocess.run(["ip", "link", "del", self.vh], capture_output=True, timeout=30)
        subprocess.run(["ip", "netns", "del", self.name], capture_output=True, timeout=30)


@pytest.fixture
def netns():
    why = netns_unavailable()
    if why:
        pytest.skip(why)
    try:
        ns = NetNs()
    except RuntimeError as e:
        pytest.skip(f"cannot make a network namespace with a veth pair: {e}")
    yield ns
    ns.close()


def test_a_node_cut_from_its_peers_but_not_from_etcd(work, etcd, netns):
    kvtest.require_kvstashd()
    fwd = Proxy(("127.0.0.1", int(etcd.endpoint.rsplit(":", 1)[1])), host=netns.etcd)
    procs = []
    try:
        _cut_node_scenario(work, etcd, netns, fwd, procs)
    finally:
        for d in procs:
            d.reap()
            print(f"---- {' '.join(d.cmd)}\n{d.tail(25)}")
        fwd.close()


def _cut_node_scenario(work, etcd, netns, fwd, procs):
    ids = ["a", "b", "c", "d"]
    ports = [kvtest.free_port() for _ in ids]
    mports = [kvtest.free_port() for _ in ids]
    common = ["--cluster_name=cut", f"--replicas={R}", "--etcd_lease_ttl=2s",
              "--peer_timeout=500ms", "--memory_size=64m", "--ssd_dir=",
              "--allow_unauthenticated_remote=yes"]
    nodes = []
    for i, nid in enumerate(ids):
        inside = nid == "d"
        adv = netns.node if inside else netns.host
        args = [f"--listen=0.0.0.0:{ports[i]}", f"--peer_advertise={adv}:{ports[i]}",
                f"--node_id={nid}", f"--data_dir={os.path.join(work, 'cut-' + nid)}",
                f"--etcd_endpoints={fwd.endpoint if inside else etcd.endpoint}", *common]
        if inside:
            # started inside the namespace (ip netns exec execs kvstashd: one pid); its
            # metrics port there is out of the test's reach: off
            wrapper = os.path.join(work, "in-netns.sh")
            with open(wrapper, "w") as f:
                f.write(f"#!/bin/sh\nexec ip netns exec {netns.name} {kvtest.KVSTASHD} \"$@\"\n")
            os.chmod(wrapper, 0o755)
            d = kvtest.Daemon(work, args, unix=True, binary=wrapper)
        else:
            args.append(f"--metrics_listen=127.0.0.1:{mports[i]}")
            d = kvtest.Daemon(work, args, unix=True)
        procs.append(d)
        nodes.append(d)
    for d in nodes:
        wait_until(lambda d=d: os.path.exists(d.unix_path) and _ping(d), f"{d.cmd[-1]} ready")

    def view_ok(d):
        nodes_seen = _client(d).call("cluster_info")["nodes"]
        return sorted(n["id"] for n in nodes_seen) == ids and \
            all(n["state"] == "active" for n in nodes_seen)

    for d in nodes:
        wait_until(lambda d=d: view_ok(d), "one view of 4 active members", timeout=20)

    def own(key):
        return owners([(nid, 1.0) for nid in ids], key, R)

    # before the cut: values written on a, read back everywhere
    before = {b"cut-pre-%d" % i: os.urandom(10000 + 613 * i) for i in range(32)}
    digest = {k: hashlib.sha256(v).digest() for k, v in before.items()}
    ca = _client(nodes[0])
    assert ca.call("batch_put", list(before), list(before.values())) == [0] * len(before)
    d_owns = [k for k in before if 3 in own(k)]
    assert d_owns, "placement gave d none of 32 keys"
    cd = _client(nodes[3])
    assert all(cd.call("batch_is_exist", d_owns))      # its owned copies arrived

    netns.cut(ports[3])

    # the others: writes and reads go on, every value right (an owner d is skipped after
    # peer_timeout, or at once when the route refuses)
    after = {b"cut-post-%d" % i: os.urandom(8000 + 711 * i) for i in range(24)}
    digest.update({k: hashlib.sha256(v).digest() for k, v in after.items()})
    cb = _client(nodes[1])
    failed0 = metric_total(mports[1], 'kvstash_cluster_replications_total{outcome="failed"}')
    assert cb.call("batch_put", list(after), list(after.values())) == [0] * len(after)
    # the cut is real: every copy b sent to d failed (write_ack all: counted by the reply)
    to_d = sum(1 for k in after if 3 in own(k))
    assert to_d, "placement gave d none of 24 keys"
    assert metric_total(mports[1], 'kvstash_cluster_replications_total{outcome="failed"}') \
        - failed0 == to_d
    cc = _client(nodes[2])
    for k in list(before) + list(after):
        got = cc.call("get", k)
        assert got is not None and hashlib.sha256(got).digest() == digest[k], k
    # d: still in etcd, so still in every view (its lease kept alive through the forwarder)
    time.sleep(3)       # past the 2 s lease: a node cut from etcd would have left the view
    for d in nodes[:3]:
        assert view_ok(d), "d dropped from a view while it was cut from its peers only"
    # d serves locally: what it holds, byte-exact; the rest a miss, never wrong bytes
    for k in list(before) + list(after):
        got = cd.call("get", k)
        if got is not None:
            assert hashlib.sha256(got).digest() == digest[k], k
    for k in d_owns:
        assert hashlib.sha256(cd.call("get", k)).digest() == digest[k], k
    far = [k for k in after if 3 not in own(k)]
    assert far
    assert all(cd.call("get", k) is None for k in far), "d reached a peer through the cut"
    local = {b"cut-local-%d" % i: os.urandom(5000) for i in range(8)}
    assert cd.call("batch_put", list(local), list(local.values())) == [0] * len(local)
    for k, v in local.items():
        assert cd.call("get", k) == v
    assert nodes[3].alive() and all(d.alive() for d in nodes)

    netns.restore()
    # d fetches from its peers again: keys it never held, from their owners (a miss is
    # remembered for 1 s, and a failed peer is dialled again after its backoff: bounded wait)

    def fetched():
        got = cd.call("get", far[0])
        return got is not None and hashlib.sha256(got).digest() == digest[far[0]]

    wait_until(fetched, "d fetching from its peers after the cut is undone", timeout=20)
    for k in far[1:]:
        got = cd.call("get", k)
        assert got is not None and hashlib.sha256(got).digest() == digest[k], k


def _client(d):
    c = kvtest.Client.unix(d.unix_path)
    d.clients.append(c)
    return c


def _ping(d):
    try:
        c = kvtest.Client.unix(d.unix_path)
    except OSError:
        return False
    try:
        return c.call("ping") == "pong"
    except OSError:
        return False
    finally:
        c.close()
