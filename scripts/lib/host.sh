# shellcheck shell=bash
# The host side of a `vnvme serve` process, for every script that starts one or
# reads its counters: bench-vfio-user.sh and stress-wakeup.sh source it
# directly; run-guest.sh, guest-tests.sh and bench-guest.sh through
# scripts/lib/guest-host.sh, which adds what only guest boots need (device
# arguments, the mark protocol). Source it; it needs nothing sourced before it
# (bench-vfio-user.sh has no use for the fetching in scripts/lib/packages.sh),
# sources log.sh (log, die, bad_usage) and sets only VNVME_ROOT, VNVME_BIN
# (unless already set) and VN_WRAP (unless already set).
#
# Servers
#   vn_serve_start LOG SOCKET [SERVE ARGS...]  start in the background, wait
#                                  until ready; VN_PID. Errors name the log.
#   vn_serve_wait PID SECS         wait for a server to exit by itself
#   vn_serve_stop PID              SIGTERM, up to 5 s, SIGKILL; always reaped
#   vn_alive PID                   running (a zombie counts as gone)?
# Counters (the flat JSON of `vnvme serve --stats-file`)
#   vn_stat FILE KEY               one counter
#   vn_stats_delta FROM TO KEY     a counter's increase between two snapshots
#   vn_io_deltas FROM TO           the per-I/O set: VN_IO VN_DB VN_CQDB VN_IRQ
#   vn_ratio NUM DEN               NUM/DEN with 3 decimals, "n/a" for DEN 0
# The machine
#   vn_cpu_ticks                   /proc/stat now: busy, steal and total ticks
# Messages go to stderr through log.sh: "[script name] message".

VNVME_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
VNVME_BIN="${VNVME_BIN:-$VNVME_ROOT/target/release/vnvme}"
# A command vn_serve_start puts before the binary, e.g. VN_WRAP=(taskset -c 1).
[[ -v VN_WRAP ]] || VN_WRAP=()

# shellcheck source=scripts/lib/log.sh
source "$(dirname "${BASH_SOURCE[0]}")/log.sh"

# vn_alive PID: is PID running (a zombie counts as gone)?
vn_alive() {
    local st
    st=$(sed 's/.*) //' "/proc/$1/stat" 2>/dev/null) || return 1
    [[ -n $st && ${st:0:1} != Z ]]
}

# vn_serve_start LOG SOCKET [SERVE ARGS...]: start `$VNVME_BIN serve --socket
# SOCKET ARGS...` in the background (VN_PID; stdout and stderr to LOG) and
# wait up to 10 s until it is ready: SOCKET exists and, when ARGS name a
# --stats-file, that file has been written once (clients such as `vnvme perf
# --server-stats` read it at once). If the server exits first or the socket
# never appears, prints why with the end of LOG, stops it, clears VN_PID and
# returns 1. A server that listens but never writes its stats file is taken
# as ready: its clients say what they miss.
vn_serve_start() {
    local logf=$1 sock=$2 stats="" prev="" a i rc
    shift 2
    for a in "$@"; do
        [[ $prev != --stats-file ]] || stats=$a
        prev=$a
    done
    rm -f "$sock"
    [[ -z $stats ]] || rm -f "$stats"
    NO_COLOR=1 "${VN_WRAP[@]}" "$VNVME_BIN" serve --socket "$sock" "$@" >"$logf" 2>&1 &
    VN_PID=$!
    for ((i = 0; i < 100; i++)); do
        [[ -S $sock && (-z $stats || -s $stats) ]] && return 0
        if ! vn_alive "$VN_PID"; then
            rc=0
            wait "$VN_PID" 2>/dev/null || rc=$?
            VN_PID=""
            log "vnvme serve exited at startup (status $rc); the end of its log $logf:"
            tail -n 20 "$logf" | sed 's/^/  | /' >&2
            return 1
        fi
        sleep 0.1
    done
    [[ -S $sock ]] && return 0
    log "vnvme serve did not create $sock within 10 s (stopped it); the end of its log $logf:"
    tail -n 20 "$logf" | sed 's/^/  | /' >&2
    vn_serve_stop "$VN_PID"
    VN_PID=""
    return 1
}

# vn_serve_wait PID SECS: wait up to SECS for PID (our child) to exit; prints
# nothing, returns its exit status, or 124 if it is still running.
vn_serve_wait() {
    local pid=$1 secs=$2 i rc
    for ((i = 0; i < secs * 10; i++)); do
        vn_alive "$pid" || break
        sleep 0.1
    done
    vn_alive "$pid" && return 124
    rc=0
    wait "$pid" 2>/dev/null || rc=$?
    return "$rc"
}

# vn_serve_stop PID: stop a server we started (SIGTERM, then SIGKILL after 5 s)
# and reap it. Safe to call twice, with an empty PID and on a PID that exited.
vn_serve_stop() {
    local pid=$1
    [[ -n $pid ]] || return 0
    if vn_alive "$pid"; then
        kill -TERM "$pid" 2>/dev/null || true
        vn_serve_wait "$pid" 5 || true
        if vn_alive "$pid"; then kill -KILL "$pid" 2>/dev/null || true; fi
    fi
    wait "$pid" 2>/dev/null || true
}

# vn_stat FILE KEY: one counter from a --stats-file (flat JSON); empty if absent.
vn_stat() {
    grep -o "\"$2\":[0-9]*" "$1" 2>/dev/null | head -1 | cut -d: -f2
}

# vn_stats_delta FROM TO KEY: counter KEY in snapshot TO minus in FROM; returns
# 1 (printing nothing) if either lacks it.
vn_stats_delta() {
    local a b
    a=$(vn_stat "$1" "$3")
    b=$(vn_stat "$2" "$3")
    [[ -n $a && -n $b ]] || return 1
    echo $((b - a))
}

# vn_io_deltas FROM TO: the counters the per-I/O figures are made of, between
# two snapshots: VN_IO (I/O commands), VN_DB (trapped I/O doorbell writes),
# VN_CQDB (of which CQ head writes), VN_IRQ (interrupts). Returns 1 if a
# counter is missing or no I/O was done, so callers divide by VN_IO safely.
# shellcheck disable=SC2034 # the VN_* results are read by the callers
vn_io_deltas() {
    VN_IO=$(vn_stats_delta "$1" "$2" io_commands) || return 1
    VN_DB=$(vn_stats_delta "$1" "$2" io_doorbell_writes) || return 1
    VN_CQDB=$(vn_stats_delta "$1" "$2" io_cq_doorbell_writes) || return 1
    VN_IRQ=$(vn_stats_delta "$1" "$2" interrupts) || return 1
    [[ $VN_IO -gt 0 ]]
}

# vn_ratio NUM DEN: NUM/DEN with 3 decimals ("n/a" if DEN is 0 or empty).
vn_ratio() {
    awk -v n="${1:-0}" -v d="${2:-0}" 'BEGIN { if (d + 0 == 0) print "n/a"; else printf "%.3f\n", n / d }'
}

# vn_cpu_ticks: the system-wide CPU time so far, from /proc/stat's "cpu" line in
# USER_HZ ticks, as "BUSY STEAL TOTAL": busy is user+nice+system+irq+softirq+
# steal (guest time is inside user and nice), total adds idle and iowait. Two
# readings around a run tell how much else ran meanwhile and how much the
# hypervisor stole (scripts/lib/vnvme_report.py: other_cpus, steal_share).
vn_cpu_ticks() {
    awk '/^cpu / { b = $2 + $3 + $4 + $7 + $8 + $9; print b, $9, b + $5 + $6; exit }' /proc/stat
}
