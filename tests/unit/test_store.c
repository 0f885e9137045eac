/*
 * test_store: the object store as the daemon uses it: the reserve/commit
 * state machine, byte-exact values through iov and copies, references and
 * leases that block remove and eviction, near-LRU eviction with soft pins
 * last and hard pins never, watermarks and NO_SPACE, tenants as separate
 * namespaces, and a multi-threaded run that checks every value read back.
 * Arenas are small (at most 16 MiB); every test finishes in seconds.
 */
#include <criterion/criterion.h>

#include "clock.h"
#include "crc32c.h"
#include "kverr.h"
#include "store.h"
#include "store_keys.h"

#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/uio.h>
#include <time.h>

#define KiB 1024ull
#define MiB (1024ull * 1024ull)

static struct store *
t_store(uint64_t memory, double high, double low)
{
    struct store_config cfg = {
        .memory_size = memory,
        .max_key_size = 256,
        .max_value_size = memory,
        .high_watermark = high,
        .low_watermark = low,
    };
    struct store *s = NULL;

    cr_assert_eq(store_create(&cfg, &s), 0);
    cr_assert_not_null(s);
    return s;
}

/* t_put: store a value of len bytes derived from id. Returns the store_put status. */
static int
t_put(struct store *s, uint32_t tenant, uint64_t id, uint64_t len)
{
    struct t_key tk;
    uint8_t *buf = malloc(len + 1);
    int rc;

    t_fill(buf, id, len);
    rc = store_put(s, t_key(&tk, tenant, id), buf, len);
    free(buf);
    return rc;
}

/* t_verify: 1 when the object's bytes, read through its iov, are exactly those of id. */
static int
t_verify_obj(const struct store_obj *o, uint64_t id, uint64_t len)
{
    struct iovec iov[STORE_MAX_EXTENTS];
    uint64_t at = 0;
    int n;

    if (store_obj_size(o) != len) {
        return 0;
    }
    n = store_obj_iov(o, iov, STORE_MAX_EXTENTS);
    if (n < 0 || (len == 0) != (n == 0)) {
        return 0;
    }
    for (int i = 0; i < n; i++) {
        const uint8_t *p = iov[i].iov_base;

        if (iov[i].iov_len == 0) {
            return 0;
        }
        for (size_t j = 0; j < iov[i].iov_len; j++) {
            if (p[j] != t_byte(id, at + j)) {
                return 0;
            }
        }
        at += iov[i].iov_len;
    }
    return at == len;
}

/* t_check: get + verify + unref. 1 = found and exact, 0 = not found, -1 = wrong bytes. */
static int
t_check(struct store *s, uint32_t tenant, uint64_t id, uint64_t len)
{
    struct t_key tk;
    struct store_obj *o;
    int ok;

    if (store_get(s, t_key(&tk, tenant, id), &o) != 0) {
        return 0;
    }
    ok = t_verify_obj(o, id, len) ? 1 : -1;
    store_obj_unref(s, o);
    return ok;
}

static int
t_exists(struct store *s, uint32_t tenant, uint64_t id)
{
    struct t_key tk;

    return store_exists(s, t_key(&tk, tenant, id));
}

static void
t_sleep_ms(long ms)
{
    struct timespec ts = { ms / 1000, (ms % 1000) * 1000000L };

    nanosleep(&ts, NULL);
}

static struct store_stats
t_stats(struct store *s)
{
    struct store_stats st;

    store_stats(s, &st);
    return st;
}

Test(store, create_validates_config)
{
    struct store_config cfg = {
        .memory_size = 1 * MiB,
        .max_key_size = 64,
        .max_value_size = 1 * MiB,
        .high_watermark = 0.9,
        .low_watermark = 0.8,
    };
    struct store_config bad;
    struct store *s = (struct store *)&cfg;

    bad = cfg;
    bad.memory_size = STORE_PAGE_SIZE - 1;
    cr_assert_eq(store_create(&bad, &s), KV_INVALID_ARGUMENT);
    cr_assert_null(s);
    bad = cfg;
    bad.low_watermark = 0.0;
    cr_assert_eq(store_create(&bad, &s), KV_INVALID_ARGUMENT);
    bad = cfg;
    bad.low_watermark = 0.95;
    cr_assert_eq(store_create(&bad, &s), KV_INVALID_ARGUMENT, "low above high");
    bad = cfg;
    bad.high_watermark = 1.01;
    cr_assert_eq(store_create(&bad, &s), KV_INVALID_ARGUMENT);
    bad = cfg;
    bad.high_watermark = NAN;
    cr_assert_eq(store_create(&bad, &s), KV_INVALID_ARGUMENT);
    cr_assert_eq(store_create(NULL, &s), KV_INVALID_ARGUMENT);

    bad = cfg;
    bad.memory_size = STORE_PAGE_SIZE;
    bad.low_watermark = bad.high_watermark = 1.0;
    cr_assert_eq(store_create(&bad, &s), 0, "one page and watermarks at 1.0 are valid");
    cr_assert_eq(t_stats(s).memory_capacity, STORE_PAGE_SIZE);
    store_destroy(s);

    cr_assert_eq(store_create(&cfg, &s), 0);
    bad = cfg;
    bad.low_watermark = -1;
    cr_assert_eq(store_set_limits(s, &bad), KV_INVALID_ARGUMENT);
    bad = cfg;
    bad.memory_size = 1;            /* ignored by set_limits */
    bad.high_watermark = 1.0;
    cr_assert_eq(store_set_limits(s, &bad), 0);
    cr_assert_eq(t_stats(s).memory_capacity, 1 * MiB);
    store_destroy(s);
    store_destroy(NULL);
}

Test(store, reserve_commit_abort_state_machine)
{
    struct store *s = t_store(4 * MiB, 1.0, 1.0);
    struct t_key tk;
    struct store_obj *o;
    struct store_obj *o2;
    uint8_t buf[10000];
    uint64_t size = 0;

    cr_assert_eq(store_reserve(s, t_key(&tk, 0, 1), sizeof(buf), &o), 0);
    cr_assert_not_null(o);
    cr_assert_eq(t_stats(s).reserved, 1);
    cr_assert_eq(t_stats(s).objects, 0);
    cr_assert_eq(t_stats(s).memory_used, 3 * STORE_PAGE_SIZE, "10000 bytes take 3 pages");

    /* Reserved: invisible to every read, refused to a second writer, not removable. */
    cr_assert_eq(store_get(s, &tk.k, &o2), KV_NOT_FOUND);
    cr_assert_null(o2);
    cr_assert_eq(store_exists(s, &tk.k), 0);
    cr_assert_eq(store_size(s, &tk.k, &size), KV_NOT_FOUND);
    cr_assert_eq(store_lease(s, &tk.k, 1000, &size), KV_NOT_FOUND);
    cr_assert_eq(store_pin(s, &tk.k, STORE_PIN_HARD), KV_NOT_FOUND);
    cr_assert_eq(store_reserve(s, &tk.k, 5, &o2), KV_BUSY);
    cr_assert_eq(store_remove(s, &tk.k, true), KV_BUSY);
    cr_assert_eq(store_remove_all(s, 0, true, true), 0);

    t_fill(buf, 1, sizeof(buf));
    cr_assert_eq(store_obj_write(o, 0, buf, 4000), 4000);
    cr_assert_eq(store_obj_write(o, 4000, buf + 4000, 10000), 6000, "short past the end");
    cr_assert_eq(store_commit(s, o), 0);

    /* Published: visible whole, write-once. */
    cr_assert_eq(store_exists(s, &tk.k), 1);
    cr_assert_eq(store_size(s, &tk.k, &size), 0);
    cr_assert_eq(size, sizeof(buf));
    cr_assert_eq(t_check(s, 0, 1, sizeof(buf)), 1);
    cr_assert_eq(store_reserve(s, &tk.k, 5, &o2), KV_EXISTS);
    cr_assert_eq(t_put(s, 0, 1, 10), KV_EXISTS);
    cr_assert_eq(t_stats(s).reserved, 0);
    cr_assert_eq(t_stats(s).objects, 1);
    cr_assert_eq(t_stats(s).value_bytes, sizeof(buf));

    /* Commit of something that is not reserved is refused and changes nothing. */
    cr_assert_eq(store_get(s, &tk.k, &o2), 0);
    cr_assert_eq(store_commit(s, o2), KV_INVALID_ARGUMENT);
    store_obj_unref(s, o2);
    cr_assert_eq(t_check(s, 0, 1, sizeof(buf)), 1);

    /* Abort: the space comes back and the key is free again. */
    cr_assert_eq(store_reserve(s, t_key(&tk, 0, 2), 1 * MiB, &o), 0);
    cr_assert_eq(t_stats(s).memory_used, (3 + 256) * STORE_PAGE_SIZE);
    store_abort(s, o);
    store_abort(s, NULL);
    cr_assert_eq(t_stats(s).memory_used, 3 * STORE_PAGE_SIZE);
    cr_assert_eq(t_stats(s).reserved, 0);
    cr_assert_eq(store_exists(s, &tk.k), 0);
    cr_assert_eq(store_reserve(s, &tk.k, 1, &o), 0, "an aborted key can be reserved again");
    store_abort(s, o);
    store_destroy(s);
}

Test(store, round_trip_is_byte_exact)
{
    static const uint64_t sizes[] = {
        0, 1, 2, 4095, 4096, 4097, 65537, 7 * 4096 + 5, 1 * MiB + 3, 3 * MiB - 1,
    };
    struct store *s = t_store(16 * MiB, 1.0, 1.0);
    uint8_t *buf = malloc(3 * MiB);

    for (size_t i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++) {
        struct t_key tk;
        struct store_obj *o;
        struct iovec iov[STORE_MAX_EXTENTS];
        uint64_t len = sizes[i];
        uint64_t size = 99;

        cr_assert_eq(t_put(s, 0, i, len), 0, "put of %llu bytes", (unsigned long long)len);
        cr_assert_eq(store_size(s, t_key(&tk, 0, i), &size), 0);
        cr_assert_eq(size, len);
        cr_assert_eq(store_get(s, &tk.k, &o), 0);
        cr_assert(t_verify_obj(o, i, len), "iov bytes differ for size %llu",
                  (unsigned long long)len);
        if (len == 0) {
            cr_assert_eq(store_obj_iov(o, iov, STORE_MAX_EXTENTS), 0);
        }

        /* Copies: whole, across extent boundaries, and short at the end. */
        memset(buf, 0xee, len + 1);
        cr_assert_eq(store_obj_read(o, 0, buf, len + 100), len);
        for (uint64_t j = 0; j < len; j++) {
            cr_assert_eq(buf[j], t_byte(i, j), "byte %llu of size %llu", (unsigned long long)j,
                         (unsigned long long)len);
        }
        cr_assert_eq(buf[len], 0xee, "read wrote past the value");
        if (len > 5000) {
            uint64_t off = len / 2 - 2000;

            cr_assert_eq(store_obj_read(o, off, buf, 4001), 4001);
            for (uint64_t j = 0; j < 4001; j++) {
                cr_assert_eq(buf[j], t_byte(i, off + j));
            }
        }
        cr_assert_eq(store_obj_read(o, len, buf, 10), 0);
        store_obj_unref(s, o);
    }

    /* A writer filling a reserved object in odd-sized chunks. */
    {
        struct t_key tk;
        struct store_obj *o;
        uint64_t len = 2 * MiB + 12345;

        t_fill(buf, 77, len);
        cr_assert_eq(store_reserve(s, t_key(&tk, 0, 77), len, &o), 0);
        for (uint64_t off = 0; off < len; off += 3001) {
            uint64_t chunk = len - off < 3001 ? len - off : 3001;

            cr_assert_eq(store_obj_write(o, off, buf + off, chunk), chunk);
        }
        cr_assert_eq(store_commit(s, o), 0);
        cr_assert_eq(t_check(s, 0, 77, len), 1);
    }
    free(buf);
    store_destroy(s);
}

Test(store, tenants_are_separate_namespaces)
{
    struct store *s = t_store(4 * MiB, 1.0, 1.0);
    struct t_key tk;
    uint64_t size;

    cr_assert_eq(t_put(s, 0, 5, 100), 0);
    cr_assert_eq(t_exists(s, 1, 5), 0, "tenant 1 sees tenant 0's key");
    cr_assert_eq(t_put(s, 1, 5, 200), 0, "the same key bytes in another tenant");
    cr_assert_eq(t_put(s, 2, 5, 300), 0);
    cr_assert_eq(store_size(s, t_key(&tk, 0, 5), &size), 0);
    cr_assert_eq(size, 100);
    cr_assert_eq(store_size(s, t_key(&tk, 1, 5), &size), 0);
    cr_assert_eq(size, 200);

    cr_assert_eq(store_remove(s, t_key(&tk, 1, 5), false), 0);
    cr_assert_eq(t_exists(s, 1, 5), 0);
    cr_assert_eq(t_check(s, 0, 5, 100), 1);
    cr_assert_eq(t_check(s, 2, 5, 300), 1);

    cr_assert_eq(t_put(s, 1, 6, 10), 0);
    cr_assert_eq(t_put(s, 1, 7, 10), 0);
    cr_assert_eq(store_remove_all(s, 1, false, false), 2);
    cr_assert_eq(t_exists(s, 0, 5), 1);
    cr_assert_eq(t_exists(s, 2, 5), 1);
    cr_assert_eq(store_remove_all(s, 0, true, false), 2);
    cr_assert_eq(t_stats(s).objects, 0);
    cr_assert_eq(t_stats(s).memory_used, 0);
    store_destroy(s);
}

/*
 * A tenant at its DRAM quota makes room from its own oldest objects and
 * never from another tenant's; only when none of its own can go (here:
 * all hard-pinned) does a put get KV_QUOTA_EXCEEDED.
 */
Test(store, quota_evicts_the_tenants_own_objects_first)
{
    struct store *s = t_store(64 * MiB, 0.9, 0.8);
    struct t_key tk;

    cr_assert_eq(store_set_quota(s, 7, 4 * MiB, 0), 0);
    for (uint64_t i = 0; i < 8; i++) {
        cr_assert_eq(t_put(s, 8, 100 + i, MiB), 0);     /* no quota, older than 7's */
    }
    for (uint64_t i = 0; i < 10; i++) {
        cr_assert_eq(t_put(s, 7, i, MiB), 0, "put %llu past the quota", (unsigned long long)i);
        /* Access stamps come from a coarse clock (a few ms): keep the order unambiguous. */
        nanosleep(&(struct timespec){0, 10 * 1000 * 1000}, NULL);
    }
    for (uint64_t i = 0; i < 10; i++) {
        cr_assert_eq(t_exists(s, 7, i), i >= 6, "object %llu: the oldest make room",
                     (unsigned long long)i);
    }
    cr_assert_eq(t_check(s, 7, 9, MiB), 1, "the newest is there");
    for (uint64_t i = 0; i < 8; i++) {
        cr_assert_eq(t_check(s, 8, 100 + i, MiB), 1, "another tenant's object was evicted");
    }
    cr_assert(t_stats(s).evictions >= 6);

    /* Everything it still has pinned hard: nothing of its own can go. */
    for (uint64_t i = 0; i < 10; i++) {
        (void)store_pin(s, t_key(&tk, 7, i), STORE_PIN_HARD);
    }
    cr_assert_eq(t_put(s, 7, 50, MiB), KV_QUOTA_EXCEEDED);
    cr_assert_eq(t_stats(s).quota_exceeded, 1);
    cr_assert_eq(t_put(s, 7, 51, 8 * MiB), KV_QUOTA_EXCEEDED, "larger than the quota itself");
    for (uint64_t i = 0; i < 8; i++) {
        cr_assert_eq(t_check(s, 8, 100 + i, MiB), 1);
    }
    store_destroy(s);
}

/* Quota slots: 64 at once; a removed tenant's slot serves the next one. */
Test(store, quota_slots_are_given_back)
{
    struct store *s = t_store(16 * MiB, 0.9, 0.8);

    for (uint32_t round = 0; round < 4; round++) {
        for (uint32_t t = 1; t <= 64; t++) {
            cr_assert_eq(store_set_quota(s, round * 100 + t, MiB, 0), 0, "round %u tenant %u",
                         round, t);
        }
        cr_assert_eq(store_set_quota(s, 9999, MiB, 0), KV_NO_SPACE);
        for (uint32_t t = 1; t <= 64; t++) {
            store_drop_quota(s, round * 100 + t);
        }
    }
    /* A slot taken again starts from what the tenant holds, not from the last owner's. */
    cr_assert_eq(t_put(s, 5000, 1, MiB), 0);
    cr_assert_eq(store_set_quota(s, 5000, 2 * MiB, 0), 0);
    cr_assert_eq(t_put(s, 5000, 2, MiB), 0);
    cr_assert_eq(t_put(s, 5000, 3, MiB), 0);
    cr_assert_eq(t_exists(s, 5000, 1) + t_exists(s, 5000, 2), 1,
                 "the quota did not count the object it held before");
    cr_assert_eq(t_check(s, 5000, 3, MiB), 1);
    store_destroy(s);
}

/*
 * A tenant's usage (its stats) walks the table at most once per
 * STORE_USAGE_CACHE_MS: asking in a loop cannot keep the shards locked.
 */
Test(store, tenant_usage_walks_at_most_once_per_interval)
{
    struct store *s = t_store(16 * MiB, 0.9, 0.8);
    uint64_t objects, bytes;
    struct timespec pause = {STORE_USAGE_CACHE_MS / 1000, (STORE_USAGE_CACHE_MS % 1000 + 50) * 1000000L};

    cr_assert_eq(store_set_quota(s, 7, 0, 0), 0);
    cr_assert_eq(t_put(s, 7, 1, 1000), 0);
    cr_assert_eq(t_put(s, 8, 1, 3000), 0);      /* another tenant's: not counted */
    store_tenant_usage(s, 7, &objects, &bytes);
    cr_assert_eq(objects, 1);
    cr_assert_eq(bytes, 1000);
    cr_assert_eq(t_put(s, 7, 2, 500), 0);
    store_tenant_usage(s, 7, &objects, &bytes);
    cr_assert_eq(objects, 1, "walked again within the interval");
    nanosleep(&pause, NULL);
    store_tenant_usage(s, 7, &objects, &bytes);
    cr_assert_eq(objects, 2);
    cr_assert_eq(bytes, 1500);
    store_destroy(s);
}

Test(store, refuses_too_large_keys_and_values)
{
    struct store_config cfg = {
        .memory_size = 4 * MiB,
        .max_key_size = 16,
        .max_value_size = 64 * KiB,
        .high_watermark = 1.0,
        .low_watermark = 1.0,
    };
    struct store *s;
    struct store_obj *o;
    uint8_t long_key[17];
    struct kv_key k = { 0, sizeof(long_key), long_key };

    memset(long_key, 'k', sizeof(long_key));
    cr_assert_eq(store_create(&cfg, &s), 0);
    cr_assert_eq(store_reserve(s, &k, 1, &o), KV_TOO_LARGE);
    k.len = 16;
    cr_assert_eq(store_reserve(s, &k, 64 * KiB + 1, &o), KV_TOO_LARGE);
    cr_assert_eq(store_reserve(s, &k, 64 * KiB, &o), 0, "exactly at both limits is fine");
    store_abort(s, o);

    cfg.max_key_size = 17;
    cfg.max_value_size = 64 * MiB;
    cr_assert_eq(store_set_limits(s, &cfg), 0);
    k.len = 17;
    cr_assert_eq(store_reserve(s, &k, 64 * KiB + 1, &o), 0);
    store_abort(s, o);

    /* Within the limits but bigger than the whole arena: no space, counted. */
    cr_assert_eq(store_reserve(s, &k, 4 * MiB + 1, &o), KV_NO_SPACE);
    cr_assert_eq(t_stats(s).no_space, 1);
    cr_assert_eq(t_stats(s).memory_used, 0);
    store_destroy(s);
}

Test(store, references_block_remove_and_keep_bytes)
{
    struct store *s = t_store(1 * MiB, 1.0, 1.0);
    struct t_key tk;
    struct store_obj *o;

    cr_assert_eq(t_put(s, 0, 1, 50000), 0);
    cr_assert_eq(store_get(s, t_key(&tk, 0, 1), &o), 0);
    store_obj_ref(o);
    cr_assert_eq(store_remove(s, &tk.k, false), KV_BUSY);
    cr_assert_eq(store_remove(s, &tk.k, true), KV_BUSY, "force never overrides a reader");
    cr_assert_eq(store_remove_all(s, 0, true, true), 0);
    cr_assert_eq(store_evict(s, 0), 0, "a referenced object was evicted");
    cr_assert(t_verify_obj(o, 1, 50000));
    store_obj_unref(s, o);
    cr_assert_eq(store_remove(s, &tk.k, false), KV_BUSY, "one reference is still out");
    cr_assert(t_verify_obj(o, 1, 50000));
    store_obj_unref(s, o);
    store_obj_unref(s, NULL);

    cr_assert_eq(store_remove(s, &tk.k, false), 0);
    cr_assert_eq(store_remove(s, &tk.k, false), KV_NOT_FOUND);
    cr_assert_eq(t_exists(s, 0, 1), 0);
    cr_assert_eq(t_stats(s).memory_used, 0);
    store_destroy(s);
}

/* A writer that drops its reference and then aborts gives back one reference too many. */
Test(store, reference_underflow_aborts, .signal = SIGABRT)
{
    struct store *s = t_store(1 * MiB, 1.0, 1.0);
    struct t_key tk;
    struct store_obj *o;

    cr_assert_eq(store_reserve(s, t_key(&tk, 0, 1), 100, &o), 0);
    store_obj_unref(s, o);
    store_abort(s, o);
}

Test(store, lease_blocks_remove_until_it_expires)
{
    struct store *s = t_store(1 * MiB, 1.0, 1.0);
    struct t_key tk;
    uint64_t size = 0;

    cr_assert_eq(t_put(s, 0, 1, 123), 0);
    cr_assert_eq(t_put(s, 0, 2, 10), 0);
    cr_assert_eq(store_lease(s, t_key(&tk, 0, 3), 1000, &size), KV_NOT_FOUND);

    cr_assert_eq(store_lease(s, t_key(&tk, 0, 1), 60000, &size), 0);
    cr_assert_eq(size, 123);
    cr_assert_eq(store_remove(s, &tk.k, false), KV_BUSY);
    cr_assert_eq(store_remove_all(s, 0, false, false), 1, "only the unleased object goes");
    cr_assert_eq(store_evict(s, 0), 0);
    cr_assert_eq(store_remove(s, &tk.k, true), 0, "force overrides a lease");

    /*
     * A 1 s lease, then a 1 ms one: 30 ms on, the first still holds (and a second of margin
     * keeps that true on a loaded machine). It ends by itself: the object is removable
     * no sooner than 1 s after the lease began, and (waited for, bounded) once it has.
     */
    cr_assert_eq(t_put(s, 0, 4, 10), 0);
    uint64_t t0 = clock_coarse_ms();    /* the store's clock */
    cr_assert_eq(store_lease(s, t_key(&tk, 0, 4), 1000, &size), 0);
    cr_assert_eq(store_lease(s, &tk.k, 1, &size), 0);
    t_sleep_ms(30);
    cr_assert_eq(store_remove(s, &tk.k, false), KV_BUSY, "a shorter lease shortened it");
    int rc;
    while ((rc = store_remove(s, &tk.k, false)) == KV_BUSY && clock_coarse_ms() - t0 < 10000) {
        t_sleep_ms(10);
    }
    cr_assert_eq(rc, 0, "the lease did not expire within 10 s");
    cr_assert_geq(clock_coarse_ms() - t0, 1000, "the 1 s lease ended after %llu ms",
                  (unsigned long long)(clock_coarse_ms() - t0));
    store_destroy(s);
}

/*
 * 16 MiB arena, 64 KiB objects: 200 fill 78%. After a pause the even ones
 * are touched through exists; then new objects push usage past the high
 * watermark. Every eviction must hit an untouched (odd) object.
 */
Test(store, eviction_is_near_lru)
{
    struct store *s = t_store(16 * MiB, 0.9, 0.8);
    struct store_stats st;
    uint64_t obj = 64 * KiB;
    uint64_t odd_gone = 0;
    uint64_t id = 1000;

    for (uint64_t i = 0; i < 200; i++) {
        cr_assert_eq(t_put(s, 0, i, obj), 0);
    }
    cr_assert_eq(t_stats(s).evictions, 0);
    t_sleep_ms(30);
    for (uint64_t i = 0; i < 200; i += 2) {
        cr_assert_eq(t_exists(s, 0, i), 1);
    }
    t_sleep_ms(30);
    while (t_stats(s).evictions < 80) {
        cr_assert_eq(t_put(s, 0, id++, obj), 0);
        cr_assert_leq(t_stats(s).memory_used, (uint64_t)(0.9 * 16 * MiB));
    }
    st = t_stats(s);
    for (uint64_t i = 0; i < 200; i++) {
        if (i % 2 == 0) {
            cr_assert_eq(t_exists(s, 0, i), 1, "touched object %llu was evicted",
                         (unsigned long long)i);
        } else {
            odd_gone += t_exists(s, 0, i) == 0;
        }
    }
    for (uint64_t i = 1000; i < id; i++) {
        cr_assert_eq(t_check(s, 0, i, obj), 1, "new object %llu was evicted",
                     (unsigned long long)i);
    }
    cr_assert_eq(odd_gone, st.evictions);
    cr_assert_eq(st.evicted_bytes, st.evictions * obj);
    /* Eviction went down to the low watermark less the incoming object. */
    cr_assert_leq(st.memory_used, (uint64_t)(0.9 * 16 * MiB));
    store_destroy(s);
}

/* A cluster cache copy (a key another node owns) is evicted before owned objects older than it. */
Test(store, eviction_takes_cache_copies_before_owned_objects)
{
    struct store *s = t_store(16 * MiB, 0.9, 0.8);
    uint64_t obj = 64 * KiB;
    uint64_t cache_gone = 0;
    uint64_t id = 1000;
    uint8_t *buf = malloc(obj);
    struct t_key tk;

    cr_assert_not_null(buf);
    for (uint64_t i = 0; i < 100; i++) {
        cr_assert_eq(t_put(s, 0, i, obj), 0);
    }
    for (uint64_t i = 100; i < 200; i++) {
        t_fill(buf, i, obj);
        cr_assert_eq(store_put_cache(s, t_key(&tk, 0, i), buf, obj), 0);
    }
    cr_assert_eq(store_set_cache(s, t_key(&tk, 0, 150), false), 0);  /* owned again */
    cr_assert_eq(store_set_cache(s, t_key(&tk, 0, 5000), true), KV_NOT_FOUND);
    while (t_stats(s).evictions < 40) {
        cr_assert_eq(t_put(s, 0, id++, obj), 0);
    }
    for (uint64_t i = 0; i < 100; i++) {
        cr_assert_eq(t_check(s, 0, i, obj), 1, "owned object %llu was evicted before cache copies",
                     (unsigned long long)i);
    }
    cr_assert_eq(t_check(s, 0, 150, obj), 1, "object 150, owned again, was evicted");
    for (uint64_t i = 100; i < 200; i++) {
        int c = t_check(s, 0, i, obj);

        cr_assert_neq(c, -1, "cache copy %llu has wrong bytes", (unsigned long long)i);
        cache_gone += c == 0;
    }
    cr_assert_eq(cache_gone, t_stats(s).evictions);
    free(buf);
    store_destroy(s);
}

/*
 * store_put_crc (what a node does with a value a peer sent): stored only when the bytes match
 * the checksum, at lengths on both sides of its 64 KiB chunks; a damaged value leaves the key
 * free; the checksum is kept on the object, and store_obj_crc of a plain put is the CRC-32C.
 */
Test(store, put_crc_keeps_only_values_that_match_their_checksum)
{
    static const uint64_t lens[] = {0, 1, 4095, 65535, 65536, 65537, 300001, 1048576};
    struct store *s = t_store(16 * MiB, 0.9, 0.8);
    uint8_t *buf = malloc(MiB);
    struct t_key tk;
    struct store_obj *o;

    cr_assert_not_null(buf);
    for (size_t i = 0; i < sizeof(lens) / sizeof(lens[0]); i++) {
        uint64_t len = lens[i];
        uint32_t crc;

        t_fill(buf, 100 + i, len);
        crc = crc32c_extend(0, buf, len);
        if (len > 0) {
            buf[len / 2] ^= 0x10;   /* damaged on the way */
            cr_assert_eq(store_put_crc(s, t_key(&tk, 0, 100 + i), buf, len, crc, false),
                         KV_CHECKSUM_MISMATCH, "len %llu", (unsigned long long)len);
            cr_assert_eq(t_check(s, 0, 100 + i, len), 0, "a damaged value was kept");
            buf[len / 2] ^= 0x10;
        }
        cr_assert_eq(store_put_crc(s, t_key(&tk, 0, 100 + i), buf, len, crc, i % 2 == 1), 0,
                     "len %llu", (unsigned long long)len);
        cr_assert_eq(t_check(s, 0, 100 + i, len), 1, "len %llu", (unsigned long long)len);
        cr_assert_eq(store_put_crc(s, t_key(&tk, 0, 100 + i), buf, len, crc, false), KV_EXISTS);
        cr_assert_eq(store_get(s, t_key(&tk, 0, 100 + i), &o), 0);
        cr_assert_eq(store_obj_crc(o), crc, "len %llu", (unsigned long long)len);
        store_obj_unref(s, o);

        /* a plain put: the checksum computed on first asking, the same on the second */
        cr_assert_eq(t_put(s, 1, 100 + i, len), 0);
        cr_assert_eq(store_get(s, t_key(&tk, 1, 100 + i), &o), 0);
        cr_assert_eq(store_obj_crc(o), crc);
        cr_assert_eq(store_obj_crc(o), crc);
        store_obj_unref(s, o);
    }
    free(buf);
    store_destroy(s);
}

Test(store, eviction_skips_referenced_reserved_leased_and_hard_pinned)
{
    struct store *s = t_store(4 * MiB, 0.9, 0.5);
    struct t_key tk;
    struct store_obj *reader;
    struct store_obj *writer;
    uint64_t obj = 32 * KiB;
    uint64_t size;

    /* The four oldest objects are the ones eviction must leave alone. */
    cr_assert_eq(t_put(s, 0, 1, obj), 0);
    cr_assert_eq(store_get(s, t_key(&tk, 0, 1), &reader), 0);
    cr_assert_eq(store_reserve(s, t_key(&tk, 0, 2), obj, &writer), 0);
    cr_assert_eq(t_put(s, 0, 3, obj), 0);
    cr_assert_eq(store_lease(s, t_key(&tk, 0, 3), 60000, &size), 0);
    cr_assert_eq(t_put(s, 0, 4, obj), 0);
    cr_assert_eq(store_pin(s, t_key(&tk, 0, 4), STORE_PIN_HARD), 0);
    t_sleep_ms(20);

    for (uint64_t i = 100; i < 500; i++) {
        cr_assert_eq(t_put(s, 0, i, obj), 0);
        cr_assert_leq(t_stats(s).memory_used, 4 * MiB);
    }
    cr_assert_gt(t_stats(s).evictions, 200);
    cr_assert_eq(t_check(s, 0, 1, obj), 1, "the referenced object was evicted");
    cr_assert_eq(t_check(s, 0, 3, obj), 1, "the leased object was evicted");
    cr_assert_eq(t_check(s, 0, 4, obj), 1, "the hard-pinned object was evicted");
    cr_assert_eq(t_stats(s).reserved, 1, "the reserved object was evicted");
    cr_assert_eq(t_stats(s).pinned_hard, 1);

    (void)store_evict(s, 0);
    cr_assert_eq(t_stats(s).objects, 3, "evict(0) leaves exactly the protected objects");
    cr_assert(t_verify_obj(reader, 1, obj));
    store_obj_unref(s, reader);

    {
        uint8_t buf[32 * KiB];

        t_fill(buf, 2, sizeof(buf));
        cr_assert_eq(store_obj_write(writer, 0, buf, sizeof(buf)), sizeof(buf));
        cr_assert_eq(store_commit(s, writer), 0);
        cr_assert_eq(t_check(s, 0, 2, obj), 1);
    }
    cr_assert_eq(store_pin(s, t_key(&tk, 0, 4), STORE_PIN_NONE), 0);
    cr_assert_eq(store_remove(s, t_key(&tk, 0, 3), true), 0);
    (void)store_evict(s, 0);
    cr_assert_eq(t_stats(s).objects, 0, "unpinned, unreferenced objects are evictable again");
    /* The forced remove took the leased key away, not its pages: a client may read them. */
    cr_assert_eq(t_stats(s).memory_used, obj, "a leased object's pages were freed early");
    store_destroy(s);
}

Test(store, soft_pinned_objects_go_only_after_all_others)
{
    struct store *s = t_store(4 * MiB, 1.0, 1.0);
    struct t_key tk;
    uint64_t obj = 32 * KiB;            /* 8 pages */
    uint64_t used;

    /* The soft-pinned objects are the oldest, so plain LRU would take them first. */
    for (uint64_t i = 0; i < 10; i++) {
        cr_assert_eq(t_put(s, 0, i, obj), 0);
        cr_assert_eq(store_pin(s, t_key(&tk, 0, i), STORE_PIN_SOFT), 0);
    }
    t_sleep_ms(20);
    for (uint64_t i = 100; i < 150; i++) {
        cr_assert_eq(t_put(s, 0, i, obj), 0);
    }
    cr_assert_eq(t_stats(s).pinned_soft, 10);

    used = t_stats(s).memory_used;
    cr_assert_eq(store_evict(s, used - 20 * obj), 20 * obj);
    for (uint64_t i = 0; i < 10; i++) {
        cr_assert_eq(t_exists(s, 0, i), 1, "soft-pinned %llu evicted before normal objects",
                     (unsigned long long)i);
    }
    /* All 30 normal objects left and 2 soft ones. */
    used = t_stats(s).memory_used;
    cr_assert_eq(store_evict(s, used - 32 * obj), 32 * obj);
    for (uint64_t i = 100; i < 150; i++) {
        cr_assert_eq(t_exists(s, 0, i), 0);
    }
    cr_assert_eq(t_stats(s).objects, 8);
    cr_assert_eq(t_stats(s).pinned_soft, 8);
    cr_assert_eq(t_stats(s).evictions, 52);
    store_destroy(s);
}

Test(store, no_space_when_everything_is_pinned)
{
    struct store *s = t_store(1 * MiB, 0.9, 0.8);
    struct t_key tk;
    uint64_t obj = 32 * KiB;

    for (uint64_t i = 0; i < 32; i++) {
        cr_assert_eq(t_put(s, 0, i, obj), 0, "put %llu", (unsigned long long)i);
        cr_assert_eq(store_pin(s, t_key(&tk, 0, i), STORE_PIN_HARD), 0);
    }
    cr_assert_eq(t_stats(s).memory_used, 1 * MiB);
    cr_assert_eq(t_put(s, 0, 100, 1), KV_NO_SPACE);
    cr_assert_eq(t_put(s, 0, 100, 0), 0, "an empty value needs no pages");
    cr_assert_eq(t_stats(s).no_space, 1);
    cr_assert_eq(t_stats(s).memory_used, 1 * MiB);
    for (uint64_t i = 0; i < 32; i++) {
        cr_assert_eq(t_check(s, 0, i, obj), 1);
    }

    /* Soft pins yield to a new object when nothing else can. */
    cr_assert_eq(store_pin(s, t_key(&tk, 0, 7), STORE_PIN_SOFT), 0);
    cr_assert_eq(t_put(s, 0, 101, obj), 0);
    cr_assert_eq(t_exists(s, 0, 7), 0);
    cr_assert_eq(t_stats(s).pinned_hard, 31);
    cr_assert_eq(t_stats(s).pinned_soft, 0);
    store_destroy(s);
}

Test(store, usage_stays_under_the_high_watermark)
{
    struct store *s = t_store(8 * MiB, 0.75, 0.5);
    uint64_t seed = 99;
    uint64_t high = (uint64_t)(0.75 * 8 * MiB);

    for (uint64_t i = 0; i < 3000; i++) {
        uint64_t len;

        seed = seed * 6364136223846793005ull + 1442695040888963407ull;
        len = (seed >> 33) % (96 * KiB);
        cr_assert_eq(t_put(s, 0, i, len), 0);
        cr_assert_leq(t_stats(s).memory_used, high, "usage passed the high watermark");
    }
    cr_assert_gt(t_stats(s).evictions, 0);
    store_destroy(s);
}

Test(store, stats_follow_objects)
{
    struct store *s = t_store(4 * MiB, 1.0, 1.0);
    struct store_stats st0 = t_stats(s);
    struct store_stats st;
    struct t_key tk;

    for (uint64_t i = 0; i < 1000; i++) {
        cr_assert_eq(t_put(s, 0, i, i), 0);
    }
    st = t_stats(s);
    cr_assert_eq(st.objects, 1000);
    cr_assert_eq(st.value_bytes, 999 * 1000 / 2);
    cr_assert_gt(st.metadata_bytes, st0.metadata_bytes + 1000 * 80);
    cr_assert_lt(st.metadata_bytes, st0.metadata_bytes + 1000 * 200,
                 "more than 200 bytes of metadata per small object");
    cr_assert_eq(store_pin(s, t_key(&tk, 0, 5), STORE_PIN_SOFT), 0);
    cr_assert_eq(store_pin(s, t_key(&tk, 0, 6), STORE_PIN_HARD), 0);
    cr_assert_eq(store_pin(s, t_key(&tk, 0, 6), STORE_PIN_HARD), 0);
    cr_assert_eq(store_pin(s, t_key(&tk, 0, 5000), STORE_PIN_HARD), KV_NOT_FOUND);
    st = t_stats(s);
    cr_assert_eq(st.pinned_soft, 1);
    cr_assert_eq(st.pinned_hard, 1);
    cr_assert_eq(store_remove(s, t_key(&tk, 0, 6), false), 0, "pins do not block remove");
    cr_assert_eq(store_remove_all(s, 0, true, false), 999);
    st = t_stats(s);
    cr_assert_eq(st.objects, 0);
    cr_assert_eq(st.value_bytes, 0);
    cr_assert_eq(st.pinned_soft, 0);
    cr_assert_eq(st.pinned_hard, 0);
    cr_assert_eq(st.memory_used, 0);
    cr_assert_geq(st.metadata_bytes, st0.metadata_bytes, "only the grown table stays");
    cr_assert_lt(st.metadata_bytes, st0.metadata_bytes + 64 * KiB);
    store_destroy(s);
}

Test(store, table_grows_without_losing_keys)
{
    struct store *s = t_store(1 * MiB, 1.0, 1.0);
    struct t_key tk;
    uint64_t size;

    /* Empty values take no pages, so the table grows far past its first size. */
    for (uint64_t i = 0; i < 200000; i++) {
        cr_assert_eq(t_put(s, i % 2, i, 0), 0);
        if (i % 1000 == 999) {
            /* Keys inserted before and during a grow stay findable. */
            cr_assert_eq(t_exists(s, 0, i / 2 & ~1ull), 1);
            cr_assert_eq(t_exists(s, 1, i | 1), 1);
        }
    }
    cr_assert_eq(t_stats(s).objects, 200000);
    for (uint64_t i = 0; i < 200000; i += 2) {
        cr_assert_eq(store_remove(s, t_key(&tk, 0, i), false), 0);
    }
    for (uint64_t i = 0; i < 200000; i++) {
        cr_assert_eq(store_size(s, t_key(&tk, i % 2, i), &size), i % 2 ? 0 : KV_NOT_FOUND,
                     "key %llu", (unsigned long long)i);
    }
    cr_assert_eq(t_put(s, 0, 200000, 5), 0);
    cr_assert_eq(store_remove_all(s, 1, false, false), 100000);
    cr_assert_eq(t_stats(s).objects, 1);
    cr_assert_eq(t_check(s, 0, 200000, 5), 1);
    store_destroy(s);
}

/* The batch probe answers exactly as store_exists, across tables that grow meanwhile. */
Test(store, exists_batch_answers_like_exists)
{
    enum { N = 3000 };
    struct store *s = t_store(1 * MiB, 1.0, 1.0);
    static struct t_key tk[N];
    static struct kv_key keys[N];
    static uint8_t out[N];
    struct store_obj *o;

    /* Present: even ids in tenant 0 (empty values take no pages). Absent: odd ids, and
     * the same bytes in tenant 1. One reserved key must read as absent. */
    for (uint64_t i = 0; i < N; i += 2) {
        cr_assert_eq(t_put(s, 0, i, 0), 0);
    }
    cr_assert_eq(store_reserve(s, t_key(&tk[0], 0, 1), 0, &o), 0);
    for (uint32_t round = 0; round < 2; round++) {
        for (uint64_t i = 0; i < N; i++) {
            keys[i] = *t_key(&tk[i], round, i);
        }
        memset(out, 0xee, sizeof(out));
        store_exists_batch(s, keys, N, out);
        for (uint64_t i = 0; i < N; i++) {
            cr_assert_eq(out[i], store_exists(s, &keys[i]), "key %llu tenant %u",
                         (unsigned long long)i, round);
            cr_assert_eq(out[i], round == 0 && i % 2 == 0, "key %llu tenant %u",
                         (unsigned long long)i, round);
        }
    }
    store_abort(s, o);
    store_exists_batch(s, keys, 0, out); /* an empty batch touches nothing */
    store_destroy(s);
}

/* Probes in batches refresh recency as single probes do. */
Test(store, exists_batch_refreshes_recency)
{
    struct store *s = t_store(16 * MiB, 0.9, 0.8);
    struct t_key tk[100];
    struct kv_key keys[100];
    uint8_t out[100];
    uint64_t id = 1000;

    for (uint64_t i = 0; i < 200; i++) {
        cr_assert_eq(t_put(s, 0, i, 64 * KiB), 0);
    }
    t_sleep_ms(30);
    for (uint64_t i = 0; i < 100; i++) {
        keys[i] = *t_key(&tk[i], 0, 2 * i); /* the even ones */
    }
    store_exists_batch(s, keys, 100, out);
    for (uint64_t i = 0; i < 100; i++) {
        cr_assert_eq(out[i], 1);
    }
    t_sleep_ms(30);
    while (t_stats(s).evictions < 80) {
        cr_assert_eq(t_put(s, 0, id++, 64 * KiB), 0);
    }
    for (uint64_t i = 0; i < 200; i += 2) {
        cr_assert_eq(t_exists(s, 0, i), 1, "probed object %llu was evicted",
                     (unsigned long long)i);
    }
    store_destroy(s);
}

Test(store, hash_spreads_keys_over_shards_and_buckets)
{
    enum { N = 65536 };
    static uint32_t shard[64];
    uint8_t *bucket = calloc(N, 1);
    uint64_t used = 0;
    struct t_key a;
    struct t_key b;
    uint8_t bytes[128];
    uint64_t seen[129];

    cr_assert_eq(store_hash64(t_key(&a, 0, 1)), store_hash64(t_key(&b, 0, 1)));
    cr_assert_neq(store_hash64(t_key(&a, 0, 1)), store_hash64(t_key(&b, 1, 1)), "tenant ignored");
    for (uint64_t i = 0; i < N; i++) {
        uint64_t h = store_hash64(t_key(&a, 0, i));

        shard[h >> 58]++;
        used += bucket[h & (N - 1)] == 0;
        bucket[h & (N - 1)] = 1;
    }
    for (int i = 0; i < 64; i++) {
        cr_assert(shard[i] > N / 64 * 8 / 10 && shard[i] < N / 64 * 12 / 10,
                  "shard %d got %u of %d keys", i, shard[i], N);
    }
    /* A random function fills 1 - 1/e of the buckets: 41427 of 65536. */
    cr_assert(used > 40800 && used < 42000, "%llu buckets used", (unsigned long long)used);
    free(bucket);

    /* Every prefix length hashes apart, zero bytes included (tail padding). */
    memset(bytes, 0, sizeof(bytes));
    for (uint32_t len = 0; len <= 128; len++) {
        struct kv_key k = { 0, len, bytes };

        seen[len] = store_hash64(&k);
        for (uint32_t j = 0; j < len; j++) {
            cr_assert_neq(seen[j], seen[len], "lengths %u and %u collide", j, len);
        }
    }
}

/* ---- threads ---- */

#define T_KEYS 1024u  /* about 16 MiB of values: a bit more than fits */

struct t_worker {
    struct store *s;
    uint64_t seed;
    uint64_t gets;
    uint64_t bad;
    int iterations;
};

static uint64_t
t_next(uint64_t *st)
{
    *st ^= *st >> 12;
    *st ^= *st << 25;
    *st ^= *st >> 27;
    return *st * 0x2545f4914f6cdd1dull;
}

/* Value length is a function of the key, so a reader knows what to expect. */
static uint64_t
t_len_of(uint64_t id)
{
    return (id * 2654435761u) % (32 * KiB);
}

static void *
t_worker_run(void *arg)
{
    struct t_worker *w = arg;
    uint8_t *buf = malloc(32 * KiB);

    for (int iter = 0; iter < w->iterations; iter++) {
        uint64_t r = t_next(&w->seed);
        uint64_t id = (r >> 8) % T_KEYS;
        uint32_t tenant = (uint32_t)(id % 3);
        uint64_t len = t_len_of(id);
        uint64_t op = r & 0xff;
        struct t_key tk;
        struct store_obj *o;
        int rc;

        t_key(&tk, tenant, id);
        if (op < 100) {
            rc = t_check(w->s, tenant, id, len);
            w->gets += rc == 1;
            w->bad += rc < 0;
        } else if (op < 170) {
            rc = t_put(w->s, tenant, id, len);
            w->bad += rc != 0 && rc != KV_EXISTS && rc != KV_BUSY && rc != KV_NO_SPACE;
        } else if (op < 190) {
            rc = store_remove(w->s, &tk.k, (op & 1) != 0);
            w->bad += rc != 0 && rc != KV_NOT_FOUND && rc != KV_BUSY;
        } else if (op < 205) {
            (void)store_exists(w->s, &tk.k);
        } else if (op < 225) {
            /* A writer in chunks that sometimes gives up half way. */
            rc = store_reserve(w->s, &tk.k, len, &o);
            if (rc == 0) {
                t_fill(buf, id, len);
                for (uint64_t off = 0; off < len; off += 5000) {
                    uint64_t chunk = len - off < 5000 ? len - off : 5000;

                    w->bad += store_obj_write(o, off, buf + off, chunk) != chunk;
                    if (op == 224) {
                        break;
                    }
                }
                if (op == 224) {
                    store_abort(w->s, o);
                } else {
                    w->bad += store_commit(w->s, o) != 0;
                }
            }
        } else if (op < 235) {
            uint64_t size;

            if (store_lease(w->s, &tk.k, 2, &size) == 0) {
                w->bad += size != len;
            }
        } else if (op < 245) {
            (void)store_pin(w->s, &tk.k, (enum store_pin)(op % 3));
        } else if (op < 255) {
            (void)store_pin(w->s, &tk.k, STORE_PIN_NONE);
        } else {
            struct store_stats st;

            store_stats(w->s, &st);
            w->bad += st.memory_used > st.memory_capacity;
            (void)store_evict(w->s, st.memory_used / 4 * 3);
        }
    }
    free(buf);
    return NULL;
}

Test(store, threads_read_back_exactly_what_was_written, .timeout = 60)
{
    struct store *s = t_store(16 * MiB, 0.9, 0.7);
    struct t_worker w[4];
    pthread_t tid[4];
    struct store_stats st;
    uint64_t gets = 0;

    for (int i = 0; i < 4; i++) {
        memset(&w[i], 0, sizeof(w[i]));
        w[i].s = s;
        w[i].seed = 0x9e3779b97f4a7c15ull * (uint64_t)(i + 1);
        w[i].iterations = 40000;
        cr_assert_eq(pthread_create(&tid[i], NULL, t_worker_run, &w[i]), 0);
    }
    for (int i = 0; i < 4; i++) {
        pthread_join(tid[i], NULL);
        cr_assert_eq(w[i].bad, 0, "thread %d saw %llu wrong answers", i,
                     (unsigned long long)w[i].bad);
        gets += w[i].gets;
    }
    st = t_stats(s);
    cr_log_info("stress: %llu verified gets, %llu evictions, %llu objects left",
                (unsigned long long)gets, (unsigned long long)st.evictions,
                (unsigned long long)st.objects);
    cr_assert_gt(gets, 1000, "too few gets found their object to mean anything");
    cr_assert_gt(st.evictions, 0);
    cr_assert_eq(st.reserved, 0);

    /*
     * Everything still indexed reads back right, and then all memory comes back,
     * once the workers' 2 ms leases have ended (a forced remove of a leased object
     * keeps its pages until then).
     */
    nanosleep(&(struct timespec){0, 20 * 1000 * 1000}, NULL);
    for (uint64_t id = 0; id < T_KEYS; id++) {
        cr_assert_neq(t_check(s, (uint32_t)(id % 3), id, t_len_of(id)), -1);
    }
    for (uint64_t id = 0; id < T_KEYS; id++) {
        struct t_key tk;

        (void)store_pin(s, t_key(&tk, (uint32_t)(id % 3), id), STORE_PIN_NONE);
    }
    cr_assert_eq(store_remove_all(s, 0, true, true), st.objects);
    st = t_stats(s);
    cr_assert_eq(st.objects, 0);
    cr_assert_eq(st.memory_used, 0);
    cr_assert_eq(st.value_bytes, 0);
    store_destroy(s);
}
