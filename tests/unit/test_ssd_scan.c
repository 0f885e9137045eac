/*
 * test_ssd_scan: the bucket walk that rebuilds a lost index, on crafted
 * bucket files: every record of a clean file is found with its value
 * offset; a file cut inside a record keeps the records before the cut;
 * garbage or zeros after the records end the walk there; a record whose
 * value fails its CRC is skipped and the walk goes on; a damaged header
 * stops the walk (no search past it); records larger than the read buffer,
 * and headers across its edge, are verified all the same.
 */
#include <criterion/criterion.h>

#include "crc32c.h"
#include "kverr.h"
#include "ssd_record.h"
#include "ssd_scan.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define BUF (64u * 1024u)

/* Append one record of key and value_len pattern bytes; returns its value offset. */
static uint64_t
t_append(FILE *f, const char *key, uint64_t value_len, uint8_t seed)
{
    uint64_t hb = ssd_rec_hdr_block((uint32_t)strlen(key));
    uint64_t span = ssd_rec_value_span(value_len);
    uint8_t *block = calloc(1, hb);
    uint8_t *value = calloc(1, span ? span : 1);
    struct ssd_rec rec = {0};
    long at = ftell(f);

    for (uint64_t i = 0; i < value_len; i++) {
        value[i] = (uint8_t)(seed + i * 7);
    }
    rec.tenant = 3;
    rec.key_len = (uint32_t)strlen(key);
    rec.key = (const uint8_t *)key;
    rec.value_len = value_len;
    rec.seq = 1;
    rec.value_crc = crc32c_extend(ssd_rec_key_crc(3, rec.key, rec.key_len), value, value_len);
    ssd_rec_encode(&rec, block);
    cr_assert_eq(fwrite(block, 1, hb, f), hb);
    cr_assert_eq(fwrite(value, 1, span, f), span);
    free(block);
    free(value);
    return (uint64_t)at + hb;
}

struct t_seen {
    int n;
    char keys[16][32];
    uint64_t off[16];
};

static int
t_collect(void *arg, const struct ssd_rec *rec, uint64_t value_off)
{
    struct t_seen *s = arg;

    cr_assert_lt(s->n, 16);
    snprintf(s->keys[s->n], sizeof(s->keys[0]), "%.*s", (int)rec->key_len, rec->key);
    s->off[s->n] = value_off;
    s->n++;
    return 0;
}

/* t_scan: walk the file f with a BUF-byte buffer. */
static void
t_scan(FILE *f, struct t_seen *seen, struct ssd_scan_result *res)
{
    uint8_t *buf = aligned_alloc(4096, BUF);

    fflush(f);
    memset(seen, 0, sizeof(*seen));
    cr_assert_eq(ssd_scan_fd(fileno(f), buf, BUF, 65536, 1ull << 40, t_collect, seen, res), 0);
    free(buf);
}

static FILE *
t_bucket(uint64_t *offs)
{
    FILE *f = tmpfile();

    cr_assert_not_null(f);
    offs[0] = t_append(f, "a", 100, 1);
    offs[1] = t_append(f, "bb", 5000, 2);
    offs[2] = t_append(f, "ccc", 200000, 3);    /* larger than the buffer */
    offs[3] = t_append(f, "d", 0, 4);
    return f;
}

Test(ssd_scan, clean_file_every_record)
{
    uint64_t offs[4];
    FILE *f = t_bucket(offs);
    struct t_seen s;
    struct ssd_scan_result r;

    t_scan(f, &s, &r);
    cr_assert_eq(s.n, 4, "n %d why %d end %llu size %llu bad %llu", s.n, r.why,
                 (unsigned long long)r.end, (unsigned long long)r.file_size,
                 (unsigned long long)r.bad_values);
    cr_assert_str_eq(s.keys[2], "ccc");
    for (int i = 0; i < 4; i++) {
        cr_assert_eq(s.off[i], offs[i]);
    }
    cr_assert_eq(r.why, SSD_SCAN_END_CLEAN);
    cr_assert_eq(r.end, r.file_size);
    cr_assert_eq(r.records, 4);
    fclose(f);
}

Test(ssd_scan, cut_inside_a_record_keeps_those_before)
{
    uint64_t offs[4];
    FILE *f = t_bucket(offs);
    struct t_seen s;
    struct ssd_scan_result r;

    fflush(f);
    cr_assert_eq(ftruncate(fileno(f), (off_t)(offs[2] + 50000)), 0);
    t_scan(f, &s, &r);
    cr_assert_eq(s.n, 2, "n %d why %d", s.n, r.why);
    cr_assert_eq(r.why, SSD_SCAN_END_SHORT);
    cr_assert_eq(r.end, offs[2] - 4096);
    fclose(f);
}

Test(ssd_scan, garbage_or_zeros_after_the_records)
{
    uint64_t offs[4];
    FILE *f = t_bucket(offs);
    struct t_seen s;
    struct ssd_scan_result r;
    uint64_t end;
    uint8_t junk[10000];

    t_scan(f, &s, &r);
    end = r.end;
    memset(junk, 0, sizeof(junk));
    fseek(f, 0, SEEK_END);
    fwrite(junk, 1, sizeof(junk), f);
    t_scan(f, &s, &r);
    cr_assert_eq(s.n, 4);
    cr_assert_eq(r.end, end);
    cr_assert_eq(r.why, SSD_SCAN_END_CLEAN);
    for (size_t i = 0; i < sizeof(junk); i++) {
        junk[i] = (uint8_t)(i * 13 + 5);
    }
    cr_assert_eq(ftruncate(fileno(f), (off_t)end), 0);
    fseek(f, 0, SEEK_END);
    fwrite(junk, 1, sizeof(junk), f);
    t_scan(f, &s, &r);
    cr_assert_eq(s.n, 4);
    cr_assert_eq(r.end, end);
    cr_assert_eq(r.why, SSD_SCAN_END_DAMAGED);
    fclose(f);
}

Test(ssd_scan, bad_value_is_skipped_and_the_walk_goes_on)
{
    uint64_t offs[4];
    FILE *f = t_bucket(offs);
    struct t_seen s;
    struct ssd_scan_result r;

    fseek(f, (long)offs[1] + 10, SEEK_SET);
    fputc(0xEE, f);
    t_scan(f, &s, &r);
    cr_assert_eq(s.n, 3);
    cr_assert_str_eq(s.keys[1], "ccc");
    cr_assert_eq(r.bad_values, 1);
    cr_assert_eq(r.why, SSD_SCAN_END_CLEAN);
    fclose(f);
}

Test(ssd_scan, damaged_header_stops_the_walk)
{
    uint64_t offs[4];
    FILE *f = t_bucket(offs);
    struct t_seen s;
    struct ssd_scan_result r;

    fseek(f, (long)(offs[1] - 4096 + 20), SEEK_SET);     /* value_len of "bb" */
    fputc(0x7F, f);
    t_scan(f, &s, &r);
    cr_assert_eq(s.n, 1);
    cr_assert_eq(r.why, SSD_SCAN_END_DAMAGED);
    cr_assert_eq(r.end, offs[1] - 4096);
    fclose(f);
}

Test(ssd_scan, header_across_the_buffer_edge)
{
    FILE *f = tmpfile();
    struct t_seen s;
    struct ssd_scan_result r;
    char key[9000];

    memset(key, 'k', sizeof(key) - 1);
    key[sizeof(key) - 1] = '\0';
    t_append(f, "x", BUF - 4096 - 4096, 9);    /* ends 4 KiB before the buffer's end */
    t_append(f, key, 10, 8);                    /* a 12 KiB header block across it */
    t_scan(f, &s, &r);
    cr_assert_eq(s.n, 2);
    cr_assert_eq(r.why, SSD_SCAN_END_CLEAN);
    fclose(f);
}
