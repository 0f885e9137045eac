/*
 * rpc_resv: a connection's put_start reservations (protocol/SPEC.md,
 * "Direct access"): objects reserved in the store for the client to write
 * in place, each with a deadline (put_timeout_ms), until put_end publishes
 * or put_revoke drops them. An open-addressed table keyed by the store key
 * (ctx->resv, made on demand). A shared piece of the request layer:
 * rpc_direct.c fills and empties it, the connection expires it
 * (rpc_resv_expire, re-exported by rpc.h) and rpc_ctx_release frees it; it
 * calls no other rpc module but rpc_req's counters. Event-loop thread only.
 */
#ifndef RPC_RESV_H
#define RPC_RESV_H

#include <stdbool.h>
#include <stdint.h>

struct kv_key;
struct rpc_ctx;
struct rpc_resv_set;
struct store_obj;

/* One put_start reservation. */
struct rpc_resv {
    struct store_obj *obj;          /* RESERVED; NULL = free slot */
    uint64_t hash;
    uint64_t deadline;              /* ms, CLOCK_MONOTONIC */
    bool durable;                   /* put_end answers once it is on SSD */
};

/* rpc_resv_find: the slot of set (may be NULL) holding key, or NULL; valid until a change. */
struct rpc_resv *rpc_resv_find(struct rpc_resv_set *set, const struct kv_key *key);

/*
 * rpc_resv_room: make room for one more entry in ctx->resv (made on demand;
 * load at most 1/2). 0 or -ENOMEM. rpc_resv_place then puts r, whose key is
 * not in the table, into it.
 */
int rpc_resv_room(struct rpc_ctx *ctx);
void rpc_resv_place(struct rpc_resv_set *set, const struct rpc_resv *r);

/* rpc_resv_delete: empty slot r of set (the object is the caller's now). */
void rpc_resv_delete(struct rpc_resv_set *set, struct rpc_resv *r);

/*
 * rpc_resv_expire: abort the connection's put_start reservations older
 * than put_timeout_ms (counted in puts_expired). Cheap when none is due.
 */
void rpc_resv_expire(struct rpc_ctx *ctx);

/* rpc_resv_release: abort every reservation and free the table (the connection closes). */
void rpc_resv_release(struct rpc_ctx *ctx);

#endif
