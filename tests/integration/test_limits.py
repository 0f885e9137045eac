"""Integration: connection limits and overload.

A client that asks for big objects and never reads is closed (at client_output_max, or when
its output has not moved for client_output_timeout) while another client's requests are
still served and the daemon's memory stays flat; an idle connection is closed after
idle_timeout; 10,000 idle connections are held and the next one is refused with an error;
a pipelining client does not starve another on the same event loop; a client that pipelines
without reading has at most client_inflight_max requests dispatched and unanswered, and
gets every reply in order once it reads; a connection paused by either limit resumes even
when all its output leaves at once. Every wait is bounded.
"""

import os
import resource
import signal
import socket
import threading
import time

import pytest

from kvtest import Client, Daemon, stop_process, wait_for

MIB = 1 << 20


def rss_kib(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def served(c, n=200):
    """n gets on c, each answered with the value (within the client's timeout)."""
    for _ in range(n):
        assert c.call("get", b"small") == b"s" * 100


def test_reader_that_never_reads_is_closed_and_others_are_still_served(work):
    d = Daemon(work, ("--memory_size=128m", "--ssd_dir=", "--io_threads=1",
                      "--client_output_limit=1m", "--client_output_max=48m",
                      "--client_output_timeout=1s")).wait_ready()
    try:
        fast = d.tcp()
        fast.call("put", b"small", b"s" * 100)
        for i in range(8):
            assert fast.call("put", f"big{i}".encode(), bytes([i]) * (8 * MIB)) == 0
        served(fast)
        # the arena's background population makes its pages resident: RSS is compared once
        # it has finished
        wait_for(lambda: (lambda st: st["memory_prefaulted"] >= st["memory_capacity"])(
            fast.call("stats")), 60, "the arena populated")
        rss0 = rss_kib(d.pid)

        # A client that asks for 64 MiB a request, over and over, and never reads.
        slow = socket.create_connection(("127.0.0.1", d.port))
        slow.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        slow_client = Client(slow)
        data = b"".join(slow_client.request("batch_get", [[f"big{i}".encode() for i in range(8)]])[1]
                        for _ in range(4))
        slow.sendall(data)
        served(fast)
        deadline = time.monotonic() + 10
        s = fast.call("stats")
        while s["closed_output_max"] + s["closed_output_stalled"] == 0:
            assert time.monotonic() < deadline, f"the slow reader was never closed: {s}"
            time.sleep(0.1)
            s = fast.call("stats")
        assert s["connections"] == 1, s
        served(fast)
        # Replies are queued by reference to the objects: the daemon's memory stays flat.
        assert rss_kib(d.pid) - rss0 < 32 * 1024, (rss0, rss_kib(d.pid))
        # The objects it pinned are free again: they can be removed.
        assert fast.call("remove", b"big0") == 0
        slow.close()
    finally:
        d.stop()


def test_client_stalled_mid_put_is_closed_and_its_space_returns(work):
    # client_input_timeout 3 s: what must happen while the stalled put holds its space (the
    # refused put) is done within it with room to spare on a loaded machine.
    d = Daemon(work, ("--memory_size=64m", "--ssd_dir=", "--client_input_timeout=3s",
                      "--idle_timeout=0")).wait_ready()
    try:
        other = d.tcp()
        second_id, second = other.request("put", [b"second", b"w" * (20 * MIB)])
        # A put declaring a 48 MiB value, 70 KB of it sent, then nothing more: the daemon
        # reserves the value's space as the header arrives.
        stalled = socket.create_connection(("127.0.0.1", d.port))
        body = b"v" * (48 * MIB)
        req = Client(stalled).request("put", [b"stalled", body])[1]
        stalled.sendall(req[:len(req) - len(body) + 70000])
        wait_for(lambda: other.call("stats")["reserved"] > 0, 5, "the reservation")
        other.sock.sendall(second)
        assert other.recv() == [1, second_id, None, 4]  # NO_SPACE meanwhile
        # A slow client that keeps sending is not a stalled one.
        slow = socket.create_connection(("127.0.0.1", d.port))
        sreq = Client(slow).request("put", [b"slow", b"s" * 400000])[1]
        t0 = time.monotonic()
        for off in range(0, len(sreq), 10000):
            slow.sendall(sreq[off:off + 10000])
            time.sleep(0.1)                     # 4 s in all, 0.1 s between pieces
        assert time.monotonic() - t0 > 3.5      # longer than client_input_timeout
        assert Client(slow).recv()[3] == 0      # stored
        wait_for(lambda: other.call("stats")["closed_input_stalled"] == 1, 10,
                 "the stalled put's close")
        stalled.settimeout(5)
        msg = Client(stalled).recv()            # the notification, then the close
        assert msg[0] == 2 and msg[2][0] == 13, msg
        s = other.call("stats")
        assert s["reserved"] == 0 and s["connections"] == 2, s
        assert other.call("get", b"stalled") is None
        assert other.call("put", b"second", b"w" * (48 * MIB)) == 0
        assert other.call("get", b"slow") == b"s" * 400000
    finally:
        d.stop()


def test_idle_connection_is_closed(work):
    d = Daemon(work, ("--memory_size=16m", "--ssd_dir=", "--idle_timeout=1s")).wait_ready()
    try:
        idle = d.tcp()
        busy = d.tcp()
        deadline = time.monotonic() + 4
        while time.monotonic() < deadline:
            assert busy.call("ping") == "pong"      # busy stays: it keeps sending
            time.sleep(0.2)
        msg = idle.recv()                           # the notification, then the close
        assert msg[0] == 2 and msg[2][0] == 13, msg
        with pytest.raises((ConnectionError, OSError, TimeoutError)):
            idle.recv()
        s = busy.call("stats")
        assert s["closed_idle"] >= 1, s
    finally:
        d.stop()


def test_ten_thousand_idle_connections_then_a_refusal(work):
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard < 10100:
        pytest.skip(f"RLIMIT_NOFILE hard limit {hard} < 10100: cannot hold 10,000 connections")
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, 10100), hard))
    d = Daemon(work, ("--memory_size=16m", "--ssd_dir=", "--max_connections=10000"),
               unix=False).wait_ready()
    socks = []
    try:
        for _ in range(10000):
            socks.append(socket.create_connection(("127.0.0.1", d.port)))
        # Every one of them is there: the last answers.
        last = Client(socks[-1])
        assert last.call("ping") == "pong"
        # The next is refused with an error, not dropped silently.
        extra = Client(socket.create_connection(("127.0.0.1", d.port)))
        msg = extra.recv()
        assert msg[0] == 2 and msg[2][0] == 14 and "max_connections" in msg[2][2], msg
        extra.close()
        first = Client(socks[0])
        assert first.call("ping") == "pong"
        assert first.call("stats")["connections"] == 10000
    finally:
        for s in socks:
            s.close()
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
        d.reap()


def test_pipelining_client_does_not_starve_another(work):
    # a's pipeline and b's two requests are queued while the daemon is stopped, so it finds
    # both connections ready at once: b is answered after a turn or two of a (64 messages a
    # turn), not after all of a's that are buffered (thousands). Counted by the daemon
    # (ops.batch_is_exist in the stats b gets), not timed.
    n, turns = 20000, 8
    d = Daemon(work, ("--memory_size=64m", "--ssd_dir=", "--io_threads=1")).wait_ready()
    try:
        a, b = d.tcp(), d.tcp()
        a.call("put", b"small", b"s" * 100)
        ahead = []
        for _ in range(3):
            base = b.call("stats")["ops.batch_is_exist"]
            pipeline = b"".join(a.request("batch_is_exist", [[b"small"] * 64])[1]
                                for _ in range(n))
            get_id, get_req = b.request("get", [b"small"])
            stats_id, stats_req = b.request("stats", [])
            sender = threading.Thread(target=a.sock.sendall, args=(pipeline,), daemon=True)
            stop_process(d.pid)     # every thread stopped: nothing of a's is read early
            try:
                sender.start()
                time.sleep(0.3)     # let a's socket buffers fill
                b.sock.sendall(get_req + stats_req)
            finally:
                os.kill(d.pid, signal.SIGCONT)
            assert b.recv() == [1, get_id, None, b"s" * 100]
            msg = b.recv()
            assert msg[:3] == [1, stats_id, None], msg[:3]
            ahead.append(msg[3]["ops.batch_is_exist"] - base)
            for _ in range(n):
                assert a.recv()[3] == [True] * 64
            sender.join(10)
            assert not sender.is_alive()
        print(f"a's batches dispatched before b's stats, per round: {ahead}")
        assert max(ahead) <= turns * 64, \
            f"b waited behind {ahead} of a's batches (more than {turns} turns of 64)"
    finally:
        d.stop()


def dispatched(s):
    return s["ops.get"] + s["ops.is_exist"]


def test_inflight_cap_pauses_a_pipeline_that_is_not_read(work):
    cap, n, size = 64, 400, 512 * 1024
    # client_output_limit far above what the pipeline's replies add up to (they hold the
    # values by reference): only the in-flight cap can stop the daemon dispatching them all.
    d = Daemon(work, ("--memory_size=64m", "--ssd_dir=", "--io_threads=1",
                      f"--client_inflight_max={cap}", "--client_output_limit=2g"),
               unix=False).wait_ready()
    try:
        other = d.tcp()
        values = [bytes([i + 1]) * size for i in range(4)]
        for i, v in enumerate(values):
            assert other.call("put", f"v{i}".encode(), v) == 0
        before = other.call("stats")

        # A small receive buffer: the kernel holds a few of the big replies at most, so
        # nearly everything dispatched and unanswered is the daemon's.
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.settimeout(10)
        sock.connect(("127.0.0.1", d.port))
        slow = Client(sock)
        d.clients.append(slow)
        want, data = [], []
        for i in range(n):
            if i % 2 == 0:
                msgid, req = slow.request("get", [f"v{i // 2 % 4}".encode()])
                want.append((msgid, values[i // 2 % 4]))
            else:
                msgid, req = slow.request("is_exist", [f"v{i % 4}".encode()])
                want.append((msgid, True))
            data.append(req)
        slow.sock.sendall(b"".join(data))

        # Wait until the daemon stops dispatching: paused, and the count steady.
        deadline = time.monotonic() + 5
        seen, steady = -1, 0
        while True:
            s = other.call("stats")
            got = dispatched(s) - dispatched(before)
            steady = steady + 1 if got == seen else 0
            seen = got
            if s["inflight_pauses"] > before["inflight_pauses"] and steady >= 3:
                break
            assert time.monotonic() < deadline, \
                f"no pause at client_inflight_max {cap}: {got} of {n} dispatched, {s}"
            time.sleep(0.1)
        # The kernel's buffers hold at most ~8 of the 512 KiB replies (and as many small).
        assert cap <= got <= cap + 32, f"{got} requests dispatched with a cap of {cap}"
        assert other.call("ping") == "pong"

        # Read everything: every reply, in order, correct; the connection resumed each time.
        for msgid, value in want:
            msg = slow.recv()
            assert msg[0] == 1 and msg[1] == msgid and msg[2] is None, msg[:3]
            assert msg[3] == value, f"reply {msgid}: wrong result"
        s = other.call("stats")
        assert dispatched(s) - dispatched(before) == n, s
        assert slow.call("ping") == "pong"
    finally:
        d.stop()


def test_paused_connection_resumes_when_its_output_leaves_at_once(work):
    # A reader keeps up, so every flush empties the queue: a pause must not outlive it (a
    # paused connection with nothing left to send gets no write event to resume it).
    d = Daemon(work, ("--memory_size=64m", "--ssd_dir=", "--io_threads=1",
                      "--client_output_limit=64k", "--client_inflight_max=4")).wait_ready()
    try:
        c = d.tcp()
        big = b"x" * 100000
        assert c.call("put", b"big", big) == 0
        for method, key, n, result in (("get", b"big", 50, big),
                                       ("is_exist", b"big", 2000, True)):
            data = [c.request(method, [key]) for _ in range(n)]
            c.sock.sendall(b"".join(req for _, req in data))
            for msgid, _ in data:
                msg = c.recv()
                assert msg[1] == msgid and msg[2] is None and msg[3] == result, msg[:3]
        assert c.call("stats")["inflight_pauses"] >= 100
    finally:
        d.stop()
