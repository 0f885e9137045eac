/*
 * ssd_rebuild: start-up repair of the SSD tier: moving a damaged index or
 * directory aside, and rebuilding the index from the bucket files on the
 * writer thread while the daemon already serves DRAM. It owns the rebuild's
 * order and accounting; it must not run anywhere but the writer thread (it
 * creates bucket table entries and writes the index, which only that thread
 * may do), and it reads bucket files only through ssd_scan.h. The reading
 * and checking run on scanner threads it starts and joins itself (below,
 * "The walk runs as a pipeline"); they touch nothing but their own job.
 *
 * Order: bucket files are walked oldest first (ids grow with creation) and
 * each from its start, and every verified record is put in the index,
 * replacing the entry of an older record of the same key: the index ends
 * with each key's newest whole record, as the writer left it, except that a
 * record removed after it was written comes back (a removal lives only in
 * the index). Commits are not synced during the walk (a crash redoes the
 * rebuild: the "format" mark that says an index is whole is written last,
 * after one sync). Each bucket's entries go into the store as soon as the
 * bucket is indexed and registered, so the table fills while the disk is
 * still being read (and a key is served from the SSD as soon as its bucket
 * is in); a later record of a key already loaded replaces it there as in the
 * index (the store's copy is dropped and the newer one inserted), and a key
 * a client put meanwhile keeps the client's value and the record's entry is
 * forgotten. Each bucket's live bytes are counted from what is loaded.
 */
#include "ssd_int.h"
#include "clock.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
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
#include "ssd_summary.h"

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

/*
 * The walk runs as a pipeline: SSD_REBUILD_SCANNERS scanner threads each
 * take the next bucket file (oldest first), read it, verify every record and
 * keep its entries in memory (a job); the writer thread takes the jobs in
 * bucket order, writes their entries into the index in large transactions
 * and cuts and registers each bucket, as the one-thread walk did. At most
 * SSD_REBUILD_AHEAD jobs are scanned ahead of the writer, which bounds the
 * memory (a 256 MiB bucket of 4 KiB values is about 1.5 MB of entries). The
 * index sees exactly what the one-thread walk wrote, in the same order, so
 * the result does not depend on how the scans interleave.
 */
#define SSD_REBUILD_SCANNERS 3
#define SSD_REBUILD_AHEAD 6
#define SSD_REBUILD_TXN 32768   /* entries per index transaction: a few leaf pages an entry
                                   at most stays under LMDB's 131,071-page dirty list */

/* One verified record of a job: the key lives in the job's key arena. */
struct ssd_rb_ent {
    uint64_t value_off;
    uint64_t value_len;
    uint64_t key_off;
    uint32_t tenant;
    uint32_t key_len;
    uint32_t crc;
};

/* One bucket file's scan, handed from a scanner to the writer. */
struct ssd_rb_job {
    uint64_t id;
    int fd;                     /* open O_RDWR by the scanner; -1 when it could not be */
    int open_errno;
    struct stat st;
    struct ssd_scan_result res;
    struct ssd_rb_ent *ents;
    size_t n;
    size_t cap;
    uint8_t *keys;
    size_t used;
    size_t kcap;
    int rc;                     /* -ENOMEM when the entries did not fit in memory */
    bool done;                  /* scanned (under the pipe's lock) */
    bool summary;               /* the entries up to sum_covered came from its summary */
    uint64_t sum_covered;
    const char *sum_why;        /* a summary was there but not used: why */
};

struct ssd_rb_pipe {
    struct ssd *t;
    pthread_mutex_t lock;
    pthread_cond_t cond;
    struct ssd_rb_job *jobs;
    size_t n;
    size_t next;                /* the next job a scanner takes */
    size_t consumed;            /* jobs the writer has finished */
    bool stop;
    _Atomic uint64_t scan_cpu_ms;   /* the scanner threads' CPU time, added as they end */
};

static int
ssd_rb_record(void *arg, const struct ssd_rec *rec, uint64_t value_off)
{
    struct ssd_rb_job *j = arg;
    struct ssd_rb_ent *e;

    if (j->n == j->cap) {
        size_t ncap = j->cap != 0 ? j->cap * 2 : 4096;
        struct ssd_rb_ent *p = realloc(j->ents, ncap * sizeof(*p));

        if (p == NULL) {
            j->rc = -ENOMEM;
            return -ENOMEM;
        }
        j->ents = p;
        j->cap = ncap;
    }
    if (j->used + rec->key_len > j->kcap) {
        size_t ncap = j->kcap != 0 ? j->kcap * 2 : 256u << 10;
        uint8_t *p;

        while (ncap < j->used + rec->key_len) {
            ncap *= 2;
        }
        p = realloc(j->keys, ncap);
        if (p == NULL) {
            j->rc = -ENOMEM;
            return -ENOMEM;
        }
        j->keys = p;
        j->kcap = ncap;
    }
    e = &j->ents[j->n++];
    e->tenant = rec->tenant;
    e->key_len = rec->key_len;
    e->key_off = j->used;
    e->value_off = value_off;
    e->value_len = rec->value_len;
    e->crc = rec->value_crc;
    if (rec->key_len > 0) {
        memcpy(j->keys + j->used, rec->key, rec->key_len);
    }
    j->used += rec->key_len;
    return 0;
}

/*
 * ssd_rb_summary: take the job's entries from its bucket's summary file, when
 * there is one that verifies and matches the file (ssd_summary.h). 0 when
 * taken (the values are not read: reads and the scrub check them); else the
 * job is as it was and the caller scans the bucket (sum_why says why, NULL
 * when there was no summary), or -ENOMEM (j->rc).
 */
static int
ssd_rb_summary(struct ssd *t, struct ssd_rb_job *j)
{
    struct ssd_sum_info info;
    uint8_t *buf;
    uint64_t len;
    uint64_t size = (uint64_t)j->st.st_size;
    int rc;

    rc = ssd_sumfile_read(t, j->id, size + SSD_SUM_HDR_SIZE, &buf, &len);
    if (rc == KV_NOT_FOUND) {
        return rc;
    }
    if (rc != 0) {
        j->sum_why = rc == KV_TOO_LARGE ? "it is larger than its bucket file"
                                        : "it cannot be read";
        return rc;
    }
    rc = ssd_sum_decode(buf, len, j->id, size, SSD_SCAN_MAX_KEY, SSD_SCAN_MAX_VALUE, &info,
                        ssd_rb_record, j);
    free(buf);
    if (rc == -ENOMEM) {
        return rc;
    }
    if (rc != 0) {
        j->sum_why = info.why;
        j->n = 0;
        j->used = 0;
        return rc;
    }
    j->summary = true;
    j->sum_covered = info.covered;
    return 0;
}

/* ssd_rb_scan_job: open and walk one bucket file (a scanner thread; touches nothing shared). */
static void
ssd_rb_scan_job(struct ssd *t, struct ssd_rb_job *j, uint8_t *buf)
{
    char path[SSD_PATH_MAX + 64];

    ssd_bucket_path(t, j->id, path, sizeof(path));
    /* O_DIRECT: the walk reads every byte once, and through the page cache the copy out of
     * it was a third of the rebuild's CPU time (perf, 400,000 records of 4 KiB). */
    j->fd = open(path, O_RDWR | O_CLOEXEC | O_DIRECT);
    if (j->fd < 0 && errno == EINVAL) {
        j->fd = open(path, O_RDWR | O_CLOEXEC);
    }
    if (j->fd < 0 || fstat(j->fd, &j->st) != 0) {
        j->open_errno = errno;
        if (j->fd >= 0) {
            close(j->fd);
            j->fd = -1;
        }
        return;
    }
    if (ssd_rb_summary(t, j) == 0) {
        size_t from_summary = j->n;

        /* Records past what the summary covers (none, normally: nothing is appended to a
         * sealed bucket) are scanned; garbage there is cut off as in any scanned bucket. */
        if ((uint64_t)j->st.st_size > j->sum_covered) {
            (void)ssd_scan_fd_from(j->fd, j->sum_covered, buf, SSD_SCAN_BUF, SSD_SCAN_MAX_KEY,
                                   SSD_SCAN_MAX_VALUE, ssd_rb_record, j, &j->res);
        } else {
            memset(&j->res, 0, sizeof(j->res));
            j->res.end = j->sum_covered;
            j->res.file_size = (uint64_t)j->st.st_size;
            j->res.why = SSD_SCAN_END_CLEAN;
        }
        j->res.records += from_summary;
    } else if (j->rc == 0) {
        (void)posix_fadvise(j->fd, 0, 0, POSIX_FADV_SEQUENTIAL);
        (void)ssd_scan_fd(j->fd, buf, SSD_SCAN_BUF, SSD_SCAN_MAX_KEY, SSD_SCAN_MAX_VALUE,
                          ssd_rb_record, j, &j->res);
        (void)posix_fadvise(j->fd, 0, 0, POSIX_FADV_DONTNEED);  /* read once: do not keep it */
    }
    atomic_fetch_add_explicit(&t->rebuild_records, j->n, memory_order_relaxed);
}

/* ssd_rb_thread_cpu_ms: the CPU time of the calling thread (for the rebuild's log line). */
static uint64_t
ssd_rb_thread_cpu_ms(void)
{
    struct timespec ts;

    if (clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts) != 0) {
        return 0;
    }
    return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

static void *
ssd_rb_scanner_main(void *arg)
{
    struct ssd_rb_pipe *p = arg;
    uint8_t *buf = NULL;

    if (posix_memalign((void **)&buf, SSD_REC_ALIGN, SSD_SCAN_BUF) != 0) {
        return NULL;    /* the other scanners (or the writer's wait) carry on */
    }
    pthread_mutex_lock(&p->lock);
    for (;;) {
        struct ssd_rb_job *j;

        while (!p->stop && p->next < p->n && p->next - p->consumed >= SSD_REBUILD_AHEAD) {
            pthread_cond_wait(&p->cond, &p->lock);
        }
        if (p->stop || p->next >= p->n) {
            break;
        }
        j = &p->jobs[p->next++];
        pthread_mutex_unlock(&p->lock);
        ssd_rb_scan_job(p->t, j, buf);
        pthread_mutex_lock(&p->lock);
        j->done = true;
        pthread_cond_broadcast(&p->cond);
    }
    pthread_mutex_unlock(&p->lock);
    free(buf);
    atomic_fetch_add_explicit(&p->scan_cpu_ms, ssd_rb_thread_cpu_ms(), memory_order_relaxed);
    return NULL;
}

static void
ssd_rb_job_free(struct ssd_rb_job *j)
{
    if (j->fd >= 0) {
        close(j->fd);
        j->fd = -1;
    }
    free(j->ents);
    free(j->keys);
    j->ents = NULL;
    j->keys = NULL;
}

/* ssd_rb_index: the job's entries into the index, SSD_REBUILD_TXN per transaction. */
static int
ssd_rb_index(struct ssd *t, const struct ssd_rb_job *j, struct idx_op *ops)
{
    for (size_t i = 0; i < j->n;) {
        size_t k = 0;
        int rc;

        for (; i < j->n && k < SSD_REBUILD_TXN; i++, k++) {
            const struct ssd_rb_ent *e = &j->ents[i];
            struct idx_op *op = &ops[k];

            memset(op, 0, sizeof(*op));
            op->kind = IDX_OBJ_APPEND;
            op->tenant = e->tenant;
            op->key_len = e->key_len;
            op->key = j->keys + e->key_off;
            op->loc.bucket = j->id;
            op->loc.offset = e->value_off;
            op->loc.length = e->value_len;
            op->loc.crc = e->crc;
        }
        rc = idx_apply(t->idx, ops, k);
        if (rc != 0) {
            return rc;
        }
    }
    return 0;
}

/* Loading the rebuilt entries into the store, bucket by bucket. */
struct ssd_rb_load {
    struct ssd_forget *stale;   /* entries of keys put meanwhile, or of unknown buckets */
    uint64_t loaded;            /* entries inserted (replaced ones included) */
    uint64_t replaced;          /* of them, newer records of a key loaded from an older one */
    uint64_t kept;              /* entries left out: a client's put of the key wins */
};

/*
 * ssd_rb_replace: key, loaded earlier in this rebuild from an older record,
 * has a newer one at sl: the older copy leaves the table (counted out of its
 * bucket) and the newer goes in. 0 when replaced; KV_EXISTS when the key is
 * not an older record of this rebuild (a client's put: it wins); -ENOMEM.
 */
static int
ssd_rb_replace(struct ssd *t, const struct kv_key *k, uint64_t length, const struct store_loc *sl)
{
    struct store_obj *o = NULL;
    struct store_loc old;
    uint64_t size;

    /* Only this rebuild gives an object a location while it runs (the writer is busy with
     * it), so a stored, non-resident object of the key is an older record of the walk. */
    if (store_get_stored(t->store, k, &o) != 0) {
        return KV_EXISTS;
    }
    store_stored_loc(t->store, o, &old);
    size = store_obj_size(o);
    store_obj_unref(t->store, o);
    if (store_drop_stored(t->store, k, &old) != 1) {
        return KV_EXISTS;       /* read into DRAM meanwhile: that copy stays */
    }
    (void)ssd_bucket_account(t, old.bucket, -(int64_t)ssd_rec_size(k->len, size));
    CTR_SUB(t, objects, 1);
    CTR_SUB(t, bytes, size);
    return store_insert_stored(t->store, k, length, sl);
}

/* ssd_rb_load_job: a registered bucket's verified entries into the store (writer thread). */
static int
ssd_rb_load_job(struct ssd *t, const struct ssd_rb_job *j, struct ssd_rb_load *c)
{
    for (size_t i = 0; i < j->n; i++) {
        const struct ssd_rb_ent *e = &j->ents[i];
        struct kv_key k = {.tenant = e->tenant, .len = e->key_len, .ptr = j->keys + e->key_off};
        struct store_loc sl = {.bucket = (uint32_t)j->id, .crc = e->crc,
                               .offset = e->value_off};
        int rc;

        /* Counted in (objects, bytes, the bucket's live bytes) whether loaded or not: a
         * stale entry is counted out again by ssd_forget_done when its delete commits. */
        if (!ssd_bucket_account(t, j->id, (int64_t)ssd_rec_size(e->key_len, e->value_len))) {
            rc = KV_NOT_FOUND;      /* its bucket file could not be reopened */
        } else {
            CTR_ADD(t, objects, 1);
            CTR_ADD(t, bytes, e->value_len);
            rc = store_insert_stored(t->store, &k, e->value_len, &sl);
            if (rc == KV_EXISTS) {
                rc = ssd_rb_replace(t, &k, e->value_len, &sl);
                c->replaced += rc == 0;
            }
        }
        if (rc == -ENOMEM) {
            return rc;
        }
        if (rc == 0) {
            c->loaded++;
            continue;
        }
        /* KV_EXISTS: a client put the key meanwhile, and its value wins. */
        struct ssd_forget *f = ssd_forget_new(&k, &sl, e->value_len);

        c->kept++;
        if (f != NULL) {
            f->next = c->stale;
            c->stale = f;
        }
    }
    return 0;
}

/* Totals of a rebuild, for its log line. */
struct ssd_rb_totals {
    uint64_t records;
    uint64_t bad_values;
    uint64_t damaged;       /* buckets whose walk stopped at damage or a cut */
    uint64_t cut_bytes;     /* bytes cut off after the last whole record */
    uint64_t empty;         /* bucket files without a whole record (removed) */
    uint64_t unreadable;    /* bucket files that could not be opened */
    uint64_t summary;       /* buckets whose entries came from their summary */
    uint64_t scanned;       /* buckets read whole (no summary, or one that did not verify) */
    uint64_t wait_ms;       /* the writer waiting for the scanners (the disk, or CRC) */
    uint64_t scan_cpu_ms;   /* CPU time of the scanner threads (reads, CRC) */
};

/*
 * ssd_rb_bucket: on the writer thread, a scanned bucket: index its records,
 * cut the file back to its last whole record, add the bucket to the table
 * (sealed) and its entries to the store. 0, or an index error or -ENOMEM
 * (the rebuild stops).
 */
static int
ssd_rb_bucket(struct ssd *t, struct ssd_rb_job *j, struct idx_op *ops,
              struct ssd_rb_totals *tot, struct ssd_rb_load *load)
{
    char path[SSD_PATH_MAX + 64];
    const struct ssd_scan_result *res = &j->res;
    struct ssd_bucket *b;
    struct idx_op op;
    int rc;

    ssd_bucket_path(t, j->id, path, sizeof(path));
    if (j->fd < 0) {
        log_error("ssd: rebuild: %s: %s; skipped", path, strerror(j->open_errno));
        tot->unreadable++;
        return 0;
    }
    if (j->rc != 0) {
        return j->rc;
    }
    rc = ssd_rb_index(t, j, ops);
    if (rc != 0) {
        return rc;
    }
    tot->records += res->records;
    tot->bad_values += res->bad_values;
    if (j->summary) {
        tot->summary++;
        atomic_fetch_add_explicit(&t->rebuild_summary_buckets, 1, memory_order_relaxed);
    } else {
        tot->scanned++;
        atomic_fetch_add_explicit(&t->rebuild_scanned_buckets, 1, memory_order_relaxed);
    }
    if (j->sum_why != NULL) {
        /* Read whole instead; the summary goes (it would be refused again). */
        log_warn("ssd: rebuild: %s: its summary is not used (%s); the bucket was read whole",
                 path, j->sum_why);
        ssd_sumfile_remove(t, j->id);
    }
    if (res->why != SSD_SCAN_END_CLEAN || res->bad_values > 0) {
        tot->damaged++;
        log_warn("ssd: rebuild: %s: %" PRIu64 " whole records kept, %" PRIu64
                 " with a bad value skipped; the walk stopped at offset %" PRIu64 " of %" PRIu64
                 " (%s%s%s)", path, res->records, res->bad_values, res->end, res->file_size,
                 ssd_scan_end_name(res->why), res->rc != 0 ? ": " : "",
                 res->rc != 0 ? strerror(-res->rc) : "");
    }
    if (res->why != SSD_SCAN_END_IO && res->file_size > res->end) {
        /* Past the last whole record: zeros, a torn append, garbage, or damage the walk
         * cannot pass safely (ssd_scan.h). New records go to new buckets anyway. */
        if (ftruncate(j->fd, (off_t)res->end) != 0) {
            log_error("ssd: rebuild: ftruncate(%s): %s", path, strerror(errno));
        } else {
            tot->cut_bytes += res->file_size - res->end;
        }
    }
    close(j->fd);
    j->fd = -1;
    if (res->end == 0) {
        if (res->why != SSD_SCAN_END_IO && unlink(path) == 0) {
            ssd_sumfile_remove(t, j->id);
            tot->empty++;
        }
        return 0;
    }

    b = calloc(1, sizeof(*b));
    if (b == NULL) {
        return -ENOMEM;
    }
    b->id = j->id;
    b->created_ms = (uint64_t)j->st.st_mtim.tv_sec * 1000
                    + (uint64_t)j->st.st_mtim.tv_nsec / 1000000;
    b->last_read_ms = b->created_ms;
    b->total_bytes = res->end;
    b->committed_bytes = res->end;
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
    if (j->id >= t->next_id) {
        t->next_id = j->id + 1;
    }
    /* The bucket's record now, so the entries just committed never name an unknown bucket. */
    memset(&op, 0, sizeof(op));
    op.kind = IDX_BUCKET_PUT;
    ssd_bucket_record(b, &op.bucket);
    rc = idx_apply(t->idx, &op, 1);
    if (rc != 0) {
        return rc;
    }
    if (j->summary) {
        ssd_scrub_add(t, j->id, j->sum_covered);    /* its values are checked after the rebuild */
    }
    return ssd_rb_load_job(t, j, load);
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

/*
 * ssd_rb_walk: the pipeline over the n bucket files ids[] (ascending): scanner threads
 * read and verify, this thread indexes and registers each bucket in order. 0,
 * KV_UNAVAILABLE when shutdown stopped it, or the first index error.
 */
static int
ssd_rb_walk(struct ssd *t, const uint64_t *ids, size_t n, struct ssd_rb_totals *tot,
            struct ssd_rb_load *load)
{
    struct ssd_rb_pipe p;
    pthread_t tid[SSD_REBUILD_SCANNERS];
    int nthreads = 0;
    struct idx_op *ops = calloc(SSD_REBUILD_TXN, sizeof(*ops));
    int rc = 0;

    memset(&p, 0, sizeof(p));
    p.t = t;
    p.n = n;
    p.jobs = calloc(n > 0 ? n : 1, sizeof(*p.jobs));
    if (ops == NULL || p.jobs == NULL) {
        free(ops);
        free(p.jobs);
        return -ENOMEM;
    }
    for (size_t i = 0; i < n; i++) {
        p.jobs[i].id = ids[i];
        p.jobs[i].fd = -1;
    }
    pthread_mutex_init(&p.lock, NULL);
    pthread_cond_init(&p.cond, NULL);
    for (int k = 0; k < SSD_REBUILD_SCANNERS && (size_t)k < n; k++) {
        if (pthread_create(&tid[nthreads], NULL, ssd_rb_scanner_main, &p) == 0) {
            nthreads++;
        }
    }
    for (size_t i = 0; i < n; i++) {
        struct ssd_rb_job *j = &p.jobs[i];

        if (nthreads == 0) {
            /* No scanner thread could start: this thread scans, as before the pipeline. */
            uint8_t *buf = NULL;

            if (posix_memalign((void **)&buf, SSD_REC_ALIGN, SSD_SCAN_BUF) != 0) {
                rc = -ENOMEM;
                break;
            }
            ssd_rb_scan_job(t, j, buf);
            free(buf);
            j->done = true;
        }
        uint64_t w0 = clock_ms();

        pthread_mutex_lock(&p.lock);
        while (!j->done) {
            struct timespec ts;

            /* Timed: a shutdown request is seen within 100 ms even while a scan runs. */
            clock_gettime(CLOCK_REALTIME, &ts);
            ts.tv_nsec += 100 * 1000 * 1000;
            if (ts.tv_nsec >= 1000000000) {
                ts.tv_sec++;
                ts.tv_nsec -= 1000000000;
            }
            (void)pthread_cond_timedwait(&p.cond, &p.lock, &ts);
            if (!j->done && ssd_rb_stopping(t)) {
                break;
            }
        }
        pthread_mutex_unlock(&p.lock);
        tot->wait_ms += clock_ms() - w0;
        if (ssd_rb_stopping(t)) {
            log_warn("ssd: rebuild of %s stopped by shutdown after %zu of %zu buckets; the next "
                     "start rebuilds again", t->dir, i, n);
            rc = KV_UNAVAILABLE;
            break;
        }
        rc = ssd_rb_bucket(t, j, ops, tot, load);
        ssd_rb_job_free(j);
        if (rc != 0) {
            log_error("ssd: rebuild of %s: bucket %" PRIu64 ": %s", t->dir, ids[i],
                      kv_strerror(rc));
            break;
        }
        pthread_mutex_lock(&p.lock);
        p.consumed = i + 1;
        pthread_cond_broadcast(&p.cond);
        pthread_mutex_unlock(&p.lock);
        atomic_fetch_add_explicit(&t->rebuild_buckets_done, 1, memory_order_relaxed);
        atomic_store(&t->rebuild_ms, clock_ms() - t->rebuild_t0);
    }
    pthread_mutex_lock(&p.lock);
    p.stop = true;
    pthread_cond_broadcast(&p.cond);
    pthread_mutex_unlock(&p.lock);
    for (int k = 0; k < nthreads; k++) {
        pthread_join(tid[k], NULL);
    }
    tot->scan_cpu_ms = atomic_load(&p.scan_cpu_ms);
    for (size_t i = 0; i < n; i++) {
        ssd_rb_job_free(&p.jobs[i]);
    }
    pthread_cond_destroy(&p.cond);
    pthread_mutex_destroy(&p.lock);
    free(p.jobs);
    free(ops);
    return rc;
}

/*
 * KVSTASH_TEST_REBUILD_PAUSE_MS (tests only): the rebuild waits that long (at most a minute,
 * in 50 ms steps that watch for shutdown) before it starts, so that a test can watch the
 * tier loading (a pool member stays joining meanwhile).
 */
static void
ssd_rb_test_pause(struct ssd *t)
{
    const char *env = getenv("KVSTASH_TEST_REBUILD_PAUSE_MS");
    long ms = env != NULL ? strtol(env, NULL, 10) : 0;

    for (long waited = 0; waited < ms && waited < 60000 && !ssd_rb_stopping(t); waited += 50) {
        struct timespec step = {0, 50 * 1000000L};

        nanosleep(&step, NULL);
    }
}

int
ssd_rebuild(struct ssd *t)
{
    struct ssd_rb_totals tot;
    struct ssd_rb_load load;
    uint64_t *ids;
    size_t n;
    bool stopped = false;
    uint64_t walk_ms = 0;
    uint64_t cpu_ms = ssd_rb_thread_cpu_ms();
    int rc = 0;

    memset(&tot, 0, sizeof(tot));
    memset(&load, 0, sizeof(load));
    ids = ssd_bucket_file_ids(t, &n);
    atomic_store(&t->rebuild_buckets, n);
    log_warn("ssd: rebuilding the index of %s from %zu bucket file(s); DRAM serves meanwhile, "
             "SSD objects come back when it is done", t->dir, n);
    if (n > 0 && ids == NULL) {
        rc = -ENOMEM;
        goto done;
    }
    (void)idx_set_sync(t->idx, 0);
    ssd_rb_test_pause(t);
    rc = ssd_rb_walk(t, ids, n, &tot, &load);
    walk_ms = clock_ms() - t->rebuild_t0;
    if (rc == KV_UNAVAILABLE) {
        stopped = true;
    }
    if (rc != 0) {
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
    t->start_objects = load.loaded - load.replaced;
    ssd_sumfile_remove_orphans(t);

done:
    while (load.stale != NULL) {
        struct ssd_forget *f = load.stale;

        load.stale = f->next;
        ssd_forget_push(t, f);
    }
    (void)idx_set_sync(t->idx, 1);
    atomic_store(&t->rebuild_ms, clock_ms() - t->rebuild_t0);
    cpu_ms = ssd_rb_thread_cpu_ms() - cpu_ms;
    if (rc == 0) {
        log_info("ssd: index of %s rebuilt in %" PRIu64 " ms (%" PRIu64 " ms reading, checking, "
                 "indexing and loading the buckets, %" PRIu64 " of it waiting for the reads, the "
                 "rest the final commit; CPU: %" PRIu64 " ms indexing and loading, %" PRIu64
                 " ms reading and checking): %zu bucket "
                 "file(s), %" PRIu64 " from their summaries (values checked by the scrub that "
                 "follows), %" PRIu64 " read whole; %" PRIu64 " whole records, %" PRIu64
                 " loaded into the "
                 "table (%" PRIu64 " of them replacing an older copy of the same key), %" PRIu64
                 " left to keys clients put meanwhile, %" PRIu64
                 " records with a bad value skipped, %" PRIu64 " file(s) cut at damage or a torn"
                 " end (%" PRIu64 " bytes), %" PRIu64 " without a whole record removed, %" PRIu64
                 " unreadable",
                 t->dir, atomic_load(&t->rebuild_ms), walk_ms, tot.wait_ms, cpu_ms, tot.scan_cpu_ms,
                 n, tot.summary, tot.scanned, tot.records,
                 load.loaded,
                 load.replaced, load.kept, tot.bad_values, tot.damaged,
                 tot.cut_bytes, tot.empty, tot.unreadable);
    }
    free(ids);
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
    if (rc == 0) {
        ssd_scrub_start(t);     /* the tier is ready first: the scrub checks in the background */
    }
    return rc;
}
