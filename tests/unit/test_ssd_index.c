/*
 * test_ssd_index: the SSD tier's LMDB index as ssd.c relies on it: entries
 * round-trip per tenant, stale deletes and replacements keep the bucket
 * listing exact, a bucket drop removes exactly its objects, scans are ordered
 * and stoppable, data survives a reopen, the map grows on demand and a batch
 * that cannot fit leaves nothing behind, a reader killed mid-scan is reported
 * and cleared, keys longer than LMDB's key limit work, and open failures name
 * the path. Each test works in a fresh mkdtemp directory under /tmp.
 */
#include <criterion/criterion.h>

#include "kverr.h"
#include "ssd_index.h"

#include <errno.h>
#include <ftw.h>
#include <openssl/sha.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#define MiB (1024ull * 1024ull)

static char t_root[64];
static char t_path[128];

static int
t_rm_one(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
    (void)st;
    (void)flag;
    (void)ftw;
    remove(path);
    return 0;
}

static void
t_init(void)
{
    strcpy(t_root, "/tmp/kvidx.XXXXXX");
    cr_assert_not_null(mkdtemp(t_root), "mkdtemp: %s", strerror(errno));
    snprintf(t_path, sizeof(t_path), "%s/index", t_root);
}

static void
t_fini(void)
{
    if (t_root[0] != '\0') {
        nftw(t_root, t_rm_one, 16, FTW_DEPTH | FTW_PHYS);
    }
}

TestSuite(ssd_index, .init = t_init, .fini = t_fini, .timeout = 30);

static struct idx *
t_open(uint64_t map, uint64_t max, int *stale)
{
    struct idx *x = NULL;
    char err[256] = "";
    int rc = idx_open(t_path, map, max, stale, &x, err, sizeof(err));

    cr_assert_eq(rc, 0, "idx_open: %d %s", rc, err);
    cr_assert_not_null(x);
    return x;
}

static struct idx_op
t_put(uint32_t tenant, const void *key, uint32_t key_len, uint64_t bucket, uint64_t offset)
{
    struct idx_op op;

    memset(&op, 0, sizeof(op));
    op.kind = IDX_OBJ_PUT;
    op.tenant = tenant;
    op.key = key;
    op.key_len = key_len;
    op.loc.bucket = bucket;
    op.loc.offset = offset;
    op.loc.length = offset / 2 + 17;
    op.loc.crc = (uint32_t)(bucket * 2654435761u) ^ (uint32_t)offset;
    op.loc.flags = 0;
    return op;
}

static struct idx_op
t_del(uint32_t tenant, const void *key, uint32_t key_len, uint64_t bucket, uint64_t offset)
{
    struct idx_op op = t_put(tenant, key, key_len, bucket, offset);

    op.kind = IDX_OBJ_DEL;
    return op;
}

static struct idx_op
t_bucket_op(int kind, uint64_t id)
{
    struct idx_op op;

    memset(&op, 0, sizeof(op));
    op.kind = kind;
    op.bucket.id = id;
    op.bucket.created_ms = 1000 + id;
    op.bucket.last_read_ms = 2000 + id;
    op.bucket.live_bytes = 3000 + id;
    op.bucket.total_bytes = 4000 + id;
    op.bucket.flags = (uint32_t)(id & 1) ? IDX_BUCKET_SEALED : 0;
    return op;
}

static struct idx_op
t_meta(const char *name, uint64_t value)
{
    struct idx_op op;

    memset(&op, 0, sizeof(op));
    op.kind = IDX_META_PUT;
    op.name = name;
    op.value = value;
    return op;
}

static void
t_apply1(struct idx *x, struct idx_op op)
{
    int rc = idx_apply(x, &op, 1);

    cr_assert_eq(rc, 0, "idx_apply: %d", rc);
}

/* t_expect: key is present at exactly the loc t_put(tenant, key, bucket, offset) wrote. */
static void
t_expect(struct idx *x, uint32_t tenant, const void *key, uint32_t key_len, uint64_t bucket,
         uint64_t offset)
{
    struct idx_op want = t_put(tenant, key, key_len, bucket, offset);
    struct idx_loc loc;
    int rc = idx_get(x, tenant, key, key_len, &loc);

    cr_assert_eq(rc, 0, "idx_get(tenant %u, %u bytes): %d", tenant, key_len, rc);
    cr_assert_eq(loc.bucket, bucket);
    cr_assert_eq(loc.offset, offset);
    cr_assert_eq(loc.length, want.loc.length);
    cr_assert_eq(loc.crc, want.loc.crc);
    cr_assert_eq(loc.flags, 0);
}

static void
t_expect_absent(struct idx *x, uint32_t tenant, const void *key, uint32_t key_len)
{
    struct idx_loc loc;
    int rc = idx_get(x, tenant, key, key_len, &loc);

    cr_assert_eq(rc, KV_NOT_FOUND, "idx_get(tenant %u, %u bytes): %d, bucket %llu", tenant, key_len,
                 rc, rc == 0 ? (unsigned long long)loc.bucket : 0ull);
}

/* ---- scan collectors ---- */

struct t_item {
    uint32_t tenant;
    uint32_t key_len;
    uint8_t *key;
    struct idx_loc loc;
};

struct t_list {
    size_t n;
    size_t cap;
    struct t_item *v;
    size_t stop_after; /* 0: never stop */
};

static int
t_collect(void *arg, uint32_t tenant, const uint8_t *key, uint32_t key_len,
          const struct idx_loc *loc)
{
    struct t_list *l = arg;
    struct t_item *it;

    if (l->n == l->cap) {
        l->cap = l->cap ? l->cap * 2 : 64;
        l->v = realloc(l->v, l->cap * sizeof(*l->v));
        cr_assert_not_null(l->v);
    }
    it = &l->v[l->n++];
    it->tenant = tenant;
    it->key_len = key_len;
    it->key = malloc(key_len ? key_len : 1);
    cr_assert_not_null(it->key);
    memcpy(it->key, key, key_len);
    it->loc = *loc;
    return l->stop_after != 0 && l->n == l->stop_after ? 42 : 0;
}

static void
t_list_free(struct t_list *l)
{
    for (size_t i = 0; i < l->n; i++) {
        free(l->v[i].key);
    }
    free(l->v);
    memset(l, 0, sizeof(*l));
}

static struct t_list
t_scan(struct idx *x)
{
    struct t_list l = {0};
    int rc = idx_scan_objects(x, t_collect, &l);

    cr_assert_eq(rc, 0, "idx_scan_objects: %d", rc);
    return l;
}

static struct t_list
t_scan_bucket(struct idx *x, uint64_t id)
{
    struct t_list l = {0};
    int rc = idx_scan_bucket_objects(x, id, t_collect, &l);

    cr_assert_eq(rc, 0, "idx_scan_bucket_objects: %d", rc);
    return l;
}

static int
t_item_is(const struct t_item *it, uint32_t tenant, const void *key, uint32_t key_len)
{
    return it->tenant == tenant && it->key_len == key_len && memcmp(it->key, key, key_len) == 0;
}

/* t_item_cmp: the order LMDB keeps: tenant, then key bytes, a prefix first. */
static int
t_item_cmp(const struct t_item *a, const struct t_item *b)
{
    uint32_t n = a->key_len < b->key_len ? a->key_len : b->key_len;
    int c;

    if (a->tenant != b->tenant) {
        return a->tenant < b->tenant ? -1 : 1;
    }
    c = memcmp(a->key, b->key, n);
    if (c != 0) {
        return c;
    }
    return a->key_len < b->key_len ? -1 : a->key_len > b->key_len;
}

struct t_buckets {
    size_t n;
    uint64_t id[64];
    struct idx_bucket rec[64];
    size_t stop_after;
};

static int
t_collect_bucket(void *arg, const struct idx_bucket *b)
{
    struct t_buckets *l = arg;

    cr_assert_lt(l->n, 64);
    l->id[l->n] = b->id;
    l->rec[l->n] = *b;
    l->n++;
    return l->stop_after != 0 && l->n == l->stop_after ? 7 : 0;
}

/* ---- tests ---- */

Test(ssd_index, put_get_del_round_trip_with_tenants_as_namespaces)
{
    struct idx *x = t_open(1 * MiB, 64 * MiB, NULL);
    struct idx_op ops[3];
    struct t_list l;

    ops[0] = t_put(1, "alpha", 5, 1, 0);
    ops[1] = t_put(2, "alpha", 5, 2, 4096);
    ops[2] = t_put(1, "beta", 4, 1, 8192);
    cr_assert_eq(idx_apply(x, ops, 3), 0);

    t_expect(x, 1, "alpha", 5, 1, 0);
    t_expect(x, 2, "alpha", 5, 2, 4096);
    t_expect(x, 1, "beta", 4, 1, 8192);
    t_expect_absent(x, 3, "alpha", 5);
    t_expect_absent(x, 2, "beta", 4);
    t_expect_absent(x, 1, "alph", 4);

    t_apply1(x, t_del(1, "alpha", 5, 1, 0));
    t_expect_absent(x, 1, "alpha", 5);
    t_expect(x, 2, "alpha", 5, 2, 4096);
    t_expect(x, 1, "beta", 4, 1, 8192);

    /* deleting an absent key is a no-op, not an error */
    t_apply1(x, t_del(1, "alpha", 5, 1, 0));
    t_apply1(x, t_del(9, "nobody", 6, 1, 0));

    l = t_scan_bucket(x, 1);
    cr_assert_eq(l.n, 1);
    cr_assert(t_item_is(&l.v[0], 1, "beta", 4));
    t_list_free(&l);
    l = t_scan(x);
    cr_assert_eq(l.n, 2);
    t_list_free(&l);
    idx_close(x);
    idx_close(NULL);
}

Test(ssd_index, obj_del_with_stale_loc_is_a_noop)
{
    struct idx *x = t_open(1 * MiB, 64 * MiB, NULL);
    struct t_list l;

    t_apply1(x, t_put(1, "k", 1, 3, 4096));
    t_apply1(x, t_del(1, "k", 1, 3, 0));    /* same bucket, other offset */
    t_apply1(x, t_del(1, "k", 1, 4, 4096)); /* other bucket, same offset */
    t_expect(x, 1, "k", 1, 3, 4096);
    l = t_scan_bucket(x, 3);
    cr_assert_eq(l.n, 1);
    cr_assert(t_item_is(&l.v[0], 1, "k", 1));
    t_list_free(&l);
    idx_close(x);
}

Test(ssd_index, obj_put_replacing_an_entry_moves_its_bucket_row)
{
    struct idx *x = t_open(1 * MiB, 64 * MiB, NULL);
    struct t_list l;

    t_apply1(x, t_put(1, "k", 1, 1, 0));
    t_apply1(x, t_put(1, "k", 1, 2, 8192));
    t_expect(x, 1, "k", 1, 2, 8192);

    l = t_scan_bucket(x, 1);
    cr_assert_eq(l.n, 0, "the old bucket still lists the key");
    t_list_free(&l);
    l = t_scan_bucket(x, 2);
    cr_assert_eq(l.n, 1);
    cr_assert(t_item_is(&l.v[0], 1, "k", 1));
    cr_assert_eq(l.v[0].loc.offset, 8192);
    t_list_free(&l);
    l = t_scan(x);
    cr_assert_eq(l.n, 1);
    t_list_free(&l);

    /* a delete naming the replaced location must not remove the new entry */
    t_apply1(x, t_del(1, "k", 1, 1, 0));
    t_expect(x, 1, "k", 1, 2, 8192);

    /* replacing within one batch: only the last location counts */
    {
        struct idx_op ops[2] = {t_put(1, "k", 1, 5, 0), t_put(1, "k", 1, 6, 0)};

        cr_assert_eq(idx_apply(x, ops, 2), 0);
    }
    t_expect(x, 1, "k", 1, 6, 0);
    l = t_scan_bucket(x, 5);
    cr_assert_eq(l.n, 0);
    t_list_free(&l);
    l = t_scan_bucket(x, 2);
    cr_assert_eq(l.n, 0);
    t_list_free(&l);
    idx_close(x);
}

Test(ssd_index, obj_put_at_a_taken_location_evicts_the_previous_key)
{
    struct idx *x = t_open(1 * MiB, 64 * MiB, NULL);
    struct t_list l;

    t_apply1(x, t_put(1, "a", 1, 1, 0));
    t_apply1(x, t_put(1, "b", 1, 1, 0));
    t_expect_absent(x, 1, "a", 1);
    t_expect(x, 1, "b", 1, 1, 0);
    l = t_scan(x);
    cr_assert_eq(l.n, 1);
    t_list_free(&l);
    l = t_scan_bucket(x, 1);
    cr_assert_eq(l.n, 1);
    cr_assert(t_item_is(&l.v[0], 1, "b", 1));
    t_list_free(&l);
    idx_close(x);
}

/* t_lists_equal: the two scans list the same entries at the same locations, in order. */
static void
t_lists_equal(const struct t_list *a, const struct t_list *b, const char *what)
{
    cr_assert_eq(a->n, b->n, "%s: %zu entries against %zu", what, a->n, b->n);
    for (size_t i = 0; i < a->n; i++) {
        cr_assert(t_item_is(&a->v[i], b->v[i].tenant, b->v[i].key, b->v[i].key_len),
                  "%s: entry %zu differs", what, i);
        cr_assert_eq(a->v[i].loc.bucket, b->v[i].loc.bucket, "%s: entry %zu", what, i);
        cr_assert_eq(a->v[i].loc.offset, b->v[i].loc.offset, "%s: entry %zu", what, i);
        cr_assert_eq(a->v[i].loc.length, b->v[i].loc.length, "%s: entry %zu", what, i);
        cr_assert_eq(a->v[i].loc.crc, b->v[i].loc.crc, "%s: entry %zu", what, i);
    }
}

Test(ssd_index, obj_append_ends_exactly_as_obj_put)
{
    /* A rebuild's walk, with every case IDX_OBJ_APPEND must hand to the checked way: a key
     * written again later, a location before the last one, a taken location, long keys. */
    char other[160];
    char longkey[600], longkey2[600];
    struct idx *put = t_open(1 * MiB, 64 * MiB, NULL);
    struct idx *app = NULL;
    struct idx_op ops[400];
    size_t n = 0;
    char err[256] = "";

    snprintf(other, sizeof(other), "%s/index-append", t_root);
    cr_assert_eq(idx_open(other, 1 * MiB, 64 * MiB, NULL, &app, err, sizeof(err)), 0, "%s", err);
    memset(longkey, 'L', sizeof(longkey));
    memcpy(longkey2, longkey, sizeof(longkey));
    longkey2[599] = 'M';
    for (uint64_t b = 1; b <= 4; b++) {
        for (uint64_t i = 0; i < 80; i++) {
            static char keys[4][80][16];
            char *k = keys[b - 1][i];

            /* keys 0-19 of every bucket are the same keys: written again in each bucket */
            snprintf(k, 16, "k%02llu-%llu", (unsigned long long)(i % 20 == i ? i : i + 100 * b),
                     (unsigned long long)(i < 20 ? 0 : b));
            ops[n++] = t_put(1 + (uint32_t)(i % 3), k, (uint32_t)strlen(k), b, 8192 * (i + 1));
        }
    }
    ops[n++] = t_put(1, "late", 4, 2, 4096);                    /* before the last row */
    ops[n++] = t_put(2, "thief", 5, 4, 8192 * 30);              /* a taken location */
    ops[n++] = t_put(1, longkey, sizeof(longkey), 5, 8192);     /* digest form */
    ops[n++] = t_put(1, longkey2, sizeof(longkey2), 5, 16384);
    ops[n++] = t_put(1, longkey2, sizeof(longkey2), 6, 8192);   /* written again */
    cr_assert_eq(idx_apply(put, ops, n), 0);
    for (size_t i = 0; i < n; i++) {
        ops[i].kind = IDX_OBJ_APPEND;
    }
    /* in two batches, so the appends also follow rows of an earlier transaction */
    cr_assert_eq(idx_apply(app, ops, n / 2), 0);
    cr_assert_eq(idx_apply(app, ops + n / 2, n - n / 2), 0);

    {
        struct t_list a = t_scan(put), b = t_scan(app);

        /* 4 x 60 keys of one bucket, 20 of every bucket, late, thief, the two long keys,
         * less the key whose location thief took */
        cr_assert_eq(a.n, 4 * 60 + 20 + 2 + 2 - 1, "entries: %zu", a.n);
        t_lists_equal(&a, &b, "objects");
        t_list_free(&a);
        t_list_free(&b);
    }
    for (uint64_t id = 1; id <= 6; id++) {
        struct t_list a = t_scan_bucket(put, id), b = t_scan_bucket(app, id);

        t_lists_equal(&a, &b, "a bucket's rows");
        t_list_free(&a);
        t_list_free(&b);
    }
    idx_close(put);
    idx_close(app);
}

Test(ssd_index, bucket_drop_removes_exactly_that_buckets_objects)
{
    struct idx *x = t_open(1 * MiB, 64 * MiB, NULL);
    struct idx_op ops[8];
    struct t_buckets bl = {0};
    struct idx_bucket b;
    struct t_list l;

    ops[0] = t_bucket_op(IDX_BUCKET_PUT, 1);
    ops[1] = t_bucket_op(IDX_BUCKET_PUT, 2);
    ops[2] = t_put(1, "a", 1, 1, 0);
    ops[3] = t_put(1, "b", 1, 1, 4096);
    ops[4] = t_put(2, "c", 1, 1, 8192);
    ops[5] = t_put(1, "d", 1, 2, 0);
    cr_assert_eq(idx_apply(x, ops, 6), 0);
    /* b moves to bucket 2: dropping bucket 1 must keep it */
    t_apply1(x, t_put(1, "b", 1, 2, 4096));

    t_apply1(x, t_bucket_op(IDX_BUCKET_DROP, 1));
    t_expect_absent(x, 1, "a", 1);
    t_expect_absent(x, 2, "c", 1);
    t_expect(x, 1, "b", 1, 2, 4096);
    t_expect(x, 1, "d", 1, 2, 0);
    cr_assert_eq(idx_bucket_get(x, 1, &b), KV_NOT_FOUND);
    cr_assert_eq(idx_bucket_get(x, 2, &b), 0);

    l = t_scan_bucket(x, 1);
    cr_assert_eq(l.n, 0);
    t_list_free(&l);
    l = t_scan_bucket(x, 2);
    cr_assert_eq(l.n, 2);
    cr_assert(t_item_is(&l.v[0], 1, "d", 1));
    cr_assert(t_item_is(&l.v[1], 1, "b", 1));
    t_list_free(&l);
    l = t_scan(x);
    cr_assert_eq(l.n, 2);
    t_list_free(&l);
    cr_assert_eq(idx_scan_buckets(x, t_collect_bucket, &bl), 0);
    cr_assert_eq(bl.n, 1);
    cr_assert_eq(bl.id[0], 2);

    /* ops apply in order within a batch: put into bucket 3, then drop it */
    ops[0] = t_bucket_op(IDX_BUCKET_PUT, 3);
    ops[1] = t_put(1, "e", 1, 3, 0);
    ops[2] = t_bucket_op(IDX_BUCKET_DROP, 3);
    ops[3] = t_put(1, "f", 1, 3, 4096);
    cr_assert_eq(idx_apply(x, ops, 4), 0);
    t_expect_absent(x, 1, "e", 1);
    t_expect(x, 1, "f", 1, 3, 4096);
    cr_assert_eq(idx_bucket_get(x, 3, &b), KV_NOT_FOUND);

    /* dropping an unknown bucket is harmless */
    t_apply1(x, t_bucket_op(IDX_BUCKET_DROP, 99));
    idx_close(x);
}

Test(ssd_index, bucket_records_round_trip_and_upsert)
{
    struct idx *x = t_open(1 * MiB, 64 * MiB, NULL);
    struct idx_op op = t_bucket_op(IDX_BUCKET_PUT, 7);
    struct idx_bucket b;

    op.bucket.owner = 0x5eed0001u;
    t_apply1(x, op);
    cr_assert_eq(idx_bucket_get(x, 7, &b), 0);
    cr_assert_eq(b.id, 7);
    cr_assert_eq(b.created_ms, 1007);
    cr_assert_eq(b.last_read_ms, 2007);
    cr_assert_eq(b.live_bytes, 3007);
    cr_assert_eq(b.total_bytes, 4007);
    cr_assert_eq(b.flags, IDX_BUCKET_SEALED);
    cr_assert_eq(b.owner, 0x5eed0001u, "the owning tenant survives a restart");

    op.bucket.live_bytes = 1;
    op.bucket.total_bytes = UINT64_MAX;
    op.bucket.flags = 0;
    t_apply1(x, op);
    cr_assert_eq(idx_bucket_get(x, 7, &b), 0);
    cr_assert_eq(b.live_bytes, 1);
    cr_assert_eq(b.total_bytes, UINT64_MAX);
    cr_assert_eq(b.flags, 0);
    cr_assert_eq(b.created_ms, 1007);
    cr_assert_eq(idx_bucket_get(x, 8, &b), KV_NOT_FOUND);
    idx_close(x);
}

/* Keys of the scan test: "%05u" then a filler whose length depends on i. */
static uint32_t
t_scan_key(uint8_t *buf, uint32_t i)
{
    uint32_t len = 5 + (i * 7919u) % 31u;

    snprintf((char *)buf, 6, "%05u", i);
    for (uint32_t j = 5; j < len; j++) {
        buf[j] = (uint8_t)(i * 31u + j * 17u);
    }
    return len;
}

static unsigned
t_scan_key_index(const uint8_t *key)
{
    unsigned i = 0;

    for (int j = 0; j < 5; j++) {
        i = i * 10 + (unsigned)(key[j] - '0');
    }
    return i;
}

Test(ssd_index, scans_return_everything_once_in_order_and_stop_early)
{
    enum { N = 300 };
    struct idx *x = t_open(1 * MiB, 64 * MiB, NULL);
    static uint8_t keys[N][40];
    static uint32_t lens[N];
    struct idx_op ops[N + 5];
    struct t_buckets bl = {0};
    size_t per_bucket = 0;
    struct t_list l;
    int rc;

    /* put in a scrambled order: i -> (i * 97) % N is a permutation of 0..N-1 */
    for (uint32_t k = 0; k < N; k++) {
        uint32_t i = (k * 97u) % N;

        lens[i] = t_scan_key(keys[i], i);
        ops[k] = t_put(1 + i % 3, keys[i], lens[i], i % 5, (uint64_t)i * 4096);
    }
    for (uint32_t b = 0; b < 5; b++) {
        ops[N + b] = t_bucket_op(IDX_BUCKET_PUT, (b * 3 + 2) % 5);
    }
    cr_assert_eq(idx_apply(x, ops, N + 5), 0);

    l = t_scan(x);
    cr_assert_eq(l.n, N);
    for (size_t j = 0; j < l.n; j++) {
        unsigned i = t_scan_key_index(l.v[j].key);

        cr_assert_lt(i, N);
        cr_assert(t_item_is(&l.v[j], 1 + i % 3, keys[i], lens[i]));
        cr_assert_eq(l.v[j].loc.bucket, i % 5);
        cr_assert_eq(l.v[j].loc.offset, (uint64_t)i * 4096);
        if (j > 0) {
            cr_assert_lt(t_item_cmp(&l.v[j - 1], &l.v[j]), 0, "scan order broken at %zu", j);
        }
    }
    t_list_free(&l);

    for (uint64_t b = 0; b < 5; b++) {
        l = t_scan_bucket(x, b);
        for (size_t j = 0; j < l.n; j++) {
            cr_assert_eq(l.v[j].loc.bucket, b);
            if (j > 0) {
                cr_assert_lt(l.v[j - 1].loc.offset, l.v[j].loc.offset);
            }
        }
        per_bucket += l.n;
        t_list_free(&l);
    }
    cr_assert_eq(per_bucket, N);

    cr_assert_eq(idx_scan_buckets(x, t_collect_bucket, &bl), 0);
    cr_assert_eq(bl.n, 5);
    for (size_t j = 0; j < 5; j++) {
        cr_assert_eq(bl.id[j], j);
        cr_assert_eq(bl.rec[j].total_bytes, 4000 + j);
    }

    /* a non-zero callback result stops the scan and is its result */
    l.stop_after = 5;
    rc = idx_scan_objects(x, t_collect, &l);
    cr_assert_eq(rc, 42);
    cr_assert_eq(l.n, 5);
    t_list_free(&l);
    l.stop_after = 3;
    rc = idx_scan_bucket_objects(x, 2, t_collect, &l);
    cr_assert_eq(rc, 42);
    cr_assert_eq(l.n, 3);
    t_list_free(&l);
    memset(&bl, 0, sizeof(bl));
    bl.stop_after = 2;
    cr_assert_eq(idx_scan_buckets(x, t_collect_bucket, &bl), 7);
    cr_assert_eq(bl.n, 2);
    idx_close(x);
}

Test(ssd_index, everything_persists_across_close_and_reopen)
{
    struct idx *x = t_open(1 * MiB, 64 * MiB, NULL);
    struct idx_op ops[5];
    struct idx_bucket b;
    uint64_t v = 0;

    ops[0] = t_put(1, "persist", 7, 4, 12288);
    ops[1] = t_bucket_op(IDX_BUCKET_PUT, 4);
    ops[2] = t_meta("next_bucket", 5);
    ops[3] = t_meta("seq", 1);
    ops[4] = t_meta("seq", 123456789012345ull);
    cr_assert_eq(idx_apply(x, ops, 5), 0);
    idx_close(x);

    x = t_open(1 * MiB, 64 * MiB, NULL);
    t_expect(x, 1, "persist", 7, 4, 12288);
    cr_assert_eq(idx_bucket_get(x, 4, &b), 0);
    cr_assert_eq(b.live_bytes, 3004);
    cr_assert_eq(idx_meta_get(x, "next_bucket", &v), 0);
    cr_assert_eq(v, 5);
    cr_assert_eq(idx_meta_get(x, "seq", &v), 0);
    cr_assert_eq(v, 123456789012345ull);
    cr_assert_eq(idx_meta_get(x, "nothing", &v), KV_NOT_FOUND);
    idx_close(x);
}

/* Keys of the map tests: 200 bytes, distinct in the first 9. */
static void
t_big_key(uint8_t *buf, uint32_t i)
{
    memset(buf, 'a' + (int)(i % 26), 200);
    snprintf((char *)buf, 10, "%09u", i);
    buf[9] = '-';
}

Test(ssd_index, map_grows_when_full)
{
    enum { N = 20000, BATCH = 1000 };
    struct idx *x = t_open(1 * MiB, 256 * MiB, NULL);
    static uint8_t keys[N][200];
    static struct idx_op ops[BATCH];
    struct t_list l;

    cr_assert_eq(idx_map_size(x), 1 * MiB);
    for (uint32_t i = 0; i < N; i++) {
        t_big_key(keys[i], i);
    }
    for (uint32_t base = 0; base < N; base += BATCH) {
        for (uint32_t j = 0; j < BATCH; j++) {
            uint32_t i = base + j;

            ops[j] = t_put(7, keys[i], 200, i / 100, (uint64_t)(i % 100) * 4096);
        }
        cr_assert_eq(idx_apply(x, ops, BATCH), 0, "batch at %u", base);
    }
    cr_assert_gt(idx_map_size(x), 1 * MiB);
    cr_assert_leq(idx_map_size(x), 256 * MiB);
    for (uint32_t i = 0; i < N; i++) {
        t_expect(x, 7, keys[i], 200, i / 100, (uint64_t)(i % 100) * 4096);
    }
    l = t_scan(x);
    cr_assert_eq(l.n, N);
    t_list_free(&l);
    l = t_scan_bucket(x, 123);
    cr_assert_eq(l.n, 100);
    t_list_free(&l);
    idx_close(x);

    /* the grown map is the environment's size now */
    x = t_open(1 * MiB, 256 * MiB, NULL);
    cr_assert_gt(idx_map_size(x), 1 * MiB);
    t_expect(x, 7, keys[N - 1], 200, (N - 1) / 100, (uint64_t)((N - 1) % 100) * 4096);
    idx_close(x);
}

Test(ssd_index, full_map_at_max_fails_the_whole_batch_and_stays_usable)
{
    enum { FIRST = 200, BIG = 5000 };
    struct idx *x = t_open(1 * MiB, 1 * MiB, NULL);
    static uint8_t keys[FIRST + BIG + 1][200];
    static struct idx_op ops[BIG + 3];
    struct idx_bucket b;
    uint64_t v;
    struct t_list l;
    int rc;

    for (uint32_t i = 0; i < FIRST + BIG + 1; i++) {
        t_big_key(keys[i], i);
    }
    for (uint32_t i = 0; i < FIRST; i++) {
        ops[i] = t_put(1, keys[i], 200, 1, (uint64_t)i * 4096);
    }
    cr_assert_eq(idx_apply(x, ops, FIRST), 0);
    t_apply1(x, t_bucket_op(IDX_BUCKET_PUT, 1));

    /* about 2.5 MB of entries cannot fit in 1 MiB; the delete, meta and drop must not apply */
    ops[0] = t_del(1, keys[0], 200, 1, 0);
    ops[1] = t_meta("m", 1);
    ops[2] = t_bucket_op(IDX_BUCKET_DROP, 1);
    for (uint32_t j = 0; j < BIG; j++) {
        ops[3 + j] = t_put(1, keys[FIRST + j], 200, 2, (uint64_t)j * 4096);
    }
    rc = idx_apply(x, ops, BIG + 3);
    cr_assert_eq(rc, KV_NO_SPACE, "idx_apply: %d", rc);
    cr_assert_eq(idx_map_size(x), 1 * MiB);

    for (uint32_t i = 0; i < FIRST; i++) {
        t_expect(x, 1, keys[i], 200, 1, (uint64_t)i * 4096);
    }
    for (uint32_t j = 0; j < BIG; j++) {
        t_expect_absent(x, 1, keys[FIRST + j], 200);
    }
    cr_assert_eq(idx_meta_get(x, "m", &v), KV_NOT_FOUND);
    cr_assert_eq(idx_bucket_get(x, 1, &b), 0);
    l = t_scan(x);
    cr_assert_eq(l.n, FIRST);
    t_list_free(&l);
    l = t_scan_bucket(x, 2);
    cr_assert_eq(l.n, 0);
    t_list_free(&l);

    /* still usable: a small batch goes in */
    ops[0] = t_put(1, keys[FIRST + BIG], 200, 3, 0);
    ops[1] = t_meta("m", 2);
    cr_assert_eq(idx_apply(x, ops, 2), 0);
    t_expect(x, 1, keys[FIRST + BIG], 200, 3, 0);
    cr_assert_eq(idx_meta_get(x, "m", &v), 0);
    cr_assert_eq(v, 2);
    idx_close(x);
}

static int
t_die(void *arg, uint32_t tenant, const uint8_t *key, uint32_t key_len, const struct idx_loc *loc)
{
    (void)arg;
    (void)tenant;
    (void)key;
    (void)key_len;
    (void)loc;
    raise(SIGKILL);
    return 1;
}

/*
 * LMDB resets the reader table when the first process opens an environment,
 * so a dead reader's slot only survives (and only needs clearing) while some
 * other process has the environment open: a holder child keeps it open here.
 */
Test(ssd_index, reader_killed_mid_scan_is_reported_and_cleared)
{
    struct idx *x = t_open(1 * MiB, 64 * MiB, NULL);
    struct idx_op ops[3] = {t_put(1, "a", 1, 1, 0), t_put(1, "b", 1, 1, 4096),
                            t_put(1, "c", 1, 1, 8192)};
    int ready[2], go[2];
    int stale = -1;
    int status = 0;
    pid_t holder, pid;
    char c;

    cr_assert_eq(idx_apply(x, ops, 3), 0);
    idx_close(x); /* an LMDB environment must not cross a fork */
    cr_assert_eq(pipe(ready), 0);
    cr_assert_eq(pipe(go), 0);

    holder = fork();
    cr_assert_neq(holder, -1, "fork: %s", strerror(errno));
    if (holder == 0) {
        struct idx *hx = NULL;
        char err[256];

        close(ready[0]);
        close(go[1]);
        if (idx_open(t_path, 1 * MiB, 64 * MiB, NULL, &hx, err, sizeof(err)) != 0) {
            _exit(2);
        }
        if (write(ready[1], "r", 1) != 1) {
            _exit(3);
        }
        while (read(go[0], &c, 1) > 0) {
        }
        idx_close(hx);
        _exit(0); /* EOF on go: the test is done (or died) */
    }
    close(ready[1]);
    close(go[0]);
    cr_assert_eq(read(ready[0], &c, 1), 1, "the holder could not open the index");

    pid = fork();
    cr_assert_neq(pid, -1, "fork: %s", strerror(errno));
    if (pid == 0) {
        struct idx *cx = NULL;
        char err[256];

        if (idx_open(t_path, 1 * MiB, 64 * MiB, NULL, &cx, err, sizeof(err)) != 0) {
            _exit(2);
        }
        idx_scan_objects(cx, t_die, NULL);
        _exit(3); /* not reached: t_die killed us holding a reader slot */
    }
    cr_assert_eq(waitpid(pid, &status, 0), pid);
    cr_assert(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL, "child status %#x", status);

    x = t_open(1 * MiB, 64 * MiB, &stale);
    cr_assert_geq(stale, 1, "stale readers %d", stale);
    t_expect(x, 1, "b", 1, 1, 4096);
    idx_close(x);

    x = t_open(1 * MiB, 64 * MiB, &stale);
    cr_assert_eq(stale, 0, "the slot was not cleared");
    idx_close(x);

    close(go[1]);
    close(ready[0]);
    cr_assert_eq(waitpid(holder, &status, 0), holder);
    cr_assert(WIFEXITED(status) && WEXITSTATUS(status) == 0, "holder status %#x", status);
}

Test(ssd_index, long_keys_round_trip_and_stay_distinct)
{
    struct idx *x = t_open(1 * MiB, 64 * MiB, NULL);
    static uint8_t k1[1000], k2[1000];
    struct idx_op ops[7];
    struct t_list l;
    /* what each op put, in bucket-5 offset order */
    const uint8_t *want_key[6];
    uint32_t want_len[6];

    for (size_t i = 0; i < sizeof(k1); i++) {
        k1[i] = (uint8_t)(i * 13 + 1);
    }
    memcpy(k2, k1, sizeof(k1));
    k2[999] ^= 0x80; /* 999 shared leading bytes */

    ops[0] = t_put(1, k1, 1000, 5, 0);
    ops[1] = t_put(1, k2, 1000, 5, 4096);
    ops[2] = t_put(1, k1, 600, 5, 8192);  /* a long prefix of k1 */
    ops[3] = t_put(1, k1, 507, 5, 12288); /* the longest key kept inline */
    ops[4] = t_put(1, k1, 508, 5, 16384); /* the shortest key kept by digest */
    ops[5] = t_put(1, k2, 999, 5, 20480); /* == k1[0..999) */
    ops[6] = t_put(2, k1, 1000, 6, 0);    /* same bytes, other tenant */
    cr_assert_eq(idx_apply(x, ops, 7), 0);
    for (int i = 0; i < 6; i++) {
        want_key[i] = ops[i].key;
        want_len[i] = ops[i].key_len;
    }

    t_expect(x, 1, k1, 1000, 5, 0);
    t_expect(x, 1, k2, 1000, 5, 4096);
    t_expect(x, 1, k1, 600, 5, 8192);
    t_expect(x, 1, k1, 507, 5, 12288);
    t_expect(x, 1, k1, 508, 5, 16384);
    t_expect(x, 1, k1, 999, 5, 20480);
    t_expect(x, 2, k1, 1000, 6, 0);
    t_expect_absent(x, 1, k1, 509);
    t_expect_absent(x, 3, k1, 1000);

    l = t_scan_bucket(x, 5);
    cr_assert_eq(l.n, 6);
    for (int i = 0; i < 6; i++) {
        cr_assert(t_item_is(&l.v[i], 1, want_key[i], want_len[i]), "bucket row %d", i);
    }
    t_list_free(&l);

    l = t_scan(x);
    cr_assert_eq(l.n, 7);
    for (int i = 0; i < 7; i++) {
        int hits = 0;

        for (size_t j = 0; j < l.n; j++) {
            hits += t_item_is(&l.v[j], ops[i].tenant, ops[i].key, ops[i].key_len);
        }
        cr_assert_eq(hits, 1, "op %d scanned %d times", i, hits);
    }
    t_list_free(&l);

    t_apply1(x, t_del(1, k1, 1000, 5, 0));
    t_expect_absent(x, 1, k1, 1000);
    t_expect(x, 1, k2, 1000, 5, 4096);
    t_expect(x, 2, k1, 1000, 6, 0);

    t_apply1(x, t_bucket_op(IDX_BUCKET_DROP, 5));
    l = t_scan(x);
    cr_assert_eq(l.n, 1);
    cr_assert(t_item_is(&l.v[0], 2, k1, 1000));
    t_list_free(&l);
    idx_close(x);
}

Test(ssd_index, a_key_sharing_a_digest_slot_never_answers_for_another)
{
    struct idx *x = t_open(1 * MiB, 64 * MiB, NULL);
    static uint8_t lk[800];
    uint8_t sk[1 + SHA256_DIGEST_LENGTH];
    struct t_list l;

    /* sk is a 33-byte key whose objects key equals the digest slot of lk */
    memset(lk, 'L', sizeof(lk));
    sk[0] = 0xFF;
    SHA256(lk, sizeof(lk), sk + 1);

    t_apply1(x, t_put(1, lk, sizeof(lk), 1, 0));
    t_expect_absent(x, 1, sk, sizeof(sk));
    t_apply1(x, t_del(1, sk, sizeof(sk), 1, 0));
    t_expect(x, 1, lk, sizeof(lk), 1, 0);

    t_apply1(x, t_put(1, sk, sizeof(sk), 2, 0));
    t_expect(x, 1, sk, sizeof(sk), 2, 0);
    t_expect_absent(x, 1, lk, sizeof(lk));
    l = t_scan_bucket(x, 1);
    cr_assert_eq(l.n, 0);
    t_list_free(&l);

    t_apply1(x, t_put(1, lk, sizeof(lk), 3, 0));
    t_expect(x, 1, lk, sizeof(lk), 3, 0);
    t_expect_absent(x, 1, sk, sizeof(sk));
    t_apply1(x, t_del(1, sk, sizeof(sk), 2, 0));
    t_expect(x, 1, lk, sizeof(lk), 3, 0);
    l = t_scan(x);
    cr_assert_eq(l.n, 1);
    cr_assert(t_item_is(&l.v[0], 1, lk, sizeof(lk)));
    t_list_free(&l);
    l = t_scan_bucket(x, 2);
    cr_assert_eq(l.n, 0);
    t_list_free(&l);
    idx_close(x);
}

Test(ssd_index, invalid_ops_are_refused_and_apply_nothing)
{
    struct idx *x = t_open(1 * MiB, 64 * MiB, NULL);
    struct idx_op ops[2];
    struct t_list l;

    ops[0] = t_put(1, "ok", 2, 1, 0);
    ops[1] = t_put(1, NULL, 5, 1, 4096);
    cr_assert_eq(idx_apply(x, ops, 2), -EINVAL);
    ops[1] = t_meta("", 1);
    cr_assert_eq(idx_apply(x, ops, 2), -EINVAL);
    ops[1].kind = 99;
    cr_assert_eq(idx_apply(x, ops, 2), -EINVAL);
    t_expect_absent(x, 1, "ok", 2);
    l = t_scan(x);
    cr_assert_eq(l.n, 0);
    t_list_free(&l);
    cr_assert_eq(idx_apply(x, ops, 0), 0);
    idx_close(x);
}

static void
t_open_fails_naming(const char *path, int want_rc)
{
    static int not_null;
    struct idx *x = (struct idx *)&not_null; /* idx_open must reset it */
    char err[512] = "";
    int rc = idx_open(path, 1 * MiB, 64 * MiB, NULL, &x, err, sizeof(err));

    cr_assert_neq(rc, 0, "idx_open(%s) succeeded", path);
    if (want_rc != 0) {
        cr_assert_eq(rc, want_rc, "idx_open(%s): %d, %s", path, rc, err);
    }
    cr_assert_null(x);
    cr_assert_not_null(strstr(err, path), "message without the path: \"%s\"", err);
}

Test(ssd_index, open_on_an_unwritable_path_names_the_path)
{
    char missing[192];

    t_open_fails_naming("/proc/self/kvstash-index", 0);
    snprintf(missing, sizeof(missing), "%s/no/such/index", t_root);
    t_open_fails_naming(missing, -ENOENT);
}

Test(ssd_index, open_in_a_read_only_directory_names_the_path)
{
    char ro[192];

    if (geteuid() == 0) {
        t_fini(); /* a skipped test does not get its .fini */
        cr_skip_test("running as root: directory permissions do not stop root");
    }
    snprintf(ro, sizeof(ro), "%s/ro", t_root);
    cr_assert_eq(mkdir(ro, 0500), 0);
    t_open_fails_naming(ro, -EACCES);
    chmod(ro, 0700);
}
