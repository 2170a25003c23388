# shellcheck shell=dash
# The network storage suite (scripts/guest-tests.sh): every namespace is served
# by a real server over the network backends. n1 is qemu-nbd serving a qcow2
# image, n2 is nbdkit's memory plugin (both nbd+unix://), n3 (when the host has
# a Ceph cluster: N3_BYTES > 0) an RBD image. The guest runs fio write + verify at
# QD 1/16/64 on each, a flush, write zeroes and deallocate, then ext4 on n1 and
# n3; the host checks the images (qemu-img check, rbd export, e2fsck and the
# file's checksum) after the guest is gone.
. /tests/lib.sh
. /tests/config.sh
echo "== network storage suite: Linux $(uname -r)"
n=2
[ "$N3_BYTES" -gt 0 ] && n=3
probe_or_exit "$n"
fio_engine "$D1"
# bytes DEV: the size of block device DEV.
bytes() { echo $(($(cat "/sys/block/${1##*/}/size") * 512)); }
t_eq "n1 (qemu-nbd, qcow2) size in bytes" "$(bytes "$D1")" "$N1_BYTES"
t_eq "n2 (nbdkit memory) size in bytes" "$(bytes "$D2")" "$N2_BYTES"
[ "$n" = 3 ] && t_eq "n3 (rbd) size in bytes" "$(bytes "$D3")" "$N3_BYTES"

# fio_verify_net NAME DEV: three concurrent verify jobs, QD 1, 16 and 64, on
# separate regions, bs 512 B..128 KiB; every byte written is read back and checked.
fio_verify_net() {
    fio_verified "$1" --filename="$2" --ioengine="$ENGINE" --direct=1 --rw=randwrite \
        --bssplit=512/10:4k/40:16k/20:64k/15:128k/15 --verify=crc32c --verify_fatal=1 \
        --do_verify=1 --randrepeat=0 --name=qd1 --iodepth=1 --offset=0 --size=2M \
        --name=qd16 --iodepth=16 --offset=8M --size=4M --name=qd64 --iodepth=64 --offset=16M --size=4M
}
fio_verify_net "fio verify=crc32c on n1 (qemu-nbd, qcow2), QD 1/16/64" "$D1"
fio_verify_net "fio verify=crc32c on n2 (nbdkit memory), QD 1/16/64" "$D2"
[ "$n" = 3 ] && fio_verify_net "fio verify=crc32c on n3 (rbd), QD 1/16/64" "$D3"

# Flush reaches the server: nvme-cli's flush command returns success.
t_run "nvme flush n1 (NBD_CMD_FLUSH to qemu-nbd)" nvme flush "$D1" -n 1
[ "$n" = 3 ] && t_run "nvme flush n3 (rbd_aio_flush)" nvme flush "$D3" -n 3
# Write Zeroes (NBD_CMD_WRITE_ZEROES) reads back zeroes; Deallocate
# (NBD_CMD_TRIM) is accepted (TRIM promises nothing about what reads return).
i=0
for dev in "$D1" "$D2" ${D3:+"$D3"}; do
    i=$((i + 1))
    dd if=/dev/urandom of=/tmp/wz bs=65536 count=16 2>/dev/null
    if ! dd_write /tmp/wz "$dev" 65536 400 >/tmp/o 2>&1 || ! dd_read "$dev" 65536 400 16 /tmp/wz.back >>/tmp/o 2>&1 ||
        ! cmp -s /tmp/wz /tmp/wz.back; then
        t_fail "n$i: 1 MiB of random data before write-zeroes did not read back: $(cat /tmp/o)"
    elif nvme write-zeroes "$dev" -n "$i" -s $((400 * 128)) -c 2047 >/tmp/o 2>&1; then
        if dd_read "$dev" 65536 400 16 /tmp/wz.back >/tmp/o 2>&1; then
            z=$(tr -d '\0' </tmp/wz.back | wc -c)
            t_eq "n$i: nvme write-zeroes over 1 MiB of random data, non-zero bytes of 1048576 read back" "$z" 0
        else
            t_fail "n$i: read after nvme write-zeroes: $(cat /tmp/o)"
        fi
    else
        t_fail "n$i: nvme write-zeroes: $(cat /tmp/o)"
    fi
    t_run "n$i: blkdiscard 1 MiB (Deallocate)" blkdiscard -o $((400 * 65536)) -l $((16 * 65536)) "$dev"
done

# ext4_on NAME DEV: mkfs, a 4 MiB file, umount, fsck; prints @@VNVME-EXT4-NAME
# with the file's checksum for the host, which reads it out of the image.
ext4_on() {
    ext4_ok=0
    if mkfs.ext4 -q -F "$2" >/tmp/o 2>&1 && mount -t ext4 "$2" /mnt >>/tmp/o 2>&1; then
        mkdir -p /mnt/data
        dd if=/dev/urandom of=/mnt/data/random.bin bs=65536 count=64 2>/dev/null
        cp -r /tests /mnt/data/tests
        sum=$(sha256sum /mnt/data/random.bin | cut -d' ' -f1)
        sync
        umount /mnt && ext4_ok=1
    fi
    if [ $ext4_ok = 1 ]; then
        t_pass "mkfs.ext4 + mount + write 4 MiB + umount on $1"
        echo "@@VNVME-EXT4-$1 /data/random.bin $sum@@"
        t_run "fsck.ext4 -fn in the guest on $1" fsck.ext4 -fn "$2"
    else
        t_fail "mkfs.ext4 + mount on $1"
        cat /tmp/o
    fi
}
ext4_on n1 "$D1"
[ "$n" = 3 ] && ext4_on n3 "$D3"
echo "== network storage suite: $T_FAILED failure(s)"
[ "$T_FAILED" -eq 0 ]
