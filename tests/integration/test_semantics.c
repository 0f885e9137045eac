/*
 * Integration: what the store promises a client. Batches answer per key;
 * prefix_match counts leading keys or groups; a key has exactly one writer
 * (the second gets BUSY while the first is in flight, EXISTS afterwards); a
 * writer that disconnects mid-value leaves nothing behind; under memory
 * pressure old objects are evicted whole while hard-pinned ones stay.
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <pthread.h>
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

TestSuite(semantics, .fini = teardown, .timeout = 60);

static struct kvstash *
client(void)
{
    struct kvstash *c = NULL;
    cr_assert_eq(harness_client(h.addr, 2000, &c), 0, "cannot connect to %s", h.addr);
    return c;
}

static uint64_t
stat_of(struct kvstash *c, const char *name)
{
    uint64_t v = 0;
    int rc = harness_stat(c, name, &v);
    cr_assert_eq(rc, 0, "stats has no %s (%s)", name, kvstash_strerror(rc));
    return v;
}

#define KEYS(...) ((const void *const[]){__VA_ARGS__})

static void
lens_of(size_t n, const void *const *keys, size_t *lens)
{
    for (size_t i = 0; i < n; i++) {
        lens[i] = strlen(keys[i]);
    }
}

Test(semantics, batch_answers_per_key)
{
    cr_assert_eq(harness_start(&h, NULL, HARNESS_ARGS("--max_value_size=64k")), 0);
    struct kvstash *c = client();

    char longkey[1026];
    memset(longkey, 'L', 1025);
    longkey[1025] = '\0';
    static uint8_t big[65537], max[65536], small[100];
    harness_fill(big, sizeof(big), 1);
    harness_fill(max, sizeof(max), 2);
    harness_fill(small, sizeof(small), 3);

    /* a, b (empty), a key over max_key_size, c (value over max_value_size), d (exactly max) */
    const void *const keys[] = {"a", "b", longkey, "c", "d"};
    const void *const vals[] = {small, small, small, big, max};
    const size_t vlens[] = {sizeof(small), 0, 10, sizeof(big), sizeof(max)};
    size_t klens[5];
    lens_of(5, keys, klens);
    int codes[7];
    int rc = kvstash_batch_put(c, 5, keys, klens, vals, vlens, codes);
    cr_assert_eq(rc, 0, "batch_put: %s", kvstash_strerror(rc));
    const int want_put[5] = {0, 0, KVSTASH_ETOOLARGE, KVSTASH_ETOOLARGE, 0};
    for (int i = 0; i < 5; i++) {
        cr_assert_eq(codes[i], want_put[i], "batch_put key %d: code %d, want %d", i, codes[i],
                     want_put[i]);
    }

    /* write-once: a stored key answers EXISTS, the new one next to it is stored */
    const void *const keys2[] = {"a", "e"};
    const void *const vals2[] = {max, small};
    const size_t vlens2[] = {10, 5};
    size_t klens2[2];
    lens_of(2, keys2, klens2);
    rc = kvstash_batch_put(c, 2, keys2, klens2, vals2, vlens2, codes);
    cr_assert_eq(rc, 0);
    cr_assert_eq(codes[0], KVSTASH_EEXISTS, "second put of a: code %d", codes[0]);
    cr_assert_eq(codes[1], 0, "put of e: code %d", codes[1]);

    uint64_t hits0 = stat_of(c, "hits"), misses0 = stat_of(c, "misses");

    /* mixed hits and misses; the empty value is a hit, not a miss */
    const void *const gkeys[] = {"a", "missing", "b", "c", "d", longkey, "e"};
    size_t gklens[7], caps[7], glens[7];
    lens_of(7, gkeys, gklens);
    static uint8_t gb[7][65536];
    void *bufs[7];
    for (int i = 0; i < 7; i++) {
        bufs[i] = gb[i];
        caps[i] = sizeof(gb[i]);
    }
    rc = kvstash_batch_get(c, 7, gkeys, gklens, bufs, caps, glens, codes);
    cr_assert_eq(rc, 0, "batch_get: %s", kvstash_strerror(rc));
    const int want_get[7] = {0, KVSTASH_ENOTFOUND, 0, KVSTASH_ENOTFOUND, 0, KVSTASH_ENOTFOUND, 0};
    for (int i = 0; i < 7; i++) {
        cr_assert_eq(codes[i], want_get[i], "batch_get key %d: code %d, want %d", i, codes[i],
                     want_get[i]);
    }
    cr_assert(glens[0] == sizeof(small) && memcmp(gb[0], small, sizeof(small)) == 0,
              "a came back wrong");
    cr_assert_eq(glens[2], 0, "b (empty) came back with %zu bytes", glens[2]);
    cr_assert(glens[4] == sizeof(max) && memcmp(gb[4], max, sizeof(max)) == 0,
              "d came back wrong");
    cr_assert(glens[6] == 5 && memcmp(gb[6], small, 5) == 0, "e came back wrong");

    uint64_t hits1 = stat_of(c, "hits"), misses1 = stat_of(c, "misses");
    cr_assert_eq(hits1 - hits0, 4, "hits went %llu -> %llu, want +4", (unsigned long long)hits0,
                 (unsigned long long)hits1);
    cr_assert_eq(misses1 - misses0, 3, "misses went %llu -> %llu, want +3",
                 (unsigned long long)misses0, (unsigned long long)misses1);

    bool ex[7];
    rc = kvstash_batch_is_exist(c, 7, gkeys, gklens, ex);
    cr_assert_eq(rc, 0);
    const bool want_ex[7] = {true, false, true, false, true, false, true};
    for (int i = 0; i < 7; i++) {
        cr_assert_eq(ex[i], want_ex[i], "batch_is_exist key %d: %d", i, ex[i]);
    }

    uint64_t size = 99;
    cr_assert_eq(kvstash_get_size(c, "b", 1, &size), 0);
    cr_assert_eq(size, 0, "get_size of the empty value: %llu", (unsigned long long)size);
    cr_assert_eq(kvstash_get_size(c, "missing", 7, &size), KVSTASH_ENOTFOUND);
    cr_assert_eq(stat_of(c, "objects"), 4, "a, b, d, e are stored");

    /* removal per key, then remove_all counts what was left */
    const void *const rkeys[] = {"a", "missing"};
    size_t rklens[2];
    lens_of(2, rkeys, rklens);
    rc = kvstash_batch_remove(c, 2, rkeys, rklens, false, codes);
    cr_assert_eq(rc, 0);
    cr_assert_eq(codes[0], 0, "remove a: %d", codes[0]);
    cr_assert_eq(codes[1], KVSTASH_ENOTFOUND, "remove missing: %d", codes[1]);
    cr_assert_eq(kvstash_remove(c, "a", 1, false), KVSTASH_ENOTFOUND, "a removed twice");
    bool e = true;
    cr_assert_eq(kvstash_is_exist(c, "a", 1, &e), 0);
    cr_assert(!e, "a still exists after remove");
    /* a removed key can be written again */
    cr_assert_eq(kvstash_put(c, "a", 1, "again", 5), 0);

    uint64_t removed = 0;
    cr_assert_eq(kvstash_remove_all(c, false, &removed), 0);
    cr_assert_eq(removed, 4, "remove_all removed %llu, want 4 (a b d e)",
                 (unsigned long long)removed);
    cr_assert_eq(stat_of(c, "objects"), 0);
    cr_assert_eq(stat_of(c, "value_bytes"), 0);
    kvstash_close(c);
    cr_assert_eq(harness_stop_clean(&h), 0, "kvstashd did not shut down cleanly");
}

Test(semantics, null_key_in_a_batch_is_an_error_not_a_crash)
{
    cr_assert_eq(harness_start(&h, NULL, NULL), 0);
    struct kvstash *c = client();
    const void *keys[2] = {"here", NULL};
    size_t klens[2] = {4, 3};          /* key 1 is NULL with a length */
    char b0[8], b1[8];
    void *bufs[2] = {b0, b1};
    size_t caps[2] = {sizeof(b0), sizeof(b1)}, vlens[2];
    int codes[2] = {99, 99};
    bool exists[2] = {true, true};
    uint64_t matched = 7;

    cr_assert_eq(kvstash_put(c, "here", 4, "v", 1), 0);
    cr_expect_eq(kvstash_batch_get(c, 2, keys, klens, bufs, caps, vlens, codes), KVSTASH_EINVAL);
    cr_expect(codes[0] == KVSTASH_EINVAL && codes[1] == KVSTASH_EINVAL, "codes %d %d", codes[0],
              codes[1]);
    cr_expect_eq(kvstash_batch_is_exist(c, 2, keys, klens, exists), KVSTASH_EINVAL);
    cr_expect(!exists[0] && !exists[1]);
    cr_expect_eq(kvstash_prefix_match(c, 2, keys, klens, 0, &matched), KVSTASH_EINVAL);
    cr_expect_eq(kvstash_batch_remove(c, 2, keys, klens, false, codes), KVSTASH_EINVAL);
    cr_expect(strstr(kvstash_last_error(c), "NULL") != NULL, "%s", kvstash_last_error(c));
    /* keys itself NULL: every code is set, none left as the library's placeholder */
    const void *vals[2] = {"a", "b"};
    size_t vl[2] = {1, 1};
    codes[0] = codes[1] = 99;
    cr_expect_eq(kvstash_batch_put(c, 2, NULL, klens, vals, vl, codes), KVSTASH_EINVAL);
    cr_expect(codes[0] == KVSTASH_EINVAL && codes[1] == KVSTASH_EINVAL, "codes %d %d", codes[0],
              codes[1]);
    /* nothing was sent: the connection and the object are as they were */
    cr_expect_eq(kvstash_ping(c), 0);
    bool there = false;
    cr_expect_eq(kvstash_is_exist(c, "here", 4, &there), 0);
    cr_expect(there, "a refused batch_remove removed something");
    kvstash_close(c);
}

Test(semantics, prefix_match_keys_and_groups)
{
    cr_assert_eq(harness_start(&h, NULL, NULL), 0);
    struct kvstash *c = client();
    const void *const all[] = {"p0", "p1", "p2", "p3", "p4", "p5", "p6", "p7", "p8", "p9"};
    size_t lens[10];
    lens_of(10, all, lens);
    const int present[] = {0, 1, 2, 3, 4, 6, 7};
    for (size_t i = 0; i < sizeof(present) / sizeof(present[0]); i++) {
        int k = present[i];
        cr_assert_eq(kvstash_put(c, all[k], lens[k], "x", 1), 0);
    }
    uint64_t m = 99;
    int rc = kvstash_prefix_match(c, 10, all, lens, 0, &m);
    cr_assert_eq(rc, 0, "prefix_match: %s", kvstash_strerror(rc));
    cr_assert_eq(m, 5, "p0..p9 with p5 missing: %llu, want 5", (unsigned long long)m);

    cr_assert_eq(kvstash_prefix_match(c, 4, all, lens, 0, &m), 0);
    cr_assert_eq(m, 4, "p0..p3 all present: %llu", (unsigned long long)m);

    const void *const gap[] = {"nope", "p0", "p1"};
    size_t glens[3];
    lens_of(3, gap, glens);
    cr_assert_eq(kvstash_prefix_match(c, 3, gap, glens, 0, &m), 0);
    cr_assert_eq(m, 0, "a missing first key: %llu, want 0", (unsigned long long)m);

    cr_assert_eq(kvstash_prefix_match(c, 10, all, lens, 1, &m), 0);
    cr_assert_eq(m, 5, "group_size 1 is per key: %llu", (unsigned long long)m);

    /* groups (p0 p1) (p2 p3) (p4 p5) (p6 p7): the third lacks p5 */
    cr_assert_eq(kvstash_prefix_match(c, 8, all, lens, 2, &m), 0);
    cr_assert_eq(m, 2, "group_size 2 over p0..p7: %llu, want 2", (unsigned long long)m);

    /* groups (p0..p4) (p5..p9) */
    cr_assert_eq(kvstash_prefix_match(c, 10, all, lens, 5, &m), 0);
    cr_assert_eq(m, 1, "group_size 5 over p0..p9: %llu, want 1", (unsigned long long)m);

    rc = kvstash_prefix_match(c, 8, all, lens, 3, &m);
    cr_assert_eq(rc, KVSTASH_EINVAL, "8 keys in groups of 3: %s, want INVALID_ARGUMENT",
                 kvstash_strerror(rc));
    cr_assert_eq(kvstash_ping(c), 0, "the connection is unusable after INVALID_ARGUMENT");

    /* a reserved or removed key ends the prefix too */
    cr_assert_eq(kvstash_remove(c, "p2", 2, false), 0);
    cr_assert_eq(kvstash_prefix_match(c, 10, all, lens, 0, &m), 0);
    cr_assert_eq(m, 2, "after removing p2: %llu, want 2", (unsigned long long)m);
    kvstash_close(c);
    cr_assert_eq(harness_stop_clean(&h), 0, "kvstashd did not shut down cleanly");
}

/*
 * Send the head of a put of vlen bytes for key on a raw connection: the
 * request header and the first `part` bytes of val.
 */
static void
send_partial_put(struct harness_conn *w, uint32_t msgid, const char *key, const uint8_t *val,
                 size_t vlen, size_t part)
{
    struct harness_req r;
    harness_req_init(&r);
    harness_req_begin(&r, msgid, "put", 2);
    harness_pack_str(&r.pk, key);
    msgpack_pack_bin(&r.pk, vlen);
    int rc = harness_conn_send(w, r.sb.data, r.sb.size, HARNESS_IO_TIMEOUT_MS);
    cr_assert_eq(rc, 0, "sending the put header: %s", strerror(-rc));
    rc = harness_conn_send(w, val, part, HARNESS_IO_TIMEOUT_MS);
    cr_assert_eq(rc, 0, "sending the first %zu value bytes: %s", part, strerror(-rc));
    harness_req_destroy(&r);
}

Test(semantics, second_writer_busy_then_exists)
{
    cr_assert_eq(harness_start(&h, NULL, NULL), 0);
    struct kvstash *c = client();
    const char *key = "contended";
    size_t vlen = 32u << 20, part = 1u << 20;
    uint8_t *val = malloc(vlen);
    cr_assert_not_null(val);
    harness_fill(val, vlen, harness_seed(key, strlen(key)));

    struct harness_conn w;
    cr_assert_eq(harness_conn_tcp(&w, h.port, 2000), 0);
    send_partial_put(&w, 7, key, val, vlen, part);

    uint64_t last = 0;
    int rc = harness_wait_stat(c, "reserved", 1, 3000, &last);
    cr_assert_eq(rc, 0, "a put stalled mid-value never showed in stats reserved (last %llu)",
                 (unsigned long long)last);

    /* while the first writer is in flight: BUSY for writers, invisible to readers */
    rc = kvstash_put(c, key, strlen(key), "other", 5);
    cr_assert_eq(rc, KVSTASH_EBUSY, "second writer during the first: %s, want BUSY",
                 kvstash_strerror(rc));
    void *got = NULL;
    size_t glen = 0;
    rc = kvstash_get_alloc(c, key, strlen(key), &got, &glen);
    cr_assert_eq(rc, KVSTASH_ENOTFOUND, "a half-written value is visible: %s",
                 kvstash_strerror(rc));
    bool ex = true;
    cr_assert_eq(kvstash_is_exist(c, key, strlen(key), &ex), 0);
    cr_assert(!ex, "is_exist is true for a half-written value");

    /* the first writer completes and is stored */
    rc = harness_conn_send(&w, val + part, vlen - part, HARNESS_IO_TIMEOUT_MS * 2);
    cr_assert_eq(rc, 0, "sending the rest of the value: %s", strerror(-rc));
    const msgpack_object *m;
    rc = harness_conn_read(&w, HARNESS_IO_TIMEOUT_MS, &m);
    cr_assert_eq(rc, 1, "no reply to the completed put (%d)", rc);
    cr_assert(m->type == MSGPACK_OBJECT_ARRAY && m->via.array.size == 4 &&
                  m->via.array.ptr[0].via.u64 == 1 && m->via.array.ptr[1].via.u64 == 7,
              "the reply is not the response to msgid 7");
    cr_assert_eq(harness_err_code(&m->via.array.ptr[2]), -1, "the completed put got an error");
    cr_assert(m->via.array.ptr[3].type == MSGPACK_OBJECT_POSITIVE_INTEGER &&
                  m->via.array.ptr[3].via.u64 == 0,
              "the completed put was not stored");
    harness_conn_close(&w);

    rc = kvstash_get_alloc(c, key, strlen(key), &got, &glen);
    cr_assert(rc == 0 && glen == vlen && memcmp(got, val, vlen) == 0,
              "the first writer's value did not read back byte-exact (rc %d, %zu bytes)", rc,
              glen);
    free(got);

    /* afterwards: write-once, for this client and a third one */
    rc = kvstash_put(c, key, strlen(key), "other", 5);
    cr_assert_eq(rc, KVSTASH_EEXISTS, "put after the first writer finished: %s",
                 kvstash_strerror(rc));
    struct kvstash *c3 = client();
    rc = kvstash_put(c3, key, strlen(key), "third", 5);
    cr_assert_eq(rc, KVSTASH_EEXISTS, "a third client's put: %s", kvstash_strerror(rc));
    cr_assert_eq(stat_of(c, "reserved"), 0);
    kvstash_close(c3);
    kvstash_close(c);
    free(val);
    cr_assert_eq(harness_stop_clean(&h), 0, "kvstashd did not shut down cleanly");
}

Test(semantics, disconnect_mid_put_leaves_nothing)
{
    cr_assert_eq(harness_start(&h, NULL, NULL), 0);
    struct kvstash *c = client();
    cr_assert_eq(kvstash_put(c, "before", 6, "x", 1), 0);
    uint64_t used0 = stat_of(c, "memory_used"), objects0 = stat_of(c, "objects");
    cr_assert_eq(stat_of(c, "reserved"), 0);

    const char *key = "abandoned";
    size_t vlen = 32u << 20, part = 1u << 20;
    uint8_t *val = malloc(vlen);
    cr_assert_not_null(val);
    harness_fill(val, vlen, 42);

    for (int round = 0; round < 3; round++) {
        struct harness_conn w;
        cr_assert_eq(harness_conn_tcp(&w, h.port, 2000), 0);
        send_partial_put(&w, 1, key, val, vlen, part * (size_t)(round + 1));
        uint64_t last = 0;
        int rc = harness_wait_stat(c, "reserved", 1, 3000, &last);
        cr_assert_eq(rc, 0, "round %d: the stalled put never showed as reserved", round);
        cr_assert_gt(stat_of(c, "memory_used"), used0,
                     "round %d: a reservation took no memory", round);
        harness_conn_close(&w);

        rc = harness_wait_stat(c, "reserved", 0, 3000, &last);
        cr_assert_eq(rc, 0, "round %d: reserved stayed %llu after the writer disconnected",
                     round, (unsigned long long)last);
        rc = harness_wait_stat(c, "memory_used", used0, 3000, &last);
        cr_assert_eq(rc, 0, "round %d: memory_used is %llu, was %llu before the abandoned put",
                     round, (unsigned long long)last, (unsigned long long)used0);
        cr_assert_eq(stat_of(c, "objects"), objects0);

        void *got = NULL;
        size_t glen = 0;
        rc = kvstash_get_alloc(c, key, strlen(key), &got, &glen);
        cr_assert_eq(rc, KVSTASH_ENOTFOUND, "round %d: an abandoned put is visible", round);
        uint64_t size;
        cr_assert_eq(kvstash_get_size(c, key, strlen(key), &size), KVSTASH_ENOTFOUND);
        bool ex = true;
        cr_assert_eq(kvstash_is_exist(c, key, strlen(key), &ex), 0);
        cr_assert(!ex, "round %d: is_exist true for an abandoned put", round);
    }

    /* the key is free again: neither BUSY nor EXISTS */
    int rc = kvstash_put(c, key, strlen(key), val, 4096);
    cr_assert_eq(rc, 0, "put after the abandoned writer: %s", kvstash_strerror(rc));
    kvstash_close(c);
    free(val);
    cr_assert_eq(harness_stop_clean(&h), 0, "kvstashd did not shut down cleanly");
}

/* ---- racing writers ---- */

#define RACE_THREADS 4
#define RACE_KEYS 64
#define RACE_VLEN 65536

struct racer {
    int id;
    const char *addr;
    pthread_barrier_t *start;
    int connect_rc;
    int codes[RACE_KEYS];
};

static void
race_value(uint8_t *buf, int key, int writer)
{
    harness_fill(buf, RACE_VLEN, (uint64_t)key * 1000u + (uint64_t)writer);
}

static void *
racer_main(void *arg)
{
    struct racer *r = arg;
    struct kvstash *c = NULL;
    r->connect_rc = harness_client(r->addr, 2000, &c);
    pthread_barrier_wait(r->start);
    if (r->connect_rc != 0) {
        return NULL;
    }
    uint8_t *val = malloc(RACE_VLEN);
    if (val == NULL) {
        r->connect_rc = -ENOMEM;
        kvstash_close(c);
        return NULL;
    }
    for (int k = 0; k < RACE_KEYS; k++) {
        char key[32];
        snprintf(key, sizeof(key), "race-%d", k);
        race_value(val, k, r->id);
        r->codes[k] = kvstash_put(c, key, strlen(key), val, RACE_VLEN);
    }
    free(val);
    kvstash_close(c);
    return NULL;
}

Test(semantics, racing_writers_exactly_one_wins)
{
    cr_assert_eq(harness_start(&h, NULL, NULL), 0);
    pthread_barrier_t start;
    pthread_barrier_init(&start, NULL, RACE_THREADS);
    struct racer rs[RACE_THREADS];
    pthread_t th[RACE_THREADS];
    for (int i = 0; i < RACE_THREADS; i++) {
        rs[i] = (struct racer){.id = i, .addr = h.addr, .start = &start};
        cr_assert_eq(pthread_create(&th[i], NULL, racer_main, &rs[i]), 0);
    }
    for (int i = 0; i < RACE_THREADS; i++) {
        pthread_join(th[i], NULL);
    }
    pthread_barrier_destroy(&start);
    for (int i = 0; i < RACE_THREADS; i++) {
        cr_assert_eq(rs[i].connect_rc, 0, "writer %d could not connect", i);
    }

    struct kvstash *c = client();
    static uint8_t want[RACE_VLEN], got[RACE_VLEN];
    for (int k = 0; k < RACE_KEYS; k++) {
        int winner = -1;
        for (int i = 0; i < RACE_THREADS; i++) {
            int code = rs[i].codes[k];
            if (code == 0) {
                cr_assert_eq(winner, -1, "key %d stored by writers %d and %d", k, winner, i);
                winner = i;
            } else {
                cr_assert(code == KVSTASH_EEXISTS || code == KVSTASH_EBUSY,
                          "key %d writer %d: %s, want EXISTS or BUSY", k, i,
                          kvstash_strerror(code));
            }
        }
        cr_assert_neq(winner, -1, "key %d: no writer stored it", k);
        char key[32];
        snprintf(key, sizeof(key), "race-%d", k);
        size_t glen = 0;
        int rc = kvstash_get(c, key, strlen(key), got, sizeof(got), &glen);
        race_value(want, k, winner);
        cr_assert(rc == 0 && glen == RACE_VLEN && memcmp(got, want, RACE_VLEN) == 0,
                  "key %d does not hold the winner's (writer %d) value", k, winner);
    }
    cr_assert_eq(stat_of(c, "objects"), RACE_KEYS);
    kvstash_close(c);
    cr_assert_eq(harness_stop_clean(&h), 0, "kvstashd did not shut down cleanly");
}

/* ---- eviction ---- */

#define MIB (1u << 20)

static void
evict_key(char *buf, size_t cap, int i)
{
    snprintf(buf, cap, "evict-%03d", i);
}

Test(semantics, eviction_is_whole_and_spares_hard_pins, .timeout = 90)
{
    /* The DRAM tier alone: with the SSD tier every evicted value would still be served. */
    cr_assert_eq(harness_start(&h, NULL, HARNESS_ARGS("--memory_size=64m", "--ssd_dir=")), 0);
    struct kvstash *c = client();
    uint8_t *val = malloc(MIB), *buf = malloc(MIB + 1);
    cr_assert(val && buf);

    const void *const pins[] = {"pinned-0", "pinned-1"};
    size_t plens[2];
    lens_of(2, pins, plens);
    for (int i = 0; i < 2; i++) {
        harness_fill(val, MIB, harness_seed(pins[i], plens[i]));
        cr_assert_eq(kvstash_put(c, pins[i], plens[i], val, MIB), 0);
    }
    int codes[2];
    cr_assert_eq(kvstash_pin(c, 2, pins, plens, "hard", codes), 0);
    cr_assert(codes[0] == 0 && codes[1] == 0, "pin hard: codes %d %d", codes[0], codes[1]);
    cr_assert_eq(stat_of(c, "pinned_hard"), 2);

    enum { N = 400 };
    char key[32];
    int failed = 0, first_fail = -1, first_rc = 0;
    for (int i = 0; i < N; i++) {
        evict_key(key, sizeof(key), i);
        harness_fill(val, MIB, harness_seed(key, strlen(key)));
        int rc = kvstash_put(c, key, strlen(key), val, MIB);
        cr_assert(rc >= 0, "put %s: connection failed: %s", key, kvstash_strerror(rc));
        if (rc != 0 && failed++ == 0) {
            first_fail = i;
            first_rc = rc;
        }
    }
    cr_assert_eq(failed, 0,
                 "%d of %d puts failed with evictable data present (first: #%d, %s)", failed, N,
                 first_fail, kvstash_strerror(first_rc));

    uint64_t cap = stat_of(c, "memory_capacity"), used = stat_of(c, "memory_used");
    cr_assert_eq(cap, 64u * MIB, "memory_capacity %llu, want 64 MiB", (unsigned long long)cap);
    cr_assert_leq(used, cap, "memory_used %llu over capacity %llu", (unsigned long long)used,
                  (unsigned long long)cap);
    cr_assert_gt(stat_of(c, "evictions"), 0);
    cr_assert_geq(stat_of(c, "evicted_bytes"), 300u * MIB, "400 MiB went into 64 MiB");

    int hits = 0;
    for (int i = 0; i < N; i++) {
        evict_key(key, sizeof(key), i);
        size_t glen = 0;
        int rc = kvstash_get(c, key, strlen(key), buf, MIB + 1, &glen);
        if (rc == KVSTASH_ENOTFOUND) {
            cr_assert_lt(i, N - 10, "%s, one of the 10 newest, was evicted", key);
            continue;
        }
        cr_assert_eq(rc, 0, "get %s: %s", key, kvstash_strerror(rc));
        harness_fill(val, MIB, harness_seed(key, strlen(key)));
        cr_assert(glen == MIB && memcmp(buf, val, MIB) == 0,
                  "%s survived eviction but reads back wrong (%zu bytes)", key, glen);
        hits++;
    }
    cr_assert_gt(hits, 10, "only %d keys resident after the flood", hits);
    cr_assert_lt(hits, 64, "%d MiB of values resident in a 64 MiB store", hits);

    for (int i = 0; i < 2; i++) {
        size_t glen = 0;
        int rc = kvstash_get(c, pins[i], plens[i], buf, MIB + 1, &glen);
        cr_assert_eq(rc, 0, "hard-pinned %s was evicted: %s", (const char *)pins[i],
                     kvstash_strerror(rc));
        harness_fill(val, MIB, harness_seed(pins[i], plens[i]));
        cr_assert(glen == MIB && memcmp(buf, val, MIB) == 0, "hard-pinned %s reads back wrong",
                  (const char *)pins[i]);
    }
    cr_assert_leq(stat_of(c, "memory_used"), cap);
    free(val);
    free(buf);
    kvstash_close(c);
    cr_assert_eq(harness_stop_clean(&h), 0, "kvstashd did not shut down cleanly");
}

Test(semantics, no_space_when_everything_is_hard_pinned)
{
    cr_assert_eq(harness_start(&h, NULL, HARNESS_ARGS("--memory_size=8m")), 0);
    struct kvstash *c = client();
    uint8_t *val = malloc(MIB);
    cr_assert_not_null(val);
    char key[32];
    int stored = 0, rc = 0;
    for (int i = 0; i < 16; i++) {
        snprintf(key, sizeof(key), "hard-%02d", i);
        harness_fill(val, MIB, (uint64_t)i);
        rc = kvstash_put(c, key, strlen(key), val, MIB);
        if (rc != 0) {
            break;
        }
        const void *const keys[] = {key};
        size_t klen = strlen(key);
        int code = -1;
        cr_assert_eq(kvstash_pin(c, 1, keys, &klen, "hard", &code), 0);
        cr_assert_eq(code, 0, "pin %s: %d", key, code);
        stored++;
    }
    cr_assert_eq(rc, KVSTASH_ENOSPACE,
                 "filling 8 MiB with hard-pinned 1 MiB values: got %s after %d, want NO_SPACE",
                 kvstash_strerror(rc), stored);
    cr_assert_geq(stored, 4, "only %d MiB fit in 8 MiB", stored);
    cr_assert_geq(stat_of(c, "no_space"), 1);
    cr_assert_eq(stat_of(c, "pinned_hard"), (uint64_t)stored);

    uint8_t *buf = malloc(MIB);
    cr_assert_not_null(buf);
    for (int i = 0; i < stored; i++) {
        snprintf(key, sizeof(key), "hard-%02d", i);
        size_t glen = 0;
        harness_fill(val, MIB, (uint64_t)i);
        cr_assert_eq(kvstash_get(c, key, strlen(key), buf, MIB, &glen), 0, "%s lost", key);
        cr_assert(glen == MIB && memcmp(buf, val, MIB) == 0, "%s reads back wrong", key);
    }

    /* unpinning makes room again */
    snprintf(key, sizeof(key), "hard-%02d", 0);
    const void *const keys[] = {key};
    size_t klen = strlen(key);
    int code = -1;
    cr_assert_eq(kvstash_unpin(c, 1, keys, &klen, &code), 0);
    cr_assert_eq(code, 0);
    rc = kvstash_put(c, "after-unpin", 11, val, MIB);
    cr_assert_eq(rc, 0, "put after unpinning one value: %s", kvstash_strerror(rc));
    free(buf);
    free(val);
    kvstash_close(c);
    cr_assert_eq(harness_stop_clean(&h), 0, "kvstashd did not shut down cleanly");
}

Test(semantics, slow_reader_gets_exact_bytes_while_key_removed_and_store_churns)
{
    cr_assert_eq(harness_start(&h, NULL, HARNESS_ARGS("--memory_size=64m")), 0);
    struct kvstash *c = client();
    const char *key = "slow-read";
    size_t vlen = 4u << 20;
    uint8_t *val = malloc(vlen);
    cr_assert_not_null(val);
    harness_fill(val, vlen, harness_seed(key, strlen(key)));
    cr_assert_eq(kvstash_put(c, key, strlen(key), val, vlen), 0);

    /* 40 gets of it, pipelined, and nobody reading the answers yet */
    enum { GETS = 40 };
    uint64_t gets0 = 0, gets = 0;
    cr_assert_eq(harness_stat(c, "ops.get", &gets0), 0);
    struct harness_conn r;
    cr_assert_eq(harness_conn_tcp(&r, h.port, 2000), 0);
    struct harness_req q;
    harness_req_init(&q);
    msgpack_sbuffer all;
    msgpack_sbuffer_init(&all);
    for (uint32_t i = 1; i <= GETS; i++) {
        harness_req_begin(&q, i, "get", 1);
        harness_pack_str(&q.pk, key);
        msgpack_sbuffer_write(&all, q.sb.data, q.sb.size);
    }
    cr_assert_eq(harness_conn_send(&r, all.data, all.size, HARNESS_IO_TIMEOUT_MS), 0);
    msgpack_sbuffer_destroy(&all);
    harness_req_destroy(&q);
    /* the first gets are dispatched (their answers queued, unread) before the removal */
    uint64_t deadline = harness_now_ms() + 10000;
    while (harness_stat(c, "ops.get", &gets) == 0 && gets == gets0 &&
           harness_now_ms() < deadline) {
        harness_sleep_ms(10);
    }
    cr_assert_gt(gets, gets0, "none of the pipelined gets was dispatched within 10 s");

    /* meanwhile: force-remove the key and churn the store's memory */
    int rc = kvstash_remove(c, key, strlen(key), true);
    cr_assert(rc == 0 || rc == KVSTASH_EBUSY, "forced remove: %s", kvstash_strerror(rc));
    uint8_t *junk = malloc(MIB);
    cr_assert_not_null(junk);
    for (int i = 0; i < 100; i++) {
        char k[32];
        snprintf(k, sizeof(k), "churn-%03d", i);
        memset(junk, 0xA5 ^ i, MIB);
        int prc = kvstash_put(c, k, strlen(k), junk, MIB);
        cr_assert(prc == 0 || prc == KVSTASH_ENOSPACE, "churn put %d: %s", i,
                  kvstash_strerror(prc));
    }
    free(junk);

    /* every answer is the value, whole, or (after the removal) nil; never other bytes */
    int exact = 0;
    bool seen_nil = false;
    for (uint32_t i = 1; i <= GETS; i++) {
        const msgpack_object *m;
        int rrc = harness_conn_read(&r, HARNESS_IO_TIMEOUT_MS, &m);
        cr_assert_eq(rrc, 1, "answer %u of %d missing (read %d)", i, GETS, rrc);
        cr_assert(m->type == MSGPACK_OBJECT_ARRAY && m->via.array.size == 4 &&
                      m->via.array.ptr[1].via.u64 == i &&
                      harness_err_code(&m->via.array.ptr[2]) == -1,
                  "answer %u is not the response to get %u", i, i);
        const msgpack_object *res = &m->via.array.ptr[3];
        if (res->type == MSGPACK_OBJECT_NIL) {
            seen_nil = true;
            continue;
        }
        cr_assert(!seen_nil, "get %u found the value after an earlier get missed it", i);
        cr_assert_eq(res->type, MSGPACK_OBJECT_BIN, "get %u: not a bin", i);
        cr_assert(res->via.bin.size == vlen && memcmp(res->via.bin.ptr, val, vlen) == 0,
                  "get %u: the bytes of a value queued before its removal changed", i);
        exact++;
    }
    cr_log_info("forced remove answered %s; %d of %d gets had the value", kvstash_strerror(rc),
                exact, GETS);
    cr_assert_gt(exact, 0, "no get answered before the removal");
    if (rc == KVSTASH_EBUSY) {
        cr_assert_eq(exact, GETS, "remove said BUSY, yet the value went away");
    }
    harness_conn_close(&r);
    free(val);
    kvstash_close(c);
    cr_assert_eq(harness_stop_clean(&h), 0, "kvstashd did not shut down cleanly");
}
