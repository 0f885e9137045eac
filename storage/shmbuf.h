/*
 * shmbuf: shared-memory buffers registered by one connection (a client's
 * memfd, mapped shared into the daemon), looked up by id for the zero-copy
 * transfers. A buffer is reference-counted: the connection's set holds one
 * reference, every transfer that uses it one more, so unregistering (or the
 * connection closing) never unmaps memory a copy is still using.
 *
 * Safety: only a memfd sealed against shrinking (F_SEAL_SHRINK) is accepted,
 * and only when it is at least the registered size, so the mapping can
 * never lose pages under the daemon (no SIGBUS, whatever the client does).
 *
 * Threads: a set belongs to its connection's thread; shmbuf_ref/unref of a
 * buffer from any thread.
 */
#ifndef SHMBUF_H
#define SHMBUF_H

#include <stdint.h>

struct shmbuf;
struct shmbuf_set;

#define SHMBUF_MAX_PER_SET 256

/* shmbuf_set_create: an empty set. 0 and *out, or -ENOMEM. */
int shmbuf_set_create(struct shmbuf_set **out);

/* shmbuf_set_destroy: drop the set's reference on every buffer, free it. Accepts NULL. */
void shmbuf_set_destroy(struct shmbuf_set *s);

/*
 * shmbuf_register: map fd (taken over: closed here whatever happens) as a
 * buffer of `size` bytes. Returns 0 and *id (ids are never reused within a
 * set), or KV_INVALID_ARGUMENT with *why set (not a memfd, not sealed
 * against shrinking, smaller than size, size 0), KV_QUOTA_EXCEEDED (over
 * SHMBUF_MAX_PER_SET buffers), or -errno (mmap).
 */
int shmbuf_register(struct shmbuf_set *s, int fd, uint64_t size, uint64_t *id, const char **why);

/* shmbuf_unregister: forget id (the mapping goes with its last user). 0 or KV_NOT_FOUND. */
int shmbuf_unregister(struct shmbuf_set *s, uint64_t id);

/* shmbuf_get: a reference on buffer id, or NULL. */
struct shmbuf *shmbuf_get(struct shmbuf_set *s, uint64_t id);

/* shmbuf_unref: give one back; the last unmaps. Accepts NULL. */
void shmbuf_unref(struct shmbuf *b);

/*
 * shmbuf_range: the address of bytes [off, off + len) of b, or NULL when
 * they are not all inside it (overflow included).
 */
uint8_t *shmbuf_range(const struct shmbuf *b, uint64_t off, uint64_t len);

#endif
