/*
 * rpc_req: the request at hand: the reply and param helpers every method
 * uses (reply heads and errors, keys, opts, arity) and the key lookups of
 * the methods that read objects (rpc_get_refs). It calls no other rpc
 * module, so any of them may call it; it never touches sockets or the event
 * loop, and reaches objects only through storage/store.h.
 */
#include "rpc_req.h"

#include <errno.h>
#include <msgpack.h>
#include <openssl/crypto.h>
#include <openssl/sha.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "config.h"
#include "kverr.h"
#include "mp.h"
#include "store.h"

/* ---- reply helpers ---- */

void
rpc_reply_head(struct rpc_req *rq)
{
    rq->replied = true;
    rpc_pack_head(&rq->pk, rq->msgid);
}

void
rpc_pack_head(msgpack_packer *pk, uint64_t msgid)
{
    msgpack_pack_array(pk, 4);
    msgpack_pack_uint8(pk, 1);
    msgpack_pack_uint64(pk, msgid);
    msgpack_pack_nil(pk);
}

void
rpc_reply_error(struct rpc_req *rq, int status, const char *msg)
{
    rq->replied = true;
    msgpack_pack_array(&rq->pk, 4);
    msgpack_pack_uint8(&rq->pk, 1);
    msgpack_pack_uint64(&rq->pk, rq->msgid);
    mp_pack_error(&rq->pk, status, msg);
    msgpack_pack_nil(&rq->pk);
}

int
rpc_invalid(struct rpc_req *rq, const char *why)
{
    rq->errmsg = why;
    return KV_INVALID_ARGUMENT;
}

/* ---- param helpers ---- */

/*
 * Read a key that may have been spilled: a key longer than any max_key_size is
 * received into a discarding hole, never into the buffer, and reads back here
 * with a length of UINT32_MAX, so every method answers it per key exactly as
 * it answers any other key over max_key_size.
 */
int
rpc_read_key(struct mp_reader *rd, const uint8_t **p, uint32_t *len)
{
    const struct mp_hole *hole;
    uint64_t n;

    *p = NULL;
    *len = 0;
    if (mp_read_key_ref(rd, p, &n, &hole) != 0) {
        return -1;
    }
    *len = (hole != NULL || n > UINT32_MAX) ? UINT32_MAX : (uint32_t)n;
    return 0;
}

void
rpc_key(struct rpc_req *rq, const uint8_t *p, uint32_t len, struct kv_key *k)
{
    k->tenant = rq->ctx->tenant;
    k->ptr = p;
    k->len = len;
}

/*
 * Check that the next param is an array of keys within max_batch; leave the
 * reader on the first key and return the count through *n. A key over
 * max_key_size is not an error here: each method answers it per key.
 */
int
rpc_keys_check(struct rpc_req *rq, uint32_t *n)
{
    struct mp_reader start;
    int rc = rpc_keys_skip(rq, n, &start);

    rq->rd = start;
    return rc;
}

int
rpc_keys_skip(struct rpc_req *rq, uint32_t *n, struct mp_reader *keys)
{
    const uint8_t *p;
    uint32_t len;

    *keys = rq->rd;
    if (mp_read_array(&rq->rd, n) != 0) {
        return rpc_invalid(rq, "keys must be an array of bin or str");
    }
    if (*n > rq->ctx->lim->max_batch) {
        rq->errmsg = "batch larger than max_batch";
        return KV_TOO_LARGE;
    }
    *keys = rq->rd;
    for (uint32_t i = 0; i < *n; i++) {
        if (rpc_read_key(&rq->rd, &p, &len) != 0) {
            return rpc_invalid(rq, "keys must be an array of bin or str");
        }
    }
    return 0;
}

int
rpc_opts_read(struct rpc_req *rq, uint32_t idx, struct rpc_opts *o)
{
    uint32_t n;

    memset(o, 0, sizeof(*o));
    if (rq->nparams <= idx) {
        return 0;
    }
    if (mp_peek(&rq->rd) == MP_NIL) {
        mp_read_nil(&rq->rd);
        return 0;
    }
    if (mp_read_map(&rq->rd, &n) != 0) {
        return rpc_invalid(rq, "opts must be a map");
    }
    for (uint32_t i = 0; i < n; i++) {
        const uint8_t *np;
        uint64_t nl;
        const struct mp_hole *nh;
        /* a name too long to buffer was dropped on arrival: an unknown option, as inline */
        if (mp_peek(&rq->rd) != MP_STR || mp_read_key_ref(&rq->rd, &np, &nl, &nh) != 0) {
            return rpc_invalid(rq, "opts keys must be strings");
        }
        const char *name = nh != NULL ? "" : (const char *)np;
        uint32_t nlen = nh != NULL ? 0 : (uint32_t)nl;
        if (mp_str_eq(name, nlen, "force")) {
            if (mp_read_bool(&rq->rd, &o->force) != 0) {
                return rpc_invalid(rq, "opts.force must be a bool");
            }
        } else if (mp_str_eq(name, nlen, "durable")) {
            if (mp_read_bool(&rq->rd, &o->durable) != 0) {
                return rpc_invalid(rq, "opts.durable must be a bool");
            }
        } else if (mp_str_eq(name, nlen, "whole")) {
            if (mp_read_bool(&rq->rd, &o->whole) != 0) {
                return rpc_invalid(rq, "opts.whole must be a bool");
            }
        } else if (mp_str_eq(name, nlen, "replicas")) {
            if (mp_read_bool(&rq->rd, &o->replicas) != 0) {
                return rpc_invalid(rq, "opts.replicas must be a bool");
            }
        } else if (mp_str_eq(name, nlen, "size")) {
            if (mp_read_uint(&rq->rd, &o->size) != 0) {
                return rpc_invalid(rq, "opts.size must be an unsigned integer");
            }
            o->has_size = true;
        } else if (mp_str_eq(name, nlen, "transport")) {
            const char *t;
            uint32_t tl;

            if (mp_read_str(&rq->rd, &t, &tl) != 0
                || (!mp_str_eq(t, tl, "rdma") && !mp_str_eq(t, tl, "shm"))) {
                return rpc_invalid(rq, "opts.transport must be \"shm\" or \"rdma\"");
            }
            o->rdma = mp_str_eq(t, tl, "rdma");
        } else if (mp_str_eq(name, nlen, "tenant") || mp_str_eq(name, nlen, "token")) {
            /* Longer than max_key_size: dropped on arrival if it was not buffered, so refused
             * either way (SPEC.md, section 7) */
            bool tenant = name[1] == 'e';
            const struct mp_hole *th;
            const uint8_t *tp;
            uint64_t tl;

            if ((tenant && mp_peek(&rq->rd) != MP_STR) ||
                mp_read_key_ref(&rq->rd, &tp, &tl, &th) != 0 || th != NULL ||
                tl > rq->ctx->lim->max_key_size) {
                return rpc_invalid(rq, tenant ? "opts.tenant must be a str of at most "
                                                "max_key_size bytes"
                                              : "opts.token must be a str or bin of at most "
                                                "max_key_size bytes");
            }
            if (tenant) {
                o->tenant = (const char *)tp;
                o->tenant_len = (uint32_t)tl;
            } else {
                o->token = tp;
                o->token_len = (uint32_t)tl;
            }
        } else if (mp_str_eq(name, nlen, "rdma")) {
            if (mp_read_bool(&rq->rd, &o->want_qp) != 0) {
                return rpc_invalid(rq, "opts.rdma must be a bool");
            }
        } else if (mp_str_eq(name, nlen, "qp")) {
            const struct mp_hole *qh;
            uint64_t ql;

            if (mp_read_bin_ref(&rq->rd, &o->qp, &ql, &qh) != 0 || qh != NULL || ql > 64) {
                return rpc_invalid(rq, "opts.qp must be the queue-pair info (bin)");
            }
            o->qp_len = (uint32_t)ql;
        } else if (mp_str_eq(name, nlen, "addr")) {
            if (mp_read_uint(&rq->rd, &o->addr) != 0) {
                return rpc_invalid(rq, "opts.addr must be an unsigned integer");
            }
            o->has_addr = true;
        } else if (mp_str_eq(name, nlen, "rkey")) {
            uint64_t v;

            if (mp_read_uint(&rq->rd, &v) != 0 || v > UINT32_MAX) {
                return rpc_invalid(rq, "opts.rkey must be a 32-bit unsigned integer");
            }
            o->rkey = (uint32_t)v;
            o->has_rkey = true;
        } else if (mp_str_eq(name, nlen, "group_size")) {
            if (mp_read_uint(&rq->rd, &o->group_size) != 0 || o->group_size == 0) {
                return rpc_invalid(rq, "opts.group_size must be a positive integer");
            }
        } else if (mp_skip(&rq->rd) != 0) {
            return rpc_invalid(rq, "malformed opts");
        }
    }
    return 0;
}

int
rpc_put_opts_read(struct rpc_req *rq, uint32_t idx, struct rpc_opts *o)
{
    int rc = rpc_opts_read(rq, idx, o);

    if (rc == 0 && o->durable && !store_has_tier(rq->ctx->srv->store)) {
        rq->errmsg = "durable puts need the SSD tier (ssd_dir)";
        return KV_UNSUPPORTED;
    }
    return rc;
}

int
rpc_arity(struct rpc_req *rq, uint32_t min, uint32_t max)
{
    if (rq->nparams < min || rq->nparams > max) {
        return rpc_invalid(rq, "wrong number of params");
    }
    return 0;
}



bool
rpc_shared_view(const struct rpc_ctx *ctx)
{
    return ctx->lim->tenants == NULL || ctx->lim->tenants->n == 0 || ctx->admin;
}

/* ---- lookups ---- */

void
rpc_tier_note(struct rpc_ctx *ctx, uint32_t nkeys, uint32_t i)
{
    if (i >= nkeys) {
        return;
    }
    if (ctx->tier_ssd != NULL && ctx->tier_nkeys != nkeys) {
        rpc_tier_forget(ctx);       /* not the read that noted them: cannot happen, be safe */
    }
    if (ctx->tier_ssd == NULL) {
        ctx->tier_ssd = calloc((nkeys + 7) / 8, 1);
        if (ctx->tier_ssd == NULL) {
            return;
        }
        ctx->tier_nkeys = nkeys;
    }
    ctx->tier_ssd[i / 8] |= (uint8_t)(1u << (i % 8));
}

void
rpc_tier_count(struct rpc_ctx *ctx, uint32_t i, const struct store_obj *o)
{
    if (o == NULL) {
        ctr_add(&ctx->ctr->misses, 1);
    } else if (ctx->tier_ssd != NULL && i < ctx->tier_nkeys
               && (ctx->tier_ssd[i / 8] & (1u << (i % 8))) != 0) {
        ctr_add(&ctx->ctr->hits_ssd, 1);
    } else {
        ctr_add(&ctx->ctr->hits_dram, 1);
    }
}

void
rpc_tier_forget(struct rpc_ctx *ctx)
{
    free(ctx->tier_ssd);
    ctx->tier_ssd = NULL;
    ctx->tier_nkeys = 0;
}

/*
 * Look up the n keys of a get or batch_get, a reference on each one found
 * in objs (NULL for a miss). Returns 0, or -EAGAIN when some are on the SSD
 * tier only: their loads have started (all of them at once), nothing is
 * held, and the connection retries the message once they are in.
 */
int
rpc_get_refs(struct rpc_req *rq, struct mp_reader keys, uint32_t n, struct store_obj **objs,
             const uint8_t *skip)
{
    struct store *st = rq->ctx->srv->store;
    struct mp_reader probe = keys;
    int rc = 0;

    /*
     * With an SSD tier, first start every load without touching anything: a key
     * found resident is not stamped (nor, for an unpromoted copy, used up) by a
     * try that waits. Without one nothing can wait, and one pass is enough.
     */
    for (uint32_t i = 0; i < n && !rq->ctx->final_try && store_has_tier(st); i++) {
        const uint8_t *kp;
        uint32_t klen;
        struct kv_key key;

        rpc_read_key(&probe, &kp, &klen);
        if (klen > rq->ctx->lim->max_key_size || (skip != NULL && skip[i])) {
            continue;
        }
        rpc_key(rq, kp, klen, &key);
        if (store_prefetch(st, &key)) {
            rpc_tier_note(rq->ctx, n, i);
            rc = -EAGAIN;
        }
    }
    if (rc != 0) {
        return rc;
    }
    for (uint32_t i = 0; i < n; i++) {
        const uint8_t *kp;
        uint32_t klen;
        struct kv_key key;
        int r;

        rpc_read_key(&keys, &kp, &klen);
        if (skip != NULL && skip[i]) {
            continue;
        }
        objs[i] = NULL;
        if (klen > rq->ctx->lim->max_key_size) {
            continue;
        }
        rpc_key(rq, kp, klen, &key);
        r = store_get(st, &key, &objs[i]);
        if (r == -EAGAIN && !rq->ctx->final_try) {
            rpc_tier_note(rq->ctx, n, i);   /* evicted since the first pass: loading again */
            rc = -EAGAIN;
        }
    }
    if (rc != 0) {
        for (uint32_t i = 0; i < n; i++) {
            if (skip == NULL || !skip[i]) {
                store_obj_unref(st, objs[i]);
                objs[i] = NULL;
            }
        }
        return rc;
    }
    for (uint32_t i = 0; i < n; i++) {
        if (skip == NULL || !skip[i]) {
            rpc_tier_count(rq->ctx, i, objs[i]);
        }
    }
    rpc_tier_forget(rq->ctx);
    return 0;
}

/* ---- the cluster (rpc_ctx.h, struct rpc_remote) ---- */

#define RPC_REMOTE_STACK 64

/*
 * rpc_remote_ask: want[i] on entry: key i of keys[0..n) missed here. Those that fit
 * max_key_size (no node holds a longer one) are asked of the cluster; on return want[i] is
 * set for them only and *asked counts them. Returns what remote->fetch returns (0, -EAGAIN),
 * 0 when nothing was asked, or -ENOMEM.
 */
static int
rpc_remote_ask(struct rpc_req *rq, struct mp_reader keys, uint32_t n, uint8_t *want,
               uint32_t *asked)
{
    const struct rpc_remote *rm = rq->ctx->srv->remote;
    struct kv_key stack[RPC_REMOTE_STACK];
    struct kv_key *ks = stack;
    struct mp_reader walk = keys;
    uint32_t m = 0;
    int rc;

    for (uint32_t i = 0; i < n; i++) {
        const uint8_t *kp;
        uint32_t klen;

        rpc_read_key(&walk, &kp, &klen);
        want[i] = want[i] && klen <= rq->ctx->lim->max_key_size;
        m += want[i];
    }
    *asked = m;
    if (m == 0) {
        return 0;
    }
    if (m > RPC_REMOTE_STACK && (ks = malloc(m * sizeof(*ks))) == NULL) {
        return -ENOMEM;
    }
    m = 0;
    for (uint32_t i = 0; i < n; i++) {
        const uint8_t *kp;
        uint32_t klen;

        rpc_read_key(&keys, &kp, &klen);
        if (want[i]) {
            rpc_key(rq, kp, klen, &ks[m++]);
        }
    }
    rc = rm->fetch(rm->arg, ks, m, rq->ctx->final_try);
    if (ks != stack) {
        free(ks);
    }
    return rc;
}

int
rpc_remote_fill(struct rpc_req *rq, struct mp_reader keys, uint32_t n, struct store_obj **objs)
{
    struct store *st = rq->ctx->srv->store;
    uint8_t stack[RPC_REMOTE_STACK];
    uint8_t *want = stack;
    struct mp_reader walk = keys;
    uint32_t misses = 0;
    int rc;

    if (rq->ctx->srv->remote == NULL) {
        return 0;
    }
    if (n > RPC_REMOTE_STACK && (want = malloc(n)) == NULL) {
        rc = -ENOMEM;
        goto fail;
    }
    for (uint32_t i = 0; i < n; i++) {
        want[i] = objs[i] == NULL;
    }
    rc = rpc_remote_ask(rq, keys, n, want, &misses);
    if (rc != 0) {
        goto fail;
    }
    for (uint32_t i = 0; i < n && misses > 0; i++) {
        const uint8_t *kp;
        uint32_t klen;
        struct kv_key key;

        rpc_read_key(&walk, &kp, &klen);
        if (want[i]) {
            rpc_key(rq, kp, klen, &key);
            if (store_get(st, &key, &objs[i]) != 0) {
                objs[i] = NULL;         /* fetched copies are in DRAM: nothing to wait for */
            }
        }
    }
    if (want != stack) {
        free(want);
    }
    return 0;
fail:
    if (want != stack) {
        free(want);
    }
    for (uint32_t i = 0; i < n; i++) {
        store_obj_unref(st, objs[i]);
        objs[i] = NULL;
    }
    return rc;
}

int
rpc_remote_present(struct rpc_req *rq, struct mp_reader keys, uint32_t n, uint8_t *present)
{
    uint8_t stack[RPC_REMOTE_STACK];
    uint8_t *want = stack;
    struct mp_reader walk = keys;
    uint32_t misses = 0;
    int rc;

    if (rq->ctx->srv->remote == NULL) {
        return 0;
    }
    if (n > RPC_REMOTE_STACK && (want = malloc(n)) == NULL) {
        return -ENOMEM;
    }
    for (uint32_t i = 0; i < n; i++) {
        want[i] = !present[i];
    }
    rc = rpc_remote_ask(rq, keys, n, want, &misses);
    for (uint32_t i = 0; rc == 0 && i < n && misses > 0; i++) {
        const uint8_t *kp;
        uint32_t klen;
        struct kv_key key;

        rpc_read_key(&walk, &kp, &klen);
        if (want[i]) {
            rpc_key(rq, kp, klen, &key);
            present[i] = store_exists(rq->ctx->srv->store, &key) == 1;
        }
    }
    if (want != stack) {
        free(want);
    }
    return rc;
}

void
rpc_remote_stored(struct rpc_req *rq, const uint8_t *kp, uint32_t klen)
{
    const struct rpc_remote *rm = rq->ctx->srv->remote;
    struct store_obj *o;
    struct kv_key key;

    if (rm == NULL) {
        return;
    }
    rpc_key(rq, kp, klen, &key);
    if (store_get(rq->ctx->srv->store, &key, &o) == 0) {
        void *t = rm->stored(rm->arg, &key, o);

        store_obj_unref(rq->ctx->srv->store, o);
        if (rq->ticket != NULL) {
            rm->ticket_put(rm->arg, rq->ticket);    /* a caller that did not take it */
        }
        rq->ticket = t;
    }
}

void *
rpc_remote_stored_obj(struct rpc_ctx *ctx, struct store_obj *o)
{
    const struct rpc_remote *rm = ctx->srv->remote;
    struct kv_key key;

    if (rm == NULL) {
        return NULL;
    }
    store_obj_key(o, &key);
    return rm->stored(rm->arg, &key, o);
}

void
rpc_remote_flush(struct rpc_ctx *ctx)
{
    const struct rpc_remote *rm = ctx->srv->remote;

    if (rm != NULL && rm->flush != NULL) {
        rm->flush(rm->arg);
    }
}

/* ---- login ---- */

/*
 * The SHA-256 of the token against the tenant's, compared in constant time (an
 * unknown tenant costs the same work, so the answer's timing tells nothing).
 */
int
rpc_login(struct rpc_ctx *ctx, const char *tenant, uint32_t tenant_len, const uint8_t *token,
          uint32_t token_len, const char **why)
{
    static const uint8_t nobody[SHA256_DIGEST_LENGTH];
    const struct conf_tenants *ts = ctx->lim->tenants;
    const struct conf_tenant *t = NULL;
    uint8_t digest[SHA256_DIGEST_LENGTH];
    bool ok;

    for (uint32_t i = 0; ts != NULL && i < ts->n; i++) {
        if (strlen(ts->t[i].name) == tenant_len && memcmp(ts->t[i].name, tenant, tenant_len) == 0) {
            t = &ts->t[i];
        }
    }
    SHA256(token != NULL ? token : nobody, token_len, digest);
    ok = CRYPTO_memcmp(digest, t != NULL ? t->token_sha256 : nobody, sizeof(digest)) == 0
         && t != NULL && token != NULL && !ctx->auth_blocked;
    if (!ok) {
        ctx->auth_failures++;
        *why = ctx->auth_blocked ? "too many failed attempts from this address: wait"
                                 : "unknown tenant or wrong token";
        return KV_UNAUTHORIZED;
    }
    if (ctx->authed && ctx->tenant != t->id) {
        *why = "this connection is authenticated as another tenant already";
        return KV_INVALID_ARGUMENT;
    }
    ctx->tenant = t->id;
    ctx->authed = true;
    memcpy(ctx->auth_sha256, t->token_sha256, sizeof(ctx->auth_sha256));
    ctx->admin = strcmp(t->name, CONF_ADMIN_TENANT) == 0;
    return 0;
}
