/*
 * cli_monitor: `kvstash stats`, `kvstash top` and `kvstash bench`. It owns the presentation
 * of the daemon's counters (groups, units, rates between two samples), the terminal handling
 * of top (the alternate screen, reading q from a raw stdin, plain lines when stdout is not a
 * terminal) and bench's bounded put/get loop and its latency percentiles. It speaks only
 * kvstash.h; it must not know the wire format or the daemon's internals beyond the counter
 * names docs/operations.md lists.
 */
#include "cli_monitor.h"

#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <poll.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <termios.h>
#include <time.h>
#include <unistd.h>

#include "kvstash.h"

#define BENCH_MAX_OPS 1000000
#define BENCH_MAX_SIZE (64u << 20)
#define TOP_MAX_ROUNDS 1000000

/* ---- counters ---- */

struct sample {
    struct kvstash_stat *items;
    size_t n;
    double t; /* CLOCK_MONOTONIC seconds when taken */
    double rtt_us; /* the stats round trip as this client saw it */
};

static double
now_s(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static int
sample_take(struct kvstash *c, struct sample *s)
{
    double t0 = now_s();
    int rc = kvstash_stats(c, &s->items, &s->n);

    s->t = now_s();
    s->rtt_us = (s->t - t0) * 1e6;
    if (rc != 0) {
        fprintf(stderr, "kvstash: stats: %s\n", kvstash_last_error(c)[0] ? kvstash_last_error(c)
                                                                         : kvstash_strerror(rc));
        return rc < 0 ? 3 : 1;
    }
    return 0;
}

static uint64_t
get(const struct sample *s, const char *name)
{
    for (size_t i = 0; s != NULL && i < s->n; i++) {
        if (strcmp(s->items[i].name, name) == 0) {
            return s->items[i].value;
        }
    }
    return 0;
}

/*
 * Hit ratios from reads' lookups (counts or rates), in percent, -1 where nothing was looked
 * up, as the dashboard has them: all = hits / lookups; dram = DRAM hits / lookups (a read
 * looks in DRAM first); ssd = SSD hits / what DRAM missed (SSD hits + misses).
 */
struct hit_ratios {
    double all, dram, ssd;
};

static struct hit_ratios
hit_ratios(double hits_dram, double hits_ssd, double misses)
{
    double look = hits_dram + hits_ssd + misses, below = hits_ssd + misses;
    struct hit_ratios r = {-1, -1, -1};

    if (look > 0) {
        r.all = 100.0 * (hits_dram + hits_ssd) / look;
        r.dram = 100.0 * hits_dram / look;
    }
    if (below > 0) {
        r.ssd = 100.0 * hits_ssd / below;
    }
    return r;
}

/* a ratio as "12.5%", or "-" when nothing was looked up */
static const char *
human_pct(double v, char *buf, size_t len)
{
    if (v < 0) {
        snprintf(buf, len, "-");
    } else {
        snprintf(buf, len, "%.1f%%", v);
    }
    return buf;
}

/* v bytes in binary units: "512 B", "1.5 KiB", "3.25 GiB". */
static const char *
human_bytes(double v, char *buf, size_t len)
{
    static const char *const units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
    size_t u = 0;

    while (v >= 1024 && u + 1 < sizeof(units) / sizeof(units[0])) {
        v /= 1024;
        u++;
    }
    snprintf(buf, len, u == 0 ? "%.0f %s" : "%.2f %s", v, units[u]);
    return buf;
}

static const char *
human_secs(uint64_t s, char *buf, size_t len)
{
    if (s >= 86400) {
        snprintf(buf, len, "%" PRIu64 "d %02" PRIu64 "h %02" PRIu64 "m", s / 86400,
                 s % 86400 / 3600, s % 3600 / 60);
    } else if (s >= 3600) {
        snprintf(buf, len, "%" PRIu64 "h %02" PRIu64 "m %02" PRIu64 "s", s / 3600, s % 3600 / 60,
                 s % 60);
    } else {
        snprintf(buf, len, "%" PRIu64 "m %02" PRIu64 "s", s / 60, s % 60);
    }
    return buf;
}

static bool
is_bytes(const char *name)
{
    size_t n = strlen(name);

    return (n > 6 && strcmp(name + n - 6, "_bytes") == 0) || strncmp(name, "memory_", 7) == 0 ||
           strcmp(name, "ssd_capacity") == 0 || strcmp(name, "bytes_in") == 0 ||
           strcmp(name, "bytes_out") == 0 || strcmp(name, "reserved") == 0;
}

/* The group a counter is shown under (docs/operations.md's groups). */
static int
group_of(const char *name)
{
    static const char *const process[] = {"uptime_s", "io_threads", "connections",
                                          "connections_total", "connections_rejected",
                                          "accept_errors", NULL};
    if (strncmp(name, "ssd_", 4) == 0) {
        return 4;
    }
    if (strncmp(name, "ops.", 4) == 0) {
        return 5;
    }
    if (strncmp(name, "closed_", 7) == 0 || strcmp(name, "inflight_pauses") == 0) {
        return 2;
    }
    for (int i = 0; process[i] != NULL; i++) {
        if (strcmp(name, process[i]) == 0) {
            return 0;
        }
    }
    static const char *const requests[] = {"hits", "hits_dram", "hits_ssd", "misses",
                                           "request_errors", "protocol_errors",
                                           "bytes_in", "bytes_out", "puts_expired",
                                           "auth_failures", "auth_revoked", NULL};
    for (int i = 0; requests[i] != NULL; i++) {
        if (strcmp(name, requests[i]) == 0) {
            return 1;
        }
    }
    return 3; /* the DRAM tier and whatever else the daemon adds */
}

static void
print_json(const struct sample *s)
{
    printf("{");
    for (size_t i = 0; i < s->n; i++) {
        printf("%s\"", i ? ", " : "");
        for (const char *p = s->items[i].name; *p; p++) {
            if (*p == '"' || *p == '\\') {
                putchar('\\');
            }
            putchar(*p);
        }
        printf("\": %" PRIu64, s->items[i].value);
    }
    printf("}\n");
}

int
cli_stats(struct kvstash *c, int argc, char **argv)
{
    static const char *const groups[] = {"process", "requests", "connection limits",
                                         "DRAM tier", "SSD tier", "requests by method"};
    bool json = false, raw = false;
    struct sample s = {0};
    int rc;

    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--json") == 0) {
            json = true;
        } else if (strcmp(argv[i], "--raw") == 0) {
            raw = true;
        } else {
            fprintf(stderr, "kvstash: stats: unknown argument '%s'\n"
                            "usage: kvstash stats [--json | --raw]\n", argv[i]);
            return 2;
        }
    }
    if (json && raw) {
        fputs("kvstash: stats: --json and --raw exclude each other\n", stderr);
        return 2;
    }
    if ((rc = sample_take(c, &s)) != 0) {
        return rc;
    }
    if (json) {
        print_json(&s);
    } else if (raw) {
        for (size_t i = 0; i < s.n; i++) {
            printf("%s %" PRIu64 "\n", s.items[i].name, s.items[i].value);
        }
    } else {
        for (int g = 0; g < 6; g++) {
            bool any = false;
            for (size_t i = 0; i < s.n; i++) {
                const char *name = s.items[i].name;
                uint64_t v = s.items[i].value;
                char buf[64];

                if (group_of(name) != g) {
                    continue;
                }
                if (!any) {
                    printf("%s%s\n", g ? "\n" : "", groups[g]);
                    any = true;
                }
                if (is_bytes(name)) {
                    human_bytes((double)v, buf, sizeof(buf));
                } else if (strcmp(name, "uptime_s") == 0) {
                    human_secs(v, buf, sizeof(buf));
                } else {
                    snprintf(buf, sizeof(buf), "%" PRIu64, v);
                }
                printf("  %-26s %s\n", name, buf);
            }
        }
        struct hit_ratios r = hit_ratios((double)get(&s, "hits_dram"),
                                         (double)get(&s, "hits_ssd"), (double)get(&s, "misses"));
        if (r.all >= 0) {
            char p1[16], p2[16];

            printf("\n  %-26s %.1f%% (DRAM %s of lookups, SSD %s of what DRAM missed)\n",
                   "hit ratio", r.all, human_pct(r.dram, p1, sizeof(p1)),
                   human_pct(r.ssd, p2, sizeof(p2)));
        }
    }
    free(s.items);
    return 0;
}

/* ---- top ---- */

static volatile sig_atomic_t top_stop;

static void
top_on_signal(int sig)
{
    (void)sig;
    top_stop = 1;
}

static double
rate(const struct sample *a, const struct sample *b, const char *name)
{
    double dt = b->t - a->t;
    uint64_t x = get(a, name), y = get(b, name);

    return dt > 0 && y >= x ? (double)(y - x) / dt : 0;
}

/* requests per second: the sum of the per-method counters (ops.*), top's own stats excluded */
static double
requests_rate(const struct sample *a, const struct sample *b)
{
    double r = 0;

    for (size_t i = 0; i < b->n; i++) {
        if (strncmp(b->items[i].name, "ops.", 4) == 0 && strcmp(b->items[i].name, "ops.stats")) {
            r += rate(a, b, b->items[i].name);
        }
    }
    return r;
}

/* the hit ratios between two samples */
static struct hit_ratios
ratios(const struct sample *a, const struct sample *b)
{
    return hit_ratios(rate(a, b, "hits_dram"), rate(a, b, "hits_ssd"), rate(a, b, "misses"));
}

static void
top_screen(const struct sample *a, const struct sample *b, double interval)
{
    char b1[32], b2[32], b3[32], b4[32], b5[32], b6[32], p1[16], p2[16], p3[16];
    struct hit_ratios r = ratios(a, b);

    printf("\033[H\033[2Jkvstash top - every %.1f s - q to quit\n\n", interval);
    printf("  requests/s %10.0f   lookups/s %7.0f\n", requests_rate(a, b),
           rate(a, b, "hits") + rate(a, b, "misses"));
    printf("  hits/s     %10.0f   misses/s %8.0f\n", rate(a, b, "hits"), rate(a, b, "misses"));
    printf("  hit ratio  %10s   DRAM   %10s   SSD      %10s  (of DRAM's misses)\n",
           human_pct(r.all, p1, sizeof(p1)), human_pct(r.dram, p2, sizeof(p2)),
           human_pct(r.ssd, p3, sizeof(p3)));
    printf("  in/s       %10s   out/s  %10s   errors/s %10.0f\n",
           human_bytes(rate(a, b, "bytes_in"), b1, sizeof(b1)),
           human_bytes(rate(a, b, "bytes_out"), b2, sizeof(b2)), rate(a, b, "request_errors"));
    printf("  latency    %7.0f us   (a stats round trip from this client)\n", b->rtt_us);
    printf("  conns      %10" PRIu64 "   evictions/s %7.0f   ssd reads/s %7.0f\n",
           get(b, "connections"), rate(a, b, "evictions"), rate(a, b, "ssd_reads"));
    printf("  DRAM       %10s of %s   objects %" PRIu64 "\n",
           human_bytes((double)get(b, "memory_used"), b3, sizeof(b3)),
           human_bytes((double)get(b, "memory_capacity"), b4, sizeof(b4)), get(b, "objects"));
    printf("  SSD        %10s of %s   objects %" PRIu64 "   offload queue %" PRIu64 "\n",
           human_bytes((double)get(b, "ssd_bytes"), b5, sizeof(b5)),
           human_bytes((double)get(b, "ssd_capacity"), b6, sizeof(b6)), get(b, "ssd_objects"),
           get(b, "ssd_offload_queue"));
    fflush(stdout);
}

static void
top_line(const struct sample *a, const struct sample *b)
{
    struct hit_ratios r = ratios(a, b);

    printf("requests/s=%.0f lookups/s=%.0f hits/s=%.0f misses/s=%.0f hit%%=%.1f dram_hit%%=%.1f ssd_hit%%=%.1f "
           "in_B/s=%.0f out_B/s=%.0f rtt_us=%.0f conns=%" PRIu64 " memory_used=%" PRIu64
           " ssd_bytes=%" PRIu64 "\n",
           requests_rate(a, b), rate(a, b, "hits") + rate(a, b, "misses"), rate(a, b, "hits"), rate(a, b, "misses"),
           r.all < 0 ? 0 : r.all, r.dram < 0 ? 0 : r.dram, r.ssd < 0 ? 0 : r.ssd,
           rate(a, b, "bytes_in"), rate(a, b, "bytes_out"), b->rtt_us, get(b, "connections"),
           get(b, "memory_used"), get(b, "ssd_bytes"));
    fflush(stdout);
}

int
cli_top(struct kvstash *c, int argc, char **argv)
{
    double interval = 1;
    long count = 0;
    int opt, rc;

    optind = 0;
    while ((opt = getopt(argc, argv, ":d:n:")) != -1) {
        char *end = NULL;
        if (opt == 'd') {
            interval = strtod(optarg, &end);
            if (*end != '\0' || !(interval >= 0.1 && interval <= 3600)) {
                fputs("kvstash: top: -d wants seconds from 0.1 to 3600\n", stderr);
                return 2;
            }
        } else if (opt == 'n') {
            count = strtol(optarg, &end, 10);
            if (*end != '\0' || count < 1 || count > TOP_MAX_ROUNDS) {
                fputs("kvstash: top: -n wants a count from 1 to 1000000\n", stderr);
                return 2;
            }
        } else {
            fputs("usage: kvstash top [-d seconds] [-n count]\n", stderr);
            return 2;
        }
    }
    bool tty = isatty(STDOUT_FILENO) && isatty(STDIN_FILENO);
    struct termios saved, rawt;
    struct sample prev = {0}, cur = {0};

    if ((rc = sample_take(c, &prev)) != 0) {
        return rc;
    }
    signal(SIGINT, top_on_signal);
    signal(SIGTERM, top_on_signal);
    if (tty && tcgetattr(STDIN_FILENO, &saved) == 0) {
        rawt = saved;
        rawt.c_lflag &= (tcflag_t) ~(ICANON | ECHO);
        rawt.c_cc[VMIN] = 0;
        rawt.c_cc[VTIME] = 0;
        tcsetattr(STDIN_FILENO, TCSANOW, &rawt);
        printf("\033[?1049h"); /* the alternate screen: the shell's comes back on q */
    } else {
        tty = false;
    }
    for (long round = 0; !top_stop && (count == 0 || round < count) && round < TOP_MAX_ROUNDS;
         round++) {
        /* wait one interval, or less when q is pressed */
        double until = now_s() + interval;
        while (!top_stop) {
            double left = until - now_s();
            if (left <= 0) {
                break;
            }
            struct pollfd p = {.fd = STDIN_FILENO, .events = POLLIN};
            int n = poll(&p, tty ? 1 : 0, (int)(left * 1000) + 1);
            char ch;
            if (n > 0 && read(STDIN_FILENO, &ch, 1) == 1 && (ch == 'q' || ch == 'Q')) {
                top_stop = 1;
            }
        }
        if (top_stop) {
            break;
        }
        if ((rc = sample_take(c, &cur)) != 0) {
            break;
        }
        if (tty) {
            top_screen(&prev, &cur, interval);
        } else {
            top_line(&prev, &cur);
        }
        free(prev.items);
        prev = cur;
        cur.items = NULL;
    }
    if (tty) {
        printf("\033[?1049l");
        fflush(stdout);
        tcsetattr(STDIN_FILENO, TCSANOW, &saved);
    }
    free(prev.items);
    signal(SIGINT, SIG_DFL);
    signal(SIGTERM, SIG_DFL);
    return rc;
}

/* ---- bench ---- */

static int
cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;

    return (x > y) - (x < y);
}

static double
pct(const double *sorted, size_t n, double p)
{
    size_t i = (size_t)(p * (double)(n - 1) + 0.5);

    return n == 0 ? 0 : sorted[i < n ? i : n - 1];
}

/*
 * bench_phase: n puts (or gets) of size-byte values under "kvstash-bench-<pid>-<i>", one at a
 * time; lat[i] gets each round trip in µs. Prints the progress line on a terminal and the
 * kvstash-bench result line at the end. 0, or the exit status of a transport error.
 */
static int
bench_phase(struct kvstash *c, const char *mode, size_t n, size_t size, uint8_t *val, double *lat,
            bool tty)
{
    uint64_t misses = 0, errors = 0, bytes = 0;
    double t0 = now_s(), last = t0;
    char key[64];

    for (size_t i = 0; i < n; i++) {
        int klen = snprintf(key, sizeof(key), "kvstash-bench-%d-%zu", (int)getpid(), i);
        double a = now_s();
        size_t vlen = 0;
        int rc = mode[0] == 'p' ? kvstash_put(c, key, (size_t)klen, val, size)
                                : kvstash_get(c, key, (size_t)klen, val, size, &vlen);
        double b = now_s();

        lat[i] = (b - a) * 1e6;
        if (rc < 0) {
            fprintf(stderr, "\nkvstash: bench: %s: %s\n", mode, kvstash_strerror(rc));
            return 3;
        }
        if (rc == KVSTASH_ENOTFOUND) {
            misses++;
        } else if (rc != 0 && rc != KVSTASH_EEXISTS) {
            errors++;
        } else {
            bytes += size;
        }
        if (tty && (b - last >= 0.2 || i + 1 == n)) {
            last = b;
            fprintf(stderr, "\r%-4s %zu/%zu  %.0f ops/s  %.1f MB/s   ", mode, i + 1, n,
                    (double)(i + 1) / (b - t0), (double)bytes / (b - t0) / 1e6);
        }
    }
    double secs = now_s() - t0;
    if (tty) {
        fputs("\n", stderr);
    }
    qsort(lat, n, sizeof(*lat), cmp_double);
    printf("mode=%s size=%zu batch=1 conns=1 depth=1 secs=%.2f GB/s=%.3f keys/s=%.0f req/s=%.1f "
           "p50_us=%.0f p99_us=%.0f misses=%" PRIu64 " errors=%" PRIu64 "\n",
           mode, size, secs, (double)bytes / secs / 1e9, (double)n / secs, (double)n / secs,
           pct(lat, n, 0.50), pct(lat, n, 0.99), misses, errors);
    fflush(stdout);
    return 0;
}

int
cli_bench(struct kvstash *c, int argc, char **argv)
{
    long n = 2000;
    uint64_t size = 64 * 1024;
    bool keep = false;
    int opt, rc = 0;
    static const struct option longopts[] = {{"keep", no_argument, NULL, 'k'}, {NULL, 0, NULL, 0}};

    optind = 0;
    while ((opt = getopt_long(argc, argv, ":n:s:", longopts, NULL)) != -1) {
        char *end = NULL;
        if (opt == 'n') {
            n = strtol(optarg, &end, 10);
            if (*end != '\0' || n < 1 || n > BENCH_MAX_OPS) {
                fputs("kvstash: bench: -n wants a count from 1 to 1000000\n", stderr);
                return 2;
            }
        } else if (opt == 's') {
            size = strtoull(optarg, &end, 10);
            if (end != optarg && (*end == 'k' || *end == 'K' || *end == 'm' || *end == 'M')) {
                size <<= (*end == 'k' || *end == 'K') ? 10 : 20;
                end++;
            }
            if (end == optarg || *end != '\0' || size < 1 || size > BENCH_MAX_SIZE) {
                fputs("kvstash: bench: -s wants a size from 1 to 64m (64k, 1m)\n", stderr);
                return 2;
            }
        } else if (opt == 'k') {
            keep = true;
        } else {
            fputs("usage: kvstash bench [-n ops] [-s bytes] [--keep]\n", stderr);
            return 2;
        }
    }
    uint8_t *val = malloc(size);
    double *lat = malloc((size_t)n * sizeof(*lat));
    if (val == NULL || lat == NULL) {
        fputs("kvstash: bench: out of memory\n", stderr);
        free(val);
        free(lat);
        return 3;
    }
    for (uint64_t i = 0; i < size; i++) {
        val[i] = (uint8_t)(i * 131 + 7);
    }
    bool tty = isatty(STDERR_FILENO);
    rc = bench_phase(c, "put", (size_t)n, (size_t)size, val, lat, tty);
    if (rc == 0) {
        rc = bench_phase(c, "get", (size_t)n, (size_t)size, val, lat, tty);
    }
    if (!keep) {
        char key[64];
        for (long i = 0; i < n; i++) {
            int klen = snprintf(key, sizeof(key), "kvstash-bench-%d-%ld", (int)getpid(), i);
            if (kvstash_remove(c, key, (size_t)klen, true) < 0) {
                break;
            }
        }
    }
    free(val);
    free(lat);
    return rc;
}
