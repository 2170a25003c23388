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
if ! { dd_write /tmp/blk "$D1" 4096 100 && dd_read "$D2" 4096 100 1 /tmp/blk2 &&
    dd_read "$D1" 4096 100 1 /tmp/blk1; } >/tmp/o 2>&1; then
    t_fail "namespaces n1 and n2 hold separate data: $(cat /tmp/o)"
elif cmp -s /tmp/blk /tmp/blk1 && ! cmp -s /tmp/blk /tmp/blk2; then
    t_pass "namespaces n1 and n2 hold separate data: the block written to n1 reads back from n1, not from n2"
else
    t_fail "namespaces n1 and n2 hold separate data"
fi
