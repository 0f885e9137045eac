/*
 * b64: standard base64 (RFC 4648 section 4: A-Z a-z 0-9 + /, '=' padding), how etcd's JSON
 * gateway carries keys and values. Pure, no allocation; any thread.
 */
#ifndef B64_H
#define B64_H

#include <stddef.h>
#include <stdint.h>

/* B64_LEN: the encoded length of n bytes (without a NUL). */
#define B64_LEN(n) (((n) + 2) / 3 * 4)

/*
 * b64_encode: in[0..n) into out[0..cap) NUL-terminated. Returns the encoded length, or -E2BIG
 * when cap < B64_LEN(n) + 1.
 */
int b64_encode(const void *in, size_t n, char *out, size_t cap);

/*
 * b64_decode: in[0..n) into out[0..cap); *outlen the decoded length. Strict: n a multiple of
 * 4, only the alphabet, '=' only as the last one or two bytes, and the bits padding leaves
 * over zero. Returns 0, -EINVAL for any other input, -E2BIG when out is too small.
 */
int b64_decode(const char *in, size_t n, uint8_t *out, size_t cap, size_t *outlen);

#endif
