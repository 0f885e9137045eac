from .base import HostKVCache
from .common import HostTensorAllocator, ShmHostTensorAllocator
from .mha import MHATokenToKVPoolHost
from .mla import MLATokenToKVPoolHost

__all__ = ["HostKVCache", "HostTensorAllocator", "ShmHostTensorAllocator",
           "MHATokenToKVPoolHost", "MLATokenToKVPoolHost"]
