/*
 * test_rpc: the method handlers (protocol/rpc.c) as a client sees them.
 * Requests are packed with msgpack-c, handed to rpc_dispatch as exact-size
 * heap copies against a real in-process store (32 MiB arena), the reply
 * bytes are drained from the outq and decoded with msgpack-c's unpacker,
 * and each test asserts the decoded response: shapes, per-key codes,
 * request-level errors that change nothing, spilled put values (holes) that
 * are committed or aborted on every path, and the spill decisions of
 * rpc_spill_take. No network; every test is a few milliseconds.
 */
#include <criterion/criterion.h>
#include <msgpack.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/uio.h>

#include <openssl/sha.h>

#include "config.h"
#include "kverr.h"
#include "mp.h"
#include "outq.h"
#include "rpc.h"
#include "store.h"

#define KiB 1024ull
#define MiB (1024ull * 1024ull)

#define T_KEY_MAX 64u              /* max_key_size in force */
#define T_VALUE_MAX (256u * 1024u) /* max_value_size in force */
#define T_BATCH_MAX 8u             /* max_batch in force */
#define T_MAX_REPLIES 64

/* ---- the environment of one test (each Criterion test runs in its own process) ---- */

static const char *const t_transports[] = {"tcp", "unix"};

static struct {
    struct store *s;
    struct rpc_server srv;
    struct rpc_limits lim;
    struct rpc_counters ctr;
    struct rpc_ctx ctx;
    struct outq out;
    msgpack_sbuffer sb; /* the request being built */
    msgpack_packer pk;
    uint64_t next_id;
    uint64_t msgid;               /* msgid of the last request begun */
    uint8_t *bufs[T_MAX_REPLIES]; /* drained reply bytes (decoded objects point into them) */
    msgpack_unpacked ups[T_MAX_REPLIES];
    int nbufs, nups;
    int stats_calls;
    void *stats_arg_seen;
} T;

static void
t_setup(void)
{
    struct store_config cfg = {
        .memory_size = 32 * MiB,
        .max_key_size = T_KEY_MAX,
        .max_value_size = T_VALUE_MAX,
        .high_watermark = 0.95,
        .low_watermark = 0.85,
    };

    memset(&T, 0, sizeof(T));
    cr_assert_eq(store_create(&cfg, &T.s), 0);
    T.lim = (struct rpc_limits){
        .max_key_size = T_KEY_MAX,
        .max_value_size = T_VALUE_MAX,
        .max_batch = T_BATCH_MAX,
        .max_message_size = 4 * MiB,
        .lease_ttl_ms = 10000,
    };
    T.srv = (struct rpc_server){
        .store = T.s,
        .version = "9.8.7-test",
        .node_id = "node-under-test",
        .transports = t_transports,
        .ntransports = 2,
    };
    T.ctx = (struct rpc_ctx){.srv = &T.srv, .lim = &T.lim, .ctr = &T.ctr, .tenant = 0};
    outq_init(&T.out, T.s);
    msgpack_sbuffer_init(&T.sb);
    msgpack_packer_init(&T.pk, &T.sb, msgpack_sbuffer_write);
    T.next_id = 1000;
}

static void
t_teardown(void)
{
    for (int i = 0; i < T.nups; i++) {
        msgpack_unpacked_destroy(&T.ups[i]);
    }
    for (int i = 0; i < T.nbufs; i++) {
        free(T.bufs[i]);
    }
    outq_deinit(&T.out);
    msgpack_sbuffer_destroy(&T.sb);
    store_destroy(T.s);
}

TestSuite(rpc, .init = t_setup, .fini = t_teardown);

/* ---- building requests ---- */

/* t_raw: start a new message from scratch (nothing packed yet). */
static msgpack_packer *
t_raw(void)
{
    msgpack_sbuffer_clear(&T.sb);
    return &T.pk;
}

/* t_req: start [0, msgid, method, [<nparams params follow>]]; msgid is fresh. */
static msgpack_packer *
t_req(const char *method, uint32_t nparams)
{
    msgpack_packer *pk = t_raw();

    T.msgid = T.next_id++;
    msgpack_pack_array(pk, 4);
    msgpack_pack_uint8(pk, 0);
    msgpack_pack_uint64(pk, T.msgid);
    msgpack_pack_str_with_body(pk, method, strlen(method));
    msgpack_pack_array(pk, nparams);
    return pk;
}

static void
t_bin(msgpack_packer *pk, const void *p, size_t n)
{
    msgpack_pack_bin_with_body(pk, p, n);
}

/* t_k: a C string packed as a bin key. */
static void
t_k(msgpack_packer *pk, const char *s)
{
    msgpack_pack_bin_with_body(pk, s, strlen(s));
}

static void
t_s(msgpack_packer *pk, const char *s)
{
    msgpack_pack_str_with_body(pk, s, strlen(s));
}

/* t_keys: an array of C-string bin keys. */
static void
t_keys(msgpack_packer *pk, const char *const *ks, uint32_t n)
{
    msgpack_pack_array(pk, n);
    for (uint32_t i = 0; i < n; i++) {
        t_k(pk, ks[i]);
    }
}

static uint8_t *
t_dup(const void *p, size_t n)
{
    uint8_t *c = malloc(n > 0 ? n : 1);

    cr_assert_not_null(c);
    if (n > 0) {
        memcpy(c, p, n);
    }
    return c;
}

/* t_pattern: len bytes that differ with seed and position. */
static uint8_t *
t_pattern(size_t len, uint32_t seed)
{
    uint8_t *p = malloc(len > 0 ? len : 1);

    cr_assert_not_null(p);
    for (size_t i = 0; i < len; i++) {
        p[i] = (uint8_t)(seed * 131u + i * 7u + (i >> 9) * 13u);
    }
    return p;
}

/* ---- dispatching and decoding ---- */

/* t_dispatch_holes: dispatch the built message (an exact-size copy) with holes. */
static int
t_dispatch_holes(const struct mp_hole *holes, size_t nholes)
{
    uint8_t *msg = t_dup(T.sb.data, T.sb.size);
    int rc = rpc_dispatch(&T.ctx, msg, T.sb.size, holes, nholes, &T.out);

    free(msg);
    return rc;
}

static int
t_dispatch(void)
{
    return t_dispatch_holes(NULL, 0);
}

/* t_drain: every queued reply byte, in order; the outq is empty afterwards. */
static uint8_t *
t_drain(size_t *len)
{
    size_t total = (size_t)outq_pending(&T.out), got = 0;
    uint8_t *buf = malloc(total > 0 ? total : 1);

    cr_assert_not_null(buf);
    cr_assert_lt(T.nbufs, T_MAX_REPLIES);
    T.bufs[T.nbufs++] = buf;
    while (outq_pending(&T.out) > 0) {
        struct iovec iov[8];
        int n = outq_peek(&T.out, iov, 8);
        size_t step = 0;
        cr_assert_gt(n, 0, "outq has %zu bytes pending but no segment", total - got);
        for (int i = 0; i < n; i++) {
            cr_assert_leq(got + iov[i].iov_len, total, "segments exceed outq_pending");
            memcpy(buf + got, iov[i].iov_base, iov[i].iov_len);
            got += iov[i].iov_len;
            step += iov[i].iov_len;
        }
        outq_consume(&T.out, step);
    }
    cr_assert_eq(got, total);
    *len = got;
    return buf;
}

/* t_replies: decode every drained message into out[0..max); asserts nothing is left over. */
static int
t_replies(msgpack_object *out, int max)
{
    size_t len, off = 0;
    uint8_t *buf = t_drain(&len);
    int n = 0;

    while (off < len) {
        cr_assert_lt(n, max, "more reply messages than the %d expected", max);
        cr_assert_lt(T.nups, T_MAX_REPLIES);
        msgpack_unpacked *up = &T.ups[T.nups++];
        msgpack_unpacked_init(up);
        msgpack_unpack_return r = msgpack_unpack_next(up, (const char *)buf, len, &off);
        cr_assert_eq(r, MSGPACK_UNPACK_SUCCESS, "reply bytes do not decode (at %zu of %zu)", off,
                     len);
        out[n++] = up->data;
    }
    return n;
}

/* t_call: dispatch the built request; exactly one reply message comes back. */
static msgpack_object
t_call_holes(const struct mp_hole *holes, size_t nholes)
{
    msgpack_object o;

    cr_assert_eq(t_dispatch_holes(holes, nholes), 0);
    cr_assert_eq(t_replies(&o, 1), 1, "no reply");
    return o;
}

static msgpack_object
t_call(void)
{
    return t_call_holes(NULL, 0);
}

static bool
t_str_is(const msgpack_object *o, const char *s)
{
    return o->type == MSGPACK_OBJECT_STR && o->via.str.size == strlen(s) &&
           memcmp(o->via.str.ptr, s, o->via.str.size) == 0;
}

static void
t_is_uint(const msgpack_object *o, uint64_t v)
{
    cr_assert_eq(o->type, MSGPACK_OBJECT_POSITIVE_INTEGER, "type %d, want uint %llu", o->type,
                 (unsigned long long)v);
    cr_assert_eq(o->via.u64, v, "got %llu, want %llu", (unsigned long long)o->via.u64,
                 (unsigned long long)v);
}

static void
t_is_nil(const msgpack_object *o)
{
    cr_assert_eq(o->type, MSGPACK_OBJECT_NIL, "type %d, want nil", o->type);
}

static void
t_is_bool(const msgpack_object *o, bool v)
{
    cr_assert_eq(o->type, MSGPACK_OBJECT_BOOLEAN, "type %d, want bool", o->type);
    cr_assert_eq(o->via.boolean, v);
}

static void
t_is_bin(const msgpack_object *o, const void *p, size_t n)
{
    cr_assert_eq(o->type, MSGPACK_OBJECT_BIN, "type %d, want bin", o->type);
    cr_assert_eq(o->via.bin.size, n, "bin of %u bytes, want %zu", o->via.bin.size, n);
    cr_assert(n == 0 || memcmp(o->via.bin.ptr, p, n) == 0, "bin bytes differ");
}

/* t_response: check [1, msgid, error, result] and return the 4 elements. */
static const msgpack_object *
t_response(const msgpack_object *o, uint64_t msgid)
{
    cr_assert_eq(o->type, MSGPACK_OBJECT_ARRAY, "reply is not an array");
    cr_assert_eq(o->via.array.size, 4, "reply has %u elements", o->via.array.size);
    const msgpack_object *e = o->via.array.ptr;
    t_is_uint(&e[0], 1);
    t_is_uint(&e[1], msgid);
    return e;
}

/* t_ok: a success response to msgid; returns its result. */
static const msgpack_object *
t_ok_id(msgpack_object o, uint64_t msgid)
{
    const msgpack_object *e = t_response(&o, msgid);

    cr_assert_eq(e[2].type, MSGPACK_OBJECT_NIL, "error is set: code %lld",
                 e[2].type == MSGPACK_OBJECT_ARRAY && e[2].via.array.size > 0
                     ? (long long)e[2].via.array.ptr[0].via.i64
                     : -1LL);
    return &e[3];
}

static const msgpack_object *
t_ok(msgpack_object o)
{
    return t_ok_id(o, T.msgid);
}

/* t_err: a request-level error [code, name, message] for msgid; result nil. */
static void
t_err_id(msgpack_object o, uint64_t msgid, int code, const char *name)
{
    const msgpack_object *e = t_response(&o, msgid);

    cr_assert_eq(e[2].type, MSGPACK_OBJECT_ARRAY, "no error where %s was due", name);
    cr_assert_eq(e[2].via.array.size, 3);
    t_is_uint(&e[2].via.array.ptr[0], (uint64_t)code);
    cr_assert(t_str_is(&e[2].via.array.ptr[1], name), "error name is not %s", name);
    cr_assert_eq(e[2].via.array.ptr[2].type, MSGPACK_OBJECT_STR, "error message is not a str");
    t_is_nil(&e[3]);
}

static void
t_err(msgpack_object o, int code, const char *name)
{
    t_err_id(o, T.msgid, code, name);
}

/* t_codes: result is an array of exactly these per-key codes. */
static void
t_codes(const msgpack_object *r, const int *codes, uint32_t n)
{
    cr_assert_eq(r->type, MSGPACK_OBJECT_ARRAY, "result is not an array");
    cr_assert_eq(r->via.array.size, n, "%u codes, want %u", r->via.array.size, n);
    for (uint32_t i = 0; i < n; i++) {
        cr_assert_eq(r->via.array.ptr[i].type, MSGPACK_OBJECT_POSITIVE_INTEGER,
                     "code %u is not a uint", i);
        cr_assert_eq(r->via.array.ptr[i].via.u64, (uint64_t)codes[i], "key %u: code %llu, want %d",
                     i, (unsigned long long)r->via.array.ptr[i].via.u64, codes[i]);
    }
}

static const msgpack_object *
t_map_get(const msgpack_object *m, const char *name)
{
    cr_assert_eq(m->type, MSGPACK_OBJECT_MAP);
    for (uint32_t i = 0; i < m->via.map.size; i++) {
        if (t_str_is(&m->via.map.ptr[i].key, name)) {
            return &m->via.map.ptr[i].val;
        }
    }
    return NULL;
}

/* ---- client-style shortcuts ---- */

/* t_put: put key -> value (inline); returns the per-key code. */
static uint64_t
t_put(const char *key, const void *v, size_t n)
{
    msgpack_packer *pk = t_req("put", 2);

    t_k(pk, key);
    t_bin(pk, v, n);
    const msgpack_object *r = t_ok(t_call());
    cr_assert_eq(r->type, MSGPACK_OBJECT_POSITIVE_INTEGER, "put result is not a code");
    return r->via.u64;
}

static void
t_put_str(const char *key, const char *v)
{
    cr_assert_eq(t_put(key, v, strlen(v)), 0, "put %s", key);
}

/* t_get: the decoded result of get key (bin or nil). */
static const msgpack_object *
t_get(const char *key)
{
    t_k(t_req("get", 1), key);
    return t_ok(t_call());
}

/* t_stored: does the store itself hold key in the default tenant? (bypasses rpc) */
static bool
t_stored(const char *key)
{
    struct kv_key k = {.tenant = 0, .len = (uint32_t)strlen(key), .ptr = (const uint8_t *)key};
    return store_exists(T.s, &k) == 1;
}

static struct store_stats
t_stats(void)
{
    struct store_stats st;

    store_stats(T.s, &st);
    return st;
}

/* ---- ping, hello, stats ---- */

Test(rpc, ping_answers_pong_and_echoes_msgid)
{
    t_req("ping", 0);
    msgpack_object o = t_call();
    const msgpack_object *r = t_ok(o);
    cr_assert(t_str_is(r, "pong"), "ping result is not \"pong\"");
    cr_assert_eq(atomic_load(&T.ctr.ops[RPC_PING]), 1);

    /* a 64-bit msgid in a wide encoding comes back unchanged */
    msgpack_packer *pk = t_raw();
    msgpack_pack_array(pk, 4);
    msgpack_pack_uint8(pk, 0);
    msgpack_pack_uint64(pk, UINT64_C(0xfedcba9876543210));
    t_s(pk, "ping");
    msgpack_pack_array(pk, 0);
    r = t_ok_id(t_call(), UINT64_C(0xfedcba9876543210));
    cr_assert(t_str_is(r, "pong"));

    t_k(t_req("ping", 1), "x");
    t_err(t_call(), KV_INVALID_ARGUMENT, "INVALID_ARGUMENT");
}

Test(rpc, hello_reports_server_and_limits)
{
    t_req("hello", 0);
    const msgpack_object *m = t_ok(t_call());
    cr_assert_eq(m->type, MSGPACK_OBJECT_MAP, "hello result is not a map");
    cr_assert_eq(m->via.map.size, 10);
    cr_assert(t_str_is(t_map_get(m, "server"), "kvstashd"));
    cr_assert(t_str_is(t_map_get(m, "version"), "9.8.7-test"));
    cr_assert(t_str_is(t_map_get(m, "node_id"), "node-under-test"));
    t_is_uint(t_map_get(m, "protocol"), 1);
    t_is_uint(t_map_get(m, "max_key_size"), T_KEY_MAX);
    t_is_uint(t_map_get(m, "max_value_size"), T_VALUE_MAX);
    t_is_uint(t_map_get(m, "max_batch"), T_BATCH_MAX);
    t_is_uint(t_map_get(m, "max_message_size"), 4 * MiB);
    t_is_uint(t_map_get(m, "lease_ttl_ms"), 10000);
    const msgpack_object *tr = t_map_get(m, "transports");
    cr_assert_not_null(tr);
    cr_assert_eq(tr->type, MSGPACK_OBJECT_ARRAY);
    cr_assert_eq(tr->via.array.size, 2);
    cr_assert(t_str_is(&tr->via.array.ptr[0], "tcp"));
    cr_assert(t_str_is(&tr->via.array.ptr[1], "unix"));

    /* the limits come from the snapshot in force, not from a constant */
    T.lim.max_batch = 3;
    T.lim.max_key_size = 17;
    msgpack_packer *pk = t_req("hello", 1);
    msgpack_pack_map(pk, 1);
    t_s(pk, "auth");
    t_s(pk, "ignored");
    m = t_ok(t_call());
    t_is_uint(t_map_get(m, "max_batch"), 3);
    t_is_uint(t_map_get(m, "max_key_size"), 17);

    /* opts must be a map or nil */
    msgpack_pack_int(t_req("hello", 1), 5);
    t_err(t_call(), KV_INVALID_ARGUMENT, "INVALID_ARGUMENT");
}

static int
t_stats_fn(void *arg, const char **names, uint64_t *values, int max)
{
    T.stats_calls++;
    T.stats_arg_seen = arg;
    cr_assert_geq(max, 2);
    names[0] = "alpha";
    values[0] = 1;
    names[1] = "beta.gamma";
    values[1] = UINT64_C(1) << 40;
    return 2;
}

Test(rpc, stats_calls_stats_fn_and_returns_its_map)
{
    static int arg_token;

    /* no stats_fn: an empty map */
    t_req("stats", 0);
    const msgpack_object *m = t_ok(t_call());
    cr_assert_eq(m->type, MSGPACK_OBJECT_MAP);
    cr_assert_eq(m->via.map.size, 0);

    T.srv.stats_fn = t_stats_fn;
    T.srv.stats_arg = &arg_token;
    t_req("stats", 0);
    m = t_ok(t_call());
    cr_assert_eq(T.stats_calls, 1);
    cr_assert_eq(T.stats_arg_seen, &arg_token);
    cr_assert_eq(m->via.map.size, 2);
    t_is_uint(t_map_get(m, "alpha"), 1);
    t_is_uint(t_map_get(m, "beta.gamma"), UINT64_C(1) << 40);

    /* [opts] is accepted (reserved); two params are not */
    msgpack_pack_nil(t_req("stats", 1));
    m = t_ok(t_call());
    cr_assert_eq(m->via.map.size, 2);
    msgpack_packer *pk = t_req("stats", 2);
    msgpack_pack_nil(pk);
    msgpack_pack_nil(pk);
    t_err(t_call(), KV_INVALID_ARGUMENT, "INVALID_ARGUMENT");
    cr_assert_eq(T.stats_calls, 2);
}

/* ---- put / get ---- */

Test(rpc, put_then_get_is_byte_exact)
{
    const size_t sizes[] = {0, 1, 4095, 4096, 4097, 100000, T_VALUE_MAX};

    for (size_t i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++) {
        char key[32];
        snprintf(key, sizeof(key), "blk-%zu", i);
        uint8_t *v = t_pattern(sizes[i], (uint32_t)i + 1);
        cr_assert_eq(t_put(key, v, sizes[i]), 0, "put of %zu bytes", sizes[i]);
        t_is_bin(t_get(key), v, sizes[i]);
        free(v);
    }
    cr_assert_eq(t_stats().objects, 7);
    cr_assert_eq(atomic_load(&T.ctr.hits), 7);

    /* str and bin keys with the same bytes are the same key */
    msgpack_packer *pk = t_req("get", 1);
    t_s(pk, "blk-1");
    uint8_t *v1 = t_pattern(1, 2);
    t_is_bin(t_ok(t_call()), v1, 1);
    free(v1);
}

Test(rpc, put_existing_key_answers_exists_and_keeps_first_value)
{
    t_put_str("k1", "hello");
    cr_assert_eq(t_put("k1", "HELLO, again", 12), KV_EXISTS);
    t_is_bin(t_get("k1"), "hello", 5);
    cr_assert_eq(t_stats().objects, 1);

    /* a key over max_key_size: per-key TOO_LARGE, nothing stored */
    char big[T_KEY_MAX + 2];
    memset(big, 'k', sizeof(big) - 1);
    big[sizeof(big) - 1] = '\0';
    cr_assert_eq(t_put(big, "v", 1), KV_TOO_LARGE);
    cr_assert_eq(t_stats().objects, 1);
}

Test(rpc, get_miss_is_nil)
{
    t_is_nil(t_get("nope"));
    cr_assert_eq(atomic_load(&T.ctr.misses), 1);

    /* a key over max_key_size cannot exist: nil, not an error */
    char big[T_KEY_MAX + 2];
    memset(big, 'z', sizeof(big) - 1);
    big[sizeof(big) - 1] = '\0';
    t_is_nil(t_get(big));
    cr_assert_eq(atomic_load(&T.ctr.misses), 2);
    cr_assert_eq(atomic_load(&T.ctr.hits), 0);
}

Test(rpc, batch_put_gives_per_key_codes)
{
    uint8_t *big = t_pattern(T_VALUE_MAX + 1, 9);
    uint8_t *ok = t_pattern(T_VALUE_MAX, 10);
    char longkey[T_KEY_MAX + 2];
    memset(longkey, 'L', sizeof(longkey) - 1);
    longkey[sizeof(longkey) - 1] = '\0';

    t_put_str("pre", "existing");
    msgpack_packer *pk = t_req("batch_put", 2);
    const char *ks[] = {"a", "toolarge", "c", "a", "pre", longkey, "max"};
    t_keys(pk, ks, 7);
    msgpack_pack_array(pk, 7);
    t_bin(pk, "x", 1);
    t_bin(pk, big, T_VALUE_MAX + 1);
    t_bin(pk, "zz", 2);
    t_bin(pk, "second a", 8);
    t_bin(pk, "new", 3);
    t_bin(pk, "v", 1);
    t_bin(pk, ok, T_VALUE_MAX);
    const int want[] = {0, KV_TOO_LARGE, 0, KV_EXISTS, KV_EXISTS, KV_TOO_LARGE, 0};
    t_codes(t_ok(t_call()), want, 7);

    t_is_bin(t_get("a"), "x", 1);
    t_is_nil(t_get("toolarge"));
    t_is_bin(t_get("c"), "zz", 2);
    t_is_bin(t_get("pre"), "existing", 8);
    t_is_bin(t_get("max"), ok, T_VALUE_MAX);
    cr_assert_eq(t_stats().objects, 4);
    free(big);
    free(ok);
}

Test(rpc, batch_get_mixed_hits_and_misses)
{
    uint8_t *v = t_pattern(20000, 3);

    t_put_str("a", "alpha");
    cr_assert_eq(t_put("b", v, 20000), 0);
    msgpack_packer *pk = t_req("batch_get", 1);
    const char *ks[] = {"a", "missing", "b", "a"};
    t_keys(pk, ks, 4);
    const msgpack_object *r = t_ok(t_call());
    cr_assert_eq(r->type, MSGPACK_OBJECT_ARRAY);
    cr_assert_eq(r->via.array.size, 4);
    t_is_bin(&r->via.array.ptr[0], "alpha", 5);
    t_is_nil(&r->via.array.ptr[1]);
    t_is_bin(&r->via.array.ptr[2], v, 20000);
    t_is_bin(&r->via.array.ptr[3], "alpha", 5);
    cr_assert_eq(atomic_load(&T.ctr.hits), 3);
    cr_assert_eq(atomic_load(&T.ctr.misses), 1);

    /* empty batch: empty array */
    t_keys(t_req("batch_get", 1), NULL, 0);
    r = t_ok(t_call());
    cr_assert_eq(r->type, MSGPACK_OBJECT_ARRAY);
    cr_assert_eq(r->via.array.size, 0);
    free(v);
}

Test(rpc, is_exist_and_batch_is_exist)
{
    t_put_str("a", "1");
    t_put_str("c", "3");

    t_k(t_req("is_exist", 1), "a");
    t_is_bool(t_ok(t_call()), true);
    t_k(t_req("is_exist", 1), "b");
    t_is_bool(t_ok(t_call()), false);

    msgpack_packer *pk = t_req("batch_is_exist", 1);
    const char *ks[] = {"a", "b", "c"};
    t_keys(pk, ks, 3);
    const msgpack_object *r = t_ok(t_call());
    cr_assert_eq(r->type, MSGPACK_OBJECT_ARRAY);
    cr_assert_eq(r->via.array.size, 3);
    t_is_bool(&r->via.array.ptr[0], true);
    t_is_bool(&r->via.array.ptr[1], false);
    t_is_bool(&r->via.array.ptr[2], true);
}

Test(rpc, prefix_match_counts_leading_keys_and_groups)
{
    t_put_str("a", "1");
    t_put_str("b", "2");
    t_put_str("c", "3");

    /* stops at the first missing key */
    const char *k1[] = {"a", "b", "d", "c"};
    t_keys(t_req("prefix_match", 1), k1, 4);
    t_is_uint(t_ok(t_call()), 2);
    const char *k2[] = {"d", "a"};
    t_keys(t_req("prefix_match", 1), k2, 2);
    t_is_uint(t_ok(t_call()), 0);
    const char *k3[] = {"a", "b", "c"};
    t_keys(t_req("prefix_match", 1), k3, 3);
    t_is_uint(t_ok(t_call()), 3);

    /* opts nil is the same as absent */
    msgpack_packer *pk = t_req("prefix_match", 2);
    t_keys(pk, k1, 4);
    msgpack_pack_nil(pk);
    t_is_uint(t_ok(t_call()), 2);

    /* groups of 2: {a,b} all exist, {c,d} does not */
    const char *k4[] = {"a", "b", "c", "d"};
    pk = t_req("prefix_match", 2);
    t_keys(pk, k4, 4);
    msgpack_pack_map(pk, 1);
    t_s(pk, "group_size");
    msgpack_pack_uint8(pk, 2);
    t_is_uint(t_ok(t_call()), 1);

    /* one group of 3 that all exist */
    pk = t_req("prefix_match", 2);
    t_keys(pk, k3, 3);
    msgpack_pack_map(pk, 1);
    t_s(pk, "group_size");
    msgpack_pack_uint8(pk, 3);
    t_is_uint(t_ok(t_call()), 1);

    /* 3 keys are not a multiple of 2 */
    pk = t_req("prefix_match", 2);
    t_keys(pk, k3, 3);
    msgpack_pack_map(pk, 1);
    t_s(pk, "group_size");
    msgpack_pack_uint8(pk, 2);
    t_err(t_call(), KV_INVALID_ARGUMENT, "INVALID_ARGUMENT");

    /* group_size 0 and a non-integer group_size are refused */
    pk = t_req("prefix_match", 2);
    t_keys(pk, k3, 3);
    msgpack_pack_map(pk, 1);
    t_s(pk, "group_size");
    msgpack_pack_uint8(pk, 0);
    t_err(t_call(), KV_INVALID_ARGUMENT, "INVALID_ARGUMENT");
    pk = t_req("prefix_match", 2);
    t_keys(pk, k3, 3);
    msgpack_pack_map(pk, 1);
    t_s(pk, "group_size");
    t_s(pk, "2");
    t_err(t_call(), KV_INVALID_ARGUMENT, "INVALID_ARGUMENT");
}

Test(rpc, get_size_and_batch_get_size)
{
    uint8_t *v = t_pattern(12345, 5);

    cr_assert_eq(t_put("big", v, 12345), 0);
    t_put_str("small", "abc");
    cr_assert_eq(t_put("empty", "", 0), 0);

    t_k(t_req("get_size", 1), "big");
    t_is_uint(t_ok(t_call()), 12345);
    t_k(t_req("get_size", 1), "nope");
    t_is_nil(t_ok(t_call()));

    msgpack_packer *pk = t_req("batch_get_size", 1);
    const char *ks[] = {"small", "nope", "empty", "big"};
    t_keys(pk, ks, 4);
    const msgpack_object *r = t_ok(t_call());
    cr_assert_eq(r->type, MSGPACK_OBJECT_ARRAY);
    cr_assert_eq(r->via.array.size, 4);
    t_is_uint(&r->via.array.ptr[0], 3);
    t_is_nil(&r->via.array.ptr[1]);
    t_is_uint(&r->via.array.ptr[2], 0);
    t_is_uint(&r->via.array.ptr[3], 12345);
    free(v);
}

Test(rpc, remove_batch_remove_and_remove_all)
{
    t_put_str("a", "1");
    t_put_str("b", "2");
    t_put_str("c", "3");
    t_put_str("d", "4");

    t_k(t_req("remove", 1), "a");
    t_is_uint(t_ok(t_call()), 0);
    t_is_nil(t_get("a"));
    t_k(t_req("remove", 1), "a");
    t_is_uint(t_ok(t_call()), KV_NOT_FOUND);

    /* remove with {"force": true} */
    msgpack_packer *pk = t_req("remove", 2);
    t_k(pk, "d");
    msgpack_pack_map(pk, 1);
    t_s(pk, "force");
    msgpack_pack_true(pk);
    t_is_uint(t_ok(t_call()), 0);
    cr_assert(!t_stored("d"));

    pk = t_req("batch_remove", 1);
    const char *ks[] = {"b", "missing", "b"};
    t_keys(pk, ks, 3);
    const int want[] = {0, KV_NOT_FOUND, KV_NOT_FOUND};
    t_codes(t_ok(t_call()), want, 3);
    cr_assert(!t_stored("b"));
    cr_assert(t_stored("c"));

    /* remove_all only touches the caller's tenant */
    T.ctx.tenant = 7;
    t_put_str("t7-a", "x");
    t_put_str("t7-b", "y");
    T.ctx.tenant = 0;
    t_put_str("e", "5");
    t_req("remove_all", 0);
    t_is_uint(t_ok(t_call()), 2);
    cr_assert(!t_stored("c"));
    cr_assert(!t_stored("e"));
    cr_assert_eq(t_stats().objects, 2);
    T.ctx.tenant = 7;
    t_is_bin(t_get("t7-a"), "x", 1);
    t_req("remove_all", 0);
    t_is_uint(t_ok(t_call()), 2);
    cr_assert_eq(t_stats().objects, 0);
}

Test(rpc, remove_while_get_reply_unsent_is_busy)
{
    uint8_t *v = t_pattern(9000, 4);
    msgpack_object o[3];

    cr_assert_eq(t_put("hot", v, 9000), 0);
    /* pipeline: get (its value stays queued by reference), then remove, then get again */
    t_k(t_req("get", 1), "hot");
    uint64_t id_get = T.msgid;
    cr_assert_eq(t_dispatch(), 0);
    t_k(t_req("remove", 1), "hot");
    uint64_t id_rm = T.msgid;
    cr_assert_eq(t_dispatch(), 0);
    cr_assert_eq(t_replies(o, 3), 2);
    t_is_bin(t_ok_id(o[0], id_get), v, 9000);
    t_is_uint(t_ok_id(o[1], id_rm), KV_BUSY);

    /* the reply has been sent: remove now works */
    t_k(t_req("remove", 1), "hot");
    t_is_uint(t_ok(t_call()), 0);
    t_is_nil(t_get("hot"));
    free(v);
}

Test(rpc, pin_and_unpin_codes)
{
    t_put_str("a", "1");
    t_put_str("b", "2");

    msgpack_packer *pk = t_req("pin", 2);
    const char *ks[] = {"a", "missing"};
    t_keys(pk, ks, 2);
    t_s(pk, "hard");
    const int want[] = {0, KV_NOT_FOUND};
    t_codes(t_ok(t_call()), want, 2);
    cr_assert_eq(t_stats().pinned_hard, 1);

    pk = t_req("pin", 2);
    const char *kb[] = {"b"};
    t_keys(pk, kb, 1);
    t_s(pk, "soft");
    const int want_b[] = {0};
    t_codes(t_ok(t_call()), want_b, 1);
    cr_assert_eq(t_stats().pinned_soft, 1);

    /* a bad mode changes nothing */
    pk = t_req("pin", 2);
    t_keys(pk, kb, 1);
    t_s(pk, "medium");
    t_err(t_call(), KV_INVALID_ARGUMENT, "INVALID_ARGUMENT");
    pk = t_req("pin", 2);
    t_keys(pk, kb, 1);
    msgpack_pack_uint8(pk, 2);
    t_err(t_call(), KV_INVALID_ARGUMENT, "INVALID_ARGUMENT");
    pk = t_req("pin", 1);
    t_keys(pk, kb, 1);
    t_err(t_call(), KV_INVALID_ARGUMENT, "INVALID_ARGUMENT");
    cr_assert_eq(t_stats().pinned_soft, 1);

    pk = t_req("unpin", 1);
    const char *ku[] = {"a", "b", "missing"};
    t_keys(pk, ku, 3);
    const int want_u[] = {0, 0, KV_NOT_FOUND};
    t_codes(t_ok(t_call()), want_u, 3);
    cr_assert_eq(t_stats().pinned_hard, 0);
    cr_assert_eq(t_stats().pinned_soft, 0);
}

/* ---- request-level errors ---- */

Test(rpc, unknown_method_is_method_not_found_with_msgid_echoed)
{
    t_req("frobnicate", 0);
    msgpack_object o = t_call();
    t_err(o, KV_METHOD_NOT_FOUND, "METHOD_NOT_FOUND");
    cr_assert(t_str_is(&o.via.array.ptr[2].via.array.ptr[2], "no such method"));
    cr_assert_eq(atomic_load(&T.ctr.errors), 1);

    /* a method name that is a prefix of a real one is not that method */
    t_req("pin_", 0);
    t_err(t_call(), KV_METHOD_NOT_FOUND, "METHOD_NOT_FOUND");
    t_req("ge", 0);
    t_err(t_call(), KV_METHOD_NOT_FOUND, "METHOD_NOT_FOUND");

    /* the exact bytes of SPEC.md section 8 */
    static const uint8_t req[] = {0x94, 0x00, 0x0b, 0xaa, 'f', 'r', 'o', 'b',
                                  'n',  'i',  'c',  'a',  't', 'e', 0x90};
    static const uint8_t want[] = {0x94, 0x01, 0x0b, 0x93, 0x07, 0xb0, 'M', 'E', 'T', 'H',
                                   'O',  'D',  '_',  'N',  'O',  'T',  '_', 'F', 'O', 'U',
                                   'N',  'D',  0xae, 'n',  'o',  ' ',  's', 'u', 'c', 'h',
                                   ' ',  'm',  'e',  't',  'h',  'o',  'd', 0xc0};
    uint8_t *msg = t_dup(req, sizeof(req));
    cr_assert_eq(rpc_dispatch(&T.ctx, msg, sizeof(req), NULL, 0, &T.out), 0);
    free(msg);
    size_t len;
    uint8_t *got = t_drain(&len);
    cr_assert_eq(len, sizeof(want));
    cr_assert_arr_eq(got, want, sizeof(want));
}

Test(rpc, wrong_arity_and_types_are_invalid_argument_and_change_nothing)
{
    msgpack_packer *pk;

    /* put with one param; put with a str value; put with an int key */
    t_k(t_req("put", 1), "k");
    t_err(t_call(), KV_INVALID_ARGUMENT, "INVALID_ARGUMENT");
    pk = t_req("put", 2);
    t_k(pk, "k");
    t_s(pk, "a str value");
    t_err(t_call(), KV_INVALID_ARGUMENT, "INVALID_ARGUMENT");
    pk = t_req("put", 2);
    msgpack_pack_uint8(pk, 1);
    t_bin(pk, "v", 1);
    t_err(t_call(), KV_INVALID_ARGUMENT, "INVALID_ARGUMENT");
    /* put with opts that are not a map */
    pk = t_req("put", 3);
    t_k(pk, "k");
    t_bin(pk, "v", 1);
    msgpack_pack_uint8(pk, 1);
    t_err(t_call(), KV_INVALID_ARGUMENT, "INVALID_ARGUMENT");
    cr_assert(!t_stored("k"));

    /* batch_put: 2 keys, 1 value */
    pk = t_req("batch_put", 2);
    const char *ks[] = {"a", "b"};
    t_keys(pk, ks, 2);
    msgpack_pack_array(pk, 1);
    t_bin(pk, "x", 1);
    t_err(t_call(), KV_INVALID_ARGUMENT, "INVALID_ARGUMENT");
    /* batch_put: the second value is not bin; the first must not be stored either */
    pk = t_req("batch_put", 2);
    t_keys(pk, ks, 2);
    msgpack_pack_array(pk, 2);
    t_bin(pk, "x", 1);
    t_s(pk, "y");
    t_err(t_call(), KV_INVALID_ARGUMENT, "INVALID_ARGUMENT");
    /* batch_put: a key that is not bin/str */
    pk = t_req("batch_put", 2);
    msgpack_pack_array(pk, 2);
    t_k(pk, "a");
    msgpack_pack_nil(pk);
    msgpack_pack_array(pk, 2);
    t_bin(pk, "x", 1);
    t_bin(pk, "y", 1);
    t_err(t_call(), KV_INVALID_ARGUMENT, "INVALID_ARGUMENT");
    /* batch_put: bad opts after valid keys/values */
    pk = t_req("batch_put", 3);
    t_keys(pk, ks, 2);
    msgpack_pack_array(pk, 2);
    t_bin(pk, "x", 1);
    t_bin(pk, "y", 1);
    msgpack_pack_array(pk, 0);
    t_err(t_call(), KV_INVALID_ARGUMENT, "INVALID_ARGUMENT");
    cr_assert(!t_stored("a"));
    cr_assert(!t_stored("b"));
    cr_assert_eq(t_stats().objects, 0);
    cr_assert_eq(t_stats().reserved, 0);

    /* get with no params / with two / with a map key */
    t_req("get", 0);
    t_err(t_call(), KV_INVALID_ARGUMENT, "INVALID_ARGUMENT");
    pk = t_req("get", 2);
    t_k(pk, "a");
    t_k(pk, "b");
    t_err(t_call(), KV_INVALID_ARGUMENT, "INVALID_ARGUMENT");
    msgpack_pack_map(t_req("get", 1), 0);
    t_err(t_call(), KV_INVALID_ARGUMENT, "INVALID_ARGUMENT");
    /* batch_get whose keys is a single key, not an array */
    t_k(t_req("batch_get", 1), "a");
    t_err(t_call(), KV_INVALID_ARGUMENT, "INVALID_ARGUMENT");

    /* remove with a non-bool force changes nothing */
    t_put_str("keep", "v");
    pk = t_req("remove", 2);
    t_k(pk, "keep");
    msgpack_pack_map(pk, 1);
    t_s(pk, "force");
    msgpack_pack_uint8(pk, 1);
    t_err(t_call(), KV_INVALID_ARGUMENT, "INVALID_ARGUMENT");
    pk = t_req("batch_remove", 2);
    const char *kk[] = {"keep"};
    t_keys(pk, kk, 1);
    msgpack_pack_map(pk, 1);
    msgpack_pack_uint8(pk, 1);
    msgpack_pack_true(pk);
    t_err(t_call(), KV_INVALID_ARGUMENT, "INVALID_ARGUMENT");
    msgpack_pack_uint8(t_req("remove_all", 1), 3);
    t_err(t_call(), KV_INVALID_ARGUMENT, "INVALID_ARGUMENT");
    cr_assert(t_stored("keep"));

    /* params not an array; method not a str */
    pk = t_raw();
    T.msgid = 4242;
    msgpack_pack_array(pk, 4);
    msgpack_pack_uint8(pk, 0);
    msgpack_pack_uint16(pk, 4242);
    t_s(pk, "ping");
    msgpack_pack_map(pk, 0);
    t_err(t_call(), KV_INVALID_ARGUMENT, "INVALID_ARGUMENT");
    pk = t_raw();
    T.msgid = 4243;
    msgpack_pack_array(pk, 4);
    msgpack_pack_uint8(pk, 0);
    msgpack_pack_uint16(pk, 4243);
    msgpack_pack_uint8(pk, 1);
    msgpack_pack_array(pk, 0);
    t_err(t_call(), KV_INVALID_ARGUMENT, "INVALID_ARGUMENT");
    cr_assert_eq(atomic_load(&T.ctr.errors), 17);
}

Test(rpc, batch_over_max_batch_is_too_large)
{
    const char *ks[T_BATCH_MAX + 1] = {"k0", "k1", "k2", "k3", "k4", "k5", "k6", "k7", "k8"};
    msgpack_packer *pk;

    pk = t_req("batch_put", 2);
    t_keys(pk, ks, T_BATCH_MAX + 1);
    msgpack_pack_array(pk, T_BATCH_MAX + 1);
    for (uint32_t i = 0; i <= T_BATCH_MAX; i++) {
        t_bin(pk, "v", 1);
    }
    t_err(t_call(), KV_TOO_LARGE, "TOO_LARGE");
    cr_assert_eq(t_stats().objects, 0);

    const char *methods[] = {"batch_get",    "batch_is_exist", "batch_get_size",
                             "batch_remove", "prefix_match",   "unpin"};
    for (size_t m = 0; m < sizeof(methods) / sizeof(methods[0]); m++) {
        t_keys(t_req(methods[m], 1), ks, T_BATCH_MAX + 1);
        t_err(t_call(), KV_TOO_LARGE, "TOO_LARGE");
    }

    /* exactly max_batch is fine */
    pk = t_req("batch_put", 2);
    t_keys(pk, ks, T_BATCH_MAX);
    msgpack_pack_array(pk, T_BATCH_MAX);
    for (uint32_t i = 0; i < T_BATCH_MAX; i++) {
        t_bin(pk, "v", 1);
    }
    const int want[T_BATCH_MAX] = {0};
    t_codes(t_ok(t_call()), want, T_BATCH_MAX);
    cr_assert_eq(t_stats().objects, T_BATCH_MAX);
}

Test(rpc, non_request_is_protocol_error_with_no_reply)
{
    msgpack_packer *pk;

    /* root not an array */
    msgpack_pack_uint8(t_raw(), 5);
    cr_assert_eq(t_dispatch(), KV_PROTOCOL_ERROR);
    /* a response [1, 0, nil, nil] */
    pk = t_raw();
    msgpack_pack_array(pk, 4);
    msgpack_pack_uint8(pk, 1);
    msgpack_pack_uint8(pk, 0);
    msgpack_pack_nil(pk);
    msgpack_pack_nil(pk);
    cr_assert_eq(t_dispatch(), KV_PROTOCOL_ERROR);
    /* a request of 3 elements */
    pk = t_raw();
    msgpack_pack_array(pk, 3);
    msgpack_pack_uint8(pk, 0);
    msgpack_pack_uint8(pk, 1);
    t_s(pk, "ping");
    cr_assert_eq(t_dispatch(), KV_PROTOCOL_ERROR);
    /* a negative msgid */
    pk = t_raw();
    msgpack_pack_array(pk, 4);
    msgpack_pack_uint8(pk, 0);
    msgpack_pack_int8(pk, -1);
    t_s(pk, "ping");
    msgpack_pack_array(pk, 0);
    cr_assert_eq(t_dispatch(), KV_PROTOCOL_ERROR);
    /* cut short before the msgid */
    t_req("ping", 0);
    T.sb.size = 2;
    cr_assert_eq(t_dispatch(), KV_PROTOCOL_ERROR);
    cr_assert_eq(outq_pending(&T.out), 0, "a protocol error must not queue a reply");
}

Test(rpc, client_notification_gets_no_reply)
{
    msgpack_packer *pk = t_raw();

    msgpack_pack_array(pk, 3);
    msgpack_pack_uint8(pk, 2);
    t_s(pk, "x");
    msgpack_pack_array(pk, 0);
    cr_assert_eq(t_dispatch(), 0);
    cr_assert_eq(outq_pending(&T.out), 0);

    /* even one naming a real method does nothing */
    pk = t_raw();
    msgpack_pack_array(pk, 3);
    msgpack_pack_uint8(pk, 2);
    t_s(pk, "put");
    msgpack_pack_array(pk, 2);
    t_k(pk, "n");
    t_bin(pk, "v", 1);
    cr_assert_eq(t_dispatch(), 0);
    cr_assert_eq(outq_pending(&T.out), 0);
    cr_assert(!t_stored("n"));
}

Test(rpc, notify_error_bytes)
{
    cr_assert_eq(rpc_notify_error(&T.out, KV_PROTOCOL_ERROR, "map count cannot fit"), 0);
    msgpack_object o;
    cr_assert_eq(t_replies(&o, 1), 1);
    cr_assert_eq(o.type, MSGPACK_OBJECT_ARRAY);
    cr_assert_eq(o.via.array.size, 3);
    t_is_uint(&o.via.array.ptr[0], 2);
    cr_assert(t_str_is(&o.via.array.ptr[1], "error"));
    const msgpack_object *e = &o.via.array.ptr[2];
    cr_assert_eq(e->type, MSGPACK_OBJECT_ARRAY);
    cr_assert_eq(e->via.array.size, 3);
    t_is_uint(&e->via.array.ptr[0], KV_PROTOCOL_ERROR);
    cr_assert(t_str_is(&e->via.array.ptr[1], "PROTOCOL_ERROR"));
    cr_assert(t_str_is(&e->via.array.ptr[2], "map count cannot fit"));

    cr_assert_eq(rpc_notify_error(&T.out, KV_UNAVAILABLE, "max_connections reached"), 0);
    cr_assert_eq(t_replies(&o, 1), 1);
    e = &o.via.array.ptr[2];
    t_is_uint(&e->via.array.ptr[0], KV_UNAVAILABLE);
    cr_assert(t_str_is(&e->via.array.ptr[1], "UNAVAILABLE"));
    cr_assert(t_str_is(&e->via.array.ptr[2], "max_connections reached"));
}

/* ---- spilled put values (holes) ---- */

/* t_reserve: what conn.c gets from rpc_spill_take for a put value: a reservation filled with v. */
static struct store_obj *
t_reserve(const char *key, const void *v, uint64_t n)
{
    struct kv_key k = {
        .tenant = T.ctx.tenant, .len = (uint32_t)strlen(key), .ptr = (const uint8_t *)key};
    struct store_obj *o = NULL;

    cr_assert_eq(store_reserve(T.s, &k, n, &o), 0, "reserve %s", key);
    cr_assert_eq(store_obj_write(o, 0, v, n), n);
    return o;
}

/* t_hole_here: the bin header of n bytes goes in, its body does not: a hole at the current end. */
static struct mp_hole
t_hole_here(msgpack_packer *pk, uint64_t n, struct rpc_spill *sp)
{
    msgpack_pack_bin(pk, (size_t)n);
    return (struct mp_hole){.off = T.sb.size, .len = n, .tag = sp};
}

Test(rpc, spilled_put_value_is_committed)
{
    const uint64_t n = 100000;
    uint8_t *v = t_pattern(n, 21);
    struct rpc_spill sp = {.obj = t_reserve("spilled", v, n)};

    cr_assert_eq(t_stats().reserved, 1);
    t_is_nil(t_get("spilled")); /* invisible while reserved */

    msgpack_packer *pk = t_req("put", 2);
    t_k(pk, "spilled");
    struct mp_hole h = t_hole_here(pk, n, &sp);
    t_is_uint(t_ok(t_call_holes(&h, 1)), 0);
    cr_assert_null(sp.obj, "the committed reservation must be taken from the spill");
    cr_assert_eq(t_stats().reserved, 0);
    t_is_bin(t_get("spilled"), v, n);

    /* a spill that could not be reserved reports its code per key */
    struct rpc_spill busy = {.obj = NULL, .code = KV_EXISTS};
    pk = t_req("put", 2);
    t_k(pk, "spilled");
    h = t_hole_here(pk, n, &busy);
    t_is_uint(t_ok(t_call_holes(&h, 1)), KV_EXISTS);
    t_is_bin(t_get("spilled"), v, n);
    free(v);
}

Test(rpc, spilled_batch_put_values_mixed_with_inline)
{
    const uint64_t n0 = 30000, n2 = 70000;
    uint8_t *v0 = t_pattern(n0, 1), *v2 = t_pattern(n2, 2);
    struct rpc_spill sp[2] = {{.obj = t_reserve("k0", v0, n0)}, {.obj = t_reserve("k2", v2, n2)}};
    struct mp_hole h[2];

    msgpack_packer *pk = t_req("batch_put", 2);
    const char *ks[] = {"k0", "k1", "k2"};
    t_keys(pk, ks, 3);
    msgpack_pack_array(pk, 3);
    h[0] = t_hole_here(pk, n0, &sp[0]);
    t_bin(pk, "inline", 6);
    h[1] = t_hole_here(pk, n2, &sp[1]);
    const int want[] = {0, 0, 0};
    t_codes(t_ok(t_call_holes(h, 2)), want, 3);
    cr_assert_eq(t_stats().reserved, 0);
    cr_assert_eq(t_stats().objects, 3);
    t_is_bin(t_get("k0"), v0, n0);
    t_is_bin(t_get("k1"), "inline", 6);
    t_is_bin(t_get("k2"), v2, n2);
    free(v0);
    free(v2);
}

Test(rpc, invalid_request_aborts_spilled_reservations)
{
    const uint64_t n = 50000;
    uint8_t *v = t_pattern(n, 8);
    uint64_t before = t_stats().memory_used;

    /* batch_put with 2 keys and 1 (spilled) value */
    struct rpc_spill sp = {.obj = t_reserve("a", v, n)};
    cr_assert_gt(t_stats().memory_used, before);
    msgpack_packer *pk = t_req("batch_put", 2);
    const char *ks[] = {"a", "b"};
    t_keys(pk, ks, 2);
    msgpack_pack_array(pk, 1);
    struct mp_hole h = t_hole_here(pk, n, &sp);
    t_err(t_call_holes(&h, 1), KV_INVALID_ARGUMENT, "INVALID_ARGUMENT");
    cr_assert_null(sp.obj);
    cr_assert_eq(t_stats().reserved, 0);
    cr_assert_eq(t_stats().objects, 0);
    cr_assert_eq(t_stats().memory_used, before);
    t_is_nil(t_get("a"));

    /* put with bad opts after a spilled value */
    sp.obj = t_reserve("a", v, n);
    pk = t_req("put", 3);
    t_k(pk, "a");
    h = t_hole_here(pk, n, &sp);
    msgpack_pack_uint8(pk, 9);
    t_err(t_call_holes(&h, 1), KV_INVALID_ARGUMENT, "INVALID_ARGUMENT");
    cr_assert_eq(t_stats().reserved, 0);
    cr_assert_eq(t_stats().memory_used, before);

    /* a message that is not a request at all (5 elements) */
    sp.obj = t_reserve("a", v, n);
    pk = t_raw();
    msgpack_pack_array(pk, 5);
    msgpack_pack_uint8(pk, 0);
    msgpack_pack_uint8(pk, 1);
    t_s(pk, "put");
    msgpack_pack_array(pk, 2);
    t_k(pk, "a");
    h = t_hole_here(pk, n, &sp);
    msgpack_pack_nil(pk);
    cr_assert_eq(t_dispatch_holes(&h, 1), KV_PROTOCOL_ERROR);
    cr_assert_eq(t_stats().reserved, 0);
    cr_assert_eq(t_stats().memory_used, before);

    /* a client notification carrying a spilled value */
    sp.obj = t_reserve("a", v, n);
    pk = t_raw();
    msgpack_pack_array(pk, 3);
    msgpack_pack_uint8(pk, 2);
    t_s(pk, "put");
    msgpack_pack_array(pk, 2);
    t_k(pk, "a");
    h = t_hole_here(pk, n, &sp);
    cr_assert_eq(t_dispatch_holes(&h, 1), 0);
    cr_assert_eq(outq_pending(&T.out), 0);
    cr_assert_eq(t_stats().reserved, 0);
    cr_assert_eq(t_stats().memory_used, before);

    /* the key is free again: a later put stores it (not BUSY) */
    cr_assert_eq(t_put("a", "fresh", 5), 0);
    t_is_bin(t_get("a"), "fresh", 5);
    free(v);
}

Test(rpc, oversized_key_hole_answers_per_key)
{
    const uint64_t n = 5000; /* a key far over max_key_size (64), spilled away by the reader */
    struct rpc_spill over = {.obj = NULL, .code = KV_TOO_LARGE};

    /* as any key over max_key_size: a miss, not a request-level error */
    msgpack_packer *pk = t_req("get", 1);
    struct mp_hole h = t_hole_here(pk, n, &over);
    t_is_nil(t_ok(t_call_holes(&h, 1)));
    cr_assert_eq(atomic_load(&T.ctr.errors), 0);

    /* in a batch_put next to a spilled value: that key is TOO_LARGE, the other stored */
    const uint64_t vn = 40000;
    uint8_t *v = t_pattern(vn, 3);
    struct rpc_spill sp[2] = {over, {.obj = t_reserve("ok", v, vn)}};
    struct mp_hole hs[2];
    pk = t_req("batch_put", 2);
    msgpack_pack_array(pk, 2);
    hs[0] = t_hole_here(pk, n, &sp[0]);
    t_k(pk, "ok");
    msgpack_pack_array(pk, 2);
    t_bin(pk, "x", 1);
    hs[1] = t_hole_here(pk, vn, &sp[1]);
    const int want[] = {KV_TOO_LARGE, 0};
    t_codes(t_ok(t_call_holes(hs, 2)), want, 2);
    cr_assert_eq(t_stats().reserved, 0);
    cr_assert_eq(t_stats().objects, 1);
    t_is_bin(t_get("ok"), v, vn);
    free(v);
}

/* ---- rpc_spill_take decisions ---- */

Test(rpc, spill_take_put_value_reserves_under_its_key)
{
    const uint64_t n = 60000;
    uint8_t *v = t_pattern(n, 77);
    struct rpc_spill_cursor cur;
    struct rpc_spill sp;
    const uint32_t path[] = {3, 1};

    rpc_spill_reset(&cur);
    msgpack_packer *pk = t_req("put", 2);
    t_k(pk, "taken");
    msgpack_pack_bin(pk, n);
    size_t len = T.sb.size;
    uint8_t *prefix = t_dup(T.sb.data, len);
    cr_assert_eq(rpc_spill_take(&T.ctx, &cur, prefix, len, NULL, 0, path, 2, n, 1, &sp), 1);
    free(prefix);
    cr_assert_not_null(sp.obj);
    cr_assert_eq(t_stats().reserved, 1);
    cr_assert_eq(store_obj_size(sp.obj), n);

    /* receive the body into it and dispatch as conn.c does */
    cr_assert_eq(store_obj_write(sp.obj, 0, v, n), n);
    struct mp_hole h = {.off = len, .len = n, .tag = &sp};
    t_is_uint(t_ok(t_call_holes(&h, 1)), 0);
    t_is_bin(t_get("taken"), v, n);

    /* the same key again: taken (bytes discarded), no reservation, EXISTS */
    rpc_spill_reset(&cur);
    pk = t_req("put", 2);
    t_k(pk, "taken");
    msgpack_pack_bin(pk, n);
    cr_assert_eq(rpc_spill_take(&T.ctx, &cur, (const uint8_t *)T.sb.data, T.sb.size, NULL, 0, path,
                                2, n, 1, &sp),
                 1);
    cr_assert_null(sp.obj);
    cr_assert_eq(sp.code, KV_EXISTS);

    /* a value over max_value_size: taken, TOO_LARGE, nothing reserved */
    rpc_spill_reset(&cur);
    pk = t_req("put", 2);
    t_k(pk, "huge");
    msgpack_pack_bin(pk, T_VALUE_MAX + 1);
    len = T.sb.size;
    cr_assert_eq(rpc_spill_take(&T.ctx, &cur, (const uint8_t *)T.sb.data, len, NULL, 0, path, 2,
                                T_VALUE_MAX + 1, 1, &sp),
                 1);
    cr_assert_null(sp.obj);
    cr_assert_eq(sp.code, KV_TOO_LARGE);
    cr_assert_eq(t_stats().reserved, 0);
    h = (struct mp_hole){.off = len, .len = T_VALUE_MAX + 1, .tag = &sp};
    t_is_uint(t_ok(t_call_holes(&h, 1)), KV_TOO_LARGE);
    t_is_nil(t_get("huge"));
    free(v);
}

Test(rpc, spill_take_batch_put_reserves_key_i)
{
    const uint64_t n = 20000;
    const char *ks[] = {"first", "second", "third"};
    struct rpc_spill_cursor cur;
    struct rpc_spill sp[3];

    rpc_spill_reset(&cur);
    msgpack_packer *pk = t_req("batch_put", 2);
    t_keys(pk, ks, 3);
    msgpack_pack_array(pk, 3);
    for (uint32_t i = 0; i < 3; i++) {
        const uint32_t path[] = {3, 1, i};
        msgpack_pack_bin(pk, n + i);
        uint8_t *prefix = t_dup(T.sb.data, T.sb.size);
        cr_assert_eq(
            rpc_spill_take(&T.ctx, &cur, prefix, T.sb.size, NULL, 0, path, 3, n + i, 1, &sp[i]), 1,
            "value %u not taken", i);
        free(prefix);
        cr_assert_not_null(sp[i].obj, "value %u not reserved", i);
        cr_assert_eq(store_obj_size(sp[i].obj), n + i);
    }
    cr_assert_eq(t_stats().reserved, 3);
    for (uint32_t i = 0; i < 3; i++) {
        uint8_t *v = t_pattern(n + i, 100 + i);
        cr_assert_eq(store_obj_write(sp[i].obj, 0, v, n + i), n + i);
        cr_assert_eq(store_commit(T.s, sp[i].obj), 0);
        t_is_bin(t_get(ks[i]), v, n + i);
        free(v);
    }

    /* only the last value is big: the cursor walks past the first two keys */
    const char *ks2[] = {"x0", "x1", "x2"};
    uint8_t *v2 = t_pattern(n, 55);
    struct rpc_spill one;
    const uint32_t path2[] = {3, 1, 2};
    rpc_spill_reset(&cur);
    pk = t_req("batch_put", 2);
    t_keys(pk, ks2, 3);
    msgpack_pack_array(pk, 3);
    t_bin(pk, "a", 1);
    t_bin(pk, "bb", 2);
    msgpack_pack_bin(pk, n);
    size_t off = T.sb.size;
    cr_assert_eq(rpc_spill_take(&T.ctx, &cur, (const uint8_t *)T.sb.data, off, NULL, 0, path2, 3, n,
                                1, &one),
                 1);
    cr_assert_not_null(one.obj);
    cr_assert_eq(store_obj_write(one.obj, 0, v2, n), n);
    struct mp_hole h = {.off = off, .len = n, .tag = &one};
    const int want[] = {0, 0, 0};
    t_codes(t_ok(t_call_holes(&h, 1)), want, 3);
    t_is_bin(t_get("x0"), "a", 1);
    t_is_bin(t_get("x1"), "bb", 2);
    t_is_bin(t_get("x2"), v2, n);
    free(v2);
}

Test(rpc, spill_take_declines_short_and_discards_oversized)
{
    struct rpc_spill_cursor cur;
    struct rpc_spill sp;
    const uint32_t path[] = {3, 0};

    /* a get whose key is longer than max_key_size: taken, to be discarded */
    rpc_spill_reset(&cur);
    msgpack_packer *pk = t_req("get", 1);
    msgpack_pack_bin(pk, T_KEY_MAX + 1);
    cr_assert_eq(rpc_spill_take(&T.ctx, &cur, (const uint8_t *)T.sb.data, T.sb.size, NULL, 0, path,
                                2, T_KEY_MAX + 1, 1, &sp),
                 1);
    cr_assert_eq(sp.code, KV_TOO_LARGE);
    cr_assert_null(sp.obj);
    cr_assert_eq(t_stats().reserved, 0);

    /* a short one: buffered like any other bytes */
    rpc_spill_reset(&cur);
    pk = t_req("get", 1);
    msgpack_pack_bin(pk, 10);
    cr_assert_eq(rpc_spill_take(&T.ctx, &cur, (const uint8_t *)T.sb.data, T.sb.size, NULL, 0, path,
                                2, 10, 1, &sp),
                 0);
    rpc_spill_reset(&cur);
    pk = t_req("get", 1);
    msgpack_pack_bin(pk, T_KEY_MAX);
    cr_assert_eq(rpc_spill_take(&T.ctx, &cur, (const uint8_t *)T.sb.data, T.sb.size, NULL, 0, path,
                                2, T_KEY_MAX, 1, &sp),
                 0);

    /* a put's key (path {3,0}) that is too long: discarded, nothing reserved */
    rpc_spill_reset(&cur);
    pk = t_req("put", 2);
    msgpack_pack_bin(pk, 5000);
    cr_assert_eq(rpc_spill_take(&T.ctx, &cur, (const uint8_t *)T.sb.data, T.sb.size, NULL, 0, path,
                                2, 5000, 1, &sp),
                 1);
    cr_assert_eq(sp.code, KV_TOO_LARGE);
    cr_assert_null(sp.obj);

    /* a put value that is a str, not a bin: never reserved */
    const uint32_t vpath[] = {3, 1};
    rpc_spill_reset(&cur);
    pk = t_req("put", 2);
    t_k(pk, "k");
    msgpack_pack_str(pk, 5000);
    cr_assert_eq(rpc_spill_take(&T.ctx, &cur, (const uint8_t *)T.sb.data, T.sb.size, NULL, 0, vpath,
                                2, 5000, 0, &sp),
                 1);
    cr_assert_null(sp.obj);
    cr_assert_eq(sp.code, KV_TOO_LARGE);
    cr_assert_eq(t_stats().reserved, 0);
}

/* ---- a key repeated in one batch_put ---- */

/*
 * conn.c reserves a big value that arrives in pieces as soon as its header is
 * scanned, before the request runs: a later copy of a key can hold its
 * reservation while an earlier, inline copy still waits to be stored. The
 * first copy must win all the same, the later one answers EXISTS or BUSY, and
 * no reservation is left.
 */
Test(rpc, repeated_key_keeps_the_inline_first_copy_over_a_reserved_later_one)
{
    const uint64_t n = 30000;
    uint8_t *v = t_pattern(n, 31);
    struct rpc_spill_cursor cur;
    struct rpc_spill sp;
    const uint32_t path[] = {3, 1, 1};

    /* [["dup" as str, "dup" as bin], ["first" inline, 30000 bytes arriving in pieces]] */
    rpc_spill_reset(&cur);
    msgpack_packer *pk = t_req("batch_put", 2);
    msgpack_pack_array(pk, 2);
    t_s(pk, "dup");
    t_k(pk, "dup");
    msgpack_pack_array(pk, 2);
    t_bin(pk, "first", 5);
    msgpack_pack_bin(pk, n);
    size_t off = T.sb.size;
    cr_assert_eq(
        rpc_spill_take(&T.ctx, &cur, (const uint8_t *)T.sb.data, off, NULL, 0, path, 3, n, 1, &sp),
        1);
    cr_assert_not_null(sp.obj, "the later copy is reserved while it arrives");
    cr_assert_eq(t_stats().reserved, 1);
    cr_assert_eq(store_obj_write(sp.obj, 0, v, n), n);

    struct mp_hole h = {.off = off, .len = n, .tag = &sp};
    const int want[] = {0, KV_EXISTS};
    t_codes(t_ok(t_call_holes(&h, 1)), want, 2);
    cr_assert_null(sp.obj);
    cr_assert_eq(t_stats().reserved, 0);
    cr_assert_eq(t_stats().objects, 1);
    t_is_bin(t_get("dup"), "first", 5);
    free(v);
}

Test(rpc, repeated_key_three_copies_two_reserved_in_turn)
{
    const uint64_t n1 = 20000, n2 = 50000;
    uint8_t *v1 = t_pattern(n1, 41), *v2 = t_pattern(n2, 42);
    struct rpc_spill_cursor cur;
    struct rpc_spill sp[2];
    struct mp_hole h[2];
    const uint32_t path1[] = {3, 1, 1}, path2[] = {3, 1, 2};
    const char *ks[] = {"k3", "k3", "k3"};

    rpc_spill_reset(&cur);
    msgpack_packer *pk = t_req("batch_put", 2);
    t_keys(pk, ks, 3);
    msgpack_pack_array(pk, 3);
    t_bin(pk, "one", 3);
    msgpack_pack_bin(pk, n1);
    size_t off1 = T.sb.size;
    cr_assert_eq(rpc_spill_take(&T.ctx, &cur, (const uint8_t *)T.sb.data, off1, NULL, 0, path1, 3,
                                n1, 1, &sp[0]),
                 1);
    cr_assert_not_null(sp[0].obj);
    cr_assert_eq(store_obj_write(sp[0].obj, 0, v1, n1), n1);
    h[0] = (struct mp_hole){.off = off1, .len = n1, .tag = &sp[0]};
    msgpack_pack_bin(pk, n2);
    size_t off2 = T.sb.size;
    cr_assert_eq(rpc_spill_take(&T.ctx, &cur, (const uint8_t *)T.sb.data, off2, h, 1, path2, 3, n2,
                                1, &sp[1]),
                 1);
    cr_assert_null(sp[1].obj, "the key is reserved by the copy before: not twice");
    cr_assert_eq(sp[1].code, KV_BUSY);
    h[1] = (struct mp_hole){.off = off2, .len = n2, .tag = &sp[1]};

    const int want[] = {0, KV_EXISTS, KV_BUSY};
    t_codes(t_ok(t_call_holes(h, 2)), want, 3);
    cr_assert_eq(t_stats().reserved, 0);
    cr_assert_eq(t_stats().objects, 1);
    t_is_bin(t_get("k3"), "one", 3);
    free(v1);
    free(v2);
}

Test(rpc, repeated_key_reserved_copy_is_kept_when_the_first_cannot_be_stored)
{
    const uint64_t big = T_VALUE_MAX + 1, n = 20000;
    uint8_t *over = t_pattern(big, 51), *v = t_pattern(n, 52);
    struct rpc_spill sp[2] = {{.obj = t_reserve("r0", v, n)}, {.obj = t_reserve("r1", v, n)}};
    struct mp_hole h[2];
    const char *ks[] = {"r0", "r0", "r1", "r1"};

    /* r0: the first copy is over max_value_size (answered without the store): the reserved
     * copy after it is stored, as an inline one would be. r1: reserved first, inline after. */
    msgpack_packer *pk = t_req("batch_put", 2);
    t_keys(pk, ks, 4);
    msgpack_pack_array(pk, 4);
    t_bin(pk, over, big);
    h[0] = t_hole_here(pk, n, &sp[0]);
    h[1] = t_hole_here(pk, n, &sp[1]);
    t_bin(pk, "late", 4);
    const int want[] = {KV_TOO_LARGE, 0, 0, KV_EXISTS};
    t_codes(t_ok(t_call_holes(h, 2)), want, 4);
    cr_assert_eq(t_stats().reserved, 0);
    t_is_bin(t_get("r0"), v, n);
    t_is_bin(t_get("r1"), v, n);
    free(over);
    free(v);
}

Test(rpc, repeated_keys_with_many_reservations)
{
    enum { K = 40 };    /* more reservations than the map keeps on the stack */
    const uint64_t n = 16384;
    uint8_t *v = t_pattern(n, 61);
    struct rpc_spill sp[K];
    struct mp_hole h[K];
    char name[K][16];
    int want[2 * K];

    T.lim.max_batch = 2 * K;
    msgpack_packer *pk = t_req("batch_put", 2);
    msgpack_pack_array(pk, 2 * K);
    for (int i = 0; i < 2 * K; i++) {
        snprintf(name[i % K], sizeof(name[0]), "many-%d", i % K);
        t_k(pk, name[i % K]);
    }
    msgpack_pack_array(pk, 2 * K);
    for (int i = 0; i < K; i++) {
        t_bin(pk, name[i], strlen(name[i]));
        want[i] = 0;
    }
    for (int i = 0; i < K; i++) {
        sp[i] = (struct rpc_spill){.obj = t_reserve(name[i], v, n)};
        h[i] = t_hole_here(pk, n, &sp[i]);
        want[K + i] = KV_EXISTS;
    }
    cr_assert_eq(t_stats().reserved, K);
    t_codes(t_ok(t_call_holes(h, K)), want, 2 * K);
    cr_assert_eq(t_stats().reserved, 0);
    cr_assert_eq(t_stats().objects, K);
    for (int i = 0; i < K; i++) {
        t_is_bin(t_get(name[i]), name[i], strlen(name[i]));
    }
    free(v);
}

/* ---- reply marks and logins across a reload ---- */

/* Every reply is marked on the outq (client_inflight_max counts them); nothing else is. */
Test(rpc, every_reply_is_marked_and_nothing_else)
{
    msgpack_packer *pk;
    msgpack_object o[4];

    t_req("ping", 0);
    cr_assert_eq(t_dispatch(), 0);
    cr_assert_eq(outq_replies(&T.out), 1);
    t_req("no_such_method", 0);
    cr_assert_eq(t_dispatch(), 0);
    cr_assert_eq(outq_replies(&T.out), 2, "an error reply is a reply");
    t_req("get", 0);
    cr_assert_eq(t_dispatch(), 0);
    cr_assert_eq(outq_replies(&T.out), 3, "so is a request-level error");

    pk = t_raw();                       /* a client notification: no reply */
    msgpack_pack_array(pk, 3);
    msgpack_pack_uint8(pk, 2);
    t_s(pk, "ping");
    msgpack_pack_array(pk, 0);
    cr_assert_eq(t_dispatch(), 0);
    msgpack_pack_uint8(t_raw(), 5);     /* not a request: no reply */
    cr_assert_eq(t_dispatch(), KV_PROTOCOL_ERROR);
    cr_assert_eq(rpc_notify_error(&T.out, KV_TIMEOUT, "x"), 0);
    cr_assert_eq(outq_replies(&T.out), 3, "a notification is not a reply");

    cr_assert_eq(t_replies(o, 4), 4);
    cr_assert_eq(outq_replies(&T.out), 0, "all of them were drained");
}

static void
t_tenant(struct conf_tenants *ts, const char *name, const char *token)
{
    struct conf_tenant *t = &ts->t[ts->n++];

    memset(t, 0, sizeof(*t));
    snprintf(t->name, sizeof(t->name), "%s", name);
    SHA256((const uint8_t *)token, strlen(token), t->token_sha256);
    t->id = conf_tenant_id(name, strlen(name));
}

static int
t_hello_as(const char *tenant, const char *token)
{
    msgpack_packer *pk = t_req("hello", 1);
    msgpack_object o;

    msgpack_pack_map(pk, 2);
    t_s(pk, "tenant");
    t_s(pk, tenant);
    t_s(pk, "token");
    t_s(pk, token);
    cr_assert_eq(t_dispatch(), 0);
    cr_assert_eq(t_replies(&o, 1), 1);
    const msgpack_object *e = t_response(&o, T.msgid);
    return e[2].type == MSGPACK_OBJECT_NIL ? 0 : (int)e[2].via.array.ptr[0].via.i64;
}

/*
 * A login holds while its tenant is there with the token it logged in with:
 * a reload that removes the tenant or changes its token revokes it (the
 * daemon then closes the connection); other tenants' changes do not.
 */
Test(rpc, login_holds_until_its_tenant_goes_or_its_token_changes)
{
    static struct conf_tenants ts;
    const char *why = NULL;

    t_tenant(&ts, "alpha", "alpha-token");
    t_tenant(&ts, "beta", "beta-token");
    T.lim.tenants = &ts;
    T.lim.require_auth = true;
    cr_assert(rpc_auth_holds(&T.ctx, &why), "no login: nothing to revoke");
    cr_assert_eq(t_hello_as("beta", "beta-token"), 0);
    cr_assert(T.ctx.authed);
    cr_assert(rpc_auth_holds(&T.ctx, &why));

    /* another tenant's token changes, and the order of the lines: beta's login holds */
    ts.t[0] = ts.t[1];
    ts.n = 1;
    t_tenant(&ts, "alpha", "new-alpha-token");
    cr_assert(rpc_auth_holds(&T.ctx, &why));

    /* beta's token changes */
    SHA256((const uint8_t *)"new-beta-token", 14, ts.t[0].token_sha256);
    cr_assert_not(rpc_auth_holds(&T.ctx, &why));
    cr_assert_str_eq(why, "token changed by reload");
    /* logging in again with the new token makes it hold again; the old one is refused */
    cr_assert_eq(t_hello_as("beta", "beta-token"), KV_UNAUTHORIZED);
    cr_assert_eq(t_hello_as("beta", "new-beta-token"), 0);
    cr_assert(rpc_auth_holds(&T.ctx, &why));

    /* beta is removed */
    ts.t[0] = ts.t[1];
    ts.n = 1;
    cr_assert_not(rpc_auth_holds(&T.ctx, &why));
    cr_assert_str_eq(why, "tenant removed by reload");
    ts.n = 0;
    cr_assert_not(rpc_auth_holds(&T.ctx, &why), "no tenants left at all");
}
