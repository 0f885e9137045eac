"""Integration: kvstash.sglang, the SGLang HiCache L3 backend, against the real daemon.

SGLang cannot be installed here: the stand-ins in tests/integration/standins/sglang are the
pieces the adapter touches (HiCacheStorage, HiCacheStorageConfig, the dynamic backend
factory, the MHA and MLA host pools with SGLang's page layouts over an shm memfd made as
its alloc_shm makes it), read from SGLang's source (docs/sglang.md names the commit). The
backend is built the way SGLang builds it (StorageBackendFactory.create_backend("dynamic",
...), then register_mem_pool_host) and driven the way HiCache drives it: batch_exists on
the prefetch thread, batch_get_v1 on the prefetch I/O thread and batch_set_v1 on the backup
thread, at once. Pages are realistic (64 tokens x 8 heads x 128 dims x 2 bytes per layer,
4 layers: 512 KiB per K or V object) and every round trip is checked byte for byte.

Two pools: one whose memfd allows sealing (the client seals it; zero copy) and one made
exactly as SGLang's alloc_shm (MFD_CLOEXEC only): a daemon that refuses unsealed memfds
makes the adapter fall back to the staging copy, one that accepts them gives zero copy; the
bytes must be the same either way, and the path taken is printed (pytest -s, or -rP).

Also: prefix counting with a missing K or V half; MLA (only TP rank 0 writes, other ranks
read its pages); two dtypes or two layouts of one model never share a page; bad input and a
stopped daemon give False / 0 / None and never raise; the generic (non-v1) interface; TCP.
No wall-clock bounds: joins and timeouts only turn a hang into a failure.
"""

import logging
import os
import pathlib
import sys
import threading

import numpy as np
import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT / "client" / "python"))
sys.path.insert(0, str(HERE / "standins"))

import kvstash  # noqa: E402
from sglang.srt.mem_cache.hicache_storage import HiCacheStorageConfig  # noqa: E402
from sglang.srt.mem_cache.pool_host import (MHATokenToKVPoolHost,  # noqa: E402
                                            MLATokenToKVPoolHost)
from sglang.srt.mem_cache.pool_host.base import bfloat16, float16  # noqa: E402
from sglang.srt.mem_cache.storage.backend_factory import StorageBackendFactory  # noqa: E402

BASE_ARGS = ["--memory_size=512m", "--ssd_dir="]
MODEL = "Qwen/Qwen3-8B"
PAGE, HEADS, DIM, LAYERS = 64, 8, 128, 4          # 512 KiB per K or V object
POOL_PAGES = 48
ALLOCATORS = {"sealable": "shm_sealable", "sglang": "shm"}


@pytest.fixture
def kv(daemons):
    return lambda *args: daemons([*BASE_ARGS, *args])


@pytest.fixture
def made():
    """Backends and pools made by a test, closed at teardown."""
    things = []
    yield things
    for t in things:
        t.close()


def config(addr, *, tp_rank=0, tp_size=1, mla=False, v1=True, model=MODEL, **extra):
    ec = {"backend_name": "kvstash", "module_path": "kvstash.sglang",
          "class_name": "KvstashStorage", "interface_v1": 1 if v1 else 0,
          "allocator": "shm", "kvstash_addr": addr, "kvstash_timeout": 20, **extra}
    return HiCacheStorageConfig(tp_rank=tp_rank, tp_size=tp_size, pp_rank=0, pp_size=1,
                                attn_cp_rank=0, attn_cp_size=1, is_mla_model=mla,
                                enable_storage_metrics=True, is_page_first_layout=True,
                                model_name=model, extra_config=ec)


def mha_pool(made, layout="page_first", allocator="shm", dtype=bfloat16, seed=1):
    p = MHATokenToKVPoolHost(LAYERS, HEADS, DIM, PAGE, POOL_PAGES, layout, dtype=dtype,
                             allocator_type=allocator)
    made.append(p)
    p.fill_random(seed)
    return p


def mla_pool(made, layout="page_first", seed=2):
    p = MLATokenToKVPoolHost(LAYERS, 576, PAGE, POOL_PAGES, layout, allocator_type="shm")
    made.append(p)
    p.fill_random(seed)
    return p


def backend(made, cfg, pool):
    """As HiCacheController: the factory's dynamic path, then register_mem_pool_host."""
    b = StorageBackendFactory.create_backend("dynamic", cfg, pool)
    made.append(b)
    b.register_mem_pool_host(pool)
    return b


def pages_of(pool, pages):
    return [bytes(pool.get_data_page(p * PAGE).view(np.uint8)) for p in pages]


def moved(b):
    """(zero-copy bytes, staged bytes) over the backend's connections."""
    return (sum(c.zero_copy_bytes for c in b._clients),
            sum(c.staged_bytes for c in b._clients))


def hashes(n, tag="h"):
    return [f"{tag}{i:04d}" for i in range(n)]


def unix(d):
    return f"unix:{d.unix_path}"


# ---------------------------------------------------------------------------------------

def test_factory_builds_the_backend(kv, made):
    d = kv()
    pool = mha_pool(made)
    b = backend(made, config(unix(d)), pool)
    assert type(b).__name__ == "KvstashStorage"
    assert b.mem_pool_host is pool
    assert b.prefix == "Qwen-Qwen3-8B_bfloat16-pf-tp1"


@pytest.mark.parametrize("memfd", ["sealable", "sglang"])
@pytest.mark.parametrize("layout", ["page_first", "layer_first", "page_first_direct"])
def test_mha_round_trip_byte_exact(kv, made, memfd, layout):
    d = kv()
    pool = mha_pool(made, layout, ALLOCATORS[memfd])
    b = backend(made, config(unix(d)), pool)
    keys = hashes(16)
    src = list(range(16))
    want = pages_of(pool, src)
    assert b.batch_set_v1(keys, pool.page_indices(src)) == [True] * 16
    assert b.batch_exists(keys) == 16
    pool.zero()
    dst = list(range(20, 36))
    assert b.batch_get_v1(keys, pool.page_indices(dst)) == [True] * 16
    assert pages_of(pool, dst) == want
    # a page already stored counts as set
    assert b.batch_set_v1(keys[:4], pool.page_indices(dst[:4])) == [True] * 4
    zero, staged = moved(b)
    if memfd == "sealable":
        assert b.path == "zero-copy"
    else:
        assert b.path in ("zero-copy", "staging")
    # every byte took the path the backend reports, and none went through the socket
    total = (16 + 16 + 4) * len(want[0])       # pages set, got, set again
    assert (zero, staged) == ((total, 0) if b.path == "zero-copy" else (0, total))
    print(f"{memfd} memfd, {layout}: path {b.path}")


def test_a_pool_the_daemon_dropped_is_registered_again(kv, made):
    """SGLang's memfd cut (truncated) under a backup and made whole again: that
    batch_set_v1 is all False and stores nothing, the daemon drops the pool's buffer, and
    the next calls register the pool again and move pages with no copy, byte-exact."""
    d = kv()
    pool = mha_pool(made, "page_first", ALLOCATORS["sglang"])
    b = backend(made, config(unix(d)), pool)
    assert b.path == "zero-copy"
    fd = pool.allocator.fds[0]
    size = os.fstat(fd).st_size
    keys = hashes(8, "cut")
    os.ftruncate(fd, 0)                 # the pool must not be touched until it is whole
    assert b.batch_set_v1(keys, pool.page_indices(range(8))) == [False] * 8
    os.ftruncate(fd, size)
    assert b.batch_exists(keys) == 0, "nothing partial is stored"
    pool.fill_random(9)
    want = pages_of(pool, range(8))
    assert b.batch_set_v1(keys, pool.page_indices(range(8))) == [True] * 8
    dst = list(range(20, 28))
    assert b.batch_get_v1(keys, pool.page_indices(dst)) == [True] * 8
    assert pages_of(pool, dst) == want
    assert moved(b)[1] == 0, "no page went through the staging copy"


def test_sglang_memfd_path_reported(kv, made, capsys, caplog):
    """SGLang's own alloc_shm memfd: zero copy once the daemon accepts unsealed memfds,
    the staging copy before; both move the same bytes (above). The path is logged once,
    however many threads connect."""
    d = kv()
    pool = mha_pool(made, "page_first", "shm")
    caplog.set_level(logging.INFO, logger="kvstash.sglang")
    b = backend(made, config(unix(d)), pool)
    keys = hashes(4, "r")
    assert b.batch_set_v1(keys, pool.page_indices(range(4))) == [True] * 4
    ts = [threading.Thread(target=b.batch_get_v1, args=(keys, pool.page_indices(range(8, 12))))
          for _ in range(3)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(60)
    said = [r.getMessage() for r in caplog.records if "HiCache host pool" in r.getMessage()]
    assert len(said) == 1 and b.path in said[0], said
    with capsys.disabled():
        print(f"\n[test_sglang] SGLang alloc_shm memfd (MFD_CLOEXEC only): {b.path}")
    assert b.path in ("zero-copy", "staging")


def test_prefetch_and_backup_threads_at_once(kv, made):
    """The backup thread writes batches while the prefetch thread queries and reads the
    batches already written and a third thread asks batch_exists: every page read is
    byte-exact, every count within its batch."""
    d = kv()
    pool = mha_pool(made, "page_first", "shm_sealable")
    b = backend(made, config(unix(d)), pool)
    nb, per = 6, 4                         # 6 batches of 4 pages, from host pages 0..23
    batches = [hashes(per, f"b{i}_") for i in range(nb)]
    want = {i: pages_of(pool, range(i * per, (i + 1) * per)) for i in range(nb)}
    written = []
    errors = []
    done = threading.Event()

    def backup():
        try:
            for i in range(nb):
                r = b.batch_set_v1(batches[i], pool.page_indices(range(i * per, (i + 1) * per)))
                assert r == [True] * per, r
                written.append(i)
        except BaseException as e:
            errors.append(e)
        finally:
            done.set()

    reads = []

    def prefetch():
        try:
            dst = list(range(32, 32 + per))
            for _ in range(5000):
                if len(reads) == nb:
                    return
                avail = list(written)
                for i in avail:
                    if i in reads:
                        continue
                    assert b.batch_exists(batches[i]) == per
                    assert b.batch_get_v1(batches[i], pool.page_indices(dst)) == [True] * per
                    assert pages_of(pool, dst) == want[i], f"batch {i} differs"
                    reads.append(i)
                if done.is_set() and len(reads) == len(written):
                    return
                done.wait(0.01)
        except BaseException as e:
            errors.append(e)

    def query():
        try:
            for _ in range(2000):
                if done.is_set():
                    return
                for i in range(nb):     # a batch being written shows a growing prefix
                    assert 0 <= b.batch_exists(batches[i]) <= per
        except BaseException as e:
            errors.append(e)

    ts = [threading.Thread(target=f) for f in (backup, prefetch, query)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(120)
    assert not any(t.is_alive() for t in ts), "a thread hung"
    assert not errors, errors
    assert sorted(reads) == list(range(nb))
    assert len(b._clients) >= 3, "each thread has its own connection"


def test_prefix_counts_whole_pages_only(kv, made):
    d = kv()
    pool = mha_pool(made)
    b = backend(made, config(unix(d), tp_rank=1, tp_size=2), pool)
    keys = hashes(6, "p")
    assert b.batch_set_v1(keys, pool.page_indices(range(6))) == [True] * 6
    prefix = "Qwen-Qwen3-8B_bfloat16-pf-tp2"
    with kvstash.Client(unix(d)) as c:
        # keys as SGLang's Mooncake backend builds them: {prefix}_{hash}_{tp_rank}_k / _v
        assert all(c.batch_is_exist([f"{prefix}_{k}_1_{h}" for k in keys for h in "kv"]))
        c.remove(f"{prefix}_{keys[5]}_1_k")
        assert b.batch_exists(keys) == 5
        c.remove(f"{prefix}_{keys[3]}_1_v")
        assert b.batch_exists(keys) == 3
        assert b.exists(keys[2]) and not b.exists(keys[3])
    # a page missing its V half is not read
    assert b.batch_get_v1(keys[3:4], pool.page_indices([40])) == [False]


@pytest.mark.parametrize("layout", ["page_first", "layer_first"])
def test_mla_rank0_writes_others_read(kv, made, layout):
    d = kv()
    p0, p1 = mla_pool(made, layout, seed=3), mla_pool(made, layout, seed=4)
    r0 = backend(made, config(unix(d), tp_rank=0, tp_size=2, mla=True), p0)
    r1 = backend(made, config(unix(d), tp_rank=1, tp_size=2, mla=True), p1)
    keys = hashes(5, "m")
    # rank 1 writes nothing (SGLang skips its backup; the adapter acks it)
    assert r1.batch_set_v1(keys, p1.page_indices(range(5))) == [True] * 5
    assert r1.batch_exists(keys) == 0
    assert r0.batch_set_v1(keys, p0.page_indices(range(5))) == [True] * 5
    order = "pf" if layout == "page_first" else "lf"
    with kvstash.Client(unix(d)) as c:
        assert all(c.batch_is_exist([f"Qwen-Qwen3-8B_bfloat16-{order}_{k}__k" for k in keys]))
    assert r1.batch_exists(keys) == 5
    dst = list(range(30, 35))
    assert r1.batch_get_v1(keys, p1.page_indices(dst)) == [True] * 5
    assert pages_of(p1, dst) == pages_of(p0, range(5))


def test_dtypes_and_layouts_never_share_a_page(kv, made):
    d = kv()
    pa = mha_pool(made, "page_first", dtype=bfloat16, seed=5)
    pb = mha_pool(made, "page_first", dtype=float16, seed=6)
    pc = mha_pool(made, "layer_first", dtype=bfloat16, seed=7)
    a = backend(made, config(unix(d)), pa)
    bb = backend(made, config(unix(d)), pb)
    cc = backend(made, config(unix(d)), pc)
    keys = hashes(3, "d")
    assert a.batch_set_v1(keys, pa.page_indices(range(3))) == [True] * 3
    assert bb.batch_exists(keys) == 0 and cc.batch_exists(keys) == 0
    before = pages_of(pb, [10, 11, 12])
    assert bb.batch_get_v1(keys, pb.page_indices([10, 11, 12])) == [False] * 3
    assert pages_of(pb, [10, 11, 12]) == before
    assert bb.batch_set_v1(keys, pb.page_indices(range(3))) == [True] * 3
    assert bb.batch_get_v1(keys, pb.page_indices([10, 11, 12])) == [True] * 3
    assert pages_of(pb, [10, 11, 12]) == pages_of(pb, range(3))
    assert a.batch_get_v1(keys, pa.page_indices([10, 11, 12])) == [True] * 3
    assert pages_of(pa, [10, 11, 12]) == pages_of(pa, range(3))


def test_bad_input_is_false_never_raises(kv, made):
    d = kv()
    pool = mha_pool(made)
    b = backend(made, config(unix(d)), pool)
    keys = hashes(2, "x")
    # wrong number of host indices
    assert b.batch_set_v1(keys, pool.page_indices([0])) == [False, False]
    assert b.batch_get_v1(keys, pool.page_indices([0, 1, 2])) == [False, False]
    # pages outside the pool
    assert b.batch_set_v1(keys, pool.page_indices([POOL_PAGES, POOL_PAGES + 1])) == \
        [False, False]
    assert b.batch_exists(keys) == 0
    assert b.batch_get_v1(None, None) == []
    assert b.batch_exists(None) == 0
    # a value of another size under a page's key is never read into the pool
    prefix = b.prefix
    with kvstash.Client(unix(d)) as c:
        c.put(f"{prefix}_{keys[0]}_0_k", b"short")
        c.put(f"{prefix}_{keys[0]}_0_v", b"short")
    assert b.batch_exists(keys[:1]) == 1
    assert b.batch_get_v1(keys[:1], pool.page_indices([5])) == [False]
    # nor one a byte longer than the page's objects (and the page is left as it was)
    obj = PAGE * HEADS * DIM * 2 * LAYERS
    with kvstash.Client(unix(d)) as c:
        c.put(f"{prefix}_{keys[1]}_0_k", bytes(obj + 1))
        c.put(f"{prefix}_{keys[1]}_0_v", bytes(obj + 1))
    before = pages_of(pool, [6])
    assert b.batch_get_v1(keys[1:], pool.page_indices([6])) == [False]
    assert pages_of(pool, [6]) == before
    # generic calls with bad targets
    assert b.set("k", target_location=1234) is False
    assert b.get("k", target_location=bytearray(8), target_sizes=9) is None
    assert b.batch_get(["a", "b"], [bytearray(1)]) == [None, None]
    # a backend used before a pool is registered
    fresh = StorageBackendFactory.create_backend("dynamic", config(unix(d)), pool)
    made.append(fresh)
    assert fresh.batch_set_v1(keys, pool.page_indices([0, 1])) == [False, False]
    assert fresh.batch_exists(keys) == 0


def test_stopped_daemon_gives_false(kv, made):
    d = kv()
    pool = mha_pool(made)
    b = backend(made, config(unix(d)), pool)
    keys = hashes(3, "s")
    assert b.batch_set_v1(keys, pool.page_indices(range(3))) == [True] * 3
    d.stop()
    assert b.batch_exists(keys) == 0
    assert b.batch_get_v1(keys, pool.page_indices([10, 11, 12])) == [False] * 3
    assert b.batch_set_v1(keys, pool.page_indices(range(3))) == [False] * 3
    assert b.exists(keys[0]) is False
    assert b.get("k") is None
    assert b.set("k", b"v") is False
    assert b.batch_set(["k"], [b"v"]) is False
    b.clear()
    assert isinstance(b.get_stats(), dict)
    # constructed while the daemon is down: no exception either
    late = StorageBackendFactory.create_backend("dynamic", config(unix(d)), pool)
    made.append(late)
    late.register_mem_pool_host(pool)
    assert late.batch_exists(keys) == 0


def test_generic_interface(kv, made):
    """interface_v1 0: SGLang's generic path (batch_set of flat pages, batch_get into
    dummy pages, batch_exists over the same keys), plus get/set by address."""
    d = kv()
    pool = mha_pool(made)
    b = backend(made, config(unix(d), v1=False), pool)
    keys = hashes(3, "g")
    flat = [pool.get_data_page(i * PAGE) for i in range(3)]
    assert b.batch_set(keys, flat) is True
    assert b.batch_exists(keys) == 3
    dummies = [np.zeros_like(flat[0]) for _ in keys]
    got = b.batch_get(keys, dummies)
    assert all(g is t for g, t in zip(got, dummies))
    assert all(np.array_equal(x, y) for x, y in zip(dummies, flat))
    assert b.set("blob", b"hello world") is True
    assert b.get("blob") == b"hello world"
    assert b.exists("blob") and not b.exists("nope")
    out = bytearray(11)
    assert b.get("blob", target_location=out) is out and out == b"hello world"
    assert b.get("nope", target_location=bytearray(4)) is None
    b.clear()
    assert b.batch_exists(keys) == 0


def test_tcp_address_round_trip(kv, made):
    d = kv()
    pool = mha_pool(made)
    b = backend(made, config(f"127.0.0.1:{d.port}"), pool)
    keys = hashes(4, "t")
    want = pages_of(pool, range(4))
    assert b.batch_set_v1(keys, pool.page_indices(range(4))) == [True] * 4
    assert b.batch_get_v1(keys, pool.page_indices(range(10, 14))) == [True] * 4
    assert pages_of(pool, range(10, 14)) == want
    assert b.path == "socket"
    stats = b.get_stats()
    assert stats["backup_pgs"] == [4] and stats["prefetch_pgs"] == [4]


@pytest.mark.parametrize("kind", ["mha", "mla"])
@pytest.mark.parametrize("layout", ["page_first", "layer_first", "page_first_direct"])
def test_page_pointers_from_the_model_are_the_pools(kv, made, kind, layout):
    """The adapter asks get_page_buffer_meta for four pages once and computes later
    batches' pointers itself: they must be exactly what the pool gives, for every layout
    and any order of pages (including the first and last of the pool)."""
    d = kv()
    pool = mha_pool(made, layout) if kind == "mha" else mla_pool(made, layout)
    b = backend(made, config(unix(d), mla=kind == "mla"), pool)
    rng = np.random.default_rng(3)
    for pages in ([0], [POOL_PAGES - 1, 0], list(rng.permutation(POOL_PAGES)[:20])):
        idx = pool.page_indices(pages)
        keys = hashes(len(pages))
        got = b._objects(keys, idx)
        assert b._meta, "an affine pool got no model"
        b._meta = False             # ask the pool, as for a pool the model does not fit
        want = b._objects(keys, idx)
        b._meta = None
        assert got[0] == want[0]
        assert (got[1] == want[1]).all() and (got[2] == want[2]).all()


class ShuffledPool(MHATokenToKVPoolHost):
    """A host pool whose pages do not lie in index order (page p at slot (p * 7) % pages):
    the adapter's model cannot fit it, and every batch must ask the pool."""

    def get_page_buffer_meta(self, indices):
        idx = np.asarray(indices)
        pages = idx[::self.page_size] // self.page_size
        moved = np.concatenate([np.arange(self.page_size) + ((p * 7) % self.page_num)
                                * self.page_size for p in pages])
        return super().get_page_buffer_meta(moved)

    def page_bytes(self, p):
        return bytes(self.get_data_page(((p * 7) % self.page_num) * PAGE).view(np.uint8))


def test_a_pool_the_model_does_not_fit_is_asked_every_batch(kv, made):
    d = kv()
    pool = ShuffledPool(LAYERS, HEADS, DIM, PAGE, POOL_PAGES, "page_first",
                        allocator_type="shm")
    made.append(pool)
    pool.fill_random(9)
    b = backend(made, config(unix(d)), pool)
    keys = hashes(8, "shuf")
    src = [1, 2, 3, 5, 8, 13, 21, 34]
    want = [pool.page_bytes(p) for p in src]
    assert b.batch_set_v1(keys, pool.page_indices(src)) == [True] * 8
    assert b._meta is False
    pool.zero()
    dst = [40, 41, 42, 43, 44, 45, 46, 47]
    assert b.batch_get_v1(keys, pool.page_indices(dst)) == [True] * 8
    assert [pool.page_bytes(p) for p in dst] == want
    assert moved(b)[1] == 0         # still zero copy: every pointer is in the pool's memfd


class StrayPool(MHATokenToKVPoolHost):
    """A host pool that gives, for page 0, a V pointer `stray` bytes past where its piece
    would end exactly at the pool's end (so the piece runs past the pool). Page 0 is one
    the adapter probes for its model, so the model does not fit and every batch asks the
    pool; its pointers are checked against the pool's memory each time."""

    stray = 1

    def get_page_buffer_meta(self, indices):
        ptrs, sizes = super().get_page_buffer_meta(indices)
        idx = np.asarray(indices)
        end = self.kv_buffer.ctypes.data + self.kv_buffer.nbytes
        for i, first in enumerate(idx[::self.page_size].tolist()):
            if first == 0:
                ptrs[2 * i + 1] = end - sizes[0] + self.stray
        return ptrs, sizes


@pytest.mark.parametrize("stray", [1, 1 << 20])
def test_a_pointer_outside_the_pool_fails_the_batch(kv, made, stray):
    d = kv()
    pool = StrayPool(LAYERS, HEADS, DIM, PAGE, POOL_PAGES, "page_first",
                     allocator_type="shm")
    pool.stray = stray
    made.append(pool)
    pool.fill_random(4)
    b = backend(made, config(unix(d)), pool)
    keys = hashes(3, "stray")
    assert b.batch_set_v1(keys, pool.page_indices([4, 0, 6])) == [False] * 3
    assert b._meta is False
    assert b.batch_get_v1(keys, pool.page_indices([4, 0, 6])) == [False] * 3
    assert b.batch_exists(keys) == 0
    # batches without page 0 are fine, the last page's V (ending exactly at the pool's
    # end) too, and byte-exact
    want = pages_of(pool, [4, POOL_PAGES - 1])
    assert b.batch_set_v1(keys[:1] + ["last"], pool.page_indices([4, POOL_PAGES - 1])) == \
        [True, True]
    assert b.batch_get_v1(keys[:1] + ["last"], pool.page_indices([7, 8])) == [True, True]
    assert pages_of(pool, [7, 8]) == want
