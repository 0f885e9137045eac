/*
 * rpc_defer: the replies that wait, and the transfers behind some of them
 * (rpc_defer.h). A durable put's reply is packed from its struct
 * rpc_deferred once no object in it is still queued for the SSD; a
 * transfer's once its copy job is done and its RDMA operations completed,
 * oldest first, so replies leave in request order. The event loop never
 * copies a value here: it posts RDMA work (posting copies nothing) and
 * hands copy segments to the copy threads.
 *
 * RDMA: a transfer's operations are posted at most RPC_RDMA_QP_WR at a time
 * on the connection's queue pair (rpc_xfer_pump), the rest as completions
 * free room (rpc_rdma_cq_poll). A transfer whose connection closes with work
 * posted is freed by its last completion (destroying the queue pair flushes
 * them all).
 */
#include "rpc_defer.h"

#include <errno.h>
#include <msgpack.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdlib.h>
#include <sys/uio.h>

#include "copier.h"
#include "kverr.h"
#include "outq.h"
#include "rdma_port.h"
#include "rpc_req.h"
#include "shmbuf.h"
#include "store.h"

#define RPC_XFER_MAX 4              /* transfers of one connection in flight at once */

/* One RDMA operation of a transfer: its wr_id is the operation's address. */
struct rpc_rop {
    struct rpc_xfer *x;
    void *local;                    /* arena memory */
    uint64_t raddr;
    uint64_t len;
    uint32_t rkey;
    uint32_t key;
};

/* ---- pending replies ---- */

bool
rpc_pending(const struct rpc_ctx *ctx)
{
    return ctx->deferred != NULL || ctx->xfer != NULL;
}

uint32_t
rpc_pending_replies(const struct rpc_ctx *ctx)
{
    /* A durable batch_put_from leaves the transfer queue as it becomes the deferred reply. */
    return ctx->nxfer + (ctx->deferred != NULL);
}

/* ---- durable puts ---- */

void
rpc_deferred_free(struct rpc_ctx *ctx, struct rpc_deferred *d)
{
    if (d == NULL) {
        return;
    }
    for (uint32_t i = 0; i < d->n; i++) {
        store_obj_unref(ctx->srv->store, d->objs[i]);
        if (d->tickets != NULL && d->tickets[i] != NULL) {
            ctx->srv->remote->ticket_put(ctx->srv->remote->arg, d->tickets[i]);
        }
    }
    free(d->tickets);
    free(d->codes);
    free(d->objs);
    free(d);
}

struct rpc_deferred *
rpc_deferred_new(uint64_t msgid, uint32_t n, bool batch)
{
    struct rpc_deferred *d = calloc(1, sizeof(*d));

    if (d == NULL) {
        return NULL;
    }
    d->codes = calloc(n ? n : 1, sizeof(*d->codes));
    d->objs = calloc(n ? n : 1, sizeof(*d->objs));
    if (d->codes == NULL || d->objs == NULL) {
        free(d->codes);
        free(d->objs);
        free(d);
        return NULL;
    }
    d->msgid = msgid;
    d->batch = batch;
    d->n = n;
    return d;
}

void
rpc_deferred_track(struct rpc_req *rq, struct rpc_deferred *d, uint32_t i, const uint8_t *kp,
                   uint32_t klen)
{
    struct store *st = rq->ctx->srv->store;
    struct store_obj *o = NULL;
    struct kv_key key;
    int rc;

    rpc_key(rq, kp, klen, &key);
    rc = klen == UINT32_MAX ? KV_NOT_FOUND : store_get(st, &key, &o);
    if (rc == -EAGAIN) {
        d->codes[i] = 0;                /* already left DRAM, which it only does once on SSD */
        return;
    }
    if (rc != 0) {
        d->codes[i] = KV_NO_SPACE;      /* gone already (removed): not on SSD either */
        return;
    }
    rpc_deferred_hold(rq->ctx, d, i, o);
}

int
rpc_deferred_ticket(struct rpc_ctx *ctx, struct rpc_deferred *d, uint32_t i, void *ticket)
{
    if (d->tickets == NULL && (d->tickets = calloc(d->n ? d->n : 1, sizeof(void *))) == NULL) {
        ctx->srv->remote->ticket_put(ctx->srv->remote->arg, ticket);
        return -ENOMEM;
    }
    d->tickets[i] = ticket;
    return 0;
}

void
rpc_deferred_hold(struct rpc_ctx *ctx, struct rpc_deferred *d, uint32_t i, struct store_obj *o)
{
    int rc = store_sync(ctx->srv->store, o);

    if (rc != 0) {
        store_obj_unref(ctx->srv->store, o);
        d->codes[i] = rc;           /* UNSUPPORTED, or QUOTA_EXCEEDED: in DRAM only, not durable */
        return;
    }
    d->objs[i] = o;
}

int
rpc_deferred_poll(struct rpc_ctx *ctx, struct outq *out)
{
    struct rpc_deferred *d = ctx->deferred;
    msgpack_packer pk;

    if (ctx->xfer != NULL) {
        return rpc_xfer_poll(ctx, out);
    }
    if (d == NULL) {
        return 0;
    }
    for (uint32_t i = 0; i < d->n; i++) {
        if (d->objs[i] != NULL && store_obj_ssd_state(d->objs[i]) == STORE_SSD_QUEUED) {
            return -EINPROGRESS;
        }
        if (d->tickets != NULL && d->tickets[i] != NULL
            && !ctx->srv->remote->ticket_done(ctx->srv->remote->arg, d->tickets[i])) {
            return -EINPROGRESS;        /* write_ack all: an owner has not answered yet */
        }
    }
    for (uint32_t i = 0; i < d->n; i++) {
        struct store_obj *o = d->objs[i];

        if (o == NULL) {
            continue;
        }
        if (store_obj_ssd_state(o) != STORE_SSD_STORED) {
            /* Not durable, so not stored: take it back (unless someone reads it now). */
            struct kv_key key;

            store_obj_key(o, &key);
            d->codes[i] = KV_NO_SPACE;
            d->objs[i] = NULL;
            store_obj_unref(ctx->srv->store, o);
            (void)store_remove(ctx->srv->store, &key, true);
            continue;
        }
    }
    if (d->reply != NULL) {
        (void)d->reply(d, out);     /* a failure is out->failed, seen below */
    } else {
        msgpack_packer_init(&pk, out, outq_pack_write);
        rpc_pack_head(&pk, d->msgid);
        if (d->batch) {
            msgpack_pack_array(&pk, d->n);
        }
        for (uint32_t i = 0; i < d->n; i++) {
            msgpack_pack_int(&pk, d->codes[i]);
        }
    }
    outq_reply_end(out);
    ctx->deferred = NULL;
    rpc_deferred_free(ctx, d);
    return out->failed ? -ENOMEM : 0;
}

/* ---- transfers ---- */

void
rpc_xfer_free(struct rpc_xfer *x)
{
    for (uint32_t i = 0; i < x->n; i++) {
        if (x->objs[i] == NULL) {
            continue;
        }
        if (x->put) {
            store_abort(x->st, x->objs[i]);
        } else {
            store_obj_unref(x->st, x->objs[i]);
        }
    }
    for (uint32_t i = 0; i < x->nbufs; i++) {
        shmbuf_unref(x->bufs[i]);
    }
    free(x->res);
    free(x->objs);
    free(x->bufs);
    free(x->kbufs);
    free(x->dreads);
    free(x->segs);
    free(x->rops);
    free(x->settle_arg);
    free(x);
}

/* The copier's hook for a transfer whose connection went away. */
static void
rpc_xfer_orphan(struct copy_job *job)
{
    rpc_xfer_free((struct rpc_xfer *)job);
}

struct rpc_xfer *
rpc_xfer_new(struct rpc_req *rq, uint32_t n, uint32_t npieces, bool put)
{
    struct rpc_xfer *x = calloc(1, sizeof(*x));

    if (x == NULL) {
        return NULL;
    }
    x->res = calloc(n ? n : 1, sizeof(*x->res));
    x->objs = calloc(n ? n : 1, sizeof(*x->objs));
    x->bufs = calloc(npieces ? npieces : 1, sizeof(*x->bufs));
    x->kbufs = calloc(n ? n : 1, sizeof(*x->kbufs));
    if (x->res == NULL || x->objs == NULL || x->bufs == NULL || x->kbufs == NULL) {
        free(x->res);
        free(x->objs);
        free(x->bufs);
        free(x->kbufs);
        free(x);
        return NULL;
    }
    x->st = rq->ctx->srv->store;
    x->msgid = rq->msgid;
    x->put = put;
    x->n = n;
    x->job.release = rpc_xfer_orphan;
    atomic_init(&x->job.state, COPY_JOB_RUNNING);
    return x;
}

int
rpc_xfer_seg(struct rpc_xfer *x, void *dst, const void *src, size_t len, struct shmbuf *guard)
{
    if (x->nsegs == x->capsegs) {
        size_t cap = x->capsegs != 0 ? x->capsegs * 2 : 64;
        struct copy_seg *s = realloc(x->segs, cap * sizeof(*s));

        if (s == NULL) {
            return -ENOMEM;
        }
        x->segs = s;
        x->capsegs = cap;
    }
    x->segs[x->nsegs].dst = dst;
    x->segs[x->nsegs].src = src;
    x->segs[x->nsegs].len = len;
    x->segs[x->nsegs].run = NULL;
    x->segs[x->nsegs].arg = NULL;
    x->segs[x->nsegs].guard = guard;
    x->nsegs++;
    return 0;
}

int
rpc_xfer_run(struct rpc_xfer *x, void (*run)(void *), void *arg, struct shmbuf *guard)
{
    int rc = rpc_xfer_seg(x, NULL, NULL, 0, guard);

    if (rc == 0) {
        x->segs[x->nsegs - 1].run = run;
        x->segs[x->nsegs - 1].arg = arg;
    }
    return rc;
}

int
rpc_xfer_rop(struct rpc_xfer *x, uint32_t key, void *local, uint64_t raddr, uint32_t rkey,
             uint64_t len)
{
    if (x->nrops == x->caprops) {
        size_t cap = x->caprops != 0 ? x->caprops * 2 : 16;
        struct rpc_rop *r = realloc(x->rops, cap * sizeof(*r));

        if (r == NULL) {
            return -ENOMEM;
        }
        x->rops = r;
        x->caprops = cap;
    }
    x->rops[x->nrops++] = (struct rpc_rop){.x = x, .local = local, .raddr = raddr,
                                           .len = len, .rkey = rkey, .key = key};
    return 0;
}

/* rpc_rop_fail: an RDMA operation of key failed with code: so does the key. */
static void
rpc_rop_fail(struct rpc_xfer *x, uint32_t key, int code)
{
    if (x->put && x->res[key] == 0) {
        x->res[key] = code;         /* the reservation is aborted at the end */
    } else if (!x->put && x->res[key] >= 0) {
        x->res[key] = -(int64_t)code;
    }
}

/*
 * rpc_xfer_pump: post the transfer's next RDMA operations while the queue
 * pair takes them (the rest goes as completions free room).
 */
static void
rpc_xfer_pump(struct rpc_xfer *x)
{
    while (x->next_rop < x->nrops) {
        struct rpc_rop *r = &x->rops[x->next_rop];
        int rc = x->qp == NULL ? KV_UNAVAILABLE
                               : rdma_qp_post(x->qp, x->put ? RDMA_OP_READ : RDMA_OP_WRITE,
                                              x->arena, r->local, r->len, r->raddr, r->rkey,
                                              (uint64_t)(uintptr_t)r);

        if (rc == -EAGAIN) {
            return;                 /* full: some of ours are posted, their completions resume */
        }
        x->next_rop++;
        if (rc != 0) {
            rpc_rop_fail(x, r->key, rc < 0 ? KV_INTERNAL : rc);
            continue;
        }
        x->rops_left++;
    }
}

int
rpc_rdma_cq_poll(struct rdma_cq *cq)
{
    struct rdma_done done[64];
    int total = 0;
    int n;

    do {
        n = rdma_cq_poll(cq, done, 64);
        for (int i = 0; i < n; i++) {
            struct rpc_rop *r = (struct rpc_rop *)(uintptr_t)done[i].wr_id;
            struct rpc_xfer *x = r->x;

            if (done[i].status != 0) {
                rpc_rop_fail(x, r->key, done[i].status);
            }
            x->rops_left--;
            if (x->abandoned) {
                if (x->rops_left == 0) {
                    rpc_xfer_free(x);
                }
                continue;
            }
            rpc_xfer_pump(x);
        }
        total += n > 0 ? n : 0;
    } while (n == 64);
    return total;
}

/* Count the value bytes transfer x was set up to move, by transport and direction. */
static void
rpc_xfer_count(struct rpc_ctx *ctx, const struct rpc_xfer *x, bool rdma)
{
    uint64_t bytes = 0;

    for (uint32_t i = 0; i < x->n; i++) {
        if (x->put) {
            bytes += x->objs[i] != NULL ? store_obj_size(x->objs[i]) : 0;
        } else {
            bytes += x->res[i] > 0 ? (uint64_t)x->res[i] : 0;
        }
    }
    if (x->put) {
        ctr_add(rdma ? &ctx->ctr->rdma_bytes_in : &ctx->ctr->shm_bytes_in, bytes);
    } else {
        ctr_add(rdma ? &ctx->ctr->rdma_bytes_out : &ctx->ctr->shm_bytes_out, bytes);
    }
}

int
rpc_xfer_map(struct rpc_xfer *x, uint32_t key, struct store_obj *o, const struct rpc_piece *pc,
             uint32_t np, uint64_t limit, bool into_obj)
{
    struct iovec ext[STORE_MAX_EXTENTS];
    int next = store_obj_iov(o, ext, STORE_MAX_EXTENTS);
    int e = 0;
    uint32_t p = 0;
    uint64_t eo = 0;
    uint64_t po = 0;

    while (limit > 0 && e < next && p < np) {
        uint64_t chunk = ext[e].iov_len - eo;
        uint8_t *ep = (uint8_t *)ext[e].iov_base + eo;
        int rc;

        if (chunk > pc[p].len - po) {
            chunk = pc[p].len - po;
        }
        if (chunk > limit) {
            chunk = limit;
        }
        if (pc[p].ptr == NULL) {
            rc = rpc_xfer_rop(x, key, ep, pc[p].raddr + po, pc[p].rkey, chunk);
        } else {
            rc = into_obj ? rpc_xfer_seg(x, ep, pc[p].ptr + po, (size_t)chunk, pc[p].guard)
                          : rpc_xfer_seg(x, pc[p].ptr + po, ep, (size_t)chunk, pc[p].guard);
        }
        if (rc != 0) {
            return rc;
        }
        limit -= chunk;
        eo += chunk;
        po += chunk;
        if (eo == ext[e].iov_len) {
            e++;
            eo = 0;
        }
        if (po == pc[p].len) {
            p++;
            po = 0;
        }
    }
    return 0;
}

int
rpc_xfer_start(struct rpc_ctx *ctx, struct rpc_xfer *x, struct rdma_qp *qp, struct outq *out)
{
    struct rpc_xfer **pp = &ctx->xfer;
    bool first = *pp == NULL;

    while (*pp != NULL) {
        pp = &(*pp)->qnext;
    }
    *pp = x;                        /* answered in order, after those before it */
    ctx->nxfer++;
    rpc_xfer_count(ctx, x, x->nrops > 0);
    if (x->nrops > 0) {
        x->qp = qp;
        x->arena = ctx->srv->rdma_arena;
        atomic_store(&x->job.state, COPY_JOB_DONE);     /* nothing for the copy threads */
        rpc_xfer_pump(x);
        return 0;                   /* answered once the work completes (rpc_rdma_cq_poll) */
    }
    if (x->nsegs == 0) {
        atomic_store(&x->job.state, COPY_JOB_DONE);
        return first ? rpc_xfer_poll(ctx, out) : 0;
    }
    x->job.segs = x->segs;
    x->job.nsegs = x->nsegs;
    copier_submit(ctx->srv->copier, &x->job);
    return 0;
}

/* rpc_xfer_pop: the oldest transfer leaves the connection's queue. */
static void
rpc_xfer_pop(struct rpc_ctx *ctx)
{
    ctx->xfer = ctx->xfer->qnext;
    ctx->nxfer--;
}

bool
rpc_xfer_room(const struct rpc_ctx *ctx)
{
    if (ctx->xfer == NULL || ctx->nxfer >= RPC_XFER_MAX || ctx->deferred != NULL
        || ctx->resume != NULL || ctx->xresume != NULL) {
        return false;
    }
    for (const struct rpc_xfer *x = ctx->xfer; x != NULL; x = x->qnext) {
        if (x->put) {
            return false;
        }
    }
    return true;
}

/*
 * rpc_xfer_commit: a batch_put_from whose copies are done: publish its objects and hand them
 * to the pool's owners. A durable one, or one whose owners are waited for (write_ack all),
 * hands its reply over to ctx->deferred, which answers once the SSD tier has the objects and
 * the owners answered: -EINPROGRESS (the connection waits for it). Otherwise 0 with x->res
 * the codes to answer now.
 */
static int
rpc_xfer_commit(struct rpc_ctx *ctx, struct rpc_xfer *x)
{
    struct rpc_deferred *d = NULL;
    bool waits = false;

    if (x->durable && (d = rpc_deferred_new(x->msgid, x->n, true)) == NULL) {
        return -ENOMEM;
    }
    for (uint32_t i = 0; i < x->n; i++) {
        struct store_obj *o = x->objs[i];
        void *t;

        if (o == NULL) {
            continue;
        }
        x->objs[i] = NULL;
        store_obj_ref(o);               /* ours, past the writer's, which commit gives back */
        x->res[i] = store_commit(x->st, o);
        t = x->res[i] == 0 ? rpc_remote_stored_obj(ctx, o) : NULL;    /* to the owners */
        if (t != NULL && d == NULL) {
            d = rpc_deferred_new(x->msgid, x->n, true);
        }
        if (t != NULL && d == NULL) {
            ctx->srv->remote->ticket_put(ctx->srv->remote->arg, t);   /* not waited */
        } else if (t != NULL && rpc_deferred_ticket(ctx, d, i, t) == 0) {
            waits = true;               /* write_ack all: the reply waits for the owners */
        }
        if (x->durable && x->res[i] == 0) {
            rpc_deferred_hold(ctx, d, i, o);
        } else {
            store_obj_unref(x->st, o);
        }
    }
    rpc_remote_flush(ctx);              /* the owners' messages, one per owner */
    if (!x->durable && !waits) {
        rpc_deferred_free(ctx, d);
        return 0;
    }
    for (uint32_t i = 0; i < x->n; i++) {
        if (d->codes[i] == 0) {
            d->codes[i] = (int)x->res[i];   /* a durable key's failure is d's already */
        }
    }
    rpc_xfer_pop(ctx);              /* puts do not overlap: it was the only one */
    rpc_xfer_free(x);
    ctx->deferred = d;
    return -EINPROGRESS;
}

static int rpc_xfer_answer(struct rpc_ctx *ctx, struct outq *out);

/*
 * rpc_xfer_shrunk: a transfer over guarded buffers, its copies done: every
 * key with a piece in a buffer that failed (shrank under some copy, this
 * one's or another's) fails with KV_UNAVAILABLE, whatever its copies did:
 * what was read from such a buffer may be zeros, what was written to it
 * may never have reached the client. The connection then drops those
 * buffers.
 */
static void
rpc_xfer_shrunk(struct rpc_ctx *ctx, struct rpc_xfer *x)
{
    bool any = false;
    uint32_t b = 0;

    for (uint32_t i = 0; i < x->n; i++) {
        bool failed = false;

        for (; b < x->kbufs[i]; b++) {
            failed = failed || shmbuf_failed(x->bufs[b]);
        }
        if (!failed) {
            continue;
        }
        any = true;
        if (x->put && x->res[i] == 0) {
            x->res[i] = KV_UNAVAILABLE;         /* its reservation is aborted below */
        } else if (!x->put && x->res[i] >= 0) {
            x->res[i] = -(int64_t)KV_UNAVAILABLE;
        }
    }
    if (any) {
        (void)shmbuf_set_drop_failed(ctx->bufs);
    }
}

int
rpc_xfer_poll(struct rpc_ctx *ctx, struct outq *out)
{
    int rc = 0;

    while (ctx->xfer != NULL && rc == 0) {
        rc = rpc_xfer_answer(ctx, out);
    }
    return rc;
}

/* rpc_xfer_answer: reply to the oldest transfer if it is done (-EINPROGRESS if not). */
static int
rpc_xfer_answer(struct rpc_ctx *ctx, struct outq *out)
{
    struct rpc_xfer *x = ctx->xfer;
    msgpack_packer pk;

    if (!copy_job_done(&x->job) || x->rops_left > 0 || x->next_rop < x->nrops) {
        return -EINPROGRESS;
    }
    if (x->guarded) {
        rpc_xfer_shrunk(ctx, x);
    }
    for (uint32_t i = 0; x->put && i < x->n; i++) {
        if (x->objs[i] != NULL && x->res[i] != 0) {
            store_abort(x->st, x->objs[i]);     /* its bytes did not all arrive */
            x->objs[i] = NULL;
        }
    }
    if (x->put && x->settle == NULL) {
        int rc = rpc_xfer_commit(ctx, x);

        if (rc != 0) {
            return rc;              /* the reply is ctx->deferred's now (or no memory) */
        }
    }
    msgpack_packer_init(&pk, out, outq_pack_write);
    rpc_pack_head(&pk, x->msgid);
    if (x->settle != NULL) {
        x->settle(ctx, x, &pk);     /* its objects published or aborted: none left to free */
    } else {
        msgpack_pack_array(&pk, x->n);
    }
    for (uint32_t i = 0; x->settle == NULL && i < x->n; i++) {
        if (!x->peer) {
            msgpack_pack_int64(&pk, x->res[i]);
        } else if (x->res[i] >= 0) {
            msgpack_pack_array(&pk, 2);     /* written into the peer's memory: its checksum */
            msgpack_pack_uint32(&pk, store_obj_crc(x->objs[i]));
            msgpack_pack_uint64(&pk, (uint64_t)x->res[i]);
        } else if (x->res[i] == -(int64_t)KV_NOT_FOUND) {
            msgpack_pack_nil(&pk);
        } else {
            msgpack_pack_int64(&pk, -x->res[i]);
        }
    }
    outq_reply_end(out);
    rpc_xfer_pop(ctx);
    rpc_xfer_free(x);      /* get: the references go now, after the copies */
    return out->failed ? -ENOMEM : 0;
}

void
rpc_xfer_resume_drop(struct rpc_ctx *ctx)
{
    if (ctx->xresume != NULL) {
        rpc_xfer_free(ctx->xresume);    /* its reservations are aborted */
        ctx->xresume = NULL;
    }
}

void
rpc_xfer_release(struct rpc_ctx *ctx)
{
    rpc_xfer_resume_drop(ctx);
    while (ctx->xfer != NULL) {
        struct rpc_xfer *x = ctx->xfer;

        rpc_xfer_pop(ctx);
        if (x->rops_left > 0) {
            x->abandoned = true;    /* posted work: its last completion frees it */
            x->nrops = x->next_rop;
        } else if (copy_job_abandon(&x->job)) {
            rpc_xfer_free(x);      /* it had finished: ours to free; else the copier frees it */
        }
    }
}
