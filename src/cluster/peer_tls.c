/*
 * peer_tls: the peer pool's TLS sessions (peer_tls.h). Must not: touch
 * peer.c's connections or queues, block (the socket is non-blocking: every
 * wait comes back as -EAGAIN), or log a session's bytes.
 */
#include "peer_tls.h"

#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/uio.h>

#include <openssl/err.h>
#include <openssl/ssl.h>

#include "cluster_tls.h"
#include "tls_error.h"

#define PEER_TLS_CHUNK (16u * 1024u)    /* SSL_write takes one record's worth at a time */

struct peer_tls_ctx {
    pthread_mutex_t lock;           /* guards ssl: swapped by a reload, read by each open */
    SSL_CTX *ssl;                   /* a session holds its own reference (SSL_new) */
    bool verify;                    /* tls_ca_file set: peers' certificates are checked */
};

/* Handshakes this process refused for the peer's certificate (relaxed atomics). */
static uint64_t peer_tls_refused_name, peer_tls_refused_chain;

struct peer_tls {
    SSL *ssl;
    char why[160];                  /* OpenSSL's reason for the last -EPROTO */
};

/* peer_tls_ssl_new: a client SSL_CTX of these files into *out; 0 or -errno, err set. */
static int
peer_tls_ssl_new(const char *cert, const char *key, const char *ca, SSL_CTX **out, char *err,
                 size_t errlen)
{
    char why[256];
    SSL_CTX *ssl = SSL_CTX_new(TLS_client_method());

    if (ssl == NULL) {
        snprintf(err, errlen, "TLS: cannot create the peers' context");
        return -ENOMEM;
    }
    SSL_CTX_set_min_proto_version(ssl, TLS1_2_VERSION);
    SSL_CTX_set_options(ssl, SSL_OP_NO_RENEGOTIATION);
    SSL_CTX_set_mode(ssl, SSL_MODE_ENABLE_PARTIAL_WRITE | SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER);
    if (SSL_CTX_use_certificate_chain_file(ssl, cert) != 1) {
        snprintf(err, errlen, "tls_cert_file %s: %s", cert, tls_error(why, sizeof(why)));
        goto fail;
    }
    if (SSL_CTX_use_PrivateKey_file(ssl, key, SSL_FILETYPE_PEM) != 1
        || SSL_CTX_check_private_key(ssl) != 1) {
        snprintf(err, errlen, "tls_key_file %s: %s", key, tls_error(why, sizeof(why)));
        goto fail;
    }
    if (ca[0] != '\0') {
        if (SSL_CTX_load_verify_locations(ssl, ca, NULL) != 1) {
            snprintf(err, errlen, "tls_ca_file %s: %s", ca, tls_error(why, sizeof(why)));
            goto fail;
        }
        SSL_CTX_set_verify(ssl, SSL_VERIFY_PEER, NULL);
    } else {
        SSL_CTX_set_verify(ssl, SSL_VERIFY_NONE, NULL);
    }
    *out = ssl;
    return 0;
fail:
    SSL_CTX_free(ssl);
    return -EINVAL;
}

int
peer_tls_ctx_new(const char *cert, const char *key, const char *ca,
                 struct peer_tls_ctx **out, char *err, size_t errlen)
{
    struct peer_tls_ctx *c = calloc(1, sizeof(*c));
    int rc;

    if (c == NULL) {
        snprintf(err, errlen, "TLS: cannot create the peers' context");
        return -ENOMEM;
    }
    rc = peer_tls_ssl_new(cert, key, ca, &c->ssl, err, errlen);
    if (rc != 0) {
        free(c);
        return rc;
    }
    c->verify = ca[0] != '\0';
    pthread_mutex_init(&c->lock, NULL);
    *out = c;
    return 0;
}

int
peer_tls_ctx_reload(struct peer_tls_ctx *ctx, const char *cert, const char *key, const char *ca,
                    char *err, size_t errlen)
{
    SSL_CTX *ssl, *old;
    int rc = peer_tls_ssl_new(cert, key, ca, &ssl, err, errlen);

    if (rc != 0) {
        return rc;
    }
    pthread_mutex_lock(&ctx->lock);
    old = ctx->ssl;
    ctx->ssl = ssl;
    ctx->verify = ca[0] != '\0';
    pthread_mutex_unlock(&ctx->lock);
    SSL_CTX_free(old);              /* sessions made from it keep their own reference */
    return 0;
}

void
peer_tls_ctx_free(struct peer_tls_ctx *ctx)
{
    if (ctx != NULL) {
        SSL_CTX_free(ctx->ssl);
        pthread_mutex_destroy(&ctx->lock);
        free(ctx);
    }
}

/*
 * peer_tls_expect_host: the peer's certificate must name the host of addr ("host:port" or
 * "[v6]:port"): an IP address among its IP SANs, a name among its DNS names (and sent as
 * SNI). 0, or -EINVAL for an address without a host.
 */
static int
peer_tls_expect_host(SSL *ssl, const char *addr)
{
    const char *colon = strrchr(addr, ':');
    char host[256];
    size_t n;

    if (colon == NULL || colon == addr) {
        return -EINVAL;
    }
    n = (size_t)(colon - addr);
    if (addr[0] == '[' && n >= 2 && addr[n - 1] == ']') {
        addr++;
        n -= 2;
    }
    if (n == 0 || n >= sizeof(host)) {
        return -EINVAL;
    }
    memcpy(host, addr, n);
    host[n] = '\0';
    return cluster_tls_expect_host(ssl, host);
}

int
peer_tls_open(struct peer_tls_ctx *ctx, int fd, const char *host, struct peer_tls **out)
{
    struct peer_tls *t = calloc(1, sizeof(*t));
    bool verify;

    if (t == NULL) {
        return -ENOMEM;
    }
    pthread_mutex_lock(&ctx->lock);
    t->ssl = SSL_new(ctx->ssl);
    verify = ctx->verify;
    pthread_mutex_unlock(&ctx->lock);
    if (t->ssl == NULL) {
        free(t);
        return -ENOMEM;
    }
    if (verify && peer_tls_expect_host(t->ssl, host) != 0) {
        SSL_free(t->ssl);
        free(t);
        return -EINVAL;
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
            bool name = vr == X509_V_ERR_HOSTNAME_MISMATCH || vr == X509_V_ERR_IP_ADDRESS_MISMATCH;

            __atomic_add_fetch(name ? &peer_tls_refused_name : &peer_tls_refused_chain, 1,
                               __ATOMIC_RELAXED);
            snprintf(err, errlen, "its certificate: %s%s", X509_verify_cert_error_string(vr),
                     name ? " (it does not name the host of the peer's peer_advertise)" : "");
            ERR_clear_error();
        } else {
            snprintf(err, errlen, "%s", tls_error(why, sizeof(why)));
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
        tls_error(t->why, sizeof(t->why));
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
                    tls_error(t->why, sizeof(t->why));
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

void
peer_tls_stats(struct peer_tls_stats *out)
{
    out->refused_name = __atomic_load_n(&peer_tls_refused_name, __ATOMIC_RELAXED);
    out->refused_chain = __atomic_load_n(&peer_tls_refused_chain, __ATOMIC_RELAXED);
}
