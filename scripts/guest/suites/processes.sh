# shellcheck shell=bash
# Sourced by scripts/guest-tests.sh: the server process replaced or lost under a guest: the upgrade and multipath suites.
# Functions only; they use its helpers (result, suite_boot, write_config, ...) and
# its variables ($work, $here, $VNVME_BIN, ...).

# The server replaced under a running guest, 10 times: the guest
# (scripts/guest/tests/upgrade.sh) keeps fio verify and an ext4 loop going and asks
# for each upgrade with a "@@VNVME-CTL upgrade@@" line; `vnvme ctl upgrade` starts
# the new process. The last one is the --once server that exits with QEMU.
suite_upgrade() {
    local k=$1
    local d="$work/$k-upgrade" t0 args rc out n_ok=0 stalls=() s last="" i took
    mkdir -p "$d"
    t0=$(date +%s)
    echo
    echo "== [$k] upgrade suite: the server replaced 10 times under fio verify and an ext4 loop"
    write_config "$d/config.sh" VNVMEGT0006 $((256 << 20)) 512 $((128 << 20)) 512 0 512
    export VN_CTL_SOCKET="$d/ctl.sock"
    if ! vn_serve_start "$d/serve.log" "$d/vnvme.sock" --ns ram:256M --ns "file:$d/n2.img:128M" \
        --control "$VN_CTL_SOCKET" --workers 1 --serial VNVMEGT0006 --once --stats-file "$d/stats.json" \
        --log info; then
        result FAIL "$k" "vnvme serve did not start (upgrade suite)"
        unset VN_CTL_SOCKET
        return
    fi
    run_boot "$k" "$d" upgrade.sh --timeout 480
    unset VN_CTL_SOCKET
    guest_results "$k" "$d"
    if [[ $BOOT_RC -eq 0 ]]; then
        result PASS "$k" "upgrade suite guest script exited 0"
    else
        result FAIL "$k" "upgrade suite guest script exit status $BOOT_RC (serial log: $d/guest.log)"
    fi
    while IFS=$'\t' read -r args rc out; do
        [[ $args == upgrade ]] || continue
        if [[ $rc -eq 0 && $out =~ -\>\ ([0-9]+).*stalled\ ([0-9.]+)\ ms ]]; then
            n_ok=$((n_ok + 1))
            last=${BASH_REMATCH[1]}
            stalls+=("${BASH_REMATCH[2]}")
        else
            result FAIL "$k" "vnvme ctl upgrade: exit $rc: $out"
        fi
    done <"$d/marks/ctl.log"
    UP_PID=$last
    s=$(printf '%s\n' "${stalls[@]}" | sort -n | awk '{ v[NR] = $1 } END { if (NR) printf "min %.1f, median %.1f, max %.1f", v[1], v[int((NR + 1) / 2)], v[NR] }')
    if [[ $n_ok -eq 10 ]]; then
        result PASS "$k" "10 upgrades under the guest, each a new process; server-side stall (quiesce to serving) ms: $s"
    else
        result FAIL "$k" "$n_ok of 10 upgrades succeeded ($d/marks/ctl.log)"
    fi
    took=$(grep -ac 'took over from pid' "$d/serve.log")
    if [[ $took -eq $n_ok ]] && ! vn_alive "$VN_PID"; then
        result PASS "$k" "server log: $took takeovers, the first server gone ($(grep -a 'handed over to a new process' "$d/serve.log" | head -1 | sed 's/^vnvme: //' | cut -c1-90))"
    else
        result FAIL "$k" "server log: $took takeovers for $n_ok upgrades, or the first server still runs"
    fi
    wait "$VN_PID" 2>/dev/null || true
    VN_PID=""
    # The last process is the --once server: it leaves when QEMU does.
    for ((i = 0; i < 200; i++)); do
        [[ -n $last ]] && vn_alive "$last" || break
        sleep 0.1
    done
    if [[ -n $last ]] && vn_alive "$last"; then
        result FAIL "$k" "the last server (pid $last) still runs 20 s after QEMU exited (killed)"
        kill -KILL "$last" 2>/dev/null || true
    elif [[ -n $last ]]; then
        result PASS "$k" "the last server (pid $last) exited after QEMU disconnected ($(grep -a 'I/O commands' "$d/serve.log" | tail -1 | sed 's/^vnvme: //' | cut -c1-100))"
    fi
    UP_PID=""
    if grep -qa 'panicked' "$d/serve.log"; then
        result FAIL "$k" "a vnvme process panicked (log: $d/serve.log)"
    fi
    if grep -qa 'hand-over failed' "$d/serve.log"; then
        result FAIL "$k" "server log: a hand-over failed: $(grep -a 'hand-over failed' "$d/serve.log" | head -1)"
    fi
    rm -f "$d/n2.img"
    echo "  [$k] upgrade suite: $(($(date +%s) - t0)) s"
}

# mp_action DIR ACTION: the multipath suite's guest asking the host to kill the
# second controller's process (@@VNVME-HOST mp-kill@@), or to put its ANA groups
# in a state through its control socket (ana-inaccessible, ana-optimized).
mp_action() {
    case $2 in
    mp-kill)
        if [[ -n $MP_PID ]] && kill -KILL "$MP_PID" 2>/dev/null; then
            echo "[host] controller 2's vnvme serve (pid $MP_PID) killed"
        else
            echo "[host] controller 2's vnvme serve was not running"
        fi
        ;;
    mp-upgrade)
        echo "[host] controller 2: vnvme ctl upgrade: $("$VNVME_BIN" ctl --control "$MP_CTL" upgrade 2>&1 | tr '\n' ' ')"
        ;;
    mp-crash)
        # Controller 2 under --restart-on-crash: its keeper is $MP_PID; the
        # serving process is the one that answers its control socket (after an
        # upgrade, not the keeper's child).
        local child
        child=$("$VNVME_BIN" ctl --control "$MP_CTL" --json ctrl.info 2>/dev/null |
            python3 -c 'import json, sys; print(json.load(sys.stdin)["pid"])' 2>/dev/null)
        if [[ -n $child ]] && kill -KILL "$child" 2>/dev/null; then
            echo "[host] controller 2's serving process (pid $child, keeper $MP_PID) killed"
        else
            echo "[host] controller 2's serving process was not running (keeper $MP_PID)"
        fi
        ;;
    ana-*)
        echo "[host] controller 2: vnvme ctl ana.set ${2#ana-}: $("$VNVME_BIN" ctl --control "$MP_CTL" ana.set "${2#ana-}" 2>&1)"
        ;;
    ns-create)
        echo "[host] controller 2: vnvme ctl ns.create 4M: $("$VNVME_BIN" ctl --control "$MP_CTL" ns.create 4M 2>&1 | tr '\n' ' ')"
        echo "[host] controller 2: vnvme ctl ns.attach 2 1,2: $("$VNVME_BIN" ctl --control "$MP_CTL" ns.attach 2 1,2 2>&1 | tr '\n' ' ')"
        ;;
    ns-delete)
        echo "[host] controller 2: vnvme ctl ns.delete 2: $("$VNVME_BIN" ctl --control "$MP_CTL" ns.delete 2 2>&1 | tr '\n' ' ')"
        ;;
    *) echo "[host] unknown action $2" ;;
    esac
}

# Two controllers of one subsystem, one process each (--cntlid 1 and 2, one
# serial, one image file), as two vfio-user-pci devices of one guest: Linux's
# native multipath over them, ANA taking controller 2's path out of service and
# back, then away for good (its process killed); with KILL=1 (multipath-kill),
# the abrupt loss of one controller's process under I/O instead.
suite_multipath() {
    local k=$1 kill=$2
    local name=multipath
    [[ $kill == 0 ]] || name=multipath-kill
    local d="$work/$k-$name" t0 io2
    mkdir -p "$d"
    t0=$(date +%s)
    echo
    echo "== [$k] $name suite: two controllers of one subsystem (--cntlid 1, 2) on one file$([[ $kill == 0 ]] || echo ', one killed')"
    write_config "$d/config.sh" VNVMEGTMP001 $((128 << 20)) 512 0 512 0 512
    echo "MP_KILL=$kill" >>"$d/config.sh"
    rm -f "$d/mp.img"
    truncate -s 128M "$d/mp.img"
    rm -f "$d/mp.resv"
    rm -rf "$d/pool"
    # Without the abrupt kill, controller 2 runs under a keeper that restarts it.
    local keeper=(--restart-on-crash)
    [[ $kill == 0 ]] || keeper=()
    if ! vn_serve_start "$d/serve2.log" "$d/vnvme2.sock" --ns "file:$d/mp.img:resv=$d/mp.resv" --serial VNVMEGTMP001 \
        --cntlid 2 --once --stats-file "$d/stats2.json" --log info --control "$d/ctl2.sock" --pool "$d/pool:64M" \
        "${keeper[@]}"; then
        result FAIL "$k" "controller 2's vnvme serve did not start"
        return
    fi
    MP_PID=$VN_PID
    MP_CTL=$d/ctl2.sock
    VN_PID=""
    QEMU_EXTRA=(-device pcie-root-port,id=rp5,chassis=6
        -device "{\"driver\":\"vfio-user-pci\",\"socket\":{\"type\":\"unix\",\"path\":\"$d/vnvme2.sock\"},\"bus\":\"rp5\"}")
    VN_HOST_ACTION=mp_action
    suite_boot "$k" "$d" "$name" multipath.sh --timeout 420 -- --ns "file:$d/mp.img:resv=$d/mp.resv" --serial VNVMEGTMP001 \
        --cntlid 1 --workers 1 --pool "$d/pool:64M"
    VN_HOST_ACTION=""
    QEMU_EXTRA=()
    # Both controllers carried the guest's I/O (round-robin).
    io2=$(vn_stat "$d/stats2.json" io_commands)
    if [[ ${io2:-0} -gt 1000 ]]; then
        result PASS "$k" "controller 2 served $io2 I/O commands"
    else
        result FAIL "$k" "controller 2 served '${io2}' I/O commands (want > 1000: round-robin uses both paths)"
    fi
    if [[ $kill == 0 ]]; then
        # Restarted once, the stand-in served on to the end: its keeper ends with
        # it when the VMM leaves (--once), status 0.
        local rc=0
        vn_serve_wait "$MP_PID" 20 || rc=$?
        if [[ $rc == 0 ]]; then
            result PASS "$k" "controller 2's keeper and its stand-in exited 0 after the guest"
        else
            result FAIL "$k" "controller 2's keeper: exit status $rc, want 0 ($d/serve2.log)"
            vn_serve_stop "$MP_PID"
        fi
    elif vn_alive "$MP_PID"; then
        result FAIL "$k" "controller 2's process is still running: the guest never asked for the kill"
        vn_serve_stop "$MP_PID"
    fi
    wait "$MP_PID" 2>/dev/null || true
    MP_PID=""
    if grep -qa 'panicked' "$d/serve2.log"; then
        result FAIL "$k" "controller 2's vnvme serve panicked (log: $d/serve2.log)"
    fi
    if [[ $kill == 0 ]]; then
        # The operator's ANA changes, as controller 2 logged them.
        local sets
        sets=$(grep -ac 'ANA state set' "$d/serve2.log")
        if [[ $sets -eq 2 ]]; then
            result PASS "$k" "controller 2 logged 2 ANA changes ($(grep -a 'ANA state set' "$d/serve2.log" |
                grep -o 'state="[a-z-]*' | tr -d '"' | tr '\n' ' '))"
        else
            result FAIL "$k" "controller 2 logged $sets ANA changes, want 2 ($d/serve2.log)"
        fi
        # The upgrade came while fio ran, and handed controller 2 to a new process.
        local upgraded ran
        upgraded=$(grep -an "controller 2: vnvme ctl upgrade: upgraded: pid [0-9]* -> [0-9]*" "$d/guest.log" |
            head -1 | cut -d: -f1)
        ran=$(grep -an "^[A-Z]*: controller 2's process upgraded under fio" "$d/guest.log" | cut -d: -f1)
        if [[ -n $upgraded && -n $ran && $upgraded -lt $ran ]]; then
            result PASS "$k" "controller 2 was upgraded while fio ran through the head ($(grep -ao 'upgraded: pid [0-9]* -> [0-9]*[^,]*, guest I/O stalled [0-9.]* ms' "$d/guest.log" | head -1))"
        else
            result FAIL "$k" "controller 2's upgrade (line '${upgraded}') did not come before fio's end (line '${ran}'): $(grep -a 'vnvme ctl upgrade' "$d/guest.log" | head -1)"
        fi
        # The kill came while fio ran (its line before fio's), the keeper saw it
        # and a stand-in took the connection over.
        local killed done
        killed=$(grep -an "controller 2's serving process (pid [0-9]*, keeper [0-9]*) killed" "$d/guest.log" |
            head -1 | cut -d: -f1)
        done=$(grep -an "^[A-Z]*: controller 2's process killed and restarted" "$d/guest.log" | cut -d: -f1)
        if [[ -n $killed && -n $done && $killed -lt $done ]]; then
            result PASS "$k" "controller 2's serving process was killed while fio ran through the head (line $killed of $done)"
        else
            result FAIL "$k" "controller 2's kill (line '${killed}') did not come before fio's end (line '${done}')"
        fi
        # (Killed after the upgrade, the serving process is not the keeper's child:
        # the keeper sees it die without its status.)
        if grep -qaE 'the serving process \(pid [0-9]+\) (was killed by signal 9 \(SIGKILL\)|died); starting another' \
            "$d/serve2.log" &&
            grep -qa 'standing in for a serving process that died (the client stays connected' "$d/serve2.log"; then
            result PASS "$k" "controller 2's keeper started a stand-in on the VMM's connection"
        else
            result FAIL "$k" "no stand-in on the VMM's connection in controller 2's log ($d/serve2.log)"
        fi
        # Whether QEMU had a message in flight when the process died is a matter of
        # timing: said, not checked (restart.rs makes it happen on purpose).
        local handed
        handed=$(grep -ao 'answered here first bytes=[0-9]* descriptor_groups=[0-9]*' "$d/serve2.log" | head -1)
        echo "controller 2's stand-in: ${handed:-nothing the dead process had read was left unanswered}"
    fi
    rm -rf "$d/mp.img" "$d/mp.resv" "$d/pool"
    echo "  [$k] $name suite: $(($(date +%s) - t0)) s"
}

# The multipath checks on QEMU's own nvme (not in the default run: a comparison,
# reported, not counted): an nvme-subsys with two nvme controllers and one shared
# namespace on a raw file, multipath.sh as for vnvme's multipath suite (whose
# counts it prints beside, when that ran too); the ANA states vnvme's host side
# changes are skipped.
suite_multipath_qemu() {
    local k=$1
    local d="$work/$k-multipath-qemu" t0
    mkdir -p "$d/qemu"
    t0=$(date +%s)
    echo
    echo "== [$k] multipath-qemu suite: the multipath checks on QEMU's nvme (nvme-subsys, two controllers, one shared namespace)"
    write_config "$d/qemu/config.sh" QEMUMP00001 $((128 << 20)) 512 0 512 0 512
    printf 'DEVICE=qemu-nvme\nCNTLIDS="0 1 "\nMP_KILL=0\n' >>"$d/qemu/config.sh"
    rm -f "$d/qemu/mp.img"
    truncate -s 128M "$d/qemu/mp.img"
    qemu_alone "$k" "$d/qemu" multipath.sh \
        -drive "file=$d/qemu/mp.img,if=none,id=m1,format=raw,cache=none,aio=io_uring" \
        -device nvme-subsys,id=ms0,nqn=vnvme-mp-compare \
        -device nvme,id=nv0,serial=QEMUMP00001,subsys=ms0 \
        -device nvme,id=nv1,serial=QEMUMP00001,subsys=ms0 \
        -device nvme-ns,drive=m1,nsid=1,shared=on
    local v="$work/$k-multipath/guest.log"
    echo "  [$k] multipath checks side by side (the same kernel and script):"
    if [[ -f $v ]]; then
        printf '    %-10s %s passed, %s failed\n' "vnvme:" "$(grep -ac '^PASS: ' "$v")" "$(grep -ac '^FAIL: ' "$v")"
    fi
    printf '    %-10s %s passed, %s failed, %s skipped (reported, not counted)\n' "QEMU nvme:" \
        "$(grep -ac '^PASS: ' "$d/qemu/guest.log")" "$(grep -ac '^FAIL: ' "$d/qemu/guest.log")" \
        "$(grep -ac '^SKIP: ' "$d/qemu/guest.log")"
    grep -ah '^FAIL: ' "$d/qemu/guest.log" | sed "s/^/      QEMU /"
    rm -f "$d/qemu/mp.img"
    echo "  [$k] multipath-qemu suite: $(($(date +%s) - t0)) s"
}
