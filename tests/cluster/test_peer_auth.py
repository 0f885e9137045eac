"""Peer authentication (docs/cluster.md, "Peer authentication"): with require_auth on, a
member logs in to each peer as the admin tenant with the token in <data_dir>/cluster_token.
3 daemons with a fixed view (KVSTASH_TEST_VIEW), R = 2, every value checked against a table
of SHA-256 digests, every wait bounded.

  - a pool whose members share the admin token: a put reaches its owners (write_ack all)
    and a miss is served by an owner, for a tenant's keys; a tenant's connection may not
    call the peer methods;
  - a member whose token differs: its peers refuse its login (counted on both sides, logged
    once by it, retried with backoff), store nothing it sends, and it reads their keys as
    misses, never as wrong bytes; the two others go on between themselves;
  - a member whose cluster_token is missing, too open, or not the admin tenant's refuses to
    start with the reason;
  - SIGHUP: a member refused for its token gets the pool's token in its cluster_token and
    admin tenant line and reloads; its new peer connections log in with it and replicate,
    without a restart (a reload whose cluster_token does not match the admin tenant fails
    and changes nothing);
  - the connections refused for their login are dialled again as soon as such a reload
    applies, not after their backoff: with that backoff made 30 s here
    (KVSTASH_TEST_PEER_AUTH_BACKOFF_MS; up to 60 s in production), the fixed member reads
    the pool's keys well within it.
"""

import hashlib
import os
import signal
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "integration"))
sys.path.insert(0, HERE)

import kvtest  # noqa: E402
from clusterlib import ViewPool, metric_total, wait_until  # noqa: E402

pytestmark = pytest.mark.quick

POOL_TOKEN = "pool-admin-token-1"
OTHER_TOKEN = "some-other-admin-token"
ALPHA_TOKEN = "alpha-token"
FORBIDDEN, UNAUTHORIZED = 10, 9


def sha(token):
    return hashlib.sha256(token.encode()).hexdigest()


def tenant_id(name):
    """conf_tenant_id: FNV-1a of the name, the namespace a tenant's keys live in."""
    h = 2166136261
    for b in name.encode():
        h = ((h ^ b) * 16777619) & 0xFFFFFFFF
    return h or 1


def write_secret(path, text, mode=0o600):
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    with os.fdopen(fd, "w") as f:
        f.write(text + "\n")
    os.chmod(path, mode)


class AuthPool(ViewPool):
    """n daemons with require_auth on; admin[i] is node i's admin token (its tenant line and
    its cluster_token file alike)."""

    def __init__(self, work, admin, env=None):
        self.admin = admin
        self.env = env or {}
        super().__init__(work, len(admin), extra=["--ssd_dir="], data_prefix="auth-data")

    def node_args(self, i):
        os.makedirs(self.data[i], exist_ok=True)
        write_secret(os.path.join(self.data[i], "cluster_token"), self.admin[i])
        conf = os.path.join(self.work, f"auth-{i}.conf")
        with open(conf, "w") as f:
            f.write("require_auth yes\n"
                    f"tenant admin token_sha256={sha(self.admin[i])}\n"
                    f"tenant alpha token_sha256={sha(ALPHA_TOKEN)}\n")
        return [f"--config={conf}"]

    def login(self, i, tenant="alpha"):
        c = self.daemons[i].tcp()
        token = ALPHA_TOKEN if tenant == "alpha" else self.admin[i]
        err, _ = c.call_raw("hello", {"tenant": tenant, "token": token})
        assert err is None, f"hello as {tenant} on node {i}: {err}"
        return c

    def has(self, i, keys):
        """Which of alpha's keys node i holds itself (peer_exists, as admin)."""
        c = self.login(i, "admin")
        return c.call("peer_exists", tenant_id("alpha"), list(keys))

    def metric(self, i, name):
        return metric_total(self.mports[i], name,
                            headers={"Authorization": f"Bearer {self.admin[i]}"})


@pytest.fixture
def auth_pool(view_pools):
    """auth_pool(admin): len(admin) daemons in one fixed view, R = 2, require_auth on."""
    return lambda admin, env=None: view_pools(AuthPool, admin, env)


def values(n, tag, size=30000):
    return {b"auth-%s-%d" % (tag, i): os.urandom(size + i * 331) for i in range(n)}


def test_members_with_the_pool_token_replicate_and_serve_misses(auth_pool):
    p = auth_pool([POOL_TOKEN] * 3)
    vals = values(24, b"ok")
    digest = {k: hashlib.sha256(v).digest() for k, v in vals.items()}
    c0 = p.login(0)
    assert c0.call("batch_put", list(vals), list(vals.values())) == [0] * len(vals)
    # write_ack all: the put answered once every other owner answered; each stored it
    sends = sum(1 for k in vals for o in p.owners(k) if o != 0)
    assert p.metric(0, 'kvstash_cluster_replications_total{outcome="stored"}') == sends
    for i in (1, 2):
        mine = [k for k in vals if i in p.owners(k)]
        assert mine and all(p.has(i, mine)), f"node {i} lacks keys it owns"
    # a miss on a node that neither owns nor wrote a key is fetched from an owner
    far = [k for k in vals if 2 not in p.owners(k)]
    assert far and not any(p.has(2, far))
    c2 = p.login(2)
    for k in far:
        got = c2.call("get", k)
        assert got is not None and hashlib.sha256(got).digest() == digest[k]
    assert p.metric(2, "kvstash_cluster_remote_hits_total") == len(far)
    for i in range(3):
        assert p.metric(i, "kvstash_cluster_peer_auth_failures_total") == 0
        assert p.metric(i, "kvstash_auth_failures_total") == 0
    # a tenant that is not admin may not act as a peer
    err, _ = c2.call_raw("peer_get", tenant_id("alpha"), [far[0]])
    assert err is not None and err[0] == FORBIDDEN, err


def test_a_member_with_another_token_is_refused_and_stores_nothing(auth_pool):
    p = auth_pool([POOL_TOKEN, POOL_TOKEN, OTHER_TOKEN])
    # node 2 writes keys that nodes 0 and 1 own: its peer_puts are refused
    theirs = [k for k in (b"auth-bad-%d" % i for i in range(200)) if 2 not in p.owners(k)][:10]
    assert len(theirs) == 10
    vals = {k: os.urandom(20000) for k in theirs}
    c2 = p.login(2)
    assert c2.call("batch_put", theirs, [vals[k] for k in theirs]) == [0] * len(theirs)
    assert p.metric(2, "kvstash_cluster_peer_auth_failures_total") >= 1
    assert p.metric(0, "kvstash_auth_failures_total") + \
        p.metric(1, "kvstash_auth_failures_total") >= 1
    assert not any(p.has(0, theirs)) and not any(p.has(1, theirs))
    # it still serves them itself (stored locally first)
    for k in theirs:
        assert c2.call("get", k) == vals[k]

    # retried after a backoff, refused again, logged once
    more = iter(b"auth-retry-%d" % i for i in range(100))

    def refused_twice():
        k = next(more)
        assert c2.call("put", k, b"x" * 100) == 0
        return p.metric(2, "kvstash_cluster_peer_auth_failures_total") >= 4

    # first refusals by nodes 0 and 1, then each of them again after its backoff
    wait_until(refused_twice, "each peer refusing a second login (backoff 1 s)", timeout=30)
    assert p.metric(0, "kvstash_auth_failures_total") >= 2
    assert p.metric(1, "kvstash_auth_failures_total") >= 2
    for i in (0, 1):
        line = f"peer 127.0.0.1:{p.ports[i]}: refused the cluster login"
        assert p.daemons[2].output().count(line) == 1, p.daemons[2].tail()

    # keys nodes 0 and 1 hold are misses at node 2, never wrong bytes
    good = values(12, b"good")
    c0 = p.login(0)
    keys01 = [k for k in good if 2 not in p.owners(k)]
    assert keys01
    assert c0.call("batch_put", keys01, [good[k] for k in keys01]) == [0] * len(keys01)
    assert all(p.has(1, keys01)), "nodes 0 and 1 no longer replicate between themselves"
    for k in keys01:
        assert c2.call("get", k) is None
    c1 = p.login(1)
    for k in keys01:
        assert c1.call("get", k) == good[k]


def test_a_reloaded_cluster_token_is_used_by_new_peer_connections(auth_pool):
    p = auth_pool([POOL_TOKEN, POOL_TOKEN, OTHER_TOKEN])
    keys = iter(b"auth-hup-%d" % i for i in range(2000))
    theirs = (k for k in keys if 2 not in p.owners(k))
    c2 = p.login(2)

    def put_reaches_owners():
        """One new key put at node 2: did it reach both its owners?"""
        k = next(theirs)
        v = hashlib.sha256(k).digest() * 300
        assert c2.call("put", k, v) == 0
        return all(p.has(i, [k]) == [True] for i in p.owners(k))

    assert not put_reaches_owners()
    assert p.metric(2, "kvstash_cluster_peer_auth_failures_total") >= 1
    d2 = p.daemons[2]
    token_path = os.path.join(p.data[2], "cluster_token")
    conf = os.path.join(p.work, "auth-2.conf")

    # the pool's token in cluster_token but the admin tenant line still the old one: the
    # reload fails and changes nothing
    write_secret(token_path, POOL_TOKEN)
    d2.proc.send_signal(signal.SIGHUP)
    wait_until(lambda: "reload failed" in d2.output(), "the failed reload logged")
    assert "not the admin tenant's token_sha256" in d2.output(), d2.tail()
    assert not put_reaches_owners()

    # both changed: new connections log in with the new token, no restart
    with open(conf, "w") as f:
        f.write("require_auth yes\n"
                f"tenant admin token_sha256={sha(POOL_TOKEN)}\n"
                f"tenant alpha token_sha256={sha(ALPHA_TOKEN)}\n")
    pid = d2.pid
    d2.proc.send_signal(signal.SIGHUP)
    wait_until(lambda: "cluster token and peer certificates reloaded" in d2.output(),
               "the reload applied")
    p.admin[2] = POOL_TOKEN
    c2 = p.login(2)
    wait_until(put_reaches_owners, "a put at node 2 reaching its owners (the refused "
               "connections are dialled again after their backoff)", timeout=40)
    assert d2.pid == pid and d2.alive()
    assert POOL_TOKEN not in d2.output() and OTHER_TOKEN not in d2.output()


def reload_with_token(p, i, token):
    """Node i gets token in its cluster_token and admin tenant line, and SIGHUP; waits until
    the reload applied."""
    write_secret(os.path.join(p.data[i], "cluster_token"), token)
    with open(os.path.join(p.work, f"auth-{i}.conf"), "w") as f:
        f.write("require_auth yes\n"
                f"tenant admin token_sha256={sha(token)}\n"
                f"tenant alpha token_sha256={sha(ALPHA_TOKEN)}\n")
    before = p.daemons[i].output().count("cluster token and peer certificates reloaded")
    p.daemons[i].proc.send_signal(signal.SIGHUP)
    wait_until(lambda: p.daemons[i].output().count("cluster token and peer certificates "
                                                   "reloaded") > before, "the reload applied")
    p.admin[i] = token


def test_a_reload_dials_the_refused_peers_again_at_once(auth_pool):
    backoff_s = 30
    p = auth_pool([POOL_TOKEN, POOL_TOKEN, OTHER_TOKEN],
                  env={"KVSTASH_TEST_PEER_AUTH_BACKOFF_MS": str(backoff_s * 1000)})
    vals = values(12, b"hup-at-once", size=9000)
    far = [k for k in vals if 2 not in p.owners(k)]
    assert far
    c0 = p.login(0)
    assert c0.call("batch_put", far, [vals[k] for k in far]) == [0] * len(far)
    # node 2's logins to both owners are refused: misses, and a 30 s backoff each
    c2 = p.login(2)
    assert c2.call("get", far[0]) is None
    wait_until(lambda: p.metric(2, "kvstash_cluster_peer_auth_failures_total") >= 1,
               "node 2's login refused")
    assert c2.call("get", far[0]) is None               # within the backoff: not dialled
    reload_with_token(p, 2, POOL_TOKEN)
    c2 = p.login(2)
    # dialled by the next read: well within the backoff (a third of it, on a loaded
    # machine), where waiting it out would take all of it
    wait_until(lambda: c2.call("get", far[0]) is not None, "a fetch by node 2 after the "
               "reload", timeout=backoff_s / 3)
    for k in far:
        got = c2.call("get", k)
        assert got is not None and hashlib.sha256(got).digest() == \
            hashlib.sha256(vals[k]).digest()
    assert "dialled again with the reloaded cluster login" in p.daemons[2].output()


@pytest.mark.parametrize("case", ["missing", "open", "mismatch"])
def test_a_member_without_a_usable_cluster_token_refuses_to_start(case, tmp_path):
    kvtest.require_kvstashd()
    data = tmp_path / "data"
    data.mkdir()
    if case == "open":
        write_secret(str(data / "cluster_token"), POOL_TOKEN, 0o644)
    elif case == "mismatch":
        write_secret(str(data / "cluster_token"), OTHER_TOKEN)
    conf = tmp_path / "kv.conf"
    conf.write_text(f"require_auth yes\ntenant admin token_sha256={sha(POOL_TOKEN)}\n")
    port = kvtest.free_port()
    d = kvtest.Daemon(str(tmp_path), [f"--config={conf}", f"--data_dir={data}",
                                      f"--listen=127.0.0.1:{port}", "--node_id=n1",
                                      "--cluster_name=t", "--etcd_endpoints=http://127.0.0.1:9",
                                      "--ssd_dir=", "--memory_size=32m"],
                      data_dir=str(data), unix=False,
                      env={"KVSTASH_TEST_VIEW": f"n1@127.0.0.1:{port}"})
    try:
        assert d.exit_code() == 1
        want = {"missing": "No such file", "open": "mode 0600 or stricter",
                "mismatch": "not the admin tenant's token_sha256"}[case]
        out = d.output()
        assert "cluster_token" in out and want in out, out
        assert POOL_TOKEN not in out and OTHER_TOKEN not in out
    finally:
        d.reap()
