/*
 * rpc_resv: the put_start reservation table (rpc_resv.h). Linear probing
 * at most half full, with backward-shift deletion so no tombstones build
 * up; set->earliest lets rpc_resv_expire, called often by the connection,
 * return at once when no deadline is due. No byte is copied here.
 */
#include "rpc_resv.h"

#include <errno.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "clock.h"
#include "rpc_ctx.h"
#include "rpc_req.h"
#include "store.h"

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
struct rpc_resv *
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
void
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
int
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
void
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
