#!/usr/bin/env bash
# trace.sh: the trace-replay section of `make bench`.
#
# Replays Mooncake's FAST'25 synthetic trace (tests/data/mooncake_synthetic_trace.jsonl.gz, 3,993
# requests of 512-token prefix blocks) through tests/bench/trace_replay.py against a fresh
# kvstashd per case, every block a 16 KiB object, and prints each hit rate next to an exact
# LRU simulation of the same capacity and the trace's maximum (an infinite cache). Cases,
# each under every eviction policy of TRACE_POLICIES:
#   dram  DRAM alone at 3M tokens: 5,859 blocks. memory_size is exactly 5,859 x 16 KiB
#         (an object of 16 KiB takes 4 arena pages and nothing else of the arena; its
#         header, key and hash slot, about 150 bytes, live on the heap, outside
#         memory_size and counted in metadata_bytes).
#   ssd   DRAM plus an SSD tier of 50M tokens: 97,656 blocks. A small DRAM (16 MiB, 1,024
#         blocks) and ssd_size 97,656 records of 20 KiB (a 4 KiB record header and the
#         16 KiB value), the shipped SSD defaults otherwise (ssd_offload on_evict).
# Every run is printed as the command and one TRACE line; the summary is the median hit
# rate of TRACE_REPS runs per case and policy.
#
# Environment: KVSTASHD (binary), PYTHON (/usr/bin/python3), TRACE_FILE (the trace),
# TRACE_POLICIES ("fifo lru slru"), TRACE_REPS (3), TRACE_CASES ("dram ssd"), TRACE_LIMIT
# (0: every request), TRACE_DAEMON_ARGS (more kvstashd flags for every daemon), TRACE_TMP (a directory on the disk to put the SSD tier on; default
# under /var/tmp, not a tmpfs). Exits non-zero if a daemon dies or a replay reads a wrong
# value or fails a put.
set -u -o pipefail

here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
KVSTASHD=${KVSTASHD:-$root/build/release/kvstashd}
PYTHON=${PYTHON:-/usr/bin/python3}
TRACE_FILE=${TRACE_FILE:-$root/tests/data/mooncake_synthetic_trace.jsonl.gz}
POLICIES=${TRACE_POLICIES:-fifo lru slru}
REPS=${TRACE_REPS:-3}
CASES=${TRACE_CASES:-dram ssd}
LIMIT=${TRACE_LIMIT:-0}
read -r -a extra_args <<<"${TRACE_DAEMON_ARGS:-}"

# shellcheck source=lib.sh
. "$here/lib.sh"       # die, show, field, free_port, answers_ping, bench_exit_trap, kvd_kill

[ -x "$KVSTASHD" ] || die "no daemon at $KVSTASHD (run make first)"
case "$REPS" in ''|*[!0-9]*|0) die "TRACE_REPS must be a number >= 1" ;; esac
if [ ! -r "$TRACE_FILE" ]; then
    echo "== trace replay: skipped (no trace at $TRACE_FILE)"
    exit 0
fi
CLI=${KVSTASH_CLI:-$(dirname "$KVSTASHD")/kvstash}

BLOCK=16384
DRAM_BLOCKS=5859
SSD_BLOCKS=97656
SSD_RECORD=$(( BLOCK + 4096 ))
SSD_DRAM=$(( 16 * 1048576 ))

tmp=$(mktemp -d "${TRACE_TMP:-/var/tmp}/kvstash-trace.XXXXXX") || die "mktemp failed"
kvd_pid=""
bench_exit_trap "$tmp"

# start_daemon CASE POLICY: a fresh kvstashd for one run; sets kvd_pid and addr.
start_daemon() {
    local case=$1 policy=$2 port args
    rm -rf "$tmp/data" && mkdir -p "$tmp/data"
    port=$(free_port) || die "no free loopback port found"
    args=(--listen="127.0.0.1:$port" --data_dir="$tmp/data" --unix_socket=
          --metrics_listen= --eviction_policy="$policy" "${extra_args[@]}")
    if [ "$case" = dram ]; then
        args+=(--memory_size=$(( DRAM_BLOCKS * BLOCK )) --ssd_dir=)
    else
        args+=(--memory_size=$SSD_DRAM --ssd_dir="$tmp/data/ssd"
               --ssd_size=$(( SSD_BLOCKS * SSD_RECORD )))
    fi
    show "$KVSTASHD" "${args[@]}"
    "$KVSTASHD" "${args[@]}" >"$tmp/kvstashd.log" 2>&1 &
    kvd_pid=$!
    addr="127.0.0.1:$port"
    if ! answers_ping "$CLI" "$port" "$kvd_pid" 100 0.1; then
        tail -n 5 "$tmp/kvstashd.log" >&2
        die "kvstashd did not start (case $case, policy $policy)"
    fi
}

echo "== trace replay: $TRACE_FILE, 16 KiB blocks, policies: $POLICIES, $REPS run(s) each"
declare -A med
rc=0
for case in $CASES; do
    if [ "$case" = dram ]; then cap=$DRAM_BLOCKS; else cap=$SSD_BLOCKS; fi
    for policy in $POLICIES; do
        lines=()
        for _ in $(seq 1 "$REPS"); do
            start_daemon "$case" "$policy"
            cmd=("$PYTHON" "$here/trace_replay.py" --addr "$addr" --trace "$TRACE_FILE"
                 --limit "$LIMIT" --block-size $BLOCK --capacity "$cap" --label "$case-$policy")
            show "${cmd[@]}"
            line=$(timeout 600 "${cmd[@]}") || { echo "   replay failed"; rc=1; }
            echo "   $line"
            kill -0 "$kvd_pid" 2>/dev/null || { tail -n 20 "$tmp/kvstashd.log" >&2; die "kvstashd died"; }
            kvd_kill
            [ -n "$line" ] && lines+=("$line")
        done
        if [ "${#lines[@]}" -gt 0 ]; then
            med[$case-$policy]=$(printf '%s\n' "${lines[@]}" \
                | awk '{ for (i = 1; i <= NF; i++) if ($i ~ /^hit_rate=/) print substr($i, 10), $0 }' \
                | sort -n | awk '{ a[NR] = $0 } END { print a[int((NR + 1) / 2)] }' | cut -d' ' -f2-)
        fi
    done
done

echo
echo "trace replay summary (median of $REPS; vs_lru = hit rate / exact LRU, vs_max = / infinite cache)"
printf '%-6s %-7s %-9s %-8s %-8s %-7s %-7s %s\n' case policy hit_rate lru_sim max vs_lru vs_max dram_objects
for case in $CASES; do
    for policy in $POLICIES; do
        l=${med[$case-$policy]:-}
        [ -n "$l" ] || { printf '%-6s %-7s failed\n' "$case" "$policy"; continue; }
        printf '%-6s %-7s %-9s %-8s %-8s %-7s %-7s %s\n' "$case" "$policy" \
            "$(field hit_rate "$l")" "$(field lru_sim "$l")" "$(field max "$l")" \
            "$(field vs_lru "$l")" "$(field vs_max "$l")" "$(field dram_objects "$l")"
    done
done
exit "$rc"
