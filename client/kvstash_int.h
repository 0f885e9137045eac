/*
 * kvstash_int: what kvstash.c and kvstash_buffer.c share with each other
 * and with the other parts of libkvstash that build on their calls
 * (kvstash_rdma.c). Internal, not installed; none of it is exported by
 * libkvstash.so.
 */
#ifndef KVSTASH_INT_H
#define KVSTASH_INT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kvstash.h"

struct rdma_region;

/* A registered buffer (struct kvstash_buffer of kvstash.h): shared memory, or RDMA memory. */
struct kvstash_buffer {
    struct kvstash *conn;         /* registered on this connection, on its bufs list */
    struct kvstash_buffer *prev;
    struct kvstash_buffer *next;
    uint64_t id;                  /* the server's buffer id */
    void *base;                   /* shm: MAP_SHARED, read-write, size bytes; rdma: the caller's */
    size_t size;
    struct rdma_region *mr;       /* rdma: its memory regions; NULL for shared memory */
};

#pragma GCC visibility push(hidden)

/* kvstash_begin: common entry of every call (c usable, last error cleared). */
int kvstash_begin(struct kvstash *c);

/* kvstash_done: finish a call whose result was read (a negative rc breaks c). */
int kvstash_done(struct kvstash *c, int rc);

/* kvstash_sys_fail: a local system call failed with err: say which; c stays usable. */
int kvstash_sys_fail(struct kvstash *c, const char *call, int err);

/* kvstash_buffer_link: put b on c's list (it is released with c). */
void kvstash_buffer_link(struct kvstash *c, struct kvstash_buffer *b);

/*
 * kvstash_buffer_release: unlink b from c's list, unmap it (shared memory)
 * or deregister its memory regions (RDMA), and free it. The server is not
 * told: kvstash_unregister_buffer asks it first, kvstash_close closes the
 * socket first. b must be on c's list, and is invalid once this returns.
 */
void kvstash_buffer_release(struct kvstash *c, struct kvstash_buffer *b);

/*
 * kvstash_rdma_close: release c's RDMA side (kvstash_close): its queue pair
 * and completion queue; with device, also the device and the state (after
 * the buffers' memory regions went). Accepts c without an RDMA side.
 */
void kvstash_rdma_close(struct kvstash *c, bool device);

/* kvstash_rdma_buffer_release: deregister an RDMA buffer's memory regions. */
void kvstash_rdma_buffer_release(struct kvstash_buffer *b);

#pragma GCC visibility pop

#endif
