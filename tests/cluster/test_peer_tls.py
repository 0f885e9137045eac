"""TLS between peers (docs/cluster.md, "Peer connections"): members with certificates dial
the peers that advertise a TLS listener over TLS. A real etcd and daemons on 127.0.0.x,
R = 2; every value checked against a table of SHA-256 digests, every wait bounded.

The members advertise a plain address nothing listens on (peer_advertise to a closed port),
so whatever reaches a peer went over TLS:

  - three members with certificates of one CA (tls_ca_file: each side checks the other's):
    a put reaches its owners and a miss is served by an owner;
  - a member whose certificate another CA signed is refused by its peers' TLS listeners:
    nothing it sends is stored there, and their keys are misses on it; the others go on.
"""

import hashlib
import os
import subprocess

import pytest

from clusterlib import free_port
from place_ref import owners
from test_tls import make_cert, openssl  # the same certificates as the TLS port's tests

R = 2


SAN = ",".join(f"IP:127.0.0.{i}" for i in range(2, 8))    # every member's address


def make_ca(d, name):
    openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", f"{name}.key", "-out",
            f"{name}.pem", "-days", "2", "-subj", f"/CN=kvstash test {name}", cwd=d)


@pytest.fixture
def pki(work):
    if subprocess.run(["which", "openssl"], capture_output=True).returncode != 0:
        pytest.skip("no openssl command (apt-get install openssl, or make deps)")
    d = os.path.join(work, "pki")
    os.makedirs(d)
    make_ca(d, "ca")
    make_ca(d, "other-ca")
    make_cert(d, "member", ca="ca", cn="member", san=SAN)
    make_cert(d, "rogue", ca="other-ca", cn="rogue", san=SAN)
    return d


def start_member(pool, pki, cert, i):
    host = f"127.0.0.{i + 1}"
    return pool.start(host=host, args=[
        f"--tls_listen={host}:{free_port(host)}", f"--tls_cert_file={pki}/{cert}.pem",
        f"--tls_key_file={pki}/{cert}.key", f"--tls_ca_file={pki}/ca.pem",
        f"--peer_advertise={host}:{free_port(host)}"])     # nothing listens there


def test_members_with_certificates_talk_over_tls_and_a_stranger_is_refused(pool, pki):
    nodes = [start_member(pool, pki, "member", i) for i in (1, 2, 3)]
    pool.wait_view(3)
    info = nodes[0].info()
    assert all(n["tls"].startswith("127.0.0.") for n in info["nodes"]), info["nodes"]
    ids = [n.node_id for n in nodes]

    def own(key, members=ids):
        return [members[i] for i in owners([(m, 1.0) for m in members], key, R)]

    # 20 KB to 250 KB: a fetch's values both buffered and read into their reservations
    vals = {b"tls-%d" % i: os.urandom(20000 + 9973 * i) for i in range(24)}
    digest = {k: hashlib.sha256(v).digest() for k, v in vals.items()}
    c1 = nodes[0].tcp()
    assert c1.call("batch_put", list(vals), list(vals.values())) == [0] * len(vals)
    by_id = dict(zip(ids, nodes))
    for k in vals:       # write_ack all: every owner answered before the reply
        for o in own(k):
            assert by_id[o].call("peer_exists", 0, [k]) == [True], (k, o)
    far = [k for k in vals if "n3" not in own(k)]
    assert far
    c3 = nodes[2].tcp()
    for k in far:
        got = c3.call("get", k)
        assert got is not None and hashlib.sha256(got).digest() == digest[k], k

    # a fourth member with a certificate of another CA
    rogue = start_member(pool, pki, "rogue", 4)
    pool.wait_view(4)
    ids4 = ids + [rogue.node_id]
    mine = [k for k in (b"rogue-%d" % i for i in range(200))
            if rogue.node_id not in own(k, ids4)][:8]
    assert len(mine) == 8
    rv = {k: os.urandom(5000) for k in mine}
    cr = rogue.tcp()
    assert cr.call("batch_put", mine, [rv[k] for k in mine]) == [0] * len(mine)
    for k in mine:
        assert cr.call("get", k) == rv[k]            # kept where it was written
        for o in own(k, ids4):
            assert by_id[o].call("peer_exists", 0, [k]) == [False], (k, o)
    # TLS 1.3: its handshake ends before the peer checks its certificate; the peer's alert
    # comes with the first reply
    assert "TLS: " in rogue.output() or "TLS handshake failed" in rogue.output(), rogue.tail()
    # the others' keys are misses on it (never wrong bytes); the others still serve them
    theirs = [k for k in vals if rogue.node_id not in own(k, ids4)][:6]
    for k in theirs:
        assert cr.call("get", k) is None, k
        got = c3.call("get", k)
        assert got is not None and hashlib.sha256(got).digest() == digest[k], k
