"""The RESP port in a pool (docs/cluster.md, "The RESP port"; docs/resp.md): 3 daemons with a
fixed view (KVSTASH_TEST_VIEW, no etcd), R = 2, each with a resp_listen port. Every value is
checked against a table of SHA-256 digests, on each owner read from that owner's own store
(peer_get asks no one else); every wait is bounded.

  - SET and MSET through redis-py on one node reach every owner byte-exact, with the
    CRC-32C each owner keeps right, an MSET in one peer_put per other owner;
  - with write_ack all and an owner SIGSTOPped, a SET's +OK does not come, nor the replies
    pipelined behind it, until the owner runs again; then they come in request order and
    every copy is right; write_ack local answers while the owner is still stopped;
  - GET, MGET, EXISTS and STRLEN on a node that neither owns nor wrote the keys fetch them
    from their owners and keep the copies (the second read is local);
  - a pipeline of mixed commands, fetches among them, is answered in request order.
"""

import hashlib
import os
import signal
import socket
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "integration"))
sys.path.insert(0, HERE)

from clusterlib import ViewPool, wait_until  # noqa: E402
from kvtest import free_port, stop_process  # noqa: E402
from test_data_writes import assert_owners_hold  # noqa: E402
from test_resp import cmd  # noqa: E402  (one command in RESP form)

redis = pytest.importorskip("redis", reason="python3-redis is not installed")

pytestmark = pytest.mark.quick     # all of them are in make test's short set

STOPPED_WAIT = 1.0      # seconds a reply is watched for while an owner is stopped


class RespPool(ViewPool):
    """A ViewPool whose node i also has a RESP port, resp_ports[i]."""

    def __init__(self, work, n, extra=(), **kwargs):
        self.resp_ports = [free_port() for _ in range(n)]
        super().__init__(work, n, extra, **kwargs)

    def node_args(self, i):
        return [f"--resp_listen=127.0.0.1:{self.resp_ports[i]}"]

    def redis(self, i):
        return redis.Redis(port=self.resp_ports[i], socket_timeout=30)


@pytest.fixture
def resp_pool(view_pools):
    """resp_pool(extra=()): 3 daemons in one fixed view, R = 2, with RESP ports."""
    return lambda extra=(): view_pools(RespPool, 3, extra)


def values(n, size, tag):
    return {b"rs-%s-%d" % (tag, i): os.urandom(size + i * 991) for i in range(n)}


def digests(vals):
    return {k: hashlib.sha256(v).hexdigest() for k, v in vals.items()}


def owned_by(p, keys, node, owner=True):
    return [k for k in keys if (node in p.owners(k)) == owner]


class Raw:
    """A plain socket speaking RESP bytes, reading replies whole."""

    def __init__(self, port):
        self.s = socket.create_connection(("127.0.0.1", port), timeout=30)
        self.buf = b""

    def _fill(self):
        chunk = self.s.recv(1 << 20)
        if not chunk:
            raise EOFError(f"closed after {self.buf[:200]!r}")
        self.buf += chunk

    def line(self):
        while b"\r\n" not in self.buf:
            self._fill()
        i = self.buf.index(b"\r\n") + 2
        out, self.buf = self.buf[:i], self.buf[i:]
        return out

    def reply(self):
        """One whole reply: a simple line, or ('$', bytes | None), or ('*', [replies])."""
        head = self.line()
        if head[:1] == b"$":
            n = int(head[1:-2])
            if n < 0:
                return None
            while len(self.buf) < n + 2:
                self._fill()
            out, self.buf = self.buf[:n], self.buf[n + 2:]
            return out
        if head[:1] == b"*":
            return [self.reply() for _ in range(int(head[1:-2]))]
        return head

    def nothing_within(self, seconds):
        """True when no byte arrives within seconds."""
        if self.buf:
            return False
        self.s.settimeout(seconds)
        try:
            data = self.s.recv(1)
        except socket.timeout:
            return True
        finally:
            self.s.settimeout(30)
        self.buf += data
        return False

    def close(self):
        self.s.close()


def test_set_and_mset_reach_every_owner(resp_pool):
    p = resp_pool(["--write_ack=all"])
    r = p.redis(0)
    # values buffered (small) and received into reservations as they arrive (big)
    single = {**values(6, 300, b"s"), **values(6, 70000, b"S"), b"rs-one-mib": os.urandom(1 << 20)}
    for k, v in single.items():
        assert r.set(k, v) is True
    # write_ack all: the +OK came after every owner answered, so no wait here
    assert_owners_hold(p, list(single), digests(single), crcs=len(single))

    batch = {**values(10, 500, b"m"), **values(10, 40000, b"M")}
    others = {o for k in batch for o in p.owners(k) if o != 0}
    before = p.metric(0, "kvstash_cluster_peer_requests_total")
    assert r.mset(batch) is True
    assert_owners_hold(p, list(batch), digests(batch), crcs=len(batch))
    sent = p.metric(0, "kvstash_cluster_peer_requests_total") - before
    assert sent == len(others), f"{sent} peer requests for one MSET to {len(others)} owners"
    # an MSET whose first pair is refused (a key over max_key_size) answers that error once
    # the owners of the pairs stored have answered, and those pairs reach them. (Values kept
    # under 16 KiB: with a refused key ahead of values received into reservations, the RESP
    # port can stop reading the command, pool or not: a known fault, not this test's.)
    mixed = values(6, 3000, b"e")
    with pytest.raises(redis.ResponseError, match="max_key_size"):
        r.mset({b"k" * 2000: b"v", **mixed})
    assert_owners_hold(p, list(mixed), digests(mixed))
    # node 0 keeps what it does not own as a cache copy, and reads it back
    for k, v in {**single, **batch}.items():
        assert r.get(k) == v
    assert p.metric(0, "kvstash_cluster_replication_drops_total") == 0
    assert p.metric(0, "kvstash_cluster_replications_total") >= sum(
        len([o for o in p.owners(k) if o != 0]) for k in {**single, **batch})


def test_write_ack_all_holds_set_and_the_replies_behind_it(resp_pool):
    p = resp_pool(["--write_ack=all", "--peer_timeout=20s"])
    vals = values(12, 30000, b"h")
    held = owned_by(p, vals, 1)
    if len(held) < 2:
        pytest.skip("placement gave node 1 fewer than 2 of 12 keys")
    local = b"rs-h-local"
    r = p.redis(0)
    assert r.set(local, b"L" * 5000) is True
    raw = Raw(p.resp_ports[0])
    pipeline = [cmd("SET", held[0], vals[held[0]]), cmd("GET", local), cmd("PING"),
                cmd("MSET", held[1], vals[held[1]], b"rs-h-x", b"x"), cmd("STRLEN", local),
                cmd("ECHO", "last")]
    stop_process(p.daemons[1].pid)
    try:
        raw.s.sendall(b"".join(pipeline))
        assert raw.nothing_within(STOPPED_WAIT), \
            f"a reply came while an owner was stopped: {raw.buf[:80]!r}"
    finally:
        os.kill(p.daemons[1].pid, signal.SIGCONT)
    got = [raw.reply() for _ in pipeline]
    assert got == [b"+OK\r\n", b"L" * 5000, b"+PONG\r\n", b"+OK\r\n", b":5000\r\n", b"last"]
    raw.close()
    assert_owners_hold(p, held[:2], digests(vals))


def test_write_ack_local_answers_while_an_owner_is_stopped(resp_pool):
    p = resp_pool(["--write_ack=local", "--peer_timeout=20s"])
    vals = values(12, 30000, b"l")
    keys = owned_by(p, vals, 1)
    if not keys:
        pytest.skip("placement gave node 1 none of 12 keys")
    raw = Raw(p.resp_ports[0])
    stop_process(p.daemons[1].pid)
    try:
        raw.s.sendall(b"".join(cmd("SET", k, vals[k]) for k in keys) + cmd("PING"))
        # answered from the local copy, the owner still stopped (bounded: 30 s socket timeout)
        assert [raw.reply() for _ in keys] == [b"+OK\r\n"] * len(keys)
        assert raw.reply() == b"+PONG\r\n"
    finally:
        os.kill(p.daemons[1].pid, signal.SIGCONT)
    raw.close()
    # the copies follow once it runs again (the queue's peer_put waited within peer_timeout);
    # write_ack local answers before any owner's copy, so wait for every owner's, not node 1's
    wait_until(lambda: all(all(p.has(i, [k])[0] for i in p.owners(k)) for k in keys),
               "every owner's copy")
    assert_owners_hold(p, keys, digests({k: vals[k] for k in keys}))


def test_reads_on_a_non_owner_fetch_from_the_owners(resp_pool):
    p = resp_pool()
    vals = values(24, 20000, b"r")
    digest = digests(vals)
    far = owned_by(p, vals, 2, owner=False)       # node 2 neither owns nor writes these
    if len(far) < 4:
        pytest.skip("placement gave node 2 fewer than 4 foreign keys of 24")
    w = p.daemons[0].tcp()
    assert w.call("batch_put", far, [vals[k] for k in far]) == [0] * len(far)
    for k in far:
        wait_until(lambda k=k: all(p.has(i, [k])[0] for i in p.owners(k)), f"{k}'s owners")
    assert not any(p.has(2, far))
    r = p.redis(2)
    get, mget, exists, strlen = far[0], far[1:3], far[3], far[4:] if len(far) > 4 else []
    before = p.metric(2, "kvstash_cluster_remote_hits_total")
    assert hashlib.sha256(r.get(get)).hexdigest() == digest[get]
    got = r.mget(mget + [b"rs-r-nowhere"])
    assert [hashlib.sha256(g).hexdigest() for g in got[:-1]] == [digest[k] for k in mget]
    assert got[-1] is None
    assert r.exists(exists, b"rs-r-nowhere") == 1
    for k in strlen:
        assert r.strlen(k) == len(vals[k])
    assert all(p.has(2, far)), "node 2 did not keep what it fetched"
    hits = p.metric(2, "kvstash_cluster_remote_hits_total")
    assert hits - before == len(far)
    # the second reads are local
    for k in far:
        assert hashlib.sha256(r.get(k)).hexdigest() == digest[k]
    assert r.exists(*far) == len(far)
    assert p.metric(2, "kvstash_cluster_remote_hits_total") == hits


def test_pipelined_mixed_commands_keep_their_order(resp_pool):
    p = resp_pool(["--write_ack=all"])
    vals = values(40, 9000, b"p")
    far = owned_by(p, vals, 2, owner=False)
    if len(far) < 4:
        pytest.skip("placement gave node 2 fewer than 4 foreign keys of 40")
    stored = far[:len(far) // 2]            # on the owners only: node 2 fetches them
    fresh = [k for k in vals if k not in stored]
    w = p.daemons[0].tcp()
    assert w.call("batch_put", stored, [vals[k] for k in stored]) == [0] * len(stored)
    for k in stored:
        wait_until(lambda k=k: all(p.has(i, [k])[0] for i in p.owners(k)), f"{k}'s owners")
    pipe = p.redis(2).pipeline(transaction=False)
    want = []
    for i, k in enumerate(fresh):
        pipe.set(k, vals[k])
        want.append(True)
        s = stored[i % len(stored)]
        pipe.get(s)
        want.append(vals[s])
        pipe.get(k)
        want.append(vals[k])
        pipe.strlen(s)
        want.append(len(vals[s]))
        pipe.exists(k, s, b"rs-p-nowhere")
        want.append(2)
        pipe.mget([s, b"rs-p-nowhere", k])
        want.append([vals[s], None, vals[k]])
        pipe.ping()
        want.append(True)
    got = pipe.execute()
    assert len(got) == len(want)
    for i, (g, x) in enumerate(zip(got, want)):
        assert g == x, f"reply {i} out of place or wrong: {str(g)[:60]} != {str(x)[:60]}"
    # what was SET here reached its owners byte-exact
    assert_owners_hold(p, fresh, digests({k: vals[k] for k in fresh}), crcs=len(fresh))
