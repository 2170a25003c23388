#!/usr/bin/env bash
# Boot a guest kernel + initramfs under the fetched QEMU, run a script in the
# guest and return its exit status.
set -euo pipefail
# shellcheck source=scripts/lib/packages.sh
source "$(dirname "${BASH_SOURCE[0]}")/../lib/packages.sh"

usage() {
    cat <<EOF
Usage: ${0##*/} [OPTIONS] (--run FILE | --cmd STRING | --shell) [-- QEMU ARGS...]

Boots a q35 guest (serial console on stdout, no display) with guest RAM in a
shared memfd (memory-backend-memfd,share=on: what vfio-user needs), runs the
guest script and exits with its status. The script is packed as /guest-run.sh
into a small cpio archive that is prepended to the kernel's initramfs.

  --kernel K       bookworm | newest | KVER (fetched by fetch-kernels.sh) or a
                   path to a vmlinuz (then also give --initrd); default bookworm
  --initrd FILE    initramfs (default: the one mkinitramfs.sh built for K)
  --run FILE       guest script to run (sh, busybox + fio, nvme, mkfs.ext4)
  --cmd STRING     guest script given inline
  --shell          no script: interactive shell on the console (stdin used)
  --add SRC[:DST]  also put file SRC into the guest at DST (default /SRC-name)
  --accel A        auto | kvm | tcg (default: \$VNVME_ACCEL or auto: KVM only
                   if a probe boot under KVM works, result cached per host kernel)
  --mem SIZE       guest RAM (default: 1G)
  --smp N          guest CPUs (default: 2)
  --timeout SECS   kill the guest after SECS (default: 600)
  --append ARGS    extra kernel command line
  --log FILE       also write the serial output to FILE
  --verbose        kernel messages on the console (no 'quiet')
  --print-cmd      print the QEMU command line before running it
  --reboot         let a guest reboot reset the machine (default: QEMU exits,
                   -no-reboot); the guest script then runs again after the
                   reboot and must tell the passes apart itself
  -- ARGS...       passed to QEMU as is, e.g.
                   -drive file=d.img,if=none,id=d0,format=raw -device nvme,serial=x,drive=d0

Exit status: the guest script's status; 124 on timeout; 125 if the guest
ended without reporting a status; 2 for usage errors.
EOF
}

kernel=bookworm initrd="" script="" shell=0 accel="${VNVME_ACCEL:-auto}"
mem=1G smp=2 timeout_s=600 append="" logfile="" verbose=0 print_cmd=0 reboot=0
adds=() qemu_extra=()
while [[ $# -gt 0 ]]; do
    case $1 in
    --kernel) kernel=$2; shift 2 ;;
    --initrd) initrd=$2; shift 2 ;;
    --run) [[ -f $2 ]] || die "no such file: $2"; script=$(cat "$2"); shift 2 ;;
    --cmd) script=$2; shift 2 ;;
    --shell) shell=1; shift ;;
    --add) adds+=("$2"); shift 2 ;;
    --accel) accel=$2; shift 2 ;;
    --mem) mem=$2; shift 2 ;;
    --smp) smp=$2; shift 2 ;;
    --timeout) timeout_s=$2; shift 2 ;;
    --append) append=$2; shift 2 ;;
    --log) logfile=$2; shift 2 ;;
    --verbose) verbose=1; shift ;;
    --print-cmd) print_cmd=1; shift ;;
    --reboot) reboot=1; shift ;;
    -h | --help) usage; exit 0 ;;
    --) shift; qemu_extra=("$@"); break ;;
    *) usage >&2; exit 2 ;;
    esac
done
[[ -n $script || $shell -eq 1 ]] || { usage >&2; exit 2; }

# VNVME_QEMU: another QEMU wrapper (scripts/fetch-qemu-rbd.sh's, with block-rbd).
qemu="${VNVME_QEMU:-$VNVME_CACHE/qemu/current/bin/qemu-system-x86_64}"
[[ -x $qemu ]] || die "QEMU not fetched; run scripts/guest/fetch-qemu.sh"

if [[ -f $kernel ]]; then
    vmlinuz=$kernel
    [[ -n $initrd ]] || die "--initrd is required with a vmlinuz path"
else
    kd=$(kernel_dir "$kernel")
    [[ -e $kd/.complete ]] || die "kernel '$kernel' not fetched; run scripts/guest/fetch-kernels.sh"
    vmlinuz="$kd/vmlinuz"
    [[ -n $initrd ]] || initrd="$VNVME_CACHE/initramfs/$(cat "$kd/KVER").cpio.zst"
    [[ -s $initrd ]] || die "no initramfs $initrd; run scripts/guest/mkinitramfs.sh $kernel"
fi
need_cmds cpio:cpio timeout:coreutils

# probe_kvm: can KVM boot a stock kernel? (A /dev/kvm may exist yet be unable
# to, e.g. a PVM-based nested KVM.) Boots $vmlinuz without an initramfs: a
# working guest reaches "VFS: Unable to mount root fs" and panics in seconds.
probe_kvm() {
    local key cache out
    [[ -r /dev/kvm && -w /dev/kvm ]] || { log "accel: /dev/kvm not usable"; return 1; }
    key=$(printf '%s|%s|%s' "$(uname -r)" "$(uname -v)" "$(readlink -f "$VNVME_CACHE/qemu/current")" | sha256sum | cut -c1-16)
    cache="$VNVME_CACHE/accel/kvm-probe.$key"
    if [[ -f $cache ]]; then
        [[ $(cat "$cache") == ok ]]
        return
    fi
    log "accel: probing KVM with a test boot (once per host kernel, up to 30 s)"
    mkdir -p "$VNVME_CACHE/accel"
    out=$(timeout -k 5 30 "$qemu" -accel kvm -cpu host -machine q35 -m 256 -nodefaults -display none \
        -no-reboot -serial stdio -kernel "$vmlinuz" -append "console=ttyS0 panic=-1" </dev/null 2>&1 || true)
    if grep -q -a 'Unable to mount root' <<<"$out"; then
        echo ok >"$cache"
        return 0
    fi
    log "accel: KVM could not boot a guest; using TCG"
    echo bad >"$cache"
    return 1
}

case $accel in
auto) if probe_kvm; then accel=kvm; else accel=tcg; fi ;;
kvm | tcg) ;;
*) die "--accel must be auto, kvm or tcg" ;;
esac
if [[ $accel == kvm ]]; then cpu=host; else cpu=max; fi

work=$(mktemp -d "${TMPDIR:-/tmp}/vnvme-boot.XXXXXX")
trap 'rm -rf "$work"' EXIT

# Extra cpio (uncompressed, first) + the initramfs: the kernel unpacks both.
mkdir -p "$work/extra"
if [[ $shell -eq 0 ]]; then
    printf '%s\n' "$script" >"$work/extra/guest-run.sh"
fi
for a in "${adds[@]}"; do
    src=${a%%:*}
    dst=${a#*:}
    [[ $a == *:* ]] || dst="/${src##*/}"
    [[ -e $src ]] || die "--add: no such file: $src"
    mkdir -p "$work/extra/$(dirname "$dst")"
    cp -a "$src" "$work/extra/$dst"
done
(cd "$work/extra" && find . -mindepth 1 | LC_ALL=C sort | cpio -o -H newc -R 0:0 --quiet) >"$work/initrd"
cat "$initrd" >>"$work/initrd"

cmdline="console=ttyS0 panic=-1 mitigations=off"
[[ $verbose -eq 1 ]] || cmdline+=" quiet"
[[ $shell -eq 1 ]] && cmdline+=" vnvme.shell=1"
[[ -n $append ]] && cmdline+=" $append"

# process=: the thread name shown by ps (otherwise ld-linux-x86-64, see GUEST.md).
# debug-threads=on names the vCPU threads "CPU n/TCG" (or /KVM), so that
# bench-guest.sh can tell vCPU time from device-side time in /proc/PID/task.
noreboot=(-no-reboot)
[[ $reboot -eq 1 ]] && noreboot=()
cmd=("$qemu" -name "vnvme-guest,process=qemu-vnvme,debug-threads=on" -accel "$accel" -cpu "$cpu" -smp "$smp"
    -object "memory-backend-memfd,id=mem,size=$mem,share=on"
    -machine "q35,memory-backend=mem" -m "$mem"
    -nographic "${noreboot[@]}" -nic none
    -kernel "$vmlinuz" -initrd "$work/initrd" -append "$cmdline"
    "${qemu_extra[@]}")
if [[ $print_cmd -eq 1 ]]; then log "qemu command: ${cmd[*]}"; fi

log "booting $(basename "$(dirname "$vmlinuz")") (accel $accel, $smp cpu, $mem, timeout ${timeout_s}s)"
serial="$work/serial.log"
start=$(date +%s%N)
set +e
if [[ $shell -eq 1 ]]; then
    timeout -k 10 "$timeout_s" "${cmd[@]}" | tee "$serial"
    qrc=${PIPESTATUS[0]}
else
    # Drop CRs and the firmware's terminal control sequences (reset, no-wrap).
    timeout -k 10 "$timeout_s" "${cmd[@]}" </dev/null 2>&1 |
        sed -u -e 's/\r$//' -e 's/\x1bc//g' -e 's/\x1b\[[0-9;?]*[A-Za-z]//g' | tee "$serial"
    qrc=${PIPESTATUS[0]}
fi
set -e
elapsed=$((($(date +%s%N) - start) / 1000000))
[[ -z $logfile ]] || cp "$serial" "$logfile"

status=$(grep -a -o 'VNVME_GUEST_EXIT=[0-9]*' "$serial" | tail -1 | cut -d= -f2 || true)
secs=$(printf '%d.%03d' $((elapsed / 1000)) $((elapsed % 1000)))
if [[ -n $status ]]; then
    log "guest exited with status $status after ${secs}s"
    exit "$status"
elif [[ $qrc -eq 124 ]]; then
    log "timeout after ${secs}s"
    exit 124
fi
log "guest ended without a status after ${secs}s (qemu exit $qrc)"
exit 125
