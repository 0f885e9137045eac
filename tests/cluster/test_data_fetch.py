"""A miss fetched from its owners when the first owner misbehaves (docs/cluster.md, "Reads",
"Checksums"). The first owner of the keys is a stand-in (FakeOwner: a msgpack-rpc server in
the test that answers peer_get as the test tells it), the second a real daemon (node-1), and
node-0 (no owner) is read. Big values are received by node-0 straight into their
reservations and checksummed as they land, small ones through its buffer; both must hold:

  - values whose bytes are not what their CRC-32C covers (1 MiB, 300 KiB and 8 KiB): every
    read gets the right bytes from the next owner, each bad copy is counted and none is
    kept;
  - a reply stalled in the middle of a 1 MiB value past peer_timeout: the next owner
    answers; the rest of the stalled value arrives later and is dropped, and a value only
    the stand-in has is then fetched from it whole (the stream stayed in step);
  - a connection closed in the middle of a 1 MiB value: the next owner answers;
  - after each, no reservation is left behind on node-0 (stats "reserved" is 0).

Every value is checked against a SHA-256 digest; every wait is bounded.
"""

import hashlib
import os
import socket
import sys
import threading
import time

import msgpack
import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "integration"))
sys.path.insert(0, HERE)

import kvtest  # noqa: E402
from clusterlib import ViewPool, crc32c, wait_until  # noqa: E402
from place_ref import owners  # noqa: E402

pytestmark = pytest.mark.quick

class FakeOwner:
    """A stand-in pool member on 127.0.0.1:port. peer_put is acknowledged (nothing kept);
    peer_get answers each key by self.table[key] = (mode, value):
      "good"     [crc32c(value), value]
      "corrupt"  [0, value]: bytes that are not what the checksum covers
      "stall"    the reply up to the middle of value, then `stall` seconds, then the rest
      "cut"      the reply up to the middle of value, then the connection closed
    and a key not in the table as absent (nil). asked counts the keys asked for."""

    def __init__(self, stall=2.5):
        self.table = {}
        self.stall = stall
        self.asked = 0
        self.stalled = threading.Event()    # a stalled reply was finished
        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(8)
        self.port = self.sock.getsockname()[1]
        self.closed = False
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while not self.closed:
            try:
                s, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(s,), daemon=True).start()

    def _serve(self, s):
        up = msgpack.Unpacker(raw=False, max_buffer_size=64 << 20)
        try:
            while True:
                data = s.recv(1 << 20)
                if not data:
                    return
                up.feed(data)
                for msg in up:
                    if not self._answer(s, msg):
                        return
        except OSError:
            return
        finally:
            s.close()

    def _answer(self, s, msg):
        _, msgid, method, params = msg
        if method == "peer_put":
            s.sendall(msgpack.packb([1, msgid, None, [[0, c] for c in params[3]]]))
            return True
        if method != "peer_get":
            s.sendall(msgpack.packb([1, msgid, [2, "not here"], None]))
            return True
        keys = params[1]
        self.asked += len(keys)
        res, cut_at, mode = [], None, None
        for k in keys:
            m, v = self.table.get(bytes(k), (None, None))
            if m is None:
                res.append(None)
            elif m == "good":
                res.append([crc32c(v), v])
            else:
                res.append([0 if m == "corrupt" else crc32c(v), v])
                if m in ("stall", "cut") and cut_at is None:
                    cut_at, mode = v, m
        out = msgpack.packb([1, msgid, None, res], use_bin_type=True)
        if cut_at is None:
            s.sendall(out)
            return True
        mid = out.find(cut_at) + len(cut_at) // 2
        s.sendall(out[:mid])
        if mode == "cut":
            return False
        time.sleep(self.stall)
        s.sendall(out[mid:])
        self.stalled.set()
        return True

    def close(self):
        self.closed = True
        self.sock.close()


class FakeOwnerPool(ViewPool):
    """node-0 and node-1, real, and the FakeOwner 'fake' in one fixed view, R = 2."""

    def __init__(self, work, fake, extra=()):
        self.fake = fake
        super().__init__(work, 2, extra)

    def start(self, i, ready=True):
        self.view = ",".join([f"fake@127.0.0.1:{self.fake.port}"]
                             + [f"{nid}@127.0.0.1:{p}" for nid, p in zip(self.ids, self.ports)])
        return super().start(i, ready)

    def owner_ids(self, key):
        ids = ["fake"] + self.ids
        return [ids[i] for i in owners([(nid, 1.0) for nid in ids], key, self.replicas)]


@pytest.fixture
def fake_pool(view_pools):
    fakes = []

    def start(extra=()):
        fake = FakeOwner()
        fakes.append(fake)
        return view_pools(FakeOwnerPool, fake, extra)

    yield start
    for f in fakes:
        f.close()


def keys_owned_by_fake_then_node1(p, n, tag):
    ks = [k for k in (b"fetch-%s-%d" % (tag, i) for i in range(2000))
          if p.owner_ids(k) == ["fake", "node-1"]][:n]
    assert len(ks) == n, f"placement gave fewer than {n} of 2000 keys the owners [fake, node-1]"
    return ks


def digest(v):
    return hashlib.sha256(v).digest() if v is not None else None


def test_values_that_fail_their_checksum_are_fetched_from_the_next_owner(fake_pool):
    p = fake_pool()
    keys = keys_owned_by_fake_then_node1(p, 4, b"crc")
    vals = {k: os.urandom(size) for k, size in zip(keys, (1 << 20, (1 << 20) + 1, 300000, 8192))}
    c1 = p.daemons[1].tcp()
    assert c1.call("batch_put", keys, [vals[k] for k in keys]) == [0] * len(keys)
    for k in keys:
        p.fake.table[k] = ("corrupt", os.urandom(len(vals[k])))
    c0 = p.daemons[0].tcp()
    got = c0.call("batch_get", keys)
    assert [digest(v) for v in got] == [digest(vals[k]) for k in keys]
    assert p.fake.asked == len(keys)
    assert p.metric(0, "kvstash_cluster_checksum_mismatches_total") == len(keys)
    assert p.metric(0, "kvstash_cluster_remote_hits_total") == len(keys)
    # node-0 kept the good copies (and nothing of the bad ones), with no reservation left
    assert p.has(0, keys) == [True] * len(keys)
    assert c0.call("stats")["reserved"] == 0
    assert [digest(c0.call("get", k)) for k in keys] == [digest(vals[k]) for k in keys]
    assert p.fake.asked == len(keys), "a key kept here was asked of its owners again"


def test_a_reply_stalled_or_cut_mid_value_goes_to_the_next_owner(fake_pool):
    p = fake_pool(extra=["--peer_timeout=1s"])
    stall, only_fake, cut = keys_owned_by_fake_then_node1(p, 3, b"cut")
    vals = {k: os.urandom((1 << 20) + 4099 * i) for i, k in enumerate((stall, only_fake, cut))}
    c1 = p.daemons[1].tcp()
    assert c1.call("batch_put", [stall, cut], [vals[stall], vals[cut]]) == [0, 0]
    p.fake.table[stall] = ("stall", vals[stall])
    p.fake.table[only_fake] = ("good", vals[only_fake])     # node-1 does not have it
    p.fake.table[cut] = ("cut", vals[cut])
    c0 = p.daemons[0].tcp()

    # stalled past peer_timeout: node-1 answers; the stalled value's rest is dropped
    assert digest(c0.call("get", stall)) == digest(vals[stall])
    assert p.metric(0, "kvstash_cluster_peer_timeouts_total") >= 1
    assert p.fake.stalled.wait(30), "the stand-in never finished its stalled reply"
    wait_until(lambda: c0.call("stats")["reserved"] == 0, "node-0's reservations to go")
    # a value only the stand-in has comes whole from it after the dropped one
    assert digest(c0.call("get", only_fake)) == digest(vals[only_fake])
    assert p.has(0, [only_fake]) == [True]

    # the connection closed mid-value: node-1 answers, nothing is left reserved
    assert digest(c0.call("get", cut)) == digest(vals[cut])
    assert c0.call("stats")["reserved"] == 0
    assert p.metric(0, "kvstash_cluster_checksum_mismatches_total") == 0
    assert p.metric(0, "kvstash_cluster_remote_hits_total") == 3
    kvtest.Client.tcp(p.ports[0]).close()
