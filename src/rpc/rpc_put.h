/*
 * rpc_put: the put and batch_put methods, called by rpc_dispatch through
 * the method table only (rpc.c). It sits on rpc_defer (durable replies),
 * rpc_spill (values received into reservations) and rpc_req.
 */
#ifndef RPC_PUT_H
#define RPC_PUT_H

struct rpc_req;

/*
 * rpc_put, rpc_batch_put: 0 with the reply packed, or with it left in
 * ctx->deferred (a durable put: rpc_deferred_poll answers); a
 * request-level error (nothing stored, rpc_dispatch answers it); -ENOMEM;
 * or -EAGAIN when a key must wait for DRAM room (put: nothing done;
 * batch_put: the keys done so far kept in ctx->resume for the retry).
 * Event-loop thread only, as all of rpc.
 */
int rpc_put(struct rpc_req *rq);
int rpc_batch_put(struct rpc_req *rq);

#endif
