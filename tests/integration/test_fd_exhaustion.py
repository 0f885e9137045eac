"""Integration: running out of file descriptors does not spin kvstashd's accept loop.

The daemon is started with a small RLIMIT_NOFILE (kvtest.Daemon's nofile) and more clients
connect than it has descriptors for: the ones past the limit are refused with an error
notification (the daemon keeps a spare descriptor to accept and refuse them), the daemon
stays nearly idle (CPU time, not wall-clock time, is measured), keeps serving the clients
it has, and accepts new ones once descriptors free up.
"""

import os
import socket
import time

import msgpack

from kvtest import RESPONSE, Client, recv_to_eof, wait_for

NOFILE = 48          # the daemon's descriptor limit for this test
EXTRA = 40           # connections beyond what it can hold
IDLE_WINDOW_S = 1.0  # how long the daemon is watched while out of descriptors


def cpu_seconds(pid):
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    ticks = os.sysconf("SC_CLK_TCK")
    return (int(fields[11]) + int(fields[12])) / ticks  # utime + stime


def served(port):
    """A new client's ping is answered (False: it was refused, the daemon still out of
    descriptors: it has not yet closed its side of the clients that left)."""
    c = Client.tcp(port)
    try:
        msgid, data = c.request("ping", [])
        c.sock.sendall(data)
        return c.recv() == [RESPONSE, msgid, None, "pong"]
    except OSError:     # ConnectionError included
        return False
    finally:
        c.close()


def test_out_of_descriptors_does_not_spin_and_recovers(daemons):
    d = daemons(("--memory_size=16m", "--io_threads=1", "--max_connections=1000"), unix=False,
                nofile=NOFILE)
    socks = []
    try:
        first = d.tcp()
        assert first.call("ping") == "pong"

        for _ in range(NOFILE + EXTRA):
            socks.append(socket.create_connection(("127.0.0.1", d.port), timeout=5))
        time.sleep(0.3)  # let the daemon hit EMFILE and back off

        cpu0 = cpu_seconds(d.pid)
        time.sleep(IDLE_WINDOW_S)
        busy = cpu_seconds(d.pid) - cpu0
        assert busy < 0.3 * IDLE_WINDOW_S, f"daemon used {busy:.2f} s of CPU in " \
            f"{IDLE_WINDOW_S} s while out of descriptors (accept loop spinning?)"

        # The clients it already has are still served.
        assert first.call("ping") == "pong"
        stats = first.call("stats")
        assert stats["accept_errors"] > 0, stats
        assert stats["connections_rejected"] > 0, stats

        # The last ones were told why, and closed: no client hangs in the backlog.
        unpacker = msgpack.Unpacker(raw=False)
        unpacker.feed(recv_to_eof(socks[-1]))
        msgs = list(unpacker)
        assert msgs == [[2, "error", [14, "UNAVAILABLE", "out of file descriptors"]]], msgs

        # Free descriptors: the waiting clients get in and are served. The daemon keeps
        # about 20 descriptors of its own (listeners, event loops, the SSD tier's index
        # and directory), so leave fewer live clients than it has room for.
        for s in socks[:EXTRA + 30]:
            s.close()
        socks = socks[EXTRA + 30:]
        wait_for(lambda: served(d.port), 10, "a new client to be served once descriptors were freed")
    finally:
        for s in socks:
            s.close()
    d.stop()    # exit 0 on SIGTERM
