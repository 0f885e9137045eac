/*
 * shmbuf: shared-memory buffers registered by one connection (a client's
 * memfd, mapped shared into the daemon), looked up by id for the zero-copy
 * transfers. A buffer is reference-counted: the connection's set holds one
 * reference, every transfer that uses it one more, so unregistering (or the
 * connection closing) never unmaps memory a copy is still using.
 *
 * Safety: a buffer is shared memory (a memfd, or a file on tmpfs or
 * hugetlbfs such as one in /dev/shm) at least the registered size. One
 * sealed against shrinking (F_SEAL_SHRINK) can never lose pages under the
 * daemon: nothing guards it. Any other is "guarded": its owner may shrink
 * the file at any time, and then touching the lost pages raises SIGBUS.
 * Every access to a guarded buffer's mapping is bracketed by
 * shmbuf_access_begin/end on the thread that makes it; a fault inside that
 * buffer while it is the thread's current one maps anonymous zero pages
 * over the whole mapping (the access goes on over zeros, the client never
 * sees the daemon's writes again) and marks the buffer failed. The
 * transfer that used it checks shmbuf_failed afterwards and fails its keys;
 * the connection drops failed buffers (shmbuf_set_drop_failed). A SIGBUS
 * anywhere else is passed on to the previous disposition (a real crash
 * stays a crash). libwayland-server's wl_shm pools are guarded the same way.
 *
 * Threads: a set belongs to its connection's thread; shmbuf_ref/unref of a
 * buffer from any thread; shmbuf_access_begin/end and shmbuf_fail on the
 * thread that touches the mapping (a copy thread, an SSD read).
 */
#ifndef SHMBUF_H
#define SHMBUF_H

#include <stdbool.h>
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
 * buffer of `size` bytes, guarded unless it is sealed against shrinking
 * (the first guarded buffer installs the process's SIGBUS handler). Returns
 * 0 and *id (ids are never reused within a set), or KV_INVALID_ARGUMENT
 * with *why set (not shared memory: a pipe, a socket, a file on a disk
 * file system; smaller than size; size 0), KV_QUOTA_EXCEEDED (over
 * SHMBUF_MAX_PER_SET buffers), or -errno (mmap, sigaction).
 */
int shmbuf_register(struct shmbuf_set *s, int fd, uint64_t size, uint64_t *id, const char **why);

/* shmbuf_unregister: forget id (the mapping goes with its last user). 0 or KV_NOT_FOUND. */
int shmbuf_unregister(struct shmbuf_set *s, uint64_t id);

/*
 * shmbuf_set_drop_failed: unregister every buffer of s that failed (it
 * shrank under a transfer); later requests naming them find no such
 * buffer. Returns how many went. Accepts NULL.
 */
uint32_t shmbuf_set_drop_failed(struct shmbuf_set *s);

/* shmbuf_get: a reference on buffer id, or NULL. */
struct shmbuf *shmbuf_get(struct shmbuf_set *s, uint64_t id);

/* shmbuf_unref: give one back; the last unmaps. Accepts NULL. */
void shmbuf_unref(struct shmbuf *b);

/*
 * shmbuf_range: the address of bytes [off, off + len) of b, or NULL when
 * they are not all inside it (overflow included).
 */
uint8_t *shmbuf_range(const struct shmbuf *b, uint64_t off, uint64_t len);

/* shmbuf_guarded: b may shrink under the daemon (registered without F_SEAL_SHRINK). */
bool shmbuf_guarded(const struct shmbuf *b);

/*
 * shmbuf_access_begin: the calling thread is about to touch guarded b's
 * mapping (b is its current buffer until shmbuf_access_end). One buffer at
 * a time per thread; no nesting. Cheap (a thread-local store): call it per
 * copy, not per byte.
 */
void shmbuf_access_begin(struct shmbuf *b);

/* shmbuf_access_end: the calling thread is done with its current buffer. */
void shmbuf_access_end(void);

/*
 * shmbuf_fail: mark b failed from outside the SIGBUS handler (a read into
 * it by the kernel found its pages gone: EFAULT). Any thread.
 */
void shmbuf_fail(struct shmbuf *b);

/*
 * shmbuf_failed: b lost pages under an access since it was registered; what
 * was read from it may be zeros and what was written to it never reached
 * the client. Check it after the accesses (a transfer's copies) are done.
 */
bool shmbuf_failed(const struct shmbuf *b);

#endif
