/*
 * raw_bench: the loopback TCP ceiling that `make bench` puts next to kvstashd's rows.
 *
 * The figures for scale are "raw TCP request -> 1 MiB reply" on one and two
 * connections. This program measures exactly that shape, in the same run and with the same
 * connections, depth, batch and value size as kvstash-bench, so the table can show each
 * row as a fraction of what the machine's loopback can carry at all:
 *
 *   raw-bench -L PORT [-w WORKSET]      serve: one thread per connection, blocking I/O
 *   raw-bench -H HOST:PORT -m get|put -s SIZE -b BATCH -c CONNS -d DEPTH -t SECS [-p PID]
 *             [-C]
 *
 * A request is a 16-byte header: magic, op, batch, size. For get the server answers with
 * batch x size bytes written with one sendmsg from its working set; for put the client
 * sends the header, then batch x size bytes by reference (sendfile) from one sealed pattern
 * memfd, as kvstash-bench and mc-bench do (-C: copied with sendmsg instead); the server
 * receives them into its working set and answers with an 8-byte acknowledgement. The
 * server's working set (default 1 GiB, like kvstash-bench's get working set; populated at
 * start) is walked in order, so a large one reads and writes memory that is not in cache,
 * as a store does; a small one (-w 8m) gives the hot-buffer ceiling. No parsing, no
 * lookups, no allocation on the hot path: whatever a store adds shows as the distance to
 * this.
 *
 * The client prints the same key=value result line as kvstash-bench (mode raw_get or
 * raw_put). Every run ends by time (-t) or count (-n); the server ends after -t seconds
 * (default an hour) or when killed. Both ends give a same-host connection the congestion
 * control kvstashd and libkvstash use (tcpopt.h), so the ceiling is measured on
 * the same footing. It links libc, pthreads and util/tcpopt.c only.
 */
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <limits.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include "bench_util.h"
#include "tcpopt.h"

#define RAW_MAGIC 0x52415742u          /* "RAWB" */
#define RAW_OP_GET 1u
#define RAW_OP_PUT 2u
#define RAW_MAX_BATCH 4096u
#define RAW_MAX_DEPTH 64
#define RAW_MAX_CONNS 1024
#define RAW_WORKSET (1ull << 30)
#define RAW_RECV_PIECE (64u * 1024u)  /* the kernel opens the window when a recv returns */

struct raw_hdr {
    uint32_t magic, op, batch, size;
};

struct raw_cfg {
    const char *addr;
    uint32_t op;
    int conns, depth, pid;
    uint32_t batch;
    size_t vsize;
    double secs;
    uint64_t max_reqs;
    bool quiet;
    bool copy;                         /* -C: put values copied (sendmsg), not sendfile */
    struct bench_pattern *values;      /* put: the bytes every value repeats */
};

struct raw_thread {
    const struct raw_cfg *cfg;
    pthread_t tid;
    pthread_barrier_t *barrier;
    int fd;
    uint8_t *sink;
    struct iovec *iov;                 /* header + batch pattern pieces, rebuilt per send */
    uint64_t t_sent[RAW_MAX_DEPTH];
    uint64_t reqs, bytes;
    uint64_t hist[BENCH_HIST];
    char why[160];
};

/* ---- server ---- */

static uint8_t *raw_ws;                /* the server's working set */
static size_t raw_ws_len;
static atomic_size_t raw_ws_next;      /* where the next request's pieces start */

static int
raw_recv_all(int fd, void *buf, size_t len)
{
    uint8_t *p = buf;

    while (len > 0) {
        ssize_t r = recv(fd, p, len < RAW_RECV_PIECE ? len : RAW_RECV_PIECE, MSG_WAITALL);
        if (r > 0) {
            p += r;
            len -= (size_t)r;
        } else if (r == 0) {
            return -ECONNRESET;
        } else if (errno != EINTR) {
            return -errno;
        }
    }
    return 0;
}

/* raw_piece: the working-set offset of the next size-byte piece (pieces never wrap). */
static uint8_t *
raw_piece(size_t size)
{
    size_t slots = raw_ws_len / size;
    size_t n = atomic_fetch_add_explicit(&raw_ws_next, 1, memory_order_relaxed);

    return raw_ws + (n % slots) * size;
}

static void *
raw_serve_conn(void *arg)
{
    int fd = (int)(intptr_t)arg;
    struct iovec *iov = calloc(RAW_MAX_BATCH, sizeof(*iov));
    struct raw_hdr h;

    while (iov != NULL && raw_recv_all(fd, &h, sizeof(h)) == 0) {
        if (h.magic != RAW_MAGIC || (h.op != RAW_OP_GET && h.op != RAW_OP_PUT) ||
            h.batch == 0 || h.batch > RAW_MAX_BATCH || h.size == 0 || h.size > raw_ws_len) {
            fprintf(stderr, "raw-bench: bad request header; closing the connection\n");
            break;
        }
        if (h.op == RAW_OP_PUT) {
            int rc = 0;
            for (uint32_t i = 0; i < h.batch && rc == 0; i++) {
                rc = raw_recv_all(fd, raw_piece(h.size), h.size);
            }
            struct iovec ack = { .iov_base = &h, .iov_len = 8 };
            if (rc != 0 || bench_send_all(fd, &ack, 1) != 0) {
                break;
            }
        } else {
            for (uint32_t i = 0; i < h.batch; i++) {
                iov[i].iov_base = raw_piece(h.size);
                iov[i].iov_len = h.size;
            }
            if (bench_send_all(fd, iov, h.batch) != 0) {
                break;
            }
        }
    }
    free(iov);
    close(fd);
    return NULL;
}

static int
raw_serve(int port, size_t ws, double secs)
{
    raw_ws_len = ws;
    raw_ws = mmap(NULL, ws, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE,
                  -1, 0);
    if (raw_ws == MAP_FAILED) {
        perror("raw-bench: mmap of the working set");
        return 3;
    }
    memset(raw_ws, 0x5a, ws);
    int lfd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    int one = 1;
    struct sockaddr_in sin = {
        .sin_family = AF_INET, .sin_port = htons((uint16_t)port),
        .sin_addr.s_addr = htonl(INADDR_LOOPBACK),
    };
    if (lfd < 0 || setsockopt(lfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one)) != 0 ||
        bind(lfd, (struct sockaddr *)&sin, sizeof(sin)) != 0 || listen(lfd, 128) != 0) {
        perror("raw-bench: listen");
        return 3;
    }
    /* as kvstashd: every connection is from this host, and inherits it (tcpopt.h) */
    (void)tcpopt_congestion(lfd, TCPOPT_LOCAL_CONGESTION);
    alarm((unsigned)secs); /* the server's bound: SIGALRM ends the process */
    fprintf(stderr, "raw-bench: serving 127.0.0.1:%d, working set %zu bytes\n", port, ws);
    for (;;) {
        int fd = accept4(lfd, NULL, NULL, SOCK_CLOEXEC);
        if (fd < 0) {
            if (errno == EINTR || errno == ECONNABORTED) {
                continue;
            }
            perror("raw-bench: accept");
            sleep(1); /* out of descriptors: do not spin */
            continue;
        }
        setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
        pthread_t tid;
        pthread_attr_t attr;
        pthread_attr_init(&attr);
        pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
        if (pthread_create(&tid, &attr, raw_serve_conn, (void *)(intptr_t)fd) != 0) {
            close(fd);
        }
        pthread_attr_destroy(&attr);
    }
}

/* ---- client ---- */

static int
raw_fail(struct raw_thread *t, int rc, const char *what)
{
    if (t->why[0] == '\0') {
        snprintf(t->why, sizeof(t->why), "%s: %s", what, strerror(-rc));
    }
    return rc;
}

static int
raw_send(struct raw_thread *t)
{
    const struct raw_cfg *cfg = t->cfg;
    struct raw_hdr h = { RAW_MAGIC, cfg->op, cfg->batch, (uint32_t)cfg->vsize };
    size_t n = 1;

    t->iov[0].iov_base = &h;
    t->iov[0].iov_len = sizeof(h);
    if (cfg->op == RAW_OP_PUT) {
        for (uint32_t i = 0; i < cfg->batch; i++, n++) {
            t->iov[n].iov_base = (void *)bench_pattern_bytes(cfg->values);
            t->iov[n].iov_len = cfg->vsize;
        }
    }
    int rc = bench_send_pattern(t->fd, t->iov, n, cfg->values);
    return rc != 0 ? raw_fail(t, rc, "send") : 0;
}

static int
raw_reply(struct raw_thread *t)
{
    const struct raw_cfg *cfg = t->cfg;
    int rc = 0;

    if (cfg->op == RAW_OP_PUT) {
        uint8_t ack[8];
        rc = raw_recv_all(t->fd, ack, sizeof(ack));
    } else {
        for (uint32_t i = 0; i < cfg->batch && rc == 0; i++) {
            rc = raw_recv_all(t->fd, t->sink, cfg->vsize);
        }
    }
    if (rc != 0) {
        return raw_fail(t, rc, "recv");
    }
    t->bytes += (uint64_t)cfg->batch * cfg->vsize;
    return 0;
}

static void *
raw_thread_main(void *arg)
{
    struct raw_thread *t = arg;
    const struct raw_cfg *cfg = t->cfg;
    int rc = bench_connect(cfg->addr, "7439", 0, &t->fd);

    if (rc != 0) {
        raw_fail(t, rc, "connect");
    }
    pthread_barrier_wait(t->barrier); /* everyone connected */
    pthread_barrier_wait(t->barrier); /* main took the start time */
    if (rc != 0) {
        return NULL;
    }
    uint64_t deadline = bench_now_ns() + (uint64_t)(cfg->secs * 1e9);
    uint64_t sent = 0;
    int inflight = 0, head = 0;

    for (int s = 0; s < cfg->depth && (cfg->max_reqs == 0 || sent < cfg->max_reqs); s++) {
        t->t_sent[s] = bench_now_ns();
        if (raw_send(t) != 0) {
            return NULL;
        }
        sent++;
        inflight++;
    }
    while (inflight > 0) {
        if (raw_reply(t) != 0) {
            return NULL;
        }
        uint64_t now = bench_now_ns();
        t->hist[bench_hist_index(now - t->t_sent[head])]++;
        t->reqs++;
        inflight--;
        if (now < deadline && (cfg->max_reqs == 0 || sent < cfg->max_reqs)) {
            t->t_sent[head] = now;
            if (raw_send(t) != 0) {
                return NULL;
            }
            sent++;
            inflight++;
        }
        head = (head + 1) % cfg->depth;
    }
    return NULL;
}

/* raw_fill: the put values' bytes (a bench_fill_fn). */
static void
raw_fill(uint8_t *buf, size_t len)
{
    memset(buf, 0xa5, len);
}

static const char raw_usage_text[] =
    "usage: raw-bench -L PORT [-w WORKSET] [-t SECS]\n"
    "       raw-bench -H HOST:PORT -m get|put [-s SIZE] [-b BATCH] [-c CONNS] [-d DEPTH]\n"
    "                 [-t SECS] [-n REQS] [-p SERVER_PID] [-C] [-q]\n"
    "  -L  serve on 127.0.0.1:PORT for -t seconds (default 3600)\n"
    "  -w  server working set, pieces taken in order (default 1g: memory not in cache)\n"
    "  -m  get: batch x size bytes back per request; put: batch x size bytes sent\n"
    "  -s/-b/-c/-d  value size (1m), values per request (8), connections (1), depth (2)\n"
    "  -t/-n  run seconds (5), requests per connection (0: no limit)\n"
    "  -p  charge the server's CPU (from /proc) to the bytes moved\n"
    "  -C  send put values by copying (sendmsg), as before, instead of by reference\n"
    "      (sendfile from a sealed memfd)\n";

static int
raw_usage(const char *why)
{
    return bench_print_usage("raw-bench", raw_usage_text, why);
}

int
main(int argc, char **argv)
{
    struct raw_cfg cfg = {
        .addr = NULL, .op = RAW_OP_GET, .conns = 1, .depth = 2, .batch = 8,
        .vsize = 1u << 20, .secs = 5,
    };
    int listen_port = 0;
    size_t ws = RAW_WORKSET;
    bool secs_given = false;
    int opt;

    while ((opt = getopt(argc, argv, "L:H:m:s:b:c:d:t:n:p:w:Cqh")) != -1) {
        long long v = 0;
        if (strchr("Lbcdnp", opt) != NULL && bench_opt_count(optarg, &v) != 0) {
            return raw_usage("numeric option expected");
        }
        switch (opt) {
        case 'L': listen_port = (int)(v > 0 && v < 65536 ? v : -1); break;
        case 'H': cfg.addr = optarg; break;
        case 'm':
            if (strcmp(optarg, "get") == 0) {
                cfg.op = RAW_OP_GET;
            } else if (strcmp(optarg, "put") == 0) {
                cfg.op = RAW_OP_PUT;
            } else {
                return raw_usage("-m wants get or put");
            }
            break;
        case 's':
            if (bench_parse_size(optarg, &cfg.vsize) != 0) {
                return raw_usage("-s wants a size like 64k or 1m");
            }
            break;
        case 'w':
            if (bench_parse_size(optarg, &ws) != 0) {
                return raw_usage("-w wants a size like 8m or 1g");
            }
            break;
        case 'b': cfg.batch = (uint32_t)(v < UINT32_MAX ? v : UINT32_MAX); break;
        case 'c': cfg.conns = (int)(v < INT_MAX ? v : INT_MAX); break;
        case 'd': cfg.depth = (int)(v < INT_MAX ? v : INT_MAX); break;
        case 'n': cfg.max_reqs = (uint64_t)v; break;
        case 'p': cfg.pid = (int)(v < INT_MAX ? v : 0); break;
        case 't':
            if (bench_opt_secs(optarg, &cfg.secs) != 0) {
                return raw_usage("-t wants seconds in (0, 3600]");
            }
            secs_given = true;
            break;
        case 'C': cfg.copy = true; break;
        case 'q': cfg.quiet = true; break;
        case 'h':
            fputs(raw_usage_text, stdout);
            return 0;
        default:
            return raw_usage(NULL);
        }
    }
    if (optind != argc || (listen_port != 0) == (cfg.addr != NULL)) {
        return raw_usage("give exactly one of -L PORT and -H HOST:PORT");
    }
    signal(SIGPIPE, SIG_IGN);
    if (listen_port != 0) {
        if (listen_port < 0 || ws < 4096 || ws > (64ull << 30)) {
            return raw_usage("need a port in 1..65535 and 4 KiB <= -w <= 64 GiB");
        }
        return raw_serve(listen_port, ws, secs_given ? cfg.secs : 3600);
    }
    if (cfg.conns < 1 || cfg.conns > RAW_MAX_CONNS || cfg.depth < 1 ||
        cfg.depth > RAW_MAX_DEPTH || cfg.batch < 1 || cfg.batch > RAW_MAX_BATCH ||
        cfg.vsize < 1 || cfg.vsize > UINT32_MAX) {
        return raw_usage("need 1 <= conns <= 1024, 1 <= depth <= 64, 1 <= batch <= 4096, "
                         "size < 4 GiB");
    }
    struct raw_thread *th = calloc((size_t)cfg.conns, sizeof(*th));
    if (th == NULL || bench_pattern_create(cfg.vsize, cfg.op == RAW_OP_PUT && !cfg.copy,
                                           raw_fill, "raw-bench", &cfg.values) != 0) {
        fputs("raw-bench: out of memory\n", stderr);
        return 3;
    }
    pthread_barrier_t barrier;
    pthread_barrier_init(&barrier, NULL, (unsigned)cfg.conns + 1);
    for (int i = 0; i < cfg.conns; i++) {
        struct raw_thread *t = &th[i];
        t->cfg = &cfg;
        t->barrier = &barrier;
        t->fd = -1;
        t->sink = malloc(cfg.vsize);
        t->iov = calloc((size_t)cfg.batch + 1, sizeof(*t->iov));
        if (t->sink == NULL || t->iov == NULL ||
            pthread_create(&t->tid, NULL, raw_thread_main, t) != 0) {
            fputs("raw-bench: out of memory or threads\n", stderr);
            return 3;
        }
    }
    pthread_barrier_wait(&barrier);
    struct bench_run run = {
        .mode = cfg.op == RAW_OP_GET ? "raw_get" : "raw_put", .vsize = cfg.vsize,
        .batch = cfg.batch, .conns = cfg.conns, .depth = cfg.depth, .pid = cfg.pid,
    };
    bench_run_begin(&run);
    pthread_barrier_wait(&barrier);
    for (int i = 0; i < cfg.conns; i++) {
        pthread_join(th[i].tid, NULL);
    }
    bench_run_end(&run);

    static struct bench_totals tot;
    int failed = 0;
    for (int i = 0; i < cfg.conns; i++) {
        struct raw_thread *t = &th[i];
        bench_totals_add(&tot, t->reqs, t->reqs * cfg.batch, t->bytes, 0, 0, t->hist);
        if (t->why[0] != '\0') {
            failed++;
            fprintf(stderr, "raw-bench: connection %d: %s\n", i, t->why);
        }
        if (t->fd >= 0) {
            close(t->fd);
        }
        free(t->sink);
        free(t->iov);
    }
    bench_print_result(&run, &tot);
    pthread_barrier_destroy(&barrier);
    free(th);
    bench_pattern_destroy(cfg.values);
    return failed ? 3 : 0;
}
