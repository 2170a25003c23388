#!/usr/bin/env bash
# vfio-user doorbell benchmark: `vnvme perf` (the userspace NVMe driver) against
# `vnvme serve` (null namespace), 4 KiB random reads at several queue depths, for each
# way a doorbell reaches the controller, plus the in-process ceiling (`vnvme perf
# --in-process`: the driver calling the controller directly, no socket, no server).
#
# Not a test (scripts/test.sh never runs it). Usage:
#
#   scripts/bench-vfio-user.sh [--seconds N] [--repeat N] [--qd 1,4,16,64]
#                              [--workers N] [--pin] [--configs a,b,...] [--out DIR]
#
#   --seconds N   run time of each point (default 3)
#   --repeat N    runs per point; the table shows the mean and [min–max] (default 2)
#   --qd LIST     queue depths (default 1,4,16,64)
#   --workers N   `vnvme serve --workers` (and --in-process --workers; 0: inline) (default 1)
#   --pin         taskset: the server on CPU 1, the client on CPU 0 (default: unpinned,
#                 the scheduler places client, server main thread and workers). In-process
#                 runs are not pinned (client and workers are one process).
#   --configs L   which configurations to run (default: all; `--list` shows them)
#   --ns SPEC     the namespace every server serves (default null:64G:lba=4096), e.g.
#                 file:/dev/shm/bench.img:1G for the io_uring file backend
#   --rw MODE     randread (default) or randwrite
#   --out DIR     output folder (default results/vfio-user-perf/<UTC timestamp>)
#   --list        print the configurations and exit
#
# Each configuration starts its own `vnvme serve` (bounded wait for the socket),
# runs every QD --repeat times, and stops it. Per point: IOPS, p50/p99 latency, trapped
# doorbells and interrupts per I/O (deltas of the server's --stats-file), the driver's
# own doorbell writes/signals per I/O, client CPU per I/O (process CPU time) and server
# CPU per I/O (/proc/<pid>/stat utime+stime over the same window, `perf --server-pid`).
# Writes results.json, table.md, chart.svg (and runs/ with every raw perf JSON, logs/
# with every server's stderr) and prints the table.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
# shellcheck source=scripts/lib/host.sh
source "$ROOT/scripts/lib/host.sh"
VN_TAG=bench-vfio-user:
COMMAND_LINE="$0 $*"
SECONDS_PER_POINT=3
REPEAT=2
QDS=1,4,16,64
WORKERS=1
PIN=0
CONFIGS=all
OUT=
NS=null:64G:lba=4096
RW=randread

# id|label|serve --doorbells|serve --poll|perf --doorbells|perf --completion|in-process workers
# (serve columns are "-" for in-process configurations; an empty last column: via serve).
MATRIX=(
  "trapped|trapped, no shadow (baseline)|trapped|adaptive|trapped|irq|"
  "shadow|shadow doorbells + EventIdx|trapped|adaptive|shadow|irq|"
  "eventfd|eventfd (ioeventfd) + shadow|eventfd|adaptive|eventfd|irq|"
  "mapped|mapped doorbell page|mapped|always|mapped|irq|"
  "mapped-poll|mapped + polling (poll/always)|mapped|always|mapped|poll|"
  "shadow-poll|shadow + polling (poll/always)|trapped|always|shadow|poll|"
  "eventfd-poll|eventfd + polling (poll/always)|eventfd|always|eventfd|poll|"
  "chain|nvme:// chain: front serve -> back serve, shadow|trapped|adaptive|shadow|irq|"
  "inproc|in-process, shadow, irq/adaptive|-|adaptive|shadow|irq|W"
  "inproc-poll|in-process, shadow, poll/always|-|always|shadow|poll|W"
  "inproc-inline|in-process inline (0 workers), poll|-|-|shadow|poll|0"
)

usage() { sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; }

while [ $# -gt 0 ]; do
  case "$1" in
    --seconds) SECONDS_PER_POINT=$2; shift 2 ;;
    --repeat) REPEAT=$2; shift 2 ;;
    --qd) QDS=$2; shift 2 ;;
    --workers) WORKERS=$2; shift 2 ;;
    --pin) PIN=1; shift ;;
    --configs) CONFIGS=$2; shift 2 ;;
    --out) OUT=$2; shift 2 ;;
    --ns) NS=$2; shift 2 ;;
    --rw) RW=$2; shift 2 ;;
    --list) for m in "${MATRIX[@]}"; do IFS='|' read -r id label _ <<<"$m"; printf '%-14s %s\n' "$id" "$label"; done; exit 0 ;;
    -h|--help) usage; exit 0 ;;
    *) echo "bench-vfio-user: unknown argument $1" >&2; usage >&2; exit 2 ;;
  esac
done
[[ $SECONDS_PER_POINT =~ ^[0-9]+([.][0-9]+)?$ ]] || { echo "--seconds must be a number" >&2; exit 2; }
[[ $REPEAT =~ ^[1-9][0-9]*$ ]] || { echo "--repeat must be at least 1" >&2; exit 2; }
[[ $WORKERS =~ ^[0-9]+$ ]] || { echo "--workers must be a number (0: inline)" >&2; exit 2; }
[[ $QDS =~ ^[1-9][0-9]*(,[1-9][0-9]*)*$ ]] || { echo "--qd must be a list like 1,4,16,64" >&2; exit 2; }
if [ "$PIN" = 1 ] && ! command -v taskset >/dev/null; then
  echo "bench-vfio-user: --pin needs taskset (util-linux)" >&2; exit 2
fi
if [ "$PIN" = 1 ] && [ "$(nproc)" -lt 2 ]; then
  echo "bench-vfio-user: --pin needs at least 2 CPUs" >&2; exit 2
fi

STAMP=$(date -u +%Y%m%dT%H%M%SZ)
[ -n "$OUT" ] || OUT="$ROOT/results/vfio-user-perf/$STAMP"
mkdir -p "$OUT/runs" "$OUT/logs"
OUT=$(cd "$OUT" && pwd)
TMP=$(mktemp -d /tmp/vnvme-vfio-user-bench.XXXXXX)
SERVE_PID=
BACK_PID=

stop_back() { vn_serve_stop "$BACK_PID"; BACK_PID=; }
stop_serve() { vn_serve_stop "$SERVE_PID"; SERVE_PID=; }
cleanup() { stop_serve; stop_back; rm -rf "$TMP"; }
trap cleanup EXIT
trap 'echo "bench-vfio-user: interrupted" >&2; exit 130' INT TERM

echo "bench-vfio-user: building vnvme (release)" >&2
(cd "$ROOT" && cargo build --release -p vnvme --quiet)
# The binary just built, whatever $VNVME_BIN says.
VNVME="$ROOT/target/release/vnvme"
VNVME_BIN=$VNVME

CLIENT_PIN=(); SERVER_PIN=()
if [ "$PIN" = 1 ]; then CLIENT_PIN=(taskset -c 0); SERVER_PIN=(taskset -c 1); fi
VN_WRAP=("${SERVER_PIN[@]}")

MANIFEST="$OUT/runs/manifest.tsv"
printf 'config\tqd\trep\tjson\trc\tserve_cmd\tperf_cmd\tsys_busy_ticks\twall_s\n' >"$MANIFEST"

# System-wide busy CPU time (USER_HZ ticks: user+nice+system+irq+softirq+steal), so a
# point can tell how much CPU something other than client and server took meanwhile.
sys_busy() { awk '/^cpu /{print $2+$3+$4+$7+$8+$9; exit}' /proc/stat; }
now() { date +%s.%N; }
# What else is running (this machine may be shared): at the start and at the end.
snapshot() {
  { echo "# $1 $(date -u '+%Y-%m-%d %H:%M:%S UTC')"; echo "loadavg: $(cat /proc/loadavg)"
    ps -eo pid,pcpu,etime,args --sort=-pcpu | head -8 | cut -c1-220; } >>"$OUT/runs/environment.txt"
}
snapshot start

selected() { [ "$CONFIGS" = all ] || [[ ",$CONFIGS," == *",$1,"* ]]; }
if [ "$CONFIGS" != all ]; then
  for c in ${CONFIGS//,/ }; do
    printf '%s\n' "${MATRIX[@]}" | grep -q "^$c|" || { echo "bench-vfio-user: unknown config $c (see --list)" >&2; exit 2; }
  done
fi

IFS=, read -r -a QD_LIST <<<"$QDS"
npoints=0
for m in "${MATRIX[@]}"; do IFS='|' read -r id _ <<<"$m"; selected "$id" && npoints=$((npoints + ${#QD_LIST[@]} * REPEAT)); done
echo "bench-vfio-user: $npoints runs of ${SECONDS_PER_POINT}s (about $(( (npoints * (${SECONDS_PER_POINT%.*} + 1) + 59) / 60 )) min) -> $OUT" >&2
echo "bench-vfio-user: $(nproc) CPU(s): client, server main thread and $WORKERS worker thread(s) share them$([ "$PIN" = 1 ] && echo ' (pinned: server CPU 1, client CPU 0)')" >&2

case $RW in randread|randwrite) ;; *) echo "--rw must be randread or randwrite" >&2; exit 2 ;; esac
done_runs=0
for m in "${MATRIX[@]}"; do
  IFS='|' read -r id label sdb spoll pdb compl inproc <<<"$m"
  selected "$id" || continue
  serve_cmd=-
  if [ -z "$inproc" ]; then
    sock="$TMP/$id.sock"; stats="$TMP/$id.stats.json"
    ns=$NS
    if [ "$id" = chain ]; then
      # The back end serves the namespace; the front reaches it through nvme://.
      back="$TMP/back.sock"
      # --doorbells eventfd: the front's doorbells kick the back's worker directly.
      vn_serve_start "$OUT/logs/serve-$id-back.log" "$back" --ns "$NS" \
        --workers "$WORKERS" --poll "$spoll" --doorbells eventfd || continue
      BACK_PID=$VN_PID
      ns="nvme://$back?queues=$((WORKERS + 2))"
    fi
    serve_args=(--ns "$ns" --workers "$WORKERS" --poll "$spoll" --doorbells "$sdb" --stats-file "$stats")
    serve_cmd="${SERVER_PIN[*]} vnvme serve --socket $sock ${serve_args[*]}"
    if ! vn_serve_start "$OUT/logs/serve-$id.log" "$sock" "${serve_args[@]}"; then
      stop_back
      continue
    fi
    SERVE_PID=$VN_PID
  fi
  for qd in "${QD_LIST[@]}"; do
    for rep in $(seq "$REPEAT"); do
      json="runs/$id-qd$qd-r$rep.json"
      perf_args=(perf --rw "$RW" --bs 4k --qd "$qd" --queues 1 --runtime "${SECONDS_PER_POINT}s"
                 --doorbells "$pdb" --completion "$compl" --json "$OUT/$json")
      if [ -z "$inproc" ]; then
        perf_args+=(--socket "$sock" --server-stats "$stats" --server-pid "$SERVE_PID")
      else
        w=$inproc; [ "$w" = W ] && w=$WORKERS
        perf_args+=(--in-process --in-process-ns "$NS" --workers "$w")
        [ "$spoll" != - ] && perf_args+=(--poll "$spoll")
      fi
      pin=("${CLIENT_PIN[@]}")
      [ -z "$inproc" ] || pin=()
      rc=0
      b0=$(sys_busy); w0=$(now)
      timeout --kill-after=5 $(( ${SECONDS_PER_POINT%.*} + 60 )) \
        "${pin[@]}" "$VNVME" "${perf_args[@]}" >"$OUT/logs/perf-$id-qd$qd-r$rep.log" 2>&1 || rc=$?
      b1=$(sys_busy); w1=$(now)
      done_runs=$((done_runs + 1))
      iops=$(sed -n 's/^  IOPS \([0-9]*\).*/\1/p' "$OUT/logs/perf-$id-qd$qd-r$rep.log")
      printf 'bench-vfio-user: [%3d/%d] %-14s qd %-3s run %s: %s IOPS%s\n' "$done_runs" "$npoints" "$id" "$qd" \
        "$rep" "${iops:-?}" "$([ "$rc" = 0 ] || echo " (exit $rc, see logs/perf-$id-qd$qd-r$rep.log)")" >&2
      printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$id" "$qd" "$rep" "$json" "$rc" "$serve_cmd" \
        "$(printf '%s' "${pin[*]} vnvme ${perf_args[*]}" | sed "s|$ROOT/||g")" "$((b1 - b0))" \
        "$(awk -v a="$w0" -v b="$w1" 'BEGIN { printf "%.3f", b - a }')" >>"$MANIFEST"
      if [ -n "$inproc" ] || vn_alive "$SERVE_PID"; then continue; fi
      echo "bench-vfio-user: $id: vnvme serve died (logs/serve-$id.log)" >&2
      break 2
    done
  done
  stop_serve
  stop_back
done

snapshot end
python3 "$ROOT/scripts/bench-vfio-user.py" --dir "$OUT" --root "$ROOT" \
  --seconds "$SECONDS_PER_POINT" --repeat "$REPEAT" --qd "$QDS" --workers "$WORKERS" --pin "$PIN" \
  --ns "$NS" --rw "$RW" --started "$STAMP" --matrix "$(printf '%s\n' "${MATRIX[@]}")" --command "$COMMAND_LINE"
