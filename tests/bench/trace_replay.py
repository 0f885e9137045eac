#!/usr/bin/python3
"""trace_replay: replay a Mooncake-format prefix trace against kvstashd and report its hit
rate next to an exact LRU simulation of the same capacity and the trace's maximum.

Each line of the trace is a JSON request whose `hash_ids` are its prefix blocks in order
(equal ids are the same block). For each request the replay asks `prefix_match` for its
block keys, `batch_get`s the leading blocks that matched, and `batch_put`s the rest, every
block a value of --block-size bytes whose first bytes name its block (so every value read
back is checked). A block counts as a hit when it is one of the request's leading blocks
and `batch_get` returned it byte-exact: the hit rate is hits / blocks asked.

The simulations replay the same operations on block ids: `lru_sim` an exact LRU cache of
--capacity blocks (a hit is touched, oldest first evicted, a block put again while present
but not leading is left where it is, as the daemon answers such a put EXISTS without
touching it) and `max_hit_rate` an infinite cache (the trace's maximum).

Used by tests/bench/trace.sh (make bench) and tests/integration/test_trace.py (make test).
Prints one line of key=value fields; exits 1 on a wrong value or a failed put.
"""
import argparse
import collections
import gzip
import json
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..",
                                "client", "python"))

import kvstash  # noqa: E402  (after the path above)


def open_trace(path):
    """The trace as text lines: a .jsonl file, or gzipped (.gz, as tests/data keeps it)."""
    if path.endswith(".gz"):
        return gzip.open(path, "rt", encoding="utf-8")
    return open(path, encoding="utf-8")


def load_trace(path, limit=0):
    """The requests' hash_ids lists, the first `limit` of them (0: all)."""
    reqs = []
    with open_trace(path) as f:
        for line in f:
            line = line.strip()
            if not line:
                continue
            reqs.append([int(h) for h in json.loads(line)["hash_ids"]])
            if limit and len(reqs) == limit:
                break
    return reqs


def leading(req, present):
    """How many of req's first blocks are all in `present`."""
    k = 0
    while k < len(req) and req[k] in present:
        k += 1
    return k


def max_hit_rate(reqs):
    """Hit rate of an infinite cache: a block hits once any earlier request had it."""
    seen, hits, asked = set(), 0, 0
    for req in reqs:
        hits += leading(req, seen)
        asked += len(req)
        seen.update(req)
    return hits / asked if asked else 0.0


def lru_sim(reqs, capacity):
    """Hit rate of an exact LRU cache of `capacity` blocks under the replay's operations."""
    cache = collections.OrderedDict()
    hits, asked = 0, 0
    for req in reqs:
        k = leading(req, cache)
        for b in req[:k]:
            cache.move_to_end(b)
        for b in req[k:]:
            if b not in cache:
                cache[b] = True
                if len(cache) > capacity:
                    cache.popitem(last=False)
        hits += k
        asked += len(req)
    return hits / asked if asked else 0.0


def block_key(prefix, h):
    return f"{prefix}{h}".encode()


def block_value(h, size):
    head = f"block {h} ".encode()
    return (head * (size // len(head) + 1))[:size]


def replay(client, reqs, size, prefix):
    """Replay reqs through client; returns (hits, asked, wrong, put_failures)."""
    hits = asked = wrong = failed = 0
    for req in reqs:
        keys = [block_key(prefix, h) for h in req]
        k = client.prefix_match(keys)
        got = client.batch_get(keys[:k]) if k else []
        n = 0
        while n < len(got) and got[n] is not None:
            if bytes(got[n]) != block_value(req[n], size):
                wrong += 1
                break
            n += 1
        hits += n
        asked += len(req)
        rest = req[n:]
        if rest:
            codes = client.batch_put([block_key(prefix, h) for h in rest],
                                     [block_value(h, size) for h in rest])
            failed += sum(1 for c in codes if c not in (0, 2))  # OK, EXISTS
    return hits, asked, wrong, failed


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--addr", required=True, help="host:port or a Unix socket path")
    ap.add_argument("--trace", required=True)
    ap.add_argument("--limit", type=int, default=0, help="first N requests (0: all)")
    ap.add_argument("--block-size", type=int, default=16384)
    ap.add_argument("--capacity", type=int, required=True,
                    help="blocks the LRU simulation holds (the daemon's capacity)")
    ap.add_argument("--prefix", default="trace:", help="key prefix of the blocks")
    ap.add_argument("--label", default="replay")
    a = ap.parse_args()

    reqs = load_trace(a.trace, a.limit)
    t0 = time.monotonic()
    with kvstash.Client(a.addr) as c:
        hits, asked, wrong, failed = replay(c, reqs, a.block_size, a.prefix)
        st = c.stats()
    secs = time.monotonic() - t0
    rate = hits / asked if asked else 0.0
    lru = lru_sim(reqs, a.capacity)
    best = max_hit_rate(reqs)
    print(f"TRACE label={a.label} requests={len(reqs)} blocks={asked} hits={hits}"
          f" hit_rate={rate:.4f} lru_sim={lru:.4f} max={best:.4f}"
          f" vs_lru={rate / lru if lru else 0:.3f} vs_max={rate / best if best else 0:.3f}"
          f" objects={st.get('objects', 0)} dram_objects={st.get('dram_objects', 0)}"
          f" evictions={st.get('evictions', 0)} wrong={wrong} put_failed={failed}"
          f" secs={secs:.1f}", flush=True)
    return 1 if wrong or failed else 0


if __name__ == "__main__":
    sys.exit(main())
