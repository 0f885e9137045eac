/*
 * bench_util: the pieces the load generators share (kvstash-bench for kvstashd, mc-bench
 * for memcached, raw-bench for bare loopback TCP): a monotonic clock, a fixed log-linear
 * latency histogram, size parsing, CPU accounting from /proc, key counters, connecting,
 * sending a whole iovec, and the value pattern put requests send by reference. The pattern
 * is the only allocation; no threads of its own; every function is safe from any thread.
 */
#ifndef BENCH_UTIL_H
#define BENCH_UTIL_H

#include <stdbool.h>
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

/*
 * The value pattern: the bytes every put value repeats. Sent by reference, it lives in a
 * memfd sealed against writing, shrinking and growing, mapped read-only: sendfile hands
 * the socket references to its pages instead of copying them, which is safe only because
 * those bytes can never change while a reference is queued. Sent by copying (-C in the
 * tools, or when memfd_create or sealing fails), it is plain memory and goes with sendmsg.
 */
struct bench_pattern;

/* bench_fill_fn: write the pattern's len bytes into buf (called once, at creation). */
typedef void (*bench_fill_fn)(uint8_t *buf, size_t len);

/* bench_value_fill: the bytes kvstash-bench's and mc-bench's values repeat (a bench_fill_fn). */
void bench_value_fill(uint8_t *buf, size_t len);

/*
 * bench_pattern_create: a pattern of len bytes filled by fill. by_ref asks for the sealed
 * memfd; when that cannot be had (or len is 0) the pattern is copied instead, and a
 * failure is said once on stderr as "prog: ...". 0 and *out (release it with
 * bench_pattern_destroy), or -ENOMEM.
 */
int bench_pattern_create(size_t len, bool by_ref, bench_fill_fn fill, const char *prog,
                         struct bench_pattern **out);

/* bench_pattern_destroy: unmap and close p, or free its copy. Accepts NULL. No thread may
 * still be in bench_send_pattern with p; data already queued on a socket holds its own
 * references to the pages and stays intact. */
void bench_pattern_destroy(struct bench_pattern *p);

/* bench_pattern_bytes: p's len bytes, read-only, valid until bench_pattern_destroy. */
const uint8_t *bench_pattern_bytes(const struct bench_pattern *p);

/*
 * bench_send_pattern: bench_send_all, except that when p is sent by reference every iovec
 * lying wholly inside bench_pattern_bytes(p) goes with sendfile from p's memfd, and the
 * iovecs between (headers) with sendmsg, MSG_MORE when a pattern piece follows so a header
 * leaves in the same packets as its value. fd must be a blocking stream socket. sendfile
 * has no MSG_NOSIGNAL: the caller ignores SIGPIPE. The array is consumed (pass a scratch
 * copy); p is borrowed and may be shared by every thread. 0 or -errno.
 */
int bench_send_pattern(int fd, struct iovec *iov, size_t n, const struct bench_pattern *p);

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

/* bench_opt_rate: requests per second in (0, 1e9] from an option argument. 0 or -1. */
int bench_opt_rate(const char *s, double *out);

/*
 * Pacing (-r RATE in the tools): one thread's schedule of sends. A run paced at RATE
 * requests/s in all gives each of its T threads RATE / T, request k of thread i due at
 * start + (k + i / T) / (RATE / T) (the threads' phases spread over one interval). Sends
 * stay closed-loop as well: a thread still keeps at most its depth in flight, so a server
 * slower than RATE sets the pace. While nothing is due a thread reads the replies that
 * have come (so the server never waits on a full socket for a paced client) or sleeps in
 * ppoll until the next send is due: no spinning, an idle client costs no CPU.
 */
struct bench_pace {
    uint64_t start;    /* bench_now_ns at the schedule's start */
    double interval;   /* ns between this thread's requests; 0: not paced */
    double phase;      /* ns: this thread's offset inside one interval */
    uint64_t n;        /* requests released so far */
};

/* bench_pace_init: p for thread (0..threads-1) of a run at rate requests/s in all (0: not
 * paced), starting now (bench_now_ns). */
void bench_pace_init(struct bench_pace *p, double rate, int thread, int threads, uint64_t now);

/* bench_pace_due: when p's next request is due (a bench_now_ns time; 0 when not paced). */
uint64_t bench_pace_due(const struct bench_pace *p);

/* bench_pace_take: release p's next request (the caller sends it). */
void bench_pace_take(struct bench_pace *p);

/*
 * bench_pace_idle: wait until p's next request is due or, when fd >= 0, until fd is
 * readable, whichever comes first (ppoll; EINTR returns early, the caller loops).
 * Returns 1 when fd is readable (or in error), 0 otherwise.
 */
int bench_pace_idle(const struct bench_pace *p, int fd);

/* One connection's closed loop of requests (bench_loop_run), for a tool's thread. */
#define BENCH_LOOP_MAX_DEPTH 64
struct bench_loop {
    void *arg;                       /* the tool's thread, given to the calls below */
    int fd;                          /* the connection (readable: a reply has come) */
    int depth;                       /* requests in flight at most, 1..BENCH_LOOP_MAX_DEPTH */
    int thread, threads;             /* this thread's number and the run's count (pacing) */
    double secs, rate;               /* the run's length; requests/s in all (0: unpaced) */
    uint64_t max_reqs;               /* requests to send at most (0: no limit) */
    uint64_t *reqs;                  /* the thread's count of replies, one more per reply */
    uint64_t *hist;                  /* its BENCH_HIST latency buckets */
    int (*send)(void *arg, int slot);    /* build and send slot's request: 0, or stop */
    int (*reply)(void *arg, int slot);   /* read the oldest request's (slot's) reply: 0, or stop */
    bool (*buffered)(void *arg);         /* reply bytes already read and not yet taken */
};

/*
 * bench_loop_run: l's requests until l->secs pass or l->max_reqs are sent, then their
 * replies. Slots are used in order: the oldest in flight is answered first, the next free
 * one sent. Unpaced, a free slot is sent at once; paced, when its request is due, and
 * until then the thread reads the replies that have come, or sleeps. Each reply's latency
 * goes into l->hist. Returns when done, or when send or reply asks to stop.
 */
void bench_loop_run(const struct bench_loop *l);

/*
 * bench_print_result: the one result line run.sh parses: mode, size, batch, conns,
 * depth, secs, GB/s, keys/s, req/s, p50_us, p99_us, misses, errors, the server's CPU
 * (daemon_cpu_s, daemon_core_s_per_GB) when pid was given, and client_cpu_s.
 */
void bench_print_result(const struct bench_run *r, const struct bench_totals *tot);

#endif
