# shellcheck shell=dash
# Unload and reload the nvme driver: full teardown (queues deleted, controller
# shut down) and a fresh probe of the same controller.
if rmmod nvme >/tmp/o 2>&1 && [ ! -e "$D1" ] && [ ! -e /dev/nvme0 ]; then
    t_pass "rmmod nvme: namespaces gone"
else
    t_fail "rmmod nvme"
    cat /tmp/o
fi
modprobe nvme >/tmp/o 2>&1 || cat /tmp/o
if ctrl_live nvme0 20 && wait_ns 4 20; then
    t_pass "modprobe nvme: nvme0 live, NSID 1/2/3/4 = $D1 $D2 $D3 $D4"
else
    t_fail "modprobe nvme: controller did not come back"
    dmesg | tail -20
fi
t_eq "after reload: NSID 2 logical block size (format survived)" "$(blockdev --getss "$D2" 2>/dev/null)" "$N2_LBA"
fio_verified "after reload: fio write + verify on n1" --filename="$D1" --ioengine="$ENGINE" --direct=1 --rw=randwrite --bs=4k --iodepth=16 --offset=56M --size=4M --verify=crc32c --verify_fatal=1 --name=r
