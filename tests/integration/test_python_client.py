"""Integration: kvstashd speaks plain msgpack-rpc to a generic client.

The client is kvtest.Client, built from Debian's python3-msgpack and the standard library
only, no project code: if these pass, any msgpack-rpc client in any language can talk to
kvstashd. One daemon (kvtest.Daemon) serves the whole module; each test uses keys of its own.
"""

import os
import random
import tempfile
import time

import pytest

from kvtest import NOTIFY, RESPONSE, Client, Daemon


@pytest.fixture(scope="module")
def daemon():
    with tempfile.TemporaryDirectory(prefix="kvstash-python_client-") as tmp:
        d = Daemon(tmp, ["--memory_size=128m"])
        try:
            yield d.wait_ready()
            d.stop()    # it must still be alive, and exit 0 on SIGTERM
        finally:
            d.reap()


@pytest.fixture
def client(daemon):
    c = Client.tcp(daemon.port)
    yield c
    c.close()


def test_ping(client):
    assert client.call("ping") == "pong"


def test_hello(client):
    h = client.call("hello")
    assert isinstance(h, dict)
    assert h["server"] == "kvstashd"
    assert h["protocol"] == 1
    assert isinstance(h["version"], str) and h["version"]
    assert isinstance(h["node_id"], str) and h["node_id"]
    assert h["max_key_size"] == 1024
    assert h["max_value_size"] == 256 << 20
    assert h["max_batch"] == 16384
    assert h["max_message_size"] == 1 << 30
    assert h["lease_ttl_ms"] == 10000
    assert isinstance(h["transports"], list) and h["transports"]
    assert all(isinstance(t, str) for t in h["transports"])


@pytest.mark.parametrize("size", [0, 1, 4096, 1 << 20])
def test_put_get_byte_exact(client, size):
    key = f"py-put-{size}"
    value = os.urandom(size)
    assert client.call("put", key, value) == 0
    got = client.call("get", key)
    assert isinstance(got, bytes), f"get returned {type(got).__name__}, want bin"
    assert got == value
    assert client.call("get_size", key) == size
    assert client.call("is_exist", key) is True
    assert client.call("put", key, b"again") == 2  # EXISTS: write-once
    assert client.call("get", key) == value


def test_get_missing_is_nil(client):
    assert client.call("get", "py-never-written") is None
    assert client.call("is_exist", "py-never-written") is False
    assert client.call("get_size", "py-never-written") is None
    assert client.call("remove", "py-never-written") == 1  # NOT_FOUND


def test_batch_put_get_exist(client):
    keys = [f"py-batch-{i}" for i in range(50)]
    values = [os.urandom(random.randrange(0, 5000)) for _ in keys]
    assert client.call("batch_put", keys, values) == [0] * len(keys)
    probe = keys[:10] + ["py-batch-missing"] + keys[10:]
    got = client.call("batch_get", probe)
    assert got[:10] == values[:10]
    assert got[10] is None
    assert got[11:] == values[10:]
    assert client.call("batch_is_exist", ["py-batch-0", "py-batch-nope", "py-batch-49"]) == [
        True, False, True]
    assert client.call("batch_get_size", ["py-batch-1", "py-batch-nope"]) == [
        len(values[1]), None]
    # already stored keys answer EXISTS per key, new ones are stored
    assert client.call("batch_put", ["py-batch-0", "py-batch-new"], [b"x", b"y"]) == [2, 0]
    assert client.call("batch_remove", ["py-batch-new", "py-batch-new"]) == [0, 1]


def test_prefix_match(client):
    keys = [f"py-prefix-{i}" for i in range(8)]
    present = [k for i, k in enumerate(keys) if i != 5]
    assert client.call("batch_put", present, [b"v"] * len(present)) == [0] * len(present)
    assert client.call("prefix_match", keys) == 5
    assert client.call("prefix_match", ["py-prefix-none"] + keys) == 0
    assert client.call("prefix_match", keys, {"group_size": 2}) == 2
    assert client.call("prefix_match", keys[:4], {"group_size": 4}) == 1
    err, result = client.call_raw("prefix_match", keys, {"group_size": 3})
    assert err is not None and err[0] == 6 and err[1] == "INVALID_ARGUMENT", err
    assert result is None


def test_pipelining_matches_by_msgid(client):
    n = 1000
    rng = random.Random(7)
    # distinct, non-sequential msgids: the client must match replies by msgid
    ids = rng.sample(range(1, 1 << 31), 2 * n)
    keys = [f"py-pipe-{i}" for i in range(n)]
    values = [rng.randbytes(rng.randrange(0, 300)) for _ in range(n)]

    def run(requests):
        expected = {}
        out = bytearray()
        for msgid, method, params, want in requests:
            _, data = client.request(method, params, msgid)
            out += data
            expected[msgid] = (method, want)
        client.sock.sendall(out)
        seen = set()
        for _ in range(len(requests)):
            msg = client.recv()
            assert msg[0] == RESPONSE and msg[2] is None, msg
            msgid = msg[1]
            assert msgid in expected and msgid not in seen, f"unexpected msgid {msgid}"
            seen.add(msgid)
            method, want = expected[msgid]
            assert msg[3] == want, f"{method} (msgid {msgid}): {msg[3]!r} != {want!r}"
        assert seen == set(expected)

    run([(ids[i], "put", [keys[i], values[i]], 0) for i in range(n)])
    reqs = []
    for i in range(n):
        kind = i % 3
        if kind == 0:
            reqs.append((ids[n + i], "get", [keys[i]], values[i]))
        elif kind == 1:
            reqs.append((ids[n + i], "is_exist", [keys[i]], True))
        else:
            reqs.append((ids[n + i], "ping", [], "pong"))
    rng.shuffle(reqs)
    run(reqs)


def test_error_triple_shape(client):
    err, result = client.call_raw("no_such_method")
    assert isinstance(err, list) and len(err) == 3, err
    code, name, message = err
    assert (code, name) == (7, "METHOD_NOT_FOUND")
    assert isinstance(message, str) and message
    assert result is None

    err, result = client.call_raw("put", "only-a-key")
    assert isinstance(err, list) and len(err) == 3, err
    assert err[0] == 6 and err[1] == "INVALID_ARGUMENT" and isinstance(err[2], str)
    assert result is None
    # a request-level error leaves the connection usable
    assert client.call("ping") == "pong"


def test_protocol_error_notification(daemon):
    c = Client.tcp(daemon.port)
    try:
        c.sock.sendall(b"\xdd\xff\xff\xff\xff")
        msg = c.recv()
        assert msg[0] == NOTIFY and msg[1] == "error", msg
        assert msg[2][0] == 8 and msg[2][1] == "PROTOCOL_ERROR", msg
        try:
            extra = c.recv()
        except TimeoutError:
            pytest.fail("the connection stayed open after PROTOCOL_ERROR")
        except ConnectionError:
            pass
        else:
            pytest.fail(f"a message after PROTOCOL_ERROR: {extra!r}")
    finally:
        c.close()


def test_unix_socket(daemon, client):
    value = os.urandom(100000)
    assert client.call("put", "py-unix", value) == 0
    u = Client.unix(daemon.unix_path)
    try:
        assert u.call("ping") == "pong"
        assert u.call("hello")["server"] == "kvstashd"
        assert u.call("get", "py-unix") == value
        assert u.call("put", "py-unix-2", b"over unix") == 0
    finally:
        u.close()
    assert client.call("get", "py-unix-2") == b"over unix"


STATS = ("uptime_s", "connections", "connections_total", "connections_rejected", "hits",
         "misses", "bytes_in", "bytes_out", "objects", "reserved", "memory_used",
         "memory_capacity", "value_bytes", "evictions", "evicted_bytes", "no_space",
         "protocol_errors", "pinned_hard", "pinned_soft")
METHODS = ("ping", "hello", "put", "batch_put", "get", "batch_get", "is_exist",
           "batch_is_exist", "prefix_match", "get_size", "batch_get_size", "remove",
           "batch_remove", "remove_all", "pin", "unpin", "stats")


def test_stats_counts(client):
    before = client.call("stats")
    assert isinstance(before, dict)
    for k in STATS + tuple("ops." + m for m in METHODS):
        assert k in before, f"stats has no {k}"
    for k, v in before.items():
        assert isinstance(k, str) and isinstance(v, int) and v >= 0, (k, v)
    value = os.urandom(5000)
    assert client.call("put", "py-stats-hit", value) == 0
    assert client.call("get", "py-stats-hit") == value
    assert client.call("get", "py-stats-miss") is None
    after = client.call("stats")
    assert after["hits"] == before["hits"] + 1
    assert after["misses"] == before["misses"] + 1
    assert after["ops.get"] == before["ops.get"] + 2
    assert after["ops.put"] == before["ops.put"] + 1
    assert after["ops.stats"] == before["ops.stats"] + 1
    assert after["objects"] == before["objects"] + 1
    assert after["value_bytes"] == before["value_bytes"] + len(value)
    assert after["bytes_in"] >= before["bytes_in"] + len(value)
    assert after["bytes_out"] >= before["bytes_out"] + len(value)
    assert after["memory_capacity"] == 128 << 20
    assert before["connections"] >= 1
    assert after["memory_used"] <= after["memory_capacity"]


def test_big_fields_answer_the_same_however_tcp_splits_them(daemon):
    """Fields too long to buffer are dropped as they arrive; the answers must not change."""
    big_key = b"K" * 20000
    big_str = "s" * 20000
    cases = [
        ("get", [big_key]),
        ("is_exist", [big_key]),
        ("put", [big_key, b"v"]),
        ("batch_get", [[b"a", big_key]]),
        ("batch_put", [[big_key, b"split-ok"], [b"x", b"y" * 30000]]),
        ("put", [b"split-k", big_str]),
        ("get_size", [big_key]),
        ("remove", [big_key]),
        (big_str, []),
        ("remove", [b"split-none", {big_str: 1}]),
    ]

    def ask(method, params, split):
        c = Client.tcp(daemon.port)
        try:
            msgid, data = c.request(method, params)
            if split:
                c.sock.sendall(data[:200])
                time.sleep(0.05)
                c.sock.sendall(data[200:])
            else:
                c.sock.sendall(data)
            msg = c.recv()
            assert msg[0] == RESPONSE and msg[1] == msgid, msg
            return msg[2], msg[3]
        finally:
            c.close()

    for method, params in cases:
        whole = ask(method, params, split=False)
        if method == "batch_put":  # the first run stored split-ok: compare on a fresh key
            params = [[big_key, b"split-ok2"], params[1]]
        split = ask(method, params, split=True)
        assert split == whole, f"{method[:20]}: whole {whole!r} but split {split!r}"
    assert Client.tcp(daemon.port).call("get", b"split-ok2") == b"y" * 30000


def test_mixed_size_batch_put_is_byte_exact(client):
    """Big values go straight into the store, small ones through the buffer: mixed, in any order."""
    rnd = random.Random(7)
    sizes = [1 << 20, 0, 8192, 20000, 1, 3 << 20, 16383, 16384, 65536] + [4096] * 200
    rnd.shuffle(sizes)
    keys = [f"mixed-{i}".encode() for i in range(len(sizes))]
    vals = [rnd.randbytes(n) for n in sizes]
    assert client.call("batch_put", keys, vals) == [0] * len(keys)
    assert client.call("batch_get", keys) == vals
