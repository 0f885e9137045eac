"""Stand-in of pool_host/base.py's HostKVCache: page_size, layout, dtype, size, page_num,
kv_buffer and allocator, as the storage backends read them. The constructor takes the
shape directly (SGLang derives it from the device pool)."""

import numpy as np

from .common import get_allocator_from_storage


class DType:
    """What the adapter reads of a torch dtype: str() ("torch.bfloat16") and itemsize."""

    def __init__(self, name, np_dtype):
        self.name, self.np = name, np.dtype(np_dtype)
        self.itemsize = self.np.itemsize

    def __str__(self):
        return f"torch.{self.name}"


bfloat16 = DType("bfloat16", np.uint16)     # numpy has no bfloat16: same size, same bytes
float16 = DType("float16", np.float16)
float8_e4m3fn = DType("float8_e4m3fn", np.uint8)


class HostKVCache:
    def __init__(self, layer_num, page_size, page_num, layout, dtype=bfloat16,
                 allocator_type="shm"):
        self.layer_num = layer_num
        self.page_size = page_size
        self.page_num = page_num
        self.size = page_num * page_size
        self.layout = layout
        self.dtype = dtype
        self.allocator = get_allocator_from_storage(allocator_type)
        self.kv_buffer = self.init_kv_buffer()

    def close(self):
        close = getattr(self.allocator, "close", None)
        if close:
            close()

    def page_indices(self, pages):
        """Stand-in only: host indices (token slots) of whole pages, as SGLang's allocator
        hands them out."""
        return np.concatenate([np.arange(p * self.page_size, (p + 1) * self.page_size,
                                         dtype=np.int64) for p in pages]) \
            if len(pages) else np.zeros(0, dtype=np.int64)

    def fill_random(self, seed):
        """Stand-in only: random bytes over the whole pool."""
        raw = self.kv_buffer.view(np.uint8).reshape(-1)
        raw[:] = np.random.default_rng(seed).integers(0, 256, raw.size, dtype=np.uint8)

    def zero(self):
        self.kv_buffer.view(np.uint8).reshape(-1)[:] = 0
