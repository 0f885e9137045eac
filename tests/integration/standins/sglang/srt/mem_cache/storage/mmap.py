"""Stand-in of alloc_shm: a memfd made with MFD_CLOEXEC alone (so it can never be sealed),
sized up to whole pages, mapped MAP_SHARED; returns (array, fd, mm) as SGLang does (a numpy
array where SGLang has a torch tensor)."""

import math
import mmap
import os
import uuid

import numpy as np


def alloc_shm(dims, dtype, memfd_flags=None):
    """memfd_flags: the stand-in's one addition, for tests that need a sealable memfd
    (os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING); SGLang always uses MFD_CLOEXEC."""
    npd = np.dtype(getattr(dtype, "np", dtype))
    n_bytes = math.prod(dims) * npd.itemsize
    alloc_bytes = math.ceil(n_bytes / mmap.PAGESIZE) * mmap.PAGESIZE
    flags = os.MFD_CLOEXEC if memfd_flags is None else memfd_flags
    fd = os.memfd_create(f"sglang_host_pool_{uuid.uuid4().hex}", flags)
    try:
        os.ftruncate(fd, alloc_bytes)
        mm = mmap.mmap(fd, alloc_bytes, flags=mmap.MAP_SHARED,
                       prot=mmap.PROT_READ | mmap.PROT_WRITE)
    except BaseException:
        os.close(fd)
        raise
    arr = np.frombuffer(mm, dtype=npd, count=math.prod(dims)).reshape(dims)
    return arr, fd, mm
