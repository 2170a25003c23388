# shellcheck shell=dash
# Flexible Data Placement on FDP_DEV, whose controller offers endurance group 1
# with FDP_RUHS reclaim unit handles of FDP_RU bytes (config.sh; vnvme --fdp
# HANDLES:ru=SIZE, QEMU nvme-subsys fdp=on,fdp.nruh,fdp.runs). Checked, with
# nvme-cli's fdp commands: what Identify says, the configuration, usage,
# statistics and events log pages, reclaim unit handle status and update, writes
# placed through a handle by their Data Placement directive (nvme write -T 2 -S),
# an invalid placement identifier, the events the host enabled, what Linux makes
# of it (write streams, from Linux 6.16), and fio's FDP placement (io_uring
# passthrough on the namespace's character device) where a fio with it is there.
fdp_ns=${FDP_DEV#/dev/}
fdp_ctrl=/dev/${fdp_ns%n*}
fdp_nsid=${fdp_ns##*n}
fdp_lba=$(cat "/sys/block/$fdp_ns/queue/logical_block_size")
fdp_full=$((FDP_RU / fdp_lba))

# fdp_ruamw: each handle's Reclaim Unit Available Media Writes, in handle order.
fdp_ruamw() {
    nvme fdp status "$FDP_DEV" 2>&1 | sed -n 's/.*(RUAMW): *\([0-9]*\).*/\1/p' | tr '\n' ' ' | sed 's/ $//'
}
# fdp_hbmw: Host Bytes with Metadata Written (digits only: nvme-cli may group them).
fdp_hbmw() {
    nvme fdp stats "$fdp_ctrl" -e 1 2>&1 | sed -n 's/.*(HBMW): *//p' | tr -cd '0-9'
}
# fdp_expect H0 H1 ...: the RUAMW each handle should show, given as "full-N".
fdp_expect() {
    local out="" v
    for v in "$@"; do
        out="$out $((fdp_full - v))"
    done
    echo "${out# }"
}
# fdp_events: the host events, one "type pid;" each, in decimal.
fdp_events() {
    local t p
    nvme fdp events "$fdp_ctrl" -e 1 -E 2>&1 | awk '
        /Event Type:/ { t = $3 }
        /Placement Identifier \(PID\):/ { print t, $NF }' | while read -r t p; do
        printf '%d %d;' "$((t))" "$((p))"
    done
}
fdp_all_pids() {
    seq 0 $((FDP_RUHS - 1)) | tr '\n' ',' | sed 's/,$//'
}

ctratt=$(nvme id-ctrl "$fdp_ctrl" 2>/dev/null | field ctratt)
t_eq "id-ctrl: CTRATT flexible data placement (bit 19) and endurance groups (bit 4)" \
    "$(((${ctratt:-0} >> 19) & 1)) $(((${ctratt:-0} >> 4) & 1))" "1 1"
t_eq "id-ns: the namespace is in endurance group 1" "$(nvme id-ns "$FDP_DEV" 2>&1 | field endgid)" "1"
nvme fdp configs "$fdp_ctrl" -e 1 >/tmp/fdpc 2>&1
t_eq "fdp configs: one reclaim group of $FDP_RUHS handles of $FDP_RU bytes" \
    "$(sed -n 's/^ *Number of Reclaim Groups: *//p; s/^ *Number of Reclaim Unit Handles: *//p; s/^ *Reclaim Unit Nominal Size: *//p' /tmp/fdpc | tr '\n' ' ')" \
    "1 $FDP_RUHS $FDP_RU "
t_eq "fdp usage: every handle host specified" \
    "$(nvme fdp usage "$fdp_ctrl" -e 1 2>&1 | grep -c 'Host Specified')" "$FDP_RUHS"
if nvme get-feature "$fdp_ctrl" -f 0x1d -c 1 >/tmp/fdpf 2>&1; then
    v=$(sed -n 's/.*Current value: *\(0x[0-9a-fA-F]*\).*/\1/p' /tmp/fdpf)
    t_eq "get-feature 0x1d (FDP) of endurance group 1: enabled, configuration 0" "$((${v:-0x100}))" "1"
else
    t_fail "get-feature 0x1d: $(tail -1 /tmp/fdpf)"
fi
t_run "fdp configs of endurance group 2 is refused" sh -c "! nvme fdp configs $fdp_ctrl -e 2 >/dev/null 2>&1"

# From fresh reclaim units: what earlier checks wrote is not in the way.
t_run "fdp update: every handle to a fresh reclaim unit" nvme fdp update "$FDP_DEV" -p "$(fdp_all_pids)"
t_eq "fdp status: each of the $FDP_RUHS handles has a whole unit ($fdp_full blocks)" \
    "$(fdp_ruamw)" "$(for _ in $(seq "$FDP_RUHS"); do printf '%s ' "$fdp_full"; done | sed 's/ $//')"

# A write through placement handle 1 uses up handle 1's unit, and only that.
h0=$(fdp_hbmw)
dd if=/dev/urandom of=/tmp/fdpw bs=4096 count=2 2>/dev/null
nb=$((8192 / fdp_lba))
t_run "nvme write -T 2 -S 1: 8 KiB placed through handle 1" \
    nvme write "$FDP_DEV" -s 0 -c $((nb - 1)) -z 8192 -d /tmp/fdpw -T 2 -S 1
t_eq "fdp status: handle 1 down by $nb blocks, the others whole" "$(fdp_ruamw)" "$(fdp_expect 0 "$nb" 0 0)"
t_eq "fdp stats: host bytes written up by 8192" "$(($(fdp_hbmw) - h0))" "8192"
t_run "nvme read back the placed blocks" nvme read "$FDP_DEV" -s 0 -c $((nb - 1)) -z 8192 -d /tmp/fdpr
t_run "the placed data reads back as written" cmp /tmp/fdpw /tmp/fdpr
# A write without a directive goes through handle 0.
t_run "nvme write without a directive" nvme write "$FDP_DEV" -s 64 -c $((nb - 1)) -z 8192 -d /tmp/fdpw
t_eq "fdp status: handle 0 down by $nb blocks" "$(fdp_ruamw)" "$(fdp_expect "$nb" "$nb" 0 0)"

# Events: handle 1 reports a unit left not fully written; handle 0 an invalid
# placement identifier (the write still succeeds, through handle 0).
t_run "fdp set-events: handle 1, reclaim unit not fully written" \
    nvme fdp set-events "$FDP_DEV" -p 1 -t 0 -e
t_run "fdp set-events: handle 0, invalid placement identifier" \
    nvme fdp set-events "$FDP_DEV" -p 0 -t 3 -e
t_run "fdp update -p 1: handle 1 moves to a fresh unit" nvme fdp update "$FDP_DEV" -p 1
bad=$((FDP_RUHS + 5))
t_run "nvme write -T 2 -S $bad (no such handle) still succeeds" \
    nvme write "$FDP_DEV" -s 128 -c $((nb - 1)) -z 8192 -d /tmp/fdpw -T 2 -S "$bad"
t_eq "fdp status: handle 1 whole again, handle 0 took the invalid placement's write" \
    "$(fdp_ruamw)" "$(fdp_expect $((2 * nb)) 0 0 0)"
ev=$(fdp_events)
t_eq "fdp events -E: not fully written (PID 1), invalid placement identifier (PID $bad)" "$ev" "0 1;3 $bad;"
[ "$ev" = "0 1;3 $bad;" ] || nvme fdp events "$fdp_ctrl" -e 1 -E 2>&1 | head -30
t_run "fdp update naming a handle the namespace lacks is refused" \
    sh -c "! nvme fdp update $FDP_DEV -p $bad >/dev/null 2>&1"
t_run "fdp set-events -t 126 (a reserved event type) is refused" \
    sh -c "! nvme fdp set-events $FDP_DEV -p 0 -t 126 -e >/dev/null 2>&1"

# Linux 6.16 and later turn the placement handles into write streams.
q=/sys/block/$fdp_ns/queue
if [ -e "$q/max_write_streams" ]; then
    t_eq "Linux write streams: max_write_streams is the handle count" "$(cat "$q/max_write_streams")" "$FDP_RUHS"
else
    t_skip "Linux write streams: Linux $(uname -r) has none (6.16 and later)"
fi

# fio's own FDP placement over io_uring passthrough: fio reads the handles'
# status, then writes and verifies through placement handles 0 and 2 only.
ng=/dev/ng${fdp_ns#nvme}
if ! command -v fio-fdp >/dev/null 2>&1; then
    t_skip "fio fdp=1: no fio with FDP support in this guest (fio-fdp)"
elif [ ! -c "$ng" ]; then
    t_skip "fio fdp=1: no character device $ng"
else
    nvme fdp update "$FDP_DEV" -p "$(fdp_all_pids)" >/dev/null 2>&1
    h0=$(fdp_hbmw)
    if fio-fdp --name=fdp --filename="$ng" --ioengine=io_uring_cmd --cmd_type=nvme --fdp=1 --fdp_pli=0,2 \
        --rw=randwrite --bs=4k --iodepth=4 --size=1M --offset=4M --verify=crc32c --verify_fatal=1 \
        --output-format=terse >/tmp/fdpfio 2>&1; then
        t_pass "fio fdp=1 fdp_pli=0,2 (io_uring passthrough): 1 MiB written and verified"
    else
        t_fail "fio fdp=1: $(tail -3 /tmp/fdpfio | tr '\n' ' ')"
    fi
    set -- $(fdp_ruamw)
    t_eq "fio's writes went through handles 0 and 2 only" \
        "$([ "$1" -lt "$fdp_full" ] && echo used) $([ "$2" -eq "$fdp_full" ] && echo whole) $([ "$3" -lt "$fdp_full" ] && echo used) $([ "$4" -eq "$fdp_full" ] && echo whole)" \
        "used whole used whole"
    t_eq "fio's writes (data and verify headers) in host bytes written" \
        "$(($(fdp_hbmw) - h0 >= 1048576))" "1"
    t_eq "handles 0 and 2 took 1 MiB between them" \
        "$((2 * fdp_full - $1 - $3))" "$((1048576 / fdp_lba))"
fi
nvme fdp set-events "$FDP_DEV" -p 1 -t 0 >/dev/null 2>&1
nvme fdp set-events "$FDP_DEV" -p 0 -t 3 >/dev/null 2>&1
rm -f /tmp/fdpw /tmp/fdpr /tmp/fdpc /tmp/fdpf /tmp/fdpfio
unset fdp_ns fdp_ctrl fdp_nsid fdp_lba fdp_full ctratt h0 nb bad q ng
