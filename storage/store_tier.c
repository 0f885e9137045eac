/*
 * store_tier: the SSD tier's side of the store (store.h, "the SSD tier's
 * side"): attaching the tier, the outcomes it reports (stored, failed,
 * loaded), the objects it feeds in at start and takes out with a bucket,
 * write-ahead of cold objects, durable syncs and prefetches. The residency
 * rules themselves (what eviction may free, when a get waits) live with the
 * table in store.c and store_evict.c; this file only moves objects between
 * those states under the shard locks, and calls the tier's hooks only to
 * queue.
 */
#include "store_int.h"
#include "clock.h"

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/uio.h>

#include "alloc.h"
#include "kverr.h"

void
store_set_tier(struct store *s, const struct store_tier *t)
{
    s->has_tier = t != NULL;
    if (t != NULL) {
        s->tier = *t;
        store_tier_flags(s, t->write_through, t->on_evict, t->promote);
    }
}

bool
store_has_tier(const struct store *s)
{
    return s->has_tier;
}

void
store_tier_flags(struct store *s, bool write_through, bool on_evict, bool promote)
{
    atomic_store(&s->write_through, write_through);
    atomic_store(&s->on_evict, on_evict);
    atomic_store(&s->promote, promote);
    atomic_fetch_add_explicit(&s->tier_progress, 1, memory_order_release);
}

void
store_tier_degraded(struct store *s, bool degraded)
{
    atomic_store(&s->degraded, degraded);
    atomic_fetch_add_explicit(&s->tier_progress, 1, memory_order_release);
}

void
store_obj_key(const struct store_obj *o, struct kv_key *key)
{
    key->tenant = o->tenant;
    key->len = o->key_len;
    key->ptr = store_obj_kptr(o);
}

struct store_obj *
store_obj_link(const struct store_obj *o)
{
    return o->tlink;
}

void
store_obj_set_link(struct store_obj *o, struct store_obj *next)
{
    o->tlink = next;
}

int
store_obj_ssd_state(const struct store_obj *o)
{
    return atomic_load_explicit(&o->ssd, memory_order_acquire);
}

void
store_obj_loc(const struct store_obj *o, struct store_loc *loc)
{
    *loc = o->loc;
}

int
store_obj_stored(struct store *s, struct store_obj *o, const struct store_loc *loc)
{
    struct store_shard *sh = store_shard_of(s, o->hash);
    int rc = 0;

    pthread_mutex_lock(&sh->lock);
    atomic_fetch_sub_explicit(&s->offloading, 1, memory_order_relaxed);
    atomic_fetch_sub_explicit(&s->offload_bytes, o->size, memory_order_relaxed);
    atomic_fetch_add_explicit(&s->tier_progress, 1, memory_order_release);
    if (o->state != STORE_OBJ_PUBLISHED) {
        atomic_store_explicit(&o->ssd, STORE_SSD_NONE, memory_order_release);
        rc = KV_NOT_FOUND;
    } else {
        o->loc = *loc;
        atomic_store_explicit(&o->ssd, STORE_SSD_STORED, memory_order_release);
        sh->stored++;
        store_ssd_charge(s, o->tenant, (int64_t)o->size);
    }
    pthread_mutex_unlock(&sh->lock);
    return rc;
}

void
store_obj_store_failed(struct store *s, struct store_obj *o)
{
    struct store_shard *sh = store_shard_of(s, o->hash);
    uint32_t old;

    pthread_mutex_lock(&sh->lock);
    atomic_fetch_sub_explicit(&s->offloading, 1, memory_order_relaxed);
    atomic_fetch_sub_explicit(&s->offload_bytes, o->size, memory_order_relaxed);
    atomic_fetch_add_explicit(&s->tier_progress, 1, memory_order_release);
    /*
     * The reference goes in the same breath as the state changes, so whoever
     * sees FAILED (a durable put taking its object back) finds no tier holder.
     */
    old = atomic_fetch_sub_explicit(&o->refs, 1, memory_order_acq_rel);
    atomic_store_explicit(&o->ssd, STORE_SSD_FAILED, memory_order_release);
    pthread_mutex_unlock(&sh->lock);
    if (old == 1) {
        /* It had left the table meanwhile: ours was the last reference. */
        atomic_fetch_add_explicit(&o->refs, 1, memory_order_relaxed);
        store_obj_put(s, o, 1);
    }
}

int
store_sync(struct store *s, struct store_obj *o)
{
    struct store_shard *sh = store_shard_of(s, o->hash);
    int state;

    if (!s->has_tier) {
        return KV_UNSUPPORTED;
    }
    pthread_mutex_lock(&sh->lock);
    atomic_store_explicit(&o->must_write, 1, memory_order_relaxed);
    state = atomic_load_explicit(&o->ssd, memory_order_relaxed);
    if (o->state == STORE_OBJ_PUBLISHED && (state == STORE_SSD_NONE || state == STORE_SSD_FAILED)
        && !store_queue_locked(s, o)) {
        pthread_mutex_unlock(&sh->lock);
        return KV_QUOTA_EXCEEDED;
    }
    pthread_mutex_unlock(&sh->lock);
    return 0;
}

bool
store_obj_must_write(const struct store_obj *o)
{
    return atomic_load_explicit(&o->must_write, memory_order_relaxed) != 0;
}

bool
store_offload_full(struct store *s)
{
    uint64_t max = s->tier.offload_max;

    return max != 0 && atomic_load_explicit(&s->offload_bytes, memory_order_relaxed) >= max;
}

void
store_offload_count_drop_locked(struct store *s, const struct store_obj *o)
{
    if (s->has_tier && atomic_load_explicit(&s->on_evict, memory_order_relaxed)
        && !atomic_load_explicit(&s->degraded, memory_order_relaxed)
        && atomic_load_explicit(&o->ssd, memory_order_relaxed) == STORE_SSD_NONE
        && o->state == STORE_OBJ_PUBLISHED && !store_ssd_over_quota(s, o)) {
        atomic_fetch_add_explicit(&s->offload_dropped, 1, memory_order_relaxed);
    }
}

uint64_t
store_offload_cold(struct store *s, uint64_t bytes)
{
    enum { PER_SHARD = 8 };
    unsigned start = atomic_fetch_add_explicit(&s->cold_cursor, 1, memory_order_relaxed);
    uint64_t now = clock_coarse_ms();
    uint64_t queued = 0;

    if (!s->has_tier
        || alloc_used_pages(s->alloc)
               < atomic_load_explicit(&s->low_pages, memory_order_relaxed) / 16 * 15) {
        return 0;   /* far from eviction: nothing needs to be written ahead yet */
    }
    for (unsigned i = 0; i < STORE_SHARDS && queued < bytes; i++) {
        struct store_shard *sh = &s->shard[(start + i) % STORE_SHARDS];
        struct store_obj *o;
        int seen = 0;

        pthread_mutex_lock(&sh->lock);
        for (o = sh->lru[STORE_LRU_NORMAL].tail; o != NULL && seen < PER_SHARD && queued < bytes;
             o = o->lru_prev, seen++) {
            /* Not a tenant with an SSD quota: writing ahead into a full share would drop
             * the tenant's own oldest bucket, whose objects still in DRAM would then be
             * written ahead again, without end; they are written when evicted. */
            if (store_evictable_locked(o, now)
                && atomic_load_explicit(&o->ssd, memory_order_relaxed) == STORE_SSD_NONE
                && store_ssd_share(s, o->tenant) == 0) {
                store_queue_locked(s, o);
                queued += o->size;
            }
        }
        pthread_mutex_unlock(&sh->lock);
    }
    return queued;
}

int
store_insert_stored(struct store *s, const struct kv_key *key, uint64_t size,
                    const struct store_loc *loc)
{
    uint64_t hash = store_hash64(key);
    struct store_shard *sh = store_shard_of(s, hash);
    int cap = store_ext_cap(s, store_pages(size), 1);
    size_t bytes = sizeof(struct store_obj) + (size_t)cap * sizeof(struct alloc_extent) + key->len;
    struct store_obj *o;

    if (key->len > atomic_load_explicit(&s->max_key_size, memory_order_relaxed)) {
        return KV_TOO_LARGE;
    }
    o = malloc(bytes);
    if (o == NULL) {
        return -ENOMEM;
    }
    memset(o, 0, sizeof(*o));
    o->base = s->base;
    o->hash = hash;
    o->size = size;
    atomic_init(&o->refs, 1);       /* the table's */
    o->tenant = key->tenant;
    o->key_len = key->len;
    o->state = STORE_OBJ_PUBLISHED;
    o->ext_cap = (uint8_t)cap;
    o->loc = *loc;
    atomic_init(&o->ssd, STORE_SSD_STORED);
    if (key->len != 0) {
        memcpy((uint8_t *)(o->ext + cap), key->ptr, key->len);
    }
    pthread_mutex_lock(&sh->lock);
    if (store_find_locked(sh, hash, key) != NULL) {
        pthread_mutex_unlock(&sh->lock);
        free(o);
        return KV_EXISTS;
    }
    store_index_locked(s, sh, o);
    sh->objects++;
    sh->value_bytes += size;
    sh->stored++;
    pthread_mutex_unlock(&sh->lock);
    store_ssd_charge(s, key->tenant, (int64_t)size);
    atomic_fetch_add_explicit(&s->metadata_bytes, bytes, memory_order_relaxed);
    return 0;
}

void
store_stored_loc(struct store *s, struct store_obj *o, struct store_loc *loc)
{
    struct store_shard *sh = store_shard_of(s, o->hash);

    pthread_mutex_lock(&sh->lock);
    *loc = o->loc;
    pthread_mutex_unlock(&sh->lock);
}

int
store_move_stored(struct store *s, const struct kv_key *key, const struct store_loc *from,
                  const struct store_loc *to)
{
    uint64_t hash = store_hash64(key);
    struct store_shard *sh = store_shard_of(s, hash);
    struct store_obj *o;
    int rc = KV_NOT_FOUND;

    pthread_mutex_lock(&sh->lock);
    o = store_find_locked(sh, hash, key);
    if (o != NULL && o->state == STORE_OBJ_PUBLISHED
        && atomic_load_explicit(&o->ssd, memory_order_relaxed) == STORE_SSD_STORED
        && o->loc.bucket == from->bucket && o->loc.offset == from->offset) {
        o->loc = *to;
        rc = 0;
    }
    pthread_mutex_unlock(&sh->lock);
    return rc;
}

int
store_drop_stored(struct store *s, const struct kv_key *key, const struct store_loc *loc)
{
    uint64_t hash = store_hash64(key);
    struct store_shard *sh = store_shard_of(s, hash);
    struct store_obj *o;
    int left = 0;

    pthread_mutex_lock(&sh->lock);
    o = store_find_locked(sh, hash, key);
    if (o != NULL && o->state == STORE_OBJ_PUBLISHED
        && atomic_load_explicit(&o->ssd, memory_order_relaxed) == STORE_SSD_STORED
        && o->loc.bucket == loc->bucket && o->loc.offset == loc->offset) {
        store_ssd_charge(s, o->tenant, -(int64_t)o->size);
        if (o->resident) {
            atomic_store_explicit(&o->ssd, STORE_SSD_NONE, memory_order_release);
            sh->stored--;
            if (atomic_load_explicit(&s->write_through, memory_order_relaxed)) {
                /* Write-through promises an SSD copy of every object: write it again. */
                store_queue_locked(s, o);
            }
        } else {
            store_detach_locked(s, sh, o);
            left = 1;
        }
    }
    pthread_mutex_unlock(&sh->lock);
    if (left) {
        store_obj_unref(s, o);      /* the table's; a running load keeps its own */
    }
    return left;
}

int
store_load_begin(struct store *s, struct store_obj *o, struct iovec *iov, int max, int *n)
{
    struct store_shard *sh = store_shard_of(s, o->hash);
    struct alloc_extent ext[STORE_MAX_EXTENTS];
    uint64_t npages = store_pages(o->size);
    int got = 0;
    int rc;

    *n = 0;
    if (max < STORE_MAX_EXTENTS) {
        return KV_INVALID_ARGUMENT;
    }
    rc = store_take_pages(s, npages, ext, o->ext_cap, &got);
    if (rc != 0) {
        return rc == -EAGAIN ? KV_NO_SPACE : rc;
    }
    pthread_mutex_lock(&sh->lock);
    if (o->state != STORE_OBJ_PUBLISHED) {
        pthread_mutex_unlock(&sh->lock);
        alloc_give(s->alloc, ext, got);
        return KV_NOT_FOUND;
    }
    memcpy(o->ext, ext, (size_t)got * sizeof(ext[0]));
    o->n_ext = (uint8_t)got;
    pthread_mutex_unlock(&sh->lock);
    store_charge(s, o->tenant, (int64_t)store_ext_pages(ext, got));
    for (int i = 0; i < got; i++) {
        iov[i].iov_base = alloc_extent_ptr(s->base, &ext[i]);
        iov[i].iov_len = alloc_extent_bytes(&ext[i]);
    }
    *n = got;
    return 0;
}

int
store_load_end(struct store *s, struct store_obj *o, int rc)
{
    struct store_shard *sh = store_shard_of(s, o->hash);
    int left = 0;

    pthread_mutex_lock(&sh->lock);
    o->loading = 0;
    sh->loading--;
    if (rc == 0 && o->state == STORE_OBJ_PUBLISHED) {
        struct store_list *l;

        o->resident = 1;
        sh->resident++;
        sh->resident_bytes += o->size;
        /*
         * Stamped now either way, so it outlives older objects until its reader (or a
         * prefetch's) comes for it; without promotion that read stamps it oldest.
         */
        o->atime = clock_coarse_ms();
        o->referenced = 0;
        o->cold = !atomic_load_explicit(&s->promote, memory_order_relaxed);
        l = store_list_of(sh, o);
        if (l != NULL && atomic_load_explicit(&s->promote, memory_order_relaxed)) {
            store_list_push_head(l, o);
        } else if (l != NULL) {
            store_list_push_tail(l, o);
        }
    } else {
        store_charge(s, o->tenant, -(int64_t)store_ext_pages(o->ext, o->n_ext));
        alloc_give(s->alloc, o->ext, o->n_ext);
        o->n_ext = 0;
        if ((rc == KV_CHECKSUM_MISMATCH || rc == KV_NOT_FOUND) && o->state == STORE_OBJ_PUBLISHED) {
            store_detach_locked(s, sh, o);
            left = 1;
        }
    }
    pthread_mutex_unlock(&sh->lock);
    store_obj_put(s, o, left ? 2 : 1);
    return left;
}

int
store_get_stored(struct store *s, const struct kv_key *key, struct store_obj **out)
{
    uint64_t hash = store_hash64(key);
    struct store_shard *sh = store_shard_of(s, hash);
    struct store_obj *o;
    int rc = KV_NOT_FOUND;

    *out = NULL;
    if (!s->has_tier || s->tier.read == NULL) {
        return KV_UNSUPPORTED;
    }
    pthread_mutex_lock(&sh->lock);
    o = store_find_locked(sh, hash, key);
    if (o != NULL && o->state == STORE_OBJ_PUBLISHED) {
        rc = KV_EXISTS;
        if (!o->resident
            && atomic_load_explicit(&o->ssd, memory_order_relaxed) == STORE_SSD_STORED) {
            atomic_fetch_add_explicit(&o->refs, 1, memory_order_relaxed);
            *out = o;
            rc = 0;
        }
    }
    pthread_mutex_unlock(&sh->lock);
    return rc;
}

int
store_read_stored(struct store *s, struct store_obj *o, const struct iovec *iov, int n)
{
    return s->tier.read(s->tier.arg, o, iov, n);
}

int
store_prefetch(struct store *s, const struct kv_key *key)
{
    uint64_t hash = store_hash64(key);
    struct store_shard *sh = store_shard_of(s, hash);
    struct store_obj *o;
    int pending = 0;

    pthread_mutex_lock(&sh->lock);
    o = store_find_locked(sh, hash, key);
    if (o != NULL && o->state == STORE_OBJ_PUBLISHED && !o->resident && s->has_tier) {
        store_load_start_locked(s, sh, o);
        pending = 1;
    }
    pthread_mutex_unlock(&sh->lock);
    return pending;
}

