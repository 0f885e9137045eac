"""Fixtures of the pool tests: work (a temp dir), etcd (a real etcd, skipped when it is not
installed), pool (a clusterlib.Pool on that etcd, ttl 2 s), view_pools (starts
clusterlib.ViewPool pools: fixed views, no etcd), fixed_pool (3 daemons in one such view), daemon_single (a daemon in no pool).
Everything started is killed at teardown, and the logs' tails printed (pytest shows them
for a failed test).

Tests marked quick are the short set `make test` runs; `make cluster-test` runs them all.
"""

import os
import sys
import tempfile

import pytest

sys.path.insert(0, os.path.dirname(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "integration"))

from clusterlib import Etcd, Pool, ViewPool  # noqa: E402
from kvtest import Daemon, require_kvstashd  # noqa: E402


def pytest_configure(config):
    config.addinivalue_line("markers", "quick: the short set make test runs")


@pytest.fixture
def work(request):
    require_kvstashd()
    name = request.module.__name__.removeprefix("test_")
    with tempfile.TemporaryDirectory(prefix=f"kvstash-cluster-{name}-") as tmp:
        yield tmp


@pytest.fixture
def etcd(work):
    e = Etcd(work)
    yield e
    e.reap()
    print(f"---- etcd\n{e.tail(15)}")


@pytest.fixture
def pool(work, etcd):
    p = Pool(work, etcd)
    yield p
    p.reap_show()


@pytest.fixture
def view_pools(work):
    """view_pools(cls=ViewPool, ...): a pool of that class started in work (further
    arguments go to it); every pool started is closed at teardown, its logs' tails printed."""
    pools = []

    def start(cls=ViewPool, *args, **kwargs):
        p = cls(work, *args, **kwargs)
        pools.append(p)
        return p

    yield start
    for p in pools:
        p.close()
        for d in p.daemons:
            if d is not None:
                print(f"---- {' '.join(d.cmd[1:])}\n{d.tail(20)}")


@pytest.fixture
def fixed_pool(view_pools):
    """fixed_pool(n=3, extra=(), unix=False): n daemons in one fixed view, R = 2."""
    return lambda n=3, extra=(), unix=False: view_pools(ViewPool, n, extra, unix)


@pytest.fixture
def daemon_single(work):
    """One kvstashd with no pool (cluster_name empty), on 127.0.0.1."""
    d = Daemon(work, ["--ssd_dir=", "--memory_size=64m"], unix=False)
    yield d.wait_ready()
    d.reap()
