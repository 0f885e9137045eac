/*
 * rpc_shm: the shared-memory methods (protocol/SPEC.md, "Shared-memory
 * buffers"): register_buffer, unregister_buffer, batch_put_from and
 * batch_get_into. A transfer is validated and set up here, on the event
 * loop (keys, pieces against their buffers, reservations or references,
 * one copy segment per contiguous run), then handed to rpc_defer.c, which
 * has the copy threads (storage/copier.h) run it and answers when the
 * copies are done, so the loop never does a big memcpy. Keys of a
 * batch_get_into that are on the SSD only and whose pieces suit O_DIRECT
 * are read from the disk straight into the client's pieces.
 *
 * Buffers come as descriptors with the request (ctx->take_fd, over the Unix
 * socket); the connection's set of them (ctx->bufs) is made here on demand
 * and mapped by storage/shmbuf.h. Pieces may name RDMA buffers instead
 * (rpc_rdma.c): such a transfer is a list of RDMA READs (put) or WRITEs
 * (get) between the arena and the client's memory. One request's pieces all
 * name buffers of one kind. Like every handler file it calls only the
 * shared pieces below it (rpc_defer, rpc_rdma, rpc_req) and never touches
 * sockets or the event loop.
 */
#include "rpc_shm.h"

#include <errno.h>
#include <msgpack.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <sys/uio.h>
#include <unistd.h>

#include "kverr.h"
#include "mp.h"
#include "rpc_defer.h"
#include "rpc_rdma.h"
#include "rpc_req.h"
#include "shmbuf.h"
#include "store.h"

#define RPC_MAX_PIECES 65536        /* pieces of one request */
#define RPC_DIRECT_ALIGN 4096u      /* what O_DIRECT needs of the client's pieces */

enum { RPC_PIECES_NONE, RPC_PIECES_SHM, RPC_PIECES_RDMA };

/* A get_into key read from the SSD tier straight into the client's pieces. */
struct rpc_dread {
    struct store *st;
    struct store_obj *obj;          /* the transfer's reference (x->objs[i]) */
    int64_t *res;                   /* x->res[i]: bytes, or minus a code */
    struct shmbuf *guard;           /* the guarded buffer all the pieces are in, or NULL */
    struct iovec iov[STORE_MAX_EXTENTS];
    int n;
};

/* ---- buffers ---- */

int
rpc_register_buffer(struct rpc_req *rq)
{
    struct rpc_ctx *ctx = rq->ctx;
    struct rpc_opts opts;
    const char *why = NULL;
    uint64_t id;
    /* Taken first: a request that fails still consumes the descriptor it came with. */
    int fd = ctx->take_fd != NULL ? ctx->take_fd(ctx->take_fd_arg) : -1;
    int rc = rpc_arity(rq, 1, 1);

    if (rc == 0) {
        rc = rpc_opts_read(rq, 0, &opts);
    }
    if (rc == 0 && opts.rdma) {
        if (fd >= 0) {
            close(fd);
        }
        return rpc_rdma_register(rq, &opts);
    }
    if (rc == 0 && !ctx->is_unix) {
        rq->errmsg = "shared-memory buffers need the Unix socket";
        rc = KV_UNSUPPORTED;
    }
    if (rc == 0 && !opts.has_size) {
        rc = rpc_invalid(rq, "opts.size is required");
    }
    if (rc == 0 && fd < 0) {
        rc = rpc_invalid(rq, "no file descriptor came with register_buffer");
    }
    if (rc != 0) {
        if (fd >= 0) {
            close(fd);
        }
        return rc;
    }
    if (ctx->bufs == NULL && shmbuf_set_create(&ctx->bufs) != 0) {
        close(fd);
        return -ENOMEM;
    }
    rc = shmbuf_register(ctx->bufs, fd, opts.size, &id, &why);
    if (rc == KV_INVALID_ARGUMENT) {
        return rpc_invalid(rq, why);
    }
    if (rc != 0) {
        rq->errmsg = why;
        return rc < 0 ? KV_INTERNAL : rc;
    }
    rpc_reply_head(rq);
    msgpack_pack_uint64(&rq->pk, id);
    return 0;
}

int
rpc_unregister_buffer(struct rpc_req *rq)
{
    uint64_t id;
    int rc = rpc_arity(rq, 1, 1);

    if (rc != 0) {
        return rc;
    }
    if (mp_read_uint(&rq->rd, &id) != 0) {
        return rpc_invalid(rq, "buffer id must be an unsigned integer");
    }
    rc = id >= RPC_RDMA_ID_BASE ? rpc_rdma_unregister(rq->ctx, id)
                                : shmbuf_unregister(rq->ctx->bufs, id);
    rpc_reply_head(rq);
    msgpack_pack_int(&rq->pk, rc);
    return 0;
}

/* ---- transfers ---- */

/*
 * rpc_iovs_check: the iovs param, [[[id, offset, length], ...], ...], one
 * list per key: shape only (request-level errors). Counts every piece.
 */
static int
rpc_iovs_check(struct rpc_req *rq, uint32_t nkeys, uint32_t *npieces)
{
    uint32_t n;

    *npieces = 0;
    if (mp_read_array(&rq->rd, &n) != 0 || n != nkeys) {
        return rpc_invalid(rq, "iovs must be an array with one list of pieces per key");
    }
    for (uint32_t i = 0; i < n; i++) {
        uint32_t np;

        if (mp_read_array(&rq->rd, &np) != 0) {
            return rpc_invalid(rq, "iovs[i] must be an array of [buffer_id, offset, length]");
        }
        if (np > RPC_MAX_PIECES - *npieces) {
            return rpc_invalid(rq, "too many pieces in one request");
        }
        *npieces += np;
        for (uint32_t k = 0; k < np; k++) {
            uint32_t three;

            if (mp_read_array(&rq->rd, &three) != 0 || three != 3) {
                return rpc_invalid(rq, "a piece is [buffer_id, offset, length]");
            }
            for (int f = 0; f < 3; f++) {
                enum mp_type t = mp_peek(&rq->rd);

                if ((t != MP_UINT && t != MP_INT) || mp_skip(&rq->rd) != 0) {
                    return rpc_invalid(rq, "a piece is [buffer_id, offset, length] integers");
                }
            }
        }
    }
    return 0;
}

/*
 * rpc_xfer_params: the [ks, iovs, ...] of a transfer (at most max params):
 * readers at the keys and at the iovs, their counts; the shape is checked,
 * the reader left after the iovs. 0 or a request-level error.
 */
static int
rpc_xfer_params(struct rpc_req *rq, uint32_t max, struct mp_reader *keys, uint32_t *nkeys,
                struct mp_reader *iovs, uint32_t *npieces)
{
    int rc = rpc_arity(rq, 2, max);

    if (rc == 0) {
        rc = rpc_keys_skip(rq, nkeys, keys);
    }
    if (rc != 0) {
        return rc;
    }
    *iovs = rq->rd;
    return rpc_iovs_check(rq, *nkeys, npieces);
}

/*
 * rpc_pieces_read: the pieces of one key into pc[0..*np) with a buffer
 * reference each kept in x. Returns 0 and the total length, or
 * KV_INVALID_ARGUMENT (a bad piece: unknown buffer, out of range, negative).
 */
static int
rpc_pieces_read(struct rpc_req *rq, struct mp_reader *rd, struct rpc_xfer *x,
                struct rpc_piece *pc, uint32_t *np, uint64_t *total)
{
    uint32_t n;
    int kind;
    int rc = 0;

    mp_read_array(rd, &n);
    *np = n;
    *total = 0;
    for (uint32_t k = 0; k < n; k++) {
        int64_t sv[3];
        uint64_t v[3];
        uint32_t three;
        struct shmbuf *b;

        mp_read_array(rd, &three);
        for (int f = 0; f < 3; f++) {
            if (mp_read_uint(rd, &v[f]) != 0) {
                (void)mp_read_int(rd, &sv[f]);  /* shape checked: negative, so invalid */
                v[f] = UINT64_MAX;
                rc = KV_INVALID_ARGUMENT;
            }
        }
        if (rc != 0) {
            continue;
        }
        kind = v[0] >= RPC_RDMA_ID_BASE ? RPC_PIECES_RDMA : RPC_PIECES_SHM;
        if (x->kind != RPC_PIECES_NONE && x->kind != kind) {
            rc = KV_INVALID_ARGUMENT;   /* one request, one kind of buffer */
            continue;
        }
        pc[k].len = v[2];
        pc[k].guard = NULL;
        if (kind == RPC_PIECES_RDMA) {
            pc[k].ptr = NULL;
            rc = rpc_rdma_piece(rq->ctx, v[0], v[1], v[2], &pc[k].raddr, &pc[k].rkey);
        } else {
            b = shmbuf_get(rq->ctx->bufs, v[0]);
            if (b == NULL) {
                rc = KV_INVALID_ARGUMENT;
                continue;
            }
            x->bufs[x->nbufs++] = b;
            if (shmbuf_guarded(b)) {
                pc[k].guard = b;
                x->guarded = true;
            }
            pc[k].ptr = shmbuf_range(b, v[1], v[2]);
            rc = pc[k].ptr == NULL ? KV_INVALID_ARGUMENT : 0;
        }
        if (rc != 0 || v[2] > UINT64_MAX - *total) {
            rc = KV_INVALID_ARGUMENT;
            continue;
        }
        x->kind = kind;
        *total += v[2];
    }
    return rc;
}

int
rpc_batch_put_from(struct rpc_req *rq)
{
    const struct rpc_limits *lim = rq->ctx->lim;
    struct mp_reader keys, iovs;
    struct rpc_piece *pc = NULL;
    struct rpc_xfer *x;
    struct rpc_opts opts;
    uint32_t nkeys, npieces;
    uint32_t start;
    int rc = rpc_xfer_params(rq, 3, &keys, &nkeys, &iovs, &npieces);

    if (rc == 0) {
        rc = rpc_put_opts_read(rq, 2, &opts);
    }
    if (rc != 0) {
        return rc;
    }
    /* A batch that waited for room comes back with its reservations so far. */
    x = rq->ctx->xresume;
    rq->ctx->xresume = NULL;
    if (x != NULL && x->n != nkeys) {
        rpc_xfer_free(x);
        x = NULL;
    }
    start = x != NULL ? x->next : 0;
    if (x == NULL) {
        x = rpc_xfer_new(rq, nkeys, npieces, true);
    }
    if (x != NULL) {
        x->durable = opts.durable;
    }
    pc = malloc((npieces ? npieces : 1) * sizeof(*pc));
    if (x == NULL || pc == NULL) {
        free(pc);
        if (x != NULL) {
            rpc_xfer_free(x);
        }
        return -ENOMEM;
    }
    mp_read_array(&iovs, &nkeys);
    for (uint32_t i = 0; i < nkeys; i++) {
        const uint8_t *kp;
        uint32_t klen, np;
        uint32_t nbufs = x->nbufs;
        uint64_t total;
        struct kv_key key;

        rpc_read_key(&keys, &kp, &klen);
        if (i < start) {
            (void)mp_skip(&iovs);       /* set up before the wait */
            continue;
        }
        rc = rpc_pieces_read(rq, &iovs, x, pc, &np, &total);
        x->kbufs[i] = x->nbufs;
        if (rc == 0 && (klen > lim->max_key_size || total > lim->max_value_size)) {
            rc = KV_TOO_LARGE;
        }
        if (rc == 0) {
            rpc_key(rq, kp, klen, &key);
            rc = store_reserve(x->st, &key, total, &x->objs[i]);
            if (rc == -EAGAIN && !rq->ctx->final_try) {
                /* Wait for room with what is set up; the same message comes back. */
                x->objs[i] = NULL;
                while (x->nbufs > nbufs) {
                    shmbuf_unref(x->bufs[--x->nbufs]);  /* this key's, read again then */
                }
                x->next = i;
                rq->ctx->xresume = x;
                free(pc);
                return -EAGAIN;
            }
            if (rc != 0) {
                x->objs[i] = NULL;
                rc = rc == -EAGAIN ? KV_NO_SPACE : rc < 0 ? KV_INTERNAL : rc;
            }
        }
        if (rc == 0) {
            rc = rpc_xfer_map(x, i, x->objs[i], pc, np, total, true);
            if (rc != 0) {
                free(pc);
                rpc_xfer_free(x);
                return rc;
            }
        }
        x->res[i] = rc;
    }
    free(pc);
    return rpc_xfer_start(rq->ctx, x, rpc_rdma_qp(rq->ctx), rq->out);
}

/* One key's pieces within a transfer's piece array, as rpc_pieces_read found them. */
struct rpc_key_pieces {
    uint32_t off;
    uint32_t np;
    uint64_t cap;
    int rc;
};

/*
 * rpc_dread_fits: pieces O_DIRECT can read a whole value of size bytes
 * into: 4 KiB-aligned addresses and lengths, at most STORE_MAX_EXTENTS of
 * them for the value, and, when one is in a guarded buffer, all in that
 * one (a thread guards one buffer at a time). Fills d->iov, d->n, d->guard.
 */
static bool
rpc_dread_fits(struct rpc_dread *d, const struct rpc_piece *pc, uint32_t np, uint64_t size)
{
    uint64_t left = size;

    d->n = 0;
    d->guard = np > 0 ? pc[0].guard : NULL;
    if (size == 0 || size % RPC_DIRECT_ALIGN != 0) {
        return false;
    }
    for (uint32_t p = 0; p < np && left > 0; p++) {
        uint64_t len = pc[p].len < left ? pc[p].len : left;

        if (d->n == STORE_MAX_EXTENTS || (uintptr_t)pc[p].ptr % RPC_DIRECT_ALIGN != 0
            || len % RPC_DIRECT_ALIGN != 0 || pc[p].guard != d->guard) {
            return false;
        }
        d->iov[d->n].iov_base = pc[p].ptr;
        d->iov[d->n].iov_len = (size_t)len;
        d->n++;
        left -= len;
    }
    return left == 0;
}

/*
 * The copy threads' side of a direct read (a segment's run hook, guarded
 * by d->guard). The kernel writing into pages the client cut off fails the
 * read (EFAULT, no SIGBUS): the buffer failed, as if a copy had faulted.
 */
static void
rpc_dread_run(void *arg)
{
    struct rpc_dread *d = arg;
    int rc = store_read_stored(d->st, d->obj, d->iov, d->n);

    if (rc == KV_UNAVAILABLE && d->guard != NULL) {
        shmbuf_fail(d->guard);
    }
    *d->res = rc == 0 ? (int64_t)store_obj_size(d->obj) : -(int64_t)rc;
}

/*
 * rpc_get_into_direct: the keys whose objects are on the SSD tier only and
 * whose pieces suit O_DIRECT get a reference (store_get_stored) and a
 * direct read: the value goes from the disk into the client's pieces, with
 * no stop in the arena. Marks them in skip. Returns 0 or -ENOMEM.
 */
static int
rpc_get_into_direct(struct rpc_req *rq, struct rpc_xfer *x, struct mp_reader keys,
                    const struct rpc_key_pieces *kp, const struct rpc_piece *pc, uint8_t *skip)
{
    struct store *st = x->st;

    for (uint32_t i = 0; i < x->n; i++) {
        const uint8_t *p;
        uint32_t klen;
        struct kv_key key;
        struct store_obj *o;
        struct rpc_dread *d;

        rpc_read_key(&keys, &p, &klen);
        if (kp[i].rc != 0 || klen > rq->ctx->lim->max_key_size) {
            continue;
        }
        rpc_key(rq, p, klen, &key);
        if (store_get_stored(st, &key, &o) != 0) {
            continue;
        }
        if (x->dreads == NULL) {
            x->dreads = calloc(x->n, sizeof(*x->dreads));
            if (x->dreads == NULL) {
                store_obj_unref(st, o);
                return -ENOMEM;
            }
        }
        d = &x->dreads[i];
        if (!rpc_dread_fits(d, pc + kp[i].off, kp[i].np, store_obj_size(o))) {
            store_obj_unref(st, o);     /* through the arena, like any short or odd read */
            continue;
        }
        d->st = st;
        d->obj = o;
        d->res = &x->res[i];
        x->objs[i] = o;
        skip[i] = 1;
    }
    return 0;
}

int
rpc_batch_get_into(struct rpc_req *rq)
{
    struct mp_reader keys, iovs;
    struct rpc_piece *pc = NULL;
    struct rpc_key_pieces *kp = NULL;
    uint8_t *skip = NULL;
    struct rpc_xfer *x;
    struct rpc_opts opts;
    uint32_t nkeys, npieces, off = 0;
    int rc = rpc_xfer_params(rq, 3, &keys, &nkeys, &iovs, &npieces);

    if (rc == 0) {
        rc = rpc_opts_read(rq, 2, &opts);
    }
    if (rc != 0) {
        return rc;
    }
    x = rpc_xfer_new(rq, nkeys, npieces, false);
    pc = malloc((npieces ? npieces : 1) * sizeof(*pc));
    kp = malloc((nkeys ? nkeys : 1) * sizeof(*kp));
    skip = calloc(nkeys ? nkeys : 1, 1);
    if (x == NULL || pc == NULL || kp == NULL || skip == NULL) {
        rc = -ENOMEM;
        goto out;
    }
    mp_read_array(&iovs, &nkeys);
    for (uint32_t i = 0; i < nkeys; i++) {
        kp[i].off = off;
        kp[i].rc = rpc_pieces_read(rq, &iovs, x, pc + off, &kp[i].np, &kp[i].cap);
        x->kbufs[i] = x->nbufs;
        off += kp[i].np;
    }
    rc = store_has_tier(x->st) && x->kind == RPC_PIECES_SHM
         ? rpc_get_into_direct(rq, x, keys, kp, pc, skip) : 0;
    if (rc == 0) {
        /* The others: objects on the SSD only are loaded first (all at once); the message
         * comes back then. */
        rc = rpc_get_refs(rq, keys, nkeys, x->objs, skip);
    }
    if (rc == 0) {
        /* In a pool the local misses are asked of their owners, as batch_get's are; a fetched
         * copy is kept in DRAM and written into the pieces like a local one. */
        rc = rpc_remote_fill(rq, keys, nkeys, x->objs);
    }
    for (uint32_t i = 0; rc == 0 && i < nkeys; i++) {
        uint64_t n;

        if (kp[i].rc != 0 || x->objs[i] == NULL) {
            x->res[i] = kp[i].rc != 0 ? -(int64_t)kp[i].rc : -(int64_t)KV_NOT_FOUND;
            store_obj_unref(x->st, x->objs[i]);
            x->objs[i] = NULL;
            continue;
        }
        if (skip[i]) {
            ctr_add(&rq->ctx->ctr->hits_ssd, 1);    /* found on the SSD only: read from there */
            rc = rpc_xfer_run(x, rpc_dread_run, &x->dreads[i], x->dreads[i].guard);
            continue;
        }
        n = store_obj_size(x->objs[i]);
        if (n > kp[i].cap && opts.whole) {
            x->res[i] = -(int64_t)KV_TOO_LARGE;     /* it does not fit: nothing written */
            store_obj_unref(x->st, x->objs[i]);
            x->objs[i] = NULL;
            continue;
        }
        if (n > kp[i].cap) {
            n = kp[i].cap;          /* a short read: legal, the caller sees the count */
        }
        rc = rpc_xfer_map(x, i, x->objs[i], pc + kp[i].off, kp[i].np, n, false);
        x->res[i] = (int64_t)n;
    }
out:
    free(pc);
    free(kp);
    free(skip);
    if (rc != 0) {
        if (x != NULL) {
            rpc_xfer_free(x);
        }
        return rc;
    }
    return rpc_xfer_start(rq->ctx, x, rpc_rdma_qp(rq->ctx), rq->out);
}
