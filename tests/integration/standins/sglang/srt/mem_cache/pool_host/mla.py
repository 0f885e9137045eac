"""Stand-in of MLATokenToKVPoolHost: one buffer of the latent (kv_lora_rank +
qk_rope_head_dim) per token and layer, in the layouts layer_first (layer, token, 1, dim),
page_first (token, layer, 1, dim) and page_first_direct (page, layer, token-in-page, 1,
dim); get_page_buffer_meta gives one pointer per page (per layer for layer_first)."""

from .base import HostKVCache


class MLATokenToKVPoolHost(HostKVCache):
    def __init__(self, layer_num, kv_cache_dim, page_size, page_num, layout, dtype=None,
                 allocator_type="shm"):
        self.kv_cache_dim = kv_cache_dim
        kw = {} if dtype is None else {"dtype": dtype}
        super().__init__(layer_num, page_size, page_num, layout, allocator_type=allocator_type,
                         **kw)

    def get_size_per_token(self):
        return self.kv_cache_dim * self.dtype.itemsize * self.layer_num

    def get_ksize_per_token(self):
        return self.get_size_per_token()

    def init_kv_buffer(self):
        if self.layout == "layer_first":
            dims = (self.layer_num, self.size, 1, self.kv_cache_dim)
        elif self.layout == "page_first":
            dims = (self.size, self.layer_num, 1, self.kv_cache_dim)
        elif self.layout == "page_first_direct":
            dims = (self.page_num, self.layer_num, self.page_size, 1, self.kv_cache_dim)
        else:
            raise ValueError(f"Unsupported layout: {self.layout}")
        return self.allocator.allocate(dims, self.dtype)

    def get_hybrid_pool_buffer(self):
        return [self.kv_buffer]

    def get_data_page(self, index, flat=True):
        if self.layout == "layer_first":
            page = self.kv_buffer[:, index:index + self.page_size]
        elif self.layout == "page_first":
            page = self.kv_buffer[index:index + self.page_size]
        else:
            real = index // self.page_size
            page = self.kv_buffer[real:real + 1]
        return page.flatten() if flat else page

    def get_page_buffer_meta(self, indices):
        assert len(indices) % self.page_size == 0
        base = self.kv_buffer.ctypes.data
        item = self.dtype.itemsize
        indices = indices.tolist()
        ptrs = []
        if self.layout == "layer_first":
            for i in range(0, len(indices), self.page_size):
                for layer in range(self.layer_num):
                    ptrs.append(base + indices[i] * self.kv_cache_dim * item
                                + layer * self.size * self.kv_cache_dim * item)
            size = item * self.page_size * self.kv_cache_dim
        elif self.layout in ("page_first", "page_first_direct"):
            for i in range(0, len(indices), self.page_size):
                ptrs.append(base + indices[i] * self.layer_num * self.kv_cache_dim * item)
            size = self.layer_num * item * self.page_size * self.kv_cache_dim
        else:
            raise ValueError(f"Unsupported layout: {self.layout}")
        return ptrs, [size] * len(ptrs)
