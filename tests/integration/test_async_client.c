/*
 * Integration: the asynchronous batch calls of libkvstash (kvstash.h,
 * "Asynchronous batches") against the real daemon over its Unix socket.
 * Requests submitted without waiting run in submission order (a get_into
 * sees the put_from before it) and complete with their ids, per-key results
 * and bytes, signalled on the eventfd, which stays readable exactly while
 * completions wait; keys and piece arrays may be reused as soon as submit
 * returns; depth bounds submitted-and-undrained requests (-EAGAIN);
 * unregistering a buffer waits for the requests that name it; closing with
 * work in flight finishes that work; a daemon that goes away fails the
 * context. Run under ASan too: nothing may leak on any of these paths.
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <poll.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../lib/harness.h"
#include "kvstash.h"

static struct harness h;

static void
teardown(void)
{
    harness_destroy(&h);
}

TestSuite(async_client, .fini = teardown, .timeout = 60);

#define KIB 1024u
#define MIB (1024u * 1024u)
#define WAIT_MS 10000
#define SENTINEL 0x5a

static struct kvstash_async *
async_open(unsigned depth)
{
    struct kvstash_async *a = NULL;
    uint64_t deadline = harness_now_ms() + 2000;
    int rc;

    /* the socket file can exist a moment before the daemon listens on it (harness_client) */
    while ((rc = kvstash_async_open(h.unix_addr, depth, &a)) == -ECONNREFUSED &&
           harness_now_ms() < deadline) {
        harness_sleep_ms(10);
    }
    cr_assert_eq(rc, 0, "async_open(%s): %s", h.unix_addr, kvstash_strerror(rc));
    cr_assert_not_null(a);
    cr_assert_geq(kvstash_async_event_fd(a), 0);
    return a;
}

static struct kvstash_buffer *
async_buffer(struct kvstash_async *a, size_t size)
{
    struct kvstash_buffer *b = NULL;
    int rc = kvstash_async_register_buffer(a, size, &b);
    cr_assert_eq(rc, 0, "register_buffer(%zu): %s", size, kvstash_strerror(rc));
    cr_assert_not_null(kvstash_buffer_ptr(b));
    return b;
}

static uint8_t *
bptr(const struct kvstash_buffer *b)
{
    return kvstash_buffer_ptr(b);
}

/* the eventfd is readable within timeout_ms */
static bool
efd_readable(struct kvstash_async *a, int timeout_ms)
{
    struct pollfd p = {.fd = kvstash_async_event_fd(a), .events = POLLIN};
    int rc = poll(&p, 1, timeout_ms);
    cr_assert_geq(rc, 0, "poll: %s", strerror(errno));
    return rc == 1 && (p.revents & POLLIN);
}

/*
 * Collect exactly want completions into out, waiting on the eventfd (as an
 * event loop would) for at most WAIT_MS in all.
 */
static void
collect(struct kvstash_async *a, struct kvstash_completion *out, size_t want)
{
    uint64_t deadline = harness_now_ms() + WAIT_MS;
    size_t got = 0;

    while (got < want) {
        uint64_t now = harness_now_ms();
        cr_assert_lt(now, deadline, "only %zu of %zu completions within %d ms", got, want, WAIT_MS);
        if (!efd_readable(a, (int)(deadline - now))) {
            continue;
        }
        size_t k = kvstash_async_drain(a, out + got, want - got);
        cr_assert_gt(k, 0, "the eventfd was readable but drain found nothing");
        got += k;
    }
    cr_assert(!efd_readable(a, 0), "the eventfd is still readable with nothing to drain");
    struct kvstash_completion extra;
    cr_assert_eq(kvstash_async_drain(a, &extra, 1), 0, "a completion nobody submitted");
}

/* the stored value of key is exactly want[0..n), read over the socket */
static void
expect_stored(struct kvstash *c, const char *key, const uint8_t *want, size_t n)
{
    void *got = NULL;
    size_t glen = 0;
    int rc = kvstash_get_alloc(c, key, strlen(key), &got, &glen);
    cr_assert_eq(rc, 0, "get %s: %s", key, kvstash_strerror(rc));
    cr_assert_eq(glen, n, "get %s: %zu bytes, want %zu", key, glen, n);
    cr_assert(n == 0 || memcmp(got, want, n) == 0, "get %s: bytes differ", key);
    free(got);
}

static struct kvstash *
sync_client(void)
{
    struct kvstash *c = NULL;
    cr_assert_eq(harness_client(h.unix_addr, 2000, &c), 0, "cannot connect to %s", h.unix_addr);
    return c;
}

Test(async_client, submit_without_waiting_then_drain_in_order)
{
    cr_assert_eq(harness_start(&h, NULL, NULL), 0);
    struct kvstash_async *a = async_open(16);
    struct kvstash_buffer *src = async_buffer(a, 4 * MIB);
    struct kvstash_buffer *dst = async_buffer(a, 4 * MIB);

    /* two put_from requests of 3 keys each; values in two pieces, one empty */
    enum { N = 6, PER = 3 };
    const size_t lens[N] = {1, 4099, 0, 65537, MIB + 3, 300};
    char keyb[N][32];
    uint8_t *vals[N];
    struct kvstash_piece srcp[N][2], dstp[N][2];
    uint64_t at_src = 0, at_dst = 0;

    memset(bptr(dst), SENTINEL, 4 * MIB);
    for (int i = 0; i < N; i++) {
        snprintf(keyb[i], sizeof(keyb[i]), "async-rt-%d", i);
        vals[i] = malloc(lens[i] + 1);
        cr_assert_not_null(vals[i]);
        harness_fill(vals[i], lens[i], harness_seed(keyb[i], strlen(keyb[i])));
        size_t half = lens[i] / 2;
        at_src += 5;
        srcp[i][0] = (struct kvstash_piece){.buf = src, .offset = at_src, .length = half};
        srcp[i][1] = (struct kvstash_piece){
            .buf = src, .offset = at_src + half + 3, .length = lens[i] - half};
        memcpy(bptr(src) + at_src, vals[i], half);
        memcpy(bptr(src) + at_src + half + 3, vals[i] + half, lens[i] - half);
        at_src += lens[i] + 3;
        /* the whole value in one destination piece, one byte longer than needed */
        at_dst += 7;
        dstp[i][0] = (struct kvstash_piece){.buf = dst, .offset = at_dst, .length = lens[i] + 1};
        at_dst += lens[i] + 1;
    }

    int64_t ids[5];
    {
        /* keys and arrays on a scratch area that is wiped after each submit */
        char kscratch[PER][32];
        const void *keys[PER];
        size_t klens[PER];
        struct kvstash_piece pscratch[PER][2];
        const struct kvstash_piece *pieces[PER];
        size_t npieces[PER];

        for (int r = 0; r < 2; r++) {
            for (int j = 0; j < PER; j++) {
                int i = r * PER + j;
                memcpy(kscratch[j], keyb[i], sizeof(kscratch[j]));
                keys[j] = kscratch[j];
                klens[j] = strlen(keyb[i]);
                memcpy(pscratch[j], srcp[i], sizeof(pscratch[j]));
                pieces[j] = lens[i] == 0 ? NULL : pscratch[j];
                npieces[j] = lens[i] == 0 ? 0 : 2;
            }
            ids[r] = kvstash_async_submit_put_from(a, PER, keys, klens, pieces, npieces);
            cr_assert_gt(ids[r], 0, "submit_put_from: %lld", (long long)ids[r]);
            memset(kscratch, 'X', sizeof(kscratch));
            memset(pscratch, 0xff, sizeof(pscratch));
            memset(npieces, 0xff, sizeof(npieces));
        }

        /* exists: every stored key plus one never stored */
        const void *ekeys[N + 1];
        size_t eklens[N + 1];
        char ekb[N + 1][32];
        for (int i = 0; i <= N; i++) {
            snprintf(ekb[i], sizeof(ekb[i]), i < N ? "async-rt-%d" : "async-missing-%d", i);
            ekeys[i] = ekb[i];
            eklens[i] = strlen(ekb[i]);
        }
        ids[2] = kvstash_async_submit_exists(a, N + 1, ekeys, eklens);
        cr_assert_gt(ids[2], 0);
        memset(ekb, 'Y', sizeof(ekb));

        /* get_into: every stored key back, in reverse order, as two requests */
        for (int r = 0; r < 2; r++) {
            for (int j = 0; j < PER; j++) {
                int i = N - 1 - (r * PER + j);
                memcpy(kscratch[j], keyb[i], sizeof(kscratch[j]));
                keys[j] = kscratch[j];
                klens[j] = strlen(keyb[i]);
                pscratch[j][0] = dstp[i][0];
                pieces[j] = pscratch[j];
                npieces[j] = 1;
            }
            ids[3 + r] = kvstash_async_submit_get_into(a, PER, keys, klens, pieces, npieces);
            cr_assert_gt(ids[3 + r], 0);
            memset(kscratch, 'X', sizeof(kscratch));
            memset(pscratch, 0xff, sizeof(pscratch));
        }
    }
    for (int r = 1; r < 5; r++) {
        cr_assert_eq(ids[r], ids[r - 1] + 1, "ids are not consecutive: %lld then %lld",
                     (long long)ids[r - 1], (long long)ids[r]);
    }

    struct kvstash_completion done[5];
    collect(a, done, 5);
    for (int r = 0; r < 5; r++) {
        cr_assert_eq(done[r].id, ids[r], "completion %d has id %lld, want %lld", r,
                     (long long)done[r].id, (long long)ids[r]);
        cr_assert_eq(done[r].status, 0, "request %lld: status %s", (long long)done[r].id,
                     kvstash_strerror(done[r].status));
    }
    for (int r = 0; r < 2; r++) {
        cr_assert_eq(done[r].n, PER);
        for (int j = 0; j < PER; j++) {
            cr_assert_eq(done[r].results[j], 0, "put_from %s: code %lld", keyb[r * PER + j],
                         (long long)done[r].results[j]);
        }
    }
    cr_assert_eq(done[2].n, N + 1);
    for (int i = 0; i <= N; i++) {
        cr_assert_eq(done[2].results[i], i < N ? 1 : 0, "exists #%d: %lld", i,
                     (long long)done[2].results[i]);
    }
    for (int r = 0; r < 2; r++) {
        cr_assert_eq(done[3 + r].n, PER);
        for (int j = 0; j < PER; j++) {
            int i = N - 1 - (r * PER + j);
            cr_assert_eq(done[3 + r].results[j], (int64_t)lens[i], "get_into %s: %lld, want %zu",
                         keyb[i], (long long)done[3 + r].results[j], lens[i]);
            const uint8_t *p = bptr(dst) + dstp[i][0].offset;
            cr_assert(lens[i] == 0 || memcmp(p, vals[i], lens[i]) == 0, "get_into %s: bytes differ",
                      keyb[i]);
            cr_assert_eq(p[lens[i]], SENTINEL, "get_into %s wrote past the value", keyb[i]);
        }
    }
    for (int r = 0; r < 5; r++) {
        kvstash_async_completion_free(&done[r]);
        cr_assert_null(done[r].results);
    }

    /* what went in through the async context reads back over a plain socket */
    struct kvstash *c = sync_client();
    for (int i = 0; i < N; i++) {
        expect_stored(c, keyb[i], vals[i], lens[i]);
        free(vals[i]);
    }
    kvstash_close(c);
    cr_assert_eq(kvstash_async_unregister_buffer(a, src), 0);
    kvstash_async_close(a); /* dst is still registered: close releases it */
    cr_assert_eq(harness_stop_clean(&h), 0, "kvstashd did not shut down cleanly");
}

Test(async_client, per_key_errors_stay_per_key)
{
    cr_assert_eq(harness_start(&h, NULL, NULL), 0);
    struct kvstash_async *a = async_open(4);
    struct kvstash_buffer *b = async_buffer(a, 64 * KIB);
    struct kvstash *c = sync_client();
    const char *val = "stored over the socket";
    cr_assert_eq(kvstash_put(c, "async-pk-0", 10, val, strlen(val)), 0);

    /* a stored key, a missing key, a piece past the buffer's end */
    const void *keys[3] = {"async-pk-0", "async-pk-missing", "async-pk-0"};
    size_t klens[3] = {10, 16, 10};
    struct kvstash_piece ok = {.buf = b, .offset = 0, .length = 100};
    struct kvstash_piece ok2 = {.buf = b, .offset = 1000, .length = 100};
    struct kvstash_piece bad = {.buf = b, .offset = 64 * KIB - 10, .length = 11};
    const struct kvstash_piece *pieces[3] = {&ok, &ok2, &bad};
    size_t npieces[3] = {1, 1, 1};
    int64_t id = kvstash_async_submit_get_into(a, 3, keys, klens, pieces, npieces);
    cr_assert_gt(id, 0);
    /* put_from of the stored key: EXISTS; of a new key with the bad piece: EINVAL */
    const void *pkeys[2] = {"async-pk-0", "async-pk-1"};
    size_t pklens[2] = {10, 10};
    const struct kvstash_piece *ppieces[2] = {&ok, &bad};
    int64_t pid = kvstash_async_submit_put_from(a, 2, pkeys, pklens, ppieces, npieces);
    cr_assert_eq(pid, id + 1);

    struct kvstash_completion done[2];
    collect(a, done, 2);
    cr_assert_eq(done[0].id, id);
    cr_assert_eq(done[0].status, 0);
    cr_assert_eq(done[0].results[0], (int64_t)strlen(val));
    cr_assert(memcmp(bptr(b), val, strlen(val)) == 0, "get_into: bytes differ");
    cr_assert_eq(done[0].results[1], -KVSTASH_ENOTFOUND);
    cr_assert_eq(done[0].results[2], -KVSTASH_EINVAL);
    cr_assert_eq(done[1].id, pid);
    cr_assert_eq(done[1].status, 0);
    cr_assert_eq(done[1].results[0], KVSTASH_EEXISTS);
    cr_assert_eq(done[1].results[1], KVSTASH_EINVAL);
    kvstash_async_completion_free(&done[0]);
    kvstash_async_completion_free(&done[1]);
    kvstash_async_completion_free(NULL);

    /* argument errors are refused at submit, never as ids */
    cr_assert_eq(kvstash_async_submit_exists(NULL, 1, keys, klens), -EINVAL);
    cr_assert_eq(kvstash_async_submit_exists(a, 1, NULL, klens), -EINVAL);
    cr_assert_eq(kvstash_async_submit_get_into(a, 1, keys, klens, NULL, npieces), -EINVAL);
    /* n == 0 is a request like any other */
    int64_t zid = kvstash_async_submit_exists(a, 0, NULL, NULL);
    cr_assert_eq(zid, pid + 1);
    collect(a, done, 1);
    cr_assert(done[0].id == zid && done[0].status == 0 && done[0].n == 0);
    kvstash_async_completion_free(&done[0]);

    kvstash_close(c);
    kvstash_async_close(a);
    cr_assert_eq(harness_stop_clean(&h), 0, "kvstashd did not shut down cleanly");
}

Test(async_client, queue_full_is_eagain_at_depth)
{
    cr_assert_eq(harness_start(&h, NULL, NULL), 0);
    enum { DEPTH = 3 };
    struct kvstash_async *a = async_open(DEPTH);
    const void *keys[1] = {"async-q"};
    size_t klens[1] = {7};
    int64_t ids[DEPTH + 1];

    for (int i = 0; i < DEPTH; i++) {
        ids[i] = kvstash_async_submit_exists(a, 1, keys, klens);
        cr_assert_eq(ids[i], i + 1, "submit %d: %lld", i, (long long)ids[i]);
    }
    cr_assert_eq(kvstash_async_submit_exists(a, 1, keys, klens), -EAGAIN);
    /* unregistering waits for every earlier request: after it all DEPTH have finished */
    struct kvstash_buffer *b = NULL;
    cr_assert_eq(kvstash_async_register_buffer(a, 4096, &b), 0);
    cr_assert_eq(kvstash_async_unregister_buffer(a, b), 0);
    cr_assert(efd_readable(a, 0), "finished requests do not show on the eventfd");
    /* finished, not drained: they still hold their places */
    cr_assert_eq(kvstash_async_submit_exists(a, 1, keys, klens), -EAGAIN);

    /* drain one: one place frees, and the eventfd stays readable for the rest */
    struct kvstash_completion done[DEPTH];
    cr_assert_eq(kvstash_async_drain(a, done, 1), 1);
    cr_assert(efd_readable(a, 0), "the eventfd went quiet with %d completions left", DEPTH - 1);
    cr_assert_eq(done[0].id, ids[0]);
    cr_assert(done[0].status == 0 && done[0].n == 1 && done[0].results[0] == 0);
    kvstash_async_completion_free(&done[0]);
    ids[DEPTH] = kvstash_async_submit_exists(a, 1, keys, klens);
    cr_assert_eq(ids[DEPTH], DEPTH + 1);
    cr_assert_eq(kvstash_async_submit_exists(a, 1, keys, klens), -EAGAIN);

    collect(a, done, DEPTH);
    for (int i = 0; i < DEPTH; i++) {
        cr_assert_eq(done[i].id, ids[i + 1]);
        cr_assert_eq(done[i].status, 0);
        kvstash_async_completion_free(&done[i]);
    }
    cr_assert_gt(kvstash_async_submit_exists(a, 1, keys, klens), 0, "the queue is free again");

    /* open refuses depth 0; drain of nothing is 0 */
    struct kvstash_async *z = NULL;
    cr_assert_eq(kvstash_async_open(h.unix_addr, 0, &z), KVSTASH_EINVAL);
    cr_assert_null(z);
    cr_assert_eq(kvstash_async_drain(NULL, done, 1), 0);
    cr_assert_eq(kvstash_async_event_fd(NULL), -EINVAL);
    kvstash_async_close(NULL);

    kvstash_async_close(a); /* the last request is not drained: close frees it */
    cr_assert_eq(harness_stop_clean(&h), 0, "kvstashd did not shut down cleanly");
}

Test(async_client, unregister_waits_for_requests_naming_the_buffer)
{
    cr_assert_eq(harness_start(&h, NULL, NULL), 0);
    struct kvstash_async *a = async_open(64);
    struct kvstash_buffer *b = async_buffer(a, 8 * MIB);

    enum { R = 16 };
    harness_fill(bptr(b), 8 * MIB, 42);
    int64_t last = 0;
    for (int r = 0; r < R; r++) {
        char key[32];
        snprintf(key, sizeof(key), "async-unreg-%d", r);
        const void *keys[1] = {key};
        size_t klens[1] = {strlen(key)};
        struct kvstash_piece p = {.buf = b, .offset = (uint64_t)r * 512 * KIB, .length = 512 * KIB};
        const struct kvstash_piece *pieces[1] = {&p};
        size_t npieces[1] = {1};
        last = kvstash_async_submit_put_from(a, 1, keys, klens, pieces, npieces);
        cr_assert_gt(last, 0);
    }
    /* returns only once all R requests ran with the buffer still registered */
    cr_assert_eq(kvstash_async_unregister_buffer(a, b), 0);
    struct kvstash_completion done[R];
    collect(a, done, R);
    for (int r = 0; r < R; r++) {
        cr_assert(done[r].status == 0 && done[r].results[0] == 0,
                  "put_from #%d: status %d code %lld", r, done[r].status,
                  (long long)done[r].results[0]);
        kvstash_async_completion_free(&done[r]);
    }
    cr_assert_eq(done[R - 1].id, last);
    kvstash_async_close(a);
    cr_assert_eq(harness_stop_clean(&h), 0, "kvstashd did not shut down cleanly");
}

Test(async_client, close_with_work_in_flight_finishes_it)
{
    cr_assert_eq(harness_start(&h, NULL, NULL), 0);
    struct kvstash_async *a = async_open(32);
    struct kvstash_buffer *b = async_buffer(a, 16 * MIB);
    harness_fill(bptr(b), 16 * MIB, 7);

    enum { R = 24, PER = 16, VLEN = 64 * KIB };
    for (int r = 0; r < R; r++) {
        char kb[PER][48];
        const void *keys[PER];
        size_t klens[PER];
        struct kvstash_piece p[PER];
        const struct kvstash_piece *pieces[PER];
        size_t npieces[PER];
        for (int j = 0; j < PER; j++) {
            snprintf(kb[j], sizeof(kb[j]), "async-close-%d-%d", r, j);
            keys[j] = kb[j];
            klens[j] = strlen(kb[j]);
            p[j] = (struct kvstash_piece){
                .buf = b, .offset = (uint64_t)(r * PER + j) % 256 * VLEN, .length = VLEN};
            pieces[j] = &p[j];
            npieces[j] = 1;
        }
        int64_t id = kvstash_async_submit_put_from(a, PER, keys, klens, pieces, npieces);
        cr_assert_gt(id, 0, "submit %d: %lld", r, (long long)id);
        if (r == 0) {
            /* one drained, the rest left queued, running or finished */
            struct kvstash_completion first;
            collect(a, &first, 1);
            cr_assert_eq(first.status, 0);
            kvstash_async_completion_free(&first);
        }
    }
    kvstash_async_close(a); /* waits for every put, frees the undrained completions */

    /* every key of every request was stored, byte for byte */
    struct kvstash *c = sync_client();
    for (int r = 0; r < R; r++) {
        for (int j = 0; j < PER; j++) {
            char key[48];
            snprintf(key, sizeof(key), "async-close-%d-%d", r, j);
            uint64_t size = 0;
            int rc = kvstash_get_size(c, key, strlen(key), &size);
            cr_assert(rc == 0 && size == VLEN, "%s: rc %s size %llu", key, kvstash_strerror(rc),
                      (unsigned long long)size);
        }
    }
    kvstash_close(c);
    cr_assert_eq(harness_stop_clean(&h), 0, "kvstashd did not shut down cleanly");
}

Test(async_client, daemon_gone_fails_the_context)
{
    cr_assert_eq(harness_start(&h, NULL, NULL), 0);
    struct kvstash_async *a = async_open(8);
    const void *keys[2] = {"async-gone-a", "async-gone-b"};
    size_t klens[2] = {12, 12};
    struct kvstash_completion done[2];

    cr_assert_gt(kvstash_async_submit_exists(a, 2, keys, klens), 0);
    collect(a, done, 1);
    cr_assert_eq(done[0].status, 0);
    kvstash_async_completion_free(&done[0]);

    harness_kill(&h);
    int64_t id = kvstash_async_submit_exists(a, 2, keys, klens);
    cr_assert_gt(id, 0);
    collect(a, done, 1);
    cr_assert_eq(done[0].id, id);
    cr_assert_lt(done[0].status, 0, "status %d after the daemon died", done[0].status);
    cr_assert(done[0].results[0] == done[0].status && done[0].results[1] == done[0].status,
              "per-key results should carry the status");
    /* the context is failed: later submits say why, at once */
    cr_assert_eq(kvstash_async_submit_exists(a, 2, keys, klens), done[0].status);
    kvstash_async_completion_free(&done[0]);
    kvstash_async_close(a);

    /* and a daemon that is not there fails open with the connect errno */
    struct kvstash_async *z = NULL;
    int rc = kvstash_async_open(h.unix_addr, 4, &z);
    cr_assert_lt(rc, 0, "open without a daemon: %d", rc);
    cr_assert_null(z);
}
