"""Helpers shared by the tests of the DRAM arena's backing (test_memory_file, test_hugepages).

pool_room(): 2 MiB pages the hugetlb pool could give a new mapping now (-1: no pool).
skip_without_hugetlb_room(pages): skip the test, saying how to reserve a pool, without one.
store_all_ways(d, rnd, prefix): put values every way a same-host client reaches the arena
(put_start into the mapped arena, batch_put_from through a registered buffer, put over TCP),
read each back, and return {key: value}. Importing it makes the package kvstash
(client/python) importable, so either test runs alone.
"""

import hashlib
import pathlib
import sys

import pytest

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "client" / "python"))

import kvstash  # noqa: E402  (after the path is set)

MIB = 1 << 20
POOL = "/sys/kernel/mm/hugepages/hugepages-2048kB/"


def pool_room():
    """2 MiB pages a new mapping could reserve from the hugetlb pool now; -1: no pool."""
    try:
        with open(POOL + "free_hugepages") as f, open(POOL + "resv_hugepages") as r:
            return int(f.read()) - int(r.read())
    except OSError:
        return -1


def skip_without_hugetlb_room(pages=40):
    room = pool_room()
    if room < pages:
        pytest.skip(f"no hugetlb pool with {pages} free 2 MiB pages ({room}): reserve one with "
                    "`echo 64 > /proc/sys/vm/nr_hugepages` to run this test")


def store_all_ways(d, rnd, prefix, sizes=(4096, 3 * MIB + 5, 777), tcp_values=4):
    """Put values through the mapped arena (one of each of sizes), through a registered buffer
    and over TCP (tcp_values of them); read each back every way; return {key: value}."""
    table = {}
    with kvstash.Client(d.unix_path) as c:
        assert len(c.map_arena()) == c.stats()["memory_capacity"]
        # put_start: the client writes into the arena through its own mapping of the memfd
        vals = [rnd.randbytes(n) for n in sizes]
        keys = [f"{prefix}-direct-{i}".encode() for i in range(len(vals))]
        places = c.put_start(keys, [len(v) for v in vals])
        for v, views in zip(vals, places):
            off = 0
            for m in views:
                m[:] = v[off:off + len(m)]
                off += len(m)
        assert c.put_end(keys) == [0] * len(keys)
        table.update(zip(keys, vals))
        # batch_put_from / batch_get_into through a registered buffer (zero copy)
        buf = c.register_buffer(8 * MIB)
        src = rnd.randbytes(8 * MIB)
        buf.memory[:] = src
        keys = [f"{prefix}-from-{i}".encode() for i in range(8)]
        assert c.batch_put_from(keys, [(buf, i * MIB, MIB) for i in range(8)]) == [0] * 8
        table.update((k, src[i * MIB:(i + 1) * MIB]) for i, k in enumerate(keys))
        buf.memory[:] = bytes(8 * MIB)
        assert c.batch_get_into(keys, [(buf, i * MIB, MIB) for i in range(8)]) == [MIB] * 8
        assert hashlib.sha256(buf.memory).digest() == hashlib.sha256(src).digest()
    with kvstash.Client(f"127.0.0.1:{d.port}") as t:
        for i in range(tcp_values):
            k, v = f"{prefix}-tcp-{i}".encode(), rnd.randbytes(100_000 * (i + 1))
            t.put(k, v)
            table[k] = v
        for k, v in table.items():
            assert t.get(k) == v, k
    return table
