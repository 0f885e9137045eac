"""Integration: client-driven access to the store's own memory over the Unix socket.

A same-host client maps the daemon's arena (map_segment hands over its memfd with
SCM_RIGHTS), writes an object in place between put_start and put_end, and reads
objects in place where get_replica_list says they are, under a lease
(protocol/SPEC.md, "Direct access"). The tests check what a user relies on: bytes
written in place read back exactly through get; nothing is visible before put_end;
revoke, disconnect and the put_timeout_ms reclaim all free the space and never publish;
a lease keeps an object's bytes in place against eviction and even a forced remove,
and lets go when it ends; TCP and bad input get clear errors. Every wait is bounded.
"""

import mmap
import os
import random
import socket
import time

import pytest

from kvtest import Client, Daemon, wait_for

KIB = 1 << 10
MIB = 1 << 20
OK, NOT_FOUND, EXISTS, BUSY, NO_SPACE, TOO_LARGE, INVALID_ARGUMENT = 0, 1, 2, 3, 4, 5, 6
UNSUPPORTED = 15


class DirectClient(Client):
    """A Client that also collects descriptors the daemon sends (SCM_RIGHTS)."""

    recv_timeout = 10       # seconds recv waits for a message

    def __init__(self, sock):
        super().__init__(sock)
        self.fds = []

    def recv(self):
        deadline = time.monotonic() + self.recv_timeout
        while True:
            for msg in self.unpacker:
                return msg
            if time.monotonic() > deadline:
                raise TimeoutError("no message from kvstashd")
            data, fds, _, _ = socket.recv_fds(self.sock, 1 << 20, 4)
            self.fds.extend(fds)
            if not data:
                raise ConnectionError("kvstashd closed the connection")
            self.unpacker.feed(data)

    def map_arena(self):
        """map_segment(0): the arena, mapped read-write; returns (mmap, size)."""
        res = self.call("map_segment", 0)
        assert len(self.fds) == 1, f"map_segment sent {len(self.fds)} descriptors"
        fd = self.fds.pop()
        try:
            mm = mmap.mmap(fd, res["size"])
        finally:
            os.close(fd)
        assert res["segment"] == 0
        return mm, res["size"]


def blob(seed, n):
    return random.Random(seed).randbytes(n)


def write_pieces(mm, pieces, data):
    """Write data into the arena pieces [[segment, offset, length], ...] in order."""
    off = 0
    for seg, at, n in pieces:
        assert seg == 0
        mm[at:at + n] = bytes(data[off:off + n])
        off += n
    assert off == len(data), f"pieces hold {off} bytes, the object {len(data)}"


def read_pieces(mm, pieces):
    return b"".join(mm[at:at + n] for _, at, n in pieces)


@pytest.fixture
def kv(daemons):
    """kv(*args) starts a ready daemon, DRAM only unless asked; all are killed at teardown."""
    return lambda *args: daemons(("--ssd_dir=", *args))


def direct(d):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(10)
    s.connect(d.unix_path)
    c = DirectClient(s)
    d.clients.append(c)
    return c


def test_two_phase_put_in_place(kv):
    d = kv("--memory_size=64m")
    c = direct(d)
    mm, size = c.map_arena()
    assert size == 64 * MIB
    sizes = [MIB, 3 * MIB + 5, 0, 4 * KIB + 1]
    keys = [f"tp-{i}".encode() for i in range(len(sizes))]
    res = c.call("put_start", keys, sizes)
    assert len(res) == len(keys)
    for k, n, pieces in zip(keys, sizes, res):
        assert isinstance(pieces, list), f"{k}: {pieces}"
        assert sum(p[2] for p in pieces) == n
        for _, at, ln in pieces:
            assert 0 <= at and at + ln <= size
        write_pieces(mm, pieces, blob(k, n))
    # Reserved, not visible: get misses, exists says no, a second writer is told BUSY.
    other = d.unix()
    assert other.call("get", keys[0]) is None
    assert other.call("batch_is_exist", keys) == [0] * len(keys)
    assert other.call("put", keys[0], b"x") == BUSY
    assert c.call("put_end", keys) == [OK] * len(keys)
    for k, n in zip(keys, sizes):
        assert other.call("get", k) == bytes(blob(k, n)), k
    # Write-once, and a second put_end of the same keys finds nothing to end.
    assert c.call("put_start", [keys[0]], [10]) == [EXISTS]
    assert c.call("put_end", keys) == [NOT_FOUND] * len(keys)
    mm.close()


def test_revoke_and_disconnect_free_the_space(kv):
    d = kv("--memory_size=16m", "--eviction_high_watermark=1.0", "--eviction_low_watermark=0.9")
    c = direct(d)
    big = 12 * MIB
    res = c.call("put_start", [b"a"], [big])
    assert isinstance(res[0], list)
    # The arena holds one such object: a second reservation finds no room.
    assert c.call("put_start", [b"b"], [big]) == [NO_SPACE]
    assert c.call("put_revoke", [b"a"]) == [OK]
    assert c.call("put_revoke", [b"a"]) == [NOT_FOUND]
    assert c.call("get", b"a") is None
    res = c.call("put_start", [b"b"], [big])
    assert isinstance(res[0], list), res
    # Another connection cannot end or revoke what this one reserved.
    o = direct(d)
    assert o.call("put_end", [b"b"]) == [NOT_FOUND]
    assert o.call("put_revoke", [b"b"]) == [NOT_FOUND]
    c.close()
    d.clients.remove(c)
    # The disconnect drops the reservation: the key never appears, the room comes back.
    res = wait_for(lambda: (r := o.call("put_start", [b"c"], [big]))[0] != NO_SPACE and r,
                   5, "the closed connection's reservation to be dropped")
    assert isinstance(res[0], list), res
    assert o.call("get", b"b") is None
    assert o.call("put_revoke", [b"c"]) == [OK]


def test_abandoned_reservation_is_reclaimed(kv):
    d = kv("--memory_size=16m", "--put_timeout_ms=300ms")
    c = direct(d)
    assert isinstance(c.call("put_start", [b"slow"], [MIB])[0], list)
    before = c.call("stats")["puts_expired"]
    wait_for(lambda: c.call("stats")["puts_expired"] > before, 10,
             "the reservation to be reclaimed after put_timeout_ms")
    assert c.call("put_end", [b"slow"]) == [NOT_FOUND]
    assert c.call("get", b"slow") is None
    # The key is free again for anyone.
    assert d.unix().call("put", b"slow", b"v") == OK


# Leases long enough that the checks made under one always finish well inside it, even on a
# loaded machine; each such check is timed from before the lease began (so the lease held
# throughout when the time is under LEASE_S), and what happens after the lease is waited for.
LEASE_S = 4


def under_lease(since, what):
    took = time.monotonic() - since
    assert took < LEASE_S, f"{what} took {took:.1f} s: the {LEASE_S} s lease had run out " \
        "before it was checked (a machine this slow cannot check it)"


def test_replica_list_reads_in_place_under_a_lease(kv):
    d = kv("--memory_size=16m", f"--lease_ttl_ms={LEASE_S}s")
    c = direct(d)
    mm, _ = c.map_arena()
    val = blob(7, 5 * MIB)
    assert c.call("put", b"held", val) == OK
    leased_at = time.monotonic()
    res = c.call("get_replica_list", [b"held", b"missing"])
    assert res[1] is None
    r = res[0]
    assert r["transport"] == "shm" and r["size"] == len(val) and r["lease_ms"] == LEASE_S * 1000
    assert read_pieces(mm, r["pieces"]) == val
    # Under the lease: a plain remove is BUSY, and filling the arena does not evict it.
    assert c.call("remove", b"held") == BUSY
    filler = bytes(MIB)
    for i in range(40):
        c.call("put", f"fill-{i}".encode(), filler)
    assert c.call("get", b"held") == val, "a leased object was evicted"
    assert read_pieces(mm, r["pieces"]) == val
    under_lease(leased_at, "filling the arena")
    # A forced remove takes the key away at once, but the pages stay as they were
    # until the lease ends, however many puts come meanwhile.
    leased_at = time.monotonic()
    r = c.call("get_replica_list", [b"held"])[0]
    assert c.call("remove", b"held", {"force": True}) == OK
    assert c.call("get", b"held") is None
    for i in range(40):
        c.call("put", f"again-{i}".encode(), filler)
    assert read_pieces(mm, r["pieces"]) == val, "a leased object's pages were reused"
    under_lease(leased_at, "filling the arena after the forced remove")
    # After the lease, the pages return to the arena and are used again.
    rounds = iter(range(1_000_000))

    def reused():
        n = next(rounds)
        for i in range(40):
            c.call("put", f"after-{n}-{i}".encode(), filler)
        return read_pieces(mm, r["pieces"]) != val

    wait_for(reused, LEASE_S + 30, "the pages to come back after the lease", interval=0.2)
    mm.close()


def test_replica_lease_blocks_eviction_until_it_ends(kv):
    d = kv("--memory_size=16m", f"--lease_ttl_ms={LEASE_S}s")
    c = direct(d)
    val = blob(3, 4 * MIB)
    assert c.call("put", b"k", val) == OK
    leased_at = time.monotonic()
    assert c.call("get_replica_list", [b"k"])[0]["size"] == len(val)
    filler = bytes(MIB)
    for i in range(30):
        assert c.call("put", f"f{i}".encode(), filler) == OK
    assert c.call("get_size", b"k") == len(val), "a leased object was evicted"
    under_lease(leased_at, "filling the arena")
    rounds = iter(range(1_000_000))

    def evicted():
        n = next(rounds)
        for i in range(30):
            assert c.call("put", f"g{n}-{i}".encode(), filler) == OK
        return c.call("get_size", b"k") is None

    wait_for(evicted, LEASE_S + 30, "the object to be evicted under pressure after its lease",
             interval=0.2)


def test_errors(kv):
    d = kv("--memory_size=16m", "--max_value_size=1m")
    t = d.tcp()
    for m, p in (("map_segment", [0]), ("put_start", [[b"k"], [1]]),
                 ("get_replica_list", [[b"k"]])):
        err, _ = t.call_raw(m, *p)
        assert err is not None and err[0] == UNSUPPORTED and "Unix socket" in err[2], (m, err)
    c = direct(d)
    err, _ = c.call_raw("map_segment", 3)
    assert err is not None and err[0] == NOT_FOUND
    err, _ = c.call_raw("put_start", [b"a", b"b"], [1])
    assert err is not None and err[0] == INVALID_ARGUMENT
    err, _ = c.call_raw("put_start", [b"a"], [-1])
    assert err is not None and err[0] == INVALID_ARGUMENT
    assert c.call("put_start", [b"a", b"a", b"big"], [10, 10, 2 * MIB]) [1:] == [BUSY, TOO_LARGE]
    assert c.call("put_end", [b"a", b"nope"]) == [OK, NOT_FOUND]
    assert c.call("get", b"a") is not None
    d.assert_alive()


def test_durable_put_end_is_on_ssd_when_answered(kv, tmp_path):
    args = ("--memory_size=32m", "--ssd_dir=" + str(tmp_path / "ssd"), "--ssd_offload=off")
    d = kv(*args)
    c = direct(d)
    mm, _ = c.map_arena()
    vals = {b"dur": blob(1, MIB + 3), b"plain": blob(2, 5000)}
    res = c.call("put_start", [b"dur"], [len(vals[b"dur"])], {"durable": True})
    write_pieces(mm, res[0], vals[b"dur"])
    res2 = c.call("put_start", [b"plain"], [len(vals[b"plain"])])
    write_pieces(mm, res2[0], vals[b"plain"])
    assert c.call("put_end", [b"dur", b"plain"]) == [OK, OK]
    mm.close()
    d.kill9()
    d2 = Daemon(str(tmp_path), ("--ssd_dir=" + str(tmp_path / "ssd"), *args[:1], *args[2:]),
                data_dir=d.data_dir)
    try:
        d2.wait_ready()
        c2 = d2.unix()
        assert c2.call("get", b"dur") == vals[b"dur"], "a durable put_end was lost by kill -9"
        assert c2.call("get", b"plain") is None
    finally:
        d2.reap()
