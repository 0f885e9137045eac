/*
 * test_outq: a connection's reply queue (src/rpc/outq.c) as the socket
 * side drives it: bytes come out in order and byte-exact across chunk
 * boundaries whatever the write and consume sizes, object values are queued
 * by reference (the iovecs point into the arena) and keep their object
 * referenced until the last byte is consumed or the queue is dropped, and
 * pending counts every unsent byte. Real in-process store (16 MiB arena);
 * no network.
 */
#include <criterion/criterion.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/uio.h>

#include "kverr.h"
#include "outq.h"
#include "store.h"

#define MiB (1024ull * 1024ull)

static struct store *t_s;
static struct outq t_q;

static void
t_setup(void)
{
    struct store_config cfg = {
        .memory_size = 16 * MiB,
        .max_key_size = 64,
        .max_value_size = 4 * MiB,
        .high_watermark = 0.95,
        .low_watermark = 0.85,
    };

    cr_assert_eq(store_create(&cfg, &t_s), 0);
    outq_init(&t_q, t_s);
}

static void
t_teardown(void)
{
    outq_deinit(&t_q);
    store_destroy(t_s);
}

TestSuite(outq, .init = t_setup, .fini = t_teardown);

/* t_byte: byte i of a test stream, so any position can be checked. */
static uint8_t
t_byte(uint32_t seed, size_t i)
{
    return (uint8_t)(seed * 29u + i * 13u + (i >> 8) * 7u + (i >> 16));
}

static uint8_t *
t_pattern(size_t len, uint32_t seed)
{
    uint8_t *p = malloc(len > 0 ? len : 1);

    cr_assert_not_null(p);
    for (size_t i = 0; i < len; i++) {
        p[i] = t_byte(seed, i);
    }
    return p;
}

static struct kv_key
t_key(const char *s)
{
    return (struct kv_key){.tenant = 0, .len = (uint32_t)strlen(s), .ptr = (const uint8_t *)s};
}

/* t_obj: store key -> pattern(len, seed) and return a reader reference to it. */
static struct store_obj *
t_obj(const char *key, size_t len, uint32_t seed)
{
    struct kv_key k = t_key(key);
    uint8_t *v = t_pattern(len, seed);
    struct store_obj *o = NULL;

    cr_assert_eq(store_put(t_s, &k, v, len), 0, "put %s", key);
    free(v);
    cr_assert_eq(store_get(t_s, &k, &o), 0);
    return o;
}

static int
t_remove(const char *key)
{
    struct kv_key k = t_key(key);
    return store_remove(t_s, &k, false);
}

/*
 * t_take: consume exactly n bytes from the front (socket-style: peek, copy
 * what fits, consume) and check them against want. Returns bytes taken.
 */
static size_t
t_take(size_t n, const uint8_t *want)
{
    struct iovec iov[16];
    size_t got = 0;

    while (got < n) {
        int cnt = outq_peek(&t_q, iov, 16);
        cr_assert_gt(cnt, 0, "queue ran dry with %zu of %zu bytes to go", n - got, n);
        size_t step = 0;
        for (int i = 0; i < cnt && got + step < n; i++) {
            size_t len = iov[i].iov_len;
            cr_assert_gt(len, 0, "zero-length segment %d", i);
            if (len > n - got - step) {
                len = n - got - step;
            }
            cr_assert(memcmp(iov[i].iov_base, want + got + step, len) == 0,
                      "bytes differ in [%zu, %zu)", got + step, got + step + len);
            step += len;
        }
        uint64_t before = outq_pending(&t_q);
        outq_consume(&t_q, step);
        cr_assert_eq(outq_pending(&t_q), before - step);
        got += step;
    }
    return got;
}

/* A byte stream we append to as we queue, to check what comes out. */
struct t_stream {
    uint8_t *buf;
    size_t len, cap;
};

static void
t_stream_add(struct t_stream *st, const void *p, size_t n)
{
    if (st->len + n > st->cap) {
        st->cap = (st->len + n) * 2;
        st->buf = realloc(st->buf, st->cap);
        cr_assert_not_null(st->buf);
    }
    memcpy(st->buf + st->len, p, n);
    st->len += n;
}

Test(outq, writes_come_out_in_order_across_chunk_boundaries)
{
    static const size_t wsizes[] = {1, 3, 7, 13, 1021, 4093, 17, 9973, 5};
    static const size_t csizes[] = {777, 5, 9999, 1, 16411, 3};
    const size_t total = 5 * OUTQ_CHUNK_SIZE + 333;
    uint8_t *data = t_pattern(total, 1);
    size_t w = 0, c = 0, wi = 0, ci = 0;

    /* interleave odd-size writes and consumes; every byte is checked once */
    while (c < total) {
        for (int k = 0; k < 3 && w < total; k++) {
            size_t n = wsizes[wi++ % (sizeof(wsizes) / sizeof(wsizes[0]))];
            if (n > total - w) {
                n = total - w;
            }
            cr_assert_eq(outq_write(&t_q, data + w, n), 0);
            w += n;
            cr_assert_eq(outq_pending(&t_q), w - c);
        }
        size_t n = csizes[ci++ % (sizeof(csizes) / sizeof(csizes[0]))];
        if (n > w - c) {
            n = w - c;
        }
        c += t_take(n, data + c);
    }
    cr_assert_eq(c, total);
    cr_assert_eq(outq_pending(&t_q), 0);
    struct iovec iov[4];
    cr_assert_eq(outq_peek(&t_q, iov, 4), 0);
    cr_assert_eq(t_q.failed, 0);

    /* all written first, then all consumed in odd steps */
    for (size_t off = 0, i = 0; off < total; i++) {
        size_t n = wsizes[i % (sizeof(wsizes) / sizeof(wsizes[0]))];
        n = n > total - off ? total - off : n;
        cr_assert_eq(outq_write(&t_q, data + off, n), 0);
        off += n;
    }
    cr_assert_eq(outq_pending(&t_q), total);
    for (size_t off = 0, i = 0; off < total; i++) {
        size_t n = csizes[i % (sizeof(csizes) / sizeof(csizes[0]))];
        n = n > total - off ? total - off : n;
        off += t_take(n, data + off);
    }
    cr_assert_eq(outq_pending(&t_q), 0);
    free(data);
}

Test(outq, write_larger_than_a_chunk)
{
    const size_t big = 3 * OUTQ_CHUNK_SIZE + 5;
    uint8_t *data = t_pattern(big + 20, 2);

    cr_assert_eq(outq_write(&t_q, data, 10), 0);
    cr_assert_eq(outq_write(&t_q, data + 10, big), 0);
    cr_assert_eq(outq_write(&t_q, data + 10 + big, 10), 0);
    cr_assert_eq(outq_pending(&t_q), big + 20);

    /* peek without consuming sees the same bytes twice */
    struct iovec iov[8];
    int n = outq_peek(&t_q, iov, 8);
    size_t sum = 0;
    for (int i = 0; i < n; i++) {
        sum += iov[i].iov_len;
    }
    cr_assert_eq(sum, big + 20, "peek shows %zu of %zu bytes", sum, big + 20);
    cr_assert_eq(outq_peek(&t_q, iov, 1), 1, "peek honours max");

    cr_assert_eq(t_take(big + 20, data), big + 20);
    cr_assert_eq(outq_pending(&t_q), 0);

    /* and once more after the queue went empty (recycled chunks) */
    cr_assert_eq(outq_write(&t_q, data, big), 0);
    cr_assert_eq(outq_write(&t_q, data + big, 20), 0);
    cr_assert_eq(t_take(big + 20, data), big + 20);
    free(data);
}

Test(outq, obj_is_queued_by_reference_into_the_arena)
{
    const size_t len = 3 * STORE_PAGE_SIZE + 123;
    struct store_obj *o = t_obj("val", len, 5);
    struct iovec ext[STORE_MAX_EXTENTS];
    int next = store_obj_iov(o, ext, STORE_MAX_EXTENTS);

    cr_assert_gt(next, 0);
    cr_assert_eq(outq_write(&t_q, "HDR", 3), 0);
    cr_assert_eq(outq_obj(&t_q, o), 0); /* takes over our reference */
    cr_assert_eq(outq_pending(&t_q), 3 + len);

    struct iovec iov[STORE_MAX_EXTENTS + 2];
    int n = outq_peek(&t_q, iov, STORE_MAX_EXTENTS + 2);
    cr_assert_eq(n, 1 + next, "%d segments, want 1 header + %d extents", n, next);
    cr_assert_eq(iov[0].iov_len, 3);
    cr_assert(memcmp(iov[0].iov_base, "HDR", 3) == 0);
    for (int i = 0; i < next; i++) {
        cr_assert_eq(iov[1 + i].iov_base, ext[i].iov_base, "extent %d is a copy, not the arena", i);
        cr_assert_eq(iov[1 + i].iov_len, ext[i].iov_len);
    }

    /* the reference is held: remove is BUSY while any byte is unsent */
    cr_assert_eq(t_remove("val"), KV_BUSY);
    uint8_t *want = malloc(3 + len);
    memcpy(want, "HDR", 3);
    uint8_t *v = t_pattern(len, 5);
    memcpy(want + 3, v, len);
    t_take(3 + len - 1, want);
    cr_assert_eq(outq_pending(&t_q), 1);
    cr_assert_eq(t_remove("val"), KV_BUSY, "released before its last byte was sent");
    t_take(1, want + 3 + len - 1);
    cr_assert_eq(outq_pending(&t_q), 0);
    cr_assert_eq(t_remove("val"), 0, "reference not released after the last byte");
    free(v);
    free(want);
}

Test(outq, headers_and_objects_interleaved_stay_in_order)
{
    enum { NOBJ = 80 };
    struct t_stream st = {0};
    char key[32], hdr[16];

    /* enough segments to grow and compact the segment array */
    for (int i = 0; i < NOBJ; i++) {
        size_t len = 1 + (size_t)i * 97;
        snprintf(key, sizeof(key), "obj-%d", i);
        int hl = snprintf(hdr, sizeof(hdr), "<%d>", i);
        cr_assert_eq(outq_write(&t_q, hdr, (size_t)hl), 0);
        t_stream_add(&st, hdr, (size_t)hl);
        cr_assert_eq(outq_obj(&t_q, t_obj(key, len, (uint32_t)i)), 0);
        uint8_t *v = t_pattern(len, (uint32_t)i);
        t_stream_add(&st, v, len);
        free(v);
        if (i == NOBJ / 2) {
            /* send part of it midway, so later appends reuse the front */
            t_take(st.len / 3, st.buf);
            memmove(st.buf, st.buf + st.len / 3, st.len - st.len / 3);
            st.len -= st.len / 3;
        }
    }
    cr_assert_eq(outq_pending(&t_q), st.len);
    cr_assert_eq(t_remove("obj-0"), 0, "obj-0 was fully sent midway");
    cr_assert_eq(t_remove("obj-79"), KV_BUSY);

    static const size_t steps[] = {11, 4099, 1, 333};
    for (size_t off = 0, i = 0; off < st.len; i++) {
        size_t n = steps[i % 4];
        n = n > st.len - off ? st.len - off : n;
        off += t_take(n, st.buf + off);
    }
    cr_assert_eq(outq_pending(&t_q), 0);
    for (int i = 1; i < NOBJ; i++) {
        snprintf(key, sizeof(key), "obj-%d", i);
        cr_assert_eq(t_remove(key), 0, "%s still referenced after it was sent", key);
    }
    free(st.buf);
}

Test(outq, deinit_releases_unsent_objects)
{
    cr_assert_eq(outq_write(&t_q, "abc", 3), 0);
    cr_assert_eq(outq_obj(&t_q, t_obj("a", 5000, 1)), 0);
    cr_assert_eq(outq_obj(&t_q, t_obj("b", 70000, 2)), 0);
    cr_assert_eq(outq_write(&t_q, "def", 3), 0);
    cr_assert_eq(t_remove("a"), KV_BUSY);
    cr_assert_eq(t_remove("b"), KV_BUSY);

    /* partly sent (into the first object), then the connection goes away */
    uint8_t *v = t_pattern(5000, 1);
    uint8_t want[103];
    memcpy(want, "abc", 3);
    memcpy(want + 3, v, 100);
    t_take(sizeof(want), want);
    free(v);

    outq_deinit(&t_q);
    cr_assert_eq(outq_pending(&t_q), 0);
    cr_assert_eq(t_remove("a"), 0, "deinit kept a reference on a");
    cr_assert_eq(t_remove("b"), 0, "deinit kept a reference on b");
    struct store_stats stt;
    store_stats(t_s, &stt);
    cr_assert_eq(stt.objects, 0);
    cr_assert_eq(stt.memory_used, 0, "arena pages still held after deinit and remove");

    /* idempotent, and the queue works again after it */
    outq_deinit(&t_q);
    cr_assert_eq(outq_write(&t_q, "xyz", 3), 0);
    t_take(3, (const uint8_t *)"xyz");
}

Test(outq, zero_length_object)
{
    struct store_obj *o = t_obj("empty", 0, 0);

    cr_assert_eq(outq_write(&t_q, "\xc4\x00", 2), 0);
    cr_assert_eq(outq_obj(&t_q, o), 0);
    cr_assert_eq(outq_pending(&t_q), 2);
    struct iovec iov[4];
    cr_assert_eq(outq_peek(&t_q, iov, 4), 1, "an empty value adds no segment");
    /* nothing to send for it: its reference is already back */
    cr_assert_eq(t_remove("empty"), 0);
    t_take(2, (const uint8_t *)"\xc4\x00");
    cr_assert_eq(outq_pending(&t_q), 0);
}

Test(outq, pending_counts_bytes_and_object_values)
{
    cr_assert_eq(outq_pending(&t_q), 0);
    cr_assert_eq(outq_write(&t_q, "", 0), 0);
    cr_assert_eq(outq_pending(&t_q), 0);
    cr_assert_eq(outq_write(&t_q, "12345", 5), 0);
    cr_assert_eq(outq_pending(&t_q), 5);
    cr_assert_eq(outq_obj(&t_q, t_obj("p", 10000, 3)), 0);
    cr_assert_eq(outq_pending(&t_q), 10005);
    cr_assert_eq(outq_write(&t_q, "6789", 4), 0);
    cr_assert_eq(outq_pending(&t_q), 10009);

    outq_consume(&t_q, 2);
    cr_assert_eq(outq_pending(&t_q), 10007);
    outq_consume(&t_q, 3 + 9999);
    cr_assert_eq(outq_pending(&t_q), 5);
    cr_assert_eq(t_remove("p"), KV_BUSY);
    outq_consume(&t_q, 1);
    cr_assert_eq(outq_pending(&t_q), 4);
    cr_assert_eq(t_remove("p"), 0);
    t_take(4, (const uint8_t *)"6789");
    cr_assert_eq(outq_pending(&t_q), 0);

    /* outq_pack_write is outq_write for msgpack-c */
    cr_assert_eq(outq_pack_write(&t_q, "ab", 2), 0);
    cr_assert_eq(outq_pending(&t_q), 2);
    t_take(2, (const uint8_t *)"ab");
}

/*
 * A descriptor marker: the bytes before it go out without it, the first write
 * after it carries it (and stops at the next marker), and it is sent once.
 */
Test(outq, descriptor_rides_with_the_first_byte_after_its_marker)
{
    struct iovec iov[8];
    int n;

    cr_assert_eq(outq_write(&t_q, "ab", 2), 0);
    cr_assert_eq(outq_fd(&t_q, 7), 0);
    cr_assert_eq(outq_write(&t_q, "cde", 3), 0);
    cr_assert_eq(outq_fd(&t_q, 9), 0);
    cr_assert_eq(outq_write(&t_q, "f", 1), 0);
    cr_assert_eq(outq_pending(&t_q), 6);

    cr_assert_eq(outq_head_fd(&t_q), -1, "no descriptor goes with the bytes before the marker");
    n = outq_peek(&t_q, iov, 8);
    cr_assert_eq(n, 1, "a write must stop before a marker");
    cr_assert_eq(iov[0].iov_len, 2);
    outq_consume(&t_q, 2);

    cr_assert_eq(outq_head_fd(&t_q), 7);
    n = outq_peek(&t_q, iov, 8);
    size_t total = 0;
    for (int i = 0; i < n; i++) {
        total += iov[i].iov_len;
    }
    cr_assert_eq(total, 3, "the write carrying fd 7 must hold exactly its 3 bytes");
    outq_fd_sent(&t_q);
    cr_assert_eq(outq_head_fd(&t_q), -1, "a descriptor is sent once");
    outq_consume(&t_q, 1);
    cr_assert_eq(outq_head_fd(&t_q), -1, "a partial write keeps the next marker behind");
    outq_consume(&t_q, 2);
    cr_assert_eq(outq_head_fd(&t_q), 9);
    outq_fd_sent(&t_q);
    n = outq_peek(&t_q, iov, 8);
    cr_assert_eq(n, 1);
    cr_assert_eq(((char *)iov[0].iov_base)[0], 'f');
    outq_consume(&t_q, 1);
    cr_assert_eq(outq_pending(&t_q), 0);
}

/*
 * Reply marks (client_inflight_max counts with them): a reply counts until
 * the last byte of the segment it ends in is sent, never less; replies
 * packed back to back into one chunk segment count until that segment is
 * sent (the lag is at most one segment, the count never runs ahead).
 */
Test(outq, reply_marks_count_until_the_last_byte_is_sent)
{
    outq_reply_end(&t_q);
    cr_assert_eq(outq_replies(&t_q), 0, "a mark on an empty queue has nothing left to send");

    /* a header, a value by reference, its end */
    cr_assert_eq(outq_write(&t_q, "hd", 2), 0);
    cr_assert_eq(outq_obj(&t_q, t_obj("r", 10000, 4)), 0);
    outq_reply_end(&t_q);
    cr_assert_eq(outq_replies(&t_q), 1);
    /* two small replies packed into one segment after it */
    cr_assert_eq(outq_write(&t_q, "abc", 3), 0);
    outq_reply_end(&t_q);
    cr_assert_eq(outq_write(&t_q, "de", 2), 0);
    outq_reply_end(&t_q);
    cr_assert_eq(outq_replies(&t_q), 3);

    outq_consume(&t_q, 2 + 9999);
    cr_assert_eq(outq_replies(&t_q), 3, "one byte of the value is still unsent");
    outq_consume(&t_q, 1);
    cr_assert_eq(outq_replies(&t_q), 2);
    outq_consume(&t_q, 3);
    cr_assert_eq(outq_replies(&t_q), 2, "a reply may count until its segment is sent");
    outq_consume(&t_q, 2);
    cr_assert_eq(outq_replies(&t_q), 0);
    cr_assert_eq(outq_pending(&t_q), 0);

    /* a reply that goes out with a descriptor */
    cr_assert_eq(outq_fd(&t_q, 5), 0);
    cr_assert_eq(outq_write(&t_q, "fd", 2), 0);
    outq_reply_end(&t_q);
    cr_assert_eq(outq_replies(&t_q), 1);
    outq_fd_sent(&t_q);
    cr_assert_eq(outq_replies(&t_q), 1);
    t_take(2, (const uint8_t *)"fd");
    cr_assert_eq(outq_replies(&t_q), 0);

    /* many marks across segments and a compaction of the segment array */
    for (int i = 0; i < 1000; i++) {
        cr_assert_eq(outq_write(&t_q, "x", 1), 0);
        outq_reply_end(&t_q);
        if (i % 100 == 99) {
            char key[16];

            snprintf(key, sizeof(key), "seg%d", i);
            cr_assert_eq(outq_obj(&t_q, t_obj(key, 1000, 5)), 0);   /* a segment boundary */
        }
        if (i % 7 == 0) {
            struct iovec iov[1];
            cr_assert_eq(outq_peek(&t_q, iov, 1), 1);
            outq_consume(&t_q, iov[0].iov_len);
        }
    }
    cr_assert_gt(outq_replies(&t_q), 0);
    while (outq_pending(&t_q) > 0) {
        struct iovec iov[1];
        cr_assert_eq(outq_peek(&t_q, iov, 1), 1);
        outq_consume(&t_q, iov[0].iov_len);
    }
    cr_assert_eq(outq_replies(&t_q), 0, "every reply is counted sent once all is sent");

    /* deinit forgets the marks of what it drops */
    cr_assert_eq(outq_write(&t_q, "z", 1), 0);
    outq_reply_end(&t_q);
    outq_deinit(&t_q);
    cr_assert_eq(outq_replies(&t_q), 0);
}
