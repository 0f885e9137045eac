/*
 * ssd_clean: the SSD index's clean-shutdown marker. After a clean close the
 * tier writes <index>/clean_shutdown, which names the size of data.mdb and
 * the CRC-32C of all its bytes; the next open takes the marker (removes it
 * before anything writes the index) and, when data.mdb still has exactly
 * that size and checksum, the index is byte for byte the one a clean close
 * left: the full walk of every page and value in a separate process
 * (idx_verify) can be skipped. Anything else (no marker: a kill or a crash;
 * a marker that does not parse; a data.mdb changed, cut or grown since: a
 * disk fault, a bad restore, a zeroed meta page) keeps the full check.
 *
 * Threads: the caller's; no state. Both calls read data.mdb through the page
 * cache (the open's read is the one idx_warm would do anyway).
 */
#ifndef SSD_CLEAN_H
#define SSD_CLEAN_H

#include <stddef.h>

#define SSD_CLEAN_NAME "clean_shutdown"  /* the marker's file name in the index directory */

/*
 * ssd_clean_mark: after the index environment in dir is closed (nothing may
 * write it any more), checksum dir/data.mdb and write dir/clean_shutdown
 * (written to a temporary name, synced, renamed, the directory synced).
 * 0, or -errno (the marker is then absent and the next open checks in full).
 */
int ssd_clean_mark(const char *dir);

/*
 * ssd_clean_take: before the index in dir is opened: remove dir/clean_shutdown
 * (the removal synced) and say whether data.mdb is what it described.
 * Returns 1 when it is (the full check may be skipped); 0 when it is not or
 * there was no marker, with the reason in why (always NUL-terminated). Never
 * fails otherwise: any doubt is a 0.
 */
int ssd_clean_take(const char *dir, char *why, size_t whylen);

#endif
