# shellcheck shell=dash
# The protection information checks (pi.sh, pi64.sh) on a controller with two
# namespaces: type 1 protection information in 8 bytes of metadata per 512-byte
# block (NSID 1), and in the 64-bit guard format's 16 (NSID 2). The pi-qemu suite
# runs it on vnvme and on QEMU's own nvme device with the matching options, one
# boot each, to set what each passes side by side.
. /tests/lib.sh
. /tests/config.sh
echo "== guest-tests pi suite ($DEVICE): Linux $(uname -r)"
probe_or_exit 2
PI_DEV=$D1
PI64_DEV=$D2
fio_engine "$PI_DEV"
echo "== pi"
. /tests/pi.sh
echo "== pi64"
. /tests/pi64.sh
echo "== kernel messages (nvme)"
dmesg | grep -iE 'nvme|blk_update|I/O error|protection' | tail -30
# The errors on the blocks made bad on purpose are pi.sh's and pi64.sh's own
# checks; any other fails here.
bad64=$((PI64_LBA + 256))
if dmesg | grep -iE 'I/O error|timeout|blk_update_request|Buffer I/O|protection error' |
    grep -v "LBA $PI_CORRUPT_LBA,\|sector $PI_CORRUPT_LBA \|LBA $bad64,\|sector $bad64 " | grep -q .; then
    t_fail "guest kernel log: I/O errors or timeouts beyond the corrupted block (see above)"
else
    t_pass "guest kernel log: no I/O errors or timeouts beyond the corrupted block"
fi
echo "== pi suite ($DEVICE): $T_FAILED failure(s)"
[ "$T_FAILED" -eq 0 ]
