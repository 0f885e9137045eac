/*
 * ssd_record: the byte layout of one record in a bucket file, written and
 * read field by field in little-endian so the format does not depend on the
 * compiler's struct layout or the host's byte order. It owns nothing but the
 * format: it must not do file I/O, allocate, or consult the index.
 *
 * Decoding trusts no field until it has been checked: the lengths are
 * compared with the caller's limits before they size anything, and the
 * header CRC is computed only once the buffer is known to hold the key it
 * covers. The CRC does not cover bytes 36..47 (hdr_crc itself and the
 * reserved word), so the reserved word is required to be zero instead.
 */
#include "ssd_record.h"

#include "crc32c.h"
#include "kverr.h"

#include <string.h>

#define SSD_REC_CRC_SPAN 36u        /* header bytes covered by hdr_crc (before the key) */

static void
ssd_rec_put16(uint8_t *p, uint16_t v)
{
    p[0] = (uint8_t)v;
    p[1] = (uint8_t)(v >> 8);
}

static void
ssd_rec_put32(uint8_t *p, uint32_t v)
{
    for (int i = 0; i < 4; i++) {
        p[i] = (uint8_t)(v >> (8 * i));
    }
}

static void
ssd_rec_put64(uint8_t *p, uint64_t v)
{
    for (int i = 0; i < 8; i++) {
        p[i] = (uint8_t)(v >> (8 * i));
    }
}

static uint16_t
ssd_rec_get16(const uint8_t *p)
{
    return (uint16_t)(p[0] | p[1] << 8);
}

static uint32_t
ssd_rec_get32(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static uint64_t
ssd_rec_get64(const uint8_t *p)
{
    return (uint64_t)ssd_rec_get32(p) | (uint64_t)ssd_rec_get32(p + 4) << 32;
}

static uint64_t
ssd_rec_align(uint64_t n)
{
    return (n + (SSD_REC_ALIGN - 1)) & ~(uint64_t)(SSD_REC_ALIGN - 1);
}

/* ssd_rec_hdr_crc: hdr_crc of an encoded header (bytes 0..35) and its key. */
static uint32_t
ssd_rec_hdr_crc(const uint8_t *hdr, const uint8_t *key, uint32_t key_len)
{
    uint32_t crc = crc32c_extend(0, hdr, SSD_REC_CRC_SPAN);

    return crc32c_extend(crc, key, key_len);
}

uint64_t
ssd_rec_hdr_block(uint32_t key_len)
{
    return ssd_rec_align((uint64_t)SSD_REC_HDR_SIZE + key_len);
}

uint64_t
ssd_rec_value_span(uint64_t value_len)
{
    return ssd_rec_align(value_len);
}

uint64_t
ssd_rec_size(uint32_t key_len, uint64_t value_len)
{
    return ssd_rec_hdr_block(key_len) + ssd_rec_value_span(value_len);
}

uint32_t
ssd_rec_key_crc(uint32_t tenant, const uint8_t *key, uint32_t key_len)
{
    uint8_t t[4];

    ssd_rec_put32(t, tenant);
    return crc32c_extend(crc32c_extend(0, t, sizeof(t)), key, key_len);
}

uint64_t
ssd_rec_encode(const struct ssd_rec *rec, uint8_t *buf)
{
    uint64_t block = ssd_rec_hdr_block(rec->key_len);

    memset(buf, 0, (size_t)block);
    ssd_rec_put32(buf + 0, SSD_REC_MAGIC);
    ssd_rec_put16(buf + 4, SSD_REC_VERSION);
    ssd_rec_put16(buf + 6, 0);
    ssd_rec_put32(buf + 8, rec->tenant);
    ssd_rec_put32(buf + 12, rec->key_len);
    ssd_rec_put64(buf + 16, rec->value_len);
    ssd_rec_put64(buf + 24, rec->seq);
    ssd_rec_put32(buf + 32, rec->value_crc);
    if (rec->key_len > 0) {
        memcpy(buf + SSD_REC_HDR_SIZE, rec->key, rec->key_len);
    }
    ssd_rec_put32(buf + 36, ssd_rec_hdr_crc(buf, buf + SSD_REC_HDR_SIZE, rec->key_len));
    ssd_rec_put64(buf + 40, 0);
    return block;
}

/* ssd_rec_all_zero: whether buf[0..len) is all zero bytes. */
static int
ssd_rec_all_zero(const uint8_t *buf, size_t len)
{
    for (size_t i = 0; i < len; i++) {
        if (buf[i] != 0) {
            return 0;
        }
    }
    return 1;
}

int
ssd_rec_decode(const uint8_t *buf, size_t len, uint32_t max_key, uint64_t max_value,
               struct ssd_rec *rec)
{
    uint32_t key_len;
    uint64_t value_len;

    if (len < SSD_REC_HDR_SIZE) {
        return KV_INVALID_ARGUMENT;
    }
    if (ssd_rec_get32(buf) != SSD_REC_MAGIC) {
        /* Zeros are the unwritten tail of a bucket; anything else there is
         * damage, and must not read as a clean end of the records. */
        return ssd_rec_all_zero(buf, SSD_REC_HDR_SIZE) ? KV_NOT_FOUND : KV_CHECKSUM_MISMATCH;
    }
    if (ssd_rec_get16(buf + 4) != SSD_REC_VERSION || ssd_rec_get16(buf + 6) != 0 ||
        ssd_rec_get64(buf + 40) != 0) {
        return KV_CHECKSUM_MISMATCH;
    }
    key_len = ssd_rec_get32(buf + 12);
    value_len = ssd_rec_get64(buf + 16);
    if (key_len > max_key || value_len > max_value) {
        return KV_CHECKSUM_MISMATCH;
    }
    if (len < ssd_rec_hdr_block(key_len)) {
        return KV_INVALID_ARGUMENT;
    }
    if (ssd_rec_get32(buf + 36) != ssd_rec_hdr_crc(buf, buf + SSD_REC_HDR_SIZE, key_len)) {
        return KV_CHECKSUM_MISMATCH;
    }
    rec->tenant = ssd_rec_get32(buf + 8);
    rec->key_len = key_len;
    rec->value_len = value_len;
    rec->seq = ssd_rec_get64(buf + 24);
    rec->value_crc = ssd_rec_get32(buf + 32);
    rec->key = buf + SSD_REC_HDR_SIZE;
    return 0;
}

int
ssd_rec_verify_value(const struct ssd_rec *rec, const void *value)
{
    const uint8_t *p = value;
    uint64_t left = rec->value_len;
    uint32_t crc = ssd_rec_key_crc(rec->tenant, rec->key, rec->key_len);

    /* In chunks, so a value_len beyond SIZE_MAX (32-bit hosts) is not truncated. */
    while (left > 0) {
        size_t n = left > (1u << 30) ? (size_t)1 << 30 : (size_t)left;

        crc = crc32c_extend(crc, p, n);
        p += n;
        left -= n;
    }
    return crc == rec->value_crc ? 0 : KV_CHECKSUM_MISMATCH;
}
