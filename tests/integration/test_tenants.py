"""Integration: tenants and authentication.

The daemon runs with require_auth and three tenants (alpha, beta, admin) declared by the
SHA-256 of their tokens. For every method a client can use on another tenant's key, the
matrix checks the four callers a user worries about: the same tenant (works), another
tenant (sees nothing of it, changes nothing of it), no authentication (refused before the
method runs), a wrong token (refused, and it stays unauthenticated). Also: unauthenticated
clients may only ping and hello and may not send big messages; repeated failures close the
connection; a listener off loopback without require_auth refuses to start; direct access to
the arena is the admin's only. Every wait is bounded.
"""

import hashlib
import time

import pytest

from kvtest import Daemon, wait_for

OK, NOT_FOUND, EXISTS, BUSY = 0, 1, 2, 3
UNAUTHORIZED, FORBIDDEN = 9, 10

TOKENS = {"alpha": "alpha-secret-token", "beta": "beta-secret-token", "admin": "root-token"}


def sha(token):
    return hashlib.sha256(token.encode()).hexdigest()


@pytest.fixture
def daemon(tmp_path):
    conf = tmp_path / "kv.conf"
    conf.write_text("require_auth yes\n" + "".join(
        f"tenant {name} token_sha256={sha(tok)}\n" for name, tok in TOKENS.items()))
    d = Daemon(str(tmp_path), (f"--config={conf}", "--memory_size=32m", "--ssd_dir="))
    d.wait_ready()      # it pings, which needs no authentication
    yield d
    d.reap()


def login(d, tenant, token=None, unix=False):
    c = d.unix() if unix else d.tcp()
    err, _ = c.call_raw("hello", {"tenant": tenant, "token": token or TOKENS[tenant]})
    assert err is None, f"hello as {tenant}: {err}"
    return c


def anonymous(d):
    return d.tcp()


def wrong_token(d):
    c = d.tcp()
    err, _ = c.call_raw("hello", {"tenant": "alpha", "token": "not-the-token"})
    assert err is not None and err[0] == UNAUTHORIZED, err
    return c


def expect_err(c, code, method, *params):
    err, res = c.call_raw(method, *params)
    assert err is not None and err[0] == code, f"{method}: want error {code}, got {err} {res}"


KEY = b"shared-name"
VALUE = b"alpha's prompt prefix" * 100


def test_isolation_matrix(daemon):
    alpha = login(daemon, "alpha")
    beta = login(daemon, "beta")
    assert alpha.call("put", KEY, VALUE) == OK
    assert alpha.call("pin", [KEY], "soft") == [OK]

    # The same tenant sees and uses its key.
    assert alpha.call("get", KEY) == VALUE
    assert alpha.call("batch_get", [KEY]) == [VALUE]
    assert alpha.call("is_exist", KEY) is True
    assert alpha.call("batch_is_exist", [KEY]) == [True]
    assert alpha.call("prefix_match", [KEY]) == 1
    assert alpha.call("get_size", KEY) == len(VALUE)
    assert alpha.call("batch_get_size", [KEY]) == [len(VALUE)]
    assert alpha.call("put", KEY, b"again") == EXISTS

    # Another tenant, same bytes: nothing there, nothing it does reaches alpha's object.
    assert beta.call("get", KEY) is None
    assert beta.call("batch_get", [KEY]) == [None]
    assert beta.call("is_exist", KEY) is False
    assert beta.call("batch_is_exist", [KEY]) == [False]
    assert beta.call("prefix_match", [KEY]) == 0
    assert beta.call("get_size", KEY) is None
    assert beta.call("batch_get_size", [KEY]) == [None]
    assert beta.call("pin", [KEY], "hard") == [NOT_FOUND]
    assert beta.call("unpin", [KEY]) == [NOT_FOUND]
    assert beta.call("remove", KEY, {"force": True}) == NOT_FOUND
    assert beta.call("batch_remove", [KEY], {"force": True}) == [NOT_FOUND]
    assert beta.call("remove_all", {"force": True}) == 0
    assert beta.call("put", KEY, b"beta's own") == OK     # its own object, same name
    assert beta.call("get", KEY) == b"beta's own"
    assert beta.call("stats") == {"tenant_objects": 1, "tenant_value_bytes": len(b"beta's own")}
    # alpha's object is untouched by all of that
    assert alpha.call("get", KEY) == VALUE
    assert alpha.call("stats") == {"tenant_objects": 1, "tenant_value_bytes": len(VALUE)}

    # No authentication: everything but ping and hello is refused before it runs.
    anon = anonymous(daemon)
    assert anon.call("ping") == "pong"
    for method, params in (("get", [KEY]), ("put", [KEY, b"x"]), ("batch_get", [[KEY]]),
                           ("is_exist", [KEY]), ("batch_is_exist", [[KEY]]),
                           ("prefix_match", [[KEY]]), ("get_size", [KEY]),
                           ("remove", [KEY]), ("batch_remove", [[KEY]]), ("remove_all", []),
                           ("pin", [[KEY], "hard"]), ("unpin", [[KEY]]), ("stats", []),
                           ("batch_put", [[KEY], [b"x"]]), ("get_replica_list", [[KEY]]),
                           ("put_start", [[KEY], [10]]), ("batch_get_into", [[KEY], [[]]])):
        expect_err(anon, UNAUTHORIZED, method, *params)

    # A wrong token: refused, and the connection stays unauthenticated.
    bad = wrong_token(daemon)
    expect_err(bad, UNAUTHORIZED, "get", KEY)
    expect_err(bad, UNAUTHORIZED, "remove_all")
    assert alpha.call("get", KEY) == VALUE

    # The admin sees the daemon's counters; a tenant its own only (checked above).
    admin = login(daemon, "admin")
    s = admin.call("stats")
    assert s["objects"] == 2 and s["auth_failures"] >= 1, s
    # The admin's keys are a namespace of their own too.
    assert admin.call("get", KEY) is None


def test_before_auth_only_small_messages_and_a_few_tries(daemon):
    c = anonymous(daemon)
    # A big message before hello {tenant, token} closes the connection.
    msgid, data = c.request("put", [b"k", b"v" * 8192])
    c.sock.sendall(data)
    msg = c.recv()
    assert msg[0] == 2 or msg[2] is not None, msg      # a notification, then the close
    with pytest.raises((ConnectionError, OSError, TimeoutError)):
        for _ in range(3):
            c.recv()
    # Three wrong tokens on one connection close it, with a notification that says why.
    c2 = anonymous(daemon)
    for _ in range(3):
        err, _ = c2.call_raw("hello", {"tenant": "beta", "token": "guess"})
        assert err is not None and err[0] == UNAUTHORIZED
    note = c2.recv()
    assert note[0] == 2 and note[2][0] == UNAUTHORIZED, note
    with pytest.raises((ConnectionError, OSError, TimeoutError)):
        c2.recv()
    # An unknown tenant is refused like a wrong token.
    c3 = anonymous(daemon)
    err, _ = c3.call_raw("hello", {"tenant": "nobody", "token": "x"})
    assert err is not None and err[0] == UNAUTHORIZED
    # A good login still works from the same address (under the per-address limit).
    assert login(daemon, "beta").call("ping") == "pong"


def test_direct_access_is_the_admins_only(daemon):
    alpha = login(daemon, "alpha", unix=True)
    for method, params in (("map_segment", [0]), ("put_start", [[b"k"], [10]]),
                           ("get_replica_list", [[b"k"]])):
        expect_err(alpha, FORBIDDEN, method, *params)
    admin = login(daemon, "admin", unix=True)
    res = admin.call("get_replica_list", [b"k"])
    assert res == [None]


def test_remote_listen_without_auth_refuses_to_start(tmp_path):
    d = Daemon(str(tmp_path), ("--listen=0.0.0.0:0", "--ssd_dir="), unix=False)
    rc, out = d.exit_code(), d.output()
    assert rc != 0, out
    assert "not a loopback address" in out and "require_auth yes" in out, out


def test_memory_quota_caps_a_tenant_and_guards_its_share(tmp_path):
    conf = tmp_path / "kv.conf"
    conf.write_text("require_auth yes\n"
                    f"tenant alpha token_sha256={sha(TOKENS['alpha'])} memory_quota=8m\n"
                    f"tenant beta token_sha256={sha(TOKENS['beta'])}\n"
                    f"tenant admin token_sha256={sha(TOKENS['admin'])}\n")
    d = Daemon(str(tmp_path), (f"--config={conf}", "--memory_size=32m", "--ssd_dir="))
    try:
        d.wait_ready()
        alpha, beta, admin = login(d, "alpha"), login(d, "beta"), login(d, "admin")
        mib = 1 << 20
        # Past its quota alpha makes room from its own oldest objects: every put works,
        # and it never holds more than 8 MiB.
        for i in range(12):
            assert alpha.call("put", f"a{i}".encode(), bytes([i]) * mib) == OK
            time.sleep(0.01)    # access stamps come from a coarse clock: keep the order clear
        kept = [i for i in range(12) if alpha.call("is_exist", f"a{i}".encode())]
        assert kept == list(range(4, 12)), f"not alpha's least recently used out: {kept}"
        # beta fills the rest of DRAM several times over: eviction takes beta's own objects,
        # never alpha's, which are within alpha's quota.
        for i in range(100):
            assert beta.call("put", f"b{i}".encode(), b"x" * mib) == OK
        for i in kept:
            assert alpha.call("get", f"a{i}".encode()) == bytes([i]) * mib, f"a{i} was evicted"
        # With all of its objects pinned, nothing of alpha's can go: QUOTA_EXCEEDED.
        assert alpha.call("pin", [f"a{i}".encode() for i in kept], "hard") == [OK] * len(kept)
        assert alpha.call("put", b"a-pinned-out", b"p" * mib) == 11
        assert alpha.call("unpin", [f"a{i}".encode() for i in kept]) == [OK] * len(kept)
        assert alpha.call("put", b"a-new", b"y" * mib) == OK
        s = admin.call("stats")
        assert s["quota_exceeded"] >= 1 and s["evictions"] > 0, s
    finally:
        d.reap()


def test_ssd_quota_keeps_a_tenants_newest_on_ssd(tmp_path):
    conf = tmp_path / "kv.conf"
    conf.write_text("require_auth yes\n"
                    f"tenant alpha token_sha256={sha(TOKENS['alpha'])} ssd_quota=4m\n"
                    f"tenant beta token_sha256={sha(TOKENS['beta'])}\n"
                    f"tenant admin token_sha256={sha(TOKENS['admin'])}\n")
    args = (f"--config={conf}", "--memory_size=64m", f"--ssd_dir={tmp_path}/ssd",
            "--ssd_offload=off")
    d = Daemon(str(tmp_path), args, data_dir=str(tmp_path / "data"))
    try:
        d.wait_ready()
        alpha, beta = login(d, "alpha"), login(d, "beta")
        mib = 1 << 20
        # Past its 4 MiB share alpha's oldest records make room for its new ones.
        assert [alpha.call("put", f"a{i}".encode(), bytes([i]) * mib, {"durable": True})
                for i in range(6)] == [OK] * 6
        # A value larger than the whole share can never be durable: 11, kept in DRAM.
        assert alpha.call("put", b"a-big", b"B" * (5 * mib), {"durable": True}) == 11
        assert alpha.call("get", b"a-big") == b"B" * (5 * mib)
        # beta has no SSD quota: its durable puts go on.
        assert [beta.call("put", f"b{i}".encode(), b"b" * mib, {"durable": True})
                for i in range(6)] == [OK] * 6
        # After a restart only what is on the SSD is there: alpha's newest, within 4 MiB
        # (three 1 MiB records and their headers), and every one of beta's.
        d.stop()
        d = Daemon(str(tmp_path), args, data_dir=str(tmp_path / "data"))
        d.wait_ready()
        alpha, beta = login(d, "alpha"), login(d, "beta")
        on_ssd = [i for i in range(6) if alpha.call("get", f"a{i}".encode()) is not None]
        assert on_ssd == [3, 4, 5], on_ssd
        assert alpha.call("get", b"a5") == bytes([5]) * mib
        assert all(beta.call("get", f"b{i}".encode()) == b"b" * mib for i in range(6))
        # The share's use was counted again at start: the next record evicts the oldest.
        assert alpha.call("put", b"a-more", b"m" * mib, {"durable": True}) == OK
        d.stop()
        d = Daemon(str(tmp_path), args, data_dir=str(tmp_path / "data"))
        d.wait_ready()
        alpha = login(d, "alpha")
        on_ssd = [k for k in (b"a3", b"a4", b"a5", b"a-more") if alpha.call("is_exist", k)]
        assert on_ssd == [b"a4", b"a5", b"a-more"], on_ssd
    finally:
        d.reap()


def test_ssd_share_is_kept_whatever_others_write(tmp_path):
    """alpha's SSD share survives beta flooding the tier, before and after a restart;
    gamma, whose share overlaps alpha's (the shares add up to more than the tier),
    makes room by evicting its own oldest records, never alpha's."""
    conf = tmp_path / "kv.conf"
    conf.write_text("require_auth yes\n"
                    f"tenant alpha token_sha256={sha(TOKENS['alpha'])} ssd_quota=8m\n"
                    f"tenant beta token_sha256={sha(TOKENS['beta'])}\n"
                    f"tenant gamma token_sha256={sha('gamma-token')} ssd_quota=12m\n"
                    f"tenant admin token_sha256={sha(TOKENS['admin'])}\n")
    args = (f"--config={conf}", "--memory_size=16m", f"--ssd_dir={tmp_path}/ssd",
            "--ssd_size=16m", "--ssd_bucket_size=4m", "--ssd_offload=off")
    mib = 1 << 20
    d = Daemon(str(tmp_path), args, data_dir=str(tmp_path / "data"))
    try:
        d.wait_ready()
        alpha, beta = login(d, "alpha"), login(d, "beta")
        alpha_keys = [f"a{i}".encode() for i in range(6)]
        for i, k in enumerate(alpha_keys):
            assert alpha.call("put", k, bytes([i]) * mib, {"durable": True}) == OK
        # beta writes four times the tier: shared buckets come and go, alpha's stay.
        for i in range(96):
            assert beta.call("put", f"b{i}".encode(), b"b" * mib, {"durable": True}) == OK
        s = login(d, "admin").call("stats")
        assert s["ssd_evicted_buckets"] > 0, s
        for i, k in enumerate(alpha_keys):
            assert alpha.call("get", k) == bytes([i]) * mib, f"{k} lost to beta's writes"
        assert alpha.call("get", b"a0") == bytes([0]) * mib

        # After a restart the buckets still know their owner.
        d.stop()
        d = Daemon(str(tmp_path), args, data_dir=str(tmp_path / "data"))
        d.wait_ready()
        alpha, beta = login(d, "alpha"), login(d, "beta")
        for i in range(96, 192):
            assert beta.call("put", f"b{i}".encode(), b"c" * mib, {"durable": True}) == OK
        for i, k in enumerate(alpha_keys):
            assert alpha.call("get", k) == bytes([i]) * mib, f"{k} lost after the restart"

        # gamma's 12 MiB share and alpha's 8 do not both fit in the 16 MiB tier: beta's
        # records go first, then gamma's own oldest; alpha's stay whole.
        gamma = login(d, "gamma", "gamma-token")
        for i in range(24):
            assert gamma.call("put", f"g{i}".encode(), bytes([100 + i]) * mib,
                              {"durable": True}) == OK, f"g{i}"
        for i, k in enumerate(alpha_keys):
            assert alpha.call("get", k) == bytes([i]) * mib, f"{k} lost to gamma's writes"
        assert gamma.call("get", b"g23") == bytes([123]) * mib
        assert gamma.call("get", b"g0") in (None, bytes([100]) * mib)
        s = login(d, "admin").call("stats")
        assert s["ssd_disk_bytes"] <= 16 * mib, s
    finally:
        d.reap()


def test_long_tenant_or_token_is_invalid_however_it_arrives(tmp_path):
    """A tenant or token over max_key_size is refused alike buffered or dropped on arrival."""
    conf = tmp_path / "kv.conf"
    conf.write_text(f"tenant alpha token_sha256={sha(TOKENS['alpha'])}\n")
    d = Daemon(str(tmp_path), (f"--config={conf}", "--memory_size=32m", "--ssd_dir="))
    d.wait_ready()
    try:
        for field in ("tenant", "token"):
            for n in (2000, 20000):             # over max_key_size (1k); the second is dropped
                for split in (False, True):     # when it arrives in pieces
                    opts = {"tenant": "alpha", "token": TOKENS["alpha"], field: "x" * n}
                    c = d.tcp()
                    msgid, data = c.request("hello", [opts])
                    step = 3000 if split else len(data)
                    for off in range(0, len(data), step):
                        c.sock.sendall(data[off:off + step])
                        if split:
                            time.sleep(0.01)
                    msg = c.recv()
                    assert msg[1] == msgid and msg[2] is not None and msg[2][0] == 6, \
                        (field, n, split, msg)
                    assert c.call("ping") == "pong"     # the connection stays usable
                    c.close()
        c = d.tcp()
        err, _ = c.call_raw("stats", 5)
        assert err is not None and err[0] == 6, err
        assert isinstance(c.call("stats", {}), dict) and isinstance(c.call("stats", None), dict)
        assert c.call("hello", {"tenant": "alpha", "token": TOKENS["alpha"]})["server"] == "kvstashd"
        c.close()
    finally:
        d.stop()


def test_writing_ahead_leaves_a_full_ssd_share_alone(tmp_path):
    """on_evict writes cold objects ahead, but not into a tenant's full SSD share: that
    dropped the tenant's oldest bucket, whose objects, still in DRAM, went again, and so on."""
    conf = tmp_path / "kv.conf"
    conf.write_text(f"tenant alpha token_sha256={sha(TOKENS['alpha'])} ssd_quota=16m\n"
                    f"tenant admin token_sha256={sha(TOKENS['admin'])}\n")
    d = Daemon(str(tmp_path), (f"--config={conf}", "--memory_size=64m",
                               f"--ssd_dir={tmp_path}/ssd", "--ssd_size=512m",
                               "--ssd_bucket_size=4m"), data_dir=str(tmp_path / "data"))
    try:
        d.wait_ready()
        alpha, admin = login(d, "alpha"), login(d, "admin")
        for i in range(130):                    # 65 MB: past DRAM and four times the share
            assert alpha.call("put", f"a{i}".encode(), bytes([i]) * 500000) == OK
        wait_for(lambda: admin.call("stats")["ssd_offload_queue"] == 0, 20, "the writer")
        time.sleep(1)
        before = admin.call("stats")["ssd_evicted_buckets"]
        time.sleep(2)
        after = admin.call("stats")["ssd_evicted_buckets"]
        assert after - before <= 1, (before, after)
        for i in range(130):                    # whatever is kept is exact
            got = alpha.call("get", f"a{i}".encode())
            assert got is None or got == bytes([i]) * 500000, i
    finally:
        d.stop()
