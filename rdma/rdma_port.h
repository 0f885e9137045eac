/*
 * rdma_port: the RDMA data port, on top of an rdma_ops table (libibverbs in
 * production, the emulation in tests). It owns four kinds of object:
 *
 *   rdma_dev     an open device, one port and one GID on it, a PD
 *   rdma_region  memory registered once (the daemon's DRAM arena, a client's
 *                buffer) as one MR, or several when it is larger than the
 *                device's max_mr_size
 *   rdma_cq      one completion queue + channel per event loop; its fd goes
 *                to libevent
 *   rdma_qp      one RC queue pair per connection, carrying one-sided RDMA
 *                READ and WRITE of local region ranges to a peer's (addr,
 *                rkey) ranges
 *
 * It knows nothing about keys, objects, the wire or sockets: the caller ships
 * rdma_qp_info and rdma_seg to the peer by its own means.
 *
 * Threads: an rdma_dev and its regions may be used from any thread once
 * set up (lookups are read-only). An rdma_cq and every rdma_qp on it belong
 * to one thread, the event loop that polls the CQ; they take no locks.
 * Lifetime: destroy QPs, then their CQ; deregister regions; close the device
 * last.
 *
 * Every operation posted with rdma_qp_post that was accepted (returned 0)
 * yields exactly one rdma_done from rdma_cq_poll, also when the QP failed or
 * was destroyed meanwhile (then with an error status).
 */
#ifndef RDMA_PORT_H
#define RDMA_PORT_H

#include <stddef.h>
#include <stdint.h>

#include "rdma_ops.h"

struct rdma_dev;
struct rdma_region;
struct rdma_cq;
struct rdma_qp;

/* What one side of a connection sends the other so the two QPs can connect. */
struct rdma_qp_info {
    uint32_t qpn;         /* 24 bits */
    uint32_t psn;         /* 24 bits: first packet sequence number */
    uint16_t lid;         /* 0 on RoCE */
    uint8_t gid[RDMA_GID_LEN];
    uint32_t mtu;         /* active MTU of the sender's port, bytes: 256..4096 */
};

#define RDMA_QP_INFO_LEN 30 /* rdma_qp_info_encode's fixed size */

/* A remotely accessible range of one MR: what a peer needs to READ or WRITE it. */
struct rdma_seg {
    uint64_t addr;
    uint64_t len;
    uint32_t rkey;
};

/* The outcome of one operation posted with rdma_qp_post. */
struct rdma_done {
    uint64_t wr_id;           /* the caller's */
    int status;               /* 0, or a KV_* code: see rdma_wc_status_code */
    enum rdma_wc_status wc;   /* the first failing piece's verbs status, for logs */
    enum rdma_opcode opcode;
    uint64_t len;             /* the bytes moved: the posted length on success, else 0 */
};

/* ---- device ---- */

/*
 * rdma_dev_open: open `device` ("" = the first one) through `ops`, check
 * that port `port` is ACTIVE and GID index `gid_index` exists on it (and is
 * set, when the port has no LID), and allocate a PD. Returns 0 and *out, or,
 * with the reason in why[0..whylen) naming the device, port or GID:
 *   KV_NOT_FOUND    no device, no such device, port or GID index
 *   KV_UNAVAILABLE  the port is not ACTIVE
 *   KV_UNSUPPORTED  no RDMA in this build (rdma_verbs_ops with make RDMA=0)
 *   -errno          a verbs call failed
 * ops is borrowed and must outlive the device.
 */
int rdma_dev_open(const struct rdma_ops *ops, const char *device, uint8_t port, uint8_t gid_index,
                  struct rdma_dev **out, char *why, size_t whylen);

/* rdma_dev_close: after every region, CQ and QP of it is gone. Accepts NULL. */
void rdma_dev_close(struct rdma_dev *dev);

/* rdma_dev_name: the opened device's name; valid until rdma_dev_close. */
const char *rdma_dev_name(const struct rdma_dev *dev);

/* ---- memory regions ---- */

/*
 * rdma_region_register: register [base, base+len) with `access` (enum
 * rdma_access bits; RDMA_ACCESS_LOCAL_WRITE is needed to READ into it).
 * When len exceeds the device's max_mr_size the range is split into MRs of
 * C bytes each, C the largest power of two <= max_mr_size, at base + k*C
 * (the last may be shorter): so a power-of-two sized, equally aligned
 * extent of at most C bytes (offsets from base) never crosses an MR
 * boundary. Registration pins the memory; do it once, at start.
 * Returns 0 and *out, KV_INVALID_ARGUMENT (len 0, base NULL), KV_TOO_LARGE
 * (more than 65536 MRs would be needed), -errno (registration failed; no MR
 * is left behind). The memory is borrowed and must outlive the region.
 */
int rdma_region_register(struct rdma_dev *dev, void *base, uint64_t len, int access,
                         struct rdma_region **out);

/* rdma_region_deregister: deregister every MR; no QP may still use them. Accepts NULL. */
void rdma_region_deregister(struct rdma_region *r);

/*
 * rdma_region_lkey: the lkey covering [addr, addr+len). Returns 0,
 * KV_NOT_FOUND (not inside the region), KV_INVALID_ARGUMENT (len 0, or it
 * crosses an MR boundary: use rdma_qp_post, which splits, or
 * rdma_region_segs).
 */
int rdma_region_lkey(const struct rdma_region *r, const void *addr, uint64_t len,
                     uint32_t *lkey);

/*
 * rdma_region_segs: the (addr, len, rkey) pieces covering [addr, addr+len),
 * split at MR boundaries, in order: what a peer needs to READ or WRITE that
 * range. Writes up to max into segs and the count into *n. Returns 0,
 * KV_NOT_FOUND (not inside the region), KV_INVALID_ARGUMENT (len 0),
 * KV_NO_SPACE (more than max pieces; *n is how many are needed, segs holds
 * the first max).
 */
int rdma_region_segs(const struct rdma_region *r, const void *addr, uint64_t len,
                     struct rdma_seg *segs, int max, int *n);

/* ---- completion queues ---- */

/*
 * rdma_cq_create: a CQ of `size` entries with its completion channel, armed.
 * The QPs on it together may have at most `size` work requests outstanding
 * (rdma_qp_create reserves its share). Returns 0 and *out,
 * KV_INVALID_ARGUMENT (size 0 or over the device's max_cqe), -errno.
 */
int rdma_cq_create(struct rdma_dev *dev, uint32_t size, struct rdma_cq **out);

/* rdma_cq_destroy: after all its QPs; pending dones are dropped. Accepts NULL. */
void rdma_cq_destroy(struct rdma_cq *cq);

/*
 * rdma_cq_fd: nonblocking; readable when completions may be waiting. Watch
 * it for EV_READ and call rdma_cq_poll when it fires. Valid until destroy.
 */
int rdma_cq_fd(const struct rdma_cq *cq);

/*
 * rdma_cq_poll: consume the channel's events and hand back up to max
 * finished operations in done[]. Returns how many (0 when none), or -errno
 * (the CQ overran: every QP on it is lost). Returning less than max means
 * the CQ is drained and re-armed: the fd turns readable for the next
 * completion, none is lost in between. Returning max means more may be
 * queued that will NOT make the fd readable: call it again, until it
 * returns less than max, before going back to waiting on the fd (the rule
 * for any edge-triggered source).
 */
int rdma_cq_poll(struct rdma_cq *cq, struct rdma_done *done, int max);

/*
 * rdma_wc_status_code: the KV_* code for a verbs status: 0 (SUCCESS),
 * KV_FORBIDDEN (REM_ACCESS: bad rkey, range or access), KV_TIMEOUT
 * (RETRY_EXC: the peer is gone), KV_UNAVAILABLE (FLUSH: the QP had already
 * failed), KV_INVALID_ARGUMENT (local protection or length), KV_INTERNAL.
 */
int rdma_wc_status_code(enum rdma_wc_status wc);

/* rdma_wc_status_str: "REM_ACCESS_ERR" and so on; a static string. */
const char *rdma_wc_status_str(enum rdma_wc_status wc);

/* ---- queue pairs ---- */

/*
 * rdma_qp_create: an RC QP on cq, in INIT, holding at most max_wr work
 * requests outstanding. *local is what to send the peer. Returns 0 and
 * *out, KV_INVALID_ARGUMENT (max_wr 0 or over the device's max_qp_wr),
 * KV_NO_SPACE (the CQ's size is spoken for), -errno.
 */
int rdma_qp_create(struct rdma_cq *cq, uint32_t max_wr, struct rdma_qp **out,
                   struct rdma_qp_info *local);

/*
 * rdma_qp_connect: INIT -> RTR -> RTS towards the peer described by
 * `remote` (peer input: checked). Returns 0, KV_INVALID_ARGUMENT (bad
 * remote info, or already connected), -errno (the QP is then failed).
 */
int rdma_qp_connect(struct rdma_qp *qp, const struct rdma_qp_info *remote);

/*
 * rdma_qp_post: one RDMA READ (remote -> local) or WRITE (local -> remote)
 * of len bytes between [addr, addr+len) in `local` and [raddr, raddr+len)
 * of the peer's MR `rkey` (one rdma_seg of the peer). The local range is
 * split into several work requests at local MR boundaries and at the
 * port's largest message; they all count against max_wr. Its one rdma_done
 * carries wr_id. Returns 0 (posted), or nothing was posted and:
 *   -EAGAIN              not enough room: retry after rdma_cq_poll
 *   KV_TOO_LARGE         it needs more work requests than max_wr
 *   KV_NOT_FOUND         the local range is not inside `local`
 *   KV_INVALID_ARGUMENT  len 0, remote range wraps, QP not connected
 *   KV_UNAVAILABLE       the QP has failed (rdma_qp_failed)
 * `local` is borrowed until the done arrives.
 */
int rdma_qp_post(struct rdma_qp *qp, enum rdma_opcode opcode, const struct rdma_region *local,
                 void *addr, uint64_t len, uint64_t raddr, uint32_t rkey, uint64_t wr_id);

/*
 * rdma_qp_failed: 0 while the QP is usable, else the KV_* code of what
 * failed it (an error completion, a failed connect, or the device reporting
 * it in the error state: asks the device once per call until it has failed).
 * A failed QP never recovers: destroy it and connect a new one.
 */
int rdma_qp_failed(struct rdma_qp *qp);

/*
 * rdma_qp_destroy: move the QP to the error state, wait (up to a second)
 * for its outstanding work requests to flush, and destroy it. Their dones
 * (and those of other QPs met meanwhile) come from the next rdma_cq_poll.
 * Accepts NULL.
 */
void rdma_qp_destroy(struct rdma_qp *qp);

/*
 * rdma_qp_info_encode / rdma_qp_info_decode: the fixed RDMA_QP_INFO_LEN byte
 * form (big-endian qpn, psn, lid, gid, mtu). decode checks it as peer input:
 * KV_INVALID_ARGUMENT for a wrong length, a qpn or psn over 24 bits, an MTU
 * that is not 256, 512, 1024, 2048 or 4096.
 */
void rdma_qp_info_encode(const struct rdma_qp_info *info, uint8_t out[RDMA_QP_INFO_LEN]);
int rdma_qp_info_decode(const uint8_t *buf, size_t len, struct rdma_qp_info *out);

#endif
