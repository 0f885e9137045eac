/*
 * kvstash: libkvstash, the blocking C client of kvstashd: its public API.
 *
 * This module owns what kvstash.h promises, but for registering buffers
 * (kvstash_buffer.c), RDMA (kvstash_rdma.c) and asynchronous batches
 * (kvstash_async.c): connecting (the hello exchange, the server's limits,
 * with defaults for any it leaves out), closing, the argument checks and
 * result conventions of every call, and the batching and pipelining policy.
 * It must not touch the socket or a msgpack byte: connecting the socket and
 * building and sending requests are kvstash_wire.c's, decoding replies is
 * kvstash_reply.c's (struct kvstash is defined in kvstash_wire.h). It keeps
 * no global state but the thread's last connect error, and starts no
 * thread.
 *
 * Batch calls split the keys into requests of at most max_batch keys, about
 * min(max_message_size / 2, KVSTASH_REQ_TARGET) bytes and KVSTASH_REQ_PIECES
 * shared-memory pieces (the daemon refuses a request with more as a whole;
 * SPEC.md does not name that limit yet) and keep up to KVSTASH_WINDOW of
 * them in flight. When replies are large (batch_get) the
 * request bytes in flight are also capped, so that a server that stops
 * reading while its output is full can never wait on a client blocked in
 * send (the classic pipelining deadlock).
 *
 * Registered buffers (shared memory, or RDMA memory) are kvstash_buffer.c's,
 * on their connection's list, so that closing the connection releases them.
 * Transfers through them are ordinary batch calls, here, whose requests
 * carry pieces [id, offset, length] instead of values.
 */
#include "kvstash.h"

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "kverr.h"
#include "kvstash_int.h"

/*
 * kvstash.h repeats kverr.h's codes, the one status enum, so that the public
 * header stands alone: the two must never drift apart.
 */
#define KVSTASH_SAME_CODE(pub, kv) _Static_assert((int)KVSTASH_##pub == (int)KV_##kv, #pub " is not KV_" #kv)
KVSTASH_SAME_CODE(OK, OK);
KVSTASH_SAME_CODE(ENOTFOUND, NOT_FOUND);
KVSTASH_SAME_CODE(EEXISTS, EXISTS);
KVSTASH_SAME_CODE(EBUSY, BUSY);
KVSTASH_SAME_CODE(ENOSPACE, NO_SPACE);
KVSTASH_SAME_CODE(ETOOLARGE, TOO_LARGE);
KVSTASH_SAME_CODE(EINVAL, INVALID_ARGUMENT);
KVSTASH_SAME_CODE(ENOMETHOD, METHOD_NOT_FOUND);
KVSTASH_SAME_CODE(EPROTO, PROTOCOL_ERROR);
KVSTASH_SAME_CODE(EUNAUTHORIZED, UNAUTHORIZED);
KVSTASH_SAME_CODE(EFORBIDDEN, FORBIDDEN);
KVSTASH_SAME_CODE(EQUOTA, QUOTA_EXCEEDED);
KVSTASH_SAME_CODE(ECHECKSUM, CHECKSUM_MISMATCH);
KVSTASH_SAME_CODE(ETIMEOUT, TIMEOUT);
KVSTASH_SAME_CODE(EUNAVAILABLE, UNAVAILABLE);
KVSTASH_SAME_CODE(EUNSUPPORTED, UNSUPPORTED);
KVSTASH_SAME_CODE(EINTERNAL, INTERNAL);
_Static_assert((int)KVSTASH_EINTERNAL == (int)KV_CODE_MAX, "kverr.h has a code kvstash.h lacks");
#include "kvstash_wire.h"
#include "version.h"

#define KVSTASH_REQ_TARGET (32u << 20)   /* request bytes aimed at when splitting */
#define KVSTASH_WINDOW 8                 /* requests in flight per batch call */
#define KVSTASH_READ_AHEAD (128u * 1024) /* request bytes in flight when replies are big */
#define KVSTASH_STATS_REPLY (16u << 20)  /* budget of a stats reply */
#define KVSTASH_ITEM_MAX 9               /* wire bytes of an int, bool or nil */
#define KVSTASH_ENVELOPE 64              /* request bytes besides keys and values */
#define KVSTASH_PIECE_MAX 28             /* wire bytes of a piece [id, offset, length] */
#define KVSTASH_REQ_PIECES 65536u        /* pieces per request the daemon takes at most */
#define KVSTASH_UNSENT INT64_MIN         /* results[i] of a get_into key still to send */

/* Server limits assumed when hello leaves one out (the daemon's defaults). */
#define KVSTASH_DFLT_KEY (1u << 10)
#define KVSTASH_DFLT_VALUE (256u << 20)
#define KVSTASH_DFLT_BATCH 16384u
#define KVSTASH_DFLT_MESSAGE (1u << 30)

/* Why this thread's last kvstash_connect failed: there is no object to ask. */
static _Thread_local char kvstash_connect_err[KVSTASH_WIRE_ERRLEN];

enum kvstash_res { RES_CODES, RES_VALUES, RES_BOOLS, RES_INTS };

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
    const struct kvstash_piece *const *pieces; /* put_from, get_into: iovs */
    const size_t *npieces;
    int *codes;                   /* RES_CODES, RES_VALUES */
    bool *exists;                 /* RES_BOOLS */
    int64_t *results;             /* RES_INTS */
    const char *mode;             /* pin: the mode parameter */
    bool force;                   /* remove: opts {force: true} */
    bool skips;                   /* key i is not sent when, before the call, codes[i] >= 0 */
                                  /* (RES_INTS: results[i] != KVSTASH_UNSENT) */
};

/* Keys [lo, hi) of a batch call that one request carries (minus skipped ones). */
struct kvstash_range {
    size_t lo;
    size_t hi;
    size_t nkeys;
    uint64_t wire;                /* request bytes */
};

int
kvstash_begin(struct kvstash *c)
{
    if (c == NULL) {
        return -EINVAL;
    }
    if (c->broken) {
        kvstash_wire_errf(c, "connection is broken by an earlier error; reconnect");
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

int
kvstash_done(struct kvstash *c, int rc)
{
    return rc < 0 ? kvstash_wire_fail(c, rc) : rc;
}

int
kvstash_sys_fail(struct kvstash *c, const char *call, int err)
{
    kvstash_wire_errf(c, "%s: %s", call, kv_strerror(-err));
    return -err;
}

/* ---- batch engine ---- */

static bool
kvstash_op_skipped(const struct kvstash_op *op, size_t i)
{
    if (!op->skips) {
        return false;
    }
    return op->res == RES_INTS ? op->results[i] != KVSTASH_UNSENT : op->codes[i] >= 0;
}

/* kvstash_pieces_total: the bytes pieces[0..np) cover (saturating). */
static uint64_t
kvstash_pieces_total(const struct kvstash_piece *p, size_t np)
{
    uint64_t total = 0;

    for (size_t j = 0; j < np; j++) {
        total = kvstash_sat_add(total, p[j].length);
    }
    return total;
}

static uint64_t
kvstash_op_cost(const struct kvstash *c, const struct kvstash_op *op, size_t i, uint64_t *wire)
{
    uint64_t w = (uint64_t)op->klens[i] + 5;
    uint64_t cost;

    if (op->vals != NULL) {
        w += (uint64_t)op->vlens[i] + 5;
    }
    if (op->pieces != NULL) {
        w = kvstash_sat_add(w, kvstash_sat_mul(op->npieces[i], KVSTASH_PIECE_MAX) + 5);
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
    uint64_t pieces = 0;
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
        uint64_t np = op->pieces != NULL ? op->npieces[i] : 0;
        if (r->nkeys > 0 && (r->nkeys >= c->hello.max_batch ||
                             kvstash_sat_add(bytes, cost) > c->req_target ||
                             pieces + np > KVSTASH_REQ_PIECES)) {
            break;
        }
        pieces += np;
        r->nkeys++;
        bytes = kvstash_sat_add(bytes, cost);
        r->wire = kvstash_sat_add(r->wire, wire);
    }
    r->hi = i;
}

static int
kvstash_op_send(struct kvstash *c, const struct kvstash_op *op, const struct kvstash_range *r)
{
    uint32_t nparams =
        1 + (op->vals != NULL) + (op->pieces != NULL) + (op->mode != NULL) + op->force;

    kvstash_wire_req_begin(c, op->method, nparams);
    kvstash_wire_req_array(c, (uint32_t)r->nkeys);
    for (size_t i = r->lo; i < r->hi; i++) {
        if (!kvstash_op_skipped(op, i)) {
            kvstash_wire_req_key(c, op->keys[i], op->klens[i]);
        }
    }
    if (op->vals != NULL) {
        kvstash_wire_req_array(c, (uint32_t)r->nkeys);
        for (size_t i = r->lo; i < r->hi; i++) {
            if (!kvstash_op_skipped(op, i)) {
                kvstash_wire_req_value(c, op->vals[i], op->vlens[i]);
            }
        }
    }
    if (op->pieces != NULL) {
        kvstash_wire_req_array(c, (uint32_t)r->nkeys);
        for (size_t i = r->lo; i < r->hi; i++) {
            if (kvstash_op_skipped(op, i)) {
                continue;
            }
            kvstash_wire_req_array(c, (uint32_t)op->npieces[i]);
            for (size_t j = 0; j < op->npieces[i]; j++) {
                const struct kvstash_piece *p = &op->pieces[i][j];
                kvstash_wire_req_array(c, 3);
                kvstash_wire_req_uint(c, p->buf->id);
                kvstash_wire_req_uint(c, p->offset);
                kvstash_wire_req_uint(c, p->length);
            }
        }
    }
    if (op->mode != NULL) {
        kvstash_wire_req_str(c, op->mode);
    }
    if (op->force) {
        kvstash_wire_req_force(c);
    }
    return kvstash_wire_req_send(c);
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
        case RES_INTS:
            op->results[i] = -(int64_t)code;
            break;
        }
    }
}

/*
 * kvstash_op_read_int: one get_into result: bytes written, never more than
 * the pieces hold, or minus a code. Anything else is a malformed reply.
 */
static int
kvstash_op_read_int(struct kvstash *c, const struct kvstash_op *op, size_t i)
{
    uint64_t total = kvstash_pieces_total(op->pieces[i], op->npieces[i]);
    int64_t v;
    int rc = kvstash_wire_read_int(c, &v);

    if (rc != 0) {
        return rc;
    }
    if (v >= 0 ? (uint64_t)v > total : v < -(int64_t)INT_MAX) {
        kvstash_wire_errf(c, "malformed reply from server: get_into result %lld for pieces "
                          "of %llu bytes", (long long)v, (unsigned long long)total);
        return -EPROTO;
    }
    op->results[i] = v;
    return 0;
}

static int
kvstash_op_read(struct kvstash *c, const struct kvstash_op *op, const struct kvstash_range *r)
{
    uint64_t per = op->res == RES_VALUES ? (uint64_t)UINT32_MAX + 5 : KVSTASH_ITEM_MAX;
    uint64_t budget = kvstash_sat_add(kvstash_sat_mul(per, r->nkeys),
                                      KVSTASH_WIRE_NOTICE_MAX + KVSTASH_WIRE_SMALL_REPLY);
    int rc = kvstash_wire_reply(c, budget);

    if (rc != 0) {
        return rc;
    }
    rc = kvstash_wire_read_array(c, r->nkeys);
    for (size_t i = r->lo; rc == 0 && i < r->hi; i++) {
        if (kvstash_op_skipped(op, i)) {
            continue;
        }
        switch (op->res) {
        case RES_CODES:
            rc = kvstash_wire_read_code(c, &op->codes[i]);
            break;
        case RES_BOOLS:
            rc = kvstash_wire_read_bool(c, &op->exists[i]);
            break;
        case RES_INTS:
            rc = kvstash_op_read_int(c, op, i);
            break;
        case RES_VALUES:
            rc = kvstash_wire_read_value(c, op->bufs[i], op->caps[i], NULL, &op->outlens[i]);
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
/*
 * kvstash_null_key: the index of the first key of n that is NULL with a
 * length (an empty key may be NULL), or n. skip(i) true: key i is not sent.
 */
static size_t
kvstash_null_key(size_t n, const void *const *keys, const size_t *klens,
                 const struct kvstash_op *op)
{
    for (size_t i = 0; i < n; i++) {
        if (keys[i] == NULL && klens[i] != 0 && (op == NULL || !kvstash_op_skipped(op, i))) {
            return i;
        }
    }
    return n;
}

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

    if (op->n > 0 && (op->keys == NULL || op->klens == NULL)) {
        kvstash_wire_errf(c, op->keys == NULL ? "keys is NULL" : "klens is NULL");
        kvstash_op_fail(op, 0, op->n, KVSTASH_EINVAL);
        return KVSTASH_EINVAL;
    }
    size_t bad = kvstash_null_key(op->n, op->keys, op->klens, op);
    if (bad < op->n) {
        /* nothing sent: every key gets the code, as for a refused request */
        kvstash_wire_errf(c, "key %zu is NULL with length %zu", bad, op->klens[bad]);
        kvstash_op_fail(op, 0, op->n, KVSTASH_EINVAL);
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
                return head == tail ? rc : kvstash_wire_fail(c, rc);
            }
            if (rc < 0) {
                return kvstash_wire_salvage(c, rc);
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
            return kvstash_wire_fail(c, rc);
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

static int
kvstash_hello_read(struct kvstash *c)
{
    struct kvstash_hello *hi = &c->hello;
    int rc;

    kvstash_wire_req_begin(c, "hello", 0);
    rc = kvstash_wire_call(c, KVSTASH_WIRE_SMALL_REPLY);
    if (rc != 0) {
        return rc;
    }
    rc = kvstash_wire_read_hello(c, hi);
    if (rc != 0) {
        return kvstash_done(c, rc);
    }
    if (hi->protocol != 0 && hi->protocol != KVSTASH_PROTOCOL) {
        kvstash_wire_errf(c, "server speaks protocol %llu, this client %d",
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
    return kvstash_connect_tls(addr, NULL, timeout_ms, out);
}

int
kvstash_connect_tls(const char *addr, const struct kvstash_tls *tls, int timeout_ms,
                    struct kvstash **out)
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
    c->timeout_ms = timeout_ms > 0 ? timeout_ms : 0;
    rc = kvstash_wire_init(c);
    if (rc != 0) {
        goto fail;
    }
    rc = kvstash_wire_connect(c, addr);
    if (rc == 0 && tls != NULL) {
        rc = c->is_unix ? -EINVAL : kvstash_wire_tls_start(c, addr, tls);
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
    /*
     * The socket first: the daemon stops using our memory and tears down its side;
     * then our queue pair, then the memory it could reach, then the device.
     */
    kvstash_wire_deinit(c);
    kvstash_rdma_close(c, false);
    while (c->bufs != NULL) {
        kvstash_buffer_release(c, c->bufs);
    }
    if (c->arena != NULL) {
        munmap(c->arena, (size_t)c->arena_size);
    }
    kvstash_rdma_close(c, true);
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
        kvstash_wire_errf(c, "key is NULL");
        return KVSTASH_EINVAL;
    }
    if (klen > UINT32_MAX) {
        kvstash_wire_errf(c, "key of %zu bytes cannot be sent", klen);
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
        kvstash_wire_errf(c, "value is NULL");
        return KVSTASH_EINVAL;
    }
    int rc = kvstash_key_check(c, key, klen);
    if (rc != 0) {
        return rc;
    }
    if (klen > hi->max_key_size) {
        kvstash_wire_errf(c, "key of %zu bytes exceeds the server's max_key_size %llu", klen,
                     (unsigned long long)hi->max_key_size);
        return KVSTASH_ETOOLARGE;
    }
    if (vlen > hi->max_value_size || vlen > UINT32_MAX ||
        (uint64_t)klen + vlen + KVSTASH_ENVELOPE > hi->max_message_size) {
        kvstash_wire_errf(c, "value of %zu bytes exceeds the server's max_value_size %llu", vlen,
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
    kvstash_wire_req_begin(c, method, force ? 2 : 1);
    kvstash_wire_req_key(c, key, klen);
    if (force) {
        kvstash_wire_req_force(c);
    }
    return kvstash_wire_call(c, budget);
}

int
kvstash_ping(struct kvstash *c)
{
    int rc = kvstash_begin(c);

    if (rc != 0) {
        return rc;
    }
    kvstash_wire_req_begin(c, "ping", 0);
    rc = kvstash_wire_call(c, KVSTASH_WIRE_SMALL_REPLY);
    if (rc != 0) {
        return rc;
    }
    return kvstash_done(c, kvstash_wire_skip(c));
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
    kvstash_wire_req_begin(c, "put", 2);
    kvstash_wire_req_key(c, key, klen);
    kvstash_wire_req_value(c, val, vlen);
    rc = kvstash_wire_call(c, KVSTASH_WIRE_SMALL_REPLY);
    if (rc != 0) {
        return rc;
    }
    rc = kvstash_wire_read_code(c, &code);
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
        kvstash_wire_errf(c, "batch_put: NULL array");
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
    rc = kvstash_wire_read_value(c, buf, cap, NULL, &len);
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
    rc = kvstash_wire_read_value(c, NULL, 0, val, &len);
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
        kvstash_wire_errf(c, "batch_get: NULL array");
        return KVSTASH_EINVAL;
    }
    return kvstash_op_run(c, &op);
}

int
kvstash_is_exist(struct kvstash *c, const void *key, size_t klen, bool *exists)
{
    bool v = false;
    int rc = kvstash_key_call(c, "is_exist", key, klen, false, KVSTASH_WIRE_SMALL_REPLY);

    if (rc != 0) {
        return rc;
    }
    rc = kvstash_wire_read_bool(c, &v);
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
        kvstash_wire_errf(c, "batch_is_exist: NULL array");
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
        kvstash_wire_errf(c, "prefix_match: NULL argument");
        return KVSTASH_EINVAL;
    }
    size_t bad = kvstash_null_key(n, keys, klens, NULL);
    if (bad < n) {
        kvstash_wire_errf(c, "prefix_match: key %zu is NULL with length %zu", bad, klens[bad]);
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
        kvstash_wire_req_begin(c, "prefix_match", group_size > 1 ? 2 : 1);
        kvstash_wire_req_array(c, (uint32_t)(hi - lo));
        for (size_t i = lo; i < hi; i++) {
            kvstash_wire_req_key(c, keys[i], klens[i]);
        }
        if (group_size > 1) {
            kvstash_wire_req_group_size(c, group_size);
        }
        rc = kvstash_wire_call(c, KVSTASH_WIRE_SMALL_REPLY);
        if (rc == 0) {
            rc = kvstash_done(c, kvstash_wire_read_uint(c, &got));
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
    uint64_t v = 0;
    int rc = kvstash_key_call(c, "get_size", key, klen, false, KVSTASH_WIRE_SMALL_REPLY);

    if (rc != 0) {
        return rc;
    }
    rc = kvstash_wire_read_size(c, &v);
    if (rc == 0 && size != NULL) {
        *size = v;
    }
    return kvstash_done(c, rc);
}

int
kvstash_remove(struct kvstash *c, const void *key, size_t klen, bool force)
{
    int code = 0;
    int rc = kvstash_key_call(c, "remove", key, klen, force, KVSTASH_WIRE_SMALL_REPLY);

    if (rc != 0) {
        return rc;
    }
    rc = kvstash_wire_read_code(c, &code);
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
        kvstash_wire_errf(c, "batch_remove: NULL array");
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
    kvstash_wire_req_begin(c, "remove_all", force ? 1 : 0);
    if (force) {
        kvstash_wire_req_force(c);
    }
    rc = kvstash_wire_call(c, KVSTASH_WIRE_SMALL_REPLY);
    if (rc != 0) {
        return rc;
    }
    rc = kvstash_wire_read_uint(c, &v);
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
        kvstash_wire_errf(c, "pin: NULL argument");
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
        kvstash_wire_errf(c, "unpin: NULL array");
        return KVSTASH_EINVAL;
    }
    return kvstash_op_run(c, &op);
}

/* ---- direct access to the daemon's memory ---- */

int
kvstash_map_arena(struct kvstash *c, void **base, size_t *size)
{
    uint64_t seg = UINT64_MAX, len = 0;
    int fd, rc = kvstash_begin(c);

    if (rc != 0) {
        return rc;
    }
    if (c->rdma != NULL) {
        /* the daemon answers such a connection with RDMA descriptors, not arena offsets */
        kvstash_wire_errf(c, "direct access through the arena: this connection uses RDMA");
        return KVSTASH_EINVAL;
    }
    if (c->arena == NULL) {
        if (!c->is_unix) {
            kvstash_wire_errf(c, "direct access needs a Unix-socket connection");
            return KVSTASH_EUNSUPPORTED;
        }
        kvstash_wire_req_begin(c, "map_segment", 1);
        kvstash_wire_req_uint(c, 0);
        rc = kvstash_wire_call(c, KVSTASH_WIRE_SMALL_REPLY);
        if (rc != 0) {
            return rc;
        }
        rc = kvstash_wire_read_segment(c, &seg, &len);
        fd = kvstash_wire_take_fd(c);
        if (rc == 0 && (fd < 0 || seg != 0 || len == 0 || len > SIZE_MAX)) {
            kvstash_wire_errf(c, "map_segment: %s", fd < 0 ? "no descriptor came with the reply"
                                                           : "unexpected segment or size");
            rc = -EPROTO;
        }
        if (rc == 0) {
            void *p = mmap(NULL, (size_t)len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);

            if (p == MAP_FAILED) {
                rc = kvstash_sys_fail(c, "mmap of the arena", errno);
            } else {
                c->arena = p;
                c->arena_size = len;
            }
        }
        if (fd >= 0) {
            close(fd);
        }
        if (rc != 0) {
            return rc == -EPROTO ? kvstash_done(c, rc) : rc;
        }
    }
    if (base != NULL) {
        *base = c->arena;
    }
    if (size != NULL) {
        *size = (size_t)c->arena_size;
    }
    return 0;
}

/* kvstash_places: pieces as offsets into the arena to pointers into this mapping. */
static void
kvstash_places(const struct kvstash *c, const struct kvstash_wire_piece *w, size_t n,
               struct kvstash_place *places, size_t *nplaces)
{
    for (size_t i = 0; i < n; i++) {
        places[i].ptr = c->arena + w[i].offset;
        places[i].length = (size_t)w[i].length;
    }
    *nplaces = n;
}

int
kvstash_put_start(struct kvstash *c, const void *key, size_t klen, size_t size,
                  struct kvstash_place *places, size_t *nplaces)
{
    struct kvstash_wire_piece w[KVSTASH_MAX_PLACES];
    size_t n = 0;
    int rc = kvstash_map_arena(c, NULL, NULL);

    if (rc == 0) {
        rc = kvstash_key_check(c, key, klen);
    }
    if (rc == 0 && (places == NULL || nplaces == NULL)) {
        kvstash_wire_errf(c, "put_start: NULL argument");
        rc = KVSTASH_EINVAL;
    }
    if (rc != 0) {
        return rc;
    }
    kvstash_wire_req_begin(c, "put_start", 2);
    kvstash_wire_req_array(c, 1);
    kvstash_wire_req_key(c, key, klen);
    kvstash_wire_req_array(c, 1);
    kvstash_wire_req_uint(c, size);
    rc = kvstash_wire_call(c, KVSTASH_WIRE_SMALL_REPLY);
    if (rc != 0) {
        return rc;
    }
    rc = kvstash_wire_read_array(c, 1);
    if (rc == 0) {
        rc = kvstash_wire_read_places(c, c->arena_size, w, KVSTASH_MAX_PLACES, &n);
    }
    if (rc == 0) {
        kvstash_places(c, w, n, places, nplaces);
    }
    return kvstash_done(c, rc);
}

/* kvstash_put_finish: put_end or put_revoke of n keys. */
static int
kvstash_put_finish(struct kvstash *c, const char *method, size_t n, const void *const *keys,
                   const size_t *klens, int *codes)
{
    struct kvstash_op op = {
        .method = method, .res = RES_CODES, .n = n, .keys = keys, .klens = klens,
        .codes = codes,
    };
    int rc = kvstash_begin(c);

    if (rc != 0) {
        return rc;
    }
    if (n > 0 && (klens == NULL || codes == NULL)) {
        kvstash_wire_errf(c, "%s: NULL array", method);
        return KVSTASH_EINVAL;
    }
    return kvstash_op_run(c, &op);
}

int
kvstash_batch_put_end(struct kvstash *c, size_t n, const void *const *keys, const size_t *klens,
                      int *codes)
{
    return kvstash_put_finish(c, "put_end", n, keys, klens, codes);
}

int
kvstash_batch_put_revoke(struct kvstash *c, size_t n, const void *const *keys,
                         const size_t *klens, int *codes)
{
    return kvstash_put_finish(c, "put_revoke", n, keys, klens, codes);
}

int
kvstash_get_replica(struct kvstash *c, const void *key, size_t klen,
                    struct kvstash_place *places, size_t *nplaces, uint64_t *size,
                    uint64_t *lease_ms)
{
    struct kvstash_wire_piece w[KVSTASH_MAX_PLACES];
    uint64_t sz = 0, lease = 0;
    size_t n = 0;
    int rc = kvstash_map_arena(c, NULL, NULL);

    if (rc == 0) {
        rc = kvstash_key_check(c, key, klen);
    }
    if (rc == 0 && (places == NULL || nplaces == NULL)) {
        kvstash_wire_errf(c, "get_replica: NULL argument");
        rc = KVSTASH_EINVAL;
    }
    if (rc != 0) {
        return rc;
    }
    kvstash_wire_req_begin(c, "get_replica_list", 1);
    kvstash_wire_req_array(c, 1);
    kvstash_wire_req_key(c, key, klen);
    rc = kvstash_wire_call(c, KVSTASH_WIRE_SMALL_REPLY);
    if (rc != 0) {
        return rc;
    }
    rc = kvstash_wire_read_array(c, 1);
    if (rc == 0) {
        rc = kvstash_wire_read_replica(c, c->arena_size, w, KVSTASH_MAX_PLACES, &n, &sz, &lease);
    }
    if (rc == 0) {
        kvstash_places(c, w, n, places, nplaces);
        if (size != NULL) {
            *size = sz;
        }
        if (lease_ms != NULL) {
            *lease_ms = lease;
        }
    }
    return kvstash_done(c, rc);
}

/*
 * kvstash_iov_check: key and pieces can be sent: 0, KVSTASH_EINVAL (a NULL
 * key, a bad piece) or KVSTASH_ETOOLARGE (not sendable in one request);
 * *total gets the bytes the pieces cover.
 */
static int
kvstash_iov_check(struct kvstash *c, const void *key, size_t klen,
                  const struct kvstash_piece *p, size_t np, uint64_t *total)
{
    int rc = kvstash_key_check(c, key, klen);

    if (rc != 0) {
        return rc;
    }
    if (p == NULL && np > 0) {
        kvstash_wire_errf(c, "pieces is NULL");
        return KVSTASH_EINVAL;
    }
    for (size_t j = 0; j < np; j++) {
        const struct kvstash_buffer *b = p[j].buf;
        if (b == NULL || b->conn != c) {
            kvstash_wire_errf(c, "piece %zu: buffer not registered on this connection", j);
            return KVSTASH_EINVAL;
        }
        if (p[j].offset > b->size || p[j].length > b->size - p[j].offset) {
            kvstash_wire_errf(c, "piece %zu: [%llu, +%llu) is outside its buffer of %zu bytes",
                              j, (unsigned long long)p[j].offset,
                              (unsigned long long)p[j].length, b->size);
            return KVSTASH_EINVAL;
        }
    }
    uint64_t wire = kvstash_sat_add(kvstash_sat_mul(np, KVSTASH_PIECE_MAX),
                                    (uint64_t)klen + 10 + KVSTASH_ENVELOPE);
    if (np > KVSTASH_REQ_PIECES || wire > c->hello.max_message_size) {
        kvstash_wire_errf(c, "%zu pieces do not fit in one request", np);
        return KVSTASH_ETOOLARGE;
    }
    *total = kvstash_pieces_total(p, np);
    return 0;
}

int
kvstash_batch_put_from(struct kvstash *c, size_t n, const void *const *keys,
                       const size_t *klens, const struct kvstash_piece *const *pieces,
                       const size_t *npieces, int *codes)
{
    struct kvstash_op op = {
        .method = "batch_put_from", .res = RES_CODES, .n = n, .keys = keys, .klens = klens,
        .pieces = pieces, .npieces = npieces, .codes = codes, .skips = true,
    };
    const struct kvstash_hello *hi;
    int rc = kvstash_begin(c);

    if (rc != 0) {
        return rc;
    }
    if (n > 0 && (klens == NULL || pieces == NULL || npieces == NULL || codes == NULL)) {
        kvstash_wire_errf(c, "batch_put_from: NULL array");
        return KVSTASH_EINVAL;
    }
    hi = &c->hello;
    for (size_t i = 0; i < n; i++) {
        /* a key that cannot be stored is answered here and not sent */
        uint64_t total = 0;
        codes[i] = kvstash_iov_check(c, keys ? keys[i] : NULL, klens[i], pieces[i], npieces[i],
                                     &total);
        if (codes[i] == 0 && (klens[i] > hi->max_key_size || total > hi->max_value_size)) {
            codes[i] = KVSTASH_ETOOLARGE;
        }
        if (codes[i] == 0) {
            codes[i] = -1;
        }
    }
    c->err[0] = '\0';
    return kvstash_op_run(c, &op);
}

int
kvstash_batch_get_into(struct kvstash *c, size_t n, const void *const *keys,
                       const size_t *klens, const struct kvstash_piece *const *pieces,
                       const size_t *npieces, int64_t *results)
{
    struct kvstash_op op = {
        .method = "batch_get_into", .res = RES_INTS, .n = n, .keys = keys, .klens = klens,
        .pieces = pieces, .npieces = npieces, .results = results, .skips = true,
    };
    int rc = kvstash_begin(c);

    if (rc != 0) {
        return rc;
    }
    if (n > 0 && (klens == NULL || pieces == NULL || npieces == NULL || results == NULL)) {
        kvstash_wire_errf(c, "batch_get_into: NULL array");
        return KVSTASH_EINVAL;
    }
    for (size_t i = 0; i < n; i++) {
        /* a key that cannot be sent is answered here */
        uint64_t total = 0;
        int code = kvstash_iov_check(c, keys ? keys[i] : NULL, klens[i], pieces[i], npieces[i],
                                     &total);
        results[i] = code != 0 ? -(int64_t)code : KVSTASH_UNSENT;
    }
    c->err[0] = '\0';
    return kvstash_op_run(c, &op);
}

int
kvstash_stats(struct kvstash *c, struct kvstash_stat **items, size_t *n)
{
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
    kvstash_wire_req_begin(c, "stats", 0);
    rc = kvstash_wire_call(c, KVSTASH_STATS_REPLY);
    if (rc != 0) {
        return rc;
    }
    rc = kvstash_wire_read_stats(c, items, n);
    return kvstash_done(c, rc);
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

void
kvstash_cluster_free(struct kvstash_cluster *ci)
{
    if (ci != NULL) {
        free(ci->nodes);
        free(ci->owners);
        free(ci->nowners);
        free(ci);
    }
}

int
kvstash_cluster_info(struct kvstash *c, const void *const *keys, const size_t *klens, size_t n,
                     struct kvstash_cluster **out)
{
    struct kvstash_cluster *ci;
    int rc;

    if (out == NULL || (n > 0 && (keys == NULL || klens == NULL)) || n > UINT32_MAX) {
        return KVSTASH_EINVAL;
    }
    *out = NULL;
    rc = kvstash_begin(c);
    if (rc != 0) {
        return rc;
    }
    ci = calloc(1, sizeof(*ci));
    if (ci == NULL) {
        return kvstash_done(c, -ENOMEM);
    }
    ci->self = -1;
    kvstash_wire_req_begin(c, "cluster_info", n > 0 ? 1 : 0);
    if (n > 0) {
        kvstash_wire_req_array(c, (uint32_t)n);
        for (size_t i = 0; i < n; i++) {
            kvstash_wire_req_key(c, keys[i], klens[i]);
        }
    }
    rc = kvstash_wire_call(c, KVSTASH_STATS_REPLY);
    if (rc == 0) {
        rc = kvstash_wire_read_cluster(c, ci);
    }
    rc = kvstash_done(c, rc);
    if (rc != 0) {
        kvstash_cluster_free(ci);
        return rc;
    }
    *out = ci;
    return 0;
}

int
kvstash_cluster_drain(struct kvstash *c)
{
    int rc = kvstash_begin(c);

    if (rc != 0) {
        return rc;
    }
    kvstash_wire_req_begin(c, "cluster_drain", 0);
    rc = kvstash_wire_call(c, KVSTASH_STATS_REPLY);
    if (rc == 0) {
        rc = kvstash_wire_skip(c);
    }
    return kvstash_done(c, rc);
}
