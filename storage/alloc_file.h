/*
 * alloc_file: the arena's backing file (memory_file): a file on tmpfs or hugetlbfs that
 * outlives the daemon, so that the next start maps pages that are already resident (no host
 * fault, no zeroing). It opens or creates the file, checks where it lives, locks it against a
 * second daemon and sizes it; it does not map it (alloc.c does) and knows nothing of the
 * allocator. The file's old bytes are the previous run's values: garbage to the new arena,
 * never read as objects.
 *
 * Threads: alloc_file_open and alloc_file_close run once each, on the thread that creates or
 * destroys the arena.
 */
#ifndef ALLOC_FILE_H
#define ALLOC_FILE_H

#include <stdbool.h>
#include <stdint.h>

/* alloc_file_kind: the filesystem the file is on (checked with fstatfs). */
enum alloc_file_kind {
    ALLOC_FILE_TMPFS = 1,       /* tmpfs / shmem: 4 KiB pages of the page cache */
    ALLOC_FILE_HUGETLBFS = 2,   /* hugetlbfs of 2 MiB pages: the hugetlb pool's pages */
};

struct alloc_file {
    int fd;                     /* maps the arena; the descriptor same-host clients get */
    int lock_fd;                /* holds the flock; never handed out, so a client keeping
                                 * the arena's descriptor never keeps the file locked */
    enum alloc_file_kind kind;
    bool created;               /* this open made the file */
    bool reused;                /* it existed with exactly the arena's size */
    uint64_t old_size;          /* its size when opened (0 when created) */
    char tmpfs_huge[16];        /* on tmpfs: its mount's huge= option ("never" when unset) */
    char path[4096];
};

/*
 * alloc_file_open: open or create `path` (O_CREAT, mode 0600, no symlink followed) for an
 * arena of *len bytes (whole 4 KiB pages). It must be a regular file owned by this user on
 * tmpfs or hugetlbfs (2 MiB pages); it is locked with flock(LOCK_EX | LOCK_NB) on a
 * descriptor of its own; group or other permission bits are removed. On hugetlbfs *len is
 * rounded down to whole 2 MiB pages; on tmpfs the mount's huge= option is read from
 * /proc/self/mountinfo into tmpfs_huge. The file is then sized to *len (ftruncate; another size
 * is logged as resized), after checking that a tmpfs has room for what the file lacks.
 * Each refusal is logged with the path and the reason.
 *
 * Returns 0 and *out; KV_INVALID_ARGUMENT (another filesystem, not a regular file, another
 * owner, a hugetlbfs of another page size, *len under one huge page on hugetlbfs),
 * -EBUSY (another process holds the lock: a live kvstashd on the same file), KV_NO_SPACE
 * (the tmpfs has no room for the arena), or -errno (open, fstat, ftruncate). On failure
 * nothing is left open and a file this call created is removed.
 */
int alloc_file_open(const char *path, uint64_t *len, struct alloc_file *out);

/*
 * alloc_file_close: close both descriptors (the lock goes with lock_fd); the file is kept.
 * With `remove_created`, a file alloc_file_open created is unlinked (a start that failed
 * after opening it). Accepts a struct whose descriptors are -1.
 */
void alloc_file_close(struct alloc_file *f, bool remove_created);

#endif
