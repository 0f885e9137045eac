/*
 * peer: the outbound side of the cluster's data paths: one thread that
 * keeps a non-blocking msgpack-rpc connection to each peer it is asked to
 * reach (by the peer's advertised host:port), pipelines requests on it,
 * answers each with its reply or a failure, and never lets one wait longer
 * than peer_timeout. A connection that fails fails what it carried
 * (KV_UNAVAILABLE) and is dialled again on the next call, not before a
 * backoff (100 ms doubling to 5 s) has passed since the last failure, so a
 * dead peer costs one failed call per backoff, not one per request.
 *
 * The wire is the daemon's own msgpack port (protocol/SPEC.md, "Cluster
 * peers"); messages are framed with protocol/frame.h and read with
 * protocol/mp.h, so this module needs nothing of client/. With a token set
 * the first message on each connection is hello {tenant "admin", token}; a
 * peer that refuses it is counted (auth_failures), logged once until it
 * accepts it again, and dialled again after 1 s doubling to 60 s (a wrong
 * token is a setup error: fast retries would only lock the address out).
 * With tls_cert set, a peer whose view entry has a TLS listener is dialled
 * there, over TLS (peer_tls.h); the calls still name it by its plain address.
 * A call may name a sink (peer_call_sink): its reply's big values are then
 * received straight into the caller's memory, not copied through a buffer.
 * With an RDMA device (peer_config.rdma_dev), each new connection also sets
 * up one RC queue pair to the peer (peer_rdma.h: rdma_connect, right after
 * the login), so that the peer can RDMA-WRITE values into this node's
 * registered arena (peer_call_rdma). A peer that refuses it (no device
 * there), a queue pair that fails, or an RDMA call that fails leaves that
 * connection on TCP (logged, counted in rdma_fallbacks) until it is dialled
 * again.
 *
 * Threads: peer_call is safe from any thread (a locked hand-off queue and an
 * eventfd); everything else happens on the pool's thread, including every
 * done callback, which must not block (queue work, store into the store,
 * wake workers). Lock order: the pool's queue lock is a leaf.
 */
#ifndef PEER_H
#define PEER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct peer_pool;
struct rdma_dev;

struct peer_config {
    uint64_t timeout_ms;            /* peer_timeout: every call is answered within this */
    uint64_t max_message_size;      /* the largest reply accepted */
    const char *token;              /* admin token to log in with, or NULL (borrowed: copied) */
    const char *tls_cert;           /* PEM files of this member's certificate chain and key, */
    const char *tls_key;            /* and of the CAs peers' certificates must chain to ("": */
    const char *tls_ca;             /* none checked); tls_cert NULL or "": no TLS (read at create) */
    struct rdma_dev *rdma_dev;      /* this node's RDMA device (its arena registered), or NULL:
                                       no RDMA to peers; borrowed, outlives the pool */
    int nice;                       /* the pool thread's nice above the process's (prio.h):
                                       0 the same, > 0 a background pool (the rebalance walk's) */
    const char *name;               /* the thread's name (static, at most 15 bytes), or NULL:
                                       "kvstash-peer" */
};

/* Counters of the pool (relaxed atomics; any thread reads them). */
struct peer_stats {
    uint64_t requests;              /* calls sent */
    uint64_t errors;                /* calls answered with a failure (timeout, connection) */
    uint64_t timeouts;              /* of those, peer_timeout passed */
    uint64_t bytes_out;             /* request bytes written */
    uint64_t bytes_in;              /* reply bytes read */
    uint64_t connects;              /* connections made */
    uint64_t in_flight;             /* calls not answered yet */
    uint64_t auth_failures;         /* logins (hello as admin) a peer refused */
    uint64_t rdma_connects;         /* queue pairs connected to peers */
    uint64_t rdma_fallbacks;        /* connections left on TCP: RDMA refused there or failed */
};

/*
 * peer_done_fn: the answer to one call, on the pool's thread. status 0: the
 * peer answered; result[0..len) is the msgpack result object (valid during
 * the call only). Otherwise a KV_* code: the peer's request-level error,
 * KV_TIMEOUT (peer_timeout passed), KV_UNAVAILABLE (no connection), and
 * result is NULL.
 */
typedef void peer_done_fn(void *arg, int status, const uint8_t *result, size_t len);

/* peer_pool_create: start the thread. Returns 0 and *out, -errno. cfg is copied. */
int peer_pool_create(const struct peer_config *cfg, struct peer_pool **out);

/*
 * peer_pool_reload: connections dialled from now on log in with cfg->token (NULL or "": no
 * login) and, when the pool was created with TLS and cfg->tls_cert is set, use the TLS files
 * of cfg, read again here (SIGHUP: a rotated cluster_token or certificate takes effect
 * without a restart); open connections keep what they have. When the token changed or TLS
 * files were read again, connections whose login a peer refused are dialled again by the
 * next call, without waiting out their backoff. Turning TLS on or off needs a restart. Any thread. Returns 0, or -EINVAL with the reason in err (nothing changed).
 */
int peer_pool_reload(struct peer_pool *p, const struct peer_config *cfg, char *err,
                     size_t errlen);

/* peer_pool_destroy: stop the thread; calls still queued or in flight get KV_UNAVAILABLE. NULL ok. */
void peer_pool_destroy(struct peer_pool *p);

/*
 * peer_call: send method with params (params[0..plen): one msgpack array,
 * transferred: freed by the pool with free()) to the peer at addr
 * ("host:port", copied) and call done(arg, ...) exactly once. Returns 0, or
 * -ENOMEM / -EINVAL (a bad addr) when nothing was sent: then done is not
 * called and params was freed.
 */
int peer_call(struct peer_pool *p, const char *addr, const char *method, uint8_t *params,
              size_t plen, peer_done_fn *done, void *arg);

/*
 * peer_call_ext: peer_call with more bytes after params, sent by reference (no copy): iov[0..n)
 * (borrowed until release(release_arg) is called: once they are written, or the call failed,
 * on the pool's thread; release may be NULL), then tail[0..tail_len) (malloc'd, transferred;
 * may be NULL). params + iov + tail together are the params array. n at most
 * PEER_EXTRA_MAX. On an error return release has been called and tail freed.
 */
#define PEER_EXTRA_MAX (1 << 18)
struct iovec;
struct peer_extra {
    const struct iovec *iov;
    int n;
    uint8_t *tail;
    size_t tail_len;
    void (*release)(void *arg);
    void *release_arg;
};
int peer_call_ext(struct peer_pool *p, const char *addr, const char *method, uint8_t *params,
                  size_t plen, const struct peer_extra *x, peer_done_fn *done, void *arg);

/*
 * peer_call_sink: peer_call whose reply's big bin bodies may be received straight into the
 * caller's memory (a store reservation) instead of the connection's buffer, so a value
 * crosses user space once. sink is borrowed for the call (its functions and min; it may be
 * static). Every bin body of at least sink->min bytes of the reply that is not buffered whole
 * yet is offered, on the pool's thread, with its place in the reply message
 * (path[0..depth): path[0] the index in [1, msgid, error, result], path[1] the index in
 * that, ...) and its length:
 *   take(arg, path, depth, len, iov, max): 0 to decline (the body is buffered as usual), or
 *     the number of extents iov[0..n) (n <= max, max is PEER_SINK_IOV_MAX) that together hold
 *     exactly len bytes and stay writable until done is called;
 *   landed(arg, p, n): bytes of the taken body just received, in order (p is inside iov;
 *     for a checksum computed while the bytes are still in the CPU cache).
 * done is sink_done: status as peer_done_fn's; on 0, *result is a reader over the result
 * object in which each taken body is a hole (mp_read_bin_ref gives *hole and no bytes),
 * valid during the call only; otherwise result is NULL. When the call fails or times out
 * while a body is being received, nothing more is written into its extents once done has
 * been called (the rest of the body is read and dropped). Returns as peer_call.
 */
#define PEER_SINK_IOV_MAX 32
struct mp_reader;
typedef void peer_sink_done_fn(void *arg, int status, struct mp_reader *result);
struct peer_sink {
    uint64_t min;
    int (*take)(void *arg, const uint32_t *path, int depth, uint64_t len, struct iovec *iov,
                int max);
    void (*landed)(void *arg, const uint8_t *p, size_t n);
};
int peer_call_sink(struct peer_pool *p, const char *addr, const char *method, uint8_t *params,
                   size_t plen, const struct peer_sink *sink, peer_sink_done_fn *done,
                   void *arg);

/*
 * peer_call_rdma: peer_call for a call of the RDMA path (peer_sizes, and with into
 * peer_get_into or peer_put_from, which name this node's memory for the peer to write
 * into or read from). Answered
 * KV_UNSUPPORTED at once, without sending anything, when the connection to addr has no
 * queue pair (no device here, the peer refused rdma_connect, or RDMA failed on it) or, for
 * into, not a connected one yet: the caller then asks over TCP. An into call that ends
 * without the peer's answer (timeout, connection lost) destroys the queue pair before done
 * is called, so no write or read of the peer lands after it: the caller may free or reuse
 * the memory it named. Returns as peer_call.
 */
int peer_call_rdma(struct peer_pool *p, const char *addr, const char *method, uint8_t *params,
                   size_t plen, bool into, peer_done_fn *done, void *arg);

/*
 * peer_rdma_fail: the caller found RDMA to addr failing (the peer answered that its writes
 * failed): destroy the connection's queue pair, log why (once per connection) and count a
 * fallback; its calls go over TCP until it is dialled again. The pool's thread only (a done
 * callback).
 */
void peer_rdma_fail(struct peer_pool *p, const char *addr, const char *why);

/* peer_stats: a snapshot of the counters. */
void peer_stats(struct peer_pool *p, struct peer_stats *out);

#endif
