#!/usr/bin/env bash
# Guest tests: boot real Linux guests (bookworm 6.1 and the newest Debian
# kernel) under QEMU with -device vfio-user-pci on `vnvme serve`, and check
# the controller from the guest's side (nvme-cli, fio verify, ext4, several
# namespaces, reset, driver reload, guest reboot, shadow doorbell counters).
# Ends with: guest-tests: N passed, N failed, N skipped
set -uo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=scripts/lib/packages.sh
source "$here/lib/packages.sh"
# shellcheck source=scripts/lib/guest-host.sh
source "$here/lib/guest-host.sh"
# shellcheck source=scripts/lib/promtool.sh
source "$here/lib/promtool.sh"
# shellcheck source=scripts/guest/suite-lib.sh
source "$here/guest/suite-lib.sh"

usage() {
    cat <<EOF
Usage: ${0##*/} [--kernel K]... [--suite S]... [--accel auto|kvm|tcg] [--no-fetch]
                [--no-build] [--max-db-ratio R] [--help]

For each guest kernel (default: bookworm newest) two boots, each against its
own \`vnvme serve\` (built with cargo build --release first):

 main    server: --ns ram:64M --ns ram:32M:lba=4096 --ns file:IMG:128M
         --ns file:ZNS:256M:zoned=8M:zone-cap=6M:max-open=16:max-active=16
         --ns file:PI:64M:ms=8:pi=1 --fdp 4:ru=1M --poll off
         --workers 1 (pinned: inline mode is the default on 2-CPU hosts, and the
         worker path needs a real guest too; the faults suite runs inline)
         guest (scripts/guest/tests/main.sh): nvme-cli id-ctrl (serial, nn,
         OACS bits 1 and 8), id-ns, list-ns, smart-log, error-log,
         get/set-feature (arbitration, temperature threshold), the three
         namespaces' sizes, nvme write/read/dsm --ad and blkdiscard read back
         zeroes, fio verify=crc32c with bs 512 B..128 KiB at QD 1/16/64 on the
         512 B and 4 KiB namespaces, format 4 KiB -> 512 B -> 4 KiB with id-ns
         and the block size checked, ext4 on the file namespace + fsck; the
         zoned namespace (scripts/guest/tests/zns.sh): sysfs zoned model and
         limits, nvme zns id-ns, blkzone report/open/finish/reset, a write off
         the write pointer refused, nvme zns zone-append's LBA, report-zones,
         fio --zonemode=zbd with verify, btrfs -O zoned mounted twice; the
         protected namespace (scripts/guest/tests/pi.sh): the integrity
         profile T10-DIF-TYPE1-CRC, id-ns flbas/mc/dpc/dps, fio verify through
         the integrity layer, a byte corrupted on the host under the guest
         failing its read with the guard check, then rewritten;
         reset_controller, rmmod/modprobe nvme, then 2 s runs of 4k randread
         between marks: 2 jobs x QD 32, then 1 job x QD 64, 16, 1.
         host: trapped doorbells per I/O over the 2 x QD 32 run below
         --max-db-ratio, the others reported (from the server's
         --stats-file), e2fsck -fn and debugfs checksum of the ext4 image,
         the zone state file against the guest's last zone report,
         server log (shadow doorbells re-enabled after reset and reload,
         clean shutdown), server exit status.
 faults  (last kernel only) server: two RAM namespaces with fault= rules,
         inline (--workers 0 --poll adaptive: the server's thread runs the queues)
         guest (scripts/guest/tests/faults.sh): a read of an injected media
         error fails with a medium error in dmesg, smart-log critical warning
         bit 2 and media_errors, error-log entry at the LBA, ENOSPC write
         fails, a read that finds the storage unreachable three times
         succeeds after three 1 s Command Retry Delays with nothing in dmesg,
         I/O around the faults and fio verify still work.
         host: the server logged the backend failures and the guest enabling
         Advanced Command Retry.
 live    (every kernel) server: n1 ram:64M, n2 ram:32M, n3 file:IMG:64M, --control,
         --max-namespaces 8; the guest (scripts/guest/tests/live-ns.sh) asks the host
         to run vnvme ctl: a namespace hot-added while fio verify runs on n1 appears
         with its size and passes fio verify; an idle one removed disappears; one
         removed with a read in flight (held 4 s by a fault rule) ends that read
         with an error and nothing hangs; n3 grown under a mounted ext4 shows its
         new size and resize2fs grows onto it; a shrink below its data is refused
         (host: the refusal names the data); a forced shrink of an idle one works;
         QoS set live on n1: fio QD 32 measures 2,000 IOPS +- 10 % against
         iops=2000 and 20 MB/s +- 10 % against bps=20000000, then it is cleared;
         a Prometheus scrape taken meanwhile passes promtool and shows the reads,
         the time held and a latency histogram; a second vnvme serve is
         hot-plugged with QMP device_add vfio-user-pci and passes fio verify.
 netstore (last kernel only) server: n1 nbd+unix:// on qemu-nbd serving a qcow2
         image, n2 nbd+unix:// on nbdkit's memory plugin (real servers from
         Debian, scripts/fetch-nbd-servers.sh), n3 rbd: on a Ceph test cluster
         (scripts/ceph-cluster.sh; VNVME_TEST_CEPH_DIR's, or one of its own),
         --workers 2
         guest (scripts/guest/tests/netstore.sh): sizes, fio verify=crc32c at
         QD 1/16/64 on each, nvme flush, Write Zeroes reads back zeroes,
         Deallocate, ext4 on n1 and n3 + fsck.
         host: qemu-img check on the qcow2 image; e2fsck and the file's
         checksum in the qcow2 image (converted to raw) and in the RBD image
         (rbd export).
 outage  (last kernel only) n1 on qemu-nbd (qcow2), n2 on nbdkit (memory), n3 an
         RBD image on a fresh Ceph cluster of two OSDs (pool size 2, min_size 1,
         heartbeat grace 4 s); the guest (scripts/guest/tests/outage.sh) runs fio
         randwrite + crc32c verify on n1 and n3 and an ext4 write / sync / drop
         caches / checksum loop on n2 while the host SIGKILLs qemu-nbd and starts
         it again 2.1 s later, SIGSTOPs nbdkit for 10 s, SIGSTOPs both OSDs for
         15 s, then SIGKILLs one for good: no fio error, checksums right, fsck
         clean, no I/O error, timeout, reset or read-only ext4 in the kernel log.
         Once on vnvme (--workers 0, the default hold) and once on QEMU's own nvme
         device with QEMU's NBD client (reconnect-delay=20) and rbd driver, the
         control: its results are printed beside vnvme's (the outage table), not
         counted.
 upgrade (last kernel only) server: n1 ram:256M, n2 file:IMG:128M, --control,
         --workers 1; the guest (scripts/guest/tests/upgrade.sh) runs fio
         randwrite + crc32c verify on n1 and an ext4 write / sync / drop caches /
         checksum loop on n2 while asking the host to run \`vnvme ctl upgrade\` 10
         times; no I/O error, verify failure, timeout or controller reset in the
         guest; fsck clean; the longest fio latency and each upgrade's server-side
         stall reported. host: 10 upgrades, 10 takeovers in the log, the first
         server gone, the last one exits with QEMU.
 multipath (last kernel only) two \`vnvme serve\` processes, --cntlid 1 and 2, one
         --serial, one image file (128M), each a vfio-user-pci device of the
         guest (scripts/guest/tests/multipath.sh): Linux's native multipath
         makes one subsystem of the two controllers and one namespace head of
         two paths (sysfs, nvme list-subsys, CNTLID, CMIC, NMIC); fio verify
         through the head with the numa and round-robin I/O policies; a block
         written through one controller's char device read through the other's;
         then Asymmetric Namespace Access: both paths optimized (sysfs
         ana_state, nvme ana-log), the host puts controller 2 inaccessible
         (vnvme ctl ana.set over its control socket), Linux sees it and fio
         verify through the head writes nothing through that path; back to
         optimized, round-robin uses it again; then the host SIGKILLs
         controller 2's serving process under fio verify (it runs under
         --restart-on-crash: its keeper starts a stand-in on the VMM's
         connection, which completes the guest's Asynchronous Event Request
         with Persistent Internal Error): the guest resets the
         controller, fio goes on with no I/O error, and afterwards round-robin
         writes through controller 2 again. Host: controller 2 served I/O and
         logged its 2 ANA changes, its keeper logged the restart and exits 0
         with the stand-in, controller 1 exits 0.
 multipath-kill (asked for only; last kernel) the same without a keeper: the
         host SIGKILLs controller 2's process under fio verify through the head, which should
         go on on the path left with no I/O error. It does not yet: Linux 7.3
         fails over the writes in flight on the dead path, but routes a few new
         ones to the path as it is removed and ends them with EIO (the guest
         prints its nvme and block completion traces; docs/subsystems.md).
 multipath-qemu (asked for only; last kernel) multipath.sh on QEMU's own nvme:
         an nvme-subsys with two controllers and one shared namespace on a raw
         file, reported beside the multipath suite's counts (ask for both); the
         ANA changes only vnvme's host side makes are skipped.
 zns-qemu (asked for only; last kernel) the zoned namespace checks of the main
         suite (scripts/guest/tests/zns.sh) on vnvme with one zoned namespace
         (zoned=8M:zone-cap=6M:max-open=16:max-active=16), counted, and on QEMU's
         nvme with zoned.zone_size=8M, zone_capacity=6M, max_open=16,
         max_active=16 on a raw file, reported: what each passes side by side;
         then each again on the same storage after a restart of the device
         (scripts/guest/tests/zns-again.sh): the zones written before, and the
         zoned btrfs made before mounting with its file intact.
 pi-qemu (asked for only; last kernel) the protection information checks of the
         main suite (scripts/guest/tests/pi.sh, pi64.sh) on vnvme with two
         namespaces, file:IMG:64M:ms=8:pi=1 and file:IMG:32M:ms=16:pi=1:guard=64,
         counted, and on QEMU's nvme with ms=8,pi=1 and ms=16,pi=1,pif=2 on raw
         files (metadata after the data), reported: what each passes side by
         side, the host corrupting the same byte under each.
 fdp-qemu (asked for only; last kernel) the flexible data placement checks of
         the main suite (scripts/guest/tests/fdp.sh) on vnvme with one namespace
         ram:64M and --fdp 4:ru=1M, counted, and on QEMU's nvme in a subsystem
         with fdp=on, fdp.nruh=4, fdp.runs=1M (the namespace given handles
         0-3) on a raw file, reported: what each passes side by side.
 reboot  server: --ns ram:64M --poll adaptive --workers 2; QEMU may reboot
         guest (scripts/guest/tests/reboot.sh): doorbell counters under
         adaptive polling (2 x QD 32 below 1, the others reported), fio
         verify with 2 jobs, 8 MiB of data + checksum, reboot -f, then the
         data and I/O again after the reboot.

  --kernel K        bookworm | newest | KVER (repeat; default: bookworm newest)
  --suite S         run only suite S (repeat; main, reboot, faults, netstore, outage, live,
                    upgrade, multipath, multipath-kill, multipath-qemu, zns-qemu, pi-qemu,
                    fdp-qemu; default: all but multipath-kill and the -qemu ones)
  --accel A         passed to boot.sh (default: \$VNVME_ACCEL or auto)
  --no-fetch        do not run the fetch scripts (QEMU, kernels, initramfs)
  --no-build        do not run cargo build (use \$VNVME_BIN or target/release)
  --max-db-ratio R  pass limit for trapped doorbells per I/O (default 1: under TCG
                    the slow guest finds the device idle at most submissions)

If fetching QEMU or the kernels fails (no network), everything is skipped
loudly and the exit status is 0. Every SKIP is also appended to
\$VNVME_SKIP_LOG when it is set (scripts/test.sh sets it).
Logs: a directory printed at the start and end (\${TMPDIR:-/tmp}/vnvme-guest-tests.*).
Exit status: 0 if nothing failed.
EOF
}

kernels=() suites=() accel="${VNVME_ACCEL:-auto}" fetch=1 build=1 max_db=1
while [[ $# -gt 0 ]]; do
    case $1 in
    --kernel) kernels+=("$2"); shift 2 ;;
    --suite) suites+=("$2"); shift 2 ;;
    --accel) accel=$2; shift 2 ;;
    --no-fetch) fetch=0; shift ;;
    --no-build) build=0; shift ;;
    --max-db-ratio) max_db=$2; shift 2 ;;
    -h | --help) usage; exit 0 ;;
    *) usage >&2; exit 2 ;;
    esac
done
[[ ${#kernels[@]} -gt 0 ]] || kernels=(bookworm newest)

T0=$(date +%s)
work=$(mktemp -d "${TMPDIR:-/tmp}/vnvme-guest-tests.XXXXXX")
tests_dir="$here/guest/tests"
n_pass=0 n_fail=0 n_skip=0
VN_PID="" cur_qemu_pidfile="" HOT_PID="" UP_PID="" MP_PID="" NET_PIDS=() CEPH_OWN="" CEPH_DIR=""
QEMU_EXTRA=()

cleanup() {
    # Stop what we started, by PID: the server, and QEMU if we were interrupted.
    vn_term_pidfile "$cur_qemu_pidfile"
    vn_serve_stop "$VN_PID"
    vn_serve_stop "$HOT_PID"
    vn_serve_stop "$MP_PID"
    [[ -z $UP_PID ]] || kill -KILL "$UP_PID" 2>/dev/null || true
    net_servers_stop
    [[ -z $CEPH_OWN ]] || "$here/ceph-cluster.sh" stop "$CEPH_OWN" >/dev/null 2>&1
    rm -f "$work"/*/vnvme.sock "$work"/*/*.img
}
trap cleanup EXIT
trap 'echo "guest-tests: interrupted" >&2; exit 130' INT TERM

# tally KIND KERNEL TEXT: count a result, record it in results.txt (a skip in the
# skip log too). result also prints it; the guest's own lines are already printed.
tally() {
    case $1 in
    PASS) n_pass=$((n_pass + 1)) ;;
    FAIL) n_fail=$((n_fail + 1)) ;;
    SKIP)
        n_skip=$((n_skip + 1))
        [[ -z ${VNVME_SKIP_LOG:-} ]] || echo "guest-tests: $2: $3" >>"$VNVME_SKIP_LOG"
        ;;
    esac
    printf '%s: %s: %s\n' "$1" "$2" "$3" >>"$work/results.txt"
}

result() { # KIND KERNEL TEXT
    tally "$@"
    printf '%s: %s: %s\n' "$1" "$2" "$3"
}

summary() {
    echo
    if grep -q '^FAIL' "$work/results.txt" 2>/dev/null; then
        echo "failures:"
        grep '^FAIL' "$work/results.txt" | sed 's/^/  /'
    fi
    if grep -q '^RETRY' "$work/results.txt" 2>/dev/null; then
        echo "booted again (the guest kernel never reached init the first time):"
        grep '^RETRY' "$work/results.txt" | sed 's/^/  /'
    fi
    echo "logs: $work (serial console, server logs, counter snapshots)"
    echo "wall time: $(($(date +%s) - T0)) s"
    echo "guest-tests: $n_pass passed, $n_fail failed, $n_skip skipped"
}

skip_all() { # REASON
    echo
    echo "!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!"
    echo "!!! SKIPPING ALL GUEST TESTS: $1"
    echo "!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!"
    result SKIP all "every guest test (real Linux guests on vnvme serve): $1"
    summary
    exit 0
}

echo "guest-tests: kernels ${kernels[*]}, logs in $work"
if [[ $fetch -eq 1 ]]; then
    echo "== fetching QEMU, kernels and initramfs (cached after the first run)"
    "$here/guest/fetch-qemu.sh" || skip_all "could not fetch QEMU 11.1 (network?)"
    "$here/guest/fetch-kernels.sh" "${kernels[@]}" || skip_all "could not fetch the guest kernels (network?)"
    "$here/guest/mkinitramfs.sh" "${kernels[@]}" || skip_all "could not build the guest initramfs (network?)"
fi
if [[ $build -eq 1 ]]; then
    echo "== cargo build --release -p vnvme"
    vn_build || { result FAIL host "cargo build --release -p vnvme"; summary; exit 1; }
fi
[[ -x $VNVME_BIN ]] || { result FAIL host "no vnvme binary at $VNVME_BIN"; summary; exit 1; }
if [[ $accel == auto ]]; then
    # Decide once (boot.sh caches its KVM probe per host kernel and QEMU).
    "$here/guest/boot.sh" --kernel "${kernels[0]}" --accel auto --timeout 120 --cmd true >"$work/accel-probe.log" 2>&1
    accel=$(grep -o 'accel [a-z]*' "$work/accel-probe.log" | head -1 | cut -d' ' -f2)
    [[ -n $accel ]] || accel=tcg
fi
echo "accelerator: $accel"

# zones_check KERNEL DIR: the zone state file the server kept beside the zoned
# namespace's data holds, zone by zone, the condition and write pointer the
# guest last saw (open zones may have been closed by the controller reset at
# the guest's power-off). The file is read by `vnvme inspect zones`, the
# server's own reader; the comparison is the guest report's.
zones_check() {
    local k=$1 d=$2 line out file
    line=$(grep -a -o '@@VNVME-ZONES [^@]*@@' "$d/guest.log" | tail -1)
    if [[ -z $line ]]; then
        result FAIL "$k" "zone state file check: the guest printed no zone report"
        return
    fi
    line=${line#@@VNVME-ZONES }
    if ! file=$("$VNVME_BIN" inspect zones "$d/zns.img.zones" 2>&1); then
        result FAIL "$k" "zone state file: vnvme inspect zones refused it: $file"
        return
    fi
    if out=$(python3 - "$file" ${line%@@} <<'PY' 2>&1
import json, sys
f = json.loads(sys.argv[1])
seen = [tuple(map(int, z.split(":"))) for z in sys.argv[2:]]
assert len(seen) == len(f["zones"]), f"{len(seen)} zones in the guest's report, {len(f['zones'])} in the file"
bad = []
for i, ((cond, wp), z) in enumerate(zip(seen, f["zones"])):
    state, written = z["state"], z["written"]
    if cond == 14:
        ok = state == 14
    elif cond in (2, 3, 4):
        ok = state in (2, 3, 4) and written == wp * 512
    else:
        ok = state == cond and written == wp * 512
    if not ok:
        bad.append(f"zone {i}: guest cond {cond} wp {wp}, file state {state} written {written // 512}")
print("; ".join(bad) if bad else f"{len(seen)} zones, {sum(1 for c, _ in seen if c != 1)} written")
sys.exit(1 if bad else 0)
PY
    ); then
        result PASS "$k" "zone state file: every zone's state and write pointer as the guest last saw them ($out)"
    else
        result FAIL "$k" "zone state file differs from the guest's zone report: $out"
    fi
    # Zoned writes the server refused (the guest's own checks ask for some): where
    # each was and where its zone's write pointer stood, for a failure to be read.
    grep -a 'zoned write refused' "$d/serve.log" 2>/dev/null | head -8 | sed "s/^/  [$k] server: /"
}

# pi_action DIR ACTION: the main suite's guest asking the host to corrupt one
# byte of the protected namespace's data under it (@@VNVME-HOST pi-corrupt@@),
# at PI_CORRUPT_LBA (config.sh), in the image the server reads.
pi_action() {
    local d=${1%/marks} lba
    [[ $2 == pi-corrupt ]] || { echo "[host] unknown action $2"; return; }
    lba=$(sed -n 's/^PI_CORRUPT_LBA=//p' "$d/config.sh")
    local at=$((lba * 512 + 100)) b
    b=$(od -An -tu1 -j "$at" -N 1 "$d/pi.img" | tr -d ' ')
    # shellcheck disable=SC2059 # the byte's complement, as an escape
    printf "\\x$(printf %02x $((b ^ 0xff)))" | dd of="$d/pi.img" bs=1 seek="$at" conv=notrunc status=none
    sync "$d/pi.img"
    echo "[host] one byte of LBA $lba of pi.img changed under the guest"
}

# pi_audit KERNEL WHAT SPEC MIN [--app-tag T]: `vnvme inspect pi` (the server's
# own metadata reader and CRCs) checks every block the guest wrote on namespace
# SPEC against its protection information; at least MIN blocks must have been
# written.
pi_audit() {
    local k=$1 what=$2 spec=$3 min=$4 out
    shift 4
    out=$("$VNVME_BIN" inspect pi --ns "$spec" "$@" 2>&1)
    local written
    written=$(sed -n 's/.*"written":\([0-9]*\).*/\1/p' <<<"$out" | head -1)
    if [[ -n $written ]] && ((written >= min)) && [[ $out == *'"bad_count":0'* ]]; then
        result PASS "$k" "$what: guards and reference tags right on every written block ($out)"
    else
        result FAIL "$k" "$what: $out (at least $min blocks written expected)"
    fi
}

# pi_check KERNEL DIR: the protected namespace's metadata file holds, for the
# blocks the guest wrote, the type 1 protection information Linux generated: the
# CRC-16 T10-DIF of the block's data and the LBA as reference tag (every written
# block, the one corrupted and rewritten among them; pi.sh's passthrough block
# has application tag FFFFh, unchecked by choice).
pi_check() {
    pi_audit "$1" "metadata file (type 1, CRC-16)" "file:$2/pi.img:64M:ms=8:pi=1" 4096
}

# pi64_check KERNEL DIR: the 64-bit guard namespace's metadata file holds, for
# the blocks the guest wrote through its integrity layer, the tuples Linux
# generated: the CRC-64/NVME of the block's data and the LBA as the 48-bit
# reference tag. Blocks written through passthrough with other tags (pi64.sh's)
# are left out by their application tag.
pi64_check() {
    pi_audit "$1" "64-bit guard metadata file (CRC-64/NVME)" "file:$2/pi64.img:32M:ms=16:pi=1:guard=64" 8192 --app-tag 0
}

suite_main() {
    local k=$1
    local d="$work/$k-main" t0 img line sum_guest sum_host path
    mkdir -p "$d"
    t0=$(date +%s)
    img="$d/ext4.img"
    echo
    echo "== [$k] main suite: 6 namespaces (the 4th zoned, the 5th and 6th with protection information), --poll off, one worker"
    write_config "$d/config.sh" VNVMEGT0001 $((64 << 20)) 512 $((32 << 20)) 4096 $((128 << 20)) 512
    printf 'N4_BYTES=%s\nZONE_BYTES=%s\nZCAP_BYTES=%s\nZMAX=%s\nNN=6\nPI_CORRUPT_LBA=%s\nPI64_LBA=%s\n' \
        $((256 << 20)) $((8 << 20)) $((6 << 20)) 16 65536 32768 >>"$d/config.sh"
    printf 'FDP_RUHS=4\nFDP_RU=%s\n' $((1 << 20)) >>"$d/config.sh"
    rm -f "$d/zns.img" "$d/zns.img.zones" "$d"/pi.img* "$d"/pi64.img*
    VN_HOST_ACTION=pi_action
    suite_boot "$k" "$d" main main.sh --timeout 480 -- --ns ram:64M --ns ram:32M:lba=4096 \
        --ns "file:$img:128M" --ns "file:$d/zns.img:256M:zoned=8M:zone-cap=6M:max-open=16:max-active=16" \
        --ns "file:$d/pi.img:64M:ms=8:pi=1" --ns "file:$d/pi64.img:32M:ms=16:pi=1:guard=64" \
        --fdp 4:ru=1M --poll off --workers 1 --serial VNVMEGT0001 || return
    VN_HOST_ACTION=""
    zones_check "$k" "$d"
    pi_check "$k" "$d"
    pi64_check "$k" "$d"
    rm -f "$d/zns.img" "$d/zns.img.zones" "$d"/pi.img* "$d"/pi64.img*

    # Shadow doorbells, from the server's own counters (--poll off).
    db_check "$k" "$d" db off "$max_db"
    local enables
    enables=$(grep -ac 'shadow doorbells enabled' "$d/serve.log")
    if [[ $enables -ge 3 ]]; then
        result PASS "$k" "server log: Doorbell Buffer Config accepted $enables times (probe, after reset, after reload)"
    else
        result FAIL "$k" "server log: Doorbell Buffer Config accepted $enables times, want >= 3 (probe, reset, reload)"
    fi
    if grep -qa 'controller shut down' "$d/serve.log"; then
        result PASS "$k" "server log: controller shut down by the guest ($(grep -a 'controller shut down' "$d/serve.log" | tail -1 | grep -o 'kind=[A-Za-z]*'))"
    else
        result FAIL "$k" "server log: no CC.SHN shutdown seen"
    fi

    # ext4 image, from the host, after the server is gone.
    line=$(grep -a -o '@@VNVME-EXT4 [^@]*@@' "$d/guest.log" | tail -1)
    if [[ -z $line ]]; then
        result FAIL "$k" "host ext4 check: the guest printed no checksum"
    elif ! (need_cmds e2fsck:e2fsprogs debugfs:e2fsprogs) >"$d/apt.log" 2>&1; then
        result SKIP "$k" "host ext4 check: e2fsprogs missing and could not be installed ($d/apt.log)"
    else
        line=${line#@@VNVME-EXT4 }
        line=${line%@@}
        path=${line%% *}
        sum_guest=${line#* }
        if e2fsck -fn "$img" >"$d/e2fsck.log" 2>&1; then
            result PASS "$k" "host: e2fsck -fn on the file namespace image is clean"
        else
            result FAIL "$k" "host: e2fsck -fn on the image reports problems ($d/e2fsck.log)"
        fi
        sum_host=$(debugfs -R "cat $path" "$img" 2>/dev/null | sha256sum | cut -d' ' -f1)
        if [[ $sum_host == "$sum_guest" ]]; then
            result PASS "$k" "host: debugfs cat $path matches the guest's sha256 ${sum_guest:0:16}..."
        else
            result FAIL "$k" "host: debugfs cat $path sha256 $sum_host != guest $sum_guest"
        fi
    fi
    rm -f "$img"
    echo "  [$k] main suite: $(($(date +%s) - t0)) s"
}

suite_reboot() {
    local k=$1
    local d="$work/$k-reboot" t0 n
    mkdir -p "$d"
    t0=$(date +%s)
    echo
    echo "== [$k] reboot suite: --poll adaptive, 2 workers, guest reboot"
    write_config "$d/config.sh" VNVMEGT0002 $((64 << 20)) 512 0 512 0 512
    suite_boot "$k" "$d" reboot reboot.sh --reboot --timeout 240 -- --ns ram:64M --poll adaptive \
        --workers 2 --serial VNVMEGT0002 || return
    n=$(grep -ac 'controller enabled' "$d/serve.log")
    if [[ $n -ge 2 ]] && grep -qa 'pass 2 (after the guest reboot)' "$d/guest.log"; then
        result PASS "$k" "guest reboot: same server, controller enabled $n times, $(grep -ac 'shadow doorbells enabled' "$d/serve.log") Doorbell Buffer Configs"
    else
        result FAIL "$k" "guest reboot: controller enabled $n times, or pass 2 never ran"
    fi
    db_check "$k" "$d" ad adaptive 1
    echo "  [$k] reboot suite: $(($(date +%s) - t0)) s"
}

suite_faults() {
    local k=$1
    local d="$work/$k-faults" t0 n line
    mkdir -p "$d"
    t0=$(date +%s)
    echo
    echo "== [$k] faults suite: injected backend failures, inline (--workers 0, --poll adaptive)"
    write_config "$d/config.sh" VNVMEGT0003 $((64 << 20)) 512 $((16 << 20)) 512 0 512
    suite_boot "$k" "$d" faults faults.sh --timeout 240 -- --ns "ram:64M:fault=read/eio/lba=2048+8:fault=read/gone/lba=16384+8/count=3" \
        --ns "ram:16M:fault=write/enospc/lba=4096+8" --workers 0 --poll adaptive --serial VNVMEGT0003 || return
    n=$(grep -ac 'backend request failed' "$d/serve.log")
    if [[ $n -ge 2 ]]; then
        result PASS "$k" "server log: $n backend failures logged ($(grep -a 'backend request failed' "$d/serve.log" | head -1 | grep -o 'I/O error.*\|no space.*' | head -1))"
    else
        result FAIL "$k" "server log: $n backend failures logged, want >= 2"
    fi
    if grep -qa 'advanced command retry enabled' "$d/serve.log"; then
        result PASS "$k" "the guest enabled Advanced Command Retry (Host Behavior Support)"
    else
        result FAIL "$k" "the guest never enabled Advanced Command Retry (no Host Behavior Support in the server log)"
    fi
    line=$(grep -a 'inline queues' "$d/serve.log" | head -1 | sed 's/.*inline queues/inline queues/')
    if [[ -n $line ]] && grep -qa 'inline: no workers' "$d/serve.log"; then
        result PASS "$k" "server ran the queues inline: $line"
    else
        result FAIL "$k" "server log does not show inline mode (no workers) and its polling summary"
    fi
    echo "  [$k] faults suite: $(($(date +%s) - t0)) s"
}

# metrics_check KERNEL FILE: a Prometheus scrape taken during the guest's QoS run
# (iops=2000 on n1) passes promtool, and says what the run did: reads on n1, time
# held by QoS, a latency histogram whose count is the reads.
metrics_check() {
    local k=$1 f=$2 promtool v reads held count
    if [[ ! -s $f ]]; then
        result FAIL "$k" "metrics: no scrape during the guest run ($f: $(cat "$f.err" 2>/dev/null))"
        return
    fi
    if ! promtool=$(vn_promtool 2>"$f.promtool-fetch"); then
        result SKIP "$k" "metrics: promtool could not be fetched ($(tail -1 "$f.promtool-fetch"))"
    elif "$promtool" check metrics <"$f" >"$f.check" 2>&1; then
        result PASS "$k" "metrics: promtool check metrics accepts the scrape ($(wc -l <"$f") lines)"
    else
        result FAIL "$k" "metrics: promtool check metrics: $(head -3 "$f.check" | tr '\n' ' ')"
    fi
    v() { awk -v m="$1" '$1 == m { print $2 }' "$f"; }
    reads=$(v 'vnvme_namespace_commands_total{nsid="1",op="read"}')
    held=$(v 'vnvme_namespace_qos_throttled_commands_total{nsid="1"}')
    count=$(v 'vnvme_namespace_latency_seconds_count{nsid="1",op="read"}')
    if [[ ${reads:-0} -gt 10000 && ${held:-0} -gt 0 && ${count:-0} -eq ${reads:-0} ]]; then
        result PASS "$k" "metrics: n1 reads $reads, held by QoS $held, latency histogram count $count"
    else
        result FAIL "$k" "metrics: n1 reads '$reads', held by QoS '$held', latency count '$count' (want reads > 10000, held > 0, count = reads)"
    fi
}

suite_live() {
    local k=$1
    local d="$work/$k-live" t0 line
    mkdir -p "$d"
    t0=$(date +%s)
    echo
    echo "== [$k] live namespaces suite: added, removed and resized through the control socket"
    write_config "$d/config.sh" VNVMEGT0004 $((64 << 20)) 512 $((32 << 20)) 512 $((64 << 20)) 512
    # A second device, hot-plugged by the guest's request through QEMU's monitor
    # (device_add on an empty root port). Not unplugged: QEMU 11.1 aborts on
    # device_del of a vfio-user-pci device (see live-ns.sh).
    if ! vn_serve_start "$d/hot.log" "$d/hot.sock" --ns ram:32M --once --log info --serial VNVMEGT0005; then
        result FAIL "$k" "the hot-plug server did not start"
    fi
    HOT_PID=$VN_PID
    mkdir -p "$d/qmp"
    printf '{"execute":"device_add","arguments":{"driver":"vfio-user-pci","id":"hot1","bus":"rp1","socket":{"type":"unix","path":"%s"}}}' \
        "$d/hot.sock" >"$d/qmp/hotplug.json"
    export VN_CTL_SOCKET="$d/ctl.sock" VN_QMP_SOCKET="$d/qmp.sock" VN_QMP_DIR="$d/qmp"
    export VN_METRICS_SOCKET="$d/metrics.sock"
    QEMU_EXTRA=(-qmp "unix:$d/qmp.sock,server=on,wait=off" -device pcie-root-port,id=rp1,chassis=2)
    suite_boot "$k" "$d" live live-ns.sh --timeout 480 -- --ns ram:64M --ns ram:32M \
        --ns "file:$d/n3.img:64M" --control "$VN_CTL_SOCKET" --max-namespaces 8 --workers 1 \
        --metrics "unix:$VN_METRICS_SOCKET" --serial VNVMEGT0004
    local booted=$?
    unset VN_CTL_SOCKET VN_QMP_SOCKET VN_QMP_DIR VN_METRICS_SOCKET
    QEMU_EXTRA=()
    vn_serve_stop "$HOT_PID"
    HOT_PID=""
    [[ $booted -eq 0 ]] || return
    if [[ -s $d/marks/qmp.log ]] && ! grep -qP '\t[^0]\t' "$d/marks/qmp.log"; then
        result PASS "$k" "QMP device_add of vfio-user-pci answered: $(cut -f1,3 "$d/marks/qmp.log" | tr '\n\t' '; ' | cut -c1-160)"
    else
        result FAIL "$k" "QMP hot-plug commands ($d/marks/qmp.log): $(cat "$d/marks/qmp.log" 2>/dev/null | tr '\n' ' ')"
    fi
    metrics_check "$k" "$d/marks/qos-iops.prom"
    if grep -qa 'client connected' "$d/hot.log"; then
        result PASS "$k" "the hot-plugged device's server saw QEMU connect after device_add"
    else
        result FAIL "$k" "the hot-plug server never saw a client ($d/hot.log)"
    fi
    # What the host saw of the guest's requests: every change done but the shrink
    # over data, which the server refuses and says why.
    if [[ ! -s $d/marks/ctl.log ]]; then
        result FAIL "$k" "live suite: the guest asked for no control request ($d/marks/ctl.log)"
    else
        while IFS=$'\t' read -r args rc out; do
            case $args in
            "ns.resize 3 64M")
                if [[ $rc -ne 0 && $out == *"may have data beyond"* ]]; then
                    result PASS "$k" "vnvme ctl $args refused: ${out:0:140}"
                else
                    result FAIL "$k" "vnvme ctl $args: exit $rc, want a refusal naming the data ($out)"
                fi
                ;;
            *)
                if [[ $rc -eq 0 ]]; then
                    result PASS "$k" "vnvme ctl $args: ${out:0:100}"
                else
                    result FAIL "$k" "vnvme ctl $args: exit $rc: $out"
                fi
                ;;
            esac
        done <"$d/marks/ctl.log"
    fi
    line=$(grep -ac 'namespace added\|namespace removed\|namespace resized' "$d/serve.log")
    if [[ $line -ge 6 ]]; then
        result PASS "$k" "server log: $line namespace changes logged"
    else
        result FAIL "$k" "server log: $line namespace changes logged, want >= 6"
    fi
    rm -f "$d/n3.img"
    echo "  [$k] live namespaces suite: $(($(date +%s) - t0)) s"
}

# The suites kept in files of their own (each defines functions only).
# shellcheck source=scripts/guest/suites/netstore.sh
source "$here/guest/suites/netstore.sh"
# shellcheck source=scripts/guest/suites/processes.sh
source "$here/guest/suites/processes.sh"
# shellcheck source=scripts/guest/suites/beside-qemu.sh
source "$here/guest/suites/beside-qemu.sh"

# want SUITE: whether SUITE is to run (--suite).
want() { [[ ${#suites[@]} -eq 0 || " ${suites[*]} " == *" $1 "* ]]; }
# Suites only run when asked for by name.
asked() { [[ " ${suites[*]} " == *" $1 "* ]]; }

for k in "${kernels[@]}"; do
    if [[ ! -e $(kernel_dir "$k")/.complete ]]; then
        result FAIL "$k" "kernel $k is not fetched (run scripts/guest/setup.sh or drop --no-fetch)"
        continue
    fi
    want main && suite_main "$k"
    want reboot && suite_reboot "$k"
done
# Injected failures and network storage: on one kernel (the newest asked for), to
# bound the time.
k_last=${kernels[${#kernels[@]}-1]}
if [[ -e $(kernel_dir "$k_last")/.complete ]]; then
    want faults && suite_faults "$k_last"
    want netstore && suite_netstore "$k_last"
    want outage && suite_outage "$k_last"
    want upgrade && suite_upgrade "$k_last"
    asked zns-qemu && suite_zns_qemu "$k_last"
    asked pi-qemu && suite_pi_qemu "$k_last"
    asked fdp-qemu && suite_fdp_qemu "$k_last"
    want multipath && suite_multipath "$k_last" 0
    asked multipath-kill && suite_multipath "$k_last" 1
    asked multipath-qemu && suite_multipath_qemu "$k_last"
fi
# Namespaces changed under the guest: on every kernel (6.1 and the newest rescan
# differently).
for k in "${kernels[@]}"; do
    [[ -e $(kernel_dir "$k")/.complete ]] && want live && suite_live "$k"
done

summary
[[ $n_fail -eq 0 ]]
