/*
 * rpc: the daemon's request layer (protocol/SPEC.md), as the connection
 * code (src/conn*.c, src/server.c) sees it. The connection hands it
 * complete msgpack-rpc messages (rpc_dispatch) and the put values it
 * received straight into the store (rpc_spill.h); the layer answers each
 * request with exactly one reply appended to the connection's outq, now or
 * later (rpc_defer.h: durable puts, shared-memory and RDMA transfers).
 *
 * What it owns, per connection (struct rpc_ctx, rpc_ctx.h): the replies
 * that wait, transfers in flight, registered shared-memory buffers (their
 * descriptors and mappings), put_start reservations, and the RDMA queue
 * pair and buffers. What it may touch: the store facade (storage/store.h),
 * the copy threads (storage/copier.h), the RDMA data port on the event
 * loop's completion queue (ctx->rdma_cq), descriptors handed to it through
 * ctx->take_fd (kept or closed) or queued on the outq (outq_fd). What it
 * must not: read or write a socket, or add, change or run events of the
 * event loop: the connection feeds it, polls it (rpc_deferred_poll,
 * rpc_rdma_cq_poll, rpc_resv_expire) and writes out what it queued.
 *
 * Put values that were received straight into the store (spilled, see
 * frame.h) reach rpc_dispatch as holes whose tag is a struct rpc_spill;
 * rpc_spill_take is the decision made while such a value is still on the
 * wire. Every spilled reservation handed to rpc_dispatch is committed or
 * aborted before it returns, on every path.
 *
 * Inside, calls point one way (tests/check_layers.py): rpc.c (method
 * table, dispatch, store methods) -> the handler files rpc_put.c, rpc_shm.c,
 * rpc_direct.c -> the shared pieces rpc_defer.c, rpc_resv.c, rpc_rdma.c,
 * rpc_spill.c -> rpc_req.c (params and replies) -> rpc_ctx.h. This header
 * re-exports what the connection calls of the pieces (rpc_ctx.h,
 * rpc_spill.h, rpc_defer.h, rpc_resv.h); no file of the layer but rpc.c
 * includes it.
 *
 * Threads: rpc functions run on the calling event-loop thread; the store is
 * thread safe; an rpc_counters block has a single writer thread.
 */
#ifndef RPC_H
#define RPC_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "rpc_ctx.h"
#include "rpc_defer.h"
#include "rpc_resv.h"
#include "rpc_spill.h"

struct mp_hole;
struct outq;

/* The upper bounds of the latency histogram buckets (rpc_counters.lat), ascending. */
extern const uint64_t rpc_lat_bounds_ns[RPC_LAT_BOUNDS];

/* rpc_method_name: the wire name of a method id. */
const char *rpc_method_name(int method);

/*
 * rpc_dispatch: handle one complete message msg[0..len) whose spilled put
 * values are the holes (tags: struct rpc_spill *; all consumed here).
 * Returns 0 when a reply was queued on out or none is due (a notification),
 * KV_PROTOCOL_ERROR when the message is not a msgpack-rpc request (the
 * caller sends the error notification and closes), -ENOMEM, or -EAGAIN when
 * the request must wait (values being loaded from the SSD tier, or DRAM
 * room being freed by it): nothing was answered or consumed, the holes are
 * kept, and the caller dispatches the same message again later (with
 * ctx->final_try set once it has waited long enough: then nothing waits).
 */
int rpc_dispatch(struct rpc_ctx *ctx, const uint8_t *msg, size_t len, const struct mp_hole *holes,
                 size_t nholes, struct outq *out);

/*
 * rpc_ctx_release: the connection closes: forget what waits, hand running
 * copies to the copy threads to clean up, destroy the RDMA queue pair, abort
 * the reservations, unmap the connection's buffers.
 */
void rpc_ctx_release(struct rpc_ctx *ctx);

/*
 * rpc_overlaps: msg (a complete request) is a batch_get_into that may be
 * dispatched behind the pending transfers without waiting (rpc_xfer_room).
 */
bool rpc_overlaps(const struct rpc_ctx *ctx, const uint8_t *msg, size_t len);

/*
 * rpc_prefetch: msg[0..len) is a complete request queued behind one that
 * waits: when it is a get or batch_get, start the SSD loads its keys will
 * need, so the device works while the connection waits, and in a pool the
 * fetches from their owners of the keys missing here. Answers nothing,
 * holds nothing; anything else is ignored.
 */
void rpc_prefetch(struct rpc_ctx *ctx, const uint8_t *msg, size_t len);

/*
 * rpc_auth_holds: whether ctx's login still holds under ctx->lim->tenants
 * (a config reloaded since): true when it is not authenticated, or its
 * tenant is still there with the token hash it logged in with. Else false,
 * with *why ("tenant removed by reload", "token changed by reload") static.
 */
bool rpc_auth_holds(const struct rpc_ctx *ctx, const char **why);

/*
 * rpc_notify_error: queue the notification [2, "error", [code, name, message]]
 * that precedes closing a connection. Returns 0 or -ENOMEM.
 */
int rpc_notify_error(struct outq *out, int status, const char *message);

#endif
