/*
 * transport_tls: the TLS transport (transport.h): a connection's bytes
 * through an OpenSSL session on its socket. It owns that session (c->tp_data)
 * from transport_tls_open to its close, and maps what OpenSSL says onto
 * readv/writev results: a read that needs the socket writable (a handshake)
 * sets c->tp_want_write, and conn.c arms the write event. It must not arm
 * events, touch the connection's buffers or free it; the server's contexts
 * are tls.c's.
 */
#include "transport.h"

#include <errno.h>
#include <stdint.h>
#include <sys/socket.h>
#include <sys/uio.h>

#include <openssl/err.h>
#include <openssl/ssl.h>

#include "conn_int.h"
#include "kverr.h"
#include "log.h"

#define TLS_HANDSHAKE_RECORD 0x16   /* the first byte of a TLS handshake record */

int
transport_tls_open(struct conn *c, SSL *ssl)
{
    if (ssl == NULL) {
        return -1;
    }
    if (SSL_set_fd(ssl, c->fd) != 1) {
        SSL_free(ssl);
        return -1;
    }
    SSL_set_accept_state(ssl);
    c->tp_data = ssl;
    return 0;
}

/*
 * tls_result: an SSL_read/SSL_write result as read/write would give it:
 * bytes, 0 at the peer's close, or -1 with errno (EAGAIN to wait, with
 * tp_want_write set when TLS needs the socket writable).
 */
static ssize_t
tls_result(struct conn *c, int r)
{
    char why[160];

    if (r > 0) {
        return r;
    }
    switch (SSL_get_error(c->tp_data, r)) {
    case SSL_ERROR_WANT_READ:
        errno = EAGAIN;
        return -1;
    case SSL_ERROR_WANT_WRITE:
        c->tp_want_write = true;
        errno = EAGAIN;
        return -1;
    case SSL_ERROR_ZERO_RETURN:
        return 0;
    case SSL_ERROR_SYSCALL:
        if (errno == 0) {
            return 0;               /* closed without a close_notify */
        }
        return -1;
    default:
        log_info("conn %llu %s: TLS: %s", (unsigned long long)c->id, c->peer,
                 ERR_error_string(ERR_get_error(), why));
        ERR_clear_error();
        errno = EPROTO;
        return -1;
    }
}

/*
 * tls_start: the first byte must start a handshake record. OpenSSL would
 * take a plain msgpack-rpc client's first bytes for an SSLv2 header and
 * wait for kilobytes; this one is told at once, in plain text.
 */
static int
tls_start(struct conn *c)
{
    uint8_t b;
    ssize_t r = recv(c->fd, &b, 1, MSG_PEEK);

    if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) {
        return 0;
    }
    if (r == 1 && b == TLS_HANDSHAKE_RECORD) {
        c->tp_ready = true;
        return 0;
    }
    if (r == 1) {
        conn_refuse(c, KV_PROTOCOL_ERROR, "this port speaks TLS");
        log_info("conn %llu %s: not TLS on the TLS port; closing", (unsigned long long)c->id,
                 c->peer);
    }
    return -1;                      /* or the peer went away */
}

/* tls_readv: into the first buffer only; the next read fills the rest. */
static ssize_t
tls_readv(struct conn *c, struct iovec *iov, int n)
{
    (void)n;
    errno = 0;
    return tls_result(c, SSL_read(c->tp_data, iov[0].iov_base,
                                  iov[0].iov_len > INT32_MAX ? INT32_MAX : (int)iov[0].iov_len));
}

/* tls_writev: segment after segment, as far as the socket takes. */
static ssize_t
tls_writev(struct conn *c, struct iovec *iov, int n, int fd)
{
    ssize_t done = 0;

    (void)fd;
    for (int i = 0; i < n; i++) {
        size_t off = 0;

        while (off < iov[i].iov_len) {
            size_t len = iov[i].iov_len - off;
            ssize_t w;

            errno = 0;
            w = tls_result(c, SSL_write(c->tp_data, (const uint8_t *)iov[i].iov_base + off,
                                        len > INT32_MAX ? INT32_MAX : (int)len));
            if (w <= 0) {
                return done > 0 ? done : w == 0 ? -1 : w;
            }
            off += (size_t)w;
            done += w;
        }
    }
    return done;
}

static bool
tls_pending(const struct conn *c)
{
    return SSL_pending(c->tp_data) > 0;
}

static void
tls_close(struct conn *c)
{
    if (c->tp_data != NULL) {
        (void)SSL_shutdown(c->tp_data);    /* a close_notify, best effort: never waits */
        SSL_free(c->tp_data);
        ERR_clear_error();
        c->tp_data = NULL;
    }
}

const struct conn_transport transport_tls = {
    .name = "tls",
    .raw = false,
    .start = tls_start,
    .readv = tls_readv,
    .writev = tls_writev,
    .pending = tls_pending,
    .close = tls_close,
};
