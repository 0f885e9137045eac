"""Integration: the Python package kvstash (client/python) against the real daemon.

The package is imported from the tree (client/python is put on sys.path here), so this
runs from a clean clone. Each test starts kvstashd through the harness (kvtest.Daemon,
the daemons fixture) and checks what a user of the package relies on: every method
round-trips byte-exact over TCP and the Unix socket (and TLS); errors carry the wire code
and name and leave the connection usable; batches of 1,000 keys split into pipelined
requests come back whole and in order; 1 MiB and 32 MiB values; registered buffers move
values with no copy when the memory is a registered memfd (the package's own buffer, an
mmap of the caller's memfd, a numpy array over it) and through the staging buffer
otherwise (bytearray, plain numpy), with the same bytes either way; a bad piece is refused
before anything is sent; a descriptor the daemon cannot take is a clear Error; a daemon
killed or stopped mid-session gives ConnectionLost, never a hang. No wall-clock bounds
are asserted: the timeouts below only turn a hang into a failure.
"""

import hashlib
import mmap
import os
import pathlib
import random
import signal
import subprocess
import sys
import threading

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "client" / "python"))

import kvstash  # noqa: E402  (after the path is set)
from kvtest import stop_process  # noqa: E402

KIB = 1 << 10
MIB = 1 << 20
BASE_ARGS = ["--memory_size=256m", "--ssd_dir="]


def rnd(n, seed):
    return random.Random(seed).randbytes(n)


@pytest.fixture
def kv(daemons):
    """kv(*args): a ready daemon with BASE_ARGS and args (later ones win)."""
    return lambda *args: daemons([*BASE_ARGS, *args])


@pytest.fixture
def clients():
    """clients(addr, **kw): a kvstash.Client, closed at teardown."""
    made = []

    def make(addr, **kw):
        kw.setdefault("timeout", 20.0)
        c = kvstash.Client(addr, **kw)
        made.append(c)
        return c

    yield make
    for c in made:
        c.close()


def tcp_addr(d):
    return f"127.0.0.1:{d.port}"


def unix_addr(d):
    return f"unix:{d.unix_path}"


# ---------------------------------------------------------------------------------------
# Every method, byte-exact.

@pytest.mark.parametrize("transport", ["tcp", "unix"])
def test_every_method_round_trips(kv, clients, transport):
    d = kv()
    c = clients(tcp_addr(d) if transport == "tcp" else d.unix_path)
    assert c.ping() == "pong"
    info = c.hello()
    assert info["server"] == "kvstashd" and info["protocol"] == 1
    assert info["max_batch"] == c.server_info["max_batch"]

    v = rnd(5000, 1)
    assert c.put(b"k", v) is None
    assert c.get(b"k") == v
    assert c.get("k") == v, "a str key names the same object as bin with the same bytes"
    assert c.put(b"empty", b"") is None and c.get(b"empty") == b""
    assert c.is_exist(b"k") and not c.is_exist(b"nope")
    assert c.get_size(b"k") == 5000
    assert c.get(b"nope", None) is None and c.get_size(b"nope", -1) == -1

    keys = [b"b%d" % i for i in range(10)]
    vals = [rnd(i * 37, i) for i in range(10)]
    assert c.batch_put(keys, vals) == [kvstash.OK] * 10
    assert c.batch_put(keys[:2], vals[:2]) == [kvstash.EXISTS] * 2
    assert c.batch_get(keys + [b"nope"]) == vals + [None]
    assert c.batch_is_exist([b"b0", b"nope", b"b9"]) == [True, False, True]
    assert c.batch_get_size([b"b3", b"nope"]) == [3 * 37, None]
    assert c.prefix_match([b"b0", b"b1", b"nope", b"b2"]) == 2
    assert c.prefix_match([b"b0", b"b1", b"b2", b"nope"], group_size=2) == 1

    assert c.pin([b"b0", b"nope"], "hard") == [kvstash.OK, kvstash.NOT_FOUND]
    assert c.stats()["pinned_hard"] == 1
    assert c.unpin([b"b0", b"nope"]) == [kvstash.OK, kvstash.NOT_FOUND]
    assert c.pin([b"b1"]) == [kvstash.OK] and c.stats()["pinned_soft"] == 1

    assert c.remove(b"b5") is None and not c.is_exist(b"b5")
    assert c.batch_remove([b"b6", b"b6", b"nope"]) == [kvstash.OK, kvstash.NOT_FOUND,
                                                       kvstash.NOT_FOUND]
    st = c.stats()
    assert st["objects"] == 2 + 10 - 2 and st["ops.put"] >= 2
    assert c.remove_all() == 10
    assert c.batch_is_exist(keys) == [False] * 10
    assert c.batch_get([]) == [] and c.batch_put([], []) == []
    # the generic escape hatch
    assert c.call("ping") == "pong"


def test_errors_carry_the_wire_code_and_name(kv, clients):
    d = kv("--max_value_size=1m", "--max_key_size=64")
    c = clients(tcp_addr(d))
    c.put(b"k", b"v")

    def err(fn, *a, **kw):
        with pytest.raises(kvstash.Error) as ei:
            fn(*a, **kw)
        e = ei.value
        assert not isinstance(e, kvstash.ConnectionLost), e
        assert kvstash.code_name(e.code) == e.name and e.message, e
        return e

    # a missing key
    for fn in (c.get, c.get_size, c.remove):
        e = err(fn, b"missing")
        assert (e.code, e.name) == (kvstash.NOT_FOUND, "NOT_FOUND")
    # write-once
    e = err(c.put, b"k", b"again")
    assert (e.code, e.name) == (kvstash.EXISTS, "EXISTS")
    # a value over max_value_size, a key over max_key_size (the daemon's answer)
    e = err(c.put, b"big", bytes(MIB + 1))
    assert (e.code, e.name) == (kvstash.TOO_LARGE, "TOO_LARGE")
    e = err(c.put, b"x" * 65, b"v")
    assert e.code == kvstash.TOO_LARGE
    assert c.batch_put([b"ok", b"big"], [b"v", bytes(MIB + 1)]) == [kvstash.OK,
                                                                    kvstash.TOO_LARGE]
    assert c.get(b"ok") == b"v" and c.get(b"big", None) is None
    # bad arguments: request-level, straight from the daemon
    e = err(c.prefix_match, [b"a", b"b", b"c"], group_size=2)
    assert (e.code, e.name) == (kvstash.INVALID_ARGUMENT, "INVALID_ARGUMENT")
    e = err(c.call, "put", b"k2", "a str value")
    assert e.name == "INVALID_ARGUMENT"
    e = err(c.call, "frobnicate")
    assert (e.code, e.name) == (kvstash.METHOD_NOT_FOUND, "METHOD_NOT_FOUND")
    # shared memory over TCP
    e = err(c.register_buffer, 4096)
    assert e.code == kvstash.UNSUPPORTED
    # not bytes-like: refused before sending
    e = err(c.put, b"k3", 12345)
    assert e.code == kvstash.INVALID_ARGUMENT
    # none of it broke the connection
    assert c.ping() == "pong" and c.get(b"k") == b"v"


# ---------------------------------------------------------------------------------------
# Batches and sizes.

@pytest.mark.parametrize("transport", ["tcp", "unix"])
def test_pipelined_batches_of_1000_keys(kv, clients, transport):
    # max_batch 64: each batch is 16 requests, pipelined, answered in order
    d = kv("--max_batch=64")
    c = clients(tcp_addr(d) if transport == "tcp" else d.unix_path, window=4)
    assert c.server_info["max_batch"] == 64
    rng = random.Random(7)
    keys = [b"key-%04d-" % i + rng.randbytes(rng.randrange(0, 40)) for i in range(1000)]
    vals = [rng.randbytes(rng.choice((0, 1, 100, 4 * KIB, 70 * KIB))) for _ in keys]
    assert c.batch_put(keys, vals) == [kvstash.OK] * 1000
    assert c.batch_get(keys) == vals
    order = list(range(1000))
    rng.shuffle(order)
    assert c.batch_get([keys[i] for i in order]) == [vals[i] for i in order]
    assert c.batch_get_size(keys) == [len(v) for v in vals]
    assert c.batch_is_exist(keys + [b"nope"]) == [True] * 1000 + [False]
    assert c.prefix_match(keys) == 1000, "more than max_batch keys, asked in pieces"
    assert c.prefix_match(keys[:500] + [b"nope"] + keys[500:]) == 500
    assert c.prefix_match(keys, group_size=8) == 125
    assert c.pin(keys, "soft") == [kvstash.OK] * 1000
    assert c.unpin(keys) == [kvstash.OK] * 1000
    assert c.batch_remove(keys[::2]) == [kvstash.OK] * 500
    assert c.batch_get(keys) == [None if i % 2 == 0 else v for i, v in enumerate(vals)]
    assert c.ping() == "pong"


@pytest.mark.parametrize("transport", ["tcp", "unix"])
def test_1mib_and_32mib_values(kv, clients, transport):
    d = kv()
    c = clients(tcp_addr(d) if transport == "tcp" else d.unix_path)
    one, big = rnd(MIB, 11), rnd(32 * MIB, 12)
    c.put(b"one", one)
    c.put(b"big", memoryview(big))
    assert c.get(b"one") == one
    assert c.get(b"big") == big
    keys = [b"m%d" % i for i in range(24)]
    vals = [rnd(MIB, 100 + i) for i in range(24)]
    assert c.batch_put(keys, vals) == [kvstash.OK] * 24
    assert c.batch_get(keys) == vals
    assert c.batch_get_size([b"big", b"one"]) == [32 * MIB, MIB]


# ---------------------------------------------------------------------------------------
# Registered buffers.

def scatter(rng, size, n):
    cuts = sorted(rng.sample(range(1, size), n - 1))
    b = [0, *cuts, size]
    return [b[i + 1] - b[i] for i in range(n)]


def test_register_buffer_zero_copy_round_trip(kv, clients):
    d = kv()
    c = clients(unix_addr(d))
    buf = c.register_buffer(8 * MIB)
    assert buf.size == 8 * MIB and len(buf.memory) == 8 * MIB
    rng = random.Random(3)
    keys, pieces, vals, off = [], [], [], 0
    for i in range(20):
        n = rng.choice((1, 4096, 100000, 300000))
        v = rng.randbytes(n)
        buf.memory[off:off + n] = v
        parts, at = [], off
        for ln in scatter(rng, n, min(n, 3)) if n >= 3 else [n]:
            parts.append((buf, at, ln))
            at += ln
        keys.append(b"z%d" % i)
        pieces.append(parts)
        vals.append(v)
        off += n + 17
    assert c.batch_put_from(keys, pieces) == [kvstash.OK] * 20
    assert c.batch_get(keys) == vals
    # read back into the second half, through slices of the buffer's memory
    half = buf.memory[4 * MIB:]
    at, into = 0, []
    for v in vals:
        into.append((half, at, len(v) + 1))     # one byte more: tells full from cut
        at += len(v) + 1
    assert c.batch_get_into(keys + [b"nope"], into + [(half, at, 10)]) == \
        [len(v) for v in vals] + [-kvstash.NOT_FOUND]
    for (_, o, ln), v in zip(into, vals):
        assert bytes(half[o:o + ln - 1]) == v
    assert c.staged_bytes == 0 and c.zero_copy_bytes > 0
    half.release()
    c.unregister_buffer(buf)
    assert buf.closed and c.ping() == "pong"


def test_bytearray_pieces_go_through_staging_with_the_same_results(kv, clients):
    d = kv()
    c = clients(unix_addr(d), staging_size=1 * MIB)   # small: several rounds, and growth
    rng = random.Random(5)
    vals = [rng.randbytes(rng.choice((0, 10, 5000, 300000, 3 * MIB))) for _ in range(30)]
    keys = [b"s%d" % i for i in range(30)]
    src = bytearray(sum(len(v) for v in vals))
    pieces, at = [], 0
    for v in vals:
        src[at:at + len(v)] = v
        pieces.append([(src, at, len(v))] if v else [])
        at += len(v)
    assert c.batch_put_from(keys, pieces) == [kvstash.OK] * 30
    assert c.zero_copy_bytes == 0 and c.staged_bytes == len(src)
    assert c.batch_get(keys) == vals
    # into a bytearray, scattered: every byte outside the values stays as it was
    dst = bytearray(b"\xa5" * (len(src) + 30 * 16))
    into, at = [], 4
    for v in vals:
        parts = []
        for ln in (scatter(rng, len(v), 2) if len(v) >= 2 else [len(v)]):
            parts.append((dst, at, ln))
            at += ln + 3
        into.append(parts)
        at += 5
    assert c.batch_get_into(keys, into) == [len(v) for v in vals]
    for parts, v in zip(into, vals):
        assert b"".join(bytes(dst[o:o + ln]) for _, o, ln in parts) == v
    assert dst[:4] == b"\xa5" * 4
    # a bytes object is a read-only source: fine for put_from
    assert c.batch_put_from([b"ro"], [(b"read-only", 0, 9)]) == [kvstash.OK]
    assert c.get(b"ro") == b"read-only"


def test_mmap_of_a_memfd_moves_with_no_copy(kv, clients):
    d = kv()
    c = clients(unix_addr(d))
    fd = os.memfd_create("pyclient-test", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    try:
        os.ftruncate(fd, 4 * MIB)
        mm = mmap.mmap(fd, 4 * MIB)
        v = rnd(2 * MIB, 21)
        mm[MIB:3 * MIB] = v
        # not registered yet: auto registration finds the descriptor and registers it
        assert c.batch_put_from([b"mm"], [(mm, MIB, 2 * MIB)]) == [kvstash.OK]
        assert c.zero_copy_bytes == 2 * MIB and c.staged_bytes == 0
        assert c.get(b"mm") == v
        # a second mapping of the same file, at a file offset: still no copy
        mm2 = mmap.mmap(fd, 2 * MIB, offset=2 * MIB)
        mm2[:MIB] = bytes(MIB)
        assert c.batch_get_into([b"mm"], [(mm2, 0, 2 * MIB)]) == [2 * MIB]
        assert mm2[:2 * MIB] == v and c.staged_bytes == 0
        mm2.close()
        mm.close()
        # explicit registration of the caller's descriptor
        c2 = clients(unix_addr(d), auto_register=False)
        buf = c2.register_fd(fd)
        # the file's second half holds v (written by the daemon through mm2 above)
        assert buf.size == 4 * MIB and bytes(buf.memory[2 * MIB:]) == v
        assert c2.batch_put_from([b"fd"], [(buf.memory, 2 * MIB, MIB)]) == [kvstash.OK]
        assert c2.get(b"fd") == v[:MIB] and c2.staged_bytes == 0
    finally:
        os.close(fd)


def test_numpy_arrays(kv, clients):
    np = pytest.importorskip("numpy", reason="python3-numpy is not installed")
    d = kv()
    c = clients(unix_addr(d))
    buf = c.register_buffer(4 * MIB)
    shared = np.frombuffer(buf.mmap, dtype=np.float32)
    shared[:1024] = np.arange(1024, dtype=np.float32)
    assert c.batch_put_from([b"np-shared"], [(shared[:1024], 0, 4096)]) == [kvstash.OK]
    assert c.zero_copy_bytes == 4096 and c.staged_bytes == 0
    plain = np.arange(2048, dtype=np.float64)
    assert c.batch_put_from([b"np-plain"], [plain]) == [kvstash.OK]
    assert c.staged_bytes == plain.nbytes
    out = np.zeros(2048, dtype=np.float64)
    assert c.batch_get_into([b"np-plain"], [out]) == [plain.nbytes]
    assert (out == plain).all()
    assert np.frombuffer(c.get(b"np-shared"), dtype=np.float32).tolist() == list(range(1024))
    del shared


def test_a_piece_outside_its_buffer_is_refused_and_the_connection_stays(kv, clients):
    d = kv()
    c = clients(unix_addr(d))
    buf = c.register_buffer(MIB)
    buf.memory[:3] = b"abc"
    small = bytearray(100)
    for bad in [(buf, MIB - 10, 11), (buf, -1, 5), (buf.memory, MIB, 1), (small, 50, 51)]:
        for call in (c.batch_put_from, c.batch_get_into):
            with pytest.raises(kvstash.Error) as ei:
                call([b"ok", b"bad"], [(buf, 0, 3), bad])
            assert ei.value.code == kvstash.INVALID_ARGUMENT, ei.value
            assert ei.value.name == "INVALID_ARGUMENT"
    # nothing was sent: neither key exists, and the connection works
    assert c.batch_is_exist([b"ok", b"bad"]) == [False, False]
    assert c.batch_put_from([b"ok"], [(buf, 0, 3)]) == [kvstash.OK]
    assert c.get(b"ok") == b"abc"
    # a buffer unregistered, or another client's, is refused too
    other = clients(unix_addr(d)).register_buffer(4096)
    with pytest.raises(kvstash.Error) as ei:
        c.batch_put_from([b"x"], [(other, 0, 1)])
    assert ei.value.code == kvstash.INVALID_ARGUMENT
    c.unregister_buffer(buf)
    with pytest.raises(kvstash.Error) as ei:
        c.batch_get_into([b"ok"], [(buf, 0, 3)])
    assert ei.value.code == kvstash.INVALID_ARGUMENT
    assert c.ping() == "pong"


def test_unsealable_descriptors_are_registered_as_they_are(kv, clients, work):
    """A memfd without MFD_ALLOW_SEALING (SGLang's shm host pool) and a /dev/shm file
    cannot be sealed: the client registers them as they are (the daemon guards them) and
    moves bytes with no copy; a pipe is no shared memory and gets a clear error."""
    d = kv()
    c = clients(unix_addr(d))
    fd = os.memfd_create("unsealable", os.MFD_CLOEXEC)
    try:
        os.ftruncate(fd, MIB)
        buf = c.register_fd(fd)
        buf.memory[:8] = b"unsealed"
        assert c.batch_put_from([b"u"], [(buf, 0, 8)]) == [kvstash.OK]
        assert c.get(b"u") == b"unsealed" and c.staged_bytes == 0
        # the same memory named through another mapping: zero copy too
        mm = mmap.mmap(fd, MIB)
        assert c.batch_get_into([b"u"], [(mm, 4096, 8)]) == [8]
        assert mm[4096:4104] == b"unsealed" and c.staged_bytes == 0
        mm.close()
        c.unregister_buffer(buf)
    finally:
        os.close(fd)
    if os.access("/dev/shm", os.W_OK):
        path = f"/dev/shm/kvstash-pyclient-{os.getpid()}"
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            os.ftruncate(fd, MIB)
            buf = c.register_fd(fd)
            buf.memory[:5] = b"shmfs"
            assert c.batch_put_from([b"s"], [(buf, 0, 5)]) == [kvstash.OK]
            assert c.get(b"s") == b"shmfs"
            c.unregister_buffer(buf)
        finally:
            os.close(fd)
            os.unlink(path)
    r, w = os.pipe()
    try:
        with pytest.raises(kvstash.Error) as ei:
            c.register_fd(r, 4096)
        assert ei.value.code == kvstash.INVALID_ARGUMENT, ei.value
    finally:
        os.close(r)
        os.close(w)
    assert c.ping() == "pong"


def test_a_buffer_the_daemon_dropped_is_registered_again(kv, clients):
    """An engine cuts its unsealable memfd (truncate to 0) and makes it whole again (as a
    pool freed and allocated again in the same file would): the transfer that ran into the
    cut fails its key with UNAVAILABLE and the daemon drops that buffer. The client learns
    it: the next transfer there registers the file again and moves the bytes with no
    copy (it used to send the dropped id and fail with INVALID_ARGUMENT for good). A
    Buffer the caller registered explicitly is closed instead: naming it is refused."""
    d = kv()
    c = clients(unix_addr(d))
    fd = os.memfd_create("dropped", os.MFD_CLOEXEC)     # no sealing, as SGLang's pool
    try:
        os.ftruncate(fd, 4 * MIB)
        mm = mmap.mmap(fd, 4 * MIB)
        v = rnd(MIB, 41)
        mm[:MIB] = v
        assert c.batch_put_from([b"a"], [(mm, 0, MIB)]) == [kvstash.OK]
        first = c.buffer_at(mm)
        assert first is not None and not first.closed and c.staged_bytes == 0
        for direction in ("put", "get"):
            os.ftruncate(fd, 0)             # the daemon's next touch of the file faults
            if direction == "put":
                got = c.batch_put_from([b"cut"], [(mm, 0, MIB)])
                assert got == [kvstash.UNAVAILABLE], got
                assert not c.is_exist(b"cut"), "nothing partial is stored"
            else:
                got = c.batch_get_into([b"a"], [(mm, MIB, MIB)])
                assert got == [-kvstash.UNAVAILABLE], got
            assert first.closed and c.buffer_at(mm) is None, "the dropped buffer is forgotten"
            os.ftruncate(fd, 4 * MIB)       # whole again (zeroed)
            mm[:MIB] = v
            assert c.batch_put_from([b"again-" + direction.encode()],
                                    [(mm, 0, MIB)]) == [kvstash.OK]
            first = c.buffer_at(mm)
            assert first is not None and not first.closed, "registered again"
            assert c.batch_get_into([b"a"], [(mm, 2 * MIB, MIB)]) == [MIB]
            assert mm[2 * MIB:3 * MIB] == v
            assert c.get(b"again-" + direction.encode()) == v
        assert c.staged_bytes == 0, "every piece moved with no copy"
        # an explicitly registered Buffer the daemon dropped is closed, not replaced
        c2 = clients(unix_addr(d), auto_register=False)
        buf = c2.register_fd(fd)
        os.ftruncate(fd, 0)
        assert c2.batch_put_from([b"x"], [(buf, 0, 10)]) == [kvstash.UNAVAILABLE]
        assert buf.closed
        os.ftruncate(fd, 4 * MIB)
        with pytest.raises(kvstash.Error) as ei:
            c2.batch_put_from([b"x"], [(buf, 0, 10)])
        assert ei.value.code == kvstash.INVALID_ARGUMENT
        # the client's own staging buffer and the connection are untouched
        assert c2.batch_put_from([b"y"], [(bytearray(b"abc"), 0, 3)]) == [kvstash.OK]
        assert c2.get(b"y") == b"abc" and c.ping() == "pong"
        mm.close()
    finally:
        os.close(fd)


def test_map_lookups_answer_for_the_mappings_as_they_are():
    """The client's lookups of where memory lies (PROCMAP_QUERY, or the text of
    /proc/self/maps where the kernel lacks it) agree, and never answer from a mapping that
    is gone."""
    fd = os.memfd_create("lookups", os.MFD_CLOEXEC)
    try:
        os.ftruncate(fd, 2 * MIB)
        st = os.fstat(fd)
        caches = [kvstash.buffers.MapCache(), kvstash.buffers.MapCache(query=False)]
        m1 = mmap.mmap(fd, MIB)
        m2 = mmap.mmap(fd, MIB, offset=MIB)
        private = bytearray(MIB)
        for mc in caches:
            for obj, file_off in ((m1, 0), (m2, MIB)):
                a = kvstash.buffers.address_of(obj)
                for off, n in ((0, 1), (100, 4096), (MIB - 1, 1)):
                    mp = mc.view().find(a + off, n)
                    assert (mp.dev, mp.ino) == (st.st_dev, st.st_ino)
                    assert mp.offset + (a + off - mp.start) == file_off + off
                assert mc.view().find(a + MIB - 1, 2) is None, "past the mapping's end"
            assert mc.view().find(kvstash.buffers.address_of(private), 10) is None
        a = kvstash.buffers.address_of(m1)
        m1.close()
        for mc in caches:
            mp = mc.view().find(a, 1)
            assert mp is None or (mp.dev, mp.ino) != (st.st_dev, st.st_ino)
            mc.close()
        m2.close()
    finally:
        os.close(fd)


def test_direct_access_to_the_arena(kv, clients):
    d = kv()
    c = clients(unix_addr(d))
    v = rnd(300000, 31)
    places = c.put_start([b"direct", b"gone"], [len(v), 10])
    assert all(isinstance(p, list) for p in places), places
    assert sum(len(p) for p in places[0]) == len(v)
    at = 0
    for p in places[0]:
        p[:] = v[at:at + len(p)]
        at += len(p)
    assert not c.is_exist(b"direct"), "a reservation is invisible until put_end"
    assert c.put_end([b"direct"]) == [kvstash.OK]
    assert c.put_revoke([b"gone", b"never"]) == [kvstash.OK, kvstash.NOT_FOUND]
    assert c.get(b"direct") == v and not c.is_exist(b"gone")
    rl = c.get_replica_list([b"direct", b"gone"])
    assert rl[1] is None and rl[0]["size"] == len(v)
    assert b"".join(bytes(x) for x in rl[0]["views"]) == v
    del places, rl, p
    with pytest.raises(kvstash.Error) as ei:
        clients(tcp_addr(d)).put_start([b"t"], [1])
    assert ei.value.code == kvstash.UNSUPPORTED


# ---------------------------------------------------------------------------------------
# The connection: TLS, authentication, threads, failures.

def openssl(*args, cwd):
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True, timeout=60)


def test_tls(daemons, clients, work):
    pki = os.path.join(work, "pki")
    os.makedirs(pki)
    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
    openssl("req", "-x509", *ec, "-keyout", "ca.key", "-out", "ca.pem", "-days", "2",
            "-subj", "/CN=kvstash pyclient CA", cwd=pki)
    openssl("req", *ec, "-keyout", "server.key", "-out", "server.csr", "-subj",
            "/CN=127.0.0.1", cwd=pki)
    with open(os.path.join(pki, "server.ext"), "w") as f:
        f.write("subjectAltName=IP:127.0.0.1,DNS:localhost\n")
    openssl("x509", "-req", "-in", "server.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
            "-CAcreateserial", "-out", "server.pem", "-days", "2", "-extfile", "server.ext",
            cwd=pki)
    from kvtest import free_port
    port = free_port()
    daemons([*BASE_ARGS, f"--tls_listen=127.0.0.1:{port}", f"--tls_cert_file={pki}/server.pem",
             f"--tls_key_file={pki}/server.key"])
    c = clients(f"127.0.0.1:{port}", tls_ca=f"{pki}/ca.pem")
    assert "tls" in c.server_info["transports"]
    v = rnd(5 * MIB, 41)
    c.put(b"tls", v)
    assert c.get(b"tls") == v
    keys = [b"t%d" % i for i in range(1000)]
    assert c.batch_put(keys, [k * 100 for k in keys]) == [kvstash.OK] * 1000
    assert c.batch_get(keys) == [k * 100 for k in keys]
    # a certificate the CA did not sign: the handshake fails, as ConnectionLost
    with pytest.raises(kvstash.ConnectionLost):
        kvstash.Client(f"127.0.0.1:{port}", tls_ca=f"{pki}/server.pem", timeout=10)


def test_tenant_authentication_at_connect(daemons, clients, work):
    conf = os.path.join(work, "tenants.conf")
    token = "pyclient-token"
    with open(conf, "w") as f:
        f.write("require_auth yes\n"
                f"tenant alpha token_sha256={hashlib.sha256(token.encode()).hexdigest()}\n")
    d = daemons([f"--config={conf}", *BASE_ARGS])
    c = clients(tcp_addr(d), tenant="alpha", token=token)
    c.put(b"k", b"alpha's")
    assert c.get(b"k") == b"alpha's"
    with pytest.raises(kvstash.Error) as ei:
        kvstash.Client(tcp_addr(d), tenant="alpha", token="wrong", timeout=10)
    assert ei.value.code == kvstash.UNAUTHORIZED
    anon = clients(tcp_addr(d))
    with pytest.raises(kvstash.Error) as ei:
        anon.get(b"k")
    assert (ei.value.code, ei.value.name) == (kvstash.UNAUTHORIZED, "UNAUTHORIZED")


def test_one_client_shared_by_threads(kv, clients):
    d = kv()
    c = clients(unix_addr(d))
    buf = c.register_buffer(4 * MIB)
    errors = []

    def work(t):
        try:
            rng = random.Random(t)
            for i in range(30):
                keys = [b"t%d-%d-%d" % (t, i, j) for j in range(20)]
                vals = [rng.randbytes(rng.randrange(0, 20000)) for _ in keys]
                assert c.batch_put(keys, vals) == [kvstash.OK] * 20
                assert c.batch_get(keys) == vals
                own = bytearray(30000)
                assert c.batch_get_into(keys[:1], [(own, 0, 30000)]) == [len(vals[0])]
                assert own[:len(vals[0])] == vals[0]
                # each thread its own quarter of the shared buffer
                q = buf.memory[t * MIB:(t + 1) * MIB]
                q[:len(vals[1])] = vals[1]
                assert c.batch_put_from([keys[1] + b"-z"], [(q, 0, len(vals[1]))]) == [0]
                q.release()
                assert c.get(keys[1] + b"-z") == vals[1]
        except BaseException as e:     # reported below
            errors.append(e)

    threads = [threading.Thread(target=work, args=(t,)) for t in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(120)
    assert not any(th.is_alive() for th in threads), "a thread is stuck"
    assert not errors, errors


def test_context_manager_closes(kv):
    d = kv()
    with kvstash.Client(d.unix_path, timeout=10) as c:
        buf = c.register_buffer(4096)
        c.put(b"k", b"v")
    assert c.closed and buf.closed
    with pytest.raises(kvstash.ConnectionLost):
        c.ping()


def test_a_daemon_killed_mid_session_is_connection_lost(kv, clients):
    d = kv()
    c = clients(tcp_addr(d), timeout=10)
    u = clients(unix_addr(d), timeout=10)
    buf = u.register_buffer(MIB)
    c.put(b"k", b"v")
    d.kill9()
    for fn in (lambda: c.get(b"k"),
               lambda: c.batch_put([b"a%d" % i for i in range(1000)], [bytes(MIB)] * 1000),
               lambda: u.batch_put_from([b"x"], [(buf, 0, 100)])):
        with pytest.raises(kvstash.ConnectionLost) as ei:
            fn()
        e = ei.value
        assert isinstance(e, kvstash.Error) and isinstance(e, ConnectionError)
        assert e.code == kvstash.UNAVAILABLE, e
    # the client stays failed: every later call says so at once
    with pytest.raises(kvstash.ConnectionLost):
        c.ping()
    assert c.closed
    # and a new connection to nothing is refused the same way
    with pytest.raises(kvstash.ConnectionLost):
        kvstash.Client(tcp_addr(d), timeout=5)


def test_a_daemon_that_stops_answering_times_out(kv, clients):
    d = kv()
    c = clients(tcp_addr(d), timeout=1.0)
    c.put(b"k", b"v")
    stop_process(d.pid)
    try:
        with pytest.raises(kvstash.ConnectionLost) as ei:
            c.batch_put([b"a%d" % i for i in range(100)], [bytes(MIB)] * 100)
        assert (ei.value.code, ei.value.name) == (kvstash.TIMEOUT, "TIMEOUT")
        with pytest.raises(kvstash.ConnectionLost):
            c.ping()
    finally:
        os.kill(d.pid, signal.SIGCONT)
    c2 = clients(tcp_addr(d))
    assert c2.get(b"k") == b"v"


@pytest.mark.parametrize("transport", ["tcp", "unix"])
def test_a_daemon_killed_during_a_batch_is_connection_lost(kv, clients, transport):
    d = kv()
    c = clients(tcp_addr(d) if transport == "tcp" else unix_addr(d), timeout=20)
    staged = bytearray(rnd(MIB, 51))
    one_done = threading.Event()
    outcome = []

    def writer():
        try:
            for i in range(10000):      # ends by the kill below, long before this count
                keys = [b"w%d-%d" % (i, j) for j in range(64)]
                if transport == "tcp":
                    codes = c.batch_put(keys, [staged] * 64)
                else:
                    codes = c.batch_put_from(keys, [(staged, 0, MIB)] * 64)
                assert set(codes) <= {kvstash.OK, kvstash.NO_SPACE}, codes
                one_done.set()
            outcome.append("no error")
        except BaseException as e:      # checked below
            outcome.append(e)

    t = threading.Thread(target=writer)
    t.start()
    assert one_done.wait(60), f"no batch finished: {outcome}"
    d.kill9()
    t.join(60)
    assert not t.is_alive(), "the client hung after the daemon died"
    e = outcome[0]
    assert isinstance(e, kvstash.ConnectionLost), repr(e)
    assert e.code == kvstash.UNAVAILABLE and isinstance(e, ConnectionError)
