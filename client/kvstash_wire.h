/*
 * kvstash_wire: the transport and wire codec of libkvstash (internal, not installed).
 *
 * This module owns a connection's socket and its two buffers: it connects
 * the socket, builds one request at a time into the reusable request buffer
 * (msgpack-rpc [0, msgid, method, params]) and sends it with sendmsg (with,
 * when asked, one file descriptor by SCM_RIGHTS on its first bytes), and
 * decodes replies with a streaming reader that pulls bytes from the socket
 * as it needs them, checks every declared length and count against what the
 * reply may still hold before acting on it, and receives bin bodies straight
 * into the caller's buffers. It decides no policy: splitting batches,
 * pipelining, server-limit defaults and argument checks belong to kvstash.c,
 * which in turn never touches the socket or a msgpack byte.
 *
 * Threads: none started, no global state, no signal handler (sends use
 * MSG_NOSIGNAL). A struct kvstash is used by one thread at a time.
 *
 * Status values, as in kvstash.h: 0 on success; a positive KVSTASH_E* code
 * (a request-level error the server answered, or a key's outcome); a
 * negative errno for a transport failure. "Breaks the connection" means
 * c->broken is set and the stream must not be used again: the reader does
 * so itself for a malformed reply (-EPROTO, with c->err saying why) and for
 * an error notification (the server is closing); for other negative values
 * the caller decides (kvstash_wire_fail). The server is not trusted: a
 * reply is never guessed at, and nothing is allocated from a wire length
 * except by kvstash_wire_read_value into a malloc'd buffer (bounded by
 * max_value_size) and kvstash_wire_read_stats (bounded by the reply budget).
 *
 * Pointers: c is borrowed by every call. Keys, values and strings passed to
 * the kvstash_wire_req_* functions are borrowed until kvstash_wire_req_send
 * (or kvstash_wire_call) returns: values over 8 KiB are not copied but sent
 * from the caller's memory.
 *
 * Files: kvstash_wire.c has the socket, the requests and connecting;
 * kvstash_reply.c the reply reader (kvstash_wire_reply, _call, _salvage,
 * _skip and the kvstash_wire_read_* calls).
 */
#ifndef KVSTASH_WIRE_H
#define KVSTASH_WIRE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "kvstash.h"

#define KVSTASH_WIRE_ERRLEN 256              /* c->err, with its NUL */
#define KVSTASH_WIRE_SMALL_REPLY (1u << 20)  /* reply budget of hello, ping, counts */
#define KVSTASH_WIRE_NOTICE_MAX (64u * 1024) /* budget of an error triple or notification */
#define KVSTASH_WIRE_RBUF_SIZE (64u * 1024)  /* reply buffer; big bodies bypass it */

struct iovec;
struct kvstash_rdma;
typedef struct ssl_ctx_st SSL_CTX;
typedef struct ssl_st SSL;
struct kvstash_wire_seg;

/* A piece of an object in the daemon's arena (segment 0), as offsets. */
struct kvstash_wire_piece {
    uint64_t offset;
    uint64_t length;
};

/*
 * One connection (opaque to users of kvstash.h). kvstash.c allocates it
 * zeroed, sets timeout_ms, and reads or writes the fields of the first
 * group; the rest belongs to this module.
 */
struct kvstash {
    int fd;
    int broken;                    /* 0, or set once the stream is unusable */
    int timeout_ms;                /* I/O timeout, 0 = none */
    int is_unix;                   /* set by kvstash_wire_connect: a Unix-socket connection */
    uint32_t next_msgid;           /* id of the next request written */
    uint32_t want_msgid;           /* id of the next reply expected */
    uint64_t req_target;           /* request bytes aimed at when splitting */
    struct kvstash_hello hello;    /* max_value_size bounds kvstash_wire_read_value */
    char err[KVSTASH_WIRE_ERRLEN]; /* kvstash_last_error() */
    struct kvstash_buffer *bufs;   /* registered buffers (kvstash_buffer.c's list) */
    uint8_t *arena;                /* the daemon's arena mapped here (kvstash_map_arena), or NULL */
    uint64_t arena_size;
    struct kvstash_rdma *rdma;     /* this end's RDMA device and queue pair (kvstash_rdma.c) */
    uint8_t rdma_qp[32];           /* the daemon's queue-pair info, from hello {"rdma": true} */
    size_t rdma_qp_len;
    /* request side */
    uint8_t *wbuf;
    size_t wlen;
    size_t wcap;
    int wfail;                     /* building the request ran out of memory */
    int wfd;                       /* descriptor to send with the request, or -1 */
    struct kvstash_wire_seg *segs;
    size_t nsegs;
    size_t segcap;
    size_t seg_start;              /* wbuf offset where the open segment starts */
    struct iovec *iov;
    size_t iovcap;
    /* reply side */
    uint8_t *rbuf;                 /* fixed reply buffer; big bodies bypass it */
    size_t rpos;
    size_t rlen;
    size_t fill_max;               /* recv size for refills */
    uint64_t msg_left;             /* bytes the current reply may still use */
    int rfd;                       /* a descriptor received (SCM_RIGHTS), or -1 */
    SSL_CTX *ssl_ctx;              /* TLS (kvstash_wire_tls_start), else NULL */
    SSL *ssl;
};

/* Internal to libkvstash: none of these is exported by libkvstash.so. */
#pragma GCC visibility push(hidden)

/* ---- lifecycle ---- */

/*
 * kvstash_wire_init: prepare the zeroed c for use: no socket yet (fd -1) and
 * the reply buffer allocated. Returns 0 or -ENOMEM. c is safe to pass to
 * kvstash_wire_deinit whatever the outcome.
 */
int kvstash_wire_init(struct kvstash *c);

/*
 * kvstash_wire_connect: connect c's socket to addr: "unix:/path" or a path
 * containing '/' (a Unix socket; c->is_unix is then set), else "host:port",
 * "[v6]:port", "host" or a bare IPv6 address (TCP with TCP_NODELAY, default
 * port 7431; every address the name resolves to is tried in turn). A port
 * must be decimal digits, 1..65535 (no service names). Each attempt gives
 * up after c->timeout_ms when that is > 0. Returns 0 (c->fd set), or
 * -EINVAL or -ENAMETOOLONG for a bad address (a bad port included; nothing
 * is connected), -ENXIO for an unknown host and -ETIMEDOUT (c->err then
 * says so), or another negative errno (-ECONNREFUSED, -EAGAIN for a
 * temporary resolver failure, ...). addr is borrowed.
 */
int kvstash_wire_connect(struct kvstash *c, const char *addr);

/* kvstash_wire_deinit: close the socket, free the buffers; c itself stays the caller's. */
void kvstash_wire_deinit(struct kvstash *c);

/* ---- errors ---- */

/* kvstash_wire_errf: set c->err (truncated to KVSTASH_WIRE_ERRLEN - 1 bytes). */
void kvstash_wire_errf(struct kvstash *c, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/*
 * kvstash_wire_fail: a transport failure: break the connection, set c->err
 * to the text of rc unless it already holds a reason, and return rc.
 */
int kvstash_wire_fail(struct kvstash *c, int rc);

/* ---- socket I/O ---- */

/*
 * kvstash_wire_recv: receive up to len (> 0) bytes of the reply stream into
 * buf: over TLS when c->ssl is set; on a Unix socket, a descriptor that
 * comes along is kept for kvstash_wire_take_fd. With all set and no timeout
 * a plain socket waits for all len bytes (MSG_WAITALL), though fewer may
 * still come; otherwise it returns what has arrived. With c->timeout_ms > 0
 * it waits at most that long without progress. Returns the bytes received
 * (> 0); -ECONNRESET when the server closed the connection, -ETIMEDOUT, or
 * -EPROTO for a TLS failure (c->err says why for these three); or another
 * negative errno. Does not break the connection. buf is borrowed for the
 * call. Only the reply reader (kvstash_reply.c) calls it, and it owns
 * c->rbuf's contents.
 */
ssize_t kvstash_wire_recv(struct kvstash *c, void *buf, size_t len, bool all);

/* ---- requests ---- */

/*
 * kvstash_wire_req_begin: start a new request [0, msgid, method, [...]]
 * whose params array will hold nparams items, discarding any unsent one.
 * The kvstash_wire_req_* calls below append, in order. They cannot fail:
 * running out of memory is remembered and reported by kvstash_wire_req_send.
 * method is copied.
 */
void kvstash_wire_req_begin(struct kvstash *c, const char *method, uint32_t nparams);

/* kvstash_wire_req_array: an array header of n items (they follow). */
void kvstash_wire_req_array(struct kvstash *c, uint32_t n);

/* kvstash_wire_req_key: a key as bin (key may be NULL when klen is 0); copied. */
void kvstash_wire_req_key(struct kvstash *c, const void *key, size_t klen);

/*
 * kvstash_wire_req_value: a value as bin (val may be NULL when vlen is 0).
 * Up to 8 KiB are copied; a larger value is sent from val, which must stay
 * valid and unchanged until kvstash_wire_req_send returns.
 */
void kvstash_wire_req_value(struct kvstash *c, const void *val, size_t vlen);

/* kvstash_wire_req_uint: a non-negative integer. */
void kvstash_wire_req_uint(struct kvstash *c, uint64_t v);

/* kvstash_wire_req_str: the NUL-terminated s as str; copied. */
void kvstash_wire_req_str(struct kvstash *c, const char *s);

/* kvstash_wire_req_force: the options map {force: true}. */
void kvstash_wire_req_force(struct kvstash *c);

/* kvstash_wire_req_group_size: the options map {group_size: g}. */
void kvstash_wire_req_group_size(struct kvstash *c, uint32_t g);

/* kvstash_wire_req_bool: a bool. */
void kvstash_wire_req_bool(struct kvstash *c, bool v);

/* kvstash_wire_req_map: a map header of n entries (the caller packs them). */
void kvstash_wire_req_map(struct kvstash *c, uint32_t n);

/* kvstash_wire_req_size: the options map {size: n}. */
void kvstash_wire_req_size(struct kvstash *c, uint64_t size);

/*
 * kvstash_wire_req_fd: send fd with the request being built: it goes by
 * SCM_RIGHTS on the first sendmsg that writes any of the request's bytes,
 * never again (the rest of a partly written request goes without it). Only
 * meaningful on a Unix socket. fd is borrowed (not closed) and must stay
 * open until kvstash_wire_req_send returns; kvstash_wire_req_begin and
 * kvstash_wire_req_send forget it.
 */
void kvstash_wire_req_fd(struct kvstash *c, int fd);

/*
 * kvstash_wire_req_send: write the request built since kvstash_wire_req_begin
 * and count its msgid as sent (its reply is then owed, in order). Returns 0;
 * -ENOMEM when building it ran out of memory (nothing was sent; c->err says
 * so); or a negative errno from the socket (-EPIPE, -ECONNRESET, -ETIMEDOUT
 * after c->timeout_ms without progress, ...), when part of it may have been
 * sent. Does not break the connection itself.
 */
int kvstash_wire_req_send(struct kvstash *c);

/* ---- replies ---- */

/*
 * kvstash_wire_reply: read the next reply (replies come in request order) up
 * to its result, skipping notifications this client does not know. budget
 * bounds the reply's wire bytes; a reply that would exceed it is malformed.
 * Returns 0 with the result next to be read (by the kvstash_wire_read_*
 * calls or kvstash_wire_skip); a positive code for a request-level error
 * (the whole reply consumed, c->err holding the server's message); a
 * positive code for an error notification (c->err set, the connection
 * broken: the server is closing); -EPROTO for a malformed reply or one whose
 * msgid is not the one expected (broken); or another negative errno from the
 * socket, in which case the caller breaks the connection.
 */
int kvstash_wire_reply(struct kvstash *c, uint64_t budget);

/*
 * kvstash_wire_call: kvstash_wire_req_send then kvstash_wire_reply(budget).
 * Returns as kvstash_wire_reply, except that every negative value has broken
 * the connection but -ENOMEM from kvstash_wire_req_send, which is returned
 * as is. When the send fails otherwise, the call first looks, as
 * kvstash_wire_salvage, for the server's parting notification.
 */
int kvstash_wire_call(struct kvstash *c, uint64_t budget);

/*
 * kvstash_wire_salvage: a send failed with rc (< 0). A server that refuses
 * the connection (too many clients, a framing violation) sends an error
 * notification before it closes: read the replies already owed (and the
 * failed request's), waiting at most 200 ms for each read, to find it.
 * Returns the notification's code (> 0, c->err holding its message) or rc
 * (c->err holding the reason the send failed). Either way the connection is
 * broken.
 */
int kvstash_wire_salvage(struct kvstash *c, int rc);

/*
 * The readers below consume one item of a result (or of a result array)
 * after kvstash_wire_reply returned 0. Each returns 0; a positive code where
 * said; -EPROTO when the item is not of the expected type (broken, c->err
 * says what); or another negative errno from the socket. Outputs are
 * written only on success unless said otherwise.
 */

/* kvstash_wire_skip: consume one object of any type (arrays and maps nest <= 15 deep). */
int kvstash_wire_skip(struct kvstash *c);

/* kvstash_wire_read_uint: a non-negative integer into *v. */
int kvstash_wire_read_uint(struct kvstash *c, uint64_t *v);

/* kvstash_wire_read_code: a status code (a non-negative integer <= INT_MAX) into *code. */
int kvstash_wire_read_code(struct kvstash *c, int *code);

/* kvstash_wire_read_int: an integer of either sign (within int64_t) into *v. */
int kvstash_wire_read_int(struct kvstash *c, int64_t *v);

/* kvstash_wire_read_bool: a bool into *v. */
int kvstash_wire_read_bool(struct kvstash *c, bool *v);

/* kvstash_wire_read_array: an array header that must count exactly n elements. */
int kvstash_wire_read_array(struct kvstash *c, uint64_t n);

/*
 * kvstash_wire_read_value: a value (bin or str) or nil. With out NULL the
 * body goes straight into buf (capacity cap; buf may be NULL when cap is 0);
 * else into a malloc'd buffer stored in *out, which the caller frees (on
 * failure nothing stays allocated: *out is then NULL or untouched). Returns
 * 0 with *vlen the value's size; KVSTASH_ENOTFOUND for nil (*vlen 0);
 * KVSTASH_ETOOLARGE when the value exceeds cap or, with out set,
 * c->hello.max_value_size (*vlen the size, nothing copied, the body
 * consumed); -ENOMEM when the buffer for out could not be allocated (the
 * body consumed, c->err says so); or a negative errno as above. *vlen is set
 * whenever the value's header was read.
 */
int kvstash_wire_read_value(struct kvstash *c, void *buf, size_t cap, void **out,
                            size_t *vlen);

/* kvstash_wire_read_size: an integer into *size, or nil: KVSTASH_ENOTFOUND. */
int kvstash_wire_read_size(struct kvstash *c, uint64_t *size);

/*
 * kvstash_wire_read_hello: the map answered to hello. Known names fill the
 * matching fields of *hi (strings truncated to the field, integers only when
 * they are non-negative integers); the others are skipped. Fields the map
 * leaves out are not touched: defaults are the caller's.
 */
int kvstash_wire_read_hello(struct kvstash *c, struct kvstash_hello *hi);

/*
 * kvstash_wire_read_stats: the map answered to stats, as *n name/value pairs
 * in a malloc'd array stored in *items (NULL when there are none) that the
 * caller frees. Entries whose value is not a non-negative integer, or whose
 * name does not fit kvstash_stat.name, are left out. -ENOMEM when the array
 * could not grow (the rest of the reply is then unread). On any failure
 * nothing is allocated and *items, *n are not touched.
 */
int kvstash_wire_read_stats(struct kvstash *c, struct kvstash_stat **items, size_t *n);

/*
 * kvstash_wire_read_cluster: the map answered to cluster_info into ci (zeroed by the caller;
 * nodes, owners and nowners malloc'd, freed by kvstash_cluster_free even after a failure).
 * Unknown fields are skipped.
 */
struct kvstash_cluster;
int kvstash_wire_read_cluster(struct kvstash *c, struct kvstash_cluster *ci);

/*
 * kvstash_wire_read_places: a list of pieces [segment, offset, length]
 * (at most cap of them, each in segment 0 and inside [0, arena)) into
 * places[0..*n); or an integer code instead (put_start's
 * per-key answer), returned as is (> 0). A list longer than cap or a piece
 * outside the arena is malformed.
 */
int kvstash_wire_read_places(struct kvstash *c, uint64_t arena, struct kvstash_wire_piece *places,
                             size_t cap, size_t *n);

/*
 * kvstash_wire_read_replica: one answer of get_replica_list: nil
 * (KVSTASH_ENOTFOUND) or the map, whose pieces go through
 * kvstash_wire_read_places and whose size and lease_ms fill *size and
 * *lease_ms. Unknown names are skipped.
 */
int kvstash_wire_read_replica(struct kvstash *c, uint64_t arena, struct kvstash_wire_piece *places,
                              size_t cap, size_t *n, uint64_t *size, uint64_t *lease_ms);

/*
 * kvstash_wire_tls_start: on a connected TCP socket, the TLS handshake to
 * the server at addr (its certificate must chain to tls->ca_file and be for
 * addr's host name or IP address), presenting tls->cert_file / key_file when
 * given. 0 or -errno (c->err says why).
 */
int kvstash_wire_tls_start(struct kvstash *c, const char *addr, const struct kvstash_tls *tls);

/* kvstash_wire_read_segment: map_segment's map: its segment and size (absent: untouched). */
int kvstash_wire_read_segment(struct kvstash *c, uint64_t *segment, uint64_t *size);

/* kvstash_wire_take_fd: the descriptor the last replies brought (now the caller's), or -1. */
int kvstash_wire_take_fd(struct kvstash *c);

#pragma GCC visibility pop

#endif
