/*
 * rdma_emu: an in-process loopback emulation of the rdma_ops table, so the
 * data port can be tested on a machine without RDMA hardware, in builds with
 * and without libibverbs. One emulated fabric per process: every device it
 * lists ("emu0", ...) is the same port (lid 1, GID fe80::1, MTU 4096), so
 * QPs opened through any of them can connect to each other.
 *
 * What it checks is what RC hardware checks, and a failure completes the
 * work request with the status the hardware would give: a local range
 * outside an MR of the QP's PD with that lkey (LOC_PROT_ERR); a remote QP
 * that does not exist any more or is not connected back (RETRY_EXC_ERR); an
 * rkey that names no MR of the remote QP's PD, a remote range outside it or
 * a missing remote access flag (REM_ACCESS_ERR, nothing copied). Any of
 * these moves the QP to ERR, and a QP in ERR completes every later work
 * request with FLUSH_ERR. Data is copied when the work request is posted;
 * the completion is queued at once and wakes the completion channel (an
 * eventfd) when the CQ was armed.
 *
 * Threads: one mutex guards the whole fabric, so the daemon side and the
 * client side may run on different threads; the copy runs under it.
 */
#ifndef RDMA_EMU_H
#define RDMA_EMU_H

#include <stdint.h>

struct rdma_ops;

/* rdma_emu_ops: the emulation's table. Static; never NULL. */
const struct rdma_ops *rdma_emu_ops(void);

/*
 * Test hooks. They change the fabric for every thread and take effect for
 * calls made after them.
 *
 * rdma_emu_reset: back to the defaults: one device, max_mr_size unlimited,
 * port active. Objects that exist stay (their owners destroy them).
 */
void rdma_emu_reset(void);

/* rdma_emu_set_devices: list n devices, emu0..emu<n-1>; 0 lists none. */
void rdma_emu_set_devices(int n);

/* rdma_emu_set_max_mr_size: what query_device reports and reg_mr enforces. */
void rdma_emu_set_max_mr_size(uint64_t bytes);

/* rdma_emu_set_port_active: 0 reports the port DOWN. */
void rdma_emu_set_port_active(int active);

/*
 * rdma_emu_qp_force_error: move QP `qpn` to ERR, as a hardware fault would.
 * Returns 0, or KV_NOT_FOUND when no such QP exists.
 */
int rdma_emu_qp_force_error(uint32_t qpn);

/*
 * rdma_emu_qp_force_error_all: move every QP of the fabric to ERR (for a test whose QPs
 * are made where it cannot see their numbers: two daemons' peer connections). Returns how
 * many.
 */
int rdma_emu_qp_force_error_all(void);

#endif
