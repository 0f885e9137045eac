"""TLS to etcd (docs/cluster.md, "etcd over TLS"): etcd_endpoints https://host:port, etcd's
certificate checked against etcd_tls_ca_file and for the endpoint's host, this node's own
certificate (etcd_tls_cert_file, etcd_tls_key_file) when etcd requires one. A real etcd
(/usr/bin/etcd) on loopback started with --cert-file/--key-file (and --trusted-ca-file with
--client-cert-auth: etcd 3.4 asks every client for a certificate once it has a trusted CA),
certificates made here with openssl; every wait bounded.

  - two members join over https (registration, keepalives, the member list and the watch
    all go over TLS: the second member's arrival reaches the first through its watch);
  - a member given another CA, and one whose etcd certificate names another host, are
    refused: one log line with the reason, they serve their engine alone, and they retry
    (etcd_errors keeps growing) without ever registering;
  - etcd with --client-cert-auth: a member without a certificate is refused, one with a
    certificate of etcd's CA joins.
"""

import pytest

from clusterlib import Etcd, Pool, make_pki, wait_until


@pytest.fixture
def pki(work):
    return make_pki(work, [("etcd", "ca", "etcd", "IP:127.0.0.1"),
                           ("member", "ca", "member", "DNS:member")])


def etcd_tls(work, pki, client_auth=False, also=()):
    """etcd on https:// with a certificate for 127.0.0.1 alone."""
    tls = {"cert": f"{pki}/etcd.pem", "key": f"{pki}/etcd.key", "ca": f"{pki}/ca.pem",
           "client_auth": client_auth}
    if client_auth:
        tls.update(client_cert=f"{pki}/member.pem", client_key=f"{pki}/member.key")
    return Etcd(work, tls=tls, also=also)


@pytest.fixture
def tls_pool(work):
    """tls_pool(etcd): a Pool on that etcd; its daemons and the etcds are reaped after."""
    made = []

    def start(etcd):
        p = Pool(work, etcd)
        made.append(p)
        return p

    yield start
    for p in made:
        p.reap_show()
        p.etcd.reap()
        print(f"---- etcd\n{p.etcd.tail(15)}")


def counters(node):
    return node.info()["counters"]


def serves_alone(node, key):
    c = node.tcp()
    assert c.call("put", key, b"v" * 5000) == 0
    assert c.call("get", key) == b"v" * 5000


def assert_refused_and_retrying(node, reason):
    """node logged one refusal naming reason, serves alone, keeps retrying, never joins."""
    wait_until(lambda: "TLS refused" in node.output(), "the TLS refusal in the log")
    out = node.output()
    assert reason in out, node.tail()
    assert out.count("TLS refused") == 1, node.tail()        # once per outage, not per retry
    serves_alone(node, b"alone")
    info = node.info()
    assert not info["registered"] and not info["etcd_ok"], info
    first = counters(node)["etcd_errors"]
    wait_until(lambda: counters(node)["etcd_errors"] >= first + 2, "retries")
    assert not node.info()["registered"]
    node.assert_alive()


@pytest.mark.quick
def test_members_join_over_https(work, pki, tls_pool):
    etcd = etcd_tls(work, pki)
    pool = tls_pool(etcd)
    assert etcd.endpoint.startswith("https://")
    a = pool.start(args=[f"--etcd_tls_ca_file={pki}/ca.pem"])
    pool.wait_view(1)
    b = pool.start(args=[f"--etcd_tls_ca_file={pki}/ca.pem"])
    view = pool.wait_view(2)           # a learns of b through its watch, over TLS
    assert set(view) == {a.node_id, b.node_id}
    info = a.info()
    assert info["registered"] and info["etcd_ok"] and info["etcd_endpoint"] == etcd.endpoint
    assert etcd.lease_of(f"/kvstash/pool/nodes/{a.node_id}") > 0
    # keepalives go on over TLS (a connection per call): past two lease periods still there
    renewed = counters(a)["lease_renewals"]
    wait_until(lambda: counters(a)["lease_renewals"] >= renewed + 3, "keepalives")
    assert pool.wait_view(2) == view


def test_wrong_ca_refused_serves_alone_and_retries(work, pki, tls_pool):
    etcd = etcd_tls(work, pki)
    pool = tls_pool(etcd)
    n = pool.start(args=[f"--etcd_tls_ca_file={pki}/other-ca.pem"])
    assert_refused_and_retrying(n, "its certificate: unable to get local issuer certificate")
    assert etcd.get_prefix("/kvstash/pool/nodes/") == {}


def test_certificate_for_another_host_refused(work, pki, tls_pool):
    # etcd answers on 127.0.0.9 too, with its certificate for 127.0.0.1: it chains to the
    # CA but does not name the host this member dials
    etcd = etcd_tls(work, pki, also=["127.0.0.9"])
    pool = tls_pool(etcd)
    n = pool.start(args=[f"--etcd_tls_ca_file={pki}/ca.pem",
                         f"--etcd_endpoints={etcd.also_endpoints[0]}"])
    assert_refused_and_retrying(n, "its certificate: IP address mismatch")
    assert etcd.get_prefix("/kvstash/pool/nodes/") == {}


def test_client_certificate_when_etcd_requires_one(work, pki, tls_pool):
    etcd = etcd_tls(work, pki, client_auth=True)
    pool = tls_pool(etcd)
    bare = pool.start(args=[f"--etcd_tls_ca_file={pki}/ca.pem"])
    wait_until(lambda: "TLS refused" in bare.output(), "the refusal of a node without a "
               "certificate")
    serves_alone(bare, b"bare")
    assert not bare.info()["registered"]
    good = pool.start(args=[f"--etcd_tls_ca_file={pki}/ca.pem",
                            f"--etcd_tls_cert_file={pki}/member.pem",
                            f"--etcd_tls_key_file={pki}/member.key"])
    pool.wait_view(1, nodes=[good])
    assert good.info()["registered"]
    assert list(etcd.get_prefix("/kvstash/pool/nodes/")) == [f"/kvstash/pool/nodes/{good.node_id}"]
    assert not bare.info()["registered"]


def test_tls_files_checked_at_start(work, pki, tls_pool):
    etcd = etcd_tls(work, pki)
    pool = tls_pool(etcd)
    n = pool.start(args=[f"--etcd_tls_ca_file={pki}/missing.pem"], ready=False)
    assert n.proc.wait(15) == 1
    assert "etcd_tls_ca_file" in n.output() and "missing.pem" in n.output(), n.tail()
    half = pool.start(args=[f"--etcd_tls_cert_file={pki}/member.pem"], ready=False)
    assert half.proc.wait(15) == 1
    assert "etcd_tls_cert_file and etcd_tls_key_file go together" in half.output(), half.tail()
