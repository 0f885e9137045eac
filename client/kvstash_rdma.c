/*
 * kvstash_rdma: libkvstash's RDMA side (protocol/SPEC.md, "RDMA"). A client
 * opens its own RDMA device, makes a reliable-connected queue pair and
 * connects it to the daemon's (whose info hello {"rdma": true} answers);
 * the first RDMA buffer it registers carries the client's info, so the
 * daemon connects its side too. Buffers are the caller's memory registered
 * with the device; kvstash_batch_put_from and kvstash_batch_get_into take
 * them like shared-memory buffers, and the daemon moves the bytes with
 * one-sided RDMA READs and WRITEs. The client's queue pair only answers:
 * it posts nothing, so there is no completion to wait for here.
 */
#include "kvstash.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kverr.h"
#include "kvstash_int.h"
#include "kvstash_wire.h"
#include "rdma_port.h"

#define KVSTASH_RDMA_CQ 64          /* the client posts nothing: a token queue */

struct kvstash_rdma {
    struct rdma_dev *dev;
    struct rdma_cq *cq;
    struct rdma_qp *qp;
    uint8_t info[RDMA_QP_INFO_LEN]; /* ours, sent with the first buffer */
    bool sent;                      /* the daemon has connected its side */
};

int
kvstash_rdma_enable(struct kvstash *c, const char *device, int port, int gid_index)
{
    struct kvstash_rdma *r;
    struct rdma_qp_info mine, theirs;
    char why[256];
    int rc = kvstash_begin(c);

    if (rc != 0) {
        return rc;
    }
    if (c->rdma != NULL) {
        kvstash_wire_errf(c, "RDMA is enabled on this connection already");
        return KVSTASH_EINVAL;
    }
    if (port < 1 || port > 255 || gid_index < 0 || gid_index > 255) {
        kvstash_wire_errf(c, "bad RDMA port %d or GID index %d", port, gid_index);
        return KVSTASH_EINVAL;
    }
    /* The daemon's queue pair first: without RDMA there it says UNSUPPORTED. */
    kvstash_wire_req_begin(c, "hello", 1);
    kvstash_wire_req_map(c, 1);
    kvstash_wire_req_str(c, "rdma");
    kvstash_wire_req_bool(c, true);
    c->rdma_qp_len = 0;
    rc = kvstash_wire_call(c, KVSTASH_WIRE_SMALL_REPLY);
    if (rc == 0) {
        rc = kvstash_done(c, kvstash_wire_read_hello(c, &c->hello));
    }
    if (rc != 0) {
        return rc;
    }
    if (rdma_qp_info_decode(c->rdma_qp, c->rdma_qp_len, &theirs) != 0) {
        kvstash_wire_errf(c, "hello answered no usable queue-pair info");
        return kvstash_done(c, -EPROTO);
    }
    r = calloc(1, sizeof(*r));
    if (r == NULL) {
        return -ENOMEM;
    }
    rc = rdma_dev_open(rdma_default_ops(), device != NULL ? device : "", (uint8_t)port,
                       (uint8_t)gid_index, &r->dev, why, sizeof(why));
    if (rc == 0) {
        rc = rdma_cq_create(r->dev, KVSTASH_RDMA_CQ, &r->cq);
        snprintf(why, sizeof(why), "creating a completion queue failed");
    }
    if (rc == 0) {
        rc = rdma_qp_create(r->cq, KVSTASH_RDMA_CQ / 2, &r->qp, &mine);
        snprintf(why, sizeof(why), "creating a queue pair failed");
    }
    if (rc == 0) {
        rc = rdma_qp_connect(r->qp, &theirs);
        snprintf(why, sizeof(why), "connecting to the daemon's queue pair failed");
    }
    if (rc != 0) {
        kvstash_wire_errf(c, "%s", why);
        c->rdma = r;
        kvstash_rdma_close(c, true);
        return rc == KV_NOT_FOUND || rc == KV_UNSUPPORTED ? KVSTASH_EUNSUPPORTED
               : rc < 0                                   ? rc
                                                          : KVSTASH_EINTERNAL;
    }
    rdma_qp_info_encode(&mine, r->info);
    c->rdma = r;
    return 0;
}

int
kvstash_register_rdma_buffer(struct kvstash *c, void *ptr, size_t size,
                             struct kvstash_buffer **out)
{
    struct kvstash_rdma *r;
    struct kvstash_buffer *b;
    struct rdma_seg seg;
    int n = 0;
    int rc = kvstash_begin(c);

    if (rc != 0) {
        return rc;
    }
    if (out == NULL || ptr == NULL || size == 0) {
        kvstash_wire_errf(c, "register_rdma_buffer: NULL or empty buffer");
        return KVSTASH_EINVAL;
    }
    *out = NULL;
    r = c->rdma;
    if (r == NULL) {
        kvstash_wire_errf(c, "RDMA is not enabled on this connection (kvstash_rdma_enable)");
        return KVSTASH_EINVAL;
    }
    b = calloc(1, sizeof(*b));
    if (b == NULL) {
        return -ENOMEM;
    }
    rc = rdma_region_register(r->dev, ptr, size, RDMA_ACCESS_LOCAL_WRITE
                              | RDMA_ACCESS_REMOTE_READ | RDMA_ACCESS_REMOTE_WRITE, &b->mr);
    if (rc == 0 && rdma_region_segs(b->mr, ptr, size, &seg, 1, &n) != 0) {
        kvstash_wire_errf(c, "a buffer of %zu bytes is more than one memory region of this "
                          "device holds: register smaller buffers", size);
        rdma_region_deregister(b->mr);
        free(b);
        return KVSTASH_ETOOLARGE;
    }
    if (rc != 0) {
        kvstash_wire_errf(c, "registering %zu bytes with the RDMA device failed", size);
        free(b);
        return rc < 0 ? rc : KVSTASH_EINTERNAL;
    }
    kvstash_wire_req_begin(c, "register_buffer", 1);
    kvstash_wire_req_map(c, r->sent ? 4 : 5);
    kvstash_wire_req_str(c, "transport");
    kvstash_wire_req_str(c, "rdma");
    kvstash_wire_req_str(c, "addr");
    kvstash_wire_req_uint(c, seg.addr);
    kvstash_wire_req_str(c, "rkey");
    kvstash_wire_req_uint(c, seg.rkey);
    kvstash_wire_req_str(c, "size");
    kvstash_wire_req_uint(c, size);
    if (!r->sent) {
        kvstash_wire_req_str(c, "qp");
        kvstash_wire_req_value(c, r->info, sizeof(r->info));
    }
    rc = kvstash_wire_call(c, KVSTASH_WIRE_SMALL_REPLY);
    if (rc == 0) {
        rc = kvstash_done(c, kvstash_wire_read_uint(c, &b->id));
    }
    if (rc != 0) {
        rdma_region_deregister(b->mr);
        free(b);
        return rc;
    }
    r->sent = true;
    b->base = ptr;
    b->size = size;
    kvstash_buffer_link(c, b);
    *out = b;
    return 0;
}

void
kvstash_rdma_buffer_release(struct kvstash_buffer *b)
{
    rdma_region_deregister(b->mr);
    b->mr = NULL;
}

void
kvstash_rdma_close(struct kvstash *c, bool device)
{
    struct kvstash_rdma *r = c->rdma;

    if (r == NULL) {
        return;
    }
    if (r->qp != NULL) {
        struct rdma_done d[4];

        rdma_qp_destroy(r->qp);
        r->qp = NULL;
        while (rdma_cq_poll(r->cq, d, 4) > 0) {
            /* nothing was posted here; drain whatever the destroy reported */
        }
    }
    if (r->cq != NULL) {
        rdma_cq_destroy(r->cq);
        r->cq = NULL;
    }
    if (device) {
        rdma_dev_close(r->dev);
        free(r);
        c->rdma = NULL;
    }
}
