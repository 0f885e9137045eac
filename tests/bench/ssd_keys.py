#!/usr/bin/python3
"""ssd_keys.py: put, probe or read back N small objects under realistic cache keys.

ssd.sh's restart test uses it (BENCH_SSD_RESTART_KEYS=long) to fill a daemon with keys shaped
like an inference engine's KV-cache block keys: "Qwen3-8B_<sha-256 of the index, hex>_3_k",
77 bytes, in hash order (not sorted the way kvstash-bench's counter keys are). Value i is
the 8-byte index, big-endian, repeated to SIZE bytes, so a read back can be checked.

  ssd_keys.py HOST:PORT put    N [SIZE]   batch_put of 1000 keys, 4 requests in flight
  ssd_keys.py HOST:PORT exists N          batch_is_exist of every key; prints the misses
  ssd_keys.py HOST:PORT get    N I...     batch_get of keys I...; checks every value

Debian's python3 with python3-msgpack; no project code (it speaks msgpack-rpc directly).
Exit status: 0 all well; 1 a key missing, refused or wrong; 2 usage; 3 transport error.
"""
import hashlib
import socket
import sys
import time

import msgpack

BATCH = 1000
DEPTH = 4
TIMEOUT = 60.0


def key(i):
    return b"Qwen3-8B_" + hashlib.sha256(str(i).encode()).hexdigest().encode() + b"_3_k"


def value(i, size):
    unit = i.to_bytes(8, "big")
    return (unit * (size // 8 + 1))[:size]


class Conn:
    def __init__(self, addr):
        host, port = addr.rsplit(":", 1)
        self.sock = socket.create_connection((host, int(port)), timeout=TIMEOUT)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.unpacker = msgpack.Unpacker(raw=True, max_buffer_size=1 << 30)
        self.msgid = 0

    def send(self, method, params):
        self.msgid = (self.msgid + 1) & 0x7FFFFFFF
        self.sock.sendall(msgpack.packb([0, self.msgid, method, params], use_bin_type=True))
        return self.msgid

    def reply(self, msgid):
        while True:
            for msg in self.unpacker:
                if len(msg) != 4 or msg[0] != 1:
                    raise IOError("unexpected message %r" % (msg[:3],))
                if msg[1] != msgid:
                    raise IOError("reply %r out of order (wanted %r)" % (msg[1], msgid))
                if msg[2] is not None:
                    raise IOError("server error %r" % (msg[2],))
                return msg[3]
            data = self.sock.recv(1 << 20)
            if not data:
                raise IOError("server closed the connection")
            self.unpacker.feed(data)


def pipelined(conn, method, n, params_of, check):
    """Send batches of BATCH keys over [0, n), DEPTH in flight; check(first, result)."""
    inflight = []
    bad = 0
    for first in range(0, n, BATCH):
        inflight.append((first, conn.send(method, params_of(first, min(n, first + BATCH)))))
        if len(inflight) == DEPTH:
            f, m = inflight.pop(0)
            bad += check(f, conn.reply(m))
    for f, m in inflight:
        bad += check(f, conn.reply(m))
    return bad


def main(argv):
    if len(argv) < 4 or argv[2] not in ("put", "exists", "get"):
        sys.stderr.write(__doc__)
        return 2
    addr, mode, n = argv[1], argv[2], int(argv[3])
    try:
        conn = Conn(addr)
        t0 = time.monotonic()
        if mode == "put":
            size = int(argv[4]) if len(argv) > 4 else 64
            bad = pipelined(conn, "batch_put", n,
                            lambda a, b: [[key(i) for i in range(a, b)],
                                          [value(i, size) for i in range(a, b)]],
                            lambda f, codes: sum(1 for c in codes if c != 0))
            print("put %d keys of %d bytes with %d-byte values in %.2f s: %d refused"
                  % (n, len(key(0)), size, time.monotonic() - t0, bad))
        elif mode == "exists":
            bad = pipelined(conn, "batch_is_exist", n,
                            lambda a, b: [[key(i) for i in range(a, b)]],
                            lambda f, found: sum(1 for x in found if x is not True))
            print("batch_is_exist of %d keys in %.2f s: %d missing"
                  % (n, time.monotonic() - t0, bad))
        else:
            idx = [int(x) for x in argv[4:]]
            got = conn.reply(conn.send("batch_get", [[key(i) for i in idx]]))
            bad = 0
            for i, v in zip(idx, got):
                if v is None or v != value(i, len(v)) or len(v) == 0:
                    bad += 1
            print("batch_get of %d keys: %d missing or wrong" % (len(idx), bad))
    except (OSError, IOError, ValueError) as e:
        sys.stderr.write("ssd_keys.py: %s\n" % (e,))
        return 3
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
