/*
 * json: a small bounded JSON reader and the one encoding helper the etcd client needs
 * (etcd's v3 JSON gateway, docs/cluster.md). No allocation: json_parse fills the caller's
 * token array (jsmn-style: each token is a span of the text), and the accessors read the
 * text through it. Input is untrusted (any peer could answer on etcd's port): every length
 * is bounded, nesting is limited to JSON_DEPTH_MAX, and a document is either fully valid
 * JSON (RFC 8259; no trailing bytes but whitespace) or refused. Pure; any thread.
 */
#ifndef JSON_H
#define JSON_H

#include <stddef.h>
#include <stdint.h>

#define JSON_DEPTH_MAX 32

enum json_type { JSON_OBJECT = 1, JSON_ARRAY, JSON_STRING, JSON_NUMBER, JSON_TRUE, JSON_FALSE,
                 JSON_NULL };

/*
 * One value. start/end: the span in the text (a string's without its quotes). count: an
 * object's members or an array's elements (an object's tokens alternate key, value). next:
 * the index of the first token after this value's whole subtree (its next sibling).
 */
struct json_tok {
    enum json_type type;
    uint32_t start, end;
    uint32_t count;
    uint32_t next;
};

/*
 * json_parse: text[0..len) into toks[0..cap), the root first. Returns the number of tokens
 * (> 0), or -EINVAL for anything that is not one valid JSON value, -E2BIG when it needs more
 * than cap tokens or nests deeper than JSON_DEPTH_MAX, -EOVERFLOW when len is 4 GiB or more.
 */
int json_parse(const char *text, size_t len, struct json_tok *toks, uint32_t cap);

/*
 * json_get: the value of member key (exact bytes, compared after unescaping) of the object
 * at toks[obj], or -1 (not an object, or no such member). The first match wins.
 */
int json_get(const char *text, const struct json_tok *toks, int obj, const char *key);

/* json_at: the token index of element i of the array at toks[arr], or -1. */
int json_at(const struct json_tok *toks, int arr, uint32_t i);

/*
 * json_str: the string at toks[i], unescaped (\uXXXX to UTF-8, surrogate pairs joined), into
 * out[0..cap) NUL-terminated. Returns its length, or -EINVAL (not a string, a lone
 * surrogate, or a \u0000 inside), -E2BIG when it needs cap bytes or more.
 */
int json_str(const char *text, const struct json_tok *toks, int i, char *out, size_t cap);

/*
 * json_u64: the unsigned integer at toks[i], given as a number (123) or, etcd's way for
 * 64-bit values, a string of decimal digits ("123"), into *out. -EINVAL for anything else
 * (a sign, a fraction, an exponent, empty), -ERANGE past 2^64 - 1. i < 0: -ENOENT.
 */
int json_u64(const char *text, const struct json_tok *toks, int i, uint64_t *out);

/* json_double: the number at toks[i] (or a numeric string) into *out; -EINVAL, -ENOENT. */
int json_double(const char *text, const struct json_tok *toks, int i, double *out);

/*
 * json_quote: s as a JSON string with its quotes ("a\"b"), escaping '"', '\\' and control
 * bytes (other bytes are copied: the caller passes UTF-8), into out[0..cap) NUL-terminated.
 * Returns the length, or -E2BIG when it does not fit.
 */
int json_quote(const char *s, char *out, size_t cap);

#endif
