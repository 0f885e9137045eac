/*
 * rpc_rdma: a connection's RDMA side: its queue pair (made by hello
 * {"rdma": true} or rdma_connect, connected by rdma_connect or by
 * register_buffer's opts.qp), the client buffers it registers for RDMA and
 * the pieces that name them, and the (addr, length, rkey) descriptors of
 * arena memory handed out for one-sided access. A shared piece of the
 * request layer: rpc.c (hello, the rdma_connect method), rpc_shm.c and
 * rpc_direct.c call it; it calls only rpc_req and the RDMA data port
 * (rdma/rdma_port.h). The transfers themselves are rpc_defer.c's.
 * Event-loop thread only.
 */
#ifndef RPC_RDMA_H
#define RPC_RDMA_H

#include <stdint.h>

struct iovec;
struct rdma_qp;
struct rpc_ctx;
struct rpc_opts;
struct rpc_req;

/* RDMA buffer ids start at RPC_RDMA_ID_BASE; shared-memory ones are below it. */
#define RPC_RDMA_ID_BASE (1ull << 48)
#define RPC_RDMA_QP_WR 128              /* work requests one connection's queue pair may hold */

/* rpc_rdma_qp: the connection's connected queue pair, or NULL (not connected yet). */
struct rdma_qp *rpc_rdma_qp(const struct rpc_ctx *ctx);

/* rpc_rdma_connect: the rdma_connect method (through the method table, rpc.c). */
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

#endif
