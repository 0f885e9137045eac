"""The cluster's data paths (docs/cluster.md, "Data paths"): 3 daemons in one pool, a fixed
view (KVSTASH_TEST_VIEW: the data paths without etcd; membership has its own tests), R = 2.
Every value is checked against a table of digests; every wait is bounded.

  - a put reaches its owners; a miss on another node is served from an owner, and then
    from the local copy it kept;
  - batch_get, batch_is_exist and prefix_match ask the owners of what is missing;
  - an owner killed with kill -9: every key is still read from the other owner;
  - an owner stopped (SIGSTOP): peer_timeout passes and the next owner answers;
  - a peer put whose bytes fail their CRC-32C is refused, and nothing is stored;
  - two writers of one key with different bytes: every read is one writer's whole value,
    the first writer's bytes stay at each owner, and the conflict is counted.
"""

import hashlib
import os
import signal
import sys
import threading

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "integration"))
sys.path.insert(0, HERE)

from clusterlib import crc32c, shm_values, wait_until  # noqa: E402
from kvtest import stop_process  # noqa: E402

pytestmark = pytest.mark.quick     # all of them are in make test's short set


def values(n, size=40000, tag=b""):
    return {b"blk-%s-%d" % (tag, i): os.urandom(size + i * 997) for i in range(n)}


def test_put_reaches_owners_and_a_miss_is_served_by_an_owner_then_locally(fixed_pool):
    p = fixed_pool()
    vals = values(30)
    digest = {k: hashlib.sha256(v).digest() for k, v in vals.items()}
    c0 = p.daemons[0].tcp()
    assert c0.call("batch_put", list(vals), list(vals.values())) == [0] * len(vals)

    # every owner holds every key it owns (replication is asynchronous: wait, bounded)
    for i in range(3):
        mine = [k for k in vals if i in p.owners(k)]
        assert mine, "placement gave node %d nothing of 30 keys" % i
        wait_until(lambda i=i, mine=mine: all(p.has(i, mine)), f"node {i}'s copies")

    # node 0 put them all: the keys it does not own are cache copies there, but present
    assert all(p.has(0, list(vals)))

    # a node that holds a key neither as owner nor as writer fetches it from an owner
    far = {i: [k for k in vals if i not in p.owners(k)] for i in (1, 2)}
    for i, keys in far.items():
        assert not any(p.has(i, keys))
        c = p.daemons[i].tcp()
        for k in keys:
            got = c.call("get", k)
            assert got is not None and hashlib.sha256(got).digest() == digest[k]
        # ... and keeps what it fetched: now it answers from its own store
        assert all(p.has(i, keys))
        hits = p.metric(i, "kvstash_cluster_remote_hits_total")
        assert hits == len(keys)
        for k in keys:
            assert hashlib.sha256(c.call("get", k)).digest() == digest[k]
        assert p.metric(i, "kvstash_cluster_remote_hits_total") == hits
    assert p.metric(0, "kvstash_cluster_replication_drops_total") == 0
    assert p.metric(0, "kvstash_cluster_checksum_mismatches_total") == 0


def test_batch_reads_ask_the_owners_of_what_is_missing(fixed_pool):
    p = fixed_pool()
    vals = values(24, size=5000, tag=b"b")
    keys = list(vals)
    c1 = p.daemons[1].tcp()
    assert c1.call("batch_put", keys, list(vals.values())) == [0] * len(keys)
    far = [k for k in keys if 2 not in p.owners(k)]
    assert far
    wait_until(lambda: all(p.has(p.owners(k)[0], [k])[0] for k in far), "the owners' copies")
    c2 = p.daemons[2].tcp()
    # one absent key among them: answered as a miss, not an error
    assert c2.call("batch_is_exist", far[:2] + [b"absent"]) == [True, True, False]
    got = c2.call("batch_get", far + [b"absent"])
    assert got[-1] is None
    assert [hashlib.sha256(v).digest() for v in got[:-1]] == \
        [hashlib.sha256(vals[k]).digest() for k in far]
    # prefix_match stops at the first block no owner has
    far2 = [k for k in keys if 0 not in p.owners(k)]
    assert len(far2) >= 4, "placement left node 0 out of fewer than 4 keys of 24"
    c0 = p.daemons[0].tcp()
    assert c0.call("prefix_match", far2[:3] + [b"absent"] + far2[3:]) == 3


def test_an_owner_killed_loses_nothing_with_two_replicas(fixed_pool):
    p = fixed_pool()
    vals = values(24, size=8000, tag=b"k")
    c0 = p.daemons[0].tcp()
    assert c0.call("batch_put", list(vals), list(vals.values())) == [0] * len(vals)
    for i in (1, 2):
        mine = [k for k in vals if i in p.owners(k)]
        wait_until(lambda i=i, mine=mine: all(p.has(i, mine)), f"node {i}'s copies")
    p.daemons[2].kill9()
    c1 = p.daemons[1].tcp()
    for k, v in vals.items():
        assert c1.call("get", k) == v, "a key lost with one of its two owners"


def test_a_stopped_owner_costs_peer_timeout_then_the_next_owner_answers(fixed_pool):
    p = fixed_pool(extra=["--peer_timeout=300ms"])
    vals = values(40, size=2000, tag=b"s")
    c0 = p.daemons[0].tcp()
    assert c0.call("batch_put", list(vals), list(vals.values())) == [0] * len(vals)
    # keys node 0 does not own, whose first owner is node 1 and second node 2
    keys = [k for k in vals if p.owners(k) == [1, 2]]
    if not keys:
        pytest.skip("placement gave no key the owners [1, 2] among 40")
    wait_until(lambda: all(p.has(2, keys)) and all(p.has(1, keys)), "the owners' copies")
    # node 0 wrote them, so it keeps cache copies: drop those, then stop the first owner
    assert c0.call("batch_remove", keys) == [0] * len(keys)
    assert not any(p.has(0, keys))
    stop_process(p.daemons[1].pid)   # every thread stopped: node 1 answers nothing
    try:
        for k in keys:
            assert c0.call("get", k) == vals[k]
        assert p.metric(0, "kvstash_cluster_peer_timeouts_total") >= 1
        assert p.metric(0, "kvstash_cluster_remote_hits_total") == len(keys)
    finally:
        os.kill(p.daemons[1].pid, signal.SIGCONT)


def test_a_peer_put_that_fails_its_checksum_is_refused(fixed_pool):
    p = fixed_pool(n=1)
    c = p.daemons[0].tcp()
    small, big = b"x" * 100, os.urandom(300000)
    for v in (small, big):
        assert c.call("peer_put", 0, [b"bad"], [v], [crc32c(v) ^ 1]) == [[12, 0]]
        assert c.call("peer_exists", 0, [b"bad"]) == [False]
    assert c.call("peer_put", 0, [b"good"], [big], [crc32c(big)]) == [[0, crc32c(big)]]
    assert c.call("get", b"good") == big
    assert p.metric(0, "kvstash_cluster_checksum_mismatches_total") == 2


def test_two_writers_of_one_key_with_different_bytes(fixed_pool):
    p = fixed_pool()
    # a key owned by node 2 and one other, written on nodes 0 and 1 at once
    key = next(b"dup-%d" % i for i in range(1000) if p.owners(b"dup-%d" % i)[0] == 2)
    a, b = os.urandom(200000), os.urandom(200000)
    whole = {hashlib.sha256(a).digest(), hashlib.sha256(b).digest()}
    clients = [p.daemons[0].tcp(), p.daemons[1].tcp()]
    results = [None, None]

    def put(i, v):
        results[i] = clients[i].call("put", key, v)

    threads = [threading.Thread(target=put, args=(0, a)), threading.Thread(target=put, args=(1, b))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    # each is stored where it was written, unless the other's copy got there first
    assert set(results) <= {0, 2, 3} and 0 in results, results  # 3: BUSY, being stored
    wait_until(lambda: all(p.has(i, [key])[0] for i in p.owners(key)), "the owners' copies")
    seen = {}
    for i in range(3):
        c = p.daemons[i].tcp()
        for _ in range(3):
            v = c.call("get", key)
            assert v is not None and hashlib.sha256(v).digest() in whole, "a torn value"
            seen.setdefault(i, hashlib.sha256(v).digest())
            assert hashlib.sha256(v).digest() == seen[i], "one reader saw two values"
    # node 2 (an owner, written by neither client) kept the first bytes that reached it;
    # the other writer's copy there was refused and counted as a conflict somewhere
    if results == [0, 0]:
        conflicts = sum(p.metric(i, "kvstash_cluster_checksum_conflicts_total")
                        for i in range(3))
        assert conflicts >= 1


def test_write_ack_all_answers_once_every_owner_has_the_value(fixed_pool):
    p = fixed_pool(extra=["--write_ack=all"])
    vals = values(16, size=30000, tag=b"w")
    c = p.daemons[1].tcp()
    for k, v in vals.items():
        assert c.call("put", k, v) == 0
        # no wait: the answer came after the owners stored it
        assert all(p.has(i, [k])[0] for i in p.owners(k)), k
    keys = list(vals)[:8]
    batch = {k + b"-b": v for k, v in zip(keys, list(vals.values())[:8])}
    assert c.call("batch_put", list(batch), list(batch.values())) == [0] * 8
    for k in batch:
        assert all(p.has(i, [k])[0] for i in p.owners(k)), k


def test_a_shared_memory_put_reaches_the_owners(fixed_pool):
    p = fixed_pool(unix=True)
    vals = values(8, size=50000, tag=b"m")
    keys = list(vals)
    c = p.daemons[0].unix()
    with shm_values(c, vals, keys) as pieces:
        assert c.call("batch_put_from", keys, pieces) == [0] * len(keys)
    for i in range(3):
        mine = [k for k in keys if i in p.owners(k)]
        wait_until(lambda i=i, mine=mine: all(p.has(i, mine)), f"node {i}'s copies")
    far = {i: [k for k in keys if i not in p.owners(k)] for i in (1, 2)}
    for i, ks in far.items():
        c = p.daemons[i].tcp()
        for k in ks:
            assert c.call("get", k) == vals[k]
