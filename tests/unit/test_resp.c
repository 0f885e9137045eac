/*
 * test_resp: the RESP2 scanner and argument reader (protocol/resp.c) on
 * byte buffers: multibulk and inline commands, delivery one byte at a time,
 * the hostile counts and lengths it must refuse before anything is
 * allocated, the limits, and the spill protocol as the connection drives it
 * (offer, take, the body received elsewhere, the CRLF after it). No network.
 */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mp.h"
#include "resp.h"

static const struct resp_limits lim_std = {.max_message_size = 1u << 30,
                                           .max_bulk = 256u << 20};

/* scan: the status of scanning all of buf at once from a fresh scan. */
static int
scan(struct resp_scan *st, const char *buf, size_t len, const struct resp_limits *lim)
{
    resp_scan_init(st);
    return resp_scan(st, (const uint8_t *)buf, len, lim);
}

Test(resp, multibulk_whole_and_byte_by_byte)
{
    static const char msg[] = "*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$5\r\nhello\r\n*1\r\n$4\r\nPING\r\n";
    size_t first = strlen("*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$5\r\nhello\r\n");
    struct resp_scan st;
    struct resp_arg argv[3];
    uint8_t copy[sizeof(msg)];

    cr_assert_eq(scan(&st, msg, sizeof(msg) - 1, &lim_std), RESP_DONE);
    cr_assert_eq(st.pos, first);
    cr_assert_eq(st.argc, 3);
    cr_assert_eq(st.is_inline, 0);
    memcpy(copy, msg, sizeof(msg));
    cr_assert_eq(resp_args(copy, st.pos, 0, NULL, 0, argv, 3), 0);
    cr_assert(argv[0].len == 3 && memcmp(argv[0].p, "SET", 3) == 0);
    cr_assert(argv[2].len == 5 && memcmp(argv[2].p, "hello", 5) == 0);

    /* the same bytes arriving one at a time: NEED_MORE until the last */
    resp_scan_init(&st);
    for (size_t n = 0; n < first; n++) {
        cr_assert_eq(resp_scan(&st, (const uint8_t *)msg, n, &lim_std), RESP_NEED_MORE, "at %zu",
                     n);
    }
    cr_assert_eq(resp_scan(&st, (const uint8_t *)msg, first, &lim_std), RESP_DONE);
    cr_assert_eq(st.pos, first);
}

Test(resp, inline_words_and_quotes)
{
    char line[] = "set \"a b\" 'it\\'s' \"\\x41\\n\"  x\r\n";
    struct resp_scan st;
    struct resp_arg argv[5];

    cr_assert_eq(scan(&st, line, strlen(line), &lim_std), RESP_DONE);
    cr_assert_eq(st.is_inline, 1);
    cr_assert_eq(st.argc, 5);
    cr_assert_eq(resp_args((uint8_t *)line, st.pos, 1, NULL, 0, argv, 5), 0);
    cr_assert(argv[1].len == 3 && memcmp(argv[1].p, "a b", 3) == 0);
    cr_assert(argv[2].len == 4 && memcmp(argv[2].p, "it's", 4) == 0);
    cr_assert(argv[3].len == 2 && memcmp(argv[3].p, "A\n", 2) == 0);
    cr_assert(argv[4].len == 1 && argv[4].p[0] == 'x');

    cr_assert_eq(scan(&st, "\r\n", 2, &lim_std), RESP_DONE);
    cr_assert_eq(st.argc, 0);                       /* an empty line: nothing to answer */
    cr_assert_eq(scan(&st, "get \"abc\r\n", 10, &lim_std), RESP_ERROR);
    cr_assert_str_eq(st.error, "unbalanced quotes in request");
    cr_assert_eq(scan(&st, "get \"a\"b\r\n", 10, &lim_std), RESP_ERROR);
}

Test(resp, hostile_counts_and_lengths)
{
    static const struct {
        const char *in;
        const char *why;
    } cases[] = {
        {"*2147483647\r\n", "invalid multibulk length"},
        {"*1048577\r\n", "invalid multibulk length"},
        {"*x\r\n", "invalid multibulk length"},
        {"*1\r\n$-2\r\n", "invalid bulk length"},
        {"*1\r\n$99999999999\r\n", "invalid bulk length"},
        {"*1\r\n$268435457\r\n", "invalid bulk length"},        /* over max_bulk */
        {"*1\r\n$99999999999999999999999\r\n", "invalid bulk length"},
        {"*1\r\nfoo\r\n", "expected '$', got 'f'"},
        {"*1\r\n$3\r\nabcde", "expected CRLF after a bulk"},
        {"*1\r\n$1\r\nx\rz", "expected CRLF after a bulk"},
        {"*1\rx", "too big mbulk count string"},
    };
    struct resp_scan st;

    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        cr_assert_eq(scan(&st, cases[i].in, strlen(cases[i].in), &lim_std), RESP_ERROR, "%s",
                     cases[i].in);
        cr_assert_str_eq(st.error, cases[i].why, "%s", cases[i].in);
        /* sticky */
        cr_assert_eq(resp_scan(&st, (const uint8_t *)cases[i].in, strlen(cases[i].in), &lim_std),
                     RESP_ERROR);
    }
}

Test(resp, long_lines_refused_at_the_limit)
{
    size_t n = RESP_LINE_MAX + 1;
    char *buf = malloc(n + 16);
    struct resp_scan st;

    memset(buf, 'x', n);
    cr_assert_eq(scan(&st, buf, RESP_LINE_MAX - 1, &lim_std), RESP_NEED_MORE);
    cr_assert_eq(scan(&st, buf, n, &lim_std), RESP_ERROR);
    cr_assert_str_eq(st.error, "too big inline request");
    buf[0] = '*';
    memset(buf + 1, '1', n - 1);
    cr_assert_eq(scan(&st, buf, n, &lim_std), RESP_ERROR);
    cr_assert_str_eq(st.error, "too big mbulk count string");
    memcpy(buf, "*1\r\n$", 5);
    memset(buf + 5, '1', n + 3);
    cr_assert_eq(scan(&st, buf, n + 8, &lim_std), RESP_ERROR);
    cr_assert_str_eq(st.error, "too big bulk count string");
    free(buf);
}

Test(resp, message_size_budget)
{
    struct resp_limits lim = {.max_message_size = 4096, .max_bulk = 1u << 20};
    struct resp_scan st;

    /* 1000 bulks of at least 6 bytes cannot fit 4 KiB: refused at the count */
    cr_assert_eq(scan(&st, "*1000\r\n", 7, &lim), RESP_ERROR);
    cr_assert_str_eq(st.error, "invalid multibulk length");
    /* a bulk that fits max_bulk but not the message: refused at its header */
    cr_assert_eq(scan(&st, "*2\r\n$3\r\nSET\r\n$5000\r\n", 21, &lim), RESP_ERROR);
    cr_assert_str_eq(st.error, "command larger than max_message_size");
    cr_assert_eq(scan(&st, "*2\r\n$3\r\nSET\r\n$4000\r\n", 21, &lim), RESP_NEED_MORE);
}

Test(resp, spill_take_and_decline)
{
    struct resp_limits lim = {.max_message_size = 1u << 30, .max_bulk = 1u << 20,
                              .spill_min = 16};
    const char *head = "*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$32\r\n0123456789";
    size_t hl = strlen(head);
    struct resp_scan st;
    struct mp_hole hole;
    struct resp_arg argv[3], a;
    char buf[128];

    /* offered with 10 body bytes buffered; taken: the buffer ends at pos */
    cr_assert_eq(scan(&st, head, hl, &lim), RESP_SPILL);
    cr_assert_eq(st.arg, 2);
    cr_assert_eq(st.spill_len, 32);
    cr_assert_eq(st.spill_have, 10);
    size_t at = st.pos;
    cr_assert_eq(resp_arg_nth((const uint8_t *)head, at, NULL, 0, 1, &a), 0);
    cr_assert(a.len == 1 && a.p[0] == 'k');
    resp_scan_spilled(&st);
    memcpy(buf, head, at);
    cr_assert_eq(resp_scan(&st, (uint8_t *)buf, at, &lim), RESP_NEED_MORE);
    memcpy(buf + at, "\r\n*1\r\n", 6);
    cr_assert_eq(resp_scan(&st, (uint8_t *)buf, at + 6, &lim), RESP_DONE);
    cr_assert_eq(st.pos, at + 2);
    cr_assert_eq(st.wire_bytes, at + 2 + 32);
    hole.off = at;
    hole.len = 32;
    hole.tag = NULL;
    cr_assert_eq(resp_args((uint8_t *)buf, st.pos, 0, &hole, 1, argv, 3), 0);
    cr_assert_eq(argv[2].hole, &hole);
    cr_assert_eq(argv[2].len, 32);

    /* declined: buffered like any other bulk */
    cr_assert_eq(scan(&st, head, hl, &lim), RESP_SPILL);
    resp_scan_decline(&st);
    snprintf(buf, sizeof(buf), "%s0123456789012345678901\r\n", head);
    cr_assert_eq(resp_scan(&st, (uint8_t *)buf, strlen(buf), &lim), RESP_DONE);
    cr_assert_eq(st.pos, strlen(buf));
}

Test(resp, spill_not_offered_for_a_body_buffered_whole)
{
    struct resp_limits lim = {.max_message_size = 1u << 30, .max_bulk = 1u << 20,
                              .spill_min = 16};
    /* an MSET whose second value has 20 bytes: a read ended after the value, and after
       its CR, before the CRLF came (a taker of such an offer has no byte left to receive
       elsewhere, so it never learnt that the body was in: no reply) */
    const char *head = "*5\r\n$4\r\nMSET\r\n$3\r\nbad\r\n$1\r\nv\r\n$1\r\nk\r\n$20\r\n"
                       "01234567890123456789";
    size_t hl = strlen(head);
    struct resp_scan st;
    char buf[128];

    for (size_t extra = 0; extra < 2; extra++) {
        snprintf(buf, sizeof(buf), "%s\r\n", head);
        cr_assert_eq(scan(&st, buf, hl + extra, &lim), RESP_NEED_MORE, "cut %zu", extra);
        cr_assert_eq(resp_scan(&st, (uint8_t *)buf, hl + 2, &lim), RESP_DONE);
        cr_assert_eq(st.pos, hl + 2);
        cr_assert_eq(st.argc, 5);
    }
    /* one byte short of whole: offered, with the 19 bytes there */
    cr_assert_eq(scan(&st, head, hl - 1, &lim), RESP_SPILL);
    cr_assert_eq(st.arg, 4);
    cr_assert_eq(st.spill_len, 20);
    cr_assert_eq(st.spill_have, 19);
}
