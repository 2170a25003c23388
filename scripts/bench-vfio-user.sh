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
#                              [--reference CONFIG|none]
#                              [--baseline BIN [--baseline-label TEXT]]
#                              [--peer-spdk DIR [--client vnvme|spdk|both] [--peer-python PY]]
#
#   --seconds N   run time of each point (default 3)
#   --repeat N    repetitions per point (default 5: on a small shared host single runs
#                 move by ±25 %; a verdict wants >= 5, see below)
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
#   --cost        also the server's instructions per I/O beside the IOPS: after the runs,
#                 scripts/bench-cost.sh (callgrind, --poll off, the payload copy apart)
#                 for the configurations it can cost (trapped, shadow, eventfd) at the
#                 same QDs, namespace and --workers, 2 repetitions, into cost/ of the
#                 output; the tables gain its medians (polling configurations have none:
#                 a spinning server's instruction count is mostly the spin)
#   --reference CONFIG  the configuration every other one is measured beside (default
#                 trapped: every doorbell a vfio-user message, the baseline row). For
#                 each other configuration, QD and repetition the reference's run and
#                 the configuration's run go back to back (reference first on odd
#                 repetitions, the configuration first on even ones, so drift cancels),
#                 each against a fresh `vnvme serve` started for that run and stopped
#                 after it: the two never run at once (a polling server would take a CPU
#                 from the other's run) and both see the host as it is at that moment.
#                 The report gives the per-repetition ratios configuration / reference
#                 of IOPS (higher is better), server CPU per I/O and client CPU per I/O
#                 (lower is better), each as median [interval] and a verdict: "ahead" or
#                 "behind" only when the interval excludes 1.0, else "level"; the
#                 interval is a seeded bootstrap 90 % interval of the median with >= 5
#                 pairs, else min–max of the pairs (one pair: no verdict). A pair is
#                 flagged disturbed when either run saw > 5 % steal or > 0.2 CPUs of
#                 other load (/proc/stat before and after each run). The reference runs
#                 whether or not --configs names it; its own rows (absolute figures)
#                 gather all its runs. In-process configurations have no server, so
#                 their server CPU ratio is n/a. This doubles the number of runs.
#                 `--reference none`: no pairs, one server per configuration for all its
#                 runs, the plain table (mean [min–max]).
#   --baseline BIN  before/after in one run: another vnvme binary (e.g. a release
#                 build of an earlier commit). Every point is run with both, in
#                 pairs side by side (base then new on odd repetitions, new then base
#                 on even ones), each run against a fresh server started from the same
#                 binary as its client. The report gives the paired ratios new/base of
#                 the same three figures, with the same intervals, verdicts and flags
#                 as --reference. The pairs are then new/base of the same configuration:
#                 --baseline turns the reference off, and naming a --reference other
#                 than none with it is refused (one comparison per run).
#   --baseline-label TEXT  what BIN was built from (e.g. a commit), for the report;
#                 BIN itself is recorded by file name, --version and SHA-256 only
#   --baseline-ns SPEC  the namespace BIN's servers serve (default: --ns), for a
#                 build that predates an option of --ns: e.g. --ns
#                 null:64G:lba=4096:reads=untouched beside an older build's
#                 null:64G:lba=4096. The report names each side's namespace
#   --peer-spdk DIR  vnvme beside a peer: SPDK's vfio-user target (nvmf_tgt), from the
#                 SPDK tree DIR (built with scripts/build-spdk-peer.sh: DIR/build/bin,
#                 DIR/scripts/rpc.py). The pairs of --baseline, with nvmf_tgt as the
#                 base side: every point run with both targets side by side (SPDK then
#                 vnvme on odd repetitions, vnvme then SPDK on even ones), each run
#                 against a fresh target started for it and stopped after it; the ratios
#                 vnvme/SPDK of IOPS, server CPU per I/O and client CPU per I/O, with
#                 the same intervals, verdicts and flags. Each configuration meets the
#                 SPDK mode that does what it does:
#                   mapped-poll   nvmf_tgt polling (its default: BAR0 doorbells mapped
#                                 into the client, no shadow doorbells)
#                   shadow-cpoll  nvmf_tgt --interrupt-mode (which needs its transport's
#                                 -M, --disable-mappable-bar0: trapped doorbells, and
#                                 shadow doorbells with EventIdx)
#                 (default --configs: both; no other configuration has a partner).
#                 nvmf_tgt --no-huge -s 1024 --no-pci -m <server CPU> serves a null bdev
#                 (bdev_null_create null0 65536 4096: 64 GiB of 4 KiB blocks, reads
#                 leave the buffer untouched: match it with --ns
#                 null:64G:lba=4096:reads=untouched) in one subsystem with one VFIOUSER
#                 listener, configured over its RPC socket with DIR/scripts/rpc.py.
#                 Needs --pin (SPDK pins itself: nvmf_tgt -m 0x2, spdk_nvme_perf -c
#                 0x1, the CPUs taskset gives vnvme); refuses --baseline, --reference
#                 (other than none) and --cost (one comparison per run). The report
#                 names nvmf_tgt's version and DPDK's (from its log); DIR itself is
#                 written as <spdk>
#   --client C    who drives both targets with --peer-spdk (default vnvme):
#                   vnvme  `vnvme perf`, as everywhere else: against vnvme the
#                          configuration's doorbells and completion mode; against SPDK
#                          --doorbells auto (SPDK polling offers no shadow doorbells, so
#                          its mapped doorbell page; in interrupt mode shadow
#                          doorbells) and --completion poll
#                   spdk   SPDK's own client, `spdk_nvme_perf --no-huge -s 1024 -c 0x1
#                          -q QD -o 4096 -w RW -t SECONDS` (whole seconds), which polls;
#                          its IOPS from its "Total" line, client and server CPU over
#                          the window from its "Launching workers" line to that line,
#                          the server's counters (vnvme) from its stats file at exit.
#                          SPDK's driver needs a mappable BAR0: it attaches to neither
#                          target of shadow-cpoll, whose runs are then recorded as
#                          failed, with the reason
#                   both   both clients' pairs in one run (interleaved: each repetition
#                          runs a vnvme perf pair, then an spdk_nvme_perf pair), reported
#                          apart
#   --peer-python PY  the Python that runs rpc.py (default: the first python3 on PATH
#                 that can, trying each)
#
# Without pairs each configuration starts its own `vnvme serve` (bounded wait for the
# socket), runs every QD --repeat times, and stops it. Per point: IOPS, p50/p99 latency,
# trapped doorbells and interrupts per I/O (deltas of the server's --stats-file), the
# driver's own doorbell writes/signals per I/O, client CPU per I/O (process CPU time)
# and server CPU per I/O (/proc/<pid>/stat utime+stime over the same window, `perf
# --server-pid`). Writes results.json, table.md, chart.svg (and runs/ with every raw
# perf JSON, logs/ with every server's stderr) and prints the table, then the summary.
# With pairs (--reference, --baseline): chart.svg shows the ratios with their
# intervals; chart-absolute.svg (reference) or chart-new.svg (baseline) the figures.
# With --peer-spdk: chart.svg the ratios of the first client (vnvme perf unless
# --client spdk), chart-client-spdk.svg those of spdk_nvme_perf with --client both;
# logs/ also holds every nvmf_tgt's log and logs/rpc.log what rpc.py said.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
# shellcheck source=scripts/lib/host.sh
source "$ROOT/scripts/lib/host.sh"
COMMAND_LINE="$0 $*"
SECONDS_PER_POINT=3
REPEAT=
QDS=1,4,16,64
WORKERS=1
PIN=0
CONFIGS=all
OUT=
NS=null:64G:lba=4096
RW=randread
BASELINE=
BASELINE_ARG=
BASELINE_LABEL=
BASELINE_NS=
COST=0
REFERENCE=trapped
REFERENCE_GIVEN=
PEER_SPDK=
PEER_SPDK_ARG=
PEER_PY=
CLIENT=vnvme
CLIENT_GIVEN=
# --peer-spdk: the SPDK mode each configuration is paired with (no other has one).
declare -A PEER_MODE=([mapped-poll]=poll [shadow-cpoll]=interrupt)
# The subsystem NQNs the spdk_nvme_perf client names: the one --peer-spdk creates,
# and the one vnvme serve reports with its default --serial (nqn.2024-01.io.vnvme:
# followed by the serial; SPDK's vfio-user client does not check it).
SPDK_NQN=nqn.2019-07.io.spdk:cnode0
VNVME_NQN=nqn.2024-01.io.vnvme:VNVME0001

# id|label|serve --doorbells|serve --poll|perf --doorbells|perf --completion|in-process workers
# (serve columns are "-" for in-process configurations; an empty last column: via serve).
MATRIX=(
  "trapped|trapped, no shadow (baseline)|trapped|adaptive|trapped|irq|"
  "shadow|shadow doorbells + EventIdx|trapped|adaptive|shadow|irq|"
  "eventfd|eventfd (ioeventfd) + shadow|eventfd|adaptive|eventfd|irq|"
  "mapped|mapped doorbell page|mapped|always|mapped|irq|"
  "mapped-poll|mapped + polling (poll/always)|mapped|always|mapped|poll|"
  "shadow-poll|shadow + polling (poll/always)|trapped|always|shadow|poll|"
  "shadow-cpoll|shadow, server adaptive (its default), client polling the CQ|trapped|adaptive|shadow|poll|"
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
    --cost) COST=1; shift ;;
    --reference) REFERENCE=$2; REFERENCE_GIVEN=1; shift 2 ;;
    --baseline) BASELINE=$2; BASELINE_ARG=$2; shift 2 ;;
    --baseline-label) BASELINE_LABEL=$2; shift 2 ;;
    --baseline-ns) BASELINE_NS=$2; shift 2 ;;
    --peer-spdk) PEER_SPDK=$2; PEER_SPDK_ARG=$2; shift 2 ;;
    --client) CLIENT=$2; CLIENT_GIVEN=1; shift 2 ;;
    --peer-python) PEER_PY=$2; shift 2 ;;
    --list) for m in "${MATRIX[@]}"; do IFS='|' read -r id label _ <<<"$m"; printf '%-14s %s\n' "$id" "$label"; done; exit 0 ;;
    -h|--help) usage; exit 0 ;;
    *) log "unknown argument $1"; usage >&2; exit 2 ;;
  esac
done
if [ -z "$REPEAT" ]; then REPEAT=5; fi
[[ $SECONDS_PER_POINT =~ ^[0-9]+([.][0-9]+)?$ ]] || bad_usage "--seconds must be a number"
[[ $REPEAT =~ ^[1-9][0-9]*$ ]] || bad_usage "--repeat must be at least 1"
[[ $WORKERS =~ ^[0-9]+$ ]] || bad_usage "--workers must be a number (0: inline)"
[[ $QDS =~ ^[1-9][0-9]*(,[1-9][0-9]*)*$ ]] || bad_usage "--qd must be a list like 1,4,16,64"
case $RW in randread|randwrite) ;; *) bad_usage "--rw must be randread or randwrite" ;; esac
if [ -n "$BASELINE_NS" ] && [ -z "$BASELINE" ]; then
  bad_usage "--baseline-ns needs --baseline"
fi
if [ -n "$BASELINE_LABEL" ] && [ -z "$BASELINE" ]; then
  bad_usage "--baseline-label needs --baseline"
fi
if [ -n "$BASELINE" ] && [ -n "$REFERENCE_GIVEN" ] && [ "$REFERENCE" != none ]; then
  bad_usage "--baseline and --reference $REFERENCE: one comparison per run (--baseline pairs each" \
    "configuration with itself built from BIN; drop --reference, or drop --baseline)"
fi
case $CLIENT in vnvme|spdk|both) ;; *) bad_usage "--client must be vnvme, spdk or both" ;; esac
if [ -z "$PEER_SPDK" ]; then
  [ -z "$CLIENT_GIVEN" ] || bad_usage "--client needs --peer-spdk DIR (it names who drives vnvme and SPDK's target)"
  [ -z "$PEER_PY" ] || bad_usage "--peer-python needs --peer-spdk"
else
  [ -z "$BASELINE" ] || bad_usage "--peer-spdk and --baseline: one comparison per run"
  if [ -n "$REFERENCE_GIVEN" ] && [ "$REFERENCE" != none ]; then
    bad_usage "--peer-spdk and --reference $REFERENCE: one comparison per run (--peer-spdk pairs each" \
      "configuration with SPDK's target; drop --reference)"
  fi
  [ "$COST" = 0 ] || bad_usage "--peer-spdk and --cost: one comparison per run (run --cost without --peer-spdk)"
  [ "$PIN" = 1 ] || bad_usage "--peer-spdk needs --pin: SPDK pins itself (nvmf_tgt -m, spdk_nvme_perf -c), so" \
    "vnvme is pinned to the same CPUs with taskset"
  [ -d "$PEER_SPDK" ] || bad_usage "--peer-spdk $PEER_SPDK is not a directory"
  PEER_SPDK=$(cd "$PEER_SPDK" && pwd)
  for f in build/bin/nvmf_tgt scripts/rpc.py $([ "$CLIENT" = vnvme ] || echo build/bin/spdk_nvme_perf); do
    [ -f "$PEER_SPDK/$f" ] || bad_usage "--peer-spdk: no $f in $PEER_SPDK_ARG (scripts/build-spdk-peer.sh builds one)"
  done
  "$PEER_SPDK/build/bin/nvmf_tgt" --version >/dev/null 2>&1 || bad_usage "--peer-spdk: build/bin/nvmf_tgt --version failed"
  if [ "$CLIENT" != vnvme ] && ! [[ $SECONDS_PER_POINT =~ ^[1-9][0-9]*$ ]]; then
    bad_usage "--client $CLIENT: --seconds must be whole seconds (spdk_nvme_perf -t)"
  fi
  if [ "$CONFIGS" = all ]; then
    CONFIGS=$(for m in "${MATRIX[@]}"; do id=${m%%|*}; [ -z "${PEER_MODE[$id]:-}" ] || echo "$id"; done | paste -sd,)
  fi
  for c in ${CONFIGS//,/ }; do
    [ -n "${PEER_MODE[$c]:-}" ] || bad_usage "--peer-spdk: configuration $c has no SPDK mode to meet (mapped-poll:" \
      "SPDK polling; shadow-cpoll: SPDK --interrupt-mode)"
  done
  # The Python that runs rpc.py: --peer-python, else the first python3 on PATH that can.
  cands=("$PEER_PY")
  [ -n "$PEER_PY" ] || mapfile -t cands < <(type -ap python3)
  asked=$PEER_PY
  PEER_PY=
  for py in "${cands[@]}"; do
    if "$py" "$PEER_SPDK/scripts/rpc.py" --dry-run nvmf_create_transport -t VFIOUSER >/dev/null 2>&1; then
      PEER_PY=$py
      break
    fi
  done
  if [ -z "$PEER_PY" ] && [ -n "$asked" ]; then bad_usage "--peer-python $asked cannot run the SPDK tree's scripts/rpc.py"; fi
  [ -n "$PEER_PY" ] || bad_usage "--peer-spdk: no python3 on PATH runs its scripts/rpc.py; name one with --peer-python"
  REFERENCE=none
fi
[ -z "$BASELINE" ] || REFERENCE=none
if [ "$REFERENCE" != none ]; then
  known=
  for m in "${MATRIX[@]}"; do [[ $m == "$REFERENCE|"* ]] && known=1; done
  [ -n "$known" ] || bad_usage "--reference $REFERENCE is not a configuration (see --list; or none)"
fi
if [ -n "$BASELINE" ]; then
  if [ ! -f "$BASELINE" ] || [ ! -x "$BASELINE" ]; then
    bad_usage "--baseline $BASELINE is not an executable file"
  fi
  BASELINE=$(cd "$(dirname "$BASELINE")" && pwd)/$(basename "$BASELINE")
  "$BASELINE" --version >/dev/null 2>&1 || bad_usage "--baseline: $BASELINE --version failed (not a vnvme binary?)"
fi
# The baseline is named by its file name in everything written, the SPDK tree as
# <spdk>: where they lie is this machine's business.
# hide_baseline: stdin to stdout with the baseline's path, as given and resolved,
# replaced by its file name, and the SPDK tree's by <spdk> (literally: no pattern
# characters).
hide_baseline() {
  local t
  t=$(cat)
  if [ -n "$BASELINE" ]; then t=${t//"$BASELINE"/${BASELINE##*/}}; t=${t//"$BASELINE_ARG"/${BASELINE_ARG##*/}}; fi
  if [ -n "$PEER_SPDK" ]; then t=${t//"$PEER_SPDK"/<spdk>}; t=${t//"$PEER_SPDK_ARG"/<spdk>}; fi
  printf '%s\n' "$t"
}
COMMAND_LINE=$(printf '%s' "$COMMAND_LINE" | hide_baseline)
if [ "$PIN" = 1 ] && ! command -v taskset >/dev/null; then
  bad_usage "--pin needs taskset (util-linux)"
fi
if [ "$PIN" = 1 ] && [ "$(nproc)" -lt 2 ]; then
  bad_usage "--pin needs at least 2 CPUs"
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
trap 'log "interrupted"; exit 130' INT TERM

log "building vnvme (release)"
(cd "$ROOT" && cargo build --release -p vnvme --quiet)
# The binary just built, whatever $VNVME_BIN says.
VNVME="$ROOT/target/release/vnvme"
VNVME_BIN=$VNVME

CLIENT_PIN=(); SERVER_PIN=()
if [ "$PIN" = 1 ]; then CLIENT_PIN=(taskset -c 0); SERVER_PIN=(taskset -c 1); fi
VN_WRAP=("${SERVER_PIN[@]}")

MANIFEST="$OUT/runs/manifest.tsv"
printf 'config\tqd\trep\tjson\trc\tserve_cmd\tperf_cmd\tsys_busy_ticks\twall_s\tside\tsteal_ticks\ttotal_ticks\tbeside\tclient\n' >"$MANIFEST"

# The binaries, by side: "new" is the build of this checkout; "base" the --baseline.
# runs/binaries.tsv names them for the report, by file name, never by path.
declare -A BIN=([new]=$VNVME)
SIDES=(new)
if [ -n "$BASELINE" ]; then BIN[base]=$BASELINE; SIDES=(base new); fi
# The namespace each side serves (--baseline-ns: the base side's own).
declare -A SIDE_NS=([new]=$NS [base]=${BASELINE_NS:-$NS})
{ printf 'side\tname\tlabel\tversion\tsha256\tns\n'
  for side in "${SIDES[@]}"; do
    label=; [ "$side" = base ] && label=$BASELINE_LABEL
    printf '%s\t%s\t%s\t%s\t%s\t%s\n' "$side" "$(basename "${BIN[$side]}")" "$label" \
      "$("${BIN[$side]}" --version 2>/dev/null | head -1)" "$(sha256sum "${BIN[$side]}" | cut -c1-16)" \
      "${SIDE_NS[$side]}"
  done; } >"$OUT/runs/binaries.tsv"

# --peer-spdk: SPDK's target, set up over RPC (spdk_rpcs), and its client. SPDK pins
# itself to the CPUs --pin gives vnvme: servers CPU 1, clients CPU 0.
SPDK_SERVER_MASK=0x2
SPDK_CLIENT_MASK=0x1
CLIENTS=("$CLIENT"); [ "$CLIENT" = both ] && CLIENTS=(vnvme spdk)
# spdk_rpcs MODE DIR: the RPC calls that make nvmf_tgt serve a null bdev on a
# vfio-user socket DIR/cntrl, one a line (rpc.py reads them from stdin). Interrupt
# mode needs BAR0 not mappable (-M): every doorbell write then reaches nvmf_tgt as a
# message, unless the client takes the shadow doorbells it then offers.
spdk_rpcs() {
  printf '%s\n' "nvmf_create_transport -t VFIOUSER$([ "$1" = interrupt ] && echo ' -M')" \
    "bdev_null_create null0 65536 4096" \
    "nvmf_create_subsystem $SPDK_NQN -a -s SPDK00000000000001 -m 32" \
    "nvmf_subsystem_add_ns $SPDK_NQN null0" \
    "nvmf_subsystem_add_listener $SPDK_NQN -t VFIOUSER -a $2 -s 0"
}
# spdk_tgt_args MODE RPC: nvmf_tgt's arguments.
spdk_tgt_args() {
  printf '%s\n' --no-huge -s 1024 --no-pci -m "$SPDK_SERVER_MASK" -r "$2"
  [ "$1" = poll ] || echo --interrupt-mode
}
# runs/peer.tsv: what the report says of the peer (key, value), no paths.
if [ -n "$PEER_SPDK" ]; then
  { printf 'key\tvalue\n'
    printf 'spdk_version\t%s\n' "$("$PEER_SPDK/build/bin/nvmf_tgt" --version 2>/dev/null | head -1)"
    printf 'nvmf_tgt_sha256\t%s\n' "$(sha256sum "$PEER_SPDK/build/bin/nvmf_tgt" | cut -c1-16)"
    if [ -f "$PEER_SPDK/build/bin/spdk_nvme_perf" ]; then
      printf 'spdk_nvme_perf_sha256\t%s\n' "$(sha256sum "$PEER_SPDK/build/bin/spdk_nvme_perf" | cut -c1-16)"
    fi
    printf 'rpc_python\t%s\n' "$("$PEER_PY" --version 2>&1 | head -1)"
    printf 'clients\t%s\n' "$(IFS=,; echo "${CLIENTS[*]}")"
    for c in "${!PEER_MODE[@]}"; do printf 'mode.%s\t%s\n' "$c" "${PEER_MODE[$c]}"; done
    for m in poll interrupt; do
      printf 'nvmf_tgt.%s\tnvmf_tgt %s\n' "$m" "$(spdk_tgt_args "$m" '<rpc socket>' | paste -sd' ')"
      printf 'rpc.%s\t%s\n' "$m" "$(spdk_rpcs "$m" '<dir>' | paste -sd';' | sed 's/;/; /g')"
    done
    printf 'spdk_nqn\t%s\n' "$SPDK_NQN"
    printf 'vnvme_nqn\t%s\n' "$VNVME_NQN"
    printf 'spdk_nvme_perf\tspdk_nvme_perf --no-huge -s 1024 -c %s -q QD -o 4096 -w %s -t %s -r trtype:VFIOUSER traddr:<dir> subnqn:<nqn>\n' \
      "$SPDK_CLIENT_MASK" "$RW" "$SECONDS_PER_POINT"
    printf 'server_pin\tCPU 1 (vnvme serve: taskset -c 1; nvmf_tgt: -m %s)\n' "$SPDK_SERVER_MASK"
    printf 'client_pin\tCPU 0 (vnvme perf: taskset -c 0; spdk_nvme_perf: -c %s)\n' "$SPDK_CLIENT_MASK"
  } >"$OUT/runs/peer.tsv"
fi

now() { date +%s.%N; }
# What else is running (this machine may be shared): at the start and at the end.
# Absolute paths in the command lines shrink to their last component: results name
# programs, not where this machine keeps them.
snapshot() {
  { echo "# $1 $(date -u '+%Y-%m-%d %H:%M:%S UTC')"; echo "loadavg: $(cat /proc/loadavg)"
    ps -eo pid,pcpu,etime,args --sort=-pcpu | head -8 | hide_baseline | sed -E 's#(^|[ =:])/([^ /]+/)*#\1#g' |
      cut -c1-220
  } >>"$OUT/runs/environment.txt"
}
snapshot start

selected() { [ "$CONFIGS" = all ] || [[ ",$CONFIGS," == *",$1,"* ]]; }
if [ "$CONFIGS" != all ]; then
  for c in ${CONFIGS//,/ }; do
    printf '%s\n' "${MATRIX[@]}" | grep -q "^$c|" || bad_usage "unknown config $c (see --list)"
  done
fi

IFS=, read -r -a QD_LIST <<<"$QDS"
# With a reference: the configurations measured beside it (all selected but itself).
PAIRED=()
if [ "$REFERENCE" != none ]; then
  for m in "${MATRIX[@]}"; do
    IFS='|' read -r id _ <<<"$m"
    if [ "$id" != "$REFERENCE" ] && selected "$id"; then PAIRED+=("$id"); fi
  done
  if [ ${#PAIRED[@]} = 0 ]; then
    log "only the reference $REFERENCE selected: nothing to pair with it, plain figures"
    REFERENCE=none
  fi
fi
npoints=0
# With --peer-spdk: the configurations run beside SPDK (all selected).
PEER_CFGS=()
if [ -n "$PEER_SPDK" ]; then
  for m in "${MATRIX[@]}"; do id=${m%%|*}; selected "$id" && PEER_CFGS+=("$id"); done
  npoints=$(( ${#PEER_CFGS[@]} * ${#QD_LIST[@]} * REPEAT * 2 * ${#CLIENTS[@]} ))
elif [ "$REFERENCE" != none ]; then
  npoints=$(( ${#PAIRED[@]} * ${#QD_LIST[@]} * REPEAT * 2 ))
else
  for m in "${MATRIX[@]}"; do IFS='|' read -r id _ <<<"$m"; selected "$id" && npoints=$((npoints + ${#QD_LIST[@]} * REPEAT * ${#SIDES[@]})); done
fi
# A fresh server per run in pairs (--baseline, --reference): about half a second more each.
per_run=$(( ${SECONDS_PER_POINT%.*} + 1 )); [ -n "$BASELINE" ] || [ "$REFERENCE" != none ] && per_run=$((per_run + 1))
# nvmf_tgt's start and set-up, and SPDK's client's, take about a second more.
[ -z "$PEER_SPDK" ] || per_run=$((per_run + 2))
log "$npoints runs of ${SECONDS_PER_POINT}s (about $(( (npoints * per_run + 59) / 60 )) min) -> $OUT"
log "$(nproc) CPU(s): client, server main thread and $WORKERS worker thread(s) share them$([ "$PIN" = 1 ] && echo ' (pinned: server CPU 1, client CPU 0)')"
[ "$REFERENCE" = none ] || log "reference $REFERENCE: ${PAIRED[*]} each measured beside it, $REPEAT pairs per point"
[ -z "$BASELINE" ] || log "baseline $(basename "$BASELINE")${BASELINE_LABEL:+ ($BASELINE_LABEL)} against this build, $REPEAT pairs per point"
if [ -n "$PEER_SPDK" ]; then
  log "beside $("$PEER_SPDK/build/bin/nvmf_tgt" --version 2>/dev/null | head -1): $(for c in "${PEER_CFGS[@]}"; do
    printf '%s with SPDK %s; ' "$c" "$([ "${PEER_MODE[$c]}" = poll ] && echo polling || echo --interrupt-mode)"; done)client(s)" \
    "${CLIENTS[*]}, $REPEAT pairs per point"
fi

# start_servers ID SIDE TAG: start configuration ID's server(s) from SIDE's binary
# (the chain: a back server too). Sets SERVE_PID, BACK_PID, sock, stats, serve_cmd;
# logs go to logs/serve-ID[-back]TAG.log. Returns 1 (nothing left running) on failure.
start_servers() {
  local id=$1 side=$2 tag=$3 ns=${SIDE_NS[$2]} back
  VNVME_BIN=${BIN[$side]}
  sock="$TMP/$id$SFX.sock"; stats="$TMP/$id$SFX.stats.json"
  # Beside SPDK the socket is DIR/cntrl, where SPDK's client looks for it.
  if [ -n "$PEER_SPDK" ]; then traddr="$TMP/vfu-vnvme"; mkdir -p "$traddr"; sock="$traddr/cntrl"; fi
  if [ "$id" = chain ]; then
    # The back end serves the namespace; the front reaches it through nvme://.
    back="$TMP/back$SFX.sock"
    # --doorbells eventfd: the front's doorbells kick the back's worker directly.
    vn_serve_start "$OUT/logs/serve-$id-back$tag.log" "$back" --ns "${SIDE_NS[$side]}" \
      --workers "$WORKERS" --poll "$spoll" --doorbells eventfd || return 1
    BACK_PID=$VN_PID
    ns="nvme://$back?queues=$((WORKERS + 2))"
  fi
  serve_args=(--ns "$ns" --workers "$WORKERS" --poll "$spoll" --doorbells "$sdb" --stats-file "$stats")
  serve_cmd="${SERVER_PIN[*]} vnvme serve --socket $sock ${serve_args[*]}"
  if ! vn_serve_start "$OUT/logs/serve-$id$tag.log" "$sock" "${serve_args[@]}"; then
    stop_back
    return 1
  fi
  SERVE_PID=$VN_PID
}

# run_perf ID QD REP SIDE: one `vnvme perf` run of SIDE's binary (against the
# server start_servers started, unless in-process), and its manifest row
# (BESIDE: the configuration it is paired with, if any).
# SKIP: record the run as failed without running it (its server did not start).
run_perf() {
  local id=$1 qd=$2 rep=$3 side=$4 skip=${5:-} rc=0 c0 c1 w0 w1 iops json logf
  json="runs/$id-qd$qd-r$rep$SFX.json"
  logf="logs/perf-$id-qd$qd-r$rep$SFX.log"
  perf_args=(perf --rw "$RW" --bs 4k --qd "$qd" --queues 1 --runtime "${SECONDS_PER_POINT}s"
             --doorbells "$pdb" --completion "$compl" --json "$OUT/$json")
  if [ -z "$inproc" ]; then
    perf_args+=(--socket "$sock" --server-stats "$stats" --server-pid "${SERVE_PID:-0}")
  else
    w=$inproc; [ "$w" = W ] && w=$WORKERS
    perf_args+=(--in-process --in-process-ns "$NS" --workers "$w")
    [ "$spoll" != - ] && perf_args+=(--poll "$spoll")
  fi
  pin=("${CLIENT_PIN[@]}")
  [ -z "$inproc" ] || pin=()
  read -r -a c0 < <(vn_cpu_ticks); w0=$(now)
  if [ -n "$skip" ]; then
    rc=serve; echo "vnvme serve did not start: see logs/serve-$id*" >"$OUT/$logf"
  else
    timeout --kill-after=5 $(( ${SECONDS_PER_POINT%.*} + 60 )) \
      "${pin[@]}" "${BIN[$side]}" "${perf_args[@]}" >"$OUT/$logf" 2>&1 || rc=$?
  fi
  read -r -a c1 < <(vn_cpu_ticks); w1=$(now)
  done_runs=$((done_runs + 1))
  iops=$(sed -n 's/^  IOPS \([0-9]*\).*/\1/p' "$OUT/$logf")
  log "$(printf '[%3d/%d] %-14s qd %-3s run %s%s: %s IOPS%s' "$done_runs" "$npoints" "$id" "$qd" \
    "$rep" "${SFX:+ ${SFX#-}}" "${iops:-?}" "$([ "$rc" = 0 ] || echo " (exit $rc, see $logf)")")"
  printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$id" "$qd" "$rep" "$json" "$rc" "$serve_cmd" \
    "$(printf '%s' "${pin[*]} vnvme ${perf_args[*]}" | sed "s|$ROOT/||g")" "$((c1[0] - c0[0]))" \
    "$(awk -v a="$w0" -v b="$w1" 'BEGIN { printf "%.3f", b - a }')" "$side" \
    "$((c1[1] - c0[1]))" "$((c1[2] - c0[2]))" "$BESIDE" vnvme >>"$MANIFEST"
}

# config_row ID: configuration ID's matrix row into id, label, sdb, spoll, pdb,
# compl and inproc (the globals start_servers and run_perf read).
config_row() {
  local m
  for m in "${MATRIX[@]}"; do
    [[ $m == "$1|"* ]] || continue
    IFS='|' read -r id label sdb spoll pdb compl inproc <<<"$m"
    return 0
  done
  log "no configuration $1"
  return 1
}

# run_fresh ID QD REP SIDE: one run of configuration ID with SIDE's binary against
# a fresh server of its own (none in-process), stopped right after the run; a
# server that does not start is recorded as a failed run.
run_fresh() {
  local skip=
  config_row "$1"
  serve_cmd=-
  if [ -z "$inproc" ]; then
    start_servers "$1" "$4" "-qd$2-r$3$SFX" || skip=1
  fi
  run_perf "$1" "$2" "$3" "$4" "$skip"
  stop_serve
  stop_back
}

# start_spdk ID TAG: nvmf_tgt in the SPDK mode configuration ID meets, set up over
# its RPC socket (spdk_rpcs), serving DIR/cntrl. Sets SERVE_PID, traddr (DIR),
# sock, serve_cmd; its log goes to logs/nvmf_tgt-IDTAG.log, rpc.py's to
# logs/rpc.log. Returns 1 (nothing left running) on failure.
start_spdk() {
  local id=$1 tag=$2 mode=${PEER_MODE[$1]} rpc="$TMP/spdk-rpc.sock" logf i
  logf="logs/nvmf_tgt-$id$tag.log"
  traddr="$TMP/vfu-spdk"; sock="$traddr/cntrl"; stats=
  rm -rf "$traddr" "$rpc"; mkdir -p "$traddr"
  mapfile -t tgt_args < <(spdk_tgt_args "$mode" "$rpc")
  serve_cmd="nvmf_tgt ${tgt_args[*]}; rpc.py: $(spdk_rpcs "$mode" "$traddr" | paste -sd';' | sed 's/;/; /g')"
  "$PEER_SPDK/build/bin/nvmf_tgt" "${tgt_args[@]}" >"$OUT/$logf" 2>&1 &
  SERVE_PID=$!
  echo "# $id$tag" >>"$OUT/logs/rpc.log"
  # -r 50: rpc.py waits up to 10 s for the RPC socket.
  if ! spdk_rpcs "$mode" "$traddr" | "$PEER_PY" "$PEER_SPDK/scripts/rpc.py" -s "$rpc" -r 50 >>"$OUT/logs/rpc.log" 2>&1; then
    log "nvmf_tgt: its set-up over RPC failed (logs/rpc.log, $logf)"
    stop_serve
    return 1
  fi
  for ((i = 0; i < 100; i++)); do
    [ -S "$sock" ] && return 0
    vn_alive "$SERVE_PID" || break
    sleep 0.1
  done
  log "nvmf_tgt did not serve its vfio-user socket within 10 s (stopped it; $logf)"
  stop_serve
  return 1
}

# run_peer ID QD REP SIDE CLIENT [SKIP]: one run of CLIENT (vnvme: vnvme perf;
# spdk: spdk_nvme_perf, through the report script's --run-spdk-perf, which reads
# the CPU clocks over its measuring window) against SIDE's target (vnvme or
# spdk), started by start_servers or start_spdk; its manifest row.
# SKIP: the server that did not start (serve or nvmf_tgt): the run is recorded
# as failed without running.
run_peer() {
  local id=$1 qd=$2 rep=$3 side=$4 client=$5 skip=${6:-} rc=0 c0 c1 w0 w1 iops name json logf nqn cmd
  name="$id-qd$qd-r$rep-$client-$side"
  json="runs/$name.json"; logf="logs/perf-$name.log"
  if [ "$client" = vnvme ]; then
    cmd=("${CLIENT_PIN[@]}" "$VNVME" perf --rw "$RW" --bs 4k --qd "$qd" --queues 1 --runtime "${SECONDS_PER_POINT}s")
    if [ "$side" = vnvme ]; then
      cmd+=(--doorbells "$pdb" --completion "$compl" --server-stats "$stats")
    else
      # What SPDK offers: its mapped doorbell page (polling) or shadow doorbells (interrupt mode).
      cmd+=(--doorbells auto --completion poll)
    fi
    cmd+=(--socket "$sock" --server-pid "${SERVE_PID:-0}" --json "$OUT/$json")
  else
    nqn=$SPDK_NQN; [ "$side" = vnvme ] && nqn=$VNVME_NQN
    cmd=("${CLIENT_PIN[@]}" python3 "$ROOT/scripts/bench-vfio-user.py" --run-spdk-perf --json "$OUT/$json"
         --server-pid "${SERVE_PID:-0}" -- "$PEER_SPDK/build/bin/spdk_nvme_perf" --no-huge -s 1024
         -c "$SPDK_CLIENT_MASK" -q "$qd" -o 4096 -w "$RW" -t "$SECONDS_PER_POINT"
         -r "trtype:VFIOUSER traddr:$traddr subnqn:$nqn")
  fi
  read -r -a c0 < <(vn_cpu_ticks); w0=$(now)
  if [ -n "$skip" ]; then
    rc=$skip; echo "$skip did not start: see logs/*-$id-qd$qd-r$rep-client-$client.log" >"$OUT/$logf"
  else
    timeout --kill-after=5 $(( ${SECONDS_PER_POINT%.*} + 60 )) "${cmd[@]}" >"$OUT/$logf" 2>&1 || rc=$?
  fi
  read -r -a c1 < <(vn_cpu_ticks); w1=$(now)
  done_runs=$((done_runs + 1))
  if [ "$client" = vnvme ]; then
    iops=$(sed -n 's/^  IOPS \([0-9]*\).*/\1/p' "$OUT/$logf")
  else
    iops=$(awk '$1 == "Total" && $2 == ":" { printf "%d", $3 }' "$OUT/$logf")
  fi
  log "$(printf '[%3d/%d] %-14s qd %-3s run %s, %-5s perf -> %-5s: %s IOPS%s' "$done_runs" "$npoints" "$id" "$qd" \
    "$rep" "$client" "$side" "${iops:-?}" "$([ "$rc" = 0 ] || echo " (exit $rc, see $logf)")")"
  printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$id" "$qd" "$rep" "$json" "$rc" "$serve_cmd" \
    "$(printf '%s' "${cmd[*]}" | sed "s|$OUT/||g; s|$ROOT/||g" | hide_baseline)" "$((c1[0] - c0[0]))" \
    "$(awk -v a="$w0" -v b="$w1" 'BEGIN { printf "%.3f", b - a }')" "$side" \
    "$((c1[1] - c0[1]))" "$((c1[2] - c0[2]))" "" "$client" >>"$MANIFEST"
}

# peer_fresh ID QD REP SIDE CLIENT: one run of CLIENT against a fresh target of
# SIDE (vnvme serve in configuration ID, or nvmf_tgt in the SPDK mode ID meets),
# stopped right after it. spdk_nvme_perf reads no server counters: a vnvme
# server's stats file, written at its exit, is kept beside the run's JSON.
peer_fresh() {
  local id=$1 qd=$2 rep=$3 side=$4 client=$5 skip=
  config_row "$id"
  SFX=-$side
  if [ "$side" = spdk ]; then
    start_spdk "$id" "-qd$qd-r$rep-client-$client" || skip=nvmf_tgt
  else
    start_servers "$id" new "-qd$qd-r$rep-client-$client" || skip=serve
  fi
  run_peer "$id" "$qd" "$rep" "$side" "$client" "$skip"
  stop_serve
  if [ "$side" = vnvme ] && [ "$client" = spdk ] && [ -z "$skip" ] && [ -s "$stats" ]; then
    cp "$stats" "$OUT/runs/$id-qd$qd-r$rep-$client-$side.server-stats.json"
  fi
  rm -rf "$traddr"
  SFX=
}

done_runs=0
SFX=
BESIDE=
if [ -n "$PEER_SPDK" ]; then
  # Pairs with SPDK's target: both runs of a pair back to back, each against a fresh
  # target (the two never run at once: either may poll a CPU), the order alternating;
  # with both clients, each repetition runs one pair of each.
  for cfg in "${PEER_CFGS[@]}"; do
    for qd in "${QD_LIST[@]}"; do
      for rep in $(seq "$REPEAT"); do
        for client in "${CLIENTS[@]}"; do
          order=(spdk vnvme); [ $((rep % 2)) = 0 ] && order=(vnvme spdk)
          for side in "${order[@]}"; do
            peer_fresh "$cfg" "$qd" "$rep" "$side" "$client"
          done
        done
      done
    done
  done
elif [ "$REFERENCE" != none ]; then
  # Pairs with the reference: both runs of a pair back to back, each against a
  # fresh server (the two never run at once), the order alternating.
  for cfg in "${PAIRED[@]}"; do
    for qd in "${QD_LIST[@]}"; do
      for rep in $(seq "$REPEAT"); do
        order=("$REFERENCE" "$cfg"); [ $((rep % 2)) = 0 ] && order=("$cfg" "$REFERENCE")
        for c in "${order[@]}"; do
          SFX=; BESIDE=$REFERENCE
          [ "$c" = "$REFERENCE" ] && { SFX=-beside-$cfg; BESIDE=$cfg; }
          run_fresh "$c" "$qd" "$rep" new
        done
      done
    done
  done
  SFX=; BESIDE=
else
  for m in "${MATRIX[@]}"; do
    IFS='|' read -r id label sdb spoll pdb compl inproc <<<"$m"
    selected "$id" || continue
    serve_cmd=-
    if [ -z "$BASELINE" ]; then
      # One server for all of the configuration's runs.
      if [ -z "$inproc" ]; then start_servers "$id" new "" || continue; fi
      for qd in "${QD_LIST[@]}"; do
        for rep in $(seq "$REPEAT"); do
          run_perf "$id" "$qd" "$rep" new
          if [ -n "$inproc" ] || vn_alive "$SERVE_PID"; then continue; fi
          log "$id: vnvme serve died (logs/serve-$id.log)"
          break 2
        done
      done
      stop_serve
      stop_back
      continue
    fi
    # Pairs: a fresh server per run, from the run's own binary, so the two never
    # run at once (a polling server would take a CPU from the other's runs).
    for qd in "${QD_LIST[@]}"; do
      for rep in $(seq "$REPEAT"); do
        order=(base new); [ $((rep % 2)) = 0 ] && order=(new base)
        for side in "${order[@]}"; do
          SFX=-$side
          run_fresh "$id" "$qd" "$rep" "$side"
        done
      done
    done
    SFX=
  done
fi

snapshot end
# Results name no machine paths: the run's temporary directory (sockets, stats) is
# written as $TMPDIR in the logs and raw files.
# (Nothing may name it, e.g. in-process runs only: grep then finds nothing.)
{ grep -rlF "$TMP/" "$OUT" 2>/dev/null || true; } | xargs -r sed -i "s#$TMP/#\$TMPDIR/#g"
# Nor the SPDK tree (nvmf_tgt's log names its sources, the manifest its binaries).
if [ -n "$PEER_SPDK" ]; then
  { grep -rlF "$PEER_SPDK" "$OUT" 2>/dev/null || true; } | xargs -r sed -i "s#$PEER_SPDK#<spdk>#g"
fi
if [ "$COST" = 1 ]; then
  costed=()
  for m in "${MATRIX[@]}"; do
    IFS='|' read -r id _ <<<"$m"
    case $id in trapped|shadow|eventfd) costed+=("$id") ;; esac
  done
  if [ ${#costed[@]} -gt 0 ]; then
    log "instructions per I/O: scripts/bench-cost.sh for ${costed[*]} (callgrind; several minutes)"
    "$ROOT/scripts/bench-cost.sh" --qd "$QDS" --doorbells "$(IFS=,; echo "${costed[*]}")" --ns "$NS" \
      --workers "$WORKERS" --reps 2 --no-history --no-build --no-inprocess --out "$OUT/cost" >"$OUT/logs/cost.log" 2>&1 ||
      log "bench-cost.sh failed (logs/cost.log): the tables have no instructions"
  else
    log "--cost: none of the configurations run here can be costed (trapped, shadow, eventfd)"
  fi
fi
python3 "$ROOT/scripts/bench-vfio-user.py" --dir "$OUT" --root "$ROOT" \
  --seconds "$SECONDS_PER_POINT" --repeat "$REPEAT" --qd "$QDS" --workers "$WORKERS" --pin "$PIN" \
  --ns "$NS" --rw "$RW" --reference "$REFERENCE" --started "$STAMP" --matrix "$(printf '%s\n' "${MATRIX[@]}")" --command "$COMMAND_LINE"
