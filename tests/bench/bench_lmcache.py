#!/usr/bin/python3
"""bench_lmcache.py: kvstash.lmcache's KvstashL2Adapter against the raw client, same run.

Rows (each a batch of --chunks chunks of --chunk-kib KiB, the median of its repetitions):

  raw batch_put_from / batch_get_into   kvstash.Client, pieces in a registered sealed memfd
  adapter store / load, shm L1          the L2 adapter with LMCache's L1 arena in a sealed
                                        memfd: registered once, no copy
  adapter store / load, staging L1      the same with the arena in private memory: one
                                        memcpy through the client's staging buffer

The rows take turns, round after round, until --secs have passed (at least --min-reps
rounds, at most --max-reps), so every row sees the same minutes of a shared machine. Each
store writes fresh keys (objects are write-once); each load reads the keys its row stored
last. LMCache itself is not installed: the adapter runs over the stand-ins of
tests/integration/standins/lmcache, as the tests do. Loads are checked byte-exact once per
row. Prints a table of GB/s (10^9 bytes/s) and each row's ratio to the raw row, then the
client's CPU time per batch (the process's, the adapter's worker threads included).

Usage: bench_lmcache.py --addr unix:/path/to/kvstashd.sock [--secs 20] [--chunks 128]
       [--chunk-kib 512]
The daemon needs memory for a few batches (--memory_size of 1 GiB or more for the
defaults). Exits 1 when a store or load fails or a load's bytes differ.
"""

import argparse
import ctypes
import mmap
import os
import pathlib
import select
import statistics
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "client" / "python"))
sys.path.insert(0, str(ROOT / "tests" / "integration" / "standins" / "lmcache"))

import kvstash  # noqa: E402
from kvstash import buffers  # noqa: E402
from kvstash.lmcache import KvstashL2Adapter, object_key_to_string  # noqa: E402
from lmcache.v1.distributed.api import ObjectKey  # noqa: E402
from lmcache.v1.distributed.internal_api import L1MemoryDesc  # noqa: E402
from lmcache.v1.memory_management import HostMemoryObj  # noqa: E402

WAIT = 120.0


class Arena:
    """2 * n chunks of host memory: the first half holds the values stored, the second
    is where loads land. sealed: a memfd the daemon takes; else private memory."""

    def __init__(self, sealed, n, size):
        self.n, self.size = n, size
        nbytes = 2 * n * size
        if sealed:
            fd = os.memfd_create("bench-l1", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
            os.ftruncate(fd, nbytes)
            self.fd = fd
            self.mem = mmap.mmap(fd, nbytes, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
            self.ptr = buffers.address_of(self.mem)
            self.view = memoryview(self.mem)
        else:
            self.fd = None
            self.mem = (ctypes.c_ubyte * nbytes)()
            self.ptr = ctypes.addressof(self.mem)
            self.view = memoryview(self.mem).cast("B")
        pattern = os.urandom(size)
        for i in range(n):
            self.view[i * size:(i + 1) * size] = pattern
            self.view[i * size:i * size + 8] = i.to_bytes(8, "little")
        self.view[n * size:] = bytes(n * size)      # touch every page once

    def desc(self):
        return L1MemoryDesc(ptr=self.ptr, size=2 * self.n * self.size, align_bytes=4096)

    def objs(self, half):
        base = self.ptr + half * self.n * self.size
        return [HostMemoryObj(base + i * self.size, self.size) for i in range(self.n)]

    def loads_ok(self):
        h = self.n * self.size
        return self.view[:h] == self.view[h:2 * h]


def keys_for(tag, rnd, n):
    return [ObjectKey(chunk_hash=f"{tag}-{rnd}-{i}".encode(), model_name="bench/model",
                      kv_rank=0) for i in range(n)]


def wait_fd(fd, query, tid):
    deadline = time.monotonic() + WAIT
    while True:
        r = query(tid)
        if r is not None:
            return r
        if time.monotonic() > deadline:
            sys.exit(f"bench_lmcache: task {tid} did not complete within {WAIT} s")
        select.select([fd], [], [], 0.5)
        try:
            os.eventfd_read(fd)
        except OSError:
            pass


class AdapterRow:
    def __init__(self, name, addr, arena):
        self.name, self.arena = name, arena
        self.a = KvstashL2Adapter({"kvstash_addr": addr, "lock": "none"},
                                  l1_memory_desc=arena.desc())
        self.stores = {}
        self.last = None
        self.checked = False

    def store(self, rnd):
        keys = keys_for(self.name, rnd, self.arena.n)
        t0 = time.perf_counter()
        tid = self.a.submit_store_task(keys, self.arena.objs(0))
        deadline = time.monotonic() + WAIT
        while tid not in self.stores:
            self.stores.update(self.a.pop_completed_store_tasks())
            if tid in self.stores:
                break
            if time.monotonic() > deadline:
                sys.exit(f"bench_lmcache: {self.name} store did not complete")
            select.select([self.a.get_store_event_fd()], [], [], 0.5)
            try:
                os.eventfd_read(self.a.get_store_event_fd())
            except OSError:
                pass
        dt = time.perf_counter() - t0
        if not self.stores.pop(tid).is_successful():
            sys.exit(f"bench_lmcache: {self.name} store failed: {self.a.report_status()}")
        self.last = keys
        return dt

    def load(self):
        t0 = time.perf_counter()
        tid = self.a.submit_load_task(self.last, self.arena.objs(1))
        bm = wait_fd(self.a.get_load_event_fd(), self.a.query_load_result, tid)
        dt = time.perf_counter() - t0
        if bm.popcount() != self.arena.n:
            sys.exit(f"bench_lmcache: {self.name} load: {bm.popcount()} of {self.arena.n}")
        if not self.checked:
            if not self.arena.loads_ok():
                sys.exit(f"bench_lmcache: {self.name} load: bytes differ")
            self.checked = True
        return dt

    def close(self):
        self.a.close()


class RawRow:
    def __init__(self, addr, arena):
        self.name, self.arena = "raw", arena
        self.c = kvstash.Client(addr, timeout=WAIT, auto_register=False)
        self.buf = self.c.register_fd(arena.fd)
        self.last = None
        self.checked = False
        n, s = arena.n, arena.size
        self.put_pieces = [(self.buf, i * s, s) for i in range(n)]
        self.get_pieces = [(self.buf, (n + i) * s, s) for i in range(n)]

    def store(self, rnd):
        keys = [object_key_to_string(k) for k in keys_for("raw", rnd, self.arena.n)]
        t0 = time.perf_counter()
        codes = self.c.batch_put_from(keys, self.put_pieces)
        dt = time.perf_counter() - t0
        if any(c != kvstash.OK for c in codes):
            sys.exit(f"bench_lmcache: raw batch_put_from: codes {sorted(set(codes))}")
        self.last = keys
        return dt

    def load(self):
        t0 = time.perf_counter()
        got = self.c.batch_get_into(self.last, self.get_pieces)
        dt = time.perf_counter() - t0
        if any(g != self.arena.size for g in got):
            sys.exit("bench_lmcache: raw batch_get_into: short or missing values")
        if not self.checked:
            if not self.arena.loads_ok():
                sys.exit("bench_lmcache: raw load: bytes differ")
            self.checked = True
        return dt

    def close(self):
        self.c.close()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--addr", required=True, help="the daemon's Unix socket (unix:/path)")
    ap.add_argument("--secs", type=float, default=20.0, help="time bound (seconds)")
    ap.add_argument("--chunks", type=int, default=128)
    ap.add_argument("--chunk-kib", type=int, default=512)
    ap.add_argument("--min-reps", type=int, default=3)
    ap.add_argument("--max-reps", type=int, default=50)
    args = ap.parse_args()
    n, size = args.chunks, args.chunk_kib << 10
    rows = [RawRow(args.addr, Arena(True, n, size)),
            AdapterRow("adapter-shm", args.addr, Arena(True, n, size)),
            AdapterRow("adapter-staging", args.addr, Arena(False, n, size))]
    times = {r.name: ([], []) for r in rows}
    cpu = {r.name: ([], []) for r in rows}
    end = time.monotonic() + args.secs
    rnd = 0
    try:
        while rnd < args.max_reps and (rnd < args.min_reps or time.monotonic() < end):
            for r in rows:
                c = time.process_time()
                times[r.name][0].append(r.store(rnd))
                cpu[r.name][0].append(time.process_time() - c)
                c = time.process_time()
                times[r.name][1].append(r.load())
                cpu[r.name][1].append(time.process_time() - c)
            rnd += 1
        path = rows[1].a.report_status()["l1_path"], rows[2].a.report_status()["l1_path"]
    finally:
        for r in rows:
            r.close()
    if path != ("shm", "staging"):
        print(f"bench_lmcache: note: L1 paths taken were {path}, not (shm, staging)")
    batch = n * size
    gbps = {k: (batch / statistics.median(s) / 1e9, batch / statistics.median(g) / 1e9)
            for k, (s, g) in times.items()}
    print(f"LMCache L2 adapter vs raw client: {n} chunks of {args.chunk_kib} KiB "
          f"({batch / 1e6:.0f} MB) per batch, median of {rnd} rounds, GB/s")
    print(f"{'row':44s} {'GB/s':>7s} {'vs raw':>7s}")
    labels = {
        "raw": ("raw batch_put_from (registered memfd)", "raw batch_get_into (registered memfd)"),
        "adapter-shm": ("adapter submit_store_task, shm L1 (no copy)",
                        "adapter submit_load_task, shm L1 (no copy)"),
        "adapter-staging": ("adapter submit_store_task, staging copy",
                            "adapter submit_load_task, staging copy"),
    }
    for op in (0, 1):
        for k in ("raw", "adapter-shm", "adapter-staging"):
            v = gbps[k][op]
            print(f"{labels[k][op]:44s} {v:7.2f} {v / gbps['raw'][op]:7.2f}")
    print("client CPU per batch (this process's, its threads included, ms, medians)")
    for k in ("raw", "adapter-shm", "adapter-staging"):
        print(f"  cpu {k:16s} store {statistics.median(cpu[k][0]) * 1e3:6.2f}  "
              f"load {statistics.median(cpu[k][1]) * 1e3:6.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
