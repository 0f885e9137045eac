/*
 * peer_tls: TLS on the peer pool's outbound connections (peer.c), when this
 * member has certificates (tls_cert_file, tls_key_file) and the peer
 * advertises a TLS listener. One client context per pool: this member's
 * certificate chain and key (presented when the peer asks: a peer with
 * tls_ca_file requires it), TLS 1.2 at least, renegotiation off; with
 * tls_ca_file here the peer's certificate must chain to those CAs and name
 * the host of the peer's peer_advertise (an IP address among its IP SANs, a
 * name among its DNS names), without it the session is encrypted but the
 * peer is not verified. A session maps OpenSSL's results onto
 * read/write-like ones for peer.c's non-blocking loop.
 *
 * Threads: the context is made once (peer_pool_create), its files read again
 * by peer_tls_ctx_reload (any thread: new sessions get the new files, open
 * ones keep theirs), and freed at the pool's end; a session is used by the
 * pool's thread only. The counters are any thread's.
 */
#ifndef PEER_TLS_H
#define PEER_TLS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

struct iovec;
struct peer_tls_ctx;
struct peer_tls;

/*
 * peer_tls_ctx_new: the client context from the PEM files cert, key and ca ("" = no
 * verification of peers). Returns 0 and *out, or -EINVAL with the reason in err.
 */
int peer_tls_ctx_new(const char *cert, const char *key, const char *ca,
                     struct peer_tls_ctx **out, char *err, size_t errlen);

/*
 * peer_tls_ctx_reload: read the files again (SIGHUP); sessions opened from now on use them,
 * open ones keep the old. 0, or -EINVAL with the reason in err (ctx unchanged).
 */
int peer_tls_ctx_reload(struct peer_tls_ctx *ctx, const char *cert, const char *key,
                        const char *ca, char *err, size_t errlen);

/* peer_tls_ctx_free: NULL ok. */
void peer_tls_ctx_free(struct peer_tls_ctx *ctx);

/*
 * peer_tls_open: a client session on the connected (or connecting) socket fd to the member
 * whose peer_advertise is addr ("host:port"; borrowed): with tls_ca_file its certificate
 * must name that host. 0, -ENOMEM, or -EINVAL (addr has no host).
 */
int peer_tls_open(struct peer_tls_ctx *ctx, int fd, const char *addr, struct peer_tls **out);

/* peer_tls_close: send close_notify (best effort) and free the session; the fd stays open. NULL ok. */
void peer_tls_close(struct peer_tls *t);

/*
 * peer_tls_handshake: one step. 0 done; -EAGAIN to be called again when the socket is
 * readable (*want_write false) or writable (true); -EPROTO (the reason in err: a
 * certificate refused, not TLS) or -errno.
 */
int peer_tls_handshake(struct peer_tls *t, bool *want_write, char *err, size_t errlen);

/* Handshakes refused for the peer's certificate, since start. */
struct peer_tls_stats {
    uint64_t refused_name;          /* chained to the CAs but not for the peer's host */
    uint64_t refused_chain;         /* not chained to the CAs (or expired, ...) */
};

/* peer_tls_stats: fill out; any thread. */
void peer_tls_stats(struct peer_tls_stats *out);

/* peer_tls_error: OpenSSL's reason for the session's last -EPROTO ("" before one). */
const char *peer_tls_error(const struct peer_tls *t);

/* peer_tls_read: as read(2) but returns -errno: bytes, 0 at the peer's close, -EAGAIN, -EPROTO. */
ssize_t peer_tls_read(struct peer_tls *t, void *buf, size_t len);

/*
 * peer_tls_writev: as writev(2) but returns -errno: the bytes taken (a prefix of iov),
 * -EAGAIN when none could be, -EPROTO. After -EAGAIN the same bytes must be offered again
 * first (they may start at another address).
 */
ssize_t peer_tls_writev(struct peer_tls *t, const struct iovec *iov, int n);

#endif
