/*
 * tls_error: OpenSSL's last error as text, for every TLS user of the daemon (its own
 * contexts in src/tls.c, the pool's peer and etcd clients in src/cluster/). A leaf: it
 * includes nothing of the project, and only its .c includes OpenSSL.
 *
 * Threads: any; it reads and clears the calling thread's OpenSSL error queue.
 */
#ifndef KV_TLS_ERROR_H
#define KV_TLS_ERROR_H

#include <stddef.h>

/*
 * tls_error: the last OpenSSL error of this thread as text into buf (len bytes; "unknown
 * TLS error" when the queue is empty), then the queue cleared. Returns buf.
 */
const char *tls_error(char *buf, size_t len);

#endif
