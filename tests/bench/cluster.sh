#!/usr/bin/env bash
# cluster.sh: the pool's section of `make bench` (run.sh calls it unless BENCH_CLUSTER=0; it
# runs alone too). Two daemons on loopback, A and B, in one pool with a fixed view
# (KVSTASH_TEST_VIEW: the data paths without etcd, whose cost is not on them), 1 MiB values,
# batches of 8, 1 connection, depth 2. Each row is the median of BENCH_REPS runs:
#
#   remote   B serving keys only A owns (B's weight is 0), each read once, so every key is
#            fetched from A over loopback TCP (peer_get), checked and kept, then sent; against
#            local: A serving the same keys from its own DRAM, in the same run. Target: remote
#            at least 80% of local.
#   put R=2  batch_put into A with replicas 2 (B owns every key too; write_ack all): the
#            daemons' CPU (A + B, core-seconds per GB put) against one daemon alone with no
#            pool, in the same run. Target: at most 2.2x.
#   p99      local hits on A (`get` of one 4 KiB key per request, depth 1, 3 s) while a node
#            joins a real pool (etcd on loopback, R=1) and A's rebalance walk pushes it about
#            half of KEYS keys of 1 MiB, against the same pass idle just before. Target:
#            unchanged. Skipped (with the reason) without /usr/bin/etcd (ETCD).
#
# Environment: KVSTASHD, BENCH (kvstash-bench), BENCH_REPS (3), BENCH_CLUSTER_KEYS (1024:
# keys of 1 MiB per run), BENCH_CLUSTER_MEMORY (3g per daemon), ETCD (/usr/bin/etcd),
# BENCH_CLUSTER_SECTIONS ("remote put p99": the sections run, e.g. "put" for the put alone).
# Prints every command before it runs; every wait is bounded; exits non-zero when a daemon
# dies or a run fails.
set -u -o pipefail

here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
KVSTASHD=${KVSTASHD:-$root/build/release/kvstashd}
BENCH=${BENCH:-$root/build/release/kvstash-bench}
CLI=${KVSTASH_CLI:-$root/build/release/kvstash}
REPS=${BENCH_REPS:-3}
KEYS=${BENCH_CLUSTER_KEYS:-1024}
MEM=${BENCH_CLUSTER_MEMORY:-3g}
SECTIONS=${BENCH_CLUSTER_SECTIONS:-remote put p99}
want() { case " $SECTIONS " in *" $1 "*) return 0 ;; esac; return 1; }

# shellcheck source=lib.sh
. "$here/lib.sh"       # die, show, field, free_port, proc_cpu, answers_ping

[ -x "$KVSTASHD" ] || die "no daemon at $KVSTASHD (run make first)"
[ -x "$BENCH" ] || die "no kvstash-bench at $BENCH (run make first)"
case "$REPS$KEYS" in *[!0-9]*) die "BENCH_REPS and BENCH_CLUSTER_KEYS must be numbers" ;; esac
[ $((KEYS % 8)) -eq 0 ] || die "BENCH_CLUSTER_KEYS must be a multiple of 8"

tmp=$(mktemp -d /tmp/kvstash-cluster-bench.XXXXXX) || die "mktemp failed"
pids=()
# shellcheck disable=SC2317  # invoked by the EXIT trap
cleanup() {
    local pid
    for pid in "${pids[@]}"; do
        kill "$pid" 2>/dev/null && wait "$pid" 2>/dev/null
    done
    rm -rf "$tmp"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# start NAME PORT VIEW ARGS...: a daemon; its pid in $started.
started=""
start() {
    local name=$1 port=$2 view=$3
    shift 3
    local cmd=("$KVSTASHD" --listen="127.0.0.1:$port" --data_dir="$tmp/$name" --unix_socket=none
               --memory_size="$MEM" --ssd_dir= --metrics_listen= "$@")
    mkdir -p "$tmp/$name"
    if [ -n "$view" ]; then
        echo "\$ KVSTASH_TEST_VIEW=$view \\"
        show "${cmd[@]}"
        KVSTASH_TEST_VIEW=$view "${cmd[@]}" >"$tmp/$name.log" 2>&1 &
    else
        show "${cmd[@]}"
        "${cmd[@]}" >"$tmp/$name.log" 2>&1 &
    fi
    started=$!
    pids+=("$started")
    if ! answers_ping "$CLI" "$port" "$started" 150 0.1; then
        tail -n 20 "$tmp/$name.log" >&2
        die "$name did not start"
    fi
    # the arena's pages populated first (bounded): runs measure the store, not page faults
    local pre="" cap=""
    for _ in $(seq 1 600); do
        pre=$("$CLI" -H "127.0.0.1:$port" -t 1000 stats --raw 2>/dev/null |
              awk '$1 == "memory_prefaulted" { print $2 }')
        cap=$("$CLI" -H "127.0.0.1:$port" -t 1000 stats --raw 2>/dev/null |
              awk '$1 == "memory_capacity" { print $2 }')
        [ -n "$pre" ] && [ "$pre" = "$cap" ] && break
        sleep 0.5
    done
}

# one_pass PORT ID: batch_get of the KEYS keys put with id ID, each once; the result line.
one_pass() {
    "$BENCH" -H "127.0.0.1:$1" -m get -N -i "$2" -c 1 -d 2 -b 8 -s 1m -n $((KEYS / 8)) -t 600 -q
}

# median of numbers on stdin
median() { sort -g | awk '{ a[NR] = $1 } END { print a[int((NR + 1) / 2)] }'; }

pa=$(free_port) || die "no free port"
pb=$(free_port) || die "no free port"
pool=(--cluster_name=bench --etcd_endpoints=http://127.0.0.1:9 --peer_timeout=10s)

# ---- remote hits against local gets ----
if want remote; then
echo "== remote hits: B fetches from A every key it is asked for (1 MiB, batch 8, 1 conn) =="
start a "$pa" "a@127.0.0.1:$pa,b@127.0.0.1:$pb*0" --node_id=a --replicas=1 "${pool[@]}"
start b "$pb" "a@127.0.0.1:$pa,b@127.0.0.1:$pb*0" --node_id=b --replicas=1 "${pool[@]}"
remote=() locals=()
for r in $(seq 1 "$REPS"); do
    id="r$r"
    # each run starts empty on both (-R: remove_all), so nothing is evicted and B has nothing
    echo "\$ $BENCH -H 127.0.0.1:$pb -m exists -R -k 8 -n 1 -q"
    "$BENCH" -H "127.0.0.1:$pb" -m exists -R -k 8 -n 1 -q >/dev/null \
        || die "remove_all on B failed"
    echo "\$ $BENCH -H 127.0.0.1:$pa -m put -R -i $id -c 1 -b 8 -s 1m -n $((KEYS / 8)) -q"
    "$BENCH" -H "127.0.0.1:$pa" -m put -R -i "$id" -c 1 -b 8 -s 1m -n $((KEYS / 8)) -t 600 -q \
        >/dev/null || die "the put of run $r failed"
    lo=$(one_pass "$pa" "$id") || die "the local pass of run $r failed"
    re=$(one_pass "$pb" "$id") || die "the remote pass of run $r failed"
    echo "run $r: local  $lo"
    echo "run $r: remote $re"
    [ "$(field misses "$re")" = 0 ] || die "remote pass $r missed keys"
    locals+=("$(field GB/s "$lo")")
    remote+=("$(field GB/s "$re")")
done
lmed=$(printf "%s\n" "${locals[@]}" | median)
rmed=$(printf '%s\n' "${remote[@]}" | median)
echo "median: local $lmed GB/s, remote $rmed GB/s, remote/local" \
     "$(awk -v a="$rmed" -v b="$lmed" 'BEGIN { printf "%.2f", a / b }') (target >= 0.80)"
for pid in "${pids[@]}"; do kill "$pid"; wait "$pid" 2>/dev/null; done
pids=()
echo
fi

# ---- put CPU: R=2 against one node ----
if want put; then
echo "== put CPU: batch_put into A, replicas 2 (B owns every key too) against one daemon =="
pa=$(free_port) || die "no free port"
pb=$(free_port) || die "no free port"
ps=$(free_port) || die "no free port"
start a "$pa" "a@127.0.0.1:$pa,b@127.0.0.1:$pb" --node_id=a --replicas=2 "${pool[@]}"
pid_a=$started
start b "$pb" "a@127.0.0.1:$pa,b@127.0.0.1:$pb" --node_id=b --replicas=2 "${pool[@]}"
pid_b=$started
start single "$ps" "" --node_id=s
pid_s=$started
ticks=$(getconf CLK_TCK)
pool_cpu=() one_cpu=()
for r in $(seq 1 "$REPS"); do
    c0=$(( $(proc_cpu "$pid_a") + $(proc_cpu "$pid_b") ))
    "$BENCH" -H "127.0.0.1:$pb" -m exists -R -k 8 -n 1 -q >/dev/null \
        || die "remove_all on B failed"
    out=$("$BENCH" -H "127.0.0.1:$pa" -m put -R -i "p$r" -c 1 -b 8 -s 1m -n $((KEYS / 8)) -t 600 -q) \
        || die "the pool put of run $r failed"
    c1=$(( $(proc_cpu "$pid_a") + $(proc_cpu "$pid_b") ))
    s0=$(proc_cpu "$pid_s")
    out1=$("$BENCH" -H "127.0.0.1:$ps" -m put -R -i "p$r" -c 1 -b 8 -s 1m -n $((KEYS / 8)) -t 600 -q) \
        || die "the single put of run $r failed"
    s1=$(proc_cpu "$pid_s")
    gb=$(awk -v k="$KEYS" 'BEGIN { print k * 1048576 / 1e9 }')
    pc=$(awk -v t=$((c1 - c0)) -v hz="$ticks" -v g="$gb" 'BEGIN { printf "%.3f", t / hz / g }')
    sc=$(awk -v t=$((s1 - s0)) -v hz="$ticks" -v g="$gb" 'BEGIN { printf "%.3f", t / hz / g }')
    echo "run $r: pool (A+B) $pc core-s/GB ($out)"
    echo "run $r: single     $sc core-s/GB ($out1)"
    pool_cpu+=("$pc")
    one_cpu+=("$sc")
done
pmed=$(printf '%s\n' "${pool_cpu[@]}" | median)
smed=$(printf '%s\n' "${one_cpu[@]}" | median)
echo "median: R=2 pool $pmed core-s/GB, one daemon $smed core-s/GB, ratio" \
     "$(awk -v a="$pmed" -v b="$smed" 'BEGIN { printf "%.2f", a / b }') (target <= 2.2)"
for pid in "${pids[@]}"; do kill "$pid"; wait "$pid" 2>/dev/null; done
pids=()
echo
fi

# ---- local hit p99 while a rebalance runs, against idle ----
# A alone in a pool (etcd on loopback, R=1) holds the KEYS keys of 1 MiB and RB_HOT keys of
# 4 KiB; each run measures `get` of one 4 KiB key at a time on A idle, then while a new node
# joins and A's rebalance walk pushes about half of the 1 MiB keys to it (rate limited to
# 256 MiB/s). The joining node of run r is b<r>; b<r-1> left (SIGTERM) before it, and
# A walked again (--rebalance_delay=0s) before the idle pass.
want p99 || exit 0
echo "== local hit p99 on A: idle, then while a node joins and A's walk pushes its keys =="
ETCD=${ETCD:-/usr/bin/etcd}
RB_HOT=1000
if [ ! -x "$ETCD" ]; then
    echo "skipped: no etcd at $ETCD (apt-get install etcd-server)"
    exit 0
fi
ec=$(free_port) || die "no free port"
ep=$(free_port) || die "no free port"
ecmd=("$ETCD" --name kvb --data-dir "$tmp/etcd" --listen-client-urls "http://127.0.0.1:$ec"
      --advertise-client-urls "http://127.0.0.1:$ec" --listen-peer-urls "http://127.0.0.1:$ep"
      --initial-advertise-peer-urls "http://127.0.0.1:$ep" --initial-cluster "kvb=http://127.0.0.1:$ep"
      --log-level warn)
show "${ecmd[@]}"
"${ecmd[@]}" >"$tmp/etcd.log" 2>&1 &
pids+=("$!")
for _ in $(seq 1 100); do
    (exec 3<>"/dev/tcp/127.0.0.1/$ec") 2>/dev/null && break
    sleep 0.1
done
rbpool=(--cluster_name=rb --etcd_endpoints="http://127.0.0.1:$ec" --etcd_lease_ttl=2s
        --replicas=1 --rebalance_delay=0s --peer_timeout=10s)
pa=$(free_port) || die "no free port"
start a "$pa" "" --node_id=a --peer_advertise="127.0.0.1:$pa" "${rbpool[@]}"
pid_a=$started
echo "\$ $BENCH -H 127.0.0.1:$pa -m put -i rb -c 1 -b 8 -s 1m -n $((KEYS / 8)) -q"
"$BENCH" -H "127.0.0.1:$pa" -m put -i rb -c 1 -b 8 -s 1m -n $((KEYS / 8)) -t 600 -q >/dev/null \
    || die "the put of the rebalance's keys failed"
"$BENCH" -H "127.0.0.1:$pa" -m put -i hot -c 1 -b 8 -s 4096 -n $((RB_HOT / 8)) -t 600 -q \
    >/dev/null || die "the put of the 4 KiB keys failed"
# hot_pass: `get` of the 4 KiB keys, one per request, for 3 s; the result line
hot_pass() {
    "$BENCH" -H "127.0.0.1:$pa" -m get -N -i hot -c 1 -d 1 -b 1 -s 4096 -k "$RB_HOT" -t 3 -q
}
walks() { grep -c 'rebalance to view .* done' "$tmp/a.log"; }
hot_pass >/dev/null || die "the warm-up pass failed"   # first touches, not counted
idle=() busy=()
prev=""
for r in $(seq 1 "$REPS"); do
    if [ -n "$prev" ]; then
        # b<r-1> leaves; once its lease (2 s) is gone A walks (and, owning every key again,
        # already holding each, pushes nothing)
        w0=$(walks)
        kill "$prev" && wait "$prev" 2>/dev/null
        for _ in $(seq 1 300); do [ "$(walks)" -gt "$w0" ] && break; sleep 0.1; done
        [ "$(walks)" -gt "$w0" ] || die "run $r: A did not walk after b$((r - 1)) left"
    fi
    id=$(hot_pass) || die "the idle pass of run $r failed"
    w0=$(walks)
    # b<r> started without waiting for it (its walk must overlap the pass that follows)
    pb=$(free_port) || die "no free port"
    mkdir -p "$tmp/b$r"
    bcmd=("$KVSTASHD" --listen="127.0.0.1:$pb" --data_dir="$tmp/b$r" --unix_socket=none
          --memory_size=2g --ssd_dir= --metrics_listen= --node_id="b$r"
          --peer_advertise="127.0.0.1:$pb" "${rbpool[@]}")
    show "${bcmd[@]}"
    t0=$(date +%s.%N)
    "${bcmd[@]}" >"$tmp/b$r.log" 2>&1 &
    prev=$!
    pids+=("$prev")
    bu=$(hot_pass) || die "the pass during the walk of run $r failed"
    t1=$(date +%s.%N)
    for _ in $(seq 1 600); do [ "$(walks)" -gt "$w0" ] && break; sleep 0.1; done
    line=$(grep 'rebalance to view .* done' "$tmp/a.log" | tail -n 1)
    [ "$(walks)" -gt "$w0" ] || die "run $r: A's walk did not finish within 60 s"
    walk=${line##*done in }
    ms=${walk%% ms*}
    # the walk's span from its log stamp (it ends at the stamp, began ms before)
    tend=$(date -d "$(echo "$line" | awk '{ print $1 }')" +%s.%N)
    span=$(awk -v a="$t0" -v b="$t1" -v e="$tend" -v m="$ms" \
           'BEGIN { printf "walk from +%.2f s to +%.2f s of the pass (0 to %.2f s)", e - m / 1000 - a, e - a, b - a }')
    echo "run $r: idle   $id"
    echo "run $r: during $bu"
    echo "run $r: A's walk: $walk; $span"
    case "$walk" in *" 0 keys pushed"*) die "run $r: A's walk pushed nothing" ;; esac
    idle+=("$(field p99_us "$id")")
    busy+=("$(field p99_us "$bu")")
done
imed=$(printf '%s\n' "${idle[@]}" | median)
bmed=$(printf '%s\n' "${busy[@]}" | median)
echo "median: local 4 KiB get p99 idle $imed us, during a rebalance $bmed us, ratio" \
     "$(awk -v a="$bmed" -v b="$imed" 'BEGIN { printf "%.2f", a / b }') (target: unchanged)"
