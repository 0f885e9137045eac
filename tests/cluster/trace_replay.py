#!/usr/bin/python3
"""trace_replay: the pooled hit rate against N isolated caches, on Mooncake's synthetic
trace (tests/data/mooncake_synthetic_trace.jsonl.gz), in a simulator (no daemon runs).

N engines each have a sidecar with a cache of C blocks (default 5,859 blocks of 512 tokens:
3M tokens). Request i goes to engine i mod N. Each request is replayed as an engine does:
count the leading blocks that exist (prefix match), read them, write the rest.

- isolated: each sidecar is an LRU of C blocks that only its own engine uses;
- pooled: the same N LRUs of C blocks, but block b lives on its R owners (place_ref.owners,
  the daemon's weighted rendezvous placement, equal weights): a lookup hits when an owner
  has it (touching that copy), a write goes to all R owners. Cache copies a non-owner keeps
  after a remote fetch are left out (they would only raise the pooled rate).

    /usr/bin/python3 tests/cluster/trace_replay.py [--trace PATH] [--capacity C]
        [--nodes 1,2,4,8,16,20] [--replicas 1,2]

Prints one line per N: blocks asked, the hit rate isolated and pooled (for each R), and the
trace's ceiling (an infinite cache, leading blocks only).
"""
import argparse
import collections
import gzip
import json
import os
import sys

sys.path.insert(0, os.path.dirname(__file__))
import place_ref  # noqa: E402

DEFAULT_TRACE = os.path.join(os.path.dirname(__file__), "..", "data",
                             "mooncake_synthetic_trace.jsonl.gz")


class Lru:
    def __init__(self, cap):
        self.cap = cap
        self.d = collections.OrderedDict()

    def has(self, b):
        return b in self.d

    def touch(self, b):
        self.d.move_to_end(b)

    def put(self, b):
        if b in self.d:
            self.d.move_to_end(b)
            return
        self.d[b] = True
        if len(self.d) > self.cap:
            self.d.popitem(last=False)


def load(path):
    with (gzip.open(path, "rt") if path.endswith(".gz") else open(path)) as f:
        return [json.loads(line)["hash_ids"] for line in f if line.strip()]


def leading(blocks, present):
    n = 0
    for b in blocks:
        if not present(b):
            break
        n += 1
    return n


def replay_isolated(reqs, n, cap):
    caches = [Lru(cap) for _ in range(n)]
    hits = 0
    for i, blocks in enumerate(reqs):
        c = caches[i % n]
        h = leading(blocks, c.has)
        hits += h
        for b in blocks:
            c.put(b)
    return hits


def replay_pooled(reqs, n, cap, r):
    caches = [Lru(cap) for _ in range(n)]
    nodes = [("n%d" % k, 1.0) for k in range(n)]
    owners_of = {}

    def owners(b):
        o = owners_of.get(b)
        if o is None:
            o = owners_of[b] = place_ref.owners(nodes, str(b).encode(), r)
        return o

    def present(b):
        return any(caches[o].has(b) for o in owners(b))

    hits = 0
    for blocks in reqs:
        h = leading(blocks, present)
        hits += h
        for b in blocks[:h]:
            for o in owners(b):
                if caches[o].has(b):
                    caches[o].touch(b)
                    break
        for b in blocks[h:]:
            for o in owners(b):
                caches[o].put(b)
    return hits


def ceiling(reqs):
    seen = set()
    hits = 0
    for blocks in reqs:
        hits += leading(blocks, seen.__contains__)
        seen.update(blocks)
    return hits


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--trace", default=os.environ.get("KVSTASH_TRACE", DEFAULT_TRACE))
    ap.add_argument("--capacity", type=int, default=5859)
    ap.add_argument("--nodes", default="1,2,4,8,16,20")
    ap.add_argument("--replicas", default="1,2")
    a = ap.parse_args()
    if not os.path.exists(a.trace):
        print(f"trace_replay: no trace at {a.trace} (--trace PATH)", file=sys.stderr)
        return 2
    reqs = load(a.trace)
    total = sum(len(b) for b in reqs)
    reps = [int(x) for x in a.replicas.split(",")]
    print(f"{len(reqs)} requests, {total} blocks asked; per-node cache {a.capacity} blocks; "
          f"ceiling (infinite cache) {ceiling(reqs) / total:.3f}")
    for n in (int(x) for x in a.nodes.split(",")):
        iso = replay_isolated(reqs, n, a.capacity) / total
        cols = [f"N={n:2d}: isolated {iso:.3f}"]
        for r in reps:
            if r <= n:
                cols.append(f"pooled R={r} {replay_pooled(reqs, n, a.capacity, r) / total:.3f}")
        print(", ".join(cols), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
