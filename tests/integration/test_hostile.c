/*
 * Integration: hostile and malformed input over raw sockets. A framing
 * violation gets one PROTOCOL_ERROR notification and a close, costs the
 * daemon no memory and bothers no other client; a well-framed but wrong
 * request gets a request-level error and the connection stays usable; limits
 * (max_message_size, max_batch, max_connections) hold.
 */
#include <criterion/criterion.h>
#include <errno.h>
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

TestSuite(hostile, .fini = teardown, .timeout = 60);

#define RSS_SLACK_KIB (4 * 1024)

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

/*
 * The daemon populates its arena's pages in the background after start (memory_prefaulted
 * in stats), which grows its RSS by up to memory_size: wait for that before taking an RSS
 * baseline, so the checks below measure only what the hostile input costs.
 */
static void
wait_arena(void)
{
    struct kvstash *c = client();
    uint64_t cap = stat_of(c, "memory_capacity"), last = 0;
    int rc = harness_wait_stat(c, "memory_prefaulted", cap, 30000, &last);
    cr_assert_eq(rc, 0, "arena not populated within 30 s (%llu of %llu bytes)",
                 (unsigned long long)last, (unsigned long long)cap);
    kvstash_close(c);
}

/* Require the daemon's RSS to be within slack_kib of rss0 (not meaningful under sanitizers). */
static void
check_rss(long rss0, long slack_kib, const char *what)
{
    if (harness_sanitized(&h)) {
        cr_log_info("%s: RSS not checked: kvstashd is a sanitizer build", what);
        return;
    }
    long rss1 = harness_rss_kib(&h);
    cr_assert_gt(rss1, 0, "%s: cannot read the daemon's RSS", what);
    cr_assert_leq(rss1, rss0 + slack_kib, "%s: RSS grew from %ld KiB to %ld KiB", what, rss0,
                  rss1);
}

/*
 * Open a raw connection, send bytes (a send error after the server closed is
 * fine), and require the PROTOCOL_ERROR notification followed by a close.
 */
static void
expect_protocol_error(const char *what, const void *bytes, size_t len)
{
    struct harness_conn rc;
    cr_assert_eq(harness_conn_tcp(&rc, h.port, 2000), 0, "%s: connect", what);
    int s = harness_conn_send(&rc, bytes, len, HARNESS_IO_TIMEOUT_MS);
    cr_assert(s == 0 || s == -EPIPE || s == -ECONNRESET, "%s: send: %s", what, strerror(-s));
    const msgpack_object *m = NULL;
    int r = harness_conn_read(&rc, 3000, &m);
    cr_assert_eq(r, 1, "%s: no PROTOCOL_ERROR notification before the close (read %d)", what,
                 r);
    if (harness_notification_code(m) != 8) {
        harness_print_obj("got", m);
    }
    cr_assert_eq(harness_notification_code(m), 8, "%s: want [2, \"error\", [8, ...]]", what);
    cr_assert(harness_err_name_is(&m->via.array.ptr[2], "PROTOCOL_ERROR"),
              "%s: the notification's name is not PROTOCOL_ERROR", what);
    cr_assert_eq(harness_conn_expect_close(&rc, 3000), 0,
                 "%s: the connection stayed open after a framing violation", what);
    harness_conn_close(&rc);
}

Test(hostile, framing_violations_close_with_protocol_error)
{
    cr_assert_eq(harness_start(&h, NULL, NULL), 0);
    struct kvstash *obs = client();
    cr_assert_eq(kvstash_put(obs, "kept", 4, "value", 5), 0);
    wait_arena();
    long rss0 = harness_rss_kib(&h);
    cr_assert_gt(rss0, 0);
    uint64_t perr0 = stat_of(obs, "protocol_errors");

    static const uint8_t arr32[] = {0xdd, 0xff, 0xff, 0xff, 0xff};
    static const uint8_t map32[] = {0xdf, 0xff, 0xff, 0xff, 0xff};
    static const uint8_t bin32[] = {0xc6, 0xff, 0xff, 0xff, 0xff};
    static const uint8_t str32[] = {0xdb, 0xff, 0xff, 0xff, 0xff};
    static const uint8_t ext32[] = {0xc9, 0xff, 0xff, 0xff, 0xff, 0x01};
    static const uint8_t reserved[] = {0xc1};
    /* [0, 1, "put", ["k", bin32 of 4 GiB]]: the bomb inside a real request */
    static const uint8_t put_bomb[] = {0x94, 0x00, 0x01, 0xa3, 'p',  'u',  't', 0x92,
                                       0xa1, 'k',  0xc6, 0xff, 0xff, 0xff, 0xff};
    /* [0, 1, "batch_get", [array32 of 4G keys]] */
    static const uint8_t keys_bomb[] = {0x94, 0x00, 0x01, 0xa9, 'b',  'a',  't',  'c',
                                        'h',  '_',  'g',  'e',  't',  0x91, 0xdd, 0xff,
                                        0xff, 0xff, 0xff};
    enum { DEPTH = 10000 };
    uint8_t *deep = malloc(DEPTH + 1);
    cr_assert_not_null(deep);
    memset(deep, 0x91, DEPTH);
    deep[DEPTH] = 0xc0;

    const struct {
        const char *what;
        const uint8_t *p;
        size_t n;
    } vec[] = {
        {"dd ff ff ff ff (array32 of 4G)", arr32, sizeof(arr32)},
        {"df ff ff ff ff (map32 of 4G)", map32, sizeof(map32)},
        {"c6 ff ff ff ff (bin32 of 4 GiB)", bin32, sizeof(bin32)},
        {"db ff ff ff ff (str32 of 4 GiB)", str32, sizeof(str32)},
        {"c9 ff ff ff ff (ext32 of 4 GiB)", ext32, sizeof(ext32)},
        {"c1 (reserved byte)", reserved, sizeof(reserved)},
        {"put with a 4 GiB bin header", put_bomb, sizeof(put_bomb)},
        {"batch_get with 4G keys", keys_bomb, sizeof(keys_bomb)},
        {"10,000-deep nested arrays", deep, DEPTH + 1},
    };
    size_t nvec = sizeof(vec) / sizeof(vec[0]);
    /* every vector several times over: a leak or an allocation per attempt shows in RSS */
    for (int round = 0; round < 5; round++) {
        for (size_t i = 0; i < nvec; i++) {
            expect_protocol_error(vec[i].what, vec[i].p, vec[i].n);
            cr_assert(harness_alive(&h), "kvstashd died on %s", vec[i].what);
        }
        cr_assert_eq(kvstash_ping(obs), 0, "another client was disturbed (round %d)", round);
    }
    free(deep);

    check_rss(rss0, RSS_SLACK_KIB, "framing violations");
    uint64_t perr1 = stat_of(obs, "protocol_errors");
    cr_assert_geq(perr1 - perr0, 5 * nvec, "protocol_errors went %llu -> %llu, want +%zu",
                  (unsigned long long)perr0, (unsigned long long)perr1, 5 * nvec);

    uint8_t buf[16];
    size_t glen = 0;
    cr_assert_eq(kvstash_get(obs, "kept", 4, buf, sizeof(buf), &glen), 0);
    cr_assert(glen == 5 && memcmp(buf, "value", 5) == 0, "stored data damaged");
    kvstash_close(obs);
    cr_assert_eq(harness_stop_clean(&h), 0, "kvstashd did not shut down cleanly");
}

Test(hostile, message_over_max_message_size)
{
    cr_assert_eq(harness_start(&h, NULL,
                               HARNESS_ARGS("--max_message_size=1m", "--max_value_size=900k")),
                 0);
    struct kvstash *obs = client();
    wait_arena();
    long rss0 = harness_rss_kib(&h);

    /* declared up front: a put whose bin header alone says 2 MiB */
    struct harness_req r;
    harness_req_init(&r);
    harness_req_begin(&r, 1, "put", 2);
    harness_pack_str(&r.pk, "big");
    msgpack_pack_bin(&r.pk, 2u << 20);
    size_t head = r.sb.size;
    uint8_t *body = calloc(1, 64 * 1024);
    cr_assert_not_null(body);
    msgpack_sbuffer_write(&r.sb, (const char *)body, 64 * 1024);
    expect_protocol_error("put declaring a 2 MiB value (max_message_size 1m)", r.sb.data,
                          r.sb.size);
    cr_assert(head < r.sb.size);
    free(body);

    /* discovered on the way: 70,000 small keys, each fine, together ~1.3 MiB */
    harness_req_begin(&r, 2, "batch_get", 1);
    msgpack_pack_array(&r.pk, 70000);
    for (int i = 0; i < 70000; i++) {
        char key[24];
        snprintf(key, sizeof(key), "key-%012d-xx", i);
        harness_pack_str(&r.pk, key);
    }
    cr_assert_gt(r.sb.size, 1u << 20);
    expect_protocol_error("batch_get of 70,000 keys over 1 MiB (max_message_size 1m)",
                          r.sb.data, r.sb.size);
    cr_assert(harness_alive(&h));

    /* just under the limit is accepted */
    uint8_t *v = malloc(900 * 1024);
    cr_assert_not_null(v);
    harness_fill(v, 900 * 1024, 9);
    int rc = kvstash_put(obs, "under", 5, v, 900 * 1024);
    cr_assert_eq(rc, 0, "a 900 KiB put under a 1 MiB max_message_size: %s",
                 kvstash_strerror(rc));
    uint8_t *g = malloc(900 * 1024);
    cr_assert_not_null(g);
    size_t glen = 0;
    cr_assert_eq(kvstash_get(obs, "under", 5, g, 900 * 1024, &glen), 0);
    cr_assert(glen == 900 * 1024 && memcmp(g, v, glen) == 0);
    bool ex = true;
    cr_assert_eq(kvstash_is_exist(obs, "big", 3, &ex), 0);
    cr_assert(!ex, "the refused oversized put stored something");
    free(v);
    free(g);

    check_rss(rss0, RSS_SLACK_KIB + 2 * 1024, "oversized messages");
    harness_req_destroy(&r);
    kvstash_close(obs);
    cr_assert_eq(harness_stop_clean(&h), 0, "kvstashd did not shut down cleanly");
}

/* Send one request on c and require error code `code` (-1: no error), then a working ping. */
static void
expect_request_error(struct harness_conn *c, struct harness_req *r, uint32_t msgid, int code,
                     const char *name, const char *what)
{
    const msgpack_object *err, *res;
    int rc = harness_call(c, r, msgid, HARNESS_IO_TIMEOUT_MS, &err, &res);
    cr_assert_eq(rc, 0, "%s: no response (%s)", what, strerror(-rc));
    int got = harness_err_code(err);
    if (got != code) {
        harness_print_obj("error", err);
    }
    cr_assert_eq(got, code, "%s: error code %d, want %d %s", what, got, code, name);
    if (name) {
        cr_assert(harness_err_name_is(err, name), "%s: error name is not %s", what, name);
        cr_assert(res->type == MSGPACK_OBJECT_NIL, "%s: an error response with a result", what);
    }
    /* the connection is still usable */
    struct harness_req p;
    harness_req_init(&p);
    harness_req_begin(&p, msgid + 1000, "ping", 0);
    rc = harness_call(c, &p, msgid + 1000, HARNESS_IO_TIMEOUT_MS, &err, &res);
    cr_assert_eq(rc, 0, "%s: the connection is unusable afterwards (%s)", what, strerror(-rc));
    cr_assert(harness_err_code(err) == -1 && harness_obj_is_str(res, "pong"),
              "%s: ping afterwards did not answer pong", what);
    harness_req_destroy(&p);
}

Test(hostile, bad_requests_answer_errors_and_keep_the_connection)
{
    cr_assert_eq(harness_start(&h, NULL, NULL), 0);
    struct harness_conn c;
    cr_assert_eq(harness_conn_tcp(&c, h.port, 2000), 0);
    struct harness_req r;
    harness_req_init(&r);
    const char *INV = "INVALID_ARGUMENT";
    uint32_t id = 1;

    harness_req_begin(&r, id, "put", 1);
    harness_pack_str(&r.pk, "k");
    expect_request_error(&c, &r, id++, 6, INV, "put with one param");

    harness_req_begin(&r, id, "put", 4);
    harness_pack_str(&r.pk, "k");
    harness_pack_bin(&r.pk, "v", 1);
    msgpack_pack_nil(&r.pk);
    msgpack_pack_nil(&r.pk);
    expect_request_error(&c, &r, id++, 6, INV, "put with four params");

    harness_req_begin(&r, id, "put", 2);
    msgpack_pack_int(&r.pk, 123);
    harness_pack_bin(&r.pk, "v", 1);
    expect_request_error(&c, &r, id++, 6, INV, "put with an integer key");

    harness_req_begin(&r, id, "put", 2);
    harness_pack_str(&r.pk, "k");
    msgpack_pack_array(&r.pk, 1);
    msgpack_pack_int(&r.pk, 1);
    expect_request_error(&c, &r, id++, 6, INV, "put with an array value");

    harness_req_begin(&r, id, "get", 1);
    msgpack_pack_array(&r.pk, 1);
    harness_pack_str(&r.pk, "k");
    expect_request_error(&c, &r, id++, 6, INV, "get with an array key");

    harness_req_begin(&r, id, "get", 0);
    expect_request_error(&c, &r, id++, 6, INV, "get with no params");

    harness_req_begin(&r, id, "batch_get", 1);
    harness_pack_str(&r.pk, "not-an-array");
    expect_request_error(&c, &r, id++, 6, INV, "batch_get with a string for keys");

    harness_req_begin(&r, id, "batch_is_exist", 1);
    msgpack_pack_array(&r.pk, 2);
    harness_pack_str(&r.pk, "a");
    msgpack_pack_double(&r.pk, 1.5);
    expect_request_error(&c, &r, id++, 6, INV, "batch_is_exist with a float key");

    harness_req_begin(&r, id, "prefix_match", 2);
    msgpack_pack_array(&r.pk, 1);
    harness_pack_str(&r.pk, "a");
    msgpack_pack_map(&r.pk, 1);
    harness_pack_str(&r.pk, "group_size");
    harness_pack_str(&r.pk, "two");
    expect_request_error(&c, &r, id++, 6, INV, "prefix_match with a string group_size");

    harness_req_begin(&r, id, "pin", 2);
    msgpack_pack_array(&r.pk, 1);
    harness_pack_str(&r.pk, "a");
    harness_pack_str(&r.pk, "medium");
    expect_request_error(&c, &r, id++, 6, INV, "pin with mode \"medium\"");

    harness_req_begin(&r, id, "ping", 1);
    msgpack_pack_int(&r.pk, 1);
    expect_request_error(&c, &r, id++, 6, INV, "ping with a param");

    /* a rejected batch changes nothing: keys and values of different lengths */
    harness_req_begin(&r, id, "batch_put", 2);
    msgpack_pack_array(&r.pk, 2);
    harness_pack_str(&r.pk, "half-1");
    harness_pack_str(&r.pk, "half-2");
    msgpack_pack_array(&r.pk, 1);
    harness_pack_bin(&r.pk, "v", 1);
    expect_request_error(&c, &r, id++, 6, INV, "batch_put with 2 keys and 1 value");
    harness_req_begin(&r, id, "is_exist", 1);
    harness_pack_str(&r.pk, "half-1");
    const msgpack_object *err, *res;
    cr_assert_eq(harness_call(&c, &r, id++, HARNESS_IO_TIMEOUT_MS, &err, &res), 0);
    cr_assert(res->type == MSGPACK_OBJECT_BOOLEAN && !res->via.boolean,
              "a rejected batch_put stored a key");

    harness_req_begin(&r, id, "no_such_method", 0);
    expect_request_error(&c, &r, id++, 7, "METHOD_NOT_FOUND", "an unknown method");
    harness_req_begin(&r, id, "", 0);
    expect_request_error(&c, &r, id++, 7, "METHOD_NOT_FOUND", "an empty method name");

    /* a key over max_key_size is a per-key outcome, not a request error */
    char longkey[1025];
    memset(longkey, 'k', sizeof(longkey));
    harness_req_begin(&r, id, "put", 2);
    msgpack_pack_bin(&r.pk, sizeof(longkey));
    msgpack_pack_bin_body(&r.pk, longkey, sizeof(longkey));
    harness_pack_bin(&r.pk, "v", 1);
    cr_assert_eq(harness_call(&c, &r, id++, HARNESS_IO_TIMEOUT_MS, &err, &res), 0);
    cr_assert_eq(harness_err_code(err), -1, "a too-long key got a request-level error");
    cr_assert(res->type == MSGPACK_OBJECT_POSITIVE_INTEGER && res->via.u64 == 5,
              "put with a 1025-byte key: want result 5 (TOO_LARGE)");

    /* the connection survived all of it and still stores */
    harness_req_begin(&r, id, "put", 2);
    harness_pack_str(&r.pk, "after");
    harness_pack_bin(&r.pk, "ok", 2);
    cr_assert_eq(harness_call(&c, &r, id++, HARNESS_IO_TIMEOUT_MS, &err, &res), 0);
    cr_assert(harness_err_code(err) == -1 && res->type == MSGPACK_OBJECT_POSITIVE_INTEGER &&
                  res->via.u64 == 0,
              "put after the bad requests failed");
    harness_req_destroy(&r);
    harness_conn_close(&c);
    cr_assert_eq(harness_stop_clean(&h), 0, "kvstashd did not shut down cleanly");
}

Test(hostile, batch_over_max_batch_is_too_large)
{
    cr_assert_eq(harness_start(&h, NULL, HARNESS_ARGS("--max_batch=8")), 0);
    struct harness_conn c;
    cr_assert_eq(harness_conn_tcp(&c, h.port, 2000), 0);
    struct harness_req r;
    harness_req_init(&r);
    const msgpack_object *err, *res;

    harness_req_begin(&r, 1, "batch_get", 1);
    msgpack_pack_array(&r.pk, 8);
    for (int i = 0; i < 8; i++) {
        harness_pack_str(&r.pk, "k");
    }
    cr_assert_eq(harness_call(&c, &r, 1, HARNESS_IO_TIMEOUT_MS, &err, &res), 0);
    cr_assert_eq(harness_err_code(err), -1, "a batch of exactly max_batch was refused");
    cr_assert(res->type == MSGPACK_OBJECT_ARRAY && res->via.array.size == 8);

    const char *methods[] = {"batch_get", "batch_is_exist", "batch_get_size", "prefix_match",
                             "batch_remove"};
    uint32_t id = 2;
    for (size_t m = 0; m < sizeof(methods) / sizeof(methods[0]); m++) {
        harness_req_begin(&r, id, methods[m], 1);
        msgpack_pack_array(&r.pk, 9);
        for (int i = 0; i < 9; i++) {
            harness_pack_str(&r.pk, "k");
        }
        expect_request_error(&c, &r, id++, 5, "TOO_LARGE", methods[m]);
    }
    harness_req_begin(&r, id, "batch_put", 2);
    msgpack_pack_array(&r.pk, 9);
    for (int i = 0; i < 9; i++) {
        char key[16];
        snprintf(key, sizeof(key), "bp-%d", i);
        harness_pack_str(&r.pk, key);
    }
    msgpack_pack_array(&r.pk, 9);
    for (int i = 0; i < 9; i++) {
        harness_pack_bin(&r.pk, "v", 1);
    }
    expect_request_error(&c, &r, id++, 5, "TOO_LARGE", "batch_put of 9");
    harness_req_begin(&r, id, "is_exist", 1);
    harness_pack_str(&r.pk, "bp-0");
    cr_assert_eq(harness_call(&c, &r, id++, HARNESS_IO_TIMEOUT_MS, &err, &res), 0);
    cr_assert(res->type == MSGPACK_OBJECT_BOOLEAN && !res->via.boolean,
              "a batch_put refused as TOO_LARGE stored a key");
    harness_req_destroy(&r);
    harness_conn_close(&c);
    cr_assert_eq(harness_stop_clean(&h), 0, "kvstashd did not shut down cleanly");
}

Test(hostile, max_connections_rejects_with_unavailable)
{
    enum { MAX = 4 };
    cr_assert_eq(harness_start(&h, NULL, HARNESS_ARGS("--max_connections=4")), 0);
    struct kvstash *first = client();
    uint64_t last = 0;
    cr_assert_eq(harness_wait_stat(first, "connections", 1, 3000, &last), 0,
                 "connections stat is %llu with one client", (unsigned long long)last);

    struct harness_conn cs[MAX];
    struct harness_req p;
    harness_req_init(&p);
    const msgpack_object *err, *res;
    for (int i = 1; i < MAX; i++) {
        cr_assert_eq(harness_conn_tcp(&cs[i], h.port, 2000), 0);
        harness_req_begin(&p, 1, "ping", 0);
        int rc = harness_call(&cs[i], &p, 1, HARNESS_IO_TIMEOUT_MS, &err, &res);
        cr_assert_eq(rc, 0, "connection %d of max %d refused (%s)", i + 1, MAX, strerror(-rc));
    }
    uint64_t rejected0 = 0;
    cr_assert_eq(harness_stat(first, "connections_rejected", &rejected0), 0);

    /* one over: told why, then closed; over and over, without harm */
    for (int round = 0; round < 3; round++) {
        struct harness_conn extra;
        cr_assert_eq(harness_conn_tcp(&extra, h.port, 2000), 0);
        const msgpack_object *m;
        int rc = harness_conn_read(&extra, 3000, &m);
        cr_assert_eq(rc, 1, "connection %d: no UNAVAILABLE notification (read %d)", MAX + 1,
                     rc);
        if (harness_notification_code(m) != 14) {
            harness_print_obj("got", m);
        }
        cr_assert_eq(harness_notification_code(m), 14, "want [2, \"error\", [14, ...]]");
        cr_assert(harness_err_name_is(&m->via.array.ptr[2], "UNAVAILABLE"));
        cr_assert_eq(harness_conn_expect_close(&extra, 3000), 0,
                     "the rejected connection stayed open");
        harness_conn_close(&extra);
    }
    uint64_t rejected1 = 0;
    cr_assert_eq(harness_stat(first, "connections_rejected", &rejected1), 0);
    cr_assert_eq(rejected1 - rejected0, 3, "connections_rejected went %llu -> %llu",
                 (unsigned long long)rejected0, (unsigned long long)rejected1);

    /* the admitted ones are unaffected */
    cr_assert_eq(kvstash_ping(first), 0);
    harness_req_begin(&p, 2, "ping", 0);
    cr_assert_eq(harness_call(&cs[1], &p, 2, HARNESS_IO_TIMEOUT_MS, &err, &res), 0);

    /* a freed slot is usable again */
    harness_conn_close(&cs[MAX - 1]);
    cr_assert_eq(harness_wait_stat(first, "connections", MAX - 1, 3000, &last), 0,
                 "connections stayed %llu after a client left", (unsigned long long)last);
    struct kvstash *again = client();
    cr_assert_eq(kvstash_ping(again), 0, "no connection admitted after a slot was freed");
    kvstash_close(again);
    for (int i = 1; i < MAX - 1; i++) {
        harness_conn_close(&cs[i]);
    }
    harness_req_destroy(&p);
    kvstash_close(first);
    cr_assert_eq(harness_stop_clean(&h), 0, "kvstashd did not shut down cleanly");
}

Test(hostile, many_idle_and_garbage_connections)
{
    cr_assert_eq(harness_start(&h, NULL, NULL), 0);
    struct kvstash *obs = client();
    wait_arena();
    long rss0 = harness_rss_kib(&h);
    enum { N = 200 };
    static struct harness_conn cs[N];
    /* half send a partial request and stall, half send nothing */
    static const uint8_t partial[] = {0x94, 0x00, 0x01, 0xa3, 'p', 'u', 't', 0x92, 0xa1, 'k',
                                      0xc6, 0x00, 0x00, 0x10, 0x00};
    for (int i = 0; i < N; i++) {
        cr_assert_eq(harness_conn_tcp(&cs[i], h.port, 2000), 0, "connection %d", i);
        if (i % 2) {
            cr_assert_eq(harness_conn_send(&cs[i], partial, sizeof(partial), 1000), 0);
        }
    }
    uint64_t last = 0;
    cr_assert_eq(harness_wait_stat(obs, "connections", N + 1, 3000, &last), 0,
                 "connections is %llu with %d open", (unsigned long long)last, N + 1);
    cr_assert_eq(kvstash_put(obs, "busy-server", 11, "x", 1), 0, "a client was starved");
    for (int i = 0; i < N; i++) {
        harness_conn_close(&cs[i]);
    }
    cr_assert_eq(harness_wait_stat(obs, "connections", 1, 3000, &last), 0,
                 "connections is %llu after the others closed", (unsigned long long)last);
    cr_assert_eq(harness_wait_stat(obs, "reserved", 0, 3000, &last), 0,
                 "stalled puts left %llu reservations", (unsigned long long)last);
    check_rss(rss0, RSS_SLACK_KIB, "idle and stalled connections");
    kvstash_close(obs);
    cr_assert_eq(harness_stop_clean(&h), 0, "kvstashd did not shut down cleanly");
}

Test(hostile, requests_split_at_every_byte)
{
    cr_assert_eq(harness_start(&h, NULL, NULL), 0);
    struct harness_conn c;
    cr_assert_eq(harness_conn_tcp(&c, h.port, 2000), 0);
    struct harness_req r;
    harness_req_init(&r);
    static uint8_t val[200000];
    harness_fill(val, sizeof(val), 11);

    /* a batch_put, a big put and a batch_get, pipelined, one byte per send */
    harness_req_begin(&r, 1, "batch_put", 2);
    msgpack_pack_array(&r.pk, 3);
    harness_pack_str(&r.pk, "split-a");
    harness_pack_str(&r.pk, "split-b");
    harness_pack_str(&r.pk, "split-c");
    msgpack_pack_array(&r.pk, 3);
    harness_pack_bin(&r.pk, val, 10);
    harness_pack_bin(&r.pk, val, 0);
    harness_pack_bin(&r.pk, val, 300);
    size_t n1 = r.sb.size;
    msgpack_pack_array(&r.pk, 4);
    msgpack_pack_uint8(&r.pk, 0);
    msgpack_pack_uint32(&r.pk, 2);
    harness_pack_str(&r.pk, "put");
    msgpack_pack_array(&r.pk, 2);
    harness_pack_str(&r.pk, "split-big");
    harness_pack_bin(&r.pk, val, sizeof(val));
    size_t n2 = r.sb.size;
    msgpack_pack_array(&r.pk, 4);
    msgpack_pack_uint8(&r.pk, 0);
    msgpack_pack_uint32(&r.pk, 3);
    harness_pack_str(&r.pk, "batch_get_size");
    msgpack_pack_array(&r.pk, 1);
    msgpack_pack_array(&r.pk, 4);
    harness_pack_str(&r.pk, "split-a");
    harness_pack_str(&r.pk, "split-b");
    harness_pack_str(&r.pk, "split-c");
    harness_pack_str(&r.pk, "split-big");
    cr_assert(n1 < n2 && n2 < r.sb.size);

    /* byte by byte through the headers; the long bin body goes in odd-sized pieces */
    const uint8_t *p = (const uint8_t *)r.sb.data;
    size_t off = 0;
    while (off < r.sb.size) {
        size_t step = 1;
        if (off > n1 + 40 && off < n2 - 40) {
            step = 4093;
            if (off + step > n2 - 40) {
                step = n2 - 40 - off;
            }
        }
        cr_assert_eq(harness_conn_send(&c, p + off, step, HARNESS_IO_TIMEOUT_MS), 0,
                     "the server closed at byte %zu", off);
        off += step;
    }
    for (uint32_t id = 1; id <= 3; id++) {
        const msgpack_object *m;
        cr_assert_eq(harness_conn_read(&c, HARNESS_IO_TIMEOUT_MS, &m), 1, "no reply %u", id);
        if (m->type != MSGPACK_OBJECT_ARRAY || m->via.array.size != 4 ||
            m->via.array.ptr[1].via.u64 != id || harness_err_code(&m->via.array.ptr[2]) != -1) {
            harness_print_obj("got", m);
        }
        cr_assert(m->type == MSGPACK_OBJECT_ARRAY && m->via.array.size == 4 &&
                      m->via.array.ptr[1].via.u64 == id &&
                      harness_err_code(&m->via.array.ptr[2]) == -1,
                  "reply %u is wrong", id);
        const msgpack_object *res = &m->via.array.ptr[3];
        if (id == 1) {
            cr_assert(res->type == MSGPACK_OBJECT_ARRAY && res->via.array.size == 3 &&
                          res->via.array.ptr[0].via.u64 == 0 &&
                          res->via.array.ptr[1].via.u64 == 0 &&
                          res->via.array.ptr[2].via.u64 == 0,
                      "batch_put sent byte by byte did not store all three");
        } else if (id == 2) {
            cr_assert(res->type == MSGPACK_OBJECT_POSITIVE_INTEGER && res->via.u64 == 0,
                      "put sent in pieces was not stored");
        } else {
            const uint64_t want[4] = {10, 0, 300, sizeof(val)};
            cr_assert(res->type == MSGPACK_OBJECT_ARRAY && res->via.array.size == 4);
            for (int i = 0; i < 4; i++) {
                cr_assert(res->via.array.ptr[i].type == MSGPACK_OBJECT_POSITIVE_INTEGER &&
                              res->via.array.ptr[i].via.u64 == want[i],
                          "size of key %d is wrong", i);
            }
        }
    }
    /* and the big value is intact */
    harness_req_begin(&r, 4, "get", 1);
    harness_pack_str(&r.pk, "split-big");
    const msgpack_object *err, *res;
    cr_assert_eq(harness_call(&c, &r, 4, HARNESS_IO_TIMEOUT_MS, &err, &res), 0);
    cr_assert(res->type == MSGPACK_OBJECT_BIN && res->via.bin.size == sizeof(val) &&
                  memcmp(res->via.bin.ptr, val, sizeof(val)) == 0,
              "the value sent in pieces reads back wrong");
    harness_req_destroy(&r);
    harness_conn_close(&c);
    cr_assert_eq(harness_stop_clean(&h), 0, "kvstashd did not shut down cleanly");
}

/* xorshift64 for the garbage test: reproducible from the printed seed */
static uint64_t
rnd(uint64_t *s)
{
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}

Test(hostile, random_garbage_and_mutated_requests, .timeout = 90)
{
    cr_assert_eq(harness_start(&h, NULL, HARNESS_ARGS("--max_message_size=4m",
                                                      "--max_value_size=1m")),
                 0);
    struct kvstash *obs = client();
    cr_assert_eq(kvstash_put(obs, "kept", 4, "value", 5), 0);
    wait_arena();
    long rss0 = harness_rss_kib(&h);
    uint64_t used0 = stat_of(obs, "memory_used");
    uint64_t seed = 0x6b7673746173680full;
    fprintf(stderr, "random_garbage: seed 0x%llx\n", (unsigned long long)seed);

    /* valid requests of every method, to mutate */
    struct harness_req r;
    harness_req_init(&r);
    static uint8_t val[3000];
    harness_fill(val, sizeof(val), 3);
    static uint8_t templates[8][4096];
    size_t tlen[8];
    int nt = 0;
#define TEMPLATE()                                                                             \
    do {                                                                                       \
        memcpy(templates[nt], r.sb.data, r.sb.size);                                           \
        tlen[nt++] = r.sb.size;                                                                \
    } while (0)
    harness_req_begin(&r, 1, "put", 2);
    harness_pack_str(&r.pk, "mut-key");
    harness_pack_bin(&r.pk, val, sizeof(val));
    TEMPLATE();
    harness_req_begin(&r, 2, "batch_put", 3);
    msgpack_pack_array(&r.pk, 2);
    harness_pack_str(&r.pk, "mut-a");
    harness_pack_str(&r.pk, "mut-b");
    msgpack_pack_array(&r.pk, 2);
    harness_pack_bin(&r.pk, val, 100);
    harness_pack_bin(&r.pk, val, 200);
    msgpack_pack_map(&r.pk, 1);
    harness_pack_str(&r.pk, "force");
    msgpack_pack_true(&r.pk);
    TEMPLATE();
    harness_req_begin(&r, 3, "batch_get", 1);
    msgpack_pack_array(&r.pk, 3);
    harness_pack_str(&r.pk, "kept");
    harness_pack_str(&r.pk, "mut-a");
    harness_pack_str(&r.pk, "nope");
    TEMPLATE();
    harness_req_begin(&r, 4, "prefix_match", 2);
    msgpack_pack_array(&r.pk, 2);
    harness_pack_str(&r.pk, "kept");
    harness_pack_str(&r.pk, "mut-a");
    msgpack_pack_map(&r.pk, 1);
    harness_pack_str(&r.pk, "group_size");
    msgpack_pack_uint8(&r.pk, 2);
    TEMPLATE();
    harness_req_begin(&r, 5, "pin", 2);
    msgpack_pack_array(&r.pk, 1);
    harness_pack_str(&r.pk, "mut-a");
    harness_pack_str(&r.pk, "soft");
    TEMPLATE();
    harness_req_begin(&r, 6, "stats", 0);
    TEMPLATE();
    harness_req_begin(&r, 7, "hello", 1);
    msgpack_pack_map(&r.pk, 0);
    TEMPLATE();
    harness_req_begin(&r, 8, "remove", 2);
    harness_pack_str(&r.pk, "mut-b");
    msgpack_pack_map(&r.pk, 1);
    harness_pack_str(&r.pk, "force");
    msgpack_pack_false(&r.pk);
    TEMPLATE();
#undef TEMPLATE
    harness_req_destroy(&r);

    enum { ROUNDS = 4000 };
    uint64_t t0 = harness_now_ms();
    uint8_t buf[8192];
    for (int i = 0; i < ROUNDS && harness_now_ms() - t0 < 40000; i++) {
        size_t n;
        if (i % 3 == 0) {
            n = 1 + rnd(&seed) % 64; /* pure noise */
            for (size_t k = 0; k < n; k++) {
                buf[k] = (uint8_t)rnd(&seed);
            }
        } else {
            int t = (int)(rnd(&seed) % (uint64_t)nt);
            n = tlen[t];
            memcpy(buf, templates[t], n);
            int flips = 1 + (int)(rnd(&seed) % 4);
            for (int f = 0; f < flips; f++) {
                size_t at = rnd(&seed) % n;
                switch (rnd(&seed) % 4) {
                case 0: buf[at] = (uint8_t)rnd(&seed); break;
                case 1: buf[at] ^= (uint8_t)(1u << (rnd(&seed) % 8)); break;
                case 2: buf[at] = 0xff; break;
                default: n = at + 1; break; /* truncate */
                }
            }
            if (i % 7 == 0 && n * 2 <= sizeof(buf)) {
                memcpy(buf + n, buf, n); /* two of them back to back */
                n *= 2;
            }
        }
        struct harness_conn g;
        cr_assert_eq(harness_conn_tcp(&g, h.port, 2000), 0, "round %d: cannot connect", i);
        int s = harness_conn_send(&g, buf, n, 1000);
        cr_assert(s == 0 || s == -EPIPE || s == -ECONNRESET, "round %d: send %s", i,
                  strerror(-s));
        harness_conn_close(&g);
        if (i % 100 == 99) {
            cr_assert(harness_alive(&h), "kvstashd died by round %d (seed above)", i);
            cr_assert_eq(kvstash_ping(obs), 0, "the observer lost its connection by round %d",
                         i);
        }
    }
    cr_assert(harness_alive(&h), "kvstashd died on garbage");
    uint64_t last = 0;
    cr_assert_eq(harness_wait_stat(obs, "connections", 1, 5000, &last), 0,
                 "%llu connections still open after every garbage client left",
                 (unsigned long long)last);
    cr_assert_eq(harness_wait_stat(obs, "reserved", 0, 3000, &last), 0,
                 "%llu reservations left behind", (unsigned long long)last);
    uint8_t got[8];
    size_t glen = 0;
    cr_assert_eq(kvstash_get(obs, "kept", 4, got, sizeof(got), &glen), 0);
    cr_assert(glen == 5 && memcmp(got, "value", 5) == 0, "stored data damaged by garbage");
    /* Mutated puts legitimately store objects: allow for the arena pages they took, rounded
     * up to a 2 MiB transparent huge page per object at most. */
    uint64_t used1 = stat_of(obs, "memory_used");
    uint64_t objs = stat_of(obs, "objects");
    long stored_kib = (long)((used1 > used0 ? used1 - used0 : 0) / 1024);
    long thp_kib = (long)(objs < 8 ? objs : 8) * 2048;
    check_rss(rss0, RSS_SLACK_KIB + stored_kib + thp_kib, "garbage");
    kvstash_close(obs);
    cr_assert_eq(harness_stop_clean(&h), 0, "kvstashd did not shut down cleanly");
}

/*
 * Send [0, 1, method, params] where params holds one bin of blen bytes at the
 * place prefix/suffix put it, streaming the body; then require an answer (any
 * response to msgid 1, or a PROTOCOL_ERROR notification and a close) and
 * that the daemon's peak RSS did not grow by the body's size.
 */
static void
expect_big_bin_not_buffered(const char *what, const char *method, int shape, size_t blen)
{
    struct harness_conn c;
    cr_assert_eq(harness_conn_tcp(&c, h.port, 2000), 0);
    struct harness_req r;
    harness_req_init(&r);
    switch (shape) {
    case 0: /* get [bin] */
        harness_req_begin(&r, 1, method, 1);
        break;
    case 1: /* batch_get [[k, bin]] */
        harness_req_begin(&r, 1, method, 1);
        msgpack_pack_array(&r.pk, 2);
        harness_pack_str(&r.pk, "k");
        break;
    default: /* hello [{"x": bin}] */
        harness_req_begin(&r, 1, method, 1);
        msgpack_pack_map(&r.pk, 1);
        harness_pack_str(&r.pk, "x");
        break;
    }
    msgpack_pack_bin(&r.pk, blen);
    wait_arena();
    cr_assert_eq(harness_reset_peak_rss(&h), 0);
    long peak0 = harness_peak_rss_kib(&h);
    cr_assert_eq(harness_conn_send(&c, r.sb.data, r.sb.size, HARNESS_IO_TIMEOUT_MS), 0);
    static uint8_t zeros[1u << 20];
    bool closed = false;
    for (size_t off = 0; off < blen && !closed; off += sizeof(zeros)) {
        size_t n = blen - off < sizeof(zeros) ? blen - off : sizeof(zeros);
        int s = harness_conn_send(&c, zeros, n, HARNESS_IO_TIMEOUT_MS);
        cr_assert(s == 0 || s == -EPIPE || s == -ECONNRESET, "%s: send: %s", what,
                  strerror(-s));
        closed = s != 0;
    }
    const msgpack_object *m;
    int rc = harness_conn_read(&c, HARNESS_IO_TIMEOUT_MS, &m);
    cr_assert_eq(rc, 1, "%s: no answer (read %d)", what, rc);
    bool response = m->type == MSGPACK_OBJECT_ARRAY && m->via.array.size == 4 &&
                    m->via.array.ptr[0].via.u64 == 1 && m->via.array.ptr[1].via.u64 == 1;
    cr_assert(response || harness_notification_code(m) == 8,
              "%s: neither a response nor a PROTOCOL_ERROR", what);
    long peak1 = harness_peak_rss_kib(&h);
    cr_assert_leq(peak1, peak0 + 16 * 1024,
                  "%s: the daemon's peak RSS went from %ld KiB to %ld KiB: a %zu MiB bin that "
                  "can never be a valid key or option was buffered whole",
                  what, peak0, peak1, blen >> 20);
    harness_req_destroy(&r);
    harness_conn_close(&c);
}

Test(hostile, huge_bins_outside_put_values_are_not_buffered)
{
    cr_assert_eq(harness_start(&h, NULL, NULL), 0);
    if (harness_sanitized(&h)) {
        cr_skip_test("peak RSS means nothing under a sanitizer build");
    }
    struct kvstash *obs = client();
    expect_big_bin_not_buffered("get with a 64 MiB key", "get", 0, 64u << 20);
    expect_big_bin_not_buffered("batch_get with a 64 MiB key", "batch_get", 1, 64u << 20);
    expect_big_bin_not_buffered("hello with a 64 MiB option", "hello", 2, 64u << 20);
    cr_assert_eq(kvstash_ping(obs), 0);
    kvstash_close(obs);
    cr_assert_eq(harness_stop_clean(&h), 0, "kvstashd did not shut down cleanly");
}

Test(hostile, put_larger_than_memory_is_refused_without_buffering)
{
    cr_assert_eq(harness_start(&h, NULL, HARNESS_ARGS("--memory_size=16m")), 0);
    struct kvstash *c = client();
    size_t n = 100u << 20;
    uint8_t *v = malloc(n);
    cr_assert_not_null(v);
    memset(v, 'v', n);
    bool sanitized = harness_sanitized(&h);
    wait_arena();
    cr_assert_eq(harness_reset_peak_rss(&h), 0);
    long peak0 = harness_peak_rss_kib(&h);
    int rc = kvstash_put(c, "huge", 4, v, n);
    cr_assert_eq(rc, KVSTASH_ENOSPACE, "a 100 MiB put into a 16 MiB store: %s, want NO_SPACE",
                 kvstash_strerror(rc));
    long peak1 = harness_peak_rss_kib(&h);
    if (!sanitized) {
        cr_assert_leq(peak1, peak0 + 16 * 1024,
                      "peak RSS went from %ld KiB to %ld KiB for a refused 100 MiB put", peak0,
                      peak1);
    }
    /* the same connection goes on working, and a fitting value is stored */
    rc = kvstash_put(c, "fits", 4, v, 1u << 20);
    cr_assert_eq(rc, 0, "a 1 MiB put after the refused one: %s", kvstash_strerror(rc));
    bool ex = true;
    cr_assert_eq(kvstash_is_exist(c, "huge", 4, &ex), 0);
    cr_assert(!ex, "the refused value is visible");
    uint64_t no_space = 0;
    cr_assert_eq(harness_stat(c, "no_space", &no_space), 0);
    cr_assert_geq(no_space, 1);
    free(v);
    kvstash_close(c);
    cr_assert_eq(harness_stop_clean(&h), 0, "kvstashd did not shut down cleanly");
}
