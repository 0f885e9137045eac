/*
 * crc32c: CRC-32C over memory buffers. This module owns the lookup tables
 * and the one-time choice between the SSE4.2 crc32 instruction and the
 * portable slicing-by-8 path; it must not do I/O, allocate, or know what the
 * bytes are.
 *
 * The crc32 instruction issues one per cycle but a dependent chain waits its
 * latency (three cycles on Intel, more on AMD Zen), so a single chain runs at
 * a fraction of its speed. For long buffers the hardware path checksums six
 * adjacent blocks as six independent chains, then joins them by advancing the
 * earlier CRCs over the length of the later blocks with a precomputed "append
 * that many zero bytes" operator, applied as four byte-indexed tables (the
 * technique of Mark Adler's crc32c.c). Three chains are enough on Intel; on
 * this project's AMD EPYC machine six ran 10% faster than three on a cached
 * 1 MiB buffer and half again as fast on buffers out of cache
 * (docs/bench-log.md, 1 December 2026). The tables and the CPU probe are
 * built once, under pthread_once, on first use.
 */
#include "crc32c.h"

#include <pthread.h>
#include <string.h>

#define CRC32C_POLY 0x82f63b78u     /* reflected Castagnoli polynomial */

/* ---- portable path: slicing-by-8 ---- */

static uint32_t crc32c_table[8][256];

static void
crc32c_sw_init(void)
{
    for (uint32_t n = 0; n < 256; n++) {
        uint32_t crc = n;

        for (int k = 0; k < 8; k++) {
            crc = (crc & 1) ? (crc >> 1) ^ CRC32C_POLY : crc >> 1;
        }
        crc32c_table[0][n] = crc;
    }
    for (uint32_t n = 0; n < 256; n++) {
        uint32_t crc = crc32c_table[0][n];

        for (int k = 1; k < 8; k++) {
            crc = crc32c_table[0][crc & 0xff] ^ (crc >> 8);
            crc32c_table[k][n] = crc;
        }
    }
}

/* crc32c_sw_run: the raw (unconditioned) CRC register over buf; tables built. */
static uint32_t
crc32c_sw_run(uint32_t crc, const uint8_t *p, size_t len)
{
    while (len > 0 && ((uintptr_t)p & 7) != 0) {
        crc = crc32c_table[0][(crc ^ *p++) & 0xff] ^ (crc >> 8);
        len--;
    }
    /* Bytes are combined explicitly, so this is right on any endianness;
     * on little-endian targets the compiler turns it into one 32-bit load. */
    while (len >= 8) {
        crc ^= (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 |
               (uint32_t)p[3] << 24;
        crc = crc32c_table[7][crc & 0xff] ^ crc32c_table[6][(crc >> 8) & 0xff] ^
              crc32c_table[5][(crc >> 16) & 0xff] ^ crc32c_table[4][crc >> 24] ^
              crc32c_table[3][p[4]] ^ crc32c_table[2][p[5]] ^ crc32c_table[1][p[6]] ^
              crc32c_table[0][p[7]];
        p += 8;
        len -= 8;
    }
    while (len > 0) {
        crc = crc32c_table[0][(crc ^ *p++) & 0xff] ^ (crc >> 8);
        len--;
    }
    return crc;
}

/* ---- hardware path: SSE4.2 crc32, six interleaved streams ---- */

#if defined(__x86_64__) || defined(__i386__)
#define CRC32C_HAVE_HW 1

#define CRC32C_WAYS 6       /* streams per block (crc32c_hw_nway runs exactly this many) */
#define CRC32C_LONG 8192    /* stream length of the big blocks */
#define CRC32C_SHORT 128    /* stream length of the small blocks */

/*
 * zeros[k][b]: the CRC register after appending CRC32C_LONG (or _SHORT) zero
 * bytes to a register whose only nonzero byte is byte k, equal to b. A
 * register is advanced over n zeros by xoring the four entries of its bytes:
 * appending zeros is linear over GF(2).
 */
static uint32_t crc32c_long_zeros[4][256];
static uint32_t crc32c_short_zeros[4][256];

static uint32_t
crc32c_gf2_times(const uint32_t *mat, uint32_t vec)
{
    uint32_t sum = 0;

    while (vec != 0) {
        if (vec & 1) {
            sum ^= *mat;
        }
        vec >>= 1;
        mat++;
    }
    return sum;
}

static void
crc32c_gf2_square(uint32_t *square, const uint32_t *mat)
{
    for (int n = 0; n < 32; n++) {
        square[n] = crc32c_gf2_times(mat, mat[n]);
    }
}

/* crc32c_zeros_op: the 32x32 operator that appends len zero bytes; len a power of two. */
static void
crc32c_zeros_op(uint32_t *even, size_t len)
{
    uint32_t odd[32];
    uint32_t row = 1;

    /* One zero bit: shift right, folding the polynomial in. */
    odd[0] = CRC32C_POLY;
    for (int n = 1; n < 32; n++) {
        odd[n] = row;
        row <<= 1;
    }
    crc32c_gf2_square(even, odd);   /* two zero bits */
    crc32c_gf2_square(odd, even);   /* four zero bits */

    /* Each square doubles the count: the first gives one zero byte in even. */
    for (;;) {
        crc32c_gf2_square(even, odd);
        len >>= 1;
        if (len == 0) {
            return;
        }
        crc32c_gf2_square(odd, even);
        len >>= 1;
        if (len == 0) {
            memcpy(even, odd, sizeof(odd));
            return;
        }
    }
}

static void
crc32c_zeros_init(uint32_t zeros[4][256], size_t len)
{
    uint32_t op[32];

    crc32c_zeros_op(op, len);
    for (uint32_t n = 0; n < 256; n++) {
        for (int k = 0; k < 4; k++) {
            zeros[k][n] = crc32c_gf2_times(op, n << (8 * k));
        }
    }
}

static inline uint32_t
crc32c_shift(uint32_t zeros[4][256], uint32_t crc)
{
    return zeros[0][crc & 0xff] ^ zeros[1][(crc >> 8) & 0xff] ^ zeros[2][(crc >> 16) & 0xff] ^
           zeros[3][crc >> 24];
}

/* crc32c_hw_word: eight bytes through the crc32 instruction (x86-64: one, i386: two). */
__attribute__((target("sse4.2"))) static inline uint32_t
crc32c_hw_word(uint32_t crc, const uint8_t *p)
{
#if defined(__x86_64__)
    uint64_t w;

    memcpy(&w, p, sizeof(w));
    return (uint32_t)__builtin_ia32_crc32di(crc, w);
#else
    uint32_t w[2];

    memcpy(w, p, sizeof(w));
    crc = __builtin_ia32_crc32si(crc, w[0]);
    return __builtin_ia32_crc32si(crc, w[1]);
#endif
}

/* crc32c_hw_step: eight bytes into a 64-bit register (x86-64: no zero-extension between steps). */
__attribute__((target("sse4.2"), always_inline)) static inline uint64_t
crc32c_hw_step(uint64_t crc, const uint8_t *p)
{
#if defined(__x86_64__)
    uint64_t w;

    memcpy(&w, p, sizeof(w));
    return __builtin_ia32_crc32di(crc, w);
#else
    return crc32c_hw_word((uint32_t)crc, p);
#endif
}

/*
 * crc32c_hw_nway: n blocks of CRC32C_WAYS * stride bytes, each as CRC32C_WAYS
 * streams run side by side, joined with the zeros table for stride (each join
 * advances the CRC so far over one stream and folds the next stream's CRC in).
 * Always inlined with a constant stride, so the six loads address off one
 * pointer with immediate displacements (a variable stride spilled registers).
 * Returns the register.
 */
__attribute__((target("sse4.2"), always_inline)) static inline uint32_t
crc32c_hw_nway(uint32_t crc, const uint8_t **pp, size_t n, size_t stride,
               uint32_t zeros[4][256])
{
    const uint8_t *p = *pp;

    while (n-- > 0) {
        uint64_t c0 = crc;
        uint64_t c1 = 0;
        uint64_t c2 = 0;
        uint64_t c3 = 0;
        uint64_t c4 = 0;
        uint64_t c5 = 0;
        const uint8_t *end = p + stride;

        do {
            c0 = crc32c_hw_step(c0, p);
            c1 = crc32c_hw_step(c1, p + stride);
            c2 = crc32c_hw_step(c2, p + 2 * stride);
            c3 = crc32c_hw_step(c3, p + 3 * stride);
            c4 = crc32c_hw_step(c4, p + 4 * stride);
            c5 = crc32c_hw_step(c5, p + 5 * stride);
            p += 8;
        } while (p < end);
        crc = crc32c_shift(zeros, (uint32_t)c0) ^ (uint32_t)c1;
        crc = crc32c_shift(zeros, crc) ^ (uint32_t)c2;
        crc = crc32c_shift(zeros, crc) ^ (uint32_t)c3;
        crc = crc32c_shift(zeros, crc) ^ (uint32_t)c4;
        crc = crc32c_shift(zeros, crc) ^ (uint32_t)c5;
        p += (CRC32C_WAYS - 1) * stride;
    }
    *pp = p;
    return crc;
}

__attribute__((target("sse4.2"))) static uint32_t
crc32c_hw_run(uint32_t crc, const uint8_t *p, size_t len)
{
    while (len > 0 && ((uintptr_t)p & 7) != 0) {
        crc = __builtin_ia32_crc32qi(crc, *p++);
        len--;
    }
    if (len >= CRC32C_WAYS * CRC32C_LONG) {
        size_t n = len / (CRC32C_WAYS * CRC32C_LONG);

        crc = crc32c_hw_nway(crc, &p, n, CRC32C_LONG, crc32c_long_zeros);
        len -= n * CRC32C_WAYS * CRC32C_LONG;
    }
    if (len >= CRC32C_WAYS * CRC32C_SHORT) {
        size_t n = len / (CRC32C_WAYS * CRC32C_SHORT);

        crc = crc32c_hw_nway(crc, &p, n, CRC32C_SHORT, crc32c_short_zeros);
        len -= n * CRC32C_WAYS * CRC32C_SHORT;
    }
    while (len >= 8) {
        crc = crc32c_hw_word(crc, p);
        p += 8;
        len -= 8;
    }
    while (len > 0) {
        crc = __builtin_ia32_crc32qi(crc, *p++);
        len--;
    }
    return crc;
}
#endif /* x86 */

/* ---- dispatch ---- */

static pthread_once_t crc32c_once = PTHREAD_ONCE_INIT;
static uint32_t (*crc32c_run)(uint32_t crc, const uint8_t *p, size_t len);

static void
crc32c_init(void)
{
    crc32c_sw_init();
    crc32c_run = crc32c_sw_run;
#ifdef CRC32C_HAVE_HW
    __builtin_cpu_init();
    if (__builtin_cpu_supports("sse4.2")) {
        crc32c_zeros_init(crc32c_long_zeros, CRC32C_LONG);
        crc32c_zeros_init(crc32c_short_zeros, CRC32C_SHORT);
        crc32c_run = crc32c_hw_run;
    }
#endif
}

uint32_t
crc32c_extend(uint32_t crc, const void *buf, size_t len)
{
    /* pthread_once orders the table writes before every reader's use. */
    pthread_once(&crc32c_once, crc32c_init);
    if (len == 0) {
        return crc;
    }
    return ~crc32c_run(~crc, buf, len);
}

uint32_t
crc32c_sw(uint32_t crc, const void *buf, size_t len)
{
    pthread_once(&crc32c_once, crc32c_init);
    if (len == 0) {
        return crc;
    }
    return ~crc32c_sw_run(~crc, buf, len);
}

int
crc32c_hw(void)
{
    pthread_once(&crc32c_once, crc32c_init);
    return crc32c_run != crc32c_sw_run;
}
