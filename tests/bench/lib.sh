# lib.sh: shell helpers the benchmark scripts share (sourced by every tests/bench/*.sh).
# It only defines functions; bench_paths and bench_exit_trap set the variables they name.
# shellcheck shell=bash

# bench_paths HERE: root (the repo, two levels above HERE) and the binaries' defaults:
# KVSTASHD, BENCH, KVSTASH_CLI (each kept when the environment sets it; make bench does).
bench_paths() {
    root=$(cd "$1/../.." && pwd)
    KVSTASHD=${KVSTASHD:-$root/build/release/kvstashd}
    BENCH=${BENCH:-$root/build/release/kvstash-bench}
    KVSTASH_CLI=${KVSTASH_CLI:-$(dirname "$BENCH")/kvstash}
}

# die MSG: print "<script>: MSG" and exit 1.
die() { echo "$(basename "$0"): $*" >&2; exit 1; }

# show CMD...: print a command as it can be pasted into a shell.
show() { printf '$'; printf ' %q' "$@"; printf '\n'; }

# field NAME LINE: the value of NAME=... in a kvstash-bench result line.
field() {
    echo "$2" | tr ' ' '\n' | awk -F= -v k="$1" '$1 == k { print $2 }'
}

# answers_ping CLI PORT PID TRIES STEP: 0 once kvstashd on 127.0.0.1:PORT answers CLI's
# ping; 1 when PID has exited, or after TRIES polls STEP seconds apart without an answer.
answers_ping() {
    local cli=$1 port=$2 pid=$3 tries=$4 step=$5
    for _ in $(seq 1 "$tries"); do
        kill -0 "$pid" 2>/dev/null || return 1
        "$cli" -H "127.0.0.1:$port" -t 1000 ping >/dev/null 2>&1 && return 0
        sleep "$step"
    done
    return 1
}

# free_port: a loopback port nobody answers on (50 tries at most), below the kernel's
# ephemeral range (32768-60999 by default): a port in it can be some client socket's local
# port, which no connect sees but a listener's bind fails on (with thousands of sockets open
# on a shared machine, the pool's benchmark failed so).
free_port() {
    local p
    for _ in $(seq 1 50); do
        p=$(( 10000 + RANDOM % 22000 ))
        if ! (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null; then
            echo "$p"
            return 0
        fi
    done
    return 1
}

# proc_cpu PID: utime+stime of PID in clock ticks.
proc_cpu() {
    local s
    s=$(cat "/proc/$1/stat" 2>/dev/null) || { echo 0; return; }
    s=${s##*) }
    # after the command name: state is field 3, utime 14, stime 15
    echo "$s" | awk '{ print $12 + $13 }'
}

# isnum S: 0 when S is a whole number (digits only, at least one).
isnum() { case "$1" in ''|*[!0-9]*) return 1 ;; esac; }

# now_ns: the wall clock in nanoseconds.
now_ns() { date +%s%N; }

# median X...: the median of the numbers (the lower one of an even count); nothing if none.
median() { printf '%s\n' "$@" | sort -g | awk '{ l[NR] = $1 } END { if (NR) print l[int((NR + 1) / 2)] }'; }

# bench_exit_trap DIR: at exit, stop the daemon $kvd_pid if one runs and remove DIR; INT and
# TERM exit 130 through the same trap. The script keeps its daemon's pid in kvd_pid.
bench_exit_trap() {
    bench_exit_dir=$1
    trap bench_exit EXIT
    trap 'exit 130' INT TERM
}

# shellcheck disable=SC2317  # invoked by the EXIT trap
bench_exit() {
    if [ -n "${kvd_pid:-}" ] && kill "$kvd_pid" 2>/dev/null; then
        wait "$kvd_pid" 2>/dev/null
    fi
    rm -rf "$bench_exit_dir"
}

# kvd_kill: SIGTERM the daemon $kvd_pid, wait for it, and clear kvd_pid.
kvd_kill() {
    kill "$kvd_pid" 2>/dev/null
    wait "$kvd_pid" 2>/dev/null
    kvd_pid=""
}

# kvd_stop: like kvd_kill, but a daemon that has not exited 30 s after SIGTERM (a long
# shutdown flush) gets SIGKILL, said on stderr; nothing when kvd_pid is empty.
kvd_stop() {
    local pid=${kvd_pid:-}
    [ -n "$pid" ] || return 0
    kill "$pid" 2>/dev/null
    for _ in $(seq 1 300); do
        kill -0 "$pid" 2>/dev/null || break
        sleep 0.1
    done
    if kill -0 "$pid" 2>/dev/null; then
        echo "$(basename "$0"): kvstashd did not exit within 30 s of SIGTERM; killing it" >&2
        kill -9 "$pid" 2>/dev/null
    fi
    wait "$pid" 2>/dev/null
    kvd_pid=""
}

# disk_or_skip DIR VAR: sets fstype to DIR's file system type; when that is a tmpfs or a
# ramfs (not a disk) says the section is skipped and exits 0 (VAR: the setting to change).
disk_or_skip() {
    fstype=$(stat -f -c %T "$1")
    case "$fstype" in
        tmpfs|ramfs)
            echo "   skipped: $1 is on $fstype, not a disk (set $2 to a directory on one)"
            exit 0 ;;
    esac
}
