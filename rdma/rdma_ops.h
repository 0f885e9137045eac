/*
 * rdma_ops: the narrow table of verbs calls the data port (rdma_port.c)
 * makes, in kvstash's own types. Two tables implement it: rdma_verbs_ops()
 * calls libibverbs (rdma_verbs.c; the only file that includes
 * infiniband/verbs.h), rdma_emu_ops() is an in-process loopback emulation for
 * tests (rdma_emu.c). The handles below are opaque; each table defines (or
 * casts) its own. Nothing here knows about connections, the arena or the
 * wire: that is rdma_port's job.
 *
 * Status: 0, a positive KV_* code, or a negative errno, as everywhere. A
 * table's functions are as thread safe as libibverbs: calls on different
 * objects may run on different threads at once; one object (a CQ, a QP) is
 * used by one thread at a time.
 */
#ifndef RDMA_OPS_H
#define RDMA_OPS_H

#include <stddef.h>
#include <stdint.h>

struct rdma_ops_dev;  /* an open device (ibv_context) */
struct rdma_ops_pd;   /* a protection domain */
struct rdma_ops_mr;   /* a registered memory region */
struct rdma_ops_chan; /* a completion channel: one fd */
struct rdma_ops_cq;   /* a completion queue */
struct rdma_ops_qp;   /* a reliable-connected queue pair */

#define RDMA_GID_LEN 16

/* Memory region access flags (rdma_ops.reg_mr); a remote flag needs RDMA_ACCESS_LOCAL_WRITE. */
enum rdma_access {
    RDMA_ACCESS_LOCAL_WRITE = 1,
    RDMA_ACCESS_REMOTE_READ = 2,
    RDMA_ACCESS_REMOTE_WRITE = 4
};

enum rdma_port_state { RDMA_PORT_DOWN, RDMA_PORT_INIT, RDMA_PORT_ARMED, RDMA_PORT_ACTIVE };

enum rdma_qp_state { RDMA_QPS_RESET, RDMA_QPS_INIT, RDMA_QPS_RTR, RDMA_QPS_RTS, RDMA_QPS_ERR };

enum rdma_opcode { RDMA_OP_READ, RDMA_OP_WRITE };

/* Work completion status: the verbs ones the data port tells apart; the rest is OTHER. */
enum rdma_wc_status {
    RDMA_WC_SUCCESS,
    RDMA_WC_LOC_PROT_ERR,   /* local range not in an MR of this PD with that lkey */
    RDMA_WC_LOC_LEN_ERR,    /* bad local length */
    RDMA_WC_REM_ACCESS_ERR, /* remote rkey, range or access flag refused */
    RDMA_WC_REM_OP_ERR,     /* the responder failed the operation */
    RDMA_WC_RETRY_EXC_ERR,  /* the peer did not answer: gone, unreachable */
    RDMA_WC_FLUSH_ERR,      /* the QP was already in the error state */
    RDMA_WC_OTHER_ERR
};

struct rdma_dev_attr {
    uint64_t max_mr_size;  /* the largest one memory region may be */
    uint32_t max_qp_wr;    /* work requests one queue may hold */
    uint32_t max_cqe;      /* entries one completion queue may hold */
    uint8_t max_rd_atomic; /* outstanding RDMA READs per QP, both directions */
    uint8_t ports;         /* physical ports, numbered 1..ports */
};

struct rdma_port_attr {
    enum rdma_port_state state;
    uint16_t lid;         /* 0 on Ethernet (RoCE): address by GID */
    uint32_t mtu;         /* active path MTU in bytes: 256..4096 */
    uint32_t max_msg;     /* the largest one work request may move */
};

/* Where a QP sends to, for the move to RTR. */
struct rdma_ops_path {
    uint32_t qpn;         /* the remote QP */
    uint32_t psn;         /* its first packet sequence number */
    uint16_t lid;
    uint8_t gid[RDMA_GID_LEN];
    int use_grh;          /* address by gid (RoCE, or routed IB) rather than lid */
    uint8_t port;         /* the local port */
    uint8_t gid_index;    /* the local GID to send from, when use_grh */
    uint32_t mtu;         /* bytes: 256..4096 */
    uint8_t max_rd_atomic;
};

/* One RDMA READ or WRITE: one local range, one remote range, always signaled. */
struct rdma_ops_wr {
    uint64_t wr_id;
    enum rdma_opcode opcode;
    void *addr;           /* local */
    uint32_t len;
    uint32_t lkey;
    uint64_t raddr;       /* remote */
    uint32_t rkey;
};

struct rdma_wc {
    uint64_t wr_id;
    enum rdma_wc_status status;
    enum rdma_opcode opcode; /* valid on success only, as in verbs */
    uint32_t byte_len;       /* valid for a successful READ only, as in verbs */
};

/*
 * The table. Every pointer argument is borrowed for the call; an object
 * handed back belongs to the caller until its destroy/close/free/dereg call,
 * which must come after the destruction of everything built on it.
 */
struct rdma_ops {
    const char *name; /* "verbs", "emu" */

    /*
     * open_device: the device called `want`, or the first one when want is
     * "". Its name goes to name[0..namelen). KV_NOT_FOUND (no device, or
     * none called want: the reason, listing those there are, in why),
     * KV_UNSUPPORTED (no RDMA in this build), -errno.
     */
    int (*open_device)(const char *want, char *name, size_t namelen, struct rdma_ops_dev **out,
                       char *why, size_t whylen);
    void (*close_device)(struct rdma_ops_dev *dev);
    int (*query_device)(struct rdma_ops_dev *dev, struct rdma_dev_attr *out);
    /* query_port, query_gid: -EINVAL for a port or index the device does not have. */
    int (*query_port)(struct rdma_ops_dev *dev, uint8_t port, struct rdma_port_attr *out);
    int (*query_gid)(struct rdma_ops_dev *dev, uint8_t port, uint8_t index,
                     uint8_t gid[RDMA_GID_LEN]);

    int (*alloc_pd)(struct rdma_ops_dev *dev, struct rdma_ops_pd **out);
    int (*free_pd)(struct rdma_ops_pd *pd);
    /* reg_mr: `access` is enum rdma_access bits; -EINVAL when len exceeds max_mr_size. */
    int (*reg_mr)(struct rdma_ops_pd *pd, void *addr, uint64_t len, int access,
                  struct rdma_ops_mr **out, uint32_t *lkey, uint32_t *rkey);
    int (*dereg_mr)(struct rdma_ops_mr *mr);

    /* create_channel: *fd turns readable when a CQ bound to it has an event; nonblocking. */
    int (*create_channel)(struct rdma_ops_dev *dev, struct rdma_ops_chan **out, int *fd);
    int (*destroy_channel)(struct rdma_ops_chan *ch);
    int (*create_cq)(struct rdma_ops_dev *dev, uint32_t cqe, struct rdma_ops_chan *ch,
                     struct rdma_ops_cq **out);
    /* destroy_cq: -EBUSY while a QP uses it or events are unacknowledged. */
    int (*destroy_cq)(struct rdma_ops_cq *cq);
    /* req_notify_cq: one event on the channel for the next completion added. */
    int (*req_notify_cq)(struct rdma_ops_cq *cq);
    /* get_cq_event: the CQ of the next event, or -EAGAIN when there is none. */
    int (*get_cq_event)(struct rdma_ops_chan *ch, struct rdma_ops_cq **cq);
    void (*ack_cq_events)(struct rdma_ops_cq *cq, unsigned n);
    /* poll_cq: up to n completions into wc[]; returns how many, or -errno. */
    int (*poll_cq)(struct rdma_ops_cq *cq, int n, struct rdma_wc *wc);

    /* create_qp: an RC QP in RESET whose sends complete on cq; *qpn is its number. */
    int (*create_qp)(struct rdma_ops_pd *pd, struct rdma_ops_cq *cq, uint32_t max_send_wr,
                     struct rdma_ops_qp **out, uint32_t *qpn);
    int (*destroy_qp)(struct rdma_ops_qp *qp);
    /* qp_init: RESET -> INIT on `port`, remote READ and WRITE allowed. */
    int (*qp_init)(struct rdma_ops_qp *qp, uint8_t port);
    int (*qp_rtr)(struct rdma_ops_qp *qp, const struct rdma_ops_path *path);
    int (*qp_rts)(struct rdma_ops_qp *qp, uint32_t psn, uint8_t max_rd_atomic);
    /* qp_error: to ERR: every outstanding and later work request completes with FLUSH_ERR. */
    int (*qp_error)(struct rdma_ops_qp *qp);
    /* qp_state: the current enum rdma_qp_state, or -errno. */
    int (*qp_state)(struct rdma_ops_qp *qp);
    /* post: one signaled work request; -ENOMEM when the send queue is full. */
    int (*post)(struct rdma_ops_qp *qp, const struct rdma_ops_wr *wr);
};

/*
 * rdma_verbs_ops: the libibverbs table. In a build without RDMA (make
 * RDMA=0) its open_device reports KV_UNSUPPORTED and nothing else is
 * reachable. Static; never NULL.
 */
const struct rdma_ops *rdma_verbs_ops(void);

/*
 * rdma_default_ops: the table the daemon and libkvstash open devices with:
 * rdma_verbs_ops(), unless rdma_use_ops chose another (tests run the whole
 * data path in one process over rdma_emu_ops()). rdma_use_ops(NULL) goes
 * back to verbs. Call it before any device is opened.
 */
const struct rdma_ops *rdma_default_ops(void);
void rdma_use_ops(const struct rdma_ops *ops);

#endif
