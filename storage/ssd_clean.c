/*
 * ssd_clean: the clean-shutdown marker of the SSD index (ssd_clean.h). It
 * owns the marker's file and format and the checksum of data.mdb; it must
 * not open the LMDB environment (only ssd_index.c does) nor decide anything
 * about the tier: it answers "is data.mdb what the clean close left".
 *
 * The marker is one line of text, "kvstash-clean 1 size=<bytes> crc32c=<hex>",
 * so an operator can read it. The checksum covers every byte of the file, so
 * the cheap check at a clean start catches whatever a full walk would see
 * that happened after the close (a zeroed or overwritten page, a cut, a
 * restore of another file), not just the meta pages.
 */
#include "ssd_clean.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "crc32c.h"

#define SSD_CLEAN_MAGIC "kvstash-clean 1"
#define SSD_CLEAN_CHUNK (4u << 20)
#define SSD_CLEAN_PATH 4200

/* ssd_clean_sum: the CRC-32C and size of path's bytes. 0 or -errno. */
static int
ssd_clean_sum(const char *path, uint64_t *size, uint32_t *crc)
{
    uint8_t *buf;
    struct stat st;
    uint64_t off = 0;
    uint32_t c = 0;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    int rc = 0;

    if (fd < 0) {
        return -errno;
    }
    if (fstat(fd, &st) != 0) {
        rc = -errno;
        close(fd);
        return rc;
    }
    buf = malloc(SSD_CLEAN_CHUNK);
    if (buf == NULL) {
        close(fd);
        return -ENOMEM;
    }
    (void)posix_fadvise(fd, 0, 0, POSIX_FADV_SEQUENTIAL);
    while (off < (uint64_t)st.st_size) {
        uint64_t want = (uint64_t)st.st_size - off;
        ssize_t n = pread(fd, buf, want < SSD_CLEAN_CHUNK ? (size_t)want : SSD_CLEAN_CHUNK,
                          (off_t)off);

        if (n < 0 && errno == EINTR) {
            continue;
        }
        if (n <= 0) {
            rc = n < 0 ? -errno : -EIO;     /* shrank under us: not the file it was */
            break;
        }
        c = crc32c_extend(c, buf, (size_t)n);
        off += (uint64_t)n;
    }
    free(buf);
    close(fd);
    *size = off;
    *crc = c;
    return rc;
}

/* ssd_clean_sync_dir: fsync the directory dir (a rename or unlink in it made durable). */
static int
ssd_clean_sync_dir(const char *dir)
{
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    int rc = 0;

    if (fd < 0) {
        return -errno;
    }
    if (fsync(fd) != 0) {
        rc = -errno;
    }
    close(fd);
    return rc;
}

int
ssd_clean_mark(const char *dir)
{
    char db[SSD_CLEAN_PATH], tmp[SSD_CLEAN_PATH], path[SSD_CLEAN_PATH];
    char line[128];
    uint64_t size;
    uint32_t crc;
    int fd, n, rc;

    if (snprintf(db, sizeof(db), "%s/data.mdb", dir) >= (int)sizeof(db)
        || snprintf(tmp, sizeof(tmp), "%s/%s.tmp", dir, SSD_CLEAN_NAME) >= (int)sizeof(tmp)
        || snprintf(path, sizeof(path), "%s/%s", dir, SSD_CLEAN_NAME) >= (int)sizeof(path)) {
        return -ENAMETOOLONG;
    }
    rc = ssd_clean_sum(db, &size, &crc);
    if (rc != 0) {
        return rc;
    }
    n = snprintf(line, sizeof(line), SSD_CLEAN_MAGIC " size=%" PRIu64 " crc32c=%08" PRIx32 "\n",
                 size, crc);
    fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (fd < 0) {
        return -errno;
    }
    if (write(fd, line, (size_t)n) != n || fsync(fd) != 0) {
        rc = errno != 0 ? -errno : -EIO;
        close(fd);
        (void)unlink(tmp);
        return rc;
    }
    close(fd);
    if (rename(tmp, path) != 0) {
        rc = -errno;
        (void)unlink(tmp);
        return rc;
    }
    return ssd_clean_sync_dir(dir);
}

/* ssd_clean_parse: the size and CRC a marker's text names. 0, or -EINVAL. */
static int
ssd_clean_parse(const char *text, uint64_t *size, uint32_t *crc)
{
    char again[128];
    unsigned long long sz;
    unsigned int c;
    int end = 0;

    if (sscanf(text, SSD_CLEAN_MAGIC " size=%llu crc32c=%8x%n", &sz, &c, &end) != 2 || end == 0
        || strcmp(text + end, "\n") != 0) {
        return -EINVAL;
    }
    /* Written back exactly as ssd_clean_mark writes it: no signs, spaces or short forms. */
    snprintf(again, sizeof(again), SSD_CLEAN_MAGIC " size=%llu crc32c=%08x\n", sz, c);
    if (strcmp(again, text) != 0) {
        return -EINVAL;
    }
    *size = sz;
    *crc = c;
    return 0;
}

int
ssd_clean_take(const char *dir, char *why, size_t whylen)
{
    char db[SSD_CLEAN_PATH], path[SSD_CLEAN_PATH];
    char text[128];
    uint64_t want_size, size;
    uint32_t want_crc, crc;
    ssize_t n;
    int fd, rc;

    snprintf(why, whylen, "?");
    if (snprintf(db, sizeof(db), "%s/data.mdb", dir) >= (int)sizeof(db)
        || snprintf(path, sizeof(path), "%s/%s", dir, SSD_CLEAN_NAME) >= (int)sizeof(path)) {
        snprintf(why, whylen, "the index path is too long");
        return 0;
    }
    fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        if (errno == ENOENT || errno == ENOTDIR) {
            snprintf(why, whylen, "no clean-shutdown marker: the last stop was not clean");
        } else {
            snprintf(why, whylen, "the clean-shutdown marker cannot be read: %s",
                     strerror(errno));
        }
        return 0;
    }
    n = read(fd, text, sizeof(text) - 1);
    close(fd);
    text[n > 0 ? n : 0] = '\0';
    /* Gone before anything can write the index: a crash from here on leaves no marker. */
    if (unlink(path) != 0 || ssd_clean_sync_dir(dir) != 0) {
        snprintf(why, whylen, "the clean-shutdown marker cannot be removed: %s", strerror(errno));
        return 0;
    }
    if (n <= 0 || ssd_clean_parse(text, &want_size, &want_crc) != 0) {
        snprintf(why, whylen, "the clean-shutdown marker does not parse");
        return 0;
    }
    rc = ssd_clean_sum(db, &size, &crc);
    if (rc != 0) {
        snprintf(why, whylen, "data.mdb cannot be read: %s", strerror(-rc));
        return 0;
    }
    if (size != want_size || crc != want_crc) {
        snprintf(why, whylen, "data.mdb changed since the clean shutdown (%" PRIu64 " bytes, "
                 "crc32c %08" PRIx32 "; the marker says %" PRIu64 " bytes, %08" PRIx32 ")",
                 size, crc, want_size, want_crc);
        return 0;
    }
    snprintf(why, whylen, "data.mdb is as the clean shutdown left it (%" PRIu64 " bytes, "
             "crc32c %08" PRIx32 ")", size, crc);
    return 1;
}
