# shellcheck shell=bash
# Host-side helpers for running `vnvme serve` next to a guest booted by
# boot.sh: the build, the vfio-user-pci device arguments and the "mark"
# protocol that lets a guest script ask the host for counter snapshots.
# Starting and stopping the server and counter deltas come from
# scripts/lib/host.sh, sourced here, so every host script shares them.
# Source after packages.sh.
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
#
# Control protocol: with VN_CTL_SOCKET set, a guest line "@@VNVME-CTL ARGS@@"
# runs `vnvme ctl ARGS` against that control socket (vn_ctl_action); with
# VN_QMP_SOCKET set, "@@VNVME-QMP NAME@@" sends a prepared QMP command to QEMU
# (vn_qmp_action); with VN_METRICS_SOCKET set, "@@VNVME-SCRAPE NAME@@" saves a
# Prometheus scrape of the server to NAME.prom; with VN_HOST_ACTION naming a
# function, "@@VNVME-HOST ACTION@@" runs it (DIR ACTION) in the background (the
# outage suite's server restarts and pauses).

# shellcheck source=scripts/lib/host.sh
source "$(dirname "${BASH_SOURCE[0]}")/host.sh"

# vn_build: cargo build --release -p vnvme (cargo prints its own progress).
vn_build() {
    command -v cargo >/dev/null 2>&1 ||
        die "cargo not found: install a Rust toolchain (https://rustup.rs), then run again"
    (cd "$VNVME_ROOT" && cargo build --release --locked -p vnvme)
}

# vn_device_args SOCKET [nopost]: sets VN_DEV_ARGS, the QEMU arguments for a
# vfio-user-pci device on its own PCIe root port (bus rp0). nopost adds
# x-no-posted-writes=on: QEMU then waits for the server's reply to every MMIO
# write, as clients without posted writes do (e.g. Cloud Hypervisor).
vn_device_args() {
    local extra=""
    [[ ${2:-} != nopost ]] || extra=',"x-no-posted-writes":true'
    VN_DEV_ARGS=(-device pcie-root-port,id=rp0,chassis=1
        -device "{\"driver\":\"vfio-user-pci\",\"socket\":{\"type\":\"unix\",\"path\":\"$1\"},\"bus\":\"rp0\"$extra}")
}

# vn_term_pidfile FILE: SIGTERM the process FILE names (QEMU's -pidfile), if
# it still runs; nothing if FILE is empty or missing. For exit traps: boot.sh
# owns QEMU and reaps it.
vn_term_pidfile() {
    local pid
    [[ -n $1 && -s $1 ]] || return 0
    pid=$(cat "$1")
    if vn_alive "$pid"; then kill -TERM "$pid" 2>/dev/null || true; fi
}

# vn_mark_deltas DIR START END: vn_io_deltas over the marks START and END (from
# START.stats0 to END.stats1, see the top of this file).
vn_mark_deltas() { vn_io_deltas "$1/$2.stats0" "$1/$3.stats1"; }

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

# vn_ctl_action DIR ARGS: a guest line "@@VNVME-CTL ARGS@@" runs `vnvme ctl
# --control $VN_CTL_SOCKET ARGS` (the guest asks the host to change its
# namespaces); "ARGS<TAB>STATUS<TAB>OUTPUT" goes to DIR/ctl.log and a
# "[host] vnvme ctl" line to the console log.
vn_ctl_action() {
    local out rc=0
    # shellcheck disable=SC2086 # the guest's words are the arguments
    out=$("$VNVME_BIN" ctl --control "$VN_CTL_SOCKET" $2 2>&1) || rc=$?
    printf '%s\t%s\t%s\n' "$2" "$rc" "$(tr '\n' ' ' <<<"$out")" >>"$1/ctl.log"
    printf '[host] vnvme ctl %s: exit %s: %s\n' "$2" "$rc" "$(head -1 <<<"$out")"
}

# vn_qmp_action DIR NAME: a guest line "@@VNVME-QMP NAME@@" sends the QMP command
# in $VN_QMP_DIR/NAME.json (written by the suite) to QEMU's monitor at
# $VN_QMP_SOCKET (an operator's device_add / device_del); the reply goes to
# DIR/qmp.log and a "[host] qmp" line to the console log.
vn_qmp_action() {
    local out rc=0
    out=$(python3 "$VNVME_ROOT/scripts/lib/qmp.py" "$VN_QMP_SOCKET" "$(cat "$VN_QMP_DIR/$2.json")" 2>&1) || rc=$?
    printf '%s\t%s\t%s\n' "$2" "$rc" "$(tr '\n' ' ' <<<"$out")" >>"$1/qmp.log"
    printf '[host] qmp %s: exit %s: %s\n' "$2" "$rc" "$(head -1 <<<"$out")"
}

# vn_mark_processes BASE PIDFILE...: at a mark, BASE.pids gets "LABEL PID" per
# PIDFILE that exists (LABEL: its name without .pid) and BASE.cpu the schedstat
# snapshot of their threads (vn_cpu_snapshot).
vn_mark_processes() {
    local base=$1 f pids=()
    shift
    : >"$base.pids"
    for f in "$@"; do
        [[ -s $f ]] || continue
        pids+=("$(cat "$f")")
        printf '%s %s\n' "$(basename "$f" .pid)" "${pids[-1]}" >>"$base.pids"
    done
    vn_cpu_snapshot "${pids[@]}" >"$base.cpu"
}

# vn_watch DIR STATSFILE [PIDFILE...]: copy stdin to stdout, acting on marks
# (see the top of this file). PIDFILEs name the processes whose CPU time is
# sampled (read at each mark, so they may appear after the watcher starts).
vn_watch() {
    local dir=$1 stats=$2 line name
    shift 2
    mkdir -p "$dir"
    while IFS= read -r line; do
        printf '%s\n' "$line"
        if [[ -n ${VN_CTL_SOCKET:-} && $line =~ @@VNVME-CTL\ ([^@]*)@@ ]]; then
            vn_ctl_action "$dir" "${BASH_REMATCH[1]}"
            continue
        fi
        if [[ -n ${VN_METRICS_SOCKET:-} && $line =~ @@VNVME-SCRAPE\ ([A-Za-z0-9_-]+)@@ ]]; then
            curl -s --max-time 10 --unix-socket "$VN_METRICS_SOCKET" http://localhost/metrics \
                >"$dir/${BASH_REMATCH[1]}.prom" 2>"$dir/${BASH_REMATCH[1]}.prom.err" || true
            printf '[host] scraped %s: %s lines\n' "${BASH_REMATCH[1]}" "$(wc -l <"$dir/${BASH_REMATCH[1]}.prom")"
            continue
        fi
        if [[ -n ${VN_HOST_ACTION:-} && $line =~ @@VNVME-HOST\ ([A-Za-z0-9_-]+)@@ ]]; then
            # In the background: the guest goes on while the host acts.
            "$VN_HOST_ACTION" "$dir" "${BASH_REMATCH[1]}" &
            continue
        fi
        if [[ -n ${VN_QMP_SOCKET:-} && $line =~ @@VNVME-QMP\ ([A-Za-z0-9_-]+)@@ ]]; then
            vn_qmp_action "$dir" "${BASH_REMATCH[1]}"
            continue
        fi
        [[ $line == *@@VNVME-MARK\ * ]] || continue
        [[ $line =~ @@VNVME-MARK\ ([A-Za-z0-9_.-]+)@@ ]] || continue
        name=${BASH_REMATCH[1]}
        vn_mark_processes "$dir/$name" "$@"
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
