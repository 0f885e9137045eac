/*
 * rpc_direct: client-driven access to the store's own memory (protocol/
 * SPEC.md, "Direct access"): map_segment hands a same-host client the
 * arena's memfd; put_start reserves objects and says where in the arena
 * the client writes them, put_end publishes and put_revoke drops them;
 * get_replica_list says where published objects are and leases them so
 * their pages are not reused while the client reads them in place.
 *
 * The reservations live in the connection's table (rpc_resv.c), a durable
 * put_end's reply in rpc_defer.c, RDMA descriptors come from rpc_rdma.c:
 * like every handler file it calls only the shared pieces below it, and
 * never touches sockets or the event loop (the memfd goes out through the
 * outq). No byte is copied here.
 */
#include "rpc_direct.h"

#include <errno.h>
#include <msgpack.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <sys/uio.h>

#include "clock.h"
#include "kverr.h"
#include "member.h"
#include "mp.h"
#include "outq.h"
#include "place.h"
#include "rpc_defer.h"
#include "rpc_rdma.h"
#include "rpc_req.h"
#include "rpc_resv.h"
#include "store.h"
#include "view.h"

#define RPC_SEGMENT_ARENA 0         /* the one segment there is: the DRAM arena */

/* ---- replies ---- */

/*
 * rpc_pack_pieces: where the object's bytes are: [[addr, length, rkey], ...]
 * on a connection with a queue pair, else [[segment, offset, length], ...]
 * in the arena. 0, or -ENOMEM when the reply could not be made (the
 * connection closes).
 */
static int
rpc_pack_pieces(struct rpc_req *rq, const struct store_obj *o)
{
    struct iovec iov[STORE_MAX_EXTENTS];
    uint8_t *base;
    uint64_t size;
    int n = store_obj_iov(o, iov, STORE_MAX_EXTENTS);

    if (rpc_rdma_qp(rq->ctx) != NULL) {
        return rpc_rdma_pack_pieces(rq, iov, n) == 0 ? 0 : -ENOMEM;
    }
    (void)store_arena(rq->ctx->srv->store, &base, &size);
    msgpack_pack_array(&rq->pk, (size_t)n);
    for (int i = 0; i < n; i++) {
        msgpack_pack_array(&rq->pk, 3);
        msgpack_pack_uint32(&rq->pk, RPC_SEGMENT_ARENA);
        msgpack_pack_uint64(&rq->pk, (uint64_t)((uint8_t *)iov[i].iov_base - base));
        msgpack_pack_uint64(&rq->pk, iov[i].iov_len);
    }
    return 0;
}

/*
 * rpc_direct_check: these methods hand out arena memory: over the Unix
 * socket (its memfd), or with rdma to a connection with a queue pair.
 */
static int
rpc_direct_check(struct rpc_req *rq, bool rdma)
{
    uint8_t *base;
    uint64_t size;

    if (!rpc_shared_view(rq->ctx)) {
        rq->errmsg = "direct access to the store's memory would show other tenants' objects: "
                     "only the admin tenant (or a daemon without tenants) has it";
        return KV_FORBIDDEN;
    }
    if (rdma && rpc_rdma_qp(rq->ctx) != NULL) {
        return 0;
    }
    if (!rq->ctx->is_unix || rq->ctx->take_fd == NULL) {
        rq->errmsg = "direct access to the store's memory is for same-host clients: "
                     "use the Unix socket (or RDMA, after rdma_connect)";
        return KV_UNSUPPORTED;
    }
    if (store_arena(rq->ctx->srv->store, &base, &size) < 0) {
        rq->errmsg = "the arena is private memory (memfd_create failed at start)";
        return KV_UNSUPPORTED;
    }
    return 0;
}

/* ---- methods ---- */

int
rpc_map_segment(struct rpc_req *rq)
{
    uint64_t seg, size;
    uint8_t *base;
    int fd;
    int rc = rpc_arity(rq, 1, 1);

    if (rc == 0) {
        rc = rpc_direct_check(rq, false);
    }
    if (rc != 0) {
        return rc;
    }
    if (mp_read_uint(&rq->rd, &seg) != 0) {
        return rpc_invalid(rq, "segment must be an unsigned integer");
    }
    if (seg != RPC_SEGMENT_ARENA) {
        rq->errmsg = "no such segment";
        return KV_NOT_FOUND;
    }
    fd = store_arena(rq->ctx->srv->store, &base, &size);
    if (outq_fd(rq->out, fd) != 0) {
        return -ENOMEM;
    }
    rpc_reply_head(rq);
    msgpack_pack_map(&rq->pk, 2);
    mp_pack_cstr(&rq->pk, "segment");
    msgpack_pack_uint64(&rq->pk, seg);
    mp_pack_cstr(&rq->pk, "size");
    msgpack_pack_uint64(&rq->pk, size);
    return 0;
}

/* rpc_put_start_key: reserve one key; its code (0: reserved and tracked), or -EAGAIN. */
static int
rpc_put_start_key(struct rpc_req *rq, const uint8_t *kp, uint32_t klen, uint64_t size,
                  bool durable)
{
    struct rpc_ctx *ctx = rq->ctx;
    struct store *st = ctx->srv->store;
    struct rpc_resv r = {.durable = durable};
    struct kv_key key;
    int rc;

    if (klen > ctx->lim->max_key_size || size > ctx->lim->max_value_size) {
        return KV_TOO_LARGE;
    }
    if (rpc_resv_room(ctx) != 0) {
        return KV_INTERNAL;
    }
    rpc_key(rq, kp, klen, &key);
    rc = store_reserve(st, &key, size, &r.obj);
    if (rc == -EAGAIN) {
        return ctx->final_try ? KV_NO_SPACE : -EAGAIN;
    }
    if (rc != 0) {
        return rc < 0 ? KV_INTERNAL : rc;
    }
    r.hash = store_hash64(&key);
    r.deadline = clock_ms() + ctx->lim->put_timeout_ms;
    rpc_resv_place(ctx->resv, &r);
    return 0;
}

int
rpc_put_start(struct rpc_req *rq)
{
    struct rpc_ctx *ctx = rq->ctx;
    struct mp_reader keys, sizes, first;
    struct rpc_opts opts;
    struct rpc_deferred *d;
    const uint8_t *kp;
    uint32_t nkeys, nsizes, klen;
    uint64_t size;
    int rc = rpc_arity(rq, 2, 3);

    if (rc == 0) {
        rc = rpc_direct_check(rq, true);
    }
    if (rc == 0) {
        rc = rpc_keys_skip(rq, &nkeys, &keys);
    }
    if (rc != 0) {
        return rc;
    }
    if (mp_read_array(&rq->rd, &nsizes) != 0 || nsizes != nkeys) {
        return rpc_invalid(rq, "sizes must be an array of unsigned integers, one per key");
    }
    sizes = rq->rd;
    for (uint32_t i = 0; i < nsizes; i++) {
        if (mp_read_uint(&rq->rd, &size) != 0) {
            return rpc_invalid(rq, "sizes must be an array of unsigned integers, one per key");
        }
    }
    rc = rpc_put_opts_read(rq, 2, &opts);
    if (rc != 0) {
        return rc;
    }
    /* A batch that waited for room comes back with the codes of the keys before d->next. */
    d = ctx->resume;
    ctx->resume = NULL;
    if (d != NULL && d->n != nkeys) {
        rpc_deferred_free(ctx, d);
        d = NULL;
    }
    if (d == NULL) {
        d = rpc_deferred_new(rq->msgid, nkeys, true);
        if (d == NULL) {
            return -ENOMEM;
        }
    }
    first = keys;
    for (uint32_t i = 0; i < nkeys; i++) {
        rpc_read_key(&keys, &kp, &klen);
        mp_read_uint(&sizes, &size);
        if (i < d->next) {
            continue;
        }
        rc = rpc_put_start_key(rq, kp, klen, size, opts.durable);
        if (rc == -EAGAIN) {
            d->next = i;            /* wait for room with what is done; the message comes back */
            ctx->resume = d;
            return -EAGAIN;
        }
        d->codes[i] = rc;
    }
    rpc_reply_head(rq);
    msgpack_pack_array(&rq->pk, nkeys);
    for (uint32_t i = 0; i < nkeys; i++) {
        struct rpc_resv *r = NULL;
        struct kv_key key;

        rpc_read_key(&first, &kp, &klen);
        if (d->codes[i] == 0) {
            rpc_key(rq, kp, klen, &key);
            r = rpc_resv_find(ctx->resv, &key);
        }
        if (r == NULL) {
            /* refused, or reclaimed while the rest of the batch waited for room */
            msgpack_pack_int(&rq->pk, d->codes[i] != 0 ? d->codes[i] : KV_TIMEOUT);
            continue;
        }
        if (rpc_pack_pieces(rq, r->obj) != 0) {
            rpc_deferred_free(ctx, d);
            return -ENOMEM;
        }
    }
    rpc_deferred_free(ctx, d);
    return 0;
}

/*
 * rpc_put_finish: put_end (commit) or put_revoke (abort) of every key of
 * this connection's reservations; the per-key codes, deferred for a durable
 * put_end until the SSD tier has the objects.
 */
static int
rpc_put_finish(struct rpc_req *rq, bool commit)
{
    struct rpc_ctx *ctx = rq->ctx;
    struct store *st = ctx->srv->store;
    struct rpc_deferred *d;
    struct mp_reader keys;
    const uint8_t *kp;
    uint32_t nkeys, klen;
    bool durable = false, waits = false;
    int rc = rpc_arity(rq, 1, 1);

    if (rc == 0) {
        rc = rpc_keys_check(rq, &nkeys);
    }
    if (rc != 0) {
        return rc;
    }
    d = rpc_deferred_new(rq->msgid, nkeys, true);
    if (d == NULL) {
        return -ENOMEM;
    }
    keys = rq->rd;
    for (uint32_t i = 0; i < nkeys; i++) {
        struct kv_key key;
        struct rpc_resv *r;
        struct store_obj *o;
        bool dur;

        rpc_read_key(&keys, &kp, &klen);
        r = NULL;
        if (klen <= ctx->lim->max_key_size) {
            rpc_key(rq, kp, klen, &key);
            r = rpc_resv_find(ctx->resv, &key);
        }
        if (r == NULL) {
            d->codes[i] = KV_NOT_FOUND;     /* never reserved here, ended, or reclaimed */
            continue;
        }
        o = r->obj;
        dur = r->durable;
        rpc_resv_delete(ctx->resv, r);
        if (!commit) {
            store_abort(st, o);
            continue;
        }
        store_obj_ref(o);               /* ours, past the writer's, which commit gives back */
        d->codes[i] = store_commit(st, o);
        if (d->codes[i] == 0) {
            void *t = rpc_remote_stored_obj(ctx, o);    /* in a pool: to the key's owners */

            if (t != NULL && rpc_deferred_ticket(ctx, d, i, t) == 0) {
                waits = true;           /* write_ack all: the reply waits for the owners */
            }
        }
        if (dur && d->codes[i] == 0) {
            rpc_deferred_hold(ctx, d, i, o);
            durable = true;
        } else {
            store_obj_unref(st, o);
        }
    }
    if (durable || waits) {
        ctx->deferred = d;          /* answered when the SSD (and the owners) said how it went */
        return 0;
    }
    rpc_reply_head(rq);
    msgpack_pack_array(&rq->pk, nkeys);
    for (uint32_t i = 0; i < nkeys; i++) {
        msgpack_pack_int(&rq->pk, d->codes[i]);
    }
    rpc_deferred_free(ctx, d);
    return 0;
}

int
rpc_put_end(struct rpc_req *rq)
{
    return rpc_put_finish(rq, true);
}

int
rpc_put_revoke(struct rpc_req *rq)
{
    return rpc_put_finish(rq, false);
}

/*
 * rpc_replica_owners: with opts.replicas, the key's owners in this node's view, best first:
 * [{"node", "addr", "tls", "self"}, ...] (empty outside a pool or without a view).
 */
static void
rpc_replica_owners(struct rpc_req *rq, const struct cluster_view *v, unsigned r,
                   const uint8_t *kp, uint32_t klen)
{
    size_t own[PLACE_R_MAX], n = 0;

    if (v != NULL && r > 0) {
        n = view_owners(v, kp, klen, r, own);
    }
    msgpack_pack_array(&rq->pk, n);
    for (size_t j = 0; j < n; j++) {
        const struct view_node *nd = &v->nodes[own[j]];

        msgpack_pack_map(&rq->pk, 4);
        mp_pack_cstr(&rq->pk, "node");
        mp_pack_cstr(&rq->pk, nd->id);
        mp_pack_cstr(&rq->pk, "addr");
        mp_pack_cstr(&rq->pk, nd->addr);
        mp_pack_cstr(&rq->pk, "tls");
        mp_pack_cstr(&rq->pk, nd->tls);
        mp_pack_cstr(&rq->pk, "self");
        (int)own[j] == v->self ? msgpack_pack_true(&rq->pk) : msgpack_pack_false(&rq->pk);
    }
}

int
rpc_get_replica_list(struct rpc_req *rq)
{
    struct rpc_ctx *ctx = rq->ctx;
    struct store *st = ctx->srv->store;
    struct store_obj *stack[64];
    struct store_obj **objs = stack;
    struct cluster_view *v = NULL;
    struct member_stats ms = {0};
    struct mp_reader keys, walk;
    struct rpc_opts opts;
    uint32_t nkeys, ttl = (uint32_t)ctx->lim->lease_ttl_ms;
    int rc = rpc_arity(rq, 1, 2);

    if (rc == 0) {
        rc = rpc_direct_check(rq, true);
    }
    if (rc == 0) {
        rc = rpc_keys_skip(rq, &nkeys, &keys);
    }
    if (rc == 0) {
        rc = rpc_opts_read(rq, 1, &opts);
    }
    if (rc != 0) {
        return rc;
    }
    if (nkeys > 64) {
        objs = malloc(nkeys * sizeof(*objs));   /* nkeys <= max_batch, checked above */
        if (objs == NULL) {
            return -ENOMEM;
        }
    }
    rc = rpc_get_refs(rq, keys, nkeys, objs, NULL);
    if (rc != 0) {
        goto out;                   /* -EAGAIN: loads from the SSD tier started */
    }
    if (opts.replicas && ctx->srv->remote != NULL) {
        member_stats(&ms);
        v = view_acquire();
    }
    walk = keys;
    rpc_reply_head(rq);
    msgpack_pack_array(&rq->pk, nkeys);
    for (uint32_t i = 0; i < nkeys && rc == 0; i++) {
        const uint8_t *kp;
        struct kv_key key;
        uint32_t klen;
        uint64_t size;
        bool leased;

        rpc_read_key(&walk, &kp, &klen);
        if (opts.replicas) {
            msgpack_pack_map(&rq->pk, 2);
            mp_pack_cstr(&rq->pk, "replicas");
            rpc_replica_owners(rq, v, ms.replicas, kp, klen);
            mp_pack_cstr(&rq->pk, "local");
        }
        /* Our reference keeps the key on this very object, so the lease lands on it. */
        if (objs[i] != NULL) {
            store_obj_key(objs[i], &key);
        }
        leased = objs[i] != NULL && store_lease(st, &key, ttl, &size) == 0;
        if (!leased) {
            msgpack_pack_nil(&rq->pk);
            continue;
        }
        msgpack_pack_map(&rq->pk, 4);
        mp_pack_cstr(&rq->pk, "transport");
        mp_pack_cstr(&rq->pk, rpc_rdma_qp(ctx) != NULL ? "rdma" : "shm");
        mp_pack_cstr(&rq->pk, "size");
        msgpack_pack_uint64(&rq->pk, size);
        mp_pack_cstr(&rq->pk, "lease_ms");
        msgpack_pack_uint32(&rq->pk, ttl);
        mp_pack_cstr(&rq->pk, "pieces");
        rc = rpc_pack_pieces(rq, objs[i]);
    }
    view_release(v);
    for (uint32_t i = 0; i < nkeys; i++) {
        store_obj_unref(st, objs[i]);
    }
out:
    if (objs != stack) {
        free(objs);
    }
    return rc;
}
