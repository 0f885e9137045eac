"""Integration: kvstashd's SSD tier, seen from a plain msgpack-rpc client.

Every test starts the real daemon ($KVSTASHD, default build/release/kvstashd)
on an ephemeral loopback port with its own temporary data_dir, and checks
what a user of the cache relies on: objects that leave DRAM come back
byte-exact from the SSD tier, survive restarts (clean and kill -9), durable
puts mean what they say, bucket eviction follows the configured policy and
bounds the disk, corrupt records are misses (never wrong bytes), a full
disk degrades the tier without stopping the daemon, and one ssd_dir has one
daemon. Only Debian's python3-msgpack, pytest and the standard library are
used. Every wait is bounded in time and every loop in count.
"""

import collections
import errno
import hashlib
import os
import random
import signal
import struct
import subprocess
import threading
import time

import pytest

from kvtest import Client, wait_for

KIB = 1 << 10
MIB = 1 << 20

NO_SPACE = 4
UNSUPPORTED = 15

REC_ALIGN = 4096
REC_HDR = struct.Struct("<4sHHIIQQIIQ")   # the 48-byte record header
assert REC_HDR.size == 48


def value_for(key, size):
    """Deterministic contents derived from the key, so any value read back can be checked."""
    return random.Random(key).randbytes(size)


def align(n):
    return (n + REC_ALIGN - 1) // REC_ALIGN * REC_ALIGN


def bucket_files(ssd_dir):
    return sorted(os.path.join(ssd_dir, n) for n in os.listdir(ssd_dir)
                  if n.startswith("bucket-") and n.endswith(".kvb"))


def bucket_bytes(ssd_dir):
    total = 0
    for p in bucket_files(ssd_dir):
        try:
            total += os.path.getsize(p)
        except FileNotFoundError:   # dropped while we looked
            pass
    return total


def flip_byte(path, pos, mask):
    """XOR the byte at pos of the file at path with mask, synced: a one-byte disk fault."""
    with open(path, "r+b") as f:
        f.seek(pos)
        b = f.read(1)
        f.seek(pos)
        f.write(bytes([b[0] ^ mask]))
        f.flush()
        os.fsync(f.fileno())


def walk_records(path):
    """Yield (key, value_offset, value_len) for every record of a bucket file."""
    with open(path, "rb") as f:
        data = f.read()
    off = 0
    while off + REC_HDR.size <= len(data):
        (magic, version, flags, tenant, key_len, value_len, seq, value_crc, hdr_crc,
         reserved) = REC_HDR.unpack_from(data, off)
        if magic != b"KVSR":
            break
        key = data[off + REC_HDR.size: off + REC_HDR.size + key_len]
        hdr_block = align(REC_HDR.size + key_len)
        yield key, off + hdr_block, value_len
        off += hdr_block + align(value_len)


def put_digests(c, keys, value_for):
    """Put value_for(key) under each key (answered 0); returns {key: sha256 of its value}."""
    table = {}
    for key in keys:
        v = value_for(key)
        assert c.call("put", key, v) == 0
        table[key] = hashlib.sha256(v).hexdigest()
    return table


def served_digests(c, table):
    """Every key of {key: sha256}: a miss or its exact bytes. Returns the keys served."""
    served = set()
    for key, digest in table.items():
        got = c.call("get", key)
        if got is not None:
            assert hashlib.sha256(got).hexdigest() == digest, f"{key}: wrong bytes"
            served.add(key)
    return served


@pytest.fixture
def kv(daemons):
    """kv(data_dir, *args, ready=True) starts a daemon; every one is killed at teardown."""
    return lambda data_dir, *args, ready=True: daemons(args, data_dir=data_dir, unix=False,
                                                        ready=ready)


def stats(c):
    return c.call("stats")


def wait_offload_idle(c, timeout=20.0):
    """Until the SSD writer has nothing queued (write-through / on-evict work is done)."""
    def idle():
        s = stats(c)
        return s if s["ssd_offload_queue"] == 0 and s.get("offloading", 0) == 0 else None
    return wait_for(idle, timeout, "the SSD offload queue to drain")


# ---------------------------------------------------------------------------------------
# 1. More data than DRAM: everything comes back from the SSD tier, also after a restart.


def test_objects_beyond_dram_come_back_from_ssd_and_survive_restart(work, kv):
    data = os.path.join(work, "data")
    args = ("--memory_size=16m", "--ssd_bucket_size=16m")
    big = [(f"big-{i:03d}".encode(), MIB) for i in range(96)]
    small = [(f"small-{i:03d}".encode(), 64 * KIB) for i in range(64)]
    objs, j = [], 0
    for i in range(96):         # interleave the sizes: two small ones every three big ones
        objs.append(big[i])
        while j < len(small) and j * len(big) < (i + 1) * len(small):
            objs.append(small[j])
            j += 1
    assert len(objs) == 160 and len({k for k, _ in objs}) == 160

    d = kv(data, *args)
    c = d.client()
    for key, size in objs:
        assert c.call("put", key, value_for(key, size)) == 0, key
    s = stats(c)
    assert s["objects"] == len(objs)
    assert s["dram_objects"] < s["objects"], s

    for key, size in objs:
        got = c.call("get", key)
        assert got is not None, f"{key} is missing"
        assert len(got) == size and got == value_for(key, size), f"{key}: wrong bytes"
    s = stats(c)
    assert s["objects"] == len(objs)
    assert s["dram_objects"] < s["objects"], s
    # 16 MiB of DRAM holds at most 16 of the 96 MiB objects: the rest came from the SSD.
    assert s["ssd_hits"] >= 80, f"only {s['ssd_hits']} reads served from the SSD tier"
    assert s["ssd_reads"] >= s["ssd_hits"]
    assert s["ssd_checksum_errors"] == 0 and s["ssd_io_errors"] == 0

    # Everything has a copy on the SSD before the clean stop.
    wait_for(lambda: stats(c)["ssd_objects"] == len(objs), 15,
             f"all {len(objs)} objects to be on the SSD tier")
    d.stop()

    d = kv(data, *args)
    c = d.client()
    s0 = stats(c)
    missing = []
    for key, size in objs:
        got = c.call("get", key)
        if got is None:
            missing.append(key.decode())
        else:
            assert got == value_for(key, size), f"{key}: wrong bytes after the restart"
    assert not missing, f"{len(missing)} of {len(objs)} objects lost by a clean restart " \
        f"(ssd_start_objects {s0['ssd_start_objects']}): {missing}"
    assert s0["ssd_start_objects"] == len(objs), s0
    assert s0["objects"] == len(objs), s0
    s = stats(c)
    assert s["ssd_hits"] >= 80, s
    assert s["dram_objects"] < s["objects"], s
    d.stop()


# ---------------------------------------------------------------------------------------
# 2. kill -9 in the middle of heavy writes, several times.

CRASH_VALUE = 256 * KIB
CRASH_WINDOW = 8            # puts in flight on the writer's connection
CRASH_MAX_PUTS = 3000       # per iteration, far more than it can send before the kill


class PipelinedWriter(threading.Thread):
    """Pipelines puts of CRASH_VALUE-byte objects; every 4th is durable."""

    def __init__(self, port, prefix, deadline):
        super().__init__(daemon=True)
        self.port, self.prefix, self.deadline = port, prefix, deadline
        self.sent = []              # keys whose put reached the socket (in part or whole)
        self.acked_durable = []     # durable puts answered 0
        self.acked = []             # every put answered 0
        self.bad = []               # (key, error or code) for anything else
        self.exhausted = False

    def run(self):
        try:
            c = Client.tcp(self.port)
        except OSError as e:
            self.bad.append((None, repr(e)))
            return
        inflight = collections.deque()
        i = 0
        try:
            while time.monotonic() < self.deadline:
                while len(inflight) < CRASH_WINDOW and i < CRASH_MAX_PUTS:
                    key = f"{self.prefix}-{i:05d}".encode()
                    durable = i % 4 == 0
                    params = [key, value_for(key, CRASH_VALUE)]
                    if durable:
                        params.append({"durable": True})
                    msgid, data = c.request("put", params)
                    self.sent.append(key)
                    inflight.append((msgid, key, durable))
                    i += 1
                    c.sock.sendall(data)
                if not inflight:
                    self.exhausted = True
                    break
                msg = c.recv()
                msgid, key, durable = inflight.popleft()
                if msg[0] != 1 or msg[1] != msgid or msg[2] is not None or msg[3] != 0:
                    self.bad.append((key, msg))
                    continue
                self.acked.append(key)
                if durable:
                    self.acked_durable.append(key)
        except (OSError, ConnectionError, TimeoutError):
            pass                    # the daemon was killed under us
        finally:
            c.close()


def check_crash_survivors(c, sent, acked_durable):
    """Every durable-acknowledged key is there, and anything there is whole and exact."""
    present = 0
    keys = list(dict.fromkeys(sent))
    for i in range(0, len(keys), 8):
        chunk = keys[i:i + 8]
        got = c.call("batch_get", chunk)
        for key, v in zip(chunk, got):
            if v is None:
                continue
            present += 1
            assert len(v) == CRASH_VALUE, f"{key}: partial value ({len(v)} bytes)"
            assert v == value_for(key, CRASH_VALUE), f"{key}: wrong bytes after kill -9"
    missing = []
    for key in acked_durable:
        v = c.call("get", key)
        if v is None:
            missing.append(key)
        else:
            assert v == value_for(key, CRASH_VALUE), f"{key}: wrong bytes after kill -9"
    assert not missing, f"{len(missing)} durable-acknowledged keys lost after kill -9, " \
        f"e.g. {missing[:5]}"
    never = [k + b"-never" for k in keys[:3]]
    assert c.call("batch_is_exist", never) == [False] * len(never)
    return present


def test_kill9_during_heavy_writes_keeps_acknowledged_and_never_serves_partial(work, kv):
    data = os.path.join(work, "data")
    args = ("--memory_size=8m", "--ssd_offload=write_through", "--ssd_bucket_size=4m")
    rng = random.Random(2)
    all_sent, all_durable = [], []
    d = kv(data, *args)
    for it in range(3):
        w = PipelinedWriter(d.port, f"crash{it}", time.monotonic() + 20)
        w.start()
        # Let it get going (some durable puts answered), then kill at a random moment.
        wait_for(lambda: len(w.acked_durable) >= 4 or not w.is_alive(), 15,
                 "the first durable puts to be acknowledged")
        time.sleep(rng.uniform(0.1, 0.5))
        assert w.is_alive() and not w.exhausted, \
            "the writer finished before the kill: the test did not crash mid-write"
        sent_before_kill = len(w.sent)
        # Objects the tier has indexed by now were fully written: they must all come back.
        indexed_before = stats(d.client())["ssd_objects"]
        d.kill9()
        w.join(20)
        assert not w.is_alive(), "writer thread stuck after the daemon was killed"
        assert not w.bad, f"puts refused before the kill: {w.bad[:3]}"
        assert sent_before_kill >= 8 and len(w.acked_durable) >= 4
        all_sent += w.sent
        all_durable += w.acked_durable

        d = kv(data, *args)
        c = d.client()
        s = stats(c)
        present = check_crash_survivors(c, all_sent, all_durable)
        assert present >= len(all_durable)
        assert s["ssd_start_objects"] >= len(all_durable), s
        assert s["ssd_start_objects"] >= indexed_before, \
            f"iteration {it}: {indexed_before} objects were indexed before kill -9, " \
            f"only {s['ssd_start_objects']} after the restart ({present} of the keys sent " \
            f"so far are served)"
        d.close_clients()
    d.stop()


# ---------------------------------------------------------------------------------------
# 3 and 4. Bucket eviction: FIFO and LRU, bounded disk use.

# A 4 KiB header block plus 252 KiB of value: exactly four records per 1 MiB bucket.
EVICT_VALUE = 256 * KIB - 4 * KIB
EVICT_ARGS = ("--memory_size=4m", "--ssd_size=8m", "--ssd_bucket_size=1m",
              "--ssd_offload=write_through")
EVICT_DISK_MAX = 8 * MIB                # ssd_size: a record that does not fit is not written


def is_suffix(flags):
    """True when the True entries of flags are exactly a (possibly empty) tail."""
    first = next((i for i, f in enumerate(flags) if f), len(flags))
    return all(flags[first:])


def test_fifo_eviction_drops_oldest_and_bounds_disk(work, kv):
    data = os.path.join(work, "data")
    ssd_dir = os.path.join(data, "ssd")
    d = kv(data, *EVICT_ARGS, "--ssd_eviction=fifo")
    c = d.client()
    keys = [f"fifo-{i:03d}".encode() for i in range(48)]    # 12 MiB of records
    peak_stat = peak_files = 0
    for key in keys:
        assert c.call("put", key, value_for(key, EVICT_VALUE)) == 0, key
        peak_stat = max(peak_stat, stats(c)["ssd_disk_bytes"])
        peak_files = max(peak_files, bucket_bytes(ssd_dir))
    s = wait_offload_idle(c)
    peak_stat = max(peak_stat, s["ssd_disk_bytes"])
    peak_files = max(peak_files, bucket_bytes(ssd_dir))

    assert s["ssd_evicted_buckets"] > 0, s
    assert peak_stat <= EVICT_DISK_MAX, f"ssd_disk_bytes reached {peak_stat}"
    assert peak_files <= EVICT_DISK_MAX, f"bucket files reached {peak_files} bytes on disk"
    assert s["ssd_capacity"] == 8 * MIB

    present = c.call("batch_is_exist", keys)
    assert not any(present[:12]), f"oldest keys still there: {present[:12]}"
    assert all(present[-8:]), f"newest keys gone: {present[-8:]}"
    assert is_suffix(present), f"FIFO evicted out of order: {present}"
    for key, p in zip(keys, present):
        got = c.call("get", key)
        if p:
            assert got == value_for(key, EVICT_VALUE), f"{key}: wrong bytes"
        else:
            assert got is None, f"{key}: is_exist false but get returned a value"
    s = stats(c)
    assert s["ssd_disk_bytes"] <= EVICT_DISK_MAX
    assert s["ssd_buckets"] == len(bucket_files(ssd_dir)), \
        f"stats say {s['ssd_buckets']} buckets, {len(bucket_files(ssd_dir))} files on disk"
    d.stop()


def lru_scenario(kv, data, memory, durable):
    """ssd_eviction lru, ssd_promote off: write a first batch (two buckets), then write eight
    more buckets while re-reading the first batch after every put. Returns (daemon, client,
    hot keys, cold keys, SSD hits of the re-reads)."""
    ssd_dir = os.path.join(data, "ssd")
    d = kv(data, f"--memory_size={memory}", *EVICT_ARGS[1:], "--ssd_eviction=lru",
           "--ssd_promote=off")
    c = d.client()
    opts = [{"durable": True}] if durable else []
    hot = [f"lru-hot-{i:02d}".encode() for i in range(8)]       # two buckets
    cold = [f"lru-cold-{i:02d}".encode() for i in range(32)]    # eight buckets
    for key in hot:
        assert c.call("put", key, value_for(key, EVICT_VALUE), *opts) == 0, key
    wait_offload_idle(c)
    hits0 = stats(c)["ssd_hits"]
    peak = 0
    for key in cold:
        assert c.call("put", key, value_for(key, EVICT_VALUE), *opts) == 0, key
        for h in hot:   # keep the first batch recently read
            got = c.call("get", h)
            assert got is not None, f"{h} was dropped although it is read after every put"
            assert got == value_for(h, EVICT_VALUE), f"{h}: wrong bytes"
        peak = max(peak, stats(c)["ssd_disk_bytes"], bucket_bytes(ssd_dir))
    s = wait_offload_idle(c)
    assert s["ssd_evicted_buckets"] > 0, s
    assert max(peak, s["ssd_disk_bytes"]) <= EVICT_DISK_MAX, f"disk use reached {peak}"
    return d, c, hot, cold, s["ssd_hits"] - hits0


def check_lru_outcome(c, hot, cold, when=""):
    assert c.call("batch_is_exist", hot) == [True] * len(hot), f"re-read keys were evicted{when}"
    present = c.call("batch_is_exist", cold)
    assert not any(present[:4]), f"unread early keys survived{when}: {present}"
    assert all(present[-4:]), f"newest keys gone{when}: {present}"
    assert is_suffix(present), f"unread buckets evicted out of age order{when}: {present}"
    for key in hot:
        assert c.call("get", key) == value_for(key, EVICT_VALUE), key
    for key, p in zip(cold, present):
        got = c.call("get", key)
        assert (got == value_for(key, EVICT_VALUE)) if p else got is None, key


def test_lru_eviction_keeps_recently_read_buckets(work, kv):
    """1 MiB of DRAM holds three of the objects: every re-read goes to the SSD tier."""
    d, c, hot, cold, hits = lru_scenario(kv, os.path.join(work, "data"), "1m", durable=False)
    assert hits >= len(cold) * len(hot) // 2, \
        f"re-reads of the first batch hardly reached the SSD ({hits} hits)"
    check_lru_outcome(c, hot, cold)
    d.stop()


def test_lru_eviction_keeps_keys_that_are_read_from_dram(work, kv):
    """4 MiB of DRAM: the re-read objects are mostly served from memory. They are still the
    most recently read data, so LRU must keep them over never-read buckets, in DRAM and on the
    SSD (durable puts, so that every write is its own group commit)."""
    data = os.path.join(work, "data")
    d, c, hot, cold, hits = lru_scenario(kv, data, "4m", durable=True)
    check_lru_outcome(c, hot, cold)
    s = stats(c)
    d.stop()
    d = kv(data, "--memory_size=4m", *EVICT_ARGS[1:], "--ssd_eviction=lru", "--ssd_promote=off")
    c = d.client()
    assert stats(c)["ssd_start_objects"] == s["ssd_objects"], (s["ssd_objects"], stats(c))
    check_lru_outcome(c, hot, cold, " (their SSD copies: seen after a clean restart)")
    d.stop()


# ---------------------------------------------------------------------------------------
# 5. A corrupted value on disk is a miss, never wrong bytes.


def test_flipped_byte_in_value_is_a_miss(work, kv):
    data = os.path.join(work, "data")
    ssd_dir = os.path.join(data, "ssd")
    sizes = {b"flip-a": 100000, b"flip-b": 50000, b"flip-c": 300000, b"flip-d": 8192,
             b"flip-e": 1}
    d = kv(data, "--memory_size=16m", "--ssd_offload=write_through")
    c = d.client()
    for key, size in sizes.items():
        assert c.call("put", key, value_for(key, size), {"durable": True}) == 0, key
    d.stop()

    # Corrupt flip-a in the middle of its value and flip-c in its very last value byte.
    targets = {b"flip-a": sizes[b"flip-a"] // 2, b"flip-c": sizes[b"flip-c"] - 1}
    found = {}
    for path in bucket_files(ssd_dir):
        for key, voff, vlen in walk_records(path):
            if key in targets:
                assert vlen == sizes[key], f"{key}: record says {vlen} bytes"
                found[key] = (path, voff + targets[key])
    assert set(found) == set(targets), f"records not found in {bucket_files(ssd_dir)}: {found}"
    for key, (path, pos) in found.items():
        flip_byte(path, pos, 0x5A)

    d = kv(data, "--memory_size=4m", "--ssd_offload=write_through")
    c = d.client()
    s0 = stats(c)
    assert s0["dram_objects"] == 0 and s0["ssd_start_objects"] == len(sizes), s0
    for key in targets:
        assert c.call("get", key) is None, f"{key}: corrupt value served"
    s = stats(c)
    assert s["ssd_checksum_errors"] >= len(targets), s
    for key, size in sizes.items():
        if key not in targets:
            assert c.call("get", key) == value_for(key, size), f"{key}: wrong bytes"
    for key in targets:
        assert c.call("get", key) is None, f"{key}: corrupt value served on the second get"
        assert c.call("is_exist", key) is False, f"{key}: still listed after its CRC failed"
        assert c.call("get_size", key) is None
    # The dropped entry stays dropped across a restart.
    wait_for(lambda: stats(c)["ssd_objects"] == len(sizes) - len(targets), 10,
             "the corrupt entries to leave the index")
    d.stop()
    d = kv(data, "--memory_size=4m", "--ssd_offload=write_through")
    c = d.client()
    for key in targets:
        assert c.call("get", key) is None, f"{key}: corrupt value served after a restart"
        assert c.call("is_exist", key) is False
    for key, size in sizes.items():
        if key not in targets:
            assert c.call("get", key) == value_for(key, size), f"{key}: wrong bytes"
    d.stop()


# ---------------------------------------------------------------------------------------
# 6. The SSD's filesystem fills up: the daemon degrades, keeps serving, and recovers.


@pytest.fixture
def tmpfs(work):
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    mnt = os.path.join(work, "mnt")
    os.mkdir(mnt)
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=8m", "tmpfs", mnt],
                       capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs ({r.stderr.strip() or r.returncode})")
    yield mnt
    if subprocess.run(["umount", mnt], capture_output=True).returncode != 0:
        subprocess.run(["umount", "-l", mnt], capture_output=True)


def fill(path, limit=64 * MIB):
    """Append to path until the filesystem is full; returns the bytes written."""
    chunk = b"\xee" * (64 * KIB)
    written = 0
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        while written < limit:
            try:
                n = os.write(fd, chunk)
            except OSError as e:
                if e.errno == errno.ENOSPC:
                    break
                raise
            if n == 0:
                break
            written += n
    finally:
        os.close(fd)
    return written


def test_disk_full_degrades_keeps_serving_and_recovers(work, tmpfs, kv):
    data = os.path.join(work, "data")
    ssd_dir = os.path.join(tmpfs, "ssd")
    filler = os.path.join(tmpfs, "filler")
    d = kv(data, f"--ssd_dir={ssd_dir}", "--ssd_size=64m", "--ssd_bucket_size=1m",
           "--memory_size=16m", "--ssd_offload=write_through")
    c = d.client()
    assert c.call("put", b"before-full", value_for(b"before-full", 64 * KIB),
                  {"durable": True}) == 0
    promised = [b"before-full"]     # durable puts answered 0: never to be lost

    assert fill(filler) > 0
    # The daemon may give space back (a failed bucket is dropped): take that too, a few times.
    no_space_seen = False
    for i in range(20):
        key = f"durable-full-{i}".encode()
        code = c.call("put", key, value_for(key, 64 * KIB), {"durable": True})
        assert code in (0, NO_SPACE), f"durable put while full answered {code}"
        if code == NO_SPACE:
            no_space_seen = True
            break
        promised.append(key)
        fill(filler)
    assert no_space_seen, "durable puts kept succeeding on a full filesystem"

    # While full: plain puts still answer and DRAM does the work; reads keep working.
    vals = {}
    t0 = time.monotonic()
    for i in range(80):         # 20 MiB through 16 MiB of DRAM
        key = f"full-{i:03d}".encode()
        vals[key] = value_for(key, 256 * KIB)
        assert c.call("put", key, vals[key]) == 0, f"put {key} while the SSD is full"
        fill(filler)
    assert time.monotonic() - t0 < 30, "puts crawled while the SSD was full"
    last = list(vals)[-8:]
    assert c.call("batch_is_exist", last) == [True] * len(last)
    for key in last:
        assert c.call("get", key) == vals[key], f"{key}: wrong bytes while the SSD is full"
    s = stats(c)
    assert s["ssd_no_space"] > 0 or s["ssd_io_errors"] > 0 or s["ssd_degraded"] == 1, s
    assert s["ssd_disk_bytes"] <= 8 * MIB, s
    assert c.call("put", b"durable-while-full", value_for(b"durable-while-full", 4096),
                  {"durable": True}) == NO_SPACE
    assert c.call("batch_put", [b"bd-1", b"bd-2"], [b"x" * 5000, b"y" * 5000],
                  {"durable": True}) == [NO_SPACE, NO_SPACE]
    # Still full well after the tier's first fault (it retries by itself): still refused.
    for i in range(3):
        time.sleep(0.6)
        fill(filler)
        key = f"durable-still-full-{i}".encode()
        assert c.call("put", key, value_for(key, 64 * KIB), {"durable": True}) == NO_SPACE
    assert c.call("ping") == "pong"
    assert c.call("get", last[-1]) == vals[last[-1]]

    # Space comes back: durable puts succeed again by themselves.
    os.unlink(filler)
    attempts = []

    def durable_ok():
        key = f"durable-after-{len(attempts)}".encode()
        code = c.call("put", key, value_for(key, 64 * KIB), {"durable": True})
        attempts.append((key, code))
        assert code in (0, NO_SPACE), code
        return code == 0
    wait_for(durable_ok, 15, "durable puts to work again after space was freed", interval=0.2)
    key = attempts[-1][0]
    assert c.call("get", key) == value_for(key, 64 * KIB)
    wait_for(lambda: stats(c)["ssd_degraded"] == 0, 10, "ssd_degraded to clear")
    writes0 = stats(c)["ssd_writes"]
    assert c.call("put", b"after-2", b"z" * 70000, {"durable": True}) == 0
    assert stats(c)["ssd_writes"] > writes0
    d.stop()

    # What was durably stored after the recovery is there after a restart.
    d = kv(data, f"--ssd_dir={ssd_dir}", "--ssd_size=64m", "--ssd_bucket_size=1m",
           "--memory_size=16m", "--ssd_offload=write_through")
    c = d.client()
    assert c.call("get", key) == value_for(key, 64 * KIB)
    assert c.call("get", b"after-2") == b"z" * 70000
    # A full disk costs only what was not committed: every acknowledged durable put is here.
    for k in promised:
        assert c.call("get", k) == value_for(k, 64 * KIB), f"{k}: durable put lost to ENOSPC"
    d.stop()


# ---------------------------------------------------------------------------------------
# 7. One daemon per ssd_dir.


def test_second_daemon_on_same_ssd_dir_refuses_to_start(work, kv):
    data = os.path.join(work, "data")
    shared = os.path.join(work, "shared-ssd")
    first = kv(data, f"--ssd_dir={shared}", "--memory_size=4m")
    c = first.client()
    assert c.call("put", b"owner", b"first daemon", {"durable": True}) == 0

    # Same ssd_dir from another data_dir, and the default ssd_dir of the same data_dir.
    first2 = kv(os.path.join(work, "data-b"), "--memory_size=4m")
    for data_dir, ssd_arg in ((os.path.join(work, "data2"), f"--ssd_dir={shared}"),
                              (os.path.join(work, "data-b"), None)):
        args = ["--memory_size=4m"] + ([ssd_arg] if ssd_arg else [])
        second = kv(data_dir, *args, ready=False)
        try:
            rc = second.proc.wait(15)
        except subprocess.TimeoutExpired:
            pytest.fail("a second kvstashd on the same ssd_dir kept running:\n" + second.tail())
        assert rc != 0, "a second kvstashd on the same ssd_dir exited 0"
        assert "in use by another kvstashd" in second.output(), second.output()

    # The first daemons never noticed.
    assert c.call("get", b"owner") == b"first daemon"
    assert c.call("put", b"still-mine", b"yes", {"durable": True}) == 0
    first.stop()
    first2.stop()
    # Once the owner is gone, the directory is free again.
    third = kv(os.path.join(work, "data3"), f"--ssd_dir={shared}", "--memory_size=4m")
    c = third.client()
    assert c.call("get", b"owner") == b"first daemon"
    assert c.call("get", b"still-mine") == b"yes"
    third.stop()


# ---------------------------------------------------------------------------------------
# 8. Durable puts.


def test_durable_put_is_on_ssd_when_answered(work, kv):
    data = os.path.join(work, "data")
    d = kv(data, "--memory_size=16m")       # on_evict: nothing goes to the SSD by itself yet
    c = d.client()
    s0 = stats(c)
    v1 = value_for(b"dur-1", 300000)
    assert c.call("put", b"dur-1", v1, {"durable": True}) == 0
    s1 = stats(c)
    assert s1["ssd_writes"] >= s0["ssd_writes"] + 1, (s0["ssd_writes"], s1["ssd_writes"])
    assert s1["ssd_syncs"] >= s0["ssd_syncs"] + 1
    assert s1["ssd_objects"] >= 1
    vals = {f"dur-b{i}".encode(): value_for(f"dur-b{i}".encode(), 1000 * (i + 1))
            for i in range(3)}
    assert c.call("batch_put", list(vals), list(vals.values()), {"durable": True}) == [0, 0, 0]
    s2 = stats(c)
    assert s2["ssd_writes"] >= s1["ssd_writes"] + 3
    # durable false is an ordinary put
    assert c.call("put", b"dur-false", b"plain", {"durable": False}) == 0
    assert c.call("put", b"dur-1", b"other", {"durable": True}) == 2      # write-once
    assert c.call("get", b"dur-1") == v1

    # Crash right after the answers: the durable objects are there.
    d.kill9()
    d = kv(data, "--memory_size=16m")
    c = d.client()
    assert c.call("get", b"dur-1") == v1
    for k, v in vals.items():
        assert c.call("get", k) == v, k
    d.stop()

    # Without an SSD tier a durable put cannot be honoured: a request error, no effect.
    d = kv(os.path.join(work, "nossd"), "--ssd_dir=", "--memory_size=4m")
    c = d.client()
    err, result = c.call_raw("put", b"nd-1", b"value", {"durable": True})
    assert err is not None and err[0] == UNSUPPORTED and err[1] == "UNSUPPORTED", err
    assert result is None
    err, result = c.call_raw("batch_put", [b"nd-2"], [b"v"], {"durable": True})
    assert err is not None and err[0] == UNSUPPORTED, err
    assert c.call("ping") == "pong"
    assert c.call("batch_get", [b"nd-1", b"nd-2"]) == [None, None]
    assert c.call("put", b"nd-1", b"value") == 0
    assert c.call("put", b"nd-3", b"value", {"durable": False}) == 0
    assert c.call("get", b"nd-1") == b"value"
    assert not os.path.exists(os.path.join(work, "nossd", "ssd")), "--ssd_dir= created ssd/"
    d.stop()


# ---------------------------------------------------------------------------------------
# 9. Removing an object that only the SSD holds.


def test_remove_of_ssd_only_object_stays_removed(work, kv):
    data = os.path.join(work, "data")
    # write_through: every object is on the SSD once the queue is idle, and nothing is
    # written later (on_evict keeps writing cold objects ahead while DRAM is full), so
    # ssd_objects moves only with the removals below.
    args = ("--memory_size=4m", "--ssd_offload=write_through")
    d = kv(data, *args)
    c = d.client()
    keys = [f"rm-{i:02d}".encode() for i in range(32)]      # 8 MiB through 4 MiB of DRAM
    for key in keys:
        assert c.call("put", key, value_for(key, 256 * KIB)) == 0, key
    wait_offload_idle(c)
    s = stats(c)
    assert s["dram_objects"] < s["objects"] and s["ssd_objects"] >= 8, s

    x = keys[0]                 # the oldest, never read: long gone from DRAM
    assert c.call("get_size", x) == 256 * KIB
    assert c.call("remove", x) == 0
    assert c.call("get", x) is None
    assert c.call("is_exist", x) is False
    assert c.call("get_size", x) is None
    assert c.call("remove", x) == 1
    ssd_before = s["ssd_objects"]
    wait_for(lambda: stats(c)["ssd_objects"] == ssd_before - 1, 10,
             "the removal to reach the SSD index")
    d.stop()

    d = kv(data, *args)
    c = d.client()
    assert c.call("get", x) is None, "a removed object came back after a restart"
    assert c.call("is_exist", x) is False
    # After a start nothing is in DRAM: remove another one, and crash this time.
    y = keys[1]
    s = stats(c)
    assert s["dram_objects"] == 0
    assert c.call("remove", y) == 0
    assert c.call("get", y) is None
    wait_for(lambda: stats(c)["ssd_objects"] == s["ssd_objects"] - 1, 10,
             "the removal to reach the SSD index")
    d.kill9()

    d = kv(data, *args)
    c = d.client()
    assert c.call("batch_get", [x, y]) == [None, None], "removed objects came back after kill -9"
    for key in keys[2:6]:
        assert c.call("get", key) == value_for(key, 256 * KIB), f"{key}: lost or wrong"
    d.stop()


# ---------------------------------------------------------------------------------------
# 10. Backpressure: batches of small values wait for the SSD instead of failing.


def test_small_value_batches_wait_for_room_instead_of_failing(work, kv):
    # 1 MiB of DRAM is 256 pages; write_through keeps every object busy until it is on the
    # SSD, so 2,000 one-page objects in batches of 250 outrun DRAM many times over. Every
    # key of every batch must be stored (0), none refused with NO_SPACE, and read back.
    data = os.path.join(work, "data")
    d = kv(data, "--memory_size=1m", "--ssd_offload=write_through")
    c = d.client()
    t0 = time.monotonic()
    for b in range(8):
        keys = [f"small-{b}-{i:03d}".encode() for i in range(250)]
        codes = c.call("batch_put", keys, [value_for(k, 3000) for k in keys])
        assert codes == [0] * len(keys), \
            f"batch {b}: {sum(x == NO_SPACE for x in codes)} keys refused with NO_SPACE"
        assert time.monotonic() - t0 < 60, "batches crawled"
    wait_offload_idle(c)
    s = stats(c)
    assert s["objects"] == 2000 and s["ssd_objects"] == 2000, s
    for b in (0, 7):
        keys = [f"small-{b}-{i:03d}".encode() for i in range(0, 250, 25)]
        got = c.call("batch_get", keys)
        assert got == [value_for(k, 3000) for k in keys], f"batch {b} reads back wrong"
    d.stop()


# ---------------------------------------------------------------------------------------
# 11. SIGHUP: the SSD tier's reloadable keys take effect without a restart.


def test_sighup_changes_offload_mode(work, kv):
    data = os.path.join(work, "data")
    conf = os.path.join(work, "kvstashd.conf")
    with open(conf, "w") as f:
        f.write("memory_size 64m\nssd_offload off\n")
    d = kv(data, f"--config={conf}")
    c = d.client()
    for i in range(8):
        key = f"before-{i}".encode()
        assert c.call("put", key, value_for(key, 64 * KIB)) == 0
    time.sleep(0.3)
    assert stats(c)["ssd_writes"] == 0, "ssd_offload off wrote to the SSD"

    with open(conf, "w") as f:
        f.write("memory_size 64m\nssd_offload write_through\n")
    d.proc.send_signal(signal.SIGHUP)
    # A reload is applied on the main loop shortly after the signal; keep putting until a
    # put is written through (bounded), then check that every later one is.
    deadline = time.monotonic() + 10
    i = 0
    while stats(c)["ssd_writes"] == 0:
        assert time.monotonic() < deadline, "write_through never took effect after SIGHUP"
        key = f"probe-{i}".encode()
        assert c.call("put", key, value_for(key, 4096)) == 0
        i += 1
        time.sleep(0.05)
    w0 = wait_offload_idle(c)["ssd_writes"]
    for j in range(8):
        key = f"after-{j}".encode()
        assert c.call("put", key, value_for(key, 64 * KIB)) == 0
    assert wait_offload_idle(c)["ssd_writes"] == w0 + 8
    assert d.proc.poll() is None
    d.stop()


# ---------------------------------------------------------------------------------------
# 12. A tier no larger than DRAM: writing cold objects ahead stops at the low watermark
#     instead of dropping buckets whose objects it then writes again, without end.

def test_write_ahead_into_a_small_tier_settles(work, kv):
    d = kv(os.path.join(work, "data"), "--memory_size=64m", "--ssd_size=64m",
           "--ssd_bucket_size=8m")
    c = d.client()
    for i in range(130):                        # 65 MB: more than DRAM keeps, as much as the tier
        key = f"ahead-{i:03d}".encode()
        assert c.call("put", key, value_for(key, 500000)) == 0, key
    wait_offload_idle(c)
    time.sleep(1)                               # idle rounds of the writer
    before = stats(c)
    time.sleep(2)
    after = stats(c)
    assert after["ssd_writes"] - before["ssd_writes"] < 20, (before["ssd_writes"],
                                                             after["ssd_writes"])
    assert after["ssd_disk_bytes"] <= 64 << 20, after
    for i in range(130):                        # whatever is kept is exact
        key = f"ahead-{i:03d}".encode()
        got = c.call("get", key)
        assert got is None or got == value_for(key, 500000), key
