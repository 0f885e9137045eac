#!/usr/bin/env bash
# rebuild.sh: restart after an index rebuild. A fresh kvstashd (write_through, so every
# object gets a bucket record) takes BENCH_REBUILD_OBJECTS objects of BENCH_REBUILD_SIZE
# bytes (default 1,000,000 x 4 KiB: 8 KiB on disk each with its header block, 8 GiB of
# bucket files; 4 KiB keeps the index cost per byte realistic), is stopped cleanly and
# restarted (the clean restart: a start that follows the same binary's clean stop, the
# clean-shutdown marker checked against data.mdb, the index loaded), then stopped again;
# the index's first two pages are zeroed (a disk fault or a bad
# restore), the page cache is dropped (when root) and the daemon is restarted. It reports
# the time from exec to the first answered ping, to ssd_state 2 (the rebuilt tier ready),
# the daemon's own ssd_rebuild_ms, the records verified, and the p50/p99 of batch_get
# probes of DRAM objects (8 x 4 KiB, 1 connection) that run from the first ping until the
# rebuild ends: DRAM serves throughout. Target: ready in under 10 s for 1M objects.
# It says how many bucket files the rebuild took from their summaries (bucket-<id>.kvh,
# written when a bucket is sealed: the values are not read) and how many it read whole,
# and, in the first round (or every round with BENCH_REBUILD_SCRUB=all; none with 0), waits
# for the scrub that then reads the summarized buckets at ssd_scrub_rate (default 64m) and
# reports its time and the values it found bad (the daemon's ssd_scrub_ms, ssd_scrub_bad).
# Every wait is bounded (the fill 900 s, the rebuild 300 s). BENCH_REBUILD_RUNS rounds of
# (clean restart, damaged restart) run on the one fill, and the medians are printed.
#
# Environment: KVSTASHD, BENCH, KVSTASH_CLI (binaries; set by make bench),
# BENCH_REBUILD_OBJECTS (1000000; a multiple of 1000), BENCH_REBUILD_SIZE (4096),
# BENCH_REBUILD_RUNS (1), BENCH_REBUILD_SCRUB (1: wait for the scrub in the first round; all;
# 0), BENCH_REBUILD_SCRUB_RATE (the daemon's ssd_scrub_rate; default its own), BENCH_REBUILD_DIR (a directory on the disk to measure; default a
# temporary one in /var/tmp), BENCH_REBUILD_KEEP (a directory: the filled data directory is
# kept there and reused by the next run with the same objects and size, so the fill, minutes
# at 1M, is paid once; remove it when done).
set -u -o pipefail

here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=lib.sh
. "$here/lib.sh"       # die, show, field, free_port, answers_ping, bench_exit_trap, kvd_kill
bench_paths "$here"    # root, KVSTASHD, BENCH, KVSTASH_CLI
N=${BENCH_REBUILD_OBJECTS:-1000000}
SIZE=${BENCH_REBUILD_SIZE:-4096}
RUNS=${BENCH_REBUILD_RUNS:-1}
KEEP=${BENCH_REBUILD_KEEP:-}
SCRUB=${BENCH_REBUILD_SCRUB:-1}
SCRUB_RATE=${BENCH_REBUILD_SCRUB_RATE:-}

[ -x "$KVSTASHD" ] || die "no daemon at $KVSTASHD (run make first)"
[ $((N % 1000)) -eq 0 ] && [ "$N" -ge 1000 ] || die "BENCH_REBUILD_OBJECTS=$N: a multiple of 1000"
isnum "$RUNS" && [ "$RUNS" -ge 1 ] || die "BENCH_REBUILD_RUNS=$RUNS: a whole number, 1 or more"
work=$(mktemp -d "${BENCH_REBUILD_DIR:-/var/tmp}/kvstash-rebuild-XXXXXX") || die "mktemp failed"
kvd_pid=""
bench_exit_trap "$work"
data="$work/data"
if [ -n "$KEEP" ]; then
    mkdir -p "$KEEP" || die "cannot create BENCH_REBUILD_KEEP=$KEEP"
    data=$(cd "$KEEP" && pwd)/data
fi
filled_mark="${KEEP:-$work}/filled-$N-$SIZE"

now_ms() { echo $(( $(date +%s%N) / 1000000 )); }

# stat_of NAME: one value of the daemon's stats.
stat_of() {
    "$KVSTASH_CLI" -H "127.0.0.1:$port" -t 5000 stats --json 2>/dev/null \
        | tr ',{}' '\n\n\n' | awk -F: -v k="\"$1\"" '$1 ~ k { gsub(/[ "]/, "", $2); print $2 }' \
        | head -1
}

ssd_bytes=$(( N * (SIZE + 8192) * 11 / 10 + (1 << 30) ))
start() {
    port=$(free_port) || die "no free port"
    "$KVSTASHD" --listen="127.0.0.1:$port" --unix_socket= --data_dir="$data" \
        --metrics_listen= --memory_size=1g --ssd_size="$ssd_bytes" \
        --ssd_offload=write_through --log_level=info \
        ${SCRUB_RATE:+--ssd_scrub_rate="$SCRUB_RATE"} >>"$work/kvstashd.log" 2>&1 &
    kvd_pid=$!
}

echo "== restart after an index rebuild: $N objects of $SIZE B on the SSD tier (write_through)"
if [ -n "$KEEP" ] && [ -e "$filled_mark" ]; then
    echo "   reusing the filled data directory $data (BENCH_REBUILD_KEEP)"
else
    rm -rf "$data"
    mkdir -p "$data"
    start
    answers_ping "$KVSTASH_CLI" "$port" "$kvd_pid" 200 0.05 || die "kvstashd did not start"
    conns=4
    per=$(( N / conns / 250 ))
    show "$BENCH" -H "127.0.0.1:$port" -m put -s "$SIZE" -b 250 -c "$conns" -d 4 -n "$per" -i rb -q
    t0=$(now_ms)
    "$BENCH" -H "127.0.0.1:$port" -m put -s "$SIZE" -b 250 -c "$conns" -d 4 -n "$per" -i rb \
        -t 900 -q || die "the fill failed"
    for _ in $(seq 1 900); do
        o=$(stat_of ssd_objects)
        [ "${o:-0}" -ge "$N" ] && break
        sleep 1
    done
    echo "   filled: ${o:-?} objects on the SSD in $(( ($(now_ms) - t0) / 1000 )) s;" \
         "bucket files $(du -sh "$data/ssd" | cut -f1)"
    [ "${o:-0}" -ge "$N" ] || die "only ${o:-0} of $N objects reached the SSD"
    kvd_kill
    [ -n "$KEEP" ] && touch "$filled_mark"
fi

# RUNS rounds: the clean restart, for comparison (the index checked unless the last stop
# left a matching clean-shutdown marker, then loaded), then
# the index damaged, the page cache dropped, a restart, DRAM probed while it rebuilds
drop_cache() {
    sync
    if [ -w /proc/sys/vm/drop_caches ]; then
        echo 3 >/proc/sys/vm/drop_caches
        cache="page cache dropped"
    else
        cache="page cache NOT dropped (not root)"
    fi
}
clean_ms=() ready_ms=() rebuild_ms=() scrub_ms=()
for run in $(seq 1 "$RUNS"); do
    # one start and clean stop first, so the measured start follows this binary's own
    # clean shutdown (a clean-shutdown marker spares it the full index check)
    start
    answers_ping "$KVSTASH_CLI" "$port" "$kvd_pid" 600 0.05 || die "kvstashd did not restart"
    for _ in $(seq 1 3000); do [ "$(stat_of ssd_state)" = 2 ] && break; sleep 0.05; done
    kvd_kill
    drop_cache
    t0=$(now_ms)
    start
    answers_ping "$KVSTASH_CLI" "$port" "$kvd_pid" 600 0.05 || die "kvstashd did not restart"
    for _ in $(seq 1 3000); do [ "$(stat_of ssd_state)" = 2 ] && break; sleep 0.05; done
    t=$(( $(now_ms) - t0 ))
    clean_ms+=("$t")
    echo "   [$run] clean restart ($cache): ready (ssd_state 2) $t ms after exec;" \
         "ssd_start_ms $(stat_of ssd_start_ms), ssd_start_objects $(stat_of ssd_start_objects)"
    kvd_kill

    dd if=/dev/zero of="$data/ssd/index/data.mdb" bs=4096 count=2 conv=notrunc status=none
    drop_cache
    t0=$(now_ms)
    start
    answers_ping "$KVSTASH_CLI" "$port" "$kvd_pid" 600 0.01 || die "kvstashd did not restart"
    t_ping=$(( $(now_ms) - t0 ))
    # DRAM probes in 1-second slices (the first one stores its 1,000 keys) until it is ready
    probes=0
    : >"$work/probe.out"
    for n in $(seq 1 300); do
        if [ "$n" = 1 ]; then pre=(); else pre=(-N); fi
        "$BENCH" -H "127.0.0.1:$port" -m get -s 4096 -b 8 -c 1 -d 1 -k 1000 -i pr "${pre[@]}" \
            -t 1 -q >>"$work/probe.out" 2>&1 || echo "probe failed" >>"$work/probe.out"
        probes=$n
        state=$(stat_of ssd_state)
        [ "$state" = 2 ] && break
    done
    t_ready=$(( $(now_ms) - t0 ))
    rb=$(stat_of ssd_rebuild_ms)
    ready_ms+=("$t_ready")
    rebuild_ms+=("${rb:-0}")
    echo "   [$run] damaged index ($cache): ping answered $t_ping ms after exec; ready" \
         "(ssd_state ${state:-?}) $t_ready ms after exec (probe slices of 1 s: at most 1 s" \
         "late); ssd_rebuild_ms $rb, ssd_rebuild_records $(stat_of ssd_rebuild_records)," \
         "ssd_objects $(stat_of ssd_objects)"
    nsum=$(stat_of ssd_rebuild_summary_buckets)
    nscan=$(stat_of ssd_rebuild_scanned_buckets)
    if [ -n "$nsum" ]; then
        echo "   [$run] summaries used: ${nsum} bucket file(s) from their summaries (values not" \
             "read), ${nscan:-?} read whole"
    else
        echo "   [$run] summaries used: no (this kvstashd has no bucket summaries)"
    fi
    grep -o "index of .* rebuilt in .*" "$work/kvstashd.log" | tail -1 | sed 's/^/   log: /'
    p99s=$(grep -o 'p99_us=[0-9]*' "$work/probe.out" | cut -d= -f2 | sort -n | tr '\n' ' ')
    p50s=$(grep -o 'p50_us=[0-9]*' "$work/probe.out" | cut -d= -f2 | sort -n | tr '\n' ' ')
    echo "   DRAM probes during the rebuild ($probes 1-s slices of batch_get 8 x 4 KiB, 1 conn):" \
         "p50 us $p50s; p99 us $p99s; misses+errors" \
         "$(grep -o 'misses=[0-9]* errors=[0-9]*' "$work/probe.out" | tr '\n' ' ')"
    grep -q "probe failed" "$work/probe.out" && echo "   WARNING: a probe run failed"
    if [ -n "$nsum" ] && [ "${nsum:-0}" -gt 0 ] && { [ "$SCRUB" = all ] \
            || { [ "$SCRUB" = 1 ] && [ "$run" = 1 ]; }; }; then
        # the scrub reads the summarized buckets in the background: bounded wait (20 min)
        for _ in $(seq 1 1200); do
            [ "$(stat_of ssd_scrub_buckets_done)" = "$(stat_of ssd_scrub_buckets)" ] && break
            sleep 1
        done
        sm=$(stat_of ssd_scrub_ms)
        scrub_ms+=("${sm:-0}")
        echo "   [$run] scrub: $(stat_of ssd_scrub_buckets_done) of $(stat_of ssd_scrub_buckets)" \
             "buckets, $(stat_of ssd_scrub_bytes) bytes read in ${sm:-?} ms;" \
             "ssd_scrub_bad $(stat_of ssd_scrub_bad)"
        grep -o "scrub of .* done in .*" "$work/kvstashd.log" | tail -1 | sed 's/^/   log: /'
    fi
    kvd_kill
done
echo "   medians of $RUNS: clean restart $(median "${clean_ms[@]}") ms; after the damage: ready" \
     "$(median "${ready_ms[@]}") ms after exec, ssd_rebuild_ms $(median "${rebuild_ms[@]}")"
[ "${#scrub_ms[@]}" -gt 0 ] && echo "   scrub after the rebuild: $(median "${scrub_ms[@]}") ms" \
    "(median of ${#scrub_ms[@]})"
exit 0
