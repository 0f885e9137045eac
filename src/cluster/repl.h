/*
 * repl: the cluster's data paths over the current view (view.h) and the
 * peer pool (peer.h), as the request layer's struct rpc_remote (rpc_ctx.h):
 *
 *   - a local miss asks the key's owners (view_owners, this node left out),
 *     one peer_get per owner per request with every key that owner is
 *     asked for; a value arrives with its CRC-32C, is checked, and is kept
 *     here (a cache copy unless this node is one of the owners); a miss, an
 *     error, a timeout or a checksum mismatch at one owner moves the key to
 *     the next owner; after the last it is a miss. The request waits
 *     meanwhile (rpc_dispatch's -EAGAIN, as for an SSD load) and is woken
 *     when the fetch ends; a finished fetch is remembered for
 *     REPL_FETCH_KEEP_MS, so a request asking again within that time gets
 *     the same answer without another round trip.
 *   - a client's put is stored here first (a cache copy when this node is
 *     not an owner) and then sent to each other owner with peer_put and
 *     its CRC-32C (one peer_put per owner per request, the values written
 *     from the objects' pages), from a queue bounded in bytes (queue_max):
 *     what does not fit is dropped and counted. With write_ack all the client's answer
 *     waits until every owner answered (a ticket, repl_ticket_done); with
 *     write_ack local it goes at once.
 *   - over RDMA (repl_rdma.c), a fetch is a peer_sizes and a peer_get_into (the owner
 *     WRITEs the values here) and a put to an owner a peer_put_from (the owner READs them
 *     from here), each falling back to TCP; the rebalance walk's pushes of values in DRAM
 *     go by that peer_put_from too (repl_push), its thread waiting for the answers.
 *
 * Threads: repl_remote's functions run on the event loops, repl_push on the
 * rebalance thread; the answers run on the peer pool's thread. One mutex
 * guards the fetch table (a leaf: no other lock is taken under it; the store
 * is called outside it).
 */
#ifndef REPL_H
#define REPL_H

#include <stdbool.h>
#include <stdint.h>

struct kv_key;
struct peer_pool;
struct rdma_dev;
struct rdma_region;
struct repl;
struct store;
struct store_obj;

#define REPL_FETCH_KEEP_MS 1000     /* a finished fetch answers repeats for this long */
#define REPL_FETCH_MAX 65536        /* keys being fetched or remembered at once */

struct repl_config {
    struct store *store;            /* borrowed; outlives the repl */
    unsigned replicas;              /* R: owners of each key */
    uint64_t peer_timeout_ms;
    uint64_t max_message_size;      /* the largest peer reply accepted */
    uint64_t queue_max;             /* bytes of puts being sent to owners at once */
    bool wait_acks;                 /* write_ack all: a put's reply waits for the owners */
    const char *token;              /* the admin token peers log in with, or NULL */
    const char *tls_cert, *tls_key, *tls_ca;    /* TLS to peers (peer.h), or NULL */
    struct rdma_dev *rdma_dev;      /* this node's RDMA device and its registered arena: */
    const struct rdma_region *rdma_arena;   /* values fetched over RDMA (NULL: TCP only) */
    void (*wake)(void *arg);        /* wake every event loop (a fetch ended): any thread */
    void *wake_arg;
};

/* What /metrics and stats show of the cluster's data paths. */
struct repl_stats {
    uint64_t remote_hits;           /* keys a local miss found at an owner */
    uint64_t remote_misses;         /* keys no owner had */
    uint64_t checksum_mismatches;   /* fetched values that failed their CRC-32C */
    uint64_t repl_sent;             /* puts sent to owners */
    uint64_t repl_acked;            /* stored there (or there already with the same bytes) */
    uint64_t repl_failed;           /* refused, timed out or unreachable */
    uint64_t repl_conflicts;        /* there already with other bytes (first writer won) */
    uint64_t repl_drops;            /* not sent: the queue was full */
    uint64_t repl_queue_bytes;      /* value bytes being sent now */
    uint64_t repl_queue_depth;      /* puts being sent now */
    uint64_t peer_requests;         /* peer pool: calls, failures, bytes (peer.h) */
    uint64_t peer_errors;
    uint64_t peer_timeouts;
    uint64_t peer_bytes_out;
    uint64_t peer_bytes_in;
    uint64_t peer_auth_failures;    /* logins a peer refused (peer.h) */
    uint64_t peer_rdma_connects;    /* queue pairs connected to peers (peer.h) */
    uint64_t peer_rdma_fallbacks;   /* peer connections left on TCP: RDMA refused or failed */
    uint64_t peer_rdma_fetch_bytes; /* value bytes fetched over RDMA (owners' writes) */
    uint64_t peer_rdma_put_bytes;   /* value bytes owners stored by RDMA-READing them (replica
                                       puts, and rebalance pushes: repl_push) */
};

/* repl_create: the pool's thread and an empty fetch table. 0 and *out, or -errno. */
int repl_create(const struct repl_config *cfg, struct repl **out);

/* repl_destroy: stop the pool (calls in flight end) and free. NULL ok. Before the store goes. */
void repl_destroy(struct repl *r);

/*
 * The request layer's struct rpc_remote (rpc_ctx.h) over a repl (arg): the daemon
 * (src/server.c) fills the table with these. Event-loop threads; never block.
 * repl_fetch: ask the owners of keys[0..n) (misses here); -EAGAIN while some fetch runs
 * (started now or before), 0 when all are over or nothing can be asked (no view yet).
 * repl_stored: a client put stored o under key: mark it a cache copy unless this node owns
 * key, and queue it for the other owners in this thread's batch (its checksum computed once,
 * kept on o). repl_flush: send the batch: one peer_put per owner with every key queued for
 * it (by reference from the objects' pages); the request layer calls it when a request has
 * stored what it stores (a batch waits for nothing else).
 */
int repl_fetch(void *arg, const struct kv_key *keys, uint32_t n, bool final);
void *repl_stored(void *arg, const struct kv_key *key, struct store_obj *o);
void repl_flush(void *arg);

/*
 * With write_ack all, repl_stored returns a ticket (else NULL): repl_ticket_done is true once
 * every owner it was sent to answered (stored, had it, refused, timed out: the reply then
 * carries the local put's code); repl_ticket_put gives the caller's reference back.
 */
bool repl_ticket_done(void *arg, void *ticket);
void repl_ticket_put(void *arg, void *ticket);

/*
 * repl_static_view: publish a fixed view of ACTIVE nodes, spec "id@host:port,id@host:port"
 * (a "*weight" after a port sets that node's weight; 0: it owns nothing; self_id: this
 * node's id), for tests and benchmarks of the data paths without etcd
 * (the environment variable KVSTASH_TEST_VIEW; never changes afterwards). 0, -EINVAL, -ENOMEM.
 */
int repl_static_view(const char *spec, const char *self_id);

/*
 * repl_push: the rebalance walk's push of objs[0..n) (one tenant; the keys the owner at addr
 * lacks) over RDMA, by the path of replica puts: one peer_put_from naming the values' extents
 * in the registered arena, the owner RDMA-READing each into its reservation and checking its
 * CRC-32C (first writer wins there). Where the connection to addr has no connected queue pair
 * (no device there, rdma_connect refused, not up yet) or the owner's READs fail, the same keys
 * go as a peer_put over TCP (a failure is logged and counted in peer_rdma_fallbacks, once per
 * connection). Bytes stored by READs count in peer_rdma_put_bytes; the replication counters
 * (repl_sent, repl_acked, ...) are not moved. Waits until every key has its answer: each call
 * ends within peer_timeout, a fallback is one more call. codes[i] (out): key i's: 0 stored
 * there, KV_EXISTS there already, or the failure (KV_TIMEOUT, KV_UNAVAILABLE,
 * KV_CHECKSUM_MISMATCH, ...). objs[i]: borrowed (the call takes its own references until the
 * answers); each a resident, published value of at least one byte (peer_put_from names no
 * empty value). Returns 0, KV_UNSUPPORTED with nothing sent when this node has no RDMA device
 * (the caller pushes its own way), or -ENOMEM. A thread that may block (the walk's): never an
 * event loop or the pool's thread.
 */
int repl_push(struct repl *r, const char *addr, uint32_t tenant, struct store_obj *const *objs,
              uint32_t n, int *codes);

/* repl_pool: the peer pool repl sends through; valid until repl_destroy. */
struct peer_pool *repl_pool(struct repl *r);

/*
 * repl_walk_pool: the peer pool the rebalance walk sends through (rebalance.c); valid until
 * repl_destroy. Without an RDMA device here, a pool of its own: its own connections and
 * thread (kvstash-rbpeer, at REPL_WALK_NICE), so the walk's sends neither queue a fetch or a
 * replica put behind them on a connection nor take the CPU from an event loop. With one,
 * repl_pool: its connections carry the queue pairs repl_push's peer_put_from goes through
 * (the walk's first peer_exists to a node sets its queue pair up), and the values move by
 * the peer's READs, not by this node's sends. repl_stats counts both pools.
 */
#define REPL_WALK_NICE 10           /* the walk's threads' nice above the process's (prio.h) */
struct peer_pool *repl_walk_pool(struct repl *r);

/* repl_stats: a snapshot of the counters. Any thread. */
void repl_stats(struct repl *r, struct repl_stats *out);

#endif
