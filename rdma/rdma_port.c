/*
 * rdma_port: the data port (see rdma_port.h) over an rdma_ops table. It
 * decides how regions split into MRs, how a transfer splits into work
 * requests, how many may be outstanding, and turns completions back into one
 * outcome per caller operation. It must not include infiniband/verbs.h or
 * make any verbs call except through the table, so it builds and is tested
 * without libibverbs.
 *
 * Every work request is signaled and its wr_id points at the operation slot
 * (struct rdma_op) it belongs to; the slot points at its QP. A QP is freed
 * only once none of its work requests can complete any more: rdma_qp_destroy
 * drains them first, and should the device never flush them, keeps the QP's
 * memory (a "zombie") until its CQ is destroyed, so a late completion never
 * touches freed memory.
 */
#include "rdma_port.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kverr.h"

static const struct rdma_ops *rdma_chosen_ops;

const struct rdma_ops *
rdma_default_ops(void)
{
    return rdma_chosen_ops != NULL ? rdma_chosen_ops : rdma_verbs_ops();
}

void
rdma_use_ops(const struct rdma_ops *ops)
{
    rdma_chosen_ops = ops;
}

#define RDMA_MAX_MRS 65536
#define RDMA_MAX_WR_BYTES (1u << 30) /* a work request's length is 32 bits; stay well inside */
#define RDMA_REAP_BATCH 32
#define RDMA_DRAIN_NS 1000000000ll

struct rdma_dev {
    const struct rdma_ops *ops;
    struct rdma_ops_dev *h;
    struct rdma_ops_pd *pd;
    struct rdma_dev_attr attr;
    struct rdma_port_attr pattr;
    uint8_t port;
    uint8_t gid_index;
    uint8_t gid[RDMA_GID_LEN];
    char name[64];
};

struct rdma_region_mr {
    struct rdma_ops_mr *mr;
    uint32_t lkey;
    uint32_t rkey;
};

struct rdma_region {
    struct rdma_dev *dev;
    uint8_t *base;
    uint64_t len;
    unsigned shift;                 /* MR i covers offsets [i << shift, (i + 1) << shift) */
    int nmr;
    struct rdma_region_mr mr[];
};

struct rdma_cq {
    struct rdma_dev *dev;
    struct rdma_ops_chan *ch;
    struct rdma_ops_cq *h;
    int fd;
    uint32_t size;
    uint32_t reserved;              /* sum of its QPs' max_wr */
    int nqp;
    struct rdma_done *backlog;      /* finished, not yet handed out: [head, tail) */
    size_t head;
    size_t tail;
    size_t cap;
    struct rdma_qp *zombies;
};

/* One caller operation: one or more work requests. */
struct rdma_op {
    struct rdma_qp *qp;
    struct rdma_op *next_free;
    uint64_t wr_id;
    uint64_t len;
    uint32_t pieces;                /* work requests not completed yet */
    enum rdma_opcode opcode;
    enum rdma_wc_status wc;
};

struct rdma_qp {
    struct rdma_cq *cq;
    struct rdma_ops_qp *h;
    struct rdma_qp_info local;
    uint32_t max_wr;
    uint32_t outstanding;           /* work requests posted, completion not reaped */
    int connected;
    int failed;                     /* 0, or the KV_* code that failed it */
    int zombie;
    struct rdma_qp *next_zombie;
    struct rdma_op *free_ops;
    struct rdma_op op[];            /* max_wr slots: an op holds at least one work request */
};

/* ---- device ---- */

int
rdma_dev_open(const struct rdma_ops *ops, const char *device, uint8_t port, uint8_t gid_index,
              struct rdma_dev **out, char *why, size_t whylen)
{
    static const char *const state_name[] = {"DOWN", "INIT", "ARMED", "ACTIVE"};
    static const uint8_t zero[RDMA_GID_LEN];
    struct rdma_dev *dev;
    int rc;

    *out = NULL;
    if (whylen > 0) {
        why[0] = '\0';
    }
    dev = calloc(1, sizeof(*dev));
    if (dev == NULL) {
        snprintf(why, whylen, "out of memory");
        return -ENOMEM;
    }
    dev->ops = ops;
    dev->port = port;
    dev->gid_index = gid_index;
    rc = ops->open_device(device, dev->name, sizeof(dev->name), &dev->h, why, whylen);
    if (rc != 0) {
        goto fail;
    }
    rc = ops->query_device(dev->h, &dev->attr);
    if (rc != 0) {
        snprintf(why, whylen, "cannot query RDMA device %s: %s", dev->name, kv_strerror(rc));
        goto fail;
    }
    if (port == 0 || port > dev->attr.ports) {
        snprintf(why, whylen, "RDMA device %s has no port %u (its ports are 1..%u)", dev->name,
                 port, dev->attr.ports);
        rc = KV_NOT_FOUND;
        goto fail;
    }
    rc = ops->query_port(dev->h, port, &dev->pattr);
    if (rc != 0) {
        snprintf(why, whylen, "cannot query port %u of RDMA device %s: %s", port, dev->name,
                 kv_strerror(rc));
        goto fail;
    }
    if (dev->pattr.state != RDMA_PORT_ACTIVE) {
        snprintf(why, whylen, "port %u of RDMA device %s is %s, not ACTIVE (link down?)", port,
                 dev->name, state_name[dev->pattr.state]);
        rc = KV_UNAVAILABLE;
        goto fail;
    }
    rc = ops->query_gid(dev->h, port, gid_index, dev->gid);
    if (rc != 0 || (dev->pattr.lid == 0 && memcmp(dev->gid, zero, RDMA_GID_LEN) == 0)) {
        snprintf(why, whylen, "port %u of RDMA device %s has no GID at index %u%s", port,
                 dev->name, gid_index, rc == 0 ? " (the entry is empty: no address on RoCE?)" : "");
        rc = KV_NOT_FOUND;
        goto fail;
    }
    rc = ops->alloc_pd(dev->h, &dev->pd);
    if (rc != 0) {
        snprintf(why, whylen, "cannot allocate a protection domain on RDMA device %s: %s",
                 dev->name, kv_strerror(rc));
        goto fail;
    }
    *out = dev;
    return 0;

fail:
    rdma_dev_close(dev);
    return rc;
}

void
rdma_dev_close(struct rdma_dev *dev)
{
    if (dev == NULL) {
        return;
    }
    if (dev->pd != NULL) {
        (void)dev->ops->free_pd(dev->pd);
    }
    if (dev->h != NULL) {
        dev->ops->close_device(dev->h);
    }
    free(dev);
}

const char *
rdma_dev_name(const struct rdma_dev *dev)
{
    return dev->name;
}

/* ---- memory regions ---- */

int
rdma_region_register(struct rdma_dev *dev, void *base, uint64_t len, int access,
                     struct rdma_region **out)
{
    struct rdma_region *r;
    unsigned shift = 63;
    uint64_t nmr = 1;
    int rc = 0;

    *out = NULL;
    if (base == NULL || len == 0) {
        return KV_INVALID_ARGUMENT;
    }
    if (len > dev->attr.max_mr_size) {
        shift = 0;
        while (shift < 63 && (2ull << shift) <= dev->attr.max_mr_size) {
            shift++;
        }
        nmr = ((len - 1) >> shift) + 1;
        if (nmr > RDMA_MAX_MRS) {
            return KV_TOO_LARGE;
        }
    }
    r = calloc(1, sizeof(*r) + (size_t)nmr * sizeof(r->mr[0]));
    if (r == NULL) {
        return -ENOMEM;
    }
    r->dev = dev;
    r->base = base;
    r->len = len;
    r->shift = shift;
    for (r->nmr = 0; r->nmr < (int)nmr; r->nmr++) {
        uint64_t off = (uint64_t)r->nmr << shift;
        uint64_t n = nmr == 1 ? len : len - off < (1ull << shift) ? len - off : 1ull << shift;
        struct rdma_region_mr *m = &r->mr[r->nmr];

        rc = dev->ops->reg_mr(dev->pd, r->base + off, n, access, &m->mr, &m->lkey, &m->rkey);
        if (rc != 0) {
            rdma_region_deregister(r);
            return rc;
        }
    }
    *out = r;
    return 0;
}

void
rdma_region_deregister(struct rdma_region *r)
{
    if (r == NULL) {
        return;
    }
    for (int i = 0; i < r->nmr; i++) {
        (void)r->dev->ops->dereg_mr(r->mr[i].mr);
    }
    free(r);
}

/* rdma_region_off: the offset of [addr, addr+len) in r, or why it is not in r. */
static int
rdma_region_off(const struct rdma_region *r, const void *addr, uint64_t len, uint64_t *off)
{
    uintptr_t a = (uintptr_t)addr;
    uintptr_t b = (uintptr_t)r->base;

    if (len == 0) {
        return KV_INVALID_ARGUMENT;
    }
    if (a < b || a - b > r->len || len > r->len - (a - b)) {
        return KV_NOT_FOUND;
    }
    *off = a - b;
    return 0;
}

/*
 * rdma_region_piece: how much of `left` bytes from offset off fits in one
 * MR, at most `max`, and which MR that is. The one place that knows where
 * MR boundaries lie, for lookups and for splitting transfers alike.
 */
static uint64_t
rdma_region_piece(const struct rdma_region *r, uint64_t off, uint64_t left, uint64_t max,
                  const struct rdma_region_mr **mr)
{
    uint64_t i = off >> r->shift;
    uint64_t end = i + 1 == (uint64_t)r->nmr ? r->len : (i + 1) << r->shift;
    uint64_t n = end - off;

    *mr = &r->mr[i];
    n = n < left ? n : left;
    return n < max ? n : max;
}

int
rdma_region_lkey(const struct rdma_region *r, const void *addr, uint64_t len, uint32_t *lkey)
{
    const struct rdma_region_mr *mr;
    uint64_t off;
    int rc = rdma_region_off(r, addr, len, &off);

    if (rc != 0) {
        return rc;
    }
    if (rdma_region_piece(r, off, len, UINT64_MAX, &mr) != len) {
        return KV_INVALID_ARGUMENT;
    }
    *lkey = mr->lkey;
    return 0;
}

int
rdma_region_segs(const struct rdma_region *r, const void *addr, uint64_t len,
                 struct rdma_seg *segs, int max, int *n)
{
    uint64_t off;
    int rc = rdma_region_off(r, addr, len, &off);

    *n = 0;
    if (rc != 0) {
        return rc;
    }
    while (len > 0) {
        const struct rdma_region_mr *mr;
        uint64_t piece = rdma_region_piece(r, off, len, UINT64_MAX, &mr);

        if (*n < max) {
            segs[*n] = (struct rdma_seg){(uintptr_t)r->base + off, piece, mr->rkey};
        }
        (*n)++;
        off += piece;
        len -= piece;
    }
    return *n <= max ? 0 : KV_NO_SPACE;
}

/* ---- completion queues ---- */

int
rdma_cq_create(struct rdma_dev *dev, uint32_t size, struct rdma_cq **out)
{
    const struct rdma_ops *ops = dev->ops;
    struct rdma_cq *cq;
    int rc;

    *out = NULL;
    if (size == 0 || size > dev->attr.max_cqe) {
        return KV_INVALID_ARGUMENT;
    }
    cq = calloc(1, sizeof(*cq));
    if (cq == NULL) {
        return -ENOMEM;
    }
    cq->dev = dev;
    cq->size = size;
    cq->fd = -1;
    rc = ops->create_channel(dev->h, &cq->ch, &cq->fd);
    if (rc == 0) {
        rc = ops->create_cq(dev->h, size, cq->ch, &cq->h);
    }
    if (rc == 0) {
        rc = ops->req_notify_cq(cq->h);
    }
    if (rc != 0) {
        rdma_cq_destroy(cq);
        return rc;
    }
    *out = cq;
    return 0;
}

void
rdma_cq_destroy(struct rdma_cq *cq)
{
    if (cq == NULL) {
        return;
    }
    if (cq->nqp != 0) {
        abort();                    /* a live QP would complete into freed memory */
    }
    while (cq->zombies != NULL) {
        struct rdma_qp *qp = cq->zombies;

        cq->zombies = qp->next_zombie;
        free(qp);
    }
    if (cq->h != NULL) {
        (void)cq->dev->ops->destroy_cq(cq->h);
    }
    if (cq->ch != NULL) {
        (void)cq->dev->ops->destroy_channel(cq->ch);
    }
    free(cq->backlog);
    free(cq);
}

int
rdma_cq_fd(const struct rdma_cq *cq)
{
    return cq->fd;
}

int
rdma_wc_status_code(enum rdma_wc_status wc)
{
    switch (wc) {
    case RDMA_WC_SUCCESS:
        return 0;
    case RDMA_WC_REM_ACCESS_ERR:
        return KV_FORBIDDEN;
    case RDMA_WC_RETRY_EXC_ERR:
        return KV_TIMEOUT;
    case RDMA_WC_FLUSH_ERR:
        return KV_UNAVAILABLE;
    case RDMA_WC_LOC_PROT_ERR:
    case RDMA_WC_LOC_LEN_ERR:
        return KV_INVALID_ARGUMENT;
    default:
        return KV_INTERNAL;
    }
}

const char *
rdma_wc_status_str(enum rdma_wc_status wc)
{
    static const char *const names[] = {
        "SUCCESS",    "LOC_PROT_ERR",  "LOC_LEN_ERR", "REM_ACCESS_ERR",
        "REM_OP_ERR", "RETRY_EXC_ERR", "FLUSH_ERR",   "OTHER_ERR",
    };

    return (unsigned)wc < sizeof(names) / sizeof(names[0]) ? names[wc] : "OTHER_ERR";
}

/* rdma_cq_push: queue a done for the next rdma_cq_poll. */
static int
rdma_cq_push(struct rdma_cq *cq, const struct rdma_op *op)
{
    if (cq->tail == cq->cap) {
        if (cq->head > 0) {
            memmove(cq->backlog, cq->backlog + cq->head,
                    (cq->tail - cq->head) * sizeof(*cq->backlog));
            cq->tail -= cq->head;
            cq->head = 0;
        } else {
            size_t cap = cq->cap > 0 ? cq->cap * 2 : 64;
            struct rdma_done *b = realloc(cq->backlog, cap * sizeof(*b));

            if (b == NULL) {
                return -ENOMEM;
            }
            cq->backlog = b;
            cq->cap = cap;
        }
    }
    cq->backlog[cq->tail++] = (struct rdma_done){
        .wr_id = op->wr_id,
        .status = rdma_wc_status_code(op->wc),
        .wc = op->wc,
        .opcode = op->opcode,
        .len = op->wc == RDMA_WC_SUCCESS ? op->len : 0,
    };
    return 0;
}

/* rdma_op_finish: the op's last work request completed (or never will): report it, free it. */
static int
rdma_op_finish(struct rdma_op *op)
{
    struct rdma_qp *qp = op->qp;
    int rc = rdma_cq_push(qp->cq, op);

    op->next_free = qp->free_ops;
    qp->free_ops = op;
    return rc;
}

/* rdma_cq_reap: move up to one batch of completions from the device into the backlog. */
static int
rdma_cq_reap(struct rdma_cq *cq)
{
    struct rdma_wc wc[RDMA_REAP_BATCH];
    int n = cq->dev->ops->poll_cq(cq->h, RDMA_REAP_BATCH, wc);

    for (int i = 0; i < n; i++) {
        struct rdma_op *op = (struct rdma_op *)(uintptr_t)wc[i].wr_id;
        struct rdma_qp *qp = op->qp;

        qp->outstanding--;
        if (wc[i].status != RDMA_WC_SUCCESS) {
            if (op->wc == RDMA_WC_SUCCESS) {
                op->wc = wc[i].status;
            }
            if (qp->failed == 0) {
                qp->failed = rdma_wc_status_code(wc[i].status);
            }
        }
        if (--op->pieces == 0 && !qp->zombie) {
            int rc = rdma_op_finish(op);

            if (rc != 0) {
                return rc;
            }
        }
    }
    return n;
}

int
rdma_cq_poll(struct rdma_cq *cq, struct rdma_done *done, int max)
{
    const struct rdma_ops *ops = cq->dev->ops;
    struct rdma_ops_cq *evcq;
    unsigned events = 0;
    int armed = 0;
    int n = 0;

    while (ops->get_cq_event(cq->ch, &evcq) == 0) {
        events++;
    }
    if (events > 0) {
        ops->ack_cq_events(cq->h, events);
    }
    for (;;) {
        int rc;

        while (n < max && cq->head < cq->tail) {
            done[n++] = cq->backlog[cq->head++];
        }
        if (n == max) {
            return n;
        }
        rc = rdma_cq_reap(cq);
        if (rc < 0) {
            return rc;
        }
        if (rc > 0) {
            continue;
        }
        if (armed) {
            return n;
        }
        /* Empty: arm, then look once more for what slipped in before the arming. */
        rc = ops->req_notify_cq(cq->h);
        if (rc != 0) {
            return rc;
        }
        armed = 1;
    }
}

/* ---- queue pairs ---- */

int
rdma_qp_create(struct rdma_cq *cq, uint32_t max_wr, struct rdma_qp **out,
               struct rdma_qp_info *local)
{
    struct rdma_dev *dev = cq->dev;
    struct rdma_qp *qp;
    struct timespec ts;
    int rc;

    *out = NULL;
    if (max_wr == 0 || max_wr > dev->attr.max_qp_wr) {
        return KV_INVALID_ARGUMENT;
    }
    if (max_wr > cq->size - cq->reserved) {
        return KV_NO_SPACE;
    }
    qp = calloc(1, sizeof(*qp) + (size_t)max_wr * sizeof(qp->op[0]));
    if (qp == NULL) {
        return -ENOMEM;
    }
    qp->cq = cq;
    qp->max_wr = max_wr;
    for (uint32_t i = 0; i < max_wr; i++) {
        qp->op[i].qp = qp;
        qp->op[i].next_free = i + 1 < max_wr ? &qp->op[i + 1] : NULL;
    }
    qp->free_ops = &qp->op[0];
    rc = dev->ops->create_qp(dev->pd, cq->h, max_wr, &qp->h, &qp->local.qpn);
    if (rc != 0) {
        free(qp);
        return rc;
    }
    cq->reserved += max_wr;
    cq->nqp++;
    rc = dev->ops->qp_init(qp->h, dev->port);
    if (rc != 0) {
        rdma_qp_destroy(qp);
        return rc;
    }
    /* The PSN only has to differ between incarnations, so stale packets miss. */
    clock_gettime(CLOCK_MONOTONIC, &ts);
    qp->local.psn = ((uint32_t)ts.tv_nsec ^ (qp->local.qpn * 2654435761u)) & 0xffffff;
    qp->local.lid = dev->pattr.lid;
    qp->local.mtu = dev->pattr.mtu;
    memcpy(qp->local.gid, dev->gid, RDMA_GID_LEN);
    *local = qp->local;
    *out = qp;
    return 0;
}

static int
rdma_mtu_ok(uint32_t mtu)
{
    return mtu >= 256 && mtu <= 4096 && (mtu & (mtu - 1)) == 0;
}

int
rdma_qp_connect(struct rdma_qp *qp, const struct rdma_qp_info *remote)
{
    struct rdma_dev *dev = qp->cq->dev;
    struct rdma_ops_path path;
    int rc;

    if (qp->connected || qp->failed || remote->qpn > 0xffffff || remote->psn > 0xffffff
        || !rdma_mtu_ok(remote->mtu)) {
        return KV_INVALID_ARGUMENT;
    }
    memset(&path, 0, sizeof(path));
    path.qpn = remote->qpn;
    path.psn = remote->psn;
    path.lid = remote->lid;
    memcpy(path.gid, remote->gid, RDMA_GID_LEN);
    path.use_grh = remote->lid == 0 || qp->local.lid == 0;
    path.port = dev->port;
    path.gid_index = dev->gid_index;
    path.mtu = remote->mtu < qp->local.mtu ? remote->mtu : qp->local.mtu;
    path.max_rd_atomic = dev->attr.max_rd_atomic < 16 ? dev->attr.max_rd_atomic : 16;
    rc = dev->ops->qp_rtr(qp->h, &path);
    if (rc == 0) {
        rc = dev->ops->qp_rts(qp->h, qp->local.psn, path.max_rd_atomic);
    }
    if (rc != 0) {
        qp->failed = KV_UNAVAILABLE;
        return rc;
    }
    qp->connected = 1;
    return 0;
}

int
rdma_qp_post(struct rdma_qp *qp, enum rdma_opcode opcode, const struct rdma_region *local,
             void *addr, uint64_t len, uint64_t raddr, uint32_t rkey, uint64_t wr_id)
{
    const struct rdma_ops *ops = qp->cq->dev->ops;
    uint64_t max = qp->cq->dev->pattr.max_msg;
    uint64_t off;
    uint64_t pieces = 0;
    struct rdma_op *op;
    int rc;

    if (qp->failed) {
        return KV_UNAVAILABLE;
    }
    if (!qp->connected || raddr + len < raddr) {
        return KV_INVALID_ARGUMENT;
    }
    rc = rdma_region_off(local, addr, len, &off);
    if (rc != 0) {
        return rc;
    }
    if (max == 0 || max > RDMA_MAX_WR_BYTES) {
        max = RDMA_MAX_WR_BYTES;
    }
    for (uint64_t o = off, left = len; left > 0; pieces++) {
        const struct rdma_region_mr *mr;
        uint64_t n = rdma_region_piece(local, o, left, max, &mr);

        o += n;
        left -= n;
    }
    if (pieces > qp->max_wr) {
        return KV_TOO_LARGE;
    }
    if (pieces > qp->max_wr - qp->outstanding) {
        return -EAGAIN;
    }
    op = qp->free_ops;              /* ops <= work requests <= max_wr: a slot is free */
    qp->free_ops = op->next_free;
    *op = (struct rdma_op){.qp = qp, .wr_id = wr_id, .len = len, .opcode = opcode};
    while (len > 0) {
        const struct rdma_region_mr *mr;
        uint64_t n = rdma_region_piece(local, off, len, max, &mr);
        struct rdma_ops_wr wr = {
            .wr_id = (uintptr_t)op,
            .opcode = opcode,
            .addr = local->base + off,
            .len = (uint32_t)n,
            .lkey = mr->lkey,
            .raddr = raddr,
            .rkey = rkey,
        };

        rc = ops->post(qp->h, &wr);
        if (rc != 0) {
            break;
        }
        op->pieces++;
        qp->outstanding++;
        off += n;
        raddr += n;
        len -= n;
    }
    if (rc != 0) {
        /*
         * The device refused a work request the caps said would fit: the QP
         * is unusable. With pieces already posted the op stays and its done
         * reports the failure once they flush; with none, the caller hears now.
         */
        qp->failed = KV_INTERNAL;
        (void)ops->qp_error(qp->h);
        if (op->pieces == 0) {
            op->next_free = qp->free_ops;
            qp->free_ops = op;
            return rc;
        }
        op->wc = RDMA_WC_OTHER_ERR;
    }
    return 0;
}

int
rdma_qp_failed(struct rdma_qp *qp)
{
    if (qp->failed == 0 && qp->cq->dev->ops->qp_state(qp->h) == RDMA_QPS_ERR) {
        qp->failed = KV_UNAVAILABLE;
    }
    return qp->failed;
}

void
rdma_qp_destroy(struct rdma_qp *qp)
{
    struct rdma_cq *cq;
    struct timespec start;
    struct timespec now;

    if (qp == NULL) {
        return;
    }
    cq = qp->cq;
    if (qp->h != NULL) {
        (void)cq->dev->ops->qp_error(qp->h);
    }
    clock_gettime(CLOCK_MONOTONIC, &start);
    while (qp->outstanding > 0) {
        if (rdma_cq_reap(cq) < 0) {
            break;
        }
        clock_gettime(CLOCK_MONOTONIC, &now);
        if ((now.tv_sec - start.tv_sec) * 1000000000ll + now.tv_nsec - start.tv_nsec
            > RDMA_DRAIN_NS) {
            break;
        }
    }
    if (qp->h != NULL) {
        (void)cq->dev->ops->destroy_qp(qp->h);
    }
    cq->nqp--;
    if (qp->outstanding == 0) {
        cq->reserved -= qp->max_wr;
        free(qp);
        return;
    }
    /* Never flushed: report its ops as flushed and keep its memory for stragglers. */
    for (uint32_t i = 0; i < qp->max_wr; i++) {
        if (qp->op[i].pieces > 0) {
            qp->op[i].wc = qp->op[i].wc != RDMA_WC_SUCCESS ? qp->op[i].wc : RDMA_WC_FLUSH_ERR;
            (void)rdma_cq_push(cq, &qp->op[i]);
        }
    }
    qp->zombie = 1;
    qp->next_zombie = cq->zombies;
    cq->zombies = qp;
}

/* ---- connection info ---- */

static void
rdma_put_be(uint8_t *p, uint64_t v, int n)
{
    for (int i = n - 1; i >= 0; i--, v >>= 8) {
        p[i] = (uint8_t)v;
    }
}

static uint32_t
rdma_get_be(const uint8_t *p, int n)
{
    uint32_t v = 0;

    for (int i = 0; i < n; i++) {
        v = v << 8 | p[i];
    }
    return v;
}

void
rdma_qp_info_encode(const struct rdma_qp_info *info, uint8_t out[RDMA_QP_INFO_LEN])
{
    rdma_put_be(out, info->qpn, 4);
    rdma_put_be(out + 4, info->psn, 4);
    rdma_put_be(out + 8, info->lid, 2);
    memcpy(out + 10, info->gid, RDMA_GID_LEN);
    rdma_put_be(out + 26, info->mtu, 4);
}

int
rdma_qp_info_decode(const uint8_t *buf, size_t len, struct rdma_qp_info *out)
{
    struct rdma_qp_info info;

    if (len != RDMA_QP_INFO_LEN) {
        return KV_INVALID_ARGUMENT;
    }
    memset(&info, 0, sizeof(info));
    info.qpn = rdma_get_be(buf, 4);
    info.psn = rdma_get_be(buf + 4, 4);
    info.lid = (uint16_t)rdma_get_be(buf + 8, 2);
    memcpy(info.gid, buf + 10, RDMA_GID_LEN);
    info.mtu = rdma_get_be(buf + 26, 4);
    if (info.qpn > 0xffffff || info.psn > 0xffffff || !rdma_mtu_ok(info.mtu)) {
        return KV_INVALID_ARGUMENT;
    }
    *out = info;
    return 0;
}
