/*
 * rdma: the RDMA side of the daemon (libibverbs). Only rdma/rdma_verbs.c
 * includes infiniband/verbs.h; the Makefile picks rdma_verbs.c (RDMA=1, the
 * default) or rdma_stub.c (make RDMA=0). Device discovery is here; the data
 * port (memory regions, queue pairs, one-sided transfers) is rdma_port.h,
 * over the verbs table of rdma_ops.h.
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
