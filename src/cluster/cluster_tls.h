/*
 * cluster_tls: the OpenSSL pieces the pool's two TLS clients share, the peers'
 * sessions (peer_tls.c) and etcd's (etcd.c): the last error as text, and the
 * host a server's certificate must name. Must not: build contexts or hold
 * state (each client owns its SSL_CTX and its sessions).
 *
 * Threads: any; both work on the calling thread's error queue or on one SSL.
 */
#ifndef KV_CLUSTER_TLS_H
#define KV_CLUSTER_TLS_H

#include <stddef.h>

typedef struct ssl_st SSL;

/*
 * cluster_tls_why: the last OpenSSL error of this thread as text into buf
 * (len bytes, "unknown error" when the queue is empty); the queue is cleared.
 * Returns buf.
 */
const char *cluster_tls_why(char *buf, size_t len);

/*
 * cluster_tls_expect_host: the session ssl (not yet connected) accepts only a
 * certificate naming host (bare: no port, no brackets): an IP address among its
 * IP SANs, a name among its DNS names (a name is also sent as SNI). host is
 * borrowed (copied by OpenSSL). 0, or -EINVAL when OpenSSL refuses host.
 */
int cluster_tls_expect_host(SSL *ssl, const char *host);

#endif
