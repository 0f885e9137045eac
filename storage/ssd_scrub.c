/*
 * ssd_scrub: the background check that follows a rebuild which took
 * buckets' entries from their summaries without reading the values. One
 * thread reads each such bucket's records in pieces of up to
 * SSD_SCRUB_CHUNK, at ssd_scrub_rate bytes/s at most (so it leaves the disk
 * to the reads), checks every value the bucket's summary lists against the
 * value CRC, and drops what fails: the store's copy (store_drop_stored, only
 * when that copy is the one at this location) and the index entry (a forget
 * the writer commits). It runs after the tier is ready, and stops at
 * shutdown within a step.
 *
 * Why not ssd_scan: the walk stops at the first damaged header, and the
 * records after it are still indexed from the summary; the scrub checks
 * each listed value whatever lies around it. Until the scrub has passed a
 * value, a read of it checks the CRC anyway (ssd.c) and never serves bytes
 * that fail it.
 *
 * It holds a reader reference on the bucket only while one piece is read,
 * so eviction and compaction are never held up for longer than that; a
 * bucket dropped meanwhile is skipped.
 */
#include "ssd_int.h"
#include "clock.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "crc32c.h"
#include "kverr.h"
#include "log.h"
#include "ssd_record.h"
#include "ssd_summary.h"

void
ssd_scrub_add(struct ssd *t, uint64_t id, uint64_t covered)
{
    if (t->nscrub == t->scrub_cap) {
        size_t ncap = t->scrub_cap != 0 ? t->scrub_cap * 2 : 64;
        struct ssd_scrub_item *p = realloc(t->scrub, ncap * sizeof(*p));

        if (p == NULL) {
            log_warn("ssd: no memory to list bucket %" PRIu64 " for the scrub; its values are "
                     "checked when read", id);
            return;
        }
        t->scrub = p;
        t->scrub_cap = ncap;
    }
    t->scrub[t->nscrub].id = id;
    t->scrub[t->nscrub].covered = covered;
    t->nscrub++;
}

/* One listed record: the key points into the summary's buffer. */
struct ssd_scrub_ent {
    uint64_t rec_off;
    uint64_t value_len;
    const uint8_t *key;
    uint32_t key_len;
    uint32_t tenant;
    uint32_t crc;
};

struct ssd_scrub_list {
    struct ssd_scrub_ent *e;
    size_t n;
    size_t cap;
};

static int
ssd_scrub_collect(void *arg, const struct ssd_rec *rec, uint64_t value_off)
{
    struct ssd_scrub_list *l = arg;

    if (l->n == l->cap) {
        size_t ncap = l->cap != 0 ? l->cap * 2 : 4096;
        struct ssd_scrub_ent *p = realloc(l->e, ncap * sizeof(*p));

        if (p == NULL) {
            return -ENOMEM;
        }
        l->e = p;
        l->cap = ncap;
    }
    l->e[l->n].rec_off = value_off - ssd_rec_hdr_block(rec->key_len);
    l->e[l->n].value_len = rec->value_len;
    l->e[l->n].key = rec->key;
    l->e[l->n].key_len = rec->key_len;
    l->e[l->n].tenant = rec->tenant;
    l->e[l->n].crc = rec->value_crc;
    l->n++;
    return 0;
}

/* Progress of one scrub: what its log line reports. */
struct ssd_scrub_run {
    uint64_t records;
    uint64_t bad;
    uint64_t dropped;
    uint64_t skipped;       /* buckets gone (or their summary) before their turn */
    uint64_t read_errors;
};

static bool
ssd_scrub_stopping(struct ssd *t)
{
    bool stop;

    pthread_mutex_lock(&t->qlock);
    stop = t->stop;
    pthread_mutex_unlock(&t->qlock);
    return stop || atomic_load(&t->scrub_rate) == 0;
}

/*
 * ssd_scrub_pace: account `bytes` read and sleep until the rate allows the
 * next read. false when the scrub is to stop.
 */
static bool
ssd_scrub_pace(struct ssd *t, uint64_t bytes)
{
    uint64_t done = atomic_fetch_add(&t->scrub_bytes, bytes) + bytes;

    for (int steps = 0; steps < 100000; steps++) {
        uint64_t rate = atomic_load(&t->scrub_rate);
        uint64_t elapsed = clock_ms() - t->scrub_t0;
        struct timespec step = {0, SSD_SCRUB_STEP_MS * 1000000L};

        atomic_store(&t->scrub_ms, elapsed);
        if (ssd_scrub_stopping(t)) {
            return false;
        }
        if (rate == 0 || (double)done * 1000.0 / (double)rate <= (double)elapsed) {
            return true;
        }
        nanosleep(&step, NULL);
    }
    return true;
}

/*
 * ssd_scrub_read: pread len bytes at off of bucket id (a reference held meanwhile) into buf;
 * *got: how many came (fewer when the file ends first or a read fails). 0, KV_NOT_FOUND
 * (the bucket is gone), KV_CHECKSUM_MISMATCH (the file ends first) or -errno.
 */
static int
ssd_scrub_read(struct ssd *t, uint64_t id, uint8_t *buf, uint64_t len, uint64_t off,
               uint64_t *gotp)
{
    struct ssd_bucket *b = ssd_bucket_ref(t, id);
    uint64_t got = 0;
    int rc = 0;

    *gotp = 0;
    if (b == NULL) {
        return KV_NOT_FOUND;
    }
    while (got < len) {
        ssize_t n = pread(b->fd, buf + got, (size_t)(len - got), (off_t)(off + got));

        if (n < 0 && errno == EINTR) {
            continue;
        }
        if (n <= 0) {
            rc = n < 0 ? -errno : KV_CHECKSUM_MISMATCH;    /* the file ends inside */
            break;
        }
        got += (uint64_t)n;
    }
    ssd_bucket_unref(t, b, false);
    *gotp = got;
    return rc;
}

/* ssd_scrub_bad: e failed its check: drop its copy and entry when they are still this one. */
static void
ssd_scrub_bad(struct ssd *t, uint64_t id, const struct ssd_scrub_ent *e,
              struct ssd_scrub_run *run)
{
    struct kv_key k = {.tenant = e->tenant, .len = e->key_len, .ptr = e->key};
    struct store_loc loc = {.bucket = (uint32_t)id, .crc = e->crc,
                            .offset = e->rec_off + ssd_rec_hdr_block(e->key_len)};

    run->bad++;
    CTR_ADD(t, scrub_bad, 1);
    if (store_drop_stored(t->store, &k, &loc) == 1) {
        struct ssd_forget *f = ssd_forget_new(&k, &loc, e->value_len);

        if (f != NULL) {
            ssd_forget_push(t, f);
        }
        run->dropped++;
    }
    log_kv(LOG_LEVEL_ERROR, "ssd: scrub: checksum mismatch, entry dropped",
           LOG_STR("path", t->dir), LOG_NUM("bucket", id), LOG_NUM("offset", loc.offset),
           LOG_NUM("bytes", e->value_len));
}

/*
 * ssd_scrub_big: check a record larger than the buffer, its value read in
 * pieces. 0, KV_NOT_FOUND (bucket gone), or false from the pace (-EINTR).
 */
static int
ssd_scrub_big(struct ssd *t, uint64_t id, const struct ssd_scrub_ent *e, uint8_t *buf,
              struct ssd_scrub_run *run)
{
    uint64_t off = e->rec_off + ssd_rec_hdr_block(e->key_len);
    uint64_t span = ssd_rec_value_span(e->value_len);
    uint32_t crc = ssd_rec_key_crc(e->tenant, e->key, e->key_len);
    int rc = 0;

    for (uint64_t done = 0; done < span;) {
        uint64_t n = span - done < SSD_SCRUB_CHUNK ? span - done : SSD_SCRUB_CHUNK;
        uint64_t data = done < e->value_len ? e->value_len - done : 0;
        uint64_t got;

        rc = ssd_scrub_read(t, id, buf, n, off + done, &got);
        if (rc != 0) {
            break;
        }
        crc = crc32c_extend(crc, buf, (size_t)(data < n ? data : n));
        done += n;
        if (!ssd_scrub_pace(t, n)) {
            return -EINTR;
        }
    }
    if (rc == KV_NOT_FOUND) {
        return rc;
    }
    if (rc < 0) {
        run->read_errors++;
    }
    if (rc != 0 || crc != e->crc) {
        ssd_scrub_bad(t, id, e, run);
    }
    return 0;
}

/* ssd_scrub_bucket: check every value its bucket's summary lists. false: the scrub stops. */
static bool
ssd_scrub_bucket(struct ssd *t, const struct ssd_scrub_item *it, uint8_t *buf,
                 struct ssd_scrub_run *run)
{
    struct ssd_scrub_list l = {NULL, 0, 0};
    struct ssd_sum_info info;
    uint8_t *sum = NULL;
    uint64_t len;
    bool go_on = true;
    size_t i = 0;
    int rc;

    rc = ssd_sumfile_read(t, it->id, it->covered + SSD_SUM_HDR_SIZE, &sum, &len);
    if (rc == 0) {
        rc = ssd_sum_decode(sum, len, it->id, it->covered, SSD_SCAN_MAX_KEY, SSD_SCAN_MAX_VALUE,
                            &info, ssd_scrub_collect, &l);
    }
    if (rc != 0) {
        /* Gone with its bucket (evicted, compacted) or out of memory: nothing to check. */
        if (rc != KV_NOT_FOUND) {
            log_warn("ssd: scrub: bucket %" PRIu64 ": its summary cannot be read back (%s); its "
                     "values are checked when read", it->id,
                     rc == KV_CHECKSUM_MISMATCH ? info.why : kv_strerror(rc));
        }
        run->skipped++;
        goto out;
    }
    while (i < l.n) {
        const struct ssd_scrub_ent *e = &l.e[i];
        uint64_t start = e->rec_off;
        uint64_t end = start;
        size_t k = i;

        if (ssd_rec_size(e->key_len, e->value_len) > SSD_SCRUB_CHUNK) {
            rc = ssd_scrub_big(t, it->id, e, buf, run);
            run->records++;
            i++;
            if (rc == KV_NOT_FOUND) {
                run->skipped++;
                break;
            }
            if (rc != 0) {
                go_on = false;
                break;
            }
            continue;
        }
        while (k < l.n && l.e[k].rec_off + ssd_rec_size(l.e[k].key_len, l.e[k].value_len) - start
                              <= SSD_SCRUB_CHUNK) {
            end = l.e[k].rec_off + ssd_rec_size(l.e[k].key_len, l.e[k].value_len);
            k++;
        }
        uint64_t got;

        rc = ssd_scrub_read(t, it->id, buf, end - start, start, &got);
        if (rc == KV_NOT_FOUND) {
            run->skipped++;
            break;
        }
        if (rc < 0) {
            run->read_errors++;
        }
        for (; i < k; i++) {
            const struct ssd_scrub_ent *x = &l.e[i];
            uint64_t voff = x->rec_off + ssd_rec_hdr_block(x->key_len) - start;
            uint32_t crc = ssd_rec_key_crc(x->tenant, x->key, x->key_len);

            bool whole = voff + x->value_len <= got;     /* all of it read */

            run->records++;
            if (whole) {
                crc = crc32c_extend(crc, buf + voff, (size_t)x->value_len);
            }
            if (!whole || crc != x->crc) {
                ssd_scrub_bad(t, it->id, x, run);
            }
        }
        if (!ssd_scrub_pace(t, end - start)) {
            go_on = false;
            break;
        }
    }
out:
    free(l.e);
    free(sum);
    return go_on && !ssd_scrub_stopping(t);
}

static void *
ssd_scrub_main(void *arg)
{
    struct ssd *t = arg;
    struct ssd_scrub_run run;
    uint8_t *buf = NULL;
    size_t done = 0;

    (void)pthread_setname_np(pthread_self(), "kvstash-scrub");
    memset(&run, 0, sizeof(run));
    if (posix_memalign((void **)&buf, SSD_REC_ALIGN, SSD_SCRUB_CHUNK) != 0) {
        log_error("ssd: scrub of %s: out of memory; not run (values are checked when read)",
                  t->dir);
        return NULL;
    }
    for (; done < t->nscrub; done++) {
        if (!ssd_scrub_bucket(t, &t->scrub[done], buf, &run)) {
            break;
        }
        atomic_fetch_add(&t->scrub_buckets_done, 1);
    }
    free(buf);
    atomic_store(&t->scrub_ms, clock_ms() - t->scrub_t0);
    if (done < t->nscrub) {
        log_warn("ssd: scrub of %s stopped (%s) after %zu of %zu buckets: %" PRIu64 " records "
                 "checked, %" PRIu64 " with a bad value (%" PRIu64 " entries dropped)", t->dir,
                 atomic_load(&t->scrub_rate) == 0 ? "ssd_scrub_rate set to 0" : "shutdown",
                 done, t->nscrub, run.records, run.bad, run.dropped);
        return NULL;
    }
    log_info("ssd: scrub of %s done in %" PRIu64 " ms: %zu bucket(s) rebuilt from summaries, "
             "%" PRIu64 " records and %" PRIu64 " bytes read, %" PRIu64 " values failed their "
             "checksum (%" PRIu64 " entries dropped, %" PRIu64 " read errors), %" PRIu64
             " bucket(s) gone before their turn", t->dir, atomic_load(&t->scrub_ms), t->nscrub,
             run.records, atomic_load(&t->scrub_bytes), run.bad, run.dropped, run.read_errors,
             run.skipped);
    return NULL;
}

void
ssd_scrub_start(struct ssd *t)
{
    int rc;

    if (t->nscrub == 0) {
        return;
    }
    atomic_store(&t->scrub_buckets, t->nscrub);
    if (atomic_load(&t->scrub_rate) == 0) {
        log_info("ssd: ssd_scrub_rate is 0: the %zu bucket(s) rebuilt from summaries are not "
                 "scrubbed (values are checked when read)", t->nscrub);
        return;
    }
    t->scrub_t0 = clock_ms();
    rc = pthread_create(&t->scrubber, NULL, ssd_scrub_main, t);
    if (rc != 0) {
        log_error("ssd: cannot start the scrub thread: %s; values are checked when read",
                  strerror(rc));
        return;
    }
    t->scrub_started = true;
    log_info("ssd: scrubbing the %zu bucket(s) rebuilt from summaries at %" PRIu64 " bytes/s "
             "at most", t->nscrub, atomic_load(&t->scrub_rate));
}

void
ssd_scrub_join(struct ssd *t)
{
    if (t->scrub_started) {
        pthread_join(t->scrubber, NULL);
        t->scrub_started = false;
    }
    free(t->scrub);
    t->scrub = NULL;
    t->nscrub = 0;
}
