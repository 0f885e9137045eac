/*
 * libkvstash: the C client of kvstashd (msgpack-rpc over TCP or a Unix socket).
 *
 * One struct kvstash is one connection; it is not thread safe (use one per
 * thread). Calls are synchronous; batch calls pipeline: a batch is split into
 * requests of at most the server's max_batch keys (learned from hello at
 * connect), about min(max_message_size / 2, 32 MiB) bytes and (for the
 * shared-memory transfers) 65536 pieces, and up to 8 of them are kept in
 * flight while the replies are read in order (for batch_get, also no more
 * than 128 KiB of requests, so the client keeps reading while the server's
 * output is large). Values over 8 KiB are sent straight from the caller's
 * memory, and values read by kvstash_get/kvstash_batch_get go from the
 * socket straight into the caller's buffers.
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
 * says so. Over a Unix socket, values can also move through registered
 * shared-memory buffers (kvstash_register_buffer): the daemon copies them
 * between the buffer and the store and only keys and offsets cross the
 * socket. A buffer belongs to the connection that registered it.
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

/*
 * A registered shared-memory buffer: a memfd mapped read-write and shared in
 * this process and in the daemon. Opaque; owned by the connection that
 * registered it.
 */
struct kvstash_buffer;

/*
 * One piece of a transfer: bytes [offset, offset + length) of buf, which
 * must be registered on the connection the call is made on. A key's value
 * is the concatenation of its pieces, in order.
 */
struct kvstash_piece {
    const struct kvstash_buffer *buf;
    uint64_t offset;
    uint64_t length;
};

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
 * A TCP connection to this host uses the reno congestion control, set before
 * connecting, when the kernel lets it (the daemon's local_tcp_congestion; see
 * docs/architecture.md, "Loopback TCP"); other connections keep the host's.
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

/*
 * kvstash_strerror: text for a return value of any call (KV code or -errno).
 * A KV code's text is static; an errno's lives in a per-thread buffer, valid
 * until the next kvstash_strerror of an errno on the same thread.
 */
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
 * the size needed). Returns as kvstash_batch_put. In this and the other batch
 * reads and removes (kvstash_batch_is_exist, kvstash_prefix_match,
 * kvstash_batch_remove, kvstash_pin, kvstash_unpin), a key that is NULL with
 * a non-zero length fails the whole call with KVSTASH_EINVAL before anything
 * is sent (every key gets that code, or false).
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
 * kvstash_register_buffer: create a shared-memory buffer of size bytes and
 * register it with the server: a memfd (MFD_CLOEXEC | MFD_ALLOW_SEALING) of
 * that size, sealed with F_SEAL_SHRINK | F_SEAL_GROW, mapped MAP_SHARED
 * read-write here and sent to the server (SCM_RIGHTS) with the request. Its
 * bytes start zeroed. Registration is meant to happen once per connection,
 * not per transfer. Returns 0 and *out (the library keeps no descriptor of
 * its own: the mapping holds the memory); else *out is NULL and the return
 * is KVSTASH_EUNSUPPORTED when c is not a Unix-socket connection (nothing is
 * sent), KVSTASH_EINVAL for out NULL or size 0 or over INT64_MAX, a positive
 * code the server answered (KVSTASH_EUNSUPPORTED, KVSTASH_EINVAL, ...; c stays
 * usable); the negative errno of memfd_create, ftruncate, fcntl or mmap
 * (-EMFILE, -ENOMEM, ...: nothing was sent, c stays usable, and
 * kvstash_last_error names the call); or a negative errno of the connection
 * (c is then broken).
 *
 * *out belongs to c and is valid until kvstash_unregister_buffer(c, *out) or
 * kvstash_close(c), which releases every buffer still registered (the memory
 * of kvstash_buffer_ptr is then unmapped).
 */
int kvstash_register_buffer(struct kvstash *c, size_t size, struct kvstash_buffer **out);

/*
 * kvstash_register_fd: as kvstash_register_buffer, for the caller's own
 * shared memory: fd must be a memfd or a file on tmpfs or hugetlbfs (such as
 * one in /dev/shm), opened read-write, at least size bytes long. When it
 * allows sealing (a memfd created with MFD_ALLOW_SEALING), the library adds
 * F_SEAL_SHRINK to it (a permanent seal: the file can never shrink again, so
 * the daemon has nothing to guard); otherwise it is registered as it is, and
 * the daemon guards it (a transfer during which it shrinks fails, the buffer
 * is dropped: protocol/SPEC.md). Either way the library maps its first size
 * bytes MAP_SHARED read-write and sends it with the request (the daemon
 * gets its own descriptor). fd is
 * borrowed: the caller keeps it, and may close it as soon as the call
 * returns, whatever the outcome; the library never closes it. Bytes already
 * in the file are kept and visible through kvstash_buffer_ptr, and any other
 * mapping of the file sees the same memory. Returns as
 * kvstash_register_buffer, with KVSTASH_EINVAL also for fd < 0, a descriptor
 * that is not shared memory (a pipe, a socket, a file on a disk), one
 * shorter than size, or one that cannot be mapped writable (F_SEAL_WRITE,
 * F_SEAL_FUTURE_WRITE, opened read-only); kvstash_last_error says which.
 * *out as for kvstash_register_buffer.
 */
int kvstash_register_fd(struct kvstash *c, int fd, size_t size, struct kvstash_buffer **out);

/*
 * kvstash_buffer_ptr: the start (page aligned) of b's memory, size bytes,
 * shared with the daemon; NULL for NULL. Valid until b is unregistered or its
 * connection closed. The daemon reads and writes it only during the calls
 * that name it in a piece (but see kvstash_batch_get_into on failed calls).
 */
void *kvstash_buffer_ptr(const struct kvstash_buffer *b);

/* kvstash_buffer_size: b's size as registered (0 for NULL). */
size_t kvstash_buffer_size(const struct kvstash_buffer *b);

/*
 * kvstash_unregister_buffer: tell the server to forget b, then unmap and free
 * it. Accepts NULL (returns 0). b must have been registered on c, else
 * KVSTASH_EINVAL and nothing is done. Otherwise b is released whatever the
 * outcome: b and the memory of kvstash_buffer_ptr(b) are invalid once the
 * call returns, and a memfd passed to kvstash_register_fd stays open (and
 * sealed, if it was) in the caller's hands. Returns 0; KVSTASH_ENOTFOUND when the
 * server did not know the buffer; another code the server answered; or a
 * negative errno of the connection (-EPIPE when c was already broken; the
 * server releases a connection's buffers when it closes).
 */
int kvstash_unregister_buffer(struct kvstash *c, struct kvstash_buffer *b);

/*
 * kvstash_batch_put_from: store n objects whose values are already in
 * registered buffers: value i is the concatenation of pieces[i][0 ..
 * npieces[i]) (pieces[i] may be NULL when npieces[i] is 0: an empty value).
 * The daemon copies the bytes out of the shared memory; they never cross the
 * socket. codes[i] gets key i's outcome as kvstash_put, or KVSTASH_EINVAL
 * when a piece of key i is bad: its buf is NULL or not registered on c, or
 * offset + length exceeds the buffer's size. A bad piece, a key over
 * max_key_size and a value (the pieces' total) over max_value_size are
 * answered here (KVSTASH_EINVAL, KVSTASH_ETOOLARGE, KVSTASH_ETOOLARGE) and
 * not sent, as is a key with more than 65536 pieces or more than fit in
 * max_message_size (KVSTASH_ETOOLARGE); the server checks pieces the same
 * way. Batching, pipelining and the return value are those of
 * kvstash_batch_put. Pieces may overlap, within a key and across keys. A key
 * whose buffer (one not sealed against shrinking: kvstash_register_fd)
 * shrank during the call gets KVSTASH_EUNAVAILABLE and is not stored; the
 * server has then dropped the buffer (later pieces naming it: KVSTASH_EINVAL).
 *
 * Buffer reuse: the daemon reads the pieces while the call runs, so they
 * must not be written until it returns; once it returns >= 0, every key has
 * been copied (or refused) and the pieces may be overwritten at once. After
 * a negative return the daemon may still be copying pieces of requests it
 * had received, for a short while after c is closed too: a key of such a
 * call may be stored with bytes written to its pieces meanwhile.
 */
int kvstash_batch_put_from(struct kvstash *c, size_t n, const void *const *keys,
                           const size_t *klens, const struct kvstash_piece *const *pieces,
                           const size_t *npieces, int *codes);

/*
 * kvstash_batch_get_into: read n values into registered buffers: value i is
 * copied by the daemon into pieces[i][0 .. npieces[i]), filling them in
 * order. results[i] is the number of bytes written: the value's size when
 * the pieces can hold it (less than their total when the value is shorter;
 * the bytes after it are not touched); a value longer than its pieces fills
 * them and the rest is not copied, with results[i] their total (pieces one
 * byte larger than the value needs, or kvstash_get_size, tell the two
 * apart). Or minus a code: -KVSTASH_ENOTFOUND (-1) for a missing key,
 * -KVSTASH_EINVAL (-6) for a bad piece (as for kvstash_batch_put_from;
 * answered here and not sent, or by the server, which then touches no
 * memory), -KVSTASH_ETOOLARGE for a key that cannot be sent (over 4 GiB,
 * more than 65536 pieces or more than fit in max_message_size),
 * -KVSTASH_EUNAVAILABLE when its buffer shrank during the call (as for
 * kvstash_batch_put_from; its pieces hold anything). A key over
 * max_key_size reads as missing. Batching, pipelining and the return value
 * are those of kvstash_batch_put: on a request-level error the keys of that
 * request and of those not yet sent get minus that code; results[] is
 * undefined after a negative return.
 *
 * Buffer reuse: the daemon writes the pieces while the call runs; their
 * contents are complete when it returns >= 0, and pieces of a key with
 * results[i] < 0 are not written. Pieces must not overlap one another (in
 * one key or across keys), else their contents are unspecified. After a
 * negative return the daemon may still be writing pieces of requests it had
 * received, even for a short while after c is closed (which matters when the
 * caller keeps its own mapping of a memfd given to kvstash_register_fd):
 * their contents are then undefined.
 */
int kvstash_batch_get_into(struct kvstash *c, size_t n, const void *const *keys,
                           const size_t *klens, const struct kvstash_piece *const *pieces,
                           const size_t *npieces, int64_t *results);

/* ==== Direct access to the daemon's memory (Unix socket only) ====
 *
 * A same-host client can map the daemon's DRAM arena and write or read
 * objects where they live: no copy by the daemon, none through the socket
 * (protocol/SPEC.md, "Direct access"). An object lies in at most
 * KVSTASH_MAX_PLACES places of the mapped arena, in order.
 */
#define KVSTASH_MAX_PLACES 32

/* Where part of an object lies in the mapped arena. */
struct kvstash_place {
    void *ptr;
    size_t length;
};

/*
 * kvstash_map_arena: map the daemon's arena (map_segment 0) shared,
 * read-write, once per connection; later calls return the same mapping. It
 * stays mapped until kvstash_close. *base and *size may be NULL. Returns 0,
 * KVSTASH_EUNSUPPORTED over TCP (or when the daemon's arena cannot be
 * shared), KVSTASH_EINVAL on a connection with RDMA enabled (the daemon
 * answers it RDMA descriptors), a code the server answered, or a negative
 * errno (-EPROTO when no descriptor came with the reply, the errno of mmap).
 */
int kvstash_map_arena(struct kvstash *c, void **base, size_t *size);

/*
 * kvstash_put_start: reserve an object of size bytes under key and say where
 * to write it: places[0..*nplaces) (places must hold KVSTASH_MAX_PLACES),
 * whose lengths add up to size. The object is invisible until
 * kvstash_batch_put_end; kvstash_batch_put_revoke, closing c, or the
 * daemon's put_timeout_ms drop it. Maps the arena first if needed. Returns
 * 0, or the key's code (KVSTASH_EEXISTS, KVSTASH_EBUSY, KVSTASH_ENOSPACE,
 * KVSTASH_ETOOLARGE), or an error as kvstash_map_arena. Do not write the
 * places after the put has ended, been revoked or timed out.
 */
int kvstash_put_start(struct kvstash *c, const void *key, size_t klen, size_t size,
                      struct kvstash_place *places, size_t *nplaces);

/*
 * kvstash_batch_put_end, kvstash_batch_put_revoke: publish or drop n
 * objects this connection reserved with kvstash_put_start. codes[i]: 0, or
 * KVSTASH_ENOTFOUND when c holds no reservation for key i (never made,
 * already ended or revoked, or reclaimed after put_timeout_ms). Batching and
 * the return value are those of kvstash_batch_put.
 */
int kvstash_batch_put_end(struct kvstash *c, size_t n, const void *const *keys,
                          const size_t *klens, int *codes);
int kvstash_batch_put_revoke(struct kvstash *c, size_t n, const void *const *keys,
                             const size_t *klens, int *codes);

/*
 * kvstash_get_replica: where the object under key lies in the mapped arena,
 * places[0..*nplaces) (places must hold KVSTASH_MAX_PLACES), its size, and
 * the lease (ms) during which its bytes stay there untouched (not evicted,
 * not reused even if removed). Maps the arena first if needed. Reading
 * after the lease is the caller's risk: copy the bytes out within it, or ask
 * again (which extends it). Returns 0, KVSTASH_ENOTFOUND, or an error as
 * kvstash_map_arena. size and lease_ms may be NULL.
 */
int kvstash_get_replica(struct kvstash *c, const void *key, size_t klen,
                        struct kvstash_place *places, size_t *nplaces, uint64_t *size,
                        uint64_t *lease_ms);

/* ==== RDMA (kvstash_rdma.c) ====
 *
 * A client on another host registers its own memory with its RDMA device
 * and lets the daemon move values with one-sided RDMA: the socket (TCP)
 * carries only the requests (protocol/SPEC.md, "RDMA").
 */

/*
 * kvstash_rdma_enable: set up RDMA on c: ask the daemon for its queue pair
 * (hello {"rdma": true}), open `device` ("" or NULL: the first one) port
 * `port` (1..) with GID index `gid_index`, and connect a queue pair to the
 * daemon's. Returns 0; KVSTASH_EUNSUPPORTED when the daemon has no RDMA or
 * this host no usable device (kvstash_last_error says which); KVSTASH_EINVAL
 * when c has RDMA already or for bad numbers; a negative errno.
 */
int kvstash_rdma_enable(struct kvstash *c, const char *device, int port, int gid_index);

/*
 * kvstash_register_rdma_buffer: register [ptr, ptr + size) with c's RDMA
 * device (remote read and write) and with the daemon, which then reads and
 * writes it directly for kvstash_batch_put_from / kvstash_batch_get_into
 * pieces that name the buffer (same rules as a shared-memory buffer; pieces
 * of one call all name RDMA buffers or all shared-memory ones). The memory
 * stays the caller's; it must outlive the buffer. Returns 0 and *out (valid
 * until kvstash_unregister_buffer or kvstash_close); KVSTASH_EINVAL without
 * kvstash_rdma_enable; KVSTASH_ETOOLARGE when size is more than one memory
 * region of the device holds; a code the server answered; a negative errno.
 */
int kvstash_register_rdma_buffer(struct kvstash *c, void *ptr, size_t size,
                                 struct kvstash_buffer **out);

/* ==== TLS ==== */

/* What a TLS connection trusts and shows (file paths, PEM). */
struct kvstash_tls {
    const char *ca_file;     /* the CA(s) the server's certificate must chain to (required) */
    const char *cert_file;   /* a client certificate chain, when the server asks; or NULL */
    const char *key_file;    /* its private key */
};

/*
 * kvstash_connect_tls: kvstash_connect_timeout to the daemon's tls_listen
 * address host:port, over TLS 1.2 or later: the server's certificate must
 * chain to tls->ca_file and be for host (name or IP address). Returns as
 * kvstash_connect_timeout; a failed handshake is -EPROTO with the reason in
 * kvstash_last_error(NULL).
 */
int kvstash_connect_tls(const char *addr, const struct kvstash_tls *tls, int timeout_ms,
                        struct kvstash **out);

/*
 * kvstash_stats: the server's counters as a malloc'd array of *n name/value
 * pairs (free with free()). Non-integer stats are left out.
 */
int kvstash_stats(struct kvstash *c, struct kvstash_stat **items, size_t *n);

/* kvstash_stat_get: the value of name in items, or `dflt` when absent. */
uint64_t kvstash_stat_get(const struct kvstash_stat *items, size_t n, const char *name,
                          uint64_t dflt);

/* ==== The pool (docs/cluster.md) ==== */

#define KVSTASH_CLUSTER_R_MAX 16

/* One member of the pool as the daemon sees it. */
struct kvstash_cluster_node {
    char id[65];
    char addr[256];                  /* host:port peers dial */
    double weight;
    char state[16];                  /* "joining", "active", "draining" */
};

/* The daemon's view of its pool (cluster_info); "" and 0 when it is a single node. */
struct kvstash_cluster {
    char cluster[65];                /* cluster_name */
    char node_id[65];                /* this daemon's */
    char state[16];                  /* this daemon's registered-or-wanted state */
    char etcd_endpoint[256];
    bool registered;                 /* its key is in etcd */
    bool etcd_ok;                    /* etcd answered its last call */
    uint64_t revision;               /* the view's etcd revision */
    unsigned replicas;
    int self;                        /* its index in nodes, or -1 */
    size_t nnodes;
    struct kvstash_cluster_node *nodes; /* sorted by id */
    size_t nkeys;                    /* the keys asked about */
    uint32_t (*owners)[KVSTASH_CLUSTER_R_MAX]; /* owners[k][0..nowners[k]): indices into nodes */
    unsigned *nowners;
};

/*
 * kvstash_cluster_info: the daemon's view of its pool, and the owners of each of keys[0..n)
 * (klens[i] bytes each; n may be 0, keys NULL), into a malloc'd *out (free it with
 * kvstash_cluster_free). 0, or an error as every call.
 */
int kvstash_cluster_info(struct kvstash *c, const void *const *keys, const size_t *klens,
                         size_t n, struct kvstash_cluster **out);

/* kvstash_cluster_free: free what kvstash_cluster_info gave. NULL is fine. */
void kvstash_cluster_free(struct kvstash_cluster *ci);

/* kvstash_cluster_drain: register the daemon as draining (it hands its keys off, then
 * leaves the pool). KV_UNSUPPORTED when it is not in a pool, KV_FORBIDDEN for a tenant. */
int kvstash_cluster_drain(struct kvstash *c);

/* ==== Asynchronous batches (kvstash_async.c) ====
 *
 * An async context owns its own connection and one worker thread. The
 * caller submits batch requests (get_into, put_from, exists) without
 * waiting; each gets a request id. The worker runs them one after another,
 * in submission order, with the synchronous batch calls above (so each is
 * split and pipelined as they describe), and queues a completion for each.
 * Every completion adds 1 to an eventfd, which a poll/epoll loop watches;
 * kvstash_async_drain hands completions back in the order they finished
 * (which is submission order). This is the shape LMCache's native
 * connector expects (event_fd, submit_batch_get/set/exists,
 * drain_completions).
 *
 * Threads and locks: the worker thread owns the connection while it runs a
 * request. kvstash_async_submit_*, kvstash_async_drain, kvstash_async_event_fd
 * and the buffer calls may be called from any thread, concurrently with the
 * worker and with one another (an internal mutex orders them; two threads
 * submitting at once get ids in the order they took it). The intended use
 * is one submitting thread and one draining thread, possibly the same.
 * kvstash_async_close must be the last call on a context and must not run
 * concurrently with any other call on it. Internally the connection lock is
 * never held together with the queue lock. The worker blocks every signal.
 *
 * Memory: submit copies the keys and the klens, piece and npieces arrays
 * (the caller may reuse or free them as soon as submit returns); the
 * buffers the pieces name are borrowed until the request's completion has
 * been queued (seen through the eventfd or drain): the daemon reads or
 * writes them while the request runs. Pieces must name buffers registered
 * through this context (kvstash_async_register_buffer/_fd); a buffer must
 * not be named by a request submitted after it was unregistered.
 *
 * Failure: when a request fails with a negative errno and the connection is
 * broken by it (kvstash_ping tells; a local -ENOMEM, say, leaves it usable),
 * the context is failed: every request still queued completes with that
 * status without being sent, and later submits return it. Close it and open
 * another. There is no I/O timeout: a daemon that stops answering stalls
 * the worker (and kvstash_async_close, which waits for it).
 */

/* An async context over its own connection (opaque). */
struct kvstash_async;

/*
 * One finished request (filled by kvstash_async_drain).
 *
 * id: what submit returned. status: 0 when every request of the batch was
 * answered; a positive KVSTASH_E* code a request of the batch got as a
 * whole (as the return of the synchronous call); or a negative errno (the
 * connection failed: see "Failure" above, or -ENOMEM).
 *
 * results: a malloc'd array of n per-key results (NULL when n is 0), owned
 * by the caller, who releases it with kvstash_async_completion_free:
 *  - get_into: as kvstash_batch_get_into's results[i]: bytes written, or
 *    minus a code (-KVSTASH_ENOTFOUND, -KVSTASH_EINVAL, ...);
 *  - put_from: as kvstash_batch_put_from's codes[i]: 0 or a positive code;
 *  - exists: 1 or 0 when status is 0; when status is not 0 every results[i]
 *    is minus the status' magnitude (-status for a code, status for an
 *    errno), since the keys covered by a request-level error cannot be told
 *    from the others.
 * When status is negative every results[i] of a get_into or put_from is
 * status too. After a negative status of a get_into or put_from, the daemon
 * may still be reading or writing the pieces of requests it had received
 * (see kvstash_batch_get_into): their contents are then undefined.
 */
struct kvstash_completion {
    int64_t id;
    int status;
    size_t n;
    int64_t *results;
};

/*
 * kvstash_async_open: connect to addr (as kvstash_connect; shared-memory
 * buffers need a Unix-socket address, "unix:/path"), create the eventfd
 * (EFD_NONBLOCK | EFD_CLOEXEC) and start the worker thread. depth bounds
 * the requests submitted and not yet drained (queued, running, or finished
 * and waiting for drain); it must be at least 1. Returns 0 and *out, or
 * KVSTASH_EINVAL (out NULL or depth 0), an error of kvstash_connect (a
 * negative errno or a code the server answered to hello), or the negative
 * errno of eventfd or pthread_create (-EMFILE, -EAGAIN, ...). On error
 * *out is NULL (when out is not) and nothing is left behind; after a
 * kvstash_connect error, kvstash_last_error(NULL) on the same thread says why.
 */
int kvstash_async_open(const char *addr, unsigned depth, struct kvstash_async **out);

/*
 * kvstash_async_close: wait until the worker has run every submitted
 * request, then stop it, close the connection (releasing every buffer
 * registered through a: their kvstash_buffer_ptr memory is unmapped), close
 * the eventfd and free everything, completions not drained included (their
 * results are lost). Accepts NULL. See the thread rule above.
 */
void kvstash_async_close(struct kvstash_async *a);

/*
 * kvstash_async_event_fd: a's eventfd (EFD_NONBLOCK | EFD_CLOEXEC), or
 * -EINVAL for NULL. It is readable (POLLIN) exactly while completions wait
 * to be drained: its counter is their number. Owned by a: poll it, but do
 * not read, write or close it (kvstash_async_drain reads it). Valid until
 * kvstash_async_close.
 */
int kvstash_async_event_fd(const struct kvstash_async *a);

/*
 * kvstash_async_register_buffer, kvstash_async_register_fd,
 * kvstash_async_unregister_buffer: kvstash_register_buffer,
 * kvstash_register_fd and kvstash_unregister_buffer on a's connection
 * (buffers belong to the connection that registered them: pieces of a's
 * requests must name buffers registered here). Same arguments, returns and
 * ownership, with a in place of the connection (*out is valid until
 * kvstash_async_unregister_buffer(a, *out) or kvstash_async_close(a)), and
 * KVSTASH_EINVAL for a NULL (register) or -EINVAL (unregister). Registering
 * waits for the request the worker is running, if any (not for queued
 * ones: they cannot name the new buffer). Unregistering first waits until
 * every request submitted before it has finished, so none of them can see
 * the buffer go. The server's message for an error is not available here.
 */
int kvstash_async_register_buffer(struct kvstash_async *a, size_t size,
                                  struct kvstash_buffer **out);
int kvstash_async_register_fd(struct kvstash_async *a, int fd, size_t size,
                              struct kvstash_buffer **out);
int kvstash_async_unregister_buffer(struct kvstash_async *a, struct kvstash_buffer *b);

/*
 * kvstash_async_submit_get_into, kvstash_async_submit_put_from,
 * kvstash_async_submit_exists: queue kvstash_batch_get_into,
 * kvstash_batch_put_from or kvstash_batch_is_exist of n keys (n may be 0)
 * for the worker; the arguments mean what they mean there, and problems
 * with a key are answered in the completion as there: per key for get_into
 * and put_from (a NULL key, a bad piece, a key too long), for the whole
 * request for exists (a NULL key). What is copied and what is borrowed: see
 * "Memory" above.
 *
 * Returns the request id (> 0, increasing by 1 with each accepted submit)
 * or a negative errno, never a positive code: -EINVAL for a NULL, or keys,
 * klens (or pieces, npieces) NULL with n > 0; -EAGAIN when depth requests
 * are submitted and not yet drained (drain, then submit again); -ENOMEM;
 * or, once a has failed, the errno it failed with. Nothing is queued on
 * error.
 */
int64_t kvstash_async_submit_get_into(struct kvstash_async *a, size_t n, const void *const *keys,
                                      const size_t *klens,
                                      const struct kvstash_piece *const *pieces,
                                      const size_t *npieces);
int64_t kvstash_async_submit_put_from(struct kvstash_async *a, size_t n, const void *const *keys,
                                      const size_t *klens,
                                      const struct kvstash_piece *const *pieces,
                                      const size_t *npieces);
int64_t kvstash_async_submit_exists(struct kvstash_async *a, size_t n, const void *const *keys,
                                    const size_t *klens);

/*
 * kvstash_async_drain: move up to max finished requests, oldest first,
 * into out[0..) and return how many (0 when none is ready, or for a or out
 * NULL or max 0). Never blocks on the daemon (it takes the internal lock
 * briefly). Reads the eventfd counter down by the number returned, so the
 * eventfd stays readable while completions remain. Each out[i].results is
 * then the caller's (kvstash_async_completion_free), and the request no
 * longer counts against depth.
 */
size_t kvstash_async_drain(struct kvstash_async *a, struct kvstash_completion *out, size_t max);

/* kvstash_async_completion_free: free c->results and set it NULL, n 0. Accepts NULL. */
void kvstash_async_completion_free(struct kvstash_completion *c);

#endif
