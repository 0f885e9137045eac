#!/usr/bin/env bash
# fill.sh: the first-fill section of `make bench`: how fast puts go into a DRAM tier whose
# pages have never held a value, against the same daemon's rate once every page has been
# written once ("steady"). Eleven cases, each on a fresh kvstashd with BENCH_FILL_MEMORY of
# DRAM and no SSD tier:
#   fresh:   4 KiB pages (memory_hugepages off); puts start the moment the daemon answers
#            (the arena is being populated meanwhile);
#   idle:    4 KiB pages; the daemon is left alone until memory_prefaulted covers the arena,
#            then BENCH_FILL_IDLE seconds more (a host may share idle zero pages; see
#            docs/architecture.md, DRAM tier), then the puts start;
#   hugetlb: memory_hugepages on, from a 2 MiB hugetlb pool; puts from the first second. When
#            the pool lacks room for the arena and this runs as root, the script reserves it
#            (vm.nr_hugepages raised by what is missing; put back at exit): the first start on
#            a newly reserved pool, whose pages the host has not backed yet;
#   restart: the same again on the same pool, its pages now touched once (a daemon restarted
#            on a pool reserved at boot: the operator's case; docs/operations.md); when no
#            case before it touched the pool, a daemon is started and stopped once first;
#   ready:   as restart, but the puts start once memory_prefaulted covers the arena (when
#            /readyz says ready, as an orchestrator that waits for readiness would);
#   file:    4 KiB pages of a memory_file on tmpfs (BENCH_FILL_FILE), the file removed first:
#            the first start on a new file; puts from the first second;
#   file_restart: a daemon started again on the file a daemon has populated and stopped
#            (when no case before it did, a daemon is started and stopped once first); puts
#            from the first second, the pages resident already;
#   file_ready: as file_restart, but the puts start once memory_prefaulted covers the arena;
#   thp_file, thp_restart, thp_ready: the same three on a tmpfs the script mounts with
#            huge=within_size (when root; else skipped), whose pages are 2 MiB.
# The files are removed, and the tmpfs unmounted, at exit.
# ready, file_ready and thp_ready print the time from the daemon's exec to memory_prefaulted covering
# the arena (the population; /readyz says ready then).
# Each case runs kvstash-bench in 1-second slices (batch_put_from of 8 x 1 MiB over the
# Unix socket, one connection, depth 2, then batch_put over TCP the same way) until the
# slices have put BENCH_FILL_MEMORY bytes (the first pass: every page written once), then
# removes everything and runs BENCH_FILL_STEADY more slices (the steady rate: the median).
# It prints each slice, then per case and mode: the first slice, the slowest slice of the
# first pass, the steady median and the ratios (target: the first second >= 0.70 of steady).
# Every loop is bounded (at most 60 slices a pass, 600 s waiting for the population).
#
# Environment: KVSTASHD, BENCH, KVSTASH_CLI (binaries; set by make bench),
# BENCH_FILL_MEMORY (4g), BENCH_FILL_IDLE (120), BENCH_FILL_STEADY (5),
# BENCH_FILL_CASES ("fresh idle hugetlb restart ready file file_restart file_ready thp_file
# thp_restart thp_ready"), BENCH_FILL_MODES
# ("put_from put"), BENCH_FILL_FILE (/dev/shm/kvstash-fill-<pid>.arena: the file cases' file;
# it holds BENCH_FILL_MEMORY of RAM until removed).
set -u -o pipefail

here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=lib.sh
. "$here/lib.sh"       # die, show, field, free_port, answers_ping, bench_exit_trap, kvd_kill
bench_paths "$here"    # root, KVSTASHD, BENCH, KVSTASH_CLI
MEM=${BENCH_FILL_MEMORY:-4g}
IDLE=${BENCH_FILL_IDLE:-120}
STEADY=${BENCH_FILL_STEADY:-5}
CASES=${BENCH_FILL_CASES:-fresh idle hugetlb restart ready file file_restart file_ready thp_file thp_restart thp_ready}
MEMFILE=${BENCH_FILL_FILE:-/dev/shm/kvstash-fill-$$.arena}
MODES=${BENCH_FILL_MODES:-put_from put}

[ -x "$KVSTASHD" ] || die "no daemon at $KVSTASHD (run make first)"
[ -x "$BENCH" ] || die "no kvstash-bench at $BENCH"

mem_bytes=$(numfmt --from=iec "${MEM^^}") || die "BENCH_FILL_MEMORY=$MEM: not a size"
work=$(mktemp -d /tmp/kvstash-fill-XXXXXX) || die "mktemp failed"
kvd_pid=""
bench_exit_trap "$work"
pool=/proc/sys/vm/nr_hugepages
pool_dir=/sys/kernel/mm/hugepages/hugepages-2048kB
pool_orig=""
pool_warm=0

# pool_restore: put vm.nr_hugepages back if this script raised it (at exit, with the trap).
pool_restore() {
    if [ -n "$pool_orig" ]; then
        echo "$pool_orig" > "$pool" && echo "   vm.nr_hugepages back to $pool_orig"
        pool_orig=""
    fi
}
file_warm=0
thp_warm=0
thp_dir=$work/thp
# thp_unmount: unmount the huge tmpfs if this script mounted it (at exit, with the trap).
# shellcheck disable=SC2317  # invoked by the EXIT trap
thp_unmount() {
    if mountpoint -q "$thp_dir"; then
        umount "$thp_dir" && echo "   unmounted $thp_dir"
    fi
}
trap 'pool_restore; thp_unmount; rm -f "$MEMFILE"; bench_exit' EXIT

# pool_ready: the hugetlb pool has room for the arena, reserving what is missing when root
# (at most the arena's 2 MiB pages). 1 (with the reason) when it cannot.
pool_ready() {
    local need=$((mem_bytes / 2097152)) room cur
    [ -r "$pool_dir/free_hugepages" ] || { echo "   no 2 MiB hugetlb pool on this kernel"; return 1; }
    room=$(( $(cat "$pool_dir/free_hugepages") - $(cat "$pool_dir/resv_hugepages") ))
    [ "$room" -ge "$need" ] && return 0
    [ "$(id -u)" = 0 ] || { echo "   the pool has $room of $need pages; not root"; return 1; }
    cur=$(cat "$pool")
    [ -n "$pool_orig" ] || pool_orig=$cur
    echo $((cur + need - room)) > "$pool" || { echo "   cannot raise vm.nr_hugepages"; return 1; }
    room=$(( $(cat "$pool_dir/free_hugepages") - $(cat "$pool_dir/resv_hugepages") ))
    echo "   vm.nr_hugepages $cur -> $(cat "$pool") (room $room of $need pages)"
    [ "$room" -ge "$need" ] || { echo "   the kernel gave only $room pages"; return 1; }
}

# start_daemon HUGEPAGES [ARG...]: a fresh kvstashd in $work with memory_hugepages HUGEPAGES
# and ARGs; sets kvd_pid, port, sock, start_ms. 1 if it never answers.
start_daemon() {
    local huge=$1
    shift
    rm -rf "$work/data"
    mkdir -p "$work/data"
    port=$(free_port) || die "no free port"
    sock="$work/data/kv.sock"
    show "$KVSTASHD" --listen="127.0.0.1:$port" --unix_socket="$sock" --data_dir="$work/data" \
        --memory_size="$MEM" --memory_hugepages="$huge" --ssd_dir= --metrics_listen= \
        --log_level=info "$@"
    start_ms=$(date +%s%3N)
    "$KVSTASHD" --listen="127.0.0.1:$port" --unix_socket="$sock" --data_dir="$work/data" \
        --memory_size="$MEM" --memory_hugepages="$huge" --ssd_dir= --metrics_listen= \
        --log_level=info "$@" >"$work/kvstashd.log" 2>&1 &
    kvd_pid=$!
    answers_ping "$KVSTASH_CLI" "$port" "$kvd_pid" 100 0.05
}

# prefaulted: the daemon's memory_prefaulted (bytes), or nothing.
prefaulted() {
    "$KVSTASH_CLI" -S "$sock" stats --json 2>/dev/null \
        | tr ',{}' '\n\n\n' | awk -F: '/"memory_prefaulted"/ { gsub(/ /, "", $2); print $2 }'
}

# wait_populated: until memory_prefaulted reaches the arena's size (600 s at most); says how
# long after the daemon's exec that was (to 0.1 s).
wait_populated() {
    local t0=$SECONDS s
    while [ $((SECONDS - t0)) -lt 600 ]; do
        s=$(prefaulted)
        [ "${s:-0}" -ge "$mem_bytes" ] && {
            echo "   populated $(( $(date +%s%3N) - start_ms )) ms after exec"; return 0; }
        sleep 0.1
    done
    echo "   not populated after 600 s"
    return 1
}

# file_path CASE: the memory_file of a file case (/dev/shm) or a thp case (the huge tmpfs).
file_path() {
    case $1 in
        file*) echo "$MEMFILE" ;;
        thp*) echo "$thp_dir/arena" ;;
    esac
}

# file_args CASE: the daemon's arguments for a file or thp case (nothing for the others).
file_args() {
    case $1 in
        file*|thp*) echo "--memory_file=$(file_path "$1")" ;;
    esac
}

# warm_get CASE / warm_set CASE 0|1: whether a daemon has populated that kind's file.
warm_get() { case $1 in file*) echo "$file_warm" ;; *) echo "$thp_warm" ;; esac; }
warm_set() { case $1 in file*) file_warm=$2 ;; *) thp_warm=$2 ;; esac; }

# thp_ready: a tmpfs mounted with huge=within_size at $thp_dir, sized for the arena (root
# only; unmounted at exit). 1 (with the reason) when it cannot be.
thp_ready() {
    mountpoint -q "$thp_dir" && return 0
    [ "$(id -u)" = 0 ] || { echo "   mounting a tmpfs needs root"; return 1; }
    mkdir -p "$thp_dir"
    mount -t tmpfs -o "size=$((mem_bytes / 1048576 + 64))m,huge=within_size,mode=0700" none \
        "$thp_dir" || { echo "   cannot mount a tmpfs at $thp_dir"; return 1; }
    echo "   mounted a tmpfs with huge=within_size at $thp_dir"
}

# slice MODE ID [-R]: one 1-second kvstash-bench run; its line on stderr, its GB/s on stdout.
slice() {
    local mode=$1 id=$2 extra=${3:-} target line
    if [ "$mode" = put_from ]; then target=(-S "$sock"); else target=(-H "127.0.0.1:$port"); fi
    # shellcheck disable=SC2086
    line=$("$BENCH" "${target[@]}" -m "$mode" -s 1m -b 8 -c 1 -d 2 -t 1 -i "$id" -p "$kvd_pid" \
           -q $extra) || { echo "   kvstash-bench failed" >&2; return 1; }
    echo "   $line" >&2
    field GB/s "$line"
}

declare -a summary
run_case() {
    local case=$1 mode=$2 first="" slowest="" written=0 gbs n steady=()
    local huge=off
    echo "== first fill: $case, $mode 8 x 1 MiB, 1 connection, depth 2, memory_size $MEM"
    if [ "$case" = hugetlb ] || [ "$case" = restart ] || [ "$case" = ready ]; then
        huge=on
        if [ "$case" = hugetlb ] && [ -n "$pool_orig" ]; then
            # a pool this script reserved and a daemon touched: give it back and wait for the
            # guest to report the free pages to the host, so the new pool is untouched again
            pool_restore
            pool_warm=0
            sleep 10
        fi
        pool_ready || { summary+=("$(printf '%-12s %-9s skipped: no hugetlb pool' "$case" "$mode")")
                        return 0; }
        if [ "$case" != hugetlb ] && [ "$pool_warm" = 0 ]; then
            # restart and ready are a daemon started again on a pool a daemon has touched
            echo "   warming the pool: one daemon started and stopped once populated"
            start_daemon on || { echo "   kvstashd did not start"; summary+=("$case $mode: failed")
                                 return 1; }
            wait_populated || { kvd_kill; summary+=("$case $mode: failed"); return 1; }
            kvd_kill
        fi
        pool_warm=1
    fi
    case $case in
        thp*) thp_ready || { summary+=("$(printf '%-12s %-9s skipped: no huge tmpfs' "$case" \
                                       "$mode")"); return 0; } ;;
    esac
    case $case in file*|thp*) huge=auto ;; esac
    if [ "$case" = file ] || [ "$case" = thp_file ]; then
        rm -f "$(file_path "$case")"    # a new file: its pages are new to the host
        warm_set "$case" 0
    fi
    case $case in
        file_restart|file_ready|thp_restart|thp_ready)
            if [ "$(warm_get "$case")" = 0 ]; then
                echo "   warming the file: one daemon started and stopped once populated"
                start_daemon auto "$(file_args "$case")" || { echo "   kvstashd did not start"
                    summary+=("$case $mode: failed"); return 1; }
                wait_populated || { kvd_kill; summary+=("$case $mode: failed"); return 1; }
                kvd_kill
            fi ;;
    esac
    # shellcheck disable=SC2046  # file_args is one word or none
    start_daemon "$huge" $(file_args "$case") || { echo "   kvstashd did not start"
        sed 's/^/   log: /' "$work/kvstashd.log"; summary+=("$case $mode: failed"); return 1; }
    grep -m1 "memory: the arena" "$work/kvstashd.log" | sed 's/^.*memory: /   /'
    case $case in file*|thp*) warm_set "$case" 1 ;; esac
    if [ "$case" = ready ] || [ "$case" = file_ready ] || [ "$case" = thp_ready ]; then
        wait_populated || { kvd_kill; summary+=("$case $mode: failed"); return 1; }
    fi
    if [ "$case" = idle ]; then
        wait_populated || { kvd_kill; summary+=("$case $mode: failed"); return 1; }
        echo "   idle $IDLE s"
        sleep "$IDLE"
    fi
    for n in $(seq 1 60); do
        gbs=$(slice "$mode" "f$n") || break
        [ -n "$gbs" ] || break
        [ -z "$first" ] && first=$gbs
        if [ -z "$slowest" ] || awk -v a="$gbs" -v b="$slowest" 'BEGIN { exit !(a < b) }'; then
            slowest=$gbs
        fi
        written=$(awk -v w="$written" -v g="$gbs" 'BEGIN { printf "%.0f", w + g * 1e9 }')
        [ "$written" -ge "$mem_bytes" ] && break
    done
    echo "   first pass: $n slices, $(awk -v w="$written" 'BEGIN { printf "%.2f", w / 1e9 }') GB"
    for n in $(seq 1 "$STEADY"); do
        if [ "$n" = 1 ]; then
            gbs=$(slice "$mode" "s$n" -R)   # remove_all first: the pages are all written once
        else
            gbs=$(slice "$mode" "s$n")
        fi
        [ -n "$gbs" ] && steady+=("$gbs")
    done
    grep -m1 "populated in" "$work/kvstashd.log" | sed 's/^/   log: /'
    kvd_kill
    if [ -z "$first" ] || [ "${#steady[@]}" -eq 0 ]; then
        summary+=("$(printf '%-12s %-9s failed' "$case" "$mode")")
        return 1
    fi
    local med
    med=$(printf '%s\n' "${steady[@]}" | sort -g | awk '{ a[NR] = $1 } END { print a[int((NR + 1) / 2)] }')
    summary+=("$(printf '%-12s %-9s first 1 s %6.2f GB/s  slowest %6.2f  steady %6.2f  first/steady %.2f  slowest/steady %.2f' \
        "$case" "$mode" "$first" "$slowest" "$med" \
        "$(awk -v a="$first" -v b="$med" 'BEGIN { print a / b }')" \
        "$(awk -v a="$slowest" -v b="$med" 'BEGIN { print a / b }')")")
}

rc=0
for c in $CASES; do
    for m in $MODES; do
        run_case "$c" "$m" || rc=1
        echo
    done
done
echo "== first fill summary (memory_size $MEM; target: first/steady >= 0.70)"
printf '%s\n' "${summary[@]}"
exit $rc
