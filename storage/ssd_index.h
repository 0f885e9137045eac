/*
 * ssd_index: the persistent index of the SSD tier, an LMDB environment in
 * <ssd_dir>/index/. This is the only file of the project that includes
 * lmdb.h. It maps
 *
 *   object key (tenant, key bytes) -> struct idx_loc   (database "objects")
 *   (bucket, value offset)         -> object key       (database "bkeys", so a
 *                                                        bucket's keys can be listed)
 *   bucket id                      -> struct idx_bucket (database "buckets")
 *   name                           -> u64              (database "meta")
 *
 * Writes are batches of operations applied in one transaction with one sync
 * (idx_apply). When LMDB reports MDB_MAP_FULL the transaction is aborted
 * (never reused), the map is grown and the whole batch is retried; only when
 * the map cannot grow past max_map does the batch fail, leaving the index as
 * it was. The environment is opened without MDB_WRITEMAP, so a full disk is
 * an error code from a commit, never a SIGBUS.
 *
 * Threads: an idx is used by one thread at a time (the SSD tier's index
 * thread); no call holds a transaction after it returns.
 */
#ifndef SSD_INDEX_H
#define SSD_INDEX_H

#include <stddef.h>
#include <stdint.h>

struct idx;

/* Where an object's value is. */
struct idx_loc {
    uint64_t bucket;     /* bucket id */
    uint64_t offset;     /* file offset of the value (after the header block) */
    uint64_t length;     /* value bytes */
    uint32_t crc;        /* the record's value_crc (see ssd_record.h) */
    uint32_t flags;      /* reserved, 0 */
};

/* One bucket file's accounting. */
struct idx_bucket {
    uint64_t id;
    uint64_t created_ms;   /* wall clock ms when the bucket was opened */
    uint64_t last_read_ms; /* wall clock ms of the last read (for LRU) */
    uint64_t live_bytes;   /* record bytes of objects still indexed */
    uint64_t total_bytes;  /* record bytes written (file size) */
    uint32_t flags;        /* IDX_BUCKET_SEALED when no more records go in */
    uint32_t owner;        /* tenant whose SSD share it holds; 0: shared (see store_ssd_owner) */
};

#define IDX_BUCKET_SEALED 1u

enum idx_op_kind {
    IDX_OBJ_PUT = 1,     /* key -> loc (replaces an existing entry; bkeys kept in step) */
    IDX_OBJ_DEL = 2,     /* delete key, only if its entry is at loc.bucket/loc.offset */
    IDX_BUCKET_PUT = 3,  /* bucket record upsert */
    IDX_BUCKET_DROP = 4, /* delete bucket record, its bkeys range, and every object
                            entry that still points into the bucket */
    IDX_META_PUT = 5,    /* meta[name] = value */
    IDX_OBJ_APPEND = 6   /* IDX_OBJ_PUT with the same result, for a caller whose locations
                            mostly come in ascending (bucket, offset) order, past every
                            entry already indexed (a rebuild's walk): one search of objects
                            when the key is new and its bkeys row appended without one;
                            anything else takes IDX_OBJ_PUT's path */
};

/* One operation of a batch. Pointers are borrowed for the idx_apply call. */
struct idx_op {
    int kind;                 /* enum idx_op_kind */
    uint32_t tenant;          /* OBJ_* */
    uint32_t key_len;         /* OBJ_* */
    const uint8_t *key;       /* OBJ_* */
    struct idx_loc loc;       /* OBJ_PUT: the entry; OBJ_DEL: the expected bucket/offset */
    struct idx_bucket bucket; /* BUCKET_PUT: the record; BUCKET_DROP: bucket.id */
    const char *name;         /* META_PUT */
    uint64_t value;           /* META_PUT */
};

/*
 * idx_open: open (creating when absent) the environment in dir (created
 * with mode 0700 when missing). map_size is the initial map (rounded up to
 * the page size, at least 1 MiB), max_map the most it may grow to. Clears
 * reader slots left by dead processes (mdb_reader_check) and reports how
 * many through *stale_readers (may be NULL). Returns 0 and *out, or a
 * negative errno / KV_INTERNAL with a message in err[0..errlen) naming the
 * failing call (e.g. "mdb_env_open(/x/index): Permission denied"). A data.mdb
 * shorter than the pages its meta page names is refused (KV_INTERNAL, "data.mdb
 * is N bytes but names pages up to P") instead of faulting later.
 */
int idx_open(const char *dir, uint64_t map_size, uint64_t max_map, int *stale_readers,
             struct idx **out, char *err, size_t errlen);

/*
 * idx_verify: walk the whole environment in dir (every database, every value
 * decoded) in a child process, so that pages damaged in ways LMDB does not
 * check (it has no checksums) crash the child, not the caller. Call before
 * idx_open, with no environment of dir open in this process. Returns 0 when
 * the walk finished clean (or dir has no data.mdb, or no child could be
 * made), else KV_INTERNAL with the reason in err: LMDB reported an error,
 * a value failed to decode, the child died by a signal, or it ran past
 * timeout_s seconds (killed).
 */
int idx_verify(const char *dir, unsigned timeout_s, char *err, size_t errlen);

/* idx_close: close the environment. Accepts NULL. */
void idx_close(struct idx *x);

/*
 * idx_apply: apply ops[0..n) in order in one write transaction and commit
 * (one sync). All or nothing. An IDX_OBJ_DEL whose key is absent or points
 * elsewhere is not an error (a no-op). Returns 0, KV_NO_SPACE when the map
 * is full at max_map or the disk is full (ENOSPC), or a negative errno
 * (-EIO ...); on failure nothing of the batch is visible.
 */
int idx_apply(struct idx *x, const struct idx_op *ops, size_t n);

/* idx_get: the entry of a key. Returns 0 and *loc, or KV_NOT_FOUND. */
int idx_get(struct idx *x, uint32_t tenant, const uint8_t *key, uint32_t key_len,
            struct idx_loc *loc);

/* idx_bucket_get: a bucket's record. Returns 0 and *b, or KV_NOT_FOUND. */
int idx_bucket_get(struct idx *x, uint64_t id, struct idx_bucket *b);

/* idx_meta_get: meta[name]. Returns 0 and *value, or KV_NOT_FOUND. */
int idx_meta_get(struct idx *x, const char *name, uint64_t *value);

/* Callbacks of the scans: return 0 to go on, anything else stops the scan
 * and is returned by it. key is valid only during the call. */
typedef int idx_obj_fn(void *arg, uint32_t tenant, const uint8_t *key, uint32_t key_len,
                       const struct idx_loc *loc);
typedef int idx_bucket_fn(void *arg, const struct idx_bucket *b);

/*
 * idx_warm: read the index file once from start to end, so that a full
 * scan that follows (start-up) finds it in the page cache instead of
 * faulting it in a page at a time (the map is opened MDB_NORDAHEAD, right
 * for lookups, slow for a cold scan). Best effort; blocks for the read.
 */
void idx_warm(struct idx *x);

/*
 * idx_scan_objects: call fn for every object entry (in key order), from
 * one read transaction. Returns 0 or the first non-zero fn result.
 * fn must not call other idx functions.
 */
int idx_scan_objects(struct idx *x, idx_obj_fn *fn, void *arg);

/* idx_scan_bucket_objects: fn for every object of bucket id, in offset order. */
int idx_scan_bucket_objects(struct idx *x, uint64_t id, idx_obj_fn *fn, void *arg);

/* idx_scan_buckets: fn for every bucket record, in id order. */
int idx_scan_buckets(struct idx *x, idx_bucket_fn *fn, void *arg);

/*
 * idx_set_sync: sync == 0: later commits are not synced (a bulk load that
 * is redone from scratch after a crash: the index rebuild); sync != 0:
 * commits sync again, and everything committed so far is synced now.
 * Returns 0 or a status (-EIO ...).
 */
int idx_set_sync(struct idx *x, int sync);

/* idx_map_size: the current map size in bytes (grows on MDB_MAP_FULL). */
uint64_t idx_map_size(const struct idx *x);

#endif
