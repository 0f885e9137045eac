"""Fixtures shared by the Python integration tests.

work: a fresh directory for daemons' data, sockets and logs, removed afterwards; a test fails
at once when there is no kvstashd to run. daemons(args, ready=True, **kw) starts kvstashd
(kvtest.Daemon(work, args, **kw)); every one started is killed at teardown and its log tail
printed, which pytest shows only for a failed test.
"""

import tempfile

import pytest

from kvtest import Daemon, require_kvstashd


@pytest.fixture
def work(request):
    require_kvstashd()
    name = request.module.__name__.removeprefix("test_")
    with tempfile.TemporaryDirectory(prefix=f"kvstash-{name}-") as tmp:
        yield tmp


@pytest.fixture
def daemons(work):
    started = []

    def start(args, ready=True, **kw):
        d = Daemon(work, args, **kw)
        started.append(d)
        return d.wait_ready() if ready else d

    yield start
    for d in started:
        d.reap()
    for d in started:
        print(f"---- {' '.join(d.cmd[1:])}\n{d.tail(30)}")
