/*
 * rdma: the RDMA data port (libibverbs). Only files under rdma/ include
 * infiniband/verbs.h. This build ships the stub (rdma_stub.c): the data port
 * itself arrives with the zero-copy issue; until then the daemon reports RDMA
 * as unsupported and never lists it in hello's transports.
 */
#ifndef RDMA_H
#define RDMA_H

#include <stddef.h>

/*
 * rdma_probe: is an RDMA data port usable in this build on this machine?
 * Returns 0 when it is, or KV_UNSUPPORTED with the reason in why.
 */
int rdma_probe(char *why, size_t len);

#endif
