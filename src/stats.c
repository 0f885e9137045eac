/*
 * stats: names and sums every counter of the daemon for the `stats` method.
 * Reads single-writer counters with relaxed loads; the set is not a
 * consistent snapshot, each value is.
 */
#include "stats.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>

#include "conn.h"
#include "repl.h"
#include "rpc.h"
#include "server.h"
#include "ssd.h"
#include "store.h"
#include "worker.h"

static char stats_op_names[RPC_METHOD_COUNT][40];
static pthread_once_t stats_once = PTHREAD_ONCE_INIT;

static void
stats_names_init(void)
{
    for (int m = 0; m < RPC_METHOD_COUNT; m++) {
        snprintf(stats_op_names[m], sizeof(stats_op_names[m]), "ops.%s", rpc_method_name(m));
    }
}

static uint64_t
ld(const _Atomic uint64_t *v)
{
    return atomic_load_explicit(v, memory_order_relaxed);
}

int
stats_collect(void *arg, const char **names, uint64_t *values, int max)
{
    struct server_stats sv;
    struct store_stats st;
    uint64_t ops[RPC_METHOD_COUNT] = {0};
    uint64_t hits_dram = 0, hits_ssd = 0, misses = 0, errors = 0, bin = 0, bout = 0, perr = 0, expired = 0;
    uint64_t auth_failed = 0, cap_closes = 0, stall_closes = 0, idle_closes = 0, buf_closes = 0;
    uint64_t in_stall_closes = 0, inflight_pauses = 0, auth_revoked = 0;
    int n = 0;

    pthread_once(&stats_once, stats_names_init);
    server_stats(arg, &sv);
    for (int i = 0; i < sv.nworkers; i++) {
        const struct conn_counters *w = worker_counters(sv.workers[i]);
        for (int m = 0; m < RPC_METHOD_COUNT; m++) {
            ops[m] += ld(&w->rpc.ops[m]);
        }
        hits_dram += ld(&w->rpc.hits_dram);
        hits_ssd += ld(&w->rpc.hits_ssd);
        misses += ld(&w->rpc.misses);
        errors += ld(&w->rpc.errors);
        expired += ld(&w->rpc.puts_expired);
        bin += ld(&w->bytes_in);
        bout += ld(&w->bytes_out);
        perr += ld(&w->protocol_errors);
        auth_failed += ld(&w->auth_failures);
        cap_closes += ld(&w->output_cap_closes);
        stall_closes += ld(&w->output_stall_closes);
        in_stall_closes += ld(&w->input_stall_closes);
        idle_closes += ld(&w->idle_closes);
        buf_closes += ld(&w->buffer_cap_closes);
        inflight_pauses += ld(&w->inflight_pauses);
        auth_revoked += ld(&w->auth_revoked);
    }
    store_stats(sv.store, &st);

#define STAT(name, val)                                                                        \
    do {                                                                                       \
        if (n < max) {                                                                         \
            names[n] = (name);                                                                 \
            values[n] = (uint64_t)(val);                                                       \
            n++;                                                                               \
        }                                                                                      \
    } while (0)

    STAT("uptime_s", sv.uptime_s);
    STAT("connections", sv.connections);
    STAT("connections_total", sv.connections_total);
    STAT("connections_rejected", sv.connections_rejected);
    STAT("accept_errors", sv.accept_errors);
    STAT("io_threads", sv.nworkers);
    for (int m = 0; m < RPC_METHOD_COUNT; m++) {
        STAT(stats_op_names[m], ops[m]);
    }
    STAT("hits", hits_dram + hits_ssd);
    STAT("hits_dram", hits_dram);
    STAT("hits_ssd", hits_ssd);
    STAT("misses", misses);
    STAT("request_errors", errors);
    STAT("puts_expired", expired);
    STAT("auth_failures", auth_failed);
    STAT("auth_revoked", auth_revoked);
    STAT("closed_output_max", cap_closes);
    STAT("closed_output_stalled", stall_closes);
    STAT("closed_input_stalled", in_stall_closes);
    STAT("closed_idle", idle_closes);
    STAT("closed_buffer_memory", buf_closes);
    STAT("inflight_pauses", inflight_pauses);
    STAT("protocol_errors", perr);
    STAT("bytes_in", bin);
    STAT("bytes_out", bout);
    STAT("objects", st.objects);
    STAT("reserved", st.reserved);
    STAT("memory_used", st.memory_used);
    STAT("memory_capacity", st.memory_capacity);
    STAT("value_bytes", st.value_bytes);
    STAT("evictions", st.evictions);
    STAT("evicted_bytes", st.evicted_bytes);
    STAT("no_space", st.no_space);
    STAT("pinned_hard", st.pinned_hard);
    STAT("pinned_soft", st.pinned_soft);
    STAT("metadata_bytes", st.metadata_bytes);
    STAT("memory_prefaulted", st.memory_prefaulted);
    STAT("memory_hugepages", st.memory_hugepages);
    STAT("memory_file_reused", st.memory_file_reused);
    STAT("memory_file_resident", st.memory_file_resident);
    STAT("dram_objects", st.resident);
    STAT("dram_bytes", st.resident_bytes);
    /* objects' bytes / memory_size, in thousandths */
    STAT("dram_utilization_permille",
         st.memory_capacity != 0 ? st.resident_bytes * 1000 / st.memory_capacity : 0);
    STAT("evictions_inline", st.evictions_inline);
    STAT("loading", st.loading);
    STAT("offloading", st.offloading);
    STAT("quota_exceeded", st.quota_exceeded);
    if (sv.repl != NULL) {
        struct repl_stats rs;

        repl_stats(sv.repl, &rs);
        STAT("peer_rdma_connects", rs.peer_rdma_connects);
        STAT("peer_rdma_fallbacks", rs.peer_rdma_fallbacks);
        STAT("peer_rdma_fetch_bytes", rs.peer_rdma_fetch_bytes);
        STAT("peer_rdma_put_bytes", rs.peer_rdma_put_bytes);
    }
    if (sv.ssd != NULL) {
        struct ssd_stats ss;

        ssd_stats(sv.ssd, &ss);
        STAT("ssd_objects", ss.objects);
        STAT("ssd_bytes", ss.bytes);
        STAT("ssd_disk_bytes", ss.disk_bytes);
        STAT("ssd_capacity", ss.capacity);
        STAT("ssd_buckets", ss.buckets);
        STAT("ssd_hits", ss.hits);
        STAT("ssd_reads", ss.reads);
        STAT("ssd_read_bytes", ss.read_bytes);
        STAT("ssd_writes", ss.writes);
        STAT("ssd_write_bytes", ss.write_bytes);
        STAT("ssd_syncs", ss.syncs);
        STAT("ssd_evicted_buckets", ss.evicted_buckets);
        STAT("ssd_evicted_objects", ss.evicted_objects);
        STAT("ssd_checksum_errors", ss.checksum_errors);
        STAT("ssd_direct_reads", ss.direct_reads);
        STAT("ssd_io_errors", ss.io_errors);
        STAT("ssd_no_space", ss.no_space);
        STAT("ssd_write_failed", ss.write_failed);
        STAT("ssd_offload_queue", ss.queue_objects);
        STAT("ssd_offload_queue_bytes", ss.queue_bytes);
        STAT("ssd_offload_dropped", ss.offload_dropped);
        STAT("ssd_rate_limited", ss.rate_limited);
        STAT("ssd_live_bytes", ss.live_bytes);
        STAT("ssd_utilization_pct", ss.capacity != 0 ? ss.live_bytes * 100 / ss.capacity : 0);
        STAT("ssd_compacted_buckets", ss.compacted_buckets);
        STAT("ssd_compacted_bytes", ss.compacted_bytes);
        STAT("ssd_load_queue", ss.load_queue);
        STAT("ssd_degraded", ss.degraded);
        STAT("ssd_index_map_size", ss.index_map_size);
        STAT("ssd_start_objects", ss.start_objects);
        STAT("ssd_start_ms", ss.start_ms);
        STAT("ssd_state", ss.state);
        STAT("ssd_rebuilds", ss.rebuilds);
        STAT("ssd_rebuild_buckets", ss.rebuild_buckets);
        STAT("ssd_rebuild_buckets_done", ss.rebuild_buckets_done);
        STAT("ssd_rebuild_records", ss.rebuild_records);
        STAT("ssd_rebuild_ms", ss.rebuild_ms);
        STAT("ssd_set_aside", ss.set_aside);
        STAT("ssd_rebuild_summary_buckets", ss.rebuild_summary_buckets);
        STAT("ssd_rebuild_scanned_buckets", ss.rebuild_scanned_buckets);
        STAT("ssd_scrub_buckets", ss.scrub_buckets);
        STAT("ssd_scrub_buckets_done", ss.scrub_buckets_done);
        STAT("ssd_scrub_bad", ss.scrub_bad);
        STAT("ssd_scrub_bytes", ss.scrub_bytes);
        STAT("ssd_scrub_ms", ss.scrub_ms);
    }
#undef STAT
    return n;
}
