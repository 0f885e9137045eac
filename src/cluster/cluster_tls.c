/*
 * cluster_tls: the TLS helpers the pool's peer and etcd clients share (see
 * cluster_tls.h). Must not: keep state between calls.
 */
#include "cluster_tls.h"

#include <arpa/inet.h>
#include <errno.h>

#include <openssl/ssl.h>
#include <openssl/x509v3.h>

int
cluster_tls_expect_host(SSL *ssl, const char *host)
{
    struct in6_addr a;

    if (inet_pton(AF_INET, host, &a) == 1 || inet_pton(AF_INET6, host, &a) == 1) {
        return X509_VERIFY_PARAM_set1_ip_asc(SSL_get0_param(ssl), host) == 1 ? 0 : -EINVAL;
    }
    return SSL_set1_host(ssl, host) == 1 && SSL_set_tlsext_host_name(ssl, host) == 1 ? 0
                                                                                     : -EINVAL;
}
