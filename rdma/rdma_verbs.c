/*
 * rdma_verbs: the libibverbs build of the rdma_ops table
 * (rdma_ops.h), the only file that includes infiniband/verbs.h. Device
 * discovery reads the kernel's /sys/class/infiniband through
 * ibv_get_device_list; a machine without RDMA hardware has an empty list.
 * The table's opaque handles are the ibv objects themselves, cast; each
 * function translates kvstash's types to verbs' and back and decides
 * nothing (rdma_port.c does).
 */
#include "rdma_ops.h"

#include <errno.h>
#include <fcntl.h>
#include <infiniband/verbs.h>
#include <stdio.h>
#include <string.h>

#include "kverr.h"

/*
 * verbs_pick: the device list and the index of `device` ("" = the first) in
 * it; the caller frees the list. KV_NOT_FOUND, the list freed and the reason
 * in why, when there is no such device.
 */
static int
verbs_pick(const char *device, struct ibv_device ***out, int *index, char *why, size_t whylen)
{
    struct ibv_device **list;
    char seen[256] = "";
    size_t used = 0;
    int n = 0;

    list = ibv_get_device_list(&n);
    if (list == NULL || n == 0) {
        snprintf(why, whylen, "no RDMA device found (ibv_get_device_list lists none; "
                              "/sys/class/infiniband is empty or absent)");
        if (list != NULL) {
            ibv_free_device_list(list);
        }
        return KV_NOT_FOUND;
    }
    for (int i = 0; i < n; i++) {
        const char *dn = ibv_get_device_name(list[i]);

        if (dn == NULL) {
            continue;
        }
        if (device[0] == '\0' || strcmp(device, dn) == 0) {
            *out = list;
            *index = i;
            return 0;
        }
        if (used < sizeof(seen)) {
            used += (size_t)snprintf(seen + used, sizeof(seen) - used, "%s%s",
                                     used > 0 ? ", " : "", dn);
        }
    }
    ibv_free_device_list(list);
    snprintf(why, whylen, "no RDMA device called '%s' (devices: %s)", device, seen);
    return KV_NOT_FOUND;
}

/* ---- the rdma_ops table ---- */

/* verbs_rc: verbs calls return an errno, or -1 with errno set; make it -errno. */
static int
verbs_rc(int rc)
{
    if (rc > 0) {
        return -rc;
    }
    if (rc < 0) {
        return errno > 0 ? -errno : -EIO;
    }
    return 0;
}

#define VERBS_NULL_RC() (errno > 0 ? -errno : -ENOMEM)

static int
verbs_open_device(const char *want, char *name, size_t namelen, struct rdma_ops_dev **out,
                  char *why, size_t whylen)
{
    struct ibv_device **list;
    struct ibv_context *ctx;
    int i;
    int rc;

    *out = NULL;
    rc = verbs_pick(want, &list, &i, why, whylen);
    if (rc != 0) {
        return rc;
    }
    snprintf(name, namelen, "%s", ibv_get_device_name(list[i]));
    ctx = ibv_open_device(list[i]);
    rc = ctx == NULL ? VERBS_NULL_RC() : 0;
    ibv_free_device_list(list);
    if (rc != 0) {
        snprintf(why, whylen, "cannot open RDMA device %s: %s", name, strerror(-rc));
        return rc;
    }
    *out = (struct rdma_ops_dev *)ctx;
    return 0;
}

static void
verbs_close_device(struct rdma_ops_dev *dev)
{
    (void)ibv_close_device((struct ibv_context *)dev);
}

static int
verbs_query_device(struct rdma_ops_dev *dev, struct rdma_dev_attr *out)
{
    struct ibv_device_attr a;
    int rc = verbs_rc(ibv_query_device((struct ibv_context *)dev, &a));

    if (rc == 0) {
        int rd = a.max_qp_rd_atom < a.max_qp_init_rd_atom ? a.max_qp_rd_atom
                                                           : a.max_qp_init_rd_atom;

        out->max_mr_size = a.max_mr_size;
        out->max_qp_wr = a.max_qp_wr > 0 ? (uint32_t)a.max_qp_wr : 0;
        out->max_cqe = a.max_cqe > 0 ? (uint32_t)a.max_cqe : 0;
        out->max_rd_atomic = (uint8_t)(rd < 0 ? 0 : rd > 255 ? 255 : rd);
        out->ports = a.phys_port_cnt;
    }
    return rc;
}

static int
verbs_query_port(struct rdma_ops_dev *dev, uint8_t port, struct rdma_port_attr *out)
{
    struct ibv_port_attr a;
    int rc = verbs_rc(ibv_query_port((struct ibv_context *)dev, port, &a));

    if (rc == 0) {
        switch (a.state) {
        case IBV_PORT_INIT:
            out->state = RDMA_PORT_INIT;
            break;
        case IBV_PORT_ARMED:
            out->state = RDMA_PORT_ARMED;
            break;
        case IBV_PORT_ACTIVE:
        case IBV_PORT_ACTIVE_DEFER:
            out->state = RDMA_PORT_ACTIVE;
            break;
        default:
            out->state = RDMA_PORT_DOWN;
            break;
        }
        out->lid = a.lid;
        out->mtu = 128u << a.active_mtu; /* IBV_MTU_256 is 1 */
        out->max_msg = a.max_msg_sz;
    }
    return rc;
}

static int
verbs_query_gid(struct rdma_ops_dev *dev, uint8_t port, uint8_t index, uint8_t gid[RDMA_GID_LEN])
{
    union ibv_gid g;
    int rc = verbs_rc(ibv_query_gid((struct ibv_context *)dev, port, index, &g));

    if (rc == 0) {
        memcpy(gid, g.raw, RDMA_GID_LEN);
    }
    return rc;
}

static int
verbs_alloc_pd(struct rdma_ops_dev *dev, struct rdma_ops_pd **out)
{
    struct ibv_pd *pd = ibv_alloc_pd((struct ibv_context *)dev);

    *out = (struct rdma_ops_pd *)pd;
    return pd != NULL ? 0 : VERBS_NULL_RC();
}

static int
verbs_free_pd(struct rdma_ops_pd *pd)
{
    return verbs_rc(ibv_dealloc_pd((struct ibv_pd *)pd));
}

static int
verbs_reg_mr(struct rdma_ops_pd *pd, void *addr, uint64_t len, int access,
             struct rdma_ops_mr **out, uint32_t *lkey, uint32_t *rkey)
{
    int flags = ((access & RDMA_ACCESS_LOCAL_WRITE) ? IBV_ACCESS_LOCAL_WRITE : 0)
                | ((access & RDMA_ACCESS_REMOTE_READ) ? IBV_ACCESS_REMOTE_READ : 0)
                | ((access & RDMA_ACCESS_REMOTE_WRITE) ? IBV_ACCESS_REMOTE_WRITE : 0);
    struct ibv_mr *mr = ibv_reg_mr((struct ibv_pd *)pd, addr, (size_t)len, flags);

    *out = (struct rdma_ops_mr *)mr;
    if (mr == NULL) {
        return VERBS_NULL_RC();
    }
    *lkey = mr->lkey;
    *rkey = mr->rkey;
    return 0;
}

static int
verbs_dereg_mr(struct rdma_ops_mr *mr)
{
    return verbs_rc(ibv_dereg_mr((struct ibv_mr *)mr));
}

static int
verbs_create_channel(struct rdma_ops_dev *dev, struct rdma_ops_chan **out, int *fd)
{
    struct ibv_comp_channel *ch = ibv_create_comp_channel((struct ibv_context *)dev);
    int flags;

    *out = NULL;
    if (ch == NULL) {
        return VERBS_NULL_RC();
    }
    /* Nonblocking, so get_cq_event says EAGAIN instead of stalling the event loop. */
    flags = fcntl(ch->fd, F_GETFL);
    if (flags < 0 || fcntl(ch->fd, F_SETFL, flags | O_NONBLOCK) < 0) {
        int rc = -errno;

        (void)ibv_destroy_comp_channel(ch);
        return rc;
    }
    *fd = ch->fd;
    *out = (struct rdma_ops_chan *)ch;
    return 0;
}

static int
verbs_destroy_channel(struct rdma_ops_chan *ch)
{
    return verbs_rc(ibv_destroy_comp_channel((struct ibv_comp_channel *)ch));
}

static int
verbs_create_cq(struct rdma_ops_dev *dev, uint32_t cqe, struct rdma_ops_chan *ch,
                struct rdma_ops_cq **out)
{
    struct ibv_cq *cq = ibv_create_cq((struct ibv_context *)dev, (int)cqe, NULL,
                                      (struct ibv_comp_channel *)ch, 0);

    *out = (struct rdma_ops_cq *)cq;
    return cq != NULL ? 0 : VERBS_NULL_RC();
}

static int
verbs_destroy_cq(struct rdma_ops_cq *cq)
{
    return verbs_rc(ibv_destroy_cq((struct ibv_cq *)cq));
}

static int
verbs_req_notify_cq(struct rdma_ops_cq *cq)
{
    return verbs_rc(ibv_req_notify_cq((struct ibv_cq *)cq, 0));
}

static int
verbs_get_cq_event(struct rdma_ops_chan *ch, struct rdma_ops_cq **out)
{
    struct ibv_cq *cq;
    void *ctx;

    if (ibv_get_cq_event((struct ibv_comp_channel *)ch, &cq, &ctx) != 0) {
        return errno > 0 ? -errno : -EAGAIN;
    }
    *out = (struct rdma_ops_cq *)cq;
    return 0;
}

static void
verbs_ack_cq_events(struct rdma_ops_cq *cq, unsigned n)
{
    ibv_ack_cq_events((struct ibv_cq *)cq, n);
}

static enum rdma_wc_status
verbs_wc_status(enum ibv_wc_status s)
{
    switch (s) {
    case IBV_WC_SUCCESS:
        return RDMA_WC_SUCCESS;
    case IBV_WC_LOC_PROT_ERR:
        return RDMA_WC_LOC_PROT_ERR;
    case IBV_WC_LOC_LEN_ERR:
        return RDMA_WC_LOC_LEN_ERR;
    case IBV_WC_REM_ACCESS_ERR:
        return RDMA_WC_REM_ACCESS_ERR;
    case IBV_WC_REM_OP_ERR:
        return RDMA_WC_REM_OP_ERR;
    case IBV_WC_RETRY_EXC_ERR:
    case IBV_WC_RNR_RETRY_EXC_ERR:
        return RDMA_WC_RETRY_EXC_ERR;
    case IBV_WC_WR_FLUSH_ERR:
        return RDMA_WC_FLUSH_ERR;
    default:
        return RDMA_WC_OTHER_ERR;
    }
}

static int
verbs_poll_cq(struct rdma_ops_cq *cq, int n, struct rdma_wc *wc)
{
    struct ibv_wc w[32];
    int got = ibv_poll_cq((struct ibv_cq *)cq, n < 32 ? n : 32, w);

    if (got < 0) {
        return -EIO;
    }
    for (int i = 0; i < got; i++) {
        wc[i].wr_id = w[i].wr_id;
        wc[i].status = verbs_wc_status(w[i].status);
        wc[i].opcode = w[i].opcode == IBV_WC_RDMA_READ ? RDMA_OP_READ : RDMA_OP_WRITE;
        wc[i].byte_len = w[i].byte_len;
    }
    return got;
}

static int
verbs_create_qp(struct rdma_ops_pd *pd, struct rdma_ops_cq *cq, uint32_t max_send_wr,
                struct rdma_ops_qp **out, uint32_t *qpn)
{
    struct ibv_qp_init_attr init = {
        .send_cq = (struct ibv_cq *)cq,
        .recv_cq = (struct ibv_cq *)cq,
        /* One-sided only: no receive is ever posted, but some drivers refuse a 0-deep RQ. */
        .cap = {.max_send_wr = max_send_wr, .max_recv_wr = 1, .max_send_sge = 1,
                .max_recv_sge = 1},
        .qp_type = IBV_QPT_RC,
    };
    struct ibv_qp *qp = ibv_create_qp((struct ibv_pd *)pd, &init);

    *out = (struct rdma_ops_qp *)qp;
    if (qp == NULL) {
        return VERBS_NULL_RC();
    }
    *qpn = qp->qp_num;
    return 0;
}

static int
verbs_destroy_qp(struct rdma_ops_qp *qp)
{
    return verbs_rc(ibv_destroy_qp((struct ibv_qp *)qp));
}

static int
verbs_qp_init(struct rdma_ops_qp *qp, uint8_t port)
{
    struct ibv_qp_attr a = {
        .qp_state = IBV_QPS_INIT,
        .pkey_index = 0,
        .port_num = port,
        .qp_access_flags = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ
                           | IBV_ACCESS_REMOTE_WRITE,
    };

    return verbs_rc(ibv_modify_qp((struct ibv_qp *)qp, &a,
                                  IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT
                                      | IBV_QP_ACCESS_FLAGS));
}

static int
verbs_qp_rtr(struct rdma_ops_qp *qp, const struct rdma_ops_path *p)
{
    struct ibv_qp_attr a = {
        .qp_state = IBV_QPS_RTR,
        .path_mtu = (enum ibv_mtu)(__builtin_ctz(p->mtu) - 7), /* 256 -> IBV_MTU_256 (1) */
        .dest_qp_num = p->qpn,
        .rq_psn = p->psn,
        .max_dest_rd_atomic = p->max_rd_atomic,
        .min_rnr_timer = 12,
        .ah_attr = {.dlid = p->lid, .port_num = p->port, .is_global = p->use_grh != 0},
    };

    if (p->use_grh) {
        memcpy(a.ah_attr.grh.dgid.raw, p->gid, RDMA_GID_LEN);
        a.ah_attr.grh.sgid_index = p->gid_index;
        a.ah_attr.grh.hop_limit = 64;
    }
    return verbs_rc(ibv_modify_qp((struct ibv_qp *)qp, &a,
                                  IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN
                                      | IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC
                                      | IBV_QP_MIN_RNR_TIMER));
}

static int
verbs_qp_rts(struct rdma_ops_qp *qp, uint32_t psn, uint8_t max_rd_atomic)
{
    struct ibv_qp_attr a = {
        .qp_state = IBV_QPS_RTS,
        .timeout = 14,              /* 4.096 us * 2^14 = 67 ms per try */
        .retry_cnt = 7,
        .rnr_retry = 7,
        .sq_psn = psn,
        .max_rd_atomic = max_rd_atomic,
    };

    return verbs_rc(ibv_modify_qp((struct ibv_qp *)qp, &a,
                                  IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT
                                      | IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN
                                      | IBV_QP_MAX_QP_RD_ATOMIC));
}

static int
verbs_qp_error(struct rdma_ops_qp *qp)
{
    struct ibv_qp_attr a = {.qp_state = IBV_QPS_ERR};

    return verbs_rc(ibv_modify_qp((struct ibv_qp *)qp, &a, IBV_QP_STATE));
}

static int
verbs_qp_state(struct rdma_ops_qp *qp)
{
    struct ibv_qp_attr a;
    struct ibv_qp_init_attr init;
    int rc = verbs_rc(ibv_query_qp((struct ibv_qp *)qp, &a, IBV_QP_STATE, &init));

    if (rc != 0) {
        return rc;
    }
    switch (a.qp_state) {
    case IBV_QPS_RESET:
        return RDMA_QPS_RESET;
    case IBV_QPS_INIT:
        return RDMA_QPS_INIT;
    case IBV_QPS_RTR:
        return RDMA_QPS_RTR;
    case IBV_QPS_RTS:
    case IBV_QPS_SQD:
        return RDMA_QPS_RTS;
    default:
        return RDMA_QPS_ERR;
    }
}

static int
verbs_post(struct rdma_ops_qp *qp, const struct rdma_ops_wr *wr)
{
    struct ibv_sge sge = {.addr = (uintptr_t)wr->addr, .length = wr->len, .lkey = wr->lkey};
    struct ibv_send_wr w = {
        .wr_id = wr->wr_id,
        .sg_list = &sge,
        .num_sge = 1,
        .opcode = wr->opcode == RDMA_OP_READ ? IBV_WR_RDMA_READ : IBV_WR_RDMA_WRITE,
        .send_flags = IBV_SEND_SIGNALED,
        .wr.rdma = {.remote_addr = wr->raddr, .rkey = wr->rkey},
    };
    struct ibv_send_wr *bad;

    return verbs_rc(ibv_post_send((struct ibv_qp *)qp, &w, &bad));
}

static const struct rdma_ops verbs_ops = {
    .name = "verbs",
    .open_device = verbs_open_device,
    .close_device = verbs_close_device,
    .query_device = verbs_query_device,
    .query_port = verbs_query_port,
    .query_gid = verbs_query_gid,
    .alloc_pd = verbs_alloc_pd,
    .free_pd = verbs_free_pd,
    .reg_mr = verbs_reg_mr,
    .dereg_mr = verbs_dereg_mr,
    .create_channel = verbs_create_channel,
    .destroy_channel = verbs_destroy_channel,
    .create_cq = verbs_create_cq,
    .destroy_cq = verbs_destroy_cq,
    .req_notify_cq = verbs_req_notify_cq,
    .get_cq_event = verbs_get_cq_event,
    .ack_cq_events = verbs_ack_cq_events,
    .poll_cq = verbs_poll_cq,
    .create_qp = verbs_create_qp,
    .destroy_qp = verbs_destroy_qp,
    .qp_init = verbs_qp_init,
    .qp_rtr = verbs_qp_rtr,
    .qp_rts = verbs_qp_rts,
    .qp_error = verbs_qp_error,
    .qp_state = verbs_qp_state,
    .post = verbs_post,
};

const struct rdma_ops *
rdma_verbs_ops(void)
{
    return &verbs_ops;
}
