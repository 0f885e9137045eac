/*
 * tls_error: OpenSSL's error queue as text (see tls_error.h). Must not: keep state.
 */
#include "tls_error.h"

#include <stdio.h>

#include <openssl/err.h>

const char *
tls_error(char *buf, size_t len)
{
    unsigned long e = ERR_get_error();

    if (e == 0) {
        snprintf(buf, len, "unknown TLS error");
    } else {
        ERR_error_string_n(e, buf, len);
    }
    ERR_clear_error();
    return buf;
}
