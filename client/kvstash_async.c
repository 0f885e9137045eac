/*
 * kvstash_async: the asynchronous batch calls of libkvstash (kvstash.h,
 * "Asynchronous batches").
 *
 * This module owns an async context: its connection, its worker thread, the
 * queue of submitted requests, the queue of completions and the eventfd
 * that counts them. It is built only on the public synchronous API: it must
 * not touch the socket, a msgpack byte or struct kvstash's fields (the
 * socket and requests are kvstash_wire.c's, reply decoding is
 * kvstash_reply.c's, batching and argument checks are kvstash.c's), so a
 * request run here behaves exactly as the synchronous call would.
 *
 * Locks: `lock` guards the queues, the counters and the eventfd's counter
 * (every read and write of the eventfd happens under it, so its value is
 * always the number of completions waiting); `conn_lock` guards the
 * connection, which the worker holds while it runs one request and the
 * buffer calls hold while they register or unregister. The two are never
 * held together. Requests run one at a time, in submission order: the
 * synchronous batch calls already keep several wire requests in flight, and
 * running async requests back to back keeps each one's request-level status
 * its own (coalescing them into one call would not).
 */
#include "kvstash.h"

#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

enum kvstash_async_kind {
    KVSTASH_ASYNC_GET_INTO,
    KVSTASH_ASYNC_PUT_FROM,
    KVSTASH_ASYNC_EXISTS,
};

/*
 * A submitted request, then its completion. The arrays of the call live in
 * one block (`in`), freed as soon as the request has run; results is
 * allocated at submit, so a finished request can always be reported.
 */
struct kvstash_async_req {
    struct kvstash_async_req *next;
    int64_t id;
    enum kvstash_async_kind kind;
    int status;
    size_t n;
    void *in; /* the block below points into */
    const void **keys;
    size_t *klens;
    const struct kvstash_piece **pieces; /* get_into, put_from */
    size_t *npieces;
    int *codes;       /* put_from */
    bool *exists;     /* exists */
    int64_t *results; /* handed to the caller by drain */
};

struct kvstash_async {
    struct kvstash *conn;
    pthread_mutex_t conn_lock;
    pthread_mutex_t lock;
    pthread_cond_t work;     /* worker: a request was queued, or closing */
    pthread_cond_t progress; /* unregister: a request finished */
    pthread_t worker;
    int efd;
    unsigned depth;
    int inited;   /* how far open got (for close) */
    bool running; /* the worker was started */
    /* under lock: */
    bool closing;
    int failed;         /* the negative errno the connection failed with */
    size_t outstanding; /* submitted and not drained */
    int64_t next_id;
    int64_t done_id; /* the last id finished (ids finish in order) */
    struct kvstash_async_req *todo_head;
    struct kvstash_async_req *todo_tail;
    struct kvstash_async_req *done_head;
    struct kvstash_async_req *done_tail;
    size_t ndone;
};

/* what open has built, for kvstash_async_close on a half-built context */
enum { ASYNC_INIT_CONN_LOCK = 1, ASYNC_INIT_LOCK, ASYNC_INIT_WORK, ASYNC_INIT_PROGRESS };

static void
kvstash_async_req_free(struct kvstash_async_req *r)
{
    if (r == NULL) {
        return;
    }
    free(r->in);
    free(r->results);
    free(r);
}

/* kvstash_async_efd_add_locked: add v to the eventfd counter (lock held). */
static void
kvstash_async_efd_add_locked(struct kvstash_async *a, uint64_t v)
{
    ssize_t w;

    /* only overflow past 2^64 - 2 could refuse it, which n completions never reach */
    do {
        w = write(a->efd, &v, sizeof(v));
    } while (w < 0 && errno == EINTR);
}

/* ---- the worker ---- */

/*
 * kvstash_async_exec: run r on the connection (conn_lock held). Returns the
 * negative errno that broke the connection, or 0 when it is still usable.
 */
static int
kvstash_async_exec(struct kvstash_async *a, struct kvstash_async_req *r)
{
    const void *const *keys = (const void *const *)r->keys;
    const struct kvstash_piece *const *pieces = (const struct kvstash_piece *const *)r->pieces;
    int rc = 0;

    switch (r->kind) {
    case KVSTASH_ASYNC_GET_INTO:
        rc = kvstash_batch_get_into(a->conn, r->n, keys, r->klens, pieces, r->npieces, r->results);
        break;
    case KVSTASH_ASYNC_PUT_FROM:
        rc = kvstash_batch_put_from(a->conn, r->n, keys, r->klens, pieces, r->npieces, r->codes);
        if (rc >= 0) {
            for (size_t i = 0; i < r->n; i++) {
                r->results[i] = r->codes[i];
            }
        }
        break;
    case KVSTASH_ASYNC_EXISTS:
        rc = kvstash_batch_is_exist(a->conn, r->n, keys, r->klens, r->exists);
        for (size_t i = 0; i < r->n; i++) {
            r->results[i] = rc == 0 ? (int64_t)r->exists[i] : rc < 0 ? rc : -(int64_t)rc;
        }
        break;
    }
    r->status = rc;
    if (rc >= 0) {
        return 0;
    }
    for (size_t i = 0; i < r->n; i++) {
        r->results[i] = rc;
    }
    /* -ENOMEM before anything was sent leaves the connection usable; a ping tells */
    return kvstash_ping(a->conn) < 0 ? rc : 0;
}

/* kvstash_async_run: r's outcome, or `failed` for every key when the context has failed. */
static int
kvstash_async_run(struct kvstash_async *a, struct kvstash_async_req *r, int failed)
{
    int broke = 0;

    if (failed != 0) {
        r->status = failed;
        for (size_t i = 0; i < r->n; i++) {
            r->results[i] = failed;
        }
    } else {
        pthread_mutex_lock(&a->conn_lock);
        broke = kvstash_async_exec(a, r);
        pthread_mutex_unlock(&a->conn_lock);
    }
    free(r->in);
    r->in = NULL;
    return broke;
}

static void *
kvstash_async_main(void *arg)
{
    struct kvstash_async *a = arg;

    pthread_mutex_lock(&a->lock);
    for (;;) {
        while (a->todo_head == NULL && !a->closing) {
            pthread_cond_wait(&a->work, &a->lock);
        }
        struct kvstash_async_req *r = a->todo_head;
        if (r == NULL) {
            break; /* closing, and everything submitted has run */
        }
        a->todo_head = r->next;
        if (a->todo_head == NULL) {
            a->todo_tail = NULL;
        }
        r->next = NULL;
        int failed = a->failed;
        pthread_mutex_unlock(&a->lock);

        int broke = kvstash_async_run(a, r, failed);

        pthread_mutex_lock(&a->lock);
        if (broke != 0 && a->failed == 0) {
            a->failed = broke;
        }
        if (a->done_tail != NULL) {
            a->done_tail->next = r;
        } else {
            a->done_head = r;
        }
        a->done_tail = r;
        a->ndone++;
        a->done_id = r->id;
        kvstash_async_efd_add_locked(a, 1);
        pthread_cond_broadcast(&a->progress);
    }
    pthread_mutex_unlock(&a->lock);
    return NULL;
}

/* ---- open and close ---- */

int
kvstash_async_open(const char *addr, unsigned depth, struct kvstash_async **out)
{
    struct kvstash_async *a;
    sigset_t all, old;
    int rc;

    if (out == NULL) {
        return KVSTASH_EINVAL;
    }
    *out = NULL;
    if (depth == 0) {
        return KVSTASH_EINVAL;
    }
    a = calloc(1, sizeof(*a));
    if (a == NULL) {
        return -ENOMEM;
    }
    a->efd = -1;
    a->depth = depth;
    a->next_id = 1;
    if ((rc = pthread_mutex_init(&a->conn_lock, NULL)) != 0) {
        goto fail_errno;
    }
    a->inited = ASYNC_INIT_CONN_LOCK;
    if ((rc = pthread_mutex_init(&a->lock, NULL)) != 0) {
        goto fail_errno;
    }
    a->inited = ASYNC_INIT_LOCK;
    if ((rc = pthread_cond_init(&a->work, NULL)) != 0) {
        goto fail_errno;
    }
    a->inited = ASYNC_INIT_WORK;
    if ((rc = pthread_cond_init(&a->progress, NULL)) != 0) {
        goto fail_errno;
    }
    a->inited = ASYNC_INIT_PROGRESS;
    a->efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (a->efd < 0) {
        rc = errno;
        goto fail_errno;
    }
    rc = kvstash_connect(addr, &a->conn);
    if (rc != 0) {
        goto fail;
    }
    /* the worker takes no signal meant for the application's threads */
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    rc = pthread_create(&a->worker, NULL, kvstash_async_main, a);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (rc != 0) {
        goto fail_errno;
    }
    a->running = true;
    *out = a;
    return 0;

fail_errno:
    rc = -rc;
fail:
    kvstash_async_close(a);
    return rc;
}

void
kvstash_async_close(struct kvstash_async *a)
{
    struct kvstash_async_req *r;

    if (a == NULL) {
        return;
    }
    if (a->running) {
        pthread_mutex_lock(&a->lock);
        a->closing = true;
        pthread_cond_signal(&a->work);
        pthread_mutex_unlock(&a->lock);
        pthread_join(a->worker, NULL);
    }
    while ((r = a->todo_head) != NULL) { /* none once the worker has run; for safety */
        a->todo_head = r->next;
        kvstash_async_req_free(r);
    }
    while ((r = a->done_head) != NULL) {
        a->done_head = r->next;
        kvstash_async_req_free(r);
    }
    kvstash_close(a->conn);
    if (a->efd >= 0) {
        close(a->efd);
    }
    if (a->inited >= ASYNC_INIT_PROGRESS) {
        pthread_cond_destroy(&a->progress);
    }
    if (a->inited >= ASYNC_INIT_WORK) {
        pthread_cond_destroy(&a->work);
    }
    if (a->inited >= ASYNC_INIT_LOCK) {
        pthread_mutex_destroy(&a->lock);
    }
    if (a->inited >= ASYNC_INIT_CONN_LOCK) {
        pthread_mutex_destroy(&a->conn_lock);
    }
    free(a);
}

int
kvstash_async_event_fd(const struct kvstash_async *a)
{
    return a != NULL ? a->efd : -EINVAL;
}

/* ---- buffers ---- */

int
kvstash_async_register_buffer(struct kvstash_async *a, size_t size, struct kvstash_buffer **out)
{
    int rc;

    if (a == NULL) {
        if (out != NULL) {
            *out = NULL;
        }
        return KVSTASH_EINVAL;
    }
    pthread_mutex_lock(&a->conn_lock);
    rc = kvstash_register_buffer(a->conn, size, out);
    pthread_mutex_unlock(&a->conn_lock);
    return rc;
}

int
kvstash_async_register_fd(struct kvstash_async *a, int fd, size_t size, struct kvstash_buffer **out)
{
    int rc;

    if (a == NULL) {
        if (out != NULL) {
            *out = NULL;
        }
        return KVSTASH_EINVAL;
    }
    pthread_mutex_lock(&a->conn_lock);
    rc = kvstash_register_fd(a->conn, fd, size, out);
    pthread_mutex_unlock(&a->conn_lock);
    return rc;
}

int
kvstash_async_unregister_buffer(struct kvstash_async *a, struct kvstash_buffer *b)
{
    int rc;

    if (b == NULL) {
        return 0;
    }
    if (a == NULL) {
        return -EINVAL;
    }
    /* the requests submitted so far may name b: let them finish with it */
    pthread_mutex_lock(&a->lock);
    int64_t last = a->next_id - 1;
    while (a->done_id < last) {
        pthread_cond_wait(&a->progress, &a->lock);
    }
    pthread_mutex_unlock(&a->lock);

    pthread_mutex_lock(&a->conn_lock);
    rc = kvstash_unregister_buffer(a->conn, b);
    pthread_mutex_unlock(&a->conn_lock);
    return rc;
}

/* ---- submit ---- */

/*
 * kvstash_async_carve: place count items of size/align at the next aligned
 * offset of a block being laid out. false on size_t overflow.
 */
static bool
kvstash_async_carve(size_t *off, size_t count, size_t size, size_t align, size_t *at)
{
    if (*off > SIZE_MAX - (align - 1)) {
        return false;
    }
    size_t o = (*off + align - 1) / align * align;
    if (size != 0 && count > (SIZE_MAX - o) / size) {
        return false;
    }
    *at = o;
    *off = o + count * size;
    return true;
}

/*
 * kvstash_async_req_new: a request holding copies of the call's arrays, its
 * keys and its pieces. 0 and *out, or -ENOMEM (also for sizes that overflow).
 */
static int
kvstash_async_req_new(enum kvstash_async_kind kind, size_t n, const void *const *keys,
                      const size_t *klens, const struct kvstash_piece *const *pieces,
                      const size_t *npieces, struct kvstash_async_req **out)
{
    bool iovs = kind != KVSTASH_ASYNC_EXISTS;
    size_t kbytes = 0, npc = 0, off = 0;
    size_t o_keys, o_klens, o_pieces = 0, o_npieces = 0, o_pc = 0, o_codes, o_exists, o_kb;
    struct kvstash_async_req *r;

    for (size_t i = 0; i < n; i++) {
        if (keys[i] != NULL) {
            if (klens[i] > SIZE_MAX - kbytes) {
                return -ENOMEM;
            }
            kbytes += klens[i];
        }
        if (iovs && pieces[i] != NULL) {
            if (npieces[i] > SIZE_MAX - npc) {
                return -ENOMEM;
            }
            npc += npieces[i];
        }
    }
    if (!kvstash_async_carve(&off, n, sizeof(void *), _Alignof(void *), &o_keys) ||
        !kvstash_async_carve(&off, n, sizeof(size_t), _Alignof(size_t), &o_klens) ||
        (iovs && (!kvstash_async_carve(&off, n, sizeof(void *), _Alignof(void *), &o_pieces) ||
                  !kvstash_async_carve(&off, n, sizeof(size_t), _Alignof(size_t), &o_npieces) ||
                  !kvstash_async_carve(&off, npc, sizeof(struct kvstash_piece),
                                       _Alignof(struct kvstash_piece), &o_pc))) ||
        !kvstash_async_carve(&off, n, sizeof(int), _Alignof(int), &o_codes) ||
        !kvstash_async_carve(&off, n, sizeof(bool), _Alignof(bool), &o_exists) ||
        !kvstash_async_carve(&off, kbytes, 1, 1, &o_kb) || off > SIZE_MAX - 1) {
        return -ENOMEM;
    }
    r = calloc(1, sizeof(*r));
    if (r == NULL) {
        return -ENOMEM;
    }
    r->kind = kind;
    r->n = n;
    r->in = malloc(off + 1); /* + 1: n == 0 still gets a block */
    r->results = n > 0 ? calloc(n, sizeof(*r->results)) : NULL;
    if (r->in == NULL || (n > 0 && r->results == NULL)) {
        kvstash_async_req_free(r);
        return -ENOMEM;
    }
    char *base = r->in;
    r->keys = (const void **)(void *)(base + o_keys);
    r->klens = (size_t *)(void *)(base + o_klens);
    r->codes = (int *)(void *)(base + o_codes);
    r->exists = (bool *)(void *)(base + o_exists);
    char *kb = base + o_kb;
    struct kvstash_piece *pc = NULL;
    if (iovs) {
        r->pieces = (const struct kvstash_piece **)(void *)(base + o_pieces);
        r->npieces = (size_t *)(void *)(base + o_npieces);
        pc = (struct kvstash_piece *)(void *)(base + o_pc);
    }
    for (size_t i = 0; i < n; i++) {
        r->klens[i] = klens[i];
        r->keys[i] = NULL;
        if (keys[i] != NULL) { /* a NULL key is passed on, to be refused per key */
            if (klens[i] > 0) {
                memcpy(kb, keys[i], klens[i]);
            }
            r->keys[i] = kb;
            kb += klens[i];
        }
        if (iovs) {
            r->npieces[i] = npieces[i];
            r->pieces[i] = NULL;
            if (pieces[i] != NULL) {
                if (npieces[i] > 0) {
                    memcpy(pc, pieces[i], npieces[i] * sizeof(*pc));
                }
                r->pieces[i] = pc;
                pc += npieces[i];
            }
        }
    }
    *out = r;
    return 0;
}

/* kvstash_async_refuse_locked: why a new request cannot be taken now, or 0. */
static int
kvstash_async_refuse_locked(const struct kvstash_async *a)
{
    if (a->failed != 0) {
        return a->failed;
    }
    if (a->outstanding >= a->depth) {
        return -EAGAIN;
    }
    return 0;
}

static int64_t
kvstash_async_submit(struct kvstash_async *a, enum kvstash_async_kind kind, size_t n,
                     const void *const *keys, const size_t *klens,
                     const struct kvstash_piece *const *pieces, const size_t *npieces)
{
    struct kvstash_async_req *r = NULL;
    int64_t id;
    int rc;

    if (a == NULL || (n > 0 && (keys == NULL || klens == NULL))) {
        return -EINVAL;
    }
    if (kind != KVSTASH_ASYNC_EXISTS && n > 0 && (pieces == NULL || npieces == NULL)) {
        return -EINVAL;
    }
    /* refuse before copying (a caller polling a full queue copies nothing) ... */
    pthread_mutex_lock(&a->lock);
    rc = kvstash_async_refuse_locked(a);
    pthread_mutex_unlock(&a->lock);
    if (rc != 0) {
        return rc;
    }
    rc = kvstash_async_req_new(kind, n, keys, klens, pieces, npieces, &r);
    if (rc != 0) {
        return rc;
    }
    /* ... and again after, when another thread may have submitted meanwhile */
    pthread_mutex_lock(&a->lock);
    rc = kvstash_async_refuse_locked(a);
    if (rc != 0) {
        pthread_mutex_unlock(&a->lock);
        kvstash_async_req_free(r);
        return rc;
    }
    id = a->next_id++;
    r->id = id;
    a->outstanding++;
    if (a->todo_tail != NULL) {
        a->todo_tail->next = r;
    } else {
        a->todo_head = r;
    }
    a->todo_tail = r;
    pthread_cond_signal(&a->work);
    pthread_mutex_unlock(&a->lock);
    return id;
}

int64_t
kvstash_async_submit_get_into(struct kvstash_async *a, size_t n, const void *const *keys,
                              const size_t *klens, const struct kvstash_piece *const *pieces,
                              const size_t *npieces)
{
    return kvstash_async_submit(a, KVSTASH_ASYNC_GET_INTO, n, keys, klens, pieces, npieces);
}

int64_t
kvstash_async_submit_put_from(struct kvstash_async *a, size_t n, const void *const *keys,
                              const size_t *klens, const struct kvstash_piece *const *pieces,
                              const size_t *npieces)
{
    return kvstash_async_submit(a, KVSTASH_ASYNC_PUT_FROM, n, keys, klens, pieces, npieces);
}

int64_t
kvstash_async_submit_exists(struct kvstash_async *a, size_t n, const void *const *keys,
                            const size_t *klens)
{
    return kvstash_async_submit(a, KVSTASH_ASYNC_EXISTS, n, keys, klens, NULL, NULL);
}

/* ---- completions ---- */

size_t
kvstash_async_drain(struct kvstash_async *a, struct kvstash_completion *out, size_t max)
{
    size_t k = 0;
    uint64_t v;

    if (a == NULL || out == NULL || max == 0) {
        return 0;
    }
    pthread_mutex_lock(&a->lock);
    if (a->ndone > 0) {
        /* take the counter to 0, then give back what stays queued */
        while (read(a->efd, &v, sizeof(v)) < 0 && errno == EINTR) {
        }
        while (k < max && a->done_head != NULL) {
            struct kvstash_async_req *r = a->done_head;
            a->done_head = r->next;
            if (a->done_head == NULL) {
                a->done_tail = NULL;
            }
            out[k] = (struct kvstash_completion){
                .id = r->id,
                .status = r->status,
                .n = r->n,
                .results = r->results,
            };
            r->results = NULL;
            kvstash_async_req_free(r);
            k++;
        }
        a->ndone -= k;
        a->outstanding -= k;
        if (a->ndone > 0) {
            kvstash_async_efd_add_locked(a, a->ndone);
        }
    }
    pthread_mutex_unlock(&a->lock);
    return k;
}

void
kvstash_async_completion_free(struct kvstash_completion *c)
{
    if (c == NULL) {
        return;
    }
    free(c->results);
    c->results = NULL;
    c->n = 0;
}
