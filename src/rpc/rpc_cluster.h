/*
 * rpc_cluster: handler of cluster_info, the pool as this daemon sees it (docs/cluster.md,
 * protocol/SPEC.md): the member view (view.h), this node's membership (member.h) and, for
 * keys given, the nodes that own each; and cluster_drain. Called by rpc.c's method table.
 */
#ifndef RPC_CLUSTER_H
#define RPC_CLUSTER_H

struct rpc_req;

/* cluster_info([keys]): see protocol/SPEC.md. 0, or a request error already answered. */
int rpc_cluster_info(struct rpc_req *rq);

/* cluster_drain(): register this node as draining (as SIGUSR2 does); admin only. */
int rpc_cluster_drain(struct rpc_req *rq);

#endif
