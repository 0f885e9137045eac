/*
 * test_ssd_summary: the bucket summary a rebuild trusts instead of reading
 * the values. A summary round-trips its entries in order with every header
 * field a rebuild needs (tenant, key, value_len, seq, value_crc, the value's
 * offset); nothing is reported unless all of it verifies: every cut short of
 * its length, every single-bit flip anywhere in it, another bucket's id, a
 * covered length past the bucket file's size, and entries that contradict
 * each other (out of order, overlapping, past covered) are refused, and
 * random bytes and mutated summaries never crash the decoder or report an
 * entry.
 */
#include <criterion/criterion.h>

#include "crc32c.h"
#include "kverr.h"
#include "ssd_record.h"
#include "ssd_summary.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define T_MAX_KEY 65536u
#define T_MAX_VALUE (1ull << 40)
#define T_BUCKET 0x1234u

/* A summary of n records with keys "key-<i>", values of varied lengths, laid end to end. */
struct t_sum {
    uint8_t buf[64 << 10];
    uint64_t len;
    uint64_t covered;
    uint64_t n;
    struct ssd_rec rec[64];
    uint64_t off[64];
    char keys[64][16];
};

static void
t_build(struct t_sum *s, uint64_t n)
{
    uint64_t at = 0;

    memset(s, 0, sizeof(*s));
    s->len = SSD_SUM_HDR_SIZE;
    s->n = n;
    for (uint64_t i = 0; i < n; i++) {
        struct ssd_rec *r = &s->rec[i];

        snprintf(s->keys[i], sizeof(s->keys[i]), "key-%03u", (unsigned)i);
        r->tenant = (uint32_t)(i % 3);
        r->key = (const uint8_t *)s->keys[i];
        r->key_len = (uint32_t)strlen(s->keys[i]);
        r->value_len = 100 + i * 5000;
        r->seq = 1000 + i;
        r->value_crc = 0xdead0000u + (uint32_t)i;
        s->off[i] = at;
        s->len += ssd_sum_entry_encode(r, at, s->buf + s->len);
        at += ssd_rec_size(r->key_len, r->value_len);
    }
    s->covered = at;
    ssd_sum_finish(s->buf, s->len, T_BUCKET, n, s->covered);
}

struct t_seen {
    uint64_t n;
    const struct t_sum *want;
    int mismatch;
};

static int
t_collect(void *arg, const struct ssd_rec *rec, uint64_t value_off)
{
    struct t_seen *c = arg;
    const struct t_sum *s = c->want;
    uint64_t i = c->n++;

    if (i >= s->n || rec->tenant != s->rec[i].tenant || rec->key_len != s->rec[i].key_len
        || memcmp(rec->key, s->rec[i].key, rec->key_len) != 0
        || rec->value_len != s->rec[i].value_len || rec->seq != s->rec[i].seq
        || rec->value_crc != s->rec[i].value_crc
        || value_off != s->off[i] + ssd_rec_hdr_block(rec->key_len)) {
        c->mismatch++;
    }
    return 0;
}

static int
t_decode(const struct t_sum *s, const uint8_t *buf, uint64_t len, uint64_t id, uint64_t size,
         struct t_seen *seen)
{
    struct ssd_sum_info info;

    memset(seen, 0, sizeof(*seen));
    seen->want = s;
    return ssd_sum_decode(buf, len, id, size, T_MAX_KEY, T_MAX_VALUE, &info, t_collect, seen);
}

Test(ssd_summary, round_trip_reports_every_entry_in_order)
{
    static struct t_sum s;
    struct ssd_sum_info info;
    struct t_seen seen;

    t_build(&s, 40);
    cr_assert_eq(t_decode(&s, s.buf, s.len, T_BUCKET, s.covered, &seen), 0);
    cr_assert_eq(seen.n, 40);
    cr_assert_eq(seen.mismatch, 0);
    cr_assert_eq(ssd_sum_decode(s.buf, s.len, T_BUCKET, s.covered + 4096, T_MAX_KEY,
                                T_MAX_VALUE, &info, NULL, NULL), 0);
    cr_assert_eq(info.count, 40);
    cr_assert_eq(info.covered, s.covered);
    cr_assert_eq(info.bucket, T_BUCKET);
}

Test(ssd_summary, header_fields_sit_little_endian_where_documented)
{
    static struct t_sum s;

    t_build(&s, 2);
    cr_assert_eq(memcmp(s.buf, "KVSH", 4), 0);
    cr_assert_eq(s.buf[4], SSD_SUM_VERSION);
    cr_assert_eq(s.buf[8], 0x34);
    cr_assert_eq(s.buf[9], 0x12);
    cr_assert_eq(s.buf[16], 2);
    cr_assert_eq(s.buf[32] | s.buf[33] << 8, (int)(s.len - SSD_SUM_HDR_SIZE));
    /* the first entry: offset 0, value_len 100, seq 1000, tenant 0, key_len 7 */
    cr_assert_eq(s.buf[SSD_SUM_HDR_SIZE + 8], 100);
    cr_assert_eq(s.buf[SSD_SUM_HDR_SIZE + 28], 7);
    cr_assert_eq(memcmp(s.buf + SSD_SUM_HDR_SIZE + SSD_SUM_ENT_FIXED, "key-000", 7), 0);
}

Test(ssd_summary, an_empty_bucket_summary_round_trips)
{
    static struct t_sum s;
    struct t_seen seen;

    t_build(&s, 0);
    cr_assert_eq(t_decode(&s, s.buf, s.len, T_BUCKET, 0, &seen), 0);
    cr_assert_eq(seen.n, 0);
}

Test(ssd_summary, every_truncation_is_refused_and_reports_nothing)
{
    static struct t_sum s;
    struct t_seen seen;

    t_build(&s, 12);
    for (uint64_t len = 0; len < s.len; len++) {
        int rc = t_decode(&s, s.buf, len, T_BUCKET, s.covered, &seen);

        cr_assert(rc == KV_INVALID_ARGUMENT || rc == KV_CHECKSUM_MISMATCH, "len %lu: %d",
                  (unsigned long)len, rc);
        cr_assert_eq(seen.n, 0, "len %lu", (unsigned long)len);
    }
    /* longer than it says (bytes appended) */
    cr_assert_eq(t_decode(&s, s.buf, s.len + 1, T_BUCKET, s.covered, &seen),
                 KV_INVALID_ARGUMENT);
    cr_assert_eq(seen.n, 0);
}

Test(ssd_summary, every_bit_flip_is_refused_and_reports_nothing)
{
    static struct t_sum s;
    struct t_seen seen;

    t_build(&s, 6);
    for (uint64_t i = 0; i < s.len; i++) {
        for (int bit = 0; bit < 8; bit++) {
            int rc;

            s.buf[i] ^= (uint8_t)(1u << bit);
            rc = t_decode(&s, s.buf, s.len, T_BUCKET, s.covered, &seen);
            s.buf[i] ^= (uint8_t)(1u << bit);
            cr_assert_neq(rc, 0, "byte %lu bit %d accepted", (unsigned long)i, bit);
            cr_assert_eq(seen.n, 0, "byte %lu bit %d: entries reported", (unsigned long)i, bit);
        }
    }
    cr_assert_eq(t_decode(&s, s.buf, s.len, T_BUCKET, s.covered, &seen), 0);
}

Test(ssd_summary, another_buckets_summary_is_refused)
{
    static struct t_sum s;
    struct ssd_sum_info info;
    struct t_seen seen;

    t_build(&s, 5);
    cr_assert_eq(t_decode(&s, s.buf, s.len, T_BUCKET + 1, s.covered, &seen),
                 KV_CHECKSUM_MISMATCH);
    cr_assert_eq(seen.n, 0);
    cr_assert_eq(ssd_sum_decode(s.buf, s.len, T_BUCKET + 1, s.covered, T_MAX_KEY, T_MAX_VALUE,
                                &info, NULL, NULL), KV_CHECKSUM_MISMATCH);
    cr_assert_not_null(strstr(info.why, "another bucket"));
}

Test(ssd_summary, a_bucket_file_shorter_than_covered_is_refused)
{
    static struct t_sum s;
    struct ssd_sum_info info;
    struct t_seen seen;

    t_build(&s, 5);
    cr_assert_eq(t_decode(&s, s.buf, s.len, T_BUCKET, s.covered - 4096, &seen),
                 KV_CHECKSUM_MISMATCH);
    cr_assert_eq(seen.n, 0);
    (void)ssd_sum_decode(s.buf, s.len, T_BUCKET, s.covered - 1, T_MAX_KEY, T_MAX_VALUE, &info,
                         NULL, NULL);
    cr_assert_not_null(strstr(info.why, "covers past the end"));
}

/* t_reseal: rewrite entries (CRC redone) so that only the structural checks can refuse. */
static void
t_reseal(struct t_sum *s, uint64_t covered)
{
    ssd_sum_finish(s->buf, s->len, T_BUCKET, s->n, covered);
}

Test(ssd_summary, entries_that_contradict_each_other_are_refused)
{
    static struct t_sum s;
    struct ssd_sum_info info;
    struct t_seen seen;
    uint64_t e1 = SSD_SUM_HDR_SIZE + ssd_sum_entry_size(7);  /* the second entry */

    /* a record past covered (covered made smaller, CRC redone) */
    t_build(&s, 4);
    t_reseal(&s, s.covered - 4096);
    cr_assert_eq(t_decode(&s, s.buf, s.len, T_BUCKET, 1ull << 40, &seen), KV_CHECKSUM_MISMATCH);
    cr_assert_eq(seen.n, 0);
    /* the second record overlapping the first */
    t_build(&s, 4);
    s.buf[e1] = 0;
    s.buf[e1 + 1] = 0;
    t_reseal(&s, s.covered);
    cr_assert_eq(t_decode(&s, s.buf, s.len, T_BUCKET, s.covered, &seen), KV_CHECKSUM_MISMATCH);
    cr_assert_eq(seen.n, 0);
    /* an offset off the 4 KiB grid */
    t_build(&s, 4);
    s.buf[e1] |= 1;
    t_reseal(&s, s.covered);
    cr_assert_eq(t_decode(&s, s.buf, s.len, T_BUCKET, s.covered, &seen), KV_CHECKSUM_MISMATCH);
    /* a key length that runs past the end, and one over the limit */
    t_build(&s, 4);
    s.buf[e1 + 28] = 0xff;
    t_reseal(&s, s.covered);
    cr_assert_eq(t_decode(&s, s.buf, s.len, T_BUCKET, s.covered, &seen), KV_CHECKSUM_MISMATCH);
    t_build(&s, 4);
    s.buf[e1 + 31] = 0x7f;
    t_reseal(&s, s.covered);
    cr_assert_eq(ssd_sum_decode(s.buf, s.len, T_BUCKET, s.covered, T_MAX_KEY, T_MAX_VALUE, &info,
                                NULL, NULL), KV_CHECKSUM_MISMATCH);
    /* a count the entries do not fill */
    t_build(&s, 4);
    ssd_sum_finish(s.buf, s.len, T_BUCKET, 5, s.covered);
    cr_assert_eq(t_decode(&s, s.buf, s.len, T_BUCKET, s.covered, &seen), KV_CHECKSUM_MISMATCH);
    cr_assert_eq(seen.n, 0);
}

Test(ssd_summary, random_and_mutated_bytes_never_report_an_entry)
{
    static struct t_sum s;
    static uint8_t junk[8192];
    struct t_seen seen;
    uint32_t x = 12345;

    t_build(&s, 8);
    for (int round = 0; round < 20000; round++) {
        uint64_t len = (uint64_t)(x % sizeof(junk));
        int rc;

        for (size_t i = 0; i < sizeof(junk); i++) {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            junk[i] = (uint8_t)x;
        }
        if (round % 2 == 0) {
            /* a valid header with the right length and CRC over junk entries */
            len = SSD_SUM_HDR_SIZE + (x % 4000);
            ssd_sum_finish(junk, len, T_BUCKET, x % 7, (x % 64) * 4096);
        } else if (round % 4 == 1) {
            memcpy(junk, s.buf, s.len);
            len = s.len;
            junk[x % len] ^= (uint8_t)(1u + x % 255);
        }
        rc = t_decode(&s, junk, len, T_BUCKET, 1ull << 30, &seen);
        if (rc != 0) {
            cr_assert_eq(seen.n, 0, "round %d: entries reported from a refused summary", round);
        }
    }
}
