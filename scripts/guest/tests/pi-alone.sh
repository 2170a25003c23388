# shellcheck shell=dash
# The protection information checks (pi.sh) on a controller whose only namespace
# has type 1 protection information in 8 bytes of metadata per 512-byte block:
# the pi-qemu suite runs it on vnvme and on QEMU's own nvme device with the
# matching options, one boot each, to set what each passes side by side.
. /tests/lib.sh
. /tests/config.sh
echo "== guest-tests pi suite ($DEVICE): Linux $(uname -r)"
probe_or_exit 1
PI_DEV=$D1
fio_engine "$PI_DEV"
echo "== pi"
. /tests/pi.sh
echo "== kernel messages (nvme)"
dmesg | grep -iE 'nvme|blk_update|I/O error|protection' | tail -30
# The error on the block corrupted on purpose is pi.sh's own check; any other
# fails here.
if dmesg | grep -iE 'I/O error|timeout|blk_update_request|Buffer I/O|protection error' |
    grep -v "LBA $PI_CORRUPT_LBA,\|sector $PI_CORRUPT_LBA " | grep -q .; then
    t_fail "guest kernel log: I/O errors or timeouts beyond the corrupted block (see above)"
else
    t_pass "guest kernel log: no I/O errors or timeouts beyond the corrupted block"
fi
echo "== pi suite ($DEVICE): $T_FAILED failure(s)"
[ "$T_FAILED" -eq 0 ]
