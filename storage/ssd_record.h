/*
 * ssd_record: the on-disk format of one object in a bucket file. Pure
 * encode/decode/verify on memory buffers; no file I/O, no allocation.
 *
 * A bucket file is a sequence of records, each starting at a multiple of
 * SSD_REC_ALIGN (4096) bytes, so that a record's value can be read and
 * written with O_DIRECT straight from/to arena pages:
 *
 *   offset 0            header block: SSD_REC_HDR_SIZE header bytes, then the key,
 *                       zero padding up to a multiple of SSD_REC_ALIGN
 *   offset hdr_block    value bytes, zero padding up to a multiple of SSD_REC_ALIGN
 *
 * Header (little-endian, 48 bytes):
 *    0 u32 magic      SSD_REC_MAGIC ("KVSR" read as bytes 'K','V','S','R')
 *    4 u16 version    SSD_REC_VERSION
 *    6 u16 flags      0 (reserved; a reader rejects unknown bits)
 *    8 u32 tenant
 *   12 u32 key_len
 *   16 u64 value_len
 *   24 u64 seq        the writer's sequence number (monotonic per ssd_dir)
 *   32 u32 value_crc  CRC-32C over tenant (4 bytes LE), key, then value:
 *                     a value read under the wrong key fails it too
 *   36 u32 hdr_crc    CRC-32C over header bytes 0..35 then the key
 *   40 u64 reserved   0
 * A bucket file can be walked and every record verified without the index.
 */
#ifndef SSD_RECORD_H
#define SSD_RECORD_H

#include <stddef.h>
#include <stdint.h>

#define SSD_REC_MAGIC 0x5253564bu   /* bytes "KVSR" */
#define SSD_REC_VERSION 1u
#define SSD_REC_HDR_SIZE 48u
#define SSD_REC_ALIGN 4096u

/* A decoded header. key points into the buffer it was decoded from. */
struct ssd_rec {
    uint32_t tenant;
    uint32_t key_len;
    uint64_t value_len;
    uint64_t seq;
    uint32_t value_crc;
    const uint8_t *key;
};

/* ssd_rec_hdr_block: bytes of the header block for a key of key_len bytes (aligned). */
uint64_t ssd_rec_hdr_block(uint32_t key_len);

/* ssd_rec_value_span: bytes the value occupies on disk (value_len aligned up). */
uint64_t ssd_rec_value_span(uint64_t value_len);

/* ssd_rec_size: whole record bytes (header block + value span). */
uint64_t ssd_rec_size(uint32_t key_len, uint64_t value_len);

/*
 * ssd_rec_key_crc: the value_crc state after tenant and key; extend it over
 * the value with crc32c_extend to get value_crc.
 */
uint32_t ssd_rec_key_crc(uint32_t tenant, const uint8_t *key, uint32_t key_len);

/*
 * ssd_rec_encode: write the header block of rec (rec->key, key_len bytes)
 * into buf, which must hold ssd_rec_hdr_block(rec->key_len) bytes; padding
 * is zeroed. rec->value_crc must already be computed. Returns bytes written.
 */
uint64_t ssd_rec_encode(const struct ssd_rec *rec, uint8_t *buf);

/*
 * ssd_rec_decode: parse and verify a header block from buf[0..len).
 * Returns 0 and *rec (rec->key points into buf), or:
 *   KV_NOT_FOUND          the magic is absent (end of the written part: zeros)
 *   KV_CHECKSUM_MISMATCH  magic present but hdr_crc wrong, unknown version or
 *                         flags, or lengths that do not fit (key_len over
 *                         max_key, value_len over max_value)
 *   KV_INVALID_ARGUMENT   len shorter than the header block the header declares
 */
int ssd_rec_decode(const uint8_t *buf, size_t len, uint32_t max_key, uint64_t max_value,
                   struct ssd_rec *rec);

/*
 * ssd_rec_verify_value: 0 when the value bytes hash to rec->value_crc,
 * else KV_CHECKSUM_MISMATCH.
 */
int ssd_rec_verify_value(const struct ssd_rec *rec, const void *value);

#endif
