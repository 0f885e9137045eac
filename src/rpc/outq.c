/*
 * outq: reply bytes and object references queued for one socket.
 *
 * Segments live in a growing array [head, tail) that is compacted when the
 * front is consumed. A segment owns nothing (0), the last reference of one
 * store object (the last extent of that object's value), or one reference on
 * a byte chunk (tagged pointer, low bit 1). Chunks are freed when the last
 * segment in them is sent, except one kept spare so a steady request/reply
 * stream allocates nothing.
 */
#include "outq.h"

#include <errno.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "store.h"

struct outq_chunk {
    uint32_t refs;     /* segments pointing into this chunk, +1 while it is q->cur */
    uint32_t used;
    uint32_t size;
    uint8_t data[];
};

static struct outq_chunk *
outq_chunk_new(struct outq *q, size_t need)
{
    struct outq_chunk *c;
    size_t size = need > OUTQ_CHUNK_SIZE ? need : OUTQ_CHUNK_SIZE;

    if (q->spare != NULL && q->spare->size >= size) {
        c = q->spare;
        q->spare = NULL;
    } else {
        c = malloc(sizeof(*c) + size);
        if (c == NULL) {
            return NULL;
        }
        c->size = (uint32_t)size;
    }
    c->refs = 1;
    c->used = 0;
    return c;
}

static void
outq_chunk_unref(struct outq *q, struct outq_chunk *c)
{
    if (--c->refs > 0) {
        return;
    }
    if (q->spare == NULL && c->size == OUTQ_CHUNK_SIZE) {
        q->spare = c;
    } else {
        free(c);
    }
}

static void
outq_release(struct outq *q, uintptr_t own)
{
    if (own == 0 || (own & 2u)) {
        return;                 /* nothing held, or a descriptor marker (borrowed fd) */
    }
    if (own & 1u) {
        outq_chunk_unref(q, (struct outq_chunk *)(own & ~(uintptr_t)1));
    } else {
        store_obj_unref(q->store, (struct store_obj *)own);
    }
}

void
outq_init(struct outq *q, struct store *store)
{
    memset(q, 0, sizeof(*q));
    q->store = store;
}

void
outq_deinit(struct outq *q)
{
    for (size_t i = q->head; i < q->tail; i++) {
        outq_release(q, q->own[i]);
    }
    if (q->cur != NULL) {
        outq_chunk_unref(q, q->cur);
    }
    free(q->spare);
    free(q->iov);
    free(q->own);
    free(q->ends);
    struct store *s = q->store;
    memset(q, 0, sizeof(*q));
    q->store = s;
}

/* Make room for n more segments at the tail. */
static int
outq_reserve(struct outq *q, size_t n)
{
    if (q->tail + n <= q->cap) {
        return 0;
    }
    if (q->head > 0) {
        size_t live = q->tail - q->head;
        memmove(q->iov, q->iov + q->head, live * sizeof(*q->iov));
        memmove(q->own, q->own + q->head, live * sizeof(*q->own));
        memmove(q->ends, q->ends + q->head, live * sizeof(*q->ends));
        q->head = 0;
        q->tail = live;
        if (q->tail + n <= q->cap) {
            return 0;
        }
    }
    size_t cap = q->cap ? q->cap : 64;
    while (cap < q->tail + n) {
        cap *= 2;
    }
    struct iovec *iov = realloc(q->iov, cap * sizeof(*iov));
    if (iov == NULL) {
        return -ENOMEM;
    }
    q->iov = iov;
    uintptr_t *own = realloc(q->own, cap * sizeof(*own));
    if (own == NULL) {
        return -ENOMEM;
    }
    q->own = own;
    uint32_t *ends = realloc(q->ends, cap * sizeof(*ends));
    if (ends == NULL) {
        return -ENOMEM;
    }
    q->ends = ends;
    q->cap = cap;
    return 0;
}

int
outq_write(struct outq *q, const void *p, size_t n)
{
    if (n == 0) {
        return 0;
    }
    struct outq_chunk *c = q->cur;
    if (c == NULL || c->size - c->used < n) {
        if (c != NULL) {
            q->cur = NULL;
            outq_chunk_unref(q, c);
        }
        c = outq_chunk_new(q, n);
        if (c == NULL) {
            q->failed = 1;
            return -ENOMEM;
        }
        q->cur = c;
    }
    uint8_t *dst = c->data + c->used;
    memcpy(dst, p, n);
    c->used += (uint32_t)n;
    q->pending += n;

    /* Extend the last segment when it ends exactly here (same chunk). */
    if (q->tail > q->head) {
        struct iovec *last = &q->iov[q->tail - 1];
        if ((uint8_t *)last->iov_base + last->iov_len == dst &&
            q->own[q->tail - 1] == ((uintptr_t)c | 1u)) {
            last->iov_len += n;
            return 0;
        }
    }
    if (outq_reserve(q, 1) != 0) {
        q->failed = 1;
        return -ENOMEM;
    }
    c->refs++;
    q->iov[q->tail].iov_base = dst;
    q->iov[q->tail].iov_len = n;
    q->own[q->tail] = (uintptr_t)c | 1u;
    q->ends[q->tail] = 0;
    q->tail++;
    return 0;
}

int
outq_obj(struct outq *q, struct store_obj *o)
{
    struct iovec ext[STORE_MAX_EXTENTS];
    int n = store_obj_iov(o, ext, STORE_MAX_EXTENTS);

    if (n == 0) {
        store_obj_unref(q->store, o);
        return 0;
    }
    if (outq_reserve(q, (size_t)n) != 0) {
        store_obj_unref(q->store, o);
        q->failed = 1;
        return -ENOMEM;
    }
    for (int i = 0; i < n; i++) {
        q->iov[q->tail] = ext[i];
        q->own[q->tail] = 0;
        q->ends[q->tail] = 0;
        q->pending += ext[i].iov_len;
        q->tail++;
    }
    q->own[q->tail - 1] = (uintptr_t)o;
    return 0;
}

int
outq_pack_write(void *data, const char *buf, size_t len)
{
    return outq_write(data, buf, len) == 0 ? 0 : -1;
}

int
outq_fd(struct outq *q, int fd)
{
    if (outq_reserve(q, 1) != 0) {
        q->failed = 1;
        return -ENOMEM;
    }
    q->iov[q->tail].iov_base = NULL;
    q->iov[q->tail].iov_len = 0;
    q->own[q->tail] = ((uintptr_t)fd << 2) | 2u;
    q->ends[q->tail] = 0;
    q->tail++;
    return 0;
}

int
outq_head_fd(const struct outq *q)
{
    if (q->head < q->tail && (q->own[q->head] & 2u)) {
        return (int)(q->own[q->head] >> 2);
    }
    return -1;
}

void
outq_fd_sent(struct outq *q)
{
    if (outq_head_fd(q) >= 0) {
        q->replies -= q->ends[q->head];
        q->head++;
    }
}

void
outq_reply_end(struct outq *q)
{
    if (q->tail > q->head) {
        q->ends[q->tail - 1]++;
        q->replies++;
    }
}

int
outq_peek(const struct outq *q, struct iovec *iov, int max)
{
    int n = 0;
    for (size_t i = q->head; i < q->tail && n < max; i++) {
        if (i > q->head && (q->own[i] & 2u)) {
            break;              /* a descriptor goes with the first byte after its marker */
        }
        iov[n++] = q->iov[i];
    }
    return n;
}

void
outq_consume(struct outq *q, size_t n)
{
    q->pending -= n;
    while (n > 0 && q->head < q->tail) {
        struct iovec *v = &q->iov[q->head];
        if (n < v->iov_len) {
            v->iov_base = (uint8_t *)v->iov_base + n;
            v->iov_len -= n;
            return;
        }
        n -= v->iov_len;
        outq_release(q, q->own[q->head]);
        q->replies -= q->ends[q->head];
        q->head++;
    }
    if (q->head == q->tail) {
        q->head = q->tail = 0;
    }
}
