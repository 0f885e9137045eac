"""Stand-in of MHATokenToKVPoolHost: one (2, ...) buffer, K then V, in the layouts
layer_first (2, layer, token, head, dim), page_first (2, token, layer, head, dim) and
page_first_direct (2, page, layer, token-in-page, head, dim); get_page_buffer_meta gives,
per page, K and V pointers (per layer for layer_first), as SGLang's does."""

from .base import HostKVCache


class MHATokenToKVPoolHost(HostKVCache):
    def __init__(self, layer_num, head_num, head_dim, page_size, page_num, layout,
                 dtype=None, allocator_type="shm"):
        self.head_num, self.head_dim = head_num, head_dim
        kw = {} if dtype is None else {"dtype": dtype}
        super().__init__(layer_num, page_size, page_num, layout, allocator_type=allocator_type,
                         **kw)

    def get_size_per_token(self):
        return self.head_dim * self.head_num * self.layer_num * self.dtype.itemsize * 2

    def get_ksize_per_token(self):
        return self.get_size_per_token() // 2

    def init_kv_buffer(self):
        if self.layout == "layer_first":
            dims = (2, self.layer_num, self.size, self.head_num, self.head_dim)
        elif self.layout == "page_first":
            dims = (2, self.size, self.layer_num, self.head_num, self.head_dim)
        elif self.layout == "page_first_direct":
            dims = (2, self.page_num, self.layer_num, self.page_size, self.head_num,
                    self.head_dim)
        else:
            raise ValueError(f"Unsupported layout: {self.layout}")
        return self.allocator.allocate(dims, self.dtype)

    @property
    def k_buffer(self):
        return self.kv_buffer[0]

    @property
    def v_buffer(self):
        return self.kv_buffer[1]

    def get_hybrid_pool_buffer(self):
        return [self.k_buffer, self.v_buffer]

    def get_data_page(self, index, flat=True):
        if self.layout == "layer_first":
            page = self.kv_buffer[:, :, index:index + self.page_size]
        elif self.layout == "page_first":
            page = self.kv_buffer[:, index:index + self.page_size]
        else:
            real = index // self.page_size
            page = self.kv_buffer[:, real:real + 1]
        return page.flatten() if flat else page

    def get_page_buffer_meta(self, indices):
        assert len(indices) % self.page_size == 0
        base = self.kv_buffer.ctypes.data
        item = self.dtype.itemsize
        indices = indices.tolist()
        v_offset = self.layer_num * self.size * self.head_num * self.head_dim * item
        ptrs = []
        if self.layout == "layer_first":
            for i in range(0, len(indices), self.page_size):
                for layer in range(self.layer_num):
                    k = (base + indices[i] * self.head_num * self.head_dim * item
                         + layer * self.size * self.head_num * self.head_dim * item)
                    ptrs += [k, k + v_offset]
            size = item * self.page_size * self.head_num * self.head_dim
        elif self.layout in ("page_first", "page_first_direct"):
            for i in range(0, len(indices), self.page_size):
                k = base + indices[i] * self.layer_num * self.head_num * self.head_dim * item
                ptrs += [k, k + v_offset]
            size = self.layer_num * item * self.page_size * self.head_num * self.head_dim
        else:
            raise ValueError(f"Unsupported layout: {self.layout}")
        return ptrs, [size] * len(ptrs)
