#!/usr/bin/env bash
# run.sh: the `make bench` driver.
#
# Starts kvstashd on a free loopback port with a temporary data_dir and a
# memory_size that fits the machine, runs the benchmark matrix with
# kvstash-bench (each configuration BENCH_REPS times, BENCH_SECS seconds
# each, the median printed), each run of a get or put row followed by one of the loopback
# TCP ceiling, raw-bench (tests/bench/raw_bench.c), in the same shape with no store behind
# it, so that a row and its ceiling are measured in the same minutes of this shared
# machine. Then the shared-memory section: single-thread memcpy of 1 MiB
# blocks from cold memory, and batch_get_into / batch_put_from of 1 MiB objects over the
# Unix socket, with their ratios to that memcpy and to the same run's TCP rows (get-1m-*,
# put-1m-*). Then the engines: the SGLang HiCache backend (tests/bench/bench_sglang.py) and
# the LMCache L2 adapter (tests/bench/bench_lmcache.py) against the raw client's
# batch_put_from / batch_get_into over the same Unix socket, zero copy and through the
# staging copy. Then the peers: redis-server with
# redis-benchmark on the same shapes when it is installed, and memcached with mc-bench (our
# own text-protocol load generator, tests/bench/mc_bench.c) when memcached is installed; a
# peer that is missing or fails is reported and skipped. A summary puts each row next to
# its raw TCP ceiling and the peers. Every command is printed before it runs; every loop and
# every command is bounded.
# Then batch_is_exist probes on one connection under get and put loads on eight.
# Then the Redis-protocol section (tests/bench/resp.sh): redis-benchmark against kvstashd's
# RESP2 port and redis-server in the same run, GET and SET of 4 KiB, 64 KiB, 1 MiB.
# Then the trace replay (tests/bench/trace.sh): Mooncake's synthetic trace, hit rates per
# eviction policy next to exact LRU and the trace's maximum, DRAM alone and with the SSD tier.
# Last, the SSD section (tests/bench/ssd.sh): fio and kvstashd's SSD tier on one
# directory of the same disk, sequential 1 MiB writes and reads, DRAM probes under SSD
# reads, and restarts with a million objects on the SSD; then the full-tier rows
# (tests/bench/ssd_full.sh): 1 MiB puts into a DRAM tier where every put evicts, SSD tier
# on and off, against fio on the same directory. Then the first fill
# (tests/bench/fill.sh: puts into a fresh 4 GiB tier against the steady rate) and the restart
# after an index rebuild (tests/bench/rebuild.sh: 1M objects of 4 KiB, the index zeroed).
# Exits non-zero only if kvstashd dies or a kvstash-bench or raw-bench run fails.
#
# Environment: KVSTASHD, BENCH, MCBENCH, RAWBENCH (binaries; set by make bench),
# KVSTASH_CLI (default: kvstash next to BENCH), BENCH_SECS (5), BENCH_REPS (3),
# BENCH_MEMORY (default: a third of available RAM, 1g..8g), BENCH_PEERS
# (1; 0 skips redis/memcached), BENCH_MATRIX (1; 0 skips the TCP matrix, its raw TCP
# ceiling and the probes under load), BENCH_SHM (1; 0 skips the shared-memory section),
# BENCH_ENGINES (1; 0 skips the engines section), BENCH_ENGINE_SECS (30: the time bound of
# each engine script: rounds until then, medians), PYTHON (/usr/bin/python3, with python3-msgpack and python3-numpy),
# BENCH_SSD (1; 0 skips the SSD section; its other settings are in ssd.sh),
# BENCH_SSD_FULL (1; 0 skips the full-tier rows; their settings are in ssd_full.sh),
# BENCH_RESP (1; 0 skips the Redis-protocol section; its settings are in resp.sh),
# BENCH_TRACE (1; 0 skips the trace replay; its settings are in trace.sh),
# BENCH_CLUSTER (1; 0 skips the pool's section; its settings are in cluster.sh),
# BENCH_FILL (1; 0 skips the first-fill section; fill.sh), BENCH_REBUILD (1; 0 skips the
# rebuild section; rebuild.sh),
# BENCH_DAEMON_ARGS (more kvstashd flags for the matrix's daemon, e.g. --io_threads=8; the
# SSD section has its own, BENCH_SSD_DAEMON_ARGS), BENCH_COPY (0; 1 makes kvstash-bench,
# raw-bench and mc-bench send put values by copying, -C, instead of by reference).
set -u -o pipefail

here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
KVSTASHD=${KVSTASHD:-$root/build/release/kvstashd}
BENCH=${BENCH:-$root/build/release/kvstash-bench}
KVSTASH_CLI=${KVSTASH_CLI:-$(dirname "$BENCH")/kvstash}
MCBENCH=${MCBENCH:-$(dirname "$BENCH")/mc-bench}
RAWBENCH=${RAWBENCH:-$(dirname "$BENCH")/raw-bench}
SECS=${BENCH_SECS:-5}
REPS=${BENCH_REPS:-3}
PEERS=${BENCH_PEERS:-1}
copy_flag=()
[ "${BENCH_COPY:-0}" = 1 ] && copy_flag=(-C)

# shellcheck source=lib.sh
. "$here/lib.sh"       # die, show, field, free_port, proc_cpu

[ -x "$KVSTASHD" ] || die "no daemon at $KVSTASHD (run make first)"
[ -x "$BENCH" ] || die "no kvstash-bench at $BENCH (run make first)"
case "$SECS" in ''|*[!0-9]*) die "BENCH_SECS must be whole seconds" ;; esac
case "$REPS" in ''|*[!0-9]*) die "BENCH_REPS must be a number" ;; esac
if [ "$SECS" -lt 1 ] || [ "$REPS" -lt 1 ]; then
    die "BENCH_SECS and BENCH_REPS must be >= 1"
fi

if [ -n "${BENCH_MEMORY:-}" ]; then
    mem=$BENCH_MEMORY
else
    avail_kb=$(awk '/^MemAvailable:/ { print $2 }' /proc/meminfo 2>/dev/null)
    gib=$(( ${avail_kb:-3145728} / 1048576 / 3 ))
    [ "$gib" -lt 1 ] && gib=1
    [ "$gib" -gt 8 ] && gib=8
    mem=${gib}g
fi
case "$mem" in
    *g|*G) mem_bytes=$(( ${mem%[gG]} * 1073741824 )) ;;
    *m|*M) mem_bytes=$(( ${mem%[mM]} * 1048576 )) ;;
    *) die "BENCH_MEMORY: use a size like 8g or 2048m" ;;
esac

tmp=$(mktemp -d /tmp/kvstash-bench.XXXXXX) || die "mktemp failed"
kvd_pid=""
redis_pid=""
mc_pid=""
raw_pid=""
load_pid=""
# shellcheck disable=SC2317  # invoked by the EXIT trap
cleanup() {
    local pid
    for pid in "$kvd_pid" "$redis_pid" "$mc_pid" "$raw_pid" "$load_pid"; do
        if [ -n "$pid" ] && kill "$pid" 2>/dev/null; then
            wait "$pid" 2>/dev/null
        fi
    done
    rm -rf "$tmp"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

kvd_alive() {
    kill -0 "$kvd_pid" 2>/dev/null
}

kvd_died() {
    echo "run.sh: kvstashd (pid $kvd_pid) died; last lines of its log:" >&2
    tail -n 20 "$tmp/kvstashd.log" >&2
    kvd_pid=""
    exit 1
}

# ---- start kvstashd ----
# DRAM only (--ssd_dir=): the put rows stay within memory_size, and the put load under
# probe-under-put runs into DRAM eviction, which then drops values instead of writing them
# to disk; the SSD section measures the tier with its own daemon.
read -r -a extra_args <<<"${BENCH_DAEMON_ARGS:-}"
port=""
for attempt in 1 2 3 4 5; do
    port=$(free_port) || die "no free loopback port found"
    mkdir -p "$tmp/data"
    cmd=("$KVSTASHD" --listen="127.0.0.1:$port" --data_dir="$tmp/data"
         --unix_socket="$tmp/data/kvstashd.sock" --memory_size="$mem" --ssd_dir= --metrics_listen=
         "${extra_args[@]}")
    show "${cmd[@]}"
    "${cmd[@]}" >"$tmp/kvstashd.log" 2>&1 &
    kvd_pid=$!
    up=0
    for _ in $(seq 1 100); do
        kvd_alive || break
        if [ -x "$KVSTASH_CLI" ]; then
            "$KVSTASH_CLI" -H "127.0.0.1:$port" -t 1000 ping >/dev/null 2>&1 && { up=1; break; }
        elif (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then
            up=1
            break
        fi
        sleep 0.1
    done
    [ "$up" = 1 ] && break
    if kvd_alive; then
        kill "$kvd_pid"
        wait "$kvd_pid" 2>/dev/null
        kvd_pid=""
        die "kvstashd did not answer on 127.0.0.1:$port within 10 s"
    fi
    echo "run.sh: kvstashd exited at start (attempt $attempt):" >&2
    tail -n 5 "$tmp/kvstashd.log" >&2
    kvd_pid=""
done
[ -n "$kvd_pid" ] || die "could not start kvstashd"
addr="127.0.0.1:$port"

# Wait (bounded) until the arena's pages are populated, so puts measure the store, not the
# first-touch page faults of a fresh mapping.
if [ -x "$KVSTASH_CLI" ]; then
    for _ in $(seq 1 600); do
        pre=$("$KVSTASH_CLI" -H "$addr" -t 1000 stats --raw 2>/dev/null | awk '$1 == "memory_prefaulted" { print $2 }')
        cap=$("$KVSTASH_CLI" -H "$addr" -t 1000 stats --raw 2>/dev/null | awk '$1 == "memory_capacity" { print $2 }')
        [ -n "$pre" ] && [ "$pre" = "$cap" ] && break
        sleep 0.5
    done
    echo "arena populated: ${pre:-?} of ${cap:-?} bytes"
    loops=$("$KVSTASH_CLI" -H "$addr" -t 1000 stats --raw 2>/dev/null | awk '$1 == "io_threads" { print $2 }')
fi
echo "kvstashd pid $kvd_pid on $addr, memory_size $mem, ${loops:-?} event loops; $(nproc) cores;" \
     "$REPS runs of ${SECS}s per configuration, median shown"
if [ "${#copy_flag[@]}" -gt 0 ]; then
    echo "put values sent by copying (BENCH_COPY=1: -C)"
else
    echo "put values sent by reference from a sealed memfd (sendfile); BENCH_COPY=1 copies them"
fi
echo

# ---- the matrix ----
# name mode size batch conns depth; the redis shape is derived from it.
matrix=(
    "get-1m-c1      get    1m  8   1 2"
    "get-1m-c8      get    1m  8   8 2"
    "put-1m-c1      put    1m  8   1 2"
    "put-1m-c8      put    1m  8   8 2"
    "get-64k-c8     get    64k 64  8 2"
    "put-64k-c8     put    64k 64  8 2"
    "exists-128-c4  exists 64  128 4 4"
    "get-4m-c8      get    4m  4   8 2"
    "put-4m-c8      put    4m  4   8 2"
)

size_bytes() {
    case "$1" in
        *k) echo $(( ${1%k} * 1024 )) ;;
        *m) echo $(( ${1%m} * 1048576 )) ;;
        *) echo "$1" ;;
    esac
}

# put_bound CONNS BATCH SIZE: requests per connection of a put row, so that a run writes
# three quarters of memory_size and never needs eviction. kvstashd's, memcached's and raw
# TCP's put rows all stop there, so they move the same bytes in about the same time.
put_bound() {
    local per=$(( mem_bytes * 3 / 4 / ($1 * $2 * $(size_bytes "$3")) ))
    [ "$per" -lt 1 ] && per=1
    echo "$per"
}

# median_line METRIC LINES...: the line whose METRIC is the median.
median_line() {
    local metric=$1
    shift
    printf '%s\n' "$@" | awk -v k="$metric" '{
        for (i = 1; i <= NF; i++) { split($i, kv, "="); if (kv[1] == k) print kv[2] "\t" $0 }
    }' | sort -g | awk -F'\t' '{ l[NR] = $2 } END { if (NR) print l[int((NR + 1) / 2)] }'
}

failures=0
declare -A gbs         # name -> median GB/s of a row that moved bytes (for ratios)
declare -A row_summary # name -> "value METRIC, p99, core-s/GB" of a row kept by keep_median

# keep_median NAME LABEL METRIC LINE...: print "LABEL: " and the median (by METRIC, GB/s or
# keys/s) of the result LINEs, and keep it in row_summary[NAME] (and gbs[NAME] for GB/s);
# "failed" when no run gave a line.
keep_median() {
    local name=$1 label=$2 metric=$3 med
    shift 3
    if [ "$#" -eq 0 ]; then
        row_summary[$name]="failed"
        return
    fi
    med=$(median_line "$metric" "$@")
    echo "   $label: $med"
    [ "$metric" = GB/s ] && gbs[$name]=$(field GB/s "$med")
    row_summary[$name]="$(field "$metric" "$med") $metric, p99 $(field p99_us "$med") us"
    [ -n "$(field daemon_core_s_per_GB "$med")" ] &&
        row_summary[$name]+=", $(field daemon_core_s_per_GB "$med") core-s/GB"
}

# bench_once LABEL METRIC BIN ARGS...: one run of BIN ARGS (bounded), printed as "LABEL:
# value METRIC, p99"; 0 and its result line in $once, or 1 (printed and counted as a
# failure). Stops the script if kvstashd died meanwhile.
once=""
bench_once() {
    local label=$1 metric=$2 bin=$3 rc
    shift 3
    once=$(timeout $(( SECS * 4 + 120 )) "$bin" "$@" 2>"$tmp/bench.err")
    rc=$?
    kvd_alive || { cat "$tmp/bench.err" >&2; kvd_died; }
    if [ "$rc" -ne 0 ] || [ -z "$once" ]; then
        echo "   $label FAILED (exit $rc): $(tr '\n' ' ' <"$tmp/bench.err") $once"
        failures=$(( failures + 1 ))
        return 1
    fi
    echo "   $label: $(field "$metric" "$once") $metric, p99 $(field p99_us "$once") us"
}

# ---- raw TCP ceiling ----
# What loopback TCP carries with no store behind it, in the matrix's own shapes: raw-bench
# (tests/bench/raw_bench.c) answers each request of batch x size bytes from a 1 GiB working
# set walked in order (memory not in cache, like kvstashd's arena), one blocking thread per
# connection, and receives puts the same way; put rows stop at kvstashd's byte count
# (put_bound). Its runs alternate with kvstashd's in the matrix, and each kvstashd row is
# then shown as a fraction of it. The server's lifetime is bounded by its -t; it is killed
# when the matrix ends.
rawport=""
if [ "${BENCH_MATRIX:-1}" = 0 ]; then
    echo "== the TCP matrix, its raw TCP ceiling and the probes: skipped (BENCH_MATRIX=0)"
    echo
    matrix=()
elif [ ! -x "$RAWBENCH" ]; then
    echo "== raw TCP: skipped: no raw-bench at $RAWBENCH (make bench builds it)"
    echo
else
    rawport=$(free_port) || die "no free port for raw-bench"
    life=$(( ${#matrix[@]} * REPS * (SECS * 8 + 240) ))
    [ "$life" -gt 3600 ] && life=3600
    rcmd=("$RAWBENCH" -L "$rawport" -w 1g -t "$life")
    show "${rcmd[@]}"
    "${rcmd[@]}" 2>"$tmp/raw.log" &
    raw_pid=$!
    for _ in $(seq 1 100); do
        grep -q serving "$tmp/raw.log" 2>/dev/null && break
        kill -0 "$raw_pid" 2>/dev/null || break
        sleep 0.1
    done
    if ! grep -q serving "$tmp/raw.log" 2>/dev/null; then
        echo "run.sh: the raw-bench server did not start: $(tr '\n' ' ' <"$tmp/raw.log")" >&2
        failures=$(( failures + 1 ))
        rawport=""
    fi
    echo
fi

for row in "${matrix[@]}"; do
    read -r name mode size batch conns depth <<<"$row"
    metric="GB/s"
    [ "$mode" = exists ] && metric="keys/s"
    args=(-H "$addr" -m "$mode" -s "$size" -b "$batch" -c "$conns" -d "$depth" -t "$SECS"
          -p "$kvd_pid" -R -q)
    if [ "$mode" = put ]; then
        args+=(-n "$(put_bound "$conns" "$batch" "$size")" "${copy_flag[@]}")
    fi
    rargs=()
    if [ -n "$rawport" ] && [ "$mode" != exists ]; then
        rargs=(-H "127.0.0.1:$rawport" -m "$mode" -s "$size" -b "$batch" -c "$conns"
               -d "$depth" -t "$SECS" -p "$raw_pid" -q)
        [ "$mode" = put ] && rargs+=(-n "$(put_bound "$conns" "$batch" "$size")" "${copy_flag[@]}")
    fi
    echo "== $name: batch_${mode/exists/is_exist} of $batch x $size, $conns conn(s), depth $depth"
    show "$BENCH" "${args[@]}"
    [ "${#rargs[@]}" -gt 0 ] && show "$RAWBENCH" "${rargs[@]}"
    lines=()
    rlines=()
    for rep in $(seq 1 "$REPS"); do
        bench_once "run $rep" "$metric" "$BENCH" "${args[@]}" && lines+=("$once")
        [ "${#rargs[@]}" -eq 0 ] && continue
        bench_once "raw TCP run $rep" GB/s "$RAWBENCH" "${rargs[@]}" && rlines+=("$once")
    done
    keep_median "$name" median "$metric" "${lines[@]}"
    [ "${#rargs[@]}" -gt 0 ] && keep_median "raw-$name" "raw TCP median" GB/s "${rlines[@]}"
    echo
done
if [ -n "$raw_pid" ]; then
    kill "$raw_pid" 2>/dev/null
    wait "$raw_pid" 2>/dev/null
    raw_pid=""
fi

# ---- probes under bulk load ----
# batch_is_exist of 128 keys on one connection, one request at a time, while 8 other
# connections move 8 x 1 MiB batches (get-1m-c8's and put-1m-c8's shapes; the put load
# runs on into eviction, as a full cache's does): how long an engine's prefix check waits
# while the store is busy. Each run starts on an emptied store with the probe's keys
# (and a get load's keys) stored; the probe starts a second into the load and ends
# before it does. The median by p99 is kept.
probe_rows=("probe-under-get get" "probe-under-put put")
[ "${BENCH_MATRIX:-1}" = 0 ] && probe_rows=()
for row in "${probe_rows[@]}"; do
    read -r name mode <<<"$row"
    pargs=(-H "$addr" -m exists -b 128 -c 1 -d 1 -t "$SECS" -N -i kvprobe -k 4096 -q)
    largs=(-H "$addr" -m "$mode" -s 1m -b 8 -c 8 -d 2 -t $(( SECS + 2 )) -q)
    [ "$mode" = get ] && largs+=(-N -i kvload -k 128)
    echo "== $name: batch_is_exist of 128 keys, 1 conn, depth 1, under batch_$mode of 8 x 1m on 8 conns"
    show "$BENCH" "${largs[@]}" "&"
    show "$BENCH" "${pargs[@]}"
    lines=()
    for rep in $(seq 1 "$REPS"); do
        timeout 60 "$BENCH" -H "$addr" -m exists -b 128 -c 1 -d 1 -t 1 -i kvprobe -k 4096 -R \
            -q >/dev/null 2>"$tmp/bench.err" &&
            { [ "$mode" != get ] || timeout 120 "$BENCH" -H "$addr" -m get -s 1m -b 8 -c 8 \
                  -d 2 -t 1 -i kvload -k 128 -q >/dev/null 2>"$tmp/bench.err"; } ||
            { echo "   run $rep: preload FAILED: $(tr '\n' ' ' <"$tmp/bench.err")"
              failures=$(( failures + 1 )); kvd_alive || kvd_died; continue; }
        timeout $(( SECS * 4 + 120 )) "$BENCH" "${largs[@]}" >"$tmp/load.out" 2>&1 &
        load_pid=$!
        sleep 1
        bench_once "run $rep" keys/s "$BENCH" "${pargs[@]}" && lines+=("$once") &&
            echo "      p50 $(field p50_us "$once") us"
        wait "$load_pid" || { echo "   load FAILED: $(tr '\n' ' ' <"$tmp/load.out")"
                              failures=$(( failures + 1 )); }
        echo "      load: $(field GB/s "$(cat "$tmp/load.out")") GB/s"
    done
    if [ "${#lines[@]}" -gt 0 ]; then
        med=$(median_line p99_us "${lines[@]}")
        row_summary[$name]="p50 $(field p50_us "$med") us, p99 $(field p99_us "$med") us"
        echo "   median: ${row_summary[$name]} ($(field keys/s "$med") keys/s)"
    else
        row_summary[$name]="failed"
    fi
    echo
done

# ---- shared memory ----
# batch_get_into / batch_put_from of 8 x 1 MiB over the Unix socket (one registered buffer
# of batch x depth x 1 MiB per connection), next to single-thread memcpy of 1 MiB blocks
# from a 2 GiB source populated first (kvstash-bench -m memcpy, no daemon involved), and to
# this run's TCP rows. Issue targets: >= 50% of that memcpy and >= 3x the TCP row's GB/s.
sock="$tmp/data/kvstashd.sock"

# bench_row NAME BIN ARGS...: run BIN ARGS (kvstash-bench) REPS times, print each run,
# keep the median in gbs[NAME] and row_summary[NAME].
bench_row() {
    local name=$1 bin=$2 rep lines=()
    shift 2
    echo "== $name"
    show "$bin" "$@"
    for rep in $(seq 1 "$REPS"); do
        bench_once "run $rep" GB/s "$bin" "$@" && lines+=("$once")
    done
    keep_median "$name" median GB/s "${lines[@]}"
    echo
}

# ratio A B: A / B to two decimals, or "-" when either is missing or B is 0.
ratio() {
    awk -v a="${1:-}" -v b="${2:-}" 'BEGIN {
        if (a == "" || b == "" || b + 0 == 0) print "-"; else printf "%.2f", a / b }'
}

# verdict VALUE TARGET: "met" or "NOT met" (VALUE >= TARGET), "-" without a value.
verdict() {
    awk -v v="$1" -v t="$2" 'BEGIN {
        if (v == "-") print "-"; else if (v + 0 >= t + 0) print "met"; else print "NOT met" }'
}

shm_table=()
if [ "${BENCH_SHM:-1}" = 0 ]; then
    echo "== shared memory: skipped (BENCH_SHM=0)"
    echo
elif [ ! -S "$sock" ]; then
    echo "== shared memory: skipped: no Unix socket at $sock"
    echo
else
    echo "== shared memory: batch_get_into / batch_put_from of 8 x 1 MiB over $sock," \
         "against single-thread memcpy"
    echo
    bench_row memcpy-1m "$BENCH" -m memcpy -s 1m -b 8 -c 1 -d 2 -t "$SECS" -q
    for conns in 1 8; do
        bench_row "get_into-1m-c$conns" "$BENCH" -S "$sock" -m get_into -s 1m -b 8 \
            -c "$conns" -d 2 -t "$SECS" -p "$kvd_pid" -R -q
    done
    for conns in 1 8; do
        bench_row "put_from-1m-c$conns" "$BENCH" -S "$sock" -m put_from -s 1m -b 8 \
            -c "$conns" -d 2 -t "$SECS" -p "$kvd_pid" -R -q -n "$(put_bound "$conns" 8 1m)"
    done
    shm_table+=("$(printf '%-17s %-44s %-14s %-16s %s' "shm test" "median" "vs memcpy" \
                "vs TCP row" "targets: >= 0.50 memcpy, >= 3.00x TCP")")
    for name in get_into-1m-c1 get_into-1m-c8 put_from-1m-c1 put_from-1m-c8; do
        case "$name" in
            get_into*) tcp="get-1m-${name##*-}" ;;
            *) tcp="put-1m-${name##*-}" ;;
        esac
        vm=$(ratio "${gbs[$name]:-}" "${gbs[memcpy-1m]:-}")
        vt=$(ratio "${gbs[$name]:-}" "${gbs[$tcp]:-}")
        shm_table+=("$(printf '%-17s %-44s %-14s %-16s %s' "$name" "${row_summary[$name]:-}" \
                    "$vm" "${vt}x $tcp" "$(verdict "$vm" 0.5), $(verdict "$vt" 3)")")
    done
    shm_table+=("memcpy-1m         ${row_summary[memcpy-1m]:-} (single thread, cold source)")
    printf '%s\n' "${shm_table[@]}"
    echo
fi

# ---- engines ----
# The engine adapters against the raw client, on this daemon's Unix socket, each script
# bounded by BENCH_ENGINE_SECS (rounds until then, the median of each row kept; it starts
# no round after that; timeout kills it at 4x + 120 s). bench_sglang.py: the SGLang HiCache backend's batch_set_v1 / batch_get_v1 of 128
# pages (K and V objects each, 1 MiB at 4 layers) from a host pool in a sealable memfd, in
# SGLang's own alloc_shm memfd (unsealable: the daemon guards it) and in anonymous memory
# (the staging copy), next to the raw client's batch_put_from / batch_get_into of the same
# pieces in a registered memfd and in anonymous memory. bench_lmcache.py: the LMCache L2
# adapter's store / load of 128 chunks of 512 KiB with its L1 arena in a memfd (no copy)
# and in private memory (the staging copy), next to the raw client. Issue target: a
# zero-copy adapter row within 10% of the raw row (vs raw >= 0.90); the staging rows are
# reported the same way, with no target.
PYTHON=${PYTHON:-/usr/bin/python3}
ENGINE_SECS=${BENCH_ENGINE_SECS:-30}
case "$ENGINE_SECS" in ''|*[!0-9]*) die "BENCH_ENGINE_SECS must be whole seconds" ;; esac

# engine_run NAME ARGS...: run PYTHON ARGS (bounded); its output in $tmp/NAME.out, printed.
# 1 (printed and counted as a failure) when it fails. Stops the script if kvstashd died.
engine_run() {
    local name=$1 rc
    shift
    show "$PYTHON" "$@"
    timeout $(( ENGINE_SECS * 4 + 120 )) "$PYTHON" "$@" >"$tmp/$name.out" 2>"$tmp/$name.err"
    rc=$?
    kvd_alive || { cat "$tmp/$name.err" >&2; kvd_died; }
    sed 's/^/   /' "$tmp/$name.out"
    if [ "$rc" -ne 0 ]; then
        echo "   $name FAILED (exit $rc): $(tail -n 5 "$tmp/$name.err" | tr '\n' ' ')"
        failures=$(( failures + 1 ))
        return 1
    fi
}

# engine_line ROW PUT PUTVS GET GETVS TARGET: one line of the engines table; TARGET
# "zero-copy" judges both ratios against 0.90, anything else is printed as it is.
engine_line() {
    local judged=$6
    if [ "$6" = zero-copy ]; then
        judged="$(verdict "$3" 0.9), $(verdict "$5" 0.9)"
    fi
    printf '%-58s %9s %7s %9s %7s  %s' "$1" "$2" "$3" "$4" "$5" "$judged"
}

engine_table=()
if [ "${BENCH_ENGINES:-1}" = 0 ]; then
    echo "== engines: skipped (BENCH_ENGINES=0)"
    echo
elif [ ! -S "$sock" ]; then
    echo "== engines: skipped: no Unix socket at $sock"
    echo
elif ! "$PYTHON" -c 'import msgpack, numpy' 2>/dev/null; then
    echo "== engines: skipped: $PYTHON lacks msgpack or numpy (python3-msgpack," \
         "python3-numpy)"
    echo
else
    echo "== engines: the SGLang HiCache backend and the LMCache L2 adapter against the raw" \
         "client over $sock, ${ENGINE_SECS}s each"
    echo
    engine_table+=("$(printf '%-58s %9s %7s %9s %7s  %s' "engine row" "put GB/s" "vs raw" \
                   "get GB/s" "vs raw" "target: zero copy >= 0.90 raw")")
    echo "== sglang"
    if engine_run sglang "$here/bench_sglang.py" --addr "unix:$sock" \
           --seconds "$ENGINE_SECS" --rounds 1000; then
        # rows: name... set vs get vs ok (the last five fields)
        while IFS=$'\t' read -r row p pv g gv ok; do
            case "$row" in
                raw\ zero-copy*) target="(the raw row)" ;;
                *"[zero-copy]"*) target=zero-copy ;;
                *) target="reported" ;;
            esac
            [ "$ok" = yes ] || target="NOT met: a transfer failed or bytes differed"
            engine_table+=("$(engine_line "sglang $row" "$p" "$pv" "$g" "$gv" "$target")")
        done < <(awk 'NF >= 6 && $NF ~ /^(yes|NO)$/ && $(NF-1) ~ /^[0-9.]+$/ {
                          row = $1; for (i = 2; i <= NF - 5; i++) row = row " " $i
                          sub(/^kvstash\.sglang, /, "adapter, ", row)
                          printf "%s\t%s\t%s\t%s\t%s\t%s\n", row, $(NF-4), $(NF-3),
                                 $(NF-2), $(NF-1), $NF }' "$tmp/sglang.out")
    else
        engine_table+=("$(printf '%-58s %s' "sglang" "failed")")
    fi
    echo
    echo "== lmcache"
    if engine_run lmcache "$here/bench_lmcache.py" --addr "unix:$sock" \
           --secs "$ENGINE_SECS" --max-reps 1000; then
        # rows: "<label> GB/s vs-raw", store rows then load rows, paired by path
        for path in "raw batch_put_from" "adapter submit_store_task, shm L1" \
                    "adapter submit_store_task, staging"; do
            case "$path" in
                raw*) lpath="raw batch_get_into"; name="lmcache raw (registered memfd)"
                      target="(the raw row)" ;;
                *shm*) lpath="adapter submit_load_task, shm L1"
                       name="lmcache adapter store / load, shm L1 [zero-copy]"
                       target=zero-copy ;;
                *) lpath="adapter submit_load_task, staging"
                   name="lmcache adapter store / load, private L1 [staging]"
                   target=reported ;;
            esac
            read -r p pv < <(grep -F "$path" "$tmp/lmcache.out" | awk '{ print $(NF-1), $NF }')
            read -r g gv < <(grep -F "$lpath" "$tmp/lmcache.out" | awk '{ print $(NF-1), $NF }')
            engine_table+=("$(engine_line "$name" "${p:--}" "${pv:--}" "${g:--}" "${gv:--}" \
                             "$target")")
        done
    else
        engine_table+=("$(printf '%-58s %s' "lmcache" "failed")")
    fi
    echo
    printf '%s\n' "${engine_table[@]}"
    echo
fi

# ---- peers ----
declare -A redis_summary

# redis_bench NAME METRIC SIZE PIPELINE CONNS ARGS...: run redis-benchmark ARGS (--csv)
# REPS times, print each run and keep the median.
redis_bench() {
    local name=$1 metric=$2 size=$3 pipe=$4 conns=$5
    shift 5
    local base=(redis-benchmark -h 127.0.0.1 -p "$rport" -c "$conns" -P "$pipe" --csv)
    local cal=$(( conns * pipe * 4 ))
    [ "$cal" -lt 200 ] && cal=200
    local out rps n rep lines=() cpu0 cpu1
    # calibrate the request count so a run lasts about SECS seconds
    out=$(timeout 120 "${base[@]}" -n "$cal" "$@" 2>/dev/null | tail -n 1)
    rps=$(echo "$out" | awk -F'"' '{ print int($4) }')
    if [ -z "$rps" ] || [ "$rps" -le 0 ]; then
        echo "   calibration failed: $out"
        return 1
    fi
    n=$(( rps * SECS ))
    [ "$n" -lt "$cal" ] && n=$cal
    [ "$n" -gt 50000000 ] && n=50000000
    show "${base[@]}" -n "$n" "$@"
    for rep in $(seq 1 "$REPS"); do
        cpu0=$(proc_cpu "$redis_pid")
        local t0 t1
        t0=$(date +%s%N)
        out=$(timeout $(( SECS * 4 + 60 )) "${base[@]}" -n "$n" "$@" 2>/dev/null | tail -n 1)
        t1=$(date +%s%N)
        cpu1=$(proc_cpu "$redis_pid")
        rps=$(echo "$out" | awk -F'"' '{ print $4 }')
        if [ -z "$rps" ]; then
            echo "   run $rep FAILED: $out"
            continue
        fi
        local line
        local p50 p99
        p50=$(echo "$out" | awk -F'"' '{ print $10 }')
        p99=$(echo "$out" | awk -F'"' '{ print $14 }')
        line=$(awk -v rps="$rps" -v size="$size" -v p50="$p50" -v p99="$p99" \
                   -v cpu=$(( cpu1 - cpu0 )) -v hz="$(getconf CLK_TCK)" \
                   -v secs="$(( (t1 - t0) / 1000000 ))" 'BEGIN {
            gbs = (size > 0 ? rps * size / 1e9 : 0);
            printf "GB/s=%.3f keys/s=%.0f p50_us=%.0f p99_us=%.0f",
                   gbs, rps, p50 * 1000, p99 * 1000;
            if (gbs > 0) printf " server_core_s_per_GB=%.3f", (cpu / hz) / (gbs * secs / 1000);
        }')
        echo "   run $rep: $(field "$metric" "$line") $metric, p99 $(field p99_us "$line") us"
        lines+=("$line")
    done
    [ "${#lines[@]}" -gt 0 ] || return 1
    local med
    med=$(median_line "$metric" "${lines[@]}")
    echo "   median: $med"
    if [ "$metric" = "keys/s" ]; then
        redis_summary[$name]="$(field keys/s "$med") keys/s, p99 $(field p99_us "$med") us"
    else
        redis_summary[$name]="$(field GB/s "$med") GB/s, p99 $(field p99_us "$med") us,"
        redis_summary[$name]+=" $(field server_core_s_per_GB "$med") core-s/GB"
    fi
}

# redis_preload N SIZE: keys key:000000000000 .. N-1 with SIZE-byte values.
redis_preload() {
    timeout 300 redis-cli -p "$rport" flushall >/dev/null || return 1
    perl -e 'my ($n, $s) = @ARGV; my $v = "x" x $s;
             for my $i (0 .. $n - 1) {
                 my $k = sprintf("key:%012d", $i);
                 print "*3\r\n\$3\r\nSET\r\n\$" . length($k) . "\r\n$k\r\n\$$s\r\n$v\r\n";
             }' "$1" "$2" | timeout 300 redis-cli -p "$rport" --pipe >/dev/null
}

# ---- memcached ----
declare -A mc_summary
mport=""

# mc_stop: stop the memcached this script started, if any.
mc_stop() {
    if [ -n "$mc_pid" ]; then
        kill "$mc_pid" 2>/dev/null
        wait "$mc_pid" 2>/dev/null
        mc_pid=""
    fi
}

# mc_start: a fresh memcached on a free loopback port with kvstashd's memory; 1 on failure.
mc_start() {
    local mcmd
    mc_stop
    mport=$(free_port) || { echo "   no free port for memcached"; return 1; }
    mcmd=(memcached -l 127.0.0.1 -p "$mport" -U 0 -t 2 -m "$(( mem_bytes / 1048576 ))"
          -I 32m -c 1024)
    # memcached refuses to run as root without -u; keep the invoking user
    [ "$(id -u)" = 0 ] && mcmd+=(-u "$(id -un)")
    show "${mcmd[@]}"
    "${mcmd[@]}" >"$tmp/memcached.log" 2>&1 &
    mc_pid=$!
    for _ in $(seq 1 50); do
        kill -0 "$mc_pid" 2>/dev/null || break
        if (exec 3<>"/dev/tcp/127.0.0.1/$mport") 2>/dev/null; then
            return 0
        fi
        sleep 0.1
    done
    echo "   memcached did not come up on 127.0.0.1:$mport: $(tail -n 3 "$tmp/memcached.log")"
    mc_stop
    return 1
}

# mc_flush: flush_all on the running memcached; 1 unless it answered OK within 5 s.
mc_flush() {
    local reply=""
    exec 4<>"/dev/tcp/127.0.0.1/$mport" || return 1
    printf 'flush_all\r\nquit\r\n' >&4
    read -r -t 5 reply <&4
    exec 4<&-
    [ "${reply%$'\r'}" = OK ]
}

# mc_peer: the kvstashd matrix against memcached (exists has no memcached counterpart).
# A fresh memcached per row; before a put row it is filled once past its memory limit and
# flushed, so puts reuse populated pages as kvstashd's do (its arena is populated before
# the matrix) instead of measuring first-touch page faults.
mc_peer() {
    local row name mode size batch conns depth per args out rc rep lines med
    echo "== peer: $(memcached -V 2>/dev/null); load generator: mc-bench (text protocol," \
         "multi-key get, set with STORED replies)"
    echo
    for row in "${matrix[@]}"; do
        read -r name mode size batch conns depth <<<"$row"
        echo "== memcached $name"
        if [ "$mode" = exists ]; then
            echo "   skipped: memcached has no existence check without fetching the value"
            mc_summary[$name]="n/a"
            echo
            continue
        fi
        if ! mc_start; then
            mc_summary[$name]=failed
            echo
            continue
        fi
        args=(-H "127.0.0.1:$mport" -m "${mode/put/set}" -s "$size" -b "$batch" -c "$conns"
              -d "$depth" -t "$SECS" -p "$mc_pid" -q "${copy_flag[@]}")
        if [ "$mode" = put ]; then
            # populate: write 1.1x the memory limit from 2 connections, then flush_all
            per=$(( mem_bytes * 11 / 10 / (2 * batch * $(size_bytes "$size")) + 1 ))
            show "$MCBENCH" -H "127.0.0.1:$mport" -m set -s "$size" -b "$batch" -c 2 \
                 -n "$per" -t 300 -q
            echo "   (then flush_all on 127.0.0.1:$mport)"
            if ! timeout 400 "$MCBENCH" -H "127.0.0.1:$mport" -m set -s "$size" -b "$batch" \
                     -c 2 -n "$per" -t 300 -q >"$tmp/mc.out" 2>"$tmp/mc.err" || ! mc_flush; then
                echo "   populating memcached failed: $(tr '\n' ' ' <"$tmp/mc.err")"
                mc_summary[$name]=failed
                mc_stop
                echo
                continue
            fi
            echo "   populated: $(field GB/s "$(cat "$tmp/mc.out")") GB/s while filling"
            args+=(-n "$(put_bound "$conns" "$batch" "$size")") # as kvstashd's put rows
        fi
        show "$MCBENCH" "${args[@]}"
        lines=()
        for rep in $(seq 1 "$REPS"); do
            out=$(timeout $(( SECS * 4 + 180 )) "$MCBENCH" "${args[@]}" 2>"$tmp/mc.err")
            rc=$?
            if [ "$rc" -ne 0 ] || [ -z "$out" ]; then
                echo "   run $rep FAILED (exit $rc): $(tr '\n' ' ' <"$tmp/mc.err") $out"
                kill -0 "$mc_pid" 2>/dev/null || { echo "   memcached died"; break; }
                continue
            fi
            echo "   run $rep: $(field GB/s "$out") GB/s, p99 $(field p99_us "$out") us," \
                 "misses $(field misses "$out")"
            lines+=("$out")
        done
        if [ "${#lines[@]}" -gt 0 ]; then
            med=$(median_line "GB/s" "${lines[@]}")
            echo "   median: $med"
            mc_summary[$name]="$(field GB/s "$med") GB/s, p99 $(field p99_us "$med") us,"
            mc_summary[$name]+=" $(field daemon_core_s_per_GB "$med") core-s/GB"
        else
            mc_summary[$name]=failed
        fi
        mc_stop
        kvd_alive || kvd_died
        echo
    done
}

if [ "$PEERS" = 1 ]; then
    if command -v redis-server >/dev/null && command -v redis-benchmark >/dev/null &&
       command -v redis-cli >/dev/null && command -v perl >/dev/null; then
        rport=$(free_port) || die "no free port for redis"
        mkdir -p "$tmp/redis"
        rcmd=(redis-server --port "$rport" --bind 127.0.0.1 --save "" --appendonly no
              --protected-mode no --dir "$tmp/redis" --maxmemory "$mem_bytes"
              --maxmemory-policy allkeys-lru)
        echo "== peer: $(redis-server --version | awk '{ print $1, $2, $3 }')"
        show "${rcmd[@]}"
        "${rcmd[@]}" >"$tmp/redis.log" 2>&1 &
        redis_pid=$!
        for _ in $(seq 1 50); do
            redis-cli -p "$rport" ping >/dev/null 2>&1 && break
            sleep 0.1
        done
        echo "redis-server pid $redis_pid on 127.0.0.1:$rport (one command per key:" \
             "pipelining of batch x depth commands stands in for a batch request)"
        echo
        for row in "${matrix[@]}"; do
            read -r name mode size batch conns depth <<<"$row"
            bytes=$(size_bytes "$size")
            pipe=$(( batch * depth ))
            keys=$(( 1073741824 / bytes ))
            [ "$keys" -gt 65536 ] && keys=65536
            [ "$keys" -lt 16 ] && keys=16
            echo "== redis $name"
            case "$mode" in
            get)
                echo "\$ redis-cli -p $rport --pipe  # SET key:0..$((keys - 1)) x $bytes bytes"
                redis_preload "$keys" "$bytes" ||
                    { echo "   preload failed"; redis_summary[$name]=failed; echo; continue; }
                redis_bench "$name" "GB/s" "$bytes" "$pipe" "$conns" \
                    -r "$keys" -d "$bytes" -t get || redis_summary[$name]=failed
                ;;
            put)
                timeout 300 redis-cli -p "$rport" flushall >/dev/null
                redis_bench "$name" "GB/s" "$bytes" "$pipe" "$conns" \
                    -r "$keys" -d "$bytes" -t set || redis_summary[$name]=failed
                ;;
            exists)
                keys=$(( 16384 * conns ))
                echo "\$ redis-cli -p $rport --pipe  # SET key:0..$((keys - 1)) x $bytes bytes"
                redis_preload "$keys" "$bytes" ||
                    { echo "   preload failed"; redis_summary[$name]=failed; echo; continue; }
                redis_bench "$name" "keys/s" 0 "$pipe" "$conns" \
                    -r "$keys" EXISTS "key:__rand_int__" || redis_summary[$name]=failed
                ;;
            esac
            kvd_alive || kvd_died
            echo
        done
    else
        echo "== peer redis: skipped: redis-server, redis-benchmark, redis-cli or perl" \
             "not installed"
    fi
    if ! command -v memcached >/dev/null; then
        echo "== peer memcached: skipped: memcached not installed"
        echo
    elif [ ! -x "$MCBENCH" ]; then
        echo "== peer memcached: skipped: no mc-bench at $MCBENCH (make bench builds it)"
        echo
    else
        mc_peer
    fi
fi

# ---- summary ----
printf '%-15s %-46s %-30s %-9s %-46s %s\n' "test" "kvstashd (median)" "raw TCP (median)" \
       "kv/raw" "redis-server (median)" "memcached (median)"
for row in "${matrix[@]}"; do
    read -r name _ <<<"$row"
    printf '%-15s %-46s %-30s %-9s %-46s %s\n' "$name" "${row_summary[$name]:-}" \
           "${row_summary[raw-$name]:--}" "$(ratio "${gbs[$name]:-}" "${gbs[raw-$name]:-}")" \
           "${redis_summary[$name]:--}" "${mc_summary[$name]:--}"
done
for row in "${probe_rows[@]}"; do
    read -r name _ <<<"$row"
    printf '%-15s %s\n' "$name" "${row_summary[$name]:-}"
done
if [ "${#shm_table[@]}" -gt 0 ]; then
    echo
    printf '%s\n' "${shm_table[@]}"
fi
if [ "${#engine_table[@]}" -gt 0 ]; then
    echo
    printf '%s\n' "${engine_table[@]}"
fi
kvd_alive || kvd_died

# ---- the Redis protocol (RESP2) port against redis-server ----
resp_rc=0
if [ "${BENCH_RESP:-1}" != 0 ]; then
    echo
    echo "== Redis protocol: kvstashd resp_listen and redis-server, redis-benchmark -P 16 -c 8"
    KVSTASHD="$KVSTASHD" BENCH_SECS="$SECS" BENCH_REPS="$REPS" \
        timeout 1800 "$here/resp.sh" || resp_rc=$?
    kvd_alive || kvd_died
else
    echo
    echo "== Redis protocol: skipped (BENCH_RESP=0)"
fi

# ---- the pool: remote hits against local gets, a put with R=2 against one daemon ----
cluster_rc=0
if [ "${BENCH_CLUSTER:-1}" != 0 ]; then
    echo
    echo "== Pool (tests/bench/cluster.sh): two daemons on loopback, a fixed view"
    KVSTASHD="$KVSTASHD" BENCH="$BENCH" KVSTASH_CLI="$KVSTASH_CLI" BENCH_REPS="$REPS" \
        timeout 1800 "$here/cluster.sh" || cluster_rc=$?
    kvd_alive || kvd_died
else
    echo
    echo "== Pool: skipped (BENCH_CLUSTER=0)"
fi

# ---- trace replay ----
# Mooncake's synthetic trace through fresh daemons of its own (tests/bench/trace.sh), with
# the matrix's daemon stopped so that the replays have the machine; bounded by the timeout.
trace_rc=0
if [ "${BENCH_TRACE:-1}" != 0 ]; then
    kill "$kvd_pid" 2>/dev/null
    wait "$kvd_pid" 2>/dev/null
    kvd_pid=""
    echo
    KVSTASHD="$KVSTASHD" KVSTASH_CLI="$KVSTASH_CLI" PYTHON="${PYTHON:-/usr/bin/python3}" \
        timeout 1200 "$here/trace.sh" || trace_rc=$?
else
    echo
    echo "== trace replay: skipped (BENCH_TRACE=0)"
fi

# ---- SSD tier ----
# The DRAM daemon is done: stopped, so the SSD section has the machine to itself. ssd.sh
# bounds its own runs (it starts none after 360 s; its restart test's fill of a million
# objects is bounded at 660 + 300 s); the timeout is the last resort.
ssd_rc=0
if [ "${BENCH_SSD:-1}" != 0 ]; then
    if [ -n "$kvd_pid" ]; then
        kill "$kvd_pid" 2>/dev/null
        wait "$kvd_pid" 2>/dev/null
        kvd_pid=""
    fi
    echo
    KVSTASHD="$KVSTASHD" BENCH="$BENCH" KVSTASH_CLI="$KVSTASH_CLI" BENCH_REPS="$REPS" \
        timeout 1800 "$here/ssd.sh" || ssd_rc=$?
    if [ "${BENCH_SSD_FULL:-1}" != 0 ]; then
        echo
        KVSTASHD="$KVSTASHD" BENCH="$BENCH" KVSTASH_CLI="$KVSTASH_CLI" BENCH_REPS="$REPS" \
            timeout 900 "$here/ssd_full.sh" || ssd_rc=$?
    fi
else
    echo
    echo "== SSD tier: skipped (BENCH_SSD=0)"
fi
# ---- first fill and restart after an index rebuild ----
# Each starts its own daemons (a fresh 4 GiB DRAM tier; an SSD tier of a million records),
# so the matrix's daemon is stopped first. fill.sh bounds its waits (600 s for the
# population, 60 slices a pass); rebuild.sh its fill (900 s) and rebuild (300 s).
fill_rc=0
rebuild_rc=0
if [ -n "$kvd_pid" ]; then
    kill "$kvd_pid" 2>/dev/null
    wait "$kvd_pid" 2>/dev/null
    kvd_pid=""
fi
# own_daemons_section VAR TITLE SCRIPT: unless VAR is 0, SCRIPT with the binaries, 1800 s at
# most; its exit status (0 when skipped).
own_daemons_section() {
    echo
    if [ "${!1:-1}" = 0 ]; then
        echo "== $2: skipped ($1=0)"
        return 0
    fi
    KVSTASHD="$KVSTASHD" BENCH="$BENCH" KVSTASH_CLI="$KVSTASH_CLI" timeout 1800 "$here/$3"
}
own_daemons_section BENCH_FILL "first fill" fill.sh || fill_rc=$?
own_daemons_section BENCH_REBUILD "restart after an index rebuild" rebuild.sh || rebuild_rc=$?
if [ "$failures" -gt 0 ]; then
    echo "run.sh: $failures kvstash-bench run(s) failed" >&2
    exit 1
fi
if [ "$resp_rc" -ne 0 ]; then
    echo "run.sh: the Redis-protocol section failed (exit $resp_rc)" >&2
    exit 1
fi
if [ "$cluster_rc" -ne 0 ]; then
    echo "run.sh: the pool's section failed (exit $cluster_rc)" >&2
    exit 1
fi
if [ "$trace_rc" -ne 0 ]; then
    echo "run.sh: the trace replay failed (exit $trace_rc)" >&2
    exit 1
fi
if [ "$ssd_rc" -ne 0 ]; then
    echo "run.sh: the SSD section failed (exit $ssd_rc)" >&2
    exit 1
fi
if [ "$fill_rc" -ne 0 ] || [ "$rebuild_rc" -ne 0 ]; then
    echo "run.sh: the first-fill (exit $fill_rc) or rebuild (exit $rebuild_rc) section failed" >&2
    exit 1
fi
exit 0
