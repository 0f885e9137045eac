/*
 * bench_util: the pieces both load generators share (kvstash-bench for kvstashd,
 * mc-bench for memcached): a monotonic clock, a fixed log-linear latency histogram,
 * size parsing, CPU accounting from /proc, key counters, connecting and sending a whole
 * iovec. No allocation, no threads of its own; every function is safe from any thread.
 */
#ifndef BENCH_UTIL_H
#define BENCH_UTIL_H

#include <stddef.h>
#include <stdint.h>

struct iovec;

#define BENCH_HIST 1024 /* histogram buckets: exact below 16 ns, then 16 per power of two */

/* bench_now_ns: CLOCK_MONOTONIC in nanoseconds. */
uint64_t bench_now_ns(void);

/* bench_hist_index: the bucket of a value (the last bucket holds everything larger). */
int bench_hist_index(uint64_t v);

/* bench_hist_pct: the value at quantile p (0..1) of histogram h[BENCH_HIST]; 0 if empty. */
double bench_hist_pct(const uint64_t *h, double p);

/* bench_parse_size: "4096", "64k", "1m", "4g" (binary, optional b). 0 or -1. */
int bench_parse_size(const char *s, size_t *out);

/* bench_proc_cpu: utime + stime of pid in seconds, or -1 when it cannot be read. */
double bench_proc_cpu(int pid);

/* bench_self_cpu: this process's user + system CPU seconds. */
double bench_self_cpu(void);

/* bench_key_ctr: rewrite the 10 counter digits of a key in place. */
void bench_key_ctr(uint8_t *digits, uint64_t ctr);

/*
 * bench_connect: connect to "host:port", "[v6]:port", "host" (default_port) or, when
 * unix_ok, "unix:/path" or a path containing '/'. TCP_NODELAY on TCP, and libkvstash's
 * congestion control, set before connecting, when the server is on this host (tcpopt.h),
 * so every load generator sends the way kvstash clients do. 0 and *fdp, or -errno
 * (-ENXIO for a name that does not resolve).
 */
int bench_connect(const char *addr, const char *default_port, int unix_ok, int *fdp);

/*
 * bench_send_all: send iov[0..n) completely (the array is consumed: pass a scratch
 * copy). No SIGPIPE. 0 or -errno.
 */
int bench_send_all(int fd, struct iovec *iov, size_t n);

/* What one run measured, summed over its connections. */
struct bench_totals {
    uint64_t reqs, keys, bytes, misses, errors;
    uint64_t hist[BENCH_HIST]; /* request latencies in ns */
};

/* The run's shape and its clocks (CPU figures are -1 when unknown). */
struct bench_run {
    const char *mode;
    size_t vsize;
    unsigned batch;
    int conns, depth, pid;
    uint64_t t0, t1;           /* bench_now_ns around the measured part */
    double cpu0, cpu1;         /* bench_proc_cpu(pid) around it */
    double self0, self1;       /* bench_self_cpu() around it */
};

/* bench_totals_add: add one connection's counters and histogram to tot. */
void bench_totals_add(struct bench_totals *tot, uint64_t reqs, uint64_t keys, uint64_t bytes,
                      uint64_t misses, uint64_t errors, const uint64_t *hist);

/* bench_run_begin: take r's start clocks (and r->pid's CPU when set). */
void bench_run_begin(struct bench_run *r);

/* bench_run_end: take r's end clocks. */
void bench_run_end(struct bench_run *r);

/* bench_print_usage: "PROG: why" (when why is set) and the usage text on stderr; returns 2. */
int bench_print_usage(const char *prog, const char *text, const char *why);

/* bench_opt_count: a whole number >= 0 from an option argument. 0 or -1. */
int bench_opt_count(const char *s, long long *out);

/* bench_opt_secs: seconds in (0, 3600] from an option argument. 0 or -1. */
int bench_opt_secs(const char *s, double *out);

/*
 * bench_print_result: the one result line run.sh parses: mode, size, batch, conns,
 * depth, secs, GB/s, keys/s, req/s, p50_us, p99_us, misses, errors, the server's CPU
 * (daemon_cpu_s, daemon_core_s_per_GB) when pid was given, and client_cpu_s.
 */
void bench_print_result(const struct bench_run *r, const struct bench_totals *tot);

#endif
