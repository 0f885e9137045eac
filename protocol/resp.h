/*
 * resp: the Redis serialization protocol, version 2 (RESP2), as a bounded
 * incremental scanner of commands and a reader of their arguments. Bytes in,
 * commands out: no sockets, no store, no allocation.
 *
 * A command is a multibulk ("*<n>\r\n" then n bulks "$<len>\r\n<bytes>\r\n")
 * or an inline command (a line of words, as a person types into nc; quotes
 * and escapes as Redis's sdssplitargs takes them). resp_scan walks the bytes
 * buffered so far, resuming where it stopped, and checks before anything is
 * allocated for them:
 *   - a count line or an inline command ends with CRLF within RESP_LINE_MAX;
 *   - the multibulk count is at most RESP_MAX_ARGS, and the smallest bulks it
 *     announces fit in what is left of max_message_size;
 *   - every bulk length is 0..max_bulk and, with the bulks still announced,
 *     fits in what is left of max_message_size;
 *   - a bulk's body is followed by CRLF.
 * A violation is RESP_ERROR with the reason in error (Redis's words after
 * "Protocol error: "); the caller answers it and closes.
 *
 * Spilling (as frame.h): a bulk body of at least spill_min bytes that is not
 * fully buffered is reported as RESP_SPILL with its argument index, so the
 * caller can receive it straight into its final place (the store). The
 * caller takes it (resp_scan_spilled once the body is in) or declines it
 * (resp_scan_decline: it is then buffered like any other). A spilled body
 * is a hole of the command: struct mp_hole at the buffer offset where the
 * body would have started.
 *
 * Pure code: no sockets, no globals, no locks.
 */
#ifndef RESP_H
#define RESP_H

#include <stddef.h>
#include <stdint.h>

struct mp_hole;

#define RESP_MAX_ARGS (1024u * 1024u)   /* a larger multibulk count is refused (as Redis) */
#define RESP_LINE_MAX (64u * 1024u)     /* a count line or inline command without CRLF */

struct resp_limits {
    uint64_t max_message_size; /* wire bytes of one command */
    uint64_t max_bulk;         /* a bulk's largest declared length */
    uint64_t spill_min;        /* offer bulks this long for spilling; 0 = never */
    int unauthenticated;       /* nonzero: max_message_size is the pre-AUTH limit, and
                                  going past it is worded as Redis words it then */
};

enum resp_status {
    RESP_ERROR = -1,      /* error says why; the connection must be closed */
    RESP_NEED_MORE = 0,   /* command incomplete: call again with more bytes */
    RESP_DONE = 1,        /* command complete: it is buf[0 .. pos) */
    RESP_SPILL = 2        /* a big bulk body starts at buf[pos] */
};

struct resp_scan {
    /* outputs */
    size_t pos;                 /* buffer bytes of the command scanned so far */
    uint64_t wire_bytes;        /* command bytes on the wire so far (pos + spilled bodies) */
    const char *error;          /* RESP_ERROR: text naming the violation (points into the
                                   struct or static) */
    int is_inline;              /* RESP_DONE: 1 for an inline command */
    uint32_t argc;              /* RESP_DONE: its arguments (0: an empty command, ignored) */
    uint32_t arg;               /* RESP_SPILL: the index of the bulk being offered */
    uint64_t spill_len;         /* RESP_SPILL: its body length, */
    size_t spill_have;          /* and how much of it is buffered at buf[pos] (always less:
                                   a body buffered whole is not offered) */
    /* private state */
    int state_;
    int declined_;
    uint64_t bulk_;             /* length of the bulk being scanned */
    uint64_t spilled_;          /* body bytes received elsewhere */
    char errbuf_[48];
};

/* resp_scan_init: start scanning a new command. */
void resp_scan_init(struct resp_scan *st);

/*
 * resp_scan: continue scanning. buf holds the command from its first byte
 * (minus spilled bodies), len bytes valid; bytes past its end are left
 * alone. Returns a resp_status. On RESP_SPILL the caller either takes the
 * body (uses buf[pos .. pos + spill_have), drops them from its buffer,
 * receives the remaining spill_len - spill_have bytes elsewhere, then calls
 * resp_scan_spilled and scans on with buf ending at pos plus what came after
 * the body) or declines it (resp_scan_decline, then scans on).
 */
int resp_scan(struct resp_scan *st, const uint8_t *buf, size_t len, const struct resp_limits *lim);

/* resp_scan_spilled: the offered body was received elsewhere. */
void resp_scan_spilled(struct resp_scan *st);

/* resp_scan_decline: buffer the offered body like any other. */
void resp_scan_decline(struct resp_scan *st);

/* One argument of a complete command. */
struct resp_arg {
    const uint8_t *p;           /* its bytes (NULL when hole is set) */
    uint64_t len;
    const struct mp_hole *hole; /* a spilled body: the hole (borrowed), else NULL */
};

/*
 * resp_args: the arguments of the complete command msg[0..len) that
 * resp_scan accepted (RESP_DONE with argc arguments), with its spilled
 * bodies holes[0..nholes) (sorted by offset; borrowed), into argv[0..argc).
 * An inline command's quoted words are unescaped in place (msg is written).
 * argv[i].p points into msg. Returns 0, or -1 when msg is not such a
 * command (a caller's error: nothing is trusted from it).
 */
int resp_args(uint8_t *msg, size_t len, int is_inline, const struct mp_hole *holes,
              size_t nholes, struct resp_arg *argv, uint32_t argc);

/*
 * resp_arg_nth: argument i of a multibulk command of which msg[0..len)
 * holds at least the first i + 1 bulks (a prefix, as while a later bulk is
 * still arriving), holes as for resp_args. Returns 0 and *out, or -1 when
 * it is not there.
 */
int resp_arg_nth(const uint8_t *msg, size_t len, const struct mp_hole *holes, size_t nholes,
                 uint32_t i, struct resp_arg *out);

#endif
