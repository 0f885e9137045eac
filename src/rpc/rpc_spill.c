/*
 * rpc_spill: where a put's value goes while it is still arriving. Parses the
 * message prefix once per message (is it a put or batch_put, where are its
 * keys), then walks the keys only as far as the value being received; a
 * value it takes is reserved in the store under its key before the message
 * is complete. Declines everything else, except bytes too long to be a key,
 * which it discards so memory stays flat.
 */
#include "rpc_spill.h"

#include <errno.h>
#include <stdbool.h>
#include <string.h>

#include "kverr.h"
#include "mp.h"
#include "rpc_req.h"
#include "store.h"

void
rpc_spill_reset(struct rpc_spill_cursor *cur)
{
    memset(cur, 0, sizeof(*cur));
}

/* Parse the message prefix once: is it a put or batch_put, where are its keys? */
static void
rpc_spill_parse(struct rpc_spill_cursor *cur, const uint8_t *msg, size_t len, bool ctx_may_peer)
{
    struct mp_reader rd;
    uint32_t n, mlen, np;
    uint64_t type, msgid;
    const char *mname;

    cur->state = -1;
    mp_reader_init(&rd, msg, len);
    if (mp_read_array(&rd, &n) != 0 || n != 4 || mp_read_uint(&rd, &type) != 0 || type != 0 ||
        mp_read_uint(&rd, &msgid) != 0 || mp_read_str(&rd, &mname, &mlen) != 0 ||
        mp_read_array(&rd, &np) != 0 || np < 2) {
        return;
    }
    if (mp_str_eq(mname, mlen, "put")) {
        cur->state = 1;
        cur->key_off = (size_t)(rd.p - rd.base);
    } else if (mp_str_eq(mname, mlen, "batch_put")) {
        if (mp_read_array(&rd, &cur->nkeys) != 0) {
            return;
        }
        cur->state = 2;
        cur->key_idx = 0;
        cur->key_off = (size_t)(rd.p - rd.base);
    } else if (mp_str_eq(mname, mlen, "peer_put")) {
        uint64_t tenant;
        /* [tenant, keys, values, crcs], from a cluster node only (rpc_peer.h) */
        if (np != 4 || mp_read_uint(&rd, &tenant) != 0 || tenant > UINT32_MAX
            || mp_read_array(&rd, &cur->nkeys) != 0) {
            return;
        }
        if (ctx_may_peer == false) {
            return;
        }
        cur->state = 3;
        cur->tenant = (uint32_t)tenant;
        cur->key_idx = 0;
        cur->key_off = (size_t)(rd.p - rd.base);
    }
}

int
rpc_spill_take(struct rpc_ctx *ctx, struct rpc_spill_cursor *cur, const uint8_t *msg, size_t len,
               const struct mp_hole *holes, size_t nholes, const uint32_t *path, int depth,
               uint64_t vlen, int is_bin, struct rpc_spill *sp)
{
    struct mp_reader rd;
    const uint8_t *kp;
    uint32_t klen;
    struct kv_key key;
    bool value;

    if (cur->state == 0) {
        rpc_spill_parse(cur, msg, len, !ctx->lim->require_auth || ctx->admin);
    }
    if (cur->state == 1) {
        value = depth == 2 && path[0] == 3 && path[1] == 1;
    } else if (cur->state == 2) {
        value = depth == 3 && path[0] == 3 && path[1] == 1;
    } else if (cur->state == 3) {
        value = depth == 3 && path[0] == 3 && path[1] == 2;
    } else {
        value = false;
    }
    sp->obj = NULL;
    sp->sum = false;
    sp->crc = 0;
    if (!value || !is_bin) {
        if (vlen <= ctx->lim->max_key_size) {
            return 0;
        }
        sp->code = KV_TOO_LARGE; /* discarded: readers see a hole (see rpc_read_key) */
        return 1;
    }

    sp->code = KV_INVALID_ARGUMENT;
    mp_reader_init(&rd, msg, len);
    mp_reader_holes(&rd, holes, nholes);
    rd.p = msg + cur->key_off;
    if (cur->state == 2 || cur->state == 3) {
        uint32_t want = path[2];
        if (want >= cur->nkeys || want < cur->key_idx) {
            return 1; /* dispatch will answer the arity error */
        }
        while (cur->key_idx < want) {
            if (rpc_read_key(&rd, &kp, &klen) != 0) {
                return 1;
            }
            cur->key_idx++;
            cur->key_off = (size_t)(rd.p - rd.base);
        }
    }
    if (rpc_read_key(&rd, &kp, &klen) != 0) {
        return 1;
    }
    if (klen > ctx->lim->max_key_size || vlen > ctx->lim->max_value_size) {
        sp->code = KV_TOO_LARGE;
        return 1;
    }
    key.tenant = cur->state == 3 ? cur->tenant : ctx->tenant;
    key.ptr = kp;
    key.len = klen;
    int rc = store_reserve(ctx->srv->store, &key, vlen, &sp->obj);
    if (rc == -EAGAIN && !ctx->final_try) {
        sp->obj = NULL;
        sp->code = -EAGAIN;         /* the caller waits and asks again */
        return 1;
    }
    if (rc != 0) {
        sp->obj = NULL;
        sp->code = rc == -EAGAIN ? KV_NO_SPACE : rc < 0 ? KV_INTERNAL : rc;
    }
    sp->sum = sp->obj != NULL && ctx->srv->remote != NULL;
    return 1;
}
