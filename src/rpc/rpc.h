/*
 * rpc: the method table and request handlers of the msgpack-rpc protocol
 * (protocol/SPEC.md). Bytes in, bytes out: a handler reads one decoded
 * request with the mp cursor, calls the store facade, and appends exactly
 * one response to an outq. No sockets, no event loop.
 *
 * Put values that were received straight into the store (spilled, see
 * frame.h) reach rpc_dispatch as holes whose tag is a struct rpc_spill;
 * rpc_spill_take is the decision made while such a value is still on the
 * wire. Every spilled reservation handed to rpc_dispatch is committed or
 * aborted before it returns, on every path.
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
#include "rpc_spill.h"

struct mp_hole;
struct outq;
struct rdma_cq;
struct store_obj;

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
 * After rpc_dispatch, rpc_pending(ctx) true means the request's reply waits:
 * for durable puts to reach the SSD, or for the copy threads. The connection
 * answers nothing else meanwhile (replies stay in order) and calls
 * rpc_deferred_poll when the tier or the copiers report progress.
 * rpc_deferred_poll: 0 when the reply was queued on out (or none waits),
 * -EINPROGRESS while the work is pending, -ENOMEM.
 * rpc_pending_replies: how many dispatched requests have a reply that waits
 * so (not yet queued on out); rpc_pending is this being non-zero.
 * rpc_ctx_release: the connection closes: forget what waits, hand running
 * copies to the copy threads to clean up, unmap the connection's buffers.
 *
 * Every reply rpc_dispatch or rpc_deferred_poll queues is marked on out
 * with outq_reply_end, so out counts the replies not yet written; a
 * notification is not a reply and is not marked.
 */
bool rpc_pending(const struct rpc_ctx *ctx);
uint32_t rpc_pending_replies(const struct rpc_ctx *ctx);
int rpc_deferred_poll(struct rpc_ctx *ctx, struct outq *out);
void rpc_ctx_release(struct rpc_ctx *ctx);

/*
 * The copy side of the above (rpc_shm.c): rpc_xfer_poll as rpc_deferred_poll;
 * rpc_xfer_release drops the connection's transfers (rpc_ctx_release);
 * rpc_xfer_resume_drop forgets a waiting batch_put_from's set-up (its
 * message was answered some other way).
 */
int rpc_xfer_poll(struct rpc_ctx *ctx, struct outq *out);

/*
 * rpc_rdma_cq_poll: take the completions of cq (the event loop's; its fd
 * was readable) and account them to their transfers; a transfer whose
 * connection closed is freed with its last completion. Returns how many
 * were taken (call again while it returns max: see rdma_cq_poll).
 */
int rpc_rdma_cq_poll(struct rdma_cq *cq);

/*
 * rpc_resv_expire: abort the connection's put_start reservations older
 * than put_timeout_ms (counted in puts_expired). Cheap when none is due.
 */
void rpc_resv_expire(struct rpc_ctx *ctx);
void rpc_xfer_release(struct rpc_ctx *ctx);

/*
 * rpc_xfer_room: transfers are pending, all of them batch_get_into, with
 * room for one more (RPC_XFER_MAX): a batch_get_into may be dispatched
 * behind them without waiting (it reads nothing they write, and replies go
 * out in order). rpc_overlaps: msg (a complete request) is such a one.
 */
bool rpc_xfer_room(const struct rpc_ctx *ctx);
bool rpc_overlaps(const struct rpc_ctx *ctx, const uint8_t *msg, size_t len);
void rpc_xfer_resume_drop(struct rpc_ctx *ctx);

/*
 * rpc_prefetch: msg[0..len) is a complete request queued behind one that
 * waits: when it is a get or batch_get, start the SSD loads its keys will
 * need, so the device works while the connection waits. Answers nothing,
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
