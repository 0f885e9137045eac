/*
 * rpc_req: one request being handled: reading its params (keys, opts,
 * arity) and packing its reply into the connection's outq, plus the key
 * lookups several methods share (rpc_get_refs). The lowest module of the
 * request layer with code: every handler and shared piece calls it, and it
 * calls none of them. No sockets, no event loop; objects only through
 * storage/store.h.
 *
 * Event-loop thread only, as all of the request layer.
 */
#ifndef RPC_REQ_H
#define RPC_REQ_H

#include <msgpack.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "mp.h"
#include "rpc_ctx.h"

struct kv_key;
struct outq;
struct store_obj;

/* One request being handled. */
struct rpc_req {
    struct rpc_ctx *ctx;
    struct mp_reader rd;        /* positioned at the first param */
    uint32_t nparams;
    uint64_t msgid;
    msgpack_packer pk;
    struct outq *out;
    const char *errmsg;         /* optional text for a request-level error */
    bool replied;               /* a reply was started (rpc_reply_head, rpc_reply_error) */
    void *ticket;               /* the cluster's ticket of the last put stored (rpc_remote_stored) */
};

/*
 * rpc_handler_fn: a method. 0 with the reply packed (or left for the
 * deferred-reply queue: rpc_defer.h), a request-level error for dispatch to
 * answer (nothing changed), -ENOMEM, or -EAGAIN (nothing answered: the
 * message comes back later; see rpc_dispatch).
 */
typedef int rpc_handler_fn(struct rpc_req *rq);

static inline void
ctr_add(_Atomic uint64_t *c, uint64_t n)
{
    /* single writer: a plain load/store pair, no locked instruction */
    atomic_store_explicit(c, atomic_load_explicit(c, memory_order_relaxed) + n,
                          memory_order_relaxed);
}

/* An optional trailing opts map: the keys known now. */
struct rpc_opts {
    bool force;
    bool durable;
    bool whole;                     /* batch_get_into: a value longer than its pieces fails */
    bool replicas;                  /* get_replica_list: every owner of each key too (a pool) */
    bool has_size;
    uint64_t group_size;
    uint64_t size;                  /* register_buffer */
    bool rdma;                      /* register_buffer: transport "rdma" (else "shm") */
    bool has_addr;
    bool has_rkey;
    uint64_t addr;                  /* register_buffer over rdma: the client's region */
    uint32_t rkey;
    const uint8_t *qp;              /* register_buffer over rdma: the client's queue-pair info */
    uint32_t qp_len;
    bool want_qp;                   /* hello {"rdma": true}: make the connection's queue pair */
    const char *tenant;             /* hello: the tenant to authenticate as, or NULL */
    uint32_t tenant_len;
    const uint8_t *token;           /* hello: its token */
    uint32_t token_len;
};

/*
 * rpc_shared_view: the connection may see what is beyond its namespace
 * (the whole arena, every tenant's counters): no tenants are configured, or
 * it authenticated as the admin tenant.
 */
bool rpc_shared_view(const struct rpc_ctx *ctx);

/* rpc_reply_head: start the success reply [1, msgid, nil, ...]; the result follows. */
void rpc_reply_head(struct rpc_req *rq);

/* rpc_pack_head: the same for a reply built later (a deferred one), on pk. */
void rpc_pack_head(msgpack_packer *pk, uint64_t msgid);

/* rpc_reply_error: the whole error reply [1, msgid, [code, name, msg], nil]. */
void rpc_reply_error(struct rpc_req *rq, int status, const char *msg);

/* rpc_invalid: note why and return KV_INVALID_ARGUMENT (a request-level error). */
int rpc_invalid(struct rpc_req *rq, const char *why);

/*
 * rpc_read_key: read a bin or str key (a key too long to buffer reads back
 * with length UINT32_MAX, see rpc_req.c). 0 or -1.
 */
int rpc_read_key(struct mp_reader *rd, const uint8_t **p, uint32_t *len);

/* rpc_key: the store key of bytes p[0..len) in the connection's tenant. */
void rpc_key(struct rpc_req *rq, const uint8_t *p, uint32_t len, struct kv_key *k);

/* rpc_keys_check: read a keys array header (<= max_batch) and check every key. */
int rpc_keys_check(struct rpc_req *rq, uint32_t *n);

/*
 * rpc_keys_skip: rpc_keys_check for a keys param that other params follow: in
 * one pass, *keys is left on the first key (for the handler's own pass) and
 * the request's reader after the last one.
 */
int rpc_keys_skip(struct rpc_req *rq, uint32_t *n, struct mp_reader *keys);

/* rpc_opts_read: the optional opts map at param idx (absent or nil: all defaults). */
int rpc_opts_read(struct rpc_req *rq, uint32_t idx, struct rpc_opts *o);

/* rpc_put_opts_read: rpc_opts_read for a put; a durable put needs the SSD tier. */
int rpc_put_opts_read(struct rpc_req *rq, uint32_t idx, struct rpc_opts *o);

/* rpc_arity: the request has between min and max params, else a request error. */
int rpc_arity(struct rpc_req *rq, uint32_t min, uint32_t max);

/*
 * rpc_get_refs: references on the n objects of keys (NULL for a miss), or
 * -EAGAIN (nothing held) while some are being loaded from the SSD tier.
 * Keys with skip[i] set (skip may be NULL) are neither looked up nor
 * loaded, and objs[i] is left as it is for them. On 0, every key looked up
 * is counted (rpc_tier_count) and the read's notes are dropped: call it
 * once per read that resolves.
 */
int rpc_get_refs(struct rpc_req *rq, struct mp_reader keys, uint32_t n, struct store_obj **objs,
                 const uint8_t *skip);

/*
 * The tier a read's lookups resolve in, counted on the connection's counters
 * (hits_dram, hits_ssd, misses) by the code where each lookup resolves. A
 * read that waits on SSD loads is dispatched again; between its tries,
 * ctx->tier_ssd remembers which of its keys were on the SSD only.
 *
 * rpc_tier_note: key i (of the nkeys of the read now waiting) was found on the
 * SSD tier only; its load has started. Without memory for the note the hit
 * is later counted as DRAM's (the counts stay whole, the split is off).
 *
 * rpc_tier_count: key i of the read resolved: o is the object it got (NULL:
 * a miss). A hit is the SSD tier's when key i was noted, else DRAM's.
 *
 * rpc_tier_forget: the read resolved (or failed): drop the notes. Also
 * called by rpc_ctx_release; safe when there are none.
 */
void rpc_tier_note(struct rpc_ctx *ctx, uint32_t nkeys, uint32_t i);
void rpc_tier_count(struct rpc_ctx *ctx, uint32_t i, const struct store_obj *o);
void rpc_tier_forget(struct rpc_ctx *ctx);

/*
 * The cluster's side of a read (rpc_ctx.h, struct rpc_remote; all three do nothing on a
 * single node). rpc_remote_fill: objs[0..n) are keys' lookups (NULL: a miss); ask the cluster
 * for the misses and take references on what it brought. 0 (objs filled where found), or
 * -EAGAIN / -ENOMEM with every reference in objs dropped and objs cleared (the request waits
 * and comes back). rpc_remote_present: the same for presence (present[i] 0 or 1, updated).
 * rpc_remote_stored: a client put stored the key kp[0..klen): hand it to the cluster; a
 * ticket the reply must wait for (write_ack all) is left in rq->ticket for the caller
 * (rpc_put.c) to take.
 */
int rpc_remote_fill(struct rpc_req *rq, struct mp_reader keys, uint32_t n, struct store_obj **objs);
int rpc_remote_present(struct rpc_req *rq, struct mp_reader keys, uint32_t n, uint8_t *present);
void rpc_remote_stored(struct rpc_req *rq, const uint8_t *kp, uint32_t klen);

/*
 * rpc_remote_stored_obj: the same for an object a shared-memory or direct-access put just
 * committed (o: a reference the caller holds); returns the ticket its reply must wait for
 * (write_ack all; give it to rpc_deferred_ticket) or NULL.
 * rpc_remote_flush: send what was handed to the cluster on this thread (one message per
 * owner): rpc_dispatch calls it after every handler, a transfer's reply after its commits.
 */
void *rpc_remote_stored_obj(struct rpc_ctx *ctx, struct store_obj *o);
void rpc_remote_flush(struct rpc_ctx *ctx);

/*
 * rpc_login: authenticate ctx's connection as tenant[0..tenant_len) with
 * token[0..token_len) (the msgpack hello {tenant, token} and the RESP AUTH
 * both call it). 0: its keys live in the tenant's namespace from now on;
 * KV_UNAUTHORIZED (an unknown tenant, a wrong token, or a peer that failed
 * too often: counted in ctx->auth_failures); KV_INVALID_ARGUMENT when it is
 * authenticated as another tenant already. *why is set (static) on error.
 */
int rpc_login(struct rpc_ctx *ctx, const char *tenant, uint32_t tenant_len, const uint8_t *token,
              uint32_t token_len, const char **why);

#endif
