/*
 * worker: one event-loop thread and the connections it owns. A worker
 * runs a libevent event_base with its notification pipe, the queue of
 * accepted descriptors handed to it, a once-a-second tick, the wake-up the
 * SSD tier and the copy threads make active, and the completion channel of
 * its RDMA work; its connections see it only as the struct conn_loop it
 * passes them (conn.h). It does not accept, read the command line, handle
 * signals or publish configs: that is the process's (server.c), which
 * talks to it through the calls below.
 *
 * Threads and ownership:
 *   - worker_run runs on the worker's own thread, and everything that
 *     touches its loop, its connections or its conn_loop happens there: no
 *     other thread touches a connection, start to end;
 *   - the main thread hands it descriptors (worker_hand_off) through the
 *     pending queue (a mutex, a leaf: nothing else is taken under it) and
 *     the notification pipe, and asks it to recheck logins after a reload
 *     (worker_reload) or to drain (worker_drain) the same way;
 *   - worker_wake and worker_break may be called from any thread (libevent
 *     is set up for threads by server_create);
 *   - the config snapshot is the server's atomic pointer: the worker loads
 *     it on each callback (conn_refresh_limits); snapshots live until exit;
 *   - its counters are written by its thread only (relaxed atomics);
 *     stats_collect reads them through worker_counters.
 * worker_create, worker_start, worker_join and worker_destroy belong to the
 * main thread.
 */
#ifndef WORKER_H
#define WORKER_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "conn.h"

struct kv_config;
struct rdma_dev;
struct rpc_server;
struct store;
struct worker;

#define WORKER_RDMA_CQ_SIZE 65536   /* completion entries per worker: 512 queue pairs of 128 */

/* worker_env: what every worker shares with the process; all borrowed for the workers' life. */
struct worker_env {
    _Atomic(const struct kv_config *) *conf; /* the current snapshot (server.c publishes) */
    const struct rpc_server *rpc;            /* the request layer's server-wide state */
    struct store *store;
    struct rdma_dev *rdma_dev;               /* the RDMA device, or NULL */
    _Atomic uint64_t *connections;           /* open connections: a worker takes one off for
                                                each it closes or refuses */
    conn_tls_new_fn tls_new;                 /* a new TLS connection's SSL (conn.h) */
    void *tls_arg;
};

/*
 * worker_create: build worker number idx (its event base, pipe, events,
 * scratch and, with env->rdma_dev, its completion queue) without starting
 * its thread. env's pointers are kept (borrowed). Returns 0 and *out, or
 * -errno (-ENOMEM too when the completion queue cannot be made); on failure
 * *out is set all the same (NULL if out of memory), for worker_destroy.
 */
int worker_create(const struct worker_env *env, int idx, struct worker **out);

/* worker_start: start w's thread (worker_run). Returns 0 or a pthread_create error number. */
int worker_start(struct worker *w);

/*
 * worker_hand_off: queue accepted non-blocking fd, of transport kind, for w
 * to adopt on its thread, and wake it. Main thread. Returns 0, or -ENOMEM:
 * fd was not taken (the caller closes it and accounts it).
 */
int worker_hand_off(struct worker *w, int fd, enum conn_kind kind);

/*
 * worker_reload: a new config snapshot was published: w closes, on its
 * thread, the connections whose login it revokes (conn_auth_recheck).
 * Main thread; a write error other than a full pipe is logged.
 */
void worker_reload(struct worker *w);

/*
 * worker_drain: the server stops: w adopts nothing more, closes its idle
 * connections, lets the others finish their replies (conn_drain_all), and
 * its loop ends with its last connection (then worker_done). Main thread.
 */
void worker_drain(struct worker *w);

/* worker_done: whether w's loop has ended (its thread is about to return). Any thread. */
bool worker_done(struct worker *w);

/* worker_break: make w's loop end at once, connections or not. Any thread. */
void worker_break(struct worker *w);

/*
 * worker_stop: make w's loop end at once and keep it from adopting more
 * (worker_break and the drain flag; nothing logged). Main thread, before
 * worker_join.
 */
void worker_stop(struct worker *w);

/* worker_join: wait for w's thread, started and stopped, to end. Main thread. */
void worker_join(struct worker *w);

/* worker_wake: the SSD tier or a copy finished: w retries its waiting requests. Any thread. */
void worker_wake(struct worker *w);

/*
 * worker_counters: w's counters (conn.h), written by w's thread only: read
 * them with relaxed loads. Valid until worker_destroy.
 */
const struct conn_counters *worker_counters(const struct worker *w);

/*
 * worker_destroy: close w's connections and free everything, fds still in
 * its queue closed. Its thread must have ended (worker_join) or never
 * started. Accepts NULL and a worker worker_create failed to finish.
 */
void worker_destroy(struct worker *w);

#endif
