/*
 * tls: building the server's OpenSSL context (see tls.h).
 */
#include "tls.h"

#include "tls_error.h"

#include <openssl/ssl.h>
#include <stdio.h>

SSL_CTX *
tls_ctx_new(const char *cert, const char *key, const char *ca, char *err, size_t errlen)
{
    char why[256];
    SSL_CTX *ctx = SSL_CTX_new(TLS_server_method());

    if (ctx == NULL) {
        snprintf(err, errlen, "TLS: cannot create a context: %s", tls_error(why, sizeof(why)));
        return NULL;
    }
    SSL_CTX_set_min_proto_version(ctx, TLS1_2_VERSION);
    SSL_CTX_set_options(ctx, SSL_OP_NO_RENEGOTIATION | SSL_OP_CIPHER_SERVER_PREFERENCE);
    SSL_CTX_set_mode(ctx, SSL_MODE_ENABLE_PARTIAL_WRITE | SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER);
    if (SSL_CTX_use_certificate_chain_file(ctx, cert) != 1) {
        snprintf(err, errlen, "tls_cert_file %s: %s", cert, tls_error(why, sizeof(why)));
        goto fail;
    }
    if (SSL_CTX_use_PrivateKey_file(ctx, key, SSL_FILETYPE_PEM) != 1) {
        snprintf(err, errlen, "tls_key_file %s: %s", key, tls_error(why, sizeof(why)));
        goto fail;
    }
    if (SSL_CTX_check_private_key(ctx) != 1) {
        snprintf(err, errlen, "tls_key_file %s does not match tls_cert_file %s", key, cert);
        goto fail;
    }
    if (ca[0] != '\0') {
        if (SSL_CTX_load_verify_locations(ctx, ca, NULL) != 1) {
            snprintf(err, errlen, "tls_ca_file %s: %s", ca, tls_error(why, sizeof(why)));
            goto fail;
        }
        SSL_CTX_set_verify(ctx, SSL_VERIFY_PEER | SSL_VERIFY_FAIL_IF_NO_PEER_CERT, NULL);
    }
    return ctx;

fail:
    SSL_CTX_free(ctx);
    return NULL;
}

void
tls_ctx_free(SSL_CTX *ctx)
{
    SSL_CTX_free(ctx);
}
