# shellcheck shell=bash
# Sourced by scripts/guest-tests.sh: vnvme's checks beside QEMU's nvme (comparisons, run only when asked for): protection information, FDP, zoned.
# Functions only; they use its helpers (result, suite_boot, write_config, ...) and
# its variables ($work, $here, $VNVME_BIN, ...).

# qemu_alone K DIR SCRIPT QEMU_ARGS...: tests/SCRIPT in a guest on QEMU's own nvme
# device, which QEMU_ARGS make, with DIR/config.sh: the serial console in
# DIR/guest.log (result lines echoed live, host marks acted on as VN_HOST_ACTION
# says), the boot's status in DIR/boot.rc.
qemu_alone() {
    local k=$1 d=$2 script=$3
    shift 3
    guest_adds "$d/config.sh"
    {
        local brc=0
        "$here/guest/boot.sh" --kernel "$k" --accel "$accel" --run "$tests_dir/$script" \
            "${GUEST_ADDS[@]}" --timeout 300 -- -pidfile "$d/qemu.pid" "$@" || brc=$?
        echo "$brc" >"$d/boot.rc"
    } 2>&1 | vn_watch "$d/marks" "" | tee "$d/guest.log" |
        grep --line-buffered -E '^(PASS|FAIL|SKIP): |^== |^\[host\]' | sed -u "s/^/  [$k qemu] /"
}

# side_by_side K DIR WHAT: what the WHAT checks passed on vnvme (DIR/vnvme, counted)
# and on QEMU's nvme (DIR/qemu, reported), and each of QEMU's failures.
side_by_side() {
    local k=$1 d=$2 side
    echo "  [$k] $3 checks side by side (the same kernel and scripts):"
    for side in vnvme qemu; do
        printf '    %-10s %s passed, %s failed%s\n' \
            "$([[ $side == qemu ]] && echo "QEMU nvme:" || echo "vnvme:")" \
            "$(grep -ac '^PASS: ' "$d/$side/guest.log")" "$(grep -ac '^FAIL: ' "$d/$side/guest.log")" \
            "$([[ $side == qemu ]] && echo ' (reported, not counted)')"
    done
    grep -ah '^FAIL: ' "$d/qemu/guest.log" | sed "s/^/      QEMU /"
}

# The protection information checks side by side (not in the default run: a
# comparison, not a test of vnvme): pi.sh on vnvme with one protected namespace,
# counted, and on QEMU's nvme with the matching options, reported.
suite_pi_qemu() {
    local k=$1
    local d="$work/$k-pi" t0
    mkdir -p "$d/vnvme" "$d/qemu"
    t0=$(date +%s)
    echo
    echo "== [$k] pi-qemu suite: the protection information checks on vnvme and on QEMU's nvme (ms=8, pi=1; ms=16, pi=1, 64-bit guard)"
    local cfg="PI_CORRUPT_LBA=65536"$'\n'"PI64_LBA=32768"
    write_config "$d/vnvme/config.sh" VNVMEGT0011 $((64 << 20)) 512 $((32 << 20)) 512 0 512
    printf '%s\nDEVICE=vnvme\n' "$cfg" >>"$d/vnvme/config.sh"
    rm -f "$d/vnvme"/pi.img* "$d/vnvme"/pi64.img*
    VN_HOST_ACTION=pi_action
    suite_boot "$k" "$d/vnvme" pi pi-alone.sh --timeout 360 -- --ns "file:$d/vnvme/pi.img:64M:ms=8:pi=1" \
        --ns "file:$d/vnvme/pi64.img:32M:ms=16:pi=1:guard=64" --poll off --workers 1 --serial VNVMEGT0011 ||
        { VN_HOST_ACTION=""; return; }
    pi_check "$k" "$d/vnvme"
    pi64_check "$k" "$d/vnvme"
    write_config "$d/qemu/config.sh" QEMUPI00001 $((64 << 20)) 512 $((32 << 20)) 512 0 512
    printf '%s\nDEVICE=qemu-nvme\n' "$cfg" >>"$d/qemu/config.sh"
    # QEMU keeps the metadata after the data: 64 MiB of 512-byte blocks with 8
    # bytes each, 32 MiB with 16.
    rm -f "$d/qemu/pi.img" "$d/qemu/pi64.img"
    truncate -s $(((64 << 20) / 512 * 520)) "$d/qemu/pi.img"
    truncate -s $(((32 << 20) / 512 * 528)) "$d/qemu/pi64.img"
    qemu_alone "$k" "$d/qemu" pi-alone.sh \
        -drive "file=$d/qemu/pi.img,if=none,id=p1,format=raw,cache=none,aio=io_uring" \
        -drive "file=$d/qemu/pi64.img,if=none,id=p2,format=raw,cache=none,aio=io_uring" \
        -device nvme,id=nv0,serial=QEMUPI00001 -device nvme-ns,drive=p1,bus=nv0,nsid=1,ms=8,pi=1 \
        -device nvme-ns,drive=p2,bus=nv0,nsid=2,ms=16,pi=1,pif=2
    VN_HOST_ACTION=""
    side_by_side "$k" "$d" pi
    rm -f "$d/vnvme"/pi.img* "$d/vnvme"/pi64.img* "$d/qemu/pi.img" "$d/qemu/pi64.img"
    echo "  [$k] pi-qemu suite: $(($(date +%s) - t0)) s"
}

# The flexible data placement checks side by side (not in the default run: a
# comparison, not a test of vnvme): fdp.sh on vnvme with one namespace and
# --fdp 4:ru=1M, counted, and on QEMU's nvme in a subsystem with fdp=on,
# fdp.nruh=4, fdp.runs=1M and the namespace given all four handles, reported.
suite_fdp_qemu() {
    local k=$1
    local d="$work/$k-fdp" t0
    mkdir -p "$d/vnvme" "$d/qemu"
    t0=$(date +%s)
    echo
    echo "== [$k] fdp-qemu suite: the flexible data placement checks on vnvme and on QEMU's nvme (4 handles, 1 MiB units)"
    local cfg
    cfg=$(printf 'FDP_RUHS=4\nFDP_RU=%s' $((1 << 20)))
    write_config "$d/vnvme/config.sh" VNVMEGT0012 $((64 << 20)) 512 0 512 0 512
    printf '%s\nDEVICE=vnvme\n' "$cfg" >>"$d/vnvme/config.sh"
    suite_boot "$k" "$d/vnvme" fdp fdp-alone.sh --timeout 300 -- --ns ram:64M --fdp 4:ru=1M \
        --poll off --workers 1 --serial VNVMEGT0012 || return
    write_config "$d/qemu/config.sh" QEMUFDP0001 $((64 << 20)) 512 0 512 0 512
    printf '%s\nDEVICE=qemu-nvme\n' "$cfg" >>"$d/qemu/config.sh"
    rm -f "$d/qemu/fdp.img"
    truncate -s $((64 << 20)) "$d/qemu/fdp.img"
    qemu_alone "$k" "$d/qemu" fdp-alone.sh \
        -drive "file=$d/qemu/fdp.img,if=none,id=f1,format=raw,cache=none,aio=io_uring" \
        -device nvme-subsys,id=fs0,nqn=vnvme-fdp-compare,fdp=on,fdp.nruh=4,fdp.runs=1M \
        -device nvme,id=nv0,serial=QEMUFDP0001,subsys=fs0 \
        -device "nvme-ns,drive=f1,bus=nv0,nsid=1,fdp.ruhs=0;1;2;3"
    side_by_side "$k" "$d" fdp
    rm -f "$d/qemu/fdp.img"
    echo "  [$k] fdp-qemu suite: $(($(date +%s) - t0)) s"
}

# zns_again_config GUEST_LOG: the config lines for the boot after a zns-alone.sh
# boot: the sum of the btrfs file it wrote, how many zones it left written.
zns_again_config() {
    local sum zones
    sum=$(grep -a -o '@@VNVME-BTRFS [0-9a-f]*@@' "$1" | tail -1 | cut -d' ' -f2 | tr -d @)
    zones=$(grep -a -o '@@VNVME-ZONES [^@]*@@' "$1" | tail -1 | sed 's/@@VNVME-ZONES //; s/@@//' |
        tr ' ' '\n' | awk -F: '$1 == 14 || $2 > 0' | grep -c .)
    printf 'BTRFS_SUM=%s\nWRITTEN_ZONES=%s\n' "${sum:-none}" "${zones:-0}"
}

# The zoned namespace checks side by side (not in the default run: a comparison,
# not a test of vnvme): zns.sh on vnvme with one zoned namespace, counted, and on
# QEMU's nvme with the matching options (zoned.zone_size, zone_capacity,
# max_open, max_active), reported.
suite_zns_qemu() {
    local k=$1
    local d="$work/$k-zns" t0 opts="zoned=8M:zone-cap=6M:max-open=16:max-active=16"
    mkdir -p "$d/vnvme" "$d/qemu"
    t0=$(date +%s)
    echo
    echo "== [$k] zns-qemu suite: the zoned namespace checks on vnvme and on QEMU's nvme ($opts)"
    local cfg
    cfg=$(printf 'N4_BYTES=%s\nZONE_BYTES=%s\nZCAP_BYTES=%s\nZMAX=%s\n' $((256 << 20)) $((8 << 20)) \
        $((6 << 20)) 16)
    write_config "$d/vnvme/config.sh" VNVMEGT0010 $((256 << 20)) 512 0 512 0 512
    printf '%s\nDEVICE=vnvme\n' "$cfg" >>"$d/vnvme/config.sh"
    suite_boot "$k" "$d/vnvme" zns zns-alone.sh --timeout 300 -- --ns "file:$d/vnvme/zns.img:256M:$opts" \
        --poll off --workers 1 --serial VNVMEGT0010 || return
    zones_check "$k" "$d/vnvme"
    write_config "$d/qemu/config.sh" QEMUZNS0001 $((256 << 20)) 512 0 512 0 512
    printf '%s\nDEVICE=qemu-nvme\n' "$cfg" >>"$d/qemu/config.sh"
    truncate -s 256M "$d/qemu/zns.img"
    # QEMU's zoned namespace, the same for both of its boots.
    local qemu_zns=(-drive "file=$d/qemu/zns.img,if=none,id=z1,format=raw,cache=none,aio=io_uring"
        -device nvme,id=nv0,serial=QEMUZNS0001
        -device nvme-ns,drive=z1,bus=nv0,nsid=1,zoned=true,zoned.zone_size=8M,zoned.zone_capacity=6M,zoned.max_open=16,zoned.max_active=16)
    qemu_alone "$k" "$d/qemu" zns-alone.sh "${qemu_zns[@]}"
    # Then each side again on the same storage, as after a restart of the device
    # (the vnvme server is a new process; QEMU a new process on the same image).
    local again
    again=$(zns_again_config "$d/vnvme/guest.log")
    mkdir -p "$d/vnvme2"
    write_config "$d/vnvme2/config.sh" VNVMEGT0010 $((256 << 20)) 512 0 512 0 512
    printf '%s\nDEVICE=vnvme\n' "$again" >>"$d/vnvme2/config.sh"
    suite_boot "$k" "$d/vnvme2" zns-again zns-again.sh --timeout 200 -- --ns "file:$d/vnvme/zns.img:$opts" \
        --poll off --workers 1 --serial VNVMEGT0010
    again=$(zns_again_config "$d/qemu/guest.log")
    mkdir -p "$d/qemu2"
    write_config "$d/qemu2/config.sh" QEMUZNS0001 $((256 << 20)) 512 0 512 0 512
    printf '%s\nDEVICE=qemu-nvme\n' "$again" >>"$d/qemu2/config.sh"
    guest_adds "$d/qemu2/config.sh"
    {
        "$here/guest/boot.sh" --kernel "$k" --accel "$accel" --run "$tests_dir/zns-again.sh" \
            "${GUEST_ADDS[@]}" --timeout 200 -- -pidfile "$d/qemu2/qemu.pid" \
            "${qemu_zns[@]}" ||
            true
    } 2>&1 | tee "$d/qemu2/guest.log" | grep --line-buffered -E '^(PASS|FAIL|SKIP): |^== ' |
        sed -u "s/^/  [$k qemu] /"
    local side
    echo "  [$k] zns checks side by side (the same kernel and scripts; a boot, then one after a restart):"
    for side in vnvme qemu; do
        printf '    %-10s first boot %s passed, %s failed; after a restart %s passed, %s failed%s\n' \
            "$([[ $side == qemu ]] && echo "QEMU nvme:" || echo "vnvme:")" \
            "$(grep -ac '^PASS: ' "$d/$side/guest.log")" "$(grep -ac '^FAIL: ' "$d/$side/guest.log")" \
            "$(grep -ac '^PASS: ' "$d/${side}2/guest.log")" "$(grep -ac '^FAIL: ' "$d/${side}2/guest.log")" \
            "$([[ $side == qemu ]] && echo ' (reported, not counted)')"
    done
    grep -ah '^FAIL: ' "$d/qemu/guest.log" "$d/qemu2/guest.log" | sed "s/^/      QEMU /"
    rm -f "$d/vnvme/zns.img" "$d/vnvme/zns.img.zones" "$d/qemu/zns.img"
    echo "  [$k] zns-qemu suite: $(($(date +%s) - t0)) s"
}
