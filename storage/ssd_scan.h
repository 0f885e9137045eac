/*
 * ssd_scan: walk one bucket file's records from its start without the
 * index, verifying each record's header CRC and value CRC (ssd_record.h),
 * for rebuilding a lost index. It reads the file and nothing else: no index,
 * no store, no bucket table, no writes to the file.
 *
 * The walk goes from record to record by the lengths in each verified
 * header, so it is always at a record boundary. It stops at the first block
 * that is not a whole, verified record header: zeros (the unwritten end), a
 * header that fails its checks (damage), or a record cut short by the end of
 * the file (truncation). It does not search past damage for the next header:
 * a value's bytes may hold a well-formed header at a 4 KiB boundary (a client
 * chooses its values), and a record found that way could carry any tenant's
 * key. A record whose header verifies but whose value fails its CRC is
 * skipped (its length is known, so the walk stays in step) and counted.
 */
#ifndef SSD_SCAN_H
#define SSD_SCAN_H

#include <stdint.h>

#include "ssd_record.h"

/* Why a walk stopped. */
enum ssd_scan_end {
    SSD_SCAN_END_CLEAN = 0,     /* end of file, or zeros: no damage seen */
    SSD_SCAN_END_DAMAGED = 1,   /* a block that is not a valid header */
    SSD_SCAN_END_SHORT = 2,     /* the last record runs past the end of the file */
    SSD_SCAN_END_IO = 3         /* a read failed (rc in the result) */
};

struct ssd_scan_result {
    uint64_t records;           /* whole records whose header and value verified */
    uint64_t bad_values;        /* records skipped: header fine, value CRC wrong */
    uint64_t end;               /* offset just past the last whole record (verified or
                                   skipped): what the file may be cut to */
    uint64_t file_size;
    int why;                    /* enum ssd_scan_end */
    int rc;                     /* -errno with SSD_SCAN_END_IO, else 0 */
};

/*
 * A verified record: rec (rec->key valid only during the call) whose value
 * starts at file offset value_off. Return 0 to go on; anything else stops
 * the walk and ssd_scan_fd returns it.
 */
typedef int ssd_scan_fn(void *arg, const struct ssd_rec *rec, uint64_t value_off);

/*
 * ssd_scan_fd: walk the records of the bucket file open at fd (read with
 * pread; any open mode that allows reading: the walk reads the whole file in
 * order, with reads of up to bufsize bytes at SSD_REC_ALIGN-aligned offsets,
 * so O_DIRECT works and saves the copy out of the page cache; a descriptor
 * whose file system refuses O_DIRECT reads is switched to buffered ones). buf is the
 * caller's buffer of bufsize bytes (at least 2 x the largest header block,
 * SSD_REC_ALIGN aligned); max_key/max_value bound the lengths a header may
 * declare. Fills *res. Returns 0 (whatever damage was found: res says), or
 * the first non-zero fn result.
 */
int ssd_scan_fd(int fd, uint8_t *buf, uint64_t bufsize, uint32_t max_key, uint64_t max_value,
                ssd_scan_fn *fn, void *arg, struct ssd_scan_result *res);

/*
 * ssd_scan_fd_from: ssd_scan_fd from file offset start (a record boundary,
 * a multiple of SSD_REC_ALIGN: the end of what a bucket summary covers), as
 * if the file's records began there; res->end is at least start.
 */
int ssd_scan_fd_from(int fd, uint64_t start, uint8_t *buf, uint64_t bufsize, uint32_t max_key,
                     uint64_t max_value, ssd_scan_fn *fn, void *arg, struct ssd_scan_result *res);

/* ssd_scan_end_name: "clean", "damaged", "short" or "read error". */
const char *ssd_scan_end_name(int why);

#endif
