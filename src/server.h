/*
 * server: the daemon's process: listeners and accept, the worker threads
 * (worker.h) it hands connections to, signals, config snapshots and reload,
 * the drain and its deadline, and the process-wide state (the store, the SSD
 * tier, the copy threads, the RDMA device, node id). struct server is
 * opaque: main.c and the tests drive it with the calls below, stats_collect
 * reads it through server_stats.
 *
 * Threads and ownership (see also worker.h and docs/architecture.md):
 *   - the main thread runs server_run: it owns the listeners, signals and
 *     config reload, and its own event_base for them; it accepts
 *     connections and hands each fd to one worker (round-robin,
 *     worker_hand_off), then never touches that connection again;
 *   - each worker thread owns one event_base and every connection assigned
 *     to it, start to end (worker.h);
 *   - the store is shared and thread safe (storage/store.h);
 *   - the current config is an atomic pointer to an immutable snapshot;
 *     the main thread publishes a new one on SIGHUP and keeps old ones
 *     until exit, so a worker may keep using the one it loaded; it then
 *     tells every worker (worker_reload), which closes on its own thread
 *     the connections whose login the new snapshot revokes;
 *   - counters: the server's own are relaxed atomics (the main thread and,
 *     for connections, each close on a worker write them); each worker
 *     writes its own; stats_collect sums them on demand.
 * Lock order: the TLS context lock and a worker's queue lock are leaves;
 * store locks are inside the store.
 */
#ifndef SERVER_H
#define SERVER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct kv_config;
struct rebalance;
struct repl;
struct server;
struct ssd;
struct store;
struct worker;

#define SERVER_MAX_WORKERS 64

/*
 * server_create: build everything from a finalized config (copied): data
 * dir, node id, store, listeners, worker threads. argv holds the
 * --key=value overrides to reapply on reload (borrowed for the server's
 * life). Returns 0 and *out, or -1 after logging why.
 */
int server_create(const struct kv_config *conf, const char *config_path, int argc, char **argv,
                  struct server **out);

/*
 * server_run: serve until SIGTERM/SIGINT and the drain end, or until
 * server_stop. Returns the exit status.
 */
int server_run(struct server *s);

/*
 * server_stop: make server_run return at once, without a drain (the
 * workers go on until server_destroy). Any thread.
 */
void server_stop(struct server *s);

/* server_destroy: stop threads and free everything. Accepts NULL and half-built servers. */
void server_destroy(struct server *s);

/*
 * server_stats: what stats_collect reports of the process: the server's own
 * counters (relaxed loads: each value is exact, the set is not a snapshot)
 * and where the other counters are.
 */
/* Where start-up is (server_stats.phase; /readyz). */
enum server_phase {
    SERVER_PHASE_STARTING,           /* binding listeners, creating the workers */
    SERVER_PHASE_SSD_LOADING,        /* the SSD tier's index is being opened */
    SERVER_PHASE_SERVING,            /* accepting; every worker running */
    SERVER_PHASE_DRAINING,           /* SIGTERM: no longer accepting */
};

struct server_stats {
    uint64_t uptime_s;
    uint64_t start_time_s;           /* the Unix time the process started serving */
    uint64_t refused_no_fd;          /* of connections_rejected: out of descriptors */
    int phase;                       /* enum server_phase */
    uint64_t connections;            /* open now */
    uint64_t connections_total;
    uint64_t connections_rejected;
    uint64_t accept_errors;
    int nworkers;
    struct worker *const *workers;   /* nworkers of them (worker_counters) */
    struct store *store;
    struct ssd *ssd;                 /* the SSD tier, or NULL */
    struct repl *repl;               /* the cluster's data paths (repl.h), or NULL */
    struct rebalance *rebalance;     /* the walk after view changes (rebalance.h), or NULL */
};

/*
 * server_config: the current config snapshot; valid until server_destroy
 * (snapshots retired by a reload are kept). Any thread.
 */
const struct kv_config *server_config(struct server *s);

/*
 * server_ready: true when the daemon is ready to serve (SERVER_PHASE_SERVING
 * and the arena populated); why gets a one-line reason either way ("ready").
 * Any thread.
 */
bool server_ready(struct server *s, char *why, size_t len);

/* server_stats: fill *out. Any thread; the pointers are valid until server_destroy. */
void server_stats(struct server *s, struct server_stats *out);

#endif
