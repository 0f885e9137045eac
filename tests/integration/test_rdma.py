"""The rdma setting at start, on a machine with or without RDMA hardware.

Without a device, `rdma = required` must refuse to start with a message that says what is
missing, `auto` must start and say why it serves without RDMA, and hello must not list rdma
as a transport. With one (skipped here, visibly, when there is none), `auto` registers the
arena and hello lists rdma. The RDMA data path itself runs against the in-process
emulation in tests/integration/test_rdma_path.c.
"""

import os

import pytest


def has_rdma_device():
    return os.path.isdir("/sys/class/infiniband") and bool(os.listdir("/sys/class/infiniband"))


@pytest.mark.skipif(has_rdma_device(), reason="an RDMA device is present: required starts")
def test_required_refuses_to_start_and_says_why(daemons):
    d = daemons(("--rdma=required",), unix=False, ready=False)
    rc, out = d.exit_code(), d.output()
    assert rc != 0, "rdma = required started anyway:\n" + out
    assert "rdma = required" in out and "refusing to start" in out, out
    assert "no RDMA device found" in out, out


def test_required_with_a_device_that_is_not_there(daemons):
    d = daemons(("--rdma=required", "--rdma_device=nosuchdev0"), unix=False, ready=False)
    rc, out = d.exit_code(), d.output()
    assert rc != 0, out
    assert "nosuchdev0" in out or "no RDMA device found" in out, out


@pytest.mark.skipif(has_rdma_device(), reason="an RDMA device is present: auto serves with "
                    "RDMA (test_auto_with_a_device_registers_the_arena checks that)")
def test_auto_serves_without_rdma_and_hello_does_not_list_it(daemons):
    d = daemons(("--rdma=auto", "--memory_size=16m", "--ssd_dir="))
    h = d.tcp().call("hello")
    assert "rdma" not in h["transports"], h["transports"]
    assert "serving without RDMA" in d.output(), d.tail()
    d.stop()


def test_off_says_nothing_about_rdma(daemons):
    d = daemons(("--rdma=off", "--memory_size=16m", "--ssd_dir="))
    assert d.tcp().call("ping") == "pong"
    assert "rdma:" not in d.output() and "RDMA" not in d.output(), d.tail()
    d.stop()


@pytest.mark.skipif(not has_rdma_device(), reason="no RDMA device here (/sys/class/infiniband "
                    "is absent or empty): the device-present path has not run")
def test_auto_with_a_device_registers_the_arena(daemons):
    d = daemons(("--rdma=auto", "--memory_size=16m", "--ssd_dir="))
    assert "arena registered" in d.output(), d.tail()
    assert "rdma" in d.tcp().call("hello")["transports"]
    d.stop()
