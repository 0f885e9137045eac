/*
 * kverr: names and descriptions of the status codes declared in kverr.h.
 * Owns nothing but two static tables (and a formatter for error buffers);
 * must not depend on any other module.
 */
#include "kverr.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

static const char *const kv_names[KV_CODE_MAX + 1] = {
    "OK", "NOT_FOUND", "EXISTS", "BUSY", "NO_SPACE", "TOO_LARGE", "INVALID_ARGUMENT",
    "METHOD_NOT_FOUND", "PROTOCOL_ERROR", "UNAUTHORIZED", "FORBIDDEN", "QUOTA_EXCEEDED",
    "CHECKSUM_MISMATCH", "TIMEOUT", "UNAVAILABLE", "UNSUPPORTED", "INTERNAL",
};

static const char *const kv_texts[KV_CODE_MAX + 1] = {
    "success",
    "no such key",
    "key already stored",
    "key is being written, read or leased",
    "no space left in the store",
    "key or value exceeds the configured limit",
    "invalid argument",
    "no such method",
    "malformed or oversized message",
    "authentication required or failed",
    "operation not permitted",
    "tenant quota exceeded",
    "stored data failed its checksum",
    "operation timed out",
    "service unavailable",
    "not supported by this build or configuration",
    "internal error",
};

const char *
kv_errname(int status)
{
    if (status < 0) {
        return kv_names[KV_INTERNAL];
    }
    if (status > KV_CODE_MAX) {
        return "UNKNOWN";
    }
    return kv_names[status];
}

const char *
kv_strerror(int status)
{
    static _Thread_local char buf[128];

    if (status < 0) {
        /* strerror_r (XSI or GNU) differs by feature macros; strerror into a copy is enough. */
        const char *s = strerror(-status);
        size_t n = strlen(s);
        if (n >= sizeof(buf)) {
            n = sizeof(buf) - 1;
        }
        memcpy(buf, s, n);
        buf[n] = '\0';
        return buf;
    }
    if (status > KV_CODE_MAX) {
        return "unknown status";
    }
    return kv_texts[status];
}

int
kv_wire_code(int status)
{
    if (status < 0 || status > KV_CODE_MAX) {
        return KV_INTERNAL;
    }
    return status;
}

void
kv_errorf(char *err, size_t errlen, const char *fmt, ...)
{
    va_list ap;

    if (err == NULL || errlen == 0) {
        return;
    }
    va_start(ap, fmt);
    vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
}
