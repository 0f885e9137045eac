/*
 * test_alloc: the arena allocator as store.c relies on it: extents never
 * overlap and stay inside the arena, every page comes back and coalesces,
 * a failed take takes nothing, and mixed 4 KiB - 32 MiB requests under churn
 * keep succeeding whenever enough pages are free. No network, bounded time.
 */
#include <criterion/criterion.h>

#include "alloc.h"
#include "kverr.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#define MiB (1024ull * 1024ull)

/* One live allocation in a test. */
struct t_alloc {
    struct alloc_extent ext[32];
    int n;
    uint64_t pages;
    uint64_t id;
};

static uint64_t
t_rand(uint64_t *st)
{
    /* xorshift64*: deterministic per seed, so a failure reproduces. */
    *st ^= *st >> 12;
    *st ^= *st << 25;
    *st ^= *st >> 27;
    return *st * 0x2545f4914f6cdd1dull;
}

/* t_size: log-uniform page counts in [1, max], like a mix of small and large values. */
static uint64_t
t_size(uint64_t *st, int max_shift)
{
    int shift = (int)(t_rand(st) % (uint64_t)(max_shift + 1));
    uint64_t lo = 1ull << shift;
    uint64_t v = lo + t_rand(st) % lo;

    return v > (1ull << max_shift) ? 1ull << max_shift : v;
}

static uint64_t
t_ext_pages(const struct alloc_extent *ext, int n)
{
    uint64_t pages = 0;

    for (int i = 0; i < n; i++) {
        pages += 1ull << ext[i].order;
    }
    return pages;
}

/* t_fill / t_check: a pattern derived from the allocation id in every byte of every page. */
static void
t_fill(void *base, const struct t_alloc *t)
{
    for (int i = 0; i < t->n; i++) {
        uint8_t *p = alloc_extent_ptr(base, &t->ext[i]);
        uint64_t len = alloc_extent_bytes(&t->ext[i]);

        memset(p, (int)(t->id * 31 + 7) & 0xff, len);
        for (uint64_t off = 0; off < len; off += ALLOC_PAGE_SIZE) {
            memcpy(p + off, &t->id, sizeof(t->id));
        }
    }
}

static int
t_check(void *base, const struct t_alloc *t)
{
    uint8_t fill = (uint8_t)((t->id * 31 + 7) & 0xff);

    for (int i = 0; i < t->n; i++) {
        const uint8_t *p = alloc_extent_ptr(base, &t->ext[i]);
        uint64_t len = alloc_extent_bytes(&t->ext[i]);

        for (uint64_t off = 0; off < len; off += ALLOC_PAGE_SIZE) {
            uint64_t id;

            memcpy(&id, p + off, sizeof(id));
            if (id != t->id || p[off + 8] != fill || p[off + ALLOC_PAGE_SIZE - 1] != fill) {
                return 0;
            }
        }
    }
    return 1;
}

/* t_mark: claim the pages of t in owner[]; 0 when a page is outside the arena or already owned. */
static int
t_mark(int32_t *owner, uint64_t total, const struct t_alloc *t, int32_t who)
{
    for (int i = 0; i < t->n; i++) {
        uint64_t first = t->ext[i].page;
        uint64_t count = 1ull << t->ext[i].order;

        if ((first & (count - 1)) != 0 || first + count > total) {
            return 0;
        }
        for (uint64_t p = first; p < first + count; p++) {
            if (who >= 0 && owner[p] >= 0) {
                return 0;
            }
            owner[p] = who;
        }
    }
    return 1;
}

Test(alloc, takes_and_gives_back_all_pages)
{
    struct alloc *a;
    struct alloc_stats st;
    struct alloc_extent *ext;
    uint8_t *seen;
    uint64_t total;
    uint64_t got = 0;
    int n;

    cr_assert_eq(alloc_create(16 * MiB, ALLOC_HUGE_AUTO, &a), 0);
    total = alloc_total_pages(a);
    cr_assert_eq(total, 4096);
    ext = calloc(total + 1, sizeof(*ext));
    seen = calloc(total, 1);
    while (alloc_take(a, 1, &ext[got], 1, &n) == 0) {
        cr_assert_eq(n, 1);
        cr_assert_eq(ext[got].order, 0);
        cr_assert_lt(ext[got].page, total);
        cr_assert_eq(seen[ext[got].page], 0, "page %u handed out twice", ext[got].page);
        seen[ext[got].page] = 1;
        got++;
        cr_assert_leq(got, total);
    }
    cr_assert_eq(got, total, "only %llu of %llu pages could be taken", (unsigned long long)got,
                 (unsigned long long)total);
    cr_assert_eq(alloc_free_pages(a), 0);
    cr_assert_eq(alloc_largest_free(a), 0);

    alloc_give(a, ext, (int)got);
    alloc_stats(a, &st);
    cr_assert_eq(st.free_pages, total);
    cr_assert_eq(st.used_pages, 0);
    cr_assert_eq(st.largest_free_pages, total, "frees did not coalesce back to one block");
    cr_assert_eq(st.free_blocks[12], 1);
    free(ext);
    free(seen);
    alloc_destroy(a);
}

Test(alloc, odd_sized_arena_is_fully_usable)
{
    struct alloc *a;
    struct alloc_stats fresh;
    struct alloc_stats st;
    struct alloc_extent ext[32];
    int n;

    /* 5000 pages and change: rounded down, carved into 4096 + 512 + 256 + 128 + 8. */
    cr_assert_eq(alloc_create(5000ull * ALLOC_PAGE_SIZE + 123, ALLOC_HUGE_OFF, &a), 0);
    alloc_stats(a, &fresh);
    cr_assert_eq(fresh.total_pages, 5000);
    cr_assert_eq(fresh.largest_free_pages, 4096);

    cr_assert_eq(alloc_take(a, 5000, ext, 32, &n), 0);
    cr_assert_eq(n, 5);
    cr_assert_eq(t_ext_pages(ext, n), 5000);
    cr_assert_eq(alloc_free_pages(a), 0);
    cr_assert_eq(alloc_take(a, 1, ext + n, 1, &n), KV_NO_SPACE);
    cr_assert_eq(n, 0);

    cr_assert_eq(alloc_take(a, 0, ext, 0, &n), KV_OK, "an empty request always succeeds");
    cr_assert_eq(n, 0);
    alloc_stats(a, &st);
    cr_assert_eq(st.used_pages, 5000);
    alloc_destroy(a);

    /* The same arena taken page by page and given back in a scramble coalesces to the carve. */
    cr_assert_eq(alloc_create(5000ull * ALLOC_PAGE_SIZE, ALLOC_HUGE_OFF, &a), 0);
    {
        struct alloc_extent *one = calloc(5000, sizeof(*one));
        uint64_t seed = 42;

        for (int i = 0; i < 5000; i++) {
            cr_assert_eq(alloc_take(a, 1, &one[i], 1, &n), 0);
        }
        for (int i = 4999; i > 0; i--) {
            int j = (int)(t_rand(&seed) % (uint64_t)(i + 1));
            struct alloc_extent tmp = one[i];

            one[i] = one[j];
            one[j] = tmp;
        }
        alloc_give(a, one, 5000);
        free(one);
    }
    alloc_stats(a, &st);
    cr_assert_eq(memcmp(st.free_blocks, fresh.free_blocks, sizeof(st.free_blocks)), 0,
                 "free blocks after scrambled frees differ from the fresh carve");
    alloc_destroy(a);
}

Test(alloc, never_hands_out_overlapping_extents)
{
    struct alloc *a;
    struct t_alloc *live;
    int32_t *owner;
    uint64_t total;
    uint64_t seed = 0x1234;
    uint64_t next_id = 1;
    int nlive = 0;

    cr_assert_eq(alloc_create(64 * MiB, ALLOC_HUGE_AUTO, &a), 0);
    total = alloc_total_pages(a);
    owner = malloc(total * sizeof(*owner));
    memset(owner, 0xff, total * sizeof(*owner));
    live = calloc(total, sizeof(*live));

    for (int round = 0; round < 6; round++) {
        /* Fill until the allocator says no, then free a random half. */
        for (;;) {
            struct t_alloc *t = &live[nlive];

            t->pages = t_size(&seed, 9);
            t->id = next_id++;
            if (alloc_take(a, t->pages, t->ext, 32, &t->n) != 0) {
                cr_assert_eq(t->n, 0);
                break;
            }
            cr_assert_eq(t_ext_pages(t->ext, t->n), t->pages);
            cr_assert(t_mark(owner, total, t, nlive), "extent outside the arena or overlapping");
            t_fill(alloc_base(a), t);
            nlive++;
        }
        cr_assert_lt(alloc_free_pages(a), 512, "filling stopped with %llu pages free",
                     (unsigned long long)alloc_free_pages(a));
        for (int i = 0; i < nlive; i++) {
            cr_assert(t_check(alloc_base(a), &live[i]), "allocation %llu was overwritten",
                      (unsigned long long)live[i].id);
        }
        for (int i = 0; i < nlive;) {
            if (t_rand(&seed) & 1) {
                t_mark(owner, total, &live[i], -1);
                alloc_give(a, live[i].ext, live[i].n);
                live[i] = live[--nlive];
            } else {
                i++;
            }
        }
        for (int i = 0; i < nlive; i++) {
            t_mark(owner, total, &live[i], -1);
            cr_assert(t_mark(owner, total, &live[i], i));
        }
    }
    for (int i = 0; i < nlive; i++) {
        alloc_give(a, live[i].ext, live[i].n);
    }
    cr_assert_eq(alloc_used_pages(a), 0);
    cr_assert_eq(alloc_largest_free(a), total);
    free(live);
    free(owner);
    alloc_destroy(a);
}

/*
 * Churn 4 KiB - 32 MiB requests up to 95% full. A take may fail only when
 * fewer pages are free than asked, or when the request truly needs more
 * than 32 extents (then a take with a larger cap succeeds, and the failed
 * one must have taken nothing). Such cap failures must stay rare.
 */
Test(alloc, mixed_sizes_under_churn_stay_usable)
{
    struct alloc *a;
    struct alloc_stats fresh;
    struct alloc_stats st;
    struct t_alloc *live;
    struct alloc_extent big[1024];
    uint64_t total;
    uint64_t seed = 7;
    uint64_t takes = 0;
    uint64_t cap_failures = 0;
    uint64_t min_largest = UINT64_MAX;
    uint64_t extents = 0;
    int nlive = 0;

    cr_assert_eq(alloc_create(256 * MiB, ALLOC_HUGE_AUTO, &a), 0);
    alloc_stats(a, &fresh);
    total = fresh.total_pages;
    live = calloc(total, sizeof(*live));

    for (int iter = 0; iter < 40000; iter++) {
        uint64_t used = alloc_used_pages(a);
        uint64_t want = t_size(&seed, 13);      /* up to 8192 pages = 32 MiB */

        if (nlive > 0 && (used + want > total * 95 / 100 || (t_rand(&seed) & 3) == 0)) {
            int i = (int)(t_rand(&seed) % (uint64_t)nlive);

            alloc_give(a, live[i].ext, live[i].n);
            live[i] = live[--nlive];
            continue;
        }
        struct t_alloc *t = &live[nlive];
        uint64_t free_before = alloc_free_pages(a);

        t->pages = want;
        takes++;
        if (alloc_take(a, want, t->ext, 32, &t->n) == 0) {
            cr_assert_eq(t_ext_pages(t->ext, t->n), want);
            extents += (uint64_t)t->n;
            nlive++;
        } else {
            int n;

            cr_assert_eq(alloc_free_pages(a), free_before, "a failed take kept pages");
            cr_assert_geq(free_before, want);
            cr_assert_eq(alloc_take(a, want, big, 1024, &n), 0,
                         "refused %llu pages with %llu free", (unsigned long long)want,
                         (unsigned long long)free_before);
            cr_assert_gt(n, 32, "refused although %d extents were enough", n);
            alloc_give(a, big, n);
            cap_failures++;
        }
        used = alloc_used_pages(a);
        if (used < total * 8 / 10) {
            continue;
        }
        uint64_t largest = alloc_largest_free(a);
        if (largest < min_largest) {
            min_largest = largest;
        }
    }
    cr_log_info("churn: %llu takes, %llu refused for the extent cap, %.2f extents per take, "
                "smallest largest-free block at >=80%% full: %llu pages",
                (unsigned long long)takes, (unsigned long long)cap_failures,
                (double)extents / (double)(takes - cap_failures), (unsigned long long)min_largest);
    cr_assert_leq(cap_failures * 1000, takes, "more than 0.1%% of takes hit the extent cap");

    for (int i = 0; i < nlive; i++) {
        alloc_give(a, live[i].ext, live[i].n);
    }
    alloc_stats(a, &st);
    cr_assert_eq(st.used_pages, 0);
    cr_assert_eq(memcmp(st.free_blocks, fresh.free_blocks, sizeof(st.free_blocks)), 0,
                 "the arena did not coalesce back after churn");
    free(live);
    alloc_destroy(a);
}

Test(alloc, failure_takes_nothing)
{
    struct alloc *a;
    struct alloc_extent ext[64];
    struct alloc_extent *one;
    int n;

    cr_assert_eq(alloc_create(4 * MiB, ALLOC_HUGE_AUTO, &a), 0);     /* 1024 pages */
    cr_assert_eq(alloc_take(a, 1014, ext, 32, &n), 0);
    cr_assert_eq(alloc_take(a, 11, ext + n, 32, &n), KV_NO_SPACE);
    cr_assert_eq(n, 0);
    cr_assert_eq(alloc_free_pages(a), 10);
    alloc_destroy(a);

    /* Every other page free: 512 pages free, but only as single pages. */
    cr_assert_eq(alloc_create(4 * MiB, ALLOC_HUGE_AUTO, &a), 0);
    one = calloc(1024, sizeof(*one));
    for (int i = 0; i < 1024; i++) {
        cr_assert_eq(alloc_take(a, 1, &one[i], 1, &n), 0);
    }
    for (int i = 0; i < 1024; i++) {
        if (one[i].page % 2 == 0) {
            alloc_give(a, &one[i], 1);
        }
    }
    cr_assert_eq(alloc_free_pages(a), 512);
    cr_assert_eq(alloc_largest_free(a), 1);
    cr_assert_eq(alloc_take(a, 33, ext, 32, &n), KV_NO_SPACE, "33 single pages exceed 32 extents");
    cr_assert_eq(n, 0);
    cr_assert_eq(alloc_free_pages(a), 512, "the refused take kept pages");
    cr_assert_eq(alloc_largest_free(a), 1);
    cr_assert_eq(alloc_take(a, 32, ext, 32, &n), 0);
    cr_assert_eq(n, 32);
    cr_assert_eq(alloc_take(a, 2, ext + 32, 0, &n), KV_NO_SPACE, "max 0 extents holds nothing");
    free(one);
    alloc_destroy(a);
}

Test(alloc, rejects_arena_under_one_page)
{
    struct alloc *a = (struct alloc *)&a;

    cr_assert_eq(alloc_create(0, ALLOC_HUGE_AUTO, &a), KV_INVALID_ARGUMENT);
    cr_assert_null(a);
    cr_assert_eq(alloc_create(ALLOC_PAGE_SIZE - 1, ALLOC_HUGE_AUTO, &a), KV_INVALID_ARGUMENT);
    cr_assert_eq(alloc_create(ALLOC_PAGE_SIZE, ALLOC_HUGE_AUTO, &a), 0);
    cr_assert_eq(alloc_total_pages(a), 1);
    alloc_destroy(a);
    alloc_destroy(NULL);
}

Test(alloc, double_give_aborts, .signal = SIGABRT)
{
    struct alloc *a;
    struct alloc_extent ext[32];
    int n;

    cr_assert_eq(alloc_create(1 * MiB, ALLOC_HUGE_AUTO, &a), 0);
    cr_assert_eq(alloc_take(a, 3, ext, 32, &n), 0);
    alloc_give(a, ext, n);
    alloc_give(a, ext, n);
}

struct t_thread {
    struct alloc *a;
    uint64_t seed;
    int ok;
};

static void *
t_churn_thread(void *arg)
{
    struct t_thread *th = arg;
    struct t_alloc live[16];
    int nlive = 0;

    th->ok = 1;
    for (int iter = 0; iter < 20000; iter++) {
        if (nlive == 16 || (nlive > 0 && (t_rand(&th->seed) & 1))) {
            int i = (int)(t_rand(&th->seed) % (uint64_t)nlive);

            if (!t_check(alloc_base(th->a), &live[i])) {
                th->ok = 0;
            }
            alloc_give(th->a, live[i].ext, live[i].n);
            live[i] = live[--nlive];
            continue;
        }
        live[nlive].pages = t_size(&th->seed, 6);
        live[nlive].id = th->seed;
        if (alloc_take(th->a, live[nlive].pages, live[nlive].ext, 32, &live[nlive].n) == 0) {
            t_fill(alloc_base(th->a), &live[nlive]);
            nlive++;
        }
    }
    for (int i = 0; i < nlive; i++) {
        if (!t_check(alloc_base(th->a), &live[i])) {
            th->ok = 0;
        }
        alloc_give(th->a, live[i].ext, live[i].n);
    }
    return NULL;
}

Test(alloc, threads_take_and_give_concurrently)
{
    struct alloc *a;
    struct t_thread th[4];
    pthread_t tid[4];

    cr_assert_eq(alloc_create(8 * MiB, ALLOC_HUGE_AUTO, &a), 0);     /* small: threads compete for pages */
    for (int i = 0; i < 4; i++) {
        th[i].a = a;
        th[i].seed = 0x9e3779b97f4a7c15ull * (uint64_t)(i + 1);
        cr_assert_eq(pthread_create(&tid[i], NULL, t_churn_thread, &th[i]), 0);
    }
    for (int i = 0; i < 4; i++) {
        pthread_join(tid[i], NULL);
        cr_assert(th[i].ok, "thread %d found its memory overwritten", i);
    }
    cr_assert_eq(alloc_used_pages(a), 0);
    cr_assert_eq(alloc_largest_free(a), alloc_total_pages(a));
    alloc_destroy(a);
}

/* t_wait_prefault: until the population has ended (30 s at most, a guard against a hang). */
static int
t_wait_prefault(struct alloc *a)
{
    for (int i = 0; i < 30000 && !alloc_prefault_done(a); i++) {
        usleep(1000);
    }
    return alloc_prefault_done(a);
}

/*
 * The population writes one word into each free page (so a host cannot share idle zero
 * pages), and never into a taken one: values stored before it runs stay byte-exact, and
 * afterwards every free page holds a non-zero word, the tail past the last whole stamp unit
 * included.
 */
Test(alloc, prefault_stamps_free_pages_only)
{
    struct alloc *a;
    struct t_alloc held[3] = {{.pages = 1, .id = 11}, {.pages = 37, .id = 12},
                              {.pages = 300, .id = 13}};
    uint8_t *taken;
    uint8_t *base;

    cr_assert_eq(alloc_create(8 * MiB + 3 * ALLOC_PAGE_SIZE, ALLOC_HUGE_OFF, &a), 0);
    base = alloc_base(a);
    for (int i = 0; i < 3; i++) {
        cr_assert_eq(alloc_take(a, held[i].pages, held[i].ext, 32, &held[i].n), 0);
        t_fill(base, &held[i]);
    }
    cr_assert_eq(alloc_prefault_start(a), 0);
    cr_assert(t_wait_prefault(a), "the population did not end in 30 s");
    cr_assert_eq(alloc_prefaulted(a), alloc_total_pages(a) * ALLOC_PAGE_SIZE);
    taken = calloc(alloc_total_pages(a), 1);
    cr_assert_not_null(taken);
    for (int i = 0; i < 3; i++) {
        cr_assert(t_check(base, &held[i]), "a taken extent was written by the population");
        for (int k = 0; k < held[i].n; k++) {
            memset(taken + held[i].ext[k].page, 1, 1ull << held[i].ext[k].order);
        }
    }
    for (uint64_t p = 0; p < alloc_total_pages(a); p++) {
        uint64_t w;

        memcpy(&w, base + (p << ALLOC_PAGE_SHIFT), sizeof(w));
        if (!taken[p]) {
            cr_assert_neq(w, 0, "free page %llu was not stamped", (unsigned long long)p);
        }
    }
    free(taken);
    alloc_destroy(a);
}

/* Threads take, fill, check and give pages while the population runs: no value is touched. */
Test(alloc, prefault_while_in_use_keeps_values)
{
    for (int round = 0; round < 10; round++) {
        struct alloc *a;
        struct t_thread th[2];
        pthread_t tid[2];

        cr_assert_eq(alloc_create(8 * MiB, ALLOC_HUGE_AUTO, &a), 0);
        for (int i = 0; i < 2; i++) {
            th[i].a = a;
            th[i].seed = 0x2545f4914f6cdd1dull * (uint64_t)(round * 2 + i + 1);
            cr_assert_eq(pthread_create(&tid[i], NULL, t_churn_thread, &th[i]), 0);
        }
        cr_assert_eq(alloc_prefault_start(a), 0);
        for (int i = 0; i < 2; i++) {
            pthread_join(tid[i], NULL);
            cr_assert(th[i].ok, "round %d: thread %d found its memory overwritten", round, i);
        }
        cr_assert(t_wait_prefault(a), "the population did not end in 30 s");
        alloc_destroy(a);
    }
}

/* ---- which pages back the arena (memory_hugepages) ---- */

/* t_sysfs_ll: a number from a sysfs file, or -1. */
static long long
t_sysfs_ll(const char *path)
{
    FILE *f = fopen(path, "re");
    long long v = -1;

    if (f != NULL) {
        if (fscanf(f, "%lld", &v) != 1) {
            v = -1;
        }
        fclose(f);
    }
    return v;
}

/* t_pool_room: 2 MiB hugetlb pages a new mapping could reserve now (-1: no pool). */
static long long
t_pool_room(void)
{
    long long f = t_sysfs_ll("/sys/kernel/mm/hugepages/hugepages-2048kB/free_hugepages");
    long long r = t_sysfs_ll("/sys/kernel/mm/hugepages/hugepages-2048kB/resv_hugepages");

    return f < 0 || r < 0 ? -1 : f - r;
}

/* t_hugetlb_kb: kB of hugetlb pages this process maps (HugetlbPages), or -1. */
static long long
t_hugetlb_kb(void)
{
    char line[256];
    long long kb = -1;
    FILE *f = fopen("/proc/self/status", "re");

    while (f != NULL && fgets(line, sizeof(line), f) != NULL) {
        if (sscanf(line, "HugetlbPages: %lld kB", &kb) == 1) {
            break;
        }
    }
    if (f != NULL) {
        fclose(f);
    }
    return kb;
}

/* t_thp_shmem: shmem transparent huge pages are enabled (not never, deny or absent). */
static bool
t_thp_shmem(void)
{
    char line[160] = "";
    FILE *f = fopen("/sys/kernel/mm/transparent_hugepage/shmem_enabled", "re");

    if (f != NULL) {
        if (fgets(line, sizeof(line), f) == NULL) {
            line[0] = '\0';
        }
        fclose(f);
    }
    return line[0] != '\0' && strstr(line, "[never]") == NULL && strstr(line, "[deny]") == NULL;
}

/* off: 4 KiB pages whatever the host offers, the exact size, a memfd to share. */
Test(alloc, hugepages_off_is_4k_pages)
{
    struct alloc *a;
    const char *why = NULL;

    cr_assert_eq(alloc_create(8 * MiB + 3 * ALLOC_PAGE_SIZE, ALLOC_HUGE_OFF, &a), 0);
    cr_assert_eq(alloc_backing(a, &why), ALLOC_BACKING_4K);
    cr_assert(why != NULL && strstr(why, "memory_hugepages off") != NULL, "why: %s", why);
    cr_assert_eq(alloc_total_pages(a), 2051);
    cr_assert_geq(alloc_fd(a), 0);
    alloc_destroy(a);
}

/*
 * With a hugetlb pool that has room, auto and on take it: the arena is whole 2 MiB pages
 * (memory_size rounded down), its memfd is sealed and maps the same bytes elsewhere (what a
 * shared-memory client does), the population covers it and stamps it, and values stored
 * before and during the population stay byte-exact.
 */
Test(alloc, hugetlb_pool_backs_the_arena)
{
    long long room = t_pool_room();
    struct alloc *a;
    struct t_alloc held = {.pages = 300, .id = 21};
    const char *why = NULL;
    uint8_t *base, *other;
    int fd, seals;

    if (room < 8) {
        cr_skip_test("no hugetlb pool with 8 free 2 MiB pages (%lld): reserve one with "
                     "`echo 64 > /proc/sys/vm/nr_hugepages` to run this test", room);
    }
    for (int mode = 0; mode < 2; mode++) {
        cr_assert_eq(alloc_create(8 * MiB + 3 * ALLOC_PAGE_SIZE,
                                  mode == 0 ? ALLOC_HUGE_AUTO : ALLOC_HUGE_ON, &a), 0);
        cr_assert_eq(alloc_backing(a, &why), ALLOC_BACKING_HUGETLB, "why: %s", why);
        cr_assert(strstr(why, "hugetlb") != NULL, "why: %s", why);
        cr_assert_eq(alloc_total_pages(a), 2048, "rounded down to whole 2 MiB pages");
        fd = alloc_fd(a);
        cr_assert_geq(fd, 0);
        seals = fcntl(fd, F_GET_SEALS);
        cr_assert(seals >= 0 && (seals & F_SEAL_SHRINK) && (seals & F_SEAL_GROW),
                  "the hugetlb memfd is sealed (%d)", seals);
        cr_assert_neq(ftruncate(fd, 2 * MiB), 0, "a sealed arena cannot shrink");
        base = alloc_base(a);
        cr_assert_eq(alloc_take(a, held.pages, held.ext, 32, &held.n), 0);
        t_fill(base, &held);
        cr_assert_eq(alloc_prefault_start(a), 0);
        cr_assert(t_wait_prefault(a), "the population did not end in 30 s");
        cr_assert_eq(alloc_prefaulted(a), 8 * MiB);
        cr_assert_eq(t_hugetlb_kb(), 8192, "the populated arena is 4 hugetlb pages (%lld kB)",
                     t_hugetlb_kb());
        cr_assert(t_check(base, &held), "a taken extent was written by the population");
        other = mmap(NULL, 8 * MiB, PROT_READ, MAP_SHARED, fd, 0);
        cr_assert_neq(other, MAP_FAILED, "mapping the hugetlb memfd again: %s", strerror(errno));
        cr_assert_eq(memcmp(other, base, 8 * MiB), 0, "the second mapping shows the arena");
        cr_assert_eq(munmap(other, 8 * MiB), 0);
        alloc_give(a, held.ext, held.n);
        alloc_destroy(a);
        cr_assert_eq(t_hugetlb_kb(), 0, "the pages went back to the pool");
    }
}

/* on without any huge pages: refused with KV_UNSUPPORTED and nothing made. */
Test(alloc, hugepages_on_refused_without_them)
{
    struct alloc *a = (struct alloc *)&a;

    if (t_pool_room() >= 4 || t_thp_shmem()) {
        cr_skip_test("this host has huge pages (a hugetlb pool with room or shmem THP "
                     "enabled): the refusal cannot be shown");
    }
    cr_assert_eq(alloc_create(8 * MiB, ALLOC_HUGE_ON, &a), KV_UNSUPPORTED);
    cr_assert_null(a);
    cr_assert_eq(alloc_create(8 * MiB, ALLOC_HUGE_AUTO, &a), 0, "auto falls back to 4 KiB");
    cr_assert_eq(alloc_backing(a, NULL), ALLOC_BACKING_4K);
    alloc_destroy(a);
}

/* t_tmpfs_dir: a fresh directory under /dev/shm (tmpfs), or skip the test saying why. */
static void
t_tmpfs_dir(char *dir, size_t len)
{
    snprintf(dir, len, "/dev/shm/kvstash-alloc-XXXXXX");
    if (mkdtemp(dir) == NULL) {
        cr_skip_test("no /dev/shm to make a directory in: %s", strerror(errno));
    }
}

Test(alloc, memory_file_is_shared_locked_and_kept_with_its_bytes)
{
    char dir[64], path[128];
    struct alloc *a, *b = NULL;
    uint64_t resident = 1;
    uint8_t *view;
    int rc;

    t_tmpfs_dir(dir, sizeof(dir));
    snprintf(path, sizeof(path), "%s/arena", dir);
    rc = alloc_create_file(8 * MiB, ALLOC_HUGE_AUTO, path, &a);
    if (rc == KV_INVALID_ARGUMENT) {
        rmdir(dir);
        cr_skip_test("/dev/shm is not a tmpfs on this host");
    }
    cr_assert_eq(rc, 0);
    cr_assert_not(alloc_file_reused(a, &resident), "a file made now is not reused");
    cr_assert_eq(alloc_backing(a, NULL), ALLOC_BACKING_4K);
    /* the descriptor clients get maps the same bytes */
    view = mmap(NULL, 8 * MiB, PROT_READ | PROT_WRITE, MAP_SHARED, alloc_fd(a), 0);
    cr_assert_neq(view, MAP_FAILED);
    memcpy((uint8_t *)alloc_base(a) + 5 * MiB, "kept", 4);
    cr_assert_eq(memcmp(view + 5 * MiB, "kept", 4), 0);
    munmap(view, 8 * MiB);
    /* a second arena on the file while the first lives is refused */
    cr_assert_eq(alloc_create_file(8 * MiB, ALLOC_HUGE_AUTO, path, &b), -EBUSY);
    cr_assert_null(b);
    alloc_destroy(a);

    cr_assert_eq(alloc_create_file(8 * MiB, ALLOC_HUGE_AUTO, path, &a), 0);
    cr_assert(alloc_file_reused(a, &resident), "the kept file of the arena's size is reused");
    cr_assert_geq(resident, ALLOC_PAGE_SIZE, "the page written before is resident");
    cr_assert_eq(alloc_free_pages(a), alloc_total_pages(a), "every page free at start");
    cr_assert_eq(memcmp((uint8_t *)alloc_base(a) + 5 * MiB, "kept", 4), 0,
                 "the file's bytes are not cleared");
    alloc_destroy(a);

    /* another size: resized, not reused */
    cr_assert_eq(alloc_create_file(4 * MiB, ALLOC_HUGE_AUTO, path, &a), 0);
    cr_assert_not(alloc_file_reused(a, NULL));
    cr_assert_eq(alloc_total_pages(a), 4 * MiB / ALLOC_PAGE_SIZE);
    /* tmpfs with memory_hugepages on: refused */
    alloc_destroy(a);
    cr_assert_eq(alloc_create_file(4 * MiB, ALLOC_HUGE_ON, path, &a), KV_UNSUPPORTED);
    cr_assert(access(path, F_OK) == 0, "a refusal never removes a file it did not make");
    unlink(path);
    rmdir(dir);
}
