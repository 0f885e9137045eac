"""kvstash.iovs: pieces already resolved to registered buffers, as arrays (needs numpy).

This module owns Iovs, the array form of batch_put_from / batch_get_into pieces an adapter
builds for a whole batch at once (every piece a (Buffer, offset, length) in a buffer of
the same Client, the same number of pieces per key), its checks, and its msgpack bytes:
the iovs parameter of a request packed by numpy in one pass, with no Python object per
piece. It also owns resolve(), which maps raw pointers to (range, offset) for a batch with
one searchsorted. It knows nothing of the socket (wire.py) or of which method is sent
(client.py). numpy is imported when an Iovs is built or resolve() runs, never at import,
so the package stays importable without it.
"""

from .errors import INVALID_ARGUMENT, Error

# One piece as msgpack: fixarray(3) [uint32 id, uint64 offset, uint64 length]. The widths
# are fixed (msgpack allows any width for a uint; the daemon reads them all), so every
# piece is 24 bytes and a batch is one structured array.
_PIECE = [("a", "u1"), ("ti", "u1"), ("id", ">u4"), ("to", "u1"), ("off", ">u8"),
          ("tl", "u1"), ("len", ">u8")]


def _np():
    import numpy
    return numpy


def _array_header(n):
    if n < 16:
        return bytes([0x90 | n])
    if n < 65536:
        return b"\xdc" + n.to_bytes(2, "big")
    return b"\xdd" + n.to_bytes(4, "big")


class Iovs:
    """Pieces of n keys, per_key each, key i's pieces being rows i * per_key ..
    (i + 1) * per_key - 1 of the arrays, in order.

    bufs: a list of Buffers (registered on the Client the Iovs is passed to). which: per
    piece, the index in bufs of its buffer (an int array, or one int for every piece).
    offsets, lengths: per piece, its offset in that buffer and its length (int arrays).
    Raises Error(INVALID_ARGUMENT) when the arrays disagree in length, per_key does not
    divide them, an index is outside bufs, or a piece lies outside its buffer (or has a
    negative offset or length). The arrays are copied; the Iovs can be reused for many
    calls while its buffers stay registered."""

    def __init__(self, bufs, which, offsets, lengths, per_key=1):
        np = _np()
        self.bufs = list(bufs)
        off = np.asarray(offsets, dtype=np.int64).reshape(-1)
        ln = np.asarray(lengths, dtype=np.int64).reshape(-1)
        if np.ndim(which) == 0:
            wh = np.full(off.shape, int(which), dtype=np.int64)
        else:
            wh = np.asarray(which, dtype=np.int64).reshape(-1)
        m = int(per_key)
        if not (len(off) == len(ln) == len(wh)):
            raise Error(INVALID_ARGUMENT, None,
                        f"{len(wh)} buffer indices, {len(off)} offsets, {len(ln)} lengths")
        if m < 1 or len(off) % m:
            raise Error(INVALID_ARGUMENT, None, f"{len(off)} pieces are not keys of {m}")
        if not self.bufs and len(off):
            raise Error(INVALID_ARGUMENT, None, "pieces but no buffers")
        if len(off):
            if wh.min() < 0 or wh.max() >= len(self.bufs):
                raise Error(INVALID_ARGUMENT, None,
                            f"a buffer index outside the {len(self.bufs)} buffers")
            size = np.array([b.size for b in self.bufs], dtype=np.int64)[wh]
            bad = (off < 0) | (ln < 0) | (off + ln > size)
            if bad.any():
                j = int(np.flatnonzero(bad)[0])
                raise Error(INVALID_ARGUMENT, None,
                            f"key {j // m}, piece {j % m}: [{int(off[j])}, "
                            f"{int(off[j])}+{int(ln[j])}) is outside its buffer's "
                            f"{int(size[j])} bytes")
        self.per_key = m
        self.n = len(off) // m
        self.which, self.offsets, self.lengths = wh, off, ln

    def __len__(self):
        return self.n

    def nbytes(self, i, j):
        """Bytes the pieces of keys i .. j - 1 hold."""
        m = self.per_key
        return int(self.lengths[i * m:j * m].sum())

    def key_bytes(self):
        """Per key, the bytes its pieces hold: a list of ints."""
        return self.lengths.reshape(self.n, self.per_key).sum(axis=1).tolist()

    def ids_of(self, keys):
        """The buffer ids the pieces of the keys at indices keys name."""
        np = _np()
        m = self.per_key
        rows = (np.asarray(keys, dtype=np.int64)[:, None] * m + np.arange(m)).reshape(-1)
        return sorted({self.bufs[i].id for i in np.unique(self.which[rows]).tolist()})

    def packed(self, i, j):
        """The msgpack bytes of the iovs of keys i .. j - 1: an array of j - i arrays of
        per_key pieces (the bytes after the request's keys)."""
        np = _np()
        m, n = self.per_key, j - i
        ids = np.array([b.id for b in self.bufs], dtype=np.uint32)
        rec = np.dtype([("h", "u1", (len(_array_header(m)),)),
                        ("p", np.dtype(_PIECE), (m,))])
        out = np.zeros(n, dtype=rec)
        out["h"] = np.frombuffer(_array_header(m), dtype=np.uint8)
        p = out["p"]
        p["a"], p["ti"], p["to"], p["tl"] = 0x93, 0xce, 0xcf, 0xcf
        sl = slice(i * m, j * m)
        p["id"] = ids[self.which[sl]].reshape(n, m)
        p["off"] = self.offsets[sl].reshape(n, m)
        p["len"] = self.lengths[sl].reshape(n, m)
        return _array_header(n) + out.tobytes()


def resolve(starts, ends, ptrs, sizes):
    """Which of the sorted, non-overlapping ranges [starts[r], ends[r]) holds each piece
    [ptrs[k], ptrs[k] + sizes[k]) whole: (index, delta, inside), numpy arrays, one
    searchsorted for the batch. index[k] is the range (meaningful where inside[k]),
    delta[k] = ptrs[k] - starts[index[k]]. A piece that starts outside every range, or
    runs past the end of the range it starts in (into the next one or beyond), is not
    inside; one that ends exactly at its range's end is. A piece of size 0 is never
    inside."""
    np = _np()
    st = np.asarray(starts, dtype=np.int64)
    en = np.asarray(ends, dtype=np.int64)
    p = np.asarray(ptrs, dtype=np.int64)
    s = np.asarray(sizes, dtype=np.int64)
    if len(st) == 0:
        z = np.zeros(p.shape, dtype=np.int64)
        return z, z, np.zeros(p.shape, dtype=bool)
    idx = np.searchsorted(st, p, side="right") - 1
    ok = idx >= 0
    idx = np.where(ok, idx, 0)
    delta = p - st[idx]
    inside = ok & (s > 0) & (p + s <= en[idx])
    return idx, delta, inside
