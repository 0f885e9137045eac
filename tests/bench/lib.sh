# lib.sh: shell helpers the benchmark scripts share (sourced by run.sh, ssd.sh and resp.sh).
# shellcheck shell=bash

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
