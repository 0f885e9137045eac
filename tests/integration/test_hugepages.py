"""Integration: which pages back the DRAM tier (memory_hugepages) as an operator sees it.

With a hugetlb pool that has room (vm.nr_hugepages; the test skips, saying so, without one)
`memory_hugepages on` starts on 2 MiB pages: `stats` memory_hugepages is 2, the log says so,
memory_size is rounded down to whole 2 MiB pages, the population covers the arena (its pages
show in the daemon's HugetlbPages, not its RSS), and every way a same-host client reaches the
arena works on it byte-exact: put_start into the arena mapped from the daemon's memfd,
batch_put_from and batch_get_into through a registered buffer, get over TCP. `off` is 4 KiB
pages whatever the host offers; `on` without huge pages refuses to start, saying why.
"""

import random

import pytest

from arena_fixture import MIB, pool_room, skip_without_hugetlb_room, store_all_ways
from kvtest import Daemon, wait_for

import kvstash  # noqa: E402  (importable once arena_fixture has set the path)


def thp_shmem():
    try:
        with open("/sys/kernel/mm/transparent_hugepage/shmem_enabled") as f:
            line = f.read()
    except OSError:
        return False
    return "[never]" not in line and "[deny]" not in line


def hugetlb_kb(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("HugetlbPages:"):
                return int(line.split()[1])
    return 0


def test_hugetlb_arena_serves_every_client_path(work):
    skip_without_hugetlb_room(40)
    d = Daemon(work, ["--memory_size=65m", "--memory_hugepages=on", "--ssd_dir="])
    try:
        d.wait_ready()
        assert "the arena of 67108864 bytes is on hugetlb pages of 2 MiB" in d.output(), \
            d.tail()
        with kvstash.Client(d.unix_path) as c:
            st = c.stats()
            assert st["memory_hugepages"] == 2
            assert st["memory_capacity"] == 64 * MIB, "65m rounds down to whole 2 MiB pages"
            wait_for(lambda: c.stats()["memory_prefaulted"] == 64 * MIB, 30,
                     "the population to cover the arena")
            assert hugetlb_kb(d.pid) == 64 * 1024, "the arena is the daemon's hugetlb pages"
            assert len(c.map_arena()) == 64 * MIB
        store_all_ways(d, random.Random(19), "h", sizes=(4096, 3 * MIB + 5, 2 * MIB, 777),
                       tcp_values=0)
        d.stop()
    finally:
        d.reap()


def test_hugepages_off_is_4k_pages(work):
    d = Daemon(work, ["--memory_size=64m", "--memory_hugepages=off", "--ssd_dir="])
    try:
        d.wait_ready()
        assert "the arena of 67108864 bytes is on 4 KiB pages (memory_hugepages off)" \
            in d.output(), d.tail()
        with kvstash.Client(f"127.0.0.1:{d.port}") as c:
            assert c.stats()["memory_hugepages"] == 0
            c.put(b"k", b"v" * 70000)
            assert c.get(b"k") == b"v" * 70000
        assert hugetlb_kb(d.pid) == 0
        d.stop()
    finally:
        d.reap()


def test_hugepages_on_without_them_refuses_to_start(work):
    if pool_room() >= 32 or thp_shmem():
        pytest.skip("this host has huge pages (a hugetlb pool with room, or shmem THP "
                    "enabled): the refusal cannot be shown")
    d = Daemon(work, ["--memory_size=64m", "--memory_hugepages=on", "--ssd_dir="])
    try:
        assert d.exit_code() != 0
        out = d.output()
        assert "memory_hugepages on, but no huge pages for the arena: the hugetlb pool has" \
            in out, out
        assert "vm.nr_hugepages" in out and "shmem_enabled" in out, out
    finally:
        d.reap()
