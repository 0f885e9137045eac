"""kvstash.sglang: kvstashd as SGLang's HiCache L3 storage backend (docs/sglang.md).

This module owns the adapter SGLang's dynamic backend factory loads
(`--hicache-storage-backend dynamic` with `"module_path":"kvstash.sglang",
"class_name":"KvstashStorage"`): the keys of a page (built as SGLang's Mooncake backend
builds them, in a namespace that also names the KV dtype and the page's byte order), which
host-pool pointers make each object, and which way the bytes move. It never raises into
SGLang's threads: every failure is logged and returned as False, 0 or None. The socket,
registration and copies are the client's (client.py, buffers.py).

How bytes move, per object (K or V of a page, or the MLA page):
- zero copy: the host pool is SGLang's "shm" allocation (a memfd per buffer) and kvstashd
  took the descriptor at registration: pieces name the file and offset, the daemon copies
  straight between the pool's pages and its store;
- staging copy: the daemon refused the descriptor (kvstashd before unsealed-memfd support
  refuses SGLang's MFD_CLOEXEC-only memfd) or the pool is not in shared memory: one memcpy
  through the client's registered staging buffer;
- socket: kvstash_addr is TCP (no shared memory there): values cross the socket.
Results are the same on every path.

Threads: SGLang calls batch_exists (prefetch thread), batch_get_v1 (prefetch I/O thread)
and batch_set_v1 (backup thread) at once. Each thread gets its own Client (a Client
serializes its calls), made at its first call and registering the pool's descriptors then;
a broken one is replaced at the next call (at most one connection attempt a second).
"""

import ctypes
import logging
import os
import threading
import time

from sglang.srt.mem_cache.hicache_storage import HiCacheStorage

import numpy as np

from . import buffers
from .client import Client, refuses_whole
from .iovs import Iovs, resolve
from .errors import EXISTS, INVALID_ARGUMENT, OK, UNAVAILABLE, ConnectionLost, Error

logger = logging.getLogger(__name__)

# Where kvstashd's packaged unit (packaging/kvstashd.service) puts its Unix socket:
# WorkingDirectory /var/lib/kvstash, default data_dir ./var, socket <data_dir>/kvstashd.sock.
DEFAULT_UNIX_SOCKET = "/var/lib/kvstash/var/kvstashd.sock"
DEFAULT_TCP = "127.0.0.1:7431"
RECONNECT_INTERVAL = 1.0

# The byte order of one page object for each host-pool layout: layer_first and
# page_first_direct both give (layer, token, ...) per object, page_first (token, layer, ...),
# page_head (head, token, layer, ...). Pools of different orders must never share a key.
_ORDER = {"layer_first": "lf", "page_first_direct": "lf", "page_first": "pf",
          "page_head": "ph"}


def default_addr():
    """The Unix socket of a packaged kvstashd when it exists, else its TCP default."""
    if os.path.exists(DEFAULT_UNIX_SOCKET):
        return "unix:" + DEFAULT_UNIX_SOCKET
    return DEFAULT_TCP


def _span(t):
    """(address, nbytes) of a host tensor or array (torch: data_ptr; numpy: buffer)."""
    ptr = getattr(t, "data_ptr", None)
    if callable(ptr):
        return int(ptr()), int(t.numel() * t.element_size())
    return buffers.address_of(t), int(t.nbytes)


def _dtype_name(dtype):
    s = str(dtype)
    return s[len("torch."):] if s.startswith("torch.") else s


class KvstashStorage(HiCacheStorage):
    """SGLang HiCacheStorage on kvstashd. Built by SGLang as cls(storage_config, kwargs);
    storage_config.extra_config carries "kvstash_addr" (default: default_addr()),
    optionally "kvstash_timeout" (seconds, default 10) and "extra_backend_tag" (a key
    prefix, as for Mooncake)."""

    def __init__(self, storage_config=None, kwargs=None):
        extra = dict(getattr(storage_config, "extra_config", None) or {})
        self.storage_config = storage_config
        self.addr = extra.get("kvstash_addr") or default_addr()
        self.timeout = float(extra.get("kvstash_timeout", 10.0))
        self.interface_v1 = bool(extra.get("interface_v1", 0))
        sc = storage_config
        self.tp_rank = getattr(sc, "tp_rank", 0) or 0
        self.tp_size = getattr(sc, "tp_size", 1) or 1
        self.pp_rank = getattr(sc, "pp_rank", 0) or 0
        self.pp_size = getattr(sc, "pp_size", 1) or 1
        self.is_mla = bool(getattr(sc, "is_mla_model", False))
        self.split_heads = bool(getattr(sc, "should_split_heads", False))
        self.enable_storage_metrics = bool(getattr(sc, "enable_storage_metrics", False))
        # Suffixes as SGLang's Mooncake backend: MHA "{tp}" or "{tp}_{pp}", MLA "" or "{pp}"
        if self.pp_size > 1:
            self.mha_suffix = f"{self.tp_rank}_{self.pp_rank}"
            self.mla_suffix = f"{self.pp_rank}"
        else:
            self.mha_suffix = f"{self.tp_rank}"
            self.mla_suffix = ""
        self._tag = []
        if extra.get("extra_backend_tag") is not None:
            self._tag.append(str(extra["extra_backend_tag"]))
        model = getattr(sc, "model_name", None)
        if model:
            self._tag.append("-".join(model.split("/")))
        self.prefix = None          # set by register_mem_pool_host (needs the pool's dtype)
        self.mem_pool_host = None
        self._fds = []              # the pool's descriptors (SGLang's shm allocator)
        self._ranges = []           # (start, end, fd index, file offset at start)
        self._spans = []            # (start, end) of the pool's buffers
        self._rng = None            # _ranges as arrays: starts, ends, fd indices, offsets
        self._spn = None            # _spans as arrays: starts, ends
        self._meta = None           # the pool's page pointers as an affine model, or False
        self._whole = True          # the daemon takes batch_get_into's opts.whole
        self.path = None            # "zero-copy", "staging" or "socket", once known
        self._path_lock = threading.Lock()
        self._local = threading.local()
        self._clients = []
        self._clients_lock = threading.Lock()
        self._last_fail = 0.0
        self._warned = {}
        self.prefetch_pgs, self.backup_pgs = [], []
        self.prefetch_bandwidth, self.backup_bandwidth = [], []
        self.gb_per_page = 0.0
        try:
            self._client()
        except Exception as e:
            logger.error("kvstash: cannot reach kvstashd at %s (%s); HiCache L3 calls fail "
                         "until it answers", self.addr, e)

    # ---- logging and clients ----

    def _warn(self, what, err):
        """Log a failure: the first 5 of each kind, then every 1000th."""
        n = self._warned.get(what, 0) + 1
        self._warned[what] = n
        if n <= 5 or n % 1000 == 0:
            logger.warning("kvstash: %s failed (%d so far): %s", what, n, err)

    def _client(self):
        c = getattr(self._local, "client", None)
        if c is not None and not c.closed:
            bufs = self._local.bufs
            if bufs and any(b.closed for b in bufs):
                # kvstashd dropped a pool buffer (its file shrank under a transfer; the
                # client closed our Buffer): register the pool again
                for b in bufs:
                    if not b.closed:
                        try:
                            c.unregister_buffer(b)
                        except Exception:
                            pass
                self._local.bufs = []
                self._register_pool(c)
            return c
        if c is not None:
            self._drop(c)
        now = time.monotonic()
        if now - self._last_fail < RECONNECT_INTERVAL:
            raise Error(UNAVAILABLE, None, f"kvstashd at {self.addr} did not answer a moment ago")
        try:
            c = Client(self.addr, timeout=self.timeout, auto_register=False)
        except Exception:
            self._last_fail = now
            raise
        self._local.client = c
        self._local.bufs = []
        with self._clients_lock:
            self._clients.append(c)
        if self._fds:
            self._register_pool(c)
        return c

    def _drop(self, c):
        self._local.client = None
        self._local.bufs = []
        with self._clients_lock:
            if c in self._clients:
                self._clients.remove(c)
        try:
            c.close()
        except Exception:
            pass

    def _set_path(self, path, why):
        with self._path_lock:
            if self.path != path:
                self.path = path
                logger.info("kvstash: HiCache host pool <-> kvstashd at %s: %s (%s)",
                            self.addr, path, why)

    def _register_pool(self, c):
        """Register the pool's descriptors on client c (zero copy), unless kvstashd refused
        them before. A refusal (INVALID_ARGUMENT) switches to the staging copy for good."""
        if not c.is_unix:
            self._set_path("socket", "TCP: no shared memory")
            return
        if self.path == "staging":
            return
        bufs = []
        try:
            for fd in self._fds:
                bufs.append(c.register_fd(fd))
        except Error as e:
            for b in bufs:
                try:
                    c.unregister_buffer(b)
                except Exception:
                    pass
            if e.code == INVALID_ARGUMENT:
                self._set_path("staging", f"kvstashd refused the pool's descriptor: {e}")
                return
            raise
        self._local.bufs = bufs
        self._set_path("zero-copy", f"{len(bufs)} pool descriptor(s) registered")

    def _is_unix(self):
        a = self.addr
        return a.startswith("unix:") or "/" in a

    # ---- the host pool ----

    def register_mem_pool_host(self, mem_pool_host):
        super().register_mem_pool_host(mem_pool_host)
        try:
            self._adopt_pool(mem_pool_host)
        except Exception as e:
            logger.error("kvstash: cannot use the host pool (%s); L3 calls fail", e)
            self.prefix = None

    def _adopt_pool(self, pool):
        layout = getattr(pool, "layout", "")
        sig = [_dtype_name(pool.dtype), _ORDER.get(layout, layout)]
        if not self.is_mla:
            sig.append(f"tp{self.tp_size}")
        if self.pp_size > 1:
            sig.append(f"pp{self.pp_size}")
        self.prefix = "_".join(self._tag + ["-".join(sig)])
        kv = getattr(pool, "kv_buffer", None)
        parts = kv if isinstance(kv, (list, tuple)) else [kv]
        self._spans = [(a, a + n) for a, n in (_span(t) for t in parts if t is not None)]
        ksize = getattr(pool, "get_ksize_per_token", None)
        if callable(ksize):
            self.gb_per_page = ksize() * pool.page_size / (1 << 30)
        fds = list(getattr(getattr(pool, "allocator", None), "fds", None) or [])
        self._fds, self._ranges = [], []
        if fds:
            ids = {}
            for i, fd in enumerate(fds):
                st = os.fstat(fd)
                ids[(st.st_dev, st.st_ino)] = i
            for m in buffers.read_maps():
                i = ids.get((m.dev, m.ino))
                if i is not None:
                    self._ranges.append((m.start, m.end, i, m.offset))
            self._fds = fds
        self._ranges.sort()
        self._spans.sort()
        r = self._ranges
        self._rng = (np.array([x[0] for x in r], dtype=np.int64),
                     np.array([x[1] for x in r], dtype=np.int64),
                     np.array([x[2] for x in r], dtype=np.int64),
                     np.array([x[3] for x in r], dtype=np.int64))
        self._spn = (np.array([x[0] for x in self._spans], dtype=np.int64),
                     np.array([x[1] for x in self._spans], dtype=np.int64))
        self._meta = None
        if not self._fds:
            if self._is_unix():
                self._set_path("staging", "the host pool is not SGLang's shm allocation "
                               "(\"allocator\":\"shm\")")
            else:
                self._set_path("socket", "TCP: no shared memory")
            return
        # re-register on every client made before the pool was known
        c = getattr(self._local, "client", None)
        if c is not None and not c.closed:
            self._register_pool(c)
        with self._clients_lock:
            others = [x for x in self._clients if x is not c]
        for x in others:        # other threads' clients: dropped, remade with the pool
            try:
                x.close()
            except Exception:
                pass

    # ---- keys and pieces ----

    def _tag_key(self, key):
        return f"{self.prefix}_{key}"

    def _page_keys_all(self, keys):
        """The object keys of the pages keys, in order (K, V per page; or MLA's one)."""
        p = self.prefix
        if self.is_mla:
            s = self.mla_suffix
            return [f"{p}_{k}_{s}_k" for k in keys]
        s = self.mha_suffix
        return [x for k in keys for x in (f"{p}_{k}_{s}_k", f"{p}_{k}_{s}_v")]

    def _meta_model(self, host_indices):
        """The pool's page pointers as an affine model of a page's first slot: (c, a, size),
        arrays over the page's pointers, with ptr_j(first) = c_j + a_j * first and every
        piece size[j] bytes; found once by asking get_page_buffer_meta for the first,
        second, middle and last pages of the pool (indices of host_indices' own type) and
        kept only when all four fit it. False when they do not (then every batch asks the
        pool)."""
        pool = self.mem_pool_host
        ps, size = pool.page_size, getattr(pool, "size", None)
        if not size or size < 2 * ps:
            return False
        page = host_indices[:ps] - host_indices[0]
        firsts = sorted({0, ps, (size // ps // 2) * ps, size - ps})
        ptrs, sizes = [], []
        for f in firsts:
            p, z = pool.get_page_buffer_meta(page + f)
            ptrs.append(np.asarray([int(x) for x in p], dtype=np.int64))
            sizes.append(np.asarray([int(x) for x in z], dtype=np.int64))
        m = len(ptrs[0])
        if m == 0 or any(len(p) != m or len(z) != m or (z != sizes[0]).any()
                         for p, z in zip(ptrs, sizes)):
            return False
        a, rem = np.divmod(ptrs[1] - ptrs[0], firsts[1] - firsts[0])
        if rem.any():
            return False
        c = ptrs[0] - a * firsts[0]
        if any((c + a * f != p).any() for f, p in zip(firsts, ptrs)):
            return False
        return c, a, sizes[0]

    def _objects(self, keys, host_indices):
        """(object keys, pointers, sizes) for the pages of keys at host_indices: pointers
        and sizes are int64 arrays of one row per object (K then V of each page, or the MLA
        page), a column per piece. Raises ValueError for indices that do not fit the pool,
        or pointers outside it."""
        pool = self.mem_pool_host
        if pool is None or self.prefix is None:
            raise ValueError("no host pool registered")
        if self.split_heads:
            raise ValueError("should_split_heads (page_head across TP sizes) is not supported")
        n = len(keys)
        if n == 0:
            return [], None, None
        ps = pool.page_size
        if len(host_indices) != n * ps:
            raise ValueError(f"{n} keys and {len(host_indices)} host indices "
                             f"(page size {ps})")
        if hasattr(host_indices, "min"):        # a torch tensor or numpy array
            lo, hi = int(host_indices.min()), int(host_indices.max())
        else:
            lo, hi = min(host_indices), max(host_indices)
        size = getattr(pool, "size", None)
        if lo < 0 or (size is not None and hi >= size):
            raise ValueError(f"host indices [{lo}, {hi}] outside the pool's {size} slots")
        if self._meta is None and hasattr(host_indices, "min"):
            self._meta = self._meta_model(host_indices)
        if self._meta:
            c, a, z = self._meta
            first = np.asarray(host_indices[::ps], dtype=np.int64)
            ptrs = first[:, None] * a + c
            sizes = np.broadcast_to(z, ptrs.shape)
        else:
            p, z = pool.get_page_buffer_meta(host_indices)
            if len(p) != len(z) or len(p) % n:
                raise ValueError(f"the pool gave {len(p)} pointers for {n} pages")
            ptrs = np.asarray([int(x) for x in p], dtype=np.int64).reshape(n, -1)
            sizes = np.asarray([int(x) for x in z], dtype=np.int64).reshape(n, -1)
        per_page = ptrs.shape[1]
        if per_page == 0 or (not self.is_mla and per_page % 2):
            raise ValueError(f"the pool gave {ptrs.size} pointers for {n} pages")
        st, en = self._spn
        _, _, inside = resolve(st, en, ptrs, sizes)
        if not inside.all():
            i, j = (int(x[0]) for x in np.nonzero(~inside))
            raise ValueError(f"page {i} ({keys[i]}): [{int(ptrs[i, j]):#x}, "
                             f"+{int(sizes[i, j])}) is outside the host pool")
        if not self.is_mla:     # the pool interleaves K and V pointers (per layer, layer_first)
            ptrs = ptrs.reshape(n, per_page // 2, 2).transpose(0, 2, 1).reshape(2 * n, -1)
            sizes = sizes.reshape(n, per_page // 2, 2).transpose(0, 2, 1).reshape(2 * n, -1)
        return self._page_keys_all(keys), ptrs, sizes

    def _iovs(self, ptrs, sizes):
        """The pieces of the objects (arrays as _objects gives) as an Iovs in this thread's
        registered pool buffers, or None when some piece is not in one of them (no buffers
        registered, or memory outside the shm files: the staging copy)."""
        bufs = getattr(self._local, "bufs", None)
        if not bufs or self._rng is None:
            return None
        st, en, fdi, foff = self._rng
        idx, delta, inside = resolve(st, en, ptrs.reshape(-1), sizes.reshape(-1))
        if not inside.all():
            return None
        return Iovs(bufs, fdi[idx], foff[idx] + delta, sizes.reshape(-1),
                    per_key=ptrs.shape[1])

    @staticmethod
    def _lists(ptrs, sizes):
        """Objects as lists of (address, size), for the paths with a Python object per
        piece."""
        return [list(zip(p, s)) for p, s in zip(ptrs.tolist(), sizes.tolist())]

    def _pieces(self, objs):
        bufs = getattr(self._local, "bufs", None)
        if not bufs:
            return [[(a, 0, s) for a, s in o] for o in objs]
        out = []
        for o in objs:
            ps = []
            for a, s in o:
                for lo, hi, i, off in self._ranges:
                    if lo <= a and a + s <= hi:
                        ps.append((bufs[i], off + a - lo, s))
                        break
                else:
                    ps.append((a, 0, s))        # outside the shm files: staging copy
            out.append(ps)
        return out

    # ---- moving objects ----

    def _put(self, okeys, objs):
        """Store objects; per object True when stored or already there."""
        c = self._client()
        if not c.is_unix:
            vals = []
            for o in objs:
                if len(o) == 1:
                    a, s = o[0]
                    vals.append(memoryview((ctypes.c_char * s).from_address(a)).cast("B"))
                else:
                    vals.append(b"".join(ctypes.string_at(a, s) for a, s in o))
            codes = c.batch_put(okeys, vals)
        else:
            codes = c.batch_put_from(okeys, self._pieces(objs))
        return [r in (OK, EXISTS) for r in codes]

    def _get(self, okeys, objs):
        """Read objects into their pieces; per object True when its whole value, of exactly
        the pieces' size, was written."""
        c = self._client()
        want = [sum(s for _, s in o) for o in objs]
        if not c.is_unix:
            vals = c.batch_get(okeys)
            out = []
            for o, w, v in zip(objs, want, vals):
                if v is None or len(v) != w:
                    out.append(False)
                    continue
                done = 0
                for a, s in o:
                    ctypes.memmove(a, v[done:done + s], s)
                    done += s
                out.append(True)
            return out
        got = self._get_into(c, okeys, self._pieces(objs))
        return [isinstance(g, int) and g == w for g, w in zip(got, want)]

    def _get_into(self, c, okeys, pieces):
        """batch_get_into with kvstashd's whole option (a value longer than its pieces
        writes nothing and fails); without it against a daemon that refuses the option,
        where such a value is read cut to the pieces (then it answers their total)."""
        if self._whole:
            try:
                return c.batch_get_into(okeys, pieces, whole=True)
            except ConnectionLost:
                raise
            except Error as e:
                if not refuses_whole(e):
                    raise
                self._whole = False
                logger.info("kvstash: kvstashd refused batch_get_into's whole option (%s); "
                            "a value longer than its page is read cut to it", e)
        return c.batch_get_into(okeys, pieces)

    def _put_arrays(self, okeys, ptrs, sizes):
        """_put of objects given as arrays (_objects): one Iovs when every piece lies in a
        registered pool buffer, else piece by piece."""
        c = self._client()
        iov = self._iovs(ptrs, sizes) if c.is_unix else None
        if iov is None:
            return self._put(okeys, self._lists(ptrs, sizes))
        return [r in (OK, EXISTS) for r in c.batch_put_from(okeys, iov)]

    def _get_arrays(self, okeys, ptrs, sizes):
        """_get of objects given as arrays (_objects), as _put_arrays."""
        c = self._client()
        iov = self._iovs(ptrs, sizes) if c.is_unix else None
        if iov is None:
            return self._get(okeys, self._lists(ptrs, sizes))
        got = self._get_into(c, okeys, iov)
        return [isinstance(g, int) and g == w for g, w in zip(got, iov.key_bytes())]

    def _per_page(self, ok, n):
        m = len(ok) // n if n else 1
        return [all(ok[i * m:(i + 1) * m]) for i in range(n)]

    def _guard(self, what, fail, fn, *args):
        try:
            return fn(*args)
        except Exception as e:
            c = getattr(self._local, "client", None)
            if c is not None and c.closed:
                self._drop(c)
            self._warn(what, e)
            return fail

    # ---- the v1 interface (interface_v1: 1) ----

    def batch_exists(self, keys, extra_info=None):
        """Leading pages of keys whose every object exists (K and V, or the MLA object):
        one prefix_match with group_size. 0 on any failure."""
        return self._guard("batch_exists", 0, self._batch_exists, keys)

    def _batch_exists(self, keys):
        keys = list(keys)
        if not keys or self.prefix is None:
            return 0
        if self.interface_v1:
            q = self._page_keys_all(keys)
            g = 1 if self.is_mla else 2
        else:
            q = [self._flat_key(k) for k in keys]
            g = 1
        return int(self._client().prefix_match(q, group_size=g))

    def batch_get_v1(self, keys, host_indices, extra_info=None):
        """Read pages into the host pool at host_indices: [bool per page]."""
        keys = list(keys) if keys is not None else []
        return self._guard("batch_get_v1", [False] * len(keys), self._batch_get_v1, keys,
                           host_indices)

    def _batch_get_v1(self, keys, host_indices):
        okeys, ptrs, sizes = self._objects(keys, host_indices)
        if not keys:
            return []
        t = time.perf_counter()
        ok = self._per_page(self._get_arrays(okeys, ptrs, sizes), len(keys))
        if self.enable_storage_metrics:
            dt = max(time.perf_counter() - t, 1e-9)
            self.prefetch_pgs.append(len(keys))
            self.prefetch_bandwidth.append(len(keys) / dt * self.gb_per_page)
        return ok

    def batch_set_v1(self, keys, host_indices, extra_info=None):
        """Store the host pool's pages at host_indices under keys: [bool per page]; a page
        already stored counts as set. With MLA only TP rank 0 writes (every rank holds the
        same latent page, as SGLang's backup_skip); other ranks store nothing and answer
        True."""
        keys = list(keys) if keys is not None else []
        return self._guard("batch_set_v1", [False] * len(keys), self._batch_set_v1, keys,
                           host_indices)

    def _batch_set_v1(self, keys, host_indices):
        okeys, ptrs, sizes = self._objects(keys, host_indices)
        if not keys:
            return []
        if self.is_mla and self.tp_rank != 0:
            return [True] * len(keys)
        t = time.perf_counter()
        ok = self._per_page(self._put_arrays(okeys, ptrs, sizes), len(keys))
        if self.enable_storage_metrics:
            dt = max(time.perf_counter() - t, 1e-9)
            self.backup_pgs.append(len(keys))
            self.backup_bandwidth.append(len(keys) / dt * self.gb_per_page)
        return ok

    # ---- the generic interface: one object per key, in this rank's namespace ----

    def _flat_key(self, key):
        return f"{self._tag_key(key)}_{self.mla_suffix if self.is_mla else self.mha_suffix}"

    @staticmethod
    def _target(loc, size):
        """One object for a target: [(address, size)]. loc: an address (size required) or
        a buffer-protocol object, array or tensor (size, when given, must be its size)."""
        if isinstance(loc, int) and not isinstance(loc, bool):
            if size is None or int(size) <= 0:
                raise ValueError("an address needs a size")
            return [(loc, int(size))]
        if isinstance(loc, (bytes, bytearray)):
            loc = memoryview(loc)
        a, n = _span(loc)
        if size is not None and int(size) != n:
            raise ValueError(f"a target of {n} bytes with size {size}")
        return [(a, n)]

    def set(self, key, value=None, target_location=None, target_sizes=None):
        """Store one object: value (bytes-like, array or tensor) or the memory at
        target_location (an address with target_sizes). True when stored or already
        there."""
        return bool(self._guard("set", False, self._set_many, [key],
                                [value], [target_location], [target_sizes]))

    def batch_set(self, keys, values=None, target_locations=None, target_sizes=None):
        """set for each key; True when all are stored."""
        keys = list(keys) if keys is not None else []
        n = len(keys)
        return bool(self._guard("batch_set", False, self._set_many, keys,
                                values if values is not None else [None] * n,
                                target_locations if target_locations is not None
                                else [None] * n,
                                target_sizes if target_sizes is not None else [None] * n))

    def _set_many(self, keys, values, locs, sizes):
        if not keys or self.prefix is None or not (len(keys) == len(values) == len(locs)
                                                   == len(sizes)):
            return False
        objs = []
        for v, loc, s in zip(values, locs, sizes):
            if v is not None:   # values stay referenced by the caller's list meanwhile
                loc, s = v, None
            if loc is None:
                return False
            objs.append(self._target(loc, s))
        return all(self._put([self._flat_key(k) for k in keys], objs))

    def get(self, key, target_location=None, target_sizes=None):
        """Read one object: into target_location (a buffer, array or tensor, which is
        returned; or an address with target_sizes: True) when its value has exactly that
        size, else None; with no target, its bytes or None."""
        return self._guard("get", None, self._get_one, key, target_location, target_sizes)

    def batch_get(self, keys, target_locations=None, target_sizes=None):
        """get for each key: a list of its results."""
        keys = list(keys) if keys is not None else []
        n = len(keys)
        locs = target_locations if target_locations is not None else [None] * n
        sizes = target_sizes if target_sizes is not None else [None] * n
        if len(locs) != n or len(sizes) != n:
            self._warn("batch_get", f"{n} keys, {len(locs)} targets, {len(sizes)} sizes")
            return [None] * n
        return [self.get(k, loc, s) for k, loc, s in zip(keys, locs, sizes)]

    def _get_one(self, key, loc, size):
        if self.prefix is None:
            return None
        if loc is None:
            return self._client().get(self._flat_key(key), None)
        if not self._get([self._flat_key(key)], [self._target(loc, size)])[0]:
            return None
        return True if isinstance(loc, int) else loc

    def exists(self, key):
        """Whether the page key is stored whole (interface_v1), or the object set(key)
        stores (generic interface)."""
        return bool(self._guard("exists", False, self._batch_exists, [key]))

    # ---- the rest ----

    def clear(self):
        """Remove every object of kvstashd (its remove_all; the store is shared by all
        users of that daemon and tenant)."""
        self._guard("clear", None, lambda: self._client().remove_all())

    def get_stats(self):
        """SGLang's StorageMetrics (when importable) with the pages and bandwidth of the
        calls since the last get_stats; else the same as a dict."""
        pg, bg = self.prefetch_pgs, self.backup_pgs
        pb, bb = self.prefetch_bandwidth, self.backup_bandwidth
        self.prefetch_pgs, self.backup_pgs = [], []
        self.prefetch_bandwidth, self.backup_bandwidth = [], []
        try:
            try:
                from sglang.srt.observability.metrics_collector import StorageMetrics
            except ImportError:
                from sglang.srt.metrics.collector import StorageMetrics
            m = StorageMetrics()
            m.prefetch_pgs.extend(pg)
            m.backup_pgs.extend(bg)
            m.prefetch_bandwidth.extend(pb)
            m.backup_bandwidth.extend(bb)
            return m
        except Exception:
            return {"prefetch_pgs": pg, "backup_pgs": bg, "prefetch_bandwidth": pb,
                    "backup_bandwidth": bb, "path": self.path}

    def close(self):
        """Close every thread's connection (SGLang calls it when it detaches the backend)."""
        with self._clients_lock:
            cs, self._clients = self._clients, []
        for c in cs:
            try:
                c.close()
            except Exception:
                pass
