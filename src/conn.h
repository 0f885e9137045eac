/*
 * conn: one client connection (TCP or Unix socket), owned by one worker
 * thread from adoption to close.
 *
 * Read path: bytes go into the connection buffer and through its protocol's
 * scan (msgpack-rpc's frame_scan, or RESP2's on a resp_* port: conn_proto.c);
 * a put value big enough to matter is received straight into its store
 * reservation (readv into the arena) instead of the buffer; each complete
 * message goes to the protocol's dispatch (rpc_dispatch, resp_dispatch). Write path: replies queue in an outq and
 * leave with writev, values straight from the arena. A connection whose
 * unsent output passes client_output_limit, or with client_inflight_max
 * requests in flight, is not read until it drains to half of that.
 *
 * A framing violation is answered once with the error notification, then the
 * connection closes. A connection is freed only by conn_close, at the end of
 * its own event callback or by its worker, never from inside rpc code.
 *
 * A connection sees the worker it lives on only through struct conn_loop
 * below (the worker owns one and passes it in): conn never includes
 * worker.h or server.h.
 */
#ifndef CONN_H
#define CONN_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "rpc.h"

struct conn;
struct event_base;
struct kv_config;
struct rdma_cq;
struct store;
typedef struct ssl_st SSL;

#define CONN_DISCARD_SIZE (256u * 1024u) /* conn_loop.discard's bytes */

/* conn_tls_new_fn: an SSL for a new TLS connection, or NULL; arg is conn_loop.tls_arg. */
typedef SSL *(*conn_tls_new_fn)(void *arg);

/*
 * conn_counters: what the connections of one loop count. Each is written by
 * that loop's thread only (relaxed atomics, single writer); stats_collect
 * sums them over the loops with relaxed loads.
 */
#define CONN_KINDS 3                      /* enum conn_kind's values */

struct conn_counters {
    struct rpc_counters rpc;              /* requests: rpc_dispatch counts them */
    _Atomic uint64_t bytes_in;
    _Atomic uint64_t bytes_out;
    _Atomic uint64_t kind_bytes_in[CONN_KINDS];  /* the same by transport (enum conn_kind) */
    _Atomic uint64_t kind_bytes_out[CONN_KINDS];
    _Atomic uint64_t protocol_errors;
    _Atomic uint64_t auth_failures;       /* hello {tenant, token} refused */
    _Atomic uint64_t output_cap_closes;   /* closed over client_output_max */
    _Atomic uint64_t output_stall_closes; /* closed: output stuck for client_output_timeout */
    _Atomic uint64_t input_stall_closes;  /* closed: a request stuck for client_input_timeout */
    _Atomic uint64_t idle_closes;         /* closed: idle for idle_timeout */
    _Atomic uint64_t buffer_cap_closes;   /* closed: conn_buffer_memory reached */
    _Atomic uint64_t inflight_pauses;     /* reading paused at client_inflight_max */
    _Atomic uint64_t auth_revoked;        /* closed: its tenant removed or token changed */
};

/*
 * conn_loop: what a connection needs from the event loop it lives on. Its
 * owner (a worker, worker.c) fills in the fields marked "owner" before the
 * first conn_* call and keeps the loop alive until conn_close_all; the
 * fields marked "conn" belong to the functions below. Everything here is
 * used on the loop's thread only, but for the counters (stats_collect reads
 * them) and the atomics it points to.
 */
struct conn_loop {
    /* owner: set once, borrowed for the loop's life */
    struct event_base *base;
    int idx;                              /* the worker's number, for logs */
    _Atomic(const struct kv_config *) *live_conf; /* the current snapshot (published by the
                                                     main thread on reload) */
    const struct rpc_server *rpc;         /* every connection's ctx.srv */
    struct store *store;
    struct rdma_cq *rdma_cq;              /* completions of its connections' RDMA work, or NULL */
    uint8_t *discard;                     /* CONN_DISCARD_SIZE bytes of scratch for bytes read
                                             only to be dropped */
    int ready_ep;                         /* an epoll set of its own, empty at first: each
                                             connection is in it for input (conn.c) */
    _Atomic uint64_t *connections;        /* open connections: each close takes one off */
    conn_tls_new_fn tls_new;              /* a new TLS connection's SSL (any loop's thread) */
    void *tls_arg;
    /* owner: set on the loop's thread */
    bool draining;                        /* the server is stopping (then conn_drain_all) */
    /* conn */
    struct conn *conns;                   /* the loop's connections (list); NULL: none */
    int waiting;                          /* connections waiting for the SSD tier */
    const struct kv_config *conf;         /* snapshot in use (conn_refresh_limits) */
    const struct kv_config *auth_conf;    /* snapshot its connections' logins were checked
                                             against */
    struct rpc_limits lim;                /* conf's, as the request layer takes them */
    struct conn_counters ctr;
};

/*
 * conn_adopt: make a connection of an accepted non-blocking fd on loop w
 * (called on w's thread). kind tells the transport, with CONN_RESP or'ed in
 * when the connection speaks RESP2 (a resp_listen port) instead of
 * msgpack-rpc. On failure the fd is closed, the connection taken off
 * *w->connections and the error logged. Returns 0 or -errno.
 */
enum conn_kind { CONN_TCP, CONN_UNIX, CONN_TLS, CONN_RESP = 8 };

int conn_adopt(struct conn_loop *w, int fd, int kind);

/*
 * conn_drain_all: the server is stopping: close idle connections of w now;
 * the others stop reading new requests once their current message is in,
 * and close as soon as their replies are sent. Once w->draining is set, the
 * last connection to close breaks w's event loop.
 */
void conn_drain_all(struct conn_loop *w);

/*
 * conn_retry_waiting: the SSD tier made progress: retry every connection of
 * w whose request waits for it (called on w's thread).
 */
void conn_retry_waiting(struct conn_loop *w);

/*
 * conn_expire_all: once a second on w's thread: reclaim the put_start
 * reservations of w's connections that outlived put_timeout_ms, and close
 * those whose output is stuck (client_output_timeout) or that are idle
 * (idle_timeout).
 */
void conn_expire_all(struct conn_loop *w);

/* conn_close_all: close every connection of w at once (final teardown). */
void conn_close_all(struct conn_loop *w);

/*
 * conn_refresh_limits: load the current config snapshot (*w->live_conf)
 * into w->conf and w->lim when it changed. One atomic load when it did not.
 */
void conn_refresh_limits(struct conn_loop *w);

/*
 * conn_auth_recheck: after a reload: close (with the error notification,
 * counted in auth_revoked) every connection of w authenticated as a tenant
 * the current config no longer has, or whose token has changed since it
 * logged in. Cheap when the snapshot is the one last checked. Call on w's
 * thread, outside any connection's callback (it frees connections).
 */
void conn_auth_recheck(struct conn_loop *w);

#endif
