# shellcheck shell=dash
# nvme-cli admin commands against the controller (sourced by main.sh).

# Identify Controller: serial, namespace count, OACS with Doorbell Buffer Config.
if nvme id-ctrl /dev/nvme0 >/tmp/idctrl 2>&1; then
    t_pass "nvme id-ctrl"
    t_eq "id-ctrl sn" "$(field sn </tmp/idctrl)" "$SERIAL"
    t_eq "id-ctrl nn" "$(field nn </tmp/idctrl)" "${NN:-4}"
    oacs=$(field oacs </tmp/idctrl)
    if [ $(((oacs >> 8) & 1)) = 1 ]; then
        t_pass "id-ctrl oacs $oacs: Doorbell Buffer Config (bit 8) set"
    else
        t_fail "id-ctrl oacs $oacs: Doorbell Buffer Config (bit 8) not set"
    fi
    if [ $(((oacs >> 1) & 1)) = 1 ]; then
        t_pass "id-ctrl oacs $oacs: Format NVM (bit 1) set"
    else
        t_fail "id-ctrl oacs $oacs: Format NVM (bit 1) not set"
    fi
    # Commands Supported and Effects (LID 05h, NVM command set) agrees with OACS
    # and ONCS: each optional command is in the log exactly when its bit is set
    # (admin: Namespace Management, Attachment, Doorbell Buffer Config, Format NVM;
    # I/O: Compare, Write Zeroes, Dataset Management, Verify, the four reservation
    # commands, Copy), as Linux reads both.
    oncs=$(field oncs </tmp/idctrl)
    if nvme get-log /dev/nvme0 -i 5 -l 4096 -b >/tmp/effects 2>/tmp/effects.err; then
        bad=""
        for e in a:13:3 a:21:3 a:124:8 a:128:1 i:5:0 i:8:3 i:9:2 i:12:7 i:13:5 i:14:5 i:17:5 i:21:5 i:25:8; do
            cs=${e%%:*} rest=${e#*:}
            op=${rest%%:*} bit=${rest#*:}
            if [ "$cs" = a ]; then off=$((op * 4)) reg=$oacs; else off=$((1024 + op * 4)) reg=$oncs; fi
            csupp=$(($(od -An -tu4 -j"$off" -N4 /tmp/effects | tr -d ' ') & 1))
            [ "$csupp" = $(((reg >> bit) & 1)) ] || bad="$bad $cs$op(CSUPP $csupp, bit $bit)"
        done
        if [ -z "$bad" ]; then
            t_pass "effects log agrees with id-ctrl oacs $oacs and oncs $oncs on every optional command"
        else
            t_fail "effects log disagrees with id-ctrl oacs $oacs, oncs $oncs:$bad"
        fi
    else
        t_fail "nvme get-log 0x05 (Commands Supported and Effects): $(head -3 /tmp/effects.err)"
    fi
else
    t_fail "nvme id-ctrl"
    cat /tmp/idctrl
fi

# Identify Namespace: size in blocks and the LBA format in use.
# check_ns NSID BYTES LBA: nsze and the in-use lbaf (Identify Namespace for NSID).
check_ns() {
    if ! nvme id-ns /dev/nvme0 --namespace-id="$1" >/tmp/idns 2>&1; then
        t_fail "nvme id-ns n$1"
        cat /tmp/idns
        return
    fi
    want_nsze=$(printf '0x%x' $(($2 / $3)))
    case $3 in 512) want_ds=9 ;; 4096) want_ds=12 ;; esac
    got_ds=$(grep '(in use)' /tmp/idns | sed -n 's/.*lbads:\([0-9]*\).*/\1/p')
    if [ "$(field nsze </tmp/idns)" = "$want_nsze" ] && [ "$got_ds" = "$want_ds" ]; then
        t_pass "nvme id-ns n$1: nsze $want_nsze, in-use LBA format lbads:$got_ds ($3 B)"
    else
        t_fail "nvme id-ns n$1: nsze $(field nsze </tmp/idns) lbads:$got_ds, want $want_nsze lbads:$want_ds"
        grep -E 'nsze|flbas|lbaf' /tmp/idns
    fi
}
check_ns 1 "$N1_BYTES" "$N1_LBA"
check_ns 2 "$N2_BYTES" "$N2_LBA"
check_ns 3 "$N3_BYTES" "$N3_LBA"

# Active namespace list.
if nvme list-ns /dev/nvme0 >/tmp/listns 2>&1; then
    want=$(i=1; while [ $i -le "${NN:-4}" ]; do printf '0x%x ' $i; i=$((i + 1)); done)
    t_eq "nvme list-ns" "$(sed 's/.*://' /tmp/listns | tr '\n' ' ')" "$want"
else
    t_fail "nvme list-ns"
    cat /tmp/listns
fi

# SMART / Health and Error Information logs.
if nvme smart-log /dev/nvme0 >/tmp/smart 2>&1; then
    t_eq "nvme smart-log critical_warning" "$(field critical_warning </tmp/smart)" 0
    reads=$(field host_read_commands </tmp/smart)
    if [ "${reads:-0}" -gt 0 ] 2>/dev/null; then
        t_pass "nvme smart-log host_read_commands: $reads"
    else
        t_fail "nvme smart-log host_read_commands: '$reads'"
    fi
else
    t_fail "nvme smart-log"
    cat /tmp/smart
fi
t_run "nvme error-log" nvme error-log /dev/nvme0 -e 4

# Features: read, change, read back, restore.
# feature FID VALUE NAME
feature() {
    if ! nvme get-feature /dev/nvme0 -f "$1" >/tmp/gf 2>&1; then
        t_fail "nvme get-feature $3"
        cat /tmp/gf
        return
    fi
    old=$(sed -n 's/.*Current value:\(0x[0-9a-fA-F]*\).*/\1/p' /tmp/gf)
    if [ -z "$old" ]; then
        t_fail "nvme get-feature $3: no current value in its output"
        cat /tmp/gf
        return
    fi
    if ! nvme set-feature /dev/nvme0 -f "$1" -v "$2" >/tmp/sf 2>&1; then
        t_fail "nvme set-feature $3 $2"
        cat /tmp/sf
        return
    fi
    new=$(nvme get-feature /dev/nvme0 -f "$1" 2>&1 | sed -n 's/.*Current value:\(0x[0-9a-fA-F]*\).*/\1/p')
    t_eq "nvme set-feature $3 $2, read back" "$(printf 0x%x $((new)))" "$(printf 0x%x $(($2)))"
    nvme set-feature /dev/nvme0 -f "$1" -v "$old" >/dev/null 2>&1 || t_fail "nvme set-feature $3: restore $old"
}
feature 1 0x03020103 arbitration
feature 4 0x160 temperature-threshold
t_run "nvme get-feature number-of-queues" nvme get-feature /dev/nvme0 -f 7
