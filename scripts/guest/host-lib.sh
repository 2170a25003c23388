# shellcheck shell=bash
# Host-side helpers for running `vnvme serve` next to a guest booted by
# boot.sh: build, start/stop the server, the vfio-user-pci device arguments,
# reading the server's --stats-file, and the "mark" protocol that lets a guest
# script ask the host for counter snapshots. Source after lib.sh.
#
# Mark protocol: a guest line "@@VNVME-MARK NAME@@" on the serial console makes
# vn_watch (reading boot.sh's output) save, into its directory:
#   NAME.cpu     right away: "PID TID NS COMM" per thread of the watched
#                processes (NS = CPU time in ns, from /proc/PID/task/TID/schedstat)
#   NAME.pids    "LABEL PID" per watched process (LABEL: its pid file's name
#                without .pid; QEMU removes its -pidfile when it exits)
#   NAME.stats0  right away: a copy of the --stats-file
#   NAME.stats1  0.7 s later: another copy (the server rewrites the file every
#                0.5 s, so this one includes everything done before the mark)
# The guest keeps the device idle around a mark: idle *before* it to use
# stats0 (a "start" mark), idle for >= 1.5 s *after* it to use stats1 (an
# "end" mark). See scripts/guest/tests/lib.sh (mark).

VNVME_ROOT="$(cd "$VNVME_GUEST_DIR/../.." && pwd)"
VNVME_BIN="${VNVME_BIN:-$VNVME_ROOT/target/release/vnvme}"

# vn_build: cargo build --release -p vnvme (cargo prints its own progress).
vn_build() {
    command -v cargo >/dev/null 2>&1 ||
        die "cargo not found: install a Rust toolchain (https://rustup.rs), then run again"
    (cd "$VNVME_ROOT" && cargo build --release --locked -p vnvme)
}

# vn_alive PID: is PID running (a zombie counts as gone)?
vn_alive() {
    local st
    st=$(sed 's/.*) //' "/proc/$1/stat" 2>/dev/null) || return 1
    [[ -n $st && ${st:0:1} != Z ]]
}

# vn_serve_start LOGFILE SOCKET [SERVE ARGS...]: start `vnvme serve` in the
# background (VN_PID) and wait until it listens. Returns 1 if it exits first.
vn_serve_start() {
    local logf=$1 sock=$2 i
    shift 2
    rm -f "$sock"
    NO_COLOR=1 "$VNVME_BIN" serve --socket "$sock" "$@" >"$logf" 2>&1 &
    VN_PID=$!
    for ((i = 0; i < 100; i++)); do
        [[ -S $sock ]] && return 0
        if ! vn_alive "$VN_PID"; then
            wait "$VN_PID" 2>/dev/null || true
            log "vnvme serve exited at startup:"
            sed 's/^/  | /' "$logf" >&2
            return 1
        fi
        sleep 0.1
    done
    log "vnvme serve did not create $sock within 10 s"
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

# vn_serve_stop PID: stop a server we started (SIGTERM, then SIGKILL after 5 s).
# Safe to call twice and on a PID that already exited.
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

# vn_device_args SOCKET: sets VN_DEV_ARGS, the QEMU arguments for a
# vfio-user-pci device on its own PCIe root port (bus rp0).
vn_device_args() {
    VN_DEV_ARGS=(-device pcie-root-port,id=rp0,chassis=1
        -device "{\"driver\":\"vfio-user-pci\",\"socket\":{\"type\":\"unix\",\"path\":\"$1\"},\"bus\":\"rp0\"}")
}

# vn_stat FILE KEY: one counter from a --stats-file (flat JSON); empty if absent.
vn_stat() {
    grep -o "\"$2\":[0-9]*" "$1" 2>/dev/null | head -1 | cut -d: -f2
}

# vn_ratio NUM DEN: NUM/DEN with 3 decimals ("n/a" if DEN is 0 or empty).
vn_ratio() {
    awk -v n="${1:-0}" -v d="${2:-0}" 'BEGIN { if (d + 0 == 0) print "n/a"; else printf "%.3f\n", n / d }'
}

# vn_delta DIR START END KEY: counter KEY from START.stats0 to END.stats1.
vn_delta() {
    local a b
    a=$(vn_stat "$1/$2.stats0" "$4")
    b=$(vn_stat "$1/$3.stats1" "$4")
    [[ -n $a && -n $b ]] || return 1
    echo $((b - a))
}

# vn_cpu_snapshot PID...: "PID TID NS COMM" for every thread.
vn_cpu_snapshot() {
    local pid t ns rest comm
    for pid in "$@"; do
        [[ -n $pid && -d /proc/$pid ]] || continue
        for t in /proc/"$pid"/task/*; do
            read -r ns rest <"$t/schedstat" 2>/dev/null || continue
            comm=$(cat "$t/comm" 2>/dev/null) || continue
            printf '%s %s %s %s\n' "$pid" "${t##*/}" "$ns" "$comm"
        done
    done
}

# vn_watch DIR STATSFILE [PIDFILE...]: copy stdin to stdout, acting on marks
# (see the top of this file). PIDFILEs name the processes whose CPU time is
# sampled (read at each mark, so they may appear after the watcher starts).
vn_watch() {
    local dir=$1 stats=$2 line name f pids
    shift 2
    mkdir -p "$dir"
    while IFS= read -r line; do
        printf '%s\n' "$line"
        [[ $line == *@@VNVME-MARK\ * ]] || continue
        [[ $line =~ @@VNVME-MARK\ ([A-Za-z0-9_.-]+)@@ ]] || continue
        name=${BASH_REMATCH[1]}
        pids=()
        : >"$dir/$name.pids"
        for f in "$@"; do
            [[ -s $f ]] || continue
            pids+=("$(cat "$f")")
            printf '%s %s\n' "$(basename "$f" .pid)" "${pids[-1]}" >>"$dir/$name.pids"
        done
        vn_cpu_snapshot "${pids[@]}" >"$dir/$name.cpu"
        if [[ -n $stats && -f $stats ]]; then
            # cat, not cp: the server replaces the file by rename twice a
            # second, and GNU cp refuses a source replaced while copying.
            # An open file is always a complete old or new version.
            cat "$stats" >"$dir/$name.stats0"
            sleep 0.7
            cat "$stats" >"$dir/$name.stats1"
        fi
    done
}
