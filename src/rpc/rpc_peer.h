/*
 * rpc_peer: the methods one cluster node calls on another (protocol/SPEC.md,
 * "Cluster peers"): peer_get (values with their CRC-32C), peer_sizes and
 * peer_get_into (the same over RDMA: written into the caller's memory), peer_exists (local
 * presence only), peer_put (values with their CRC-32C, checked on
 * arrival; first writer wins, a stored key answers EXISTS with its own
 * checksum) and peer_put_from (the same over RDMA: read from the caller's memory). None of them asks other nodes in turn: a peer method answers
 * from this node's store only, so a request never travels further than one
 * hop. Each names the tenant its keys belong to (tenant ids are hashes of
 * tenant names, the same on every node); with require_auth on, only a
 * connection logged in as the admin tenant may call them.
 *
 * A handler file of the request layer: rpc.c calls it; it calls rpc_req.c
 * and the store. Event-loop thread only.
 */
#ifndef RPC_PEER_H
#define RPC_PEER_H

struct rpc_req;

/* peer_get [tenant, keys] -> per key nil or [crc, bin]. */
int rpc_peer_get(struct rpc_req *rq);

/* peer_sizes [tenant, keys] -> per key nil or the value's length (this node's store only). */
int rpc_peer_sizes(struct rpc_req *rq);

/*
 * peer_get_into [tenant, keys, segments] -> per key nil (absent, or no segments given),
 * [crc, length] once the value was RDMA-WRITten into the key's segments ([addr, length,
 * rkey] of the caller's registered memory, exactly the value's length), or a code (the
 * writes failed: the queue pair's error, segments that are not the value's length). Needs
 * the connection's queue pair (rdma_connect): else the request fails with UNSUPPORTED.
 */
int rpc_peer_get_into(struct rpc_req *rq);

/* peer_exists [tenant, keys] -> per key true/false (this node's store only). */
int rpc_peer_exists(struct rpc_req *rq);

/* peer_put [tenant, keys, values, crcs] -> per key [code, crc]. */
int rpc_peer_put(struct rpc_req *rq);

/*
 * peer_put_from [tenant, keys, extents, crcs] -> per key [code, crc] as peer_put, or a bare
 * code for a key whose RDMA READs failed (the queue pair's error). The values are not in the
 * message: each key's extents ([addr, length, rkey] of the caller's registered memory, the
 * value's bytes in order) are RDMA-READ into a reservation of their total length, checked
 * against the key's CRC-32C there (a mismatch: CHECKSUM_MISMATCH, nothing stored, counted)
 * and published; a stored key answers EXISTS with its checksum without reading anything.
 * Needs the connection's queue pair (rdma_connect): else the request fails with UNSUPPORTED.
 */
int rpc_peer_put_from(struct rpc_req *rq);

#endif
