/*
 * ssd_writer: the SSD tier's writer thread: it appends records to their
 * owner's open bucket, syncs, and commits the index entries that make them visible, one
 * transaction per group; it applies deletes (forgets), keeps usage under
 * the watermarks, and handles write faults. Nothing else writes bucket
 * files or the index after start-up.
 *
 * Order of a write: records are appended to the open bucket, the bucket is
 * synced (fdatasync), then one index transaction makes the group visible,
 * then the store learns that the objects are stored. A crash at any point
 * leaves either a visible record that is on disk or an unindexed tail that
 * the next start truncates. A failed fdatasync is never retried: the bucket
 * is dropped with everything in it (Linux may have thrown away the dirty
 * pages a failed fsync reported, so a retry could "succeed" over lost data).
 */
#include "ssd_int.h"
#include "clock.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <linux/aio_abi.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#include "kverr.h"
#include "crc32c.h"
#include "log.h"
#include "prio.h"
#include "ssd_index.h"
#include "ssd_record.h"

int
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

/*
 * ssd_rollback: cut a bucket back to what its last commit made visible
 * (records after that were never indexed) and seal it. Its committed records
 * were synced by an fdatasync that succeeded, so they stay.
 */
void
ssd_rollback(struct ssd *t, struct ssd_bucket *b)
{
    if (b->total_bytes > b->committed_bytes || b->alloc_bytes > b->committed_bytes) {
        if (ftruncate(b->fd, (off_t)b->committed_bytes) != 0) {
            log_error("ssd: ftruncate of bucket %" PRIu64 ": %s", b->id, strerror(errno));
        }
        CTR_SUB(t, disk_bytes, b->total_bytes - b->committed_bytes);
        b->alloc_bytes = b->committed_bytes;
    }
    ssd_sumfile_rollback(b);
    pthread_mutex_lock(&t->blk);
    b->total_bytes = b->committed_bytes;
    b->sealed = true;
    b->dirty = true;
    pthread_mutex_unlock(&t->blk);
    ssd_unopen(t, b);
}

/*
 * ssd_fault: a write, sync or commit failed: suspend writes. b, when not
 * NULL, is dropped with everything in it (a failed fdatasync or an I/O
 * error: its data cannot be trusted); a full disk only costs the records
 * not committed yet, which the caller rolled back.
 */
void
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
    t->retry_at = clock_ms() + SSD_RETRY_MS;
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

/*
 * ssd_bucket_limit: the size at which owner's open bucket is sealed:
 * ssd_bucket_size, or for a tenant's own buckets a quarter of its share
 * when that is smaller (not under SSD_OWNED_MIN_BUCKET), so that evicting
 * its oldest bucket for its own new records costs it at most about a
 * quarter of what it keeps.
 */
uint64_t
ssd_bucket_limit(struct ssd *t, uint32_t owner)
{
    uint64_t size = atomic_load(&t->bucket_size);
    uint64_t part = owner != 0 ? store_ssd_share(t->store, owner) / 4 : 0;

    if (part != 0) {
        part = part > SSD_OWNED_MIN_BUCKET ? part : SSD_OWNED_MIN_BUCKET;
        size = part < size ? part : size;
    }
    return size;
}

/*
 * A group: the objects one commit makes visible. Their records are written
 * with Linux AIO (io_submit of O_DIRECT pwritevs, all in flight at once, so
 * the device sees a deep queue while the writer checksums the next record),
 * or with synchronous pwritev where AIO is not to be had (no context, a
 * bucket without O_DIRECT). Each record keeps its iovecs and header block
 * until the group's writes are reaped.
 */
struct ssd_group {
    struct store_obj *obj[SSD_GROUP_OBJECTS];
    struct store_loc loc[SSD_GROUP_OBJECTS];
    uint64_t rec[SSD_GROUP_OBJECTS];
    struct iovec iov[SSD_GROUP_OBJECTS][STORE_MAX_EXTENTS + 1];
    struct iocb cb[SSD_GROUP_OBJECTS];
    int n;
    int inflight;               /* AIO writes submitted and not reaped */
    int fail_fd;                /* the file of the first AIO write that failed, or -1 */
};

/* Linux AIO through its system calls (no libaio): the writer's one context. */
static int
ssd_aio_setup(struct ssd *t)
{
    aio_context_t ctx = 0;

    if (syscall(SYS_io_setup, SSD_GROUP_OBJECTS, &ctx) != 0) {
        log_warn("ssd: io_setup: %s; records are written one synchronous pwritev at a time",
                 strerror(errno));
        t->aio = 0;
        return -errno;
    }
    t->aio = (uint64_t)ctx;
    return 0;
}

static void
ssd_aio_destroy(struct ssd *t)
{
    if (t->aio != 0) {
        (void)syscall(SYS_io_destroy, (aio_context_t)t->aio);
        t->aio = 0;
    }
}

/*
 * ssd_aio_reap: wait for every write of g in flight. A short write is
 * finished with pwritev; returns 0 or the first error (-errno).
 */
static int
ssd_aio_reap(struct ssd *t, struct ssd_group *g)
{
    struct io_event ev[SSD_GROUP_OBJECTS];
    int rc = 0;

    while (g->inflight > 0) {
        long got = syscall(SYS_io_getevents, (aio_context_t)t->aio, 1, SSD_GROUP_OBJECTS, ev,
                           NULL);

        if (got < 0) {
            if (errno == EINTR) {
                continue;
            }
            /* Cannot happen with a valid context; the writes' fate is unknown. */
            log_error("ssd: io_getevents: %s", strerror(errno));
            g->inflight = 0;
            return -EIO;
        }
        for (long i = 0; i < got; i++) {
            struct iocb *cb = (struct iocb *)(uintptr_t)ev[i].obj;
            int slot = (int)(cb - g->cb);
            uint64_t want = 0;

            g->inflight--;
            for (int k = 0; k < (int)cb->aio_nbytes; k++) {
                want += g->iov[slot][k].iov_len;
            }
            if (ev[i].res < 0) {
                if (rc == 0) {
                    rc = (int)ev[i].res;
                    g->fail_fd = (int)cb->aio_fildes;
                }
            } else if ((uint64_t)ev[i].res < want && rc == 0) {
                /* Short: write the rest synchronously (a full disk reports itself there). */
                struct iovec rest[STORE_MAX_EXTENTS + 1];
                uint64_t skip = (uint64_t)ev[i].res;
                int n = 0;

                for (int k = 0; k < (int)cb->aio_nbytes; k++) {
                    struct iovec v = g->iov[slot][k];

                    if (skip >= v.iov_len) {
                        skip -= v.iov_len;
                        continue;
                    }
                    v.iov_base = (uint8_t *)v.iov_base + skip;
                    v.iov_len -= skip;
                    skip = 0;
                    rest[n++] = v;
                }
                rc = ssd_pwritev_all((int)cb->aio_fildes, rest, n,
                                     (uint64_t)cb->aio_offset + (uint64_t)ev[i].res);
                if (rc != 0) {
                    g->fail_fd = (int)cb->aio_fildes;
                }
            }
        }
    }
    return rc;
}

/*
 * ssd_write_record: write slot's iovecs at off of b: submitted to AIO when
 * b is O_DIRECT and the context is there, else written now.
 */
static int
ssd_write_record(struct ssd *t, struct ssd_group *g, int slot, int n, struct ssd_bucket *b,
                 uint64_t off)
{
    struct iocb *cb = &g->cb[slot];
    struct iocb *cbs[1] = { cb };

    if (t->aio == 0 || !b->direct) {
        return ssd_pwritev_all(b->fd, g->iov[slot], n, off);
    }
    memset(cb, 0, sizeof(*cb));
    cb->aio_lio_opcode = IOCB_CMD_PWRITEV;
    cb->aio_fildes = (uint32_t)b->fd;
    cb->aio_buf = (uint64_t)(uintptr_t)g->iov[slot];
    cb->aio_nbytes = (uint64_t)n;
    cb->aio_offset = (int64_t)off;
    for (;;) {
        long r = syscall(SYS_io_submit, (aio_context_t)t->aio, 1, cbs);

        if (r == 1) {
            g->inflight++;
            return 0;
        }
        if (r < 0 && errno == EINTR) {
            continue;
        }
        if (r < 0 && errno == EAGAIN) {
            int rc = ssd_aio_reap(t, g);   /* the queue is full: let it drain */

            if (rc != 0) {
                return rc;
            }
            continue;
        }
        return ssd_pwritev_all(b->fd, g->iov[slot], n, off);
    }
}

/*
 * ssd_bucket_grow: preallocate b's file up to its bucket limit (at least
 * past rec more bytes), so that O_DIRECT writes land inside the file and
 * run asynchronously. Done when the bucket is new, with no write in flight:
 * fallocate waits for every direct write in flight on the file (measured:
 * 18 ms a call, the queue drained each time, when it grew 64 MiB at a
 * time). The preallocated tails of the open buckets count against
 * ssd_size with the records, so the files never pass it; where there is no
 * room, or the file system cannot, writes extend the file and run one at a
 * time: slower, not wrong.
 */
static void
ssd_bucket_grow(struct ssd *t, struct ssd_bucket *b, uint32_t owner, uint64_t rec)
{
    uint64_t limit = ssd_bucket_limit(t, owner);
    uint64_t end = limit > b->total_bytes + rec ? limit : b->total_bytes + rec;
    uint64_t size = atomic_load(&t->size);
    uint64_t used = CTR_GET(t, disk_bytes);
    uint64_t room;

    for (int i = 0; i < t->nopen; i++) {
        const struct ssd_bucket *x = t->open[i];

        if (x != b && x->alloc_bytes > x->total_bytes) {
            used += x->alloc_bytes - x->total_bytes;
        }
    }
    room = size > used ? size - used : 0;
    if (end - b->total_bytes > room) {
        end = b->total_bytes + room;
    }
    if (b->alloc_bytes < b->total_bytes) {
        b->alloc_bytes = b->total_bytes;
    }
    if (end >= b->total_bytes + rec && end > b->alloc_bytes
        && fallocate(b->fd, 0, (off_t)b->alloc_bytes, (off_t)(end - b->alloc_bytes)) == 0) {
        b->alloc_bytes = end;
    }
}

/*
 * ssd_append: write one object's record at the end of its owner's open
 * bucket (opening one when needed). Returns 0 and *loc; KV_TOO_LARGE,
 * KV_QUOTA_EXCEEDED or KV_NO_SPACE when this object alone cannot go;
 * another error (the caller
 * fails the group) with *used the bucket that failed, or NULL.
 */
static int
ssd_append(struct ssd *t, struct ssd_group *g, int slot, struct ssd_bucket **used)
{
    struct store_obj *o = g->obj[slot];
    struct store_loc *loc = &g->loc[slot];
    struct iovec *iov = g->iov[slot];
    uint8_t *hdr = t->hdr + (uint64_t)slot * t->hdr_cap;
    struct kv_key key;
    struct ssd_rec rec;
    struct ssd_bucket *b;
    uint32_t owner;
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
    *used = NULL;
    if (hdr_block > t->hdr_cap || rec_size > atomic_load(&t->size)) {
        return KV_TOO_LARGE;
    }
    owner = store_ssd_owner(t->store, key.tenant);
    rc = ssd_share_room(t, owner, rec_size);
    if (rc == 0) {
        rc = ssd_make_room(t, rec_size, owner);
    }
    if (rc != 0) {
        return rc;
    }
    b = ssd_open_of(t, owner);
    if (b != NULL && b->total_bytes > 0
        && b->total_bytes + rec_size > ssd_bucket_limit(t, owner)) {
        ssd_unopen(t, b);
        b = NULL;
    }
    if (b == NULL) {
        rc = ssd_bucket_create(t, owner, &b);
        if (rc != 0) {
            return rc;
        }
    }
    *used = b;
    if (b->direct && t->aio != 0 && b->total_bytes + rec_size > b->alloc_bytes) {
        ssd_bucket_grow(t, b, owner, rec_size);
    }

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
    ssd_rec_encode(&rec, hdr);
    iov[0].iov_base = hdr;
    iov[0].iov_len = hdr_block;

    rc = ssd_write_record(t, g, slot, n + 1, b, b->total_bytes);
    if (rc != 0) {
        return rc;
    }
    ssd_sumfile_add(b, &rec, b->total_bytes);
    loc->bucket = (uint32_t)b->id;
    loc->crc = crc;
    loc->offset = b->total_bytes + hdr_block;
    pthread_mutex_lock(&t->blk);
    b->total_bytes += rec_size;
    b->live_bytes += rec_size;
    b->dirty = true;
    pthread_mutex_unlock(&t->blk);
    CTR_ADD(t, disk_bytes, rec_size);
    g->rec[slot] = rec_size;
    return 0;
}

static void
ssd_group_fail(struct ssd *t, struct ssd_group *g, int from)
{
    for (int i = from; i < g->n; i++) {
        store_obj_store_failed(t->store, g->obj[i]);
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

/* Append the records of the buckets that changed since they were last written. */
static size_t
ssd_bucket_ops(struct ssd *t, struct idx_op *ops, size_t max)
{
    size_t n = 0;

    pthread_mutex_lock(&t->blk);
    for (size_t i = 0; i < t->nbuckets && n < max; i++) {
        struct ssd_bucket *b = t->buckets[i];

        ssd_fold_stamp_locked(t, b);
        if (b->open || b->dirty) {
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

    g->fail_fd = -1;
    for (written = 0; written < g->n; written++) {
        struct ssd_bucket *b = NULL;
        int k = 0;

        rc = ssd_append(t, g, written, &b);
        if (rc == KV_TOO_LARGE || rc == KV_NO_SPACE || rc == KV_QUOTA_EXCEEDED) {
            /* This object alone cannot go to the SSD (too big, no room in its
             * tenant's share, or none it may take from others'); the others can. */
            if (rc != KV_QUOTA_EXCEEDED) {
                CTR_ADD(t, no_space, 1);    /* a record larger than ssd_size included */
            }
            store_obj_store_failed(t->store, g->obj[written]);
            CTR_ADD(t, write_failed, 1);
            g->obj[written] = NULL;
            rc = 0;
            continue;
        }
        if (rc != 0) {
            fault = b;
            what = "write";
            break;
        }
        while (k < ntouched && touched[k] != b) {
            k++;
        }
        if (k == ntouched) {
            /* Records of several owners go to their own buckets: each is synced once. */
            touched[ntouched++] = b;
            pthread_mutex_lock(&t->blk);
            b->in_group = true;
            pthread_mutex_unlock(&t->blk);
        }
    }
    if (g->inflight > 0) {
        /* Every write in flight ends before anything is synced, cut back or freed. */
        int arc;

        arc = ssd_aio_reap(t, g);
        if (rc == 0 && arc != 0) {
            rc = arc;
            what = "write";
            for (int i = 0; i < ntouched; i++) {
                if (touched[i]->fd == g->fail_fd) {
                    fault = touched[i];
                }
            }
        }
    }
    for (int i = 0; rc == 0 && i < ntouched; i++) {
        if (fdatasync(touched[i]->fd) != 0) {
            rc = -errno;
            fault = touched[i];
            what = "fdatasync";
        }
    }
    if (rc == 0) {
        rc = ssd_dir_sync(t);
        what = "directory fsync";
    }
    pthread_mutex_lock(&t->blk);
    for (int i = 0; i < ntouched; i++) {
        touched[i]->in_group = false;
    }
    pthread_mutex_unlock(&t->blk);
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
        ssd_sumfile_commit(touched[i]);
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

/*
 * ssd_cut_tails: cut the preallocated tails of sealed buckets, so a sealed
 * file is as long as its records. Done here, between groups, not when the
 * bucket is sealed: ftruncate waits for the direct writes in flight on the
 * file, and a bucket fills up in the middle of a group.
 */
static void
ssd_cut_tails(struct ssd *t)
{
    for (;;) {
        struct ssd_bucket *cut = NULL;

        pthread_mutex_lock(&t->blk);
        for (size_t i = 0; i < t->nbuckets && cut == NULL; i++) {
            struct ssd_bucket *b = t->buckets[i];

            if (!b->open && !b->dropping && b->alloc_bytes > b->total_bytes) {
                cut = b;
            }
        }
        pthread_mutex_unlock(&t->blk);
        if (cut == NULL) {
            return;
        }
        if (ftruncate(cut->fd, (off_t)cut->total_bytes) != 0) {
            log_error("ssd: ftruncate of bucket %" PRIu64 ": %s", cut->id, strerror(errno));
        }
        cut->alloc_bytes = cut->total_bytes;
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
    for (int i = t->nopen - 1; i >= 0; i--) {
        struct ssd_bucket *b = t->open[i];

        if (b->owner != 0 && store_ssd_owner(t->store, b->owner) != b->owner) {
            ssd_unopen(t, b);       /* its owner's share was taken away by a reload */
        }
    }
    ssd_cut_tails(t);
    ssd_sumfile_write_sealed(t);
    for (; !t->rebuild_failed;) {
        struct ssd_bucket *empty = NULL;

        pthread_mutex_lock(&t->blk);
        for (size_t i = 0; i < t->nbuckets; i++) {
            struct ssd_bucket *b = t->buckets[i];

            if (!b->open && !b->dropping && b->live_bytes == 0) {
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
    (void)ssd_make_room(t, 0, 0);
    if (!t->degraded && !t->rebuild_failed) {
        ssd_compact_some(t);
    }
}


/*
 * Admission under ssd_write_rate_limit (flash endurance). An on-evict
 * offload is written only when the budget allows it: a token bucket filled
 * at the limit (at most one second of it saved up, starting empty, so the
 * bytes written since the start never pass limit x elapsed plus one
 * record), and, in front of it, a random test whose probability follows the
 * limit over the offered rate of the last window (CacheLib's "dynamic
 * random" admission): when the disk is offered twice the limit, about every
 * other object goes, spread over the evictions instead of the first ones of
 * every second. Refused objects stay in DRAM until evicted uncopied
 * (ssd_offload_dropped, ssd_rate_limited). Durable puts and write_through
 * are never refused: those copies were promised.
 */
static uint64_t
ssd_rng(struct ssd *t)
{
    uint64_t x = t->rate_rng != 0 ? t->rate_rng : 0x9e3779b97f4a7c15ull;

    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    t->rate_rng = x;
    return x;
}

static bool
ssd_admit(struct ssd *t, uint64_t bytes)
{
    uint64_t limit = atomic_load(&t->rate_limit);
    uint64_t now = clock_ns() / 1000;
    double p;

    if (limit == 0) {
        t->rate_at_us = 0;
        return true;
    }
    if (t->rate_at_us == 0) {
        /* Limit just set (start or reload): the budget starts empty. */
        t->rate_at_us = now;
        t->rate_tokens = 0;
        t->rate_window_at = now;
        t->rate_offered = 0;
        t->rate_p = 1.0;
    }
    if (now > t->rate_at_us) {
        double add = (double)limit * (double)(now - t->rate_at_us) / 1e6;
        double tokens = (double)t->rate_tokens + add;

        t->rate_tokens = tokens > (double)limit ? (int64_t)limit : (int64_t)tokens;
        t->rate_at_us = now;
    }
    t->rate_offered += bytes;
    if (now - t->rate_window_at >= SSD_RATE_WINDOW_MS * 1000ull) {
        double offered = (double)t->rate_offered * 1e6 / (double)(now - t->rate_window_at);

        p = offered > 0 ? (double)limit / offered : 1.0;
        /* Smoothed, and never so low that nothing passes while the budget fills. */
        t->rate_p = 0.5 * t->rate_p + 0.5 * (p > 1.0 ? 1.0 : p < 0.01 ? 0.01 : p);
        t->rate_window_at = now;
        t->rate_offered = 0;
    }
    if (t->rate_p < 1.0 && (double)(ssd_rng(t) >> 11) / 9007199254740992.0 >= t->rate_p) {
        return false;
    }
    /* A record over a second's budget passes once the budget is full (then owes it). */
    if (t->rate_tokens < (int64_t)(bytes < limit ? bytes : limit)) {
        return false;
    }
    t->rate_tokens -= (int64_t)bytes;
    return true;
}

/* ssd_admit_group: refuse the on-evict offloads of g the rate limit has no room for. */
static void
ssd_admit_group(struct ssd *t, struct ssd_group *g)
{
    int kept = 0;

    if (atomic_load(&t->rate_limit) == 0 && t->rate_at_us == 0) {
        return;
    }
    for (int i = 0; i < g->n; i++) {
        struct store_obj *o = g->obj[i];
        struct kv_key key;

        store_obj_key(o, &key);
        if (atomic_load(&t->offload) != SSD_ON_EVICT || store_obj_must_write(o)
            || ssd_admit(t, ssd_rec_size(key.len, store_obj_size(o)))) {
            g->obj[kept++] = o;
            continue;
        }
        store_obj_store_failed(t->store, o);
        CTR_ADD(t, rate_limited, 1);
    }
    g->n = kept;
}

/*
 * ssd_writer_priority: raise this thread's priority by SSD_WRITER_NICE when
 * the process may (root, CAP_SYS_NICE, RLIMIT_NICE). The writer needs a
 * fraction of a core to keep the disk busy (checksums, submissions), but on
 * a loaded host it waited its turn among the event loops and the engines'
 * threads it serves, and wrote at a third of the disk's rate while runnable
 * most of the time. It never spins, so the priority only takes what it uses.
 */
static void
ssd_writer_priority(void)
{
    int rc = prio_thread_nice(-SSD_WRITER_NICE);

    if (rc != 0) {
        log_info("ssd: the writer thread keeps the process's priority (raising it by %d: %s)",
                 SSD_WRITER_NICE, strerror(-rc));
    }
}

void *
ssd_writer_main(void *arg)
{
    struct ssd *t = arg;
    struct ssd_group g;

    (void)pthread_setname_np(pthread_self(), "kvstash-ssdw");
    ssd_writer_priority();
    g.n = 0;
    g.inflight = 0;
    g.fail_fd = -1;
    if (t->rebuild && ssd_rebuild(t) == KV_UNAVAILABLE) {
        return NULL;    /* closing mid-rebuild: its buckets must not look empty to housekeeping */
    }
    (void)ssd_aio_setup(t);
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
        now = clock_ms();
        if (g.n > 0 && t->degraded && now < t->retry_at) {
            ssd_group_fail(t, &g, 0);       /* fail fast until the retry time */
        }
        ssd_admit_group(t, &g);
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
            /*
             * Written ahead only into room below the low watermark: a write ahead that
             * needed room would drop the oldest bucket, whose objects still in DRAM
             * would be written ahead again, and again, with no client asking (a tier
             * no larger than DRAM rewrote itself at hundreds of MB/s).
             */
            uint64_t used = CTR_GET(t, disk_bytes), low = atomic_load(&t->low_bytes);
            pthread_mutex_lock(&t->qlock);
            bool idle = t->wq_head == NULL;
            pthread_mutex_unlock(&t->qlock);
            uint64_t ahead = used >= low ? 0 : low - used < SSD_COLD_BATCH ? low - used
                                                                             : SSD_COLD_BATCH;

            if (atomic_load(&t->rate_limit) != 0) {
                /* Under a rate limit only what the budget has room for (it refuses the rest). */
                ahead = t->rate_tokens <= 0 ? 0
                        : (uint64_t)t->rate_tokens < ahead ? (uint64_t)t->rate_tokens : ahead;
            }
            if (idle && used < low && ahead > 0) {
                (void)store_offload_cold(t->store, ahead);
            }
        }
    }
    ssd_aio_destroy(t);
    return NULL;
}
