/*
 * Integration: values go in and come back byte-exact, over TCP and over the
 * Unix socket, one at a time and in batches, from 0 bytes to 32 MiB; hello
 * tells a client the limits it was started with.
 */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../lib/harness.h"
#include "kvstash.h"

static struct harness h;

static void
teardown(void)
{
    harness_destroy(&h);
}

TestSuite(roundtrip, .fini = teardown, .timeout = 60);

static const size_t sizes[] = {0, 1, 4096, 1u << 20, 32u << 20};

/* put every size under "<tag>-<size>" through c, then read each back three ways. */
static void
put_and_read_sizes(struct kvstash *c, const char *tag)
{
    for (size_t i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++) {
        size_t n = sizes[i];
        char key[64];
        snprintf(key, sizeof(key), "%s-%zu", tag, n);
        uint8_t *val = malloc(n ? n : 1);
        cr_assert_not_null(val);
        harness_fill(val, n, harness_seed(key, strlen(key)));

        int rc = kvstash_put(c, key, strlen(key), val, n);
        cr_assert_eq(rc, 0, "put %s (%zu bytes): %s", key, n, kvstash_strerror(rc));

        uint64_t size = 0;
        rc = kvstash_get_size(c, key, strlen(key), &size);
        cr_assert_eq(rc, 0, "get_size %s: %s", key, kvstash_strerror(rc));
        cr_assert_eq(size, n, "get_size %s: %llu, want %zu", key, (unsigned long long)size, n);

        bool exists = false;
        rc = kvstash_is_exist(c, key, strlen(key), &exists);
        cr_assert(rc == 0 && exists, "is_exist %s: rc %d exists %d", key, rc, exists);

        void *got = NULL;
        size_t glen = 0;
        rc = kvstash_get_alloc(c, key, strlen(key), &got, &glen);
        cr_assert_eq(rc, 0, "get %s: %s", key, kvstash_strerror(rc));
        cr_assert_eq(glen, n, "get %s: %zu bytes, want %zu", key, glen, n);
        cr_assert(n == 0 || memcmp(got, val, n) == 0, "get %s: bytes differ", key);
        free(got);

        /* into a caller buffer of exactly the right size */
        uint8_t *buf = malloc(n ? n : 1);
        cr_assert_not_null(buf);
        rc = kvstash_get(c, key, strlen(key), buf, n, &glen);
        cr_assert(rc == 0 && glen == n, "get %s into %zu bytes: rc %d len %zu", key, n, rc,
                  glen);
        cr_assert(n == 0 || memcmp(buf, val, n) == 0, "get %s into buffer: bytes differ", key);
        free(buf);
        free(val);
    }
}

Test(roundtrip, tcp_sizes_byte_exact)
{
    cr_assert_eq(harness_start(&h, NULL, NULL), 0);
    struct kvstash *c;
    cr_assert_eq(harness_client(h.addr, 2000, &c), 0);
    put_and_read_sizes(c, "tcp");
    kvstash_close(c);
    cr_assert_eq(harness_stop_clean(&h), 0, "kvstashd did not shut down cleanly");
}

Test(roundtrip, unix_sizes_byte_exact_and_shared_with_tcp)
{
    cr_assert_eq(harness_start(&h, NULL, NULL), 0);
    struct kvstash *u, *t;
    cr_assert_eq(harness_client(h.unix_addr, 2000, &u), 0, "connect %s", h.unix_addr);
    put_and_read_sizes(u, "unix");

    /* one store behind both transports: what went in over the Unix socket reads over TCP */
    cr_assert_eq(harness_client(h.addr, 2000, &t), 0);
    size_t n = 1u << 20;
    const char *key = "unix-1048576";
    uint8_t *want = malloc(n);
    cr_assert_not_null(want);
    harness_fill(want, n, harness_seed(key, strlen(key)));
    void *got = NULL;
    size_t glen = 0;
    int rc = kvstash_get_alloc(t, key, strlen(key), &got, &glen);
    cr_assert(rc == 0 && glen == n && memcmp(got, want, n) == 0,
              "value written over the Unix socket did not read back over TCP: rc %d len %zu",
              rc, glen);
    free(got);
    free(want);
    kvstash_close(t);
    kvstash_close(u);
    cr_assert_eq(harness_stop_clean(&h), 0, "kvstashd did not shut down cleanly");
}

Test(roundtrip, batch_byte_exact)
{
    cr_assert_eq(harness_start(&h, NULL, NULL), 0);
    struct kvstash *c;
    cr_assert_eq(harness_client(h.addr, 2000, &c), 0);

    enum { N = 6 };
    const size_t lens[N] = {0, 1, 4096, 100000, 1u << 20, 3u << 20};
    char keyb[N][32];
    const void *keys[N];
    size_t klens[N];
    const void *vals[N];
    uint8_t *vbuf[N];
    void *bufs[N];
    size_t caps[N], vlens[N];
    int codes[N];
    for (int i = 0; i < N; i++) {
        snprintf(keyb[i], sizeof(keyb[i]), "batch-%d", i);
        keys[i] = keyb[i];
        klens[i] = strlen(keyb[i]);
        vbuf[i] = malloc(lens[i] + 1);
        cr_assert_not_null(vbuf[i]);
        harness_fill(vbuf[i], lens[i], harness_seed(keyb[i], klens[i]));
        vals[i] = vbuf[i];
        bufs[i] = malloc(lens[i] + 1);
        cr_assert_not_null(bufs[i]);
        caps[i] = lens[i] + 1;
        codes[i] = -1;
    }
    int rc = kvstash_batch_put(c, N, keys, klens, vals, lens, codes);
    cr_assert_eq(rc, 0, "batch_put: %s", kvstash_strerror(rc));
    for (int i = 0; i < N; i++) {
        cr_assert_eq(codes[i], 0, "batch_put key %d (%zu bytes): code %d", i, lens[i], codes[i]);
        codes[i] = -1;
    }
    rc = kvstash_batch_get(c, N, keys, klens, bufs, caps, vlens, codes);
    cr_assert_eq(rc, 0, "batch_get: %s", kvstash_strerror(rc));
    for (int i = 0; i < N; i++) {
        cr_assert_eq(codes[i], 0, "batch_get key %d: code %d", i, codes[i]);
        cr_assert_eq(vlens[i], lens[i], "batch_get key %d: %zu bytes, want %zu", i, vlens[i],
                     lens[i]);
        cr_assert(memcmp(bufs[i], vbuf[i], lens[i]) == 0, "batch_get key %d: bytes differ", i);
    }

    /* a buffer one byte short: the value is not truncated silently */
    size_t glen = 0;
    rc = kvstash_get(c, keys[3], klens[3], bufs[3], lens[3] - 1, &glen);
    cr_assert_eq(rc, KVSTASH_ETOOLARGE, "get into a short buffer: %s", kvstash_strerror(rc));
    cr_assert_eq(glen, lens[3], "get into a short buffer should report the size needed");

    for (int i = 0; i < N; i++) {
        free(vbuf[i]);
        free(bufs[i]);
    }
    kvstash_close(c);
    cr_assert_eq(harness_stop_clean(&h), 0, "kvstashd did not shut down cleanly");
}

Test(roundtrip, client_splits_batches_over_max_batch)
{
    cr_assert_eq(harness_start(&h, NULL, HARNESS_ARGS("--max_batch=8")), 0);
    struct kvstash *c;
    cr_assert_eq(harness_client(h.addr, 2000, &c), 0);

    enum { N = 37 };
    char keyb[N][24];
    uint64_t vb[N];
    const void *keys[N], *vals[N];
    size_t klens[N], vlens[N], caps[N];
    void *bufs[N];
    uint64_t out[N];
    int codes[N];
    for (int i = 0; i < N; i++) {
        snprintf(keyb[i], sizeof(keyb[i]), "split-%02d", i);
        keys[i] = keyb[i];
        klens[i] = strlen(keyb[i]);
        vb[i] = 1000u + (uint64_t)i;
        vals[i] = &vb[i];
        vlens[i] = sizeof(vb[i]);
        bufs[i] = &out[i];
        caps[i] = sizeof(out[i]);
    }
    int rc = kvstash_batch_put(c, N, keys, klens, vals, vlens, codes);
    cr_assert_eq(rc, 0, "batch_put of %d keys with max_batch 8: %s", N, kvstash_strerror(rc));
    for (int i = 0; i < N; i++) {
        cr_assert_eq(codes[i], 0, "key %d: code %d", i, codes[i]);
    }
    size_t got[N];
    rc = kvstash_batch_get(c, N, keys, klens, bufs, caps, got, codes);
    cr_assert_eq(rc, 0, "batch_get: %s", kvstash_strerror(rc));
    for (int i = 0; i < N; i++) {
        cr_assert(codes[i] == 0 && got[i] == sizeof(uint64_t) && out[i] == vb[i],
                  "key %d came back wrong (code %d)", i, codes[i]);
    }
    kvstash_close(c);
    cr_assert_eq(harness_stop_clean(&h), 0, "kvstashd did not shut down cleanly");
}

Test(roundtrip, hello_reports_limits)
{
    cr_assert_eq(harness_start(&h, NULL,
                               HARNESS_ARGS("--max_batch=777", "--max_key_size=200",
                                            "--max_value_size=8m", "--lease_ttl_ms=2500")),
                 0);
    struct kvstash *c;
    cr_assert_eq(harness_client(h.addr, 2000, &c), 0);
    const struct kvstash_hello *hi = kvstash_server_info(c);
    cr_assert_not_null(hi);
    cr_assert_str_eq(hi->server, "kvstashd");
    cr_assert_eq(hi->protocol, 1);
    cr_assert_neq(hi->version[0], '\0', "hello has no version");
    cr_assert_neq(hi->node_id[0], '\0', "hello has no node_id");
    cr_assert_eq(hi->max_batch, 777);
    cr_assert_eq(hi->max_key_size, 200);
    cr_assert_eq(hi->max_value_size, 8u << 20);
    cr_assert_eq(hi->lease_ttl_ms, 2500);
    cr_assert_eq(hi->max_message_size, 1u << 30, "default max_message_size is 1g");

    /* the limits hello announced are the ones enforced */
    char key[201];
    memset(key, 'k', sizeof(key));
    int rc = kvstash_put(c, key, 200, "v", 1);
    cr_assert_eq(rc, 0, "a key of exactly max_key_size: %s", kvstash_strerror(rc));
    rc = kvstash_put(c, key, 201, "v", 1);
    cr_assert_eq(rc, KVSTASH_ETOOLARGE, "a key one byte over max_key_size: %s",
                 kvstash_strerror(rc));
    cr_assert_eq(kvstash_ping(c), 0);
    kvstash_close(c);
    cr_assert_eq(harness_stop_clean(&h), 0, "kvstashd did not shut down cleanly");
}
