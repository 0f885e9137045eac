/*
 * rpc_int: what the request handlers share (src/rpc/rpc.c: the method
 * table, dispatch and the store methods; src/rpc/rpc_put.c: the put path;
 * src/rpc/rpc_shm.c: the shared-memory buffer methods; rpc_direct.c and
 * rpc_rdma.c). Nothing outside those files includes it.
 */
#ifndef RPC_INT_H
#define RPC_INT_H

#include <stdbool.h>
#include <stdint.h>

#include "rpc.h"
#include "rpc_defer.h"
#include "rpc_req.h"

struct store_obj;

/*
 * The put path (rpc_put.c): the put and batch_put handlers, called by
 * rpc_dispatch through the method table only. 0 with the reply packed, or
 * with it left in ctx->deferred (a durable put: rpc_deferred_poll answers);
 * a request-level error (nothing stored, rpc_dispatch answers it); -ENOMEM;
 * or -EAGAIN when a key must wait for DRAM room (put: nothing done;
 * batch_put: the keys done so far kept in ctx->resume for the retry).
 * Event-loop thread only, as all of rpc.
 */
int rpc_put(struct rpc_req *rq);
int rpc_batch_put(struct rpc_req *rq);

/* The shared-memory methods (rpc_shm.c). */
int rpc_register_buffer(struct rpc_req *rq);
int rpc_unregister_buffer(struct rpc_req *rq);
int rpc_batch_put_from(struct rpc_req *rq);
int rpc_batch_get_into(struct rpc_req *rq);

/* A connection's RDMA side (rpc_rdma.c). */
#define RPC_RDMA_ID_BASE (1ull << 48)   /* RDMA buffer ids start here; shared-memory ones are below */
#define RPC_RDMA_QP_WR 128              /* work requests one connection's queue pair may hold */

struct iovec;
struct rdma_qp;

/* rpc_rdma_qp: the connection's connected queue pair, or NULL (not connected yet). */
struct rdma_qp *rpc_rdma_qp(const struct rpc_ctx *ctx);
int rpc_rdma_connect(struct rpc_req *rq);

/*
 * rpc_rdma_hello: hello {"rdma": true}: make the connection's queue pair
 * (connected later by register_buffer's opts.qp, or rdma_connect). 0 or a
 * request-level error. rpc_rdma_pack_info then packs its info (a bin).
 */
int rpc_rdma_hello(struct rpc_req *rq);
void rpc_rdma_pack_info(struct rpc_req *rq);

/* rpc_rdma_register: register_buffer with opts.transport "rdma" (the whole reply). */
int rpc_rdma_register(struct rpc_req *rq, const struct rpc_opts *o);

/* rpc_rdma_unregister: forget RDMA buffer id: 0 or KV_NOT_FOUND. */
int rpc_rdma_unregister(struct rpc_ctx *ctx, uint64_t id);

/*
 * rpc_rdma_piece: [id, off, len] of an RDMA buffer as the client's address
 * and rkey: 0, or KV_INVALID_ARGUMENT (no such buffer, or out of its range).
 */
int rpc_rdma_piece(const struct rpc_ctx *ctx, uint64_t id, uint64_t off, uint64_t len,
                   uint64_t *raddr, uint32_t *rkey);

/* rpc_rdma_release: destroy the queue pair (posted work completes flushed) and the buffers. */
void rpc_rdma_release(struct rpc_ctx *ctx);

/*
 * rpc_rdma_pack_pieces: arena memory iov[0..n) as [[addr, length, rkey], ...]
 * for one-sided access by the client (split where the arena's memory
 * regions meet). 0; KV_INTERNAL with nothing packed (not arena memory);
 * -ENOMEM with the reply half packed (the connection must close).
 */
int rpc_rdma_pack_pieces(struct rpc_req *rq, const struct iovec *iov, int n);

/* Client-driven access to the store's own memory (rpc_direct.c). */
int rpc_map_segment(struct rpc_req *rq);
int rpc_put_start(struct rpc_req *rq);
int rpc_put_end(struct rpc_req *rq);
int rpc_put_revoke(struct rpc_req *rq);
int rpc_get_replica_list(struct rpc_req *rq);

#endif
