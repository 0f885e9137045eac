#!/usr/bin/python3
"""bench_sglang: the SGLang HiCache backend (kvstash.sglang) against the raw client.

Moves 128 pages (K and V objects each, SGLang's MHA page_first layout: 64 tokens x 8 heads x
128 dims x 2 bytes per layer, --layers layers) between a host pool and kvstashd, in one run:

  raw zero-copy      Client.batch_put_from / batch_get_into, pieces in a registered memfd
  kvstash.sglang     batch_set_v1 / batch_get_v1 with the pool in a sealable memfd (the
                     adapter registers it: zero copy), in a memfd made as SGLang's alloc_shm
                     makes it (zero copy if the daemon accepts unsealed memfds, else the
                     staging copy: the row says which), and in anonymous shared memory (the
                     staging copy)
  raw staging        the raw client with pieces in anonymous memory (the staging copy)

Each row is the median of several rounds; a round runs every row in turn (fresh keys per
put, the store emptied before each, untimed); rounds stop at --seconds. GB/s counts value bytes; "vs raw" is the
row's GB/s over raw zero-copy's for the same operation (the issue's target for the adapter's
zero-copy rows: within 10%). Then each row's client CPU time per batch (the calling thread's).

  bench_sglang.py --addr unix:/path/kvstashd.sock [--seconds 30] [--layers 4] [--rounds 7]

Without --addr it starts a kvstashd ($KVSTASHD or build/release/kvstashd) through the test
harness (tests/integration/kvtest.py) in a temporary directory and stops it at the end.
"""

import argparse
import pathlib
import statistics
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "client" / "python"))
sys.path.insert(0, str(ROOT / "tests" / "integration" / "standins"))
sys.path.insert(0, str(ROOT / "tests" / "integration"))

import kvstash  # noqa: E402
from sglang.srt.mem_cache.hicache_storage import HiCacheStorageConfig  # noqa: E402
from sglang.srt.mem_cache.pool_host import MHATokenToKVPoolHost  # noqa: E402
from sglang.srt.mem_cache.storage.backend_factory import StorageBackendFactory  # noqa: E402

PAGES, PAGE, HEADS, DIM = 128, 64, 8, 128


def make_pool(layers, allocator):
    p = MHATokenToKVPoolHost(layers, HEADS, DIM, PAGE, PAGES, "page_first",
                             allocator_type=allocator)
    p.fill_random(7)
    return p


def make_backend(addr, pool):
    cfg = HiCacheStorageConfig(
        tp_rank=0, tp_size=1, pp_rank=0, pp_size=1, attn_cp_rank=0, attn_cp_size=1,
        is_mla_model=False, enable_storage_metrics=False, is_page_first_layout=True,
        model_name="bench/model",
        extra_config={"backend_name": "kvstash", "module_path": "kvstash.sglang",
                      "class_name": "KvstashStorage", "interface_v1": 1, "allocator": "shm",
                      "kvstash_addr": addr, "kvstash_timeout": 60})
    b = StorageBackendFactory.create_backend("dynamic", cfg, pool)
    b.register_mem_pool_host(pool)
    return b


def raw_pieces(pool, buf):
    """(keys suffixes, pieces) for the 128 pages' K and V objects, as the adapter builds
    them: in buf (a registered Buffer of the pool's memfd) or by address."""
    ptrs, sizes = pool.get_page_buffer_meta(pool.page_indices(range(PAGES)))
    base = pool.kv_buffer.ctypes.data
    if buf is None:
        return [[(a, 0, s)] for a, s in zip(ptrs, sizes)]
    return [[(buf, a - base, s)] for a, s in zip(ptrs, sizes)]


def measure(admin, rows, rounds, deadline, nbytes):
    """Rounds in turn over the rows (so a load change hits all rows alike), each row's put
    then get timed, the store emptied before each put (untimed). Returns per row
    (median put GB/s, median get GB/s, all ok, median put and get client CPU ms: the
    calling thread's CPU time, which a loaded machine disturbs far less than GB/s)."""
    tp = [[] for _ in rows]
    tg = [[] for _ in rows]
    cp = [[] for _ in rows]
    cg = [[] for _ in rows]
    ok = [True] * len(rows)
    seq = 0
    for r in range(rounds):
        if r and time.monotonic() > deadline:
            break
        for i, (_, put, get) in enumerate(rows):
            admin.remove_all(force=True)
            seq += 1
            t, c = time.perf_counter(), time.thread_time()
            ok[i] &= put(seq)
            tp[i].append(time.perf_counter() - t)
            cp[i].append(time.thread_time() - c)
            t, c = time.perf_counter(), time.thread_time()
            ok[i] &= get(seq)
            tg[i].append(time.perf_counter() - t)
            cg[i].append(time.thread_time() - c)
    admin.remove_all(force=True)
    return [(nbytes / statistics.median(p) / 1e9, nbytes / statistics.median(g) / 1e9, k,
             statistics.median(a) * 1e3, statistics.median(b) * 1e3)
            for p, g, k, a, b in zip(tp, tg, ok, cp, cg)]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--addr", help="kvstashd's Unix socket (unix:/path); default: start one")
    ap.add_argument("--seconds", type=float, default=30.0, help="bound on the whole run")
    ap.add_argument("--layers", type=int, default=4, help="layers per page (1 MiB at 4)")
    ap.add_argument("--rounds", type=int, default=7, help="rounds per row (median)")
    a = ap.parse_args()
    deadline = time.monotonic() + a.seconds
    nbytes = PAGES * 2 * a.layers * PAGE * HEADS * DIM * 2

    daemon = tmp = None
    addr = a.addr
    if addr is None:
        import kvtest
        tmp = tempfile.TemporaryDirectory(prefix="kvstash-bench-sglang-")
        mem = max(256, 3 * nbytes >> 20)
        daemon = kvtest.Daemon(tmp.name, [f"--memory_size={mem}m", "--ssd_dir="])
        daemon.wait_ready()
        addr = f"unix:{daemon.unix_path}"
    pools, backends, clients = [], [], []
    try:
        admin = kvstash.Client(addr, timeout=60)
        clients.append(admin)
        rows = []

        def raw_row(name, pool, register):
            c = kvstash.Client(addr, timeout=60, auto_register=False)
            clients.append(c)
            buf = c.register_fd(pool.allocator.fds[0]) if register else None
            pieces = raw_pieces(pool, buf)
            names = [f"{h}" for i in range(PAGES) for h in (f"{i}k", f"{i}v")]

            def put(n):
                return all(r == 0 for r in c.batch_put_from(
                    [f"raw{n}_{k}" for k in names], pieces))

            def get(n):
                got = c.batch_get_into([f"raw{n}_{k}" for k in names], pieces)
                return all(g == p[0][2] for g, p in zip(got, pieces))
            rows.append((name, put, get))

        def adapter_row(name, pool):
            b = make_backend(addr, pool)
            backends.append(b)
            idx = pool.page_indices(range(PAGES))

            def put(n):
                return all(b.batch_set_v1([f"a{n}_{i}" for i in range(PAGES)], idx))

            def get(n):
                return all(b.batch_get_v1([f"a{n}_{i}" for i in range(PAGES)], idx))
            rows.append((f"{name} [{b.path}]", put, get))

        sealable = make_pool(a.layers, "shm_sealable")
        sglang_memfd = make_pool(a.layers, "shm")
        anon = make_pool(a.layers, "default")
        pools += [sealable, sglang_memfd, anon]
        raw_row("raw zero-copy (registered memfd)", sealable, True)
        adapter_row("kvstash.sglang, sealable memfd", sealable)
        adapter_row("kvstash.sglang, SGLang alloc_shm memfd", sglang_memfd)
        adapter_row("kvstash.sglang, anonymous memory", anon)
        raw_row("raw staging (anonymous memory)", anon, False)
        results = measure(admin, rows, max(1, a.rounds), deadline, nbytes)
        rows = [(r[0],) + m for r, m in zip(rows, results)]

        base_put, base_get = rows[0][1], rows[0][2]
        print(f"kvstash.sglang bench: {PAGES} pages x {nbytes // PAGES >> 10} KiB "
              f"({a.layers} layers, K+V), {nbytes / 1e6:.0f} MB a batch, medians")
        w = max(len(r[0]) for r in rows)
        print(f"{'path':<{w}}  {'set GB/s':>9} {'vs raw':>7}  {'get GB/s':>9} {'vs raw':>7}"
              f"  ok")
        for name, p, g, ok, _, _ in rows:
            print(f"{name:<{w}}  {p:9.2f} {p / base_put:7.2f}  {g:9.2f} {g / base_get:7.2f}"
                  f"  {'yes' if ok else 'NO'}")
        print("client CPU per batch (the calling thread's, ms, medians)")
        for name, _, _, _, cpp, cpg in rows:
            print(f"  cpu {name:<{w}}  set {cpp:6.2f}  get {cpg:6.2f}")
        return 0 if all(r[3] for r in rows) else 1
    finally:
        for b in backends:
            b.close()
        for c in clients:
            c.close()
        for p in pools:
            p.close()
        if daemon is not None:
            daemon.reap()
            tmp.cleanup()


if __name__ == "__main__":
    sys.exit(main())
