/*
 * ssd: the SSD tier. It owns the bucket files under ssd_dir, the LMDB index
 * (through storage/ssd_index.h), its I/O threads and its counters, and it
 * plugs into the store through struct store_tier (store.h): the store hands
 * it objects to write (offload) and objects to read back (load); the tier
 * reports each outcome to the store and, when it drops a bucket, removes
 * that bucket's objects from the store's table.
 *
 * Buckets are append-only files of records (storage/ssd_record.h), each
 * aligned to 4 KiB so values go between arena pages and the disk with
 * O_DIRECT where the filesystem allows it. One writer thread appends, syncs
 * (fdatasync) and only then commits the index entries that make the records
 * visible, one transaction and one sync per group of objects. Readers
 * (ssd_io_threads) read values straight into arena pages and verify their
 * CRC-32C before the object becomes resident; a mismatch drops the entry.
 * When usage passes the high watermark, whole buckets are evicted (FIFO by
 * age or LRU by last read; buckets mostly dead go first) down to the low
 * watermark.
 *
 * Threads: the writer thread alone touches the index, creates, seals and
 * drops buckets. Reader threads only read bucket files they hold a
 * reference on. The store's hooks only queue (they are called under store
 * shard locks). No event loop ever waits on this module; completions are
 * announced through cfg.wake (called from tier threads with no lock held).
 */
#ifndef SSD_H
#define SSD_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct ssd;
struct store;

enum ssd_eviction { SSD_FIFO = 0, SSD_LRU = 1 };
enum ssd_offload { SSD_ON_EVICT = 0, SSD_WRITE_THROUGH = 1, SSD_OFFLOAD_OFF = 2 };

struct ssd_config {
    const char *dir;            /* ssd_dir; created 0700 when missing */
    uint64_t size;              /* ssd_size: bytes of bucket files at most */
    uint64_t bucket_size;       /* ssd_bucket_size */
    int eviction;               /* enum ssd_eviction */
    double high_watermark;      /* ssd_high_watermark */
    double low_watermark;       /* ssd_low_watermark */
    int offload;                /* enum ssd_offload */
    bool promote;               /* ssd_promote */
    uint64_t write_rate_limit;  /* ssd_write_rate_limit: bytes/s of on-evict offloads; 0: none */
    uint64_t scrub_rate;        /* ssd_scrub_rate: bytes/s the scrub after a rebuild reads at
                                   most; 0: no scrub */
    int io_threads;             /* ssd_io_threads (readers) */
    uint32_t max_key_size;      /* longest key a record may carry */
    uint64_t max_value_size;
    void (*wake)(void *arg);    /* a load or a write finished: retry waiting requests */
    void *wake_arg;
};

struct ssd_stats {
    uint64_t objects;           /* objects indexed on SSD */
    uint64_t bytes;             /* their value bytes */
    uint64_t disk_bytes;        /* bytes of bucket files */
    uint64_t capacity;          /* ssd_size */
    uint64_t buckets;
    uint64_t hits;              /* objects read back and verified */
    uint64_t reads;             /* read attempts */
    uint64_t read_bytes;
    uint64_t writes;            /* objects written and indexed */
    uint64_t write_bytes;
    uint64_t syncs;             /* group commits (fdatasync + index transaction) */
    uint64_t evicted_buckets;
    uint64_t evicted_objects;
    uint64_t checksum_errors;   /* values that failed their CRC (dropped, never served) */
    uint64_t direct_reads;      /* values read straight into client memory (also in hits) */
    uint64_t io_errors;         /* EIO and other read/write/sync failures */
    uint64_t no_space;          /* ENOSPC / map full */
    uint64_t write_failed;      /* objects that could not be written */
    uint64_t queue_objects;     /* offloads pending */
    uint64_t queue_bytes;
    uint64_t offload_dropped;   /* evicted from DRAM uncopied: the offload queue over its bound,
                                   or refused by the write-rate admission */
    uint64_t rate_limited;      /* of those, refused by the admission of ssd_write_rate_limit */
    uint64_t live_bytes;        /* record bytes of indexed objects (header blocks included) */
    uint64_t compacted_buckets; /* buckets whose live records were copied forward, then dropped */
    uint64_t compacted_bytes;   /* record bytes those copies wrote */
    uint64_t load_queue;        /* loads pending */
    uint64_t degraded;          /* 1 while writes are suspended after a fault */
    uint64_t index_map_size;
    uint64_t start_objects;     /* objects indexed at start (after a rebuild: by it) */
    uint64_t start_ms;          /* time the start-up index load took */
    uint64_t state;             /* enum ssd_state */
    uint64_t rebuilds;          /* 1 when this start rebuilds (or rebuilt) the index */
    uint64_t rebuild_buckets;   /* bucket files the rebuild walks */
    uint64_t rebuild_buckets_done;
    uint64_t rebuild_records;   /* whole, verified records found so far */
    uint64_t rebuild_ms;        /* time the rebuild took (so far, while loading) */
    uint64_t set_aside;         /* indexes or directories moved aside at this start */
    uint64_t rebuild_summary_buckets;   /* buckets the rebuild took from their summaries */
    uint64_t rebuild_scanned_buckets;   /* buckets it read whole */
    uint64_t scrub_buckets;     /* buckets the scrub after the rebuild checks */
    uint64_t scrub_buckets_done;
    uint64_t scrub_bad;         /* values it found failing their CRC (entries dropped) */
    uint64_t scrub_bytes;       /* bytes it read */
    uint64_t scrub_ms;          /* time it took (so far, while it runs) */
};

/*
 * What the tier can do now. LOADING: the index is being rebuilt from the
 * bucket files in the background; DRAM serves, SSD objects appear when it
 * is done (gets of them miss until then), nothing is written to the SSD.
 * READY: normal. DEGRADED: writes are suspended after a fault (reads go on).
 * OFF: no tier (ssd_state(NULL)).
 */
enum ssd_state { SSD_STATE_OFF = 0, SSD_STATE_LOADING = 1, SSD_STATE_READY = 2,
                 SSD_STATE_DEGRADED = 3 };

/* ssd_state: the tier's enum ssd_state; any thread, no lock; t may be NULL (OFF). */
int ssd_state(const struct ssd *t);

/* ssd_state_name: "off", "loading", "ready" or "degraded". */
const char *ssd_state_name(int state);

/* One bucket as the eviction rule sees it. */
struct ssd_bucket_view {
    uint64_t id;                /* ids grow with creation: the smallest is the oldest */
    uint64_t last_read_ms;
    uint64_t live_bytes;
    uint64_t total_bytes;
    bool eligible;              /* false: the open bucket, or one being written or dropped */
};

/*
 * ssd_pick_victim: the index in v[0..n) of the bucket eviction takes next,
 * or -1 when none is eligible. A bucket more than half dead (live bytes
 * under half its total) goes first, the deadest of them; otherwise fifo
 * takes the oldest (smallest id) and lru the least recently read (oldest
 * last_read_ms; ties to the older bucket). Pure function, for tests too.
 */
int ssd_pick_victim(const struct ssd_bucket_view *v, size_t n, int eviction);

/*
 * ssd_open: lock ssd_dir (a second daemon on it is refused), open the
 * index, reconcile it with the bucket files (unindexed tails truncated,
 * orphan files removed, records of missing files or past a bucket's cut
 * dropped), index every object in the store as non-resident, start the
 * threads and attach to the store. s must not be shared with other threads
 * yet.
 *
 * Damage does not stop it: an index that cannot be opened or read (LMDB
 * reports it corrupt or invalid, a read fails, data.mdb is cut short, an
 * entry makes no sense) is renamed <ssd_dir>/index.broken-<time> and
 * rebuilt from the bucket files by the writer thread after ssd_open has
 * returned (state LOADING; likewise when the index is missing and bucket
 * files are there); an ssd_dir that cannot be used at all (not a
 * directory, unreadable) is renamed <ssd_dir>.broken-<time> and the tier
 * starts empty. Each is logged.
 * Returns 0 and *out, or an error with a message in err naming the path
 * and the reason: KV_BUSY (locked by another process), KV_UNSUPPORTED (the
 * index holds a format this build does not read), -ENOMEM, or an error of
 * a directory that could be neither used nor moved aside.
 */
int ssd_open(const struct ssd_config *cfg, struct store *s, struct ssd **out, char *err,
             size_t errlen);

/*
 * ssd_close: finish queued writes, stop the threads, detach from the
 * store, close the index and unlock. Accepts NULL. No event loop may be
 * running requests any more.
 */
void ssd_close(struct ssd *t);

/*
 * ssd_reconfigure: apply reloadable settings (watermarks, eviction, offload,
 * promote, bucket size, write rate limit).
 */
void ssd_reconfigure(struct ssd *t, const struct ssd_config *cfg);

/* ssd_stats: a snapshot of the counters. */
void ssd_stats(struct ssd *t, struct ssd_stats *out);

#endif
