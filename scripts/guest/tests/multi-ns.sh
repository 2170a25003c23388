# shellcheck shell=dash
# Several namespaces: each block device has the size and block size the host gave.
for spec in "1 $N1_BYTES $N1_LBA" "2 $N2_BYTES $N2_LBA" "3 $N3_BYTES $N3_LBA"; do
    # shellcheck disable=SC2086 # split into NSID BYTES LBA
    set -- $spec
    dev=""
    eval "dev=\$D$1"
    got="$(blockdev --getsize64 "$dev") $(blockdev --getss "$dev")"
    t_eq "namespace NSID $1 ($dev) size and logical block size" "$got" "$2 $3"
done
# The namespaces are distinct: a block written to n1 does not show up on n2.
dd if=/dev/urandom of=/tmp/blk bs=4096 count=1 2>/dev/null
dd if=/tmp/blk of="$D1" bs=4096 seek=100 oflag=direct 2>/dev/null
dd if="$D2" of=/tmp/blk2 bs=4096 skip=100 count=1 iflag=direct 2>/dev/null
dd if="$D1" of=/tmp/blk1 bs=4096 skip=100 count=1 iflag=direct 2>/dev/null
if cmp -s /tmp/blk /tmp/blk1 && ! cmp -s /tmp/blk /tmp/blk2; then
    t_pass "namespaces n1 and n2 hold separate data"
else
    t_fail "namespaces n1 and n2 hold separate data"
fi
