/*
 * server: the daemon's process-wide state: listeners, the event-loop
 * threads (workers), signals, config snapshots, and the store.
 *
 * Threads and ownership (see also README "Architecture"):
 *   - the main thread owns the listeners, signals and config reload; it
 *     accepts connections and hands each fd to one worker (round-robin)
 *     through the worker's queue + notification pipe;
 *   - each worker thread owns one libevent event_base and every connection
 *     assigned to it, start to end: no other thread touches a connection;
 *   - the store is shared and thread safe (storage/store.h);
 *   - the current config is an atomic pointer to an immutable snapshot;
 *     the main thread publishes a new one on SIGHUP and keeps old ones
 *     until exit, so a worker may keep using the one it loaded; it then
 *     notifies every worker ('r'), which closes on its own thread the
 *     connections whose login the new snapshot revokes;
 *   - counters: each worker writes its own (single-writer relaxed atomics);
 *     stats_collect sums them on demand.
 * Lock order: worker queue lock is a leaf; store locks are inside the store.
 */
#ifndef SERVER_H
#define SERVER_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <time.h>

#include "config.h"
#include "rpc.h"

struct event;
struct event_base;
struct conn;
struct copier;
struct rdma_cq;
struct rdma_dev;
struct rdma_region;
struct ssd;
struct store;

#define SERVER_MAX_WORKERS 64
#define SERVER_TLS_FD (1 << 30)         /* marks a TLS connection's fd in a worker's queue */

typedef struct ssl_ctx_st SSL_CTX;
#define SERVER_RDMA_CQ_SIZE 65536      /* completion entries per worker: 512 queue pairs of 128 */

struct worker {
    struct server *srv;
    int idx;
    pthread_t thread;
    struct event_base *base;
    int notify_rd, notify_wr;
    struct event *notify_ev;
    pthread_mutex_t lock;            /* protects pending[] */
    int *pending;                    /* accepted fds waiting to be adopted */
    int npending, cappending;
    struct conn *conns;              /* this worker's connections (list) */
    int draining;
    _Atomic bool drain_asked;        /* set by the main thread before it writes 'd' */
    const struct kv_config *conf;    /* snapshot in use */
    const struct kv_config *auth_conf; /* snapshot its connections' logins were checked against */
    struct rpc_limits lim;
    struct rpc_counters ctr;
    _Atomic uint64_t bytes_in;
    _Atomic uint64_t bytes_out;
    _Atomic uint64_t protocol_errors;
    _Atomic uint64_t auth_failures;  /* hello {tenant, token} refused */
    _Atomic uint64_t output_cap_closes;   /* closed over client_output_max */
    _Atomic uint64_t output_stall_closes; /* closed: output stuck for client_output_timeout */
    _Atomic uint64_t input_stall_closes;  /* closed: a request stuck for client_input_timeout */
    _Atomic uint64_t idle_closes;         /* closed: idle for idle_timeout */
    _Atomic uint64_t buffer_cap_closes;   /* closed: conn_buffer_memory reached */
    _Atomic uint64_t inflight_pauses;     /* reading paused at client_inflight_max */
    _Atomic uint64_t auth_revoked;        /* closed: its tenant removed or token changed */
    _Atomic int done;
    uint8_t *discard;                /* scratch for bytes read only to be dropped */
    int waiting;                     /* connections waiting for the SSD tier */
    int ready_ep;                    /* epoll set of its connections, for input: which wait
                                        for a turn (conn.c, conn_others_waiting) */
    struct event *wake_ev;           /* made active by the SSD tier's threads */
    struct event *tick_ev;           /* once a second: reclaim expired reservations */
    struct rdma_cq *rdma_cq;         /* completions of its connections' RDMA work, or NULL */
    struct event *rdma_ev;           /* rdma_cq's channel is readable */
};

struct server {
    _Atomic(const struct kv_config *) conf;
    const char *config_path;         /* NULL = defaults + flags */
    int argc;                        /* --key=value overrides, reapplied on reload */
    char **argv;
    struct kv_config **old_confs;    /* retired snapshots, freed at exit */
    int nold;
    struct store *store;
    struct ssd *ssd;                 /* the SSD tier, or NULL */
    struct copier *copier;           /* copy threads of the shared-memory transfers */
    struct rdma_dev *rdma_dev;       /* the RDMA device, or NULL (rdma off or unusable) */
    bool congestion_warned;          /* local_tcp_congestion failed once (main thread) */
    bool listen_congestion;          /* the TCP listeners were given an algorithm once */
    struct rdma_region *rdma_arena;  /* the arena registered with it */
    struct rpc_server rpc;
    char node_id[CONF_STR_MAX];
    const char *transports[6];
    struct event_base *base;
    struct worker *workers;
    int nworkers;                    /* workers allocated */
    int nthreads;                    /* worker threads started */
    int next_worker;
    int tcp_fd, unix_fd, tls_fd;
    SSL_CTX *tls_ctx;                /* new TLS connections' context (swapped on SIGHUP) */
    pthread_mutex_t tls_lock;        /* guards tls_ctx */
    char unix_path[CONF_STR_MAX];
    struct event *tcp_ev, *unix_ev, *tls_ev, *accept_timer;
    int spare_fd;                    /* /dev/null, given up to accept and refuse a client
                                        when descriptors run out (server_refuse_no_fd) */
    uint64_t fd_refused;             /* clients refused for want of a descriptor */
    uint64_t fd_warned_ms;           /* when that was last logged */
    struct event *sig_ev[4];
    struct event *drain_timer;
    uint64_t drain_deadline_ms;      /* clock_ms() when the drain gives up */
    int draining;
    time_t started;
    _Atomic uint64_t connections;
    _Atomic uint64_t connections_total;
    _Atomic uint64_t connections_rejected;
    _Atomic uint64_t accept_errors;
};

/*
 * server_create: build everything from a finalized config (copied): data
 * dir, node id, store, listeners, worker threads. argv holds the
 * --key=value overrides to reapply on reload (borrowed for the server's
 * life). Returns 0 and *out, or -1 after logging why.
 */
int server_create(const struct kv_config *conf, const char *config_path, int argc, char **argv,
                  struct server **out);

/* server_run: serve until SIGTERM/SIGINT and the drain end. Returns the exit status. */
int server_run(struct server *s);

/* server_destroy: stop threads and free everything. Accepts NULL and half-built servers. */
void server_destroy(struct server *s);

/* server_tls_new: an SSL for a new TLS connection, with the current context; NULL if none. */
typedef struct ssl_st SSL;
SSL *server_tls_new(struct server *s);

/* server_conf: the current config snapshot (valid until server_destroy). */
static inline const struct kv_config *
server_conf(struct server *s)
{
    return atomic_load_explicit(&s->conf, memory_order_acquire);
}

#endif
