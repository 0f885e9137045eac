/*
 * test_store_tier: the store's side of the SSD tier, driven by a fake tier
 * whose hooks only queue objects on arrays; the test then plays the tier
 * (writes an object by reporting it stored at a made-up location, loads one
 * by filling the pages store_load_begin hands out). Covered: on-evict
 * offload instead of dropping, -EAGAIN while offloads are pending, drops
 * (counted) once the offload queue holds its bound, copies moved by compaction, stored
 * objects that stay indexed without pages, loads started once and served
 * byte-exact, unreadable copies dropped, write-through at commit, forget on
 * remove, insert/drop of stored objects, the degraded mode, store_sync and
 * store_offload_cold. No disk, no threads; arenas of at most 4 MiB.
 */
#include <criterion/criterion.h>

#include "kverr.h"
#include "store.h"
#include "store_keys.h"

#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/uio.h>
#include <time.h>

#define KiB 1024ull
#define MiB (1024ull * 1024ull)
#define T_QUEUE_MAX 4096
#define T_FORGET_MAX 64

static struct store *
t_store(uint64_t memory, double high, double low)
{
    struct store_config cfg = {
        .memory_size = memory,
        .max_key_size = 32,
        .max_value_size = memory,
        .high_watermark = high,
        .low_watermark = low,
    };
    struct store *s = NULL;

    cr_assert_eq(store_create(&cfg, &s), 0);
    cr_assert_not_null(s);
    return s;
}

static int
t_put(struct store *s, uint64_t id, uint64_t len)
{
    struct t_key tk;
    uint8_t *buf = malloc(len + 1);
    int rc;

    cr_assert_not_null(buf);
    for (uint64_t i = 0; i < len; i++) {
        buf[i] = t_byte(id, i);
    }
    rc = store_put(s, t_key(&tk, 0, id), buf, len);
    free(buf);
    return rc;
}

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
    if (n < 0) {
        return 0;
    }
    for (int i = 0; i < n; i++) {
        const uint8_t *p = iov[i].iov_base;

        for (size_t j = 0; j < iov[i].iov_len; j++) {
            if (p[j] != t_byte(id, at + j)) {
                return 0;
            }
        }
        at += iov[i].iov_len;
    }
    return at == len;
}

/* t_check: get + verify + unref. 1 = found and exact, -1 = wrong bytes, else the get status. */
static int
t_check(struct store *s, uint64_t id, uint64_t len)
{
    struct t_key tk;
    struct store_obj *o;
    int rc = store_get(s, t_key(&tk, 0, id), &o);
    int ok;

    if (rc != 0) {
        cr_assert_null(o);
        return rc;
    }
    ok = t_verify_obj(o, id, len) ? 1 : -1;
    store_obj_unref(s, o);
    return ok;
}

static int
t_exists(struct store *s, uint64_t id)
{
    struct t_key tk;

    return store_exists(s, t_key(&tk, 0, id));
}

static struct store_stats
t_stats(struct store *s)
{
    struct store_stats st;

    store_stats(s, &st);
    return st;
}

static void
t_sleep_ms(long ms)
{
    struct timespec ts = { ms / 1000, (ms % 1000) * 1000000L };

    nanosleep(&ts, NULL);
}

/* t_obj_id: the id in an object's "key-<id>" key. */
static uint64_t
t_obj_id(const struct store_obj *o)
{
    struct kv_key k;
    char buf[48];

    store_obj_key(o, &k);
    cr_assert(k.len > 4 && k.len < sizeof(buf));
    memcpy(buf, k.ptr, k.len);
    buf[k.len] = '\0';
    cr_assert_eq(strncmp(buf, "key-", 4), 0);
    return strtoull(buf + 4, NULL, 10);
}

/* The location the fake tier "writes" object id at. */
static struct store_loc
t_loc(uint64_t id)
{
    struct store_loc loc = {
        .bucket = (uint32_t)(1 + id % 5),
        .crc = (uint32_t)(id * 2654435761u),
        .offset = id * 64 * KiB,
    };

    return loc;
}

static int
t_loc_eq(const struct store_loc *a, const struct store_loc *b)
{
    return a->bucket == b->bucket && a->crc == b->crc && a->offset == b->offset;
}

/* ---- the fake tier ---- */

struct t_forget {
    uint32_t tenant;
    uint32_t key_len;
    char key[48];
    struct store_loc loc;
    uint64_t size;
};

struct t_tier {
    struct store_obj *offload[T_QUEUE_MAX];  /* pending: offload[off_head..off_n) */
    size_t off_head;
    size_t off_n;
    uint64_t offload_calls;
    struct store_obj *load[T_QUEUE_MAX];     /* pending: load[load_head..load_n) */
    size_t load_head;
    size_t load_n;
    uint64_t load_calls;
    struct t_forget forget[T_FORGET_MAX];
    size_t nforget;
};

/* Hooks: called under a shard lock; they only queue, as the contract says. */
static void
t_hook_offload(void *arg, struct store_obj *o)
{
    struct t_tier *t = arg;

    t->offload_calls++;
    if (t->off_n < T_QUEUE_MAX) {
        t->offload[t->off_n++] = o;
    } else {
        abort();
    }
}

static void
t_hook_load(void *arg, struct store_obj *o)
{
    struct t_tier *t = arg;

    t->load_calls++;
    if (t->load_n < T_QUEUE_MAX) {
        t->load[t->load_n++] = o;
    } else {
        abort();
    }
}

static void
t_hook_forget(void *arg, const struct kv_key *key, const struct store_loc *loc, uint64_t size)
{
    struct t_tier *t = arg;
    struct t_forget *f;

    if (t->nforget >= T_FORGET_MAX || key->len >= sizeof(f->key)) {
        abort();
    }
    f = &t->forget[t->nforget++];
    f->tenant = key->tenant;
    f->key_len = key->len;
    memcpy(f->key, key->ptr, key->len);
    f->key[key->len] = '\0';
    f->loc = *loc;
    f->size = size;
}

/* t_tier_attach_max: the fake tier's hooks on s; max bounds the offload queue (0: no bound). */
static struct t_tier *
t_tier_attach_max(struct store *s, bool write_through, bool on_evict, bool promote, uint64_t max)
{
    struct t_tier *t = calloc(1, sizeof(*t));
    struct store_tier hooks = {
        .offload = t_hook_offload,
        .load = t_hook_load,
        .forget = t_hook_forget,
        .write_through = write_through,
        .on_evict = on_evict,
        .promote = promote,
        .offload_max = max,
    };

    cr_assert_not_null(t);
    hooks.arg = t;
    store_set_tier(s, &hooks);
    cr_assert(store_has_tier(s));
    return t;
}

static struct t_tier *
t_tier_attach(struct store *s, bool write_through, bool on_evict, bool promote)
{
    return t_tier_attach_max(s, write_through, on_evict, promote, 0);
}

/* t_tier_attach_bounded: on-evict, with an offload queue bound of max bytes. */
static struct t_tier *
t_tier_attach_bounded(struct store *s, uint64_t max)
{
    return t_tier_attach_max(s, false, true, true, max);
}

static size_t
t_pending_offloads(const struct t_tier *t)
{
    return t->off_n - t->off_head;
}

static struct store_obj *
t_next_offload(struct t_tier *t)
{
    return t->off_head < t->off_n ? t->offload[t->off_head++] : NULL;
}

static struct store_obj *
t_next_load(struct t_tier *t)
{
    return t->load_head < t->load_n ? t->load[t->load_head++] : NULL;
}

/* t_offload_pending_has: whether object id waits in the offload queue. */
static int
t_offload_pending_has(const struct t_tier *t, uint64_t id)
{
    for (size_t i = t->off_head; i < t->off_n; i++) {
        if (t_obj_id(t->offload[i]) == id) {
            return 1;
        }
    }
    return 0;
}

/* t_write: the tier wrote o at t_loc(id): report it and give the hook's reference back. */
static int
t_write(struct store *s, struct store_obj *o)
{
    struct store_loc loc = t_loc(t_obj_id(o));
    int rc = store_obj_stored(s, o, &loc);

    store_obj_unref(s, o);
    return rc;
}

/* t_write_all: write every pending offload. Returns how many. */
static size_t
t_write_all(struct store *s, struct t_tier *t)
{
    struct store_obj *o;
    size_t n = 0;

    while ((o = t_next_offload(t)) != NULL) {
        struct store_loc loc = t_loc(t_obj_id(o));

        cr_assert_eq(store_obj_ssd_state(o), STORE_SSD_QUEUED);
        cr_assert_eq(store_obj_stored(s, o, &loc), 0);
        cr_assert_eq(store_obj_ssd_state(o), STORE_SSD_STORED);
        store_obj_unref(s, o);
        n++;
    }
    return n;
}

/*
 * t_load: the tier reads o (a load hook reference) back: the pages must be
 * page aligned and cover the size rounded up to a page; the value bytes of
 * id go in, the padding gets junk; then store_load_end(0).
 */
static void
t_load(struct store *s, struct store_obj *o, uint64_t id)
{
    struct iovec iov[STORE_MAX_EXTENTS];
    uint64_t size = store_obj_size(o);
    uint64_t want = (size + STORE_PAGE_SIZE - 1) / STORE_PAGE_SIZE * STORE_PAGE_SIZE;
    uint64_t at = 0;
    int n = -1;

    cr_assert_eq(store_load_begin(s, o, iov, STORE_MAX_EXTENTS, &n), 0);
    cr_assert(n >= (size > 0) && n <= STORE_MAX_EXTENTS, "n = %d", n);
    for (int i = 0; i < n; i++) {
        uint8_t *p = iov[i].iov_base;

        cr_assert_eq((uintptr_t)p % STORE_PAGE_SIZE, 0, "iov %d not page aligned", i);
        cr_assert_eq(iov[i].iov_len % STORE_PAGE_SIZE, 0, "iov %d not whole pages", i);
        cr_assert_gt(iov[i].iov_len, 0);
        for (size_t j = 0; j < iov[i].iov_len; j++) {
            p[j] = at + j < size ? t_byte(id, at + j) : 0xEE;
        }
        at += iov[i].iov_len;
    }
    cr_assert_eq(at, want, "load pages cover %llu bytes, want %llu", (unsigned long long)at,
                 (unsigned long long)want);
    cr_assert_eq(store_load_end(s, o, 0), 0);
}

/* t_tier_detach: give back every reference the fake tier still holds, detach, free. */
static void
t_tier_detach(struct store *s, struct t_tier *t)
{
    struct store_obj *o;

    while ((o = t_next_load(t)) != NULL) {
        (void)store_load_end(s, o, KV_NO_SPACE);
    }
    while ((o = t_next_offload(t)) != NULL) {
        store_obj_store_failed(s, o);
    }
    store_set_tier(s, NULL);
    free(t);
}

/* ---- (a) on-evict offload ---- */

/*
 * 1 MiB arena (256 pages), high 0.9 (230 pages), low 0.5; 64 KiB objects
 * (16 pages): 14 fit under the high watermark. Past it, eviction must queue
 * objects for the tier instead of dropping them, keep their pages intact,
 * and answer -EAGAIN (not NO_SPACE) when the arena is full of them. Once the
 * tier has stored them, eviction frees pages but keeps them indexed.
 */
Test(store_tier, on_evict_queues_instead_of_dropping_until_stored)
{
    struct store *s = t_store(1 * MiB, 0.9, 0.5);
    struct t_tier *t = t_tier_attach(s, false, true, true);
    struct store_stats st;
    uint64_t obj = 64 * KiB;
    uint64_t id;
    int rc = 0;

    for (id = 0; id < 14; id++) {
        cr_assert_eq(t_put(s, id, obj), 0);
    }
    cr_assert_eq(t->offload_calls, 0, "nothing is offloaded under the high watermark");

    /* Past the high watermark: puts go on while the arena has room, then -EAGAIN. */
    for (; id < 40 && (rc = t_put(s, id, obj)) == 0; id++) {
    }
    cr_assert_eq(rc, -EAGAIN, "a reserve waiting for offloads answered %d", rc);
    cr_assert_gt(id, 14, "the arena had room past the high watermark");
    cr_assert_gt(t->offload_calls, 0);
    st = t_stats(s);
    cr_assert_eq(st.evictions, 0, "objects without an SSD copy were evicted");
    cr_assert_eq(st.no_space, 0, "-EAGAIN counted as NO_SPACE");
    cr_assert_eq(st.objects, id);
    cr_assert_eq(st.resident, id);
    cr_assert_eq(st.stored, 0);
    cr_assert_eq(st.memory_used, 1 * MiB);
    cr_assert_eq(st.offloading, t_pending_offloads(t));
    cr_assert_eq(st.offloading, t->offload_calls, "an object was queued twice");
    for (uint64_t i = 0; i < 4; i++) {
        cr_assert(t_offload_pending_has(t, i), "cold object %llu not queued",
                  (unsigned long long)i);
    }
    for (size_t i = t->off_head; i < t->off_n; i++) {
        cr_assert_eq(store_obj_ssd_state(t->offload[i]), STORE_SSD_QUEUED);
    }
    /* Their pages were not reused: every value reads back exact, and a retry still waits. */
    for (uint64_t i = 0; i < id; i++) {
        cr_assert_eq(t_check(s, i, obj), 1, "object %llu damaged while queued",
                     (unsigned long long)i);
    }
    cr_assert_eq(t_put(s, id, obj), -EAGAIN);
    cr_assert_eq(store_evict(s, 0), 0, "queued objects were evicted");
    cr_assert_eq(t_stats(s).objects, id);

    /* The tier writes them; the retry now evicts stored objects' pages only. */
    cr_assert_eq(t_write_all(s, t), id);
    st = t_stats(s);
    cr_assert_eq(st.offloading, 0);
    cr_assert_eq(st.stored, id);
    cr_assert_eq(t_put(s, id, obj), 0);
    id++;
    st = t_stats(s);
    cr_assert_gt(st.evictions, 0);
    cr_assert_eq(st.evicted_bytes, st.evictions * obj);
    cr_assert_leq(st.memory_used, 512 * KiB, "eviction did not go down to the low watermark");
    cr_assert_eq(st.objects, id, "evicted stored objects left the table");
    cr_assert_eq(st.stored, id - 1);
    cr_assert_eq(st.resident, id - st.evictions);
    cr_assert_eq(st.resident_bytes, st.resident * obj);
    cr_assert_eq(st.memory_used, st.resident * obj);
    cr_assert_eq(st.value_bytes, id * obj);
    for (uint64_t i = 0; i < id; i++) {
        struct t_key tk;
        uint64_t size = 0;

        cr_assert_eq(t_exists(s, i), 1, "object %llu is gone", (unsigned long long)i);
        cr_assert_eq(store_size(s, t_key(&tk, 0, i), &size), 0);
        cr_assert_eq(size, obj);
    }
    cr_assert_eq(t->load_calls, 0, "exists/size started a load");
    t_tier_detach(s, t);
    store_destroy(s);
}

/*
 * A tier that writes nothing while DRAM fills (a disk far slower than puts): once the
 * queue holds its bound, eviction lets the coldest unwritten objects go instead of waiting,
 * and counts them. Puts never wait; the queue never passes its bound by more than one object.
 */
Test(store_tier, on_evict_past_the_queue_bound_drops_uncopied_and_counts)
{
    struct store *s = t_store(1 * MiB, 0.9, 0.5);
    struct t_tier *t = t_tier_attach_bounded(s, 128 * KiB);
    struct store_stats st;
    uint64_t obj = 64 * KiB;
    uint64_t present = 0;

    for (uint64_t id = 0; id < 200; id++) {
        cr_assert_eq(t_put(s, id, obj), 0, "put %llu waited or failed", (unsigned long long)id);
        st = t_stats(s);
        cr_assert_leq(st.offload_bytes, 128 * KiB + obj, "queue past its bound");
        cr_assert_eq(st.offload_bytes, t_pending_offloads(t) * obj);
    }
    st = t_stats(s);
    cr_assert_gt(st.offload_dropped, 0);
    cr_assert_eq(st.offload_dropped + st.objects, 200, "a drop went uncounted or twice");
    cr_assert_eq(st.stored, 0);
    for (uint64_t id = 0; id < 200; id++) {
        if (t_exists(s, id) == 1) {
            cr_assert_eq(t_check(s, id, obj), 1, "object %llu damaged", (unsigned long long)id);
            present++;
        }
    }
    cr_assert_eq(present, st.objects);
    cr_assert_eq(t_exists(s, 199), 1, "the newest object was dropped");
    /* Offloads of eviction are not durable puts' (the tier's admission may refuse them). */
    for (size_t i = t->off_head; i < t->off_n; i++) {
        cr_assert_not(store_obj_must_write(t->offload[i]), "an evicted object claims a waiter");
    }
    /* The queued ones are the oldest still there; writing them stores them. */
    cr_assert_eq(t_write_all(s, t), st.offloading);
    cr_assert_eq(t_stats(s).offload_bytes, 0);
    t_tier_detach(s, t);
    store_destroy(s);
}

/* Compaction moves a copy: the store follows it, and a move from a stale place is refused. */
Test(store_tier, move_stored_follows_a_copy_and_refuses_a_stale_one)
{
    struct store *s = t_store(1 * MiB, 0.9, 0.5);
    struct t_tier *t = t_tier_attach(s, false, true, true);
    struct store_loc a = t_loc(1);
    struct store_loc b = t_loc(2);
    struct store_loc got;
    struct store_obj *o;
    struct t_key tk;

    cr_assert_eq(store_insert_stored(s, t_key(&tk, 0, 1), 4096, &a), 0);
    cr_assert_eq(store_move_stored(s, t_key(&tk, 0, 1), &a, &b), 0);
    cr_assert_eq(store_move_stored(s, t_key(&tk, 0, 1), &a, &b), KV_NOT_FOUND);
    cr_assert_eq(store_move_stored(s, t_key(&tk, 0, 9), &a, &b), KV_NOT_FOUND);
    cr_assert_eq(store_get(s, t_key(&tk, 0, 1), &o), -EAGAIN);     /* a load starts */
    cr_assert_eq(t->load_calls, 1);
    store_stored_loc(s, t->load[0], &got);
    cr_assert(t_loc_eq(&got, &b), "the load reads the old place");
    cr_assert_eq(store_drop_stored(s, t_key(&tk, 0, 1), &a), 0, "a stale drop took it");
    cr_assert_eq(t_exists(s, 1), 1);
    t_load(s, t_next_load(t), 1);
    cr_assert_eq(t_check(s, 1, 4096), 1);
    t_tier_detach(s, t);
    store_destroy(s);
}

/* ---- (b) loads ---- */

Test(store_tier, get_of_ssd_only_object_loads_it_once_then_serves_exact_bytes)
{
    struct store *s = t_store(1 * MiB, 0.9, 0.5);
    struct t_tier *t = t_tier_attach(s, false, true, true);
    struct store_loc loc = { .bucket = 3, .crc = 0xabcdef01u, .offset = 8192 };
    struct store_loc got;
    struct store_stats st;
    struct store_obj *o;
    struct t_key tk;
    uint64_t len = 50000;       /* 13 pages, the last one partly */
    uint64_t size = 0;

    cr_assert_eq(store_insert_stored(s, t_key(&tk, 0, 7), len, &loc), 0);
    st = t_stats(s);
    cr_assert_eq(st.objects, 1);
    cr_assert_eq(st.stored, 1);
    cr_assert_eq(st.resident, 0);
    cr_assert_eq(st.value_bytes, len);
    cr_assert_eq(st.memory_used, 0);
    cr_assert_eq(t_exists(s, 7), 1);
    cr_assert_eq(store_size(s, t_key(&tk, 0, 7), &size), 0);
    cr_assert_eq(size, len);

    for (int i = 0; i < 5; i++) {
        o = (struct store_obj *)(void *)&tk;    /* any non-NULL value: get must reset it */
        cr_assert_eq(store_get(s, t_key(&tk, 0, 7), &o), -EAGAIN);
        cr_assert_null(o);
    }
    cr_assert_eq(t->load_calls, 1, "repeated gets started %llu loads",
                 (unsigned long long)t->load_calls);
    cr_assert_eq(t_stats(s).loading, 1);
    o = t_next_load(t);
    cr_assert_eq(t_obj_id(o), 7);
    cr_assert_eq(store_obj_size(o), len);
    cr_assert_eq(store_obj_ssd_state(o), STORE_SSD_STORED);
    store_obj_loc(o, &got);
    cr_assert(t_loc_eq(&got, &loc));

    t_load(s, o, 7);
    st = t_stats(s);
    cr_assert_eq(st.loading, 0);
    cr_assert_eq(st.resident, 1);
    cr_assert_eq(st.resident_bytes, len);
    cr_assert_eq(st.stored, 1);
    cr_assert_eq(st.memory_used, 13 * STORE_PAGE_SIZE);
    cr_assert_eq(t_check(s, 7, len), 1, "the loaded value is not the one written");
    cr_assert_eq(t->load_calls, 1);

    /* A loaded object keeps its copy: evicting it again needs no offload. */
    cr_assert_eq(store_evict(s, 0), 13 * STORE_PAGE_SIZE);
    cr_assert_eq(t->offload_calls, 0);
    cr_assert_eq(t_exists(s, 7), 1);
    cr_assert_eq(t_stats(s).resident, 0);
    cr_assert_eq(t_stats(s).memory_used, 0);
    cr_assert_eq(t_check(s, 7, len), -EAGAIN);
    cr_assert_eq(t->load_calls, 2);
    t_tier_detach(s, t);
    store_destroy(s);
}

/* ---- (c) unreadable copies, failed loads ---- */

Test(store_tier, checksum_mismatch_on_load_removes_the_object)
{
    struct store *s = t_store(1 * MiB, 0.9, 0.5);
    struct t_tier *t = t_tier_attach(s, false, true, true);
    struct store_loc loc = t_loc(1);
    struct iovec iov[STORE_MAX_EXTENTS];
    struct store_stats st;
    struct store_obj *o;
    struct t_key tk;
    uint64_t size;
    int n;

    cr_assert_eq(store_insert_stored(s, t_key(&tk, 0, 1), 10000, &loc), 0);
    cr_assert_eq(t_check(s, 1, 10000), -EAGAIN);
    o = t_next_load(t);
    cr_assert_not_null(o);
    cr_assert_eq(store_load_begin(s, o, iov, STORE_MAX_EXTENTS, &n), 0);
    memset(iov[0].iov_base, 0x5a, iov[0].iov_len);
    cr_assert_eq(store_load_end(s, o, KV_CHECKSUM_MISMATCH), 1,
                 "the tier was not told to drop its entry");

    cr_assert_eq(t_check(s, 1, 10000), KV_NOT_FOUND);
    cr_assert_eq(t_exists(s, 1), 0);
    cr_assert_eq(store_size(s, t_key(&tk, 0, 1), &size), KV_NOT_FOUND);
    cr_assert_eq(t->load_calls, 1);
    st = t_stats(s);
    cr_assert_eq(st.objects, 0);
    cr_assert_eq(st.stored, 0);
    cr_assert_eq(st.loading, 0);
    cr_assert_eq(st.value_bytes, 0);
    cr_assert_eq(st.memory_used, 0, "the load's pages were not returned");
    /* The key is free again. */
    cr_assert_eq(t_put(s, 1, 100), 0);
    cr_assert_eq(t_check(s, 1, 100), 1);
    t_tier_detach(s, t);
    store_destroy(s);
}

Test(store_tier, failed_load_keeps_the_object_for_a_retry)
{
    struct store *s = t_store(1 * MiB, 0.9, 0.5);
    struct t_tier *t = t_tier_attach(s, false, true, true);
    struct store_loc loc = t_loc(2);
    struct iovec iov[STORE_MAX_EXTENTS];
    struct store_obj *o;
    struct t_key tk;
    int n;

    cr_assert_eq(store_insert_stored(s, t_key(&tk, 0, 2), 9000, &loc), 0);
    cr_assert_eq(t_check(s, 2, 9000), -EAGAIN);
    o = t_next_load(t);
    cr_assert_eq(store_load_begin(s, o, iov, STORE_MAX_EXTENTS, &n), 0);
    cr_assert_eq(t_stats(s).memory_used, 3 * STORE_PAGE_SIZE);
    cr_assert_eq(store_load_end(s, o, -EIO), 0);
    cr_assert_eq(t_stats(s).memory_used, 0);
    cr_assert_eq(t_stats(s).loading, 0);
    cr_assert_eq(t_stats(s).stored, 1);
    cr_assert_eq(t_exists(s, 2), 1);

    /* The next get starts a new load, which succeeds. */
    cr_assert_eq(t_check(s, 2, 9000), -EAGAIN);
    cr_assert_eq(t->load_calls, 2);
    t_load(s, t_next_load(t), 2);
    cr_assert_eq(t_check(s, 2, 9000), 1);
    t_tier_detach(s, t);
    store_destroy(s);
}

/* ---- (d) write-through ---- */

Test(store_tier, write_through_queues_at_commit)
{
    struct store *s = t_store(1 * MiB, 0.9, 0.5);
    struct t_tier *t = t_tier_attach(s, true, false, true);
    struct store_obj *w;
    struct store_obj *o;
    struct store_loc want = t_loc(1);
    struct store_loc got;
    struct t_key tk;
    uint8_t buf[20000];

    cr_assert_eq(store_reserve(s, t_key(&tk, 0, 1), sizeof(buf), &w), 0);
    cr_assert_eq(t->offload_calls, 0, "a reserved object was offloaded");
    for (size_t i = 0; i < sizeof(buf); i++) {
        buf[i] = t_byte(1, i);
    }
    cr_assert_eq(store_obj_write(w, 0, buf, sizeof(buf)), sizeof(buf));
    cr_assert_eq(store_commit(s, w), 0);
    cr_assert_eq(t->offload_calls, 1, "commit did not queue the object");
    o = t->offload[0];
    cr_assert_eq(o, w);
    cr_assert_eq(store_obj_ssd_state(o), STORE_SSD_QUEUED);
    cr_assert_eq(t_stats(s).offloading, 1);
    cr_assert_eq(t_stats(s).stored, 0);
    cr_assert_eq(t_check(s, 1, sizeof(buf)), 1, "DRAM does not serve a queued object");

    cr_assert_eq(t_write(s, t_next_offload(t)), 0);
    cr_assert_eq(store_obj_ssd_state(o), STORE_SSD_STORED);
    store_obj_loc(o, &got);
    cr_assert(t_loc_eq(&got, &want));
    cr_assert_eq(t_stats(s).offloading, 0);
    cr_assert_eq(t_stats(s).stored, 1);

    cr_assert_eq(t_put(s, 2, 0), 0);
    cr_assert_eq(t->offload_calls, 2, "every commit is offloaded, empty values too");
    t_tier_detach(s, t);
    store_destroy(s);
}

/* ---- (e) forget on remove ---- */

Test(store_tier, remove_of_a_stored_object_calls_forget)
{
    struct store *s = t_store(1 * MiB, 0.9, 0.5);
    struct t_tier *t = t_tier_attach(s, false, true, true);
    struct store_loc loc1 = t_loc(1);
    struct store_loc loc3 = t_loc(3);
    struct store_obj *o;
    struct t_key tk;

    /* A resident object with a copy. */
    cr_assert_eq(store_put(s, t_key(&tk, 9, 1), "hello", 5), 0);
    cr_assert_eq(store_get(s, t_key(&tk, 9, 1), &o), 0);
    cr_assert_eq(store_sync(s, o), 0);
    store_obj_unref(s, o);
    cr_assert_eq(t_write(s, t_next_offload(t)), 0);
    cr_assert_eq(t->nforget, 0);
    cr_assert_eq(store_remove(s, t_key(&tk, 9, 1), false), 0);
    cr_assert_eq(t->nforget, 1, "remove of a stored object did not call forget");
    cr_assert_eq(t->forget[0].tenant, 9);
    cr_assert_eq(t->forget[0].key_len, 5);
    cr_assert_str_eq(t->forget[0].key, "key-1");
    cr_assert(t_loc_eq(&t->forget[0].loc, &loc1), "forget got another location");
    cr_assert_eq(t->forget[0].size, 5);

    /* Without a copy: nothing to forget. */
    cr_assert_eq(t_put(s, 2, 100), 0);
    cr_assert_eq(store_remove(s, t_key(&tk, 0, 2), false), 0);
    cr_assert_eq(t->nforget, 1, "forget for an object that was never stored");

    /* SSD-only. */
    cr_assert_eq(store_insert_stored(s, t_key(&tk, 0, 3), 12345, &loc3), 0);
    cr_assert_eq(store_remove(s, t_key(&tk, 0, 3), false), 0);
    cr_assert_eq(t->nforget, 2);
    cr_assert_str_eq(t->forget[1].key, "key-3");
    cr_assert(t_loc_eq(&t->forget[1].loc, &loc3));
    cr_assert_eq(t->forget[1].size, 12345);
    cr_assert_eq(t_stats(s).objects, 0);
    cr_assert_eq(t_stats(s).stored, 0);
    cr_assert_eq(t_exists(s, 3), 0);
    t_tier_detach(s, t);
    store_destroy(s);
}

/*
 * A delete must not fail because the tier is writing the object: the tier's
 * reference is not a reader. store_obj_stored then answers KV_NOT_FOUND
 * (documented: "o left the table meanwhile (removed)") and the tier deletes
 * the entry it just wrote (ssd.c handles exactly that case).
 */
Test(store_tier, remove_while_an_offload_is_pending_succeeds)
{
    struct store *s = t_store(1 * MiB, 0.9, 0.5);
    struct t_tier *t = t_tier_attach(s, true, false, true);
    struct store_obj *o;
    struct t_key tk;

    cr_assert_eq(t_put(s, 1, 30000), 0);
    cr_assert_eq(t_pending_offloads(t), 1);
    cr_assert_eq(store_remove(s, t_key(&tk, 0, 1), false), 0,
                 "remove refused while the object waits for the SSD writer");
    cr_assert_eq(t_exists(s, 1), 0);
    o = t_next_offload(t);
    cr_assert_eq(t_write(s, o), KV_NOT_FOUND);
    cr_assert_eq(t->nforget, 0);
    cr_assert_eq(t_stats(s).objects, 0);
    cr_assert_eq(t_stats(s).stored, 0);
    cr_assert_eq(t_stats(s).offloading, 0);
    cr_assert_eq(t_stats(s).memory_used, 0);
    t_tier_detach(s, t);
    store_destroy(s);
}

/* ---- (f) insert_stored ---- */

Test(store_tier, insert_stored_makes_the_key_taken)
{
    struct store *s = t_store(1 * MiB, 0.9, 0.5);
    struct t_tier *t = t_tier_attach(s, false, true, true);
    struct store_loc loc = t_loc(1);
    struct store_obj *w;
    struct store_obj *o;
    struct t_key tk;
    struct kv_key big;
    uint8_t bigkey[33];

    cr_assert_eq(store_insert_stored(s, t_key(&tk, 0, 1), 4096, &loc), 0);
    o = (struct store_obj *)(void *)&tk;
    cr_assert_eq(store_reserve(s, t_key(&tk, 0, 1), 10, &o), KV_EXISTS);
    cr_assert_null(o);
    cr_assert_eq(t_put(s, 1, 10), KV_EXISTS);
    cr_assert_eq(store_insert_stored(s, t_key(&tk, 0, 1), 4096, &loc), KV_EXISTS);
    cr_assert_eq(t_stats(s).objects, 1);
    cr_assert_eq(t_stats(s).memory_used, 0, "a refused reserve kept pages");
    cr_assert_eq(t_stats(s).no_space, 0);

    /* Over a reservation, and in another tenant. */
    cr_assert_eq(store_reserve(s, t_key(&tk, 0, 2), 10, &w), 0);
    cr_assert_eq(store_insert_stored(s, t_key(&tk, 0, 2), 10, &loc), KV_EXISTS);
    store_abort(s, w);
    cr_assert_eq(store_insert_stored(s, t_key(&tk, 4, 1), 4096, &loc), 0);
    cr_assert_eq(t_stats(s).objects, 2);

    memset(bigkey, 'k', sizeof(bigkey));
    big.tenant = 0;
    big.len = sizeof(bigkey);
    big.ptr = bigkey;
    cr_assert_eq(store_insert_stored(s, &big, 10, &loc), KV_TOO_LARGE);
    cr_assert_eq(t_stats(s).objects, 2);
    cr_assert_eq(t_stats(s).stored, 2);
    t_tier_detach(s, t);
    store_destroy(s);
}

/* ---- (g) drop_stored ---- */

Test(store_tier, drop_stored_keeps_resident_objects_and_unindexes_the_others)
{
    struct store *s = t_store(1 * MiB, 0.9, 0.5);
    struct t_tier *t = t_tier_attach(s, false, true, true);
    struct store_loc loc1 = t_loc(1);
    struct store_loc loc2 = t_loc(2);
    struct store_loc loc3 = t_loc(3);
    struct store_loc stale;
    struct store_obj *o;
    struct t_key tk;

    /* Resident and stored: it stays, dirty again. */
    cr_assert_eq(t_put(s, 1, 8192), 0);
    cr_assert_eq(store_get(s, t_key(&tk, 0, 1), &o), 0);
    cr_assert_eq(store_sync(s, o), 0);
    cr_assert_eq(t_write(s, t_next_offload(t)), 0);
    cr_assert_eq(t_stats(s).stored, 1);
    cr_assert_eq(store_drop_stored(s, t_key(&tk, 0, 1), &loc1), 0);
    cr_assert_eq(store_obj_ssd_state(o), STORE_SSD_NONE);
    store_obj_unref(s, o);
    cr_assert_eq(t_exists(s, 1), 1);
    cr_assert_eq(t_check(s, 1, 8192), 1);
    cr_assert_eq(t_stats(s).stored, 0);
    cr_assert_eq(t_stats(s).resident, 1);
    cr_assert_eq(t->nforget, 0, "the tier's own drop echoed back as forget");
    /* Eviction in on-evict mode must write it again rather than drop it. */
    cr_assert_eq(store_evict(s, 0), 0);
    cr_assert_eq(t->offload_calls, 2, "a dropped copy was not offloaded again");
    cr_assert(t_offload_pending_has(t, 1));
    cr_assert_eq(t_exists(s, 1), 1);
    cr_assert_eq(t_stats(s).evictions, 0);

    /* SSD-only: it leaves the table. */
    cr_assert_eq(store_insert_stored(s, t_key(&tk, 0, 2), 5000, &loc2), 0);
    cr_assert_eq(store_drop_stored(s, t_key(&tk, 0, 2), &loc2), 1);
    cr_assert_eq(t_exists(s, 2), 0);
    cr_assert_eq(t_check(s, 2, 5000), KV_NOT_FOUND);

    /* A stale location (copy rewritten elsewhere) or an absent key: nothing. */
    cr_assert_eq(store_insert_stored(s, t_key(&tk, 0, 3), 5000, &loc3), 0);
    stale = loc3;
    stale.offset += STORE_PAGE_SIZE;
    cr_assert_eq(store_drop_stored(s, t_key(&tk, 0, 3), &stale), 0);
    stale = loc3;
    stale.bucket += 1;
    cr_assert_eq(store_drop_stored(s, t_key(&tk, 0, 3), &stale), 0);
    cr_assert_eq(t_exists(s, 3), 1);
    cr_assert_eq(t_stats(s).stored, 1);
    cr_assert_eq(store_drop_stored(s, t_key(&tk, 0, 99), &loc3), 0);
    cr_assert_eq(t_stats(s).objects, 2);
    cr_assert_eq(t->nforget, 0);
    t_tier_detach(s, t);
    store_destroy(s);
}

/* The loader finds a dropped object gone, whether before or after it took pages. */
Test(store_tier, drop_stored_during_a_load)
{
    struct store *s = t_store(1 * MiB, 0.9, 0.5);
    struct t_tier *t = t_tier_attach(s, false, true, true);
    struct store_loc loc1 = t_loc(1);
    struct store_loc loc2 = t_loc(2);
    struct iovec iov[STORE_MAX_EXTENTS];
    struct store_obj *o;
    struct t_key tk;
    int n;

    cr_assert_eq(store_insert_stored(s, t_key(&tk, 0, 1), 5000, &loc1), 0);
    cr_assert_eq(t_check(s, 1, 5000), -EAGAIN);
    cr_assert_eq(store_drop_stored(s, t_key(&tk, 0, 1), &loc1), 1);
    o = t_next_load(t);
    cr_assert_eq(store_load_begin(s, o, iov, STORE_MAX_EXTENTS, &n), KV_NOT_FOUND);
    cr_assert_eq(store_load_end(s, o, KV_NOT_FOUND), 0, "dropped twice");

    cr_assert_eq(store_insert_stored(s, t_key(&tk, 0, 2), 5000, &loc2), 0);
    cr_assert_eq(t_check(s, 2, 5000), -EAGAIN);
    o = t_next_load(t);
    cr_assert_eq(store_load_begin(s, o, iov, STORE_MAX_EXTENTS, &n), 0);
    cr_assert_eq(store_drop_stored(s, t_key(&tk, 0, 2), &loc2), 1);
    cr_assert_eq(store_load_end(s, o, 0), 0);
    cr_assert_eq(t_exists(s, 2), 0);

    cr_assert_eq(t_stats(s).objects, 0);
    cr_assert_eq(t_stats(s).loading, 0);
    cr_assert_eq(t_stats(s).resident, 0);
    cr_assert_eq(t_stats(s).memory_used, 0, "a dropped object's load pages leaked");
    t_tier_detach(s, t);
    store_destroy(s);
}

/* ---- (h) degraded ---- */

Test(store_tier, degraded_tier_lets_eviction_drop_objects)
{
    struct store *s = t_store(1 * MiB, 0.9, 0.5);
    struct t_tier *t = t_tier_attach(s, false, true, true);
    struct store_stats st;
    uint64_t obj = 32 * KiB;
    uint64_t evictions;
    uint64_t id;
    int rc = 0;

    store_tier_degraded(s, true);
    for (id = 0; id < 100; id++) {
        cr_assert_eq(t_put(s, id, obj), 0, "put %llu", (unsigned long long)id);
        cr_assert_leq(t_stats(s).memory_used, (uint64_t)(0.9 * MiB));
    }
    st = t_stats(s);
    cr_assert_eq(t->offload_calls, 0, "a degraded tier was asked to write");
    cr_assert_gt(st.evictions, 0);
    cr_assert_eq(st.objects, 100 - st.evictions, "evicted objects without a copy stayed");
    cr_assert_eq(st.stored, 0);
    cr_assert_eq(t_check(s, 99, obj), 1);

    /* Recovered: eviction waits for the tier again. */
    store_tier_degraded(s, false);
    evictions = st.evictions;
    for (; id < 200 && (rc = t_put(s, id, obj)) == 0; id++) {
    }
    cr_assert_eq(rc, -EAGAIN);
    cr_assert_gt(t->offload_calls, 0);
    cr_assert_eq(t_stats(s).evictions, evictions);
    t_tier_detach(s, t);
    store_destroy(s);
}

/* ---- (i) store_sync ---- */

Test(store_tier, sync_queues_dirty_and_failed_objects_once)
{
    struct store *s = t_store(1 * MiB, 0.9, 0.5);
    struct store *bare = t_store(1 * MiB, 0.9, 0.5);
    struct t_tier *t = t_tier_attach(s, false, true, true);
    struct store_obj *o;
    struct store_obj *q;
    struct t_key tk;

    cr_assert_eq(store_put(bare, t_key(&tk, 0, 1), "x", 1), 0);
    cr_assert_eq(store_get(bare, t_key(&tk, 0, 1), &o), 0);
    cr_assert_eq(store_sync(bare, o), KV_UNSUPPORTED);
    store_obj_unref(bare, o);
    store_destroy(bare);

    cr_assert_eq(t_put(s, 1, 7000), 0);
    cr_assert_eq(store_get(s, t_key(&tk, 0, 1), &o), 0);
    cr_assert_eq(store_obj_ssd_state(o), STORE_SSD_NONE);
    cr_assert_not(store_obj_must_write(o), "a fresh object claims a durable waiter");
    cr_assert_eq(store_sync(s, o), 0);
    cr_assert(store_obj_must_write(o), "a durable put's object may be refused by admission");
    cr_assert_eq(t->offload_calls, 1);
    cr_assert_eq(store_obj_ssd_state(o), STORE_SSD_QUEUED);
    cr_assert_eq(t_stats(s).offloading, 1);
    cr_assert_eq(store_sync(s, o), 0);
    cr_assert_eq(t->offload_calls, 1, "a queued object was queued again");

    /* The write fails: FAILED, and a later sync tries again. */
    q = t_next_offload(t);
    cr_assert_eq(q, o);
    store_obj_store_failed(s, q);
    cr_assert_eq(store_obj_ssd_state(o), STORE_SSD_FAILED);
    cr_assert_eq(t_stats(s).offloading, 0);
    cr_assert_eq(t_stats(s).stored, 0);
    cr_assert_eq(store_sync(s, o), 0);
    cr_assert_eq(t->offload_calls, 2, "a failed object was not queued again");
    cr_assert_eq(store_obj_ssd_state(o), STORE_SSD_QUEUED);

    cr_assert_eq(t_write(s, t_next_offload(t)), 0);
    cr_assert_eq(store_obj_ssd_state(o), STORE_SSD_STORED);
    cr_assert_eq(t_stats(s).stored, 1);
    cr_assert_eq(store_sync(s, o), 0);
    cr_assert_eq(t->offload_calls, 2, "a stored object was queued again");
    cr_assert(t_verify_obj(o, 1, 7000));
    store_obj_unref(s, o);
    t_tier_detach(s, t);
    store_destroy(s);
}

/* ---- (j) store_offload_cold ---- */

/*
 * 4 MiB arena (1024 pages), high 0.9, low 0.5; 40 objects of 64 KiB fill
 * 62.5%: between the watermarks, where writing cold objects ahead pays.
 * Objects with a copy, a reader, a lease or a hard pin are not taken.
 */
Test(store_tier, offload_cold_queues_cold_dirty_objects_near_the_low_watermark)
{
    struct store *s = t_store(4 * MiB, 0.9, 0.5);
    struct t_tier *t = t_tier_attach(s, false, true, true);
    struct store_obj *reader;
    struct store_obj *o;
    struct t_key tk;
    uint64_t obj = 64 * KiB;
    uint64_t size;
    uint64_t q;

    for (uint64_t id = 0; id < 40; id++) {
        cr_assert_eq(t_put(s, id, obj), 0);
    }
    cr_assert_eq(t->offload_calls, 0);
    cr_assert_eq(t_stats(s).evictions, 0);
    cr_assert_eq(store_get(s, t_key(&tk, 0, 0), &o), 0);
    cr_assert_eq(store_sync(s, o), 0);
    store_obj_unref(s, o);
    cr_assert_eq(t_write(s, t_next_offload(t)), 0);
    cr_assert_eq(store_get(s, t_key(&tk, 0, 1), &reader), 0);
    cr_assert_eq(store_lease(s, t_key(&tk, 0, 2), 60000, &size), 0);
    cr_assert_eq(store_pin(s, t_key(&tk, 0, 3), STORE_PIN_HARD), 0);

    /* A budget: it stops once `bytes` are queued. */
    q = store_offload_cold(s, 3 * obj);
    cr_assert_eq(q, 3 * obj);
    cr_assert_eq(t_pending_offloads(t), 3);

    q = store_offload_cold(s, UINT64_MAX);
    cr_assert_gt(q, 0);
    cr_assert_eq(q, (t_pending_offloads(t) - 3) * obj);
    cr_assert_eq(t_stats(s).offloading, t_pending_offloads(t));
    for (size_t i = t->off_head; i < t->off_n; i++) {
        uint64_t id = t_obj_id(t->offload[i]);

        cr_assert(id > 3, "object %llu (stored, read, leased or pinned) was queued",
                  (unsigned long long)id);
        cr_assert_eq(store_obj_ssd_state(t->offload[i]), STORE_SSD_QUEUED);
    }
    /* Nothing is queued twice. */
    for (size_t i = t->off_head; i < t->off_n; i++) {
        for (size_t j = i + 1; j < t->off_n; j++) {
            cr_assert_neq(t->offload[i], t->offload[j]);
        }
    }
    store_obj_unref(s, reader);
    t_tier_detach(s, t);
    store_destroy(s);
}

/* Far below the low watermark nothing will be evicted soon: writing ahead only wears the SSD. */
Test(store_tier, offload_cold_does_nothing_when_the_store_is_nearly_empty)
{
    struct store *s = t_store(4 * MiB, 0.9, 0.5);
    struct t_tier *t = t_tier_attach(s, false, true, true);
    uint64_t obj = 64 * KiB;

    for (uint64_t id = 0; id < 4; id++) {
        cr_assert_eq(t_put(s, id, obj), 0);
    }
    cr_assert_eq(t_stats(s).memory_used, 4 * obj);     /* 6% of the arena */
    cr_assert_eq(store_offload_cold(s, UINT64_MAX), 0,
                 "objects were queued with DRAM 6%% full (low watermark 50%%)");
    cr_assert_eq(t->offload_calls, 0);
    t_tier_detach(s, t);
    store_destroy(s);
}

/* ---- promote ---- */

/*
 * Without promote a loaded object is kept until its read (or a prefetch's)
 * comes, then it is the next one eviction takes (scan resistance); with
 * promote it is the newest.
 */
static uint64_t
t_evict_one_after_load(bool promote, bool read)
{
    struct store *s = t_store(1 * MiB, 1.0, 1.0);
    struct t_tier *t = t_tier_attach(s, false, true, promote);
    struct store_loc loc = t_loc(100);
    struct t_key tk;
    struct store_obj *o;
    uint64_t obj = 16 * KiB;
    uint64_t gone = UINT64_MAX;
    int ngone = 0;
    uint64_t used;

    for (uint64_t id = 0; id < 10; id++) {
        cr_assert_eq(t_put(s, id, obj), 0);
        cr_assert_eq(store_get(s, t_key(&tk, 0, id), &o), 0);
        cr_assert_eq(store_sync(s, o), 0);
        store_obj_unref(s, o);
    }
    cr_assert_eq(t_write_all(s, t), 10);
    cr_assert_eq(store_insert_stored(s, t_key(&tk, 0, 100), obj, &loc), 0);
    t_sleep_ms(30);
    cr_assert_eq(t_check(s, 100, obj), -EAGAIN);
    t_load(s, t_next_load(t), 100);
    if (read) {
        cr_assert_eq(t_check(s, 100, obj), 1, "the read the load was for");
    }

    used = t_stats(s).memory_used;
    cr_assert_eq(store_evict(s, used - obj), obj);
    cr_assert_eq(t_stats(s).evictions, 1);
    /* The evicted one is the object whose get now starts a load. */
    for (uint64_t id = 0; id <= 100; id = id == 9 ? 100 : id + 1) {
        uint64_t before = t->load_calls;

        if (t_check(s, id, obj) == -EAGAIN) {
            cr_assert_eq(t->load_calls, before + 1);
            gone = id;
            ngone++;
        }
    }
    cr_assert_eq(ngone, 1);
    t_tier_detach(s, t);
    store_destroy(s);
    return gone;
}

Test(store_tier, loaded_object_without_promote_is_evicted_first)
{
    cr_assert_eq(t_evict_one_after_load(false, true), 100,
                 "a loaded object (promote off), once read, outlived older objects");
}

Test(store_tier, loaded_object_without_promote_waits_for_its_read)
{
    uint64_t gone = t_evict_one_after_load(false, false);

    cr_assert_neq(gone, UINT64_MAX);
    cr_assert_neq(gone, 100, "a loaded object (promote off) was evicted before it was read");
}

Test(store_tier, loaded_object_with_promote_is_not_evicted_first)
{
    uint64_t gone = t_evict_one_after_load(true, true);

    cr_assert_neq(gone, UINT64_MAX);
    cr_assert_neq(gone, 100, "a loaded object (promote on) was evicted first");
}

/*
 * Write-through fills DRAM with objects queued for the SSD: a put then
 * waits (-EAGAIN). Once the oldest is written, the next put takes exactly
 * its pages: objects on their way to the SSD keep their place at the LRU
 * tail, so the first one written is the first one found.
 */
Test(store_tier, the_first_object_written_is_the_first_evicted)
{
    struct store *s = t_store(1 * MiB, 1.0, 1.0);
    struct t_tier *t = t_tier_attach(s, true, false, true);
    uint64_t obj = 64 * KiB;

    for (uint64_t id = 0; id < 16; id++) {
        cr_assert_eq(t_put(s, id, obj), 0, "put %llu", (unsigned long long)id);
    }
    cr_assert_eq(t_pending_offloads(t), 16);
    cr_assert_eq(t_put(s, 100, obj), -EAGAIN, "room while every object waits for the SSD");

    cr_assert_eq(t_write(s, t_next_offload(t)), 0);     /* object 0, the oldest */
    cr_assert_eq(t_put(s, 100, obj), 0);
    cr_assert_eq(t_stats(s).evictions, 1);
    cr_assert_eq(t_check(s, 0, obj), -EAGAIN, "object 0 should have left DRAM (its load starts)");
    for (uint64_t id = 1; id < 16; id++) {
        cr_assert_eq(t_check(s, id, obj), 1, "object %llu should still be in DRAM",
                     (unsigned long long)id);
    }
    cr_assert_eq(t_check(s, 100, obj), 1);
    t_tier_detach(s, t);
    store_destroy(s);
}
