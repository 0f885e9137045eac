"""Integration: the congestion control kvstashd gives TCP connections from this host.

local_tcp_congestion names the algorithm of connections whose client is on this host (reno
unless set; see protocol/tcpopt.h for why); "" leaves them to the host's default. The
daemon's side of a connection is read with ss (iproute2), and the test is skipped, saying
so, without it.
"""

import shutil
import socket
import subprocess

import pytest

from kvtest import Daemon


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
        # what the client side uses is its own business: a socket left alone keeps the host's
        assert c.sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_CONGESTION, 16) \
            .rstrip(b"\0").decode() == host_default()
        d.assert_alive()
    finally:
        d.stop()
