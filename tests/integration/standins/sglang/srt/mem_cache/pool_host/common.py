"""Stand-in of pool_host/common.py: the default allocator (anonymous shared mmap) and
ShmHostTensorAllocator, which keeps each allocation's memfd in .fds (and mapping in .mms)."""

import math
import mmap
import os

import numpy as np


class HostTensorAllocator:
    def __init__(self):
        self.dtype = None
        self.dims = None

    def allocate(self, dims, dtype, device="cpu"):
        self.dtype, self.dims = dtype, dims
        npd = np.dtype(getattr(dtype, "np", dtype))
        n = math.ceil(math.prod(dims) * npd.itemsize / mmap.PAGESIZE) * mmap.PAGESIZE
        mm = mmap.mmap(-1, n, flags=mmap.MAP_SHARED | mmap.MAP_ANONYMOUS)
        return np.frombuffer(mm, dtype=npd, count=math.prod(dims)).reshape(dims)


class ShmHostTensorAllocator(HostTensorAllocator):
    memfd_flags = None      # stand-in only: None = SGLang's MFD_CLOEXEC

    def __init__(self):
        super().__init__()
        self.fds = []
        self.mms = []

    @property
    def fd(self):
        return self.fds[0] if self.fds else None

    def allocate(self, dims, dtype, device="cpu"):
        self.dtype, self.dims = dtype, dims
        from sglang.srt.mem_cache.storage.mmap import alloc_shm

        arr, fd, mm = alloc_shm(dims, dtype, self.memfd_flags)
        self.fds.append(fd)
        self.mms.append(mm)
        return arr

    def close(self):
        """Stand-in only (SGLang closes them in __del__)."""
        for fd in self.fds:
            try:
                os.close(fd)
            except OSError:
                pass
        self.fds = []


def get_allocator_from_storage(allocator_type):
    if allocator_type == "shm":
        return ShmHostTensorAllocator()
    if allocator_type == "shm_sealable":   # stand-in only: a memfd the client can seal
        a = ShmHostTensorAllocator()
        a.memfd_flags = os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING
        return a
    return HostTensorAllocator()
