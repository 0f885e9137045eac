"""kvtest: the Python integration tests' one harness: the daemon and a generic client.

Every Python test starts kvstashd through Daemon and nothing else.
Daemon(work, args, data_dir=None, unix=True, nofile=None) starts kvstashd ($KVSTASHD, default
build/release/kvstashd) on an ephemeral loopback port (and, with unix, a Unix socket in the
work dir), logging to a file there; wait_ready() waits until it answers, exit_code() waits
for one that must exit by itself (a refusal to start). Client is a generic msgpack-rpc
client over one stream socket, built from Debian's python3-msgpack and the standard library
only: what it can do, any msgpack-rpc client in any language can. Every wait is bounded.
"""

import os
import pathlib
import resource
import signal
import socket
import subprocess
import time

import msgpack
import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
KVSTASHD = os.environ.get("KVSTASHD") or str(ROOT / "build" / "release" / "kvstashd")
TIMEOUT = 10.0  # a client's wait for one message

REQUEST, RESPONSE, NOTIFY = 0, 1, 2


def require_kvstashd():
    """Fail the test at once when there is no kvstashd to run."""
    if not os.access(KVSTASHD, os.X_OK):
        pytest.fail(f"no kvstashd at {KVSTASHD} (build it, or set KVSTASHD)")


def free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def recv_to_eof(sock):
    """Everything sock receives until the peer closes (bounded by sock's timeout)."""
    data = b""
    while True:
        chunk = sock.recv(4096)
        if not chunk:
            return data
        data += chunk


class Client:
    """A generic msgpack-rpc client over one stream socket."""

    def __init__(self, sock):
        self.sock = sock
        self.sock.settimeout(TIMEOUT)
        self.packer = msgpack.Packer(use_bin_type=True)
        self.unpacker = msgpack.Unpacker(raw=False, max_buffer_size=256 << 20)
        self.next_id = 1

    @classmethod
    def tcp(cls, port):
        return cls(socket.create_connection(("127.0.0.1", port), timeout=TIMEOUT))

    @classmethod
    def unix(cls, path):
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.settimeout(TIMEOUT)
        s.connect(path)
        return cls(s)

    def close(self):
        self.sock.close()

    def request(self, method, params, msgid=None):
        if msgid is None:
            msgid = self.next_id
            self.next_id += 1
        return msgid, self.packer.pack([REQUEST, msgid, method, list(params)])

    def recv(self):
        deadline = time.monotonic() + TIMEOUT
        while True:
            for msg in self.unpacker:
                return msg
            if time.monotonic() > deadline:
                raise TimeoutError("no message from kvstashd")
            data = self.sock.recv(1 << 20)
            if not data:
                raise ConnectionError("kvstashd closed the connection")
            self.unpacker.feed(data)

    def call_raw(self, method, *params):
        msgid, data = self.request(method, params)
        self.sock.sendall(data)
        msg = self.recv()
        assert isinstance(msg, list) and len(msg) == 4, msg
        assert msg[0] == RESPONSE and msg[1] == msgid, msg
        return msg[2], msg[3]

    def call(self, method, *params):
        err, result = self.call_raw(method, *params)
        assert err is None, f"{method}: {err}"
        return result


class Daemon:
    """One kvstashd process: TCP on an ephemeral port, optionally a Unix socket. args come
    after the harness's own --listen, --data_dir and --unix_socket, so they override them.
    nofile: the process's RLIMIT_NOFILE (soft and hard), for running it out of descriptors.
    binary: another kvstashd than $KVSTASHD (an installed one); env: variables added to the
    process's environment (NOTIFY_SOCKET)."""

    seq = 0

    def __init__(self, work, args, data_dir=None, unix=True, nofile=None, binary=None,
                 env=None):
        require_kvstashd()
        Daemon.seq += 1
        n = Daemon.seq
        self.port = free_port()
        self.data_dir = data_dir or os.path.join(work, f"data{n}")
        self.unix_path = os.path.join(work, f"kv{n}.sock") if unix else None
        self.log_path = os.path.join(work, f"kvstashd-{n}.log")
        # metrics_listen off unless a test asks for it: its default port is one for all
        self.cmd = [binary or KVSTASHD, f"--listen=127.0.0.1:{self.port}",
                    f"--data_dir={self.data_dir}", f"--unix_socket={self.unix_path or 'none'}",
                    "--metrics_listen=", *args]

        def limit():
            resource.setrlimit(resource.RLIMIT_NOFILE, (nofile, nofile))

        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(self.cmd, stdin=subprocess.DEVNULL, stdout=log,
                                         stderr=subprocess.STDOUT,
                                         preexec_fn=limit if nofile else None,
                                         env={**os.environ, **env} if env else None)
        self.clients = []

    @property
    def pid(self):
        return self.proc.pid

    def output(self):
        with open(self.log_path, "rb") as f:
            return f.read().decode(errors="replace")

    def tail(self, n=40):
        return "\n".join(self.output().splitlines()[-n:])

    def _answers(self):
        c = Client.tcp(self.port)
        try:
            if c.call("ping") != "pong":
                return False
        finally:
            c.close()
        if self.unix_path is None:
            return True
        if not os.path.exists(self.unix_path):
            return False
        u = Client.unix(self.unix_path)
        try:
            return u.call("ping") == "pong"
        finally:
            u.close()

    def wait_ready(self, timeout=15.0):
        deadline = time.monotonic() + timeout
        while True:
            if self.proc.poll() is not None:
                pytest.fail(f"kvstashd exited during startup ({self.proc.returncode}):\n"
                            + self.tail())
            try:
                if self._answers():
                    return self
            except OSError:
                pass
            if time.monotonic() > deadline:
                pytest.fail(f"kvstashd did not accept within {timeout} s:\n" + self.tail())
            time.sleep(0.02)

    def exit_code(self, timeout=30.0):
        """A daemon that must exit by itself (a refusal to start): its exit code, once it
        has exited; a test failure when it is still running after timeout seconds."""
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.reap()
            pytest.fail(f"kvstashd {' '.join(self.cmd[1:])} still running after {timeout} s:\n"
                        + self.tail())

    def tcp(self):
        c = Client.tcp(self.port)
        self.clients.append(c)
        return c

    client = tcp

    def unix(self):
        c = Client.unix(self.unix_path)
        self.clients.append(c)
        return c

    def alive(self):
        return self.proc.poll() is None

    def assert_alive(self):
        assert self.alive(), f"kvstashd died (exit {self.proc.returncode}):\n" + self.tail()
        c = Client.tcp(self.port)
        try:
            assert c.call("ping") == "pong"
        finally:
            c.close()

    def close_clients(self):
        for c in self.clients:
            try:
                c.close()
            except OSError:
                pass
        self.clients = []

    def stop(self, timeout=20.0):
        """SIGTERM; the daemon must exit 0."""
        self.close_clients()
        assert self.alive(), f"kvstashd died (exit {self.proc.returncode}):\n" + self.tail()
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(5)
            pytest.fail(f"kvstashd did not exit within {timeout} s of SIGTERM:\n" + self.tail())
        assert self.proc.returncode == 0, \
            f"kvstashd exit {self.proc.returncode} after SIGTERM:\n" + self.tail()

    def kill9(self):
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(10)
        self.close_clients()

    def reap(self):
        """Teardown: whatever state it is in, the process is gone afterwards."""
        self.close_clients()
        if self.proc.poll() is None:
            self.proc.kill()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                pass


def wait_for(pred, timeout, what, interval=0.02):
    """Poll pred() until it is truthy (returned) or timeout seconds pass (test failure).
    what names the condition in the failure; a callable is called then for the details."""
    deadline = time.monotonic() + timeout
    while True:
        v = pred()
        if v:
            return v
        if time.monotonic() > deadline:
            if callable(what):
                what = what()
            pytest.fail(f"timed out after {timeout} s waiting for {what}")
        time.sleep(interval)


def stop_process(pid, timeout=10):
    """SIGSTOP pid and wait until every one of its threads has stopped: kill() returns
    before a busy or unscheduled thread takes the signal, and a test that counts on a
    stopped daemon (nothing read from its sockets) must not start before it is."""
    os.kill(pid, signal.SIGSTOP)

    def stopped():
        for tid in os.listdir(f"/proc/{pid}/task"):
            try:
                with open(f"/proc/{pid}/task/{tid}/stat") as f:
                    if f.read().rsplit(")", 1)[1].split()[0] not in ("T", "t"):
                        return False
            except FileNotFoundError:
                continue        # a thread that ended
        return True

    wait_for(stopped, timeout, f"process {pid} to stop")
