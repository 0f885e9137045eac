/*
 * kvstash: libkvstash, the blocking C client of kvstashd.
 *
 * This module owns one connection per struct kvstash: its socket, a reusable
 * request buffer and a fixed reply buffer. It keeps no global state, installs
 * no signal handler (sends use MSG_NOSIGNAL) and starts no thread. Requests
 * are packed with msgpack-c's packer; a value larger than KVSTASH_COPY_MAX is
 * not copied but sent by sendmsg straight from the caller's memory. Replies
 * are decoded by a streaming reader that pulls bytes from the socket as it
 * needs them, checks every declared length and count against what the reply
 * may still hold (and against the caller's capacity) before acting on it, and
 * receives large bin bodies straight into the caller's buffers. The server is
 * not trusted: a malformed reply breaks the connection with -EPROTO instead of
 * being guessed at, and nothing is allocated from a wire length except by
 * kvstash_get_alloc (bounded by the server's max_value_size) and
 * kvstash_stats (bounded by the reply size).
 *
 * Batch calls split the keys into requests of at most max_batch keys and
 * about min(max_message_size / 2, KVSTASH_REQ_TARGET) bytes and keep up to
 * KVSTASH_WINDOW of them in flight. When replies are large (batch_get) the
 * request bytes in flight are also capped, so that a server that stops
 * reading while its output is full can never wait on a client blocked in
 * send (the classic pipelining deadlock).
 */
#include "kvstash.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <sys/un.h>
#include <unistd.h>

#include <msgpack.h>

#include "kverr.h"
#include "version.h"

#ifndef IOV_MAX
#define IOV_MAX 1024
#endif

#define KVSTASH_DEFAULT_PORT "7431"
#define KVSTASH_ERRLEN 256
#define KVSTASH_RBUF_SIZE (64u * 1024)   /* reply buffer; big bodies bypass it */
#define KVSTASH_PEEK 512u                /* refill size right after a body went direct */
#define KVSTASH_DIRECT_MIN (16u * 1024)  /* bodies this big switch refills to KVSTASH_PEEK */
#define KVSTASH_COPY_MAX (8u * 1024)     /* values up to this are copied into the request */
#define KVSTASH_REQ_TARGET (32u << 20)   /* request bytes aimed at when splitting */
#define KVSTASH_WINDOW 8                 /* requests in flight per batch call */
#define KVSTASH_READ_AHEAD (128u * 1024) /* request bytes in flight when replies are big */
#define KVSTASH_SMALL_REPLY (1u << 20)   /* budget of hello, ping, counts */
#define KVSTASH_STATS_REPLY (16u << 20)  /* budget of a stats reply */
#define KVSTASH_NOTICE_MAX (64u * 1024)  /* budget of an error triple or a notification */
#define KVSTASH_MAX_DEPTH 16             /* nesting skipped at most */
#define KVSTASH_ITEM_MAX 9               /* wire bytes of an int, bool or nil */
#define KVSTASH_ENVELOPE 64              /* request bytes besides keys and values */
#define KVSTASH_SALVAGE_MS 200           /* wait for a parting notification */

/* Server limits assumed when hello leaves one out (the daemon's defaults). */
#define KVSTASH_DFLT_KEY (1u << 10)
#define KVSTASH_DFLT_VALUE (256u << 20)
#define KVSTASH_DFLT_BATCH 16384u
#define KVSTASH_DFLT_MESSAGE (1u << 30)

/* Why this thread's last kvstash_connect failed: there is no object to ask. */
static _Thread_local char kvstash_connect_err[KVSTASH_ERRLEN];

/* A piece of the request being built: bytes of wbuf (ext NULL) or caller memory. */
struct kvstash_seg {
    const uint8_t *ext;
    size_t off;
    size_t len;
};

struct kvstash {
    int fd;
    int broken;                   /* 0, or set once the stream is unusable */
    int timeout_ms;
    uint32_t next_msgid;          /* id of the next request written */
    uint32_t want_msgid;          /* id of the next reply expected */
    uint64_t req_target;          /* request bytes aimed at when splitting */
    struct kvstash_hello hello;
    char err[KVSTASH_ERRLEN];
    /* request side */
    msgpack_packer pk;
    uint8_t *wbuf;
    size_t wlen;
    size_t wcap;
    int wfail;
    struct kvstash_seg *segs;
    size_t nsegs;
    size_t segcap;
    size_t seg_start;             /* wbuf offset where the open segment starts */
    struct iovec *iov;
    size_t iovcap;
    /* reply side */
    uint8_t *rbuf;                /* KVSTASH_RBUF_SIZE bytes */
    size_t rpos;
    size_t rlen;
    size_t fill_max;              /* recv size for refills */
    uint64_t msg_left;            /* bytes the current reply may still use */
};

enum kvstash_rtype {
    RD_NIL, RD_BOOL, RD_UINT, RD_INT, RD_FLOAT, RD_STR, RD_BIN, RD_ARRAY, RD_MAP, RD_EXT
};

/* One decoded object header; bodies (str/bin/ext) and elements are still unread. */
struct kvstash_head {
    enum kvstash_rtype type;
    bool b;
    uint64_t u;                   /* RD_UINT */
    int64_t i;                    /* RD_INT (negative only) */
    uint64_t len;                 /* body bytes (STR/BIN/EXT), elements (ARRAY), pairs (MAP) */
};

enum kvstash_res { RES_CODES, RES_VALUES, RES_BOOLS };

/* A batch call: what to send and where its per-key results go. */
struct kvstash_op {
    const char *method;
    enum kvstash_res res;
    size_t n;
    const void *const *keys;
    const size_t *klens;
    const void *const *vals;      /* batch_put */
    const size_t *vlens;
    void *const *bufs;            /* batch_get */
    const size_t *caps;
    size_t *outlens;
    int *codes;                   /* RES_CODES, RES_VALUES */
    bool *exists;                 /* RES_BOOLS */
    const char *mode;             /* pin: the mode parameter */
    bool force;                   /* remove: opts {force: true} */
    bool skips;                   /* codes[i] >= 0 before the call: key i is not sent */
};

/* Keys [lo, hi) of a batch call that one request carries (minus skipped ones). */
struct kvstash_range {
    size_t lo;
    size_t hi;
    size_t nkeys;
    uint64_t wire;                /* request bytes */
};

/* ---- errors ---- */

static void
kvstash_errf(struct kvstash *c, const char *fmt, ...)
{
    va_list ap;

    va_start(ap, fmt);
    vsnprintf(c->err, sizeof(c->err), fmt, ap);
    va_end(ap);
}

/* kvstash_fail: a transport failure: remember why, break the connection, return rc. */
static int
kvstash_fail(struct kvstash *c, int rc)
{
    if (c->err[0] == '\0') {
        kvstash_errf(c, "%s", kv_strerror(rc));
    }
    c->broken = 1;
    return rc;
}

static int
kvstash_bad(struct kvstash *c, const char *what)
{
    kvstash_errf(c, "malformed reply from server: %s", what);
    c->broken = 1;
    return -EPROTO;
}

/* kvstash_begin: common entry of every call. */
static int
kvstash_begin(struct kvstash *c)
{
    if (c == NULL) {
        return -EINVAL;
    }
    if (c->broken) {
        kvstash_errf(c, "connection is broken by an earlier error; reconnect");
        return -EPIPE;
    }
    c->err[0] = '\0';
    return 0;
}

static uint64_t
kvstash_sat_add(uint64_t a, uint64_t b)
{
    return a > UINT64_MAX - b ? UINT64_MAX : a + b;
}

static uint64_t
kvstash_sat_mul(uint64_t a, uint64_t b)
{
    if (a != 0 && b > UINT64_MAX / a) {
        return UINT64_MAX;
    }
    return a * b;
}

/* ---- socket I/O ---- */

static int
kvstash_wait(struct kvstash *c, short events)
{
    struct pollfd p = { .fd = c->fd, .events = events, .revents = 0 };

    for (;;) {
        int r = poll(&p, 1, c->timeout_ms > 0 ? c->timeout_ms : -1);
        if (r > 0) {
            return 0; /* POLLERR/POLLHUP too: the next call reports the reason */
        }
        if (r == 0) {
            kvstash_errf(c, "no progress on the connection for %d ms", c->timeout_ms);
            return -ETIMEDOUT;
        }
        if (errno != EINTR) {
            return -errno;
        }
    }
}

/* kvstash_recv: some bytes (> 0) or -errno; end of stream is -ECONNRESET. */
static ssize_t
kvstash_recv(struct kvstash *c, void *buf, size_t len, bool all)
{
    int flags = c->timeout_ms > 0 ? MSG_DONTWAIT : (all ? MSG_WAITALL : 0);

    for (;;) {
        ssize_t r = recv(c->fd, buf, len, flags);
        if (r > 0) {
            return r;
        }
        if (r == 0) {
            kvstash_errf(c, "server closed the connection");
            return -ECONNRESET;
        }
        if (errno == EINTR) {
            continue;
        }
        if (errno == EAGAIN || errno == EWOULDBLOCK) {
            int rc = kvstash_wait(c, POLLIN);
            if (rc != 0) {
                return rc;
            }
            continue;
        }
        return -errno;
    }
}

/* kvstash_send_iov: write all of iov[0..n) (modified as it goes). 0 or -errno. */
static int
kvstash_send_iov(struct kvstash *c, struct iovec *iov, size_t n)
{
    int flags = MSG_NOSIGNAL | (c->timeout_ms > 0 ? MSG_DONTWAIT : 0);

    while (n > 0) {
        struct msghdr mh;
        memset(&mh, 0, sizeof(mh));
        mh.msg_iov = iov;
        mh.msg_iovlen = n < IOV_MAX ? n : IOV_MAX;
        ssize_t w = sendmsg(c->fd, &mh, flags);
        if (w < 0) {
            if (errno == EINTR) {
                continue;
            }
            if (errno == EAGAIN || errno == EWOULDBLOCK) {
                int rc = kvstash_wait(c, POLLOUT);
                if (rc != 0) {
                    return rc;
                }
                continue;
            }
            return -errno;
        }
        size_t left = (size_t)w;
        while (n > 0 && left >= iov->iov_len) {
            left -= iov->iov_len;
            iov++;
            n--;
        }
        if (n > 0) {
            iov->iov_base = (uint8_t *)iov->iov_base + left;
            iov->iov_len -= left;
        }
    }
    return 0;
}

/* ---- request building ---- */

static int
kvstash_wreserve(struct kvstash *c, size_t add)
{
    if (add <= c->wcap - c->wlen) {
        return 0;
    }
    size_t cap = c->wcap ? c->wcap : 4096;
    while (cap - c->wlen < add) {
        if (cap > SIZE_MAX / 2) {
            return -ENOMEM;
        }
        cap *= 2;
    }
    uint8_t *p = realloc(c->wbuf, cap);
    if (p == NULL) {
        return -ENOMEM;
    }
    c->wbuf = p;
    c->wcap = cap;
    return 0;
}

static int
kvstash_pack_write(void *data, const char *buf, size_t len)
{
    struct kvstash *c = data;

    if (c->wfail || kvstash_wreserve(c, len) != 0) {
        c->wfail = 1;
        return -1;
    }
    memcpy(c->wbuf + c->wlen, buf, len);
    c->wlen += len;
    return 0;
}

static int
kvstash_seg_add(struct kvstash *c, const uint8_t *ext, size_t off, size_t len)
{
    if (len == 0) {
        return 0;
    }
    if (c->nsegs == c->segcap) {
        size_t cap = c->segcap ? c->segcap * 2 : 64;
        struct kvstash_seg *s = realloc(c->segs, cap * sizeof(*s));
        if (s == NULL) {
            c->wfail = 1;
            return -ENOMEM;
        }
        c->segs = s;
        c->segcap = cap;
    }
    c->segs[c->nsegs++] = (struct kvstash_seg){ .ext = ext, .off = off, .len = len };
    return 0;
}

/* kvstash_req_begin: start [0, msgid, method, [ ...nparams ]]. */
static void
kvstash_req_begin(struct kvstash *c, const char *method, uint32_t nparams)
{
    c->wlen = 0;
    c->wfail = 0;
    c->nsegs = 0;
    c->seg_start = 0;
    msgpack_pack_array(&c->pk, 4);
    msgpack_pack_uint32(&c->pk, 0);
    msgpack_pack_uint32(&c->pk, c->next_msgid);
    msgpack_pack_str_with_body(&c->pk, method, strlen(method));
    msgpack_pack_array(&c->pk, nparams);
}

static void
kvstash_req_key(struct kvstash *c, const void *key, size_t klen)
{
    msgpack_pack_bin_with_body(&c->pk, klen ? key : "", klen);
}

static void
kvstash_req_value(struct kvstash *c, const void *val, size_t vlen)
{
    if (vlen <= KVSTASH_COPY_MAX) {
        msgpack_pack_bin_with_body(&c->pk, vlen ? val : "", vlen);
        return;
    }
    msgpack_pack_bin(&c->pk, vlen);
    kvstash_seg_add(c, NULL, c->seg_start, c->wlen - c->seg_start);
    kvstash_seg_add(c, val, 0, vlen);
    c->seg_start = c->wlen;
}

static void
kvstash_req_force(struct kvstash *c)
{
    msgpack_pack_map(&c->pk, 1);
    msgpack_pack_str_with_body(&c->pk, "force", 5);
    msgpack_pack_true(&c->pk);
}

/* kvstash_req_send: write the request built since kvstash_req_begin. 0 or -errno. */
static int
kvstash_req_send(struct kvstash *c)
{
    kvstash_seg_add(c, NULL, c->seg_start, c->wlen - c->seg_start);
    if (c->wfail) {
        kvstash_errf(c, "out of memory building a request");
        return -ENOMEM;
    }
    if (c->iovcap < c->nsegs) {
        struct iovec *v = realloc(c->iov, c->nsegs * sizeof(*v));
        if (v == NULL) {
            kvstash_errf(c, "out of memory building a request");
            return -ENOMEM;
        }
        c->iov = v;
        c->iovcap = c->nsegs;
    }
    for (size_t i = 0; i < c->nsegs; i++) {
        const struct kvstash_seg *s = &c->segs[i];
        c->iov[i].iov_base = (void *)(s->ext ? s->ext : c->wbuf + s->off);
        c->iov[i].iov_len = s->len;
    }
    int rc = kvstash_send_iov(c, c->iov, c->nsegs);
    if (rc == 0) {
        c->next_msgid++;
    }
    return rc;
}

/* ---- reply reading ---- */

/* kvstash_fill: make at least need (<= 9) bytes readable at rbuf[rpos]. */
static int
kvstash_fill(struct kvstash *c, size_t need)
{
    size_t have = c->rlen - c->rpos;

    if (have >= need) {
        return 0;
    }
    memmove(c->rbuf, c->rbuf + c->rpos, have);
    c->rpos = 0;
    c->rlen = have;
    while (c->rlen < need) {
        size_t room = KVSTASH_RBUF_SIZE - c->rlen;
        size_t want = c->fill_max < room ? c->fill_max : room;
        if (want < need - c->rlen) {
            want = need - c->rlen;
        }
        ssize_t r = kvstash_recv(c, c->rbuf + c->rlen, want, false);
        if (r < 0) {
            return (int)r;
        }
        c->rlen += (size_t)r;
    }
    return 0;
}

/* kvstash_body: consume len body bytes into dst, or drop them when dst is NULL. */
static int
kvstash_body(struct kvstash *c, uint8_t *dst, uint64_t len)
{
    if (len > c->msg_left) {
        return kvstash_bad(c, "body longer than the reply");
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
        c->fill_max = KVSTASH_RBUF_SIZE;
        return 0;
    }
    if (dst == NULL) {
        /* drain through the buffer, never reading past the body */
        while (len > 0) {
            size_t want = len < KVSTASH_RBUF_SIZE ? (size_t)len : KVSTASH_RBUF_SIZE;
            ssize_t r = kvstash_recv(c, c->rbuf, want, false);
            if (r < 0) {
                return (int)r;
            }
            len -= (uint64_t)r;
        }
        c->rpos = c->rlen = 0;
        c->fill_max = KVSTASH_RBUF_SIZE;
        return 0;
    }
    /* the rest goes straight from the socket into the caller's buffer */
    c->fill_max = take + len >= KVSTASH_DIRECT_MIN ? KVSTASH_PEEK : KVSTASH_RBUF_SIZE;
    while (len > 0) {
        ssize_t r = kvstash_recv(c, dst, (size_t)len, true);
        if (r < 0) {
            return (int)r;
        }
        dst += r;
        len -= (uint64_t)r;
    }
    return 0;
}

static uint64_t
kvstash_be(const uint8_t *p, int n)
{
    uint64_t v = 0;

    for (int i = 0; i < n; i++) {
        v = (v << 8) | p[i];
    }
    return v;
}

/* kvstash_head_read: decode one object header; bodies and elements stay unread. */
static int
kvstash_head_read(struct kvstash *c, struct kvstash_head *h)
{
    int rc = kvstash_fill(c, 1);
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
        default: return kvstash_bad(c, "reserved byte 0xc1");
        }
    }
    if (ln > 0) {
        hs = 1 + (size_t)ln;
    }
    if (hs > c->msg_left) {
        return kvstash_bad(c, "reply longer than allowed");
    }
    rc = kvstash_fill(c, hs);
    if (rc != 0) {
        return rc;
    }
    if (ln > 0) {
        uint64_t v = kvstash_be(c->rbuf + c->rpos + 1, ln);
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
    c->rpos += hs;
    c->msg_left -= hs;
    /* every element needs at least one byte; every body byte must fit */
    if (h->type == RD_MAP ? h->len > c->msg_left / 2 : h->len > c->msg_left) {
        return kvstash_bad(c, "length or count beyond the reply size");
    }
    return 0;
}

static int
kvstash_skip(struct kvstash *c, int depth)
{
    struct kvstash_head h;
    int rc = kvstash_head_read(c, &h);

    if (rc != 0) {
        return rc;
    }
    switch (h.type) {
    case RD_STR:
    case RD_BIN:
    case RD_EXT:
        return kvstash_body(c, NULL, h.len);
    case RD_FLOAT:
        return 0; /* the header read took all of it */
    case RD_ARRAY:
    case RD_MAP:
        if (depth >= KVSTASH_MAX_DEPTH) {
            return kvstash_bad(c, "nesting too deep");
        }
        for (uint64_t i = 0; i < (h.type == RD_MAP ? 2 * h.len : h.len); i++) {
            rc = kvstash_skip(c, depth + 1);
            if (rc != 0) {
                return rc;
            }
        }
        return 0;
    default:
        return 0;
    }
}

/* kvstash_str_copy: a str/bin body of len bytes into dst (truncated, NUL-terminated). */
static int
kvstash_str_copy(struct kvstash *c, uint64_t len, char *dst, size_t size)
{
    size_t n = len < size - 1 ? (size_t)len : size - 1;
    int rc = kvstash_body(c, (uint8_t *)dst, n);

    dst[rc == 0 ? n : 0] = '\0';
    if (rc == 0 && len > n) {
        rc = kvstash_body(c, NULL, len - n);
    }
    return rc;
}

static int
kvstash_read_uint(struct kvstash *c, uint64_t *v)
{
    struct kvstash_head h;
    int rc = kvstash_head_read(c, &h);

    if (rc != 0) {
        return rc;
    }
    if (h.type != RD_UINT) {
        return kvstash_bad(c, "expected a non-negative integer");
    }
    *v = h.u;
    return 0;
}

static int
kvstash_read_code(struct kvstash *c, int *code)
{
    uint64_t v;
    int rc = kvstash_read_uint(c, &v);

    if (rc != 0) {
        return rc;
    }
    if (v > INT_MAX) {
        return kvstash_bad(c, "status code out of range");
    }
    *code = (int)v;
    return 0;
}

static int
kvstash_read_bool(struct kvstash *c, bool *v)
{
    struct kvstash_head h;
    int rc = kvstash_head_read(c, &h);

    if (rc != 0) {
        return rc;
    }
    if (h.type != RD_BOOL) {
        return kvstash_bad(c, "expected a bool");
    }
    *v = h.b;
    return 0;
}

/* kvstash_read_array: an array header that must count exactly n elements. */
static int
kvstash_read_array(struct kvstash *c, uint64_t n)
{
    struct kvstash_head h;
    int rc = kvstash_head_read(c, &h);

    if (rc != 0) {
        return rc;
    }
    if (h.type != RD_ARRAY || h.len != n) {
        return kvstash_bad(c, "result array does not match the keys sent");
    }
    return 0;
}

/*
 * kvstash_error_read: the rest of an error triple [code, name, message]
 * whose array header (n elements) was read. Keeps the message; returns the
 * code (>0) or -errno.
 */
static int
kvstash_error_read(struct kvstash *c, uint64_t n)
{
    char name[32] = "";
    char msg[KVSTASH_ERRLEN] = "";
    uint64_t code;
    int rc;

    if (n < 1) {
        return kvstash_bad(c, "empty error");
    }
    rc = kvstash_read_uint(c, &code);
    for (uint64_t i = 1; rc == 0 && i < n; i++) {
        struct kvstash_head h;
        if (i > 2) {
            rc = kvstash_skip(c, 1);
            continue;
        }
        rc = kvstash_head_read(c, &h);
        if (rc != 0) {
            break;
        }
        if (h.type == RD_STR || h.type == RD_BIN) {
            rc = i == 1 ? kvstash_str_copy(c, h.len, name, sizeof(name))
                        : kvstash_str_copy(c, h.len, msg, sizeof(msg));
        } else if (h.type == RD_ARRAY || h.type == RD_MAP || h.type == RD_EXT) {
            return kvstash_bad(c, "error name or message is not a string");
        }
    }
    if (rc != 0) {
        return rc;
    }
    if (code == 0 || code > INT_MAX) {
        code = KVSTASH_EINTERNAL;
    }
    if (msg[0] != '\0') {
        kvstash_errf(c, "%s", msg);
    } else {
        kvstash_errf(c, "%s", name[0] ? name : kv_errname((int)code));
    }
    return (int)code;
}

/*
 * kvstash_reply: read up to the result of the next reply (messages in request
 * order). Returns 0 with the result next; a positive code for a request-level
 * error (whole reply consumed) or for an error notification (the connection
 * is then broken); or -errno. budget bounds the reply's wire bytes.
 */
static int
kvstash_reply(struct kvstash *c, uint64_t budget)
{
    for (;;) {
        struct kvstash_head h;
        uint64_t kind;
        int rc;

        c->msg_left = budget;
        rc = kvstash_head_read(c, &h);
        if (rc == 0 && (h.type != RD_ARRAY || h.len < 3 || h.len > 4)) {
            rc = kvstash_bad(c, "not an rpc message");
        }
        if (rc == 0) {
            rc = kvstash_read_uint(c, &kind);
        }
        if (rc != 0) {
            return rc;
        }
        if (kind == 2 && h.len == 3) {
            char method[32];
            struct kvstash_head p;
            if (c->msg_left > KVSTASH_NOTICE_MAX) {
                c->msg_left = KVSTASH_NOTICE_MAX;
            }
            rc = kvstash_head_read(c, &p);
            if (rc == 0 && p.type != RD_STR) {
                rc = kvstash_bad(c, "notification method is not a string");
            }
            if (rc == 0) {
                rc = kvstash_str_copy(c, p.len, method, sizeof(method));
            }
            if (rc != 0) {
                return rc;
            }
            if (strcmp(method, "error") != 0) {
                rc = kvstash_skip(c, 1); /* a notification this client does not know */
                if (rc != 0) {
                    return rc;
                }
                continue;
            }
            rc = kvstash_head_read(c, &p);
            if (rc == 0 && p.type != RD_ARRAY) {
                rc = kvstash_bad(c, "error notification without [code, name, message]");
            }
            if (rc == 0) {
                rc = kvstash_error_read(c, p.len);
            }
            c->broken = 1; /* the server closes after an error notification */
            return rc;
        }
        if (kind != 1 || h.len != 4) {
            return kvstash_bad(c, "unexpected message type");
        }
        uint64_t msgid;
        rc = kvstash_read_uint(c, &msgid);
        if (rc != 0) {
            return rc;
        }
        if (msgid != c->want_msgid) {
            return kvstash_bad(c, "reply id does not match the request");
        }
        c->want_msgid++;
        rc = kvstash_head_read(c, &h);
        if (rc != 0) {
            return rc;
        }
        if (h.type == RD_NIL) {
            return 0;
        }
        if (h.type != RD_ARRAY) {
            return kvstash_bad(c, "error is neither nil nor an array");
        }
        if (c->msg_left > KVSTASH_NOTICE_MAX + KVSTASH_SMALL_REPLY) {
            c->msg_left = KVSTASH_NOTICE_MAX + KVSTASH_SMALL_REPLY;
        }
        int code = kvstash_error_read(c, h.len);
        if (code < 0) {
            return code;
        }
        rc = kvstash_skip(c, 1); /* the result of a failed request (nil) */
        return rc != 0 ? rc : code;
    }
}

/*
 * kvstash_salvage: a send failed. A server that refuses the connection (too
 * many clients, a framing violation) sends an error notification before it
 * closes; read the replies already on their way for a short while to find it.
 * Returns the notification's code, or rc.
 */
static int
kvstash_salvage(struct kvstash *c, int rc)
{
    char why[KVSTASH_ERRLEN];
    int saved = c->timeout_ms;

    memcpy(why, c->err, sizeof(why));
    c->timeout_ms = KVSTASH_SALVAGE_MS;
    while (c->want_msgid != c->next_msgid + 1) {
        int r = kvstash_reply(c, UINT64_MAX);
        if (r == 0) {
            r = kvstash_skip(c, 1);
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
        kvstash_errf(c, "sending a request: %s", kv_strerror(rc));
    }
    return kvstash_fail(c, rc);
}

/* kvstash_call: send the built request and read up to its result. */
static int
kvstash_call(struct kvstash *c, uint64_t budget)
{
    int rc = kvstash_req_send(c);

    if (rc < 0) {
        return rc == -ENOMEM ? rc : kvstash_salvage(c, rc);
    }
    rc = kvstash_reply(c, budget);
    if (rc < 0) {
        return kvstash_fail(c, rc);
    }
    return rc;
}

/* kvstash_done: finish a call whose result was read (or failed reading). */
static int
kvstash_done(struct kvstash *c, int rc)
{
    return rc < 0 ? kvstash_fail(c, rc) : rc;
}

/* ---- value results ---- */

/*
 * kvstash_value_read: one bin|nil result into buf (capacity cap), or into a
 * malloc'd buffer when out is not NULL. Returns 0 (*vlen set),
 * KVSTASH_ENOTFOUND, KVSTASH_ETOOLARGE (*vlen = size needed; body drained),
 * or -errno.
 */
static int
kvstash_value_read(struct kvstash *c, void *buf, size_t cap, void **out, size_t *vlen)
{
    struct kvstash_head h;
    int rc = kvstash_head_read(c, &h);

    if (rc != 0) {
        return rc;
    }
    if (h.type == RD_NIL) {
        *vlen = 0;
        return KVSTASH_ENOTFOUND;
    }
    if (h.type != RD_BIN && h.type != RD_STR) {
        return kvstash_bad(c, "value is neither bin nor nil");
    }
    *vlen = (size_t)h.len;
    if (out != NULL) {
        uint64_t limit = c->hello.max_value_size;
        if (h.len > limit || h.len > SIZE_MAX - 1) {
            kvstash_errf(c, "value of %llu bytes exceeds the server's max_value_size %llu",
                         (unsigned long long)h.len, (unsigned long long)limit);
            rc = kvstash_body(c, NULL, h.len);
            return rc != 0 ? rc : KVSTASH_ETOOLARGE;
        }
        *out = malloc(h.len ? (size_t)h.len : 1);
        if (*out == NULL) {
            rc = kvstash_body(c, NULL, h.len);
            kvstash_errf(c, "out of memory for a value of %llu bytes",
                         (unsigned long long)h.len);
            return rc != 0 ? rc : -ENOMEM;
        }
        rc = kvstash_body(c, *out, h.len);
        if (rc != 0) {
            free(*out);
            *out = NULL;
        }
        return rc;
    }
    if (h.len > cap) {
        rc = kvstash_body(c, NULL, h.len);
        return rc != 0 ? rc : KVSTASH_ETOOLARGE;
    }
    return kvstash_body(c, buf, h.len);
}

/* ---- batch engine ---- */

static bool
kvstash_op_skipped(const struct kvstash_op *op, size_t i)
{
    return op->skips && op->codes[i] >= 0;
}

static uint64_t
kvstash_op_cost(const struct kvstash *c, const struct kvstash_op *op, size_t i, uint64_t *wire)
{
    uint64_t w = (uint64_t)op->klens[i] + 5;
    uint64_t cost;

    if (op->vals != NULL) {
        w += (uint64_t)op->vlens[i] + 5;
    }
    cost = w;
    if (op->res == RES_VALUES) {
        /* split gets by the reply they may bring back, too */
        uint64_t cap = op->caps[i];
        cost += cap < c->hello.max_value_size ? cap : c->hello.max_value_size;
    }
    *wire = w;
    return cost;
}

/* kvstash_op_plan: the next request's keys, starting at key lo. */
static void
kvstash_op_plan(const struct kvstash *c, const struct kvstash_op *op, size_t lo,
                struct kvstash_range *r)
{
    uint64_t bytes = KVSTASH_ENVELOPE;
    size_t i;

    r->lo = lo;
    r->nkeys = 0;
    r->wire = KVSTASH_ENVELOPE;
    for (i = lo; i < op->n; i++) {
        uint64_t wire;
        if (kvstash_op_skipped(op, i)) {
            continue;
        }
        uint64_t cost = kvstash_op_cost(c, op, i, &wire);
        if (r->nkeys > 0 && (r->nkeys >= c->hello.max_batch ||
                             kvstash_sat_add(bytes, cost) > c->req_target)) {
            break;
        }
        r->nkeys++;
        bytes = kvstash_sat_add(bytes, cost);
        r->wire = kvstash_sat_add(r->wire, wire);
    }
    r->hi = i;
}

static int
kvstash_op_send(struct kvstash *c, const struct kvstash_op *op, const struct kvstash_range *r)
{
    uint32_t nparams = 1 + (op->vals != NULL) + (op->mode != NULL) + op->force;

    kvstash_req_begin(c, op->method, nparams);
    msgpack_pack_array(&c->pk, (uint32_t)r->nkeys);
    for (size_t i = r->lo; i < r->hi; i++) {
        if (!kvstash_op_skipped(op, i)) {
            kvstash_req_key(c, op->keys[i], op->klens[i]);
        }
    }
    if (op->vals != NULL) {
        msgpack_pack_array(&c->pk, (uint32_t)r->nkeys);
        for (size_t i = r->lo; i < r->hi; i++) {
            if (!kvstash_op_skipped(op, i)) {
                kvstash_req_value(c, op->vals[i], op->vlens[i]);
            }
        }
    }
    if (op->mode != NULL) {
        msgpack_pack_str_with_body(&c->pk, op->mode, strlen(op->mode));
    }
    if (op->force) {
        kvstash_req_force(c);
    }
    return kvstash_req_send(c);
}

/* kvstash_op_fail: a request-level error for keys [lo, hi). */
static void
kvstash_op_fail(const struct kvstash_op *op, size_t lo, size_t hi, int code)
{
    for (size_t i = lo; i < hi; i++) {
        if (kvstash_op_skipped(op, i)) {
            continue;
        }
        switch (op->res) {
        case RES_VALUES:
            op->outlens[i] = 0;
            /* fall through */
        case RES_CODES:
            op->codes[i] = code;
            break;
        case RES_BOOLS:
            op->exists[i] = false;
            break;
        }
    }
}

static int
kvstash_op_read(struct kvstash *c, const struct kvstash_op *op, const struct kvstash_range *r)
{
    uint64_t per = op->res == RES_VALUES ? (uint64_t)UINT32_MAX + 5 : KVSTASH_ITEM_MAX;
    uint64_t budget = kvstash_sat_add(kvstash_sat_mul(per, r->nkeys),
                                      KVSTASH_NOTICE_MAX + KVSTASH_SMALL_REPLY);
    int rc = kvstash_reply(c, budget);

    if (rc != 0) {
        return rc;
    }
    rc = kvstash_read_array(c, r->nkeys);
    for (size_t i = r->lo; rc == 0 && i < r->hi; i++) {
        if (kvstash_op_skipped(op, i)) {
            continue;
        }
        switch (op->res) {
        case RES_CODES:
            rc = kvstash_read_code(c, &op->codes[i]);
            break;
        case RES_BOOLS:
            rc = kvstash_read_bool(c, &op->exists[i]);
            break;
        case RES_VALUES:
            rc = kvstash_value_read(c, op->bufs[i], op->caps[i], NULL, &op->outlens[i]);
            if (rc > 0) {
                op->codes[i] = rc;
                rc = 0;
            } else if (rc == 0) {
                op->codes[i] = KVSTASH_OK;
            }
            break;
        }
    }
    return rc < 0 ? rc : 0;
}

/*
 * kvstash_op_run: send a batch call as requests of at most max_batch keys,
 * up to KVSTASH_WINDOW in flight, and read their replies in order. Returns 0,
 * the first request-level error (the keys of that and of unsent requests get
 * it as their code), or -errno.
 */
static int
kvstash_op_run(struct kvstash *c, struct kvstash_op *op)
{
    struct kvstash_range ring[KVSTASH_WINDOW];
    struct kvstash_range pend;
    size_t head = 0, tail = 0;
    size_t next = 0;
    uint64_t inflight_wire = 0;
    bool have_pend = false;
    bool big = op->res == RES_VALUES;
    int first = 0;
    int rc;

    if (op->n > 0 && op->keys == NULL) {
        kvstash_errf(c, "keys is NULL");
        return KVSTASH_EINVAL;
    }
    for (;;) {
        while (first == 0) {
            if (!have_pend) {
                if (next >= op->n) {
                    break;
                }
                kvstash_op_plan(c, op, next, &pend);
                next = pend.hi;
                if (pend.nkeys == 0) {
                    continue;
                }
                have_pend = true;
            }
            size_t inflight = head - tail;
            if (inflight >= KVSTASH_WINDOW ||
                (big && inflight > 0 && inflight_wire + pend.wire > KVSTASH_READ_AHEAD)) {
                break;
            }
            rc = kvstash_op_send(c, op, &pend);
            if (rc == -ENOMEM) {
                /* nothing of it was sent, but replies still in flight would be orphaned */
                return head == tail ? rc : kvstash_fail(c, rc);
            }
            if (rc < 0) {
                return kvstash_salvage(c, rc);
            }
            ring[head % KVSTASH_WINDOW] = pend;
            head++;
            inflight_wire += pend.wire;
            have_pend = false;
        }
        if (head == tail) {
            break;
        }
        const struct kvstash_range *r = &ring[tail % KVSTASH_WINDOW];
        rc = kvstash_op_read(c, op, r);
        if (rc < 0) {
            return kvstash_fail(c, rc);
        }
        if (rc > 0) {
            if (c->broken) {
                return rc; /* error notification: the server is closing */
            }
            kvstash_op_fail(op, r->lo, r->hi, rc);
            if (first == 0) {
                first = rc;
            }
        }
        tail++;
        inflight_wire -= r->wire;
    }
    if (first != 0) {
        kvstash_op_fail(op, have_pend ? pend.lo : next, op->n, first);
    }
    return first;
}

/* ---- connecting ---- */

/*
 * kvstash_sock_connect: connect fd, within timeout_ms when it is > 0. An
 * interrupted blocking connect goes on in the background, so it is waited
 * for rather than retried.
 */
static int
kvstash_sock_connect(int fd, const struct sockaddr *sa, socklen_t salen, int timeout_ms)
{
    int fl = -1;

    if (timeout_ms > 0) {
        fl = fcntl(fd, F_GETFL);
        if (fl < 0 || fcntl(fd, F_SETFL, fl | O_NONBLOCK) != 0) {
            return -errno;
        }
    }
    if (connect(fd, sa, salen) != 0) {
        if (errno != EINPROGRESS && errno != EINTR) {
            return -errno;
        }
        struct pollfd p = { .fd = fd, .events = POLLOUT, .revents = 0 };
        for (;;) {
            int r = poll(&p, 1, timeout_ms > 0 ? timeout_ms : -1);
            if (r > 0) {
                break;
            }
            if (r == 0) {
                return -ETIMEDOUT;
            }
            if (errno != EINTR) {
                return -errno;
            }
        }
        int soerr = 0;
        socklen_t len = sizeof(soerr);
        if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &soerr, &len) != 0) {
            return -errno;
        }
        if (soerr != 0) {
            return -soerr;
        }
    }
    if (fl >= 0 && fcntl(fd, F_SETFL, fl) != 0) {
        return -errno;
    }
    return 0;
}

static int
kvstash_connect_unix(const char *path, int timeout_ms, int *fdp)
{
    struct sockaddr_un sun;

    memset(&sun, 0, sizeof(sun));
    sun.sun_family = AF_UNIX;
    if (path[0] == '\0') {
        return -EINVAL;
    }
    if (strlen(path) >= sizeof(sun.sun_path)) {
        return -ENAMETOOLONG;
    }
    memcpy(sun.sun_path, path, strlen(path) + 1);
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) {
        return -errno;
    }
    int rc = kvstash_sock_connect(fd, (const struct sockaddr *)&sun, sizeof(sun), timeout_ms);
    if (rc != 0) {
        close(fd);
        return rc;
    }
    *fdp = fd;
    return 0;
}

/* kvstash_split_hostport: "host:port", "[v6]:port", "host", "[v6]" or a bare v6 address. */
static int
kvstash_split_hostport(const char *addr, char *host, size_t hostsz, char *port, size_t portsz)
{
    const char *h = addr;
    size_t hlen;
    const char *p = NULL;

    if (addr[0] == '[') {
        const char *close = strchr(addr, ']');
        if (close == NULL || (close[1] != '\0' && close[1] != ':')) {
            return -EINVAL;
        }
        h = addr + 1;
        hlen = (size_t)(close - h);
        p = close[1] == ':' ? close + 2 : NULL;
    } else {
        const char *colon = strrchr(addr, ':');
        if (colon != NULL && strchr(addr, ':') == colon) {
            hlen = (size_t)(colon - addr);
            p = colon + 1;
        } else {
            hlen = strlen(addr); /* no port, or a bare IPv6 address */
        }
    }
    if (hlen == 0 || hlen >= hostsz || (p != NULL && (p[0] == '\0' || strlen(p) >= portsz))) {
        return -EINVAL;
    }
    memcpy(host, h, hlen);
    host[hlen] = '\0';
    snprintf(port, portsz, "%s", p ? p : KVSTASH_DEFAULT_PORT);
    return 0;
}

static int
kvstash_connect_tcp(const char *addr, int timeout_ms, int *fdp)
{
    char host[256];
    char port[32];
    struct addrinfo hints;
    struct addrinfo *res = NULL;
    int rc = kvstash_split_hostport(addr, host, sizeof(host), port, sizeof(port));

    if (rc != 0) {
        return rc;
    }
    memset(&hints, 0, sizeof(hints));
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_ADDRCONFIG;
    int gai = getaddrinfo(host, port, &hints, &res);
    if (gai != 0) {
        switch (gai) {
        case EAI_SYSTEM: return -errno;
        case EAI_MEMORY: return -ENOMEM;
        case EAI_AGAIN: return -EAGAIN;
        case EAI_SERVICE: return -EINVAL;
        default: return -ENXIO; /* no such host */
        }
    }
    rc = -ENXIO;
    for (struct addrinfo *ai = res; ai != NULL; ai = ai->ai_next) {
        int fd = socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, ai->ai_protocol);
        if (fd < 0) {
            rc = -errno;
            continue;
        }
        rc = kvstash_sock_connect(fd, ai->ai_addr, ai->ai_addrlen, timeout_ms);
        if (rc == 0) {
            int one = 1;
            (void)setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
            *fdp = fd;
            break;
        }
        close(fd);
    }
    freeaddrinfo(res);
    return rc;
}

static int
kvstash_hello_read(struct kvstash *c)
{
    struct kvstash_head h;
    struct kvstash_hello *hi = &c->hello;
    int rc;

    kvstash_req_begin(c, "hello", 0);
    rc = kvstash_call(c, KVSTASH_SMALL_REPLY);
    if (rc != 0) {
        return rc;
    }
    rc = kvstash_head_read(c, &h);
    if (rc == 0 && h.type != RD_MAP) {
        rc = kvstash_bad(c, "hello result is not a map");
    }
    for (uint64_t i = 0; rc == 0 && i < h.len; i++) {
        struct kvstash_head k, v;
        char name[32];
        uint64_t *slot = NULL;
        char *str = NULL;
        size_t strsz = 0;

        rc = kvstash_head_read(c, &k);
        if (rc == 0 && k.type != RD_STR) {
            rc = kvstash_bad(c, "hello key is not a string");
        }
        if (rc == 0) {
            rc = kvstash_str_copy(c, k.len, name, sizeof(name));
        }
        if (rc == 0) {
            rc = kvstash_head_read(c, &v);
        }
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
        if (str != NULL && (v.type == RD_STR || v.type == RD_BIN)) {
            rc = kvstash_str_copy(c, v.len, str, strsz);
        } else if (slot != NULL && v.type == RD_UINT) {
            *slot = v.u;
        } else if (v.type == RD_STR || v.type == RD_BIN || v.type == RD_EXT) {
            rc = kvstash_body(c, NULL, v.len);
        } else if (v.type == RD_ARRAY || v.type == RD_MAP) {
            for (uint64_t j = 0; rc == 0 && j < (v.type == RD_MAP ? 2 * v.len : v.len); j++) {
                rc = kvstash_skip(c, 2);
            }
        }
    }
    if (rc != 0) {
        return kvstash_done(c, rc);
    }
    if (hi->protocol != 0 && hi->protocol != KVSTASH_PROTOCOL) {
        kvstash_errf(c, "server speaks protocol %llu, this client %d",
                     (unsigned long long)hi->protocol, KVSTASH_PROTOCOL);
        return KVSTASH_EUNSUPPORTED;
    }
    if (hi->max_key_size == 0) {
        hi->max_key_size = KVSTASH_DFLT_KEY;
    }
    if (hi->max_value_size == 0) {
        hi->max_value_size = KVSTASH_DFLT_VALUE;
    }
    if (hi->max_batch == 0) {
        hi->max_batch = KVSTASH_DFLT_BATCH;
    }
    if (hi->max_message_size == 0) {
        hi->max_message_size = KVSTASH_DFLT_MESSAGE;
    }
    c->req_target = hi->max_message_size / 2;
    if (c->req_target > KVSTASH_REQ_TARGET) {
        c->req_target = KVSTASH_REQ_TARGET;
    }
    return 0;
}

const char *
kvstash_version(void)
{
    return KVSTASH_VERSION;
}

int
kvstash_connect(const char *addr, struct kvstash **out)
{
    return kvstash_connect_timeout(addr, 0, out);
}

int
kvstash_connect_timeout(const char *addr, int timeout_ms, struct kvstash **out)
{
    struct kvstash *c;
    int rc;

    kvstash_connect_err[0] = '\0';
    if (addr == NULL || out == NULL) {
        snprintf(kvstash_connect_err, sizeof(kvstash_connect_err), "no address");
        return -EINVAL;
    }
    *out = NULL;
    c = calloc(1, sizeof(*c));
    if (c == NULL) {
        snprintf(kvstash_connect_err, sizeof(kvstash_connect_err), "out of memory");
        return -ENOMEM;
    }
    c->fd = -1;
    c->timeout_ms = timeout_ms > 0 ? timeout_ms : 0;
    c->fill_max = KVSTASH_RBUF_SIZE;
    c->rbuf = malloc(KVSTASH_RBUF_SIZE);
    if (c->rbuf == NULL) {
        rc = -ENOMEM;
        goto fail;
    }
    msgpack_packer_init(&c->pk, c, kvstash_pack_write);
    if (strncmp(addr, "unix:", 5) == 0) {
        rc = kvstash_connect_unix(addr + 5, c->timeout_ms, &c->fd);
    } else if (strchr(addr, '/') != NULL) {
        rc = kvstash_connect_unix(addr, c->timeout_ms, &c->fd);
    } else {
        rc = kvstash_connect_tcp(addr, c->timeout_ms, &c->fd);
    }
    if (rc == -EINVAL || rc == -ENAMETOOLONG) {
        kvstash_errf(c, "bad address '%s' (use host:port, [v6]:port or unix:/path)", addr);
    } else if (rc == -ENXIO) {
        kvstash_errf(c, "unknown host");
    }
    if (rc != 0) {
        goto fail;
    }
    rc = kvstash_hello_read(c);
    if (rc != 0) {
        goto fail;
    }
    *out = c;
    return 0;

fail:
    if (c->err[0] != '\0') {
        memcpy(kvstash_connect_err, c->err, sizeof(kvstash_connect_err));
    } else {
        snprintf(kvstash_connect_err, sizeof(kvstash_connect_err), "%s", kv_strerror(rc));
    }
    kvstash_close(c);
    return rc;
}

void
kvstash_close(struct kvstash *c)
{
    if (c == NULL) {
        return;
    }
    if (c->fd >= 0) {
        close(c->fd);
    }
    free(c->wbuf);
    free(c->segs);
    free(c->iov);
    free(c->rbuf);
    free(c);
}

void
kvstash_set_timeout(struct kvstash *c, int timeout_ms)
{
    if (c != NULL) {
        c->timeout_ms = timeout_ms > 0 ? timeout_ms : 0;
    }
}

const char *
kvstash_last_error(const struct kvstash *c)
{
    return c != NULL ? c->err : kvstash_connect_err;
}

const char *
kvstash_strerror(int rc)
{
    return kv_strerror(rc);
}

const struct kvstash_hello *
kvstash_server_info(const struct kvstash *c)
{
    return c != NULL ? &c->hello : NULL;
}

/* ---- single-key calls ---- */

static int
kvstash_key_check(struct kvstash *c, const void *key, size_t klen)
{
    if (key == NULL && klen > 0) {
        kvstash_errf(c, "key is NULL");
        return KVSTASH_EINVAL;
    }
    if (klen > UINT32_MAX) {
        kvstash_errf(c, "key of %zu bytes cannot be sent", klen);
        return KVSTASH_ETOOLARGE;
    }
    return 0;
}

/* kvstash_put_check: refuse locally what the server would refuse as too large. */
static int
kvstash_put_check(struct kvstash *c, const void *key, size_t klen, const void *val, size_t vlen)
{
    const struct kvstash_hello *hi = &c->hello;

    if (val == NULL && vlen > 0) {
        kvstash_errf(c, "value is NULL");
        return KVSTASH_EINVAL;
    }
    int rc = kvstash_key_check(c, key, klen);
    if (rc != 0) {
        return rc;
    }
    if (klen > hi->max_key_size) {
        kvstash_errf(c, "key of %zu bytes exceeds the server's max_key_size %llu", klen,
                     (unsigned long long)hi->max_key_size);
        return KVSTASH_ETOOLARGE;
    }
    if (vlen > hi->max_value_size || vlen > UINT32_MAX ||
        (uint64_t)klen + vlen + KVSTASH_ENVELOPE > hi->max_message_size) {
        kvstash_errf(c, "value of %zu bytes exceeds the server's max_value_size %llu", vlen,
                     (unsigned long long)hi->max_value_size);
        return KVSTASH_ETOOLARGE;
    }
    return 0;
}

/* kvstash_key_call: send method [key (, {force: true})] and read up to its result. */
static int
kvstash_key_call(struct kvstash *c, const char *method, const void *key, size_t klen,
                 bool force, uint64_t budget)
{
    int rc = kvstash_begin(c);

    if (rc == 0) {
        rc = kvstash_key_check(c, key, klen);
    }
    if (rc != 0) {
        return rc;
    }
    kvstash_req_begin(c, method, force ? 2 : 1);
    kvstash_req_key(c, key, klen);
    if (force) {
        kvstash_req_force(c);
    }
    return kvstash_call(c, budget);
}

int
kvstash_ping(struct kvstash *c)
{
    int rc = kvstash_begin(c);

    if (rc != 0) {
        return rc;
    }
    kvstash_req_begin(c, "ping", 0);
    rc = kvstash_call(c, KVSTASH_SMALL_REPLY);
    if (rc != 0) {
        return rc;
    }
    return kvstash_done(c, kvstash_skip(c, 1));
}

int
kvstash_put(struct kvstash *c, const void *key, size_t klen, const void *val, size_t vlen)
{
    int rc = kvstash_begin(c);
    int code = 0;

    if (rc == 0) {
        rc = kvstash_put_check(c, key, klen, val, vlen);
    }
    if (rc != 0) {
        return rc;
    }
    kvstash_req_begin(c, "put", 2);
    kvstash_req_key(c, key, klen);
    kvstash_req_value(c, val, vlen);
    rc = kvstash_call(c, KVSTASH_SMALL_REPLY);
    if (rc != 0) {
        return rc;
    }
    rc = kvstash_read_code(c, &code);
    return rc != 0 ? kvstash_done(c, rc) : code;
}

int
kvstash_batch_put(struct kvstash *c, size_t n, const void *const *keys, const size_t *klens,
                  const void *const *vals, const size_t *vlens, int *codes)
{
    struct kvstash_op op = {
        .method = "batch_put", .res = RES_CODES, .n = n, .keys = keys, .klens = klens,
        .vals = vals, .vlens = vlens, .codes = codes, .skips = true,
    };
    int rc = kvstash_begin(c);

    if (rc != 0) {
        return rc;
    }
    if (n > 0 && (klens == NULL || vals == NULL || vlens == NULL || codes == NULL)) {
        kvstash_errf(c, "batch_put: NULL array");
        return KVSTASH_EINVAL;
    }
    for (size_t i = 0; i < n; i++) {
        /* a key that cannot be stored is answered here and not sent */
        codes[i] = kvstash_put_check(c, keys ? keys[i] : NULL, klens[i], vals[i], vlens[i]);
        if (codes[i] == 0) {
            codes[i] = -1;
        }
    }
    c->err[0] = '\0';
    return kvstash_op_run(c, &op);
}

int
kvstash_get(struct kvstash *c, const void *key, size_t klen, void *buf, size_t cap,
            size_t *vlen)
{
    size_t len = 0;
    int rc;

    if (buf == NULL && cap > 0) {
        return KVSTASH_EINVAL;
    }
    rc = kvstash_key_call(c, "get", key, klen, false, UINT64_MAX);
    if (rc != 0) {
        return rc;
    }
    rc = kvstash_value_read(c, buf, cap, NULL, &len);
    if (vlen != NULL) {
        *vlen = len;
    }
    return kvstash_done(c, rc);
}

int
kvstash_get_alloc(struct kvstash *c, const void *key, size_t klen, void **val, size_t *vlen)
{
    size_t len = 0;
    int rc;

    if (val == NULL) {
        return KVSTASH_EINVAL;
    }
    *val = NULL;
    rc = kvstash_key_call(c, "get", key, klen, false, UINT64_MAX);
    if (rc != 0) {
        return rc;
    }
    rc = kvstash_value_read(c, NULL, 0, val, &len);
    if (vlen != NULL) {
        *vlen = len;
    }
    return kvstash_done(c, rc);
}

int
kvstash_batch_get(struct kvstash *c, size_t n, const void *const *keys, const size_t *klens,
                  void *const *bufs, const size_t *caps, size_t *vlens, int *codes)
{
    struct kvstash_op op = {
        .method = "batch_get", .res = RES_VALUES, .n = n, .keys = keys, .klens = klens,
        .bufs = bufs, .caps = caps, .outlens = vlens, .codes = codes,
    };
    int rc = kvstash_begin(c);

    if (rc != 0) {
        return rc;
    }
    if (n > 0 && (klens == NULL || bufs == NULL || caps == NULL || vlens == NULL ||
                  codes == NULL)) {
        kvstash_errf(c, "batch_get: NULL array");
        return KVSTASH_EINVAL;
    }
    return kvstash_op_run(c, &op);
}

int
kvstash_is_exist(struct kvstash *c, const void *key, size_t klen, bool *exists)
{
    bool v = false;
    int rc = kvstash_key_call(c, "is_exist", key, klen, false, KVSTASH_SMALL_REPLY);

    if (rc != 0) {
        return rc;
    }
    rc = kvstash_read_bool(c, &v);
    if (exists != NULL) {
        *exists = v;
    }
    return kvstash_done(c, rc);
}

int
kvstash_batch_is_exist(struct kvstash *c, size_t n, const void *const *keys,
                       const size_t *klens, bool *exists)
{
    struct kvstash_op op = {
        .method = "batch_is_exist", .res = RES_BOOLS, .n = n, .keys = keys, .klens = klens,
        .exists = exists,
    };
    int rc = kvstash_begin(c);

    if (rc != 0) {
        return rc;
    }
    if (n > 0 && (klens == NULL || exists == NULL)) {
        kvstash_errf(c, "batch_is_exist: NULL array");
        return KVSTASH_EINVAL;
    }
    return kvstash_op_run(c, &op);
}

int
kvstash_prefix_match(struct kvstash *c, size_t n, const void *const *keys,
                     const size_t *klens, uint32_t group_size, uint64_t *matched)
{
    uint64_t g = group_size ? group_size : 1;
    uint64_t total = 0;
    uint64_t chunk;
    int rc = kvstash_begin(c);

    if (rc != 0) {
        return rc;
    }
    if (matched == NULL || (n > 0 && (keys == NULL || klens == NULL))) {
        kvstash_errf(c, "prefix_match: NULL argument");
        return KVSTASH_EINVAL;
    }
    /*
     * More keys than max_batch go as several requests of whole groups, one
     * after the other: the next is asked only when every group of this one
     * matched. A group larger than max_batch is left to the server to judge.
     */
    chunk = c->hello.max_batch / g * g;
    if (chunk == 0) {
        chunk = n;
    }
    for (size_t lo = 0; lo < n || lo == 0;) {
        size_t hi = n - lo > chunk ? lo + (size_t)chunk : n;
        uint64_t bytes = KVSTASH_ENVELOPE;
        uint64_t got = 0;

        for (size_t i = lo; i < hi; i++) {
            bytes += (uint64_t)klens[i] + 5;
            if (bytes > c->req_target && i - lo >= g && (i - lo) % g == 0) {
                hi = i; /* a request of whole groups within the byte target */
                break;
            }
        }
        kvstash_req_begin(c, "prefix_match", group_size > 1 ? 2 : 1);
        msgpack_pack_array(&c->pk, (uint32_t)(hi - lo));
        for (size_t i = lo; i < hi; i++) {
            kvstash_req_key(c, keys[i], klens[i]);
        }
        if (group_size > 1) {
            msgpack_pack_map(&c->pk, 1);
            msgpack_pack_str_with_body(&c->pk, "group_size", 10);
            msgpack_pack_uint32(&c->pk, group_size);
        }
        rc = kvstash_call(c, KVSTASH_SMALL_REPLY);
        if (rc == 0) {
            rc = kvstash_done(c, kvstash_read_uint(c, &got));
        }
        if (rc != 0) {
            return rc;
        }
        total += got;
        if (hi >= n || got < (hi - lo + g - 1) / g) {
            break;
        }
        lo = hi;
    }
    *matched = total;
    return 0;
}

int
kvstash_get_size(struct kvstash *c, const void *key, size_t klen, uint64_t *size)
{
    struct kvstash_head h;
    int rc = kvstash_key_call(c, "get_size", key, klen, false, KVSTASH_SMALL_REPLY);

    if (rc != 0) {
        return rc;
    }
    rc = kvstash_head_read(c, &h);
    if (rc != 0) {
        return kvstash_done(c, rc);
    }
    if (h.type == RD_NIL) {
        return KVSTASH_ENOTFOUND;
    }
    if (h.type != RD_UINT) {
        return kvstash_bad(c, "size is neither an integer nor nil");
    }
    if (size != NULL) {
        *size = h.u;
    }
    return 0;
}

int
kvstash_remove(struct kvstash *c, const void *key, size_t klen, bool force)
{
    int code = 0;
    int rc = kvstash_key_call(c, "remove", key, klen, force, KVSTASH_SMALL_REPLY);

    if (rc != 0) {
        return rc;
    }
    rc = kvstash_read_code(c, &code);
    return rc != 0 ? kvstash_done(c, rc) : code;
}

int
kvstash_batch_remove(struct kvstash *c, size_t n, const void *const *keys,
                     const size_t *klens, bool force, int *codes)
{
    struct kvstash_op op = {
        .method = "batch_remove", .res = RES_CODES, .n = n, .keys = keys, .klens = klens,
        .codes = codes, .force = force,
    };
    int rc = kvstash_begin(c);

    if (rc != 0) {
        return rc;
    }
    if (n > 0 && (klens == NULL || codes == NULL)) {
        kvstash_errf(c, "batch_remove: NULL array");
        return KVSTASH_EINVAL;
    }
    return kvstash_op_run(c, &op);
}

int
kvstash_remove_all(struct kvstash *c, bool force, uint64_t *removed)
{
    uint64_t v = 0;
    int rc = kvstash_begin(c);

    if (rc != 0) {
        return rc;
    }
    kvstash_req_begin(c, "remove_all", force ? 1 : 0);
    if (force) {
        kvstash_req_force(c);
    }
    rc = kvstash_call(c, KVSTASH_SMALL_REPLY);
    if (rc != 0) {
        return rc;
    }
    rc = kvstash_read_uint(c, &v);
    if (removed != NULL) {
        *removed = v;
    }
    return kvstash_done(c, rc);
}

int
kvstash_pin(struct kvstash *c, size_t n, const void *const *keys, const size_t *klens,
            const char *mode, int *codes)
{
    struct kvstash_op op = {
        .method = "pin", .res = RES_CODES, .n = n, .keys = keys, .klens = klens,
        .codes = codes, .mode = mode,
    };
    int rc = kvstash_begin(c);

    if (rc != 0) {
        return rc;
    }
    if (mode == NULL || (n > 0 && (klens == NULL || codes == NULL))) {
        kvstash_errf(c, "pin: NULL argument");
        return KVSTASH_EINVAL;
    }
    return kvstash_op_run(c, &op);
}

int
kvstash_unpin(struct kvstash *c, size_t n, const void *const *keys, const size_t *klens,
              int *codes)
{
    struct kvstash_op op = {
        .method = "unpin", .res = RES_CODES, .n = n, .keys = keys, .klens = klens,
        .codes = codes,
    };
    int rc = kvstash_begin(c);

    if (rc != 0) {
        return rc;
    }
    if (n > 0 && (klens == NULL || codes == NULL)) {
        kvstash_errf(c, "unpin: NULL array");
        return KVSTASH_EINVAL;
    }
    return kvstash_op_run(c, &op);
}

int
kvstash_stats(struct kvstash *c, struct kvstash_stat **items, size_t *n)
{
    struct kvstash_head h;
    struct kvstash_stat *v = NULL;
    size_t cnt = 0, cap = 0;
    int rc;

    if (items == NULL || n == NULL) {
        return KVSTASH_EINVAL;
    }
    *items = NULL;
    *n = 0;
    rc = kvstash_begin(c);
    if (rc != 0) {
        return rc;
    }
    kvstash_req_begin(c, "stats", 0);
    rc = kvstash_call(c, KVSTASH_STATS_REPLY);
    if (rc != 0) {
        return rc;
    }
    rc = kvstash_head_read(c, &h);
    if (rc == 0 && h.type != RD_MAP) {
        rc = kvstash_bad(c, "stats result is not a map");
    }
    for (uint64_t i = 0; rc == 0 && i < h.len; i++) {
        struct kvstash_head k, val;
        struct kvstash_stat st;

        rc = kvstash_head_read(c, &k);
        if (rc == 0 && k.type != RD_STR && k.type != RD_BIN) {
            rc = kvstash_bad(c, "stats name is not a string");
        }
        if (rc == 0) {
            rc = kvstash_str_copy(c, k.len, st.name, sizeof(st.name));
        }
        if (rc == 0) {
            rc = kvstash_head_read(c, &val);
        }
        if (rc != 0) {
            break;
        }
        if (val.type != RD_UINT) {
            /* not a counter: leave it out */
            if (val.type == RD_STR || val.type == RD_BIN || val.type == RD_EXT) {
                rc = kvstash_body(c, NULL, val.len);
            } else if (val.type == RD_ARRAY || val.type == RD_MAP) {
                for (uint64_t j = 0; rc == 0 && j < (val.type == RD_MAP ? 2 : 1) * val.len;
                     j++) {
                    rc = kvstash_skip(c, 2);
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
        return kvstash_done(c, rc);
    }
    *items = v;
    *n = cnt;
    return 0;
}

uint64_t
kvstash_stat_get(const struct kvstash_stat *items, size_t n, const char *name, uint64_t dflt)
{
    for (size_t i = 0; items != NULL && name != NULL && i < n; i++) {
        if (strcmp(items[i].name, name) == 0) {
            return items[i].value;
        }
    }
    return dflt;
}
