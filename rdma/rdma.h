/*
 * rdma: the RDMA side of the daemon (libibverbs). Only files under rdma/
 * include infiniband/verbs.h; the Makefile picks rdma_verbs.c (RDMA=1, the
 * default) or rdma_stub.c (make RDMA=0). This version finds devices and
 * checks the rdma setting at start; the data port itself (memory regions,
 * queue pairs, one-sided transfers) is not built yet, so the daemon never
 * lists rdma in hello's transports and never falls back to TCP for a client
 * that asked for RDMA.
 */
#ifndef RDMA_H
#define RDMA_H

#include <stddef.h>

/*
 * rdma_probe: find the RDMA device to use: `device`, or the first one when
 * device is "". Returns 0 with its name in name[0..namelen), or, with the
 * reason in why[0..whylen):
 *   KV_NOT_FOUND    no device at all, or none called `device` (the reason
 *                   lists the devices there are)
 *   KV_UNSUPPORTED  this build has no RDMA support (make RDMA=0)
 */
int rdma_probe(const char *device, char *name, size_t namelen, char *why, size_t whylen);

#endif
