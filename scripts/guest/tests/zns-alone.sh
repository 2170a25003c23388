# shellcheck shell=dash
# The zoned namespace checks (zns.sh) on a controller whose only namespace is
# zoned: the zns-qemu suite runs it on vnvme and on QEMU's own nvme device with
# the matching options, one boot each, to set what each passes side by side.
. /tests/lib.sh
. /tests/config.sh
echo "== guest-tests zns suite ($DEVICE): Linux $(uname -r)"
probe_or_exit 1
D4=$D1
fio_engine "$D4"
echo "== zns"
. /tests/zns.sh
echo "== kernel messages (nvme)"
dmesg | grep -iE 'nvme|blk_update|I/O error|zone' | tail -30
if dmesg | grep -qiE 'I/O error|timeout|blk_update_request|Buffer I/O'; then
    t_fail "guest kernel log: I/O errors or timeouts (see above)"
else
    t_pass "guest kernel log: no I/O errors or timeouts"
fi
echo "== zns suite ($DEVICE): $T_FAILED failure(s)"
[ "$T_FAILED" -eq 0 ]
