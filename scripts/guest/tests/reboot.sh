# shellcheck shell=dash
# The second guest suite (scripts/guest-tests.sh): the server runs with
# --poll adaptive and 2 workers, and QEMU is started with boot.sh --reboot, so
# this script runs twice. Pass 1 measures the doorbell counters under adaptive
# polling, runs a verify job, writes 8 MiB with a known checksum and a marker
# block, then reboots the guest (QEMU system reset: the device is reset and
# the controller re-enabled; the server and its RAM namespace stay). Pass 2
# finds the marker and checks the data and the controller.
. /tests/lib.sh
. /tests/config.sh
probe_or_exit 1
fio_engine "$D1"
magic=$(dd if="$D1" bs=512 count=1 iflag=direct 2>/dev/null | head -c 80)
case $magic in
VNVME-REBOOT\ *)
    echo "== reboot suite, pass 2 (after the guest reboot): Linux $(uname -r)"
    t_pass "after guest reboot: nvme0 live again"
    want=$(echo "$magic" | cut -d' ' -f2)
    got=$(dd if="$D1" bs=65536 skip=128 count=128 iflag=direct 2>/dev/null | sha256sum | cut -d' ' -f1)
    t_eq "after guest reboot: 8 MiB written before the reboot, sha256" "$got" "$want"
    fio_verified "after guest reboot: fio write + verify" --filename="$D1" --ioengine="$ENGINE" --direct=1 --rw=randwrite --bs=4k --iodepth=16 --offset=32M --size=4M --verify=crc32c --verify_fatal=1 --name=r
    dd if=/dev/zero of="$D1" bs=512 count=1 oflag=direct 2>/dev/null
    echo "== reboot suite: $T_FAILED failure(s)"
    [ "$T_FAILED" -eq 0 ]
    exit
    ;;
esac

echo "== reboot suite, pass 1: Linux $(uname -r), server polling adaptive"
t_pass "controller probe: nvme0 live"
# shellcheck disable=SC2034 # read by doorbells.sh
DB_PREFIX=ad
. /tests/doorbells.sh
fio_verified "fio verify, 2 jobs at QD32, bs 512B-128K (adaptive polling, 2 workers)" \
    --filename="$D1" --ioengine="$ENGINE" --direct=1 --rw=randwrite \
    --bssplit=512/10:4k/40:32k/25:128k/25 --verify=crc32c --verify_fatal=1 --randrepeat=0 \
    --numjobs=2 --iodepth=32 --offset=16M --size=4M --offset_increment=16M --name=w2
dd if=/dev/urandom of=/tmp/pat bs=65536 count=128 2>/dev/null
dd if=/tmp/pat of="$D1" bs=65536 seek=128 oflag=direct 2>/dev/null
sum=$(sha256sum </tmp/pat | cut -d' ' -f1)
printf 'VNVME-REBOOT %s \n' "$sum" >/tmp/m
dd if=/tmp/m of="$D1" bs=512 count=1 conv=sync oflag=direct 2>/dev/null
if [ "$T_FAILED" -ne 0 ]; then
    echo "== reboot suite: $T_FAILED failure(s) before the reboot"
    exit 1
fi
echo "== rebooting the guest (reboot -f)"
reboot -f
sleep 30
t_fail "guest reboot: reboot -f returned"
exit 1
