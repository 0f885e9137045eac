/*
 * member: this daemon's membership of the pool, in etcd (docs/cluster.md). A thread of its
 * own with its own event_base registers <prefix>/nodes/<node_id> under a lease (create-if-
 * absent in a txn), keeps the lease alive every etcd_lease_ttl/3, checks <prefix>/config
 * (written once: replicas and the placement hash), reads the member list once and then
 * watches it, and publishes each new membership as a view (view.h). When etcd cannot be
 * reached it keeps the last view, retries with backoff, and registers again when its lease
 * turns out lost; a daemon started while etcd is down serves alone and joins later.
 *
 * One member per process: member_start makes it, and the other calls find it themselves,
 * so that modules without a handle (the request layer, the rebalancer) can use them. Every
 * function is safe from any thread; hooks run on the member thread.
 */
#ifndef MEMBER_H
#define MEMBER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "view.h"

struct kv_config;
struct member;

/* The placement function's name in <prefix>/config: nodes that disagree refuse to join. */
#define MEMBER_HASH_NAME "rendezvous-fnv1a64-fmix64-v1"

/*
 * member_start: start the member thread for the finalized config c (cluster_name must be
 * set) and node id (copied). It registers as joining. Returns 0 with *out, or -EINVAL (an
 * endpoint it cannot use, an etcd_tls_* file that cannot be read), -ENOMEM, -errno of
 * pthread_create; it logs why.
 */
int member_start(const struct kv_config *c, const char *node_id, struct member **out);

/*
 * member_wait_first: wait (at most timeout_ms) for the first registration to be decided.
 * Returns 0 (registered), -EAGAIN (etcd not reached yet: serving alone, joining when it
 * answers; also when the time is up), -EEXIST (another live daemon holds this node_id) or
 * -EINVAL (<prefix>/config differs from this node's replicas or hash). After -EEXIST and
 * -EINVAL the member has logged one line saying so, and will not join: stop it and exit.
 */
int member_wait_first(struct member *m, uint64_t timeout_ms);

/*
 * member_set_state: the state this node registers (JOINING -> ACTIVE once its SSD index is
 * loaded; DRAINING by member_drain). Applied to etcd by the member thread, now or once it
 * is registered.
 */
void member_set_state(enum view_state s);

/*
 * The ready check: until fn(arg) returns true, this node stays registered as joining (it
 * owns no key) even after member_set_state(VIEW_ACTIVE); then it goes active. The daemon
 * checks that its SSD index is loaded (a rebuild can run in the background after start).
 * fn runs on the member thread (every step while it holds the node back, at most every
 * 100 ms) and in member_stats (any thread): it must be cheap and thread safe; it writes
 * the reason it holds the node back into why[0..len). One check; NULL clears it.
 */
typedef bool member_ready_fn(void *arg, char *why, size_t len);
void member_set_ready_check(member_ready_fn *fn, void *arg);

/*
 * The drain hook: fn(arg) runs on the member thread once this node is registered as
 * draining in etcd (`kvstash cluster drain`, SIGUSR2). The data path moves the keys off and
 * then calls member_leave. One hook; setting it again replaces it; NULL clears it.
 */
typedef void member_drain_fn(void *arg);
void member_set_drain_hook(member_drain_fn *fn, void *arg);

/* member_drain: register this node as draining (no-op when not in a pool, or draining). */
void member_drain(void);

/* member_draining: true once member_drain ran (whether or not etcd has it yet). */
bool member_draining(void);

/*
 * member_leave: the hand-off is done: revoke the lease (etcd deletes the node key, every
 * view drops this node) and stop renewing it. The daemon goes on serving alone.
 */
void member_leave(void);

/* member_stop: revoke the lease (waiting at most a second for etcd), stop the thread,
 * publish no view, free m. NULL is fine. */
void member_stop(struct member *m);

/* Counters and state for stats, /metrics and cluster_info. */
struct member_stats {
    bool in_pool;                  /* a member runs (cluster_name set) */
    bool registered;               /* our key is in etcd under a live lease (last we knew) */
    bool etcd_ok;                  /* the last call to etcd was answered */
    bool refused;                  /* duplicate node_id or config mismatch: not joining */
    enum view_state state;         /* what we register: joining while the ready check
                                      holds an active node back */
    uint64_t etcd_errors;          /* calls that failed (no answer, or an error answer) */
    uint64_t lease_renewals;       /* keepalives answered with the lease alive */
    uint64_t lease_lost;           /* leases found expired (then registered again) */
    uint64_t registrations;        /* times our key was created */
    uint64_t views;                /* views published */
    uint64_t full_reads;           /* member lists read whole (start, compaction, watch lost) */
    uint64_t watch_rearms;         /* watches restarted before their idle timeout */
    uint64_t etcd_logins;          /* etcd_user's logins answered with a token (the first,
                                      then one per token etcd refused) */
    char cluster[65];              /* cluster_name */
    char prefix[512];              /* etcd_prefix */
    char endpoint[512];            /* the etcd endpoint in use */
    unsigned replicas;
};

/* member_stats: fill out (all zero and in_pool false when no member runs). */
void member_stats(struct member_stats *out);

#endif
