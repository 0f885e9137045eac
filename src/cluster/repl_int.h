/*
 * repl_int: what the files of the repl module share (repl.c: the fetch table, fetches over
 * TCP and the replication of puts; repl_rdma.c: the same paths over RDMA). Included by
 * those two files only: the rest of the daemon sees repl.h.
 *
 * Threads and locks are repl.h's: the fetch table's mutex (struct repl.lock) is a leaf.
 */
#ifndef REPL_INT_H
#define REPL_INT_H

#include <msgpack.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "place.h"
#include "repl.h"

struct repl_push;
struct store_obj;

#define REPL_BUCKETS 4096u          /* fetch table chains; a power of two */

enum repl_fetch_state { REPL_PENDING = 1, REPL_DONE = 2 };

struct repl_fetch {
    struct repl_fetch *hnext;       /* table chain */
    struct repl_fetch *dnext;       /* the done FIFO */
    uint64_t hash;
    uint64_t done_ms;
    struct cluster_view *view;      /* PENDING: the view owners index into (a reference) */
    uint32_t tenant;
    uint32_t klen;
    uint8_t state;
    uint8_t nowners;
    uint8_t next;                   /* the owner being asked */
    bool owned;                     /* this node is one of the owners: keep it as owned */
    uint16_t owners[PLACE_R_MAX];
    uint8_t key[];
};

struct repl {
    struct repl_config cfg;
    struct peer_pool *pool;
    struct peer_pool *walk_pool;    /* the rebalance walk's (repl_walk_pool), or NULL: pool */
    pthread_mutex_t lock;           /* the fetch table */
    struct repl_fetch *table[REPL_BUCKETS];
    struct repl_fetch *dhead, *dtail;
    uint64_t entries;
    _Atomic uint64_t remote_hits, remote_misses, checksum_mismatches;
    _Atomic uint64_t repl_sent, repl_acked, repl_failed, repl_conflicts, repl_drops;
    _Atomic uint64_t queue_bytes, queue_depth;
    _Atomic uint64_t rdma_fetch_bytes, rdma_put_bytes;
};

/* A value of a peer_get's reply being received straight into its reservation. */
struct repl_slot {
    struct store_obj *obj;          /* reserved for entry i (writer reference), or NULL */
    uint32_t crc;                   /* CRC-32C of the bytes landed so far */
    int8_t got;                     /* RDMA: entry i not reserved: 1 there already, 0 not */
};

/* One peer_get in flight: the entries it asks for, in the order of its keys. */
struct repl_batch {
    struct repl *r;
    uint32_t tenant;
    uint32_t n;
    uint32_t cur;                   /* the entry whose value is landing (peer thread) */
    struct repl_slot *slot;         /* [n] */
    struct repl_fetch *e[];
};

/*
 * What a write_ack all reply waits on: the owners not answered yet. One reference for the
 * request layer (repl_ticket_put), one per peer_put in flight.
 */
struct repl_ticket {
    _Atomic uint32_t refs;
    _Atomic uint32_t pending;
};

/*
 * One peer_put in flight: every key of a request's batch that one owner is sent, with what
 * each key's answer settles (its ticket, its checksum).
 */
struct repl_put_key {
    struct repl_ticket *ticket;     /* or NULL (write_ack local) */
    struct repl_push *push;         /* a rebalance push's key (then no ticket), or NULL */
    uint64_t bytes;
    uint32_t crc;
    uint32_t idx;                   /* push: the key's index in it */
};

/*
 * A client put queued on this thread until the end of its request (repl_flush): its object
 * (a reference), the owner it goes to (an index into the batch's view) and its ticket. A
 * rebalance push's keys are items too (repl_push: the node unused, the push instead of a
 * ticket), so they travel the same peer_put_from and peer_put.
 */
struct repl_item {
    struct store_obj *o;
    struct repl_ticket *ticket;
    struct repl_push *push;         /* a rebalance push's key (repl_push), or NULL */
    uint32_t crc;
    uint32_t idx;                   /* push: the key's index in it */
    uint16_t node;
    bool sent;
};

static inline void
repl_add(_Atomic uint64_t *c, uint64_t n)
{
    atomic_fetch_add_explicit(c, n, memory_order_relaxed);
}

/* ---- repl.c: fetching ---- */

/* repl_batch_addr: the owner batch b asks (all its entries ask the same one). */
const char *repl_batch_addr(const struct repl_batch *b);

/* repl_pack_keys: [tenant, keys, (one more param follows when more)] of b into pk. */
void repl_pack_keys(const struct repl_batch *b, msgpack_packer *pk, bool more);

/*
 * repl_batch_go: send b: over RDMA (peer_sizes first, repl_rdma_sizes) when this node has a
 * device and tcp is false, else as a peer_get whose values land in reservations. 0, or -1
 * when nothing was sent (b is the caller's still).
 */
int repl_batch_go(struct repl_batch *b, bool tcp);

/*
 * repl_batch_settle: b's answer is in: got[i] 1 kept, 0 absent, < 0 failed (got NULL: all
 * failed). Entries not kept go to their next owner, the others are done; b is freed and the
 * waiting requests woken (peer thread).
 */
void repl_batch_settle(struct repl_batch *b, const int8_t *got);

/* ---- repl.c: puts ---- */

/* repl_put_settle: one key of a put has its owner's answer (code, its checksum there). */
void repl_put_settle(struct repl *r, const struct repl_put_key *k, uint64_t code,
                     uint64_t crc);

/*
 * repl_pack_put_head: [tenant, keys of g[0..m), (two more params follow)] into pk: the head of
 * peer_put's and peer_put_from's params.
 */
void repl_pack_put_head(msgpack_packer *pk, uint32_t tenant, struct repl_item **g, uint32_t m);

/*
 * repl_send_tcp: one peer_put of the m items g[0..m) (one tenant, niov iovecs at most
 * PEER_EXTRA_MAX: a header and the extents of each) to the owner at addr, the values written
 * from the objects by reference; the items' references become the call's and each key is
 * settled by its answer (repl_put_settle). count: add the items to repl_sent.
 */
void repl_send_tcp(struct repl *r, const char *addr, uint32_t tenant, struct repl_item **g,
                   uint32_t m, int niov, bool count);

/* ---- repl_rdma.c ---- */

/*
 * repl_push_settle: key idx of push p has its answer (code: the owner's, or the call's
 * failure). The last one wakes repl_push. Peer thread (or the walk's, when nothing was sent).
 */
void repl_push_settle(struct repl_push *p, uint32_t idx, int code);

/*
 * repl_rdma_sizes: the peer_done_fn of a batch's peer_sizes (arg: the struct repl_batch):
 * reserve each value here and ask the owner to RDMA-WRITE them (peer_get_into); any RDMA
 * failure sends the batch again as a peer_get (repl_batch_go with tcp). Peer thread.
 */
void repl_rdma_sizes(void *arg, int status, const uint8_t *res, size_t len);

/*
 * repl_send_from: one peer_put_from to the owner at addr of the m items g[0..m) (one
 * tenant), each value named by its extents in the registered arena for the owner to READ.
 * The items' references become the call's (g[i]->o NULL) until the answer; a failure there
 * sends them as peer_puts (repl_send_tcp). 0, or -1 with nothing sent (an extent outside the
 * registered arena, no memory): the items are the caller's still.
 */
int repl_send_from(struct repl *r, const char *addr, uint32_t tenant, struct repl_item **g,
                   uint32_t m);

#endif
