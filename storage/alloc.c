/*
 * alloc: the arena mapping and a binary buddy allocator over its 4 KiB pages.
 * It owns the mapping, one mutex, and heap-side bookkeeping: per order a
 * hierarchical bitmap of free blocks (bit i of order k set = the block of
 * 2^k pages at page i << k is free), and one state byte per page marking the
 * first page of every taken block with its order so alloc_give can refuse a
 * double free. No bookkeeping is ever written into the arena itself (the
 * population writes one word into free pages only, see below). The bitmap
 * levels above the leaves summarise "some bit below is set", so finding the
 * lowest free block of an order is one count-trailing-zeros per level (at
 * most six for 2^32 pages) and setting or clearing a bit stops at the first
 * level that does not change. Bookkeeping costs about 1.3 bytes per page.
 *
 * The arena need not be a power of two pages: it is carved into maximal
 * aligned blocks, and a block's buddy that would reach past the end simply
 * never exists, so such blocks never merge. This module must not know about
 * objects or eviction.
 */
#include "alloc.h"

#include "alloc_file.h"
#include "clock.h"
#include "kverr.h"
#include "log.h"

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#define ALLOC_BM_LEVELS 6               /* 64^6 > 2^32 bits */
#define ALLOC_HUGE_ALIGN (2u << 20)     /* 2 MiB: x86-64 transparent huge page */
#define ALLOC_STATE_TAKEN 0x80u         /* state byte of a taken block's first page */

struct alloc_bitmap {
    uint64_t nbits;
    int nlevels;
    uint64_t *level[ALLOC_BM_LEVELS];   /* level[0] = leaves; the top level is one word */
};

struct alloc {
    pthread_mutex_t lock;
    uint8_t *base;                      /* the arena: map_len = npages * ALLOC_PAGE_SIZE bytes */
    int fd;                             /* the sealed memfd or the memory_file behind it, or -1 */
    bool has_file;                      /* backed by memory_file (file) */
    struct alloc_file file;             /* fd == file.fd then */
    uint64_t file_resident;             /* bytes of the file resident when it was mapped */
    size_t map_len;
    uint64_t npages;
    int max_order;                      /* largest order that fits in the arena */
    _Atomic uint64_t used;              /* written under lock, read without */
    uint64_t nfree[ALLOC_ORDERS];       /* free blocks per order */
    struct alloc_bitmap bm[ALLOC_ORDERS];
    uint64_t *words;                    /* every bitmap level of every order, one calloc */
    uint8_t *state;                     /* one byte per page */
    uint64_t metadata_bytes;
    enum alloc_backing backing;         /* which pages back the arena (alloc_back) */
    char backing_why[512];              /* the log's sentence for it */
    pthread_t prefault_thread;          /* populates the arena's page tables in the background */
    int prefault_started;
    _Atomic int prefault_stop;
    _Atomic uint64_t prefaulted;        /* bytes populated so far */
    _Atomic int prefault_done;          /* the thread has ended (done, stopped or failed) */
};

/* ---- hierarchical bitmap ---- */

static uint64_t
alloc_bm_words(uint64_t nbits, int *nlevels)
{
    uint64_t total = 0;
    int levels = 0;

    do {
        nbits = (nbits + 63) / 64;
        total += nbits;
        levels++;
    } while (nbits > 1);
    *nlevels = levels;
    return total;
}

static void
alloc_bm_set(struct alloc_bitmap *bm, uint64_t i)
{
    for (int l = 0; l < bm->nlevels; l++) {
        uint64_t w = i >> 6;
        uint64_t old = bm->level[l][w];

        bm->level[l][w] = old | (1ull << (i & 63));
        if (old != 0) {
            return;                     /* the levels above already say "non-empty" */
        }
        i = w;
    }
}

static void
alloc_bm_clear(struct alloc_bitmap *bm, uint64_t i)
{
    for (int l = 0; l < bm->nlevels; l++) {
        uint64_t w = i >> 6;

        bm->level[l][w] &= ~(1ull << (i & 63));
        if (bm->level[l][w] != 0) {
            return;
        }
        i = w;
    }
}

static int
alloc_bm_test(const struct alloc_bitmap *bm, uint64_t i)
{
    return (bm->level[0][i >> 6] >> (i & 63)) & 1;
}

/* alloc_bm_first: the lowest set bit; the caller knows the bitmap is not empty. */
static uint64_t
alloc_bm_first(const struct alloc_bitmap *bm)
{
    uint64_t i = 0;

    for (int l = bm->nlevels - 1; l >= 0; l--) {
        i = (i << 6) | (uint64_t)__builtin_ctzll(bm->level[l][i]);
    }
    return i;
}

/* ---- buddy blocks (all under a->lock) ---- */

static void
alloc_block_free_locked(struct alloc *a, uint64_t page, int order)
{
    alloc_bm_set(&a->bm[order], page >> order);
    a->nfree[order]++;
}

static void
alloc_block_unfree_locked(struct alloc *a, uint64_t page, int order)
{
    alloc_bm_clear(&a->bm[order], page >> order);
    a->nfree[order]--;
}

static int
alloc_largest_order_locked(const struct alloc *a)
{
    for (int o = a->max_order; o >= 0; o--) {
        if (a->nfree[o] != 0) {
            return o;
        }
    }
    return -1;
}

/*
 * alloc_block_take_locked: take the lowest free block of the smallest order
 * >= order, splitting it down to `order` (upper halves go back as free
 * blocks). Returns its first page; the caller checked that such a block exists.
 */
static uint64_t
alloc_block_take_locked(struct alloc *a, int order)
{
    int o = order;
    uint64_t page;

    while (a->nfree[o] == 0) {
        o++;
    }
    page = alloc_bm_first(&a->bm[o]) << o;
    alloc_block_unfree_locked(a, page, o);
    while (o > order) {
        o--;
        alloc_block_free_locked(a, page + (1ull << o), o);
    }
    a->state[page] = (uint8_t)(ALLOC_STATE_TAKEN | (unsigned)order);
    return page;
}

static void
alloc_block_give_locked(struct alloc *a, uint64_t page, int order)
{
    if (order > a->max_order || page >= a->npages || (page & ((1ull << order) - 1)) != 0
        || a->state[page] != (uint8_t)(ALLOC_STATE_TAKEN | (unsigned)order)) {
        fprintf(stderr, "alloc_give: extent page %llu order %d is not taken (double free?)\n",
                (unsigned long long)page, order);
        abort();
    }
    a->state[page] = 0;
    while (order < a->max_order) {
        uint64_t buddy = page ^ (1ull << order);

        if (buddy + (1ull << order) > a->npages || !alloc_bm_test(&a->bm[order], buddy >> order)) {
            break;
        }
        alloc_block_unfree_locked(a, buddy, order);
        page &= ~(1ull << order);
        order++;
    }
    alloc_block_free_locked(a, page, order);
}

/* ---- mapping ---- */

/*
 * alloc_memfd: a sealed memfd of len bytes to back the arena, or -1 (the
 * arena is then private memory and cannot be shared). The seals keep its
 * size fixed for good, so no one holding the descriptor can shrink it under
 * the daemon's feet (which would make the daemon's own accesses SIGBUS).
 * flags adds MFD_HUGETLB (and its page size); len is then whole huge pages.
 */
static int
alloc_memfd(uint64_t len, unsigned int flags)
{
    int fd = memfd_create("kvstash-arena", MFD_CLOEXEC | MFD_ALLOW_SEALING | flags);

    if (fd < 0) {
        return -1;
    }
    if (ftruncate(fd, (off_t)len) != 0
        || fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) != 0) {
        close(fd);
        return -1;
    }
    return fd;
}

/*
 * alloc_map: map the arena at a 2 MiB-aligned address (so the kernel can
 * back it with huge pages), shared from a memfd when one can be made, else
 * private anonymous memory.
 */
static int
alloc_map(struct alloc *a, uint64_t len)
{
    size_t slack_len = (size_t)len + ALLOC_HUGE_ALIGN;
    uint8_t *map = mmap(NULL, slack_len, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
                        -1, 0);
    uint8_t *start = NULL;
    int flags = a->fd >= 0 ? MAP_SHARED : MAP_PRIVATE | MAP_ANONYMOUS;

    if (map != MAP_FAILED) {
        uintptr_t s = ((uintptr_t)map + ALLOC_HUGE_ALIGN - 1) & ~(uintptr_t)(ALLOC_HUGE_ALIGN - 1);
        size_t head = s - (uintptr_t)map;
        size_t tail = slack_len - head - (size_t)len;

        if (head != 0) {
            munmap(map, head);
        }
        if (tail != 0) {
            munmap((uint8_t *)s + len, tail);
        }
        start = (uint8_t *)s;
        flags |= MAP_FIXED;
    }
    /* Over the reservation when there is one; else anywhere (the slack was what did not fit). */
    a->base = mmap(start, (size_t)len, PROT_READ | PROT_WRITE, flags, a->fd, 0);
    if (a->base == MAP_FAILED) {
        int err = errno != 0 ? errno : ENOMEM;

        a->base = NULL;
        if (start != NULL) {
            munmap(start, (size_t)len);
        }
        return -err;
    }
    a->map_len = (size_t)len;
    return 0;
}

#ifndef MFD_HUGETLB
#define MFD_HUGETLB 0x0004u
#endif
#define ALLOC_MFD_HUGE_2MB (21u << 26)  /* MFD_HUGE_2MB of linux/memfd.h: log2(2 MiB) << 26 */
#define ALLOC_POOL_DIR "/sys/kernel/mm/hugepages/hugepages-2048kB/"
#define ALLOC_THP_DIR "/sys/kernel/mm/transparent_hugepage/"

/* alloc_sysfs_read: the first line of a sysfs file into buf (no newline); false if unreadable. */
static bool
alloc_sysfs_read(const char *path, char *buf, size_t len)
{
    FILE *f = fopen(path, "re");
    bool ok = f != NULL && fgets(buf, (int)len, f) != NULL;

    if (f != NULL) {
        fclose(f);
    }
    if (!ok) {
        buf[0] = '\0';
        return false;
    }
    buf[strcspn(buf, "\n")] = '\0';
    return true;
}

/*
 * alloc_pool_room: 2 MiB pages of the hugetlb pool that a new mapping can reserve (free
 * minus reserved by other mappings), or -1 when the kernel has no such pool.
 */
static long long
alloc_pool_room(void)
{
    char f[32], r[32];

    if (!alloc_sysfs_read(ALLOC_POOL_DIR "free_hugepages", f, sizeof(f))
        || !alloc_sysfs_read(ALLOC_POOL_DIR "resv_hugepages", r, sizeof(r))) {
        return -1;
    }
    return strtoll(f, NULL, 10) - strtoll(r, NULL, 10);
}

/*
 * alloc_cgroup_hugetlb: the hugetlb limit of this process's cgroup for 2 MiB pages, in bytes
 * (cgroup v2 hugetlb.2MB.max, v1 hugetlb.2MB.limit_in_bytes), or UINT64_MAX when none is
 * set or readable. The limit is charged when a page is first faulted, so an arena over it
 * would take SIGBUS later: such an arena is not made on hugetlb pages.
 */
static uint64_t
alloc_cgroup_hugetlb(void)
{
    char line[512], path[640], val[64];
    uint64_t limit = UINT64_MAX;
    FILE *f = fopen("/proc/self/cgroup", "re");

    while (f != NULL && fgets(line, sizeof(line), f) != NULL) {
        char *rel = NULL;

        line[strcspn(line, "\n")] = '\0';
        if (strncmp(line, "0::", 3) == 0) {
            rel = line + 3;
            snprintf(path, sizeof(path), "/sys/fs/cgroup%s/hugetlb.2MB.max", rel);
        } else if ((rel = strstr(line, ":hugetlb:")) != NULL) {
            rel += strlen(":hugetlb:");
            snprintf(path, sizeof(path), "/sys/fs/cgroup/hugetlb%s/hugetlb.2MB.limit_in_bytes",
                     rel);
        } else {
            continue;
        }
        if (alloc_sysfs_read(path, val, sizeof(val)) && val[0] >= '0' && val[0] <= '9') {
            uint64_t v = strtoull(val, NULL, 10);

            limit = v < limit ? v : limit;
        }
    }
    if (f != NULL) {
        fclose(f);
    }
    return limit;
}

/*
 * alloc_thp_mode: the selected word ("[advise]") of the THP setting that applies to the
 * arena (shmem_enabled for a memfd, enabled for private memory) into buf; true when it lets
 * MADV_HUGEPAGE memory have huge pages (always, within_size, advise, force).
 */
static bool
alloc_thp_mode(bool shmem, char *buf, size_t len)
{
    char line[160];
    const char *open_b, *close_b;

    snprintf(buf, len, "unavailable");
    if (!alloc_sysfs_read(shmem ? ALLOC_THP_DIR "shmem_enabled" : ALLOC_THP_DIR "enabled", line,
                          sizeof(line))) {
        return false;
    }
    open_b = strchr(line, '[');
    close_b = open_b != NULL ? strchr(open_b, ']') : NULL;
    if (close_b == NULL) {
        return false;
    }
    snprintf(buf, len, "%.*s", (int)(close_b - open_b - 1), open_b + 1);
    return strcmp(buf, "never") != 0 && strcmp(buf, "deny") != 0;
}

/*
 * alloc_resident: bytes of the arena's mapping whose pages are resident (mincore: for a
 * shared file mapping, the file's pages in memory), counted 64 MiB at a time.
 */
static uint64_t
alloc_resident(const struct alloc *a)
{
    unsigned char vec[16384];           /* 64 MiB of 4 KiB pages */
    const size_t chunk = sizeof(vec) << ALLOC_PAGE_SHIFT;
    uint64_t pages = 0;

    for (size_t off = 0; off < a->map_len; off += chunk) {
        size_t len = a->map_len - off < chunk ? a->map_len - off : chunk;

        if (mincore(a->base + off, len, vec) != 0) {
            return 0;
        }
        for (size_t i = 0; i < len >> ALLOC_PAGE_SHIFT; i++) {
            pages += vec[i] & 1;
        }
    }
    return pages << ALLOC_PAGE_SHIFT;
}

/*
 * alloc_back_file: the arena on memory_file (alloc_file.h): on hugetlbfs 2 MiB pages (the
 * pool's; memory_hugepages off refuses); on tmpfs the page cache's pages, transparent huge
 * ones where the mount's huge= option (or shmem_enabled force) gives them and `huge` is not
 * off, advised MADV_HUGEPAGE (which huge=advise needs), else 4 KiB pages (memory_hugepages on
 * refuses). The mapping of a hugetlbfs file reserves the pool's pages its file lacks.
 * Measured here: a resident 4 GiB tmpfs file of 4 KiB pages maps at 0.9 GB/s by write faults
 * (one per page), 3.3 GB/s by MADV_POPULATE_READ (fault-around); the same file on a huge=always
 * tmpfs maps in 0.02 s, and its memset then runs at 23-26 GB/s against 8-12.
 */
static int
alloc_back_file(struct alloc *a, uint64_t npages, enum alloc_huge huge, const char *path)
{
    uint64_t len = npages << ALLOC_PAGE_SHIFT;
    uint64_t cg = alloc_cgroup_hugetlb();
    char glob[32] = "", pages[200] = "";
    const char *mnt = "";
    bool thp = false;
    int rc = alloc_file_open(path, &len, &a->file);

    if (rc != 0) {
        return rc;
    }
    a->has_file = true;
    a->fd = a->file.fd;
    if (a->file.kind == ALLOC_FILE_HUGETLBFS && huge == ALLOC_HUGE_OFF) {
        log_error("memory_file %s is on hugetlbfs (2 MiB pages), but memory_hugepages is off: "
                  "set memory_hugepages auto or on, or put the file on tmpfs", path);
        return KV_INVALID_ARGUMENT;
    }
    if (a->file.kind == ALLOC_FILE_TMPFS) {
        /* shmem_enabled deny and force override every mount's huge= (mm/transhuge.rst) */
        (void)alloc_thp_mode(true, glob, sizeof(glob));
        mnt = a->file.tmpfs_huge;
        thp = huge != ALLOC_HUGE_OFF && strcmp(glob, "deny") != 0
              && (strcmp(glob, "force") == 0 || strcmp(mnt, "always") == 0
                  || strcmp(mnt, "within_size") == 0 || strcmp(mnt, "advise") == 0);
        if (huge == ALLOC_HUGE_ON && !thp) {
            log_error("memory_file %s is on a tmpfs mount without huge pages (huge=%s, "
                      "shmem_enabled %s), but memory_hugepages is on: mount a tmpfs with "
                      "huge=within_size for the file, or put it on hugetlbfs", path, mnt, glob);
            return KV_UNSUPPORTED;
        }
    }
    if (a->file.kind == ALLOC_FILE_HUGETLBFS && cg < len) {
        log_error("memory_file %s: this cgroup's hugetlb limit (%llu MiB) is under the arena's "
                  "%llu MiB", path, (unsigned long long)(cg >> 20),
                  (unsigned long long)(len >> 20));
        return KV_NO_SPACE;
    }
    rc = alloc_map(a, len);
    if (rc != 0) {
        log_error("memory_file %s: mapping %llu MiB failed: %s%s", path,
                  (unsigned long long)(len >> 20), strerror(-rc),
                  a->file.kind == ALLOC_FILE_HUGETLBFS && rc == -ENOMEM
                      ? " (the hugetlb pool lacks the pages the file does not hold yet: "
                        "sysctl vm.nr_hugepages)"
                      : "");
        return rc;
    }
    a->npages = len >> ALLOC_PAGE_SHIFT;
#if defined(MADV_NOHUGEPAGE) && defined(MADV_HUGEPAGE)
    if (a->file.kind == ALLOC_FILE_TMPFS) {
        (void)madvise(a->base, a->map_len, thp ? MADV_HUGEPAGE : MADV_NOHUGEPAGE);
    }
#endif
    a->file_resident = alloc_resident(a);
    a->backing = a->file.kind == ALLOC_FILE_HUGETLBFS ? ALLOC_BACKING_HUGETLB
                 : thp                                ? ALLOC_BACKING_THP
                                                      : ALLOC_BACKING_4K;
    if (a->file.kind == ALLOC_FILE_TMPFS) {
        snprintf(pages, sizeof(pages), "; its mount's huge=%s, shmem_enabled %s%s", mnt, glob,
                 thp || huge == ALLOC_HUGE_OFF ? ""
                                               : ": a tmpfs mounted with huge=within_size gives "
                                                 "2 MiB pages");
    }
    snprintf(a->backing_why, sizeof(a->backing_why),
             "%s of the %s file %s (memory_file, %s; %llu of %llu MiB resident%s)",
             a->backing == ALLOC_BACKING_HUGETLB ? "hugetlb pages of 2 MiB"
             : thp                               ? "transparent huge pages"
                                                 : "4 KiB pages",
             a->file.kind == ALLOC_FILE_HUGETLBFS ? "hugetlbfs" : "tmpfs", path,
             a->file.created  ? "created"
             : a->file.reused ? "reused: the previous run's pages"
                              : "resized",
             (unsigned long long)(a->file_resident >> 20), (unsigned long long)(len >> 20),
             pages);
    return 0;
}

/*
 * alloc_back: make and map the arena for npages 4 KiB pages as `huge` says (alloc.h,
 * alloc_create), setting fd, base, map_len, npages, backing and backing_why. A hugetlb arena
 * is npages rounded down to whole 2 MiB pages; its mmap reserves them from the pool (fails
 * with ENOMEM when another process took them since the pool was read: then shmem).
 */
static int
alloc_back(struct alloc *a, uint64_t npages, enum alloc_huge huge)
{
    const uint64_t per_huge = ALLOC_HUGE_PAGE_SIZE >> ALLOC_PAGE_SHIFT;
    uint64_t hpages = npages / per_huge;
    long long room = alloc_pool_room();
    uint64_t cg = alloc_cgroup_hugetlb();
    char pool[160], thp[32];
    bool thp_on;
    int rc;

    if (room < 0) {
        snprintf(pool, sizeof(pool), "this kernel has no 2 MiB hugetlb pool");
    } else {
        snprintf(pool, sizeof(pool), "the hugetlb pool has %lld free 2 MiB pages of %llu needed",
                 room, (unsigned long long)hpages);
    }
    if (room >= (long long)hpages && cg < hpages * ALLOC_HUGE_PAGE_SIZE) {
        snprintf(pool, sizeof(pool), "this cgroup's hugetlb limit (%llu MiB) is under the "
                 "arena's %llu MiB", (unsigned long long)(cg >> 20),
                 (unsigned long long)(hpages * ALLOC_HUGE_PAGE_SIZE >> 20));
        room = -2;      /* not taken: faults past the limit would be SIGBUS */
    }
    if (huge != ALLOC_HUGE_OFF && hpages > 0 && room >= (long long)hpages) {
        a->fd = alloc_memfd(hpages * ALLOC_HUGE_PAGE_SIZE, MFD_HUGETLB | ALLOC_MFD_HUGE_2MB);
        rc = a->fd >= 0 ? alloc_map(a, hpages * ALLOC_HUGE_PAGE_SIZE) : -errno;
        if (rc == 0) {
            a->npages = hpages * per_huge;
            a->backing = ALLOC_BACKING_HUGETLB;
            snprintf(a->backing_why, sizeof(a->backing_why),
                     "hugetlb pages of 2 MiB: %llu reserved from the pool, which had %lld free",
                     (unsigned long long)hpages, room);
            return 0;
        }
        snprintf(pool, sizeof(pool), "a hugetlb arena of %llu 2 MiB pages failed: %s",
                 (unsigned long long)hpages, strerror(-rc));
        if (a->fd >= 0) {
            close(a->fd);
            a->fd = -1;
        }
    } else if (hpages == 0) {
        snprintf(pool, sizeof(pool), "the arena is under one 2 MiB page");
    }

    a->fd = alloc_memfd(npages << ALLOC_PAGE_SHIFT, 0);
    rc = alloc_map(a, npages << ALLOC_PAGE_SHIFT);
    if (rc != 0) {
        return rc;
    }
    a->npages = npages;
    if (huge == ALLOC_HUGE_OFF) {
#ifdef MADV_NOHUGEPAGE
        (void)madvise(a->base, a->map_len, MADV_NOHUGEPAGE);
#endif
        snprintf(a->backing_why, sizeof(a->backing_why), "4 KiB pages (memory_hugepages off)");
        return 0;
    }
    thp_on = alloc_thp_mode(a->fd >= 0, thp, sizeof(thp));
#ifdef MADV_HUGEPAGE
    if (thp_on && madvise(a->base, a->map_len, MADV_HUGEPAGE) == 0) {
        a->backing = ALLOC_BACKING_THP;
        snprintf(a->backing_why, sizeof(a->backing_why),
                 "transparent huge pages (MADV_HUGEPAGE, %s THP %s): %s",
                 a->fd >= 0 ? "shmem" : "anonymous", thp, pool);
        return 0;
    }
#endif
    snprintf(a->backing_why, sizeof(a->backing_why),
             "4 KiB pages: %s (reserve them: sysctl vm.nr_hugepages), and %s transparent huge "
             "pages are %s (" ALLOC_THP_DIR "%s)", pool, a->fd >= 0 ? "shmem" : "anonymous",
             thp, a->fd >= 0 ? "shmem_enabled" : "enabled");
    if (huge == ALLOC_HUGE_ON) {
        log_error("alloc: memory_hugepages on, but no huge pages for the arena: %s",
                  a->backing_why + strlen("4 KiB pages: "));
        return KV_UNSUPPORTED;
    }
    return 0;
}

/* ---- public ---- */

int
alloc_create(uint64_t size, enum alloc_huge huge, struct alloc **out)
{
    return alloc_create_file(size, huge, NULL, out);
}

int
alloc_create_file(uint64_t size, enum alloc_huge huge, const char *path, struct alloc **out)
{
    struct alloc *a;
    uint64_t npages = size >> ALLOC_PAGE_SHIFT;
    uint64_t nwords = 0;
    uint64_t *w;
    int rc;

    *out = NULL;
    if (npages == 0 || npages > ALLOC_MAX_PAGES || npages > SIZE_MAX >> ALLOC_PAGE_SHIFT) {
        return KV_INVALID_ARGUMENT;
    }
    a = calloc(1, sizeof(*a));
    if (a == NULL) {
        return -ENOMEM;
    }
    a->fd = -1;
    a->file.fd = -1;
    a->file.lock_fd = -1;
    rc = pthread_mutex_init(&a->lock, NULL);
    if (rc != 0) {
        free(a);
        return -rc;
    }
    /* The mapping first: a hugetlb arena is whole 2 MiB pages, which sets npages. */
    rc = path != NULL && path[0] != '\0' ? alloc_back_file(a, npages, huge, path)
                                          : alloc_back(a, npages, huge);
    if (rc != 0) {
        if (a->has_file) {          /* a file made for this failed start goes */
            alloc_file_close(&a->file, true);
            a->fd = -1;
        }
        goto fail;
    }
    npages = a->npages;
    a->max_order = 63 - __builtin_clzll(npages);
    if (a->max_order > ALLOC_ORDERS - 1) {
        a->max_order = ALLOC_ORDERS - 1;
    }

    for (int o = 0; o <= a->max_order; o++) {
        a->bm[o].nbits = npages >> o;
        nwords += alloc_bm_words(a->bm[o].nbits, &a->bm[o].nlevels);
    }
    a->words = calloc(nwords, sizeof(uint64_t));
    a->state = calloc(npages, 1);
    if (a->words == NULL || a->state == NULL) {
        rc = -ENOMEM;
        goto fail;
    }
    a->metadata_bytes = sizeof(*a) + nwords * sizeof(uint64_t) + npages;
    w = a->words;
    for (int o = 0; o <= a->max_order; o++) {
        uint64_t nbits = a->bm[o].nbits;

        for (int l = 0; l < a->bm[o].nlevels; l++) {
            nbits = (nbits + 63) / 64;
            a->bm[o].level[l] = w;
            w += nbits;
        }
    }

    /* Carve the arena into maximal aligned blocks. */
    for (uint64_t page = 0; page < npages;) {
        int o = a->max_order;

        while ((page & ((1ull << o) - 1)) != 0 || page + (1ull << o) > npages) {
            o--;
        }
        alloc_block_free_locked(a, page, o);
        page += 1ull << o;
    }
    *out = a;
    return 0;

fail:
    alloc_destroy(a);
    return rc;
}

enum alloc_backing
alloc_backing(const struct alloc *a, const char **why)
{
    if (why != NULL) {
        *why = a->backing_why;
    }
    return a->backing;
}

/* ---- prefault ---- */

#ifndef MADV_POPULATE_READ
#define MADV_POPULATE_READ 22  /* Linux 5.14 */
#endif
#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23 /* Linux 5.14 */
#endif
#define ALLOC_PREFAULT_CHUNK (64ull << 20)
#define ALLOC_STAMP_ORDER 6             /* stamp 64 pages (256 KiB) per hold of the mutex */
#define ALLOC_STAMP_MAGIC 0x6b7673746173685full /* "kvstash_"; the page number is xored in */

/* alloc_sub_free_locked: the aligned block (page, order) is free, or free blocks inside it
 * cover every page of it (looking at its own order and below only). */
static bool
alloc_sub_free_locked(const struct alloc *a, uint64_t page, int order)
{
    if (page + (1ull << order) > a->npages) {
        return false;   /* reaches past the end: such a block never exists */
    }
    if (alloc_bm_test(&a->bm[order], page >> order)) {
        return true;
    }
    if (order == 0) {
        return false;
    }
    return alloc_sub_free_locked(a, page, order - 1)
        && alloc_sub_free_locked(a, page + (1ull << (order - 1)), order - 1);
}

/*
 * alloc_page_free_locked: page is free: some free block of any order holds it. Used for the
 * pages past the last whole stamp unit only.
 */
static bool
alloc_page_free_locked(const struct alloc *a, uint64_t page)
{
    for (int o = 0; o <= a->max_order; o++) {
        uint64_t first = page & ~((1ull << o) - 1);

        if (first + (1ull << o) <= a->npages && alloc_bm_test(&a->bm[o], first >> o)) {
            return true;
        }
    }
    return false;
}

/*
 * alloc_unit_free_locked: every page of the aligned unit (page, order) is free: a free block
 * of the unit's order or above contains it, or free blocks inside it cover it.
 */
static bool
alloc_unit_free_locked(const struct alloc *a, uint64_t page, int order)
{
    for (int o = order + 1; o <= a->max_order; o++) {
        uint64_t first = page & ~((1ull << o) - 1);

        if (first + (1ull << o) <= a->npages && alloc_bm_test(&a->bm[o], first >> o)) {
            return true;
        }
    }
    return alloc_sub_free_locked(a, page, order);
}

/*
 * alloc_stamp_chunk: write one distinct non-zero word into each free page of
 * [first, first + n) through the arena mapping, a stamp unit at a time under the mutex (a
 * page taken meanwhile is skipped: its owner writes it anyway). Pages taken are never
 * written, so the arena may be in use.
 */
static void
alloc_stamp_chunk(struct alloc *a, uint64_t first, uint64_t n)
{
    const uint64_t unit = 1ull << ALLOC_STAMP_ORDER;

    for (uint64_t p = first; p < first + n; p += unit) {
        uint64_t end = p + unit < first + n ? p + unit : first + n;
        bool whole = end - p == unit && (p & (unit - 1)) == 0;

        pthread_mutex_lock(&a->lock);
        if (whole && alloc_unit_free_locked(a, p, ALLOC_STAMP_ORDER)) {
            for (uint64_t q = p; q < end; q++) {
                *(volatile uint64_t *)(a->base + (q << ALLOC_PAGE_SHIFT)) = ALLOC_STAMP_MAGIC ^ q;
            }
        } else {
            for (uint64_t q = p; q < end; q++) {
                if (alloc_page_free_locked(a, q)) {
                    *(volatile uint64_t *)(a->base + (q << ALLOC_PAGE_SHIFT)) =
                        ALLOC_STAMP_MAGIC ^ q;
                }
            }
        }
        pthread_mutex_unlock(&a->lock);
    }
}

/*
 * alloc_pmd_mapped: bytes of the arena's mapping mapped with 2 MiB page-table entries, from
 * its block of /proc/self/smaps (AnonHugePages, ShmemPmdMapped, FilePmdMapped), or -1.
 */
static long long
alloc_pmd_mapped(const struct alloc *a)
{
    char line[256], head[32];
    long long kb = 0, v;
    bool in = false, found = false;
    FILE *f = fopen("/proc/self/smaps", "re");

    if (f == NULL) {
        return -1;
    }
    snprintf(head, sizeof(head), "%lx-", (unsigned long)(uintptr_t)a->base);
    while (fgets(line, sizeof(line), f) != NULL) {
        if (strncmp(line, head, strlen(head)) == 0) {
            in = found = true;
            continue;
        }
        if (!in) {
            continue;
        }
        if (strspn(line, "0123456789abcdef") > 0 && line[strspn(line, "0123456789abcdef")] == '-') {
            break;      /* the next mapping's header (field names start with a capital) */
        }
        if ((sscanf(line, "AnonHugePages: %lld", &v) == 1
                   || sscanf(line, "ShmemPmdMapped: %lld", &v) == 1
                   || sscanf(line, "FilePmdMapped: %lld", &v) == 1)) {
            kb += v;
        }
    }
    fclose(f);
    return found ? kb * 1024 : -1;
}

/*
 * Populating the page tables is not enough on a virtual machine whose host dedups pages of
 * zeros (measured here: pages populated with MADV_POPULATE_WRITE and left idle for two
 * minutes took 1-2 GB/s of non-temporal stores on their first write, against 15-20 GB/s on
 * the second, with no guest page fault; pages holding a distinct non-zero word did not slow
 * down). A zeroed page is shareable by content, so the host merges it and the guest's first
 * write takes a copy-on-write fault in the host, invisible from here. So each free page gets
 * one distinct word (its number) through this mapping, the one the copies use; once a page
 * holds data of its own it stays unshared. MADV_POPULATE_WRITE first does the guest's side
 * (the fault and the zeroing) outside the allocator's mutex; chunks keep a stop prompt.
 * KVSTASH_TEST_PREFAULT_PAUSE_MS (tests only) sleeps that long before each chunk, so a test
 * can watch the population under way.
 */
static void *
alloc_prefault_main(void *arg)
{
    struct alloc *a = arg;
    const char *pause_env = getenv("KVSTASH_TEST_PREFAULT_PAUSE_MS");
    long pause_ms = pause_env != NULL ? strtol(pause_env, NULL, 10) : 0;
    uint64_t t0 = clock_ms();
    /* A tmpfs memory_file: read faults map the file's resident pages 16 at a time (fault
     * around; writable, as shmem needs no write notification), write faults one at a time. */
    int advice = a->has_file && a->file.kind == ALLOC_FILE_TMPFS ? MADV_POPULATE_READ
                                                                 : MADV_POPULATE_WRITE;

    if (pause_ms < 0 || pause_ms > 60000) {
        pause_ms = 0;
    }
    for (size_t off = 0; off < a->map_len; off += ALLOC_PREFAULT_CHUNK) {
        size_t len = a->map_len - off < ALLOC_PREFAULT_CHUNK ? a->map_len - off
                                                              : ALLOC_PREFAULT_CHUNK;
        for (long slept = 0; slept < pause_ms; slept += 10) {
            if (atomic_load_explicit(&a->prefault_stop, memory_order_relaxed)) {
                break;
            }
            usleep(10000);
        }
        if (atomic_load_explicit(&a->prefault_stop, memory_order_relaxed)) {
            break;
        }
        if (madvise(a->base + off, len, advice) != 0 && errno != EINVAL) {
            log_warn("alloc: populating the arena stopped at %zu of %zu MiB: %s; the rest "
                     "faults in on first use", off >> 20, a->map_len >> 20, strerror(errno));
            break; /* no memory: pages fault in on first use instead */
        }
        /* EINVAL: a kernel before 5.14; the stamps below fault the pages in themselves. */
        alloc_stamp_chunk(a, off >> ALLOC_PAGE_SHIFT, len >> ALLOC_PAGE_SHIFT);
        atomic_store_explicit(&a->prefaulted, off + len, memory_order_relaxed);
    }
    if (atomic_load_explicit(&a->prefaulted, memory_order_relaxed) == a->map_len
        && clock_ms() - t0 >= 1000) {         /* worth a line: small arenas (tests) stay quiet */
        uint64_t ms = clock_ms() - t0;

        log_info("alloc: arena of %zu MiB populated in %llu ms (%.2f GB/s)", a->map_len >> 20,
                 (unsigned long long)ms, ms > 0 ? (double)a->map_len / 1e6 / (double)ms : 0.0);
    }
    if (a->backing == ALLOC_BACKING_THP
        && atomic_load_explicit(&a->prefaulted, memory_order_relaxed) == a->map_len) {
        long long huge = alloc_pmd_mapped(a);

        if (huge >= 0 && (uint64_t)huge < a->map_len) {
            /* transparent huge pages are best effort: 4 KiB ones where no 2 MiB block was free */
            log_info("alloc: %lld of the arena's %zu MiB are mapped as 2 MiB pages, the rest as "
                     "4 KiB pages (no free 2 MiB block when they were allocated, or a last "
                     "part under 2 MiB)", huge >> 20, a->map_len >> 20);
        }
    }
    atomic_store_explicit(&a->prefault_done, 1, memory_order_release);
    return NULL;
}

int
alloc_prefault_start(struct alloc *a)
{
    int rc;

    if (a->prefault_started) {
        return 0;
    }
    rc = pthread_create(&a->prefault_thread, NULL, alloc_prefault_main, a);
    if (rc != 0) {
        atomic_store_explicit(&a->prefault_done, 1, memory_order_release);
        return -rc;
    }
    a->prefault_started = 1;
    return 0;
}

bool
alloc_prefault_done(const struct alloc *a)
{
    return atomic_load_explicit(&((struct alloc *)a)->prefault_done, memory_order_acquire) != 0;
}

uint64_t
alloc_prefaulted(const struct alloc *a)
{
    return atomic_load_explicit(&((struct alloc *)a)->prefaulted, memory_order_relaxed);
}

void
alloc_destroy(struct alloc *a)
{
    if (a == NULL) {
        return;
    }
    if (a->prefault_started) {
        atomic_store(&a->prefault_stop, 1);
        pthread_join(a->prefault_thread, NULL);
    }
    if (a->base != NULL) {
        munmap(a->base, a->map_len);
    }
    if (a->has_file) {
        alloc_file_close(&a->file, false);  /* kept: the next start finds its pages */
    } else if (a->fd >= 0) {
        close(a->fd);
    }
    free(a->words);
    free(a->state);
    pthread_mutex_destroy(&a->lock);
    free(a);
}

int
alloc_take(struct alloc *a, uint64_t npages, struct alloc_extent *ext, int max, int *n)
{
    uint64_t left = npages;
    int count = 0;

    *n = 0;
    if (npages == 0) {
        return 0;
    }
    pthread_mutex_lock(&a->lock);
    if (npages > a->npages - atomic_load_explicit(&a->used, memory_order_relaxed)) {
        goto fail;
    }
    while (left > 0) {
        int want = 63 - __builtin_clzll(left);
        int largest = alloc_largest_order_locked(a);

        /*
         * largest >= 0: at least `left` pages are still free. When no block
         * of the wanted order or above is free, the biggest one left goes in
         * and the rest of the request is made of what remains.
         */
        if (want > largest) {
            want = largest;
        }
        if (count == max) {
            goto fail;
        }
        ext[count].page = (uint32_t)alloc_block_take_locked(a, want);
        ext[count].order = (uint8_t)want;
        count++;
        left -= 1ull << want;
    }
    atomic_store_explicit(&a->used, atomic_load_explicit(&a->used, memory_order_relaxed) + npages,
                          memory_order_relaxed);
    pthread_mutex_unlock(&a->lock);
    *n = count;
    return 0;

fail:
    /* Giving back in reverse re-coalesces exactly: the buddy state depends only on the free set. */
    while (count > 0) {
        count--;
        alloc_block_give_locked(a, ext[count].page, ext[count].order);
    }
    pthread_mutex_unlock(&a->lock);
    return KV_NO_SPACE;
}

void
alloc_give(struct alloc *a, const struct alloc_extent *ext, int n)
{
    uint64_t pages = 0;

    if (n <= 0) {
        return;
    }
    pthread_mutex_lock(&a->lock);
    for (int i = 0; i < n; i++) {
        alloc_block_give_locked(a, ext[i].page, ext[i].order);
        pages += 1ull << ext[i].order;
    }
    atomic_store_explicit(&a->used, atomic_load_explicit(&a->used, memory_order_relaxed) - pages,
                          memory_order_relaxed);
    pthread_mutex_unlock(&a->lock);
}

bool
alloc_file_reused(const struct alloc *a, uint64_t *resident)
{
    if (resident != NULL) {
        *resident = a->has_file ? a->file_resident : 0;
    }
    return a->has_file && a->file.reused;
}

int
alloc_fd(const struct alloc *a)
{
    return a->fd;
}

void *
alloc_base(const struct alloc *a)
{
    return a->base;
}

uint64_t
alloc_total_pages(const struct alloc *a)
{
    return a->npages;
}

uint64_t
alloc_used_pages(const struct alloc *a)
{
    return atomic_load_explicit(&a->used, memory_order_relaxed);
}

uint64_t
alloc_free_pages(const struct alloc *a)
{
    return a->npages - atomic_load_explicit(&a->used, memory_order_relaxed);
}

uint64_t
alloc_largest_free(struct alloc *a)
{
    int o;

    pthread_mutex_lock(&a->lock);
    o = alloc_largest_order_locked(a);
    pthread_mutex_unlock(&a->lock);
    return o < 0 ? 0 : 1ull << o;
}

void
alloc_stats(struct alloc *a, struct alloc_stats *out)
{
    int o;

    memset(out, 0, sizeof(*out));
    pthread_mutex_lock(&a->lock);
    out->total_pages = a->npages;
    out->used_pages = atomic_load_explicit(&a->used, memory_order_relaxed);
    out->free_pages = a->npages - out->used_pages;
    o = alloc_largest_order_locked(a);
    out->largest_free_pages = o < 0 ? 0 : 1ull << o;
    for (o = 0; o <= a->max_order; o++) {
        out->free_blocks[o] = a->nfree[o];
    }
    out->metadata_bytes = a->metadata_bytes;
    pthread_mutex_unlock(&a->lock);
}
