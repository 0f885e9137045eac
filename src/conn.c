/*
 * conn: the per-connection state machine: frame, spill, dispatch, write,
 * backpressure, close, the same for both protocols it may speak (what their
 * bytes mean is its protocol table's, c->proto: conn_proto.c). The reads
 * themselves (one syscall into the buffer or
 * straight into a put's reservation, received descriptors) are in
 * conn_read.c; the bytes on the socket are its transport's (transport.h:
 * TCP, Unix, TLS), which it calls through c->tp and never asks which;
 * struct conn, which they all use, is in conn_int.h.
 *
 * Everything here runs on the owning worker's thread; the only shared thing
 * it calls is the store (through rpc). It owns the socket fd, its two
 * libevent events, the input buffer, the spill decisions of the message
 * being received, and the outq. It must never block: sockets are
 * non-blocking, and reads per wake-up are bounded so one busy client cannot
 * starve the others on the same loop.
 */
#include "conn.h"
#include "clock.h"
#include "config.h"
#include "conn_int.h"

#include <errno.h>
#include <event2/event.h>
#include <limits.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <arpa/inet.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#include "frame.h"
#include "kverr.h"
#include "log.h"
#include "mp.h"
#include "outq.h"
#include "rpc.h"
#include "store.h"
#include "transport.h"

#define CONN_IBUF_MIN (64u * 1024u)
#define CONN_READS_PER_WAKE 16
#define CONN_SPILL_MIN (16u * 1024u)
#define CONN_IOV_MAX 256
#define CONN_RETRY_US 20000         /* a waiting request is retried at least this often (the
                                       tier's wake-ups usually come first) */
#define CONN_WAIT_MAX_MS 5000       /* then it is answered with whatever is there */
#define CONN_LOOKAHEAD_MAX (256u * 1024u) /* buffered bytes read while a get waits */
#define CONN_PREAUTH_MAX 4096u      /* the largest message before hello {tenant, token} */
#define CONN_MESSAGES_PER_WAKE 64   /* then other connections of the loop get their turn */
#define CONN_TURN (512u * 1024u)    /* a turn's bytes while another connection waits */
#define CONN_READY_PEEK 16          /* ready connections looked at per check */

/* The input buffers of every connection together (conn_buffer_memory). */
static _Atomic uint64_t conn_buffer_bytes;

static _Atomic uint64_t conn_next_id = 1;

static void conn_on_read(evutil_socket_t fd, short what, void *arg);
static void conn_on_more(evutil_socket_t fd, short what, void *arg);
static void conn_fail(struct conn *c, int status, const char *why);
static void conn_on_write(evutil_socket_t fd, short what, void *arg);

/* ---- lifecycle ---- */

/*
 * conn_set_state: move c's life forward to s (conn_int.h); a move back is
 * ignored, so CONN_CLOSING is final and CONN_EOF never reopens.
 */
static void
conn_set_state(struct conn *c, enum conn_state s)
{
    if (s > c->state) {
        c->state = s;
    }
}

static void
conn_spills_abort(struct conn *c)
{
    struct store *store = c->w->store;

    for (size_t i = 0; i < c->nholes; i++) {
        if (c->spills[i].obj != NULL) {
            store_abort(store, c->spills[i].obj);
            c->spills[i].obj = NULL;
        }
    }
    c->nholes = 0;
    c->spill_left = 0;
    c->spill_off = 0;
}

static void
conn_free(struct conn *c)
{
    struct conn_loop *w = c->w;

    log_kv(LOG_LEVEL_DEBUG, "connection closed", LOG_NUM("conn", c->id), LOG_STR("peer", c->peer));
    conn_spills_abort(c);
    rpc_ctx_release(&c->ctx);
    for (int i = 0; i < c->nfdq; i++) {
        close(c->fdq[i]);
    }
    if (c->ev_more != NULL) {
        event_free(c->ev_more);
    }
    if (c->ev_retry != NULL) {
        event_free(c->ev_retry);
    }
    if (c->wait != CONN_WAIT_NONE) {
        w->waiting--;
    }
    outq_deinit(&c->out);
    if (c->ibuf != NULL) {
        atomic_fetch_sub_explicit(&conn_buffer_bytes, c->icap, memory_order_relaxed);
    }
    if (c->ev_read != NULL) {
        event_free(c->ev_read);
    }
    if (c->ev_write != NULL) {
        event_free(c->ev_write);
    }
    if (c->tp->close != NULL) {
        c->tp->close(c);                /* a TLS close_notify, say */
    }
    if (c->in_ready) {
        (void)epoll_ctl(w->ready_ep, EPOLL_CTL_DEL, c->fd, NULL);
    }
    if (c->fd >= 0) {
        close(c->fd);
    }
    if (c->prev != NULL) {
        c->prev->next = c->next;
    } else if (w->conns == c) {
        w->conns = c->next;
    }
    if (c->next != NULL) {
        c->next->prev = c->prev;
    }
    if (c->proto != NULL && c->proto->close != NULL) {
        c->proto->close(c);
    }
    free(c->ibuf);
    free(c->holes);
    free(c->spills);
    free(c);
    atomic_fetch_sub_explicit(w->connections, 1, memory_order_relaxed);
    if (w->draining && w->conns == NULL) {
        event_base_loopbreak(w->base);
    }
}

static void
conn_peer_name(struct conn *c)
{
    struct sockaddr_storage ss;
    socklen_t len = sizeof(ss);

    if (c->tp == &transport_unix) {
        snprintf(c->peer, sizeof(c->peer), "unix");
        return;
    }
    if (getpeername(c->fd, (struct sockaddr *)&ss, &len) != 0) {
        snprintf(c->peer, sizeof(c->peer), "?");
        return;
    }
    char host[INET6_ADDRSTRLEN] = "?";
    unsigned port = 0;
    if (ss.ss_family == AF_INET) {
        struct sockaddr_in *a = (struct sockaddr_in *)&ss;
        inet_ntop(AF_INET, &a->sin_addr, host, sizeof(host));
        port = ntohs(a->sin_port);
    } else if (ss.ss_family == AF_INET6) {
        struct sockaddr_in6 *a = (struct sockaddr_in6 *)&ss;
        inet_ntop(AF_INET6, &a->sin6_addr, host, sizeof(host));
        port = ntohs(a->sin6_port);
    }
    snprintf(c->peer, sizeof(c->peer), "%s:%u", host, port);
    snprintf(c->addr, sizeof(c->addr), "%s", host);
}

void
conn_refresh_limits(struct conn_loop *w)
{
    const struct kv_config *conf = atomic_load_explicit(w->live_conf, memory_order_acquire);

    if (conf == w->conf) {
        return;
    }
    w->conf = conf;
    w->lim.max_key_size = conf->max_key_size;
    w->lim.max_value_size = conf->max_value_size;
    w->lim.max_batch = conf->max_batch;
    w->lim.max_message_size = conf->max_message_size;
    w->lim.lease_ttl_ms = conf->lease_ttl_ms;
    w->lim.put_timeout_ms = conf->put_timeout_ms;
    w->lim.require_auth = conf->require_auth != 0;
    w->lim.tenants = &conf->tenants;    /* snapshots live until exit */
}

void
conn_auth_recheck(struct conn_loop *w)
{
    conn_refresh_limits(w);
    if (w->auth_conf == w->conf) {
        return;
    }
    /* Logins made from now on are checked against w->conf (or newer) by hello itself. */
    w->auth_conf = w->conf;
    for (struct conn *c = w->conns, *next; c != NULL; c = next) {
        const char *why;

        next = c->next;
        if (rpc_auth_holds(&c->ctx, &why)) {
            continue;
        }
        atomic_fetch_add_explicit(&w->ctr.auth_revoked, 1, memory_order_relaxed);
        conn_fail(c, KV_UNAUTHORIZED, why);
        conn_free(c);
    }
}

/* ---- failed authentication ---- */

#define CONN_AUTH_PEERS 256             /* addresses remembered */
#define CONN_AUTH_MAX_FAILS 10          /* an address that fails this often ... */
#define CONN_AUTH_WINDOW_MS 60000       /* ... within this long is refused until it ends */
#define CONN_AUTH_CONN_FAILS 3          /* a connection closes after this many */

static pthread_mutex_t conn_auth_lock = PTHREAD_MUTEX_INITIALIZER;
static struct {
    char addr[INET6_ADDRSTRLEN];
    uint32_t fails;
    uint64_t since_ms;                  /* the window's start */
} conn_auth[CONN_AUTH_PEERS];

/*
 * conn_auth_check: note a failed hello from addr (when failed), and say
 * whether addr is refused now. One table for every worker, under a mutex:
 * failures are rare, and an attacker's connections spread over the workers.
 */
static bool
conn_auth_check(const char *addr, bool failed)
{
    uint64_t now = clock_ms();
    size_t slot = 0;
    bool blocked;

    if (addr[0] == '\0') {
        return false;                   /* the Unix socket: the file mode guards it */
    }
    pthread_mutex_lock(&conn_auth_lock);
    for (size_t i = 0; i < CONN_AUTH_PEERS; i++) {
        if (strcmp(conn_auth[i].addr, addr) == 0) {
            slot = i;
            break;
        }
        if (conn_auth[i].since_ms < conn_auth[slot].since_ms) {
            slot = i;                   /* else the oldest entry goes */
        }
    }
    if (strcmp(conn_auth[slot].addr, addr) != 0 || now - conn_auth[slot].since_ms
                                                       > CONN_AUTH_WINDOW_MS) {
        if (!failed) {
            pthread_mutex_unlock(&conn_auth_lock);
            return false;
        }
        snprintf(conn_auth[slot].addr, sizeof(conn_auth[slot].addr), "%s", addr);
        conn_auth[slot].fails = 0;
        conn_auth[slot].since_ms = now;
    }
    conn_auth[slot].fails += failed;
    blocked = conn_auth[slot].fails >= CONN_AUTH_MAX_FAILS;
    pthread_mutex_unlock(&conn_auth_lock);
    return blocked;
}

/* conn_auth_account: hellos refused by the last request: close after too many. */
static void
conn_auth_account(struct conn *c)
{
    while (c->auth_seen < c->ctx.auth_failures) {
        c->auth_seen++;
        c->ctx.auth_blocked = conn_auth_check(c->addr, true) || c->ctx.auth_blocked;
        log_kv(LOG_LEVEL_WARN, "authentication failed", LOG_NUM("conn", c->id),
               LOG_STR("peer", c->peer), LOG_NUM("failures", c->auth_seen),
               LOG_STR("blocked", c->ctx.auth_blocked ? "yes" : "no"));
        atomic_fetch_add_explicit(&c->w->ctr.auth_failures, 1, memory_order_relaxed);
    }
    if (c->auth_seen >= CONN_AUTH_CONN_FAILS && c->state != CONN_CLOSING) {
        conn_fail(c, KV_UNAUTHORIZED, "too many failed hello {tenant, token}; closing");
    }
}

int
conn_adopt(struct conn_loop *w, int fd, int kind)
{
    struct conn *c = calloc(1, sizeof(*c));

    if (c == NULL) {
        log_error("conn: out of memory adopting fd %d", fd);
        close(fd);
        atomic_fetch_sub_explicit(w->connections, 1, memory_order_relaxed);
        return -ENOMEM;
    }
    int tp_kind = kind & ~CONN_RESP;
    int is_unix = tp_kind == CONN_UNIX;

    c->w = w;
    c->fd = fd;
    c->kind = tp_kind >= 0 && tp_kind < CONN_KINDS ? tp_kind : CONN_TCP;
    c->tp = tp_kind == CONN_TLS ? &transport_tls : is_unix ? &transport_unix : &transport_tcp;
    c->tp_ready = c->tp->start == NULL;
    c->proto = (kind & CONN_RESP) ? &conn_proto_resp : &conn_proto_msgpack;
    if (tp_kind == CONN_TLS) {
        if (transport_tls_open(c, w->tls_new(w->tls_arg)) != 0) {
            log_error("conn: cannot set up TLS for fd %d", fd);
            free(c);
            close(fd);
            atomic_fetch_sub_explicit(w->connections, 1, memory_order_relaxed);
            return -ENOMEM;
        }
    }
    c->id = atomic_fetch_add_explicit(&conn_next_id, 1, memory_order_relaxed);
    conn_peer_name(c);
    c->ctx.auth_blocked = conn_auth_check(c->addr, false);
    conn_refresh_limits(w);
    c->ctx.srv = w->rpc;
    c->ctx.lim = &w->lim;
    c->ctx.ctr = &w->ctr.rpc;
    c->ctx.tenant = 0;
    c->ctx.is_unix = is_unix != 0;
    c->ctx.rdma_cq = w->rdma_cq;
    if (is_unix) {
        c->ctx.take_fd = conn_take_fd;
        c->ctx.take_fd_arg = c;
    }
    outq_init(&c->out, w->store);
    c->ibuf = malloc(CONN_IBUF_MIN);
    c->icap = CONN_IBUF_MIN;
    if (c->ibuf != NULL) {
        atomic_fetch_add_explicit(&conn_buffer_bytes, c->icap, memory_order_relaxed);
    }
    c->active_ms = c->progress_ms = c->rx_ms = clock_ms();
    c->ev_read = event_new(w->base, fd, EV_READ | EV_PERSIST, conn_on_read, c);
    c->ev_write = event_new(w->base, fd, EV_WRITE | EV_PERSIST, conn_on_write, c);
    c->next = w->conns;
    if (w->conns != NULL) {
        w->conns->prev = c;
    }
    w->conns = c;
    struct epoll_event ev = {.events = EPOLLIN, .data.ptr = c};
    c->in_ready = epoll_ctl(w->ready_ep, EPOLL_CTL_ADD, fd, &ev) == 0;
    if (c->ibuf == NULL || c->ev_read == NULL || c->ev_write == NULL || !c->in_ready ||
        (c->proto->open != NULL && c->proto->open(c) != 0) || event_add(c->ev_read, NULL) != 0) {
        log_error("conn %llu %s: cannot set up (out of memory)", (unsigned long long)c->id,
                  c->peer);
        conn_free(c);
        return -ENOMEM;
    }
    c->proto->reset(c);
    c->reading = true;
    log_kv(LOG_LEVEL_DEBUG, "connection open", LOG_NUM("conn", c->id), LOG_STR("peer", c->peer),
           LOG_NUM("worker", w->idx), LOG_STR("protocol", c->proto->name));
    return 0;
}

/* ---- event arming ---- */

static void
conn_set_reading(struct conn *c, bool on)
{
    if (on == c->reading) {
        return;
    }
    if (on) {
        event_add(c->ev_read, NULL);
        c->rx_ms = clock_ms();    /* not reading was this side's doing (conn_timeouts) */
        if (c->tp->pending != NULL && c->tp->pending(c)) {
            event_active(c->ev_read, EV_READ, 0);   /* decrypted bytes the socket will not signal */
        }
    } else {
        event_del(c->ev_read);
    }
    c->reading = on;
}

static void
conn_set_writing(struct conn *c, bool on)
{
    if (on == c->writing) {
        return;
    }
    if (on) {
        event_add(c->ev_write, NULL);
    } else {
        event_del(c->ev_write);
    }
    c->writing = on;
}

/* Idle: no partial message, no spill in progress, nothing waiting or left to send. */
static bool
conn_idle(const struct conn *c)
{
    return c->ilen == c->rpos && c->spill_left == 0 && c->nholes == 0 &&
           c->wait == CONN_WAIT_NONE &&
           outq_pending(&c->out) == 0;
}

static void conn_on_retry(evutil_socket_t fd, short what, void *arg);

/*
 * conn_lookahead: while the request at rpos waits for SSD loads, scan the
 * complete requests buffered behind it and start the loads their gets will
 * need (rpc_prefetch), so the device is not idle between one batch and the
 * next. Requests are still answered in order. A value to be received
 * straight into the store (a spill offer) or a bad frame ends the lookahead:
 * such bytes are left for the normal path.
 */
static void
conn_lookahead(struct conn *c)
{
    while (c->lookahead && c->rpos + c->la_pos < c->ilen) {
        const uint8_t *p = c->ibuf + c->rpos + c->la_pos;
        int st = frame_scan(&c->la_scan, p, c->ilen - c->rpos - c->la_pos, &c->flim);

        if (st == FRAME_NEED_MORE) {
            return;
        }
        if (st != FRAME_DONE) {
            c->lookahead = false;
            return;
        }
        rpc_prefetch(&c->ctx, p, c->la_scan.pos);
        c->la_pos += c->la_scan.pos;
        frame_scan_init(&c->la_scan);
    }
}

/*
 * conn_inflight: requests dispatched whose reply is not yet all written to
 * the socket: replies in the outq, and those that wait for the SSD tier or
 * the copy threads before they are queued (client_inflight_max).
 */
static uint64_t
conn_inflight(const struct conn *c)
{
    return outq_replies(&c->out) + rpc_pending_replies(&c->ctx);
}

/*
 * conn_inflight_full: c has client_inflight_max requests in flight: pause it
 * (counted in inflight_pauses when it was not paused already) and say so.
 */
static bool
conn_inflight_full(struct conn *c)
{
    uint64_t max = c->w->conf->client_inflight_max;

    if (max == 0 || conn_inflight(c) < max) {
        return false;
    }
    if (!c->paused) {
        atomic_fetch_add_explicit(&c->w->ctr.inflight_pauses, 1, memory_order_relaxed);
    }
    c->paused = true;
    return true;
}

/*
 * conn_drained: both backpressure limits are down to half (hysteresis, so
 * a connection at a limit is not paused and resumed on every reply).
 */
static bool
conn_drained(const struct conn *c)
{
    const struct kv_config *conf = c->w->conf;

    return outq_pending(&c->out) <= conf->client_output_limit / 2
           && (conf->client_inflight_max == 0
               || conn_inflight(c) <= conf->client_inflight_max / 2);
}

/*
 * conn_yield: end c's turn with messages still buffered and go on after the
 * loop's next poll, so its other connections get their turn. Returns false
 * when the timer cannot be armed.
 */
static bool
conn_yield(struct conn *c)
{
    static const struct timeval zero = {0, 0};

    if (c->ev_more == NULL) {
        c->ev_more = evtimer_new(c->w->base, conn_on_more, c);
    }
    if (c->ev_more == NULL || evtimer_add(c->ev_more, &zero) != 0) {
        return false;
    }
    c->yielded = true;
    conn_set_reading(c, false);
    return true;
}

/*
 * conn_resume: a paused connection that has drained (conn_drained) goes
 * on: the caller reads it again, and what it buffered meanwhile is
 * processed on the loop's next turn. Called after every flush that ends a
 * turn: a flush may send everything at once, after which no write event
 * comes to resume it. A paused connection not drained has unsent output
 * (the write event comes) or replies that wait (their retry comes).
 * Returns 0, or -1 when it must close (no timer).
 */
static int
conn_resume(struct conn *c)
{
    if (!c->paused || c->wait != CONN_WAIT_NONE || !conn_drained(c)) {
        return 0;
    }
    c->paused = false;
    if (c->rpos == c->ilen || c->yielded || conn_yield(c)) {
        return 0;
    }
    log_error("conn %llu %s: cannot arm a timer; closing", (unsigned long long)c->id, c->peer);
    return -1;
}

/* conn_reading_wanted: whether the socket should be read now. */
static bool
conn_reading_wanted(const struct conn *c)
{
    if (c->state != CONN_OPEN || c->paused || c->w->draining || c->yielded) {
        return false;               /* (yielded: the backlog goes first) */
    }
    return c->wait != CONN_WAIT_TIER
           || (c->lookahead && c->ilen - c->rpos < CONN_LOOKAHEAD_MAX);
}

/*
 * conn_wait: the current request waits for the SSD tier (a load, room in
 * DRAM, a durable write). Nothing more is read or dispatched on this
 * connection until it goes on (replies stay in order, and bytes of a value
 * still on the wire stay there). A timer and the tier's wake-ups retry it.
 */
static void
conn_wait(struct conn *c)
{
    static const struct timeval tv = {0, CONN_RETRY_US};

    if (c->wait == CONN_WAIT_NONE) {
        c->wait = CONN_WAIT_TIER;
        c->w->waiting++;
    }
    if (c->wait_since == 0) {
        c->wait_since = clock_ms();  /* kept across retries: the deadline is per request */
    }
    if (c->ev_retry == NULL) {
        c->ev_retry = evtimer_new(c->w->base, conn_on_retry, c);
    }
    if (c->ev_retry == NULL || evtimer_add(c->ev_retry, &tv) != 0) {
        log_error("conn %llu %s: cannot arm a timer; closing", (unsigned long long)c->id, c->peer);
        conn_set_state(c, CONN_CLOSING);
        return;
    }
    conn_set_reading(c, false);
}

static void
conn_wait_end(struct conn *c)
{
    if (c->wait != CONN_WAIT_NONE) {
        c->wait = CONN_WAIT_NONE;
        c->w->waiting--;
        if (c->ev_retry != NULL) {
            evtimer_del(c->ev_retry);
        }
    }
}

/* ---- output ---- */

/* conn_refuse: see conn_int.h (a transport's start calls it). */
void
conn_refuse(struct conn *c, int status, const char *why)
{
    struct outq q;
    struct iovec iov[4];
    int n;
    uint8_t sink[4096];

    while (recv(c->fd, sink, sizeof(sink), MSG_DONTWAIT) > 0) {
    }
    outq_init(&q, c->w->store);
    if (c->proto->notify(&q, status, why) == 0) {
        n = outq_peek(&q, iov, 4);
        (void)writev(c->fd, iov, n);  /* best effort, never waits */
    }
    outq_deinit(&q);
    (void)shutdown(c->fd, SHUT_WR);
}

/*
 * conn_others_waiting: whether another connection of c's loop sits between requests
 * (conn_idle) with its next one readable. A connection moving a bulk transfer asks
 * every CONN_TURN bytes and gives up its turn if so: a loopback peer with a wide window
 * takes tens of megabytes in one writev, a put reads as fast, and a probe queued behind
 * a few of those turns waited 7-12 ms. One epoll_wait with no timeout on the worker's
 * ready_ep, which holds every connection level-triggered for input; busy connections
 * are in it too and are passed over here.
 */
static bool
conn_others_waiting(struct conn *c)
{
    struct epoll_event ev[CONN_READY_PEEK];
    int n = epoll_wait(c->w->ready_ep, ev, CONN_READY_PEEK, 0);

    for (int i = 0; i < n; i++) {
        struct conn *o = ev[i].data.ptr;
        if (o != c && !o->bulk && o->reading && conn_idle(o)) {
            return true;
        }
    }
    return false;
}

/* conn_iov_clip: cut iov[0..n) to at most max bytes; returns the segments left. */
static int
conn_iov_clip(struct iovec *iov, int n, size_t max)
{
    for (int i = 0; i < n; i++) {
        if (iov[i].iov_len >= max) {
            iov[i].iov_len = max;
            return i + 1;
        }
        max -= iov[i].iov_len;
    }
    return n;
}

/*
 * conn_flush: write what the socket takes, at most CONN_TURN_MAX bytes a writev. While
 * another connection of the loop waits with a request (conn_others_waiting), a bulk
 * reply lets it go first once, then goes on CONN_TURN bytes a turn. What is left goes
 * out on the write event, which fires again on the loop's next poll. Returns 0, or -1
 * when the connection broke.
 */
static int
conn_flush(struct conn *c)
{
    struct iovec iov[CONN_IOV_MAX];
    size_t most = CONN_TURN_MAX;

    if (outq_pending(&c->out) > CONN_TURN && conn_others_waiting(c)) {
        if (!c->passed) {
            c->passed = true;       /* once in a row: this turn comes on the next poll */
            conn_set_writing(c, true);
            return 0;
        }
        most = CONN_TURN;
    }
    c->passed = false;
    while (outq_pending(&c->out) > 0) {
        int n = conn_iov_clip(iov, outq_peek(&c->out, iov, CONN_IOV_MAX), most);
        int fd = outq_head_fd(&c->out);
        ssize_t wr = c->tp->writev(c, iov, n, fd);
        if (wr < 0) {
            if (errno == EAGAIN || errno == EWOULDBLOCK) {
                break;
            }
            if (errno == EINTR) {
                continue;
            }
            if (errno != EPIPE && errno != ECONNRESET) {
                log_info("conn %llu %s: writev: %s", (unsigned long long)c->id, c->peer,
                         strerror(errno));
            }
            return -1;
        }
        if (fd >= 0 && wr > 0) {
            outq_fd_sent(&c->out);
        }
        if (wr > 0) {
            c->active_ms = c->progress_ms = clock_ms();
        }
        outq_consume(&c->out, (size_t)wr);
        c->turn_bytes += (size_t)wr;
        atomic_store_explicit(&c->w->ctr.bytes_out,
                              atomic_load_explicit(&c->w->ctr.bytes_out, memory_order_relaxed) +
                                  (uint64_t)wr,
                              memory_order_relaxed);
        conn_ctr_add(&c->w->ctr.kind_bytes_out[c->kind], (uint64_t)wr);
        if (outq_pending(&c->out) > 0 && (size_t)wr == most &&
            (most == CONN_TURN || conn_others_waiting(c))) {
            conn_set_writing(c, true);
            return 0;
        }
    }
    conn_set_writing(c, outq_pending(&c->out) > 0 || c->tp_want_write); /* (or a read waits) */
    return 0;
}

/* Send the error notification once and close. */
static void
conn_fail(struct conn *c, int status, const char *why)
{
    struct conn_loop *w = c->w;

    log_kv(LOG_LEVEL_INFO, "connection closing", LOG_NUM("conn", c->id), LOG_STR("peer", c->peer),
           LOG_STR("code", kv_errname(status)), LOG_STR("reason", why));
    if (status == KV_PROTOCOL_ERROR) {
        atomic_store_explicit(
            &w->ctr.protocol_errors,
            atomic_load_explicit(&w->ctr.protocol_errors, memory_order_relaxed) + 1,
            memory_order_relaxed);
    }
    conn_spills_abort(c);
    if (c->proto->notify(&c->out, status, why) == 0) {
        (void)conn_flush(c); /* best effort: the peer may not be reading */
    }
    conn_set_state(c, CONN_CLOSING);
}

/* ---- input ---- */

static void
conn_message_reset(struct conn *c)
{
    c->proto->reset(c);
    c->nholes = 0;
}

/* Dispatch one complete message of scan.pos bytes at rpos. Returns 0 or -1 (close). */
static int
conn_dispatch(struct conn *c)
{
    for (size_t i = 0; i < c->nholes; i++) {
        c->holes[i].tag = &c->spills[i];
    }
    conn_fds_expire(c);
    int rc = c->proto->dispatch(c);
    if (rc == -EAGAIN) {
        bool first = !c->lookahead;

        conn_wait(c);           /* the same message is dispatched again */
        if (first && c->nholes == 0 && c->spill_left == 0 && c->proto->prefetch) {
            /* Nothing of it is on the wire any more: read on behind it and prefetch. */
            c->lookahead = true;
            c->la_pos = c->scan.pos;
            frame_scan_init(&c->la_scan);
        }
        conn_lookahead(c);
        if (c->lookahead && conn_reading_wanted(c)) {
            conn_set_reading(c, true);
        }
        return c->state == CONN_CLOSING ? -1 : 1;
    }
    c->lookahead = false;
    c->wait_since = 0;
    c->rpos += c->scan.pos;
    conn_message_reset(c);
    if (c->ctx.auth_failures != c->auth_seen) {
        conn_auth_account(c);
        if (c->state == CONN_CLOSING) {
            return -1;
        }
    }
    if (rc == KV_PROTOCOL_ERROR) {
        conn_fail(c, KV_PROTOCOL_ERROR, "not a msgpack-rpc request ([0, msgid, method, params])");
        return -1;
    }
    if (rc == CONN_PROTO_QUIT) {
        /* Answered; the peer asked to close: nothing after it is read or answered. */
        c->ilen = c->rpos;
        conn_set_state(c, CONN_EOF);
        return 1;
    }
    if (rc != 0) {
        log_error("conn %llu %s: out of memory building a reply; closing",
                  (unsigned long long)c->id, c->peer);
        conn_set_state(c, CONN_CLOSING);
        return -1;
    }
    return 0;
}

/* What conn_poll_pending found. */
enum conn_poll {
    CONN_POLL_CLOSE,            /* the connection must close */
    CONN_POLL_DONE,             /* no deferred reply waits any more */
    CONN_POLL_WAIT,             /* some still wait: c waits (CONN_WAIT_TIER) */
    CONN_POLL_OVERLAP,          /* only batch_get_into transfers wait, with room behind them:
                                   another batch_get_into may start (CONN_WAIT_XFER) */
};

/*
 * conn_poll_pending: replies that wait (durable puts, transfers) are queued
 * once their work is done, in order. A connection in CONN_WAIT_XFER is back
 * in CONN_WAIT_TIER until this poll says the transfers still leave room.
 */
static enum conn_poll
conn_poll_pending(struct conn *c)
{
    int rc;

    if (c->wait == CONN_WAIT_XFER) {
        c->wait = CONN_WAIT_TIER;
    }
    if (!rpc_pending(&c->ctx)) {
        return CONN_POLL_DONE;
    }
    rc = rpc_deferred_poll(&c->ctx, &c->out);
    if (rc == -EINPROGRESS) {
        conn_wait(c);
        if (rpc_xfer_room(&c->ctx)) {
            c->wait = CONN_WAIT_XFER;
            conn_set_reading(c, conn_reading_wanted(c));
        }
        return c->state == CONN_CLOSING     ? CONN_POLL_CLOSE
               : c->wait == CONN_WAIT_XFER ? CONN_POLL_OVERLAP
                                           : CONN_POLL_WAIT;
    }
    if (rc != 0) {
        conn_set_state(c, CONN_CLOSING);
        return CONN_POLL_CLOSE;
    }
    c->wait_since = 0;
    return CONN_POLL_DONE;
}

/*
 * Scan and dispatch what is buffered. Stops at a partial message, at a spill
 * (the body must be read first), or when output is over the limit.
 * Returns 0 or -1 (closing).
 */
static int
conn_process(struct conn *c)
{
    uint64_t out_limit = c->w->conf->client_output_limit;
    int budget = CONN_MESSAGES_PER_WAKE;

    c->flim.max_message_size = c->w->lim.max_message_size;
    if (c->w->lim.require_auth && !c->ctx.authed && c->flim.max_message_size > CONN_PREAUTH_MAX) {
        c->flim.max_message_size = CONN_PREAUTH_MAX;    /* a stranger sends small messages */
    }
    c->flim.max_depth = FRAME_MAX_DEPTH;
    c->flim.spill_min = CONN_SPILL_MIN;

    while (c->spill_left == 0 && c->rpos < c->ilen) {
        enum conn_poll prc = conn_poll_pending(c);

        if (prc == CONN_POLL_CLOSE) {
            return -1;
        }
        if (prc == CONN_POLL_WAIT || (prc == CONN_POLL_DONE && c->wait != CONN_WAIT_NONE)) {
            return 0;
        }
        if (outq_pending(&c->out) > c->w->conf->client_output_max) {
            atomic_fetch_add_explicit(&c->w->ctr.output_cap_closes, 1, memory_order_relaxed);
            conn_fail(c, KV_UNAVAILABLE, "more unsent output than client_output_max");
            return -1;
        }
        if (outq_pending(&c->out) > out_limit) {
            c->paused = true;
            return 0;
        }
        if (conn_inflight_full(c)) {
            return 0;
        }
        if (budget-- == 0) {
            /* Fair to the loop's other connections: go on after the loop's next poll. */
            if (!conn_yield(c)) {
                break;                  /* cannot yield: go on now */
            }
            return 0;
        }
        int st = FRAME_SPILL;
        if (c->offer_pending) {
            c->offer_pending = false;   /* the same offer, asked again */
        } else {
            st = c->proto->scan(c);
        }
        if (st == FRAME_DONE) {
            int d;

            if (prc == CONN_POLL_OVERLAP
                && !rpc_overlaps(&c->ctx, c->ibuf + c->rpos, c->scan.pos)) {
                c->wait = CONN_WAIT_TIER;   /* it waits for the transfers before it */
                conn_set_reading(c, conn_reading_wanted(c));
                return 0;
            }
            d = conn_dispatch(c);
            if (d != 0) {
                return d < 0 ? -1 : 0;  /* closing, or the message waits (held) */
            }
            continue;
        }
        if (st == FRAME_NEED_MORE) {
            break;
        }
        if (st == FRAME_ERROR) {
            conn_fail(c, KV_PROTOCOL_ERROR, c->scan.error ? c->scan.error : "malformed message");
            return -1;
        }
        /* FRAME_SPILL */
        if (prc == CONN_POLL_OVERLAP) {
            c->offer_pending = true;    /* a put: it waits for the transfers before it */
            c->wait = CONN_WAIT_TIER;
            conn_set_reading(c, conn_reading_wanted(c));
            return 0;
        }
        struct rpc_spill sp = {.obj = NULL};
        if (!c->proto->take(c, &sp)) {
            c->proto->decline(c);
            continue;
        }
        if (sp.obj == NULL && sp.code == -EAGAIN) {
            c->offer_pending = true;    /* leave the value on the wire until there is room */
            conn_wait(c);
            return c->state == CONN_CLOSING ? -1 : 0;
        }
        if (conn_hole_add(c, c->scan.spill_len) < 0) {
            store_abort(c->w->store, sp.obj);
            log_error("conn %llu %s: out of memory; closing", (unsigned long long)c->id, c->peer);
            conn_set_state(c, CONN_CLOSING);
            return -1;
        }
        c->spills[c->nholes - 1] = sp;
        c->wait_since = 0;
        c->spill_left = c->scan.spill_len;
        c->spill_off = 0;
        size_t at = c->rpos + c->scan.pos;
        conn_spill_fill(c, c->ibuf + at, c->scan.spill_have);
        c->ilen = at; /* the buffered part of the body now lives in the store */
    }
    /* The last buffered message may have left a reply waiting. */
    if (conn_poll_pending(c) == CONN_POLL_CLOSE) {
        return -1;
    }
    if (c->rpos == c->ilen) {
        c->rpos = c->ilen = 0;
    }
    return 0;
}

/* Make room in ibuf for more of the current message. Returns 0 or -1 (no memory). */
int
conn_ibuf_room(struct conn *c)
{
    if (c->ilen < c->icap) {
        return 0;
    }
    if (c->rpos > 0) {
        memmove(c->ibuf, c->ibuf + c->rpos, c->ilen - c->rpos);
        c->ilen -= c->rpos;
        c->rpos = 0;
        return 0;
    }
    /* The frame scanner bounds a message by max_message_size, so this growth is bounded. */
    size_t cap = c->icap * 2;
    uint8_t *p;

    if (atomic_load_explicit(&conn_buffer_bytes, memory_order_relaxed) + (cap - c->icap)
        > c->w->conf->conn_buffer_memory) {
        atomic_fetch_add_explicit(&c->w->ctr.buffer_cap_closes, 1, memory_order_relaxed);
        conn_fail(c, KV_UNAVAILABLE, "the connections' input buffers are full "
                                     "(conn_buffer_memory)");
        return -1;
    }
    p = realloc(c->ibuf, cap);
    if (p == NULL) {
        return -1;
    }
    atomic_fetch_add_explicit(&conn_buffer_bytes, cap - c->icap, memory_order_relaxed);
    c->ibuf = p;
    c->icap = cap;
    return 0;
}

/* Give a big buffer back once the message that needed it is gone. */
static void
conn_ibuf_shrink(struct conn *c)
{
    if (c->icap > 4 * CONN_IBUF_MIN && c->ilen == 0) {
        uint8_t *p = malloc(CONN_IBUF_MIN);
        if (p != NULL) {
            free(c->ibuf);
            atomic_fetch_sub_explicit(&conn_buffer_bytes, c->icap - CONN_IBUF_MIN,
                                      memory_order_relaxed);
            c->ibuf = p;
            c->icap = CONN_IBUF_MIN;
        }
    }
}

static void
conn_maybe_finish_drain(struct conn *c)
{
    if (c->w->draining && c->state != CONN_CLOSING) {
        if (conn_idle(c)) {
            conn_set_state(c, CONN_CLOSING);
        } else if (c->ilen == c->rpos && c->spill_left == 0 && c->nholes == 0) {
            conn_set_reading(c, false); /* every received request is answered: read no more */
        }
    }
}

static void
conn_on_read(evutil_socket_t fd, short what, void *arg)
{
    struct conn *c = arg;
    (void)fd;
    (void)what;

    conn_refresh_limits(c->w);
    c->yielded = false;
    if (!c->tp_ready && c->tp->start(c) != 0) {
        conn_free(c);
        return;
    }
    size_t check_at = CONN_TURN;

    c->turn_bytes = 0;

    for (int i = 0; i < CONN_READS_PER_WAKE && c->state == CONN_OPEN && !c->yielded; i++) {
        ssize_t rd = conn_read_once(c);
        if (rd == 0) {
            conn_set_state(c, CONN_EOF);
            break;
        }
        if (rd < 0) {
            if (rd == -EAGAIN || rd == -EWOULDBLOCK) {
                break;
            }
            if (rd == -EINTR) {
                continue;
            }
            if (rd != -ECONNRESET) {
                log_info("conn %llu %s: read: %s", (unsigned long long)c->id, c->peer,
                         kv_strerror((int)rd));
            }
            conn_set_state(c, CONN_CLOSING);
            break;
        }
        c->active_ms = c->rx_ms = clock_ms();
        c->turn_bytes += (size_t)rd;
        if (c->wait == CONN_WAIT_TIER) {
            conn_lookahead(c);
            if (!conn_reading_wanted(c)) {
                break;
            }
            continue;
        }
        if (conn_process(c) != 0 || c->paused || c->wait == CONN_WAIT_TIER) {
            break;
        }
        if (c->rx_short && c->tp->raw) {
            /*
             * The socket had no more: the next read would answer EAGAIN, one syscall per
             * wake-up for nothing (a third of the RESP port's syscalls on pipelined GETs of
             * 4 KiB). The poll is level-triggered: bytes that came since wake it again. TLS
             * reads end at records, so a short one says nothing there.
             */
            break;
        }
        if (c->turn_bytes >= check_at) {
            if (conn_others_waiting(c)) {
                break;              /* the rest stays readable: the next poll comes back */
            }
            check_at = c->turn_bytes + CONN_TURN;
        }
    }
    if (c->state != CONN_CLOSING && (conn_flush(c) != 0 || conn_resume(c) != 0)) {
        conn_set_state(c, CONN_CLOSING);
    }
    c->bulk = c->turn_bytes >= CONN_TURN;
    if (c->state != CONN_CLOSING && (c->paused || c->wait != CONN_WAIT_NONE)) {
        conn_set_reading(c, conn_reading_wanted(c));
    }
    if (c->state != CONN_CLOSING && c->reading && c->tp->pending != NULL && c->tp->pending(c)) {
        event_active(c->ev_read, EV_READ, 0);   /* TLS holds decrypted bytes the socket does
                                                   not signal: come back for them */
    }
    if (c->state == CONN_EOF && c->wait == CONN_WAIT_NONE) {
        /* Peer is done sending: answer what it sent, then close. */
        conn_set_reading(c, false);
        if (c->rpos != c->ilen || c->spill_left > 0 || c->nholes > 0) {
            conn_set_state(c, CONN_CLOSING); /* a message cut short: nothing of it is kept */
        } else if (outq_pending(&c->out) == 0) {
            conn_set_state(c, CONN_CLOSING);
        }
    }
    conn_maybe_finish_drain(c);
    if (c->state == CONN_CLOSING) {
        conn_free(c);
    } else {
        conn_ibuf_shrink(c);
    }
}

/*
 * conn_settle: the end of a callback: a connection whose peer is done and
 * fully answered closes, a drain may finish, and a closing one is freed.
 */
static void
conn_settle(struct conn *c)
{
    if (c->state == CONN_EOF && c->wait == CONN_WAIT_NONE && outq_pending(&c->out) == 0) {
        conn_set_state(c, CONN_CLOSING);
    }
    conn_maybe_finish_drain(c);
    if (c->state == CONN_CLOSING) {
        conn_free(c);
    }
}

/*
 * conn_end_turn: after conn_process returned rc (or a write event, rc 0):
 * send what is due, resume if paused and drained, read as wanted, settle.
 * c may be gone afterwards.
 */
static void
conn_end_turn(struct conn *c, int rc)
{
    if (rc != 0 || conn_flush(c) != 0 || conn_resume(c) != 0) {
        conn_free(c);
        return;
    }
    conn_set_reading(c, conn_reading_wanted(c));
    conn_settle(c);
}

static void
conn_on_write(evutil_socket_t fd, short what, void *arg)
{
    struct conn *c = arg;
    (void)fd;
    (void)what;

    conn_refresh_limits(c->w);
    if (c->tp_want_write) {
        /* A transport's read (a TLS handshake, say) waited for this: read again; that
           flushes too. */
        c->tp_want_write = false;
        conn_set_writing(c, false);
        conn_on_read(fd, EV_READ, c);
        return;
    }
    conn_end_turn(c, 0);            /* flush; a paused connection may resume */
}

/* conn_on_more: a turn given up (CONN_MESSAGES_PER_WAKE): go on with what is buffered. */
static void
conn_on_more(evutil_socket_t fd, short what, void *arg)
{
    struct conn *c = arg;

    (void)fd;
    (void)what;
    conn_refresh_limits(c->w);
    c->yielded = false;
    conn_end_turn(c, conn_process(c));
}

/* conn_retry: look at a waiting request again; after CONN_WAIT_MAX_MS it is answered as is. */
static void
conn_retry(struct conn *c)
{
    bool final = clock_ms() - c->wait_since >= CONN_WAIT_MAX_MS;

    int rc;

    conn_refresh_limits(c->w);
    conn_wait_end(c);
    c->ctx.final_try = final;
    rc = conn_process(c);
    c->ctx.final_try = false;
    conn_end_turn(c, rc);
}

static void
conn_on_retry(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    conn_retry(arg);
}

void
conn_retry_waiting(struct conn_loop *w)
{
    struct conn *c = w->conns;

    while (c != NULL && w->waiting > 0) {
        struct conn *next = c->next;

        if (c->wait != CONN_WAIT_NONE) {
            conn_retry(c);
        }
        c = next;
    }
}

void
conn_drain_all(struct conn_loop *w)
{
    struct conn *c = w->conns;

    while (c != NULL) {
        struct conn *next = c->next;
        conn_maybe_finish_drain(c);
        if (c->state == CONN_CLOSING) {
            conn_free(c);
        }
        c = next;
    }
}

/*
 * conn_timeouts: close c when its unsent output has not moved for
 * client_output_timeout, when a request it began has not moved for
 * client_input_timeout while it was read, or when it has had nothing in flight for
 * idle_timeout. Returns true when it closed (c is gone).
 */
static bool
conn_timeouts(struct conn *c, uint64_t now)
{
    const struct kv_config *conf = c->w->conf;
    bool idle = outq_pending(&c->out) == 0 && c->wait == CONN_WAIT_NONE && c->rpos == c->ilen
                && c->spill_left == 0 && c->nholes == 0 && !rpc_pending(&c->ctx);

    if (outq_pending(&c->out) == 0) {
        c->progress_ms = now;
    } else if (now - c->progress_ms > conf->client_output_timeout) {
        atomic_fetch_add_explicit(&c->w->ctr.output_stall_closes, 1, memory_order_relaxed);
        conn_fail(c, KV_TIMEOUT, "its unsent output has not moved for client_output_timeout");
    }
    /* a request begun and not going on, while this side reads: a stalled client's */
    bool partial = c->rpos != c->ilen || c->spill_left > 0 || c->nholes > 0;
    if (c->state != CONN_CLOSING && partial && c->reading && c->wait == CONN_WAIT_NONE &&
        now - c->rx_ms > conf->client_input_timeout) {
        atomic_fetch_add_explicit(&c->w->ctr.input_stall_closes, 1, memory_order_relaxed);
        conn_fail(c, KV_TIMEOUT, "a request has not moved for client_input_timeout");
    }
    if (c->state != CONN_CLOSING && idle && conf->idle_timeout != 0
        && now - c->active_ms > conf->idle_timeout) {
        atomic_fetch_add_explicit(&c->w->ctr.idle_closes, 1, memory_order_relaxed);
        conn_fail(c, KV_TIMEOUT, "idle for idle_timeout");
    }
    if (c->state == CONN_CLOSING) {
        conn_free(c);
        return true;
    }
    return false;
}

void
conn_expire_all(struct conn_loop *w)
{
    uint64_t before = atomic_load_explicit(&w->ctr.rpc.puts_expired, memory_order_relaxed);
    uint64_t now = clock_ms();

    conn_refresh_limits(w);
    for (struct conn *c = w->conns, *next; c != NULL; c = next) {
        next = c->next;
        rpc_resv_expire(&c->ctx);
        (void)conn_timeouts(c, now);
    }
    if (atomic_load_explicit(&w->ctr.rpc.puts_expired, memory_order_relaxed) != before) {
        conn_retry_waiting(w);          /* the pages they held may be what a put waits for */
    }
}

void
conn_close_all(struct conn_loop *w)
{
    while (w->conns != NULL) {
        conn_free(w->conns);
    }
}
