"""Stand-in for lmcache.v1.memory_management: the memory objects LMCache's L1 hands its L2
adapters. An object is get_size() bytes at data_ptr, inside the L1 arena; byte_array is a
writable byte view of them (LMCache's is ctypes-backed, itemsize 1)."""

import ctypes


class MemoryObj:
    def get_size(self):
        raise NotImplementedError

    @property
    def data_ptr(self):
        raise NotImplementedError

    @property
    def byte_array(self):
        raise NotImplementedError


class HostMemoryObj(MemoryObj):
    """size bytes at address ptr, which the caller keeps alive (the L1 arena)."""

    def __init__(self, ptr, size):
        self._ptr, self._size = ptr, size

    def get_size(self):
        return self._size

    def get_physical_size(self):
        return self._size

    @property
    def data_ptr(self):
        return self._ptr

    @property
    def byte_array(self):
        return memoryview((ctypes.c_ubyte * self._size).from_address(self._ptr)).cast("B")

    @property
    def tensor(self):
        return None
