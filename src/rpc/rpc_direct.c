/*
 * rpc_direct: client-driven access to the store's own memory (protocol/
 * SPEC.md, "Direct access"): map_segment hands a same-host client the
 * arena's memfd; put_start reserves objects and says where in the arena
 * the client writes them, put_end publishes and put_revoke drops them;
 * get_replica_list says where published objects are and leases them so
 * their pages are not reused while the client reads them in place.
 *
 * A connection's reservations live in its rpc_resv_set, an open-addressed
 * table keyed by the store key, each with a deadline (put_timeout_ms):
 * rpc_resv_expire aborts those past it, rpc_resv_release all of them when
 * the connection closes. No byte is copied here.
 */
#include "rpc_int.h"
#include "clock.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/uio.h>
#include <time.h>

#include "kverr.h"
#include "outq.h"
#include "store.h"

#define RPC_SEGMENT_ARENA 0         /* the one segment there is: the DRAM arena */

/* One put_start reservation. */
struct rpc_resv {
    struct store_obj *obj;          /* RESERVED; NULL = free slot */
    uint64_t hash;
    uint64_t deadline;              /* ms, CLOCK_MONOTONIC */
    bool durable;                   /* put_end answers once it is on SSD */
};

struct rpc_resv_set {
    struct rpc_resv *slot;
    uint32_t mask;                  /* capacity - 1 (a power of two) */
    uint32_t n;
    uint64_t earliest;              /* no deadline before this */
};

/* ---- the reservation table ---- */

static bool
rpc_resv_match(const struct rpc_resv *r, uint64_t hash, const struct kv_key *key)
{
    struct kv_key k;

    if (r->hash != hash) {
        return false;
    }
    store_obj_key(r->obj, &k);
    return k.tenant == key->tenant && k.len == key->len && memcmp(k.ptr, key->ptr, k.len) == 0;
}

/* rpc_resv_find: the slot holding key, or NULL. */
static struct rpc_resv *
rpc_resv_find(struct rpc_resv_set *set, const struct kv_key *key)
{
    uint64_t hash = store_hash64(key);

    if (set == NULL) {
        return NULL;
    }
    for (uint32_t i = (uint32_t)hash & set->mask;; i = (i + 1) & set->mask) {
        struct rpc_resv *r = &set->slot[i];

        if (r->obj == NULL) {
            return NULL;
        }
        if (rpc_resv_match(r, hash, key)) {
            return r;
        }
    }
}

/* rpc_resv_place: put r into a table with room (no such key in it). */
static void
rpc_resv_place(struct rpc_resv_set *set, const struct rpc_resv *r)
{
    uint32_t i = (uint32_t)r->hash & set->mask;

    while (set->slot[i].obj != NULL) {
        i = (i + 1) & set->mask;
    }
    set->slot[i] = *r;
    set->n++;
    if (r->deadline < set->earliest) {
        set->earliest = r->deadline;
    }
}

/* rpc_resv_room: make room for one more entry (load at most 1/2). 0 or -ENOMEM. */
static int
rpc_resv_room(struct rpc_ctx *ctx)
{
    struct rpc_resv_set *set = ctx->resv;
    struct rpc_resv *old;
    uint32_t oldcap;

    if (set == NULL) {
        set = calloc(1, sizeof(*set));
        if (set == NULL) {
            return -ENOMEM;
        }
        set->earliest = UINT64_MAX;
        ctx->resv = set;
    }
    if (set->slot != NULL && (uint64_t)(set->n + 1) * 2 <= (uint64_t)set->mask + 1) {
        return 0;
    }
    old = set->slot;
    oldcap = old != NULL ? set->mask + 1 : 0;
    uint32_t cap = oldcap != 0 ? oldcap * 2 : 16;
    set->slot = calloc(cap, sizeof(*set->slot));
    if (set->slot == NULL) {
        set->slot = old;
        return -ENOMEM;
    }
    set->mask = cap - 1;
    set->n = 0;
    for (uint32_t i = 0; i < oldcap; i++) {
        if (old[i].obj != NULL) {
            rpc_resv_place(set, &old[i]);
        }
    }
    free(old);
    return 0;
}

/* rpc_resv_delete: empty slot r (backward-shift deletion keeps every probe chain whole). */
static void
rpc_resv_delete(struct rpc_resv_set *set, struct rpc_resv *r)
{
    uint32_t i = (uint32_t)(r - set->slot);
    uint32_t j = i;

    set->n--;
    for (;;) {
        j = (j + 1) & set->mask;
        if (set->slot[j].obj == NULL) {
            break;
        }
        uint32_t home = (uint32_t)set->slot[j].hash & set->mask;

        /* the entry at j may move to i when its home is not in (i, j] cyclically */
        if (((j - home) & set->mask) >= ((j - i) & set->mask)) {
            set->slot[i] = set->slot[j];
            i = j;
        }
    }
    memset(&set->slot[i], 0, sizeof(set->slot[i]));
}

void
rpc_resv_expire(struct rpc_ctx *ctx)
{
    struct rpc_resv_set *set = ctx->resv;
    uint64_t now = clock_ms();
    uint64_t earliest = UINT64_MAX;

    if (set == NULL || set->n == 0 || now < set->earliest) {
        return;
    }
    for (uint32_t i = 0; i <= set->mask;) {
        struct rpc_resv *r = &set->slot[i];

        if (r->obj != NULL && r->deadline <= now) {
            store_abort(ctx->srv->store, r->obj);
            rpc_resv_delete(set, r);
            ctr_add(&ctx->ctr->puts_expired, 1);
            continue;               /* another entry may have shifted into slot i */
        }
        if (r->obj != NULL && r->deadline < earliest) {
            earliest = r->deadline;
        }
        i++;
    }
    set->earliest = earliest;
}

void
rpc_resv_release(struct rpc_ctx *ctx)
{
    struct rpc_resv_set *set = ctx->resv;

    if (set == NULL) {
        return;
    }
    for (uint32_t i = 0; set->slot != NULL && i <= set->mask; i++) {
        store_abort(ctx->srv->store, set->slot[i].obj);
    }
    free(set->slot);
    free(set);
    ctx->resv = NULL;
}

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
    bool durable = false;
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
        if (dur && d->codes[i] == 0) {
            rpc_deferred_hold(ctx, d, i, o);
            durable = true;
        } else {
            store_obj_unref(st, o);
        }
    }
    if (durable) {
        ctx->deferred = d;          /* answered when the SSD says how it went */
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

int
rpc_get_replica_list(struct rpc_req *rq)
{
    struct rpc_ctx *ctx = rq->ctx;
    struct store *st = ctx->srv->store;
    struct store_obj *stack[64];
    struct store_obj **objs = stack;
    struct mp_reader keys;
    uint32_t nkeys, ttl = (uint32_t)ctx->lim->lease_ttl_ms;
    int rc = rpc_arity(rq, 1, 1);

    if (rc == 0) {
        rc = rpc_direct_check(rq, true);
    }
    if (rc == 0) {
        rc = rpc_keys_check(rq, &nkeys);
    }
    if (rc != 0) {
        return rc;
    }
    keys = rq->rd;
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
    rpc_reply_head(rq);
    msgpack_pack_array(&rq->pk, nkeys);
    for (uint32_t i = 0; i < nkeys && rc == 0; i++) {
        struct kv_key key;
        uint64_t size;

        /* Our reference keeps the key on this very object, so the lease lands on it. */
        if (objs[i] != NULL) {
            store_obj_key(objs[i], &key);
        }
        if (objs[i] == NULL || store_lease(st, &key, ttl, &size) != 0) {
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
    for (uint32_t i = 0; i < nkeys; i++) {
        store_obj_unref(st, objs[i]);
    }
out:
    if (objs != stack) {
        free(objs);
    }
    return rc;
}
