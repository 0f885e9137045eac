/*
 * store_int: the store's internals shared by storage/store.c (the table,
 * the DRAM tier), storage/store_evict.c (eviction) and storage/store_tier.c
 * (the SSD tier's side of the store). Nothing outside those three files
 * includes it; everyone else uses store.h.
 *
 * Locking as in store.h: a _locked function needs its shard's lock held.
 */
#ifndef STORE_INT_H
#define STORE_INT_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "alloc.h"
#include "store.h"

#define STORE_SHARD_BITS 6
#define STORE_SHARDS (1u << STORE_SHARD_BITS)
#define STORE_BUCKETS_INIT 64u      /* per shard; a power of two */
#define STORE_REHASH_STEP 64        /* old buckets moved per insert or remove while growing */
#define STORE_EVICT_SCAN 16         /* busy objects one look at a shard tail may skip */
#define STORE_OWN_SCAN 32           /* objects a tenant's own eviction looks at per list */
#define STORE_EVICT_PROMOTE 1024    /* second chances one look may give before it stops */
#define STORE_EVICT_MISSES 256      /* looks in a row that evict nothing (4 per shard) */
#define STORE_EVICT_RESCANS 2       /* full rescans before a class counts as empty */
#define STORE_SLRU_STEPS 64         /* protected objects one look may move (SLRU balance) */
#define STORE_NO_CANDIDATE UINT64_MAX
#define STORE_CACHE_HANDICAP_MS 600000 /* a cache copy ranks as if this much older (store_set_cache) */
#define STORE_CACHE_SCAN 32         /* objects past a list's candidate looked at for a cache copy */

_Static_assert(STORE_PAGE_SIZE == ALLOC_PAGE_SIZE, "the store and the allocator disagree on pages");

enum store_obj_state {
    STORE_OBJ_RESERVED = 1,
    STORE_OBJ_PUBLISHED = 2,
    STORE_OBJ_GONE = 3              /* no longer indexed; freed with the last reference */
};

/*
 * A shard's lists. NORMAL holds unpinned objects (under SLRU: its
 * probationary segment), PROTECTED the unpinned objects SLRU protects (seg
 * set), SOFT the soft-pinned ones.
 */
enum store_lru {
    STORE_LRU_NORMAL = 0,
    STORE_LRU_SOFT = 1,
    STORE_LRU_PROTECTED = 2,
    STORE_LRU_CLASSES = 3
};

/*
 * One object: 120 bytes on LP64, then room for ext_cap extents (8 bytes
 * each) and the key bytes in the same heap block. What a lookup reads (hash,
 * tenant, key_len, state) and what an access writes (atime, referenced) sit
 * in the first 40 bytes. Everything but refs and ssd is guarded by the shard
 * lock, except what is immutable after store_reserve (hash, tenant, key_len,
 * ext_cap, size, base, key), which reference holders read without it, and
 * vcrc, an atomic that goes once from 0 to the value's checksum. n_ext
 * and ext change only while the object is not resident (evicted to the SSD
 * tier, or being loaded back), when no reader holds it through store_get.
 *
 * With an SSD tier the room for extents has a little slack over what the
 * object first needed (ext_cap), so that a load back into a more fragmented
 * arena still fits in the same block.
 */
struct store_obj {
    struct store_obj *hnext;        /* hash chain; after detaching, a private free list */
    uint64_t hash;
    uint32_t tenant;
    uint32_t key_len;
    uint8_t state;                  /* enum store_obj_state */
    uint8_t pin;                    /* enum store_pin */
    uint8_t n_ext;
    uint8_t referenced;             /* accessed since it last reached its list head */
    _Atomic uint32_t refs;
    uint64_t atime;                 /* access stamp, ms */
    uint64_t lease_until;           /* ms; 0 = no lease */
    uint64_t size;                  /* value bytes */
    uint8_t *base;                  /* arena base, so the obj_* calls need no store */
    struct store_obj *lru_prev;     /* toward the head (newer) */
    struct store_obj *lru_next;     /* toward the tail (older) */
    struct store_loc loc;           /* the SSD copy, when ssd == STORE_SSD_STORED */
    struct store_obj *tlink;        /* the tier's queue link (store_obj_link) */
    uint8_t ext_cap;                /* extents the block has room for */
    uint8_t resident;               /* the value is in the arena (ext[0..n_ext)) */
    uint8_t loading;                /* the tier is reading it back */
    _Atomic uint8_t ssd;            /* enum store_ssd_state */
    uint8_t cold;                   /* loaded without promotion: kept only until read */
    uint8_t seg;                    /* on the PROTECTED list (SLRU) */
    uint8_t cache;                  /* a cluster cache copy: this node does not own the key */
    _Atomic uint8_t must_write;     /* a durable put waits on its copy: never refused by the
                                       tier's admission (store_obj_must_write) */
    _Atomic uint64_t vcrc;          /* STORE_VCRC_KNOWN | the value's CRC-32C; 0: not known yet */
    struct alloc_extent ext[];      /* ext_cap extents, then key_len key bytes */
};

_Static_assert(sizeof(struct store_obj) <= 120, "object header grew; update the comment above");

#define STORE_VCRC_KNOWN (1ull << 32)  /* vcrc holds a checksum (set once: values are immutable) */

struct store_list {
    struct store_obj *head;
    struct store_obj *tail;
};

struct store_shard {
    _Alignas(64) pthread_mutex_t lock; /* a cache line of its own: shards do not false-share */
    struct store_obj **buckets;
    uint64_t mask;                  /* buckets - 1 */
    struct store_obj **old;         /* while growing: the previous table, see store_bucket_locked */
    uint64_t old_mask;
    uint64_t rehash_pos;            /* old buckets below this have moved */
    uint64_t count;                 /* indexed objects, reserved included */
    struct store_list lru[STORE_LRU_CLASSES];
    uint64_t objects;               /* published */
    uint64_t reserved;
    uint64_t value_bytes;
    uint64_t pinned_hard;
    uint64_t pinned_soft;
    uint64_t resident;              /* published and in the arena */
    uint64_t resident_bytes;
    uint64_t stored;                /* published with an SSD copy */
    uint64_t loading;
    uint64_t protected_objs;        /* objects on lru[STORE_LRU_PROTECTED] */
    /* Copies of buckets/mask for prefetching without the lock (store_exists_batch): a
     * stale or torn pair only makes a prefetch useless, never a lookup wrong. */
    _Atomic(uintptr_t) pf_buckets;
    _Atomic uint64_t pf_mask;
};

#define STORE_QUOTA_SLOTS 64

/* One tenant's DRAM quota and the arena bytes its objects hold. */
struct store_quota {
    _Atomic uint32_t tenant;        /* 0: free slot */
    _Atomic uint64_t limit;         /* bytes; 0: none (usage still counted) */
    _Atomic uint64_t used;          /* bytes of arena pages its objects hold */
    _Atomic uint64_t ssd_limit;     /* value bytes on the SSD tier; 0: none */
    _Atomic uint64_t ssd_used;      /* value bytes of its objects stored there */
    _Atomic uint64_t usage_ms;      /* when store_tenant_usage last walked for it, + 1 */
    _Atomic uint64_t usage_objects; /* and what it found */
    _Atomic uint64_t usage_bytes;
};

/*
 * store_charge: pages taken (+) or given back (-) by an object of tenant,
 * counted against its quota if it has one. Any thread; no lock.
 */
void store_charge(struct store *s, uint32_t tenant, int64_t pages);

/* store_ssd_charge: value bytes of tenant's objects stored on (+) or dropped from (-) the tier. */
void store_ssd_charge(struct store *s, uint32_t tenant, int64_t bytes);

struct store {
    struct store_shard shard[STORE_SHARDS];
    struct alloc *alloc;
    uint8_t *base;
    uint64_t capacity_pages;
    _Atomic uint64_t max_key_size;
    _Atomic uint64_t max_value_size;
    _Atomic uint64_t high_pages;    /* eviction starts when a reserve would pass this */
    _Atomic uint64_t low_pages;     /* and goes down to this */
    _Atomic int policy;             /* enum store_evict_policy */
    _Atomic uint64_t evictions;
    _Atomic uint64_t evictions_inline; /* made by a reserve itself (store_take_pages) */
    /* The background evictor (store_evict.c), when store_config.evict_background. */
    pthread_t evictor;
    pthread_mutex_t evictor_lock;
    pthread_cond_t evictor_cond;
    bool evictor_running;           /* started; joined by store_evictor_stop */
    bool evictor_stop;              /* under evictor_lock */
    _Atomic bool evictor_wanted;    /* a reserve passed the high watermark since its last pass */
    _Atomic uint64_t evicted_bytes; /* value bytes of evicted objects */
    _Atomic uint64_t no_space;
    _Atomic uint64_t metadata_bytes;
    _Atomic uint64_t offloading;    /* objects handed to the tier's offload, not back yet */
    _Atomic uint64_t offload_bytes; /* their value bytes */
    _Atomic uint64_t offload_dropped; /* evicted uncopied: the offload queue was over its bound */
    _Atomic uint64_t tier_progress; /* bumped by every tier report and mode change */
    _Atomic uint64_t evict_stuck;   /* tier_progress + 1 when eviction last came up short
                                       waiting for the tier (see store_take_pages); else 0 */
    struct store_tier tier;         /* hooks; valid when has_tier */
    bool has_tier;
    _Atomic bool write_through;
    _Atomic bool on_evict;
    _Atomic bool promote;
    _Atomic bool degraded;
    _Atomic unsigned cold_cursor;   /* shard store_offload_cold starts at */
    _Atomic bool has_cache;         /* a cluster cache copy was ever stored (store_set_cache) */
    int nshards_ready;              /* shard mutexes initialized (for a half-built destroy) */
    /* Removed (forced) while leased: out of the table, but their pages are not reused
     * until the lease ends, since a client may be reading them in place. */
    pthread_mutex_t grave_lock;
    bool grave_ready;               /* grave_lock initialized */
    struct store_obj *graves;       /* linked by hnext; each holds the table's reference */
    _Atomic uint64_t ngraves;
    /* Tenants with a DRAM quota: slots are taken by store_set_quota, never given back. */
    struct store_quota quota[STORE_QUOTA_SLOTS];
    _Atomic uint32_t nquotas;
    _Atomic uint64_t quota_exceeded;
};

/* ---- small helpers ---- */

/* store_quota_of: tenant's quota slot, or NULL when it has none. */
static inline struct store_quota *
store_quota_of(struct store *s, uint32_t tenant)
{
    uint32_t n = atomic_load_explicit(&s->nquotas, memory_order_acquire);

    for (uint32_t i = 0; tenant != 0 && i < n; i++) {
        if (atomic_load_explicit(&s->quota[i].tenant, memory_order_relaxed) == tenant) {
            return &s->quota[i];
        }
    }
    return NULL;
}

/* store_ext_pages: pages in extents ext[0..n). */
static inline uint64_t
store_ext_pages(const struct alloc_extent *ext, int n)
{
    uint64_t pages = 0;

    for (int i = 0; i < n; i++) {
        pages += 1ull << ext[i].order;
    }
    return pages;
}

static inline struct store_shard *
store_shard_of(struct store *s, uint64_t hash)
{
    return &s->shard[hash >> (64 - STORE_SHARD_BITS)];
}

static inline const uint8_t *
store_obj_kptr(const struct store_obj *o)
{
    return (const uint8_t *)(o->ext + o->ext_cap);
}

static inline size_t
store_obj_heap_bytes(const struct store_obj *o)
{
    return sizeof(*o) + o->ext_cap * sizeof(struct alloc_extent) + o->key_len;
}

static inline uint64_t
store_pages(uint64_t size)
{
    return (size + STORE_PAGE_SIZE - 1) / STORE_PAGE_SIZE;
}

/* ---- shared by store.c, store_evict.c and store_tier.c ---- */

/* store_find_locked: the indexed object of key (any state), or NULL. */
struct store_obj *store_find_locked(struct store_shard *sh, uint64_t hash,
                                    const struct kv_key *key);

/* store_index_locked: insert o into its shard's table (grows it incrementally). */
void store_index_locked(struct store *s, struct store_shard *sh, struct store_obj *o);

/*
 * store_detach_locked: unindex o (it becomes GONE, off its list and out of
 * the counters); the caller drops the table's reference after unlocking.
 */
void store_detach_locked(struct store *s, struct store_shard *sh, struct store_obj *o);

/* store_obj_put: drop n references at once; the last one frees the object. */
void store_obj_put(struct store *s, struct store_obj *o, uint32_t n);

/* The near-LRU lists: the list a published resident object is on (or NULL), pushes. */
struct store_list *store_list_of(struct store_shard *sh, const struct store_obj *o);
void store_list_push_head(struct store_list *l, struct store_obj *o);
void store_list_push_tail(struct store_list *l, struct store_obj *o);

/*
 * store_list_unlink: take o off l, the list it is on (store_list_of), and
 * clear its links. store.c (remove, pin) and store_evict.c (second chances,
 * evictions) call it with o's shard lock held.
 */
void store_list_unlink(struct store_list *l, struct store_obj *o);

/* store_evictable_locked: no holder but the table, no lease running. */
int store_evictable_locked(const struct store_obj *o, uint64_t now);

/*
 * store_load_start_locked: o (published, not resident, a tier attached) is
 * handed to the tier's load hook with a reference of its own, unless a load
 * runs already.
 */
void store_load_start_locked(struct store *s, struct store_shard *sh, struct store_obj *o);

/*
 * store_queue_locked: hand o to the tier's offload hook with a reference of
 * its own. Returns false (nothing queued) when o is larger than its
 * tenant's whole SSD share.
 */
bool store_queue_locked(struct store *s, struct store_obj *o);

/*
 * store_offload_full: in on-evict mode the offload queue holds
 * tier.offload_max bytes or more: eviction then takes objects without an
 * SSD copy (the coldest first, as always) instead of queueing them, so puts
 * never wait on the disk for longer than that queue takes to write.
 */
bool store_offload_full(struct store *s);

/*
 * store_offload_count_drop_locked: o leaves DRAM without an SSD copy; count
 * it in offload_dropped when the offload queue's bound is the reason (the
 * tier is writing, on-evict mode, o was never queued).
 */
void store_offload_count_drop_locked(struct store *s, const struct store_obj *o);

/*
 * store_ssd_over_quota: o is larger than its tenant's whole SSD share, so
 * it can never be written there. (Within the share the tier makes room by
 * evicting the tenant's own oldest buckets: see ssd_share_room.)
 */
bool store_ssd_over_quota(struct store *s, const struct store_obj *o);

/*
 * store_take_pages: npages arena pages as at most max extents, evicting as
 * needed. 0, KV_NO_SPACE, or -EAGAIN when offloads in flight will free room.
 * Defined in store_evict.c; takes each shard's lock in turn, so the caller
 * holds no shard lock.
 */
int store_take_pages(struct store *s, uint64_t npages, struct alloc_extent *ext, int max, int *n);

/*
 * store_quota_room: make room within tenant's DRAM quota for `bytes` more
 * arena bytes; past its quota a tenant evicts its own objects, the least
 * recently used first, never others'. Returns 0 (no quota, within it, or
 * the room was made), -EAGAIN (objects it had to evict were first queued for
 * the SSD, in on-evict mode: the room comes when they are written), or
 * KV_QUOTA_EXCEEDED (none of the tenant's objects could go, or bytes alone
 * is over the quota; counted in quota_exceeded). Defined in store_evict.c,
 * called by store_reserve before it takes pages. Takes each shard's lock in
 * turn: the caller holds no shard lock.
 */
int store_quota_room(struct store *s, uint32_t tenant, uint64_t bytes);

/*
 * store_evictor_start: start the background evictor thread (store_create).
 * 0, or a negative errno (nothing started). store_evictor_stop: stop and
 * join it; accepts a store whose evictor never started. Defined in
 * store_evict.c.
 */
int store_evictor_start(struct store *s);
void store_evictor_stop(struct store *s);

/* store_ext_cap: extents an object block makes room for (n needed now). */
int store_ext_cap(const struct store *s, uint64_t npages, int n);

#endif
