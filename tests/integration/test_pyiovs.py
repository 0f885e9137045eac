"""Integration: kvstash.iovs, the array form of pieces the engine adapters use.

resolve() maps a batch of raw pointers to the registered range each lies in (one
searchsorted): checked at the edges an engine's pointers can hit (before every range, in a
gap, straddling two adjacent ranges, ending exactly at a range's end, starting exactly at
it, zero length). Iovs, pieces already in registered buffers as arrays, must move the same
bytes with the same per-key results as the tuple form of batch_put_from / batch_get_into
(checked byte for byte against the real daemon, over batches that split into several
requests), and bad pieces are refused before anything is sent.
"""

import pathlib
import sys

import numpy as np
import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "client" / "python"))

import kvstash  # noqa: E402
from kvstash.iovs import Iovs, resolve  # noqa: E402

BASE_ARGS = ["--memory_size=256m", "--ssd_dir="]


@pytest.fixture
def client(daemons):
    d = daemons(BASE_ARGS)
    c = kvstash.Client(f"unix:{d.unix_path}", timeout=30)
    yield c
    c.close()


# ---- resolve: no daemon ----

# ranges [1000, 2000) and [2000, 3000) touch; [5000, 6000) stands alone
STARTS, ENDS = [1000, 2000, 5000], [2000, 3000, 6000]


def one(ptr, size):
    idx, delta, inside = resolve(STARTS, ENDS, [ptr], [size])
    return (int(idx[0]), int(delta[0])) if inside[0] else None


def test_resolve_inside_a_range():
    assert one(1000, 1000) == (0, 0)
    assert one(1500, 10) == (0, 500)
    assert one(2000, 1000) == (1, 0)
    assert one(5999, 1) == (2, 999)


def test_resolve_outside_every_range():
    assert one(0, 8) is None                # before the first
    assert one(999, 1) is None
    assert one(3000, 1) is None             # in the gap
    assert one(4999, 2) is None             # starts in the gap, ends inside
    assert one(6000, 1) is None             # after the last
    assert one(1 << 46, 4096) is None


def test_resolve_straddling_two_ranges_is_not_inside():
    assert one(1999, 2) is None             # one byte in each of two touching ranges
    assert one(1000, 2000) is None          # both of them whole
    assert one(2500, 3000) is None          # past the end into the gap and beyond


def test_resolve_at_the_exact_end():
    assert one(1999, 1) == (0, 999)         # its last byte
    assert one(2000, 1) == (1, 0)           # the next range's first byte, not the first's
    assert one(5000, 1000) == (2, 0)        # the whole of it
    assert one(5000, 1001) is None          # one byte past it


def test_resolve_zero_length_and_no_ranges():
    assert one(1500, 0) is None
    idx, delta, inside = resolve([], [], [1, 2], [1, 1])
    assert not inside.any()


def test_resolve_a_batch_matches_one_by_one():
    rng = np.random.default_rng(5)
    ptrs = rng.integers(0, 7000, 5000)
    sizes = rng.integers(0, 1500, 5000)
    idx, delta, inside = resolve(STARTS, ENDS, ptrs, sizes)
    for k in range(len(ptrs)):
        want = None
        for r, (lo, hi) in enumerate(zip(STARTS, ENDS)):
            if sizes[k] > 0 and lo <= ptrs[k] and ptrs[k] + sizes[k] <= hi:
                want = (r, int(ptrs[k]) - lo)
        got = (int(idx[k]), int(delta[k])) if inside[k] else None
        assert got == want, (int(ptrs[k]), int(sizes[k]))


# ---- Iovs: checks before sending ----

class FakeBuf:
    def __init__(self, size, bid=1):
        self.size, self.id = size, bid


def test_iovs_refuse_bad_pieces():
    b = FakeBuf(4096)
    with pytest.raises(kvstash.Error) as e:
        Iovs([b], 0, [4000], [97])          # one byte past the end
    assert e.value.code == kvstash.INVALID_ARGUMENT and "outside" in e.value.message
    Iovs([b], 0, [4000], [96])              # ends exactly at the end: fine
    for args in (([b], 0, [-1], [1]), ([b], 0, [0], [-1]), ([b], 1, [0], [1]),
                 ([b], [0, 0], [0], [1]), ([b], 0, [0, 1, 2], [1, 1, 1], 2), ([], 0, [0], [1])):
        with pytest.raises(kvstash.Error) as e:
            Iovs(*args)
        assert e.value.code == kvstash.INVALID_ARGUMENT


def test_iovs_packed_bytes_are_msgpack():
    import msgpack
    bs = [FakeBuf(1 << 40, 7), FakeBuf(100, 9)]
    for m in (1, 2, 17):
        n = 3
        which = [0, 1] * (n * m // 2) + [0] * (n * m % 2)
        off = [(1 << 33) + k if w == 0 else k for k, w in enumerate(which)]
        ln = [k % 5 for k in range(n * m)]
        iov = Iovs(bs, which, off, ln, per_key=m)
        want = [[[bs[which[k]].id, off[k], ln[k]] for k in range(i * m, (i + 1) * m)]
                for i in range(n)]
        assert msgpack.unpackb(iov.packed(0, n)) == want
        assert msgpack.unpackb(iov.packed(1, 2)) == want[1:2]


# ---- Iovs against the daemon ----

def test_iovs_move_the_same_bytes_as_tuples(client):
    src = client.register_buffer(8 << 20)
    dst = client.register_buffer(8 << 20)
    extra = client.register_buffer(1 << 16)
    rng = np.random.default_rng(1)
    src.memory[:] = rng.integers(0, 256, 8 << 20, dtype=np.uint8).tobytes()
    n, m, piece = 64, 3, 40000
    offs = np.arange(n * m, dtype=np.int64) * piece
    keys_a = [f"arr{i}" for i in range(n)]
    keys_t = [f"tup{i}" for i in range(n)]
    assert client.batch_put_from(keys_a, Iovs([src], 0, offs, [piece] * (n * m), m)) == \
        [kvstash.OK] * n
    tuples = [[(src, int(o), piece) for o in offs[i * m:(i + 1) * m]] for i in range(n)]
    assert client.batch_put_from(keys_t, tuples) == [kvstash.OK] * n
    assert client.batch_put_from(keys_a[:2], Iovs([src], 0, offs[:6], [piece] * 6, m)) == \
        [kvstash.EXISTS] * 2
    # read each form's objects back with the other form, plus one missing key; each value
    # read into its own place in dst, a byte of extra after it (not touched: exact size)
    for keys, form in ((keys_a, "tuples"), (keys_t, "iovs")):
        dst.memory[:] = bytes(8 << 20)
        ks = keys + ["missing"]
        if form == "iovs":
            which = np.tile([0, 0, 0, 1], n + 1)
            off = np.stack([offs[0::3], offs[1::3], offs[2::3],
                            np.arange(n, dtype=np.int64)], 1)
            off = np.vstack([off, [0, piece, 2 * piece, n]]).reshape(-1)
            ln = np.tile([piece, piece, piece, 1], n + 1)
            got = client.batch_get_into(ks, Iovs([dst, extra], which, off, ln, 4))
        else:
            ps = [t + [(extra, i, 1)] for i, t in enumerate(tuples)]
            ps = [[(dst, o, ln) for _, o, ln in p[:3]] + [p[3]] for p in ps]
            ps.append([(dst, 0, piece), (extra, n, 1)])
            got = client.batch_get_into(ks, ps)
        assert got == [m * piece] * n + [-kvstash.NOT_FOUND]
        assert bytes(dst.memory[:n * m * piece]) == bytes(src.memory[:n * m * piece])
        assert bytes(extra.memory[:n + 1]) == bytes(n + 1)


def test_iovs_split_into_requests_past_the_piece_limit(client):
    """70,000 pieces (over the 65,536 one request may carry): several requests, every key
    answered in order."""
    buf = client.register_buffer(1 << 20)
    buf.memory[:] = bytes(range(256)) * 4096
    n, m = 35000, 2
    off = (np.arange(n * m, dtype=np.int64) * 7) % ((1 << 20) - 8)
    keys = [f"s{i}" for i in range(n)]
    assert client.batch_put_from(keys, Iovs([buf], 0, off, [4] * (n * m), m)) == \
        [kvstash.OK] * n
    vals = client.batch_get(keys[:50] + keys[-50:])
    for i, v in zip(list(range(50)) + list(range(n - 50, n)), vals):
        o1, o2 = int(off[2 * i]), int(off[2 * i + 1])
        assert v == bytes(buf.memory[o1:o1 + 4]) + bytes(buf.memory[o2:o2 + 4])


def test_iovs_refused_for_a_buffer_not_registered_here(client, daemons):
    buf = client.register_buffer(1 << 16)
    iov = Iovs([buf], 0, [0], [16])
    other = kvstash.Client(client._conn.addr, timeout=30)
    try:
        with pytest.raises(kvstash.Error) as e:
            other.batch_put_from(["k"], iov)
        assert e.value.code == kvstash.INVALID_ARGUMENT
        with pytest.raises(kvstash.Error) as e:
            client.batch_put_from(["k", "k2"], iov)         # pieces for one key only
        assert e.value.code == kvstash.INVALID_ARGUMENT
        client.unregister_buffer(buf)
        with pytest.raises(kvstash.Error) as e:
            client.batch_get_into(["k"], iov)
        assert e.value.code == kvstash.INVALID_ARGUMENT
        assert client.ping() == "pong"          # refused before sending: still in step
    finally:
        other.close()
