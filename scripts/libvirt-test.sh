#!/usr/bin/env bash
# libvirt starts a VM on vnvme: Debian's libvirt daemon (installed as a host tool when
# missing; no system service: virsh starts a session daemon of an unprivileged user,
# so the host's own libvirt is never touched), the domain XML of docs/USAGE.md as
# written, with only what this host needs changed (the project's QEMU as emulator, a
# TCG domain unless KVM can boot here, the test kernel and a serial log, the socket
# path, 1 GiB), and `vnvme serve` running as the same user. Checked: virsh define and
# start; the guest sees the namespace and fio verifies on it; virsh suspend and resume
# (the device keeps its state: fio verifies again); virsh reset (the device is reset
# and the rebooted guest binds it again); virsh destroy (the server serves
# the next VM: started again, it boots, fio verifies, the guest powers off); the
# server ends cleanly on SIGTERM. One line per check (PASS, FAIL with the reason,
# SKIP with the reason), then
#   libvirt-checks: N passed, N failed, N skipped
# Exit 1 if any check failed. Needs root (to run the user's processes), the guest
# kernel and QEMU (scripts/guest-tests.sh fetches them) and target/release/vnvme.
set -uo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
# shellcheck source=scripts/lib/packages.sh
source "$ROOT/scripts/lib/packages.sh"
[ "${1:-}" = -h ] || [ "${1:-}" = --help ] && { sed -n '2,/^set -uo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0; }

CHECKS=libvirt
# shellcheck source=scripts/lib/checks.sh
source "$ROOT/scripts/lib/checks.sh"

USER_NAME=nobody
VNVME="$ROOT/target/release/vnvme"
QEMU_DIR=$(readlink -f "$VNVME_CACHE/qemu/current" 2>/dev/null || true)
KDIR="$VNVME_CACHE/kernels/bookworm"
[ "$(id -u)" -eq 0 ] || { skip "all" "needs root (runs the VM as an unprivileged user)"; summary; }
[ -x "$VNVME" ] || { skip "all" "target/release/vnvme is missing (cargo build --release)"; summary; }
[ -x "$QEMU_DIR/bin/qemu-system-x86_64" ] || { skip "all" "QEMU is not fetched (scripts/guest/fetch-qemu.sh)"; summary; }
[ -e "$KDIR/.complete" ] || { skip "all" "the bookworm guest kernel is not fetched (scripts/guest/fetch-kernels.sh)"; summary; }
INITRAMFS="$VNVME_CACHE/initramfs/$(cat "$KDIR/KVER").cpio.zst"
[ -s "$INITRAMFS" ] || { skip "all" "no initramfs for the bookworm kernel (scripts/guest/mkinitramfs.sh bookworm)"; summary; }
QEMU_DRIVER=/usr/lib/x86_64-linux-gnu/libvirt/connection-driver/libvirt_driver_qemu.so
libvirt_tools() {
    need_cmds libvirtd:libvirt-daemon virsh:libvirt-clients || return
    # The QEMU driver has no command of its own: asked for by its package's name.
    [ -e "$QEMU_DRIVER" ] || need_cmds libvirt-qemu-driver-absent:libvirt-daemon-driver-qemu
}
if ! (libvirt_tools) >/tmp/libvirt-apt.$$ 2>&1; then
    skip "all" "libvirt could not be installed: $(tail -1 /tmp/libvirt-apt.$$)"
    rm -f /tmp/libvirt-apt.$$
    summary
fi
rm -f /tmp/libvirt-apt.$$

# The ACPI power button (virsh shutdown and reboot press it): the kernel's button
# and evdev modules, which the guest tests' module set leaves out, from the same
# kernel package (fetched once, cached beside the kernel).
KVER=$(cat "$KDIR/KVER")
ACPI_MODS="$VNVME_CACHE/kernels/acpi-modules-$KVER"
acpi_modules() {
    local tmp f m
    [ -s "$ACPI_MODS/button.ko" ] && [ -s "$ACPI_MODS/evdev.ko" ] && return 0
    tmp=$(mktemp -d)
    papt_init bookworm "$(suite_sources bookworm)"
    papt_update bookworm
    papt_download bookworm "$tmp" "linux-image-$KVER" || { rm -rf "$tmp"; return 1; }
    dpkg-deb -x "$tmp"/linux-image-"$KVER"_*.deb "$tmp/x" || { rm -rf "$tmp"; return 1; }
    mkdir -p "$ACPI_MODS.tmp"
    for m in button evdev; do
        f=$(find "$tmp/x" -name "$m.ko*" | head -1)
        [ -n "$f" ] || { rm -rf "$tmp" "$ACPI_MODS.tmp"; return 1; }
        case $f in
        *.xz) xz -dc "$f" ;; *.zst) zstd -q -dc "$f" ;; *.gz) gzip -dc "$f" ;; *) cat "$f" ;;
        esac >"$ACPI_MODS.tmp/$m.ko"
    done
    rm -rf "$tmp" "$ACPI_MODS"
    mv "$ACPI_MODS.tmp" "$ACPI_MODS"
}
ACPI=1
if ! (acpi_modules) >/tmp/libvirt-acpi.$$ 2>&1; then
    ACPI=0
    acpi_why="the kernel's ACPI button module could not be fetched: $(tail -1 /tmp/libvirt-acpi.$$)"
fi
rm -f /tmp/libvirt-acpi.$$

W=$(mktemp -d "${TMPDIR:-/tmp}/vnvme-libvirt.XXXXXX")
chmod 755 "$W"
SERVER=
as_user() { setpriv --reuid="$USER_NAME" --regid="$(id -g "$USER_NAME")" --clear-groups -- "$@"; }
virsh_() { as_user env HOME="$W/home" XDG_RUNTIME_DIR="$W/run" timeout 120 virsh -q -c qemu:///session "$@"; }
cleanup() {
    virsh_ destroy vm1 >/dev/null 2>&1
    virsh_ undefine vm1 >/dev/null 2>&1
    [ -n "$SERVER" ] && kill "$SERVER" 2>/dev/null
    # The session daemon virsh started for the user, found by its pid file.
    for p in "$W"/run/libvirt/*.pid; do [ -f "$p" ] && kill "$(cat "$p")" 2>/dev/null; done
    sleep 0.5
    rm -rf "$W"
}
trap cleanup EXIT

# ---- the user's files: QEMU (hard links when the cache shares the file system),
# the kernel, the initramfs with the guest script in front, vnvme itself.
mkdir -p "$W/home" "$W/run" "$W/extra"
cp -al "$QEMU_DIR" "$W/qemu" 2>/dev/null || cp -a "$QEMU_DIR" "$W/qemu"
cp "$KDIR/vmlinuz" "$W/vmlinuz"
cp "$VNVME" "$W/vnvme"
if [ "$ACPI" = 1 ]; then
    mkdir -p "$W/extra/acpi"
    cp "$ACPI_MODS/button.ko" "$ACPI_MODS/evdev.ko" "$W/extra/acpi/"
fi
cat >"$W/extra/guest-run.sh" <<'EOF'
# Which boot this is, the namespace says: each boot leaves a mark at LBA 0 for the
# next (the first VM's boot, its reset, then the next VM).
set -e
dev=/dev/nvme0n1
# The power button powers the guest off (acpid's job in a full system): virsh
# shutdown, and virsh reboot, which libvirt turns into a power-off and a fresh start.
if [ -d /acpi ]; then
    insmod /acpi/button.ko 2>/dev/null || true
    insmod /acpi/evdev.ko 2>/dev/null || true
    for i in /sys/class/input/input*; do
        grep -q 'Power Button' "$i/name" 2>/dev/null || continue
        for e in "$i"/event*; do
            [ -e "$e" ] || continue
            (dd if=/dev/input/${e##*/} bs=24 count=1 >/dev/null 2>&1
             echo LV_POWER_BUTTON; sync; poweroff -f) &
            echo LV_ACPI_READY
            break 2
        done
    done
fi
nvme list | grep -q 'vnvme' && echo LV_SEEN
verify() {
    fio --name=v --filename=$dev --offset=1M --size=16M --rw=randwrite --bs=4k --iodepth=8 \
        --ioengine=libaio --direct=1 --verify=crc32c --do_verify=1 --output-format=terse >/tmp/fio.out
    [ "$(cut -d';' -f5 /tmp/fio.out)" = 0 ] && echo "LV_FIO_OK_$1"
}
mark() { printf 'LVBOOT%s!' "$1" | dd of=$dev bs=512 count=1 conv=sync,fsync 2>/dev/null; }
case "$(dd if=$dev bs=512 count=1 2>/dev/null | head -c 8)" in
LVBOOT4!)
    # After virsh reboot: a fresh start of the VM.
    verify 6
    exit 0 ;;
LVBOOT3!)
    # The next VM, started after virsh shutdown; virsh reboot comes now.
    mark 4
    verify 5
    sleep 600 ;;
LVBOOT2!)
    mark 3
    verify 4
    # virsh shutdown comes now (or, without the button, the script ends here).
    [ -d /acpi ] && sleep 600
    exit 0 ;;
LVBOOT1!)
    # After virsh reset: the device was reset and the driver bound it again.
    mark 2
    verify 3
    # The host destroys the VM now.
    sleep 600 ;;
esac
mark 1
verify 1
# The host suspends and resumes the VM in this window.
sleep 15
verify 2
# The host resets the VM now.
sleep 600
EOF
(cd "$W/extra" && find . -mindepth 1 | LC_ALL=C sort | cpio -o -H newc -R 0:0 --quiet) >"$W/initrd"
cat "$INITRAMFS" >>"$W/initrd"
chown "$USER_NAME" "$W" "$W/home" "$W/run"
chmod 644 "$W/initrd" "$W/vmlinuz"

# A TCG domain unless a KVM probe boot worked here (scripts/guest/boot.sh caches it).
domtype=qemu
key=$(printf '%s|%s|%s' "$(uname -r)" "$(uname -v)" "$QEMU_DIR" | sha256sum | cut -c1-16)
[ "$(cat "$VNVME_CACHE/accel/kvm-probe.$key" 2>/dev/null)" = ok ] && domtype=kvm

# ---- the documented domain, with this host's paths
if ! python3 - "$ROOT/docs/USAGE.md" "$W" "$domtype" >"$W/vm1.xml" 2>"$W/xml.err" <<'EOF'
import re, sys
import xml.etree.ElementTree as ET
doc, w, domtype = sys.argv[1:]
text = open(doc).read()
start = text.index("<!-- libvirt-domain-example -->")
xml = re.search(r"```xml\n(.*?)```", text[start:], re.S).group(1)
Q = "http://libvirt.org/schemas/domain/qemu/1.0"
ET.register_namespace("qemu", Q)
d = ET.fromstring(xml)
d.set("type", domtype)
m = d.find("memory"); m.set("unit", "GiB"); m.text = "1"
os_ = d.find("os")
for tag, val in (("kernel", f"{w}/vmlinuz"), ("initrd", f"{w}/initrd"),
                 ("cmdline", "console=ttyS0 panic=-1 mitigations=off quiet")):
    ET.SubElement(os_, tag).text = val
dev = d.find("devices")
dev.find("emulator").text = f"{w}/qemu/bin/qemu-system-x86_64"
serial = ET.SubElement(dev, "serial", type="file")
ET.SubElement(serial, "source", path=f"{w}/serial.log")
for arg in d.iter(f"{{{Q}}}arg"):
    arg.set("value", arg.get("value").replace("/run/vnvme/vm1.sock", f"{w}/vm1.sock"))
print(ET.tostring(d, encoding="unicode"))
EOF
then
    fail "the domain of docs/USAGE.md" "$(tail -2 "$W/xml.err" | tr '\n' ' ')"
    summary
fi
chmod 644 "$W/vm1.xml"

# ---- the device, then the VM
(cd "$W" && exec setpriv --reuid="$USER_NAME" --regid="$(id -g "$USER_NAME")" --clear-groups -- \
    "$W/vnvme" --log info serve --socket "$W/vm1.sock" --ns ram:256M) >"$W/serve.log" 2>&1 &
SERVER=$!
for _ in $(seq 100); do [ -S "$W/vm1.sock" ] && break; sleep 0.1; done

# wait_serial PATTERN SECS: the serial log shows PATTERN within SECS (no longer
# once the guest script has ended without it).
wait_serial() {
    local end=$((SECONDS + $2))
    while [ $SECONDS -lt $end ]; do
        grep -aq "$1" "$W/serial.log" 2>/dev/null && return 0
        grep -aq 'VNVME_GUEST_EXIT=' "$W/serial.log" 2>/dev/null && return 1
        sleep 1
    done
    return 1
}
state() { virsh_ domstate vm1 2>&1 | head -1; }
guest_tail() { grep -a -v '^\[' "$W/serial.log" 2>/dev/null | tail -3 | tr '\n' ' '; }

if out=$(virsh_ define "$W/vm1.xml" 2>&1); then pass "virsh define (docs/USAGE.md's domain, type $domtype)"; else
    fail "virsh define" "$out"; summary; fi
if out=$(virsh_ start vm1 2>&1); then pass "virsh start"; else
    fail "virsh start" "$out $(tail -3 "$W/home/.cache/libvirt/qemu/log/vm1.log" 2>/dev/null | tr '\n' ' ')"; summary; fi
if wait_serial LV_FIO_OK_1 240; then
    grep -aq LV_SEEN "$W/serial.log" && pass "the guest sees the vnvme namespace; fio verify passes" ||
        fail "the guest sees the vnvme namespace" "nvme list did not show it"
else
    fail "the guest sees the namespace; fio verify" "no verified fio run: $(guest_tail)"
    summary
fi
# Suspend for a few seconds inside the guest's 15 s wait, then resume.
if virsh_ suspend vm1 >/dev/null && [ "$(state)" = paused ]; then
    sleep 3
    if virsh_ resume vm1 >/dev/null && [ "$(state)" = running ]; then pass "virsh suspend, virsh resume"; else
        fail "virsh resume" "state $(state)"; fi
else
    fail "virsh suspend" "state $(state)"
fi
if wait_serial LV_FIO_OK_2 120; then pass "after resume the device keeps its state: fio verify passes again"; else
    fail "after resume: fio verify" "no verified fio run: $(guest_tail)"; fi
# A hard reset: QEMU resets the machine and the device (a vfio-user reset the server
# logs), the guest boots again in the same VM and its driver binds the device anew.
resets_before=$(grep -c 'device reset requested' "$W/serve.log")
if virsh_ reset vm1 >/dev/null && wait_serial LV_FIO_OK_3 240 &&
    [ "$(grep -c 'device reset requested' "$W/serve.log")" -gt "$resets_before" ]; then
    pass "virsh reset: the device is reset (vnvme saw $resets_before -> $(grep -c 'device reset requested' "$W/serve.log") resets), the rebooted guest binds it again, fio verify passes"
else
    fail "virsh reset" "resets seen by vnvme $resets_before -> $(grep -c 'device reset requested' "$W/serve.log"); $(guest_tail)"
fi
# What libvirt cannot do here, tried, with what it says: the VM must run on after
# each refusal. A save is a migration to a file (libvirt 9.0 asks QEMU 11.1 for a
# migrate parameter it no longer has); the device is not libvirt's to detach (it
# is on QEMU's command line). Should a save work one day, the restore is checked.
if out=$(virsh_ save vm1 "$W/vm1.save" 2>&1); then
    if virsh_ restore "$W/vm1.save" >/dev/null 2>&1 && [ "$(state)" = running ]; then
        pass "virsh save and restore"
    else
        fail "virsh save and restore" "saved, then state $(state) after restore"
    fi
elif [ "$(state)" = running ]; then
    pass "virsh save refused, the VM runs on ($(tail -1 <<<"$out"))"
else
    fail "virsh save refused" "state $(state): $out"
fi
if ! out=$(virsh_ detach-device-alias vm1 nvme0 2>&1) && [ "$(state)" = running ]; then
    pass "virsh detach-device-alias refused, the VM runs on ($(tail -1 <<<"$out"))"
else
    fail "virsh detach-device-alias" "state $(state): $out"
fi
if virsh_ destroy vm1 >/dev/null && [ "$(state)" = "shut off" ] && kill -0 "$SERVER" 2>/dev/null; then
    pass "virsh destroy (the VM is off, the server serves on)"
else
    fail "virsh destroy" "state $(state); server $(kill -0 "$SERVER" 2>/dev/null && echo alive || echo gone)"
fi
: >"$W/serial.log"
if virsh_ start vm1 >/dev/null 2>&1 && wait_serial LV_FIO_OK_4 240; then
    pass "the server serves the next VM: it boots, finds the first VM's mark, fio verify passes"
else
    fail "the next VM" "$(guest_tail)"
fi
# wait_off SECS: the domain is shut off within SECS.
wait_off() {
    local end=$((SECONDS + $1))
    while [ $SECONDS -lt $end ]; do [ "$(state)" = "shut off" ] && return 0; sleep 1; done
    return 1
}
sessions=2
if [ "$ACPI" = 1 ]; then
    # virsh shutdown: the power button, the guest powers off, the domain ends, and
    # vnvme sees the session end.
    if grep -aq LV_ACPI_READY "$W/serial.log" && virsh_ shutdown vm1 >/dev/null && wait_off 60 &&
        grep -aq LV_POWER_BUTTON "$W/serial.log" && sleep 1 &&
        [ "$(grep -c 'client disconnected' "$W/serve.log")" -ge 2 ]; then
        pass "virsh shutdown: the guest powers off on the button, the domain ends, vnvme's session ends"
    else
        fail "virsh shutdown" "state $(state); $(guest_tail)"
        virsh_ destroy vm1 >/dev/null 2>&1
    fi
    # virsh reboot: libvirt powers the guest off with the button and starts it again
    # in the same QEMU (the device reset, the driver binding it again).
    : >"$W/serial.log"
    resets_before=$(grep -c 'device reset requested' "$W/serve.log")
    if virsh_ start vm1 >/dev/null 2>&1 && wait_serial LV_FIO_OK_5 240 && virsh_ reboot vm1 >/dev/null &&
        wait_serial LV_FIO_OK_6 240 && grep -aq LV_POWER_BUTTON "$W/serial.log"; then
        pass "virsh reboot: the guest boots again, binds the device again, fio verify passes (vnvme saw $resets_before -> $(grep -c 'device reset requested' "$W/serve.log") resets)"
    else
        fail "virsh reboot" "state $(state); $(guest_tail)"
    fi
    sessions=3
else
    skip "virsh shutdown" "$acpi_why"
    skip "virsh reboot" "$acpi_why"
fi
# The last guest powers off: libvirt sees the domain end.
wait_serial 'VNVME_GUEST_EXIT=0' 120
wait_off 30 && pass "guest power-off ends the domain" || fail "guest power-off" "state $(state); $(guest_tail)"
kill -TERM "$SERVER"
if wait "$SERVER" && [ "$(grep -c 'client disconnected' "$W/serve.log")" -ge "$sessions" ]; then
    pass "vnvme ends cleanly: exit 0, all $sessions sessions ended (after $(grep -o 'client disconnected ([0-9.]* s' "$W/serve.log" | sed 's/.*(//' | paste -sd, -))"
else
    fail "vnvme's clean end" "$(grep -c 'client disconnected' "$W/serve.log") of $sessions sessions ended; $(tail -3 "$W/serve.log" | tr '\n' ' ')"
fi
SERVER=
summary
