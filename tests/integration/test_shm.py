"""Integration: shared-memory buffers over kvstashd's Unix socket.

A client on the same host registers a memfd (sealed against shrinking, or not: then
the daemon guards it) with register_buffer, passing the descriptor with SCM_RIGHTS, and then moves values
between that memory and the store with batch_put_from / batch_get_into instead of
sending them through the socket (protocol/SPEC.md, "Shared-memory buffers").

Every test starts the real daemon ($KVSTASHD, default build/release/kvstashd) with
its own temporary data_dir, an ephemeral loopback TCP port and a Unix socket in the
temporary directory, and checks what a user of the feature relies on: bytes come back
exactly as they were put, whatever the piece splits; a short value fills only what it
needs; a bad piece fails only its own key and never touches memory; the descriptor
checks at registration hold; a client that shrinks an unsealed buffer in the middle of
its transfers fails only those transfers, stores nothing partial, loses the buffer and
never disturbs the daemon or other clients; unregistering (also with transfers in flight) and
disconnecting release the daemon's mapping; a client killed mid-transfer leaks
nothing and leaves no half objects; a big transfer does not stall other clients; and
objects on the SSD tier come back through get_into. Only Debian's python3-msgpack,
pytest and the standard library are used. Every wait is bounded in time and every
loop in count.
"""

import fcntl
import mmap
import os
import random
import select
import socket
import subprocess
import sys
import threading
import time

import pytest

from kvtest import Client, Daemon, wait_for

KIB = 1 << 10
MIB = 1 << 20

OK, NOT_FOUND, EXISTS, INVALID_ARGUMENT, UNAVAILABLE, UNSUPPORTED = 0, 1, 2, 6, 14, 15

F_ADD_SEALS = getattr(fcntl, "F_ADD_SEALS", 1033)
F_SEAL_SHRINK = getattr(fcntl, "F_SEAL_SHRINK", 0x0002)

# One random block; "pattern(j)" is a distinct 1 MiB window of it, cheap to make and to
# recompute in a child process (same seed), and different for every j < 256.
PATTERN_SEED = 20240611
R = random.Random(PATTERN_SEED).randbytes(2 * MIB)


def pattern(j, size=MIB):
    s = (j * 4099) % MIB
    return memoryview(R)[s:s + size]


# ---------------------------------------------------------------------------------------
# Byte comparisons that stay fast on hundreds of MiB.

_CHUNK = MIB
_SCRATCH = bytearray(_CHUNK)
_SCRATCH_MV = memoryview(_SCRATCH)


def same(a, b):
    a, b = memoryview(a).cast("B"), memoryview(b).cast("B")
    if len(a) != len(b):
        return False
    for off in range(0, len(a), _CHUNK):
        n = min(_CHUNK, len(a) - off)
        if n == _CHUNK:
            _SCRATCH_MV[:] = a[off:off + n]
            if _SCRATCH != b[off:off + n]:
                return False
        elif bytes(a[off:off + n]) != bytes(b[off:off + n]):
            return False
    return True


def first_diff(a, b):
    """Offset of the first differing byte of two equally long buffers, or None."""
    a, b = memoryview(a).cast("B"), memoryview(b).cast("B")
    step = 4096
    for off in range(0, len(a), step):
        x, y = bytes(a[off:off + step]), bytes(b[off:off + step])
        if x != y:
            for i in range(len(x)):
                if x[i] != y[i]:
                    return off + i
    return None


def assert_same(got, want, what):
    if len(got) != len(want):
        pytest.fail(f"{what}: {len(got)} bytes, want {len(want)}")
    if not same(got, want):
        i = first_diff(got, want)
        g = bytes(memoryview(got)[i:i + 8]).hex()
        w = bytes(memoryview(want)[i:i + 8]).hex()
        pytest.fail(f"{what}: differs at byte {i} of {len(want)} (got {g}.., want {w}..)")


# ---------------------------------------------------------------------------------------
# A sealed memfd and the client's view of it.


class ShmBuffer:
    seq = 0

    def __init__(self, size, seal=True, memfd_size=None):
        ShmBuffer.seq += 1
        self.name = f"kvshm-test-{os.getpid()}-{ShmBuffer.seq}"
        self.size = size
        self.fd = os.memfd_create(self.name, os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
        os.ftruncate(self.fd, size if memfd_size is None else memfd_size)
        if seal:
            fcntl.fcntl(self.fd, F_ADD_SEALS, F_SEAL_SHRINK)
        self.mm = mmap.mmap(self.fd, size if memfd_size is None else memfd_size)
        self.mv = memoryview(self.mm)

    def write(self, off, data):
        self.mv[off:off + len(data)] = data

    def fill(self, byte, off=0, length=None):
        """Fill [off, off+length) with one byte value, a MiB at a time."""
        end = self.size if length is None else off + length
        block = bytes([byte]) * MIB
        for o in range(off, end, MIB):
            n = min(MIB, end - o)
            self.mv[o:o + n] = block[:n]

    def close(self):
        try:
            self.mv.release()
            self.mm.close()
        except BufferError:     # a view is still referenced (a failing test's frame)
            pass
        os.close(self.fd)


def on_tmpfs(path):
    """True when path lies on tmpfs (a file there is shared memory, accepted and guarded)."""
    out = subprocess.run(["stat", "-f", "-c", "%T", path], capture_output=True, text=True)
    return out.stdout.strip() == "tmpfs"


def memfd_refs(pid, name):
    """(mappings, descriptors) the process holds on the memfd called name."""
    tag = f"/memfd:{name} (deleted)"
    maps = 0
    try:
        with open(f"/proc/{pid}/maps") as f:
            for line in f:
                if line.rstrip("\n").endswith(tag):
                    maps += 1
    except FileNotFoundError:
        return 0, 0
    fds = 0
    try:
        entries = os.listdir(f"/proc/{pid}/fd")
    except FileNotFoundError:
        return maps, 0
    for e in entries:
        try:
            if os.readlink(f"/proc/{pid}/fd/{e}") == tag:
                fds += 1
        except OSError:         # closed while we looked
            pass
    return maps, fds


# ---------------------------------------------------------------------------------------
# The daemon.


@pytest.fixture
def kv(daemons):
    """kv(*args) starts a ready daemon; every one is killed at teardown."""
    return lambda *args: daemons(args)


@pytest.fixture
def bufs():
    """bufs(size, ...) makes a ShmBuffer; all are unmapped and closed at teardown."""
    made = []

    def make(size, **kw):
        b = ShmBuffer(size, **kw)
        made.append(b)
        return b

    yield make
    for b in made:
        b.close()


# ---------------------------------------------------------------------------------------
# Requests.


def register(c, fd, size=None, opts=None):
    """register_buffer with fd attached (None: no descriptor). Returns (error, result)."""
    if opts is None:
        opts = {"size": size}
    msgid, data = c.request("register_buffer", [opts])
    if fd is None:
        c.sock.sendall(data)
    else:
        n = socket.send_fds(c.sock, [data], [fd])
        assert n == len(data), f"sendmsg sent {n} of {len(data)} bytes"
    msg = c.recv()
    assert isinstance(msg, list) and len(msg) == 4 and msg[0] == 1 and msg[1] == msgid, msg
    return msg[2], msg[3]


def register_ok(c, buf, size=None):
    err, bid = register(c, buf.fd, buf.size if size is None else size)
    assert err is None, f"register_buffer of a sealed {buf.size}-byte memfd: {err}"
    assert isinstance(bid, int) and bid >= 0, f"register_buffer returned {bid!r}"
    return bid


def put_from(c, keys, iovs, *opts):
    codes = c.call("batch_put_from", keys, iovs, *opts)
    assert isinstance(codes, list) and len(codes) == len(keys), codes
    return codes


def get_into(c, keys, iovs):
    res = c.call("batch_get_into", keys, iovs)
    assert isinstance(res, list) and len(res) == len(keys), res
    return res


def split(rng, size, n):
    """n piece lengths summing to size (pieces may be tiny, at least 1 byte when possible)."""
    if n == 1 or size < n:
        return [size]
    cuts = sorted(rng.sample(range(1, size), n - 1))
    bounds = [0, *cuts, size]
    return [bounds[i + 1] - bounds[i] for i in range(n)]


def place(rng, lengths, lo, hi, taken):
    """Non-overlapping, scattered offsets in [lo, hi) for the given lengths (bounded tries)."""
    offs = []
    for ln in lengths:
        for _ in range(1000):
            o = rng.randrange(lo, hi - ln)
            if all(o + ln + 64 <= a or b + 64 <= o for a, b in taken):
                break
        else:
            raise AssertionError("could not place a piece (test bug)")
        taken.append((o, o + ln))
        offs.append(o)
    return offs


# ---------------------------------------------------------------------------------------
# 1. Round trip with scattered, multi-piece iovs.


def test_round_trip_with_scattered_pieces(kv, bufs):
    d = kv("--memory_size=256m", "--ssd_dir=")
    c = d.unix()
    size = 64 * MIB
    buf = bufs(size)
    buf.fill(0xA5)
    mirror = bytearray(b"\xa5") * size          # what the whole buffer must hold
    bid = register_ok(c, buf)

    rng = random.Random(1)
    sizes = [MIB, MIB + 1, 3 * MIB // 2 + 7, 999_999, 2 * MIB - 3, 4097, 1, 3 * MIB + 12345]
    keys = [f"shm-rt-{i}".encode() for i in range(len(sizes))]
    values = [rng.randbytes(n) for n in sizes]

    # Sources: 3 pieces per key, scattered over [0, 32 MiB) in no particular order.
    taken, iovs = [], []
    for v in values:
        lens = split(rng, len(v), 3)
        offs = place(rng, lens, 0, 32 * MIB, taken)
        pieces, pos = [], 0
        for o, ln in zip(offs, lens):
            buf.write(o, v[pos:pos + ln])
            mirror[o:o + ln] = v[pos:pos + ln]
            pieces.append([bid, o, ln])
            pos += ln
        iovs.append(pieces)
    assert put_from(c, keys, iovs) == [OK] * len(keys)

    # The store copied the bytes: scribbling over the sources changes nothing stored.
    for pieces in iovs:
        for _, o, ln in pieces:
            buf.write(o, b"\x5a" * ln)
            mirror[o:o + ln] = b"\x5a" * ln
    assert c.call("batch_get_size", keys) == sizes
    assert c.call("batch_is_exist", keys) == [True] * len(keys)

    # Destinations in [32 MiB, 64 MiB), split differently: 1, 2, 4, 5 pieces.
    taken, iovs_out, dests = [], [], []
    for i, v in enumerate(values):
        lens = split(rng, len(v), [1, 2, 4, 5][i % 4])
        offs = place(rng, lens, 32 * MIB, 64 * MIB, taken)
        iovs_out.append([[bid, o, ln] for o, ln in zip(offs, lens)])
        dests.append(list(zip(offs, lens)))
    assert get_into(c, keys, iovs_out) == sizes

    for i, v in enumerate(values):
        pos = 0
        for o, ln in dests[i]:
            assert_same(buf.mv[o:o + ln], v[pos:pos + ln], f"{keys[i]}: piece at {o}")
            mirror[o:o + ln] = v[pos:pos + ln]
            pos += ln
    assert_same(buf.mv, mirror, "the whole buffer after batch_get_into (bytes outside the "
                                "pieces must be untouched)")

    # They are ordinary objects: plain get over both transports returns the same bytes.
    t = d.tcp()
    for k, v in zip(keys, values):
        assert c.call("get", k) == v, f"{k}: get over the unix socket differs"
    assert t.call("batch_get", keys) == values, "batch_get over TCP differs"

    # Write-once holds for put_from too, and ordinary puts can be read with get_into.
    assert put_from(c, keys[:1], [[[bid, 0, 10]]]) == [EXISTS]
    assert t.call("get", keys[0]) == values[0]
    plain = rng.randbytes(300_001)
    assert t.call("put", b"shm-rt-plain", plain) == 0
    assert get_into(c, [b"shm-rt-plain"], [[[bid, 100, 1000], [bid, 50 * MIB, 299_001]]]) \
        == [len(plain)]
    assert_same(buf.mv[100:1100], plain[:1000], "plain put read by get_into, piece 1")
    assert_same(buf.mv[50 * MIB:50 * MIB + 299_001], plain[1000:],
                "plain put read by get_into, piece 2")
    d.stop()


def test_one_key_from_two_buffers(kv, bufs):
    d = kv("--memory_size=64m", "--ssd_dir=")
    c = d.unix()
    a, b = bufs(2 * MIB), bufs(1 * MIB)
    ida, idb = register_ok(c, a), register_ok(c, b)
    assert ida != idb, "two buffers of one connection got the same id"
    a.write(0, pattern(1))
    b.write(0, pattern(2))
    want = bytes(pattern(1)[:1000]) + bytes(pattern(2)[:5000]) + bytes(pattern(1)[7000:9000])
    assert put_from(c, [b"shm-two"], [[[ida, 0, 1000], [idb, 0, 5000], [ida, 7000, 2000]]]) \
        == [OK]
    assert c.call("get", b"shm-two") == want
    a.fill(0)
    b.fill(0)
    assert get_into(c, [b"shm-two"], [[[idb, 10, 4000], [ida, MIB, 4000]]]) == [len(want)]
    assert_same(b.mv[10:4010], want[:4000], "piece in buffer b")
    assert_same(a.mv[MIB:MIB + 4000], want[4000:], "piece in buffer a")
    assert b.mv[:10] == bytes(10) and a.mv[MIB + 4000:MIB + 4100] == bytes(100)
    d.stop()


# ---------------------------------------------------------------------------------------
# 2. Short reads: the value is shorter than the pieces.


def test_short_value_fills_only_its_bytes(kv, bufs):
    d = kv("--memory_size=64m", "--ssd_dir=")
    c = d.unix()
    size = 4 * MIB
    buf = bufs(size)
    buf.fill(0xEE)
    mirror = bytearray(b"\xee") * size
    bid = register_ok(c, buf)

    v = random.Random(2).randbytes(1000)
    assert c.call("put", b"short", v) == 0
    assert c.call("put", b"empty", b"") == 0
    # 300 + 600 + 400 = 1300 bytes of room for 1000: the third piece gets 100 bytes.
    pieces = [[bid, 100, 300], [bid, 5000, 600], [bid, 9000, 400]]
    assert get_into(c, [b"short"], [pieces]) == [1000]
    mirror[100:400] = v[:300]
    mirror[5000:5600] = v[300:900]
    mirror[9000:9100] = v[900:]
    assert_same(buf.mv[9100:9400], b"\xee" * 300, "the unused tail of the last piece")
    assert_same(buf.mv, mirror, "the buffer after a short read")

    # An empty value and a missing key write nothing.
    res = get_into(c, [b"empty", b"never-stored"], [[[bid, MIB, 4096]], [[bid, 2 * MIB, 4096]]])
    assert res == [0, -NOT_FOUND]
    assert_same(buf.mv, mirror, "the buffer after an empty value and a missing key")

    # A value longer than its pieces (the spec does not say which answer): whatever it is,
    # nothing outside the pieces is written and the bytes written are the value's prefix.
    res = get_into(c, [b"short"], [[[bid, 3 * MIB, 200], [bid, 3 * MIB + 1000, 300]]])[0]
    print(f"get_into of a 1000-byte value into 500 bytes of pieces answered {res}")
    assert isinstance(res, int) and (res < 0 or res <= 500), res
    for lo, hi in ((3 * MIB, 3 * MIB + 200), (3 * MIB + 1000, 3 * MIB + 1300)):
        mirror[lo:hi] = buf.mv[lo:hi]       # checked below, allowed to change
    written = bytes(buf.mv[3 * MIB:3 * MIB + 200]) + bytes(buf.mv[3 * MIB + 1000:3 * MIB + 1300])
    if res >= 0:
        assert written[:res] == v[:res], "the bytes written are not the value's prefix"
    assert_same(buf.mv, mirror, "the buffer outside the pieces of a too-long value")
    d.stop()


def test_whole_refuses_a_value_longer_than_its_pieces(kv, bufs):
    """opts {"whole": true}: a value longer than its pieces answers -TOO_LARGE and writes
    none of them; one that fits exactly or is shorter is read as without it; a missing key
    is still -NOT_FOUND. Keys of one request are judged one by one."""
    d = kv("--memory_size=64m", "--ssd_dir=")
    c = d.unix()
    buf = bufs(MIB)
    buf.fill(0xEE)
    bid = register_ok(c, buf)
    v = random.Random(3).randbytes(1000)
    assert c.call("put", b"v1000", v) == 0
    res = c.call("batch_get_into", [b"v1000", b"v1000", b"v1000", b"none"],
                 [[[bid, 0, 600], [bid, 4096, 399]],      # one byte short: refused
                  [[bid, 8192, 500], [bid, 12288, 500]],  # exact
                  [[bid, 16384, 2000]],                   # longer: a short read
                  [[bid, 20480, 10]]], {"whole": True})
    assert res == [-5, 1000, 1000, -NOT_FOUND]          # -TOO_LARGE
    assert_same(buf.mv[0:600], b"\xee" * 600, "the pieces of a refused value")
    assert_same(buf.mv[4096:4096 + 399], b"\xee" * 399, "the pieces of a refused value")
    assert bytes(buf.mv[8192:8692]) + bytes(buf.mv[12288:12788]) == v
    assert bytes(buf.mv[16384:17384]) == v
    assert_same(buf.mv[17384:18384], b"\xee" * 1000, "past a short read")
    # without it (or false) the value is cut at the pieces' end, as before
    for opts in ([], [{"whole": False}]):
        assert c.call("batch_get_into", [b"v1000"], [[[bid, 0, 600]]], *opts) == [600]
    err, _ = c.call_raw("batch_get_into", [b"v1000"], [[[bid, 0, 600]]], {"whole": 1})
    assert err is not None and err[0] == INVALID_ARGUMENT and "whole" in err[2], err
    d.stop()


# ---------------------------------------------------------------------------------------
# 3. Bad pieces fail their key only and touch no memory.


def test_bad_pieces_fail_only_their_key(kv, bufs):
    d = kv("--memory_size=64m", "--ssd_dir=")
    c = d.unix()
    size = 1 * MIB
    buf = bufs(size)
    buf.fill(0x3C)
    bid = register_ok(c, buf)
    buf.write(0, pattern(3, 64 * KIB))
    mirror = bytearray(buf.mv)

    # A buffer of another connection is not this connection's buffer.
    other = d.unix()
    obuf = bufs(size)
    mine = {bid}
    oid = None
    for _ in range(3):
        oid = register_ok(other, obuf)
        if oid not in mine:
            break
    bad = {
        "past-end": [[bid, size - 10, 11]],
        "offset-at-end": [[bid, size, 1]],
        "unknown-id": [[bid + 1000, 0, 10]],
        "negative-offset": [[bid, -1, 10]],
        "negative-length": [[bid, 0, -1]],
        "huge-offset-wraps": [[bid, 2 ** 64 - 4096, 8192]],
        "huge-offset": [[bid, 2 ** 63, 16]],
        "good-then-bad-piece": [[bid, 0, 10], [bid, size - 5, 10]],
    }
    if oid not in mine:
        bad["other-connections-id"] = [[oid, 0, 10]]

    good_iov = [[bid, 0, 1000], [bid, 4096, 2000]]
    good_val = bytes(buf.mv[0:1000]) + bytes(buf.mv[4096:6096])
    keys, iovs, want = [], [], []
    for i, (name, iov) in enumerate(bad.items()):
        keys.append(f"shm-good-{i}".encode())
        iovs.append(good_iov)
        want.append(OK)
        keys.append(f"shm-bad-{name}".encode())
        iovs.append(iov)
        want.append(INVALID_ARGUMENT)
    codes = put_from(c, keys, iovs)
    wrong = {k.decode(): (w, g) for k, w, g in zip(keys, want, codes) if w != g}
    assert not wrong, f"batch_put_from: key: (want, got): {wrong}"
    exist = c.call("batch_is_exist", keys)
    assert exist == [w == OK for w in want], \
        f"a key refused with 6 was stored anyway: {dict(zip(keys, exist))}"
    for k, w in zip(keys, want):
        if w == OK:
            assert c.call("get", k) == good_val, k
    assert_same(buf.mv, mirror, "the buffer after batch_put_from with bad pieces")

    # The same pieces for batch_get_into, on keys that exist.
    src = b"shm-good-0"
    keys, iovs, want = [], [], []
    dst = 512 * KIB
    for name, iov in bad.items():
        keys.append(src)
        iovs.append([[bid, dst, len(good_val)]])
        mirror[dst:dst + len(good_val)] = good_val
        want.append(len(good_val))
        dst += 8 * KIB
        keys.append(src)
        iovs.append(iov)
        want.append(-INVALID_ARGUMENT)
    res = get_into(c, keys, iovs)
    names = [n for name in bad for n in ("good", name)]
    wrong = {f"{i}:{n}": (w, g) for i, (n, w, g) in enumerate(zip(names, want, res)) if w != g}
    assert not wrong, f"batch_get_into: index:piece: (want, got): {wrong}"
    assert_same(buf.mv, mirror, "the buffer after batch_get_into with bad pieces (only the "
                                "good keys' pieces may change)")
    assert_same(obuf.mv, bytes(size), "the other connection's buffer")

    # Request-level: ks and iovs of different lengths.
    err, result = c.call_raw("batch_put_from", [b"shm-len-1", b"shm-len-2"], [good_iov])
    assert err is not None and err[0] == INVALID_ARGUMENT and result is None, (err, result)
    err, result = c.call_raw("batch_get_into", [b"shm-good-0"], [])
    assert err is not None and err[0] == INVALID_ARGUMENT and result is None, (err, result)
    assert c.call("batch_is_exist", [b"shm-len-1", b"shm-len-2"]) == [False, False]

    # Malformed pieces: a request-level or a per-key 6, either way nothing stored.
    for name, iov in {"two-fields": [[bid, 0]], "four-fields": [[bid, 0, 10, 5]],
                      "not-an-array": ["piece"], "str-offset": [[bid, "0", 10]]}.items():
        key = f"shm-malformed-{name}".encode()
        err, result = c.call_raw("batch_put_from", [key], [iov])
        assert (err is not None and err[0] == INVALID_ARGUMENT) or \
            (err is None and result == [INVALID_ARGUMENT]), f"{name}: {err}, {result}"
        assert c.call("is_exist", key) is False, f"{name}: stored anyway"
        err, result = c.call_raw("batch_get_into", [src], [iov])
        assert (err is not None and err[0] == INVALID_ARGUMENT) or \
            (err is None and result == [-INVALID_ARGUMENT]), f"{name}: {err}, {result}"
    assert_same(buf.mv, mirror, "the buffer after malformed pieces")

    assert c.call("ping") == "pong"
    assert other.call("ping") == "pong"
    d.assert_alive()
    d.stop()


# ---------------------------------------------------------------------------------------
# 4. register_buffer's checks.


def test_register_buffer_refusals(kv, bufs, work):
    if on_tmpfs(work):
        pytest.skip(f"{work} is on tmpfs: a file there is shared memory, not a refusal")
    d = kv("--memory_size=64m", "--ssd_dir=")
    good = bufs(MIB)

    # Over TCP there is no descriptor passing: UNSUPPORTED.
    t = d.tcp()
    err, result = t.call_raw("register_buffer", {"size": MIB})
    assert err is not None and err[0] == UNSUPPORTED and err[1] == "UNSUPPORTED", err
    assert result is None
    assert t.call("ping") == "pong"

    fds0 = len(os.listdir(f"/proc/{d.pid}/fd"))
    path = os.path.join(work, "regular-file")
    with open(path, "wb") as f:
        f.truncate(MIB)
    regular = open(path, "r+b")
    r, w = os.pipe()
    cases = [
        ("without a descriptor", None, MIB, None),
        ("of a file on a disk", regular.fileno(), MIB, None),
        ("of a pipe", r, 4096, None),
        ("larger than its memfd", good.fd, MIB + 1, None),
        ("much larger than its memfd", good.fd, 1 << 40, None),
        ("without a size", good.fd, None, {}),
        ("with a str size", good.fd, None, {"size": "1048576"}),
    ]
    try:
        # Each on a connection of its own, so that one refusal cannot affect the next.
        for what, fd, size, opts in cases:
            c = Client.unix(d.unix_path)
            try:
                err, result = register(c, fd, size, opts)
                assert err is not None and err[0] == INVALID_ARGUMENT and result is None, \
                    f"register_buffer {what}: want error 6, got {err}, {result!r}"
                assert c.call("ping") == "pong", f"connection unusable after register_buffer {what}"
            finally:
                c.close()
    finally:
        regular.close()
        os.close(r)
        os.close(w)

    # None of those descriptors is still held or mapped by the daemon.
    for name in (good.name,):
        wait_for(lambda: memfd_refs(d.pid, name) == (0, 0), 5,
                 lambda: f"kvstashd to close the refused memfd {name} "
                         f"(maps, fds = {memfd_refs(d.pid, name)})")
    wait_for(lambda: len(os.listdir(f"/proc/{d.pid}/fd")) <= fds0, 5,
             lambda: f"kvstashd's descriptors to come back to {fds0} after the refusals "
                     f"(now {len(os.listdir(f'/proc/{d.pid}/fd'))})")

    # The daemon keeps working: a valid registration succeeds and is that buffer.
    c = d.unix()
    bid = register_ok(c, good)
    good.write(0, b"registered after refusals")
    assert put_from(c, [b"shm-after"], [[[bid, 0, 25]]]) == [OK]
    assert t.call("get", b"shm-after") == b"registered after refusals"
    assert memfd_refs(d.pid, good.name)[0] >= 1, "the registered buffer is not mapped"
    d.assert_alive()
    d.stop()


def expect_no_leftover_descriptor(d, c, b, leftover, after):
    """After `after` left the descriptor of memfd `leftover` with kvstashd: a registration
    of b with b's descriptor maps b (64 bytes of b"B" at 0), one with no descriptor is
    refused, and kvstashd closes the leftover descriptor."""
    bid = register_ok(c, b)
    assert put_from(c, [b"which"], [[[bid, 0, 64]]]) == [OK]
    got = c.call("get", b"which")
    assert got == b"B" * 64, \
        f"register_buffer of b, after {after}, mapped another memfd: " \
        f"a put_from through the id b got stored {got[:8]!r}.."
    err, result = register(c, None, MIB)
    assert err is not None and err[0] == INVALID_ARGUMENT and result is None, \
        f"register_buffer with no descriptor, after {after}: {err}, {result!r}"
    wait_for(lambda: memfd_refs(d.pid, leftover.name) == (0, 0), 5,
             lambda: f"kvstashd to close the descriptor left by {after} "
                     f"(maps, fds = {memfd_refs(d.pid, leftover.name)})")


@pytest.mark.parametrize("bad_opts", [{}, {"size": "1048576"}, {"size": -1}],
                         ids=["no-size", "str-size", "negative-size"])
def test_refused_registration_does_not_leave_its_descriptor_behind(kv, bufs, bad_opts):
    """A register_buffer refused for its opts must not leave its descriptor queued for the
    next register_buffer on the connection (which would then map the wrong memory)."""
    d = kv("--memory_size=64m", "--ssd_dir=")
    c = d.unix()
    a, b = bufs(MIB), bufs(MIB)
    a.write(0, b"A" * 64)
    b.write(0, b"B" * 64)
    err, result = register(c, a.fd, opts=bad_opts)
    assert err is not None and err[0] == INVALID_ARGUMENT and result is None, (err, result)

    # The next registration is of b, with b's descriptor: its id must be b's memory; and
    # one without any descriptor is refused, not served with a leftover one.
    expect_no_leftover_descriptor(d, c, b, a, f"one of a refused for opts {bad_opts}")
    d.stop()


def test_descriptor_sent_with_another_request_is_closed_and_ignored(kv, bufs):
    d = kv("--memory_size=64m", "--ssd_dir=")
    c = d.unix()
    stray, b = bufs(MIB), bufs(MIB)
    stray.write(0, b"S" * 64)
    b.write(0, b"B" * 64)
    msgid, data = c.request("ping", [])
    assert socket.send_fds(c.sock, [data], [stray.fd]) == len(data)
    msg = c.recv()
    assert msg[1] == msgid and msg[2] is None and msg[3] == "pong", msg
    # A register_buffer with a descriptor gets its own, not the stray one, and one without
    # a descriptor does not pick the stray one up.
    expect_no_leftover_descriptor(d, c, b, stray, "a ping that carried another memfd")
    d.stop()


def test_pipelined_registrations_get_their_own_descriptors(kv, bufs):
    d = kv("--memory_size=64m", "--ssd_dir=")
    c = d.unix()
    a, b = bufs(MIB), bufs(2 * MIB)
    a.write(0, b"A" * 100)
    b.write(0, b"B" * 100)
    # ping, register(a), ping, register(b), ping: five sends, no waiting in between.
    expect = []
    for method, params, fd in (("ping", [], None), ("register_buffer", [{"size": a.size}], a.fd),
                               ("ping", [], None), ("register_buffer", [{"size": b.size}], b.fd),
                               ("ping", [], None)):
        msgid, data = c.request(method, params)
        if fd is None:
            c.sock.sendall(data)
        else:
            assert socket.send_fds(c.sock, [data], [fd]) == len(data)
        expect.append((msgid, method))
    ids = []
    for msgid, method in expect:
        msg = c.recv()
        assert msg[0] == 1 and msg[1] == msgid and msg[2] is None, (method, msg)
        if method == "ping":
            assert msg[3] == "pong"
        else:
            ids.append(msg[3])
    ida, idb = ids
    assert ida != idb
    # Each id is the buffer whose descriptor came with its request.
    assert put_from(c, [b"pipe-a", b"pipe-b"], [[[ida, 0, 100]], [[idb, 0, 100]]]) == [OK, OK]
    assert c.call("batch_get", [b"pipe-a", b"pipe-b"]) == [b"A" * 100, b"B" * 100]
    # b is 2 MiB, a is 1 MiB: the sizes went with the right descriptors too.
    assert put_from(c, [b"pipe-b2", b"pipe-a2"],
                    [[[idb, MIB + 5, 10]], [[ida, MIB - 5, 10]]]) == [OK, INVALID_ARGUMENT]
    d.stop()


# ---------------------------------------------------------------------------------------
# 5. unregister_buffer, also with transfers in flight, and release on close.


def test_unregister_with_transfers_in_flight(kv, bufs):
    d = kv("--memory_size=256m", "--ssd_dir=")
    c = d.unix()
    n = 64
    src, dst, keep = bufs(n * MIB), bufs(n * MIB), bufs(MIB)
    for j in range(n):
        src.write(j * MIB, pattern(j))
    dst.fill(0x11)
    sid, did, kid = register_ok(c, src), register_ok(c, dst), register_ok(c, keep)
    keys = [f"shm-unreg-{j:02d}".encode() for j in range(n)]

    assert c.call("unregister_buffer", max(sid, did, kid) + 1000) == NOT_FOUND

    # batch_put_from of 64 MiB and, right behind it on the wire, unregister of its source.
    m1, r1 = c.request("batch_put_from", [keys, [[[sid, j * MIB, MIB]] for j in range(n)]])
    m2, r2 = c.request("unregister_buffer", [sid])
    c.sock.sendall(r1 + r2)
    msg1, msg2 = c.recv(), c.recv()
    assert msg1[1] == m1 and msg2[1] == m2, "replies out of order"
    assert msg1[2] is None and msg1[3] == [OK] * n, f"batch_put_from: {msg1[2]} {msg1[3]}"
    assert msg2[2] is None and msg2[3] == OK, f"unregister_buffer: {msg2}"

    # batch_get_into of 64 MiB and, right behind it, unregister of its destination.
    m1, r1 = c.request("batch_get_into", [keys, [[[did, j * MIB, MIB]] for j in range(n)]])
    m2, r2 = c.request("unregister_buffer", [did])
    c.sock.sendall(r1 + r2)
    msg1, msg2 = c.recv(), c.recv()
    assert msg1[1] == m1 and msg2[1] == m2, "replies out of order"
    assert msg1[2] is None and msg1[3] == [MIB] * n, f"batch_get_into: {msg1[2]} {msg1[3]}"
    assert msg2[2] is None and msg2[3] == OK, f"unregister_buffer: {msg2}"
    for j in range(n):
        assert_same(dst.mv[j * MIB:(j + 1) * MIB], pattern(j), f"{keys[j]} in the buffer")

    # The ids are gone for new requests.
    assert put_from(c, [b"shm-unreg-late"], [[[sid, 0, 10]]]) == [INVALID_ARGUMENT]
    assert get_into(c, keys[:2], [[[did, 0, MIB]], [[sid, 0, MIB]]]) == [-INVALID_ARGUMENT] * 2
    assert c.call("unregister_buffer", sid) == NOT_FOUND
    assert c.call("unregister_buffer", did) == NOT_FOUND
    assert c.call("is_exist", b"shm-unreg-late") is False

    # ... and the daemon let go of them (mapping and descriptor), but not of the third.
    for b in (src, dst):
        wait_for(lambda: memfd_refs(d.pid, b.name) == (0, 0), 5,
                 lambda: f"kvstashd to release the unregistered buffer {b.name} "
                 f"(maps, fds = {memfd_refs(d.pid, b.name)})")
    assert memfd_refs(d.pid, keep.name)[0] >= 1

    # Buffers belong to their connection: another one can neither use nor drop them.
    other = d.unix()
    assert other.call("unregister_buffer", kid) == NOT_FOUND
    assert get_into(other, keys[:1], [[[kid, 0, 100]]]) == [-INVALID_ARGUMENT]
    assert_same(keep.mv, bytes(MIB), "a buffer written through another connection")
    assert get_into(c, keys[:1], [[[kid, 0, 100]]]) == [100]
    assert_same(keep.mv[:100], pattern(0)[:100], "the kept buffer")

    # Closing the connection releases what it registered.
    c.close()
    wait_for(lambda: memfd_refs(d.pid, keep.name) == (0, 0), 5,
             lambda: f"kvstashd to release {keep.name} after its connection closed "
             f"(maps, fds = {memfd_refs(d.pid, keep.name)})")
    assert other.call("ping") == "pong"
    d.stop()


# ---------------------------------------------------------------------------------------
# 6. A client SIGKILLed with transfers in flight.

CHILD = r"""
import fcntl, mmap, os, random, socket, sys, time
import msgpack
path, name, seed, size, nsrc, npre = sys.argv[1], sys.argv[2], *map(int, sys.argv[3:7])
MIB = 1 << 20
R = random.Random(seed).randbytes(2 * MIB)
fd = os.memfd_create(name, os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
os.ftruncate(fd, size)
fcntl.fcntl(fd, getattr(fcntl, "F_ADD_SEALS", 1033), getattr(fcntl, "F_SEAL_SHRINK", 2))
mm = mmap.mmap(fd, size)
for j in range(nsrc):
    s = (j * 4099) % MIB
    mm[j * MIB:(j + 1) * MIB] = R[s:s + MIB]
sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
sock.settimeout(10)
sock.connect(path)
pk = msgpack.Packer(use_bin_type=True)
up = msgpack.Unpacker(raw=False)
socket.send_fds(sock, [pk.pack([0, 1, "register_buffer", [{"size": size}]])], [fd])
msg = None
for _ in range(100):
    data = sock.recv(65536)
    if not data:
        break
    up.feed(data)
    msg = next(up, None)
    if msg is not None:
        break
assert msg is not None and msg[2] is None, msg
bid = msg[3]
a = [b"kill-a-%03d" % j for j in range(nsrc)]
b = [b"kill-b-%03d" % j for j in range(nsrc - 1)]
pre = [b"kill-pre-%03d" % j for j in range(npre)]
reqs = [
    pk.pack([0, 2, "batch_put_from", [a, [[[bid, j * MIB, MIB]] for j in range(nsrc)]]]),
    pk.pack([0, 3, "batch_put_from", [b, [[[bid, j * MIB + MIB // 2, MIB]]
                                          for j in range(nsrc - 1)]]]),
    pk.pack([0, 4, "batch_get_into", [pre, [[[bid, (nsrc + j) * MIB, MIB]]
                                            for j in range(npre)]]]),
]
sock.sendall(b"".join(reqs))
print("sent", bid, flush=True)
time.sleep(30)
"""


def test_client_killed_mid_transfer_leaks_nothing(kv, bufs):
    d = kv("--memory_size=1g", "--ssd_dir=")
    t = d.tcp()
    s0 = t.call("stats")
    assert s0["objects"] == 0 and s0["reserved"] == 0, s0
    nsrc, npre = 192, 64
    size = 256 * MIB
    pre = [f"kill-pre-{j:03d}".encode() for j in range(npre)]
    pre_vals = [pattern(200 + j) for j in range(npre)]
    for i in range(0, npre, 8):
        assert t.call("batch_put", pre[i:i + 8], [bytes(v) for v in pre_vals[i:i + 8]]) \
            == [0] * 8
    s1 = t.call("stats")
    per_object = (s1["memory_used"] - s0["memory_used"]) // npre
    assert per_object >= MIB, (s0, s1)
    conns = s1["connections"]

    name = f"kvshm-child-{os.getpid()}"
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD, d.unix_path, name, str(PATTERN_SEED), str(size),
         str(nsrc), str(npre)],
        stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        ready, _, _ = select.select([child.stdout], [], [], 20)
        assert ready, "the child did not send its requests within 20 s"
        line = child.stdout.readline()
        # Kill while the daemon holds reservations for the put (bounded wait for one).
        deadline = time.monotonic() + 2
        held = 0
        while time.monotonic() < deadline and child.poll() is None:
            held = t.call("stats")["reserved"]
            if held:
                break
        child.kill()
        print(f"killed the client while {held} reservations were held for its puts")
        child.wait(10)
        assert line.startswith(b"sent"), \
            f"child failed: {line!r} {child.stderr.read().decode(errors='replace')}"
    finally:
        if child.poll() is None:
            child.kill()
            child.wait(10)
        child.stdout.close()
        child.stderr.close()

    # The daemon is up and serves other connections.
    assert t.call("ping") == "pong"
    d.assert_alive()
    # Everything the dead connection had is let go of.
    wait_for(lambda: t.call("stats")["connections"] == conns, 10,
             "the killed client's connection to be closed")
    wait_for(lambda: t.call("stats")["reserved"] == 0, 10,
             lambda: f"reservations to drain (reserved = {t.call('stats')['reserved']})")
    wait_for(lambda: memfd_refs(d.pid, name) == (0, 0), 10,
             lambda: f"kvstashd to release the dead client's memfd "
             f"(maps, fds = {memfd_refs(d.pid, name)})")

    # Each key of the killed puts is absent or whole and exact.
    expect = {}
    for j in range(nsrc):
        expect[f"kill-a-{j:03d}".encode()] = pattern(j)
    for j in range(nsrc - 1):
        expect[f"kill-b-{j:03d}".encode()] = \
            bytes(pattern(j)[MIB // 2:]) + bytes(pattern(j + 1)[:MIB // 2])
    keys = list(expect)
    sizes = t.call("batch_get_size", keys)
    half = {k.decode(): s for k, s in zip(keys, sizes) if s not in (None, MIB)}
    assert not half, f"half-visible objects (key: size): {half}"
    present = [k for k, s in zip(keys, sizes) if s == MIB]
    print(f"{len(present)} of {len(keys)} keys of the killed client's puts were stored")
    s2 = t.call("stats")
    assert s2["objects"] == npre + len(present), s2
    assert s2["memory_used"] == s1["memory_used"] + len(present) * per_object, \
        (s1["memory_used"], s2["memory_used"], len(present), per_object)

    u = d.unix()
    check = bufs(64 * MIB)
    cid = register_ok(u, check)
    for i in range(0, len(present), 64):
        chunk = present[i:i + 64]
        res = get_into(u, chunk, [[[cid, j * MIB, MIB]] for j in range(len(chunk))])
        assert res == [MIB] * len(chunk), dict(zip(chunk, res))
        for j, k in enumerate(chunk):
            assert_same(check.mv[j * MIB:(j + 1) * MIB], expect[k], f"{k} after the kill")
    for k in present[:2]:
        assert t.call("get", k) == expect[k], f"{k}: get after the kill"
    res = get_into(u, pre, [[[cid, j * MIB, MIB]] for j in range(npre)])
    assert res == [MIB] * npre, res
    for j in range(npre):
        assert_same(check.mv[j * MIB:(j + 1) * MIB], pre_vals[j], f"{pre[j]} after the kill")

    # Nothing is left busy: everything can be removed, and the memory comes back.
    codes = t.call("batch_remove", present + pre)
    busy = {k.decode(): c for k, c in zip(present + pre, codes) if c != 0}
    assert not busy, f"objects not removable after the kill: {busy}"
    s3 = t.call("stats")
    assert s3["objects"] == 0 and s3["reserved"] == 0, s3
    assert s3["memory_used"] == s0["memory_used"], (s0["memory_used"], s3["memory_used"])
    d.stop()


# ---------------------------------------------------------------------------------------
# 7. A 1 GiB batch_get_into does not stall another client.
#
# The copy runs on the copy threads, not on the event loop, so the loop keeps answering
# other connections meanwhile. What is checked is order, not time: the copy's progress is
# visible in the client's buffer (each MiB slot's last byte turns from the fill byte into
# its value's), and a probe that was sent after the copy had begun and answered before it
# had ended was served mid-copy. A loop that did the memcpy itself answers none of those.
# With one event loop the prober and the transfer share it.

BIG_KEYS = 1024
PROBE_MAX = 200_000
FILL = 0x77
MID_COPY_MIN = 10   # probes served mid-copy; an unloaded run serves hundreds


class Prober(threading.Thread):
    """Alternates ping and batch_is_exist on its own connection; for each probe, how many
    slots of the transfer's buffer held their value just before it was sent and just after
    its reply came (see copied)."""

    def __init__(self, path, present, copied):
        super().__init__(daemon=True)
        self.path, self.present, self.copied = path, present, copied
        self.samples = []           # (slots copied before, slots copied after)
        self.stopping = threading.Event()
        self.error = None

    def run(self):
        try:
            c = Client.unix(self.path)
        except OSError as e:
            self.error = repr(e)
            return
        probe = [*self.present, b"shm-big-missing"]
        want = [True] * len(self.present) + [False]
        try:
            for i in range(PROBE_MAX):
                if self.stopping.is_set():
                    break
                before = self.copied()
                if i % 2:
                    ok = c.call("ping") == "pong"
                else:
                    ok = c.call("batch_is_exist", probe) == want
                self.samples.append((before, self.copied()))
                if not ok:
                    self.error = f"probe {i} answered wrongly"
                    break
        except Exception as e:      # reported by the test
            self.error = repr(e)
        finally:
            c.close()


def test_big_get_into_does_not_stall_other_clients(kv, bufs):
    d = kv("--memory_size=2g", "--ssd_dir=", "--io_threads=1")
    c = d.unix()
    size = BIG_KEYS * MIB
    buf = bufs(size)
    for j in range(BIG_KEYS):
        buf.write(j * MIB, pattern(j % 256))
    bid = register_ok(c, buf)
    keys = [f"shm-big-{j:04d}".encode() for j in range(BIG_KEYS)]
    for i in range(0, BIG_KEYS, 128):
        assert put_from(c, keys[i:i + 128], [[[bid, j * MIB, MIB]] for j in range(i, i + 128)]) \
            == [OK] * 128
    buf.fill(FILL)
    t = d.tcp()
    wait_for(lambda: (lambda s: s["memory_prefaulted"] >= s["memory_capacity"])(t.call("stats")),
             30, "the arena to be prefaulted")

    # Progress marks: the last byte of every slot whose value does not end in FILL.
    last = [pattern(j % 256)[-1] for j in range(BIG_KEYS)]
    marks = [j for j in range(BIG_KEYS) if last[j] != FILL]
    ends = buf.mv[MIB - 1::MIB]

    def copied():
        now = bytes(ends)
        return sum(1 for j in marks if now[j] == last[j])

    assert copied() == 0
    prober = Prober(d.unix_path, keys[:3], copied)
    prober.start()
    wait_for(lambda: len(prober.samples) >= 50 or not prober.is_alive(), 10,
             "the prober to get going")
    iov = [[[bid, j * MIB, MIB]] for j in range(BIG_KEYS)]
    res = c.call("batch_get_into", keys, iov)
    prober.stopping.set()
    prober.join(15)
    assert not prober.is_alive(), "the prober is stuck"
    assert prober.error is None, prober.error
    assert res == [MIB] * BIG_KEYS, res
    assert copied() == len(marks)

    mid = sum(1 for b, a in prober.samples if b > 0 and a < len(marks))
    summary = (f"{len(prober.samples)} probes on another connection; {mid} of them sent after "
               f"the 1 GiB batch_get_into's copy had begun and answered before it had ended")
    print(summary)
    assert mid >= MID_COPY_MIN, summary

    for j in range(BIG_KEYS):
        assert_same(buf.mv[j * MIB:(j + 1) * MIB], pattern(j % 256), f"{keys[j]} in the buffer")
    ends.release()
    d.stop()


# ---------------------------------------------------------------------------------------
# 8. Objects on the SSD tier come back through batch_get_into.


def test_objects_evicted_to_ssd_come_back_through_get_into(kv, bufs):
    d = kv("--memory_size=8m", "--ssd_bucket_size=16m")
    c = d.unix()
    n = 32
    src = bufs(n * MIB + 8 * MIB)
    for j in range(n):
        src.write(j * MIB, pattern(j))
    dst_off = n * MIB
    src.fill(0x42, dst_off, 8 * MIB)
    bid = register_ok(c, src)
    keys = [f"shm-ssd-{j:02d}".encode() for j in range(n)]
    for j in range(n):      # one key per batch (batches: see the next test)
        assert put_from(c, [keys[j]], [[[bid, j * MIB, MIB]]]) == [OK], \
            f"batch_put_from of {keys[j]}"
    s0 = c.call("stats")
    assert s0["objects"] == n, s0
    assert s0["dram_objects"] < n, s0

    # The earliest keys left DRAM long ago: they are read back from the SSD, in pieces.
    for first in (0, 4):
        ks = keys[first:first + 4]
        iovs = [[[bid, dst_off + j * MIB, 1000], [bid, dst_off + j * MIB + 1000, MIB - 1000]]
                for j in range(4)]
        res = get_into(c, ks, iovs)
        assert res == [MIB] * 4, dict(zip(ks, res))
        for j in range(4):
            assert_same(src.mv[dst_off + j * MIB:dst_off + (j + 1) * MIB], pattern(first + j),
                        f"{ks[j]} read back from the SSD tier")
        src.fill(0x42, dst_off, 8 * MIB)
    s1 = c.call("stats")
    assert s1["ssd_hits"] >= s0["ssd_hits"] + 8, (s0["ssd_hits"], s1["ssd_hits"])
    assert s1["ssd_checksum_errors"] == 0 and s1["ssd_io_errors"] == 0, s1
    # The sources were left alone throughout.
    for j in range(n):
        assert_same(src.mv[j * MIB:(j + 1) * MIB], pattern(j), f"source of {keys[j]}")
    d.stop()


def objects_mostly_on_ssd(c, bufs, prefix, n, spare):
    """n objects of 1 MiB (pattern(j)) put from a registered buffer of n MiB + spare bytes,
    written to the SSD tier with most of them gone from DRAM. Returns (buffer, its id,
    keys, stats after the writes)."""
    src = bufs(n * MIB + spare)
    for j in range(n):
        src.write(j * MIB, pattern(j))
    bid = register_ok(c, src)
    keys = [f"{prefix}-{j:02d}".encode() for j in range(n)]
    for j in range(n):
        assert put_from(c, [keys[j]], [[[bid, j * MIB, MIB]]]) == [OK]
    wait_for(lambda: c.call("stats")["ssd_offload_queue"] == 0, 10, "the SSD writes")
    s0 = c.call("stats")
    assert s0["dram_objects"] < n - 8, s0
    return src, bid, keys, s0


def test_ssd_objects_go_straight_into_aligned_pieces(kv, bufs, work):
    from test_ssd import bucket_files, flip_byte, walk_records

    d = kv("--memory_size=8m", "--ssd_bucket_size=16m")
    c = d.unix()
    n = 24
    src, bid, keys, s0 = objects_mostly_on_ssd(c, bufs, "direct", n, 8 * MIB)
    dst = n * MIB
    # 4 KiB-aligned pieces: the value goes from the disk into them, not through DRAM.
    ks = keys[:4]
    iovs = [[[bid, dst + j * MIB, 256 * KIB], [bid, dst + j * MIB + 256 * KIB, MIB - 256 * KIB]]
            for j in range(4)]
    src.fill(0x42, dst, 8 * MIB)
    assert get_into(c, ks, iovs) == [MIB] * 4
    for j in range(4):
        assert_same(src.mv[dst + j * MIB:dst + (j + 1) * MIB], pattern(j), f"{ks[j]} via O_DIRECT")
    s1 = c.call("stats")
    assert s1["ssd_direct_reads"] == s0["ssd_direct_reads"] + 4, (s0, s1)
    assert s1["ssd_hits"] == s0["ssd_hits"] + 4
    # each of the four lookups counted once, as the SSD tier's hit
    assert (s1["hits_ssd"] - s0["hits_ssd"], s1["hits_dram"] - s0["hits_dram"],
            s1["misses"] - s0["misses"]) == (4, 0, 0), (s0, s1)
    # They were not loaded into DRAM: reading them again is again a direct read.
    assert get_into(c, ks, iovs) == [MIB] * 4
    assert c.call("stats")["ssd_direct_reads"] == s0["ssd_direct_reads"] + 8
    # Unaligned pieces go the other way: loaded into DRAM, then copied.
    odd = [[[bid, dst + 1000, MIB]]]
    assert get_into(c, [keys[4]], odd) == [MIB]
    assert_same(src.mv[dst + 1000:dst + 1000 + MIB], pattern(4), "unaligned piece")
    assert c.call("stats")["ssd_direct_reads"] == s0["ssd_direct_reads"] + 8
    d.stop()

    # A corrupt copy read straight into a client's pieces is a miss and is dropped.
    ssd_dir = os.path.join(d.data_dir, "ssd")
    victim = keys[5]
    for path in bucket_files(ssd_dir):
        for key, voff, vlen in walk_records(path):
            if key == victim:
                flip_byte(path, voff + 12345, 0x5A)
    d2 = Daemon(work, ("--memory_size=8m", "--ssd_bucket_size=16m"), data_dir=d.data_dir)
    try:
        d2.wait_ready()
        c2 = d2.unix()
        bid2 = register_ok(c2, src)
        res = get_into(c2, [victim, keys[6]], [[[bid2, dst, MIB]], [[bid2, dst + MIB, MIB]]])
        assert res == [-NOT_FOUND, MIB], res
        assert_same(src.mv[dst + MIB:dst + 2 * MIB], pattern(6), f"{keys[6]} after restart")
        s = c2.call("stats")
        assert s["ssd_checksum_errors"] == 1 and s["ssd_direct_reads"] == 1, s
        assert c2.call("get_size", victim) is None, "a corrupt copy stayed indexed"
    finally:
        d2.reap()


def test_batch_put_from_waits_for_room_like_batch_put(kv, bufs):
    """With an SSD tier, a put whose room is being freed by writes to the SSD waits for
    it; batch_put_from answers "as batch_put", so multi-key batches must not get 4."""
    d = kv("--memory_size=8m", "--ssd_bucket_size=16m")
    c = d.unix()
    n, per = 96, 3
    src = bufs(n * MIB)
    for j in range(n):
        src.write(j * MIB, pattern(j))
    bid = register_ok(c, src)
    keys = [f"shm-room-{j:02d}".encode() for j in range(n)]
    refused = {}
    for i in range(0, n, per):
        codes = put_from(c, keys[i:i + per], [[[bid, j * MIB, MIB]] for j in range(i, i + per)])
        refused.update({keys[i + j].decode(): code for j, code in enumerate(codes) if code != OK})
    s = c.call("stats")
    assert not refused, \
        f"{len(refused)} of {n} keys put in batches of {per} x 1 MiB with memory_size 8m and " \
        f"an SSD tier were refused (stats no_space {s['no_space']}): {refused}"
    assert s["objects"] == n, s
    for j in (0, 1, n // 2, n - 1):
        assert c.call("get", keys[j]) == pattern(j), keys[j]
    d.stop()


def test_durable_put_from_is_on_ssd_when_answered(kv, bufs, work):
    # ssd_offload off: only durable puts reach the SSD, so only they survive kill -9.
    args = ("--memory_size=64m", "--ssd_offload=off")
    d = kv(*args)
    c = d.unix()
    src = bufs(4 * MIB)
    for j in range(4):
        src.write(j * MIB, pattern(j))
    bid = register_ok(c, src)
    keys = [f"dur-{j}".encode() for j in range(4)]
    iovs = [[[bid, j * MIB, MIB]] for j in range(4)]
    assert put_from(c, keys[:2], iovs[:2], {"durable": True}) == [OK, OK]
    assert put_from(c, keys[2:], iovs[2:]) == [OK, OK]
    d.kill9()
    d2 = Daemon(work, args, data_dir=d.data_dir)
    try:
        d2.wait_ready()
        c2 = d2.unix()
        for j in range(2):
            got = c2.call("get", keys[j])
            assert got is not None, f"{keys[j]}: a durable put_from was lost by kill -9"
            assert_same(got, pattern(j), f"{keys[j]} after kill -9")
        # The others were only in DRAM (nothing made them durable): they are gone.
        assert c2.call("batch_is_exist", keys[2:]) == [False, False]
    finally:
        d2.reap()
    # Without an SSD tier durable cannot be promised: refused, nothing stored.
    d3 = kv("--memory_size=16m", "--ssd_dir=")
    c3 = d3.unix()
    bid3 = register_ok(c3, src)
    err, _ = c3.call_raw("batch_put_from", [b"x"], [[[bid3, 0, 10]]], {"durable": True})
    assert err is not None and err[0] == UNSUPPORTED, err
    assert c3.call("get", b"x") is None


def test_pipelined_transfers_answer_in_order(kv, bufs):
    """batch_get_into requests sent back to back run together; every reply still comes in
    request order, and a request of any other kind (a put, a put_from) waits for them, so
    a read sent after a write sees it."""
    d = kv("--memory_size=64m", "--ssd_dir=")
    c = d.unix()
    src = bufs(24 * MIB)
    for j in range(8):
        src.write(j * MIB, pattern(j))
    bid = register_ok(c, src)
    keys = [f"pipe-{j}".encode() for j in range(8)]
    assert put_from(c, keys, [[[bid, j * MIB, MIB]] for j in range(8)]) == [OK] * 8
    out = 8 * MIB
    reqs = []
    for j in range(6):      # six get_into of 2 keys each, then a write and reads of it
        ks = [keys[j], keys[(j + 3) % 8]]
        reqs.append(("batch_get_into", [ks, [[[bid, out + (2 * j) * MIB, MIB]],
                                             [[bid, out + (2 * j + 1) * MIB, MIB]]]]))
    reqs.append(("batch_put_from", [[b"pipe-new"], [[[bid, 0, 4096]]]]))
    reqs.append(("batch_get_into", [[b"pipe-new"], [[[bid, 20 * MIB, 4096]]]]))
    reqs.append(("ping", []))
    reqs.append(("get_size", [b"pipe-new"]))
    data = b""
    ids = []
    for m, p in reqs:
        msgid, raw = c.request(m, p)
        ids.append(msgid)
        data += raw
    c.sock.sendall(data)
    got = [c.recv() for _ in reqs]
    assert [g[1] for g in got] == ids, "replies out of request order"
    for g in got:
        assert g[2] is None, g
    for j in range(6):
        assert got[j][3] == [MIB, MIB]
        assert_same(src.mv[out + 2 * j * MIB:out + (2 * j + 1) * MIB], pattern(j), f"get {j}")
        assert_same(src.mv[out + (2 * j + 1) * MIB:out + (2 * j + 2) * MIB],
                    pattern((j + 3) % 8), f"get {j}, second key")
    assert got[6][3] == [OK]
    assert got[7][3] == [4096], "a get_into sent after a put_from did not see it"
    assert_same(src.mv[20 * MIB:20 * MIB + 4096], pattern(0)[:4096], "read after write")
    assert got[8][3] == "pong" and got[9][3] == 4096
    d.assert_alive()


# ---------------------------------------------------------------------------------------
# 8. Buffers not sealed against shrinking: accepted and guarded.


class Pool:
    """Shared memory that can never be sealed, as SGLang's shm host pool makes it (a memfd
    with MFD_CLOEXEC alone), or a /dev/shm file (path given). Our own view of it must not
    be touched past `alive` bytes once the file was cut (we would fault, not the daemon)."""

    seq = 0

    def __init__(self, size, path=None):
        Pool.seq += 1
        self.name = f"kvshm-pool-{os.getpid()}-{Pool.seq}"
        self.size = self.alive = size
        if path is None:
            self.fd = os.memfd_create(self.name, os.MFD_CLOEXEC)
        else:
            self.fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
            os.unlink(path)
        os.ftruncate(self.fd, size)
        self.mm = mmap.mmap(self.fd, size)
        self.mv = memoryview(self.mm)

    def cut(self, size):
        os.ftruncate(self.fd, size)
        self.alive = min(self.alive, size)

    def close(self):
        try:
            self.mv.release()
            self.mm.close()
        except BufferError:
            pass
        os.close(self.fd)


@pytest.fixture
def pools():
    made = []

    def make(size, **kw):
        p = Pool(size, **kw)
        made.append(p)
        return p

    yield make
    for p in made:
        p.close()


def send(c, method, *params):
    """Send a request without waiting; its msgid."""
    msgid, data = c.request(method, params)
    c.sock.sendall(data)
    return msgid


def reply(c, msgid):
    msg = c.recv()
    assert isinstance(msg, list) and len(msg) == 4 and msg[1] == msgid, msg
    assert msg[2] is None, msg
    return msg[3]


def test_unsealed_buffers_are_accepted_and_guarded(kv, pools):
    d = kv("--memory_size=64m", "--ssd_dir=")
    c = d.unix()
    t = d.tcp()
    kinds = [("an unsealable memfd", pools(4 * MIB))]
    if os.path.isdir("/dev/shm") and on_tmpfs("/dev/shm"):
        kinds.append(("a /dev/shm file", pools(4 * MIB, path=f"/dev/shm/kvshm-test-{os.getpid()}")))
    for what, p in kinds:
        err, bid = register(c, p.fd, p.size)
        assert err is None, f"register_buffer of {what}: {err}"
        p.mv[:MIB] = pattern(1)
        keys = [f"{what}-{j}".encode() for j in range(4)]
        assert put_from(c, keys[:1], [[[bid, 0, MIB]]]) == [OK], what
        assert get_into(c, keys[:1], [[[bid, MIB, MIB]]]) == [MIB], what
        assert_same(p.mv[MIB:2 * MIB], pattern(1), f"round trip through {what}")
        # The client cuts it: a put from the lost pages fails, all of it, and stores nothing.
        p.mv[:MIB] = pattern(2)
        p.cut(2 * MIB)
        codes = put_from(c, keys[1:], [[[bid, j * MIB, MIB]] for j in range(3)])
        assert codes == [UNAVAILABLE] * 3, f"{what}: {codes}"
        assert t.call("batch_get", keys[1:]) == [None] * 3, f"{what}: a partial put was stored"
        # The buffer is gone: naming it fails the key as any unknown buffer does.
        assert put_from(c, keys[1:2], [[[bid, 0, 16]]]) == [INVALID_ARGUMENT], what
        assert get_into(c, keys[:1], [[[bid, 0, 16]]]) == [-INVALID_ARGUMENT], what
        assert c.call("ping") == "pong"
        if what.endswith("memfd"):
            wait_for(lambda: memfd_refs(d.pid, p.name)[0] == 0, 5,
                     f"kvstashd to unmap the dropped {what}")
    assert "shrank" in d.output(), "the dropped buffer was not logged"
    d.assert_alive()


def test_shrinking_client_fails_only_its_own_transfers(kv, bufs, pools):
    """A client cuts its unsealed memfd in the middle of batch_put_from and batch_get_into
    of 64 x 1 MiB, round after round, while another client does verified round trips on
    its own sealed buffer: the daemon stays up, the cut transfers fail or succeed whole
    (never wrong bytes), nothing partial is stored, the other client never sees an error."""
    n = 64
    d = kv("--memory_size=640m", "--ssd_dir=")
    t = d.tcp()
    gkeys = [f"cut-get-{j}".encode() for j in range(n)]
    seed = bufs(n * MIB)
    cs = d.unix()
    sbid = register_ok(cs, seed)
    for j in range(n):
        seed.write(j * MIB, pattern(j))
    assert put_from(cs, gkeys, [[[sbid, j * MIB, MIB]] for j in range(n)]) == [OK] * n

    stop = threading.Event()
    other = {"rounds": 0, "error": None}

    def bystander():
        c = Client.unix(d.unix_path)
        b = ShmBuffer(16 * MIB)
        try:
            bid = register_ok(c, b)
            for r in range(100000):
                if stop.is_set():
                    break
                ks = [f"other-{r}-{j}".encode() for j in range(8)]
                for j in range(8):
                    b.write(j * MIB, pattern(r + j))
                codes = put_from(c, ks, [[[bid, j * MIB, MIB]] for j in range(8)])
                assert codes == [OK] * 8, f"round {r}: put_from answered {codes}"
                b.fill(0, 8 * MIB, 8 * MIB)
                res = get_into(c, ks, [[[bid, (8 + j) * MIB, MIB]] for j in range(8)])
                assert res == [MIB] * 8, f"round {r}: get_into answered {res}"
                for j in range(8):
                    assert same(b.mv[(8 + j) * MIB:(9 + j) * MIB], pattern(r + j)), \
                        f"round {r}: key {j} came back wrong"
                assert c.call("batch_remove", ks) == [OK] * 8
                other["rounds"] += 1
        except BaseException as e:     # reported by the main thread
            other["error"] = e
        finally:
            c.close()
            b.close()

    th = threading.Thread(target=bystander, daemon=True)
    th.start()
    rng = random.Random(18)
    failed = {"put": 0, "get": 0}
    ok = {"put": 0, "get": 0}
    deadline = time.monotonic() + 60
    try:
        for rnd in range(30):
            if time.monotonic() > deadline:
                break
            put = rnd % 2 == 0
            c = Client.unix(d.unix_path)
            p = Pool(n * MIB)
            cut = n * MIB // 2 if rnd % 4 < 2 else 0
            try:
                err, bid = register(c, p.fd, p.size)
                assert err is None, err
                keys = [f"cut-put-{rnd}-{j}".encode() for j in range(n)]
                if put:
                    for j in range(n):
                        p.mv[j * MIB:(j + 1) * MIB] = pattern(rnd + j)
                    req = ("batch_put_from", keys, [[[bid, j * MIB, MIB]] for j in range(n)])
                else:
                    p.mv[:n * MIB // 2] = b"\xee" * (n * MIB // 2)
                    req = ("batch_get_into", gkeys, [[[bid, j * MIB, MIB]] for j in range(n)])
                # The first round of each kind cuts before sending: that one must fail; the
                # others cut somewhere in the middle of the transfer, or after its end.
                if rnd < 2:
                    p.cut(cut)
                msgid = send(c, *req)
                if rnd >= 2:
                    time.sleep(rng.uniform(0, 0.08))
                    p.cut(cut)
                res = reply(c, msgid)
                assert isinstance(res, list) and len(res) == n, res
                kind = "put" if put else "get"
                if put:
                    assert set(res) <= {OK, UNAVAILABLE}, f"round {rnd}: {res}"
                    stored = t.call("batch_get", keys)
                    for j in range(n):
                        if res[j] == OK:
                            assert stored[j] is not None and same(stored[j], pattern(rnd + j)), \
                                f"round {rnd}: {keys[j]} stored wrong bytes"
                        else:
                            assert stored[j] is None, f"round {rnd}: a failed key was stored"
                    assert t.call("batch_remove", keys) == [OK if r == OK else NOT_FOUND
                                                            for r in res]
                    expect = [OK] * n
                else:
                    assert set(res) <= {MIB, -UNAVAILABLE}, f"round {rnd}: {res}"
                    for j in range(n):
                        if res[j] == MIB and (j + 1) * MIB <= p.alive:
                            assert same(p.mv[j * MIB:(j + 1) * MIB], pattern(j)), \
                                f"round {rnd}: {gkeys[j]} reported read but holds wrong bytes"
                    expect = [MIB] * n
                if UNAVAILABLE in res or -UNAVAILABLE in res:
                    failed[kind] += 1
                    # a transfer fails whole: the buffer is one, and it is dropped
                    assert set(res) == {UNAVAILABLE if put else -UNAVAILABLE}, res
                    assert get_into(c, gkeys[:1], [[[bid, 0, 16]]]) == [-INVALID_ARGUMENT]
                else:
                    ok[kind] += 1
                    assert res == expect, res
                if rnd < 2:
                    assert res != expect, f"round {rnd}: a transfer from a cut buffer succeeded"
                assert c.call("ping") == "pong"
                d.assert_alive()
            finally:
                c.close()
                p.close()
            assert other["error"] is None, f"the other client noticed: {other['error']!r}"
    finally:
        stop.set()
        th.join(30)
    assert not th.is_alive(), "the other client hung"
    assert other["error"] is None, f"the other client noticed: {other['error']!r}"
    assert other["rounds"] > 0, "the other client made no round trip"
    assert failed["put"] >= 1 and failed["get"] >= 1, (failed, ok)
    # Every get key is still whole.
    got = t.call("batch_get", gkeys)
    for j in range(n):
        assert got[j] is not None and same(got[j], pattern(j)), f"{gkeys[j]} changed"
    print(f"cut transfers failed {failed}, succeeded {ok}; other client {other['rounds']} rounds")
    d.assert_alive()


def test_direct_ssd_read_into_a_cut_buffer_fails_the_transfer_not_the_disk(kv, bufs, pools):
    d = kv("--memory_size=8m", "--ssd_bucket_size=16m")
    c = d.unix()
    n = 24
    src, bid, keys, s0 = objects_mostly_on_ssd(c, bufs, "direct-cut", n, 4 * MIB)
    p = pools(4 * MIB)
    err, pbid = register(c, p.fd, p.size)
    assert err is None, err
    p.cut(0)
    # 4 KiB-aligned pieces: the daemon reads the SSD straight into them and finds them gone
    res = get_into(c, keys[:4], [[[pbid, j * MIB, MIB]] for j in range(4)])
    assert res == [-UNAVAILABLE] * 4, res
    s1 = c.call("stats")
    assert s1["ssd_reads"] == s0["ssd_reads"] + 4 and s1["ssd_hits"] == s0["ssd_hits"], (s0, s1)
    assert s1["ssd_io_errors"] == s0["ssd_io_errors"], "a client's cut buffer counted as a disk error"
    assert s1["ssd_checksum_errors"] == s0["ssd_checksum_errors"]
    # The copies on the disk are fine and stay: the sealed buffer reads them.
    dst = n * MIB
    assert get_into(c, keys[:4], [[[bid, dst + j * MIB, MIB]] for j in range(4)]) == [MIB] * 4
    for j in range(4):
        assert_same(src.mv[dst + j * MIB:dst + (j + 1) * MIB], pattern(j), f"{keys[j]} after")
    d.assert_alive()
