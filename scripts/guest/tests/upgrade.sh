# shellcheck shell=dash
# The server replaced under the running guest (scripts/guest-tests.sh, upgrade
# suite): while fio verifies n1 and an ext4 loop writes and checksums files on n2,
# the guest asks the host ("@@VNVME-CTL upgrade@@") to upgrade the server 10
# times. Nothing may be seen from here: no I/O error, no verify failure, no
# controller reset or timeout in the kernel log. The longest I/O latency fio saw
# is reported (the stall an upgrade costs, as the guest sees it).
#
# The host serves n1 RAM 256 MiB and n2 a 128 MiB file.
. /tests/lib.sh
. /tests/config.sh
echo "== guest-tests upgrade suite: Linux $(uname -r)"
probe_or_exit 2
t_pass "controller probe: nvme0 live, NSID 1/2 = $D1 $D2"
fio_engine "$D1"
UPGRADES=10

rm -f /tmp/stop /tmp/fio.fail /tmp/ext4.fail /tmp/lat.max
# fio: write passes with crc32c verify over 32 MiB of n1 until told to stop; each
# pass's largest completion latency (read or write) is kept.
(
    n=0
    while [ ! -e /tmp/stop ]; do
        if ! fio --name=up --filename="$D1" --ioengine="$ENGINE" --direct=1 --rw=randwrite --bs=4k \
            --iodepth=16 --size=32M --offset=$(((n % 6) * 32))M --verify=crc32c --do_verify=1 \
            --verify_fatal=1 --output-format=json >/tmp/fio.out 2>&1; then
            { echo "pass $n"; tail -n 30 /tmp/fio.out; } >/tmp/fio.fail
            break
        fi
        tr -d ' \n' </tmp/fio.out | grep -o '"lat_ns":{"min":[0-9]*,"max":[0-9]*' |
            sed 's/.*"max"://' >>/tmp/lat.max
        n=$((n + 1))
    done
    echo "$n" >/tmp/fio.passes
) &
FIO=$!

# ext4 on n2: write a random file, sync, drop the page cache, read it back and
# compare checksums, over and over.
if mkfs.ext4 -q -F "$D2" >/tmp/mkfs.out 2>&1 && mount -t ext4 "$D2" /mnt >>/tmp/mkfs.out 2>&1; then
    t_pass "mkfs.ext4 + mount on n2 (file-backed)"
else
    t_fail "mkfs.ext4 + mount on n2"
    cat /tmp/mkfs.out
fi
(
    n=0
    while [ ! -e /tmp/stop ] && grep -q ' /mnt ' /proc/mounts; do
        dd if=/dev/urandom of=/mnt/f$((n % 4)).bin bs=65536 count=32 2>/dev/null
        want=$(sha256sum /mnt/f$((n % 4)).bin | cut -d' ' -f1)
        sync
        echo 3 >/proc/sys/vm/drop_caches
        got=$(sha256sum /mnt/f$((n % 4)).bin | cut -d' ' -f1)
        if [ "$got" != "$want" ]; then
            echo "round $n: f$((n % 4)).bin read back $got, written $want" >/tmp/ext4.fail
            break
        fi
        n=$((n + 1))
    done
    echo "$n" >/tmp/ext4.rounds
) &
EXT4=$!

sleep 3
i=1
while [ $i -le $UPGRADES ]; do
    echo "@@VNVME-CTL upgrade@@"
    sleep 3
    i=$((i + 1))
done
sleep 2
touch /tmp/stop
wait $FIO
wait $EXT4

passes=$(cat /tmp/fio.passes 2>/dev/null || echo 0)
if [ -e /tmp/fio.fail ]; then
    t_fail "fio verify on n1 during $UPGRADES upgrades failed after $passes pass(es)"
    sed 's/^/    | /' /tmp/fio.fail
elif [ "$passes" -ge 1 ]; then
    t_pass "fio randwrite + crc32c verify on n1 during $UPGRADES upgrades: $passes passes of 32 MiB, no error"
else
    t_fail "fio on n1: no pass completed"
fi
rounds=$(cat /tmp/ext4.rounds 2>/dev/null || echo 0)
if [ -e /tmp/ext4.fail ]; then
    t_fail "ext4 write-and-checksum on n2: $(cat /tmp/ext4.fail)"
elif [ "$rounds" -ge 1 ]; then
    t_pass "ext4 on n2 during the upgrades: $rounds rounds of write 2 MiB, sync, drop caches, checksum match"
else
    t_fail "ext4 on n2: no round completed"
fi
if umount /mnt; then
    t_run "fsck.ext4 -fn on n2 after the upgrades" fsck.ext4 -fn "$D2"
else
    t_fail "umount n2"
fi
max=$(sort -n /tmp/lat.max 2>/dev/null | tail -1)
if [ -n "$max" ]; then
    # A figure, not a check (the kernel log check below catches a stall that
    # reached the I/O timeout).
    echo "longest fio I/O latency (submit to completion) over all passes: $((max / 1000)) us (the upgrades' stall as the guest saw it)"
    echo "@@VNVME-STALL $max@@"
else
    t_fail "fio reported no latency"
fi

echo "== kernel messages (nvme)"
dmesg | grep -iE 'nvme|blk_update|I/O error|hung|reset' | tail -30
if dmesg | grep -qiE 'hung task|blocked for more than|timeout|resetting|I/O error|blk_update_request|Buffer I/O'; then
    t_fail "guest kernel log: an I/O error, timeout or controller reset (see above)"
else
    t_pass "guest kernel log: no I/O error, no timeout, no controller reset"
fi
echo "== upgrade suite: $T_FAILED failure(s)"
[ "$T_FAILED" -eq 0 ]
