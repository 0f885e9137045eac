/*
 * test_rpc_put: the put path (src/rpc/rpc_put.c) as a client sees it: put
 * and batch_put with their per-key codes; spilled put values (holes) that are
 * committed or aborted on every path; the spill decisions of rpc_spill_take;
 * and a key repeated within one batch_put, whose first copy is the one stored
 * and which leaves no reservation behind. Same environment and helpers as
 * test_rpc.c (rpc_testlib.h): requests through rpc_dispatch against a real
 * in-process store, replies decoded from the outq. No network.
 */
#include <criterion/criterion.h>
#include <msgpack.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kverr.h"
#include "mp.h"
#include "outq.h"
#include "rpc.h"
#include "rpc_testlib.h"
#include "store.h"

/* ---- put / batch_put ---- */

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
    cr_assert_eq(atomic_load(&T.ctr.hits_dram), 7);

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
