"""Stand-in for lmcache.v1.distributed.api: ObjectKey and MemoryLayoutDesc, the fields and
checks the L2 adapters rely on ('@' is the field separator of serialized keys, so neither
model_name nor cache_salt may contain it)."""

from dataclasses import dataclass


@dataclass(frozen=True)
class ObjectKey:
    chunk_hash: bytes
    model_name: str
    kv_rank: int
    object_group_id: int = 0
    cache_salt: str = ""

    def __post_init__(self):
        if "@" in self.model_name:
            raise ValueError("model_name must not contain '@'")
        if self.object_group_id < 0:
            raise ValueError("object_group_id must be >= 0")
        if set(self.cache_salt) & set("@/\\\x00"):
            raise ValueError("bad cache_salt")
        if len(self.cache_salt) > 128:
            raise ValueError("cache_salt too long")

    @staticmethod
    def ComputeKVRank(world_size, global_rank, local_world_size, local_rank):
        return (world_size << 24) | (global_rank << 16) | (local_world_size << 8) | local_rank


@dataclass(frozen=True)
class MemoryLayoutDesc:
    shapes: list
    dtypes: list
