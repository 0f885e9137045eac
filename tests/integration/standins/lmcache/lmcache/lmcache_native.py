"""Stand-in for LMCache's native Bitmap (lmcache.lmcache_native.Bitmap): a fixed number of
bits, each the success (1) or failure (0) of one key of an L2 task."""


class Bitmap:
    def __init__(self, size, prefix_bits=0):
        if size < 0:
            raise ValueError("negative size")
        self._size = size
        self._bits = bytearray((size + 7) // 8)
        self.set_range(0, min(prefix_bits, size))

    def _check(self, index):
        if not 0 <= index < self._size:
            raise IndexError(f"bit {index} of {self._size}")

    def set(self, index):
        self._check(index)
        self._bits[index >> 3] |= 1 << (index & 7)

    def batched_set(self, indices):
        for i in indices:
            if 0 <= i < self._size:
                self.set(i)

    def set_range(self, start, end):
        for i in range(start, min(end, self._size)):
            self.set(i)

    def clear(self, index):
        self._check(index)
        self._bits[index >> 3] &= ~(1 << (index & 7)) & 0xFF

    def test(self, index):
        self._check(index)
        return bool(self._bits[index >> 3] >> (index & 7) & 1)

    def popcount(self):
        return sum(bin(b).count("1") for b in self._bits)

    def count_leading_ones(self):
        n = 0
        while n < self._size and self.test(n):
            n += 1
        return n

    def count_leading_zeros(self):
        n = 0
        while n < self._size and not self.test(n):
            n += 1
        return n

    def get_indices_list(self):
        return [i for i in range(self._size) if self.test(i)]

    def get_indices_set(self):
        return set(self.get_indices_list())

    def gather(self, items):
        return [items[i] for i in self.get_indices_list()]

    def size(self):
        return self._size

    def __repr__(self):
        return "".join("1" if self.test(i) else "0" for i in range(self._size))
