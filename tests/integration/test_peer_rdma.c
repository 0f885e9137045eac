/*
 * Integration: values fetched peer to peer over RDMA, in one process. Two daemons run on
 * threads of this test, both opening their device through the in-process emulation of the
 * verbs calls (rdma/rdma_emu.c: one fabric per process). B is a pool member with a fixed
 * view (KVSTASH_TEST_VIEW) naming A and B, R = 1; A is a plain daemon that only serves the
 * peer methods. The test puts values into A and reads them from B: B's miss is fetched
 * from A over the queue pair B set up on its peer connection (rdma_connect), A writing each
 * value straight into B's reservation. Then the failures: A's queue pair in the error state
 * (B falls back to TCP, counted, and still serves every byte), and a device missing on
 * either side (TCP from the start).
 *
 * Puts the other way (B with R = 2, so A owns every key too): values put into B reach A as
 * a peer_put_from naming B's arena, A RDMA-READing each value into its reservation over the
 * same queue pair; a queue pair in error sends the batch again as a peer_put over TCP; a
 * value damaged in B's arena after its CRC-32C was taken is refused by A, never stored.
 *
 * Why A is not a pool member too: the membership view is one global of the process
 * (src/cluster/view.c, view_publish/view_acquire), so two members in one process would
 * share one view and one idea of "self". A plain daemon serves the peer methods all the
 * same (docs/testing.md).
 */
#include <criterion/criterion.h>
#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/uio.h>

#include "../lib/harness.h"
#include "config.h"
#include "conn.h"
#include "kverr.h"
#include "kvstash.h"
#include "log.h"
#include "rdma_emu.h"
#include "rdma_port.h"
#include "rebalance.h"
#include "repl.h"
#include "server.h"
#include "store.h"
#include "view.h"
#include "worker.h"

#define KIB 1024u
#define MIB (1024u * 1024u)
#define T_TIMEOUT 10000
#define T_KEYS 6

/* One daemon on a thread of this process. */
struct t_node {
    struct server *srv;
    pthread_t thread;
    char dir[64];
    int port;
    char addr[64];
};

static struct t_node t_a, t_b;

static void *
t_main(void *arg)
{
    server_run(((struct t_node *)arg)->srv);
    return NULL;
}

/* t_node_start: a daemon with rdma (required when devices > 0) and extra config keys. */
static void
t_node_start(struct t_node *n, int devices, const char *(*kv)[2], size_t nkv)
{
    struct kv_config c;
    char err[512], data[96];

    rdma_emu_set_devices(devices);
    snprintf(n->dir, sizeof(n->dir), "/tmp/kvstash-peer-rdma-XXXXXX");
    cr_assert_not_null(mkdtemp(n->dir));
    snprintf(data, sizeof(data), "%s/data", n->dir);
    conf_init(&c);
    const char *base[][2] = {
        {"listen", n->addr}, {"data_dir", data}, {"unix_socket", "none"}, {"ssd_dir", ""},
        {"memory_size", "128MiB"}, {"rdma", devices > 0 ? "required" : "auto"},
        {"io_threads", "2"}, {"log_level", "warn"}, {"metrics_listen", ""},
    };
    for (size_t i = 0; i < sizeof(base) / sizeof(base[0]); i++) {
        cr_assert_eq(conf_set(&c, base[i][0], base[i][1], "test", err, sizeof(err)), 0, "%s",
                     err);
    }
    for (size_t i = 0; i < nkv; i++) {
        cr_assert_eq(conf_set(&c, kv[i][0], kv[i][1], "test", err, sizeof(err)), 0, "%s", err);
    }
    cr_assert_eq(conf_finalize(&c, err, sizeof(err)), 0, "%s", err);
    log_set_level(c.log_level);
    cr_assert_eq(server_create(&c, NULL, 0, NULL, &n->srv), 0, "server_create failed");
    cr_assert_eq(pthread_create(&n->thread, NULL, t_main, n), 0);
    rdma_emu_set_devices(1);
}

static void
t_node_stop(struct t_node *n)
{
    char cmd[128];

    if (n->srv == NULL) {
        return;
    }
    server_stop(n->srv);
    pthread_join(n->thread, NULL);
    server_destroy(n->srv);         /* the emulation aborts on a leaked queue pair or region */
    n->srv = NULL;
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", n->dir);
    (void)system(cmd);
}

/*
 * t_start_w: A (a plain daemon, node "a") and B (a pool member "b" with the fixed view of
 * both, R replicas, A's weight suffix a_weight: "" or e.g. "*0"), each with an emulated
 * device unless told otherwise.
 */
static void
t_start_w(int a_devices, int b_devices, const char *replicas, const char *a_weight)
{
    char view[160];

    rdma_use_ops(rdma_emu_ops());
    rdma_emu_reset();
    t_a.port = harness_free_port();
    t_b.port = harness_free_port();
    snprintf(t_a.addr, sizeof(t_a.addr), "127.0.0.1:%d", t_a.port);
    snprintf(t_b.addr, sizeof(t_b.addr), "127.0.0.1:%d", t_b.port);
    snprintf(view, sizeof(view), "a@%s%s,b@%s", t_a.addr, a_weight, t_b.addr);
    cr_assert_eq(setenv("KVSTASH_TEST_VIEW", view, 1), 0);
    const char *a_kv[][2] = {{"node_id", "a"}};
    const char *b_kv[][2] = {
        {"node_id", "b"}, {"cluster_name", "t"}, {"etcd_endpoints", "http://127.0.0.1:9"},
        {"replicas", replicas},
    };
    t_node_start(&t_a, a_devices, a_kv, 1);
    t_node_start(&t_b, b_devices, b_kv, sizeof(b_kv) / sizeof(b_kv[0]));
}

static void
t_start_r(int a_devices, int b_devices, const char *replicas)
{
    t_start_w(a_devices, b_devices, replicas, "");
}

static void
t_start(int a_devices, int b_devices)
{
    t_start_r(a_devices, b_devices, "1");
}

static void
t_stop(void)
{
    t_node_stop(&t_b);
    t_node_stop(&t_a);
    unsetenv("KVSTASH_TEST_VIEW");
}

TestSuite(peer_rdma, .fini = t_stop, .timeout = 120);

/* ---- keys, values, counters ---- */

struct t_set {
    char key[T_KEYS][32];
    size_t len[T_KEYS];
    uint8_t *val[T_KEYS];
    uint64_t total;
};

/* Sizes across the paths: pages and odd tails, and values over several extents. */
static const size_t t_sizes[T_KEYS] = {100, 4096, 64 * KIB + 3, MIB, 3 * MIB + 17, 200 * KIB};

/*
 * t_set_make: T_KEYS keys that A alone owns in B's view (placement over "a" and "b", R = 1;
 * bounded search), named with tag, and their values.
 */
static void
t_set_make(struct t_set *s, const char *tag)
{
    struct cluster_view *v = NULL;
    int found = 0;

    for (int i = 0; i < 200 && v == NULL; i++) {
        v = view_acquire();         /* B's fixed view, published as it starts */
        if (v == NULL) {
            harness_sleep_ms(25);
        }
    }
    cr_assert_not_null(v, "B published no view");
    s->total = 0;
    for (int i = 0; i < 10000 && found < T_KEYS; i++) {
        char key[32];
        size_t own[1];
        int kl = snprintf(key, sizeof(key), "%s-%d", tag, i);

        if (view_owners(v, key, (size_t)kl, 1, own) != 1 || strcmp(v->nodes[own[0]].id, "a") != 0) {
            continue;
        }
        memcpy(s->key[found], key, (size_t)kl + 1);
        s->len[found] = t_sizes[found];
        s->val[found] = malloc(s->len[found]);
        cr_assert_not_null(s->val[found]);
        harness_fill(s->val[found], s->len[found], harness_seed(key, (size_t)kl));
        s->total += s->len[found];
        found++;
    }
    view_release(v);
    cr_assert_eq(found, T_KEYS, "too few keys owned by a");
}

static void
t_set_free(struct t_set *s)
{
    for (int i = 0; i < T_KEYS; i++) {
        free(s->val[i]);
    }
}

/* t_put_a: every value of s into A (A is no pool member: it keeps them, sends nothing). */
static void
t_put_a(const struct t_set *s)
{
    struct kvstash *c;

    cr_assert_eq(harness_client(t_a.addr, T_TIMEOUT, &c), 0);
    for (int i = 0; i < T_KEYS; i++) {
        cr_assert_eq(kvstash_put(c, s->key[i], strlen(s->key[i]), s->val[i], s->len[i]), 0,
                     "put %s into A", s->key[i]);
    }
    kvstash_close(c);
}

/* t_get_b: every key of s read from B, in one batch_get: each value byte-exact. */
static void
t_get_b(const struct t_set *s)
{
    struct kvstash *c;
    const void *keys[T_KEYS];
    size_t klens[T_KEYS], caps[T_KEYS], vlens[T_KEYS];
    void *bufs[T_KEYS];
    int codes[T_KEYS];

    for (int i = 0; i < T_KEYS; i++) {
        keys[i] = s->key[i];
        klens[i] = strlen(s->key[i]);
        caps[i] = s->len[i] + 1;
        bufs[i] = malloc(caps[i]);
        cr_assert_not_null(bufs[i]);
    }
    cr_assert_eq(harness_client(t_b.addr, T_TIMEOUT, &c), 0);
    cr_assert_eq(kvstash_batch_get(c, T_KEYS, keys, klens, bufs, caps, vlens, codes), 0);
    for (int i = 0; i < T_KEYS; i++) {
        cr_assert_eq(codes[i], 0, "%s from B: code %d", s->key[i], codes[i]);
        cr_assert_eq(vlens[i], s->len[i], "%s from B: %zu bytes, not %zu", s->key[i], vlens[i],
                     s->len[i]);
        cr_assert(memcmp(bufs[i], s->val[i], s->len[i]) == 0, "%s from B: other bytes",
                  s->key[i]);
        free(bufs[i]);
    }
    kvstash_close(c);
}

/* t_b_stats: B's counters of its peer fetches. */
static struct repl_stats
t_b_stats(void)
{
    struct server_stats sv;
    struct repl_stats rs;

    server_stats(t_b.srv, &sv);
    cr_assert_not_null(sv.repl);
    repl_stats(sv.repl, &rs);
    return rs;
}

/* t_a_peer_bytes_out: value bytes A sent to peers through the socket (peer_get). */
static uint64_t
t_a_peer_bytes_out(void)
{
    struct server_stats sv;
    uint64_t n = 0;

    server_stats(t_a.srv, &sv);
    for (int i = 0; i < sv.nworkers; i++) {
        n += atomic_load(&worker_counters(sv.workers[i])->rpc.peer_bytes_out);
    }
    return n;
}

/* ---- the tests ---- */

Test(peer_rdma, fetch_written_by_the_owner)
{
    struct t_set s;
    struct repl_stats before, after;

    t_start(1, 1);
    t_set_make(&s, "fetch");
    t_put_a(&s);
    before = t_b_stats();
    t_get_b(&s);
    after = t_b_stats();
    cr_assert_eq(after.remote_hits - before.remote_hits, T_KEYS);
    cr_assert_eq(after.peer_rdma_connects, 1, "one queue pair to A");
    cr_assert_eq(after.peer_rdma_fallbacks, 0);
    cr_assert_eq(after.peer_rdma_fetch_bytes - before.peer_rdma_fetch_bytes, s.total,
                 "every value byte came over RDMA");
    /* The socket carried the requests and the sizes, not the values. */
    cr_assert_lt(after.peer_bytes_in - before.peer_bytes_in, 4 * KIB);
    cr_assert_eq(t_a_peer_bytes_out(), 0);
    /* Kept at B: read again without asking A. */
    t_get_b(&s);
    cr_assert_eq(t_b_stats().remote_hits, after.remote_hits);
    t_set_free(&s);
}

Test(peer_rdma, owner_queue_pair_in_error_falls_back_to_tcp)
{
    struct t_set s1, s2;
    struct repl_stats mid, after;

    t_start(1, 1);
    t_set_make(&s1, "first");
    t_set_make(&s2, "second");
    t_put_a(&s1);
    t_put_a(&s2);
    t_get_b(&s1);                   /* the queue pair is up and carried s1 */
    mid = t_b_stats();
    cr_assert_eq(mid.peer_rdma_fetch_bytes, s1.total);
    /* A's queue pair of B's connection goes into error (B's with it: the fabric's every
     * queue pair), as a hardware fault would put it. */
    cr_assert_geq(rdma_emu_qp_force_error_all(), 2);
    t_get_b(&s2);                   /* A's writes fail: B asks again over TCP */
    after = t_b_stats();
    cr_assert_eq(after.peer_rdma_fallbacks, 1, "the fallback is counted");
    cr_assert_eq(after.peer_rdma_fetch_bytes, mid.peer_rdma_fetch_bytes);
    cr_assert_eq(after.remote_hits - mid.remote_hits, T_KEYS);
    cr_assert_eq(after.remote_misses, mid.remote_misses, "no get failed");
    cr_assert_geq(after.peer_bytes_in - mid.peer_bytes_in, s2.total, "s2 came over TCP");
    cr_assert_eq(t_a_peer_bytes_out(), s2.total);
    t_set_free(&s1);
    t_set_free(&s2);
}

/*
 * t_fetch_over_tcp: with devices at A and B as given, values put into A and got from B came
 * over TCP, no queue pair connected, fallbacks counted as said; B's stats returned.
 */
static struct repl_stats
t_fetch_over_tcp(int devices_a, int devices_b, const char *tag, uint64_t fallbacks,
                 const char *why)
{
    struct t_set s;
    struct repl_stats rs;

    t_start(devices_a, devices_b);
    t_set_make(&s, tag);
    t_put_a(&s);
    t_get_b(&s);
    rs = t_b_stats();
    cr_assert_eq(rs.peer_rdma_connects, 0);
    cr_assert_eq(rs.peer_rdma_fallbacks, fallbacks, "%s", why);
    cr_assert_eq(rs.peer_rdma_fetch_bytes, 0);
    cr_assert_eq(rs.remote_hits, T_KEYS);
    cr_assert_geq(rs.peer_bytes_in, s.total);
    t_set_free(&s);
    return rs;
}

Test(peer_rdma, no_device_at_the_owner_means_tcp)
{
    struct repl_stats rs =
        t_fetch_over_tcp(0, 1, "nodev-a", 1, "A refused rdma_connect: counted once");

    cr_assert_eq(rs.peer_errors, 0, "a fetch not tried over RDMA is no peer error");
}

Test(peer_rdma, no_device_at_the_asking_node_means_tcp)
{
    t_fetch_over_tcp(1, 0, "nodev-b", 0, "nothing tried: no device here");
}

Test(peer_rdma, damaged_value_is_never_kept)
{
    struct t_set s;
    struct repl_stats before, after;
    struct server_stats sv;
    struct store_obj *o;
    struct iovec iov[STORE_MAX_EXTENTS];
    struct kvstash *c;
    const char *bad;
    void *got = NULL;
    size_t vlen = 0;

    t_start(1, 1);
    t_set_make(&s, "damaged");
    t_put_a(&s);
    /* A's copy of key 3 (1 MiB) is damaged in its DRAM after its CRC-32C was taken: A
     * writes the damaged bytes and answers the CRC of the good ones. */
    bad = s.key[3];
    server_stats(t_a.srv, &sv);
    struct kv_key k = {.tenant = 0, .len = (uint32_t)strlen(bad), .ptr = (const uint8_t *)bad};
    cr_assert_eq(store_get(sv.store, &k, &o), 0);
    (void)store_obj_crc(o);
    cr_assert_gt(store_obj_iov(o, iov, STORE_MAX_EXTENTS), 0);
    ((uint8_t *)iov[0].iov_base)[12345 % iov[0].iov_len] ^= 0x40;
    store_obj_unref(sv.store, o);

    before = t_b_stats();
    cr_assert_eq(harness_client(t_b.addr, T_TIMEOUT, &c), 0);
    /* R = 1: no other owner to ask, so a miss, never the damaged bytes */
    cr_assert_eq(kvstash_get_alloc(c, bad, strlen(bad), &got, &vlen), KVSTASH_ENOTFOUND);
    free(got);
    after = t_b_stats();
    cr_assert_eq(after.checksum_mismatches - before.checksum_mismatches, 1, "counted");
    cr_assert_eq(after.remote_misses - before.remote_misses, 1);
    cr_assert_eq(after.peer_rdma_fallbacks, 0, "a bad value is not an RDMA failure");
    /* nothing was kept at B: the reservation was freed */
    server_stats(t_b.srv, &sv);
    cr_assert_neq(store_get(sv.store, &k, &o), 0);
    /* the others still come byte-exact over RDMA */
    for (int i = 0; i < T_KEYS; i++) {
        if (i == 3) {
            continue;
        }
        cr_assert_eq(kvstash_get_alloc(c, s.key[i], strlen(s.key[i]), &got, &vlen), 0);
        cr_assert_eq(vlen, s.len[i]);
        cr_assert(memcmp(got, s.val[i], vlen) == 0);
        free(got);
    }
    cr_assert_gt(t_b_stats().peer_rdma_fetch_bytes, after.peer_rdma_fetch_bytes);
    kvstash_close(c);
    t_set_free(&s);
}

/* ---- replica puts over RDMA (B writes, A owns) ---- */

/* t_a_sum: the sum over A's workers of one request-layer counter (field offset). */
static uint64_t
t_a_sum(size_t off)
{
    struct server_stats sv;
    uint64_t n = 0;

    server_stats(t_a.srv, &sv);
    for (int i = 0; i < sv.nworkers; i++) {
        n += atomic_load((_Atomic uint64_t *)((char *)&worker_counters(sv.workers[i])->rpc + off));
    }
    return n;
}

#define T_A_SUM(field) t_a_sum(offsetof(struct rpc_counters, field))

/* t_put_b: every value of s into B in one batch_put (write_ack all: A has answered). */
static void
t_put_b(const struct t_set *s)
{
    struct kvstash *c;
    const void *keys[T_KEYS], *vals[T_KEYS];
    size_t klens[T_KEYS], vlens[T_KEYS];
    int codes[T_KEYS];

    for (int i = 0; i < T_KEYS; i++) {
        keys[i] = s->key[i];
        klens[i] = strlen(s->key[i]);
        vals[i] = s->val[i];
        vlens[i] = s->len[i];
    }
    cr_assert_eq(harness_client(t_b.addr, T_TIMEOUT, &c), 0);
    cr_assert_eq(kvstash_batch_put(c, T_KEYS, keys, klens, vals, vlens, codes), 0);
    for (int i = 0; i < T_KEYS; i++) {
        cr_assert_eq(codes[i], 0, "put %s into B: code %d", s->key[i], codes[i]);
    }
    kvstash_close(c);
}

/* t_get_a: every key of s read from A's own store (A asks nobody): each value byte-exact. */
static void
t_get_a(const struct t_set *s)
{
    struct kvstash *c;

    cr_assert_eq(harness_client(t_a.addr, T_TIMEOUT, &c), 0);
    for (int i = 0; i < T_KEYS; i++) {
        void *got = NULL;
        size_t vlen = 0;

        cr_assert_eq(kvstash_get_alloc(c, s->key[i], strlen(s->key[i]), &got, &vlen), 0,
                     "%s is not at A", s->key[i]);
        cr_assert_eq(vlen, s->len[i], "%s at A: %zu bytes, not %zu", s->key[i], vlen, s->len[i]);
        cr_assert(memcmp(got, s->val[i], vlen) == 0, "%s at A: other bytes", s->key[i]);
        free(got);
    }
    kvstash_close(c);
}

/*
 * t_put_warm: B's connection to A made and its queue pair connected (bounded wait). The
 * first put on a new connection goes over TCP: the queue pair is connected only once A
 * answered rdma_connect, which follows the first call.
 */
static void
t_put_warm(void)
{
    struct kvstash *c;
    int i;

    cr_assert_eq(harness_client(t_a.addr, T_TIMEOUT, &c), 0);     /* A is up */
    kvstash_close(c);
    cr_assert_eq(harness_client(t_b.addr, T_TIMEOUT, &c), 0);
    for (i = 0; i < 400 && t_b_stats().peer_rdma_connects == 0; i++) {
        if (i % 40 == 0) {          /* a put now and then: a dial that failed is retried */
            char key[32];
            int kl = snprintf(key, sizeof(key), "warm-%d", i);

            cr_assert_eq(kvstash_put(c, key, (size_t)kl, "up", 2), 0);
        }
        harness_sleep_ms(25);
    }
    kvstash_close(c);
    cr_assert_eq(t_b_stats().peer_rdma_connects, 1, "no queue pair to A within 10 s");
}

Test(peer_rdma, put_read_by_the_owner)
{
    struct t_set s;
    struct repl_stats before, after;
    uint64_t a_tcp_in;

    t_start_r(1, 1, "2");
    t_set_make(&s, "put");
    t_put_warm();
    before = t_b_stats();
    a_tcp_in = T_A_SUM(peer_bytes_in);
    t_put_b(&s);
    after = t_b_stats();
    cr_assert_eq(after.repl_acked - before.repl_acked, T_KEYS, "A stored every value");
    cr_assert_eq(after.peer_rdma_put_bytes - before.peer_rdma_put_bytes, s.total,
                 "every value byte went over RDMA");
    cr_assert_eq(after.peer_rdma_fallbacks, 0);
    /* The socket carried the keys and the extents, not the values. */
    cr_assert_lt(after.peer_bytes_out - before.peer_bytes_out, 4 * KIB);
    cr_assert_eq(T_A_SUM(peer_bytes_in), a_tcp_in, "no value bytes through A's socket");
    t_get_a(&s);
    t_set_free(&s);
}

Test(peer_rdma, put_queue_pair_in_error_falls_back_to_tcp)
{
    struct t_set s1, s2;
    struct repl_stats mid, after;
    uint64_t a_tcp_in;

    t_start_r(1, 1, "2");
    t_set_make(&s1, "pfirst");
    t_set_make(&s2, "psecond");
    t_put_warm();
    t_put_b(&s1);                   /* the queue pair is up and carried s1 */
    mid = t_b_stats();
    cr_assert_eq(mid.peer_rdma_put_bytes, s1.total);
    cr_assert_geq(rdma_emu_qp_force_error_all(), 2);
    a_tcp_in = T_A_SUM(peer_bytes_in);
    t_put_b(&s2);                   /* A's READs fail: B sends the batch again over TCP */
    after = t_b_stats();
    cr_assert_eq(after.peer_rdma_fallbacks, 1, "the fallback is counted");
    cr_assert_eq(after.peer_rdma_put_bytes, mid.peer_rdma_put_bytes);
    cr_assert_eq(after.repl_acked - mid.repl_acked, T_KEYS, "A stored every value");
    cr_assert_eq(after.repl_failed, mid.repl_failed, "no replica failed");
    cr_assert_eq(T_A_SUM(peer_bytes_in) - a_tcp_in, s2.total, "s2 came over TCP");
    t_get_a(&s1);
    t_get_a(&s2);
    t_set_free(&s1);
    t_set_free(&s2);
}

Test(peer_rdma, put_damaged_in_the_writer_is_refused)
{
    struct t_set s;
    struct repl_stats before, after;
    struct server_stats sv;
    struct store_obj *o;
    struct iovec iov[STORE_MAX_EXTENTS];
    struct kvstash *c;
    const char *bad;
    void *t, *got = NULL;
    size_t vlen = 0;
    int i;

    t_start_r(1, 1, "2");
    t_set_make(&s, "pdamaged");
    t_put_warm();
    /* Key 3 (1 MiB) lands in B's store with the CRC-32C of its good bytes taken, then one
     * byte of it changes in B's arena; B replicates it as a client put would. */
    bad = s.key[3];
    server_stats(t_b.srv, &sv);
    struct kv_key k = {.tenant = 0, .len = (uint32_t)strlen(bad), .ptr = (const uint8_t *)bad};
    cr_assert_eq(store_reserve(sv.store, &k, s.len[3], &o), 0);
    int n = store_obj_iov(o, iov, STORE_MAX_EXTENTS);
    size_t off = 0;
    for (int e = 0; e < n && off < s.len[3]; e++) {
        size_t len = iov[e].iov_len < s.len[3] - off ? iov[e].iov_len : s.len[3] - off;

        memcpy(iov[e].iov_base, s.val[3] + off, len);
        off += len;
    }
    (void)store_obj_crc(o);         /* the good bytes' checksum, kept on the object */
    ((uint8_t *)iov[0].iov_base)[12345 % iov[0].iov_len] ^= 0x40;
    cr_assert_eq(store_commit(sv.store, o), 0);
    cr_assert_eq(store_get(sv.store, &k, &o), 0);
    before = t_b_stats();
    uint64_t a_bad = T_A_SUM(peer_checksum_mismatches);
    t = repl_stored(sv.repl, &k, o);
    repl_flush(sv.repl);
    store_obj_unref(sv.store, o);
    cr_assert_not_null(t, "write_ack all: a ticket");
    for (i = 0; i < 400 && !repl_ticket_done(sv.repl, t); i++) {
        harness_sleep_ms(25);
    }
    cr_assert(repl_ticket_done(sv.repl, t), "A did not answer within 10 s");
    repl_ticket_put(sv.repl, t);
    after = t_b_stats();
    cr_assert_eq(after.repl_failed - before.repl_failed, 1, "A refused it");
    cr_assert_eq(after.peer_rdma_put_bytes, before.peer_rdma_put_bytes);
    cr_assert_eq(after.peer_rdma_fallbacks, 0, "a bad value is not an RDMA failure");
    cr_assert_eq(T_A_SUM(peer_checksum_mismatches) - a_bad, 1, "counted at A");
    /* A never stored the damaged bytes */
    cr_assert_eq(harness_client(t_a.addr, T_TIMEOUT, &c), 0);
    cr_assert_eq(kvstash_get_alloc(c, bad, strlen(bad), &got, &vlen), KVSTASH_ENOTFOUND);
    free(got);
    kvstash_close(c);
    t_set_free(&s);
}

/* ---- the rebalance walk's pushes over RDMA (B drains, A takes its keys) ---- */

#define T_PUSH_KEYS 150

/*
 * Keys B alone owns in the view of A and B (R = 1), their lengths and a digest of each value
 * (FNV-1a 64 of its bytes) taken as it was put: more keys than one push message carries
 * (REBALANCE_BATCH) and more bytes (8 MiB), values of one byte to past 1 MiB.
 */
struct t_push {
    char key[T_PUSH_KEYS][32];
    size_t len[T_PUSH_KEYS];
    uint64_t digest[T_PUSH_KEYS];
    uint64_t total;
};

static size_t
t_push_size(int i)
{
    static const size_t base[] = {1, 100, 4096, 64 * KIB + 3, 200 * KIB, MIB + 17};

    return base[i % 6] + (size_t)i;
}

/*
 * t_push_make_in: keys that owner alone owns in view sel (R = 1; bounded search), and their
 * values put into B; nothing sent to A.
 */
static void
t_push_make_in(struct t_push *s, const char *tag, const struct cluster_view *sel,
               const char *owner)
{
    struct kvstash *c;
    int found = 0;

    cr_assert_eq(harness_client(t_b.addr, T_TIMEOUT, &c), 0);
    s->total = 0;
    for (int i = 0; i < 100000 && found < T_PUSH_KEYS; i++) {
        char key[32];
        size_t own[1];
        int kl = snprintf(key, sizeof(key), "%s-%d", tag, i);
        uint8_t *val;

        if (view_owners(sel, key, (size_t)kl, 1, own) != 1
            || strcmp(sel->nodes[own[0]].id, owner) != 0) {
            continue;
        }
        memcpy(s->key[found], key, (size_t)kl + 1);
        s->len[found] = t_push_size(found);
        val = malloc(s->len[found]);
        cr_assert_not_null(val);
        harness_fill(val, s->len[found], harness_seed(key, (size_t)kl));
        s->digest[found] = harness_seed(val, s->len[found]);
        cr_assert_eq(kvstash_put(c, key, (size_t)kl, val, s->len[found]), 0, "put %s into B", key);
        free(val);
        s->total += s->len[found];
        found++;
    }
    kvstash_close(c);
    cr_assert_eq(found, T_PUSH_KEYS, "too few keys owned by %s", owner);
    cr_assert_eq(t_b_stats().repl_sent, 0, "B owns them: nothing went to A yet");
}

/* t_b_view: B's current view (a reference), waited for (bounded) as B publishes it. */
static struct cluster_view *
t_b_view(void)
{
    struct cluster_view *v = NULL;

    for (int i = 0; i < 200 && v == NULL; i++) {
        v = view_acquire();
        if (v == NULL) {
            harness_sleep_ms(25);
        }
    }
    cr_assert_not_null(v, "B published no view");
    return v;
}

/* t_push_make: keys B alone owns in its view, put into B. */
static void
t_push_make(struct t_push *s, const char *tag)
{
    struct cluster_view *v = t_b_view();

    t_push_make_in(s, tag, v, "b");
    view_release(v);
}

/* t_b_walked: wait (bounded) until B's walk has completed once. */
static void
t_b_walked(void);

/* t_b_rebalance: B's rebalance counters. */
static struct rebalance_stats
t_b_rebalance(void)
{
    struct server_stats sv;
    struct rebalance_stats bs;

    server_stats(t_b.srv, &sv);
    cr_assert_not_null(sv.rebalance);
    rebalance_stats(sv.rebalance, &bs);
    return bs;
}

/*
 * t_drain_b: B's view with B draining (as member.c publishes it once B registered so): its
 * walk hands every key it owns to A. Waits (bounded) until the walk completed.
 */
static void
t_drain_b(void)
{
    struct cluster_view *cur = view_acquire(), *v;

    cr_assert_not_null(cur);
    cr_assert_eq(view_create(cur->n, &v), 0);
    v->revision = cur->revision + 1;
    memcpy(v->nodes, cur->nodes, cur->n * sizeof(cur->nodes[0]));
    view_release(cur);
    for (size_t j = 0; j < v->n; j++) {
        if (strcmp(v->nodes[j].id, "b") == 0) {
            v->nodes[j].state = VIEW_DRAINING;
        }
    }
    view_seal(v, "b");
    view_publish(v);
    t_b_walked();
}

static void
t_b_walked(void)
{
    for (int i = 0; i < 2400 && t_b_rebalance().walks == 0; i++) {
        harness_sleep_ms(25);
    }
    cr_assert_geq(t_b_rebalance().walks, 1, "B's walk did not complete within 60 s");
}

/* t_push_check_a: every key of s at A, read from A's own store: its length and digest. */
static void
t_push_check_a(const struct t_push *s)
{
    struct kvstash *c;

    cr_assert_eq(harness_client(t_a.addr, T_TIMEOUT, &c), 0);
    for (int i = 0; i < T_PUSH_KEYS; i++) {
        void *got = NULL;
        size_t vlen = 0;

        cr_assert_eq(kvstash_get_alloc(c, s->key[i], strlen(s->key[i]), &got, &vlen), 0,
                     "%s was not handed to A", s->key[i]);
        cr_assert_eq(vlen, s->len[i], "%s at A: %zu bytes, not %zu", s->key[i], vlen, s->len[i]);
        cr_assert_eq(harness_seed(got, vlen), s->digest[i], "%s at A: other bytes", s->key[i]);
        free(got);
    }
    kvstash_close(c);
}

Test(peer_rdma, drain_pushes_read_by_the_new_owner)
{
    static struct t_push s;
    struct repl_stats before, after;
    struct rebalance_stats bs;
    uint64_t a_tcp_in;

    t_start(1, 1);
    t_push_make(&s, "drain");
    before = t_b_stats();
    a_tcp_in = T_A_SUM(peer_bytes_in);
    t_drain_b();
    after = t_b_stats();
    bs = t_b_rebalance();
    cr_assert_eq(bs.keys_moved, T_PUSH_KEYS, "the walk pushed every key A lacked");
    cr_assert_eq(bs.bytes_moved, s.total);
    cr_assert_eq(after.peer_rdma_put_bytes - before.peer_rdma_put_bytes, s.total,
                 "every value byte went over RDMA (A READ it)");
    cr_assert_eq(after.peer_rdma_connects, 1, "one queue pair to A");
    cr_assert_eq(after.peer_rdma_fallbacks, 0);
    cr_assert_eq(after.repl_sent, before.repl_sent, "pushes are not counted as replicas");
    /* The sockets carried the keys and the extents, not the values. */
    cr_assert_lt(after.peer_bytes_out - before.peer_bytes_out, 64 * KIB);
    cr_assert_eq(T_A_SUM(peer_bytes_in), a_tcp_in, "no value bytes through A's socket");
    t_push_check_a(&s);
}

/*
 * t_push_over_tcp: with devices at A and B as given, B's drain moves every key to A over TCP
 * (peer_put): nothing READ, fallbacks counted as said.
 */
static void
t_push_over_tcp(int devices_a, int devices_b, const char *tag, uint64_t fallbacks,
                const char *why)
{
    static struct t_push s;
    struct repl_stats after;
    struct rebalance_stats bs;
    uint64_t a_tcp_in;

    t_start(devices_a, devices_b);
    t_push_make(&s, tag);
    a_tcp_in = T_A_SUM(peer_bytes_in);
    t_drain_b();
    after = t_b_stats();
    bs = t_b_rebalance();
    cr_assert_eq(bs.keys_moved, T_PUSH_KEYS, "the walk pushed every key A lacked");
    cr_assert_eq(bs.bytes_moved, s.total);
    cr_assert_eq(after.peer_rdma_put_bytes, 0);
    cr_assert_eq(after.peer_rdma_connects, 0);
    cr_assert_eq(after.peer_rdma_fallbacks, fallbacks, "%s", why);
    cr_assert_geq(T_A_SUM(peer_bytes_in) - a_tcp_in, s.total, "the values came over TCP");
    t_push_check_a(&s);
}

Test(peer_rdma, drain_push_refused_rdma_falls_back_to_tcp)
{
    t_push_over_tcp(0, 1, "drain-nodev-a", 1, "A refused rdma_connect: counted once");
}

Test(peer_rdma, drain_push_without_a_device_here_is_tcp)
{
    t_push_over_tcp(1, 0, "drain-nodev-b", 0, "nothing tried: no device here");
}

Test(peer_rdma, drain_push_queue_pair_in_error_falls_back_to_tcp)
{
    static struct t_push s;
    struct t_set warm;
    struct repl_stats mid, after;
    struct rebalance_stats bs;
    uint64_t a_tcp_in;

    t_start(1, 1);
    t_set_make(&warm, "pwarm");
    t_put_a(&warm);
    t_get_b(&warm);                 /* B's queue pair to A is up and carried these */
    mid = t_b_stats();
    cr_assert_eq(mid.peer_rdma_fetch_bytes, warm.total);
    t_push_make(&s, "drain-qperr");
    cr_assert_geq(rdma_emu_qp_force_error_all(), 2);
    a_tcp_in = T_A_SUM(peer_bytes_in);
    t_drain_b();                    /* A's READs fail: B sends each message again over TCP */
    after = t_b_stats();
    bs = t_b_rebalance();
    cr_assert_eq(bs.keys_moved, T_PUSH_KEYS, "the walk pushed every key A lacked");
    cr_assert_eq(after.peer_rdma_fallbacks, 1, "the fallback is counted");
    cr_assert_eq(after.peer_rdma_put_bytes, 0);
    cr_assert_geq(T_A_SUM(peer_bytes_in) - a_tcp_in, s.total, "the values came over TCP");
    t_push_check_a(&s);
    t_set_free(&warm);
}

/*
 * A join, as the pool sees one: B's view had A at weight 0 (it owned nothing: B took every
 * key); the next view gives A its weight, so A owns about half the keys, and B's walk pushes
 * those to A over RDMA and keeps its own copies as cache copies.
 */
Test(peer_rdma, join_pushes_read_by_the_new_owner)
{
    static struct t_push s;
    struct cluster_view *cur, *v;
    struct repl_stats before, after;
    struct rebalance_stats bs;
    uint64_t a_tcp_in, old_rev;

    t_start_w(1, 1, "1", "*0");
    cur = t_b_view();
    old_rev = cur->revision;
    cr_assert_eq(view_create(cur->n, &v), 0);
    v->revision = cur->revision + 1;
    memcpy(v->nodes, cur->nodes, cur->n * sizeof(cur->nodes[0]));
    view_release(cur);
    for (size_t j = 0; j < v->n; j++) {
        v->nodes[j].weight = 1;
    }
    view_seal(v, "b");
    t_push_make_in(&s, "join", v, "a");     /* A's in the new view, all B's in the old */
    /* The walk compares a new view with the last one its thread settled on: wait until that
     * is the old view, so that the new one reads as a change. */
    for (int i = 0; i < 2400 && t_b_rebalance().settled < old_rev; i++) {
        harness_sleep_ms(25);
    }
    cr_assert_geq(t_b_rebalance().settled, old_rev, "B's walk thread never saw the old view");
    cr_assert_eq(t_b_rebalance().walks, 0, "nothing to walk before the view changes");
    before = t_b_stats();
    a_tcp_in = T_A_SUM(peer_bytes_in);
    view_publish(v);
    t_b_walked();
    after = t_b_stats();
    bs = t_b_rebalance();
    cr_assert_eq(bs.keys_moved, T_PUSH_KEYS, "the walk pushed every key A now owns");
    cr_assert_eq(bs.bytes_moved, s.total);
    cr_assert_eq(after.peer_rdma_put_bytes - before.peer_rdma_put_bytes, s.total,
                 "every value byte went over RDMA (A READ it)");
    cr_assert_eq(after.peer_rdma_fallbacks, 0);
    cr_assert_eq(T_A_SUM(peer_bytes_in), a_tcp_in, "no value bytes through A's socket");
    t_push_check_a(&s);
}
