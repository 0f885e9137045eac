/*
 * shmbuf: registered shared-memory buffers behind shmbuf.h. A set is a
 * small array of (id, buffer); lookups are linear (a connection registers a
 * few big buffers once). The mapping is MAP_SHARED, read-write.
 */
#include "shmbuf.h"

#include "kverr.h"

#include <errno.h>
#include <fcntl.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

struct shmbuf {
    _Atomic uint32_t refs;
    uint8_t *base;
    uint64_t size;
};

struct shmbuf_entry {
    uint64_t id;
    struct shmbuf *buf;
};

struct shmbuf_set {
    struct shmbuf_entry *e;
    uint32_t n;
    uint32_t cap;
    uint64_t next_id;
};

int
shmbuf_set_create(struct shmbuf_set **out)
{
    *out = calloc(1, sizeof(**out));
    if (*out == NULL) {
        return -ENOMEM;
    }
    (*out)->next_id = 1;
    return 0;
}

void
shmbuf_set_destroy(struct shmbuf_set *s)
{
    if (s == NULL) {
        return;
    }
    for (uint32_t i = 0; i < s->n; i++) {
        shmbuf_unref(s->e[i].buf);
    }
    free(s->e);
    free(s);
}

int
shmbuf_register(struct shmbuf_set *s, int fd, uint64_t size, uint64_t *id, const char **why)
{
    struct shmbuf *b = NULL;
    struct stat st;
    int seals;
    int rc;

    *why = NULL;
    if (s->n >= SHMBUF_MAX_PER_SET) {
        *why = "too many buffers registered on this connection";
        rc = KV_QUOTA_EXCEEDED;
        goto fail;
    }
    seals = fcntl(fd, F_GET_SEALS);
    if (seals < 0) {
        *why = "the descriptor is not a memfd (no seals)";
        rc = KV_INVALID_ARGUMENT;
        goto fail;
    }
    if (!(seals & F_SEAL_SHRINK)) {
        *why = "the memfd must be sealed against shrinking (F_SEAL_SHRINK)";
        rc = KV_INVALID_ARGUMENT;
        goto fail;
    }
    if (size == 0 || size > SIZE_MAX || fstat(fd, &st) != 0 || (uint64_t)st.st_size < size) {
        *why = "size is 0 or larger than the memfd";
        rc = KV_INVALID_ARGUMENT;
        goto fail;
    }
    if (s->n == s->cap) {
        uint32_t cap = s->cap != 0 ? s->cap * 2 : 4;
        struct shmbuf_entry *e = realloc(s->e, cap * sizeof(*e));

        if (e == NULL) {
            rc = -ENOMEM;
            goto fail;
        }
        s->e = e;
        s->cap = cap;
    }
    b = calloc(1, sizeof(*b));
    if (b == NULL) {
        rc = -ENOMEM;
        goto fail;
    }
    b->base = mmap(NULL, (size_t)size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (b->base == MAP_FAILED) {
        rc = -errno;
        *why = "mmap of the memfd failed";
        free(b);
        goto fail;
    }
    close(fd);
    b->size = size;
    atomic_init(&b->refs, 1);
    *id = s->next_id++;
    s->e[s->n].id = *id;
    s->e[s->n].buf = b;
    s->n++;
    return 0;

fail:
    close(fd);
    return rc;
}

int
shmbuf_unregister(struct shmbuf_set *s, uint64_t id)
{
    for (uint32_t i = 0; s != NULL && i < s->n; i++) {
        if (s->e[i].id == id) {
            shmbuf_unref(s->e[i].buf);
            s->e[i] = s->e[--s->n];
            return 0;
        }
    }
    return KV_NOT_FOUND;
}

struct shmbuf *
shmbuf_get(struct shmbuf_set *s, uint64_t id)
{
    for (uint32_t i = 0; s != NULL && i < s->n; i++) {
        if (s->e[i].id == id) {
            atomic_fetch_add_explicit(&s->e[i].buf->refs, 1, memory_order_relaxed);
            return s->e[i].buf;
        }
    }
    return NULL;
}

void
shmbuf_unref(struct shmbuf *b)
{
    if (b != NULL && atomic_fetch_sub_explicit(&b->refs, 1, memory_order_acq_rel) == 1) {
        munmap(b->base, (size_t)b->size);
        free(b);
    }
}

uint8_t *
shmbuf_range(const struct shmbuf *b, uint64_t off, uint64_t len)
{
    if (off > b->size || len > b->size - off) {
        return NULL;
    }
    return b->base + off;
}
