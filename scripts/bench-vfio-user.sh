#!/usr/bin/env bash
# vfio-user doorbell benchmark: `vnvme perf` (the userspace NVMe driver) against
# `vnvme serve` (null namespace), 4 KiB random reads by default, at several queue
# depths, for each way a doorbell reaches the controller, plus the in-process ceiling
# (`vnvme perf --in-process`: the driver calling the controller directly, no socket,
# no server); with --peer-spdk, beside SPDK's vfio-user target on a null, RAM or file
# backend.
#
# Not a test (scripts/test.sh never runs it). Usage:
#
#   scripts/bench-vfio-user.sh [--seconds N] [--repeat N] [--qd 1,4,16,64]
#                              [--workers N] [--pin] [--configs a,b,...] [--out DIR]
#                              [--reference CONFIG|none]
#                              [--baseline BIN [--baseline-label TEXT]]
#                              [--ns SPEC] [--rw MODE] [--bs SIZE]
#                              [--peer-spdk DIR [--client vnvme|spdk|both] [--peer-python PY]
#                               [--peer-backend null|ram|file [--peer-size SIZE]
#                                [--peer-file PATH] [--peer-file-engine uring|aio]]]
#
#   --seconds N   run time of each point (default 3)
#   --repeat N    repetitions per point (default 5: on a small shared host single runs
#                 move by ±25 %; a verdict wants >= 5, see below)
#   --qd LIST     queue depths (default 1,4,16,64)
#   --workers N   `vnvme serve --workers` (and --in-process --workers; 0: inline) (default 1)
#   --pin         taskset: the server on CPU 1, the client on CPU 0 (default: unpinned,
#                 the scheduler places client, server main thread and workers). In-process
#                 runs are not pinned (client and workers are one process). With
#                 fresh targets per run (--baseline, --reference, --peer-spdk), each
#                 run is bracketed by the round trip of a cache line between CPU 0
#                 and 1 (core_to_core, crates/guest-mem/examples): a pair whose four
#                 round trips differ by more than 2x ran on two placements of this
#                 host's vCPUs (seen here: ~100 ns sharing a cache, ~470 ns not): it
#                 is run again, up to 3 times (its runs kept in runs/moved/, counted
#                 in the report), and flagged disturbed if it still moved.
#   --configs L   which configurations to run (default: all; `--list` shows them)
#   --ns SPEC     the namespace every server serves (default null:64G:lba=4096), e.g.
#                 file:/dev/shm/bench.img:1G for the io_uring file backend
#   --rw MODE     randread (default), randwrite, read or write (read and write are
#                 sequential: the queue walks the namespace in order, wrapping)
#   --bs SIZE     bytes per I/O (default 4096; or with a K suffix, e.g. 128K): vnvme perf
#                 --bs and, with --peer-spdk, spdk_nvme_perf -o (there a multiple of
#                 4096, the backends' block, up to 128K, the largest I/O SPDK's
#                 vfio-user transport takes by default); --cost only with 4096
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
#                 other load (/proc/stat before and after each run), or (--pin) when
#                 the CPUs' placement moved (see --pin). The reference runs
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
#                 nvmf_tgt --no-huge -s 1024 --no-pci -m <server CPU> serves the bdev
#                 of --peer-backend in one subsystem with one VFIOUSER listener,
#                 configured over its RPC socket with DIR/scripts/rpc.py.
#                 Needs --pin (SPDK pins itself: nvmf_tgt -m 0x2, spdk_nvme_perf -c
#                 0x1, the CPUs taskset gives vnvme); refuses --baseline, --reference
#                 (other than none) and --cost (one comparison per run). The report
#                 names nvmf_tgt's version and DPDK's (from its log); DIR itself is
#                 written as <spdk>. A target that does not start or cannot be set up
#                 (an RPC refused, the file not opened O_DIRECT, the RAM disk not
#                 written whole) ends the run there, with the reason and no report:
#                 it would fail every run the same way
#   --peer-backend B  what both targets serve with --peer-spdk (default null):
#                   null  nvmf_tgt a null bdev (bdev_null_create null0 65536 4096: 64
#                         GiB of 4 KiB blocks, reads leave the buffer untouched),
#                         vnvme --ns (match it with null:64G:lba=4096:reads=untouched)
#                   ram   a RAM disk of --peer-size, 4 KiB blocks, that each target
#                         copies every read from and every write into: vnvme --ns
#                         ram:SIZE:lba=4096, nvmf_tgt bdev_malloc_create -b malloc0
#                         MIB 4096 (its -s grows by MIB). vnvme reads a RAM chunk never
#                         written as zeroes, without a copy; so before every run, on
#                         both sides, `vnvme perf --rw write --bs 128k --qd 16` writes
#                         the whole disk (1 s per GiB and 1 more, checked to have
#                         covered it; not measured; a vnvme server's counters from
#                         that pass are taken off what spdk_nvme_perf's run reports)
#                   file  a file on a disk file system (--peer-file), read through
#                         io_uring with O_DIRECT on both sides, so no page cache:
#                         vnvme --ns file:FILE:lba=4096:engine=uring:direct=on,
#                         nvmf_tgt bdev_uring_create FILE uring0 4096 (which opens
#                         O_DIRECT where the file system allows it, else silently
#                         without: every run reads both targets' /proc/PID/fdinfo
#                         for the file and stops unless it is open O_DIRECT). Reads
#                         only (--rw randread or read)
#                 ram and file set vnvme's --ns themselves (--ns as well is refused)
#                 and measure the host's memcpy bandwidth on the servers' CPU before
#                 and after each point's runs: `memcpy_bw` (crates/guest-mem/examples,
#                 built in release) copying --bs chunks from a 2 GiB source (in order
#                 for read and write, at random otherwise) into QD x --bs of
#                 destination, --repeat repetitions of 0.5 s; the report gives each
#                 target's MB/s as a ratio to its median
#   --peer-size SIZE  the RAM disk's or the file's size, whole MiB (ram: 1G, file: 4G)
#   --peer-file PATH  --peer-backend file's file (default target/bench-peer-SIZE.img in
#                 this checkout; written as <peer-file> in the results): made once,
#                 filled with a non-zero pattern and synced (no holes, no unwritten
#                 extents), and used as found by later runs when its size matches and
#                 every block is allocated; refused on tmpfs and ramfs. The targets
#                 never run at once: each opens it in turn, and no lock outlives its
#                 holder
#   --peer-file-engine E  nvmf_tgt's bdev for the file: uring (default) or aio
#                 (bdev_aio_create FILE aio0 4096, for a build without CONFIG_URING);
#                 vnvme reads it through io_uring either way
#   --client C    who drives both targets with --peer-spdk (default vnvme):
#                   vnvme  `vnvme perf`, as everywhere else: against vnvme the
#                          configuration's doorbells and completion mode; against SPDK
#                          --doorbells auto (SPDK polling offers no shadow doorbells, so
#                          its mapped doorbell page; in interrupt mode shadow
#                          doorbells) and --completion poll
#                   spdk   SPDK's own client, `spdk_nvme_perf --no-huge -s 1024 -c 0x1
#                          -q QD -o BS -w RW -t SECONDS` (whole seconds), which polls;
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
NS_GIVEN=
RW=randread
BS=4096
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
PEER_BACKEND=null
PEER_BACKEND_GIVEN=
PEER_SIZE=
PEER_BYTES=
PEER_FILE=
PEER_FILE_ARG=
PEER_FILE_ENGINE=uring
# --peer-backend ram|file: the memcpy bandwidth beside each point (memcpy_bw): its
# source, far larger than the caches, and each repetition's length.
MEMCPY_SRC=2G
MEMCPY_SECONDS=0.5
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
    --ns) NS=$2; NS_GIVEN=1; shift 2 ;;
    --rw) RW=$2; shift 2 ;;
    --bs) BS=$2; shift 2 ;;
    --cost) COST=1; shift ;;
    --reference) REFERENCE=$2; REFERENCE_GIVEN=1; shift 2 ;;
    --baseline) BASELINE=$2; BASELINE_ARG=$2; shift 2 ;;
    --baseline-label) BASELINE_LABEL=$2; shift 2 ;;
    --baseline-ns) BASELINE_NS=$2; shift 2 ;;
    --peer-spdk) PEER_SPDK=$2; PEER_SPDK_ARG=$2; shift 2 ;;
    --client) CLIENT=$2; CLIENT_GIVEN=1; shift 2 ;;
    --peer-python) PEER_PY=$2; shift 2 ;;
    --peer-backend) PEER_BACKEND=$2; PEER_BACKEND_GIVEN=1; shift 2 ;;
    --peer-size) PEER_SIZE=$2; shift 2 ;;
    --peer-file) PEER_FILE=$2; PEER_FILE_ARG=$2; shift 2 ;;
    --peer-file-engine) PEER_FILE_ENGINE=$2; shift 2 ;;
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
case $RW in randread|randwrite|read|write) ;; *) bad_usage "--rw must be randread, randwrite, read or write" ;; esac
# size_bytes SIZE: SIZE (a number, or with a K, M, G or T suffix: powers of 1024) in
# bytes, or nothing when it is not a size.
size_bytes() {
  local n=${1%[KkMmGgTt]} m=1
  [[ $n =~ ^[0-9]+$ ]] || return 0
  case ${1:${#n}} in K|k) m=$((1 << 10)) ;; M|m) m=$((1 << 20)) ;; G|g) m=$((1 << 30)) ;; T|t) m=$((1 << 40)) ;; esac
  echo $((10#$n * m))
}
# human_size BYTES: the shortest exact form, e.g. 1G, 512M, 131072.
human_size() {
  local b=$1 u
  for u in T:40 G:30 M:20 K:10; do
    if [ "$b" -ge $((1 << ${u#*:})) ] && [ $((b % (1 << ${u#*:}))) = 0 ]; then echo "$((b >> ${u#*:}))${u%:*}"; return; fi
  done
  echo "$b"
}
BS_ARG=$BS
BS=$(size_bytes "$BS")
if [ -z "$BS" ] || [ "$BS" = 0 ]; then bad_usage "--bs $BS_ARG is not a size (bytes, or e.g. 128K)"; fi
[ "$COST" = 0 ] || [ "$BS" = 4096 ] || bad_usage "--cost measures 4 KiB I/Os only: drop --bs, or --cost"
case $PEER_BACKEND in null|ram|file) ;; *) bad_usage "--peer-backend must be null, ram or file" ;; esac
case $PEER_FILE_ENGINE in uring|aio) ;; *) bad_usage "--peer-file-engine must be uring or aio" ;; esac
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
  [ -z "$PEER_BACKEND_GIVEN$PEER_SIZE$PEER_FILE" ] || bad_usage "--peer-backend, --peer-size and --peer-file need --peer-spdk"
else
  # SPDK's vfio-user transport takes I/Os up to 128 KiB by default (its max_io_size),
  # and every backend here has 4 KiB blocks.
  if [ $((BS % 4096)) != 0 ] || [ "$BS" -gt 131072 ]; then
    bad_usage "--peer-spdk: --bs must be a multiple of 4096 up to 128K (SPDK's vfio-user transport's largest I/O)"
  fi
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
  # What both targets serve (--peer-backend): vnvme's --ns here, SPDK's bdev in spdk_rpcs.
  if [ "$PEER_BACKEND" = null ]; then
    [ -z "$PEER_SIZE$PEER_FILE" ] || bad_usage "--peer-size and --peer-file need --peer-backend ram or file"
  else
    [ -z "$NS_GIVEN" ] || bad_usage "--peer-backend $PEER_BACKEND sets vnvme's --ns itself: drop --ns"
    [ -n "$PEER_SIZE" ] || PEER_SIZE=$([ "$PEER_BACKEND" = ram ] && echo 1G || echo 4G)
    PEER_BYTES=$(size_bytes "$PEER_SIZE")
    if [ -z "$PEER_BYTES" ] || [ "$PEER_BYTES" = 0 ] || [ $((PEER_BYTES % (1 << 20))) != 0 ]; then
      bad_usage "--peer-size $PEER_SIZE must be a whole number of MiB (e.g. 1G, 512M)"
    fi
    PEER_SIZE=$(human_size "$PEER_BYTES")
  fi
  case $PEER_BACKEND in
    ram) NS="ram:$PEER_SIZE:lba=4096" ;;
    file)
      case $RW in randread|read) ;; *) bad_usage "--peer-backend file measures reads only: --rw randread or read" ;; esac
      if [ -z "$PEER_FILE" ]; then PEER_FILE="$ROOT/target/bench-peer-$PEER_SIZE.img"; mkdir -p "$ROOT/target"; fi
      # vnvme's --ns splits at ':', rpc.py its lines at blanks and quotes.
      [[ $PEER_FILE =~ ^[A-Za-z0-9._/+-]+$ ]] || bad_usage "--peer-file $PEER_FILE: letters, digits and ._/+- only"
      [ -d "$(dirname "$PEER_FILE")" ] || bad_usage "--peer-file $PEER_FILE: no such directory"
      PEER_FILE="$(cd "$(dirname "$PEER_FILE")" && pwd)/$(basename "$PEER_FILE")"
      fstype=$(stat -f -c %T "$(dirname "$PEER_FILE")")
      case $fstype in
        tmpfs|ramfs) bad_usage "--peer-file $PEER_FILE is on $fstype: O_DIRECT needs a disk's file system" ;;
      esac
      if [ -e "$PEER_FILE" ] && { [ ! -f "$PEER_FILE" ] || [ "$(stat -c %s "$PEER_FILE")" != "$PEER_BYTES" ]; }; then
        bad_usage "--peer-file $PEER_FILE is there, but not a regular file of --peer-size $PEER_SIZE (left alone:" \
          "remove it, or give its size)"
      fi
      NS="file:$PEER_FILE:lba=4096:engine=uring:direct=on"
      ;;
  esac
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
# <spdk>, --peer-file as <peer-file>: where they lie is this machine's business.
# hide_baseline: stdin to stdout with the baseline's path, as given and resolved,
# replaced by its file name, the SPDK tree's by <spdk> and the file's by <peer-file>
# (literally: no pattern characters).
hide_baseline() {
  local t
  t=$(cat)
  if [ -n "$BASELINE" ]; then t=${t//"$BASELINE"/${BASELINE##*/}}; t=${t//"$BASELINE_ARG"/${BASELINE_ARG##*/}}; fi
  if [ -n "$PEER_SPDK" ]; then t=${t//"$PEER_SPDK"/<spdk>}; t=${t//"$PEER_SPDK_ARG"/<spdk>}; fi
  if [ -n "$PEER_FILE" ]; then t=${t//"$PEER_FILE"/<peer-file>}; t=${t//"$PEER_FILE_ARG"/<peer-file>}; fi
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
# PART: --peer-file while it is being written (removed if the run stops meanwhile).
PART=
cleanup() { stop_serve; stop_back; rm -rf "$TMP"; [ -z "$PART" ] || rm -f "$PART"; }
trap cleanup EXIT
trap 'log "interrupted"; exit 130' INT TERM

log "building vnvme (release)"
(cd "$ROOT" && cargo build --release -p vnvme --quiet)
# The binary just built, whatever $VNVME_BIN says.
VNVME="$ROOT/target/release/vnvme"
VNVME_BIN=$VNVME
MEMCPY=
if [ "$PEER_BACKEND" != null ]; then
  log "building memcpy_bw (release; the host's memcpy bandwidth beside each point)"
  (cd "$ROOT" && cargo build --release -p guest-mem --example memcpy_bw --quiet)
  MEMCPY="$ROOT/target/release/examples/memcpy_bw"
fi

CLIENT_PIN=(); SERVER_PIN=()
if [ "$PIN" = 1 ]; then CLIENT_PIN=(taskset -c 0); SERVER_PIN=(taskset -c 1); fi
# --pin: the round trip of a cache line between the client's CPU and the server's,
# before and after every fresh run (runs/c2c.tsv): on a shared host the two vCPUs
# move between cores that share a cache and cores that do not (a polled pair then
# runs at half speed), and a pair of runs either side of such a move is flagged.
C2C=
if [ "$PIN" = 1 ]; then
  log "building core_to_core (release; the CPUs' placement before and after each run)"
  (cd "$ROOT" && cargo build --release -p guest-mem --example core_to_core --quiet)
  C2C="$ROOT/target/release/examples/core_to_core"
fi
VN_WRAP=("${SERVER_PIN[@]}")

MANIFEST="$OUT/runs/manifest.tsv"
[ -z "$C2C" ] || printf 'json\tbefore_ns\tafter_ns\n' >"$OUT/runs/c2c.tsv"
# c2c: the client's and the server's CPUs' round trip in ns, or nothing (not
# pinned, or the probe failed: logs/c2c.log says why).
c2c() { [ -z "$C2C" ] || "$C2C" --cpus 0,1 2>>"$OUT/logs/c2c.log" || true; }
# c2c_row JSON BEFORE: the row of a run whose probe before was BEFORE.
c2c_row() { [ -z "$C2C" ] || printf '%s\t%s\t%s\n' "$1" "$2" "$(c2c)" >>"$OUT/runs/c2c.tsv"; }
# moved JSON...: the runs' round trips spread by more than 2x (both measured).
moved() {
  [ -n "$C2C" ] || return 1
  awk -F'\t' -v want="$*" 'BEGIN { n = split(want, w, " "); for (i = 1; i <= n; i++) keep[w[i]] = 1 }
    ($1 in keep) { for (i = 2; i <= 3; i++) if ($i != "") { v = $i + 0; if (!lo || v < lo) lo = v; if (v > hi) hi = v } }
    END { exit !(lo > 0 && hi > 2 * lo) }' "$OUT/runs/c2c.tsv"
}
# again TRY WHAT JSON JSON: whether the pair of those two runs (try TRY) is to run
# again: its CPUs moved and tries are left. If so, says so, sets its runs aside and
# counts the two runs to come.
again() {
  local try=$1 what=$2
  shift 2
  { [ "$try" -lt "$MOVED_TRIES" ] && moved "$@"; } || return 1
  log "$what: the CPUs moved between or within the two runs: again"
  set_aside "$@"
  npoints=$((npoints + 2))
}
# set_aside JSON...: a pair run again because its CPUs moved: its runs' rows leave
# the manifest and runs/c2c.tsv for runs/moved/ (their files with them), counted in
# runs/moved/moved.tsv.
MOVED_TRIES=3
set_aside() {
  local j f
  mkdir -p "$OUT/runs/moved"
  [ -e "$OUT/runs/moved/moved.tsv" ] || printf 'json\n' >"$OUT/runs/moved/moved.tsv"
  for j in "$@"; do
    grep -F -- "$j" "$OUT/runs/c2c.tsv" >>"$OUT/runs/moved/c2c.tsv" || true
    grep -F -- "$j" "$MANIFEST" >>"$OUT/runs/moved/manifest.tsv" || true
    grep -v -F -- "$j" "$OUT/runs/c2c.tsv" >"$TMP/c2c.tsv" || true; cat "$TMP/c2c.tsv" >"$OUT/runs/c2c.tsv"
    grep -v -F -- "$j" "$MANIFEST" >"$TMP/manifest.tsv" || true; cat "$TMP/manifest.tsv" >"$MANIFEST"
    for f in "$OUT/${j%.json}".*; do [ -e "$f" ] && mv "$f" "$OUT/runs/moved/"; done
    printf '%s\n' "$j" >>"$OUT/runs/moved/moved.tsv"
  done
}
printf 'config\tqd\trep\tjson\trc\tserve_cmd\tperf_cmd\tsys_busy_ticks\twall_s\tside\tsteal_ticks\ttotal_ticks\tbeside\tclient\tdata_fds\n' >"$MANIFEST"

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
# The bdev nvmf_tgt serves (--peer-backend), the RPC that makes it, and its memory
# (-s, MiB: a malloc bdev's blocks come out of it).
SPDK_MEM=1024
case $PEER_BACKEND in
  null) SPDK_BDEV=null0; SPDK_BDEV_RPC="bdev_null_create null0 65536 4096" ;;
  ram) SPDK_BDEV=malloc0; SPDK_BDEV_RPC="bdev_malloc_create -b malloc0 $((PEER_BYTES >> 20)) 4096"
    SPDK_MEM=$((SPDK_MEM + (PEER_BYTES >> 20))) ;;
  file) SPDK_BDEV=${PEER_FILE_ENGINE}0; SPDK_BDEV_RPC="bdev_${PEER_FILE_ENGINE}_create $PEER_FILE $SPDK_BDEV 4096" ;;
esac
# spdk_rpcs MODE DIR: the RPC calls that make nvmf_tgt serve the bdev on a
# vfio-user socket DIR/cntrl, one a line (rpc.py reads them from stdin). Interrupt
# mode needs BAR0 not mappable (-M): every doorbell write then reaches nvmf_tgt as a
# message, unless the client takes the shadow doorbells it then offers.
spdk_rpcs() {
  printf '%s\n' "nvmf_create_transport -t VFIOUSER$([ "$1" = interrupt ] && echo ' -M')" \
    "$SPDK_BDEV_RPC" \
    "nvmf_create_subsystem $SPDK_NQN -a -s SPDK00000000000001 -m 32" \
    "nvmf_subsystem_add_ns $SPDK_NQN $SPDK_BDEV" \
    "nvmf_subsystem_add_listener $SPDK_NQN -t VFIOUSER -a $2 -s 0"
}
# spdk_tgt_args MODE RPC: nvmf_tgt's arguments.
spdk_tgt_args() {
  printf '%s\n' --no-huge -s "$SPDK_MEM" --no-pci -m "$SPDK_SERVER_MASK" -r "$2"
  [ "$1" = poll ] || echo --interrupt-mode
}
# --peer-backend ram: the pass that writes the whole RAM disk before each run (vnvme
# reads a chunk never written as zeroes, without a copy), with vnvme perf against
# either target; a second per GiB and one more (this host writes 5-6 GB/s that way).
# PREFILL_BS: no larger than SPDK's largest I/O.
PREFILL_BS=131072
PREFILL_SECONDS=$((1 + (PEER_BYTES + (1 << 30) - 1) / (1 << 30)))
PREFILL_ARGS=(perf --rw write --bs "$PREFILL_BS" --qd 16 --queues 1 --runtime "${PREFILL_SECONDS}s" --doorbells auto
              --completion poll)
# The O_DIRECT bit of open(2)'s flags on this machine (it differs between architectures).
O_DIRECT_BIT=$(python3 -c 'import os; print(os.O_DIRECT)')
# memcpy_random: " --random" when the I/Os land at random offsets (memcpy_bw then
# copies from random chunks of its source too).
memcpy_random() { case $RW in rand*) echo " --random" ;; esac; }
# --peer-backend file: the file, made once: a non-zero pattern, synced, so every
# block is allocated and written (neither a hole nor an unwritten extent reads from
# the disk); its pages then leave the page cache (both targets read it O_DIRECT).
PEER_FILE_NOTE=
if [ "$PEER_BACKEND" = file ]; then
  if [ ! -e "$PEER_FILE" ]; then
    log "writing <peer-file>: $PEER_SIZE of 0xa5 bytes, once (later runs use it as they find it)"
    PART="$PEER_FILE.part.$$"
    head -c "$PEER_BYTES" /dev/zero | tr '\000' '\245' >"$PART"
    sync "$PART"
    mv "$PART" "$PEER_FILE"
    PART=
    made="written by this run with 0xa5 bytes and synced"
  else
    made="found there (an earlier run writes 0xa5 bytes)"
  fi
  # Blocks past the end do not count: vnvme's io_uring backend probes fallocate
  # there at open, which can leave one unwritten block beyond EOF.
  if command -v filefrag >/dev/null; then
    read -r written unwritten < <(filefrag -v "$PEER_FILE" | awk -v size="$PEER_BYTES" '
      /blocks of [0-9]+ bytes/ { bs = $(NF - 1) }
      /^ *[0-9]+: / {
        line = $0; sub(/^ *[0-9]+: */, "", line); split(line, a, /(\.\.|:) */)
        n = size / bs; start = a[1] + 0; end = a[2] + 0
        if (start >= n) next
        if (end >= n) end = n - 1
        if ($0 ~ /unwritten/) u += (end - start + 1) * bs; else w += (end - start + 1) * bs
      }
      END { printf "%.0f %.0f\n", w, u }')
    how="filefrag: $written bytes written within the file, $unwritten unwritten"
  else
    written=$(( $(stat -c '%b * %B' "$PEER_FILE") )); unwritten=0
    how="no filefrag: $written bytes allocated (unwritten extents not told apart)"
  fi
  if [ "$written" -lt "$PEER_BYTES" ] || [ "$unwritten" != 0 ]; then
    die "<peer-file> has holes or unwritten extents, which read as zeroes without the disk ($how): remove it," \
      "and the next run writes it again"
  fi
  # Its pages leave the page cache: nothing of it is cached when the runs start.
  dd if="$PEER_FILE" iflag=nocache count=0 status=none
  PEER_FILE_NOTE="$PEER_BYTES bytes on $(stat -f -c %T "$PEER_FILE"), $made; $how"
fi
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
    printf 'spdk_nvme_perf\tspdk_nvme_perf --no-huge -s 1024 -c %s -q QD -o %s -w %s -t %s -r trtype:VFIOUSER traddr:<dir> subnqn:<nqn>\n' \
      "$SPDK_CLIENT_MASK" "$BS" "$RW" "$SECONDS_PER_POINT"
    printf 'backend\t%s\n' "$PEER_BACKEND"
    printf 'spdk_bdev\t%s\n' "$SPDK_BDEV_RPC"
    printf 'vnvme_ns\t%s\n' "$NS"
    if [ "$PEER_BACKEND" = ram ]; then
      printf 'prefill\t%s\n' "${CLIENT_PIN[*]} vnvme ${PREFILL_ARGS[*]} --socket <target's socket>"
    fi
    if [ -n "$MEMCPY" ]; then
      printf 'memcpy\t%s\n' "${SERVER_PIN[*]} memcpy_bw --chunk $BS --dst <QD x $BS> --src $MEMCPY_SRC --seconds $MEMCPY_SECONDS --repeat $REPEAT$(memcpy_random)"
    fi
    [ -z "$PEER_FILE_NOTE" ] || printf 'peer_file\t%s\n' "$PEER_FILE_NOTE"
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
# --peer-backend ram: the pass that writes the disk first, and a pause.
[ "$PEER_BACKEND" != ram ] || per_run=$((per_run + PREFILL_SECONDS + 1))
extra=0
# memcpy_bw before and after each point: its repetitions, a warm-up, filling its source.
[ -z "$MEMCPY" ] || extra=$(( ${#PEER_CFGS[@]} * ${#QD_LIST[@]} * 2 * (REPEAT / 2 + 2) ))
log "$npoints runs of ${SECONDS_PER_POINT}s (about $(( (npoints * per_run + extra + 59) / 60 )) min) -> $OUT"
log "$(nproc) CPU(s): client, server main thread and $WORKERS worker thread(s) share them$([ "$PIN" = 1 ] && echo ' (pinned: server CPU 1, client CPU 0)')"
[ "$REFERENCE" = none ] || log "reference $REFERENCE: ${PAIRED[*]} each measured beside it, $REPEAT pairs per point"
[ -z "$BASELINE" ] || log "baseline $(basename "$BASELINE")${BASELINE_LABEL:+ ($BASELINE_LABEL)} against this build, $REPEAT pairs per point"
if [ -n "$PEER_SPDK" ]; then
  log "beside $("$PEER_SPDK/build/bin/nvmf_tgt" --version 2>/dev/null | head -1): $(for c in "${PEER_CFGS[@]}"; do
    printf '%s with SPDK %s; ' "$c" "$([ "${PEER_MODE[$c]}" = poll ] && echo polling || echo --interrupt-mode)"; done)client(s)" \
    "${CLIENTS[*]}, $REPEAT pairs per point"
  log "backend $PEER_BACKEND: vnvme --ns $(printf '%s' "$NS" | hide_baseline); nvmf_tgt $(printf '%s' "$SPDK_BDEV_RPC" |
    hide_baseline); $BS-byte $RW"
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
  perf_args=(perf --rw "$RW" --bs "$BS" --qd "$qd" --queues 1 --runtime "${SECONDS_PER_POINT}s"
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
  printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$id" "$qd" "$rep" "$json" "$rc" "$serve_cmd" \
    "$(printf '%s' "${pin[*]} vnvme ${perf_args[*]}" | sed "s|$ROOT/||g")" "$((c1[0] - c0[0]))" \
    "$(awk -v a="$w0" -v b="$w1" 'BEGIN { printf "%.3f", b - a }')" "$side" \
    "$((c1[1] - c0[1]))" "$((c1[2] - c0[2]))" "$BESIDE" vnvme "" >>"$MANIFEST"
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
  local skip= before
  config_row "$1"
  serve_cmd=-
  before=$(c2c)
  if [ -z "$inproc" ]; then
    start_servers "$1" "$4" "-qd$2-r$3$SFX" || skip=1
  fi
  run_perf "$1" "$2" "$3" "$4" "$skip"
  stop_serve
  stop_back
  c2c_row "runs/$1-qd$2-r$3$SFX.json" "$before"
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

# run_peer ID QD REP SIDE CLIENT: one run of CLIENT (vnvme: vnvme perf; spdk:
# spdk_nvme_perf, through the report script's --run-spdk-perf, which reads the CPU
# clocks over its measuring window) against SIDE's target (vnvme or spdk), started
# by start_servers or start_spdk; its manifest row (with DATA_FDS).
run_peer() {
  local id=$1 qd=$2 rep=$3 side=$4 client=$5 rc=0 c0 c1 w0 w1 iops name json logf nqn cmd
  name="$id-qd$qd-r$rep-$client-$side"
  json="runs/$name.json"; logf="logs/perf-$name.log"
  if [ "$client" = vnvme ]; then
    cmd=("${CLIENT_PIN[@]}" "$VNVME" perf --rw "$RW" --bs "$BS" --qd "$qd" --queues 1 --runtime "${SECONDS_PER_POINT}s")
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
         -c "$SPDK_CLIENT_MASK" -q "$qd" -o "$BS" -w "$RW" -t "$SECONDS_PER_POINT"
         -r "trtype:VFIOUSER traddr:$traddr subnqn:$nqn")
  fi
  read -r -a c0 < <(vn_cpu_ticks); w0=$(now)
  timeout --kill-after=5 $(( ${SECONDS_PER_POINT%.*} + 60 )) "${cmd[@]}" >"$OUT/$logf" 2>&1 || rc=$?
  read -r -a c1 < <(vn_cpu_ticks); w1=$(now)
  done_runs=$((done_runs + 1))
  if [ "$client" = vnvme ]; then
    iops=$(sed -n 's/^  IOPS \([0-9]*\).*/\1/p' "$OUT/$logf")
  else
    iops=$(awk '$1 == "Total" && $2 == ":" { printf "%d", $3 }' "$OUT/$logf")
  fi
  log "$(printf '[%3d/%d] %-14s qd %-3s run %s, %-5s perf -> %-5s: %s IOPS%s' "$done_runs" "$npoints" "$id" "$qd" \
    "$rep" "$client" "$side" "${iops:-?}" "$([ "$rc" = 0 ] || echo " (exit $rc, see $logf)")")"
  printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$id" "$qd" "$rep" "$json" "$rc" "$serve_cmd" \
    "$(printf '%s' "${cmd[*]}" | sed "s|$OUT/||g; s|$ROOT/||g" | hide_baseline)" "$((c1[0] - c0[0]))" \
    "$(awk -v a="$w0" -v b="$w1" 'BEGIN { printf "%.3f", b - a }')" "$side" \
    "$((c1[1] - c0[1]))" "$((c1[2] - c0[2]))" "" "$client" "$DATA_FDS" >>"$MANIFEST"
}

# setup_failed WHAT LOG...: a target that could not be started or set up would fail
# every run the same way: say why, with the end of each LOG (relative to the
# output folder), and stop here, with no report.
setup_failed() {
  local what=$1 f
  shift
  log "$what"
  for f in "$@"; do
    [ -s "$OUT/$f" ] || continue
    log "the end of $f:"
    tail -n 12 "$OUT/$f" | cut -c1-300 | hide_baseline | sed 's/^/    /' >&2
  done
  if grep -q "Method not found" "$OUT/logs/rpc.log" 2>/dev/null; then
    log "(an RPC this nvmf_tgt does not have: built without CONFIG_URING? --peer-file-engine aio uses bdev_aio_create)"
  fi
  die "stopped: a set-up failure, no report (the runs so far are in $OUT)"
}

# target_name SIDE: the program that is SIDE's target (vnvme serve or nvmf_tgt).
target_name() { if [ "$1" = spdk ]; then echo nvmf_tgt; else echo "vnvme serve"; fi; }

# check_direct SIDE: how the target just started (SERVE_PID) holds --peer-file
# open, one word per descriptor into DATA_FDS (ro, wo or rw, +direct for O_DIRECT,
# from /proc/PID/fdinfo); stops unless one of them is O_DIRECT.
check_direct() {
  local fd flags acc fds=()
  for fd in /proc/"$SERVE_PID"/fd/*; do
    [ "$(readlink "$fd" 2>/dev/null)" = "$PEER_FILE" ] || continue
    flags=$(awk '$1 == "flags:" { print $2 }' "/proc/$SERVE_PID/fdinfo/${fd##*/}" 2>/dev/null) || continue
    [ -n "$flags" ] || continue
    case $((8#$flags & 3)) in 0) acc=ro ;; 1) acc=wo ;; *) acc=rw ;; esac
    [ $((8#$flags & O_DIRECT_BIT)) = 0 ] || acc+=+direct
    fds+=("$acc")
  done
  DATA_FDS=${fds[*]:-none}
  [[ $DATA_FDS == *+direct* ]] ||
    setup_failed "$(target_name "$1") does not hold <peer-file> open O_DIRECT (its descriptors for it: $DATA_FDS)"
}

# prefill SIDE NAME: --peer-backend ram: write the whole RAM disk of the target just
# started (vnvme perf, PREFILL_ARGS), and check that it did; stops otherwise. A
# vnvme server's stats file after the pass goes to runs/NAME.prefill-stats.json.
prefill() {
  local logf="logs/prefill-$2.log" json="$TMP/prefill.json" got
  rm -f "$json"
  if ! timeout --kill-after=5 $((PREFILL_SECONDS + 30)) "${CLIENT_PIN[@]}" "$VNVME" "${PREFILL_ARGS[@]}" --socket "$sock" --json "$json" \
      >"$OUT/$logf" 2>&1; then
    setup_failed "the pass that writes the RAM disk failed against $(target_name "$1")" "$logf"
  fi
  got=$(python3 -c 'import json, sys; r = json.load(open(sys.argv[1]))["results"]; print(r["ios"], r["errors"])' "$json")
  if [ "${got#* }" != 0 ] || [ $((${got% *} * PREFILL_BS)) -lt "$PEER_BYTES" ]; then
    setup_failed "the pass that writes the RAM disk wrote $((${got% *} * PREFILL_BS)) of $PEER_BYTES bytes to" \
      "$(target_name "$1"), with ${got#* } error(s)" "$logf"
  fi
  # vnvme serve replaces its stats file twice a second: 0.6 s on it holds the whole
  # pass (and nothing else: the run has not started). Both sides wait alike.
  sleep 0.6
  if [ "$1" = vnvme ] && [ -s "$stats" ]; then cp "$stats" "$OUT/runs/$2.prefill-stats.json"; fi
}

# memcpy_point ID QD WHEN: the host's memcpy bandwidth on the servers' CPU as the
# point's copies meet it (--bs chunks into QD x --bs of destination), into
# runs/memcpy-ID-qdQD-WHEN.json, and its row in runs/memcpy.tsv (the machine's
# CPU ticks over it).
memcpy_point() {
  local json="runs/memcpy-$1-qd$2-$3.json" c0 c1 w0 w1 rnd=()
  [[ $RW == rand* ]] && rnd=(--random)
  read -r -a c0 < <(vn_cpu_ticks); w0=$(now)
  "${SERVER_PIN[@]}" "$MEMCPY" --chunk "$BS" --dst $(($2 * BS)) --src "$MEMCPY_SRC" --seconds "$MEMCPY_SECONDS" \
    --repeat "$REPEAT" "${rnd[@]}" --json "$OUT/$json" 2>>"$OUT/logs/memcpy.log" || die "memcpy_bw failed (logs/memcpy.log)"
  read -r -a c1 < <(vn_cpu_ticks); w1=$(now)
  printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$1" "$2" "$3" "$json" "$((c1[0] - c0[0]))" \
    "$(awk -v a="$w0" -v b="$w1" 'BEGIN { printf "%.3f", b - a }')" "$((c1[1] - c0[1]))" "$((c1[2] - c0[2]))" \
    >>"$OUT/runs/memcpy.tsv"
  log "$(printf '%-14s qd %-3s %-6s %s' "$1" "$2" "$3" "$(tail -n 1 "$OUT/logs/memcpy.log" | sed 's/^memcpy_bw: //')")"
}

# peer_fresh ID QD REP SIDE CLIENT: one run of CLIENT against a fresh target of
# SIDE (vnvme serve in configuration ID, or nvmf_tgt in the SPDK mode ID meets),
# stopped right after it; with --peer-backend file, after checking it reads the
# file O_DIRECT; with ram, after the pass that writes the disk. A target that does
# not start or cannot be set up stops the whole run (setup_failed). spdk_nvme_perf
# reads no server counters: a vnvme server's stats file, written at its exit, is
# kept beside the run's JSON.
peer_fresh() {
  local id=$1 qd=$2 rep=$3 side=$4 client=$5 tag=-qd$2-r$3-client-$5 before
  config_row "$id"
  SFX=-$side
  before=$(c2c)
  if [ "$side" = spdk ]; then
    start_spdk "$id" "$tag" || setup_failed "nvmf_tgt did not start or could not be set up" logs/rpc.log \
      "logs/nvmf_tgt-$id$tag.log"
  else
    start_servers "$id" new "$tag" || setup_failed "vnvme serve did not start" "logs/serve-$id$tag.log"
  fi
  DATA_FDS=
  case $PEER_BACKEND in
    file) check_direct "$side" ;;
    ram) prefill "$side" "$id-qd$qd-r$rep-$client-$side" ;;
  esac
  run_peer "$id" "$qd" "$rep" "$side" "$client"
  stop_serve
  c2c_row "runs/$id-qd$qd-r$rep-$client-$side.json" "$before"
  if [ "$side" = vnvme ] && [ "$client" = spdk ] && [ -s "$stats" ]; then
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
  # A copying backend (ram, file): the memcpy bandwidth before and after each point.
  [ -z "$MEMCPY" ] || printf 'config\tqd\twhen\tjson\tsys_busy_ticks\twall_s\tsteal_ticks\ttotal_ticks\n' \
    >"$OUT/runs/memcpy.tsv"
  for cfg in "${PEER_CFGS[@]}"; do
    for qd in "${QD_LIST[@]}"; do
      [ -z "$MEMCPY" ] || memcpy_point "$cfg" "$qd" before
      for rep in $(seq "$REPEAT"); do
        for client in "${CLIENTS[@]}"; do
          order=(spdk vnvme); [ $((rep % 2)) = 0 ] && order=(vnvme spdk)
          for try in $(seq "$MOVED_TRIES"); do
            for side in "${order[@]}"; do
              peer_fresh "$cfg" "$qd" "$rep" "$side" "$client"
            done
            again "$try" "$cfg qd $qd run $rep, $client perf" \
              "runs/$cfg-qd$qd-r$rep-$client-spdk.json" "runs/$cfg-qd$qd-r$rep-$client-vnvme.json" || break
          done
        done
      done
      [ -z "$MEMCPY" ] || memcpy_point "$cfg" "$qd" after
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
        for try in $(seq "$MOVED_TRIES"); do
          for side in "${order[@]}"; do
            SFX=-$side
            run_fresh "$id" "$qd" "$rep" "$side"
          done
          again "$try" "$id qd $qd run $rep" "runs/$id-qd$qd-r$rep-base.json" "runs/$id-qd$qd-r$rep-new.json" || break
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
# Nor the SPDK tree (nvmf_tgt's log names its sources, the manifest its binaries),
# nor --peer-file.
if [ -n "$PEER_SPDK" ]; then
  { grep -rlF "$PEER_SPDK" "$OUT" 2>/dev/null || true; } | xargs -r sed -i "s#$PEER_SPDK#<spdk>#g"
fi
if [ -n "$PEER_FILE" ]; then
  { grep -rlF "$PEER_FILE" "$OUT" 2>/dev/null || true; } | xargs -r sed -i "s#$PEER_FILE#<peer-file>#g"
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
  --ns "$(printf '%s' "$NS" | hide_baseline)" --rw "$RW" --bs "$BS" --reference "$REFERENCE" --started "$STAMP" --matrix "$(printf '%s\n' "${MATRIX[@]}")" --command "$COMMAND_LINE"
