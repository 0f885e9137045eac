#!/usr/bin/python3
"""soak.py: random concurrent traffic against a running kvstashd, every value checked.

    soak.py --port PORT --socket PATH --seconds S --workers W --seed N [--killed]
    soak.py --port PORT --check      (read every key once, check it, print how many exist)
    soak.py --port PORT --remove-all (remove_all, forced)

Each worker is a process with its own connection (TCP or the Unix socket, picked at
random) and mixes: batch_put and get/batch_get of 0 B to 3 MiB values over 300 keys, so
writers collide (EXISTS, BUSY) and the store evicts all the time; batch_is_exist and
prefix_match; batch_remove, sometimes forced; soft and hard pins and unpins; pipelined
bursts answered by msgid; puts cut off part-way by closing the connection; stats; and on
Unix connections batch_put_from (in one or two pieces) and batch_get_into through a
registered memfd of four 4 MiB slots. A value's bytes are a function of its key and its
length, so whichever writer stored it, any bytes a read returns can be checked. Uses
Debian's python3-msgpack only.

Exit status 1 if a worker saw wrong bytes, a malformed or unexpected answer, or lost its
connection (unless --killed says the daemon will be killed under it); the first such
failure of each worker is printed.
"""
import argparse
import fcntl
import hashlib
import mmap
import multiprocessing
import os
import random
import socket
import sys
import time

import msgpack

NKEYS = 300
SIZES = [0, 1, 100, 4096, 16383, 16384, 65536, 65537, 200000, 1 << 20, (1 << 20) + 7, 3 << 20]
SMALL = SIZES[:8]
PUT_CODES = (0, 2, 3, 4)        # stored, EXISTS, BUSY, NO_SPACE
REMOVE_CODES = (0, 1, 3)        # removed, NOT_FOUND, BUSY
SHM_SLOT = 4 << 20              # a value's room in the shared buffer (SIZES fit)
SHM_SLOTS = 4
F_ADD_SEALS = getattr(fcntl, "F_ADD_SEALS", 1033)
F_SEAL_SHRINK = getattr(fcntl, "F_SEAL_SHRINK", 0x0002)


def key(i):
    return b"soak-%04d" % i


def content(k, n):
    seed = hashlib.sha256(k + n.to_bytes(8, "little")).digest() * 2
    return (seed * (n // 64 + 1))[:n]


def check_value(k, v, where):
    if v is None:
        return
    if not isinstance(v, bytes):
        raise AssertionError("%s: %r answered %s, not bin" % (where, k, type(v).__name__))
    if v != content(k, len(v)):
        raise AssertionError("%s: WRONG BYTES for %r (%d bytes)" % (where, k, len(v)))


class Conn:
    def __init__(self, port, path, use_unix):
        self.unix = use_unix
        self.bid = None             # register_buffer's id for the shared buffer, once sent
        if use_unix:
            self.s = socket.socket(socket.AF_UNIX)
            self.s.connect(path)
        else:
            self.s = socket.create_connection(("127.0.0.1", port))
            self.s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.s.settimeout(30)
        self.u = msgpack.Unpacker(raw=True, max_buffer_size=64 << 20)
        self.msgid = 0

    def send(self, method, params):
        self.msgid += 1
        self.s.sendall(msgpack.packb([0, self.msgid, method, params], use_bin_type=True))
        return self.msgid

    def recv(self):
        while True:
            for m in self.u:
                return m
            d = self.s.recv(1 << 20)
            if not d:
                raise EOFError("the daemon closed the connection")
            self.u.feed(d)

    def call(self, method, params):
        msgid = self.send(method, params)
        m = self.recv()
        if m[0] != 1 or m[1] != msgid:
            raise AssertionError("%s: answer %r to msgid %d" % (method, m[:2], msgid))
        if m[2] is not None:
            raise AssertionError("%s: error %r" % (method, m[2]))
        return m[3]


class Shm:
    """A sealed memfd of SHM_SLOTS values, mapped here and registered on Unix connections."""
    def __init__(self):
        self.fd = os.memfd_create("kvstash-soak", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
        os.ftruncate(self.fd, SHM_SLOT * SHM_SLOTS)
        fcntl.fcntl(self.fd, F_ADD_SEALS, F_SEAL_SHRINK)
        self.mv = memoryview(mmap.mmap(self.fd, SHM_SLOT * SHM_SLOTS))

    def register(self, c):
        if c.bid is None:
            msgid = c.msgid = c.msgid + 1
            data = msgpack.packb([0, msgid, "register_buffer", [{"size": SHM_SLOT * SHM_SLOTS}]])
            socket.send_fds(c.s, [data], [self.fd])
            m = c.recv()
            if m[1] != msgid or m[2] is not None:
                raise AssertionError("register_buffer answered %r" % (m[1:],))
            c.bid = m[3]
        return c.bid


def shm_step(c, rng, shm):
    """batch_put_from or batch_get_into through the registered buffer, one slot per key."""
    bid = shm.register(c)
    ks = [key(rng.randrange(NKEYS)) for _ in range(rng.randint(1, SHM_SLOTS))]
    if rng.random() < 0.5:
        iovs = []
        for i, k in enumerate(ks):
            n = rng.choice(SIZES)
            off = i * SHM_SLOT
            shm.mv[off:off + n] = content(k, n)
            cut = rng.randrange(n + 1)   # one or two pieces
            iovs.append([[bid, off, cut], [bid, off + cut, n - cut]] if 0 < cut < n
                        else [[bid, off, n]])
        res = c.call("batch_put_from", [ks, iovs])
        if len(res) != len(ks) or any(x not in PUT_CODES for x in res):
            raise AssertionError("batch_put_from answered %r" % (res,))
        return "shm_put"
    for i in range(len(ks)):
        shm.mv[i * SHM_SLOT:i * SHM_SLOT + 64] = bytes(64)
    res = c.call("batch_get_into", [ks, [[[bid, i * SHM_SLOT, SHM_SLOT]] for i in range(len(ks))]])
    if len(res) != len(ks):
        raise AssertionError("batch_get_into: %d answers to %d keys" % (len(res), len(ks)))
    for i, (k, n) in enumerate(zip(ks, res)):
        if n == -1:
            continue
        if not isinstance(n, int) or not 0 <= n <= SHM_SLOT:
            raise AssertionError("batch_get_into answered %r for %r" % (n, k))
        check_value(k, bytes(shm.mv[i * SHM_SLOT:i * SHM_SLOT + n]), "batch_get_into")
    return "shm_get"


def step(c, rng, pins, args, shm):
    """One random operation on connection c; returns (its name, the connection to go on with)."""
    r = rng.random()
    if c.unix and rng.random() < 0.15:
        return shm_step(c, rng, shm), c
    ks = [key(rng.randrange(NKEYS)) for _ in range(rng.randint(1, 12))]
    if r < 0.30:
        sizes = [rng.choice(SIZES) for _ in ks]
        res = c.call("batch_put", [ks, [content(k, n) for k, n in zip(ks, sizes)]])
        if len(res) != len(ks) or any(x not in PUT_CODES for x in res):
            raise AssertionError("batch_put answered %r" % (res,))
        return "put", c
    if r < 0.55:
        res = c.call("batch_get", [ks])
        if len(res) != len(ks):
            raise AssertionError("batch_get: %d answers to %d keys" % (len(res), len(ks)))
        for k, v in zip(ks, res):
            check_value(k, v, "batch_get")
        return "get", c
    if r < 0.62:
        check_value(ks[0], c.call("get", [ks[0]]), "get")
        return "get", c
    if r < 0.70:
        res = c.call("batch_is_exist", [ks])
        if len(res) != len(ks) or any(not isinstance(x, bool) for x in res):
            raise AssertionError("batch_is_exist answered %r" % (res,))
        g = rng.choice([1, 2])
        kg = (ks * 2)[: max(g, len(ks) // g * g)]   # whole groups of g
        n = c.call("prefix_match", [kg, {"group_size": g}])
        if not isinstance(n, int) or not 0 <= n <= len(kg) // g:
            raise AssertionError("prefix_match answered %r" % (n,))
        return "probe", c
    if r < 0.78:
        res = c.call("batch_remove", [ks, {"force": rng.random() < 0.3}])
        if len(res) != len(ks) or any(x not in REMOVE_CODES for x in res):
            raise AssertionError("batch_remove answered %r" % (res,))
        return "remove", c
    if r < 0.82:
        c.call("pin", [ks, rng.choice(["soft", "hard"])])
        pins.update(ks)
        return "pin", c
    if r < 0.86 and pins:
        c.call("unpin", [sorted(pins)])
        pins.clear()
        return "unpin", c
    if r < 0.92:
        sent = {}
        for _ in range(rng.randint(2, 8)):
            kk = [key(rng.randrange(NKEYS)) for _ in range(rng.randint(1, 6))]
            if rng.random() < 0.5:
                sent[c.send("batch_get", [kk])] = kk
            else:
                vals = [content(k, rng.choice(SMALL)) for k in kk]
                sent[c.send("batch_put", [kk, vals])] = None
        for _ in range(len(sent)):
            m = c.recv()
            if m[1] not in sent or m[2] is not None:
                raise AssertionError("pipelined answer %r" % (m[:3],))
            kk = sent.pop(m[1])
            for k, v in zip(kk or [], m[3]):
                check_value(k, v, "pipelined batch_get")
        return "pipeline", c
    if r < 0.96:
        k = key(rng.randrange(NKEYS))
        msg = msgpack.packb([0, 1, "put", [k, content(k, rng.choice(SIZES[6:]))]],
                            use_bin_type=True)
        c.s.sendall(msg[: rng.randrange(1, len(msg))])
        c.s.close()
        return "cut", Conn(args.port, args.socket, rng.random() < 0.5)
    st = {x.decode(): y for x, y in c.call("stats", []).items()}
    if st["memory_used"] > st["memory_capacity"]:
        raise AssertionError("memory_used %d over memory_capacity %d"
                             % (st["memory_used"], st["memory_capacity"]))
    return "stats", c


def worker(wid, args, stop_at, out):
    rng = random.Random(args.seed * 1000 + wid)
    ops, pins = {}, set()
    try:
        shm = Shm()
        c = Conn(args.port, args.socket, rng.random() < 0.5)
        while time.time() < stop_at:
            name, c = step(c, rng, pins, args, shm)
            ops[name] = ops.get(name, 0) + 1
        if pins:
            c.call("unpin", [sorted(pins)])
        out.put((wid, None, ops))
    except (EOFError, ConnectionError) as e:
        if not args.killed:
            out.put((wid, "%s: %s" % (type(e).__name__, e), ops))
        else:
            out.put((wid, None, ops))  # the daemon was killed under it, as asked
    except Exception as e:  # reported, and the run fails
        out.put((wid, "%s: %s" % (type(e).__name__, e), ops))


def check_all(port):
    c = Conn(port, None, False)
    keys = [key(i) for i in range(NKEYS)]
    found = 0
    for i in range(0, NKEYS, 20):
        for k, v in zip(keys[i:i + 20], c.call("batch_get", [keys[i:i + 20]])):
            check_value(k, v, "batch_get")
            found += v is not None
    print("%d of %d keys stored, every one byte-exact" % (found, NKEYS))


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--socket")
    p.add_argument("--seconds", type=float, default=30)
    p.add_argument("--workers", type=int, default=4)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--check", action="store_true")
    p.add_argument("--remove-all", action="store_true")
    p.add_argument("--killed", action="store_true",
                   help="the daemon will be killed: a lost connection ends a worker quietly")
    args = p.parse_args()
    if args.check:
        check_all(args.port)
        return 0
    if args.remove_all:
        Conn(args.port, None, False).call("remove_all", [{"force": True}])
        return 0
    if args.socket is None:
        p.error("--socket is needed for traffic")
    stop_at = time.time() + args.seconds
    out = multiprocessing.Queue()
    procs = [multiprocessing.Process(target=worker, args=(w, args, stop_at, out))
             for w in range(args.workers)]
    for proc in procs:
        proc.start()
    results = [out.get(timeout=args.seconds + 120) for _ in procs]
    for proc in procs:
        proc.join(10)
    total = {}
    for _, _, ops in results:
        for name, n in ops.items():
            total[name] = total.get(name, 0) + n
    print("operations: " + ", ".join("%s %d" % kv for kv in sorted(total.items())))
    bad = [(wid, why) for wid, why, _ in results if why is not None]
    for wid, why in bad:
        print("worker %d: %s" % (wid, why))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
