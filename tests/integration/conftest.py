"""Fixtures shared by the Python integration tests.

work: a fresh directory for daemons' data, sockets and logs, removed afterwards; a test fails
at once when there is no kvstashd to run. daemons(args, data_dir=None, unix=True, ready=True)
starts kvstashd (kvtest.Daemon); every one started is killed at teardown and its log tail
printed, which pytest shows only for a failed test.
"""

import os
import tempfile

import pytest

from kvtest import Daemon
from test_python_client import KVSTASHD


@pytest.fixture
def work(request):
    if not os.access(KVSTASHD, os.X_OK):
        pytest.fail(f"no kvstashd at {KVSTASHD} (build it, or set KVSTASHD)")
    name = request.module.__name__.removeprefix("test_")
    with tempfile.TemporaryDirectory(prefix=f"kvstash-{name}-") as tmp:
        yield tmp


@pytest.fixture
def daemons(work):
    started = []

    def start(args, data_dir=None, unix=True, ready=True):
        d = Daemon(work, args, data_dir=data_dir, unix=unix)
        started.append(d)
        return d.wait_ready() if ready else d

    yield start
    for d in started:
        d.reap()
    for d in started:
        print(f"---- {' '.join(d.cmd[1:])}\n{d.tail(30)}")
