/*
 * peer_rdma: a peer connection's queue pair (peer_rdma.h). The queue pair is made with one
 * work request of room (the CQ's size is spent per queue pair, and this side posts
 * nothing), connected with the info the peer answers, and destroyed whenever the
 * connection, or what it carried over RDMA, failed.
 */
#include "peer_rdma.h"

#include <stdio.h>

#include "kverr.h"
#include "mp.h"

int
peer_rdma_start(struct peer_rdma *r, struct rdma_cq *cq, uint8_t info[RDMA_QP_INFO_LEN])
{
    struct rdma_qp_info local;
    int rc;

    peer_rdma_stop(r, PEER_RDMA_NONE);
    rc = rdma_qp_create(cq, 1, &r->qp, &local);
    if (rc != 0) {
        r->qp = NULL;
        r->state = PEER_RDMA_OFF;
        return rc;
    }
    rdma_qp_info_encode(&local, info);
    r->state = PEER_RDMA_PENDING;
    return 0;
}

int
peer_rdma_answer(struct peer_rdma *r, int status, struct mp_reader *res, char *why, size_t len)
{
    struct rdma_qp_info remote;
    const uint8_t *p;
    const struct mp_hole *hole;
    uint64_t n;
    int rc;

    if (status != 0) {
        snprintf(why, len, "it refused rdma_connect: %s", kv_strerror(status));
        peer_rdma_stop(r, PEER_RDMA_OFF);
        return status;
    }
    if (r->qp == NULL || mp_read_bin_ref(res, &p, &n, &hole) != 0 || hole != NULL
        || rdma_qp_info_decode(p, (size_t)n, &remote) != 0) {
        snprintf(why, len, "its answer to rdma_connect is not queue-pair info");
        peer_rdma_stop(r, PEER_RDMA_OFF);
        return KV_PROTOCOL_ERROR;
    }
    rc = rdma_qp_connect(r->qp, &remote);
    if (rc != 0) {
        snprintf(why, len, "the queue pair could not be connected to it: %s",
                 rc < 0 ? "a verbs call failed" : kv_strerror(rc));
        peer_rdma_stop(r, PEER_RDMA_OFF);
        return rc < 0 ? KV_INTERNAL : rc;
    }
    r->state = PEER_RDMA_READY;
    return 0;
}

void
peer_rdma_stop(struct peer_rdma *r, enum peer_rdma_state to)
{
    rdma_qp_destroy(r->qp);         /* a peer's write after this fails there */
    r->qp = NULL;
    r->state = to;
}
