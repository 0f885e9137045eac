/*
 * mp: the bounded msgpack cursor declared in mp.h, plus the two packing
 * helpers. The reader owns nothing: it points into the caller's buffer and
 * borrows the hole list. Every read decodes into locals, checks that the
 * header and body lie inside [p, end), and only then moves the cursor, so a
 * failed read leaves the reader exactly as it was. It must never read past
 * end, allocate, or recurse.
 *
 * A count that cannot fit (an array of n elements with fewer than n bytes
 * left, a map with fewer than 2n) is treated as truncation: every element
 * has at least a one-byte header in the buffer, holes included (a hole only
 * removes a bin body), so callers may size work by a count they were given.
 *
 * Holes: r->holes/r->nholes is the window of holes not yet passed. Reads only
 * move forward, so a bin read drops the holes before its body from the front
 * of the window and matches the first one left: O(1) amortised per read.
 */
#include "mp.h"

#include <msgpack.h>
#include <string.h>

#include "kverr.h"

#define MP_SKIP_DEPTH 32

/*
 * Headers 0xc0..0xdf. hdr is the bytes that must be present before the
 * body: the whole value for fixed-size scalars, else the type byte, the
 * length or count field (lenw bytes wide, at byte 1) and, for ext, the type.
 * body is the data size of fixext (its length is implied).
 */
struct mp_op {
    uint8_t type;
    uint8_t hdr;
    uint8_t lenw;
    uint8_t body;
};

static const struct mp_op mp_ops[32] = {
    {MP_NIL, 1, 0, 0},     /* c0 */
    {MP_INVALID, 1, 0, 0}, /* c1 reserved */
    {MP_BOOL, 1, 0, 0},    /* c2 false */
    {MP_BOOL, 1, 0, 0},    /* c3 true */
    {MP_BIN, 2, 1, 0},     /* c4 bin8 */
    {MP_BIN, 3, 2, 0},     /* c5 bin16 */
    {MP_BIN, 5, 4, 0},     /* c6 bin32 */
    {MP_EXT, 3, 1, 0},     /* c7 ext8 */
    {MP_EXT, 4, 2, 0},     /* c8 ext16 */
    {MP_EXT, 6, 4, 0},     /* c9 ext32 */
    {MP_FLOAT, 5, 0, 0},   /* ca float32 */
    {MP_FLOAT, 9, 0, 0},   /* cb float64 */
    {MP_UINT, 2, 0, 0},    /* cc uint8 */
    {MP_UINT, 3, 0, 0},    /* cd uint16 */
    {MP_UINT, 5, 0, 0},    /* ce uint32 */
    {MP_UINT, 9, 0, 0},    /* cf uint64 */
    {MP_INT, 2, 0, 0},     /* d0 int8 */
    {MP_INT, 3, 0, 0},     /* d1 int16 */
    {MP_INT, 5, 0, 0},     /* d2 int32 */
    {MP_INT, 9, 0, 0},     /* d3 int64 */
    {MP_EXT, 2, 0, 1},     /* d4 fixext1 */
    {MP_EXT, 2, 0, 2},     /* d5 fixext2 */
    {MP_EXT, 2, 0, 4},     /* d6 fixext4 */
    {MP_EXT, 2, 0, 8},     /* d7 fixext8 */
    {MP_EXT, 2, 0, 16},    /* d8 fixext16 */
    {MP_STR, 2, 1, 0},     /* d9 str8 */
    {MP_STR, 3, 2, 0},     /* da str16 */
    {MP_STR, 5, 4, 0},     /* db str32 */
    {MP_ARRAY, 3, 2, 0},   /* dc array16 */
    {MP_ARRAY, 5, 4, 0},   /* dd array32 */
    {MP_MAP, 3, 2, 0},     /* de map16 */
    {MP_MAP, 5, 4, 0},     /* df map32 */
};

static inline uint16_t
mp_be16(const uint8_t *q)
{
    return (uint16_t)((q[0] << 8) | q[1]);
}

static inline uint32_t
mp_be32(const uint8_t *q)
{
    return ((uint32_t)q[0] << 24) | ((uint32_t)q[1] << 16) | ((uint32_t)q[2] << 8) | q[3];
}

static inline uint64_t
mp_be64(const uint8_t *q)
{
    return ((uint64_t)mp_be32(q) << 32) | mp_be32(q + 4);
}

static inline uint32_t
mp_len(const uint8_t *q, unsigned width)
{
    switch (width) {
    case 1:
        return q[0];
    case 2:
        return mp_be16(q);
    default:
        return mp_be32(q);
    }
}

static inline size_t
mp_avail(const struct mp_reader *r)
{
    return (size_t)(r->end - r->p);
}

/*
 * mp_head: decode the header at q (avail bytes). Sets *hdr to the header
 * size and *n to the body bytes (str, bin, ext), the element count (array;
 * twice the pair count for map) or 0. Returns the type; MP_END when avail is
 * 0, MP_INVALID for 0xc1 or a header cut short. The body is not checked.
 */
static inline enum mp_type
mp_head(const uint8_t *q, size_t avail, size_t *hdr, uint64_t *n)
{
    const struct mp_op *op;
    uint8_t b;

    if (avail == 0) {
        return MP_END;
    }
    b = q[0];
    *hdr = 1;
    *n = 0;
    if (b < 0x80) {
        return MP_UINT;
    }
    if (b >= 0xe0) {
        return MP_INT;
    }
    if (b < 0x90) {
        *n = (uint64_t)(b & 0x0f) * 2;
        return MP_MAP;
    }
    if (b < 0xa0) {
        *n = b & 0x0f;
        return MP_ARRAY;
    }
    if (b < 0xc0) {
        *n = b & 0x1f;
        return MP_STR;
    }
    op = &mp_ops[b - 0xc0];
    if (op->type == MP_INVALID || avail < op->hdr) {
        return MP_INVALID;
    }
    *hdr = op->hdr;
    if (op->lenw > 0) {
        *n = mp_len(q + 1, op->lenw);
        if (op->type == MP_MAP) {
            *n *= 2;
        }
    } else {
        *n = op->body;
    }
    return (enum mp_type)op->type;
}

/*
 * mp_int_head: decode an int of any encoding at q. Returns the header size,
 * or 0 when q does not hold a whole int. A value >= 0 goes to *u with *neg
 * false; a negative one to *s with *neg true.
 */
static inline size_t
mp_int_head(const uint8_t *q, size_t avail, uint64_t *u, int64_t *s, bool *neg)
{
    static const uint8_t sizes[8] = {2, 3, 5, 9, 2, 3, 5, 9}; /* cc..d3 */
    uint8_t b;
    size_t h;

    if (avail == 0) {
        return 0;
    }
    b = q[0];
    if (b < 0x80) {
        *u = b;
        *neg = false;
        return 1;
    }
    if (b >= 0xe0) {
        *s = (int8_t)b;
        *neg = true;
        return 1;
    }
    if (b < 0xcc || b > 0xd3) {
        return 0;
    }
    h = sizes[b - 0xcc];
    if (avail < h) {
        return 0;
    }
    switch (b) {
    case 0xcc:
        *u = q[1];
        break;
    case 0xcd:
        *u = mp_be16(q + 1);
        break;
    case 0xce:
        *u = mp_be32(q + 1);
        break;
    case 0xcf:
        *u = mp_be64(q + 1);
        break;
    case 0xd0:
        *s = (int8_t)q[1];
        break;
    case 0xd1:
        *s = (int16_t)mp_be16(q + 1);
        break;
    case 0xd2:
        *s = (int32_t)mp_be32(q + 1);
        break;
    default:
        *s = (int64_t)mp_be64(q + 1);
        break;
    }
    if (b >= 0xd0) {
        /* signed encodings may carry non-negative values */
        *neg = *s < 0;
        if (!*neg) {
            *u = (uint64_t)*s;
        }
    } else {
        *neg = false;
    }
    return h;
}

/* mp_str_head: header size of a str at q (0 if none) and its body length. */
static inline size_t
mp_str_head(const uint8_t *q, size_t avail, uint32_t *len)
{
    if (avail == 0) {
        return 0;
    }
    if ((q[0] & 0xe0) == 0xa0) {
        *len = q[0] & 0x1f;
        return 1;
    }
    if (q[0] >= 0xd9 && q[0] <= 0xdb) {
        unsigned w = 1u << (q[0] - 0xd9);
        if (avail < 1 + w) {
            return 0;
        }
        *len = mp_len(q + 1, w);
        return 1 + w;
    }
    return 0;
}

/* mp_bin_head: header size of a bin at q (0 if none) and its body length. */
static inline size_t
mp_bin_head(const uint8_t *q, size_t avail, uint32_t *len)
{
    if (avail == 0 || q[0] < 0xc4 || q[0] > 0xc6) {
        return 0;
    }
    {
        unsigned w = 1u << (q[0] - 0xc4);
        if (avail < 1 + w) {
            return 0;
        }
        *len = mp_len(q + 1, w);
        return 1 + w;
    }
}

/*
 * mp_hole_find: the hole whose body offset is off, or NULL. *passed is the
 * number of holes before it (or before off) that the window can drop.
 */
static inline const struct mp_hole *
mp_hole_find(const struct mp_reader *r, size_t off, size_t *passed)
{
    size_t i = 0;

    while (i < r->nholes && r->holes[i].off < off) {
        i++;
    }
    *passed = i;
    if (i < r->nholes && r->holes[i].off == off) {
        return &r->holes[i];
    }
    return NULL;
}

static inline void
mp_hole_drop(struct mp_reader *r, size_t n)
{
    if (n > 0) {                /* holes may be NULL: not even + 0 on it */
        r->holes += n;
        r->nholes -= n;
    }
}

/*
 * mp_bin_at: decode a bin header of hl bytes at q, body length n, against the
 * holes. Returns 1 if it is a hole (*hole set), 0 if its body is buffered,
 * -1 if the body runs past end or the hole's length disagrees. *passed is
 * what the window may drop on success (the hole itself included).
 */
static inline int
mp_bin_at(const struct mp_reader *r, const uint8_t *q, size_t hl, uint64_t n,
          const struct mp_hole **hole, size_t *passed)
{
    *passed = 0;
    *hole = NULL;
    if (r->nholes > 0) {
        *hole = mp_hole_find(r, (size_t)(q + hl - r->base), passed);
        if (*hole != NULL) {
            if ((*hole)->len != n) {
                return -1;
            }
            (*passed)++;
            return 1;
        }
    }
    if (n > (uint64_t)(r->end - q) - hl) {
        return -1;
    }
    return 0;
}

void
mp_reader_init(struct mp_reader *r, const void *buf, size_t len)
{
    r->base = buf;
    r->p = buf;
    r->end = len > 0 ? r->base + len : r->base;
    r->holes = NULL;
    r->nholes = 0;
}

void
mp_reader_holes(struct mp_reader *r, const struct mp_hole *holes, size_t n)
{
    r->holes = holes;
    r->nholes = holes != NULL ? n : 0;
}

enum mp_type
mp_peek(const struct mp_reader *r)
{
    size_t h;
    uint64_t n;

    return mp_head(r->p, mp_avail(r), &h, &n);
}

int
mp_read_nil(struct mp_reader *r)
{
    if (r->p == r->end || r->p[0] != 0xc0) {
        return -1;
    }
    r->p++;
    return 0;
}

int
mp_read_bool(struct mp_reader *r, bool *v)
{
    if (r->p == r->end || (r->p[0] & 0xfe) != 0xc2) {
        return -1;
    }
    *v = r->p[0] == 0xc3;
    r->p++;
    return 0;
}

int
mp_read_uint(struct mp_reader *r, uint64_t *v)
{
    uint64_t u = 0;
    int64_t s = 0;
    bool neg = false;
    size_t h = mp_int_head(r->p, mp_avail(r), &u, &s, &neg);

    if (h == 0 || neg) {
        return -1;
    }
    *v = u;
    r->p += h;
    return 0;
}

int
mp_read_int(struct mp_reader *r, int64_t *v)
{
    uint64_t u = 0;
    int64_t s = 0;
    bool neg = false;
    size_t h = mp_int_head(r->p, mp_avail(r), &u, &s, &neg);

    if (h == 0) {
        return -1;
    }
    if (neg) {
        *v = s;
    } else if (u <= INT64_MAX) {
        *v = (int64_t)u;
    } else {
        return -1;
    }
    r->p += h;
    return 0;
}

int
mp_read_array(struct mp_reader *r, uint32_t *n)
{
    const uint8_t *q = r->p;
    size_t avail = mp_avail(r);
    uint32_t v;
    size_t h;

    if (avail == 0) {
        return -1;
    }
    if ((q[0] & 0xf0) == 0x90) {
        v = q[0] & 0x0f;
        h = 1;
    } else if (q[0] == 0xdc && avail >= 3) {
        v = mp_be16(q + 1);
        h = 3;
    } else if (q[0] == 0xdd && avail >= 5) {
        v = mp_be32(q + 1);
        h = 5;
    } else {
        return -1;
    }
    if (v > avail - h) {
        return -1;
    }
    *n = v;
    r->p += h;
    return 0;
}

int
mp_read_map(struct mp_reader *r, uint32_t *n)
{
    const uint8_t *q = r->p;
    size_t avail = mp_avail(r);
    uint32_t v;
    size_t h;

    if (avail == 0) {
        return -1;
    }
    if ((q[0] & 0xf0) == 0x80) {
        v = q[0] & 0x0f;
        h = 1;
    } else if (q[0] == 0xde && avail >= 3) {
        v = mp_be16(q + 1);
        h = 3;
    } else if (q[0] == 0xdf && avail >= 5) {
        v = mp_be32(q + 1);
        h = 5;
    } else {
        return -1;
    }
    if ((uint64_t)v * 2 > avail - h) {
        return -1;
    }
    *n = v;
    r->p += h;
    return 0;
}

int
mp_read_str(struct mp_reader *r, const char **s, uint32_t *len)
{
    const struct mp_hole *hole;
    size_t passed;
    uint32_t n = 0;
    size_t h = mp_str_head(r->p, mp_avail(r), &n);

    /* a hole has no bytes to hand out: only mp_read_key_ref reads one */
    if (h == 0 || mp_bin_at(r, r->p, h, n, &hole, &passed) != 0) {
        return -1;
    }
    *s = (const char *)r->p + h;
    *len = n;
    r->p += h + n;
    mp_hole_drop(r, passed);
    return 0;
}

int
mp_read_bin(struct mp_reader *r, const uint8_t **p, uint32_t *len)
{
    const struct mp_hole *hole;
    size_t passed;
    uint32_t n = 0;
    size_t h = mp_bin_head(r->p, mp_avail(r), &n);

    /* a hole has no bytes to hand out: only mp_read_bin_ref reads one */
    if (h == 0 || mp_bin_at(r, r->p, h, n, &hole, &passed) != 0) {
        return -1;
    }
    *p = r->p + h;
    *len = n;
    r->p += h + n;
    mp_hole_drop(r, passed);
    return 0;
}

int
mp_read_key(struct mp_reader *r, const uint8_t **p, uint32_t *len)
{
    uint32_t n = 0;

    if (mp_str_head(r->p, mp_avail(r), &n) != 0) {
        return mp_read_str(r, (const char **)p, len);
    }
    return mp_read_bin(r, p, len);
}

/* Finish reading a str/bin whose header (h bytes, body n) is at r->p: a hole or buffered. */
static int
mp_read_ref(struct mp_reader *r, size_t h, uint32_t n, const uint8_t **p, uint64_t *len,
            const struct mp_hole **hole)
{
    const struct mp_hole *hl;
    size_t passed;
    int rc;

    if (h == 0) {
        return -1;
    }
    rc = mp_bin_at(r, r->p, h, n, &hl, &passed);
    if (rc < 0) {
        return -1;
    }
    *len = n;
    *hole = hl;
    if (rc > 0) {
        *p = NULL;
        r->p += h;
    } else {
        *p = r->p + h;
        r->p += h + n;
    }
    mp_hole_drop(r, passed);
    return 0;
}

int
mp_read_key_ref(struct mp_reader *r, const uint8_t **p, uint64_t *len,
                const struct mp_hole **hole)
{
    uint32_t n = 0;
    size_t h = mp_str_head(r->p, mp_avail(r), &n);

    if (h == 0) {
        h = mp_bin_head(r->p, mp_avail(r), &n);
    }
    return mp_read_ref(r, h, n, p, len, hole);
}

int
mp_read_bin_ref(struct mp_reader *r, const uint8_t **p, uint64_t *len,
                const struct mp_hole **hole)
{
    uint32_t n = 0;
    size_t h = mp_bin_head(r->p, mp_avail(r), &n);

    return mp_read_ref(r, h, n, p, len, hole);
}

int
mp_skip(struct mp_reader *r)
{
    /* left[d]: objects still to skip at level d; level 0 holds the one asked for */
    uint64_t left[MP_SKIP_DEPTH + 1];
    struct mp_reader c = *r;
    int d = 0;

    left[0] = 1;
    for (;;) {
        const struct mp_hole *hole;
        size_t h, passed;
        uint64_t n;
        size_t avail;
        enum mp_type t;

        while (left[d] == 0) {
            if (d == 0) {
                *r = c;
                return 0;
            }
            d--;
        }
        left[d]--;
        avail = mp_avail(&c);
        t = mp_head(c.p, avail, &h, &n);
        switch (t) {
        case MP_END:
        case MP_INVALID:
            return -1;
        case MP_ARRAY:
        case MP_MAP:
            if (n > avail - h) {
                return -1;
            }
            c.p += h;
            if (n > 0) {
                if (d == MP_SKIP_DEPTH) {
                    return -1;
                }
                left[++d] = n;
            }
            break;
        case MP_BIN:
        case MP_STR:
        case MP_EXT:
            /* any body may be a hole: the frame scanner spills big str/ext bodies too */
            switch (mp_bin_at(&c, c.p, h, n, &hole, &passed)) {
            case 0:
                c.p += h + n;
                break;
            case 1:
                c.p += h;
                break;
            default:
                return -1;
            }
            mp_hole_drop(&c, passed);
            break;
        default:
            c.p += h;
            break;
        }
    }
}

bool
mp_str_eq(const char *p, uint32_t len, const char *s)
{
    size_t n = strlen(s);

    return n == len && (n == 0 || memcmp(p, s, n) == 0);
}

void
mp_pack_error(struct msgpack_packer *pk, int status, const char *message)
{
    msgpack_pack_array(pk, 3);
    msgpack_pack_int(pk, kv_wire_code(status));
    mp_pack_cstr(pk, kv_errname(status));
    mp_pack_cstr(pk, message != NULL ? message : kv_strerror(status));
}

void
mp_pack_cstr(struct msgpack_packer *pk, const char *s)
{
    size_t n = s != NULL ? strlen(s) : 0;

    msgpack_pack_str(pk, n);
    if (n > 0) {
        msgpack_pack_str_body(pk, s, n);
    }
}
