/*
 * rpc_defer: the replies that cannot be packed when their request is
 * dispatched, kept in request order per connection, and the polling that
 * answers them. Two kinds wait:
 *   - struct rpc_deferred: per-key codes and a reference on each object
 *     stored, until the SSD tier says whether the objects of a durable put
 *     (put, batch_put, put_end, a durable batch_put_from) are on it; the
 *     same struct carries what a batch that waits for DRAM room did so far
 *     (ctx->resume), and, in a pool with write_ack all, the reply of a put
 *     (any put method, and the RESP port's SET and MSET, whose reply is
 *     RESP's: d->reply) until the key's owners answered;
 *   - struct rpc_xfer: a shared-memory or RDMA transfer (batch_put_from,
 *     batch_get_into), set up by rpc_shm.c, run here by the copy threads
 *     (storage/copier.h) or as RDMA operations posted on the connection's
 *     queue pair, and answered when its copies are done (ctx->xfer, oldest
 *     first; a durable put becomes a struct rpc_deferred then).
 * The handlers create these and hand them over; rpc_deferred_poll,
 * rpc_rdma_cq_poll and rpc_ctx_release (through rpc_xfer_release) are how
 * the connection drives them. This module calls no handler and never
 * touches sockets or the event loop: the connection polls it.
 *
 * Ownership: a transfer holds everything it touches until it ends: the
 * reservations of a put (committed at the end, aborted if the connection
 * went away), the references of a get, and a reference on every buffer a
 * piece names (so an unregister or a close never unmaps memory being
 * copied). One whose connection closed belongs to the copier, or, with
 * RDMA work posted, to its last completion. Event-loop thread only.
 */
#ifndef RPC_DEFER_H
#define RPC_DEFER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <msgpack.h>

#include "copier.h"
#include "rpc_ctx.h"

struct outq;
struct rdma_qp;
struct rdma_region;
struct rpc_dread;
struct rpc_req;
struct rpc_rop;
struct shmbuf;
struct store;
struct store_obj;

/* ---- what the connection calls (re-exported by rpc.h) ---- */

/*
 * After rpc_dispatch, rpc_pending(ctx) true means the request's reply waits:
 * for durable puts to reach the SSD, or for the copy threads. The connection
 * answers nothing else meanwhile (replies stay in order) and calls
 * rpc_deferred_poll when the tier or the copiers report progress.
 * rpc_deferred_poll: 0 when the reply was queued on out (or none waits),
 * -EINPROGRESS while the work is pending, -ENOMEM.
 * rpc_pending_replies: how many dispatched requests have a reply that waits
 * so (not yet queued on out); rpc_pending is this being non-zero.
 *
 * Every reply rpc_dispatch or rpc_deferred_poll queues is marked on out
 * with outq_reply_end, so out counts the replies not yet written; a
 * notification is not a reply and is not marked.
 */
bool rpc_pending(const struct rpc_ctx *ctx);
uint32_t rpc_pending_replies(const struct rpc_ctx *ctx);
int rpc_deferred_poll(struct rpc_ctx *ctx, struct outq *out);

/*
 * The copy side of the above: rpc_xfer_poll as rpc_deferred_poll, for the
 * transfers only; rpc_xfer_release drops the connection's transfers
 * (rpc_ctx_release: running copies are left to the copy threads to free);
 * rpc_xfer_resume_drop forgets a waiting batch_put_from's set-up (its
 * message was answered some other way).
 */
int rpc_xfer_poll(struct rpc_ctx *ctx, struct outq *out);
void rpc_xfer_release(struct rpc_ctx *ctx);
void rpc_xfer_resume_drop(struct rpc_ctx *ctx);

/*
 * rpc_rdma_cq_poll: take the completions of cq (the event loop's; its fd
 * was readable) and account them to their transfers; a transfer whose
 * connection closed is freed with its last completion. Returns how many
 * were taken (call again while it returns max: see rdma_cq_poll).
 */
int rpc_rdma_cq_poll(struct rdma_cq *cq);

/*
 * rpc_xfer_room: transfers are pending, all of them batch_get_into, with
 * room for one more (RPC_XFER_MAX): a batch_get_into may be dispatched
 * behind them without waiting (it reads nothing they write, and replies go
 * out in order). See rpc_overlaps.
 */
bool rpc_xfer_room(const struct rpc_ctx *ctx);

/* ---- durable puts (the put path, rpc_direct.c) ---- */

/*
 * A reply that waits for durable puts: the per-key codes so far and a
 * reference on each object stored, until the SSD tier says how it went
 * (rpc_deferred_poll). Also what a batch that waits for room did so far
 * (ctx->resume: the keys before `next` are done).
 */
struct rpc_deferred {
    uint64_t msgid;
    bool batch;
    uint32_t n;
    uint32_t next;
    int *codes;
    struct store_obj **objs;
    void **tickets;                 /* write_ack all: per key, the cluster's ticket, or NULL */
    /* a reply in another protocol (the RESP port's SET and MSET): queued by reply(d, out),
       which returns 0 or -ENOMEM, instead of the msgpack one; NULL: msgpack */
    int (*reply)(const struct rpc_deferred *d, struct outq *out);
};

/* rpc_deferred_new: the reply to msgid, codes and objs for n keys all 0/NULL; NULL if no memory. */
struct rpc_deferred *rpc_deferred_new(uint64_t msgid, uint32_t n, bool batch);

/* rpc_deferred_free: unref what it holds and free it. Accepts NULL. */
void rpc_deferred_free(struct rpc_ctx *ctx, struct rpc_deferred *d);

/* rpc_deferred_track: key i was stored: ask the SSD tier for it and remember it in d. */
void rpc_deferred_track(struct rpc_req *rq, struct rpc_deferred *d, uint32_t i, const uint8_t *kp,
                        uint32_t klen);

/*
 * rpc_deferred_ticket: key i was stored and sent to its owners: the reply also waits for
 * ticket (struct rpc_remote), which becomes d's. 0, or -ENOMEM (the ticket is given back).
 */
int rpc_deferred_ticket(struct rpc_ctx *ctx, struct rpc_deferred *d, uint32_t i, void *ticket);

/* rpc_deferred_hold: the same for a published object o, whose reference becomes d's. */
void rpc_deferred_hold(struct rpc_ctx *ctx, struct rpc_deferred *d, uint32_t i,
                       struct store_obj *o);

/* ---- transfers (set up by rpc_shm.c) ---- */

/*
 * One transfer. The handler that sets it up fills res, objs, bufs, kbufs,
 * guarded, durable, next, kind and dreads; the rest is this module's. A key
 * whose pieces lie in a buffer that failed by the end of the copies (it
 * shrank under them: shmbuf.h) fails with KV_UNAVAILABLE: a put's
 * reservation is aborted (nothing partial is stored), a get answers -14;
 * the failed buffers are then dropped from the connection's set.
 */
struct rpc_xfer {
    struct copy_job job;            /* first member: the copier hands it back */
    struct rpc_xfer *qnext;         /* the connection's next transfer (ctx->xfer queue) */
    struct store *st;
    uint64_t msgid;
    bool put;                       /* batch_put_from; else batch_get_into */
    bool durable;                   /* put: answered once the objects are on the SSD tier */
    uint32_t n;
    int64_t *res;                   /* put: code; get: bytes or minus a code */
    struct store_obj **objs;        /* put: reservations to commit; get: references */
    struct shmbuf **bufs;           /* a reference per piece used, in key order */
    uint32_t nbufs;
    uint32_t *kbufs;                /* per key: nbufs once its pieces were read (its end) */
    bool guarded;                   /* some piece is in a guarded buffer (shmbuf_guarded) */
    struct copy_seg *segs;
    size_t nsegs;
    size_t capsegs;
    uint32_t next;                  /* a put that waits for room goes on from this key */
    struct rpc_dread *dreads;       /* get: per key, a read from the SSD into its pieces */
    int kind;                       /* rpc_shm.c's: what the pieces read so far name */
    /* RDMA transfers: */
    struct rpc_rop *rops;
    size_t nrops;
    size_t caprops;
    size_t next_rop;                /* the next to post */
    size_t rops_left;               /* posted, not completed */
    struct rdma_qp *qp;
    const struct rdma_region *arena;
    bool abandoned;                 /* its connection closed: freed by the last completion */
    bool peer;                      /* peer_get_into: answered per key nil, [crc, length] or a
                                       code (rpc_peer.c), not with res as they are */
    /*
     * A put whose handler answers it (peer_put_from, rpc_peer.c), called once its RDMA work is
     * done, the keys whose work failed aborted already (objs[i] NULL, res[i] the code): it
     * publishes or aborts every object left (objs[i] NULL after) and packs the result into pk.
     * Such a put is not handed to the pool's owners. settle_arg is freed with the transfer.
     */
    void (*settle)(struct rpc_ctx *ctx, struct rpc_xfer *x, msgpack_packer *pk);
    void *settle_arg;
};

/*
 * rpc_xfer_new: a transfer for the n keys of rq with room for npieces buffer
 * references (put: batch_put_from, else batch_get_into). NULL if no memory.
 */
struct rpc_xfer *rpc_xfer_new(struct rpc_req *rq, uint32_t n, uint32_t npieces, bool put);

/*
 * rpc_xfer_free: abort its reservations (put) or drop its references (get),
 * unref its buffers and free it. Only a transfer not handed over yet
 * (rpc_xfer_start), or one this module frees itself.
 */
void rpc_xfer_free(struct rpc_xfer *x);

/*
 * rpc_xfer_seg: a copy segment of len bytes from src to dst; guard is the
 * guarded buffer one of them lies in, or NULL (copy_seg). 0 or -ENOMEM.
 */
int rpc_xfer_seg(struct rpc_xfer *x, void *dst, const void *src, size_t len,
                 struct shmbuf *guard);

/* rpc_xfer_run: a segment that calls run(arg) on a copy thread, guarded so. 0 or -ENOMEM. */
int rpc_xfer_run(struct rpc_xfer *x, void (*run)(void *), void *arg, struct shmbuf *guard);

/*
 * rpc_xfer_rop: an RDMA operation of key's between arena memory local and
 * the client's raddr/rkey (a READ for a put, a WRITE for a get). 0 or -ENOMEM.
 */
int rpc_xfer_rop(struct rpc_xfer *x, uint32_t key, void *local, uint64_t raddr, uint32_t rkey,
                 uint64_t len);

/* One piece as validated: where it is (mapped here, or the client's over RDMA). */
struct rpc_piece {
    uint8_t *ptr;                   /* NULL for an RDMA piece */
    uint64_t len;
    uint64_t raddr;
    uint32_t rkey;
    struct shmbuf *guard;           /* its buffer when that is guarded (shmbuf.h), else NULL */
};

/*
 * rpc_xfer_map: what moves `limit` bytes between an object's extents and
 * key's pieces pc[0..np), in order (into the object for a put, out of it
 * for a get): copy segments, or RDMA operations for RDMA pieces (ptr NULL).
 * Returns 0 or -ENOMEM.
 */
int rpc_xfer_map(struct rpc_xfer *x, uint32_t key, struct store_obj *o, const struct rpc_piece *pc,
                 uint32_t np, uint64_t limit, bool into_obj);

/*
 * rpc_xfer_start: x, set up, joins the connection's queue (answered in
 * order, after those before it) and its work starts: RDMA operations are
 * posted on qp (the connection's queue pair, rpc_rdma_qp; NULL fails them),
 * copy segments go to the copy threads; one with nothing to do is answered
 * on out at once when it is the oldest. x is the queue's from now on.
 * Returns 0, or what rpc_xfer_poll returns.
 */
int rpc_xfer_start(struct rpc_ctx *ctx, struct rpc_xfer *x, struct rdma_qp *qp,
                   struct outq *out);

#endif
