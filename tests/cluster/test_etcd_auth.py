"""etcd authentication (docs/cluster.md, "etcd authentication"): etcd_user and
etcd_password_file. A real etcd (/usr/bin/etcd) on loopback with `--auth-token simple` and
a short `--auth-token-ttl`, users root and kvstash (a role with readwrite on the pool's
prefix) made through the gateway, then auth enabled; every wait bounded.

  - members with the right password join and the view forms; their tokens expire (the
    token TTL is shorter than the watch's re-arm period, so every re-arm finds its token
    refused) and they log in again and keep their registration (one lease, one key),
    keepalives and watch: a member started later reaches every view;
  - etcd restarted (its simple tokens are in memory only): the members log in again with
    the same leases and keys, and see a member that joins afterwards;
  - a user added in etcd (every token issued before is "revision of auth store is old"):
    the members log in again and see a later join;
  - members given etcd_user while etcd's auth is off call without a token, and log in once
    auth is enabled;
  - a wrong password: refused, one log line with etcd's reason, the node serves its engine
    alone and retries (etcd_errors keeps growing) without registering;
  - etcd_user without etcd_password_file (and the reverse) is a config error; a password
    file that is missing or too open stops the start with its path in the error, and the
    password is never in the log.
"""

import contextlib
import os
import subprocess

import pytest

from clusterlib import Etcd, Pool, wait_until

import kvtest

USER, PASSWORD = "kvstash", "kv-etcd-secret-1"


def write_secret(path, text, mode=0o600):
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    with os.fdopen(fd, "w") as f:
        f.write(text + "\n")
    os.chmod(path, mode)


@pytest.fixture
def auth_etcd(work):
    """etcd with authentication on; simple tokens living 1 s without use."""
    e = Etcd(work, args=["--auth-token", "simple", "--auth-token-ttl", "1"])
    e.enable_auth("/kvstash/pool/", USER, PASSWORD)
    yield e
    e.reap()
    print(f"---- etcd\n{e.tail(15)}")


@pytest.fixture
def auth_pool(work, auth_etcd):
    """auth_pool(password): a Pool on auth_etcd whose members log in as USER with password
    (its file under work)."""
    made = []

    def start(password=PASSWORD):
        path = os.path.join(work, f"etcd_password-{len(made)}")
        write_secret(path, password)
        p = Pool(work, auth_etcd, args=[f"--etcd_user={USER}", f"--etcd_password_file={path}"])
        made.append(p)
        return p

    yield start
    for p in made:
        p.reap_show()


def counters(node):
    return node.info()["counters"]


def leases(etcd, nodes):
    return {n.node_id: etcd.lease_of(f"/kvstash/pool/nodes/{n.node_id}") for n in nodes}


@pytest.mark.quick
def test_members_log_in_join_and_log_in_again_when_tokens_expire(auth_pool, auth_etcd):
    p = auth_pool()
    a, b = p.start(), p.start()
    p.wait_view(2)
    held = leases(auth_etcd, [a, b])
    assert all(held.values()), held
    for n in (a, b):
        assert counters(n)["etcd_logins"] >= 1
    # the lease TTL is 2 s: a watch re-arms every 2 s and its token (1 s unused) has
    # expired by then; each re-arm must log in again and keep the watch
    first = counters(a)["etcd_logins"]
    wait_until(lambda: counters(a)["etcd_logins"] >= first + 2, "two more logins at a")
    c = p.start()
    p.wait_view(3)
    assert leases(auth_etcd, [a, b]) == held            # registrations kept throughout
    for n in (a, b, c):
        ctr = counters(n)
        assert ctr["registrations"] == 1 and ctr["lease_lost"] == 0, (n.node_id, ctr)
        assert n.info()["registered"]
    assert "refused the login" not in a.output() + b.output() + c.output()
    assert PASSWORD not in a.output()


def test_members_log_in_again_after_etcd_restarts(auth_pool, auth_etcd):
    p = auth_pool()
    a, b = p.start(), p.start()
    p.wait_view(2)
    held = leases(auth_etcd, [a, b])
    before = {n.node_id: counters(n)["etcd_logins"] for n in (a, b)}
    auth_etcd.stop()
    auth_etcd.start()                  # its simple tokens are gone
    for n in (a, b):
        wait_until(lambda: counters(n)["etcd_logins"] > before[n.node_id],
                   f"{n.node_id} logging in again")
        wait_until(lambda: n.info()["etcd_ok"], f"{n.node_id} reaching etcd again")
    c = p.start()
    p.wait_view(3)
    assert leases(auth_etcd, [a, b]) == held
    for n in (a, b):
        assert counters(n)["lease_lost"] == 0, counters(n)


def jwt_keys(work):
    """An RSA key pair for etcd's JWT tokens (skips without an openssl command)."""
    if subprocess.run(["which", "openssl"], capture_output=True).returncode != 0:
        pytest.skip("no openssl command (apt-get install openssl, or make deps)")
    priv, pub = os.path.join(work, "jwt.key"), os.path.join(work, "jwt.pub")
    subprocess.run(["openssl", "genrsa", "-out", priv, "2048"], check=True,
                   capture_output=True)
    subprocess.run(["openssl", "rsa", "-in", priv, "-pubout", "-out", pub], check=True,
                   capture_output=True)
    return f"jwt,pub-key={pub},priv-key={priv},sign-method=RS256,ttl=10m"


@contextlib.contextmanager
def own_etcd_pool(work, etcd_args):
    """A test's own etcd (etcd_args: its auth token flags; auth not enabled yet) and a Pool
    on it whose members log in as USER: (etcd, pool); both reaped on the way out, the
    members' log tails printed."""
    e = Etcd(work, args=etcd_args)
    try:
        path = os.path.join(work, "etcd_password")
        write_secret(path, PASSWORD)
        p = Pool(work, e, args=[f"--etcd_user={USER}", f"--etcd_password_file={path}"])
        try:
            yield e, p
        finally:
            p.reap_show()
    finally:
        e.reap()


def test_a_change_to_etcd_users_makes_members_log_in_again(work):
    """JWT tokens carry the auth store's revision: a user added makes every token issued
    before it "etcdserver: revision of auth store is old"; the members log in again and
    their watch still delivers a join."""
    with own_etcd_pool(work, ["--auth-token", jwt_keys(work)]) as (e, p):
        e.enable_auth("/kvstash/pool/", USER, PASSWORD)
        a = p.start()
        p.wait_view(1)
        first = counters(a)["etcd_logins"]
        e.call("/v3/auth/user/add", {"name": "someone-else", "password": "x"})
        wait_until(lambda: counters(a)["etcd_logins"] > first, "a logging in again")
        p.start()
        p.wait_view(2)
        assert counters(a)["lease_lost"] == 0 and counters(a)["registrations"] == 1


def test_members_set_up_before_auth_is_enabled_log_in_once_it_is(work):
    """etcd_user set while etcd's auth is off: the login answers "authentication is not
    enabled", the member calls without a token; once auth is enabled, it logs in."""
    with own_etcd_pool(work, ["--auth-token", "simple"]) as (e, p):
        a = p.start()
        p.wait_view(1)
        assert counters(a)["etcd_logins"] == 0
        e.enable_auth("/kvstash/pool/", USER, PASSWORD)
        wait_until(lambda: counters(a)["etcd_logins"] >= 1, "a logging in")
        p.start()
        p.wait_view(2)
        assert counters(a)["lease_lost"] == 0 and counters(a)["registrations"] == 1
        assert "refused the login" not in a.output()


def test_a_wrong_password_is_refused_and_the_node_serves_alone(auth_pool, auth_etcd):
    good = auth_pool()
    a = good.start()
    good.wait_view(1)
    bad = auth_pool("not-the-password")
    n = bad.start(node_id="bad1", host="127.0.0.9")
    wait_until(lambda: "refused the login" in n.output(), "the refusal in the log")
    out = n.output()
    assert "etcd_user kvstash: etcdserver: authentication failed, invalid user ID or " \
           "password" in out, n.tail()
    c = n.tcp()
    assert c.call("put", b"alone", b"v" * 5000) == 0
    assert c.call("get", b"alone") == b"v" * 5000
    first = counters(n)["etcd_errors"]
    wait_until(lambda: counters(n)["etcd_errors"] >= first + 2, "retries")
    assert n.output().count("refused the login") == 1, n.tail()     # once, not per retry
    info = n.info()
    assert not info["registered"] and not info["etcd_ok"], info
    assert auth_etcd.get("/kvstash/pool/nodes/bad1") is None
    assert list(a.view()[1]) == [a.node_id]
    assert "not-the-password" not in n.output()
    n.assert_alive()


@pytest.mark.quick
@pytest.mark.parametrize("case", ["no-file-key", "no-user-key", "missing", "open"])
def test_etcd_login_settings_that_cannot_work_stop_the_start(case, tmp_path):
    kvtest.require_kvstashd()
    data = tmp_path / "data"
    data.mkdir()
    pw = tmp_path / "etcd_password"
    if case == "open":
        write_secret(str(pw), PASSWORD, 0o644)
    elif case != "missing":
        write_secret(str(pw), PASSWORD)
    login = {"no-file-key": [f"--etcd_user={USER}"],
             "no-user-key": [f"--etcd_password_file={pw}"]}.get(
                 case, [f"--etcd_user={USER}", f"--etcd_password_file={pw}"])
    port = kvtest.free_port()
    d = kvtest.Daemon(str(tmp_path), [f"--data_dir={data}", f"--listen=127.0.0.1:{port}",
                                      "--node_id=n1", "--cluster_name=t",
                                      "--etcd_endpoints=http://127.0.0.1:9", "--ssd_dir=",
                                      "--memory_size=32m", *login],
                      data_dir=str(data), unix=False)
    try:
        assert d.exit_code() == 1
        want = {"no-file-key": "etcd_user and etcd_password_file go together",
                "no-user-key": "etcd_user and etcd_password_file go together",
                "missing": f"etcd_password_file {pw}: No such file",
                "open": f"etcd_password_file {pw}: must be a regular file of mode 0600"}[case]
        out = d.output()
        assert want in out, out
        assert PASSWORD not in out
    finally:
        d.reap()
