/*
 * Unit tests for json (the bounded JSON reader of the etcd client) and b64 (base64), on
 * etcd's own answers and on hostile input: truncations, random mutations, deep nesting,
 * huge numbers, bad escapes. No network.
 */
#include <criterion/criterion.h>

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "b64.h"
#include "json.h"

/* A range answer from etcd 3.4's gateway, as it is on the wire. */
static const char etcd_range[] =
    "{\"header\":{\"cluster_id\":\"15118495548433857066\",\"member_id\":\"13668033151171901709\","
    "\"revision\":\"3\",\"raft_term\":\"2\"},\"kvs\":[{\"key\":\"bi8x\",\"create_revision\":\"3\","
    "\"mod_revision\":\"3\",\"version\":\"1\",\"value\":\"eA==\",\"lease\":"
    "\"4111120373748587274\"}],\"count\":\"1\"}";

Test(json, reads_an_etcd_answer)
{
    struct json_tok t[64];
    int n = json_parse(etcd_range, strlen(etcd_range), t, 64);
    uint64_t rev, lease;
    char key[16];

    cr_assert_gt(n, 0);
    cr_assert_eq(json_u64(etcd_range, t, json_get(etcd_range, t, json_get(etcd_range, t, 0,
                                                                         "header"), "revision"),
                          &rev), 0);
    cr_assert_eq(rev, 3);
    int kvs = json_get(etcd_range, t, 0, "kvs");
    cr_assert_eq(t[kvs].type, JSON_ARRAY);
    cr_assert_eq(t[kvs].count, 1);
    int kv = json_at(t, kvs, 0);
    cr_assert_eq(json_str(etcd_range, t, json_get(etcd_range, t, kv, "key"), key, sizeof(key)), 4);
    cr_assert_str_eq(key, "bi8x");
    cr_assert_eq(json_u64(etcd_range, t, json_get(etcd_range, t, kv, "lease"), &lease), 0);
    cr_assert_eq(lease, UINT64_C(4111120373748587274));
    cr_assert_eq(json_get(etcd_range, t, 0, "events"), -1, "an omitted field is absent");
    cr_assert_eq(json_at(t, kvs, 1), -1);
    cr_assert_eq(json_u64(etcd_range, t, -1, &rev), -ENOENT);
}

Test(json, strings_unescape_and_quote_back)
{
    const char doc[] = "{\"a\\u0062\":\"x\\n\\\"\\u00e9\\ud83d\\ude00/\\/\"}";
    struct json_tok t[8];
    char s[64], q[64];

    cr_assert_eq(json_parse(doc, strlen(doc), t, 8), 3);
    int v = json_get(doc, t, 0, "ab");
    cr_assert_eq(v, 2, "a key with an escape matches once unescaped");
    cr_assert_eq(json_str(doc, t, v, s, sizeof(s)), 11);
    cr_assert_str_eq(s, "x\n\"\xc3\xa9\xf0\x9f\x98\x80//");
    cr_assert_eq(json_str(doc, t, v, s, 11), -E2BIG);
    cr_assert_gt(json_quote("a\"b\\c\x01", q, sizeof(q)), 0);
    cr_assert_str_eq(q, "\"a\\\"b\\\\c\\u0001\"");
    cr_assert_eq(json_quote("abc", q, 5), -E2BIG);
    cr_assert_eq(json_quote("abc", q, 6), 5);
}

Test(json, numbers_as_etcd_writes_them)
{
    const char doc[] = "[\"18446744073709551615\",\"18446744073709551616\",12,-1,1.5,\"\",\"1x\","
                       "2.5e3,\"0.25\"]";
    struct json_tok t[16];
    uint64_t u;
    double d;

    cr_assert_gt(json_parse(doc, strlen(doc), t, 16), 0);
    cr_assert_eq(json_u64(doc, t, json_at(t, 0, 0), &u), 0);
    cr_assert_eq(u, UINT64_MAX);
    cr_assert_eq(json_u64(doc, t, json_at(t, 0, 1), &u), -ERANGE);
    cr_assert_eq(json_u64(doc, t, json_at(t, 0, 2), &u), 0);
    cr_assert_eq(u, 12);
    cr_assert_eq(json_u64(doc, t, json_at(t, 0, 3), &u), -EINVAL);
    cr_assert_eq(json_u64(doc, t, json_at(t, 0, 4), &u), -EINVAL);
    cr_assert_eq(json_u64(doc, t, json_at(t, 0, 5), &u), -EINVAL);
    cr_assert_eq(json_u64(doc, t, json_at(t, 0, 6), &u), -EINVAL);
    cr_assert_eq(json_double(doc, t, json_at(t, 0, 7), &d), 0);
    cr_assert_float_eq(d, 2500.0, 1e-9);
    cr_assert_eq(json_double(doc, t, json_at(t, 0, 8), &d), 0);
    cr_assert_float_eq(d, 0.25, 1e-12);
}

Test(json, refuses_what_is_not_json)
{
    static const char *const bad[] = {
        "", " ", "{", "}", "[1,]", "{\"a\":1,}", "{\"a\" 1}", "{a:1}", "01", "1.", ".5", "-",
        "1e", "tru", "nul", "\"abc", "\"\\x\"", "\"\\u12g4\"", "\"a\x01\"", "[1 2]", "{} {}",
        "[\"\\u", "{\"a\":}", "nan", "+1", "[", "\"\\\"",
    };

    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        struct json_tok t[16];

        cr_expect_eq(json_parse(bad[i], strlen(bad[i]), t, 16), -EINVAL, "'%s' was taken",
                     bad[i]);
    }
}

Test(json, bounds_depth_and_tokens)
{
    char deep[200];
    struct json_tok t[256];
    const char lone[] = "\"\\udc00\"", nul[] = "\"a\\u0000\"";
    char s[16];

    memset(deep, '[', 100);
    memset(deep + 100, ']', 100);
    cr_assert_eq(json_parse(deep, 200, t, 256), -E2BIG, "deeper than JSON_DEPTH_MAX");
    cr_assert_eq(json_parse(deep + 100 - JSON_DEPTH_MAX, 2 * JSON_DEPTH_MAX, t, 256),
                 JSON_DEPTH_MAX);
    cr_assert_eq(json_parse("[1,2,3,4]", 9, t, 4), -E2BIG, "more tokens than room");
    cr_assert_eq(json_parse(lone, strlen(lone), t, 4), 1);
    cr_assert_eq(json_str(lone, t, 0, s, sizeof(s)), -EINVAL, "a lone low surrogate");
    cr_assert_eq(json_parse(nul, strlen(nul), t, 4), 1);
    cr_assert_eq(json_str(nul, t, 0, s, sizeof(s)), -EINVAL, "a NUL inside a string");
}

/* Every prefix of a valid answer is refused, and every token stays inside the text. */
Test(json, truncations_and_mutations_stay_in_bounds)
{
    size_t len = strlen(etcd_range);
    char *buf = malloc(len);
    struct json_tok t[64];
    unsigned seed = 12345;

    cr_assert_not_null(buf);
    for (size_t cut = 0; cut < len; cut++) {
        cr_expect_lt(json_parse(etcd_range, cut, t, 64), 0, "prefix of %zu bytes taken", cut);
    }
    for (int round = 0; round < 200000; round++) {
        int n;

        memcpy(buf, etcd_range, len);
        for (int k = 0; k < 1 + round % 4; k++) {
            seed = seed * 1103515245u + 12345u;
            buf[(seed >> 8) % len] = (char)(seed >> 20);
        }
        n = json_parse(buf, len, t, 64);
        for (int i = 0; i < n; i++) {
            cr_assert(t[i].start <= t[i].end && t[i].end <= len && t[i].next <= (uint32_t)n,
                      "round %d token %d out of bounds", round, i);
            if (t[i].type == JSON_STRING) {
                char s[256];

                (void)json_str(buf, t, i, s, sizeof(s));
            }
        }
        if (n > 0) {
            (void)json_get(buf, t, 0, "kvs");
        }
    }
    free(buf);
}

Test(b64, round_trips_every_length)
{
    uint8_t in[64], out[64];
    char enc[100];

    for (int i = 0; i < 64; i++) {
        in[i] = (uint8_t)(i * 37 + 1);
    }
    for (size_t n = 0; n <= 64; n++) {
        size_t got;
        int e = b64_encode(in, n, enc, sizeof(enc));

        cr_assert_eq(e, (int)B64_LEN(n));
        cr_assert_eq(b64_decode(enc, (size_t)e, out, sizeof(out), &got), 0, "%s", enc);
        cr_assert_eq(got, n);
        cr_assert_eq(memcmp(in, out, n), 0);
    }
    cr_assert_eq(b64_encode("foo", 3, enc, sizeof(enc)), 4);
    cr_assert_str_eq(enc, "Zm9v");
    cr_assert_eq(b64_encode("f", 1, enc, 4), -E2BIG);
}

Test(b64, refuses_what_is_not_canonical)
{
    static const char *const bad[] = {"Zm9", "Zm9v=", "Z===", "Zg=a", "Zh==", "Zm8=Zm8=", "Zm9*",
                                      "Zm9v\n", "====", "Zm=v"};
    uint8_t out[16];
    size_t got;

    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        cr_expect_eq(b64_decode(bad[i], strlen(bad[i]), out, sizeof(out), &got), -EINVAL,
                     "'%s' was taken", bad[i]);
    }
    cr_assert_eq(b64_decode("Zm9vYmFy", 8, out, 5, &got), -E2BIG);
    cr_assert_eq(b64_decode("Zg==", 4, out, 1, &got), 0);
    cr_assert_eq(got, 1);
    cr_assert_eq(out[0], 'f');
}
