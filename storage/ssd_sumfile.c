/*
 * ssd_sumfile: the SSD tier's bucket summaries as files: the list of a
 * bucket's records kept while the writer fills it, written as
 * bucket-<id>.kvh when the bucket is sealed, read back by a rebuild, and
 * removed with the bucket. The format is ssd_summary.h's; this module owns
 * only the files and the lists. It never touches the index or the store.
 *
 * A summary only ever names committed records: entries are listed as records
 * are written, counted in when their group commits (ssd_sumfile_commit), and
 * dropped again when a failed group cuts the bucket back. It is written once
 * the bucket is sealed and every record in it committed (synced), so the
 * summary never runs ahead of the bytes it describes; it is fsynced before
 * its rename, and a summary lost to a crash before that costs a scan.
 */
#include "ssd_int.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "kverr.h"
#include "log.h"
#include "ssd_record.h"
#include "ssd_summary.h"

void
ssd_sumfile_path(const struct ssd *t, uint64_t id, char *buf, size_t len)
{
    snprintf(buf, len, "%s/bucket-%016" PRIx64 ".kvh", t->dir, id);
}

void
ssd_sumfile_start(struct ssd_bucket *b)
{
    b->sum = NULL;
    b->sum_len = SSD_SUM_HDR_SIZE;
    b->sum_cap = 0;
    b->sum_count = 0;
    b->sum_ok_len = SSD_SUM_HDR_SIZE;
    b->sum_ok_count = 0;
    b->sum_on = true;
}

void
ssd_sumfile_free(struct ssd_bucket *b)
{
    free(b->sum);
    b->sum = NULL;
    b->sum_cap = 0;
    b->sum_on = false;
}

void
ssd_sumfile_add(struct ssd_bucket *b, const struct ssd_rec *rec, uint64_t offset)
{
    uint64_t need = ssd_sum_entry_size(rec->key_len);

    if (!b->sum_on) {
        return;
    }
    if (b->sum_len + need > b->sum_cap) {
        uint64_t ncap = b->sum_cap != 0 ? b->sum_cap * 2 : 64u << 10;
        uint8_t *p;

        while (ncap < b->sum_len + need) {
            ncap *= 2;
        }
        p = ncap <= SSD_SUM_MAX ? realloc(b->sum, (size_t)ncap) : NULL;
        if (p == NULL) {
            log_warn("ssd: bucket %" PRIu64 ": no memory to list its records for a summary; "
                     "a rebuild will read it whole", b->id);
            ssd_sumfile_free(b);
            return;
        }
        b->sum = p;
        b->sum_cap = ncap;
    }
    b->sum_len += ssd_sum_entry_encode(rec, offset, b->sum + b->sum_len);
    b->sum_count++;
}

void
ssd_sumfile_commit(struct ssd_bucket *b)
{
    b->sum_ok_len = b->sum_len;
    b->sum_ok_count = b->sum_count;
}

void
ssd_sumfile_rollback(struct ssd_bucket *b)
{
    b->sum_len = b->sum_ok_len;
    b->sum_count = b->sum_ok_count;
}

void
ssd_sumfile_remove(struct ssd *t, uint64_t id)
{
    char path[SSD_PATH_MAX + 64];

    ssd_sumfile_path(t, id, path, sizeof(path));
    if (unlink(path) != 0 && errno != ENOENT) {
        log_warn("ssd: unlink(%s): %s", path, strerror(errno));
    }
}

/* ssd_sumfile_write: b's committed entries as its summary file. 0 or -errno (logged). */
static int
ssd_sumfile_write(struct ssd *t, struct ssd_bucket *b)
{
    char path[SSD_PATH_MAX + 64];
    char tmp[SSD_PATH_MAX + 80];
    uint64_t off = 0;
    const char *what = "open";
    int fd;
    int rc = 0;

    ssd_sumfile_path(t, b->id, path, sizeof(path));
    snprintf(tmp, sizeof(tmp), "%s.tmp", path);
    ssd_sum_finish(b->sum, b->sum_ok_len, b->id, b->sum_ok_count, b->committed_bytes);
    fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (fd < 0) {
        rc = -errno;
        goto fail;
    }
    what = "write";
    while (off < b->sum_ok_len) {
        ssize_t w = write(fd, b->sum + off, (size_t)(b->sum_ok_len - off));

        if (w < 0 && errno == EINTR) {
            continue;
        }
        if (w <= 0) {
            rc = w < 0 ? -errno : -EIO;
            goto fail;
        }
        off += (uint64_t)w;
    }
    what = "fsync";
    if (fsync(fd) != 0) {
        rc = -errno;
        goto fail;
    }
    close(fd);
    fd = -1;
    what = "rename";
    if (rename(tmp, path) != 0) {
        rc = -errno;
        goto fail;
    }
    t->dir_unsynced = true;     /* the rename goes with the next directory fsync */
    return 0;

fail:
    log_warn("ssd: bucket summary %s: %s: %s; a rebuild will read the bucket whole", path, what,
             strerror(-rc));
    if (fd >= 0) {
        close(fd);
    }
    (void)unlink(tmp);
    return rc;
}

void
ssd_sumfile_write_sealed(struct ssd *t)
{
    for (;;) {
        struct ssd_bucket *due = NULL;

        pthread_mutex_lock(&t->blk);
        for (size_t i = 0; i < t->nbuckets && due == NULL; i++) {
            struct ssd_bucket *b = t->buckets[i];

            if (b->sum_on && b->sealed && !b->open && !b->dropping && !b->in_group
                && b->committed_bytes == b->total_bytes) {
                due = b;
            }
        }
        pthread_mutex_unlock(&t->blk);
        if (due == NULL) {
            return;
        }
        if (due->sum_ok_count > 0 && due->sum != NULL) {
            (void)ssd_sumfile_write(t, due);
        }
        ssd_sumfile_free(due);
    }
}

int
ssd_sumfile_read(const struct ssd *t, uint64_t id, uint64_t max_len, uint8_t **buf,
                 uint64_t *len)
{
    char path[SSD_PATH_MAX + 64];
    struct stat st;
    uint8_t *p;
    uint64_t got = 0;
    int fd;

    *buf = NULL;
    *len = 0;
    ssd_sumfile_path(t, id, path, sizeof(path));
    fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        return errno == ENOENT ? KV_NOT_FOUND : -errno;
    }
    if (fstat(fd, &st) != 0) {
        int rc = -errno;

        close(fd);
        return rc;
    }
    if ((uint64_t)st.st_size > max_len || (uint64_t)st.st_size > SSD_SUM_MAX) {
        close(fd);
        return KV_TOO_LARGE;
    }
    p = malloc(st.st_size > 0 ? (size_t)st.st_size : 1);
    if (p == NULL) {
        close(fd);
        return -ENOMEM;
    }
    while (got < (uint64_t)st.st_size) {
        ssize_t n = pread(fd, p + got, (size_t)((uint64_t)st.st_size - got), (off_t)got);

        if (n < 0 && errno == EINTR) {
            continue;
        }
        if (n < 0) {
            int rc = -errno;

            free(p);
            close(fd);
            return rc;
        }
        if (n == 0) {
            break;      /* shrank meanwhile: decoding sees the cut */
        }
        got += (uint64_t)n;
    }
    close(fd);
    *buf = p;
    *len = got;
    return 0;
}

static void
ssd_sumfile_remove_orphan(struct ssd *t, uint64_t id, const char *suffix, const char *name)
{
    bool tmp = strcmp(suffix, "kvh.tmp") == 0;
    bool known;

    if (!tmp && strcmp(suffix, "kvh") != 0) {
        return;
    }
    pthread_mutex_lock(&t->blk);
    known = ssd_bucket_find_locked(t, id) != NULL;
    pthread_mutex_unlock(&t->blk);
    if (known && !tmp) {
        return;
    }
    ssd_dir_unlink(t, name, tmp ? "a summary never finished" : "its bucket file is gone");
}

void
ssd_sumfile_remove_orphans(struct ssd *t)
{
    ssd_dir_each(t, ssd_sumfile_remove_orphan);
}
