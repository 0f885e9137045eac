/*
 * cluster_tls: what the pool's two TLS clients, the peers' sessions (peer_tls.c)
 * and etcd's (etcd.c), share of OpenSSL: the host a server's certificate must
 * name (OpenSSL's error text is util/tls_error.h). Must not: build contexts or
 * hold state (each client owns its SSL_CTX and its sessions).
 *
 * Threads: any; it works on one SSL.
 */
#ifndef KV_CLUSTER_TLS_H
#define KV_CLUSTER_TLS_H

#include <stddef.h>

typedef struct ssl_st SSL;

/*
 * cluster_tls_expect_host: the session ssl (not yet connected) accepts only a
 * certificate naming host (bare: no port, no brackets): an IP address among its
 * IP SANs, a name among its DNS names (a name is also sent as SNI). host is
 * borrowed (copied by OpenSSL). 0, or -EINVAL when OpenSSL refuses host.
 */
int cluster_tls_expect_host(SSL *ssl, const char *host);

#endif
