/*
 * conn_int: a connection's state, shared by src/conn.c (the state machine:
 * frame, dispatch, write, backpressure, close), src/conn_read.c (its reads)
 * and its transports (transport.c, transport_tls.c: the bytes on its
 * socket). Nothing else includes it; everyone else uses conn.h.
 *
 * Threads: a connection, and every function here, belongs to its worker's
 * thread (conn.h); none of them blocks, closes or frees the connection.
 */
#ifndef CONN_INT_H
#define CONN_INT_H

#include <netinet/in.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "frame.h"
#include "outq.h"
#include "rpc.h"

struct conn_proto;
struct conn_transport;
struct event;
struct conn_loop;
struct iovec;

#define CONN_TURN_MAX (4096u * 1024u) /* the largest writev or body read (a turn's grain) */

/*
 * A connection's life (c->state). It only moves forward (conn_set_state), so
 * a closing connection cannot come back to life:
 *
 *   CONN_OPEN ----- a read returns 0 -----> CONN_EOF
 *       |                                       |  every request it sent answered
 *       |  an error, a framing violation,       |  (or one of them cut short)
 *       |  a timeout, a drain, a revoked login  |
 *       +-------------------+-------------------+
 *                           v
 *                     CONN_CLOSING ---> conn_free at the end of the current
 *                                       callback (never inside rpc code)
 */
enum conn_state {
    CONN_OPEN,                   /* reading and answering requests */
    CONN_EOF,                    /* the peer closed its side: answer what it sent, then close */
    CONN_CLOSING,                /* freed at the end of the current callback */
};

/*
 * What the connection's requests wait for (c->wait). Beside the life, not in
 * it: the peer may close its side, or the connection fail, while a request
 * waits. The worker's count of waiting connections follows it.
 *
 *   CONN_WAIT_NONE --conn_wait--> CONN_WAIT_TIER <-----> CONN_WAIT_XFER
 *         ^                            |                       |
 *         +-------- conn_wait_end -----+-----------------------+
 *
 * conn_wait: a request or a spill offer needs the SSD tier (-EAGAIN), or
 * deferred replies are not done. conn_wait_end: the retry timer or the
 * tier's wake-up looks again. TIER to XFER (conn_poll_pending): only
 * batch_get_into transfers wait, with room behind them. XFER to TIER: the
 * next message cannot start behind them, or the next conn_poll_pending.
 */
enum conn_wait {
    CONN_WAIT_NONE,              /* nothing waits */
    CONN_WAIT_TIER,              /* not read (except for the lookahead), nothing dispatched */
    CONN_WAIT_XFER,              /* read on: more batch_get_into requests start behind */
};

struct conn {
    struct conn_loop *w;             /* the loop it lives on (its worker's; conn.h) */
    struct conn *next, *prev;
    int fd;
    const struct conn_transport *tp; /* TCP, Unix or TLS: how its bytes cross fd */
    int kind;                        /* enum conn_kind (conn.h): its bytes' counters */
    const struct conn_proto *proto;  /* msgpack-rpc or RESP2: what its bytes mean */
    void *proto_data;                /* the protocol's own (RESP: its scan), or NULL */
    void *tp_data;                   /* the transport's own (TLS: its session), or NULL */
    bool tp_ready;                   /* tp->start has accepted the peer (or has none) */
    bool tp_want_write;              /* a tp->readv waits for the socket to be writable */
    uint64_t id;
    char peer[64];
    char addr[INET6_ADDRSTRLEN];     /* the peer's IP address ("" on the Unix socket) */
    uint64_t active_ms;              /* last byte read or written */
    uint64_t progress_ms;            /* last time its unsent output moved, or was none */
    uint64_t rx_ms;                  /* last byte read, or when reading was (re)armed */
    enum conn_state state;           /* its life (above) */
    enum conn_wait wait;             /* what its requests wait for (above) */
    /*
     * Backpressure: not reading while its unsent output or its replies in flight are over
     * their limits, until both drain to half. Not a state of the life or of the wait: a
     * connection over its limits may wait for the tier too, and reads again only when
     * neither holds it; it may be paused when its peer has closed its side.
     */
    bool paused;
    /*
     * Scheduling marks, independent of the life: they say how this connection shares its
     * worker's loop with the others, whatever it is doing.
     */
    bool yielded;                    /* stopped at CONN_MESSAGES_PER_WAKE: ev_more armed */
    bool in_ready;                   /* in its worker's ready_ep */
    bool passed;                     /* its last flush let a waiting peer go first */
    bool bulk;                       /* its last read turn moved CONN_TURN bytes or more */
    size_t turn_bytes;               /* bytes read and written in this callback */
    uint32_t auth_seen;              /* ctx.auth_failures already accounted */
    struct event *ev_read, *ev_write;
    bool reading;                /* ev_read is armed (what the loop is asked to do, whatever
                                    the state: conn_reading_wanted decides) */
    bool writing;                /* ev_write is armed */
    bool rx_short;               /* the last read returned less than it offered room for:
                                    the socket was drained then, so a read before the next
                                    poll would only answer EAGAIN (conn_on_read stops) */
    bool rx_behind;              /* bytes queue up: read value bodies in large pieces (a
                                    sizing hint for conn_read_once only) */
    bool offer_pending;          /* the spill offer in scan is to be asked again (where the
                                    scan of the message at rpos stands: it outlives a wait) */
    uint64_t wait_since;         /* ms, when the current request began to wait; 0: it has not */
    struct event *ev_retry;      /* timer that retries a waiting request */
    struct event *ev_more;       /* zero timer: go on with what a turn left buffered */
    bool lookahead;              /* while the request at rpos waits: read on and prefetch
                                    queued gets (kept until that request is dispatched, so
                                    la_pos survives the wait's retries) */
    struct frame_scan la_scan;   /* the lookahead's scan of the message after la_pos */
    size_t la_pos;               /* bytes after rpos the lookahead has passed */
    uint64_t rx_total;           /* bytes received since the connection opened */
    uint64_t msg_start;          /* stream offset of the message being dispatched */
    int fdq[RPC_MAX_FDS];        /* descriptors received (Unix socket), oldest first, each */
    uint64_t fdq_lo[RPC_MAX_FDS]; /* with the stream bytes of the read that brought it */
    uint64_t fdq_hi[RPC_MAX_FDS];
    int nfdq;

    uint8_t *ibuf;               /* message bytes (minus spilled bodies) + read-ahead */
    size_t icap, ilen, rpos;     /* current message starts at rpos */
    struct frame_scan scan;
    struct frame_limits flim;
    struct rpc_spill_cursor sc;

    struct mp_hole *holes;       /* spilled bodies of the current message */
    struct rpc_spill *spills;    /* parallel to holes */
    size_t nholes, capholes;
    uint64_t spill_left;         /* body bytes of the active spill still on the wire */
    uint64_t spill_off;          /* bytes of it already received */

    struct outq out;
    struct rpc_ctx ctx;
};

/* ---- conn_proto.c ---- */

/*
 * conn_proto: what a connection's bytes mean, as a small table beside the
 * transport's: msgpack-rpc (protocol/frame.c, src/rpc/rpc.c) or RESP2
 * (protocol/resp.c, src/rpc/resp_cmd.c). conn.c keeps one state machine for
 * both and calls these at its fixed points; a scan reports in c->scan's
 * outputs (pos, wire_bytes, error, spill_len, spill_have) and FRAME_* terms
 * whatever the protocol, so the spill, wait and write paths are shared.
 */
struct conn_proto {
    const char *name;                   /* "msgpack" or "resp" */
    bool prefetch;                      /* rpc_prefetch and rpc_overlaps apply to it */
    /* open: set up c->proto_data (at adoption). 0 or -ENOMEM. NULL: nothing to do. */
    int (*open)(struct conn *c);
    /* close: free c->proto_data. NULL: nothing to do. */
    void (*close)(struct conn *c);
    /* reset: a new message begins at c->rpos. */
    void (*reset)(struct conn *c);
    /* scan: scan on over ibuf[rpos..ilen) with c->flim: a FRAME_* status. */
    int (*scan)(struct conn *c);
    /* take: the FRAME_SPILL offer: 1 with *sp filled (see rpc_spill_take), 0 to decline. */
    int (*take)(struct conn *c, struct rpc_spill *sp);
    /* spilled, decline: the offered body was received elsewhere, or is to be buffered. */
    void (*spilled)(struct conn *c);
    void (*decline)(struct conn *c);
    /* dispatch: the complete message of scan.pos bytes at rpos, holes tagged: as
     * rpc_dispatch, or CONN_PROTO_QUIT (answered; close once it is sent). */
    int (*dispatch)(struct conn *c);
    /* notify: queue the error that precedes closing. 0 or -ENOMEM. */
    int (*notify)(struct outq *out, int status, const char *why);
};

#define CONN_PROTO_QUIT 1

extern const struct conn_proto conn_proto_msgpack;
extern const struct conn_proto conn_proto_resp;

/* ---- conn_read.c ---- */

/*
 * conn_hole_add: record a spill of len body bytes at the current scan
 * position of c's message: a hole in c->holes and, beside it, an empty
 * rpc_spill in c->spills (the caller stores the reservation there). Returns
 * its index, or -1 when out of memory (nothing recorded).
 */
int conn_hole_add(struct conn *c, uint64_t len);

/*
 * conn_spill_fill: n received bytes at p (borrowed; n at most spill_left)
 * are the next bytes of the active spill's body (the last hole's): copy
 * them into its reservation, or drop them when it has none, and account
 * them in spill_off and spill_left.
 */
void conn_spill_fill(struct conn *c, const uint8_t *p, size_t n);

/*
 * conn_fds_expire: the message of scan.pos bytes at rpos is about to be
 * dispatched: set msg_start to its stream offset and close every received
 * descriptor whose read ended before it (no request still to come can
 * claim it).
 */
void conn_fds_expire(struct conn *c);

/*
 * conn_take_fd: c's ctx.take_fd (Unix socket only; arg is the struct
 * conn): the oldest received descriptor whose read holds the start of the
 * message being dispatched, now owned by the caller; or -1 when there is
 * none.
 */
int conn_take_fd(void *arg);

/*
 * conn_read_once: one read syscall on c (its transport's readv): into the
 * active spill's reservation (or the discard buffer when it has none) as
 * far as its body goes, and into the input buffer behind it, which it
 * grows as needed. Advances spill_off/spill_left (and
 * ends the spill in c->scan when its body is in), ilen, rx_total and the
 * worker's bytes_in. Returns the bytes read, 0 at the peer's close, or
 * -errno: -EAGAIN/-EWOULDBLOCK when the socket has nothing, -EINTR, -ENOMEM
 * when the buffer cannot grow (out of memory, or conn_buffer_memory reached:
 * then c has been failed with UNAVAILABLE and is closing), any other -errno
 * of a broken connection.
 */
ssize_t conn_read_once(struct conn *c);

/* ---- conn.c ---- */

/*
 * conn_ibuf_room: make room in c's input buffer for at least one more byte:
 * move the current message to its front, else double the buffer within
 * conn_buffer_memory. Returns 0, or -1: out of memory, or over
 * conn_buffer_memory (counted in buffer_cap_closes; c has then been sent
 * the UNAVAILABLE notification and is closing).
 */
int conn_ibuf_room(struct conn *c);

/*
 * conn_refuse: c's peer speaks another protocol than c's port (a
 * transport's start found out): read and drop what it sent (closing on
 * unread bytes would reset the connection, and the notification with it),
 * send it the error notification of status and why in plain bytes straight
 * to the socket (best effort, never waits), and shut the socket's sending
 * side. The caller then has c closed.
 */
void conn_refuse(struct conn *c, int status, const char *why);

/* conn_ctr_add: add n to a counter of the connection's loop (its one writer: no lock). */
static inline void
conn_ctr_add(_Atomic uint64_t *c, uint64_t n)
{
    atomic_store_explicit(c, atomic_load_explicit(c, memory_order_relaxed) + n,
                          memory_order_relaxed);
}

#endif
