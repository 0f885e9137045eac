/*
 * rdma_verbs: the libibverbs build of rdma.h. Device discovery only, for
 * now: the list comes from ibv_get_device_list, which reads the kernel's
 * /sys/class/infiniband; a machine without RDMA hardware has an empty list.
 */
#include "rdma.h"

#include <infiniband/verbs.h>
#include <stdio.h>
#include <string.h>

#include "kverr.h"

int
rdma_probe(const char *device, char *name, size_t namelen, char *why, size_t whylen)
{
    struct ibv_device **list;
    char seen[256] = "";
    size_t used = 0;
    int n = 0;
    int rc = KV_NOT_FOUND;

    if (namelen > 0) {
        name[0] = '\0';
    }
    list = ibv_get_device_list(&n);
    if (list == NULL || n == 0) {
        snprintf(why, whylen, "no RDMA device found (ibv_get_device_list lists none; "
                              "/sys/class/infiniband is empty or absent)");
        if (list != NULL) {
            ibv_free_device_list(list);
        }
        return KV_NOT_FOUND;
    }
    for (int i = 0; i < n; i++) {
        const char *dn = ibv_get_device_name(list[i]);

        if (dn == NULL) {
            continue;
        }
        if (device[0] == '\0' || strcmp(device, dn) == 0) {
            snprintf(name, namelen, "%s", dn);
            rc = 0;
            break;
        }
        if (used < sizeof(seen)) {
            used += (size_t)snprintf(seen + used, sizeof(seen) - used, "%s%s",
                                     used > 0 ? ", " : "", dn);
        }
    }
    ibv_free_device_list(list);
    if (rc != 0) {
        snprintf(why, whylen, "no RDMA device called '%s' (devices: %s)", device, seen);
    }
    return rc;
}
