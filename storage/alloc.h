/*
 * alloc: the DRAM arena and its page allocator. One arena of memory_size
 * bytes is mapped once at alloc_create and divided into 4 KiB pages, which a
 * binary buddy allocator hands out as extents (aligned runs of 2^order pages).
 * The allocator owns the mapping and its own bookkeeping, which lives on the
 * heap, never inside the arena, so a stray write into the arena (a buggy
 * writer, a remote RDMA peer) can corrupt data but never the free lists. It
 * knows nothing about objects, keys or eviction; storage/store_evict.c decides
 * what to free when the arena is full.
 *
 * Threads: every function is safe to call from any thread at once. One mutex
 * inside the allocator guards the free lists; alloc_used_pages and
 * alloc_free_pages read an atomic counter and take no lock. Lock order: a
 * caller may hold its own locks (store shard locks) while calling in; the
 * allocator calls out to nothing while holding its mutex.
 */
#ifndef ALLOC_H
#define ALLOC_H

#include <stdbool.h>
#include <stdint.h>

struct alloc;

#define ALLOC_PAGE_SHIFT 12
#define ALLOC_PAGE_SIZE (1u << ALLOC_PAGE_SHIFT)
#define ALLOC_ORDERS 32          /* orders 0..31: a block is at most 2^31 pages (8 TiB) */
#define ALLOC_MAX_PAGES 0xffffffffu /* page numbers are uint32_t */

/*
 * An extent: 2^order pages starting at page `page` (page * ALLOC_PAGE_SIZE
 * bytes from alloc_base). page is a multiple of 2^order.
 */
struct alloc_extent {
    uint32_t page;
    uint8_t order;
};

/* A snapshot of the allocator's state, for stats and fragmentation tests. */
struct alloc_stats {
    uint64_t total_pages;
    uint64_t used_pages;
    uint64_t free_pages;
    uint64_t largest_free_pages;        /* pages in the largest free block (0 when full) */
    uint64_t free_blocks[ALLOC_ORDERS]; /* free blocks of each order */
    uint64_t metadata_bytes;            /* heap bytes of the bookkeeping */
};

/* alloc_huge: which pages may back the arena (memory_hugepages). */
enum alloc_huge {
    ALLOC_HUGE_AUTO = 0,    /* hugetlb if the pool has room, else shmem THP if enabled, else 4 KiB */
    ALLOC_HUGE_ON = 1,      /* as auto, but 4 KiB pages are an error */
    ALLOC_HUGE_OFF = 2,     /* 4 KiB pages (MADV_NOHUGEPAGE) */
};

/* alloc_backing: which pages back the arena (what alloc_create chose). */
enum alloc_backing {
    ALLOC_BACKING_4K = 0,       /* 4 KiB pages */
    ALLOC_BACKING_THP = 1,      /* shmem (or anonymous) memory advised MADV_HUGEPAGE, THP enabled */
    ALLOC_BACKING_HUGETLB = 2,  /* a MFD_HUGETLB memfd of 2 MiB pages, reserved at mmap */
};

#define ALLOC_HUGE_PAGE_SIZE (2u << 20) /* the hugetlb page size used (x86-64 2 MiB) */

/*
 * alloc_create: map an arena of `size` bytes rounded down to whole pages,
 * every page free. The arena is a memfd mapped MAP_SHARED, sealed against
 * shrinking and growing, so that it can be handed to same-host clients
 * (alloc_fd); where no memfd can be made it is private anonymous memory.
 * It is aligned to 2 MiB. `huge` chooses its pages:
 *  - ALLOC_HUGE_AUTO: a MFD_HUGETLB memfd of 2 MiB pages when the hugetlb pool
 *    (vm.nr_hugepages) has room for the whole arena, then `size` is rounded
 *    down to whole 2 MiB pages (the mapping reserves the pool's pages, so a
 *    later fault never finds the pool empty); else, when the host enables
 *    transparent huge pages for shmem (shmem_enabled not never/deny), 4 KiB
 *    pages advised MADV_HUGEPAGE; else 4 KiB pages.
 *  - ALLOC_HUGE_ON: the same, but when neither kind of huge page is there it
 *    fails with KV_UNSUPPORTED and logs why (the pool's free pages, the THP
 *    setting).
 *  - ALLOC_HUGE_OFF: 4 KiB pages, advised MADV_NOHUGEPAGE.
 * alloc_backing tells which was used and why. The arena's pages are not
 * touched, so untouched memory costs nothing until used (hugetlb pages are
 * reserved from the pool, not touched either).
 * Returns 0 and *out, KV_INVALID_ARGUMENT when size is under one page or over
 * ALLOC_MAX_PAGES pages, KV_UNSUPPORTED (ALLOC_HUGE_ON without huge pages),
 * -ENOMEM (or the mmap errno) when the arena or the bookkeeping cannot be
 * allocated.
 */
int alloc_create(uint64_t size, enum alloc_huge huge, struct alloc **out);

/*
 * alloc_create_file: alloc_create, with the arena on the file `path` (memory_file; NULL or
 * "" is alloc_create) instead of an anonymous memfd: a file on tmpfs or hugetlbfs, created
 * with mode 0600 when missing, locked against a second process and sized to the arena
 * (storage/alloc_file.h), mapped MAP_SHARED where the memfd would be, and kept at
 * alloc_destroy, so that a daemon started again on it maps pages that are resident already.
 * On hugetlbfs the arena is 2 MiB hugetlb pages (size rounded down to whole ones; `huge`
 * ALLOC_HUGE_OFF refuses); on tmpfs transparent huge pages where the mount's huge= option
 * gives them (ALLOC_BACKING_THP; not with ALLOC_HUGE_OFF), else 4 KiB pages (ALLOC_HUGE_ON
 * refuses). The population maps a tmpfs file with MADV_POPULATE_READ (fault-around maps its
 * resident pages 16 at a time; the mapping is writable), and on transparent huge pages logs
 * how much of the arena is not mapped as 2 MiB pages (they are best effort). The file's old
 * bytes are not cleared: every page is free and holds garbage. Unlike the memfd the file is
 * not sealed (tmpfs files cannot be): whoever may write it can shrink it. Each refusal is
 * logged with the path. Returns what alloc_create returns, and KV_INVALID_ARGUMENT (not
 * tmpfs or hugetlbfs, not a regular file of this user's, a hugetlbfs of other pages, or
 * `huge` against the filesystem), KV_UNSUPPORTED (ALLOC_HUGE_ON on a tmpfs without huge
 * pages), -EBUSY (another
 * process holds the file), KV_NO_SPACE (the tmpfs or the cgroup's hugetlb limit has no room
 * for the arena), -errno (open, ftruncate, mmap: -ENOMEM when the hugetlb pool lacks pages).
 */
int alloc_create_file(uint64_t size, enum alloc_huge huge, const char *path,
                      struct alloc **out);

/*
 * alloc_file_reused: the arena is on a memory_file that existed with exactly the arena's
 * size (a restart on a kept file); *resident (may be NULL) gets the bytes of the file that
 * were resident when it was mapped (0 without a file).
 */
bool alloc_file_reused(const struct alloc *a, uint64_t *resident);

/*
 * alloc_backing: which pages back the arena; *why (may be NULL) gets a
 * sentence for the log saying which and why (valid until alloc_destroy).
 */
enum alloc_backing alloc_backing(const struct alloc *a, const char **why);

/*
 * alloc_prefault_start: warm the arena from a background thread, 64 MiB at a
 * time from its first page up (the order alloc_take hands pages out, so warm
 * pages go first): MADV_POPULATE_WRITE, then one distinct non-zero word
 * written into each free page through the arena mapping, under the mutex a
 * few dozen pages at a time (pages taken are never written, so the arena may
 * be in use meanwhile). The word keeps a host that shares idle zero pages
 * from making the first write of a value slow (alloc.c says why). Logs the
 * time taken when done, if a second or more. Stops at alloc_destroy. Without
 * MADV_POPULATE_WRITE the stamps fault the pages in themselves. Returns 0 or
 * -errno (no thread).
 */
int alloc_prefault_start(struct alloc *a);

/*
 * alloc_prefault_done: the prefault thread has ended (the arena populated,
 * or populating stopped: no kernel support, no memory, alloc_destroy) or
 * could not start. False before alloc_prefault_start. Any thread.
 */
bool alloc_prefault_done(const struct alloc *a);

/* alloc_prefaulted: bytes of the arena populated so far. */
uint64_t alloc_prefaulted(const struct alloc *a);

/* alloc_destroy: unmap the arena and free everything. Accepts NULL. No other call may run. */
void alloc_destroy(struct alloc *a);

/*
 * alloc_take: take exactly `npages` pages as at most `max` extents written to
 * ext[0..*n). The request is split by the binary representation of npages
 * (largest extent first), so a free arena answers with popcount(npages)
 * extents; when an order has no free block a larger one is split, and when
 * no block is large enough the request is made of smaller ones. The lowest
 * free block of the chosen order is used, which keeps the arena compact.
 * npages == 0 succeeds with *n = 0.
 *
 * Returns 0, or KV_NO_SPACE when fewer than npages pages are free or the
 * request would need more than max extents; on failure nothing is taken and
 * *n is 0. ext is borrowed and must hold max entries.
 */
int alloc_take(struct alloc *a, uint64_t npages, struct alloc_extent *ext, int max, int *n);

/*
 * alloc_give: return extents from alloc_take (any subset, in any order);
 * free buddies coalesce at once. Giving back an extent that is not taken
 * (double free, made-up extent) prints a message on stderr and aborts.
 */
void alloc_give(struct alloc *a, const struct alloc_extent *ext, int n);

/*
 * alloc_fd: the memfd (or memory_file) behind the arena (owned by the allocator, valid until
 * alloc_destroy; mapping it at offset 0 shows the arena), or -1 when the
 * arena is private memory.
 */
int alloc_fd(const struct alloc *a);

/* alloc_base: the first byte of the arena; valid until alloc_destroy. */
void *alloc_base(const struct alloc *a);

/* alloc_extent_ptr: the first byte of an extent. */
static inline void *
alloc_extent_ptr(void *base, const struct alloc_extent *e)
{
    return (uint8_t *)base + ((uint64_t)e->page << ALLOC_PAGE_SHIFT);
}

/* alloc_extent_bytes: the length of an extent in bytes. */
static inline uint64_t
alloc_extent_bytes(const struct alloc_extent *e)
{
    return (uint64_t)ALLOC_PAGE_SIZE << e->order;
}

/* alloc_total_pages: pages in the arena (fixed at create). */
uint64_t alloc_total_pages(const struct alloc *a);

/* alloc_used_pages: pages taken now. Lock-free; exact at some instant. */
uint64_t alloc_used_pages(const struct alloc *a);

/* alloc_free_pages: pages free now. Lock-free; exact at some instant. */
uint64_t alloc_free_pages(const struct alloc *a);

/* alloc_largest_free: pages in the largest free block (0 when full). Takes the mutex. */
uint64_t alloc_largest_free(struct alloc *a);

/* alloc_stats: fill *out with a consistent snapshot (taken under the mutex). */
void alloc_stats(struct alloc *a, struct alloc_stats *out);

#endif
