/*
 * rpc_peer: the peer methods (rpc_peer.h). Values a peer sends are buffered
 * in the connection (never spilled: the scanner offers only put and
 * batch_put values for that) and copied into the store once their CRC-32C
 * matches; values served go out by reference from the arena, as get's do,
 * with the CRC-32C of the bytes being sent.
 */
#include "rpc_peer.h"

#include <errno.h>
#include <msgpack.h>
#include <stdlib.h>
#include <sys/uio.h>

#include "crc32c.h"
#include "kverr.h"
#include "mp.h"
#include "outq.h"
#include "rpc_req.h"
#include "rpc_spill.h"
#include "store.h"

#define RPC_PEER_STACK 64

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

int
rpc_peer_get(struct rpc_req *rq)
{
    struct store_obj *stack[RPC_PEER_STACK];
    struct store_obj **objs = stack;
    uint32_t n, saved;
    int rc = rpc_peer_begin(rq, 2, 2, &saved);

    if (rc != 0) {
        return rc;
    }
    rc = rpc_keys_check(rq, &n);
    if (rc == 0 && n > RPC_PEER_STACK) {
        objs = malloc(n * sizeof(*objs));
        rc = objs == NULL ? -ENOMEM : 0;
    }
    if (rc == 0) {
        rc = rpc_get_refs(rq, rq->rd, n, objs, NULL);
    }
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
        if (mp_read_array(&rq->rd, &nc) != 0 || nc != n) {
            rc = rpc_invalid(rq, "crcs must be an array as long as keys");
        }
        for (uint32_t i = 0; rc == 0 && i < nc; i++) {
            uint64_t c;
            if (mp_read_uint(&rq->rd, &c) != 0 || c > UINT32_MAX) {
                rc = rpc_invalid(rq, "crcs must be uint32");
            }
        }
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
