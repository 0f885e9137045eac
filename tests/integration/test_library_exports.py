"""Integration: libkvstash.so exports kvstash.h's calls and nothing else.

The library is built from modules it shares with the daemon (frame, mp, kverr,
tcpopt, rdma). A program that links it and has, say, its own frame_scan or
mp_skip must not get ours instead: the shared library keeps them local
(client/libkvstash.map). Read from the library's dynamic symbol table with
nm (binutils, part of build-essential), not by loading it: an ASan build
cannot be loaded into an uninstrumented Python.
"""

import pathlib
import re
import subprocess

import pytest

from kvtest import KVSTASHD, ROOT

LIB = pathlib.Path(KVSTASHD).resolve().parent / "libkvstash.so"


def public_calls():
    """Every function kvstash.h declares (name followed by an argument list)."""
    text = (ROOT / "client" / "kvstash.h").read_text()
    text = re.sub(r"/\*.*?\*/", "", text, flags=re.S)
    return set(re.findall(r"\b(kvstash_[a-z0-9_]+)\s*\(", text))


@pytest.fixture(scope="module")
def exported():
    """The names libkvstash.so defines in its dynamic symbol table."""
    if not LIB.exists():
        pytest.fail(f"no {LIB} (build it with make)")
    out = subprocess.run(["nm", "-D", "--defined-only", str(LIB)], check=True,
                         capture_output=True, text=True, timeout=30).stdout
    return {line.split()[-1].split("@")[0] for line in out.splitlines() if line.strip()}


def test_every_public_call_is_exported(exported):
    names = public_calls()
    assert len(names) > 30, names
    assert sorted(names - exported) == []


def test_nothing_else_is_exported(exported):
    """Only kvstash.h's calls (the toolchain may add its own _init/_fini and the like)."""
    ours = {n for n in exported if not n.startswith("_")}
    assert sorted(ours - public_calls()) == []


@pytest.mark.parametrize("name", [
    "frame_scan", "mp_skip", "mp_read_key", "kv_strerror", "kv_errname", "tcpopt_same_host",
    "rdma_dev_open", "rdma_emu_ops", "kvstash_wire_recv", "kvstash_buffer_link",
])
def test_internal_symbols_stay_inside(exported, name):
    assert name not in exported, f"libkvstash.so exports the internal {name}"
