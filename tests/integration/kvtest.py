"""kvtest: one real kvstashd process for the Python integration tests.

Daemon(work, args, data_dir=None, unix=True) starts kvstashd on an ephemeral loopback port
(and, with unix, a Unix socket in the work dir), logging to a file there; wait_ready() waits
until it answers. Clients come from test_python_client.Client. Every wait is bounded.
"""

import os
import signal
import subprocess
import time

import pytest

from test_python_client import KVSTASHD, Client, free_port


class Daemon:
    """One kvstashd process: TCP on an ephemeral port, optionally a Unix socket."""

    seq = 0

    def __init__(self, work, args, data_dir=None, unix=True):
        Daemon.seq += 1
        n = Daemon.seq
        self.port = free_port()
        self.data_dir = data_dir or os.path.join(work, f"data{n}")
        self.unix_path = os.path.join(work, f"kv{n}.sock") if unix else None
        self.log_path = os.path.join(work, f"kvstashd-{n}.log")
        self.cmd = [KVSTASHD, f"--listen=127.0.0.1:{self.port}", f"--data_dir={self.data_dir}",
                    f"--unix_socket={self.unix_path or 'none'}", *args]
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(self.cmd, stdin=subprocess.DEVNULL, stdout=log,
                                         stderr=subprocess.STDOUT)
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
