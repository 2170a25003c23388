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

# net_server_start LOG SOCKET PROG ARGS...: start an NBD server in the background
# and wait for its socket; sets NET_PID. Returns 1 (log tail printed) if it never
# appeared.
net_server_start() {
    local log=$1 sock=$2 i
    shift 2
    rm -f "$sock"
    "$@" </dev/null >"$log" 2>&1 &
    NET_PID=$!
    NET_PIDS+=("$NET_PID")
    for ((i = 0; i < 200; i++)); do
        [[ -S $sock ]] && return 0
        kill -0 "$NET_PID" 2>/dev/null || break
        sleep 0.1
    done
    tail -n 5 "$log" | sed 's/^/    | /'
    return 1
}

# ext4_host_check KERNEL TAG RAW WHAT: the guest's ext4 on a namespace (its
# @@VNVME-EXT4-TAG line), read from RAW, a raw copy of the image WHAT: e2fsck is
# clean and the file's checksum matches the guest's.
ext4_host_check() {
    local k=$1 tag=$2 raw=$3 what=$4 d line path sum_guest sum_host
    d=$(dirname "$raw")
    line=$(grep -a -o "@@VNVME-EXT4-$tag [^@]*@@" "$d/guest.log" | tail -1)
    if [[ -z $line ]]; then
        result FAIL "$k" "host ext4 check on $what: the guest printed no checksum"
        return
    fi
    line=${line#@@VNVME-EXT4-"$tag" }
    line=${line%@@}
    path=${line%% *}
    sum_guest=${line#* }
    if e2fsck -fn "$raw" >"$raw.e2fsck" 2>&1; then
        result PASS "$k" "host: e2fsck -fn on $what's ext4 is clean"
    else
        result FAIL "$k" "host: e2fsck -fn on $what's ext4 reports problems ($raw.e2fsck)"
    fi
    sum_host=$(debugfs -R "cat $path" "$raw" 2>/dev/null | sha256sum | cut -d' ' -f1)
    if [[ $sum_host == "$sum_guest" ]]; then
        result PASS "$k" "host: $path in $what matches the guest's sha256 ${sum_guest:0:16}..."
    else
        result FAIL "$k" "host: $path in $what: sha256 $sum_host != guest $sum_guest"
    fi
}

# ceph_for_tests DIR: a running Ceph test cluster (scripts/test.sh's, from
# VNVME_TEST_CEPH_DIR, or one started in DIR, which cleanup stops); sets CEPH_DIR,
# or returns 1 with the reason on stderr.
ceph_for_tests() {
    if [[ -n ${VNVME_TEST_CEPH_DIR:-} ]]; then
        CEPH_DIR=$VNVME_TEST_CEPH_DIR
        return
    fi
    CEPH_OWN=$1
    "$here/ceph-cluster.sh" start "$1" >/dev/null || return 1
    CEPH_DIR=$1
}

suite_netstore() {
    local k=$1
    local d="$work/$k-netstore" t0 bin plugins line ceph="" cbin="" rbd_args=() n3=0
    mkdir -p "$d"
    t0=$(date +%s)
    echo
    echo "== [$k] network storage suite: namespaces on qemu-nbd (qcow2), nbdkit (memory) and Ceph RBD"
    if ! bin=$("$here/fetch-nbd-servers.sh" 2>"$d/fetch.log"); then
        result SKIP "$k" "network storage suite: qemu-nbd and nbdkit could not be fetched ($(tail -1 "$d/fetch.log"))"
        return
    fi
    plugins="$(dirname "$bin")/plugins"
    if ! "$bin/qemu-img" create -q -f qcow2 "$d/n1.qcow2" 64M >"$d/qemu-img.log" 2>&1; then
        result FAIL "$k" "qemu-img create: $(tail -1 "$d/qemu-img.log")"
        return
    fi
    if ! net_server_start "$d/qemu-nbd.log" "$d/qnbd.sock" "$bin/qemu-nbd" --format qcow2 \
        --shared 8 --persistent --discard unmap --socket "$d/qnbd.sock" "$d/n1.qcow2"; then
        result FAIL "$k" "qemu-nbd did not start ($d/qemu-nbd.log)"
        net_servers_stop
        return
    fi
    if ! net_server_start "$d/nbdkit.log" "$d/kit.sock" "$bin/nbdkit" --foreground \
        --unix "$d/kit.sock" "$plugins/nbdkit-memory-plugin.so" size=32M; then
        result FAIL "$k" "nbdkit did not start ($d/nbdkit.log)"
        net_servers_stop
        return
    fi
    # n3: an RBD image on the Ceph test cluster, as client.vnvme (profile rbd).
    if ! cbin=$("$here/fetch-ceph.sh" 2>"$d/ceph-fetch.log"); then
        result SKIP "$k" "network storage suite, rbd namespace: Ceph could not be fetched ($(tail -1 "$d/ceph-fetch.log"))"
    elif ! ceph_for_tests "$work/ceph" 2>"$d/ceph-start.log"; then
        result SKIP "$k" "network storage suite, rbd namespace: the Ceph test cluster did not start ($(tail -1 "$d/ceph-start.log"))"
    else
        ceph=$CEPH_DIR
        CEPH_CONF=$ceph/ceph.conf "$cbin/rbd" rm --no-progress rbd/guest-netstore >/dev/null 2>&1
        if CEPH_CONF=$ceph/ceph.conf "$cbin/rbd" create --size 64M rbd/guest-netstore 2>"$d/rbd.log"; then
            rbd_args=(--ns "rbd:rbd/guest-netstore:conf=$ceph/ceph.conf:id=vnvme:keyring=$ceph/ceph.client.vnvme.keyring")
            n3=$((64 << 20))
        else
            result FAIL "$k" "rbd create on the test cluster: $(tail -1 "$d/rbd.log")"
        fi
    fi
    write_config "$d/config.sh" VNVMEGT0006 $((64 << 20)) 512 $((32 << 20)) 512 "$n3" 512
    # librbd from the cached Ceph packages, for the server only.
    local wrap=("${VN_WRAP[@]}")
    if [[ $n3 -gt 0 ]]; then
        VN_WRAP=(env "$(. "$cbin/../env.sh" && printf 'VNVME_LIBRBD=%s' "$VNVME_LIBRBD")"
            "$(. "$cbin/../env.sh" && printf 'LD_LIBRARY_PATH=%s' "$LD_LIBRARY_PATH")" "${wrap[@]}")
    fi
    suite_boot "$k" "$d" netstore netstore.sh --timeout 300 -- \
        --ns "nbd+unix:///?socket=$d/qnbd.sock" --ns "nbd+unix:///?socket=$d/kit.sock" \
        "${rbd_args[@]}" --workers 2 --serial VNVMEGT0006
    local booted=$?
    VN_WRAP=("${wrap[@]}")
    net_servers_stop
    [[ $booted -eq 0 ]] || return
    line=$(grep -ac '^vnvme: namespace [12]: nbd:nbd+unix' "$d/serve.log")
    if [[ $line -eq 2 ]]; then
        result PASS "$k" "server log: both namespaces on NBD ($(grep -a '^vnvme: namespace 1: nbd' "$d/serve.log" | sed 's/.*(//; s/)$//'))"
    else
        result FAIL "$k" "server log: $line namespaces opened on NBD, want 2 ($d/serve.log)"
    fi

    # The images, from the host, with their servers gone (qemu-nbd) or through
    # Ceph's own tool: intact, and holding the guest's ext4 files.
    if "$bin/qemu-img" check -q "$d/n1.qcow2" >"$d/check.log" 2>&1; then
        result PASS "$k" "host: qemu-img check on the qcow2 image qemu-nbd served is clean"
    else
        result FAIL "$k" "host: qemu-img check: $(head -3 "$d/check.log" | tr '\n' ' ')"
    fi
    if ! (need_cmds e2fsck:e2fsprogs debugfs:e2fsprogs) >"$d/apt.log" 2>&1; then
        result SKIP "$k" "host ext4 checks on the images: e2fsprogs missing ($d/apt.log)"
    else
        if "$bin/qemu-img" convert -f qcow2 -O raw "$d/n1.qcow2" "$d/n1.raw" >"$d/convert.log" 2>&1; then
            ext4_host_check "$k" n1 "$d/n1.raw" "the qcow2 image"
        else
            result FAIL "$k" "qemu-img convert of the qcow2 image: $(tail -1 "$d/convert.log")"
        fi
        if [[ $n3 -gt 0 ]]; then
            if CEPH_CONF=$ceph/ceph.conf "$cbin/rbd" export --no-progress rbd/guest-netstore "$d/n3.raw" \
                >"$d/export.log" 2>&1; then
                ext4_host_check "$k" n3 "$d/n3.raw" "the RBD image (rbd export)"
            else
                result FAIL "$k" "rbd export of the guest's image: $(tail -1 "$d/export.log")"
            fi
        fi
    fi
    [[ -z $ceph ]] || CEPH_CONF=$ceph/ceph.conf "$cbin/rbd" rm --no-progress rbd/guest-netstore >/dev/null 2>&1
    rm -f "$d/n1.qcow2" "$d/n1.raw" "$d/n3.raw"
    echo "  [$k] network storage suite: $(($(date +%s) - t0)) s"
}

# net_servers_stop: stop the NBD servers net_server_start started.
# outage_action DIR ACTION: what the outage suite's guest asks the host for
# (@@VNVME-HOST ACTION@@, run by vn_watch in the background). The servers' PIDs
# are in files, so a restarted one is found by the next action and the cleanup.
outage_action() {
    local d=$OUTAGE_DIR pid
    case $2 in
    nbd-restart)
        pid=$(cat "$d/qemu-nbd.pid")
        kill -KILL "$pid" 2>/dev/null
        sleep 2.1
        rm -f "$d/qnbd.sock"
        "$OUTAGE_BIN/qemu-nbd" --format qcow2 --shared 8 --persistent --discard unmap \
            --cache=writethrough --socket "$d/qnbd.sock" "$d/n1.qcow2" </dev/null >>"$d/qemu-nbd.log" 2>&1 &
        echo $! >"$d/qemu-nbd.pid"
        echo "[host] qemu-nbd (pid $pid) SIGKILLed, a new one (pid $!) on its socket 2.1 s later"
        ;;
    nbdkit-pause)
        pid=$(cat "$d/nbdkit.pid")
        kill -STOP "$pid"
        sleep 10
        kill -CONT "$pid"
        echo "[host] nbdkit (pid $pid) SIGSTOPped for 10 s, then SIGCONTed"
        ;;
    osds-pause)
        # The cluster stops answering for 15 s: both OSDs stopped at once, so
        # neither reports the other down and the placement groups keep their
        # two-OSD acting sets. (Pausing the last OSD of an acting set instead hits
        # a Ceph 16.2 bug: a placement group that an op finds past its read lease
        # on resuming stays "laggy" for good, though the lease is renewed; every op
        # waits "for readable" and no client, QEMU's included, gets an answer.)
        local p0 p1
        p0=$(cat "$OUTAGE_CEPH/run/osd.0.pid") p1=$(cat "$OUTAGE_CEPH/run/osd.1.pid")
        kill -STOP "$p0" "$p1"
        sleep 15
        kill -CONT "$p0" "$p1"
        echo "[host] osd.0 and osd.1 (pids $p0 $p1) SIGSTOPped for 15 s, then SIGCONTed"
        ;;
    osd-lose)
        pid=$(cat "$OUTAGE_CEPH/run/osd.1.pid")
        kill -KILL "$pid"
        echo "[host] osd.1 (pid $pid) SIGKILLed for good"
        ;;
    *) echo "[host] unknown action $2" ;;
    esac
}

# outage_servers_stop: the outage suite's servers, by their PID files.
outage_servers_stop() {
    local f
    for f in "$OUTAGE_DIR/qemu-nbd.pid" "$OUTAGE_DIR/nbdkit.pid"; do
        [[ -s $f ]] && kill -CONT "$(cat "$f")" 2>/dev/null && kill "$(cat "$f")" 2>/dev/null
    done
    outage_ceph_stop
    return 0
}

# outage_ceph_start DIR: a fresh cluster of two OSDs in DIR (pool rbd size 2,
# min_size 1, heartbeats shortened), with a 64 MiB image rbd/outage; OUTAGE_CEPH set.
outage_ceph_start() {
    OUTAGE_CEPH=$1
    rm -rf "$OUTAGE_CEPH"
    VNVME_CEPH_OSDS=2 "$here/ceph-cluster.sh" start "$OUTAGE_CEPH" >"$OUTAGE_CEPH.log" 2>&1 &&
        CEPH_CONF=$OUTAGE_CEPH/ceph.conf "$OUTAGE_CBIN/rbd" create --size 64M rbd/outage >>"$OUTAGE_CEPH.log" 2>&1
}

outage_ceph_stop() {
    [[ -n ${OUTAGE_CEPH:-} ]] || return 0
    local i
    for i in 0 1; do
        kill -CONT "$(cat "$OUTAGE_CEPH/run/osd.$i.pid" 2>/dev/null)" 2>/dev/null
    done
    "$here/ceph-cluster.sh" stop "$OUTAGE_CEPH" >>"$OUTAGE_CEPH.log" 2>&1
    # The daemons' logs stay with the suite's (what the cluster did in an outage).
    rm -rf "$OUTAGE_CEPH-logs"
    cp -r "$OUTAGE_CEPH/log" "$OUTAGE_CEPH-logs" 2>/dev/null
    rm -rf "$OUTAGE_CEPH"
    OUTAGE_CEPH=""
}

# outage_row DIR: "fio OK|FAIL, ext4 OK|FAIL, kernel log clean|ERRORS, longest I/O
# N ms, longest ext4 round M ms" from a boot of the outage suite.
outage_row() {
    local g=$1/guest.log fio ext4 klog stall rbd
    if ! grep -aq '^== outage suite: ' "$g"; then
        echo "the guest never finished: $(grep -ao 'guest ended without a status after [0-9.]*s' "$g" | tail -1 ||
            echo 'no status')$(grep -a '^\[host\] ' "$g" | tail -1 | sed 's/^\[host\]/; the last host action:/')"
        return
    fi
    fio=$(grep -aq '^PASS: fio randwrite + crc32c verify on n1' "$g" && echo "fio verify ok" || echo "fio FAILED")
    ext4=$(grep -aq '^PASS: ext4 on n2 through' "$g" && echo "ext4 ok" || echo "ext4 FAILED")
    klog=$(grep -aq '^PASS: guest kernel log: no I/O error' "$g" && echo "kernel log clean" ||
        echo "kernel log: errors")
    stall=$(grep -ao '@@VNVME-STALL [0-9]* [0-9]*@@' "$g" | tail -1 | tr -d '@' | awk '{printf "longest I/O %d ms, longest ext4 round %d ms", $2 / 1e6, $3 * 10}')
    if grep -aq 'NSID 1..3' "$g"; then
        rbd=$(grep -aq '^PASS: fio randwrite + crc32c verify on n3' "$g" && echo "rbd fio verify ok" || echo "rbd fio FAILED")
        rbd="$rbd ($(grep -ao '@@VNVME-STALL-RBD [0-9]*@@' "$g" | tail -1 | tr -d '@' | awk '{printf "longest I/O %d ms", $2 / 1e6}'))"
    else
        rbd="no rbd namespace"
    fi
    echo "$fio, $ext4, $rbd, $klog, ${stall:-no figures}"
}

# The outage suite: qemu-nbd restarted (2.1 s down) and nbdkit paused (10 s)
# under a guest running fio verify and an ext4 loop (scripts/guest/tests/outage.sh),
# once on vnvme and once on QEMU's own nvme device with QEMU's NBD client
# (reconnect-delay=20), the control. vnvme's run counts; QEMU's is reported.
suite_outage() {
    local k=$1 d="$work/$k-outage" t0 plugins
    mkdir -p "$d/vnvme" "$d/qemu"
    t0=$(date +%s)
    echo
    echo "== [$k] outage suite: qemu-nbd restarted and nbdkit paused under fio verify and ext4, vnvme and QEMU"
    if ! OUTAGE_BIN=$("$here/fetch-nbd-servers.sh" 2>"$d/fetch.log"); then
        result SKIP "$k" "outage suite: qemu-nbd and nbdkit could not be fetched ($(tail -1 "$d/fetch.log"))"
        return
    fi
    OUTAGE_DIR=$d
    plugins="$(dirname "$OUTAGE_BIN")/plugins"
    if ! "$OUTAGE_BIN/qemu-img" create -q -f qcow2 "$d/n1.qcow2" 64M >"$d/qemu-img.log" 2>&1; then
        result FAIL "$k" "qemu-img create: $(tail -1 "$d/qemu-img.log")"
        return
    fi
    # Write-through: a SIGKILLed qemu-nbd's write-back cache would lose writes it
    # had acknowledged (the guest flushes nothing under fio --direct), whoever the
    # client.
    if ! net_server_start "$d/qemu-nbd.log" "$d/qnbd.sock" "$OUTAGE_BIN/qemu-nbd" --format qcow2 \
        --shared 8 --persistent --discard unmap --cache=writethrough --socket "$d/qnbd.sock" "$d/n1.qcow2"; then
        result FAIL "$k" "qemu-nbd did not start ($d/qemu-nbd.log)"
        net_servers_stop
        return
    fi
    echo "$NET_PID" >"$d/qemu-nbd.pid"
    if ! net_server_start "$d/nbdkit.log" "$d/kit.sock" "$OUTAGE_BIN/nbdkit" --foreground \
        --unix "$d/kit.sock" "$plugins/nbdkit-memory-plugin.so" size=32M; then
        result FAIL "$k" "nbdkit did not start ($d/nbdkit.log)"
        outage_servers_stop
        net_servers_stop
        return
    fi
    echo "$NET_PID" >"$d/nbdkit.pid"
    NET_PIDS=()
    # n3: an RBD image on a fresh cluster of two OSDs, per boot (one is lost).
    local n3=0 rbd_args=() wrap=("${VN_WRAP[@]}") ceph_env=()
    OUTAGE_CEPH=""
    if ! OUTAGE_CBIN=$("$here/fetch-ceph.sh" 2>"$d/ceph-fetch.log"); then
        result SKIP "$k" "outage suite, rbd namespace: Ceph could not be fetched ($(tail -1 "$d/ceph-fetch.log"))"
    elif ! outage_ceph_start "$d/ceph-vnvme"; then
        result FAIL "$k" "outage suite: the two-OSD Ceph cluster did not start ($(tail -1 "$d/ceph-vnvme.log"))"
    else
        n3=$((64 << 20))
        rbd_args=(--ns "rbd:rbd/outage:conf=$OUTAGE_CEPH/ceph.conf:id=vnvme:keyring=$OUTAGE_CEPH/ceph.client.vnvme.keyring")
        ceph_env=("$(. "$OUTAGE_CBIN/../env.sh" && printf 'VNVME_LIBRBD=%s' "$VNVME_LIBRBD")"
            "$(. "$OUTAGE_CBIN/../env.sh" && printf 'LD_LIBRARY_PATH=%s' "$LD_LIBRARY_PATH")")
        VN_WRAP=(env "${ceph_env[@]}" "${wrap[@]}")
    fi
    VN_HOST_ACTION=outage_action
    write_config "$d/vnvme/config.sh" VNVMEGT0009 $((64 << 20)) 512 $((32 << 20)) 512 "$n3" 512
    suite_boot "$k" "$d/vnvme" outage outage.sh --timeout 300 -- \
        --ns "nbd+unix:///?socket=$d/qnbd.sock" --ns "nbd+unix:///?socket=$d/kit.sock" "${rbd_args[@]}" \
        --workers 0 --serial VNVMEGT0009
    VN_WRAP=("${wrap[@]}")
    outage_ceph_stop
    if grep -aq 're-established after' "$d/vnvme/serve.log"; then
        result PASS "$k" "server log: $(grep -a 're-established after' "$d/vnvme/serve.log" | head -1 | sed 's/.*NBD connection/NBD connection/')"
    else
        result FAIL "$k" "server log: the NBD connection to the restarted qemu-nbd was never re-established"
    fi

    # The control: QEMU's own nvme device on the same servers (and its rbd driver
    # on a fresh cluster like vnvme's). Its guest takes about 80 s; the bound is
    # shorter than vnvme's, since the control's result is reported, not counted.
    local qemu_rbd=() qemu_bin=""
    n3=0
    if [[ -n ${OUTAGE_CBIN:-} ]] && qemu_bin=$("$here/fetch-qemu-rbd.sh" 2>"$d/qemu-rbd-fetch.log") &&
        outage_ceph_start "$d/ceph-qemu"; then
        n3=$((64 << 20))
        qemu_rbd=(-blockdev "driver=rbd,node-name=q3,pool=rbd,image=outage,conf=$OUTAGE_CEPH/ceph.conf,user=vnvme"
            -device nvme-ns,drive=q3,bus=nv0,nsid=3)
    else
        echo "  [$k qemu] no rbd namespace for QEMU (QEMU with block-rbd or the cluster unavailable)"
    fi
    write_config "$d/qemu/config.sh" QEMUOUTAGE0 $((64 << 20)) 512 $((32 << 20)) 512 "$n3" 512
    guest_adds "$d/qemu/config.sh"
    {
        local brc=0
        VNVME_QEMU=${qemu_bin:-${VNVME_QEMU:-}} "$here/guest/boot.sh" --kernel "$k" --accel "$accel" \
            --run "$tests_dir/outage.sh" "${GUEST_ADDS[@]}" --timeout 200 -- -pidfile "$d/qemu/qemu.pid" \
            -blockdev "driver=nbd,node-name=q1,server.type=unix,server.path=$d/qnbd.sock,reconnect-delay=20" \
            -blockdev "driver=nbd,node-name=q2,server.type=unix,server.path=$d/kit.sock,reconnect-delay=20" \
            -device nvme,id=nv0,serial=QEMUOUTAGE0 -device nvme-ns,drive=q1,bus=nv0,nsid=1 \
            -device nvme-ns,drive=q2,bus=nv0,nsid=2 "${qemu_rbd[@]}" || brc=$?
        echo "$brc" >"$d/qemu/boot.rc"
    } 2>&1 | vn_watch "$d/qemu/marks" "" | tee "$d/qemu/guest.log" |
        grep --line-buffered -E '^(PASS|FAIL|SKIP): |^== |^\[host\]' | sed -u "s/^/  [$k qemu] /"
    VN_HOST_ACTION=""
    outage_servers_stop
    echo "  [$k] outage table (the same outages, the same servers, one run; QEMU: its nvme device, its NBD client with reconnect-delay=20 and its rbd driver):"
    echo "    vnvme (nbd://, hold 25 s):  $(outage_row "$d/vnvme")"
    echo "    QEMU nvme (NBD client):    $(outage_row "$d/qemu")"
    echo "  [$k] outage suite: $(($(date +%s) - t0)) s"
}

net_servers_stop() {
    local p
    for p in "${NET_PIDS[@]}"; do
        kill "$p" 2>/dev/null && wait "$p" 2>/dev/null
    done
    NET_PIDS=()
}

# want SUITE: whether SUITE is to run (--suite).
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
