"""kvstash.lmcache: kvstashd as an L2 of LMCache's multiprocess (MP) server.

This module owns KvstashL2Adapter, an LMCache L2AdapterInterface loaded by LMCache's
"plugin" adapter type:

    --l2-adapter '{"type": "plugin", "module_path": "kvstash.lmcache",
                   "class_name": "KvstashL2Adapter",
                   "adapter_params": {"kvstash_addr": "unix:/run/kvstash/kvstashd.sock"}}'

and the key format LMCache's own native connectors store objects under
(object_key_to_string). It must never let an exception reach LMCache's controller
threads: a failure is a failed store task, a 0 bit, or a status field.

Threads. LMCache's store and prefetch controllers call submit_* / query_* / pop_* from
their own threads; those calls only queue work and read results (one lock, self._lock,
held for dict operations only). Two worker threads of ours do the I/O, each with its own
kvstash.Client: "store" runs store tasks in order; "fetch" runs lookups, loads, unlocks and
deletes in order (so an unlock submitted after a load runs after it). A finished task's
result is put in its dict under self._lock, then its eventfd is written.

Memory. LMCache hands us MemoryObjs inside its L1 arena (l1_memory_desc). When that arena
lies in a shared mapping of a file the daemon accepts (a memfd sealed against shrinking,
today), each worker registers it once and values move with no copy; otherwise they are
copied through each client's registered staging buffer (one memcpy). Which path was taken
is logged once. Results are the same either way.
"""

import ctypes
import logging
import os
import queue
import threading
import time

import numpy as np

from . import buffers
from .client import Client, refuses_whole
from .iovs import Iovs
from .errors import (BUSY, EXISTS, INVALID_ARGUMENT, NOT_FOUND, OK, UNAVAILABLE, ConnectionLost,
                     Error)

from lmcache.v1.distributed.l2_adapters.base import L2AdapterInterface

try:
    from lmcache.lmcache_native import Bitmap
except ImportError:                         # LMCache before the lmcache_native rename
    from lmcache.native_storage_ops import Bitmap

try:
    from lmcache.v1.distributed.internal_api import L2StoreResult
except ImportError:                         # LMCache whose store results are plain bools
    L2StoreResult = None

log = logging.getLogger("kvstash.lmcache")

_KEY_SEP = "@"
_SCRATCH = 1 << 16          # one overflow byte per key of a load: at most this many keys
_RECONNECT_GAP = 1.0        # seconds between attempts to reach a daemon that was lost
_PENDING_UNPINS = 1 << 20   # keys whose unpin waits for the daemon again, at most


def object_key_to_string(key):
    """LMCache's serialized ObjectKey, byte for byte as its native connectors and FS adapter
    write it: <model_name>@<kv_rank as 8 hex digits>@<object_group_id in hex>@<chunk_hash
    in hex>, then @<cache_salt> when the salt is not empty."""
    s = (f"{key.model_name}{_KEY_SEP}{key.kv_rank:08x}{_KEY_SEP}{key.object_group_id:x}"
         f"{_KEY_SEP}{bytes(key.chunk_hash).hex()}")
    if key.cache_salt:
        s += _KEY_SEP + key.cache_salt
    return s


def _eventfd():
    return os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)


def _obj_piece(obj):
    """(address, size) of a MemoryObj: data_ptr (a property in LMCache, a method in some
    versions) and get_size()."""
    size = int(obj.get_size())
    ptr = obj.data_ptr
    if callable(ptr):
        ptr = ptr()
    return int(ptr), size


def _view(obj):
    """A writable byte view of a MemoryObj's memory (for the socket path)."""
    ptr, size = _obj_piece(obj)
    if size <= 0 or ptr <= 0:
        raise Error(INVALID_ARGUMENT, None, f"a memory object of {size} bytes at {ptr:#x}")
    return memoryview((ctypes.c_ubyte * size).from_address(ptr)).cast("B")


class _Worker:
    """One thread and its own Client; jobs run in submission order. A job is fn(client),
    where client is None when the daemon cannot be reached (the job then fails its keys)."""

    def __init__(self, adapter, name):
        self.adapter = adapter
        self.name = name
        self.q = queue.Queue()
        self.client = None
        self.l1 = None              # (Buffer, file offset of the arena's first byte) or None
        self.scratch = None         # a registered buffer for loads' overflow bytes
        self.down = False           # the last attempt to connect failed
        self.next_try = 0.0
        self.thread = threading.Thread(target=self._run, name=f"kvstash-lmcache-{name}",
                                       daemon=True)
        self.thread.start()

    def submit(self, fn):
        self.q.put(fn)

    def stop(self):
        self.q.put(None)

    def _connect(self):
        if self.client is not None and not self.client.closed:
            return self.client
        self.drop()
        now = time.monotonic()
        if now < self.next_try:
            self.down = True                # lost, and too soon to try again
            return None
        self.next_try = now + _RECONNECT_GAP
        a = self.adapter
        try:
            c = Client(a.addr, timeout=a.timeout, tenant=a.tenant, token=a.token,
                       auto_register=False, staging_size=a.staging_size)
        except Exception as e:
            self.down = True
            a._note_error(f"{self.name}: cannot reach kvstashd at {a.addr}: {e}")
            return None
        self.client, self.down = c, False
        self.l1 = a._register_l1(c, self.name)
        a._retry_unpins(c)
        return c

    def drop(self):
        c, self.client, self.l1 = self.client, None, None
        if c is not None:
            try:
                c.close()
            except Exception:
                pass

    def _run(self):
        while True:
            fn = self.q.get()
            if fn is None:
                break
            try:
                client = self._connect()
            except Exception as e:              # lost while registering: the job still runs
                self.adapter._note_error(f"{self.name}: {type(e).__name__}: {e}")
                self.drop()
                client = None
            try:
                fn(client)                      # records its task's result whatever happens
            except Exception as e:              # a job never kills the worker
                self.adapter._note_error(f"{self.name}: {type(e).__name__}: {e}")
        self.drop()


class KvstashL2Adapter(L2AdapterInterface):
    """LMCache L2 adapter over kvstashd. Built by LMCache as
    KvstashL2Adapter(adapter_params, l1_memory_desc=...). adapter_params (a dict):

    kvstash_addr (or addr): the daemon, "unix:/path" (zero copy needs the Unix socket),
        a path, or "host:port". Default "unix:/run/kvstash/kvstashd.sock".
    lock: how a lookup keeps what it reports until the load: "pin" (default; a soft pin,
        evicted only after every unpinned object, released by submit_unlock), "hard" (a
        hard pin, never evicted until unlocked), "lease" (the daemon's lease, lease_ttl_ms,
        Unix socket only; unlock has nothing to release), "none".
    lookup: "per_key" (default: bit i says whether key i exists, as LMCache's adapters
        answer; its controller keeps the leading run) or "prefix" (bits stop at the first
        missing key of each object group, and only those are locked).
    timeout: seconds the daemon may make no progress before a call fails (default 30).
    staging_mb: each worker's staging buffer, for memory that cannot be registered (64).
    durable: stores wait for the SSD tier (default false).
    tenant, token: authenticate with hello.
    max_capacity_gb: > 0 lets LMCache's own eviction delete from us at that usage
        (default 0: kvstashd evicts on its own).
    """

    def __init__(self, config=None, l1_memory_desc=None, **kwargs):
        params = dict(config) if isinstance(config, dict) else dict(vars(config or {}))
        params.update(kwargs)
        cap = int(float(params.get("max_capacity_gb", 0) or 0) * (1 << 30))
        try:
            super().__init__(max_capacity_bytes=cap)
        except TypeError:                   # LMCache whose base takes no arguments
            super().__init__()
        self.addr = str(params.get("kvstash_addr") or params.get("addr")
                        or "unix:/run/kvstash/kvstashd.sock")
        self.lock_mode = str(params.get("lock", "pin"))
        if self.lock_mode not in ("pin", "hard", "lease", "none"):
            raise ValueError(f"kvstash: lock must be pin, hard, lease or none, not "
                             f"{self.lock_mode!r}")
        self.lookup_mode = str(params.get("lookup", "per_key"))
        if self.lookup_mode not in ("per_key", "prefix"):
            raise ValueError(f"kvstash: lookup must be per_key or prefix, not "
                             f"{self.lookup_mode!r}")
        self.timeout = float(params.get("timeout", 30.0))
        self.staging_size = int(float(params.get("staging_mb", 64)) * (1 << 20))
        self.durable = bool(params.get("durable", False))
        self.tenant = params.get("tenant")
        self.token = params.get("token")
        self.l1_memory_desc = l1_memory_desc

        self._lock = threading.Lock()
        self._next_id = 0
        self._stores = {}
        self._lookups = {}
        self._loads = {}
        self._locks = {}            # key string -> lookups holding it (pin / hard modes)
        self._pending_unpins = []   # key strings whose unpin failed: retried on reconnect
        self._sizes = {}            # ObjectKey -> bytes, for delete's accounting
        self._path_logged = False
        self._whole = True          # the daemon takes batch_get_into's opts.whole
        self.l1_path = None         # "shm" or "staging", once a worker has decided
        self.last_error = None
        self.errors = 0
        self.zero_copy_bytes = 0
        self.staged_bytes = 0
        self._closed = False

        self._store_efd = _eventfd()
        self._lookup_efd = _eventfd()
        self._load_efd = _eventfd()
        self._store_worker = _Worker(self, "store")
        self._fetch_worker = _Worker(self, "fetch")

    # ---- event fds ----

    def get_store_event_fd(self):
        return self._store_efd

    def get_lookup_and_lock_event_fd(self):
        return self._lookup_efd

    def get_load_event_fd(self):
        return self._load_efd

    # ---- plumbing ----

    def _task_id(self):
        with self._lock:
            self._next_id += 1
            return self._next_id

    def _signal(self, efd):
        try:
            os.eventfd_write(efd, 1)
        except OSError:
            pass                    # closed by close(): nobody is waiting any more

    def _note_error(self, msg):
        self.errors += 1
        if msg != self.last_error:
            log.warning("kvstash: %s", msg)
        self.last_error = msg

    def _register_l1(self, client, who):
        """Register the L1 arena on client when it lies in a shared file mapping the daemon
        accepts: (Buffer, file offset of the arena's start), else None (staging copy)."""
        d = self.l1_memory_desc
        path, why, out = "staging", "", None
        if d is None or not getattr(d, "ptr", 0) or not getattr(d, "size", 0):
            why = "no l1_memory_desc"
        elif not client.is_unix:
            why = "not a Unix-socket connection"
        else:
            try:
                mp = buffers.find_mapping(buffers.read_maps(), int(d.ptr), int(d.size))
                if mp is None:
                    why = "the L1 arena is not one shared mapping of a file"
                else:
                    buf = client.register_memory(int(d.ptr))
                    out = (buf, mp.offset + (int(d.ptr) - mp.start))
                    path = "shm"
            except Error as e:
                if e.code != INVALID_ARGUMENT:
                    raise
                why = e.message
            except OSError as e:
                why = str(e)
        with self._lock:
            first = not self._path_logged
            self._path_logged = True
            self.l1_path = path
        if first:
            if path == "shm":
                log.info("kvstash: L1 arena registered (%d bytes): zero copy", int(d.size))
            else:
                log.info("kvstash: L1 arena copied through the staging buffer (%s)", why)
        return out

    def _pieces(self, worker, objects):
        """Per object, one piece naming its bytes: in the registered L1 arena (zero copy),
        else its raw address (copied through the staging buffer)."""
        d = self.l1_memory_desc
        if worker.l1 is not None and worker.l1[0].closed:
            # kvstashd dropped the arena's buffer (its file shrank under a transfer; the
            # client closed our Buffer): register it again
            worker.l1 = self._register_l1(worker.client, worker.name)
        out = []
        for obj in objects:
            ptr, size = _obj_piece(obj)
            if size <= 0 or ptr <= 0:
                raise Error(INVALID_ARGUMENT, None, f"a memory object of {size} bytes at {ptr:#x}")
            if (worker.l1 is not None and d.ptr <= ptr and ptr + size <= d.ptr + d.size):
                buf, base = worker.l1
                out.append((buf, base + (ptr - d.ptr), size))
                self.zero_copy_bytes += size
            else:
                out.append((ptr, 0, size))
                self.staged_bytes += size
        return out

    def _l1_iovs(self, worker, objects, scratch=None):
        """The objects' pieces as one Iovs when every object lies in the registered L1
        arena (zero copy), else None (then _pieces, piece by piece). With scratch (a
        registered buffer of at least len(objects) bytes), each object's piece is followed
        by byte i of scratch. Returns (Iovs, [size per object]) or None. The caller counts
        the bytes in zero_copy_bytes once it sent them."""
        d = self.l1_memory_desc
        if worker.l1 is not None and worker.l1[0].closed:
            worker.l1 = self._register_l1(worker.client, worker.name)
        if worker.l1 is None or not objects:
            return None
        n = len(objects)
        ps = [_obj_piece(o) for o in objects]
        ptr = np.fromiter((p for p, _ in ps), dtype=np.int64, count=n)
        size = np.fromiter((z for _, z in ps), dtype=np.int64, count=n)
        if (size <= 0).any() or (ptr <= 0).any():
            i = int(np.flatnonzero((size <= 0) | (ptr <= 0))[0])
            raise Error(INVALID_ARGUMENT, None,
                        f"a memory object of {ps[i][1]} bytes at {ps[i][0]:#x}")
        lo, hi = int(d.ptr), int(d.ptr) + int(d.size)
        if not ((ptr >= lo) & (ptr + size <= hi)).all():
            return None
        buf, base = worker.l1
        off = base + (ptr - lo)
        if scratch is None:
            return Iovs([buf], 0, off, size), size.tolist()
        offs = np.stack([off, np.arange(n, dtype=np.int64)], 1).reshape(-1)
        lens = np.stack([size, np.ones(n, dtype=np.int64)], 1).reshape(-1)
        return Iovs([buf, scratch], np.tile([0, 1], n), offs, lens, per_key=2), size.tolist()

    @staticmethod
    def _strings(keys):
        return [object_key_to_string(k) for k in keys]

    # ---- store ----

    def submit_store_task(self, keys, objects):
        task_id = self._task_id()
        keys, objects = list(keys), list(objects)
        self._store_worker.submit(lambda c: self._run_store(c, task_id, keys, objects))
        return task_id

    def _run_store(self, client, task_id, keys, objects):
        ok, moved, stored = False, 0, []
        try:
            if len(keys) != len(objects):
                raise Error(INVALID_ARGUMENT, None,
                            f"store of {len(keys)} keys with {len(objects)} objects")
            if client is None:
                raise Error(UNAVAILABLE, None, "no connection to kvstashd")
            skeys = self._strings(keys)
            iov = self._l1_iovs(self._store_worker, objects) if client.is_unix else None
            if iov is not None:
                sizes = iov[1]
                self.zero_copy_bytes += sum(sizes)
                codes = client.batch_put_from(skeys, iov[0], durable=self.durable)
            elif client.is_unix:
                pieces = self._pieces(self._store_worker, objects)
                codes = client.batch_put_from(skeys, pieces, durable=self.durable)
                sizes = [p[2] for p in pieces]
            else:                           # TCP, TLS: the values go through the socket
                sizes = [_obj_piece(o)[1] for o in objects]
                codes = client.batch_put(skeys, [_view(o) for o in objects],
                                         durable=self.durable)
            ok = len(codes) == len(keys) and all(c in (OK, EXISTS) for c in codes)
            for k, size, code in zip(keys, sizes, codes):
                if code == OK:
                    moved += size
                    stored.append((k, size))
            if not ok:
                bad = sorted({c for c in codes if c not in (OK, EXISTS)})
                self._note_error(f"store task {task_id}: codes {bad}")
        except ConnectionLost:
            self._store_worker.drop()
            self._note_error(f"store task {task_id}: connection lost")
        except Exception as e:
            self._note_error(f"store task {task_id}: {type(e).__name__}: {e}")
        if stored:
            self._account_stored(stored)
        result = (L2StoreResult(ok, moved) if L2StoreResult is not None else ok)
        with self._lock:
            self._stores[task_id] = result
        self._signal(self._store_efd)

    def _account_stored(self, stored):
        keys, sizes = [], []
        with self._lock:
            for k, n in stored:
                if k not in self._sizes:
                    self._sizes[k] = n
                    keys.append(k)
                    sizes.append(n)
        notify = getattr(self, "_notify_keys_stored", None)
        if notify is not None and keys:
            try:
                notify(keys, sizes)
            except Exception as e:
                self._note_error(f"LMCache listener: {e}")

    def pop_completed_store_tasks(self):
        with self._lock:
            out, self._stores = self._stores, {}
        return out

    # ---- lookup and lock ----

    def submit_lookup_and_lock_task(self, keys, *layout, **layout_kw):
        """keys: ObjectKeys. The layout argument (a MemoryLayoutDesc, a dict of them by
        object group, or none, as LMCache's versions pass it) is accepted and not used."""
        task_id = self._task_id()
        keys = list(keys)
        self._fetch_worker.submit(lambda c: self._run_lookup(c, task_id, keys))
        return task_id

    def _fetch_bits(self, what, task_id, client, n, fn):
        """fn(client) on the fetch worker: a bool a key, or all False when it fails (a lost
        connection is dropped, every failure noted). Returns (Bitmap, the bools)."""
        try:
            if client is None:
                raise Error(UNAVAILABLE, None, "no connection to kvstashd")
            bits = fn(client)
        except ConnectionLost:
            self._fetch_worker.drop()
            self._note_error(f"{what} task {task_id}: connection lost")
            bits = [False] * n
        except Exception as e:
            self._note_error(f"{what} task {task_id}: {type(e).__name__}: {e}")
            bits = [False] * n
        bm = Bitmap(n)
        for i, b in enumerate(bits):
            if b:
                bm.set(i)
        return bm, bits

    def _run_lookup(self, client, task_id, keys):
        bm, _ = self._fetch_bits("lookup", task_id, client, len(keys),
                                 lambda c: self._lookup_and_lock(c, keys))
        with self._lock:
            self._lookups[task_id] = bm
        self._signal(self._lookup_efd)

    def _lookup_and_lock(self, client, keys):
        skeys = self._strings(keys)
        n = len(skeys)
        if self.lookup_mode == "prefix":
            # one request per object group: its leading keys that all exist
            want = [False] * n
            i = 0
            while i < n:
                j = i
                while j < n and keys[j].object_group_id == keys[i].object_group_id:
                    j += 1
                m = client.prefix_match(skeys[i:j])
                for t in range(i, i + m):
                    want[t] = True
                i = j
        else:
            want = [True] * n
        ask = [i for i in range(n) if want[i]]
        names = [skeys[i] for i in ask]
        if not names:
            return [False] * n
        if self.lock_mode in ("pin", "hard"):
            mode = "soft" if self.lock_mode == "pin" else "hard"
            codes = client.pin(names, mode)
            hit = [c == OK for c in codes]
            with self._lock:
                for s, h in zip(names, hit):
                    if h:
                        self._locks[s] = self._locks.get(s, 0) + 1
        elif self.lock_mode == "lease":
            hit = []
            step = max(1, int(client.server_info.get("max_batch", 1024) or 1024))
            for i in range(0, len(names), step):
                res = client.call("get_replica_list", names[i:i + step])
                hit += [isinstance(r, dict) for r in res]
        else:
            hit = client.batch_is_exist(names)
        found = [False] * n
        for i, h in zip(ask, hit):
            found[i] = bool(h)
        if self.lookup_mode == "prefix":
            # a key found after one that vanished meanwhile is not part of the prefix
            g, cut = None, False
            for i in range(n):
                if keys[i].object_group_id != g:
                    g, cut = keys[i].object_group_id, False
                if cut or not found[i]:
                    if found[i]:
                        found[i] = False
                        self._release([skeys[i]], client)
                    cut = True
        return found

    def query_lookup_and_lock_result(self, task_id):
        with self._lock:
            return self._lookups.pop(task_id, None)

    def submit_unlock(self, keys):
        skeys = []
        try:
            skeys = self._strings(keys)
        except Exception as e:
            self._note_error(f"unlock: {e}")
        if skeys and self.lock_mode in ("pin", "hard"):
            self._fetch_worker.submit(lambda c: self._release(skeys, c))

    def _release(self, skeys, client):
        """Drop one hold of each key; unpin the keys no lookup of ours holds any more. An
        unpin that cannot be sent now is kept and sent when the daemon is reached again."""
        free = []
        with self._lock:
            for s in skeys:
                held = self._locks.get(s, 0)
                if held <= 0:
                    continue
                if held == 1:
                    del self._locks[s]
                    free.append(s)
                else:
                    self._locks[s] = held - 1
        if not free:
            return
        if client is None:
            self._defer_unpins(free)
            return
        try:
            client.unpin(free)
        except ConnectionLost:
            self._fetch_worker.drop()
            self._defer_unpins(free)
        except Error as e:
            self._note_error(f"unpin: {e}")

    def _defer_unpins(self, free):
        with self._lock:
            room = _PENDING_UNPINS - len(self._pending_unpins)
            self._pending_unpins.extend(free[:max(0, room)])

    def _retry_unpins(self, client):
        with self._lock:
            todo, self._pending_unpins = self._pending_unpins, []
            todo = [s for s in todo if s not in self._locks]
        if todo:
            try:
                client.unpin(todo)
            except Error:
                self._defer_unpins(todo)

    # ---- load ----

    def submit_load_task(self, keys, objects):
        task_id = self._task_id()
        keys, objects = list(keys), list(objects)
        self._fetch_worker.submit(lambda c: self._run_load(c, task_id, keys, objects))
        return task_id

    def _run_load(self, client, task_id, keys, objects):
        n = len(keys)

        def load(c):
            if len(objects) != n:
                raise Error(INVALID_ARGUMENT, None,
                            f"load of {n} keys into {len(objects)} objects")
            return self._load(c, keys, objects)

        bm, loaded = self._fetch_bits("load", task_id, client, n, load)
        hits = [k for k, ok in zip(keys, loaded) if ok]
        notify = getattr(self, "_notify_keys_accessed", None)
        if notify is not None and hits:
            try:
                notify(hits)
            except Exception as e:
                self._note_error(f"LMCache listener: {e}")
        with self._lock:
            self._loads[task_id] = bm
        self._signal(self._load_efd)

    def _load(self, client, keys, objects):
        """batch_get_into each object with kvstashd's whole option: a value longer than its
        object answers TOO_LARGE and writes nothing, a shorter one answers its size; only
        a value that fills the object exactly is loaded. Against a daemon without the
        option, each object gets one byte past it in a scratch buffer instead (a value that
        fills the object and not that byte is the whole value). Size mismatches are failed
        bits, never reported as loaded."""
        skeys = self._strings(keys)
        if not client.is_unix:              # TCP, TLS: the values come through the socket
            out = []
            for k, obj, v in zip(keys, objects, client.batch_get(skeys)):
                dst = _view(obj)
                hit = v is not None and len(v) == len(dst)
                if hit:
                    dst[:] = v
                out.append(hit)
            return out
        w = self._fetch_worker
        if self._whole:
            try:
                iov = self._l1_iovs(w, objects)
                if iov is not None:
                    got = client.batch_get_into(skeys, iov[0], whole=True)
                    sizes = iov[1]
                    self.zero_copy_bytes += sum(sizes)
                else:
                    pieces = self._pieces(w, objects)
                    sizes = [p[2] for p in pieces]
                    got = client.batch_get_into(skeys, pieces, whole=True)
                return [isinstance(g, int) and g == s for g, s in zip(got, sizes)]
            except ConnectionLost:
                raise
            except Error as e:
                if not refuses_whole(e):
                    raise
                self._whole = False
                log.info("kvstash: kvstashd refused batch_get_into's whole option (%s); "
                         "loads offer a scratch byte instead", e)
        out = []
        for lo in range(0, len(skeys), _SCRATCH):
            hi = min(len(skeys), lo + _SCRATCH)
            scratch = w.scratch
            if scratch is None or scratch.closed or scratch.client is not client:
                scratch = w.scratch = client.register_buffer(_SCRATCH)
            objs = objects[lo:hi]
            iov = self._l1_iovs(w, objs, scratch)
            if iov is not None:
                sizes = iov[1]
                self.zero_copy_bytes += sum(sizes)
                got = client.batch_get_into(skeys[lo:hi], iov[0])
            else:
                pieces = self._pieces(w, objs)
                sizes = [p[2] for p in pieces]
                got = client.batch_get_into(
                    skeys[lo:hi], [[p, (scratch, i, 1)] for i, p in enumerate(pieces)])
            out += [isinstance(g, int) and g == s for g, s in zip(got, sizes)]
        return out

    def query_load_result(self, task_id):
        with self._lock:
            return self._loads.pop(task_id, None)

    # ---- optional: delete, usage, status ----

    def delete(self, keys):
        """Remove keys from kvstashd (LMCache's eviction asks this). Waits for the fetch
        worker, at most timeout seconds; keys it cannot remove (busy, leased) stay."""
        keys = list(keys)
        if not keys or self._closed:
            return None
        done = threading.Event()

        def run(client):
            try:
                if client is None:
                    return
                codes = client.batch_remove(self._strings(keys))
                gone, sizes = [], []
                with self._lock:
                    for k, code in zip(keys, codes):
                        if code in (OK, NOT_FOUND) and k in self._sizes:
                            gone.append(k)
                            sizes.append(self._sizes.pop(k))
                notify = getattr(self, "_notify_keys_deleted", None)
                if notify is not None and gone:
                    notify(gone, sizes)
                if any(c == BUSY for c in codes):
                    self._note_error("delete: some keys are busy or leased and stay")
            finally:
                done.set()

        self._fetch_worker.submit(run)
        done.wait(self.timeout)
        return None

    def report_status(self):
        """is_healthy (both workers connected, or not yet needed), the memory path, the
        lock mode, counters and the last error."""
        workers = (self._store_worker, self._fetch_worker)
        healthy = not self._closed and all(w.thread.is_alive() and not w.down
                                           for w in workers)
        return {
            "is_healthy": bool(healthy),
            "type": "kvstash",
            "kvstash_addr": self.addr,
            "l1_path": self.l1_path,
            "lock": self.lock_mode,
            "lookup": self.lookup_mode,
            "locked_keys": len(self._locks),
            "zero_copy_bytes": self.zero_copy_bytes,
            "staged_bytes": self.staged_bytes,
            "errors": self.errors,
            "last_error": self.last_error,
        }

    # ---- close ----

    def close(self):
        """Stop both workers once the work submitted so far has run (unlocks included),
        close their connections (the daemon releases what they registered) and the event
        fds. Idempotent."""
        if self._closed:
            return
        self._closed = True

        def unpin_all(client):
            with self._lock:
                held, self._locks = list(self._locks), {}
                held += self._pending_unpins
                self._pending_unpins = []
            if held and client is not None:
                try:
                    client.unpin(held)
                except Error as e:
                    self._note_error(f"close: unpin: {e}")

        if self.lock_mode in ("pin", "hard"):
            self._fetch_worker.submit(unpin_all)
        for w in (self._store_worker, self._fetch_worker):
            w.stop()
        for w in (self._store_worker, self._fetch_worker):
            w.thread.join(self.timeout + 5)
        for fd in (self._store_efd, self._lookup_efd, self._load_efd):
            try:
                os.close(fd)
            except OSError:
                pass
