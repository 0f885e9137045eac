/*
 * ssd: the SSD tier behind ssd.h: start-up (lock, index, reconciling it
 * with the bucket files, loading it into the store), the store's hooks
 * (they only queue), the reader threads that load values back into arena
 * pages and verify them, reconfiguration and counters. The writer thread is
 * storage/ssd_writer.c, the bucket table and eviction storage/ssd_bucket.c;
 * storage/ssd_int.h is what they share. It talks to LMDB only through
 * ssd_index.h and to objects only through store.h; it never runs on an
 * event loop and never holds its own locks while calling the store.
 */
#include "ssd_int.h"
#include "clock.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#include "kverr.h"
#include "crc32c.h"
#include "log.h"
#include "ssd_clean.h"
#include "ssd_index.h"
#include "ssd_record.h"

void
ssd_wake(struct ssd *t)
{
    if (t->cfg.wake != NULL) {
        t->cfg.wake(t->cfg.wake_arg);
    }
}

static void
ssd_apply_settings(struct ssd *t, const struct ssd_config *cfg)
{
    atomic_store(&t->size, cfg->size);
    atomic_store(&t->bucket_size, cfg->bucket_size);
    atomic_store(&t->eviction, cfg->eviction);
    atomic_store(&t->high_bytes, (uint64_t)(cfg->high_watermark * (double)cfg->size));
    atomic_store(&t->low_bytes, (uint64_t)(cfg->low_watermark * (double)cfg->size));
    atomic_store(&t->offload, cfg->offload);
    atomic_store(&t->rate_limit, cfg->write_rate_limit);
    atomic_store(&t->scrub_rate, cfg->scrub_rate);
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

static void
ssd_hook_touch(void *arg, uint32_t bucket)
{
    struct ssd *t = arg;
    _Atomic uint64_t *slot = &t->stamps[bucket % SSD_STAMP_SLOTS];
    uint64_t now = clock_wall_coarse_ms();

    if (atomic_load_explicit(slot, memory_order_relaxed) < now) {
        atomic_store_explicit(slot, now, memory_order_relaxed);
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

struct ssd_forget *
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

void
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

void
ssd_forget_free(struct ssd_forget *f)
{
    while (f != NULL) {
        struct ssd_forget *next = f->next;

        free(f);
        f = next;
    }
}

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

/*
 * ssd_read_value: read the value of the record at loc (size bytes, padded to
 * its span on disk) into iov[0..n), which covers at least the span, and
 * check it against loc's CRC. Returns 0, KV_CHECKSUM_MISMATCH (short or
 * wrong), or -errno (the read failed).
 */
static int
ssd_read_value(const struct ssd_bucket *b, const struct store_loc *loc, const struct kv_key *key,
               uint64_t size, const struct iovec *iov, int n)
{
    struct iovec rd[STORE_MAX_EXTENTS];
    uint64_t left = ssd_rec_value_span(size);
    uint32_t crc;
    int64_t got;
    int nr = 0;

    for (int i = 0; i < n && nr < STORE_MAX_EXTENTS && left > 0; i++) {
        rd[nr] = iov[i];
        if (rd[nr].iov_len > left) {
            rd[nr].iov_len = left;
        }
        left -= rd[nr].iov_len;
        nr++;
    }
    got = ssd_preadv_all(b->fd, rd, nr, loc->offset);
    if (got < 0) {
        return (int)got;
    }
    crc = ssd_rec_key_crc(key->tenant, key->ptr, key->len);
    left = size;
    for (int i = 0; i < n && left > 0; i++) {
        uint64_t len = iov[i].iov_len < left ? iov[i].iov_len : left;

        crc = crc32c_extend(crc, iov[i].iov_base, len);
        left -= len;
    }
    return (uint64_t)got < size || crc != loc->crc ? KV_CHECKSUM_MISMATCH : 0;
}

/*
 * ssd_read_failed: what a failed ssd_read_value costs: an I/O error drops
 * the bucket, a checksum mismatch the entry (through the caller). Returns
 * KV_NOT_FOUND for an I/O error, else rc.
 */
static int
ssd_read_failed(struct ssd *t, struct ssd_bucket *b, const struct store_loc *loc, uint64_t size,
                int rc)
{
    ssd_bucket_unref(t, b, false);
    if (rc < 0) {
        log_kv(LOG_LEVEL_ERROR, "ssd: read failed", LOG_STR("path", t->dir),
               LOG_NUM("bucket", loc->bucket), LOG_NUM("offset", loc->offset),
               LOG_NUM("errno", -rc), LOG_STR("error", strerror(-rc)));
        CTR_ADD(t, io_errors, 1);
        ssd_request_drop(t, loc->bucket);
        return KV_NOT_FOUND;
    }
    log_kv(LOG_LEVEL_ERROR, "ssd: checksum mismatch, entry dropped", LOG_STR("path", t->dir),
           LOG_NUM("bucket", loc->bucket), LOG_NUM("offset", loc->offset),
           LOG_NUM("bytes", size));
    CTR_ADD(t, checksum_errors, 1);
    return rc;
}

/* ssd_read_ok: a value read back and verified. */
static void
ssd_read_ok(struct ssd *t, struct ssd_bucket *b, uint64_t size)
{
    ssd_bucket_unref(t, b, true);
    CTR_ADD(t, hits, 1);
    CTR_ADD(t, read_bytes, size);
}

/* ssd_read_begin: o's location and key, and a reference on its bucket (NULL: gone). */
static struct ssd_bucket *
ssd_read_begin(struct ssd *t, struct store_obj *o, struct store_loc *loc, struct kv_key *key)
{
    struct ssd_bucket *b = NULL;

    store_obj_key(o, key);
    CTR_ADD(t, reads, 1);
    store_stored_loc(t->store, o, loc);
    /* A bucket gone under a copy that compaction moved meanwhile: read it where it went. */
    for (int tries = 0; tries < 4; tries++) {
        struct store_loc now;

        b = ssd_bucket_ref(t, loc->bucket);
        if (b != NULL) {
            break;
        }
        store_stored_loc(t->store, o, &now);
        if (now.bucket == loc->bucket && now.offset == loc->offset) {
            break;
        }
        *loc = now;
    }
    return b;
}

/*
 * ssd_load: read o's value into arena pages and check it. Returns a
 * store_load_end rc; *used is the location it read (or tried).
 */
static int
ssd_load(struct ssd *t, struct store_obj *o, struct store_loc *used)
{
    struct iovec iov[STORE_MAX_EXTENTS];
    struct kv_key key;
    struct ssd_bucket *b;
    uint64_t size = store_obj_size(o);
    int n = 0;
    int rc;

    if (atomic_load(&t->state) == SSD_STATE_LOADING) {
        /* A rebuild puts each bucket's objects in the table as it goes, but a later record
         * of a key may still replace one: nothing is read from the SSD until it is done
         * (the object stays; the reader gets a miss, as before the bucket was in). */
        return KV_UNAVAILABLE;
    }
    b = ssd_read_begin(t, o, used, &key);
    if (b == NULL) {
        return KV_NOT_FOUND;
    }
    rc = store_load_begin(t->store, o, iov, STORE_MAX_EXTENTS, &n);
    if (rc != 0) {
        ssd_bucket_unref(t, b, false);
        return rc;
    }
    rc = ssd_read_value(b, used, &key, size, iov, n);
    if (rc != 0) {
        return ssd_read_failed(t, b, used, size, rc);
    }
    ssd_read_ok(t, b, size);
    return 0;
}

/*
 * ssd_hook_read: store_read_stored. The value goes straight into the
 * caller's pages; since those are a client's, a mismatch there may be the
 * client writing them meanwhile, so the copy on disk is checked again
 * through a buffer of our own before it is declared bad and dropped. Pages
 * the client cut off (EFAULT) are not the disk's fault either.
 */
static int
ssd_hook_read(void *arg, struct store_obj *o, const struct iovec *iov, int n)
{
    struct ssd *t = arg;
    struct store_loc loc;
    struct kv_key key;
    struct ssd_bucket *b;
    uint64_t size = store_obj_size(o);
    int rc;

    if (atomic_load(&t->state) == SSD_STATE_LOADING) {
        return KV_UNAVAILABLE;      /* a rebuild runs: see ssd_load */
    }
    b = ssd_read_begin(t, o, &loc, &key);
    if (b == NULL) {
        return KV_NOT_FOUND;
    }
    rc = ssd_read_value(b, &loc, &key, size, iov, n);
    if (rc == -EFAULT) {
        /* The caller's pages went away under the read (a client shrank its buffer): the
         * disk is fine and the copy stays. */
        ssd_bucket_unref(t, b, false);
        return KV_UNAVAILABLE;
    }
    if (rc == KV_CHECKSUM_MISMATCH) {
        uint64_t span = ssd_rec_value_span(size);
        void *tmp = NULL;

        rc = posix_memalign(&tmp, SSD_REC_ALIGN, span ? span : SSD_REC_ALIGN) != 0 ? -ENOMEM : 0;
        if (rc == 0) {
            struct iovec one = {.iov_base = tmp, .iov_len = span};

            rc = ssd_read_value(b, &loc, &key, size, &one, 1);
            for (int i = 0; rc == 0 && i < n && one.iov_len > 0; i++) {
                size_t len = iov[i].iov_len < one.iov_len ? iov[i].iov_len : one.iov_len;

                memcpy(iov[i].iov_base, one.iov_base, len);
                one.iov_base = (uint8_t *)one.iov_base + len;
                one.iov_len -= len;
            }
            free(tmp);
        }
    }
    if (rc == -ENOMEM) {
        ssd_bucket_unref(t, b, false);
        return KV_NOT_FOUND;            /* not the copy's fault: it stays */
    }
    if (rc != 0) {
        rc = ssd_read_failed(t, b, &loc, size, rc);
        if (rc == KV_CHECKSUM_MISMATCH && store_drop_stored(t->store, &key, &loc) == 1) {
            struct ssd_forget *f = ssd_forget_new(&key, &loc, size);

            if (f != NULL) {
                ssd_forget_push(t, f);
            }
        }
        return KV_NOT_FOUND;
    }
    ssd_read_ok(t, b, size);
    CTR_ADD(t, direct_reads, 1);
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

        memset(&loc, 0, sizeof(loc));
        rc = t->stop ? KV_NO_SPACE : ssd_load(t, o, &loc);
        if (rc == KV_CHECKSUM_MISMATCH || rc == KV_NOT_FOUND) {
            /* The entry of the location read: one compaction moved meanwhile stays. */
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
    b->owner = r->owner;
    b->sealed = true;           /* new records go to a new bucket after a start */
    b->direct = true;
    b->fd = open(path, O_RDWR | O_CLOEXEC | O_DIRECT);
    if (b->fd < 0 && errno == EINVAL) {
        b->direct = false;
        b->fd = open(path, O_RDWR | O_CLOEXEC);
    }
    if (b->fd < 0 || fstat(b->fd, &st) != 0) {
        log_error("ssd: bucket file %s: %s; its entries are dropped", path, strerror(errno));
        if (b->fd >= 0) {
            close(b->fd);
        }
        free(b);
        return 0;               /* its objects find no bucket and become stale entries */
    }
    if ((uint64_t)st.st_size < r->total_bytes) {
        /* Cut short: the records wholly before the cut stay (entries past it go as stale,
         * and a damaged value fails its CRC when read). */
        uint64_t keep = (uint64_t)st.st_size & ~(uint64_t)(SSD_REC_ALIGN - 1);

        log_error("ssd: bucket file %s is %lld bytes, the index says %" PRIu64 "; keeping the "
                  "records before the cut", path, (long long)st.st_size, r->total_bytes);
        b->total_bytes = keep;
        b->committed_bytes = keep;
        b->dirty = true;
        ssd_sumfile_remove(t, b->id);   /* it covers past the cut */
    }
    if ((uint64_t)st.st_size > b->total_bytes) {
        /* Records written after the last commit (a crash): never indexed, cut them off. */
        if (ftruncate(b->fd, (off_t)b->total_bytes) != 0) {
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
ssd_remove_orphan(struct ssd *t, uint64_t id, const char *suffix, const char *name)
{
    if (strncmp(suffix, "kvb", 3) != 0 || ssd_bucket_find_locked(t, id) != NULL) {
        return;
    }
    ssd_dir_unlink(t, name, "not in the index");
    if (id >= t->next_id) {
        t->next_id = id + 1;
    }
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
        kv_errorf(err, errlen, "ssd_dir: open(%s): %s", path, strerror(errno));
        return -errno;
    }
    if (flock(t->lock_fd, LOCK_EX | LOCK_NB) != 0) {
        int e = errno;

        n = (int)pread(t->lock_fd, pid, sizeof(pid) - 1, 0);
        pid[n > 0 ? n : 0] = '\0';
        pid[strcspn(pid, "\n")] = '\0';
        if (e == EWOULDBLOCK) {
            kv_errorf(err, errlen,
                    "ssd_dir %s is in use by another kvstashd (pid %s); refusing to start", t->dir,
                    pid[0] != '\0' ? pid : "unknown");
            return KV_BUSY;
        }
        kv_errorf(err, errlen, "ssd_dir: flock(%s): %s", path, strerror(e));
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

/* The validation pass: what an entry of a whole index always satisfies. */
struct ssd_check_ctx {
    struct ssd *t;
    const uint64_t *files;      /* bucket file ids on disk, sorted */
    size_t nfiles;
    uint64_t entries;
};

static bool
ssd_has_file(const struct ssd_check_ctx *c, uint64_t id)
{
    size_t lo = 0, hi = c->nfiles;

    while (lo < hi) {
        size_t mid = (lo + hi) / 2;

        if (c->files[mid] < id) {
            lo = mid + 1;
        } else {
            hi = mid;
        }
    }
    return lo < c->nfiles && c->files[lo] == id;
}

static int
ssd_check_obj_fn(void *arg, uint32_t tenant, const uint8_t *key, uint32_t key_len,
                 const struct idx_loc *loc)
{
    struct ssd_check_ctx *c = arg;

    (void)tenant;
    (void)key;
    c->entries++;
    if (loc->flags != 0 || loc->offset % SSD_REC_ALIGN != 0 || loc->length > SSD_SCAN_MAX_VALUE
        || loc->offset < ssd_rec_hdr_block(key_len) || loc->bucket > UINT32_MAX) {
        return KV_CHECKSUM_MISMATCH;
    }
    /* An entry of a bucket the index does not list, though its file is there. */
    if (ssd_bucket_find_locked(c->t, loc->bucket) == NULL && ssd_has_file(c, loc->bucket)) {
        return KV_CHECKSUM_MISMATCH;
    }
    return 0;
}

/* ssd_unload_buckets: forget the bucket table a failed load built (files untouched). */
static void
ssd_unload_buckets(struct ssd *t)
{
    for (size_t i = 0; i < t->nbuckets; i++) {
        close(t->buckets[i]->fd);
        free(t->buckets[i]);
    }
    t->nbuckets = 0;
    atomic_store(&t->disk_bytes, 0);
    t->next_id = 1;
}

/*
 * ssd_load_index: the index into the bucket table and the store. Returns 0;
 * SSD_LOAD_REBUILD with the reason in err when it must be rebuilt (damaged,
 * or missing while bucket files are there: nothing was loaded, the bucket
 * table is empty again); or an error that stops the start.
 */
static int
ssd_load_index(struct ssd *t, char *err, size_t errlen)
{
    struct ssd_load_ctx c = {t, NULL, 0, 0};
    struct ssd_check_ctx chk = {t, NULL, 0, 0};
    uint64_t t0 = clock_ms();
    uint64_t v;
    int rc;

    rc = idx_meta_get(t->idx, "format", &v);
    if (rc == 0 && v != SSD_REC_VERSION) {
        kv_errorf(err, errlen, "ssd_dir %s holds format %" PRIu64 ", this kvstashd reads %u", t->dir,
                v, SSD_REC_VERSION);
        return KV_UNSUPPORTED;
    }
    if (rc == KV_NOT_FOUND) {
        size_t files = ssd_count_bucket_files(t);

        if (files > 0) {
            kv_errorf(err, errlen, "the index is missing or incomplete but %zu bucket file(s) "
                      "are there", files);
            return SSD_LOAD_REBUILD;
        }
    } else if (rc != 0) {
        kv_errorf(err, errlen, "reading the index: %s", kv_strerror(rc));
        return SSD_LOAD_REBUILD;
    }
    rc = idx_meta_get(t->idx, "next_bucket", &v);
    if (rc == 0) {
        t->next_id = v;
    } else if (rc != KV_NOT_FOUND) {
        kv_errorf(err, errlen, "reading the index: %s", kv_strerror(rc));
        return SSD_LOAD_REBUILD;
    }
    if (t->next_id == 0) {
        t->next_id = 1;
    }
    rc = idx_scan_buckets(t->idx, ssd_index_bucket_fn, &c);
    if (rc == 0) {
        rc = c.rc;
    }
    if (rc == -ENOMEM) {
        kv_errorf(err, errlen, "ssd_dir %s: reading the bucket index: %s", t->dir, kv_strerror(rc));
        return rc;
    }
    if (rc != 0) {
        ssd_unload_buckets(t);
        kv_errorf(err, errlen, "reading its bucket list: %s", kv_strerror(rc));
        return SSD_LOAD_REBUILD;
    }
    idx_warm(t->idx);       /* one sequential read instead of a page fault per 4 KiB */
    /* Every entry checked before any reaches the store or an orphan file is removed; not
     * after a clean stop, whose entries are byte for byte what this tier wrote and checked
     * (ssd_clean.h): one walk of the index instead of two. */
    if (!t->clean_start) {
        chk.files = ssd_bucket_file_ids(t, &chk.nfiles);
        rc = idx_scan_objects(t->idx, ssd_check_obj_fn, &chk);
        free((void *)chk.files);
    }
    if (rc == -ENOMEM) {
        return rc;
    }
    if (rc != 0) {
        ssd_unload_buckets(t);
        kv_errorf(err, errlen, "%s after %" PRIu64 " good entries",
                  rc == KV_CHECKSUM_MISMATCH ? "an entry that cannot be right" : kv_strerror(rc),
                  chk.entries);
        return SSD_LOAD_REBUILD;
    }
    ssd_dir_each(t, ssd_remove_orphan);
    ssd_sumfile_remove_orphans(t);
    rc = idx_scan_objects(t->idx, ssd_index_obj_fn, &c);
    if (rc == 0) {
        rc = c.rc;
    }
    if (rc != 0) {
        ssd_forget_free(c.stale);
        kv_errorf(err, errlen, "ssd_dir %s: loading the index: %s", t->dir, kv_strerror(rc));
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
            kv_errorf(err, errlen, "ssd_dir %s: writing the index: %s", t->dir, kv_strerror(rc));
            return rc;
        }
    }
    t->start_objects = c.loaded;
    t->start_ms = clock_ms() - t0;
    return 0;
}

static int ssd_reset_index(struct ssd *t, const char *why, char *err, size_t errlen);

/*
 * ssd_open_dir: make, open and lock ssd_dir. A LOCK that cannot be opened is
 * moved aside and made again; a directory that cannot be used at all (not a
 * directory, unreadable) is moved aside and made anew, empty. A directory
 * locked by another process is never touched (KV_BUSY).
 */
static int
ssd_open_dir(struct ssd *t, char *err, size_t errlen)
{
    char path[SSD_PATH_MAX + 16];
    int rc = 0;

    for (int attempt = 0; attempt < 2; attempt++) {
        rc = ssd_mkdirs(t->dir);
        if (rc == 0) {
            t->dir_fd = open(t->dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
            rc = t->dir_fd < 0 ? -errno : 0;
        }
        if (rc == 0 && access(t->dir, R_OK | W_OK | X_OK) != 0) {
            rc = -errno;
        }
        if (rc == 0) {
            rc = ssd_lock_dir(t, err, errlen);
            if (rc != 0 && rc != KV_BUSY) {
                snprintf(path, sizeof(path), "%s/LOCK", t->dir);
                if (ssd_set_aside(t, path, err) == 0) {
                    rc = ssd_lock_dir(t, err, errlen);
                }
            }
            if (rc == 0 || rc == KV_BUSY) {
                return rc;
            }
        } else {
            kv_errorf(err, errlen, "ssd_dir %s: %s", t->dir, strerror(-rc));
        }
        if (t->dir_fd >= 0) {
            close(t->dir_fd);
            t->dir_fd = -1;
        }
        if (attempt == 0) {
            char why[600];

            snprintf(why, sizeof(why), "cannot be used as the SSD tier (%s); the tier starts empty",
                     err);
            if (ssd_set_aside(t, t->dir, why) != 0) {
                return rc;
            }
        }
    }
    return rc;
}

/*
 * ssd_open_index: open <dir>/index, or when it cannot be opened, move it
 * aside and open a new one to rebuild (t->rebuild). LMDB's lock file is
 * removed first: we hold ssd_dir's lock, so no other process has the index
 * open, and a stale or damaged lock.mdb would only stand in the way.
 */
static int
ssd_open_index(struct ssd *t, int *stale, char *err, size_t errlen)
{
    char ipath[SSD_PATH_MAX + 16];
    char lpath[SSD_PATH_MAX + 32];
    char why[1024];
    int rc;

    snprintf(ipath, sizeof(ipath), "%s/index", t->dir);
    snprintf(lpath, sizeof(lpath), "%s/lock.mdb", ipath);
    if (unlink(lpath) != 0 && errno != ENOENT && errno != ENOTDIR) {
        log_warn("ssd: unlink(%s): %s", lpath, strerror(errno));
    }
    t->clean_start = ssd_clean_take(ipath, why, sizeof(why)) == 1;
    if (t->clean_start) {
        /* Byte for byte what a clean close left: the walk in a child would find what the
         * last open's walk found (or the rebuild wrote). The load still decodes every entry. */
        log_info("ssd: %s: %s; the full index check is skipped", ipath, why);
    } else {
        uint64_t t0 = clock_ms();

        log_info("ssd: %s: %s; the index is checked in full", ipath, why);
        rc = idx_verify(ipath, SSD_VERIFY_TIMEOUT_S, why, sizeof(why));
        if (rc != 0) {
            return ssd_reset_index(t, why, err, errlen);
        }
        log_info("ssd: %s: the full index check passed in %" PRIu64 " ms", ipath,
                 clock_ms() - t0);
    }
    rc = idx_open(ipath, SSD_MAP_INITIAL, SSD_MAP_MAX, stale, &t->idx, why, sizeof(why));
    if (rc == 0 || rc == -ENOMEM) {
        if (rc != 0) {
            snprintf(err, errlen, "%s", why);
        }
        return rc;
    }
    return ssd_reset_index(t, why, err, errlen);
}

/*
 * ssd_reset_index: the index cannot be used (why): close it, move it aside,
 * open an empty one and mark the tier for a rebuild.
 */
static int
ssd_reset_index(struct ssd *t, const char *why, char *err, size_t errlen)
{
    char ipath[SSD_PATH_MAX + 16];
    char msg[1200];
    struct stat st;
    int rc;

    idx_close(t->idx);
    t->idx = NULL;
    snprintf(ipath, sizeof(ipath), "%s/index", t->dir);
    snprintf(msg, sizeof(msg), "the SSD index cannot be used (%s); it is rebuilt from the "
             "bucket files", why);
    if (lstat(ipath, &st) == 0) {
        rc = ssd_set_aside(t, ipath, msg);
        if (rc != 0) {
            kv_errorf(err, errlen, "ssd_dir %s: the index cannot be used (%s) nor moved aside: %s",
                      t->dir, why, strerror(-rc));
            return rc;
        }
    } else {
        log_warn("ssd: %s: %s", ipath, msg);
    }
    rc = idx_open(ipath, SSD_MAP_INITIAL, SSD_MAP_MAX, NULL, &t->idx, err, errlen);
    if (rc == 0) {
        t->rebuild = true;
    }
    return rc;
}

int
ssd_open(const struct ssd_config *cfg, struct store *s, struct ssd **out, char *err, size_t errlen)
{
    struct store_tier tier;
    struct ssd *t;
    int stale = 0;
    int rc;

    *out = NULL;
    if (cfg->dir == NULL || strlen(cfg->dir) >= SSD_PATH_MAX - 64 || cfg->size == 0
        || cfg->bucket_size == 0 || cfg->io_threads < 1) {
        kv_errorf(err, errlen, "ssd: bad configuration");
        return KV_INVALID_ARGUMENT;
    }
    t = calloc(1, sizeof(*t));
    if (t == NULL) {
        kv_errorf(err, errlen, "ssd: out of memory");
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

    rc = ssd_open_dir(t, err, errlen);
    if (rc != 0) {
        goto fail;
    }
    t->hdr_cap = ssd_rec_hdr_block(cfg->max_key_size > 65536 ? 65536 : cfg->max_key_size);
    /* One header block per record of a group: they are all in flight at once. */
    if (posix_memalign((void **)&t->hdr, SSD_REC_ALIGN, t->hdr_cap * SSD_GROUP_OBJECTS) != 0) {
        rc = -ENOMEM;
        kv_errorf(err, errlen, "ssd: out of memory");
        goto fail;
    }
    rc = ssd_open_index(t, &stale, err, errlen);
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
    tier.read = ssd_hook_read;
    tier.write_through = cfg->offload == SSD_WRITE_THROUGH;
    tier.on_evict = cfg->offload == SSD_ON_EVICT;
    tier.promote = cfg->promote;
    tier.offload_max = SSD_QUEUE_MAX;
    store_set_tier(s, &tier);

    if (!t->rebuild) {
        char why[512];

        rc = ssd_load_index(t, why, sizeof(why));
        if (rc == SSD_LOAD_REBUILD) {
            rc = ssd_reset_index(t, why, err, errlen);
        } else if (rc != 0) {
            snprintf(err, errlen, "%s", why);
        }
        if (rc != 0) {
            goto fail_detach;
        }
    }
    if (t->rebuild) {
        /* Until the rebuild is done: DRAM serves alone and evicts without writing to SSD. */
        t->rebuild_t0 = clock_ms();
        atomic_store(&t->state, SSD_STATE_LOADING);
        store_tier_degraded(s, true);
    } else {
        atomic_store(&t->state, SSD_STATE_READY);
    }
    log_info("ssd: %s: %" PRIu64 " objects in %zu buckets (%" PRIu64 " bytes) indexed in %" PRIu64
             " ms; crc32c %s",
             t->dir, t->start_objects, t->nbuckets, CTR_GET(t, disk_bytes), t->start_ms,
             crc32c_hw() ? "sse4.2" : "software");
    struct statvfs vfs;
    if (statvfs(t->dir, &vfs) == 0) {
        /* the tier evicts for ssd_size, not for a full disk (docs/architecture.md, "SSD tier") */
        uint64_t room = (uint64_t)vfs.f_bavail * vfs.f_frsize + CTR_GET(t, disk_bytes);
        if (room < cfg->size) {
            log_warn("ssd: ssd_size %" PRIu64 " is more than %s can hold (%" PRIu64
                     " bytes free plus the tier's own): once the disk is full the tier stops "
                     "writing until room is freed; set ssd_size below that",
                     cfg->size, t->dir, room);
        }
    }

    rc = pthread_create(&t->writer, NULL, ssd_writer_main, t);
    if (rc != 0) {
        rc = -rc;
        kv_errorf(err, errlen, "ssd: pthread_create: %s", strerror(-rc));
        goto fail_detach;
    }
    t->writer_started = true;
    t->readers = calloc((size_t)cfg->io_threads, sizeof(*t->readers));
    if (t->readers == NULL) {
        rc = -ENOMEM;
        kv_errorf(err, errlen, "ssd: out of memory");
        goto fail_threads;
    }
    for (int i = 0; i < cfg->io_threads; i++) {
        rc = pthread_create(&t->readers[i], NULL, ssd_reader_main, t);
        if (rc != 0) {
            rc = -rc;
            kv_errorf(err, errlen, "ssd: pthread_create: %s", strerror(-rc));
            goto fail_threads;
        }
        t->nreaders++;
    }
    t->opened = true;
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

/*
 * ssd_close_index: close the index and, when the tier stops clean (it opened, its writer
 * ran to its end, nothing degraded it, the index is whole: its "format" mark is there),
 * leave the clean-shutdown marker that spares the next start the full check.
 */
static void
ssd_close_index(struct ssd *t)
{
    char ipath[SSD_PATH_MAX + 16];
    uint64_t v = 0;
    bool clean = t->opened && t->writer_started && !t->degraded && !t->rebuild_failed
                 && t->idx != NULL && idx_meta_get(t->idx, "format", &v) == 0
                 && v == SSD_REC_VERSION;
    int rc;

    idx_close(t->idx);
    t->idx = NULL;
    if (!clean) {
        return;
    }
    snprintf(ipath, sizeof(ipath), "%s/index", t->dir);
    rc = ssd_clean_mark(ipath);
    if (rc != 0) {
        log_warn("ssd: %s: cannot write the clean-shutdown marker (%s); the next start checks "
                 "the whole index", ipath, strerror(-rc));
    }
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
    ssd_scrub_join(t);          /* started by the writer; sees t->stop within a step */
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
    }
    if (t->store != NULL && t->writer_started) {
        store_set_tier(t->store, NULL);
    }
    ssd_forget_free(t->forgets);
    for (size_t i = 0; i < t->nbuckets; i++) {
        close(t->buckets[i]->fd);
        ssd_sumfile_free(t->buckets[i]);
        free(t->buckets[i]);
    }
    free(t->buckets);
    free(t->readers);
    ssd_close_index(t);
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
    struct store_stats st;

    memset(out, 0, sizeof(*out));
    out->objects = CTR_GET(t, objects);
    out->bytes = CTR_GET(t, bytes);
    out->disk_bytes = CTR_GET(t, disk_bytes);
    out->capacity = t->cfg.size;
    pthread_mutex_lock(&t->blk);
    out->buckets = t->nbuckets;
    for (size_t i = 0; i < t->nbuckets; i++) {
        out->live_bytes += t->buckets[i]->live_bytes;
    }
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
    out->direct_reads = CTR_GET(t, direct_reads);
    out->io_errors = CTR_GET(t, io_errors);
    out->no_space = CTR_GET(t, no_space);
    out->write_failed = CTR_GET(t, write_failed);
    out->queue_objects = CTR_GET(t, queue_objects);
    out->queue_bytes = CTR_GET(t, queue_bytes);
    out->rate_limited = CTR_GET(t, rate_limited);
    out->compacted_buckets = CTR_GET(t, compacted_buckets);
    out->compacted_bytes = CTR_GET(t, compacted_bytes);
    store_stats(t->store, &st);
    out->offload_dropped = st.offload_dropped + out->rate_limited;
    out->load_queue = CTR_GET(t, load_queue);
    out->degraded = CTR_GET(t, degraded_flag);
    out->index_map_size = idx_map_size(t->idx);
    out->start_objects = t->start_objects;
    out->start_ms = t->start_ms;
    out->state = (uint64_t)ssd_state(t);
    out->rebuilds = t->rebuild_t0 != 0;
    out->rebuild_buckets = atomic_load(&t->rebuild_buckets);
    out->rebuild_buckets_done = atomic_load(&t->rebuild_buckets_done);
    out->rebuild_records = atomic_load(&t->rebuild_records);
    out->rebuild_ms = out->state == SSD_STATE_LOADING ? clock_ms() - t->rebuild_t0
                                                      : atomic_load(&t->rebuild_ms);
    out->set_aside = t->set_aside;
    out->rebuild_summary_buckets = atomic_load(&t->rebuild_summary_buckets);
    out->rebuild_scanned_buckets = atomic_load(&t->rebuild_scanned_buckets);
    out->scrub_buckets = atomic_load(&t->scrub_buckets);
    out->scrub_buckets_done = atomic_load(&t->scrub_buckets_done);
    out->scrub_bad = atomic_load(&t->scrub_bad);
    out->scrub_bytes = atomic_load(&t->scrub_bytes);
    out->scrub_ms = atomic_load(&t->scrub_ms);
}

int
ssd_state(const struct ssd *t)
{
    int st;

    if (t == NULL) {
        return SSD_STATE_OFF;
    }
    st = atomic_load(&t->state);
    if (st == SSD_STATE_READY && atomic_load(&t->degraded_flag) != 0) {
        st = SSD_STATE_DEGRADED;
    }
    return st;
}

const char *
ssd_state_name(int state)
{
    switch (state) {
    case SSD_STATE_LOADING:
        return "loading";
    case SSD_STATE_READY:
        return "ready";
    case SSD_STATE_DEGRADED:
        return "degraded";
    default:
        return "off";
    }
}

