"""Keys after a view change (docs/cluster.md, "Join, leave, failure"), on a real etcd
(clusterlib.Pool: daemons on 127.0.0.x, lease ttl 2 s), R = 2. Every value is checked
against a table of digests, every wait is bounded.

  - a join: about R/(N+1) of the keys move to the new node, nothing is missed meanwhile;
  - a drain: the drained node's keys are handed off, it leaves, nothing is missing;
  - kill -9 of a node: nothing is missing (the other owner serves), and after
    rebalance_delay every key has R copies again;
  - a node restarted (with its SSD tier) inside rebalance_delay: nothing moves.
"""

import hashlib
import os
import time

import pytest

from clusterlib import free_port, metric_total, wait_until
from place_ref import owners

R = 2


def node_args(work, node_id, extra=()):
    return [f"--metrics_listen=127.0.0.1:{free_port()}", *extra]


def metric(node, name):
    port = next(a.split(":")[-1] for a in node.cmd if a.startswith("--metrics_listen=127"))
    return metric_total(port, name)


def has(node, keys):
    return node.call("peer_exists", 0, list(keys))


def put_all(node, vals):
    c = node.tcp()
    keys = list(vals)
    for i in range(0, len(keys), 16):
        ks = keys[i:i + 16]
        assert c.call("batch_put", ks, [vals[k] for k in ks]) == [0] * len(ks)


def read_all(node, vals, digest):
    c = node.tcp()
    keys = list(vals)
    for i in range(0, len(keys), 16):
        ks = keys[i:i + 16]
        got = c.call("batch_get", ks)
        for k, v in zip(ks, got):
            assert v is not None, f"{k!r} missing on {node.node_id}"
            assert hashlib.sha256(v).digest() == digest[k], f"{k!r} wrong on {node.node_id}"


def owner_ids(ids, key):
    return [ids[i] for i in owners([(i, 1.0) for i in ids], key, R)]


def copies_complete(pool_nodes, vals):
    """Every key is held by every one of its owners among pool_nodes."""
    ids = [n.node_id for n in pool_nodes]
    by_id = {n.node_id: n for n in pool_nodes}
    want = {}
    for k in vals:
        for o in owner_ids(ids, k):
            want.setdefault(o, []).append(k)
    return all(all(has(by_id[o], ks)) for o, ks in want.items())


def wait_copies(pool_nodes, vals, what, timeout=30.0):
    wait_until(lambda: copies_complete(pool_nodes, vals), what, timeout)


def values(n, tag):
    vals = {b"%s-%04d" % (tag, i): os.urandom(2000 + (i * 131) % 6000) for i in range(n)}
    return vals, {k: hashlib.sha256(v).digest() for k, v in vals.items()}


def three_with_copies(pool, work, n_keys, tag, writer=0, extra=lambda i: ()):
    """Three members in one view (node i with flags extra(i)), n_keys values written on
    nodes[writer] and held by each of their owners: (nodes, vals, digest)."""
    nodes = [pool.start(args=node_args(work, None, extra(i))) for i in range(3)]
    pool.wait_view(3)
    vals, digest = values(n_keys, tag)
    put_all(nodes[writer], vals)
    wait_copies(nodes, vals, "R copies of every key on 3 nodes")
    return nodes, vals, digest


@pytest.mark.quick
def test_join_moves_about_r_over_n_plus_1_and_misses_nothing(pool, work):
    nodes, vals, digest = three_with_copies(pool, work, 300, b"join")
    new = pool.start(args=node_args(work, None))
    pool.wait_view(4)
    everyone = nodes + [new]
    # reads on the old members go on while the pool rebalances: nothing is missed
    for n in nodes:
        read_all(n, vals, digest)
    wait_copies(everyone, vals, "R copies of every key on 4 nodes")
    ids = [n.node_id for n in everyone]
    expected = sum(1 for k in vals if new.node_id in owner_ids(ids, k))
    moved = sum(metric(n, "kvstash_cluster_rebalance_keys_moved_total") for n in nodes)
    # the ideal is R/(N+1) = 1/2 of the keys; each moves once (asked first, first writer wins)
    assert abs(expected - len(vals) * R / 4) < len(vals) * 0.15, expected
    assert expected <= moved <= expected * 1.1 + 2, (moved, expected)
    assert metric(new, "kvstash_cluster_remote_hits_total") == 0
    read_all(new, vals, digest)     # its own keys from its store, the rest from their owners


def test_drain_hands_off_then_leaves_and_nothing_is_missing(pool, work):
    nodes, vals, digest = three_with_copies(pool, work, 200, b"drain", writer=1)
    leaving, staying = nodes[2], nodes[:2]
    leaving.drain()
    pool.wait_view(2, nodes=staying, timeout=30)
    wait_copies(staying, vals, "R copies on the 2 staying nodes")
    for n in staying:
        read_all(n, vals, digest)
    # the keys the drained node owned were pushed (by it, or by their other owner first)
    assert sum(metric(n, "kvstash_cluster_rebalance_keys_moved_total") for n in nodes) > 0


def test_kill9_loses_nothing_and_copies_come_back_after_the_delay(pool, work):
    nodes, vals, digest = three_with_copies(pool, work, 200, b"kill",
                                            extra=lambda i: ["--rebalance_delay=2s"])
    nodes[2].kill9()
    survivors = nodes[:2]
    for n in survivors:
        read_all(n, vals, digest)   # R = 2: the other owner of each key answers
    pool.wait_view(2, nodes=survivors, timeout=30)
    wait_copies(survivors, vals, "R copies on the 2 survivors", timeout=40)
    for n in survivors:
        read_all(n, vals, digest)


def test_restart_inside_the_delay_moves_nothing(pool, work):
    nodes, vals, digest = three_with_copies(
        pool, work, 150, b"restart",
        extra=lambda i: ["--rebalance_delay=60s", "--ssd_offload=write_through",
                         f"--ssd_dir={work}/ssd-{i}"])
    # on the SSD tier too, so the restarted node has its keys (ssd_offload write_through)
    time.sleep(1.0)
    walks = [metric(n, "kvstash_cluster_rebalance_walks_total") for n in nodes[:2]]
    victim = nodes[2]
    victim.kill9()
    pool.wait_view(2, nodes=nodes[:2], timeout=30)
    back = pool.restart(victim)
    pool.wait_view(3, nodes=[nodes[0], nodes[1], back], timeout=30)
    time.sleep(1.0)                 # a walk, were one to start, would have begun
    for n, before in zip(nodes[:2], walks):
        assert metric(n, "kvstash_cluster_rebalance_keys_moved_total") == 0
        assert metric(n, "kvstash_cluster_rebalance_walks_total") == before
    for n in (nodes[0], nodes[1], back):
        read_all(n, vals, digest)
