# shellcheck shell=dash
# The boot after zns-alone.sh, on the same storage (the zns-qemu suite): the
# zones as that boot left them, and the zoned btrfs it made mounts with its file
# intact. On a controller that forgot its write pointers the zones read back
# empty, and btrfs finds its superblock log gone.
. /tests/lib.sh
. /tests/config.sh
echo "== guest-tests zns suite, after a restart ($DEVICE): Linux $(uname -r)"
probe_or_exit 1
D4=$D1
zone_conds "$D4" >/tmp/zw
n=0
while read -r cond wp; do
    if [ "$cond" = 14 ] || [ $((wp)) -gt 0 ]; then n=$((n + 1)); fi
done </tmp/zw
t_eq "after a restart: zones written to (full, or a write pointer past the start)" "$n" "$WRITTEN_ZONES"
if ! mount -t btrfs "$D4" /mnt >/tmp/o 2>&1; then
    t_fail "after a restart: mount the zoned btrfs: $(tail -2 /tmp/o)"
    dmesg | grep -i btrfs | tail -5
elif [ "$(sha256sum /mnt/f 2>/dev/null | cut -d' ' -f1)" = "$BTRFS_SUM" ]; then
    t_pass "after a restart: the zoned btrfs mounts and its 16 MiB file reads back"
    umount /mnt
else
    t_fail "after a restart: the zoned btrfs's file does not read back"
    umount /mnt
fi
if dmesg | grep -qiE 'I/O error|timeout|blk_update_request|Buffer I/O'; then
    t_fail "guest kernel log: I/O errors or timeouts"
    dmesg | grep -iE 'I/O error|nvme|btrfs' | tail -10
else
    t_pass "guest kernel log: no I/O errors or timeouts"
fi
[ "$T_FAILED" -eq 0 ]
