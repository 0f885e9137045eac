/*
 * tls: the daemon's TLS contexts (OpenSSL). A context is built from the
 * certificate, key and optional CA files of a config (tls_cert_file,
 * tls_key_file, tls_ca_file: with a CA, client certificates are required
 * and checked); TLS 1.2 is the floor and renegotiation is off. The server
 * holds the current context and swaps in a new one on SIGHUP: connections
 * made before keep the context they were made with (OpenSSL counts the
 * references), so a reload drops none of them.
 *
 * Threads: tls_ctx_new and tls_ctx_free from any thread; an SSL_CTX is
 * thread safe for SSL_new.
 */
#ifndef KV_TLS_H
#define KV_TLS_H

#include <stddef.h>

typedef struct ssl_ctx_st SSL_CTX;

/*
 * tls_ctx_new: a server context from the PEM files cert (the chain) and key,
 * and ca ("" = no client certificates). Returns it, or NULL with err saying
 * which file and why.
 */
SSL_CTX *tls_ctx_new(const char *cert, const char *key, const char *ca, char *err, size_t errlen);

/* tls_ctx_free: drop a reference. Accepts NULL. */
void tls_ctx_free(SSL_CTX *ctx);

#endif
