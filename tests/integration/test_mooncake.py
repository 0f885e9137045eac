"""Integration: kvstash.mooncake, Mooncake's Python store API over the real daemon.

The package is imported from the tree (client/python on sys.path), so this runs from a clean
clone. The calls below are the ones SGLang's Mooncake HiCache backend makes
(python/sglang/srt/mem_cache/storage/mooncake_store/mooncake_store.py, written here in our
own words): setup with eight positional arguments, the warm-up put / is_exist / get,
register_buffer of the host pool, batch_is_exist before batch_put_from of the missing pages,
batch_get_into, and the multi-buffer forms, with its prefetch and backup threads running at
once. The host pool is raw memory named by integer pointers: a ctypes buffer (private
memory: copied through the staging buffer), a sealable memfd mapping (zero copy) and a memfd
made with MFD_CLOEXEC alone as SGLang's shm allocator makes it (refused by today's daemon:
copied; accepted by a later one: zero copy), and every path must give the same bytes.
Every method's return convention, the code table (a leased object, a full store), bad
input (wrong sizes, pointers outside any registered buffer, buffers too small, a daemon
stopped or killed during transfers) giving negative codes and never an exception or wrong
bytes. No wall-clock bound is asserted; every loop is bounded in count.
"""

import ctypes
import hashlib
import mmap
import os
import pathlib
import random
import sys
import threading

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "client" / "python"))

import kvtest  # noqa: E402
import kvstash  # noqa: E402  (after the path is set)
from kvstash import buffers  # noqa: E402
from kvstash import mooncake as mc  # noqa: E402
from kvstash.mooncake import MooncakeDistributedStore, ReplicateConfig  # noqa: E402

KIB = 1 << 10
MIB = 1 << 20
BASE_ARGS = ["--memory_size=256m", "--ssd_dir="]
PAGE = 64 * KIB          # one K or V object of one page (a realistic small-model page)
PAGES = 48


def rnd(n, seed):
    return random.Random(seed).randbytes(n)


@pytest.fixture
def kv(daemons):
    return lambda *args, **kw: daemons([*BASE_ARGS, *args], **kw)


@pytest.fixture
def stores():
    """stores(addr=None, **setup_kw): a set-up MooncakeDistributedStore (closed at teardown);
    addr is given as master_server_addr "kvstash://<addr>"."""
    made = []

    def make(addr, hostname="node-a"):
        s = MooncakeDistributedStore()
        made.append(s)
        # as SGLang calls it: eight positional arguments, the last the transfer engine
        rc = s.setup(hostname, "P2PHANDSHAKE", 4 * MIB, 16 * MIB, "tcp", "",
                     f"kvstash://{addr}", None)
        assert rc == 0
        return s

    yield make
    for s in made:
        s.close()


class Pool:
    """A host KV pool of raw memory: kind "ctypes" (private), "sealed" (a memfd made with
    MFD_ALLOW_SEALING), "unsealed" (a memfd made with MFD_CLOEXEC alone, as SGLang's
    alloc_shm). ptr is its address, size its bytes."""

    def __init__(self, kind, size):
        self.kind, self.size = kind, size
        self.fd = None
        if kind == "ctypes":
            self.obj = (ctypes.c_char * size)()
            self.ptr = ctypes.addressof(self.obj)
        else:
            flags = os.MFD_CLOEXEC | (os.MFD_ALLOW_SEALING if kind == "sealed" else 0)
            self.fd = os.memfd_create(f"mooncake-test-{kind}", flags)
            os.ftruncate(self.fd, size)
            self.obj = mmap.mmap(self.fd, size, mmap.MAP_SHARED,
                                 mmap.PROT_READ | mmap.PROT_WRITE)
            self.ptr = buffers.address_of(self.obj)

    def write(self, off, data):
        ctypes.memmove(self.ptr + off, data, len(data))

    def read(self, off, n):
        return ctypes.string_at(self.ptr + off, n)

    def close(self):
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


@pytest.fixture
def pools():
    made = []

    def make(kind, size):
        p = Pool(kind, size)
        made.append(p)
        return p

    yield make
    for p in made:
        p.close()


def page_keys(prefix, n, rank=0):
    """SGLang's MHA keys: page hash, TP rank, _k / _v."""
    out = []
    for i in range(n):
        h = hashlib.sha256(f"{prefix}-{i}".encode()).hexdigest()
        out += [f"model_{h}_{rank}_k", f"model_{h}_{rank}_v"]
    return out


def sglang_backup(store, keys, ptrs, sizes):
    """SGLang's batch_set_v1: put only the keys batch_is_exist does not report; a key that
    exists counts as set. Returns per key 0 or a negative code."""
    exist = store.batch_is_exist(keys)
    assert len(exist) == len(keys)
    res = [0 if e == 1 else -1 for e in exist]
    missing = [i for i, e in enumerate(exist) if e != 1]
    if missing:
        put = store.batch_put_from([keys[i] for i in missing], [ptrs[i] for i in missing],
                                   [sizes[i] for i in missing])
        for i, r in zip(missing, put):
            res[i] = r
    return res


def warmup(store):
    """SGLang's warm-up: put a 4 KiB value, then is_exist == 1 and get returns it."""
    key = "sglang_mooncake_store_warmup_key" + os.urandom(8).hex()
    value = bytes(4 * KIB)
    assert store.put(key, value) == 0
    assert store.is_exist(key) == 1
    assert store.get(key) == value


@pytest.mark.parametrize("kind", ["ctypes", "sealed", "unsealed"])
def test_sglang_mooncake_backend_calls(kv, stores, pools, kind):
    d = kv()
    s = stores(d.unix_path)
    warmup(s)
    n = PAGES * 2
    pool = pools(kind, 2 * n * PAGE)         # the first half written, the second read into
    assert s.register_buffer(pool.ptr, pool.size) == 0
    keys = page_keys("sglang", PAGES)
    data = [rnd(PAGE, i) for i in range(n)]
    for i, v in enumerate(data):
        pool.write(i * PAGE, v)
    ptrs = [pool.ptr + i * PAGE for i in range(n)]
    sizes = [PAGE] * n

    assert s.batch_is_exist(keys) == [0] * n
    assert sglang_backup(s, keys, ptrs, sizes) == [0] * n
    assert s.batch_is_exist(keys) == [1] * n
    # backing the same pages up again: all exist, nothing sent, all set
    assert sglang_backup(s, keys, ptrs, sizes) == [0] * n
    # and batch_put_from of existing keys is success too
    assert s.batch_put_from(keys[:4], ptrs[:4], sizes[:4]) == [0] * 4

    dst = [pool.ptr + (n + i) * PAGE for i in range(n)]
    assert s.batch_get_into(keys, dst, sizes) == [PAGE] * n
    assert [pool.read((n + i) * PAGE, PAGE) for i in range(n)] == data

    # every byte took one of the two paths; the sealable memfd and private memory each
    # take theirs (the unsealable one depends on whether the daemon takes it)
    moved = 2 * n * PAGE + 4 * PAGE
    assert s.zero_copy_bytes + s.staged_bytes == moved
    if kind == "sealed":
        assert s.zero_copy_bytes == moved
    if kind == "ctypes":
        assert s.staged_bytes == moved


@pytest.mark.parametrize("kind", ["ctypes", "sealed", "unsealed"])
def test_multi_buffer_forms_layer_first(kv, stores, pools, kind):
    """MLA layer-first pages: one object per page made of one piece per layer."""
    d = kv()
    s = stores(d.unix_path)
    layers, piece, npages = 8, 4 * KIB, 16
    pool = pools(kind, 2 * layers * npages * piece)
    assert s.register_buffer(pool.ptr, pool.size) == 0
    half = layers * npages * piece
    pool.write(0, rnd(half, 7))

    def ptrs(base, p):
        return [pool.ptr + base + (layer * npages + p) * piece for layer in range(layers)]

    keys = [f"mla_{p}__k" for p in range(npages)]
    res = s.batch_put_from_multi_buffers(keys, [ptrs(0, p) for p in range(npages)],
                                         [[piece] * layers for _ in range(npages)],
                                         ReplicateConfig())
    assert res == [0] * npages
    assert s.get_size(keys[3]) == layers * piece
    got = s.batch_get_into_multi_buffers(keys, [ptrs(half, p) for p in range(npages)],
                                         [[piece] * layers for _ in range(npages)])
    assert got == [layers * piece] * npages
    assert pool.read(half, half) == pool.read(0, half)
    # an object's bytes are its pieces in order
    assert s.get(keys[5]) == b"".join(pool.read(p - pool.ptr, piece) for p in ptrs(0, 5))


def test_the_same_bytes_through_every_kind_of_memory(kv, stores, pools):
    """Put from one kind of memory, read into each of the others: identical bytes, whichever
    way each moved (zero copy, staging copy, refused descriptor)."""
    d = kv()
    s = stores(d.unix_path)
    kinds = ["ctypes", "sealed", "unsealed"]
    ps = {k: pools(k, 8 * PAGE) for k in kinds}
    for p in ps.values():
        assert s.register_buffer(p.ptr, p.size) == 0
    for src in kinds:
        vals = [rnd(PAGE, hash((src, i)) & 0xffff) for i in range(4)]
        for i, v in enumerate(vals):
            ps[src].write(i * PAGE, v)
        keys = [f"{src}-{i}" for i in range(4)]
        assert s.batch_put_from(keys, [ps[src].ptr + i * PAGE for i in range(4)],
                                [PAGE] * 4) == [0] * 4
        for dst in kinds:
            ptrs = [ps[dst].ptr + (4 + i) * PAGE for i in range(4)]
            assert s.batch_get_into(keys, ptrs, [PAGE] * 4) == [PAGE] * 4
            assert [ps[dst].read((4 + i) * PAGE, PAGE) for i in range(4)] == vals


def test_prefetch_and_backup_threads_at_once(kv, stores, pools):
    """SGLang's backup thread stores pages while its prefetch thread reads earlier ones,
    through one store; every page read is byte-exact."""
    d = kv()
    s = stores(d.unix_path)
    rounds, per = 12, 8
    src = pools("sealed", rounds * per * 2 * PAGE)
    dst = pools("unsealed", per * 2 * PAGE)
    assert s.register_buffer(src.ptr, src.size) == 0
    assert s.register_buffer(dst.ptr, dst.size) == 0
    src.write(0, rnd(src.size, 99))
    stored = []                  # rounds whose pages are stored, in order
    cond = threading.Condition()
    errors = []

    def backup():
        try:
            for r in range(rounds):
                keys = page_keys(f"round{r}", per)
                ptrs = [src.ptr + (r * per * 2 + i) * PAGE for i in range(per * 2)]
                assert sglang_backup(s, keys, ptrs, [PAGE] * len(keys)) == [0] * len(keys)
                with cond:
                    stored.append(r)
                    cond.notify_all()
        except BaseException as e:       # reported by the main thread
            errors.append(e)
            with cond:
                cond.notify_all()

    def prefetch():
        try:
            for r in range(rounds):
                with cond:
                    assert cond.wait_for(lambda: r in stored or errors, timeout=60)
                if errors:
                    return
                keys = page_keys(f"round{r}", per)
                ptrs = [dst.ptr + i * PAGE for i in range(per * 2)]
                assert s.batch_get_into(keys, ptrs, [PAGE] * len(keys)) == [PAGE] * len(keys)
                assert dst.read(0, dst.size) == src.read(r * per * 2 * PAGE, dst.size)
        except BaseException as e:
            errors.append(e)

    ts = [threading.Thread(target=backup), threading.Thread(target=prefetch)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(120)
    assert not any(t.is_alive() for t in ts), "a thread did not finish"
    if errors:
        raise errors[0]


def test_every_method_and_its_return_convention(kv, stores, pools, work):
    d = kv()
    s = stores(d.unix_path, hostname="host-17:12345")
    assert s.get_hostname() == "host-17:12345"
    assert s.health_check() == 0

    # bytes API
    assert s.put("a", b"alpha") == 0
    assert s.put("a", b"other") == 0                 # an existing key is success...
    assert s.get("a") == b"alpha"                    # ...and is not rewritten
    assert s.put("arr", bytearray(b"xyz")) == 0
    assert s.put("mv", memoryview(b"0123456789")[2:6]) == 0
    assert s.get("mv") == b"2345"
    assert s.get("missing") == b""
    assert s.is_exist("a") == 1 and s.is_exist("missing") == 0
    assert s.batch_is_exist(["a", "missing", "arr"]) == [1, 0, 1]
    assert s.batch_is_exist([]) == []
    assert s.get_size("a") == 5
    assert s.get_size("missing") == mc.OBJECT_NOT_FOUND == -704
    assert s.put_batch(["b1", "b2"], [b"one", b"two"]) == 0
    assert s.get_batch(["b1", "missing", "b2"]) == [b"one", b"", b"two"]
    assert s.put_parts("parts", b"ab", bytearray(b"cd"), memoryview(b"ef")) == 0
    assert s.get("parts") == b"abcdef"

    # remove forms
    assert s.remove("a") == 0
    assert s.remove("a") == -704
    assert s.get("a") == b""
    assert s.batch_remove(["b1", "missing", "b2"]) == [0, -704, 0]
    assert s.batch_remove([]) == []
    # a leased object (another client read it in place): -706, and force overrides the lease
    assert s.put("leased", b"L") == 0
    with kvstash.Client(d.unix_path) as c:
        assert c.get_replica_list(["leased"])[0]["size"] == 1
        assert s.remove("leased") == mc.OBJECT_HAS_LEASE == -706
        assert s.batch_remove(["leased"]) == [-706]
        assert s.remove("leased", force=True) == 0
    assert s.put("c", b"c") == 0
    assert s.remove_all() == 4                       # arr, mv, parts, c (+ the warm-up: none)
    assert s.batch_is_exist(["arr", "mv", "parts", "c"]) == [0, 0, 0, 0]
    assert s.remove_all(force=True) == 0

    # raw pointers: single forms
    pool = pools("sealed", 64 * KIB)
    assert s.register_buffer(pool.ptr, pool.size) == 0
    pool.write(0, b"payload-1234")
    assert s.put_from("p", pool.ptr, 12) == 0
    assert s.put_from("p", pool.ptr, 12) == 0        # existing: success
    assert s.put_from("empty", pool.ptr, 0) == 0     # Mooncake stores nothing for size 0
    assert s.get_into("p", pool.ptr + 100, 50) == 12  # a larger buffer: bytes read
    assert pool.read(100, 12) == b"payload-1234"
    assert s.get_into("missing", pool.ptr + 200, 50) == -704
    assert any(c.buffer_at(pool.ptr) is not None for c in s._clients), "zero copy"
    assert s.unregister_buffer(pool.ptr) == 0
    assert all(c.buffer_at(pool.ptr) is None for c in s._clients), "the daemon let it go"
    assert s.put_from("q", pool.ptr, 12) == mc.INVALID_PARAMS  # no longer registered

    # ReplicateConfig: the fields Mooncake has; hard pin maps to kvstash's hard pin
    cfg = ReplicateConfig()
    assert cfg.replica_num == 1 and cfg.with_hard_pin is False and cfg.group_ids is None
    assert "replica_num" in str(cfg)
    cfg.with_hard_pin = True
    with kvstash.Client(d.unix_path) as c:
        before = c.stats()["pinned_hard"]
        assert s.put("pinned", b"x", cfg) == 0
        assert c.stats()["pinned_hard"] == before + 1

    # close: 0, then every call fails as before setup (no exception)
    assert s.close() == 0
    assert s.health_check() == 1
    assert s.is_exist("pinned") == mc.INVALID_PARAMS
    assert s.get("pinned") == b""
    assert s.put("z", b"z") == mc.INVALID_PARAMS
    assert s.batch_get_into(["pinned"], [pool.ptr], [16]) == [mc.INVALID_PARAMS]
    assert s.register_buffer(pool.ptr, 16) == mc.INVALID_PARAMS


def test_setup_forms(kv, work, monkeypatch):
    d = kv()
    s = MooncakeDistributedStore()
    try:
        assert s.health_check() == 1                 # not set up
        assert s.put("k", b"v") == mc.INVALID_PARAMS
        # the dict form, sizes as strings, the daemon named by master_server_addr
        assert s.setup({"local_hostname": "h", "metadata_server": "P2PHANDSHAKE",
                        "global_segment_size": "4GB", "local_buffer_size": "32 MB",
                        "protocol": "tcp", "master_server_addr": f"kvstash://{d.unix_path}"}) == 0
        assert s.put("k", b"v") == 0 and s.get_hostname() == "h"
        # required keys and sizes checked as Mooncake does
        assert s.setup({"metadata_server": "x"}) == mc.INVALID_PARAMS
        assert s.setup({"local_hostname": "h", "metadata_server": "m",
                        "local_buffer_size": "lots"}) == mc.INVALID_PARAMS
        # keyword form with every argument SGLang may pass
        assert s.setup(local_hostname="h2", metadata_server="m", global_segment_size=1 << 30,
                       local_buffer_size=16 * MIB, protocol="rdma", rdma_devices="mlx5_0",
                       master_server_addr=f"kvstash://unix:{d.unix_path}", engine=None,
                       enable_ssd_offload=False, ssd_offload_path="", tenant_id="default",
                       enable_client_http_server=False, client_http_port=9300) == 0
        assert s.get("k") == b"v"
        # a Mooncake master address with $KVSTASH_ADDR set: the variable names the daemon
        monkeypatch.setenv("KVSTASH_ADDR", d.unix_path)
        assert s.setup("h3", "P2PHANDSHAKE", 0, 0, "tcp", "", "10.0.0.1:50051") == 0
        assert s.get("k") == b"v"
        monkeypatch.delenv("KVSTASH_ADDR")
        # no daemon there: RPC_FAIL, and the store is not set up
        assert s.setup("h", "m", 0, 0, "tcp", "",
                       f"kvstash://{os.path.join(work, 'nothing.sock')}") == mc.RPC_FAIL
        assert s.health_check() == 1
        # missing required positional arguments: TypeError, as pybind11 raises
        with pytest.raises(TypeError):
            s.setup("only-one")
    finally:
        s.close()


def test_code_mapping():
    table = {
        kvstash.OK: 0, kvstash.NOT_FOUND: -704, kvstash.EXISTS: -705, kvstash.BUSY: -706,
        kvstash.NO_SPACE: -200, kvstash.TOO_LARGE: -600, kvstash.INVALID_ARGUMENT: -600,
        kvstash.METHOD_NOT_FOUND: -1012, kvstash.PROTOCOL_ERROR: -900,
        kvstash.UNAUTHORIZED: -601, kvstash.FORBIDDEN: -601, kvstash.QUOTA_EXCEEDED: -1700,
        kvstash.CHECKSUM_MISMATCH: -801, kvstash.TIMEOUT: -901, kvstash.UNAVAILABLE: -900,
        kvstash.UNSUPPORTED: -1012, kvstash.INTERNAL: -1,
    }
    for code, want in table.items():
        assert mc.to_mooncake(code) == want
        assert mc.to_mooncake(-code) == want         # batch_get_into's minus sign
    assert mc.to_mooncake(999) == -1
    assert mc._error_code(kvstash.ConnectionLost(kvstash.UNAVAILABLE)) == -900
    assert mc._error_code(kvstash.ConnectionLost(kvstash.TIMEOUT)) == -901


def test_exact_size_reads_take_one_request(kv, stores, pools, monkeypatch):
    """batch_get_into and get_into ask kvstashd once per batch (batch_get_into with its
    whole option), never batch_get_size first: a value larger than its buffer is still
    INVALID_PARAMS with nothing written. Against a daemon that refuses the option (as one
    before it does), the store reads sizes first, with the same answers."""
    d = kv()
    s = stores(d.unix_path)
    pool = pools("sealed", 16 * PAGE)
    assert s.register_buffer(pool.ptr, pool.size) == 0
    data = rnd(2 * PAGE, 9)
    pool.write(0, data)
    assert s.batch_put_from(["a", "b"], [pool.ptr, pool.ptr + PAGE], [PAGE, PAGE]) == [0, 0]
    sentinel = b"\x5a" * PAGE
    with kvstash.Client(d.unix_path) as c:
        for round_ in ("whole", "sizes first"):
            pool.write(4 * PAGE, sentinel)
            ops = c.stats()
            got = s.batch_get_into(["a", "b", "nope"],
                                   [pool.ptr + 2 * PAGE, pool.ptr + 4 * PAGE, pool.ptr],
                                   [PAGE + 7, PAGE - 1, PAGE])
            assert got == [PAGE, mc.INVALID_PARAMS, mc.OBJECT_NOT_FOUND], round_
            assert pool.read(2 * PAGE, PAGE) == data[:PAGE]
            assert pool.read(4 * PAGE, PAGE) == sentinel, "a value too large was written"
            after = c.stats()
            sized = after["ops.batch_get_size"] - ops["ops.batch_get_size"]
            reads = after["ops.batch_get_into"] - ops["ops.batch_get_into"]
            if round_ == "whole":
                assert (sized, reads) == (0, 1)
                # as a daemon without the option answers it
                real = kvstash.Client.batch_get_into

                def old_daemon(self, keys, pieces, *, whole=False):
                    if whole:
                        raise kvstash.Error(kvstash.INVALID_ARGUMENT, None,
                                            "wrong number of params")
                    return real(self, keys, pieces)
                monkeypatch.setattr(kvstash.Client, "batch_get_into", old_daemon)
            else:
                assert (sized, reads) == (1, 1) and s._whole is False


def test_bad_input_gives_codes_and_never_wrong_bytes(kv, stores, pools):
    d = kv()
    s = stores(d.unix_path)
    pool = pools("sealed", 16 * PAGE)
    outside = pools("ctypes", 4 * PAGE)              # never registered
    assert s.register_buffer(pool.ptr, pool.size) == 0
    pool.write(0, rnd(2 * PAGE, 5))
    assert s.batch_put_from(["k0", "k1"], [pool.ptr, pool.ptr + PAGE], [PAGE, PAGE]) == [0, 0]

    # list lengths that do not match: every key INVALID_PARAMS, nothing stored
    assert s.batch_put_from(["x0", "x1"], [pool.ptr], [PAGE, PAGE]) == [-600, -600]
    assert s.batch_put_from(["x0"], [pool.ptr], [PAGE, PAGE]) == [-600]
    assert s.batch_get_into(["k0", "k1"], [pool.ptr], [PAGE]) == [-600, -600]
    assert s.batch_put_from_multi_buffers(["x0"], [[pool.ptr, pool.ptr]], [[PAGE]]) == [-600]
    assert s.batch_is_exist(["x0", "x1"]) == [0, 0]

    # a pointer outside every registered buffer fails its key only; its memory untouched
    sentinel = b"\xa5" * PAGE
    outside.write(0, sentinel)
    assert s.batch_put_from(["x0", "k2"], [outside.ptr, pool.ptr + 2 * PAGE],
                            [PAGE, PAGE]) == [-600, 0]
    assert s.is_exist("x0") == 0
    assert s.batch_get_into(["k0", "k1"], [outside.ptr, pool.ptr + 4 * PAGE],
                            [PAGE, PAGE]) == [-600, PAGE]
    assert outside.read(0, PAGE) == sentinel
    assert pool.read(4 * PAGE, PAGE) == pool.read(PAGE, PAGE)
    # a range that starts inside a registered buffer and runs past its end
    assert s.put_from("x1", pool.ptr + pool.size - 10, 20) == -600
    assert s.get_into("k0", pool.ptr + pool.size - 10, PAGE) == -600
    # null pointers, negative and zero sizes
    assert s.batch_put_from(["x2", "x3", "x4"], [0, pool.ptr, pool.ptr],
                            [PAGE, -1, 0]) == [-600, -600, -600]
    assert s.get_into("k0", 0, PAGE) == -600
    assert s.batch_is_exist(["x1", "x2", "x3", "x4"]) == [0, 0, 0, 0]

    # a buffer smaller than the value: INVALID_PARAMS and nothing written
    pool.write(8 * PAGE, sentinel)
    assert s.get_into("k0", pool.ptr + 8 * PAGE, PAGE - 1) == -600
    assert s.batch_get_into_multi_buffers(["k0"], [[pool.ptr + 8 * PAGE] * 2],
                                          [[100, 200]]) == [-600]
    assert pool.read(8 * PAGE, PAGE) == sentinel
    # a missing key next to a present one
    assert s.batch_get_into(["nope", "k1"], [pool.ptr + 8 * PAGE, pool.ptr + 9 * PAGE],
                            [PAGE, PAGE]) == [-704, PAGE]
    assert pool.read(8 * PAGE, PAGE) == sentinel

    # registration errors
    assert s.register_buffer(0, 100) == -600
    assert s.register_buffer(pool.ptr, 0) == -600
    assert s.unregister_buffer(outside.ptr) == -600

    # wrong Python types raise TypeError, as Mooncake's pybind11 module does
    with pytest.raises(TypeError):
        s.put(17, b"v")
    with pytest.raises(TypeError):
        s.batch_put_from(["k"], ["not a pointer"], [1])
    with pytest.raises(TypeError):
        s.put("k", 3.5)
    d.assert_alive()


def test_a_stopped_daemon_gives_codes_then_the_store_reconnects(daemons, stores, pools, work):
    sock = os.path.join(work, "mc.sock")
    args = [*BASE_ARGS, f"--unix_socket={sock}"]
    d = daemons(args, unix=False)
    s = stores(sock)
    pool = pools("sealed", 8 * PAGE)
    assert s.register_buffer(pool.ptr, pool.size) == 0
    pool.write(0, rnd(PAGE, 1))
    assert s.batch_put_from(["k"], [pool.ptr], [PAGE]) == [0]

    d.stop()
    pool.write(4 * PAGE, b"\x5a" * PAGE)
    for _ in range(3):                               # and again: no hang, no exception
        assert s.health_check() == 2
        assert s.put("x", b"v") == -900
        assert s.get("k") == b""
        assert s.is_exist("k") == -900
        assert s.batch_is_exist(["k", "y"]) == [-900, -900]
        assert s.get_size("k") == -900
        assert s.remove("k") == -900
        assert s.batch_remove(["k"]) == [-900]
        assert s.remove_all() == -900
        assert s.batch_put_from(["y"], [pool.ptr], [PAGE]) == [-900]
        assert s.batch_get_into(["k"], [pool.ptr + 4 * PAGE], [PAGE]) == [-900]
        assert s.batch_get_into_multi_buffers(["k"], [[pool.ptr + 4 * PAGE]],
                                              [[PAGE]]) == [-900]
        assert s.get_batch(["k", "y"]) == [b"", b""]
    assert pool.read(4 * PAGE, PAGE) == b"\x5a" * PAGE

    # a daemon on the same socket again: the store connects at a later call
    daemons(args, unix=False)
    kvtest.wait_for(lambda: s.health_check() == 0, 15, "the store to reach the new daemon")
    assert s.is_exist("k") == 0                      # a new daemon, empty
    assert s.batch_put_from(["k"], [pool.ptr], [PAGE]) == [0]
    assert s.batch_get_into(["k"], [pool.ptr + 4 * PAGE], [PAGE]) == [PAGE]
    assert pool.read(4 * PAGE, PAGE) == pool.read(0, PAGE)


def test_over_tcp_values_cross_the_socket(kv, stores, pools):
    """No shared memory over TCP: raw-pointer transfers send the bytes; same results."""
    d = kv()
    s = stores(f"127.0.0.1:{d.port}")
    pool = pools("ctypes", 8 * PAGE)
    assert s.register_buffer(pool.ptr, pool.size) == 0
    pool.write(0, rnd(2 * PAGE, 3))
    assert s.batch_put_from(["t0", "t1"], [pool.ptr, pool.ptr + PAGE], [PAGE, PAGE]) == [0, 0]
    assert s.batch_get_into(["t0", "t1", "t9"], [pool.ptr + 4 * PAGE, pool.ptr + 5 * PAGE,
                                                 pool.ptr + 6 * PAGE],
                            [PAGE, PAGE, PAGE]) == [PAGE, PAGE, -704]
    assert pool.read(4 * PAGE, 2 * PAGE) == pool.read(0, 2 * PAGE)
    assert s.get_into("t0", pool.ptr + 6 * PAGE, PAGE - 1) == -600
    assert s.get("t1") == pool.read(PAGE, PAGE)


def test_code_written_for_mooncake_runs_by_changing_the_import(kv, tmp_path, monkeypatch, pools):
    """A `mooncake.store` that re-exports kvstash.mooncake (docs/mooncake.md) lets code that
    imports Mooncake's module run unchanged."""
    d = kv()
    pkg = tmp_path / "mooncake"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "store.py").write_text("from kvstash.mooncake import *  # noqa: F401,F403\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    for name in ("mooncake", "mooncake.store"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    from mooncake.store import MooncakeDistributedStore as Store, ReplicateConfig as RC

    s = Store()
    try:
        assert s.setup("h", "P2PHANDSHAKE", 0, 0, "tcp", "", f"kvstash://{d.unix_path}") == 0
        warmup(s)
        pool = pools("unsealed", 2 * PAGE)
        assert s.register_buffer(pool.ptr, pool.size) == 0
        pool.write(0, rnd(PAGE, 11))
        assert s.batch_put_from(["m"], [pool.ptr], [PAGE], RC()) == [0]
        assert s.batch_get_into(["m"], [pool.ptr + PAGE], [PAGE]) == [PAGE]
        assert pool.read(PAGE, PAGE) == pool.read(0, PAGE)
    finally:
        s.close()


def test_batches_larger_than_the_staging_buffer_run_in_rounds(kv, pools):
    """Private memory is copied through a staging buffer of local_buffer_size bytes; a batch
    of four times that still moves whole and byte-exact, also with four threads at once."""
    d = kv()
    s = MooncakeDistributedStore()
    try:
        assert s.setup("h", "m", 0, MIB, "tcp", "", f"kvstash://{d.unix_path}") == 0
        n = 64                                       # 64 x 64 KiB = 4 MiB a batch
        pool = pools("ctypes", 2 * n * PAGE * 4)
        assert s.register_buffer(pool.ptr, pool.size) == 0
        errors = []

        def worker(t):
            try:
                base = t * 2 * n * PAGE
                keys = [f"t{t}-{i}" for i in range(n)]
                src = [pool.ptr + base + i * PAGE for i in range(n)]
                dst = [pool.ptr + base + (n + i) * PAGE for i in range(n)]
                pool.write(base, rnd(n * PAGE, t))
                assert s.batch_put_from(keys, src, [PAGE] * n) == [0] * n
                assert s.batch_get_into(keys, dst, [PAGE] * n) == [PAGE] * n
                assert pool.read(base + n * PAGE, n * PAGE) == pool.read(base, n * PAGE)
            except BaseException as e:
                errors.append(e)

        ts = [threading.Thread(target=worker, args=(t,)) for t in range(4)]
        for t in ts:
            t.start()
        for t in ts:
            t.join(120)
        assert not any(t.is_alive() for t in ts), "a thread did not finish"
        if errors:
            raise errors[0]
    finally:
        s.close()


def test_a_full_store_is_no_available_handle(daemons, stores, pools):
    """Hard-pinned objects (ReplicateConfig.with_hard_pin) fill a 16 MiB daemon: later puts,
    from bytes or from raw pointers, get -200 (NO_AVAILABLE_HANDLE) and are not stored."""
    d = daemons(["--memory_size=16m", "--ssd_dir="])
    s = stores(d.unix_path)
    cfg = ReplicateConfig()
    cfg.with_hard_pin = True
    results = [s.put(f"pinned{i}", bytes(MIB), cfg) for i in range(32)]
    assert 0 in results and results[-1] == mc.NO_AVAILABLE_HANDLE == -200
    assert s.is_exist(f"pinned{results.index(-200)}") == 0
    pool = pools("sealed", 2 * MIB)
    assert s.register_buffer(pool.ptr, pool.size) == 0
    assert s.batch_put_from(["raw0", "raw1"], [pool.ptr, pool.ptr + MIB], [MIB, MIB]) \
        == [-200, -200]
    assert s.batch_is_exist(["raw0", "raw1"]) == [0, 0]
    assert s.get("pinned0") == bytes(MIB)


@pytest.mark.parametrize("kind", ["ctypes", "sealed"])
def test_a_daemon_killed_during_transfers(kv, stores, pools, kind):
    """Transfers running when the daemon is killed return -900 (or their full results),
    never an exception, and a read reported whole is byte-exact."""
    d = kv()
    s = stores(d.unix_path)
    n = 32
    pool = pools(kind, 2 * n * PAGE)
    assert s.register_buffer(pool.ptr, pool.size) == 0
    pool.write(0, rnd(n * PAGE, 8))
    keys = [f"k{i}" for i in range(n)]
    src = [pool.ptr + i * PAGE for i in range(n)]
    dst = [pool.ptr + (n + i) * PAGE for i in range(n)]
    assert s.batch_put_from(keys, src, [PAGE] * n) == [0] * n
    seen, errors = [], []
    started = threading.Event()

    def reader():
        try:
            for _ in range(2000):
                r = s.batch_get_into(keys, dst, [PAGE] * n)
                started.set()
                seen.append(r)
                if r == [PAGE] * n:
                    assert pool.read(n * PAGE, n * PAGE) == pool.read(0, n * PAGE)
                else:
                    assert r == [-900] * n, r
                    return
        except BaseException as e:
            errors.append(e)

    t = threading.Thread(target=reader)
    t.start()
    assert started.wait(30)
    d.kill9()
    t.join(60)
    assert not t.is_alive()
    if errors:
        raise errors[0]
    assert seen[-1] == [-900] * n                    # the reader ran into the kill
    assert s.batch_put_from(keys[:1], src[:1], [PAGE]) == [-900]
    assert s.health_check() == 2
