/*
 * rpc_shm: the shared-memory methods (register_buffer, unregister_buffer,
 * batch_put_from, batch_get_into), called by rpc_dispatch through the
 * method table only (rpc.c). A transfer's reply is rpc_defer.c's.
 * Each returns 0 with the reply packed or its transfer handed to
 * rpc_defer (rpc_xfer_start), a request-level error, -ENOMEM, or -EAGAIN
 * (batch_get_into: values are being loaded from the SSD tier, nothing
 * held; batch_put_from: a key waits for DRAM room, its set-up so far kept
 * in ctx->xresume). Event-loop thread only.
 */
#ifndef RPC_SHM_H
#define RPC_SHM_H

struct rpc_req;

int rpc_register_buffer(struct rpc_req *rq);
int rpc_unregister_buffer(struct rpc_req *rq);
int rpc_batch_put_from(struct rpc_req *rq);
int rpc_batch_get_into(struct rpc_req *rq);

#endif
