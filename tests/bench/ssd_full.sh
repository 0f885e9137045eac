#!/usr/bin/env bash
# ssd_full.sh: the "always full" rows of `make bench` (run.sh calls it after ssd.sh; it also
# runs alone). Puts into a DRAM tier that is full, so that every put evicts, with the SSD
# tier on (the shipped defaults: ssd_offload on_evict) and off, against fio on the same
# directory, in one run, BENCH_REPS times each in alternating order, medians printed:
#   fio      sequential 1 MiB O_DIRECT writes, psync, 1 job, BENCH_FULL_FIO_GIB GiB (then
#            end_fsync): what the disk takes from one thread doing plain synchronous I/O;
#   SSD on   a fresh kvstashd (memory_size BENCH_FULL_MEMORY, ssd_size BENCH_FULL_SSD_SIZE on
#            that directory); kvstash-bench -m put -s 1m -b 8 -c 8 -d 2 four times: warm
#            (every arena page written once, so first-touch faults are not measured), then
#            "before eviction" (-R: remove_all first, then -n requests per connection, 5/8 of
#            memory_size in all: under the high watermark), then a fill (-t 3, not measured,
#            eviction starts), then "steady" (-t BENCH_FULL_SECS, every put evicting): put
#            GB/s and p99 of both, and the SSD tier's write rate in the steady window
#            (ssd_write_bytes read before and after, over the time between), with the
#            objects evicted uncopied (ssd_offload_dropped) in that window;
#   SSD off  the same daemon flags with --ssd_dir= (no SSD tier): before eviction and steady.
# Summary lines: the SSD tier's write rate under eviction against fio's (target >= 90%),
# put p99 steady against before eviction with the SSD tier on (target <= 4x), and with the
# SSD tier off the steady put rate against before eviction (target >= 90%).
# Every command is printed before it runs; every command is bounded by timeout. Exits
# non-zero only if kvstashd dies or fails to start, or a kvstash-bench run fails.
#
# Environment: KVSTASHD, BENCH, KVSTASH_CLI (as run.sh), BENCH_REPS (3), BENCH_SSD_DIR
# (parent directory, default the repo's build/), BENCH_FULL_MEMORY (2g), BENCH_FULL_SSD_SIZE
# (16g), BENCH_FULL_SECS (8), BENCH_FULL_FIO_GIB (4), BENCH_SSD_DAEMON_ARGS (extra flags).
set -u -o pipefail

here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=lib.sh
. "$here/lib.sh"       # die, show, answers_ping, free_port, isnum, median, kvd_stop, ...
bench_paths "$here"    # root, KVSTASHD, BENCH, KVSTASH_CLI
REPS=${BENCH_REPS:-3}
PARENT=${BENCH_SSD_DIR:-$root/build}
MEMORY=${BENCH_FULL_MEMORY:-2g}
SSD_SIZE=${BENCH_FULL_SSD_SIZE:-16g}
SECS=${BENCH_FULL_SECS:-8}
FIO_GIB=${BENCH_FULL_FIO_GIB:-4}
read -r -a EXTRA <<<"${BENCH_SSD_DAEMON_ARGS:-}"
PY=/usr/bin/python3
SHAPE=(-m put -s 1m -b 8 -c 8 -d 2 -q)

[ -x "$KVSTASHD" ] || die "no daemon at $KVSTASHD (run make first)"
[ -x "$BENCH" ] || die "no kvstash-bench at $BENCH (run make first)"
[ -x "$KVSTASH_CLI" ] || die "no kvstash CLI at $KVSTASH_CLI (run make first)"
for v in REPS SECS FIO_GIB; do
    if ! isnum "${!v}" || [ "${!v}" -lt 1 ]; then
        die "$v must be a whole number >= 1"
    fi
done
case "$MEMORY" in
    *g) mem_mib=$(( ${MEMORY%g} * 1024 )) ;;
    *m) mem_mib=${MEMORY%m} ;;
    *) die "BENCH_FULL_MEMORY must be like 2g or 512m" ;;
esac
if ! isnum "$mem_mib" || [ "$mem_mib" -lt 256 ]; then
    die "BENCH_FULL_MEMORY must be at least 256m"
fi
# Before eviction: 5/8 of memory_size in 8 MiB requests over 8 connections.
before_n=$(( mem_mib * 5 / 8 / 64 ))
[ "$before_n" -ge 1 ] || before_n=1

echo "== A full DRAM tier: 1 MiB puts on 8 connections with every put evicting," \
     "SSD tier on (on_evict) and off, fio on the same directory"
mkdir -p "$PARENT" || die "cannot create $PARENT"
dir=$(mktemp -d "$PARENT/bench-full.XXXXXX") || die "mktemp under $PARENT failed"
kvd_pid=""
bench_exit_trap "$dir"

disk_or_skip "$dir" BENCH_SSD_DIR
echo "   directory $dir: $fstype on $(df -P "$dir" | awk 'NR == 2 { print $1 }'); $(nproc)" \
     "cores; memory_size $MEMORY, ssd_size $SSD_SIZE; $REPS runs, alternating, median shown"


have_fio=1
command -v fio >/dev/null || { have_fio=0; echo "   fio: skipped: not installed (make bench installs it)"; }
[ -x "$PY" ] || { have_fio=0; echo "   fio: skipped: no $PY to read its JSON"; }

# fio_w: one fio sequential write run on $dir/fio; prints GB/s (1e9 bytes), or fails.
fio_w() {
    local out
    mkdir -p "$dir/fio"
    show fio --name=seq --directory="$dir/fio" --rw=write --bs=1m --size="${FIO_GIB}g" \
        --direct=1 --ioengine=psync --numjobs=1 --end_fsync=1 --output-format=json >&2
    out=$(timeout 180 fio --name=seq --directory="$dir/fio" --rw=write --bs=1m \
          --size="${FIO_GIB}g" --direct=1 --ioengine=psync --numjobs=1 --end_fsync=1 \
          --output-format=json 2>"$dir/fio.err")
    local rc=$?
    rm -rf "$dir/fio"
    [ "$rc" = 0 ] || return 1
    "$PY" -c 'import json, sys
print("%.3f" % (json.loads(sys.stdin.read())["jobs"][0]["write"]["bw_bytes"] / 1e9))' <<<"$out"
}

port=""
stats() { "$KVSTASH_CLI" -H "127.0.0.1:$port" -t 2000 stats --raw 2>/dev/null; }
stat_of() { awk -v k="$1" '$1 == k { print $2 }' <<<"$2"; }

kvd_start() {     # kvd_start SSD_FLAG...: a fresh daemon on $dir/kv (a new port if one was taken)
    local cmd try
    for try in 1 2 3 4 5; do
        rm -rf "$dir/kv"
        mkdir -p "$dir/kv/data"
        port=$(free_port) || die "no free loopback port"
        cmd=("$KVSTASHD" --listen="127.0.0.1:$port" --data_dir="$dir/kv/data" --unix_socket=none
             --metrics_listen= --memory_size="$MEMORY" "$@" "${EXTRA[@]}")
        show "${cmd[@]}"
        "${cmd[@]}" >>"$dir/kvstashd.log" 2>&1 &
        kvd_pid=$!
        if answers_ping "$KVSTASH_CLI" "$port" "$kvd_pid" 3000 0.01; then
            return 0
        fi
        kill -9 "$kvd_pid" 2>/dev/null
        wait "$kvd_pid" 2>/dev/null
        kvd_pid=""
        grep -q "Address already in use" "$dir/kvstashd.log" || break
        echo "   port $port was taken meanwhile; again on another (try $try)"
        : >"$dir/kvstashd.log"
    done
    echo "ssd_full.sh: kvstashd did not start; last lines of its log:" >&2
    tail -n 20 "$dir/kvstashd.log" >&2
    exit 1
}

bench() {       # bench ARGS...: one kvstash-bench run; its result line, or exit on failure
    local out
    show "$BENCH" -H "127.0.0.1:$port" "${SHAPE[@]}" "$@" >&2
    out=$(timeout 300 "$BENCH" -H "127.0.0.1:$port" "${SHAPE[@]}" "$@") || {
        echo "ssd_full.sh: kvstash-bench failed" >&2
        tail -n 20 "$dir/kvstashd.log" >&2
        exit 1
    }
    [ "$(field errors "$out")" = 0 ] || { echo "ssd_full.sh: errors: $out" >&2; exit 1; }
    echo "$out"
}

# one_daemon LABEL SSD_FLAGS...: the four runs on a fresh daemon; appends to the arrays
# named LABEL_before_gbs, LABEL_before_p99, LABEL_steady_gbs, LABEL_steady_p99 (and for the
# SSD tier ssd_w, dropped).
one_daemon() {
    local label=$1 before steady s0 s1 t0 t1 w d0 d1
    shift
    kvd_start "$@"
    bench -n "$before_n" >/dev/null                 # warm: every page written once
    before=$(bench -R -n "$before_n")
    bench -t 3 >/dev/null                           # fill: eviction starts
    s0=$(stats)
    t0=$(now_ns)
    steady=$(bench -t "$SECS")
    t1=$(now_ns)
    s1=$(stats)
    kill -0 "$kvd_pid" 2>/dev/null || { echo "ssd_full.sh: kvstashd died" >&2; exit 1; }
    eval "${label}_before_gbs+=(\"$(field GB/s "$before")\")"
    eval "${label}_before_p99+=(\"$(field p99_us "$before")\")"
    eval "${label}_steady_gbs+=(\"$(field GB/s "$steady")\")"
    eval "${label}_steady_p99+=(\"$(field p99_us "$steady")\")"
    printf '   %s: before eviction %s GB/s p99 %s us; steady %s GB/s p99 %s us' "$label" \
        "$(field GB/s "$before")" "$(field p99_us "$before")" "$(field GB/s "$steady")" \
        "$(field p99_us "$steady")"
    if [ "$label" = on ]; then
        w=$(awk -v a="$(stat_of ssd_write_bytes "$s0")" -v b="$(stat_of ssd_write_bytes "$s1")" \
            -v ns=$(( t1 - t0 )) 'BEGIN { printf "%.3f", (b - a) / ns }')
        ssd_w+=("$w")
        d0=$(stat_of ssd_offload_dropped "$s0") d1=$(stat_of ssd_offload_dropped "$s1")
        dropped+=("$(( ${d1:-0} - ${d0:-0} ))")
        printf '; SSD writes %s GB/s, %s objects evicted uncopied' "$w" "${dropped[-1]}"
    fi
    echo
    kvd_stop
}

fio_gbs=() ssd_w=() dropped=()
on_before_gbs=() on_before_p99=() on_steady_gbs=() on_steady_p99=()
off_before_gbs=() off_before_p99=() off_steady_gbs=() off_steady_p99=()
run_fio() {
    local w
    [ "$have_fio" = 1 ] || return 0
    if w=$(fio_w); then
        echo "   fio: write $w GB/s"
        fio_gbs+=("$w")
    else
        echo "   fio write FAILED: $(tail -n 3 "$dir/fio.err" | tr '\n' ' ')"
    fi
}
for rep in $(seq 1 "$REPS"); do
    echo "-- run $rep of $REPS"
    if [ $(( rep % 2 )) = 1 ]; then
        run_fio
        one_daemon on --ssd_dir="$dir/kv/ssd" --ssd_size="$SSD_SIZE"
        one_daemon off --ssd_dir=
    else
        one_daemon off --ssd_dir=
        one_daemon on --ssd_dir="$dir/kv/ssd" --ssd_size="$SSD_SIZE"
        run_fio
    fi
done

ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (a != "" && b != "" && b > 0) printf "%.2f", a / b; else print "" }'; }
pct() { if [ -n "$1" ]; then awk -v x="$1" 'BEGIN { printf "%.0f%%", 100 * x }'; else echo "-"; fi; }
verdict() { awk -v x="$1" -v t="$2" -v dir="$3" 'BEGIN { if (x == "") print "-";
    else if ((dir == "ge" && x >= t) || (dir == "le" && x <= t)) print "met"; else print "missed" }'; }

fw=$(median "${fio_gbs[@]}")
sw=$(median "${ssd_w[@]}")
ob=$(median "${on_before_gbs[@]}") os=$(median "${on_steady_gbs[@]}")
obp=$(median "${on_before_p99[@]}") osp=$(median "${on_steady_p99[@]}")
fb=$(median "${off_before_gbs[@]}") fs=$(median "${off_steady_gbs[@]}")
fbp=$(median "${off_before_p99[@]}") fsp=$(median "${off_steady_p99[@]}")
r_w=$(ratio "$sw" "$fw") r_p=$(ratio "$osp" "$obp") r_off=$(ratio "$fs" "$fb")
echo
echo "A full DRAM tier ($MEMORY), 1 MiB puts, 8 connections, median of $REPS runs:"
printf '   SSD on:  puts %s GB/s (before eviction %s), p99 %s us (before %s: %sx, target <= 4x: %s)\n' \
    "$os" "$ob" "$osp" "$obp" "$r_p" "$(verdict "$r_p" 4 le)"
printf '   SSD on:  SSD writes under eviction %s GB/s, fio %s GB/s: %s (target >= 90%%: %s);' \
    "$sw" "${fw:--}" "$(pct "$r_w")" "$(verdict "$r_w" 0.90 ge)"
printf ' evicted uncopied %s objects a run\n' "$(median "${dropped[@]}")"
printf '   SSD off: puts %s GB/s, before eviction %s: %s (target >= 90%%: %s); p99 %s us' \
    "$fs" "$fb" "$(pct "$r_off")" "$(verdict "$r_off" 0.90 ge)" "$fsp"
printf ' (before %s)\n' "$fbp"
