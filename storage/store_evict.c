/*
 * store_evict: making room in the arena for the store (store_evict in
 * store.h, and for reserves and loads store_take_pages and store_quota_room
 * in store_int.h). It owns the eviction policy: which objects may lose their
 * pages (no holder but the table, no lease running, not the objects of a
 * tenant within its DRAM quota, and in on-evict mode only once written to
 * the SSD), which one goes next (store.h's policies: LRU, the oldest access
 * stamp across the shards' list tails, referenced objects getting a second
 * chance; FIFO, no second chances and stamps that accesses leave alone;
 * SLRU, second chances that move an object from the probationary list to
 * the protected one; soft-pinned objects only when no normal one can go),
 * the watermarks a reserve or the background evictor thread evicts between,
 * and a tenant's eviction of its own objects past its quota. The lists, the
 * table and recency stamps are store.c's (see the top of that file): this
 * file changes them only through store.c's list and table functions, under
 * one shard lock at a time, drops a last reference only after unlocking, never
 * waits (an object that must reach the SSD first is queued and the caller
 * told -EAGAIN), and calls the tier only to queue.
 */
#include "store_int.h"
#include "clock.h"

#include "alloc.h"
#include "kverr.h"

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>

/* ---- eviction ---- */

/*
 * store_quota_guarded: o's tenant has a quota it is within: eviction for
 * others must not take it below (its own puts stop at the quota instead).
 */
static bool
store_quota_guarded(struct store *s, const struct store_obj *o)
{
    const struct store_quota *q = store_quota_of(s, o->tenant);
    uint64_t limit = q != NULL ? atomic_load_explicit(&q->limit, memory_order_relaxed) : 0;

    return limit != 0 && atomic_load_explicit(&q->used, memory_order_relaxed) <= limit;
}

int
store_evictable_locked(const struct store_obj *o, uint64_t now)
{
    /* acquire: a reader's last accesses to the value happen before we reuse its pages. */
    return atomic_load_explicit(&o->refs, memory_order_acquire) == 1 && o->lease_until <= now;
}

/*
 * store_must_offload_locked: an evictable object whose pages cannot be
 * reused yet because, in on-evict mode, it has to reach the SSD first.
 */
static int
store_must_offload_locked(struct store *s, const struct store_obj *o)
{
    return s->has_tier && atomic_load_explicit(&s->on_evict, memory_order_relaxed)
           && !atomic_load_explicit(&s->degraded, memory_order_relaxed)
           && atomic_load_explicit(&o->ssd, memory_order_relaxed) == STORE_SSD_NONE
           && !store_ssd_over_quota(s, o)      /* never fits its SSD share: dropped instead */
           && !store_offload_full(s);          /* the disk is behind: dropped, counted */
}

/* store_protect_locked: move o (evictable, on the NORMAL list) to the PROTECTED one (SLRU). */
static void
store_protect_locked(struct store_shard *sh, struct store_obj *o)
{
    store_list_unlink(&sh->lru[STORE_LRU_NORMAL], o);
    o->seg = 1;
    sh->protected_objs++;
    store_list_push_head(&sh->lru[STORE_LRU_PROTECTED], o);
}

/*
 * store_slru_balance_locked: keep the protected list within its share of the
 * shard's resident objects (STORE_SLRU_PROTECTED_PCT under SLRU, none under
 * the other policies, so a list SLRU left drains after a reload): its tail
 * goes back to the probationary head (stamped now, so that it is ranked
 * across shards by its new term), unless it was accessed since it reached
 * the protected head (a second chance there). Bounded: at most
 * STORE_SLRU_STEPS moves per call.
 */
static void
store_slru_balance_locked(struct store_shard *sh, int policy, uint64_t now)
{
    struct store_list *p = &sh->lru[STORE_LRU_PROTECTED];
    uint64_t cap = policy == STORE_EVICT_SLRU ? sh->resident * STORE_SLRU_PROTECTED_PCT / 100 : 0;

    for (int steps = 0; sh->protected_objs > cap && p->tail != NULL && steps < STORE_SLRU_STEPS;
         steps++) {
        struct store_obj *o = p->tail;

        store_list_unlink(p, o);
        if (o->referenced && policy == STORE_EVICT_SLRU) {
            o->referenced = 0;
            store_list_push_head(p, o);
            continue;
        }
        o->seg = 0;
        sh->protected_objs--;
        if (policy == STORE_EVICT_SLRU) {
            o->atime = now;     /* a new probationary term: ranked as if just stored */
        }
        store_list_push_head(&sh->lru[STORE_LRU_NORMAL], o);
    }
}

/*
 * store_cache_first_locked: o is a list's candidate; when it is owned, a cluster cache copy
 * among the STORE_CACHE_SCAN objects after it (toward the head) that may go is taken instead,
 * so copies of keys other nodes own leave before owned objects.
 */
static struct store_obj *
store_cache_first_locked(struct store *s, struct store_obj *o, uint64_t now)
{
    struct store_obj *c = o->lru_prev;

    if (o->cache || !atomic_load_explicit(&s->has_cache, memory_order_relaxed)) {
        return o;
    }
    for (int seen = 0; c != NULL && seen < STORE_CACHE_SCAN; seen++, c = c->lru_prev) {
        if (c->cache && store_evictable_locked(c, now) && !store_quota_guarded(s, c)
            && !store_must_offload_locked(s, c)) {
            return c;
        }
    }
    return o;
}

/*
 * store_list_candidate_locked: the next object eviction should take from
 * list l, or NULL. From the tail up, a referenced object gets its second
 * chance (to the head, mark cleared; under SLRU from the probationary list
 * to the protected head instead; under FIFO none: the mark is ignored) and
 * a busy one (read in flight, leased) goes to the head untouched, so later
 * looks start past it. An object on its way to the SSD (queued, and in
 * on-evict mode queued here) stays where it is: it is old and may go as
 * soon as it is written, so the look only steps past it. Bounded: after
 * STORE_EVICT_SCAN busy objects the look gives up, and after
 * STORE_EVICT_PROMOTE second chances (a list that is all hot) the next
 * evictable object is taken, referenced or not.
 */
static struct store_obj *
store_list_candidate_locked(struct store *s, struct store_shard *sh, struct store_list *l,
                            int policy, uint64_t now)
{
    struct store_obj *o = l->tail;
    bool protect = policy == STORE_EVICT_SLRU && l == &sh->lru[STORE_LRU_NORMAL];
    int busy = 0;
    int promoted = 0;

    while (o != NULL) {
        struct store_obj *prev = o->lru_prev;
        int evictable = store_evictable_locked(o, now) && !store_quota_guarded(s, o);

        if (evictable && store_must_offload_locked(s, o)) {
            store_queue_locked(s, o);   /* written first, freed by a later look */
            evictable = 0;
        }
        if (!evictable
            && atomic_load_explicit(&o->ssd, memory_order_relaxed) == STORE_SSD_QUEUED) {
            if (++busy > STORE_EVICT_SCAN) {
                return NULL;
            }
            o = prev;
            continue;
        }
        if (evictable) {
            if (policy == STORE_EVICT_FIFO) {
                o->referenced = 0;
            }
            if (!o->referenced || promoted == STORE_EVICT_PROMOTE) {
                return store_cache_first_locked(s, o, now);
            }
            o->referenced = 0;
            promoted++;
            if (protect) {
                store_protect_locked(sh, o);
                o = prev;
                continue;
            }
        } else if (++busy > STORE_EVICT_SCAN) {
            return NULL;
        }
        if (o == l->head) {
            /* Nothing left to move past. */
            return o->referenced || !evictable ? NULL : o;
        }
        store_list_unlink(l, o);
        store_list_push_head(l, o);
        o = prev;
    }
    return NULL;
}

/*
 * store_candidate_locked: the next object eviction should take from a list
 * class (STORE_LRU_NORMAL: the probationary list, then the protected one
 * when probation has none; STORE_LRU_SOFT), or NULL.
 */
static struct store_obj *
store_candidate_locked(struct store *s, struct store_shard *sh, int cls, uint64_t now)
{
    int policy = atomic_load_explicit(&s->policy, memory_order_relaxed);
    struct store_obj *c;

    if (cls != STORE_LRU_NORMAL) {
        return store_list_candidate_locked(s, sh, &sh->lru[cls], policy, now);
    }
    store_slru_balance_locked(sh, policy, now);
    c = store_list_candidate_locked(s, sh, &sh->lru[STORE_LRU_NORMAL], policy, now);
    if (c == NULL && sh->lru[STORE_LRU_PROTECTED].tail != NULL) {
        c = store_list_candidate_locked(s, sh, &sh->lru[STORE_LRU_PROTECTED], policy, now);
    }
    return c;
}

/*
 * store_evict_rank: where a candidate stands in the cross-shard choice (lower
 * goes first): its access stamp, less STORE_CACHE_HANDICAP_MS for a cluster
 * cache copy (copies of keys this node does not own go before owned objects
 * used up to ten minutes earlier), and a protected one (SLRU, taken only when
 * its shard's probation had none) after every probationary one of the other
 * shards. NULL (no candidate): STORE_NO_CANDIDATE.
 */
static uint64_t
store_evict_rank(const struct store_obj *o)
{
    uint64_t t;

    if (o == NULL) {
        return STORE_NO_CANDIDATE;
    }
    t = o->atime;
    if (o->cache) {
        t = t > STORE_CACHE_HANDICAP_MS ? t - STORE_CACHE_HANDICAP_MS : 0;
    }
    return (t & (UINT64_MAX >> 2)) | ((uint64_t)o->seg << 62);
}

/* store_scan: fill cand[] with every shard's candidate stamp. Returns how many shards have one. */
static int
store_scan(struct store *s, int cls, uint64_t now, uint64_t *cand, uint64_t *objects)
{
    int found = 0;

    *objects = 0;
    for (unsigned i = 0; i < STORE_SHARDS; i++) {
        struct store_shard *sh = &s->shard[i];
        struct store_obj *c;

        pthread_mutex_lock(&sh->lock);
        c = store_candidate_locked(s, sh, cls, now);
        cand[i] = store_evict_rank(c);
        *objects += sh->objects;
        pthread_mutex_unlock(&sh->lock);
        found += c != NULL;
    }
    return found;
}

enum store_evict_end { STORE_EVICT_DONE, STORE_EVICT_EMPTY, STORE_EVICT_GAVE_UP };

/*
 * store_evict_locked: take an evictable object's pages. One with an SSD copy
 * stays indexed without them (returns 1); any other leaves the table
 * (returns 0: the caller drops the table's reference after unlocking).
 */
static int
store_evict_locked(struct store *s, struct store_shard *sh, struct store_obj *o)
{
    if (atomic_load_explicit(&o->ssd, memory_order_relaxed) != STORE_SSD_STORED) {
        store_offload_count_drop_locked(s, o);
        store_detach_locked(s, sh, o);
        return 0;
    }
    store_list_unlink(store_list_of(sh, o), o);
    sh->protected_objs -= o->seg;
    o->seg = 0;
    store_charge(s, o->tenant, -(int64_t)store_ext_pages(o->ext, o->n_ext));
    alloc_give(s->alloc, o->ext, o->n_ext);
    o->n_ext = 0;
    o->resident = 0;
    sh->resident--;
    sh->resident_bytes -= o->size;
    return 1;
}

/*
 * store_evict_class: evict from one list class, oldest stamp first across
 * shards, until usage is at most target_pages. cand[] is a lazy view of the
 * shards' tails: a stamp goes stale when another thread touches the tail, so
 * the chosen shard is re-checked under its lock and re-ranked if its tail
 * got younger. Bounded: at most the objects counted at the first scan are
 * evicted, and STORE_EVICT_MISSES looks in a row without an eviction end it.
 */
static enum store_evict_end
store_evict_class(struct store *s, int cls, uint64_t target_pages, uint64_t now,
                  uint64_t *freed_pages, bool inline_)
{
    uint64_t cand[STORE_SHARDS];
    uint64_t budget;
    int misses = 0;
    int rescans = 0;

    if (store_scan(s, cls, now, cand, &budget) == 0) {
        return STORE_EVICT_EMPTY;
    }
    for (;;) {
        struct store_shard *sh;
        struct store_obj *c;
        struct store_obj *next;
        int best = -1;
        int kept;

        if (alloc_used_pages(s->alloc) <= target_pages) {
            return STORE_EVICT_DONE;
        }
        if (budget == 0 || misses >= STORE_EVICT_MISSES) {
            return STORE_EVICT_GAVE_UP;
        }
        for (unsigned i = 0; i < STORE_SHARDS; i++) {
            if (cand[i] != STORE_NO_CANDIDATE && (best < 0 || cand[i] < cand[best])) {
                best = (int)i;
            }
        }
        if (best < 0) {
            /* Earlier looks moved busy objects aside; look again before giving up. */
            if (rescans++ == STORE_EVICT_RESCANS
                || store_scan(s, cls, now, cand, &budget) == 0) {
                return STORE_EVICT_EMPTY;
            }
            continue;
        }

        sh = &s->shard[best];
        pthread_mutex_lock(&sh->lock);
        c = store_candidate_locked(s, sh, cls, now);
        if (c == NULL || store_evict_rank(c) > cand[best]) {
            cand[best] = store_evict_rank(c);
            pthread_mutex_unlock(&sh->lock);
            misses++;
            continue;
        }
        kept = store_evict_locked(s, sh, c);
        next = store_candidate_locked(s, sh, cls, now);
        cand[best] = store_evict_rank(next);
        pthread_mutex_unlock(&sh->lock);

        atomic_fetch_add_explicit(&s->evictions, 1, memory_order_relaxed);
        atomic_fetch_add_explicit(&s->evicted_bytes, c->size, memory_order_relaxed);
        if (inline_) {
            atomic_fetch_add_explicit(&s->evictions_inline, 1, memory_order_relaxed);
        }
        *freed_pages += store_pages(c->size);
        if (!kept) {
            store_obj_unref(s, c);  /* the table's reference was the only one */
        }
        budget--;
        misses = 0;
    }
}

/* store_evict_to: store_evict, the evictions counted as inline ones when a reserve makes them. */
static uint64_t
store_evict_to(struct store *s, uint64_t target, bool inline_)
{
    uint64_t target_pages = target / STORE_PAGE_SIZE;
    uint64_t freed = 0;
    uint64_t now = clock_coarse_ms();

    if (alloc_used_pages(s->alloc) <= target_pages) {
        return 0;
    }
    /* Soft-pinned objects go only when no normal object can. */
    if (store_evict_class(s, STORE_LRU_NORMAL, target_pages, now, &freed, inline_)
        == STORE_EVICT_EMPTY) {
        (void)store_evict_class(s, STORE_LRU_SOFT, target_pages, now, &freed, inline_);
    }
    return freed * STORE_PAGE_SIZE;
}

uint64_t
store_evict(struct store *s, uint64_t target)
{
    return store_evict_to(s, target, false);
}

/*
 * store_own_candidate_locked: the object of tenant in sh that its own
 * eviction takes next, or NULL: the oldest (by access stamp) evictable one
 * among the STORE_OWN_SCAN nearest each list's tail, a normal one before a
 * soft-pinned one. In on-evict mode one that has to reach the SSD first is
 * queued (*queued) and passed over. *rank orders candidates across shards.
 */
static struct store_obj *
store_own_candidate_locked(struct store *s, struct store_shard *sh, uint32_t tenant,
                           uint64_t now, bool *queued, uint64_t *rank)
{
    static const int order[] = {STORE_LRU_NORMAL, STORE_LRU_PROTECTED, STORE_LRU_SOFT};

    for (uint64_t cls = 0; cls < sizeof(order) / sizeof(order[0]); cls++) {
        struct store_obj *best = NULL;
        struct store_obj *o = sh->lru[order[cls]].tail;

        for (int seen = 0; o != NULL && seen < STORE_OWN_SCAN; seen++, o = o->lru_prev) {
            if (o->tenant != tenant || !store_evictable_locked(o, now)) {
                continue;
            }
            if (store_must_offload_locked(s, o)) {
                *queued |= store_queue_locked(s, o);    /* freed once written */
            } else if (best == NULL || o->atime < best->atime) {
                best = o;
            }
        }
        if (best != NULL) {
            *rank = (best->atime & (UINT64_MAX >> 2)) | (cls << 62);
            return best;
        }
    }
    *rank = STORE_NO_CANDIDATE;
    return NULL;
}

/*
 * store_evict_own: a put of tenant would take it past its DRAM quota by
 * `excess` bytes: make the room from its own objects, the least recently
 * used first across shards (near the tails: see store_own_candidate_locked).
 * Returns 0 when the room is there; -EAGAIN when objects it needs to evict
 * were first queued for the SSD (on-evict mode: the room comes when they are
 * written); KV_QUOTA_EXCEEDED when none of the tenant's objects can go (all
 * pinned, leased, being read, or beyond the look).
 */
static int
store_evict_own(struct store *s, uint32_t tenant, uint64_t excess)
{
    uint64_t cand[STORE_SHARDS];
    uint64_t want = store_pages(excess);
    uint64_t freed = 0;
    uint64_t now = clock_coarse_ms();
    bool queued = false;

    for (unsigned i = 0; i < STORE_SHARDS; i++) {
        struct store_shard *sh = &s->shard[i];

        pthread_mutex_lock(&sh->lock);
        (void)store_own_candidate_locked(s, sh, tenant, now, &queued, &cand[i]);
        pthread_mutex_unlock(&sh->lock);
    }
    while (freed < want) {
        struct store_shard *sh;
        struct store_obj *c;
        uint64_t pages;
        int best = -1;
        int kept;

        for (unsigned i = 0; i < STORE_SHARDS; i++) {
            if (cand[i] != STORE_NO_CANDIDATE && (best < 0 || cand[i] < cand[best])) {
                best = (int)i;
            }
        }
        if (best < 0) {
            break;
        }
        sh = &s->shard[best];
        pthread_mutex_lock(&sh->lock);
        c = store_own_candidate_locked(s, sh, tenant, now, &queued, &cand[best]);
        if (c == NULL) {
            pthread_mutex_unlock(&sh->lock);
            continue;
        }
        pages = store_ext_pages(c->ext, c->n_ext);
        kept = store_evict_locked(s, sh, c);
        atomic_fetch_add_explicit(&s->evictions, 1, memory_order_relaxed);
        atomic_fetch_add_explicit(&s->evicted_bytes, c->size, memory_order_relaxed);
        (void)store_own_candidate_locked(s, sh, tenant, now, &queued, &cand[best]);
        pthread_mutex_unlock(&sh->lock);
        if (!kept) {
            store_obj_unref(s, c);  /* the table's reference was the only one */
        }
        freed += pages;
    }
    return freed >= want ? 0 : queued ? -EAGAIN : KV_QUOTA_EXCEEDED;
}

/*
 * store_quota_room: room within tenant's DRAM quota for `bytes` more arena
 * bytes: 0 (no quota, within it, or made from the tenant's own objects:
 * past its quota a tenant evicts its own, never others'), -EAGAIN (see
 * store_evict_own), or KV_QUOTA_EXCEEDED, counted.
 */
int
store_quota_room(struct store *s, uint32_t tenant, uint64_t bytes)
{
    const struct store_quota *q = store_quota_of(s, tenant);
    uint64_t limit = q != NULL ? atomic_load_explicit(&q->limit, memory_order_relaxed) : 0;
    uint64_t after;
    int rc;

    if (limit == 0) {
        return 0;
    }
    after = atomic_load_explicit(&q->used, memory_order_relaxed) + bytes;
    if (after <= limit) {
        return 0;
    }
    rc = bytes > limit ? KV_QUOTA_EXCEEDED : store_evict_own(s, tenant, after - limit);
    if (rc == KV_QUOTA_EXCEEDED) {
        atomic_fetch_add_explicit(&s->quota_exceeded, 1, memory_order_relaxed);
    }
    return rc;
}

/* ---- the background evictor ---- */

/*
 * store_evictor_wake: a reserve passed the high watermark: have the evictor
 * thread make room down to the low one. Only the reserve that finds it idle
 * pays for the signal.
 */
static void
store_evictor_wake(struct store *s)
{
    if (atomic_load_explicit(&s->evictor_wanted, memory_order_relaxed)
        || atomic_exchange_explicit(&s->evictor_wanted, true, memory_order_acq_rel)) {
        return;
    }
    pthread_mutex_lock(&s->evictor_lock);
    pthread_cond_signal(&s->evictor_cond);
    pthread_mutex_unlock(&s->evictor_lock);
}

/*
 * store_evict_watermark: evict down to the low watermark less `npages`;
 * when that comes up short because what is left is on its way to the SSD,
 * note it (evict_stuck) so that no reserve asks again until the tier reports.
 */
static void
store_evict_watermark(struct store *s, uint64_t npages, uint64_t progress, bool inline_)
{
    uint64_t low = atomic_load_explicit(&s->low_pages, memory_order_relaxed);
    uint64_t target = low > npages ? low - npages : 0;

    (void)store_evict_to(s, target * STORE_PAGE_SIZE, inline_);
    if (alloc_used_pages(s->alloc) > target
        && atomic_load_explicit(&s->offloading, memory_order_relaxed) != 0) {
        /* Short of the low watermark for want of written objects: wait for the tier. */
        atomic_store_explicit(&s->evict_stuck, progress + 1, memory_order_relaxed);
    }
}

static void *
store_evictor_main(void *arg)
{
    struct store *s = arg;

    pthread_mutex_lock(&s->evictor_lock);
    while (!s->evictor_stop) {
        if (!atomic_exchange_explicit(&s->evictor_wanted, false, memory_order_acq_rel)) {
            pthread_cond_wait(&s->evictor_cond, &s->evictor_lock);
            continue;
        }
        pthread_mutex_unlock(&s->evictor_lock);
        store_evict_watermark(s, 0, atomic_load_explicit(&s->tier_progress, memory_order_acquire),
                              false);
        pthread_mutex_lock(&s->evictor_lock);
    }
    pthread_mutex_unlock(&s->evictor_lock);
    return NULL;
}

int
store_evictor_start(struct store *s)
{
    int rc = pthread_mutex_init(&s->evictor_lock, NULL);

    if (rc != 0) {
        return -rc;
    }
    rc = pthread_cond_init(&s->evictor_cond, NULL);
    if (rc != 0) {
        pthread_mutex_destroy(&s->evictor_lock);
        return -rc;
    }
    s->evictor_stop = false;
    rc = pthread_create(&s->evictor, NULL, store_evictor_main, s);
    if (rc != 0) {
        pthread_cond_destroy(&s->evictor_cond);
        pthread_mutex_destroy(&s->evictor_lock);
        return -rc;
    }
    s->evictor_running = true;
    return 0;
}

void
store_evictor_stop(struct store *s)
{
    if (!s->evictor_running) {
        return;
    }
    pthread_mutex_lock(&s->evictor_lock);
    s->evictor_stop = true;
    pthread_cond_signal(&s->evictor_cond);
    pthread_mutex_unlock(&s->evictor_lock);
    pthread_join(s->evictor, NULL);
    pthread_cond_destroy(&s->evictor_cond);
    pthread_mutex_destroy(&s->evictor_lock);
    s->evictor_running = false;
}

/*
 * store_take_pages: arena pages for a new object. When the reserve would pass
 * the high watermark, the background evictor is woken (without one, the
 * reserve itself evicts down to the low watermark less the new object).
 * When the allocator still says no (full, or too fragmented for
 * STORE_MAX_EXTENTS extents) the reserve evicts on the spot: the pages it
 * needs and as much again with the evictor running (it does the rest), else
 * down to the low watermark. Never waits for anything.
 */
int
store_take_pages(struct store *s, uint64_t npages, struct alloc_extent *ext, int max, int *n)
{
    uint64_t low = atomic_load_explicit(&s->low_pages, memory_order_relaxed);
    uint64_t high = atomic_load_explicit(&s->high_pages, memory_order_relaxed);
    uint64_t target = low > npages ? low - npages : 0;
    uint64_t progress;
    uint64_t used;
    bool stuck;

    *n = 0;
    if (npages == 0) {
        return 0;
    }
    /*
     * An eviction that came up short while objects were on their way to the
     * SSD cannot do better until the tier reports one (everything evictable
     * is queued): skip the scans till then, or every put of a burst would
     * walk all the shards for nothing.
     */
    progress = atomic_load_explicit(&s->tier_progress, memory_order_acquire);
    stuck = atomic_load_explicit(&s->evict_stuck, memory_order_relaxed) == progress + 1;
    if (!stuck && alloc_used_pages(s->alloc) + npages > high) {
        if (s->evictor_running) {
            store_evictor_wake(s);
        } else {
            store_evict_watermark(s, npages, progress, true);
        }
    }
    if (alloc_take(s->alloc, npages, ext, max, n) == 0) {
        return 0;
    }
    used = alloc_used_pages(s->alloc);
    if (s->evictor_running) {
        /* Just ahead of this reserve: what it needs and as much again. */
        target = used > 2 * npages ? used - 2 * npages : 0;
    } else if (used <= target) {
        /* Below the watermark yet refused: free at least this request's worth more. */
        target = used > npages ? used - npages : 0;
    }
    if (!stuck) {
        /* Nothing freed here may still be room: the evictor thread may have made it. */
        (void)store_evict_to(s, target * STORE_PAGE_SIZE, true);
    }
    if (stuck || alloc_take(s->alloc, npages, ext, max, n) != 0) {
        /* Objects on their way to the SSD free their pages when written. */
        if (atomic_load_explicit(&s->offloading, memory_order_relaxed) != 0) {
            atomic_store_explicit(&s->evict_stuck, progress + 1, memory_order_relaxed);
            return -EAGAIN;
        }
        return KV_NO_SPACE;
    }
    return 0;
}
