/*
 * transport: how a connection's bytes cross its socket, as a small table of
 * functions the connection calls (in the spirit of Redis's connection.h):
 * plain TCP, the Unix socket (which also carries descriptors, SCM_RIGHTS)
 * and TLS (OpenSSL). conn.c and conn_read.c call c->tp and never ask which
 * transport they have; adding one (say, kTLS) is a new table, not branches.
 *
 * A transport moves bytes and reports what happened as readv(2) and
 * writev(2) do. It does not frame or buffer messages, arm events, account
 * bytes or free the connection: conn.c decides all that from what it
 * returns. Its state lives in struct conn (tp_data, tp_ready,
 * tp_want_write; conn_int.h).
 *
 * Threads: every function runs on the connection's worker thread, on a
 * non-blocking socket, and never blocks.
 */
#ifndef KV_TRANSPORT_H
#define KV_TRANSPORT_H

#include <stdbool.h>
#include <sys/types.h>

struct conn;
struct iovec;
typedef struct ssl_st SSL;

struct conn_transport {
    const char *name;               /* "tcp", "unix" or "tls" */
    /*
     * raw: the bytes read are the socket's own. Then FIONREAD counts what
     * is queued, and conn_read_once paces value bodies in pieces the
     * kernel's window keeps up with. False for TLS, which decrypts records.
     */
    bool raw;
    /*
     * start: called on each read event until it sets c->tp_ready (NULL:
     * the connection is ready from the start): check that the peer speaks
     * this transport. Returns 0 to go on (ready, or wait for more bytes),
     * -1 when c must close (the peer has been told why, or went away).
     */
    int (*start)(struct conn *c);
    /*
     * readv: one read from c's socket into iov[0..n) (iov borrowed; a
     * transport may fill only iov[0]: the next read takes the rest).
     * Returns as readv(2): the bytes read, 0 at the peer's close, or -1
     * with errno: EAGAIN to wait (with c->tp_want_write set when the
     * socket must be writable first), EINTR, EPROTO for a transport error
     * (logged), or the socket's errno.
     */
    ssize_t (*readv)(struct conn *c, struct iovec *iov, int n);
    /*
     * writev: write iov[0..n) (borrowed, not changed) as far as the socket
     * takes it. fd >= 0: attach descriptor fd to the first byte
     * (SCM_RIGHTS; the caller keeps it; only the Unix socket carries them,
     * TLS ignores it). Returns as writev(2): the bytes written, or -1 with
     * errno (EAGAIN, with c->tp_want_write set as for readv; EINTR; EPIPE
     * and ECONNRESET; EPROTO, logged; or errno 0 when a TLS peer closed).
     */
    ssize_t (*writev)(struct conn *c, struct iovec *iov, int n, int fd);
    /*
     * pending: whether bytes already taken from the socket wait inside the
     * transport, which the socket will not signal again (TLS). NULL: never.
     */
    bool (*pending)(const struct conn *c);
    /*
     * close: before c's socket is closed: end the session (TLS: a
     * close_notify, best effort, never waits) and free c->tp_data.
     * NULL: nothing to do.
     */
    void (*close)(struct conn *c);
};

/* TCP: readv and writev (sendmsg when a descriptor goes with the bytes). */
extern const struct conn_transport transport_tcp;

/*
 * The Unix socket: as TCP, but reads are recvmsg, and each descriptor that
 * comes with them (SCM_RIGHTS) joins c's queue (c->fdq, oldest first, with
 * the stream bytes of the read that brought it) for conn_take_fd; past
 * RPC_MAX_FDS unclaimed ones, the extra are closed at once (logged).
 */
extern const struct conn_transport transport_unix;

/*
 * TLS (transport_tls.c): OpenSSL on c's socket. Its start requires the
 * first byte to open a TLS handshake record: a peer speaking plain
 * msgpack-rpc gets the error notification in plain text (conn_refuse), and
 * closes at once.
 */
extern const struct conn_transport transport_tls;

/*
 * transport_tls_open: make c (c->fd set) a TLS server session on ssl:
 * ssl is transferred to c->tp_data (freed here on failure; NULL is
 * accepted and fails). Returns 0, or -1 when ssl is NULL or cannot take
 * the socket.
 */
int transport_tls_open(struct conn *c, SSL *ssl);

#endif
