/*
 * ssd_bucket: the SSD tier's bucket table and bucket files: lookup and
 * reader references (any thread, under blk), creation, dropping and the
 * eviction rule (writer thread). It never reads or writes records; that is
 * ssd_writer.c and the readers in ssd.c.
 *
 * Owners: a tenant with an SSD share (ssd_quota) has buckets of its own,
 * one of them open at a time; everyone else writes to shared buckets
 * (owner 0). Eviction for a record takes shared buckets and those of owners
 * past their share; an owner within its share loses buckets only to its own
 * records (ssd_share_room when its share is full, ssd_make_room when the
 * tier is and nothing else can go).
 *
 * Reclaim: a sealed bucket whose live bytes fell under half of its size
 * (objects removed) is evicted before any other, and one with no live object
 * at once, so dead records never hold space longer than the next eviction.
 * Copying live records forward (compaction) would keep them, but costs a
 * write of every live byte on a device whose contents are a cache;
 * memcached's extstore makes the same choice for the same reason.
 */
#include "ssd_int.h"
#include "clock.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#include "kverr.h"
#include "log.h"
#include "ssd_index.h"
#include "ssd_record.h"

void
ssd_bucket_path(const struct ssd *t, uint64_t id, char *buf, size_t len)
{
    snprintf(buf, len, "%s/bucket-%016" PRIx64 ".kvb", t->dir, id);
}

void
ssd_dir_each(struct ssd *t, ssd_dir_each_fn fn)
{
    DIR *d = opendir(t->dir);
    struct dirent *e;

    if (d == NULL) {
        return;
    }
    while ((e = readdir(d)) != NULL) {
        unsigned long long id;
        int suffix = -1;

        if (sscanf(e->d_name, "bucket-%16llx.%n", &id, &suffix) == 1 && suffix > 0) {
            fn(t, (uint64_t)id, e->d_name + suffix, e->d_name);
        }
    }
    closedir(d);
}

void
ssd_dir_unlink(const struct ssd *t, const char *name, const char *why)
{
    char path[SSD_PATH_MAX + 300];

    snprintf(path, sizeof(path), "%s/%s", t->dir, name);
    log_info("ssd: removing %s (%s)", path, why);
    if (unlink(path) != 0 && errno != ENOENT) {
        log_error("ssd: unlink(%s): %s", path, strerror(errno));
    }
}

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

struct ssd_bucket *
ssd_bucket_find_locked(const struct ssd *t, uint64_t id)
{
    size_t i = ssd_bucket_pos_locked(t, id);

    return i < t->nbuckets && t->buckets[i]->id == id ? t->buckets[i] : NULL;
}

int
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
struct ssd_bucket *
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

void
ssd_bucket_unref(struct ssd *t, struct ssd_bucket *b, bool read_ok)
{
    pthread_mutex_lock(&t->blk);
    if (read_ok) {
        b->last_read_ms = clock_wall_ms();
        b->dirty = true;
    }
    if (--b->readers == 0 && b->dropping) {
        pthread_cond_broadcast(&t->bcond);
    }
    pthread_mutex_unlock(&t->blk);
}

/* ssd_bucket_account: live bytes change for bucket id (record bytes). false: no such bucket. */
bool
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

void
ssd_bucket_record(const struct ssd_bucket *b, struct idx_bucket *r)
{
    memset(r, 0, sizeof(*r));
    r->id = b->id;
    r->created_ms = b->created_ms;
    r->last_read_ms = b->last_read_ms;
    r->live_bytes = b->live_bytes;
    r->total_bytes = b->total_bytes;
    r->flags = b->sealed ? IDX_BUCKET_SEALED : 0;
    r->owner = b->owner;
}

/* ssd_fold_stamp_locked: take DRAM hits into a bucket's last read time (blk held). */
void
ssd_fold_stamp_locked(struct ssd *t, struct ssd_bucket *b)
{
    uint64_t v = atomic_load_explicit(&t->stamps[b->id % SSD_STAMP_SLOTS], memory_order_relaxed);

    if (v > b->last_read_ms && v >= b->created_ms) {
        b->last_read_ms = v;
        b->dirty = true;
    }
}

struct ssd_bucket *
ssd_open_of(const struct ssd *t, uint32_t owner)
{
    for (int i = 0; i < t->nopen; i++) {
        if (t->open[i]->owner == owner) {
            return t->open[i];
        }
    }
    return NULL;
}

void
ssd_unopen(struct ssd *t, struct ssd_bucket *b)
{
    int i = 0;

    while (i < t->nopen && t->open[i] != b) {
        i++;
    }
    if (i == t->nopen) {
        return;
    }
    t->open[i] = t->open[--t->nopen];
    pthread_mutex_lock(&t->blk);
    b->open = false;
    b->sealed = true;
    b->dirty = true;
    pthread_mutex_unlock(&t->blk);
}

int
ssd_dir_sync(struct ssd *t)
{
    if (!t->dir_unsynced) {
        return 0;
    }
    if (fsync(t->dir_fd) != 0) {
        int rc = -errno;

        log_error("ssd: fsync(%s): %s", t->dir, strerror(errno));
        return rc;
    }
    t->dir_unsynced = false;
    return 0;
}

int
ssd_bucket_create(struct ssd *t, uint32_t owner, struct ssd_bucket **out)
{
    char path[SSD_PATH_MAX + 64];
    struct ssd_bucket *b = calloc(1, sizeof(*b));
    int rc;

    if (b == NULL) {
        return -ENOMEM;
    }
    b->id = t->next_id++;
    b->owner = owner;
    b->open = true;
    ssd_sumfile_start(b);
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
    t->dir_unsynced = true;     /* synced before an index commit names it (ssd_dir_sync) */
    b->created_ms = clock_wall_ms();
    b->last_read_ms = b->created_ms;
    if (t->nopen == SSD_OPEN_MAX) {
        ssd_unopen(t, t->open[0]);  /* cannot happen with 64 quota slots; bounded anyway */
    }
    rc = ssd_bucket_insert(t, b);
    if (rc != 0) {
        close(b->fd);
        unlink(path);
        free(b);
        return rc;
    }
    t->open[t->nopen++] = b;
    *out = b;
    return 0;
}

/* The keys of a bucket being dropped, copied out of the index. */
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

struct ssd_forget *
ssd_bucket_entries(struct ssd *t, uint64_t id, bool *oom)
{
    struct ssd_drop_list dl = {NULL, 0, 0};

    (void)idx_scan_bucket_objects(t->idx, id, ssd_collect_fn, &dl);
    *oom = dl.oom != 0;
    return dl.head;
}

uint64_t
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

    ssd_unopen(t, b);
    ssd_bucket_path(t, b->id, path, sizeof(path));
    close(b->fd);
    ssd_sumfile_remove(t, b->id);   /* before the bucket: a summary never outlives its file */
    if (unlink(path) != 0 && errno != ENOENT) {
        log_error("ssd: unlink(%s): %s", path, strerror(errno));
    }
    CTR_SUB(t, disk_bytes, b->total_bytes);
    CTR_ADD(t, evicted_buckets, 1);
    CTR_ADD(t, evicted_objects, dropped);
    log_info("ssd: dropped bucket %" PRIu64 " (%s): %" PRIu64 " objects, %" PRIu64 " bytes", b->id,
             why, dropped, b->total_bytes);
    ssd_sumfile_free(b);
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

/*
 * ssd_takes_locked: x's owner lets eviction take it for a record of owner:
 * a shared bucket, or one whose owner is past its share, always; one of an
 * owner within its share only when own (the second look, own_only: the
 * owner's oldest goes for its own new records once nothing else can).
 */
static bool
ssd_takes_locked(struct ssd *t, const struct ssd_bucket *x, uint32_t owner, bool own_only)
{
    if (own_only) {
        return x->owner == owner;
    }
    return x->owner == 0 || !store_ssd_guarded(t->store, x->owner);
}

/*
 * ssd_evictable_locked: x may be evicted now for a record of owner: not
 * open, being written or dropped, and its owner lets it (ssd_takes_locked).
 */
static bool
ssd_evictable_locked(struct ssd *t, const struct ssd_bucket *x, uint32_t owner, bool own_only)
{
    return !x->open && !x->dropping && !x->in_group && ssd_takes_locked(t, x, owner, own_only);
}

/* ssd_victim: the bucket eviction takes next for a record of owner (see above), or NULL. */
static struct ssd_bucket *
ssd_victim(struct ssd *t, uint32_t owner, bool own_only)
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
        v[k].eligible = ssd_evictable_locked(t, x, owner, own_only);
    }
    i = ssd_pick_victim(v, t->nbuckets, atomic_load(&t->eviction));
    if (i >= 0) {
        b = t->buckets[i];
    }
    pthread_mutex_unlock(&t->blk);
    free(v);
    return b;
}

/*
 * ssd_evict_one: make room for a record of owner by one step under the
 * rules above: drop the bucket ssd_victim picks or, when none is left but
 * an open one the rules allow (holding records, not in the group being
 * committed), seal that one so that the next step can take it. false when
 * there is nothing to do either with.
 */
static bool
ssd_evict_one(struct ssd *t, uint32_t owner, bool own_only, const char *why)
{
    struct ssd_bucket *v = ssd_victim(t, owner, own_only);
    struct ssd_bucket *seal = NULL;

    if (v != NULL) {
        ssd_bucket_drop(t, v, why);
        return true;
    }
    pthread_mutex_lock(&t->blk);
    for (int i = 0; i < t->nopen && seal == NULL; i++) {
        struct ssd_bucket *x = t->open[i];

        if (x->total_bytes > 0 && !x->in_group && ssd_takes_locked(t, x, owner, own_only)) {
            seal = x;
        }
    }
    pthread_mutex_unlock(&t->blk);
    if (seal != NULL) {
        ssd_unopen(t, seal);
    }
    return seal != NULL;
}

/* ssd_owned_bytes: bytes written to owner's buckets (not those being dropped). */
static uint64_t
ssd_owned_bytes(struct ssd *t, uint32_t owner)
{
    uint64_t bytes = 0;

    pthread_mutex_lock(&t->blk);
    for (size_t i = 0; i < t->nbuckets; i++) {
        const struct ssd_bucket *b = t->buckets[i];

        if (b->owner == owner && !b->dropping) {
            bytes += b->total_bytes;
        }
    }
    pthread_mutex_unlock(&t->blk);
    return bytes;
}

int
ssd_share_room(struct ssd *t, uint32_t owner, uint64_t need)
{
    uint64_t share = owner != 0 ? store_ssd_share(t->store, owner) : 0;

    if (share == 0) {
        return 0;
    }
    if (need > share) {
        return KV_QUOTA_EXCEEDED;
    }
    while (ssd_owned_bytes(t, owner) + need > share) {
        if (!ssd_evict_one(t, owner, true, "its tenant's share is full")) {
            return KV_QUOTA_EXCEEDED;
        }
    }
    return 0;
}

int
ssd_make_room(struct ssd *t, uint64_t need, uint32_t owner)
{
    uint64_t high = atomic_load(&t->high_bytes);
    uint64_t low = atomic_load(&t->low_bytes);

    if (CTR_GET(t, disk_bytes) + need <= high) {
        return 0;
    }
    while (CTR_GET(t, disk_bytes) + need > low) {
        if (!ssd_evict_one(t, owner, false, "evicted")
            && (owner == 0 || !ssd_evict_one(t, owner, true, "evicted"))) {
            break;      /* what is left is guarded: others' shares */
        }
    }
    return CTR_GET(t, disk_bytes) + need <= atomic_load(&t->size) ? 0 : KV_NO_SPACE;
}
