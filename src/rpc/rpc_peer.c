/*
 * rpc_peer: the peer methods (rpc_peer.h). Values a peer sends are buffered
 * in the connection (never spilled: the scanner offers only put and
 * batch_put values for that) and copied into the store once their CRC-32C
 * matches; values served go out by reference from the arena, as get's do,
 * with the CRC-32C of the bytes being sent. Over RDMA (peer_sizes, then
 * peer_get_into) values are RDMA-WRITten into the asking node's registered
 * arena by the transfer machinery of rpc_defer.c, as batch_get_into's are;
 * peer_put_from's are RDMA-READ from the sending node's arena into
 * reservations by the same machinery, as batch_put_from's are, and checked
 * against their CRC-32C before they are published (rpc_peer_from_settle).
 */
#include "rpc_peer.h"

#include <errno.h>
#include <msgpack.h>
#include <stdlib.h>
#include <string.h>
#include <sys/uio.h>

#include "crc32c.h"
#include "kverr.h"
#include "mp.h"
#include "outq.h"
#include "rpc_defer.h"
#include "rpc_rdma.h"
#include "rpc_req.h"
#include "rpc_spill.h"
#include "store.h"

#define RPC_PEER_STACK 64
#define RPC_PEER_SEGS_MAX 1024     /* segments of one key in peer_get_into */

/*
 * rpc_peer_begin: check the caller may act for other nodes, read the tenant
 * param and switch the connection's namespace to it for this request
 * (*saved is what to restore).
 */
static int
rpc_peer_begin(struct rpc_req *rq, uint32_t min, uint32_t max, uint32_t *saved)
{
    uint64_t tenant;
    int rc;

    if (rq->ctx->lim->require_auth && !rq->ctx->admin) {
        rq->errmsg = "peer methods are for cluster nodes (the admin tenant)";
        return KV_FORBIDDEN;
    }
    rc = rpc_arity(rq, min, max);
    if (rc != 0) {
        return rc;
    }
    if (mp_read_uint(&rq->rd, &tenant) != 0 || tenant > UINT32_MAX) {
        return rpc_invalid(rq, "tenant must be a uint32");
    }
    *saved = rq->ctx->tenant;
    rq->ctx->tenant = (uint32_t)tenant;
    return 0;
}

/*
 * rpc_peer_refs: rpc_peer_begin (*saved: the tenant to restore, whatever the outcome), then
 * the keys param and a reference on each key's object (NULL: absent; SSD-only objects loaded
 * first) in *objsp: stack when n fits RPC_PEER_STACK, else malloc'd (the caller frees it
 * when it is not stack).
 */
static int
rpc_peer_refs(struct rpc_req *rq, struct store_obj **stack, struct store_obj ***objsp,
              uint32_t *n, uint32_t *saved)
{
    int rc;

    *saved = rq->ctx->tenant;
    *objsp = stack;
    rc = rpc_peer_begin(rq, 2, 2, saved);
    if (rc == 0) {
        rc = rpc_keys_check(rq, n);
    }
    if (rc == 0 && *n > RPC_PEER_STACK) {
        *objsp = malloc(*n * sizeof(**objsp));
        rc = *objsp == NULL ? -ENOMEM : 0;
        if (rc != 0) {
            *objsp = stack;
        }
    }
    if (rc == 0) {
        rc = rpc_get_refs(rq, rq->rd, *n, *objsp, NULL);
    }
    return rc;
}

int
rpc_peer_get(struct rpc_req *rq)
{
    struct store_obj *stack[RPC_PEER_STACK];
    struct store_obj **objs;
    uint32_t n, saved;
    int rc = rpc_peer_refs(rq, stack, &objs, &n, &saved);

    if (rc == 0) {
        uint64_t bytes = 0;

        rpc_reply_head(rq);
        msgpack_pack_array(&rq->pk, n);
        for (uint32_t i = 0; i < n; i++) {
            if (objs[i] == NULL) {
                msgpack_pack_nil(&rq->pk);
                continue;
            }
            msgpack_pack_array(&rq->pk, 2);
            msgpack_pack_uint32(&rq->pk, store_obj_crc(objs[i]));
            msgpack_pack_bin(&rq->pk, (size_t)store_obj_size(objs[i]));
            bytes += store_obj_size(objs[i]);
            outq_obj(rq->out, objs[i]);     /* the reference goes with the value */
        }
        ctr_add(&rq->ctx->ctr->peer_bytes_out, bytes);
    }
    if (objs != stack) {
        free(objs);
    }
    rq->ctx->tenant = saved;
    return rc;
}

int
rpc_peer_sizes(struct rpc_req *rq)
{
    struct store_obj *stack[RPC_PEER_STACK];
    struct store_obj **objs;
    uint32_t n, saved;
    int rc = rpc_peer_refs(rq, stack, &objs, &n, &saved);

    if (rc == 0) {
        rpc_reply_head(rq);
        msgpack_pack_array(&rq->pk, n);
        for (uint32_t i = 0; i < n; i++) {
            if (objs[i] == NULL) {
                msgpack_pack_nil(&rq->pk);
                continue;
            }
            msgpack_pack_uint64(&rq->pk, store_obj_size(objs[i]));
            store_obj_unref(rq->ctx->srv->store, objs[i]);
        }
    }
    if (objs != stack) {
        free(objs);
    }
    rq->ctx->tenant = saved;
    return rc;
}

/*
 * rpc_peer_segs_check: the segments param of peer_get_into, [[[addr, length, rkey], ...],
 * ...], one list per key: shape only. *maxp: the most segments of one key.
 */
static int
rpc_peer_segs_check(struct rpc_req *rq, uint32_t n, uint32_t *maxp)
{
    struct mp_reader rd = rq->rd;
    uint32_t nk, np, three;
    uint64_t v;

    *maxp = 1;
    if (mp_read_array(&rd, &nk) != 0 || nk != n) {
        return rpc_invalid(rq, "segments must be an array as long as keys");
    }
    for (uint32_t i = 0; i < nk; i++) {
        if (mp_read_array(&rd, &np) != 0 || np > RPC_PEER_SEGS_MAX) {
            return rpc_invalid(rq, "each key's segments: an array of [addr, length, rkey]");
        }
        *maxp = np > *maxp ? np : *maxp;
        for (uint32_t k = 0; k < np; k++) {
            if (mp_read_array(&rd, &three) != 0 || three != 3) {
                return rpc_invalid(rq, "a segment is [addr, length, rkey]");
            }
            for (int f = 0; f < 3; f++) {
                if (mp_read_uint(&rd, &v) != 0 || (f == 2 && v > UINT32_MAX)) {
                    return rpc_invalid(rq, "a segment is [addr, length, rkey] (uint, uint, "
                                           "uint32)");
                }
            }
        }
    }
    return 0;
}

/* rpc_peer_segs_read: one key's segments into pc[0..*np) and their total length. */
static void
rpc_peer_segs_read(struct mp_reader *rd, struct rpc_piece *pc, uint32_t *np, uint64_t *total)
{
    uint32_t three;
    uint64_t addr, len, rkey;

    mp_read_array(rd, np);
    *total = 0;
    for (uint32_t k = 0; k < *np; k++) {
        mp_read_array(rd, &three);
        mp_read_uint(rd, &addr);
        mp_read_uint(rd, &len);
        mp_read_uint(rd, &rkey);
        memset(&pc[k], 0, sizeof(pc[k]));
        pc[k].len = len;
        pc[k].raddr = addr;
        pc[k].rkey = (uint32_t)rkey;
        *total = len > UINT64_MAX - *total ? UINT64_MAX : *total + len;
    }
}

/*
 * rpc_peer_rdma_keys: the keys param of an RDMA peer method (skipped, *keys where they are)
 * and the connection's queue pair, which it needs: else UNSUPPORTED.
 */
static int
rpc_peer_rdma_keys(struct rpc_req *rq, uint32_t *n, struct mp_reader *keys)
{
    int rc = rpc_keys_skip(rq, n, keys);

    if (rc == 0 && rpc_rdma_qp(rq->ctx) == NULL) {
        rq->errmsg = "this peer method needs the connection's queue pair (rdma_connect first)";
        rc = KV_UNSUPPORTED;
    }
    return rc;
}

/* rpc_peer_crcs_check: the crcs param: an array of n uint32 (read past). */
static int
rpc_peer_crcs_check(struct rpc_req *rq, uint32_t n)
{
    uint32_t nc;
    uint64_t c;

    if (mp_read_array(&rq->rd, &nc) != 0 || nc != n) {
        return rpc_invalid(rq, "crcs must be an array as long as keys");
    }
    for (uint32_t i = 0; i < nc; i++) {
        if (mp_read_uint(&rq->rd, &c) != 0 || c > UINT32_MAX) {
            return rpc_invalid(rq, "crcs must be uint32");
        }
    }
    return 0;
}

int
rpc_peer_get_into(struct rpc_req *rq)
{
    struct mp_reader keys, segs;
    struct rpc_piece *pc = NULL;
    struct rpc_xfer *x = NULL;
    uint32_t n, maxp = 1, saved;
    int rc = rpc_peer_begin(rq, 3, 3, &saved);

    if (rc != 0) {
        return rc;
    }
    rc = rpc_peer_rdma_keys(rq, &n, &keys);
    if (rc == 0) {
        segs = rq->rd;
        rc = rpc_peer_segs_check(rq, n, &maxp);
    }
    if (rc == 0) {
        x = rpc_xfer_new(rq, n, 0, false);
        pc = malloc(maxp * sizeof(*pc));
        rc = x == NULL || pc == NULL ? -ENOMEM : 0;
    }
    if (rc == 0) {
        rc = rpc_get_refs(rq, keys, n, x->objs, NULL);  /* SSD-only objects: loaded first */
    }
    if (rc == 0) {
        x->peer = true;
        mp_read_array(&segs, &n);
    }
    for (uint32_t i = 0; rc == 0 && i < n; i++) {
        uint32_t np;
        uint64_t total, size;

        rpc_peer_segs_read(&segs, pc, &np, &total);
        if (x->objs[i] == NULL || np == 0) {
            x->res[i] = -(int64_t)KV_NOT_FOUND;         /* not here (or not asked for) */
        } else if (total != (size = store_obj_size(x->objs[i]))) {
            x->res[i] = -(int64_t)KV_INVALID_ARGUMENT;  /* the reservation is not its size */
        } else {
            rc = rpc_xfer_map(x, i, x->objs[i], pc, np, size, false);
            x->res[i] = (int64_t)size;
            continue;
        }
        store_obj_unref(x->st, x->objs[i]);
        x->objs[i] = NULL;
    }
    free(pc);
    rq->ctx->tenant = saved;
    if (rc != 0) {
        if (x != NULL) {
            rpc_xfer_free(x);
        }
        return rc;
    }
    return rpc_xfer_start(rq->ctx, x, rpc_rdma_qp(rq->ctx), rq->out);
}

int
rpc_peer_exists(struct rpc_req *rq)
{
    const uint8_t *kp;
    uint32_t n, klen, saved;
    struct kv_key key;
    int rc = rpc_peer_begin(rq, 2, 2, &saved);

    if (rc != 0) {
        return rc;
    }
    rc = rpc_keys_check(rq, &n);
    if (rc == 0) {
        rpc_reply_head(rq);
        msgpack_pack_array(&rq->pk, n);
        for (uint32_t i = 0; i < n; i++) {
            rpc_read_key(&rq->rd, &kp, &klen);
            rpc_key(rq, kp, klen, &key);
            if (klen <= rq->ctx->lim->max_key_size
                && store_exists(rq->ctx->srv->store, &key) == 1) {
                msgpack_pack_true(&rq->pk);
            } else {
                msgpack_pack_false(&rq->pk);
            }
        }
    }
    rq->ctx->tenant = saved;
    return rc;
}

/* rpc_peer_obj_crc: the checksum of what key holds now, or 0 when nothing is readable. */
static uint32_t
rpc_peer_stored_crc(struct store *st, const struct kv_key *key)
{
    struct store_obj *o;
    uint32_t crc = 0;

    if (store_get(st, key, &o) == 0) {
        crc = store_obj_crc(o);
        store_obj_unref(st, o);
    }
    return crc;
}

/*
 * rpc_peer_put_one: store one value sent with its checksum: inline bytes (vp), or a value
 * received straight into a reservation (hole). Returns the key's code and sets *crc to the
 * checksum of what the store now holds under the key (the sender's, or the stored one's for
 * EXISTS).
 */
static int
rpc_peer_put_one(struct rpc_req *rq, const uint8_t *kp, uint32_t klen, const uint8_t *vp,
                 uint64_t vlen, const struct mp_hole *hole, uint32_t sent, uint32_t *crc)
{
    struct store *st = rq->ctx->srv->store;
    struct kv_key key;
    int rc;

    *crc = 0;
    rpc_key(rq, kp, klen, &key);
    if (hole != NULL) {
        struct rpc_spill *sp = hole->tag;
        struct store_obj *o = sp->obj;

        if (o == NULL) {
            rc = sp->code;
        } else {
            sp->obj = NULL;
            if (store_obj_crc(o) != sent) {
                store_abort(st, o);
                ctr_add(&rq->ctx->ctr->peer_checksum_mismatches, 1);
                return KV_CHECKSUM_MISMATCH;    /* damaged on the way: nothing stored */
            }
            rc = store_commit(st, o);
        }
    } else if (klen > rq->ctx->lim->max_key_size || vlen > rq->ctx->lim->max_value_size) {
        return KV_TOO_LARGE;
    } else {
        /* checked as it is copied, and the checksum kept for later peer_gets */
        rc = store_put_crc(st, &key, vp, vlen, sent, false);
        if (rc == KV_EXISTS && rpc_peer_stored_crc(st, &key) != sent
            && crc32c_extend(0, vp, (size_t)vlen) != sent) {
            rc = KV_CHECKSUM_MISMATCH;  /* damaged on the way, not another writer's bytes */
        }
        if (rc == KV_CHECKSUM_MISMATCH) {
            ctr_add(&rq->ctx->ctr->peer_checksum_mismatches, 1);
            return rc;
        }
    }
    if (rc == 0) {
        *crc = sent;
        ctr_add(&rq->ctx->ctr->peer_bytes_in, vlen);
        return 0;
    }
    if (rc == KV_EXISTS) {
        *crc = rpc_peer_stored_crc(st, &key);
        if (*crc != sent) {
            /* Two writers stored different bytes under one key: the first stays. */
            ctr_add(&rq->ctx->ctr->peer_checksum_conflicts, 1);
        }
    }
    /* -EAGAIN (room being freed by SSD writes) is not waited for: the sender's copy stays. */
    return rc == -EAGAIN ? KV_NO_SPACE : rc < 0 ? KV_INTERNAL : rc;
}

int
rpc_peer_put(struct rpc_req *rq)
{
    struct mp_reader keys, vals, crcs;
    uint32_t n, nv, nc, saved;
    int rc = rpc_peer_begin(rq, 4, 4, &saved);

    if (rc != 0) {
        return rc;
    }
    rc = rpc_keys_skip(rq, &n, &keys);
    if (rc == 0) {
        vals = rq->rd;
        if (mp_read_array(&rq->rd, &nv) != 0 || nv != n) {
            rc = rpc_invalid(rq, "values must be an array as long as keys");
        }
        for (uint32_t i = 0; rc == 0 && i < nv; i++) {
            const uint8_t *vp;
            uint64_t vlen;
            const struct mp_hole *hole;
            if (mp_read_bin_ref(&rq->rd, &vp, &vlen, &hole) != 0) {
                rc = rpc_invalid(rq, "values must be bin");
            }
        }
    }
    if (rc == 0) {
        crcs = rq->rd;
        rc = rpc_peer_crcs_check(rq, n);
    }
    if (rc == 0) {
        mp_read_array(&vals, &nv);
        mp_read_array(&crcs, &nc);
        rpc_reply_head(rq);
        msgpack_pack_array(&rq->pk, n);
        for (uint32_t i = 0; i < n; i++) {
            const uint8_t *kp, *vp;
            const struct mp_hole *hole;
            uint32_t klen, crc;
            uint64_t sent, vlen;
            int code;

            rpc_read_key(&keys, &kp, &klen);
            mp_read_bin_ref(&vals, &vp, &vlen, &hole);
            mp_read_uint(&crcs, &sent);
            code = rpc_peer_put_one(rq, kp, klen, vp, vlen, hole, (uint32_t)sent, &crc);
            msgpack_pack_array(&rq->pk, 2);
            msgpack_pack_int(&rq->pk, code < 0 ? KV_INTERNAL : code);
            msgpack_pack_uint32(&rq->pk, crc);
        }
    }
    rq->ctx->tenant = saved;
    return rc;
}

/* What peer_put_from's settle needs of one key (the transfer's settle_arg, one per key). */
struct rpc_peer_from {
    uint32_t sent;                  /* the sender's CRC-32C of the value */
    uint32_t crc;                   /* the answer's: the checksum of what the key holds now */
    bool reserved;                  /* a reservation was made: no object left means its READs
                                       failed */
};

/*
 * rpc_peer_from_settle: peer_put_from's transfer, its READs done: each value read whole is
 * checked against the sender's CRC-32C over the reservation and published (a mismatch is
 * aborted and counted, as peer_put does); per key [code, crc], or a bare code for a key
 * whose READs failed (the queue pair's error: the sender sends it again over TCP).
 */
static void
rpc_peer_from_settle(struct rpc_ctx *ctx, struct rpc_xfer *x, msgpack_packer *pk)
{
    struct rpc_peer_from *f = x->settle_arg;

    msgpack_pack_array(pk, x->n);
    for (uint32_t i = 0; i < x->n; i++) {
        struct store_obj *o = x->objs[i];
        int code = (int)x->res[i];

        x->objs[i] = NULL;
        if (f[i].reserved && o == NULL) {
            msgpack_pack_int(pk, code != 0 ? code : KV_INTERNAL);
            continue;
        }
        if (o != NULL) {
            if (store_obj_crc(o) != f[i].sent) {
                store_abort(x->st, o);      /* not the bytes the sender summed: nothing kept */
                ctr_add(&ctx->ctr->peer_checksum_mismatches, 1);
                code = KV_CHECKSUM_MISMATCH;
            } else {
                code = store_commit(x->st, o);
                f[i].crc = code == 0 ? f[i].sent : 0;
            }
        }
        msgpack_pack_array(pk, 2);
        msgpack_pack_int(pk, code < 0 ? KV_INTERNAL : code);
        msgpack_pack_uint32(pk, f[i].crc);
    }
}

/*
 * rpc_peer_from_check: the params of peer_put_from after keys, shape only: extents (one list
 * of [addr, length, rkey] per key) and crcs. *maxp: the most extents of one key.
 */
static int
rpc_peer_from_check(struct rpc_req *rq, uint32_t n, uint32_t *maxp)
{
    int rc = rpc_peer_segs_check(rq, n, maxp);

    if (rc != 0) {
        return rc;
    }
    (void)mp_skip(&rq->rd);                     /* the extents, checked */
    return rpc_peer_crcs_check(rq, n);
}

/*
 * rpc_peer_from_reserve: key i of peer_put_from: a reservation of its value's length and the
 * READs of extents pc[0..np) (total bytes) into it, or the key's code in x->res[i] (EXISTS
 * with the stored checksum in f->crc, counted when it differs, as peer_put does). 0 or
 * -ENOMEM.
 */
static int
rpc_peer_from_reserve(struct rpc_req *rq, struct rpc_xfer *x, uint32_t i, const uint8_t *kp,
                      uint32_t klen, const struct rpc_piece *pc, uint32_t np, uint64_t total,
                      struct rpc_peer_from *f)
{
    struct kv_key key;
    int rc;

    if (klen > rq->ctx->lim->max_key_size || total > rq->ctx->lim->max_value_size) {
        x->res[i] = KV_TOO_LARGE;
        return 0;
    }
    if (np == 0 || total == 0) {
        x->res[i] = KV_INVALID_ARGUMENT;        /* a value is sent as its extents */
        return 0;
    }
    rpc_key(rq, kp, klen, &key);
    rc = store_reserve(x->st, &key, total, &x->objs[i]);
    if (rc == 0) {
        f->reserved = true;
        return rpc_xfer_map(x, i, x->objs[i], pc, np, total, true);
    }
    x->objs[i] = NULL;
    if (rc == KV_EXISTS) {
        f->crc = rpc_peer_stored_crc(x->st, &key);
        if (f->crc != f->sent) {
            /* Two writers stored different bytes under one key: the first stays. */
            ctr_add(&rq->ctx->ctr->peer_checksum_conflicts, 1);
        }
    }
    /* -EAGAIN (room being freed by SSD writes) is not waited for: the sender's copy stays. */
    x->res[i] = rc == -EAGAIN ? KV_NO_SPACE : rc < 0 ? KV_INTERNAL : rc;
    return 0;
}

int
rpc_peer_put_from(struct rpc_req *rq)
{
    struct mp_reader keys, segs, crcs;
    struct rpc_piece *pc = NULL;
    struct rpc_xfer *x = NULL;
    struct rpc_peer_from *f = NULL;
    uint32_t n, maxp = 1, saved;
    int rc = rpc_peer_begin(rq, 4, 4, &saved);

    if (rc != 0) {
        return rc;
    }
    rc = rpc_peer_rdma_keys(rq, &n, &keys);
    if (rc == 0) {
        segs = rq->rd;
        rc = rpc_peer_from_check(rq, n, &maxp);
    }
    if (rc == 0) {
        x = rpc_xfer_new(rq, n, 0, true);
        pc = malloc(maxp * sizeof(*pc));
        f = calloc(n ? n : 1, sizeof(*f));
        rc = x == NULL || pc == NULL || f == NULL ? -ENOMEM : 0;
    }
    if (rc == 0) {
        x->peer = true;
        x->settle = rpc_peer_from_settle;
        x->settle_arg = f;
        f = NULL;
        mp_read_array(&segs, &n);
        crcs = segs;
        for (uint32_t i = 0; i < n; i++) {
            (void)mp_skip(&crcs);
        }
        mp_read_array(&crcs, &n);
    }
    for (uint32_t i = 0; rc == 0 && i < n; i++) {
        struct rpc_peer_from *fi = (struct rpc_peer_from *)x->settle_arg + i;
        const uint8_t *kp;
        uint32_t klen, np;
        uint64_t total, sent;

        rpc_read_key(&keys, &kp, &klen);
        rpc_peer_segs_read(&segs, pc, &np, &total);
        mp_read_uint(&crcs, &sent);
        fi->sent = (uint32_t)sent;
        rc = rpc_peer_from_reserve(rq, x, i, kp, klen, pc, np, total, fi);
    }
    free(pc);
    free(f);
    rq->ctx->tenant = saved;
    if (rc != 0) {
        if (x != NULL) {
            rpc_xfer_free(x);       /* its reservations are aborted */
        }
        return rc;
    }
    return rpc_xfer_start(rq->ctx, x, rpc_rdma_qp(rq->ctx), rq->out);
}
