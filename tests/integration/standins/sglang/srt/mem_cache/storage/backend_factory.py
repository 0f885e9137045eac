"""Stand-in of StorageBackendFactory's "dynamic" path: import module_path, check the class
subclasses HiCacheStorage, construct it as cls(storage_config, kwargs) with kwargs a dict."""

import importlib

from sglang.srt.mem_cache.hicache_storage import HiCacheStorage


class StorageBackendFactory:
    @classmethod
    def create_backend(cls, backend_name, storage_config, mem_pool_host, **kwargs):
        if backend_name != "dynamic" or storage_config.extra_config is None:
            raise ValueError(f"Unknown storage backend '{backend_name}'")
        cfg = storage_config.extra_config
        for field in ("backend_name", "module_path", "class_name"):
            if field not in cfg:
                raise ValueError(f"Missing required field '{field}'")
        backend_class = getattr(importlib.import_module(cfg["module_path"]), cfg["class_name"])
        if not issubclass(backend_class, HiCacheStorage):
            raise TypeError(f"Backend class {cfg['class_name']} must inherit from HiCacheStorage")
        return backend_class(storage_config, kwargs)
