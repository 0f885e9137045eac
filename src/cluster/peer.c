/*
 * peer: the pool's thread and its connections (peer.h). One epoll loop: an
 * eventfd for calls handed over, one socket per peer address. A call's
 * message is written whole in order behind the calls before it on its
 * connection (pipelined), then waits in that connection's flight list for
 * the reply with its msgid. Deadlines are checked every loop turn (the wait
 * is bounded by the nearest one); a call whose deadline passes is answered
 * KV_TIMEOUT at once, and if its bytes were partly written they are still
 * finished (the stream stays whole) and the late reply is dropped.
 *
 * Replies are read into the connection's buffer and scanned with frame.h;
 * a reply to a call made with a sink (peer_call_sink) has its big bin bodies
 * offered to the sink (frame.h's spill offers) and, when taken, read
 * straight into the sink's extents (the store's pages) with holes left in
 * the buffered message, as the daemon's own connections receive a put. While
 * such a reply is due the buffer is filled in small reads, so little of a
 * body lands there first. A call that ends while its body is still arriving
 * has the rest read into a scratch buffer and dropped.
 *
 * Must not: touch the store or the request layer (the callbacks do that),
 * block anywhere but epoll_wait, or call a callback with the queue lock held.
 */
#include "peer.h"

#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include "clock.h"
#include "frame.h"
#include "kverr.h"
#include "log.h"
#include "mp.h"
#include "peer_rdma.h"
#include "peer_tls.h"
#include "prio.h"
#include "rdma_port.h"
#include "view.h"

#define PEER_ADDR_MAX 256
#define PEER_BACKOFF_MIN_MS 100
#define PEER_BACKOFF_MAX_MS 5000
#define PEER_READ_CHUNK (256u * 1024u)
#define PEER_SPILL_MIN (64u * 1024u)    /* reply bodies this long may go into a call's sink */
#define PEER_SINK_READ (16u * 1024u)    /* reads into the buffer while such a reply is due */
#define PEER_WAIT_MAX_MS 1000
#define PEER_AUTH_BACKOFF_MIN_MS 1000  /* a refused login: a setup error, retried slowly */
#define PEER_AUTH_BACKOFF_MAX_MS 60000 /* (under the 10 failures a minute that lock out an address) */
#define PEER_HELLO_ID 0u             /* msgid of the login; calls count from 1 */
#define PEER_RDMA_ID UINT32_MAX      /* msgid of rdma_connect (peer_rdma.h); never a call's */
#define PEER_RDMA_CQ 4096u           /* the pool's CQ: room for this many peers' queue pairs */
#define PEER_SEGS_IN 8               /* segments kept in the message; more are malloc'd */
#define PEER_WRITE_IOV 1024          /* iovecs per writev (IOV_MAX) */

struct peer_msg {
    struct peer_msg *next;
    char addr[PEER_ADDR_MAX];
    uint8_t head[48];               /* [0, msgid, method, (the params follow) */
    uint8_t *buf;                   /* the params (or the whole login), malloc'd */
    uint8_t *tail;                  /* peer_extra's tail, malloc'd, or NULL */
    void (*release)(void *arg);     /* peer_extra's release, once its bytes are written */
    void *release_arg;
    struct iovec *seg;              /* what is written, in order: seg_in or malloc'd */
    struct iovec seg_in[PEER_SEGS_IN];
    int nseg;
    size_t len;                     /* the bytes of all segments */
    size_t off;                     /* bytes written */
    uint32_t msgid;
    uint64_t deadline;              /* ms, clock_ms */
    peer_done_fn *done;             /* NULL once answered (timed out while being written) */
    peer_sink_done_fn *sink_done;   /* peer_call_sink's done (then done is a placeholder) */
    const struct peer_sink *sink;   /* peer_call_sink's, or NULL */
    void *arg;
    bool rdma;                      /* peer_call_rdma's: needs the connection's queue pair */
    bool into;                      /* ... and names memory the peer writes into */
};

/* DOWN -> CONNECTING -> (HANDSHAKE, with TLS) -> OPEN -> DOWN */
enum peer_conn_state { PEER_DOWN, PEER_CONNECTING, PEER_HANDSHAKE, PEER_OPEN };

struct peer_conn {
    struct peer_conn *next;
    char addr[PEER_ADDR_MAX];       /* the peer's advertised address: the calls' key */
    char dial[PEER_ADDR_MAX];       /* what was dialled: addr, or its TLS listener */
    int fd;
    struct peer_tls *tls;           /* the session when dialled over TLS, else NULL */
    enum peer_conn_state state;
    uint64_t retry_at;              /* PEER_DOWN: no dial before this (ms) */
    uint64_t backoff;
    struct peer_msg *wq, *wq_tail;  /* to write; the first may be partly written */
    struct peer_msg *fq, *fq_tail;  /* written, waiting for their replies */
    bool hello_due;                 /* the login goes first on a new connection */
    bool auth_refused;              /* the last login was refused (logged once until accepted) */
    bool login_wait;                /* nothing is written behind the login until it is answered */
    uint8_t *in;
    size_t ilen, icap;
    struct frame_scan fs;
    /* a reply's bin body being received into a call's sink (peer_call_sink) */
    bool spilling;
    struct peer_msg *sm;            /* the call whose sink takes it; NULL: dropped (it ended) */
    struct iovec siov[PEER_SINK_IOV_MAX];
    int sniov, sidx;                /* the extents; the one being filled */
    size_t soff;                    /* bytes of siov[sidx] filled */
    uint64_t sleft;                 /* body bytes still to come */
    struct mp_hole *holes;          /* the message's taken bodies (offsets into in) */
    size_t nholes, hcap;
    uint32_t events;                /* what epoll watches now */
    bool rdma_due;                  /* rdma_connect goes after the login on a new connection */
    struct peer_rdma rdma;          /* its queue pair (peer_rdma.h) */
};

struct peer_pool {
    struct peer_config cfg;
    char token[256];
    struct peer_tls_ctx *tls;       /* this member has certificates: TLS to peers that listen */
    int epfd;
    int evfd;
    pthread_t thread;
    bool started;
    _Atomic bool stop;
    pthread_mutex_t lock;           /* guards incoming, token and relogin (peer_pool_reload) */
    bool relogin;                   /* a reload changed the token or the TLS files: the
                                       connections refused for their login dial again now */
    uint64_t auth_backoff_min;      /* PEER_AUTH_BACKOFF_MIN_MS (tests: the environment's) */
    struct peer_msg *incoming, *incoming_tail;
    _Atomic uint32_t next_id;
    struct peer_conn *conns;
    struct rdma_cq *cq;             /* this node has an RDMA device: the connections' QPs' CQ */
    _Atomic uint64_t rdma_connects, rdma_fallbacks;
    _Atomic uint64_t requests, errors, timeouts, bytes_out, bytes_in, connects, in_flight;
    _Atomic uint64_t auth_failures;
};

static void
peer_add(_Atomic uint64_t *c, uint64_t n)
{
    atomic_fetch_add_explicit(c, n, memory_order_relaxed);
}

/* ---- answering ---- */

/* peer_answer: answer m once; rd is the result (status 0) or NULL. */
static void
peer_answer(struct peer_pool *p, struct peer_msg *m, int status, struct mp_reader *rd)
{
    if (m->done != NULL) {
        peer_done_fn *done = m->done;
        /* an RDMA call never sent (the connection has no queue pair) is no error */
        bool unsent = m->rdma && m->off == 0 && status == KV_UNSUPPORTED;

        m->done = NULL;
        if (status != 0 && status != KV_NOT_FOUND && !unsent) {
            peer_add(&p->errors, 1);
            peer_add(&p->timeouts, status == KV_TIMEOUT);
        }
        atomic_fetch_sub_explicit(&p->in_flight, 1, memory_order_relaxed);
        if (m->sink_done != NULL) {
            m->sink_done(m->arg, status, rd);
        } else {
            done(m->arg, status, rd != NULL ? rd->p : NULL,
                 rd != NULL ? (size_t)(rd->end - rd->p) : 0);
        }
    }
}

/* peer_sink_mark: the done of a peer_call_sink call (its sink_done is called instead). */
static void
peer_sink_mark(void *arg, int status, const uint8_t *result, size_t len)
{
    (void)arg;
    (void)status;
    (void)result;
    (void)len;
}

/* peer_msg_written: its bytes are on the wire (or never will be): let go of them. */
static void
peer_msg_written(struct peer_msg *m)
{
    free(m->buf);
    m->buf = NULL;
    free(m->tail);
    m->tail = NULL;
    if (m->release != NULL) {
        m->release(m->release_arg);
        m->release = NULL;
    }
    if (m->seg != m->seg_in) {
        free(m->seg);
        m->seg = m->seg_in;
    }
    m->nseg = 0;
}

static void
peer_msg_free(struct peer_msg *m)
{
    if (m != NULL) {
        peer_msg_written(m);
        free(m);
    }
}

/* peer_fail_list: answer and free every message of a list. */
static void
peer_fail_list(struct peer_pool *p, struct peer_msg *m, int status)
{
    while (m != NULL) {
        struct peer_msg *next = m->next;

        peer_answer(p, m, status, NULL);
        peer_msg_free(m);
        m = next;
    }
}

/* ---- connections ---- */

static void
peer_watch(struct peer_pool *p, struct peer_conn *c, uint32_t events)
{
    struct epoll_event ev = {.events = events, .data.ptr = c};

    if (c->fd >= 0 && c->events != events) {
        if (epoll_ctl(p->epfd, EPOLL_CTL_MOD, c->fd, &ev) == 0) {
            c->events = events;
        }
    }
}

/* peer_conn_close: the socket (and its TLS session) closed, out of epoll. */
static void
peer_conn_close(struct peer_pool *p, struct peer_conn *c)
{
    if (c->fd >= 0) {
        epoll_ctl(p->epfd, EPOLL_CTL_DEL, c->fd, NULL);
        peer_tls_close(c->tls);
        c->tls = NULL;
        close(c->fd);
        c->fd = -1;
    }
}

/* peer_conn_down: the connection failed: fail what it carries; dial again after the backoff. */
static void
peer_conn_down(struct peer_pool *p, struct peer_conn *c, const char *why, int err)
{
    peer_rdma_stop(&c->rdma, PEER_RDMA_NONE);  /* before the calls fail: no write lands later */
    if (c->fd >= 0) {
        log_warn("peer %s: %s%s%s; its requests fail, next dial in %llu ms", c->dial, why,
                 err ? ": " : "", err ? strerror(err) : "",
                 (unsigned long long)c->backoff);
        peer_conn_close(p, c);
    }
    c->state = PEER_DOWN;
    c->retry_at = clock_ms() + c->backoff;
    c->backoff = c->backoff * 2 > PEER_BACKOFF_MAX_MS ? PEER_BACKOFF_MAX_MS : c->backoff * 2;
    peer_fail_list(p, c->fq, KV_UNAVAILABLE);
    c->fq = c->fq_tail = NULL;
    peer_fail_list(p, c->wq, KV_UNAVAILABLE);
    c->wq = c->wq_tail = NULL;
    c->ilen = 0;
    c->spilling = false;
    c->sm = NULL;
    c->nholes = 0;
    c->login_wait = false;
}

/*
 * peer_conn_refused: the peer refused the login: down without another log
 * line (peer_login_answer logged it), dialled again after 1 s doubling to 60 s.
 */
static void
peer_conn_refused(struct peer_pool *p, struct peer_conn *c)
{
    uint64_t next;

    peer_conn_close(p, c);
    if (c->backoff < p->auth_backoff_min) {
        c->backoff = p->auth_backoff_min;
    }
    next = c->backoff * 2 > PEER_AUTH_BACKOFF_MAX_MS ? PEER_AUTH_BACKOFF_MAX_MS : c->backoff * 2;
    peer_conn_down(p, c, "", 0);    /* fd closed: fails what it carried, quietly */
    c->backoff = next;
}

/* peer_split: "host:port" (or "[v6]:port") into host and port. 0 or -EINVAL. */
static int
peer_split(const char *addr, char *host, size_t hcap, char *port, size_t pcap)
{
    const char *colon = strrchr(addr, ':');
    size_t hl;

    if (colon == NULL || colon == addr || colon[1] == '\0' || strlen(colon + 1) >= pcap) {
        return -EINVAL;
    }
    hl = (size_t)(colon - addr);
    if (addr[0] == '[' && hl >= 2 && addr[hl - 1] == ']') {
        addr++;
        hl -= 2;
    }
    if (hl >= hcap) {
        return -EINVAL;
    }
    memcpy(host, addr, hl);
    host[hl] = '\0';
    strcpy(port, colon + 1);
    return 0;
}

/*
 * peer_dial_addr: what to dial for c: with a TLS context here and a TLS listener in the
 * current view for the member at c->addr, that listener; else c->addr.
 */
static void
peer_dial_addr(struct peer_pool *p, struct peer_conn *c)
{
    struct cluster_view *v;

    snprintf(c->dial, sizeof(c->dial), "%s", c->addr);
    if (p->tls == NULL || (v = view_acquire()) == NULL) {
        return;
    }
    for (size_t i = 0; i < v->n; i++) {
        if (strcmp(v->nodes[i].addr, c->addr) == 0 && v->nodes[i].tls[0] != '\0') {
            snprintf(c->dial, sizeof(c->dial), "%s", v->nodes[i].tls);
            break;
        }
    }
    view_release(v);
}

/* peer_dial: start a non-blocking connect. 0 (connecting or connected) or -errno. */
static int
peer_dial(struct peer_pool *p, struct peer_conn *c)
{
    char host[PEER_ADDR_MAX], port[16];
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM};
    struct addrinfo *ai = NULL;
    struct epoll_event ev;
    int one = 1;
    int rc, fd;

    peer_dial_addr(p, c);
    if (peer_split(c->dial, host, sizeof(host), port, sizeof(port)) != 0) {
        return -EINVAL;
    }
    hints.ai_flags = AI_NUMERICSERV;
    rc = getaddrinfo(host, port, &hints, &ai);     /* numeric addresses: no lookup waits */
    if (rc != 0 || ai == NULL) {
        return -EHOSTUNREACH;
    }
    fd = socket(ai->ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) {
        rc = -errno;
        freeaddrinfo(ai);
        return rc;
    }
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    rc = connect(fd, ai->ai_addr, ai->ai_addrlen);
    freeaddrinfo(ai);
    if (rc != 0 && errno != EINPROGRESS) {
        rc = -errno;
        close(fd);
        return rc;
    }
    if (strcmp(c->dial, c->addr) != 0 &&
        (rc = peer_tls_open(p->tls, fd, c->addr, &c->tls)) != 0) {   /* checked for addr's host */
        close(fd);
        return rc;
    }
    c->fd = fd;
    c->state = PEER_CONNECTING;
    c->events = EPOLLOUT | EPOLLIN;
    ev.events = c->events;
    ev.data.ptr = c;
    if (epoll_ctl(p->epfd, EPOLL_CTL_ADD, fd, &ev) != 0) {
        rc = -errno;
        peer_tls_close(c->tls);
        c->tls = NULL;
        close(fd);
        c->fd = -1;
        return rc;
    }
    frame_scan_init(&c->fs);
    c->ilen = 0;
    c->spilling = false;
    c->sm = NULL;
    c->nholes = 0;
    pthread_mutex_lock(&p->lock);
    c->hello_due = p->token[0] != '\0';
    pthread_mutex_unlock(&p->lock);
    c->rdma_due = p->cq != NULL;
    peer_add(&p->connects, 1);
    return 0;
}

static struct peer_conn *
peer_conn_get(struct peer_pool *p, const char *addr)
{
    struct peer_conn *c;

    for (c = p->conns; c != NULL; c = c->next) {
        if (strcmp(c->addr, addr) == 0) {
            return c;
        }
    }
    c = calloc(1, sizeof(*c));
    if (c == NULL) {
        return NULL;
    }
    snprintf(c->addr, sizeof(c->addr), "%s", addr);
    c->fd = -1;
    c->state = PEER_DOWN;
    c->backoff = PEER_BACKOFF_MIN_MS;
    c->next = p->conns;
    p->conns = c;
    return c;
}

/* ---- messages ---- */

/* peer_head: the request header [0, msgid, method, ...] before params; returns its length. */
static size_t
peer_head(uint8_t *h, uint32_t msgid, const char *method, size_t mlen)
{
    size_t n = 0;

    h[n++] = 0x94;
    h[n++] = 0x00;
    h[n++] = 0xce;
    h[n++] = (uint8_t)(msgid >> 24);
    h[n++] = (uint8_t)(msgid >> 16);
    h[n++] = (uint8_t)(msgid >> 8);
    h[n++] = (uint8_t)msgid;
    h[n++] = (uint8_t)(0xa0 | mlen);
    memcpy(h + n, method, mlen);
    return n + mlen;
}

/*
 * peer_msg_control: m, whose buf holds len bytes of a login or rdma_connect built here, as
 * one segment with msgid, due within peer_timeout.
 */
static void
peer_msg_control(struct peer_pool *p, struct peer_msg *m, size_t len, uint32_t msgid)
{
    m->len = len;
    m->seg = m->seg_in;
    m->seg[0].iov_base = m->buf;
    m->seg[0].iov_len = len;
    m->nseg = 1;
    m->msgid = msgid;
    m->deadline = clock_ms() + p->cfg.timeout_ms;
}

/* peer_hello: the login message with the pool's token, or NULL without memory. */
static struct peer_msg *
peer_hello(struct peer_pool *p)
{
    char token[sizeof(p->token)];
    size_t tl;
    struct peer_msg *m = calloc(1, sizeof(*m));
    size_t n;

    pthread_mutex_lock(&p->lock);
    memcpy(token, p->token, sizeof(token));
    pthread_mutex_unlock(&p->lock);
    tl = strlen(token);
    if (m == NULL || (m->buf = malloc(64 + tl)) == NULL) {
        explicit_bzero(token, sizeof(token));
        free(m);
        return NULL;
    }
    n = peer_head(m->buf, PEER_HELLO_ID, "hello", 5);
    m->buf[n++] = 0x91;             /* params: [ {tenant: "admin", token: bin} ] */
    m->buf[n++] = 0x82;
    m->buf[n++] = 0xa6;
    memcpy(m->buf + n, "tenant", 6);
    n += 6;
    m->buf[n++] = 0xa5;
    memcpy(m->buf + n, "admin", 5);
    n += 5;
    m->buf[n++] = 0xa5;
    memcpy(m->buf + n, "token", 5);
    n += 5;
    m->buf[n++] = 0xc4;             /* bin 8: tokens are at most 255 bytes */
    m->buf[n++] = (uint8_t)tl;
    memcpy(m->buf + n, token, tl);
    explicit_bzero(token, sizeof(token));
    peer_msg_control(p, m, n + tl, PEER_HELLO_ID);    /* unanswered: the connection goes */
    return m;
}

static void
peer_push(struct peer_msg **head, struct peer_msg **tail, struct peer_msg *m)
{
    m->next = NULL;
    if (*tail != NULL) {
        (*tail)->next = m;
    } else {
        *head = m;
    }
    *tail = m;
}

int
peer_call(struct peer_pool *p, const char *addr, const char *method, uint8_t *params,
          size_t plen, peer_done_fn *done, void *arg)
{
    return peer_call_ext(p, addr, method, params, plen, NULL, done, arg);
}

static int
peer_call_full(struct peer_pool *p, const char *addr, const char *method, uint8_t *params,
               size_t plen, const struct peer_extra *x, const struct peer_sink *sink,
               peer_done_fn *done, peer_sink_done_fn *sink_done, void *arg, int rdma)
{
    size_t mlen = strlen(method);
    struct peer_msg *m;
    uint64_t one = 1;
    size_t h;

    if (mlen > 31 || strlen(addr) >= PEER_ADDR_MAX || (x != NULL && x->n > PEER_EXTRA_MAX)) {
        free(params);
        if (x != NULL) {
            free(x->tail);
            if (x->release != NULL) {
                x->release(x->release_arg);
            }
        }
        return -EINVAL;
    }
    m = calloc(1, sizeof(*m));
    if (m != NULL) {
        m->seg = m->seg_in;
        if (x != NULL && x->n + 3 > PEER_SEGS_IN
            && (m->seg = malloc((size_t)(x->n + 3) * sizeof(*m->seg))) == NULL) {
            free(m);
            m = NULL;
        }
    }
    if (m == NULL) {
        free(params);
        if (x != NULL) {
            free(x->tail);
            if (x->release != NULL) {
                x->release(x->release_arg);
            }
        }
        return -ENOMEM;
    }
    m->msgid = atomic_fetch_add_explicit(&p->next_id, 1, memory_order_relaxed);
    while (m->msgid == PEER_HELLO_ID || m->msgid == PEER_RDMA_ID) {
        m->msgid = atomic_fetch_add_explicit(&p->next_id, 1, memory_order_relaxed);
    }
    h = peer_head(m->head, m->msgid, method, mlen);
    m->buf = params;                /* written after the head as it is: no copy */
    m->seg[m->nseg].iov_base = m->head;
    m->seg[m->nseg++].iov_len = h;
    m->seg[m->nseg].iov_base = params;
    m->seg[m->nseg++].iov_len = plen;
    m->len = h + plen;
    if (x != NULL) {
        for (int i = 0; i < x->n; i++) {
            m->seg[m->nseg++] = x->iov[i];
            m->len += x->iov[i].iov_len;
        }
        m->tail = x->tail;
        m->seg[m->nseg].iov_base = x->tail;
        m->seg[m->nseg++].iov_len = x->tail_len;
        m->len += x->tail_len;
        m->release = x->release;
        m->release_arg = x->release_arg;
    }
    snprintf(m->addr, sizeof(m->addr), "%s", addr);
    m->deadline = clock_ms() + p->cfg.timeout_ms;
    m->done = sink != NULL ? peer_sink_mark : done;
    m->sink_done = sink != NULL ? sink_done : NULL;
    m->sink = sink;
    m->arg = arg;
    m->rdma = rdma != 0;
    m->into = rdma > 1;
    peer_add(&p->requests, 1);
    peer_add(&p->in_flight, 1);
    pthread_mutex_lock(&p->lock);
    peer_push(&p->incoming, &p->incoming_tail, m);
    pthread_mutex_unlock(&p->lock);
    if (write(p->evfd, &one, sizeof(one)) < 0) {
        /* the counter is full: the thread is awake anyway */
    }
    return 0;
}

int
peer_call_sink(struct peer_pool *p, const char *addr, const char *method, uint8_t *params,
               size_t plen, const struct peer_sink *sink, peer_sink_done_fn *done, void *arg)
{
    return peer_call_full(p, addr, method, params, plen, NULL, sink, NULL, done, arg, 0);
}

int
peer_call_ext(struct peer_pool *p, const char *addr, const char *method, uint8_t *params,
              size_t plen, const struct peer_extra *x, peer_done_fn *done, void *arg)
{
    return peer_call_full(p, addr, method, params, plen, x, NULL, done, NULL, arg, 0);
}

int
peer_call_rdma(struct peer_pool *p, const char *addr, const char *method, uint8_t *params,
               size_t plen, bool into, peer_done_fn *done, void *arg)
{
    return peer_call_full(p, addr, method, params, plen, NULL, NULL, done, NULL, arg,
                          into ? 2 : 1);
}

/* peer_rdma_off: RDMA to c's peer is off for this connection (why): logged and counted. */
static void
peer_rdma_off(struct peer_pool *p, struct peer_conn *c, const char *why)
{
    if (c->rdma.state == PEER_RDMA_OFF) {
        return;                     /* said once per connection */
    }
    peer_rdma_stop(&c->rdma, PEER_RDMA_OFF);
    peer_add(&p->rdma_fallbacks, 1);
    log_warn("peer %s: no RDMA to it: %s; its values come over TCP on this connection",
             c->addr, why);
}

void
peer_rdma_fail(struct peer_pool *p, const char *addr, const char *why)
{
    for (struct peer_conn *c = p->conns; c != NULL; c = c->next) {
        if (strcmp(c->addr, addr) == 0) {
            peer_rdma_off(p, c, why);
            return;
        }
    }
}

/*
 * peer_rdma_msg: rdma_connect with a new queue pair's info, for a new connection; NULL when
 * no queue pair or no memory (then RDMA is off on it).
 */
static struct peer_msg *
peer_rdma_msg(struct peer_pool *p, struct peer_conn *c)
{
    uint8_t info[RDMA_QP_INFO_LEN];
    struct peer_msg *m = calloc(1, sizeof(*m));
    int rc;
    size_t n;

    if (m == NULL || (m->buf = malloc(64)) == NULL) {
        free(m);
        peer_rdma_off(p, c, "out of memory");
        return NULL;
    }
    rc = peer_rdma_start(&c->rdma, p->cq, info);
    if (rc != 0) {
        free(m->buf);
        free(m);
        c->rdma.state = PEER_RDMA_NONE;
        peer_rdma_off(p, c, rc == KV_NO_SPACE ? "this node's CQ for peers is full"
                                              : "its queue pair could not be made");
        return NULL;
    }
    n = peer_head(m->buf, PEER_RDMA_ID, "rdma_connect", 12);
    m->buf[n++] = 0x91;             /* params: [ bin 30 ] */
    m->buf[n++] = 0xc4;
    m->buf[n++] = RDMA_QP_INFO_LEN;
    memcpy(m->buf + n, info, RDMA_QP_INFO_LEN);
    peer_msg_control(p, m, n + RDMA_QP_INFO_LEN, PEER_RDMA_ID);  /* unanswered: RDMA off */
    return m;
}

/*
 * peer_relogin: a reload changed what this node logs in with (the cluster token, or the TLS
 * files): the connections whose login was refused are dialled by the next call that needs
 * them, not after their backoff (up to PEER_AUTH_BACKOFF_MAX_MS), and a refusal of the new
 * login is logged again.
 */
static void
peer_relogin(struct peer_pool *p)
{
    for (struct peer_conn *c = p->conns; c != NULL; c = c->next) {
        if (c->auth_refused && c->state == PEER_DOWN) {
            c->retry_at = 0;
            c->backoff = PEER_BACKOFF_MIN_MS;
            c->auth_refused = false;
            log_info("peer %s: dialled again with the reloaded cluster login", c->addr);
        }
    }
}

/* peer_take_incoming: move handed-over calls to their connections' write queues. */
static void
peer_take_incoming(struct peer_pool *p)
{
    struct peer_msg *m;
    uint64_t v;
    bool relogin;

    if (read(p->evfd, &v, sizeof(v)) < 0) {
        /* EAGAIN: nothing counted */
    }
    pthread_mutex_lock(&p->lock);
    m = p->incoming;
    p->incoming = p->incoming_tail = NULL;
    relogin = p->relogin;
    p->relogin = false;
    pthread_mutex_unlock(&p->lock);
    if (relogin) {
        peer_relogin(p);
    }
    while (m != NULL) {
        struct peer_msg *next = m->next;
        struct peer_conn *c = peer_conn_get(p, m->addr);

        if (c == NULL) {
            peer_answer(p, m, KV_UNAVAILABLE, NULL);
            peer_msg_free(m);
        } else if (c->state == PEER_DOWN && clock_ms() < c->retry_at) {
            peer_answer(p, m, KV_UNAVAILABLE, NULL);     /* within the backoff */
            peer_msg_free(m);
        } else {
            int rc = 0;

            if (c->state == PEER_DOWN) {
                rc = peer_dial(p, c);
            }
            if (rc != 0) {
                peer_push(&c->wq, &c->wq_tail, m);
                peer_conn_down(p, c, "cannot dial", -rc);
            } else {
                if (c->hello_due) {
                    struct peer_msg *hm = peer_hello(p);
                    if (hm != NULL) {
                        peer_push(&c->wq, &c->wq_tail, hm);
                        c->login_wait = true;
                    }
                    c->hello_due = false;
                }
                if (c->rdma_due) {
                    struct peer_msg *rm = peer_rdma_msg(p, c);
                    if (rm != NULL) {
                        peer_push(&c->wq, &c->wq_tail, rm);
                    }
                    c->rdma_due = false;
                }
                if (m->rdma && c->rdma.state != PEER_RDMA_READY
                    && (m->into || c->rdma.state != PEER_RDMA_PENDING)) {
                    /* no queue pair: over TCP; one still being connected may take a call
                       behind its rdma_connect, but not writes into this node's memory */
                    atomic_fetch_sub_explicit(&p->requests, 1, memory_order_relaxed);
                    peer_answer(p, m, KV_UNSUPPORTED, NULL);    /* not sent: no error */
                    peer_msg_free(m);
                    m = next;
                    continue;
                }
                peer_push(&c->wq, &c->wq_tail, m);
                if (c->state == PEER_OPEN) {
                    peer_watch(p, c, EPOLLIN | EPOLLOUT);
                }
            }
        }
        m = next;
    }
}

/* peer_write: write queued messages until the socket is full. 0 or -errno. */
static int
peer_write(struct peer_pool *p, struct peer_conn *c)
{
    while (c->wq != NULL) {
        struct iovec iov[PEER_WRITE_IOV];
        int n = 0;
        ssize_t w;

        if (c->login_wait && c->wq->msgid != PEER_HELLO_ID) {
            break;                  /* a refused login would make the peer drop what follows */
        }
        for (struct peer_msg *m = c->wq; m != NULL && n < PEER_WRITE_IOV; m = m->next) {
            size_t skip = m->off;

            if (m != c->wq && n + m->nseg > PEER_WRITE_IOV) {
                break;              /* whole messages behind the first (which may be cut) */
            }
            for (int i = 0; i < m->nseg && n < PEER_WRITE_IOV; i++) {
                if (skip >= m->seg[i].iov_len) {
                    skip -= m->seg[i].iov_len;
                    continue;
                }
                iov[n].iov_base = (uint8_t *)m->seg[i].iov_base + skip;
                iov[n].iov_len = m->seg[i].iov_len - skip;
                skip = 0;
                n += iov[n].iov_len > 0;
            }
            if (c->login_wait) {
                break;              /* the login alone */
            }
        }
        if (n == 0) {
            break;
        }
        w = c->tls != NULL ? peer_tls_writev(c->tls, iov, n) : writev(c->fd, iov, n);
        if (c->tls != NULL && w < 0) {
            errno = (int)-w;
            w = -1;
        }
        if (w < 0) {
            if (errno == EAGAIN || errno == EWOULDBLOCK) {
                peer_watch(p, c, EPOLLIN | EPOLLOUT);
                return 0;
            }
            if (errno == EINTR) {
                continue;
            }
            return -errno;
        }
        peer_add(&p->bytes_out, (uint64_t)w);
        while (w > 0 && c->wq != NULL) {
            struct peer_msg *m = c->wq;
            size_t left = m->len - m->off;

            if ((size_t)w < left) {
                m->off += (size_t)w;
                break;
            }
            w -= (ssize_t)left;
            m->off = m->len;
            c->wq = m->next;
            if (c->wq == NULL) {
                c->wq_tail = NULL;
            }
            peer_msg_written(m);
            if (m->done == NULL && m->msgid != PEER_HELLO_ID && m->msgid != PEER_RDMA_ID) {
                peer_msg_free(m);           /* timed out while being written */
            } else {
                peer_push(&c->fq, &c->fq_tail, m);
            }
        }
    }
    peer_watch(p, c, EPOLLIN);
    return 0;
}

/*
 * peer_login_answer: the peer's answer to the login. Refused: counted, logged
 * once until a login to that peer is accepted again, and -EACCES (the
 * connection goes down and is dialled again after the login's own backoff).
 */
static int
peer_login_answer(struct peer_pool *p, struct peer_conn *c, int status)
{
    if (status == 0) {
        c->login_wait = false;
        if (c->auth_refused) {
            log_info("peer %s: the cluster login is accepted again", c->addr);
        }
        c->auth_refused = false;
        c->backoff = PEER_BACKOFF_MIN_MS;
        return 0;
    }
    peer_add(&p->auth_failures, 1);
    if (!c->auth_refused) {
        log_error("peer %s: refused the cluster login as tenant admin (%s): its token differs "
                  "from <data_dir>/cluster_token here; retried every %d s at most, logged once",
                  c->addr, kv_strerror(status), PEER_AUTH_BACKOFF_MAX_MS / 1000);
    }
    c->auth_refused = true;
    return -EACCES;
}

/* peer_reply: one whole reply msg[0..len): answer its call. 0, -EPROTO, or -EACCES (login refused). */
static int
peer_reply(struct peer_pool *p, struct peer_conn *c, const uint8_t *msg, size_t len)
{
    struct mp_reader rd;
    uint32_t n;
    uint64_t type, id;
    struct peer_msg *m, *prev = NULL;
    int status = 0;

    mp_reader_init(&rd, msg, len);
    if (mp_read_array(&rd, &n) != 0 || mp_read_uint(&rd, &type) != 0) {
        return -EPROTO;
    }
    if (type == 2) {
        return 0;                   /* a notification (an error before closing): the close says */
    }
    if (n != 4 || type != 1 || mp_read_uint(&rd, &id) != 0) {
        return -EPROTO;
    }
    if (mp_peek(&rd) == MP_NIL) {
        mp_read_nil(&rd);
    } else {
        uint32_t en;
        uint64_t code = KV_INTERNAL;
        if (mp_read_array(&rd, &en) != 0 || en < 1 || mp_read_uint(&rd, &code) != 0) {
            return -EPROTO;
        }
        status = code == 0 || code > KV_CODE_MAX ? KV_INTERNAL : (int)code;
        mp_reader_init(&rd, msg + len, 0);
    }
    for (m = c->fq; m != NULL && m->msgid != id; prev = m, m = m->next) {
    }
    if (m == NULL) {
        return 0;                   /* a call that timed out and was forgotten */
    }
    if (prev != NULL) {
        prev->next = m->next;
    } else {
        c->fq = m->next;
    }
    if (c->fq_tail == m) {
        c->fq_tail = prev;
    }
    if (m->msgid == PEER_HELLO_ID) {
        peer_msg_free(m);
        return peer_login_answer(p, c, status);
    }
    if (m->msgid == PEER_RDMA_ID) {
        char why[160];

        peer_msg_free(m);
        if (c->rdma.state == PEER_RDMA_PENDING) {
            if (peer_rdma_answer(&c->rdma, status, &rd, why, sizeof(why)) == 0) {
                peer_add(&p->rdma_connects, 1);
            } else {
                c->rdma.state = PEER_RDMA_NONE;
                peer_rdma_off(p, c, why);
            }
        }
        return 0;
    }
    if (status == 0 && m->sink != NULL) {
        mp_reader_holes(&rd, c->holes, c->nholes);     /* the bodies its sink took */
    }
    peer_answer(p, m, status, status == 0 ? &rd : NULL);
    peer_msg_free(m);
    return 0;
}

/* peer_spill_land: n bytes arrived into the current extent: hand them over, move on. */
static void
peer_spill_land(struct peer_conn *c, size_t n)
{
    while (n > 0) {
        struct iovec *v = &c->siov[c->sidx];
        size_t k = v->iov_len - c->soff < n ? v->iov_len - c->soff : n;

        if (c->sm != NULL) {
            c->sm->sink->landed(c->sm->arg, (uint8_t *)v->iov_base + c->soff, k);
        }
        c->soff += k;
        c->sleft -= k;
        n -= k;
        if (c->soff == v->iov_len) {
            c->sidx++;
            c->soff = 0;
        }
    }
}

/*
 * peer_spill_begin: the scanner offers a bin body (c->fs): when the call the reply answers
 * was made with a sink and the sink takes it, the buffered part goes into the sink's extents
 * and c->spilling is set; otherwise the body is declined (buffered). 0, or -ENOMEM.
 */
static int
peer_spill_begin(struct peer_conn *c)
{
    struct mp_reader rd;
    uint32_t n;
    uint64_t type, id;
    struct peer_msg *m;
    size_t have = c->fs.spill_have;
    uint64_t total = 0;
    int k;

    mp_reader_init(&rd, c->in, c->fs.pos);
    if (c->fs.depth < 2 || c->fs.path[0] != 3 || mp_read_array(&rd, &n) != 0
        || mp_read_uint(&rd, &type) != 0 || type != 1 || mp_read_uint(&rd, &id) != 0) {
        frame_scan_decline(&c->fs);
        return 0;
    }
    for (m = c->fq; m != NULL && m->msgid != id; m = m->next) {
    }
    if (m == NULL || m->sink == NULL || m->done == NULL || c->fs.spill_len < m->sink->min) {
        frame_scan_decline(&c->fs);
        return 0;
    }
    if (c->nholes == c->hcap) {
        size_t cap = c->hcap ? c->hcap * 2 : 16;
        struct mp_hole *h = realloc(c->holes, cap * sizeof(*h));

        if (h == NULL) {
            return -ENOMEM;
        }
        c->holes = h;
        c->hcap = cap;
    }
    k = m->sink->take(m->arg, c->fs.path, c->fs.depth, c->fs.spill_len, c->siov,
                      PEER_SINK_IOV_MAX);
    for (int i = 0; i < k && k <= PEER_SINK_IOV_MAX; i++) {
        total += c->siov[i].iov_len;
    }
    if (k <= 0 || k > PEER_SINK_IOV_MAX || total != c->fs.spill_len) {
        frame_scan_decline(&c->fs);
        return 0;
    }
    c->holes[c->nholes].off = c->fs.pos;
    c->holes[c->nholes].len = c->fs.spill_len;
    c->holes[c->nholes++].tag = NULL;
    c->spilling = true;
    c->sm = m;
    c->sniov = k;
    c->sidx = 0;
    c->soff = 0;
    c->sleft = c->fs.spill_len;
    /* the part already buffered: copied once into the extents, then dropped from the buffer */
    for (size_t done = 0; done < have;) {
        struct iovec *v = &c->siov[c->sidx];
        size_t cut = v->iov_len - c->soff < have - done ? v->iov_len - c->soff : have - done;

        memcpy((uint8_t *)v->iov_base + c->soff, c->in + c->fs.pos + done, cut);
        peer_spill_land(c, cut);
        done += cut;
    }
    c->ilen = c->fs.pos;
    return 0;
}

/*
 * peer_recv: one read of c's socket (through its TLS session when it has one, which fills
 * iov[0] only) into the n extents of iov. Bytes read; 0 when nothing is there for now;
 * -EINTR to try again; -ECONNRESET at the peer's close; or another -errno.
 */
static ssize_t
peer_recv(struct peer_conn *c, const struct iovec *iov, int n)
{
    ssize_t r;

    if (c->tls != NULL) {
        r = peer_tls_read(c->tls, iov[0].iov_base, iov[0].iov_len);
    } else {
        r = readv(c->fd, iov, n);
        r = r < 0 ? -errno : r;
    }
    if (r == 0) {
        return -ECONNRESET;
    }
    return r == -EAGAIN || r == -EWOULDBLOCK ? 0 : r;
}

/*
 * peer_spill_read: receive the rest of the body being spilled, in pieces of at most
 * PEER_READ_CHUNK (each handed to the sink while it is in the CPU cache). 1: all of it is
 * in; 0: the socket is drained for now; -errno: the connection goes down.
 */
static int
peer_spill_read(struct peer_pool *p, struct peer_conn *c)
{
    static uint8_t drop[PEER_READ_CHUNK];   /* a dropped body's bytes (peer thread only) */

    while (c->sleft > 0) {
        struct iovec iov[PEER_SINK_IOV_MAX];
        size_t want = c->sleft < PEER_READ_CHUNK ? (size_t)c->sleft : PEER_READ_CHUNK;
        int n = 0;
        ssize_t r;

        if (c->sm == NULL) {
            iov[n].iov_base = drop;             /* the call ended: nothing is written there */
            iov[n++].iov_len = want;
        } else {
            size_t off = c->soff, got = 0;

            for (int i = c->sidx; i < c->sniov && got < want; i++) {
                size_t k = c->siov[i].iov_len - off;

                k = k < want - got ? k : want - got;
                iov[n].iov_base = (uint8_t *)c->siov[i].iov_base + off;
                iov[n++].iov_len = k;
                got += k;
                off = 0;
            }
        }
        r = peer_recv(c, iov, n);
        if (r == -EINTR) {
            continue;
        }
        if (r <= 0) {
            return (int)r;
        }
        peer_add(&p->bytes_in, (uint64_t)r);
        if (c->sm == NULL) {
            c->sleft -= (uint64_t)r;    /* extents no longer used: only the count moves */
            while (c->sidx < c->sniov && (size_t)r > 0) {
                size_t k = c->siov[c->sidx].iov_len - c->soff;
                k = k < (size_t)r ? k : (size_t)r;
                c->soff += k;
                r -= (ssize_t)k;
                if (c->soff == c->siov[c->sidx].iov_len) {
                    c->sidx++;
                    c->soff = 0;
                }
            }
        } else {
            peer_spill_land(c, (size_t)r);
        }
    }
    c->spilling = false;
    frame_scan_spilled(&c->fs);
    return 1;
}

/*
 * peer_scan: scan and answer the whole replies buffered; stop at a partial one or at a body
 * that goes into a sink (c->spilling). Returns 1 with *rc set when the connection must go
 * down (*rc: -EPROTO, -EACCES, -ENOMEM), else 0.
 */
static int
peer_scan(struct peer_pool *p, struct peer_conn *c, const struct frame_limits *lim, int *rc)
{
    *rc = 0;
    while (!c->spilling) {
        int st = frame_scan(&c->fs, c->in, c->ilen, lim);
        size_t used;

        if (st == FRAME_NEED_MORE) {
            return 0;
        }
        if (st == FRAME_SPILL) {
            *rc = peer_spill_begin(c);
            if (*rc != 0) {
                return 1;
            }
            continue;
        }
        if (st != FRAME_DONE) {
            *rc = -EPROTO;
            return 1;
        }
        used = c->fs.pos;
        *rc = peer_reply(p, c, c->in, used);
        if (*rc != 0) {
            return 1;
        }
        memmove(c->in, c->in + used, c->ilen - used);
        c->ilen -= used;
        c->nholes = 0;
        frame_scan_init(&c->fs);
    }
    return 0;
}

/* peer_read: read and answer whole replies. 0, or -errno / -EPROTO / -EACCES (connection goes down). */
static int
peer_read(struct peer_pool *p, struct peer_conn *c)
{
    struct frame_limits lim = {.max_message_size = p->cfg.max_message_size, .max_depth = 8,
                               .spill_min = PEER_SPILL_MIN};

    for (;;) {
        size_t want;
        ssize_t r;

        if (c->spilling) {
            int rc = peer_spill_read(p, c);

            if (rc <= 0) {
                return rc;
            }
            if (peer_scan(p, c, &lim, &rc) != 0 || rc != 0) {
                return rc;      /* what followed the body was buffered already: scan on */
            }
            continue;
        }

        if (c->icap - c->ilen < PEER_READ_CHUNK) {
            size_t cap = c->icap ? c->icap * 2 : PEER_READ_CHUNK * 2;
            uint8_t *in = realloc(c->in, cap);
            if (in == NULL) {
                return -ENOMEM;
            }
            c->in = in;
            c->icap = cap;
        }
        /*
         * While a reply whose bodies may go into a sink is due, read in small steps: what is
         * read here past a body's header is copied once more (into the sink) instead of
         * being received in place.
         */
        want = c->icap - c->ilen;
        if (c->fq != NULL && c->fq->sink != NULL && want > PEER_SINK_READ) {
            want = PEER_SINK_READ;
        }
        r = peer_recv(c, &(struct iovec){ .iov_base = c->in + c->ilen, .iov_len = want }, 1);
        if (r == -EINTR) {
            continue;
        }
        if (r <= 0) {
            return (int)r;
        }
        peer_add(&p->bytes_in, (uint64_t)r);
        c->ilen += (size_t)r;
        int rc = 0;
        if (peer_scan(p, c, &lim, &rc) != 0 || rc != 0) {
            return rc;
        }
    }
}

/*
 * peer_expire: answer calls past their deadline; returns ms to the nearest one left. One
 * waiting for its reply is forgotten (a late reply is dropped); one on the write queue stays
 * until written (a partly written message must be finished for the stream to stay whole).
 */
static uint64_t
peer_expire(struct peer_pool *p)
{
    uint64_t now = clock_ms();
    uint64_t wait = PEER_WAIT_MAX_MS;

    for (struct peer_conn *c = p->conns; c != NULL; c = c->next) {
        struct peer_msg *prev = NULL, *m = c->fq;
        bool live = false, login_late = false;

        while (m != NULL) {
            struct peer_msg *next = m->next;

            login_late |= m->msgid == PEER_HELLO_ID && m->deadline <= now;
            if (m->msgid == PEER_RDMA_ID && m->deadline <= now) {
                peer_rdma_off(p, c, "rdma_connect was not answered within peer_timeout");
            }
            if (m->msgid != PEER_HELLO_ID && m->deadline <= now) {
                if (m->into && m->done != NULL) {
                    /* its writes may still come: the queue pair goes before the caller
                       frees the memory it named */
                    peer_rdma_off(p, c, "an RDMA call was not answered within peer_timeout");
                }
                peer_answer(p, m, KV_TIMEOUT, NULL);
                if (c->sm == m) {
                    c->sm = NULL;   /* the rest of its body is read and dropped */
                }
                if (prev != NULL) {
                    prev->next = next;
                } else {
                    c->fq = next;
                }
                if (c->fq_tail == m) {
                    c->fq_tail = prev;
                }
                peer_msg_free(m);
            } else {
                if (m->deadline != UINT64_MAX && m->deadline - now < wait) {
                    wait = m->deadline - now;
                }
                prev = m;
            }
            m = next;
        }
        for (m = c->wq; m != NULL; m = m->next) {
            if (m->done != NULL && m->deadline <= now) {
                if (m->into && m->off > 0) {
                    peer_rdma_off(p, c, "an RDMA call was not sent within peer_timeout");
                }
                peer_answer(p, m, KV_TIMEOUT, NULL);
                if (c->sm == m) {
                    c->sm = NULL;   /* the rest of its body is read and dropped */
                }
            } else if (m->done != NULL && m->deadline - now < wait) {
                wait = m->deadline - now;
            }
            live |= m->done != NULL;
            if (m->msgid == PEER_RDMA_ID && m->deadline > now) {
                /* a dial for an RDMA call alone (answered UNSUPPORTED until the queue pair
                   is connected, its caller going over TCP): the connection is still wanted */
                live = true;
                wait = m->deadline - now < wait ? m->deadline - now : wait;
            }
        }
        if ((c->state == PEER_CONNECTING || c->state == PEER_HANDSHAKE) && !live
            && c->fq == NULL && c->wq != NULL) {
            peer_conn_down(p, c, "connect timed out", ETIMEDOUT);
        } else if (login_late) {
            peer_conn_down(p, c, "the cluster login was not answered within peer_timeout",
                           ETIMEDOUT);
        }
    }
    return wait;
}

/*
 * peer_handshake: one TLS handshake step of c. 0: open now (go on with reads and writes);
 * 1: waiting (the socket event it needs is armed), or the connection went down.
 */
static int
peer_handshake(struct peer_pool *p, struct peer_conn *c)
{
    char why[256] = "";
    bool want_write = false;
    int rc = peer_tls_handshake(c->tls, &want_write, why, sizeof(why));

    if (rc == -EAGAIN) {
        peer_watch(p, c, want_write ? EPOLLIN | EPOLLOUT : EPOLLIN);
        return 1;
    }
    if (rc != 0) {
        if (rc == -EPROTO) {
            log_warn("peer %s: TLS handshake failed: %s", c->dial, why);
        }
        peer_conn_down(p, c, "TLS handshake failed", rc == -EPROTO ? 0 : -rc);
        return 1;
    }
    c->state = PEER_OPEN;
    peer_watch(p, c, c->wq != NULL ? EPOLLIN | EPOLLOUT : EPOLLIN);
    return 0;
}

static void *
peer_main(void *arg)
{
    struct peer_pool *p = arg;
    struct epoll_event evs[64];
    const char *name = p->cfg.name != NULL ? p->cfg.name : "kvstash-peer";
    int prc;

    (void)pthread_setname_np(pthread_self(), name);
    if (p->cfg.nice != 0 && (prc = prio_thread_nice(p->cfg.nice)) != 0) {
        log_warn("cluster: the %s thread keeps the process's priority: %s", name, strerror(-prc));
    }
    while (!atomic_load_explicit(&p->stop, memory_order_acquire)) {
        int n = epoll_wait(p->epfd, evs, 64, (int)peer_expire(p) + 1);

        for (int i = 0; i < n; i++) {
            struct peer_conn *c = evs[i].data.ptr;
            int rc = 0;

            if (c == NULL) {
                peer_take_incoming(p);
                continue;
            }
            if (c->fd < 0) {
                continue;
            }
            if (c->state == PEER_CONNECTING) {
                int err = 0;
                socklen_t el = sizeof(err);
                getsockopt(c->fd, SOL_SOCKET, SO_ERROR, &err, &el);
                if (err != 0) {
                    peer_conn_down(p, c, "cannot connect", err);
                    continue;
                }
                c->state = c->tls != NULL ? PEER_HANDSHAKE : PEER_OPEN;
            }
            if (c->state == PEER_HANDSHAKE && peer_handshake(p, c) != 0) {
                continue;                       /* going on, or down */
            }
            if (c->state == PEER_OPEN && c->backoff != PEER_BACKOFF_MIN_MS && !c->auth_refused
                && !c->login_wait) {
                c->backoff = PEER_BACKOFF_MIN_MS;   /* with a login: once it is accepted */
            }
            if (evs[i].events & (EPOLLIN | EPOLLERR | EPOLLHUP)) {
                rc = peer_read(p, c);
            }
            if (rc == 0 && c->wq != NULL) {
                rc = peer_write(p, c);
            } else if (rc == 0) {
                peer_watch(p, c, EPOLLIN);
            }
            if (rc == -EACCES) {
                peer_conn_refused(p, c);
            } else if (rc == -EPROTO && c->tls != NULL && peer_tls_error(c->tls)[0] != '\0') {
                char why[200];

                snprintf(why, sizeof(why), "TLS: %s", peer_tls_error(c->tls));
                peer_conn_down(p, c, why, 0);   /* an alert: its certificate refused, ... */
            } else if (rc != 0) {
                peer_conn_down(p, c, rc == -EPROTO ? "a reply broke the protocol" : "failed",
                               rc == -EPROTO ? 0 : -rc);
            }
        }
    }
    return NULL;
}

int
peer_pool_create(const struct peer_config *cfg, struct peer_pool **out)
{
    struct peer_pool *p = calloc(1, sizeof(*p));
    struct epoll_event ev = {.events = EPOLLIN, .data.ptr = NULL};
    int rc;

    if (p == NULL) {
        return -ENOMEM;
    }
    p->cfg = *cfg;
    p->cfg.token = NULL;
    p->cfg.tls_cert = p->cfg.tls_key = p->cfg.tls_ca = NULL;
    if (cfg->token != NULL) {
        snprintf(p->token, sizeof(p->token), "%s", cfg->token);
    }
    if (cfg->tls_cert != NULL && cfg->tls_cert[0] != '\0') {
        char why[512];

        rc = peer_tls_ctx_new(cfg->tls_cert, cfg->tls_key != NULL ? cfg->tls_key : "",
                              cfg->tls_ca != NULL ? cfg->tls_ca : "", &p->tls, why, sizeof(why));
        if (rc != 0) {
            log_error("cluster: TLS to peers: %s", why);
            free(p);
            return rc;
        }
    }
    if (cfg->rdma_dev != NULL && (rc = rdma_cq_create(cfg->rdma_dev, PEER_RDMA_CQ, &p->cq)) != 0) {
        log_warn("cluster: no RDMA to peers: its completion queue could not be made (%s); "
                 "values move over TCP", rc < 0 ? strerror(-rc) : kv_strerror(rc));
        p->cq = NULL;
    }
    p->cfg.rdma_dev = NULL;
    atomic_init(&p->next_id, 1);
    pthread_mutex_init(&p->lock, NULL);
    /* KVSTASH_TEST_PEER_AUTH_BACKOFF_MS (tests only): a refused login's first backoff */
    const char *env = getenv("KVSTASH_TEST_PEER_AUTH_BACKOFF_MS");
    p->auth_backoff_min = env != NULL ? strtoull(env, NULL, 10) : PEER_AUTH_BACKOFF_MIN_MS;
    if (p->auth_backoff_min == 0 || p->auth_backoff_min > PEER_AUTH_BACKOFF_MAX_MS) {
        p->auth_backoff_min = PEER_AUTH_BACKOFF_MIN_MS;
    }
    p->epfd = epoll_create1(EPOLL_CLOEXEC);
    p->evfd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (p->epfd < 0 || p->evfd < 0 || epoll_ctl(p->epfd, EPOLL_CTL_ADD, p->evfd, &ev) != 0) {
        rc = -errno;
        peer_pool_destroy(p);
        return rc;
    }
    rc = pthread_create(&p->thread, NULL, peer_main, p);
    if (rc != 0) {
        peer_pool_destroy(p);
        return -rc;
    }
    p->started = true;
    *out = p;
    return 0;
}

int
peer_pool_reload(struct peer_pool *p, const struct peer_config *cfg, char *err, size_t errlen)
{
    int rc;

    if (p->tls != NULL && cfg->tls_cert != NULL && cfg->tls_cert[0] != '\0') {
        rc = peer_tls_ctx_reload(p->tls, cfg->tls_cert, cfg->tls_key != NULL ? cfg->tls_key : "",
                                 cfg->tls_ca != NULL ? cfg->tls_ca : "", err, errlen);
        if (rc != 0) {
            return rc;
        }
    }
    const char *token = cfg->token != NULL ? cfg->token : "";
    uint64_t one = 1;
    bool changed;

    pthread_mutex_lock(&p->lock);
    /* new TLS files were read above: they count as a change (a certificate fixed) */
    changed = strcmp(p->token, token) != 0 || (p->tls != NULL && cfg->tls_cert != NULL &&
                                                 cfg->tls_cert[0] != '\0');
    snprintf(p->token, sizeof(p->token), "%s", token);
    p->relogin |= changed;
    pthread_mutex_unlock(&p->lock);
    if (changed && write(p->evfd, &one, sizeof(one)) < 0) {
        /* the loop wakes within PEER_WAIT_MAX_MS anyway */
    }
    return 0;
}

void
peer_pool_destroy(struct peer_pool *p)
{
    uint64_t one = 1;

    if (p == NULL) {
        return;
    }
    if (p->started) {
        atomic_store_explicit(&p->stop, true, memory_order_release);
        if (write(p->evfd, &one, sizeof(one)) < 0) {
            /* the loop wakes within PEER_WAIT_MAX_MS anyway */
        }
        pthread_join(p->thread, NULL);
    }
    peer_fail_list(p, p->incoming, KV_UNAVAILABLE);
    while (p->conns != NULL) {
        struct peer_conn *c = p->conns;

        p->conns = c->next;
        peer_rdma_stop(&c->rdma, PEER_RDMA_NONE);  /* before the calls fail, as in down */
        peer_fail_list(p, c->wq, KV_UNAVAILABLE);
        peer_fail_list(p, c->fq, KV_UNAVAILABLE);
        peer_tls_close(c->tls);
        if (c->fd >= 0) {
            close(c->fd);
        }
        free(c->in);
        free(c->holes);
        free(c);
    }
    if (p->epfd >= 0) {
        close(p->epfd);
    }
    if (p->evfd >= 0) {
        close(p->evfd);
    }
    if (p->cq != NULL) {
        (void)rdma_cq_poll(p->cq, (struct rdma_done[1]){{0}}, 1);   /* nothing is posted here */
        rdma_cq_destroy(p->cq);
    }
    pthread_mutex_destroy(&p->lock);
    peer_tls_ctx_free(p->tls);
    free(p);
}

void
peer_stats(struct peer_pool *p, struct peer_stats *out)
{
    out->requests = atomic_load_explicit(&p->requests, memory_order_relaxed);
    out->errors = atomic_load_explicit(&p->errors, memory_order_relaxed);
    out->timeouts = atomic_load_explicit(&p->timeouts, memory_order_relaxed);
    out->bytes_out = atomic_load_explicit(&p->bytes_out, memory_order_relaxed);
    out->bytes_in = atomic_load_explicit(&p->bytes_in, memory_order_relaxed);
    out->connects = atomic_load_explicit(&p->connects, memory_order_relaxed);
    out->in_flight = atomic_load_explicit(&p->in_flight, memory_order_relaxed);
    out->auth_failures = atomic_load_explicit(&p->auth_failures, memory_order_relaxed);
    out->rdma_connects = atomic_load_explicit(&p->rdma_connects, memory_order_relaxed);
    out->rdma_fallbacks = atomic_load_explicit(&p->rdma_fallbacks, memory_order_relaxed);
}
