/*
 * ssd: the SSD tier behind ssd.h: bucket files, the writer and reader
 * threads, bucket eviction and fault handling. It talks to LMDB only
 * through ssd_index.h and to objects only through store.h; it never runs
 * on an event loop and never holds its own locks while calling the store.
 *
 * Order of a write: records are appended to the open bucket, the bucket is
 * synced (fdatasync), then one index transaction makes the group visible,
 * then the store learns that the objects are stored. A crash at any point
 * leaves either a visible record that is on disk or an unindexed tail that
 * the next start truncates. A failed write or sync is never retried: the
 * bucket is dropped with everything in it (Linux may have thrown away the
 * dirty pages a failed fsync reported, so a retry could "succeed" over lost
 * data), writes stop for a while (degraded: DRAM eviction no longer waits
 * for the SSD) and resume by themselves.
 *
 * Reclaim: a sealed bucket whose live bytes fell under half of its size
 * (objects removed) is evicted before any other, so dead records never hold
 * space longer than the next eviction. Copying live records forward
 * (compaction) would keep them, but costs a write of every live byte on a
 * device whose contents are a cache; memcached's extstore makes the same
 * choice for the same reason.
 */
#include "ssd.h"

#include "crc32c.h"
#include "kverr.h"
#include "ssd_index.h"
#include "ssd_record.h"
#include "store.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#include "log.h"

#define SSD_GROUP_OBJECTS 64            /* objects per group commit at most */
#define SSD_GROUP_BYTES (64ull << 20)   /* and record bytes */
#define SSD_RETRY_MS 1000               /* writes stay suspended this long after a fault */
#define SSD_HOUSEKEEP_MS 100            /* the writer wakes at least this often */
#define SSD_LAST_READ_SAVE_MS 1000      /* bucket read stamps reach the index this often */
#define SSD_COLD_BATCH (64ull << 20)    /* on-evict: bytes queued ahead per idle round */
#define SSD_MAP_INITIAL (64ull << 20)
#define SSD_MAP_MAX (1ull << 40)
#define SSD_PATH_MAX 4096
#define SSD_STAMP_SLOTS 65536u          /* read stamps of DRAM hits, by bucket id modulo this */

struct ssd_bucket {
    uint64_t id;
    int fd;
    bool direct;                /* opened with O_DIRECT */
    bool sealed;
    bool dropping;              /* readers may not take new references */
    bool dirty;                 /* changed since its index record was written */
    bool in_group;              /* holds records of the group being committed: not a victim */
    int readers;                /* references held by reader threads */
    uint64_t created_ms;
    uint64_t last_read_ms;
    uint64_t live_bytes;        /* record bytes of indexed objects */
    uint64_t total_bytes;       /* bytes written */
    uint64_t committed_bytes;   /* bytes synced and indexed: what a restart keeps */
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

    /* writer thread only */
    struct ssd_bucket *open;
    uint64_t next_id;
    uint64_t seq;
    uint8_t *hdr;               /* aligned header block buffer */
    uint64_t hdr_cap;
    bool degraded;
    uint64_t retry_at;
    uint64_t stamps_saved_at;

    pthread_t writer;
    pthread_t *readers;
    int nreaders;
    bool writer_started;

    /* reloadable settings */
    _Atomic uint64_t bucket_size;
    _Atomic int eviction;
    _Atomic uint64_t high_bytes;
    _Atomic uint64_t low_bytes;
    _Atomic int offload;

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
    _Atomic uint64_t io_errors;
    _Atomic uint64_t no_space;
    _Atomic uint64_t write_failed;
    _Atomic uint64_t queue_objects;
    _Atomic uint64_t queue_bytes;
    _Atomic uint64_t load_queue;
    _Atomic uint64_t degraded_flag;
    uint64_t start_objects;
    uint64_t start_ms;

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

/* ---- small helpers ---- */

static uint64_t
ssd_now_ms(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

static uint64_t
ssd_wall_ms(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_REALTIME, &ts);
    return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

static void
ssd_err(char *err, size_t errlen, const char *fmt, ...)
{
    va_list ap;

    if (err == NULL || errlen == 0) {
        return;
    }
    va_start(ap, fmt);
    vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
}

static void
ssd_bucket_path(const struct ssd *t, uint64_t id, char *buf, size_t len)
{
    snprintf(buf, len, "%s/bucket-%016" PRIx64 ".kvb", t->dir, id);
}

static void
ssd_wake(struct ssd *t)
{
    if (t->cfg.wake != NULL) {
        t->cfg.wake(t->cfg.wake_arg);
    }
}

static void
ssd_apply_settings(struct ssd *t, const struct ssd_config *cfg)
{
    atomic_store(&t->bucket_size, cfg->bucket_size);
    atomic_store(&t->eviction, cfg->eviction);
    atomic_store(&t->high_bytes, (uint64_t)(cfg->high_watermark * (double)cfg->size));
    atomic_store(&t->low_bytes, (uint64_t)(cfg->low_watermark * (double)cfg->size));
    atomic_store(&t->offload, cfg->offload);
}

/* Full-length pwritev/preadv: -errno, or (read) the bytes read, short only at end of file. */
static int
ssd_pwritev_all(int fd, struct iovec *iov, int n, uint64_t off)
{
    while (n > 0) {
        ssize_t w = pwritev(fd, iov, n, (off_t)off);

        if (w < 0) {
            if (errno == EINTR) {
                continue;
            }
            return -errno;
        }
        if (w == 0) {
            return -EIO;
        }
        off += (uint64_t)w;
        while (n > 0 && (size_t)w >= iov->iov_len) {
            w -= (ssize_t)iov->iov_len;
            iov++;
            n--;
        }
        if (n > 0) {
            iov->iov_base = (uint8_t *)iov->iov_base + w;
            iov->iov_len -= (size_t)w;
        }
    }
    return 0;
}

static int64_t
ssd_preadv_all(int fd, struct iovec *iov, int n, uint64_t off)
{
    int64_t done = 0;

    while (n > 0) {
        ssize_t r = preadv(fd, iov, n, (off_t)off);

        if (r < 0) {
            if (errno == EINTR) {
                continue;
            }
            return -errno;
        }
        if (r == 0) {
            break;
        }
        off += (uint64_t)r;
        done += r;
        while (n > 0 && (size_t)r >= iov->iov_len) {
            r -= (ssize_t)iov->iov_len;
            iov++;
            n--;
        }
        if (n > 0) {
            iov->iov_base = (uint8_t *)iov->iov_base + r;
            iov->iov_len -= (size_t)r;
        }
    }
    return done;
}

/* ---- the bucket table (blk) ---- */

static size_t
ssd_bucket_pos_locked(const struct ssd *t, uint64_t id)
{
    size_t lo = 0;
    size_t hi = t->nbuckets;

    while (lo < hi) {
        size_t mid = (lo + hi) / 2;

        if (t->buckets[mid]->id < id) {
            lo = mid + 1;
        } else {
            hi = mid;
        }
    }
    return lo;
}

static struct ssd_bucket *
ssd_bucket_find_locked(const struct ssd *t, uint64_t id)
{
    size_t i = ssd_bucket_pos_locked(t, id);

    return i < t->nbuckets && t->buckets[i]->id == id ? t->buckets[i] : NULL;
}

static int
ssd_bucket_insert(struct ssd *t, struct ssd_bucket *b)
{
    size_t i;

    pthread_mutex_lock(&t->blk);
    if (t->nbuckets == t->cap) {
        size_t ncap = t->cap != 0 ? t->cap * 2 : 64;
        struct ssd_bucket **nb = realloc(t->buckets, ncap * sizeof(*nb));

        if (nb == NULL) {
            pthread_mutex_unlock(&t->blk);
            return -ENOMEM;
        }
        t->buckets = nb;
        t->cap = ncap;
    }
    i = ssd_bucket_pos_locked(t, b->id);
    memmove(&t->buckets[i + 1], &t->buckets[i], (t->nbuckets - i) * sizeof(*t->buckets));
    t->buckets[i] = b;
    t->nbuckets++;
    pthread_mutex_unlock(&t->blk);
    return 0;
}

/* ssd_bucket_ref: a reader's reference on bucket id, or NULL when it is gone or going. */
static struct ssd_bucket *
ssd_bucket_ref(struct ssd *t, uint64_t id)
{
    struct ssd_bucket *b;

    pthread_mutex_lock(&t->blk);
    b = ssd_bucket_find_locked(t, id);
    if (b != NULL && b->dropping) {
        b = NULL;
    }
    if (b != NULL) {
        b->readers++;
    }
    pthread_mutex_unlock(&t->blk);
    return b;
}

static void
ssd_bucket_unref(struct ssd *t, struct ssd_bucket *b, bool read_ok)
{
    pthread_mutex_lock(&t->blk);
    if (read_ok) {
        b->last_read_ms = ssd_wall_ms();
        b->dirty = true;
    }
    if (--b->readers == 0 && b->dropping) {
        pthread_cond_broadcast(&t->bcond);
    }
    pthread_mutex_unlock(&t->blk);
}

/* ssd_bucket_account: live bytes change for bucket id (record bytes). false: no such bucket. */
static bool
ssd_bucket_account(struct ssd *t, uint64_t id, int64_t delta)
{
    struct ssd_bucket *b;

    pthread_mutex_lock(&t->blk);
    b = ssd_bucket_find_locked(t, id);
    if (b != NULL) {
        if (delta < 0 && (uint64_t)-delta > b->live_bytes) {
            b->live_bytes = 0;
        } else {
            b->live_bytes += (uint64_t)delta;
        }
        b->dirty = true;
    }
    pthread_mutex_unlock(&t->blk);
    return b != NULL;
}

static void
ssd_bucket_record(const struct ssd_bucket *b, struct idx_bucket *r)
{
    memset(r, 0, sizeof(*r));
    r->id = b->id;
    r->created_ms = b->created_ms;
    r->last_read_ms = b->last_read_ms;
    r->live_bytes = b->live_bytes;
    r->total_bytes = b->total_bytes;
    r->flags = b->sealed ? IDX_BUCKET_SEALED : 0;
}

/* ---- queues (the store's hooks run under a shard lock: queue and return) ---- */

static void
ssd_hook_offload(void *arg, struct store_obj *o)
{
    struct ssd *t = arg;

    store_obj_set_link(o, NULL);
    pthread_mutex_lock(&t->qlock);
    if (t->wq_tail != NULL) {
        store_obj_set_link(t->wq_tail, o);
    } else {
        t->wq_head = o;
    }
    t->wq_tail = o;
    pthread_cond_signal(&t->wcond);
    pthread_mutex_unlock(&t->qlock);
    CTR_ADD(t, queue_objects, 1);
    CTR_ADD(t, queue_bytes, store_obj_size(o));
}

static uint64_t
ssd_wall_coarse_ms(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_REALTIME_COARSE, &ts);
    return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

static void
ssd_hook_touch(void *arg, uint32_t bucket)
{
    struct ssd *t = arg;
    _Atomic uint64_t *slot = &t->stamps[bucket % SSD_STAMP_SLOTS];
    uint64_t now = ssd_wall_coarse_ms();

    if (atomic_load_explicit(slot, memory_order_relaxed) < now) {
        atomic_store_explicit(slot, now, memory_order_relaxed);
    }
}

/* ssd_fold_stamp_locked: take DRAM hits into a bucket's last read time (blk held). */
static void
ssd_fold_stamp_locked(struct ssd *t, struct ssd_bucket *b)
{
    uint64_t v = atomic_load_explicit(&t->stamps[b->id % SSD_STAMP_SLOTS], memory_order_relaxed);

    if (v > b->last_read_ms && v >= b->created_ms) {
        b->last_read_ms = v;
        b->dirty = true;
    }
}

static void
ssd_hook_load(void *arg, struct store_obj *o)
{
    struct ssd *t = arg;

    store_obj_set_link(o, NULL);
    pthread_mutex_lock(&t->qlock);
    if (t->rq_tail != NULL) {
        store_obj_set_link(t->rq_tail, o);
    } else {
        t->rq_head = o;
    }
    t->rq_tail = o;
    pthread_cond_signal(&t->rcond);
    pthread_mutex_unlock(&t->qlock);
    CTR_ADD(t, load_queue, 1);
}

static struct ssd_forget *
ssd_forget_new(const struct kv_key *key, const struct store_loc *loc, uint64_t size)
{
    struct ssd_forget *f = malloc(sizeof(*f) + key->len);

    if (f == NULL) {
        return NULL;
    }
    f->next = NULL;
    f->loc = *loc;
    f->size = size;
    f->tenant = key->tenant;
    f->key_len = key->len;
    if (key->len != 0) {
        memcpy(f->key, key->ptr, key->len);
    }
    return f;
}

static void
ssd_forget_push(struct ssd *t, struct ssd_forget *f)
{
    pthread_mutex_lock(&t->qlock);
    f->next = t->forgets;
    t->forgets = f;
    pthread_cond_signal(&t->wcond);
    pthread_mutex_unlock(&t->qlock);
}

static void
ssd_hook_forget(void *arg, const struct kv_key *key, const struct store_loc *loc, uint64_t size)
{
    struct ssd *t = arg;
    struct ssd_forget *f = ssd_forget_new(key, loc, size);

    if (f == NULL) {
        /* The entry outlives the object; a restart would serve the old value again. */
        log_error("ssd: out of memory forgetting a removed object; its index entry stays");
        return;
    }
    ssd_forget_push(t, f);
}

/* ---- bucket files (writer thread) ---- */

static int
ssd_bucket_create(struct ssd *t, struct ssd_bucket **out)
{
    char path[SSD_PATH_MAX + 64];
    struct ssd_bucket *b = calloc(1, sizeof(*b));
    int rc;

    if (b == NULL) {
        return -ENOMEM;
    }
    b->id = t->next_id++;
    ssd_bucket_path(t, b->id, path, sizeof(path));
    b->fd = open(path, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC | O_DIRECT, 0600);
    b->direct = true;
    if (b->fd < 0 && errno == EINVAL) {
        /* tmpfs and some others refuse O_DIRECT: buffered I/O, same format. */
        b->fd = open(path, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
        b->direct = false;
    }
    if (b->fd < 0) {
        rc = -errno;
        log_error("ssd: open(%s): %s", path, strerror(errno));
        free(b);
        return rc;
    }
    if (fsync(t->dir_fd) != 0) {
        rc = -errno;
        log_error("ssd: fsync(%s): %s", t->dir, strerror(errno));
        close(b->fd);
        unlink(path);
        free(b);
        return rc;
    }
    b->created_ms = ssd_wall_ms();
    b->last_read_ms = b->created_ms;
    rc = ssd_bucket_insert(t, b);
    if (rc != 0) {
        close(b->fd);
        unlink(path);
        free(b);
        return rc;
    }
    *out = b;
    return 0;
}

/*
 * ssd_bucket_drop: evict a bucket: unindex its objects in one transaction,
 * take them out of the store, wait for in-flight reads, unlink the file.
 * Returns the objects dropped.
 */
struct ssd_drop_list {
    struct ssd_forget *head;
    uint64_t n;
    int oom;
};

static int
ssd_collect_fn(void *arg, uint32_t tenant, const uint8_t *key, uint32_t key_len,
               const struct idx_loc *loc)
{
    struct ssd_drop_list *dl = arg;
    struct kv_key k = {.tenant = tenant, .len = key_len, .ptr = key};
    struct store_loc sl = {.bucket = (uint32_t)loc->bucket, .crc = loc->crc, .offset = loc->offset};
    struct ssd_forget *f = ssd_forget_new(&k, &sl, loc->length);

    if (f == NULL) {
        dl->oom = 1;
        return 0;
    }
    f->next = dl->head;
    dl->head = f;
    dl->n++;
    return 0;
}

static uint64_t
ssd_bucket_drop(struct ssd *t, struct ssd_bucket *b, const char *why)
{
    char path[SSD_PATH_MAX + 64];
    struct ssd_drop_list dl = {NULL, 0, 0};
    struct idx_op op;
    uint64_t dropped = 0;
    size_t i;
    int rc;

    (void)idx_scan_bucket_objects(t->idx, b->id, ssd_collect_fn, &dl);
    memset(&op, 0, sizeof(op));
    op.kind = IDX_BUCKET_DROP;
    op.bucket.id = b->id;
    rc = idx_apply(t->idx, &op, 1);
    if (rc != 0) {
        /* The file goes anyway; the next start drops entries whose file is missing. */
        log_error("ssd: dropping bucket %" PRIu64 " from the index: %s", b->id, kv_strerror(rc));
    }
    while (dl.head != NULL) {
        struct ssd_forget *f = dl.head;
        struct kv_key k = {.tenant = f->tenant, .len = f->key_len, .ptr = f->key};

        dl.head = f->next;
        (void)store_drop_stored(t->store, &k, &f->loc);
        CTR_SUB(t, objects, 1);
        CTR_SUB(t, bytes, f->size);
        dropped++;
        free(f);
    }
    if (dl.oom) {
        log_error("ssd: out of memory listing bucket %" PRIu64 "; some entries stay until restart",
                  b->id);
    }

    pthread_mutex_lock(&t->blk);
    b->dropping = true;
    while (b->readers > 0) {
        pthread_cond_wait(&t->bcond, &t->blk);
    }
    i = ssd_bucket_pos_locked(t, b->id);
    if (i < t->nbuckets && t->buckets[i] == b) {
        memmove(&t->buckets[i], &t->buckets[i + 1], (t->nbuckets - i - 1) * sizeof(*t->buckets));
        t->nbuckets--;
    }
    pthread_mutex_unlock(&t->blk);

    if (t->open == b) {
        t->open = NULL;
    }
    ssd_bucket_path(t, b->id, path, sizeof(path));
    close(b->fd);
    if (unlink(path) != 0 && errno != ENOENT) {
        log_error("ssd: unlink(%s): %s", path, strerror(errno));
    }
    CTR_SUB(t, disk_bytes, b->total_bytes);
    CTR_ADD(t, evicted_buckets, 1);
    CTR_ADD(t, evicted_objects, dropped);
    log_info("ssd: dropped bucket %" PRIu64 " (%s): %" PRIu64 " objects, %" PRIu64 " bytes", b->id,
             why, dropped, b->total_bytes);
    free(b);
    return dropped;
}

int
ssd_pick_victim(const struct ssd_bucket_view *v, size_t n, int eviction)
{
    int best = -1;
    int dead = -1;

    for (size_t i = 0; i < n; i++) {
        if (!v[i].eligible) {
            continue;
        }
        if (v[i].live_bytes * 2 < v[i].total_bytes
            && (dead < 0
                || (double)v[i].live_bytes / (double)v[i].total_bytes
                       < (double)v[dead].live_bytes / (double)v[dead].total_bytes)) {
            dead = (int)i;
        }
        if (best < 0 || (eviction == SSD_LRU && v[i].last_read_ms < v[best].last_read_ms)
            || (eviction == SSD_LRU && v[i].last_read_ms == v[best].last_read_ms
                && v[i].id < v[best].id)
            || (eviction != SSD_LRU && v[i].id < v[best].id)) {
            best = (int)i;
        }
    }
    return dead >= 0 ? dead : best;
}

/* ssd_victim: the bucket eviction takes next (never the open one, nor one in the group). */
static struct ssd_bucket *
ssd_victim(struct ssd *t)
{
    struct ssd_bucket_view *v;
    struct ssd_bucket *b = NULL;
    int i;

    pthread_mutex_lock(&t->blk);
    v = malloc((t->nbuckets + 1) * sizeof(*v));
    if (v == NULL) {
        pthread_mutex_unlock(&t->blk);
        return NULL;
    }
    for (size_t k = 0; k < t->nbuckets; k++) {
        struct ssd_bucket *x = t->buckets[k];

        ssd_fold_stamp_locked(t, x);
        v[k].id = x->id;
        v[k].last_read_ms = x->last_read_ms;
        v[k].live_bytes = x->live_bytes;
        v[k].total_bytes = x->total_bytes;
        v[k].eligible = x != t->open && !x->dropping && !x->in_group;
    }
    i = ssd_pick_victim(v, t->nbuckets, atomic_load(&t->eviction));
    if (i >= 0) {
        b = t->buckets[i];
    }
    pthread_mutex_unlock(&t->blk);
    free(v);
    return b;
}

/* ssd_make_room: evict buckets until `need` more bytes stay under the high watermark. */
static void
ssd_make_room(struct ssd *t, uint64_t need)
{
    uint64_t high = atomic_load(&t->high_bytes);
    uint64_t low = atomic_load(&t->low_bytes);

    if (CTR_GET(t, disk_bytes) + need <= high) {
        return;
    }
    while (CTR_GET(t, disk_bytes) + need > low) {
        struct ssd_bucket *v = ssd_victim(t);

        if (v == NULL) {
            if (t->open != NULL && t->open->total_bytes > 0) {
                /* Only the open bucket is left: seal it so that it can go too. */
                t->open->sealed = true;
                t->open->dirty = true;
                t->open = NULL;
                continue;
            }
            return;
        }
        ssd_bucket_drop(t, v, "evicted");
    }
}

/* ---- the writer ---- */

/*
 * ssd_rollback: cut a bucket back to what its last commit made visible
 * (records after that were never indexed) and seal it. Its committed records
 * were synced by an fdatasync that succeeded, so they stay.
 */
static void
ssd_rollback(struct ssd *t, struct ssd_bucket *b)
{
    if (b->total_bytes > b->committed_bytes) {
        if (ftruncate(b->fd, (off_t)b->committed_bytes) != 0) {
            log_error("ssd: ftruncate of bucket %" PRIu64 ": %s", b->id, strerror(errno));
        }
        CTR_SUB(t, disk_bytes, b->total_bytes - b->committed_bytes);
    }
    pthread_mutex_lock(&t->blk);
    b->total_bytes = b->committed_bytes;
    b->sealed = true;
    b->dirty = true;
    pthread_mutex_unlock(&t->blk);
    if (t->open == b) {
        t->open = NULL;
    }
}

/*
 * ssd_fault: a write, sync or commit failed: suspend writes. b, when not
 * NULL, is dropped with everything in it (a failed fdatasync or an I/O
 * error: its data cannot be trusted); a full disk only costs the records
 * not committed yet, which the caller rolled back.
 */
static void
ssd_fault(struct ssd *t, struct ssd_bucket *b, int rc, const char *what)
{
    if (rc == -ENOSPC || rc == KV_NO_SPACE) {
        CTR_ADD(t, no_space, 1);
    } else {
        CTR_ADD(t, io_errors, 1);
    }
    if (b != NULL) {
        log_error("ssd: %s in %s: %s; dropping bucket %" PRIu64 ", writes suspended for %d ms",
                  what, t->dir, kv_strerror(rc), b->id, SSD_RETRY_MS);
        ssd_bucket_drop(t, b, "write failed");
    } else {
        log_error("ssd: %s in %s: %s; uncommitted records cut off, writes suspended for %d ms",
                  what, t->dir, kv_strerror(rc), SSD_RETRY_MS);
    }
    if (!t->degraded) {
        t->degraded = true;
        atomic_store(&t->degraded_flag, 1);
        store_tier_degraded(t->store, true);
    }
    t->retry_at = ssd_now_ms() + SSD_RETRY_MS;
}

static void
ssd_recovered(struct ssd *t)
{
    if (t->degraded) {
        t->degraded = false;
        atomic_store(&t->degraded_flag, 0);
        store_tier_degraded(t->store, false);
        log_info("ssd: writes to %s work again", t->dir);
    }
}

/* ssd_seal: no more records go to the open bucket. Its data was synced with its last group. */
static void
ssd_seal(struct ssd *t)
{
    if (t->open != NULL) {
        pthread_mutex_lock(&t->blk);
        t->open->sealed = true;
        t->open->dirty = true;
        pthread_mutex_unlock(&t->blk);
        t->open = NULL;
    }
}

/*
 * ssd_append: write one object's record at the end of the open bucket
 * (opening one when needed). Returns 0 and *loc, or an error (the caller
 * fails the group).
 */
static int
ssd_append(struct ssd *t, struct store_obj *o, struct store_loc *loc, uint64_t *rec_bytes,
           struct ssd_bucket **used)
{
    struct iovec iov[STORE_MAX_EXTENTS + 1];
    struct kv_key key;
    struct ssd_rec rec;
    uint64_t size = store_obj_size(o);
    uint64_t span = ssd_rec_value_span(size);
    uint64_t hdr_block;
    uint64_t rec_size;
    uint64_t left;
    uint32_t crc;
    int n;
    int rc;

    store_obj_key(o, &key);
    hdr_block = ssd_rec_hdr_block(key.len);
    rec_size = hdr_block + span;
    if (hdr_block > t->hdr_cap || rec_size > t->cfg.size) {
        return KV_TOO_LARGE;
    }
    ssd_make_room(t, rec_size);
    if (t->open != NULL && t->open->total_bytes > 0
        && t->open->total_bytes + rec_size > atomic_load(&t->bucket_size)) {
        ssd_seal(t);
    }
    if (t->open == NULL) {
        rc = ssd_bucket_create(t, &t->open);
        if (rc != 0) {
            return rc;
        }
    }
    *used = t->open;

    n = store_obj_iov(o, iov + 1, STORE_MAX_EXTENTS);
    crc = ssd_rec_key_crc(key.tenant, key.ptr, key.len);
    for (int i = 1; i <= n; i++) {
        crc = crc32c_extend(crc, iov[i].iov_base, iov[i].iov_len);
    }
    if (n > 0 && span > size) {
        /* Zero the last page's slack (no stale bytes on disk) and write whole pages. */
        memset((uint8_t *)iov[n].iov_base + iov[n].iov_len, 0, span - size);
        iov[n].iov_len += span - size;
    }
    left = span;
    for (int i = 1; i <= n; i++) {
        left -= iov[i].iov_len;
    }
    (void)left;

    memset(&rec, 0, sizeof(rec));
    rec.tenant = key.tenant;
    rec.key_len = key.len;
    rec.value_len = size;
    rec.seq = ++t->seq;
    rec.value_crc = crc;
    rec.key = key.ptr;
    ssd_rec_encode(&rec, t->hdr);
    iov[0].iov_base = t->hdr;
    iov[0].iov_len = hdr_block;

    rc = ssd_pwritev_all(t->open->fd, iov, n + 1, t->open->total_bytes);
    if (rc != 0) {
        return rc;
    }
    loc->bucket = (uint32_t)t->open->id;
    loc->crc = crc;
    loc->offset = t->open->total_bytes + hdr_block;
    pthread_mutex_lock(&t->blk);
    t->open->total_bytes += rec_size;
    t->open->live_bytes += rec_size;
    t->open->dirty = true;
    pthread_mutex_unlock(&t->blk);
    CTR_ADD(t, disk_bytes, rec_size);
    *rec_bytes = rec_size;
    return 0;
}

struct ssd_group {
    struct store_obj *obj[SSD_GROUP_OBJECTS];
    struct store_loc loc[SSD_GROUP_OBJECTS];
    uint64_t rec[SSD_GROUP_OBJECTS];
    int n;
};

static void
ssd_group_fail(struct ssd *t, struct ssd_group *g, int from)
{
    for (int i = from; i < g->n; i++) {
        store_obj_store_failed(t->store, g->obj[i]);
        store_obj_unref(t->store, g->obj[i]);
        CTR_ADD(t, write_failed, 1);
    }
    g->n = from;
}

/*
 * ssd_group_unwrite: the group failed: its first `written` records will never
 * be indexed (their bytes stay dead in their buckets); every object is
 * reported failed.
 */
static void
ssd_group_unwrite(struct ssd *t, struct ssd_group *g, int written)
{
    for (int i = 0; i < g->n; i++) {
        if (g->obj[i] == NULL) {
            continue;
        }
        if (i < written) {
            (void)ssd_bucket_account(t, g->loc[i].bucket, -(int64_t)g->rec[i]);
        }
        store_obj_store_failed(t->store, g->obj[i]);
        store_obj_unref(t->store, g->obj[i]);
        CTR_ADD(t, write_failed, 1);
    }
    g->n = 0;
}

/* ssd_forgets_ops: turn pending forgets into index deletes (ops has room for all). */
static size_t
ssd_forget_ops(struct ssd_forget *f, struct idx_op *ops)
{
    size_t n = 0;

    for (; f != NULL; f = f->next) {
        struct idx_op *op = &ops[n++];

        memset(op, 0, sizeof(*op));
        op->kind = IDX_OBJ_DEL;
        op->tenant = f->tenant;
        op->key_len = f->key_len;
        op->key = f->key;
        op->loc.bucket = f->loc.bucket;
        op->loc.offset = f->loc.offset;
    }
    return n;
}

/*
 * ssd_forget_done: account committed deletes. An entry whose bucket is gone
 * was already counted out when the bucket was dropped.
 */
static void
ssd_forget_done(struct ssd *t, const struct ssd_forget *f)
{
    for (; f != NULL; f = f->next) {
        if (ssd_bucket_account(t, f->loc.bucket, -(int64_t)ssd_rec_size(f->key_len, f->size))) {
            CTR_SUB(t, objects, 1);
            CTR_SUB(t, bytes, f->size);
        }
    }
}

/* ssd_forget_requeue: put forgets back for the next commit. */
static void
ssd_forget_requeue(struct ssd *t, struct ssd_forget *f)
{
    while (f != NULL) {
        struct ssd_forget *next = f->next;

        ssd_forget_push(t, f);
        f = next;
    }
}

static void
ssd_forget_free(struct ssd_forget *f)
{
    while (f != NULL) {
        struct ssd_forget *next = f->next;

        free(f);
        f = next;
    }
}

/* Append the records of the buckets that changed since they were last written. */
static size_t
ssd_bucket_ops(struct ssd *t, struct idx_op *ops, size_t max)
{
    size_t n = 0;

    pthread_mutex_lock(&t->blk);
    for (size_t i = 0; i < t->nbuckets && n < max; i++) {
        struct ssd_bucket *b = t->buckets[i];

        ssd_fold_stamp_locked(t, b);
        if (b == t->open || b->dirty) {
            memset(&ops[n], 0, sizeof(ops[n]));
            ops[n].kind = IDX_BUCKET_PUT;
            ssd_bucket_record(b, &ops[n].bucket);
            b->dirty = false;
            n++;
        }
    }
    pthread_mutex_unlock(&t->blk);
    return n;
}

/*
 * ssd_commit_group: write every object of g, sync, and make them visible in
 * one index transaction together with the pending forgets.
 */
static void
ssd_commit_group(struct ssd *t, struct ssd_group *g, struct ssd_forget *forgets)
{
    struct ssd_bucket *touched[SSD_GROUP_OBJECTS + 1];
    struct idx_op *ops;
    struct ssd_forget *late = NULL;
    size_t nforget = 0;
    size_t nops = 0;
    struct ssd_bucket *fault = NULL;
    const char *what = NULL;
    size_t cap;
    int ntouched = 0;
    int written = 0;
    int rc = 0;

    for (struct ssd_forget *f = forgets; f != NULL; f = f->next) {
        nforget++;
    }
    pthread_mutex_lock(&t->blk);
    cap = (size_t)g->n + nforget + t->nbuckets + 8;
    pthread_mutex_unlock(&t->blk);
    ops = calloc(cap + SSD_GROUP_OBJECTS + 2, sizeof(*ops));
    if (ops == NULL) {
        ssd_group_fail(t, g, 0);
        ssd_forget_requeue(t, forgets);
        return;
    }

    for (written = 0; written < g->n; written++) {
        struct ssd_bucket *b = NULL;

        rc = ssd_append(t, g->obj[written], &g->loc[written], &g->rec[written], &b);
        if (rc == KV_TOO_LARGE) {
            /* This object alone cannot go to the SSD; the others can. */
            store_obj_store_failed(t->store, g->obj[written]);
            store_obj_unref(t->store, g->obj[written]);
            CTR_ADD(t, write_failed, 1);
            g->obj[written] = NULL;
            rc = 0;
            continue;
        }
        if (rc != 0) {
            fault = b != NULL ? b : t->open;
            what = "write";
            break;
        }
        if (ntouched == 0 || touched[ntouched - 1] != b) {
            if (ntouched > 0 && fdatasync(touched[ntouched - 1]->fd) != 0) {
                /* The group moved on to a new bucket: the sealed one must be on disk first. */
                rc = -errno;
                fault = touched[ntouched - 1];
                what = "fdatasync";
                written++;
                break;
            }
            touched[ntouched++] = b;
            b->in_group = true;
        }
    }
    if (rc == 0 && ntouched > 0 && fdatasync(touched[ntouched - 1]->fd) != 0) {
        rc = -errno;
        fault = touched[ntouched - 1];
        what = "fdatasync";
    }
    for (int i = 0; i < ntouched; i++) {
        touched[i]->in_group = false;
    }
    if (rc != 0) {
        /* Only a full disk at write time keeps the failing bucket's committed records. */
        bool drop = !(rc == -ENOSPC && strcmp(what, "write") == 0);

        ssd_group_unwrite(t, g, written);
        for (int i = 0; i < ntouched; i++) {
            if (touched[i] != fault || !drop) {
                ssd_rollback(t, touched[i]);
            }
        }
        if (fault != NULL && !drop) {
            ssd_rollback(t, fault);
        }
        ssd_fault(t, drop ? fault : NULL, rc, what);
        free(ops);
        ssd_forget_requeue(t, forgets);
        return;
    }

    for (int i = 0; i < g->n; i++) {
        struct kv_key key;
        struct idx_op *op;

        if (g->obj[i] == NULL) {
            continue;
        }
        store_obj_key(g->obj[i], &key);
        op = &ops[nops++];
        op->kind = IDX_OBJ_PUT;
        op->tenant = key.tenant;
        op->key_len = key.len;
        op->key = key.ptr;
        op->loc.bucket = g->loc[i].bucket;
        op->loc.offset = g->loc[i].offset;
        op->loc.length = store_obj_size(g->obj[i]);
        op->loc.crc = g->loc[i].crc;
    }
    nops += ssd_forget_ops(forgets, ops + nops);
    nops += ssd_bucket_ops(t, ops + nops, cap - nops);
    ops[nops].kind = IDX_META_PUT;
    ops[nops].name = "next_bucket";
    ops[nops].value = t->next_id;
    nops++;
    rc = idx_apply(t->idx, ops, nops);
    free(ops);
    if (rc != 0) {
        /* The records are on disk but were never indexed: cut them off, keep the rest. */
        ssd_group_unwrite(t, g, g->n);
        for (int i = 0; i < ntouched; i++) {
            ssd_rollback(t, touched[i]);
        }
        ssd_fault(t, NULL, rc, "index commit");
        ssd_forget_requeue(t, forgets);
        return;
    }
    pthread_mutex_lock(&t->blk);
    for (int i = 0; i < ntouched; i++) {
        touched[i]->committed_bytes = touched[i]->total_bytes;
    }
    pthread_mutex_unlock(&t->blk);
    CTR_ADD(t, syncs, 1);
    ssd_forget_done(t, forgets);
    ssd_forget_free(forgets);
    ssd_recovered(t);

    for (int i = 0; i < g->n; i++) {
        struct store_obj *o = g->obj[i];

        if (o == NULL) {
            continue;
        }
        CTR_ADD(t, objects, 1);
        CTR_ADD(t, bytes, store_obj_size(o));
        CTR_ADD(t, writes, 1);
        CTR_ADD(t, write_bytes, store_obj_size(o));
        if (store_obj_stored(t->store, o, &g->loc[i]) != 0) {
            /* Removed while it was being written: its fresh entry goes next commit. */
            struct kv_key key;
            struct ssd_forget *f;

            store_obj_key(o, &key);
            f = ssd_forget_new(&key, &g->loc[i], store_obj_size(o));
            if (f != NULL) {
                f->next = late;
                late = f;
            }
        }
        store_obj_unref(t->store, o);
    }
    g->n = 0;
    while (late != NULL) {
        struct ssd_forget *f = late;

        late = f->next;
        ssd_forget_push(t, f);
    }
}

/* Drop buckets that no longer hold a live object, and any readers reported failing. */
static void
ssd_housekeep(struct ssd *t, const uint64_t *drops, int ndrops)
{
    for (int i = 0; i < ndrops; i++) {
        struct ssd_bucket *b;

        pthread_mutex_lock(&t->blk);
        b = ssd_bucket_find_locked(t, drops[i]);
        pthread_mutex_unlock(&t->blk);
        if (b != NULL) {
            ssd_fault(t, b, -EIO, "read");
        }
    }
    for (;;) {
        struct ssd_bucket *empty = NULL;

        pthread_mutex_lock(&t->blk);
        for (size_t i = 0; i < t->nbuckets; i++) {
            struct ssd_bucket *b = t->buckets[i];

            if (b != t->open && !b->dropping && b->live_bytes == 0) {
                empty = b;
                break;
            }
        }
        pthread_mutex_unlock(&t->blk);
        if (empty == NULL) {
            break;
        }
        ssd_bucket_drop(t, empty, "no live objects");
    }
    ssd_make_room(t, 0);
}

static void *
ssd_writer_main(void *arg)
{
    struct ssd *t = arg;
    struct ssd_group g;

    g.n = 0;
    for (;;) {
        struct ssd_forget *forgets;
        uint64_t drops[16];
        uint64_t group_bytes = 0;
        uint64_t now;
        int ndrops;
        bool stop;

        pthread_mutex_lock(&t->qlock);
        if (t->wq_head == NULL && t->forgets == NULL && t->ndrop_req == 0 && !t->stop) {
            struct timespec ts;

            clock_gettime(CLOCK_REALTIME, &ts);
            ts.tv_nsec += SSD_HOUSEKEEP_MS * 1000000L;
            if (ts.tv_nsec >= 1000000000L) {
                ts.tv_sec++;
                ts.tv_nsec -= 1000000000L;
            }
            pthread_cond_timedwait(&t->wcond, &t->qlock, &ts);
        }
        while (t->wq_head != NULL && g.n < SSD_GROUP_OBJECTS && group_bytes < SSD_GROUP_BYTES) {
            struct store_obj *o = t->wq_head;

            t->wq_head = store_obj_link(o);
            if (t->wq_head == NULL) {
                t->wq_tail = NULL;
            }
            store_obj_set_link(o, NULL);
            g.obj[g.n++] = o;
            group_bytes += store_obj_size(o);
        }
        forgets = t->forgets;
        t->forgets = NULL;
        ndrops = t->ndrop_req;
        memcpy(drops, t->drop_req, (size_t)ndrops * sizeof(drops[0]));
        t->ndrop_req = 0;
        stop = t->stop && t->wq_head == NULL;
        pthread_mutex_unlock(&t->qlock);

        for (int i = 0; i < g.n; i++) {
            CTR_SUB(t, queue_objects, 1);
            CTR_SUB(t, queue_bytes, store_obj_size(g.obj[i]));
        }
        now = ssd_now_ms();
        if (g.n > 0 && t->degraded && now < t->retry_at) {
            ssd_group_fail(t, &g, 0);       /* fail fast until the retry time */
        }
        if (g.n > 0 || forgets != NULL) {
            ssd_commit_group(t, &g, forgets);
            ssd_wake(t);
        }
        if (now - t->stamps_saved_at >= SSD_LAST_READ_SAVE_MS) {
            struct idx_op ops[64];
            size_t n = ssd_bucket_ops(t, ops, 64);

            t->stamps_saved_at = now;
            if (n > 0) {
                (void)idx_apply(t->idx, ops, n);
            }
        }
        ssd_housekeep(t, drops, ndrops);
        if (stop) {
            break;
        }
        if (!t->stop && atomic_load(&t->offload) == SSD_ON_EVICT && !t->degraded) {
            pthread_mutex_lock(&t->qlock);
            bool idle = t->wq_head == NULL;
            pthread_mutex_unlock(&t->qlock);
            if (idle) {
                (void)store_offload_cold(t->store, SSD_COLD_BATCH);
            }
        }
    }
    return NULL;
}

/* ---- readers ---- */

static void
ssd_request_drop(struct ssd *t, uint64_t bucket)
{
    pthread_mutex_lock(&t->qlock);
    if (t->ndrop_req < (int)(sizeof(t->drop_req) / sizeof(t->drop_req[0]))) {
        t->drop_req[t->ndrop_req++] = bucket;
        pthread_cond_signal(&t->wcond);
    }
    pthread_mutex_unlock(&t->qlock);
}

/* ssd_load: read o's value into arena pages and check it. Returns a store_load_end rc. */
static int
ssd_load(struct ssd *t, struct store_obj *o)
{
    struct iovec iov[STORE_MAX_EXTENTS];
    struct iovec rd[STORE_MAX_EXTENTS];
    struct store_loc loc;
    struct kv_key key;
    struct ssd_bucket *b;
    uint64_t size = store_obj_size(o);
    uint64_t span = ssd_rec_value_span(size);
    uint64_t left;
    uint32_t crc;
    int64_t got;
    int n = 0;
    int nr = 0;
    int rc;

    store_obj_loc(o, &loc);
    store_obj_key(o, &key);
    CTR_ADD(t, reads, 1);
    b = ssd_bucket_ref(t, loc.bucket);
    if (b == NULL) {
        return KV_NOT_FOUND;
    }
    rc = store_load_begin(t->store, o, iov, STORE_MAX_EXTENTS, &n);
    if (rc != 0) {
        ssd_bucket_unref(t, b, false);
        return rc;
    }
    left = span;
    for (int i = 0; i < n && left > 0; i++) {
        rd[nr] = iov[i];
        if (rd[nr].iov_len > left) {
            rd[nr].iov_len = left;
        }
        left -= rd[nr].iov_len;
        nr++;
    }
    got = ssd_preadv_all(b->fd, rd, nr, loc.offset);
    if (got < 0) {
        log_error("ssd: read of bucket %" PRIu64 " at %" PRIu64 ": %s", (uint64_t)loc.bucket,
                  loc.offset, strerror((int)-got));
        CTR_ADD(t, io_errors, 1);
        ssd_bucket_unref(t, b, false);
        ssd_request_drop(t, loc.bucket);
        return KV_NOT_FOUND;
    }
    crc = ssd_rec_key_crc(key.tenant, key.ptr, key.len);
    left = size;
    for (int i = 0; i < n && left > 0; i++) {
        uint64_t len = iov[i].iov_len < left ? iov[i].iov_len : left;

        crc = crc32c_extend(crc, iov[i].iov_base, len);
        left -= len;
    }
    if ((uint64_t)got < size || crc != loc.crc) {
        log_error("ssd: checksum mismatch in bucket %" PRIu64 " at %" PRIu64
                  " (%" PRIu64 " bytes, read %" PRId64 "): entry dropped",
                  (uint64_t)loc.bucket, loc.offset, size, got);
        CTR_ADD(t, checksum_errors, 1);
        ssd_bucket_unref(t, b, false);
        return KV_CHECKSUM_MISMATCH;
    }
    ssd_bucket_unref(t, b, true);
    CTR_ADD(t, hits, 1);
    CTR_ADD(t, read_bytes, size);
    return 0;
}

static void *
ssd_reader_main(void *arg)
{
    struct ssd *t = arg;

    for (;;) {
        struct store_obj *o;
        struct ssd_forget *f = NULL;
        struct store_loc loc;
        struct kv_key key;
        int rc;

        pthread_mutex_lock(&t->qlock);
        while (t->rq_head == NULL && !t->stop) {
            pthread_cond_wait(&t->rcond, &t->qlock);
        }
        o = t->rq_head;
        if (o == NULL) {
            pthread_mutex_unlock(&t->qlock);
            break;
        }
        t->rq_head = store_obj_link(o);
        if (t->rq_head == NULL) {
            t->rq_tail = NULL;
        }
        store_obj_set_link(o, NULL);
        pthread_mutex_unlock(&t->qlock);
        CTR_SUB(t, load_queue, 1);

        rc = t->stop ? KV_NO_SPACE : ssd_load(t, o);
        if (rc == KV_CHECKSUM_MISMATCH || rc == KV_NOT_FOUND) {
            store_obj_loc(o, &loc);
            store_obj_key(o, &key);
            f = ssd_forget_new(&key, &loc, store_obj_size(o));
        }
        if (store_load_end(t->store, o, rc) == 1 && f != NULL) {
            ssd_forget_push(t, f);
        } else {
            free(f);
        }
        ssd_wake(t);
    }
    return NULL;
}

/* ---- start-up ---- */

struct ssd_load_ctx {
    struct ssd *t;
    struct ssd_forget *stale;   /* entries whose bucket file is gone */
    uint64_t loaded;
    int rc;
};

static int
ssd_index_obj_fn(void *arg, uint32_t tenant, const uint8_t *key, uint32_t key_len,
                 const struct idx_loc *loc)
{
    struct ssd_load_ctx *c = arg;
    struct ssd *t = c->t;
    struct kv_key k = {.tenant = tenant, .len = key_len, .ptr = key};
    struct store_loc sl = {.bucket = (uint32_t)loc->bucket, .crc = loc->crc, .offset = loc->offset};
    struct ssd_bucket *b;
    int rc;

    b = ssd_bucket_find_locked(t, loc->bucket);     /* single-threaded at start */
    if (b == NULL || loc->offset + loc->length > b->total_bytes) {
        if (b != NULL) {
            /* ssd_forget_done counts it out again with its bucket's live bytes. */
            CTR_ADD(t, objects, 1);
            CTR_ADD(t, bytes, loc->length);
        }
        struct ssd_forget *f = ssd_forget_new(&k, &sl, loc->length);

        if (f != NULL) {
            f->next = c->stale;
            c->stale = f;
        }
        return 0;
    }
    rc = store_insert_stored(t->store, &k, loc->length, &sl);
    if (rc == -ENOMEM) {
        c->rc = rc;
        return rc;
    }
    if (rc == 0) {
        c->loaded++;
        CTR_ADD(t, objects, 1);
        CTR_ADD(t, bytes, loc->length);
    }
    return 0;
}

static int
ssd_index_bucket_fn(void *arg, const struct idx_bucket *r)
{
    struct ssd_load_ctx *c = arg;
    struct ssd *t = c->t;
    char path[SSD_PATH_MAX + 64];
    struct ssd_bucket *b;
    struct stat st;
    int rc;

    ssd_bucket_path(t, r->id, path, sizeof(path));
    b = calloc(1, sizeof(*b));
    if (b == NULL) {
        c->rc = -ENOMEM;
        return -ENOMEM;
    }
    b->id = r->id;
    b->created_ms = r->created_ms;
    b->last_read_ms = r->last_read_ms;
    b->live_bytes = r->live_bytes;
    b->total_bytes = r->total_bytes;
    b->committed_bytes = r->total_bytes;
    b->sealed = true;           /* new records go to a new bucket after a start */
    b->direct = true;
    b->fd = open(path, O_RDWR | O_CLOEXEC | O_DIRECT);
    if (b->fd < 0 && errno == EINVAL) {
        b->direct = false;
        b->fd = open(path, O_RDWR | O_CLOEXEC);
    }
    if (b->fd < 0 || fstat(b->fd, &st) != 0 || (uint64_t)st.st_size < r->total_bytes) {
        log_error("ssd: bucket file %s is missing or short; its entries are dropped", path);
        if (b->fd >= 0) {
            close(b->fd);
        }
        free(b);
        return 0;               /* its objects find no bucket and become stale entries */
    }
    if ((uint64_t)st.st_size > r->total_bytes) {
        /* Records written after the last commit (a crash): never indexed, cut them off. */
        if (ftruncate(b->fd, (off_t)r->total_bytes) != 0) {
            log_error("ssd: ftruncate(%s): %s", path, strerror(errno));
        }
    }
    rc = ssd_bucket_insert(t, b);
    if (rc != 0) {
        close(b->fd);
        free(b);
        c->rc = rc;
        return rc;
    }
    CTR_ADD(t, disk_bytes, b->total_bytes);
    if (r->id >= t->next_id) {
        t->next_id = r->id + 1;
    }
    return 0;
}

/* Remove bucket files the index does not know (created, then a crash before their commit). */
static void
ssd_remove_orphans(struct ssd *t)
{
    DIR *d = opendir(t->dir);
    struct dirent *e;

    if (d == NULL) {
        return;
    }
    while ((e = readdir(d)) != NULL) {
        unsigned long long id;
        char tail[8];
        char path[SSD_PATH_MAX + 300];

        if (sscanf(e->d_name, "bucket-%16llx.%3s", &id, tail) != 2 || strcmp(tail, "kvb") != 0) {
            continue;
        }
        if (ssd_bucket_find_locked(t, id) == NULL) {
            snprintf(path, sizeof(path), "%s/%s", t->dir, e->d_name);
            log_info("ssd: removing %s (not in the index)", path);
            if (unlink(path) != 0) {
                log_error("ssd: unlink(%s): %s", path, strerror(errno));
            }
            if ((uint64_t)id >= t->next_id) {
                t->next_id = (uint64_t)id + 1;
            }
        }
    }
    closedir(d);
}

static int
ssd_lock_dir(struct ssd *t, char *err, size_t errlen)
{
    char path[SSD_PATH_MAX + 16];
    char pid[32];
    int n;

    snprintf(path, sizeof(path), "%s/LOCK", t->dir);
    t->lock_fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
    if (t->lock_fd < 0) {
        ssd_err(err, errlen, "ssd_dir: open(%s): %s", path, strerror(errno));
        return -errno;
    }
    if (flock(t->lock_fd, LOCK_EX | LOCK_NB) != 0) {
        int e = errno;

        n = (int)pread(t->lock_fd, pid, sizeof(pid) - 1, 0);
        pid[n > 0 ? n : 0] = '\0';
        pid[strcspn(pid, "\n")] = '\0';
        if (e == EWOULDBLOCK) {
            ssd_err(err, errlen,
                    "ssd_dir %s is in use by another kvstashd (pid %s); refusing to start", t->dir,
                    pid[0] != '\0' ? pid : "unknown");
            return KV_BUSY;
        }
        ssd_err(err, errlen, "ssd_dir: flock(%s): %s", path, strerror(e));
        return -e;
    }
    n = snprintf(pid, sizeof(pid), "%ld\n", (long)getpid());
    if (ftruncate(t->lock_fd, 0) != 0 || pwrite(t->lock_fd, pid, (size_t)n, 0) != n) {
        log_warn("ssd: cannot write the pid to %s: %s", path, strerror(errno));
    }
    return 0;
}

static int
ssd_mkdirs(const char *path)
{
    char buf[SSD_PATH_MAX];
    size_t len = strlen(path);

    if (len == 0 || len >= sizeof(buf)) {
        return -ENAMETOOLONG;
    }
    memcpy(buf, path, len + 1);
    for (size_t i = 1; i <= len; i++) {
        if (buf[i] == '/' || buf[i] == '\0') {
            char c = buf[i];

            buf[i] = '\0';
            if (mkdir(buf, 0700) != 0 && errno != EEXIST) {
                return -errno;
            }
            buf[i] = c;
        }
    }
    return 0;
}

static int
ssd_load_index(struct ssd *t, char *err, size_t errlen)
{
    struct ssd_load_ctx c = {t, NULL, 0, 0};
    uint64_t t0 = ssd_now_ms();
    uint64_t v;
    int rc;

    if (idx_meta_get(t->idx, "format", &v) == 0 && v != SSD_REC_VERSION) {
        ssd_err(err, errlen, "ssd_dir %s holds format %" PRIu64 ", this kvstashd reads %u", t->dir,
                v, SSD_REC_VERSION);
        return KV_UNSUPPORTED;
    }
    if (idx_meta_get(t->idx, "next_bucket", &v) == 0) {
        t->next_id = v;
    }
    if (t->next_id == 0) {
        t->next_id = 1;
    }
    rc = idx_scan_buckets(t->idx, ssd_index_bucket_fn, &c);
    if (rc == 0) {
        rc = c.rc;
    }
    if (rc != 0) {
        ssd_err(err, errlen, "ssd_dir %s: reading the bucket index: %s", t->dir, kv_strerror(rc));
        return rc;
    }
    ssd_remove_orphans(t);
    rc = idx_scan_objects(t->idx, ssd_index_obj_fn, &c);
    if (rc == 0) {
        rc = c.rc;
    }
    if (rc != 0) {
        ssd_forget_free(c.stale);
        ssd_err(err, errlen, "ssd_dir %s: loading the index: %s", t->dir, kv_strerror(rc));
        return rc;
    }
    /* Entries without their bucket (or beyond its end) go at the first commit. */
    while (c.stale != NULL) {
        struct ssd_forget *f = c.stale;

        c.stale = f->next;
        f->next = t->forgets;
        t->forgets = f;
    }
    {
        struct idx_op op;

        memset(&op, 0, sizeof(op));
        op.kind = IDX_META_PUT;
        op.name = "format";
        op.value = SSD_REC_VERSION;
        rc = idx_apply(t->idx, &op, 1);
        if (rc != 0) {
            ssd_err(err, errlen, "ssd_dir %s: writing the index: %s", t->dir, kv_strerror(rc));
            return rc;
        }
    }
    t->start_objects = c.loaded;
    t->start_ms = ssd_now_ms() - t0;
    return 0;
}

int
ssd_open(const struct ssd_config *cfg, struct store *s, struct ssd **out, char *err, size_t errlen)
{
    struct store_tier tier;
    char ipath[SSD_PATH_MAX + 16];
    struct ssd *t;
    int stale = 0;
    int rc;

    *out = NULL;
    if (cfg->dir == NULL || strlen(cfg->dir) >= SSD_PATH_MAX - 64 || cfg->size == 0
        || cfg->bucket_size == 0 || cfg->io_threads < 1) {
        ssd_err(err, errlen, "ssd: bad configuration");
        return KV_INVALID_ARGUMENT;
    }
    t = calloc(1, sizeof(*t));
    if (t == NULL) {
        ssd_err(err, errlen, "ssd: out of memory");
        return -ENOMEM;
    }
    t->cfg = *cfg;
    snprintf(t->dir, sizeof(t->dir), "%s", cfg->dir);
    t->cfg.dir = t->dir;
    t->store = s;
    t->lock_fd = -1;
    t->dir_fd = -1;
    ssd_apply_settings(t, cfg);
    pthread_mutex_init(&t->qlock, NULL);
    pthread_cond_init(&t->wcond, NULL);
    pthread_cond_init(&t->rcond, NULL);
    pthread_mutex_init(&t->blk, NULL);
    pthread_cond_init(&t->bcond, NULL);

    rc = ssd_mkdirs(t->dir);
    if (rc != 0) {
        ssd_err(err, errlen, "ssd_dir %s: %s", t->dir, strerror(-rc));
        goto fail;
    }
    t->dir_fd = open(t->dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (t->dir_fd < 0) {
        rc = -errno;
        ssd_err(err, errlen, "ssd_dir %s: %s", t->dir, strerror(errno));
        goto fail;
    }
    rc = ssd_lock_dir(t, err, errlen);
    if (rc != 0) {
        goto fail;
    }
    t->hdr_cap = ssd_rec_hdr_block(cfg->max_key_size > 65536 ? 65536 : cfg->max_key_size);
    if (posix_memalign((void **)&t->hdr, SSD_REC_ALIGN, t->hdr_cap) != 0) {
        rc = -ENOMEM;
        ssd_err(err, errlen, "ssd: out of memory");
        goto fail;
    }
    snprintf(ipath, sizeof(ipath), "%s/index", t->dir);
    rc = idx_open(ipath, SSD_MAP_INITIAL, SSD_MAP_MAX, &stale, &t->idx, err, errlen);
    if (rc != 0) {
        goto fail;
    }
    if (stale > 0) {
        log_warn("ssd: cleared %d stale LMDB reader slot(s) left by a dead process", stale);
    }

    memset(&tier, 0, sizeof(tier));
    tier.arg = t;
    tier.offload = ssd_hook_offload;
    tier.load = ssd_hook_load;
    tier.forget = ssd_hook_forget;
    tier.touch = ssd_hook_touch;
    tier.write_through = cfg->offload == SSD_WRITE_THROUGH;
    tier.on_evict = cfg->offload == SSD_ON_EVICT;
    tier.promote = cfg->promote;
    store_set_tier(s, &tier);

    rc = ssd_load_index(t, err, errlen);
    if (rc != 0) {
        goto fail_detach;
    }
    log_info("ssd: %s: %" PRIu64 " objects in %zu buckets (%" PRIu64 " bytes) indexed in %" PRIu64
             " ms; crc32c %s",
             t->dir, t->start_objects, t->nbuckets, CTR_GET(t, disk_bytes), t->start_ms,
             crc32c_hw() ? "sse4.2" : "software");

    rc = pthread_create(&t->writer, NULL, ssd_writer_main, t);
    if (rc != 0) {
        rc = -rc;
        ssd_err(err, errlen, "ssd: pthread_create: %s", strerror(-rc));
        goto fail_detach;
    }
    t->writer_started = true;
    t->readers = calloc((size_t)cfg->io_threads, sizeof(*t->readers));
    if (t->readers == NULL) {
        rc = -ENOMEM;
        ssd_err(err, errlen, "ssd: out of memory");
        goto fail_threads;
    }
    for (int i = 0; i < cfg->io_threads; i++) {
        rc = pthread_create(&t->readers[i], NULL, ssd_reader_main, t);
        if (rc != 0) {
            rc = -rc;
            ssd_err(err, errlen, "ssd: pthread_create: %s", strerror(-rc));
            goto fail_threads;
        }
        t->nreaders++;
    }
    *out = t;
    return 0;

fail_threads:
    ssd_close(t);
    return rc;
fail_detach:
    store_set_tier(s, NULL);
fail:
    ssd_close(t);
    return rc;
}

void
ssd_close(struct ssd *t)
{
    if (t == NULL) {
        return;
    }
    pthread_mutex_lock(&t->qlock);
    t->stop = true;
    pthread_cond_broadcast(&t->wcond);
    pthread_cond_broadcast(&t->rcond);
    pthread_mutex_unlock(&t->qlock);
    for (int i = 0; i < t->nreaders; i++) {
        pthread_join(t->readers[i], NULL);
    }
    if (t->writer_started) {
        pthread_join(t->writer, NULL);
    }
    /* Loads still queued give their references back (nothing reads them any more). */
    while (t->rq_head != NULL) {
        struct store_obj *o = t->rq_head;

        t->rq_head = store_obj_link(o);
        store_obj_set_link(o, NULL);
        (void)store_load_end(t->store, o, KV_NO_SPACE);
    }
    while (t->wq_head != NULL) {
        struct store_obj *o = t->wq_head;

        t->wq_head = store_obj_link(o);
        store_obj_set_link(o, NULL);
        store_obj_store_failed(t->store, o);
        store_obj_unref(t->store, o);
    }
    if (t->store != NULL && t->writer_started) {
        store_set_tier(t->store, NULL);
    }
    ssd_forget_free(t->forgets);
    for (size_t i = 0; i < t->nbuckets; i++) {
        close(t->buckets[i]->fd);
        free(t->buckets[i]);
    }
    free(t->buckets);
    free(t->readers);
    idx_close(t->idx);
    free(t->hdr);
    if (t->lock_fd >= 0) {
        close(t->lock_fd);      /* releases the flock */
    }
    if (t->dir_fd >= 0) {
        close(t->dir_fd);
    }
    pthread_mutex_destroy(&t->qlock);
    pthread_cond_destroy(&t->wcond);
    pthread_cond_destroy(&t->rcond);
    pthread_mutex_destroy(&t->blk);
    pthread_cond_destroy(&t->bcond);
    free(t);
}

void
ssd_reconfigure(struct ssd *t, const struct ssd_config *cfg)
{
    t->cfg.size = cfg->size;
    ssd_apply_settings(t, cfg);
    store_tier_flags(t->store, cfg->offload == SSD_WRITE_THROUGH, cfg->offload == SSD_ON_EVICT,
                     cfg->promote);
    pthread_mutex_lock(&t->qlock);
    pthread_cond_signal(&t->wcond);     /* new watermarks may call for eviction */
    pthread_mutex_unlock(&t->qlock);
}

void
ssd_stats(struct ssd *t, struct ssd_stats *out)
{
    memset(out, 0, sizeof(*out));
    out->objects = CTR_GET(t, objects);
    out->bytes = CTR_GET(t, bytes);
    out->disk_bytes = CTR_GET(t, disk_bytes);
    out->capacity = t->cfg.size;
    pthread_mutex_lock(&t->blk);
    out->buckets = t->nbuckets;
    pthread_mutex_unlock(&t->blk);
    out->hits = CTR_GET(t, hits);
    out->reads = CTR_GET(t, reads);
    out->read_bytes = CTR_GET(t, read_bytes);
    out->writes = CTR_GET(t, writes);
    out->write_bytes = CTR_GET(t, write_bytes);
    out->syncs = CTR_GET(t, syncs);
    out->evicted_buckets = CTR_GET(t, evicted_buckets);
    out->evicted_objects = CTR_GET(t, evicted_objects);
    out->checksum_errors = CTR_GET(t, checksum_errors);
    out->io_errors = CTR_GET(t, io_errors);
    out->no_space = CTR_GET(t, no_space);
    out->write_failed = CTR_GET(t, write_failed);
    out->queue_objects = CTR_GET(t, queue_objects);
    out->queue_bytes = CTR_GET(t, queue_bytes);
    out->load_queue = CTR_GET(t, load_queue);
    out->degraded = CTR_GET(t, degraded_flag);
    out->index_map_size = idx_map_size(t->idx);
    out->start_objects = t->start_objects;
    out->start_ms = t->start_ms;
}
