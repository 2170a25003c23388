#!/usr/bin/env bash
# Wake-up stress: the case that once lost a command to a missed EventIdx wake-up
# (one in about a million), run for minutes and counted. `vnvme perf` at queue
# depth 1, 4 KiB random reads, shadow doorbells, against `vnvme serve` on a null
# namespace, in every arrangement the wake-up paths differ by:
#
#   inline (--workers 0) or one I/O worker (--workers 1);
#   the server on CPU 0 and the client on CPU 1, and the other way round;
#   alone, or with a CPU-bound neighbour (a busy loop) on the server's CPU.
#
# A stall is a run in which a command did not complete within --stall (perf's
# --timeout): at queue depth 1 on a null namespace a completion takes microseconds,
# so any wait of seconds is a command the server is not going to look at. For
# each stall the server's counters (`vnvme ctl stats.get`) and, where gdb exists,
# every thread's stack are kept beside the run's logs, taken while it is stuck.
#
# Not a test (scripts/test.sh never runs it: it takes as long as it is told). Usage:
#
#   scripts/stress-wakeup.sh [--minutes N] [--run SECONDS] [--stall SECONDS]
#                            [--configs a,b,...] [--poll MODE] [--out DIR] [--no-build]
#                            [--server-bin BIN] [--no-history]
#
#   --minutes N    total load time over every configuration (default 32: 4 minutes
#                  each of the 8)
#   --run SECONDS  one perf run (default 20); each configuration runs
#                  minutes*60/8/run of them against one server
#   --stall S      perf --timeout, the wait that counts as a stall (default 5)
#   --configs L    a subset of the configurations (`--list` shows them)
#   --poll MODE    `vnvme serve --poll` (default adaptive, the default)
#   --out DIR      output folder (default results/stress-wakeup/<UTC timestamp>)
#   --no-build     use target/release/vnvme as it is
#   --server-bin BIN  serve with another vnvme binary (an earlier build, to show
#                  what it did); perf is always this tree's
#   --no-history   do not append to results/stress-wakeup-history.jsonl
#
# Prints a table (configuration, runs, minutes, I/Os, stalls) and writes
# results.json and table.md to the output folder, with every run's perf JSON and
# the servers' logs; appends the summary to results/stress-wakeup-history.jsonl.
# Exits 1 if any run stalled (or failed otherwise), so it can gate a change.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
# shellcheck source=scripts/lib/host.sh
source "$ROOT/scripts/lib/host.sh"
MINUTES=32
RUN_S=20
STALL_S=5
POLL=adaptive
CONFIGS=""
OUT=""
BUILD=1
SERVER_BIN=""
HISTORY=1
ALL_CONFIGS=(
    inline-s0c1 inline-s1c0 inline-s0c1-neighbour inline-s1c0-neighbour
    worker-s0c1 worker-s1c0 worker-s0c1-neighbour worker-s1c0-neighbour
)

usage() { sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; }
while [ $# -gt 0 ]; do
    case "$1" in
    --minutes) MINUTES=$2; shift 2 ;;
    --run) RUN_S=$2; shift 2 ;;
    --stall) STALL_S=$2; shift 2 ;;
    --configs) CONFIGS=$2; shift 2 ;;
    --poll) POLL=$2; shift 2 ;;
    --out) OUT=$2; shift 2 ;;
    --no-build) BUILD=0; shift ;;
    --server-bin) SERVER_BIN=$2; shift 2 ;;
    --no-history) HISTORY=0; shift ;;
    --list) printf '%s\n' "${ALL_CONFIGS[@]}"; exit 0 ;;
    -h | --help) usage; exit 0 ;;
    *) bad_usage "unknown argument $1 (--help lists them)" ;;
    esac
done
[[ $MINUTES =~ ^[0-9]+([.][0-9]+)?$ && $RUN_S =~ ^[0-9]+$ && $RUN_S -ge 1 && $STALL_S =~ ^[0-9]+$ ]] ||
    bad_usage "--minutes takes a number, --run and --stall whole seconds (--run at least 1)"
if [ -n "$CONFIGS" ]; then
    IFS=, read -r -a SELECTED <<<"$CONFIGS"
    for c in "${SELECTED[@]}"; do
        [[ " ${ALL_CONFIGS[*]} " == *" $c "* ]] || bad_usage "no configuration $c (--list shows them)"
    done
else
    SELECTED=("${ALL_CONFIGS[@]}")
fi
[ "$(nproc)" -ge 2 ] || bad_usage "needs 2 CPUs (server and client on different ones); this machine has $(nproc)"
RUNS=$(python3 -c "import math; print(max(1, math.ceil($MINUTES * 60 / ${#SELECTED[@]} / $RUN_S)))")

if [ "$BUILD" = 1 ]; then
    (cd "$ROOT" && cargo build --release --locked -p vnvme >&2)
fi
[ -x "$VNVME_BIN" ] || bad_usage "no binary at $VNVME_BIN (run without --no-build)"
OUT=${OUT:-$ROOT/results/stress-wakeup/$(date -u +%Y%m%dT%H%M%SZ)}
mkdir -p "$OUT/runs" "$OUT/logs"
PERF_BIN=$VNVME_BIN
SERVER_BIN=${SERVER_BIN:-$VNVME_BIN}
[ -x "$SERVER_BIN" ] || bad_usage "--server-bin $SERVER_BIN is not an executable"
VERSION=$("$SERVER_BIN" --version)
GDB=$(command -v gdb || true)

log "serve $VERSION, perf $("$PERF_BIN" --version); $(nproc) CPUs, $(uname -sr)"
log "perf: randread bs=4k qd=1 doorbells=shadow completion=poll runtime=${RUN_S}s timeout=${STALL_S}s"
log "serve: --ns null:1G:lba=4096 --poll $POLL; $RUNS runs of ${RUN_S}s per configuration, ${#SELECTED[@]} configurations"
[ -n "$GDB" ] || log "no gdb: a stall keeps the server's counters but not its threads' stacks"

NEIGHBOUR=""
SERVER=""
cleanup() {
    [ -z "$NEIGHBOUR" ] || kill "$NEIGHBOUR" 2>/dev/null || true
    vn_serve_stop "$SERVER"
}
trap cleanup EXIT

# One configuration: RUNS perf runs against one server. Appends a JSON object per
# configuration to $OUT/configs.jsonl.
run_config() {
    local name=$1 workers s c neighbour=0 i rc ios stalls=0 failures=0 total_ios=0 secs=0 t0 t1
    case $name in inline-*) workers=0 ;; *) workers=1 ;; esac
    case $name in *-s0c1*) s=0 c=1 ;; *) s=1 c=0 ;; esac
    [[ $name != *-neighbour ]] || neighbour=1
    local sock="$OUT/$name.sock" ctl="$OUT/$name.ctl"
    rm -f "$ctl"
    VN_WRAP=(taskset -c "$s")
    VNVME_BIN=$SERVER_BIN vn_serve_start "$OUT/logs/$name-serve.log" "$sock" --ns null:1G:lba=4096 --workers "$workers" \
        --poll "$POLL" --control "$ctl" || return 1
    SERVER=$VN_PID
    if [ "$neighbour" = 1 ]; then
        taskset -c "$s" sh -c 'while :; do :; done' &
        NEIGHBOUR=$!
    fi
    for ((i = 1; i <= RUNS; i++)); do
        local tag="$name-$i"
        t0=$(date +%s.%N)
        taskset -c "$c" "$PERF_BIN" perf --socket "$sock" --rw randread --bs 4k --qd 1 --doorbells shadow \
            --runtime "${RUN_S}s" --timeout "${STALL_S}s" --json "$OUT/runs/$tag.json" \
            >"$OUT/logs/$tag-perf.log" 2>&1 &
        local perf=$!
        # Watch for a stall while it is happening: past the run time plus half the
        # stall wait, the server is stuck with a command; take its state now.
        local watched=0
        while vn_alive "$perf"; do
            sleep 0.5
            if [ "$watched" = 0 ] && python3 -c "import sys,time; sys.exit(0 if time.time() - $t0 > $RUN_S + $STALL_S / 2 else 1)"; then
                watched=1
                "$PERF_BIN" ctl --control "$ctl" --json stats.get >"$OUT/logs/$tag-stall-stats.json" 2>&1 || true
                [ -z "$GDB" ] || "$GDB" -p "$SERVER" -batch -ex "thread apply all bt" >"$OUT/logs/$tag-stall-threads.txt" 2>&1 || true
            fi
        done
        rc=0
        wait "$perf" || rc=$?
        t1=$(date +%s.%N)
        secs=$(python3 -c "print($secs + $t1 - $t0)")
        ios=$(python3 -c "import json; print(json.load(open('$OUT/runs/$tag.json'))['results']['ios'])" 2>/dev/null || echo 0)
        total_ios=$((total_ios + ios))
        if [ "$rc" -ne 0 ]; then
            if grep -q "timed out" "$OUT/logs/$tag-perf.log"; then
                stalls=$((stalls + 1))
                echo "  STALL $tag after $ios I/Os: $(grep -m1 'timed out' "$OUT/logs/$tag-perf.log")"
            else
                failures=$((failures + 1))
                echo "  FAILED $tag (exit $rc): $(tail -n 1 "$OUT/logs/$tag-perf.log")"
            fi
        else
            rm -f "$OUT/logs/$tag-stall-stats.json" "$OUT/logs/$tag-stall-threads.txt"
        fi
        if ! vn_alive "$SERVER"; then
            failures=$((failures + 1))
            echo "  FAILED $name: the server exited (its log: $OUT/logs/$name-serve.log)"
            break
        fi
    done
    if [ -n "$NEIGHBOUR" ]; then
        kill "$NEIGHBOUR" 2>/dev/null || true
        wait "$NEIGHBOUR" 2>/dev/null || true
        NEIGHBOUR=""
    fi
    vn_serve_stop "$SERVER"
    SERVER=""
    rm -f "$sock" "$ctl"
    printf '{"config":"%s","workers":%s,"server_cpu":%s,"client_cpu":%s,"neighbour":%s,"runs":%s,"seconds":%s,"ios":%s,"stalls":%s,"failures":%s}\n' \
        "$name" "$workers" "$s" "$c" "$neighbour" "$((i > RUNS ? RUNS : i))" "$secs" "$total_ios" "$stalls" "$failures" >>"$OUT/configs.jsonl"
    printf '  %-24s %3d runs %6.1f min %12d I/Os %2d stalls %2d failures\n' "$name" "$((i > RUNS ? RUNS : i))" \
        "$(python3 -c "print($secs / 60)")" "$total_ios" "$stalls" "$failures"
}

: >"$OUT/configs.jsonl"
for name in "${SELECTED[@]}"; do
    run_config "$name" || echo "  FAILED $name: the server did not start"
done

python3 - "$OUT" "$VERSION" "$POLL" "$RUN_S" "$STALL_S" "$ROOT" "$HISTORY" <<'PY'
import json, os, sys, time
out, version, poll, run_s, stall_s, root, keep_history = sys.argv[1:]
history = os.path.join(root, "results", "stress-wakeup-history.jsonl") if keep_history == "1" else None
sys.path.insert(0, os.path.join(root, "scripts", "lib"))
from vnvme_report import machine, machine_md
configs = [json.loads(l) for l in open(f"{out}/configs.jsonl")]
total = {k: sum(c[k] for c in configs) for k in ("runs", "seconds", "ios", "stalls", "failures")}
doc = {
    "tool": "scripts/stress-wakeup.sh",
    "when_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    "vnvme": version,
    "machine": machine(root),
    "knobs": {"poll": poll, "run_s": int(run_s), "stall_s": int(stall_s), "ns": "null:1G:lba=4096",
              "perf": "randread bs=4k qd=1 doorbells=shadow completion=poll"},
    "configs": configs,
    "total": total,
}
json.dump(doc, open(f"{out}/results.json", "w"), indent=1)
rows = ["| configuration | runs | minutes | I/Os | stalls | other failures |", "|---|---|---|---|---|---|"]
for c in configs + [dict(total, config="**total**")]:
    rows.append(f"| {c['config']} | {c['runs']} | {c['seconds'] / 60:.1f} | {c['ios']:,} | {c['stalls']} | {c['failures']} |")
head = [f"{version} (the server), --poll {poll}, runs of {run_s} s, stall = {stall_s} s without a completion", ""]
head += machine_md(doc["machine"]) + [""]
open(f"{out}/table.md", "w").write("\n".join(head + rows) + "\n")
if history:
    with open(history, "a") as h:
        h.write(json.dumps({"when_utc": doc["when_utc"], "vnvme": version, "poll": poll, **total}) + "\n")
print(f"stress-wakeup: {total['runs']} runs, {total['seconds'] / 60:.1f} minutes, {total['ios']:,} I/Os, "
      f"{total['stalls']} stalls, {total['failures']} other failures ({out})")
sys.exit(1 if total["stalls"] or total["failures"] else 0)
PY
