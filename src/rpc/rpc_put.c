/*
 * rpc_put: the put path. put and batch_put, storing each value from
 * inline bytes or from the reservation it was received into while still on
 * the wire (rpc_spill.c made it); a key repeated within one batch_put (the
 * first copy is the one stored, however the bytes arrived). A durable put
 * leaves its reply to rpc_defer.c (struct rpc_deferred), which answers once
 * the SSD tier says how it went; a batch that waits for DRAM room keeps what
 * it did in ctx->resume (a struct rpc_deferred too).
 *
 * A reservation rpc_spill_take makes is committed when its put is handled,
 * or aborted when an earlier copy of its key takes the key back
 * (rpc_dups_yield); what a handler leaves, rpc_dispatch aborts. Like every
 * handler file it calls only the shared pieces below it (rpc_defer,
 * rpc_spill, rpc_req), never touches sockets or the event loop, and
 * reaches objects only through storage/store.h.
 */
#include "rpc_put.h"

#include <errno.h>
#include <limits.h>
#include <msgpack.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "kverr.h"
#include "mp.h"
#include "rpc_defer.h"
#include "rpc_req.h"
#include "rpc_spill.h"
#include "store.h"

#define RPC_DUPS_STACK 64               /* rpc_dups slots kept on the stack (32 reservations) */
#define RPC_SPILL_YIELDED INT_MIN       /* rpc_spill.code: its key went to an earlier copy */

/*
 * Store one put value: spilled (already in a reservation) or inline bytes.
 * Returns the key's outcome code.
 */
static int
rpc_store_value(struct rpc_req *rq, const uint8_t *kp, uint32_t klen, const uint8_t *vp,
                uint64_t vlen, const struct mp_hole *hole)
{
    const struct rpc_limits *lim = rq->ctx->lim;
    struct kv_key key;

    if (hole != NULL) {
        struct rpc_spill *sp = hole->tag;
        struct store_obj *o = sp->obj;
        if (o == NULL && sp->code == RPC_SPILL_YIELDED) {
            /* As an inline repeat would be answered (its bytes are gone: never stored). */
            rpc_key(rq, kp, klen, &key);
            return store_exists(rq->ctx->srv->store, &key) == 1 ? KV_EXISTS : KV_BUSY;
        }
        if (o == NULL) {
            return sp->code;
        }
        sp->obj = NULL;
        int crc = store_commit(rq->ctx->srv->store, o);
        if (crc == 0) {
            rpc_remote_stored(rq, kp, klen);    /* in a cluster: to the key's owners */
        }
        return crc;
    }
    if (klen > lim->max_key_size || vlen > lim->max_value_size) {
        return KV_TOO_LARGE;
    }
    rpc_key(rq, kp, klen, &key);
    int rc = store_put(rq->ctx->srv->store, &key, vp, vlen);
    if (rc == -EAGAIN) {
        /* Room is coming (objects on their way to the SSD); the caller may retry. */
        return rq->ctx->final_try ? KV_NO_SPACE : -EAGAIN;
    }
    if (rc == 0) {
        rpc_remote_stored(rq, kp, klen);
    }
    return rc < 0 ? KV_INTERNAL : rc;
}

int
rpc_put(struct rpc_req *rq)
{
    const uint8_t *kp, *vp;
    uint32_t klen;
    uint64_t vlen;
    const struct mp_hole *hole;
    struct rpc_opts opts;
    int rc = rpc_arity(rq, 2, 3);

    if (rc != 0) {
        return rc;
    }
    if (rpc_read_key(&rq->rd, &kp, &klen) != 0) {
        return rpc_invalid(rq, "key must be bin or str");
    }
    if (mp_read_bin_ref(&rq->rd, &vp, &vlen, &hole) != 0) {
        return rpc_invalid(rq, "value must be bin");
    }
    rc = rpc_put_opts_read(rq, 2, &opts);
    if (rc != 0) {
        return rc;
    }
    rc = rpc_store_value(rq, kp, klen, vp, vlen, hole);
    if (rc == -EAGAIN) {
        return rc;                  /* nothing done: the connection retries the message */
    }
    void *ticket = rq->ticket;      /* write_ack all: the owners' answers are waited for */
    rq->ticket = NULL;
    if ((opts.durable || ticket != NULL) && rc == 0) {
        struct rpc_deferred *d = rpc_deferred_new(rq->msgid, 1, false);

        if (d != NULL && (ticket == NULL || rpc_deferred_ticket(rq->ctx, d, 0, ticket) == 0)) {
            if (opts.durable) {
                rpc_deferred_track(rq, d, 0, kp, klen);
            }
            rq->ctx->deferred = d;
            return 0;
        }
        if (d == NULL && ticket != NULL) {
            rq->ctx->srv->remote->ticket_put(rq->ctx->srv->remote->arg, ticket);
        }
        rpc_deferred_free(rq->ctx, d);
        rc = KV_INTERNAL;
    }
    rpc_reply_head(rq);
    msgpack_pack_int(&rq->pk, rc);
    return 0;
}

/*
 * A key repeated in one batch_put. A spilled value is reserved under its key
 * while the message is still arriving, before an earlier inline copy of that
 * key can be stored: left so, the earlier copy would find the key BUSY and the
 * later one would be kept, which copy wins hanging on how the bytes arrived.
 * So a batch holding reservations maps their keys (only then: a batch without
 * one pays nothing), and an inline copy about to be stored takes its key back
 * from a later reserved copy first: that reservation is aborted and its copy
 * answered as a repeat (rpc_store_value). Spilled copies need nothing: they
 * were reserved in order, so a later one got BUSY or EXISTS already.
 */
struct rpc_dup {
    struct rpc_spill *sp;       /* the reserved copy's spill; NULL: an empty slot */
    const uint8_t *kp;
    uint32_t klen;
    uint32_t idx;               /* its index in the batch */
};

struct rpc_dups {
    struct rpc_dup *slot;       /* open addressing, at most half full; NULL: no map */
    uint64_t mask;
    struct rpc_dup stack[RPC_DUPS_STACK];
};

/* The slot of key kp, or the empty slot where it would go. */
static struct rpc_dup *
rpc_dups_find(struct rpc_req *rq, struct rpc_dups *t, const uint8_t *kp, uint32_t klen)
{
    struct kv_key key;

    rpc_key(rq, kp, klen, &key);
    for (uint64_t h = store_hash64(&key);; h++) {
        struct rpc_dup *d = &t->slot[h & t->mask];
        if (d->sp == NULL || (d->klen == klen && memcmp(d->kp, kp, klen) == 0)) {
            return d;
        }
    }
}

/* Map the keys of the nresv reserved values among the n of keys/vals. 0 or -ENOMEM. */
static int
rpc_dups_init(struct rpc_req *rq, struct rpc_dups *t, struct mp_reader keys, struct mp_reader vals,
              uint32_t n, uint32_t nresv)
{
    uint64_t cap = RPC_DUPS_STACK;

    while (cap < 2 * (uint64_t)nresv) {
        cap *= 2;
    }
    if (cap > RPC_DUPS_STACK) {
        t->slot = calloc(cap, sizeof(*t->slot));
        if (t->slot == NULL) {
            return -ENOMEM;
        }
    } else {
        memset(t->stack, 0, sizeof(t->stack));
        t->slot = t->stack;
    }
    t->mask = cap - 1;
    for (uint32_t i = 0; i < n; i++) {
        const uint8_t *kp, *vp;
        uint32_t klen;
        uint64_t vlen;
        const struct mp_hole *hole;

        rpc_read_key(&keys, &kp, &klen);
        mp_read_bin_ref(&vals, &vp, &vlen, &hole);
        struct rpc_spill *sp = hole != NULL ? hole->tag : NULL;
        if (sp != NULL && sp->obj != NULL && klen <= rq->ctx->lim->max_key_size) {
            struct rpc_dup *d = rpc_dups_find(rq, t, kp, klen);
            if (d->sp == NULL) {
                *d = (struct rpc_dup){.sp = sp, .kp = kp, .klen = klen, .idx = i};
            }
        }
    }
    return 0;
}

static void
rpc_dups_deinit(struct rpc_dups *t)
{
    if (t->slot != t->stack) {
        free(t->slot);
    }
    t->slot = NULL;
}

/*
 * Copy i of key kp, inline with vlen bytes, is about to be stored: a later
 * copy reserved under the key gives it up. A copy over the limits is answered
 * TOO_LARGE without the store, so the later one keeps it (as when inline).
 */
static void
rpc_dups_yield(struct rpc_req *rq, struct rpc_dups *t, uint32_t i, const uint8_t *kp, uint32_t klen,
               uint64_t vlen)
{
    const struct rpc_limits *lim = rq->ctx->lim;

    if (klen > lim->max_key_size || vlen > lim->max_value_size) {
        return;
    }
    struct rpc_dup *d = rpc_dups_find(rq, t, kp, klen);
    if (d->sp == NULL || d->idx <= i || d->sp->obj == NULL) {
        return;
    }
    store_abort(rq->ctx->srv->store, d->sp->obj);
    d->sp->obj = NULL;
    d->sp->code = RPC_SPILL_YIELDED;
}

int
rpc_batch_put(struct rpc_req *rq)
{
    struct mp_reader keys, vals, probe;
    uint32_t nkeys, nvals, nresv = 0;
    struct rpc_opts opts;
    const uint8_t *kp, *vp;
    uint32_t klen;
    uint64_t vlen;
    const struct mp_hole *hole;
    struct rpc_deferred *d = NULL;
    struct rpc_dups dups;
    int stack[64];
    int *codes = stack;
    uint32_t start;
    int rc = rpc_arity(rq, 2, 3);

    if (rc != 0) {
        return rc;
    }
    rc = rpc_keys_skip(rq, &nkeys, &keys);
    if (rc != 0) {
        return rc;
    }
    if (mp_read_array(&rq->rd, &nvals) != 0) {
        return rpc_invalid(rq, "values must be an array of bin");
    }
    if (nvals != nkeys) {
        return rpc_invalid(rq, "keys and values differ in length");
    }
    vals = rq->rd;
    probe = rq->rd;
    for (uint32_t i = 0; i < nvals; i++) {
        if (mp_read_bin_ref(&probe, &vp, &vlen, &hole) != 0) {
            return rpc_invalid(rq, "values must be an array of bin");
        }
        if (hole != NULL && hole->tag != NULL && ((struct rpc_spill *)hole->tag)->obj != NULL) {
            nresv++;
        }
    }
    rq->rd = probe;
    rc = rpc_put_opts_read(rq, 2, &opts);
    if (rc != 0) {
        return rc;
    }
    dups.slot = NULL;
    if (nresv > 0 && nkeys > 1 && rpc_dups_init(rq, &dups, keys, vals, nkeys, nresv) != 0) {
        return -ENOMEM;
    }
    /*
     * A batch that waited for room before comes back with what it did: the
     * keys before d->next are stored (or answered) already.
     */
    d = rq->ctx->resume;
    rq->ctx->resume = NULL;
    if (d != NULL && d->n != nkeys) {
        rpc_deferred_free(rq->ctx, d);
        d = NULL;
    }
    start = d != NULL ? d->next : 0;
    if (d == NULL && opts.durable) {
        d = rpc_deferred_new(rq->msgid, nkeys, true);
        if (d == NULL) {
            rc = -ENOMEM;
            goto out;
        }
    }
    if (d != NULL) {
        codes = d->codes;
    } else if (nkeys > 64) {
        codes = malloc(nkeys * sizeof(*codes));     /* nkeys <= max_batch, checked above */
        if (codes == NULL) {
            rc = -ENOMEM;
            goto out;
        }
    }
    for (uint32_t i = 0; i < nkeys; i++) {
        rpc_read_key(&keys, &kp, &klen);
        mp_read_bin_ref(&vals, &vp, &vlen, &hole);
        if (i < start) {
            continue;
        }
        if (hole == NULL && dups.slot != NULL) {
            rpc_dups_yield(rq, &dups, i, kp, klen, vlen);
        }
        rc = rpc_store_value(rq, kp, klen, vp, vlen, hole);
        if (rc == -EAGAIN && d == NULL) {
            d = rpc_deferred_new(rq->msgid, nkeys, true);
            if (d != NULL) {
                memcpy(d->codes, codes, i * sizeof(*codes));
                if (codes != stack) {
                    free(codes);
                }
                codes = d->codes;
            }
        }
        if (rc == -EAGAIN && d != NULL) {
            /* Wait for room with what is done so far; the message comes back. */
            d->next = i;
            rq->ctx->resume = d;
            goto out;
        }
        if (rc == -EAGAIN) {
            rc = KV_NO_SPACE;       /* no memory to wait with */
        }
        codes[i] = rc;
        if (rq->ticket != NULL) {
            /* write_ack all: the reply waits for the owners of this key too */
            void *ticket = rq->ticket;
            rq->ticket = NULL;
            if (d == NULL && (d = rpc_deferred_new(rq->msgid, nkeys, true)) != NULL) {
                memcpy(d->codes, codes, (i + 1) * sizeof(*codes));
                if (codes != stack) {
                    free(codes);
                }
                codes = d->codes;
            }
            if (d == NULL) {
                rq->ctx->srv->remote->ticket_put(rq->ctx->srv->remote->arg, ticket);
            } else {
                (void)rpc_deferred_ticket(rq->ctx, d, i, ticket);   /* -ENOMEM: not waited */
            }
        }
        if (opts.durable && rc == 0) {
            rpc_deferred_track(rq, d, i, kp, klen);
        }
    }
    rc = 0;
    if (opts.durable || (d != NULL && d->tickets != NULL)) {
        rq->ctx->deferred = d;      /* answered when the SSD says how it went */
        goto out;
    }
    rpc_reply_head(rq);
    msgpack_pack_array(&rq->pk, nkeys);
    for (uint32_t i = 0; i < nkeys; i++) {
        msgpack_pack_int(&rq->pk, codes[i]);
    }
    if (d != NULL) {
        rpc_deferred_free(rq->ctx, d);
    } else if (codes != stack) {
        free(codes);
    }
out:
    rpc_dups_deinit(&dups);
    return rc;
}
