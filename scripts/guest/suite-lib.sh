# shellcheck shell=bash
# How scripts/guest-tests.sh runs one suite: boot a guest beside its own
# `vnvme serve --once`, count the guest's PASS/FAIL/SKIP lines, check the
# doorbell ratios between marks and the server's exit. Uses the runner's
# globals (work, here, tests_dir, accel, QEMU_EXTRA, VN_PID and the result
# counters) and its result() and tally(); sourced by it after guest-host.sh (scripts/lib).

# guest_adds: boot.sh --add arguments for every file in scripts/guest/tests
# plus the generated config.
guest_adds() { # CONFIGFILE
    local f
    GUEST_ADDS=(--add "$1:/tests/config.sh")
    for f in "$tests_dir"/*.sh; do GUEST_ADDS+=(--add "$f:/tests/${f##*/}"); done
}

# run_boot KERNEL DIR SCRIPT [BOOT.SH ARGS...]: boot with the server already
# listening on DIR/vnvme.sock; serial console -> DIR/guest.log, result lines
# echoed live. Sets BOOT_RC.
run_boot() {
    local k=$1 d=$2 script=$3
    shift 3
    guest_adds "$d/config.sh"
    vn_device_args "$d/vnvme.sock"
    VN_DEV_ARGS+=("${QEMU_EXTRA[@]}")
    cur_qemu_pidfile="$d/qemu.pid"
    # In the background + wait, so that INT/TERM run the trap at once.
    {
        brc=0
        "$here/guest/boot.sh" --kernel "$k" --accel "$accel" --run "$tests_dir/$script" \
            "${GUEST_ADDS[@]}" "$@" -- -pidfile "$d/qemu.pid" "${VN_DEV_ARGS[@]}" || brc=$?
        echo "$brc" >"$d/boot.rc"
    } 2>&1 | vn_watch "$d/marks" "$d/stats.json" | tee "$d/guest.log" |
        grep --line-buffered -E '^(PASS|FAIL|SKIP): |^== |^\[boot.sh\]|^doorbell run' |
        sed -u "s/^\(PASS\|FAIL\|SKIP\): /  guest \1: /; s/^/  [$k] /" &
    wait $! || true
    BOOT_RC=$(cat "$d/boot.rc" 2>/dev/null || echo 125)
    cur_qemu_pidfile=""
}

# guest_results KERNEL DIR: count the guest's PASS/FAIL/SKIP lines.
guest_results() {
    local k=$1 d=$2 line
    while IFS= read -r line; do
        tally "${line%%:*}" "$k" "guest: ${line#*: }"
    done < <(grep -aE '^(PASS|FAIL|SKIP): ' "$d/guest.log")
}

# db_ratio DIR NAME: "doorbells/IO interrupts/IO I/Os cq-doorbells/IO" between
# NAME-start and NAME-end.
db_ratio() {
    vn_mark_deltas "$1/marks" "$2-start" "$2-end" || return 1
    echo "$(vn_ratio "$VN_DB" "$VN_IO") $(vn_ratio "$VN_IRQ" "$VN_IO") $VN_IO $(vn_ratio "$VN_CQDB" "$VN_IO")"
}

# db_check KERNEL DIR PREFIX POLLMODE LIMIT: the fio runs between the marks
# PREFIX-{2x32,1x64,1x16,1x1}-{start,end} (jobs x QD, see tests/doorbells.sh).
# Over 2 jobs x QD 32, trapped doorbell writes per I/O must stay below LIMIT, and
# trapped CQ-head writes below 0.05 per I/O: the controller keeps CQ EventIdx one
# entry behind the head, so a guest following the EventIdx rule writes the CQ head
# register about once per queue wrap, where without shadow doorbells it writes it
# after every interrupt. The total depends on how fast the device drains the SQ
# compared to the guest (under TCG the guest is slow and most submissions find the
# device idle), so it is checked only against LIMIT; the CQ figure does not depend
# on timing. The single-job runs are reported.
db_check() {
    local k=$1 d=$2 p=$3 mode=$4 limit=$5 spec s db irq io cq what
    for spec in 2x32 1x64 1x16 1x1; do
        what="fio 4k randread, ${spec%x*} job(s) x QD${spec#*x}"
        if ! s=$(db_ratio "$d" "$p-$spec"); then
            result FAIL "$k" "shadow doorbells (--poll $mode): no counter snapshots for the $spec run ($d/marks)"
            continue
        fi
        read -r db irq io cq <<<"$s"
        if [[ $spec != 2x32 ]]; then
            echo "  [$k] info: --poll $mode, $what: $db trapped doorbells/IO ($cq CQ head), $irq interrupts/IO, $io I/Os"
        elif awk -v r="$db" -v m="$limit" -v c="$cq" 'BEGIN { exit !(r < m && c < 0.05) }'; then
            result PASS "$k" "shadow doorbells (--poll $mode), $what: $db trapped doorbells/IO (< $limit), of which CQ head $cq (< 0.05), $irq interrupts/IO, $io I/Os"
        else
            result FAIL "$k" "shadow doorbells (--poll $mode), $what: $db trapped doorbells/IO (want < $limit), CQ head $cq (want < 0.05), $irq interrupts/IO, $io I/Os"
        fi
    done
}

# server_done KERNEL DIR: wait for the --once server to exit; check its status.
server_done() {
    local k=$1 d=$2 rc=0
    vn_serve_wait "$VN_PID" 20 || rc=$?
    if [[ $rc -eq 124 ]]; then
        result FAIL "$k" "vnvme serve --once still running 20 s after QEMU exited (stopped)"
        vn_serve_stop "$VN_PID"
    elif [[ $rc -eq 0 ]]; then
        result PASS "$k" "vnvme serve --once exited 0 after QEMU disconnected ($(grep -a 'I/O commands' "$d/serve.log" | sed 's/^vnvme: //'))"
    else
        result FAIL "$k" "vnvme serve exited with status $rc (log: $d/serve.log)"
        tail -n 20 "$d/serve.log" | sed 's/^/    | /'
    fi
    VN_PID=""
    if grep -qa 'panicked' "$d/serve.log"; then
        result FAIL "$k" "vnvme serve panicked (log: $d/serve.log)"
    fi
}

write_config() { # FILE SERIAL N1 L1 N2 L2 N3 L3
    cat >"$1" <<EOF
SERIAL=$2
N1_BYTES=$3
N1_LBA=$4
N2_BYTES=$5
N2_LBA=$6
N3_BYTES=$7
N3_LBA=$8
EOF
}

# suite_boot KERNEL DIR NAME SCRIPT [BOOT.SH ARGS...] -- SERVE ARGS...: start
# `vnvme serve --once` on DIR/vnvme.sock with SERVE ARGS, boot the guest running
# SCRIPT, count its results and check its exit status and the server's. Returns 1
# if the server did not start.
suite_boot() {
    local k=$1 d=$2 name=$3 script=$4 boot=()
    shift 4
    while [[ $# -gt 0 && $1 != -- ]]; do
        boot+=("$1")
        shift
    done
    shift
    local attempt
    for attempt in 1 2; do
        if ! vn_serve_start "$d/serve.log" "$d/vnvme.sock" "$@" --once --stats-file "$d/stats.json" --log info; then
            result FAIL "$k" "vnvme serve did not start ($name suite)"
            return 1
        fi
        run_boot "$k" "$d" "$script" "${boot[@]}"
        # A guest whose kernel never reached init (no line from it at all) ran none
        # of the suite: seen once under TCG after the firmware had used the
        # controller and handed over. Boot once more, saying so; the first attempt's
        # logs stay beside (the server's last line counts what the client sent).
        if [[ $BOOT_RC -eq 124 && $attempt -eq 1 ]] && ! grep -qa '^vnvme-guest: ' "$d/guest.log"; then
            vn_serve_wait "$VN_PID" 20 || vn_serve_stop "$VN_PID"
            VN_PID=""
            mkdir -p "$d/attempt1"
            mv "$d/guest.log" "$d/serve.log" "$d/attempt1/"
            [[ ! -e $d/marks ]] || mv "$d/marks" "$d/attempt1/"
            [[ ! -e $d/stats.json ]] || mv "$d/stats.json" "$d/attempt1/"
            printf 'RETRY: %s: %s\n' "$k" "$name suite: the guest kernel did not reach init in the timeout; booted once more (first attempt: $d/attempt1)" |
                tee -a "$work/results.txt"
            continue
        fi
        break
    done
    guest_results "$k" "$d"
    if [[ $BOOT_RC -eq 0 ]]; then
        result PASS "$k" "$name suite guest script exited 0"
    else
        result FAIL "$k" "$name suite guest script exit status $BOOT_RC (124 timeout, 125 no status; serial log: $d/guest.log)"
    fi
    server_done "$k" "$d"
}
