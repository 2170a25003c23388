# shellcheck shell=dash
# The flexible data placement checks (fdp.sh) on a controller with one namespace
# in an endurance group of 4 reclaim unit handles: the fdp-qemu suite runs it on
# vnvme and on QEMU's own nvme device with the matching options, one boot each,
# to set what each passes side by side.
. /tests/lib.sh
. /tests/config.sh
echo "== guest-tests fdp suite ($DEVICE): Linux $(uname -r)"
probe_or_exit 1
FDP_DEV=$D1
echo "== fdp"
. /tests/fdp.sh
echo "== kernel messages (nvme)"
dmesg | grep -iE 'nvme|blk_update|I/O error|fdp' | tail -30
if dmesg | grep -iE 'I/O error|timeout|blk_update_request|Buffer I/O|FDP .*status' | grep -q .; then
    t_fail "guest kernel log: I/O errors, timeouts or FDP query failures (see above)"
else
    t_pass "guest kernel log: no I/O errors, timeouts or FDP query failures"
fi
echo "== fdp suite ($DEVICE): $T_FAILED failure(s)"
[ "$T_FAILED" -eq 0 ]
