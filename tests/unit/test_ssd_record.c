/*
 * test_ssd_record: the on-disk record as a bucket walk and a read by offset
 * rely on it: sizes are 4 KiB multiples with the value right after the
 * header block, fields sit little-endian at the documented offsets, records
 * round-trip for short and long keys and values, every bit of the header and
 * key is protected, a value read under the wrong key or tenant or with a
 * flipped byte fails verification, zeros read as "no record", and short
 * buffers or over-limit lengths are refused before anything is trusted.
 */
#include <criterion/criterion.h>

#include "crc32c.h"
#include "kverr.h"
#include "ssd_record.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define MiB (1024u * 1024u)

static void
t_fill(uint8_t *p, size_t len, uint32_t seed)
{
    uint32_t x = seed * 2654435761u + 1;

    for (size_t i = 0; i < len; i++) {
        x ^= x << 13;
        x ^= x >> 17;
        x ^= x << 5;
        p[i] = (uint8_t)x;
    }
}

/* A record under construction: its key, value and encoded header block. */
struct t_rec {
    struct ssd_rec rec;
    uint8_t *key;
    uint8_t *value;
    uint8_t *block;
    uint64_t block_len;
};

/* t_make: a record of tenant/key_len/value_len with seeded bytes, encoded. */
static void
t_make(struct t_rec *t, uint32_t tenant, uint32_t key_len, uint64_t value_len, uint32_t seed)
{
    t->key = malloc(key_len + 1);
    t->value = malloc((size_t)value_len + 1);
    cr_assert(t->key != NULL && t->value != NULL);
    t_fill(t->key, key_len, seed);
    t_fill(t->value, (size_t)value_len, seed + 1);
    memset(&t->rec, 0, sizeof(t->rec));
    t->rec.tenant = tenant;
    t->rec.key_len = key_len;
    t->rec.value_len = value_len;
    t->rec.seq = 0x0102030405060708ull + seed;
    t->rec.key = t->key;
    t->rec.value_crc = crc32c_extend(ssd_rec_key_crc(tenant, t->key, key_len), t->value,
                                     (size_t)value_len);
    t->block_len = ssd_rec_hdr_block(key_len);
    /* Poison the buffer: encode must zero the padding itself. */
    t->block = malloc((size_t)t->block_len);
    cr_assert_not_null(t->block);
    memset(t->block, 0xa5, (size_t)t->block_len);
    cr_assert_eq(ssd_rec_encode(&t->rec, t->block), t->block_len);
}

static void
t_free(struct t_rec *t)
{
    free(t->key);
    free(t->value);
    free(t->block);
}

static uint32_t
t_get32(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static void
t_put32(uint8_t *p, uint32_t v)
{
    for (int i = 0; i < 4; i++) {
        p[i] = (uint8_t)(v >> (8 * i));
    }
}

/* t_reseal: recompute hdr_crc after a test edits the header on purpose. */
static void
t_reseal(uint8_t *block)
{
    uint32_t key_len = t_get32(block + 12);
    uint32_t crc = crc32c_extend(crc32c_extend(0, block, 36), block + 48, key_len);

    t_put32(block + 36, crc);
}

Test(ssd_record, sizes_are_aligned_and_value_follows_header)
{
    static const uint32_t klens[] = {0, 1, 16, 255, 4047, 4048, 4049, 8144, 8145, 65535};
    static const uint64_t vlens[] = {0, 1, 4095, 4096, 4097, 1ull << 20, (1ull << 32) + 1};

    cr_assert_eq(ssd_rec_hdr_block(0), 4096u);
    cr_assert_eq(ssd_rec_hdr_block(4096 - SSD_REC_HDR_SIZE), 4096u);
    cr_assert_eq(ssd_rec_hdr_block(4096 - SSD_REC_HDR_SIZE + 1), 8192u);
    cr_assert_eq(ssd_rec_value_span(0), 0u);
    cr_assert_eq(ssd_rec_value_span(1), 4096u);
    cr_assert_eq(ssd_rec_value_span(4096), 4096u);
    cr_assert_eq(ssd_rec_value_span(4097), 8192u);
    for (size_t i = 0; i < sizeof(klens) / sizeof(klens[0]); i++) {
        uint64_t hb = ssd_rec_hdr_block(klens[i]);

        cr_assert_eq(hb % SSD_REC_ALIGN, 0u, "key_len %u", klens[i]);
        cr_assert_geq(hb, SSD_REC_HDR_SIZE + (uint64_t)klens[i]);
        cr_assert_lt(hb - SSD_REC_HDR_SIZE - klens[i], SSD_REC_ALIGN, "no wasted page");
        for (size_t j = 0; j < sizeof(vlens) / sizeof(vlens[0]); j++) {
            uint64_t vs = ssd_rec_value_span(vlens[j]);

            cr_assert_eq(vs % SSD_REC_ALIGN, 0u);
            cr_assert_geq(vs, vlens[j]);
            cr_assert_lt(vs - vlens[j], SSD_REC_ALIGN);
            cr_assert_eq(ssd_rec_size(klens[i], vlens[j]), hb + vs);
        }
    }
}

Test(ssd_record, fields_are_little_endian_at_documented_offsets)
{
    struct t_rec t;
    uint8_t tenant_le[4] = {0x44, 0x33, 0x22, 0x11};
    uint32_t key_crc;

    t_make(&t, 0x11223344u, 5, 0x0a0b0cull, 1);
    cr_assert_eq(memcmp(t.block, "KVSR", 4), 0);
    cr_assert_eq(t.block[4], 1);  /* version */
    cr_assert_eq(t.block[5], 0);
    cr_assert_eq(t.block[6], 0);  /* flags */
    cr_assert_eq(t.block[7], 0);
    cr_assert_eq(memcmp(t.block + 8, tenant_le, 4), 0);
    cr_assert_eq(memcmp(t.block + 12, "\x05\x00\x00\x00", 4), 0);
    cr_assert_eq(memcmp(t.block + 16, "\x0c\x0b\x0a\x00\x00\x00\x00\x00", 8), 0);
    cr_assert_eq(t.block[24], 0x09);  /* seq 0x0102030405060709, low byte first */
    cr_assert_eq(t.block[31], 0x01);
    cr_assert_eq(t_get32(t.block + 32), t.rec.value_crc);
    cr_assert_eq(t_get32(t.block + 36),
                 crc32c_extend(crc32c_extend(0, t.block, 36), t.key, 5), "hdr_crc");
    for (int i = 40; i < 48; i++) {
        cr_assert_eq(t.block[i], 0, "reserved byte %d", i);
    }
    cr_assert_eq(memcmp(t.block + 48, t.key, 5), 0);
    for (uint64_t i = 48 + 5; i < t.block_len; i++) {
        cr_assert_eq(t.block[i], 0, "padding byte %llu", (unsigned long long)i);
    }

    /* value_crc covers tenant (LE), key, value, as one CRC-32C stream. */
    key_crc = crc32c_extend(crc32c_extend(0, tenant_le, 4), t.key, 5);
    cr_assert_eq(ssd_rec_key_crc(0x11223344u, t.key, 5), key_crc);
    t_free(&t);
}

Test(ssd_record, round_trip, .timeout = 60)
{
    static const uint32_t klens[] = {0, 1, 16, 250, 4048, 4049, 10000};
    static const uint64_t vlens[] = {0, 1, 4095, 4096, 4097, MiB + 3};
    uint32_t seed = 10;

    for (size_t i = 0; i < sizeof(klens) / sizeof(klens[0]); i++) {
        for (size_t j = 0; j < sizeof(vlens) / sizeof(vlens[0]); j++) {
            struct t_rec t;
            struct ssd_rec out;

            t_make(&t, (uint32_t)(i * 1000 + j), klens[i], vlens[j], seed++);
            cr_assert_eq(ssd_rec_decode(t.block, (size_t)t.block_len, 65536, 1ull << 30, &out),
                         0, "key_len %u value_len %llu", klens[i],
                         (unsigned long long)vlens[j]);
            cr_assert_eq(out.tenant, t.rec.tenant);
            cr_assert_eq(out.key_len, klens[i]);
            cr_assert_eq(out.value_len, vlens[j]);
            cr_assert_eq(out.seq, t.rec.seq);
            cr_assert_eq(out.value_crc, t.rec.value_crc);
            cr_assert_eq(out.key, t.block + SSD_REC_HDR_SIZE, "key points into the buffer");
            cr_assert_eq(memcmp(out.key, t.key, klens[i]), 0);
            cr_assert_eq(ssd_rec_verify_value(&out, t.value), 0);
            t_free(&t);
        }
    }
}

Test(ssd_record, every_header_and_key_bit_flip_is_detected, .timeout = 60)
{
    struct t_rec t;
    struct ssd_rec out;
    uint32_t max_key = 8192;
    size_t len = (size_t)ssd_rec_hdr_block(max_key); /* room for any key_len under the limit */
    uint8_t *buf = calloc(1, len);

    cr_assert_not_null(buf);
    t_make(&t, 7, 37, 5000, 3);
    memcpy(buf, t.block, (size_t)t.block_len);
    cr_assert_eq(ssd_rec_decode(buf, len, max_key, 1ull << 40, &out), 0);
    /* Every byte that carries meaning: the 48 header bytes and the key. (The
     * zero padding after the key is outside hdr_crc by the format.) */
    for (size_t bit = 0; bit < (SSD_REC_HDR_SIZE + 37) * 8; bit++) {
        buf[bit / 8] ^= (uint8_t)(1u << (bit % 8));
        cr_assert_eq(ssd_rec_decode(buf, len, max_key, 1ull << 40, &out), KV_CHECKSUM_MISMATCH,
                     "bit %zu of byte %zu", bit % 8, bit / 8);
        buf[bit / 8] ^= (uint8_t)(1u << (bit % 8));
    }
    cr_assert_eq(ssd_rec_decode(buf, len, max_key, 1ull << 40, &out), 0);
    free(buf);
    t_free(&t);
}

Test(ssd_record, version_flags_and_reserved_are_checked_not_only_the_crc)
{
    struct t_rec t;
    struct ssd_rec out;

    t_make(&t, 1, 10, 100, 4);
    t.block[4] = 2; /* version 2, correctly sealed */
    t_reseal(t.block);
    cr_assert_eq(ssd_rec_decode(t.block, (size_t)t.block_len, 256, MiB, &out),
                 KV_CHECKSUM_MISMATCH);
    t.block[4] = 1;
    t.block[7] = 0x80; /* an unknown flag bit */
    t_reseal(t.block);
    cr_assert_eq(ssd_rec_decode(t.block, (size_t)t.block_len, 256, MiB, &out),
                 KV_CHECKSUM_MISMATCH);
    t.block[7] = 0;
    t_reseal(t.block);
    cr_assert_eq(ssd_rec_decode(t.block, (size_t)t.block_len, 256, MiB, &out), 0);
    t.block[47] = 1; /* reserved is outside hdr_crc: it must be zero */
    cr_assert_eq(ssd_rec_decode(t.block, (size_t)t.block_len, 256, MiB, &out),
                 KV_CHECKSUM_MISMATCH);
    t_free(&t);
}

Test(ssd_record, flipped_value_byte_fails_verify)
{
    struct t_rec t;
    struct ssd_rec out;
    size_t vlen = 3 * 4096 + 17;
    size_t where[] = {0, 1, 4095, 4096, vlen / 2, vlen - 1};

    t_make(&t, 9, 20, vlen, 5);
    cr_assert_eq(ssd_rec_decode(t.block, (size_t)t.block_len, 256, MiB, &out), 0);
    cr_assert_eq(ssd_rec_verify_value(&out, t.value), 0);
    for (size_t i = 0; i < sizeof(where) / sizeof(where[0]); i++) {
        for (int b = 0; b < 8; b++) {
            t.value[where[i]] ^= (uint8_t)(1u << b);
            cr_assert_eq(ssd_rec_verify_value(&out, t.value), KV_CHECKSUM_MISMATCH,
                         "byte %zu bit %d", where[i], b);
            t.value[where[i]] ^= (uint8_t)(1u << b);
        }
    }
    cr_assert_eq(ssd_rec_verify_value(&out, t.value), 0);
    t_free(&t);
}

Test(ssd_record, value_under_another_key_or_tenant_fails_verify)
{
    struct t_rec a;
    struct t_rec b;
    struct ssd_rec ra;
    struct ssd_rec rb;
    struct ssd_rec wrong;

    /* Same value bytes under two keys of one tenant. */
    t_make(&a, 3, 16, 9000, 6);
    t_make(&b, 3, 16, 9000, 60);
    memcpy(b.value, a.value, 9000);
    b.rec.value_crc = crc32c_extend(ssd_rec_key_crc(3, b.key, 16), b.value, 9000);
    ssd_rec_encode(&b.rec, b.block);
    cr_assert_neq(a.rec.value_crc, b.rec.value_crc, "the key is part of value_crc");

    cr_assert_eq(ssd_rec_decode(a.block, (size_t)a.block_len, 256, MiB, &ra), 0);
    cr_assert_eq(ssd_rec_decode(b.block, (size_t)b.block_len, 256, MiB, &rb), 0);
    cr_assert_eq(ssd_rec_verify_value(&ra, a.value), 0);
    cr_assert_eq(ssd_rec_verify_value(&rb, b.value), 0);

    /* A's value checked against B's header (a stale index offset). */
    wrong = rb;
    wrong.value_crc = ra.value_crc;
    cr_assert_eq(ssd_rec_verify_value(&wrong, a.value), KV_CHECKSUM_MISMATCH);
    /* A's record read for the same key in another tenant. */
    wrong = ra;
    wrong.tenant = 4;
    cr_assert_eq(ssd_rec_verify_value(&wrong, a.value), KV_CHECKSUM_MISMATCH);
    t_free(&a);
    t_free(&b);
}

Test(ssd_record, zeros_are_not_found)
{
    uint8_t buf[8192];
    struct ssd_rec out;

    memset(buf, 0, sizeof(buf));
    cr_assert_eq(ssd_rec_decode(buf, sizeof(buf), 256, MiB, &out), KV_NOT_FOUND);
    cr_assert_eq(ssd_rec_decode(buf, SSD_REC_HDR_SIZE, 256, MiB, &out), KV_NOT_FOUND);
}

Test(ssd_record, garbage_without_magic_is_damage_not_the_end)
{
    uint8_t buf[4096];
    struct ssd_rec out;

    memset(buf, 0, sizeof(buf));
    buf[20] = 1;
    cr_assert_eq(ssd_rec_decode(buf, sizeof(buf), 256, MiB, &out), KV_CHECKSUM_MISMATCH);
    t_fill(buf, sizeof(buf), 8);
    cr_assert_eq(ssd_rec_decode(buf, sizeof(buf), 256, MiB, &out), KV_CHECKSUM_MISMATCH);
}

Test(ssd_record, short_buffer_is_invalid_argument)
{
    struct t_rec t;
    struct ssd_rec out;

    t_make(&t, 1, 5000, 10, 7); /* header block of 8192 bytes */
    cr_assert_eq(t.block_len, 8192u);
    cr_assert_eq(ssd_rec_decode(t.block, 0, 8192, MiB, &out), KV_INVALID_ARGUMENT);
    cr_assert_eq(ssd_rec_decode(t.block, SSD_REC_HDR_SIZE - 1, 8192, MiB, &out),
                 KV_INVALID_ARGUMENT);
    cr_assert_eq(ssd_rec_decode(t.block, SSD_REC_HDR_SIZE + 5000, 8192, MiB, &out),
                 KV_INVALID_ARGUMENT, "the key is all there but not the declared block");
    cr_assert_eq(ssd_rec_decode(t.block, 4096, 8192, MiB, &out), KV_INVALID_ARGUMENT);
    cr_assert_eq(ssd_rec_decode(t.block, 8191, 8192, MiB, &out), KV_INVALID_ARGUMENT);
    cr_assert_eq(ssd_rec_decode(t.block, 8192, 8192, MiB, &out), 0);
    t_free(&t);
}

Test(ssd_record, lengths_over_the_limits_are_rejected)
{
    struct t_rec t;
    struct ssd_rec out;

    t_make(&t, 2, 300, MiB, 9);
    cr_assert_eq(ssd_rec_decode(t.block, (size_t)t.block_len, 300, MiB, &out), 0);
    cr_assert_eq(ssd_rec_decode(t.block, (size_t)t.block_len, 299, MiB, &out),
                 KV_CHECKSUM_MISMATCH);
    cr_assert_eq(ssd_rec_decode(t.block, (size_t)t.block_len, 300, MiB - 1, &out),
                 KV_CHECKSUM_MISMATCH);
    /* A huge key_len is refused by the limit, before the buffer length is
     * compared with the block it would need. */
    t_put32(t.block + 12, 0xfffffff0u);
    cr_assert_eq(ssd_rec_decode(t.block, (size_t)t.block_len, 300, MiB, &out),
                 KV_CHECKSUM_MISMATCH);
    t_free(&t);
}
