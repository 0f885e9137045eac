/*
 * place_sim: the placement simulator (make cluster-sim; docs/cluster.md has its figures).
 * It runs place.h's function over many nodes and keys, as a pool too large for this
 * machine would: for each key it finds the R owners among N nodes and, in the same pass,
 * whether a node joining (N+1) or one leaving (N-1) would change that key's owner set.
 * It reports the keys moved against the ideal (R/(N+1) on a join, R/N on a leave) and
 * each node's load (replicas held) against its weight's share, for equal and for varied
 * weights, and exits 1 when movement is off the ideal by more than 10% or a node's load
 * off its share by more than 5%.
 *
 *   place-sim [-n nodes] [-k keys] [-r replicas] [-t threads]     (1000, 10000000, 2, 2)
 *
 * Keys are "key-<i>" (content hashes in production; the hash mixes either). The inner loop
 * uses place.h's pieces (place_hash, place_pair, place_score) exactly: with equal weights
 * the order is that of the pair hash alone (a score is monotonic in it), and with weights
 * a node's score is computed only when its pair hash could beat the current R-th best.
 */
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "place.h"

#define SIM_TOP_MAX (PLACE_R_MAX + 1)
#define SIM_WMAX 4.0              /* the largest weight of the varied case */

struct sim {
    size_t n;                 /* nodes before the join; the joiner is index n */
    uint64_t keys;
    unsigned r;
    const double *w;          /* n + 1 weights */
    const uint64_t *hn;       /* n + 1 node hashes */
    size_t leaver;            /* the node that leaves */
    int weighted;
};

struct sim_part {
    const struct sim *s;
    uint64_t from, to;
    uint64_t *load;           /* n + 1 counters, this thread's */
    uint64_t moved_join, moved_leave;
    uint64_t load_joined;     /* replicas the joiner takes */
};

/* The top t of candidates by score, best first, over nodes[0..n) (joiner excluded). */
struct sim_top {
    unsigned t, n;
    size_t idx[SIM_TOP_MAX];
    double score[SIM_TOP_MAX];
};

static void
sim_offer(struct sim_top *top, size_t i, double sc)
{
    unsigned at;

    if (top->n == top->t && sc <= top->score[top->n - 1]) {
        return;
    }
    at = top->n < top->t ? top->n++ : top->n - 1;
    while (at > 0 && sc > top->score[at - 1]) {
        top->idx[at] = top->idx[at - 1];
        top->score[at] = top->score[at - 1];
        at--;
    }
    top->idx[at] = i;
    top->score[at] = sc;
}

static void *
sim_run(void *arg)
{
    struct sim_part *p = arg;
    const struct sim *s = p->s;
    char key[32];

    for (uint64_t k = p->from; k < p->to; k++) {
        int len = snprintf(key, sizeof(key), "key-%llu", (unsigned long long)k);
        uint64_t hk = place_hash(key, (size_t)len);
        struct sim_top top = {.t = s->r + 1, .n = 0};
        double join;

        if (!s->weighted) {
            /* equal weights: rank by the pair hash's top 53 bits (the score is monotonic in
             * them); the R+1-th best is the bar to clear, an integer compare per node */
            uint64_t bar = 0;

            for (size_t i = 0; i < s->n; i++) {
                uint64_t x = place_pair(s->hn[i], hk) >> 11;

                if (x >= bar) {
                    sim_offer(&top, i, (double)x);
                    if (top.n == top.t) {
                        bar = (uint64_t)top.score[top.n - 1];
                    }
                }
            }
            join = (double)(place_pair(s->hn[s->n], hk) >> 11);
        } else {
            /* weights: a candidate can beat the bar t only if -w/ln(u) > t, i.e. u >
             * exp(-w/t); with w at most SIM_WMAX, u > exp(-SIM_WMAX/t) is a safe pre-test,
             * kept as an integer bar on the pair hash's top 53 bits */
            double bar = 0.0;
            uint64_t xbar = 0;

            for (size_t i = 0; i < s->n; i++) {
                uint64_t x = place_pair(s->hn[i], hk);

                if ((x >> 11) >= xbar) {
                    double sc = place_score(x, s->w[i]);

                    if (sc > bar) {
                        sim_offer(&top, i, sc);
                        if (top.n == top.t) {
                            bar = top.score[top.n - 1];
                            xbar = (uint64_t)(exp(-SIM_WMAX / bar) * 9007199254740992.0);
                            xbar = xbar > 0 ? xbar - 1 : 0;     /* round down: never skip */
                        }
                    }
                }
            }
            join = place_score(place_pair(s->hn[s->n], hk), s->w[s->n]);
        }
        for (unsigned j = 0; j < s->r; j++) {
            p->load[top.idx[j]]++;
            if (top.idx[j] == s->leaver) {
                p->moved_leave++;     /* its copy moves to the R+1-th */
            }
        }
        if (join > top.score[s->r - 1]) {
            p->moved_join++;          /* the joiner takes one copy of this key */
        }
    }
    return NULL;
}

static double
sim_now(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* One configuration: returns 0 when within the targets. */
static int
sim_case(size_t n, uint64_t keys, unsigned r, unsigned threads, int weighted)
{
    double *w = calloc(n + 1, sizeof(*w)), wsum = 0.0, worst_load = 0.0, t0;
    uint64_t *hn = calloc(n + 1, sizeof(*hn)), total = 0, moved_join = 0, moved_leave = 0;
    uint64_t *load = calloc(n + 1, sizeof(*load));
    struct sim_part *parts = calloc(threads, sizeof(*parts));
    pthread_t *th = calloc(threads, sizeof(*th));
    struct sim s = {.n = n, .keys = keys, .r = r, .w = w, .hn = hn, .leaver = n / 3,
                    .weighted = weighted};
    static const double classes[] = {0.5, 1.0, 2.0, 4.0};
    size_t worst = 0;
    int bad = 0;

    if (w == NULL || hn == NULL || load == NULL || parts == NULL || th == NULL) {
        fprintf(stderr, "place-sim: out of memory\n");
        exit(2);
    }
    for (size_t i = 0; i <= n; i++) {
        char id[32];
        int len = snprintf(id, sizeof(id), "node-%04zu", i);

        hn[i] = place_hash(id, (size_t)len);
        w[i] = weighted ? classes[(i * 7 + 3) % 4] : 1.0;
        if (i < n) {
            wsum += w[i];
        }
    }
    t0 = sim_now();
    for (unsigned t = 0; t < threads; t++) {
        parts[t].s = &s;
        parts[t].from = keys * t / threads;
        parts[t].to = keys * (t + 1) / threads;
        parts[t].load = calloc(n + 1, sizeof(uint64_t));
        if (parts[t].load == NULL || pthread_create(&th[t], NULL, sim_run, &parts[t]) != 0) {
            fprintf(stderr, "place-sim: cannot start thread %u\n", t);
            exit(2);
        }
    }
    for (unsigned t = 0; t < threads; t++) {
        pthread_join(th[t], NULL);
        moved_join += parts[t].moved_join;
        moved_leave += parts[t].moved_leave;
        for (size_t i = 0; i <= n; i++) {
            load[i] += parts[t].load[i];
        }
        free(parts[t].load);
    }
    for (size_t i = 0; i < n; i++) {
        double want = (double)keys * r * w[i] / wsum, dev = (double)load[i] / want - 1.0;

        total += load[i];
        if (fabs(dev) > fabs(worst_load)) {
            worst_load = dev;
            worst = i;
        }
    }
    double ideal_join = (double)r / (double)(n + 1), ideal_leave = (double)r / (double)n;
    /* weighted: the joiner and the leaver carry their own weight's share */
    if (weighted) {
        ideal_join = r * w[n] / (wsum + w[n]);
        ideal_leave = r * w[s.leaver] / wsum;
    }
    /* the binomial spread of the lightest node's load, for reading worst_load */
    double wmin = weighted ? 0.5 : 1.0, p1 = r * wmin / wsum;
    double sigma = sqrt((double)keys * p1 * (1.0 - p1 / r)) / ((double)keys * p1);
    double mj = (double)moved_join / (double)keys, ml = (double)moved_leave / (double)keys;
    double rj = mj / ideal_join, rl = ml / ideal_leave;

    bad |= fabs(rj - 1.0) > 0.10 || fabs(rl - 1.0) > 0.10 || fabs(worst_load) > 0.05;
    printf("%-7s n=%zu keys=%llu R=%u: join moves %.4f%% of keys (ideal %.4f%%, x%.3f); "
           "leave moves %.4f%% (ideal %.4f%%, x%.3f); worst node load %+.2f%% of its share "
           "(node-%04zu, weight %g; binomial sigma of a weight-%g node %.2f%%); %.1f s%s\n",
           weighted ? "varied" : "equal", n, (unsigned long long)keys, r, 100 * mj,
           100 * ideal_join, rj, 100 * ml, 100 * ideal_leave, rl, 100 * worst_load, worst,
           w[worst], wmin, 100 * sigma, sim_now() - t0, bad ? "  OUT OF TARGET" : "");
    if (total != keys * r) {
        fprintf(stderr, "place-sim: %llu replicas placed, want %llu\n",
                (unsigned long long)total, (unsigned long long)(keys * r));
        bad = 1;
    }
    free(w);
    free(hn);
    free(load);
    free(parts);
    free(th);
    return bad;
}

int
main(int argc, char **argv)
{
    unsigned long long keys = 10000000ULL;
    unsigned long n = 1000, r = 2, threads = 2;
    int opt, bad = 0;

    while ((opt = getopt(argc, argv, "n:k:r:t:")) != -1) {
        char *end;
        unsigned long long v = strtoull(optarg, &end, 10);

        if (*end != '\0' || v == 0) {
            fprintf(stderr, "place-sim: -%c wants a positive number\n", opt);
            return 2;
        }
        switch (opt) {
        case 'n': n = (unsigned long)v; break;
        case 'k': keys = v; break;
        case 'r': r = (unsigned long)v; break;
        case 't': threads = (unsigned long)v; break;
        default:
            fprintf(stderr, "usage: place-sim [-n nodes] [-k keys] [-r replicas] [-t threads]\n");
            return 2;
        }
    }
    if (r > PLACE_R_MAX || r >= n || threads > 256) {
        fprintf(stderr, "place-sim: want r <= %d, r < n, threads <= 256\n", PLACE_R_MAX);
        return 2;
    }
    bad |= sim_case(n, keys, (unsigned)r, (unsigned)threads, 0);
    bad |= sim_case(n, keys, (unsigned)r, (unsigned)threads, 1);
    return bad;
}
