/*
 * alloc_file: the arena's backing file. Why a file: on a VM whose guest reports freed memory
 * to the host (free page reporting), an anonymous memfd's pages go back to the host when the
 * daemon stops, and the next daemon's first write of each page waits for the host to back it
 * again (0.1-0.7 GB/s here). Page-cache pages of a file that still exists are never freed, so
 * a daemon restarted on the same file maps pages that are resident already. Only tmpfs and
 * hugetlbfs are accepted: on a disk filesystem the arena would be written back to the disk.
 *
 * The lock is an flock on a descriptor that is never handed out: the mapping's descriptor
 * goes to same-host clients (map_segment), and a client that keeps it after the daemon has
 * gone must not keep the next daemon out. A file on tmpfs cannot be sealed (seals exist on
 * memfds only), so unlike the memfd it can be shrunk by whoever may write it: the daemon's
 * user, and direct-access clients (the admin tenant) through the descriptor they get.
 */
#include "alloc_file.h"

#include "kverr.h"
#include "log.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/vfs.h>
#include <unistd.h>

#define ALLOC_FILE_TMPFS_MAGIC 0x01021994L       /* linux/magic.h TMPFS_MAGIC */
#define ALLOC_FILE_HUGETLBFS_MAGIC 0x958458f6L   /* linux/magic.h HUGETLBFS_MAGIC */
#define ALLOC_FILE_HUGE_PAGE (2ull << 20)

/* alloc_file_create_or_open: the file's first descriptor; sets *created. -errno on failure. */
static int
alloc_file_create_or_open(const char *path, bool *created)
{
    int fd = open(path, O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);

    *created = fd >= 0;
    if (fd < 0 && errno == EEXIST) {
        fd = open(path, O_RDWR | O_NOFOLLOW | O_CLOEXEC);
    }
    return fd >= 0 ? fd : -errno;
}

/* alloc_file_check_fs: tmpfs or hugetlbfs of 2 MiB pages; sets f->kind. Logs a refusal. */
static int
alloc_file_check_fs(struct alloc_file *f, const struct statfs *sfs)
{
    long type = (long)sfs->f_type;

    if (type == ALLOC_FILE_TMPFS_MAGIC) {
        f->kind = ALLOC_FILE_TMPFS;
        return 0;
    }
    if (type == (long)(int)ALLOC_FILE_HUGETLBFS_MAGIC || type == ALLOC_FILE_HUGETLBFS_MAGIC) {
        if ((uint64_t)sfs->f_bsize != ALLOC_FILE_HUGE_PAGE) {
            log_error("memory_file %s: a hugetlbfs mount of %llu KiB pages; the arena takes "
                      "2 MiB pages (mount -t hugetlbfs -o pagesize=2M)", f->path,
                      (unsigned long long)sfs->f_bsize >> 10);
            return KV_INVALID_ARGUMENT;
        }
        f->kind = ALLOC_FILE_HUGETLBFS;
        return 0;
    }
    log_error("memory_file %s: on a filesystem that is neither tmpfs nor hugetlbfs (f_type "
              "0x%lx): its pages would be written back to a disk; put it on tmpfs "
              "(e.g. /dev/shm) or a hugetlbfs mount", f->path, (unsigned long)type);
    return KV_INVALID_ARGUMENT;
}

/*
 * alloc_file_tmpfs_huge: the huge= option of the tmpfs mount of device dev (always,
 * within_size, advise, never) into out, from /proc/self/mountinfo; "never" when it is unset
 * or the mount cannot be found. It decides whether the file's pages can be 2 MiB ones.
 */
static void
alloc_file_tmpfs_huge(dev_t dev, char *out, size_t len)
{
    char line[4096];
    FILE *f = fopen("/proc/self/mountinfo", "re");

    snprintf(out, len, "never");
    while (f != NULL && fgets(line, sizeof(line), f) != NULL) {
        unsigned maj, min;
        const char *sep, *opt;

        if (sscanf(line, "%*u %*u %u:%u", &maj, &min) != 2 || maj != major(dev)
            || min != minor(dev) || (sep = strstr(line, " - ")) == NULL) {
            continue;
        }
        opt = strstr(sep, "huge=");
        if (opt != NULL) {
            opt += strlen("huge=");
            snprintf(out, len, "%.*s", (int)strcspn(opt, ", \n"), opt);
        }
        break;
    }
    if (f != NULL) {
        fclose(f);
    }
}

/* alloc_file_check_inode: a regular file of this user's; permission bits cut to 0600. */
static int
alloc_file_check_inode(struct alloc_file *f, const struct stat *st)
{
    if (!S_ISREG(st->st_mode)) {
        log_error("memory_file %s: not a regular file", f->path);
        return KV_INVALID_ARGUMENT;
    }
    if (st->st_uid != geteuid()) {
        log_error("memory_file %s: owned by uid %u, not by this process's uid %u (it would "
                  "hold this daemon's values; remove it or choose another path)", f->path,
                  (unsigned)st->st_uid, (unsigned)geteuid());
        return KV_INVALID_ARGUMENT;
    }
    return 0;
}

/* alloc_file_lock: flock the lock descriptor, or say who is in the way. */
static int
alloc_file_lock(struct alloc_file *f)
{
    if (flock(f->lock_fd, LOCK_EX | LOCK_NB) == 0) {
        return 0;
    }
    if (errno == EWOULDBLOCK) {
        f->created = false;         /* whoever holds it may have made it: never unlink it */
        log_error("memory_file %s: in use by another process (a kvstashd running on it); "
                  "each daemon needs a file of its own", f->path);
        return -EBUSY;
    }
    log_error("memory_file %s: flock: %s", f->path, strerror(errno));
    return -errno;
}

/* alloc_file_size: make the file len bytes (room checked on tmpfs). */
static int
alloc_file_size(struct alloc_file *f, const struct stat *st, const struct statfs *sfs,
                uint64_t len)
{
    if (f->kind == ALLOC_FILE_TMPFS) {
        uint64_t have = (uint64_t)st->st_blocks * 512;
        uint64_t room = (uint64_t)sfs->f_bavail * (uint64_t)sfs->f_bsize;
        uint64_t need = len > have ? len - have : 0;

        if (need > room) {
            log_error("memory_file %s: the tmpfs has %llu MiB free, the arena needs %llu MiB "
                      "more (a first write past its room would kill the daemon with SIGBUS); "
                      "grow the mount (mount -o remount,size=...) or lower memory_size",
                      f->path, (unsigned long long)(room >> 20),
                      (unsigned long long)(need >> 20));
            return KV_NO_SPACE;
        }
    }
    if (f->old_size == len) {
        return 0;
    }
    if (ftruncate(f->fd, (off_t)len) != 0) {
        int err = errno;

        log_error("memory_file %s: ftruncate to %llu bytes: %s", f->path,
                  (unsigned long long)len, strerror(err));
        return -err;
    }
    if (!f->created) {
        log_info("memory_file %s: was %llu bytes, resized to the arena's %llu", f->path,
                 (unsigned long long)f->old_size, (unsigned long long)len);
    }
    return 0;
}

int
alloc_file_open(const char *path, uint64_t *len, struct alloc_file *out)
{
    struct alloc_file *f = out;
    struct statfs sfs;
    struct stat st, st2;
    int rc;

    memset(f, 0, sizeof(*f));
    f->fd = -1;
    f->lock_fd = -1;
    if (strlen(path) >= sizeof(f->path)) {
        log_error("memory_file: path too long");
        return KV_INVALID_ARGUMENT;
    }
    snprintf(f->path, sizeof(f->path), "%s", path);
    f->lock_fd = alloc_file_create_or_open(path, &f->created);
    if (f->lock_fd < 0) {
        rc = f->lock_fd;
        log_error("memory_file %s: cannot open or create it: %s%s", path, strerror(-rc),
                  rc == -ELOOP ? " (a symbolic link: name the file itself)" : "");
        return rc;
    }
    if (fstatfs(f->lock_fd, &sfs) != 0 || fstat(f->lock_fd, &st) != 0) {
        rc = -errno;
        log_error("memory_file %s: fstat: %s", path, strerror(-rc));
        goto fail;
    }
    if ((rc = alloc_file_check_fs(f, &sfs)) != 0 || (rc = alloc_file_check_inode(f, &st)) != 0
        || (rc = alloc_file_lock(f)) != 0) {
        goto fail;
    }
    /* Locked: no other kvstashd changes it from here on. A second descriptor for the mapping,
     * of the same inode (checked), carries no lock to the clients it is passed to. */
    f->fd = open(path, O_RDWR | O_NOFOLLOW | O_CLOEXEC);
    if (f->fd < 0 || fstat(f->fd, &st2) != 0 || st2.st_dev != st.st_dev
        || st2.st_ino != st.st_ino) {
        rc = f->fd < 0 ? -errno : -EBUSY;
        log_error("memory_file %s: %s", path,
                  f->fd < 0 ? strerror(-rc) : "replaced while it was being opened");
        goto fail;
    }
    if ((st.st_mode & 077) != 0) {
        if (fchmod(f->fd, 0600) != 0) {
            rc = -errno;
            log_error("memory_file %s: mode %03o, and chmod 0600 failed: %s", path,
                      (unsigned)(st.st_mode & 0777), strerror(-rc));
            goto fail;
        }
        log_warn("memory_file %s: mode was %03o, now 0600 (it holds the values stored)", path,
                 (unsigned)(st.st_mode & 0777));
    }
    if (f->kind == ALLOC_FILE_HUGETLBFS) {
        *len -= *len % ALLOC_FILE_HUGE_PAGE;
        if (*len == 0) {
            log_error("memory_file %s: on hugetlbfs the arena is whole 2 MiB pages, and "
                      "memory_size is under one", path);
            rc = KV_INVALID_ARGUMENT;
            goto fail;
        }
    }
    if (f->kind == ALLOC_FILE_TMPFS) {
        alloc_file_tmpfs_huge(st.st_dev, f->tmpfs_huge, sizeof(f->tmpfs_huge));
    }
    f->old_size = (uint64_t)st.st_size;
    f->reused = !f->created && f->old_size == *len;
    rc = alloc_file_size(f, &st, &sfs, *len);
    if (rc != 0) {
        goto fail;
    }
    return 0;

fail:
    alloc_file_close(f, true);
    return rc;
}

void
alloc_file_close(struct alloc_file *f, bool remove_created)
{
    if (remove_created && f->created && f->lock_fd >= 0) {
        (void)unlink(f->path);      /* still locked: no other daemon has it open for use */
    }
    if (f->fd >= 0) {
        close(f->fd);
        f->fd = -1;
    }
    if (f->lock_fd >= 0) {
        close(f->lock_fd);
        f->lock_fd = -1;
    }
}
