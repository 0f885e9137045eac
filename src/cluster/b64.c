/*
 * b64: RFC 4648 base64, strict on decode (etcd's gateway writes canonical base64, so
 * anything else is refused rather than guessed at).
 */
#include "b64.h"

#include <errno.h>

static const char b64_alphabet[] =
    "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

int
b64_encode(const void *in, size_t n, char *out, size_t cap)
{
    const uint8_t *p = in;
    size_t o = 0;

    if (n > (SIZE_MAX - 3) / 4 * 3 - 3 || cap < B64_LEN(n) + 1) {
        return -E2BIG;
    }
    for (size_t i = 0; i < n; i += 3) {
        uint32_t v = (uint32_t)p[i] << 16;
        size_t left = n - i;

        if (left > 1) {
            v |= (uint32_t)p[i + 1] << 8;
        }
        if (left > 2) {
            v |= p[i + 2];
        }
        out[o++] = b64_alphabet[(v >> 18) & 63];
        out[o++] = b64_alphabet[(v >> 12) & 63];
        out[o++] = left > 1 ? b64_alphabet[(v >> 6) & 63] : '=';
        out[o++] = left > 2 ? b64_alphabet[v & 63] : '=';
    }
    out[o] = '\0';
    return (int)o;
}

static int
b64_value(unsigned char c)
{
    if (c >= 'A' && c <= 'Z') {
        return c - 'A';
    }
    if (c >= 'a' && c <= 'z') {
        return c - 'a' + 26;
    }
    if (c >= '0' && c <= '9') {
        return c - '0' + 52;
    }
    return c == '+' ? 62 : c == '/' ? 63 : -1;
}

int
b64_decode(const char *in, size_t n, uint8_t *out, size_t cap, size_t *outlen)
{
    size_t o = 0;

    if (n % 4 != 0) {
        return -EINVAL;
    }
    for (size_t i = 0; i < n; i += 4) {
        int v[4], pad = 0;
        uint32_t w;

        for (int j = 0; j < 4; j++) {
            unsigned char c = (unsigned char)in[i + (size_t)j];

            if (c == '=' && i + 4 == n && j >= 2) {
                v[j] = 0;
                pad++;
                continue;
            }
            v[j] = pad > 0 ? -1 : b64_value(c);   /* nothing after '=' but '=' */
            if (v[j] < 0) {
                return -EINVAL;
            }
        }
        w = (uint32_t)v[0] << 18 | (uint32_t)v[1] << 12 | (uint32_t)v[2] << 6 | (uint32_t)v[3];
        if ((pad == 1 && (w & 0xff) != 0) || (pad == 2 && (w & 0xffff) != 0)) {
            return -EINVAL;                        /* non-canonical leftover bits */
        }
        if (cap - o < (size_t)(3 - pad) || o > cap) {
            return -E2BIG;
        }
        out[o++] = (uint8_t)(w >> 16);
        if (pad < 2) {
            out[o++] = (uint8_t)(w >> 8);
        }
        if (pad < 1) {
            out[o++] = (uint8_t)w;
        }
    }
    *outlen = o;
    return 0;
}
