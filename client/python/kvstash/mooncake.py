"""kvstash.mooncake: Mooncake's Python store API (MooncakeDistributedStore) over kvstashd.

Code written against Mooncake's `mooncake.store.MooncakeDistributedStore` runs on kvstash by
changing its import to `from kvstash.mooncake import MooncakeDistributedStore,
ReplicateConfig` (docs/mooncake.md). This module owns that translation only: the method
names, argument forms and defaults of Mooncake's pybind module
(mooncake-integration/store/store_py.cpp), its return conventions (0 or a negative
ErrorCode, bytes read, empty bytes on a miss, 1/0 for existence, 0/1/2 for health) and the
mapping of kvstash's wire codes to Mooncake's negative codes. The protocol is client.py's;
memory and descriptors are buffers.py's.

Raw pointers: an engine registers address ranges with register_buffer(ptr, size) and then
names pointers inside them. A range in a shared mapping of a file the daemon accepts (a
sealable memfd) moves with no copy (the client registers the file once, found through
/proc/self/maps); anything else (private memory, a descriptor the daemon refuses) is copied
once through the client's registered staging buffer (ctypes.memmove), same bytes either
way. A pointer outside every registered range fails that key with INVALID_PARAMS (-600) and
its memory is never touched. Over TCP (no shared memory) values cross the socket.

Failures are return values, never exceptions: like Mooncake's module, only arguments of
the wrong Python type raise (TypeError, as pybind11 does). Threads: the store may be used
from many threads at once; each thread gets its own kvstash.Client (made at its first call),
so transfers of different threads run in parallel. A connection lost (daemon stopped or
restarted) fails the calls running on it with RPC_FAIL (-900); the next call of that thread
connects again.
"""

import ctypes
import logging
import operator
import os
import re
import threading
import weakref

from .client import Client
from .errors import (BUSY, CHECKSUM_MISMATCH, EXISTS, FORBIDDEN, INTERNAL, INVALID_ARGUMENT,
                     METHOD_NOT_FOUND, NO_SPACE, NOT_FOUND, OK, PROTOCOL_ERROR, QUOTA_EXCEEDED,
                     TIMEOUT, TOO_LARGE, UNAUTHORIZED, UNAVAILABLE, UNSUPPORTED, ConnectionLost,
                     Error)

log = logging.getLogger("kvstash.mooncake")

MATCHED = "kvcache-ai/Mooncake 3b5a594133958449a1feaf1c9e0fc1b553e34a28 (2026-08-22)"

# Mooncake's ErrorCode values (mooncake-store/include/types.h), the ones this module returns.
INTERNAL_ERROR = -1
NO_AVAILABLE_HANDLE = -200
INVALID_PARAMS = -600
ILLEGAL_CLIENT = -601
OBJECT_NOT_FOUND = -704
OBJECT_ALREADY_EXISTS = -705
OBJECT_HAS_LEASE = -706
MC_CHECKSUM_MISMATCH = -801
RPC_FAIL = -900
RPC_TIMEOUT = -901
NOT_SUPPORTED = -1012
TENANT_QUOTA_EXCEEDED = -1700

# health_check() (mooncake-store/include/pyclient.h, HealthCheckStatus)
HC_HEALTHY = 0
HC_NOT_INITIALIZED = 1
HC_MASTER_UNREACHABLE = 2

# kvstash wire code -> Mooncake ErrorCode (docs/mooncake.md, "Return codes")
CODE_MAP = {
    OK: 0,
    NOT_FOUND: OBJECT_NOT_FOUND,
    EXISTS: OBJECT_ALREADY_EXISTS,
    BUSY: OBJECT_HAS_LEASE,
    NO_SPACE: NO_AVAILABLE_HANDLE,
    TOO_LARGE: INVALID_PARAMS,
    INVALID_ARGUMENT: INVALID_PARAMS,
    METHOD_NOT_FOUND: NOT_SUPPORTED,
    PROTOCOL_ERROR: RPC_FAIL,
    UNAUTHORIZED: ILLEGAL_CLIENT,
    FORBIDDEN: ILLEGAL_CLIENT,
    QUOTA_EXCEEDED: TENANT_QUOTA_EXCEEDED,
    CHECKSUM_MISMATCH: MC_CHECKSUM_MISMATCH,
    TIMEOUT: RPC_TIMEOUT,
    UNAVAILABLE: RPC_FAIL,
    UNSUPPORTED: NOT_SUPPORTED,
    INTERNAL: INTERNAL_ERROR,
}

DEFAULT_LOCAL_BUFFER_SIZE = 16 << 20
DEFAULT_CLIENT_HTTP_PORT = 9300
ADDR_ENV = "KVSTASH_ADDR"
TOKEN_ENV = "KVSTASH_TOKEN"


def to_mooncake(code):
    """Mooncake's negative ErrorCode for a kvstash wire code (a batch_get_into result's
    minus sign is ignored); 0 for OK; INTERNAL_ERROR (-1) for a code this table lacks."""
    if not isinstance(code, int):
        return INTERNAL_ERROR
    return CODE_MAP.get(abs(code), INTERNAL_ERROR)


def _error_code(e):
    """Mooncake's code for an exception raised by the kvstash client (or _Fail)."""
    if isinstance(e, _Fail):
        return e.code
    if isinstance(e, ConnectionLost):
        return RPC_TIMEOUT if e.code == TIMEOUT else RPC_FAIL
    if isinstance(e, Error):
        return to_mooncake(e.code)
    if isinstance(e, OSError):
        return RPC_FAIL
    log.exception("kvstash.mooncake: unexpected failure")
    return INTERNAL_ERROR


class _Fail(Exception):
    """A call that cannot start: code is its Mooncake code."""

    def __init__(self, code):
        super().__init__(code)
        self.code = code


class SoftPinAction:
    """Mooncake's SoftPinAction values (replica.h)."""
    PRESERVE = 0
    ENABLE = 1
    DISABLE = 2


class ReplicateConfig:
    """Mooncake's ReplicateConfig: the same fields and defaults. kvstash is one daemon, so
    the replica counts and segment preferences are accepted and ignored; with_hard_pin pins
    stored objects hard (never evicted), soft_pin_action ENABLE pins them soft (evicted
    after every unpinned object)."""

    def __init__(self):
        self.replica_num = 1
        self.nof_replica_num = 0
        self.dfs_replica_num = 0
        self.soft_pin_action = SoftPinAction.PRESERVE
        self.soft_pin_ttl_ms = None
        self.with_hard_pin = False
        self.preferred_segments = []
        self.preferred_nof_segments = []
        self.preferred_segment = ""
        self.prefer_alloc_in_same_node = False
        self.data_type = 0
        self.group_ids = None

    def __str__(self):
        return ("ReplicateConfig: { " + ", ".join(f"{k}: {v!r}" for k, v in vars(self).items())
                + " }")

    __repr__ = __str__


def _pin_mode(config):
    if config is None:
        return None
    if getattr(config, "with_hard_pin", False):
        return "hard"
    if getattr(config, "soft_pin_action", SoftPinAction.PRESERVE) == SoftPinAction.ENABLE:
        return "soft"
    return None


# ---- argument checks: wrong types raise TypeError (as pybind11 does); values are codes ----

def _key(k):
    if isinstance(k, (str, bytes)):
        return k
    raise TypeError(f"a key must be str, not {type(k).__name__}")


def _keys(keys):
    if isinstance(keys, (str, bytes)):
        raise TypeError("keys must be a list of str, not one key")
    return [_key(k) for k in keys]


def _int(v):
    if isinstance(v, bool):
        return int(v)
    try:
        return operator.index(v)
    except TypeError:
        raise TypeError(f"an integer is required, not {type(v).__name__}") from None


def _ints(vs):
    return [_int(v) for v in vs]


def _nested_ints(vss):
    return [_ints(vs) for vs in vss]


_SIZE_UNITS = {"": 1, "b": 1, "k": 1 << 10, "kb": 1 << 10, "kib": 1 << 10, "m": 1 << 20,
               "mb": 1 << 20, "mib": 1 << 20, "g": 1 << 30, "gb": 1 << 30, "gib": 1 << 30,
               "t": 1 << 40, "tb": 1 << 40, "tib": 1 << 40}


def parse_size(v):
    """A byte count from an int or a string ("16777216", "16MB", "1.5 GiB"; units 1024-based),
    or None when it is not one."""
    if isinstance(v, int) and not isinstance(v, bool):
        return v if v >= 0 else None
    m = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]*)?)\s*([a-zA-Z]*)\s*", str(v))
    if not m or m.group(2).lower() not in _SIZE_UNITS:
        return None
    return int(float(m.group(1)) * _SIZE_UNITS[m.group(2).lower()])


def daemon_address(master_server_addr):
    """The kvstashd address for setup()'s master_server_addr: "kvstash://<addr>" names the
    daemon (<addr>: "host:port", "unix:/path" or "/path"); otherwise $KVSTASH_ADDR when set;
    otherwise master_server_addr itself (a "host:port" or a socket path)."""
    a = str(master_server_addr or "")
    if a.startswith("kvstash://"):
        return a[len("kvstash://"):]
    env = os.environ.get(ADDR_ENV)
    if env:
        return env
    return a


class MooncakeDistributedStore:
    """Mooncake's MooncakeDistributedStore over kvstashd. Make one, setup(...) it, use it from
    any number of threads, close() it."""

    def __init__(self):
        self._lock = threading.Lock()
        self._addr = None           # kvstashd address once set up; None before / after close
        self._client_kw = {}
        self._hostname = ""
        self._gen = 0               # bumped by setup and close: older thread clients are dropped
        self._local = threading.local()
        self._clients = weakref.WeakSet()
        self._ranges = ()           # registered (start, end) address ranges, a tuple snapshot
        self._whole = True          # the daemon takes batch_get_into's opts.whole

    # ---- setup and life ----

    def setup(self, *args, **kwargs):
        """setup(local_hostname, metadata_server, global_segment_size, local_buffer_size,
        protocol, rdma_devices, master_server_addr, engine=None, enable_ssd_offload=False,
        ssd_offload_path="", tenant_id="default", enable_client_http_server=False,
        client_http_port=9300) (the first seven required, as in Mooncake), or
        setup(config_dict) with the same keys (local_hostname and metadata_server required;
        the rest default as in Mooncake; sizes may be strings such as "4GB"). Connects to
        kvstashd (see daemon_address); 0 on success, INVALID_PARAMS (-600) for bad arguments, RPC_FAIL
        (-900) when the daemon cannot be reached, ILLEGAL_CLIENT (-601) when it refuses
        the tenant."""
        if len(args) == 1 and not kwargs and isinstance(args[0], dict):
            return self._setup_dict(args[0])
        if not args and set(kwargs) == {"config"} and isinstance(kwargs["config"], dict):
            return self._setup_dict(kwargs["config"])
        return self._setup_real(*args, **kwargs)

    def _setup_real(self, local_hostname, metadata_server, global_segment_size,
                    local_buffer_size, protocol, rdma_devices, master_server_addr, engine=None,
                    enable_ssd_offload=False, ssd_offload_path="", tenant_id="default",
                    enable_client_http_server=False,
                    client_http_port=DEFAULT_CLIENT_HTTP_PORT):
        for name, v in (("local_hostname", local_hostname), ("metadata_server", metadata_server),
                        ("protocol", protocol), ("rdma_devices", rdma_devices),
                        ("master_server_addr", master_server_addr)):
            if not isinstance(v, str):
                raise TypeError(f"setup(): {name} must be str, not {type(v).__name__}")
        gss, lbs = parse_size(global_segment_size), parse_size(local_buffer_size)
        if gss is None or lbs is None:
            return INVALID_PARAMS
        return self._connect(local_hostname, master_server_addr, lbs, tenant_id)

    def _setup_dict(self, config):
        cfg = {str(k): v for k, v in config.items()}
        host = str(cfg.get("local_hostname", "") or "")
        meta = str(cfg.get("metadata_server", "") or "")
        if not host or not meta:
            return INVALID_PARAMS
        lbs = parse_size(cfg.get("local_buffer_size", DEFAULT_LOCAL_BUFFER_SIZE))
        if lbs is None or parse_size(cfg.get("global_segment_size", 16 << 20)) is None:
            return INVALID_PARAMS
        master = cfg.get("master_server_addr", cfg.get("master_server_address",
                                                        "127.0.0.1:50051"))
        return self._connect(host, str(master), lbs, str(cfg.get("tenant_id", "default")))

    def _connect(self, hostname, master, local_buffer_size, tenant_id):
        addr = daemon_address(master)
        if not addr:
            return INVALID_PARAMS
        kw = {"staging_size": local_buffer_size or DEFAULT_LOCAL_BUFFER_SIZE}
        if tenant_id and tenant_id != "default":
            kw["tenant"] = tenant_id
            kw["token"] = os.environ.get(TOKEN_ENV, "")
        with self._lock:
            self._close_clients_locked()
            self._addr, self._client_kw, self._hostname = addr, kw, hostname
        try:
            self._client()
        except _Fail as f:
            with self._lock:
                self._addr = None
            return f.code
        return 0

    def _close_clients_locked(self):
        self._gen += 1
        for c in list(self._clients):
            try:
                c.close()
            except Exception:
                pass
        self._clients = weakref.WeakSet()

    def close(self):
        """Close every connection; later calls fail as before setup. Returns 0."""
        with self._lock:
            self._close_clients_locked()
            self._addr = None
            self._ranges = ()
        return 0

    def health_check(self):
        """0 healthy (kvstashd answers), 1 not set up or closed, 2 kvstashd unreachable."""
        if self._addr is None:
            return HC_NOT_INITIALIZED
        try:
            self._client().ping()
            return HC_HEALTHY
        except Exception:
            return HC_MASTER_UNREACHABLE

    def get_hostname(self):
        """The local_hostname given to setup ("" before)."""
        return self._hostname

    def _client(self):
        """This thread's Client, connected at its first call (or after its connection was
        lost). Raises _Fail with a Mooncake code."""
        gen, addr = self._gen, self._addr
        if addr is None:
            raise _Fail(INVALID_PARAMS)
        cur = getattr(self._local, "client", None)
        if cur is not None:
            if cur[0] == gen and not cur[1].closed:
                return cur[1]
            self._local.client = None
            try:
                cur[1].close()
            except Exception:
                pass
        try:
            c = Client(addr, **self._client_kw)
        except Exception as e:
            raise _Fail(_error_code(e)) from None
        with self._lock:
            if gen != self._gen:
                c.close()
                raise _Fail(INVALID_PARAMS)
            self._clients.add(c)
        self._local.client = (gen, c)
        return c

    # ---- statistics (kvstash's own) ----

    @property
    def zero_copy_bytes(self):
        """Bytes of raw-pointer transfers the daemon moved straight from/to the engine's memory,
        over this store's live connections."""
        return sum(c.zero_copy_bytes for c in list(self._clients))

    @property
    def staged_bytes(self):
        """Bytes of raw-pointer transfers copied through a staging buffer."""
        return sum(c.staged_bytes for c in list(self._clients))

    # ---- bytes API ----

    def put(self, key, value, config=None):
        """Store value (any bytes-like object) under key: 0, also when the key already exists
        (kvstash objects are write-once); else a negative code."""
        key = _key(key)
        memoryview(value)           # TypeError for a non-buffer, as pybind11
        try:
            c = self._client()
            c.put(key, value)
            code = 0
        except Exception as e:
            code = 0 if isinstance(e, Error) and e.code == EXISTS else _error_code(e)
        if code == 0:
            self._pin([key], config)
        return code

    def put_parts(self, key, *parts, config=None):
        """put of the parts' concatenation."""
        for p in parts:
            memoryview(p)
        return self.put(key, b"".join(bytes(memoryview(p)) for p in parts), config)

    def put_batch(self, keys, values, config=None):
        """Store values[i] under keys[i]: 0 when every key is stored (or existed), else the
        first key's negative code."""
        keys, values = _keys(keys), list(values)
        for v in values:
            memoryview(v)
        if len(keys) != len(values):
            return INVALID_PARAMS
        try:
            codes = self._client().batch_put(keys, values)
        except Exception as e:
            return _error_code(e)
        out = [0 if c in (OK, EXISTS) else to_mooncake(c) for c in codes]
        self._pin([k for k, c in zip(keys, out) if c == 0], config)
        return next((c for c in out if c != 0), 0)

    def get(self, key):
        """The value under key as bytes; empty bytes when it is missing or the call fails."""
        key = _key(key)
        try:
            v = self._client().get(key, default=None)
        except Exception:
            return b""
        return b"" if v is None else bytes(v)

    def get_batch(self, keys):
        """[bytes, ...]: each value, empty bytes for a missing one (all empty when the call
        fails)."""
        keys = _keys(keys)
        try:
            vals = self._client().batch_get(keys)
        except Exception:
            return [b""] * len(keys)
        return [b"" if v is None else bytes(v) for v in vals]

    def is_exist(self, key):
        """1 exists, 0 does not, negative code on failure."""
        key = _key(key)
        try:
            return 1 if self._client().is_exist(key) else 0
        except Exception as e:
            return _error_code(e)

    def batch_is_exist(self, keys):
        """[1 / 0 / negative code, ...]."""
        keys = _keys(keys)
        if not keys:
            return []
        try:
            return [1 if x else 0 for x in self._client().batch_is_exist(keys)]
        except Exception as e:
            return [_error_code(e)] * len(keys)

    def get_size(self, key):
        """The value's size, OBJECT_NOT_FOUND (-704) or another negative code."""
        key = _key(key)
        try:
            n = self._client().get_size(key, default=None)
        except Exception as e:
            return _error_code(e)
        return OBJECT_NOT_FOUND if n is None else n

    def remove(self, key, force=False):
        """0 removed, OBJECT_NOT_FOUND (-704), OBJECT_HAS_LEASE (-706: being read or written,
        or leased; force overrides a lease), or another negative code."""
        key = _key(key)
        try:
            self._client().remove(key, force=bool(force))
            return 0
        except Exception as e:
            return _error_code(e)

    def batch_remove(self, keys, force=False):
        """[0 / negative code, ...]."""
        keys = _keys(keys)
        if not keys:
            return []
        try:
            return [to_mooncake(c) for c in self._client().batch_remove(keys, force=bool(force))]
        except Exception as e:
            return [_error_code(e)] * len(keys)

    def remove_all(self, force=False):
        """Objects removed (those not busy), or a negative code."""
        try:
            return int(self._client().remove_all(force=bool(force)))
        except Exception as e:
            return _error_code(e)

    def _pin(self, keys, config):
        mode = _pin_mode(config)
        if mode and keys:
            try:
                self._client().pin(keys, mode)
            except Exception:
                pass

    # ---- registered memory and raw pointers ----

    def register_buffer(self, buffer_ptr, size):
        """Let later calls name pointers in [buffer_ptr, buffer_ptr + size). When the range
        lies in a shared mapping of a file the daemon takes (a memfd made with
        MFD_ALLOW_SEALING: it gets F_SEAL_SHRINK, permanently), that file is registered and
        transfers there are zero copy; otherwise they are copied through the staging buffer.
        0, or INVALID_PARAMS (-600) for a null pointer or size 0, or before setup."""
        ptr, size = _int(buffer_ptr), _int(size)
        if self._addr is None or ptr <= 0 or size <= 0:
            return INVALID_PARAMS
        with self._lock:
            if (ptr, ptr + size) not in self._ranges:
                self._ranges = self._ranges + ((ptr, ptr + size),)
        try:
            c = self._client()
            if c.is_unix:
                c.register_memory(ptr)
        except Exception as e:
            # not shareable, or refused by this daemon: pieces there are staged
            log.debug("register_buffer %#x+%d: copying through the staging buffer (%s)",
                      ptr, size, e)
        return 0

    def unregister_buffer(self, buffer_ptr):
        """Forget the range registered at buffer_ptr: 0, or INVALID_PARAMS (-600) when none
        starts there. When no registered range is left in its file, the daemon releases its
        mapping of it."""
        ptr = _int(buffer_ptr)
        with self._lock:
            gone = [r for r in self._ranges if r[0] == ptr]
            if not gone:
                return INVALID_PARAMS
            self._ranges = tuple(r for r in self._ranges if r[0] != ptr)
            left = self._ranges
            clients = list(self._clients)
        try:
            for c in clients:
                b = c.buffer_at(ptr)
                if b is not None and not any(c.buffer_at(s) is b for s, _ in left):
                    c.unregister_buffer(b)
        except Exception as e:
            log.debug("unregister_buffer %#x: %s", ptr, e)
        return 0

    def _covered(self, ptr, size):
        for s, e in self._ranges:
            if s <= ptr and ptr + size <= e:
                return True
        return False

    def _check_pieces(self, ptrs, sizes):
        """True when ptrs/sizes (lists) are a valid piece list inside registered ranges."""
        if len(ptrs) != len(sizes) or not ptrs:
            return False
        for p, s in zip(ptrs, sizes):
            if s < 0 or (s > 0 and (p <= 0 or not self._covered(p, s))):
                return False
        return sum(sizes) > 0

    def _todo(self, keys, all_ptrs, all_sizes):
        """A batch of pieces per key: (out, the indexes whose pieces pass _check_pieces),
        out INVALID_PARAMS for every key (all of them when the lists' lengths differ)."""
        n = len(keys)
        out = [INVALID_PARAMS] * n
        if len(all_ptrs) != n or len(all_sizes) != n:
            return out, []
        return out, [i for i in range(n) if self._check_pieces(all_ptrs[i], all_sizes[i])]

    def _put_pieces(self, keys, all_ptrs, all_sizes, config):
        out, todo = self._todo(keys, all_ptrs, all_sizes)
        if not todo:
            return out
        err = None
        try:
            c = self._client()
            tk = [keys[i] for i in todo]
            if c.is_unix:
                pieces = [[(p, 0, s) for p, s in zip(all_ptrs[i], all_sizes[i]) if s]
                          for i in todo]
                codes = c.batch_put_from(tk, pieces)
            else:
                codes = c.batch_put(tk, [b"".join(ctypes.string_at(p, s) for p, s in
                                                  zip(all_ptrs[i], all_sizes[i]) if s)
                                         for i in todo])
        except Exception as e:
            codes = [None] * len(todo)
            err = _error_code(e)
        for i, code in zip(todo, codes):
            out[i] = err if code is None else (0 if code in (OK, EXISTS) else to_mooncake(code))
        self._pin([keys[i] for i in todo if out[i] == 0], config)
        return out

    def _get_pieces(self, keys, all_ptrs, all_sizes):
        out, todo = self._todo(keys, all_ptrs, all_sizes)
        if not todo:
            return out
        for i in todo:
            out[i] = None
        try:
            c = self._client()
            tk = [keys[i] for i in todo]
            if c.is_unix:
                pieces = [[(p, 0, s) for p, s in zip(all_ptrs[i], all_sizes[i]) if s]
                          for i in todo]
                if self._whole:
                    # A value longer than its pieces fails whole (Mooncake writes nothing
                    # then): kvstashd's opts.whole refuses it per key (-TOO_LARGE,
                    # nothing written), so one round trip does it
                    try:
                        res = c.batch_get_into(tk, pieces, whole=True)
                    except ConnectionLost:
                        raise
                    except Error as e:
                        # a daemon before opts.whole refuses the third param
                        if e.code != INVALID_ARGUMENT or "params" not in (e.message or ""):
                            raise
                        self._whole = False     # then sizes first, from now on
                        log.info("kvstash.mooncake: kvstashd refused batch_get_into's "
                                 "whole option (%s); reading sizes first", e)
                if self._whole:
                    for i, r in zip(todo, res):
                        out[i] = r if isinstance(r, int) and r >= 0 else to_mooncake(r)
                else:
                    self._get_sized(c, todo, tk, pieces, all_sizes, out)
            else:
                vals = c.batch_get(tk)
                for i, v in zip(todo, vals):
                    out[i] = self._scatter(v, all_ptrs[i], all_sizes[i])
        except Exception as e:
            err = _error_code(e)
            for i in todo:
                if out[i] is None:
                    out[i] = err
        return out

    @staticmethod
    def _get_sized(c, todo, tk, pieces, all_sizes, out):
        """_get_pieces' read from a kvstashd without batch_get_into's whole option: sizes
        first (batch_get_size), so only values that fit are read; a value longer than its
        pieces would otherwise be cut at their end, answering their total as an exact fit
        does."""
        have = c.batch_get_size(tk)
        ready = []
        for k, (i, sz) in enumerate(zip(todo, have)):
            if sz is None:
                out[i] = OBJECT_NOT_FOUND
            elif sz > sum(all_sizes[i]):
                out[i] = INVALID_PARAMS
            elif sz == 0:
                out[i] = 0
            else:
                ready.append(k)
        if not ready:
            return
        res = c.batch_get_into([tk[k] for k in ready], [pieces[k] for k in ready])
        for k, r in zip(ready, res):
            i, sz = todo[k], have[k]
            if not isinstance(r, int) or r < 0:
                out[i] = to_mooncake(r)
            elif r > sz and r >= sum(all_sizes[i]):
                out[i] = INVALID_PARAMS     # replaced by a larger value since its size was asked
            else:
                out[i] = r

    @staticmethod
    def _scatter(v, ptrs, sizes):
        if v is None:
            return OBJECT_NOT_FOUND
        if len(v) > sum(sizes):
            return INVALID_PARAMS
        done = 0
        for p, s in zip(ptrs, sizes):
            k = min(s, len(v) - done)
            if k <= 0:
                break
            ctypes.memmove(p, bytes(v[done:done + k]), k)
            done += k
        return len(v)

    def put_from(self, key, buffer_ptr, size, config=None):
        """Store size bytes at buffer_ptr (in a registered range) under key: 0 (also for an
        existing key, and for size 0, which stores nothing, as Mooncake does), or a negative
        code (INVALID_PARAMS for a pointer outside every registered range)."""
        key, ptr, size = _key(key), _int(buffer_ptr), _int(size)
        if self._addr is None:
            return INVALID_PARAMS
        if size == 0:
            return 0
        return self._put_pieces([key], [[ptr]], [[size]], config)[0]

    def get_into(self, key, buffer_ptr, size):
        """Read key's value into [buffer_ptr, buffer_ptr + size): bytes read, or a negative
        code (OBJECT_NOT_FOUND; INVALID_PARAMS when the value is larger than size, nothing
        written, or the pointer is outside every registered range)."""
        key, ptr, size = _key(key), _int(buffer_ptr), _int(size)
        return self._get_pieces([key], [[ptr]], [[size]])[0]

    def batch_put_from(self, keys, buffer_ptrs, sizes, config=None):
        """put_from per key: [0 / negative code, ...] (size 0 is INVALID_PARAMS here, as
        Mooncake's batch form rejects empty objects)."""
        keys, ptrs, sizes = _keys(keys), _ints(buffer_ptrs), _ints(sizes)
        if len(ptrs) != len(keys) or len(sizes) != len(keys):
            return [INVALID_PARAMS] * len(keys)
        return self._put_pieces(keys, [[p] for p in ptrs], [[s] for s in sizes], config)

    def batch_get_into(self, keys, buffer_ptrs, sizes):
        """get_into per key: [bytes read / negative code, ...]."""
        keys, ptrs, sizes = _keys(keys), _ints(buffer_ptrs), _ints(sizes)
        if len(ptrs) != len(keys) or len(sizes) != len(keys):
            return [INVALID_PARAMS] * len(keys)
        return self._get_pieces(keys, [[p] for p in ptrs], [[s] for s in sizes])

    def batch_put_from_multi_buffers(self, keys, all_buffer_ptrs, all_sizes, config=None):
        """Object i is the concatenation of all_sizes[i][j] bytes at all_buffer_ptrs[i][j]:
        [0 / negative code, ...]."""
        keys = _keys(keys)
        ptrs, sizes = _nested_ints(all_buffer_ptrs), _nested_ints(all_sizes)
        return self._put_pieces(keys, ptrs, sizes, config)

    def batch_get_into_multi_buffers(self, keys, all_buffer_ptrs, all_sizes,
                                     prefer_alloc_in_same_node=False):
        """Value i fills its buffers in order: [bytes read / negative code, ...]
        (INVALID_PARAMS when the buffers' total is smaller than the value)."""
        keys = _keys(keys)
        ptrs, sizes = _nested_ints(all_buffer_ptrs), _nested_ints(all_sizes)
        return self._get_pieces(keys, ptrs, sizes)


__all__ = ["MooncakeDistributedStore", "ReplicateConfig", "SoftPinAction", "to_mooncake",
           "CODE_MAP", "daemon_address", "parse_size"]
