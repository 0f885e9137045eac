/*
 * worker: an event-loop thread: its event_base, the notification pipe and
 * the queue of accepted descriptors the main thread hands it, their
 * adoption as connections, the drain, the once-a-second tick, the wake-up
 * of requests waiting for the SSD tier or a copy, and its RDMA completion
 * channel. It owns the struct conn_loop its connections live on and the
 * counters in it. It never accepts, never reads the config file and never
 * looks at another worker; what a connection does is conn.c's.
 */
#include "worker.h"

#include <errno.h>
#include <event2/event.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <unistd.h>

#include "kverr.h"
#include "log.h"
#include "rdma_port.h"
#include "rpc.h"

#define WORKER_TLS_FD (1 << 30)         /* marks a TLS connection's fd in the pending queue */
#define WORKER_RESP_FD (1 << 29)        /* ... and one of a RESP2 port (CONN_RESP) */

struct worker {
    struct conn_loop loop;           /* what its connections see (conn.h) */
    pthread_t thread;
    int notify_rd, notify_wr;
    struct event *notify_ev;
    pthread_mutex_t lock;            /* protects pending[] */
    int *pending;                    /* accepted fds waiting to be adopted */
    int npending, cappending;
    _Atomic bool drain_asked;        /* set by the main thread before it writes 'd' */
    _Atomic int done;
    struct event *wake_ev;           /* made active by the SSD tier's threads */
    struct event *tick_ev;           /* once a second: reclaim expired reservations */
    struct event *rdma_ev;           /* loop.rdma_cq's channel is readable */
};

static void
worker_on_notify(evutil_socket_t fd, short what, void *arg)
{
    struct worker *w = arg;
    char buf[64];
    bool drain;
    (void)what;

    while (read(fd, buf, sizeof(buf)) > 0) {
        /* the bytes only wake us: what to do is in the state they announce */
    }
    /* 'd': a drain is asked through the flag, so a byte lost to a full pipe loses nothing */
    drain = atomic_load_explicit(&w->drain_asked, memory_order_acquire);
    for (;;) {
        int fds[64], n = 0;
        pthread_mutex_lock(&w->lock);
        while (n < 64 && w->npending > 0) {
            fds[n++] = w->pending[--w->npending];
        }
        pthread_mutex_unlock(&w->lock);
        if (n == 0) {
            break;
        }
        for (int i = 0; i < n; i++) {
            int f = fds[i];
            int u = f < 0 ? -f - 1 : f;
            int kind = f < 0 ? CONN_UNIX : (u & WORKER_TLS_FD) ? CONN_TLS : CONN_TCP;
            int cfd = u & ~(WORKER_TLS_FD | WORKER_RESP_FD);

            kind |= (u & WORKER_RESP_FD) ? CONN_RESP : 0;

            if (w->loop.draining || drain) {
                close(cfd);
                atomic_fetch_sub_explicit(w->loop.connections, 1, memory_order_relaxed);
                continue;
            }
            conn_adopt(&w->loop, cfd, kind);
        }
    }
    /*
     * 'r': a reload was published. Checked on every wake, not only on 'r', so a byte lost to
     * a full pipe loses nothing (a full pipe wakes us anyway); cheap when nothing changed.
     */
    conn_auth_recheck(&w->loop);
    if (drain && !w->loop.draining) {
        w->loop.draining = true;
        conn_drain_all(&w->loop);
        if (w->loop.conns == NULL) {
            event_base_loopbreak(w->loop.base);
        }
    }
}

/* The SSD tier made progress: requests waiting for it may go on. */
static void
worker_on_wake(evutil_socket_t fd, short what, void *arg)
{
    struct worker *w = arg;
    (void)fd;
    (void)what;
    conn_retry_waiting(&w->loop);
}

/* Once a second: reservations nobody finished go back. */
static void
worker_on_tick(evutil_socket_t fd, short what, void *arg)
{
    struct worker *w = arg;
    (void)fd;
    (void)what;
    conn_expire_all(&w->loop);
}

/* A worker's completion queue has completions: account them, then let waiting replies go. */
static void
worker_on_rdma(evutil_socket_t fd, short what, void *arg)
{
    struct worker *w = arg;

    (void)fd;
    (void)what;
    if (rpc_rdma_cq_poll(w->loop.rdma_cq) > 0) {
        conn_retry_waiting(&w->loop);
    }
}

static void *
worker_run(void *arg)
{
    struct worker *w = arg;

    event_base_dispatch(w->loop.base);
    atomic_store(&w->done, 1);
    return NULL;
}

int
worker_create(const struct worker_env *env, int idx, struct worker **out)
{
    const struct timeval tick = {1, 0};
    struct worker *w = calloc(1, sizeof(*w));
    int p[2];

    *out = w;
    if (w == NULL) {
        return -ENOMEM;
    }
    w->notify_rd = w->notify_wr = w->loop.ready_ep = -1;
    pthread_mutex_init(&w->lock, NULL);
    w->loop.idx = idx;
    w->loop.live_conf = env->conf;
    w->loop.rpc = env->rpc;
    w->loop.store = env->store;
    w->loop.connections = env->connections;
    w->loop.tls_new = env->tls_new;
    w->loop.tls_arg = env->tls_arg;
    w->loop.base = event_base_new();
    w->loop.discard = malloc(CONN_DISCARD_SIZE);
    if (w->loop.base == NULL || w->loop.discard == NULL) {
        return -ENOMEM;
    }
    w->loop.ready_ep = epoll_create1(EPOLL_CLOEXEC);
    if (w->loop.ready_ep < 0) {
        return -errno;
    }
    if (pipe2(p, O_NONBLOCK | O_CLOEXEC) != 0) {
        return -errno;
    }
    w->notify_rd = p[0];
    w->notify_wr = p[1];
    w->notify_ev = event_new(w->loop.base, w->notify_rd, EV_READ | EV_PERSIST, worker_on_notify,
                             w);
    if (w->notify_ev == NULL || event_add(w->notify_ev, NULL) != 0) {
        return -ENOMEM;
    }
    w->wake_ev = event_new(w->loop.base, -1, 0, worker_on_wake, w);
    if (w->wake_ev == NULL) {
        return -ENOMEM;
    }
    w->tick_ev = event_new(w->loop.base, -1, EV_PERSIST, worker_on_tick, w);
    if (w->tick_ev == NULL || event_add(w->tick_ev, &tick) != 0) {
        return -ENOMEM;
    }
    if (env->rdma_dev != NULL) {
        int rc = rdma_cq_create(env->rdma_dev, WORKER_RDMA_CQ_SIZE, &w->loop.rdma_cq);

        if (rc != 0) {
            return rc < 0 ? rc : -ENOMEM;
        }
        w->rdma_ev = event_new(w->loop.base, rdma_cq_fd(w->loop.rdma_cq), EV_READ | EV_PERSIST,
                               worker_on_rdma, w);
        if (w->rdma_ev == NULL || event_add(w->rdma_ev, NULL) != 0) {
            return -ENOMEM;
        }
    }
    conn_refresh_limits(&w->loop);
    w->loop.auth_conf = w->loop.conf;
    return 0;
}

int
worker_start(struct worker *w)
{
    return pthread_create(&w->thread, NULL, worker_run, w);
}

int
worker_hand_off(struct worker *w, int fd, enum conn_kind kind)
{
    pthread_mutex_lock(&w->lock);
    if (w->npending == w->cappending) {
        int cap = w->cappending ? w->cappending * 2 : 64;
        int *p = realloc(w->pending, (size_t)cap * sizeof(*p));
        if (p == NULL) {
            pthread_mutex_unlock(&w->lock);
            return -ENOMEM;
        }
        w->pending = p;
        w->cappending = cap;
    }
    /* the sign and a high bit carry the transport, another high bit the protocol */
    int v = fd | ((kind & CONN_RESP) ? WORKER_RESP_FD : 0);
    int tp = kind & ~CONN_RESP;
    w->pending[w->npending++] = tp == CONN_UNIX ? -v - 1
                                : tp == CONN_TLS ? v | WORKER_TLS_FD
                                                 : v;
    pthread_mutex_unlock(&w->lock);
    char b = 'c';
    if (write(w->notify_wr, &b, 1) < 0 && errno != EAGAIN) {
        log_error("worker %d notify: %s", w->loop.idx, strerror(errno));
    }
    return 0;
}

/* worker_notify: wake w with command byte b. A full pipe (EAGAIN) is not an error: w will wake. */
static void
worker_notify(struct worker *w, char b)
{
    if (write(w->notify_wr, &b, 1) < 0 && errno != EAGAIN) {
        log_error("worker %d notify: %s", w->loop.idx, strerror(errno));
    }
}

void
worker_reload(struct worker *w)
{
    worker_notify(w, 'r');
}

void
worker_drain(struct worker *w)
{
    /* The flag is what counts: a byte lost to a full pipe still finds a wake pending. */
    atomic_store_explicit(&w->drain_asked, true, memory_order_release);
    worker_notify(w, 'd');
}

bool
worker_done(struct worker *w)
{
    return atomic_load(&w->done) != 0;
}

void
worker_break(struct worker *w)
{
    event_base_loopbreak(w->loop.base);
}

void
worker_stop(struct worker *w)
{
    char b = 'd';

    event_base_loopbreak(w->loop.base);
    atomic_store_explicit(&w->drain_asked, true, memory_order_release);
    if (write(w->notify_wr, &b, 1) < 0) {
        /* the loopbreak above is enough */
    }
}

void
worker_join(struct worker *w)
{
    pthread_join(w->thread, NULL);
}

void
worker_wake(struct worker *w)
{
    if (w->wake_ev != NULL) {
        event_active(w->wake_ev, EV_READ, 0);
    }
}

const struct conn_counters *
worker_counters(const struct worker *w)
{
    return &w->loop.ctr;
}

void
worker_destroy(struct worker *w)
{
    if (w == NULL) {
        return;
    }
    if (w->loop.base != NULL) {
        conn_close_all(&w->loop);
    }
    if (w->rdma_ev != NULL) {
        event_free(w->rdma_ev);
    }
    if (w->loop.rdma_cq != NULL) {
        /* The closed connections' queue pairs flushed their work: free what waited for it. */
        (void)rpc_rdma_cq_poll(w->loop.rdma_cq);
        rdma_cq_destroy(w->loop.rdma_cq);
    }
    if (w->notify_ev != NULL) {
        event_free(w->notify_ev);
    }
    if (w->tick_ev != NULL) {
        event_free(w->tick_ev);
    }
    if (w->wake_ev != NULL) {
        event_free(w->wake_ev);
    }
    if (w->loop.base != NULL) {
        event_base_free(w->loop.base);
    }
    if (w->notify_rd >= 0) {
        close(w->notify_rd);
    }
    if (w->notify_wr >= 0) {
        close(w->notify_wr);
    }
    if (w->loop.ready_ep >= 0) {
        close(w->loop.ready_ep);
    }
    for (int i = 0; i < w->npending; i++) {
        int f = w->pending[i];
        close((f < 0 ? -f - 1 : f) & ~(WORKER_TLS_FD | WORKER_RESP_FD));
    }
    free(w->pending);
    free(w->loop.discard);
    pthread_mutex_destroy(&w->lock);
    free(w);
}
