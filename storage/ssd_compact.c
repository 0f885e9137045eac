/*
 * ssd_compact: the SSD tier's reclaim of mostly-dead buckets, on the writer
 * thread. A bucket's records die when their objects are removed or their
 * entries dropped; whole-bucket eviction alone would keep those bytes until
 * the bucket's turn came, and the tier would hold far less than ssd_size in
 * live records. When the tier's dead bytes pass a fiftieth of ssd_size, the
 * deadest sealed bucket (at least an eighth dead) has its live records
 * copied forward into its owner's open bucket (each value read back and its
 * CRC checked on the way; a record that fails is left to go with the
 * bucket), synced, and their new locations committed in one index
 * transaction; then the store learns the new locations and the bucket is
 * dropped like an evicted one. Copies must fit in ssd_size as it is: this
 * never evicts anything. It must not run while a group is being written
 * (the writer calls it from housekeeping, between groups), and it never
 * holds blk while doing I/O.
 *
 * Order and crash safety are the group commit's: bytes past a bucket's
 * committed length are never indexed and a restart cuts them off; until
 * the commit the old records stay indexed, after it the new ones, and the
 * old bucket's file goes only after that.
 */
#include "ssd_int.h"
#include "clock.h"

#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <sys/uio.h>
#include <unistd.h>

#include "crc32c.h"
#include "kverr.h"
#include "log.h"
#include "ssd_index.h"
#include "ssd_record.h"

#define SSD_COMPACT_DESTS 16            /* open buckets one compaction may fill */

struct ssd_compact_ctx {
    struct ssd *t;
    uint8_t *buf;                       /* SSD_COMPACT_CHUNK, aligned */
    uint8_t *hdr;                       /* t->hdr_cap, aligned */
    struct ssd_bucket *dest[SSD_COMPACT_DESTS];
    int ndest;
};

/* ssd_compact_dest: owner's open bucket with room for rec more bytes (a new one when full). */
static int
ssd_compact_dest(struct ssd_compact_ctx *c, uint32_t owner, uint64_t rec, struct ssd_bucket **out)
{
    struct ssd *t = c->t;
    struct ssd_bucket *b = ssd_open_of(t, owner);
    int k = 0;
    int rc;

    if (b != NULL && b->total_bytes > 0 && b->total_bytes + rec > ssd_bucket_limit(t, owner)) {
        ssd_unopen(t, b);
        b = NULL;
    }
    if (b == NULL) {
        if (c->ndest == SSD_COMPACT_DESTS) {
            return KV_NO_SPACE;         /* enough for one pass: commit what was copied */
        }
        rc = ssd_bucket_create(t, owner, &b);
        if (rc != 0) {
            return rc;
        }
    }
    while (k < c->ndest && c->dest[k] != b) {
        k++;
    }
    if (k == c->ndest) {
        if (c->ndest == SSD_COMPACT_DESTS) {
            return KV_NO_SPACE;
        }
        c->dest[c->ndest++] = b;
    }
    *out = b;
    return 0;
}

/*
 * ssd_compact_copy: copy the record of entry f from src to the end of dst;
 * *to is its new location. Returns 0; KV_CHECKSUM_MISMATCH when the value
 * read back does not match its CRC, or is cut short (nothing is kept of
 * it); -errno from a read (*what "read") or a write (*what "write").
 */
static int
ssd_compact_copy(struct ssd_compact_ctx *c, struct ssd_bucket *src, const struct ssd_forget *f,
                 struct ssd_bucket *dst, struct store_loc *to, const char **what)
{
    struct ssd *t = c->t;
    uint64_t hdr_block = ssd_rec_hdr_block(f->key_len);
    uint64_t span = ssd_rec_value_span(f->size);
    uint64_t at = dst->total_bytes;
    uint32_t crc = ssd_rec_key_crc(f->tenant, f->key, f->key_len);
    struct ssd_rec rec;
    struct iovec v;
    int rc;

    /* The value first, then the header that makes it a record: a failure leaves only
     * bytes past total_bytes, which the next record (or a restart) overwrites. */
    for (uint64_t done = 0; done < span;) {
        uint64_t n = span - done < SSD_COMPACT_CHUNK ? span - done : SSD_COMPACT_CHUNK;
        uint64_t data = done < f->size ? f->size - done : 0;
        ssize_t r;

        do {
            r = pread(src->fd, c->buf, n, (off_t)(f->loc.offset + done));
        } while (r < 0 && errno == EINTR);
        if (r < 0) {
            *what = "read";
            return -errno;
        }
        if ((uint64_t)r < n) {
            return KV_CHECKSUM_MISMATCH;    /* the file ends inside the value */
        }
        crc = crc32c_extend(crc, c->buf, data < n ? data : n);
        v.iov_base = c->buf;
        v.iov_len = n;
        rc = ssd_pwritev_all(dst->fd, &v, 1, at + hdr_block + done);
        if (rc != 0) {
            *what = "write";
            return rc;
        }
        done += n;
    }
    if (crc != f->loc.crc) {
        return KV_CHECKSUM_MISMATCH;
    }
    memset(&rec, 0, sizeof(rec));
    rec.tenant = f->tenant;
    rec.key_len = f->key_len;
    rec.value_len = f->size;
    rec.seq = ++t->seq;
    rec.value_crc = crc;
    rec.key = f->key;
    ssd_rec_encode(&rec, c->hdr);
    v.iov_base = c->hdr;
    v.iov_len = hdr_block;
    rc = ssd_pwritev_all(dst->fd, &v, 1, at);
    if (rc != 0) {
        *what = "write";
        return rc;
    }
    ssd_sumfile_add(dst, &rec, at);
    to->bucket = (uint32_t)dst->id;
    to->crc = crc;
    to->offset = at + hdr_block;
    pthread_mutex_lock(&t->blk);
    dst->total_bytes += hdr_block + span;
    dst->live_bytes += hdr_block + span;
    dst->dirty = true;
    pthread_mutex_unlock(&t->blk);
    CTR_ADD(t, disk_bytes, hdr_block + span);
    return 0;
}

/* ssd_compact_fail: a copy, sync or commit failed: cut every destination back, keep src. */
static void
ssd_compact_fail(struct ssd_compact_ctx *c, struct ssd_bucket *fault, int rc, const char *what)
{
    bool drop = fault != NULL && rc != -ENOSPC;

    for (int i = 0; i < c->ndest; i++) {
        if (c->dest[i] != fault || !drop) {
            ssd_rollback(c->t, c->dest[i]);
        }
    }
    ssd_fault(c->t, drop ? fault : NULL, rc, what);
}

/* ssd_compact_commit: index the moved records (and the buckets they went to) in one txn. */
static int
ssd_compact_commit(struct ssd_compact_ctx *c, struct ssd_forget *moved, const struct store_loc *to,
                   size_t nmoved)
{
    struct ssd *t = c->t;
    struct idx_op *ops = calloc(nmoved + (size_t)c->ndest + 1, sizeof(*ops));
    size_t n = 0;
    size_t i = 0;
    int rc;

    if (ops == NULL) {
        return -ENOMEM;
    }
    for (struct ssd_forget *f = moved; f != NULL; f = f->next, i++) {
        struct idx_op *op = &ops[n++];

        op->kind = IDX_OBJ_PUT;
        op->tenant = f->tenant;
        op->key_len = f->key_len;
        op->key = f->key;
        op->loc.bucket = to[i].bucket;
        op->loc.offset = to[i].offset;
        op->loc.length = f->size;
        op->loc.crc = to[i].crc;
    }
    pthread_mutex_lock(&t->blk);
    for (int k = 0; k < c->ndest; k++) {
        ops[n].kind = IDX_BUCKET_PUT;
        ssd_bucket_record(c->dest[k], &ops[n].bucket);
        c->dest[k]->dirty = false;
        n++;
    }
    pthread_mutex_unlock(&t->blk);
    ops[n].kind = IDX_META_PUT;
    ops[n].name = "next_bucket";
    ops[n].value = t->next_id;
    n++;
    rc = idx_apply(t->idx, ops, n);
    free(ops);
    return rc;
}

int64_t
ssd_compact(struct ssd *t, struct ssd_bucket *src)
{
    struct ssd_compact_ctx c;
    struct ssd_forget *entries;
    struct ssd_forget *moved = NULL;
    struct ssd_forget **tail = &moved;
    struct store_loc *to = NULL;
    uint64_t t0 = clock_ms();
    size_t nentries = 0;
    size_t nmoved = 0;
    uint64_t moved_bytes = 0;
    bool oom = false;
    int rc = 0;

    memset(&c, 0, sizeof(c));
    c.t = t;
    entries = ssd_bucket_entries(t, src->id, &oom);
    for (struct ssd_forget *f = entries; f != NULL; f = f->next) {
        nentries++;
    }
    if (oom || posix_memalign((void **)&c.buf, SSD_REC_ALIGN, SSD_COMPACT_CHUNK) != 0
        || posix_memalign((void **)&c.hdr, SSD_REC_ALIGN, t->hdr_cap) != 0
        || (to = calloc(nentries + 1, sizeof(*to))) == NULL) {
        log_error("ssd: out of memory compacting bucket %" PRIu64, src->id);
        rc = -ENOMEM;
        goto out;
    }
    pthread_mutex_lock(&t->blk);
    src->in_group = true;               /* not a victim of anything while it is copied */
    pthread_mutex_unlock(&t->blk);

    while (entries != NULL) {
        struct ssd_forget *f = entries;
        uint64_t rec = ssd_rec_size(f->key_len, f->size);
        struct ssd_bucket *dst = NULL;
        const char *what = "write";

        entries = f->next;
        f->next = NULL;
        if (ssd_rec_hdr_block(f->key_len) > t->hdr_cap
            || ssd_compact_dest(&c, src->owner, rec, &dst) != 0) {
            ssd_forget_free(f);         /* goes with the bucket */
            continue;
        }
        rc = ssd_compact_copy(&c, src, f, dst, &to[nmoved], &what);
        if (rc == KV_CHECKSUM_MISMATCH) {
            log_warn("ssd: compacting bucket %" PRIu64 ": the record at %" PRIu64
                     " fails its checksum; it goes with the bucket", src->id, f->loc.offset);
            CTR_ADD(t, checksum_errors, 1);
            ssd_forget_free(f);
            rc = 0;
            continue;
        }
        if (rc != 0) {
            ssd_forget_free(f);
            if (strcmp(what, "read") == 0) {
                log_error("ssd: compacting bucket %" PRIu64 ": read: %s; compaction stopped",
                          src->id, strerror(-rc));
                for (int i = 0; i < c.ndest; i++) {
                    ssd_rollback(t, c.dest[i]);
                }
            } else {
                ssd_compact_fail(&c, dst, rc, "compaction write");
            }
            goto out;
        }
        *tail = f;
        tail = &f->next;
        nmoved++;
        moved_bytes += rec;
    }
    for (int i = 0; i < c.ndest; i++) {
        if (fdatasync(c.dest[i]->fd) != 0) {
            rc = -errno;
            ssd_compact_fail(&c, c.dest[i], rc, "compaction fdatasync");
            goto out;
        }
    }
    rc = ssd_dir_sync(t);
    if (rc != 0) {
        ssd_compact_fail(&c, NULL, rc, "compaction directory fsync");
        goto out;
    }
    rc = ssd_compact_commit(&c, moved, to, nmoved);
    if (rc != 0) {
        ssd_compact_fail(&c, NULL, rc, "compaction index commit");
        goto out;
    }
    pthread_mutex_lock(&t->blk);
    for (int i = 0; i < c.ndest; i++) {
        c.dest[i]->committed_bytes = c.dest[i]->total_bytes;
        ssd_sumfile_commit(c.dest[i]);
    }
    pthread_mutex_unlock(&t->blk);
    CTR_ADD(t, syncs, 1);
    {
        size_t i = 0;

        for (struct ssd_forget *f = moved; f != NULL; f = f->next, i++) {
            struct kv_key k = {.tenant = f->tenant, .len = f->key_len, .ptr = f->key};

            if (store_move_stored(t->store, &k, &f->loc, &to[i]) != 0) {
                /* Removed or dropped meanwhile: the fresh copy goes at the next commit. */
                struct ssd_forget *g = ssd_forget_new(&k, &to[i], f->size);

                if (g != NULL) {
                    ssd_forget_push(t, g);
                }
            }
        }
    }
    CTR_ADD(t, compacted_buckets, 1);
    CTR_ADD(t, compacted_bytes, moved_bytes);
    log_info("ssd: compacted bucket %" PRIu64 ": %zu of %zu records (%" PRIu64
             " bytes) copied forward in %" PRIu64 " ms", src->id, nmoved, nentries, moved_bytes,
             clock_ms() - t0);
    pthread_mutex_lock(&t->blk);
    src->in_group = false;
    pthread_mutex_unlock(&t->blk);
    (void)ssd_bucket_drop(t, src, "compacted");
    src = NULL;
    rc = 0;

out:
    if (src != NULL) {
        pthread_mutex_lock(&t->blk);
        src->in_group = false;
        pthread_mutex_unlock(&t->blk);
    }
    ssd_forget_free(entries);
    ssd_forget_free(moved);
    free(to);
    free(c.buf);
    free(c.hdr);
    return rc != 0 ? rc : (int64_t)nmoved;
}

void
ssd_compact_some(struct ssd *t)
{
    uint64_t size = atomic_load(&t->size);
    uint64_t disk = CTR_GET(t, disk_bytes);
    uint64_t live = 0;
    struct ssd_bucket *best = NULL;
    double best_live = 1.0;

    pthread_mutex_lock(&t->blk);
    for (size_t i = 0; i < t->nbuckets; i++) {
        live += t->buckets[i]->live_bytes;
    }
    if (disk > live && (disk - live) * SSD_COMPACT_TIER_DEAD >= size) {
        for (size_t i = 0; i < t->nbuckets; i++) {
            struct ssd_bucket *x = t->buckets[i];
            uint64_t dead = x->total_bytes > x->live_bytes ? x->total_bytes - x->live_bytes : 0;
            double frac;

            if (x->open || x->dropping || x->in_group || x->total_bytes == 0
                || dead * SSD_COMPACT_DEAD_FRACTION < x->total_bytes
                || disk + x->live_bytes > size) {
                continue;
            }
            frac = (double)x->live_bytes / (double)x->total_bytes;
            if (best == NULL || frac < best_live) {
                best = x;
                best_live = frac;
            }
        }
    }
    pthread_mutex_unlock(&t->blk);
    if (best != NULL) {
        (void)ssd_compact(t, best);
    }
}
