/*
 * rebalance: after the view changes (a node joins, drains, leaves or fails), this node
 * walks its own store (DRAM and SSD tier: the table is the directory of both) and, for
 * every key whose owner set changed, makes sure the new owners have it:
 *
 *   - it pushes only keys it is responsible for: those it owns in the new view, and those
 *     it owned in the old one (so a draining or leaving node hands its keys off); a cache
 *     copy of a key it never owned is not pushed;
 *   - it asks each new owner first (peer_exists, one message per owner per batch of keys)
 *     and sends only what is missing (peer_put with the CRC-32C, one message per owner per
 *     batch), at most REBALANCE_RATE bytes a second, paced message by message (at most
 *     1 MiB of values at line rate, then a pause), so reads keep their latency; where this
 *     node has an RDMA device, the values in DRAM go as a peer_put_from instead (repl_push:
 *     the new owner RDMA-READs them, the objects held until it answered; a peer_put over
 *     TCP when the connection has no queue pair or the READs fail);
 *   - a key this node no longer owns stays as a cache copy (store_set_cache); one it owns
 *     again is owned (not evicted first) again;
 *   - a view that moves again during a walk restarts it against the newer view; the old
 *     view stays the last one a walk completed under, so nothing is skipped;
 *   - a node that vanished from the view (failed: not draining) is re-replicated only once
 *     rebalance_delay has passed with the view still without it, so a restart within the
 *     delay moves nothing;
 *   - once a walk completes under a view where this node is draining, and member.c's drain
 *     hook said it is registered so, it calls member_leave().
 *
 * Threads: one thread of its own (kvstash-rebal), a background job: at REPL_WALK_NICE
 * (repl.h), so an event loop woken by a request takes the CPU from it at once; it sends
 * through cfg->pool, which the daemon makes repl_walk_pool (a pool of its own, its thread at
 * the same nice, when the values go over TCP). It blocks only on its peer calls (each
 * bounded by peer_timeout) and its rate limit. It calls the store (thread safe) and the
 * peer pool.
 */
#ifndef REBALANCE_H
#define REBALANCE_H

#include <stdint.h>

struct peer_pool;
struct rebalance;
struct repl;
struct store;

#define REBALANCE_RATE (256ull << 20)   /* bytes a second a walk may push */
#define REBALANCE_BATCH 64              /* keys asked about / pushed per peer message */

struct rebalance_config {
    struct store *store;                /* borrowed */
    struct peer_pool *pool;             /* borrowed; outlives the rebalance: the walk's
                                           messages (the daemon's: repl_walk_pool) */
    struct repl *repl;                  /* borrowed, outlives the rebalance: pushes over RDMA
                                           (repl_push); NULL: every push a copying peer_put */
    unsigned replicas;
    uint64_t delay_ms;                  /* rebalance_delay */
    uint64_t peer_timeout_ms;
};

struct rebalance_stats {
    uint64_t walks;                     /* walks completed */
    uint64_t restarts;                  /* walks restarted by a newer view */
    uint64_t keys_moved;                /* keys pushed to a new owner that lacked them */
    uint64_t bytes_moved;
    uint64_t keys_checked;              /* keys whose owner set changed, asked about */
    uint64_t running;                   /* 1 while a walk runs */
    uint64_t settled;                   /* revision of the view walks now compare against */
};

/* rebalance_start: the thread. 0 and *out, or -errno. */
int rebalance_start(const struct rebalance_config *cfg, struct rebalance **out);

/* rebalance_stop: stop the thread (a walk ends at its next key batch) and free. NULL ok. */
void rebalance_stop(struct rebalance *rb);

/*
 * rebalance_drain_hook: member.h's drain hook (arg: the struct rebalance): this node is
 * registered as draining; it leaves once a walk under such a view has handed its keys off.
 * The daemon sets it after member_start (member_set_drain_hook) and clears it before
 * rebalance_stop.
 */
void rebalance_drain_hook(void *arg);

/* rebalance_stats: a snapshot. Any thread. */
void rebalance_stats(struct rebalance *rb, struct rebalance_stats *out);

#endif
