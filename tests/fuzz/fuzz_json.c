/*
 * fuzz_json: the etcd client's readers (src/cluster/json.c, b64.c) on arbitrary bytes, as
 * an answer from whatever listens on etcd's port would reach them. Every token json_parse
 * returns must lie inside the text and its subtree inside its parent's; every accessor must
 * answer without reading past the text. A base64 text that decodes must encode back to the
 * very same bytes (the decoder is strict), and a string json_quote writes must parse back
 * to one string equal to what was quoted.
 */
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "b64.h"
#include "json.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define FZ_TOKS 512
#define FZ_TEXT 8192

static void
fz_check_tokens(const char *text, size_t len, const struct json_tok *t, int n)
{
    static char out[FZ_TEXT];
    uint64_t u;
    double d;

    for (int i = 0; i < n; i++) {
        if (t[i].start > t[i].end || t[i].end > len || t[i].next <= (uint32_t)i
            || t[i].next > (uint32_t)n) {
            abort();
        }
        if (t[i].type == JSON_ARRAY || t[i].type == JSON_OBJECT) {
            uint32_t elems = t[i].type == JSON_OBJECT ? t[i].count * 2 : t[i].count;
            int j = i + 1;

            for (uint32_t k = 0; k < elems; k++) {      /* the children tile the subtree */
                if (j >= n || t[j].next > t[i].next) {
                    abort();
                }
                j = (int)t[j].next;
            }
            if ((uint32_t)j != t[i].next) {
                abort();
            }
        }
        (void)json_str(text, t, i, out, sizeof(out));
        (void)json_u64(text, t, i, &u);
        (void)json_double(text, t, i, &d);
        if (t[i].type == JSON_OBJECT) {
            (void)json_get(text, t, i, "kvs");
            (void)json_get(text, t, i, "header");
        }
        if (t[i].type == JSON_ARRAY) {
            (void)json_at(t, i, 0);
            (void)json_at(t, i, t[i].count);
        }
    }
}

static void
fz_b64(const uint8_t *data, size_t size)
{
    static uint8_t raw[FZ_TEXT];
    static char back[FZ_TEXT * 2];
    size_t n;

    if (b64_decode((const char *)data, size, raw, sizeof(raw), &n) != 0) {
        return;
    }
    if (b64_encode(raw, n, back, sizeof(back)) != (int)size || memcmp(back, data, size) != 0) {
        abort();
    }
}

static void
fz_quote(const uint8_t *data, size_t size)
{
    static char s[FZ_TEXT], q[FZ_TEXT * 6 + 3], back[FZ_TEXT];
    struct json_tok t[2];
    size_t n = strnlen((const char *)data, size < sizeof(s) - 1 ? size : sizeof(s) - 1);
    int len;

    memcpy(s, data, n);
    s[n] = '\0';
    len = json_quote(s, q, sizeof(q));
    if (len < 0) {
        abort();                /* 6 bytes an input byte at most, and the quotes */
    }
    if (json_parse(q, (size_t)len, t, 2) != 1 || t[0].type != JSON_STRING) {
        return;                 /* not UTF-8: json_quote copies such bytes as they are */
    }
    if (json_str(q, t, 0, back, sizeof(back)) != (int)n || memcmp(back, s, n) != 0) {
        abort();
    }
}

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static struct json_tok toks[FZ_TOKS];
    int n;

    if (size > FZ_TEXT) {
        return 0;
    }
    n = json_parse((const char *)data, size, toks, FZ_TOKS);
    if (n > 0) {
        fz_check_tokens((const char *)data, size, toks, n);
    } else if (n != -EINVAL && n != -E2BIG) {
        abort();
    }
    fz_b64(data, size);
    fz_quote(data, size);
    return 0;
}
