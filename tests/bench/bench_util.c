/*
 * bench_util: helpers shared by the load generators (see bench_util.h). Owns no state.
 */
#include "bench_util.h"

#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
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

int
bench_send_all(int fd, struct iovec *iov, size_t n)
{
    while (n > 0) {
        struct msghdr mh;
        memset(&mh, 0, sizeof(mh));
        mh.msg_iov = iov;
        mh.msg_iovlen = n < IOV_MAX ? n : IOV_MAX;
        ssize_t w = sendmsg(fd, &mh, MSG_NOSIGNAL);
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
