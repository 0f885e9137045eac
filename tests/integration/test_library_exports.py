"""Integration: libkvstash.so exports kvstash.h's calls and nothing else.

The library is built from modules it shares with the daemon (frame, mp, kverr,
tcpopt, rdma). A program that links it and has, say, its own frame_scan or
mp_skip must not get ours instead: the shared library keeps them local
(protocol/libkvstash.map). Loaded with ctypes, next to $KVSTASHD.
"""

import ctypes
import pathlib
import re

import pytest

from test_python_client import KVSTASHD, ROOT

LIB = pathlib.Path(KVSTASHD).resolve().parent / "libkvstash.so"


def public_calls():
    """Every function kvstash.h declares (name followed by an argument list)."""
    text = (ROOT / "protocol" / "kvstash.h").read_text()
    text = re.sub(r"/\*.*?\*/", "", text, flags=re.S)
    return sorted(set(re.findall(r"\b(kvstash_[a-z0-9_]+)\s*\(", text)))


@pytest.fixture(scope="module")
def lib():
    if not LIB.exists():
        pytest.fail(f"no {LIB} (build it with make)")
    return ctypes.CDLL(str(LIB))


def test_every_public_call_is_exported(lib):
    names = public_calls()
    assert len(names) > 30, names
    missing = [n for n in names if not hasattr(lib, n)]
    assert missing == []


@pytest.mark.parametrize("name", [
    "frame_scan", "mp_skip", "mp_read_key", "kv_strerror", "kv_errname", "tcpopt_same_host",
    "rdma_dev_open", "rdma_emu_ops", "kvstash_wire_recv", "kvstash_buffer_link",
])
def test_internal_symbols_stay_inside(lib, name):
    assert not hasattr(lib, name), f"libkvstash.so exports the internal {name}"
