/*
 * peer_tls: the peer pool's TLS sessions (peer_tls.h). Must not: touch
 * peer.c's connections or queues, block (the socket is non-blocking: every
 * wait comes back as -EAGAIN), or log a session's bytes.
 */
#include "peer_tls.h"

#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/uio.h>

#include <openssl/err.h>
#include <openssl/ssl.h>

#define PEER_TLS_CHUNK (16u * 1024u)    /* SSL_write takes one record's worth at a time */

struct peer_tls_ctx {
    SSL_CTX *ssl;
};

struct peer_tls {
    SSL *ssl;
    char why[160];                  /* OpenSSL's reason for the last -EPROTO */
};

static const char *
peer_tls_why(char *buf, size_t len)
{
    unsigned long e = ERR_get_error();

    if (e == 0) {
        snprintf(buf, len, "unknown error");
    } else {
        ERR_error_string_n(e, buf, len);
    }
    ERR_clear_error();
    return buf;
}

int
peer_tls_ctx_new(const char *cert, const char *key, const char *ca,
                 struct peer_tls_ctx **out, char *err, size_t errlen)
{
    char why[256];
    struct peer_tls_ctx *c = calloc(1, sizeof(*c));

    if (c == NULL || (c->ssl = SSL_CTX_new(TLS_client_method())) == NULL) {
        free(c);
        snprintf(err, errlen, "TLS: cannot create the peers' context");
        return -ENOMEM;
    }
    SSL_CTX_set_min_proto_version(c->ssl, TLS1_2_VERSION);
    SSL_CTX_set_options(c->ssl, SSL_OP_NO_RENEGOTIATION);
    SSL_CTX_set_mode(c->ssl, SSL_MODE_ENABLE_PARTIAL_WRITE | SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER);
    if (SSL_CTX_use_certificate_chain_file(c->ssl, cert) != 1) {
        snprintf(err, errlen, "tls_cert_file %s: %s", cert, peer_tls_why(why, sizeof(why)));
        goto fail;
    }
    if (SSL_CTX_use_PrivateKey_file(c->ssl, key, SSL_FILETYPE_PEM) != 1
        || SSL_CTX_check_private_key(c->ssl) != 1) {
        snprintf(err, errlen, "tls_key_file %s: %s", key, peer_tls_why(why, sizeof(why)));
        goto fail;
    }
    if (ca[0] != '\0') {
        if (SSL_CTX_load_verify_locations(c->ssl, ca, NULL) != 1) {
            snprintf(err, errlen, "tls_ca_file %s: %s", ca, peer_tls_why(why, sizeof(why)));
            goto fail;
        }
        SSL_CTX_set_verify(c->ssl, SSL_VERIFY_PEER, NULL);
    } else {
        SSL_CTX_set_verify(c->ssl, SSL_VERIFY_NONE, NULL);
    }
    *out = c;
    return 0;
fail:
    peer_tls_ctx_free(c);
    return -EINVAL;
}

void
peer_tls_ctx_free(struct peer_tls_ctx *ctx)
{
    if (ctx != NULL) {
        SSL_CTX_free(ctx->ssl);
        free(ctx);
    }
}

int
peer_tls_open(struct peer_tls_ctx *ctx, int fd, struct peer_tls **out)
{
    struct peer_tls *t = calloc(1, sizeof(*t));

    if (t == NULL || (t->ssl = SSL_new(ctx->ssl)) == NULL) {
        free(t);
        return -ENOMEM;
    }
    if (SSL_set_fd(t->ssl, fd) != 1) {
        SSL_free(t->ssl);
        free(t);
        return -ENOMEM;
    }
    SSL_set_connect_state(t->ssl);
    *out = t;
    return 0;
}

void
peer_tls_close(struct peer_tls *t)
{
    if (t == NULL) {
        return;
    }
    if (SSL_is_init_finished(t->ssl)) {
        (void)SSL_shutdown(t->ssl);     /* close_notify; no wait for the peer's */
    }
    SSL_free(t->ssl);
    ERR_clear_error();
    free(t);
}

/* peer_tls_result: r from SSL_do_handshake/read/write as -errno (0: the peer closed). */
static int
peer_tls_result(struct peer_tls *t, int r, bool *want_write)
{
    int e = SSL_get_error(t->ssl, r);
    int saved = errno;

    switch (e) {
    case SSL_ERROR_WANT_READ:
        *want_write = false;
        return -EAGAIN;
    case SSL_ERROR_WANT_WRITE:
        *want_write = true;
        return -EAGAIN;
    case SSL_ERROR_ZERO_RETURN:
        return 0;
    case SSL_ERROR_SYSCALL:
        ERR_clear_error();
        return saved != 0 ? -saved : -ECONNRESET;
    default:
        return -EPROTO;
    }
}

int
peer_tls_handshake(struct peer_tls *t, bool *want_write, char *err, size_t errlen)
{
    int r = SSL_do_handshake(t->ssl);
    long vr;

    if (r == 1) {
        return 0;
    }
    errno = 0;
    r = peer_tls_result(t, r, want_write);
    if (r == -EPROTO) {
        char why[256];

        vr = SSL_get_verify_result(t->ssl);
        if (vr != X509_V_OK) {
            snprintf(err, errlen, "its certificate: %s", X509_verify_cert_error_string(vr));
            ERR_clear_error();
        } else {
            snprintf(err, errlen, "%s", peer_tls_why(why, sizeof(why)));
        }
    } else if (r == 0) {
        r = -ECONNRESET;            /* closed during the handshake */
    }
    return r;
}

ssize_t
peer_tls_read(struct peer_tls *t, void *buf, size_t len)
{
    bool ww;
    int r;

    errno = 0;
    r = SSL_read(t->ssl, buf, len > INT32_MAX ? INT32_MAX : (int)len);
    if (r > 0) {
        return r;
    }
    r = peer_tls_result(t, r, &ww);
    if (r == -EPROTO) {
        peer_tls_why(t->why, sizeof(t->why));
    }
    return r;
}

const char *
peer_tls_error(const struct peer_tls *t)
{
    return t->why;
}

ssize_t
peer_tls_writev(struct peer_tls *t, const struct iovec *iov, int n)
{
    size_t done = 0;

    for (int i = 0; i < n; i++) {
        size_t off = 0;

        while (off < iov[i].iov_len) {
            size_t want = iov[i].iov_len - off;
            bool ww;
            int r;

            errno = 0;
            r = SSL_write(t->ssl, (const char *)iov[i].iov_base + off,
                          (int)(want > PEER_TLS_CHUNK ? PEER_TLS_CHUNK : want));
            if (r <= 0) {
                r = peer_tls_result(t, r, &ww);
                if (r == -EPROTO) {
                    peer_tls_why(t->why, sizeof(t->why));
                }
                if (done > 0 && r == -EAGAIN) {
                    return (ssize_t)done;
                }
                return r == 0 ? -ECONNRESET : r;
            }
            off += (size_t)r;
            done += (size_t)r;
        }
    }
    return (ssize_t)done;
}
