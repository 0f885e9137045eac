/*
 * test_frame: the incremental frame scanner (protocol/frame.c) on packed
 * buffers: every msgpack type, piecewise delivery, the hostile headers the
 * scanner exists to refuse, the size and depth limits, and the spill
 * protocol as the connection code drives it. No network.
 */
#include <criterion/criterion.h>
#include <msgpack.h>
#include <stdlib.h>
#include <string.h>

#include "frame.h"
#include "mp.h"

#define GIB (UINT64_C(1) << 30)

static const struct frame_limits lim_std = {.max_message_size = GIB, .max_depth = 16};

struct pbuf {
    msgpack_sbuffer sb;
    msgpack_packer pk;
};

static void
pb_init(struct pbuf *b)
{
    msgpack_sbuffer_init(&b->sb);
    msgpack_packer_init(&b->pk, &b->sb, msgpack_sbuffer_write);
}

static void
pb_destroy(struct pbuf *b)
{
    msgpack_sbuffer_destroy(&b->sb);
}

static void
pack_bin_fill(msgpack_packer *pk, size_t n, uint8_t seed)
{
    uint8_t *tmp = malloc(n > 0 ? n : 1);

    cr_assert_not_null(tmp);
    for (size_t i = 0; i < n; i++) {
        tmp[i] = (uint8_t)(seed + i * 7);
    }
    msgpack_pack_bin(pk, n);
    msgpack_pack_bin_body(pk, tmp, n);
    free(tmp);
}

static void
pack_str_fill(msgpack_packer *pk, size_t n)
{
    char *tmp = malloc(n > 0 ? n : 1);

    cr_assert_not_null(tmp);
    memset(tmp, 'x', n);
    msgpack_pack_str(pk, n);
    msgpack_pack_str_body(pk, tmp, n);
    free(tmp);
}

static void
pack_ext_fill(msgpack_packer *pk, size_t n)
{
    char *tmp = calloc(1, n > 0 ? n : 1);

    cr_assert_not_null(tmp);
    msgpack_pack_ext(pk, n, 42);
    msgpack_pack_ext_body(pk, tmp, n);
    free(tmp);
}

/* One sample per msgpack encoding; returns the header byte it must start with. */
#define NSAMPLES 43

static uint8_t
pack_sample(msgpack_packer *pk, int k)
{
    switch (k) {
    case 0: msgpack_pack_nil(pk); return 0xc0;
    case 1: msgpack_pack_true(pk); return 0xc3;
    case 2: msgpack_pack_false(pk); return 0xc2;
    case 3: msgpack_pack_int(pk, 0); return 0x00;
    case 4: msgpack_pack_int(pk, 127); return 0x7f;
    case 5: msgpack_pack_int(pk, -32); return 0xe0;
    case 6: msgpack_pack_uint8(pk, 200); return 0xcc;
    case 7: msgpack_pack_uint16(pk, 60000); return 0xcd;
    case 8: msgpack_pack_uint32(pk, 4000000000u); return 0xce;
    case 9: msgpack_pack_uint64(pk, UINT64_MAX); return 0xcf;
    case 10: msgpack_pack_int8(pk, -100); return 0xd0;
    case 11: msgpack_pack_int16(pk, -30000); return 0xd1;
    case 12: msgpack_pack_int32(pk, -2000000000); return 0xd2;
    case 13: msgpack_pack_int64(pk, INT64_MIN); return 0xd3;
    case 14: msgpack_pack_float(pk, 1.5f); return 0xca;
    case 15: msgpack_pack_double(pk, 2.5); return 0xcb;
    case 16: msgpack_pack_str(pk, 3); msgpack_pack_str_body(pk, "abc", 3); return 0xa3;
    case 17: msgpack_pack_str(pk, 0); return 0xa0;
    case 18: pack_str_fill(pk, 40); return 0xd9;
    case 19: pack_str_fill(pk, 300); return 0xda;
    case 20: pack_str_fill(pk, 70000); return 0xdb;
    case 21: msgpack_pack_bin(pk, 0); return 0xc4;
    case 22: pack_bin_fill(pk, 10, 1); return 0xc4;
    case 23: pack_bin_fill(pk, 300, 2); return 0xc5;
    case 24: pack_bin_fill(pk, 70000, 3); return 0xc6;
    case 25: pack_ext_fill(pk, 1); return 0xd4;
    case 26: pack_ext_fill(pk, 2); return 0xd5;
    case 27: pack_ext_fill(pk, 4); return 0xd6;
    case 28: pack_ext_fill(pk, 8); return 0xd7;
    case 29: pack_ext_fill(pk, 16); return 0xd8;
    case 30: pack_ext_fill(pk, 3); return 0xc7;
    case 31: pack_ext_fill(pk, 300); return 0xc8;
    case 32: pack_ext_fill(pk, 70000); return 0xc9;
    case 33: msgpack_pack_array(pk, 0); return 0x90;
    case 34:
        msgpack_pack_array(pk, 3);
        msgpack_pack_int(pk, 1);
        msgpack_pack_int(pk, 2);
        msgpack_pack_int(pk, 3);
        return 0x93;
    case 35:
        msgpack_pack_array(pk, 20);
        for (int i = 0; i < 20; i++) {
            msgpack_pack_nil(pk);
        }
        return 0xdc;
    case 36:
        msgpack_pack_array(pk, 70000);
        for (int i = 0; i < 70000; i++) {
            msgpack_pack_int(pk, i & 0x7f);
        }
        return 0xdd;
    case 37: msgpack_pack_map(pk, 0); return 0x80;
    case 38:
        msgpack_pack_map(pk, 1);
        msgpack_pack_int(pk, 1);
        msgpack_pack_int(pk, 2);
        return 0x81;
    case 39:
        msgpack_pack_map(pk, 20);
        for (int i = 0; i < 20; i++) {
            msgpack_pack_int(pk, i);
            msgpack_pack_uint16(pk, 1000);
        }
        return 0xde;
    case 40:
        msgpack_pack_map(pk, 70000);
        for (int i = 0; i < 70000; i++) {
            msgpack_pack_uint32(pk, (uint32_t)i);
            msgpack_pack_nil(pk);
        }
        return 0xdf;
    case 41:
        /* [[], {"a": [nil, {}]}, [[[1]]]] */
        msgpack_pack_array(pk, 3);
        msgpack_pack_array(pk, 0);
        msgpack_pack_map(pk, 1);
        msgpack_pack_str(pk, 1);
        msgpack_pack_str_body(pk, "a", 1);
        msgpack_pack_array(pk, 2);
        msgpack_pack_nil(pk);
        msgpack_pack_map(pk, 0);
        msgpack_pack_array(pk, 1);
        msgpack_pack_array(pk, 1);
        msgpack_pack_array(pk, 1);
        msgpack_pack_int(pk, 1);
        return 0x93;
    default:
        msgpack_pack_int(pk, -1);
        return 0xff;
    }
}

/* scan_whole: one call over all of buf. */
static int
scan_whole(const void *buf, size_t len, const struct frame_limits *lim, struct frame_scan *st)
{
    frame_scan_init(st);
    return frame_scan(st, buf, len, lim);
}

/*
 * scan_bytewise: deliver one more byte per call until the scan stops asking.
 * Each call sees an exact-size heap copy when exact is set, so reading past
 * len is caught by the sanitizer build. Returns the final status.
 */
static int
scan_bytewise(const uint8_t *buf, size_t len, const struct frame_limits *lim,
              struct frame_scan *st, bool exact)
{
    int rc = FRAME_NEED_MORE;

    frame_scan_init(st);
    for (size_t i = 0; i <= len && rc == FRAME_NEED_MORE; i++) {
        if (exact) {
            uint8_t *copy = malloc(i > 0 ? i : 1);
            cr_assert_not_null(copy);
            memcpy(copy, buf, i);
            rc = frame_scan(st, copy, i, lim);
            free(copy);
        } else {
            rc = frame_scan(st, buf, i, lim);
        }
    }
    return rc;
}

Test(frame, every_type_completes_at_root)
{
    for (int k = 0; k < NSAMPLES - 1; k++) {
        struct pbuf b;
        struct frame_scan st;
        uint8_t first;

        pb_init(&b);
        first = pack_sample(&b.pk, k);
        cr_assert_eq((uint8_t)b.sb.data[0], first, "sample %d packed as %02x", k,
                     (uint8_t)b.sb.data[0]);
        cr_assert_eq(scan_whole(b.sb.data, b.sb.size, &lim_std, &st), FRAME_DONE, "sample %d", k);
        cr_assert_eq(st.pos, b.sb.size, "sample %d", k);
        cr_assert_eq(st.wire_bytes, b.sb.size, "sample %d", k);
        cr_assert_eq(st.depth, 0);
        /* one byte short is not a message yet */
        cr_assert_eq(scan_whole(b.sb.data, b.sb.size - 1, &lim_std, &st), FRAME_NEED_MORE,
                     "sample %d", k);
        pb_destroy(&b);
    }
}

Test(frame, every_type_completes_inside_containers)
{
    for (int k = 0; k < NSAMPLES - 1; k++) {
        struct pbuf b;
        struct frame_scan st;

        /* [x, {x: x}, x] */
        pb_init(&b);
        msgpack_pack_array(&b.pk, 3);
        pack_sample(&b.pk, k);
        msgpack_pack_map(&b.pk, 1);
        pack_sample(&b.pk, k);
        pack_sample(&b.pk, k);
        pack_sample(&b.pk, k);
        cr_assert_eq(scan_whole(b.sb.data, b.sb.size, &lim_std, &st), FRAME_DONE, "sample %d", k);
        cr_assert_eq(st.pos, b.sb.size, "sample %d", k);
        cr_assert_eq(scan_whole(b.sb.data, b.sb.size - 1, &lim_std, &st), FRAME_NEED_MORE);
        pb_destroy(&b);
    }
}

Test(frame, bytewise_matches_whole, .timeout = 60)
{
    for (int k = 0; k < NSAMPLES - 1; k++) {
        struct pbuf b;
        struct frame_scan whole, piece;

        pb_init(&b);
        msgpack_pack_array(&b.pk, 2);
        pack_sample(&b.pk, k);
        msgpack_pack_map(&b.pk, 1);
        msgpack_pack_int(&b.pk, 1);
        pack_sample(&b.pk, k);
        cr_assert_eq(scan_whole(b.sb.data, b.sb.size, &lim_std, &whole), FRAME_DONE);
        cr_assert_eq(scan_bytewise((const uint8_t *)b.sb.data, b.sb.size, &lim_std, &piece,
                                   b.sb.size <= 4096),
                     FRAME_DONE, "sample %d", k);
        cr_assert_eq(piece.pos, whole.pos, "sample %d", k);
        cr_assert_eq(piece.wire_bytes, whole.wire_bytes, "sample %d", k);
        pb_destroy(&b);
    }
}

Test(frame, scalar_root_is_a_message)
{
    const uint8_t buf[] = {0x2a, 0x01, 0x02};
    struct frame_scan st;

    cr_assert_eq(scan_whole(buf, sizeof(buf), &lim_std, &st), FRAME_DONE);
    cr_assert_eq(st.pos, 1);
}

Test(frame, stops_at_first_message_end)
{
    struct pbuf b;
    struct frame_scan st;
    size_t first, total;
    const uint8_t *data;

    pb_init(&b);
    msgpack_pack_array(&b.pk, 4);
    msgpack_pack_int(&b.pk, 0);
    msgpack_pack_int(&b.pk, 1);
    mp_pack_cstr(&b.pk, "ping");
    msgpack_pack_array(&b.pk, 0);
    first = b.sb.size;
    msgpack_pack_array(&b.pk, 4);
    msgpack_pack_int(&b.pk, 0);
    msgpack_pack_int(&b.pk, 2);
    mp_pack_cstr(&b.pk, "get");
    msgpack_pack_array(&b.pk, 1);
    pack_bin_fill(&b.pk, 100, 9);
    total = b.sb.size;
    data = (const uint8_t *)b.sb.data;

    cr_assert_eq(scan_whole(data, total, &lim_std, &st), FRAME_DONE);
    cr_assert_eq(st.pos, first);
    cr_assert_eq(st.wire_bytes, first);
    /* done is sticky: more bytes do not move it */
    cr_assert_eq(frame_scan(&st, data, total, &lim_std), FRAME_DONE);
    cr_assert_eq(st.pos, first);

    cr_assert_eq(scan_whole(data + first, total - first, &lim_std, &st), FRAME_DONE);
    cr_assert_eq(st.pos, total - first);

    /* delivered one byte at a time, the first message ends exactly at its last byte */
    cr_assert_eq(scan_bytewise(data, total, &lim_std, &st, true), FRAME_DONE);
    cr_assert_eq(st.pos, first);
    pb_destroy(&b);
}

/* ---- hostile input ---- */

static void
expect_error(const uint8_t *buf, size_t len, const struct frame_limits *lim, size_t at,
             const char *words)
{
    struct frame_scan st;

    cr_assert_eq(scan_whole(buf, len, lim, &st), FRAME_ERROR);
    cr_assert_not_null(st.error);
    cr_assert(strstr(st.error, words) != NULL, "error \"%s\" lacks \"%s\"", st.error, words);
    cr_assert_eq(st.pos, at, "error reported at %zu, expected %zu", st.pos, at);
    /* the error is sticky */
    cr_assert_eq(frame_scan(&st, buf, len, lim), FRAME_ERROR);
    /* and it is found as early by a piecewise scan */
    cr_assert_eq(scan_bytewise(buf, len, lim, &st, true), FRAME_ERROR);
    cr_assert(strstr(st.error, words) != NULL);
}

Test(frame, rejects_huge_array32_header)
{
    const uint8_t buf[] = {0xdd, 0xff, 0xff, 0xff, 0xff};
    expect_error(buf, sizeof(buf), &lim_std, 0, "array count");
}

Test(frame, rejects_huge_map32_header)
{
    const uint8_t buf[] = {0xdf, 0xff, 0xff, 0xff, 0xff};
    expect_error(buf, sizeof(buf), &lim_std, 0, "map count");
}

Test(frame, rejects_huge_bin32_header)
{
    const uint8_t buf[] = {0xc6, 0xff, 0xff, 0xff, 0xff};
    expect_error(buf, sizeof(buf), &lim_std, 0, "bin length");
}

Test(frame, rejects_huge_str32_and_ext32_headers)
{
    const uint8_t str[] = {0xdb, 0xff, 0xff, 0xff, 0xff};
    const uint8_t ext[] = {0xc9, 0xff, 0xff, 0xff, 0xff, 0x01};

    expect_error(str, sizeof(str), &lim_std, 0, "str length");
    expect_error(ext, sizeof(ext), &lim_std, 0, "ext length");
}

Test(frame, rejects_huge_header_inside_request)
{
    /* [0, 7, "batch_put", <array32 of 2^32-1>] */
    const uint8_t buf[] = {0x94, 0x00, 0x07, 0xa9, 'b', 'a', 't', 'c', 'h', '_', 'p', 'u', 't',
                           0xdd, 0xff, 0xff, 0xff, 0xff};
    expect_error(buf, sizeof(buf), &lim_std, 13, "array count");
}

Test(frame, map_counts_keys_and_values)
{
    /* 2^29 pairs are 2^30 elements: more than 1 GiB can hold; 2^29 array elements fit */
    const uint8_t map[] = {0xdf, 0x20, 0x00, 0x00, 0x00};
    const uint8_t arr[] = {0xdd, 0x20, 0x00, 0x00, 0x00};
    struct frame_scan st;

    expect_error(map, sizeof(map), &lim_std, 0, "map count");
    cr_assert_eq(scan_whole(arr, sizeof(arr), &lim_std, &st), FRAME_NEED_MORE);
}

Test(frame, rejects_hostile_chain_at_first_header)
{
    enum { LINKS = 1000 };
    uint8_t *buf = malloc(LINKS * 5);

    for (int i = 0; i < LINKS; i++) {
        memcpy(buf + i * 5, "\xdd\x7f\xff\xff\xff", 5);
    }
    expect_error(buf, LINKS * 5, &lim_std, 0, "array count");
    free(buf);
}

Test(frame, nested_counts_share_one_budget)
{
    /* each array32 of 2^29 fits 1 GiB alone; the second one nested in the first cannot */
    enum { LINKS = 8 };
    uint8_t buf[LINKS * 5];

    for (int i = 0; i < LINKS; i++) {
        memcpy(buf + i * 5, "\xdd\x20\x00\x00\x00", 5);
    }
    expect_error(buf, sizeof(buf), &lim_std, 5, "array count");
}

Test(frame, rejects_deep_nesting)
{
    enum { DEEP = 10000 };
    uint8_t *buf = malloc(DEEP);
    struct frame_limits lim = lim_std;

    memset(buf, 0x91, DEEP);
    expect_error(buf, DEEP, &lim_std, FRAME_MAX_DEPTH, "nesting");
    lim.max_depth = 4;
    expect_error(buf, DEEP, &lim, 4, "nesting");
    memset(buf, 0x81, DEEP); /* {x: {x: ...}} with fixmap headers as keys */
    expect_error(buf, DEEP, &lim, 4, "nesting");
    free(buf);
}

Test(frame, rejects_reserved_byte)
{
    const uint8_t root[] = {0xc1};
    const uint8_t inner[] = {0x93, 0x01, 0xc1, 0x02};

    expect_error(root, sizeof(root), &lim_std, 0, "reserved");
    expect_error(inner, sizeof(inner), &lim_std, 2, "reserved");
}

/* ---- limits ---- */

static void
expect_limit_exact(const uint8_t *buf, size_t size)
{
    struct frame_limits lim = lim_std;
    struct frame_scan st;

    lim.max_message_size = size;
    cr_assert_eq(scan_whole(buf, size, &lim, &st), FRAME_DONE);
    cr_assert_eq(st.wire_bytes, size);
    cr_assert_eq(scan_bytewise(buf, size, &lim, &st, size <= 4096), FRAME_DONE);
    lim.max_message_size = size - 1;
    cr_assert_eq(scan_whole(buf, size, &lim, &st), FRAME_ERROR);
    cr_assert(strstr(st.error, "max_message_size") != NULL, "%s", st.error);
    cr_assert_eq(scan_bytewise(buf, size, &lim, &st, size <= 4096), FRAME_ERROR);
}

Test(frame, message_at_max_size_passes_one_over_fails)
{
    struct pbuf b;

    /* ends in a bin body */
    pb_init(&b);
    msgpack_pack_array(&b.pk, 4);
    msgpack_pack_int(&b.pk, 0);
    msgpack_pack_int(&b.pk, 7);
    mp_pack_cstr(&b.pk, "put");
    msgpack_pack_array(&b.pk, 2);
    pack_bin_fill(&b.pk, 16, 0);
    pack_bin_fill(&b.pk, 1000, 1);
    expect_limit_exact((const uint8_t *)b.sb.data, b.sb.size);
    pb_destroy(&b);

    /* ends in a one-byte scalar */
    pb_init(&b);
    msgpack_pack_array(&b.pk, 100);
    for (int i = 0; i < 100; i++) {
        msgpack_pack_int(&b.pk, i);
    }
    expect_limit_exact((const uint8_t *)b.sb.data, b.sb.size);
    pb_destroy(&b);

    /* a lone multi-byte scalar */
    pb_init(&b);
    msgpack_pack_uint64(&b.pk, UINT64_MAX);
    expect_limit_exact((const uint8_t *)b.sb.data, b.sb.size);
    pb_destroy(&b);
}

Test(frame, over_size_fails_at_the_announcing_header)
{
    /* array16 of 100 fixints is 103 bytes; with 102 allowed the header already cannot fit */
    uint8_t buf[103] = {0xdc, 0x00, 100};
    struct frame_limits lim = lim_std;

    lim.max_message_size = 102;
    expect_error(buf, 3, &lim, 0, "array count");
}

Test(frame, depth_limit_is_inclusive)
{
    for (uint32_t max = 1; max <= FRAME_MAX_DEPTH; max++) {
        struct frame_limits lim = lim_std;
        struct frame_scan st;
        uint8_t buf[FRAME_MAX_DEPTH + 1];

        lim.max_depth = max;
        /* max levels: max - 1 one-element arrays around an empty one */
        memset(buf, 0x91, sizeof(buf));
        buf[max - 1] = 0x90;
        cr_assert_eq(scan_whole(buf, max, &lim, &st), FRAME_DONE, "depth %u", max);
        cr_assert_eq(st.pos, max);
        buf[max - 1] = 0x91;
        buf[max] = 0x90;
        cr_assert_eq(scan_whole(buf, max + 1, &lim, &st), FRAME_ERROR, "depth %u", max + 1);
        cr_assert(strstr(st.error, "nesting") != NULL);
    }
}

/* ---- spilling ---- */

#define BIG 100000

struct feed {
    const uint8_t *wire;
    size_t wire_len;
    size_t wire_off;  /* bytes delivered so far */
    uint8_t *buf;     /* the connection buffer */
    size_t len;
    size_t chunk;
    int offers;
    struct {
        int depth;
        uint32_t path[FRAME_MAX_DEPTH];
        uint64_t len;
        size_t have;
        size_t pos;
        uint8_t *body;
    } spill[4];
};

static void
feed_init(struct feed *f, const void *wire, size_t wire_len, size_t chunk)
{
    memset(f, 0, sizeof(*f));
    f->wire = wire;
    f->wire_len = wire_len;
    f->chunk = chunk;
    f->buf = malloc(wire_len);
    cr_assert_not_null(f->buf);
}

static void
feed_destroy(struct feed *f)
{
    for (int i = 0; i < f->offers && i < 4; i++) {
        free(f->spill[i].body);
    }
    free(f->buf);
}

/*
 * feed_run: drive frame_scan as a connection would: deliver chunk bytes
 * whenever it needs more; on FRAME_SPILL take the body (copy what is
 * buffered, truncate the buffer at pos, read the rest straight from the
 * wire) or decline it. Returns the final status.
 */
static int
feed_run(struct feed *f, struct frame_scan *st, const struct frame_limits *lim, bool take)
{
    frame_scan_init(st);
    for (;;) {
        int rc = frame_scan(st, f->buf, f->len, lim);

        if (rc == FRAME_DONE || rc == FRAME_ERROR) {
            return rc;
        }
        if (rc == FRAME_SPILL) {
            int i = f->offers++;

            cr_assert_lt(i, 4);
            cr_assert_eq(st->spill_have, f->len - st->pos);
            cr_assert_lt(st->spill_have, st->spill_len);
            f->spill[i].depth = st->depth;
            memcpy(f->spill[i].path, st->path, sizeof(st->path));
            f->spill[i].len = st->spill_len;
            f->spill[i].have = st->spill_have;
            f->spill[i].pos = st->pos;
            if (take) {
                size_t rest = (size_t)st->spill_len - st->spill_have;

                f->spill[i].body = malloc((size_t)st->spill_len);
                memcpy(f->spill[i].body, f->buf + st->pos, st->spill_have);
                f->len = st->pos;
                cr_assert_leq(f->wire_off + rest, f->wire_len);
                memcpy(f->spill[i].body + st->spill_have, f->wire + f->wire_off, rest);
                f->wire_off += rest;
                frame_scan_spilled(st);
            } else {
                frame_scan_decline(st);
            }
            continue;
        }
        cr_assert_eq(rc, FRAME_NEED_MORE);
        cr_assert_lt(f->wire_off, f->wire_len, "scanner wants bytes past the message");
        {
            size_t n = f->wire_len - f->wire_off;
            if (n > f->chunk) {
                n = f->chunk;
            }
            memcpy(f->buf + f->len, f->wire + f->wire_off, n);
            f->len += n;
            f->wire_off += n;
        }
    }
}

/* [0, 7, "batch_put", [[k1, k2], [big1, big2]]]; off1, off2: wire offsets of the bodies */
static void
pack_batch_put(struct pbuf *b, size_t *off1, size_t *off2)
{
    pb_init(b);
    msgpack_pack_array(&b->pk, 4);
    msgpack_pack_int(&b->pk, 0);
    msgpack_pack_int(&b->pk, 7);
    mp_pack_cstr(&b->pk, "batch_put");
    msgpack_pack_array(&b->pk, 2);
    msgpack_pack_array(&b->pk, 2);
    msgpack_pack_bin_with_body(&b->pk, "key-1", 5);
    msgpack_pack_bin_with_body(&b->pk, "key-2", 5);
    msgpack_pack_array(&b->pk, 2);
    pack_bin_fill(&b->pk, BIG, 11);
    *off1 = b->sb.size - BIG;
    pack_bin_fill(&b->pk, BIG, 22);
    *off2 = b->sb.size - BIG;
}

Test(frame, spill_reports_path_and_continues, .timeout = 60)
{
    static const size_t chunks[] = {1, 7, 4096, 65536};
    struct frame_limits lim = lim_std;
    struct pbuf b;
    size_t off1, off2;

    lim.spill_min = 65536;
    pack_batch_put(&b, &off1, &off2);
    for (size_t c = 0; c < sizeof(chunks) / sizeof(chunks[0]); c++) {
        struct frame_scan st;
        struct feed f;
        struct mp_reader r;
        struct mp_hole holes[2];
        const uint8_t *p;
        const struct mp_hole *hole;
        uint64_t vlen;
        uint32_t n;

        feed_init(&f, b.sb.data, b.sb.size, chunks[c]);
        cr_assert_eq(feed_run(&f, &st, &lim, true), FRAME_DONE, "chunk %zu", chunks[c]);
        cr_assert_eq(f.offers, 2, "chunk %zu", chunks[c]);
        cr_assert_eq(st.wire_bytes, b.sb.size);
        cr_assert_eq(st.pos, b.sb.size - 2 * BIG);
        cr_assert_eq(f.len, st.pos, "bytes past the message were consumed");
        for (int i = 0; i < 2; i++) {
            cr_assert_eq(f.spill[i].depth, 3);
            cr_assert_eq(f.spill[i].path[0], 3);  /* params */
            cr_assert_eq(f.spill[i].path[1], 1);  /* values */
            cr_assert_eq(f.spill[i].path[2], (uint32_t)i);
            cr_assert_eq(f.spill[i].len, BIG);
            cr_assert_eq(memcmp(f.spill[i].body, b.sb.data + (i == 0 ? off1 : off2), BIG), 0);
        }
        cr_assert_eq(f.spill[0].pos, off1);
        cr_assert_eq(f.spill[1].pos, off2 - BIG);

        /* the buffer left behind decodes with the two bodies as holes */
        holes[0] = (struct mp_hole){.off = f.spill[0].pos, .len = BIG};
        holes[1] = (struct mp_hole){.off = f.spill[1].pos, .len = BIG};
        mp_reader_init(&r, f.buf, f.len);
        mp_reader_holes(&r, holes, 2);
        cr_assert_eq(mp_read_array(&r, &n), 0);
        for (int i = 0; i < 3; i++) {
            cr_assert_eq(mp_skip(&r), 0);
        }
        cr_assert_eq(mp_read_array(&r, &n), 0);
        cr_assert_eq(mp_skip(&r), 0);
        cr_assert_eq(mp_read_array(&r, &n), 0);
        cr_assert_eq(n, 2);
        for (int i = 0; i < 2; i++) {
            cr_assert_eq(mp_read_bin_ref(&r, &p, &vlen, &hole), 0);
            cr_assert_null(p);
            cr_assert_eq(hole, &holes[i]);
            cr_assert_eq(vlen, BIG);
        }
        cr_assert_eq(mp_peek(&r), MP_END);
        feed_destroy(&f);
    }
    pb_destroy(&b);
}

Test(frame, spill_declined_is_buffered_and_not_offered_again, .timeout = 60)
{
    static const size_t chunks[] = {1, 4096};
    struct frame_limits lim = lim_std;
    struct pbuf b;
    size_t off1, off2;

    lim.spill_min = 65536;
    pack_batch_put(&b, &off1, &off2);
    for (size_t c = 0; c < sizeof(chunks) / sizeof(chunks[0]); c++) {
        struct frame_scan st;
        struct feed f;

        feed_init(&f, b.sb.data, b.sb.size, chunks[c]);
        cr_assert_eq(feed_run(&f, &st, &lim, false), FRAME_DONE);
        cr_assert_eq(f.offers, 2, "each bin is offered once, got %d offers", f.offers);
        cr_assert_eq(st.pos, b.sb.size);
        cr_assert_eq(st.wire_bytes, b.sb.size);
        cr_assert_eq(memcmp(f.buf, b.sb.data, b.sb.size), 0);
        feed_destroy(&f);
    }
    pb_destroy(&b);
}

Test(frame, spill_offer_stands_until_answered)
{
    struct frame_limits lim = lim_std;
    struct frame_scan st;
    struct pbuf b;
    size_t off1, off2;
    const uint8_t *data;

    lim.spill_min = 65536;
    pack_batch_put(&b, &off1, &off2);
    data = (const uint8_t *)b.sb.data;
    frame_scan_init(&st);
    cr_assert_eq(frame_scan(&st, data, off1 + 10, &lim), FRAME_SPILL);
    cr_assert_eq(st.pos, off1);
    cr_assert_eq(st.spill_have, 10);
    /* asked again with more bytes: the same offer, more of it buffered */
    cr_assert_eq(frame_scan(&st, data, off1 + 500, &lim), FRAME_SPILL);
    cr_assert_eq(st.pos, off1);
    cr_assert_eq(st.spill_have, 500);
    cr_assert_eq(st.path[2], 0);
    frame_scan_decline(&st);
    cr_assert_eq(frame_scan(&st, data, off1 + 500, &lim), FRAME_NEED_MORE);
    /* the second bin's header arrives with part of its body */
    cr_assert_eq(frame_scan(&st, data, off2 + 1, &lim), FRAME_SPILL);
    cr_assert_eq(st.path[2], 1);
    cr_assert_eq(st.spill_have, 1);
    frame_scan_decline(&st);
    cr_assert_eq(frame_scan(&st, data, b.sb.size, &lim), FRAME_DONE);
    cr_assert_eq(st.pos, b.sb.size);
    pb_destroy(&b);
}

Test(frame, spill_only_for_partial_big_bodies)
{
    struct frame_limits lim = lim_std;
    struct frame_scan st;
    struct pbuf b;
    size_t off1, off2;

    pack_batch_put(&b, &off1, &off2);
    /* everything buffered: nothing to offer */
    lim.spill_min = 65536;
    cr_assert_eq(scan_whole(b.sb.data, b.sb.size, &lim, &st), FRAME_DONE);
    /* spill_min 0: never */
    lim.spill_min = 0;
    cr_assert_eq(scan_whole(b.sb.data, off1 + 10, &lim, &st), FRAME_NEED_MORE);
    /* below spill_min: never */
    lim.spill_min = BIG + 1;
    cr_assert_eq(scan_whole(b.sb.data, off1 + 10, &lim, &st), FRAME_NEED_MORE);
    /* exactly spill_min: offered */
    lim.spill_min = BIG;
    cr_assert_eq(scan_whole(b.sb.data, off1 + 10, &lim, &st), FRAME_SPILL);
    cr_assert_eq(st.spill_bin, 1);
    pb_destroy(&b);

    /* a big str is offered too (a huge key must not be buffered), marked as not a bin */
    pb_init(&b);
    msgpack_pack_array(&b.pk, 1);
    pack_str_fill(&b.pk, BIG);
    lim.spill_min = 1;
    cr_assert_eq(scan_whole(b.sb.data, 100, &lim, &st), FRAME_SPILL);
    cr_assert_eq(st.spill_bin, 0);
    cr_assert_eq(st.spill_len, BIG);
    pb_destroy(&b);
}

Test(frame, spill_path_counts_map_keys_and_values)
{
    struct frame_limits lim = lim_std;
    struct frame_scan st;
    struct pbuf b;

    lim.spill_min = 1000;
    pb_init(&b);
    msgpack_pack_map(&b.pk, 2);
    mp_pack_cstr(&b.pk, "a");
    msgpack_pack_int(&b.pk, 1);
    mp_pack_cstr(&b.pk, "b");
    pack_bin_fill(&b.pk, 5000, 0);
    cr_assert_eq(scan_whole(b.sb.data, b.sb.size - 1, &lim, &st), FRAME_SPILL);
    cr_assert_eq(st.depth, 1);
    cr_assert_eq(st.path[0], 3);
    cr_assert_eq(st.spill_len, 5000);
    cr_assert_eq(st.spill_have, 4999);
    frame_scan_spilled(&st);
    cr_assert_eq(frame_scan(&st, (const uint8_t *)b.sb.data, st.pos, &lim), FRAME_DONE);
    cr_assert_eq(st.wire_bytes, b.sb.size);
    pb_destroy(&b);

    /* a bin at the root has an empty path, and taking it completes the message */
    pb_init(&b);
    pack_bin_fill(&b.pk, 5000, 0);
    cr_assert_eq(scan_whole(b.sb.data, 3, &lim, &st), FRAME_SPILL);
    cr_assert_eq(st.depth, 0);
    cr_assert_eq(st.pos, 3);
    cr_assert_eq(st.spill_have, 0);
    frame_scan_spilled(&st);
    cr_assert_eq(frame_scan(&st, (const uint8_t *)b.sb.data, 3, &lim), FRAME_DONE);
    cr_assert_eq(st.wire_bytes, 5003);
    pb_destroy(&b);
}

Test(frame, spilled_bodies_count_toward_max_size)
{
    struct frame_limits lim = lim_std;
    struct frame_scan st;
    struct pbuf b;
    size_t off1, off2;
    const uint8_t *data;

    pack_batch_put(&b, &off1, &off2);
    data = (const uint8_t *)b.sb.data;
    lim.spill_min = 65536;
    lim.max_message_size = b.sb.size - 1;
    /* the first bin fits, so it is offered and taken */
    frame_scan_init(&st);
    cr_assert_eq(frame_scan(&st, data, off1 + 10, &lim), FRAME_SPILL);
    frame_scan_spilled(&st);
    cr_assert_eq(st.wire_bytes, off1 + BIG);
    /* the rest, copied down behind the truncation point, no longer fits */
    {
        size_t tail = b.sb.size - (off1 + BIG);
        uint8_t *buf = malloc(off1 + tail);
        memcpy(buf, data, off1);
        memcpy(buf + off1, data + off1 + BIG, tail);
        cr_assert_eq(frame_scan(&st, buf, off1 + tail, &lim), FRAME_ERROR);
        cr_assert(strstr(st.error, "bin length") != NULL, "%s", st.error);
        free(buf);
    }
    pb_destroy(&b);
}

/* ---- cost ---- */

Test(frame, bytewise_scan_is_linear, .timeout = 30)
{
    enum { N = 1000000 };
    struct pbuf b;
    struct frame_scan st;

    /* [1M fixints, 8 MB bin]: a million headers and a long body, one byte per call */
    pb_init(&b);
    msgpack_pack_array(&b.pk, 2);
    msgpack_pack_array(&b.pk, N);
    for (int i = 0; i < N; i++) {
        msgpack_pack_int(&b.pk, i & 0x7f);
    }
    pack_bin_fill(&b.pk, 8u << 20, 0);
    cr_assert_eq(scan_bytewise((const uint8_t *)b.sb.data, b.sb.size, &lim_std, &st, false),
                 FRAME_DONE);
    cr_assert_eq(st.pos, b.sb.size);
    pb_destroy(&b);
}

Test(frame, unbounded_limit_does_not_wrap)
{
    struct frame_limits lim = lim_std;
    struct frame_scan st;
    const uint8_t arr[] = {0xdd, 0xff, 0xff, 0xff, 0xff, 0xdd, 0xff, 0xff, 0xff, 0xff};
    const uint8_t map[] = {0xdf, 0x80, 0x00, 0x00, 0x00};

    lim.max_message_size = UINT64_MAX;
    cr_assert_eq(scan_whole(arr, sizeof(arr), &lim, &st), FRAME_NEED_MORE);
    cr_assert_eq(st.pos, sizeof(arr));
    /* 2^31 pairs are 2^32 elements: more than one level can count */
    expect_error(map, sizeof(map), &lim, 0, "map count");
}
