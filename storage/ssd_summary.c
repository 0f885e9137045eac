/*
 * ssd_summary: encoding and checking of bucket summaries (ssd_summary.h),
 * field by field in little-endian. It owns nothing but the format: no file
 * I/O, no allocation, no index.
 *
 * Decoding trusts no field it has not checked: the declared body length must
 * be what the buffer holds before the CRC is taken, and each entry's lengths
 * are compared with the limits and with the bytes left before the key is
 * touched. The walk is done twice, first without calling back, so that a
 * caller never sees part of a summary that turns out bad further on.
 */
#include "ssd_summary.h"

#include "crc32c.h"
#include "kverr.h"

#include <string.h>

#define SSD_SUM_CRC_AT 40u

static void
ssd_sum_put32(uint8_t *p, uint32_t v)
{
    for (int i = 0; i < 4; i++) {
        p[i] = (uint8_t)(v >> (8 * i));
    }
}

static void
ssd_sum_put64(uint8_t *p, uint64_t v)
{
    for (int i = 0; i < 8; i++) {
        p[i] = (uint8_t)(v >> (8 * i));
    }
}

static uint32_t
ssd_sum_get32(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static uint64_t
ssd_sum_get64(const uint8_t *p)
{
    return (uint64_t)ssd_sum_get32(p) | (uint64_t)ssd_sum_get32(p + 4) << 32;
}

uint64_t
ssd_sum_entry_size(uint32_t key_len)
{
    return SSD_SUM_ENT_FIXED + (uint64_t)key_len;
}

uint64_t
ssd_sum_entry_encode(const struct ssd_rec *rec, uint64_t offset, uint8_t *buf)
{
    ssd_sum_put64(buf, offset);
    ssd_sum_put64(buf + 8, rec->value_len);
    ssd_sum_put64(buf + 16, rec->seq);
    ssd_sum_put32(buf + 24, rec->tenant);
    ssd_sum_put32(buf + 28, rec->key_len);
    ssd_sum_put32(buf + 32, rec->value_crc);
    if (rec->key_len > 0) {
        memcpy(buf + SSD_SUM_ENT_FIXED, rec->key, rec->key_len);
    }
    return ssd_sum_entry_size(rec->key_len);
}

static uint32_t
ssd_sum_crc(const uint8_t *buf, uint64_t len)
{
    uint32_t crc = crc32c_extend(0, buf, SSD_SUM_CRC_AT);

    return crc32c_extend(crc, buf + SSD_SUM_HDR_SIZE, (size_t)(len - SSD_SUM_HDR_SIZE));
}

void
ssd_sum_finish(uint8_t *buf, uint64_t len, uint64_t bucket, uint64_t count, uint64_t covered)
{
    memset(buf, 0, SSD_SUM_HDR_SIZE);
    ssd_sum_put32(buf, SSD_SUM_MAGIC);
    buf[4] = (uint8_t)SSD_SUM_VERSION;
    buf[5] = (uint8_t)(SSD_SUM_VERSION >> 8);
    ssd_sum_put64(buf + 8, bucket);
    ssd_sum_put64(buf + 16, count);
    ssd_sum_put64(buf + 24, covered);
    ssd_sum_put64(buf + 32, len - SSD_SUM_HDR_SIZE);
    ssd_sum_put32(buf + SSD_SUM_CRC_AT, ssd_sum_crc(buf, len));
}

/* ssd_sum_walk: check (and with fn, report) the entries of a summary whose header verified. */
static int
ssd_sum_walk(const uint8_t *buf, uint64_t len, uint32_t max_key, uint64_t max_value,
             struct ssd_sum_info *info, ssd_scan_fn *fn, void *arg)
{
    uint64_t at = SSD_SUM_HDR_SIZE;
    uint64_t prev_end = 0;
    uint64_t n = 0;

    while (at < len) {
        struct ssd_rec rec;
        uint64_t offset;
        uint64_t rec_size;

        if (len - at < SSD_SUM_ENT_FIXED) {
            info->why = "an entry cut short";
            return KV_CHECKSUM_MISMATCH;
        }
        offset = ssd_sum_get64(buf + at);
        memset(&rec, 0, sizeof(rec));
        rec.value_len = ssd_sum_get64(buf + at + 8);
        rec.seq = ssd_sum_get64(buf + at + 16);
        rec.tenant = ssd_sum_get32(buf + at + 24);
        rec.key_len = ssd_sum_get32(buf + at + 28);
        rec.value_crc = ssd_sum_get32(buf + at + 32);
        if (rec.key_len > max_key || rec.value_len > max_value) {
            info->why = "an entry's lengths are over the limits";
            return KV_CHECKSUM_MISMATCH;
        }
        if (len - at - SSD_SUM_ENT_FIXED < rec.key_len) {
            info->why = "an entry's key runs past the end";
            return KV_CHECKSUM_MISMATCH;
        }
        rec.key = buf + at + SSD_SUM_ENT_FIXED;
        rec_size = ssd_rec_size(rec.key_len, rec.value_len);
        if (offset % SSD_REC_ALIGN != 0 || offset < prev_end || offset > info->covered
            || info->covered - offset < rec_size) {
            info->why = "an entry's record is out of order or past the covered length";
            return KV_CHECKSUM_MISMATCH;
        }
        if (fn != NULL) {
            int rc = fn(arg, &rec, offset + ssd_rec_hdr_block(rec.key_len));

            if (rc != 0) {
                return rc;
            }
        }
        prev_end = offset + rec_size;
        at += ssd_sum_entry_size(rec.key_len);
        n++;
    }
    if (n != info->count) {
        info->why = "the entry count does not match the header";
        return KV_CHECKSUM_MISMATCH;
    }
    return 0;
}

int
ssd_sum_decode(const uint8_t *buf, uint64_t len, uint64_t bucket, uint64_t file_size,
               uint32_t max_key, uint64_t max_value, struct ssd_sum_info *info, ssd_scan_fn *fn,
               void *arg)
{
    int rc;

    memset(info, 0, sizeof(*info));
    if (len < SSD_SUM_HDR_SIZE) {
        info->why = "shorter than its header";
        return KV_INVALID_ARGUMENT;
    }
    if (ssd_sum_get32(buf) != SSD_SUM_MAGIC) {
        info->why = "no summary magic";
        return KV_CHECKSUM_MISMATCH;
    }
    if ((uint16_t)(buf[4] | buf[5] << 8) != SSD_SUM_VERSION || buf[6] != 0 || buf[7] != 0
        || ssd_sum_get32(buf + 44) != 0) {
        info->why = "an unknown version or flags";
        return KV_CHECKSUM_MISMATCH;
    }
    if (ssd_sum_get64(buf + 32) != len - SSD_SUM_HDR_SIZE) {
        info->why = "its length is not the one its header declares";
        return KV_INVALID_ARGUMENT;
    }
    if (ssd_sum_crc(buf, len) != ssd_sum_get32(buf + SSD_SUM_CRC_AT)) {
        info->why = "its checksum does not match";
        return KV_CHECKSUM_MISMATCH;
    }
    info->bucket = ssd_sum_get64(buf + 8);
    info->count = ssd_sum_get64(buf + 16);
    info->covered = ssd_sum_get64(buf + 24);
    if (info->bucket != bucket) {
        info->why = "it is another bucket's summary";
        return KV_CHECKSUM_MISMATCH;
    }
    if (info->covered > file_size || info->covered % SSD_REC_ALIGN != 0) {
        info->why = "it covers past the end of the bucket file (cut short)";
        return KV_CHECKSUM_MISMATCH;
    }
    rc = ssd_sum_walk(buf, len, max_key, max_value, info, NULL, NULL);
    if (rc == 0 && fn != NULL) {
        /* Verified whole: now report it. */
        rc = ssd_sum_walk(buf, len, max_key, max_value, info, fn, arg);
    }
    return rc;
}
