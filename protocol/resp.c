/*
 * resp: the RESP2 scanner and argument reader declared in resp.h. It owns no
 * memory and no I/O: it reads the caller's buffer and keeps its whole state
 * in struct resp_scan, so a command can arrive in any number of pieces; a
 * line cut short is looked at again on the next call (at most RESP_LINE_MAX
 * bytes). It must never allocate, recurse, or trust a declared count or
 * length before checking it against the limits and the budget left.
 *
 * Budget: a command's wire bytes so far, plus the bytes the bulk being read
 * still announces, plus RESP_MIN_BULK for every bulk announced and not begun,
 * stay within max_message_size. So "*2147483647" or "$99999999999" is
 * refused at its own line, before the peer sends anything behind it.
 */
#include "resp.h"

#include <stdbool.h>
#include <stdio.h>
#include <string.h>

#include "mp.h"

#define RESP_MIN_BULK 6u            /* "$0\r\n\r\n": the least wire bytes of a bulk */

enum {
    RESP_S_START,                   /* the command's first byte */
    RESP_S_HDR,                     /* a bulk's "$<len>\r\n" at pos */
    RESP_S_BODY,                    /* a bulk's body (bulk_ bytes) and CRLF at pos */
    RESP_S_OFFER,                   /* a spill was offered: waiting for take or decline */
    RESP_S_SPILLED,                 /* a spill is being received: then its CRLF at pos */
    RESP_S_DONE,
    RESP_S_ERROR
};

void
resp_scan_init(struct resp_scan *st)
{
    memset(st, 0, sizeof(*st));
}

static int
resp_fail(struct resp_scan *st, const char *why)
{
    st->state_ = RESP_S_ERROR;
    st->error = why;
    return RESP_ERROR;
}

static int
resp_out(struct resp_scan *st, int rc)
{
    st->wire_bytes = st->pos + st->spilled_;
    return rc;
}

/*
 * resp_line: the line at buf[at..len): its end (the '\r' of its CRLF) in *end.
 * 1 found, 0 not yet, -1 when it cannot be a line (longer than RESP_LINE_MAX,
 * or a '\r' not followed by '\n').
 */
static int
resp_line(const uint8_t *buf, size_t at, size_t len, size_t *end)
{
    size_t n = len - at;
    const uint8_t *r = memchr(buf + at, '\r', n < RESP_LINE_MAX ? n : RESP_LINE_MAX);

    if (r == NULL) {
        return n >= RESP_LINE_MAX ? -1 : 0;
    }
    *end = (size_t)(r - buf);
    if (*end + 1 >= len) {
        return 0;
    }
    return buf[*end + 1] == '\n' ? 1 : -1;
}

/* resp_int: the decimal integer p[0..n) (an optional '-'); 0 or -1 (not one, or overflow). */
static int
resp_int(const uint8_t *p, size_t n, int64_t *out)
{
    bool neg = false;
    uint64_t v = 0;

    if (n > 0 && p[0] == '-') {
        neg = true;
        p++;
        n--;
    }
    if (n == 0 || n > 19) {
        return -1;
    }
    for (size_t i = 0; i < n; i++) {
        if (p[i] < '0' || p[i] > '9') {
            return -1;
        }
        v = v * 10 + (uint64_t)(p[i] - '0');
    }
    if (v > (uint64_t)INT64_MAX) {
        return -1;
    }
    *out = neg ? -(int64_t)v : (int64_t)v;
    return 0;
}

/* resp_left: what max_message_size leaves after the bytes so far and what is announced. */
static uint64_t
resp_left(const struct resp_scan *st, size_t pos, const struct resp_limits *lim)
{
    uint64_t used = pos + st->spilled_;
    uint64_t pending = (uint64_t)(st->argc - st->arg) * RESP_MIN_BULK;

    if (used + pending >= lim->max_message_size) {
        return 0;
    }
    return lim->max_message_size - used - pending;
}

/*
 * resp_inline_split: split (and unescape in place when argv is set) the
 * inline line p[0..n) into words as Redis's sdssplitargs does. *argc counts
 * them (at most max stored). 0, or -1 for unbalanced quotes.
 */
static int
resp_inline_split(uint8_t *p, size_t n, struct resp_arg *argv, uint32_t max, uint32_t *argc)
{
    static const char hex[] = "0123456789abcdef";
    size_t i = 0;
    uint32_t k = 0;

    for (;;) {
        while (i < n && (p[i] == ' ' || p[i] == '\t' || p[i] == '\n' || p[i] == '\r'
                         || p[i] == '\v' || p[i] == '\f')) {
            i++;
        }
        if (i >= n) {
            break;
        }
        size_t w0 = i, w = i;       /* the word is written from where it starts */
        int quote = 0;              /* '"' or '\'' while inside quotes */
        bool done = false;

        while (!done) {
            if (quote == '"') {
                if (i >= n) {
                    return -1;
                }
                if (p[i] == '\\' && i + 3 < n && p[i + 1] == 'x'
                    && strchr(hex, p[i + 2] | 0x20) != NULL && p[i + 2] != 0
                    && strchr(hex, p[i + 3] | 0x20) != NULL && p[i + 3] != 0) {
                    uint8_t b = (uint8_t)((strchr(hex, p[i + 2] | 0x20) - hex) << 4
                                          | (strchr(hex, p[i + 3] | 0x20) - hex));
                    if (argv != NULL) {
                        p[w] = b;
                    }
                    w++;
                    i += 4;
                } else if (p[i] == '\\' && i + 1 < n) {
                    uint8_t c = p[i + 1];
                    c = c == 'n' ? '\n' : c == 'r' ? '\r' : c == 't' ? '\t' : c == 'b' ? '\b'
                        : c == 'a' ? '\a' : c;
                    if (argv != NULL) {
                        p[w] = c;
                    }
                    w++;
                    i += 2;
                } else if (p[i] == '"') {
                    if (i + 1 < n && p[i + 1] != ' ' && p[i + 1] != '\t' && p[i + 1] != '\r'
                        && p[i + 1] != '\n') {
                        return -1;  /* a closing quote must end the word */
                    }
                    i++;
                    done = true;
                } else {
                    if (argv != NULL) {
                        p[w] = p[i];
                    }
                    w++;
                    i++;
                }
            } else if (quote == '\'') {
                if (i >= n) {
                    return -1;
                }
                if (p[i] == '\\' && i + 1 < n && p[i + 1] == '\'') {
                    if (argv != NULL) {
                        p[w] = '\'';
                    }
                    w++;
                    i += 2;
                } else if (p[i] == '\'') {
                    if (i + 1 < n && p[i + 1] != ' ' && p[i + 1] != '\t' && p[i + 1] != '\r'
                        && p[i + 1] != '\n') {
                        return -1;
                    }
                    i++;
                    done = true;
                } else {
                    if (argv != NULL) {
                        p[w] = p[i];
                    }
                    w++;
                    i++;
                }
            } else if (i >= n || p[i] == ' ' || p[i] == '\t' || p[i] == '\n' || p[i] == '\r'
                       || p[i] == '\v' || p[i] == '\f') {
                done = true;
            } else if (p[i] == '"' || p[i] == '\'') {
                quote = p[i];
                i++;
            } else {
                if (argv != NULL) {
                    p[w] = p[i];
                }
                w++;
                i++;
            }
        }
        if (argv != NULL && k < max) {
            argv[k].p = p + w0;
            argv[k].len = w - w0;
            argv[k].hole = NULL;
        }
        k++;
    }
    *argc = k;
    return 0;
}

/* resp_scan_inline: an inline command: one line, split to check its quotes. */
static int
resp_scan_inline(struct resp_scan *st, const uint8_t *buf, size_t len,
                 const struct resp_limits *lim)
{
    size_t n = len < RESP_LINE_MAX ? len : RESP_LINE_MAX;
    const uint8_t *nl = memchr(buf, '\n', n);
    uint32_t argc = 0;

    if (nl == NULL) {
        if (len >= RESP_LINE_MAX || len > lim->max_message_size) {
            return resp_fail(st, "too big inline request");
        }
        return resp_out(st, RESP_NEED_MORE);
    }
    st->pos = (size_t)(nl - buf) + 1;
    if (st->pos > lim->max_message_size) {
        return resp_fail(st, "too big inline request");
    }
    /* resp_inline_split only reads when argv is NULL */
    if (resp_inline_split((uint8_t *)(uintptr_t)buf, st->pos, NULL, 0, &argc) != 0) {
        return resp_fail(st, "unbalanced quotes in request");
    }
    if (argc > RESP_MAX_ARGS) {
        return resp_fail(st, "too many arguments in inline request");
    }
    st->is_inline = 1;
    st->argc = argc;
    st->state_ = RESP_S_DONE;
    return resp_out(st, RESP_DONE);
}

int
resp_scan(struct resp_scan *st, const uint8_t *buf, size_t len, const struct resp_limits *lim)
{
    size_t end;
    int64_t v;
    int rc;

    if (st->state_ == RESP_S_DONE) {
        return resp_out(st, RESP_DONE);
    }
    if (st->state_ == RESP_S_ERROR) {
        return RESP_ERROR;
    }
    if (st->state_ == RESP_S_START) {
        if (len == 0) {
            return resp_out(st, RESP_NEED_MORE);
        }
        if (buf[0] != '*') {
            return resp_scan_inline(st, buf, len, lim);
        }
        rc = resp_line(buf, 0, len, &end);
        if (rc < 0) {
            return resp_fail(st, "too big mbulk count string");
        }
        if (rc == 0) {
            return resp_out(st, RESP_NEED_MORE);
        }
        if (resp_int(buf + 1, end - 1, &v) != 0 || v > (int64_t)RESP_MAX_ARGS) {
            return resp_fail(st, "invalid multibulk length");
        }
        st->pos = end + 2;
        if (v <= 0) {
            st->argc = 0;           /* "*0" or "*-1": an empty command, ignored as in Redis */
            st->state_ = RESP_S_DONE;
            return resp_out(st, RESP_DONE);
        }
        if (st->pos + (uint64_t)v * RESP_MIN_BULK > lim->max_message_size) {
            return resp_fail(st, lim->unauthenticated ? "unauthenticated multibulk length"
                                                      : "invalid multibulk length");
        }
        st->argc = (uint32_t)v;
        st->arg = 0;
        st->state_ = RESP_S_HDR;
    }
    for (;;) {
        if (st->state_ == RESP_S_OFFER) {
            return resp_out(st, RESP_SPILL);    /* not answered: the same offer */
        }
        if (st->state_ == RESP_S_SPILLED) {
            if (len - st->pos < 2) {
                return resp_out(st, RESP_NEED_MORE);
            }
            if (buf[st->pos] != '\r' || buf[st->pos + 1] != '\n') {
                return resp_fail(st, "expected CRLF after a bulk");
            }
            st->pos += 2;
            st->arg++;
            st->state_ = RESP_S_HDR;
        }
        if (st->state_ == RESP_S_HDR) {
            if (st->arg == st->argc) {
                st->state_ = RESP_S_DONE;
                return resp_out(st, RESP_DONE);
            }
            if (st->pos >= len) {
                return resp_out(st, RESP_NEED_MORE);
            }
            if (buf[st->pos] != '$') {
                unsigned char c = buf[st->pos];
                snprintf(st->errbuf_, sizeof(st->errbuf_), "expected '$', got '%c'",
                         c >= 0x20 && c < 0x7f ? c : '?');
                return resp_fail(st, st->errbuf_);
            }
            rc = resp_line(buf, st->pos, len, &end);
            if (rc < 0) {
                return resp_fail(st, "too big bulk count string");
            }
            if (rc == 0) {
                return resp_out(st, RESP_NEED_MORE);
            }
            if (resp_int(buf + st->pos + 1, end - st->pos - 1, &v) != 0 || v < 0
                || (uint64_t)v > lim->max_bulk) {
                return resp_fail(st, "invalid bulk length");
            }
            /* this bulk leaves the announced ones: its own bytes count now */
            st->arg++;
            uint64_t left = resp_left(st, end + 2, lim);
            st->arg--;
            if ((uint64_t)v + 2 > left) {
                return resp_fail(st, lim->unauthenticated ? "unauthenticated bulk length"
                                                          : "command larger than max_message_size");
            }
            st->pos = end + 2;
            st->bulk_ = (uint64_t)v;
            st->declined_ = 0;
            st->state_ = RESP_S_BODY;
        }
        /*
         * RESP_S_BODY. Offered only while part of the body is still to come: one already
         * buffered whole (its CRLF not yet) is scanned as a small one, since a taker that
         * received no byte of it elsewhere would never learn that it is in (a read ending
         * right after a value, as redis-py sends big ones, left an MSET unanswered).
         */
        size_t have = len - st->pos;
        if (!st->declined_ && lim->spill_min > 0 && st->bulk_ >= lim->spill_min
            && have < st->bulk_) {
            st->spill_len = st->bulk_;
            st->spill_have = have;
            st->state_ = RESP_S_OFFER;
            return resp_out(st, RESP_SPILL);
        }
        if (have < st->bulk_ + 2) {
            return resp_out(st, RESP_NEED_MORE);
        }
        if (buf[st->pos + st->bulk_] != '\r' || buf[st->pos + st->bulk_ + 1] != '\n') {
            return resp_fail(st, "expected CRLF after a bulk");
        }
        st->pos += (size_t)st->bulk_ + 2;
        st->arg++;
        st->state_ = RESP_S_HDR;
    }
}

void
resp_scan_spilled(struct resp_scan *st)
{
    if (st->state_ == RESP_S_OFFER) {
        st->spilled_ += st->spill_len;
        st->state_ = RESP_S_SPILLED;
    }
}

void
resp_scan_decline(struct resp_scan *st)
{
    if (st->state_ == RESP_S_OFFER) {
        st->declined_ = 1;
        st->state_ = RESP_S_BODY;
    }
}

/*
 * resp_walk: the next bulk of a multibulk command at *pos (0: the count line
 * first) into *a, its hole taken from holes[*h..] when its body was spilled.
 * 0, or -1 when the bytes are not that.
 */
static int
resp_walk(const uint8_t *msg, size_t len, const struct mp_hole *holes, size_t nholes, size_t *pos,
          size_t *h, struct resp_arg *a)
{
    size_t p = *pos, end;
    int64_t v;

    if (p == 0) {
        if (len == 0 || msg[0] != '*' || resp_line(msg, 0, len, &end) != 1) {
            return -1;
        }
        p = end + 2;
    }
    if (p >= len || msg[p] != '$' || resp_line(msg, p, len, &end) != 1
        || resp_int(msg + p + 1, end - p - 1, &v) != 0 || v < 0) {
        return -1;
    }
    p = end + 2;
    a->len = (uint64_t)v;
    if (*h < nholes && holes[*h].off == p) {
        if (holes[*h].len != (uint64_t)v) {
            return -1;
        }
        a->p = NULL;
        a->hole = &holes[(*h)++];
    } else {
        if ((uint64_t)v > len - p) {
            return -1;
        }
        a->p = msg + p;
        a->hole = NULL;
        p += (size_t)v;
    }
    if (len - p < 2 || msg[p] != '\r' || msg[p + 1] != '\n') {
        return -1;
    }
    *pos = p + 2;
    return 0;
}

int
resp_args(uint8_t *msg, size_t len, int is_inline, const struct mp_hole *holes, size_t nholes,
          struct resp_arg *argv, uint32_t argc)
{
    size_t pos = 0, h = 0;
    uint32_t n;

    if (is_inline) {
        if (resp_inline_split(msg, len, argv, argc, &n) != 0 || n != argc) {
            return -1;
        }
        return 0;
    }
    for (uint32_t i = 0; i < argc; i++) {
        if (resp_walk(msg, len, holes, nholes, &pos, &h, &argv[i]) != 0) {
            return -1;
        }
    }
    return 0;
}

int
resp_arg_nth(const uint8_t *msg, size_t len, const struct mp_hole *holes, size_t nholes,
             uint32_t i, struct resp_arg *out)
{
    size_t pos = 0, h = 0;

    for (uint32_t k = 0; k <= i; k++) {
        if (resp_walk(msg, len, holes, nholes, &pos, &h, out) != 0) {
            return -1;
        }
    }
    return 0;
}
