/*
 * rpc_cluster: cluster_info. The reply is built from one acquired view, so its members,
 * revision and owners agree with each other even while views change. Placement is over the
 * key bytes as the client sent them (no tenant namespace), as the data paths place them.
 */
#include "rpc_cluster.h"

#include <msgpack.h>
#include <string.h>

#include "member.h"
#include "kverr.h"
#include "mp.h"
#include "place.h"
#include "rpc_ctx.h"
#include "rpc_req.h"
#include "view.h"

static void
rpc_cluster_uint(msgpack_packer *pk, const char *k, uint64_t v)
{
    mp_pack_cstr(pk, k);
    msgpack_pack_uint64(pk, v);
}

static void
rpc_cluster_node(msgpack_packer *pk, const struct view_node *nd)
{
    msgpack_pack_map(pk, 5);
    mp_pack_cstr(pk, "id");
    mp_pack_cstr(pk, nd->id);
    mp_pack_cstr(pk, "addr");
    mp_pack_cstr(pk, nd->addr);
    mp_pack_cstr(pk, "tls");
    mp_pack_cstr(pk, nd->tls);
    mp_pack_cstr(pk, "weight");
    msgpack_pack_double(pk, nd->weight);
    mp_pack_cstr(pk, "state");
    mp_pack_cstr(pk, view_state_name(nd->state));
}

int
rpc_cluster_info(struct rpc_req *rq)
{
    struct member_stats ms;
    struct cluster_view *v;
    uint32_t nkeys = 0;
    int rc = rpc_arity(rq, 0, 1);

    if (rc == 0 && rq->nparams == 1) {
        rc = rpc_keys_check(rq, &nkeys);
    }
    if (rc != 0) {
        return rc;
    }
    member_stats(&ms);
    v = view_acquire();
    rpc_reply_head(rq);
    msgpack_pack_map(&rq->pk, 11 + (rq->nparams == 1));
    mp_pack_cstr(&rq->pk, "cluster");
    mp_pack_cstr(&rq->pk, ms.cluster);
    mp_pack_cstr(&rq->pk, "node_id");
    mp_pack_cstr(&rq->pk, rq->ctx->srv->node_id != NULL ? rq->ctx->srv->node_id : "");
    mp_pack_cstr(&rq->pk, "replicas");
    msgpack_pack_uint32(&rq->pk, ms.replicas);
    mp_pack_cstr(&rq->pk, "state");
    mp_pack_cstr(&rq->pk, ms.in_pool ? view_state_name(ms.state) : "");
    mp_pack_cstr(&rq->pk, "registered");
    ms.registered ? msgpack_pack_true(&rq->pk) : msgpack_pack_false(&rq->pk);
    mp_pack_cstr(&rq->pk, "etcd_ok");
    ms.etcd_ok ? msgpack_pack_true(&rq->pk) : msgpack_pack_false(&rq->pk);
    mp_pack_cstr(&rq->pk, "etcd_endpoint");
    mp_pack_cstr(&rq->pk, ms.endpoint);
    mp_pack_cstr(&rq->pk, "revision");
    msgpack_pack_uint64(&rq->pk, v != NULL ? v->revision : 0);
    mp_pack_cstr(&rq->pk, "self");
    msgpack_pack_int(&rq->pk, v != NULL ? v->self : -1);
    mp_pack_cstr(&rq->pk, "counters");
    msgpack_pack_map(&rq->pk, 8);
    rpc_cluster_uint(&rq->pk, "etcd_errors", ms.etcd_errors);
    rpc_cluster_uint(&rq->pk, "lease_renewals", ms.lease_renewals);
    rpc_cluster_uint(&rq->pk, "lease_lost", ms.lease_lost);
    rpc_cluster_uint(&rq->pk, "registrations", ms.registrations);
    rpc_cluster_uint(&rq->pk, "views", ms.views);
    rpc_cluster_uint(&rq->pk, "full_reads", ms.full_reads);
    rpc_cluster_uint(&rq->pk, "watch_rearms", ms.watch_rearms);
    rpc_cluster_uint(&rq->pk, "etcd_logins", ms.etcd_logins);
    mp_pack_cstr(&rq->pk, "nodes");
    msgpack_pack_array(&rq->pk, v != NULL ? v->n : 0);
    for (size_t i = 0; v != NULL && i < v->n; i++) {
        rpc_cluster_node(&rq->pk, &v->nodes[i]);
    }
    if (rq->nparams == 1) {
        mp_pack_cstr(&rq->pk, "owners");
        msgpack_pack_array(&rq->pk, nkeys);
        for (uint32_t k = 0; k < nkeys; k++) {
            const uint8_t *kp;
            uint32_t klen;
            size_t own[PLACE_R_MAX], n = 0;

            rpc_read_key(&rq->rd, &kp, &klen);
            if (v != NULL) {
                n = view_owners(v, kp, klen, ms.replicas, own);
            }
            msgpack_pack_array(&rq->pk, n);
            for (size_t j = 0; j < n; j++) {
                msgpack_pack_uint32(&rq->pk, (uint32_t)own[j]);
            }
        }
    }
    view_release(v);
    return 0;
}

int
rpc_cluster_drain(struct rpc_req *rq)
{
    struct member_stats ms;
    int rc = rpc_arity(rq, 0, 0);

    if (rc != 0) {
        return rc;
    }
    if (!rpc_shared_view(rq->ctx)) {
        rq->errmsg = "cluster_drain: only the admin tenant may drain the node";
        return KV_FORBIDDEN;
    }
    member_stats(&ms);
    if (!ms.in_pool) {
        rq->errmsg = "cluster_drain: this daemon is not in a pool (cluster_name is empty)";
        return KV_UNSUPPORTED;
    }
    member_drain();
    rpc_reply_head(rq);
    mp_pack_cstr(&rq->pk, "draining");
    return 0;
}
