"""kvstash.client: Client, every method of protocol/SPEC.md over one connection.

This module owns the methods: their parameters, how a batch is split into requests
(max_batch keys, a bounded number of bytes and pieces each) and pipelined, what a result
means (an exception for single-key failures, per-key codes for batches), and which pieces
move by zero copy (memory of a registered file) or through the staging buffer (one memcpy).
The socket is wire.py's; memory, addresses and descriptors are buffers.py's.

Threads: one lock per Client serializes its calls, so a Client may be shared by threads;
they then take turns (for parallel transfers, use one Client per thread).
"""

import os
import ssl
import threading

from . import buffers
from .buffers import Buffer
from .iovs import Iovs
from .errors import (INVALID_ARGUMENT, NOT_FOUND, OK, PROTOCOL_ERROR, UNAVAILABLE, UNSUPPORTED,
                     Error)
from .wire import Conn

MIB = 1 << 20
MAX_PIECES = 65536          # per request (protocol/SPEC.md, "Shared-memory buffers")
PUT_REQUEST_BYTES = 16 * MIB
GET_REQUEST_KEYS = 1024
DEFAULT_STAGING = 64 * MIB
PROBE_KEY = b"\0kvstash-client-probe"     # never stored; read into zero-length pieces

_RAISE = object()


def _locked(fn):
    def wrapper(self, *args, **kw):
        with self._lock:
            return fn(self, *args, **kw)
    wrapper.__name__ = fn.__name__
    wrapper.__qualname__ = fn.__qualname__
    wrapper.__doc__ = fn.__doc__
    return wrapper


def _key(k):
    """A key as sent: bytes stay bin, str stays str (same bytes, same key); other
    bytes-like objects are copied into bytes."""
    if isinstance(k, (bytes, str)):
        return k
    try:
        return bytes(memoryview(k))
    except TypeError:
        raise Error(INVALID_ARGUMENT, None,
                    f"a key must be bytes, str or bytes-like, not {type(k).__name__}") from None


def _keys(keys):
    if isinstance(keys, (bytes, str)):
        raise Error(INVALID_ARGUMENT, None, "keys must be a sequence of keys, not one key")
    return [_key(k) for k in keys]


def _value(v):
    try:
        mv = memoryview(v)
    except TypeError:
        raise Error(INVALID_ARGUMENT, None,
                    f"a value must be bytes-like, not {type(v).__name__}") from None
    if not mv.c_contiguous:
        raise Error(INVALID_ARGUMENT, None, "a value must be C-contiguous")
    return mv.cast("B") if mv.format != "B" or mv.ndim != 1 else mv


def _opts(**kw):
    o = {k: v for k, v in kw.items() if v}
    return o or None


def _pieces_of(p):
    """One key's pieces as a list of (obj, offset, length) tuples: a list of pieces, one
    piece tuple, or a bare object (all of it)."""
    if isinstance(p, tuple) and len(p) in (2, 3) and not isinstance(p[0], (tuple, list)):
        return [p]
    if isinstance(p, (list, tuple)):
        return list(p)
    return [(p, 0, None)]


def refuses_whole(err):
    """True when the Error err is a daemon's refusal of batch_get_into's whole=True: a
    kvstashd from before opts.whole answers INVALID_ARGUMENT about its params."""
    return err.code == INVALID_ARGUMENT and "params" in (err.message or "")


class _Staged:
    """A piece whose memory is not shared: copied through the staging buffer."""
    __slots__ = ("addr", "length", "soff")

    def __init__(self, addr, length):
        self.addr, self.length, self.soff = addr, length, 0


class _Runs:
    """The staging copies of one round, pieces that follow each other on both sides
    merged into one memmove (a batch of adjacent pages in one arena is one copy)."""
    __slots__ = ("runs",)

    def __init__(self):
        self.runs = []

    def add(self, dst, src, n):
        if n <= 0:
            return
        if self.runs:
            last = self.runs[-1]
            if last[0] + last[2] == dst and last[1] + last[2] == src:
                last[2] += n
                return
        self.runs.append([dst, src, n])

    def copy(self):
        for dst, src, n in self.runs:
            buffers.copy(dst, src, n)


class Client:
    """A connection to kvstashd.

    addr: "host:port", "[v6]:port", "unix:/path" or a path (containing '/') of the Unix
    socket. timeout: seconds the socket may make no progress before the call fails with
    ConnectionLost(TIMEOUT) (None: wait forever). TLS (TCP only): ssl_context, or tls_ca
    (CA file the server's certificate must chain to) with tls_cert and tls_key (a client
    certificate, when the server asks); server_hostname defaults to the host of addr.
    tenant, token: authenticate (hello) at connect. auto_register: pieces in a shared file
    mapping not registered yet get their descriptor registered (see batch_put_from).
    staging_size: bytes of the staging buffer, made at first need (it grows for a larger
    key). window: requests in flight per batch.

    Raises ConnectionLost when the connection cannot be made, Error for hello's refusal.
    """

    def __init__(self, addr, *, timeout=30.0, ssl_context=None, tls_ca=None, tls_cert=None,
                 tls_key=None, server_hostname=None, tenant=None, token=None,
                 auto_register=True, staging_size=DEFAULT_STAGING, window=16):
        if ssl_context is None and (tls_ca or tls_cert):
            ssl_context = ssl.create_default_context(cafile=tls_ca)
            ssl_context.minimum_version = ssl.TLSVersion.TLSv1_2
            if tls_cert:
                ssl_context.load_cert_chain(tls_cert, tls_key)
        self._lock = threading.RLock()
        self._conn = Conn(addr, timeout, ssl_context, server_hostname)
        self.auto_register = auto_register
        self.window = max(1, int(window))
        self._staging_size = max(int(staging_size), 1 << 16)
        self._staging = None
        self._buffers = {}          # id -> Buffer
        self._by_file = {}          # (dev, ino) -> Buffer, the newest registered of that file
        self._refused = set()       # (dev, ino) auto registration could not take
        self._maps = buffers.MapCache()
        self._arena = None
        self.zero_copy_bytes = 0    # piece bytes the daemon moved straight from/to the caller
        self.staged_bytes = 0       # piece bytes copied through the staging buffer
        try:
            hopts = {}
            if tenant is not None:
                hopts = {"tenant": tenant, "token": token if token is not None else ""}
            self.server_info = self._call("hello", [hopts] if hopts else [])
        except BaseException:
            self._conn.close()
            raise
        if not isinstance(self.server_info, dict):
            self._conn.close()
            raise Error(PROTOCOL_ERROR, None, f"hello answered {self.server_info!r:.100}")

    # ---- life ----

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        try:
            self._conn.close()
        except Exception:
            pass

    @property
    def closed(self):
        """True once the connection is closed or broken."""
        return self._conn.broken is not None

    @property
    def is_unix(self):
        return self._conn.kind == "unix"

    @_locked
    def close(self):
        """Close the connection; the daemon releases its buffers and reservations. Our
        mappings of registered buffers and of the arena are released (views the caller still
        holds keep theirs alive). Idempotent."""
        self._conn.close()
        for b in list(self._buffers.values()):
            b._release()
        self._buffers.clear()
        self._by_file.clear()
        self._staging = None
        self._maps.close()
        if self._arena is not None:
            try:
                self._arena.close()
            except BufferError:
                pass
            self._arena = None

    def _limit(self, name, default):
        v = self.server_info.get(name) if isinstance(getattr(self, "server_info", None),
                                                     dict) else None
        return v if isinstance(v, int) and v > 0 else default

    # ---- plumbing ----

    def _call(self, method, params):
        (err, result), = self._conn.exchange([self._conn.request(method, params)])
        if err is not None:
            raise err
        return result

    def _batch(self, requests, per_request):
        """Pipeline requests; per_request(result) -> list of per-key results; concatenated.
        A request-level error is raised once every reply has been read."""
        out = []
        first = None
        for err, result in self._conn.exchange(requests, self.window):
            if err is not None:
                first = first or err
                continue
            part = per_request(result)
            out.extend(part)
        if first is not None:
            raise first
        return out

    def _keys_requests(self, method, keys, chunk, *extra):
        n = len(keys)
        step = max(1, min(chunk, self._limit("max_batch", 16384)))
        for i in range(0, n, step):
            yield self._conn.request(method, [keys[i:i + step], *extra])
        if n == 0:
            yield self._conn.request(method, [[], *extra])

    @staticmethod
    def _list_of():
        def check(result):
            if not isinstance(result, list):
                raise Error(PROTOCOL_ERROR, None, f"expected an array, got {result!r:.100}")
            return result
        return check

    @_locked
    def call(self, method, *params):
        """Any method by name with msgpack-able params: its result, or Error (request-level).
        For methods this class does not wrap (rdma_connect, ...)."""
        return self._call(method, list(params))

    # ---- simple methods ----

    @_locked
    def ping(self):
        """"pong"."""
        return self._call("ping", [])

    @_locked
    def hello(self, **opts):
        """hello with opts (tenant=..., token=... authenticates; rdma=True asks for the
        daemon's queue pair): the server's map, also kept as server_info."""
        info = self._call("hello", [opts] if opts else [])
        if isinstance(info, dict):
            self.server_info = info
        return info

    @_locked
    def put(self, key, value, *, durable=False):
        """Store value (bytes-like) under key. Returns None; raises Error with the key's code:
        EXISTS (write-once), BUSY, NO_SPACE, TOO_LARGE, QUOTA_EXCEEDED, UNSUPPORTED (durable
        without an SSD tier), ..."""
        codes = self._put_requests_run([_key(key)], [_value(value)], durable, single=True)
        if codes[0] != OK:
            raise Error(codes[0], None, f"put {key!r:.80}")

    @_locked
    def batch_put(self, keys, values, *, durable=False):
        """Store values[i] under keys[i]: [code, ...] (OK, EXISTS, BUSY, NO_SPACE, TOO_LARGE,
        ...). Split into requests of at most max_batch keys and about 16 MiB, pipelined."""
        keys = _keys(keys)
        values = [_value(v) for v in values]
        if len(keys) != len(values):
            raise Error(INVALID_ARGUMENT, None,
                        f"{len(keys)} keys and {len(values)} values")
        return self._put_requests_run(keys, values, durable)

    def _put_requests_run(self, keys, values, durable, single=False):
        opts = _opts(durable=durable)
        max_batch = self._limit("max_batch", 16384)
        budget = min(PUT_REQUEST_BYTES, self._limit("max_message_size", 1 << 30) // 2)

        def requests():
            i, n = 0, len(keys)
            while i < n or (n == 0 and i == 0):
                j, size = i, 0
                while j < n and j - i < max_batch and (j == i or size + values[j].nbytes
                                                         <= budget):
                    size += values[j].nbytes
                    j += 1
                if single:
                    msgid, e = self._conn.encoder("put", 3 if opts else 2)
                    e.obj(keys[0])
                    e.bin(values[0])
                else:
                    msgid, e = self._conn.encoder("batch_put", 3 if opts else 2)
                    e.array(j - i)
                    for k in keys[i:j]:
                        e.obj(k)
                    e.array(j - i)
                    for v in values[i:j]:
                        e.bin(v)
                if opts:
                    e.obj(opts)
                yield msgid, e.finish()
                if n == 0:
                    return
                i = j

        if single:
            return self._batch(requests(), lambda r: [r])
        return self._batch(requests(), self._list_of())

    def _lookup(self, method, key, default):
        """get or get_size of one key: a miss raises Error(NOT_FOUND) unless default."""
        v = self._call(method, [_key(key)])
        if v is None:
            if default is _RAISE:
                raise Error(NOT_FOUND, None, f"{method} {key!r:.80}")
            return default
        return v

    @_locked
    def get(self, key, default=_RAISE):
        """The value (bytes) under key; a missing key raises Error(NOT_FOUND), or returns
        default when one is given."""
        return self._lookup("get", key, default)

    @_locked
    def batch_get(self, keys):
        """[bytes or None, ...]. Pipelined requests of at most 1024 keys."""
        return self._batch(self._keys_requests("batch_get", _keys(keys), GET_REQUEST_KEYS),
                           self._list_of())

    @_locked
    def is_exist(self, key):
        return bool(self._call("is_exist", [_key(key)]))

    @_locked
    def batch_is_exist(self, keys):
        """[bool, ...]."""
        return self._batch(self._keys_requests("batch_is_exist", _keys(keys), 1 << 30),
                           self._list_of())

    @_locked
    def prefix_match(self, keys, group_size=None):
        """Leading keys (or, with group_size g, leading groups of g keys) that all exist. More
        than max_batch keys are asked whole groups at a time, stopping at the first request
        that does not match completely."""
        keys = _keys(keys)
        g = group_size or 1
        if g < 1 or len(keys) % g:
            # the daemon's own answer for a bad group size, without sending
            if len(keys) <= self._limit("max_batch", 16384):
                return self._call("prefix_match", [keys, {"group_size": group_size}])
            raise Error(INVALID_ARGUMENT, None,
                        f"{len(keys)} keys are not groups of {group_size}")
        opts = [{"group_size": g}] if group_size else []
        step = max(g, self._limit("max_batch", 16384) // g * g)
        total = 0
        for i in range(0, len(keys), step):
            part = keys[i:i + step]
            m = self._call("prefix_match", [part, *opts])
            total += m
            if m * g < len(part):
                break
        if not keys:
            return self._call("prefix_match", [[], *opts])
        return total

    @_locked
    def get_size(self, key, default=_RAISE):
        """The size of key's value; a missing key raises Error(NOT_FOUND) unless default."""
        return self._lookup("get_size", key, default)

    @_locked
    def batch_get_size(self, keys):
        """[int or None, ...]."""
        return self._batch(self._keys_requests("batch_get_size", _keys(keys), 1 << 30),
                           self._list_of())

    @_locked
    def remove(self, key, *, force=False):
        """Remove key. Returns None; raises Error(NOT_FOUND) or Error(BUSY) (being read or
        written, or leased; force=True overrides a lease)."""
        opts = _opts(force=force)
        code = self._call("remove", [_key(key), opts] if opts else [_key(key)])
        if code != OK:
            raise Error(code, None, f"remove {key!r:.80}")

    @_locked
    def batch_remove(self, keys, *, force=False):
        """[code, ...]: OK, NOT_FOUND or BUSY."""
        opts = _opts(force=force)
        extra = [opts] if opts else []
        return self._batch(self._keys_requests("batch_remove", _keys(keys), 1 << 30, *extra),
                           self._list_of())

    @_locked
    def remove_all(self, *, force=False):
        """Remove every object that is not busy (this tenant's, when authenticated): the
        number removed."""
        opts = _opts(force=force)
        return self._call("remove_all", [opts] if opts else [])

    @_locked
    def pin(self, keys, mode="soft"):
        """Pin keys ("soft": evicted after every unpinned object; "hard": never): [code, ...],
        OK or NOT_FOUND."""
        return self._batch(self._keys_requests("pin", _keys(keys), 1 << 30, mode),
                           self._list_of())

    @_locked
    def unpin(self, keys):
        """[code, ...], OK or NOT_FOUND."""
        return self._batch(self._keys_requests("unpin", _keys(keys), 1 << 30),
                           self._list_of())

    @_locked
    def stats(self):
        """The daemon's counters: {name: int}."""
        return self._call("stats", [])

    @_locked
    def cluster_info(self, keys=None):
        """The pool as the daemon sees it (docs/cluster.md): its map; with keys, "owners"
        holds each key's owners as indices into "nodes"."""
        return self._call("cluster_info", [_keys(keys)] if keys is not None else [])

    # ---- registered buffers ----

    def _register(self, fd, size, mm=None, refused_hint=""):
        """register_buffer of fd (size bytes) -> Buffer. fd stays the caller's."""
        if not self.is_unix:
            raise Error(UNSUPPORTED, None,
                        "shared-memory buffers need a Unix-socket connection")
        st = os.fstat(fd)
        req = self._conn.request("register_buffer", [{"size": size}])
        (err, bid), = self._conn.exchange([req], send_fds=[fd])
        if err is not None:
            if err.code == INVALID_ARGUMENT:
                raise Error(err.code, err.name, f"kvstashd refused the descriptor: {err.message}"
                            f"{refused_hint}")
            raise err
        if not isinstance(bid, int):
            raise Error(PROTOCOL_ERROR, None, f"register_buffer answered {bid!r:.80}")
        b = Buffer(self, bid, size, st.st_dev, st.st_ino, mm)
        self._buffers[bid] = b
        self._by_file[(st.st_dev, st.st_ino)] = b
        return b

    @_locked
    def register_buffer(self, size):
        """A new shared-memory buffer of size zeroed bytes: a memfd sealed against shrinking
        and growing, mapped here (Buffer.memory) and registered with the daemon. Unix socket
        only (else Error(UNSUPPORTED)). Register once, use for many transfers."""
        if not isinstance(size, int) or size <= 0:
            raise Error(INVALID_ARGUMENT, None, f"a buffer of {size!r} bytes")
        fd = buffers.new_memfd(size)
        try:
            mm = buffers.map_fd(fd, size)
            try:
                return self._register(fd, size, mm)
            except BaseException:
                mm.close()
                raise
        finally:
            os.close(fd)

    @_locked
    def register_fd(self, fd, size=None):
        """Register the caller's shared memory: fd, open read-write, of a memfd or a file on
        tmpfs or hugetlbfs (a /dev/shm file), size bytes of it from offset 0 (default: the
        whole file). A memfd made with MFD_ALLOW_SEALING gets F_SEAL_SHRINK (permanently);
        one that cannot be sealed is registered as it is, and kvstashd guards it (a transfer
        during which the file shrinks fails, with UNAVAILABLE per key, and the daemon drops
        the buffer). It is mapped here too (Buffer.memory), and any other mapping of the
        file (an mmap, a numpy array over it) may be named in pieces. fd stays the caller's.
        Anything else (a pipe, a socket, a file on a disk) gets Error(INVALID_ARGUMENT)."""
        buffers.seal_shrink(fd)
        if size is None:
            size = os.fstat(fd).st_size
        if size <= 0:
            raise Error(INVALID_ARGUMENT, None, f"register_fd: {size} bytes")
        try:
            mm = buffers.map_fd(fd, size)
        except (OSError, ValueError) as e:
            raise Error(INVALID_ARGUMENT, None, f"register_fd: cannot map it read-write: {e}") \
                from None
        try:
            return self._register(fd, size, mm)
        except BaseException:
            mm.close()
            raise

    @_locked
    def register_memory(self, obj):
        """Register the file behind obj's memory (a buffer-protocol object, a tensor or an
        address) when it lies in a shared mapping of a file that has a descriptor (a memfd,
        a /dev/shm file): the whole file is registered, and pieces anywhere in its mappings
        then move with no copy. Raises Error(INVALID_ARGUMENT) when obj's memory is not in
        such a mapping or no descriptor can be found, or when kvstashd refuses it (not
        shared memory; see register_fd)."""
        m = buffers.memory_of(obj, False)
        try:
            mp = self._maps.view().find(m.addr, m.nbytes or 1)
        finally:
            m.release()
        if mp is None:
            raise Error(INVALID_ARGUMENT, None,
                        "register_memory: the memory is not in a shared mapping of a file")
        b = self._register_mapping(mp)
        if b is None:
            raise Error(INVALID_ARGUMENT, None,
                        f"register_memory: no descriptor for {mp.path or 'the mapping'}")
        return b

    def _register_mapping(self, mp):
        b = self._by_file.get((mp.dev, mp.ino))
        if b is not None and not b.closed:
            return b
        fd = buffers.find_descriptor(mp)
        if fd is None:
            return None
        try:
            buffers.seal_shrink(fd)     # when it allows sealing; else kvstashd guards it
            size = os.fstat(fd).st_size
            return self._register(fd, size, None,
                                  f" ({mp.path or 'the file'}: pieces there are copied through "
                                  "the staging buffer instead)")
        finally:
            os.close(fd)

    @_locked
    def unregister_buffer(self, buf):
        """Tell the daemon to forget buf and release our mapping of it. Raises
        Error(NOT_FOUND) when the daemon did not know it (it is released anyway)."""
        if not isinstance(buf, Buffer) or buf.client is not self:
            raise Error(INVALID_ARGUMENT, None, "not a buffer registered on this client")
        if buf.closed:
            return
        self._forget(buf)
        code = self._call("unregister_buffer", [buf.id])
        if code != OK:
            raise Error(code, None, f"unregister_buffer {buf.id}")

    def _forget(self, buf):
        """Drop our record of buf and release our mapping of it (the daemon's side is the
        caller's business)."""
        self._buffers.pop(buf.id, None)
        if self._by_file.get((buf.dev, buf.ino)) is buf:
            del self._by_file[(buf.dev, buf.ino)]
        if self._staging is buf:
            self._staging = None
        buf._release()

    def _find_dropped(self, resolved, results, staging, get, dropped):
        """After a transfer: when a key failed with UNAVAILABLE (its buffer shrank during the
        transfer, and the daemon dropped it) or INVALID_ARGUMENT (a piece the daemon refused:
        our pieces are checked against their buffers before sending, so the buffer is
        likely unknown to it, dropped by an earlier transfer), ask the daemon which of those
        keys' buffers it still has, and forget the others: a file registered automatically
        is registered again at its next use, and a Buffer the caller holds is closed
        (naming it raises INVALID_ARGUMENT, as after unregister_buffer). The question is
        one batch_get_into of a zero-length piece per buffer (a key that is never stored):
        -INVALID_ARGUMENT means the id is gone; it writes nothing. The buffers gone are
        appended to dropped, for the caller to _forget once the transfer's memory is
        released."""
        bad = (-UNAVAILABLE, -INVALID_ARGUMENT) if get else (UNAVAILABLE, INVALID_ARGUMENT)
        ids = []
        for r, res in zip(resolved, results):
            if res in bad:
                for p in r:
                    bid = staging.id if isinstance(p, _Staged) else p[1]
                    if bid in self._buffers and bid not in ids:
                        ids.append(bid)
        self._probe_dropped(ids, dropped)

    def _probe_dropped(self, ids, dropped):
        """Of the registered buffer ids, append those the daemon no longer has to dropped
        (see _find_dropped)."""
        if not ids:
            return
        req = self._conn.request("batch_get_into", [[PROBE_KEY] * len(ids),
                                                    [[[bid, 0, 0]] for bid in ids]])
        try:
            (err, res), = self._conn.exchange([req])
        except Error:
            return          # the connection is gone: so is every buffer, at the next call
        if err is not None or not isinstance(res, list):
            return
        for bid, r in zip(ids, res):
            if r == -INVALID_ARGUMENT and bid in self._buffers:
                dropped.append(self._buffers[bid])

    # ---- transfers through registered memory ----

    def _resolve(self, pieces_list, n, writable, held):
        """Per key, a list of ("z", id, offset, length) or _Staged, for the pieces of
        batch_put_from / batch_get_into. Memory objects are appended to held (released by
        the caller once the transfer is over). Each object is exported, and where it lies
        looked up, once per call, however many pieces name it."""
        if len(pieces_list) != n:
            raise Error(INVALID_ARGUMENT, None, f"{n} keys and {len(pieces_list)} piece lists")
        view = None
        based = [b for b in self._buffers.values() if b.base is not None]
        objs = {}       # id(obj) -> (obj, Memory, where): obj kept, so its id stays its own
        out = []
        for i, p in enumerate(pieces_list):
            res = []
            for j, piece in enumerate(_pieces_of(p)):
                if not isinstance(piece, (tuple, list)) or len(piece) not in (2, 3):
                    raise Error(INVALID_ARGUMENT, None,
                                f"key {i}, piece {j}: want (buffer, offset, length)")
                obj, off = piece[0], piece[1]
                length = piece[2] if len(piece) == 3 else None
                if not isinstance(off, int) or not (length is None or isinstance(length, int)):
                    raise Error(INVALID_ARGUMENT, None,
                                f"key {i}, piece {j}: offset and length must be ints")
                known = objs.get(id(obj))
                if known is not None and known[0] is obj:
                    mem, where = known[1], known[2]
                elif isinstance(obj, int):
                    mem, where = buffers.memory_of(obj, writable), None
                else:
                    if isinstance(obj, Buffer):
                        if obj.client is not self or obj.closed:
                            raise Error(INVALID_ARGUMENT, None,
                                        f"key {i}, piece {j}: {obj!r} is not registered here")
                        if obj.memory is None:
                            length = obj.size - off if length is None else length
                            if off < 0 or length < 0 or off + length > obj.size:
                                raise Error(INVALID_ARGUMENT, None,
                                            f"key {i}, piece {j}: [{off}, {off}+{length}) is "
                                            f"outside the buffer's {obj.size} bytes")
                            if length:
                                res.append(("z", obj.id, off, length))
                            continue
                        mem = buffers.memory_of(obj.memory, writable)
                    else:
                        mem = buffers.memory_of(obj, writable)
                    held.append(mem)
                    known = objs[id(obj)] = [obj, mem, False]
                    where = False
                if length is None:
                    if mem.nbytes is None:
                        raise Error(INVALID_ARGUMENT, None,
                                    f"key {i}, piece {j}: an address needs a length")
                    length = mem.nbytes - off
                if off < 0 or length < 0 or (mem.nbytes is not None
                                             and off + length > mem.nbytes):
                    raise Error(INVALID_ARGUMENT, None,
                                f"key {i}, piece {j}: [{off}, {off}+{length}) is outside "
                                f"its buffer's {mem.nbytes} bytes")
                if length == 0:
                    continue
                if where is False:
                    # the first piece of this object: where does all of it lie?
                    if view is None:
                        view = self._maps.view()
                    where = known[2] = self._where(based, view, mem.addr, mem.nbytes)
                if where == "s":
                    res.append(_Staged(mem.addr + off, length))
                elif where is not None:
                    res.append(("z", where[0], where[1] + off, length))
                else:
                    addr = mem.addr + off
                    z = self._zero_copy(based, addr, length)
                    if z is None:
                        if view is None:
                            view = self._maps.view()
                        z = self._zero_copy_mapped(view, addr, length)
                    res.append(z if z is not None else _Staged(addr, length))
            out.append(res)
        return out

    def _where(self, based, view, addr, nbytes):
        """Where all of an object's nbytes at addr lie: (buffer id, offset there of addr)
        when in one registered file; "s" when in memory that is no shared file mapping
        (staged); None when neither holds all of it (then each piece is looked up)."""
        if not nbytes:
            return None
        z = self._zero_copy(based, addr, nbytes)
        if z is None:
            start, end, mp = view.region(addr)
            if addr + nbytes > end:
                return None
            if mp is None:
                return "s"
            z = self._zero_copy_mapped(view, addr, nbytes)
        return (z[1], z[2]) if z is not None else None

    @staticmethod
    def _zero_copy(based, addr, length):
        for b in based:
            if b.base <= addr and addr + length <= b.base + b.size:
                return ("z", b.id, addr - b.base, length)
        return None

    def _zero_copy_mapped(self, view, addr, length):
        mp = view.find(addr, length)
        if mp is None:
            return None
        fid = (mp.dev, mp.ino)
        b = self._by_file.get(fid)
        if (b is None or b.closed) and self.auto_register and fid not in self._refused:
            try:
                b = self._register_mapping(mp)
            except Error:
                b = None
            if b is None:
                self._refused.add(fid)
        if b is None or b.closed:
            return None
        off = mp.offset + (addr - mp.start)
        if off + length > b.size:
            return None
        return ("z", b.id, off, length)

    @_locked
    def buffer_at(self, addr, length=1):
        """The registered Buffer of this client that holds [addr, addr + length) of this
        process's memory (addr an int address or any object memory_of takes; its own
        mapping, or any mapping of its file), or None. Registers nothing."""
        mem = buffers.memory_of(addr, False)
        try:
            a = mem.addr
        finally:
            mem.release()
        based = [b for b in self._buffers.values() if b.base is not None]
        z = self._zero_copy(based, a, length)
        if z is None:
            mp = self._maps.view().find(a, length)
            if mp is None:
                return None
            b = self._by_file.get((mp.dev, mp.ino))
            if b is None or b.closed or mp.offset + (a - mp.start) + length > b.size:
                return None
            return b
        return self._buffers.get(z[1])

    def _staging_for(self, need):
        if self._staging is None or self._staging.size < need:
            if self._staging is not None:
                old, self._staging = self._staging, None
                self.unregister_buffer(old)
            size = max(self._staging_size, (need + MIB - 1) // MIB * MIB)
            self._staging = self.register_buffer(size)
        return self._staging

    def _rounds(self, resolved):
        """Split keys into rounds whose staged bytes fit the staging buffer; assign each
        staged piece its offset there. Yields (start, end, staging or None)."""
        n = len(resolved)
        need = [sum(p.length for p in r if isinstance(p, _Staged)) for r in resolved]
        i = 0
        while i < n or (n == 0 and i == 0):
            cap = max(self._staging.size if self._staging else 0, self._staging_size)
            j, total = i, 0
            while j < n and (j == i or total + need[j] <= cap):
                total += need[j]
                j += 1
            staging = self._staging_for(total) if total else None
            soff = 0
            for r in resolved[i:j]:
                for p in r:
                    if isinstance(p, _Staged):
                        p.soff = soff
                        soff += p.length
            yield i, j, staging
            if n == 0:
                return
            i = j

    def _iovs(self, r, staging):
        iovs = []
        for p in r:
            if isinstance(p, _Staged):
                piece = [staging.id, p.soff, p.length]
                last = iovs[-1] if iovs else None
                if last is not None and last[0] == staging.id and last[1] + last[2] == p.soff:
                    last[2] += p.length
                    continue
                iovs.append(piece)
            else:
                iovs.append([p[1], p[2], p[3]])
        return iovs

    def _transfer_requests(self, method, keys, iovs, extra):
        max_batch = self._limit("max_batch", 16384)
        i, n = 0, len(keys)
        while i < n or (n == 0 and i == 0):
            j, npieces = i, 0
            while j < n and j - i < max_batch and (j == i or npieces + len(iovs[j])
                                                     <= MAX_PIECES):
                npieces += len(iovs[j])
                j += 1
            yield self._conn.request(method, [keys[i:j], iovs[i:j], *extra])
            if n == 0:
                return
            i = j

    def _count(self, resolved):
        for r in resolved:
            for p in r:
                if isinstance(p, _Staged):
                    self.staged_bytes += p.length
                else:
                    self.zero_copy_bytes += p[3]

    @_locked
    def batch_put_from(self, keys, pieces, *, durable=False):
        """Store n objects whose values are in memory: value i is the concatenation of
        pieces[i], a list of (buffer, offset, length) (or one such tuple, or one object
        whole; length None: to its end). buffer: a Buffer, any C-contiguous buffer-protocol
        object (memoryview, bytearray, mmap, numpy array), a CPU tensor (data_ptr()), or an
        int address (then length is required; the memory is the caller's promise).

        Memory in a registered file (a Buffer's, or any mapping of a registered memfd) moves
        with no copy: the daemon reads it. Memory in a shared mapping of a file not yet
        registered is registered first when auto_register (see register_memory) and the
        daemon takes it. Any other memory is copied once (memcpy) into the staging buffer,
        which the daemon reads: never through the socket. Results are the same either way.

        Returns [code, ...] as batch_put. A piece outside its object raises
        Error(INVALID_ARGUMENT) before anything is sent. Unix socket only.

        pieces may also be a kvstash.iovs.Iovs: every piece already in a Buffer of this
        client, the same number per key, as arrays (an adapter's batch built at once, packed
        with no Python object per piece); same requests, same results."""
        keys = _keys(keys)
        opts = _opts(durable=durable)
        if isinstance(pieces, Iovs):
            return self._iov_transfer("batch_put_from", keys, pieces, [opts] if opts else [],
                                      False)
        held, dropped = [], []
        try:
            resolved = self._resolve(pieces, len(keys), False, held)
            self._count(resolved)
            out = []
            for i, j, staging in self._rounds(resolved):
                if staging is not None:
                    runs = _Runs()
                    for r in resolved[i:j]:
                        for p in r:
                            if isinstance(p, _Staged):
                                runs.add(staging.base + p.soff, p.addr, p.length)
                    runs.copy()
                iovs = [self._iovs(r, staging) for r in resolved[i:j]]
                res = self._batch(self._transfer_requests(
                    "batch_put_from", keys[i:j], iovs, [opts] if opts else []),
                    self._list_of())
                self._find_dropped(resolved[i:j], res, staging, False, dropped)
                out += res
            return out
        finally:
            for m in held:
                m.release()
            for b in dropped:
                self._forget(b)

    @_locked
    def batch_get_into(self, keys, pieces, *, whole=False):
        """Read n values into memory: value i fills pieces[i] in order (pieces as in
        batch_put_from, writable). Returns [int, ...]: bytes written (the value's size when
        the pieces hold it; their total when the value is longer and was cut; the bytes after
        a shorter value are untouched), or -NOT_FOUND (-1) for a missing key. Memory is
        reached as in batch_put_from: zero copy where it is registered shared memory, else
        the daemon writes the staging buffer and the client copies (one memcpy) what it
        wrote. A piece outside its object raises Error(INVALID_ARGUMENT) before anything is
        sent. Pieces must not overlap. pieces may be an Iovs, as in batch_put_from.
        whole=True: a value longer than its pieces is not cut; its key answers -TOO_LARGE
        (-5) and none of its pieces is written (kvstashd's opts.whole; one round trip where
        asking batch_get_size first takes two)."""
        keys = _keys(keys)
        extra = [{"whole": True}] if whole else []
        if isinstance(pieces, Iovs):
            return self._iov_transfer("batch_get_into", keys, pieces, extra, True)
        held, dropped = [], []
        try:
            resolved = self._resolve(pieces, len(keys), True, held)
            self._count(resolved)
            out = []
            for i, j, staging in self._rounds(resolved):
                iovs = [self._iovs(r, staging) for r in resolved[i:j]]
                res = self._batch(self._transfer_requests("batch_get_into", keys[i:j], iovs,
                                                          extra), self._list_of())
                if staging is not None:
                    runs = _Runs()
                    for r, got in zip(resolved[i:j], res):
                        if not isinstance(got, int) or got <= 0:
                            continue
                        done = 0
                        for p in r:
                            if isinstance(p, _Staged):
                                length = p.length
                                if got - done < length:
                                    length = got - done
                                runs.add(p.addr, staging.base + p.soff, length)
                                done += p.length
                            else:
                                done += p[3]
                            if done >= got:
                                break
                    runs.copy()
                self._find_dropped(resolved[i:j], res, staging, True, dropped)
                out += res
            return out
        finally:
            for m in held:
                m.release()
            for b in dropped:
                self._forget(b)

    def _iov_transfer(self, method, keys, iov, extra, get):
        """batch_put_from / batch_get_into with pieces given as an Iovs: checked as a whole
        (its buffers registered here and open), split into requests of at most max_batch
        keys and MAX_PIECES pieces, each request's iovs packed in one piece of bytes."""
        n = len(keys)
        if iov.n != n:
            raise Error(INVALID_ARGUMENT, None, f"{n} keys and pieces for {iov.n} keys")
        for b in iov.bufs:
            if not isinstance(b, Buffer) or b.client is not self or b.closed:
                raise Error(INVALID_ARGUMENT, None, f"{b!r} is not a buffer registered here")
        if not self.is_unix:
            raise Error(UNSUPPORTED, None, "shared-memory buffers need a Unix-socket connection")
        m = iov.per_key
        step = max(1, min(self._limit("max_batch", 16384), MAX_PIECES // m))
        nparams = 2 + len(extra)

        def requests():
            i = 0
            while i < n or (n == 0 and i == 0):
                j = min(n, i + step)
                msgid, e = self._conn.encoder(method, nparams)
                e.obj(keys[i:j])
                e.cur += iov.packed(i, j)
                for x in extra:
                    e.obj(x)
                yield msgid, e.finish()
                if n == 0:
                    return
                i = j

        out = self._batch(requests(), self._list_of())
        self.zero_copy_bytes += iov.nbytes(0, n)
        bad = (-UNAVAILABLE, -INVALID_ARGUMENT) if get else (UNAVAILABLE, INVALID_ARGUMENT)
        failed = [k for k, r in enumerate(out) if r in bad]
        if failed:
            dropped = []
            self._probe_dropped([b for b in iov.ids_of(failed) if b in self._buffers], dropped)
            for b in dropped:
                self._forget(b)
        return out

    # ---- direct access to the daemon's arena (Unix socket) ----

    def _map_arena(self):
        if self._arena is None:
            req = self._conn.request("map_segment", [0])
            replies, fds = self._conn.exchange([req], recv_fds=True)
            try:
                (err, info), = replies
                if err is not None:
                    raise err
                if not fds or not isinstance(info, dict) or not isinstance(info.get("size"),
                                                                            int):
                    raise Error(PROTOCOL_ERROR, None,
                                "map_segment: no descriptor or size in the reply")
                self._arena = buffers.map_fd(fds[0], info["size"])
            finally:
                for fd in fds:
                    os.close(fd)
        return self._arena

    @_locked
    def map_arena(self):
        """Map the daemon's DRAM arena (segment 0) shared, read-write, once: a memoryview of
        it. The caller can then read and write every object in it. Unix socket only."""
        return memoryview(self._map_arena())

    def _places(self, pieces):
        arena = memoryview(self._map_arena())
        return [arena[o:o + n] for s, o, n in pieces]

    @_locked
    def put_start(self, keys, sizes, *, durable=False):
        """Reserve objects of sizes[i] bytes: per key, a list of writable memoryviews of the
        arena to fill in order (their lengths add up to the size), or an int code (EXISTS,
        BUSY, NO_SPACE, TOO_LARGE, TIMEOUT). Invisible until put_end; put_revoke, closing or
        the daemon's put_timeout_ms drop them. Maps the arena first."""
        keys = _keys(keys)
        self._map_arena()
        opts = _opts(durable=durable)
        res = self._call("put_start", [keys, list(sizes), *([opts] if opts else [])])
        return [r if isinstance(r, int) else self._places(r) for r in res]

    @_locked
    def put_end(self, keys):
        """Publish reservations of this client: [code, ...], OK or NOT_FOUND."""
        return self._batch(self._keys_requests("put_end", _keys(keys), 1 << 30),
                           self._list_of())

    @_locked
    def put_revoke(self, keys):
        """Drop reservations of this client: [code, ...], OK or NOT_FOUND."""
        return self._batch(self._keys_requests("put_revoke", _keys(keys), 1 << 30),
                           self._list_of())

    @_locked
    def get_replica_list(self, keys):
        """Where objects lie: per key None (absent) or the daemon's map ({"transport",
        "size", "lease_ms", "pieces"}) plus "views": memoryviews of the arena holding the
        value in order, valid to read within the lease."""
        keys = _keys(keys)
        self._map_arena()
        res = self._call("get_replica_list", [keys])
        for r in res:
            if isinstance(r, dict) and r.get("transport") == "shm":
                r["views"] = self._places(r.get("pieces", []))
        return res

    @_locked
    def rdma_connect(self, info):
        """Exchange queue-pair info (30 bytes each way) with an RDMA-enabled daemon; the
        RDMA data path itself needs a verbs library this package does not include."""
        return self._call("rdma_connect", [bytes(info)])


__all__ = ["Client", "Buffer"]
