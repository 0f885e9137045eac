"""Integration: running out of file descriptors does not spin kvstashd's accept loop.

The daemon is started with a small RLIMIT_NOFILE (through the standard library's
resource module) and more clients connect than it has descriptors for: the ones
past the limit are refused with an error notification (the daemon keeps a spare
descriptor to accept and refuse them), the daemon stays nearly idle, keeps serving
the clients it has, and accepts new ones once descriptors free up.
Only Debian's python3-msgpack and the standard library are used.
"""

import os
import resource
import signal
import socket
import subprocess
import tempfile
import time

import msgpack
import pytest

from test_python_client import KVSTASHD, Client, free_port, recv_to_eof

NOFILE = 48          # the daemon's descriptor limit for this test
EXTRA = 40           # connections beyond what it can hold
IDLE_WINDOW_S = 1.0  # how long the daemon is watched while out of descriptors


def cpu_seconds(pid):
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    ticks = os.sysconf("SC_CLK_TCK")
    return (int(fields[11]) + int(fields[12])) / ticks  # utime + stime


def test_out_of_descriptors_does_not_spin_and_recovers():
    if not os.access(KVSTASHD, os.X_OK):
        pytest.fail(f"no kvstashd at {KVSTASHD}")
    with tempfile.TemporaryDirectory(prefix="kvstash-fd-") as tmp:
        port = free_port()
        log = open(os.path.join(tmp, "log"), "wb")

        def limit():
            resource.setrlimit(resource.RLIMIT_NOFILE, (NOFILE, NOFILE))

        proc = subprocess.Popen(
            [KVSTASHD, f"--listen=127.0.0.1:{port}", f"--data_dir={tmp}",
             "--memory_size=16m", "--io_threads=1", "--max_connections=1000"],
            stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
            preexec_fn=limit)
        socks = []
        try:
            deadline = time.monotonic() + 5
            first = None
            while first is None:
                try:
                    first = Client.tcp(port)
                except OSError:
                    assert proc.poll() is None and time.monotonic() < deadline, "no start"
                    time.sleep(0.02)
            assert first.call("ping") == "pong"

            for _ in range(NOFILE + EXTRA):
                socks.append(socket.create_connection(("127.0.0.1", port), timeout=5))
            time.sleep(0.3)  # let the daemon hit EMFILE and back off

            cpu0 = cpu_seconds(proc.pid)
            time.sleep(IDLE_WINDOW_S)
            busy = cpu_seconds(proc.pid) - cpu0
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
            time.sleep(0.5)
            late = Client.tcp(port)
            assert late.call("ping") == "pong"
            late.close()
            first.close()
        finally:
            for s in socks:
                s.close()
            proc.send_signal(signal.SIGTERM)
            try:
                rc = proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                rc = proc.wait(5)
            log.close()
        assert rc == 0, f"exit {rc} after SIGTERM"
