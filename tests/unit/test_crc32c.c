/*
 * test_crc32c: CRC-32C as the SSD records rely on it: the published check
 * value and the iSCSI test vectors (RFC 3720 B.4), agreement of the hardware
 * and table paths with a bit-at-a-time reference at every length and
 * alignment the six-way blocking can split on, composition through
 * crc32c_extend, detection of every single-bit error, and a racing first use
 * from many threads (each Criterion test runs in a fresh process, so that
 * test really is the first use).
 */
#include <criterion/criterion.h>

#include "crc32c.h"

#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define MiB (1024u * 1024u)

static uint64_t
t_rand(uint64_t *st)
{
    /* xorshift64*: deterministic per seed, so a failure reproduces. */
    *st ^= *st >> 12;
    *st ^= *st << 25;
    *st ^= *st >> 27;
    return *st * 0x2545f4914f6cdd1dull;
}

static void
t_fill(uint8_t *p, size_t len, uint64_t seed)
{
    uint64_t st = seed | 1;

    for (size_t i = 0; i < len; i++) {
        p[i] = (uint8_t)(t_rand(&st) >> 56);
    }
}

/* t_crc_ref: the definition, one bit at a time; shares nothing with the module. */
static uint32_t
t_crc_ref(uint32_t crc, const uint8_t *p, size_t len)
{
    crc = ~crc;
    while (len-- > 0) {
        crc ^= *p++;
        for (int k = 0; k < 8; k++) {
            crc = (crc & 1) ? (crc >> 1) ^ 0x82f63b78u : crc >> 1;
        }
    }
    return ~crc;
}

/* t_have_hw: whether crc32c_extend runs on the crc32 instruction here. */
static int
t_have_hw(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_cpu_init();
    return __builtin_cpu_supports("sse4.2");
#else
    return 0;
#endif
}

/* Lengths where the hardware path changes strategy: 8-byte words, six
 * streams of 128 bytes (768), six streams of 8192 bytes (49,152), and their
 * edges; the three-stream edges of the earlier blocking stay in. */
static const size_t t_edge_lens[] = {
    7, 8, 9, 63, 64, 65, 767, 768, 769, 775, 776, 1535, 1536, 1543, 24575, 24576, 24577,
    24583, 25344, 25345, 49151, 49152, 49153, 49152 + 768 + 7, 98303, 98304, 98305,
    2 * 49152 + 2 * 768 + 15, 100000, MiB - 1, MiB, MiB + 13,
};

#define T_NEDGE (sizeof(t_edge_lens) / sizeof(t_edge_lens[0]))

Test(crc32c, check_value)
{
    const char *s = "123456789";

    cr_assert_eq(crc32c_extend(0, s, 9), 0xe3069283u, "got %08x",
                 (unsigned)crc32c_extend(0, s, 9));
    cr_assert_eq(crc32c_sw(0, s, 9), 0xe3069283u, "got %08x", (unsigned)crc32c_sw(0, s, 9));
}

Test(crc32c, rfc3720_vectors)
{
    uint8_t buf[48];

    memset(buf, 0, 32);
    cr_assert_eq(crc32c_extend(0, buf, 32), 0x8a9136aau);
    cr_assert_eq(crc32c_sw(0, buf, 32), 0x8a9136aau);

    memset(buf, 0xff, 32);
    cr_assert_eq(crc32c_extend(0, buf, 32), 0x62a8ab43u);
    cr_assert_eq(crc32c_sw(0, buf, 32), 0x62a8ab43u);

    for (int i = 0; i < 32; i++) {
        buf[i] = (uint8_t)i;
    }
    cr_assert_eq(crc32c_extend(0, buf, 32), 0x46dd794eu);
    cr_assert_eq(crc32c_sw(0, buf, 32), 0x46dd794eu);

    for (int i = 0; i < 32; i++) {
        buf[i] = (uint8_t)(31 - i);
    }
    cr_assert_eq(crc32c_extend(0, buf, 32), 0x113fdb5cu);
    cr_assert_eq(crc32c_sw(0, buf, 32), 0x113fdb5cu);

    /* The iSCSI read command PDU of the same appendix. */
    static const uint8_t pdu[48] = {
        0x01, 0xc0, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
        0x00, 0x00, 0x00, 0x00, 0x14, 0x00, 0x00, 0x00, 0x00, 0x00, 0x04, 0x00,
        0x00, 0x00, 0x00, 0x14, 0x00, 0x00, 0x00, 0x18, 0x28, 0x00, 0x00, 0x00,
        0x00, 0x00, 0x00, 0x00, 0x02, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
    };
    cr_assert_eq(crc32c_extend(0, pdu, sizeof(pdu)), 0xd9963a56u);
    cr_assert_eq(crc32c_sw(0, pdu, sizeof(pdu)), 0xd9963a56u);
}

Test(crc32c, empty_input_keeps_the_crc)
{
    cr_assert_eq(crc32c_extend(0, NULL, 0), 0u);
    cr_assert_eq(crc32c_extend(0xdeadbeefu, NULL, 0), 0xdeadbeefu);
    cr_assert_eq(crc32c_sw(0x12345678u, NULL, 0), 0x12345678u);
}

Test(crc32c, both_paths_match_reference, .timeout = 60)
{
    size_t cap = MiB + 64;
    uint8_t *buf = malloc(cap);

    cr_assert_not_null(buf);
    t_fill(buf, cap, 42);
    for (size_t len = 0; len <= 300; len++) {
        for (size_t off = 0; off < 8; off++) {
            uint32_t want = t_crc_ref(0, buf + off, len);

            cr_assert_eq(crc32c_extend(0, buf + off, len), want, "len %zu off %zu", len, off);
            cr_assert_eq(crc32c_sw(0, buf + off, len), want, "len %zu off %zu", len, off);
        }
    }
    for (size_t i = 0; i < T_NEDGE; i++) {
        size_t off = i % 8;
        uint32_t want = t_crc_ref(0, buf + off, t_edge_lens[i]);

        cr_assert_eq(crc32c_extend(0, buf + off, t_edge_lens[i]), want, "len %zu",
                     t_edge_lens[i]);
        cr_assert_eq(crc32c_sw(0, buf + off, t_edge_lens[i]), want, "len %zu", t_edge_lens[i]);
    }
    free(buf);
}

Test(crc32c, hardware_matches_tables, .timeout = 60)
{
    size_t cap = 2 * MiB + 64;
    uint8_t *buf;
    uint64_t st = 7;

    if (!t_have_hw()) {
        cr_skip_test("no SSE4.2 crc32 instruction on this CPU: only the table path exists");
    }
    buf = malloc(cap);
    cr_assert_not_null(buf);
    t_fill(buf, cap, 1234);
    /* Every length up to past two short six-way blocks, every misalignment. */
    for (size_t len = 0; len <= 1600; len++) {
        for (size_t off = 0; off < 16; off++) {
            cr_assert_eq(crc32c_extend(0, buf + off, len), crc32c_sw(0, buf + off, len),
                         "len %zu off %zu", len, off);
        }
    }
    for (size_t i = 0; i < T_NEDGE; i++) {
        for (size_t off = 0; off < 16; off += 3) {
            uint32_t seed = (uint32_t)t_rand(&st);

            cr_assert_eq(crc32c_extend(seed, buf + off, t_edge_lens[i]),
                         crc32c_sw(seed, buf + off, t_edge_lens[i]), "len %zu off %zu",
                         t_edge_lens[i], off);
        }
    }
    /* Random lengths up to 2 MiB, random offsets and starting CRCs. */
    for (int i = 0; i < 200; i++) {
        size_t len = (size_t)(t_rand(&st) % (2 * MiB));
        size_t off = (size_t)(t_rand(&st) % 64);
        uint32_t seed = (uint32_t)t_rand(&st);

        cr_assert_eq(crc32c_extend(seed, buf + off, len), crc32c_sw(seed, buf + off, len),
                     "len %zu off %zu", len, off);
    }
    free(buf);
}

Test(crc32c, extend_composes, .timeout = 60)
{
    size_t n = 3 * 24576 + 1000;
    uint8_t *buf = malloc(n);
    uint32_t whole;
    uint64_t st = 99;

    cr_assert_not_null(buf);
    t_fill(buf, n, 5);
    whole = crc32c_extend(0, buf, n);
    cr_assert_eq(whole, t_crc_ref(0, buf, n));

    /* Every split of a short prefix, through both paths. */
    for (size_t m = 0; m <= 1000; m += 37) {
        uint32_t want = crc32c_extend(0, buf, m);

        for (size_t i = 0; i <= m; i++) {
            uint32_t a = crc32c_extend(0, buf, i);

            cr_assert_eq(crc32c_extend(a, buf + i, m - i), want, "m %zu split %zu", m, i);
            cr_assert_eq(crc32c_sw(crc32c_sw(0, buf, i), buf + i, m - i), want);
        }
    }
    /* Random three-piece splits of the long buffer, across the three-way blocks. */
    for (int k = 0; k < 200; k++) {
        size_t i = (size_t)(t_rand(&st) % (n + 1));
        size_t j = i + (size_t)(t_rand(&st) % (n - i + 1));
        uint32_t c = crc32c_extend(0, buf, i);

        c = crc32c_extend(c, buf + i, j - i);
        c = crc32c_extend(c, buf + j, n - j);
        cr_assert_eq(c, whole, "splits %zu %zu", i, j);
    }
    free(buf);
}

Test(crc32c, every_single_bit_error_changes_the_crc, .timeout = 60)
{
    enum { LEN = 4096 };
    static uint8_t buf[LEN];
    uint32_t good;

    t_fill(buf, LEN, 77);
    good = crc32c_extend(0, buf, LEN);
    for (size_t bit = 0; bit < LEN * 8; bit++) {
        buf[bit / 8] ^= (uint8_t)(1u << (bit % 8));
        cr_assert_neq(crc32c_extend(0, buf, LEN), good, "bit %zu", bit);
        buf[bit / 8] ^= (uint8_t)(1u << (bit % 8));
    }
    cr_assert_eq(crc32c_extend(0, buf, LEN), good);
}

struct t_race {
    const uint8_t *buf;
    size_t len;
    uint32_t got;
};

static void *
t_race_main(void *arg)
{
    struct t_race *r = arg;

    r->got = crc32c_extend(0, r->buf, r->len);
    return NULL;
}

Test(crc32c, first_use_from_many_threads, .timeout = 60)
{
    enum { NTHREADS = 8 };
    pthread_t tid[NTHREADS];
    struct t_race race[NTHREADS];
    size_t len = MiB + 5;
    uint8_t *buf = malloc(len);
    uint32_t want;

    cr_assert_not_null(buf);
    t_fill(buf, len, 3);
    want = t_crc_ref(0, buf, len);  /* touches nothing of the module */
    for (int i = 0; i < NTHREADS; i++) {
        race[i].buf = buf;
        race[i].len = len;
        cr_assert_eq(pthread_create(&tid[i], NULL, t_race_main, &race[i]), 0);
    }
    for (int i = 0; i < NTHREADS; i++) {
        cr_assert_eq(pthread_join(tid[i], NULL), 0);
        cr_assert_eq(race[i].got, want, "thread %d", i);
    }
    free(buf);
}
