/*
 * store: the object store facade. Everything above storage (the daemon, the
 * RPC handlers) reaches objects only through this header.
 *
 * An object is an immutable byte string named by a struct kv_key (tenant +
 * bytes). Its life is a small state machine:
 *
 *     (absent) --store_reserve--> RESERVED --store_commit--> PUBLISHED
 *                                    |                          |
 *                               store_abort            remove / evict / remove_all
 *                                    v                          v
 *                                 (absent)                   (absent)
 *
 * A RESERVED object is invisible to every read (get, exists, size, prefix
 * match); its space is already taken from the DRAM arena, and a second
 * reserve of the same key gets KV_BUSY. A PUBLISHED object is visible
 * whole, and a reserve of its key gets KV_EXISTS (write-once).
 *
 * Object memory lives in one arena of memory_size bytes allocated at
 * store_create, in 4 KiB pages; one object's bytes are a short list of
 * extents (at most STORE_MAX_EXTENTS), which store_obj_iov hands out so
 * that callers can readv/writev straight into and out of the arena.
 *
 * References: the table holds one reference to every object it indexes.
 * store_reserve and store_get hand the caller one more; the caller gives it
 * back with store_commit/store_abort (writer) or store_obj_unref (reader).
 * An object with references beyond the table's is never evicted, and
 * remove answers KV_BUSY for it. Memory is returned when the last
 * reference goes.
 *
 * Recency and leases are apart: store_exists/store_prefix_* and store_get
 * refresh recency (near-LRU order) but never pin; store_lease blocks
 * remove (unless forced) and eviction until it expires.
 *
 * Tiers: with an SSD tier attached (store_set_tier, storage/ssd.h) the
 * table is the directory of both tiers. A PUBLISHED object may be resident
 * (its bytes in the arena), stored (a copy on SSD at a struct store_loc), or
 * both; an object that is only stored reads as present to exists, size and
 * prefix match, and store_get answers -EAGAIN while the tier loads it back
 * (readers retry). The store asks the tier to write objects (offload: at
 * commit in write-through mode, at eviction in on-evict mode, or on request
 * for durable puts) and to load them (load); eviction of a stored object
 * only frees its arena pages and keeps it indexed. The tier reports back
 * with store_obj_stored / store_obj_store_failed / store_load_end and feeds
 * the table at start (store_insert_stored) and when it drops a bucket
 * (store_drop_stored).
 *
 * Threads: every function is safe to call from any thread at once. The key
 * table is split into shards, each under its own mutex; the arena allocator
 * has one mutex. Lock order: shard lock before allocator lock, and shard
 * lock before any lock the tier's offload/load hooks take (the hooks are
 * called with a shard lock held and must only queue); no function holds two
 * shard locks at once. No function blocks on I/O.
 */
#ifndef STORE_H
#define STORE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct iovec;
struct store;
struct store_obj;

#define STORE_MAX_EXTENTS 32
#define STORE_PAGE_SIZE 4096u

/* A key: raw bytes inside a tenant's namespace. Borrowed by every call. */
struct kv_key {
    uint32_t tenant;   /* 0 = the default tenant */
    uint32_t len;
    const uint8_t *ptr;
};

enum store_pin {
    STORE_PIN_NONE = 0,
    STORE_PIN_SOFT = 1, /* evicted only after every unpinned object */
    STORE_PIN_HARD = 2  /* never evicted */
};

/*
 * Which resident object eviction takes next (store_config.policy):
 *   LRU   the one not accessed for longest (CLOCK: an object accessed since it
 *         last reached its list head gets a second chance, then the oldest
 *         access stamp across shards goes)
 *   FIFO  the one stored first; accesses change nothing
 *   SLRU  segmented LRU: new objects enter a probationary segment, one
 *         accessed again there moves to a protected segment (at most
 *         STORE_SLRU_PROTECTED_PCT % of a shard's objects; its overflow goes back
 *         to probation), and eviction takes from probation first, so a scan
 *         of objects read once does not push out those read twice
 */
enum store_evict_policy {
    STORE_EVICT_LRU = 0,
    STORE_EVICT_FIFO = 1,
    STORE_EVICT_SLRU = 2
};

#define STORE_SLRU_PROTECTED_PCT 50

/* store_config.hugepages: which pages may back the arena. */
enum store_hugepages { STORE_HUGEPAGES_AUTO = 0, STORE_HUGEPAGES_ON = 1, STORE_HUGEPAGES_OFF = 2 };

struct store_config {
    uint64_t memory_size;      /* arena bytes; rounded down to whole pages */
    uint32_t max_key_size;     /* keys longer than this: KV_TOO_LARGE */
    uint64_t max_value_size;   /* values longer than this: KV_TOO_LARGE */
    double high_watermark;     /* fraction of memory_size that starts eviction */
    double low_watermark;      /* eviction goes down to this fraction */
    enum store_evict_policy policy;
    /*
     * Evict on a thread of the store's own (store_create starts it): a reserve
     * that passes the high watermark only wakes it, and the request path
     * evicts itself only when the allocator has no room (the bytes needed and
     * as much again). Off: the reserve that passes the high watermark evicts
     * down to the low one itself. Fixed at create.
     */
    bool evict_background;
    /*
     * Which pages may back the arena (memory_hugepages; storage/alloc.h, alloc_create):
     * STORE_HUGEPAGES_AUTO (0, the default) hugetlb when the pool has room, else
     * transparent huge pages where enabled, else 4 KiB; _ON as auto but refused
     * (KV_UNSUPPORTED) without huge pages; _OFF 4 KiB pages. Fixed at create.
     */
    enum store_hugepages hugepages;
    /*
     * memory_file: the arena's backing file on tmpfs or hugetlbfs, kept when the store is
     * destroyed (storage/alloc.h, alloc_create_file); NULL or "" an anonymous memfd. Borrowed
     * for store_create only. Fixed at create.
     */
    const char *memory_file;
};

struct store_stats {
    uint64_t objects;          /* published objects */
    uint64_t reserved;         /* objects being written */
    uint64_t memory_used;      /* arena bytes taken (pages * page size) */
    uint64_t memory_capacity;  /* arena bytes */
    uint64_t value_bytes;      /* sum of published value sizes */
    uint64_t evictions;        /* objects evicted since start */
    uint64_t evicted_bytes;
    uint64_t no_space;         /* reserves refused with KV_NO_SPACE */
    uint64_t pinned_hard;
    uint64_t pinned_soft;
    uint64_t metadata_bytes;   /* heap bytes held by object metadata and the table */
    uint64_t memory_prefaulted; /* arena bytes whose pages are populated (see alloc.h) */
    uint64_t memory_prefault_done; /* 1 once populating the arena has ended (alloc.h) */
    uint64_t memory_hugepages;  /* the arena's pages: 0 4 KiB, 1 transparent huge, 2 hugetlb */
    uint64_t memory_file_reused; /* 1: the arena's memory_file existed with its size */
    uint64_t memory_file_resident; /* bytes of the memory_file resident when mapped */
    uint64_t resident;         /* published objects whose bytes are in the arena */
    uint64_t resident_bytes;   /* their value bytes */
    uint64_t stored;           /* published objects with a copy on the SSD tier */
    uint64_t loading;          /* objects being read back from the SSD tier */
    uint64_t offloading;       /* objects queued or being written to the SSD tier */
    uint64_t offload_bytes;    /* their value bytes */
    uint64_t offload_dropped;  /* evicted without an SSD copy: the offload queue was full */
    uint64_t quota_exceeded;   /* reserves refused with KV_QUOTA_EXCEEDED */
    uint64_t evictions_inline; /* of evictions, made by a reserve on the request path */
};

/* Where an object's copy lives on the SSD tier (meaningful to the tier only). */
struct store_loc {
    uint32_t bucket;
    uint32_t crc;
    uint64_t offset;
};

/* An object's SSD copy, as store_obj_ssd_state reports it. */
enum store_ssd_state {
    STORE_SSD_NONE = 0,    /* no copy (dirty in on-evict terms) */
    STORE_SSD_QUEUED = 1,  /* handed to the tier, not written yet */
    STORE_SSD_STORED = 2,  /* written, synced and indexed */
    STORE_SSD_FAILED = 3   /* the tier could not write it (disk full, I/O error) */
};

/*
 * The SSD tier's hooks. offload and load are called with a shard lock held
 * and must only queue the object; each receives a reference the tier gives
 * back (store_obj_unref) when done. forget is called without locks after
 * a stored object left the table (removed), with its key and location.
 */
struct store_tier {
    void *arg;
    void (*offload)(void *arg, struct store_obj *o);
    void (*load)(void *arg, struct store_obj *o);
    void (*forget)(void *arg, const struct kv_key *key, const struct store_loc *loc,
                   uint64_t size);
    /* touch (may be NULL): a get was served from DRAM for an object whose copy is in
     * `bucket` (called with a shard lock held: a store to memory, nothing more) */
    void (*touch)(void *arg, uint32_t bucket);
    /* read (may be NULL): store_read_stored's work, done on the calling thread */
    int (*read)(void *arg, struct store_obj *o, const struct iovec *iov, int n);
    bool write_through;    /* offload every object at commit */
    bool on_evict;         /* offload an object before its pages are reused */
    bool promote;          /* a loaded object goes to the LRU head; else to the tail, and
                              once read it is the first to be evicted */
    uint64_t offload_max;  /* on-evict: queue at most this many value bytes; past it eviction
                              drops objects uncopied (store_offload_full). 0: no bound */
};

/*
 * store_create: allocate the arena (mmap, advised for huge pages) and an
 * empty table. cfg is copied. Returns 0 and *out, -ENOMEM when the arena
 * cannot be mapped, KV_INVALID_ARGUMENT for a nonsensical cfg (watermarks
 * outside 0 < low <= high <= 1, memory_size under one page, an unknown
 * policy), or a negative errno when the evictor thread cannot be started.
 */
int store_create(const struct store_config *cfg, struct store **out);

/* store_destroy: free everything. Accepts NULL. No other call may be running. */
void store_destroy(struct store *s);

/*
 * store_set_limits: change max_key_size, max_value_size, the watermarks and
 * the eviction policy of a running store (config reload). memory_size and
 * evict_background are ignored (fixed at create). Objects keep their place
 * in the lists across a policy change; a protected segment left by SLRU
 * drains back to probation as eviction looks at it. Returns 0 or KV_INVALID_ARGUMENT (nothing changed).
 */
int store_set_limits(struct store *s, const struct store_config *cfg);

/* ---- write path ---- */

/*
 * store_reserve: take arena space for a new object of `size` bytes under
 * `key` and index it as RESERVED. Evicts (near-LRU, skipping referenced,
 * reserved, leased and hard-pinned objects; soft-pinned last) when usage
 * would pass the high watermark or the arena has no room, down to the low
 * watermark. Never blocks.
 *
 * Returns 0 and *out (a writer reference; fill it through store_obj_iov,
 * then store_commit or store_abort), or:
 *   KV_TOO_LARGE   key longer than max_key_size or size over max_value_size
 *   KV_EXISTS      the key is PUBLISHED (it is not rewritten)
 *   KV_BUSY        the key is RESERVED by another writer
 *   KV_NO_SPACE    no room even after eviction
 *   KV_QUOTA_EXCEEDED  the tenant's DRAM quota has no room for it, and none
 *                  of the tenant's own objects could be evicted to make it
 *   -EAGAIN        no room now, but objects are being written to the SSD
 *                  tier and their pages will be freed: retry shortly
 *   -ENOMEM        metadata allocation failed
 */
int store_reserve(struct store *s, const struct kv_key *key, uint64_t size,
                  struct store_obj **out);

/*
 * store_commit: publish a reserved object (atomically visible to readers)
 * and drop the writer reference. Returns 0, or KV_INVALID_ARGUMENT when o
 * is not RESERVED (it is left untouched).
 */
int store_commit(struct store *s, struct store_obj *o);

/*
 * store_abort: drop a reserved object: unindex it and drop the writer
 * reference; its space returns. Used when the writer disconnects or the
 * value cannot be received. Accepts NULL.
 */
void store_abort(struct store *s, struct store_obj *o);

/*
 * store_put: reserve + copy `len` bytes from `data` + commit, for values
 * already in memory. Same returns as store_reserve.
 */
int store_put(struct store *s, const struct kv_key *key, const void *data, uint64_t len);

/*
 * store_put_cache: store_put for a cluster cache copy: a value this node keeps for a key it
 * does not own (fetched from its owner, or put here by a local client). Eviction takes cache
 * copies before owned objects (they rank as if used ten minutes earlier). Same returns.
 */
int store_put_cache(struct store *s, const struct kv_key *key, const void *data, uint64_t len);

/*
 * store_put_crc: store_put (cache false) or store_put_cache (cache true) of a value sent with
 * its CRC-32C: the bytes are checksummed as they are copied into the arena (in chunks that
 * stay in the CPU cache between the two, so the value is read from memory once), and the
 * object is published only when they match crc, which it then keeps (store_obj_crc answers
 * without reading the value again). Same returns as store_reserve, and
 * KV_CHECKSUM_MISMATCH: the bytes are not what crc covers; nothing is stored. A key already
 * PUBLISHED answers KV_EXISTS without the bytes being checked.
 */
int store_put_crc(struct store *s, const struct kv_key *key, const void *data, uint64_t len,
                  uint32_t crc, bool cache);

/*
 * store_commit_crc: store_commit of a reserved object whose value the writer received whole
 * and checked against crc, its CRC-32C (kept on the object, as store_put_crc does); cache:
 * publish it as a cluster cache copy (as store_put_cache). Same returns as store_commit.
 */
int store_commit_crc(struct store *s, struct store_obj *o, uint32_t crc, bool cache);

/*
 * store_set_cache: mark a PUBLISHED object as a cache copy (cache true: this node no longer
 * owns the key after a view change) or as owned (false). Returns 0 or KV_NOT_FOUND.
 */
int store_set_cache(struct store *s, const struct kv_key *key, bool cache);

/*
 * store_walk_shard: call fn(arg, key, size, cache) for every PUBLISHED object of one part of
 * the table (shard 0 .. STORE_WALK_PARTS-1; each object is in exactly one), with that part's
 * lock held: fn must only copy what it needs (the key is borrowed for the call) and must not
 * call the store. A part holds about 1/64 of the objects, so one call holds one lock that
 * long; a walk of the whole store is STORE_WALK_PARTS calls. Returns the objects visited.
 */
#define STORE_WALK_PARTS 64
typedef void store_walk_fn(void *arg, const struct kv_key *key, uint64_t size, bool cache);
uint64_t store_walk_shard(struct store *s, unsigned shard, store_walk_fn *fn, void *arg);

/* ---- read path ---- */

/*
 * store_get: find a PUBLISHED object and take a reader reference on it
 * (refreshes recency). Returns 0 and *out, or KV_NOT_FOUND (also for a
 * RESERVED key), or -EAGAIN when the object is on the SSD tier only: a load
 * has been started (or is running) and a later store_get finds it resident.
 * Give the reference back with store_obj_unref.
 */
int store_get(struct store *s, const struct kv_key *key, struct store_obj **out);

/* store_obj_ref: take one more reference on an object the caller holds a reference to. */
void store_obj_ref(struct store_obj *o);

/*
 * store_obj_unref: give back a reference from store_get/store_obj_ref.
 * Frees the object when it was the last one. Underflow aborts the process.
 * Accepts NULL.
 */
void store_obj_unref(struct store *s, struct store_obj *o);

/* store_obj_size: value length in bytes. */
uint64_t store_obj_size(const struct store_obj *o);

/*
 * store_obj_iov: fill iov[0..n) with the object's extents in order (the
 * last one trimmed to the value length) and return n (0 for an empty
 * value). max must be at least STORE_MAX_EXTENTS. The memory is valid while
 * the caller holds its reference; a reader must not write to it.
 */
int store_obj_iov(const struct store_obj *o, struct iovec *iov, int max);

/*
 * store_obj_crc: the CRC-32C of the object's value. Computed on the first call (or given by
 * store_put_crc / store_obj_set_crc) and kept on the object: values never change once
 * written, so later calls (a peer fetching the same key again) do not read the value.
 * Call it only on a complete value (published, or reserved with every byte written); the
 * caller holds a reference. Any thread.
 */
uint32_t store_obj_crc(struct store_obj *o);

/*
 * store_obj_set_crc: record crc as the object's value checksum, for a caller that computed it
 * over exactly these bytes (a receiver that checked what it wrote). Any thread.
 */
void store_obj_set_crc(struct store_obj *o, uint32_t crc);

/*
 * store_obj_read: copy len bytes at offset off of the value into dst.
 * Returns bytes copied (short at the end of the value).
 */
uint64_t store_obj_read(const struct store_obj *o, uint64_t off, void *dst, uint64_t len);

/*
 * store_obj_write: copy len bytes from src into a RESERVED object at offset
 * off (writer only). Returns bytes copied (short past the end).
 */
uint64_t store_obj_write(struct store_obj *o, uint64_t off, const void *src, uint64_t len);

/*
 * store_prefetch: when key is PUBLISHED on the SSD tier only, start loading
 * it (as store_get would, unless a load runs already) and return 1, without
 * reading it: no reference, no recency change. Otherwise return 0 (resident,
 * absent or reserved: store_get answers at once).
 */
int store_prefetch(struct store *s, const struct kv_key *key);

/*
 * store_get_stored: a reader reference on a PUBLISHED object that is on the
 * SSD tier only (not resident), without loading it, for store_read_stored.
 * Returns 0 and *out; KV_EXISTS when it is resident (use store_get);
 * KV_NOT_FOUND when absent or reserved; KV_UNSUPPORTED without a tier that
 * can read into caller memory.
 */
int store_get_stored(struct store *s, const struct kv_key *key, struct store_obj **out);

/*
 * store_read_stored: read the SSD copy of o (a reference from
 * store_get_stored) straight into iov[0..n), which must cover the value
 * with 4 KiB-aligned addresses and lengths (so the tier can use O_DIRECT),
 * and verify its checksum. Blocks on the disk: call it from a worker
 * thread, never from an event loop. The object stays non-resident. Returns
 * 0 (all store_obj_size(o) bytes are in iov), KV_NOT_FOUND when the copy
 * is gone or unreadable (a copy failing its checksum is dropped, never
 * served), or KV_UNAVAILABLE when the kernel could not write into iov
 * (EFAULT: a client's buffer shrank; the copy stays); the bytes in iov are
 * then undefined.
 */
int store_read_stored(struct store *s, struct store_obj *o, const struct iovec *iov, int n);

/*
 * store_exists: 1 when the key is PUBLISHED (refreshing its recency, never
 * pinning it), 0 when not.
 */
int store_exists(struct store *s, const struct kv_key *key);

/*
 * store_exists_batch: store_exists for keys[0..n), out[i] = 1 or 0. The same
 * answers and recency refresh, faster on big batches: the hash-bucket cache
 * misses of a block of keys are started together instead of one by one.
 */
void store_exists_batch(struct store *s, const struct kv_key *keys, size_t n, uint8_t *out);

/* store_size: 0 and *size for a PUBLISHED key, KV_NOT_FOUND otherwise. */
int store_size(struct store *s, const struct kv_key *key, uint64_t *size);

/* ---- removal and pinning ---- */

/*
 * store_remove: unindex a PUBLISHED object; its memory returns when the last
 * reader lets go. Returns 0, KV_NOT_FOUND, or KV_BUSY when the object is
 * RESERVED, has readers in flight, or holds a lease; force overrides only the
 * lease, never a reader or writer.
 */
int store_remove(struct store *s, const struct kv_key *key, bool force);

/*
 * store_remove_all: remove every PUBLISHED object of `tenant` (or of every
 * tenant when all_tenants) that store_remove would remove. Returns the count.
 */
uint64_t store_remove_all(struct store *s, uint32_t tenant, bool all_tenants, bool force);

/*
 * store_pin: set a PUBLISHED object's pin mode (STORE_PIN_SOFT/HARD;
 * STORE_PIN_NONE is unpin). Returns 0 or KV_NOT_FOUND.
 */
int store_pin(struct store *s, const struct kv_key *key, enum store_pin mode);

/*
 * store_lease: block removal and eviction of a PUBLISHED object until
 * now + ttl_ms (extends, never shortens, a running lease). Returns 0 and
 * *size, or KV_NOT_FOUND. A forced remove of a leased object takes it out
 * of the table at once, but its pages are not reused before the lease
 * ends, so a client reading them in place never sees other bytes.
 */
int store_lease(struct store *s, const struct kv_key *key, uint32_t ttl_ms, uint64_t *size);

/* ---- accounting ---- */

/*
 * store_set_quota: cap the arena bytes tenant's objects may hold (bytes; 0:
 * no cap, usage still counted). A put that would pass it evicts the
 * tenant's own objects, near-LRU, and gets KV_QUOTA_EXCEEDED only when
 * none can go; while a tenant is within its quota, eviction for anyone
 * else leaves its objects alone (its share is guaranteed). Loads from the
 * SSD tier are counted, never refused. ssd_bytes caps the bytes of its
 * buckets on the SSD tier: the tier makes room for its new records from its
 * own oldest buckets; an object larger than the whole share is not written
 * there (it lives in DRAM only, and eviction drops it) and store_sync
 * answers KV_QUOTA_EXCEEDED. At most 64 tenants; KV_NO_SPACE beyond,
 * KV_INVALID_ARGUMENT for tenant 0. Call at start (before the tier loads
 * its index) and on reload.
 */
int store_set_quota(struct store *s, uint32_t tenant, uint64_t bytes, uint64_t ssd_bytes);

/*
 * store_drop_quota: tenant is gone (a reload removed it): its slot is given
 * back for another tenant, and its objects, which stay until evicted or
 * removed, are no longer guarded or counted. A no-op for a tenant without one.
 */
void store_drop_quota(struct store *s, uint32_t tenant);

/*
 * The SSD share's guarantee, for the tier's eviction. A tenant with an SSD
 * quota owns the buckets its objects are written to; everyone else shares
 * buckets of owner 0. store_ssd_owner: the owner a record of tenant goes
 * to: tenant when it has an SSD quota, else 0. store_ssd_guarded: owner's
 * buckets may be evicted only to make room for owner's own records: it has
 * an SSD quota and is within it (never true for 0). store_ssd_share: the
 * SSD quota of owner in bytes (0: none). Any thread; no lock.
 */
uint32_t store_ssd_owner(struct store *s, uint32_t tenant);
bool store_ssd_guarded(struct store *s, uint32_t owner);
uint64_t store_ssd_share(struct store *s, uint32_t owner);

/*
 * store_tenant_usage: the PUBLISHED objects of `tenant` and their value
 * bytes (resident or not). Walks the whole table, a shard lock at a time,
 * at most once per STORE_USAGE_CACHE_MS for a tenant that has a quota slot
 * (every declared tenant does): a caller that asks more often gets the last
 * walk's figures, so asking cannot be turned into a way to hold the shards.
 */
#define STORE_USAGE_CACHE_MS 1000
void store_tenant_usage(struct store *s, uint32_t tenant, uint64_t *objects, uint64_t *bytes);

/* store_stats: a snapshot of the counters (each exact, the set not atomic). */
void store_stats(struct store *s, struct store_stats *out);

/*
 * store_evict: evict objects (in the order of the store's policy) until usage
 * is at most `target` bytes or nothing evictable is left. Returns bytes
 * freed. Called by store_reserve and the background evictor; exported for
 * tests.
 */
uint64_t store_evict(struct store *s, uint64_t target);

/* ---- the SSD tier's side (storage/ssd.c) ---- */

/*
 * store_set_tier: attach (or with NULL detach) the SSD tier; the struct is
 * copied. Call before the store is shared between threads, or at a point
 * where no other call runs (config reload changes only the three flags
 * through store_tier_flags).
 */
void store_set_tier(struct store *s, const struct store_tier *t);

/* store_has_tier: whether an SSD tier is attached. */
bool store_has_tier(const struct store *s);

/* store_tier_flags: change write_through/on_evict/promote of the attached tier. */
void store_tier_flags(struct store *s, bool write_through, bool on_evict, bool promote);

/*
 * store_tier_degraded: while set (the tier cannot write: disk full, I/O
 * errors), eviction takes objects that have no SSD copy instead of waiting
 * for them to be written, so DRAM keeps serving.
 */
void store_tier_degraded(struct store *s, bool degraded);

/*
 * store_obj_must_write: a durable put waits on o's SSD copy (store_sync
 * queued or found it queued): the tier must not refuse it by admission.
 */
bool store_obj_must_write(const struct store_obj *o);

/* store_obj_key: the object's key (borrowed; valid while a reference is held). */
void store_obj_key(const struct store_obj *o, struct kv_key *key);

/*
 * store_obj_link / store_obj_set_link: one pointer in every object that
 * belongs to the tier, for its queues. An object is on at most one of them
 * (it is offloaded only while resident and loaded only while not).
 */
struct store_obj *store_obj_link(const struct store_obj *o);
void store_obj_set_link(struct store_obj *o, struct store_obj *next);

/* store_obj_ssd_state: the object's enum store_ssd_state (any thread, no lock). */
int store_obj_ssd_state(const struct store_obj *o);

/* store_obj_loc: the SSD location of a STORED object (set by store_obj_stored). */
void store_obj_loc(const struct store_obj *o, struct store_loc *loc);

/*
 * store_obj_stored: the tier wrote o at loc (synced and indexed). Marks it
 * STORED, so eviction may free its pages without losing it. Returns 0, or
 * KV_NOT_FOUND when o left the table meanwhile (removed): the caller then
 * deletes the index entry it just wrote. The caller keeps its reference.
 */
int store_obj_stored(struct store *s, struct store_obj *o, const struct store_loc *loc);

/*
 * store_obj_store_failed: the tier could not write o; marks it FAILED and
 * consumes the offload hook's reference (do not unref it afterwards).
 */
void store_obj_store_failed(struct store *s, struct store_obj *o);

/*
 * store_sync: make sure o (a reference the caller holds, PUBLISHED) gets
 * written to the tier: queue it unless it is queued or stored already.
 * Returns 0, KV_UNSUPPORTED when no tier is attached, or KV_QUOTA_EXCEEDED
 * when o is larger than its tenant's whole SSD quota. Wait for the
 * outcome with store_obj_ssd_state.
 */
int store_sync(struct store *s, struct store_obj *o);

/*
 * store_offload_cold: queue up to `bytes` of the coldest resident objects
 * that have no SSD copy (on-evict mode: written ahead so that eviction
 * finds them clean), but not those of tenants with an SSD quota (their
 * share's eviction would undo it). Returns the bytes queued.
 */
uint64_t store_offload_cold(struct store *s, uint64_t bytes);

/*
 * store_insert_stored: index a PUBLISHED, non-resident object of `size`
 * bytes whose copy is at loc (the tier's index at start). Returns 0,
 * KV_EXISTS, KV_TOO_LARGE (key over max_key_size) or -ENOMEM.
 */
int store_insert_stored(struct store *s, const struct kv_key *key, uint64_t size,
                        const struct store_loc *loc);

/*
 * store_stored_loc: o's SSD location, read under its shard lock (the tier
 * moves copies while readers look: store_move_stored).
 */
void store_stored_loc(struct store *s, struct store_obj *o, struct store_loc *loc);

/*
 * store_move_stored: the tier copied key's record from `from` to `to`
 * (bucket compaction). Returns 0 when the object was stored at `from` and
 * now is at `to`; KV_NOT_FOUND when it is not there any more (removed,
 * dropped, or at another location): the copy at `to` is then garbage for
 * the tier to forget.
 */
int store_move_stored(struct store *s, const struct kv_key *key, const struct store_loc *from,
                      const struct store_loc *to);

/*
 * store_drop_stored: the tier is dropping the copy of key at loc (bucket
 * evicted, record unreadable). A resident object only loses its SSD state;
 * a non-resident one leaves the table (even while being loaded: the loader
 * finds it gone). Returns 1 when the object left the table, 0 when it
 * stayed or was absent or its copy is elsewhere.
 */
int store_drop_stored(struct store *s, const struct kv_key *key, const struct store_loc *loc);

/*
 * store_load_begin: arena pages for loading o (a reference from the load
 * hook). Fills iov[0..*n) with whole pages covering the value rounded up to
 * STORE_PAGE_SIZE (page aligned, for O_DIRECT). Returns 0, KV_NO_SPACE, or
 * KV_NOT_FOUND when o left the table. max must be STORE_MAX_EXTENTS.
 */
int store_load_begin(struct store *s, struct store_obj *o, struct iovec *iov, int max, int *n);

/*
 * store_load_end: finish a load. rc 0: o becomes resident (LRU head when
 * promoting, else tail). rc != 0: its pages are returned; with
 * KV_CHECKSUM_MISMATCH or KV_NOT_FOUND the object also leaves the table
 * (an unreadable copy is never served) and 1 is returned, so the tier
 * drops its index entry. Consumes the load hook's reference.
 */
int store_load_end(struct store *s, struct store_obj *o, int rc);

/*
 * store_arena: where object bytes live, for handing out in place to
 * same-host clients (two-phase put, replica lists): *base and *size of the
 * arena (pointers from store_obj_iov lie inside), and the return value, the
 * memfd that maps it at offset 0 (owned by the store), or -1 when the arena
 * cannot be shared.
 */
int store_arena(const struct store *s, uint8_t **base, uint64_t *size);

/*
 * store_arena_backing: which pages back the arena (as memory_hugepages in
 * store_stats: 0 4 KiB, 1 transparent huge pages, 2 hugetlb) and a sentence
 * for the log saying which and why (valid until store_destroy). Any thread.
 */
int store_arena_backing(const struct store *s, const char **why);

/*
 * store_hash64: the key hash used by the table (exported for tests and
 * sharding), keyed with a per-process secret that store_hash_init makes
 * (store_create calls it; once per process, any thread).
 */
uint64_t store_hash64(const struct kv_key *key);
void store_hash_init(void);

#endif
