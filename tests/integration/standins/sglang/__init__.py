"""Stand-ins for the few pieces of SGLang that kvstash.sglang touches, so the adapter can be
driven here without SGLang, torch or a GPU (tests/integration/test_sglang.py,
tests/bench/bench_sglang.py). Written from SGLang's source (the files and versions are
listed in docs/sglang.md, "Version matched"): the same class names, constructor arguments
of the storage side, page layouts and pointer arithmetic, with numpy arrays in place of
torch tensors. Only what the adapter reaches is here, in our own words.
"""
