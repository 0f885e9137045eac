#!/usr/bin/env bash
# resp.sh: the Redis-protocol section of `make bench` (run.sh calls it; it runs alone too).
#
# redis-benchmark against kvstashd's RESP2 port (resp_listen) and against redis-server, in
# the same run, one after the other on each row: GET and SET of 4 KiB, 64 KiB and 1 MiB
# values, -P 16, -c 8. Each row: requests/s, p99 and the server's CPU per GB moved
# (utime+stime of the server process over the run, in core-seconds per GB of values), the
# median of BENCH_REPS runs of about BENCH_SECS seconds each; then a table with
# kvstash/redis for every row. Both servers are DRAM-only with the same memory limit. GET
# rows read keys preloaded with redis-cli --pipe (the same keys and bytes on both); SET rows
# write keys drawn from a space of 10^9 (-r), so almost every SET stores a new key on both
# servers (kvstash's SET is write-once: a repeated key would only be dropped, unfairly
# cheap). Every command is printed before it runs and bounded by a timeout.
#
# Each redis-benchmark run also reports the client's own CPU (client_core=: utime+stime of
# redis-benchmark over the run's wall time, in cores): a client near 1.0 (one thread) is
# the limit of that row, whatever the server could do.
#
# The same rows go through kvstashd's msgpack port too (kvstash-bench get/put, one key a
# request, 8 connections, 16 in flight each: the same shape as -c 8 -P 16; the same number
# of preloaded keys for get; put values copied by the client, -C, as redis-benchmark's
# are), so the summary puts RESP's server core-s/GB beside the msgpack port's: the two
# ports share the loops and the store, and RESP should cost no more.
#
# And once more with one client built like kvstash-bench for both RESP servers: mc-bench
# -P resp (GET/SET, one key a request, 8 threads with a connection each, 16 in flight,
# values received whole and set values copied, -C). redis-benchmark is one event-loop
# thread that reads replies 16 KiB a call: at 64 KiB and 1 MiB it is the limit of both
# servers, and its pace changes what a server spends per GB (more wake-ups for fewer
# bytes). mc-bench's rows compare the servers with a client that is not the limit, and
# RESP's core-s/GB with the msgpack port's under the same kind of client.
#
# Like for like (BENCH_RESP_PACED=1, the default): under redis-benchmark kvstashd is often
# mostly idle (one client thread is the limit), while kvstash-bench drives the msgpack port
# at full speed, and a daemon that wakes often for little work spends more per GB whatever
# the protocol. So each row runs twice more at the rate redis-benchmark reached on
# kvstash's RESP port (same keys, 8 connections, 16 in flight): kvstash-bench on the msgpack
# port and mc-bench on the RESP port, both paced with -r (requests spread evenly over each
# connection's schedule). The last table puts RESP's core-s/GB beside the msgpack port's
# at that one rate: mc-bench paced over kvstash-bench paced is the protocol (same rate,
# same client shape); redis-benchmark's over mc-bench paced is the client's shape
# (redis-benchmark sends 16 requests at once and reads replies 16 KiB a call).
#
# kvstashd is measured only once its arena is populated (the log line "arena of N MiB
# populated"): the population thread runs for seconds after the start (10 s for 2 GiB on a
# loaded VM here), and its CPU would be charged to the first rows.
#
# Pinning (BENCH_RESP_PIN=S:C, taskset CPU lists, default none): both servers run on CPUs
# S, every client (redis-benchmark, kvstash-bench, mc-bench, the preload) on CPUs C. With
# two cores, 1:0 gives each server one core and the client the other, so neither server
# takes the client's core; kvstashd's io_threads then share one core as redis-server's
# one thread has it.
#
# Environment: KVSTASHD (default build/release/kvstashd), KVSTASH_BENCH (default
# build/release/kvstash-bench; absent: the msgpack rows are skipped), BENCH_SECS (5),
# BENCH_REPS (3), BENCH_RESP_MEMORY (2g: memory_size of kvstashd, maxmemory of
# redis-server), BENCH_RESP_IO_THREADS (kvstashd's io_threads; default: its own default),
# BENCH_RESP_CLIENT_THREADS (1: redis-benchmark --threads, the same for both servers),
# BENCH_RESP_PIN (none; S:C above), BENCH_RESP_PACED (1; 0 skips the paced runs), MCBENCH (default build/release/mc-bench; absent: its
# rows are skipped).
# Exits non-zero when kvstashd dies or a kvstash row fails; a missing redis-server is
# reported and its rows skipped.
set -u -o pipefail

here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
KVSTASHD=${KVSTASHD:-$root/build/release/kvstashd}
KVBENCH=${KVSTASH_BENCH:-$root/build/release/kvstash-bench}
SECS=${BENCH_SECS:-5}
REPS=${BENCH_REPS:-3}
MEM=${BENCH_RESP_MEMORY:-2g}
IO_THREADS=${BENCH_RESP_IO_THREADS:-}
CLIENT_THREADS=${BENCH_RESP_CLIENT_THREADS:-1}
MCB=${MCBENCH:-$root/build/release/mc-bench}
PIN=${BENCH_RESP_PIN:-}
PACED=${BENCH_RESP_PACED:-1}

# shellcheck source=lib.sh
. "$here/lib.sh"       # die, show, field, free_port, proc_cpu

[ -x "$KVSTASHD" ] || die "no daemon at $KVSTASHD (run make first)"
if ! command -v redis-benchmark >/dev/null || ! command -v redis-cli >/dev/null; then
    die "redis-benchmark and redis-cli (redis-tools) are needed"
fi
command -v perl >/dev/null || die "perl is needed (the preload)"
case "$PACED" in 0|1) ;; *) die "BENCH_RESP_PACED must be 0 or 1" ;; esac
case "$SECS$REPS$IO_THREADS$CLIENT_THREADS" in
    *[!0-9]*) die "BENCH_SECS, BENCH_REPS, BENCH_RESP_IO_THREADS and BENCH_RESP_CLIENT_THREADS must be whole numbers" ;;
esac
[ "$CLIENT_THREADS" -ge 1 ] || die "BENCH_RESP_CLIENT_THREADS must be at least 1"
[ -x "$KVBENCH" ] || { echo "no kvstash-bench at $KVBENCH: the msgpack rows are skipped"; KVBENCH=""; }
[ -x "$MCB" ] || { echo "no mc-bench at $MCB: its rows are skipped"; MCB=""; }
spin=()     # the servers' command prefix (taskset), and the clients'
cpin=()
if [ -n "$PIN" ]; then
    case "$PIN" in
        *[!0-9,:-]* | *:*:* | :* | *:) die "BENCH_RESP_PIN: use S:C with CPU lists, like 1:0" ;;
        *:*) ;;
        *) die "BENCH_RESP_PIN: use S:C with CPU lists, like 1:0" ;;
    esac
    command -v taskset >/dev/null || die "BENCH_RESP_PIN needs taskset (util-linux)"
    spin=(taskset -c "${PIN%%:*}")
    cpin=(taskset -c "${PIN##*:}")
fi
case "$MEM" in
    *g|*G) mem_bytes=$(( ${MEM%[gG]} * 1073741824 )) ;;
    *m|*M) mem_bytes=$(( ${MEM%[mM]} * 1048576 )) ;;
    *) die "BENCH_RESP_MEMORY: use a size like 2g or 512m" ;;
esac

tmp=$(mktemp -d /tmp/kvstash-resp-bench.XXXXXX) || die "mktemp failed"
kvd_pid=""
redis_pid=""
# shellcheck disable=SC2317  # invoked by the EXIT trap
cleanup() {
    local pid
    for pid in "$kvd_pid" "$redis_pid"; do
        if [ -n "$pid" ] && kill "$pid" 2>/dev/null; then
            wait "$pid" 2>/dev/null
        fi
    done
    rm -rf "$tmp"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# wait_resp PORT PID: 0 once PORT answers PING (PONG), 1 when PID exits or after 10 s.
wait_resp() {
    for _ in $(seq 1 100); do
        kill -0 "$2" 2>/dev/null || return 1
        [ "$(timeout 5 redis-cli -p "$1" ping 2>/dev/null)" = PONG ] && return 0
        sleep 0.1
    done
    return 1
}

# ---- the two servers ----
kport=$(free_port) || die "no free port"
mport=$(free_port) || die "no free port"
mkdir -p "$tmp/data"
kcmd=("$KVSTASHD" --listen="127.0.0.1:$mport" --data_dir="$tmp/data" --unix_socket=none
      --resp_listen="127.0.0.1:$kport" --memory_size="$MEM" --ssd_dir= --metrics_listen=)
[ -n "$IO_THREADS" ] && kcmd+=(--io_threads="$IO_THREADS")
show "${spin[@]}" "${kcmd[@]}"
"${spin[@]}" "${kcmd[@]}" >"$tmp/kvstashd.log" 2>&1 &
kvd_pid=$!
if ! wait_resp "$kport" "$kvd_pid"; then
    tail -n 20 "$tmp/kvstashd.log" >&2
    die "kvstashd did not start"
fi
# measure serving, not start-up: the arena's population thread ends first (at most 300 s)
# (the log says so only when it took a second or more: a small arena is seen in its stats)
populated() {
    local raw cap done_
    raw=$("$(dirname "$KVSTASHD")/kvstash" -H "127.0.0.1:$mport" stats --raw 2>/dev/null)
    cap=$(awk '$1 == "memory_capacity" { print $2 }' <<<"$raw")
    done_=$(awk '$1 == "memory_prefaulted" { print $2 }' <<<"$raw")
    [ "${cap:-0}" -gt 0 ] && [ "${done_:-0}" -ge "$cap" ]
}
for _ in $(seq 1 1500); do
    grep -q "arena of .* populated\|populating the arena stopped" "$tmp/kvstashd.log" && break
    populated && break
    kill -0 "$kvd_pid" 2>/dev/null || die "kvstashd died"
    sleep 0.2
done
grep -o "arena of .* populated in [0-9]* ms" "$tmp/kvstashd.log" || populated ||
    echo "kvstashd: the arena not populated after 300 s; measuring anyway"

rport=""
if command -v redis-server >/dev/null; then
    rport=$(free_port) || die "no free port"
    mkdir -p "$tmp/redis"
    rcmd=(redis-server --port "$rport" --bind 127.0.0.1 --save "" --appendonly no
          --protected-mode no --dir "$tmp/redis" --maxmemory "$mem_bytes"
          --maxmemory-policy allkeys-lru)
    show "${spin[@]}" "${rcmd[@]}"
    "${spin[@]}" "${rcmd[@]}" >"$tmp/redis.log" 2>&1 &
    redis_pid=$!
    if ! wait_resp "$rport" "$redis_pid"; then
        echo "redis-server did not start: skipped"
        tail -n 5 "$tmp/redis.log"
        rport=""
    fi
else
    echo "redis-server not installed: its rows are skipped"
fi
echo "kvstashd $kvd_pid RESP on 127.0.0.1:$kport, msgpack on 127.0.0.1:$mport;" \
     "redis-server ${redis_pid:-none} ${rport:+on 127.0.0.1:$rport};" \
     "-P 16 -c 8 --threads $CLIENT_THREADS; $SECS s x $REPS runs a row;" \
     "pinned: ${PIN:-no}"
echo

# preload PORT N SIZE: keys key:000000000000 .. N-1 with SIZE-byte values.
preload() {
    echo "\$ redis-cli -p $1 --pipe  # SET key:0..$(( $2 - 1 )) x $3 bytes"
    perl -e 'my ($n, $s) = @ARGV; my $v = "x" x $s;
             for my $i (0 .. $n - 1) {
                 my $k = sprintf("key:%012d", $i);
                 print "*3\r\n\$3\r\nSET\r\n\$" . length($k) . "\r\n$k\r\n\$$s\r\n$v\r\n";
             }' "$2" "$3" | timeout 300 "${cpin[@]}" redis-cli -p "$1" --pipe >/dev/null
}

# run_row PORT PID SIZE ARGS...: REPS runs of redis-benchmark ARGS against PORT, each
# printed; the median line (rps=, p99_us=, core_s_per_GB=) in $med, or return 1.
med=""
run_row() {
    local port=$1 pid=$2 size=$3
    shift 3
    local base=("${cpin[@]}" redis-benchmark -h 127.0.0.1 -p "$port" -c 8 -P 16 --csv "$@")
    [ "$CLIENT_THREADS" -gt 1 ] && base+=(--threads "$CLIENT_THREADS")
    local out rps n lines=() cpu0 cpu1 t0 t1 line p99 ccpu
    out=$(timeout 120 "${base[@]}" -n 2000 2>/dev/null | tail -n 1)
    rps=$(echo "$out" | awk -F'"' '{ print int($4) }')
    if [ -z "$rps" ] || [ "$rps" -le 0 ]; then
        echo "   calibration failed: $out"
        return 1
    fi
    n=$(( rps * SECS ))
    [ "$n" -lt 2000 ] && n=2000
    show "${base[@]}" -n "$n"
    for rep in $(seq 1 "$REPS"); do
        cpu0=$(proc_cpu "$pid")
        t0=$(date +%s%N)
        # bash's time: the client's user+sys (timeout waits for it, so it is counted)
        { TIMEFORMAT='%U %S'; time timeout $(( SECS * 4 + 60 )) "${base[@]}" -n "$n" \
              >"$tmp/rb.out" 2>"$tmp/rb.err"; } 2>"$tmp/rb.time"
        out=$(tail -n 1 "$tmp/rb.out")
        t1=$(date +%s%N)
        cpu1=$(proc_cpu "$pid")
        ccpu=$(awk '{ print $1 + $2 }' "$tmp/rb.time")
        rps=$(echo "$out" | awk -F'"' '{ print $4 }')
        if [ -z "$rps" ] || grep -qi "error" "$tmp/rb.err"; then
            echo "   run $rep FAILED: $out $(grep -i error "$tmp/rb.err" | head -n 2)"
            continue
        fi
        p99=$(echo "$out" | awk -F'"' '{ print $14 }')
        line=$(awk -v rps="$rps" -v size="$size" -v p99="$p99" \
                   -v cpu=$(( cpu1 - cpu0 )) -v hz="$(getconf CLK_TCK)" -v ccpu="$ccpu" \
                   -v threads="$CLIENT_THREADS" \
                   -v ms="$(( (t1 - t0) / 1000000 ))" 'BEGIN {
            gb = rps * size * ms / 1000 / 1e9;
            sc = ms > 0 ? (cpu / hz) / (ms / 1000) : 0;
            cc = ms > 0 ? ccpu / (ms / 1000) : 0;
            # the rate each side could reach with a whole core per thread at this cost
            printf "rps=%.0f GB/s=%.3f p99_us=%.0f core_s_per_GB=%.3f server_core=%.2f" \
                   " client_core=%.2f client_max_rps=%.0f",
                   rps, rps * size / 1e9, p99 * 1000, (gb > 0 ? (cpu / hz) / gb : 0), sc, cc,
                   (cc > 0 ? rps / cc * threads : 0);
        }')
        echo "   run $rep: $line"
        lines+=("$line")
    done
    [ "${#lines[@]}" -gt 0 ] || return 1
    med=$(printf '%s\n' "${lines[@]}" | awk '{ split($1, kv, "="); print kv[2] "\t" $0 }' |
          sort -g | awk -F'\t' '{ l[NR] = $2 } END { print l[int((NR + 1) / 2)] }')
    echo "   median: $med"
}

# tool_reps PORT ERR KEY CMD...: REPS runs of CMD (kvstash-bench or mc-bench with -q: one
# result line), each after a FLUSHALL of the RESP server on PORT, its stderr in ERR; the
# median line by the field KEY (req/s; a paced run's req/s is its rate, so those take the
# median by daemon_core_s_per_GB) in $med, or return 1 when no run succeeded.
tool_reps() {
    local port=$1 err=$2 key=$3 out lines=()
    shift 3
    show "$@"
    for rep in $(seq 1 "$REPS"); do
        timeout 60 redis-cli -p "$port" flushall >/dev/null
        out=$(timeout $(( SECS * 4 + 120 )) "$@" 2>"$err" | tail -n 1)
        if [ -z "$(field req/s "$out")" ] || [ "$(field errors "$out")" != 0 ]; then
            echo "   run $rep FAILED: $out $(head -n 2 "$err")"
            continue
        fi
        echo "   run $rep: $out"
        lines+=("$out")
    done
    [ "${#lines[@]}" -gt 0 ] || return 1
    med=$(printf '%s\n' "${lines[@]}" | awk -v key="$key" '{ for (i = 1; i <= NF; i++)
              if (index($i, key "=") == 1) { split($i, kv, "="); print kv[2] "\t" $0 } }' |
          sort -g | awk -F'\t' '{ l[NR] = $2 } END { print l[int((NR + 1) / 2)] }')
    echo "   median: $med"
}

# mp_row OP SIZE KEYS [RATE]: REPS runs of kvstash-bench against the msgpack port (OP get:
# KEYS keys preloaded by it; put: new keys), paced at RATE requests/s in all when given
# (-r); the median line in $med (tool_reps), or return 1.
mp_row() {
    local op=$1 size=$2 keys=$3 rate=${4:-} args
    args=("${cpin[@]}" "$KVBENCH" -H "127.0.0.1:$mport" -m "$op" -b 1 -d 16 -c 8 -s "$size"
          -t "$SECS" -p "$kvd_pid" -q)
    [ "$op" = get ] && args+=(-k $(( (keys + 7) / 8 )))
    [ "$op" = put ] && args+=(-C)
    local key=req/s
    [ -n "$rate" ] && { args+=(-r "$rate"); key=daemon_core_s_per_GB; }
    tool_reps "$kport" "$tmp/kb.err" "$key" "${args[@]}"
}

# mc_row PORT PID OP SIZE KEYS [RATE]: REPS runs of mc-bench -P resp against PORT (a RESP
# server of pid PID; get: KEYS keys preloaded by it, set: new keys), after a FLUSHALL
# each, paced at RATE requests/s in all when given (-r); the median line in $med
# (tool_reps), or return 1.
mc_row() {
    local port=$1 pid=$2 op=$3 size=$4 keys=$5 rate=${6:-} args
    args=("${cpin[@]}" "$MCB" -P resp -H "127.0.0.1:$port" -m "$op" -b 1 -d 16 -c 8
          -s "$size" -t "$SECS" -p "$pid" -C -q)
    [ "$op" = get ] && args+=(-k $(( (keys + 7) / 8 )))
    local key=req/s
    [ -n "$rate" ] && { args+=(-r "$rate"); key=daemon_core_s_per_GB; }
    tool_reps "$port" "$tmp/mc.err" "$key" "${args[@]}"
}

# server_port_pid SERVER: port and pid of the RESP server SERVER (kvstash or redis) into
# $port and $pid; $port is empty when that server is not running.
server_port_pid() {
    if [ "$1" = redis ]; then
        port=$rport
        pid=$redis_pid
    else
        port=$kport
        pid=$kvd_pid
    fi
}

# kvd_alive: die, with the tail of its log, when kvstashd has exited.
kvd_alive() {
    if ! kill -0 "$kvd_pid" 2>/dev/null; then
        tail -n 20 "$tmp/kvstashd.log" >&2
        die "kvstashd died"
    fi
}

declare -A kv_row redis_row mp_row_med mc_kv_row mc_redis_row mp_paced mc_paced
rows=()
failed=0
for op in get set; do
    for size in 4096 65536 1048576; do
        name="$op-$(( size / 1024 ))k"
        [ "$size" = 1048576 ] && name="$op-1m"
        rows+=("$name")
        keys=$(( mem_bytes / 2 / size ))
        [ "$keys" -gt 100000 ] && keys=100000
        for server in kvstash redis; do
            server_port_pid "$server"
            [ -n "$port" ] || continue
            echo "== $server $name"
            if [ "$op" = get ]; then
                timeout 60 redis-cli -p "$port" flushall >/dev/null
                preload "$port" "$keys" "$size" || { echo "   preload failed"; continue; }
                args=(-t get -r "$keys" -d "$size")
            else
                timeout 60 redis-cli -p "$port" flushall >/dev/null
                args=(-t set -r 1000000000 -d "$size")
            fi
            if run_row "$port" "$pid" "$size" "${args[@]}"; then
                if [ "$server" = kvstash ]; then kv_row[$name]=$med; else redis_row[$name]=$med; fi
            elif [ "$server" = kvstash ]; then
                failed=$(( failed + 1 ))
            fi
            kvd_alive
            echo
        done
        mop="put"
        [ "$op" = get ] && mop="get"
        if [ -n "$KVBENCH" ]; then
            echo "== kvstash msgpack $name"
            if mp_row "$mop" "$size" "$keys"; then
                mp_row_med[$name]=$med
            else
                failed=$(( failed + 1 ))
            fi
            kvd_alive
            echo
        fi
        # at the rate redis-benchmark reached on kvstash's RESP port (same rows, same
        # connections and depth): the msgpack port, and the RESP port under mc-bench
        rate=$(field rps "${kv_row[$name]:-}")
        if [ "$PACED" = 1 ] && [ -n "$rate" ] && [ -n "$KVBENCH" ]; then
            echo "== kvstash msgpack $name, paced at $rate req/s"
            if mp_row "$mop" "$size" "$keys" "$rate"; then
                mp_paced[$name]=$med
            else
                failed=$(( failed + 1 ))
            fi
            kvd_alive
            echo
        fi
        if [ "$PACED" = 1 ] && [ -n "$rate" ] && [ -n "$MCB" ]; then
            echo "== kvstash $name, mc-bench -P resp paced at $rate req/s"
            if mc_row "$kport" "$kvd_pid" "$op" "$size" "$keys" "$rate"; then
                mc_paced[$name]=$med
            else
                failed=$(( failed + 1 ))
            fi
            kvd_alive
            echo
        fi
        if [ -n "$MCB" ]; then
            for server in kvstash redis; do
                server_port_pid "$server"
                [ -n "$port" ] || continue
                echo "== $server $name, mc-bench -P resp"
                if mc_row "$port" "$pid" "$op" "$size" "$keys"; then
                    if [ "$server" = kvstash ]; then mc_kv_row[$name]=$med
                    else mc_redis_row[$name]=$med; fi
                elif [ "$server" = kvstash ]; then
                    failed=$(( failed + 1 ))
                fi
                kvd_alive
                echo
            done
        fi
    done
done

# ---- summary ----
# Per row: each server's req/s, p99, its CPU per GB moved, and the client's CPU (cores;
# near 1.0 per client thread, the client is the limit) with the rate its thread(s) could
# reach at that cost ("client max"); kvstash/redis req/s; the msgpack port's CPU per GB for
# the same row and RESP's over it (at most 1.0 is the target).
# server_col MEDIAN: one server's summary column, "-" when it did not run.
server_col() {
    [ -n "$(field rps "$1")" ] || { echo "-"; return; }
    echo "$(field rps "$1") req/s, p99 $(field p99_us "$1") us, $(field core_s_per_GB "$1")" \
         "core-s/GB, client $(field client_core "$1") (max $(field client_max_rps "$1"))"
}
printf '%-8s %-78s %-78s %-8s %s\n' "row" "kvstash RESP (median)" "redis-server (median)" \
       "req/s" "msgpack port (kvstash-bench): core-s/GB, RESP/msgpack"
for name in "${rows[@]}"; do
    k=${kv_row[$name]:-failed}
    r=${redis_row[$name]:--}
    m=${mp_row_med[$name]:--}
    ratio=$(awk -v a="$(field rps "$k")" -v b="$(field rps "$r")" \
                'BEGIN { if (a > 0 && b > 0) printf "%.2fx", a / b; else print "-" }')
    kcol=$(server_col "$k")
    rcol=$(server_col "$r")
    mcpu=$(field daemon_core_s_per_GB "$m")
    mcol=$(awk -v a="$(field core_s_per_GB "$k")" -v b="$mcpu" -v rps="$(field req/s "$m")" \
               'BEGIN { if (b > 0) printf "%s core-s/GB (%.0f req/s), %.2fx", b, rps, a / b;
                        else print "-" }')
    printf '%-8s %-78s %-78s %-8s %s\n' "$name" "$kcol" "$rcol" "$ratio" "$mcol"
done
if [ -n "$MCB" ]; then
    # The same rows with mc-bench -P resp as the client of both RESP servers: req/s, p99 and
    # server core-s/GB; kvstash/redis req/s; RESP's core-s/GB over the msgpack port's (whose
    # client, kvstash-bench, is built the same way).
    echo
    printf '%-8s %-44s %-44s %-8s %s\n' "row" "kvstash RESP, mc-bench (median)" \
           "redis-server, mc-bench (median)" "req/s" "RESP/msgpack core-s/GB"
    for name in "${rows[@]}"; do
        k=${mc_kv_row[$name]:-failed}
        r=${mc_redis_row[$name]:--}
        m=${mp_row_med[$name]:--}
        cols=()
        for l in "$k" "$r"; do
            if [ -n "$(field req/s "$l")" ]; then
                cols+=("$(field req/s "$l") req/s, p99 $(field p99_us "$l") us, $(field \
                         daemon_core_s_per_GB "$l") core-s/GB")
            else
                cols+=("-")
            fi
        done
        ratio=$(awk -v a="$(field req/s "$k")" -v b="$(field req/s "$r")" \
                    'BEGIN { if (a > 0 && b > 0) printf "%.2fx", a / b; else print "-" }')
        cpu=$(awk -v a="$(field daemon_core_s_per_GB "$k")" \
                  -v b="$(field daemon_core_s_per_GB "$m")" \
                  'BEGIN { if (a > 0 && b > 0) printf "%.2fx", a / b; else print "-" }')
        printf '%-8s %-44s %-44s %-8s %s\n' "$name" "${cols[0]}" "${cols[1]}" "$ratio" "$cpu"
    done
fi
# paced_col CORE_S_PER_GB REQ_S: one paced run's summary column, "-" when it did not run.
paced_col() {
    if [ -n "$1" ]; then echo "$1 core-s/GB ($(printf '%.0f' "$2") req/s)"; else echo "-"; fi
}
if [ "$PACED" = 1 ]; then
    # Like for like: kvstashd's core-s/GB at the rate redis-benchmark reached on its RESP
    # port, through the RESP port (redis-benchmark; mc-bench paced) and the msgpack port
    # (kvstash-bench paced), the rate each paced client reached beside it. RESP/msgpack at
    # one rate and one client shape is the paced mc-bench column over the paced msgpack
    # one; redis-benchmark's over mc-bench's is the client's shape.
    echo
    printf '%-8s %-10s %-22s %-30s %-30s %-9s %s\n' "row" "rate" "RESP redis-benchmark" \
           "RESP mc-bench paced" "msgpack kvstash-bench paced" "RESP(rb)" \
           "RESP(mc)/msgpack at that rate"
    for name in "${rows[@]}"; do
        k=${kv_row[$name]:-}
        [ -n "$(field rps "$k")" ] || continue
        mc=${mc_paced[$name]:-}
        mp=${mp_paced[$name]:-}
        kcs=$(field core_s_per_GB "$k")
        mccs=$(field daemon_core_s_per_GB "$mc")
        mpcs=$(field daemon_core_s_per_GB "$mp")
        printf '%-8s %-10s %-22s %-30s %-30s %-9s %s\n' "$name" "$(field rps "$k")" \
               "$kcs core-s/GB" "$(paced_col "$mccs" "$(field req/s "$mc")")" \
               "$(paced_col "$mpcs" "$(field req/s "$mp")")" \
               "$(awk -v a="$kcs" -v b="$mpcs" \
                      'BEGIN { if (a > 0 && b > 0) printf "%.2fx", a / b; else print "-" }')" \
               "$(awk -v a="$mccs" -v b="$mpcs" \
                      'BEGIN { if (a > 0 && b > 0) printf "%.2fx", a / b; else print "-" }')"
    done
fi
[ "$failed" -eq 0 ] || { echo "resp.sh: $failed kvstash row(s) failed" >&2; exit 1; }
exit 0
