/*
 * mc_bench: a load generator for memcached's text protocol, the peer measurement of
 * `make bench`. It drives memcached with the same shapes kvstash-bench drives kvstashd
 * (connections, depth, keys per request, value size) and prints the same key=value result
 * line, so run.sh can put the two side by side.
 *
 * N threads each own one connection and keep `depth` requests in flight: a multi-key
 * `get k1 .. kB` (mode get) or B plain `set`s whose STORED replies are read (mode set).
 * The hot path allocates nothing: every request is pre-built once per slot and only its
 * key counters are rewritten in place; set values (the get preload's too) go by reference
 * (sendfile) from one shared pattern held in a sealed memfd, the command lines with sendmsg
 * (-C: values copied with sendmsg, as before); get replies are parsed incrementally from a
 * fixed read buffer with bounded line lengths, and value bodies are received straight into
 * a per-thread sink. The first value each thread gets is checked byte-exact against the
 * pattern.
 * With -P resp it speaks the Redis protocol (RESP2) instead, with the same threads, slots
 * and I/O: `GET k` (batch 1) or `MGET k1 .. kB` and `SET k v` answered `+OK`. So one client
 * can drive kvstashd's resp_listen port and redis-server (resp.sh) the way kvstash-bench
 * drives the msgpack port: blocking threads that receive each value whole, unlike
 * redis-benchmark's one event-loop thread reading 16 KiB a call.
 * It links nothing beyond libc and pthreads and must stay bounded: every run ends by time
 * (-t) or count (-n), the get preload is capped in keys and time, and a thread whose
 * connection fails stops and reports why. It owns no server: it never starts, flushes or
 * stops memcached.
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
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#include "bench_util.h"

#define MC_RBUF (64u * 1024)
#define MC_PEEK 512u                  /* refill size after a body went straight to the sink */
#define MC_MAX_LINE 1024u             /* longest reply line accepted */
#define MC_MAX_DEPTH 64
_Static_assert(MC_MAX_DEPTH <= BENCH_LOOP_MAX_DEPTH, "bench_loop_run keeps a send time per slot");
#define MC_MAX_CONNS 1024
#define MC_MAX_BATCH 4096
#define MC_MAX_BODY (1ull << 31)      /* larger VALUE lengths are a protocol error */
#define MC_KEY_LEN 25                 /* "mb" runid(8) "-" thread(3) "-" counter(10) */
#define MC_CTR_OFF 15                 /* offset of the counter digits in a key */
#define MC_WORKSET (1ull << 30)       /* default bytes of the get working set, all threads */
#define MC_PRELOAD_SECS 120           /* bound on one thread's preload */

enum mc_mode { MC_MODE_SET, MC_MODE_GET };
enum mc_proto { MC_PROTO_TEXT, MC_PROTO_RESP };

static const char *const mc_mode_names[] = { "set", "get" };

struct mc_cfg {
    const char *addr;
    enum mc_mode mode;
    enum mc_proto proto;              /* memcached text (default) or RESP2 (-P resp) */
    int conns;
    int depth;
    uint32_t batch;
    size_t vsize;
    double secs;
    double rate;                      /* -r: requests/s in all; 0 = unpaced */
    uint64_t max_reqs;                /* per connection; 0 = no limit */
    uint64_t keys;                    /* get working set per connection */
    int pid;                          /* server to charge CPU to; 0 = none */
    bool quiet;
    bool copy;                        /* -C: values copied (sendmsg), not sendfile */
    char runid[9];
    struct bench_pattern *values;     /* what every set (and get preload) sends */
    const uint8_t *pattern;           /* its vsize bytes, shared by every value */
};

/* One pre-built request. */
struct mc_slot {
    uint8_t *hdr;                     /* the request text, values excluded */
    size_t hdrlen;
    size_t *ctr_off;                  /* batch offsets of key counter digits in hdr */
    struct iovec *iov;
    size_t niov;
};

struct mc_thread {
    int id;
    pthread_t tid;
    const struct mc_cfg *cfg;
    pthread_barrier_t *barrier;
    int fd;
    uint8_t *rbuf;
    size_t rpos, rlen, fill_max;
    uint8_t *sink;                    /* get bodies land here */
    uint8_t *check;                   /* ... or here, when verifying */
    struct mc_slot slots[MC_MAX_DEPTH];
    struct mc_slot preload;           /* a set slot for the get preload */
    struct iovec *scratch;            /* working copy of a slot's iov for partial writes */
    uint64_t ctr;
    /* results */
    uint64_t reqs, keys, bytes, misses, errors, mismatches;
    uint64_t hist[BENCH_HIST];
    int fail;
    char why[160];
};

/* ---- small helpers (the shared ones are in bench_util.c) ---- */

static void
mc_key(char *dst, const struct mc_cfg *cfg, int thread, uint64_t ctr)
{
    char tmp[48];

    snprintf(tmp, sizeof(tmp), "mb%.8s-%03u-%010" PRIu64, cfg->runid, (unsigned)thread % 1000,
             (uint64_t)(ctr % 10000000000ull));
    memcpy(dst, tmp, MC_KEY_LEN);
}

/* ---- connection ---- */

static int
mc_fail(struct mc_thread *t, int rc, const char *what)
{
    if (t->fail == 0) {
        t->fail = rc;
        snprintf(t->why, sizeof(t->why), "%s%s%s", what, rc < 0 ? ": " : "",
                 rc < 0 ? strerror(-rc) : "");
    }
    return rc < 0 ? rc : -EPROTO;
}

/* mc_note: remember the first non-fatal error of a thread. */
static void
mc_note(struct mc_thread *t, const char *what, const uint8_t *line, size_t len)
{
    t->errors++;
    if (t->why[0] == '\0') {
        snprintf(t->why, sizeof(t->why), "%s: %.*s", what, (int)(len < 100 ? len : 100),
                 (const char *)line);
    }
}

static int
mc_send(struct mc_thread *t, const struct mc_slot *s)
{
    memcpy(t->scratch, s->iov, s->niov * sizeof(*s->iov));
    int rc = bench_send_pattern(t->fd, t->scratch, s->niov, t->cfg->values);
    return rc != 0 ? mc_fail(t, rc, "send") : 0;
}

/* ---- incremental reply reader ---- */

static ssize_t
mc_recv(struct mc_thread *t, void *buf, size_t len, int flags)
{
    for (;;) {
        ssize_t r = recv(t->fd, buf, len, flags);
        if (r > 0) {
            return r;
        }
        if (r == 0) {
            return mc_fail(t, -ECONNRESET, "server closed the connection");
        }
        if (errno != EINTR) {
            return mc_fail(t, -errno, "recv");
        }
    }
}

/* mc_more: compact the read buffer and receive at least one more byte. */
static int
mc_more(struct mc_thread *t)
{
    size_t have = t->rlen - t->rpos;

    if (t->rpos > 0) {
        memmove(t->rbuf, t->rbuf + t->rpos, have);
        t->rpos = 0;
        t->rlen = have;
    }
    size_t want = MC_RBUF - t->rlen;
    if (want > t->fill_max) {
        want = t->fill_max;
    }
    if (want == 0) {
        return mc_fail(t, -EPROTO, "read buffer full");
    }
    ssize_t r = mc_recv(t, t->rbuf + t->rlen, want, 0);
    if (r < 0) {
        return (int)r;
    }
    t->rlen += (size_t)r;
    return 0;
}

/* mc_line: the next reply line (without CRLF) as a pointer into rbuf, valid until the next
 * read; lines longer than MC_MAX_LINE are a protocol error. */
static int
mc_line(struct mc_thread *t, const uint8_t **line, size_t *len)
{
    size_t scanned = 0;

    for (;;) {
        const uint8_t *base = t->rbuf + t->rpos;
        size_t have = t->rlen - t->rpos;
        const uint8_t *nl = have > scanned ? memchr(base + scanned, '\n', have - scanned) : NULL;
        if (nl != NULL) {
            size_t n = (size_t)(nl - base);
            if (n == 0 || base[n - 1] != '\r') {
                return mc_fail(t, -EPROTO, "reply line not ended by CRLF");
            }
            if (n - 1 > MC_MAX_LINE) {
                return mc_fail(t, -EPROTO, "reply line too long");
            }
            *line = base;
            *len = n - 1;
            t->rpos += n + 1;
            return 0;
        }
        if (have > MC_MAX_LINE) {
            return mc_fail(t, -EPROTO, "reply line too long");
        }
        scanned = have;
        int rc = mc_more(t);
        if (rc != 0) {
            return rc;
        }
    }
}

/* mc_body: len value bytes into dst (cap bytes; beyond that they are received and dropped),
 * then the CRLF that ends a data block. */
static int
mc_body(struct mc_thread *t, uint8_t *dst, size_t cap, uint64_t len)
{
    size_t off = 0;

    while (len > 0) {
        size_t have = t->rlen - t->rpos;
        size_t room = cap - off;
        if (room == 0) {
            off = 0; /* overlong body: recycle the buffer */
            room = cap;
        }
        size_t want = len < room ? (size_t)len : room;
        if (have > 0) {
            size_t take = want < have ? want : have;
            memcpy(dst + off, t->rbuf + t->rpos, take);
            t->rpos += take;
            off += take;
            len -= take;
            continue;
        }
        ssize_t r = mc_recv(t, dst + off, want, MSG_WAITALL);
        if (r < 0) {
            return (int)r;
        }
        off += (size_t)r;
        len -= (uint64_t)r;
    }
    while (t->rlen - t->rpos < 2) {
        int rc = mc_more(t);
        if (rc != 0) {
            return rc;
        }
    }
    if (t->rbuf[t->rpos] != '\r' || t->rbuf[t->rpos + 1] != '\n') {
        return mc_fail(t, -EPROTO, "data block not ended by CRLF");
    }
    t->rpos += 2;
    return 0;
}

static bool
mc_is(const uint8_t *line, size_t len, const char *word)
{
    size_t n = strlen(word);
    return len == n && memcmp(line, word, n) == 0;
}

static bool
mc_starts(const uint8_t *line, size_t len, const char *word)
{
    size_t n = strlen(word);
    return len >= n && memcmp(line, word, n) == 0;
}

/* mc_value_len: the bytes field of "VALUE <key> <flags> <bytes>[ <cas>]", or -1; the key
 * must be one of ours. */
static int64_t
mc_value_len(const struct mc_thread *t, const uint8_t *line, size_t len)
{
    char buf[MC_MAX_LINE + 1];
    char *save = NULL;

    memcpy(buf, line, len);
    buf[len] = '\0';
    char *tok = strtok_r(buf, " ", &save);            /* VALUE */
    char *key = strtok_r(NULL, " ", &save);
    char *flags = strtok_r(NULL, " ", &save);
    char *bytes = strtok_r(NULL, " ", &save);
    if (tok == NULL || key == NULL || flags == NULL || bytes == NULL ||
        strlen(key) != MC_KEY_LEN || memcmp(key, "mb", 2) != 0 ||
        memcmp(key + 2, t->cfg->runid, 8) != 0) {
        return -1;
    }
    char *end;
    errno = 0;
    unsigned long long v = strtoull(bytes, &end, 10);
    if (errno != 0 || end == bytes || *end != '\0' || v > MC_MAX_BODY) {
        return -1;
    }
    return (int64_t)v;
}

/* mc_set_replies: n replies to sets; each STORED counts a key when count is set. */
static int
mc_set_replies(struct mc_thread *t, uint32_t n, bool count)
{
    const struct mc_cfg *cfg = t->cfg;

    for (uint32_t i = 0; i < n; i++) {
        const uint8_t *line;
        size_t len;
        int rc = mc_line(t, &line, &len);
        if (rc != 0) {
            return rc;
        }
        if (mc_is(line, len, cfg->proto == MC_PROTO_RESP ? "+OK" : "STORED")) {
            if (count) {
                t->keys++;
                t->bytes += cfg->vsize;
            }
        } else if (!count) {
            t->why[0] = '\0';
            mc_note(t, "preload set answered", line, len);
            t->fail = -EPROTO;
            return -EPROTO;
        } else {
            mc_note(t, "set answered", line, len);
        }
    }
    return 0;
}

/* mc_resp_int: the number after a RESP reply line's type byte, or -2 when malformed. */
static int64_t
mc_resp_int(const uint8_t *line, size_t len)
{
    int64_t v = 0;
    size_t i = 1;
    bool neg = len > 1 && line[1] == '-';

    i += neg;
    if (i >= len || len - i > 11) {
        return -2;
    }
    for (; i < len; i++) {
        if (line[i] < '0' || line[i] > '9') {
            return -2;
        }
        v = v * 10 + (line[i] - '0');
    }
    return neg ? (v == 1 ? -1 : -2) : v;
}

/*
 * mc_value_take: the vlen bytes of a value that came back: counted and, with check, compared
 * with the pattern when vlen is the size set; otherwise counted an error and dropped.
 */
static int
mc_value_take(struct mc_thread *t, uint64_t vlen, bool check)
{
    const struct mc_cfg *cfg = t->cfg;
    size_t cap = cfg->vsize ? cfg->vsize : 1;
    int rc;

    if (vlen != cfg->vsize) {
        t->errors++;
        return mc_body(t, t->sink, cap, vlen);
    }
    rc = mc_body(t, check ? t->check : t->sink, cap, vlen);
    if (rc != 0) {
        return rc;
    }
    if (check && memcmp(t->check, cfg->pattern, cfg->vsize) != 0) {
        t->mismatches++;
    }
    t->keys++;
    t->bytes += cfg->vsize;
    return 0;
}

/*
 * mc_resp_line: the next RESP reply line into line and len: 0; 1 when it is an error reply
 * (noted as what answered it); or mc_line's -errno.
 */
static int
mc_resp_line(struct mc_thread *t, const char *what, const uint8_t **line, size_t *len)
{
    int rc = mc_line(t, line, len);

    if (rc != 0) {
        return rc;
    }
    if (*len > 0 && (*line)[0] == '-') {
        mc_note(t, what, *line, *len);
        return 1;
    }
    return 0;
}

/* mc_resp_value: one bulk of a GET or MGET reply ($len and the value, or $-1: a miss). */
static int
mc_resp_value(struct mc_thread *t, bool check)
{
    const uint8_t *line;
    size_t len;
    int rc = mc_resp_line(t, "get answered", &line, &len);

    if (rc != 0) {
        return rc < 0 ? rc : 0;
    }
    int64_t vlen = len > 0 && line[0] == '$' ? mc_resp_int(line, len) : -2;
    if (vlen == -1) {
        t->misses++;
        return 0;
    }
    if (vlen < 0 || (uint64_t)vlen > MC_MAX_BODY) {
        return mc_fail(t, -EPROTO, "malformed bulk reply");
    }
    return mc_value_take(t, (uint64_t)vlen, check);
}

/* mc_resp_get_reply: the reply to a GET (batch 1) or an MGET of batch keys. */
static int
mc_resp_get_reply(struct mc_thread *t, bool verify)
{
    const struct mc_cfg *cfg = t->cfg;

    if (cfg->batch > 1) {
        const uint8_t *line;
        size_t len;
        int rc = mc_resp_line(t, "mget answered", &line, &len);
        if (rc != 0) {
            return rc < 0 ? rc : 0;
        }
        if (len == 0 || line[0] != '*' || mc_resp_int(line, len) != (int64_t)cfg->batch) {
            return mc_fail(t, -EPROTO, "malformed MGET reply");
        }
    }
    for (uint32_t i = 0; i < cfg->batch; i++) {
        int rc = mc_resp_value(t, verify && i == 0);
        if (rc != 0) {
            return rc;
        }
    }
    return 0;
}

/* mc_get_reply: the reply to one multi-key get: VALUE blocks then END. */
static int
mc_get_reply(struct mc_thread *t, bool verify)
{
    const struct mc_cfg *cfg = t->cfg;
    uint32_t hits = 0;

    if (cfg->proto == MC_PROTO_RESP) {
        return mc_resp_get_reply(t, verify);
    }

    for (;;) {
        const uint8_t *line;
        size_t len;
        int rc = mc_line(t, &line, &len);
        if (rc != 0) {
            return rc;
        }
        if (mc_is(line, len, "END")) {
            break;
        }
        if (!mc_starts(line, len, "VALUE ")) {
            /* ERROR, CLIENT_ERROR or SERVER_ERROR end the reply without END */
            mc_note(t, "get answered", line, len);
            return 0;
        }
        if (hits >= cfg->batch) {
            return mc_fail(t, -EPROTO, "more values than keys asked for");
        }
        int64_t vlen = mc_value_len(t, line, len);
        if (vlen < 0) {
            return mc_fail(t, -EPROTO, "malformed VALUE line");
        }
        hits++;
        rc = mc_value_take(t, (uint64_t)vlen, verify && hits == 1);
        if (rc != 0) {
            return rc;
        }
    }
    t->misses += cfg->batch - hits;
    return 0;
}

/* ---- request building ---- */

/*
 * mc_slot_build: a get or set request of batch keys into s; values are not copied.
 * Text: "get K1 K2 ..\r\n"; "set K 0 0 S\r\n" V "\r\nset K 0 0 S\r\n" V .. "\r\n".
 * RESP2: "*2 $3 GET $25 K" (batch 1) or "*B+1 $4 MGET $25 K1 .." for get; B x
 * "*3 $3 SET $25 K $S" V "\r\n" for set. Both are one head, then per key a prefix, the key
 * and a suffix (for set the suffix ends in the value's header, and the value follows).
 */
static int
mc_slot_build(struct mc_thread *t, struct mc_slot *s, enum mc_mode mode)
{
    const struct mc_cfg *cfg = t->cfg;
    bool resp = cfg->proto == MC_PROTO_RESP;
    uint32_t b = cfg->batch;
    char key[MC_KEY_LEN + 1];
    char head[32], pre[48], post[48];
    const char *end = "";

    head[0] = pre[0] = post[0] = '\0';
    if (mode == MC_MODE_GET && resp) {
        if (b == 1) {
            snprintf(head, sizeof(head), "*2\r\n$3\r\nGET\r\n");
        } else {
            snprintf(head, sizeof(head), "*%u\r\n$4\r\nMGET\r\n", b + 1);
        }
        snprintf(pre, sizeof(pre), "$%u\r\n", (unsigned)MC_KEY_LEN);
        snprintf(post, sizeof(post), "\r\n");
    } else if (mode == MC_MODE_GET) {
        snprintf(head, sizeof(head), "get");
        snprintf(pre, sizeof(pre), " ");
        end = "\r\n";
    } else if (resp) {
        snprintf(pre, sizeof(pre), "*3\r\n$3\r\nSET\r\n$%u\r\n", (unsigned)MC_KEY_LEN);
        snprintf(post, sizeof(post), "\r\n$%zu\r\n", cfg->vsize);
    } else {
        snprintf(pre, sizeof(pre), "set ");
        snprintf(post, sizeof(post), " 0 0 %zu\r\n", cfg->vsize);
    }
    size_t hl = strlen(head), pl = strlen(pre), ql = strlen(post), el = strlen(end);
    size_t cap = hl + (size_t)b * (2 + pl + MC_KEY_LEN + ql) + el + 2;

    s->hdr = malloc(cap);
    s->ctr_off = calloc(b, sizeof(*s->ctr_off));
    s->iov = calloc(mode == MC_MODE_GET ? 1 : 2 * (size_t)b + 1, sizeof(*s->iov));
    if (s->hdr == NULL || s->ctr_off == NULL || s->iov == NULL) {
        return -1;
    }
    mc_key(key, cfg, t->id, 0);
    uint8_t *p = s->hdr;
    memcpy(p, head, hl);
    p += hl;
    size_t n = 0;
    for (uint32_t i = 0; i < b; i++) {
        uint8_t *seg = p;
        if (mode == MC_MODE_SET && i > 0) {
            memcpy(p, "\r\n", 2);         /* the previous value's end */
            p += 2;
        }
        memcpy(p, pre, pl);
        p += pl;
        memcpy(p, key, MC_KEY_LEN);
        s->ctr_off[i] = (size_t)(p - s->hdr) + MC_CTR_OFF;
        p += MC_KEY_LEN;
        memcpy(p, post, ql);
        p += ql;
        if (mode == MC_MODE_SET) {
            s->iov[n].iov_base = seg;
            s->iov[n++].iov_len = (size_t)(p - seg);
            s->iov[n].iov_base = (void *)cfg->pattern;
            s->iov[n++].iov_len = cfg->vsize;
        }
    }
    if (mode == MC_MODE_GET) {
        memcpy(p, end, el);
        p += el;
        s->hdrlen = (size_t)(p - s->hdr);
        s->iov[0].iov_base = s->hdr;
        s->iov[0].iov_len = s->hdrlen;
        s->niov = 1;
        return 0;
    }
    memcpy(p, "\r\n", 2);
    s->iov[n].iov_base = p;
    s->iov[n++].iov_len = 2;
    p += 2;
    s->hdrlen = (size_t)(p - s->hdr);
    s->niov = n;
    return 0;
}

static void
mc_slot_free(struct mc_slot *s)
{
    free(s->hdr);
    free(s->ctr_off);
    free(s->iov);
}

/* mc_slot_keys: the next batch of key counters into s. */
static void
mc_slot_keys(struct mc_thread *t, struct mc_slot *s)
{
    const struct mc_cfg *cfg = t->cfg;

    for (uint32_t i = 0; i < cfg->batch; i++) {
        uint64_t k = cfg->mode == MC_MODE_SET ? t->ctr : t->ctr % cfg->keys;
        bench_key_ctr(s->hdr + s->ctr_off[i], k);
        t->ctr++;
    }
}

/* ---- threads ---- */

/* mc_preload: set this thread's get working set, one batch at a time, bounded in time. */
static int
mc_preload(struct mc_thread *t)
{
    const struct mc_cfg *cfg = t->cfg;
    uint64_t deadline = bench_now_ns() + (uint64_t)MC_PRELOAD_SECS * 1000000000ull;
    struct mc_slot *s = &t->preload;

    t->ctr = 0;
    for (uint64_t done = 0; done < cfg->keys; done += cfg->batch) {
        for (uint32_t i = 0; i < cfg->batch; i++) {
            bench_key_ctr(s->hdr + s->ctr_off[i], (done + i) % cfg->keys);
        }
        int rc = mc_send(t, s);
        if (rc == 0) {
            rc = mc_set_replies(t, cfg->batch, false);
        }
        if (rc != 0) {
            return rc;
        }
        if (bench_now_ns() > deadline) {
            return mc_fail(t, -ETIMEDOUT, "preload");
        }
    }
    t->ctr = 0;
    return 0;
}

/* mc_loop_send, _reply, _buffered: bench_loop_run's calls for a thread of this tool. */
static int
mc_loop_send(void *arg, int s)
{
    struct mc_thread *t = arg;

    mc_slot_keys(t, &t->slots[s]);
    return mc_send(t, &t->slots[s]);
}

static int
mc_loop_reply(void *arg, int s)
{
    struct mc_thread *t = arg;

    (void)s;                            /* replies come in order: the oldest is the next */
    return t->cfg->mode == MC_MODE_GET ? mc_get_reply(t, t->reqs == 0)
                                       : mc_set_replies(t, t->cfg->batch, true);
}

static bool
mc_loop_buffered(void *arg)
{
    const struct mc_thread *t = arg;

    return t->rpos != t->rlen;
}

static void *
mc_thread_main(void *arg)
{
    struct mc_thread *t = arg;
    const struct mc_cfg *cfg = t->cfg;
    int depth = cfg->depth;
    int rc = bench_connect(cfg->addr, cfg->proto == MC_PROTO_RESP ? "6379" : "11211", 0, &t->fd);

    if (rc != 0) {
        mc_fail(t, rc, "connect");
    } else if (cfg->mode == MC_MODE_GET) {
        rc = mc_preload(t);
    }
    /* bodies are large: after one went to the sink, peek at the next header only */
    t->fill_max = cfg->vsize >= 4096 ? MC_PEEK : MC_RBUF;
    pthread_barrier_wait(t->barrier); /* everyone ready */
    pthread_barrier_wait(t->barrier); /* main took the start time */
    if (rc != 0) {
        return NULL;
    }
    struct bench_loop l = {
        .arg = t, .fd = t->fd, .depth = depth, .thread = t->id, .threads = cfg->conns,
        .secs = cfg->secs, .rate = cfg->rate, .max_reqs = cfg->max_reqs,
        .reqs = &t->reqs, .hist = t->hist,
        .send = mc_loop_send, .reply = mc_loop_reply, .buffered = mc_loop_buffered,
    };
    bench_loop_run(&l);
    return NULL;
}

static void
mc_thread_free(struct mc_thread *t)
{
    if (t->fd >= 0) {
        close(t->fd);
    }
    for (int s = 0; s < MC_MAX_DEPTH; s++) {
        mc_slot_free(&t->slots[s]);
    }
    mc_slot_free(&t->preload);
    free(t->scratch);
    free(t->rbuf);
    free(t->sink);
    free(t->check);
}

static const char mc_usage_text[] =
    "usage: mc-bench [-H host:port] [-P text|resp] [-m get|set] [-c conns] [-d depth]\n"
    "                [-b batch] [-s size] [-t seconds] [-n requests] [-k keys] [-p pid]\n"
    "                [-r rate] [-C] [-q]\n"
    "  -P PROTO    text: memcached's text protocol (default); resp: Redis's RESP2\n"
    "              (GET, or MGET for batch > 1; SET answered +OK)\n"
    "  -m MODE     multi-key get or set load (default get; put is an alias of set)\n"
    "  -c N        connections, one thread each (default 1, at most 1024)\n"
    "  -d N        requests in flight per connection (default 2, at most 64)\n"
    "  -b N        keys per request (default 8, at most 4096)\n"
    "  -s SIZE     value size: 4096, 64k, 1m, 4m (default 1m)\n"
    "  -t SECS     run time (default 5)\n"
    "  -n N        stop each connection after N requests (default: time only)\n"
    "  -r RATE     pace the run at RATE requests/s in all (RATE / conns per connection,\n"
    "              each thread sleeping until its next send is due; still at most depth in\n"
    "              flight); default: as fast as the server answers\n"
    "  -k N        keys preloaded per connection for get (default: ~1 GiB in all)\n"
    "  -p PID      charge the server's CPU time (/proc/PID/stat) to the bytes moved\n"
    "  -C          send set values (and the get preload's) by copying (sendmsg), as\n"
    "              before, instead of by reference (sendfile from a sealed memfd)\n"
    "  -q          print only the result line\n"
    "Target: -H, else 127.0.0.1:11211 (text) or 127.0.0.1:6379 (resp).\n"
    "Output: mode size batch conns depth secs GB/s keys/s req/s p50_us p99_us misses errors\n";

static int
mc_usage(const char *why)
{
    return bench_print_usage("mc-bench", mc_usage_text, why);
}

int
main(int argc, char **argv)
{
    struct mc_cfg cfg = {
        .addr = "127.0.0.1:11211", .mode = MC_MODE_GET, .conns = 1, .depth = 2, .batch = 8,
        .vsize = 1u << 20, .secs = 5,
    };
    int opt;
    bool addr_set = false;

    while ((opt = getopt(argc, argv, "H:P:m:c:d:b:s:t:n:k:p:r:Cqh")) != -1) {
        long long v = 0;
        if (strchr("cdbnkp", opt) != NULL && bench_opt_count(optarg, &v) != 0) {
            return mc_usage("numeric option expected");
        }
        switch (opt) {
        case 'H':
            cfg.addr = optarg;
            addr_set = true;
            break;
        case 'P':
            if (strcmp(optarg, "text") == 0) {
                cfg.proto = MC_PROTO_TEXT;
            } else if (strcmp(optarg, "resp") == 0) {
                cfg.proto = MC_PROTO_RESP;
            } else {
                return mc_usage("-P wants text or resp");
            }
            break;
        case 'm':
            if (strcmp(optarg, "set") == 0 || strcmp(optarg, "put") == 0) {
                cfg.mode = MC_MODE_SET;
            } else if (strcmp(optarg, "get") == 0) {
                cfg.mode = MC_MODE_GET;
            } else {
                return mc_usage("-m wants get or set");
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
                return mc_usage("-s wants a size like 4096, 64k, 1m");
            }
            break;
        case 'r':
            if (bench_opt_rate(optarg, &cfg.rate) != 0) {
                return mc_usage("-r wants requests/s in (0, 1e9]");
            }
            break;
        case 't':
            if (bench_opt_secs(optarg, &cfg.secs) != 0) {
                return mc_usage("-t wants seconds in (0, 3600]");
            }
            break;
        case 'C': cfg.copy = true; break;
        case 'q': cfg.quiet = true; break;
        case 'h':
            fputs(mc_usage_text, stdout);
            return 0;
        default:
            return mc_usage(NULL);
        }
    }
    if (optind != argc) {
        return mc_usage("unexpected operand");
    }
    if (!addr_set && cfg.proto == MC_PROTO_RESP) {
        cfg.addr = "127.0.0.1:6379";
    }
    if (cfg.conns < 1 || cfg.conns > MC_MAX_CONNS || cfg.depth < 1 ||
        cfg.depth > MC_MAX_DEPTH || cfg.batch < 1 || cfg.batch > MC_MAX_BATCH) {
        return mc_usage("need 1 <= conns <= 1024, 1 <= depth <= 64, 1 <= batch <= 4096");
    }
    if (cfg.vsize < 1 || cfg.vsize > MC_MAX_BODY) {
        return mc_usage("-s wants 1 byte .. 2 GiB");
    }
    if (cfg.mode == MC_MODE_GET && cfg.keys == 0) {
        uint64_t per = MC_WORKSET / (uint64_t)cfg.conns / cfg.vsize;
        uint64_t lo = (uint64_t)cfg.batch * (uint64_t)cfg.depth;
        cfg.keys = per < lo ? lo : per > 16384 ? 16384 : per;
    }
    signal(SIGPIPE, SIG_IGN); /* sendfile has no MSG_NOSIGNAL */
    snprintf(cfg.runid, sizeof(cfg.runid), "%08x",
             (unsigned)(bench_now_ns() ^ ((uint64_t)getpid() << 16)));
    /* the get preload sends by reference too: its check then covers what set sends */
    if (bench_pattern_create(cfg.vsize, !cfg.copy, bench_value_fill, "mc-bench", &cfg.values) != 0) {
        fputs("mc-bench: out of memory\n", stderr);
        return 3;
    }
    cfg.pattern = bench_pattern_bytes(cfg.values);

    struct mc_thread *th = calloc((size_t)cfg.conns, sizeof(*th));
    pthread_barrier_t barrier;
    if (th == NULL) {
        fputs("mc-bench: out of memory\n", stderr);
        return 3;
    }
    pthread_barrier_init(&barrier, NULL, (unsigned)cfg.conns + 1);
    for (int i = 0; i < cfg.conns; i++) {
        struct mc_thread *t = &th[i];
        t->id = i;
        t->cfg = &cfg;
        t->barrier = &barrier;
        t->fd = -1;
        t->fill_max = MC_RBUF;
        t->rbuf = malloc(MC_RBUF);
        t->sink = malloc(cfg.vsize);
        t->check = malloc(cfg.vsize);
        t->scratch = calloc(2 * (size_t)cfg.batch + 1, sizeof(*t->scratch));
        if (t->rbuf == NULL || t->sink == NULL || t->check == NULL || t->scratch == NULL) {
            fputs("mc-bench: out of memory\n", stderr);
            return 3;
        }
        for (int s = 0; s < cfg.depth; s++) {
            if (mc_slot_build(t, &t->slots[s], cfg.mode) != 0) {
                fputs("mc-bench: out of memory\n", stderr);
                return 3;
            }
        }
        if (cfg.mode == MC_MODE_GET && mc_slot_build(t, &t->preload, MC_MODE_SET) != 0) {
            fputs("mc-bench: out of memory\n", stderr);
            return 3;
        }
        if (pthread_create(&t->tid, NULL, mc_thread_main, t) != 0) {
            fputs("mc-bench: cannot start threads\n", stderr);
            return 3;
        }
    }
    if (!cfg.quiet) {
        fprintf(stderr, "mc-bench: %s %s x %zu bytes, batch %u, %d conns, depth %d, %.1f s%s\n",
                cfg.addr, mc_mode_names[cfg.mode], cfg.vsize, cfg.batch, cfg.conns, cfg.depth,
                cfg.secs, cfg.mode == MC_MODE_SET ? "" : " (preloading)");
    }
    pthread_barrier_wait(&barrier);
    struct bench_run run = {
        .mode = mc_mode_names[cfg.mode], .vsize = cfg.vsize, .batch = cfg.batch,
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
        struct mc_thread *t = &th[i];
        bench_totals_add(&tot, t->reqs, t->keys, t->bytes, t->misses,
                         t->errors + t->mismatches, t->hist);
        mism += t->mismatches;
        if (t->fail != 0) {
            failed++;
            fprintf(stderr, "mc-bench: connection %d: %s\n", i, t->why);
        } else if (t->why[0] != '\0' && !cfg.quiet) {
            fprintf(stderr, "mc-bench: connection %d: first error: %s\n", i, t->why);
        }
        mc_thread_free(t);
    }
    bench_print_result(&run, &tot);
    if (mism > 0) {
        fprintf(stderr, "mc-bench: %" PRIu64 " values differed from what was stored\n", mism);
    }
    pthread_barrier_destroy(&barrier);
    free(th);
    bench_pattern_destroy(cfg.values);
    return failed ? 3 : (tot.errors ? 1 : 0);
}
