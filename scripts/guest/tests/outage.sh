# shellcheck shell=dash
# The outage suite (scripts/guest-tests.sh): network storage goes away under a
# running guest and comes back, and nothing may be seen from here. n1 is qemu-nbd
# serving a qcow2 image (--cache=writethrough: a SIGKILLed server's write-back
# cache would lose writes it had acknowledged, for any client), n2 nbdkit's
# memory plugin, both on the host's UNIX sockets; the same script runs once on vnvme and once on QEMU's own nvme device
# (QEMU's NBD client with reconnect-delay), the control.
#
# While fio verifies n1 and an ext4 loop writes and checksums files on n2, the
# guest asks the host for outages ("@@VNVME-HOST ACTION@@"):
#   nbd-restart    qemu-nbd SIGKILLed and started again on its socket 2.1 s later
#   nbdkit-pause   nbdkit SIGSTOPped for 10 s, then SIGCONTed
#   osds-pause     (with n3: an RBD image on a cluster of two OSDs, pool size 2,
#                  min_size 1) both OSDs SIGSTOPped for 15 s, then SIGCONTed: the
#                  cluster answers nothing for 15 s
#   osd-lose       one OSD SIGKILLed for good: the other takes its placement
#                  groups once the monitor has it down (seconds)
# Acceptance: no fio error, every checksum right, fsck clean, no I/O error, timeout
# or controller reset in the kernel log. The longest I/O latency fio saw is
# reported ("@@VNVME-STALL NS@@"), and each outage's longest ext4 round.
. /tests/lib.sh
. /tests/config.sh
echo "== guest-tests outage suite: Linux $(uname -r)"
n=2
[ "$N3_BYTES" -gt 0 ] && n=3
probe_or_exit "$n"
t_pass "controller probe: nvme0 live, NSID 1..$n = $D1 $D2 ${D3:-}"
fio_engine "$D1"

rm -f /tmp/stop /tmp/fio.fail /tmp/ext4.fail /tmp/lat.max /tmp/round.max /tmp/rbd.fail /tmp/rbd.max
(
    n=0
    while [ ! -e /tmp/stop ]; do
        if ! fio --name=out --filename="$D1" --ioengine="$ENGINE" --direct=1 --rw=randwrite --bs=4k \
            --iodepth=16 --size=8M --offset=$(((n % 4) * 8))M --verify=crc32c --do_verify=1 \
            --verify_fatal=1 --output-format=json >/tmp/fio.out 2>&1; then
            { echo "pass $n"; grep -iE 'verify|bad|crc|err[ =]|error' /tmp/fio.out | grep -v '"' | head -20; } >/tmp/fio.fail
            break
        fi
        tr -d ' \n' </tmp/fio.out | grep -o '"lat_ns":{"min":[0-9]*,"max":[0-9]*' |
            sed 's/.*"max"://' >>/tmp/lat.max
        n=$((n + 1))
    done
    echo "$n" >/tmp/fio.passes
) &
FIO=$!

if mkfs.ext4 -q -F "$D2" >/tmp/mkfs.out 2>&1 && mount -t ext4 "$D2" /mnt >>/tmp/mkfs.out 2>&1; then
    t_pass "mkfs.ext4 + mount on n2"
else
    t_fail "mkfs.ext4 + mount on n2"
    cat /tmp/mkfs.out
fi
(
    n=0
    while [ ! -e /tmp/stop ] && grep -q ' /mnt ' /proc/mounts; do
        t0=$(now_cs)
        dd if=/dev/urandom of=/mnt/f$((n % 4)).bin bs=65536 count=16 2>/dev/null
        want=$(sha256sum /mnt/f$((n % 4)).bin | cut -d' ' -f1)
        sync
        echo 3 >/proc/sys/vm/drop_caches
        got=$(sha256sum /mnt/f$((n % 4)).bin | cut -d' ' -f1)
        if [ "$got" != "$want" ]; then
            echo "round $n: f$((n % 4)).bin read back $got, written $want" >/tmp/ext4.fail
            break
        fi
        echo $(($(now_cs) - t0)) >>/tmp/round.max
        n=$((n + 1))
    done
    echo "$n" >/tmp/ext4.rounds
) &
EXT4=$!

# n3 (rbd): fio verify passes, like n1's.
if [ "$n" = 3 ]; then
    (
        m=0
        while [ ! -e /tmp/stop ]; do
            if ! fio --name=rbd --filename="$D3" --ioengine="$ENGINE" --direct=1 --rw=randwrite --bs=4k \
                --iodepth=16 --size=8M --offset=$(((m % 4) * 8))M --verify=crc32c --do_verify=1 \
                --verify_fatal=1 --output-format=json >/tmp/rbd.out 2>&1; then
                { echo "pass $m"; grep -iE 'verify|bad|crc|err[ =]|error' /tmp/rbd.out | grep -v '"' | head -20; } >/tmp/rbd.fail
                break
            fi
            tr -d ' \n' </tmp/rbd.out | grep -o '"lat_ns":{"min":[0-9]*,"max":[0-9]*' |
                sed 's/.*"max"://' >>/tmp/rbd.max
            m=$((m + 1))
        done
        echo "$m" >/tmp/rbd.passes
    ) &
    RBD=$!
fi

sleep 3
echo "@@VNVME-HOST nbd-restart@@"
sleep 8
echo "@@VNVME-HOST nbdkit-pause@@"
sleep 14
if [ "$n" = 3 ]; then
    echo "@@VNVME-HOST osds-pause@@"
    # The host's pause takes 15 s; then some time back to normal before the next.
    sleep 22
    echo "@@VNVME-HOST osd-lose@@"
    sleep 16
fi
touch /tmp/stop
wait $FIO
wait $EXT4
[ "$n" = 3 ] && wait $RBD

passes=$(cat /tmp/fio.passes 2>/dev/null || echo 0)
if [ -e /tmp/fio.fail ]; then
    t_fail "fio verify on n1 (qemu-nbd) through its restart failed after $passes pass(es)"
    sed 's/^/    | /' /tmp/fio.fail
elif [ "$passes" -ge 2 ]; then
    t_pass "fio randwrite + crc32c verify on n1 through a qemu-nbd restart: $passes passes of 8 MiB, no error"
else
    t_fail "fio on n1: $passes pass(es) completed, want 2 or more"
fi
rounds=$(cat /tmp/ext4.rounds 2>/dev/null || echo 0)
if [ -e /tmp/ext4.fail ]; then
    t_fail "ext4 write-and-checksum on n2 (nbdkit): $(cat /tmp/ext4.fail)"
elif [ "$rounds" -ge 2 ]; then
    t_pass "ext4 on n2 through a 10 s nbdkit pause: $rounds rounds of write 1 MiB, sync, drop caches, checksum match"
else
    t_fail "ext4 on n2: $rounds round(s) completed, want 2 or more"
fi
if [ "$n" = 3 ]; then
    passes=$(cat /tmp/rbd.passes 2>/dev/null || echo 0)
    if [ -e /tmp/rbd.fail ]; then
        t_fail "fio verify on n3 (rbd) through a 15 s pause of the cluster and losing an OSD failed after $passes pass(es)"
        sed 's/^/    | /' /tmp/rbd.fail
    elif [ "$passes" -ge 2 ]; then
        t_pass "fio randwrite + crc32c verify on n3 (rbd) through a 15 s pause of both OSDs and losing one for good: $passes passes of 8 MiB, no error"
    else
        t_fail "fio on n3: $passes pass(es) completed, want 2 or more"
    fi
    rmax=$(sort -n /tmp/rbd.max 2>/dev/null | tail -1)
    echo "longest fio I/O latency on n3: $((${rmax:-0} / 1000000)) ms"
    echo "@@VNVME-STALL-RBD ${rmax:-0}@@"
fi
if umount /mnt; then
    t_run "fsck.ext4 -fn on n2 after the outages" fsck.ext4 -fn "$D2"
else
    t_fail "umount n2"
fi
max=$(sort -n /tmp/lat.max 2>/dev/null | tail -1)
round=$(sort -n /tmp/round.max 2>/dev/null | tail -1)
echo "longest fio I/O latency on n1: $((${max:-0} / 1000000)) ms; longest ext4 round on n2: $((${round:-0} * 10)) ms"
echo "@@VNVME-STALL ${max:-0} ${round:-0}@@"

echo "== kernel messages (nvme)"
dmesg | grep -iE 'nvme|blk_update|I/O error|hung|reset|timeout' | tail -30
if dmesg | grep -qiE 'hung task|blocked for more than|timeout|resetting|I/O error|blk_update_request|Buffer I/O|EXT4-fs error|Remounting filesystem read-only'; then
    t_fail "guest kernel log: an I/O error, timeout, controller reset or ext4 error (see above)"
else
    t_pass "guest kernel log: no I/O error, no timeout, no controller reset, ext4 never read-only"
fi
echo "== outage suite: $T_FAILED failure(s)"
[ "$T_FAILED" -eq 0 ]
