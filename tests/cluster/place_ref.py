#!/usr/bin/python3
"""place_ref: a second implementation of kvstash's placement (src/cluster/place.h), written
from the header's specification alone, so the golden vectors of tests/unit/test_place.c are
checked against two independent codings of it.

    /usr/bin/python3 tests/cluster/place_ref.py            # print the golden vectors
    from place_ref import owners                          # owners(nodes, key, r)

nodes: a list of (id, weight); key: bytes. Returns the indices of the owners, best first.
"""
import math
import sys

M64 = (1 << 64) - 1


def fnv1a64(b):
    h = 0xcbf29ce484222325
    for c in b:
        h = ((h ^ c) * 0x100000001b3) & M64
    return h


def fmix64(k):
    k ^= k >> 33
    k = (k * 0xff51afd7ed558ccd) & M64
    k ^= k >> 33
    k = (k * 0xc4ceb9fe1a85ec53) & M64
    k ^= k >> 33
    return k


def place_hash(b):
    return fmix64(fnv1a64(b))


def place_pair(hn, hk):
    return fmix64(hn ^ ((hk * 0x9e3779b97f4a7c15) & M64))


def score(x, weight):
    if not (weight > 0.0) or math.isinf(weight):
        return None
    u = ((x >> 11) + 0.5) / 9007199254740992.0
    return -weight / math.log(u)


def owners(nodes, key, r):
    """Indices into nodes of the min(r, 16, usable) best nodes for key, best first."""
    r = min(r, 16)
    hk = place_hash(key)
    cands = []
    for i, (nid, w) in enumerate(nodes):
        s = score(place_pair(place_hash(nid.encode()), hk), w)
        if s is not None:
            cands.append((-s, nid.encode(), i))
    cands.sort()
    return [i for _, _, i in cands[:r]]


# The vectors tests/unit/test_place.c pins: (nodes, key, r) -> owners.
NODES_EQUAL = [("node-%d" % i, 1.0) for i in range(5)]
NODES_WEIGHTED = [("a", 1.0), ("b", 2.0), ("c", 0.5), ("d", 4.0), ("e", 1.0), ("f", 0.0)]
KEYS = [b"", b"k", b"key-1", b"key-2", bytes(range(32)), b"\xff" * 7, b"prefix/0/1/2"]


def main():
    for name, nodes in (("equal", NODES_EQUAL), ("weighted", NODES_WEIGHTED)):
        for key in KEYS:
            for r in (1, 2, 3):
                print(name, key.hex() or "-", r, ",".join(map(str, owners(nodes, key, r))))
    print("hash", "%016x" % place_hash(b""), "%016x" % place_hash(b"node-0"))
    print("pair", "%016x" % place_pair(place_hash(b"node-0"), place_hash(b"key-1")))
    return 0


if __name__ == "__main__":
    sys.exit(main())
