"""kvstash.lmcache_native: kvstashd as an LMCache MP-mode "native_plugin" connector.

This module owns KvstashNativeConnector, the duck-typed client LMCache's
NativeConnectorL2Adapter drives (event_fd, submit_batch_get / _set / _exists / _delete,
drain_completions, close), built over libkvstash's asynchronous API (kvstash.h,
kvstash_async_*) through ctypes:

    --l2-adapter '{"type": "native_plugin", "module_path": "kvstash.lmcache_native",
                   "class_name": "KvstashNativeConnector",
                   "adapter_params": {"kvstash_addr": "unix:/run/kvstash/kvstashd.sock"}}'

It imports nothing of LMCache. Keys arrive already serialized by LMCache (its
<model>@<kv_rank>@<group>@<hash>[@salt] strings) and are stored byte for byte.

Threads. Callers (LMCache's controllers and its demux thread) submit from any thread;
libkvstash's own worker runs the requests in submission order on its connection. One relay
thread of ours polls libkvstash's eventfd, drains its completions, finishes them (copies
staged values out, turns per-key results into booleans, releases memory) and queues them
for drain_completions, writing our eventfd (event_fd()). Failures that happen before a
request reaches libkvstash (a bad buffer, a lost connection) complete the same way, so a
future always completes, with ok False and an error string, and no exception reaches the
caller's thread from submit or drain.

Memory. A buffer that lies in a shared mapping of a memfd the daemon accepts is
registered once (kvstash_async_register_fd) and moves with no copy; any other goes through
a registered staging buffer (one memcpy), from a small pool (one buffer per request in
flight).
"""

import collections
import ctypes
import ctypes.util
import errno as _errno
import logging
import os
import pathlib
import select
import threading
import time

from . import buffers
from .errors import EXISTS, OK

log = logging.getLogger("kvstash.lmcache_native")

MIB = 1 << 20


class _Piece(ctypes.Structure):
    _fields_ = [("buf", ctypes.c_void_p), ("offset", ctypes.c_uint64),
                ("length", ctypes.c_uint64)]


class _Completion(ctypes.Structure):
    _fields_ = [("id", ctypes.c_int64), ("status", ctypes.c_int), ("n", ctypes.c_size_t),
                ("results", ctypes.POINTER(ctypes.c_int64))]


def find_library(path=None):
    """libkvstash.so: path, else $KVSTASH_LIBRARY, else the system's (ld.so's search), else
    the tree's build/release/libkvstash.so next to this package. Raises OSError."""
    tree = pathlib.Path(__file__).resolve().parents[3] / "build" / "release" / "libkvstash.so"
    for cand in (path, os.environ.get("KVSTASH_LIBRARY"), ctypes.util.find_library("kvstash"),
                 str(tree)):
        if not cand:
            continue
        try:
            return _bind(ctypes.CDLL(cand))
        except OSError:
            continue
    raise OSError("libkvstash.so not found (set KVSTASH_LIBRARY, or build it: make)")


def _bind(lib):
    vp, sz, i64, pp = ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int64, ctypes.POINTER
    sigs = {
        "kvstash_async_open": (ctypes.c_int, [ctypes.c_char_p, ctypes.c_uint, pp(vp)]),
        "kvstash_async_close": (None, [vp]),
        "kvstash_async_event_fd": (ctypes.c_int, [vp]),
        "kvstash_async_register_buffer": (ctypes.c_int, [vp, sz, pp(vp)]),
        "kvstash_async_register_fd": (ctypes.c_int, [vp, ctypes.c_int, sz, pp(vp)]),
        "kvstash_async_unregister_buffer": (ctypes.c_int, [vp, vp]),
        "kvstash_async_submit_get_into": (i64, [vp, sz, vp, vp, vp, vp]),
        "kvstash_async_submit_put_from": (i64, [vp, sz, vp, vp, vp, vp]),
        "kvstash_async_submit_exists": (i64, [vp, sz, vp, vp]),
        "kvstash_async_drain": (sz, [vp, pp(_Completion), sz]),
        "kvstash_async_completion_free": (None, [pp(_Completion)]),
        "kvstash_buffer_ptr": (vp, [vp]),
        "kvstash_buffer_size": (sz, [vp]),
    }
    for name, (res, args) in sigs.items():
        f = getattr(lib, name)
        f.restype, f.argtypes = res, args
    return lib


def _why(status):
    """A completion's or submit's status as words."""
    if status < 0:
        return f"connection: {os.strerror(-status)}"
    from .errors import code_name
    return f"kvstashd answered {code_name(status)}"


class _Op:
    """One submitted request until its completion is handed out."""
    __slots__ = ("kind", "n", "held", "staged", "sizes", "stage_buf", "fid")

    def __init__(self, kind, n):
        self.kind, self.n = kind, n
        self.held = []          # buffers.Memory of the caller's buffers (released at the end)
        self.staged = []        # (key index, caller address, staging address, length) of gets
        self.sizes = []         # per key: the bytes the caller's buffer holds (gets)
        self.stage_buf = None   # the pool buffer this request holds, or None
        self.fid = 0


class KvstashNativeConnector:
    """An LMCache native-plugin connector over kvstashd (libkvstash's async API).

    KvstashNativeConnector(kvstash_addr="unix:/run/kvstash/kvstashd.sock", depth=64,
    staging_mb=16, library=None): kvstash_addr as kvstash.Client takes it (zero copy and
    staging both need the Unix socket: registered buffers are Unix-socket only); depth:
    requests in flight; staging_mb: the size of each staging buffer (a larger one is made
    for a larger request); library: libkvstash.so's path (see find_library).

    Raises OSError when the library is missing, ConnectionError when the daemon cannot be
    reached at construction (LMCache then reports the adapter as failed to start).
    """

    def __init__(self, kvstash_addr=None, addr=None, depth=64, staging_mb=16, library=None,
                 **_ignored):
        self._lib = find_library(library)
        self.addr = str(kvstash_addr or addr or "unix:/run/kvstash/kvstashd.sock")
        self.depth = max(1, int(depth))
        self.staging_size = max(1 << 16, int(float(staging_mb) * MIB))
        self._lock = threading.Lock()       # everything below, and calls on self._ctx
        self._ctx = None
        self._ctx_fd = -1
        self._next_local = 1 << 62          # ids of futures that never reached libkvstash
        self._ops = {}                      # libkvstash id -> _Op
        self._done = collections.deque()    # (future_id, ok, error, per_key) for drain
        self._files = {}                    # (dev, ino) -> kvstash_buffer ptr, or None refused
        self._pool = []                     # [kvstash_buffer ptr, size, busy]
        self._retry_at = 0.0
        self._closed = False
        self._remover = None                # a kvstash.Client for submit_batch_delete
        self.path_counts = {"zero_copy": 0, "staged": 0}
        self._efd = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
        self._stop_r, self._stop_w = os.pipe2(os.O_CLOEXEC | os.O_NONBLOCK)
        with self._lock:
            rc = self._open_locked()
        if rc != 0:
            os.close(self._efd)
            os.close(self._stop_r)
            os.close(self._stop_w)
            raise ConnectionError(f"kvstash: cannot open {self.addr}: {_why(rc)}")
        self._relay = threading.Thread(target=self._relay_loop, name="kvstash-native-relay",
                                       daemon=True)
        self._relay.start()

    # ---- the context ----

    def _open_locked(self):
        ctx = ctypes.c_void_p()
        rc = self._lib.kvstash_async_open(self.addr.encode(), self.depth, ctypes.byref(ctx))
        if rc != 0:
            return rc
        self._ctx = ctx.value
        self._ctx_fd = self._lib.kvstash_async_event_fd(self._ctx)
        self._files.clear()
        self._pool = []
        return 0

    def _fail_context_locked(self, why):
        """The context broke: take every completion it has, close it (its worker fails what
        is still queued), and fail the futures it never finished."""
        ctx, self._ctx, self._ctx_fd = self._ctx, None, -1
        if ctx is None:
            return
        self._drain_lib_locked(ctx)
        self._lib.kvstash_async_close(ctx)
        for lid, op in list(self._ops.items()):
            self._finish_locked(lid, op, False, why, None)
        self._ops.clear()
        self._files.clear()
        self._pool = []
        self._retry_at = time.monotonic() + 1.0

    def _context_locked(self):
        if self._ctx is None and not self._closed and time.monotonic() >= self._retry_at:
            if self._open_locked() != 0:
                self._retry_at = time.monotonic() + 1.0
        return self._ctx

    # ---- completions ----

    def _post_locked(self, fid, ok, error, per_key):
        self._done.append((fid, ok, error, per_key))
        try:
            os.eventfd_write(self._efd, 1)
        except OSError:
            pass

    def _local_failure_locked(self, error, n):
        fid = self._next_local
        self._next_local += 1
        self._post_locked(fid, False, error, [False] * n)
        return fid

    def _finish_locked(self, lid, op, ok, error, results):
        """Turn libkvstash's per-key results into LMCache's booleans; copy staged values
        out; release the request's memory; post the completion."""
        per_key = [False] * op.n
        if results is not None:
            if op.kind == "get":
                # the overflow byte after each buffer: a longer value writes it and counts
                # one more byte, so only a value of exactly the buffer's size is a hit
                per_key = [results[i] == op.sizes[i] for i in range(op.n)]
                for i, dst, src, length in op.staged:
                    if per_key[i]:
                        ctypes.memmove(dst, src, length)
            elif op.kind == "set":
                per_key = [results[i] in (OK, EXISTS) for i in range(op.n)]
            else:
                per_key = [results[i] == 1 for i in range(op.n)]
        for m in op.held:
            m.release()
        op.held = []
        if op.stage_buf is not None:
            op.stage_buf[2] = False
        if ok and op.kind == "set" and not all(per_key):
            ok, error = False, "some keys were not stored"
        self._post_locked(op.fid, ok, error, per_key)

    def _drain_lib_locked(self, ctx):
        comps = (_Completion * 64)()
        broken = None
        while True:
            got = self._lib.kvstash_async_drain(ctx, comps, 64)
            for k in range(got):
                c = comps[k]
                op = self._ops.pop(c.id, None)
                if op is not None:
                    results = [c.results[i] for i in range(c.n)] if c.results else []
                    ok = c.status == 0
                    err = "" if ok else _why(c.status)
                    if c.status < 0 and c.status != -_errno.ENOMEM:
                        broken = err
                    self._finish_locked(c.id, op, ok, err, results if c.status >= 0 else None)
                self._lib.kvstash_async_completion_free(ctypes.byref(c))
            if got < 64:
                return broken

    def _relay_loop(self):
        while True:
            with self._lock:
                fd = self._ctx_fd
            p = select.poll()               # not select(): fds past 1024 in a big server
            p.register(self._stop_r, select.POLLIN)
            if fd >= 0:
                p.register(fd, select.POLLIN)
            try:
                ready = [f for f, _ in p.poll(500)]
            except OSError:
                ready = []
            if self._stop_r in ready:
                return
            with self._lock:
                if self._ctx is None:
                    continue
                broken = self._drain_lib_locked(self._ctx)
                if broken is not None:
                    self._fail_context_locked(broken)

    # ---- memory ----

    def _stage_locked(self, need):
        """A free pool buffer of at least need bytes (marked busy), or None."""
        for b in self._pool:
            if not b[2] and b[1] >= need:
                b[2] = True
                return b
        if len(self._pool) >= self.depth:
            free = [b for b in self._pool if not b[2]]
            if not free:
                return None
            self._lib.kvstash_async_unregister_buffer(self._ctx, free[0][0])
            self._pool.remove(free[0])
        size = max(self.staging_size, (need + MIB - 1) // MIB * MIB)
        out = ctypes.c_void_p()
        if self._lib.kvstash_async_register_buffer(self._ctx, size, ctypes.byref(out)) != 0:
            return None
        b = [out.value, size, True]
        self._pool.append(b)
        return b

    def _file_buffer_locked(self, maps, addr, length):
        """(kvstash_buffer, file offset) when [addr, addr + length) lies in a shared mapping
        of a file registered (or registrable) on the context; else None."""
        mp = buffers.find_mapping(maps, addr, length)
        if mp is None:
            return None
        fid = (mp.dev, mp.ino)
        if fid not in self._files:
            buf = None
            fd = buffers.find_descriptor(mp)
            if fd is not None:
                try:
                    if buffers.seal_shrink(fd):
                        size = os.fstat(fd).st_size
                        out = ctypes.c_void_p()
                        if self._lib.kvstash_async_register_fd(self._ctx, fd, size,
                                                               ctypes.byref(out)) == 0:
                            buf = (out.value, size)
                finally:
                    os.close(fd)
            self._files[fid] = buf
            log.info("kvstash: %s %s", "registered" if buf else "cannot register (copying)",
                     mp.path or "a shared mapping")
        buf = self._files[fid]
        off = mp.offset + (addr - mp.start)
        if buf is None or off + length > buf[1]:
            return None
        return buf[0], off

    # ---- submit ----

    @staticmethod
    def _key_arrays(keys):
        raw = [k.encode() if isinstance(k, str) else bytes(k) for k in keys]
        n = len(raw)
        karr = (ctypes.c_char_p * n)(*raw)
        klens = (ctypes.c_size_t * n)(*[len(k) for k in raw])
        return raw, karr, klens

    def _submit_transfer(self, kind, keys, bufs):
        n = len(keys)
        with self._lock:
            if self._closed:
                return self._local_failure_locked("connector closed", n)
            if len(bufs) != n:
                return self._local_failure_locked(f"{n} keys, {len(bufs)} buffers", n)
            ctx = self._context_locked()
            if ctx is None:
                return self._local_failure_locked("no connection to kvstashd", n)
            op = _Op(kind, n)
            try:
                return self._submit_transfer_locked(op, kind, keys, bufs, ctx)
            except Exception as e:          # a bad buffer, no memory: this future fails
                for m in op.held:
                    m.release()
                if op.stage_buf is not None:
                    op.stage_buf[2] = False
                return self._local_failure_locked(f"{type(e).__name__}: {e}", n)

    def _submit_transfer_locked(self, op, kind, keys, bufs, ctx):
        n = len(keys)
        get = kind == "get"
        maps = buffers.read_maps()
        places = []
        staged_need = n if get else 0       # gets: one overflow byte per key
        for b in bufs:
            m = buffers.memory_of(b, get)
            op.held.append(m)
            if not m.nbytes:
                raise ValueError("an empty buffer")
            z = self._file_buffer_locked(maps, m.addr, m.nbytes)
            places.append(z)
            op.sizes.append(m.nbytes)
            if z is None:
                staged_need += m.nbytes
        if staged_need:
            op.stage_buf = self._stage_locked(staged_need)
            if op.stage_buf is None:
                raise MemoryError("no staging buffer free (depth requests in flight)")
            sbase = self._lib.kvstash_buffer_ptr(op.stage_buf[0])
        per = 2 if get else 1
        flat = (_Piece * (n * per))()
        ptrs = (ctypes.c_void_p * n)()
        npieces = (ctypes.c_size_t * n)()
        soff = 0
        if get:
            soff = n                        # bytes [0, n) of the staging buffer: overflow
        base = ctypes.addressof(flat)
        for i, (m, z) in enumerate(zip(op.held, places)):
            p = flat[i * per]
            if z is not None:
                p.buf, p.offset, p.length = z[0], z[1], m.nbytes
                self.path_counts["zero_copy"] += m.nbytes
            else:
                p.buf, p.offset, p.length = op.stage_buf[0], soff, m.nbytes
                if get:
                    op.staged.append((i, m.addr, sbase + soff, m.nbytes))
                else:
                    ctypes.memmove(sbase + soff, m.addr, m.nbytes)
                soff += m.nbytes
                self.path_counts["staged"] += m.nbytes
            if get:
                q = flat[i * per + 1]
                q.buf, q.offset, q.length = op.stage_buf[0], i, 1
            ptrs[i] = base + i * per * ctypes.sizeof(_Piece)
            npieces[i] = per
        _raw, karr, klens = self._key_arrays(keys)
        fn = (self._lib.kvstash_async_submit_get_into if get
              else self._lib.kvstash_async_submit_put_from)
        lid = fn(ctx, n, karr, klens, ptrs, npieces)
        if lid < 0:
            raise OSError(-lid, f"submit: {os.strerror(-lid)}")
        op.fid = lid
        self._ops[lid] = op
        return lid

    def submit_batch_get(self, keys, bufs):
        """Read values into bufs (writable buffers, one per key). Completion: per key True
        when the value filled its buffer exactly (a value of another size is False)."""
        return self._submit_transfer("get", list(keys), list(bufs))

    def submit_batch_set(self, keys, bufs):
        """Store bufs under keys. Completion: per key True when stored or already there."""
        return self._submit_transfer("set", list(keys), list(bufs))

    def submit_batch_exists(self, keys):
        """Completion: per key True when it exists."""
        keys = list(keys)
        n = len(keys)
        with self._lock:
            if self._closed:
                return self._local_failure_locked("connector closed", n)
            ctx = self._context_locked()
            if ctx is None:
                return self._local_failure_locked("no connection to kvstashd", n)
            try:
                _raw, karr, klens = self._key_arrays(keys)
            except Exception as e:
                return self._local_failure_locked(f"{type(e).__name__}: {e}", n)
            lid = self._lib.kvstash_async_submit_exists(ctx, n, karr, klens)
            if lid < 0:
                return self._local_failure_locked(f"submit: {os.strerror(-lid)}", n)
            op = _Op("exists", n)
            op.fid = lid
            self._ops[lid] = op
            return lid

    def submit_batch_delete(self, keys):
        """Remove keys (LMCache's eviction). Runs on a connection of its own (the async API
        has no remove) in the caller's thread; completes at once. Per key True when removed
        or already absent; a leased or busy key stays (False)."""
        keys = list(keys)
        n = len(keys)
        try:
            from .client import Client
            from .errors import NOT_FOUND
            if self._remover is None or self._remover.closed:
                self._remover = Client(self.addr, timeout=30.0)
            codes = self._remover.batch_remove(keys)
            per_key = [c in (OK, NOT_FOUND) for c in codes]
            ok, err = True, ""
        except Exception as e:
            per_key, ok, err = [False] * n, False, f"{type(e).__name__}: {e}"
        with self._lock:
            fid = self._next_local
            self._next_local += 1
            self._post_locked(fid, ok, err, per_key)
            return fid

    # ---- drain, close ----

    def event_fd(self):
        """Readable while completions wait for drain_completions (an eventfd we own)."""
        return self._efd

    def drain_completions(self):
        """Every finished future: [(future_id, ok, error, per_key_results), ...]; ok False
        with error a reason when the request failed as a whole."""
        with self._lock:
            out = list(self._done)
            self._done.clear()
            try:
                os.eventfd_read(self._efd)
            except OSError:
                pass
        return out

    def close(self):
        """Finish what was submitted (libkvstash runs its queue), stop the relay, close the
        connections and fds. Idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        try:
            os.write(self._stop_w, b"x")
        except OSError:
            pass
        self._relay.join(30)
        with self._lock:
            ctx, self._ctx, self._ctx_fd = self._ctx, None, -1
            if ctx is not None:
                self._lib.kvstash_async_close(ctx)
            for lid, op in list(self._ops.items()):
                for m in op.held:
                    m.release()
            self._ops.clear()
            self._done.clear()
        if self._remover is not None:
            self._remover.close()
        for fd in (self._efd, self._stop_r, self._stop_w):
            try:
                os.close(fd)
            except OSError:
                pass
