/*
 * json: a recursive-descent validator that records one token per value (jsmn's idea, with
 * full validation), and accessors over those tokens. Depth and token count are bounded by
 * the caller's array and JSON_DEPTH_MAX, so hostile input costs at most O(len) time and no
 * memory. Nothing here allocates or keeps state.
 */
#include "json.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

struct json_parser {
    const char *s;
    uint32_t len, pos;
    struct json_tok *toks;
    uint32_t cap, n;
};

static void
json_ws(struct json_parser *p)
{
    while (p->pos < p->len) {
        char c = p->s[p->pos];

        if (c != ' ' && c != '\t' && c != '\n' && c != '\r') {
            return;
        }
        p->pos++;
    }
}

static int
json_hex4(const char *s, uint32_t *out)
{
    uint32_t v = 0;

    for (int i = 0; i < 4; i++) {
        char c = s[i];

        v <<= 4;
        if (c >= '0' && c <= '9') {
            v |= (uint32_t)(c - '0');
        } else if (c >= 'a' && c <= 'f') {
            v |= (uint32_t)(c - 'a' + 10);
        } else if (c >= 'A' && c <= 'F') {
            v |= (uint32_t)(c - 'A' + 10);
        } else {
            return -1;
        }
    }
    *out = v;
    return 0;
}

/* A string at p->pos (the opening quote): its span without quotes. */
static int
json_string(struct json_parser *p, uint32_t *start, uint32_t *end)
{
    p->pos++;
    *start = p->pos;
    while (p->pos < p->len) {
        unsigned char c = (unsigned char)p->s[p->pos];
        uint32_t u;

        if (c == '"') {
            *end = p->pos++;
            return 0;
        }
        if (c < 0x20) {
            return -EINVAL;
        }
        if (c != '\\') {
            p->pos++;
            continue;
        }
        if (p->pos + 1 >= p->len) {
            return -EINVAL;
        }
        c = (unsigned char)p->s[p->pos + 1];
        if (c == 'u') {
            if (p->len - p->pos < 6 || json_hex4(p->s + p->pos + 2, &u) != 0) {
                return -EINVAL;
            }
            p->pos += 6;
        } else if (strchr("\"\\/bfnrt", c) != NULL && c != '\0') {
            p->pos += 2;
        } else {
            return -EINVAL;
        }
    }
    return -EINVAL;
}

static int
json_number(struct json_parser *p)
{
    uint32_t i = p->pos;
    const char *s = p->s;

    if (i < p->len && s[i] == '-') {
        i++;
    }
    if (i >= p->len || s[i] < '0' || s[i] > '9') {
        return -EINVAL;
    }
    if (s[i] == '0') {
        i++;
    } else {
        while (i < p->len && s[i] >= '0' && s[i] <= '9') {
            i++;
        }
    }
    if (i < p->len && s[i] == '.') {
        i++;
        if (i >= p->len || s[i] < '0' || s[i] > '9') {
            return -EINVAL;
        }
        while (i < p->len && s[i] >= '0' && s[i] <= '9') {
            i++;
        }
    }
    if (i < p->len && (s[i] == 'e' || s[i] == 'E')) {
        i++;
        if (i < p->len && (s[i] == '+' || s[i] == '-')) {
            i++;
        }
        if (i >= p->len || s[i] < '0' || s[i] > '9') {
            return -EINVAL;
        }
        while (i < p->len && s[i] >= '0' && s[i] <= '9') {
            i++;
        }
    }
    p->pos = i;
    return 0;
}

static int
json_value(struct json_parser *p, int depth)
{
    uint32_t me;
    struct json_tok *t;
    int rc;

    json_ws(p);
    if (p->pos >= p->len) {
        return -EINVAL;
    }
    if (p->n >= p->cap) {
        return -E2BIG;
    }
    me = p->n++;
    t = &p->toks[me];
    t->start = p->pos;
    t->count = 0;
    switch (p->s[p->pos]) {
    case '{':
    case '[': {
        char close = p->s[p->pos] == '{' ? '}' : ']';

        t->type = close == '}' ? JSON_OBJECT : JSON_ARRAY;
        if (depth >= JSON_DEPTH_MAX) {
            return -E2BIG;
        }
        p->pos++;
        json_ws(p);
        if (p->pos < p->len && p->s[p->pos] == close) {
            p->pos++;
            break;
        }
        for (;;) {
            if (close == '}') {
                json_ws(p);
                if (p->pos >= p->len || p->s[p->pos] != '"') {
                    return -EINVAL;
                }
                if ((rc = json_value(p, depth + 1)) != 0) {    /* the key, a string */
                    return rc;
                }
                json_ws(p);
                if (p->pos >= p->len || p->s[p->pos] != ':') {
                    return -EINVAL;
                }
                p->pos++;
            }
            if ((rc = json_value(p, depth + 1)) != 0) {
                return rc;
            }
            p->toks[me].count++;
            json_ws(p);
            if (p->pos < p->len && p->s[p->pos] == ',') {
                p->pos++;
                continue;
            }
            if (p->pos < p->len && p->s[p->pos] == close) {
                p->pos++;
                break;
            }
            return -EINVAL;
        }
        t = &p->toks[me];
        break;
    }
    case '"':
        t->type = JSON_STRING;
        if ((rc = json_string(p, &t->start, &t->end)) != 0) {
            return rc;
        }
        t->next = p->n;
        return 0;
    case 't':
    case 'f':
    case 'n': {
        static const char *const words[] = {"true", "false", "null"};
        static const enum json_type types[] = {JSON_TRUE, JSON_FALSE, JSON_NULL};
        int w = p->s[p->pos] == 't' ? 0 : p->s[p->pos] == 'f' ? 1 : 2;
        size_t wl = strlen(words[w]);

        if (p->len - p->pos < wl || memcmp(p->s + p->pos, words[w], wl) != 0) {
            return -EINVAL;
        }
        t->type = types[w];
        p->pos += (uint32_t)wl;
        break;
    }
    default:
        t->type = JSON_NUMBER;
        if ((rc = json_number(p)) != 0) {
            return rc;
        }
        break;
    }
    t->end = p->pos;
    t->next = p->n;
    return 0;
}

int
json_parse(const char *text, size_t len, struct json_tok *toks, uint32_t cap)
{
    struct json_parser p = {.s = text, .len = (uint32_t)len, .toks = toks, .cap = cap};
    int rc;

    if (len >= UINT32_MAX) {
        return -EOVERFLOW;
    }
    rc = json_value(&p, 0);
    if (rc != 0) {
        return rc;
    }
    json_ws(&p);
    return p.pos == p.len ? (int)p.n : -EINVAL;
}

/* Does the string token t equal key once unescaped? */
static int
json_key_eq(const char *text, const struct json_tok *toks, int i, const char *key)
{
    char buf[256];
    const struct json_tok *t = &toks[i];
    size_t kl = strlen(key);

    if (memchr(text + t->start, '\\', t->end - t->start) == NULL) {
        return t->end - t->start == kl && memcmp(text + t->start, key, kl) == 0;
    }
    return json_str(text, toks, i, buf, sizeof(buf)) == (int)kl && memcmp(buf, key, kl) == 0;
}

int
json_get(const char *text, const struct json_tok *toks, int obj, const char *key)
{
    int i;

    if (obj < 0 || toks[obj].type != JSON_OBJECT) {
        return -1;
    }
    i = obj + 1;
    for (uint32_t m = 0; m < toks[obj].count; m++) {
        int val = (int)toks[i].next;

        if (json_key_eq(text, toks, i, key)) {
            return val;
        }
        i = (int)toks[val].next;
    }
    return -1;
}

int
json_at(const struct json_tok *toks, int arr, uint32_t idx)
{
    int i;

    if (arr < 0 || toks[arr].type != JSON_ARRAY || idx >= toks[arr].count) {
        return -1;
    }
    i = arr + 1;
    for (uint32_t k = 0; k < idx; k++) {
        i = (int)toks[i].next;
    }
    return i;
}

static size_t
json_utf8(uint32_t cp, char *o)
{
    if (cp < 0x80) {
        o[0] = (char)cp;
        return 1;
    }
    if (cp < 0x800) {
        o[0] = (char)(0xc0 | (cp >> 6));
        o[1] = (char)(0x80 | (cp & 0x3f));
        return 2;
    }
    if (cp < 0x10000) {
        o[0] = (char)(0xe0 | (cp >> 12));
        o[1] = (char)(0x80 | ((cp >> 6) & 0x3f));
        o[2] = (char)(0x80 | (cp & 0x3f));
        return 3;
    }
    o[0] = (char)(0xf0 | (cp >> 18));
    o[1] = (char)(0x80 | ((cp >> 12) & 0x3f));
    o[2] = (char)(0x80 | ((cp >> 6) & 0x3f));
    o[3] = (char)(0x80 | (cp & 0x3f));
    return 4;
}

int
json_str(const char *text, const struct json_tok *toks, int i, char *out, size_t cap)
{
    size_t o = 0;

    if (i < 0 || toks[i].type != JSON_STRING || cap == 0) {
        return i < 0 || cap > 0 ? -EINVAL : -E2BIG;
    }
    for (uint32_t p = toks[i].start; p < toks[i].end;) {
        char enc[4];
        size_t n = 1;
        char c = text[p];

        if (c != '\\') {
            enc[0] = c;
            p++;
        } else {
            char e = text[p + 1];
            uint32_t cp, lo;

            p += 2;
            switch (e) {
            case 'b': enc[0] = '\b'; break;
            case 'f': enc[0] = '\f'; break;
            case 'n': enc[0] = '\n'; break;
            case 'r': enc[0] = '\r'; break;
            case 't': enc[0] = '\t'; break;
            case 'u':
                (void)json_hex4(text + p, &cp);     /* validated by json_parse */
                p += 4;
                if (cp >= 0xdc00 && cp <= 0xdfff) {
                    return -EINVAL;
                }
                if (cp >= 0xd800 && cp <= 0xdbff) {
                    if (toks[i].end - p < 6 || text[p] != '\\' || text[p + 1] != 'u' ||
                        json_hex4(text + p + 2, &lo) != 0 || lo < 0xdc00 || lo > 0xdfff) {
                        return -EINVAL;
                    }
                    p += 6;
                    cp = 0x10000 + ((cp - 0xd800) << 10) + (lo - 0xdc00);
                }
                if (cp == 0) {
                    return -EINVAL;
                }
                n = json_utf8(cp, enc);
                break;
            default: enc[0] = e; break;             /* " \ / */
            }
        }
        if (cap - o <= n) {
            return -E2BIG;
        }
        memcpy(out + o, enc, n);
        o += n;
    }
    out[o] = '\0';
    return (int)o;
}

int
json_u64(const char *text, const struct json_tok *toks, int i, uint64_t *out)
{
    uint64_t v = 0;
    uint32_t s, e;

    if (i < 0) {
        return -ENOENT;
    }
    if (toks[i].type != JSON_NUMBER && toks[i].type != JSON_STRING) {
        return -EINVAL;
    }
    s = toks[i].start;
    e = toks[i].end;
    if (s == e) {
        return -EINVAL;
    }
    for (uint32_t p = s; p < e; p++) {
        char c = text[p];

        if (c < '0' || c > '9') {
            return -EINVAL;
        }
        if (v > (UINT64_MAX - (uint64_t)(c - '0')) / 10) {
            return -ERANGE;
        }
        v = v * 10 + (uint64_t)(c - '0');
    }
    *out = v;
    return 0;
}

int
json_double(const char *text, const struct json_tok *toks, int i, double *out)
{
    char buf[64], *end;
    uint32_t n;

    if (i < 0) {
        return -ENOENT;
    }
    if (toks[i].type != JSON_NUMBER && toks[i].type != JSON_STRING) {
        return -EINVAL;
    }
    n = toks[i].end - toks[i].start;
    if (n == 0 || n >= sizeof(buf)) {
        return -EINVAL;
    }
    memcpy(buf, text + toks[i].start, n);
    buf[n] = '\0';
    if (toks[i].type == JSON_STRING &&
        strspn(buf, "0123456789.eE+-") != n) {
        return -EINVAL;
    }
    *out = strtod(buf, &end);
    return *end == '\0' ? 0 : -EINVAL;
}

int
json_quote(const char *s, char *out, size_t cap)
{
    static const char hex[] = "0123456789abcdef";
    size_t o = 0;

    for (size_t i = 0;; i++) {
        unsigned char c = (unsigned char)s[i];
        char enc[6];
        size_t n = 1;

        if (i == 0) {
            if (cap < 2) {
                return -E2BIG;
            }
            out[o++] = '"';
        }
        if (c == '\0') {
            if (cap - o < 2) {
                return -E2BIG;
            }
            out[o++] = '"';
            out[o] = '\0';
            return (int)o;
        }
        if (c == '"' || c == '\\') {
            enc[0] = '\\';
            enc[1] = (char)c;
            n = 2;
        } else if (c < 0x20) {
            memcpy(enc, "\\u00", 4);
            enc[4] = hex[c >> 4];
            enc[5] = hex[c & 15];
            n = 6;
        } else {
            enc[0] = (char)c;
        }
        if (cap - o <= n) {
            return -E2BIG;
        }
        memcpy(out + o, enc, n);
        o += n;
    }
}
