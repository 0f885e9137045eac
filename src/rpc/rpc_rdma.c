/*
 * rpc_rdma: a connection's RDMA side (protocol/SPEC.md, "RDMA"): the
 * rdma_connect method, which sets up its reliable-connected queue pair by
 * exchanging queue-pair info over the msgpack connection; the client
 * buffers it registers for RDMA (register_buffer with transport "rdma":
 * address, rkey and size of a region the client registered with its own
 * device); the pieces that name them; and the (addr, length, rkey)
 * descriptors of arena memory handed out for client-driven one-sided
 * access. The transfers themselves are rpc_defer.c's, which posts RDMA
 * READs and WRITEs on the queue pair instead of copying. A shared piece:
 * it calls no handler file.
 */
#include "rpc_rdma.h"

#include <errno.h>
#include <msgpack.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <sys/uio.h>

#include "kverr.h"
#include "mp.h"
#include "rdma_port.h"
#include "rpc_req.h"
#include "store.h"

#define RPC_RDMA_MAX_BUFS 1024      /* RDMA buffers one connection may register */

struct rpc_rdma_buf {
    uint64_t id;                    /* 0 = free slot */
    uint64_t addr;
    uint64_t size;
    uint32_t rkey;
};

struct rpc_rdma {
    struct rdma_qp *qp;
    struct rdma_qp_info local;      /* what the client connects its side to */
    bool connected;
    struct rpc_rdma_buf *bufs;
    uint32_t nbufs;                 /* slots in use or free, in bufs[] */
    uint32_t cap;
    uint64_t next_id;
};

struct rdma_qp *
rpc_rdma_qp(const struct rpc_ctx *ctx)
{
    return ctx->rdma != NULL && ctx->rdma->connected ? ctx->rdma->qp : NULL;
}

/* rpc_rdma_make_qp: the connection's queue pair, made (not connected) unless it exists. */
static int
rpc_rdma_make_qp(struct rpc_req *rq)
{
    struct rpc_ctx *ctx = rq->ctx;
    int rc;

    if (ctx->srv->rdma_arena == NULL || ctx->rdma_cq == NULL) {
        rq->errmsg = "RDMA is not enabled on this daemon (rdma off, or no usable device: "
                     "see its log)";
        return KV_UNSUPPORTED;
    }
    if (ctx->rdma == NULL) {
        ctx->rdma = calloc(1, sizeof(*ctx->rdma));
        if (ctx->rdma == NULL) {
            return -ENOMEM;
        }
        ctx->rdma->next_id = RPC_RDMA_ID_BASE;
    }
    if (ctx->rdma->qp != NULL) {
        return 0;
    }
    rc = rdma_qp_create(ctx->rdma_cq, RPC_RDMA_QP_WR, &ctx->rdma->qp, &ctx->rdma->local);
    if (rc != 0) {
        ctx->rdma->qp = NULL;
        rq->errmsg = rc == KV_NO_SPACE ? "too many RDMA connections on this event loop"
                                       : "the queue pair could not be made (see the log)";
        return rc == KV_NO_SPACE ? KV_BUSY : rc < 0 ? KV_INTERNAL : rc;
    }
    return 0;
}

/* rpc_rdma_connect_to: connect the made queue pair to the client's info p[0..len). */
static int
rpc_rdma_connect_to(struct rpc_req *rq, const uint8_t *p, size_t len)
{
    struct rdma_qp_info remote;
    int rc;

    if (rdma_qp_info_decode(p, len, &remote) != 0) {
        return rpc_invalid(rq, "bad queue-pair info (30 bytes: qpn, psn, lid, gid, mtu)");
    }
    if (rq->ctx->rdma->connected) {
        return rpc_invalid(rq, "this connection's queue pair is connected already");
    }
    rc = rdma_qp_connect(rq->ctx->rdma->qp, &remote);
    if (rc != 0) {
        rq->errmsg = "the queue pair could not be connected (see the log)";
        return rc < 0 ? KV_INTERNAL : rc;
    }
    rq->ctx->rdma->connected = true;
    return 0;
}

int
rpc_rdma_hello(struct rpc_req *rq)
{
    return rpc_rdma_make_qp(rq);
}

void
rpc_rdma_pack_info(struct rpc_req *rq)
{
    uint8_t enc[RDMA_QP_INFO_LEN];

    rdma_qp_info_encode(&rq->ctx->rdma->local, enc);
    msgpack_pack_bin(&rq->pk, sizeof(enc));
    msgpack_pack_bin_body(&rq->pk, enc, sizeof(enc));
}

int
rpc_rdma_connect(struct rpc_req *rq)
{
    const uint8_t *p;
    uint64_t len;
    const struct mp_hole *hole;
    int rc = rpc_arity(rq, 1, 1);

    if (rc != 0) {
        return rc;
    }
    if (mp_read_bin_ref(&rq->rd, &p, &len, &hole) != 0 || hole != NULL) {
        return rpc_invalid(rq, "params: [queue-pair info, 30 bytes of bin]");
    }
    rc = rpc_rdma_make_qp(rq);
    if (rc == 0) {
        rc = rpc_rdma_connect_to(rq, p, (size_t)len);
    }
    if (rc != 0) {
        return rc;
    }
    rpc_reply_head(rq);
    rpc_rdma_pack_info(rq);
    return 0;
}

int
rpc_rdma_register(struct rpc_req *rq, const struct rpc_opts *o)
{
    struct rpc_rdma *r = rq->ctx->rdma;
    struct rpc_rdma_buf *b = NULL;
    int rc;

    if (o->qp != NULL && rpc_rdma_qp(rq->ctx) == NULL) {
        /* The queue-pair info of the client, whose side knows ours from hello. */
        if (r == NULL || r->qp == NULL) {
            return rpc_invalid(rq, "opts.qp: ask hello {\"rdma\": true} for the daemon's "
                                   "queue pair first");
        }
        rc = rpc_rdma_connect_to(rq, o->qp, o->qp_len);
        if (rc != 0) {
            return rc;
        }
    }
    if (rpc_rdma_qp(rq->ctx) == NULL) {
        return rpc_invalid(rq, "an RDMA buffer needs the connection's queue pair: send "
                               "opts.qp (after hello {\"rdma\": true}) or rdma_connect first");
    }
    if (!o->has_addr || !o->has_rkey || !o->has_size || o->size == 0
        || o->addr > UINT64_MAX - o->size) {
        return rpc_invalid(rq, "an RDMA buffer needs opts.addr, opts.rkey and a non-zero "
                               "opts.size");
    }
    for (uint32_t i = 0; i < r->nbufs && b == NULL; i++) {
        if (r->bufs[i].id == 0) {
            b = &r->bufs[i];
        }
    }
    if (b == NULL) {
        if (r->nbufs == RPC_RDMA_MAX_BUFS) {
            rq->errmsg = "too many RDMA buffers on this connection";
            return KV_NO_SPACE;
        }
        if (r->nbufs == r->cap) {
            uint32_t cap = r->cap ? r->cap * 2 : 8;
            struct rpc_rdma_buf *nb = realloc(r->bufs, cap * sizeof(*nb));

            if (nb == NULL) {
                return -ENOMEM;
            }
            r->bufs = nb;
            r->cap = cap;
        }
        b = &r->bufs[r->nbufs++];
    }
    b->id = r->next_id++;
    b->addr = o->addr;
    b->size = o->size;
    b->rkey = o->rkey;
    rpc_reply_head(rq);
    msgpack_pack_uint64(&rq->pk, b->id);
    return 0;
}

static struct rpc_rdma_buf *
rpc_rdma_buf(const struct rpc_ctx *ctx, uint64_t id)
{
    struct rpc_rdma *r = ctx->rdma;

    for (uint32_t i = 0; r != NULL && i < r->nbufs; i++) {
        if (r->bufs[i].id == id) {
            return &r->bufs[i];
        }
    }
    return NULL;
}

int
rpc_rdma_unregister(struct rpc_ctx *ctx, uint64_t id)
{
    struct rpc_rdma_buf *b = rpc_rdma_buf(ctx, id);

    if (b == NULL) {
        return KV_NOT_FOUND;
    }
    b->id = 0;                      /* transfers posted already carry their own addr + rkey */
    return 0;
}

int
rpc_rdma_piece(const struct rpc_ctx *ctx, uint64_t id, uint64_t off, uint64_t len,
               uint64_t *raddr, uint32_t *rkey)
{
    const struct rpc_rdma_buf *b = rpc_rdma_buf(ctx, id);

    if (b == NULL || off > b->size || len > b->size - off) {
        return KV_INVALID_ARGUMENT;
    }
    *raddr = b->addr + off;
    *rkey = b->rkey;
    return 0;
}

void
rpc_rdma_release(struct rpc_ctx *ctx)
{
    if (ctx->rdma == NULL) {
        return;
    }
    if (ctx->rdma->qp != NULL) {
        rdma_qp_destroy(ctx->rdma->qp);     /* work still posted completes as flushed */
    }
    free(ctx->rdma->bufs);
    free(ctx->rdma);
    ctx->rdma = NULL;
}

int
rpc_rdma_pack_pieces(struct rpc_req *rq, const struct iovec *iov, int n)
{
    const struct rdma_region *arena = rq->ctx->srv->rdma_arena;
    struct rdma_seg stack[16];
    size_t total = 0;
    int k;

    /* First how many (an extent splits where the arena's memory regions meet). */
    for (int i = 0; i < n; i++) {
        int rc = rdma_region_segs(arena, iov[i].iov_base, iov[i].iov_len, NULL, 0, &k);

        if (rc != 0 && rc != KV_NO_SPACE) {
            return KV_INTERNAL;     /* outside the registered arena: not expected */
        }
        total += (size_t)k;
    }
    msgpack_pack_array(&rq->pk, total);
    for (int i = 0; i < n; i++) {
        struct rdma_seg *segs = stack;

        (void)rdma_region_segs(arena, iov[i].iov_base, iov[i].iov_len, NULL, 0, &k);
        if (k > (int)(sizeof(stack) / sizeof(stack[0]))) {
            segs = malloc((size_t)k * sizeof(*segs));
            if (segs == NULL) {
                return -ENOMEM;     /* the reply is half packed: the connection closes */
            }
        }
        (void)rdma_region_segs(arena, iov[i].iov_base, iov[i].iov_len, segs, k, &k);
        for (int j = 0; j < k; j++) {
            msgpack_pack_array(&rq->pk, 3);
            msgpack_pack_uint64(&rq->pk, segs[j].addr);
            msgpack_pack_uint64(&rq->pk, segs[j].len);
            msgpack_pack_uint32(&rq->pk, segs[j].rkey);
        }
        if (segs != stack) {
            free(segs);
        }
    }
    return 0;
}
