# shellcheck shell=dash
# Namespaces changed under the running guest through the server's control socket
# (scripts/guest-tests.sh, live suite). The guest asks the host to run `vnvme ctl`
# with a "@@VNVME-CTL ARGS@@" line and then waits, bounded, for what the kernel
# should do on its own after the Namespace Attribute Changed event: a namespace
# appears, disappears, or changes size.
#
# The host serves n1 RAM 64 MiB, n2 RAM 32 MiB, n3 a 64 MiB file, with room for
# 8 namespaces.
. /tests/lib.sh
. /tests/config.sh
echo "== guest-tests live namespaces suite: Linux $(uname -r)"
probe_or_exit 3
t_pass "controller probe: nvme0 live, NSID 1/2/3 = $D1 $D2 $D3"
fio_engine "$D1"

ctl() { echo "@@VNVME-CTL $*@@"; }

# wait_nsid NSID SECS: until NSID has a block device (sets DEV).
wait_nsid() {
    _i=0
    while [ "$_i" -lt "$(($2 * 10))" ]; do
        DEV=$(ns_dev "$1") && [ -b "$DEV" ] && return 0
        usleep 100000
        _i=$((_i + 1))
    done
    return 1
}

# gone_nsid NSID SECS: until NSID has no block device.
gone_nsid() {
    _i=0
    while [ "$_i" -lt "$(($2 * 10))" ]; do
        ns_dev "$1" >/dev/null || return 0
        usleep 100000
        _i=$((_i + 1))
    done
    return 1
}

# wait_size DEV BYTES SECS: until DEV has BYTES.
wait_size() {
    _i=0
    while [ "$_i" -lt "$(($3 * 10))" ]; do
        [ "$(blockdev --getsize64 "$1" 2>/dev/null)" = "$2" ] && return 0
        usleep 100000
        _i=$((_i + 1))
    done
    return 1
}

# fio_verify DEV SIZE NAME: a write pass with crc32c verify over SIZE of DEV.
fio_verify() {
    fio --name="$3" --filename="$1" --ioengine="$ENGINE" --direct=1 --rw=randwrite --bs=4k \
        --iodepth=16 --size="$2" --verify=crc32c --do_verify=1 --verify_fatal=1 >"/tmp/$3.out" 2>&1
}

echo "== hot add while fio runs on n1"
rm -f /tmp/stop /tmp/bg.fail
(
    n=0
    while [ ! -e /tmp/stop ]; do
        fio_verify "$D1" 16M bg || { echo "pass $n" >/tmp/bg.fail; cat /tmp/bg.out >>/tmp/bg.fail; break; }
        n=$((n + 1))
    done
    echo "$n" >/tmp/bg.passes
) &
BG=$!
sleep 2
ctl ns.add ram:48M 4
if wait_nsid 4 30; then
    t_pass "hot-added NSID 4 appeared as $DEV while fio verify ran on n1"
    t_eq "NSID 4 size" "$(blockdev --getsize64 "$DEV")" $((48 << 20))
    t_run "fio verify on the hot-added namespace" fio_verify "$DEV" 24M hot
    D4=$DEV
else
    t_fail "hot-added NSID 4 did not appear within 30 s"
    dmesg | grep -i nvme | tail -10
    D4=""
fi
touch /tmp/stop
wait $BG
if [ -e /tmp/bg.fail ]; then
    t_fail "fio verify on n1 across the hot add"
    tail -20 /tmp/bg.fail | sed 's/^/    | /'
else
    t_pass "fio verify on n1 across the hot add: $(cat /tmp/bg.passes) passes, no error"
fi

echo "== remove an idle namespace"
ctl ns.remove 2
if gone_nsid 2 30; then t_pass "removed NSID 2 ($D2) disappeared"; else t_fail "NSID 2 still present 30 s after removal"; fi

echo "== remove a namespace with I/O in flight"
# Reads of blocks 1024..1031 take 4 s at the backend, so the read below is in
# flight when the namespace goes; the rest of the namespace answers at once.
ctl ns.add ram:16M:fault=read/delay=4000/lba=1024+8 5
if wait_nsid 5 30; then
    D5=$DEV
    dd if="$D5" of=/dev/null bs=4096 skip=128 count=1 iflag=direct >/tmp/dd5.out 2>&1 &
    DD=$!
    sleep 1
    # Removing a namespace the guest is using takes force (an idle one does not).
    ctl ns.remove 5 force
    _i=0
    while kill -0 "$DD" 2>/dev/null && [ "$_i" -lt 300 ]; do
        usleep 100000
        _i=$((_i + 1))
    done
    if kill -0 "$DD" 2>/dev/null; then
        t_fail "the read in flight on removed NSID 5 still hangs after 30 s"
        kill -9 "$DD" 2>/dev/null
    elif wait "$DD"; then
        t_fail "the read in flight on removed NSID 5 succeeded (want an error)"
    else
        t_pass "the read in flight on removed NSID 5 ended with an error: $(tail -1 /tmp/dd5.out)"
    fi
    if gone_nsid 5 30; then t_pass "removed NSID 5 disappeared"; else t_fail "NSID 5 still present"; fi
else
    t_fail "NSID 5 did not appear within 30 s"
fi

echo "== grow n3 under a mounted ext4"
if mkfs.ext4 -q -F "$D3" >/tmp/o 2>&1 && mount -t ext4 "$D3" /mnt >>/tmp/o 2>&1; then
    dd if=/dev/urandom of=/mnt/before.bin bs=65536 count=64 2>/dev/null
    sync
    SUM=$(sha256sum /mnt/before.bin | cut -d' ' -f1)
    BLOCKS0=$(df -k /mnt | awk 'NR == 2 { print $2 }')
    ctl ns.resize 3 128M
    if wait_size "$D3" $((128 << 20)) 30; then
        t_pass "grown NSID 3: blockdev --getsize64 $D3 = $((128 << 20))"
        if resize2fs "$D3" >/tmp/r 2>&1; then
            BLOCKS1=$(df -k /mnt | awk 'NR == 2 { print $2 }')
            if [ "$BLOCKS1" -gt $((BLOCKS0 + 50000)) ]; then
                t_pass "resize2fs grew the mounted ext4: $BLOCKS0 -> $BLOCKS1 KiB"
            else
                t_fail "resize2fs: ext4 is $BLOCKS1 KiB, was $BLOCKS0"
            fi
            dd if=/dev/urandom of=/mnt/after.bin bs=65536 count=512 2>/dev/null && sync
            t_eq "data written before the grow" "$(sha256sum /mnt/before.bin | cut -d' ' -f1)" "$SUM"
        else
            t_fail "resize2fs $D3"
            cat /tmp/r
        fi
    else
        t_fail "NSID 3 size after the grow: $(blockdev --getsize64 "$D3"), want $((128 << 20))"
    fi
    echo "== shrinking n3 below its data is refused"
    ctl ns.resize 3 64M
    sleep 3
    t_eq "NSID 3 size after a refused shrink" "$(blockdev --getsize64 "$D3")" $((128 << 20))
    umount /mnt && t_run "fsck.ext4 -fn after the grow" fsck.ext4 -fn "$D3"
else
    t_fail "mkfs.ext4 + mount on n3"
    cat /tmp/o
fi

if [ -n "$D4" ]; then
    echo "== forced shrink of n4"
    ctl ns.resize 4 16M force
    if wait_size "$D4" $((16 << 20)) 30; then t_pass "NSID 4 shrunk with force to 16 MiB"; else
        t_fail "NSID 4 size after a forced shrink: $(blockdev --getsize64 "$D4")"
    fi
fi

echo "== QoS on n1, set live"
# qos_run NAME BS: 10 s of fio randread at QD 32 on n1; sets GOT to the JSON field
# FIELD of the read side.
qos_run() {
    fio --name="$1" --filename="$D1" --ioengine="$ENGINE" --direct=1 --rw=randread --bs="$2" \
        --iodepth=32 --runtime=10 --time_based --size=48M --output-format=json >"/tmp/$1.json" 2>/tmp/$1.err
    GOT=$(fio_json_field "/tmp/$1.json" "$3")
}
# within GOT WANT: GOT within 10 % of WANT.
within() { awk -v g="$1" -v w="$2" 'BEGIN { exit !(g >= 0.9 * w && g <= 1.1 * w) }'; }
ctl qos.set 1 iops=2000
sleep 2
qos_run qos-iops 4k iops
# The host saves a Prometheus scrape now and checks it (promtool, counters).
echo "@@VNVME-SCRAPE qos-iops@@"
sleep 1
if within "$GOT" 2000; then t_pass "QoS iops=2000, fio QD 32: $GOT IOPS (within 10 %)"; else
    t_fail "QoS iops=2000, fio QD 32: $GOT IOPS, want 2000 +- 10 %"
fi
ctl qos.set 1 bps=20000000
sleep 2
qos_run qos-bps 64k bw_bytes
if within "$GOT" 20000000; then t_pass "QoS bps=20 MB/s, fio QD 32 bs 64k: $GOT B/s (within 10 %)"; else
    t_fail "QoS bps=20 MB/s, fio QD 32 bs 64k: $GOT B/s, want 20000000 +- 10 %"
fi
ctl qos.set 1 clear=true
sleep 2
qos_run qos-none 4k iops
echo "info: QoS cleared: fio QD 32 4k randread $GOT IOPS (not checked: a speed)"

echo "== hot-plug a second vfio-user device through QEMU's monitor"
# The host prepared device_add (vfio-user-pci on the empty root port rp1, a second
# vnvme serve with one 32 MiB namespace) and device_del.
echo "@@VNVME-QMP hotplug@@"
HOT=""
_i=0
while [ "$_i" -lt 300 ]; do
    for c in /sys/class/nvme/nvme*; do
        [ "$(cat "$c/serial" 2>/dev/null | tr -d ' ')" = VNVMEGT0005 ] && HOT=${c##*/}
    done
    [ -n "$HOT" ] && [ -b "/dev/${HOT}n1" ] && break
    usleep 100000
    _i=$((_i + 1))
done
if [ -n "$HOT" ] && [ -b "/dev/${HOT}n1" ] && ctrl_live "$HOT" 15; then
    t_pass "hot-plugged controller $HOT (serial VNVMEGT0005) is live with /dev/${HOT}n1"
    t_eq "hot-plugged namespace size" "$(blockdev --getsize64 "/dev/${HOT}n1")" $((32 << 20))
    t_run "fio verify on the hot-plugged device" fio_verify "/dev/${HOT}n1" 16M hotplug
    # No device_del: QEMU 11.1 aborts in memory_region_del_subregion when a
    # vfio-user-pci device is unplugged (its own assertion; the server sees the
    # guest shut the controller down and the client leave cleanly).
else
    t_fail "no hot-plugged controller within 30 s of device_add"
    dmesg | grep -iE 'nvme|pci|hp' | tail -15
fi

echo "== kernel messages (nvme)"
dmesg | grep -iE 'nvme|blk_update|I/O error|hung' | tail -30
if dmesg | grep -qiE 'hung task|blocked for more than|timeout'; then
    t_fail "guest kernel log: hung tasks or timeouts (see above)"
else
    t_pass "guest kernel log: no hung task or timeout"
fi
echo "== live namespaces suite: $T_FAILED failure(s)"
[ "$T_FAILED" -eq 0 ]
