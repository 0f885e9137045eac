/*
 * rdma_stub: the build without RDMA (make RDMA=0). The rdma_ops table's
 * open_device reports UNSUPPORTED with a reason (the only entry it fills:
 * nothing else is reachable without an open device); holds no state and
 * includes no verbs header.
 */
#include "rdma_ops.h"

#include <stdio.h>

#include "kverr.h"

static const char stub_why[] = "this kvstashd was built without RDMA support (make RDMA=0)";

static int
stub_open_device(const char *want, char *name, size_t namelen, struct rdma_ops_dev **out,
                 char *why, size_t whylen)
{
    (void)want;
    *out = NULL;
    if (namelen > 0) {
        name[0] = '\0';
    }
    snprintf(why, whylen, "%s", stub_why);
    return KV_UNSUPPORTED;
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
