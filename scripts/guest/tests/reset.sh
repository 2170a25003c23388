# shellcheck shell=dash
# Controller reset from the guest (CC.EN 1 -> 0 -> 1, queues and the doorbell
# buffer re-created), then I/O and the ext4 data again.
echo 1 >/sys/class/nvme/nvme0/reset_controller
if ctrl_live nvme0 20; then
    t_pass "reset_controller: nvme0 live again"
else
    t_fail "reset_controller: nvme0 not live"
fi
fio_verified "after reset: fio write + verify on n1" --filename="$D1" --ioengine="$ENGINE" --direct=1 --rw=randwrite --bs=4k --iodepth=16 --offset=56M --size=4M --verify=crc32c --verify_fatal=1 --name=r
if [ -n "${EXT4_SUM:-}" ] && mount -t ext4 -o ro "$D3" /mnt 2>/dev/null; then
    t_eq "after reset: ext4 file checksum" "$(sha256sum /mnt/data/random.bin | cut -d' ' -f1)" "$EXT4_SUM"
    umount /mnt
else
    t_fail "after reset: mount ext4 on n3"
fi
