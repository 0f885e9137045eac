/*
 * test_mp: the bounded msgpack cursor (protocol/mp.c): every reader on the
 * right type, the wrong types and cut-short input, ints of every width,
 * holes left by spilled bins, mp_skip, and the error triple packer. Buffers
 * are exact-size heap copies so the sanitizer build catches any read past
 * the end. No network.
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <msgpack.h>
#include <stdlib.h>
#include <string.h>

#include "kverr.h"
#include "mp.h"

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

static uint8_t *
dup_bytes(const void *p, size_t n)
{
    uint8_t *c = malloc(n > 0 ? n : 1);

    cr_assert_not_null(c);
    if (n > 0) {
        memcpy(c, p, n);
    }
    return c;
}

/* ---- every reader against every kind of object ---- */

enum {
    R_NIL, R_BOOL, R_UINT, R_INT, R_ARRAY, R_MAP, R_STR, R_BIN, R_KEY, R_BIN_REF, R_SKIP, R_COUNT
};

static const char *const reader_names[R_COUNT] = {
    "nil", "bool", "uint", "int", "array", "map", "str", "bin", "key", "bin_ref", "skip",
};

static int
run_reader(int which, struct mp_reader *r)
{
    bool b;
    uint64_t u, len64;
    int64_t s;
    uint32_t n, len;
    const char *str;
    const uint8_t *p;
    const struct mp_hole *hole;

    switch (which) {
    case R_NIL:
        return mp_read_nil(r);
    case R_BOOL:
        return mp_read_bool(r, &b);
    case R_UINT:
        return mp_read_uint(r, &u);
    case R_INT:
        return mp_read_int(r, &s);
    case R_ARRAY:
        return mp_read_array(r, &n);
    case R_MAP:
        return mp_read_map(r, &n);
    case R_STR:
        return mp_read_str(r, &str, &len);
    case R_BIN:
        return mp_read_bin(r, &p, &len);
    case R_KEY:
        return mp_read_key(r, &p, &len);
    case R_BIN_REF:
        return mp_read_bin_ref(r, &p, &len64, &hole);
    default:
        return mp_skip(r);
    }
}

#define ACC(...) ((1u << R_SKIP) | acc_mask((const int[]){__VA_ARGS__, -1}))

static unsigned
acc_mask(const int *which)
{
    unsigned m = 0;

    for (; *which >= 0; which++) {
        m |= 1u << *which;
    }
    return m;
}

struct sample {
    const char *name;
    enum mp_type type;
    unsigned accepts;   /* readers that succeed */
    bool whole;         /* a successful read consumes the whole sample */
};

#define NSAMPLES 16

static struct sample
pack_sample(msgpack_packer *pk, int k)
{
    static const uint8_t body[300];

    switch (k) {
    case 0:
        msgpack_pack_nil(pk);
        return (struct sample){"nil", MP_NIL, ACC(R_NIL), true};
    case 1:
        msgpack_pack_true(pk);
        return (struct sample){"true", MP_BOOL, ACC(R_BOOL), true};
    case 2:
        msgpack_pack_uint16(pk, 4242);
        return (struct sample){"uint16", MP_UINT, ACC(R_UINT, R_INT), true};
    case 3:
        msgpack_pack_int32(pk, -70000);
        return (struct sample){"int32", MP_INT, ACC(R_INT), true};
    case 4:
        msgpack_pack_uint64(pk, UINT64_MAX);
        return (struct sample){"uint64 max", MP_UINT, ACC(R_UINT), true};
    case 5:
        msgpack_pack_double(pk, 0.25);
        return (struct sample){"float64", MP_FLOAT, ACC(R_SKIP), true};
    case 6:
        msgpack_pack_str_with_body(pk, "hello", 5);
        return (struct sample){"fixstr", MP_STR, ACC(R_STR, R_KEY), true};
    case 7:
        msgpack_pack_str_with_body(pk, body, 300);
        return (struct sample){"str16", MP_STR, ACC(R_STR, R_KEY), true};
    case 8:
        msgpack_pack_bin_with_body(pk, "hello", 5);
        return (struct sample){"bin8", MP_BIN, ACC(R_BIN, R_KEY, R_BIN_REF), true};
    case 9:
        msgpack_pack_bin_with_body(pk, body, 300);
        return (struct sample){"bin16", MP_BIN, ACC(R_BIN, R_KEY, R_BIN_REF), true};
    case 10:
        msgpack_pack_ext_with_body(pk, "abcd", 4, 7);
        return (struct sample){"fixext4", MP_EXT, ACC(R_SKIP), true};
    case 11:
        msgpack_pack_ext_with_body(pk, body, 300, 7);
        return (struct sample){"ext16", MP_EXT, ACC(R_SKIP), true};
    case 12:
        msgpack_pack_array(pk, 2);
        msgpack_pack_int(pk, 1);
        msgpack_pack_int(pk, 2);
        return (struct sample){"fixarray", MP_ARRAY, ACC(R_ARRAY), false};
    case 13:
        msgpack_pack_array(pk, 20);
        for (int i = 0; i < 20; i++) {
            msgpack_pack_int(pk, i);
        }
        return (struct sample){"array16", MP_ARRAY, ACC(R_ARRAY), false};
    case 14:
        msgpack_pack_map(pk, 1);
        msgpack_pack_int(pk, 1);
        msgpack_pack_false(pk);
        return (struct sample){"fixmap", MP_MAP, ACC(R_MAP), false};
    default:
        msgpack_pack_map(pk, 20);
        for (int i = 0; i < 20; i++) {
            msgpack_pack_int(pk, i);
            msgpack_pack_nil(pk);
        }
        return (struct sample){"map16", MP_MAP, ACC(R_MAP), false};
    }
}

Test(mp, readers_accept_right_type_and_refuse_others)
{
    for (int k = 0; k < NSAMPLES; k++) {
        struct pbuf b;
        struct sample s;

        pb_init(&b);
        s = pack_sample(&b.pk, k);
        for (int w = 0; w < R_COUNT; w++) {
            uint8_t *buf = dup_bytes(b.sb.data, b.sb.size);
            struct mp_reader r;
            bool ok = (s.accepts >> w) & 1;

            mp_reader_init(&r, buf, b.sb.size);
            cr_assert_eq(mp_peek(&r), s.type, "%s peek", s.name);
            if (ok) {
                cr_assert_eq(run_reader(w, &r), 0, "%s read by %s", s.name, reader_names[w]);
                if (s.whole || w == R_SKIP) {
                    cr_assert_eq(r.p, r.end, "%s read by %s", s.name, reader_names[w]);
                } else {
                    cr_assert(r.p > buf && r.p < r.end);
                }
            } else {
                cr_assert_eq(run_reader(w, &r), -1, "%s read by %s", s.name, reader_names[w]);
                cr_assert_eq(r.p, buf, "%s: failed %s moved the cursor", s.name,
                             reader_names[w]);
            }
            free(buf);
        }
        pb_destroy(&b);
    }
}

Test(mp, truncated_input_fails_and_leaves_cursor)
{
    for (int k = 0; k < NSAMPLES; k++) {
        struct pbuf b;
        struct sample s;

        pb_init(&b);
        s = pack_sample(&b.pk, k);
        for (size_t cut = 0; cut < b.sb.size; cut++) {
            for (int w = 0; w < R_COUNT; w++) {
                uint8_t *buf = dup_bytes(b.sb.data, cut);
                struct mp_reader r;

                mp_reader_init(&r, buf, cut);
                cr_assert_eq(run_reader(w, &r), -1, "%s cut to %zu read by %s", s.name, cut,
                             reader_names[w]);
                cr_assert_eq(r.p, buf);
                free(buf);
            }
        }
        pb_destroy(&b);
    }
}

Test(mp, peek_reports_end_and_invalid)
{
    const uint8_t reserved[] = {0xc1};
    const uint8_t cut_uint[] = {0xcd, 0x01};
    const uint8_t cut_map[] = {0xdf, 0x00, 0x00};
    struct mp_reader r;

    mp_reader_init(&r, NULL, 0);
    cr_assert_eq(mp_peek(&r), MP_END);
    cr_assert_eq(mp_skip(&r), -1);
    mp_reader_init(&r, reserved, sizeof(reserved));
    cr_assert_eq(mp_peek(&r), MP_INVALID);
    cr_assert_eq(mp_skip(&r), -1);
    mp_reader_init(&r, cut_uint, sizeof(cut_uint));
    cr_assert_eq(mp_peek(&r), MP_INVALID);
    mp_reader_init(&r, cut_map, sizeof(cut_map));
    cr_assert_eq(mp_peek(&r), MP_INVALID);
}

Test(mp, counts_that_cannot_fit_are_refused)
{
    const uint8_t arr[] = {0xdd, 0x00, 0x00, 0x00, 0x04, 0x01, 0x02, 0x03};
    const uint8_t map[] = {0xde, 0x00, 0x02, 0x01, 0x02, 0x03};
    struct mp_reader r;
    uint32_t n;

    mp_reader_init(&r, arr, sizeof(arr));
    cr_assert_eq(mp_read_array(&r, &n), -1);
    cr_assert_eq(r.p, arr);
    cr_assert_eq(mp_skip(&r), -1);
    mp_reader_init(&r, map, sizeof(map));
    cr_assert_eq(mp_read_map(&r, &n), -1);
    cr_assert_eq(r.p, map);
    /* a count that fits passes */
    mp_reader_init(&r, (const uint8_t[]){0x93, 1, 2, 3}, 4);
    cr_assert_eq(mp_read_array(&r, &n), 0);
    cr_assert_eq(n, 3);
}

/* ---- ints ---- */

Test(mp, ints_of_every_width)
{
    static const struct {
        int enc;          /* how to pack */
        int64_t s;
        uint64_t u;
        uint8_t first;    /* expected header byte */
    } cases[] = {
        {0, 0, 0, 0x00},
        {0, 127, 0, 0x7f},
        {1, 0, 128, 0xcc},
        {1, 0, 255, 0xcc},
        {1, 0, 256, 0xcd},
        {1, 0, 65535, 0xcd},
        {1, 0, 65536, 0xce},
        {1, 0, UINT32_MAX, 0xce},
        {1, 0, (uint64_t)UINT32_MAX + 1, 0xcf},
        {1, 0, (uint64_t)INT64_MAX, 0xcf},
        {1, 0, (uint64_t)INT64_MAX + 1, 0xcf},
        {1, 0, UINT64_MAX, 0xcf},
        {0, -1, 0, 0xff},
        {0, -32, 0, 0xe0},
        {0, -33, 0, 0xd0},
        {0, -128, 0, 0xd0},
        {0, -129, 0, 0xd1},
        {0, -32768, 0, 0xd1},
        {0, -32769, 0, 0xd2},
        {0, INT32_MIN, 0, 0xd2},
        {0, (int64_t)INT32_MIN - 1, 0, 0xd3},
        {0, INT64_MIN, 0, 0xd3},
        /* fixed-width encodings of small values, as other packers emit them */
        {2, 5, 0, 0xcc},
        {3, 5, 0, 0xcd},
        {4, 5, 0, 0xce},
        {5, 5, 0, 0xcf},
        {6, 5, 0, 0xd0},
        {7, 5, 0, 0xd1},
        {8, 5, 0, 0xd2},
        {9, 5, 0, 0xd3},
        {6, -5, 0, 0xd0},
        {7, -5, 0, 0xd1},
        {8, -5, 0, 0xd2},
        {9, -5, 0, 0xd3},
    };

    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        struct pbuf b;
        struct mp_reader r;
        uint8_t *buf;
        uint64_t u = 0;
        int64_t s = 0;
        bool is_uint = cases[i].enc == 1;
        bool negative = !is_uint && cases[i].s < 0;

        pb_init(&b);
        switch (cases[i].enc) {
        case 0: msgpack_pack_int64(&b.pk, cases[i].s); break;
        case 1: msgpack_pack_uint64(&b.pk, cases[i].u); break;
        case 2: msgpack_pack_fix_uint8(&b.pk, (uint8_t)cases[i].s); break;
        case 3: msgpack_pack_fix_uint16(&b.pk, (uint16_t)cases[i].s); break;
        case 4: msgpack_pack_fix_uint32(&b.pk, (uint32_t)cases[i].s); break;
        case 5: msgpack_pack_fix_uint64(&b.pk, (uint64_t)cases[i].s); break;
        case 6: msgpack_pack_fix_int8(&b.pk, (int8_t)cases[i].s); break;
        case 7: msgpack_pack_fix_int16(&b.pk, (int16_t)cases[i].s); break;
        case 8: msgpack_pack_fix_int32(&b.pk, (int32_t)cases[i].s); break;
        default: msgpack_pack_fix_int64(&b.pk, cases[i].s); break;
        }
        cr_assert_eq((uint8_t)b.sb.data[0], cases[i].first, "case %zu packed as %02x", i,
                     (uint8_t)b.sb.data[0]);
        buf = dup_bytes(b.sb.data, b.sb.size);

        mp_reader_init(&r, buf, b.sb.size);
        if (negative) {
            cr_assert_eq(mp_read_uint(&r, &u), -1, "case %zu", i);
            cr_assert_eq(r.p, buf);
        } else {
            cr_assert_eq(mp_read_uint(&r, &u), 0, "case %zu", i);
            cr_assert_eq(u, is_uint ? cases[i].u : (uint64_t)cases[i].s, "case %zu", i);
            cr_assert_eq(r.p, r.end);
        }

        mp_reader_init(&r, buf, b.sb.size);
        if (is_uint && cases[i].u > INT64_MAX) {
            cr_assert_eq(mp_read_int(&r, &s), -1, "case %zu", i);
            cr_assert_eq(r.p, buf);
        } else {
            cr_assert_eq(mp_read_int(&r, &s), 0, "case %zu", i);
            cr_assert_eq(s, is_uint ? (int64_t)cases[i].u : cases[i].s, "case %zu", i);
            cr_assert_eq(r.p, r.end);
        }
        free(buf);
        pb_destroy(&b);
    }
}

/* ---- str, bin, key ---- */

Test(mp, str_and_bin_point_into_the_buffer)
{
    struct pbuf b;
    struct mp_reader r;
    const char *s;
    const uint8_t *p;
    uint32_t len;
    uint8_t *buf;

    pb_init(&b);
    msgpack_pack_str_with_body(&b.pk, "batch_put", 9);
    msgpack_pack_bin_with_body(&b.pk, "\x00k\xff", 3);
    msgpack_pack_str_with_body(&b.pk, "\x00k\xff", 3);
    msgpack_pack_str(&b.pk, 0);
    buf = dup_bytes(b.sb.data, b.sb.size);
    mp_reader_init(&r, buf, b.sb.size);

    cr_assert_eq(mp_read_str(&r, &s, &len), 0);
    cr_assert_eq(s, (const char *)buf + 1);
    cr_assert(mp_str_eq(s, len, "batch_put"));
    cr_assert_eq(mp_read_key(&r, &p, &len), 0);
    cr_assert_eq(len, 3);
    cr_assert_eq(memcmp(p, "\x00k\xff", 3), 0);
    /* the same bytes as str are the same key */
    cr_assert_eq(mp_read_key(&r, &p, &len), 0);
    cr_assert_eq(len, 3);
    cr_assert_eq(memcmp(p, "\x00k\xff", 3), 0);
    cr_assert_eq(mp_read_str(&r, &s, &len), 0);
    cr_assert_eq(len, 0);
    cr_assert_eq(mp_peek(&r), MP_END);
    free(buf);
    pb_destroy(&b);
}

Test(mp, str_eq)
{
    cr_assert(mp_str_eq("ping", 4, "ping"));
    cr_assert_not(mp_str_eq("ping", 3, "ping"));
    cr_assert_not(mp_str_eq("pinged", 6, "ping"));
    cr_assert_not(mp_str_eq("pong", 4, "ping"));
    cr_assert(mp_str_eq(NULL, 0, ""));
    cr_assert_not(mp_str_eq("a\0b", 3, "a"));
}

/* ---- holes ---- */

#define BIG 100000

/*
 * A batch_put whose two big values were spilled: [0, 9, "batch_put",
 * [[k1, k2, k3], [big1, small, big2]]] with the big bodies cut out of the
 * buffer. holes[] gets their offsets in the cut buffer.
 */
static uint8_t *
pack_holed_batch_put(size_t *len, struct mp_hole holes[2], uint8_t *small_at)
{
    struct pbuf b;
    size_t off1, off2, n = 0;
    uint8_t *cut;
    uint8_t *big = calloc(1, BIG);

    pb_init(&b);
    msgpack_pack_array(&b.pk, 4);
    msgpack_pack_int(&b.pk, 0);
    msgpack_pack_int(&b.pk, 9);
    mp_pack_cstr(&b.pk, "batch_put");
    msgpack_pack_array(&b.pk, 2);
    msgpack_pack_array(&b.pk, 3);
    msgpack_pack_bin_with_body(&b.pk, "k1", 2);
    msgpack_pack_str_with_body(&b.pk, "k2", 2);
    msgpack_pack_bin_with_body(&b.pk, "k3", 2);
    msgpack_pack_array(&b.pk, 3);
    msgpack_pack_bin_with_body(&b.pk, big, BIG);
    off1 = b.sb.size - BIG;
    msgpack_pack_bin_with_body(&b.pk, "small", 5);
    msgpack_pack_bin_with_body(&b.pk, big, BIG);
    off2 = b.sb.size - BIG;
    free(big);

    cut = malloc(b.sb.size - 2 * BIG);
    memcpy(cut + n, b.sb.data, off1);
    n += off1;
    memcpy(cut + n, b.sb.data + off1 + BIG, off2 - off1 - BIG);
    n += off2 - off1 - BIG;
    *len = n;
    holes[0] = (struct mp_hole){.off = off1, .len = BIG, .tag = small_at};
    holes[1] = (struct mp_hole){.off = off2 - BIG, .len = BIG, .tag = small_at + 1};
    pb_destroy(&b);
    return cut;
}

Test(mp, holes_in_a_batch_put)
{
    struct mp_hole holes[2];
    uint8_t tags[2];
    size_t len;
    uint8_t *buf = pack_holed_batch_put(&len, holes, tags);
    struct mp_reader r, saved;
    const uint8_t *p;
    const char *s;
    const struct mp_hole *hole;
    uint64_t u, vlen;
    uint32_t n, klen;

    mp_reader_init(&r, buf, len);
    mp_reader_holes(&r, holes, 2);
    cr_assert_eq(mp_read_array(&r, &n), 0);
    cr_assert_eq(n, 4);
    cr_assert_eq(mp_read_uint(&r, &u), 0);
    cr_assert_eq(u, 0);
    cr_assert_eq(mp_read_uint(&r, &u), 0);
    cr_assert_eq(u, 9);
    cr_assert_eq(mp_read_str(&r, &s, &klen), 0);
    cr_assert(mp_str_eq(s, klen, "batch_put"));
    cr_assert_eq(mp_read_array(&r, &n), 0);
    cr_assert_eq(mp_read_array(&r, &n), 0);
    cr_assert_eq(n, 3);
    for (int i = 0; i < 3; i++) {
        cr_assert_eq(mp_read_key(&r, &p, &klen), 0);
        cr_assert_eq(klen, 2);
    }
    cr_assert_eq(mp_read_array(&r, &n), 0);
    cr_assert_eq(n, 3);

    /* a hole has no bytes: the plain readers refuse it and leave everything as it was */
    saved = r;
    cr_assert_eq(mp_read_bin(&r, &p, &klen), -1);
    cr_assert_eq(mp_read_key(&r, &p, &klen), -1);
    cr_assert_eq(memcmp(&r, &saved, sizeof(r)), 0);

    cr_assert_eq(mp_read_bin_ref(&r, &p, &vlen, &hole), 0);
    cr_assert_null(p);
    cr_assert_eq(hole, &holes[0]);
    cr_assert_eq(hole->tag, &tags[0]);
    cr_assert_eq(vlen, BIG);
    cr_assert_eq(r.p, buf + holes[0].off);

    cr_assert_eq(mp_read_bin_ref(&r, &p, &vlen, &hole), 0);
    cr_assert_null(hole);
    cr_assert_eq(vlen, 5);
    cr_assert_eq(memcmp(p, "small", 5), 0);

    cr_assert_eq(mp_read_bin_ref(&r, &p, &vlen, &hole), 0);
    cr_assert_eq(hole, &holes[1]);
    cr_assert_eq(mp_peek(&r), MP_END);

    /* mp_skip steps over the holes too; without them the message is short */
    mp_reader_init(&r, buf, len);
    mp_reader_holes(&r, holes, 2);
    cr_assert_eq(mp_skip(&r), 0);
    cr_assert_eq(r.p, r.end);
    mp_reader_init(&r, buf, len);
    cr_assert_eq(mp_skip(&r), -1);
    cr_assert_eq(r.p, buf);
    free(buf);
}

Test(mp, hole_with_wrong_length_is_refused)
{
    struct mp_hole holes[2];
    uint8_t tags[2];
    size_t len;
    uint8_t *buf = pack_holed_batch_put(&len, holes, tags);
    struct mp_reader r;
    const uint8_t *p;
    const struct mp_hole *hole;
    uint64_t vlen;

    holes[0].len = BIG - 1;
    mp_reader_init(&r, buf, holes[0].off);
    r.p = buf + holes[0].off - 5; /* the bin32 header of big1 */
    r.end = buf + len;
    mp_reader_holes(&r, holes, 2);
    cr_assert_eq(mp_read_bin_ref(&r, &p, &vlen, &hole), -1);
    cr_assert_eq(r.p, buf + holes[0].off - 5);
    free(buf);
}

Test(mp, many_holes_are_found_in_linear_time, .timeout = 20)
{
    enum { N = 200000 };
    struct pbuf b;
    struct mp_hole *holes = calloc(N, sizeof(*holes));
    struct mp_reader r;
    uint32_t n;

    /* an array of N bin8 headers whose bodies (100 bytes each) were all spilled */
    pb_init(&b);
    msgpack_pack_array(&b.pk, N);
    for (size_t i = 0; i < N; i++) {
        msgpack_pack_bin(&b.pk, 100);
        holes[i] = (struct mp_hole){.off = b.sb.size, .len = 100};
    }
    mp_reader_init(&r, b.sb.data, b.sb.size);
    mp_reader_holes(&r, holes, N);
    cr_assert_eq(mp_read_array(&r, &n), 0);
    for (size_t i = 0; i < N; i++) {
        const uint8_t *p;
        const struct mp_hole *hole;
        uint64_t vlen;

        cr_assert_eq(mp_read_bin_ref(&r, &p, &vlen, &hole), 0);
        cr_assert_eq(hole, &holes[i]);
    }
    cr_assert_eq(mp_peek(&r), MP_END);

    mp_reader_init(&r, b.sb.data, b.sb.size);
    mp_reader_holes(&r, holes, N);
    cr_assert_eq(mp_skip(&r), 0);
    cr_assert_eq(r.p, r.end);
    free(holes);
    pb_destroy(&b);
}

/* ---- skip ---- */

Test(mp, skip_over_nested_structures)
{
    struct pbuf b;
    struct mp_reader r;
    uint8_t *buf;
    uint64_t u;

    /* [1, [2, {"a": [nil, true], "b": {}}, "x"], bin, ext, 1.5, -7] then 42 */
    pb_init(&b);
    msgpack_pack_array(&b.pk, 6);
    msgpack_pack_int(&b.pk, 1);
    msgpack_pack_array(&b.pk, 3);
    msgpack_pack_int(&b.pk, 2);
    msgpack_pack_map(&b.pk, 2);
    mp_pack_cstr(&b.pk, "a");
    msgpack_pack_array(&b.pk, 2);
    msgpack_pack_nil(&b.pk);
    msgpack_pack_true(&b.pk);
    mp_pack_cstr(&b.pk, "b");
    msgpack_pack_map(&b.pk, 0);
    mp_pack_cstr(&b.pk, "x");
    msgpack_pack_bin_with_body(&b.pk, "bytes", 5);
    msgpack_pack_ext_with_body(&b.pk, "12345678", 8, 1);
    msgpack_pack_double(&b.pk, 1.5);
    msgpack_pack_int(&b.pk, -7);
    msgpack_pack_int(&b.pk, 42);
    buf = dup_bytes(b.sb.data, b.sb.size);

    mp_reader_init(&r, buf, b.sb.size);
    cr_assert_eq(mp_skip(&r), 0);
    cr_assert_eq(mp_read_uint(&r, &u), 0);
    cr_assert_eq(u, 42);
    cr_assert_eq(mp_peek(&r), MP_END);

    /* cut anywhere inside the first object: refused, cursor intact */
    for (size_t cut = 0; cut < b.sb.size - 1; cut++) {
        mp_reader_init(&r, buf, cut);
        cr_assert_eq(mp_skip(&r), -1, "cut %zu", cut);
        cr_assert_eq(r.p, buf);
    }
    free(buf);
    pb_destroy(&b);
}

Test(mp, skip_depth_is_bounded)
{
    uint8_t buf[40];
    struct mp_reader r;

    /* 32 levels: 31 one-element arrays around [1] */
    memset(buf, 0x91, sizeof(buf));
    buf[32] = 0x01;
    mp_reader_init(&r, buf, 33);
    cr_assert_eq(mp_skip(&r), 0);
    cr_assert_eq(r.p, r.end);
    /* 33 levels */
    buf[32] = 0x91;
    buf[33] = 0x01;
    mp_reader_init(&r, buf, 34);
    cr_assert_eq(mp_skip(&r), -1);
    cr_assert_eq(r.p, buf);
}

/* ---- packing ---- */

static void
check_error_triple(int status, const char *message, uint64_t code, const char *name,
                   const char *text)
{
    struct pbuf b;
    msgpack_unpacked u;
    msgpack_object *o;
    size_t off = 0;

    pb_init(&b);
    mp_pack_error(&b.pk, status, message);
    msgpack_unpacked_init(&u);
    cr_assert_eq(msgpack_unpack_next(&u, b.sb.data, b.sb.size, &off), MSGPACK_UNPACK_SUCCESS);
    cr_assert_eq(off, b.sb.size);
    cr_assert_eq(u.data.type, MSGPACK_OBJECT_ARRAY);
    cr_assert_eq(u.data.via.array.size, 3);
    o = u.data.via.array.ptr;
    cr_assert_eq(o[0].type, MSGPACK_OBJECT_POSITIVE_INTEGER);
    cr_assert_eq(o[0].via.u64, code);
    cr_assert_eq(o[1].type, MSGPACK_OBJECT_STR);
    cr_assert_eq(o[1].via.str.size, strlen(name));
    cr_assert_eq(memcmp(o[1].via.str.ptr, name, strlen(name)), 0);
    cr_assert_eq(o[2].type, MSGPACK_OBJECT_STR);
    cr_assert_eq(o[2].via.str.size, strlen(text), "message \"%.*s\"", (int)o[2].via.str.size,
                 o[2].via.str.ptr);
    cr_assert_eq(memcmp(o[2].via.str.ptr, text, strlen(text)), 0);
    msgpack_unpacked_destroy(&u);
    pb_destroy(&b);
}

Test(mp, pack_error_is_code_name_message)
{
    check_error_triple(KV_NOT_FOUND, NULL, 1, "NOT_FOUND", kv_strerror(KV_NOT_FOUND));
    check_error_triple(KV_INVALID_ARGUMENT, "params must be an array", 6, "INVALID_ARGUMENT",
                       "params must be an array");
    check_error_triple(KV_PROTOCOL_ERROR, "map count cannot fit in max_message_size", 8,
                       "PROTOCOL_ERROR", "map count cannot fit in max_message_size");
    check_error_triple(-ENOMEM, NULL, 16, "INTERNAL", strerror(ENOMEM));
}

Test(mp, pack_error_reads_back_with_the_cursor)
{
    struct pbuf b;
    struct mp_reader r;
    const char *s;
    uint32_t n, len;
    uint64_t code;

    pb_init(&b);
    mp_pack_error(&b.pk, KV_TOO_LARGE, "batch of 20000 keys exceeds max_batch 16384");
    mp_reader_init(&r, b.sb.data, b.sb.size);
    cr_assert_eq(mp_read_array(&r, &n), 0);
    cr_assert_eq(n, 3);
    cr_assert_eq(mp_read_uint(&r, &code), 0);
    cr_assert_eq(code, KV_TOO_LARGE);
    cr_assert_eq(mp_read_str(&r, &s, &len), 0);
    cr_assert(mp_str_eq(s, len, "TOO_LARGE"));
    cr_assert_eq(mp_read_str(&r, &s, &len), 0);
    cr_assert(mp_str_eq(s, len, "batch of 20000 keys exceeds max_batch 16384"));
    cr_assert_eq(mp_peek(&r), MP_END);
    pb_destroy(&b);
}

Test(mp, pack_cstr)
{
    struct pbuf b;

    pb_init(&b);
    mp_pack_cstr(&b.pk, "pong");
    mp_pack_cstr(&b.pk, "");
    cr_assert_eq(b.sb.size, 6);
    cr_assert_eq(memcmp(b.sb.data, "\xa4pong\xa0", 6), 0);
    pb_destroy(&b);
}
