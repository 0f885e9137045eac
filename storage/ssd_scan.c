/*
 * ssd_scan: the bucket walk behind ssd_scan.h. It keeps one window of the
 * file in the caller's buffer and refills it at the current record when a
 * header or value runs past the window's end, so a record is parsed from
 * one contiguous run of bytes whenever it fits in the buffer; a value larger
 * than the buffer is hashed in pieces, with its key copied out first. It
 * trusts no length until ssd_rec_decode has checked it against the limits
 * and the header CRC, and never reads past the file's size as it was when
 * the walk began.
 */
#include "ssd_scan.h"

#include "crc32c.h"
#include "kverr.h"

#include <errno.h>
#include <fcntl.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

struct ssd_win {
    int fd;
    uint8_t *buf;
    uint64_t cap;
    uint64_t start;     /* file offset of buf[0] */
    uint64_t len;       /* valid bytes in buf */
    uint64_t size;      /* the file's size */
};

/*
 * ssd_win_fill: read the window from off (as much as fits, up to the file's size). 0 or
 * -errno. The read starts at off rounded down to SSD_REC_ALIGN and its length is rounded
 * up to it, so an O_DIRECT descriptor works (the buffer is aligned by contract); one that
 * refuses O_DIRECT reads (EINVAL) is switched to buffered reads and the read retried.
 */
static int
ssd_win_fill(struct ssd_win *w, uint64_t off)
{
    uint64_t from = off & ~(uint64_t)(SSD_REC_ALIGN - 1);
    uint64_t want = w->size - from < w->cap ? w->size - from : w->cap;
    uint64_t ask = (want + SSD_REC_ALIGN - 1) & ~(uint64_t)(SSD_REC_ALIGN - 1);
    uint64_t got = 0;
    bool retried = false;

    if (ask > w->cap) {
        ask = w->cap;
    }
    while (got < want) {
        ssize_t n = pread(w->fd, w->buf + got, (size_t)(ask - got), (off_t)(from + got));

        if (n < 0) {
            int fl = fcntl(w->fd, F_GETFL);

            if (errno == EINTR) {
                continue;
            }
            if (errno == EINVAL && !retried && fl >= 0 && (fl & O_DIRECT) != 0
                && fcntl(w->fd, F_SETFL, fl & ~O_DIRECT) == 0) {
                retried = true;
                continue;
            }
            return -errno;
        }
        if (n == 0) {
            break;      /* shrank under us: treated as the end */
        }
        got += (uint64_t)n;
    }
    if (got > want) {
        got = want;     /* read past the size the walk began with: not part of this walk */
    }
    w->start = from;
    w->len = got;
    if (got < want) {
        w->size = from + got;   /* the file shrank under the walk: its end is here now */
    }
    return 0;
}

/* ssd_win_avail: bytes of the window from off (0 when off is outside it). */
static uint64_t
ssd_win_avail(const struct ssd_win *w, uint64_t off)
{
    return off >= w->start && off < w->start + w->len ? w->start + w->len - off : 0;
}

/*
 * ssd_scan_value: the value CRC of a record of len bytes at off, reading
 * through the window. 0 and *crc, or -errno.
 */
static int
ssd_scan_value(struct ssd_win *w, uint64_t off, uint64_t len, uint32_t *crc)
{
    while (len > 0) {
        uint64_t avail = ssd_win_avail(w, off);
        uint64_t take;
        int rc;

        if (avail == 0) {
            rc = ssd_win_fill(w, off);
            if (rc != 0) {
                return rc;
            }
            avail = ssd_win_avail(w, off);
            if (avail == 0) {
                return -EIO;    /* cannot happen: the caller checked the record fits */
            }
        }
        take = avail < len ? avail : len;
        *crc = crc32c_extend(*crc, w->buf + (off - w->start), (size_t)take);
        off += take;
        len -= take;
    }
    return 0;
}

int
ssd_scan_fd(int fd, uint8_t *buf, uint64_t bufsize, uint32_t max_key, uint64_t max_value,
            ssd_scan_fn *fn, void *arg, struct ssd_scan_result *res)
{
    return ssd_scan_fd_from(fd, 0, buf, bufsize, max_key, max_value, fn, arg, res);
}

int
ssd_scan_fd_from(int fd, uint64_t start, uint8_t *buf, uint64_t bufsize, uint32_t max_key,
                 uint64_t max_value, ssd_scan_fn *fn, void *arg, struct ssd_scan_result *res)
{
    struct ssd_win w = {fd, buf, bufsize, 0, 0, 0};
    uint8_t *keycopy = NULL;
    struct stat st;
    uint64_t pos = start;
    int ret = 0;
    int rc;

    memset(res, 0, sizeof(*res));
    res->end = start;
    if (fstat(fd, &st) != 0) {
        res->why = SSD_SCAN_END_IO;
        res->rc = -errno;
        return 0;
    }
    w.size = (uint64_t)st.st_size;
    res->file_size = w.size;
    res->why = SSD_SCAN_END_CLEAN;
    while (pos < w.size) {
        struct ssd_rec rec;
        uint64_t avail = ssd_win_avail(&w, pos);
        uint64_t hdr_block, rec_end;
        uint32_t crc;

        if (avail < SSD_REC_ALIGN && pos + avail < w.size) {
            rc = ssd_win_fill(&w, pos);
            if (rc != 0) {
                res->why = SSD_SCAN_END_IO;
                res->rc = rc;
                break;
            }
            avail = ssd_win_avail(&w, pos);
        }
        rc = ssd_rec_decode(w.buf + (pos - w.start), (size_t)avail, max_key, max_value, &rec);
        if (rc == KV_INVALID_ARGUMENT && pos + avail < w.size && w.start != pos) {
            /* The header block runs past the window: refill from here and look again. */
            rc = ssd_win_fill(&w, pos);
            if (rc != 0) {
                res->why = SSD_SCAN_END_IO;
                res->rc = rc;
                break;
            }
            avail = ssd_win_avail(&w, pos);
            rc = ssd_rec_decode(w.buf + (pos - w.start), (size_t)avail, max_key, max_value, &rec);
        }
        if (rc == KV_NOT_FOUND) {
            break;                              /* zeros: the unwritten end */
        }
        if (rc == KV_INVALID_ARGUMENT) {
            res->why = pos + avail >= w.size ? SSD_SCAN_END_SHORT : SSD_SCAN_END_DAMAGED;
            break;
        }
        if (rc != 0) {
            res->why = SSD_SCAN_END_DAMAGED;
            break;
        }
        hdr_block = ssd_rec_hdr_block(rec.key_len);
        rec_end = pos + hdr_block + ssd_rec_value_span(rec.value_len);
        if (rec_end > w.size || rec_end < pos) {
            res->why = SSD_SCAN_END_SHORT;
            break;
        }
        if (pos + hdr_block + rec.value_len > w.start + w.len) {
            /* The value runs past the window: bring the whole record in if it fits,
             * else keep the key aside while the value streams through. */
            if (rec_end - pos <= w.cap) {
                rc = ssd_win_fill(&w, pos);
                if (rc != 0) {
                    res->why = SSD_SCAN_END_IO;
                    res->rc = rc;
                    break;
                }
                rec.key = w.buf + SSD_REC_HDR_SIZE;
            } else {
                if (keycopy == NULL) {
                    keycopy = malloc((size_t)max_key + 1);
                    if (keycopy == NULL) {
                        res->why = SSD_SCAN_END_IO;
                        res->rc = -ENOMEM;
                        break;
                    }
                }
                memcpy(keycopy, rec.key, rec.key_len);
                rec.key = keycopy;
            }
        }
        crc = ssd_rec_key_crc(rec.tenant, rec.key, rec.key_len);
        rc = ssd_scan_value(&w, pos + hdr_block, rec.value_len, &crc);
        if (rc != 0) {
            res->why = SSD_SCAN_END_IO;
            res->rc = rc;
            break;
        }
        if (crc != rec.value_crc) {
            res->bad_values++;
        } else {
            res->records++;
            ret = fn(arg, &rec, pos + hdr_block);
        }
        pos = rec_end;
        res->end = pos;
        if (ret != 0) {
            break;
        }
    }
    free(keycopy);
    return ret;
}

const char *
ssd_scan_end_name(int why)
{
    switch (why) {
    case SSD_SCAN_END_CLEAN:
        return "clean";
    case SSD_SCAN_END_DAMAGED:
        return "damaged";
    case SSD_SCAN_END_SHORT:
        return "short";
    default:
        return "read error";
    }
}
