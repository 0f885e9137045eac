"""Writes the seed corpora of tests/fuzz/ (run from the repository root with Debian's
/usr/bin/python3; the files are committed, so this only needs running to change them).

frame/ and rpc/ get the hostile vectors every msgpack reader here must survive (a
map, array or bin declaring 2^32-1 entries or bytes: dd ff ff ff ff, df ff ff ff ff,
c6 ff ff ff ff; 10,000-deep nested arrays; long chains of huge counts) next to valid
requests of every method, so the fuzzer starts from both sides of the line. config/
gets the shipped config file and a few files of edge cases. frame/ inputs begin with
one byte that picks how the target feeds the rest (see fuzz_frame.c).
"""

import os

import msgpack

ROOT = "tests/fuzz/corpus"


def req(msgid, method, params):
    return msgpack.packb([0, msgid, method, params], use_bin_type=True)


HOSTILE = {
    "map32-huge": bytes.fromhex("ddffffffff"),
    "array32-huge": bytes.fromhex("dfffffffff"),
    "bin32-huge": bytes.fromhex("c6ffffffff"),
    "deep-10000": b"\x91" * 10000 + b"\xc0",
    "huge-count-chain": bytes.fromhex("dcffff") * 2000,
    "map16-chain": bytes.fromhex("deffff") * 2000,
    "str32-huge": bytes.fromhex("dbffffffff") + b"x" * 64,
    "request-with-huge-bin": bytes.fromhex("9400") + b"\x01" + bytes.fromhex("a3707574")
    + bytes.fromhex("92c4036b6579c6ffffffff"),
}

REQUESTS = [
    req(1, "ping", []),
    req(2, "hello", [{"tenant": "a", "token": "secret"}]),
    req(3, "put", [b"key", b"value"]),
    req(4, "batch_put", [[b"a", b"b"], [b"1" * 100, b""], {"durable": False}]),
    req(5, "get", [b"key"]),
    req(6, "batch_get", [[b"a", b"b", b"zz"]]),
    req(7, "batch_is_exist", [[b"a", "b"]]),
    req(8, "prefix_match", [[b"a", b"b", b"c", b"d"], {"group_size": 2}]),
    req(9, "batch_get_size", [[b"a"]]),
    req(10, "batch_remove", [[b"a"], {"force": True}]),
    req(11, "pin", [[b"b"], "hard"]),
    req(12, "unpin", [[b"b"]]),
    req(13, "remove_all", [{}]),
    req(14, "stats", []),
    req(15, "batch_get_into", [[b"a"], [[[1, 0, 4096]]]]),
    req(16, "batch_put_from", [[b"n"], [[[1, 0, 10], [1, 10, 10]]]]),
    req(17, "register_buffer", [{"size": 4096}]),
    req(18, "put_start", [[b"p"], [100]]),
    req(19, "get_replica_list", [[b"a"]]),
    req(20, "rdma_connect", [b"\0" * 30]),
    req(21, "no_such_method", []),
    msgpack.packb([2, "note", []]),
]

def resp(*args):
    """One RESP2 command (multibulk)."""
    out = [b"*%d\r\n" % len(args)]
    for a in args:
        a = a if isinstance(a, bytes) else a.encode()
        out.append(b"$%d\r\n%s\r\n" % (len(a), a))
    return b"".join(out)


# resp/ inputs begin with one byte: the low bits pick the piece size, 0x40 offers big
# bulks for spilling, 0x80 takes the offers into store reservations (see fuzz_resp.c).
RESP_HOSTILE = {
    "mbulk-huge": b"*2147483647\r\n",
    "mbulk-over-limit": b"*1048577\r\n" + b"$1\r\nx\r\n" * 8,
    "bulk-negative": b"*1\r\n$-2\r\n",
    "bulk-huge": b"*1\r\n$99999999999\r\n",
    "bulk-over-max-value": b"*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$4194305\r\n",
    "inline-no-crlf": b"x" * 70000,
    "count-no-crlf": b"*" + b"1" * 70000,
    "bulk-count-no-crlf": b"*1\r\n$" + b"9" * 70000,
    "unbalanced-quotes": b"set \"abc\r\n",
    "expected-dollar": b"*1\r\nfoo\r\n",
    "bulk-no-crlf": b"*2\r\n$3\r\nGET\r\n$1\r\nkXY",
}

RESP_COMMANDS = [
    resp("PING"), resp("PING", "x"), resp("ECHO", "hello"), resp("AUTH", "pw"),
    resp("AUTH", "user", "pw"), resp("HELLO", "2"), resp("HELLO", "3"),
    resp("HELLO", "2", "SETNAME", "n"), resp("SELECT", "0"), resp("SELECT", "9"),
    resp("CLIENT", "SETNAME", "me"), resp("CLIENT", "GETNAME"), resp("CLIENT", "ID"),
    resp("CLIENT", "SETINFO", "lib-name", "x"), resp("INFO"), resp("INFO", "keyspace"),
    resp("COMMAND"), resp("COMMAND", "COUNT"), resp("COMMAND", "DOCS"),
    resp("COMMAND", "INFO", "get", "nosuch"), resp("SET", "k", "v"),
    resp("SET", "k", "v", "NX"), resp("SET", "k", "v", "EX", "10"),
    resp("SET", "big", b"B" * 40000), resp("MSET", "a", "1", "b", b"b" * 20000, "a", "3"),
    resp("GET", "k"), resp("MGET", "k", "a", "big", "none"), resp("EXISTS", "k", "a", "z"),
    resp("STRLEN", "big"), resp("DEL", "a", "z"), resp("UNLINK", "b"), resp("DBSIZE"),
    resp("FLUSHDB"), resp("FLUSHALL", "ASYNC"), resp("RESET"), resp("NOSUCH", "a"),
    resp("GET"), resp("SET", b"K" * 30000, "v"), resp("ECHO", b"E" * 20000),
    b"PING\r\nset \"a b\" \"c\\x41\"\r\nget 'a b'\r\n\r\n*0\r\n*-1\r\n",
    resp("QUIT") + resp("PING"),
]

# A read that ends right after a big value, or after its CR, before the CRLF: the body is
# buffered whole and must not be offered for spilling (an MSET was left unanswered). The
# first is cut in pieces of 64 bytes (0xc1: the first byte modulo 7 picks the piece) so that
# its 24-byte value ends the first one; the second, fed all at once (0xc3), has its first key
# refused and ends with the value.
RESP_REGRESS = {
    "regress-whole-body-offered": b"\xc1" + resp("MSET", "a", "1", "k", b"V" * 24)
                                  + resp("GET", "k") + resp("PING"),
    "regress-whole-body-offered-cut": b"\xc3" + resp("MSET", b"K" * 2000, "v", "k",
                                                       b"W" * 20000)[:-2],
}

CONFIGS = {
    "edges.conf": b"memory_size 4GiB\nlease_ttl_ms 1500ms\neviction_low_watermark 0.5\n"
                  b"# comment\n\nlog_level debug\nmax_batch 1\n",
    "bad.conf": b"no_such_key 1\nmemory_size 12x\n",
    "quotes.conf": b'unix_socket "/tmp/a b.sock"\nssd_dir ""\nrdma required\n',
    "long.conf": b"log_file " + b"a" * 5000 + b"\n",
    "tenants.conf": b"require_auth yes\ntenant a token_sha256=" + b"ab" * 32
                    + b" memory_quota=1g ssd_quota=2g\ntenant b-2 token_sha256=" + b"0f" * 32
                    + b"  # two\ntenant \"\"\ntenant c token_sha256=" + b"12" * 32 + b"\n",
}


def summary(bucket, records, covered=None):
    """A bucket summary (storage/ssd_summary.h) of records [(tenant, key, value_len)] laid
    end to end from offset 0, with its CRC."""
    import struct

    def crc32c(data, crc=0):
        crc ^= 0xffffffff
        for b in data:
            crc ^= b
            for _ in range(8):
                crc = (crc >> 1) ^ (0x82f63b78 if crc & 1 else 0)
        return crc ^ 0xffffffff

    def align(n):
        return (n + 4095) // 4096 * 4096

    body, off = b"", 0
    for i, (tenant, key, vlen) in enumerate(records):
        body += struct.pack("<QQQIII", off, vlen, 100 + i, tenant, len(key), 0xabc00 + i) + key
        off += align(48 + len(key)) + align(vlen)
    covered = off if covered is None else covered
    head = struct.pack("<IHHQQQQ", 0x4853564B, 1, 0, bucket, len(records), covered, len(body))
    return head + struct.pack("<II", crc32c(head + body), 0) + body


SUMMARIES = {
    "empty": summary(1, []),
    "three": summary(7, [(0, b"key-a", 4096), (3, b"key-bb", 100), (0, b"k" * 600, 70000)]),
    "many": summary(0x1234, [(i % 4, b"blk-%05d" % i, 4096) for i in range(200)]),
    "past-covered": summary(2, [(0, b"x", 4096), (0, b"y", 4096)], covered=8192),
}


def write(sub, name, data):
    os.makedirs(os.path.join(ROOT, sub), exist_ok=True)
    with open(os.path.join(ROOT, sub, name), "wb") as f:
        f.write(data)


def main():
    for name, data in HOSTILE.items():
        write("frame", name, b"\x06" + data)          # fed all at once
        write("frame", name + "-bytewise", b"\x00" + data)
        write("rpc", name, data)
    allreq = b"".join(REQUESTS)
    write("frame", "requests", b"\x03" + allreq)
    write("frame", "requests-spill", b"\x86" + allreq)
    for i, r in enumerate(REQUESTS):
        write("rpc", f"request-{i:02d}", r)
    write("rpc", "requests-all", allreq)
    with open("conf/kvstashd.conf", "rb") as f:
        write("config", "kvstashd.conf", f.read())
    for name, data in CONFIGS.items():
        write("config", name, data)
    write("config", "flag", b"memory_size=64m")
    for name, data in RESP_HOSTILE.items():
        write("resp", name, b"\x06" + data)
        write("resp", name + "-bytewise", b"\x00" + data)
    allresp = b"".join(RESP_COMMANDS)
    write("resp", "commands", b"\x06" + allresp)
    write("resp", "commands-pieces", b"\x03" + allresp)
    write("resp", "commands-spill", b"\xc5" + allresp)
    write("resp", "commands-declined", b"\x44" + allresp)
    for i, c in enumerate(RESP_COMMANDS):
        write("resp", f"command-{i:02d}", b"\xc6" + c)
    for name, data in RESP_REGRESS.items():
        write("resp", name, data)
    for name, data in SUMMARIES.items():
        write("summary", name, data)


if __name__ == "__main__":
    main()
