/*
 * libkvstash: the C client of kvstashd (msgpack-rpc over TCP or a Unix socket).
 *
 * One struct kvstash is one connection; it is not thread safe (use one per
 * thread). Calls are synchronous; batch calls pipeline: a batch is split into
 * requests of at most the server's max_batch keys (learned from hello at
 * connect) and about min(max_message_size / 2, 32 MiB) bytes, and up to 8 of
 * them are kept in flight while the replies are read in order (for batch_get,
 * also no more than 128 KiB of requests, so the client keeps reading while
 * the server's output is large). Values over 8 KiB are sent straight from the
 * caller's memory, and values read by kvstash_get/kvstash_batch_get go from
 * the socket straight into the caller's buffers.
 *
 * Return values: 0 on success; a positive KV_* code (kverr.h numbering,
 * repeated below as KVSTASH_E*) when the server answered a request-level
 * error or, for single-key calls, the key's outcome; a negative errno when
 * the connection failed (the connection is then unusable: close it).
 * kvstash_last_error() tells the server's message for the last error.
 * Per-key outcomes of batch calls go into caller arrays.
 *
 * Buffers: keys and values are borrowed for the duration of a call; results
 * are written into caller buffers (get) or returned malloc'd where the call
 * says so.
 */
#ifndef KVSTASH_H
#define KVSTASH_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define KVSTASH_PROTOCOL 1

enum kvstash_code {
    KVSTASH_OK = 0, KVSTASH_ENOTFOUND = 1, KVSTASH_EEXISTS = 2, KVSTASH_EBUSY = 3,
    KVSTASH_ENOSPACE = 4, KVSTASH_ETOOLARGE = 5, KVSTASH_EINVAL = 6, KVSTASH_ENOMETHOD = 7,
    KVSTASH_EPROTO = 8, KVSTASH_EUNAUTHORIZED = 9, KVSTASH_EFORBIDDEN = 10,
    KVSTASH_EQUOTA = 11, KVSTASH_ECHECKSUM = 12, KVSTASH_ETIMEOUT = 13,
    KVSTASH_EUNAVAILABLE = 14, KVSTASH_EUNSUPPORTED = 15, KVSTASH_EINTERNAL = 16
};

struct kvstash;

struct kvstash_hello {
    char server[32];
    char version[32];
    char node_id[80];
    uint64_t protocol;
    uint64_t max_key_size;
    uint64_t max_value_size;
    uint64_t max_batch;
    uint64_t max_message_size;
    uint64_t lease_ttl_ms;
};

struct kvstash_stat {
    char name[64];
    uint64_t value;
};

/*
 * kvstash_connect: connect to "host:port", "[v6]:port", "unix:/path" or a
 * path containing '/', then send hello. Returns 0 and *out, or a negative
 * errno (-ECONNREFUSED, ...), or a KV code the server answered to hello.
 */
int kvstash_connect(const char *addr, struct kvstash **out);

/*
 * kvstash_connect_timeout: as kvstash_connect, but connecting and hello give
 * up with -ETIMEDOUT after timeout_ms (0 = no limit), and timeout_ms becomes
 * the connection's I/O timeout (see kvstash_set_timeout).
 */
int kvstash_connect_timeout(const char *addr, int timeout_ms, struct kvstash **out);

/* kvstash_version: the version of the library actually linked, e.g. "0.1.0" (static). */
const char *kvstash_version(void);

/* kvstash_close: close and free. Accepts NULL. */
void kvstash_close(struct kvstash *c);

/*
 * kvstash_set_timeout: I/O timeout in ms (0 = none, the default). A call
 * fails with -ETIMEDOUT (and the connection is broken) when the socket
 * makes no progress, in either direction, for timeout_ms.
 */
void kvstash_set_timeout(struct kvstash *c, int timeout_ms);

/*
 * kvstash_last_error: the server's message (or a local reason) for the last
 * error on c ("" after a call that succeeded). With c NULL: why the calling
 * thread's last kvstash_connect failed (e.g. the server's "max_connections
 * reached"). Valid until the next call on c (on the thread, for NULL).
 */
const char *kvstash_last_error(const struct kvstash *c);

/* kvstash_strerror: text for a return value of any call (KV code or -errno). */
const char *kvstash_strerror(int rc);

/* kvstash_server_info: the hello answer received at connect (borrowed). */
const struct kvstash_hello *kvstash_server_info(const struct kvstash *c);

int kvstash_ping(struct kvstash *c);

/* kvstash_put: 0 stored, KVSTASH_EEXISTS, KVSTASH_EBUSY, KVSTASH_ENOSPACE, KVSTASH_ETOOLARGE, ... */
int kvstash_put(struct kvstash *c, const void *key, size_t klen, const void *val, size_t vlen);

/*
 * kvstash_batch_put: store n objects; codes[i] gets key i's outcome (as
 * kvstash_put). A key over max_key_size or a value over max_value_size gets
 * KVSTASH_ETOOLARGE without being sent. Returns 0 when every request was
 * answered (whatever the per-key codes), else a request-level code (the keys
 * of that request and of the requests not yet sent then get that code as
 * their codes[i]) or -errno (codes[] undefined).
 */
int kvstash_batch_put(struct kvstash *c, size_t n, const void *const *keys, const size_t *klens,
                      const void *const *vals, const size_t *vlens, int *codes);

/*
 * kvstash_get: read a value into buf (capacity cap). Returns 0 and *vlen,
 * KVSTASH_ENOTFOUND, or KVSTASH_ETOOLARGE when cap is too small (*vlen then
 * holds the size needed; nothing is copied).
 */
int kvstash_get(struct kvstash *c, const void *key, size_t klen, void *buf, size_t cap,
                size_t *vlen);

/* kvstash_get_alloc: as kvstash_get, into a malloc'd buffer the caller frees. */
int kvstash_get_alloc(struct kvstash *c, const void *key, size_t klen, void **val, size_t *vlen);

/*
 * kvstash_batch_get: read n values into bufs[i] (capacity caps[i]); codes[i]
 * is 0 (vlens[i] set), KVSTASH_ENOTFOUND, or KVSTASH_ETOOLARGE (vlens[i] is
 * the size needed). Returns as kvstash_batch_put.
 */
int kvstash_batch_get(struct kvstash *c, size_t n, const void *const *keys, const size_t *klens,
                      void *const *bufs, const size_t *caps, size_t *vlens, int *codes);

int kvstash_is_exist(struct kvstash *c, const void *key, size_t klen, bool *exists);
int kvstash_batch_is_exist(struct kvstash *c, size_t n, const void *const *keys,
                           const size_t *klens, bool *exists);

/*
 * kvstash_prefix_match: *matched = the number of leading keys that exist or,
 * with group_size g > 1, of leading groups of g consecutive keys whose every
 * key exists (n must then be a multiple of g, else KVSTASH_EINVAL from the
 * server). More than max_batch keys are asked in whole-group requests, one
 * after another, stopping at the first that does not match completely.
 */
int kvstash_prefix_match(struct kvstash *c, size_t n, const void *const *keys,
                         const size_t *klens, uint32_t group_size, uint64_t *matched);

/* kvstash_get_size: 0 and *size, or KVSTASH_ENOTFOUND. */
int kvstash_get_size(struct kvstash *c, const void *key, size_t klen, uint64_t *size);

/* kvstash_remove: 0, KVSTASH_ENOTFOUND, KVSTASH_EBUSY. */
int kvstash_remove(struct kvstash *c, const void *key, size_t klen, bool force);
int kvstash_batch_remove(struct kvstash *c, size_t n, const void *const *keys,
                         const size_t *klens, bool force, int *codes);

/* kvstash_remove_all: *removed = objects removed. */
int kvstash_remove_all(struct kvstash *c, bool force, uint64_t *removed);

/* kvstash_pin: mode "soft" or "hard"; kvstash_unpin. codes[i] per key. */
int kvstash_pin(struct kvstash *c, size_t n, const void *const *keys, const size_t *klens,
                const char *mode, int *codes);
int kvstash_unpin(struct kvstash *c, size_t n, const void *const *keys, const size_t *klens,
                  int *codes);

/*
 * kvstash_stats: the server's counters as a malloc'd array of *n name/value
 * pairs (free with free()). Non-integer stats are left out.
 */
int kvstash_stats(struct kvstash *c, struct kvstash_stat **items, size_t *n);

/* kvstash_stat_get: the value of name in items, or `dflt` when absent. */
uint64_t kvstash_stat_get(const struct kvstash_stat *items, size_t n, const char *name,
                          uint64_t dflt);

#endif
