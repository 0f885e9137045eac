/*
 * test_rpc: the method handlers of src/rpc/rpc.c as a client sees them:
 * ping, hello and stats; get and the other reads, remove, pin; request-level
 * errors that change nothing (put and batch_put ones included); messages that
 * are not requests, and client notifications; reply marks, and logins across
 * a reload. The put path (src/rpc/rpc_put.c) is tested in test_rpc_put.c.
 * Both drive rpc_dispatch against a real in-process store and decode the
 * replies from the outq with the helpers of rpc_testlib.h. No network; every
 * test is a few milliseconds.
 */
#include <criterion/criterion.h>
#include <msgpack.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <openssl/sha.h>

#include "config.h"
#include "kverr.h"
#include "outq.h"
#include "rpc.h"
#include "rpc_testlib.h"
#include "store.h"

/* ---- helpers only these tests use (the shared ones: rpc_testlib.h) ---- */

static int
t_dispatch(void)
{
    return t_dispatch_holes(NULL, 0);
}

static void
t_is_bool(const msgpack_object *o, bool v)
{
    cr_assert_eq(o->type, MSGPACK_OBJECT_BOOLEAN, "type %d, want bool", o->type);
    cr_assert_eq(o->via.boolean, v);
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

/* t_stored: does the store itself hold key in the default tenant? (bypasses rpc) */
static bool
t_stored(const char *key)
{
    struct kv_key k = {.tenant = 0, .len = (uint32_t)strlen(key), .ptr = (const uint8_t *)key};
    return store_exists(T.s, &k) == 1;
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

/* ---- get and the other reads, remove, pin ---- */

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
    cr_assert_eq(atomic_load(&T.ctr.hits_dram), 0);
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
    cr_assert_eq(atomic_load(&T.ctr.hits_dram), 3);
    cr_assert_eq(atomic_load(&T.ctr.hits_ssd), 0);     /* no SSD tier */
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
