/*
 * frame: the bounded, incremental scanner that every incoming message passes
 * before anything is decoded or allocated for it.
 *
 * msgpack has no length prefix and msgpack-c allocates whatever a header
 * declares (dd ff ff ff ff asks for ~96 GB), so the daemon never hands
 * unchecked bytes to a decoder. frame_scan walks one msgpack object header by
 * header over the bytes buffered so far, resuming where it stopped, and checks:
 *   - the whole message (wire bytes) stays within max_message_size;
 *   - nesting depth stays within max_depth (at most FRAME_MAX_DEPTH);
 *   - every array/map count and str/bin/ext length fits in what can still
 *     follow: each pending element needs at least one byte, and the sum of
 *     all pending elements at every open level must fit in the budget left;
 *   - no reserved byte (0xc1).
 * It allocates nothing and never reads past len.
 *
 * Spilling: a str/bin/ext body of at least spill_min bytes that is not
 * fully buffered is reported as FRAME_SPILL with its path and type, so the caller can
 * receive it straight into its final place (the store) instead of the
 * connection buffer. The caller either takes it (frame_scan_spilled) or
 * declines it (frame_scan_decline: it is then buffered like any other).
 *
 * Pure code: no sockets, no globals, no locks.
 */
#ifndef FRAME_H
#define FRAME_H

#include <stddef.h>
#include <stdint.h>

#define FRAME_MAX_DEPTH 16

struct frame_limits {
    uint64_t max_message_size; /* wire bytes of one message */
    uint32_t max_depth;        /* 1..FRAME_MAX_DEPTH; a flat array has depth 1 */
    uint64_t spill_min;        /* offer bins this long for spilling; 0 = never */
};

enum frame_status {
    FRAME_ERROR = -1,     /* st->error says why; the connection must be closed */
    FRAME_NEED_MORE = 0,  /* message incomplete: call again with more bytes */
    FRAME_DONE = 1,       /* message complete: it is buf[0 .. st->pos) */
    FRAME_SPILL = 2       /* a big bin body starts at buf[st->pos]; see below */
};

struct frame_scan {
    /* outputs */
    size_t pos;                     /* buffer bytes of the message scanned so far */
    uint64_t wire_bytes;            /* message bytes on the wire so far (pos + spilled bodies) */
    const char *error;              /* FRAME_ERROR: static text naming the violation */
    /* FRAME_SPILL: the bin's body length, how much of it is already buffered
     * at buf[pos], and where it sits: path[0] is its index in the root
     * container, path[1] its index in the next level, ... path[depth-1]. */
    uint64_t spill_len;
    size_t spill_have;
    int spill_bin;                  /* 1: the body is a bin's; 0: a str's or ext's */
    int depth;
    uint32_t path[FRAME_MAX_DEPTH];
    /* private state */
    uint32_t remaining_[FRAME_MAX_DEPTH];
    uint32_t total_[FRAME_MAX_DEPTH];
    uint64_t pending_;              /* sum of remaining_ over open levels */
    uint64_t skip_;                 /* body bytes still to skip (str/bin/ext) */
    int declined_;
    int started_;
    int done_;
};

/* frame_scan_init: start scanning a new message. */
void frame_scan_init(struct frame_scan *st);

/*
 * frame_scan: continue scanning. buf holds the message from its first byte
 * (minus any spilled bodies) and len bytes are valid; bytes past the message
 * end are left alone. Returns a frame_status.
 *
 * On FRAME_SPILL the caller must either
 *   - take the body: use buf[pos .. pos+spill_have) and drop those bytes
 *     from its buffer (the buffer now ends at pos), receive the remaining
 *     spill_len - spill_have bytes elsewhere, then call
 *     frame_scan_spilled(st) and keep scanning with buf ending at pos plus
 *     whatever arrived after the body; or
 *   - decline it: frame_scan_decline(st), then keep scanning as usual.
 */
int frame_scan(struct frame_scan *st, const uint8_t *buf, size_t len,
               const struct frame_limits *lim);

/* frame_scan_spilled: the reported bin body was received elsewhere. */
void frame_scan_spilled(struct frame_scan *st);

/* frame_scan_decline: buffer the reported bin body like any other. */
void frame_scan_decline(struct frame_scan *st);

#endif
