"""The pool's put path (docs/cluster.md, "Writes"): 3 daemons with a fixed view
(KVSTASH_TEST_VIEW, no etcd), R = 2. Every value is checked against a table of SHA-256
digests on each owner, read from that owner's own store (peer_get asks no one else); every
wait is bounded.

  - a batch_put goes to each other owner in one peer_put (grouped per owner per batch), and
    with write_ack all every owner holds the right bytes when the reply comes;
  - write_ack all holds the reply of batch_put_from (shared memory) and of put_end (direct
    access) until the owners answered: not sent while an owner is stopped (SIGSTOP), sent
    once it runs again, with every owner's copy right.
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
from kvtest import Client, stop_process  # noqa: E402
from test_direct import DirectClient  # noqa: E402

pytestmark = pytest.mark.quick     # all of them are in make test's short set

STOPPED_WAIT = 1.0      # seconds a reply is watched for while an owner is stopped


def values(n, size, tag):
    return {b"wr-%s-%d" % (tag, i): os.urandom(size + i * 991) for i in range(n)}


def digests(vals):
    return {k: hashlib.sha256(v).hexdigest() for k, v in vals.items()}


def assert_owners_hold(p, keys, digest, crcs=4):
    """Every owner of each key holds it itself, its bytes those of the digest table; for
    the first crcs keys of each owner, the checksum it keeps (computed as the bytes landed)
    is the CRC-32C of those bytes."""
    for i in range(len(p.daemons)):
        mine = [k for k in keys if i in p.owners(k)]
        if not mine:
            continue
        c = Client.tcp(p.ports[i])
        try:
            got = c.call("peer_get", 0, mine)
        finally:
            c.close()
        for k, g in zip(mine, got):
            assert g is not None, f"node {i} owns {k} and lacks it"
            assert hashlib.sha256(g[1]).hexdigest() == digest[k], f"node {i}'s {k} differs"
        for k, g in list(zip(mine, got))[:crcs]:
            assert g[0] == crc32c(g[1]), f"node {i} keeps a wrong CRC-32C for {k}"


def test_a_batch_goes_to_each_owner_in_one_peer_put(fixed_pool):
    p = fixed_pool(extra=["--write_ack=all"])
    vals = values(24, 20000, b"b")
    digest = digests(vals)
    others = {o for k in vals for o in p.owners(k) if o != 0}
    before = p.metric(0, "kvstash_cluster_peer_requests_total")
    c = p.daemons[0].tcp()
    assert c.call("batch_put", list(vals), list(vals.values())) == [0] * len(vals)
    # write_ack all: no wait, the reply came after every owner answered
    assert_owners_hold(p, list(vals), digest)
    sent = p.metric(0, "kvstash_cluster_peer_requests_total") - before
    assert sent == len(others), f"{sent} peer requests for one batch to {len(others)} owners"
    assert p.metric(0, "kvstash_cluster_replications_total") >= sum(
        len([o for o in p.owners(k) if o != 0]) for k in vals)
    # small values (not spilled at the owner) go the same way
    small = values(16, 100, b"s")
    assert c.call("batch_put", list(small), list(small.values())) == [0] * len(small)
    assert_owners_hold(p, list(small), digests(small))


class Waiter(threading.Thread):
    """Sends one prepared request and waits (bounded) for its reply."""

    def __init__(self, client, data):
        super().__init__(daemon=True)
        self.client, self.data, self.msg = client, data, None
        self.replied = threading.Event()

    def run(self):
        self.client.sock.sendall(self.data)
        self.msg = self.client.recv()
        self.replied.set()


def held_while_stopped(p, stopped, client, method, params):
    """method(params) on client, with node `stopped` SIGSTOPped: the reply must not come
    while it is stopped; returns the result once it runs again."""
    _, data = client.request(method, params)
    stop_process(p.daemons[stopped].pid)
    try:
        w = Waiter(client, data)
        w.start()
        assert not w.replied.wait(STOPPED_WAIT), \
            f"{method} answered while an owner was stopped: {w.msg}"
    finally:
        os.kill(p.daemons[stopped].pid, signal.SIGCONT)
    assert w.replied.wait(30), f"no reply to {method} after the owner ran again"
    w.join(5)
    assert w.msg[2] is None, w.msg
    return w.msg[3]


class FdClient(DirectClient):
    """test_direct's client (it keeps the descriptors the daemon sends), waiting longer: a
    reply may be held while an owner is stopped."""

    recv_timeout = 30


def values_owned_by(p, node, n, size, tag):
    """values(n, size, tag) cut to the keys node owns; skips when placement gave it none."""
    vals = values(n, size, tag)
    keys = [k for k in vals if node in p.owners(k)]
    if not keys:
        pytest.skip(f"placement gave node {node} none of {n} keys")
    return {k: vals[k] for k in keys}


def test_write_ack_all_holds_batch_put_from_until_the_owners_answered(fixed_pool):
    p = fixed_pool(extra=["--write_ack=all", "--peer_timeout=20s"], unix=True)
    vals = values_owned_by(p, 1, 8, 50000, b"m")
    keys = list(vals)
    c = p.daemons[0].unix()
    with shm_values(c, vals, keys) as pieces:
        res = held_while_stopped(p, 1, c, "batch_put_from", [keys, pieces])
        assert res == [0] * len(keys)
    assert_owners_hold(p, keys, digests(vals))


def test_write_ack_all_holds_put_end_until_the_owners_answered(fixed_pool):
    p = fixed_pool(extra=["--write_ack=all", "--peer_timeout=20s"], unix=True)
    vals = values_owned_by(p, 2, 6, 30000, b"d")
    keys = list(vals)
    c = FdClient.unix(p.daemons[0].unix_path)
    mm, _ = c.map_arena()
    try:
        got = c.call("put_start", keys, [len(vals[k]) for k in keys])
        for k, pieces in zip(keys, got):
            assert isinstance(pieces, list), f"{k}: {pieces}"
            off = 0
            for seg, at, n in pieces:
                assert seg == 0
                mm[at:at + n] = vals[k][off:off + n]
                off += n
            assert off == len(vals[k])
        res = held_while_stopped(p, 2, c, "put_end", [keys])
        assert res == [0] * len(keys)
    finally:
        mm.close()
    assert_owners_hold(p, keys, digests(vals))
    wait_until(lambda: p.metric(0, "kvstash_cluster_replication_queue_depth") == 0,
               "node 0's replication queue to empty")
