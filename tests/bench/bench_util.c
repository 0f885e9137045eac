/*
 * bench_util: helpers shared by the load generators (see bench_util.h). Owns no state
 * beyond the pattern objects its callers create; it never changes signal dispositions.
 */
#include "bench_util.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/sendfile.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "tcpopt.h"

uint64_t
bench_now_ns(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

int
bench_hist_index(uint64_t v)
{
    if (v < 16) {
        return (int)v;
    }
    int msb = 63 - __builtin_clzll(v);
    int idx = 16 + (msb - 4) * 16 + (int)((v >> (msb - 4)) & 15);
    return idx < BENCH_HIST ? idx : BENCH_HIST - 1;
}

/* bench_hist_value: the middle of bucket idx. */
static double
bench_hist_value(int idx)
{
    if (idx < 16) {
        return idx;
    }
    int k = idx - 16, shift = k / 16;
    double lo = (double)((16ull + (uint64_t)(k % 16)) << shift);
    return lo + (double)(1ull << shift) / 2.0;
}

double
bench_hist_pct(const uint64_t *h, double p)
{
    uint64_t total = 0, seen = 0;

    for (int i = 0; i < BENCH_HIST; i++) {
        total += h[i];
    }
    if (total == 0) {
        return 0;
    }
    uint64_t want = (uint64_t)(p * (double)total + 0.999999);
    for (int i = 0; i < BENCH_HIST; i++) {
        seen += h[i];
        if (seen >= want && h[i] > 0) {
            return bench_hist_value(i);
        }
    }
    return 0;
}

int
bench_parse_size(const char *s, size_t *out)
{
    char *end;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    unsigned long long mul = 1;

    if (errno != 0 || end == s) {
        return -1;
    }
    switch (*end) {
    case 'k': case 'K': mul = 1ull << 10; end++; break;
    case 'm': case 'M': mul = 1ull << 20; end++; break;
    case 'g': case 'G': mul = 1ull << 30; end++; break;
    default: break;
    }
    if ((*end == 'b' || *end == 'B') && mul > 1) {
        end++;
    }
    if (*end != '\0' || v > SIZE_MAX / mul) {
        return -1;
    }
    *out = (size_t)(v * mul);
    return 0;
}

/* bench_proc_cpu: utime + stime of pid in seconds, or -1. */
double
bench_proc_cpu(int pid)
{
    char path[64], buf[1024];
    FILE *f;
    size_t n;

    snprintf(path, sizeof(path), "/proc/%d/stat", pid);
    f = fopen(path, "r");
    if (f == NULL) {
        return -1;
    }
    n = fread(buf, 1, sizeof(buf) - 1, f);
    fclose(f);
    buf[n] = '\0';
    char *p = strrchr(buf, ')'); /* the command name may hold spaces */
    if (p == NULL) {
        return -1;
    }
    unsigned long long ut, st;
    if (sscanf(p + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %llu %llu", &ut, &st) != 2) {
        return -1;
    }
    return (double)(ut + st) / (double)sysconf(_SC_CLK_TCK);
}

double
bench_self_cpu(void)
{
    struct rusage ru;

    getrusage(RUSAGE_SELF, &ru);
    return (double)ru.ru_utime.tv_sec + (double)ru.ru_utime.tv_usec / 1e6 +
           (double)ru.ru_stime.tv_sec + (double)ru.ru_stime.tv_usec / 1e6;
}

/* bench_key_ctr: rewrite the 10 counter digits of a key in place. */
void
bench_key_ctr(uint8_t *digits, uint64_t ctr)
{
    for (int i = 9; i >= 0; i--) {
        digits[i] = (uint8_t)('0' + ctr % 10);
        ctr /= 10;
    }
}

int
bench_connect(const char *addr, const char *default_port, int unix_ok, int *fdp)
{
    if (unix_ok && (strncmp(addr, "unix:", 5) == 0 || strchr(addr, '/') != NULL)) {
        const char *path = strncmp(addr, "unix:", 5) == 0 ? addr + 5 : addr;
        struct sockaddr_un sun;
        memset(&sun, 0, sizeof(sun));
        sun.sun_family = AF_UNIX;
        if (strlen(path) >= sizeof(sun.sun_path)) {
            return -ENAMETOOLONG;
        }
        memcpy(sun.sun_path, path, strlen(path) + 1);
        int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
        if (fd < 0) {
            return -errno;
        }
        if (connect(fd, (struct sockaddr *)&sun, sizeof(sun)) != 0) {
            int e = errno;
            close(fd);
            return -e;
        }
        *fdp = fd;
        return 0;
    }
    char host[256], port[32];
    const char *colon = strrchr(addr, ':');
    size_t hlen = colon ? (size_t)(colon - addr) : strlen(addr);
    if (hlen >= sizeof(host)) {
        return -EINVAL;
    }
    memcpy(host, addr, hlen);
    host[hlen] = '\0';
    if (host[0] == '[' && hlen > 1 && host[hlen - 1] == ']') {
        memmove(host, host + 1, hlen - 2);
        host[hlen - 2] = '\0';
    }
    snprintf(port, sizeof(port), "%s", colon ? colon + 1 : default_port);
    struct addrinfo hints, *res = NULL;
    memset(&hints, 0, sizeof(hints));
    hints.ai_socktype = SOCK_STREAM;
    if (getaddrinfo(host, port, &hints, &res) != 0) {
        return -ENXIO;
    }
    int rc = -ECONNREFUSED;
    for (struct addrinfo *ai = res; ai; ai = ai->ai_next) {
        int fd = socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, ai->ai_protocol);
        if (fd < 0) {
            rc = -errno;
            continue;
        }
        /* as libkvstash: before the handshake (tcpopt.h) */
        (void)tcpopt_connect_congestion(fd, ai->ai_addr, ai->ai_addrlen, TCPOPT_LOCAL_CONGESTION);
        if (connect(fd, ai->ai_addr, ai->ai_addrlen) == 0) {
            int one = 1;
            setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
            *fdp = fd;
            rc = 0;
            break;
        }
        rc = -errno;
        close(fd);
    }
    freeaddrinfo(res);
    return rc;
}

/* bench_sendmsg_all: send iov[0..n) completely with sendmsg flags (consumes the array). */
static int
bench_sendmsg_all(int fd, struct iovec *iov, size_t n, int flags)
{
    while (n > 0) {
        struct msghdr mh;
        memset(&mh, 0, sizeof(mh));
        mh.msg_iov = iov;
        mh.msg_iovlen = n < IOV_MAX ? n : IOV_MAX;
        ssize_t w = sendmsg(fd, &mh, flags);
        if (w < 0) {
            if (errno == EINTR) {
                continue;
            }
            return -errno;
        }
        size_t left = (size_t)w;
        while (n > 0 && left >= iov->iov_len) {
            left -= iov->iov_len;
            iov++;
            n--;
        }
        if (n > 0) {
            iov->iov_base = (uint8_t *)iov->iov_base + left;
            iov->iov_len -= left;
        }
    }
    return 0;
}

int
bench_send_all(int fd, struct iovec *iov, size_t n)
{
    return bench_sendmsg_all(fd, iov, n, MSG_NOSIGNAL);
}

struct bench_pattern {
    uint8_t *data;             /* the read-only mapping, or the malloc'd copy */
    size_t len;
    int fd;                    /* the sealed memfd; -1 when values are copied */
};

/* bench_pattern_seal: fill a new sealed memfd of len bytes and map it read-only into p. An
 * error's text in why; p->fd is set only on success. 0 or -errno. */
static int
bench_pattern_seal(struct bench_pattern *p, size_t len, bench_fill_fn fill, const char **why)
{
    int fd = memfd_create("bench-pattern", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    void *w, *r;
    int rc;

    if (fd < 0) {
        *why = "memfd_create";
        return -errno;
    }
    if (ftruncate(fd, (off_t)len) != 0) {
        *why = "ftruncate";
        goto fail;
    }
    /* filled through a writable mapping that is gone before F_SEAL_WRITE, which refuses
     * (EBUSY) while any shared mapping could still write, read-only ones included */
    w = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (w == MAP_FAILED) {
        *why = "mmap";
        goto fail;
    }
    fill(w, len);
    (void)munmap(w, len);
    if (fcntl(fd, F_ADD_SEALS, F_SEAL_WRITE | F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) != 0) {
        *why = "sealing the memfd";
        goto fail;
    }
    /* kernels before 6.7 refuse a shared mapping of a write-sealed memfd (EPERM); a private
     * read-only one maps the same page-cache pages and can never copy them */
    r = mmap(NULL, len, PROT_READ, MAP_SHARED, fd, 0);
    if (r == MAP_FAILED && errno == EPERM) {
        r = mmap(NULL, len, PROT_READ, MAP_PRIVATE, fd, 0);
    }
    if (r == MAP_FAILED) {
        *why = "mmap of the sealed memfd";
        goto fail;
    }
    p->data = r;
    p->fd = fd;
    return 0;
fail:
    rc = -errno;
    close(fd);
    return rc;
}

void
bench_value_fill(uint8_t *buf, size_t len)
{
    for (size_t i = 0; i < len; i++) {
        buf[i] = (uint8_t)(i * 131 + (i >> 12) + 7);
    }
}

int
bench_pattern_create(size_t len, bool by_ref, bench_fill_fn fill, const char *prog,
                     struct bench_pattern **out)
{
    struct bench_pattern *p = calloc(1, sizeof(*p));

    if (p == NULL) {
        return -ENOMEM;
    }
    p->len = len;
    p->fd = -1;
    if (by_ref && len > 0) {
        const char *why = "";
        int rc = bench_pattern_seal(p, len, fill, &why);
        if (rc == 0) {
            *out = p;
            return 0;
        }
        fprintf(stderr, "%s: %s: %s; sending values by copying instead\n", prog, why,
                strerror(-rc));
    }
    p->data = malloc(len > 0 ? len : 1);
    if (p->data == NULL) {
        free(p);
        return -ENOMEM;
    }
    fill(p->data, len);
    *out = p;
    return 0;
}

void
bench_pattern_destroy(struct bench_pattern *p)
{
    if (p == NULL) {
        return;
    }
    if (p->fd >= 0) {
        munmap(p->data, p->len);
        close(p->fd);
    } else {
        free(p->data);
    }
    free(p);
}

const uint8_t *
bench_pattern_bytes(const struct bench_pattern *p)
{
    return p->data;
}

/* bench_pattern_holds: whether iov's bytes lie wholly inside p's mapping (the offset is
 * where). Addresses compared as integers: the iovec may point anywhere. */
static bool
bench_pattern_holds(const struct bench_pattern *p, const struct iovec *iov, size_t *offset)
{
    uintptr_t base = (uintptr_t)p->data, at = (uintptr_t)iov->iov_base;

    if (iov->iov_len == 0 || at < base || at - base > p->len ||
        iov->iov_len > p->len - (at - base)) {
        return false;
    }
    *offset = at - base;
    return true;
}

/* bench_sendfile_all: len bytes of p's memfd from offset, completely. 0 or -errno. */
static int
bench_sendfile_all(int fd, const struct bench_pattern *p, size_t offset, size_t len)
{
    off_t off = (off_t)offset; /* sendfile moves this, not the shared file position */

    while (len > 0) {
        ssize_t w = sendfile(fd, p->fd, &off, len);
        if (w > 0) {
            len -= (size_t)w;
        } else if (w == 0) {
            return -EIO; /* end of file: cannot happen, the memfd is sealed against shrinking */
        } else if (errno != EINTR) {
            return -errno;
        }
    }
    return 0;
}

int
bench_send_pattern(int fd, struct iovec *iov, size_t n, const struct bench_pattern *p)
{
    if (p->fd < 0) {
        return bench_send_all(fd, iov, n);
    }
    while (n > 0) {
        size_t offset = 0, k = 0;
        int rc;

        while (k < n && !bench_pattern_holds(p, &iov[k], &offset)) {
            k++;
        }
        if (k > 0) {
            /* the headers up to the next value: held back (MSG_MORE) to go out with it */
            rc = bench_sendmsg_all(fd, iov, k, MSG_NOSIGNAL | (k < n ? MSG_MORE : 0));
        } else {
            rc = bench_sendfile_all(fd, p, offset, iov->iov_len);
            k = 1;
        }
        if (rc != 0) {
            return rc;
        }
        iov += k;
        n -= k;
    }
    return 0;
}

void
bench_totals_add(struct bench_totals *tot, uint64_t reqs, uint64_t keys, uint64_t bytes,
                 uint64_t misses, uint64_t errors, const uint64_t *hist)
{
    tot->reqs += reqs;
    tot->keys += keys;
    tot->bytes += bytes;
    tot->misses += misses;
    tot->errors += errors;
    for (int b = 0; b < BENCH_HIST; b++) {
        tot->hist[b] += hist[b];
    }
}

void
bench_run_begin(struct bench_run *r)
{
    r->cpu0 = r->pid ? bench_proc_cpu(r->pid) : -1;
    r->self0 = bench_self_cpu();
    r->t0 = bench_now_ns();
}

void
bench_run_end(struct bench_run *r)
{
    r->t1 = bench_now_ns();
    r->cpu1 = r->pid ? bench_proc_cpu(r->pid) : -1;
    r->self1 = bench_self_cpu();
}

int
bench_print_usage(const char *prog, const char *text, const char *why)
{
    if (why != NULL) {
        fprintf(stderr, "%s: %s\n", prog, why);
    }
    fputs(text, stderr);
    return 2;
}

int
bench_opt_count(const char *s, long long *out)
{
    char *end = NULL;

    errno = 0;
    *out = strtoll(s, &end, 10);
    return errno != 0 || *end != '\0' || end == s || *out < 0 ? -1 : 0;
}

int
bench_opt_secs(const char *s, double *out)
{
    char *end = NULL;

    *out = strtod(s, &end);
    return *end != '\0' || end == s || !(*out > 0 && *out <= 3600) ? -1 : 0;
}

int
bench_opt_rate(const char *s, double *out)
{
    char *end = NULL;

    *out = strtod(s, &end);
    return *end != '\0' || end == s || !(*out > 0 && *out <= 1e9) ? -1 : 0;
}

void
bench_pace_init(struct bench_pace *p, double rate, int thread, int threads, uint64_t now)
{
    p->start = now;
    p->n = 0;
    p->interval = rate > 0 && threads > 0 ? 1e9 * threads / rate : 0;
    p->phase = threads > 0 ? p->interval * thread / threads : 0;
}

uint64_t
bench_pace_due(const struct bench_pace *p)
{
    if (p->interval <= 0) {
        return 0;
    }
    return p->start + (uint64_t)(p->phase + p->interval * (double)p->n);
}

void
bench_pace_take(struct bench_pace *p)
{
    p->n++;
}

int
bench_pace_idle(const struct bench_pace *p, int fd)
{
    uint64_t due = bench_pace_due(p), now = bench_now_ns();
    uint64_t wait = due > now ? due - now : 0;
    struct timespec ts = {.tv_sec = (time_t)(wait / 1000000000ull),
                          .tv_nsec = (long)(wait % 1000000000ull)};
    struct pollfd pfd = {.fd = fd, .events = POLLIN};

    /* readable, or an error or hang-up the caller's read will report */
    return ppoll(&pfd, fd >= 0 ? 1 : 0, &ts, NULL) > 0 && pfd.revents != 0;
}

void
bench_print_result(const struct bench_run *r, const struct bench_totals *tot)
{
    double secs = (double)(r->t1 - r->t0) / 1e9;

    printf("mode=%s size=%zu batch=%u conns=%d depth=%d secs=%.2f GB/s=%.3f keys/s=%.0f "
           "req/s=%.1f p50_us=%.0f p99_us=%.0f misses=%" PRIu64 " errors=%" PRIu64,
           r->mode, r->vsize, r->batch, r->conns, r->depth, secs,
           (double)tot->bytes / secs / 1e9, (double)tot->keys / secs, (double)tot->reqs / secs,
           bench_hist_pct(tot->hist, 0.50) / 1e3, bench_hist_pct(tot->hist, 0.99) / 1e3,
           tot->misses, tot->errors);
    if (r->cpu0 >= 0 && r->cpu1 >= 0) {
        double gb = (double)tot->bytes / 1e9;
        printf(" daemon_cpu_s=%.2f", r->cpu1 - r->cpu0);
        if (gb > 0) {
            printf(" daemon_core_s_per_GB=%.3f", (r->cpu1 - r->cpu0) / gb);
        }
    } else if (r->pid) {
        printf(" daemon_cpu=unreadable");
    }
    printf(" client_cpu_s=%.2f\n", r->self1 - r->self0);
}

void
bench_loop_run(const struct bench_loop *l)
{
    uint64_t t_sent[BENCH_LOOP_MAX_DEPTH];
    uint64_t start = bench_now_ns();
    uint64_t deadline = start + (uint64_t)(l->secs * 1e9);
    uint64_t sent = 0;
    int inflight = 0, head = 0;
    bool more = true; /* requests left to send (time, max_reqs) */
    struct bench_pace pace;

    bench_pace_init(&pace, l->rate, l->thread, l->threads, start);
    for (;;) {
        uint64_t now = bench_now_ns();
        uint64_t due = bench_pace_due(&pace);
        more = more && (l->max_reqs == 0 || sent < l->max_reqs) && now < deadline &&
               due < deadline;
        if (more && inflight < l->depth && due <= now) {
            int s = (head + inflight) % l->depth;
            bench_pace_take(&pace);
            t_sent[s] = now;
            if (l->send(l->arg, s) != 0) {
                return;
            }
            sent++;
            inflight++;
            continue;
        }
        if (inflight == 0) {
            if (!more) {
                return;
            }
            bench_pace_idle(&pace, -1);
            continue;
        }
        if (more && inflight < l->depth && !l->buffered(l->arg) &&
            bench_pace_idle(&pace, l->fd) == 0) {
            continue; /* the next send is due before a reply came */
        }
        if (l->reply(l->arg, head) != 0) {
            return;
        }
        l->hist[bench_hist_index(bench_now_ns() - t_sent[head])]++;
        (*l->reqs)++;
        inflight--;
        head = (head + 1) % l->depth;
    }
}
