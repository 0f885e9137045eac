/*
 * rpc: the top of the daemon's request layer: the method table, dispatch
 * (decode the request, check the login, call the method, answer its
 * request-level error), the store methods (get, exists, sizes, remove, pin,
 * stats) and hello with its login, and what the connection calls between
 * requests (rpc_overlaps, rpc_prefetch, rpc_ctx_release). The put path is
 * rpc_put.c; the shared-memory and direct-access methods are rpc_shm.c and
 * rpc_direct.c; rdma_connect is rpc_rdma.c's. Calls point down only: this
 * file calls those, they call the shared pieces (rpc_defer, rpc_resv,
 * rpc_rdma, rpc_spill) and rpc_req, never this file (tests/check_layers.py).
 *
 * Each handler first checks the whole shape of its params (types, arity,
 * batch size) without side effects, so a bad request is answered with one
 * request-level error and changes nothing; then it acts key by key, putting
 * per-key outcomes into the result. Replies are packed with msgpack-c into
 * the connection's outq; values go out by reference (outq_obj), never copied.
 *
 * This module never touches sockets or the event loop, and reaches objects
 * only through storage/store.h.
 */
#include "rpc.h"

#include <errno.h>
#include <msgpack.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "clock.h"
#include "config.h"
#include "kverr.h"
#include "mp.h"
#include "outq.h"
#include "rpc_cluster.h"
#include "rpc_defer.h"
#include "rpc_direct.h"
#include "rpc_peer.h"
#include "rpc_put.h"
#include "rpc_rdma.h"
#include "rpc_req.h"
#include "rpc_resv.h"
#include "rpc_shm.h"
#include "rpc_spill.h"
#include "shmbuf.h"
#include "store.h"

#define RPC_STATS_MAX 160
#define RPC_EXISTS_BLOCK 64
#define RPC_PREFETCH_REMOTE 64         /* keys of a queued get fetched from owners ahead */

static const char *const rpc_names[RPC_METHOD_COUNT] = {
    [RPC_PING] = "ping",
    [RPC_HELLO] = "hello",
    [RPC_PUT] = "put",
    [RPC_BATCH_PUT] = "batch_put",
    [RPC_GET] = "get",
    [RPC_BATCH_GET] = "batch_get",
    [RPC_IS_EXIST] = "is_exist",
    [RPC_BATCH_IS_EXIST] = "batch_is_exist",
    [RPC_PREFIX_MATCH] = "prefix_match",
    [RPC_GET_SIZE] = "get_size",
    [RPC_BATCH_GET_SIZE] = "batch_get_size",
    [RPC_REMOVE] = "remove",
    [RPC_BATCH_REMOVE] = "batch_remove",
    [RPC_REMOVE_ALL] = "remove_all",
    [RPC_PIN] = "pin",
    [RPC_UNPIN] = "unpin",
    [RPC_STATS] = "stats",
    [RPC_REGISTER_BUFFER] = "register_buffer",
    [RPC_UNREGISTER_BUFFER] = "unregister_buffer",
    [RPC_BATCH_PUT_FROM] = "batch_put_from",
    [RPC_BATCH_GET_INTO] = "batch_get_into",
    [RPC_MAP_SEGMENT] = "map_segment",
    [RPC_PUT_START] = "put_start",
    [RPC_PUT_END] = "put_end",
    [RPC_PUT_REVOKE] = "put_revoke",
    [RPC_GET_REPLICA_LIST] = "get_replica_list",
    [RPC_RDMA_CONNECT] = "rdma_connect",
    [RPC_CLUSTER_INFO] = "cluster_info",
    [RPC_CLUSTER_DRAIN] = "cluster_drain",
    [RPC_PEER_GET] = "peer_get",
    [RPC_PEER_EXISTS] = "peer_exists",
    [RPC_PEER_PUT] = "peer_put",
    [RPC_PEER_SIZES] = "peer_sizes",
    [RPC_PEER_GET_INTO] = "peer_get_into",
    [RPC_PEER_PUT_FROM] = "peer_put_from",
};

const char *
rpc_method_name(int method)
{
    if (method < 0 || method >= RPC_METHOD_COUNT) {
        return "unknown";
    }
    return rpc_names[method];
}

static int
rpc_method_lookup(const char *name, uint32_t len)
{
    for (int i = 0; i < RPC_METHOD_COUNT; i++) {
        if (mp_str_eq(name, len, rpc_names[i])) {
            return i;
        }
    }
    return -1;
}

/* ---- handlers ---- */

static int
rpc_ping(struct rpc_req *rq)
{
    int rc = rpc_arity(rq, 0, 0);
    if (rc != 0) {
        return rc;
    }
    rpc_reply_head(rq);
    msgpack_pack_str_with_body(&rq->pk, "pong", 4);
    return 0;
}

static void
rpc_pack_kv_uint(msgpack_packer *pk, const char *k, uint64_t v)
{
    mp_pack_cstr(pk, k);
    msgpack_pack_uint64(pk, v);
}

/* rpc_authenticate: hello {tenant, token} (rpc_login). */
static int
rpc_authenticate(struct rpc_req *rq, const struct rpc_opts *o)
{
    return rpc_login(rq->ctx, o->tenant, o->tenant_len, o->token, o->token_len, &rq->errmsg);
}

bool
rpc_auth_holds(const struct rpc_ctx *ctx, const char **why)
{
    const struct conf_tenants *ts = ctx->lim->tenants;

    if (!ctx->authed) {
        return true;
    }
    /* The id is the tenant's namespace (unique within a config): same id, same keys. */
    for (uint32_t i = 0; ts != NULL && i < ts->n; i++) {
        if (ts->t[i].id != ctx->tenant) {
            continue;
        }
        if (memcmp(ts->t[i].token_sha256, ctx->auth_sha256, sizeof(ctx->auth_sha256)) == 0) {
            return true;
        }
        *why = "token changed by reload";
        return false;
    }
    *why = "tenant removed by reload";
    return false;
}

static int
rpc_hello(struct rpc_req *rq)
{
    const struct rpc_server *srv = rq->ctx->srv;
    const struct rpc_limits *lim = rq->ctx->lim;
    struct rpc_opts opts;
    int rc = rpc_arity(rq, 0, 1);

    if (rc != 0) {
        return rc;
    }
    if (rq->nparams == 1 && mp_peek(&rq->rd) != MP_MAP && mp_peek(&rq->rd) != MP_NIL) {
        return rpc_invalid(rq, "hello opts must be a map");
    }
    rc = rpc_opts_read(rq, 0, &opts);
    if (rc == 0 && opts.tenant != NULL) {
        rc = rpc_authenticate(rq, &opts);
    }
    if (rc == 0 && opts.want_qp) {
        rc = rpc_rdma_hello(rq);
    }
    if (rc != 0) {
        return rc;
    }
    rpc_reply_head(rq);
    msgpack_pack_map(&rq->pk, opts.want_qp ? 11 : 10);
    if (opts.want_qp) {
        mp_pack_cstr(&rq->pk, "rdma_qp");
        rpc_rdma_pack_info(rq);
    }
    mp_pack_cstr(&rq->pk, "server");
    mp_pack_cstr(&rq->pk, "kvstashd");
    mp_pack_cstr(&rq->pk, "version");
    mp_pack_cstr(&rq->pk, srv->version);
    rpc_pack_kv_uint(&rq->pk, "protocol", 1);
    mp_pack_cstr(&rq->pk, "node_id");
    mp_pack_cstr(&rq->pk, srv->node_id);
    rpc_pack_kv_uint(&rq->pk, "max_key_size", lim->max_key_size);
    rpc_pack_kv_uint(&rq->pk, "max_value_size", lim->max_value_size);
    rpc_pack_kv_uint(&rq->pk, "max_batch", lim->max_batch);
    rpc_pack_kv_uint(&rq->pk, "max_message_size", lim->max_message_size);
    rpc_pack_kv_uint(&rq->pk, "lease_ttl_ms", lim->lease_ttl_ms);
    mp_pack_cstr(&rq->pk, "transports");
    msgpack_pack_array(&rq->pk, (size_t)srv->ntransports);
    for (int i = 0; i < srv->ntransports; i++) {
        mp_pack_cstr(&rq->pk, srv->transports[i]);
    }
    return 0;
}

void
rpc_ctx_release(struct rpc_ctx *ctx)
{
    rpc_deferred_free(ctx, ctx->deferred);
    ctx->deferred = NULL;
    rpc_deferred_free(ctx, ctx->resume);
    ctx->resume = NULL;
    rpc_xfer_release(ctx);
    rpc_rdma_release(ctx);      /* after the transfers: their posted work completes flushed */
    rpc_resv_release(ctx);
    rpc_tier_forget(ctx);
    shmbuf_set_destroy(ctx->bufs);
    ctx->bufs = NULL;
}

/*
 * Append the reply value of one get: the bin by reference (the reference goes with it), or
 * nil. Its lookup was counted where it resolved (rpc_get_refs).
 */
static void
rpc_pack_get(struct rpc_req *rq, struct store_obj *o)
{
    if (o == NULL) {
        msgpack_pack_nil(&rq->pk);
        return;
    }
    msgpack_pack_bin(&rq->pk, (size_t)store_obj_size(o));
    outq_obj(rq->out, o);
}

static int
rpc_get(struct rpc_req *rq)
{
    struct mp_reader keys;
    struct store_obj *o;
    const uint8_t *kp;
    uint32_t klen;
    int rc = rpc_arity(rq, 1, 1);

    if (rc != 0) {
        return rc;
    }
    keys = rq->rd;
    if (rpc_read_key(&rq->rd, &kp, &klen) != 0) {
        return rpc_invalid(rq, "key must be bin or str");
    }
    rc = rpc_get_refs(rq, keys, 1, &o, NULL);
    if (rc == 0) {
        rc = rpc_remote_fill(rq, keys, 1, &o);     /* a miss: ask the owners */
    }
    if (rc != 0) {
        return rc;
    }
    rpc_reply_head(rq);
    rpc_pack_get(rq, o);
    return 0;
}

static int
rpc_batch_get(struct rpc_req *rq)
{
    struct store_obj *stack[64];
    struct store_obj **objs = stack;
    uint32_t n;
    int rc = rpc_arity(rq, 1, 1);

    if (rc == 0) {
        rc = rpc_keys_check(rq, &n);
    }
    if (rc != 0) {
        return rc;
    }
    if (n > 64) {
        objs = malloc(n * sizeof(*objs));   /* n <= max_batch, checked above */
        if (objs == NULL) {
            return -ENOMEM;
        }
    }
    rc = rpc_get_refs(rq, rq->rd, n, objs, NULL);
    if (rc == 0) {
        rc = rpc_remote_fill(rq, rq->rd, n, objs);
    }
    if (rc == 0) {
        rpc_reply_head(rq);
        msgpack_pack_array(&rq->pk, n);
        for (uint32_t i = 0; i < n; i++) {
            rpc_pack_get(rq, objs[i]);
        }
    }
    if (objs != stack) {
        free(objs);
    }
    return rc;
}

static bool
rpc_exists(struct rpc_req *rq, const uint8_t *kp, uint32_t klen)
{
    struct kv_key key;

    if (klen > rq->ctx->lim->max_key_size) {
        return false;
    }
    rpc_key(rq, kp, klen, &key);
    return store_exists(rq->ctx->srv->store, &key) == 1;
}

static int
rpc_is_exist(struct rpc_req *rq)
{
    const uint8_t *kp;
    uint32_t klen;
    int rc = rpc_arity(rq, 1, 1);

    if (rc != 0) {
        return rc;
    }
    struct mp_reader keys = rq->rd;
    if (rpc_read_key(&rq->rd, &kp, &klen) != 0) {
        return rpc_invalid(rq, "key must be bin or str");
    }
    uint8_t present = rpc_exists(rq, kp, klen);
    rc = rpc_remote_present(rq, keys, 1, &present);
    if (rc != 0) {
        return rc;
    }
    rpc_reply_head(rq);
    if (present) {
        msgpack_pack_true(&rq->pk);
    } else {
        msgpack_pack_false(&rq->pk);
    }
    return 0;
}

/* batch_is_exist in a cluster: the keys missing here are asked of their owners first. */
static int
rpc_batch_is_exist_cluster(struct rpc_req *rq, uint32_t n)
{
    struct mp_reader keys = rq->rd;
    uint8_t stack[RPC_EXISTS_BLOCK];
    uint8_t *present = n > RPC_EXISTS_BLOCK ? malloc(n) : stack;
    const uint8_t *kp;
    uint32_t klen;
    int rc;

    if (present == NULL) {
        return -ENOMEM;
    }
    for (uint32_t i = 0; i < n; i++) {
        rpc_read_key(&rq->rd, &kp, &klen);
        present[i] = rpc_exists(rq, kp, klen);
    }
    rc = rpc_remote_present(rq, keys, n, present);
    if (rc == 0) {
        rpc_reply_head(rq);
        msgpack_pack_array(&rq->pk, n);
        for (uint32_t i = 0; i < n; i++) {
            if (present[i]) {
                msgpack_pack_true(&rq->pk);
            } else {
                msgpack_pack_false(&rq->pk);
            }
        }
    }
    if (present != stack) {
        free(present);
    }
    return rc;
}

static int
rpc_batch_is_exist(struct rpc_req *rq)
{
    const uint8_t *kp;
    uint32_t n, klen;
    int rc = rpc_arity(rq, 1, 1);

    if (rc == 0) {
        rc = rpc_keys_check(rq, &n);
    }
    if (rc != 0) {
        return rc;
    }
    if (rq->ctx->srv->remote != NULL) {
        return rpc_batch_is_exist_cluster(rq, n);
    }
    rpc_reply_head(rq);
    msgpack_pack_array(&rq->pk, n);
    /* In blocks, so the store can overlap the lookups' cache misses. */
    struct kv_key keys[RPC_EXISTS_BLOCK];
    uint8_t found[RPC_EXISTS_BLOCK], reply[RPC_EXISTS_BLOCK];
    for (uint32_t i = 0; i < n;) {
        uint32_t m = 0, nkeys = 0;
        uint32_t slot[RPC_EXISTS_BLOCK];
        for (; m < RPC_EXISTS_BLOCK && i + m < n; m++) {
            rpc_read_key(&rq->rd, &kp, &klen);
            slot[m] = UINT32_MAX; /* a key over max_key_size cannot exist */
            if (klen <= rq->ctx->lim->max_key_size) {
                slot[m] = nkeys;
                rpc_key(rq, kp, klen, &keys[nkeys++]);
            }
        }
        store_exists_batch(rq->ctx->srv->store, keys, nkeys, found);
        for (uint32_t j = 0; j < m; j++) {
            reply[j] = slot[j] != UINT32_MAX && found[slot[j]] ? 0xc3 : 0xc2; /* true, false */
        }
        outq_write(rq->out, reply, m);
        i += m;
    }
    return 0;
}

/*
 * prefix_match in a cluster: the blocks from the first one missing here to the end are asked
 * of their owners (their values come along, for the reads that follow a match), and the
 * count goes on from *groups to the first block no owner has either.
 */
static int
rpc_prefix_match_cluster(struct rpc_req *rq, struct mp_reader keys, uint32_t n, uint64_t g,
                         uint64_t *groups)
{
    uint32_t from = (uint32_t)(*groups * g), m = n - from;
    uint8_t stack[RPC_EXISTS_BLOCK];
    uint8_t *present = m > RPC_EXISTS_BLOCK ? malloc(m) : stack;
    const uint8_t *kp;
    uint32_t klen;
    int rc;

    if (present == NULL) {
        return -ENOMEM;
    }
    for (uint32_t i = 0; i < from; i++) {
        rpc_read_key(&keys, &kp, &klen);
    }
    struct mp_reader rest = keys;
    for (uint32_t i = 0; i < m; i++) {
        rpc_read_key(&keys, &kp, &klen);
        present[i] = rpc_exists(rq, kp, klen);
    }
    rc = rpc_remote_present(rq, rest, m, present);
    for (uint32_t i = 0; rc == 0 && i < m; i += (uint32_t)g) {
        bool all = true;
        for (uint64_t j = 0; j < g; j++) {
            all = all && present[i + j];
        }
        if (!all) {
            break;
        }
        (*groups)++;
    }
    if (present != stack) {
        free(present);
    }
    return rc;
}

static int
rpc_prefix_match(struct rpc_req *rq)
{
    struct mp_reader keys;
    struct rpc_opts opts;
    const uint8_t *kp;
    uint32_t n, klen;
    uint64_t groups = 0;
    int rc = rpc_arity(rq, 1, 2);

    if (rc == 0) {
        rc = rpc_keys_skip(rq, &n, &keys);
    }
    if (rc != 0) {
        return rc;
    }
    rc = rpc_opts_read(rq, 1, &opts);
    if (rc != 0) {
        return rc;
    }
    struct mp_reader first = keys;
    uint64_t g = opts.group_size ? opts.group_size : 1;
    if (n % g != 0) {
        return rpc_invalid(rq, "number of keys is not a multiple of group_size");
    }
    /* Probe in order and stop at the first miss: later keys are not touched. */
    for (uint32_t i = 0; i < n; i += (uint32_t)g) {
        bool all = true;
        for (uint64_t j = 0; j < g; j++) {
            rpc_read_key(&keys, &kp, &klen);
            if (all && !rpc_exists(rq, kp, klen)) {
                all = false;
            }
        }
        if (!all) {
            break;
        }
        groups++;
    }
    if (groups * g < n && rq->ctx->srv->remote != NULL) {
        rc = rpc_prefix_match_cluster(rq, first, n, g, &groups);
        if (rc != 0) {
            return rc;
        }
    }
    ctr_add(&rq->ctx->ctr->prefix_asked, n / g);
    ctr_add(&rq->ctx->ctr->prefix_found, groups);
    rpc_reply_head(rq);
    msgpack_pack_uint64(&rq->pk, groups);
    return 0;
}

static void
rpc_pack_size(struct rpc_req *rq, const uint8_t *kp, uint32_t klen)
{
    struct kv_key key;
    uint64_t size;

    rpc_key(rq, kp, klen, &key);
    if (klen <= rq->ctx->lim->max_key_size && store_size(rq->ctx->srv->store, &key, &size) == 0) {
        msgpack_pack_uint64(&rq->pk, size);
    } else {
        msgpack_pack_nil(&rq->pk);
    }
}

static int
rpc_get_size(struct rpc_req *rq)
{
    const uint8_t *kp;
    uint32_t klen;
    int rc = rpc_arity(rq, 1, 1);

    if (rc != 0) {
        return rc;
    }
    if (rpc_read_key(&rq->rd, &kp, &klen) != 0) {
        return rpc_invalid(rq, "key must be bin or str");
    }
    rpc_reply_head(rq);
    rpc_pack_size(rq, kp, klen);
    return 0;
}

static int
rpc_batch_get_size(struct rpc_req *rq)
{
    const uint8_t *kp;
    uint32_t n, klen;
    int rc = rpc_arity(rq, 1, 1);

    if (rc == 0) {
        rc = rpc_keys_check(rq, &n);
    }
    if (rc != 0) {
        return rc;
    }
    rpc_reply_head(rq);
    msgpack_pack_array(&rq->pk, n);
    for (uint32_t i = 0; i < n; i++) {
        rpc_read_key(&rq->rd, &kp, &klen);
        rpc_pack_size(rq, kp, klen);
    }
    return 0;
}

static int
rpc_remove_one(struct rpc_req *rq, const uint8_t *kp, uint32_t klen, bool force)
{
    struct kv_key key;

    if (klen > rq->ctx->lim->max_key_size) {
        return KV_NOT_FOUND;
    }
    rpc_key(rq, kp, klen, &key);
    return store_remove(rq->ctx->srv->store, &key, force);
}

static int
rpc_remove(struct rpc_req *rq)
{
    const uint8_t *kp;
    uint32_t klen;
    struct rpc_opts opts;
    int rc = rpc_arity(rq, 1, 2);

    if (rc != 0) {
        return rc;
    }
    if (rpc_read_key(&rq->rd, &kp, &klen) != 0) {
        return rpc_invalid(rq, "key must be bin or str");
    }
    rc = rpc_opts_read(rq, 1, &opts);
    if (rc != 0) {
        return rc;
    }
    rc = rpc_remove_one(rq, kp, klen, opts.force);
    rpc_reply_head(rq);
    msgpack_pack_int(&rq->pk, rc);
    return 0;
}

static int
rpc_batch_remove(struct rpc_req *rq)
{
    struct mp_reader keys;
    struct rpc_opts opts;
    const uint8_t *kp;
    uint32_t n, klen;
    int rc = rpc_arity(rq, 1, 2);

    if (rc == 0) {
        rc = rpc_keys_skip(rq, &n, &keys);
    }
    if (rc != 0) {
        return rc;
    }
    rc = rpc_opts_read(rq, 1, &opts);
    if (rc != 0) {
        return rc;
    }
    rpc_reply_head(rq);
    msgpack_pack_array(&rq->pk, n);
    for (uint32_t i = 0; i < n; i++) {
        rpc_read_key(&keys, &kp, &klen);
        msgpack_pack_int(&rq->pk, rpc_remove_one(rq, kp, klen, opts.force));
    }
    return 0;
}

static int
rpc_remove_all(struct rpc_req *rq)
{
    struct rpc_opts opts;
    int rc = rpc_arity(rq, 0, 1);

    if (rc == 0) {
        rc = rpc_opts_read(rq, 0, &opts);
    }
    if (rc != 0) {
        return rc;
    }
    uint64_t n = store_remove_all(rq->ctx->srv->store, rq->ctx->tenant, false, opts.force);
    rpc_reply_head(rq);
    msgpack_pack_uint64(&rq->pk, n);
    return 0;
}

static int
rpc_pin_keys(struct rpc_req *rq, uint32_t n, struct mp_reader keys, enum store_pin mode)
{
    const uint8_t *kp;
    uint32_t klen;
    struct kv_key key;

    rpc_reply_head(rq);
    msgpack_pack_array(&rq->pk, n);
    for (uint32_t i = 0; i < n; i++) {
        rpc_read_key(&keys, &kp, &klen);
        rpc_key(rq, kp, klen, &key);
        int rc = klen > rq->ctx->lim->max_key_size
                     ? KV_NOT_FOUND
                     : store_pin(rq->ctx->srv->store, &key, mode);
        msgpack_pack_int(&rq->pk, rc);
    }
    return 0;
}

static int
rpc_pin(struct rpc_req *rq)
{
    struct mp_reader keys;
    const char *mode;
    uint32_t n, mlen;
    enum store_pin pin;
    int rc = rpc_arity(rq, 2, 2);

    if (rc == 0) {
        rc = rpc_keys_skip(rq, &n, &keys);
    }
    if (rc != 0) {
        return rc;
    }
    if (mp_read_str(&rq->rd, &mode, &mlen) != 0) {
        return rpc_invalid(rq, "pin mode must be \"soft\" or \"hard\"");
    }
    if (mp_str_eq(mode, mlen, "soft")) {
        pin = STORE_PIN_SOFT;
    } else if (mp_str_eq(mode, mlen, "hard")) {
        pin = STORE_PIN_HARD;
    } else {
        return rpc_invalid(rq, "pin mode must be \"soft\" or \"hard\"");
    }
    return rpc_pin_keys(rq, n, keys, pin);
}

static int
rpc_unpin(struct rpc_req *rq)
{
    uint32_t n;
    int rc = rpc_arity(rq, 1, 1);

    if (rc == 0) {
        rc = rpc_keys_check(rq, &n);
    }
    if (rc != 0) {
        return rc;
    }
    return rpc_pin_keys(rq, n, rq->rd, STORE_PIN_NONE);
}

static int
rpc_stats(struct rpc_req *rq)
{
    const struct rpc_server *srv = rq->ctx->srv;
    const char *names[RPC_STATS_MAX];
    uint64_t values[RPC_STATS_MAX];
    struct rpc_opts opts;
    int rc = rpc_arity(rq, 0, 1);

    if (rc != 0 || (rc = rpc_opts_read(rq, 0, &opts)) != 0) {
        return rc;                  /* opts: a map or nil, as every method's (none known yet) */
    }
    if (!rpc_shared_view(rq->ctx)) {
        /* A tenant sees its own namespace only. */
        uint64_t objects = 0, bytes = 0;

        store_tenant_usage(srv->store, rq->ctx->tenant, &objects, &bytes);
        rpc_reply_head(rq);
        msgpack_pack_map(&rq->pk, 2);
        rpc_pack_kv_uint(&rq->pk, "tenant_objects", objects);
        rpc_pack_kv_uint(&rq->pk, "tenant_value_bytes", bytes);
        return 0;
    }
    int n = srv->stats_fn != NULL ? srv->stats_fn(srv->stats_arg, names, values, RPC_STATS_MAX)
                                  : 0;
    rpc_reply_head(rq);
    msgpack_pack_map(&rq->pk, (size_t)n);
    for (int i = 0; i < n; i++) {
        rpc_pack_kv_uint(&rq->pk, names[i], values[i]);
    }
    return 0;
}

static rpc_handler_fn *const rpc_handlers[RPC_METHOD_COUNT] = {
    [RPC_PING] = rpc_ping,
    [RPC_HELLO] = rpc_hello,
    [RPC_PUT] = rpc_put,
    [RPC_BATCH_PUT] = rpc_batch_put,
    [RPC_GET] = rpc_get,
    [RPC_BATCH_GET] = rpc_batch_get,
    [RPC_IS_EXIST] = rpc_is_exist,
    [RPC_BATCH_IS_EXIST] = rpc_batch_is_exist,
    [RPC_PREFIX_MATCH] = rpc_prefix_match,
    [RPC_GET_SIZE] = rpc_get_size,
    [RPC_BATCH_GET_SIZE] = rpc_batch_get_size,
    [RPC_REMOVE] = rpc_remove,
    [RPC_BATCH_REMOVE] = rpc_batch_remove,
    [RPC_REMOVE_ALL] = rpc_remove_all,
    [RPC_PIN] = rpc_pin,
    [RPC_UNPIN] = rpc_unpin,
    [RPC_STATS] = rpc_stats,
    [RPC_REGISTER_BUFFER] = rpc_register_buffer,
    [RPC_UNREGISTER_BUFFER] = rpc_unregister_buffer,
    [RPC_BATCH_PUT_FROM] = rpc_batch_put_from,
    [RPC_BATCH_GET_INTO] = rpc_batch_get_into,
    [RPC_MAP_SEGMENT] = rpc_map_segment,
    [RPC_PUT_START] = rpc_put_start,
    [RPC_PUT_END] = rpc_put_end,
    [RPC_PUT_REVOKE] = rpc_put_revoke,
    [RPC_GET_REPLICA_LIST] = rpc_get_replica_list,
    [RPC_RDMA_CONNECT] = rpc_rdma_connect,
    [RPC_CLUSTER_INFO] = rpc_cluster_info,
    [RPC_CLUSTER_DRAIN] = rpc_cluster_drain,
    [RPC_PEER_GET] = rpc_peer_get,
    [RPC_PEER_EXISTS] = rpc_peer_exists,
    [RPC_PEER_PUT] = rpc_peer_put,
    [RPC_PEER_SIZES] = rpc_peer_sizes,
    [RPC_PEER_GET_INTO] = rpc_peer_get_into,
    [RPC_PEER_PUT_FROM] = rpc_peer_put_from,
};

/* ---- dispatch ---- */

_Static_assert(RPC_ERR_CODES == KV_CODE_MAX + 1, "RPC_ERR_CODES must cover every status");

const uint64_t rpc_lat_bounds_ns[RPC_LAT_BOUNDS] = {
    10000ull, 25000ull, 50000ull, 100000ull, 250000ull, 500000ull,
    1000000ull, 2500000ull, 5000000ull, 10000000ull, 25000000ull, 50000000ull,
    100000000ull, 250000000ull, 500000000ull,
    1000000000ull, 2500000000ull, 5000000000ull, 10000000000ull,
};

/* Count a request of method m answered with code (0: success) after ns nanoseconds. */
static void
rpc_count_done(struct rpc_counters *ctr, int m, int code, uint64_t ns)
{
    int b = 0;

    while (b < RPC_LAT_BOUNDS && ns > rpc_lat_bounds_ns[b]) {
        b++;
    }
    ctr_add(&ctr->lat[m][b], 1);
    ctr_add(&ctr->lat_sum_ns[m], ns);
    if (code > 0 && code < RPC_ERR_CODES) {
        ctr_add(&ctr->method_errors[m][code], 1);
    }
}

/* Abort every spilled reservation a handler did not commit. */
static void
rpc_holes_release(struct rpc_ctx *ctx, const struct mp_hole *holes, size_t nholes)
{
    for (size_t i = 0; i < nholes; i++) {
        struct rpc_spill *sp = holes[i].tag;
        if (sp != NULL && sp->obj != NULL) {
            store_abort(ctx->srv->store, sp->obj);
            sp->obj = NULL;
        }
    }
}

int
rpc_dispatch(struct rpc_ctx *ctx, const uint8_t *msg, size_t len, const struct mp_hole *holes,
             size_t nholes, struct outq *out)
{
    struct rpc_req rq;
    uint32_t n, mlen;
    uint64_t type;
    const char *mname;
    int rc = KV_PROTOCOL_ERROR;
    int m = -1, code = 0;           /* the method, once known, and the error it got */
    uint64_t t0 = clock_ns();

    memset(&rq, 0, sizeof(rq));
    rq.ctx = ctx;
    rq.out = out;
    mp_reader_init(&rq.rd, msg, len);
    mp_reader_holes(&rq.rd, holes, nholes);
    msgpack_packer_init(&rq.pk, out, outq_pack_write);

    if (mp_read_array(&rq.rd, &n) != 0 || mp_read_uint(&rq.rd, &type) != 0) {
        goto done;
    }
    if (type == 2 && n == 3) {
        rc = 0; /* a client notification: nothing to answer */
        goto done;
    }
    if (type != 0 || n != 4 || mp_read_uint(&rq.rd, &rq.msgid) != 0) {
        goto done;
    }
    if (mp_read_str(&rq.rd, &mname, &mlen) != 0) {
        const uint8_t *hp;
        uint64_t hlen;
        const struct mp_hole *hole = NULL;
        if (mp_peek(&rq.rd) == MP_STR && mp_read_key_ref(&rq.rd, &hp, &hlen, &hole) == 0 &&
            hole != NULL) {
            /* a method name too long to buffer: no method has such a name */
            rpc_reply_error(&rq, KV_METHOD_NOT_FOUND, "no such method");
            ctr_add(&ctx->ctr->errors, 1);
            rc = 0;
            goto done;
        }
        rq.errmsg = "method must be a string";
        rpc_reply_error(&rq, KV_INVALID_ARGUMENT, rq.errmsg);
        ctr_add(&ctx->ctr->errors, 1);
        rc = 0;
        goto done;
    }
    m = rpc_method_lookup(mname, mlen);
    if (m < 0) {
        rpc_reply_error(&rq, KV_METHOD_NOT_FOUND, "no such method");
        ctr_add(&ctx->ctr->errors, 1);
        rc = 0;
        goto done;
    }
    ctr_add(&ctx->ctr->ops[m], 1);
    if (ctx->lim->require_auth && !ctx->authed && m != RPC_PING && m != RPC_HELLO) {
        rpc_reply_error(&rq, KV_UNAUTHORIZED, "authenticate first: hello {tenant, token}");
        ctr_add(&ctx->ctr->errors, 1);
        code = KV_UNAUTHORIZED;
        rc = 0;
        goto done;
    }
    if (mp_read_array(&rq.rd, &rq.nparams) != 0) {
        rpc_reply_error(&rq, KV_INVALID_ARGUMENT, "params must be an array");
        ctr_add(&ctx->ctr->errors, 1);
        code = KV_INVALID_ARGUMENT;
        rc = 0;
        goto done;
    }
    rc = rpc_handlers[m](&rq);
    rpc_remote_flush(ctx);          /* in a pool: what it stored, to the owners in one go */
    if (rc != -EAGAIN && ctx->resume != NULL) {
        rpc_deferred_free(ctx, ctx->resume);   /* only the message that waited picks it up */
        ctx->resume = NULL;
    }
    if (rc != -EAGAIN) {
        rpc_xfer_resume_drop(ctx);
        rpc_tier_forget(ctx);       /* a read that failed after noting its SSD keys */
    }
    if (rc == -EAGAIN) {
        /* Nothing answered, nothing consumed: the same message comes back later. */
        atomic_fetch_sub_explicit(&ctx->ctr->ops[m], 1, memory_order_relaxed);
        return rc;
    }
    if (rc == -ENOMEM) {
        rpc_holes_release(ctx, holes, nholes);
        return rc;
    }
    if (rc != 0) {
        rpc_reply_error(&rq, rc, rq.errmsg);
        ctr_add(&ctx->ctr->errors, 1);
        code = rc;
    }
    rc = 0;
done:
    if (m >= 0) {
        rpc_count_done(ctx->ctr, m, code, clock_ns() - t0);
    }
    rpc_holes_release(ctx, holes, nholes);
    if (out->failed) {
        return -ENOMEM;
    }
    if (rq.replied) {
        outq_reply_end(out);    /* a deferred reply is marked when it is queued */
    }
    return rc;
}

/*
 * rpc_peek: the method of a complete request msg[0..len) (enum rpc_method),
 * with rd left at its first param and *nparams set; -1 for anything else.
 */
static int
rpc_peek(const uint8_t *msg, size_t len, struct mp_reader *rd, uint32_t *nparams)
{
    uint32_t n, mlen;
    uint64_t type, msgid;
    const char *mname;

    mp_reader_init(rd, msg, len);
    if (mp_read_array(rd, &n) != 0 || n != 4 || mp_read_uint(rd, &type) != 0 || type != 0
        || mp_read_uint(rd, &msgid) != 0 || mp_read_str(rd, &mname, &mlen) != 0
        || mp_read_array(rd, nparams) != 0) {
        return -1;
    }
    return rpc_method_lookup(mname, mlen);
}

bool
rpc_overlaps(const struct rpc_ctx *ctx, const uint8_t *msg, size_t len)
{
    struct mp_reader rd;
    uint32_t np;

    return rpc_xfer_room(ctx) && rpc_peek(msg, len, &rd, &np) == RPC_BATCH_GET_INTO;
}

void
rpc_prefetch(struct rpc_ctx *ctx, const uint8_t *msg, size_t len)
{
    struct kv_key miss[RPC_PREFETCH_REMOTE];
    uint32_t nmiss = 0;
    struct mp_reader rd;
    uint32_t np, nkeys = 1;
    int m = rpc_peek(msg, len, &rd, &np);

    if ((m != RPC_GET && m != RPC_BATCH_GET) || np < 1) {
        return;
    }
    if (m == RPC_BATCH_GET
        && (mp_read_array(&rd, &nkeys) != 0 || nkeys > ctx->lim->max_batch)) {
        return;
    }
    for (uint32_t i = 0; i < nkeys; i++) {
        const uint8_t *kp;
        uint32_t klen;
        struct kv_key key;

        if (rpc_read_key(&rd, &kp, &klen) != 0) {
            return;
        }
        if (klen > ctx->lim->max_key_size) {
            continue;
        }
        key.tenant = ctx->tenant;
        key.ptr = kp;
        key.len = klen;
        if (store_prefetch(ctx->srv->store, &key) == 0 && ctx->srv->remote != NULL
            && nmiss < RPC_PREFETCH_REMOTE && store_exists(ctx->srv->store, &key) == 0) {
            miss[nmiss++] = key;        /* in a pool: its owner is asked now, too */
        }
    }
    if (nmiss > 0) {
        (void)ctx->srv->remote->fetch(ctx->srv->remote->arg, miss, nmiss, false);
    }
}

int
rpc_notify_error(struct outq *out, int status, const char *message)
{
    msgpack_packer pk;

    msgpack_packer_init(&pk, out, outq_pack_write);
    msgpack_pack_array(&pk, 3);
    msgpack_pack_uint8(&pk, 2);
    mp_pack_cstr(&pk, "error");
    mp_pack_error(&pk, status, message);
    return out->failed ? -ENOMEM : 0;
}
