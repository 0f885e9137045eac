/*
 * kvstash_bench: a load generator for kvstashd that is never the bottleneck.
 *
 * N threads each own one connection and keep `depth` batch requests of B
 * keys in flight (batch_put, batch_get or batch_is_exist). The hot path
 * allocates nothing: every request is pre-built once per slot and only its
 * key counters are rewritten in place; put values go by reference (sendfile)
 * from one shared pattern held in a sealed memfd, headers with sendmsg (-C:
 * values copied with sendmsg, as before); get replies are parsed by a small
 * streaming reader whose bin bodies go from the socket straight into a
 * per-thread sink (the reply buffer only ever holds headers and the odd
 * fragment). Latency per request lands in a fixed log-linear histogram.
 *
 * Over the Unix socket, put_from and get_into do the same with
 * batch_put_from / batch_get_into: each connection registers one memfd of
 * batch x depth x size bytes (its pages touched first), slot s's key i owns
 * bytes [(s * batch + i) * size, +size) of it, and only keys and pieces cross
 * the socket. memcpy needs no daemon: it copies size-byte blocks from a large
 * source region (2 GiB by default, populated first) into a batch x depth x
 * size destination, cycling, one thread per -c: the machine's own copy rate,
 * to put the shared-memory figures next to.
 *
 * The wire code here is deliberately separate from libkvstash: the library
 * is used for the control path (hello, preload, remove_all) and this file
 * drives the data path the way a tuned client would. It must stay bounded:
 * every run ends by time (-t) or count (-n), and a thread whose connection
 * fails stops and reports why.
 */
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <limits.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include <msgpack.h>

#include "bench_util.h"
#include "kvstash.h"

#define BENCH_RBUF (64u * 1024)
#define BENCH_PEEK 512u               /* refill after a body went straight to the sink */
#define BENCH_RECV_PIECE (64u * 1024u) /* a body's recv: the sender waits on long ones */
#define BENCH_MAX_DEPTH 64            /* msgids stay positive fixints */
_Static_assert(BENCH_MAX_DEPTH <= BENCH_LOOP_MAX_DEPTH, "bench_loop_run keeps a send time per slot");
#define BENCH_MAX_CONNS 1024
#define BENCH_KEY_LEN 25              /* "kb" runid(8) "-" thread(3) "-" counter(10) */
#define BENCH_CTR_OFF 15              /* offset of the counter digits in a key */
#define BENCH_WORKSET (1ull << 30)    /* default bytes of the get working set, all threads */
#define BENCH_MEMCPY_SRC (2ull << 30) /* default bytes of the memcpy source, all threads */
#define BENCH_REG_MSGID 127u          /* register_buffer's msgid (no slot uses it) */

enum bench_mode { MODE_PUT, MODE_GET, MODE_EXISTS, MODE_PUT_FROM, MODE_GET_INTO, MODE_MEMCPY };

static const char *const bench_mode_names[] = {
    "put", "get", "exists", "put_from", "get_into", "memcpy",
};
static const char *const bench_methods[] = {
    "batch_put", "batch_get", "batch_is_exist", "batch_put_from", "batch_get_into", "",
};

struct bench_cfg {
    const char *addr;
    enum bench_mode mode;
    int conns;
    int depth;
    uint32_t batch;
    size_t vsize;
    double secs;
    double rate;                  /* -r: requests/s in all; 0 = unpaced */
    uint64_t max_reqs;            /* per connection; 0 = no limit */
    uint64_t keys;                /* working set per connection (get, exists) */
    int pid;                      /* daemon to charge CPU to; 0 = none */
    bool reset;                   /* remove_all before the run */
    bool no_preload;              /* get/exists: the keys are already there (-N) */
    bool quiet;
    bool copy;                    /* -C: put values copied (sendmsg), not sendfile */
    char runid[9];
    struct bench_pattern *values; /* put: sent by reference; the rest only read it */
    const uint8_t *pattern;       /* its vsize bytes, shared by every value */
    uint8_t vhdr[8];              /* put: the bin header every value shares */
    size_t vhdrlen;
};

static bool
mode_put(const struct bench_cfg *cfg)
{
    return cfg->mode == MODE_PUT || cfg->mode == MODE_PUT_FROM;
}

static bool
mode_shm(const struct bench_cfg *cfg)
{
    return cfg->mode == MODE_PUT_FROM || cfg->mode == MODE_GET_INTO;
}

/* One pre-built request. */
struct bench_slot {
    uint8_t *hdr;                 /* envelope + keys (+ the first value's bin header) */
    size_t hdrlen;
    size_t *ctr_off;              /* batch offsets of key counter digits in hdr */
    struct iovec *iov;
    size_t niov;
};

struct bench_thread {
    int id;
    pthread_t tid;
    const struct bench_cfg *cfg;
    pthread_barrier_t *barrier;
    int fd;
    uint8_t *rbuf;
    size_t rpos, rlen, fill_max;
    uint8_t *sink;                /* get bodies land here */
    uint8_t *check;               /* ... or here, when verifying */
    uint8_t *shm;                 /* put_from/get_into: the registered buffer (memcpy: dst) */
    size_t shmlen;
    uint64_t shmid;
    uint8_t *src;                 /* memcpy: the source region */
    size_t srclen;
    struct bench_slot slots[BENCH_MAX_DEPTH];
    struct iovec *scratch;        /* working copy of a slot's iov for partial sends */
    uint64_t ctr;
    /* results */
    uint64_t reqs, keys, bytes, misses, errors, mismatches;
    uint64_t hist[BENCH_HIST];
    int fail;
    char why[160];
};

/* ---- small helpers ---- */

static void
bench_key(char *dst, const struct bench_cfg *cfg, int thread, uint64_t ctr)
{
    char tmp[48];

    snprintf(tmp, sizeof(tmp), "kb%.8s-%03u-%010" PRIu64, cfg->runid, (unsigned)thread % 1000,
             (uint64_t)(ctr % 10000000000ull));
    memcpy(dst, tmp, BENCH_KEY_LEN);
}

/* ---- connection ---- */

static int
bench_fail(struct bench_thread *t, int rc, const char *what)
{
    if (t->fail == 0) {
        t->fail = rc;
        snprintf(t->why, sizeof(t->why), "%s%s%s", what, rc < 0 ? ": " : "",
                 rc < 0 ? strerror(-rc) : "");
    }
    return rc < 0 ? rc : -EPROTO;
}

static int
bench_send(struct bench_thread *t, const struct bench_slot *s)
{
    memcpy(t->scratch, s->iov, s->niov * sizeof(*s->iov));
    int rc = bench_send_pattern(t->fd, t->scratch, s->niov, t->cfg->values);
    return rc != 0 ? bench_fail(t, rc, "send") : 0;
}

/* ---- streaming reply reader ---- */

static ssize_t
bench_recv(struct bench_thread *t, void *buf, size_t len, int flags)
{
    for (;;) {
        ssize_t r = recv(t->fd, buf, len, flags);
        if (r > 0) {
            return r;
        }
        if (r == 0) {
            return bench_fail(t, -ECONNRESET, "server closed the connection");
        }
        if (errno != EINTR) {
            return bench_fail(t, -errno, "recv");
        }
    }
}

static int
bench_fill(struct bench_thread *t, size_t need)
{
    size_t have = t->rlen - t->rpos;

    if (have >= need) {
        return 0;
    }
    memmove(t->rbuf, t->rbuf + t->rpos, have);
    t->rpos = 0;
    t->rlen = have;
    while (t->rlen < need) {
        size_t want = BENCH_RBUF - t->rlen;
        if (want > t->fill_max && t->fill_max >= need - t->rlen) {
            want = t->fill_max;
        }
        ssize_t r = bench_recv(t, t->rbuf + t->rlen, want, 0);
        if (r < 0) {
            return (int)r;
        }
        t->rlen += (size_t)r;
    }
    return 0;
}

/* bench_body: len body bytes into dst (or dropped when dst is NULL). */
static int
bench_body(struct bench_thread *t, uint8_t *dst, uint64_t len)
{
    size_t have = t->rlen - t->rpos;
    size_t take = len < have ? (size_t)len : have;

    if (dst != NULL) {
        memcpy(dst, t->rbuf + t->rpos, take);
        dst += take;
    }
    t->rpos += take;
    len -= take;
    t->fill_max = len > 0 && dst != NULL ? BENCH_PEEK : BENCH_RBUF;
    while (len > 0) {
        uint8_t *to = dst ? dst : t->rbuf;
        size_t piece = dst ? BENCH_RECV_PIECE : BENCH_RBUF;
        size_t want = len < piece ? (size_t)len : piece;
        ssize_t r = bench_recv(t, to, want, MSG_WAITALL);
        if (r < 0) {
            return (int)r;
        }
        if (dst) {
            dst += r;
        }
        len -= (uint64_t)r;
    }
    if (t->rpos == t->rlen) {
        t->rpos = t->rlen = 0; /* a drain may have reused the buffer */
    }
    return 0;
}

enum bench_type { BT_NIL, BT_BOOL, BT_UINT, BT_INT, BT_STR, BT_BIN, BT_ARRAY, BT_MAP, BT_OTHER };

struct bench_head {
    enum bench_type type;
    uint64_t v;                   /* uint value, bool, or length/count */
};

static int
bench_head(struct bench_thread *t, struct bench_head *h)
{
    static const uint8_t extra[32] = {
        /* c0 */ 0, 0, 0, 0, 1, 2, 4, 0, 0, 0, 4, 8, 1, 2, 4, 8,
        /* d0 */ 1, 2, 4, 8, 0, 0, 0, 0, 0, 1, 2, 4, 2, 4, 2, 4,
    };
    int rc = bench_fill(t, 1);
    if (rc != 0) {
        return rc;
    }
    uint8_t b = t->rbuf[t->rpos];
    if (b <= 0x7f || b >= 0xe0) {
        h->type = b <= 0x7f ? BT_UINT : BT_INT;
        h->v = b;
        t->rpos++;
        return 0;
    }
    if (b <= 0xbf) {
        h->type = b <= 0x8f ? BT_MAP : b <= 0x9f ? BT_ARRAY : BT_STR;
        h->v = b & (b <= 0x9f ? 0x0f : 0x1f);
        t->rpos++;
        return 0;
    }
    int n = extra[b - 0xc0];
    rc = bench_fill(t, 1 + (size_t)n);
    if (rc != 0) {
        return rc;
    }
    uint64_t v = 0;
    for (int i = 1; i <= n; i++) {
        v = (v << 8) | t->rbuf[t->rpos + (size_t)i];
    }
    t->rpos += 1 + (size_t)n;
    h->v = v;
    switch (b) {
    case 0xc0: h->type = BT_NIL; break;
    case 0xc2: case 0xc3: h->type = BT_BOOL; h->v = b == 0xc3; break;
    case 0xc4: case 0xc5: case 0xc6: h->type = BT_BIN; break;
    case 0xcc: case 0xcd: case 0xce: case 0xcf: h->type = BT_UINT; break;
    case 0xd0: case 0xd1: case 0xd2: case 0xd3: h->type = BT_INT; break;
    case 0xd9: case 0xda: case 0xdb: h->type = BT_STR; break;
    case 0xdc: case 0xdd: h->type = BT_ARRAY; break;
    case 0xde: case 0xdf: h->type = BT_MAP; break;
    default: h->type = BT_OTHER; break; /* ext, float: never in the replies read here */
    }
    return 0;
}

/* bench_error: the rest of an error triple [code, name, message]: *code and msg. */
static int
bench_error(struct bench_thread *t, uint64_t n, uint64_t *code, char *text, size_t textsz)
{
    struct bench_head h;
    char msg[120] = "";
    int rc;

    *code = 0;
    for (uint64_t i = 0; i < n; i++) {
        rc = bench_head(t, &h);
        if (rc != 0) {
            return rc;
        }
        if (h.type == BT_UINT && i == 0) {
            *code = h.v;
        } else if (h.type == BT_STR || h.type == BT_BIN) {
            if (h.v > 4096) {
                return bench_fail(t, -EPROTO, "oversized error text");
            }
            size_t keep = h.v < sizeof(msg) - 1 ? (size_t)h.v : sizeof(msg) - 1;
            rc = bench_fill(t, keep);
            if (rc != 0) {
                return rc;
            }
            if (i == 2) {
                memcpy(msg, t->rbuf + t->rpos, keep);
                msg[keep] = '\0';
            }
            rc = bench_body(t, NULL, h.v);
            if (rc != 0) {
                return rc;
            }
        } else if (h.type != BT_NIL) {
            return bench_fail(t, -EPROTO, "malformed error");
        }
    }
    snprintf(text, textsz, "server error %" PRIu64 ": %s", *code, msg);
    return 0;
}

/* bench_reply: read the reply to slot s and account its keys. */
static int
bench_reply(struct bench_thread *t, int s, bool verify)
{
    const struct bench_cfg *cfg = t->cfg;
    struct bench_head h;
    int rc;

    rc = bench_head(t, &h);
    if (rc == 0 && (h.type != BT_ARRAY || (h.v != 4 && h.v != 3))) {
        return bench_fail(t, -EPROTO, "reply is not an rpc message");
    }
    uint64_t len = h.v;
    if (rc == 0) {
        rc = bench_head(t, &h);
    }
    if (rc != 0) {
        return rc;
    }
    if (h.type == BT_UINT && h.v == 2 && len == 3) {
        uint64_t code;
        rc = bench_head(t, &h); /* "error" */
        if (rc == 0 && h.type == BT_STR) {
            rc = bench_body(t, NULL, h.v);
        }
        if (rc == 0) {
            rc = bench_head(t, &h);
        }
        if (rc == 0 && (h.type != BT_ARRAY || h.v > 3)) {
            return bench_fail(t, -EPROTO, "malformed notification");
        }
        if (rc == 0) {
            char text[120];
            rc = bench_error(t, h.v, &code, text, sizeof(text));
            if (rc == 0) {
                t->fail = -ECONNRESET; /* the server closes after an error notification */
                snprintf(t->why, sizeof(t->why), "notification: %s", text);
                return t->fail;
            }
        }
        return rc;
    }
    if (h.type != BT_UINT || h.v != 1) {
        return bench_fail(t, -EPROTO, "unexpected message type");
    }
    rc = bench_head(t, &h);
    if (rc == 0 && (h.type != BT_UINT || h.v != (uint64_t)s)) {
        return bench_fail(t, -EPROTO, "reply out of order");
    }
    if (rc == 0) {
        rc = bench_head(t, &h);
    }
    if (rc != 0) {
        return rc;
    }
    if (h.type == BT_ARRAY) {
        uint64_t code;
        char text[sizeof(t->why)];
        rc = bench_error(t, h.v, &code, text, sizeof(text));
        if (rc == 0 && t->why[0] == '\0') {
            memcpy(t->why, text, sizeof(t->why));
        }
        if (rc == 0) {
            rc = bench_head(t, &h); /* nil result */
        }
        t->errors += cfg->batch;
        return rc;
    }
    if (h.type != BT_NIL) {
        return bench_fail(t, -EPROTO, "error is neither nil nor an array");
    }
    rc = bench_head(t, &h);
    if (rc == 0 && (h.type != BT_ARRAY || h.v != cfg->batch)) {
        return bench_fail(t, -EPROTO, "result does not match the batch");
    }
    for (uint32_t i = 0; rc == 0 && i < cfg->batch; i++) {
        rc = bench_head(t, &h);
        if (rc != 0) {
            break;
        }
        switch (cfg->mode) {
        case MODE_PUT:
            if (h.type != BT_UINT) {
                return bench_fail(t, -EPROTO, "put code is not an integer");
            }
            if (h.v == 0) {
                t->keys++;
                t->bytes += cfg->vsize;
            } else {
                t->errors++;
                if (t->why[0] == '\0') {
                    snprintf(t->why, sizeof(t->why), "put answered code %" PRIu64, h.v);
                }
            }
            break;
        case MODE_GET:
            if (h.type == BT_NIL) {
                t->misses++;
                break;
            }
            if (h.type != BT_BIN) {
                return bench_fail(t, -EPROTO, "value is neither bin nor nil");
            }
            if (h.v != cfg->vsize) {
                t->errors++;
                rc = bench_body(t, NULL, h.v);
                break;
            }
            rc = bench_body(t, verify ? t->check : t->sink, h.v);
            if (rc == 0 && verify && memcmp(t->check, cfg->pattern, cfg->vsize) != 0) {
                t->mismatches++;
            }
            t->keys++;
            t->bytes += cfg->vsize;
            break;
        case MODE_EXISTS:
            if (h.type != BT_BOOL) {
                return bench_fail(t, -EPROTO, "exists answer is not a bool");
            }
            t->keys++;
            if (!h.v) {
                t->misses++;
            }
            break;
        case MODE_PUT_FROM:
        case MODE_GET_INTO:
            /* put_from: a code; get_into: bytes written, or minus a code (-1: not found) */
            if (h.type != BT_UINT && h.type != BT_INT) {
                return bench_fail(t, -EPROTO, "transfer result is not an integer");
            }
            if (cfg->mode == MODE_GET_INTO && h.type == BT_INT && h.v == 0xff) {
                t->misses++;
                break;
            }
            if ((cfg->mode == MODE_PUT_FROM && h.type == BT_UINT && h.v == 0) ||
                (cfg->mode == MODE_GET_INTO && h.type == BT_UINT && h.v == cfg->vsize)) {
                const uint8_t *got = t->shm + ((size_t)s * cfg->batch + i) * cfg->vsize;
                if (verify && memcmp(got, cfg->pattern, cfg->vsize) != 0) {
                    t->mismatches++;
                }
                t->keys++;
                t->bytes += cfg->vsize;
                break;
            }
            t->errors++;
            if (t->why[0] == '\0') {
                snprintf(t->why, sizeof(t->why), "%s answered %s%" PRIu64,
                         bench_methods[cfg->mode], h.type == BT_INT ? "negative, encoded " : "",
                         h.v);
            }
            break;
        case MODE_MEMCPY:
            return bench_fail(t, -EPROTO, "memcpy has no replies");
        }
    }
    return rc;
}

/* ---- request building (setup only) ---- */

static int
bench_sbuf_write(void *data, const char *buf, size_t len)
{
    return msgpack_sbuffer_write(data, buf, len);
}

static int
bench_slot_build(struct bench_thread *t, int s)
{
    const struct bench_cfg *cfg = t->cfg;
    struct bench_slot *sl = &t->slots[s];
    msgpack_sbuffer sb;
    msgpack_packer pk;
    char key[BENCH_KEY_LEN];
    const char *method = bench_methods[cfg->mode];

    msgpack_sbuffer_init(&sb);
    msgpack_packer_init(&pk, &sb, bench_sbuf_write);
    sl->ctr_off = calloc(cfg->batch, sizeof(*sl->ctr_off));
    sl->niov = cfg->mode == MODE_PUT ? 2 * (size_t)cfg->batch : 1;
    sl->iov = calloc(sl->niov, sizeof(*sl->iov));
    if (sl->ctr_off == NULL || sl->iov == NULL) {
        return -ENOMEM;
    }
    msgpack_pack_array(&pk, 4);
    msgpack_pack_uint32(&pk, 0);
    msgpack_pack_uint32(&pk, (uint32_t)s);
    msgpack_pack_str_with_body(&pk, method, strlen(method));
    msgpack_pack_array(&pk, cfg->mode == MODE_PUT || mode_shm(cfg) ? 2 : 1);
    msgpack_pack_array(&pk, cfg->batch);
    for (uint32_t i = 0; i < cfg->batch; i++) {
        bench_key(key, cfg, t->id, 0);
        msgpack_pack_bin(&pk, BENCH_KEY_LEN);
        sl->ctr_off[i] = sb.size + BENCH_CTR_OFF;
        msgpack_pack_bin_body(&pk, key, BENCH_KEY_LEN);
    }
    if (cfg->mode == MODE_PUT) {
        msgpack_pack_array(&pk, cfg->batch);
        msgpack_sbuffer_write(&sb, (const char *)cfg->vhdr, cfg->vhdrlen);
    }
    if (mode_shm(cfg)) {
        /* iovs: one piece per key, [buffer id, offset, length] in this slot's part */
        msgpack_pack_array(&pk, cfg->batch);
        for (uint32_t i = 0; i < cfg->batch; i++) {
            msgpack_pack_array(&pk, 1);
            msgpack_pack_array(&pk, 3);
            msgpack_pack_uint64(&pk, t->shmid);
            msgpack_pack_uint64(&pk, ((uint64_t)s * cfg->batch + i) * cfg->vsize);
            msgpack_pack_uint64(&pk, cfg->vsize);
        }
    }
    sl->hdr = (uint8_t *)sb.data; /* owned by the slot from here on */
    sl->hdrlen = sb.size;
    sl->iov[0] = (struct iovec){ .iov_base = sl->hdr, .iov_len = sl->hdrlen };
    if (cfg->mode == MODE_PUT) {
        for (uint32_t i = 0; i < cfg->batch; i++) {
            sl->iov[1 + 2 * i] = (struct iovec){ .iov_base = (void *)cfg->pattern,
                                                 .iov_len = cfg->vsize };
            if (i + 1 < cfg->batch) {
                sl->iov[2 + 2 * i] = (struct iovec){ .iov_base = (void *)cfg->vhdr,
                                                     .iov_len = cfg->vhdrlen };
            }
        }
        sl->niov = 2 * (size_t)cfg->batch;
    }
    return 0;
}

/* bench_slot_keys: give slot s its next batch of keys. */
static void
bench_slot_keys(struct bench_thread *t, int s)
{
    const struct bench_cfg *cfg = t->cfg;
    struct bench_slot *sl = &t->slots[s];

    for (uint32_t i = 0; i < cfg->batch; i++) {
        uint64_t k = mode_put(cfg) ? t->ctr : t->ctr % cfg->keys;
        bench_key_ctr(sl->hdr + sl->ctr_off[i], k);
        t->ctr++;
    }
}

/* ---- threads ---- */

/* bench_preload: store this thread's working set through libkvstash. */
static int
bench_preload(struct bench_thread *t)
{
    const struct bench_cfg *cfg = t->cfg;
    struct kvstash *c = NULL;
    size_t n = (size_t)cfg->keys;
    char *names = malloc(n * BENCH_KEY_LEN);
    const void **keys = calloc(n, sizeof(*keys));
    const void **vals = calloc(n, sizeof(*vals));
    size_t *klens = calloc(n, sizeof(*klens));
    size_t *vlens = calloc(n, sizeof(*vlens));
    int *codes = calloc(n, sizeof(*codes));
    int rc = -ENOMEM;

    if (names == NULL || keys == NULL || vals == NULL || klens == NULL || vlens == NULL ||
        codes == NULL) {
        bench_fail(t, rc, "preload");
        goto out;
    }
    for (size_t i = 0; i < n; i++) {
        bench_key(names + i * BENCH_KEY_LEN, cfg, t->id, i);
        keys[i] = names + i * BENCH_KEY_LEN;
        klens[i] = BENCH_KEY_LEN;
        vals[i] = cfg->pattern;
        vlens[i] = cfg->vsize;
    }
    rc = kvstash_connect(cfg->addr, &c);
    if (rc == 0) {
        rc = kvstash_batch_put(c, n, keys, klens, vals, vlens, codes);
    }
    if (rc != 0) {
        const char *msg = c ? kvstash_last_error(c) : kvstash_last_error(NULL);
        snprintf(t->why, sizeof(t->why), "preload: %s", msg[0] ? msg : kvstash_strerror(rc));
        t->fail = rc < 0 ? rc : -EPROTO;
        goto out;
    }
    for (size_t i = 0; i < n; i++) {
        if (codes[i] != 0 && codes[i] != KVSTASH_EEXISTS) {
            snprintf(t->why, sizeof(t->why), "preload: key %zu answered %s", i,
                     kvstash_strerror(codes[i]));
            t->fail = -EPROTO;
            rc = -EPROTO;
            break;
        }
    }
out:
    kvstash_close(c);
    free(names);
    free(keys);
    free(vals);
    free(klens);
    free(vlens);
    free(codes);
    return rc;
}

/* bench_map: len bytes of private anonymous memory (huge pages asked for when huge). */
static uint8_t *
bench_map(size_t len, bool huge)
{
    void *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);

    if (p == MAP_FAILED) {
        return NULL;
    }
#ifdef MADV_HUGEPAGE
    if (huge) {
        (void)madvise(p, len, MADV_HUGEPAGE);
    }
#else
    (void)huge;
#endif
    return p;
}

/*
 * bench_shm_register: the connection's buffer: a memfd of batch x depth x size bytes,
 * sealed against shrinking and growing, mapped shared, every page touched (put_from: each
 * value's part holds the pattern; get_into: zeroes), then register_buffer on t->fd with
 * the descriptor attached. 0 (t->shm, t->shmid) or the failure.
 */
static int
bench_shm_register(struct bench_thread *t)
{
    const struct bench_cfg *cfg = t->cfg;
    size_t n = (size_t)cfg->batch * (size_t)cfg->depth;
    size_t len = n * cfg->vsize;
    struct bench_head h;
    msgpack_sbuffer sb;
    msgpack_packer pk;
    int fd, rc;

    if (len == 0) {
        return bench_fail(t, -EINVAL, "a shared-memory buffer needs -s > 0");
    }
    fd = memfd_create("kvstash-bench", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    if (fd < 0) {
        return bench_fail(t, -errno, "memfd_create");
    }
    if (ftruncate(fd, (off_t)len) != 0 ||
        fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW) != 0) {
        rc = -errno;
        close(fd);
        return bench_fail(t, rc, "ftruncate/F_ADD_SEALS on the memfd");
    }
    void *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) {
        rc = -errno;
        close(fd);
        return bench_fail(t, rc, "mmap of the memfd");
    }
    t->shm = p;
    t->shmlen = len;
    for (size_t i = 0; i < n; i++) {
        if (cfg->mode == MODE_PUT_FROM) {
            memcpy(t->shm + i * cfg->vsize, cfg->pattern, cfg->vsize);
        } else {
            memset(t->shm + i * cfg->vsize, 0, cfg->vsize);
        }
    }

    msgpack_sbuffer_init(&sb);
    msgpack_packer_init(&pk, &sb, bench_sbuf_write);
    msgpack_pack_array(&pk, 4);
    msgpack_pack_uint32(&pk, 0);
    msgpack_pack_uint32(&pk, BENCH_REG_MSGID);
    msgpack_pack_str_with_body(&pk, "register_buffer", 15);
    msgpack_pack_array(&pk, 1);
    msgpack_pack_map(&pk, 1);
    msgpack_pack_str_with_body(&pk, "size", 4);
    msgpack_pack_uint64(&pk, len);

    /* the descriptor rides on the sendmsg that carries the whole request */
    union {
        char buf[CMSG_SPACE(sizeof(int))];
        struct cmsghdr align;
    } ctl;
    struct iovec iov = { .iov_base = sb.data, .iov_len = sb.size };
    struct msghdr mh;
    memset(&mh, 0, sizeof(mh));
    memset(&ctl, 0, sizeof(ctl));
    mh.msg_iov = &iov;
    mh.msg_iovlen = 1;
    mh.msg_control = ctl.buf;
    mh.msg_controllen = sizeof(ctl.buf);
    struct cmsghdr *cm = CMSG_FIRSTHDR(&mh);
    cm->cmsg_level = SOL_SOCKET;
    cm->cmsg_type = SCM_RIGHTS;
    cm->cmsg_len = CMSG_LEN(sizeof(int));
    memcpy(CMSG_DATA(cm), &fd, sizeof(int));
    ssize_t w;
    do {
        w = sendmsg(t->fd, &mh, MSG_NOSIGNAL);
    } while (w < 0 && errno == EINTR);
    rc = w < 0 ? -errno : 0;
    close(fd); /* the mappings (ours, the daemon's) keep the memory */
    if (rc == 0 && (size_t)w < sb.size) {
        struct iovec rest = { .iov_base = sb.data + w, .iov_len = sb.size - (size_t)w };
        rc = bench_send_all(t->fd, &rest, 1);
    }
    msgpack_sbuffer_destroy(&sb);
    if (rc != 0) {
        return bench_fail(t, rc, "sending register_buffer");
    }

    /* [1, msgid, error, result] */
    rc = bench_head(t, &h);
    if (rc == 0 && (h.type != BT_ARRAY || h.v != 4)) {
        return bench_fail(t, -EPROTO, "register_buffer: reply is not an rpc response");
    }
    if (rc == 0) {
        rc = bench_head(t, &h);
    }
    if (rc == 0 && (h.type != BT_UINT || h.v != 1)) {
        return bench_fail(t, -EPROTO, "register_buffer: unexpected message type");
    }
    if (rc == 0) {
        rc = bench_head(t, &h);
    }
    if (rc == 0 && (h.type != BT_UINT || h.v != BENCH_REG_MSGID)) {
        return bench_fail(t, -EPROTO, "register_buffer: reply to another request");
    }
    if (rc == 0) {
        rc = bench_head(t, &h);
    }
    if (rc == 0 && h.type == BT_ARRAY) {
        uint64_t code;
        char text[120];
        rc = bench_error(t, h.v, &code, text, sizeof(text));
        if (rc == 0) {
            char why[160];
            snprintf(why, sizeof(why), "register_buffer: %s", text);
            return bench_fail(t, -EPROTO, why);
        }
    }
    if (rc == 0 && h.type != BT_NIL) {
        return bench_fail(t, -EPROTO, "register_buffer: error is neither nil nor an array");
    }
    if (rc == 0) {
        rc = bench_head(t, &h);
    }
    if (rc == 0 && h.type != BT_UINT) {
        return bench_fail(t, -EPROTO, "register_buffer: the id is not an integer");
    }
    if (rc != 0) {
        return rc;
    }
    t->shmid = h.v;
    return 0;
}

/*
 * bench_memcpy_main: copy size-byte blocks from t->src (cfg->keys blocks, cycled in
 * order) into t->shm (batch x depth blocks, cycled), batch blocks a "request", until the
 * deadline or -n requests. The first request's blocks are checked against the pattern.
 */
static void *
bench_memcpy_main(struct bench_thread *t)
{
    const struct bench_cfg *cfg = t->cfg;
    size_t ndst = (size_t)cfg->batch * (size_t)cfg->depth;
    int rc = 0;

    t->srclen = (size_t)cfg->keys * cfg->vsize;
    t->shmlen = ndst * cfg->vsize;
    t->src = bench_map(t->srclen, true);
    t->shm = bench_map(t->shmlen, false);
    if (t->src == NULL || t->shm == NULL) {
        rc = bench_fail(t, -ENOMEM, "mapping the memcpy regions");
    } else {
        /* every page written first: the copy reads real pages, not the zero page */
        for (size_t i = 0; i < cfg->keys; i++) {
            memcpy(t->src + i * cfg->vsize, cfg->pattern, cfg->vsize);
        }
        memset(t->shm, 0, t->shmlen);
    }
    pthread_barrier_wait(t->barrier); /* everyone ready */
    pthread_barrier_wait(t->barrier); /* main took the start time */
    if (rc != 0) {
        return NULL;
    }
    uint64_t deadline = bench_now_ns() + (uint64_t)(cfg->secs * 1e9);
    size_t si = 0, di = 0;
    uint64_t now = bench_now_ns();

    while (now < deadline && (cfg->max_reqs == 0 || t->reqs < cfg->max_reqs)) {
        uint64_t t0 = now;
        for (uint32_t b = 0; b < cfg->batch; b++) {
            memcpy(t->shm + di * cfg->vsize, t->src + si * cfg->vsize, cfg->vsize);
            if (t->reqs == 0 && memcmp(t->shm + di * cfg->vsize, cfg->pattern, cfg->vsize)) {
                t->mismatches++;
            }
            si = si + 1 == cfg->keys ? 0 : si + 1;
            di = di + 1 == ndst ? 0 : di + 1;
        }
        now = bench_now_ns();
        t->hist[bench_hist_index(now - t0)]++;
        t->reqs++;
        t->keys += cfg->batch;
        t->bytes += (uint64_t)cfg->batch * cfg->vsize;
    }
    return NULL;
}

/* bench_loop_send, _reply, _buffered: bench_loop_run's calls for a thread of this tool. */
static int
bench_loop_send(void *arg, int s)
{
    struct bench_thread *t = arg;

    bench_slot_keys(t, s);
    return bench_send(t, &t->slots[s]);
}

static int
bench_loop_reply(void *arg, int s)
{
    struct bench_thread *t = arg;
    const struct bench_cfg *cfg = t->cfg;

    return bench_reply(t, s, t->reqs == 0 && (cfg->mode == MODE_GET || cfg->mode == MODE_GET_INTO));
}

static bool
bench_loop_buffered(void *arg)
{
    const struct bench_thread *t = arg;

    return t->rpos != t->rlen;
}

static void *
bench_thread_main(void *arg)
{
    struct bench_thread *t = arg;
    const struct bench_cfg *cfg = t->cfg;
    int depth = cfg->depth;
    int rc = 0;

    if (cfg->mode == MODE_MEMCPY) {
        return bench_memcpy_main(t);
    }
    if (!mode_put(cfg) && !cfg->no_preload) {
        rc = bench_preload(t);
    }
    if (rc == 0) {
        rc = bench_connect(cfg->addr, "7431", 1, &t->fd);
        if (rc != 0) {
            bench_fail(t, rc, "connect");
        }
    }
    if (rc == 0 && mode_shm(cfg)) {
        rc = bench_shm_register(t);
    }
    for (int s = 0; rc == 0 && s < depth; s++) {
        if (bench_slot_build(t, s) != 0) {
            rc = bench_fail(t, -ENOMEM, "building the requests");
        }
    }
    pthread_barrier_wait(t->barrier); /* everyone ready */
    pthread_barrier_wait(t->barrier); /* main took the start time */
    if (rc != 0) {
        return NULL;
    }
    struct bench_loop l = {
        .arg = t, .fd = t->fd, .depth = depth, .thread = t->id, .threads = cfg->conns,
        .secs = cfg->secs, .rate = cfg->rate, .max_reqs = cfg->max_reqs,
        .reqs = &t->reqs, .hist = t->hist,
        .send = bench_loop_send, .reply = bench_loop_reply, .buffered = bench_loop_buffered,
    };
    bench_loop_run(&l);
    return NULL;
}

static void
bench_thread_free(struct bench_thread *t)
{
    if (t->fd >= 0) {
        close(t->fd);
    }
    for (int s = 0; s < BENCH_MAX_DEPTH; s++) {
        free(t->slots[s].hdr);
        free(t->slots[s].ctr_off);
        free(t->slots[s].iov);
    }
    if (t->shm != NULL) {
        munmap(t->shm, t->shmlen);
    }
    if (t->src != NULL) {
        munmap(t->src, t->srclen);
    }
    free(t->scratch);
    free(t->rbuf);
    free(t->sink);
    free(t->check);
}

static const char bench_usage_text[] =
    "usage: kvstash-bench [-H host:port | -S socket] [-m MODE] [-c conns]\n"
    "                     [-d depth] [-b batch] [-s size] [-t seconds] [-n requests]\n"
    "                     [-k keys] [-i id] [-N] [-p pid] [-r rate] [-R] [-C] [-q]\n"
    "  -m MODE     put, get, exists: batch_put, batch_get, batch_is_exist (default get);\n"
    "              put_from, get_into: batch_put_from, batch_get_into through one\n"
    "              registered shared-memory buffer of batch x depth x size bytes per\n"
    "              connection (Unix socket only: -S); memcpy: no daemon, each thread\n"
    "              copies size-byte blocks from a populated source of -k blocks (2 GiB\n"
    "              in all by default) into a batch x depth x size region, cycling\n"
    "  -c N        connections, one thread each (default 1)\n"
    "  -d N        requests in flight per connection (default 2, at most 64)\n"
    "  -b N        keys per request (default 8)\n"
    "  -s SIZE     value size: 4096, 64k, 1m, 4m (default 1m; 64 for exists)\n"
    "  -t SECS     run time (default 5)\n"
    "  -n N        stop each connection after N requests (default: time only)\n"
    "  -r RATE     pace the run at RATE requests/s in all (RATE / conns per connection,\n"
    "              each thread sleeping until its next send is due; still at most depth in\n"
    "              flight); default: as fast as the server answers\n"
    "  -k N        keys preloaded per connection for get/get_into/exists (default: ~1 GiB\n"
    "              in all); memcpy: source blocks per thread\n"
    "  -i ID       key id (1-8 of [0-9a-z]) instead of a random one: a get run with -N\n"
    "              reads the keys a put run with the same -i, -c and -b stored\n"
    "              (connection c's keys are numbered 0, 1, ... in the order it put them)\n"
    "  -N          get/get_into/exists: no preload, the keys are already stored (with -i)\n"
    "  -p PID      charge the daemon's CPU time (/proc/PID/stat) to the bytes moved\n"
    "  -R          remove_all (forced) before the run\n"
    "  -C          put: send values by copying (sendmsg), as before, instead of by\n"
    "              reference (sendfile from a sealed memfd)\n"
    "  -q          print only the result line\n"
    "Target: -H/-S, else $KVSTASH_ADDR, else 127.0.0.1:7431.\n"
    "Output: mode size batch conns depth secs GB/s keys/s req/s p50_us p99_us misses errors\n";

static int
bench_usage(const char *why)
{
    return bench_print_usage("kvstash-bench", bench_usage_text, why);
}

/* bench_control: the control connection: the server's limits, the optional reset. 0 or an
 * exit status (the reason printed). */
static int
bench_control(const struct bench_cfg *cfg)
{
    struct kvstash *ctl = NULL;
    int rc = kvstash_connect_timeout(cfg->addr, 10000, &ctl);
    if (rc != 0) {
        fprintf(stderr, "kvstash-bench: connecting to %s: %s\n", cfg->addr,
                kvstash_last_error(NULL));
        return 3;
    }
    const struct kvstash_hello *hi = kvstash_server_info(ctl);
    if (cfg->batch > hi->max_batch || cfg->vsize > hi->max_value_size ||
        (!mode_shm(cfg) &&
         (uint64_t)cfg->batch * (cfg->vsize + 40) + 64 > hi->max_message_size)) {
        fprintf(stderr, "kvstash-bench: a request of %u x %zu bytes exceeds the server's limits "
                "(max_batch %" PRIu64 ", max_value_size %" PRIu64 ", max_message_size %" PRIu64
                ")\n", cfg->batch, cfg->vsize, hi->max_batch, hi->max_value_size,
                hi->max_message_size);
        kvstash_close(ctl);
        return 2;
    }
    if (cfg->reset) {
        uint64_t removed = 0;
        rc = kvstash_remove_all(ctl, true, &removed);
        if (rc != 0) {
            fprintf(stderr, "kvstash-bench: remove_all: %s\n", kvstash_last_error(ctl));
            kvstash_close(ctl);
            return 3;
        }
    }
    kvstash_close(ctl);
    return 0;
}

int
main(int argc, char **argv)
{
    static char addrbuf[PATH_MAX + 8];
    struct bench_cfg cfg = {
        .mode = MODE_GET, .conns = 1, .depth = 2, .batch = 8, .vsize = 0, .secs = 5,
    };
    bool size_given = false;
    const char *fixed_id = NULL;
    const char *env = getenv("KVSTASH_ADDR");
    int opt;

    cfg.addr = env && env[0] ? env : "127.0.0.1:7431";
    while ((opt = getopt(argc, argv, "H:S:m:c:d:b:s:t:n:k:i:p:r:NRCqh")) != -1) {
        long long v = 0;
        if (strchr("cdbnkp", opt) != NULL && bench_opt_count(optarg, &v) != 0) {
            return bench_usage("numeric option expected");
        }
        switch (opt) {
        case 'H':
            cfg.addr = optarg;
            break;
        case 'S':
            snprintf(addrbuf, sizeof(addrbuf), "unix:%s", optarg);
            cfg.addr = addrbuf;
            break;
        case 'm':
            if (strcmp(optarg, "put") == 0) {
                cfg.mode = MODE_PUT;
            } else if (strcmp(optarg, "get") == 0) {
                cfg.mode = MODE_GET;
            } else if (strcmp(optarg, "exists") == 0) {
                cfg.mode = MODE_EXISTS;
            } else if (strcmp(optarg, "put_from") == 0) {
                cfg.mode = MODE_PUT_FROM;
            } else if (strcmp(optarg, "get_into") == 0) {
                cfg.mode = MODE_GET_INTO;
            } else if (strcmp(optarg, "memcpy") == 0) {
                cfg.mode = MODE_MEMCPY;
            } else {
                return bench_usage("-m wants put, get, exists, put_from, get_into or memcpy");
            }
            break;
        case 'c': cfg.conns = (int)(v < INT_MAX ? v : INT_MAX); break;
        case 'd': cfg.depth = (int)(v < INT_MAX ? v : INT_MAX); break;
        case 'b': cfg.batch = (uint32_t)(v < UINT32_MAX ? v : UINT32_MAX); break;
        case 'n': cfg.max_reqs = (uint64_t)v; break;
        case 'k': cfg.keys = (uint64_t)v; break;
        case 'p': cfg.pid = (int)(v < INT_MAX ? v : 0); break;
        case 's':
            if (bench_parse_size(optarg, &cfg.vsize) != 0) {
                return bench_usage("-s wants a size like 4096, 64k, 1m");
            }
            size_given = true;
            break;
        case 'r':
            if (bench_opt_rate(optarg, &cfg.rate) != 0) {
                return bench_usage("-r wants requests/s in (0, 1e9]");
            }
            break;
        case 't':
            if (bench_opt_secs(optarg, &cfg.secs) != 0) {
                return bench_usage("-t wants seconds in (0, 3600]");
            }
            break;
        case 'i':
            if (optarg[0] == '\0' || strlen(optarg) > 8
                || strspn(optarg, "0123456789abcdefghijklmnopqrstuvwxyz") != strlen(optarg)) {
                return bench_usage("-i wants 1 to 8 characters of [0-9a-z]");
            }
            fixed_id = optarg;
            break;
        case 'N': cfg.no_preload = true; break;
        case 'R': cfg.reset = true; break;
        case 'C': cfg.copy = true; break;
        case 'q': cfg.quiet = true; break;
        case 'h':
            fputs(bench_usage_text, stdout);
            return 0;
        default:
            return bench_usage(NULL);
        }
    }
    if (optind != argc) {
        return bench_usage("unexpected operand");
    }
    if (cfg.no_preload && (fixed_id == NULL || mode_put(&cfg) || cfg.mode == MODE_MEMCPY ||
                           cfg.reset)) {
        return bench_usage("-N is for get/get_into/exists with -i, and not with -R");
    }
    if (mode_shm(&cfg) && strncmp(cfg.addr, "unix:", 5) != 0 && strchr(cfg.addr, '/') == NULL) {
        return bench_usage("put_from and get_into need the Unix socket (-S path)");
    }
    if (!size_given) {
        cfg.vsize = cfg.mode == MODE_EXISTS ? 64 : 1u << 20;
    }
    if (cfg.conns < 1 || cfg.conns > BENCH_MAX_CONNS || cfg.depth < 1 ||
        cfg.depth > BENCH_MAX_DEPTH || cfg.batch < 1) {
        return bench_usage("need 1 <= conns <= 1024, 1 <= depth <= 64, batch >= 1");
    }

    if (mode_shm(&cfg) || cfg.mode == MODE_MEMCPY) {
        size_t n = (size_t)cfg.batch * (size_t)cfg.depth;
        if (cfg.vsize == 0 || n > SIZE_MAX / cfg.vsize) {
            return bench_usage("batch x depth x size must be a size above 0");
        }
    }
    if (cfg.mode == MODE_MEMCPY) {
        if (cfg.reset || cfg.no_preload) {
            return bench_usage("memcpy talks to no daemon: no -R, -N");
        }
        if (cfg.keys == 0) {
            uint64_t per = BENCH_MEMCPY_SRC / (uint64_t)cfg.conns / cfg.vsize;
            cfg.keys = per < 1 ? 1 : per;
        }
    } else {
        int rc = bench_control(&cfg);
        if (rc != 0) {
            return rc;
        }
    }
    if (!mode_put(&cfg) && cfg.mode != MODE_MEMCPY && cfg.keys == 0) {
        uint64_t per = BENCH_WORKSET / (uint64_t)cfg.conns / (cfg.vsize ? cfg.vsize : 1);
        uint64_t lo = (uint64_t)cfg.batch * (uint64_t)cfg.depth;
        cfg.keys = per < lo ? lo : per > 16384 ? 16384 : per;
    }
    if (fixed_id != NULL) {
        size_t len = strlen(fixed_id);
        memset(cfg.runid, '0', 8);              /* left-padded: keys keep their length */
        memcpy(cfg.runid + 8 - len, fixed_id, len);
        cfg.runid[8] = '\0';
    } else {
        snprintf(cfg.runid, sizeof(cfg.runid), "%08x",
                 (unsigned)(bench_now_ns() ^ ((uint64_t)getpid() << 16)));
    }
    if (bench_pattern_create(cfg.vsize, cfg.mode == MODE_PUT && !cfg.copy, bench_value_fill,
                             "kvstash-bench", &cfg.values) != 0) {
        fputs("kvstash-bench: out of memory\n", stderr);
        return 3;
    }
    cfg.pattern = bench_pattern_bytes(cfg.values);
    signal(SIGPIPE, SIG_IGN); /* sendfile has no MSG_NOSIGNAL */

    /* the bin header every value shares */
    msgpack_sbuffer vsb;
    msgpack_packer vpk;
    msgpack_sbuffer_init(&vsb);
    msgpack_packer_init(&vpk, &vsb, bench_sbuf_write);
    msgpack_pack_bin(&vpk, cfg.vsize);
    memcpy(cfg.vhdr, vsb.data, vsb.size);
    cfg.vhdrlen = vsb.size;
    msgpack_sbuffer_destroy(&vsb);

    struct bench_thread *th = calloc((size_t)cfg.conns, sizeof(*th));
    pthread_barrier_t barrier;
    if (th == NULL) {
        fputs("kvstash-bench: out of memory\n", stderr);
        return 3;
    }
    pthread_barrier_init(&barrier, NULL, (unsigned)cfg.conns + 1);
    for (int i = 0; i < cfg.conns; i++) {
        struct bench_thread *t = &th[i];
        t->id = i;
        t->cfg = &cfg;
        t->barrier = &barrier;
        t->fd = -1;
        t->fill_max = BENCH_RBUF;
        t->rbuf = malloc(BENCH_RBUF);
        t->sink = malloc(cfg.vsize ? cfg.vsize : 1);
        t->check = malloc(cfg.vsize ? cfg.vsize : 1);
        t->scratch = calloc(2 * (size_t)cfg.batch + 1, sizeof(*t->scratch));
        if (t->rbuf == NULL || t->sink == NULL || t->check == NULL || t->scratch == NULL) {
            fputs("kvstash-bench: out of memory\n", stderr);
            return 3;
        }
        if (pthread_create(&t->tid, NULL, bench_thread_main, t) != 0) {
            fputs("kvstash-bench: cannot start threads\n", stderr);
            return 3;
        }
    }
    if (!cfg.quiet) {
        fprintf(stderr,
                "kvstash-bench: %s %s x %zu bytes, batch %u, %d conns, depth %d, %.1f s%s\n",
                cfg.addr, bench_mode_names[cfg.mode], cfg.vsize, cfg.batch, cfg.conns, cfg.depth,
                cfg.secs, mode_put(&cfg) || cfg.no_preload ? "" :
                cfg.mode == MODE_MEMCPY ? " (populating the source)" : " (preloading)");
    }
    pthread_barrier_wait(&barrier);
    struct bench_run run = {
        .mode = bench_mode_names[cfg.mode], .vsize = cfg.vsize, .batch = cfg.batch,
        .conns = cfg.conns, .depth = cfg.depth, .pid = cfg.pid,
    };
    bench_run_begin(&run);
    pthread_barrier_wait(&barrier);
    for (int i = 0; i < cfg.conns; i++) {
        pthread_join(th[i].tid, NULL);
    }
    bench_run_end(&run);

    static struct bench_totals tot;
    uint64_t mism = 0;
    int failed = 0;
    for (int i = 0; i < cfg.conns; i++) {
        struct bench_thread *t = &th[i];
        bench_totals_add(&tot, t->reqs, t->keys, t->bytes, t->misses,
                         t->errors + t->mismatches, t->hist);
        mism += t->mismatches;
        if (t->fail != 0) {
            failed++;
            fprintf(stderr, "kvstash-bench: connection %d: %s\n", i, t->why);
        } else if (t->why[0] != '\0' && !cfg.quiet) {
            fprintf(stderr, "kvstash-bench: connection %d: first error: %s\n", i, t->why);
        }
        bench_thread_free(t);
    }
    bench_print_result(&run, &tot);
    if (mism > 0) {
        fprintf(stderr, "kvstash-bench: %" PRIu64 " values differed from what was stored\n", mism);
    }
    pthread_barrier_destroy(&barrier);
    free(th);
    bench_pattern_destroy(cfg.values);
    return failed ? 3 : (tot.errors ? 1 : 0);
}
