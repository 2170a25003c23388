# shellcheck shell=dash
# ext4 on the file-backed namespace n3: mkfs, write files, fsck. The host
# checks the same image after the guest is gone (e2fsck, debugfs) and compares
# the checksum printed on the @@VNVME-EXT4 line.
ext4_ok=0
if mkfs.ext4 -q -F "$D3" >/tmp/o 2>&1 && mount -t ext4 "$D3" /mnt >>/tmp/o 2>&1; then
    mkdir -p /mnt/data/small
    dd if=/dev/urandom of=/mnt/data/random.bin bs=65536 count=96 2>/dev/null
    i=0
    while [ $i -lt 200 ]; do
        echo "small file $i $(date)" >/mnt/data/small/f$i.txt
        i=$((i + 1))
    done
    cp -r /tests /mnt/data/tests
    EXT4_SUM=$(sha256sum /mnt/data/random.bin | cut -d' ' -f1)
    sync
    umount /mnt && ext4_ok=1
fi
if [ $ext4_ok = 1 ]; then
    t_pass "mkfs.ext4 + mount + write 6 MiB and 200 files + umount (n3, file-backed)"
    echo "@@VNVME-EXT4 /data/random.bin $EXT4_SUM@@"
    t_run "fsck.ext4 -fn in the guest" fsck.ext4 -fn "$D3"
else
    t_fail "mkfs.ext4 + mount on n3"
    cat /tmp/o
fi
