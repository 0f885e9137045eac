"""Stand-in for lmcache.v1.distributed.l2_adapters.base: the interface LMCache's store and
prefetch controllers drive (three event fds; store, lookup-and-lock, unlock, load; close),
the optional delete / get_usage / report_status, and the byte accounting the base class
keeps from _notify_keys_stored / _notify_keys_deleted."""

import threading
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from types import MappingProxyType

L2TaskId = int


@dataclass(frozen=True)
class AdapterUsage:
    total_bytes_used: int
    total_capacity_bytes: int
    bytes_by_cache_salt: object = field(default_factory=lambda: MappingProxyType({}))

    @property
    def usage_fraction(self):
        if self.total_capacity_bytes <= 0:
            return -1.0
        return self.total_bytes_used / self.total_capacity_bytes


class L2AdapterInterface(ABC):
    def __init__(self, max_capacity_bytes=0):
        self._listeners = []
        self._max_capacity_bytes = max_capacity_bytes
        self._total_bytes_used = 0
        self._bytes_by_cache_salt = {}
        self._usage_lock = threading.Lock()
        self.accessed = []      # test hook: keys _notify_keys_accessed saw

    @abstractmethod
    def get_store_event_fd(self): ...

    @abstractmethod
    def get_lookup_and_lock_event_fd(self): ...

    @abstractmethod
    def get_load_event_fd(self): ...

    @abstractmethod
    def submit_store_task(self, keys, objects): ...

    @abstractmethod
    def pop_completed_store_tasks(self): ...

    @abstractmethod
    def submit_lookup_and_lock_task(self, keys, group_layout_descs): ...

    @abstractmethod
    def query_lookup_and_lock_result(self, task_id): ...

    @abstractmethod
    def submit_unlock(self, keys): ...

    @abstractmethod
    def submit_load_task(self, keys, objects): ...

    @abstractmethod
    def query_load_result(self, task_id): ...

    @abstractmethod
    def close(self): ...

    def register_listener(self, listener):
        self._listeners.append(listener)

    def _notify_keys_stored(self, keys, sizes):
        with self._usage_lock:
            for key, size in zip(keys, sizes, strict=True):
                self._total_bytes_used += size
                self._bytes_by_cache_salt[key.cache_salt] = \
                    self._bytes_by_cache_salt.get(key.cache_salt, 0) + size

    def _notify_keys_accessed(self, keys):
        self.accessed.extend(keys)

    def _notify_keys_deleted(self, keys, sizes):
        with self._usage_lock:
            for key, size in zip(keys, sizes, strict=True):
                self._total_bytes_used = max(0, self._total_bytes_used - size)
                left = self._bytes_by_cache_salt.get(key.cache_salt, 0) - size
                if left <= 0:
                    self._bytes_by_cache_salt.pop(key.cache_salt, None)
                else:
                    self._bytes_by_cache_salt[key.cache_salt] = left

    @property
    def supports_global_eviction(self):
        return self._max_capacity_bytes > 0

    def delete(self, keys):
        return None

    def get_usage(self):
        with self._usage_lock:
            return AdapterUsage(self._total_bytes_used, self._max_capacity_bytes,
                                MappingProxyType(dict(self._bytes_by_cache_salt)))

    def report_status(self):
        return {"is_healthy": True, "extra_warning": "default"}
