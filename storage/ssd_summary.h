/*
 * ssd_summary: the on-disk format of a bucket summary, the side file
 * bucket-<id>.kvh written next to bucket-<id>.kvb when the writer seals the
 * bucket (Bitcask's hint file). It lists every record of the bucket with the
 * header fields a rebuild needs to make the record's index entry, so a
 * rebuild reads a few MB instead of the bucket's values. Pure
 * encode/decode/verify on memory buffers: no file I/O, no allocation.
 *
 * Layout (little-endian):
 *
 *   header (SSD_SUM_HDR_SIZE = 48 bytes)
 *    0 u32 magic      SSD_SUM_MAGIC (bytes 'K','V','S','H')
 *    4 u16 version    SSD_SUM_VERSION
 *    6 u16 flags      0 (a reader rejects any other value)
 *    8 u64 bucket     the id of the bucket file it describes
 *   16 u64 count      entries that follow
 *   24 u64 covered    bytes of the bucket file the entries describe: every
 *                     record lies wholly in [0, covered)
 *   32 u64 body_len   bytes of the entries (the file is 48 + body_len long)
 *   40 u32 crc        CRC-32C over header bytes 0..39, then the body
 *   44 u32 reserved   0
 *   entries, each SSD_SUM_ENT_FIXED (36) bytes then the key:
 *    0 u64 offset     file offset of the record (its header block), a
 *                     multiple of SSD_REC_ALIGN, ascending, records not
 *                     overlapping
 *    8 u64 value_len
 *   16 u64 seq
 *   24 u32 tenant
 *   28 u32 key_len
 *   32 u32 value_crc  as in the record header (ssd_record.h)
 *   36 key            key_len bytes
 *
 * A summary says nothing about the values' bytes: a rebuild that trusts it
 * leaves their checking to the reads (every read verifies value_crc) and to
 * the scrub that follows the rebuild.
 */
#ifndef SSD_SUMMARY_H
#define SSD_SUMMARY_H

#include <stddef.h>
#include <stdint.h>

#include "ssd_record.h"
#include "ssd_scan.h"

#define SSD_SUM_MAGIC 0x4853564bu   /* bytes "KVSH" */
#define SSD_SUM_VERSION 1u
#define SSD_SUM_HDR_SIZE 48u
#define SSD_SUM_ENT_FIXED 36u

/* What a verified summary's header says. */
struct ssd_sum_info {
    uint64_t bucket;
    uint64_t count;
    uint64_t covered;
    const char *why;    /* when decoding failed: why, for a log line (static text) */
};

/* ssd_sum_entry_size: bytes of one entry for a key of key_len bytes. */
uint64_t ssd_sum_entry_size(uint32_t key_len);

/*
 * ssd_sum_entry_encode: write the entry of the record at file offset
 * `offset` whose header is rec (rec->key, rec->key_len bytes) into buf, which
 * must hold ssd_sum_entry_size(rec->key_len) bytes. Returns bytes written.
 */
uint64_t ssd_sum_entry_encode(const struct ssd_rec *rec, uint64_t offset, uint8_t *buf);

/*
 * ssd_sum_finish: write the header into buf[0..SSD_SUM_HDR_SIZE) for the
 * count entries already encoded in buf[SSD_SUM_HDR_SIZE..len), and its CRC.
 * len must be at least SSD_SUM_HDR_SIZE.
 */
void ssd_sum_finish(uint8_t *buf, uint64_t len, uint64_t bucket, uint64_t count, uint64_t covered);

/*
 * ssd_sum_decode: verify the summary in buf[0..len) as a whole, then (when
 * fn is not NULL) call fn for each entry in order with its record header
 * (rec->key points into buf) and the file offset of its value, as ssd_scan_fd
 * does for a record it verified. Nothing is reported unless all of it
 * verifies: magic, version, flags, the length, the CRC, the bucket id
 * (must be `bucket`), the covered length (at most file_size, the bucket
 * file's size: a summary of a file since cut short does not match it), and
 * every entry (it fits in the body, key_len at most max_key, value_len at
 * most max_value, offset aligned and past the previous record, the record
 * inside `covered`), and count entries exactly fill the body. Fills *info (why on failure). Returns 0; KV_INVALID_ARGUMENT when
 * buf is shorter or longer than the summary it declares (a truncation);
 * KV_CHECKSUM_MISMATCH for anything else that fails (damage, another
 * bucket's summary, an entry that cannot be right); or the first non-zero fn
 * result.
 */
int ssd_sum_decode(const uint8_t *buf, uint64_t len, uint64_t bucket, uint64_t file_size,
                   uint32_t max_key, uint64_t max_value, struct ssd_sum_info *info,
                   ssd_scan_fn *fn, void *arg);

#endif
