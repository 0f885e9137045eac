/*
 * ssd_int: what the SSD tier's three files share (storage/ssd.c: start-up,
 * hooks, readers, stats; storage/ssd_bucket.c: the bucket table, bucket
 * files, eviction; storage/ssd_writer.c: the writer thread). Nothing outside
 * the tier includes it; the rest of the daemon sees only ssd.h.
 *
 * Locks: qlock guards the queues, blk the bucket table and each bucket's
 * accounting; neither is held while calling the store or the index, and
 * blk is never taken with qlock held. The writer thread alone creates,
 * seals, rolls back and drops buckets and touches the index.
 */
#ifndef SSD_INT_H
#define SSD_INT_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "ssd.h"
#include "store.h"

struct idx;
struct idx_bucket;
struct ssd_rec;

#define SSD_GROUP_OBJECTS 128           /* objects per group commit at most */
#define SSD_GROUP_BYTES (128ull << 20)  /* and record bytes */
#define SSD_RETRY_MS 1000               /* writes stay suspended this long after a fault */
#define SSD_HOUSEKEEP_MS 100            /* the writer wakes at least this often */
#define SSD_LAST_READ_SAVE_MS 1000      /* bucket read stamps reach the index this often */
#define SSD_COLD_BATCH (64ull << 20)    /* on-evict: bytes queued ahead per idle round */
#define SSD_QUEUE_MAX (2 * SSD_GROUP_BYTES) /* on-evict: offload queue bound (a group being
                                           written, the next one waiting): eviction past it
                                           drops objects instead of waiting for the disk */
#define SSD_WRITER_NICE 10              /* the writer thread's nice below the process's */
#define SSD_RATE_WINDOW_MS 100          /* the admission's probability is retuned this often */
#define SSD_MAP_INITIAL (64ull << 20)
#define SSD_MAP_MAX (1ull << 40)
#define SSD_PATH_MAX 4096
#define SSD_STAMP_SLOTS 65536u          /* read stamps of DRAM hits, by bucket id modulo this */
#define SSD_OPEN_MAX 65                 /* open buckets: the shared one and one per tenant with
                                           an SSD quota (the store has 64 quota slots) */
#define SSD_OWNED_MIN_BUCKET (1ull << 20) /* an owned bucket's size floor (see ssd_bucket_limit) */

struct ssd_bucket {
    uint64_t id;
    uint32_t owner;             /* tenant whose SSD share it holds, 0: shared (store_ssd_owner) */
    int fd;
    bool direct;                /* opened with O_DIRECT */
    bool sealed;
    bool open;                  /* its owner's records go here (one of ssd.open[]) */
    bool dropping;              /* readers may not take new references */
    bool dirty;                 /* changed since its index record was written */
    bool in_group;              /* holds records of the group being committed: not a victim */
    int readers;                /* references held by reader threads */
    uint64_t created_ms;
    uint64_t last_read_ms;
    uint64_t live_bytes;        /* record bytes of indexed objects */
    uint64_t total_bytes;       /* bytes written */
    uint64_t committed_bytes;   /* bytes synced and indexed: what a restart keeps */
    uint64_t alloc_bytes;       /* file length preallocated past total_bytes (open buckets;
                                   writer only): cut back to total_bytes when sealed */
    /* The bucket summary being listed (writer only; ssd_sumfile.c): written as
     * bucket-<id>.kvh once the bucket is sealed and its records committed. */
    uint8_t *sum;               /* SSD_SUM_HDR_SIZE bytes kept for the header, then entries */
    uint64_t sum_len;
    uint64_t sum_cap;
    uint64_t sum_count;
    uint64_t sum_ok_len;        /* of sum_len, the entries of committed records */
    uint64_t sum_ok_count;
    bool sum_on;                /* every record since its creation is listed */
};

/* A dropped index entry waiting for the writer: removed objects, unreadable records. */
struct ssd_forget {
    struct ssd_forget *next;
    struct store_loc loc;
    uint64_t size;
    uint32_t tenant;
    uint32_t key_len;
    uint8_t key[];
};

struct ssd {
    struct ssd_config cfg;
    char dir[SSD_PATH_MAX];
    struct store *store;
    struct idx *idx;
    int lock_fd;
    int dir_fd;

    /* queues, under qlock */
    pthread_mutex_t qlock;
    pthread_cond_t wcond;       /* the writer waits here */
    pthread_cond_t rcond;       /* readers wait here */
    struct store_obj *wq_head;
    struct store_obj *wq_tail;
    struct store_obj *rq_head;
    struct store_obj *rq_tail;
    struct ssd_forget *forgets;
    uint64_t drop_req[16];      /* buckets readers found failing */
    int ndrop_req;
    bool stop;

    /* buckets, under blk; the array is sorted by id */
    pthread_mutex_t blk;
    pthread_cond_t bcond;       /* a dropping bucket lost its last reader */
    struct ssd_bucket **buckets;
    size_t nbuckets;
    size_t cap;

    /* writer thread only; the open buckets, one per owner that has written since the start */
    struct ssd_bucket *open[SSD_OPEN_MAX];
    int nopen;
    uint64_t next_id;
    uint64_t seq;
    uint8_t *hdr;               /* aligned header block buffer */
    uint64_t hdr_cap;
    bool degraded;
    bool dir_unsynced;          /* a bucket file was created since the directory's last fsync */
    uint64_t retry_at;
    uint64_t stamps_saved_at;
    uint64_t aio;               /* aio_context_t of the group writes; 0: synchronous pwritev */
    /* admission under ssd_write_rate_limit (writer thread only) */
    int64_t rate_tokens;        /* bytes the limit allows now; negative: a debt */
    uint64_t rate_at_us;        /* when rate_tokens was last refilled */
    uint64_t rate_window_at;    /* start of the window offered bytes are counted in */
    uint64_t rate_offered;      /* on-evict bytes offered in the window */
    double rate_p;              /* probability an offered object is admitted */
    uint64_t rate_rng;          /* xorshift state */

    pthread_t writer;
    pthread_t *readers;
    int nreaders;
    bool writer_started;
    bool opened;                /* ssd_open succeeded: a close may leave the clean mark */
    bool clean_start;           /* the index is as a clean stop left it (ssd_clean.h) */

    /* reloadable settings */
    _Atomic uint64_t size;      /* ssd_size */
    _Atomic uint64_t bucket_size;
    _Atomic int eviction;
    _Atomic uint64_t high_bytes;
    _Atomic uint64_t low_bytes;
    _Atomic int offload;
    _Atomic uint64_t rate_limit;    /* ssd_write_rate_limit; 0: none */

    /* counters */
    _Atomic uint64_t objects;
    _Atomic uint64_t bytes;
    _Atomic uint64_t disk_bytes;
    _Atomic uint64_t hits;
    _Atomic uint64_t reads;
    _Atomic uint64_t read_bytes;
    _Atomic uint64_t writes;
    _Atomic uint64_t write_bytes;
    _Atomic uint64_t syncs;
    _Atomic uint64_t evicted_buckets;
    _Atomic uint64_t evicted_objects;
    _Atomic uint64_t checksum_errors;
    _Atomic uint64_t direct_reads;
    _Atomic uint64_t io_errors;
    _Atomic uint64_t no_space;
    _Atomic uint64_t write_failed;
    _Atomic uint64_t rate_limited;
    _Atomic uint64_t compacted_buckets;
    _Atomic uint64_t compacted_bytes;
    _Atomic uint64_t queue_objects;
    _Atomic uint64_t queue_bytes;
    _Atomic uint64_t load_queue;
    _Atomic uint64_t degraded_flag;
    uint64_t start_objects;
    uint64_t start_ms;

    /* start-up repair (ssd_rebuild.c) */
    bool rebuild;               /* the writer rebuilds the index before anything else */
    bool rebuild_failed;        /* it failed: the tier stays degraded and its bucket files
                                   are kept as they are for the next start to rebuild from */
    _Atomic int state;          /* enum ssd_state, but DEGRADED comes from degraded_flag */
    _Atomic uint64_t rebuild_buckets;
    _Atomic uint64_t rebuild_buckets_done;
    _Atomic uint64_t rebuild_records;
    _Atomic uint64_t rebuild_ms;
    uint64_t rebuild_t0;        /* clock_ms when the rebuild was decided */
    uint64_t set_aside;
    _Atomic uint64_t rebuild_summary_buckets;   /* buckets rebuilt from their summaries */
    _Atomic uint64_t rebuild_scanned_buckets;   /* buckets the rebuild read whole */

    /* the scrub after a rebuild that trusted summaries (ssd_scrub.c) */
    struct ssd_scrub_item *scrub;   /* the buckets to check (writer thread until it starts) */
    size_t nscrub;
    size_t scrub_cap;
    pthread_t scrubber;
    bool scrub_started;
    _Atomic uint64_t scrub_rate;    /* ssd_scrub_rate: bytes/s; 0: no scrub */
    _Atomic uint64_t scrub_buckets;
    _Atomic uint64_t scrub_buckets_done;
    _Atomic uint64_t scrub_bad;
    _Atomic uint64_t scrub_bytes;
    _Atomic uint64_t scrub_ms;
    uint64_t scrub_t0;

    /*
     * Wall-clock ms of the last DRAM hit on an object of bucket id, at
     * [id % SSD_STAMP_SLOTS]; folded into the buckets' last_read_ms under blk.
     * Live buckets span far fewer ids than slots; a stale stamp left by an old
     * bucket in the same slot is older than the new bucket's creation and ignored.
     */
    _Atomic uint64_t stamps[SSD_STAMP_SLOTS];
};

#define CTR_ADD(t, f, v) atomic_fetch_add_explicit(&(t)->f, (v), memory_order_relaxed)
#define CTR_SUB(t, f, v) atomic_fetch_sub_explicit(&(t)->f, (v), memory_order_relaxed)
#define CTR_GET(t, f) atomic_load_explicit(&(t)->f, memory_order_relaxed)

/* ---- ssd.c ---- */

/* ssd_wake: tell the daemon that waiting requests may go on (cfg.wake). */
void ssd_wake(struct ssd *t);

/*
 * Forgets: index entries to delete at the writer's next commit. new copies
 * the key (NULL when out of memory); push hands one to the writer (qlock);
 * free releases a list.
 */
struct ssd_forget *ssd_forget_new(const struct kv_key *key, const struct store_loc *loc,
                                  uint64_t size);
void ssd_forget_push(struct ssd *t, struct ssd_forget *f);
void ssd_forget_free(struct ssd_forget *f);

/* ---- ssd_bucket.c ---- */

/* ssd_bucket_path: <dir>/bucket-<id as 16 hex digits>.kvb into buf. */
void ssd_bucket_path(const struct ssd *t, uint64_t id, char *buf, size_t len);

/*
 * ssd_dir_each_fn: one file of the tier's directory named bucket-<hex id>.<suffix>;
 * suffix is what follows the dot ("kvb", "kvh", "kvh.tmp", or anything else).
 */
typedef void (*ssd_dir_each_fn)(struct ssd *t, uint64_t id, const char *suffix,
                                const char *name);

/* ssd_dir_each: call fn for every bucket-<id>.* file in t->dir; nothing when it cannot be
 * opened. */
void ssd_dir_each(struct ssd *t, ssd_dir_each_fn fn);

/* ssd_dir_unlink: log that t->dir/name goes and why, and unlink it (a file already gone is
 * no error). */
void ssd_dir_unlink(const struct ssd *t, const char *name, const char *why);

/* ssd_bucket_find_locked: bucket id, or NULL (blk held, or start-up: one thread). */
struct ssd_bucket *ssd_bucket_find_locked(const struct ssd *t, uint64_t id);

/* ssd_bucket_insert: add b to the table (sorted by id). 0 or -ENOMEM. */
int ssd_bucket_insert(struct ssd *t, struct ssd_bucket *b);

/*
 * ssd_bucket_ref / ssd_bucket_unref: a reader's reference, so the file is
 * not unlinked under it; ref gives NULL for a bucket gone or going. unref
 * with read_ok stamps the bucket read now (for lru).
 */
struct ssd_bucket *ssd_bucket_ref(struct ssd *t, uint64_t id);
void ssd_bucket_unref(struct ssd *t, struct ssd_bucket *b, bool read_ok);

/* ssd_bucket_account: add delta to bucket id's live bytes. false: no such bucket. */
bool ssd_bucket_account(struct ssd *t, uint64_t id, int64_t delta);

/* ssd_bucket_record: b as its index record. */
void ssd_bucket_record(const struct ssd_bucket *b, struct idx_bucket *r);

/* ssd_fold_stamp_locked: take DRAM hits on b's objects into its last read time (blk held). */
void ssd_fold_stamp_locked(struct ssd *t, struct ssd_bucket *b);

/* Writer thread only from here. */

/*
 * ssd_bucket_create: a new empty bucket file of owner, in the table and
 * open. Its directory entry is synced by the next ssd_dir_sync, which must
 * come before an index commit names the bucket. 0 or -errno.
 */
int ssd_bucket_create(struct ssd *t, uint32_t owner, struct ssd_bucket **out);

/*
 * ssd_dir_sync: fsync the tier's directory if a bucket was created since
 * the last sync (one journal commit with the group's fdatasync, not a
 * stall before the group's first write). 0 or -errno.
 */
int ssd_dir_sync(struct ssd *t);

/*
 * ssd_bucket_drop: evict b: unindex its objects in one transaction, take
 * them out of the store, wait for reads in flight, close and unlink the
 * file, free b. Returns the objects dropped.
 */
uint64_t ssd_bucket_drop(struct ssd *t, struct ssd_bucket *b, const char *why);

/*
 * ssd_open_of: owner's open bucket, or NULL. ssd_unopen: b takes no more
 * records (sealed when it holds any); a no-op for a bucket that is not open.
 */
struct ssd_bucket *ssd_open_of(const struct ssd *t, uint32_t owner);
void ssd_unopen(struct ssd *t, struct ssd_bucket *b);

/*
 * ssd_make_room: evict buckets until `need` more bytes for a record of
 * owner stay under the high watermark. Victims are shared buckets and
 * those of owners past their share first; buckets of owners within their
 * share only when they are owner's own. Returns 0, or KV_NO_SPACE when the
 * record would take the tier past its size (everything left is guarded).
 */
int ssd_make_room(struct ssd *t, uint64_t need, uint32_t owner);

/*
 * ssd_share_room: a record of `need` bytes for owner (a tenant with an SSD
 * share) fits in its share: its own buckets (every byte written, dead or
 * live) plus need stay within the share, its oldest going first (by the
 * eviction rule). Returns 0, or KV_QUOTA_EXCEEDED when they cannot (the
 * record is larger than the share, or every one of its buckets is being
 * written by this group). 0 at once for owner 0.
 */
int ssd_share_room(struct ssd *t, uint32_t owner, uint64_t need);

/* ---- ssd_rebuild.c ---- */

#define SSD_SCAN_BUF (8ull << 20)       /* the rebuild reads bucket files in pieces this big */
#define SSD_SCAN_MAX_KEY 65536u         /* the longest key a record may hold (the writer's cap) */
#define SSD_SCAN_MAX_VALUE (1ull << 50) /* a sanity bound only: a record must fit in its file */
#define SSD_VERIFY_TIMEOUT_S 120       /* the index walk in a child process (idx_verify) */
#define SSD_LOAD_REBUILD 1              /* ssd_load_index: the index must be rebuilt */
#define SSD_REBUILD_BATCH 8192          /* index entries per rebuild transaction */

/*
 * ssd_set_aside: rename path to <path>.broken-<UTC time> (-<n> when taken)
 * and log why. 0, or -errno (it stays where it is).
 */
int ssd_set_aside(struct ssd *t, const char *path, const char *why);

/* ssd_count_bucket_files: bucket files in t->dir (0 when it cannot be read). */
size_t ssd_count_bucket_files(struct ssd *t);

/* ssd_bucket_file_ids: the ids of the bucket files in t->dir, sorted (*n; free() it). */
uint64_t *ssd_bucket_file_ids(struct ssd *t, size_t *n);

/*
 * ssd_rebuild: the writer thread's first task when t->rebuild: walk every
 * bucket file (ssd_scan.h), index the verified records in the (empty)
 * index, newest record of a key winning, cut files back to their last whole
 * record, then load the index into the store as at a normal start and mark
 * the tier READY. Objects put meanwhile win over the records of their keys.
 * Stops early (the index stays unmarked, so the next start rebuilds again)
 * when the tier is closing. Returns 0 or an error (logged; the tier then
 * stays empty of what it could not index).
 */
int ssd_rebuild(struct ssd *t);

/*
 * ssd_bucket_entries: the index entries of bucket id, copied out (a list
 * of forgets: key, location, size; the caller frees it with
 * ssd_forget_free). *oom when some could not be copied.
 */
struct ssd_forget *ssd_bucket_entries(struct ssd *t, uint64_t id, bool *oom);

/* ---- ssd_sumfile.c: bucket summaries on the tier (ssd_summary.h is the format) ---- */

#define SSD_SUM_MAX (1ull << 30)        /* a summary file larger than this is not read */

/* ssd_sumfile_path: <dir>/bucket-<id as 16 hex digits>.kvh into buf. */
void ssd_sumfile_path(const struct ssd *t, uint64_t id, char *buf, size_t len);

/*
 * ssd_sumfile_start: b (new, empty) lists its records from now on. Writer
 * thread. Costs nothing until the first record.
 */
void ssd_sumfile_start(struct ssd_bucket *b);

/*
 * ssd_sumfile_add: b's record rec was written at file offset `offset`. Out
 * of memory, b stops listing (it is scanned at a rebuild, as before).
 */
void ssd_sumfile_add(struct ssd_bucket *b, const struct ssd_rec *rec, uint64_t offset);

/* ssd_sumfile_commit: b's records written so far are committed (committed_bytes). */
void ssd_sumfile_commit(struct ssd_bucket *b);

/* ssd_sumfile_rollback: b was cut back to its last commit: forget the rest. */
void ssd_sumfile_rollback(struct ssd_bucket *b);

/* ssd_sumfile_free: release b's list (b stops listing). NULL-safe on b->sum. */
void ssd_sumfile_free(struct ssd_bucket *b);

/*
 * ssd_sumfile_write_sealed: write the summary of every sealed bucket that
 * lists its records and has them all committed (temp name, fsync, rename),
 * then free its list. A failure is logged and costs only a scan at the next
 * rebuild. Writer thread.
 */
void ssd_sumfile_write_sealed(struct ssd *t);

/* ssd_sumfile_remove: unlink bucket id's summary (none is fine). */
void ssd_sumfile_remove(struct ssd *t, uint64_t id);

/*
 * ssd_sumfile_read: bucket id's summary file into *buf (malloc'd, *len
 * bytes; the caller frees it). 0; KV_NOT_FOUND when there is none;
 * KV_TOO_LARGE when it is larger than max_len; -errno. Any thread.
 */
int ssd_sumfile_read(const struct ssd *t, uint64_t id, uint64_t max_len, uint8_t **buf,
                     uint64_t *len);

/*
 * ssd_sumfile_remove_orphans: unlink summaries (and temp files) whose
 * bucket is not in the table. Start-up, or the writer thread.
 */
void ssd_sumfile_remove_orphans(struct ssd *t);

/* ---- ssd_scrub.c: the check of summarized buckets' values after a rebuild ---- */

#define SSD_SCRUB_CHUNK (4ull << 20)    /* the scrub reads this much at a time at most */
#define SSD_SCRUB_STEP_MS 50            /* it sleeps (and looks for shutdown) in steps this long */

struct ssd_scrub_item {
    uint64_t id;
    uint64_t covered;           /* bytes its summary covers */
};

/* ssd_scrub_add: bucket id's records up to covered were taken from its summary (writer). */
void ssd_scrub_add(struct ssd *t, uint64_t id, uint64_t covered);

/*
 * ssd_scrub_start: start the scrub thread over the buckets added, when any
 * and ssd_scrub_rate is not 0 (writer thread, once the rebuild is done).
 * It reads each bucket's records at ssd_scrub_rate at most, checks every
 * value its summary lists against the value CRC, and drops the index entry
 * and the store's copy of each one that fails (ssd_scrub_bad). Failing to
 * start is logged; reads still check every value.
 */
void ssd_scrub_start(struct ssd *t);

/* ssd_scrub_join: wait for the scrub thread (after t->stop is set); a no-op when none. */
void ssd_scrub_join(struct ssd *t);

/* ---- ssd_compact.c (writer thread) ---- */

#define SSD_COMPACT_DEAD_FRACTION 8     /* a bucket is compacted once 1/8 of it is dead... */
#define SSD_COMPACT_TIER_DEAD 50        /* ...and the tier's dead bytes pass 1/50 of ssd_size */
#define SSD_COMPACT_CHUNK (4ull << 20)  /* values are copied in pieces this big */

/*
 * ssd_compact_some: when dead records (removed objects, dropped entries)
 * hold more than 1/SSD_COMPACT_TIER_DEAD of ssd_size, copy the live records
 * of the deadest sealed bucket (at least 1/SSD_COMPACT_DEAD_FRACTION dead)
 * forward into its owner's open bucket, commit their new locations, and
 * drop it; at most one bucket per call, and only when the copies fit in
 * ssd_size without evicting anything.
 */
void ssd_compact_some(struct ssd *t);

/*
 * ssd_compact: compact b now (see ssd_compact_some). Returns the records
 * moved, or a negative errno when a write, sync or commit failed (then
 * logged, counted, the copies cut off and b kept).
 */
int64_t ssd_compact(struct ssd *t, struct ssd_bucket *b);

/* ---- ssd_writer.c ---- */

/* ssd_pwritev_all: the whole of iov at off (EINTR and short writes retried): 0 or -errno. */
int ssd_pwritev_all(int fd, struct iovec *iov, int n, uint64_t off);

/* ssd_bucket_limit: the size at which owner's open bucket is sealed. */
uint64_t ssd_bucket_limit(struct ssd *t, uint32_t owner);

/* ssd_rollback: cut b back to its last commit and seal it. */
void ssd_rollback(struct ssd *t, struct ssd_bucket *b);

/*
 * ssd_fault: a write, sync or commit failed (rc, what): log, count, suspend
 * writes for SSD_RETRY_MS; b, when not NULL, is dropped with its records.
 */
void ssd_fault(struct ssd *t, struct ssd_bucket *b, int rc, const char *what);

/* ssd_writer_main: the writer thread (pthread start routine; arg is the struct ssd). */
void *ssd_writer_main(void *arg);

#endif
