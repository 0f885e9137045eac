"""Integration: a put's value bytes reach the store intact however they arrive.

A big value's body is read into its reservation in one of two ways: in pieces of 128 KiB
(the loop keeps up with the socket), with the start of the next values read ahead into the
connection's buffer and copied over; or, once bytes have queued up, in reads as large as the
rest of the body. These tests send the same batch_put in small timed pieces, in one burst
that queues while the daemon is stopped (SIGSTOP), and in both within one request, over TCP
and the Unix socket, and read every value back byte-exact. (A Unix socket queues no more than
its sender's buffer, about 200 KiB, so only over TCP does the burst reach the large reads.)
A key repeated in one batch_put keeps its first copy's value whichever of its values arrive
in pieces (a big one is reserved in the store as it arrives, before the request runs).
Every wait is bounded.
"""

import os
import random
import signal
import socket
import threading
import time

import pytest

from kvtest import Daemon, stop_process, wait_for

MIB = 1 << 20
SIZES = [16 * 1024, 300 * 1024 + 5, MIB + 13, 5 * MIB + 7, 33, 2 * MIB, 256 * 1024]


def batch(tag, seed):
    rnd = random.Random(seed)
    keys = [f"{tag}-{i}".encode() for i in range(len(SIZES))]
    vals = [rnd.randbytes(n) for n in SIZES]
    return keys, vals


def send_dribbled(sock, data, until):
    """Send data[:until] in uneven small pieces with pauses, so each read is short."""
    rnd = random.Random(until)
    off = 0
    while off < until:
        n = min(until - off, rnd.choice((1, 7, 4093, 16 * 1024, 65 * 1024 + 3)))
        sock.sendall(data[off:off + n])
        off += n
        if rnd.random() < 0.2:
            time.sleep(0.002)
    return off


def send_burst_while_stopped(d, sock, data):
    """Send data while the daemon is stopped, so it queues and the next reads are full."""
    done = threading.Event()
    failure = []

    def sender():
        try:
            sock.sendall(data)
        except OSError as e:
            failure.append(e)
        done.set()

    stop_process(d.pid)
    try:
        t = threading.Thread(target=sender, daemon=True)
        t.start()
        time.sleep(0.3)  # let the socket buffers fill
    finally:
        os.kill(d.pid, signal.SIGCONT)
    assert done.wait(30), "the burst was not taken within 30 s"
    assert not failure, failure


@pytest.mark.parametrize("transport", ["tcp", "unix"])
def test_dribbled_burst_and_mixed_puts_read_back_byte_exact(work, transport):
    d = Daemon(work, ("--memory_size=256m", "--ssd_dir=", "--io_threads=1")).wait_ready()
    try:
        c = d.tcp() if transport == "tcp" else d.unix()
        shapes = {
            "dribbled": lambda data: send_dribbled(c.sock, data, len(data)),
            "burst": lambda data: send_burst_while_stopped(d, c.sock, data),
            # the first values in pieces, then the rest queued at once: both ways in a request
            "mixed": lambda data: (send_dribbled(c.sock, data, 2 * MIB),
                                   send_burst_while_stopped(d, c.sock, data[2 * MIB:])),
        }
        for n, (shape, send) in enumerate(shapes.items()):
            keys, vals = batch(f"{transport}-{shape}", n)
            msgid, data = c.request("batch_put", [keys, vals])
            send(data)
            msg = c.recv()
            assert msg[1] == msgid and msg[2] is None, msg
            assert msg[3] == [0] * len(keys), f"{shape}: {msg[3]}"
            got = c.call("batch_get", keys)
            for k, v, g in zip(keys, vals, got):
                assert g is not None and len(g) == len(v), f"{shape} {k}: size {len(g or b'')}"
                assert g == v, f"{shape} {k}: bytes differ"
        d.assert_alive()
    finally:
        d.stop()


def tcp_rmem_max():
    with open("/proc/sys/net/ipv4/tcp_rmem") as f:
        return int(f.read().split()[2])


@pytest.mark.parametrize("window", [8 * MIB, 0])
def test_receive_window_lets_a_put_queue_while_the_daemon_is_busy(work, window):
    """tcp_receive_window: what a client may send ahead of the daemon's reads.

    With the daemon stopped, a batch_put is sent without blocking until the kernel takes no
    more. Its own send buffer is pinned small, so what was taken waits in the daemon's
    receive queue: at least the configured window (the kernel caps it at half of
    net.ipv4.tcp_rmem's maximum); with 0, the 128 KiB or so a new connection starts with.
    Then the put completes and reads back byte-exact.
    """
    d = Daemon(work, ("--memory_size=128m", "--ssd_dir=", "--io_threads=1",
                      f"--tcp_receive_window={window}")).wait_ready()
    try:
        c = d.tcp()
        assert c.call("ping") == "pong"  # accepted, and woken by a 16-byte request
        c.sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 64 * 1024)
        keys, vals = batch(f"window-{window}", 7)
        keys, vals = keys[:1] + [b"big"], vals[:1] + [random.Random(3).randbytes(24 * MIB)]
        msgid, data = c.request("batch_put", [keys, vals])
        sent = 0
        stop_process(d.pid)
        try:
            c.sock.settimeout(0)
            last = time.monotonic()
            while time.monotonic() - last < 1.0 and sent < len(data):   # 1 s taking nothing
                try:
                    sent += c.sock.send(data[sent:sent + MIB])
                    last = time.monotonic()
                except BlockingIOError:
                    time.sleep(0.01)
        finally:
            os.kill(d.pid, signal.SIGCONT)
            c.sock.settimeout(30)
        want = min(window, tcp_rmem_max() // 2)
        if window:
            assert sent >= want, f"{sent} bytes queued, want {want}"
        else:
            assert sent < 2 * MIB, f"{sent} bytes queued with the kernel's starting window"
        c.sock.sendall(data[sent:])
        msg = c.recv()
        assert msg[1] == msgid and msg[2] is None and msg[3] == [0, 0], msg
        got = c.call("batch_get", keys)
        assert [len(g or b"") for g in got] == [len(v) for v in vals]
        assert got == vals
        d.assert_alive()
    finally:
        d.stop()


def send_paused_at(sock, data, cuts):
    """Send data in pieces ending at each offset in cuts, 50 ms apart, then the rest."""
    off = 0
    for cut in cuts:
        sock.sendall(data[off:cut])
        off = cut
        time.sleep(0.05)
    sock.sendall(data[off:])


def test_repeated_key_keeps_its_first_value_however_the_batch_arrives(work):
    """batch_put [[k, k], [first, second]]: the first copy is stored and the second answers
    2 EXISTS or 3 BUSY, whether the big values arrive whole, in pieces (reserved as they
    come, before the request runs), or some of each; no reservation is left over, nor after
    a client that leaves in the middle of such a batch."""
    d = Daemon(work, ("--memory_size=256m", "--ssd_dir=", "--io_threads=1")).wait_ready()
    try:
        c = d.tcp()
        rnd = random.Random(11)
        pairs = {
            "small-big": [b"first", rnd.randbytes(30000)],
            "big-big": [rnd.randbytes(30000), rnd.randbytes(40000)],
            "big-small": [rnd.randbytes(30000), b"second"],
        }
        n = 0
        for name, vals in pairs.items():
            for shape in ("whole", "at-2000", "first-whole", "each-in-pieces"):
                for key_types in ("bin", "str-then-bin"):
                    n += 1
                    k = f"rep-{n}-{name}-{shape}-{key_types}"
                    keys = [k.encode(), k.encode()] if key_types == "bin" else [k, k.encode()]
                    msgid, data = c.request("batch_put", [keys, vals])
                    starts = [data.index(v) for v in vals]
                    cuts = {"whole": [], "at-2000": [2000],
                            # the first value all there, the second arriving in pieces
                            "first-whole": [starts[1] + 100],
                            "each-in-pieces": [starts[0] + 100, starts[1] + 100]}[shape]
                    send_paused_at(c.sock, data, cuts)
                    msg = c.recv()
                    what = f"{name} {shape} {key_types}"
                    assert msg[1] == msgid and msg[2] is None, (what, msg)
                    assert msg[3] in ([0, 2], [0, 3]), f"{what}: codes {msg[3]}"
                    got = c.call("get", k.encode())
                    assert got is not None and got == vals[0], \
                        f"{what}: stored {len(got or b'')} bytes, not the first value"
                    assert c.call("stats")["reserved"] == 0, what

        # three copies, the last two big and in pieces: still the first (small) one
        big = [rnd.randbytes(20000), rnd.randbytes(50000)]
        msgid, data = c.request("batch_put", [[b"rep-3", b"rep-3", b"rep-3"], [b"one"] + big])
        send_paused_at(c.sock, data, [data.index(v) + 100 for v in big])
        msg = c.recv()
        assert msg[1] == msgid and msg[3][0] == 0 and set(msg[3][1:]) <= {2, 3}, msg
        assert c.call("get", b"rep-3") == b"one"
        assert c.call("stats")["reserved"] == 0

        # a client that leaves with the second copy half received leaves nothing behind
        gone = d.tcp()
        vals = [b"first", rnd.randbytes(300000)]
        msgid, data = gone.request("batch_put", [[b"rep-gone", b"rep-gone"], vals])
        gone.sock.sendall(data[:data.index(vals[1]) + 100000])
        wait_for(lambda: c.call("stats")["reserved"] == 1, 5, "the second copy reserved")
        gone.sock.close()
        wait_for(lambda: c.call("stats")["reserved"] == 0, 5, "the reservation released")
        assert c.call("get", b"rep-gone") is None
        assert c.call("batch_put", [b"rep-gone"], [b"again"]) == [0]
        assert c.call("get", b"rep-gone") == b"again"
        d.assert_alive()
    finally:
        d.stop()
