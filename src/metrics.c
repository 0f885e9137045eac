/*
 * metrics: renders the daemon's counters as Prometheus text (format 0.0.4) and the stats map
 * as JSON. It owns the metric names, their help texts, types and labels; the counters stay
 * where they are counted (per worker in struct conn_counters, the server's, the store's, the
 * SSD tier's) and are summed here with relaxed loads on each scrape, so a scrape costs the
 * workers nothing. It must not write a counter, take a worker's lock, allocate on behalf of
 * anyone but its caller, or know about HTTP.
 */
#include "metrics.h"

#include <errno.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#include "config.h"
#include "conn.h"
#include "kverr.h"
#include "member.h"
#include "peer_tls.h"
#include "rpc.h"
#include "rebalance.h"
#include "repl.h"
#include "server.h"
#include "ssd.h"
#include "stats.h"
#include "store.h"
#include "version.h"
#include "view.h"
#include "worker.h"

#define METRICS_STATS_MAX 160       /* the stats method's RPC_STATS_MAX: the same pairs */

void
metrics_buf_free(struct metrics_buf *out)
{
    free(out->p);
    memset(out, 0, sizeof(*out));
}

static void
mb_printf(struct metrics_buf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static void
mb_printf(struct metrics_buf *b, const char *fmt, ...)
{
    va_list ap;
    int n;

    if (b->failed) {
        return;
    }
    for (;;) {
        size_t room = b->cap - b->len;

        va_start(ap, fmt);
        n = vsnprintf(b->p != NULL ? b->p + b->len : NULL, room, fmt, ap);
        va_end(ap);
        if (n < 0) {
            b->failed = 1;
            return;
        }
        if ((size_t)n < room) {
            b->len += (size_t)n;
            return;
        }
        size_t cap = b->cap ? b->cap * 2 : 64 * 1024;
        while (cap < b->len + (size_t)n + 1) {
            cap *= 2;
        }
        if (cap > METRICS_MAX_BYTES) {
            b->failed = 1;
            return;
        }
        char *p = realloc(b->p, cap);
        if (p == NULL) {
            b->failed = 1;
            return;
        }
        b->p = p;
        b->cap = cap;
    }
}

static uint64_t
ld(const _Atomic uint64_t *v)
{
    return atomic_load_explicit(v, memory_order_relaxed);
}

/* The sum of the workers' counters that matter here, read once per scrape. */
struct metrics_sum {
    uint64_t ops[RPC_METHOD_COUNT];
    uint64_t errs[RPC_METHOD_COUNT][RPC_ERR_CODES];
    uint64_t lat[RPC_METHOD_COUNT][RPC_LAT_BUCKETS];
    uint64_t lat_sum_ns[RPC_METHOD_COUNT];
    uint64_t errors, hits_dram, hits_ssd, misses, prefix_asked, prefix_found, puts_expired;
    uint64_t shm_in, shm_out, rdma_in, rdma_out;
    uint64_t kind_in[CONN_KINDS], kind_out[CONN_KINDS];
    uint64_t protocol_errors, auth_failures, auth_revoked, inflight_pauses;
    uint64_t closed_output_max, closed_output_stalled, closed_input_stalled, closed_idle;
    uint64_t closed_buffer_memory;
    uint64_t peer_in, peer_out, peer_bad, peer_conflicts;
};

static void
metrics_sum_workers(const struct server_stats *sv, struct metrics_sum *m)
{
    memset(m, 0, sizeof(*m));
    for (int i = 0; i < sv->nworkers; i++) {
        const struct conn_counters *w = worker_counters(sv->workers[i]);
        const struct rpc_counters *r = &w->rpc;

        for (int k = 0; k < RPC_METHOD_COUNT; k++) {
            m->ops[k] += ld(&r->ops[k]);
            m->lat_sum_ns[k] += ld(&r->lat_sum_ns[k]);
            for (int c = 0; c < RPC_ERR_CODES; c++) {
                m->errs[k][c] += ld(&r->method_errors[k][c]);
            }
            for (int b = 0; b < RPC_LAT_BUCKETS; b++) {
                m->lat[k][b] += ld(&r->lat[k][b]);
            }
        }
        m->errors += ld(&r->errors);
        m->hits_dram += ld(&r->hits_dram);
        m->hits_ssd += ld(&r->hits_ssd);
        m->misses += ld(&r->misses);
        m->prefix_asked += ld(&r->prefix_asked);
        m->prefix_found += ld(&r->prefix_found);
        m->puts_expired += ld(&r->puts_expired);
        m->shm_in += ld(&r->shm_bytes_in);
        m->shm_out += ld(&r->shm_bytes_out);
        m->rdma_in += ld(&r->rdma_bytes_in);
        m->rdma_out += ld(&r->rdma_bytes_out);
        m->peer_in += ld(&r->peer_bytes_in);
        m->peer_out += ld(&r->peer_bytes_out);
        m->peer_bad += ld(&r->peer_checksum_mismatches);
        m->peer_conflicts += ld(&r->peer_checksum_conflicts);
        for (int k = 0; k < CONN_KINDS; k++) {
            m->kind_in[k] += ld(&w->kind_bytes_in[k]);
            m->kind_out[k] += ld(&w->kind_bytes_out[k]);
        }
        m->protocol_errors += ld(&w->protocol_errors);
        m->auth_failures += ld(&w->auth_failures);
        m->auth_revoked += ld(&w->auth_revoked);
        m->inflight_pauses += ld(&w->inflight_pauses);
        m->closed_output_max += ld(&w->output_cap_closes);
        m->closed_output_stalled += ld(&w->output_stall_closes);
        m->closed_input_stalled += ld(&w->input_stall_closes);
        m->closed_idle += ld(&w->idle_closes);
        m->closed_buffer_memory += ld(&w->buffer_cap_closes);
    }
}

/* # HELP and # TYPE of a family. */
static void
fam(struct metrics_buf *b, const char *name, const char *type, const char *help)
{
    mb_printf(b, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

/* A family of one unlabelled sample. */
static void
one(struct metrics_buf *b, const char *name, const char *type, const char *help, uint64_t v)
{
    fam(b, name, type, help);
    mb_printf(b, "%s %llu\n", name, (unsigned long long)v);
}

/* Label values here are names we choose, tenant names (config-checked) and the version:
 * escape what the format requires anyway. */
static void
lv(struct metrics_buf *b, const char *s)
{
    for (; *s != '\0'; s++) {
        if (*s == '\\' || *s == '"') {
            mb_printf(b, "\\%c", *s);
        } else if (*s == '\n') {
            mb_printf(b, "\\n");
        } else {
            mb_printf(b, "%c", *s);
        }
    }
}

static void
metrics_requests(struct metrics_buf *b, const struct metrics_sum *m)
{
    fam(b, "kvstash_requests_total", "counter", "Requests answered, by method.");
    for (int k = 0; k < RPC_METHOD_COUNT; k++) {
        mb_printf(b, "kvstash_requests_total{method=\"%s\"} %llu\n", rpc_method_name(k),
                  (unsigned long long)m->ops[k]);
    }
    fam(b, "kvstash_request_errors_total", "counter",
        "Requests answered with an error, by method and status code (series appear once "
        "non-zero).");
    for (int k = 0; k < RPC_METHOD_COUNT; k++) {
        for (int c = 1; c < RPC_ERR_CODES; c++) {
            if (m->errs[k][c] != 0) {
                mb_printf(b, "kvstash_request_errors_total{method=\"%s\",code=\"%s\"} %llu\n",
                          rpc_method_name(k), kv_errname(c), (unsigned long long)m->errs[k][c]);
            }
        }
    }
    one(b, "kvstash_errors_total", "counter",
        "Requests answered with an error, every method and unknown ones included.", m->errors);
    one(b, "kvstash_protocol_errors_total", "counter",
        "Connections closed for a framing violation.", m->protocol_errors);

    fam(b, "kvstash_request_duration_seconds", "histogram",
        "Time from dispatch to the reply queued, by method (the final try of a request that "
        "waited for the SSD tier).");
    for (int k = 0; k < RPC_METHOD_COUNT; k++) {
        const char *name = rpc_method_name(k);
        uint64_t cum = 0;

        for (int i = 0; i < RPC_LAT_BOUNDS; i++) {
            cum += m->lat[k][i];
            mb_printf(b, "kvstash_request_duration_seconds_bucket{method=\"%s\",le=\"%g\"} %llu\n",
                      name, (double)rpc_lat_bounds_ns[i] / 1e9, (unsigned long long)cum);
        }
        cum += m->lat[k][RPC_LAT_BOUNDS];
        mb_printf(b, "kvstash_request_duration_seconds_bucket{method=\"%s\",le=\"+Inf\"} %llu\n",
                  name, (unsigned long long)cum);
        mb_printf(b, "kvstash_request_duration_seconds_sum{method=\"%s\"} %.9f\n", name,
                  (double)m->lat_sum_ns[k] / 1e9);
        mb_printf(b, "kvstash_request_duration_seconds_count{method=\"%s\"} %llu\n", name,
                  (unsigned long long)cum);
    }
}

static void
metrics_transports(struct metrics_buf *b, const struct metrics_sum *m)
{
    static const char *const kinds[CONN_KINDS] = {[CONN_TCP] = "tcp", [CONN_UNIX] = "unix",
                                                  [CONN_TLS] = "tls"};

    fam(b, "kvstash_received_bytes_total", "counter",
        "Bytes received, by transport (tcp, unix, tls: socket bytes; shm, rdma: value bytes "
        "of batch_put_from).");
    for (int k = 0; k < CONN_KINDS; k++) {
        mb_printf(b, "kvstash_received_bytes_total{transport=\"%s\"} %llu\n", kinds[k],
                  (unsigned long long)m->kind_in[k]);
    }
    mb_printf(b, "kvstash_received_bytes_total{transport=\"shm\"} %llu\n",
              (unsigned long long)m->shm_in);
    mb_printf(b, "kvstash_received_bytes_total{transport=\"rdma\"} %llu\n",
              (unsigned long long)m->rdma_in);
    fam(b, "kvstash_sent_bytes_total", "counter",
        "Bytes sent, by transport (tcp, unix, tls: socket bytes; shm, rdma: value bytes of "
        "batch_get_into).");
    for (int k = 0; k < CONN_KINDS; k++) {
        mb_printf(b, "kvstash_sent_bytes_total{transport=\"%s\"} %llu\n", kinds[k],
                  (unsigned long long)m->kind_out[k]);
    }
    mb_printf(b, "kvstash_sent_bytes_total{transport=\"shm\"} %llu\n",
              (unsigned long long)m->shm_out);
    mb_printf(b, "kvstash_sent_bytes_total{transport=\"rdma\"} %llu\n",
              (unsigned long long)m->rdma_out);
}

static void
metrics_tiers(struct metrics_buf *b, const struct metrics_sum *m, const struct store_stats *st,
              const struct ssd_stats *ss)
{
    fam(b, "kvstash_objects", "gauge", "Objects held, by tier.");
    mb_printf(b, "kvstash_objects{tier=\"dram\"} %llu\n", (unsigned long long)st->resident);
    if (ss != NULL) {
        mb_printf(b, "kvstash_objects{tier=\"ssd\"} %llu\n", (unsigned long long)ss->objects);
    }
    fam(b, "kvstash_value_bytes", "gauge", "Value bytes held, by tier.");
    mb_printf(b, "kvstash_value_bytes{tier=\"dram\"} %llu\n",
              (unsigned long long)st->resident_bytes);
    if (ss != NULL) {
        mb_printf(b, "kvstash_value_bytes{tier=\"ssd\"} %llu\n", (unsigned long long)ss->bytes);
    }
    fam(b, "kvstash_capacity_bytes", "gauge", "Capacity, by tier (memory_size, ssd_size).");
    mb_printf(b, "kvstash_capacity_bytes{tier=\"dram\"} %llu\n",
              (unsigned long long)st->memory_capacity);
    if (ss != NULL) {
        mb_printf(b, "kvstash_capacity_bytes{tier=\"ssd\"} %llu\n",
                  (unsigned long long)ss->capacity);
    }
    fam(b, "kvstash_utilization_ratio", "gauge",
        "Value bytes held / capacity, by tier (DRAM: objects' bytes / memory_size).");
    mb_printf(b, "kvstash_utilization_ratio{tier=\"dram\"} %.4f\n",
              st->memory_capacity != 0
                  ? (double)st->resident_bytes / (double)st->memory_capacity : 0.0);
    one(b, "kvstash_memory_used_bytes", "gauge", "Arena bytes in use (values and their pages).",
        st->memory_used);
    one(b, "kvstash_memory_prefaulted_bytes", "gauge", "Arena bytes whose pages are populated.",
        st->memory_prefaulted);
    one(b, "kvstash_memory_hugepages", "gauge",
        "The arena's pages: 0 4 KiB, 1 transparent huge pages, 2 hugetlb (memory_hugepages).",
        st->memory_hugepages);
    one(b, "kvstash_memory_file_reused", "gauge",
        "1: the arena's memory_file existed with the arena's size at start (a warm restart).",
        st->memory_file_reused);
    one(b, "kvstash_memory_file_resident_bytes", "gauge",
        "Bytes of the arena's memory_file resident in memory when it was mapped at start.",
        st->memory_file_resident);
    one(b, "kvstash_metadata_bytes", "gauge", "Bytes of the store's own bookkeeping.",
        st->metadata_bytes);

    /*
     * Counted where each read's lookup resolved (rpc_tier_count): found in DRAM, found on
     * the SSD only, or not found. A read looks in DRAM, then on the SSD: DRAM's misses are
     * the SSD's hits and the misses; the SSD's misses are the misses.
     */
    fam(b, "kvstash_hits_total", "counter",
        "Keys reads found (get, batch_get, batch_get_into, get_replica_list, RESP GET/MGET), "
        "by the tier that had them.");
    mb_printf(b, "kvstash_hits_total{tier=\"dram\"} %llu\n", (unsigned long long)m->hits_dram);
    if (ss != NULL) {
        mb_printf(b, "kvstash_hits_total{tier=\"ssd\"} %llu\n", (unsigned long long)m->hits_ssd);
    }
    fam(b, "kvstash_misses_total", "counter",
        "Keys reads looked for in a tier that did not have them, by tier.");
    mb_printf(b, "kvstash_misses_total{tier=\"dram\"} %llu\n",
              (unsigned long long)(m->misses + m->hits_ssd));
    if (ss != NULL) {
        mb_printf(b, "kvstash_misses_total{tier=\"ssd\"} %llu\n", (unsigned long long)m->misses);
    }
    one(b, "kvstash_prefix_blocks_asked_total", "counter",
        "prefix_match: blocks (key groups) asked for.", m->prefix_asked);
    one(b, "kvstash_prefix_blocks_found_total", "counter",
        "prefix_match: leading blocks found (the reuse a prefix cache gets).", m->prefix_found);

    fam(b, "kvstash_evictions_total", "counter", "Objects evicted, by tier and reason.");
    mb_printf(b, "kvstash_evictions_total{tier=\"dram\",reason=\"capacity\"} %llu\n",
              (unsigned long long)st->evictions);
    if (ss != NULL) {
        mb_printf(b, "kvstash_evictions_total{tier=\"ssd\",reason=\"capacity\"} %llu\n",
                  (unsigned long long)ss->evicted_objects);
        mb_printf(b, "kvstash_evictions_total{tier=\"ssd\",reason=\"checksum\"} %llu\n",
                  (unsigned long long)ss->checksum_errors);
    }
    one(b, "kvstash_evicted_bytes_total", "counter", "Value bytes evicted from DRAM.",
        st->evicted_bytes);
    one(b, "kvstash_evictions_inline_total", "counter",
        "DRAM evictions a put made itself (the arena full before the evictor thread made room).",
        st->evictions_inline);
    one(b, "kvstash_puts_expired_total", "counter",
        "put_start reservations reclaimed after put_timeout_ms.", m->puts_expired);
    one(b, "kvstash_no_space_total", "counter", "Puts refused for want of room in DRAM.",
        st->no_space);
    one(b, "kvstash_pinned_objects", "gauge", "Objects pinned (hard and soft).",
        st->pinned_hard + st->pinned_soft);

    if (ss == NULL) {
        return;
    }
    one(b, "kvstash_ssd_buckets", "gauge", "Bucket files of the SSD tier.", ss->buckets);
    one(b, "kvstash_ssd_disk_bytes", "gauge", "Bytes of the SSD tier's bucket files.",
        ss->disk_bytes);
    one(b, "kvstash_ssd_offload_queue_objects", "gauge", "Offloads to the SSD tier pending.",
        ss->queue_objects);
    one(b, "kvstash_ssd_offload_queue_bytes", "gauge", "Value bytes of the pending offloads.",
        ss->queue_bytes);
    one(b, "kvstash_ssd_load_queue_objects", "gauge", "Loads from the SSD tier pending.",
        ss->load_queue);
    one(b, "kvstash_ssd_offload_dropped_total", "counter",
        "Objects that left DRAM without an SSD copy: the tier could not write them, the "
        "offload queue was over its bound, or the write-rate admission refused them.",
        ss->write_failed + ss->offload_dropped);
    one(b, "kvstash_ssd_rate_limited_total", "counter",
        "On-evict offloads refused by the admission of ssd_write_rate_limit.", ss->rate_limited);
    one(b, "kvstash_ssd_live_bytes", "gauge",
        "Record bytes of the objects indexed on the SSD tier (what ssd_size holds live).",
        ss->live_bytes);
    fam(b, "kvstash_ssd_utilization_ratio", "gauge", "SSD live record bytes over ssd_size.");
    mb_printf(b, "kvstash_ssd_utilization_ratio %.4f\n",
              ss->capacity != 0 ? (double)ss->live_bytes / (double)ss->capacity : 0.0);
    one(b, "kvstash_ssd_checksum_failures_total", "counter",
        "Values read back from SSD that failed their CRC (dropped, never served).",
        ss->checksum_errors);
    one(b, "kvstash_ssd_scrub_bad_total", "counter",
        "Values the scrub after a summary-based rebuild found failing their CRC (dropped).",
        ss->scrub_bad);
    one(b, "kvstash_ssd_scrub_buckets", "gauge",
        "Buckets the scrub after this start's rebuild checks (those rebuilt from summaries).",
        ss->scrub_buckets);
    one(b, "kvstash_ssd_scrub_buckets_done", "gauge", "Of those, buckets checked so far.",
        ss->scrub_buckets_done);
    one(b, "kvstash_ssd_io_errors_total", "counter", "SSD read, write and sync failures.",
        ss->io_errors);
    one(b, "kvstash_ssd_no_space_total", "counter", "SSD writes refused: disk or map full.",
        ss->no_space);
    one(b, "kvstash_ssd_read_bytes_total", "counter", "Bytes read from the SSD tier.",
        ss->read_bytes);
    one(b, "kvstash_ssd_written_bytes_total", "counter", "Bytes written to the SSD tier.",
        ss->write_bytes);
    one(b, "kvstash_ssd_reads_total", "counter", "SSD read attempts.", ss->reads);
    one(b, "kvstash_ssd_writes_total", "counter", "Objects written to SSD and indexed.",
        ss->writes);
    one(b, "kvstash_ssd_syncs_total", "counter", "SSD group commits.", ss->syncs);
    one(b, "kvstash_ssd_evicted_buckets_total", "counter", "SSD buckets evicted.",
        ss->evicted_buckets);
    one(b, "kvstash_ssd_compacted_buckets_total", "counter",
        "SSD buckets compacted: live records copied forward, then the bucket dropped.",
        ss->compacted_buckets);
    one(b, "kvstash_ssd_compacted_bytes_total", "counter",
        "Record bytes SSD compaction copied forward.", ss->compacted_bytes);
    one(b, "kvstash_ssd_degraded", "gauge", "1 while SSD writes are suspended after a fault.",
        ss->degraded);
    fam(b, "kvstash_ssd_index_load_seconds", "gauge", "Time the start-up index load took.");
    mb_printf(b, "kvstash_ssd_index_load_seconds %.3f\n", (double)ss->start_ms / 1e3);
}

static void
metrics_connections(struct metrics_buf *b, const struct server_stats *sv,
                    const struct metrics_sum *m)
{
    uint64_t nofd = sv->refused_no_fd;
    uint64_t maxc = sv->connections_rejected > nofd ? sv->connections_rejected - nofd : 0;

    one(b, "kvstash_connections", "gauge", "Client connections open now.", sv->connections);
    one(b, "kvstash_connections_total", "counter", "Client connections accepted.",
        sv->connections_total);
    fam(b, "kvstash_connections_refused_total", "counter",
        "Client connections refused at accept, by reason.");
    mb_printf(b, "kvstash_connections_refused_total{reason=\"max_connections\"} %llu\n",
              (unsigned long long)maxc);
    mb_printf(b, "kvstash_connections_refused_total{reason=\"no_descriptor\"} %llu\n",
              (unsigned long long)nofd);
    fam(b, "kvstash_connections_closed_total", "counter",
        "Client connections the daemon closed, by reason (peers' own closes not counted).");
    mb_printf(b, "kvstash_connections_closed_total{reason=\"output_max\"} %llu\n",
              (unsigned long long)m->closed_output_max);
    mb_printf(b, "kvstash_connections_closed_total{reason=\"output_stalled\"} %llu\n",
              (unsigned long long)m->closed_output_stalled);
    mb_printf(b, "kvstash_connections_closed_total{reason=\"input_stalled\"} %llu\n",
              (unsigned long long)m->closed_input_stalled);
    mb_printf(b, "kvstash_connections_closed_total{reason=\"idle\"} %llu\n",
              (unsigned long long)m->closed_idle);
    mb_printf(b, "kvstash_connections_closed_total{reason=\"buffer_memory\"} %llu\n",
              (unsigned long long)m->closed_buffer_memory);
    mb_printf(b, "kvstash_connections_closed_total{reason=\"auth_revoked\"} %llu\n",
              (unsigned long long)m->auth_revoked);
    one(b, "kvstash_accept_errors_total", "counter", "accept(2) failures.", sv->accept_errors);
    one(b, "kvstash_auth_failures_total", "counter", "hello {tenant, token} refused.",
        m->auth_failures);
    one(b, "kvstash_inflight_pauses_total", "counter",
        "Times reading a connection paused at client_inflight_max.", m->inflight_pauses);
}

static void
metrics_tenants(struct metrics_buf *b, struct server *s, struct store *store,
                const struct store_stats *st)
{
    const struct kv_config *c = server_config(s);
    const struct conf_tenants *ts = &c->tenants;

    one(b, "kvstash_quota_exceeded_total", "counter", "Puts refused by a tenant's quota.",
        st->quota_exceeded);
    if (ts->n == 0) {
        return;
    }
    fam(b, "kvstash_tenant_objects", "gauge", "Objects of a tenant (DRAM and SSD).");
    for (uint32_t i = 0; i < ts->n; i++) {
        uint64_t objects = 0, bytes = 0;

        store_tenant_usage(store, ts->t[i].id, &objects, &bytes);
        mb_printf(b, "kvstash_tenant_objects{tenant=\"");
        lv(b, ts->t[i].name);
        mb_printf(b, "\"} %llu\n", (unsigned long long)objects);
    }
    fam(b, "kvstash_tenant_value_bytes", "gauge", "Value bytes of a tenant (DRAM and SSD).");
    for (uint32_t i = 0; i < ts->n; i++) {
        uint64_t objects = 0, bytes = 0;

        store_tenant_usage(store, ts->t[i].id, &objects, &bytes);
        mb_printf(b, "kvstash_tenant_value_bytes{tenant=\"");
        lv(b, ts->t[i].name);
        mb_printf(b, "\"} %llu\n", (unsigned long long)bytes);
    }
    fam(b, "kvstash_tenant_quota_bytes", "gauge",
        "A tenant's quota, by tier (0: none, the tier's whole capacity).");
    for (uint32_t i = 0; i < ts->n; i++) {
        mb_printf(b, "kvstash_tenant_quota_bytes{tenant=\"");
        lv(b, ts->t[i].name);
        mb_printf(b, "\",tier=\"dram\"} %llu\n", (unsigned long long)ts->t[i].memory_quota);
        mb_printf(b, "kvstash_tenant_quota_bytes{tenant=\"");
        lv(b, ts->t[i].name);
        mb_printf(b, "\",tier=\"ssd\"} %llu\n", (unsigned long long)ts->t[i].ssd_quota);
    }
}

/* CPU seconds and resident bytes of this process. */
static void
metrics_process(struct metrics_buf *b, const struct server_stats *sv, struct server *s)
{
    struct rusage ru;
    double cpu = 0;
    unsigned long long pages = 0, rss_pages = 0;
    char why[128];
    FILE *f;

    if (getrusage(RUSAGE_SELF, &ru) == 0) {
        cpu = (double)ru.ru_utime.tv_sec + (double)ru.ru_utime.tv_usec / 1e6
              + (double)ru.ru_stime.tv_sec + (double)ru.ru_stime.tv_usec / 1e6;
    }
    f = fopen("/proc/self/statm", "re");
    if (f != NULL) {
        if (fscanf(f, "%llu %llu", &pages, &rss_pages) != 2) {
            rss_pages = 0;
        }
        fclose(f);
    }
    fam(b, "kvstash_build_info", "gauge", "Always 1; the version in a label.");
    mb_printf(b, "kvstash_build_info{version=\"");
    lv(b, KVSTASH_VERSION);
    mb_printf(b, "\"} 1\n");
    one(b, "kvstash_process_start_time_seconds", "gauge",
        "Start time of the process, seconds since the Unix epoch.", sv->start_time_s);
    fam(b, "kvstash_process_cpu_seconds_total", "counter", "User and system CPU time spent.");
    mb_printf(b, "kvstash_process_cpu_seconds_total %.3f\n", cpu);
    one(b, "kvstash_process_resident_memory_bytes", "gauge", "Resident memory size.",
        rss_pages * (unsigned long long)sysconf(_SC_PAGESIZE));
    one(b, "kvstash_ready", "gauge", "1 when /readyz answers 200.",
        server_ready(s, why, sizeof(why)) ? 1 : 0);
    one(b, "kvstash_io_threads", "gauge", "Event-loop threads.", (uint64_t)sv->nworkers);
}

/* The cluster's data paths (src/cluster/repl.h): what this node asked of its peers and served. */
static void
metrics_cluster_data(struct metrics_buf *b, const struct metrics_sum *m, struct repl *r,
                     struct rebalance *rb)
{
    struct repl_stats rs;
    struct rebalance_stats bs;
    struct peer_tls_stats ts;

    repl_stats(r, &rs);
    rebalance_stats(rb, &bs);
    one(b, "kvstash_cluster_rebalance_running", "gauge",
        "1 while a walk after a view change runs.", bs.running);
    one(b, "kvstash_cluster_rebalance_walks_total", "counter",
        "Walks after a view change completed.", bs.walks);
    one(b, "kvstash_cluster_rebalance_restarts_total", "counter",
        "Walks restarted because the view moved again.", bs.restarts);
    one(b, "kvstash_cluster_rebalance_keys_checked_total", "counter",
        "Keys whose owners changed, asked about at a new owner.", bs.keys_checked);
    one(b, "kvstash_cluster_rebalance_keys_moved_total", "counter",
        "Keys pushed to a new owner that lacked them.", bs.keys_moved);
    one(b, "kvstash_cluster_rebalance_bytes_moved_total", "counter",
        "Value bytes of those keys.", bs.bytes_moved);
    one(b, "kvstash_cluster_remote_hits_total", "counter",
        "Keys missing here that an owner had (fetched and kept here).", rs.remote_hits);
    one(b, "kvstash_cluster_remote_misses_total", "counter",
        "Keys missing here that no owner had (or none answered within peer_timeout).",
        rs.remote_misses);
    one(b, "kvstash_cluster_peer_requests_total", "counter", "Requests sent to peers.",
        rs.peer_requests);
    one(b, "kvstash_cluster_peer_errors_total", "counter",
        "Requests to peers that failed: unreachable, refused, or past peer_timeout.",
        rs.peer_errors);
    one(b, "kvstash_cluster_peer_timeouts_total", "counter",
        "Requests to peers that peer_timeout ended.", rs.peer_timeouts);
    one(b, "kvstash_cluster_peer_auth_failures_total", "counter",
        "Logins to peers (hello as admin with <data_dir>/cluster_token) they refused.",
        rs.peer_auth_failures);
    one(b, "kvstash_cluster_peer_rdma_connects_total", "counter",
        "Queue pairs connected to peers (rdma_connect over a peer connection).",
        rs.peer_rdma_connects);
    one(b, "kvstash_cluster_peer_rdma_fallbacks_total", "counter",
        "Peer connections left on TCP: the peer refused RDMA (no device there), or a queue "
        "pair, an RDMA fetch or an RDMA put failed on it.", rs.peer_rdma_fallbacks);
    one(b, "kvstash_cluster_peer_rdma_fetch_bytes_total", "counter",
        "Value bytes fetched from peers over RDMA (their writes into this node's arena).",
        rs.peer_rdma_fetch_bytes);
    one(b, "kvstash_cluster_peer_rdma_put_bytes_total", "counter",
        "Value bytes owners stored by RDMA-READing them from this node's arena "
        "(peer_put_from): replica puts and rebalance pushes.", rs.peer_rdma_put_bytes);
    peer_tls_stats(&ts);
    fam(b, "kvstash_cluster_peer_tls_refused_total", "counter",
        "TLS handshakes to peers refused for the peer's certificate: not for the host of its "
        "peer_advertise (name), or not chaining to tls_ca_file (chain).");
    mb_printf(b, "kvstash_cluster_peer_tls_refused_total{reason=\"name\"} %llu\n",
              (unsigned long long)ts.refused_name);
    mb_printf(b, "kvstash_cluster_peer_tls_refused_total{reason=\"chain\"} %llu\n",
              (unsigned long long)ts.refused_chain);
    fam(b, "kvstash_cluster_peer_bytes_total", "counter",
        "Bytes of peer traffic: sent and received by this node's requests, and value bytes "
        "other nodes stored here (peer_put) and fetched from here (peer_get).");
    mb_printf(b, "kvstash_cluster_peer_bytes_total{direction=\"request_out\"} %llu\n",
              (unsigned long long)rs.peer_bytes_out);
    mb_printf(b, "kvstash_cluster_peer_bytes_total{direction=\"request_in\"} %llu\n",
              (unsigned long long)rs.peer_bytes_in);
    mb_printf(b, "kvstash_cluster_peer_bytes_total{direction=\"served_in\"} %llu\n",
              (unsigned long long)m->peer_in);
    mb_printf(b, "kvstash_cluster_peer_bytes_total{direction=\"served_out\"} %llu\n",
              (unsigned long long)m->peer_out);
    one(b, "kvstash_cluster_replication_queue_depth", "gauge",
        "Puts being sent to their owners now.", rs.repl_queue_depth);
    one(b, "kvstash_cluster_replication_queue_bytes", "gauge",
        "Value bytes of the puts being sent to their owners now.", rs.repl_queue_bytes);
    one(b, "kvstash_cluster_replication_drops_total", "counter",
        "Puts not sent to an owner: the replication queue was full.", rs.repl_drops);
    fam(b, "kvstash_cluster_replications_total", "counter",
        "Puts sent to owners, by outcome.");
    mb_printf(b, "kvstash_cluster_replications_total{outcome=\"stored\"} %llu\n",
              (unsigned long long)rs.repl_acked);
    mb_printf(b, "kvstash_cluster_replications_total{outcome=\"conflict\"} %llu\n",
              (unsigned long long)rs.repl_conflicts);
    mb_printf(b, "kvstash_cluster_replications_total{outcome=\"failed\"} %llu\n",
              (unsigned long long)rs.repl_failed);
    fam(b, "kvstash_cluster_checksum_mismatches_total", "counter",
        "Values that failed their CRC-32C: fetched from a peer (the next owner was asked), or "
        "sent here by one (refused).");
    mb_printf(b, "kvstash_cluster_checksum_mismatches_total{side=\"fetch\"} %llu\n",
              (unsigned long long)rs.checksum_mismatches);
    mb_printf(b, "kvstash_cluster_checksum_mismatches_total{side=\"receive\"} %llu\n",
              (unsigned long long)m->peer_bad);
    fam(b, "kvstash_cluster_checksum_conflicts_total", "counter",
        "A key stored with other bytes than a second writer's (the first writer won): seen "
        "by the sender of a put, or here as its receiver.");
    mb_printf(b, "kvstash_cluster_checksum_conflicts_total{side=\"send\"} %llu\n",
              (unsigned long long)rs.repl_conflicts);
    mb_printf(b, "kvstash_cluster_checksum_conflicts_total{side=\"receive\"} %llu\n",
              (unsigned long long)m->peer_conflicts);
}

/* The pool's membership (docs/cluster.md): only when this daemon is in one. */
static void
metrics_cluster(struct metrics_buf *b)
{
    static const enum view_state states[] = {VIEW_JOINING, VIEW_ACTIVE, VIEW_DRAINING};
    struct member_stats ms;
    struct cluster_view *v;

    member_stats(&ms);
    if (!ms.in_pool) {
        return;
    }
    v = view_acquire();
    fam(b, "kvstash_cluster_members", "gauge", "Members of the pool in this daemon's view, by "
        "state.");
    for (size_t k = 0; k < sizeof(states) / sizeof(states[0]); k++) {
        uint64_t n = 0;

        for (size_t i = 0; v != NULL && i < v->n; i++) {
            n += v->nodes[i].state == states[k];
        }
        mb_printf(b, "kvstash_cluster_members{state=\"%s\"} %llu\n", view_state_name(states[k]),
                  (unsigned long long)n);
    }
    one(b, "kvstash_cluster_view_revision", "gauge",
        "The etcd revision of this daemon's view of the pool.", v != NULL ? v->revision : 0);
    view_release(v);
    one(b, "kvstash_cluster_registered", "gauge",
        "1 while this node's key is in etcd under a live lease.", ms.registered);
    one(b, "kvstash_cluster_etcd_up", "gauge", "1 when etcd answered the last call.",
        ms.etcd_ok);
    one(b, "kvstash_cluster_etcd_errors_total", "counter",
        "Calls to etcd that failed (no answer or an error answer).", ms.etcd_errors);
    one(b, "kvstash_cluster_lease_renewals_total", "counter",
        "Lease keepalives answered with the lease alive.", ms.lease_renewals);
    one(b, "kvstash_cluster_lease_lost_total", "counter",
        "Leases found expired (the node then registered again).", ms.lease_lost);
    one(b, "kvstash_cluster_registrations_total", "counter",
        "Times this node's key was created in etcd.", ms.registrations);
    one(b, "kvstash_cluster_views_total", "counter", "Views of the pool published.", ms.views);
    one(b, "kvstash_cluster_full_reads_total", "counter",
        "Member lists read whole (start, compaction, lost history).", ms.full_reads);
    one(b, "kvstash_cluster_watch_rearms_total", "counter",
        "Watches restarted before their idle timeout.", ms.watch_rearms);
    one(b, "kvstash_cluster_etcd_logins_total", "counter",
        "Logins to etcd as etcd_user answered with a token (the first, then one per token "
        "etcd refused).", ms.etcd_logins);
}

int
metrics_render(struct server *s, struct metrics_buf *out)
{
    struct server_stats sv;
    struct store_stats st;
    struct ssd_stats ss;
    struct metrics_sum *m = malloc(sizeof(*m));

    if (m == NULL) {
        out->failed = 1;
        return -ENOMEM;
    }
    server_stats(s, &sv);
    metrics_sum_workers(&sv, m);
    store_stats(sv.store, &st);
    if (sv.ssd != NULL) {
        ssd_stats(sv.ssd, &ss);
    }
    metrics_process(out, &sv, s);
    metrics_requests(out, m);
    metrics_transports(out, m);
    metrics_tiers(out, m, &st, sv.ssd != NULL ? &ss : NULL);
    metrics_connections(out, &sv, m);
    metrics_tenants(out, s, sv.store, &st);
    metrics_cluster(out);
    if (sv.repl != NULL) {
        metrics_cluster_data(out, m, sv.repl, sv.rebalance);
    }
    free(m);
    return out->failed ? -ENOMEM : 0;
}

int
metrics_stats_json(struct server *s, struct metrics_buf *out)
{
    const char *names[METRICS_STATS_MAX];
    uint64_t values[METRICS_STATS_MAX];
    int n = stats_collect(s, names, values, METRICS_STATS_MAX);

    mb_printf(out, "{");
    for (int i = 0; i < n; i++) {
        /* the names are ours: letters, digits, '_' and '.' */
        mb_printf(out, "%s\"%s\":%llu", i > 0 ? "," : "", names[i],
                  (unsigned long long)values[i]);
    }
    mb_printf(out, "}\n");
    return out->failed ? -ENOMEM : 0;
}
