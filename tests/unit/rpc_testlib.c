/*
 * rpc_testlib: the environment and the client-side helpers test_rpc.c and
 * test_rpc_put.c share (contracts in rpc_testlib.h). The suite `rpc` is
 * declared here, once: its init and fini set T up and tear it down around
 * every test of both files.
 */
#include "rpc_testlib.h"

#include <criterion/criterion.h>
#include <msgpack.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/uio.h>

#include "outq.h"
#include "rpc.h"
#include "store.h"

/* ---- the environment of one test (each Criterion test runs in its own process) ---- */

static const char *const t_transports[] = {"tcp", "unix"};

struct t_env T;

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
msgpack_packer *
t_raw(void)
{
    msgpack_sbuffer_clear(&T.sb);
    return &T.pk;
}

/* t_req: start [0, msgid, method, [<nparams params follow>]]; msgid is fresh. */
msgpack_packer *
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

void
t_bin(msgpack_packer *pk, const void *p, size_t n)
{
    msgpack_pack_bin_with_body(pk, p, n);
}

/* t_k: a C string packed as a bin key. */
void
t_k(msgpack_packer *pk, const char *s)
{
    msgpack_pack_bin_with_body(pk, s, strlen(s));
}

void
t_s(msgpack_packer *pk, const char *s)
{
    msgpack_pack_str_with_body(pk, s, strlen(s));
}

/* t_keys: an array of C-string bin keys. */
void
t_keys(msgpack_packer *pk, const char *const *ks, uint32_t n)
{
    msgpack_pack_array(pk, n);
    for (uint32_t i = 0; i < n; i++) {
        t_k(pk, ks[i]);
    }
}

uint8_t *
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
uint8_t *
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
int
t_dispatch_holes(const struct mp_hole *holes, size_t nholes)
{
    uint8_t *msg = t_dup(T.sb.data, T.sb.size);
    int rc = rpc_dispatch(&T.ctx, msg, T.sb.size, holes, nholes, &T.out);

    free(msg);
    return rc;
}

/* t_drain: every queued reply byte, in order; the outq is empty afterwards. */
uint8_t *
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
int
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
msgpack_object
t_call_holes(const struct mp_hole *holes, size_t nholes)
{
    msgpack_object o;

    cr_assert_eq(t_dispatch_holes(holes, nholes), 0);
    cr_assert_eq(t_replies(&o, 1), 1, "no reply");
    return o;
}

msgpack_object
t_call(void)
{
    return t_call_holes(NULL, 0);
}

bool
t_str_is(const msgpack_object *o, const char *s)
{
    return o->type == MSGPACK_OBJECT_STR && o->via.str.size == strlen(s) &&
           memcmp(o->via.str.ptr, s, o->via.str.size) == 0;
}

void
t_is_uint(const msgpack_object *o, uint64_t v)
{
    cr_assert_eq(o->type, MSGPACK_OBJECT_POSITIVE_INTEGER, "type %d, want uint %llu", o->type,
                 (unsigned long long)v);
    cr_assert_eq(o->via.u64, v, "got %llu, want %llu", (unsigned long long)o->via.u64,
                 (unsigned long long)v);
}

void
t_is_nil(const msgpack_object *o)
{
    cr_assert_eq(o->type, MSGPACK_OBJECT_NIL, "type %d, want nil", o->type);
}

void
t_is_bin(const msgpack_object *o, const void *p, size_t n)
{
    cr_assert_eq(o->type, MSGPACK_OBJECT_BIN, "type %d, want bin", o->type);
    cr_assert_eq(o->via.bin.size, n, "bin of %u bytes, want %zu", o->via.bin.size, n);
    cr_assert(n == 0 || memcmp(o->via.bin.ptr, p, n) == 0, "bin bytes differ");
}

/* t_response: check [1, msgid, error, result] and return the 4 elements. */
const msgpack_object *
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
const msgpack_object *
t_ok_id(msgpack_object o, uint64_t msgid)
{
    const msgpack_object *e = t_response(&o, msgid);

    cr_assert_eq(e[2].type, MSGPACK_OBJECT_NIL, "error is set: code %lld",
                 e[2].type == MSGPACK_OBJECT_ARRAY && e[2].via.array.size > 0
                     ? (long long)e[2].via.array.ptr[0].via.i64
                     : -1LL);
    return &e[3];
}

const msgpack_object *
t_ok(msgpack_object o)
{
    return t_ok_id(o, T.msgid);
}

/* t_err: a request-level error [code, name, message] for msgid; result nil. */
void
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

void
t_err(msgpack_object o, int code, const char *name)
{
    t_err_id(o, T.msgid, code, name);
}

/* t_codes: result is an array of exactly these per-key codes. */
void
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

/* ---- client-style shortcuts ---- */

/* t_put: put key -> value (inline); returns the per-key code. */
uint64_t
t_put(const char *key, const void *v, size_t n)
{
    msgpack_packer *pk = t_req("put", 2);

    t_k(pk, key);
    t_bin(pk, v, n);
    const msgpack_object *r = t_ok(t_call());
    cr_assert_eq(r->type, MSGPACK_OBJECT_POSITIVE_INTEGER, "put result is not a code");
    return r->via.u64;
}

void
t_put_str(const char *key, const char *v)
{
    cr_assert_eq(t_put(key, v, strlen(v)), 0, "put %s", key);
}

/* t_get: the decoded result of get key (bin or nil). */
const msgpack_object *
t_get(const char *key)
{
    t_k(t_req("get", 1), key);
    return t_ok(t_call());
}

struct store_stats
t_stats(void)
{
    struct store_stats st;

    store_stats(T.s, &st);
    return st;
}
