"""Integration: the congestion control kvstashd gives TCP connections from this host.

local_tcp_congestion names the algorithm of connections whose client is on this host (reno
unless set; see util/tcpopt.h for why); "" leaves them to the host's default. The
daemon gives it to its listening socket, so that a connection has it from its handshake
on: switched after accept, a bbr start would leave it paced for good. The daemon's
sockets are read with ss (iproute2), and the tests are skipped, saying so, without it.
"""

import os
import shutil
import signal
import socket
import subprocess

import pytest

from kvtest import Daemon, free_port, wait_for


def host_default():
    with open("/proc/sys/net/ipv4/tcp_congestion_control") as f:
        return f.read().strip()


def server_side_algorithm(port, client_port):
    """The congestion control of the daemon's socket of the connection from client_port."""
    out = subprocess.run(["ss", "-tin", "state", "established",
                          f"( sport = :{port} and dport = :{client_port} )"],
                         capture_output=True, text=True, timeout=10, check=True).stdout
    lines = [ln.split() for ln in out.splitlines()[1:] if ln.strip()]
    assert len(lines) == 2, out  # the socket's line, then its details
    return lines[1][0]


def listener_algorithm(port):
    """The congestion control of the daemon's listening socket on port."""
    out = subprocess.run(["ss", "-ltin", f"( sport = :{port} )"],
                         capture_output=True, text=True, timeout=10, check=True).stdout
    lines = [ln.split() for ln in out.splitlines()[1:] if ln.strip()]
    assert len(lines) == 2, out
    return lines[1][0]


def offered():
    with open("/proc/sys/net/ipv4/tcp_available_congestion_control") as f:
        return f.read().split()


def other_than(*names):
    """An algorithm the kernel offers other than names (None if there is none)."""
    return next((a for a in ("reno", "cubic", "bbr") if a in offered() and a not in names),
                None)


@pytest.mark.parametrize("setting", [None, "cubic", ""])
def test_same_host_connections_get_local_tcp_congestion(work, setting):
    if shutil.which("ss") is None:
        pytest.skip("ss (iproute2) is not installed: the daemon's side cannot be read")
    args = ("--memory_size=64m", "--ssd_dir=", "--io_threads=1")
    if setting is not None:
        args += (f"--local_tcp_congestion={setting}",)
    d = Daemon(work, args).wait_ready()
    try:
        c = d.tcp()
        assert c.call("ping") == "pong"  # accepted and set up
        client_port = c.sock.getsockname()[1]
        want = "reno" if setting is None else setting or host_default()
        assert server_side_algorithm(d.port, client_port) == want
        # from the handshake on: the listener has it, and its connections inherit it
        assert listener_algorithm(d.port) == want
        # what the client side uses is its own business: a socket left alone keeps the host's
        assert c.sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_CONGESTION, 16) \
            .rstrip(b"\0").decode() == host_default()
        d.assert_alive()
    finally:
        d.stop()


def test_resp_port_connections_get_local_tcp_congestion_from_the_handshake(work):
    """The RESP port (resp_listen) is a TCP listener like listen: its connections from this
    host have local_tcp_congestion from their handshake on. Left to the host's default and
    switched after accept, a bbr start kept them paced for life: a RESP GET of 64 KiB
    started four times the pacing timers of a msgpack get."""
    if shutil.which("ss") is None:
        pytest.skip("ss (iproute2) is not installed: the daemon's side cannot be read")
    # an algorithm other than the host's, so that the listener having it shows it was set
    want = other_than(host_default())
    if want is None:
        pytest.skip(f"the kernel offers {offered()}: one algorithm, nothing to tell apart")
    port = free_port()
    d = Daemon(work, ("--memory_size=64m", "--ssd_dir=", "--io_threads=1",
                      f"--resp_listen=127.0.0.1:{port}",
                      f"--local_tcp_congestion={want}")).wait_ready()
    try:
        wait_for(lambda: listener_algorithm(port) == want, 10, "the RESP listener's algorithm")
        with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
            s.sendall(b"PING\r\n")
            assert s.recv(64) == b"+PONG\r\n"
            assert server_side_algorithm(port, s.getsockname()[1]) == want
        assert "local_tcp_congestion \"" not in d.output(), "no algorithm was refused"
        d.assert_alive()
    finally:
        d.stop()


def test_reload_gives_the_listener_and_new_connections_the_new_algorithm(work):
    if shutil.which("ss") is None:
        pytest.skip("ss (iproute2) is not installed: the daemon's side cannot be read")
    # first is not the host's, so that the listener having it shows it was set; second is
    # another one (the host's, when the kernel offers only two)
    first = other_than(host_default())
    second = other_than(host_default(), first) or other_than(first)
    if first is None or second is None:
        pytest.skip(f"the kernel offers {offered()}: one algorithm, nothing to switch to")
    conf = os.path.join(work, "kvstashd.conf")

    def configure(algorithm):
        with open(conf, "w") as f:
            f.write(f'memory_size 64m\nssd_dir ""\nio_threads 1\n'
                    f'local_tcp_congestion {algorithm}\n')

    configure(first)
    d = Daemon(work, (f"--config={conf}",)).wait_ready()
    try:
        old = d.tcp()
        assert old.call("ping") == "pong"
        old_port = old.sock.getsockname()[1]
        assert listener_algorithm(d.port) == first

        configure(second)
        d.proc.send_signal(signal.SIGHUP)
        wait_for(lambda: listener_algorithm(d.port) == second, 10, "the reloaded listener")
        new = d.tcp()
        assert new.call("ping") == "pong"
        assert server_side_algorithm(d.port, new.sock.getsockname()[1]) == second
        assert server_side_algorithm(d.port, old_port) == first, "a live connection is kept"

        # "" puts the host's default back, on the listener and on what it accepts
        configure('""')
        d.proc.send_signal(signal.SIGHUP)
        wait_for(lambda: listener_algorithm(d.port) == host_default(), 10,
                 "the listener back on the host's default")
        last = d.tcp()
        assert last.call("ping") == "pong"
        assert server_side_algorithm(d.port, last.sock.getsockname()[1]) == host_default()
        assert "local_tcp_congestion \"" not in d.output(), "no algorithm was refused"
        d.assert_alive()
    finally:
        d.stop()
