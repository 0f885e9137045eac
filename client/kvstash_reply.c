/*
 * kvstash_reply: the reply decoding of libkvstash (kvstash_wire_reply and
 * kvstash_wire_call, kvstash_wire_salvage, kvstash_wire_skip and the
 * kvstash_wire_read_* calls of kvstash_wire.h).
 *
 * This module owns the reading side of a connection: what its fixed reply
 * buffer holds, the budget of the reply being read and the msgid expected
 * next. Replies are decoded by a streaming reader that pulls bytes through
 * kvstash_wire_recv as it needs them, checks every declared length and count
 * against what the reply may still hold (and against the caller's capacity)
 * before acting on it, and receives large bin bodies straight into the
 * caller's buffers. The server is not trusted: a malformed reply breaks the
 * connection with -EPROTO instead of being guessed at, and nothing is
 * allocated from a wire length except a value read into a malloc'd buffer
 * (bounded by the server's max_value_size) and a stats array (bounded by the
 * reply size). It must not touch the socket but through kvstash_wire_recv,
 * build or send a request but through kvstash_wire_req_send (the socket,
 * requests and connecting are kvstash_wire.c's), decide policy (kvstash.c),
 * keep global state or start a thread.
 */
#include "kvstash_wire.h"

#include <errno.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>

#include "kverr.h"

#define KVSTASH_WIRE_PEEK 512u               /* refill size right after a body went direct */
#define KVSTASH_WIRE_DIRECT_MIN (16u * 1024) /* bodies this big switch refills to the peek size */
#define KVSTASH_WIRE_RECV_PIECE (64u * 1024) /* at most this much per receive of a body */
#define KVSTASH_WIRE_MAX_DEPTH 16            /* nesting skipped at most */
#define KVSTASH_WIRE_SALVAGE_MS 200          /* wait for a parting notification */

enum kvstash_wire_rtype {
    RD_NIL, RD_BOOL, RD_UINT, RD_INT, RD_FLOAT, RD_STR, RD_BIN, RD_ARRAY, RD_MAP, RD_EXT
};

/* One decoded object header; bodies (str/bin/ext) and elements are still unread. */
struct kvstash_wire_head {
    enum kvstash_wire_rtype type;
    bool b;
    uint64_t u;                   /* RD_UINT */
    int64_t i;                    /* RD_INT (negative only) */
    uint64_t len;                 /* body bytes (STR/BIN/EXT), elements (ARRAY), pairs (MAP) */
};

/* ---- errors ---- */

/* kvstash_wire_bad: a malformed reply: say what, break the connection, -EPROTO. */
static int
kvstash_wire_bad(struct kvstash *c, const char *what)
{
    kvstash_wire_errf(c, "malformed reply from server: %s", what);
    c->broken = 1;
    return -EPROTO;
}

/* ---- reply reading ---- */

/* kvstash_wire_fill: make at least need (<= 9) bytes readable at rbuf[rpos]. */
static int
kvstash_wire_fill(struct kvstash *c, size_t need)
{
    size_t have = c->rlen - c->rpos;

    if (have >= need) {
        return 0;
    }
    memmove(c->rbuf, c->rbuf + c->rpos, have);
    c->rpos = 0;
    c->rlen = have;
    while (c->rlen < need) {
        size_t room = KVSTASH_WIRE_RBUF_SIZE - c->rlen;
        size_t want = c->fill_max < room ? c->fill_max : room;
        if (want < need - c->rlen) {
            want = need - c->rlen;
        }
        ssize_t r = kvstash_wire_recv(c, c->rbuf + c->rlen, want, false);
        if (r < 0) {
            return (int)r;
        }
        c->rlen += (size_t)r;
    }
    return 0;
}

/* kvstash_wire_body: consume len body bytes into dst, or drop them when dst is NULL. */
static int
kvstash_wire_body(struct kvstash *c, uint8_t *dst, uint64_t len)
{
    if (len > c->msg_left) {
        return kvstash_wire_bad(c, "body longer than the reply");
    }
    c->msg_left -= len;

    size_t have = c->rlen - c->rpos;
    size_t take = len < have ? (size_t)len : have;
    if (dst != NULL && take > 0) {
        memcpy(dst, c->rbuf + c->rpos, take);
        dst += take;
    }
    c->rpos += take;
    len -= take;
    if (len == 0) {
        c->fill_max = KVSTASH_WIRE_RBUF_SIZE;
        return 0;
    }
    if (dst == NULL) {
        /* drain through the buffer, never reading past the body */
        while (len > 0) {
            size_t want = len < KVSTASH_WIRE_RBUF_SIZE ? (size_t)len : KVSTASH_WIRE_RBUF_SIZE;
            ssize_t r = kvstash_wire_recv(c, c->rbuf, want, false);
            if (r < 0) {
                return (int)r;
            }
            len -= (uint64_t)r;
        }
        c->rpos = c->rlen = 0;
        c->fill_max = KVSTASH_WIRE_RBUF_SIZE;
        return 0;
    }
    /*
     * The rest goes straight from the socket into the caller's buffer, at most
     * KVSTASH_WIRE_RECV_PIECE bytes a call: the kernel lets the sender go on only when a
     * receive returns, so receiving a megabyte at once leaves the daemon idle meanwhile
     * (on one connection, 1 MiB gets ran 10-20% faster in 64 KiB pieces).
     */
    c->fill_max =
        take + len >= KVSTASH_WIRE_DIRECT_MIN ? KVSTASH_WIRE_PEEK : KVSTASH_WIRE_RBUF_SIZE;
    while (len > 0) {
        size_t want = len < KVSTASH_WIRE_RECV_PIECE ? (size_t)len : KVSTASH_WIRE_RECV_PIECE;
        ssize_t r = kvstash_wire_recv(c, dst, want, true);
        if (r < 0) {
            return (int)r;
        }
        dst += r;
        len -= (uint64_t)r;
    }
    return 0;
}

static uint64_t
kvstash_wire_be(const uint8_t *p, int n)
{
    uint64_t v = 0;

    for (int i = 0; i < n; i++) {
        v = (v << 8) | p[i];
    }
    return v;
}

/* kvstash_wire_head_read: decode one object header; bodies and elements stay unread. */
static int
kvstash_wire_head_read(struct kvstash *c, struct kvstash_wire_head *h)
{
    int rc = kvstash_wire_fill(c, 1);
    if (rc != 0) {
        return rc;
    }
    uint8_t b = c->rbuf[c->rpos];
    size_t hs = 1; /* header bytes */
    int ln = 0;    /* bytes of the big-endian length/value after the type byte */
    uint64_t extra = 0;

    memset(h, 0, sizeof(*h));
    if (b <= 0x7f) {
        h->type = RD_UINT;
        h->u = b;
    } else if (b <= 0x8f) {
        h->type = RD_MAP;
        h->len = b & 0x0f;
    } else if (b <= 0x9f) {
        h->type = RD_ARRAY;
        h->len = b & 0x0f;
    } else if (b <= 0xbf) {
        h->type = RD_STR;
        h->len = b & 0x1f;
    } else if (b >= 0xe0) {
        h->type = RD_INT;
        h->i = (int8_t)b;
    } else {
        switch (b) {
        case 0xc0: h->type = RD_NIL; break;
        case 0xc2: h->type = RD_BOOL; h->b = false; break;
        case 0xc3: h->type = RD_BOOL; h->b = true; break;
        case 0xc4: h->type = RD_BIN; ln = 1; break;
        case 0xc5: h->type = RD_BIN; ln = 2; break;
        case 0xc6: h->type = RD_BIN; ln = 4; break;
        case 0xc7: h->type = RD_EXT; ln = 1; extra = 1; break;
        case 0xc8: h->type = RD_EXT; ln = 2; extra = 1; break;
        case 0xc9: h->type = RD_EXT; ln = 4; extra = 1; break;
        case 0xca: h->type = RD_FLOAT; hs = 5; break;
        case 0xcb: h->type = RD_FLOAT; hs = 9; break;
        case 0xcc: h->type = RD_UINT; ln = 1; break;
        case 0xcd: h->type = RD_UINT; ln = 2; break;
        case 0xce: h->type = RD_UINT; ln = 4; break;
        case 0xcf: h->type = RD_UINT; ln = 8; break;
        case 0xd0: h->type = RD_INT; ln = 1; break;
        case 0xd1: h->type = RD_INT; ln = 2; break;
        case 0xd2: h->type = RD_INT; ln = 4; break;
        case 0xd3: h->type = RD_INT; ln = 8; break;
        case 0xd4: h->type = RD_EXT; h->len = 2; break;
        case 0xd5: h->type = RD_EXT; h->len = 3; break;
        case 0xd6: h->type = RD_EXT; h->len = 5; break;
        case 0xd7: h->type = RD_EXT; h->len = 9; break;
        case 0xd8: h->type = RD_EXT; h->len = 17; break;
        case 0xd9: h->type = RD_STR; ln = 1; break;
        case 0xda: h->type = RD_STR; ln = 2; break;
        case 0xdb: h->type = RD_STR; ln = 4; break;
        case 0xdc: h->type = RD_ARRAY; ln = 2; break;
        case 0xdd: h->type = RD_ARRAY; ln = 4; break;
        case 0xde: h->type = RD_MAP; ln = 2; break;
        case 0xdf: h->type = RD_MAP; ln = 4; break;
        default: return kvstash_wire_bad(c, "reserved byte 0xc1");
        }
    }
    if (ln > 0) {
        hs = 1 + (size_t)ln;
    }
    if (hs > c->msg_left) {
        return kvstash_wire_bad(c, "reply longer than allowed");
    }
    rc = kvstash_wire_fill(c, hs);
    if (rc != 0) {
        return rc;
    }
    if (ln > 0) {
        uint64_t v = kvstash_wire_be(c->rbuf + c->rpos + 1, ln);
        if (h->type == RD_UINT) {
            h->u = v;
        } else if (h->type == RD_INT) {
            /* sign-extend the ln-byte two's complement value */
            int64_t s = ln == 8 ? (int64_t)v : (int64_t)(v ^ (1ull << (8 * ln - 1)))
                                                   - (int64_t)(1ull << (8 * ln - 1));
            if (s >= 0) {
                h->type = RD_UINT;
                h->u = (uint64_t)s;
            } else {
                h->i = s;
            }
        } else {
            h->len = v + extra;
        }
    }
    if (h->type == RD_FLOAT) {
        h->u = kvstash_wire_be(c->rbuf + c->rpos + 1, (int)hs - 1);  /* the IEEE-754 bits */
        h->i = (int64_t)hs - 1;                                      /* 4 or 8 bytes */
    }
    c->rpos += hs;
    c->msg_left -= hs;
    /* every element needs at least one byte; every body byte must fit */
    if (h->type == RD_MAP ? h->len > c->msg_left / 2 : h->len > c->msg_left) {
        return kvstash_wire_bad(c, "length or count beyond the reply size");
    }
    return 0;
}

static int kvstash_wire_skip_nested(struct kvstash *c, int depth);

/* kvstash_wire_skip_rest: consume what follows header h (read at nesting depth). */
static int
kvstash_wire_skip_rest(struct kvstash *c, const struct kvstash_wire_head *h, int depth)
{
    switch (h->type) {
    case RD_STR:
    case RD_BIN:
    case RD_EXT:
        return kvstash_wire_body(c, NULL, h->len);
    case RD_ARRAY:
    case RD_MAP:
        if (depth >= KVSTASH_WIRE_MAX_DEPTH) {
            return kvstash_wire_bad(c, "nesting too deep");
        }
        for (uint64_t i = 0; i < (h->type == RD_MAP ? 2 * h->len : h->len); i++) {
            int rc = kvstash_wire_skip_nested(c, depth + 1);

            if (rc != 0) {
                return rc;
            }
        }
        return 0;
    default:
        return 0;       /* scalars (floats too): the header read took all of it */
    }
}

static int
kvstash_wire_skip_nested(struct kvstash *c, int depth)
{
    struct kvstash_wire_head h;
    int rc = kvstash_wire_head_read(c, &h);

    return rc != 0 ? rc : kvstash_wire_skip_rest(c, &h, depth);
}

int
kvstash_wire_skip(struct kvstash *c)
{
    return kvstash_wire_skip_nested(c, 1);
}

/* kvstash_wire_str_copy: a str/bin body of len bytes into dst (truncated, NUL-terminated). */
static int
kvstash_wire_str_copy(struct kvstash *c, uint64_t len, char *dst, size_t size)
{
    size_t n = len < size - 1 ? (size_t)len : size - 1;
    int rc = kvstash_wire_body(c, (uint8_t *)dst, n);

    dst[rc == 0 ? n : 0] = '\0';
    if (rc == 0 && len > n) {
        rc = kvstash_wire_body(c, NULL, len - n);
    }
    return rc;
}

/* Read one header and require its type; why names the failure for the error message. */
static int
kvstash_wire_head_expect(struct kvstash *c, struct kvstash_wire_head *h,
                         enum kvstash_wire_rtype type, const char *why)
{
    int rc = kvstash_wire_head_read(c, h);

    if (rc == 0 && h->type != type) {
        rc = kvstash_wire_bad(c, why);
    }
    return rc;
}

int
kvstash_wire_read_uint(struct kvstash *c, uint64_t *v)
{
    struct kvstash_wire_head h;
    int rc = kvstash_wire_head_expect(c, &h, RD_UINT, "expected a non-negative integer");

    if (rc == 0) {
        *v = h.u;
    }
    return rc;
}

int
kvstash_wire_read_code(struct kvstash *c, int *code)
{
    uint64_t v;
    int rc = kvstash_wire_read_uint(c, &v);

    if (rc != 0) {
        return rc;
    }
    if (v > INT_MAX) {
        return kvstash_wire_bad(c, "status code out of range");
    }
    *code = (int)v;
    return 0;
}

int
kvstash_wire_read_int(struct kvstash *c, int64_t *v)
{
    struct kvstash_wire_head h;
    int rc = kvstash_wire_head_read(c, &h);

    if (rc != 0) {
        return rc;
    }
    if (h.type == RD_INT) {
        *v = h.i;
    } else if (h.type == RD_UINT && h.u <= INT64_MAX) {
        *v = (int64_t)h.u;
    } else {
        return kvstash_wire_bad(c, h.type == RD_UINT ? "integer out of range"
                                                     : "expected an integer");
    }
    return 0;
}

int
kvstash_wire_read_bool(struct kvstash *c, bool *v)
{
    struct kvstash_wire_head h;
    int rc = kvstash_wire_head_expect(c, &h, RD_BOOL, "expected a bool");

    if (rc == 0) {
        *v = h.b;
    }
    return rc;
}

int
kvstash_wire_read_array(struct kvstash *c, uint64_t n)
{
    static const char why[] = "result array does not match the keys sent";
    struct kvstash_wire_head h;
    int rc = kvstash_wire_head_expect(c, &h, RD_ARRAY, why);

    if (rc == 0 && h.len != n) {
        rc = kvstash_wire_bad(c, why);
    }
    return rc;
}

/*
 * kvstash_wire_error_read: the rest of an error triple [code, name, message]
 * whose array header (n elements) was read. Keeps the message; returns the
 * code (>0) or -errno.
 */
static int
kvstash_wire_error_read(struct kvstash *c, uint64_t n)
{
    char name[32] = "";
    char msg[KVSTASH_WIRE_ERRLEN] = "";
    uint64_t code;
    int rc;

    if (n < 1) {
        return kvstash_wire_bad(c, "empty error");
    }
    rc = kvstash_wire_read_uint(c, &code);
    for (uint64_t i = 1; rc == 0 && i < n; i++) {
        struct kvstash_wire_head h;
        if (i > 2) {
            rc = kvstash_wire_skip(c);
            continue;
        }
        rc = kvstash_wire_head_read(c, &h);
        if (rc != 0) {
            break;
        }
        if (h.type == RD_STR || h.type == RD_BIN) {
            rc = i == 1 ? kvstash_wire_str_copy(c, h.len, name, sizeof(name))
                        : kvstash_wire_str_copy(c, h.len, msg, sizeof(msg));
        } else if (h.type == RD_ARRAY || h.type == RD_MAP || h.type == RD_EXT) {
            return kvstash_wire_bad(c, "error name or message is not a string");
        }
    }
    if (rc != 0) {
        return rc;
    }
    if (code == 0 || code > INT_MAX) {
        code = KVSTASH_EINTERNAL;
    }
    if (msg[0] != '\0') {
        kvstash_wire_errf(c, "%s", msg);
    } else {
        kvstash_wire_errf(c, "%s", name[0] ? name : kv_errname((int)code));
    }
    return (int)code;
}

int
kvstash_wire_reply(struct kvstash *c, uint64_t budget)
{
    for (;;) {
        struct kvstash_wire_head h;
        uint64_t kind;
        int rc;

        c->msg_left = budget;
        rc = kvstash_wire_head_read(c, &h);
        if (rc == 0 && (h.type != RD_ARRAY || h.len < 3 || h.len > 4)) {
            rc = kvstash_wire_bad(c, "not an rpc message");
        }
        if (rc == 0) {
            rc = kvstash_wire_read_uint(c, &kind);
        }
        if (rc != 0) {
            return rc;
        }
        if (kind == 2 && h.len == 3) {
            char method[32];
            struct kvstash_wire_head p;
            if (c->msg_left > KVSTASH_WIRE_NOTICE_MAX) {
                c->msg_left = KVSTASH_WIRE_NOTICE_MAX;
            }
            rc = kvstash_wire_head_read(c, &p);
            if (rc == 0 && p.type != RD_STR) {
                rc = kvstash_wire_bad(c, "notification method is not a string");
            }
            if (rc == 0) {
                rc = kvstash_wire_str_copy(c, p.len, method, sizeof(method));
            }
            if (rc != 0) {
                return rc;
            }
            if (strcmp(method, "error") != 0) {
                rc = kvstash_wire_skip(c); /* a notification this client does not know */
                if (rc != 0) {
                    return rc;
                }
                continue;
            }
            rc = kvstash_wire_head_read(c, &p);
            if (rc == 0 && p.type != RD_ARRAY) {
                rc = kvstash_wire_bad(c, "error notification without [code, name, message]");
            }
            if (rc == 0) {
                rc = kvstash_wire_error_read(c, p.len);
            }
            c->broken = 1; /* the server closes after an error notification */
            return rc;
        }
        if (kind != 1 || h.len != 4) {
            return kvstash_wire_bad(c, "unexpected message type");
        }
        uint64_t msgid;
        rc = kvstash_wire_read_uint(c, &msgid);
        if (rc != 0) {
            return rc;
        }
        if (msgid != c->want_msgid) {
            return kvstash_wire_bad(c, "reply id does not match the request");
        }
        c->want_msgid++;
        rc = kvstash_wire_head_read(c, &h);
        if (rc != 0) {
            return rc;
        }
        if (h.type == RD_NIL) {
            return 0;
        }
        if (h.type != RD_ARRAY) {
            return kvstash_wire_bad(c, "error is neither nil nor an array");
        }
        if (c->msg_left > KVSTASH_WIRE_NOTICE_MAX + KVSTASH_WIRE_SMALL_REPLY) {
            c->msg_left = KVSTASH_WIRE_NOTICE_MAX + KVSTASH_WIRE_SMALL_REPLY;
        }
        int code = kvstash_wire_error_read(c, h.len);
        if (code < 0) {
            return code;
        }
        rc = kvstash_wire_skip(c); /* the result of a failed request (nil) */
        return rc != 0 ? rc : code;
    }
}

/*
 * A server that refuses the connection writes its error notification and
 * closes, so our send fails; the notification is behind the replies owed.
 * A send that timed out has no such server behind it: it fails at once, so
 * the call ends within the timeout.
 */
int
kvstash_wire_salvage(struct kvstash *c, int rc)
{
    char why[KVSTASH_WIRE_ERRLEN];
    int saved = c->timeout_ms;

    if (rc == -ETIMEDOUT) {
        if (c->err[0] == '\0') {
            kvstash_wire_errf(c, "sending a request: %s", kv_strerror(rc));
        }
        return kvstash_wire_fail(c, rc);
    }
    memcpy(why, c->err, sizeof(why));
    c->timeout_ms = KVSTASH_WIRE_SALVAGE_MS;
    while (c->want_msgid != c->next_msgid + 1) {
        int r = kvstash_wire_reply(c, UINT64_MAX);
        if (r == 0) {
            r = kvstash_wire_skip(c);
        }
        if (r > 0 && c->broken) {
            c->timeout_ms = saved;
            return r; /* the notification, message kept */
        }
        if (r < 0) {
            break;
        }
    }
    c->timeout_ms = saved;
    memcpy(c->err, why, sizeof(why));
    if (c->err[0] == '\0') {
        kvstash_wire_errf(c, "sending a request: %s", kv_strerror(rc));
    }
    return kvstash_wire_fail(c, rc);
}

int
kvstash_wire_call(struct kvstash *c, uint64_t budget)
{
    int rc = kvstash_wire_req_send(c);

    if (rc < 0) {
        return rc == -ENOMEM ? rc : kvstash_wire_salvage(c, rc);
    }
    rc = kvstash_wire_reply(c, budget);
    if (rc < 0) {
        return kvstash_wire_fail(c, rc);
    }
    return rc;
}

/* ---- typed results ---- */

int
kvstash_wire_read_value(struct kvstash *c, void *buf, size_t cap, void **out, size_t *vlen)
{
    struct kvstash_wire_head h;
    int rc = kvstash_wire_head_read(c, &h);

    if (rc != 0) {
        return rc;
    }
    if (h.type == RD_NIL) {
        *vlen = 0;
        return KVSTASH_ENOTFOUND;
    }
    if (h.type != RD_BIN && h.type != RD_STR) {
        return kvstash_wire_bad(c, "value is neither bin nor nil");
    }
    *vlen = (size_t)h.len;
    if (out != NULL) {
        uint64_t limit = c->hello.max_value_size;
        if (h.len > limit || h.len > SIZE_MAX - 1) {
            kvstash_wire_errf(c, "value of %llu bytes exceeds the server's max_value_size %llu",
                              (unsigned long long)h.len, (unsigned long long)limit);
            rc = kvstash_wire_body(c, NULL, h.len);
            return rc != 0 ? rc : KVSTASH_ETOOLARGE;
        }
        *out = malloc(h.len ? (size_t)h.len : 1);
        if (*out == NULL) {
            rc = kvstash_wire_body(c, NULL, h.len);
            kvstash_wire_errf(c, "out of memory for a value of %llu bytes",
                              (unsigned long long)h.len);
            return rc != 0 ? rc : -ENOMEM;
        }
        rc = kvstash_wire_body(c, *out, h.len);
        if (rc != 0) {
            free(*out);
            *out = NULL;
        }
        return rc;
    }
    if (h.len > cap) {
        rc = kvstash_wire_body(c, NULL, h.len);
        return rc != 0 ? rc : KVSTASH_ETOOLARGE;
    }
    return kvstash_wire_body(c, buf, h.len);
}

int
kvstash_wire_read_size(struct kvstash *c, uint64_t *size)
{
    struct kvstash_wire_head h;
    int rc = kvstash_wire_head_read(c, &h);

    if (rc != 0) {
        return rc;
    }
    if (h.type == RD_NIL) {
        return KVSTASH_ENOTFOUND;
    }
    if (h.type != RD_UINT) {
        return kvstash_wire_bad(c, "size is neither an integer nor nil");
    }
    *size = h.u;
    return 0;
}

/*
 * kvstash_wire_map_entry: the next entry of a map being read: its name (a
 * str, truncated into name[0..size)) and its value's header; the value's
 * body or elements are the caller's to read or skip.
 */
static int
kvstash_wire_map_entry(struct kvstash *c, char *name, size_t size, struct kvstash_wire_head *v)
{
    struct kvstash_wire_head k;
    int rc = kvstash_wire_head_expect(c, &k, RD_STR, "a map key is not a string");

    if (rc == 0) {
        rc = kvstash_wire_str_copy(c, k.len, name, size);
    }
    return rc != 0 ? rc : kvstash_wire_head_read(c, v);
}

int
kvstash_wire_read_hello(struct kvstash *c, struct kvstash_hello *hi)
{
    struct kvstash_wire_head h;
    int rc = kvstash_wire_head_read(c, &h);

    if (rc == 0 && h.type != RD_MAP) {
        rc = kvstash_wire_bad(c, "hello result is not a map");
    }
    for (uint64_t i = 0; rc == 0 && i < h.len; i++) {
        struct kvstash_wire_head v;
        char name[32];
        uint64_t *slot = NULL;
        char *str = NULL;
        size_t strsz = 0;

        rc = kvstash_wire_map_entry(c, name, sizeof(name), &v);
        if (rc != 0) {
            break;
        }
        if (strcmp(name, "server") == 0) {
            str = hi->server;
            strsz = sizeof(hi->server);
        } else if (strcmp(name, "version") == 0) {
            str = hi->version;
            strsz = sizeof(hi->version);
        } else if (strcmp(name, "node_id") == 0) {
            str = hi->node_id;
            strsz = sizeof(hi->node_id);
        } else if (strcmp(name, "protocol") == 0) {
            slot = &hi->protocol;
        } else if (strcmp(name, "max_key_size") == 0) {
            slot = &hi->max_key_size;
        } else if (strcmp(name, "max_value_size") == 0) {
            slot = &hi->max_value_size;
        } else if (strcmp(name, "max_batch") == 0) {
            slot = &hi->max_batch;
        } else if (strcmp(name, "max_message_size") == 0) {
            slot = &hi->max_message_size;
        } else if (strcmp(name, "lease_ttl_ms") == 0) {
            slot = &hi->lease_ttl_ms;
        }
        if (strcmp(name, "rdma_qp") == 0 && v.type == RD_BIN && v.len <= sizeof(c->rdma_qp)) {
            rc = kvstash_wire_body(c, c->rdma_qp, v.len);
            c->rdma_qp_len = rc == 0 ? (size_t)v.len : 0;
        } else if (str != NULL && (v.type == RD_STR || v.type == RD_BIN)) {
            rc = kvstash_wire_str_copy(c, v.len, str, strsz);
        } else if (slot != NULL && v.type == RD_UINT) {
            *slot = v.u;
        } else {
            rc = kvstash_wire_skip_rest(c, &v, 1);
        }
    }
    return rc;
}

int
kvstash_wire_read_segment(struct kvstash *c, uint64_t *segment, uint64_t *size)
{
    struct kvstash_wire_head h;
    int rc = kvstash_wire_head_expect(c, &h, RD_MAP, "map_segment result is not a map");

    for (uint64_t i = 0; rc == 0 && i < h.len; i++) {
        struct kvstash_wire_head v;
        char name[16];

        rc = kvstash_wire_map_entry(c, name, sizeof(name), &v);
        if (rc != 0) {
            break;
        }
        if (strcmp(name, "segment") == 0 && v.type == RD_UINT) {
            *segment = v.u;
        } else if (strcmp(name, "size") == 0 && v.type == RD_UINT) {
            *size = v.u;
        } else {
            rc = kvstash_wire_skip_rest(c, &v, 1);
        }
    }
    return rc;
}

/* kvstash_wire_places_rest: the pieces of an array header h already read. */
static int
kvstash_wire_places_rest(struct kvstash *c, const struct kvstash_wire_head *h, uint64_t arena,
                         struct kvstash_wire_piece *places, size_t cap, size_t *n)
{
    if (h->len > cap) {
        return kvstash_wire_bad(c, "more pieces than an object has");
    }
    for (uint64_t i = 0; i < h->len; i++) {
        uint64_t seg, off, len;
        int rc = kvstash_wire_read_array(c, 3);

        if (rc == 0) {
            rc = kvstash_wire_read_uint(c, &seg);
        }
        if (rc == 0) {
            rc = kvstash_wire_read_uint(c, &off);
        }
        if (rc == 0) {
            rc = kvstash_wire_read_uint(c, &len);
        }
        if (rc != 0) {
            return rc;
        }
        if (seg != 0 || off > arena || len > arena - off) {
            return kvstash_wire_bad(c, "a piece outside the arena");
        }
        places[i].offset = off;
        places[i].length = len;
    }
    *n = (size_t)h->len;
    return 0;
}

int
kvstash_wire_read_places(struct kvstash *c, uint64_t arena, struct kvstash_wire_piece *places,
                         size_t cap, size_t *n)
{
    struct kvstash_wire_head h;
    int rc = kvstash_wire_head_read(c, &h);

    if (rc != 0) {
        return rc;
    }
    if (h.type == RD_UINT) {
        return h.u > 0 && h.u <= INT_MAX ? (int)h.u : kvstash_wire_bad(c, "bad status code");
    }
    if (h.type != RD_ARRAY) {
        return kvstash_wire_bad(c, "expected pieces or a code");
    }
    return kvstash_wire_places_rest(c, &h, arena, places, cap, n);
}

int
kvstash_wire_read_replica(struct kvstash *c, uint64_t arena, struct kvstash_wire_piece *places,
                          size_t cap, size_t *n, uint64_t *size, uint64_t *lease_ms)
{
    struct kvstash_wire_head h;
    bool have_pieces = false;
    int rc = kvstash_wire_head_read(c, &h);

    if (rc != 0) {
        return rc;
    }
    if (h.type == RD_NIL) {
        return KVSTASH_ENOTFOUND;
    }
    if (h.type != RD_MAP) {
        return kvstash_wire_bad(c, "a replica is neither nil nor a map");
    }
    for (uint64_t i = 0; rc == 0 && i < h.len; i++) {
        struct kvstash_wire_head v;
        char name[16];

        rc = kvstash_wire_map_entry(c, name, sizeof(name), &v);
        if (rc != 0) {
            break;
        }
        if (strcmp(name, "pieces") == 0 && v.type == RD_ARRAY) {
            rc = kvstash_wire_places_rest(c, &v, arena, places, cap, n);
            have_pieces = rc == 0;
        } else if (strcmp(name, "size") == 0 && v.type == RD_UINT) {
            *size = v.u;
        } else if (strcmp(name, "lease_ms") == 0 && v.type == RD_UINT) {
            *lease_ms = v.u;
        } else {
            rc = kvstash_wire_skip_rest(c, &v, 1);
        }
    }
    if (rc == 0 && !have_pieces) {
        rc = kvstash_wire_bad(c, "a replica without pieces");
    }
    return rc;
}

int
kvstash_wire_read_stats(struct kvstash *c, struct kvstash_stat **items, size_t *n)
{
    struct kvstash_wire_head h;
    struct kvstash_stat *v = NULL;
    size_t cnt = 0, cap = 0;
    int rc = kvstash_wire_head_read(c, &h);

    if (rc == 0 && h.type != RD_MAP) {
        rc = kvstash_wire_bad(c, "stats result is not a map");
    }
    for (uint64_t i = 0; rc == 0 && i < h.len; i++) {
        struct kvstash_wire_head k, val;
        struct kvstash_stat st;

        rc = kvstash_wire_head_read(c, &k);
        if (rc == 0 && k.type != RD_STR && k.type != RD_BIN) {
            rc = kvstash_wire_bad(c, "stats name is not a string");
        }
        if (rc == 0) {
            rc = kvstash_wire_str_copy(c, k.len, st.name, sizeof(st.name));
        }
        if (rc == 0) {
            rc = kvstash_wire_head_read(c, &val);
        }
        if (rc != 0) {
            break;
        }
        if (val.type != RD_UINT) {
            /* not a counter: leave it out */
            if (val.type == RD_STR || val.type == RD_BIN || val.type == RD_EXT) {
                rc = kvstash_wire_body(c, NULL, val.len);
            } else if (val.type == RD_ARRAY || val.type == RD_MAP) {
                for (uint64_t j = 0; rc == 0 && j < (val.type == RD_MAP ? 2 : 1) * val.len;
                     j++) {
                    rc = kvstash_wire_skip_nested(c, 2);
                }
            }
            continue;
        }
        if (k.len >= sizeof(st.name)) {
            continue; /* a truncated name would be a different counter */
        }
        st.value = val.u;
        if (cnt == cap) {
            size_t ncap = cap ? cap * 2 : 64;
            struct kvstash_stat *nv = realloc(v, ncap * sizeof(*nv));
            if (nv == NULL) {
                rc = -ENOMEM;
                break;
            }
            v = nv;
            cap = ncap;
        }
        v[cnt++] = st;
    }
    if (rc != 0) {
        free(v);
        return rc;
    }
    *items = v;
    *n = cnt;
    return 0;
}

/* ---- cluster_info ---- */

/* A str value into dst (cap bytes), or -EPROTO. */
static int
kvstash_wire_read_cstr(struct kvstash *c, char *dst, size_t cap, const char *what)
{
    struct kvstash_wire_head h;
    int rc = kvstash_wire_head_read(c, &h);

    if (rc == 0 && h.type != RD_STR && h.type != RD_BIN) {
        return kvstash_wire_bad(c, what);
    }
    return rc != 0 ? rc : kvstash_wire_str_copy(c, h.len, dst, cap);
}

/* A number (float, uint or int) as a double. */
static int
kvstash_wire_read_double(struct kvstash *c, double *out)
{
    struct kvstash_wire_head h;
    int rc = kvstash_wire_head_read(c, &h);

    if (rc != 0) {
        return rc;
    }
    if (h.type == RD_FLOAT && h.i == 8) {
        memcpy(out, &h.u, sizeof(*out));
    } else if (h.type == RD_FLOAT) {
        uint32_t bits = (uint32_t)h.u;
        float f;

        memcpy(&f, &bits, sizeof(f));
        *out = f;
    } else if (h.type == RD_UINT) {
        *out = (double)h.u;
    } else if (h.type == RD_INT) {
        *out = (double)h.i;
    } else {
        return kvstash_wire_bad(c, "cluster_info: a number expected");
    }
    return 0;
}

static int
kvstash_wire_read_cluster_node(struct kvstash *c, struct kvstash_cluster_node *nd)
{
    struct kvstash_wire_head h;
    int rc = kvstash_wire_head_read(c, &h);

    if (rc == 0 && h.type != RD_MAP) {
        rc = kvstash_wire_bad(c, "cluster_info: a node is not a map");
    }
    for (uint64_t i = 0; rc == 0 && i < h.len; i++) {
        char k[16];

        rc = kvstash_wire_read_cstr(c, k, sizeof(k), "cluster_info: a node's field name");
        if (rc != 0) {
            break;
        }
        if (strcmp(k, "id") == 0) {
            rc = kvstash_wire_read_cstr(c, nd->id, sizeof(nd->id), "cluster_info: node id");
        } else if (strcmp(k, "addr") == 0) {
            rc = kvstash_wire_read_cstr(c, nd->addr, sizeof(nd->addr), "cluster_info: addr");
        } else if (strcmp(k, "state") == 0) {
            rc = kvstash_wire_read_cstr(c, nd->state, sizeof(nd->state), "cluster_info: state");
        } else if (strcmp(k, "weight") == 0) {
            rc = kvstash_wire_read_double(c, &nd->weight);
        } else {
            rc = kvstash_wire_skip_nested(c, 2);
        }
    }
    return rc;
}

int
kvstash_wire_read_cluster(struct kvstash *c, struct kvstash_cluster *ci)
{
    struct kvstash_wire_head h, a;
    int rc = kvstash_wire_head_read(c, &h);

    if (rc == 0 && h.type != RD_MAP) {
        rc = kvstash_wire_bad(c, "cluster_info result is not a map");
    }
    for (uint64_t i = 0; rc == 0 && i < h.len; i++) {
        char k[32];
        uint64_t u;

        rc = kvstash_wire_read_cstr(c, k, sizeof(k), "cluster_info: a field name");
        if (rc != 0) {
            break;
        }
        if (strcmp(k, "cluster") == 0) {
            rc = kvstash_wire_read_cstr(c, ci->cluster, sizeof(ci->cluster), "cluster");
        } else if (strcmp(k, "node_id") == 0) {
            rc = kvstash_wire_read_cstr(c, ci->node_id, sizeof(ci->node_id), "node_id");
        } else if (strcmp(k, "state") == 0) {
            rc = kvstash_wire_read_cstr(c, ci->state, sizeof(ci->state), "state");
        } else if (strcmp(k, "etcd_endpoint") == 0) {
            rc = kvstash_wire_read_cstr(c, ci->etcd_endpoint, sizeof(ci->etcd_endpoint),
                                        "etcd_endpoint");
        } else if (strcmp(k, "registered") == 0) {
            rc = kvstash_wire_read_bool(c, &ci->registered);
        } else if (strcmp(k, "etcd_ok") == 0) {
            rc = kvstash_wire_read_bool(c, &ci->etcd_ok);
        } else if (strcmp(k, "revision") == 0) {
            rc = kvstash_wire_read_uint(c, &ci->revision);
        } else if (strcmp(k, "replicas") == 0) {
            rc = kvstash_wire_read_uint(c, &u);
            ci->replicas = (unsigned)u;
        } else if (strcmp(k, "self") == 0) {
            int64_t v;

            rc = kvstash_wire_read_int(c, &v);
            ci->self = (int)v;
        } else if (strcmp(k, "nodes") == 0) {
            rc = kvstash_wire_head_read(c, &a);
            if (rc == 0 && (a.type != RD_ARRAY || a.len > 65536)) {
                rc = kvstash_wire_bad(c, "cluster_info: nodes is not an array");
            }
            if (rc == 0 && a.len > 0) {
                ci->nodes = calloc((size_t)a.len, sizeof(*ci->nodes));
                rc = ci->nodes == NULL ? -ENOMEM : 0;
            }
            for (uint64_t j = 0; rc == 0 && j < a.len; j++) {
                rc = kvstash_wire_read_cluster_node(c, &ci->nodes[j]);
                ci->nnodes = (size_t)j + 1;
            }
        } else if (strcmp(k, "owners") == 0) {
            rc = kvstash_wire_head_read(c, &a);
            if (rc == 0 && a.type != RD_ARRAY) {
                rc = kvstash_wire_bad(c, "cluster_info: owners is not an array");
            }
            if (rc == 0 && a.len > 0) {
                ci->owners = calloc((size_t)a.len, sizeof(*ci->owners));
                ci->nowners = calloc((size_t)a.len, sizeof(*ci->nowners));
                rc = ci->owners == NULL || ci->nowners == NULL ? -ENOMEM : 0;
            }
            for (uint64_t j = 0; rc == 0 && j < a.len; j++) {
                struct kvstash_wire_head o = {.len = 0};

                rc = kvstash_wire_head_read(c, &o);
                if (rc == 0 && (o.type != RD_ARRAY || o.len > KVSTASH_CLUSTER_R_MAX)) {
                    rc = kvstash_wire_bad(c, "cluster_info: a key's owners");
                }
                for (uint64_t q = 0; rc == 0 && q < o.len; q++) {
                    rc = kvstash_wire_read_uint(c, &u);
                    ci->owners[j][q] = (uint32_t)u;
                }
                ci->nowners[j] = (unsigned)o.len;
                ci->nkeys = (size_t)j + 1;
            }
        } else {
            rc = kvstash_wire_skip(c);
        }
    }
    return rc;
}
