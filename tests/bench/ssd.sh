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
#            read, so the bytes really came from the SSD (O_DIRECT, no page cache);
#   DRAM probes under SSD reads: on that daemon, batch_is_exist of 128 keys (1 conn, depth 1,
#            4096 small keys put first) for BENCH_SSD_EXISTS_SECS alone, then again while a
#            second kvstash-bench batch_gets the 1 MiB objects from the SSD; p50/p99 of both;
# and once, after those runs:
#   restart: a fresh daemon takes BENCH_SSD_RESTART_OBJECTS distinct 64-byte objects
#            (each takes 8 KiB of disk: a 4 KiB header block and the value padded to 4 KiB)
#            from ssd_keys.py (batch_put of 1000, 4 in flight, 77-byte KV-cache-style keys
#            in hash order; BENCH_SSD_RESTART_KEYS=short, or no python3-msgpack: kvstash-bench
#            and its 25-byte counter keys), written and indexed (ssd_writes == N, empty
#            queue), then kill -9; then BENCH_REPS times: restarted with the page cache
#            dropped (cold, as after a reboot; root only) and once more right after (warm,
#            the index file still cached, as after a crash), each ended by kill -9: time
#            from exec to the first answered ping, ssd_start_ms and ssd_start_objects (must
#            be N), and after the cold start every key probed (batch_is_exist), the first
#            1000 values and 8 keys spread over the range read back and compared. Scaled
#            down, with a note, when the disk has not room for twice the data.
# Every command is printed before it runs; every loop and command is bounded, and the whole
# section stops starting new runs after BENCH_SSD_BUDGET seconds. fio's files and the
# daemon's data are removed after each run. Exits non-zero only if kvstashd dies or fails
# to start, a kvstash-bench run fails, or restarted objects are missing or differ; a
# missing fio is reported and its side skipped.
#
# Environment: KVSTASHD, BENCH, KVSTASH_CLI (as run.sh), BENCH_REPS (3), BENCH_SSD_GIB
# (data per run, 4), BENCH_SSD_DIR (parent directory, default the repo's build/),
# BENCH_SSD_BUDGET (360), BENCH_SSD_CONNS (2), BENCH_SSD_DEPTH (4), BENCH_SSD_BATCH (8),
# BENCH_SSD_EXISTS_SECS (5; 0 skips the probes under SSD reads), BENCH_SSD_RESTART_OBJECTS
# (1000000; 0 skips the restart test; a multiple of 1000 from 1000 up),
# BENCH_SSD_RESTART_KEYS (long: ssd_keys.py's 77-byte keys; short: kvstash-bench's 25-byte),
# BENCH_SSD_DAEMON_ARGS (extra kvstashd flags, e.g. --ssd_io_threads=4).
set -u -o pipefail

here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=lib.sh
. "$here/lib.sh"       # die, show, answers_ping, free_port, isnum, median, kvd_stop, ...
bench_paths "$here"    # root, KVSTASHD, BENCH, KVSTASH_CLI
REPS=${BENCH_REPS:-3}
GIB=${BENCH_SSD_GIB:-4}
PARENT=${BENCH_SSD_DIR:-$root/build}
BUDGET=${BENCH_SSD_BUDGET:-360}
CONNS=${BENCH_SSD_CONNS:-2}
DEPTH=${BENCH_SSD_DEPTH:-4}
BATCH=${BENCH_SSD_BATCH:-8}
EXSECS=${BENCH_SSD_EXISTS_SECS:-5}
RN=${BENCH_SSD_RESTART_OBJECTS:-1000000}
RKEYS=${BENCH_SSD_RESTART_KEYS:-long}
read -r -a EXTRA <<<"${BENCH_SSD_DAEMON_ARGS:-}"
PY=/usr/bin/python3
MIB=1048576

[ -x "$KVSTASHD" ] || die "no daemon at $KVSTASHD (run make first)"
[ -x "$BENCH" ] || die "no kvstash-bench at $BENCH (run make first)"
[ -x "$KVSTASH_CLI" ] || die "no kvstash CLI at $KVSTASH_CLI (run make first)"
for v in REPS GIB BUDGET CONNS DEPTH BATCH; do
    if ! isnum "${!v}" || [ "${!v}" -lt 1 ]; then
        die "$v must be a whole number >= 1"
    fi
done
for v in EXSECS RN; do
    isnum "${!v}" || die "$v must be a whole number"
done
if [ $(( RN % 1000 )) != 0 ]; then
    die "BENCH_SSD_RESTART_OBJECTS must be 0 or a multiple of 1000"
fi
case "$RKEYS" in
    long|short) ;;
    *) die "BENCH_SSD_RESTART_KEYS must be long or short" ;;
esac
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
bench_exit_trap "$dir"

disk_or_skip "$dir" BENCH_SSD_DIR
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

gbs() { awk -v b="$1" -v ns="$2" 'BEGIN { if (ns > 0) printf "%.3f", b / ns; else print "?" }'; }

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

kvd_died() {
    echo "ssd.sh: kvstashd (pid ${kvd_pid:-?}) died; last lines of its log:" >&2
    tail -n 20 "$dir/kvstashd.log" >&2
    kvd_pid=""
    exit 1
}

kvd_alive() { [ -n "$kvd_pid" ] && kill -0 "$kvd_pid" 2>/dev/null; }

# stats: all counters, 'name value' a line.
stats() { "$KVSTASH_CLI" -H "127.0.0.1:$port" -t 2000 stats --raw 2>/dev/null; }
stat_of() { awk -v k="$1" '$1 == k { print $2 }' <<<"$2"; }

# kvd_start: kvstashd on $kvroot with the SSD tier (ssd_size $ssd_size, extra flags kv_more);
# waits until it answers (kvd_up_ms: from exec to the first answered ping, polled every
# 10 ms) and its arena is populated.
kvroot=$dir/kv
kv_more=()
kvd_up_ms=""
kvd_start() {
    local cmd up s t0
    port=$(free_port) || die "no free loopback port"
    mkdir -p "$kvroot/data"
    cmd=("$KVSTASHD" --listen="127.0.0.1:$port" --data_dir="$kvroot/data"
         --unix_socket="$kvroot/data/kvstashd.sock" --memory_size=256m --metrics_listen=
         --ssd_dir="$kvroot/ssd" --ssd_size="$ssd_size" "${kv_more[@]}"
         --ssd_offload=write_through --ssd_promote=off "${EXTRA[@]}")
    [ "${1:-}" = quiet ] || show "${cmd[@]}"
    t0=$(now_ns)
    "${cmd[@]}" >>"$dir/kvstashd.log" 2>&1 &
    kvd_pid=$!
    answers_ping "$KVSTASH_CLI" "$port" "$kvd_pid" 3000 0.01
    up=$?
    kvd_up_ms=$(( ($(now_ns) - t0) / 1000000 ))
    kvd_alive || kvd_died
    [ "$up" = 0 ] || { echo "ssd.sh: kvstashd did not answer within 30 s" >&2; exit 1; }
    for _ in $(seq 1 100); do
        s=$(stats)
        [ -n "$(stat_of memory_prefaulted "$s")" ] &&
            [ "$(stat_of memory_prefaulted "$s")" = "$(stat_of memory_capacity "$s")" ] && break
        sleep 0.1
    done
}

# kvd_kill9: end the daemon with SIGKILL (a crash: nothing is flushed or closed).
kvd_kill9() {
    [ -n "$kvd_pid" ] || return 0
    kill -9 "$kvd_pid" 2>/dev/null
    wait "$kvd_pid" 2>/dev/null
    kvd_pid=""
}

fio_w=() fio_r=() kv_w=() kv_r=() ratio_w=() ratio_r=()
ex_b50=() ex_b99=() ex_d50=() ex_d99=() ex_diff=() ex_hits=()
failures=0
t_section=$SECONDS
# -t 150: they end by count (-n), not by kvstash-bench's default 5 s, which a slow moment
# of the disk outlasts (the put then stopped short of N objects and the run failed)
put_args=(-m put -s 1m -b "$BATCH" -c "$CONNS" -d "$DEPTH" -n "$reqs" -t 150 -q)
get_args=(-m get -s 1m -b "$BATCH" -c "$CONNS" -d "$DEPTH" -n "$reqs" -k "$per_conn" -N -t 150
          -q)

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
             "ssd_offload_queue ${queue:-?}, ssd_write_failed ${failed:-?}," \
             "objects $(stat_of objects "$s")"
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

    # DRAM probes alone, then under SSD reads (same daemon; the 1 MiB objects are on SSD only)
    if [ "$EXSECS" -gt 0 ]; then
        pre_args=(-H "127.0.0.1:$port" -m exists -b 128 -c 1 -d 1 -k 4096 -n 1 -i "ex$rep" -q)
        ex_args=(-H "127.0.0.1:$port" -m exists -b 128 -c 1 -d 1 -k 4096 -t "$EXSECS"
                 -i "ex$rep" -N -q)
        load_args=(-H "127.0.0.1:$port" -m get -s 1m -b "$BATCH" -c "$CONNS" -d "$DEPTH"
                   -k "$per_conn" -N -i "$id" -t $(( EXSECS + 2 )) -q)
        if [ "$rep" = 1 ]; then
            echo "   (DRAM probes: 4096 keys of 64 B put first, until the offload queue is empty;"
            echo "    then the probes alone; then the SSD load and, 1 s later, the probes again)"
            show "$BENCH" "${pre_args[@]}"
            show "$BENCH" "${ex_args[@]}"
            show "$BENCH" "${load_args[@]}"
        fi
        base=""
        timeout 60 "$BENCH" "${pre_args[@]}" >/dev/null 2>"$dir/bench.err"
        rc=$?
        if [ "$rc" = 0 ]; then
            for _ in $(seq 1 300); do
                [ "$(stat_of ssd_offload_queue "$(stats)")" = 0 ] && break
                sleep 0.1
            done
            base=$(timeout $(( EXSECS + 60 )) "$BENCH" "${ex_args[@]}" 2>"$dir/bench.err")
            rc=$?
        fi
        kvd_alive || { cat "$dir/bench.err" >&2; kvd_died; }
        if [ "$rc" -ne 0 ] || [ -z "$base" ]; then
            echo "   DRAM probes FAILED (exit $rc): $(tr '\n' ' ' <"$dir/bench.err") $base"
            failures=$(( failures + 1 ))
            kvd_stop
            rm -rf "$dir/kv"
            continue
        fi
        timeout $(( EXSECS + 60 )) "$BENCH" "${load_args[@]}" >"$dir/load.out" 2>"$dir/load.err" &
        load_pid=$!
        sleep 1
        s=$(stats)
        lh0=$(stat_of ssd_hits "$s")
        during=$(timeout $(( EXSECS + 60 )) "$BENCH" "${ex_args[@]}" 2>"$dir/bench.err")
        rc=$?
        s=$(stats)
        lh1=$(stat_of ssd_hits "$s")
        wait "$load_pid"
        lrc=$?
        kvd_alive || { cat "$dir/bench.err" "$dir/load.err" >&2; kvd_died; }
        if [ "$rc" -ne 0 ] || [ -z "$during" ] || [ "$lrc" -ne 0 ]; then
            echo "   DRAM probes under SSD reads FAILED (probes exit $rc, load exit $lrc):" \
                 "$(cat "$dir/bench.err" "$dir/load.err" | tr '\n' ' ') $during"
            failures=$(( failures + 1 ))
            kvd_stop
            rm -rf "$dir/kv"
            continue
        fi
        bp50=$(field p50_us "$base") bp99=$(field p99_us "$base")
        dp50=$(field p50_us "$during") dp99=$(field p99_us "$during")
        lhits=$(( lh1 - lh0 ))
        echo "   DRAM batch_is_exist 128 keys: alone p50 $bp50 us, p99 $bp99 us," \
             "$(field keys/s "$base") keys/s; during SSD reads p50 $dp50 us, p99 $dp99 us," \
             "$(field keys/s "$during") keys/s, misses $(field misses "$during");" \
             "meanwhile ssd_hits +$lhits (about $(gbs $(( lhits * MIB )) $(( EXSECS * 1000000000 )))" \
             "GB/s from the SSD; the load's own figure $(field GB/s "$(cat "$dir/load.out")") GB/s)"
        if [ "$lhits" -eq 0 ]; then
            echo "   WARNING: no SSD reads ran during the probes: the figure shows nothing"
        fi
        ex_b50+=("$bp50") ex_b99+=("$bp99") ex_d50+=("$dp50") ex_d99+=("$dp99")
        ex_diff+=("$(awk -v d="$dp99" -v b="$bp99" 'BEGIN { printf "%.1f", d - b }')")
        ex_hits+=("$lhits")
    fi
    kvd_stop
    rm -rf "$dir/kv"
done

# ---- restart: RN tiny objects on the SSD, kill -9, restarted BENCH_REPS times ----
rs_c_up=() rs_c_ms=() rs_w_up=() rs_w_ms=() rs_objs=()
rs_n=$RN rs_note="" rs_fill="" rs_checks="" rs_state="" rs_b=1000
rs_keys=$RKEYS
can_drop=0
if [ -w /proc/sys/vm/drop_caches ]; then
    can_drop=1
fi
if [ "$rs_keys" = long ] && ! "$PY" -c 'import msgpack' 2>/dev/null; then
    rs_note="no $PY with msgpack for ssd_keys.py: kvstash-bench's 25-byte keys instead"
    rs_keys=short
fi
if [ "$rs_keys" = long ]; then
    rs_what="77-byte keys in hash order (ssd_keys.py)"
else
    rs_what="kvstash-bench's 25-byte keys in counter order"
fi
# rs_key I: the key kvstash-bench -i rst -c 1 gave its I-th put.
rs_key() { printf 'kb00000rst-000-%010d' "$1"; }
# proc_cpu_s PID: its user + system CPU seconds.
proc_cpu_s() {
    awk -v hz="$(getconf CLK_TCK)" '{ sub(/.*\) /, ""); printf "%.1f", ($12 + $13) / hz }' \
        "/proc/$1/stat" 2>/dev/null
}

# rs_check: every key probed; the first 1000 values and 8 keys across the range read back
# and compared with what was put. Prints what it found; fails on any difference.
rs_check() {
    local out rc miss i k bad=0 spots
    spots=($(( rs_n / 2 )) $(( rs_n - 1 )))
    for _ in 1 2 3 4 5 6; do
        spots+=($(( (RANDOM * 32768 + RANDOM) % rs_n )))
    done
    if [ "$rs_keys" = long ]; then
        out=$(timeout 120 "$PY" "$here/ssd_keys.py" "127.0.0.1:$port" exists "$rs_n" 2>&1)
        rc=$?
        kvd_alive || kvd_died
        echo "   restart check: $out"
        [ "$rc" = 0 ] || bad=1
        # shellcheck disable=SC2046  # the indexes 0..rs_b-1, one word each
        out=$(timeout 120 "$PY" "$here/ssd_keys.py" "127.0.0.1:$port" get "$rs_n" \
              $(seq 0 $(( rs_b - 1 ))) "${spots[@]}" 2>&1)
        rc=$?
        kvd_alive || kvd_died
        echo "   restart check: keys 0-$(( rs_b - 1 )) and ${spots[*]}: $out"
        [ "$rc" = 0 ] || bad=1
        return "$bad"
    fi
    out=$(timeout 120 "$BENCH" -H "127.0.0.1:$port" -m exists -b "$rs_b" -c 1 -d 4 \
          -n $(( rs_n / rs_b )) -k "$rs_n" -N -i rst -q 2>"$dir/bench.err")
    rc=$?
    kvd_alive || { cat "$dir/bench.err" >&2; kvd_died; }
    miss=$(field misses "$out")
    if [ "$rc" -ne 0 ] || [ -z "$out" ]; then
        echo "   restart check: batch_is_exist sweep FAILED (exit $rc): $(tr '\n' ' ' <"$dir/bench.err")"
        return 1
    fi
    [ "${miss:-1}" = 0 ] || bad=1
    # the first request's values are compared with the pattern by kvstash-bench itself
    timeout 60 "$BENCH" -H "127.0.0.1:$port" -m get -s 64 -b "$rs_b" -c 1 -d 1 -n 1 \
        -k "$rs_n" -N -i rst -q >"$dir/get1.out" 2>"$dir/bench.err"
    rc=$?
    kvd_alive || { cat "$dir/bench.err" >&2; kvd_died; }
    if [ "$rc" -ne 0 ] || [ "$(field misses "$(cat "$dir/get1.out")")" != 0 ]; then
        echo "   restart check: get of the first $rs_b keys FAILED (exit $rc):" \
             "$(tr '\n' ' ' <"$dir/bench.err") $(cat "$dir/get1.out")"
        bad=1
    fi
    for i in "${spots[@]}"; do
        k=$(rs_key "$i")
        if [ "$("$KVSTASH_CLI" -H "127.0.0.1:$port" -t 5000 exists "$k" 2>/dev/null)" != "$k 1" ]; then
            echo "   restart check: exists $k did not answer 1"
            bad=1
        fi
        rm -f "$dir/spot"
        if ! "$KVSTASH_CLI" -H "127.0.0.1:$port" -t 5000 get "$k" -o "$dir/spot" 2>/dev/null ||
            ! cmp -s "$dir/spot" "$dir/pattern64"; then
            echo "   restart check: get $k did not return the value put"
            bad=1
        fi
    done
    echo "   restart check: batch_is_exist of all $rs_n keys: $miss missing;" \
         "get of keys 0-$(( rs_b - 1 )) and ${spots[*]}:" \
         "$([ "$bad" = 0 ] && echo "all byte-exact" || echo "DIFFERENCES")"
    return "$bad"
}

echo
echo "-- restart: $rs_n objects of 64 B under $rs_what, kill -9, restarted"
[ -z "$rs_note" ] || echo "   NOTE: $rs_note"
if [ "$rs_n" = 0 ]; then
    rs_state="skipped (BENCH_SSD_RESTART_OBJECTS=0)"
elif [ $(( SECONDS - t_section )) -ge "$BUDGET" ]; then
    rs_state="skipped, the section is past its ${BUDGET}s budget"
else
    # each object: 8 KiB of bucket file and up to about 350 bytes of index; room for twice that
    avail_kb=$(df -Pk "$dir" | awk 'NR == 2 { print $4 }')
    fit=$(( ${avail_kb:-0} / 17 / 1000 * 1000 ))
    if [ "$fit" -lt "$rs_n" ]; then
        rs_note+="${rs_note:+; }scaled down from $rs_n objects: $dir has ${avail_kb:-?} KiB free,"
        rs_note+=" room for twice the data of $fit"
        echo "   NOTE: scaled down from $rs_n objects to $fit: $dir has ${avail_kb:-?} KiB free" \
             "and each object takes 8 KiB of disk (twice that is asked for)"
        rs_n=$fit
    fi
    if [ "$rs_n" -lt 1000 ]; then
        rs_state="skipped: not enough free disk for 1000 objects"
    fi
fi
if [ -z "$rs_state" ]; then
    pat=""
    for i in $(seq 0 63); do
        pat+=$(printf '\\%03o' $(( (i * 131 + (i >> 12) + 7) & 255 )))
    done
    # shellcheck disable=SC2059  # the format is the octal escapes just built
    printf "$pat" >"$dir/pattern64"
    kvroot=$dir/rs
    ssd_size=$(( rs_n * 8 * 3 / 2 / 1024 + 1024 ))m    # 2/3 full at most: no SSD eviction
    kv_more=(--ssd_bucket_size=256m)
    rm -rf "$kvroot"
    drop_caches
    kvd_start
    if [ "$rs_keys" = long ]; then
        fill=("$PY" "$here/ssd_keys.py" "127.0.0.1:$port" put "$rs_n" 64)
    else
        fill=("$BENCH" -H "127.0.0.1:$port" -m put -s 64 -b "$rs_b" -c 1 -d 4
              -n $(( rs_n / rs_b )) -t 600 -i rst -q)
    fi
    show "${fill[@]}"
    echo "   (then stats every 200 ms until ssd_writes == $rs_n and ssd_offload_queue == 0; then kill -9)"
    cpu0=$(proc_cpu_s "$kvd_pid")
    t0=$(now_ns)
    out=$(timeout 660 "${fill[@]}" 2>"$dir/bench.err")
    rc=$?
    t_put=$(( ($(now_ns) - t0) / 1000000 ))
    kvd_alive || { cat "$dir/bench.err" >&2; kvd_died; }
    objs=$(stat_of objects "$(stats)")
    if [ "$rc" -ne 0 ] || [ "${objs:-0}" -lt "$rs_n" ]; then
        rs_state="FAILED: the fill did not put $rs_n objects in 660 s (exit $rc, ${objs:-?} objects):"
        rs_state+=" $(tr '\n' ' ' <"$dir/bench.err") $out"
        failures=$(( failures + 1 ))
    else
        done_w=0
        deadline=$(( $(now_ns) + 300000000000 ))
        while [ "$(now_ns)" -lt "$deadline" ]; do
            s=$(stats)
            writes=$(stat_of ssd_writes "$s")
            queue=$(stat_of ssd_offload_queue "$s")
            if isnum "${writes:-}" && [ "$writes" -ge "$rs_n" ] && [ "${queue:-}" = 0 ]; then
                done_w=1
                break
            fi
            sleep 0.2
        done
        t1=$(now_ns)
        kvd_alive || kvd_died
        if [ "$done_w" != 1 ]; then
            rs_state="FAILED: SSD writes did not finish within 300 s of the last put:"
            rs_state+=" ssd_writes ${writes:-?} of $rs_n, ssd_offload_queue ${queue:-?}"
            failures=$(( failures + 1 ))
        fi
    fi
    if [ -z "$rs_state" ]; then
        rs_fill=$(( (t1 - t0) / 1000000000 ))
        cpu1=$(proc_cpu_s "$kvd_pid")
        echo "   filled: $rs_n objects put in $(( t_put / 1000 )).$(printf '%03d' $(( t_put % 1000 ))) s," \
             "all written and indexed after $rs_fill s (daemon CPU" \
             "$(awk -v a="$cpu0" -v b="$cpu1" 'BEGIN { printf "%.1f", b - a }') s);" \
             "$(du -sk "$kvroot/ssd" | awk '{ print $1 }') KiB on disk, of which index" \
             "$(du -sk "$kvroot/ssd/index" | awk '{ print $1 }') KiB;" \
             "$(stat_of ssd_buckets "$s") buckets, $(stat_of ssd_syncs "$s") group commits"
        if [ "$rs_fill" -gt 180 ]; then
            echo "   note: the fill took more than 3 minutes"
        fi
        kvd_kill9
        if [ "$can_drop" = 0 ]; then
            echo "   note: not root: the page cache cannot be dropped; only warm restarts are measured"
        fi
        for rep in $(seq 1 "$REPS"); do
            if [ "$can_drop" = 1 ]; then
                drop_caches
                if [ "$rep" = 1 ]; then
                    echo "   (cold: page cache dropped, then)"
                    kvd_start
                else
                    kvd_start quiet
                fi
                s=$(stats)
                rs_c_up+=("$kvd_up_ms")
                rs_c_ms+=("$(stat_of ssd_start_ms "$s")")
                rs_objs+=("$(stat_of ssd_start_objects "$s")")
                echo "   restart $rep, cold: answered ping $kvd_up_ms ms after exec;" \
                     "ssd_start_ms $(stat_of ssd_start_ms "$s"), ssd_start_objects" \
                     "$(stat_of ssd_start_objects "$s"), objects $(stat_of objects "$s")," \
                     "dram_objects $(stat_of dram_objects "$s")"
                if [ "$rep" = 1 ] && [ "$rs_keys" = long ]; then
                    show "$PY" "$here/ssd_keys.py" "127.0.0.1:$port" exists "$rs_n"
                    echo "\$ $PY $here/ssd_keys.py 127.0.0.1:$port get $rs_n 0 1 ... $(( rs_b - 1 )) (8 more)"
                elif [ "$rep" = 1 ]; then
                    show "$BENCH" -H "127.0.0.1:$port" -m exists -b "$rs_b" -c 1 -d 4 \
                        -n $(( rs_n / rs_b )) -k "$rs_n" -N -i rst -q
                    show "$BENCH" -H "127.0.0.1:$port" -m get -s 64 -b "$rs_b" -c 1 -d 1 -n 1 \
                        -k "$rs_n" -N -i rst -q
                    echo "   (and kvstash exists/get of 8 keys, values compared with cmp)"
                fi
                rs_check || rs_checks=FAILED
                kvd_kill9
            fi
            kvd_start quiet
            s=$(stats)
            rs_w_up+=("$kvd_up_ms")
            rs_w_ms+=("$(stat_of ssd_start_ms "$s")")
            rs_objs+=("$(stat_of ssd_start_objects "$s")")
            echo "   restart $rep, warm: answered ping $kvd_up_ms ms after exec;" \
                 "ssd_start_ms $(stat_of ssd_start_ms "$s"), ssd_start_objects" \
                 "$(stat_of ssd_start_objects "$s")"
            if [ "$can_drop" = 0 ] && [ "$rep" = 1 ]; then
                rs_check || rs_checks=FAILED
            fi
            kvd_kill9
        done
        for o in "${rs_objs[@]}"; do
            if [ "$o" != "$rs_n" ]; then
                echo "   WARNING: a restart indexed $o objects, not $rs_n"
                rs_checks=FAILED
            fi
        done
        if [ "$rs_checks" = FAILED ]; then
            failures=$(( failures + 1 ))
        else
            rs_checks="all $rs_n indexed at every start, every key found, the values read back byte-exact"
        fi
    fi
    kvd_kill9
    rm -rf "$kvroot"
    kvroot=$dir/kv
    kv_more=()
fi
[ -z "$rs_state" ] || echo "   restart test: $rs_state"

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
if [ "$EXSECS" = 0 ]; then
    echo "DRAM batch_is_exist under SSD reads: skipped (BENCH_SSD_EXISTS_SECS=0)"
elif [ "${#ex_d99[@]}" -gt 0 ]; then
    echo "DRAM batch_is_exist of 128 keys (1 conn, depth 1, ${EXSECS} s), median of" \
         "${#ex_d99[@]} runs: alone p50 $(median "${ex_b50[@]}") us, p99 $(median "${ex_b99[@]}") us;" \
         "while kvstashd reads 1 MiB objects from the SSD (ssd_hits +$(median "${ex_hits[@]}")" \
         "meanwhile) p50 $(median "${ex_d50[@]}") us, p99 $(median "${ex_d99[@]}") us;" \
         "p99 difference $(median "${ex_diff[@]}") us (each run's: ${ex_diff[*]}) (target: a few ms)"
else
    echo "DRAM batch_is_exist under SSD reads: no run finished"
fi
if [ -n "$rs_state" ]; then
    echo "restart: $rs_state"
else
    echo "restart with $rs_n objects of 64 B under $rs_what on the SSD, kill -9, median of" \
         "${#rs_w_up[@]} restarts${rs_note:+ ($rs_note)}:"
    if [ "${#rs_c_up[@]}" -gt 0 ]; then
        echo "  page cache dropped: exec to ping $(median "${rs_c_up[@]}") ms" \
             "(${rs_c_up[*]}), ssd_start_ms $(median "${rs_c_ms[@]}") (${rs_c_ms[*]})" \
             "(target: < 2000 ms for a million)"
    fi
    echo "  page cache warm:    exec to ping $(median "${rs_w_up[@]}") ms" \
         "(${rs_w_up[*]}), ssd_start_ms $(median "${rs_w_ms[@]}") (${rs_w_ms[*]})"
    echo "  ssd_start_objects: ${rs_objs[*]}; $rs_checks; filled in ${rs_fill:-?} s"
fi
echo "SSD section took $(( SECONDS - t_section )) s"
if [ "$failures" -gt 0 ]; then
    echo "ssd.sh: $failures kvstashd run(s) failed" >&2
    exit 1
fi
exit 0
