"""The SSD tier under a cache that is always full: DRAM puts go on when the disk cannot keep
up (evictions past the offload queue's bound, or refused by the write-rate admission, leave
without an SSD copy and are counted), ssd_write_rate_limit holds, durable and write-through
copies are never refused, and compaction keeps the tier full of live records under churn.
Every value read back is checked byte for byte."""

import os
import random
import time

from kvtest import wait_for
from test_ssd import KIB, MIB, kv, stats, value_for, wait_offload_idle  # noqa: F401 (fixture)

REC_HDR_BLOCK = 4 * KIB     # a record's header block for these short keys


def record_bytes(size):
    return REC_HDR_BLOCK + (size + 4095) // 4096 * 4096


# ---------------------------------------------------------------------------------------
# 1. A disk that cannot keep up: the rate limit holds it to LIMIT while DRAM is full.

LIMIT = 1 * MIB
VALUE = 256 * KIB - 4 * KIB     # a record of 256 KiB
PUT_SECS = 3.0                  # puts go on this long (at least), so the limit has a window


def test_full_dram_keeps_taking_puts_when_the_disk_cannot_keep_up(work, kv):
    data = os.path.join(work, "data")
    t0 = time.monotonic()
    d = kv(data, "--memory_size=16m", f"--ssd_write_rate_limit={LIMIT}")
    c = d.client()
    keys = []
    # At least 63 MiB (four times DRAM) over PUT_SECS, and on until the admission has refused
    # something: however slow the machine, puts outrun 1 MiB/s long before 4096 of them.
    while len(keys) < 4096:
        key = f"adm-{len(keys):04d}".encode()
        assert c.call("put", key, value_for(key, VALUE)) == 0, key
        keys.append(key)
        if len(keys) >= 256 and len(keys) % 32 == 0 and time.monotonic() - t0 >= PUT_SECS \
                and stats(c)["ssd_rate_limited"] > 0:
            break
    s = wait_offload_idle(c)
    elapsed = time.monotonic() - t0

    # Progress, not wall time: every put was taken (none waited for room past the client's
    # timeout or was refused), and eviction let objects go uncopied rather than wait.
    written = s["ssd_disk_bytes"]
    assert s["ssd_evicted_buckets"] == 0, s
    assert s["ssd_rate_limited"] > 0, s
    assert s["ssd_offload_dropped"] >= s["ssd_rate_limited"], s
    # The limit holds from the start: the budget starts empty and fills at LIMIT bytes/s.
    assert written <= LIMIT * elapsed * 1.05 + record_bytes(VALUE), \
        f"{written} bytes written in {elapsed:.1f} s under a {LIMIT} B/s limit"
    assert s["ssd_writes"] * record_bytes(VALUE) == written, s
    assert s["ssd_writes"] > 1, s    # admitted while refusing: a rate, not a shut door

    # Whatever is kept, in DRAM or on the SSD, is exact; the rest is a clean miss. (Reading
    # back SSD copies evicts objects of DRAM, so presence is taken from the gets themselves.)
    kept = 0
    for key in keys:
        got = c.call("get", key)
        if got is not None:
            assert got == value_for(key, VALUE), f"{key}: wrong bytes"
            kept += 1
    assert kept >= s["ssd_writes"], (kept, s["ssd_writes"])
    d.stop()

    # What the SSD took survives a restart, byte-exact.
    d = kv(data, "--memory_size=16m")
    c = d.client()
    assert stats(c)["ssd_start_objects"] == s["ssd_writes"]
    back = 0
    for key in keys:
        got = c.call("get", key)
        if got is not None:
            assert got == value_for(key, VALUE), key
            back += 1
    assert back == s["ssd_writes"]
    d.stop()


def test_rate_limit_never_refuses_durable_or_write_through_copies(work, kv):
    data = os.path.join(work, "data")
    d = kv(data, "--memory_size=16m", f"--ssd_write_rate_limit={LIMIT}")
    c = d.client()
    durable = [f"dur-{i:03d}".encode() for i in range(24)]     # 6 MiB: six seconds of budget
    for key in durable:
        assert c.call("put", key, value_for(key, VALUE), {"durable": True}) == 0, key
    d.kill9()
    d = kv(data, "--memory_size=16m", f"--ssd_write_rate_limit={LIMIT}",
           "--ssd_offload=write_through")
    c = d.client()
    for key in durable:
        assert c.call("get", key) == value_for(key, VALUE), key
    through = [f"wt-{i:03d}".encode() for i in range(24)]
    for key in through:
        assert c.call("put", key, value_for(key, VALUE)) == 0, key
    s = wait_offload_idle(c, timeout=60)
    assert s["ssd_rate_limited"] == 0, s
    assert s["ssd_objects"] == len(durable) + len(through), s
    d.kill9()
    d = kv(data, "--memory_size=16m")
    c = d.client()
    for key in durable + through:
        assert c.call("get", key) == value_for(key, VALUE), key
    d.stop()


# ---------------------------------------------------------------------------------------
# 2. Capacity: churn with removes and bucket eviction, then the tier holds >= 90% of
#    ssd_size in live records (compaction copies the live records of mostly-dead buckets
#    forward), and every record is exact.

CHURN_SIZE = 60 * KIB           # a record of exactly 64 KiB
SSD_SIZE = 32 * MIB


def test_ssd_holds_ninety_percent_live_under_churn(work, kv):
    data = os.path.join(work, "data")
    d = kv(data, "--memory_size=8m", f"--ssd_size={SSD_SIZE}", "--ssd_bucket_size=1m",
           "--ssd_offload=write_through")
    c = d.client()
    rng = random.Random(19)
    live = set()
    removed = set()
    n = 3 * SSD_SIZE // record_bytes(CHURN_SIZE)         # three times the tier, put once each
    for i in range(n):
        key = f"churn-{i:05d}".encode()
        assert c.call("put", key, value_for(key, CHURN_SIZE)) == 0, key
        live.add(key)
        if i % 4 == 3:
            # remove a quarter of what is put, chosen at random from what may still be there
            victim = rng.choice(sorted(live))
            assert c.call("remove", victim) in (0, 1), victim
            live.discard(victim)
            removed.add(victim)
        if i % 64 == 0:
            wait_offload_idle(c)
    wait_offload_idle(c)

    def full():
        s = stats(c)
        return s if s["ssd_live_bytes"] >= 0.9 * SSD_SIZE else None
    s = wait_for(full, 60, "the SSD tier to hold 90% of ssd_size in live records")
    assert s["ssd_compacted_buckets"] > 0, s
    assert s["ssd_evicted_buckets"] > 0, s
    assert s["ssd_disk_bytes"] <= SSD_SIZE, s
    assert s["ssd_utilization_pct"] >= 90, s

    for key in sorted(removed):
        assert c.call("get", key) is None, f"{key} was removed but is served"
    for key in sorted(live):
        got = c.call("get", key)
        assert got is None or got == value_for(key, CHURN_SIZE), f"{key}: wrong bytes"
    d.stop()

    # After a restart the compacted records are where the index says, and removed keys
    # stay removed.
    d = kv(data, "--memory_size=8m", f"--ssd_size={SSD_SIZE}", "--ssd_bucket_size=1m")
    c = d.client()
    s2 = stats(c)
    assert 0.9 * s["ssd_objects"] <= s2["ssd_start_objects"] <= s["ssd_objects"], (s2, s)
    for key in sorted(removed):
        assert c.call("get", key) is None, f"{key} came back after a restart"
    for key in sorted(live):
        got = c.call("get", key)
        assert got is None or got == value_for(key, CHURN_SIZE), key
    d.stop()
