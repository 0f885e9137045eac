"""Reads of the pool's shared-memory and direct-access paths (docs/cluster.md, "Reads"):
3 daemons with a fixed view (KVSTASH_TEST_VIEW), R = 2, every value checked against a
table of SHA-256 digests, every wait bounded.

  - batch_get_into on a node that neither owns nor wrote the keys: the local misses are
    fetched from their owners and written into the caller's registered memfd, byte-exact,
    and kept (the next batch_get_into is local); a key no owner has is -1 NOT_FOUND.
"""

import hashlib
import mmap
import os
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "integration"))
sys.path.insert(0, HERE)

from clusterlib import register_memfd, wait_until  # noqa: E402
from test_data_paths import values  # noqa: E402

pytestmark = pytest.mark.quick


def test_batch_get_into_fetches_a_local_miss_from_the_owners(fixed_pool):
    p = fixed_pool(unix=True)
    vals = values(24, size=30000, tag=b"into")
    digest = {k: hashlib.sha256(v).digest() for k, v in vals.items()}
    c0 = p.daemons[0].tcp()
    assert c0.call("batch_put", list(vals), list(vals.values())) == [0] * len(vals)
    far = [k for k in vals if 2 not in p.owners(k)]
    assert len(far) >= 3, "placement left node 2 out of fewer than 3 keys of 24"
    for k in far:
        wait_until(lambda k=k: all(p.has(i, [k])[0] for i in p.owners(k)), "the owners' copies")
    assert not any(p.has(2, far))

    keys = far + [b"absent-everywhere"]
    size = sum(len(vals[k]) for k in far) + 4096
    c2 = p.daemons[2].unix()
    fd, buf = register_memfd(c2, size)
    try:
        pieces, off = [], 0
        for k in keys:
            n = len(vals[k]) if k in vals else 4096
            pieces.append([[buf, off, n]])
            off += n
        got = c2.call("batch_get_into", keys, pieces)
        assert got == [len(vals[k]) for k in far] + [-1]
        with mmap.mmap(fd, size) as mm:
            off = 0
            for k in far:
                assert hashlib.sha256(mm[off:off + len(vals[k])]).digest() == digest[k], k
                off += len(vals[k])
            mm[:] = b"\0" * size
        hits = p.metric(2, "kvstash_cluster_remote_hits_total")
        assert hits == len(far)
        # kept here: the second read is local (no more remote hits), byte-exact again
        assert all(p.has(2, far))
        assert c2.call("batch_get_into", keys, pieces) == got
        with mmap.mmap(fd, size) as mm:
            off = 0
            for k in far:
                assert hashlib.sha256(mm[off:off + len(vals[k])]).digest() == digest[k], k
                off += len(vals[k])
        assert p.metric(2, "kvstash_cluster_remote_hits_total") == hits
    finally:
        os.close(fd)


def test_get_replica_list_names_every_owner_of_each_key(fixed_pool):
    p = fixed_pool(unix=True)
    vals = values(12, size=9000, tag=b"repl")
    c0 = p.daemons[0].tcp()
    assert c0.call("batch_put", list(vals), list(vals.values())) == [0] * len(vals)
    mine = [k for k in vals if 2 in p.owners(k)]
    far = [k for k in vals if 2 not in p.owners(k)]
    assert mine and far, "placement gave node 2 all or none of 12 keys"
    keys = [mine[0], far[0], b"absent-everywhere"]
    c2 = p.daemons[2].unix()

    # without opts: this node's copies only, as on a single node
    plain = c2.call("get_replica_list", keys)
    assert plain[0]["size"] == len(vals[mine[0]]) and plain[0]["transport"] == "shm"
    assert plain[1] is None and plain[2] is None

    got = c2.call("get_replica_list", keys, {"replicas": True})
    for k, entry in zip(keys, got):
        want = [{"node": p.ids[i], "addr": f"127.0.0.1:{p.ports[i]}", "tls": "",
                 "self": i == 2} for i in p.owners(k)]
        assert entry["replicas"] == want, (k, entry["replicas"])
    assert got[0]["local"]["size"] == len(vals[mine[0]])
    assert sum(n for _, _, n in got[0]["local"]["pieces"]) == len(vals[mine[0]])
    assert got[1]["local"] is None and got[2]["local"] is None
    # each owner named answers for its own copy on its own socket
    for r in got[1]["replicas"]:
        i = p.ids.index(r["node"])
        ci = p.daemons[i].unix()
        entry = ci.call("get_replica_list", [far[0]])[0]
        assert entry is not None and entry["size"] == len(vals[far[0]]), r
