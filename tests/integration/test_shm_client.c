/*
 * Integration: shared-memory buffers through libkvstash (SPEC.md,
 * "Shared-memory buffers"). Values go in with kvstash_batch_put_from and come
 * back with kvstash_batch_get_into byte-exact, through several buffers and
 * multi-piece iovs, and agree with the socket path (put / get); short reads
 * report the value's size; a bad piece fails only its key; a missing key is
 * -1; registering over TCP is refused without a word to the server; an
 * unregistered buffer id is refused per key. The raw-socket tests check the
 * daemon's side of the same contract where the library cannot reach it (an
 * id that is gone, a descriptor that is missing; an unsealed one accepted).
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include "../lib/harness.h"
#include "kvstash.h"

static struct harness h;

static void
teardown(void)
{
    harness_destroy(&h);
}

TestSuite(shm_client, .fini = teardown, .timeout = 60);

#define MIB (1024u * 1024u)
#define SENTINEL 0x5a

static struct kvstash *
unix_client(void)
{
    struct kvstash *c = NULL;
    cr_assert_eq(harness_client(h.unix_addr, 2000, &c), 0, "cannot connect to %s", h.unix_addr);
    return c;
}

static struct kvstash_buffer *
register_buffer(struct kvstash *c, size_t size)
{
    struct kvstash_buffer *b = NULL;
    int rc = kvstash_register_buffer(c, size, &b);
    cr_assert_eq(rc, 0, "register_buffer(%zu): %s (%s)", size, kvstash_strerror(rc),
                 kvstash_last_error(c));
    cr_assert_not_null(b);
    cr_assert_not_null(kvstash_buffer_ptr(b));
    cr_assert_eq(kvstash_buffer_size(b), size);
    return b;
}

/* a memfd of size bytes that allows sealing (the caller closes it) */
static int
sealable_memfd(size_t size)
{
    int fd = memfd_create("test-shm", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    cr_assert(fd >= 0, "memfd_create: %s", strerror(errno));
    cr_assert_eq(ftruncate(fd, (off_t)size), 0, "ftruncate: %s", strerror(errno));
    return fd;
}

static uint8_t *
bptr(const struct kvstash_buffer *b)
{
    return kvstash_buffer_ptr(b);
}

static void
put_plain(struct kvstash *c, const char *key, const void *val, size_t n)
{
    int rc = kvstash_put(c, key, strlen(key), val, n);
    cr_assert_eq(rc, 0, "put %s: %s", key, kvstash_strerror(rc));
}

/* the stored value of key must be exactly want[0..n) (read over the socket) */
static void
expect_stored(struct kvstash *c, const char *key, const uint8_t *want, size_t n)
{
    void *got = NULL;
    size_t glen = 0;
    int rc = kvstash_get_alloc(c, key, strlen(key), &got, &glen);
    cr_assert_eq(rc, 0, "get %s: %s", key, kvstash_strerror(rc));
    cr_assert_eq(glen, n, "get %s: %zu bytes, want %zu", key, glen, n);
    cr_assert(n == 0 || memcmp(got, want, n) == 0, "get %s: bytes differ from the pieces", key);
    free(got);
}

static void
expect_absent(struct kvstash *c, const char *key)
{
    bool exists = true;
    int rc = kvstash_is_exist(c, key, strlen(key), &exists);
    cr_assert(rc == 0 && !exists, "%s should not be stored (rc %d, exists %d)", key, rc, exists);
}

static bool
all_bytes(const uint8_t *p, size_t n, uint8_t v)
{
    for (size_t i = 0; i < n; i++) {
        if (p[i] != v) {
            return false;
        }
    }
    return true;
}

/*
 * A layout of one value over pieces: the value's bytes split into up to 3
 * pieces that alternate between two buffers, each piece at an odd offset
 * behind a gap from a per-buffer cursor.
 */
struct layout {
    struct kvstash_piece p[4];
    size_t np;
};

static void
lay_out(struct layout *l, size_t n, struct kvstash_buffer *const bufs[2], uint64_t cur[2],
        int first)
{
    size_t parts = n == 0 ? 0 : n < 3 ? 1 : 3;
    size_t done = 0;

    l->np = 0;
    for (size_t j = 0; j < parts; j++) {
        size_t len = j + 1 == parts ? n - done : n / 3;
        int w = (first + (int)j) % 2;
        cur[w] += 7; /* a gap, and odd alignment */
        l->p[l->np++] = (struct kvstash_piece){.buf = bufs[w], .offset = cur[w], .length = len};
        cur[w] += len;
        cr_assert_leq(cur[w], kvstash_buffer_size(bufs[w]), "test layout overflows a buffer");
        done += len;
        if (j == 0 && parts == 3) {
            /* an empty piece in the middle is legal and moves nothing */
            l->p[l->np++] = (struct kvstash_piece){.buf = bufs[w], .offset = cur[w], .length = 0};
        }
    }
}

/* scatter val into the pieces of l */
static void
scatter(const struct layout *l, const uint8_t *val)
{
    size_t at = 0;
    for (size_t j = 0; j < l->np; j++) {
        memcpy(bptr(l->p[j].buf) + l->p[j].offset, val + at, l->p[j].length);
        at += l->p[j].length;
    }
}

/* the pieces of l hold exactly val */
static bool
gathered_equals(const struct layout *l, const uint8_t *val)
{
    size_t at = 0;
    for (size_t j = 0; j < l->np; j++) {
        if (memcmp(bptr(l->p[j].buf) + l->p[j].offset, val + at, l->p[j].length) != 0) {
            return false;
        }
        at += l->p[j].length;
    }
    return true;
}

Test(shm_client, put_from_get_into_round_trip_byte_exact)
{
    cr_assert_eq(harness_start(&h, NULL, NULL), 0);
    struct kvstash *c = unix_client();

    /* one buffer made by the library, one from the caller's own memfd */
    struct kvstash_buffer *bufs[2];
    bufs[0] = register_buffer(c, 16 * MIB);
    int fd = sealable_memfd(16 * MIB);
    bufs[1] = NULL;
    int rc = kvstash_register_fd(c, fd, 16 * MIB, &bufs[1]);
    cr_assert_eq(rc, 0, "register_fd: %s (%s)", kvstash_strerror(rc), kvstash_last_error(c));
    close(fd); /* the caller may close its descriptor at once */

    enum { N = 7 };
    const size_t lens[N] = {0, 1, 2, 4099, 65537, MIB + 3, 3 * MIB + 1};
    char keyb[N][32];
    const void *keys[N];
    size_t klens[N];
    uint8_t *vals[N];
    struct layout src[N], dst[N];
    const struct kvstash_piece *pieces[N];
    size_t npieces[N];
    int codes[N];
    int64_t results[N];
    uint64_t cur[2] = {0, 0};

    for (int i = 0; i < N; i++) {
        snprintf(keyb[i], sizeof(keyb[i]), "shm-rt-%d", i);
        keys[i] = keyb[i];
        klens[i] = strlen(keyb[i]);
        vals[i] = malloc(lens[i] + 1);
        cr_assert_not_null(vals[i]);
        harness_fill(vals[i], lens[i], harness_seed(keyb[i], klens[i]));
        lay_out(&src[i], lens[i], bufs, cur, i);
        scatter(&src[i], vals[i]);
        pieces[i] = src[i].np ? src[i].p : NULL;
        npieces[i] = src[i].np;
        codes[i] = -100;
    }
    rc = kvstash_batch_put_from(c, N, keys, klens, pieces, npieces, codes);
    cr_assert_eq(rc, 0, "batch_put_from: %s (%s)", kvstash_strerror(rc), kvstash_last_error(c));
    for (int i = 0; i < N; i++) {
        cr_assert_eq(codes[i], 0, "put_from %s (%zu bytes in %zu pieces): code %d", keyb[i],
                     lens[i], npieces[i], codes[i]);
    }
    /* what went in through shared memory reads back over the socket, byte for byte */
    for (int i = 0; i < N; i++) {
        expect_stored(c, keyb[i], vals[i], lens[i]);
    }

    /* back out through other pieces (the other buffer first, further on), prefilled */
    for (int b = 0; b < 2; b++) {
        memset(bptr(bufs[b]) + 8 * MIB, SENTINEL, 8 * MIB);
    }
    cur[0] = cur[1] = 8 * MIB;
    for (int i = 0; i < N; i++) {
        lay_out(&dst[i], lens[i], bufs, cur, i + 1);
        pieces[i] = dst[i].np ? dst[i].p : NULL;
        npieces[i] = dst[i].np;
        results[i] = -100;
    }
    rc = kvstash_batch_get_into(c, N, keys, klens, pieces, npieces, results);
    cr_assert_eq(rc, 0, "batch_get_into: %s (%s)", kvstash_strerror(rc), kvstash_last_error(c));
    for (int i = 0; i < N; i++) {
        cr_assert_eq(results[i], (int64_t)lens[i], "get_into %s: result %lld, want %zu",
                     keyb[i], (long long)results[i], lens[i]);
        cr_assert(gathered_equals(&dst[i], vals[i]), "get_into %s: bytes differ", keyb[i]);
    }
    /* the gaps in front of every piece were not written */
    for (int i = 0; i < N; i++) {
        for (size_t j = 0; j < dst[i].np; j++) {
            const struct kvstash_piece *p = &dst[i].p[j];
            cr_assert(p->length == 0 || all_bytes(bptr(p->buf) + p->offset - 7, 7, SENTINEL),
                      "get_into %s wrote in front of its piece %zu", keyb[i], j);
        }
    }

    /* a value stored over the socket reads into shared memory too */
    const char *plain = "shm-rt-plain";
    put_plain(c, plain, vals[5], lens[5]);
    struct kvstash_piece one = {.buf = bufs[0], .offset = 0, .length = lens[5]};
    const struct kvstash_piece *pp = &one;
    size_t np1 = 1, kl = strlen(plain);
    const void *kp = plain;
    int64_t res1 = 0;
    rc = kvstash_batch_get_into(c, 1, &kp, &kl, &pp, &np1, &res1);
    cr_assert(rc == 0 && res1 == (int64_t)lens[5], "get_into %s: rc %d result %lld", plain, rc,
              (long long)res1);
    cr_assert(memcmp(bptr(bufs[0]), vals[5], lens[5]) == 0, "get_into %s: bytes differ", plain);

    /* write-once holds for put_from as for put */
    rc = kvstash_batch_put_from(c, 1, &kp, &kl, &pp, &np1, codes);
    cr_assert(rc == 0 && codes[0] == KVSTASH_EEXISTS, "put_from of a stored key: rc %d code %d",
              rc, codes[0]);

    for (int i = 0; i < N; i++) {
        free(vals[i]);
    }
    cr_assert_eq(kvstash_unregister_buffer(c, bufs[0]), 0);
    /* bufs[1] stays registered: kvstash_close releases it */
    kvstash_close(c);
    cr_assert_eq(harness_stop_clean(&h), 0, "kvstashd did not shut down cleanly");
}

Test(shm_client, split_over_max_batch_and_pipelined)
{
    cr_assert_eq(harness_start(&h, NULL, HARNESS_ARGS("--max_batch=4")), 0);
    struct kvstash *c = unix_client();
    struct kvstash_buffer *b = register_buffer(c, 4 * MIB);

    /* 37 keys of 2 pieces each over requests of at most 4 keys, one bad key among them */
    enum { N = 37, BAD = 17, VLEN = 3001 };
    char keyb[N][24];
    const void *keys[N];
    size_t klens[N], npieces[N];
    struct kvstash_piece pc[N][2];
    const struct kvstash_piece *pieces[N];
    int codes[N];
    int64_t results[N];
    uint8_t *val = malloc(VLEN);
    cr_assert_not_null(val);

    for (int i = 0; i < N; i++) {
        snprintf(keyb[i], sizeof(keyb[i]), "shm-split-%02d", i);
        keys[i] = keyb[i];
        klens[i] = strlen(keyb[i]);
        uint64_t at = (uint64_t)i * 2 * VLEN;
        pc[i][0] = (struct kvstash_piece){.buf = b, .offset = at + VLEN, .length = 1000};
        pc[i][1] = (struct kvstash_piece){.buf = b, .offset = at, .length = VLEN - 1000};
        harness_fill(val, VLEN, harness_seed(keyb[i], klens[i]));
        memcpy(bptr(b) + at + VLEN, val, 1000);
        memcpy(bptr(b) + at, val + 1000, VLEN - 1000);
        pieces[i] = pc[i];
        npieces[i] = 2;
    }
    pc[BAD][1].offset = 4 * MIB - 10; /* runs past the end */
    int rc = kvstash_batch_put_from(c, N, keys, klens, pieces, npieces, codes);
    cr_assert_eq(rc, 0, "batch_put_from of %d keys with max_batch 4: %s", N,
                 kvstash_strerror(rc));
    for (int i = 0; i < N; i++) {
        int want = i == BAD ? KVSTASH_EINVAL : 0;
        cr_assert_eq(codes[i], want, "put_from key %d: code %d, want %d", i, codes[i], want);
    }
    for (int i = 0; i < N; i++) {
        if (i == BAD) {
            expect_absent(c, keyb[i]);
            continue;
        }
        harness_fill(val, VLEN, harness_seed(keyb[i], klens[i]));
        expect_stored(c, keyb[i], val, VLEN);
    }

    /* back into the other half of the buffer, one piece each */
    memset(bptr(b) + 2 * MIB, SENTINEL, 2 * MIB);
    for (int i = 0; i < N; i++) {
        pc[i][0] = (struct kvstash_piece){
            .buf = b, .offset = 2 * MIB + (uint64_t)i * VLEN, .length = VLEN};
        npieces[i] = 1;
    }
    pc[BAD][0].offset = 5 * MIB; /* beyond the buffer */
    rc = kvstash_batch_get_into(c, N, keys, klens, pieces, npieces, results);
    cr_assert_eq(rc, 0, "batch_get_into: %s", kvstash_strerror(rc));
    for (int i = 0; i < N; i++) {
        if (i == BAD) {
            cr_assert_eq(results[i], -KVSTASH_EINVAL, "get_into of a bad piece: %lld",
                         (long long)results[i]);
            continue;
        }
        cr_assert_eq(results[i], VLEN, "get_into key %d: %lld", i, (long long)results[i]);
        harness_fill(val, VLEN, harness_seed(keyb[i], klens[i]));
        cr_assert(memcmp(bptr(b) + pc[i][0].offset, val, VLEN) == 0,
                  "get_into key %d: bytes differ", i);
    }
    free(val);
    kvstash_close(c);
    cr_assert_eq(harness_stop_clean(&h), 0, "kvstashd did not shut down cleanly");
}

Test(shm_client, get_into_short_read_reports_value_size)
{
    cr_assert_eq(harness_start(&h, NULL, NULL), 0);
    struct kvstash *c = unix_client();
    struct kvstash_buffer *b = register_buffer(c, MIB);
    uint8_t *v1 = malloc(1000), *v2 = malloc(2500);
    cr_assert(v1 != NULL && v2 != NULL);
    harness_fill(v1, 1000, 1);
    harness_fill(v2, 2500, 2);
    put_plain(c, "shm-short-1000", v1, 1000);
    put_plain(c, "shm-short-2500", v2, 2500);

    /* each key gets two pieces of 1500 bytes; pieces start at 0/4096 and 8192/12288 */
    memset(bptr(b), SENTINEL, 16384);
    const void *keys[2] = {"shm-short-1000", "shm-short-2500"};
    size_t klens[2] = {strlen(keys[0]), strlen(keys[1])};
    struct kvstash_piece pc[2][2] = {
        {{b, 0, 1500}, {b, 4096, 1500}},
        {{b, 8192, 1500}, {b, 12288, 1500}},
    };
    const struct kvstash_piece *pieces[2] = {pc[0], pc[1]};
    size_t npieces[2] = {2, 2};
    int64_t results[2] = {-100, -100};
    int rc = kvstash_batch_get_into(c, 2, keys, klens, pieces, npieces, results);
    cr_assert_eq(rc, 0, "batch_get_into: %s", kvstash_strerror(rc));

    cr_assert_eq(results[0], 1000, "value of 1000 bytes into 3000: result %lld",
                 (long long)results[0]);
    cr_assert(memcmp(bptr(b), v1, 1000) == 0, "1000-byte value: bytes differ");
    cr_assert(all_bytes(bptr(b) + 1000, 500, SENTINEL) &&
                  all_bytes(bptr(b) + 4096, 1500, SENTINEL),
              "short read wrote past the value's 1000 bytes");

    cr_assert_eq(results[1], 2500, "value of 2500 bytes into 3000: result %lld",
                 (long long)results[1]);
    cr_assert(memcmp(bptr(b) + 8192, v2, 1500) == 0 &&
                  memcmp(bptr(b) + 12288, v2 + 1500, 1000) == 0,
              "2500-byte value: bytes differ (pieces must be filled in order)");
    cr_assert(all_bytes(bptr(b) + 12288 + 1000, 500, SENTINEL),
              "short read wrote past the value's 2500 bytes");

    /* pieces smaller than the value: they are filled and say how much they took */
    memset(bptr(b), SENTINEL, 16384);
    pc[0][0].length = 400;
    pc[0][1].length = 200;
    rc = kvstash_batch_get_into(c, 1, keys, klens, pieces, npieces, results);
    cr_assert(rc == 0 && results[0] == 600,
              "value of 1000 bytes into 600: rc %d result %lld", rc, (long long)results[0]);
    cr_assert(memcmp(bptr(b), v1, 400) == 0 && memcmp(bptr(b) + 4096, v1 + 400, 200) == 0,
              "value of 1000 bytes into 600: bytes differ");
    cr_assert(all_bytes(bptr(b) + 400, 100, SENTINEL) &&
                  all_bytes(bptr(b) + 4096 + 200, 100, SENTINEL),
              "a read into small pieces wrote past them");
    free(v1);
    free(v2);
    kvstash_close(c);
    cr_assert_eq(harness_stop_clean(&h), 0, "kvstashd did not shut down cleanly");
}

Test(shm_client, bad_piece_fails_only_its_key)
{
    cr_assert_eq(harness_start(&h, NULL, NULL), 0);
    struct kvstash *c = unix_client();
    struct kvstash *other = unix_client();
    struct kvstash_buffer *b = register_buffer(c, 64 * 1024);
    /* a buffer of another connection: its id may well equal one of c's */
    struct kvstash_buffer *foreign = register_buffer(other, 64 * 1024);

    enum { N = 6 };
    const void *keys[N] = {"bp-ok-0", "bp-past-end", "bp-ok-2", "bp-wrap", "bp-foreign",
                           "bp-null"};
    size_t klens[N];
    struct kvstash_piece pc[N][2];
    const struct kvstash_piece *pieces[N];
    size_t npieces[N];
    int codes[N];
    int64_t results[N];
    harness_fill(bptr(b), 64 * 1024, 3);
    for (int i = 0; i < N; i++) {
        klens[i] = strlen(keys[i]);
        pc[i][0] = (struct kvstash_piece){.buf = b, .offset = (uint64_t)i * 1024, .length = 100};
        pc[i][1] = (struct kvstash_piece){.buf = b, .offset = 32768, .length = 50};
        pieces[i] = pc[i];
        npieces[i] = 2;
    }
    pc[1][1] = (struct kvstash_piece){.buf = b, .offset = 64 * 1024 - 10, .length = 20};
    pc[3][1] = (struct kvstash_piece){.buf = b, .offset = 8, .length = UINT64_MAX};
    pc[4][1].buf = foreign;
    pc[5][0].buf = NULL;
    const int want[N] = {0, KVSTASH_EINVAL, 0, KVSTASH_EINVAL, KVSTASH_EINVAL, KVSTASH_EINVAL};

    int rc = kvstash_batch_put_from(c, N, keys, klens, pieces, npieces, codes);
    cr_assert_eq(rc, 0, "batch_put_from: %s", kvstash_strerror(rc));
    for (int i = 0; i < N; i++) {
        cr_assert_eq(codes[i], want[i], "put_from %s: code %d, want %d", (const char *)keys[i],
                     codes[i], want[i]);
    }
    for (int i = 0; i < N; i++) {
        if (want[i] != 0) {
            expect_absent(c, keys[i]);
        } else {
            uint8_t exp[150];
            memcpy(exp, bptr(b) + i * 1024, 100);
            memcpy(exp + 100, bptr(b) + 32768, 50);
            expect_stored(c, keys[i], exp, 150);
        }
    }

    /* get_into: the good keys are read, each bad one is -6 and its pieces untouched */
    const void *gkeys[N] = {"bp-ok-0", "bp-ok-2", "bp-ok-0", "bp-ok-2", "bp-ok-0", "bp-ok-2"};
    size_t gklens[N];
    memset(bptr(b), SENTINEL, 64 * 1024);
    for (int i = 0; i < N; i++) {
        gklens[i] = strlen(gkeys[i]);
        pc[i][0].offset = (uint64_t)i * 1024;
        pc[i][0].length = 100;
        pc[i][1] = (struct kvstash_piece){.buf = b, .offset = (uint64_t)i * 1024 + 512,
                                          .length = 50};
    }
    pc[1][1] = (struct kvstash_piece){.buf = b, .offset = 64 * 1024, .length = 1};
    pc[3][1] = (struct kvstash_piece){.buf = b, .offset = UINT64_MAX, .length = 1};
    pc[4][1].buf = foreign;
    pc[5][0].buf = NULL;
    rc = kvstash_batch_get_into(c, N, gkeys, gklens, pieces, npieces, results);
    cr_assert_eq(rc, 0, "batch_get_into: %s", kvstash_strerror(rc));
    for (int i = 0; i < N; i++) {
        int64_t w = want[i] != 0 ? -want[i] : 150;
        cr_assert_eq(results[i], w, "get_into %d (%s): result %lld, want %lld", i,
                     (const char *)gkeys[i], (long long)results[i], (long long)w);
        if (want[i] != 0) {
            cr_assert(all_bytes(bptr(b) + i * 1024, 100, SENTINEL),
                      "get_into %d: a key with a bad piece wrote memory", i);
        }
    }
    cr_assert(all_bytes(bptr(foreign), 64 * 1024, 0),
              "a transfer on one connection wrote into another connection's buffer");
    /* both connections are still fine */
    cr_assert_eq(kvstash_ping(c), 0);
    cr_assert_eq(kvstash_ping(other), 0);
    kvstash_close(other);
    kvstash_close(c);
    cr_assert_eq(harness_stop_clean(&h), 0, "kvstashd did not shut down cleanly");
}

Test(shm_client, get_into_missing_key_is_minus_one)
{
    cr_assert_eq(harness_start(&h, NULL, NULL), 0);
    struct kvstash *c = unix_client();
    struct kvstash_buffer *b = register_buffer(c, 64 * 1024);
    put_plain(c, "mk-a", "alpha", 5);
    put_plain(c, "mk-c", "gamma!", 6);

    memset(bptr(b), SENTINEL, 64 * 1024);
    const void *keys[3] = {"mk-a", "mk-missing", "mk-c"};
    size_t klens[3] = {4, 10, 4};
    struct kvstash_piece pc[3] = {{b, 0, 100}, {b, 1024, 100}, {b, 2048, 100}};
    const struct kvstash_piece *pieces[3] = {&pc[0], &pc[1], &pc[2]};
    size_t npieces[3] = {1, 1, 1};
    int64_t results[3] = {-100, -100, -100};
    int rc = kvstash_batch_get_into(c, 3, keys, klens, pieces, npieces, results);
    cr_assert_eq(rc, 0, "batch_get_into: %s", kvstash_strerror(rc));
    cr_assert_eq(results[0], 5, "mk-a: %lld", (long long)results[0]);
    cr_assert_eq(results[1], -KVSTASH_ENOTFOUND, "missing key: %lld, want -1",
                 (long long)results[1]);
    cr_assert_eq(results[2], 6, "mk-c: %lld", (long long)results[2]);
    cr_assert(memcmp(bptr(b), "alpha", 5) == 0 && memcmp(bptr(b) + 2048, "gamma!", 6) == 0,
              "values read around a missing key differ");
    cr_assert(all_bytes(bptr(b) + 1024, 100, SENTINEL), "a missing key wrote its piece");

    /* a key over max_key_size cannot exist: it reads as missing too */
    char big[2048];
    memset(big, 'k', sizeof(big));
    const void *bk = big;
    size_t bkl = sizeof(big), one = 1;
    rc = kvstash_batch_get_into(c, 1, &bk, &bkl, pieces, &one, results);
    cr_assert(rc == 0 && results[0] == -KVSTASH_ENOTFOUND,
              "get_into of a key over max_key_size: rc %d result %lld", rc,
              (long long)results[0]);
    kvstash_close(c);
    cr_assert_eq(harness_stop_clean(&h), 0, "kvstashd did not shut down cleanly");
}

Test(shm_client, register_over_tcp_is_unsupported)
{
    cr_assert_eq(harness_start(&h, NULL, NULL), 0);
    struct kvstash *t = NULL;
    cr_assert_eq(harness_client(h.addr, 2000, &t), 0);
    uint64_t before = 0, after = 0;
    cr_assert_eq(harness_stat(t, "request_errors", &before), 0);

    struct kvstash_buffer *b = (struct kvstash_buffer *)&before; /* must be overwritten */
    int rc = kvstash_register_buffer(t, MIB, &b);
    cr_assert_eq(rc, KVSTASH_EUNSUPPORTED, "register_buffer over TCP: %d (%s)", rc,
                 kvstash_strerror(rc));
    cr_assert_null(b, "a failed register_buffer must leave *out NULL");
    cr_assert_neq(kvstash_last_error(t)[0], '\0', "no reason given");

    int fd = sealable_memfd(MIB);
    b = (struct kvstash_buffer *)&before;
    rc = kvstash_register_fd(t, fd, MIB, &b);
    cr_assert_eq(rc, KVSTASH_EUNSUPPORTED, "register_fd over TCP: %d", rc);
    cr_assert_null(b);
    cr_assert_eq(fcntl(fd, F_GET_SEALS) & F_SEAL_SHRINK, 0,
                 "register_fd over TCP sealed the caller's memfd anyway");
    close(fd);

    /* refused locally: nothing reached the server, and the connection is fine */
    cr_assert_eq(kvstash_ping(t), 0);
    cr_assert_eq(harness_stat(t, "request_errors", &after), 0);
    cr_assert_eq(after, before, "register over TCP was sent to the server");
    uint64_t ops = 0;
    rc = harness_stat(t, "ops.register_buffer", &ops);
    cr_assert(rc == KVSTASH_ENOTFOUND || (rc == 0 && ops == 0),
              "ops.register_buffer %llu after a local refusal", (unsigned long long)ops);

    /* the server says the same to a raw TCP client that asks anyway */
    struct harness_conn rc_tcp;
    cr_assert_eq(harness_conn_tcp(&rc_tcp, h.port, 2000), 0);
    struct harness_req r;
    harness_req_init(&r);
    harness_req_begin(&r, 1, "register_buffer", 1);
    msgpack_pack_map(&r.pk, 1);
    harness_pack_str(&r.pk, "size");
    msgpack_pack_uint64(&r.pk, MIB);
    const msgpack_object *err, *res;
    cr_assert_eq(harness_call(&rc_tcp, &r, 1, HARNESS_IO_TIMEOUT_MS, &err, &res), 0);
    cr_assert_eq(harness_err_code(err), KVSTASH_EUNSUPPORTED, "server answer over TCP");
    harness_req_destroy(&r);
    harness_conn_close(&rc_tcp);

    kvstash_close(t);
    cr_assert_eq(harness_stop_clean(&h), 0, "kvstashd did not shut down cleanly");
}

Test(shm_client, register_fd_checks_and_shares_the_callers_memfd)
{
    cr_assert_eq(harness_start(&h, NULL, NULL), 0);
    struct kvstash *c = unix_client();
    struct kvstash_buffer *b = NULL;

    /* a memfd that cannot be sealed: registered as it is, the daemon guards it */
    int nos = memfd_create("test-noseal", MFD_CLOEXEC);
    cr_assert(nos >= 0 && ftruncate(nos, 65536) == 0);
    int rc = kvstash_register_fd(c, nos, 65536, &b);
    cr_assert_eq(rc, 0, "memfd without MFD_ALLOW_SEALING: %d (%s)", rc, kvstash_last_error(c));
    cr_assert_not_null(b);
    {
        const void *k = "noseal";
        size_t kl = 6;
        size_t one = 1;
        struct kvstash_piece pin = {.buf = b, .offset = 0, .length = 5};
        const struct kvstash_piece *pp = &pin;
        int code = -1;

        memcpy(kvstash_buffer_ptr(b), "guard", 5);
        cr_assert_eq(kvstash_batch_put_from(c, 1, &k, &kl, &pp, &one, &code), 0);
        cr_assert_eq(code, 0, "put_from an unsealed memfd: %d", code);
    }
    cr_assert_eq(kvstash_unregister_buffer(c, b), 0);
    b = NULL;
    close(nos);

    /* not a memfd at all */
    int pfd[2];
    cr_assert_eq(pipe(pfd), 0);
    rc = kvstash_register_fd(c, pfd[0], 65536, &b);
    cr_assert_eq(rc, KVSTASH_EINVAL, "a pipe: %d", rc);
    close(pfd[0]);
    close(pfd[1]);
    cr_assert_eq(kvstash_register_fd(c, -1, 65536, &b), KVSTASH_EINVAL);

    /* shorter than the size asked */
    int fd = sealable_memfd(65536);
    rc = kvstash_register_fd(c, fd, 65537, &b);
    cr_assert_eq(rc, KVSTASH_EINVAL, "memfd shorter than size: %d", rc);
    cr_assert_eq(kvstash_register_buffer(c, 0, &b), KVSTASH_EINVAL, "size 0");

    /* a good one: sealed against shrinking, shared with the caller's own view of it */
    const char hello[] = "written before registration";
    cr_assert_eq(pwrite(fd, hello, sizeof(hello), 100), (ssize_t)sizeof(hello));
    rc = kvstash_register_fd(c, fd, 65536, &b);
    cr_assert_eq(rc, 0, "register_fd: %s (%s)", kvstash_strerror(rc), kvstash_last_error(c));
    cr_assert(fcntl(fd, F_GET_SEALS) & F_SEAL_SHRINK, "the memfd was not sealed F_SEAL_SHRINK");
    cr_assert_neq(ftruncate(fd, 4096), 0, "the memfd can still shrink");
    cr_assert(memcmp(bptr(b) + 100, hello, sizeof(hello)) == 0,
              "the buffer does not show the memfd's bytes");
    memcpy(bptr(b) + 1000, "via-ptr", 7);
    char back[7];
    cr_assert_eq(pread(fd, back, 7, 1000), 7);
    cr_assert(memcmp(back, "via-ptr", 7) == 0, "the buffer is not the memfd's memory");

    /* the daemon reads what the caller wrote through its own descriptor */
    const void *key = "rfd-k";
    size_t klen = 5, np = 1;
    struct kvstash_piece pc = {b, 100, sizeof(hello)};
    const struct kvstash_piece *pp = &pc;
    int code = -100;
    rc = kvstash_batch_put_from(c, 1, &key, &klen, &pp, &np, &code);
    cr_assert(rc == 0 && code == 0, "put_from via a caller's memfd: rc %d code %d", rc, code);
    expect_stored(c, "rfd-k", (const uint8_t *)hello, sizeof(hello));

    cr_assert_eq(kvstash_unregister_buffer(c, b), 0);
    /* unregistering leaves the caller's descriptor open */
    cr_assert(fcntl(fd, F_GETFD) >= 0, "unregister closed the caller's memfd");
    close(fd);
    kvstash_close(c);
    cr_assert_eq(harness_stop_clean(&h), 0, "kvstashd did not shut down cleanly");
}

/* ---- the daemon's side, over a raw Unix socket ---- */

/* send r with fd attached to its first bytes (fd < 0: none), then read the reply */
static int
raw_call_fd(struct harness_conn *c, const struct harness_req *r, uint32_t msgid, int fd,
            const msgpack_object **err, const msgpack_object **res)
{
    struct iovec iov = {.iov_base = r->sb.data, .iov_len = r->sb.size};
    union {
        struct cmsghdr align;
        char buf[CMSG_SPACE(sizeof(int))];
    } ctl;
    struct msghdr mh = {.msg_iov = &iov, .msg_iovlen = 1};
    if (fd >= 0) {
        memset(&ctl, 0, sizeof(ctl));
        mh.msg_control = ctl.buf;
        mh.msg_controllen = sizeof(ctl.buf);
        struct cmsghdr *cm = CMSG_FIRSTHDR(&mh);
        cm->cmsg_level = SOL_SOCKET;
        cm->cmsg_type = SCM_RIGHTS;
        cm->cmsg_len = CMSG_LEN(sizeof(int));
        memcpy(CMSG_DATA(cm), &fd, sizeof(int));
    }
    ssize_t w = sendmsg(c->fd, &mh, MSG_NOSIGNAL);
    cr_assert_eq(w, (ssize_t)r->sb.size, "sendmsg of a small request: %zd (%s)", w,
                 strerror(errno));
    const msgpack_object *m;
    int rc = harness_conn_read(c, HARNESS_IO_TIMEOUT_MS, &m);
    if (rc <= 0) {
        return rc == 0 ? -ECONNRESET : rc;
    }
    cr_assert(m->type == MSGPACK_OBJECT_ARRAY && m->via.array.size == 4 &&
                  m->via.array.ptr[1].via.u64 == msgid,
              "not the response to %u", (unsigned)msgid);
    *err = &m->via.array.ptr[2];
    *res = &m->via.array.ptr[3];
    return 0;
}

static void
raw_register(struct harness_req *r, uint32_t msgid, uint64_t size)
{
    harness_req_begin(r, msgid, "register_buffer", 1);
    msgpack_pack_map(&r->pk, 1);
    harness_pack_str(&r->pk, "size");
    msgpack_pack_uint64(&r->pk, size);
}

/* [ks], [[[id, off, len]]] for one key and one piece */
static void
raw_transfer(struct harness_req *r, uint32_t msgid, const char *method, const char *key,
             uint64_t id, uint64_t off, uint64_t len)
{
    harness_req_begin(r, msgid, method, 2);
    msgpack_pack_array(&r->pk, 1);
    harness_pack_bin(&r->pk, key, strlen(key));
    msgpack_pack_array(&r->pk, 1);
    msgpack_pack_array(&r->pk, 1);
    msgpack_pack_array(&r->pk, 3);
    msgpack_pack_uint64(&r->pk, id);
    msgpack_pack_uint64(&r->pk, off);
    msgpack_pack_uint64(&r->pk, len);
}

/* the single result of a one-key transfer, as an integer */
static int64_t
one_result(const msgpack_object *err, const msgpack_object *res, const char *what)
{
    if (harness_err_code(err) != -1) {
        harness_print_obj(what, err);
    }
    cr_assert_eq(harness_err_code(err), -1, "%s: request-level error", what);
    cr_assert(res->type == MSGPACK_OBJECT_ARRAY && res->via.array.size == 1,
              "%s: result is not a 1-element array", what);
    const msgpack_object *o = &res->via.array.ptr[0];
    if (o->type == MSGPACK_OBJECT_POSITIVE_INTEGER) {
        return (int64_t)o->via.u64;
    }
    cr_assert_eq(o->type, MSGPACK_OBJECT_NEGATIVE_INTEGER, "%s: result is not an integer", what);
    return o->via.i64;
}

Test(shm_client, unregister_then_old_id_is_invalid_per_key)
{
    cr_assert_eq(harness_start(&h, NULL, NULL), 0);

    /* through the library: unregister answers 0, accepts NULL, and a new buffer works */
    struct kvstash *c = unix_client();
    struct kvstash_buffer *b = register_buffer(c, 4096);
    cr_assert_eq(kvstash_unregister_buffer(c, b), 0, "unregister: %s", kvstash_last_error(c));
    cr_assert_eq(kvstash_unregister_buffer(c, NULL), 0);
    b = register_buffer(c, 4096);
    memcpy(bptr(b), "after", 5);
    const void *key = "ur-lib";
    size_t klen = 6, np = 1;
    struct kvstash_piece pc = {b, 0, 5};
    const struct kvstash_piece *pp = &pc;
    int code = -100;
    int rc = kvstash_batch_put_from(c, 1, &key, &klen, &pp, &np, &code);
    cr_assert(rc == 0 && code == 0, "put_from after an unregister: rc %d code %d", rc, code);
    kvstash_close(c);

    /* raw: the old id is refused per key, the request itself is fine */
    struct harness_conn u;
    cr_assert_eq(harness_conn_unix(&u, h.unix_path, 2000), 0);
    struct harness_req r;
    harness_req_init(&r);
    const msgpack_object *err, *res;
    int fd = sealable_memfd(4096);
    cr_assert_eq(fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK), 0);
    cr_assert_eq(pwrite(fd, "0123456789abcdef", 16, 0), 16);

    raw_register(&r, 1, 4096);
    cr_assert_eq(raw_call_fd(&u, &r, 1, fd, &err, &res), 0);
    cr_assert_eq(harness_err_code(err), -1, "register_buffer with a sealed memfd refused");
    cr_assert_eq(res->type, MSGPACK_OBJECT_POSITIVE_INTEGER, "buffer id is not a uint");
    uint64_t id = res->via.u64;
    close(fd);

    raw_transfer(&r, 2, "batch_put_from", "ur-0", id, 0, 16);
    cr_assert_eq(raw_call_fd(&u, &r, 2, -1, &err, &res), 0);
    cr_assert_eq(one_result(err, res, "put_from before unregister"), 0);
    raw_transfer(&r, 3, "batch_put_from", "ur-range", id, 4090, 7);
    cr_assert_eq(raw_call_fd(&u, &r, 3, -1, &err, &res), 0);
    cr_assert_eq(one_result(err, res, "put_from of a piece past the end"), KVSTASH_EINVAL);
    raw_transfer(&r, 4, "batch_get_into", "ur-0", id, 4095, 2);
    cr_assert_eq(raw_call_fd(&u, &r, 4, -1, &err, &res), 0);
    cr_assert_eq(one_result(err, res, "get_into of a piece past the end"), -KVSTASH_EINVAL);

    harness_req_begin(&r, 5, "unregister_buffer", 1);
    msgpack_pack_uint64(&r.pk, id);
    cr_assert_eq(raw_call_fd(&u, &r, 5, -1, &err, &res), 0);
    cr_assert(harness_err_code(err) == -1 && res->type == MSGPACK_OBJECT_POSITIVE_INTEGER &&
                  res->via.u64 == 0,
              "unregister_buffer of a live id did not answer 0");
    harness_req_begin(&r, 6, "unregister_buffer", 1);
    msgpack_pack_uint64(&r.pk, id);
    cr_assert_eq(raw_call_fd(&u, &r, 6, -1, &err, &res), 0);
    cr_assert(harness_err_code(err) == -1 && res->type == MSGPACK_OBJECT_POSITIVE_INTEGER &&
                  res->via.u64 == KVSTASH_ENOTFOUND,
              "unregister_buffer of a gone id did not answer 1 NOT_FOUND");

    raw_transfer(&r, 7, "batch_put_from", "ur-1", id, 0, 16);
    cr_assert_eq(raw_call_fd(&u, &r, 7, -1, &err, &res), 0);
    cr_assert_eq(one_result(err, res, "put_from from an unregistered id"), KVSTASH_EINVAL);
    raw_transfer(&r, 8, "batch_get_into", "ur-0", id, 0, 16);
    cr_assert_eq(raw_call_fd(&u, &r, 8, -1, &err, &res), 0);
    cr_assert_eq(one_result(err, res, "get_into an unregistered id"), -KVSTASH_EINVAL);
    harness_req_begin(&r, 9, "is_exist", 1);
    harness_pack_bin(&r.pk, "ur-1", 4);
    cr_assert_eq(raw_call_fd(&u, &r, 9, -1, &err, &res), 0);
    cr_assert(res->type == MSGPACK_OBJECT_BOOLEAN && !res->via.boolean,
              "a put_from from an unregistered id stored its key");

    /* register_buffer without a descriptor: INVALID_ARGUMENT; with an unsealed one: taken */
    raw_register(&r, 10, 4096);
    cr_assert_eq(raw_call_fd(&u, &r, 10, -1, &err, &res), 0);
    cr_assert_eq(harness_err_code(err), KVSTASH_EINVAL, "register_buffer without a descriptor");
    fd = sealable_memfd(4096);
    raw_register(&r, 11, 4096);
    cr_assert_eq(raw_call_fd(&u, &r, 11, fd, &err, &res), 0);
    cr_assert_eq(harness_err_code(err), -1, "register_buffer of a memfd not sealed F_SEAL_SHRINK");
    close(fd);

    harness_req_destroy(&r);
    harness_conn_close(&u);
    cr_assert_eq(harness_stop_clean(&h), 0, "kvstashd did not shut down cleanly");
}
