/*
 * rdma_stub: the build without RDMA (make RDMA=0). Reports UNSUPPORTED with
 * a reason; holds no state and includes no verbs header.
 */
#include "rdma.h"

#include <stdio.h>

#include "kverr.h"

int
rdma_probe(const char *device, char *name, size_t namelen, char *why, size_t whylen)
{
    (void)device;
    if (namelen > 0) {
        name[0] = '\0';
    }
    snprintf(why, whylen, "this kvstashd was built without RDMA support (make RDMA=0)");
    return KV_UNSUPPORTED;
}
