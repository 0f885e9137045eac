/*
 * test_rdma_port: the RDMA data port against the loopback emulation, as the
 * daemon (a "server" side exposing its arena) and the client library (a
 * "client" side with its own buffer) would use it: QP setup from exchanged
 * rdma_qp_info, byte-exact one-sided WRITE and READ across MR boundaries,
 * completions through the channel fd, the error completions RC gives (bad
 * rkey, out-of-range address, forced error, vanished peer) without touching
 * a byte they must not, the work-request cap, and device-open reasons.
 * Runs in builds with and without libibverbs; no hardware, no network.
 */
#include <criterion/criterion.h>

#include "kverr.h"
#include "rdma_emu.h"
#include "rdma_port.h"

#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define KiB (1024ull)
#define MiB (1024ull * 1024ull)
#define T_ALL_ACCESS (RDMA_ACCESS_LOCAL_WRITE | RDMA_ACCESS_REMOTE_READ | RDMA_ACCESS_REMOTE_WRITE)

/* One end: what the daemon or the client library would hold. */
struct t_side {
    struct rdma_dev *dev;
    struct rdma_cq *cq;
    struct rdma_qp *qp;
    struct rdma_qp_info info;
    struct rdma_region *reg;
    uint8_t *buf;
    uint64_t len;
};

static void
t_init(void)
{
    rdma_emu_reset();
}

TestSuite(rdma_port, .init = t_init, .timeout = 30);

static void
t_side_open(struct t_side *s, uint64_t len, uint8_t fill)
{
    char why[256];

    memset(s, 0, sizeof(*s));
    cr_assert_eq(rdma_dev_open(rdma_emu_ops(), "", 1, 0, &s->dev, why, sizeof(why)), 0, "%s",
                 why);
    s->len = len;
    s->buf = aligned_alloc(4096, len);
    cr_assert_not_null(s->buf);
    memset(s->buf, fill, len);
    cr_assert_eq(rdma_region_register(s->dev, s->buf, len, T_ALL_ACCESS, &s->reg), 0);
    cr_assert_eq(rdma_cq_create(s->dev, 256, &s->cq), 0);
}

static void
t_side_close(struct t_side *s)
{
    rdma_qp_destroy(s->qp);
    rdma_cq_destroy(s->cq);
    rdma_region_deregister(s->reg);
    rdma_dev_close(s->dev);
    free(s->buf);
}

/* t_pair: a QP on each side, connected through the encoded info, as over the wire. */
static void
t_pair(struct t_side *a, struct t_side *b, uint32_t a_max_wr)
{
    uint8_t wire[RDMA_QP_INFO_LEN];
    struct rdma_qp_info got;

    cr_assert_eq(rdma_qp_create(a->cq, a_max_wr, &a->qp, &a->info), 0);
    cr_assert_eq(rdma_qp_create(b->cq, 64, &b->qp, &b->info), 0);
    rdma_qp_info_encode(&a->info, wire);
    cr_assert_eq(rdma_qp_info_decode(wire, sizeof(wire), &got), 0);
    cr_assert_eq(rdma_qp_connect(b->qp, &got), 0);
    rdma_qp_info_encode(&b->info, wire);
    cr_assert_eq(rdma_qp_info_decode(wire, sizeof(wire), &got), 0);
    cr_assert_eq(rdma_qp_connect(a->qp, &got), 0);
}

static void
t_unpair(struct t_side *a, struct t_side *b)
{
    rdma_qp_destroy(a->qp);
    rdma_qp_destroy(b->qp);
    a->qp = NULL;
    b->qp = NULL;
}

/*
 * t_wait: wait on the CQ's fd (and only there) until `want` dones came, or
 * a second passes with the fd quiet. Polls with room for a whole CQ, so a
 * poll never comes back full and the CQ is always re-armed (a full one
 * would have to be called again before waiting). Returns how many came.
 */
static int
t_wait(struct t_side *s, struct rdma_done *done, int want)
{
    struct rdma_done all[256];
    int n = 0;

    while (n < want) {
        struct pollfd p = {.fd = rdma_cq_fd(s->cq), .events = POLLIN};
        int got;

        if (poll(&p, 1, 1000) != 1) {
            break;
        }
        got = rdma_cq_poll(s->cq, all, 256);
        cr_assert(got >= 0 && got < 256, "rdma_cq_poll: %d", got);
        cr_assert_leq(n + got, want, "more dones than operations");
        memcpy(done + n, all, (size_t)got * sizeof(all[0]));
        n += got;
    }
    return n;
}

static int
t_fd_readable(const struct t_side *s)
{
    struct pollfd p = {.fd = rdma_cq_fd(s->cq), .events = POLLIN};

    return poll(&p, 1, 0) == 1;
}

static void
t_pattern(uint8_t *p, uint64_t len, uint64_t seed)
{
    for (uint64_t i = 0; i < len; i++) {
        seed = seed * 6364136223846793005ull + 1442695040888963407ull;
        p[i] = (uint8_t)(seed >> 56);
    }
}

static int
t_all(const uint8_t *p, uint64_t len, uint8_t v)
{
    for (uint64_t i = 0; i < len; i++) {
        if (p[i] != v) {
            return 0;
        }
    }
    return 1;
}

/*
 * t_transfer: move len bytes between client offset coff and server offset
 * soff, one post per server segment (as a client handed the daemon's segs
 * would), and wait for every done. Checks each done.
 */
static void
t_transfer(struct t_side *c, struct t_side *s, enum rdma_opcode op, uint64_t coff, uint64_t soff,
           uint64_t len)
{
    struct rdma_seg seg[64];
    struct rdma_done done[64];
    int nseg;

    cr_assert_eq(rdma_region_segs(s->reg, s->buf + soff, len, seg, 64, &nseg), 0);
    for (int i = 0; i < nseg; i++) {
        cr_assert_eq(rdma_qp_post(c->qp, op, c->reg, c->buf + coff, seg[i].len, seg[i].addr,
                                  seg[i].rkey, 100 + (uint64_t)i),
                     0);
        coff += seg[i].len;
    }
    cr_assert_eq(t_wait(c, done, nseg), nseg, "not every done came through the fd");
    for (int i = 0; i < nseg; i++) {
        cr_assert_eq(done[i].wr_id, 100 + (uint64_t)i, "dones out of order or duplicated");
        cr_assert_eq(done[i].status, 0, "piece %d: %s", i, rdma_wc_status_str(done[i].wc));
        cr_assert_eq(done[i].opcode, op);
        cr_assert_eq(done[i].len, seg[i].len);
    }
}

Test(rdma_port, write_then_read_is_byte_exact)
{
    struct t_side s;
    struct t_side c;
    uint64_t len = 6 * MiB + 123;
    uint64_t soff = 4 * KiB + 17;
    uint64_t coff = 1 * MiB + 5;
    uint8_t *want = malloc(len);

    /* 1 MiB MRs on both sides: the transfer is split on the server's and the client's. */
    rdma_emu_set_max_mr_size(1 * MiB);
    t_side_open(&s, 8 * MiB, 0xaa);
    t_side_open(&c, 16 * MiB, 0x00);
    t_pair(&c, &s, 64);

    t_pattern(want, len, 1);
    memcpy(c.buf + coff, want, len);
    t_transfer(&c, &s, RDMA_OP_WRITE, coff, soff, len);
    cr_assert(memcmp(s.buf + soff, want, len) == 0, "WRITE did not land byte-exact");
    cr_assert(t_all(s.buf, soff, 0xaa), "WRITE touched bytes before the range");
    cr_assert(t_all(s.buf + soff + len, s.len - soff - len, 0xaa), "WRITE touched bytes after");

    memset(c.buf, 0, c.len);
    t_transfer(&c, &s, RDMA_OP_READ, 8 * MiB - 3, soff, len);
    cr_assert(memcmp(c.buf + 8 * MiB - 3, want, len) == 0, "READ did not land byte-exact");
    cr_assert(t_all(c.buf, 8 * MiB - 3, 0), "READ touched local bytes before the range");
    cr_assert_eq(rdma_qp_failed(c.qp), 0);
    cr_assert_eq(rdma_qp_failed(s.qp), 0);

    t_side_close(&c);
    t_side_close(&s);
    free(want);
}

Test(rdma_port, completions_wake_the_channel_fd)
{
    struct t_side s;
    struct t_side c;
    struct rdma_done done[4];
    struct rdma_seg seg;
    int n;

    t_side_open(&s, 1 * MiB, 0);
    t_side_open(&c, 1 * MiB, 1);
    t_pair(&c, &s, 16);
    cr_assert_eq(rdma_region_segs(s.reg, s.buf, 4096, &seg, 1, &n), 0);
    cr_assert_not(t_fd_readable(&c), "the fd is readable with nothing posted");

    for (int round = 0; round < 3; round++) {
        cr_assert_eq(rdma_qp_post(c.qp, RDMA_OP_WRITE, c.reg, c.buf, 4096, seg.addr, seg.rkey,
                                  (uint64_t)round), 0);
        cr_assert(t_fd_readable(&c), "round %d: a completion did not wake the fd", round);
        cr_assert_eq(rdma_cq_poll(c.cq, done, 4), 1);
        cr_assert_eq(done[0].wr_id, (uint64_t)round);
        cr_assert_eq(done[0].status, 0);
        cr_assert_not(t_fd_readable(&c), "round %d: the fd stays readable after the poll", round);
        cr_assert_eq(rdma_cq_poll(c.cq, done, 4), 0);
    }

    /* Polled one at a time, nothing is lost: the rest is still there on the next call. */
    for (int i = 0; i < 3; i++) {
        cr_assert_eq(rdma_qp_post(c.qp, RDMA_OP_READ, c.reg, c.buf, 4096, seg.addr, seg.rkey,
                                  10 + (uint64_t)i), 0);
    }
    for (int i = 0; i < 3; i++) {
        cr_assert_eq(rdma_cq_poll(c.cq, done, 1), 1, "done %d lost", i);
        cr_assert_eq(done[0].wr_id, 10 + (uint64_t)i);
    }
    cr_assert_eq(rdma_cq_poll(c.cq, done, 4), 0);
    t_side_close(&c);
    t_side_close(&s);
}

Test(rdma_port, arena_splits_at_power_of_two_boundaries)
{
    struct t_side s;
    struct t_side c;
    struct rdma_seg seg[8];
    uint32_t lkey;
    uint64_t len = 1 * MiB;
    uint8_t *want = malloc(len);
    int n;

    /* 3 MiB allowed: 2 MiB MRs, the largest power of two that fits. */
    rdma_emu_set_max_mr_size(3 * MiB);
    t_side_open(&s, 9 * MiB, 0x55);
    t_side_open(&c, 4 * MiB, 0);

    cr_assert_eq(rdma_region_segs(s.reg, s.buf, s.len, seg, 8, &n), 0);
    cr_assert_eq(n, 5, "9 MiB in 2 MiB MRs is 5 MRs, not %d", n);
    for (int i = 0; i < n; i++) {
        cr_assert_eq(seg[i].addr, (uintptr_t)s.buf + (uint64_t)i * 2 * MiB);
        cr_assert_eq(seg[i].len, i < 4 ? 2 * MiB : 1 * MiB);
        for (int j = 0; j < i; j++) {
            cr_assert_neq(seg[i].rkey, seg[j].rkey);
        }
    }
    /* Every aligned power-of-two extent up to 2 MiB sits inside one MR. */
    for (uint64_t size = 4 * KiB; size <= 2 * MiB; size *= 2) {
        for (uint64_t off = 0; off + size <= s.len; off += size * 3) {
            cr_assert_eq(rdma_region_lkey(s.reg, s.buf + off, size, &lkey), 0,
                         "extent %llu+%llu crosses an MR", (unsigned long long)off,
                         (unsigned long long)size);
        }
    }
    cr_assert_eq(rdma_region_lkey(s.reg, s.buf + 2 * MiB - 4096, 8192, &lkey),
                 KV_INVALID_ARGUMENT);
    cr_assert_eq(rdma_region_lkey(s.reg, s.buf + s.len - 4096, 8192, &lkey), KV_NOT_FOUND);
    cr_assert_eq(rdma_region_lkey(s.reg, s.buf - 1, 2, &lkey), KV_NOT_FOUND);
    cr_assert_eq(rdma_region_segs(s.reg, s.buf + 2 * MiB - 4096, 8192, seg, 1, &n), KV_NO_SPACE);
    cr_assert_eq(n, 2);

    /* A transfer across boundaries on both sides stays byte-exact. */
    t_pair(&c, &s, 16);
    t_pattern(want, len, 7);
    memcpy(c.buf + 2 * MiB - 100, want, len);
    t_transfer(&c, &s, RDMA_OP_WRITE, 2 * MiB - 100, 4 * MiB - len / 2, len);
    cr_assert(memcmp(s.buf + 4 * MiB - len / 2, want, len) == 0);
    cr_assert(t_all(s.buf, 4 * MiB - len / 2, 0x55));
    cr_assert(t_all(s.buf + 4 * MiB + len / 2, s.len - 4 * MiB - len / 2, 0x55));
    memset(c.buf, 0, c.len);
    t_transfer(&c, &s, RDMA_OP_READ, 2 * MiB - 7, 4 * MiB - len / 2, len);
    cr_assert(memcmp(c.buf + 2 * MiB - 7, want, len) == 0);

    t_side_close(&c);
    t_side_close(&s);
    free(want);

    /* max_mr_size at least the region: one MR. */
    rdma_emu_set_max_mr_size(2 * MiB);
    t_side_open(&s, 2 * MiB, 0);
    cr_assert_eq(rdma_region_segs(s.reg, s.buf, s.len, seg, 8, &n), 0);
    cr_assert_eq(n, 1);
    t_side_close(&s);
}

Test(rdma_port, bad_rkey_fails_the_qp_and_flushes_the_rest)
{
    struct t_side s;
    struct t_side c;
    struct rdma_done done[4];
    struct rdma_seg seg;
    int n;

    t_side_open(&s, 1 * MiB, 0x33);
    t_side_open(&c, 1 * MiB, 0x77);
    t_pair(&c, &s, 16);
    cr_assert_eq(rdma_region_segs(s.reg, s.buf, s.len, &seg, 1, &n), 0);

    /* Both posted before any completion is seen, as a pipelined client would. */
    cr_assert_eq(rdma_qp_post(c.qp, RDMA_OP_WRITE, c.reg, c.buf, 4096, seg.addr,
                              seg.rkey ^ 0x5a5a00, 1), 0);
    cr_assert_eq(rdma_qp_post(c.qp, RDMA_OP_WRITE, c.reg, c.buf, 4096, seg.addr + 8192,
                              seg.rkey, 2), 0);
    cr_assert_eq(t_wait(&c, done, 2), 2);
    cr_assert_eq(done[0].wr_id, 1);
    cr_assert_eq(done[0].wc, RDMA_WC_REM_ACCESS_ERR, "got %s", rdma_wc_status_str(done[0].wc));
    cr_assert_eq(done[0].status, KV_FORBIDDEN);
    cr_assert_eq(done[0].len, 0);
    cr_assert_eq(done[1].wr_id, 2);
    cr_assert_eq(done[1].wc, RDMA_WC_FLUSH_ERR, "got %s", rdma_wc_status_str(done[1].wc));
    cr_assert_eq(done[1].status, KV_UNAVAILABLE);
    cr_assert(t_all(s.buf, s.len, 0x33), "a failed or flushed WRITE changed the server");

    cr_assert_eq(rdma_qp_failed(c.qp), KV_FORBIDDEN);
    cr_assert_eq(rdma_qp_post(c.qp, RDMA_OP_WRITE, c.reg, c.buf, 4096, seg.addr, seg.rkey, 3),
                 KV_UNAVAILABLE, "a failed QP accepted a post");
    cr_assert_eq(rdma_cq_poll(c.cq, done, 4), 0);
    t_side_close(&c);
    t_side_close(&s);
}

Test(rdma_port, out_of_range_remote_touches_nothing)
{
    struct t_side s;
    struct t_side c;
    struct rdma_done done[2];
    struct rdma_region *mid;
    struct rdma_seg seg;
    uint64_t guard = 4096;
    uint64_t rlen = 64 * KiB;
    int n;

    /* The server exposes only the middle of its buffer; guard bytes on both sides. */
    t_side_open(&s, 1 * MiB, 0xee);
    t_side_open(&c, 1 * MiB, 0x99);
    cr_assert_eq(rdma_region_register(s.dev, s.buf + guard, rlen, T_ALL_ACCESS, &mid), 0);
    memset(s.buf + guard, 0x11, rlen);
    cr_assert_eq(rdma_region_segs(mid, s.buf + guard, rlen, &seg, 1, &n), 0);

    t_pair(&c, &s, 16);
    cr_assert_eq(rdma_qp_post(c.qp, RDMA_OP_WRITE, c.reg, c.buf, 8192, seg.addr + rlen - 4096,
                              seg.rkey, 1), 0);
    cr_assert_eq(t_wait(&c, done, 1), 1);
    cr_assert_eq(done[0].wc, RDMA_WC_REM_ACCESS_ERR, "got %s", rdma_wc_status_str(done[0].wc));
    cr_assert_eq(rdma_qp_failed(c.qp), KV_FORBIDDEN);
    cr_assert(t_all(s.buf, guard, 0xee), "the guard before the region was written");
    cr_assert(t_all(s.buf + guard, rlen, 0x11), "a refused WRITE wrote part of it");
    cr_assert(t_all(s.buf + guard + rlen, s.len - guard - rlen, 0xee),
              "the guard after the region was written");
    t_unpair(&c, &s);

    /* A READ starting before the region: refused, the local buffer untouched. */
    t_pair(&c, &s, 16);
    cr_assert_eq(rdma_qp_post(c.qp, RDMA_OP_READ, c.reg, c.buf, 128, seg.addr - 64, seg.rkey, 2),
                 0);
    cr_assert_eq(t_wait(&c, done, 1), 1);
    cr_assert_eq(done[0].status, KV_FORBIDDEN);
    cr_assert(t_all(c.buf, c.len, 0x99), "a refused READ wrote into the local buffer");

    /* The same range within bounds works on a fresh QP. */
    t_unpair(&c, &s);
    t_pair(&c, &s, 16);
    cr_assert_eq(rdma_qp_post(c.qp, RDMA_OP_READ, c.reg, c.buf, 128, seg.addr, seg.rkey, 3), 0);
    cr_assert_eq(t_wait(&c, done, 1), 1);
    cr_assert_eq(done[0].status, 0);
    cr_assert(t_all(c.buf, 128, 0x11));

    t_unpair(&c, &s);
    rdma_region_deregister(mid);
    t_side_close(&c);
    t_side_close(&s);
}

Test(rdma_port, forced_error_flushes)
{
    struct t_side s;
    struct t_side c;
    struct rdma_done done[4];
    struct rdma_seg seg;
    int n;

    t_side_open(&s, 1 * MiB, 0);
    t_side_open(&c, 1 * MiB, 0x42);
    t_pair(&c, &s, 16);
    cr_assert_eq(rdma_region_segs(s.reg, s.buf, s.len, &seg, 1, &n), 0);
    cr_assert_eq(rdma_emu_qp_force_error(0xfffffe), KV_NOT_FOUND);
    cr_assert_eq(rdma_emu_qp_force_error(c.info.qpn), 0);

    for (uint64_t i = 0; i < 3; i++) {
        cr_assert_eq(rdma_qp_post(c.qp, RDMA_OP_WRITE, c.reg, c.buf, 4096, seg.addr, seg.rkey, i),
                     0);
    }
    cr_assert_eq(t_wait(&c, done, 3), 3);
    for (int i = 0; i < 3; i++) {
        cr_assert_eq(done[i].wc, RDMA_WC_FLUSH_ERR, "got %s", rdma_wc_status_str(done[i].wc));
        cr_assert_eq(done[i].status, KV_UNAVAILABLE);
    }
    cr_assert(t_all(s.buf, s.len, 0), "a flushed WRITE reached the server");
    cr_assert_eq(rdma_qp_failed(c.qp), KV_UNAVAILABLE);
    cr_assert_eq(rdma_qp_failed(s.qp), 0, "the peer's QP is not in error");
    t_side_close(&c);
    t_side_close(&s);
}

Test(rdma_port, vanished_peer_is_an_error_not_a_crash)
{
    struct t_side s;
    struct t_side c;
    struct rdma_done done[8];
    struct rdma_seg seg;
    int n;

    t_side_open(&s, 1 * MiB, 0);
    t_side_open(&c, 1 * MiB, 0x42);
    t_pair(&c, &s, 16);
    cr_assert_eq(rdma_region_segs(s.reg, s.buf, s.len, &seg, 1, &n), 0);
    for (uint64_t i = 0; i < 4; i++) {
        cr_assert_eq(rdma_qp_post(c.qp, RDMA_OP_WRITE, c.reg, c.buf, 4096, seg.addr + i * 4096,
                                  seg.rkey, i), 0);
    }
    cr_assert_eq(t_wait(&c, done, 4), 4);

    /* The daemon side drops the connection mid-stream. */
    rdma_qp_destroy(s.qp);
    s.qp = NULL;
    for (uint64_t i = 4; i < 7; i++) {
        cr_assert_eq(rdma_qp_post(c.qp, RDMA_OP_WRITE, c.reg, c.buf, 4096, seg.addr + i * 4096,
                                  seg.rkey, i), 0);
    }
    cr_assert_eq(t_wait(&c, done, 3), 3);
    cr_assert_eq(done[0].wc, RDMA_WC_RETRY_EXC_ERR, "got %s", rdma_wc_status_str(done[0].wc));
    cr_assert_eq(done[0].status, KV_TIMEOUT);
    cr_assert_eq(done[1].wc, RDMA_WC_FLUSH_ERR);
    cr_assert_eq(done[2].wc, RDMA_WC_FLUSH_ERR);
    cr_assert_eq(rdma_qp_failed(c.qp), KV_TIMEOUT);
    cr_assert(t_all(s.buf + 4 * 4096, s.len - 4 * 4096, 0), "a write after the peer left landed");
    t_side_close(&c);
    t_side_close(&s);
}

Test(rdma_port, wr_cap_says_eagain_until_polled)
{
    struct t_side s;
    struct t_side c;
    struct rdma_done done[8];
    struct rdma_seg seg;
    int n;

    /* 64 KiB client MRs, so a 320 KiB transfer needs five work requests. */
    t_side_open(&s, 1 * MiB, 0);
    rdma_emu_set_max_mr_size(64 * KiB);
    t_side_open(&c, 1 * MiB, 0x42);
    t_pair(&c, &s, 4);
    cr_assert_eq(rdma_region_segs(s.reg, s.buf, s.len, &seg, 1, &n), 0);

    cr_assert_eq(rdma_qp_post(c.qp, RDMA_OP_WRITE, c.reg, c.buf, 320 * KiB, seg.addr, seg.rkey,
                              99), KV_TOO_LARGE);
    for (uint64_t i = 0; i < 3; i++) {
        cr_assert_eq(rdma_qp_post(c.qp, RDMA_OP_WRITE, c.reg, c.buf, 4096, seg.addr, seg.rkey, i),
                     0);
    }
    /* Two pieces (across a client MR boundary) do not fit the one slot left. */
    cr_assert_eq(rdma_qp_post(c.qp, RDMA_OP_WRITE, c.reg, c.buf + 60 * KiB, 8192, seg.addr,
                              seg.rkey, 50), -EAGAIN);
    cr_assert_eq(rdma_qp_post(c.qp, RDMA_OP_WRITE, c.reg, c.buf, 4096, seg.addr, seg.rkey, 3), 0);
    cr_assert_eq(rdma_qp_post(c.qp, RDMA_OP_WRITE, c.reg, c.buf, 4096, seg.addr, seg.rkey, 4),
                 -EAGAIN);
    cr_assert_eq(t_wait(&c, done, 4), 4);
    for (int i = 0; i < 4; i++) {
        cr_assert_eq(done[i].wr_id, (uint64_t)i);
        cr_assert_eq(done[i].status, 0);
    }
    cr_assert_eq(rdma_qp_post(c.qp, RDMA_OP_WRITE, c.reg, c.buf + 60 * KiB, 8192, seg.addr,
                              seg.rkey, 50), 0, "still full after every done was polled");
    cr_assert_eq(rdma_qp_post(c.qp, RDMA_OP_WRITE, c.reg, c.buf, 4096, seg.addr, seg.rkey, 4), 0);
    cr_assert_eq(t_wait(&c, done, 2), 2);
    cr_assert_eq(done[0].wr_id, 50);
    cr_assert_eq(done[0].len, 8192);
    t_side_close(&c);
    t_side_close(&s);
}

Test(rdma_port, destroy_reports_every_outstanding_op_once)
{
    struct t_side s;
    struct t_side c;
    struct rdma_done done[16];
    struct rdma_qp *other;
    struct rdma_qp *more;
    struct rdma_qp_info info;
    struct rdma_seg seg;
    int seen[10] = {0};
    int n;

    t_side_open(&s, 1 * MiB, 0);
    t_side_open(&c, 1 * MiB, 0x42);
    t_pair(&c, &s, 16);
    cr_assert_eq(rdma_region_segs(s.reg, s.buf, s.len, &seg, 1, &n), 0);
    /* A second QP on the client's CQ: its dones must survive the first one's drain. */
    cr_assert_eq(rdma_qp_create(c.cq, 16, &other, &info), 0);
    cr_assert_eq(rdma_qp_create(c.cq, 256, &more, &info), KV_NO_SPACE, "the CQ is overbooked");
    cr_assert_null(more);
    for (uint64_t i = 0; i < 5; i++) {
        cr_assert_eq(rdma_qp_post(c.qp, RDMA_OP_WRITE, c.reg, c.buf, 4096, seg.addr, seg.rkey, i),
                     0);
    }
    rdma_qp_destroy(c.qp);
    c.qp = NULL;
    n = t_wait(&c, done, 16);
    cr_assert_eq(n, 5, "%d dones for 5 operations", n);
    for (int i = 0; i < n; i++) {
        cr_assert_lt(done[i].wr_id, 5);
        cr_assert_eq(seen[done[i].wr_id]++, 0, "wr_id %llu reported twice",
                     (unsigned long long)done[i].wr_id);
        cr_assert_eq(done[i].status, 0, "a WRITE that had completed reported %s",
                     rdma_wc_status_str(done[i].wc));
    }
    rdma_qp_destroy(other);
    t_side_close(&c);
    t_side_close(&s);
}

Test(rdma_port, open_says_what_is_missing)
{
    struct rdma_dev *dev = (struct rdma_dev *)&dev;
    char why[256];
    int rc;

    rdma_emu_set_devices(0);
    cr_assert_eq(rdma_dev_open(rdma_emu_ops(), "", 1, 0, &dev, why, sizeof(why)), KV_NOT_FOUND);
    cr_assert_null(dev);
    cr_assert(strstr(why, "no RDMA device") != NULL, "why: %s", why);

    rdma_emu_set_devices(2);
    cr_assert_eq(rdma_dev_open(rdma_emu_ops(), "mlx5_7", 1, 0, &dev, why, sizeof(why)),
                 KV_NOT_FOUND);
    cr_assert(strstr(why, "'mlx5_7'") != NULL && strstr(why, "emu0") != NULL, "why: %s", why);
    cr_assert_eq(rdma_dev_open(rdma_emu_ops(), "emu1", 2, 0, &dev, why, sizeof(why)),
                 KV_NOT_FOUND);
    cr_assert(strstr(why, "emu1") != NULL && strstr(why, "no port 2") != NULL, "why: %s", why);
    cr_assert_eq(rdma_dev_open(rdma_emu_ops(), "emu1", 1, 3, &dev, why, sizeof(why)),
                 KV_NOT_FOUND);
    cr_assert(strstr(why, "GID at index 3") != NULL && strstr(why, "port 1") != NULL, "why: %s",
              why);
    rdma_emu_set_port_active(0);
    cr_assert_eq(rdma_dev_open(rdma_emu_ops(), "", 1, 0, &dev, why, sizeof(why)), KV_UNAVAILABLE);
    cr_assert(strstr(why, "port 1 of RDMA device emu0 is DOWN") != NULL, "why: %s", why);
    rdma_emu_set_port_active(1);
    cr_assert_eq(rdma_dev_open(rdma_emu_ops(), "emu1", 1, 0, &dev, why, sizeof(why)), 0);
    cr_assert_str_eq(rdma_dev_name(dev), "emu1");
    rdma_dev_close(dev);

    /* The production table on this machine: no device, or no RDMA in this build. */
    rc = rdma_dev_open(rdma_verbs_ops(), "", 1, 0, &dev, why, sizeof(why));
    if (rc == 0) {
        rdma_dev_close(dev);
        cr_skip_test("this machine has an RDMA device (%s)", why);
    }
    cr_assert(rc == KV_NOT_FOUND || rc == KV_UNSUPPORTED, "verbs open: %d (%s)", rc, why);
    cr_assert_null(dev);
    cr_assert(strstr(why, "RDMA") != NULL, "why: %s", why);
}

Test(rdma_port, qp_info_round_trips_and_rejects_bad_input)
{
    struct rdma_qp_info a = {.qpn = 0xabcdef, .psn = 0x123456, .lid = 0xbeef, .mtu = 2048};
    struct rdma_qp_info b;
    uint8_t wire[RDMA_QP_INFO_LEN];

    for (int i = 0; i < RDMA_GID_LEN; i++) {
        a.gid[i] = (uint8_t)(0xf0 + i);
    }
    rdma_qp_info_encode(&a, wire);
    cr_assert_eq(rdma_qp_info_decode(wire, sizeof(wire), &b), 0);
    cr_assert(a.qpn == b.qpn && a.psn == b.psn && a.lid == b.lid && a.mtu == b.mtu);
    cr_assert_eq(memcmp(a.gid, b.gid, RDMA_GID_LEN), 0);
    cr_assert_eq(wire[0], 0x00);
    cr_assert_eq(wire[1], 0xab, "not big-endian");
    cr_assert_eq(rdma_qp_info_decode(wire, sizeof(wire) - 1, &b), KV_INVALID_ARGUMENT);
    wire[0] = 1;                                    /* qpn over 24 bits */
    cr_assert_eq(rdma_qp_info_decode(wire, sizeof(wire), &b), KV_INVALID_ARGUMENT);
    a.mtu = 1500;
    rdma_qp_info_encode(&a, wire);
    cr_assert_eq(rdma_qp_info_decode(wire, sizeof(wire), &b), KV_INVALID_ARGUMENT);
}

/* ---- two threads: the daemon side and the client side at once ---- */

struct t_thread {
    struct t_side *self;
    struct t_side *peer;
    int ok;
};

/*
 * t_mover: buffers are in quarters: Q0 holds a side's own pattern; each side
 * WRITEs its Q0 into the peer's Q1 and READs the peer's Q0 into its own Q2,
 * 64 KiB at a time, retrying on -EAGAIN after waiting for dones.
 */
static void *
t_mover(void *arg)
{
    struct t_thread *t = arg;
    uint64_t chunk = 64 * KiB;
    uint64_t q = t->self->len / 4;
    uint64_t i = 0;
    int inflight = 0;

    t->ok = 1;
    while (t->ok && (i < 2 * q / chunk || inflight > 0)) {
        struct rdma_done done[64];
        struct rdma_seg seg;
        int n;

        if (i < 2 * q / chunk) {
            int write = (i & 1) == 0;
            uint64_t off = (i / 2) * chunk;
            int rc;

            if (rdma_region_segs(t->peer->reg, t->peer->buf + (write ? q : 0) + off, chunk, &seg,
                                 1, &n) != 0) {
                t->ok = 0;
                break;
            }
            rc = rdma_qp_post(t->self->qp, write ? RDMA_OP_WRITE : RDMA_OP_READ, t->self->reg,
                              t->self->buf + (write ? 0 : 2 * q) + off, chunk, seg.addr, seg.rkey,
                              i);
            if (rc == 0) {
                inflight++;
                i++;
                continue;
            }
            t->ok = rc == -EAGAIN;
        }
        n = t_wait(t->self, done, inflight);
        for (int j = 0; j < n; j++) {
            t->ok &= done[j].status == 0;
        }
        inflight -= n;
        t->ok &= n > 0;
    }
    return NULL;
}

Test(rdma_port, two_threads_transfer_at_once)
{
    struct t_side s;
    struct t_side c;
    struct t_thread ts = {&s, &c, 0};
    struct t_thread tc = {&c, &s, 0};
    pthread_t tid[2];
    uint64_t q = 1 * MiB;
    uint8_t *want = malloc(q);

    rdma_emu_set_max_mr_size(512 * KiB);
    t_side_open(&s, 4 * q, 0);
    t_side_open(&c, 4 * q, 0);
    t_pattern(s.buf, q, 11);
    t_pattern(c.buf, q, 22);
    t_pair(&c, &s, 8);
    cr_assert_eq(pthread_create(&tid[0], NULL, t_mover, &ts), 0);
    cr_assert_eq(pthread_create(&tid[1], NULL, t_mover, &tc), 0);
    pthread_join(tid[0], NULL);
    pthread_join(tid[1], NULL);
    cr_assert(ts.ok && tc.ok, "a transfer failed (server side %d, client side %d)", ts.ok, tc.ok);

    t_pattern(want, q, 11);
    cr_assert(memcmp(s.buf, want, q) == 0, "the server's own quarter changed");
    cr_assert(memcmp(c.buf + q, want, q) == 0, "the server's WRITEs did not land");
    cr_assert(memcmp(c.buf + 2 * q, want, q) == 0, "the client's READs did not land");
    t_pattern(want, q, 22);
    cr_assert(memcmp(c.buf, want, q) == 0, "the client's own quarter changed");
    cr_assert(memcmp(s.buf + q, want, q) == 0, "the client's WRITEs did not land");
    cr_assert(memcmp(s.buf + 2 * q, want, q) == 0, "the server's READs did not land");
    cr_assert(t_all(s.buf + 3 * q, q, 0) && t_all(c.buf + 3 * q, q, 0), "Q3 was touched");
    t_side_close(&c);
    t_side_close(&s);
    free(want);
}
