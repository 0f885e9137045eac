/*
 * ssd_rebuild: start-up repair of the SSD tier: moving a damaged index or
 * directory aside, and rebuilding the index from the bucket files on the
 * writer thread while the daemon already serves DRAM. It owns the rebuild's
 * order and accounting; it must not run anywhere but the writer thread (it
 * creates bucket table entries and writes the index, which only that thread
 * may do), and it reads bucket files only through ssd_scan.h.
 *
 * Order: bucket files are walked oldest first (ids grow with creation) and
 * each from its start, and every verified record is put in the index,
 * replacing the entry of an older record of the same key: the index ends
 * with each key's newest whole record, as the writer left it, except that a
 * record removed after it was written comes back (a removal lives only in
 * the index). Commits are not synced during the walk (a crash redoes the
 * rebuild: the "format" mark that says an index is whole is written last,
 * after one sync). Only then are the entries loaded into the store, each
 * bucket's live bytes counted from them; a key a client put meanwhile keeps
 * the client's value and the record's entry is forgotten.
 */
#include "ssd_int.h"
#include "clock.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "kverr.h"
#include "log.h"
#include "ssd_index.h"
#include "ssd_record.h"
#include "ssd_scan.h"

int
ssd_set_aside(struct ssd *t, const char *path, const char *why)
{
    char to[SSD_PATH_MAX + 96];
    char stamp[32];
    struct tm tm;
    time_t now = time(NULL);

    gmtime_r(&now, &tm);
    strftime(stamp, sizeof(stamp), "%Y%m%dT%H%M%SZ", &tm);
    for (int n = 0; n < 100; n++) {
        struct stat st;

        if (n == 0) {
            snprintf(to, sizeof(to), "%s.broken-%s", path, stamp);
        } else {
            snprintf(to, sizeof(to), "%s.broken-%s-%d", path, stamp, n);
        }
        if (lstat(to, &st) == 0) {
            continue;
        }
        if (rename(path, to) != 0) {
            int e = errno;

            log_error("ssd: %s: %s; cannot move it aside to %s: %s", path, why, to, strerror(e));
            return -e;
        }
        t->set_aside++;
        log_warn("ssd: %s: %s; moved aside to %s (kept for inspection; remove it when done)",
                 path, why, to);
        return 0;
    }
    log_error("ssd: %s: %s; cannot move it aside: too many %s.broken-* names", path, why, path);
    return -EEXIST;
}

uint64_t *
ssd_bucket_file_ids(struct ssd *t, size_t *n)
{
    DIR *d = opendir(t->dir);
    struct dirent *e;
    uint64_t *ids = NULL;
    size_t cap = 0;

    *n = 0;
    if (d == NULL) {
        return NULL;
    }
    while ((e = readdir(d)) != NULL) {
        unsigned long long id;
        char tail[8];

        if (sscanf(e->d_name, "bucket-%16llx.%3s", &id, tail) != 2 || strcmp(tail, "kvb") != 0
            || strlen(e->d_name) != strlen("bucket-0000000000000000.kvb")) {
            continue;
        }
        if (*n == cap) {
            size_t ncap = cap != 0 ? cap * 2 : 64;
            uint64_t *p = realloc(ids, ncap * sizeof(*ids));

            if (p == NULL) {
                break;
            }
            ids = p;
            cap = ncap;
        }
        ids[(*n)++] = id;
    }
    closedir(d);
    for (size_t i = 1; i < *n; i++) {       /* insertion sort: a few thousand at most */
        uint64_t v = ids[i];
        size_t j = i;

        while (j > 0 && ids[j - 1] > v) {
            ids[j] = ids[j - 1];
            j--;
        }
        ids[j] = v;
    }
    return ids;
}

size_t
ssd_count_bucket_files(struct ssd *t)
{
    size_t n;

    free(ssd_bucket_file_ids(t, &n));
    return n;
}

/* The walk's pending index entries: ops whose keys live in arena. */
struct ssd_rb_batch {
    struct ssd *t;
    uint64_t bucket;
    struct idx_op *ops;
    size_t n;
    uint8_t *arena;
    size_t used;
    size_t cap;
    int rc;
};

static int
ssd_rb_flush(struct ssd_rb_batch *b)
{
    int rc = 0;

    if (b->n > 0) {
        rc = idx_apply(b->t->idx, b->ops, b->n);
    }
    b->n = 0;
    b->used = 0;
    return rc;
}

static int
ssd_rb_record(void *arg, const struct ssd_rec *rec, uint64_t value_off)
{
    struct ssd_rb_batch *b = arg;
    struct idx_op *op;
    int rc;

    if (b->n == SSD_REBUILD_BATCH || b->used + rec->key_len > b->cap) {
        rc = ssd_rb_flush(b);
        if (rc != 0) {
            b->rc = rc;
            return rc;
        }
    }
    op = &b->ops[b->n++];
    memset(op, 0, sizeof(*op));
    op->kind = IDX_OBJ_PUT;
    op->tenant = rec->tenant;
    op->key_len = rec->key_len;
    if (rec->key_len > 0) {
        memcpy(b->arena + b->used, rec->key, rec->key_len);
    }
    op->key = b->arena + b->used;
    b->used += rec->key_len;
    op->loc.bucket = b->bucket;
    op->loc.offset = value_off;
    op->loc.length = rec->value_len;
    op->loc.crc = rec->value_crc;
    atomic_fetch_add_explicit(&b->t->rebuild_records, 1, memory_order_relaxed);
    return 0;
}

static bool
ssd_rb_stopping(struct ssd *t)
{
    bool stop;

    pthread_mutex_lock(&t->qlock);
    stop = t->stop;
    pthread_mutex_unlock(&t->qlock);
    return stop;
}

/* Totals of a rebuild, for its log line. */
struct ssd_rb_totals {
    uint64_t records;
    uint64_t bad_values;
    uint64_t damaged;       /* buckets whose walk stopped at damage or a cut */
    uint64_t cut_bytes;     /* bytes cut off after the last whole record */
    uint64_t empty;         /* bucket files without a whole record (removed) */
    uint64_t unreadable;    /* bucket files that could not be opened */
};

/*
 * ssd_rb_bucket: walk bucket id, index its records, cut the file back to its
 * last whole record and add the bucket to the table (sealed). 0, or an index
 * error (the rebuild stops).
 */
static int
ssd_rb_bucket(struct ssd *t, uint64_t id, uint8_t *buf, struct ssd_rb_batch *batch,
              struct ssd_rb_totals *tot)
{
    char path[SSD_PATH_MAX + 64];
    struct ssd_scan_result res;
    struct ssd_bucket *b;
    struct idx_op op;
    struct stat st;
    int fd;
    int rc;

    ssd_bucket_path(t, id, path, sizeof(path));
    fd = open(path, O_RDWR | O_CLOEXEC);
    if (fd < 0 || fstat(fd, &st) != 0) {
        log_error("ssd: rebuild: %s: %s; skipped", path, strerror(errno));
        tot->unreadable++;
        if (fd >= 0) {
            close(fd);
        }
        return 0;
    }
    (void)posix_fadvise(fd, 0, 0, POSIX_FADV_SEQUENTIAL);
    batch->bucket = id;
    rc = ssd_scan_fd(fd, buf, SSD_SCAN_BUF, SSD_SCAN_MAX_KEY, SSD_SCAN_MAX_VALUE, ssd_rb_record,
                     batch, &res);
    if (rc == 0) {
        rc = ssd_rb_flush(batch);
    }
    (void)posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);     /* 8 GiB read once: do not keep it */
    if (rc != 0) {
        close(fd);
        return rc;
    }
    tot->records += res.records;
    tot->bad_values += res.bad_values;
    if (res.why != SSD_SCAN_END_CLEAN || res.bad_values > 0) {
        tot->damaged++;
        log_warn("ssd: rebuild: %s: %" PRIu64 " whole records kept, %" PRIu64
                 " with a bad value skipped; the walk stopped at offset %" PRIu64 " of %" PRIu64
                 " (%s%s%s)", path, res.records, res.bad_values, res.end, res.file_size,
                 ssd_scan_end_name(res.why), res.rc != 0 ? ": " : "",
                 res.rc != 0 ? strerror(-res.rc) : "");
    }
    if (res.why != SSD_SCAN_END_IO && res.file_size > res.end) {
        /* Past the last whole record: zeros, a torn append, garbage, or damage the walk
         * cannot pass safely (ssd_scan.h). New records go to new buckets anyway. */
        if (ftruncate(fd, (off_t)res.end) != 0) {
            log_error("ssd: rebuild: ftruncate(%s): %s", path, strerror(errno));
        } else {
            tot->cut_bytes += res.file_size - res.end;
        }
    }
    close(fd);
    if (res.end == 0) {
        if (res.why != SSD_SCAN_END_IO && unlink(path) == 0) {
            tot->empty++;
        }
        return 0;
    }

    b = calloc(1, sizeof(*b));
    if (b == NULL) {
        return -ENOMEM;
    }
    b->id = id;
    b->created_ms = (uint64_t)st.st_mtim.tv_sec * 1000 + (uint64_t)st.st_mtim.tv_nsec / 1000000;
    b->last_read_ms = b->created_ms;
    b->total_bytes = res.end;
    b->committed_bytes = res.end;
    b->sealed = true;
    b->dirty = true;            /* its record goes with the final commit, live bytes counted */
    b->direct = true;
    b->fd = open(path, O_RDWR | O_CLOEXEC | O_DIRECT);
    if (b->fd < 0 && errno == EINVAL) {
        b->direct = false;
        b->fd = open(path, O_RDWR | O_CLOEXEC);
    }
    if (b->fd < 0) {
        log_error("ssd: rebuild: %s: %s; its records are not served", path, strerror(errno));
        free(b);
        return 0;
    }
    rc = ssd_bucket_insert(t, b);
    if (rc != 0) {
        close(b->fd);
        free(b);
        return rc;
    }
    CTR_ADD(t, disk_bytes, b->total_bytes);
    if (id >= t->next_id) {
        t->next_id = id + 1;
    }
    /* The bucket's record now, so the entries just committed never name an unknown bucket. */
    memset(&op, 0, sizeof(op));
    op.kind = IDX_BUCKET_PUT;
    ssd_bucket_record(b, &op.bucket);
    return idx_apply(t->idx, &op, 1);
}

/* Loading the rebuilt entries into the store. */
struct ssd_rb_load {
    struct ssd *t;
    struct ssd_forget *stale;   /* entries of keys put meanwhile, or of unknown buckets */
    uint64_t entries;
    uint64_t loaded;
    int rc;
};

static int
ssd_rb_load_fn(void *arg, uint32_t tenant, const uint8_t *key, uint32_t key_len,
               const struct idx_loc *loc)
{
    struct ssd_rb_load *c = arg;
    struct ssd *t = c->t;
    struct kv_key k = {.tenant = tenant, .len = key_len, .ptr = key};
    struct store_loc sl = {.bucket = (uint32_t)loc->bucket, .crc = loc->crc, .offset = loc->offset};
    int rc;

    c->entries++;
    /* Counted in (objects, bytes, the bucket's live bytes) whether loaded or not: a stale
     * entry is counted out again by ssd_forget_done when its delete commits. */
    if (!ssd_bucket_account(t, loc->bucket, (int64_t)ssd_rec_size(key_len, loc->length))) {
        rc = KV_NOT_FOUND;      /* its bucket file could not be reopened */
    } else {
        CTR_ADD(t, objects, 1);
        CTR_ADD(t, bytes, loc->length);
        rc = store_insert_stored(t->store, &k, loc->length, &sl);
    }
    if (rc == -ENOMEM) {
        c->rc = rc;
        return rc;
    }
    if (rc == 0) {
        c->loaded++;
        return 0;
    }
    /* KV_EXISTS: a client put the key meanwhile, and its value wins. */
    struct ssd_forget *f = ssd_forget_new(&k, &sl, loc->length);

    if (f != NULL) {
        f->next = c->stale;
        c->stale = f;
    }
    return 0;
}

int
ssd_rebuild(struct ssd *t)
{
    struct ssd_rb_batch batch;
    struct ssd_rb_totals tot;
    struct ssd_rb_load load;
    uint8_t *buf = NULL;
    uint64_t *ids;
    size_t n;
    bool stopped = false;
    int rc = 0;

    memset(&batch, 0, sizeof(batch));
    memset(&tot, 0, sizeof(tot));
    memset(&load, 0, sizeof(load));
    ids = ssd_bucket_file_ids(t, &n);
    atomic_store(&t->rebuild_buckets, n);
    log_warn("ssd: rebuilding the index of %s from %zu bucket file(s); DRAM serves meanwhile, "
             "SSD objects come back when it is done", t->dir, n);
    batch.t = t;
    batch.ops = calloc(SSD_REBUILD_BATCH, sizeof(*batch.ops));
    batch.cap = 4u << 20;       /* >= SSD_SCAN_MAX_KEY: a key always fits after a flush */
    batch.arena = malloc(batch.cap);
    if (posix_memalign((void **)&buf, SSD_REC_ALIGN, SSD_SCAN_BUF) != 0) {
        buf = NULL;
    }
    if (batch.ops == NULL || batch.arena == NULL || buf == NULL || (n > 0 && ids == NULL)) {
        rc = -ENOMEM;
        goto done;
    }
    (void)idx_set_sync(t->idx, 0);
    for (size_t i = 0; i < n; i++) {
        if (ssd_rb_stopping(t)) {
            log_warn("ssd: rebuild of %s stopped by shutdown after %zu of %zu buckets; the next "
                     "start rebuilds again", t->dir, i, n);
            rc = KV_UNAVAILABLE;
            stopped = true;
            goto done;
        }
        rc = ssd_rb_bucket(t, ids[i], buf, &batch, &tot);
        if (rc != 0) {
            log_error("ssd: rebuild of %s: bucket %" PRIu64 ": %s", t->dir, ids[i],
                      kv_strerror(rc));
            goto done;
        }
        atomic_fetch_add_explicit(&t->rebuild_buckets_done, 1, memory_order_relaxed);
        atomic_store(&t->rebuild_ms, clock_ms() - t->rebuild_t0);
    }

    load.t = t;
    rc = idx_scan_objects(t->idx, ssd_rb_load_fn, &load);
    if (rc == 0) {
        rc = load.rc;
    }
    while (load.stale != NULL) {
        struct ssd_forget *f = load.stale;

        load.stale = f->next;
        ssd_forget_push(t, f);
    }
    if (rc != 0) {
        log_error("ssd: rebuild of %s: loading the rebuilt index: %s", t->dir, kv_strerror(rc));
        goto done;
    }
    {
        /* Every bucket's record with its live bytes, then the marks of a whole index. */
        size_t cap = t->nbuckets + 2;
        struct idx_op *ops = calloc(cap, sizeof(*ops));
        size_t k = 0;

        if (ops == NULL) {
            rc = -ENOMEM;
            goto done;
        }
        pthread_mutex_lock(&t->blk);
        for (size_t i = 0; i < t->nbuckets; i++) {
            ops[k].kind = IDX_BUCKET_PUT;
            ssd_bucket_record(t->buckets[i], &ops[k].bucket);
            t->buckets[i]->dirty = false;
            k++;
        }
        pthread_mutex_unlock(&t->blk);
        ops[k].kind = IDX_META_PUT;
        ops[k].name = "next_bucket";
        ops[k].value = t->next_id;
        k++;
        ops[k].kind = IDX_META_PUT;
        ops[k].name = "format";
        ops[k].value = SSD_REC_VERSION;
        k++;
        rc = idx_apply(t->idx, ops, k);
        free(ops);
        if (rc == 0) {
            rc = idx_set_sync(t->idx, 1);   /* syncs all of it before "format" can count */
        }
        if (rc != 0) {
            log_error("ssd: rebuild of %s: writing the index: %s", t->dir, kv_strerror(rc));
            goto done;
        }
    }
    t->start_objects = load.loaded;

done:
    (void)idx_set_sync(t->idx, 1);
    atomic_store(&t->rebuild_ms, clock_ms() - t->rebuild_t0);
    if (rc == 0) {
        log_info("ssd: index of %s rebuilt in %" PRIu64 " ms: %zu bucket file(s), %" PRIu64
                 " whole records verified, %" PRIu64 " objects indexed (%" PRIu64
                 " older copies of keys written again later), %" PRIu64
                 " loaded (the others were put by clients meanwhile), %" PRIu64
                 " records with a bad value skipped, %" PRIu64 " file(s) cut at damage or a torn"
                 " end (%" PRIu64 " bytes), %" PRIu64 " without a whole record removed, %" PRIu64
                 " unreadable",
                 t->dir, atomic_load(&t->rebuild_ms), n, tot.records, load.entries,
                 tot.records - load.entries, load.loaded, tot.bad_values, tot.damaged,
                 tot.cut_bytes, tot.empty, tot.unreadable);
    }
    free(ids);
    free(buf);
    free(batch.ops);
    free(batch.arena);
    t->rebuild = false;
    if (rc != 0 && !stopped) {
        /* Its records may hold acknowledged durable puts: never let housekeeping take the
         * bucket files for empty because the index lacks them. */
        log_error("ssd: %s stays degraded until the next start, which rebuilds its index "
                  "again; its bucket files are kept", t->dir);
        t->rebuild_failed = true;
        t->degraded = true;
        atomic_store(&t->degraded_flag, 1);
        store_tier_degraded(t->store, true);
    }
    atomic_store(&t->state, SSD_STATE_READY);
    if (!t->degraded) {
        store_tier_degraded(t->store, false);
    }
    return rc;
}
