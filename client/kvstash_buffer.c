/*
 * kvstash_buffer: libkvstash's registered buffers (kvstash.h,
 * kvstash_register_buffer to kvstash_unregister_buffer).
 *
 * This module owns the shared-memory buffers and the list each connection
 * keeps of its registered buffers. A shared-memory buffer is a memfd, made
 * here (kvstash_register_buffer) or the caller's shared memory
 * (kvstash_register_fd: sealed against shrinking before it is measured when
 * it allows sealing, else registered as it is and guarded by the daemon), mapped
 * read-write here and sent to the daemon once, at registration; no
 * descriptor is kept. Every registered buffer, shared memory or RDMA memory
 * (kvstash_rdma.c registers those and links them here), is on its
 * connection's list, so that unregistering it, or closing the connection
 * (kvstash_close), releases it: unmapped, or its memory regions
 * deregistered. It must not move values: transfers through buffers are
 * kvstash.c's batch calls (kvstash_batch_put_from, kvstash_batch_get_into),
 * whose requests carry pieces [id, offset, length] instead of values. It
 * touches neither the socket nor a msgpack byte but through kvstash_wire.h,
 * keeps no global state and starts no thread.
 */
#include "kvstash.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "kverr.h"
#include "kvstash_int.h"
#include "kvstash_wire.h"

/* kvstash_buffer_begin: the checks common to both ways of registering. */
static int
kvstash_buffer_begin(struct kvstash *c, size_t size, struct kvstash_buffer **out)
{
    int rc = kvstash_begin(c);

    if (rc != 0) {
        return rc;
    }
    if (out == NULL) {
        kvstash_wire_errf(c, "out is NULL");
        return KVSTASH_EINVAL;
    }
    *out = NULL;
    if (!c->is_unix) {
        kvstash_wire_errf(c, "shared-memory buffers need a Unix-socket connection");
        return KVSTASH_EUNSUPPORTED;
    }
    if (size == 0 || (uint64_t)size > INT64_MAX) {
        kvstash_wire_errf(c, "a buffer of %zu bytes cannot be registered", size);
        return KVSTASH_EINVAL;
    }
    return 0;
}

/*
 * kvstash_buffer_add: map fd (shared memory, at least size bytes)
 * and register it with the server. The descriptor stays the caller's.
 */
static int
kvstash_buffer_add(struct kvstash *c, int fd, size_t size, struct kvstash_buffer **out)
{
    struct kvstash_buffer *b;
    int rc;

    b = calloc(1, sizeof(*b));
    if (b == NULL) {
        kvstash_wire_errf(c, "out of memory");
        return -ENOMEM;
    }
    b->size = size;
    b->base = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (b->base == MAP_FAILED) {
        if (errno == EACCES || errno == EPERM) {
            kvstash_wire_errf(c, "the memfd cannot be mapped writable: %s", kv_strerror(-errno));
            rc = KVSTASH_EINVAL;
        } else {
            rc = kvstash_sys_fail(c, "mmap", errno);
        }
        goto fail_map;
    }
    kvstash_wire_req_begin(c, "register_buffer", 1);
    kvstash_wire_req_size(c, size);
    kvstash_wire_req_fd(c, fd);
    rc = kvstash_wire_call(c, KVSTASH_WIRE_SMALL_REPLY);
    if (rc == 0) {
        rc = kvstash_done(c, kvstash_wire_read_uint(c, &b->id));
    }
    if (rc != 0) {
        goto fail_call;
    }
    kvstash_buffer_link(c, b);
    *out = b;
    return 0;

fail_call:
    munmap(b->base, size);
fail_map:
    free(b);
    return rc;
}

void
kvstash_buffer_link(struct kvstash *c, struct kvstash_buffer *b)
{
    b->conn = c;
    b->prev = NULL;
    b->next = c->bufs;
    if (c->bufs != NULL) {
        c->bufs->prev = b;
    }
    c->bufs = b;
}

void
kvstash_buffer_release(struct kvstash *c, struct kvstash_buffer *b)
{
    if (b->prev != NULL) {
        b->prev->next = b->next;
    } else {
        c->bufs = b->next;
    }
    if (b->next != NULL) {
        b->next->prev = b->prev;
    }
    if (b->mr != NULL) {
        kvstash_rdma_buffer_release(b);
    } else {
        munmap(b->base, b->size);
    }
    free(b);
}

int
kvstash_register_buffer(struct kvstash *c, size_t size, struct kvstash_buffer **out)
{
    int rc = kvstash_buffer_begin(c, size, out);
    int fd;

    if (rc != 0) {
        return rc;
    }
    fd = memfd_create("kvstash", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    if (fd < 0) {
        return kvstash_sys_fail(c, "memfd_create", errno);
    }
    if (ftruncate(fd, (off_t)size) != 0) {
        rc = kvstash_sys_fail(c, "ftruncate", errno);
    } else if (fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW) != 0) {
        rc = kvstash_sys_fail(c, "fcntl(F_ADD_SEALS)", errno);
    } else {
        rc = kvstash_buffer_add(c, fd, size, out);
    }
    close(fd); /* the mappings (ours, the daemon's) keep the memory */
    return rc;
}

int
kvstash_register_fd(struct kvstash *c, int fd, size_t size, struct kvstash_buffer **out)
{
    struct stat st;
    int rc = kvstash_buffer_begin(c, size, out);
    int seals;

    if (rc != 0) {
        return rc;
    }
    if (fd < 0) {
        kvstash_wire_errf(c, "register_fd: bad descriptor %d", fd);
        return KVSTASH_EINVAL;
    }
    /* seals exist on shared memory only (memfds, tmpfs, hugetlbfs) */
    seals = fcntl(fd, F_GET_SEALS);
    if (seals < 0) {
        kvstash_wire_errf(c, "register_fd: not shared memory (a memfd, or a file on tmpfs "
                          "or hugetlbfs; F_GET_SEALS: %s)", kv_strerror(-errno));
        return KVSTASH_EINVAL;
    }
    /* seal first, then measure: the file cannot shrink in between; one that cannot be sealed
     * goes as it is (the daemon guards it) */
    if (!(seals & (F_SEAL_SHRINK | F_SEAL_SEAL)) && fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK) != 0
        && errno != EPERM) {
        return kvstash_sys_fail(c, "fcntl(F_ADD_SEALS)", errno);
    }
    if (fstat(fd, &st) != 0) {
        return kvstash_sys_fail(c, "fstat", errno);
    }
    if (st.st_size < 0 || (uint64_t)st.st_size < (uint64_t)size) {
        kvstash_wire_errf(c, "register_fd: the memfd has %lld bytes, fewer than %zu",
                          (long long)st.st_size, size);
        return KVSTASH_EINVAL;
    }
    return kvstash_buffer_add(c, fd, size, out);
}

void *
kvstash_buffer_ptr(const struct kvstash_buffer *b)
{
    return b != NULL ? b->base : NULL;
}

size_t
kvstash_buffer_size(const struct kvstash_buffer *b)
{
    return b != NULL ? b->size : 0;
}

int
kvstash_unregister_buffer(struct kvstash *c, struct kvstash_buffer *b)
{
    int code = 0;
    int rc;

    if (b == NULL) {
        return 0;
    }
    if (c == NULL) {
        return -EINVAL;
    }
    if (b->conn != c) {
        kvstash_wire_errf(c, "unregister_buffer: the buffer is not registered on this "
                          "connection");
        return KVSTASH_EINVAL;
    }
    rc = kvstash_begin(c);
    if (rc == 0) {
        kvstash_wire_req_begin(c, "unregister_buffer", 1);
        kvstash_wire_req_uint(c, b->id);
        rc = kvstash_wire_call(c, KVSTASH_WIRE_SMALL_REPLY);
        if (rc == 0) {
            rc = kvstash_wire_read_code(c, &code);
            rc = rc != 0 ? kvstash_done(c, rc) : code;
        }
    }
    /* whatever the server said, the caller has no other way to release it */
    kvstash_buffer_release(c, b);
    return rc;
}
