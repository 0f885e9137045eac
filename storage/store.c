/*
 * store: the DRAM object store behind store.h. It owns the key table (64
 * shards, each a chained hash table that doubles as it fills, its near-LRU
 * lists and its counters, all under the shard's mutex) and the object
 * metadata (one heap block per object: the struct, its extents, its key);
 * the arena pages themselves belong to storage/alloc.c, the eviction policy
 * (what goes when the arena or a tenant's quota is full) to
 * storage/store_evict.c, the SSD tier's side of the store (reports from the
 * tier, loads, start-up inserts) to storage/store_tier.c, and what they
 * share to store_int.h.
 * It must not block on I/O, must not hold two shard locks at once, and takes
 * the allocator's lock only after (or without) a shard lock.
 *
 * Recency: every published object carries a coarse access stamp (monotonic
 * milliseconds). Each shard keeps two lists, newest at the head: normal
 * objects and soft-pinned objects; hard-pinned and reserved objects are on no
 * list. An access (get, exists, size) stamps the object and marks it
 * referenced, writing only the object's own first bytes, which the key
 * compare has just read; it does not relink the object. Eviction
 * (storage/store_evict.c) does the relinking lazily: a referenced object met
 * at a tail moves to the head with its mark cleared (a second chance, as in
 * CLOCK), so the tails are objects not accessed since they reached the head,
 * and the evictor takes the one with the oldest stamp across shards. Moving
 * on every access would cost two cache misses on the list neighbours per
 * read (exists measured about 30% slower on a million-key table read in
 * random order) and would make every reader of a hot object write shared
 * lines. memcached marks fetched items active and relinks them lazily for
 * the same reasons.
 *
 * Lifetime: refs counts the table's reference (while indexed) plus one per
 * writer or reader. A reference can only be gained through a lookup under
 * the shard lock or from an existing one, so an indexed object seen with
 * refs == 1 under its shard lock has no holder but the table: eviction and
 * remove detach it there and drop the last reference after unlocking.
 */
#include "store_int.h"
#include "clock.h"

#include "alloc.h"
#include "crc32c.h"
#include "kverr.h"

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/uio.h>
#include <time.h>

/* ---- small helpers ---- */

static void store_graves_sweep(struct store *s);
static void store_tenant_usage_pages(struct store *s, uint32_t tenant, uint64_t *objects,
                                     uint64_t *bytes, uint64_t *pages, uint64_t *stored);

static int
store_watermarks_valid(const struct store_config *cfg)
{
    /* Written so that NaN fails. */
    return cfg->low_watermark > 0.0 && cfg->low_watermark <= cfg->high_watermark
           && cfg->high_watermark <= 1.0
           && (cfg->policy == STORE_EVICT_LRU || cfg->policy == STORE_EVICT_FIFO
               || cfg->policy == STORE_EVICT_SLRU);
}

static void
store_limits_apply(struct store *s, const struct store_config *cfg)
{
    atomic_store(&s->max_key_size, cfg->max_key_size);
    atomic_store(&s->max_value_size, cfg->max_value_size);
    atomic_store(&s->high_pages, (uint64_t)(cfg->high_watermark * (double)s->capacity_pages));
    atomic_store(&s->low_pages, (uint64_t)(cfg->low_watermark * (double)s->capacity_pages));
    atomic_store(&s->policy, (int)cfg->policy);
}

/* ---- lists and table (shard lock held) ---- */

void
store_list_push_head(struct store_list *l, struct store_obj *o)
{
    o->lru_prev = NULL;
    o->lru_next = l->head;
    if (l->head != NULL) {
        l->head->lru_prev = o;
    } else {
        l->tail = o;
    }
    l->head = o;
}

void
store_list_unlink(struct store_list *l, struct store_obj *o)
{
    if (o->lru_prev != NULL) {
        o->lru_prev->lru_next = o->lru_next;
    } else {
        l->head = o->lru_next;
    }
    if (o->lru_next != NULL) {
        o->lru_next->lru_prev = o->lru_prev;
    } else {
        l->tail = o->lru_prev;
    }
    o->lru_prev = NULL;
    o->lru_next = NULL;
}

void
store_list_push_tail(struct store_list *l, struct store_obj *o)
{
    o->lru_next = NULL;
    o->lru_prev = l->tail;
    if (l->tail != NULL) {
        l->tail->lru_next = o;
    } else {
        l->head = o;
    }
    l->tail = o;
}

/*
 * store_list_of: the list a published object is on, or NULL (hard-pinned,
 * reserved, or not resident: only arena pages are evicted from lists).
 */
struct store_list *
store_list_of(struct store_shard *sh, const struct store_obj *o)
{
    if (o->state != STORE_OBJ_PUBLISHED || !o->resident) {
        return NULL;
    }
    switch (o->pin) {
    case STORE_PIN_NONE:
        return &sh->lru[o->seg ? STORE_LRU_PROTECTED : STORE_LRU_NORMAL];
    case STORE_PIN_SOFT:
        return &sh->lru[STORE_LRU_SOFT];
    default:
        return NULL;
    }
}

/*
 * Stamp and mark only; eviction relinks (see the top of the file). An object
 * already stamped in this clock tick is not written again, so a hot object's
 * line stays shared between the cores reading it. Under FIFO an access
 * changes nothing: the stamp stays the time the object was stored.
 */
static void
store_touch_locked(struct store *s, struct store_obj *o)
{
    uint64_t now = clock_coarse_ms();

    if (o->cold) {
        /* An SSD copy loaded without promotion has served its read: it goes first. */
        o->atime = 0;
        o->referenced = 0;
        o->cold = 0;
        return;
    }

    if (atomic_load_explicit(&s->policy, memory_order_relaxed) == STORE_EVICT_FIFO) {
        return;
    }
    if (o->atime != now) {
        o->atime = now;
        o->referenced = 1;
    }
}

/*
 * store_bucket_locked: the chain a hash lives in. A shard grows
 * incrementally, as Redis dicts do, so no single insert pays for rehashing
 * a big table under the shard lock: while the previous table is kept, an old
 * bucket not yet moved still holds (and receives) its keys, and each insert
 * or remove moves STORE_REHASH_STEP more old buckets.
 */
static inline struct store_obj **
store_bucket_locked(struct store_shard *sh, uint64_t hash)
{
    if (sh->old != NULL && (hash & sh->old_mask) >= sh->rehash_pos) {
        return &sh->old[hash & sh->old_mask];
    }
    return &sh->buckets[hash & sh->mask];
}

struct store_obj *
store_find_locked(struct store_shard *sh, uint64_t hash, const struct kv_key *key)
{
    for (struct store_obj *o = *store_bucket_locked(sh, hash); o != NULL; o = o->hnext) {
        if (o->hash == hash && o->tenant == key->tenant && o->key_len == key->len
            && (key->len == 0 || memcmp(store_obj_kptr(o), key->ptr, key->len) == 0)) {
            return o;
        }
    }
    return NULL;
}

static void
store_rehash_step_locked(struct store *s, struct store_shard *sh, uint64_t steps)
{
    while (sh->old != NULL && steps-- > 0) {
        struct store_obj *o = sh->old[sh->rehash_pos];

        sh->old[sh->rehash_pos] = NULL;
        while (o != NULL) {
            struct store_obj *next = o->hnext;
            struct store_obj **b = &sh->buckets[o->hash & sh->mask];

            o->hnext = *b;
            *b = o;
            o = next;
        }
        if (sh->rehash_pos++ == sh->old_mask) {
            free(sh->old);
            atomic_fetch_sub(&s->metadata_bytes, (sh->old_mask + 1) * sizeof(*sh->old));
            sh->old = NULL;
        }
    }
}

/* A failed grow keeps the one table: chains get longer, lookups stay correct. */
static void
store_table_grow_locked(struct store *s, struct store_shard *sh)
{
    uint64_t n = (sh->mask + 1) * 2;
    struct store_obj **nb;

    store_rehash_step_locked(s, sh, UINT64_MAX);    /* only one previous table at a time */
    nb = calloc(n, sizeof(*nb));
    if (nb == NULL) {
        return;
    }
    atomic_fetch_add(&s->metadata_bytes, n * sizeof(*nb));
    sh->old = sh->buckets;
    sh->old_mask = sh->mask;
    sh->rehash_pos = 0;
    sh->buckets = nb;
    sh->mask = n - 1;
    atomic_store_explicit(&sh->pf_buckets, (uintptr_t)nb, memory_order_relaxed);
    atomic_store_explicit(&sh->pf_mask, n - 1, memory_order_relaxed);
}

void
store_index_locked(struct store *s, struct store_shard *sh, struct store_obj *o)
{
    struct store_obj **b = store_bucket_locked(sh, o->hash);

    o->hnext = *b;
    *b = o;
    sh->count++;
    if (sh->count > sh->mask + 1) {
        store_table_grow_locked(s, sh);
    }
    store_rehash_step_locked(s, sh, STORE_REHASH_STEP);
}

/* store_forget_locked: take an unindexed object off its list and out of the counters. */
static void
store_forget_locked(struct store_shard *sh, struct store_obj *o)
{
    if (o->state == STORE_OBJ_RESERVED) {
        sh->reserved--;
    } else if (o->state == STORE_OBJ_PUBLISHED) {
        struct store_list *l = store_list_of(sh, o);

        if (l != NULL) {
            store_list_unlink(l, o);
        }
        sh->objects--;
        sh->protected_objs -= o->seg;
        o->seg = 0;
        sh->value_bytes -= o->size;
        if (o->resident) {
            sh->resident--;
            sh->resident_bytes -= o->size;
        }
        if (atomic_load_explicit(&o->ssd, memory_order_relaxed) == STORE_SSD_STORED) {
            sh->stored--;
        }
        if (o->pin == STORE_PIN_HARD) {
            sh->pinned_hard--;
        } else if (o->pin == STORE_PIN_SOFT) {
            sh->pinned_soft--;
        }
    }
    o->state = STORE_OBJ_GONE;
    o->hnext = NULL;
}

void
store_detach_locked(struct store *s, struct store_shard *sh, struct store_obj *o)
{
    struct store_obj **pp = store_bucket_locked(sh, o->hash);

    while (*pp != o) {
        pp = &(*pp)->hnext;
    }
    *pp = o->hnext;
    sh->count--;
    store_forget_locked(sh, o);
    store_rehash_step_locked(s, sh, STORE_REHASH_STEP);
}

void
store_charge(struct store *s, uint32_t tenant, int64_t pages)
{
    struct store_quota *q = store_quota_of(s, tenant);

    if (q != NULL && pages != 0) {
        atomic_fetch_add_explicit(&q->used, (uint64_t)(pages * (int64_t)STORE_PAGE_SIZE),
                                  memory_order_relaxed);
    }
}

int
store_set_quota(struct store *s, uint32_t tenant, uint64_t bytes, uint64_t ssd_bytes)
{
    struct store_quota *q = store_quota_of(s, tenant);
    uint32_t n = atomic_load_explicit(&s->nquotas, memory_order_relaxed);

    if (tenant == 0) {
        return KV_INVALID_ARGUMENT;
    }
    if (q == NULL) {
        uint64_t objects, value_bytes, pages = 0, stored = 0;
        uint32_t i = 0;

        /* A slot a removed tenant gave back, else a new one. */
        while (i < n && atomic_load_explicit(&s->quota[i].tenant, memory_order_relaxed) != 0) {
            i++;
        }
        if (i == STORE_QUOTA_SLOTS) {
            return KV_NO_SPACE;
        }
        q = &s->quota[i];
        atomic_store_explicit(&q->used, 0, memory_order_relaxed);
        atomic_store_explicit(&q->ssd_used, 0, memory_order_relaxed);
        atomic_store_explicit(&q->usage_ms, 0, memory_order_relaxed);
        atomic_store_explicit(&q->limit, 0, memory_order_relaxed);
        atomic_store_explicit(&q->ssd_limit, 0, memory_order_relaxed);
        atomic_store_explicit(&q->tenant, tenant, memory_order_release);
        if (i == n) {
            atomic_store_explicit(&s->nquotas, n + 1, memory_order_release);
        }
        /* What the tenant holds already (a quota added by a reload); exact when quiet
         * (a charge racing with this count may be counted twice or not at all). */
        store_tenant_usage_pages(s, tenant, &objects, &value_bytes, &pages, &stored);
        atomic_fetch_add_explicit(&q->used, pages * STORE_PAGE_SIZE, memory_order_relaxed);
        atomic_fetch_add_explicit(&q->ssd_used, stored, memory_order_relaxed);
    }
    atomic_store_explicit(&q->limit, bytes, memory_order_relaxed);
    atomic_store_explicit(&q->ssd_limit, ssd_bytes, memory_order_relaxed);
    return 0;
}

void
store_drop_quota(struct store *s, uint32_t tenant)
{
    struct store_quota *q = store_quota_of(s, tenant);

    if (q != NULL) {
        atomic_store_explicit(&q->limit, 0, memory_order_relaxed);
        atomic_store_explicit(&q->ssd_limit, 0, memory_order_relaxed);
        atomic_store_explicit(&q->tenant, 0, memory_order_release);
    }
}

static void
store_obj_free(struct store *s, struct store_obj *o)
{
    store_charge(s, o->tenant, -(int64_t)store_ext_pages(o->ext, o->n_ext));
    alloc_give(s->alloc, o->ext, o->n_ext);
    atomic_fetch_sub(&s->metadata_bytes, store_obj_heap_bytes(o));
    free(o);
}

/* store_obj_put: drop n references at once; free the object with the last. */
void
store_obj_put(struct store *s, struct store_obj *o, uint32_t n)
{
    uint32_t old = atomic_fetch_sub_explicit(&o->refs, n, memory_order_acq_rel);

    if (old < n) {
        fprintf(stderr, "store_obj_unref: reference count underflow on object %p\n", (void *)o);
        abort();
    }
    if (old == n) {
        store_obj_free(s, o);
    }
}

/* ---- lifecycle ---- */

int
store_create(const struct store_config *cfg, struct store **out)
{
    struct store *s;
    size_t bytes = (sizeof(*s) + 63) & ~(size_t)63;
    int rc;

    if (out == NULL) {
        return KV_INVALID_ARGUMENT;
    }
    *out = NULL;
    if (cfg == NULL || cfg->memory_size < STORE_PAGE_SIZE || !store_watermarks_valid(cfg)) {
        return KV_INVALID_ARGUMENT;
    }
    store_hash_init();
    s = aligned_alloc(64, bytes);
    if (s == NULL) {
        return -ENOMEM;
    }
    memset(s, 0, bytes);
    atomic_store(&s->metadata_bytes, bytes);
    rc = pthread_mutex_init(&s->grave_lock, NULL);
    if (rc != 0) {
        free(s);
        return -rc;
    }
    s->grave_ready = true;

    rc = alloc_create_file(cfg->memory_size,
                           cfg->hugepages == STORE_HUGEPAGES_ON    ? ALLOC_HUGE_ON
                           : cfg->hugepages == STORE_HUGEPAGES_OFF ? ALLOC_HUGE_OFF
                                                                   : ALLOC_HUGE_AUTO,
                           cfg->memory_file, &s->alloc);
    if (rc != 0) {
        goto fail;
    }
    s->base = alloc_base(s->alloc);
    s->capacity_pages = alloc_total_pages(s->alloc);
    store_limits_apply(s, cfg);

    for (unsigned i = 0; i < STORE_SHARDS; i++) {
        struct store_shard *sh = &s->shard[i];

        sh->buckets = calloc(STORE_BUCKETS_INIT, sizeof(*sh->buckets));
        if (sh->buckets == NULL) {
            rc = -ENOMEM;
            goto fail;
        }
        sh->mask = STORE_BUCKETS_INIT - 1;
        atomic_store_explicit(&sh->pf_buckets, (uintptr_t)sh->buckets, memory_order_relaxed);
        atomic_store_explicit(&sh->pf_mask, sh->mask, memory_order_relaxed);
        atomic_fetch_add(&s->metadata_bytes, STORE_BUCKETS_INIT * sizeof(*sh->buckets));
        rc = pthread_mutex_init(&sh->lock, NULL);
        if (rc != 0) {
            free(sh->buckets);
            sh->buckets = NULL;
            rc = -rc;
            goto fail;
        }
        s->nshards_ready++;
    }
    if (cfg->evict_background) {
        rc = store_evictor_start(s);
        if (rc != 0) {
            goto fail;
        }
    }
    /* Best effort: without it pages fault in on first use, as they would anyway. */
    (void)alloc_prefault_start(s->alloc);
    *out = s;
    return 0;

fail:
    store_destroy(s);
    return rc;
}

void
store_destroy(struct store *s)
{
    if (s == NULL) {
        return;
    }
    store_evictor_stop(s);
    while (s->graves != NULL) {
        struct store_obj *o = s->graves;

        s->graves = o->hnext;
        free(o);
    }
    if (s->grave_ready) {
        pthread_mutex_destroy(&s->grave_lock);
    }
    for (int i = 0; i < s->nshards_ready; i++) {
        struct store_shard *sh = &s->shard[i];

        store_rehash_step_locked(s, sh, UINT64_MAX);
        for (uint64_t b = 0; b <= sh->mask; b++) {
            struct store_obj *o = sh->buckets[b];

            while (o != NULL) {
                struct store_obj *next = o->hnext;

                free(o);            /* the arena goes as a whole below */
                o = next;
            }
        }
        free(sh->buckets);
        pthread_mutex_destroy(&sh->lock);
    }
    alloc_destroy(s->alloc);
    free(s);
}

int
store_set_limits(struct store *s, const struct store_config *cfg)
{
    if (s == NULL || cfg == NULL || !store_watermarks_valid(cfg)) {
        return KV_INVALID_ARGUMENT;
    }
    store_limits_apply(s, cfg);
    return 0;
}

/* ---- the tier's queues and SSD shares ---- */

void
store_load_start_locked(struct store *s, struct store_shard *sh, struct store_obj *o)
{
    if (!o->loading) {
        o->loading = 1;
        sh->loading++;
        atomic_fetch_add_explicit(&o->refs, 1, memory_order_relaxed);
        s->tier.load(s->tier.arg, o);
    }
}

bool
store_ssd_over_quota(struct store *s, const struct store_obj *o)
{
    uint64_t share = store_ssd_share(s, o->tenant);

    return share != 0 && o->size > share;
}

uint64_t
store_ssd_share(struct store *s, uint32_t owner)
{
    const struct store_quota *q = store_quota_of(s, owner);

    return q != NULL ? atomic_load_explicit(&q->ssd_limit, memory_order_relaxed) : 0;
}

uint32_t
store_ssd_owner(struct store *s, uint32_t tenant)
{
    return store_ssd_share(s, tenant) != 0 ? tenant : 0;
}

bool
store_ssd_guarded(struct store *s, uint32_t owner)
{
    const struct store_quota *q = store_quota_of(s, owner);
    uint64_t limit = q != NULL ? atomic_load_explicit(&q->ssd_limit, memory_order_relaxed) : 0;

    return limit != 0 && atomic_load_explicit(&q->ssd_used, memory_order_relaxed) <= limit;
}

void
store_ssd_charge(struct store *s, uint32_t tenant, int64_t bytes)
{
    struct store_quota *q = store_quota_of(s, tenant);

    if (q != NULL && bytes != 0) {
        atomic_fetch_add_explicit(&q->ssd_used, (uint64_t)bytes, memory_order_relaxed);
    }
}

bool
store_queue_locked(struct store *s, struct store_obj *o)
{
    if (store_ssd_over_quota(s, o)) {
        return false;               /* larger than its tenant's whole SSD share: DRAM only */
    }
    atomic_store_explicit(&o->ssd, STORE_SSD_QUEUED, memory_order_relaxed);
    atomic_fetch_add_explicit(&o->refs, 1, memory_order_relaxed);
    atomic_fetch_add_explicit(&s->offloading, 1, memory_order_relaxed);
    atomic_fetch_add_explicit(&s->offload_bytes, o->size, memory_order_relaxed);
    s->tier.offload(s->tier.arg, o);
    return true;
}

/*
 * store_ext_cap: extents an object's block makes room for. With a tier, a
 * little over the fewest the page count can take, so that a load back into
 * a fragmented arena fits in the same block.
 */
int
store_ext_cap(const struct store *s, uint64_t npages, int n)
{
    int want = n;

    if (s->has_tier) {
        want = __builtin_popcountll(npages) + 2;
        if (want > STORE_MAX_EXTENTS) {
            want = STORE_MAX_EXTENTS;
        }
    }
    return want > n ? want : n;
}

/* ---- write path ---- */

int
store_reserve(struct store *s, const struct kv_key *key, uint64_t size, struct store_obj **out)
{
    struct alloc_extent ext[STORE_MAX_EXTENTS];
    struct store_shard *sh;
    struct store_obj *o;
    struct store_obj *other;
    uint64_t hash;
    size_t bytes;
    int n = 0;
    int cap;
    int rc;

    if (s == NULL || key == NULL || out == NULL || (key->len != 0 && key->ptr == NULL)) {
        return KV_INVALID_ARGUMENT;
    }
    *out = NULL;
    if (key->len > atomic_load_explicit(&s->max_key_size, memory_order_relaxed)
        || size > atomic_load_explicit(&s->max_value_size, memory_order_relaxed)) {
        return KV_TOO_LARGE;
    }
    hash = store_hash64(key);
    sh = store_shard_of(s, hash);

    /* Refuse a taken key before evicting anything for it. */
    rc = 0;
    pthread_mutex_lock(&sh->lock);
    other = store_find_locked(sh, hash, key);
    if (other != NULL) {
        rc = other->state == STORE_OBJ_PUBLISHED ? KV_EXISTS : KV_BUSY;
    }
    pthread_mutex_unlock(&sh->lock);
    if (rc != 0) {
        return rc;
    }

    if (size > s->capacity_pages * STORE_PAGE_SIZE) {
        rc = KV_NO_SPACE;
        goto fail_count;
    }
    rc = store_quota_room(s, key->tenant, store_pages(size) * STORE_PAGE_SIZE);
    if (rc != 0) {
        return rc;
    }
    store_graves_sweep(s);
    rc = store_take_pages(s, store_pages(size), ext, STORE_MAX_EXTENTS, &n);
    if (rc != 0) {
        goto fail_count;
    }
    cap = store_ext_cap(s, store_pages(size), n);
    bytes = sizeof(*o) + (size_t)cap * sizeof(ext[0]) + key->len;
    o = malloc(bytes);
    if (o == NULL) {
        rc = -ENOMEM;
        goto fail_pages;
    }
    o->hnext = NULL;
    o->lru_prev = NULL;
    o->lru_next = NULL;
    o->base = s->base;
    o->hash = hash;
    o->size = size;
    o->atime = 0;
    o->lease_until = 0;
    atomic_init(&o->refs, 2);       /* the table's and the writer's */
    o->tenant = key->tenant;
    o->key_len = key->len;
    o->state = STORE_OBJ_RESERVED;
    o->pin = STORE_PIN_NONE;
    o->n_ext = (uint8_t)n;
    o->ext_cap = (uint8_t)cap;
    o->referenced = 0;
    o->resident = 1;
    o->loading = 0;
    o->tlink = NULL;
    o->cold = 0;
    o->seg = 0;
    o->cache = 0;
    atomic_init(&o->must_write, 0);
    atomic_init(&o->vcrc, 0);
    atomic_init(&o->ssd, STORE_SSD_NONE);
    memset(&o->loc, 0, sizeof(o->loc));
    memcpy(o->ext, ext, (size_t)n * sizeof(ext[0]));
    if (key->len != 0) {
        memcpy((uint8_t *)(o->ext + cap), key->ptr, key->len);
    }

    pthread_mutex_lock(&sh->lock);
    other = store_find_locked(sh, hash, key);
    if (other != NULL) {
        /* Another writer got here while we were allocating. */
        rc = other->state == STORE_OBJ_PUBLISHED ? KV_EXISTS : KV_BUSY;
        pthread_mutex_unlock(&sh->lock);
        free(o);
        goto fail_pages;
    }
    store_index_locked(s, sh, o);
    sh->reserved++;
    pthread_mutex_unlock(&sh->lock);
    store_charge(s, key->tenant, (int64_t)store_ext_pages(ext, n));
    atomic_fetch_add_explicit(&s->metadata_bytes, bytes, memory_order_relaxed);
    *out = o;
    return 0;

fail_pages:
    alloc_give(s->alloc, ext, n);
    return rc;
fail_count:
    atomic_fetch_add_explicit(&s->no_space, rc == KV_NO_SPACE, memory_order_relaxed);
    return rc;
}

int
store_commit(struct store *s, struct store_obj *o)
{
    struct store_shard *sh;

    if (s == NULL || o == NULL) {
        return KV_INVALID_ARGUMENT;
    }
    sh = store_shard_of(s, o->hash);
    pthread_mutex_lock(&sh->lock);
    if (o->state != STORE_OBJ_RESERVED) {
        pthread_mutex_unlock(&sh->lock);
        return KV_INVALID_ARGUMENT;
    }
    o->state = STORE_OBJ_PUBLISHED;
    o->atime = clock_coarse_ms();
    store_list_push_head(&sh->lru[STORE_LRU_NORMAL], o);
    sh->reserved--;
    sh->objects++;
    sh->value_bytes += o->size;
    sh->resident++;
    sh->resident_bytes += o->size;
    if (s->has_tier && atomic_load_explicit(&s->write_through, memory_order_relaxed)) {
        store_queue_locked(s, o);
    }
    /* The writer's reference; the table still holds one, so this never frees. */
    atomic_fetch_sub_explicit(&o->refs, 1, memory_order_release);
    pthread_mutex_unlock(&sh->lock);
    return 0;
}

void
store_abort(struct store *s, struct store_obj *o)
{
    struct store_shard *sh;
    int detached = 0;

    if (s == NULL || o == NULL) {
        return;
    }
    sh = store_shard_of(s, o->hash);
    pthread_mutex_lock(&sh->lock);
    if (o->state == STORE_OBJ_RESERVED) {
        store_detach_locked(s, sh, o);
        detached = 1;
    }
    pthread_mutex_unlock(&sh->lock);
    /* The writer's reference, and the table's if it was still indexed. */
    store_obj_put(s, o, detached ? 2 : 1);
}

/*
 * store_reserve_copy: store_put's and store_put_cache's reserved object
 * holding the LEN bytes at DATA; the caller commits it.
 */
static int
store_reserve_copy(struct store *s, const struct kv_key *key, const void *data, uint64_t len,
                   struct store_obj **out)
{
    int rc;

    if (len != 0 && data == NULL) {
        return KV_INVALID_ARGUMENT;
    }
    rc = store_reserve(s, key, len, out);
    if (rc != 0) {
        return rc;
    }
    if (len != 0) {
        store_obj_write(*out, 0, data, len);
    }
    return 0;
}

int
store_put(struct store *s, const struct kv_key *key, const void *data, uint64_t len)
{
    struct store_obj *o;
    int rc = store_reserve_copy(s, key, data, len, &o);

    if (rc != 0) {
        return rc;
    }
    return store_commit(s, o);
}

/* store_mark_cache: o (reserved by this writer) is a cluster cache copy. */
static void
store_mark_cache(struct store *s, struct store_obj *o)
{
    struct store_shard *sh = store_shard_of(s, o->hash);

    atomic_store_explicit(&s->has_cache, true, memory_order_relaxed);
    pthread_mutex_lock(&sh->lock);
    o->cache = 1;
    pthread_mutex_unlock(&sh->lock);
}

int
store_put_cache(struct store *s, const struct kv_key *key, const void *data, uint64_t len)
{
    struct store_obj *o;
    int rc = store_reserve_copy(s, key, data, len, &o);

    if (rc != 0) {
        return rc;
    }
    store_mark_cache(s, o);
    return store_commit(s, o);
}

/* Checksum and copy this much at a time: well inside L2, so the copy reads cached bytes. */
#define STORE_CRC_CHUNK (64u * 1024u)

int
store_put_crc(struct store *s, const struct kv_key *key, const void *data, uint64_t len,
              uint32_t crc, bool cache)
{
    const uint8_t *src = data;
    struct store_obj *o;
    uint32_t got = 0;
    int rc;

    if (len != 0 && data == NULL) {
        return KV_INVALID_ARGUMENT;
    }
    rc = store_reserve(s, key, len, &o);
    if (rc != 0) {
        return rc;
    }
    for (uint64_t off = 0; off < len; off += STORE_CRC_CHUNK) {
        uint64_t n = len - off < STORE_CRC_CHUNK ? len - off : STORE_CRC_CHUNK;

        got = crc32c_extend(got, src + off, (size_t)n);
        store_obj_write(o, off, src + off, n);
    }
    if (got != crc) {
        store_abort(s, o);
        return KV_CHECKSUM_MISMATCH;
    }
    atomic_store_explicit(&o->vcrc, STORE_VCRC_KNOWN | crc, memory_order_release);
    if (cache) {
        store_mark_cache(s, o);
    }
    return store_commit(s, o);
}

int
store_commit_crc(struct store *s, struct store_obj *o, uint32_t crc, bool cache)
{
    atomic_store_explicit(&o->vcrc, STORE_VCRC_KNOWN | crc, memory_order_release);
    if (cache) {
        store_mark_cache(s, o);
    }
    return store_commit(s, o);
}

int
store_set_cache(struct store *s, const struct kv_key *key, bool cache)
{
    uint64_t hash = store_hash64(key);
    struct store_shard *sh = store_shard_of(s, hash);
    struct store_obj *o;
    int rc = KV_NOT_FOUND;

    pthread_mutex_lock(&sh->lock);
    o = store_find_locked(sh, hash, key);
    if (o != NULL && o->state == STORE_OBJ_PUBLISHED) {
        if (cache) {
            atomic_store_explicit(&s->has_cache, true, memory_order_relaxed);
        }
        o->cache = cache ? 1 : 0;
        rc = 0;
    }
    pthread_mutex_unlock(&sh->lock);
    return rc;
}

static uint64_t
store_walk_chain(struct store_obj *o, store_walk_fn *fn, void *arg)
{
    uint64_t n = 0;

    for (; o != NULL; o = o->hnext) {
        struct kv_key key = {.tenant = o->tenant, .len = o->key_len};

        if (o->state != STORE_OBJ_PUBLISHED) {
            continue;
        }
        key.ptr = store_obj_kptr(o);
        fn(arg, &key, o->size, o->cache != 0);
        n++;
    }
    return n;
}

uint64_t
store_walk_shard(struct store *s, unsigned shard, store_walk_fn *fn, void *arg)
{
    _Static_assert(STORE_WALK_PARTS == STORE_SHARDS, "a walk's part is a shard");
    struct store_shard *sh;
    uint64_t n = 0;

    if (shard >= STORE_SHARDS) {
        return 0;
    }
    sh = &s->shard[shard];
    pthread_mutex_lock(&sh->lock);
    for (uint64_t b = 0; b <= sh->mask; b++) {
        n += store_walk_chain(sh->buckets[b], fn, arg);
    }
    /* while growing, old buckets from rehash_pos on have not moved yet */
    for (uint64_t b = sh->rehash_pos; sh->old != NULL && b <= sh->old_mask; b++) {
        n += store_walk_chain(sh->old[b], fn, arg);
    }
    pthread_mutex_unlock(&sh->lock);
    return n;
}

/* ---- objects ---- */

void
store_obj_ref(struct store_obj *o)
{
    if (atomic_fetch_add_explicit(&o->refs, 1, memory_order_relaxed) == 0) {
        fprintf(stderr, "store_obj_ref: object %p has no reference left\n", (void *)o);
        abort();
    }
}

void
store_obj_unref(struct store *s, struct store_obj *o)
{
    if (o != NULL) {
        store_obj_put(s, o, 1);
    }
}

uint32_t
store_obj_crc(struct store_obj *o)
{
    uint64_t v = atomic_load_explicit(&o->vcrc, memory_order_acquire);
    struct iovec iov[STORE_MAX_EXTENTS];
    uint32_t crc = 0;
    int n;

    if (v & STORE_VCRC_KNOWN) {
        return (uint32_t)v;
    }
    /* Two threads may both compute it the first time: same bytes, same answer. */
    n = store_obj_iov(o, iov, STORE_MAX_EXTENTS);
    for (int i = 0; i < n; i++) {
        crc = crc32c_extend(crc, iov[i].iov_base, iov[i].iov_len);
    }
    atomic_store_explicit(&o->vcrc, STORE_VCRC_KNOWN | crc, memory_order_release);
    return crc;
}

void
store_obj_set_crc(struct store_obj *o, uint32_t crc)
{
    atomic_store_explicit(&o->vcrc, STORE_VCRC_KNOWN | crc, memory_order_release);
}

uint64_t
store_obj_size(const struct store_obj *o)
{
    return o->size;
}

int
store_obj_iov(const struct store_obj *o, struct iovec *iov, int max)
{
    uint64_t left = o->size;

    if (o->size == 0) {
        return 0;
    }
    if (max < o->n_ext) {
        return -EINVAL;
    }
    for (int i = 0; i < o->n_ext; i++) {
        uint64_t len = alloc_extent_bytes(&o->ext[i]);

        iov[i].iov_base = alloc_extent_ptr(o->base, &o->ext[i]);
        iov[i].iov_len = len < left ? len : left;
        left -= iov[i].iov_len;
    }
    return o->n_ext;
}

/* store_obj_seek: the extent holding value offset off (< size), and the offset inside it. */
static int
store_obj_seek(const struct store_obj *o, uint64_t off, uint64_t *at)
{
    int i = 0;

    while (off >= alloc_extent_bytes(&o->ext[i])) {
        off -= alloc_extent_bytes(&o->ext[i]);
        i++;
    }
    *at = off;
    return i;
}

/* Copy between a value (from offset off) and a flat buffer, in whichever direction. */
static uint64_t
store_obj_copy(const struct store_obj *o, uint64_t off, uint8_t *buf, uint64_t len, bool into)
{
    uint64_t done = 0;
    uint64_t at;

    if (off >= o->size) {
        return 0;
    }
    if (len > o->size - off) {
        len = o->size - off;
    }
    for (int i = store_obj_seek(o, off, &at); done < len; i++, at = 0) {
        uint64_t chunk = alloc_extent_bytes(&o->ext[i]) - at;
        uint8_t *ext = (uint8_t *)alloc_extent_ptr(o->base, &o->ext[i]) + at;

        if (chunk > len - done) {
            chunk = len - done;
        }
        if (into) {
            memcpy(ext, buf + done, chunk);
        } else {
            memcpy(buf + done, ext, chunk);
        }
        done += chunk;
    }
    return done;
}

uint64_t
store_obj_read(const struct store_obj *o, uint64_t off, void *dst, uint64_t len)
{
    return store_obj_copy(o, off, dst, len, false);
}

uint64_t
store_obj_write(struct store_obj *o, uint64_t off, const void *src, uint64_t len)
{
    return store_obj_copy(o, off, (uint8_t *)src, len, true);
}

/* ---- read path ---- */

int
store_get(struct store *s, const struct kv_key *key, struct store_obj **out)
{
    uint64_t hash = store_hash64(key);
    struct store_shard *sh = store_shard_of(s, hash);
    struct store_obj *o;

    *out = NULL;
    pthread_mutex_lock(&sh->lock);
    o = store_find_locked(sh, hash, key);
    if (o == NULL || o->state != STORE_OBJ_PUBLISHED) {
        pthread_mutex_unlock(&sh->lock);
        return KV_NOT_FOUND;
    }
    store_touch_locked(s, o);
    if (!o->resident) {
        if (s->has_tier) {
            store_load_start_locked(s, sh, o);
        }
        pthread_mutex_unlock(&sh->lock);
        return s->has_tier ? -EAGAIN : KV_NOT_FOUND;
    }
    atomic_fetch_add_explicit(&o->refs, 1, memory_order_relaxed);
    if (s->has_tier && s->tier.touch != NULL
        && atomic_load_explicit(&o->ssd, memory_order_relaxed) == STORE_SSD_STORED) {
        s->tier.touch(s->tier.arg, o->loc.bucket);     /* lru buckets count DRAM hits too */
    }
    pthread_mutex_unlock(&sh->lock);
    *out = o;
    return 0;
}

int
store_exists(struct store *s, const struct kv_key *key)
{
    uint64_t hash = store_hash64(key);
    struct store_shard *sh = store_shard_of(s, hash);
    struct store_obj *o;
    int found;

    pthread_mutex_lock(&sh->lock);
    o = store_find_locked(sh, hash, key);
    found = o != NULL && o->state == STORE_OBJ_PUBLISHED;
    if (found) {
        store_touch_locked(s, o);
    }
    pthread_mutex_unlock(&sh->lock);
    return found;
}

void
store_exists_batch(struct store *s, const struct kv_key *keys, size_t n, uint8_t *out)
{
    enum { BLOCK = 16 };
    uint64_t hash[BLOCK];

    for (size_t base = 0; base < n; base += BLOCK) {
        size_t m = n - base < BLOCK ? n - base : BLOCK;

        /* Start every bucket's cache miss before waiting on the first one. */
        for (size_t i = 0; i < m; i++) {
            struct store_shard *sh;
            uintptr_t b;

            hash[i] = store_hash64(&keys[base + i]);
            sh = store_shard_of(s, hash[i]);
            b = atomic_load_explicit(&sh->pf_buckets, memory_order_relaxed);
            __builtin_prefetch((const void *)(b + (hash[i] & atomic_load_explicit(
                                                  &sh->pf_mask, memory_order_relaxed)) *
                                                      sizeof(struct store_obj *)));
        }
        for (size_t i = 0; i < m; i++) {
            struct store_shard *sh = store_shard_of(s, hash[i]);
            struct store_obj *o;

            pthread_mutex_lock(&sh->lock);
            o = store_find_locked(sh, hash[i], &keys[base + i]);
            out[base + i] = o != NULL && o->state == STORE_OBJ_PUBLISHED;
            if (out[base + i]) {
                store_touch_locked(s, o);
            }
            pthread_mutex_unlock(&sh->lock);
        }
    }
}

int
store_size(struct store *s, const struct kv_key *key, uint64_t *size)
{
    uint64_t hash = store_hash64(key);
    struct store_shard *sh = store_shard_of(s, hash);
    struct store_obj *o;
    int rc = KV_NOT_FOUND;

    pthread_mutex_lock(&sh->lock);
    o = store_find_locked(sh, hash, key);
    if (o != NULL && o->state == STORE_OBJ_PUBLISHED) {
        store_touch_locked(s, o);
        *size = o->size;
        rc = 0;
    }
    pthread_mutex_unlock(&sh->lock);
    return rc;
}

/* ---- removal and pinning ---- */

/* store_forget: tell the tier that o, just unindexed by remove, lost its SSD copy too. */
static void
store_forget(struct store *s, struct store_obj *o)
{
    struct kv_key key;

    if (s->has_tier && atomic_load_explicit(&o->ssd, memory_order_acquire) == STORE_SSD_STORED) {
        store_obj_key(o, &key);
        store_ssd_charge(s, o->tenant, -(int64_t)o->size);
        s->tier.forget(s->tier.arg, &key, &o->loc, o->size);
    }
}

/*
 * store_retire: drop the table's reference on o, which remove just took out
 * of the table. While a lease holds (a client may read its pages in place,
 * see store_lease) the reference goes to the graveyard instead, and
 * store_graves_sweep drops it once the lease ends.
 */
static void
store_retire(struct store *s, struct store_obj *o, uint64_t now)
{
    if (o->lease_until <= now || !o->resident) {
        store_obj_unref(s, o);
        return;
    }
    pthread_mutex_lock(&s->grave_lock);
    o->hnext = s->graves;
    s->graves = o;
    atomic_fetch_add_explicit(&s->ngraves, 1, memory_order_relaxed);
    pthread_mutex_unlock(&s->grave_lock);
}

/* store_graves_sweep: let go of the retired objects whose lease has ended. */
static void
store_graves_sweep(struct store *s)
{
    uint64_t now = clock_coarse_ms();
    struct store_obj *done = NULL;

    if (atomic_load_explicit(&s->ngraves, memory_order_relaxed) == 0) {
        return;
    }
    pthread_mutex_lock(&s->grave_lock);
    for (struct store_obj **pp = &s->graves; *pp != NULL;) {
        struct store_obj *o = *pp;

        if (o->lease_until > now) {
            pp = &o->hnext;
            continue;
        }
        *pp = o->hnext;
        o->hnext = done;
        done = o;
        atomic_fetch_sub_explicit(&s->ngraves, 1, memory_order_relaxed);
    }
    pthread_mutex_unlock(&s->grave_lock);
    while (done != NULL) {
        struct store_obj *o = done;

        done = o->hnext;
        store_obj_unref(s, o);
    }
}

/*
 * store_removable_locked: 0 when remove may take a published object, else
 * KV_BUSY. The tier's own reference (an offload queued, a load running) does
 * not count: the tier finds the object gone and drops what it wrote or read.
 */
static int
store_removable_locked(const struct store_obj *o, bool force, uint64_t now)
{
    uint32_t tier_refs = (atomic_load_explicit(&o->ssd, memory_order_relaxed) == STORE_SSD_QUEUED)
                         + o->loading;

    if (o->state != STORE_OBJ_PUBLISHED
        || atomic_load_explicit(&o->refs, memory_order_acquire) > 1 + tier_refs
        || (!force && o->lease_until > now)) {
        return KV_BUSY;
    }
    return 0;
}

int
store_remove(struct store *s, const struct kv_key *key, bool force)
{
    uint64_t hash = store_hash64(key);
    struct store_shard *sh = store_shard_of(s, hash);
    struct store_obj *o;
    int rc;

    pthread_mutex_lock(&sh->lock);
    o = store_find_locked(sh, hash, key);
    if (o == NULL) {
        pthread_mutex_unlock(&sh->lock);
        return KV_NOT_FOUND;
    }
    rc = store_removable_locked(o, force, clock_coarse_ms());
    if (rc == 0) {
        store_detach_locked(s, sh, o);
    }
    pthread_mutex_unlock(&sh->lock);
    if (rc == 0) {
        store_forget(s, o);
        store_retire(s, o, clock_coarse_ms());
    }
    return rc;
}

uint64_t
store_remove_all(struct store *s, uint32_t tenant, bool all_tenants, bool force)
{
    uint64_t now = clock_coarse_ms();
    uint64_t count = 0;

    store_graves_sweep(s);      /* earlier forced removes whose leases have ended */
    for (unsigned i = 0; i < STORE_SHARDS; i++) {
        struct store_shard *sh = &s->shard[i];
        struct store_obj *gone = NULL;

        pthread_mutex_lock(&sh->lock);
        store_rehash_step_locked(s, sh, UINT64_MAX);    /* it walks every bucket anyway */
        for (uint64_t b = 0; b <= sh->mask; b++) {
            struct store_obj **pp = &sh->buckets[b];

            while (*pp != NULL) {
                struct store_obj *o = *pp;

                if ((!all_tenants && o->tenant != tenant)
                    || store_removable_locked(o, force, now) != 0) {
                    pp = &o->hnext;
                    continue;
                }
                *pp = o->hnext;
                sh->count--;
                store_forget_locked(sh, o);
                o->hnext = gone;
                gone = o;
                count++;
            }
        }
        pthread_mutex_unlock(&sh->lock);
        while (gone != NULL) {
            struct store_obj *o = gone;

            gone = o->hnext;
            store_forget(s, o);
            store_retire(s, o, now);
        }
    }
    return count;
}

void
store_tenant_usage(struct store *s, uint32_t tenant, uint64_t *objects, uint64_t *bytes)
{
    struct store_quota *q = store_quota_of(s, tenant);
    uint64_t now = clock_coarse_ms();
    uint64_t pages, stored;

    if (q != NULL) {
        uint64_t at = atomic_load_explicit(&q->usage_ms, memory_order_acquire);

        if (at != 0 && now + 1 - at < STORE_USAGE_CACHE_MS) {
            *objects = atomic_load_explicit(&q->usage_objects, memory_order_relaxed);
            *bytes = atomic_load_explicit(&q->usage_bytes, memory_order_relaxed);
            return;
        }
    }
    store_tenant_usage_pages(s, tenant, objects, bytes, &pages, &stored);
    if (q != NULL) {
        atomic_store_explicit(&q->usage_objects, *objects, memory_order_relaxed);
        atomic_store_explicit(&q->usage_bytes, *bytes, memory_order_relaxed);
        atomic_store_explicit(&q->usage_ms, now + 1, memory_order_release);
    }
}

static void
store_tenant_usage_pages(struct store *s, uint32_t tenant, uint64_t *objects, uint64_t *bytes,
                         uint64_t *pages, uint64_t *stored)
{
    *objects = 0;
    *bytes = 0;
    *pages = 0;
    *stored = 0;
    for (unsigned i = 0; i < STORE_SHARDS; i++) {
        struct store_shard *sh = &s->shard[i];

        pthread_mutex_lock(&sh->lock);
        store_rehash_step_locked(s, sh, UINT64_MAX);    /* it walks every bucket anyway */
        for (uint64_t b = 0; b <= sh->mask; b++) {
            for (const struct store_obj *o = sh->buckets[b]; o != NULL; o = o->hnext) {
                if (o->tenant == tenant && o->state == STORE_OBJ_PUBLISHED) {
                    (*objects)++;
                    *bytes += o->size;
                }
                if (o->tenant == tenant) {
                    *pages += store_ext_pages(o->ext, o->n_ext);
                    if (atomic_load_explicit(&o->ssd, memory_order_relaxed) == STORE_SSD_STORED) {
                        *stored += o->size;
                    }
                }
            }
        }
        pthread_mutex_unlock(&sh->lock);
    }
}

int
store_pin(struct store *s, const struct kv_key *key, enum store_pin mode)
{
    uint64_t hash = store_hash64(key);
    struct store_shard *sh = store_shard_of(s, hash);
    struct store_list *l;
    struct store_obj *o;

    if (mode != STORE_PIN_NONE && mode != STORE_PIN_SOFT && mode != STORE_PIN_HARD) {
        return KV_INVALID_ARGUMENT;
    }
    pthread_mutex_lock(&sh->lock);
    o = store_find_locked(sh, hash, key);
    if (o == NULL || o->state != STORE_OBJ_PUBLISHED) {
        pthread_mutex_unlock(&sh->lock);
        return KV_NOT_FOUND;
    }
    if (o->pin != (uint8_t)mode) {
        l = store_list_of(sh, o);
        if (l != NULL) {
            store_list_unlink(l, o);
        }
        sh->protected_objs -= o->seg;   /* back in probation when unpinned */
        o->seg = 0;
        sh->pinned_hard -= o->pin == STORE_PIN_HARD;
        sh->pinned_soft -= o->pin == STORE_PIN_SOFT;
        o->pin = (uint8_t)mode;
        sh->pinned_hard += o->pin == STORE_PIN_HARD;
        sh->pinned_soft += o->pin == STORE_PIN_SOFT;
        l = store_list_of(sh, o);
        if (l != NULL) {
            store_list_push_head(l, o);
        }
    }
    pthread_mutex_unlock(&sh->lock);
    return 0;
}

int
store_arena(const struct store *s, uint8_t **base, uint64_t *size)
{
    *base = s->base;
    *size = s->capacity_pages * STORE_PAGE_SIZE;
    return alloc_fd(s->alloc);
}

int
store_arena_backing(const struct store *s, const char **why)
{
    return (int)alloc_backing(s->alloc, why);
}

int
store_lease(struct store *s, const struct kv_key *key, uint32_t ttl_ms, uint64_t *size)
{
    uint64_t hash = store_hash64(key);
    struct store_shard *sh = store_shard_of(s, hash);
    struct store_obj *o;
    int rc = KV_NOT_FOUND;

    pthread_mutex_lock(&sh->lock);
    o = store_find_locked(sh, hash, key);
    if (o != NULL && o->state == STORE_OBJ_PUBLISHED) {
        uint64_t until = clock_coarse_ms() + ttl_ms;

        if (until > o->lease_until) {
            o->lease_until = until;
        }
        if (size != NULL) {
            *size = o->size;
        }
        rc = 0;
    }
    pthread_mutex_unlock(&sh->lock);
    return rc;
}

/* ---- accounting ---- */

void
store_stats(struct store *s, struct store_stats *out)
{
    memset(out, 0, sizeof(*out));
    for (unsigned i = 0; i < STORE_SHARDS; i++) {
        struct store_shard *sh = &s->shard[i];

        pthread_mutex_lock(&sh->lock);
        out->objects += sh->objects;
        out->reserved += sh->reserved;
        out->value_bytes += sh->value_bytes;
        out->pinned_hard += sh->pinned_hard;
        out->pinned_soft += sh->pinned_soft;
        out->resident += sh->resident;
        out->resident_bytes += sh->resident_bytes;
        out->stored += sh->stored;
        out->loading += sh->loading;
        pthread_mutex_unlock(&sh->lock);
    }
    out->memory_used = alloc_used_pages(s->alloc) * STORE_PAGE_SIZE;
    out->memory_capacity = s->capacity_pages * STORE_PAGE_SIZE;
    out->evictions = atomic_load_explicit(&s->evictions, memory_order_relaxed);
    out->evicted_bytes = atomic_load_explicit(&s->evicted_bytes, memory_order_relaxed);
    out->no_space = atomic_load_explicit(&s->no_space, memory_order_relaxed);
    out->metadata_bytes = atomic_load_explicit(&s->metadata_bytes, memory_order_relaxed);
    out->memory_prefaulted = alloc_prefaulted(s->alloc);
    out->memory_prefault_done = alloc_prefault_done(s->alloc);
    out->memory_hugepages = (uint64_t)alloc_backing(s->alloc, NULL);
    out->memory_file_reused = alloc_file_reused(s->alloc, &out->memory_file_resident);
    out->offloading = atomic_load_explicit(&s->offloading, memory_order_relaxed);
    out->offload_bytes = atomic_load_explicit(&s->offload_bytes, memory_order_relaxed);
    out->offload_dropped = atomic_load_explicit(&s->offload_dropped, memory_order_relaxed);
    out->quota_exceeded = atomic_load_explicit(&s->quota_exceeded, memory_order_relaxed);
    out->evictions_inline = atomic_load_explicit(&s->evictions_inline, memory_order_relaxed);
}
