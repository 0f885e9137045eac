"""kvstash.wire: one msgpack-rpc connection to kvstashd (protocol/SPEC.md, sections 1 to 3).

This module owns the socket: connecting (TCP, a Unix socket, TLS), encoding requests
without copying large values, and the exchange loop that keeps writing pipelined requests
while it reads their responses in order, so that neither side can wait for the other
(the daemon stops reading while its unsent output is large). Descriptors travel here too
(register_buffer sends one, map_segment receives one). It knows no method but by name and
nothing of buffers; a failure of the connection poisons it (every later use raises the same
ConnectionLost).
"""

import collections
import errno as _errno
import ipaddress
import select
import socket
import ssl

import msgpack

from .errors import PROTOCOL_ERROR, TIMEOUT, UNAVAILABLE, ConnectionLost, from_wire

BIG = 64 << 10          # a bin at least this long is sent from the caller's memory, uncopied
RECV_SIZE = 1 << 20
SEND_CHUNK = 4 << 20
TLS_SEND_CHUNK = 16 << 10   # one TLS record: a write the socket has room for when writable
MAX_QUEUED = 8 << 20        # request bytes packed ahead of the socket


def parse_addr(addr):
    """("unix", path) for "unix:/path" or anything with a '/'; ("tcp", (host, port)) for
    "host:port" or "[v6]:port"."""
    if not isinstance(addr, str) or not addr:
        raise ValueError(f"bad kvstashd address {addr!r}")
    if addr.startswith("unix:"):
        return "unix", addr[5:]
    if "/" in addr:
        return "unix", addr
    if addr.startswith("["):
        host, sep, port = addr[1:].partition("]:")
    else:
        host, sep, port = addr.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"bad kvstashd address {addr!r} (want host:port, [v6]:port, "
                         "unix:/path or a path)")
    return "tcp", (host, int(port))


def _is_local(host):
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


def _bin_header(n):
    if n < 256:
        return b"\xc4" + n.to_bytes(1, "big")
    if n < 65536:
        return b"\xc5" + n.to_bytes(2, "big")
    return b"\xc6" + n.to_bytes(4, "big")


class Encoder:
    """A request as a list of chunks: small parts packed together, large bin values left in
    the caller's memory (memoryviews) until they are written."""

    def __init__(self, packer):
        self.p = packer
        self.chunks = []
        self.cur = bytearray()

    def obj(self, o):
        self.cur += self.p.pack(o)

    def array(self, n):
        self.cur += self.p.pack_array_header(n)

    def bin(self, mv):
        n = mv.nbytes
        self.cur += _bin_header(n)
        if n >= BIG:
            self.chunks.append(self.cur)
            self.chunks.append(mv)
            self.cur = bytearray()
        else:
            self.cur += mv

    def finish(self):
        if self.cur:
            self.chunks.append(self.cur)
        return self.chunks


class Conn:
    """One connection. timeout: seconds without progress before TIMEOUT (None: no limit)."""

    def __init__(self, addr, timeout, ssl_context=None, server_hostname=None):
        self.timeout = timeout
        self.kind, where = parse_addr(addr)
        self.addr = addr
        self.broken = None
        self.next_id = 0
        self.packer = msgpack.Packer(use_bin_type=True)
        self.unpacker = msgpack.Unpacker(raw=False, max_buffer_size=0)
        self.rbuf = bytearray(RECV_SIZE)
        self.rview = memoryview(self.rbuf)
        try:
            if self.kind == "unix":
                if ssl_context is not None:
                    raise ValueError("TLS is for TCP addresses (host:port)")
                s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
                s.settimeout(timeout)
                try:
                    s.connect(where)
                except BaseException:
                    s.close()
                    raise
            else:
                s = self._connect_tcp(where, timeout)
                if ssl_context is not None:
                    try:
                        s = ssl_context.wrap_socket(
                            s, server_hostname=server_hostname or where[0])
                    except BaseException:
                        s.close()
                        raise
        except socket.timeout:
            raise ConnectionLost(TIMEOUT, None, f"connecting to {addr}: timed out",
                                 _errno.ETIMEDOUT) from None
        except ssl.SSLError as e:
            raise ConnectionLost(UNAVAILABLE, None, f"TLS handshake with {addr}: {e}",
                                 _errno.EPROTO) from None
        except OSError as e:
            raise ConnectionLost(UNAVAILABLE, None, f"connecting to {addr}: {e.strerror or e}",
                                 e.errno) from None
        self.sock = s
        self.is_ssl = isinstance(s, ssl.SSLSocket)

    @staticmethod
    def _connect_tcp(where, timeout):
        host, port = where
        err = None
        for family, stype, proto, _, sa in socket.getaddrinfo(host, port, 0,
                                                             socket.SOCK_STREAM):
            s = socket.socket(family, stype | socket.SOCK_CLOEXEC, proto)
            try:
                s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                if _is_local(sa[0]) and hasattr(socket, "TCP_CONGESTION"):
                    # docs/architecture.md, "Loopback TCP": before connecting, or it is too late
                    try:
                        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_CONGESTION, b"reno")
                    except OSError:
                        pass
                s.settimeout(timeout)
                s.connect(sa)
                return s
            except OSError as e:
                err = e
                s.close()
        raise err if err is not None else OSError(_errno.EHOSTUNREACH, "no address")

    def close(self):
        if self.sock is not None:
            try:
                self.sock.close()
            except OSError:
                pass
            self.sock = None
        if self.broken is None:
            self.broken = ConnectionLost(UNAVAILABLE, None, "the client is closed")

    # ---- failures ----

    def fail(self, exc):
        """Poison the connection with exc (a ConnectionLost) and raise it."""
        if self.broken is None:
            self.broken = exc
            try:
                self.sock.close()
            except OSError:
                pass
        raise self.broken

    def _os_fail(self, e, doing):
        if isinstance(e, socket.timeout):
            self.fail(ConnectionLost(TIMEOUT, None, f"{doing}: no progress for {self.timeout} s",
                                     _errno.ETIMEDOUT))
        msg = getattr(e, "strerror", None) or str(e) or type(e).__name__
        self.fail(ConnectionLost(UNAVAILABLE, None, f"{doing}: {msg}",
                                 getattr(e, "errno", None)))

    # ---- requests ----

    def new_id(self):
        msgid = self.next_id
        self.next_id = (self.next_id + 1) & 0xFFFFFFFF
        return msgid

    def request(self, method, params):
        """(msgid, chunks) of a request whose params are plain msgpack objects."""
        msgid = self.new_id()
        return msgid, [self.packer.pack([0, msgid, method, params])]

    def encoder(self, method, nparams):
        """(msgid, Encoder) with the request's head written; the caller adds nparams."""
        msgid = self.new_id()
        e = Encoder(self.packer)
        e.cur += b"\x94\x00"
        e.obj(msgid)
        e.obj(method)
        e.array(nparams)
        return msgid, e

    def exchange(self, requests, window=16, send_fds=None, recv_fds=False):
        """Send requests (an iterable of (msgid, chunks), consumed lazily) pipelined, at most
        window unanswered at once, reading the responses meanwhile. Returns [(error,
        result), ...] in request order (error: None or an Error of the wire triple), plus
        the descriptors received when recv_fds. send_fds: descriptors to attach to the
        first bytes sent (of the first request)."""
        if self.broken is not None:
            raise self.broken
        try:
            return self._exchange(requests, window, send_fds, recv_fds)
        except ConnectionLost:
            raise
        except BaseException:
            # interrupted (KeyboardInterrupt, an error of the caller's request iterator) with
            # requests half written or replies unread: the stream is out of step for good
            if self.broken is None:
                self.broken = ConnectionLost(UNAVAILABLE, None,
                                             "a call was interrupted mid-exchange")
                try:
                    self.sock.close()
                except OSError:
                    pass
            raise

    def _exchange(self, requests, window, send_fds, recv_fds):
        sock = self.sock
        it = iter(requests)
        more = True
        pending = collections.deque()
        out = collections.deque()
        queued = 0
        replies = []
        fds_in = []
        chunk = TLS_SEND_CHUNK if self.is_ssl else SEND_CHUNK
        while True:
            while more and len(pending) < window and queued < MAX_QUEUED:
                try:
                    msgid, chunks = next(it)
                except StopIteration:
                    more = False
                    break
                pending.append(msgid)
                for c in chunks:
                    mv = memoryview(c).cast("B")
                    if mv.nbytes:
                        out.append(mv)
                        queued += mv.nbytes
            if not pending:
                return (replies, fds_in) if recv_fds else replies
            if self.is_ssl and sock.pending():
                readable, writable = True, False
            else:
                try:
                    r, w, _ = select.select([sock], [sock] if out else [], [], self.timeout)
                except (OSError, ValueError) as e:
                    self._os_fail(e if isinstance(e, OSError) else OSError(str(e)), "select")
                readable, writable = bool(r), bool(w)
                if not readable and not writable:
                    self.fail(ConnectionLost(TIMEOUT, None,
                                             f"no answer from kvstashd for {self.timeout} s",
                                             _errno.ETIMEDOUT))
            if writable:
                mv = out[0]
                try:
                    if send_fds:
                        n = socket.send_fds(sock, [mv[:chunk]], send_fds)
                        send_fds = None
                    else:
                        n = sock.send(mv[:chunk])
                except (ssl.SSLWantWriteError, ssl.SSLWantReadError, BlockingIOError):
                    n = 0
                except OSError as e:
                    self._os_fail(e, "sending to kvstashd")
                queued -= n
                if n == mv.nbytes:
                    out.popleft()
                else:
                    out[0] = mv[n:]
            if readable:
                try:
                    if recv_fds:
                        data, fds, _, _ = socket.recv_fds(sock, RECV_SIZE, 4)
                        fds_in.extend(fds)
                        n = len(data)
                        if n:
                            self.unpacker.feed(data)
                    else:
                        n = sock.recv_into(self.rview, RECV_SIZE)
                        if n:
                            self.unpacker.feed(self.rview[:n])
                except (ssl.SSLWantReadError, ssl.SSLWantWriteError, BlockingIOError):
                    continue
                except OSError as e:
                    self._os_fail(e, "reading from kvstashd")
                if n == 0:
                    self.fail(ConnectionLost(UNAVAILABLE, None,
                                             "kvstashd closed the connection",
                                             _errno.ECONNRESET))
                try:
                    for msg in self.unpacker:
                        self._reply(msg, pending, replies)
                except (ValueError, msgpack.UnpackException) as e:
                    self.fail(ConnectionLost(PROTOCOL_ERROR, None,
                                             f"undecodable reply from kvstashd: {e}"))

    def _reply(self, msg, pending, replies):
        if (isinstance(msg, list) and len(msg) == 3 and msg[0] == 2 and msg[1] == "error"):
            e = from_wire(msg[2])
            self.fail(ConnectionLost(e.code, e.name, e.message))
        if not (isinstance(msg, list) and len(msg) == 4 and msg[0] == 1):
            self.fail(ConnectionLost(PROTOCOL_ERROR, None,
                                     f"not a msgpack-rpc response: {msg!r:.200}"))
        if not pending or msg[1] != pending[0]:
            want = pending[0] if pending else None
            self.fail(ConnectionLost(PROTOCOL_ERROR, None,
                                     f"response to msgid {msg[1]!r}, expected {want!r}"))
        pending.popleft()
        replies.append((None if msg[2] is None else from_wire(msg[2]), msg[3]))
