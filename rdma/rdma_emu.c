/*
 * rdma_emu: the loopback emulation of rdma_ops (see rdma_emu.h for what it
 * checks). It owns one process-global fabric: the MRs (keyed by their key;
 * lkey and rkey are the same number, as on most hardware) and the QPs (keyed
 * by qpn), both in plain lists since tests make few of them. Keys and qpns
 * are never reused within a process, so a stale rkey or a vanished peer
 * always misses. It must stay free of ibv types and of anything the data
 * port decides (splitting, caps, connection state).
 */
#include "rdma_emu.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include "kverr.h"
#include "rdma_ops.h"

#define EMU_LID 1
#define EMU_MTU 4096
#define EMU_MAX_MSG (1u << 30)
#define EMU_MAX_QP_WR 16384
#define EMU_MAX_CQE (1u << 22)
#define EMU_MAX_RD_ATOMIC 16

static const uint8_t emu_gid[RDMA_GID_LEN] = {0xfe, 0x80, [15] = 1};

struct rdma_ops_dev {
    char name[16];
    int users;                      /* PDs, channels and CQs on it */
};

struct rdma_ops_pd {
    struct rdma_ops_dev *dev;
    int users;                      /* MRs and QPs in it */
};

struct rdma_ops_mr {
    struct rdma_ops_mr *next;
    struct rdma_ops_pd *pd;
    uint8_t *addr;
    uint64_t len;
    uint32_t key;
    int access;
};

struct rdma_ops_chan {
    struct rdma_ops_dev *dev;
    int fd;                         /* eventfd: nonzero while an event is queued */
    int users;                      /* CQs bound to it */
    struct rdma_ops_cq *head;       /* CQs with events not yet taken, oldest first */
    struct rdma_ops_cq *tail;
};

struct emu_cqe {
    struct rdma_wc wc;
    struct rdma_ops_qp *qp;         /* whose send queue slot the entry frees when polled */
};

struct rdma_ops_cq {
    struct rdma_ops_dev *dev;
    struct rdma_ops_chan *ch;
    int users;                      /* QPs completing on it */
    uint32_t cap;
    uint32_t head;
    uint32_t count;
    struct emu_cqe *ring;
    int armed;
    int overrun;                    /* a completion found the ring full and was lost */
    unsigned queued;                /* events on the channel not yet taken */
    unsigned events;                /* events taken */
    unsigned acked;
    struct rdma_ops_cq *next_event;
};

struct rdma_ops_qp {
    struct rdma_ops_qp *next;
    struct rdma_ops_pd *pd;
    struct rdma_ops_cq *cq;
    uint32_t qpn;
    uint32_t max_wr;
    uint32_t inflight;              /* posted, completion not polled yet */
    enum rdma_qp_state state;
    struct rdma_ops_path path;
};

static struct {
    pthread_mutex_t lock;
    int devices;
    int port_active;
    uint64_t max_mr_size;
    uint32_t next_key;
    uint32_t next_qpn;
    struct rdma_ops_mr *mrs;
    struct rdma_ops_qp *qps;
} emu = {PTHREAD_MUTEX_INITIALIZER, 1, 1, UINT64_MAX, 0x1000, 0x100, NULL, NULL};

/* ---- test hooks ---- */

void
rdma_emu_reset(void)
{
    pthread_mutex_lock(&emu.lock);
    emu.devices = 1;
    emu.port_active = 1;
    emu.max_mr_size = UINT64_MAX;
    pthread_mutex_unlock(&emu.lock);
}

void
rdma_emu_set_devices(int n)
{
    pthread_mutex_lock(&emu.lock);
    emu.devices = n < 0 ? 0 : n;
    pthread_mutex_unlock(&emu.lock);
}

void
rdma_emu_set_max_mr_size(uint64_t bytes)
{
    pthread_mutex_lock(&emu.lock);
    emu.max_mr_size = bytes;
    pthread_mutex_unlock(&emu.lock);
}

void
rdma_emu_set_port_active(int active)
{
    pthread_mutex_lock(&emu.lock);
    emu.port_active = active != 0;
    pthread_mutex_unlock(&emu.lock);
}

static struct rdma_ops_qp *
emu_qp_find_locked(uint32_t qpn)
{
    struct rdma_ops_qp *qp = emu.qps;

    while (qp != NULL && qp->qpn != qpn) {
        qp = qp->next;
    }
    return qp;
}

int
rdma_emu_qp_force_error(uint32_t qpn)
{
    struct rdma_ops_qp *qp;

    pthread_mutex_lock(&emu.lock);
    qp = emu_qp_find_locked(qpn);
    if (qp != NULL) {
        qp->state = RDMA_QPS_ERR;
    }
    pthread_mutex_unlock(&emu.lock);
    return qp != NULL ? 0 : KV_NOT_FOUND;
}

int
rdma_emu_qp_force_error_all(void)
{
    int n = 0;

    pthread_mutex_lock(&emu.lock);
    for (struct rdma_ops_qp *qp = emu.qps; qp != NULL; qp = qp->next) {
        qp->state = RDMA_QPS_ERR;
        n++;
    }
    pthread_mutex_unlock(&emu.lock);
    return n;
}

/* ---- device ---- */

static int
emu_open_device(const char *want, char *name, size_t namelen, struct rdma_ops_dev **out,
                char *why, size_t whylen)
{
    struct rdma_ops_dev *dev;
    char pick[16] = "";
    int n;

    *out = NULL;
    pthread_mutex_lock(&emu.lock);
    n = emu.devices;
    pthread_mutex_unlock(&emu.lock);
    if (n == 0) {
        snprintf(why, whylen, "no RDMA device found (the emulation lists none)");
        return KV_NOT_FOUND;
    }
    for (int i = 0; i < n && pick[0] == '\0'; i++) {
        snprintf(pick, sizeof(pick), "emu%d", i);
        if (want[0] != '\0' && strcmp(want, pick) != 0) {
            pick[0] = '\0';
        }
    }
    if (pick[0] == '\0') {
        snprintf(why, whylen, "no RDMA device called '%s' (devices: emu0..emu%d)", want, n - 1);
        return KV_NOT_FOUND;
    }
    dev = calloc(1, sizeof(*dev));
    if (dev == NULL) {
        return -ENOMEM;
    }
    snprintf(dev->name, sizeof(dev->name), "%s", pick);
    snprintf(name, namelen, "%s", pick);
    *out = dev;
    return 0;
}

static void
emu_close_device(struct rdma_ops_dev *dev)
{
    if (dev != NULL && dev->users != 0) {
        abort();                    /* verbs would leak; a test must notice */
    }
    free(dev);
}

static int
emu_query_device(struct rdma_ops_dev *dev, struct rdma_dev_attr *out)
{
    (void)dev;
    pthread_mutex_lock(&emu.lock);
    out->max_mr_size = emu.max_mr_size;
    pthread_mutex_unlock(&emu.lock);
    out->max_qp_wr = EMU_MAX_QP_WR;
    out->max_cqe = EMU_MAX_CQE;
    out->max_rd_atomic = EMU_MAX_RD_ATOMIC;
    out->ports = 1;
    return 0;
}

static int
emu_query_port(struct rdma_ops_dev *dev, uint8_t port, struct rdma_port_attr *out)
{
    (void)dev;
    if (port != 1) {
        return -EINVAL;
    }
    pthread_mutex_lock(&emu.lock);
    out->state = emu.port_active ? RDMA_PORT_ACTIVE : RDMA_PORT_DOWN;
    pthread_mutex_unlock(&emu.lock);
    out->lid = EMU_LID;
    out->mtu = EMU_MTU;
    out->max_msg = EMU_MAX_MSG;
    return 0;
}

static int
emu_query_gid(struct rdma_ops_dev *dev, uint8_t port, uint8_t index, uint8_t gid[RDMA_GID_LEN])
{
    (void)dev;
    if (port != 1 || index != 0) {
        return -EINVAL;
    }
    memcpy(gid, emu_gid, RDMA_GID_LEN);
    return 0;
}

/* ---- protection domains and memory regions ---- */

static int
emu_alloc_pd(struct rdma_ops_dev *dev, struct rdma_ops_pd **out)
{
    struct rdma_ops_pd *pd = calloc(1, sizeof(*pd));

    if (pd == NULL) {
        return -ENOMEM;
    }
    pd->dev = dev;
    pthread_mutex_lock(&emu.lock);
    dev->users++;
    pthread_mutex_unlock(&emu.lock);
    *out = pd;
    return 0;
}

static int
emu_free_pd(struct rdma_ops_pd *pd)
{
    pthread_mutex_lock(&emu.lock);
    if (pd->users != 0) {
        pthread_mutex_unlock(&emu.lock);
        return -EBUSY;
    }
    pd->dev->users--;
    pthread_mutex_unlock(&emu.lock);
    free(pd);
    return 0;
}

static int
emu_reg_mr(struct rdma_ops_pd *pd, void *addr, uint64_t len, int access, struct rdma_ops_mr **out,
           uint32_t *lkey, uint32_t *rkey)
{
    struct rdma_ops_mr *mr;

    if (len == 0 || ((access & RDMA_ACCESS_REMOTE_WRITE) && !(access & RDMA_ACCESS_LOCAL_WRITE))) {
        return -EINVAL;
    }
    mr = calloc(1, sizeof(*mr));
    if (mr == NULL) {
        return -ENOMEM;
    }
    pthread_mutex_lock(&emu.lock);
    if (len > emu.max_mr_size) {
        pthread_mutex_unlock(&emu.lock);
        free(mr);
        return -EINVAL;
    }
    mr->pd = pd;
    mr->addr = addr;
    mr->len = len;
    mr->access = access;
    mr->key = emu.next_key;
    emu.next_key += 0x101;          /* never reused; low byte varies like a hardware key */
    mr->next = emu.mrs;
    emu.mrs = mr;
    pd->users++;
    pthread_mutex_unlock(&emu.lock);
    *lkey = mr->key;
    *rkey = mr->key;
    *out = mr;
    return 0;
}

static int
emu_dereg_mr(struct rdma_ops_mr *mr)
{
    struct rdma_ops_mr **pp;

    pthread_mutex_lock(&emu.lock);
    for (pp = &emu.mrs; *pp != mr; pp = &(*pp)->next) {
    }
    *pp = mr->next;
    mr->pd->users--;
    pthread_mutex_unlock(&emu.lock);
    free(mr);
    return 0;
}

/* ---- completion channels and queues ---- */

static int
emu_create_channel(struct rdma_ops_dev *dev, struct rdma_ops_chan **out, int *fd)
{
    struct rdma_ops_chan *ch = calloc(1, sizeof(*ch));

    if (ch == NULL) {
        return -ENOMEM;
    }
    ch->fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (ch->fd < 0) {
        int rc = -errno;

        free(ch);
        return rc;
    }
    ch->dev = dev;
    pthread_mutex_lock(&emu.lock);
    dev->users++;
    pthread_mutex_unlock(&emu.lock);
    *fd = ch->fd;
    *out = ch;
    return 0;
}

static int
emu_destroy_channel(struct rdma_ops_chan *ch)
{
    pthread_mutex_lock(&emu.lock);
    if (ch->users != 0) {
        pthread_mutex_unlock(&emu.lock);
        return -EBUSY;
    }
    ch->dev->users--;
    pthread_mutex_unlock(&emu.lock);
    close(ch->fd);
    free(ch);
    return 0;
}

static int
emu_create_cq(struct rdma_ops_dev *dev, uint32_t cqe, struct rdma_ops_chan *ch,
              struct rdma_ops_cq **out)
{
    struct rdma_ops_cq *cq;

    if (cqe == 0 || cqe > EMU_MAX_CQE) {
        return -EINVAL;
    }
    cq = calloc(1, sizeof(*cq));
    if (cq == NULL || (cq->ring = calloc(cqe, sizeof(*cq->ring))) == NULL) {
        free(cq);
        return -ENOMEM;
    }
    cq->dev = dev;
    cq->ch = ch;
    cq->cap = cqe;
    pthread_mutex_lock(&emu.lock);
    dev->users++;
    if (ch != NULL) {
        ch->users++;
    }
    pthread_mutex_unlock(&emu.lock);
    *out = cq;
    return 0;
}

static int
emu_destroy_cq(struct rdma_ops_cq *cq)
{
    pthread_mutex_lock(&emu.lock);
    if (cq->users != 0 || cq->acked != cq->events) {
        pthread_mutex_unlock(&emu.lock);
        return -EBUSY;
    }
    if (cq->queued != 0) {          /* drop its untaken events from the channel */
        struct rdma_ops_cq **pp = &cq->ch->head;

        cq->ch->tail = NULL;
        while (*pp != NULL) {
            if (*pp == cq) {
                *pp = cq->next_event;
            } else {
                cq->ch->tail = *pp;
                pp = &(*pp)->next_event;
            }
        }
        if (cq->ch->head == NULL) {
            uint64_t v;

            (void)!read(cq->ch->fd, &v, sizeof(v));
        }
    }
    cq->dev->users--;
    if (cq->ch != NULL) {
        cq->ch->users--;
    }
    pthread_mutex_unlock(&emu.lock);
    free(cq->ring);
    free(cq);
    return 0;
}

static int
emu_req_notify_cq(struct rdma_ops_cq *cq)
{
    pthread_mutex_lock(&emu.lock);
    cq->armed = 1;
    pthread_mutex_unlock(&emu.lock);
    return 0;
}

static int
emu_get_cq_event(struct rdma_ops_chan *ch, struct rdma_ops_cq **out)
{
    struct rdma_ops_cq *cq;

    pthread_mutex_lock(&emu.lock);
    cq = ch->head;
    if (cq == NULL) {
        pthread_mutex_unlock(&emu.lock);
        return -EAGAIN;
    }
    cq->events++;
    if (--cq->queued == 0) {
        ch->head = cq->next_event;
        if (ch->head == NULL) {
            uint64_t v;

            ch->tail = NULL;
            (void)!read(ch->fd, &v, sizeof(v)); /* the last event taken: the fd goes quiet */
        }
    }
    pthread_mutex_unlock(&emu.lock);
    *out = cq;
    return 0;
}

static void
emu_ack_cq_events(struct rdma_ops_cq *cq, unsigned n)
{
    pthread_mutex_lock(&emu.lock);
    cq->acked += n;
    pthread_mutex_unlock(&emu.lock);
}

static int
emu_poll_cq(struct rdma_ops_cq *cq, int n, struct rdma_wc *wc)
{
    int got = 0;

    pthread_mutex_lock(&emu.lock);
    if (cq->overrun) {
        pthread_mutex_unlock(&emu.lock);
        return -EOVERFLOW;
    }
    while (got < n && cq->count > 0) {
        struct emu_cqe *e = &cq->ring[cq->head];

        wc[got++] = e->wc;
        e->qp->inflight--;
        cq->head = (cq->head + 1) % cq->cap;
        cq->count--;
    }
    pthread_mutex_unlock(&emu.lock);
    return got;
}

/* emu_complete_locked: queue a completion and, when the CQ is armed, an event. */
static void
emu_complete_locked(struct rdma_ops_qp *qp, const struct rdma_ops_wr *wr,
                    enum rdma_wc_status status)
{
    struct rdma_ops_cq *cq = qp->cq;
    struct emu_cqe *e;

    if (cq->count == cq->cap) {
        cq->overrun = 1;            /* hardware: a CQ error event; every QP on it is lost */
        qp->inflight--;
        qp->state = RDMA_QPS_ERR;
        return;
    }
    e = &cq->ring[(cq->head + cq->count++) % cq->cap];
    e->qp = qp;
    e->wc.wr_id = wr->wr_id;
    e->wc.status = status;
    e->wc.opcode = wr->opcode;
    e->wc.byte_len = status == RDMA_WC_SUCCESS ? wr->len : 0;
    if (cq->armed && cq->ch != NULL) {
        uint64_t one = 1;

        cq->armed = 0;
        if (cq->queued++ == 0) {
            cq->next_event = NULL;
            if (cq->ch->tail != NULL) {
                cq->ch->tail->next_event = cq;
            } else {
                cq->ch->head = cq;
            }
            cq->ch->tail = cq;
        }
        (void)!write(cq->ch->fd, &one, sizeof(one));
    }
}

/* ---- queue pairs ---- */

static int
emu_create_qp(struct rdma_ops_pd *pd, struct rdma_ops_cq *cq, uint32_t max_send_wr,
              struct rdma_ops_qp **out, uint32_t *qpn)
{
    struct rdma_ops_qp *qp;

    if (max_send_wr == 0 || max_send_wr > EMU_MAX_QP_WR) {
        return -EINVAL;
    }
    qp = calloc(1, sizeof(*qp));
    if (qp == NULL) {
        return -ENOMEM;
    }
    qp->pd = pd;
    qp->cq = cq;
    qp->max_wr = max_send_wr;
    qp->state = RDMA_QPS_RESET;
    pthread_mutex_lock(&emu.lock);
    qp->qpn = emu.next_qpn++ & 0xffffff;
    qp->next = emu.qps;
    emu.qps = qp;
    pd->users++;
    cq->users++;
    pthread_mutex_unlock(&emu.lock);
    *qpn = qp->qpn;
    *out = qp;
    return 0;
}

static int
emu_destroy_qp(struct rdma_ops_qp *qp)
{
    struct rdma_ops_qp **pp;
    struct rdma_ops_cq *cq = qp->cq;
    uint32_t kept = 0;

    pthread_mutex_lock(&emu.lock);
    for (pp = &emu.qps; *pp != qp; pp = &(*pp)->next) {
    }
    *pp = qp->next;
    /* Like the kernel drivers, purge its completions still in the CQ. */
    for (uint32_t i = 0; i < cq->count; i++) {
        struct emu_cqe *e = &cq->ring[(cq->head + i) % cq->cap];

        if (e->qp != qp) {
            cq->ring[(cq->head + kept++) % cq->cap] = *e;
        }
    }
    cq->count = kept;
    cq->users--;
    qp->pd->users--;
    pthread_mutex_unlock(&emu.lock);
    free(qp);
    return 0;
}

/* emu_qp_move: one state transition, refused (-EINVAL) from any state but `from`. */
static int
emu_qp_move(struct rdma_ops_qp *qp, enum rdma_qp_state from, enum rdma_qp_state to,
            const struct rdma_ops_path *path)
{
    int rc = 0;

    pthread_mutex_lock(&emu.lock);
    if (qp->state != from) {
        rc = -EINVAL;
    } else {
        qp->state = to;
        if (path != NULL) {
            qp->path = *path;
        }
    }
    pthread_mutex_unlock(&emu.lock);
    return rc;
}

static int
emu_qp_init(struct rdma_ops_qp *qp, uint8_t port)
{
    return port == 1 ? emu_qp_move(qp, RDMA_QPS_RESET, RDMA_QPS_INIT, NULL) : -EINVAL;
}

static int
emu_qp_rtr(struct rdma_ops_qp *qp, const struct rdma_ops_path *path)
{
    if (path->port != 1 || (path->use_grh && path->gid_index != 0) || path->mtu < 256
        || path->mtu > 4096) {
        return -EINVAL;
    }
    return emu_qp_move(qp, RDMA_QPS_INIT, RDMA_QPS_RTR, path);
}

static int
emu_qp_rts(struct rdma_ops_qp *qp, uint32_t psn, uint8_t max_rd_atomic)
{
    (void)psn;
    (void)max_rd_atomic;
    return emu_qp_move(qp, RDMA_QPS_RTR, RDMA_QPS_RTS, NULL);
}

static int
emu_qp_error(struct rdma_ops_qp *qp)
{
    pthread_mutex_lock(&emu.lock);
    qp->state = RDMA_QPS_ERR;
    pthread_mutex_unlock(&emu.lock);
    return 0;
}

static int
emu_qp_state(struct rdma_ops_qp *qp)
{
    int state;

    pthread_mutex_lock(&emu.lock);
    state = (int)qp->state;
    pthread_mutex_unlock(&emu.lock);
    return state;
}

static struct rdma_ops_mr *
emu_mr_find_locked(uint32_t key, const struct rdma_ops_pd *pd, uint64_t addr, uint64_t len)
{
    struct rdma_ops_mr *mr = emu.mrs;

    while (mr != NULL && mr->key != key) {
        mr = mr->next;
    }
    if (mr == NULL || mr->pd != pd || addr < (uintptr_t)mr->addr
        || addr - (uintptr_t)mr->addr > mr->len || len > mr->len - (addr - (uintptr_t)mr->addr)) {
        return NULL;
    }
    return mr;
}

/* emu_execute_locked: what the requester and the responder would check, then the copy. */
static enum rdma_wc_status
emu_execute_locked(struct rdma_ops_qp *qp, const struct rdma_ops_wr *wr)
{
    struct rdma_ops_mr *lmr = emu_mr_find_locked(wr->lkey, qp->pd, (uintptr_t)wr->addr, wr->len);
    struct rdma_ops_qp *peer = emu_qp_find_locked(qp->path.qpn);
    int reachable = qp->path.use_grh ? memcmp(qp->path.gid, emu_gid, RDMA_GID_LEN) == 0
                                     : qp->path.lid == EMU_LID;
    int need = wr->opcode == RDMA_OP_READ ? RDMA_ACCESS_REMOTE_READ : RDMA_ACCESS_REMOTE_WRITE;
    struct rdma_ops_mr *rmr;

    if (lmr == NULL || (wr->opcode == RDMA_OP_READ && !(lmr->access & RDMA_ACCESS_LOCAL_WRITE))) {
        return RDMA_WC_LOC_PROT_ERR;
    }
    if (!reachable || peer == NULL || (peer->state != RDMA_QPS_RTR && peer->state != RDMA_QPS_RTS)
        || peer->path.qpn != qp->qpn) {
        return RDMA_WC_RETRY_EXC_ERR;
    }
    rmr = emu_mr_find_locked(wr->rkey, peer->pd, wr->raddr, wr->len);
    if (rmr == NULL || !(rmr->access & need)) {
        return RDMA_WC_REM_ACCESS_ERR;
    }
    if (wr->opcode == RDMA_OP_READ) {
        memmove(wr->addr, (void *)(uintptr_t)wr->raddr, wr->len);
    } else {
        memmove((void *)(uintptr_t)wr->raddr, wr->addr, wr->len);
    }
    return RDMA_WC_SUCCESS;
}

static int
emu_post(struct rdma_ops_qp *qp, const struct rdma_ops_wr *wr)
{
    enum rdma_wc_status status = RDMA_WC_FLUSH_ERR;

    pthread_mutex_lock(&emu.lock);
    if (qp->state != RDMA_QPS_RTS && qp->state != RDMA_QPS_ERR) {
        pthread_mutex_unlock(&emu.lock);
        return -EINVAL;
    }
    if (qp->inflight == qp->max_wr) {
        pthread_mutex_unlock(&emu.lock);
        return -ENOMEM;
    }
    qp->inflight++;
    if (qp->state == RDMA_QPS_RTS) {
        status = wr->len <= EMU_MAX_MSG ? emu_execute_locked(qp, wr) : RDMA_WC_LOC_LEN_ERR;
        if (status != RDMA_WC_SUCCESS) {
            qp->state = RDMA_QPS_ERR;
        }
    }
    emu_complete_locked(qp, wr, status);
    pthread_mutex_unlock(&emu.lock);
    return 0;
}

static const struct rdma_ops emu_ops = {
    .name = "emu",
    .open_device = emu_open_device,
    .close_device = emu_close_device,
    .query_device = emu_query_device,
    .query_port = emu_query_port,
    .query_gid = emu_query_gid,
    .alloc_pd = emu_alloc_pd,
    .free_pd = emu_free_pd,
    .reg_mr = emu_reg_mr,
    .dereg_mr = emu_dereg_mr,
    .create_channel = emu_create_channel,
    .destroy_channel = emu_destroy_channel,
    .create_cq = emu_create_cq,
    .destroy_cq = emu_destroy_cq,
    .req_notify_cq = emu_req_notify_cq,
    .get_cq_event = emu_get_cq_event,
    .ack_cq_events = emu_ack_cq_events,
    .poll_cq = emu_poll_cq,
    .create_qp = emu_create_qp,
    .destroy_qp = emu_destroy_qp,
    .qp_init = emu_qp_init,
    .qp_rtr = emu_qp_rtr,
    .qp_rts = emu_qp_rts,
    .qp_error = emu_qp_error,
    .qp_state = emu_qp_state,
    .post = emu_post,
};

const struct rdma_ops *
rdma_emu_ops(void)
{
    return &emu_ops;
}
