/*
 * fuzz_config: the config file parser (src/config.c) on arbitrary bytes, as
 * a config file or as one --key=value flag. Whatever loads and finalizes
 * must dump to a file that loads back to the very same config (no key
 * differs), and every refusal must say why.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "config.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void
fz_count(const char *key, bool reloadable, void *arg)
{
    (void)key;
    (void)reloadable;
    (*(int *)arg)++;
}

/* fz_load: load text[0..len) as a config file through a memfd. 0, -1 (refused) or abort. */
static int
fz_load(struct kv_config *c, const void *text, size_t len, char *err, size_t errlen)
{
    char path[64];
    int fd = memfd_create("fuzz-conf", MFD_CLOEXEC);
    int rc;

    if (fd < 0 || (len > 0 && write(fd, text, len) != (ssize_t)len)) {
        abort();
    }
    snprintf(path, sizeof(path), "/proc/self/fd/%d", fd);
    err[0] = '\0';
    rc = conf_load_file(c, path, err, errlen);
    close(fd);
    if (rc != 0 && err[0] == '\0') {
        abort();                    /* a refusal must say why */
    }
    return rc;
}

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static char dump[1 << 16];
    struct kv_config a, b;
    char err[512];
    int differ = 0;

    /* As a flag: the first line is key=value. */
    if (size > 0 && size < 4096) {
        char flag[4096];
        char *eq;

        memcpy(flag, data, size);
        flag[size] = '\0';
        eq = strchr(flag, '=');
        if (eq != NULL && memchr(data, '\0', size) == NULL) {
            *eq = '\0';
            conf_init(&a);
            err[0] = '\0';
            if (conf_set(&a, flag, eq + 1, "--fuzz", err, sizeof(err)) != 0 && err[0] == '\0') {
                abort();
            }
        }
    }
    /* As a file: load, finalize, dump, load the dump: the same config. */
    conf_init(&a);
    if (fz_load(&a, data, size, err, sizeof(err)) != 0) {
        return 0;
    }
    if (conf_finalize(&a, err, sizeof(err)) != 0) {
        if (err[0] == '\0') {
            abort();
        }
        return 0;
    }
    if (conf_dump(&a, dump, sizeof(dump)) < 0) {
        abort();
    }
    conf_init(&b);
    if (fz_load(&b, dump, strlen(dump), err, sizeof(err)) != 0
        || conf_finalize(&b, err, sizeof(err)) != 0) {
        fprintf(stderr, "a dumped config does not load back: %s\n", err);
        abort();
    }
    conf_diff(&a, &b, fz_count, &differ);
    if (differ != 0) {
        fprintf(stderr, "%d keys differ after a dump and load\n", differ);
        abort();
    }
    return 0;
}
