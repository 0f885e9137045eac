"""The placement function has two implementations written from place.h's specification:
src/cluster/place.c (pinned by tests/unit/test_place.c's golden vectors) and place_ref.py.
Both must give the golden vectors; the daemons' placement is compared with place_ref in
test_membership.py."""

import os
import re
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))
import place_ref  # noqa: E402

ROOT = os.path.join(os.path.dirname(__file__), "..", "..")
ROW = re.compile(r'\{(EQUAL|WEIGHTED),\s*((?:"[^"]*"\s*)+),\s*(\d+),\s*(\d+),\s*(\d+),'
                 r'\s*\{(\d+), (\d+), (\d+)\}\}')


def golden_rows():
    with open(os.path.join(ROOT, "tests", "unit", "test_place.c")) as f:
        text = f.read()
    body = text[text.index("GOLDEN-BEGIN"):text.index("GOLDEN-END")]
    rows = []
    for m in ROW.finditer(body):
        key = b"".join(bytes.fromhex(s.replace("\\x", "")) for s in re.findall(r'"([^"]*)"',
                                                                          m.group(2)))
        assert len(key) == int(m.group(3))
        count = int(m.group(5))
        rows.append((m.group(1), key, int(m.group(4)),
                     [int(m.group(6 + i)) for i in range(count)]))
    return rows


@pytest.mark.quick
def test_reference_gives_the_golden_vectors():
    rows = golden_rows()
    assert len(rows) == 42
    for name, key, r, owners in rows:
        nodes = place_ref.NODES_EQUAL if name == "EQUAL" else place_ref.NODES_WEIGHTED
        assert place_ref.owners(nodes, key, r) == owners, (name, key, r)


@pytest.mark.quick
def test_reference_hash_values():
    assert place_ref.place_hash(b"") == 0xefd01f60ba992926
    assert place_ref.place_hash(b"node-0") == 0x74bd04f6e09fed6d
    assert place_ref.place_pair(place_ref.place_hash(b"node-0"),
                                place_ref.place_hash(b"key-1")) == 0xf62fcae87b6b7a78
