"""Integration: revoking a tenant or its token on SIGHUP cuts its sessions.

Three tenants (alpha, beta, gamma) and the admin, each with connections spread over both
event loops and both transports. The config is rewritten without alpha and with a new token
for beta, and the daemon gets SIGHUP: every alpha and beta connection receives the error
notification (9 UNAUTHORIZED, saying why) and is closed, within a bounded time; gamma's
connections stay open and keep working; beta logs in with its new token, its old one and
alpha are refused; `auth_revoked` counts the closes. A reload that turns require_auth on
keeps the logins and refuses the anonymous connections' requests from then on. Every wait
is bounded.
"""

import hashlib
import os
import signal
import time

import pytest

from kvtest import Daemon

UNAUTHORIZED = 9
TOKENS = {"alpha": "alpha-token", "beta": "beta-token", "gamma": "gamma-token",
          "admin": "admin-token"}


def sha(token):
    return hashlib.sha256(token.encode()).hexdigest()


def write_conf(path, tokens, require_auth=True):
    path.write_text(f"require_auth {'yes' if require_auth else 'no'}\n" + "".join(
        f"tenant {name} token_sha256={sha(tok)}\n" for name, tok in tokens.items()))


def hello(c, tenant, token):
    err, _ = c.call_raw("hello", {"tenant": tenant, "token": token})
    return err


def login(d, tenant, token=None, unix=False):
    c = d.unix() if unix else d.tcp()
    err = hello(c, tenant, token or TOKENS[tenant])
    assert err is None, f"hello as {tenant}: {err}"
    return c


def reload(d):
    """SIGHUP, then wait (bounded) until the daemon says it applied the config."""
    before = d.output().count("reload: configuration applied")
    os.kill(d.pid, signal.SIGHUP)
    deadline = time.monotonic() + 10
    while d.output().count("reload: configuration applied") == before:
        assert time.monotonic() < deadline, "the reload was not applied:\n" + d.tail()
        assert "reload failed" not in d.output(), d.tail()
        time.sleep(0.05)


def expect_closed(c, why, timeout=5.0):
    """The error notification saying why, then the end of the stream, within timeout."""
    c.sock.settimeout(timeout)
    msg = c.recv()
    assert msg[0] == 2 and msg[1] == "error", msg
    assert msg[2][0] == UNAUTHORIZED and why in msg[2][2], msg
    with pytest.raises((ConnectionError, OSError)):
        c.recv()


@pytest.fixture
def conf(tmp_path):
    return tmp_path / "kv.conf"


def test_removed_tenant_and_changed_token_lose_their_connections(tmp_path, conf):
    write_conf(conf, TOKENS)
    d = Daemon(str(tmp_path), (f"--config={conf}", "--memory_size=32m", "--ssd_dir=",
                               "--io_threads=2"))
    try:
        d.wait_ready()
        # Three connections a tenant: over TCP and the Unix socket, on both event loops
        # (connections go to the loops in turn).
        conns = {name: [login(d, name), login(d, name), login(d, name, unix=True)]
                 for name in ("alpha", "beta", "gamma")}
        for name, cs in conns.items():
            for i, c in enumerate(cs):
                assert c.call("put", f"{name}{i}".encode(), name.encode()) == 0
        admin = login(d, "admin")
        revoked0 = admin.call("stats")["auth_revoked"]

        write_conf(conf, {"beta": "beta-token-2", "gamma": TOKENS["gamma"],
                          "admin": TOKENS["admin"]})
        reload(d)

        for c in conns["alpha"]:
            expect_closed(c, "tenant removed by reload")
        for c in conns["beta"]:
            expect_closed(c, "token changed by reload")
        # gamma's connections are untouched: same namespace, still serving.
        for i, c in enumerate(conns["gamma"]):
            assert c.call("get", f"gamma{i}".encode()) == b"gamma"
            assert c.call("put", f"gamma-after{i}".encode(), b"x") == 0
        assert admin.call("stats")["auth_revoked"] - revoked0 == 6

        # beta's new token works (its objects are still its own); the old one and alpha do not.
        beta = login(d, "beta", "beta-token-2")
        assert beta.call("get", b"beta0") == b"beta"
        c = d.tcp()
        assert hello(c, "beta", TOKENS["beta"])[0] == UNAUTHORIZED
        assert hello(c, "alpha", TOKENS["alpha"])[0] == UNAUTHORIZED
        assert c.call_raw("get", b"beta0")[0][0] == UNAUTHORIZED
        d.assert_alive()
    finally:
        d.reap()


def test_require_auth_turned_on_keeps_logins_and_stops_strangers(tmp_path, conf):
    write_conf(conf, TOKENS, require_auth=False)
    d = Daemon(str(tmp_path), (f"--config={conf}", "--memory_size=32m", "--ssd_dir=",
                               "--io_threads=2"))
    try:
        d.wait_ready()
        gamma = login(d, "gamma")
        stranger = d.tcp()
        assert stranger.call("put", b"k", b"v") == 0
        write_conf(conf, TOKENS, require_auth=True)
        reload(d)
        assert gamma.call("put", b"g", b"v") == 0
        err, _ = stranger.call_raw("get", b"k")
        assert err is not None and err[0] == UNAUTHORIZED, err
        assert stranger.call("ping") == "pong"
        assert hello(stranger, "gamma", TOKENS["gamma"]) is None
        assert stranger.call("get", b"g") == b"v"
    finally:
        d.reap()
