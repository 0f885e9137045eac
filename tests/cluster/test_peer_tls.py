"""TLS between peers (docs/cluster.md, "Peer connections"): members with certificates dial
the peers that advertise a TLS listener over TLS. A real etcd and daemons on 127.0.0.x,
R = 2; every value checked against a table of SHA-256 digests, every wait bounded.

The members advertise a plain address nothing listens on (peer_advertise to a closed port),
so whatever reaches a peer went over TLS:

  - three members with certificates of one CA (tls_ca_file: each side checks the other's):
    a put reaches its owners and a miss is served by an owner;
  - a member whose certificate another CA signed is refused by its peers' TLS listeners:
    nothing it sends is stored there, and their keys are misses on it; the others go on;
  - a member whose certificate chains to the CA but names another host than its
    peer_advertise is refused by the members that dial it (logged, counted on /metrics as
    kvstash_cluster_peer_tls_refused_total{reason="name"}): nothing is stored at it, while
    what it sends to the others (whose certificates name their hosts) is;
  - SIGHUP: the stranger's files replaced by a certificate of the pool's CA and reloaded:
    its new peer connections present it, and its puts reach their owners, no restart.
"""

import hashlib
import os
import shutil
import signal

import pytest

from clusterlib import free_port, make_pki, metric_total, wait_until
from place_ref import owners

R = 2


SAN = ",".join(f"IP:127.0.0.{i}" for i in range(2, 8))    # every member's address


@pytest.fixture
def pki(work):
    return make_pki(work, [("member", "ca", "member", SAN),
                           ("rogue", "other-ca", "rogue", SAN),
                           ("liar", "ca", "liar", "IP:127.0.0.99,DNS:elsewhere.example")])


def start_member(pool, pki, cert, i, metrics=False):
    host = f"127.0.0.{i + 1}"
    args = [f"--tls_listen={host}:{free_port(host)}", f"--tls_cert_file={pki}/{cert}.pem",
            f"--tls_key_file={pki}/{cert}.key", f"--tls_ca_file={pki}/ca.pem",
            f"--peer_advertise={host}:{free_port(host)}"]     # nothing listens there
    if metrics:
        port = free_port(host)
        args.append(f"--metrics_listen={host}:{port}")
    n = pool.start(host=host, args=args)
    n.metrics_port = port if metrics else None
    return n


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


def test_a_certificate_for_another_host_is_refused_and_counted(pool, pki):
    nodes = [start_member(pool, pki, "member", i, metrics=True) for i in (1, 2, 3)]
    liar = start_member(pool, pki, "liar", 4, metrics=True)    # ca's, but for 127.0.0.99
    pool.wait_view(4)
    ids = [n.node_id for n in nodes] + [liar.node_id]
    by_id = dict(zip(ids, nodes + [liar]))

    def own(key):
        return [ids[i] for i in owners([(m, 1.0) for m in ids], key, R)]

    def refused(n, reason):
        return metric_total(n.metrics_port, "kvstash_cluster_peer_tls_refused_total{reason="
                            f'"{reason}"' + "}", host=n.host)

    assert all(refused(n, "name") == 0 for n in nodes + [liar])
    # keys n1 writes that the liar owns: n1 dials the liar and refuses its certificate
    to_liar = [k for k in (b"liar-%d" % i for i in range(400))
               if liar.node_id in own(k) and nodes[0].node_id not in own(k)][:8]
    assert len(to_liar) == 8
    vals = {k: os.urandom(7000) for k in to_liar}
    c1 = nodes[0].tcp()
    assert c1.call("batch_put", to_liar, [vals[k] for k in to_liar]) == [0] * len(to_liar)
    wait_until(lambda: refused(nodes[0], "name") >= 1, "n1 counting the liar's refusal")
    assert refused(nodes[0], "chain") == 0
    assert "IP address mismatch" in nodes[0].output(), nodes[0].tail()
    for k in to_liar:
        assert liar.call("peer_exists", 0, [k]) == [False], k       # nothing reached it
        other = [o for o in own(k) if o != liar.node_id][0]
        got = by_id[other].call("get", k)                           # the other owner has it
        assert got is not None and hashlib.sha256(got).digest() == \
            hashlib.sha256(vals[k]).digest(), k
    # the other way is fine: the liar checks the others' certificates, which name their hosts
    from_liar = [k for k in (b"fromliar-%d" % i for i in range(400))
                 if liar.node_id not in own(k)][:6]
    lv = {k: os.urandom(6000) for k in from_liar}
    cl = liar.tcp()
    assert cl.call("batch_put", from_liar, [lv[k] for k in from_liar]) == [0] * len(from_liar)
    for k in from_liar:
        for o in own(k):
            assert by_id[o].call("peer_exists", 0, [k]) == [True], (k, o)
    assert refused(liar, "name") == 0 and refused(liar, "chain") == 0


def test_peer_certificates_reloaded_on_sighup(pool, pki):
    nodes = [start_member(pool, pki, "member", i) for i in (1, 2, 3)]
    for ext in ("pem", "key"):                  # the fourth's files: another CA's for now
        shutil.copy(f"{pki}/rogue.{ext}", f"{pki}/m4.{ext}")
    m4 = start_member(pool, pki, "m4", 4)
    pool.wait_view(4)
    ids = [n.node_id for n in nodes] + [m4.node_id]
    by_id = dict(zip(ids, nodes + [m4]))

    def own(k):
        return [ids[i] for i in owners([(m, 1.0) for m in ids], k, R)]

    theirs = (k for k in (b"hup-%d" % i for i in range(3000)) if m4.node_id not in own(k))
    c4 = m4.tcp()

    def put_reaches_owners():
        k = next(theirs)
        assert c4.call("put", k, hashlib.sha256(k).digest() * 200) == 0
        return all(by_id[o].call("peer_exists", 0, [k]) == [True] for o in own(k))

    assert not put_reaches_owners()              # refused: another CA
    pid = m4.pid
    for ext in ("pem", "key"):
        shutil.copy(f"{pki}/member.{ext}", f"{pki}/m4.{ext}.new")
        os.replace(f"{pki}/m4.{ext}.new", f"{pki}/m4.{ext}")
    m4.proc.send_signal(signal.SIGHUP)
    wait_until(lambda: "peer certificates reloaded" in m4.output(), "the reload applied")
    wait_until(put_reaches_owners, "a put at the fourth member reaching its owners over TLS "
               "with the reloaded certificate", timeout=30)
    assert m4.pid == pid and m4.alive()
