/*
 * rpc_int: what the request handlers share (src/rpc/rpc.c: the method
 * table, dispatch and the store methods; src/rpc/rpc_put.c: the put path;
 * src/rpc/rpc_shm.c: the shared-memory buffer methods; rpc_direct.c and
 * rpc_rdma.c). Nothing outside those files includes it.
 */
#ifndef RPC_INT_H
#define RPC_INT_H

#include <msgpack.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "mp.h"
#include "rpc.h"

struct kv_key;
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
};

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
 * with length UINT32_MAX, see rpc.c). 0 or -1.
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
 * loaded, and objs[i] is left as it is for them.
 */
int rpc_get_refs(struct rpc_req *rq, struct mp_reader keys, uint32_t n, struct store_obj **objs,
                 const uint8_t *skip);

/*
 * A reply that waits for durable puts: the per-key codes so far and a
 * reference on each object stored, until the SSD tier says how it went
 * (rpc_deferred_poll). Also what a batch that waits for room did so far
 * (ctx->resume: the keys before `next` are done).
 */
struct rpc_deferred {
    uint64_t msgid;
    bool batch;
    uint32_t n;
    uint32_t next;
    int *codes;
    struct store_obj **objs;
};

/* rpc_deferred_new: the reply to msgid, codes and objs for n keys all 0/NULL; NULL if no memory. */
struct rpc_deferred *rpc_deferred_new(uint64_t msgid, uint32_t n, bool batch);

/* rpc_deferred_free: unref what it holds and free it. Accepts NULL. */
void rpc_deferred_free(struct rpc_ctx *ctx, struct rpc_deferred *d);

/* rpc_deferred_track: key i was stored: ask the SSD tier for it and remember it in d. */
void rpc_deferred_track(struct rpc_req *rq, struct rpc_deferred *d, uint32_t i, const uint8_t *kp,
                        uint32_t klen);

/* rpc_deferred_hold: the same for a published object o, whose reference becomes d's. */
void rpc_deferred_hold(struct rpc_ctx *ctx, struct rpc_deferred *d, uint32_t i, struct store_obj *o);

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
void rpc_resv_release(struct rpc_ctx *ctx);

#endif
