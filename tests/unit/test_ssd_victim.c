/*
 * test_ssd_victim: the SSD tier's bucket eviction rule (ssd_pick_victim) on
 * made-up bucket views: fifo takes the oldest id, lru the least recently
 * read (ties to the older bucket), whatever order the array is in; a bucket
 * more than half dead goes before both (the deadest first); ineligible
 * buckets (open, being written or dropped) are never taken; none eligible
 * answers -1.
 */
#include <criterion/criterion.h>

#include "ssd.h"

#include <stddef.h>
#include <stdint.h>

#define T_N(a) (sizeof(a) / sizeof((a)[0]))

/* A bucket of 1000 bytes, live ones 800 (not dead), eligible. */
static struct ssd_bucket_view
t_bucket(uint64_t id, uint64_t last_read_ms)
{
    struct ssd_bucket_view v = {
        .id = id,
        .last_read_ms = last_read_ms,
        .live_bytes = 800,
        .total_bytes = 1000,
        .eligible = true,
    };

    return v;
}

Test(ssd_victim, fifo_takes_the_smallest_id)
{
    struct ssd_bucket_view v[] = {
        t_bucket(7, 10), t_bucket(3, 50), t_bucket(9, 1), t_bucket(4, 0), t_bucket(12, 5),
    };

    cr_assert_eq(ssd_pick_victim(v, T_N(v), SSD_FIFO), 1, "fifo looked at something but the id");
    v[1].eligible = false;
    cr_assert_eq(ssd_pick_victim(v, T_N(v), SSD_FIFO), 3);
    /* One bucket. */
    cr_assert_eq(ssd_pick_victim(&v[4], 1, SSD_FIFO), 0);
}

Test(ssd_victim, lru_takes_the_oldest_read)
{
    struct ssd_bucket_view v[] = {
        t_bucket(1, 500), t_bucket(2, 300), t_bucket(8, 100), t_bucket(5, 400),
    };

    cr_assert_eq(ssd_pick_victim(v, T_N(v), SSD_LRU), 2, "lru took the oldest id, not read");
    v[2].last_read_ms = 900;
    cr_assert_eq(ssd_pick_victim(v, T_N(v), SSD_LRU), 1);
}

Test(ssd_victim, lru_ties_go_to_the_smaller_id)
{
    struct ssd_bucket_view v[] = {
        t_bucket(9, 100), t_bucket(6, 100), t_bucket(2, 200), t_bucket(4, 100),
    };

    cr_assert_eq(ssd_pick_victim(v, T_N(v), SSD_LRU), 3);
    v[3].eligible = false;
    cr_assert_eq(ssd_pick_victim(v, T_N(v), SSD_LRU), 1);
    /* All read at the same time: the oldest bucket, wherever it sits. */
    v[2].last_read_ms = 100;
    v[3].eligible = true;
    cr_assert_eq(ssd_pick_victim(v, T_N(v), SSD_LRU), 2);
}

Test(ssd_victim, ineligible_buckets_are_never_taken)
{
    struct ssd_bucket_view v[] = {
        t_bucket(1, 0), t_bucket(2, 0), t_bucket(3, 0),
    };

    /* The oldest, least read and deadest are all ineligible. */
    v[0].eligible = false;
    v[1].eligible = false;
    v[1].live_bytes = 0;
    cr_assert_eq(ssd_pick_victim(v, T_N(v), SSD_FIFO), 2);
    cr_assert_eq(ssd_pick_victim(v, T_N(v), SSD_LRU), 2);
    for (uint64_t mask = 0; mask < 8; mask++) {
        for (size_t i = 0; i < T_N(v); i++) {
            v[i].eligible = (mask >> i) & 1;
            v[i].live_bytes = i == 1 ? 0 : 800;
        }
        for (int e = SSD_FIFO; e <= SSD_LRU; e++) {
            int got = ssd_pick_victim(v, T_N(v), e);

            if (mask == 0) {
                cr_assert_eq(got, -1);
            } else {
                cr_assert(got >= 0 && got < (int)T_N(v));
                cr_assert(v[got].eligible, "mask %llu, rule %d: took ineligible bucket %d",
                          (unsigned long long)mask, e, got);
            }
        }
    }
}

Test(ssd_victim, none_eligible_is_minus_one)
{
    struct ssd_bucket_view v[] = {
        t_bucket(1, 0), t_bucket(2, 0),
    };

    cr_assert_eq(ssd_pick_victim(v, 0, SSD_FIFO), -1);
    cr_assert_eq(ssd_pick_victim(v, 0, SSD_LRU), -1);
    v[0].eligible = false;
    v[1].eligible = false;
    v[1].live_bytes = 0;
    cr_assert_eq(ssd_pick_victim(v, T_N(v), SSD_FIFO), -1);
    cr_assert_eq(ssd_pick_victim(v, T_N(v), SSD_LRU), -1);
}

Test(ssd_victim, a_mostly_dead_bucket_goes_first)
{
    struct ssd_bucket_view v[] = {
        t_bucket(1, 10), t_bucket(2, 20), t_bucket(30, 9000), t_bucket(4, 40),
    };

    /* The newest and most recently read bucket, but only 40% live. */
    v[2].live_bytes = 400;
    cr_assert_eq(ssd_pick_victim(v, T_N(v), SSD_FIFO), 2);
    cr_assert_eq(ssd_pick_victim(v, T_N(v), SSD_LRU), 2);
    /* Fully dead too. */
    v[2].live_bytes = 0;
    cr_assert_eq(ssd_pick_victim(v, T_N(v), SSD_FIFO), 2);
    /* Ineligible: the rule applies again. */
    v[2].eligible = false;
    cr_assert_eq(ssd_pick_victim(v, T_N(v), SSD_FIFO), 0);
    cr_assert_eq(ssd_pick_victim(v, T_N(v), SSD_LRU), 0);
}

Test(ssd_victim, the_deadest_of_several_goes_first)
{
    struct ssd_bucket_view v[] = {
        t_bucket(1, 10), t_bucket(2, 20), t_bucket(3, 30), t_bucket(4, 40), t_bucket(5, 50),
    };

    /* Live fractions 0.8, 0.40, 0.10, 0.30, 0.45 (different totals: a ratio, not bytes). */
    v[1].live_bytes = 400;
    v[2].live_bytes = 400;
    v[2].total_bytes = 4000;
    v[3].live_bytes = 60;
    v[3].total_bytes = 200;
    v[4].live_bytes = 45;
    v[4].total_bytes = 100;
    cr_assert_eq(ssd_pick_victim(v, T_N(v), SSD_FIFO), 2);
    cr_assert_eq(ssd_pick_victim(v, T_N(v), SSD_LRU), 2);
    v[2].eligible = false;
    cr_assert_eq(ssd_pick_victim(v, T_N(v), SSD_FIFO), 3);
    v[3].eligible = false;
    cr_assert_eq(ssd_pick_victim(v, T_N(v), SSD_LRU), 1);
}

Test(ssd_victim, exactly_half_live_is_not_dead)
{
    struct ssd_bucket_view v[] = {
        t_bucket(1, 100), t_bucket(2, 50),
    };

    v[1].live_bytes = 500;      /* exactly half of 1000 */
    cr_assert_eq(ssd_pick_victim(v, T_N(v), SSD_FIFO), 0, "half live counted as dead");
    v[1].live_bytes = 499;
    cr_assert_eq(ssd_pick_victim(v, T_N(v), SSD_FIFO), 1);
    /* Odd totals: 3 of 7 live is dead, 4 of 7 is not. */
    v[1].total_bytes = 7;
    v[1].live_bytes = 4;
    cr_assert_eq(ssd_pick_victim(v, T_N(v), SSD_FIFO), 0);
    v[1].live_bytes = 3;
    cr_assert_eq(ssd_pick_victim(v, T_N(v), SSD_FIFO), 1);
}
