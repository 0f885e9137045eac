/*
 * outq: a connection's queue of reply bytes waiting for the socket.
 *
 * Replies are a mix of small encoded headers and object values. Headers are
 * copied into recycled fixed-size chunks; values are never copied: outq_obj
 * queues the object's arena extents by reference and holds a store reference
 * until the last byte of it has been written, so eviction and remove leave
 * that memory alone meanwhile. The socket side takes iovecs with
 * outq_peek and reports progress with outq_consume. The producer marks
 * where each reply ends (outq_reply_end), so the connection can count the
 * replies not yet fully written (outq_replies) without parsing its bytes.
 *
 * Pure memory: no sockets, no locks. One outq belongs to one connection and
 * is used by the thread that owns the connection.
 */
#ifndef OUTQ_H
#define OUTQ_H

#include <stddef.h>
#include <stdint.h>
#include <sys/uio.h>

struct store;
struct store_obj;
struct outq_chunk;

#define OUTQ_CHUNK_SIZE (16u * 1024u)

struct outq {
    struct store *store;        /* for store_obj_unref; borrowed */
    struct iovec *iov;          /* queued segments, [head, tail) */
    uintptr_t *own;             /* per segment: 0, a store_obj* to unref, or a chunk|1 */
    uint32_t *ends;             /* per segment: replies that end inside it (outq_reply_end) */
    size_t head, tail, cap;
    struct outq_chunk *cur;     /* chunk being appended to (referenced by its iovs too) */
    struct outq_chunk *spare;   /* one recycled chunk */
    uint64_t pending;           /* unsent bytes */
    uint64_t replies;           /* replies marked whose last segment is not all sent */
    int failed;                 /* an allocation failed: the connection must close */
};

/* outq_init: an empty queue; store is borrowed for the queue's life. */
void outq_init(struct outq *q, struct store *store);

/* outq_deinit: drop everything queued (unreferencing objects). Idempotent. */
void outq_deinit(struct outq *q);

/*
 * outq_write: copy n bytes to the end of the queue. Returns 0, or -ENOMEM
 * (q->failed is then set and the queue must be discarded).
 */
int outq_write(struct outq *q, const void *p, size_t n);

/*
 * outq_obj: queue the value of o by reference. Takes over the caller's
 * reference (released when sent or dropped). Returns 0 or -ENOMEM (the
 * reference is released and q->failed set).
 */
int outq_obj(struct outq *q, struct store_obj *o);

/* outq_pack_write: msgpack_packer write callback; data is a struct outq *. */
int outq_pack_write(void *data, const char *buf, size_t len);

/*
 * outq_fd: the bytes queued after this call go out with descriptor fd
 * attached (SCM_RIGHTS on a Unix socket). fd is borrowed: it must stay open
 * until sent or dropped. Returns 0 or -ENOMEM (q->failed set).
 */
int outq_fd(struct outq *q, int fd);

/* outq_head_fd: the descriptor to attach to the next write, or -1. */
int outq_head_fd(const struct outq *q);

/* outq_fd_sent: the write that carried outq_head_fd's descriptor succeeded. */
void outq_fd_sent(struct outq *q);

/*
 * outq_peek: the first unsent segments (at most max of them); returns the
 * count. It stops before a descriptor marker, so one write carries at most
 * one descriptor, with its first byte.
 */
int outq_peek(const struct outq *q, struct iovec *iov, int max);

/* outq_consume: n bytes from the front have been sent. */
void outq_consume(struct outq *q, size_t n);

/* outq_pending: unsent bytes. */
static inline uint64_t
outq_pending(const struct outq *q)
{
    return q->pending;
}

/*
 * outq_reply_end: the bytes queued so far complete one reply. The mark goes
 * on the last segment, which later writes may extend: a reply counts as
 * sent once the whole segment it ends in is sent, so the count may lag by
 * at most one segment (a chunk) of bytes, never run ahead. Allocates
 * nothing. A mark on an empty queue counts nothing (there is nothing left
 * of that reply to send).
 */
void outq_reply_end(struct outq *q);

/* outq_replies: replies marked by outq_reply_end that are not yet all sent. */
static inline uint64_t
outq_replies(const struct outq *q)
{
    return q->replies;
}

#endif
