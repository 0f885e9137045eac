/*
 * server: process-wide plumbing: data dir and node id, listeners, accept and
 * hand-off to the workers (worker.c), signals (reload, log reopen, drain),
 * config snapshots, and the process-wide state: store, SSD tier, copy
 * threads, RDMA device, TLS context. The event loops of the connections are
 * worker.c's, the request path conn.c's and src/rpc/'s.
 *
 * The main thread runs its own event_base for listeners, signals and
 * timers; it never touches a connection after handing its fd to a worker.
 */
#include "server.h"
#include "clock.h"

#include <errno.h>
#include <event2/event.h>
#include <event2/thread.h>
#include <fcntl.h>
#include <limits.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "admin.h"
#include "cluster_token.h"
#include "config.h"
#include "conn.h"
#include "copier.h"
#include "kverr.h"
#include "log.h"
#include "member.h"
#include "outq.h"
#include "peer.h"
#include "peer_tls.h"
#include "rdma_port.h"
#include "rebalance.h"
#include "repl.h"
#include "rpc.h"
#include "stats.h"
#include "sdnotify.h"
#include "ssd.h"
#include "store.h"
#include "tcpopt.h"
#include "tls.h"
#include "worker.h"

#include <openssl/ssl.h>
#include "version.h"

#define SERVER_ACCEPTS_PER_WAKE 64
#define SERVER_RESP_PORTS 3            /* RESP2 over TCP, the Unix socket, TLS */
#define SERVER_REPL_QUEUE_MAX (256ull << 20) /* bytes of puts on their way to owners */
#define SERVER_MEMBER_WAIT_MS 10000   /* start-up's wait for the first registration */
#define SERVER_FD_RESERVE 256          /* descriptors besides connections (server_fd_limit) */

struct server {
    _Atomic(const struct kv_config *) conf;
    const char *config_path;         /* NULL = defaults + flags */
    int argc;                        /* --key=value overrides, reapplied on reload */
    char **argv;
    struct kv_config **old_confs;    /* retired snapshots, freed at exit */
    int nold;
    struct store *store;
    struct ssd *ssd;                 /* the SSD tier, or NULL */
    struct copier *copier;           /* copy threads of the shared-memory transfers */
    struct rdma_dev *rdma_dev;       /* the RDMA device, or NULL (rdma off or unusable) */
    bool congestion_warned;          /* local_tcp_congestion failed once (main thread) */
    bool listen_congestion;          /* the TCP listeners were given an algorithm once */
    struct rdma_region *rdma_arena;  /* the arena registered with it */
    struct rpc_server rpc;
    struct repl *repl;               /* the cluster's data paths, or NULL (one node) */
    struct rpc_remote remote;        /* the request layer's table over repl */
    struct rebalance *rebalance;     /* the walk after view changes, or NULL (one node) */
    char node_id[CONF_STR_MAX];
    const char *transports[6];
    struct event_base *base;
    struct worker **workers;         /* nworkers of them; NULL where not created */
    int nworkers;                    /* workers allocated */
    int nthreads;                    /* worker threads started */
    int next_worker;
    int tcp_fd, unix_fd, tls_fd;
    SSL_CTX *tls_ctx;                /* new TLS connections' context (swapped on SIGHUP) */
    pthread_mutex_t tls_lock;        /* guards tls_ctx */
    char unix_path[CONF_STR_MAX];
    struct event *tcp_ev, *unix_ev, *tls_ev, *accept_timer;
    int resp_fd[SERVER_RESP_PORTS];  /* the RESP2 listeners (resp_listen, resp_unix_socket,
                                        resp_tls_listen), or -1 */
    struct event *resp_ev[SERVER_RESP_PORTS];
    char resp_unix_path[CONF_STR_MAX];
    int spare_fd;                    /* /dev/null, given up to accept and refuse a client
                                        when descriptors run out (server_refuse_no_fd) */
    uint64_t fd_refused;             /* clients refused for want of a descriptor */
    uint64_t fd_warned_ms;           /* when that was last logged */
    struct event *sig_ev[5];
    struct member *member;           /* the pool's membership thread, or NULL (no pool) */
    struct event *drain_timer;
    uint64_t drain_deadline_ms;      /* clock_ms() when the drain gives up */
    int draining;
    time_t started;
    _Atomic uint64_t connections;    /* open: accept adds, a worker's close takes off */
    _Atomic uint64_t connections_total;
    _Atomic uint64_t connections_rejected;
    _Atomic uint64_t accept_errors;
    _Atomic uint64_t refused_no_fd;  /* of connections_rejected: out of descriptors */
    _Atomic int phase;               /* enum server_phase: what /readyz answers */
    int metrics_fd;                  /* metrics_listen's socket until the admin thread has it */
    struct admin *admin;             /* the HTTP metrics and probes (admin.h), or NULL */
};

/* server_conf: the current config snapshot (valid until server_destroy). */
static const struct kv_config *
server_conf(struct server *s)
{
    return atomic_load_explicit(&s->conf, memory_order_acquire);
}

/* server_evict_policy: the store's policy for eviction_policy's value. */
static enum store_evict_policy
server_evict_policy(int v)
{
    switch (v) {
    case CONF_EVICT_FIFO:
        return STORE_EVICT_FIFO;
    case CONF_EVICT_SLRU:
        return STORE_EVICT_SLRU;
    default:
        return STORE_EVICT_LRU;
    }
}

/* ---- data dir and node id ---- */

static int
server_mkdirs(const char *path)
{
    char tmp[CONF_STR_MAX];

    if (snprintf(tmp, sizeof(tmp), "%s", path) >= (int)sizeof(tmp)) {
        return -ENAMETOOLONG;
    }
    for (char *p = tmp + 1; *p != '\0'; p++) {
        if (*p == '/') {
            *p = '\0';
            if (mkdir(tmp, 0750) != 0 && errno != EEXIST) {
                return -errno;
            }
            *p = '/';
        }
    }
    if (mkdir(tmp, 0750) != 0 && errno != EEXIST) {
        return -errno;
    }
    return 0;
}

/* The node id: from the config, else kept in <data_dir>/node_id (made once). */
static int
server_node_id(struct server *s, const struct kv_config *conf)
{
    char path[CONF_STR_MAX + 16], tmp[CONF_STR_MAX + 24];
    uint8_t rnd[16];
    FILE *f;

    if (conf->node_id[0] != '\0') {
        snprintf(s->node_id, sizeof(s->node_id), "%s", conf->node_id);
        return 0;
    }
    snprintf(path, sizeof(path), "%s/node_id", conf->data_dir);
    f = fopen(path, "r");
    if (f != NULL) {
        char line[80] = "";
        if (fgets(line, sizeof(line), f) != NULL) {
            line[strcspn(line, "\r\n")] = '\0';
        }
        fclose(f);
        if (line[0] != '\0') {
            snprintf(s->node_id, sizeof(s->node_id), "%s", line);
            return 0;
        }
    }
    if (getrandom(rnd, sizeof(rnd), 0) != (ssize_t)sizeof(rnd)) {
        return -errno;
    }
    for (size_t i = 0; i < sizeof(rnd); i++) {
        snprintf(s->node_id + 2 * i, 3, "%02x", rnd[i]);
    }
    snprintf(tmp, sizeof(tmp), "%s.tmp", path);
    f = fopen(tmp, "w");
    if (f == NULL) {
        return -errno;
    }
    fprintf(f, "%s\n", s->node_id);
    if (fflush(f) != 0 || fsync(fileno(f)) != 0) {
        int e = errno;
        fclose(f);
        return -e;
    }
    fclose(f);
    if (rename(tmp, path) != 0) {
        return -errno;
    }
    return 0;
}

/* ---- listeners ---- */

/* server_bound_name: listener fd's address as host:port ([v6]:port), the port an
 * ephemeral one (listen 127.0.0.1:0) was given included; "(no tcp)" for -1. */
static const char *
server_bound_name(int fd, char *buf, size_t len)
{
    struct sockaddr_storage ss;
    socklen_t sl = sizeof(ss);
    char host[64], port[16];

    if (fd < 0) {
        return "(no tcp)";
    }
    if (getsockname(fd, (struct sockaddr *)&ss, &sl) != 0 ||
        getnameinfo((struct sockaddr *)&ss, sl, host, sizeof(host), port, sizeof(port),
                    NI_NUMERICHOST | NI_NUMERICSERV) != 0) {
        snprintf(buf, len, "(fd %d)", fd);
    } else {
        snprintf(buf, len, ss.ss_family == AF_INET6 ? "[%s]:%s" : "%s:%s", host, port);
    }
    return buf;
}

static int
server_listen_tcp(const char *spec, int *out)
{
    char host[CONF_STR_MAX];
    const char *port;
    struct addrinfo hints, *res = NULL;
    int fd = -1, one = 1, rc;

    /* "host:port" or "[v6]:port" (config.c has validated the shape). */
    if (spec[0] == '[') {
        const char *end = strchr(spec, ']');
        if (end == NULL || end[1] != ':') {
            return -EINVAL;
        }
        snprintf(host, sizeof(host), "%.*s", (int)(end - spec - 1), spec + 1);
        port = end + 2;
    } else {
        const char *colon = strrchr(spec, ':');
        if (colon == NULL) {
            return -EINVAL;
        }
        snprintf(host, sizeof(host), "%.*s", (int)(colon - spec), spec);
        port = colon + 1;
    }
    memset(&hints, 0, sizeof(hints));
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
    rc = getaddrinfo(host[0] ? host : NULL, port, &hints, &res);
    if (rc != 0) {
        log_error("listen %s: %s", spec, gai_strerror(rc));
        return -EINVAL;
    }
    fd = socket(res->ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) {
        rc = -errno;
        goto fail;
    }
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (bind(fd, res->ai_addr, res->ai_addrlen) != 0 || listen(fd, 1024) != 0) {
        rc = -errno;
        goto fail;
    }
    freeaddrinfo(res);
    *out = fd;
    return 0;
fail:
    log_error("listen %s: %s", spec, strerror(-rc));
    if (fd >= 0) {
        close(fd);
    }
    freeaddrinfo(res);
    return rc;
}

static int
server_listen_unix(const char *path, int *out)
{
    struct sockaddr_un sun;
    int fd, rc;

    if (strlen(path) >= sizeof(sun.sun_path)) {
        log_error("unix_socket %s: path longer than %zu bytes", path, sizeof(sun.sun_path) - 1);
        return -ENAMETOOLONG;
    }
    memset(&sun, 0, sizeof(sun));
    sun.sun_family = AF_UNIX;
    memcpy(sun.sun_path, path, strlen(path) + 1);

    fd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) {
        return -errno;
    }
    /* A socket file that still answers belongs to a live daemon: never steal it. */
    int probe = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (probe >= 0) {
        if (connect(probe, (struct sockaddr *)&sun, sizeof(sun)) == 0) {
            close(probe);
            close(fd);
            log_error("unix_socket %s: another process is serving on it", path);
            return -EADDRINUSE;
        }
        close(probe);
    }
    unlink(path);
    if (bind(fd, (struct sockaddr *)&sun, sizeof(sun)) != 0) {
        rc = -errno;
        log_error("unix_socket %s: bind: %s", path, strerror(errno));
        close(fd);
        return rc;
    }
    if (chmod(path, 0660) != 0 || listen(fd, 1024) != 0) {
        rc = -errno;
        log_error("unix_socket %s: %s", path, strerror(errno));
        close(fd);
        unlink(path);
        return rc;
    }
    *out = fd;
    return 0;
}

/* ---- accept and hand-off ---- */

static void
server_reject(struct server *s, int fd, const char *why)
{
    struct outq q;
    struct iovec iov[8];

    outq_init(&q, s->store);
    if (rpc_notify_error(&q, KV_UNAVAILABLE, why) == 0) {
        int n = outq_peek(&q, iov, 8);
        ssize_t wr = writev(fd, iov, n); /* non-blocking, best effort */
        (void)wr;
    }
    outq_deinit(&q);
    close(fd);
}

/*
 * server_refuse_no_fd: accept() failed with EMFILE or ENFILE. Close the spare descriptor,
 * accept the client with it, refuse it with an error notification and take the spare
 * back (memcached's and nginx's way), so that a client past the descriptor limit hears
 * why instead of hanging in the backlog. Logged at most every 10 s. Returns true when a
 * client was refused (the caller accepts on), false when the caller must pause accepts.
 */
static bool
server_refuse_no_fd(struct server *s, int lfd, int err)
{
    bool refused = false;

    if (s->spare_fd >= 0 && (err == EMFILE || err == ENFILE)) {
        close(s->spare_fd);
        int fd = accept4(lfd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd >= 0) {
            server_reject(s, fd, "out of file descriptors");
            atomic_fetch_add_explicit(&s->connections_rejected, 1, memory_order_relaxed);
            atomic_fetch_add_explicit(&s->refused_no_fd, 1, memory_order_relaxed);
            s->fd_refused++;
            refused = true;
        }
        s->spare_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
    }
    uint64_t now = clock_ms();
    if (s->fd_warned_ms == 0 || now - s->fd_warned_ms >= 10000) {
        log_warn("accept: %s (max_connections %llu); %llu client(s) refused with an error "
                 "since the last report", strerror(err),
                 (unsigned long long)server_conf(s)->max_connections,
                 (unsigned long long)s->fd_refused);
        s->fd_warned_ms = now;
        s->fd_refused = 0;
    }
    return refused;
}

/* ---- the RESP2 listeners (resp_listen, resp_unix_socket, resp_tls_listen) ---- */

/* server_resp_kind: the conn_kind of a connection accepted on lfd (0: not a RESP port). */
static int
server_resp_kind(const struct server *s, int lfd)
{
    static const int kinds[SERVER_RESP_PORTS] = {CONN_TCP, CONN_UNIX, CONN_TLS};

    for (int i = 0; i < SERVER_RESP_PORTS; i++) {
        if (lfd >= 0 && s->resp_fd[i] == lfd) {
            return kinds[i] | CONN_RESP;
        }
    }
    return 0;
}

/* server_resp_accepting: stop (on false) or go on (true) accepting on the RESP ports. */
static void
server_resp_accepting(struct server *s, bool on)
{
    for (int i = 0; i < SERVER_RESP_PORTS; i++) {
        if (s->resp_ev[i] != NULL) {
            if (on) {
                event_add(s->resp_ev[i], NULL);
            } else {
                event_del(s->resp_ev[i]);
            }
        }
    }
}

/* server_resp_close: close the RESP listeners (free: their events too). */
static void
server_resp_close(struct server *s, bool free_events)
{
    server_resp_accepting(s, false);
    for (int i = 0; i < SERVER_RESP_PORTS; i++) {
        if (free_events && s->resp_ev[i] != NULL) {
            event_free(s->resp_ev[i]);
            s->resp_ev[i] = NULL;
        }
        if (s->resp_fd[i] >= 0) {
            close(s->resp_fd[i]);
            s->resp_fd[i] = -1;
            if (i == 1) {
                unlink(s->resp_unix_path);
            }
        }
    }
}

static void server_on_accept(evutil_socket_t lfd, short what, void *arg);

/* server_resp_listen: open the RESP listeners c asks for (start). 0 or -1 (logged). */
static int
server_resp_listen(struct server *s, const struct kv_config *c)
{
    if (c->resp_listen[0] != '\0' && server_listen_tcp(c->resp_listen, &s->resp_fd[0]) != 0) {
        return -1;
    }
    if (c->resp_unix_socket[0] != '\0') {
        snprintf(s->resp_unix_path, sizeof(s->resp_unix_path), "%s", c->resp_unix_socket);
        if (server_listen_unix(c->resp_unix_socket, &s->resp_fd[1]) != 0) {
            return -1;
        }
    }
    if (c->resp_tls_listen[0] != '\0'
        && server_listen_tcp(c->resp_tls_listen, &s->resp_fd[2]) != 0) {
        return -1;
    }
    return 0;
}

/* server_resp_events: watch the RESP listeners (start, once the workers run). 0 or -1. */
static int
server_resp_events(struct server *s)
{
    char name[80];

    for (int i = 0; i < SERVER_RESP_PORTS; i++) {
        if (s->resp_fd[i] < 0) {
            continue;
        }
        s->resp_ev[i] = event_new(s->base, s->resp_fd[i], EV_READ | EV_PERSIST,
                                  server_on_accept, s);
        if (s->resp_ev[i] == NULL || event_add(s->resp_ev[i], NULL) != 0) {
            return -1;
        }
        log_info("RESP2 (Redis protocol) on %s%s",
                 i == 1 ? s->resp_unix_path : server_bound_name(s->resp_fd[i], name,
                                                                sizeof(name)),
                 i == 2 ? " over TLS" : "");
    }
    return 0;
}

static void
server_accept_resume(evutil_socket_t fd, short what, void *arg)
{
    struct server *s = arg;
    (void)fd;
    (void)what;

    if (s->draining) {
        return;
    }
    if (s->tcp_ev != NULL) {
        event_add(s->tcp_ev, NULL);
    }
    if (s->unix_ev != NULL) {
        event_add(s->unix_ev, NULL);
    }
    if (s->tls_ev != NULL) {
        event_add(s->tls_ev, NULL);
    }
    server_resp_accepting(s, true);
}

/*
 * server_rcv_window: let accepted TCP connection fd take `bytes` of unread data (its
 * receive window) from the start. Returns 0, or -1 with errno when fd could be left
 * waiting for more than one byte before it wakes the loop (the caller closes it).
 *
 * The kernel's autotuning sizes a receive buffer by how much the reader took in one
 * measured round trip. A client that sends faster than the loop reads keeps the queue
 * full, the round trip it measures drops to microseconds, and the buffer stays small: on
 * loopback kvstashd's sockets stayed at 2-7 MB, raw-bench's blocking server's grew to
 * 20-33 MB, and a client pipelining two 8 MiB batch_puts keeps 16 MiB in flight. The
 * client then waits on the window; each read here sends the window update that makes
 * the client transmit inside this thread's system call, and segments sent from two CPUs
 * arrive out of order and are retransmitted. Measured with kvstash-bench, A/B in one
 * sitting (medians of 3): 64 KiB puts on 8 connections 2.69 -> 3.20 GB/s and 0.53 ->
 * 0.37 daemon core-s/GB; 1 MiB puts on 8 connections 3.16 -> 3.58 GB/s, on one 2.84 ->
 * 3.09 GB/s; gets unchanged.
 *
 * SO_RCVBUF would lock the buffer at a size net.core.rmem_max caps (208 KiB by
 * default). Raising SO_RCVLOWAT instead makes Linux grow the buffer to fit that window
 * (capped at half of net.ipv4.tcp_rmem's maximum) and leaves autotuning on; setting it
 * back to 1 keeps the buffer and wakes the loop for every byte again.
 */
static int
server_rcv_window(int fd, uint64_t bytes)
{
    int v = bytes < INT_MAX ? (int)bytes : INT_MAX;

    if (v <= 1 || setsockopt(fd, SOL_SOCKET, SO_RCVLOWAT, &v, sizeof(v)) != 0) {
        return 0; /* asked for nothing, or not supported: autotuning alone */
    }
    v = 1;
    return setsockopt(fd, SOL_SOCKET, SO_RCVLOWAT, &v, sizeof(v));
}

/* A congestion control that could not be set: logged once per local_tcp_congestion. */
static void
server_congestion_warn(struct server *s, const char *name, int rc)
{
    if (!s->congestion_warned) {
        s->congestion_warned = true;
        log_warn("local_tcp_congestion \"%s\": %s; connections keep the host's algorithm "
                 "(see net.ipv4.tcp_available_congestion_control)", name, kv_strerror(rc));
    }
}

/*
 * server_listen_congestion: give the TCP listeners (listen, tls_listen, resp_listen,
 * resp_tls_listen) the congestion control `name`, which the connections they accept
 * inherit before their handshake: set after accept it would come too late (tcpopt.h). ""
 * after a name puts the host's default back; "" on listeners never given one leaves them
 * alone. Main thread (start, reload).
 *
 * The RESP ports were once left out: their connections began under the host's default
 * (bbr here), were switched to reno after accept, and stayed paced for life. A RESP GET
 * of 64 KiB then started 0.071 pacing timers in the daemon where a msgpack get started
 * 0.018 (perf stat -e timer:hrtimer_start -p, 24,000 GETs each).
 */
static void
server_listen_congestion(struct server *s, const char *name)
{
    char host[TCPOPT_NAME_MAX];
    const char *set = name;
    int fds[4] = {s->tcp_fd, s->tls_fd, s->resp_fd[0], s->resp_fd[2]};

    if (name[0] == '\0') {
        if (!s->listen_congestion) {
            return;
        }
        int rc = tcpopt_host_congestion(host, sizeof(host));
        if (rc != 0) {
            server_congestion_warn(s, name, rc);
            return;
        }
        set = host;
    }
    for (int i = 0; i < 4; i++) {
        int rc = fds[i] >= 0 ? tcpopt_congestion(fds[i], set) : 0;
        if (rc != 0) {
            server_congestion_warn(s, set, rc);
        }
    }
    s->listen_congestion = true;
}

/*
 * server_congestion: settle accepted TCP connection fd, which inherited the listener's
 * algorithm: a client on this host keeps local_tcp_congestion `name`; a client elsewhere
 * (or any, with "") is switched to the host's default before any data. Nothing to do
 * while the listeners were never given an algorithm.
 */
static void
server_congestion(struct server *s, int fd, const char *name)
{
    if (name[0] == '\0' && !s->listen_congestion) {
        return;
    }
    /* with "" every connection gets the host's: no need to ask where it is from */
    int rc = tcpopt_accepted_congestion(fd, name, name[0] != '\0' && tcpopt_same_host(fd));
    if (rc != 0) {
        server_congestion_warn(s, name, rc);
    }
}

static void
server_on_accept(evutil_socket_t lfd, short what, void *arg)
{
    struct server *s = arg;
    int resp = server_resp_kind(s, lfd);
    int is_unix = (lfd == s->unix_fd) || (resp & ~CONN_RESP) == CONN_UNIX;
    int is_tls = (lfd == s->tls_fd) || (resp & ~CONN_RESP) == CONN_TLS;
    (void)what;

    for (int i = 0; i < SERVER_ACCEPTS_PER_WAKE; i++) {
        int fd = accept4(lfd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) {
            if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR ||
                errno == ECONNABORTED) {
                return;
            }
            atomic_fetch_add_explicit(&s->accept_errors, 1, memory_order_relaxed);
            if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) {
                /* Out of descriptors: refuse the client with the spare one, or stop
                 * accepting for a moment instead of spinning. */
                struct timeval tv = {0, 100 * 1000};
                if (server_refuse_no_fd(s, lfd, errno)) {
                    continue;
                }
                if (s->tcp_ev != NULL) {
                    event_del(s->tcp_ev);
                }
                if (s->unix_ev != NULL) {
                    event_del(s->unix_ev);
                }
                if (s->tls_ev != NULL) {
                    event_del(s->tls_ev);
                }
                server_resp_accepting(s, false);
                evtimer_add(s->accept_timer, &tv);
                return;
            }
            log_warn("accept: %s", strerror(errno));
            return;
        }
        const struct kv_config *conf = server_conf(s);
        uint64_t n = atomic_fetch_add_explicit(&s->connections, 1, memory_order_relaxed);
        if (n >= conf->max_connections) {
            atomic_fetch_sub_explicit(&s->connections, 1, memory_order_relaxed);
            atomic_fetch_add_explicit(&s->connections_rejected, 1, memory_order_relaxed);
            log_kv(LOG_LEVEL_WARN, "connection refused", LOG_STR("reason", "max_connections"),
                   LOG_NUM("max_connections", conf->max_connections));
            server_reject(s, fd, "max_connections reached");
            continue;
        }
        atomic_fetch_add_explicit(&s->connections_total, 1, memory_order_relaxed);
        if (!is_unix) {
            int one = 1;
            setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
            if (server_rcv_window(fd, conf->tcp_receive_window) != 0) {
                log_warn("accept: setsockopt(SO_RCVLOWAT): %s; connection closed",
                         strerror(errno));
                atomic_fetch_sub_explicit(&s->connections, 1, memory_order_relaxed);
                close(fd);
                continue;
            }
            server_congestion(s, fd, conf->local_tcp_congestion);
        }
        struct worker *w = s->workers[s->next_worker];
        s->next_worker = (s->next_worker + 1) % s->nworkers;
        int kind = (is_unix ? CONN_UNIX : is_tls ? CONN_TLS : CONN_TCP) | (resp & CONN_RESP);
        if (worker_hand_off(w, fd, kind) != 0) {
            atomic_fetch_sub_explicit(&s->connections, 1, memory_order_relaxed);
            close(fd);
            continue;
        }
    }
}

/* ---- process-wide state: RDMA device, quotas, SSD tier, wake-ups ---- */

/*
 * server_rdma_open: the rdma setting against this machine and build: open
 * the device and register the whole arena once (as several memory regions
 * when it is larger than the device allows in one). `required` refuses to
 * start and says what is missing; `auto` serves without RDMA and says why;
 * a client that asks for RDMA where there is none is refused, never served
 * over TCP instead.
 */
static int
server_rdma_open(struct server *s, const struct kv_config *c)
{
    char why[256] = "";
    uint8_t *base;
    uint64_t size;
    int rc;

    if (c->rdma == CONF_RDMA_OFF) {
        return 0;
    }
    rc = rdma_dev_open(rdma_default_ops(), c->rdma_device, (uint8_t)c->rdma_port,
                       (uint8_t)c->rdma_gid_index, &s->rdma_dev, why, sizeof(why));
    if (rc == 0) {
        (void)store_arena(s->store, &base, &size);
        rc = rdma_region_register(s->rdma_dev, base, size,
                                  RDMA_ACCESS_LOCAL_WRITE | RDMA_ACCESS_REMOTE_READ
                                      | RDMA_ACCESS_REMOTE_WRITE,
                                  &s->rdma_arena);
        if (rc != 0) {
            snprintf(why, sizeof(why), "registering the %llu-byte arena with RDMA device %s "
                     "failed: %s", (unsigned long long)size, rdma_dev_name(s->rdma_dev),
                     kv_strerror(rc));
            rdma_dev_close(s->rdma_dev);
            s->rdma_dev = NULL;
        }
    }
    if (rc != 0) {
        if (c->rdma == CONF_RDMA_REQUIRED) {
            log_error("rdma = required, but %s; refusing to start (set rdma to auto or off "
                      "to serve without it)", why);
            return -1;
        }
        log_info("rdma: %s; serving without RDMA", why);
        return 0;
    }
    s->rpc.rdma_arena = s->rdma_arena;     /* "rdma" joins the transports after the sockets' */
    log_info("rdma: device %s port %llu, the %llu-byte arena registered", rdma_dev_name(s->rdma_dev),
             (unsigned long long)c->rdma_port, (unsigned long long)size);
    return 0;
}

/*
 * server_apply_quotas: the tenants' quotas of next into the store; a tenant
 * of old that next no longer has gives its slot back. old may be NULL.
 */
static void
server_apply_quotas(struct server *s, const struct kv_config *old, const struct kv_config *next)
{
    for (uint32_t i = 0; old != NULL && i < old->tenants.n; i++) {
        const struct conf_tenant *t = &old->tenants.t[i];

        if (conf_tenant_find(next, t->name, strlen(t->name)) == NULL) {
            store_drop_quota(s->store, t->id);
        }
    }
    for (uint32_t i = 0; i < next->tenants.n; i++) {
        const struct conf_tenant *t = &next->tenants.t[i];

        if (store_set_quota(s->store, t->id, t->memory_quota, t->ssd_quota) != 0) {
            log_error("tenant %s: no room for another quota (at most 64 tenants have one)",
                      t->name);
        }
    }
}

/* From the SSD tier's and the copiers' threads: wake every worker (waiting requests go on). */
static void
server_wake(void *arg)
{
    struct server *s = arg;

    for (int i = 0; i < s->nworkers; i++) {
        worker_wake(s->workers[i]);
    }
}

/*
 * server_ssd_loading: true while the SSD index is rebuilt in the background after start
 * (ssd_state LOADING), with how far it got in why. Any thread: s->ssd is set before the
 * node asks to be active (member_set_state, after ssd_open) and not changed until exit.
 */
static bool
server_ssd_loading(struct server *s, char *why, size_t len)
{
    struct ssd_stats st;

    if (s->ssd == NULL || ssd_state(s->ssd) != SSD_STATE_LOADING) {
        return false;
    }
    ssd_stats(s->ssd, &st);
    snprintf(why, len, "its SSD index is loaded (rebuilding: %llu of %llu bucket files)",
             (unsigned long long)st.rebuild_buckets_done, (unsigned long long)st.rebuild_buckets);
    return true;
}

/* server_member_ready: member.h's ready check: a pool member owns keys once its SSD index
 * is loaded, so that it is never asked for keys its SSD holds but its table does not yet. */
static bool
server_member_ready(void *arg, char *why, size_t len)
{
    return !server_ssd_loading(arg, why, len);
}

/* server_cluster_start: the data paths of a pool (src/cluster/repl.h). 0 or -1 (logged). */
static int
server_cluster_start(struct server *s, const struct kv_config *c)
{
    struct repl_config rc = {
        .store = s->store,
        .replicas = (unsigned)c->replicas,
        .peer_timeout_ms = c->peer_timeout,
        .max_message_size = c->max_message_size,
        .queue_max = c->memory_size / 4 < SERVER_REPL_QUEUE_MAX ? c->memory_size / 4
                                                                 : SERVER_REPL_QUEUE_MAX,
        .wait_acks = c->write_ack == CONF_WRITE_ACK_ALL,
        .wake = server_wake,
        .wake_arg = s,
        .rdma_dev = s->rdma_dev,
        .rdma_arena = s->rdma_arena,
    };
    const char *fixed = getenv("KVSTASH_TEST_VIEW");
    char token[CLUSTER_TOKEN_MAX + 1], why[512];
    int rv = cluster_token_load(c, token, sizeof(token), why, sizeof(why));

    if (rv != 0) {
        log_error("cluster: %s", why);
        return -1;
    }
    rc.token = token[0] != '\0' ? token : NULL;    /* copied by the peer pool */
    if (c->tls_cert_file[0] != '\0' && c->tls_key_file[0] != '\0') {
        rc.tls_cert = c->tls_cert_file;     /* TLS to the peers that listen for it */
        rc.tls_key = c->tls_key_file;
        rc.tls_ca = c->tls_ca_file;
    }
    rv = repl_create(&rc, &s->repl);
    explicit_bzero(token, sizeof(token));
    if (rv != 0) {
        log_error("cluster: cannot start the peer connections: %s", kv_strerror(rv));
        return -1;
    }
    s->remote.arg = s->repl;
    s->remote.fetch = repl_fetch;
    s->remote.stored = repl_stored;
    s->remote.ticket_done = repl_ticket_done;
    s->remote.ticket_put = repl_ticket_put;
    s->remote.flush = repl_flush;
    s->rpc.remote = &s->remote;
    struct rebalance_config rbc = {
        .store = s->store,
        .pool = repl_walk_pool(s->repl),
        .repl = s->repl,
        .replicas = (unsigned)c->replicas,
        .delay_ms = c->rebalance_delay,
        .peer_timeout_ms = c->peer_timeout,
    };
    rv = rebalance_start(&rbc, &s->rebalance);
    if (rv != 0) {
        log_error("cluster: cannot start the rebalance thread: %s", kv_strerror(rv));
        return -1;
    }
    if (fixed != NULL && repl_static_view(fixed, s->node_id) != 0) {
        return -1;
    }
    return 0;
}

/* server_ssd_config: the tier's settings from a config (strings borrowed from conf). */
static void
server_ssd_config(struct server *s, const struct kv_config *c, struct ssd_config *sc)
{
    memset(sc, 0, sizeof(*sc));
    sc->dir = c->ssd_dir;
    sc->size = c->ssd_size;
    sc->bucket_size = c->ssd_bucket_size;
    sc->eviction = c->ssd_eviction == CONF_SSD_LRU ? SSD_LRU : SSD_FIFO;
    sc->high_watermark = c->ssd_high_watermark;
    sc->low_watermark = c->ssd_low_watermark;
    sc->offload = c->ssd_offload == CONF_SSD_WRITE_THROUGH ? SSD_WRITE_THROUGH
                  : c->ssd_offload == CONF_SSD_OFF       ? SSD_OFFLOAD_OFF
                                                          : SSD_ON_EVICT;
    sc->promote = c->ssd_promote != 0;
    sc->write_rate_limit = c->ssd_write_rate_limit;
    sc->scrub_rate = c->ssd_scrub_rate;
    sc->io_threads = (int)c->ssd_io_threads;
    sc->max_key_size = (uint32_t)c->max_key_size;
    sc->max_value_size = c->max_value_size;
    sc->wake = server_wake;
    sc->wake_arg = s;
}

/* ---- config reload ---- */

/*
 * server_fd_limit: raise the soft RLIMIT_NOFILE to what max_connections needs (a
 * descriptor a connection, plus SERVER_FD_RESERVE for listeners, pipes, the SSD tier's
 * files and LMDB) as far as the hard limit allows, as Redis does, and say so when that
 * falls short: past it clients are refused (server_refuse_no_fd). At start and reload.
 */
static void
server_fd_limit(uint64_t max_connections)
{
    struct rlimit rl;
    rlim_t want = (rlim_t)(max_connections + SERVER_FD_RESERVE);

    if (getrlimit(RLIMIT_NOFILE, &rl) != 0 || rl.rlim_cur == RLIM_INFINITY || rl.rlim_cur >= want) {
        return;
    }
    rlim_t was = rl.rlim_cur;
    rl.rlim_cur = rl.rlim_max == RLIM_INFINITY || rl.rlim_max >= want ? want : rl.rlim_max;
    if (rl.rlim_cur > was && setrlimit(RLIMIT_NOFILE, &rl) == 0) {
        log_info("RLIMIT_NOFILE raised from %llu to %llu for max_connections %llu",
                 (unsigned long long)was, (unsigned long long)rl.rlim_cur,
                 (unsigned long long)max_connections);
        was = rl.rlim_cur;
    }
    if (was < want) {
        log_warn("max_connections %llu needs about %llu descriptors but RLIMIT_NOFILE allows "
                 "%llu: clients past that are refused with \"out of file descriptors\"",
                 (unsigned long long)max_connections, (unsigned long long)want,
                 (unsigned long long)was);
    }
}

static int
server_build_conf(struct server *s, struct kv_config *c, char *err, size_t errlen)
{
    conf_init(c);
    if (s->config_path != NULL && conf_load_file(c, s->config_path, err, errlen) != 0) {
        return -1;
    }
    for (int i = 0; i < s->argc; i++) {
        char key[128];
        const char *arg = s->argv[i] + 2; /* skip "--" */
        const char *eq = strchr(arg, '=');
        if (eq == NULL || (size_t)(eq - arg) >= sizeof(key)) {
            continue;
        }
        char flag[sizeof(key) + 2];
        snprintf(key, sizeof(key), "%.*s", (int)(eq - arg), arg);
        snprintf(flag, sizeof(flag), "--%s", key);
        if (conf_set(c, key, eq + 1, flag, err, errlen) != 0) {
            return -1;
        }
    }
    return conf_finalize(c, err, errlen);
}

static void
server_log_restart_key(const char *key, bool reloadable, void *arg)
{
    (void)arg;
    if (!reloadable) {
        log_warn("reload: '%s' changed but needs a restart; keeping the running value", key);
    } else {
        log_info("reload: '%s' changed", key);
    }
}

/*
 * server_cluster_reload: the pool's peer side under the reloaded config c: the cluster token
 * (<data_dir>/cluster_token, checked against c's admin tenant) and the peer TLS files, for
 * peer connections dialled from now on. apply false: only check that both can be used
 * (nothing changes); true: hand them to the peer pool. 0, or -1 with the reason in err.
 */
static int
server_cluster_reload(struct server *s, const struct kv_config *c, bool apply, char *err,
                      size_t errlen)
{
    char token[CLUSTER_TOKEN_MAX + 1];
    struct peer_config pc = {0};
    int rc;

    if (s->repl == NULL) {
        return 0;
    }
    rc = cluster_token_load(c, token, sizeof(token), err, errlen);
    if (rc != 0) {
        return -1;
    }
    pc.token = token;
    if (c->tls_cert_file[0] != '\0' && c->tls_key_file[0] != '\0') {
        pc.tls_cert = c->tls_cert_file;
        pc.tls_key = c->tls_key_file;
        pc.tls_ca = c->tls_ca_file;
    }
    if (!apply) {
        struct peer_tls_ctx *check = NULL;

        rc = pc.tls_cert != NULL ? peer_tls_ctx_new(pc.tls_cert, pc.tls_key, pc.tls_ca, &check,
                                                    err, errlen) : 0;
        peer_tls_ctx_free(check);
    } else {
        rc = peer_pool_reload(repl_pool(s->repl), &pc, err, errlen);
        if (rc == 0 && repl_walk_pool(s->repl) != repl_pool(s->repl)) {
            rc = peer_pool_reload(repl_walk_pool(s->repl), &pc, err, errlen);
        }
    }
    explicit_bzero(token, sizeof(token));
    return rc == 0 ? 0 : -1;
}

/* server_cluster_reload_apply: server_cluster_reload's apply step, after its check passed. */
static void
server_cluster_reload_apply(struct server *s, const struct kv_config *c)
{
    char err[512];

    if (s->repl != NULL && server_cluster_reload(s, c, true, err, sizeof(err)) != 0) {
        /* the files changed between the check and now: the old token and files stay */
        log_error("reload: cluster: %s; peer connections keep the previous token and "
                  "certificates", err);
    } else if (s->repl != NULL) {
        log_info("reload: cluster token and peer certificates reloaded (new peer connections)");
    }
}

/* server_swap_tls: new TLS connections get *ctx's certificates; those made before keep theirs. */
static void
server_swap_tls(struct server *s, SSL_CTX **ctx)
{
    SSL_CTX *old;

    if (*ctx == NULL) {
        return;
    }
    pthread_mutex_lock(&s->tls_lock);
    old = s->tls_ctx;
    s->tls_ctx = *ctx;
    pthread_mutex_unlock(&s->tls_lock);
    tls_ctx_free(old);
    *ctx = NULL;
}

/*
 * server_reload: SIGHUP. Build and check the whole new config first; apply its reloadable
 * keys as a new snapshot, which the workers pick up (conn_refresh_limits). Snapshots are
 * kept until exit (connections may point into one), so a reload that changes no key keeps
 * the running one: automation that reloads often without changes costs nothing. The log
 * file and the TLS certificates are reopened either way.
 */
static void
server_reload(struct server *s)
{
    char err[1024];
    struct kv_config *fresh = malloc(sizeof(*fresh));
    struct kv_config *next = malloc(sizeof(*next));
    const struct kv_config *cur = server_conf(s);
    struct kv_config **olds;
    SSL_CTX *tls_ctx = NULL;

    if (fresh == NULL || next == NULL) {
        log_error("reload: out of memory; keeping the running config");
        goto fail;
    }
    if (server_build_conf(s, fresh, err, sizeof(err)) != 0) {
        log_kv(LOG_LEVEL_ERROR, "reload failed, keeping the running config",
               LOG_STR("path", s->config_path != NULL ? s->config_path : ""),
               LOG_STR("error", err));
        goto fail;
    }
    if (s->tls_ctx != NULL) {
        tls_ctx = tls_ctx_new(fresh->tls_cert_file, fresh->tls_key_file, fresh->tls_ca_file, err,
                              sizeof(err));
        if (tls_ctx == NULL) {
            log_error("reload failed, keeping the running config and certificates: %s", err);
            goto fail;
        }
    }
    conf_diff(cur, fresh, server_log_restart_key, NULL);
    *next = *cur;
    conf_apply_reloadable(next, fresh);
    if (server_cluster_reload(s, next, false, err, sizeof(err)) != 0) {
        log_error("reload failed, keeping the running config and certificates: cluster: %s", err);
        goto fail;
    }
    bool changed = conf_diff(cur, next, NULL, NULL) > 0;
    /* What can fail comes before anything is applied: a failed reload changes nothing. */
    if (changed) {
        olds = realloc(s->old_confs, (size_t)(s->nold + 1) * sizeof(*olds));
        if (olds == NULL) {
            log_error("reload: out of memory; keeping the running config");
            goto fail;
        }
        s->old_confs = olds;
    }
    if (strcmp(next->log_file, cur->log_file) != 0) {
        int rc = log_open(next->log_file, cur->log_level);
        if (rc != 0) {
            log_error("reload failed, keeping the running config: cannot open log_file '%s': %s",
                      next->log_file, strerror(-rc));
            goto fail;
        }
    } else if (log_reopen() != 0) {
        /* The same file, reopened so that a rotated log starts anew (logrotate's postrotate
         * may send SIGHUP or SIGUSR1); the old descriptor stays on failure. */
        log_error("reload: cannot reopen log_file '%s'; still writing to the old one",
                  next->log_file);
    }
    if (!changed) {
        server_swap_tls(s, &tls_ctx);
        server_cluster_reload_apply(s, next);
        log_info("reload: no key changed%s", s->tls_ctx != NULL ? "; certificates reloaded" : "");
        free(fresh);
        free(next);
        return;
    }

    struct store_config sc = {
        .memory_size = next->memory_size,
        .max_key_size = (uint32_t)next->max_key_size,
        .max_value_size = next->max_value_size,
        .high_watermark = next->eviction_high_watermark,
        .low_watermark = next->eviction_low_watermark,
        .policy = server_evict_policy(next->eviction_policy),
    };
    if (store_set_limits(s->store, &sc) != 0) {
        /* conf_finalize checked the same rules: not expected, but then nothing changes */
        log_error("reload: store rejected the new limits; keeping the running config");
        if (strcmp(next->log_file, cur->log_file) != 0) {
            (void)log_open(cur->log_file, cur->log_level);
        }
        goto fail;
    }
    if (s->ssd != NULL) {
        struct ssd_config ssc;

        server_ssd_config(s, next, &ssc);
        ssd_reconfigure(s->ssd, &ssc);
    }
    server_apply_quotas(s, cur, next);
    server_swap_tls(s, &tls_ctx);
    server_cluster_reload_apply(s, next);
    log_set_level(next->log_level);
    log_set_format(next->log_format);
    if (next->max_connections != cur->max_connections) {
        server_fd_limit(next->max_connections);
    }
    s->old_confs[s->nold++] = (struct kv_config *)cur;
    if (strcmp(next->local_tcp_congestion, cur->local_tcp_congestion) != 0) {
        s->congestion_warned = false; /* a new name's failure is logged again */
        server_listen_congestion(s, next->local_tcp_congestion);
    }
    atomic_store_explicit(&s->conf, next, memory_order_release);
    free(fresh);
    for (int i = 0; i < s->nworkers; i++) {
        worker_reload(s->workers[i]);   /* logins the new tenants revoke are closed */
    }
    log_kv(LOG_LEVEL_INFO, "reload: configuration applied",
           LOG_STR("path", s->config_path != NULL ? s->config_path : ""));
    return;
fail:
    tls_ctx_free(tls_ctx);
    free(fresh);
    free(next);
}

/* server_tls_new: a conn_tls_new_fn (arg: the server): an SSL with the current context. */
static SSL *
server_tls_new(void *arg)
{
    struct server *s = arg;
    SSL *ssl;

    pthread_mutex_lock(&s->tls_lock);
    ssl = s->tls_ctx != NULL ? SSL_new(s->tls_ctx) : NULL;    /* it takes its own reference */
    pthread_mutex_unlock(&s->tls_lock);
    return ssl;
}

/* ---- signals and drain ---- */

static bool
server_workers_done(struct server *s)
{
    for (int i = 0; i < s->nworkers; i++) {
        if (!worker_done(s->workers[i])) {
            return false;
        }
    }
    return true;
}

static void
server_on_drain_tick(evutil_socket_t fd, short what, void *arg)
{
    struct server *s = arg;
    (void)fd;
    (void)what;

    if (server_workers_done(s)) {
        log_info("shutdown: all connections drained");
        event_base_loopbreak(s->base);
        return;
    }
    if (clock_ms() >= s->drain_deadline_ms) {
        log_warn("shutdown: drain deadline passed; closing the remaining connections");
        for (int i = 0; i < s->nworkers; i++) {
            worker_break(s->workers[i]);
        }
        event_base_loopbreak(s->base);
    }
}

static void
server_begin_drain(struct server *s)
{
    const struct kv_config *conf = server_conf(s);
    struct timeval tick = {0, 20 * 1000};

    s->draining = 1;
    (void)sdnotify_send("STOPPING=1");
    atomic_store(&s->phase, SERVER_PHASE_DRAINING);
    log_info("shutdown: no longer accepting; draining connections (deadline %llu ms)",
             (unsigned long long)conf->shutdown_timeout_ms);
    if (s->tcp_ev != NULL) {
        event_del(s->tcp_ev);
    }
    if (s->unix_ev != NULL) {
        event_del(s->unix_ev);
    }
    if (s->tls_ev != NULL) {
        event_del(s->tls_ev);
    }
    if (s->tcp_fd >= 0) {
        close(s->tcp_fd);
        s->tcp_fd = -1;
    }
    if (s->tls_fd >= 0) {
        close(s->tls_fd);
        s->tls_fd = -1;
    }
    if (s->unix_fd >= 0) {
        close(s->unix_fd);
        s->unix_fd = -1;
        unlink(s->unix_path);
    }
    server_resp_close(s, false);
    s->drain_deadline_ms = clock_ms() + conf->shutdown_timeout_ms;
    for (int i = 0; i < s->nworkers; i++) {
        worker_drain(s->workers[i]);
    }
    s->drain_timer = event_new(s->base, -1, EV_PERSIST, server_on_drain_tick, s);
    if (s->drain_timer == NULL) {
        event_base_loopbreak(s->base);
        return;
    }
    evtimer_add(s->drain_timer, &tick);
}

static void
server_on_signal(evutil_socket_t sig, short what, void *arg)
{
    struct server *s = arg;
    (void)what;

    switch (sig) {
    case SIGHUP:
        log_info("SIGHUP: reloading %s", s->config_path ? s->config_path : "(no config file)");
        (void)sdnotify_send("RELOADING=1");
        server_reload(s);
        (void)sdnotify_send("READY=1");
        break;
    case SIGUSR2:
        if (s->member == NULL) {
            log_warn("SIGUSR2: not in a pool (cluster_name is empty): nothing to drain");
        } else {
            log_info("SIGUSR2: draining this node's keys to the pool");
            member_drain();
        }
        break;
    case SIGUSR1:
        if (log_reopen() != 0) {
            log_error("SIGUSR1: cannot reopen the log file");
        } else {
            log_info("SIGUSR1: log file reopened");
        }
        break;
    case SIGTERM:
    case SIGINT:
        if (s->draining) {
            if (sig == SIGINT) {
                log_warn("second SIGINT: exiting now");
                _exit(1);
            }
            return;
        }
        log_info("%s: shutting down", sig == SIGTERM ? "SIGTERM" : "SIGINT");
        server_begin_drain(s);
        break;
    default:
        break;
    }
}

/*
 * server_log_start: the one line that says what this process serves: version, config file,
 * listeners, tiers with their capacities, transports.
 */
static void
server_log_start(struct server *s, const struct kv_config *c)
{
    char tcp[80], tls[80], tiers[CONF_STR_MAX + 128], tps[64] = "";
    const char *metrics = c->metrics_listen[0] != '\0' ? c->metrics_listen : "off";

    server_bound_name(s->tcp_fd, tcp, sizeof(tcp));
    if (s->ssd != NULL) {
        snprintf(tiers, sizeof(tiers), "dram %llu bytes, ssd %llu bytes in %s",
                 (unsigned long long)c->memory_size, (unsigned long long)c->ssd_size, c->ssd_dir);
    } else {
        snprintf(tiers, sizeof(tiers), "dram %llu bytes, no ssd",
                 (unsigned long long)c->memory_size);
    }
    for (int i = 0; i < s->rpc.ntransports; i++) {
        size_t l = strlen(tps);
        snprintf(tps + l, sizeof(tps) - l, "%s%s", i > 0 ? "," : "", s->transports[i]);
    }
    if (s->rdma_dev != NULL) {
        size_t l = strlen(tps);
        snprintf(tps + l, sizeof(tps) - l, "%srdma", tps[0] != '\0' ? "," : "");
    }
    log_kv(LOG_LEVEL_INFO, "kvstashd started", LOG_STR("version", KVSTASH_VERSION),
           LOG_STR("config", s->config_path != NULL ? s->config_path : "(none)"),
           LOG_STR("node", s->node_id), LOG_STR("listen", s->tcp_fd >= 0 ? tcp : "off"),
           LOG_STR("unix_socket", s->unix_fd >= 0 ? s->unix_path : "off"),
           LOG_STR("tls_listen", s->tls_fd >= 0 ? server_bound_name(s->tls_fd, tls, sizeof(tls))
                                                : "off"),
           LOG_STR("metrics_listen", metrics), LOG_STR("tiers", tiers),
           LOG_STR("transports", tps), LOG_NUM("io_threads", s->nworkers));
}

/* ---- create / run / destroy ---- */

int
server_create(const struct kv_config *conf, const char *config_path, int argc, char **argv,
              struct server **out)
{
    struct server *s = calloc(1, sizeof(*s));
    struct kv_config *c = malloc(sizeof(*c));
    int rc;
    static const int sigs[5] = {SIGHUP, SIGTERM, SIGINT, SIGUSR1, SIGUSR2};

    if (s == NULL || c == NULL) {
        free(s);
        free(c);
        log_error("out of memory");
        return -1;
    }
    *c = *conf;
    atomic_init(&s->conf, c);
    s->config_path = config_path;
    s->argc = argc;
    s->argv = argv;
    s->tcp_fd = s->unix_fd = s->tls_fd = s->metrics_fd = -1;
    atomic_init(&s->phase, SERVER_PHASE_STARTING);
    for (int i = 0; i < SERVER_RESP_PORTS; i++) {
        s->resp_fd[i] = -1;
    }
    s->spare_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
    server_fd_limit(c->max_connections);
    pthread_mutex_init(&s->tls_lock, NULL);
    s->started = time(NULL);

    rc = server_mkdirs(c->data_dir);
    if (rc != 0) {
        log_error("data_dir %s: %s", c->data_dir, strerror(-rc));
        goto fail;
    }
    rc = server_node_id(s, c);
    if (rc != 0) {
        log_error("node_id in %s: %s", c->data_dir, strerror(-rc));
        goto fail;
    }

    struct store_config sc = {
        .memory_size = c->memory_size,
        .max_key_size = (uint32_t)c->max_key_size,
        .max_value_size = c->max_value_size,
        .high_watermark = c->eviction_high_watermark,
        .low_watermark = c->eviction_low_watermark,
        .policy = server_evict_policy(c->eviction_policy),
        .evict_background = true,
        .hugepages = c->memory_hugepages == CONF_HUGEPAGES_ON    ? STORE_HUGEPAGES_ON
                     : c->memory_hugepages == CONF_HUGEPAGES_OFF ? STORE_HUGEPAGES_OFF
                                                                 : STORE_HUGEPAGES_AUTO,
        .memory_file = c->memory_file,
    };
    rc = store_create(&sc, &s->store);
    if (rc != 0) {
        log_error("cannot create the DRAM tier of %llu bytes: %s",
                  (unsigned long long)c->memory_size, kv_strerror(rc));
        goto fail;
    }
    {
        const char *why;
        uint8_t *base;
        uint64_t size;

        (void)store_arena(s->store, &base, &size);
        (void)store_arena_backing(s->store, &why);
        log_info("memory: the arena of %llu bytes is on %s", (unsigned long long)size, why);
    }

    s->rpc.store = s->store;
    s->rpc.version = KVSTASH_VERSION;
    s->rpc.node_id = s->node_id;
    s->rpc.transports = s->transports;
    s->rpc.stats_fn = stats_collect;
    s->rpc.stats_arg = s;
    if (server_rdma_open(s, c) != 0) {     /* before the pool: its peers use the device */
        goto fail;
    }
    if (c->cluster_name[0] != '\0' && server_cluster_start(s, c) != 0) {
        goto fail;
    }

    if (evthread_use_pthreads() != 0) {
        log_error("libevent: no pthreads support");
        goto fail;
    }
    s->base = event_base_new();
    if (s->base == NULL) {
        log_error("libevent: cannot create the main event base");
        goto fail;
    }
    /* Signals first: a SIGTERM that arrives once clients can connect must drain, not kill. */
    for (int i = 0; i < 5; i++) {
        s->sig_ev[i] = evsignal_new(s->base, sigs[i], server_on_signal, s);
        if (s->sig_ev[i] == NULL || event_add(s->sig_ev[i], NULL) != 0) {
            log_error("cannot install the handler of signal %d", sigs[i]);
            goto fail;
        }
    }
    if (c->cluster_name[0] != '\0') {
        /* Registered as joining now; active once the SSD index is loaded (below). A second
         * daemon with this node_id, or a pool whose config differs, stops the start here
         * (member.c logged why); etcd out of reach does not: this node serves alone and
         * joins when etcd answers. */
        rc = member_start(c, s->node_id, &s->member);
        if (rc != 0) {
            goto fail;
        }
        member_set_drain_hook(rebalance_drain_hook, s->rebalance);  /* the hand-off */
        member_set_ready_check(server_member_ready, s);     /* joining while the SSD loads */
        rc = member_wait_first(s->member, SERVER_MEMBER_WAIT_MS);
        if (rc == -EEXIST || rc == -EINVAL) {
            goto fail;
        }
        if (rc != 0) {
            log_warn("cluster: etcd not reached yet: serving alone, joining the pool when it "
                     "answers");
        }
    }
    if (c->listen[0] != '\0') {
        if (server_listen_tcp(c->listen, &s->tcp_fd) != 0) {
            goto fail;
        }
        s->transports[s->rpc.ntransports++] = "tcp";
    }
    if (c->unix_socket[0] != '\0' && strcmp(c->unix_socket, "none") != 0) {
        snprintf(s->unix_path, sizeof(s->unix_path), "%s", c->unix_socket);
        if (server_listen_unix(c->unix_socket, &s->unix_fd) != 0) {
            goto fail;
        }
        s->transports[s->rpc.ntransports++] = "unix";
        s->transports[s->rpc.ntransports++] = "shm";   /* registered buffers, over the socket */
    }
    if (c->tls_listen[0] != '\0' || c->resp_tls_listen[0] != '\0') {
        char err[512];

        s->tls_ctx = tls_ctx_new(c->tls_cert_file, c->tls_key_file, c->tls_ca_file, err,
                                 sizeof(err));
        if (s->tls_ctx == NULL) {
            log_error("%s", err);
            goto fail;
        }
        if (c->tls_listen[0] != '\0') {
            if (server_listen_tcp(c->tls_listen, &s->tls_fd) != 0) {
                goto fail;
            }
            s->transports[s->rpc.ntransports++] = "tls";
        }
    }
    if (server_resp_listen(s, c) != 0) {
        goto fail;
    }
    if (s->tcp_fd < 0 && s->unix_fd < 0 && s->tls_fd < 0) {
        log_error("nothing to listen on: both listen and unix_socket are disabled");
        goto fail;
    }
    if (c->metrics_listen[0] != '\0') {
        /* Up before the SSD index loads, so /readyz can say that it does. */
        if (server_listen_tcp(c->metrics_listen, &s->metrics_fd) != 0) {
            goto fail;
        }
        rc = admin_start(s->metrics_fd, s, &s->admin);
        if (rc != 0) {
            log_error("metrics_listen %s: cannot start the HTTP thread: %s", c->metrics_listen,
                      strerror(-rc));
            goto fail;
        }
        s->metrics_fd = -1;         /* the admin thread's now */
    }
    server_listen_congestion(s, c->local_tcp_congestion);
    if (s->rdma_arena != NULL) {
        s->transports[s->rpc.ntransports++] = "rdma";
    }
    server_apply_quotas(s, NULL, c);

    s->nworkers = (int)c->io_threads;
    if (s->nworkers < 1) {
        s->nworkers = 1;
    }
    if (s->nworkers > SERVER_MAX_WORKERS) {
        s->nworkers = SERVER_MAX_WORKERS;
    }
    s->workers = calloc((size_t)s->nworkers, sizeof(*s->workers));
    if (s->workers == NULL) {
        log_error("out of memory");
        goto fail;
    }
    struct worker_env env = {
        .conf = &s->conf,
        .rpc = &s->rpc,
        .store = s->store,
        .rdma_dev = s->rdma_dev,
        .connections = &s->connections,
        .tls_new = server_tls_new,
        .tls_arg = s,
    };
    for (int i = 0; i < s->nworkers; i++) {
        rc = worker_create(&env, i, &s->workers[i]);
        if (rc != 0) {
            log_error("worker %d: %s", i, kv_strerror(rc));
            goto fail;
        }
    }
    rc = copier_create(s->nworkers, server_wake, s, &s->copier);
    if (rc != 0) {
        log_error("cannot start the copy threads: %s", kv_strerror(rc));
        goto fail;
    }
    s->rpc.copier = s->copier;
    if (c->ssd_dir[0] != '\0') {
        struct ssd_config ssc;
        char err[1024];

        server_ssd_config(s, c, &ssc);
        atomic_store(&s->phase, SERVER_PHASE_SSD_LOADING);
        rc = ssd_open(&ssc, s->store, &s->ssd, err, sizeof(err));
        if (rc == KV_BUSY || rc == KV_UNSUPPORTED || rc == KV_INVALID_ARGUMENT) {
            log_error("cannot open the SSD tier: %s", err);
            goto fail;
        }
        if (rc != 0) {
            /* Damage was repaired inside ssd_open; what is left (the directory can be neither
             * used nor moved aside, no memory) must not keep DRAM from serving. */
            log_error("cannot open the SSD tier: %s; running WITHOUT the SSD tier (ssd_state "
                      "off) until it is fixed and kvstashd restarted", err);
            s->ssd = NULL;
        }
    }
    for (int i = 0; i < s->nworkers; i++) {
        rc = worker_start(s->workers[i]);
        if (rc != 0) {
            log_error("worker %d: pthread_create: %s", i, strerror(rc));
            goto fail;
        }
        s->nthreads++;
    }

    if (s->tcp_fd >= 0) {
        s->tcp_ev = event_new(s->base, s->tcp_fd, EV_READ | EV_PERSIST, server_on_accept, s);
        if (s->tcp_ev == NULL || event_add(s->tcp_ev, NULL) != 0) {
            goto fail;
        }
    }
    if (s->unix_fd >= 0) {
        s->unix_ev = event_new(s->base, s->unix_fd, EV_READ | EV_PERSIST, server_on_accept, s);
        if (s->unix_ev == NULL || event_add(s->unix_ev, NULL) != 0) {
            goto fail;
        }
    }
    if (s->tls_fd >= 0) {
        s->tls_ev = event_new(s->base, s->tls_fd, EV_READ | EV_PERSIST, server_on_accept, s);
        if (s->tls_ev == NULL || event_add(s->tls_ev, NULL) != 0) {
            goto fail;
        }
    }
    if (server_resp_events(s) != 0) {
        goto fail;
    }
    s->accept_timer = evtimer_new(s->base, server_accept_resume, s);
    if (s->accept_timer == NULL) {
        goto fail;
    }
    server_log_start(s, c);
    atomic_store(&s->phase, SERVER_PHASE_SERVING);
    if (s->member != NULL) {
        member_set_state(VIEW_ACTIVE);  /* the SSD index is loaded: owning keys is safe */
    }
    *out = s;
    return 0;
fail:
    server_destroy(s);
    return -1;
}

int
server_run(struct server *s)
{
    /* Listeners are bound and workers run: systemd (Type=notify) may start dependants. */
    int nrc = sdnotify_send("READY=1");
    if (nrc < 0) {
        log_warn("NOTIFY_SOCKET: cannot tell systemd we are ready: %s", strerror(-nrc));
    }
    event_base_dispatch(s->base);
    return 0;
}

void
server_stop(struct server *s)
{
    event_base_loopexit(s->base, NULL);
}

const struct kv_config *
server_config(struct server *s)
{
    return server_conf(s);
}

bool
server_ready(struct server *s, char *why, size_t len)
{
    struct store_stats st;

    switch (atomic_load(&s->phase)) {
    case SERVER_PHASE_STARTING:
        snprintf(why, len, "starting: the listeners are not up yet");
        return false;
    case SERVER_PHASE_SSD_LOADING:
        snprintf(why, len, "starting: the SSD index is loading");
        return false;
    case SERVER_PHASE_DRAINING:
        snprintf(why, len, "shutting down: draining connections");
        return false;
    default:
        break;
    }
    if (s->member != NULL && server_ssd_loading(s, why, len)) {
        char until[256];

        snprintf(until, sizeof(until), "%s", why);
        snprintf(why, len, "joining the pool: it owns no key until %s", until);
        return false;
    }
    store_stats(s->store, &st);
    if (!st.memory_prefault_done) {
        snprintf(why, len, "starting: populating the arena (%llu of %llu bytes)",
                 (unsigned long long)st.memory_prefaulted,
                 (unsigned long long)st.memory_capacity);
        return false;
    }
    snprintf(why, len, "ready");
    return true;
}

void
server_stats(struct server *s, struct server_stats *out)
{
    out->uptime_s = (uint64_t)(time(NULL) - s->started);
    out->connections = atomic_load_explicit(&s->connections, memory_order_relaxed);
    out->connections_total = atomic_load_explicit(&s->connections_total, memory_order_relaxed);
    out->connections_rejected = atomic_load_explicit(&s->connections_rejected,
                                                     memory_order_relaxed);
    out->accept_errors = atomic_load_explicit(&s->accept_errors, memory_order_relaxed);
    out->refused_no_fd = atomic_load_explicit(&s->refused_no_fd, memory_order_relaxed);
    out->start_time_s = (uint64_t)s->started;
    out->phase = atomic_load(&s->phase);
    out->nworkers = s->nworkers;
    out->workers = s->workers;
    out->store = s->store;
    out->ssd = s->ssd;
    out->repl = s->repl;
    out->rebalance = s->rebalance;
}

void
server_destroy(struct server *s)
{
    if (s == NULL) {
        return;
    }
    admin_stop(s->admin);       /* first: a scrape reads everything below */
    s->admin = NULL;
    member_stop(s->member);     /* leave the pool (lease revoked) while still serving */
    s->member = NULL;
    if (s->metrics_fd >= 0) {
        close(s->metrics_fd);
    }
    for (int i = 0; i < s->nthreads; i++) {
        worker_stop(s->workers[i]);
    }
    for (int i = 0; i < s->nthreads; i++) {
        worker_join(s->workers[i]);
    }
    rebalance_stop(s->rebalance);   /* its peer calls end within peer_timeout */
    s->rebalance = NULL;
    repl_destroy(s->repl);      /* peer calls in flight end (and wake) before the workers go */
    s->repl = NULL;
    copier_destroy(s->copier);  /* copies in flight end (and wake) before the workers go */
    s->copier = NULL;
    ssd_close(s->ssd);      /* before the workers' wake events go */
    s->ssd = NULL;
    for (int i = 0; s->workers != NULL && i < s->nworkers; i++) {
        worker_destroy(s->workers[i]);
    }
    free(s->workers);
    rdma_region_deregister(s->rdma_arena);     /* no queue pair uses it any more */
    rdma_dev_close(s->rdma_dev);
    for (int i = 0; i < 5; i++) {
        if (s->sig_ev[i] != NULL) {
            event_free(s->sig_ev[i]);
        }
    }
    if (s->drain_timer != NULL) {
        event_free(s->drain_timer);
    }
    if (s->accept_timer != NULL) {
        event_free(s->accept_timer);
    }
    if (s->tcp_ev != NULL) {
        event_free(s->tcp_ev);
    }
    if (s->unix_ev != NULL) {
        event_free(s->unix_ev);
    }
    if (s->tls_ev != NULL) {
        event_free(s->tls_ev);
    }
    if (s->tcp_fd >= 0) {
        close(s->tcp_fd);
    }
    if (s->tls_fd >= 0) {
        close(s->tls_fd);
    }
    if (s->spare_fd >= 0) {
        close(s->spare_fd);
    }
    server_resp_close(s, true);
    tls_ctx_free(s->tls_ctx);
    pthread_mutex_destroy(&s->tls_lock);
    if (s->unix_fd >= 0) {
        close(s->unix_fd);
        unlink(s->unix_path);
    }
    if (s->base != NULL) {
        event_base_free(s->base);
    }
    store_destroy(s->store);
    for (int i = 0; i < s->nold; i++) {
        free(s->old_confs[i]);
    }
    free(s->old_confs);
    free((void *)server_conf(s));
    free(s);
}
