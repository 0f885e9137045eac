"""Integration: a damaged SSD tier never keeps kvstashd from serving.

Each test fills an SSD tier through a plain msgpack-rpc client (write_through, so every
object has a record in a bucket file and an index entry), stops the daemon, damages the
tier as a disk fault or a bad restore would (the LMDB index's meta pages zeroed, its pages
overwritten, data.mdb cut short, a bucket file cut short, garbage after a bucket's records,
a bucket file gone, a stale LOCK and lock.mdb, ssd_dir not a directory), and starts it
again. The daemon must start, answer DRAM requests at once, report the tier as loading
while it rebuilds (stats ssd_state: 1 loading, 2 ready) and then serve every record that
survived the damage byte-exact, checked against a table of digests; a record that did not
survive is a miss, never wrong bytes. Every wait is bounded.
"""

import glob
import hashlib
import os
import random

from kvtest import wait_for
from test_ssd import (bucket_files, flip_byte, kv, put_digests,  # noqa: F401 (kv: a fixture)
                      served_digests, walk_records)

KIB = 1 << 10
ARGS = ("--memory_size=16m", "--ssd_bucket_size=2m", "--ssd_offload=write_through")
N = 48
LOADING, READY = 1, 2


def value_for(key):
    r = random.Random(key)
    return r.randbytes(r.choice((3 * KIB, 20 * KIB, 64 * KIB, 100 * KIB)))


def fill(kv, data):
    """A tier of N objects on SSD, the daemon stopped cleanly. Returns {key: sha256}."""
    d = kv(data, *ARGS)
    c = d.client()
    table = put_digests(c, [f"obj-{i:03d}".encode() for i in range(N)], value_for)
    wait_for(lambda: c.call("stats")["ssd_objects"] == N, 20, "every object on the SSD tier")
    d.stop()
    return table


def restart(kv, data, extra=()):
    """Start on the damaged tier; DRAM must serve at once; wait for the tier to be ready."""
    d = kv(data, *ARGS, *extra)
    c = d.client()
    s = c.call("stats")
    assert s["ssd_state"] in (LOADING, READY), s
    fresh = f"fresh-{d.pid}".encode()
    assert c.call("put", fresh, b"x" * 5000) == 0          # DRAM serves while it loads
    assert c.call("get", fresh) == b"x" * 5000
    wait_for(lambda: c.call("stats")["ssd_state"] == READY, 30, "the SSD tier to be ready")
    return d, c


def check(c, table):
    """Every key: a miss or its exact bytes. Returns the keys served."""
    served = served_digests(c, table)
    s = c.call("stats")
    assert s["ssd_checksum_errors"] == 0, s
    return served


def ssd_dir(data):
    return os.path.join(data, "ssd")


def data_mdb(data):
    return os.path.join(ssd_dir(data), "index", "data.mdb")


def keys_of(path):
    return {k for k, _, _ in walk_records(path)}


def drop_summaries(data):
    """Remove the bucket summaries, so that a rebuild reads every bucket whole (the walk these
    tests check; test_ssd_summary.py covers the rebuild from summaries)."""
    for path in glob.glob(os.path.join(ssd_dir(data), "bucket-*.kvh")):
        os.unlink(path)


def biggest_bucket(data):
    return max(bucket_files(ssd_dir(data)), key=lambda p: len(keys_of(p)))


def assert_rebuilt(d, data):
    out = d.output()
    assert "rebuilt in" in out, out
    assert glob.glob(os.path.join(ssd_dir(data), "index.broken-*")) or "missing" in out, out


def test_zeroed_meta_pages_rebuild_everything(work, kv):
    data = os.path.join(work, "data")
    table = fill(kv, data)
    with open(data_mdb(data), "r+b") as f:
        f.write(bytes(2 * 4096))
    d, c = restart(kv, data)
    assert check(c, table) == set(table)
    assert_rebuilt(d, data)
    assert c.call("stats")["ssd_rebuilds"] == 1
    # the rebuilt index is whole: a plain restart loads it without another rebuild
    d.stop()
    d, c = restart(kv, data)
    assert "rebuilding" not in d.output()
    assert check(c, table) == set(table)


def test_overwritten_pages_rebuild_everything(work, kv):
    data = os.path.join(work, "data")
    table = fill(kv, data)
    size = os.path.getsize(data_mdb(data))
    rnd = random.Random(7)
    with open(data_mdb(data), "r+b") as f:
        for page in range(2, size // 4096):
            f.seek(page * 4096)
            f.write(rnd.randbytes(4096))
    d, c = restart(kv, data)
    assert check(c, table) == set(table)
    assert_rebuilt(d, data)


def test_a_few_overwritten_pages_never_serve_wrong_bytes(work, kv):
    data = os.path.join(work, "data")
    table = fill(kv, data)
    size = os.path.getsize(data_mdb(data))
    for seed in range(3):
        rnd = random.Random(seed)
        with open(data_mdb(data), "r+b") as f:
            for page in rnd.sample(range(2, size // 4096), min(3, size // 4096 - 2)):
                f.seek(page * 4096)
                f.write(rnd.randbytes(4096))
        d, c = restart(kv, data)
        check(c, table)
        d.stop()


def marker(data):
    return os.path.join(ssd_dir(data), "index", "clean_shutdown")


def test_clean_stop_spares_the_next_start_the_full_check(work, kv):
    """A clean stop leaves the marker; the next start finds data.mdb as it was left, skips
    the walk in a separate process, removes the marker at once and serves everything."""
    data = os.path.join(work, "data")
    table = fill(kv, data)
    assert os.path.exists(marker(data))
    d, c = restart(kv, data)
    assert not os.path.exists(marker(data))        # removed at open: a crash leaves none
    out = d.output()
    assert "the full index check is skipped" in out, out
    assert "checked in full" not in out, out
    assert check(c, table) == set(table)


def test_kill9_keeps_the_full_check(work, kv):
    """A kill leaves no marker: the next start checks the whole index, which passes."""
    data = os.path.join(work, "data")
    table = fill(kv, data)
    d, c = restart(kv, data)
    assert c.call("put", b"late", b"z" * 7000) == 0
    table[b"late"] = hashlib.sha256(b"z" * 7000).hexdigest()
    # N, restart's fresh object, and this one
    wait_for(lambda: c.call("stats")["ssd_objects"] == N + 2, 20, "the late object on SSD")
    d.kill9()
    assert not os.path.exists(marker(data))
    d, c = restart(kv, data)
    out = d.output()
    assert "no clean-shutdown marker" in out, out
    assert "the full index check passed" in out, out
    assert check(c, table) == set(table)


def test_zeroed_meta_page_after_a_clean_stop_is_rebuilt(work, kv):
    """The marker does not vouch for a data.mdb changed after the stop: one meta page
    zeroed (either of the two) is seen, checked in full, and the index rebuilt."""
    for page in (0, 1):
        data = os.path.join(work, f"data{page}")
        table = fill(kv, data)
        assert os.path.exists(marker(data))
        with open(data_mdb(data), "r+b") as f:
            f.seek(page * 4096)
            f.write(bytes(4096))
        d, c = restart(kv, data)
        out = d.output()
        assert "changed since the clean shutdown" in out, out
        assert_rebuilt(d, data)
        assert check(c, table) == set(table)
        d.stop()


def test_truncated_data_mdb_rebuilds_everything(work, kv):
    data = os.path.join(work, "data")
    table = fill(kv, data)
    os.truncate(data_mdb(data), os.path.getsize(data_mdb(data)) // 3 // 4096 * 4096)
    d, c = restart(kv, data)
    assert check(c, table) == set(table)
    assert_rebuilt(d, data)


def test_index_deleted_rebuilds_everything(work, kv):
    data = os.path.join(work, "data")
    table = fill(kv, data)
    for p in glob.glob(os.path.join(ssd_dir(data), "index", "*")):
        os.unlink(p)
    d, c = restart(kv, data)
    assert check(c, table) == set(table)
    assert "rebuilt in" in d.output()


def cut_bucket(data):
    """Cut the bucket with most records to 60%; returns the keys wholly before the cut."""
    path = biggest_bucket(data)
    cut = os.path.getsize(path) * 6 // 10
    before = {k for k, off, n in walk_records(path) if off + n <= cut}
    lost = keys_of(path) - before
    assert before and lost
    os.truncate(path, cut)
    return before, lost


def test_truncated_bucket_keeps_records_before_the_cut(work, kv):
    data = os.path.join(work, "data")
    table = fill(kv, data)
    before, lost = cut_bucket(data)
    d, c = restart(kv, data)
    served = check(c, table)
    assert served == set(table) - lost, (sorted(lost - set()), sorted(set(table) - served))
    assert before <= served


def test_truncated_bucket_without_index_keeps_records_before_the_cut(work, kv):
    data = os.path.join(work, "data")
    table = fill(kv, data)
    before, lost = cut_bucket(data)
    with open(data_mdb(data), "r+b") as f:
        f.write(bytes(2 * 4096))
    d, c = restart(kv, data)
    assert check(c, table) == set(table) - lost
    assert_rebuilt(d, data)


def test_garbage_appended_to_a_bucket(work, kv):
    data = os.path.join(work, "data")
    table = fill(kv, data)
    path = biggest_bucket(data)
    with open(path, "ab") as f:
        f.write(random.Random(3).randbytes(3 * 4096 + 100))
    d, c = restart(kv, data)
    assert check(c, table) == set(table)
    d.stop()
    # and when the index has to be rebuilt from that bucket
    with open(path, "ab") as f:
        f.write(random.Random(4).randbytes(2 * 4096))
    with open(data_mdb(data), "r+b") as f:
        f.write(bytes(2 * 4096))
    d, c = restart(kv, data)
    assert check(c, table) == set(table)


def test_damaged_header_mid_bucket_keeps_records_before_it(work, kv):
    data = os.path.join(work, "data")
    table = fill(kv, data)
    path = biggest_bucket(data)
    recs = list(walk_records(path))
    victim = len(recs) // 2
    key, voff, _ = recs[victim]
    hdr_off = voff - ((48 + len(key) + 4095) // 4096 * 4096)
    with open(path, "r+b") as f:
        f.seek(hdr_off + 20)
        f.write(b"\xff\xff\xff\xff")
    drop_summaries(data)
    with open(data_mdb(data), "r+b") as f:
        f.write(bytes(2 * 4096))
    d, c = restart(kv, data)
    served = check(c, table)
    kept = {k for k, _, _ in recs[:victim]}
    assert served == set(table) - {k for k, _, _ in recs[victim:]}
    assert kept <= served


def test_bucket_missing(work, kv):
    data = os.path.join(work, "data")
    table = fill(kv, data)
    path = biggest_bucket(data)
    gone = keys_of(path)
    os.unlink(path)
    d, c = restart(kv, data)
    assert check(c, table) == set(table) - gone
    d.stop()
    # the same without an index
    with open(data_mdb(data), "r+b") as f:
        f.write(bytes(2 * 4096))
    d, c = restart(kv, data)
    assert check(c, table) == set(table) - gone


def test_stale_lock_files(work, kv):
    data = os.path.join(work, "data")
    table = fill(kv, data)
    with open(os.path.join(ssd_dir(data), "LOCK"), "w") as f:
        f.write("999999999\n")          # a pid that is not running
    with open(os.path.join(ssd_dir(data), "index", "lock.mdb"), "wb") as f:
        f.write(random.Random(5).randbytes(8192))
    d, c = restart(kv, data)
    assert check(c, table) == set(table)
    assert "rebuild" not in d.output()


def test_ssd_dir_not_a_directory_starts_empty(work, kv):
    data = os.path.join(work, "data")
    table = fill(kv, data)
    os.rename(ssd_dir(data), ssd_dir(data) + ".old")
    with open(ssd_dir(data), "wb") as f:
        f.write(b"not a directory")
    d, c = restart(kv, data)
    assert check(c, table) == set()
    assert glob.glob(ssd_dir(data) + ".broken-*"), os.listdir(data)
    assert os.path.isdir(ssd_dir(data))
    assert "moved aside" in d.output()
    # the new tier works
    assert c.call("put", b"after", b"y" * 9000) == 0
    wait_for(lambda: c.call("stats")["ssd_objects"] >= 2, 20, "the new tier to take writes")


def expected_after_rebuild(data, bad_values):
    """What a rebuild must index, read from the bucket files themselves: walked oldest
    first, each up to its first record that is not whole, every record but those whose
    value was damaged (bad_values: {(path, value_offset)}), the newest record of a key
    winning. Returns ({key: sha256 of the value bytes in the file}, records verified)."""
    table, records = {}, 0
    for path in bucket_files(ssd_dir(data)):
        size = os.path.getsize(path)
        with open(path, "rb") as f:
            for key, voff, vlen in walk_records(path):
                if voff + vlen > size:
                    break                               # cut here: this and the rest go
                if (path, voff) in bad_values:
                    continue
                f.seek(voff)
                table[key] = hashlib.sha256(f.read(vlen)).hexdigest()
                records += 1
    return table, records


def test_parallel_rebuild_indexes_exactly_the_records_of_the_buckets(work, kv):
    """Many buckets, keys written again in later buckets, a bucket cut short, a value
    damaged in another, the index zeroed: the rebuild (scanner threads reading buckets
    at once, one thread indexing them in order) serves exactly the newest whole verified
    record of every key, byte-exact, and nothing else."""
    data = os.path.join(work, "data")
    small = ("--ssd_bucket_size=1m",)
    d = kv(data, *ARGS, *small)
    c = d.client()
    rnd = random.Random(19)
    keys = [f"many-{i:04d}".encode() for i in range(500)]
    for key in keys:
        assert c.call("put", key, rnd.randbytes(rnd.choice((3 * KIB, 9 * KIB, 20 * KIB)))) == 0
    for key in keys[::5]:                                   # a newer record, a later bucket
        assert c.call("remove", key) in (0, True)
        assert c.call("put", key, rnd.randbytes(5 * KIB)) == 0
    n = len(keys) + len(keys[::5])
    wait_for(lambda: c.call("stats")["ssd_writes"] >= n, 30, "every record on the SSD tier")
    d.stop()
    buckets = bucket_files(ssd_dir(data))
    assert len(buckets) >= 6, buckets                       # more buckets than scanners
    # a bucket in the middle cut inside a record; a value damaged in a later one
    cut_path = buckets[len(buckets) // 2]
    recs = list(walk_records(cut_path))
    key, voff, vlen = recs[len(recs) // 2]
    os.truncate(cut_path, voff + vlen // 2)
    bad_path = buckets[-2]
    key, voff, vlen = list(walk_records(bad_path))[1]
    flip_byte(bad_path, voff + vlen // 3, 0x40)
    drop_summaries(data)
    expected, records = expected_after_rebuild(data, {(bad_path, voff)})
    assert len(expected) < len(keys)                        # the damage cost some keys
    with open(data_mdb(data), "r+b") as f:
        f.write(bytes(2 * 4096))
    d, c = restart(kv, data, small)
    assert_rebuilt(d, data)
    for key in keys:
        got = c.call("get", key)
        if key in expected:
            assert got is not None, f"{key}: lost"
            assert hashlib.sha256(got).hexdigest() == expected[key], f"{key}: not its newest record"
        else:
            assert got is None, f"{key}: served, but no whole record of it survived"
    s = c.call("stats")
    assert s["ssd_checksum_errors"] == 0, s
    assert s["ssd_rebuild_records"] == records, s
