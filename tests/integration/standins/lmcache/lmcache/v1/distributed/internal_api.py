"""Stand-in for lmcache.v1.distributed.internal_api: the L1 arena's description given to L2
adapters at construction, and a store task's result (an int: bytes moved, or -1 failed)."""

from dataclasses import dataclass


@dataclass(frozen=True)
class L1MemoryDesc:
    ptr: int
    size: int
    align_bytes: int
    stable_registration_size: int = None


class L2StoreResult(int):
    def __new__(cls, success, bytes_transferred):
        if bytes_transferred < 0:
            raise ValueError("bytes_transferred must be >= 0")
        return super().__new__(cls, bytes_transferred if success else -1)

    def is_successful(self):
        return int(self) >= 0

    def bytes_transferred(self):
        return max(int(self), 0)
