"""Integration: bucket summaries (bucket-<id>.kvh) and the rebuild and scrub that use them.

A tier is filled through write_through with small buckets, so that several are sealed and
get a summary, then stopped; the LMDB index is zeroed (a rebuild must follow) and the daemon
started again. A rebuild takes a sealed bucket's entries from its summary without reading its
values, reads whole the buckets without one (the open bucket, a summary deleted or damaged,
one that covers past a cut), and a scrub then checks the summarized buckets' values in the
background. Every value served is checked against a table of digests: a record whose value
was damaged is a miss, never wrong bytes. Every wait is bounded.
"""

import glob
import os
import random

from kvtest import wait_for
from test_ssd import (bucket_files, flip_byte, kv, put_digests,  # noqa: F401 (kv: a fixture)
                      served_digests, walk_records)

KIB = 1 << 10
ARGS = ("--memory_size=16m", "--ssd_bucket_size=1m", "--ssd_offload=write_through")
N = 320
LOADING, READY = 1, 2


def value_for(key):
    r = random.Random(key)
    return r.randbytes(r.choice((3 * KIB, 12 * KIB, 20 * KIB)))


def ssd_dir(data):
    return os.path.join(data, "ssd")


def summary_of(bucket):
    return bucket[:-len(".kvb")] + ".kvh"


def summaries(data):
    return sorted(glob.glob(os.path.join(ssd_dir(data), "bucket-*.kvh")))


def summarized_buckets(data):
    return [b for b in bucket_files(ssd_dir(data)) if os.path.exists(summary_of(b))]


def fill(kv, data, extra=()):
    """N objects on SSD, the daemon stopped cleanly. Returns {key: sha256}."""
    d = kv(data, *ARGS, *extra)
    c = d.client()
    table = put_digests(c, [f"sum-{i:03d}".encode() for i in range(N)], value_for)
    wait_for(lambda: c.call("stats")["ssd_objects"] == N, 30, "every object on the SSD tier")
    d.stop()
    buckets = bucket_files(ssd_dir(data))
    assert len(summaries(data)) >= 4, (buckets, summaries(data))
    assert len(summaries(data)) < len(buckets)      # the bucket open at the stop has none
    return table


def zero_index(data):
    with open(os.path.join(ssd_dir(data), "index", "data.mdb"), "r+b") as f:
        f.write(bytes(2 * 4096))


def restart(kv, data, extra=()):
    d = kv(data, *ARGS, *extra)
    c = d.client()
    assert c.call("stats")["ssd_state"] in (LOADING, READY)
    wait_for(lambda: c.call("stats")["ssd_state"] == READY, 30, "the SSD tier to be ready")
    return d, c


def wait_scrub(c):
    def done():
        s = c.call("stats")
        return s if s["ssd_scrub_buckets_done"] == s["ssd_scrub_buckets"] else None
    return wait_for(done, 60, "the scrub to finish")


def test_zeroed_index_is_rebuilt_from_the_summaries(work, kv):
    data = os.path.join(work, "data")
    table = fill(kv, data)
    nsum = len(summaries(data))
    nbuckets = len(bucket_files(ssd_dir(data)))
    zero_index(data)
    d, c = restart(kv, data)
    s = wait_scrub(c)
    assert served_digests(c, table) == set(table)
    assert s["ssd_rebuild_summary_buckets"] == nsum, s
    assert s["ssd_rebuild_scanned_buckets"] == nbuckets - nsum, s
    assert s["ssd_scrub_buckets"] == nsum and s["ssd_scrub_bad"] == 0, s
    assert s["ssd_checksum_errors"] == 0, s
    out = d.output()
    assert f"{nsum} from their summaries" in out, out
    assert "scrub of" in out and "done in" in out, out
    # the rebuilt index is whole and the summaries stay: a plain restart needs neither
    d.stop()
    assert len(summaries(data)) == nsum
    d, c = restart(kv, data)
    assert "rebuilding" not in d.output()
    assert served_digests(c, table) == set(table)


def damage_a_summarized_value(data):
    """Flip a byte in the value of a record of a summarized bucket; returns its key."""
    bucket = summarized_buckets(data)[1]
    key, voff, vlen = list(walk_records(bucket))[2]
    flip_byte(bucket, voff + vlen // 2, 0x10)
    return key


def test_a_damaged_value_is_a_miss_before_the_scrub(work, kv):
    data = os.path.join(work, "data")
    table = fill(kv, data)
    bad = damage_a_summarized_value(data)
    zero_index(data)
    d, c = restart(kv, data, ("--ssd_scrub_rate=0",))
    assert c.call("get", bad) is None                       # never the wrong bytes
    s = c.call("stats")
    assert s["ssd_checksum_errors"] == 1, s
    assert s["ssd_scrub_buckets_done"] == 0 and s["ssd_scrub_bad"] == 0, s
    assert served_digests(c, table) == set(table) - {bad}
    assert "not scrubbed" in d.output()


def test_the_scrub_drops_a_damaged_value(work, kv):
    data = os.path.join(work, "data")
    table = fill(kv, data)
    bad = damage_a_summarized_value(data)
    zero_index(data)
    d, c = restart(kv, data)
    s = wait_scrub(c)
    assert s["ssd_scrub_bad"] == 1, s
    wait_for(lambda: c.call("stats")["ssd_objects"] == N - 1, 20, "the entry dropped")
    assert c.call("get", bad) is None
    s = c.call("stats")
    assert s["ssd_checksum_errors"] == 0, s                 # the scrub got there first
    assert served_digests(c, table) == set(table) - {bad}
    assert "1 values failed their checksum (1 entries dropped" in d.output()
    # dropped from the index too: a clean restart does not bring it back
    d.stop()
    d, c = restart(kv, data)
    assert c.call("get", bad) is None
    assert c.call("stats")["ssd_objects"] == N - 1


def test_a_summary_damaged_or_deleted_means_that_bucket_is_read_whole(work, kv):
    data = os.path.join(work, "data")
    table = fill(kv, data)
    sums = summaries(data)
    nsum = len(sums)
    flip_byte(sums[0], os.path.getsize(sums[0]) // 2, 0x01)   # inside an entry: CRC fails
    os.unlink(sums[1])
    with open(sums[2], "r+b") as f:                           # cut short
        f.truncate(os.path.getsize(sums[2]) - 7)
    zero_index(data)
    d, c = restart(kv, data)
    s = wait_scrub(c)
    assert served_digests(c, table) == set(table)
    assert s["ssd_rebuild_summary_buckets"] == nsum - 3, s
    assert s["ssd_scrub_buckets"] == nsum - 3, s
    out = d.output()
    assert out.count("its summary is not used") == 2, out
    assert "its checksum does not match" in out, out
    assert not os.path.exists(sums[0]) and not os.path.exists(sums[2])   # refused: removed


def test_a_cut_bucket_keeps_the_records_before_the_cut(work, kv):
    data = os.path.join(work, "data")
    table = fill(kv, data)
    bucket = summarized_buckets(data)[0]
    cut = os.path.getsize(bucket) * 6 // 10
    recs = list(walk_records(bucket))
    before = {k for k, off, n in recs if off + n <= cut}
    lost = {k for k, _, _ in recs} - before
    assert before and lost
    os.truncate(bucket, cut)
    zero_index(data)
    d, c = restart(kv, data)
    wait_scrub(c)
    assert served_digests(c, table) == set(table) - lost
    assert "covers past the end of the bucket file" in d.output()
    assert c.call("stats")["ssd_checksum_errors"] == 0


def test_summaries_go_with_their_buckets(work, kv):
    """Eviction drops buckets: their summaries go too, and the others stay."""
    data = os.path.join(work, "data")
    d = kv(data, "--memory_size=4m", "--ssd_size=8m", "--ssd_bucket_size=1m",
           "--ssd_offload=write_through")
    c = d.client()
    rnd = random.Random(5)
    for i in range(48):                                     # 12 MiB of records
        assert c.call("put", f"ev-{i:03d}".encode(), rnd.randbytes(252 * KIB)) == 0
    wait_for(lambda: c.call("stats")["ssd_evicted_buckets"] >= 2, 30, "buckets evicted")
    d.stop()
    kvb = {b[:-4] for b in bucket_files(ssd_dir(data))}
    kvh = {h[:-4] for h in summaries(data)}
    assert kvh and kvh <= kvb, (kvh, kvb)
    assert len(kvh) >= len(kvb) - 1                         # all but the open one
    assert not glob.glob(os.path.join(ssd_dir(data), "*.tmp"))


def test_files_of_no_bucket_in_the_index_are_removed_at_start(work, kv):
    """A bucket file the index does not know, a summary whose bucket is gone and a summary
    never finished (.kvh.tmp) are removed at start, each saying why; the rest is served."""
    data = os.path.join(work, "data")
    table = fill(kv, data)
    sdir = ssd_dir(data)
    stray_kvb = os.path.join(sdir, "bucket-00000000000fffff.kvb")
    stray_kvh = os.path.join(sdir, "bucket-00000000000ffffe.kvh")
    stray_tmp = summary_of(summarized_buckets(data)[0]) + ".tmp"
    other = os.path.join(sdir, "bucket-00000000000ffffd.keep")
    nsum = len(summaries(data))
    for p in (stray_kvb, stray_kvh, stray_tmp, other):
        with open(p, "wb") as f:
            f.write(b"x" * 100)
    d, c = restart(kv, data)
    out = d.output()
    assert f"removing {stray_kvb} (not in the index)" in out, out
    assert f"removing {stray_kvh} (its bucket file is gone)" in out, out
    assert f"removing {stray_tmp} (a summary never finished)" in out, out
    assert not any(os.path.exists(p) for p in (stray_kvb, stray_kvh, stray_tmp))
    assert os.path.exists(other), "a file of another kind is left alone"
    assert len(summaries(data)) == nsum, "the real summaries stay"
    assert served_digests(c, table) == set(table)
