/*
 * Integration: the RDMA data path end to end, in one process. kvstashd's
 * server runs on a thread of this test, opening its device through the
 * in-process loopback emulation of the verbs calls (rdma/rdma_emu.c), and the
 * test is the client: it registers memory with the same emulated device, sets
 * up its queue pair by exchanging queue-pair info through rdma_connect over the
 * msgpack connection (TCP), and then moves objects with batch_put_from (the
 * daemon's RDMA READs from the client's memory) and batch_get_into (its RDMA
 * WRITEs into it), and writes and reads arena memory itself, one-sided, where
 * put_start and get_replica_list say. And the failures: a bad rkey, a piece
 * out of the registered range, a queue pair in the error state, a peer that
 * vanished, a client that closes with work in flight.
 *
 * The production build runs the same code over libibverbs (rdma/rdma_verbs.c);
 * this machine has no RDMA device, so only the emulation runs here (docs/testing.md).
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../lib/harness.h"
#include "config.h"
#include "kverr.h"
#include "kvstash.h"
#include "log.h"
#include "rdma_emu.h"
#include "rdma_port.h"
#include "server.h"

#define KIB 1024u
#define MIB (1024u * 1024u)
#define T_TIMEOUT 10000
#define T_CLIENT_BYTES (64u * MIB)
#define T_ACCESS (RDMA_ACCESS_LOCAL_WRITE | RDMA_ACCESS_REMOTE_READ | RDMA_ACCESS_REMOTE_WRITE)

/* The daemon, in this process. */
static struct server *t_srv;
static pthread_t t_srv_thread;
static char t_dir[64];
static int t_port;

/* The client: its memory registered with the (emulated) device, and its queue pair. */
struct t_client {
    struct harness_conn conn;
    uint32_t msgid;
    struct rdma_dev *dev;
    struct rdma_region *reg;
    struct rdma_cq *cq;
    struct rdma_qp *qp;
    struct rdma_qp_info server_qp;
    uint8_t *buf;
    uint32_t rkey;
};

static void *
t_server_main(void *arg)
{
    (void)arg;
    server_run(t_srv);
    return NULL;
}

/* t_start: the daemon, over an emulated device whose regions hold max_mr bytes (0: any). */
static void
t_start(const char *memory_size, uint64_t max_mr)
{
    struct kv_config c;
    char err[512], listen[64], data[96];

    rdma_use_ops(rdma_emu_ops());
    rdma_emu_reset();
    if (max_mr != 0) {
        rdma_emu_set_max_mr_size(max_mr);
    }
    snprintf(t_dir, sizeof(t_dir), "/tmp/kvstash-rdma-XXXXXX");
    cr_assert_not_null(mkdtemp(t_dir));
    t_port = harness_free_port();
    snprintf(listen, sizeof(listen), "127.0.0.1:%d", t_port);
    snprintf(data, sizeof(data), "%s/data", t_dir);
    conf_init(&c);
    const char *kv[][2] = {
        {"listen", listen}, {"data_dir", data}, {"unix_socket", "none"}, {"ssd_dir", ""},
        {"memory_size", memory_size}, {"rdma", "required"}, {"io_threads", "2"},
        {"log_level", "warn"}, {"metrics_listen", ""},
    };
    for (size_t i = 0; i < sizeof(kv) / sizeof(kv[0]); i++) {
        cr_assert_eq(conf_set(&c, kv[i][0], kv[i][1], "test", err, sizeof(err)), 0, "%s", err);
    }
    cr_assert_eq(conf_finalize(&c, err, sizeof(err)), 0, "%s", err);
    log_set_level(c.log_level);
    cr_assert_eq(server_create(&c, NULL, 0, NULL, &t_srv), 0, "server_create failed");
    cr_assert_eq(pthread_create(&t_srv_thread, NULL, t_server_main, NULL), 0);
}

static void
t_stop(void)
{
    char cmd[128];

    if (t_srv == NULL) {
        return;
    }
    server_stop(t_srv);
    pthread_join(t_srv_thread, NULL);
    server_destroy(t_srv);          /* the emulation aborts on a leaked queue pair or region */
    t_srv = NULL;
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", t_dir);
    (void)system(cmd);
}

TestSuite(rdma_path, .fini = t_stop, .timeout = 60);

/* ---- the client's requests ---- */

static const msgpack_object *
t_call(struct t_client *cl, struct harness_req *r, int *code)
{
    const msgpack_object *err, *res;
    uint32_t id = cl->msgid;

    cr_assert_eq(harness_call(&cl->conn, r, id, T_TIMEOUT, &err, &res), 0, "no reply");
    *code = harness_err_code(err);
    return res;
}

static void
t_begin(struct t_client *cl, struct harness_req *r, const char *method, uint32_t nparams)
{
    harness_req_begin(r, ++cl->msgid, method, nparams);
}

/* Connect over TCP, register the client's memory with the device, set up the queue pair. */
static void
t_client_open(struct t_client *cl)
{
    struct harness_req r;
    struct rdma_qp_info mine;
    struct rdma_seg seg;
    uint8_t enc[RDMA_QP_INFO_LEN];
    char why[256];
    int n = 0, code;
    const msgpack_object *res;

    memset(cl, 0, sizeof(*cl));
    cr_assert_eq(harness_conn_tcp(&cl->conn, t_port, T_TIMEOUT), 0);
    cr_assert_eq(rdma_dev_open(rdma_emu_ops(), "", 1, 0, &cl->dev, why, sizeof(why)), 0, "%s",
                 why);
    cl->buf = aligned_alloc(4096, T_CLIENT_BYTES);
    cr_assert_not_null(cl->buf);
    memset(cl->buf, 0, T_CLIENT_BYTES);
    cr_assert_eq(rdma_region_register(cl->dev, cl->buf, T_CLIENT_BYTES, T_ACCESS, &cl->reg), 0);
    /* the first region's rkey (the whole buffer's, unless the device splits it) */
    (void)rdma_region_segs(cl->reg, cl->buf, T_CLIENT_BYTES, &seg, 1, &n);
    cl->rkey = seg.rkey;
    cr_assert_eq(rdma_cq_create(cl->dev, 256, &cl->cq), 0);
    cr_assert_eq(rdma_qp_create(cl->cq, 64, &cl->qp, &mine), 0);

    harness_req_init(&r);
    rdma_qp_info_encode(&mine, enc);
    t_begin(cl, &r, "rdma_connect", 1);
    harness_pack_bin(&r.pk, enc, sizeof(enc));
    res = t_call(cl, &r, &code);
    cr_assert_eq(code, -1, "rdma_connect: error %d", code);
    cr_assert_eq(res->type, MSGPACK_OBJECT_BIN);
    cr_assert_eq(rdma_qp_info_decode((const uint8_t *)res->via.bin.ptr, res->via.bin.size,
                                     &cl->server_qp), 0);
    cr_assert_eq(rdma_qp_connect(cl->qp, &cl->server_qp), 0);
    harness_req_destroy(&r);
}

static void
t_client_close(struct t_client *cl)
{
    harness_conn_close(&cl->conn);
    rdma_qp_destroy(cl->qp);
    (void)rdma_cq_poll(cl->cq, (struct rdma_done[8]){0}, 8);
    rdma_cq_destroy(cl->cq);
    rdma_region_deregister(cl->reg);
    rdma_dev_close(cl->dev);
    free(cl->buf);
}

/*
 * register_buffer over rdma for [buf + off, + size) with rkey, and with the
 * client's queue-pair info qp unless NULL. Returns the id; *code is the
 * request's error code, or -1.
 */
static uint64_t
t_register_qp(struct t_client *cl, uint64_t off, uint64_t size, uint32_t rkey,
              const uint8_t *qp, int *code)
{
    struct harness_req r;
    const msgpack_object *res;
    uint64_t id;

    harness_req_init(&r);
    t_begin(cl, &r, "register_buffer", 1);
    msgpack_pack_map(&r.pk, qp != NULL ? 5 : 4);
    harness_pack_str(&r.pk, "transport");
    harness_pack_str(&r.pk, "rdma");
    harness_pack_str(&r.pk, "addr");
    msgpack_pack_uint64(&r.pk, (uint64_t)(uintptr_t)(cl->buf + off));
    harness_pack_str(&r.pk, "rkey");
    msgpack_pack_uint32(&r.pk, rkey);
    harness_pack_str(&r.pk, "size");
    msgpack_pack_uint64(&r.pk, size);
    if (qp != NULL) {
        harness_pack_str(&r.pk, "qp");
        harness_pack_bin(&r.pk, qp, RDMA_QP_INFO_LEN);
    }
    res = t_call(cl, &r, code);
    id = *code == -1 && res->type == MSGPACK_OBJECT_POSITIVE_INTEGER ? res->via.u64 : 0;
    harness_req_destroy(&r);
    return id;
}

/* register_buffer over rdma on a connected client: the id. */
static uint64_t
t_register(struct t_client *cl, uint64_t off, uint64_t size, uint32_t rkey)
{
    int code;
    uint64_t id = t_register_qp(cl, off, size, rkey, NULL, &code);

    cr_assert_eq(code, -1, "register_buffer over rdma: error %d", code);
    cr_assert_neq(id, 0);
    return id;
}

/*
 * batch_put_from or batch_get_into of n keys "<prefix><i>", key i in two
 * pieces of buffer id covering [i * stride, + size). Fills out[i].
 */
static void
t_xfer(struct t_client *cl, const char *method, const char *prefix, uint32_t n, uint64_t id,
       uint64_t stride, uint64_t size, int64_t *out)
{
    struct harness_req r;
    const msgpack_object *res;
    char key[64];
    int code;

    harness_req_init(&r);
    t_begin(cl, &r, method, 2);
    msgpack_pack_array(&r.pk, n);
    for (uint32_t i = 0; i < n; i++) {
        snprintf(key, sizeof(key), "%s%u", prefix, i);
        harness_pack_str(&r.pk, key);
    }
    msgpack_pack_array(&r.pk, n);
    for (uint32_t i = 0; i < n; i++) {
        uint64_t half = size / 3;

        msgpack_pack_array(&r.pk, 2);
        msgpack_pack_array(&r.pk, 3);
        msgpack_pack_uint64(&r.pk, id);
        msgpack_pack_uint64(&r.pk, i * stride);
        msgpack_pack_uint64(&r.pk, half);
        msgpack_pack_array(&r.pk, 3);
        msgpack_pack_uint64(&r.pk, id);
        msgpack_pack_uint64(&r.pk, i * stride + half);
        msgpack_pack_uint64(&r.pk, size - half);
    }
    res = t_call(cl, &r, &code);
    cr_assert_eq(code, -1, "%s: request error %d", method, code);
    cr_assert_eq(res->type, MSGPACK_OBJECT_ARRAY);
    cr_assert_eq(res->via.array.size, n);
    for (uint32_t i = 0; i < n; i++) {
        const msgpack_object *o = &res->via.array.ptr[i];

        out[i] = o->type == MSGPACK_OBJECT_NEGATIVE_INTEGER ? o->via.i64 : (int64_t)o->via.u64;
    }
    harness_req_destroy(&r);
}

static void
t_fill(uint8_t *p, size_t n, uint32_t seed)
{
    for (size_t i = 0; i < n; i++) {
        seed = seed * 1664525u + 1013904223u;
        p[i] = (uint8_t)(seed >> 24);
    }
}

/* One-sided from the client: post op on its own queue pair and wait for the completion. */
static int
t_onesided(struct t_client *cl, enum rdma_opcode op, uint8_t *local, uint64_t len,
           uint64_t raddr, uint32_t rkey)
{
    struct rdma_done d;
    int rc = rdma_qp_post(cl->qp, op, cl->reg, local, len, raddr, rkey, 42);

    if (rc != 0) {
        return rc;
    }
    for (int tries = 0; tries < 100; tries++) {
        struct pollfd p = {.fd = rdma_cq_fd(cl->cq), .events = POLLIN};

        (void)poll(&p, 1, 100);
        if (rdma_cq_poll(cl->cq, &d, 1) == 1) {
            return d.status;
        }
    }
    return -ETIMEDOUT;
}

/* ---- tests ---- */

Test(rdma_path, put_from_and_get_into_are_byte_exact)
{
    struct t_client cl;
    enum { N = 300 };                       /* more work requests than one queue pair holds */
    static int64_t res[N];
    const uint64_t size = 40 * KIB + 123, stride = 64 * KIB;
    const uint64_t in = 0, out = 32 * MIB;  /* the client's source and destination halves */
    struct harness_req r;
    const msgpack_object *h;
    int code;
    bool listed = false;

    t_start("64m", 0);
    t_client_open(&cl);
    harness_req_init(&r);
    t_begin(&cl, &r, "hello", 0);
    h = harness_map_get(t_call(&cl, &r, &code), "transports");
    cr_assert_not_null(h);
    for (uint32_t i = 0; i < h->via.array.size; i++) {
        listed = listed || harness_obj_is_str(&h->via.array.ptr[i], "rdma");
    }
    cr_assert(listed, "hello does not list rdma although it is up");
    harness_req_destroy(&r);

    t_fill(cl.buf + in, N * stride, 1);
    uint64_t src = t_register(&cl, in, 32 * MIB, cl.rkey);
    uint64_t dst = t_register(&cl, out, 32 * MIB, cl.rkey);
    t_xfer(&cl, "batch_put_from", "obj", N, src, stride, size, res);
    for (uint32_t i = 0; i < N; i++) {
        cr_assert_eq(res[i], 0, "put_from key %u: %lld", i, (long long)res[i]);
    }
    t_xfer(&cl, "batch_get_into", "obj", N, dst, stride, size, res);
    for (uint32_t i = 0; i < N; i++) {
        cr_assert_eq(res[i], (int64_t)size, "get_into key %u: %lld", i, (long long)res[i]);
        cr_assert_eq(memcmp(cl.buf + out + i * stride, cl.buf + in + i * stride, size), 0,
                     "key %u came back with other bytes", i);
        cr_assert_eq(cl.buf[out + i * stride + size], 0, "key %u: written past its value", i);
    }
    /* The same objects through the socket path agree. */
    harness_req_init(&r);
    t_begin(&cl, &r, "get", 1);
    harness_pack_str(&r.pk, "obj7");
    h = t_call(&cl, &r, &code);
    cr_assert_eq(h->type, MSGPACK_OBJECT_BIN);
    cr_assert_eq(h->via.bin.size, size);
    cr_assert_eq(memcmp(h->via.bin.ptr, cl.buf + in + 7 * stride, size), 0);
    harness_req_destroy(&r);
    t_client_close(&cl);
}

/*
 * The daemon's arena is registered as 2 MiB memory regions (the emulated
 * device allows 3 MiB in one): an object of several MiB lies in several, and
 * put_start / get_replica_list answer one [addr, length, rkey] per region.
 */
Test(rdma_path, client_driven_one_sided_put_and_read)
{
    struct t_client cl;
    struct harness_req r;
    const msgpack_object *res, *pieces;
    const uint64_t size = 5 * MIB + 5;
    uint64_t off = 0;
    uint32_t rkey0;
    bool several_rkeys = false;
    int code;

    t_start("64m", 3 * MIB);
    t_client_open(&cl);
    t_fill(cl.buf, size, 9);
    harness_req_init(&r);
    t_begin(&cl, &r, "put_start", 2);
    msgpack_pack_array(&r.pk, 1);
    harness_pack_str(&r.pk, "one-sided");
    msgpack_pack_array(&r.pk, 1);
    msgpack_pack_uint64(&r.pk, size);
    res = t_call(&cl, &r, &code);
    cr_assert_eq(code, -1);
    pieces = &res->via.array.ptr[0];
    cr_assert_eq(pieces->type, MSGPACK_OBJECT_ARRAY, "put_start over rdma: no pieces");
    rkey0 = (uint32_t)pieces->via.array.ptr[0].via.array.ptr[2].via.u64;
    for (uint32_t i = 0; i < pieces->via.array.size; i++) {
        const msgpack_object *p = pieces->via.array.ptr[i].via.array.ptr;

        cr_assert_leq(p[1].via.u64, 2 * MIB, "a piece longer than a memory region");
        several_rkeys = several_rkeys || (uint32_t)p[2].via.u64 != rkey0;

        cr_assert_eq(t_onesided(&cl, RDMA_OP_WRITE, cl.buf + off, p[1].via.u64, p[0].via.u64,
                                (uint32_t)p[2].via.u64), 0, "RDMA WRITE into the arena");
        off += p[1].via.u64;
    }
    cr_assert_eq(off, size, "the pieces do not add up to the object");
    cr_assert(several_rkeys, "a 5 MiB object in 2 MiB regions came with one rkey");
    t_begin(&cl, &r, "put_end", 1);
    msgpack_pack_array(&r.pk, 1);
    harness_pack_str(&r.pk, "one-sided");
    res = t_call(&cl, &r, &code);
    cr_assert_eq(res->via.array.ptr[0].via.u64, 0, "put_end");

    /* get_replica_list: read it back one-sided under its lease. */
    t_begin(&cl, &r, "get_replica_list", 1);
    msgpack_pack_array(&r.pk, 1);
    harness_pack_str(&r.pk, "one-sided");
    res = t_call(&cl, &r, &code);
    cr_assert_eq(code, -1);
    cr_assert(harness_obj_is_str(harness_map_get(&res->via.array.ptr[0], "transport"), "rdma"));
    pieces = harness_map_get(&res->via.array.ptr[0], "pieces");
    cr_assert_not_null(pieces);
    off = 0;
    for (uint32_t i = 0; i < pieces->via.array.size; i++) {
        const msgpack_object *p = pieces->via.array.ptr[i].via.array.ptr;

        cr_assert_eq(t_onesided(&cl, RDMA_OP_READ, cl.buf + 32 * MIB + off, p[1].via.u64,
                                p[0].via.u64, (uint32_t)p[2].via.u64), 0, "RDMA READ");
        off += p[1].via.u64;
    }
    cr_assert_eq(memcmp(cl.buf + 32 * MIB, cl.buf, size), 0, "the replica holds other bytes");
    harness_req_destroy(&r);
    t_client_close(&cl);
}

Test(rdma_path, bad_rkey_and_out_of_range_pieces_fail_only_what_they_must)
{
    struct t_client cl, other;
    int64_t res[4];

    t_start("64m", 0);
    t_client_open(&cl);
    t_fill(cl.buf, 4 * MIB, 3);
    uint64_t good = t_register(&cl, 0, 16 * MIB, cl.rkey);
    t_xfer(&cl, "batch_put_from", "k", 4, good, MIB, MIB, res);
    cr_assert(res[0] == 0 && res[3] == 0);

    /* A piece past the registered size: that key alone, and no byte is written. */
    uint64_t small = t_register(&cl, 16 * MIB, 2 * MIB + 100, cl.rkey);
    memset(cl.buf + 16 * MIB, 0xee, 4 * MIB);
    t_xfer(&cl, "batch_get_into", "k", 3, small, MIB, MIB, res);
    cr_assert_eq(res[0], (int64_t)MIB);
    cr_assert_eq(res[1], (int64_t)MIB);
    cr_assert_eq(res[2], -KV_INVALID_ARGUMENT, "an out-of-range piece: %lld", (long long)res[2]);
    for (size_t i = 2 * MIB; i < 4 * MIB; i++) {
        cr_assert_eq(cl.buf[16 * MIB + i], 0xee, "byte %zu outside the pieces was written", i);
    }

    /* A wrong rkey: the device refuses the access; the key fails, nothing else is hurt. */
    uint64_t bad = t_register(&cl, 24 * MIB, 4 * MIB, cl.rkey ^ 0x5a5a);
    t_xfer(&cl, "batch_get_into", "k", 1, bad, MIB, MIB, res);
    cr_assert_eq(res[0], -KV_FORBIDDEN, "bad rkey: %lld", (long long)res[0]);
    /* The queue pair is in error now: later transfers on it fail cleanly... */
    t_xfer(&cl, "batch_get_into", "k", 1, good, MIB, MIB, res);
    cr_assert_eq(res[0], -KV_UNAVAILABLE, "after the QP error: %lld", (long long)res[0]);
    t_xfer(&cl, "batch_put_from", "never", 1, good, MIB, MIB, res);
    cr_assert_eq(res[0], KV_UNAVAILABLE);
    /* ...and another connection's are untouched. */
    t_client_open(&other);
    uint64_t o = t_register(&other, 0, 8 * MIB, other.rkey);
    t_xfer(&other, "batch_get_into", "k", 2, o, MIB, MIB, res);
    cr_assert(res[0] == MIB && res[1] == MIB);
    cr_assert_eq(memcmp(other.buf, cl.buf, 2 * MIB), 0);
    t_xfer(&other, "batch_get_into", "never", 1, o, MIB, MIB, res);
    cr_assert_eq(res[0], -KV_NOT_FOUND, "a failed put_from left an object behind");
    t_client_close(&other);
    t_client_close(&cl);
}

Test(rdma_path, queue_pair_in_error_and_vanished_peer)
{
    struct t_client cl, peer;
    int64_t res[2];

    t_start("64m", 0);
    t_client_open(&cl);
    t_fill(cl.buf, 2 * MIB, 5);
    uint64_t id = t_register(&cl, 0, 16 * MIB, cl.rkey);
    t_xfer(&cl, "batch_put_from", "q", 2, id, MIB, MIB, res);
    cr_assert(res[0] == 0 && res[1] == 0);
    /* The daemon's queue pair of this connection goes into error. */
    cr_assert_eq(rdma_emu_qp_force_error(cl.server_qp.qpn), 0);
    t_xfer(&cl, "batch_get_into", "q", 2, id, MIB, MIB, res);
    cr_assert_eq(res[0], -KV_UNAVAILABLE);
    cr_assert_eq(res[1], -KV_UNAVAILABLE);

    /* A peer whose queue pair is gone: the daemon's WRITEs are not answered. */
    t_client_open(&peer);
    uint64_t pid = t_register(&peer, 0, 16 * MIB, peer.rkey);
    rdma_qp_destroy(peer.qp);
    peer.qp = NULL;
    t_xfer(&peer, "batch_get_into", "q", 2, pid, MIB, MIB, res);
    cr_assert(res[0] < 0 && res[1] < 0, "a vanished peer: %lld %lld", (long long)res[0],
              (long long)res[1]);
    t_client_close(&peer);
    t_client_close(&cl);
}

Test(rdma_path, close_with_work_in_flight_leaks_nothing)
{
    struct t_client cl, next;
    struct harness_req r;
    int64_t res[1];
    enum { N = 200 };
    char key[32];

    t_start("64m", 0);
    t_client_open(&cl);
    uint64_t id = t_register(&cl, 0, 32 * MIB, cl.rkey);
    t_fill(cl.buf, 32 * MIB, 11);
    uint8_t *cl_src = malloc(32 * MIB);
    cr_assert_not_null(cl_src);
    memcpy(cl_src, cl.buf, 32 * MIB);
    /* A big put_from sent, and the connection closed without reading the reply. */
    harness_req_init(&r);
    t_begin(&cl, &r, "batch_put_from", 2);
    msgpack_pack_array(&r.pk, N);
    for (int i = 0; i < N; i++) {
        snprintf(key, sizeof(key), "gone%d", i);
        harness_pack_str(&r.pk, key);
    }
    msgpack_pack_array(&r.pk, N);
    for (int i = 0; i < N; i++) {
        msgpack_pack_array(&r.pk, 1);
        msgpack_pack_array(&r.pk, 3);
        msgpack_pack_uint64(&r.pk, id);
        msgpack_pack_uint64(&r.pk, (uint64_t)i * 128 * KIB);
        msgpack_pack_uint64(&r.pk, 128 * KIB);
    }
    cr_assert_eq(harness_conn_send(&cl.conn, r.sb.data, r.sb.size, T_TIMEOUT), 0);
    harness_req_destroy(&r);
    t_client_close(&cl);

    /* The daemon goes on; each key is either whole or absent, never torn. */
    t_client_open(&next);
    harness_req_init(&r);
    for (int i = 0; i < N; i += 37) {
        const msgpack_object *v;
        int code;

        snprintf(key, sizeof(key), "gone%d", i);
        t_begin(&next, &r, "get", 1);
        harness_pack_str(&r.pk, key);
        v = t_call(&next, &r, &code);
        cr_assert_eq(code, -1);
        if (v->type == MSGPACK_OBJECT_NIL) {
            continue;
        }
        cr_assert_eq(v->type, MSGPACK_OBJECT_BIN);
        cr_assert_eq(v->via.bin.size, 128 * KIB);
        cr_assert_eq(memcmp(v->via.bin.ptr, cl_src + (size_t)i * 128 * KIB, 128 * KIB), 0,
                     "%s: torn or wrong bytes", key);
    }
    harness_req_destroy(&r);
    (void)res;
    free(cl_src);
    t_client_close(&next);
    /* t_stop then destroys the server: the emulation aborts if a queue pair leaked. */
}

/*
 * The setup register_buffer carries: hello {"rdma": true} answers the daemon's
 * queue-pair info, and the client's comes with its first RDMA buffer (opts.qp).
 */
Test(rdma_path, queue_pair_through_hello_and_register_buffer)
{
    struct t_client cl;
    struct harness_req r;
    struct rdma_qp_info mine;
    struct rdma_seg seg;
    uint8_t enc[RDMA_QP_INFO_LEN];
    const msgpack_object *res, *info;
    char why[256];
    int n = 0, code;
    int64_t out[2];

    t_start("64m", 0);
    memset(&cl, 0, sizeof(cl));
    cr_assert_eq(harness_conn_tcp(&cl.conn, t_port, T_TIMEOUT), 0);
    cr_assert_eq(rdma_dev_open(rdma_emu_ops(), "", 1, 0, &cl.dev, why, sizeof(why)), 0);
    cl.buf = aligned_alloc(4096, T_CLIENT_BYTES);
    cr_assert_not_null(cl.buf);
    t_fill(cl.buf, 2 * MIB, 21);
    memset(cl.buf + 2 * MIB, 0, 2 * MIB);
    cr_assert_eq(rdma_region_register(cl.dev, cl.buf, T_CLIENT_BYTES, T_ACCESS, &cl.reg), 0);
    cr_assert_eq(rdma_region_segs(cl.reg, cl.buf, T_CLIENT_BYTES, &seg, 1, &n), 0);
    cl.rkey = seg.rkey;
    cr_assert_eq(rdma_cq_create(cl.dev, 256, &cl.cq), 0);
    cr_assert_eq(rdma_qp_create(cl.cq, 64, &cl.qp, &mine), 0);
    rdma_qp_info_encode(&mine, enc);
    harness_req_init(&r);

    /* opts.qp before the daemon's queue pair exists: refused, nothing registered. */
    (void)t_register_qp(&cl, 0, 4 * MIB, cl.rkey, enc, &code);
    cr_assert_eq(code, KV_INVALID_ARGUMENT, "opts.qp before hello: %d", code);

    t_begin(&cl, &r, "hello", 1);
    msgpack_pack_map(&r.pk, 1);
    harness_pack_str(&r.pk, "rdma");
    msgpack_pack_true(&r.pk);
    res = t_call(&cl, &r, &code);
    cr_assert_eq(code, -1);
    info = harness_map_get(res, "rdma_qp");
    cr_assert(info != NULL && info->type == MSGPACK_OBJECT_BIN, "hello has no rdma_qp");
    cr_assert_eq(rdma_qp_info_decode((const uint8_t *)info->via.bin.ptr, info->via.bin.size,
                                     &cl.server_qp), 0);
    cr_assert_eq(rdma_qp_connect(cl.qp, &cl.server_qp), 0);

    uint64_t id = t_register_qp(&cl, 0, 4 * MIB, cl.rkey, enc, &code);
    cr_assert_eq(code, -1, "register_buffer with opts.qp: %d", code);

    /* Connected once: rdma_connect again is refused. */
    t_begin(&cl, &r, "rdma_connect", 1);
    harness_pack_bin(&r.pk, enc, sizeof(enc));
    (void)t_call(&cl, &r, &code);
    cr_assert_eq(code, KV_INVALID_ARGUMENT);
    harness_req_destroy(&r);

    t_xfer(&cl, "batch_put_from", "h", 2, id, MIB, MIB, out);
    cr_assert(out[0] == 0 && out[1] == 0);
    uint64_t back = t_register(&cl, 2 * MIB, 2 * MIB, cl.rkey);
    t_xfer(&cl, "batch_get_into", "h", 2, back, MIB, MIB, out);
    cr_assert(out[0] == (int64_t)MIB && out[1] == (int64_t)MIB);
    cr_assert_eq(memcmp(cl.buf + 2 * MIB, cl.buf, 2 * MIB), 0, "came back with other bytes");
    t_client_close(&cl);
}

/* libkvstash's RDMA side against the same daemon: enable, register, put_from, get_into. */
Test(rdma_path, client_library_moves_values_over_rdma)
{
    struct kvstash *c = NULL, *plain = NULL;
    struct kvstash_buffer *b = NULL;
    enum { N = 12 };
    static uint8_t mem[16 * MIB] __attribute__((aligned(4096)));
    struct kvstash_piece pc[N][2];
    const struct kvstash_piece *pieces[N];
    size_t npieces[N], klens[N];
    const void *keys[N];
    char names[N][16];
    int codes[N];
    int64_t got[N];
    char addr[64];
    const size_t size = 300 * KIB + 7;

    t_start("64m", 0);
    snprintf(addr, sizeof(addr), "127.0.0.1:%d", t_port);
    cr_assert_eq(harness_client(addr, 2000, &c), 0);
    cr_assert_eq(kvstash_register_rdma_buffer(c, mem, sizeof(mem), &b), KVSTASH_EINVAL,
                 "a buffer before kvstash_rdma_enable");
    cr_assert_eq(kvstash_rdma_enable(c, "", 1, 0), 0, "%s", kvstash_last_error(c));
    cr_assert_eq(kvstash_register_rdma_buffer(c, mem, sizeof(mem), &b), 0, "%s",
                 kvstash_last_error(c));
    {
        struct kvstash_place pl[KVSTASH_MAX_PLACES];
        size_t np;

        cr_assert_eq(kvstash_put_start(c, "x", 1, 10, pl, &np), KVSTASH_EINVAL,
                     "arena places on a connection that uses RDMA");
        cr_assert_eq(kvstash_rdma_enable(c, "", 1, 0), KVSTASH_EINVAL, "enabled twice");
    }
    t_fill(mem, N * 512 * KIB, 33);
    for (int i = 0; i < N; i++) {
        snprintf(names[i], sizeof(names[i]), "lib%d", i);
        keys[i] = names[i];
        klens[i] = strlen(names[i]);
        pc[i][0] = (struct kvstash_piece){b, (uint64_t)i * 512 * KIB, 1000};
        pc[i][1] = (struct kvstash_piece){b, (uint64_t)i * 512 * KIB + 1000, size - 1000};
        pieces[i] = pc[i];
        npieces[i] = 2;
    }
    cr_assert_eq(kvstash_batch_put_from(c, N, keys, klens, pieces, npieces, codes), 0, "%s",
                 kvstash_last_error(c));
    for (int i = 0; i < N; i++) {
        cr_assert_eq(codes[i], 0, "%s: %d", names[i], codes[i]);
        pc[i][0].offset += 8 * MIB;
        pc[i][1].offset += 8 * MIB;
    }
    cr_assert_eq(kvstash_batch_get_into(c, N, keys, klens, pieces, npieces, got), 0);
    for (int i = 0; i < N; i++) {
        cr_assert_eq(got[i], (int64_t)size);
        cr_assert_eq(memcmp(mem + 8 * MIB + (size_t)i * 512 * KIB, mem + (size_t)i * 512 * KIB,
                            size), 0, "%s came back with other bytes", names[i]);
    }
    /* Without RDMA enabled, a connection cannot register such a buffer; TCP still reads. */
    cr_assert_eq(harness_client(addr, 2000, &plain), 0);
    static uint8_t back[300 * KIB + 7];
    size_t vlen = 0;
    cr_assert_eq(kvstash_get(plain, "lib3", 4, back, sizeof(back), &vlen), 0);
    cr_assert_eq(vlen, size);
    cr_assert_eq(memcmp(back, mem + 3 * 512 * KIB, size), 0);
    kvstash_close(plain);
    cr_assert_eq(kvstash_unregister_buffer(c, b), 0);
    kvstash_close(c);
}
