/*
 * frame: the bounded incremental scanner declared in frame.h. It owns no
 * memory and no I/O: it reads the caller's buffer, walks msgpack headers and
 * keeps its whole state in struct frame_scan, so a message can arrive in any
 * number of pieces and each byte is looked at once (a header cut short is
 * re-read on the next call, at most 18 bytes). It must never allocate, recurse
 * or trust a declared length before checking it against the budget.
 *
 * Budget. The scan keeps one quantity, the slack:
 *
 *     slack = max_message_size - wire bytes consumed
 *                              - pending_  (elements announced but not started, >= 1 byte each)
 *                              - skip_     (body bytes announced but not yet seen)
 *
 * and accepts a header only when what it adds (its bytes beyond the first,
 * plus its element count or body length) fits in the slack. So a hostile
 * count is refused at its own header, before the peer has sent anything
 * behind it, and the counts of all open levels share one budget: nested
 * headers that each fit alone but not together are refused too. pending_
 * counts the root element until it starts, so it is 1 after init.
 *
 * Private fields: remaining_[d] and total_[d] are the elements left and
 * announced at open level d (a map announces 2 * count: keys and values are
 * elements), so the element being scanned at level d has index
 * total_[d] - remaining_[d] - 1. declined_ matters only while skip_ > 0: it is
 * 0 while a spill offer awaits the caller's answer and 1 while a body is being
 * skipped in the buffer. done_ makes FRAME_DONE sticky, error FRAME_ERROR.
 */
#include "frame.h"

enum frame_kind {
    FRAME_K_FIXED,  /* scalar of a fixed total size */
    FRAME_K_STR,
    FRAME_K_BIN,
    FRAME_K_EXT,
    FRAME_K_ARRAY,
    FRAME_K_MAP,
    FRAME_K_RESERVED
};

/*
 * Headers 0xc0..0xdf. size is the total size of a FRAME_K_FIXED scalar, else
 * the header size; the length or count field starts at byte 1 and is
 * size - 1 bytes wide (size - 2 for ext, whose type byte follows it).
 */
struct frame_op {
    uint8_t kind;
    uint8_t size;
};

static const struct frame_op frame_ops[32] = {
    {FRAME_K_FIXED, 1},    /* c0 nil */
    {FRAME_K_RESERVED, 1}, /* c1 never used */
    {FRAME_K_FIXED, 1},    /* c2 false */
    {FRAME_K_FIXED, 1},    /* c3 true */
    {FRAME_K_BIN, 2},      /* c4 bin8 */
    {FRAME_K_BIN, 3},      /* c5 bin16 */
    {FRAME_K_BIN, 5},      /* c6 bin32 */
    {FRAME_K_EXT, 3},      /* c7 ext8 */
    {FRAME_K_EXT, 4},      /* c8 ext16 */
    {FRAME_K_EXT, 6},      /* c9 ext32 */
    {FRAME_K_FIXED, 5},    /* ca float32 */
    {FRAME_K_FIXED, 9},    /* cb float64 */
    {FRAME_K_FIXED, 2},    /* cc uint8 */
    {FRAME_K_FIXED, 3},    /* cd uint16 */
    {FRAME_K_FIXED, 5},    /* ce uint32 */
    {FRAME_K_FIXED, 9},    /* cf uint64 */
    {FRAME_K_FIXED, 2},    /* d0 int8 */
    {FRAME_K_FIXED, 3},    /* d1 int16 */
    {FRAME_K_FIXED, 5},    /* d2 int32 */
    {FRAME_K_FIXED, 9},    /* d3 int64 */
    {FRAME_K_FIXED, 3},    /* d4 fixext1 */
    {FRAME_K_FIXED, 4},    /* d5 fixext2 */
    {FRAME_K_FIXED, 6},    /* d6 fixext4 */
    {FRAME_K_FIXED, 10},   /* d7 fixext8 */
    {FRAME_K_FIXED, 18},   /* d8 fixext16 */
    {FRAME_K_STR, 2},      /* d9 str8 */
    {FRAME_K_STR, 3},      /* da str16 */
    {FRAME_K_STR, 5},      /* db str32 */
    {FRAME_K_ARRAY, 3},    /* dc array16 */
    {FRAME_K_ARRAY, 5},    /* dd array32 */
    {FRAME_K_MAP, 3},      /* de map16 */
    {FRAME_K_MAP, 5},      /* df map32 */
};

/* Why a header that does not fit the budget is refused, by kind. */
static const char *const frame_budget_errors[] = {
    [FRAME_K_FIXED] = "message exceeds max_message_size",
    [FRAME_K_STR] = "str length cannot fit in max_message_size",
    [FRAME_K_BIN] = "bin length cannot fit in max_message_size",
    [FRAME_K_EXT] = "ext length cannot fit in max_message_size",
    [FRAME_K_ARRAY] = "array count cannot fit in max_message_size",
    [FRAME_K_MAP] = "map count cannot fit in max_message_size",
};

static inline uint64_t
frame_be(const uint8_t *q, unsigned width)
{
    switch (width) {
    case 1:
        return q[0];
    case 2:
        return ((uint64_t)q[0] << 8) | q[1];
    default:
        return ((uint64_t)q[0] << 24) | ((uint64_t)q[1] << 16) | ((uint64_t)q[2] << 8) | q[3];
    }
}

/* Close every level whose elements are all complete; returns the new depth. */
static inline int
frame_unwind(const struct frame_scan *st, int depth)
{
    while (depth > 0 && st->remaining_[depth - 1] == 0) {
        depth--;
    }
    return depth;
}

void
frame_scan_init(struct frame_scan *st)
{
    *st = (struct frame_scan){0};
    st->pending_ = 1; /* the root */
}

int
frame_scan(struct frame_scan *st, const uint8_t *buf, size_t len,
           const struct frame_limits *lim)
{
    size_t p = st->pos;
    int depth = st->depth;
    uint64_t pending = st->pending_;
    uint64_t spilled, used, slack;
    uint32_t max_depth = lim->max_depth;
    const char *err;

    if (st->error != NULL) {
        return FRAME_ERROR;
    }
    if (st->done_) {
        return FRAME_DONE;
    }
    if (p > len) {
        err = "buffer shorter than the bytes already scanned";
        goto fail;
    }
    if (max_depth == 0 || max_depth > FRAME_MAX_DEPTH) {
        max_depth = FRAME_MAX_DEPTH;
    }
    spilled = st->wire_bytes - p;
    /* Each term was within the limit when added, so the sum cannot wrap; the
     * check matters only if the caller lowered the limit between calls. */
    used = st->wire_bytes + pending + st->skip_;
    if (used > lim->max_message_size) {
        err = frame_budget_errors[FRAME_K_FIXED];
        goto fail;
    }
    slack = lim->max_message_size - used;

    if (st->skip_ > 0) {
        size_t avail = len - p;

        if (!st->declined_) {
            /* The offer stands until the caller answers it. */
            st->spill_have = avail < st->skip_ ? avail : (size_t)st->skip_;
            return FRAME_SPILL;
        }
        if (avail < st->skip_) {
            st->skip_ -= avail;
            p = len;
            goto need_more;
        }
        p += (size_t)st->skip_;
        st->skip_ = 0;
        depth = frame_unwind(st, depth);
        if (depth == 0) {
            goto done;
        }
    }

    for (;;) {
        unsigned kind;
        size_t h;
        uint64_t n;
        uint8_t b;

        if (p == len) {
            goto need_more;
        }
        b = buf[p];
        if (b < 0x80 || b >= 0xe0) {
            /* fixint: the common case in a request (msgid, codes, small ints) */
            pending--;
            if (depth > 0) {
                st->remaining_[depth - 1]--;
            }
            p++;
            depth = frame_unwind(st, depth);
            if (depth == 0) {
                goto done;
            }
            continue;
        }
        if (b < 0xc0) {
            h = 1;
            if (b < 0x90) {
                kind = FRAME_K_MAP;
                n = (uint64_t)(b & 0x0f) * 2;
            } else if (b < 0xa0) {
                kind = FRAME_K_ARRAY;
                n = b & 0x0f;
            } else {
                kind = FRAME_K_STR;
                n = b & 0x1f;
            }
        } else {
            const struct frame_op *op = &frame_ops[b - 0xc0];

            kind = op->kind;
            h = op->size;
            if (kind == FRAME_K_RESERVED) {
                err = "reserved byte 0xc1";
                goto fail;
            }
            if (len - p < h) {
                goto need_more;
            }
            switch (kind) {
            case FRAME_K_FIXED:
                n = 0;
                break;
            case FRAME_K_EXT:
                n = frame_be(buf + p + 1, (unsigned)h - 2);
                break;
            case FRAME_K_MAP:
                n = frame_be(buf + p + 1, (unsigned)h - 1) * 2;
                break;
            default:
                n = frame_be(buf + p + 1, (unsigned)h - 1);
                break;
            }
        }

        if (kind >= FRAME_K_ARRAY && (uint32_t)depth >= max_depth) {
            err = "nesting exceeds the depth limit";
            goto fail;
        }
        if ((h - 1) + n > slack) {
            err = frame_budget_errors[kind];
            goto fail;
        }
        if (n > UINT32_MAX && kind == FRAME_K_MAP) {
            /* 2 * count elements; only reachable with max_message_size over 4 GiB */
            err = "map count over 2^31 - 1 pairs";
            goto fail;
        }
        slack -= (h - 1) + n;
        pending--;
        if (depth > 0) {
            st->remaining_[depth - 1]--;
        }
        p += h;

        switch (kind) {
        case FRAME_K_ARRAY:
        case FRAME_K_MAP:
            if (n > 0) {
                st->remaining_[depth] = (uint32_t)n;
                st->total_[depth] = (uint32_t)n;
                depth++;
                pending += n;
                continue;
            }
            break;
        case FRAME_K_STR:
        case FRAME_K_BIN:
        case FRAME_K_EXT:
            if (n > len - p) {
                if (lim->spill_min > 0 && n >= lim->spill_min) {
                    /* Offer the body, which starts at p; the header is consumed. */
                    st->skip_ = n;
                    st->declined_ = 0;
                    st->spill_len = n;
                    st->spill_have = len - p;
                    st->spill_bin = (kind == FRAME_K_BIN);
                    for (int d = 0; d < depth; d++) {
                        st->path[d] = st->total_[d] - st->remaining_[d] - 1;
                    }
                    st->pos = p;
                    st->depth = depth;
                    st->pending_ = pending;
                    st->wire_bytes = spilled + p;
                    return FRAME_SPILL;
                }
                st->skip_ = n - (len - p);
                st->declined_ = 1;
                p = len;
                goto need_more;
            }
            p += (size_t)n;
            break;
        default:
            break;
        }
        depth = frame_unwind(st, depth);
        if (depth == 0) {
            goto done;
        }
    }

need_more:
    st->pos = p;
    st->depth = depth;
    st->pending_ = pending;
    st->wire_bytes = spilled + p;
    return FRAME_NEED_MORE;

done:
    st->pos = p;
    st->depth = 0;
    st->pending_ = 0;
    st->wire_bytes = spilled + p;
    st->done_ = 1;
    return FRAME_DONE;

fail:
    st->pos = p; /* where the offending header starts */
    st->error = err;
    return FRAME_ERROR;
}

void
frame_scan_spilled(struct frame_scan *st)
{
    int depth;

    if (st->skip_ == 0 || st->declined_ || st->error != NULL) {
        return; /* no offer outstanding */
    }
    st->wire_bytes += st->skip_;
    st->skip_ = 0;
    st->spill_have = 0;
    depth = frame_unwind(st, st->depth);
    st->depth = depth;
    if (depth == 0) {
        st->done_ = 1;
    }
}

void
frame_scan_decline(struct frame_scan *st)
{
    if (st->skip_ > 0) {
        st->declined_ = 1;
    }
}
