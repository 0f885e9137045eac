#!/usr/bin/env bash
# ssd.sh: the SSD section of `make bench` (run.sh calls it; it also runs alone).
#
# On one directory of a real disk (default: a mktemp directory under the repo's build/;
# refused on tmpfs/ramfs, where O_DIRECT and the page cache would make it meaningless) and
# in one run, BENCH_REPS times each, medians printed:
#   fio      sequential 1 MiB O_DIRECT writes (then end_fsync) and reads, psync, 1 job:
#            what one thread doing plain synchronous I/O gets from the device;
#   kvstashd SSD writes: a fresh daemon with little DRAM (256m) and ssd_offload=write_through
#            takes N distinct 1 MiB objects from kvstash-bench (batch_put); GB/s is N MiB over
#            the time from the first put to the stats showing ssd_writes == N with an empty
#            offload queue (every object written, fdatasync'ed and indexed);
#   kvstashd SSD reads: the daemon is restarted on that data (nothing in DRAM, page cache
#            dropped) with ssd_promote=off and kvstash-bench batch_gets every object once
#            (-N: no preload, -i: the keys of the put run); ssd_hits must grow by the objects
#            read, so the bytes really came from the SSD (O_DIRECT, no page cache).
# Every command is printed before it runs; every loop and command is bounded, and the whole
# section stops starting new runs after BENCH_SSD_BUDGET seconds. fio's files and the
# daemon's data are removed after each run. Exits non-zero only if kvstashd dies or fails
# to start, or a kvstash-bench run fails; a missing fio is reported and its side skipped.
#
# Environment: KVSTASHD, BENCH, KVSTASH_CLI (as run.sh), BENCH_REPS (3), BENCH_SSD_GIB
# (data per run, 4), BENCH_SSD_DIR (parent directory, default the repo's build/),
# BENCH_SSD_BUDGET (240), BENCH_SSD_CONNS (2), BENCH_SSD_DEPTH (4), BENCH_SSD_BATCH (8),
# BENCH_SSD_DAEMON_ARGS (extra kvstashd flags, e.g. --ssd_io_threads=4).
set -u -o pipefail

here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
KVSTASHD=${KVSTASHD:-$root/build/release/kvstashd}
BENCH=${BENCH:-$root/build/release/kvstash-bench}
KVSTASH_CLI=${KVSTASH_CLI:-$(dirname "$BENCH")/kvstash}
REPS=${BENCH_REPS:-3}
GIB=${BENCH_SSD_GIB:-4}
PARENT=${BENCH_SSD_DIR:-$root/build}
BUDGET=${BENCH_SSD_BUDGET:-240}
CONNS=${BENCH_SSD_CONNS:-2}
DEPTH=${BENCH_SSD_DEPTH:-4}
BATCH=${BENCH_SSD_BATCH:-8}
read -r -a EXTRA <<<"${BENCH_SSD_DAEMON_ARGS:-}"
PY=/usr/bin/python3
MIB=1048576

die() { echo "ssd.sh: $*" >&2; exit 1; }
show() { printf '$'; printf ' %q' "$@"; printf '\n'; }
isnum() { case "$1" in ''|*[!0-9]*) return 1 ;; esac; }

[ -x "$KVSTASHD" ] || die "no daemon at $KVSTASHD (run make first)"
[ -x "$BENCH" ] || die "no kvstash-bench at $BENCH (run make first)"
[ -x "$KVSTASH_CLI" ] || die "no kvstash CLI at $KVSTASH_CLI (run make first)"
for v in REPS GIB BUDGET CONNS DEPTH BATCH; do
    if ! isnum "${!v}" || [ "${!v}" -lt 1 ]; then
        die "$v must be a whole number >= 1"
    fi
done
N=$(( GIB * 1024 ))                     # objects of 1 MiB per run
per_conn=$(( N / CONNS ))
if [ $(( N % CONNS )) != 0 ] || [ $(( per_conn % BATCH )) != 0 ]; then
    die "BENCH_SSD_GIB*1024 must divide into BENCH_SSD_CONNS x BENCH_SSD_BATCH"
fi
reqs=$(( per_conn / BATCH ))            # requests per connection
ssd_size=$(( GIB * 2 + 2 ))g            # far from the 0.9 high watermark: no SSD eviction

echo "== SSD tier: fio and kvstashd on the same directory, $GIB GiB per run, 1 MiB objects"
mkdir -p "$PARENT" || die "cannot create $PARENT"
dir=$(mktemp -d "$PARENT/bench-ssd.XXXXXX") || die "mktemp under $PARENT failed"
kvd_pid=""
# shellcheck disable=SC2317  # invoked by the EXIT trap
cleanup() {
    if [ -n "$kvd_pid" ] && kill "$kvd_pid" 2>/dev/null; then
        wait "$kvd_pid" 2>/dev/null
    fi
    rm -rf "$dir"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

fstype=$(stat -f -c %T "$dir")
case "$fstype" in
    tmpfs|ramfs)
        echo "   skipped: $dir is on $fstype, not a disk (set BENCH_SSD_DIR to a directory on one)"
        exit 0 ;;
esac
avail_kb=$(df -Pk "$dir" | awk 'NR == 2 { print $4 }')
need_kb=$(( (GIB * 1100 + 512) * 1024 ))
if ! isnum "${avail_kb:-}" || [ "$avail_kb" -lt "$need_kb" ]; then
    echo "   skipped: $dir has ${avail_kb:-?} KiB free, the runs need about $need_kb KiB"
    exit 0
fi
dev=$(df -P "$dir" | awk 'NR == 2 { print $1 }')
echo "   directory $dir: $fstype on $dev, ${avail_kb} KiB free; $(nproc) cores;" \
     "$REPS runs, median shown"

# drop_caches: write back and drop the page cache (root only; failure is fine: all I/O
# measured here is O_DIRECT anyway).
drop_caches() {
    sync
    echo 3 >/proc/sys/vm/drop_caches 2>/dev/null || true
}

now_ns() { date +%s%N; }
gbs() { awk -v b="$1" -v ns="$2" 'BEGIN { if (ns > 0) printf "%.3f", b / ns; else print "?" }'; }
median() { printf '%s\n' "$@" | sort -g | awk '{ l[NR] = $1 } END { if (NR) print l[int((NR + 1) / 2)] }'; }
field() { echo "$2" | tr ' ' '\n' | awk -F= -v k="$1" '$1 == k { print $2 }'; }

# ---- fio ----
have_fio=1
if ! command -v fio >/dev/null; then
    have_fio=0
    echo "   fio: skipped: not installed (make bench installs it: BENCH_PKGS in the Makefile)"
elif [ ! -x "$PY" ]; then
    have_fio=0
    echo "   fio: skipped: no $PY to read its JSON"
fi

# fio_bw RW: one fio run on $dir/fio; prints the bandwidth in GB/s (1e9 bytes), or fails.
fio_bw() {
    local rw=$1 out
    out=$(timeout 180 fio --name=seq --directory="$dir/fio" --rw="$rw" --bs=1m --size="${GIB}g" \
          --direct=1 --ioengine=psync --numjobs=1 --end_fsync=1 --output-format=json \
          2>"$dir/fio.err") || return 1
    "$PY" -c 'import json, sys
j = json.loads(sys.stdin.read())
print("%.3f" % (j["jobs"][0][sys.argv[1]]["bw_bytes"] / 1e9))' "$rw" <<<"$out"
}

# ---- kvstashd ----
port=""
free_port() {
    local p
    for _ in $(seq 1 50); do
        p=$(( 20000 + RANDOM % 40000 ))
        if ! (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null; then
            echo "$p"
            return 0
        fi
    done
    return 1
}

kvd_died() {
    echo "ssd.sh: kvstashd (pid ${kvd_pid:-?}) died; last lines of its log:" >&2
    tail -n 20 "$dir/kvstashd.log" >&2
    kvd_pid=""
    exit 1
}

kvd_alive() { [ -n "$kvd_pid" ] && kill -0 "$kvd_pid" 2>/dev/null; }

# stats: all counters, 'name value' a line.
stats() { "$KVSTASH_CLI" -H "127.0.0.1:$port" -t 2000 stats 2>/dev/null; }
stat_of() { awk -v k="$1" '$1 == k { print $2 }' <<<"$2"; }

# kvd_start: kvstashd on $dir/kv with the SSD tier; waits until it answers and its arena is
# populated.
kvd_start() {
    local cmd up s
    port=$(free_port) || die "no free loopback port"
    mkdir -p "$dir/kv/data"
    cmd=("$KVSTASHD" --listen="127.0.0.1:$port" --data_dir="$dir/kv/data"
         --unix_socket="$dir/kv/data/kvstashd.sock" --memory_size=256m
         --ssd_dir="$dir/kv/ssd" --ssd_size="$ssd_size" --ssd_offload=write_through
         --ssd_promote=off "${EXTRA[@]}")
    [ "${1:-}" = quiet ] || show "${cmd[@]}"
    "${cmd[@]}" >>"$dir/kvstashd.log" 2>&1 &
    kvd_pid=$!
    up=0
    for _ in $(seq 1 100); do
        kvd_alive || kvd_died
        if "$KVSTASH_CLI" -H "127.0.0.1:$port" -t 1000 ping >/dev/null 2>&1; then
            up=1
            break
        fi
        sleep 0.1
    done
    [ "$up" = 1 ] || { echo "ssd.sh: kvstashd did not answer within 10 s" >&2; exit 1; }
    for _ in $(seq 1 100); do
        s=$(stats)
        [ -n "$(stat_of memory_prefaulted "$s")" ] &&
            [ "$(stat_of memory_prefaulted "$s")" = "$(stat_of memory_capacity "$s")" ] && break
        sleep 0.1
    done
}

kvd_stop() {
    local pid=$kvd_pid
    [ -n "$pid" ] || return 0
    kill "$pid" 2>/dev/null
    for _ in $(seq 1 300); do
        kill -0 "$pid" 2>/dev/null || break
        sleep 0.1
    done
    if kill -0 "$pid" 2>/dev/null; then
        echo "ssd.sh: kvstashd did not exit within 30 s of SIGTERM; killing it" >&2
        kill -9 "$pid" 2>/dev/null
    fi
    wait "$pid" 2>/dev/null
    kvd_pid=""
}

fio_w=() fio_r=() kv_w=() kv_r=() ratio_w=() ratio_r=()
failures=0
t_section=$SECONDS
put_args=(-m put -s 1m -b "$BATCH" -c "$CONNS" -d "$DEPTH" -n "$reqs" -q)
get_args=(-m get -s 1m -b "$BATCH" -c "$CONNS" -d "$DEPTH" -n "$reqs" -k "$per_conn" -N -q)

for rep in $(seq 1 "$REPS"); do
    if [ $(( SECONDS - t_section )) -ge "$BUDGET" ]; then
        echo "   run $rep and later: skipped, the section is past its ${BUDGET}s budget"
        break
    fi
    echo "-- run $rep"
    w="" r=""
    fw_rep="" fr_rep=""
    if [ "$have_fio" = 1 ]; then
        mkdir -p "$dir/fio"
        drop_caches
        if [ "$rep" = 1 ]; then
            show fio --name=seq --directory="$dir/fio" --rw=write --bs=1m --size="${GIB}g" \
                --direct=1 --ioengine=psync --numjobs=1 --end_fsync=1 --output-format=json
            echo "   (then the same with --rw=read; the page cache is dropped before each)"
        fi
        if w=$(fio_bw write); then
            drop_caches
            if r=$(fio_bw read); then
                echo "   fio: write $w GB/s, read $r GB/s"
                fio_w+=("$w")
                fio_r+=("$r")
                fw_rep=$w fr_rep=$r
            else
                echo "   fio read FAILED: $(tail -n 3 "$dir/fio.err" | tr '\n' ' ')"
            fi
        else
            echo "   fio write FAILED: $(tail -n 3 "$dir/fio.err" | tr '\n' ' ')"
        fi
        rm -rf "$dir/fio"
    fi

    # kvstashd writes
    rm -rf "$dir/kv"
    drop_caches
    id="ssd$rep"
    quiet=""
    [ "$rep" = 1 ] || quiet=quiet
    kvd_start $quiet
    if [ "$rep" = 1 ]; then
        show "$BENCH" -H "127.0.0.1:$port" "${put_args[@]}" -i "$id"
        echo "   (then stats every 10 ms until ssd_writes == $N and ssd_offload_queue == 0)"
    fi
    t0=$(now_ns)
    out=$(timeout 180 "$BENCH" -H "127.0.0.1:$port" "${put_args[@]}" -i "$id" 2>"$dir/bench.err")
    rc=$?
    kvd_alive || { cat "$dir/bench.err" >&2; kvd_died; }
    if [ "$rc" -ne 0 ] || [ -z "$out" ]; then
        echo "   kvstashd put FAILED (exit $rc): $(tr '\n' ' ' <"$dir/bench.err") $out"
        failures=$(( failures + 1 ))
        kvd_stop
        continue
    fi
    done_w=0
    deadline=$(( $(now_ns) + 120000000000 ))
    while [ "$(now_ns)" -lt "$deadline" ]; do
        s=$(stats)
        writes=$(stat_of ssd_writes "$s")
        queue=$(stat_of ssd_offload_queue "$s")
        failed=$(stat_of ssd_write_failed "$s")
        if isnum "${writes:-}" && [ "$writes" -ge "$N" ] && [ "${queue:-}" = 0 ]; then
            done_w=1
            break
        fi
        if isnum "${failed:-}" && [ "$failed" -gt 0 ]; then
            break
        fi
        sleep 0.01
    done
    t1=$(now_ns)
    kvd_alive || kvd_died
    if [ "$done_w" != 1 ]; then
        echo "   kvstashd SSD writes did not finish: ssd_writes ${writes:-?} of $N," \
             "ssd_offload_queue ${queue:-?}, ssd_write_failed ${failed:-?}"
        failures=$(( failures + 1 ))
        kvd_stop
        continue
    fi
    w=$(gbs $(( N * MIB )) $(( t1 - t0 )))
    syncs=$(stat_of ssd_syncs "$s")
    echo "   kvstashd write: $w GB/s ($N objects on the SSD in $(( (t1 - t0) / 1000000 )) ms;" \
         "clients' put rate $(field GB/s "$out") GB/s; $syncs group commits," \
         "$(( N / (syncs > 0 ? syncs : 1) )) objects each)"
    kv_w+=("$w")
    if [ -n "$fw_rep" ]; then
        ratio_w+=("$(awk -v k="$w" -v f="$fw_rep" 'BEGIN { printf "%.3f", k / f }')")
    fi

    # kvstashd reads, after a restart: nothing is in DRAM
    kvd_stop
    drop_caches
    kvd_start quiet
    s=$(stats)
    start_objects=$(stat_of ssd_start_objects "$s")
    hits0=$(stat_of ssd_hits "$s")
    rb0=$(stat_of ssd_read_bytes "$s")
    dram0=$(stat_of dram_objects "$s")
    if [ "$rep" = 1 ]; then
        echo "   (kvstashd restarted on the same directories, the page cache dropped)"
        show "$BENCH" -H "127.0.0.1:$port" "${get_args[@]}" -i "$id" -p "$kvd_pid"
    fi
    out=$(timeout 180 "$BENCH" -H "127.0.0.1:$port" "${get_args[@]}" -i "$id" -p "$kvd_pid" \
          2>"$dir/bench.err")
    rc=$?
    kvd_alive || { cat "$dir/bench.err" >&2; kvd_died; }
    if [ "$rc" -ne 0 ] || [ -z "$out" ]; then
        echo "   kvstashd get FAILED (exit $rc): $(tr '\n' ' ' <"$dir/bench.err") $out"
        failures=$(( failures + 1 ))
        kvd_stop
        continue
    fi
    s=$(stats)
    hits=$(( $(stat_of ssd_hits "$s") - hits0 ))
    rbytes=$(( $(stat_of ssd_read_bytes "$s") - rb0 ))
    cached="?"
    if command -v fincore >/dev/null; then
        cached=$(fincore -b -n -o RES "$dir"/kv/ssd/*.kvb 2>/dev/null | awk '{ s += $1 } END { print s + 0 }')
    fi
    misses=$(field misses "$out")
    got=$(( N - misses ))
    r=$(field GB/s "$out")
    echo "   kvstashd read: $r GB/s ($got objects in $(field secs "$out") s, p99" \
         "$(field p99_us "$out") us, daemon $(field daemon_core_s_per_GB "$out") core-s/GB;" \
         "ssd_hits +$hits, ssd_read_bytes +$rbytes, $dram0 in DRAM at the start, $cached bytes" \
         "of the bucket files in the page cache after)"
    if [ "$hits" -lt "$got" ]; then
        echo "   WARNING: ssd_hits grew by $hits but $got objects were read: some did not come" \
             "from the SSD"
    fi
    if [ "${start_objects:-0}" -lt "$N" ] || [ "$misses" -gt 0 ]; then
        echo "   WARNING: the restarted daemon indexed ${start_objects:-?} of the $N objects" \
             "written and $misses gets missed: objects were lost across the restart" \
             "(GB/s counts the bytes of the objects found)"
    fi
    if [ "$hits" -gt "$got" ]; then
        echo "   note: $(( hits - got )) loads more than objects read: some objects were read" \
             "from the SSD twice (loaded, evicted before their request was answered, loaded again)"
    fi
    kv_r+=("$r")
    if [ -n "$fr_rep" ]; then
        ratio_r+=("$(awk -v k="$r" -v f="$fr_rep" 'BEGIN { printf "%.3f", k / f }')")
    fi
    kvd_stop
    rm -rf "$dir/kv"
done

# ---- summary ----
fw=$(median "${fio_w[@]}") fr=$(median "${fio_r[@]}")
kw=$(median "${kv_w[@]}") kr=$(median "${kv_r[@]}")
ratio() {
    if [ -n "$1" ] && [ -n "$2" ]; then
        awk -v k="$1" -v f="$2" 'BEGIN { if (f > 0) printf "%.0f%%", 100 * k / f; else print "-" }'
    else
        echo "-"
    fi
}
pct() { if [ -n "$1" ]; then awk -v x="$1" 'BEGIN { printf "%.0f%%", 100 * x }'; else echo "-"; fi; }
rw=$(median "${ratio_w[@]}") rr=$(median "${ratio_r[@]}")
echo
echo "SSD tier, $GIB GiB of 1 MiB objects per run, median of ${#kv_w[@]} (fio ${#fio_w[@]}) runs" \
     "($fstype on $dev):"
row() { printf '%-16s %-30s %-18s %-7s %-20s %s\n' "$@"; }
row "" "fio psync 1 MiB direct, 1 job" "kvstashd SSD tier" "ratio" \
       "median run's ratio" "target"
row "sequential write" "${fw:--} GB/s" "${kw:--} GB/s" "$(ratio "$kw" "$fw")" \
       "$(pct "$rw")" ">= 70%"
row "read" "${fr:--} GB/s" "${kr:--} GB/s" "$(ratio "$kr" "$fr")" "$(pct "$rr")" \
       ">= 70%"
echo "(kvstashd write: first put to all $N objects written, synced and indexed;" \
     "read: batch_get of $BATCH x 1 MiB, $CONNS conns, depth $DEPTH, after a restart)"
echo "SSD section took $(( SECONDS - t_section )) s"
if [ "$failures" -gt 0 ]; then
    echo "ssd.sh: $failures kvstashd run(s) failed" >&2
    exit 1
fi
exit 0
