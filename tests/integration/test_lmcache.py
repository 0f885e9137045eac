"""Integration: kvstashd as LMCache's L2 (kvstash.lmcache, kvstash.lmcache_native).

LMCache cannot be installed here, so the pieces of it the adapters touch are stand-ins
(tests/integration/standins/lmcache: the L2AdapterInterface base class, ObjectKey,
L1MemoryDesc, L2StoreResult, MemoryObj, Bitmap, and how the MP server loads a "plugin" or
"native_plugin" adapter from module_path / class_name / adapter_params). The tests drive the
adapters as LMCache's store and prefetch controllers do: submit a task, wait on its event
fd, collect the result; store, lookup-and-lock and load from two threads at once.

What is checked is what LMCache relies on: loads byte-exact, whichever way the bytes move
(the L1 arena registered with the daemon, or copied through the staging buffer); lookup
bitmaps bit by bit (per key, and the per-object-group prefix mode); what a lookup reports
stays locked until submit_unlock; keys in the daemon byte for byte in LMCache's format;
bad input (sizes that do not match, a missing key, a stopped daemon) as failed bits or a
failed store task, never an exception and never a loaded bit over wrong bytes; the native
connector's futures and drain_completions. No wall-clock bound is asserted: the timeouts
only turn a hang into a failure.
"""

import ctypes
import mmap
import os
import pathlib
import random
import select
import sys
import threading
import time

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "client" / "python"))
sys.path.insert(0, str(ROOT / "tests" / "integration" / "standins" / "lmcache"))

import kvstash  # noqa: E402
from kvstash import buffers  # noqa: E402
from kvstash.lmcache import object_key_to_string  # noqa: E402
from lmcache.v1.distributed.api import ObjectKey  # noqa: E402
from lmcache.v1.distributed.internal_api import L1MemoryDesc  # noqa: E402
from lmcache.v1.distributed.l2_adapters.plugin_l2_adapter import (  # noqa: E402
    create_native_plugin_client, create_plugin_adapter)
from lmcache.v1.memory_management import HostMemoryObj  # noqa: E402

KIB = 1 << 10
MIB = 1 << 20
CHUNK = 64 * KIB
WAIT = 30.0                 # seconds before a task that never completes fails the test
BASE_ARGS = ["--memory_size=256m", "--ssd_dir="]
MODEL = "meta-llama/Llama-3.1-8B"


# ---- L1 arenas, as LMCache's MP server would have them ----

class Arena:
    """nbytes of host memory: 'sealed' (a memfd made with MFD_ALLOW_SEALING: the daemon
    takes it), 'unsealed' (a memfd made with MFD_CLOEXEC alone: today's daemon refuses it,
    a daemon that accepts unsealed descriptors takes it) or 'heap' (private memory: always
    staged)."""

    def __init__(self, kind, nbytes):
        self.kind, self.nbytes = kind, nbytes
        self.fd = None
        if kind == "heap":
            self.mem = (ctypes.c_ubyte * nbytes)()
            self.ptr = ctypes.addressof(self.mem)
            self.view = memoryview(self.mem).cast("B")
        else:
            flags = os.MFD_CLOEXEC | (os.MFD_ALLOW_SEALING if kind == "sealed" else 0)
            self.fd = os.memfd_create(f"lmcache-l1-{kind}", flags)
            os.ftruncate(self.fd, nbytes)
            self.mem = mmap.mmap(self.fd, nbytes, mmap.MAP_SHARED,
                                 mmap.PROT_READ | mmap.PROT_WRITE)
            self.view = memoryview(self.mem)
            self.ptr = buffers.address_of(self.mem)

    def desc(self):
        return L1MemoryDesc(ptr=self.ptr, size=self.nbytes, align_bytes=4096)

    def objects(self, first, count, size=CHUNK):
        return [HostMemoryObj(self.ptr + (first + i) * size, size) for i in range(count)]

    def fill(self, first, count, seed, size=CHUNK):
        data = random.Random(seed).randbytes(count * size)
        self.view[first * size:(first + count) * size] = data
        return [data[i * size:(i + 1) * size] for i in range(count)]

    def chunk(self, i, size=CHUNK):
        return bytes(self.view[i * size:(i + 1) * size])

    def zero(self, first, count, size=CHUNK):
        self.view[first * size:(first + count) * size] = bytes(count * size)


def key(i, group=0, salt="", rank=ObjectKey.ComputeKVRank(1, 0, 1, 0), model=MODEL):
    return ObjectKey(chunk_hash=i.to_bytes(8, "big") + b"\x5a" * 8, model_name=model,
                     kv_rank=rank, object_group_id=group, cache_salt=salt)


# ---- driving an adapter as LMCache's controllers do ----

def _wait_fd(fd, deadline):
    left = deadline - time.monotonic()
    if left <= 0:
        return
    select.select([fd], [], [], min(left, 0.5))
    try:
        os.eventfd_read(fd)
    except (BlockingIOError, OSError):
        pass


def wait_query(fd, query, task_id, what):
    deadline = time.monotonic() + WAIT
    while True:
        r = query(task_id)
        if r is not None:
            return r
        if time.monotonic() > deadline:
            pytest.fail(f"{what} task {task_id} did not complete within {WAIT} s")
        _wait_fd(fd, deadline)


class Driver:
    """One adapter plus the bookkeeping of LMCache's controllers (store results are popped
    all at once, so results of other tasks are kept for their waiters)."""

    def __init__(self, adapter):
        self.a = adapter
        self.stores = {}
        self.lock = threading.Lock()

    def store(self, keys, objs):
        tid = self.a.submit_store_task(keys, objs)
        assert isinstance(tid, int)
        deadline = time.monotonic() + WAIT
        while True:
            with self.lock:
                self.stores.update(self.a.pop_completed_store_tasks())
                if tid in self.stores:
                    return self.stores.pop(tid)
            if time.monotonic() > deadline:
                pytest.fail(f"store task {tid} did not complete")
            _wait_fd(self.a.get_store_event_fd(), deadline)

    def lookup(self, keys, layout=None):
        tid = self.a.submit_lookup_and_lock_task(keys, layout if layout is not None else {})
        return wait_query(self.a.get_lookup_and_lock_event_fd(),
                          self.a.query_lookup_and_lock_result, tid, "lookup")

    def load(self, keys, objs):
        tid = self.a.submit_load_task(keys, objs)
        return wait_query(self.a.get_load_event_fd(), self.a.query_load_result, tid, "load")

    def flush(self):
        """Wait until the fetch worker has run everything submitted before (unlocks)."""
        self.lookup([key(10 ** 9)])


def bits(bm, n):
    return [bm.test(i) for i in range(n)]


@pytest.fixture
def kv(daemons):
    return lambda *args: daemons([*BASE_ARGS, *args])


@pytest.fixture
def adapters():
    made = []

    def make(addr, l1=None, **params):
        cfg = {"type": "plugin", "module_path": "kvstash.lmcache",
               "class_name": "KvstashL2Adapter",
               "adapter_params": {"kvstash_addr": addr, "timeout": 10.0, **params}}
        a = create_plugin_adapter(cfg, l1_memory_desc=l1)
        made.append(a)
        return Driver(a)

    yield make
    for a in made:
        a.close()


@pytest.fixture
def raw():
    made = []

    def make(addr):
        c = kvstash.Client(addr, timeout=20.0)
        made.append(c)
        return c

    yield make
    for c in made:
        c.close()


# ---- keys ----

def test_key_format_is_lmcaches_byte_for_byte(kv, adapters, raw):
    """<model>@<kv_rank, 8 hex digits>@<group, hex>@<chunk hash, hex>[@salt], the string
    LMCache's native connectors store under; the daemon holds exactly that key."""
    rank = ObjectKey.ComputeKVRank(4, 1, 4, 1)
    k = ObjectKey(chunk_hash=bytes.fromhex("00ff10"), model_name="meta-llama/Llama-3-8B",
                  kv_rank=rank, object_group_id=10)
    assert object_key_to_string(k) == "meta-llama/Llama-3-8B@04010401@a@00ff10"
    ks = ObjectKey(chunk_hash=bytes.fromhex("00ff10"), model_name="meta-llama/Llama-3-8B",
                   kv_rank=rank, object_group_id=10, cache_salt="user-7")
    assert object_key_to_string(ks) == "meta-llama/Llama-3-8B@04010401@a@00ff10@user-7"

    d = kv()
    arena = Arena("sealed", 2 * CHUNK)
    data = arena.fill(0, 2, seed=1)
    drv = adapters(d.unix_path, arena.desc())
    assert drv.store([k, ks], arena.objects(0, 2)).is_successful()
    c = raw(d.unix_path)
    assert c.get(b"meta-llama/Llama-3-8B@04010401@a@00ff10") == data[0]
    assert c.get(b"meta-llama/Llama-3-8B@04010401@a@00ff10@user-7") == data[1]


# ---- round trips through both memory paths ----

@pytest.mark.parametrize("kind", ["sealed", "heap", "unsealed"])
def test_store_lookup_load_128_chunks(kv, adapters, raw, kind):
    """128 chunks of 64 KiB: stored, all found and locked, loaded byte-exact into other L1
    objects. A sealed memfd arena moves with no copy, a heap arena through the staging
    buffer; an unsealed memfd either way (registered when the daemon accepts it). Same
    bytes whichever path."""
    n = 128
    d = kv()
    arena = Arena(kind, 2 * n * CHUNK)
    data = arena.fill(0, n, seed=2)
    drv = adapters(d.unix_path, arena.desc())
    keys = [key(i) for i in range(n)]
    res = drv.store(keys, arena.objects(0, n))
    assert res.is_successful() and res.bytes_transferred() == n * CHUNK

    bm = drv.lookup(keys)
    assert bits(bm, n) == [True] * n
    arena.zero(n, n)
    bm = drv.load(keys, arena.objects(n, n))
    assert bits(bm, n) == [True] * n
    for i in range(n):
        assert arena.chunk(n + i) == data[i], f"chunk {i}"
    drv.a.submit_unlock(keys)
    drv.flush()

    st = drv.a.report_status()
    assert st["is_healthy"] is True
    if kind == "sealed":
        assert st["l1_path"] == "shm" and st["staged_bytes"] == 0
    elif kind == "heap":
        assert st["l1_path"] == "staging" and st["zero_copy_bytes"] == 0
    else:
        assert st["l1_path"] in ("shm", "staging")
    c = raw(d.unix_path)
    assert c.batch_is_exist([object_key_to_string(k) for k in keys]) == [True] * n
    assert c.stats()["pinned_soft"] == 0


def test_an_arena_the_daemon_dropped_is_registered_again(kv, adapters, raw):
    """An unsealed L1 arena cut (truncated) under a store and made whole again: that store
    fails and stores nothing, the daemon drops the arena's buffer, and the next store
    registers it again: no copy, byte-exact."""
    n = 8
    d = kv()
    arena = Arena("unsealed", 2 * n * CHUNK)
    drv = adapters(d.unix_path, arena.desc())
    arena.fill(0, n, seed=5)
    assert drv.store([key(i) for i in range(n)], arena.objects(0, n)).is_successful()
    if drv.a.report_status()["l1_path"] != "shm":
        pytest.skip("this daemon does not take unsealed memfds")
    cut = [key(100 + i) for i in range(n)]
    os.ftruncate(arena.fd, 0)           # the arena must not be touched until it is whole
    assert not drv.store(cut, arena.objects(0, n)).is_successful()
    os.ftruncate(arena.fd, arena.nbytes)
    c = raw(d.unix_path)
    assert c.batch_is_exist([object_key_to_string(k) for k in cut]) == [False] * n
    data = arena.fill(0, n, seed=6)
    assert drv.store(cut, arena.objects(0, n)).is_successful()
    bm = drv.load(cut, arena.objects(n, n))
    assert bits(bm, n) == [True] * n
    assert [arena.chunk(n + i) for i in range(n)] == data
    st = drv.a.report_status()
    assert st["l1_path"] == "shm" and st["staged_bytes"] == 0


def test_objects_outside_the_registered_arena(kv, adapters, raw):
    """A batch with one object outside the registered L1 arena (private memory) or
    straddling its end (into memory past what l1_memory_desc names) goes piece by piece:
    the arena's objects with no copy, the others through the staging buffer; same bytes.
    One ending exactly at the arena's end is in it."""
    n = 6
    d = kv()
    arena = Arena("sealed", (2 * n + 1) * CHUNK)
    heap = Arena("heap", 2 * CHUNK)
    desc = L1MemoryDesc(ptr=arena.ptr, size=2 * n * CHUNK, align_bytes=4096)
    drv = adapters(d.unix_path, desc)
    data = arena.fill(0, n, seed=11)
    hdata = heap.fill(0, 1, seed=12)
    keys = [key(200 + i) for i in range(n + 1)]
    assert drv.store(keys, arena.objects(0, n) + heap.objects(0, 1)).is_successful()
    st = drv.a.report_status()
    assert (st["zero_copy_bytes"], st["staged_bytes"]) == (n * CHUNK, CHUNK)
    # loads: the last arena object ends exactly at its end; the heap one lands in private
    # memory; the straddling one is half in, half past the arena
    arena.zero(0, 2 * n + 1)
    dst = arena.objects(n, n) + heap.objects(1, 1)
    assert bits(drv.load(keys, dst), n + 1) == [True] * (n + 1)
    assert [arena.chunk(n + i) for i in range(n)] == data and heap.chunk(1) == hdata[0]
    st = drv.a.report_status()
    assert (st["zero_copy_bytes"], st["staged_bytes"]) == (2 * n * CHUNK, 2 * CHUNK)
    straddle = HostMemoryObj(arena.ptr + 2 * n * CHUNK - CHUNK // 2, CHUNK)
    assert bits(drv.load(keys[:1], [straddle]), 1) == [True]
    half = CHUNK // 2
    assert bytes(arena.view[2 * n * CHUNK - half:(2 * n + 1) * CHUNK - half]) == data[0]
    st = drv.a.report_status()
    assert st["staged_bytes"] == 3 * CHUNK and st["is_healthy"] is True


def test_tcp_address_round_trip(kv, adapters):
    """Over TCP the values go through the socket; same results."""
    d = kv()
    arena = Arena("heap", 8 * CHUNK)
    data = arena.fill(0, 4, seed=3)
    drv = adapters(f"127.0.0.1:{d.port}", arena.desc(), lock="none")
    keys = [key(i) for i in range(4)]
    assert drv.store(keys, arena.objects(0, 4)).is_successful()
    assert bits(drv.lookup(keys + [key(99)]), 5) == [True] * 4 + [False]
    assert bits(drv.load(keys, arena.objects(4, 4)), 4) == [True] * 4
    assert [arena.chunk(4 + i) for i in range(4)] == data


# ---- lookups: bit by bit, prefixes, locks ----

def test_lookup_bits_per_key_and_prefix(kv, adapters, raw):
    d = kv()
    arena = Arena("sealed", 16 * CHUNK)
    arena.fill(0, 12, seed=4)
    present = [i for i in range(12) if i not in (4, 7)]
    per_key = adapters(d.unix_path, arena.desc())
    assert per_key.store([key(i) for i in present],
                         arena.objects(0, 12)[:len(present)]).is_successful()
    keys = [key(i) for i in range(12)]

    bm = per_key.lookup(keys)
    assert bits(bm, 12) == [i in present for i in range(12)]
    c = raw(d.unix_path)
    assert c.stats()["pinned_soft"] == len(present)
    per_key.a.submit_unlock(keys)           # unlocking keys never locked is harmless
    per_key.flush()
    assert c.stats()["pinned_soft"] == 0

    prefix = adapters(d.unix_path, arena.desc(), lookup="prefix")
    bm = prefix.lookup(keys)
    assert bits(bm, 12) == [i < 4 for i in range(12)]
    assert c.stats()["pinned_soft"] == 4    # only what it reported is locked
    prefix.a.submit_unlock(keys[:4])
    prefix.flush()
    assert c.stats()["pinned_soft"] == 0

    # two object groups (group-major, as LMCache orders them): a prefix per group
    g1 = [key(i, group=1) for i in range(6)]
    assert per_key.store([g1[0], g1[1], g1[3]], arena.objects(0, 3)).is_successful()
    both = [key(i) for i in range(4)] + g1
    bm = prefix.lookup(both)
    assert bits(bm, 10) == [True] * 4 + [True, True, False, False, False, False]
    prefix.a.submit_unlock(both)
    prefix.flush()

    # the layout argument in any of the forms LMCache's versions pass
    for layout_args in ((), (None,), ({0: object()},), (object(),)):
        tid = prefix.a.submit_lookup_and_lock_task(keys[:2], *layout_args)
        bm = wait_query(prefix.a.get_lookup_and_lock_event_fd(),
                        prefix.a.query_lookup_and_lock_result, tid, "lookup")
        assert bits(bm, 2) == [True, True]
        assert prefix.a.query_lookup_and_lock_result(tid) is None   # handed out once
        prefix.a.submit_unlock(keys[:2])
    prefix.flush()
    assert c.stats()["pinned_soft"] == 0


def test_locks_count_and_modes(kv, adapters, raw):
    d = kv("--lease_ttl_ms=10s")
    arena = Arena("sealed", 4 * CHUNK)
    arena.fill(0, 2, seed=5)
    keys = [key(0), key(1)]
    drv = adapters(d.unix_path, arena.desc())
    assert drv.store(keys, arena.objects(0, 2)).is_successful()
    c = raw(d.unix_path)

    drv.lookup(keys)
    drv.lookup(keys)                        # two lookups hold them twice
    drv.a.submit_unlock(keys)
    drv.flush()
    assert c.stats()["pinned_soft"] == 2    # one hold left
    drv.a.submit_unlock(keys)
    drv.flush()
    assert c.stats()["pinned_soft"] == 0

    hard = adapters(d.unix_path, arena.desc(), lock="hard")
    assert bits(hard.lookup(keys), 2) == [True, True]
    assert c.stats()["pinned_hard"] == 2
    hard.a.submit_unlock(keys)
    hard.flush()
    assert c.stats()["pinned_hard"] == 0

    lease = adapters(d.unix_path, arena.desc(), lock="lease")
    assert bits(lease.lookup(keys), 2) == [True, True]
    with pytest.raises(kvstash.Error) as e:  # leased: a plain remove is refused
        c.remove(object_key_to_string(keys[0]))
    assert e.value.code == kvstash.BUSY

    # close() lets go of what LMCache never unlocked
    drv.lookup(keys)
    assert c.stats()["pinned_soft"] == 2
    drv.a.close()
    assert c.stats()["pinned_soft"] == 0


# ---- the two controllers at once ----

def test_store_and_prefetch_controllers_concurrently(kv, adapters):
    """A store thread stores 16 batches of 8 chunks while a prefetch thread looks up all
    128, loads what its lookup locked and unlocks it, again and again. Every key a lookup
    reported loads, byte-exact; in the end all 128 are found."""
    n, batch = 128, 8
    d = kv()
    arena = Arena("sealed", 2 * n * CHUNK)
    data = arena.fill(0, n, seed=6)
    drv = adapters(d.unix_path, arena.desc())
    keys = [key(i, salt="c") for i in range(n)]
    errors = []
    stored = threading.Event()

    def store_controller():
        try:
            for b in range(0, n, batch):
                r = drv.store(keys[b:b + batch], arena.objects(b, batch))
                if not r.is_successful():
                    errors.append(f"store batch {b} failed")
        except BaseException as e:
            errors.append(repr(e))
        finally:
            stored.set()

    rounds = []

    def prefetch_controller():
        try:
            for _ in range(5000):
                bm = drv.lookup(keys)
                found = [i for i in range(n) if bm.test(i)]
                if found:
                    # each round loads into its own scratch half of the arena
                    arena.zero(n, n)
                    objs = [HostMemoryObj(arena.ptr + (n + i) * CHUNK, CHUNK) for i in found]
                    lb = drv.load([keys[i] for i in found], objs)
                    for j, i in enumerate(found):
                        if not lb.test(j):
                            errors.append(f"key {i} locked by the lookup did not load")
                        elif arena.chunk(n + i) != data[i]:
                            errors.append(f"key {i} loaded wrong bytes")
                    drv.a.submit_unlock([keys[i] for i in found])
                rounds.append(len(found))
                if len(found) == n and stored.is_set():
                    return
        except BaseException as e:
            errors.append(repr(e))

    ts = [threading.Thread(target=store_controller), threading.Thread(target=prefetch_controller)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(120)
    assert not any(t.is_alive() for t in ts), "a controller thread hung"
    assert errors == []
    assert rounds and rounds[-1] == n


# ---- bad input: failed bits, never an exception, never wrong bytes ----

def test_bad_input_fails_bits(kv, adapters, raw):
    d = kv()
    arena = Arena("sealed", 16 * CHUNK)
    data = arena.fill(0, 4, seed=7)
    drv = adapters(d.unix_path, arena.desc())
    keys = [key(i) for i in range(4)]
    assert drv.store(keys, arena.objects(0, 4)).is_successful()

    # keys and objects of different lengths: the task fails, nothing raises
    assert not drv.store([key(50), key(51)], arena.objects(8, 1)).is_successful()
    bm = drv.load(keys, arena.objects(8, 3))
    assert bits(bm, 4) == [False] * 4
    # an object at address 0
    assert not drv.store([key(52)], [HostMemoryObj(0, CHUNK)]).is_successful()

    # a load buffer smaller or larger than the value: a failed bit, not a partial "hit"
    small = HostMemoryObj(arena.ptr + 8 * CHUNK, CHUNK - 1)
    large = HostMemoryObj(arena.ptr + 9 * CHUNK, CHUNK + 1)
    good = HostMemoryObj(arena.ptr + 11 * CHUNK, CHUNK)
    missing = HostMemoryObj(arena.ptr + 12 * CHUNK, CHUNK)
    bm = drv.load([keys[0], keys[1], keys[2], key(77)], [small, large, good, missing])
    assert bits(bm, 4) == [False, False, True, False]
    assert arena.chunk(11) == data[2]
    assert drv.a.report_status()["errors"] >= 2

    # a stopped daemon: failed store, all-zero bitmaps, unhealthy status; no exception
    d.stop()
    assert not drv.store([key(60)], arena.objects(0, 1)).is_successful()
    assert bits(drv.lookup(keys), 4) == [False] * 4
    assert bits(drv.load(keys, arena.objects(8, 4)), 4) == [False] * 4
    drv.a.submit_unlock(keys)
    drv.flush()
    st = drv.a.report_status()
    assert st["is_healthy"] is False and st["last_error"]


@pytest.mark.parametrize("daemon", ["whole", "older"])
def test_loads_take_exact_sizes_only(kv, adapters, raw, monkeypatch, daemon):
    """A load reads each object with batch_get_into's whole option: exact sizes load, a
    value longer or shorter than its object is a failed bit, and a longer one writes
    nothing. Against a daemon that refuses the option (as one before it does) the adapter
    offers a scratch byte past each object instead: same bits, the longer value's prefix
    may then be written."""
    if daemon == "older":
        real = kvstash.Client.batch_get_into

        def old_daemon(self, keys, pieces, *, whole=False):
            if whole:
                raise kvstash.Error(kvstash.INVALID_ARGUMENT, None, "wrong number of params")
            return real(self, keys, pieces)
        monkeypatch.setattr(kvstash.Client, "batch_get_into", old_daemon)
    d = kv()
    arena = Arena("sealed", 16 * CHUNK)
    drv = adapters(d.unix_path, arena.desc())
    data = arena.fill(0, 3, seed=21)
    c = raw(d.unix_path)
    keys = [key(300 + i) for i in range(3)]
    assert drv.store(keys[:1], arena.objects(0, 1)).is_successful()
    c.put(object_key_to_string(keys[1]), data[1] + b"+")       # one byte longer
    c.put(object_key_to_string(keys[2]), data[2][:-1])          # one byte shorter
    sentinel = b"\xa5" * CHUNK
    for i in range(8, 11):
        arena.view[i * CHUNK:(i + 1) * CHUNK] = sentinel
    bm = drv.load(keys, arena.objects(8, 3))
    assert bits(bm, 3) == [True, False, False]
    assert arena.chunk(8) == data[0]
    if daemon == "whole":
        assert arena.chunk(9) == sentinel, "a value longer than its object was written"
    assert drv.a._whole is (daemon == "whole")


def test_unreachable_daemon_at_start(work, adapters):
    """Built while the daemon is not there: no exception; tasks fail."""
    drv = adapters(os.path.join(work, "nobody.sock"), None)
    arena = Arena("heap", 2 * CHUNK)
    assert not drv.store([key(1)], arena.objects(0, 1)).is_successful()
    assert bits(drv.lookup([key(1)]), 1) == [False]
    assert drv.a.report_status()["is_healthy"] is False


def test_delete_and_usage(kv, adapters, raw):
    d = kv()
    arena = Arena("sealed", 8 * CHUNK)
    arena.fill(0, 4, seed=8)
    drv = adapters(d.unix_path, arena.desc())
    keys = [key(i, salt="tenant-a") for i in range(4)]
    assert drv.store(keys, arena.objects(0, 4)).is_successful()
    assert drv.store(keys[:2], arena.objects(0, 2)).is_successful()  # already there: ok
    u = drv.a.get_usage()
    assert u.total_bytes_used == 4 * CHUNK and dict(u.bytes_by_cache_salt) == {
        "tenant-a": 4 * CHUNK}
    drv.a.delete(keys[:2])
    assert drv.a.get_usage().total_bytes_used == 2 * CHUNK
    c = raw(d.unix_path)
    assert c.batch_is_exist([object_key_to_string(k) for k in keys]) == [False, False,
                                                                          True, True]
    assert bits(drv.lookup(keys), 4) == [False, False, True, True]
    drv.a.submit_unlock(keys)


# ---- the native_plugin connector (libkvstash's async API through ctypes) ----

def native_lib():
    from kvstash import lmcache_native
    try:
        lmcache_native.find_library()
    except OSError as e:
        pytest.skip(f"{e}")


@pytest.fixture
def natives():
    made = []

    def make(addr, **params):
        native_lib()
        c = create_native_plugin_client({"type": "native_plugin",
                                         "module_path": "kvstash.lmcache_native",
                                         "class_name": "KvstashNativeConnector",
                                         "adapter_params": {"kvstash_addr": addr, **params}})
        made.append(c)
        return c

    yield make
    for c in made:
        c.close()


def wait_futures(conn, fids):
    """drain_completions until every future in fids has completed: {fid: (ok, err, bools)}."""
    want, got = set(fids), {}
    deadline = time.monotonic() + WAIT
    while want - set(got):
        if time.monotonic() > deadline:
            pytest.fail(f"futures {sorted(want - set(got))} never completed")
        select.select([conn.event_fd()], [], [], 0.5)
        for fid, ok, err, per_key in conn.drain_completions():
            assert fid not in got, f"future {fid} completed twice"
            got[fid] = (ok, err, list(per_key) if per_key is not None else None)
    return got


def sealed_views(n, size):
    fd = os.memfd_create("native-bufs", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    os.ftruncate(fd, n * size)
    mm = mmap.mmap(fd, n * size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
    mv = memoryview(mm)
    return fd, mm, [mv[i * size:(i + 1) * size] for i in range(n)]


@pytest.mark.parametrize("memory", ["sealed", "bytearray"])
def test_native_connector_round_trip(kv, natives, raw, memory):
    n = 32
    d = kv()
    conn = natives(d.unix_path)
    keys = [object_key_to_string(key(i)) for i in range(n)]
    data = [random.Random(i).randbytes(CHUNK) for i in range(n)]
    if memory == "sealed":
        fd, mm, src = sealed_views(n, CHUNK)
        _fd2, _mm2, dst = sealed_views(n, CHUNK)
        for v, b in zip(src, data):
            v[:] = b
    else:
        src = [bytearray(b) for b in data]
        dst = [bytearray(CHUNK) for _ in range(n)]

    fset = conn.submit_batch_set(keys, src)
    fexist = conn.submit_batch_exists(keys + ["nope@00000000@0@00"])
    fget = conn.submit_batch_get(keys, dst)
    assert len({fset, fexist, fget}) == 3
    got = wait_futures(conn, [fset, fexist, fget])
    assert got[fset] == (True, "", [True] * n)
    assert got[fexist] == (True, "", [True] * n + [False])
    assert got[fget] == (True, "", [True] * n)
    assert [bytes(b) for b in dst] == data
    assert raw(d.unix_path).get(keys[5]) == data[5]
    counts = conn.path_counts
    if memory == "sealed":
        assert counts["zero_copy"] > 0 and counts["staged"] == 0
    else:
        assert counts["staged"] > 0 and counts["zero_copy"] == 0

    # a buffer of the wrong size, a missing key: False, and no bytes claimed
    short, long_, ok = bytearray(CHUNK - 1), bytearray(CHUNK + 1), bytearray(CHUNK)
    f = conn.submit_batch_get([keys[0], keys[1], keys[2], "missing"],
                              [short, long_, ok, bytearray(CHUNK)])
    assert wait_futures(conn, [f])[f][2] == [False, False, True, False]
    assert bytes(ok) == data[2]
    f = conn.submit_batch_get(keys[:2], [bytearray(CHUNK)])     # lengths differ
    res = wait_futures(conn, [f])[f]
    assert res[0] is False and res[1] and res[2] == [False, False]

    fdel = conn.submit_batch_delete(keys[:4])
    fex = conn.submit_batch_exists(keys[:6])
    got = wait_futures(conn, [fdel, fex])
    assert got[fdel] == (True, "", [True] * 4)
    assert got[fex][2] == [False] * 4 + [True, True]


def test_native_connector_stopped_daemon(kv, natives):
    d = kv()
    conn = natives(d.unix_path)
    keys = [f"m@00000000@0@{i:04x}" for i in range(4)]
    f = conn.submit_batch_set(keys, [bytearray(b"x" * 100)] * 4)
    assert wait_futures(conn, [f])[f][0] is True
    d.stop()
    fids = [conn.submit_batch_get(keys, [bytearray(100) for _ in keys]),
            conn.submit_batch_exists(keys),
            conn.submit_batch_set(keys, [bytearray(100)] * 4),
            conn.submit_batch_delete(keys)]
    got = wait_futures(conn, fids)
    for fid in fids:
        ok, err, per_key = got[fid]
        assert ok is False and isinstance(err, str) and err
        assert per_key == [False] * 4


def test_native_connector_threads_as_lmcache_drives_it(kv, natives):
    """As LMCache's NativeConnectorL2Adapter uses it: a store thread and a prefetch thread
    submit at once, one demux thread polls event_fd and drains. Every future completes
    once; every get of a key that was set returns its bytes."""
    d = kv()
    conn = natives(d.unix_path, depth=8)
    results, events, lock = {}, {}, threading.Lock()
    stop = threading.Event()

    def demux():
        import select as sel
        p = sel.poll()
        p.register(conn.event_fd(), sel.POLLIN)
        while not stop.is_set():
            p.poll(200)
            for fid, ok, err, per_key in conn.drain_completions():
                with lock:
                    assert fid not in results, f"future {fid} completed twice"
                    results[fid] = (ok, err, list(per_key))
                    ev = events.setdefault(fid, threading.Event())
                ev.set()

    def wait(fid):
        with lock:
            ev = events.setdefault(fid, threading.Event())
        assert ev.wait(WAIT), f"future {fid} never completed"
        with lock:
            return results[fid]

    value = {i: random.Random(i).randbytes(4 * KIB + i) for i in range(160)}
    name = {i: f"{MODEL}@00000000@0@{i:08x}" for i in value}
    done_upto = [0]
    errors = []

    def store():
        try:
            for b in range(0, 160, 8):
                r = wait(conn.submit_batch_set([name[i] for i in range(b, b + 8)],
                                               [bytearray(value[i]) for i in range(b, b + 8)]))
                if r[:2] != (True, "") or r[2] != [True] * 8:
                    errors.append(f"set {b}: {r}")
                done_upto[0] = b + 8
        except BaseException as e:
            errors.append(repr(e))

    def prefetch():
        try:
            for _ in range(2000):
                upto = done_upto[0]
                if upto:
                    ids = list(range(max(0, upto - 16), upto))
                    bufs = [bytearray(len(value[i])) for i in ids]
                    ex = wait(conn.submit_batch_exists([name[i] for i in ids]))
                    r = wait(conn.submit_batch_get([name[i] for i in ids], bufs))
                    if ex[2] != [True] * len(ids) or r[2] != [True] * len(ids):
                        errors.append(f"prefetch {ids[0]}..: {ex} {r}")
                    for i, b in zip(ids, bufs):
                        if bytes(b) != value[i]:
                            errors.append(f"key {i}: wrong bytes")
                if upto == 160:
                    return
        except BaseException as e:
            errors.append(repr(e))

    dm = threading.Thread(target=demux)
    dm.start()
    ts = [threading.Thread(target=store), threading.Thread(target=prefetch)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(120)
    stop.set()
    dm.join(10)
    assert not any(t.is_alive() for t in ts + [dm]), "a thread hung"
    assert errors == []
    assert done_upto[0] == 160
