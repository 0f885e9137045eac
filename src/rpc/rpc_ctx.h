/*
 * rpc_ctx: the state of the request layer, no code: the method ids, the
 * per-thread counters, the limits of one request, what the daemon lends the
 * layer (struct rpc_server) and what one connection keeps in it (struct
 * rpc_ctx). Every rpc module includes it; it includes nothing of theirs, and
 * its structs name the modules' own objects only by forward declaration.
 *
 * Threads: a struct rpc_ctx belongs to the event-loop thread of its
 * connection, which alone calls into the layer with it; an rpc_counters
 * block has a single writer thread.
 */
#ifndef RPC_CTX_H
#define RPC_CTX_H

#include <stdbool.h>
#include <stdint.h>

struct conf_tenants;
struct copier;
struct rdma_cq;
struct rdma_region;
struct rpc_deferred;
struct rpc_rdma;
struct rpc_resv_set;
struct rpc_xfer;
struct shmbuf_set;
struct store;

#define RPC_MAX_FDS 8               /* descriptors a connection may hold unclaimed */

enum rpc_method {
    RPC_PING, RPC_HELLO, RPC_PUT, RPC_BATCH_PUT, RPC_GET, RPC_BATCH_GET, RPC_IS_EXIST,
    RPC_BATCH_IS_EXIST, RPC_PREFIX_MATCH, RPC_GET_SIZE, RPC_BATCH_GET_SIZE, RPC_REMOVE,
    RPC_BATCH_REMOVE, RPC_REMOVE_ALL, RPC_PIN, RPC_UNPIN, RPC_STATS,
    RPC_REGISTER_BUFFER, RPC_UNREGISTER_BUFFER, RPC_BATCH_PUT_FROM, RPC_BATCH_GET_INTO,
    RPC_MAP_SEGMENT, RPC_PUT_START, RPC_PUT_END, RPC_PUT_REVOKE, RPC_GET_REPLICA_LIST,
    RPC_RDMA_CONNECT, RPC_CLUSTER_INFO, RPC_CLUSTER_DRAIN, RPC_PEER_GET, RPC_PEER_EXISTS,
    RPC_PEER_PUT, RPC_PEER_SIZES, RPC_PEER_GET_INTO, RPC_PEER_PUT_FROM, RPC_METHOD_COUNT
};

/*
 * The latency histogram of a method: RPC_LAT_BOUNDS upper bounds (rpc_lat_bounds_ns in
 * rpc.h: 10 us .. 10 s), plus one bucket past the last. Each bucket counts its own
 * requests (not cumulative: a scrape sums them).
 */
#define RPC_LAT_BOUNDS 19
#define RPC_LAT_BUCKETS (RPC_LAT_BOUNDS + 1)
#define RPC_ERR_CODES 17            /* the wire status codes, 0..KV_CODE_MAX (kverr.h) */

/* Counters of one event-loop thread: one writer, any readers (relaxed atomics). */
struct rpc_counters {
    _Atomic uint64_t ops[RPC_METHOD_COUNT];
    /* Reads' key lookups, counted where each resolves (rpc_tier_count): found resident in
     * DRAM, found on the SSD tier only (loaded, or read straight into client memory), or
     * not found. Reads: get, batch_get, batch_get_into, get_replica_list, RESP GET/MGET. */
    _Atomic uint64_t hits_dram;
    _Atomic uint64_t hits_ssd;
    _Atomic uint64_t misses;
    _Atomic uint64_t errors;        /* requests answered with a request-level error */
    _Atomic uint64_t puts_expired;  /* put_start reservations reclaimed after put_timeout_ms */
    /* errors answered to a known method, by method and status code */
    _Atomic uint64_t method_errors[RPC_METHOD_COUNT][RPC_ERR_CODES];
    /* time from dispatch to the reply queued (the final try of a request that waited) */
    _Atomic uint64_t lat[RPC_METHOD_COUNT][RPC_LAT_BUCKETS];
    _Atomic uint64_t lat_sum_ns[RPC_METHOD_COUNT];
    _Atomic uint64_t prefix_asked;  /* prefix_match: blocks (groups) asked */
    _Atomic uint64_t prefix_found;  /* prefix_match: leading blocks found */
    _Atomic uint64_t shm_bytes_in;  /* batch_put_from: value bytes copied from shared memory */
    _Atomic uint64_t shm_bytes_out; /* batch_get_into: value bytes copied to shared memory */
    _Atomic uint64_t rdma_bytes_in; /* the same, when the pieces are the client's over RDMA */
    _Atomic uint64_t rdma_bytes_out;
    /* cluster peers (rpc_peer.c): what other nodes sent and fetched here */
    _Atomic uint64_t peer_bytes_in;             /* peer_put: value bytes stored */
    _Atomic uint64_t peer_bytes_out;            /* peer_get: value bytes served */
    _Atomic uint64_t peer_checksum_mismatches;  /* peer_put: a value that failed its CRC-32C */
    _Atomic uint64_t peer_checksum_conflicts;   /* peer_put: a stored key with other bytes */
};

/* Limits in force for one request (a config snapshot). */
struct rpc_limits {
    uint64_t max_key_size;
    uint64_t max_value_size;
    uint64_t max_batch;
    uint64_t max_message_size;
    uint64_t lease_ttl_ms;
    uint64_t put_timeout_ms;
    bool require_auth;              /* only ping and hello before hello {tenant, token} */
    const struct conf_tenants *tenants; /* the tenants (src/config.h); none: NULL or n == 0 */
};

/*
 * rpc_stats_fn: fill names[i]/values[i] with up to max counters of the
 * whole daemon; return how many. names must stay valid until the next call
 * on the same thread.
 */
typedef int rpc_stats_fn(void *arg, const char **names, uint64_t *values, int max);

/*
 * The cluster's data paths as the request layer sees them (src/cluster/repl.c fills it in;
 * NULL on a single node). Any event-loop thread calls them; none blocks.
 *   fetch: keys[0..n) of one request (one tenant) missed in the store: ask their owners.
 *     Returns -EAGAIN while some are being fetched (the request waits, as for an SSD load,
 *     and is dispatched again when a fetch ends or within 20 ms), 0 when every one's fetch
 *     is over: those found are in the store now (cache copies), the rest are misses. With
 *     final set nothing new is started and nothing waits.
 *   stored: a client's put stored o (a reference the caller keeps): mark it a cache copy if
 *     this node does not own key, and send it to the owners. With write_ack all it returns
 *     a ticket the reply waits on (NULL: nothing to wait for): ticket_done is true once
 *     every owner answered (stored it, had it, refused it, or peer_timeout passed), and
 *     ticket_put gives it back. The layer wakes up for it as for the SSD tier.
 *   flush: what stored queued on this thread goes to the owners (grouped: one message per
 *     owner); called once a request (or a transfer's reply) has stored all it stores.
 */
struct kv_key;
struct store_obj;
struct rpc_remote {
    void *arg;
    int (*fetch)(void *arg, const struct kv_key *keys, uint32_t n, bool final);
    void *(*stored)(void *arg, const struct kv_key *key, struct store_obj *o);
    bool (*ticket_done)(void *arg, void *ticket);
    void (*ticket_put)(void *arg, void *ticket);
    void (*flush)(void *arg);
};

/* What handlers need from the daemon; borrowed, lives as long as the daemon. */
struct rpc_server {
    struct store *store;
    const char *version;
    const char *node_id;
    const char *const *transports;
    int ntransports;
    rpc_stats_fn *stats_fn;
    void *stats_arg;
    struct copier *copier;          /* copy threads of the shared-memory transfers */
    struct rdma_region *rdma_arena; /* the arena registered with the RDMA device; NULL: no RDMA */
    const struct rpc_remote *remote; /* the cluster's data paths; NULL: a single node */
};

/*
 * One connection's side of the request layer. The connection sets what it
 * lends (srv, lim, ctr, is_unix, take_fd, rdma_cq), final_try, and the login
 * fields it decides (tenant at the start, auth_blocked); the objects the
 * other pointers hold are the layer's (rpc_defer, rpc_shm, rpc_resv and
 * rpc_rdma own them) and rpc_ctx_release gives them all back.
 */
struct rpc_ctx {
    const struct rpc_server *srv;
    const struct rpc_limits *lim;
    struct rpc_counters *ctr;
    uint32_t tenant;
    bool final_try;                  /* answer now: SSD loads and room no longer waited for */
    struct rpc_deferred *deferred;   /* a reply waiting for durable puts (rpc_deferred_poll) */
    struct rpc_deferred *resume;     /* a batch_put waiting for room: what it did so far */
    struct rpc_xfer *xfer;           /* transfers the copy threads run, oldest first (queue) */
    uint32_t nxfer;
    struct rpc_xfer *xresume;        /* a batch_put_from waiting for room: its set-up so far */
    bool is_unix;                    /* the Unix socket: shared-memory buffers allowed */
    /* take_fd: the next descriptor that came with the request being dispatched (now
     * the caller's), or -1; NULL on connections that cannot carry descriptors */
    int (*take_fd)(void *arg);
    void *take_fd_arg;
    struct shmbuf_set *bufs;         /* buffers this connection registered (made on demand) */
    struct rpc_resv_set *resv;       /* its put_start reservations (made on demand) */
    bool authed;                     /* hello {tenant, token} succeeded: tenant is its namespace */
    bool admin;                      /* ... as the admin tenant */
    bool auth_blocked;               /* its peer failed too often: hello refuses at once */
    uint8_t auth_sha256[32];         /* when authed: the token hash its tenant had then */
    uint32_t auth_failures;          /* hello {tenant, token} refused on this connection */
    struct rdma_cq *rdma_cq;         /* the event loop's completion queue, or NULL */
    struct rpc_rdma *rdma;           /* its queue pair and RDMA buffers (rdma_connect) */
    /* The read waiting on SSD loads (the same message comes back): bit i set when its key i
     * was on the SSD tier only as it looked (rpc_tier_note), so the hit it resolves to is
     * counted as the SSD tier's. NULL when no read waits (rpc_tier_forget). */
    uint8_t *tier_ssd;
    uint32_t tier_nkeys;
};

#endif
