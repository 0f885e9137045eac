/*
 * conn_read: a connection's reads. One read syscall at a time (through its
 * transport, c->tp->readv) puts each byte where it belongs: the body of a
 * put value being spilled straight into its store reservation (or dropped
 * when it has none), in reads sized to keep the sender busy; the rest into
 * the input buffer behind it. Also the spill bookkeeping of the message
 * being received (its holes) and the queue of received descriptors (the Unix
 * transport fills it), until a request claims one or the message it came
 * with is passed.
 *
 * It runs on the connection's worker thread and never blocks: one
 * non-blocking read per call. It does not scan messages, dispatch, write,
 * or close the connection; growing the buffer within conn_buffer_memory is
 * conn.c's (conn_ibuf_room), as is what to do with what was read.
 */
#include "conn_int.h"
#include "conn.h"

#include <errno.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/uio.h>
#include <unistd.h>

#include "copier.h"
#include "crc32c.h"
#include "frame.h"
#include "mp.h"
#include "rpc.h"
#include "store.h"
#include "transport.h"

#define CONN_READAHEAD_IN_PUT 512
#define CONN_BODY_CHUNK (128u * 1024u)    /* a value body read while the loop keeps up */
#define CONN_BEHIND_QUEUED (1024u * 1024u) /* this much more queued: the loop is behind */
#define CONN_BEHIND_READ (256u * 1024u)   /* a read this long: still behind */

/* ---- the spilled bodies of the message being received ---- */

/* Record a spill of the current message; returns its index or -1 (no memory). */
int
conn_hole_add(struct conn *c, uint64_t len)
{
    if (c->nholes == c->capholes) {
        size_t cap = c->capholes ? c->capholes * 2 : 8;
        struct mp_hole *h = realloc(c->holes, cap * sizeof(*h));
        if (h == NULL) {
            return -1;
        }
        c->holes = h;
        struct rpc_spill *sp = realloc(c->spills, cap * sizeof(*sp));
        if (sp == NULL) {
            return -1;
        }
        c->spills = sp;
        c->capholes = cap;
    }
    size_t i = c->nholes++;
    c->holes[i].off = c->scan.pos;
    c->holes[i].len = len;
    c->holes[i].tag = NULL;
    c->spills[i].obj = NULL;
    c->spills[i].code = 0;
    c->spills[i].sum = false;
    c->spills[i].crc = 0;
    return (int)i;
}

/*
 * conn_obj_iov: the pieces of obj's reservation that hold bytes [off, off + len), into
 * iov[n..]; the new n.
 */
static int
conn_obj_iov(struct store_obj *obj, uint64_t off, uint64_t len, struct iovec *iov, int n)
{
    struct iovec ext[STORE_MAX_EXTENTS];
    int ne = store_obj_iov(obj, ext, STORE_MAX_EXTENTS);

    for (int i = 0; i < ne && len > 0; i++) {
        if (off >= ext[i].iov_len) {
            off -= ext[i].iov_len;
            continue;
        }
        size_t k = ext[i].iov_len - off;
        iov[n].iov_base = (uint8_t *)ext[i].iov_base + off;
        iov[n].iov_len = k < len ? k : (size_t)len;
        len -= iov[n].iov_len;
        off = 0;
        n++;
    }
    return n;
}

/*
 * Copy n received body bytes of the active spill into its reservation (or drop them).
 * They are the start of a body read ahead into the buffer behind the previous one; the
 * copy streams past the cache (copier_stream), as arena pages are not read back soon.
 */
/*
 * conn_spill_sum: n more bytes of the active spill landed at p (still in cache): extend its
 * CRC-32C when it keeps one, and record it on the object once the body is whole (in a
 * pool, so the checksum a replica travels with, or is checked against, costs no second
 * read of the value from memory).
 */
static void
conn_spill_sum(struct conn *c, struct rpc_spill *sp, const struct iovec *iov, int niov,
               uint64_t n)
{
    for (int i = 0; i < niov && n > 0; i++) {
        size_t k = iov[i].iov_len < n ? iov[i].iov_len : (size_t)n;

        sp->crc = crc32c_extend(sp->crc, iov[i].iov_base, k);
        n -= k;
    }
    if (c->spill_left == 0) {
        store_obj_set_crc(sp->obj, sp->crc);
    }
}

void
conn_spill_fill(struct conn *c, const uint8_t *p, size_t n)
{
    struct rpc_spill *sp = &c->spills[c->nholes - 1];

    if (sp->obj != NULL && n > 0) {
        struct iovec dst[STORE_MAX_EXTENTS];
        struct iovec src = {.iov_base = (void *)p, .iov_len = n};
        int nd = conn_obj_iov(sp->obj, c->spill_off, n, dst, 0);
        for (int i = 0; i < nd; i++) {
            copier_stream(dst[i].iov_base, p, dst[i].iov_len);
            p += dst[i].iov_len;
        }
        c->spill_off += n;
        c->spill_left -= n;
        if (sp->sum) {
            conn_spill_sum(c, sp, &src, 1, n);      /* from the buffer: the copy bypassed */
        }                                           /* the cache */
        return;
    }
    c->spill_off += n;
    c->spill_left -= n;
}

/* ---- descriptors received on the Unix socket ---- */

/*
 * conn_fds_expire: the message about to be dispatched starts at msg_start;
 * a descriptor whose read ended before that belongs to no request still to
 * come (nothing claimed it): close it.
 */
void
conn_fds_expire(struct conn *c)
{
    uint64_t end = c->rx_total - (c->ilen - c->rpos - c->scan.pos);
    int keep = 0;

    c->msg_start = end - c->scan.wire_bytes;
    for (int i = 0; i < c->nfdq; i++) {
        if (c->fdq_hi[i] <= c->msg_start) {
            close(c->fdq[i]);
            continue;
        }
        c->fdq[keep] = c->fdq[i];
        c->fdq_lo[keep] = c->fdq_lo[i];
        c->fdq_hi[keep++] = c->fdq_hi[i];
    }
    c->nfdq = keep;
}

/*
 * conn_take_fd (ctx.take_fd): the oldest descriptor whose read holds the
 * start of the message being dispatched, now the caller's; or -1.
 */
int
conn_take_fd(void *arg)
{
    struct conn *c = arg;

    for (int i = 0; i < c->nfdq; i++) {
        if (c->fdq_lo[i] <= c->msg_start && c->msg_start < c->fdq_hi[i]) {
            int fd = c->fdq[i];

            c->nfdq--;
            memmove(&c->fdq[i], &c->fdq[i + 1], (size_t)(c->nfdq - i) * sizeof(c->fdq[0]));
            memmove(&c->fdq_lo[i], &c->fdq_lo[i + 1],
                    (size_t)(c->nfdq - i) * sizeof(c->fdq_lo[0]));
            memmove(&c->fdq_hi[i], &c->fdq_hi[i + 1],
                    (size_t)(c->nfdq - i) * sizeof(c->fdq_hi[0]));
            return fd;
        }
    }
    return -1;
}

/* ---- reads ---- */

/*
 * One read syscall: into the active spill (and the buffer behind it) or the buffer.
 *
 * A spilled value's body is read straight into its reservation, at most CONN_BODY_CHUNK
 * bytes a read while the loop keeps up with the socket. The kernel sends the window update
 * that lets the peer send more only when a read returns, so one read of a whole megabyte
 * leaves the sender idle while it copies; reads of 128 KiB keep both sides busy. Measured
 * here with raw-bench's put on one connection (the same loop, recv of 64 KiB pieces
 * against MSG_WAITALL of 1 MiB): 4.0 against 2.9 GB/s, and kvstashd's 1 MiB puts on one
 * connection went from 2.4-2.9 to 3.0-3.3 GB/s. When a read fills its piece and at least
 * CONN_BEHIND_QUEUED more bytes wait (FIONREAD), the loop is behind: the sender is not
 * waiting, and fewer, larger reads cost less (with 8 connections, 64 KiB pieces were 5%
 * slower in raw-bench and up to 25% in kvstashd). Bodies are then read whole, until a read
 * comes back under CONN_BEHIND_READ.
 */
ssize_t
conn_read_once(struct conn *c)
{
    struct iovec iov[STORE_MAX_EXTENTS + 1];
    int n = 0;
    uint64_t body = 0;

    if (c->spill_left > 0) {
        struct rpc_spill *sp = &c->spills[c->nholes - 1];
        if (sp->obj != NULL) {
            body = c->spill_left;
            if (!c->rx_behind && c->tp->raw && body > CONN_BODY_CHUNK) {
                body = CONN_BODY_CHUNK;
            } else if (body > CONN_TURN_MAX) {
                body = CONN_TURN_MAX;   /* one read stays a short turn */
            }
            n = conn_obj_iov(sp->obj, c->spill_off, body, iov, n);
        } else {
            body = c->spill_left < CONN_DISCARD_SIZE ? c->spill_left : CONN_DISCARD_SIZE;
            iov[n].iov_base = c->w->discard;
            iov[n].iov_len = body;
            n++;
        }
    }
    /*
     * Read ahead into the buffer only past the end of the body. Behind, only enough for
     * the next header: another big value probably follows, and its body too should go
     * straight into its reservation in large reads. Otherwise take all the room there is:
     * one read then covers several small values (their buffered starts are copied over
     * by conn_spill_fill), and reads between spills take all the room anyway.
     */
    if (body == c->spill_left) {
        if (conn_ibuf_room(c) != 0) {
            return -ENOMEM;
        }
        size_t room = c->icap - c->ilen;
        if (body > 0 && c->rx_behind && room > CONN_READAHEAD_IN_PUT) {
            room = CONN_READAHEAD_IN_PUT;
        }
        iov[n].iov_base = c->ibuf + c->ilen;
        iov[n].iov_len = room;
        n++;
    }

    size_t offered = 0;
    for (int k = 0; k < n; k++) {
        offered += iov[k].iov_len;
    }
    ssize_t rd = c->tp->readv(c, iov, n);
    if (rd <= 0) {
        return rd < 0 ? -errno : 0;
    }
    c->rx_short = (size_t)rd < offered;
    atomic_store_explicit(&c->w->ctr.bytes_in,
                          atomic_load_explicit(&c->w->ctr.bytes_in, memory_order_relaxed) +
                              (uint64_t)rd,
                          memory_order_relaxed);
    conn_ctr_add(&c->w->ctr.kind_bytes_in[c->kind], (uint64_t)rd);
    uint64_t got = (uint64_t)rd;
    c->rx_total += got;
    if (body > 0) {
        uint64_t k = got < body ? got : body;
        if (c->rx_behind) {
            c->rx_behind = k >= CONN_BEHIND_READ;
        } else if (k == CONN_BODY_CHUNK && c->tp->raw) {
            int queued = 0;
            c->rx_behind = ioctl(c->fd, FIONREAD, &queued) == 0 &&
                           (unsigned)queued >= CONN_BEHIND_QUEUED;
        }
        /* Bytes went straight into the reservation: account, do not copy. */
        c->spill_off += k;
        c->spill_left -= k;
        if (c->spills[c->nholes - 1].sum) {
            conn_spill_sum(c, &c->spills[c->nholes - 1], iov, n, k);
        }
        got -= k;
        if (c->spill_left == 0) {
            c->proto->spilled(c);
        }
    }
    c->ilen += got;
    return rd;
}
