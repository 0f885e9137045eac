/*
 * config_value: the text form of one setting's value, read and written. It owns the syntax
 * of sizes (4096, 64k, 4GiB), durations (250ms, 10s, 1h), counts, decimal numbers, hex
 * digests and listen addresses (host:port, [ipv6]:port), and the formatting that conf_dump
 * and config.c's error messages use, which must read back through these parsers as the
 * same value (the config fuzzer checks that a dump loads back unchanged). It knows nothing
 * of keys, the option table or struct kv_config: config.c decides which key takes which
 * form and within which bounds. Like config.c it keeps no state, never logs and never
 * touches the network (an address is checked for shape, never resolved).
 */
#include "config.h"
#include "config_int.h"

#include <arpa/inet.h>
#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

/* ---- parsing ---- */

static bool
conf_is_digit(char ch)
{
    return ch >= '0' && ch <= '9';
}

static char
conf_lower(char ch)
{
    return (ch >= 'A' && ch <= 'Z') ? (char)(ch - 'A' + 'a') : ch;
}

/*
 * Parse a run of decimal digits at *s into *out, advancing *s. -EINVAL when there is no digit,
 * -ERANGE when the number does not fit in 64 bits.
 */
static int
conf_parse_digits(const char **s, uint64_t *out)
{
    const char *p = *s;
    uint64_t v = 0;

    if (!conf_is_digit(*p)) {
        return -EINVAL;
    }
    for (; conf_is_digit(*p); p++) {
        unsigned d = (unsigned)(*p - '0');
        if (v > (UINT64_MAX - d) / 10) {
            return -ERANGE;
        }
        v = v * 10 + d;
    }
    *s = p;
    *out = v;
    return 0;
}

/* Case-insensitive: does s equal one of the NULL-terminated words? */
static bool
conf_suffix_is(const char *s, const char *const *words)
{
    for (; *words != NULL; words++) {
        if (strcasecmp(s, *words) == 0) {
            return true;
        }
    }
    return false;
}

/* conf_parse_size, with -EINVAL for bad syntax and -ERANGE for a 64-bit overflow. */
int
conf_size_parse(const char *s, uint64_t *out)
{
    static const char *const unit_suffixes[] = {"", "b", "ib", NULL};
    uint64_t v;
    unsigned shift;
    int rc;

    rc = conf_parse_digits(&s, &v);
    if (rc != 0) {
        return rc;
    }
    switch (conf_lower(*s)) {
    case '\0':
        *out = v;
        return 0;
    case 'b':
        if (s[1] != '\0') {
            return -EINVAL;
        }
        *out = v;
        return 0;
    case 'k':
        shift = 10;
        break;
    case 'm':
        shift = 20;
        break;
    case 'g':
        shift = 30;
        break;
    case 't':
        shift = 40;
        break;
    default:
        return -EINVAL;
    }
    if (!conf_suffix_is(s + 1, unit_suffixes)) {
        return -EINVAL;
    }
    if (v > (UINT64_MAX >> shift)) {
        return -ERANGE;
    }
    *out = v << shift;
    return 0;
}

/* conf_parse_duration_ms, with -EINVAL for bad syntax and -ERANGE for a 64-bit overflow. */
int
conf_duration_parse(const char *s, uint64_t *out)
{
    uint64_t v, mul;
    int rc;

    rc = conf_parse_digits(&s, &v);
    if (rc != 0) {
        return rc;
    }
    if (*s == '\0' || strcasecmp(s, "ms") == 0) {
        mul = 1;
    } else if (strcasecmp(s, "s") == 0) {
        mul = 1000;
    } else if (strcasecmp(s, "m") == 0) {
        mul = 60 * 1000;
    } else if (strcasecmp(s, "h") == 0) {
        mul = HOUR_MS;
    } else {
        return -EINVAL;
    }
    if (v > UINT64_MAX / mul) {
        return -ERANGE;
    }
    *out = v * mul;
    return 0;
}

int
conf_uint_parse(const char *s, uint64_t *out)
{
    int rc = conf_parse_digits(&s, out);

    if (rc == 0 && *s != '\0') {
        return -EINVAL;
    }
    return rc;
}

/* A plain decimal number such as 0.85 or 85e-2 (no hex, inf, nan or surrounding space). */
int
conf_double_parse(const char *s, double *out)
{
    char *end;
    double d;

    if (*s == '\0' || strspn(s, "0123456789.eE+-") != strlen(s)) {
        return -EINVAL;
    }
    errno = 0;
    d = strtod(s, &end);
    if (end == s || *end != '\0' || errno == ERANGE) {
        return -EINVAL;
    }
    *out = d;
    return 0;
}

/* conf_hex: 2n hex digits at s into out[0..n). 0 or -1. */
int
conf_hex(const char *s, size_t slen, uint8_t *out, size_t n)
{
    if (slen != 2 * n) {
        return -1;
    }
    for (size_t i = 0; i < 2 * n; i++) {
        int v = isdigit((unsigned char)s[i]) ? s[i] - '0'
                : isxdigit((unsigned char)s[i]) ? tolower((unsigned char)s[i]) - 'a' + 10
                                                : -1;

        if (v < 0) {
            return -1;
        }
        out[i / 2] = (uint8_t)(i % 2 == 0 ? v << 4 : out[i / 2] | v);
    }
    return 0;
}

int
conf_parse_size(const char *s, uint64_t *out)
{
    return conf_size_parse(s, out) == 0 ? 0 : -1;
}

int
conf_parse_duration_ms(const char *s, uint64_t *out)
{
    return conf_duration_parse(s, out) == 0 ? 0 : -1;
}

/* ---- formatting ---- */

/* Shortest text that reads back as exactly d. */
void
conf_format_double(double d, char *buf, size_t len)
{
    for (int prec = 1; prec <= 17; prec++) {
        snprintf(buf, len, "%.*g", prec, d);
        if (strtod(buf, NULL) == d) {
            return;
        }
    }
}

/* A size in the largest binary unit that divides it exactly: 65536 -> "64k". */
void
conf_format_size(uint64_t v, char *buf, size_t len)
{
    static const char units[] = "tgmk";

    for (int i = 0; i < 4; i++) {
        unsigned shift = (unsigned)(40 - 10 * i);
        if (v != 0 && (v & ((UINT64_C(1) << shift) - 1)) == 0) {
            snprintf(buf, len, "%llu%c", (unsigned long long)(v >> shift), units[i]);
            return;
        }
    }
    snprintf(buf, len, "%llu", (unsigned long long)v);
}

/* A duration in the largest unit that divides it exactly: 10000 -> "10s". */
void
conf_format_duration(uint64_t ms, char *buf, size_t len)
{
    if (ms == 0) {
        snprintf(buf, len, "0");
    } else if (ms % HOUR_MS == 0) {
        snprintf(buf, len, "%lluh", (unsigned long long)(ms / HOUR_MS));
    } else if (ms % 60000 == 0) {
        snprintf(buf, len, "%llum", (unsigned long long)(ms / 60000));
    } else if (ms % 1000 == 0) {
        snprintf(buf, len, "%llus", (unsigned long long)(ms / 1000));
    } else {
        snprintf(buf, len, "%llums", (unsigned long long)ms);
    }
}

/* ---- listen addresses ---- */

static const char *
conf_check_port(const char *p)
{
    uint64_t port;

    if (conf_uint_parse(p, &port) != 0 || port > 65535) {
        return "bad listen port (use 0-65535)";
    }
    return NULL;
}

const char *
conf_check_listen(const char *v)
{
    char host[CONF_STR_MAX];
    const char *colon;
    size_t n;

    if (*v == '\0') {
        return NULL; /* no TCP listener */
    }
    if (*v == '[') {
        struct in6_addr a6;
        const char *close = strchr(v, ']');

        if (close == NULL || close[1] != ':') {
            return "bad listen address (use [ipv6]:port, e.g. [::1]:7431)";
        }
        n = (size_t)(close - v - 1);
        memcpy(host, v + 1, n);
        host[n] = '\0';
        if (inet_pton(AF_INET6, host, &a6) != 1) {
            return "bad IPv6 address (use e.g. [::1]:7431)";
        }
        return conf_check_port(close + 2);
    }
    colon = strrchr(v, ':');
    if (colon == NULL) {
        return "missing port (use host:port, e.g. 127.0.0.1:7431)";
    }
    n = (size_t)(colon - v);
    if (memchr(v, ':', n) != NULL) {
        return "an IPv6 address needs brackets (use e.g. [::1]:7431)";
    }
    if (n == 0) {
        return "missing host (use 0.0.0.0:port for every interface)";
    }
    memcpy(host, v, n);
    host[n] = '\0';
    if (strspn(host, "0123456789.") == n) {
        struct in_addr a4;
        if (inet_pton(AF_INET, host, &a4) != 1) {
            return "bad IPv4 address (use e.g. 127.0.0.1:7431)";
        }
    } else if (n > 253 || strspn(host, "abcdefghijklmnopqrstuvwxyz"
                                       "ABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789.-_") != n) {
        return "bad host name (use a name, an IPv4 address or [ipv6])";
    }
    return conf_check_port(colon + 1);
}
