"""The rdma setting at start, on a machine with or without RDMA hardware.

Without a device, `rdma = required` must refuse to start with a message that says what is
missing, `auto` must start and say why it serves without RDMA, and hello must not list rdma
as a transport. With one (skipped here, visibly, when there is none), `auto` registers the
arena and hello lists rdma. The RDMA data path itself runs against the in-process
emulation in tests/integration/test_rdma_path.c.
"""

import os
import subprocess

import pytest

from kvtest import Daemon
from test_python_client import KVSTASHD


def has_rdma_device():
    return os.path.isdir("/sys/class/infiniband") and bool(os.listdir("/sys/class/infiniband"))


@pytest.mark.skipif(has_rdma_device(), reason="an RDMA device is present: required starts")
def test_required_refuses_to_start_and_says_why(work):
    p = subprocess.run([KVSTASHD, "--listen=127.0.0.1:0", f"--data_dir={work}/data",
                        "--unix_socket=none", "--rdma=required"],
                       stdin=subprocess.DEVNULL, capture_output=True, timeout=30)
    out = p.stderr.decode(errors="replace")
    assert p.returncode != 0, "rdma = required started anyway:\n" + out
    assert "rdma = required" in out and "refusing to start" in out, out
    assert "no RDMA device found" in out, out


def test_required_with_a_device_that_is_not_there(work):
    p = subprocess.run([KVSTASHD, "--listen=127.0.0.1:0", f"--data_dir={work}/data",
                        "--unix_socket=none", "--rdma=required", "--rdma_device=nosuchdev0"],
                       stdin=subprocess.DEVNULL, capture_output=True, timeout=30)
    out = p.stderr.decode(errors="replace")
    assert p.returncode != 0, out
    assert "nosuchdev0" in out or "no RDMA device found" in out, out


def test_auto_serves_without_rdma_and_hello_does_not_list_it(work):
    d = Daemon(work, ["--rdma=auto", "--memory_size=16m", "--ssd_dir="]).wait_ready()
    try:
        h = d.tcp().call("hello")
        assert "rdma" not in h["transports"], h["transports"]
        assert "serving without RDMA" in d.output(), d.tail()
    finally:
        d.stop()


def test_off_says_nothing_about_rdma(work):
    d = Daemon(work, ["--rdma=off", "--memory_size=16m", "--ssd_dir="]).wait_ready()
    try:
        assert d.tcp().call("ping") == "pong"
        assert "rdma:" not in d.output() and "RDMA" not in d.output(), d.tail()
    finally:
        d.stop()


@pytest.mark.skipif(not has_rdma_device(), reason="no RDMA device here (/sys/class/infiniband "
                    "is absent or empty): the device-present path has not run")
def test_auto_with_a_device_registers_the_arena(work):
    d = Daemon(work, ["--rdma=auto", "--memory_size=16m", "--ssd_dir="]).wait_ready()
    try:
        assert "arena registered" in d.output(), d.tail()
        assert "rdma" in d.tcp().call("hello")["transports"]
    finally:
        d.stop()
