/*
 * rdma_stub: the build without an RDMA data port. Reports UNSUPPORTED with a
 * reason; holds no state and includes no verbs header.
 */
#include "rdma.h"

#include <stdio.h>

#include "kverr.h"

int
rdma_probe(char *why, size_t len)
{
    snprintf(why, len, "this build has no RDMA data port");
    return KV_UNSUPPORTED;
}
