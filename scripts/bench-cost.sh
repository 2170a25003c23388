#!/usr/bin/env bash
# Cost benchmark: what one I/O costs the server, in figures noise cannot move.
#
#   instructions per I/O  valgrind's callgrind (this machine has no hardware
#                         counters): the instructions `vnvme serve` executes per
#                         I/O of `vnvme perf` (4 KiB random reads, null namespace,
#                         --poll off), broken down by function, by crate and by
#                         step of a command's round trip (wait, receive, handle,
#                         reply, run, complete, interrupt, clock, the loop: each
#                         function's cost in the innermost step on its call
#                         path, with the system calls of each step). Startup and
#                         connection costs cancel: every point is measured twice,
#                         a short and a long run, and the cost per I/O is the
#                         difference of the instructions over the difference of
#                         the I/Os. The payload copy (libc memset/memcpy/memmove:
#                         the null backend's zero fill, a RAM backend's copy) is
#                         reported apart from the rest, the controller's own work.
#   system calls per I/O  the kernel's syscall tracepoints (perf stat), counted
#                         over the server's whole life at full speed (no valgrind),
#                         per kind.
#   in-process            `vnvme perf --in-process` (driver and controller in one
#                         process, inline, no socket) under callgrind: the
#                         controller path alone, split by crate.
#
# Not a test (scripts/test.sh never runs it): it prints every knob and version,
# writes results.json, table.md and chart.svg under results/cost/<UTC stamp>/, and
# appends one line per point to results/cost-history.jsonl (tracked), so a change
# that costs more shows in review.
#
# Usage: scripts/bench-cost.sh [--qd 1,16] [--doorbells trapped,shadow,eventfd]
#                              [--ns SPEC] [--short S] [--long S] [--reps N] [--out DIR]
#                              [--poll MODE] [--workers N] [--no-history] [--no-build] [--no-inprocess]
#                              [--peer-spdk DIR]
#
#   --qd LIST         queue depths (default 1,16)
#   --doorbells LIST  perf --doorbells modes against the server: trapped (every
#                     doorbell a vfio-user message), shadow (Doorbell Buffer Config +
#                     EventIdx, trapped when EventIdx asks), eventfd (the server's
#                     ioeventfd doorbells, with shadow) (default trapped,shadow,eventfd)
#   --ns SPEC         the namespace (default null:64G:lba=4096; ram:1G for the copy)
#   --poll MODE       the server's --poll (default off, as the history's points;
#                     adaptive or always: points named "... poll MODE", kept apart)
#   --workers N       the server's --workers (default 1, as the history's points; 0:
#                     inline mode, the default on a host with 2 CPUs or fewer: its
#                     points are named "... inline", so the history keeps them apart)
#   --short S, --long S  the two run lengths under callgrind (default 1 and 4 s)
#   --reps N          repetitions of every point (default 3): the count is exact for
#                     one run, but how many messages a wake-up brings, and so the
#                     work per I/O, depends on timing; the table gives the median and
#                     the min-max
#   --syscall-run S   the run length for the syscall count (default 3 s)
#   --out DIR         output folder (default results/cost/<UTC stamp>)
#   --no-history      do not append to results/cost-history.jsonl
#   --no-build        use target/release/vnvme as it is
#   --no-inprocess    skip the in-process points
#   --peer-spdk DIR   also measure SPDK's vfio-user target for the same work, beside
#                     the server's points: nvmf_tgt (DIR/build/bin, built by
#                     scripts/build-spdk-peer.sh for an instruction set valgrind runs,
#                     e.g. `-- ... --target-arch=x86-64-v3`; a -march=native build
#                     may use AVX-512, which valgrind cannot) in --interrupt-mode (its
#                     transport -M: shadow doorbells offered; the mode that sleeps,
#                     as --poll off does), a null bdev of 4 KiB blocks (reads leave
#                     the buffer untouched, as null:...:reads=untouched), under
#                     callgrind, driven by the same `vnvme perf --doorbells shadow
#                     --completion irq`. A fresh nvmf_tgt for every run; its counters
#                     are zeroed (callgrind_control -z) once it serves and dumped
#                     (-d) when the client has left, so its start-up is not counted
#                     and, as for vnvme, the short run's count is taken off the long
#                     one's. Its points are named "spdk interrupt qdN" and kept out
#                     of the history. Needs --doorbells to include shadow.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
# shellcheck source=scripts/lib/log.sh
source "$ROOT/scripts/lib/log.sh"
QDS=1,16
DOORBELLS=trapped,shadow,eventfd
NS=null:64G:lba=4096
WORKERS=1
POLL=off
SHORT=1
LONG=4
SYSRUN=3
REPS=3
OUT=
HISTORY=1
BUILD=1
INPROC=1
PEER_SPDK=
# The command as run, the script named from the checkout's root (never where this
# machine keeps it: bench-vfio-user.sh --cost calls it by its full path).
COMMAND_LINE="${0#"$ROOT"/} $*"

usage() { sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; }

while [ $# -gt 0 ]; do
  case "$1" in
    --qd) QDS=$2; shift 2 ;;
    --doorbells) DOORBELLS=$2; shift 2 ;;
    --ns) NS=$2; shift 2 ;;
    --workers) WORKERS=$2; shift 2 ;;
    --poll) POLL=$2; shift 2 ;;
    --short) SHORT=$2; shift 2 ;;
    --long) LONG=$2; shift 2 ;;
    --syscall-run) SYSRUN=$2; shift 2 ;;
    --reps) REPS=$2; shift 2 ;;
    --out) OUT=$2; shift 2 ;;
    --no-history) HISTORY=0; shift ;;
    --no-build) BUILD=0; shift ;;
    --no-inprocess) INPROC=0; shift ;;
    --peer-spdk) PEER_SPDK=$2; shift 2 ;;
    -h|--help) usage; exit 0 ;;
    *) log "unknown argument $1"; usage >&2; exit 2 ;;
  esac
done
[[ $QDS =~ ^[1-9][0-9]*(,[1-9][0-9]*)*$ ]] || bad_usage "--qd must be a list like 1,16"
[[ $DOORBELLS =~ ^(trapped|shadow|eventfd)(,(trapped|shadow|eventfd))*$ ]] \
  || bad_usage "--doorbells takes trapped, shadow, eventfd"
for n in "$SHORT" "$LONG" "$SYSRUN"; do
  [[ $n =~ ^[0-9]+([.][0-9]+)?$ ]] || bad_usage "run lengths are seconds"
done
[[ $REPS =~ ^[1-9][0-9]*$ ]] || bad_usage "--reps must be at least 1"
[[ $WORKERS =~ ^[0-9]$ ]] || bad_usage "--workers must be 0..9"
[[ $POLL =~ ^(off|adaptive|always)$ ]] || bad_usage "--poll must be off, adaptive or always"
python3 -c "import sys; sys.exit(0 if float('$LONG') > float('$SHORT') else 1)" \
  || bad_usage "--long must be longer than --short"
if [ -n "$PEER_SPDK" ]; then
  # Reports name the build's place as SPDK_DIR, never where this machine keeps it.
  COMMAND_LINE=${COMMAND_LINE//"$PEER_SPDK"/SPDK_DIR}
  [[ ,$DOORBELLS, == *,shadow,* ]] || bad_usage "--peer-spdk compares shadow doorbells: give --doorbells with shadow"
  [ -x "$PEER_SPDK/build/bin/nvmf_tgt" ] && [ -f "$PEER_SPDK/scripts/rpc.py" ] \
    || bad_usage "--peer-spdk $PEER_SPDK: no build/bin/nvmf_tgt and scripts/rpc.py there (build it with scripts/build-spdk-peer.sh)"
  PEER_SPDK=$(cd "$PEER_SPDK" && pwd)
  python3 "$PEER_SPDK/scripts/rpc.py" --dry-run nvmf_create_transport -t VFIOUSER >/dev/null 2>&1 \
    || bad_usage "--peer-spdk: python3 cannot run $PEER_SPDK/scripts/rpc.py"
fi

# The tools: valgrind (callgrind) and perf (syscall tracepoints), from Debian's
# archive when missing.
# shellcheck source=scripts/lib/packages.sh
source "$ROOT/scripts/lib/packages.sh"
need_cmds valgrind:valgrind callgrind_annotate:valgrind perf:linux-perf python3:python3
[ -z "$PEER_SPDK" ] || need_cmds callgrind_control:valgrind

if [ "$BUILD" = 1 ]; then
  (cd "$ROOT" && cargo build --release -p vnvme >&2)
fi
VNVME=$ROOT/target/release/vnvme
[ -x "$VNVME" ] || bad_usage "$VNVME is missing (drop --no-build)"

STAMP=$(date -u +%Y-%m-%dT%H-%M-%SZ)
[ -n "$OUT" ] || OUT=$ROOT/results/cost/$STAMP
mkdir -p "$OUT/raw"
rm -f "$OUT/retries.txt"
OUT=$(cd "$OUT" && pwd)
WORK=$(mktemp -d "${TMPDIR:-/tmp}/vnvme-bench-cost.XXXXXX")
SERVER=
cleanup() {
  [ -z "$SERVER" ] || kill "$SERVER" 2>/dev/null || true
  rm -rf "$WORK"
}
trap cleanup EXIT

log "$COMMAND_LINE"
log "vnvme: $("$VNVME" --version)   valgrind: $(valgrind --version)   perf: $(perf --version)"
log "namespace $NS, 4 KiB randread, server --poll $POLL --workers $WORKERS, one queue; qd $QDS; doorbells $DOORBELLS"
log "callgrind runs ${SHORT} s and ${LONG} s per point; syscall run ${SYSRUN} s; $REPS repetitions; results in $OUT"
if [ -n "$PEER_SPDK" ]; then
  PEER_VERSION=$("$PEER_SPDK/build/bin/nvmf_tgt" --version 2>&1 | tail -1)
  log "peer: $PEER_VERSION (nvmf_tgt --interrupt-mode, null bdev, under callgrind)"
fi

wait_socket() { # path pid
  local _
  for _ in $(seq 1 600); do
    [ -S "$1" ] && return 0
    kill -0 "$2" 2>/dev/null || return 1
    sleep 0.05
  done
  return 1
}

serve_doorbells() { # the server's --doorbells for a perf mode
  case "$1" in eventfd) echo eventfd ;; *) echo trapped ;; esac
}

# One server, started under the command in WRAP (an array, e.g. valgrind or perf
# stat), and one perf run of SECONDS against it; the server ends with the client.
server_point() { # tag doorbells qd seconds extra-serve-flag...
  local tag=$1 db=$2 qd=$3 secs=$4 sock=$WORK/$1.sock
  shift 4
  rm -f "$sock"
  "${WRAP[@]}" "$VNVME" serve --socket "$sock" --ns "$NS" --poll "$POLL" --workers "$WORKERS" --once \
    --doorbells "$(serve_doorbells "$db")" --log warn "$@" 2>"$OUT/raw/$tag.serve.log" &
  SERVER=$!
  wait_socket "$sock" "$SERVER" || { log "$tag: the server did not start"; cat "$OUT/raw/$tag.serve.log" >&2; exit 1; }
  "$VNVME" perf --socket "$sock" --qd "$qd" --rw randread --runtime "${secs}s" --doorbells "$db" \
    --completion irq --json "$OUT/raw/$tag.perf.json" >"$OUT/raw/$tag.perf.txt" 2>&1 \
    || { log "$tag: perf failed"; cat "$OUT/raw/$tag.perf.txt" >&2; exit 1; }
  wait "$SERVER" || true
  SERVER=
}

# The server under callgrind (no sandbox: valgrind needs system calls it refuses).
callgrind_point() { # tag doorbells qd seconds
  WRAP=(valgrind --tool=callgrind --callgrind-out-file="$OUT/raw/$1.callgrind")
  server_point "$@" --sandbox off
  summarize_callgrind "$1"
}

# The function summary the report reads, then the profile compressed.
summarize_callgrind() { # tag
  callgrind_annotate --threshold=100 --inclusive=no --auto=no "$OUT/raw/$1.callgrind" >"$OUT/raw/$1.annotate" 2>/dev/null
  gzip -f -9 "$OUT/raw/$1.callgrind"
}

SYSCALLS=(recvmsg recvfrom sendmsg sendto read write readv writev epoll_wait epoll_pwait
  futex io_uring_enter ppoll poll nanosleep clock_nanosleep sched_yield)

# The server at full speed, its system calls counted over its whole life.
syscall_point() { # tag doorbells qd seconds
  local ev=raw_syscalls:sys_enter s
  for s in "${SYSCALLS[@]}"; do
    [ -d /sys/kernel/tracing/events/syscalls/sys_enter_"$s" ] || [ -d /sys/kernel/debug/tracing/events/syscalls/sys_enter_"$s" ] \
      && ev+=",syscalls:sys_enter_$s"
  done
  WRAP=(perf stat -x "," -o "$OUT/raw/$1.perfstat" -e "$ev" --)
  server_point "$@"
}

# SPDK's target under callgrind for one run of SECONDS (--peer-spdk): a fresh
# nvmf_tgt in interrupt mode serving a null bdev, its counters zeroed once it
# serves and dumped when the client has left; the dump is TAG.callgrind.
SPDK_NQN=nqn.2019-07.io.spdk:cnode0
spdk_point() { # tag doorbells qd seconds
  local tag=$1 db=$2 qd=$3 secs=$4 dir=$WORK/$1 rpc=$WORK/$1.rpc i
  mkdir -p "$dir"
  (cd "$WORK" && exec valgrind --tool=callgrind --callgrind-out-file="$WORK/$tag.cg" \
    "$PEER_SPDK/build/bin/nvmf_tgt" --no-huge -s 1024 --no-pci -m 0x2 -r "$rpc" --interrupt-mode) \
    >"$OUT/raw/$tag.nvmf_tgt.log" 2>&1 &
  SERVER=$!
  printf '%s\n' "nvmf_create_transport -t VFIOUSER -M" "bdev_null_create null0 65536 4096" \
    "nvmf_create_subsystem $SPDK_NQN -a -s SPDK00000000000001 -m 32" "nvmf_subsystem_add_ns $SPDK_NQN null0" \
    "nvmf_subsystem_add_listener $SPDK_NQN -t VFIOUSER -a $dir -s 0" \
    | python3 "$PEER_SPDK/scripts/rpc.py" -s "$rpc" -r 600 >>"$OUT/raw/$tag.rpc.log" 2>&1 \
    || { log "$tag: nvmf_tgt's set-up over RPC failed ($OUT/raw/$tag.rpc.log)"; exit 1; }
  wait_socket "$dir/cntrl" "$SERVER" || { log "$tag: nvmf_tgt did not serve"; tail "$OUT/raw/$tag.nvmf_tgt.log" >&2; exit 1; }
  callgrind_control -z "$SERVER" >/dev/null 2>&1
  "$VNVME" perf --socket "$dir/cntrl" --qd "$qd" --rw randread --runtime "${secs}s" --doorbells "$db" \
    --completion irq --json "$OUT/raw/$tag.perf.json" >"$OUT/raw/$tag.perf.txt" 2>&1 \
    || { log "$tag: perf failed"; cat "$OUT/raw/$tag.perf.txt" >&2; exit 1; }
  callgrind_control -d "$tag" "$SERVER" >/dev/null 2>&1
  [ -f "$WORK/$tag.cg.1" ] || { log "$tag: callgrind wrote no dump"; exit 1; }
  mv "$WORK/$tag.cg.1" "$OUT/raw/$tag.callgrind"
  kill -TERM "$SERVER" 2>/dev/null || true
  for ((i = 0; i < 300; i++)); do kill -0 "$SERVER" 2>/dev/null || break; sleep 0.1; done
  kill -KILL "$SERVER" 2>/dev/null || true
  wait "$SERVER" 2>/dev/null || true
  SERVER=
  rm -rf "$dir" "$rpc" "$WORK/$tag".cg* "$WORK"/vgcore.*
  summarize_callgrind "$tag"
}

# Driver and controller in one process, inline (no workers, no socket).
inprocess_point() { # tag qd seconds
  local tag=$1 qd=$2 secs=$3
  valgrind --tool=callgrind --callgrind-out-file="$OUT/raw/$tag.callgrind" \
    "$VNVME" perf --in-process --in-process-ns "$NS" --workers 0 --poll off --qd "$qd" --rw randread \
    --runtime "${secs}s" --doorbells shadow --completion poll --json "$OUT/raw/$tag.perf.json" \
    >"$OUT/raw/$tag.perf.txt" 2>&1 || { log "$tag: perf failed"; cat "$OUT/raw/$tag.perf.txt" >&2; exit 1; }
  summarize_callgrind "$tag"
}

ios_of() { # perf.json
  python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["results"]["ios"])' "$1"
}

# A short and a long run of one point. The cost per I/O is their difference, so a
# long run that a burst of other load held to less than half the I/O its length
# promises (LONG/SHORT times the short run's) says little: the pair is run again
# (twice at most), and each retry is listed under the report's table.
callgrind_pair() { # tag point-function args...
  local tag=$1 fn=$2 try n0 n1 msg
  shift 2
  for try in 1 2 3; do
    "$fn" "$tag-short" "$@" "$SHORT"
    "$fn" "$tag-long" "$@" "$LONG"
    n0=$(ios_of "$OUT/raw/$tag-short.perf.json")
    n1=$(ios_of "$OUT/raw/$tag-long.perf.json")
    python3 -c 'import sys; n0, n1, s, l = map(float, sys.argv[1:]); sys.exit(0 if n1 > n0 and 2 * n1 * s >= n0 * l else 1)' \
      "$n0" "$n1" "$SHORT" "$LONG" && return 0
    msg="$tag: the long run did $n1 I/Os, the short $n0 (disturbed)"
    if [ "$try" -lt 3 ]; then msg+="; run again"; else msg+=", kept after 3 tries"; fi
    log "$msg"
    echo "$msg" >>"$OUT/retries.txt"
  done
}

IFS=, read -r -a qds <<<"$QDS"
IFS=, read -r -a dbs <<<"$DOORBELLS"
# Repetitions interleaved: every point once, then every point again.
for r in $(seq 1 "$REPS"); do
  for db in "${dbs[@]}"; do
    for qd in "${qds[@]}"; do
      log "rep $r: server, doorbells $db, qd $qd"
      callgrind_pair "server-$db-qd$qd-r$r" callgrind_point "$db" "$qd"
      syscall_point "server-$db-qd$qd-r$r-sys" "$db" "$qd" "$SYSRUN"
    done
  done
  if [ -n "$PEER_SPDK" ]; then
    for qd in "${qds[@]}"; do
      log "rep $r: SPDK nvmf_tgt --interrupt-mode, doorbells shadow, qd $qd"
      callgrind_pair "spdk-shadow-qd$qd-r$r" spdk_point shadow "$qd"
    done
  fi
  if [ "$INPROC" = 1 ]; then
    for qd in "${qds[@]}"; do
      log "rep $r: in-process, qd $qd"
      callgrind_pair "inproc-qd$qd-r$r" inprocess_point "$qd"
    done
  fi
done

PEER_ARG=()
[ -z "$PEER_SPDK" ] || PEER_ARG=(--peer "$PEER_VERSION")
HIST_ARG=()
[ "$HISTORY" = 1 ] && HIST_ARG=(--history "$ROOT/results/cost-history.jsonl")
python3 "$ROOT/scripts/bench-cost.py" --root "$ROOT" --out "$OUT" --qd "$QDS" --doorbells "$DOORBELLS" \
  --ns "$NS" --short "$SHORT" --long "$LONG" --syscall-run "$SYSRUN" --inprocess "$INPROC" --reps "$REPS" --workers "$WORKERS" --poll "$POLL" \
  --command "$COMMAND_LINE" "${HIST_ARG[@]}" "${PEER_ARG[@]}"
