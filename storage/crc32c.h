/*
 * crc32c: CRC-32C (Castagnoli, reflected polynomial 0x82f63b78), the checksum
 * of SSD records (ssd_record.h). One implementation is chosen once per
 * process: the SSE4.2 crc32 instruction when the CPU has it, otherwise
 * slicing-by-8 tables. Both give identical results.
 *
 * Threads: every function is safe to call from any thread at once. The first
 * call builds the tables and probes the CPU exactly once (pthread_once); no
 * call allocates or takes a lock after that.
 */
#ifndef CRC32C_H
#define CRC32C_H

#include <stddef.h>
#include <stdint.h>

/*
 * crc32c_extend: the CRC-32C of the bytes a CRC-32C of `crc` was taken over,
 * followed by buf[0..len). Start a new checksum with crc 0; the
 * pre/post-conditioning (~) is applied inside, so
 *   crc32c_extend(crc32c_extend(0, a, na), b, nb) == CRC-32C of a then b,
 * and crc32c_extend(0, "123456789", 9) == 0xe3069283.
 * buf is borrowed for the call and may be NULL only when len is 0.
 */
uint32_t crc32c_extend(uint32_t crc, const void *buf, size_t len);

/*
 * crc32c_sw: crc32c_extend always on the portable table path, whatever the
 * CPU. Same contract and results; for tests and benchmarks that compare the
 * two paths. Production code calls crc32c_extend.
 */
uint32_t crc32c_sw(uint32_t crc, const void *buf, size_t len);

/* crc32c_hw: 1 when crc32c_extend runs on the SSE4.2 instruction, 0 on tables (for logs). */
int crc32c_hw(void);

#endif
