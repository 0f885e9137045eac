/*
 * kverr: the one status space of kvstash.
 *
 * Every fallible function returns an int: 0 on success, a positive KV_* code
 * from the enum below, or a negative errno for a system failure. The positive
 * codes are also the wire error codes of the protocol (protocol/SPEC.md), so
 * their numbers never change. This header has no dependencies; storage,
 * protocol and the daemon all include it.
 */
#ifndef KVERR_H
#define KVERR_H

#include <stddef.h>

enum kv_code {
    KV_OK = 0,
    KV_NOT_FOUND = 1,
    KV_EXISTS = 2,
    KV_BUSY = 3,
    KV_NO_SPACE = 4,
    KV_TOO_LARGE = 5,
    KV_INVALID_ARGUMENT = 6,
    KV_METHOD_NOT_FOUND = 7,
    KV_PROTOCOL_ERROR = 8,
    KV_UNAUTHORIZED = 9,
    KV_FORBIDDEN = 10,
    KV_QUOTA_EXCEEDED = 11,
    KV_CHECKSUM_MISMATCH = 12,
    KV_TIMEOUT = 13,
    KV_UNAVAILABLE = 14,
    KV_UNSUPPORTED = 15,
    KV_INTERNAL = 16,
    KV_CODE_MAX = 16
};

/*
 * kv_errname: the wire name of a status ("NOT_FOUND", "INVALID_ARGUMENT").
 * A negative errno maps to "INTERNAL"; an unknown positive code to "UNKNOWN".
 * Returns a static string.
 */
const char *kv_errname(int status);

/*
 * kv_strerror: a human description of a status: the KV_* meaning, or
 * strerror(-status) for a negative errno. Returns a static string (thread
 * safe: strerror results are copied into a thread-local buffer).
 */
const char *kv_strerror(int status);

/*
 * kv_wire_code: the code to put on the wire for a status: the KV_* code
 * itself, or KV_INTERNAL for a negative errno.
 */
int kv_wire_code(int status);

/*
 * kv_errorf: printf into the caller's error buffer err[errlen]; nothing when
 * err is NULL or errlen is 0. For functions that explain a failure in words.
 */
void kv_errorf(char *err, size_t errlen, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

#endif
