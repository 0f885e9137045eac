/*
 * fuzz_summary: the bucket summary decoder (storage/ssd_summary.c) on arbitrary bytes, as
 * a damaged or planted bucket-<id>.kvh would reach a rebuild. Each input is decoded as it
 * is, and again with its header's CRC made right (so the fuzzer gets past the checksum to
 * the entry walk). Whatever it accepts, every entry reported must lie inside the input,
 * inside the covered length and the file size, on the 4 KiB grid and in order; a refused
 * summary must report nothing.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "ssd_record.h"
#include "ssd_summary.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define FZ_FILE (1ull << 36)
#define FZ_MAX (1u << 20)

struct fz_walk {
    const uint8_t *buf;
    uint64_t len;
    uint64_t next_off;  /* the first byte the next record may use */
    uint64_t n;
};

static int
fz_entry(void *arg, const struct ssd_rec *rec, uint64_t value_off)
{
    struct fz_walk *w = arg;
    uint64_t hdr = ssd_rec_hdr_block(rec->key_len);
    uint64_t off = value_off - hdr;

    if (rec->key < w->buf || rec->key + rec->key_len > w->buf + w->len
        || off % SSD_REC_ALIGN != 0 || off < w->next_off
        || off + ssd_rec_size(rec->key_len, rec->value_len) > FZ_FILE) {
        abort();
    }
    w->next_off = off + ssd_rec_size(rec->key_len, rec->value_len);
    w->n++;
    return 0;
}

static void
fz_decode(const uint8_t *buf, uint64_t len)
{
    struct ssd_sum_info info;
    struct fz_walk w = {buf, len, 0, 0};
    uint64_t id = len >= 16 ? (uint64_t)buf[8] | (uint64_t)buf[9] << 8 : 0;
    int rc;

    if (len >= 16) {
        for (int i = 2; i < 8; i++) {
            id |= (uint64_t)buf[8 + i] << (8 * i);
        }
    }
    rc = ssd_sum_decode(buf, len, id, FZ_FILE, 65536, 1ull << 40, &info, fz_entry, &w);
    if (rc != 0 && w.n != 0) {
        abort();        /* a refused summary reported entries */
    }
    if (rc == 0 && (w.n != info.count || info.covered > FZ_FILE || w.next_off > info.covered)) {
        abort();
    }
}

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    uint8_t *copy;

    if (size > FZ_MAX) {
        return 0;
    }
    fz_decode(data, size);
    if (size < SSD_SUM_HDR_SIZE) {
        return 0;
    }
    copy = malloc(size);
    if (copy == NULL) {
        return 0;
    }
    memcpy(copy, data, size);
    {
        uint64_t count = 0;
        uint64_t covered = 0;
        uint64_t id = 0;

        for (int i = 0; i < 8; i++) {
            id |= (uint64_t)data[8 + i] << (8 * i);
            count |= (uint64_t)data[16 + i] << (8 * i);
            covered |= (uint64_t)data[24 + i] << (8 * i);
        }
        ssd_sum_finish(copy, size, id, count, covered);
    }
    fz_decode(copy, size);
    free(copy);
    return 0;
}
