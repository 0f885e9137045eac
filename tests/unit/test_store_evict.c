/*
 * test_store_evict: the eviction policies (store.h, enum store_evict_policy)
 * and the background evictor, against an in-process store: FIFO takes the
 * first stored whatever was read since, LRU keeps what was read, SLRU keeps
 * objects read twice through a scan of objects stored once (which LRU does
 * not), a reload from SLRU drains the protected list, and with the evictor
 * thread a store kept full takes every put and settles within its
 * watermarks. Arenas of 16 MiB, objects of 16 KiB (16 per shard when full,
 * so a shard's protected share is not a rounding error); timings only as
 * bounds against a hang.
 */
#include <criterion/criterion.h>

#include "clock.h"
#include "store.h"
#include "store_keys.h"

#include <stdlib.h>
#include <time.h>

#define KiB 1024ull
#define MiB (1024ull * 1024ull)
#define OBJ (16 * KiB)
#define GROUP 200ull          /* objects of a group: 3.2 MiB */

static struct store *
e_store(enum store_evict_policy policy, bool background, double high, double low)
{
    struct store_config cfg = {
        .memory_size = 16 * MiB,
        .max_key_size = 256,
        .max_value_size = 16 * MiB,
        .high_watermark = high,
        .low_watermark = low,
        .policy = policy,
        .evict_background = background,
    };
    struct store *s = NULL;

    cr_assert_eq(store_create(&cfg, &s), 0);
    return s;
}

static int
e_put(struct store *s, uint64_t id)
{
    static uint8_t buf[OBJ];
    struct t_key tk;

    t_fill(buf, id, OBJ);
    return store_put(s, t_key(&tk, 0, id), buf, OBJ);
}

static int
e_exists(struct store *s, uint64_t id)
{
    struct t_key tk;

    return store_exists(s, t_key(&tk, 0, id));
}

/* e_tick: wait for the next coarse clock tick, so that stamps on either side differ. */
static void
e_tick(void)
{
    struct timespec ts = {0, 2000000L};
    uint64_t t0 = clock_coarse_ms();

    for (int i = 0; i < 1000 && clock_coarse_ms() == t0; i++) {
        nanosleep(&ts, NULL);
    }
}

static struct store_stats
e_stats(struct store *s)
{
    struct store_stats st;

    store_stats(s, &st);
    return st;
}

/*
 * Four groups (800 x 16 KiB = 78% of the arena), stored a clock tick apart;
 * group 0 is read; then new objects until a group's worth of evictions.
 * Returns how many of group 0 are left; group 3 must be whole.
 */
static int
e_group0_left(enum store_evict_policy policy)
{
    struct store *s = e_store(policy, false, 0.9, 0.8);
    uint64_t id = 10000;
    int left = 0;

    for (uint64_t g = 0; g < 4; g++) {
        for (uint64_t i = 0; i < GROUP; i++) {
            cr_assert_eq(e_put(s, g * GROUP + i), 0);
        }
        e_tick();
    }
    for (uint64_t i = 0; i < GROUP; i++) {
        cr_assert_eq(e_exists(s, i), 1);
    }
    e_tick();
    while (e_stats(s).evictions < GROUP) {
        cr_assert_eq(e_put(s, id++), 0);
        cr_assert_lt(id, 20000, "no eviction");
    }
    for (uint64_t i = 0; i < GROUP; i++) {
        left += e_exists(s, i);
    }
    for (uint64_t i = 3 * GROUP; i < 4 * GROUP; i++) {
        cr_assert_eq(e_exists(s, i), 1, "policy %d evicted object %llu of a later group",
                     (int)policy, (unsigned long long)i);
    }
    store_destroy(s);
    return left;
}

Test(store_evict, fifo_takes_the_first_stored_even_when_read)
{
    cr_assert_eq(e_group0_left(STORE_EVICT_FIFO), 0,
                 "FIFO must take the first group stored, read or not");
}

Test(store_evict, lru_keeps_what_was_read)
{
    cr_assert_eq(e_group0_left(STORE_EVICT_LRU), (int)GROUP,
                 "LRU must take the unread group 1, not the read group 0");
}

#define HOT 160

/* e_put_hot: objects 0 to HOT-1 stored, then read twice, each read a clock tick later. */
static void
e_put_hot(struct store *s)
{
    for (uint64_t i = 0; i < HOT; i++) {
        cr_assert_eq(e_put(s, i), 0);
    }
    for (int round = 0; round < 2; round++) {
        e_tick();
        for (uint64_t i = 0; i < HOT; i++) {
            cr_assert_eq(e_exists(s, i), 1);
        }
    }
}

/*
 * HOT objects (2.5 MiB) read twice, then a scan: 2,400 objects stored once
 * (37 MiB through a 16 MiB arena) with the hot ones read again halfway.
 * Returns how many of them are left.
 */
static int
e_hot_left_after_scan(enum store_evict_policy policy)
{
    struct store *s = e_store(policy, false, 0.9, 0.8);
    int left = 0;

    e_put_hot(s);
    for (uint64_t id = 10000; id < 12400; id++) {
        cr_assert_eq(e_put(s, id), 0);
        if (id == 11200) {
            e_tick();
            for (uint64_t i = 0; i < HOT; i++) {
                (void)e_exists(s, i);
            }
        }
    }
    for (uint64_t i = 0; i < HOT; i++) {
        left += e_exists(s, i);
    }
    store_destroy(s);
    return left;
}

Test(store_evict, slru_keeps_objects_read_again_through_a_scan)
{
    int slru = e_hot_left_after_scan(STORE_EVICT_SLRU);
    int lru = e_hot_left_after_scan(STORE_EVICT_LRU);

    /*
     * The protected share is per shard (half of its objects): a shard that
     * drew more than its share of the hot ones (the shard hash is keyed per
     * process) sends the extra back to probation, and objects stamped in one
     * tick of the coarse clock rank by shard; so some may go: 133-159 of the
     * 160 were kept in 16 runs on a loaded machine, LRU 19-79.
     */
    cr_assert_geq(slru, HOT - HOT / 4, "SLRU lost %d of the %d objects read again", HOT - slru,
                  HOT);
    /* What makes the test mean something: the same scan takes many more of them from LRU. */
    cr_assert_geq(slru - lru, HOT / 4, "SLRU kept %d, LRU %d: no better", slru, lru);
}

Test(store_evict, a_reload_from_slru_drains_the_protected_list)
{
    struct store *s = e_store(STORE_EVICT_SLRU, false, 0.9, 0.8);
    struct store_config cfg = {
        .max_key_size = 256,
        .max_value_size = 16 * MiB,
        .high_watermark = 0.9,
        .low_watermark = 0.8,
        .policy = STORE_EVICT_FIFO,
    };
    uint64_t id = 10000;
    int left = 0;

    e_put_hot(s);
    /* Evictions under SLRU move the 40 to the protected list. */
    while (e_stats(s).evictions < 100) {
        cr_assert_eq(e_put(s, id++), 0);
    }
    cr_assert_eq(store_set_limits(s, &cfg), 0);
    for (int i = 0; i < 2400; i++) {
        cr_assert_eq(e_put(s, id++), 0);
    }
    for (uint64_t i = 0; i < HOT; i++) {
        left += e_exists(s, i);
    }
    cr_assert_eq(left, 0, "%d objects stayed protected after the switch to FIFO", left);
    cfg.policy = (enum store_evict_policy)7;
    cr_assert_neq(store_set_limits(s, &cfg), 0, "an unknown policy is refused");
    store_destroy(s);
}

/*
 * With the evictor thread: 8,000 puts of 16 KiB (8 times the arena) all
 * succeed, and once the puts stop the arena settles between the watermarks
 * (bounded wait: the thread may still be running its pass).
 */
Test(store_evict, the_evictor_thread_keeps_a_full_store_taking_puts)
{
    struct store *s = e_store(STORE_EVICT_LRU, true, 0.95, 0.9);
    uint64_t cap = 16 * MiB;
    struct store_stats st;

    for (uint64_t id = 0; id < 8000; id++) {
        cr_assert_eq(e_put(s, id), 0, "put %llu refused", (unsigned long long)id);
    }
    for (int i = 0; i < 500; i++) {
        st = e_stats(s);
        if (st.memory_used <= (uint64_t)(0.95 * (double)cap)) {
            break;
        }
        struct timespec ts = {0, 10000000L};
        nanosleep(&ts, NULL);
    }
    st = e_stats(s);
    cr_assert_leq(st.memory_used, (uint64_t)(0.95 * (double)cap), "%llu bytes used",
                  (unsigned long long)st.memory_used);
    cr_assert_geq(st.resident_bytes, (uint64_t)(0.9 * (double)cap) - OBJ,
                  "the evictor went below the low watermark: %llu bytes held",
                  (unsigned long long)st.resident_bytes);
    cr_assert_geq(st.evictions, 8000 - cap / OBJ);
    cr_assert_leq(st.evictions_inline, st.evictions);
    cr_assert_eq(st.no_space, 0);
    store_destroy(s);
}
