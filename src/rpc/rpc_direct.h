/*
 * rpc_direct: the direct-access methods (map_segment, put_start, put_end,
 * put_revoke, get_replica_list), called by rpc_dispatch through the method
 * table only (rpc.c). Each returns 0 with the reply packed (a durable
 * put_end: left in ctx->deferred), a request-level error, -ENOMEM, or
 * -EAGAIN (put_start: a key waits for DRAM room, the codes so far kept in
 * ctx->resume; get_replica_list: values are being loaded from the SSD
 * tier). Event-loop thread only.
 */
#ifndef RPC_DIRECT_H
#define RPC_DIRECT_H

struct rpc_req;

int rpc_map_segment(struct rpc_req *rq);
int rpc_put_start(struct rpc_req *rq);
int rpc_put_end(struct rpc_req *rq);
int rpc_put_revoke(struct rpc_req *rq);
int rpc_get_replica_list(struct rpc_req *rq);

#endif
