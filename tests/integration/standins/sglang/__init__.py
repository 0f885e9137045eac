"""Stand-ins for the few pieces of SGLang that kvstash.sglang touches, so the adapter can be
driven here without SGLang, torch or a GPU (tests/integration/test_sglang.py,
tests/bench/bench_sglang.py). Written from SGLang's source at commit 001067ff
(python/sglang/srt/mem_cache/hicache_storage.py, storage/backend_factory.py) and the
pool_host package read at the same time (pool_host/common.py, mha.py, mla.py,
storage/mmap.py's alloc_shm): the same class names, constructor arguments, page layouts
and pointer arithmetic, with numpy arrays in place of torch tensors. Only what the adapter
reaches is here; nothing of SGLang's own code.
"""
