#!/usr/bin/env bash
# run.sh: the `make soak` driver. Random concurrent traffic (soak.py) against the real
# kvstashd with a 48 MiB DRAM tier, so that eviction, write-once collisions, removes, pins,
# cut-off puts, pipelining and shared-memory transfers all run at once, with every value
# read back checked:
#
#   1. DRAM only, 2 event loops;
#   2. with an SSD tier of 256 MiB in 8 MiB buckets (LRU bucket eviction), so objects go
#      to the SSD, come back and are dropped with their buckets; SIGHUP every 7 s;
#   3. crash rounds: the SSD-tier daemon killed with SIGKILL under load and restarted on
#      the same data_dir, every stored key then read back byte-exact, SOAK_CRASHES times,
#      with ssd_offload write_through and on_evict in turn (on_evict loses what was only
#      in DRAM, as documented; nothing it returns may be wrong).
#
# After each phase: remove_all must leave no object, reservation or used byte behind, the
# daemon must exit 0 on SIGTERM, and its log must hold no ERROR line and no sanitizer
# report (VARIANT=asan make soak runs the ASan build).
#
# Environment: KVSTASHD, KVSTASH_CLI (set by make soak), SOAK_SECONDS (per phase, 60),
# SOAK_WORKERS (4), SOAK_CRASHES (3), SOAK_SEED (1). Exits non-zero on any failure.
# Every phase is bounded in time; daemons left running are killed on exit, and a failed
# run keeps its data_dirs and logs (the path is printed).
set -u -o pipefail

here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
# shellcheck source=../bench/lib.sh
. "$root/tests/bench/lib.sh"     # die, show, answers_ping, free_port

KVSTASHD=${KVSTASHD:-$root/build/release/kvstashd}
KVSTASH_CLI=${KVSTASH_CLI:-$(dirname "$KVSTASHD")/kvstash}
SECS=${SOAK_SECONDS:-60}
WORKERS=${SOAK_WORKERS:-4}
CRASHES=${SOAK_CRASHES:-3}
SEED=${SOAK_SEED:-1}
PY=/usr/bin/python3
for v in "$SECS" "$WORKERS" "$CRASHES" "$SEED"; do
    case "$v" in ''|*[!0-9]*) die "SOAK_SECONDS, SOAK_WORKERS, SOAK_CRASHES and SOAK_SEED are whole numbers" ;; esac
done
[ "$SECS" -ge 10 ] || die "SOAK_SECONDS must be at least 10"
[ -x "$KVSTASHD" ] || die "no daemon at $KVSTASHD (run make first)"
[ -x "$KVSTASH_CLI" ] || die "no CLI at $KVSTASH_CLI (run make first)"

tmp=$(mktemp -d /tmp/kvstash-soak.XXXXXX) || die "mktemp failed"
kvd_pid=""
hup_pid=""
# shellcheck disable=SC2317  # invoked by the EXIT trap
cleanup() {
    local rc=$?
    [ -n "$hup_pid" ] && kill "$hup_pid" 2>/dev/null
    [ -n "$kvd_pid" ] && kill -9 "$kvd_pid" 2>/dev/null
    if [ "$rc" -eq 0 ]; then
        rm -rf "$tmp"
    else
        echo "soak: the daemons' data and logs are kept in $tmp" >&2
    fi
}
trap cleanup EXIT
failures=0
fail() { echo "FAIL: $*"; failures=$(( failures + 1 )); }

# start NAME ARGS...: kvstashd on a free loopback port with data_dir $tmp/NAME (kept across
# starts of the same NAME), 48 MiB of DRAM; sets kvd_pid, port, dir.
start() {
    local name=$1 attempt
    shift
    dir=$tmp/$name
    mkdir -p "$dir"
    for attempt in 1 2 3 4 5; do
        port=$(free_port) || die "no free loopback port"
        local cmd=("$KVSTASHD" --listen="127.0.0.1:$port" --data_dir="$dir"
                   --memory_size=48m --max_value_size=4m --metrics_listen= "$@")
        local logged
        logged=$(stat -c %s "$dir/log" 2>/dev/null || echo 0)
        show "${cmd[@]}"
        "${cmd[@]}" >>"$dir/log" 2>&1 &
        kvd_pid=$!
        answers_ping "$KVSTASH_CLI" "$port" "$kvd_pid" 100 0.1 && return 0
        # A port free when picked may be taken before the daemon binds it (the clients'
        # own ephemeral ports come from the same range): pick another, and take that
        # attempt's lines out of the log, whose errors fail the run.
        kill -0 "$kvd_pid" 2>/dev/null || ! tail -n 3 "$dir/log" | grep -q "in use" && break
        wait "$kvd_pid" 2>/dev/null
        truncate -s "$logged" "$dir/log"
        echo "   port $port was taken meanwhile (attempt $attempt); another"
    done
    tail -n 5 "$dir/log" >&2
    die "kvstashd did not start"
}

# counter NAME: one stats counter of the running daemon.
counter() {
    "$KVSTASH_CLI" -H "127.0.0.1:$port" -t 5000 stats --raw | awk -v k="$1" '$1 == k { print $2 }'
}

# soak SECONDS SEED [--killed]: soak.py against the running daemon, bounded.
soak() {
    local secs=$1 seed=$2
    shift 2
    timeout $(( secs + 180 )) "$PY" "$here/soak.py" --port "$port" --socket "$dir/kvstashd.sock" \
        --seconds "$secs" --workers "$WORKERS" --seed "$seed" "$@"
}

# finish: remove_all, check that nothing is left, SIGTERM, check the exit and the log.
finish() {
    echo "   left after the traffic: $(counter objects) objects, $(counter memory_used) bytes," \
         "$(counter evictions) evictions in all"
    timeout 60 "$PY" "$here/soak.py" --port "$port" --remove-all || fail "remove_all"
    local objects reserved used
    objects=$(counter objects)
    reserved=$(counter reserved)
    used=$(counter memory_used)
    if [ "$objects" != 0 ] || [ "$reserved" != 0 ] || [ "$used" != 0 ]; then
        fail "after remove_all: objects $objects, reserved $reserved, memory_used $used"
    else
        echo "   remove_all: nothing left (objects, reservations and memory all 0)"
    fi
    kill -TERM "$kvd_pid"
    local rc=0
    timeout 30 tail --pid="$kvd_pid" -f /dev/null || rc=124
    wait "$kvd_pid" || rc=$?
    kvd_pid=""
    [ "$rc" = 0 ] || fail "kvstashd exited $rc on SIGTERM"
    if grep -qE ' ERROR |Sanitizer|runtime error:' "$dir/log"; then
        fail "errors in the daemon's log:"
        grep -E ' ERROR |Sanitizer|runtime error:' "$dir/log" | head -n 5
    fi
}

echo "== 1. DRAM only: $WORKERS workers, $SECS s"
start dram --ssd_dir= --io_threads=2
soak "$SECS" "$SEED" || fail "traffic (DRAM only)"
finish

echo
echo "== 2. SSD tier of 256 MiB in 8 MiB buckets, SIGHUP every 7 s: $WORKERS workers, $SECS s"
start ssd --ssd_size=256m --ssd_bucket_size=8m --ssd_eviction=lru
( for _ in $(seq 1 $(( SECS / 7 ))); do sleep 7; kill -HUP "$kvd_pid" 2>/dev/null || exit 0; done ) &
hup_pid=$!
soak "$SECS" $(( SEED + 1 )) || fail "traffic (SSD tier)"
kill "$hup_pid" 2>/dev/null
wait "$hup_pid" 2>/dev/null
hup_pid=""
echo "   SSD: $(counter ssd_checksum_errors) checksum errors, $(counter ssd_io_errors) I/O errors"
[ "$(counter ssd_checksum_errors)" = 0 ] || fail "SSD checksum errors"
finish

echo
if [ "$CRASHES" -eq 0 ]; then
    echo "== 3. SIGKILL under load: skipped (SOAK_CRASHES=0)"
else
    echo "== 3. SIGKILL under load and restart, $CRASHES times (SSD tier; ssd_offload write_through, then on_evict, in turn)"
    for round in $(seq 1 "$CRASHES"); do
        offload=write_through
        [ $(( round % 2 )) = 0 ] && offload=on_evict
        crash_args=(--ssd_size=256m --ssd_bucket_size=8m "--ssd_offload=$offload")
        start crash "${crash_args[@]}"
        soak 30 $(( SEED + 10 + round )) --killed >"$tmp/crash.out" 2>&1 &
        spid=$!
        sleep $(( 8 + RANDOM % 12 ))
        kill -9 "$kvd_pid"
        wait "$kvd_pid" 2>/dev/null
        kvd_pid=""
        wait "$spid" || { fail "traffic (crash round $round)"; cat "$tmp/crash.out"; }
        start crash "${crash_args[@]}"
        if out=$(timeout 120 "$PY" "$here/soak.py" --port "$port" --check 2>&1); then
            echo "   round $round ($offload), after the restart: $out"
        else
            fail "read-back after crash round $round: $out"
        fi
        if [ "$round" -lt "$CRASHES" ]; then
            kill -TERM "$kvd_pid"
            wait "$kvd_pid" 2>/dev/null
            kvd_pid=""
        fi
    done
    finish
fi

echo
if [ "$failures" -gt 0 ]; then
    echo "soak: $failures failure(s)"
    exit 1
fi
echo "soak: passed"
