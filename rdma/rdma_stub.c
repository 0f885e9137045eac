/*
 * rdma_stub: the build without RDMA (make RDMA=0). Reports UNSUPPORTED with
 * a reason, from rdma_probe and from the rdma_ops table's open_device (the
 * only entry it fills: nothing else is reachable without an open device);
 * holds no state and includes no verbs header.
 */
#include "rdma.h"
#include "rdma_ops.h"

#include <stdio.h>

#include "kverr.h"

static const char stub_why[] = "this kvstashd was built without RDMA support (make RDMA=0)";

int
rdma_probe(const char *device, char *name, size_t namelen, char *why, size_t whylen)
{
    (void)device;
    if (namelen > 0) {
        name[0] = '\0';
    }
    snprintf(why, whylen, "%s", stub_why);
    return KV_UNSUPPORTED;
}

static int
stub_open_device(const char *want, char *name, size_t namelen, struct rdma_ops_dev **out,
                 char *why, size_t whylen)
{
    *out = NULL;
    return rdma_probe(want, name, namelen, why, whylen);
}

static const struct rdma_ops stub_ops = {
    .name = "verbs",
    .open_device = stub_open_device,
};

const struct rdma_ops *
rdma_verbs_ops(void)
{
    return &stub_ops;
}
