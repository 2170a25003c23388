# shellcheck shell=dash
# Format NVM: n2 from 4 KiB to 512 B LBAs and back. The kernel rescans the
# namespace after a format, so the block device follows.
# fmt LBAF BYTES
fmt() {
    if ! nvme format "$D2" --lbaf="$1" --force >/tmp/fmt 2>&1; then
        t_fail "nvme format n2 --lbaf=$1"
        cat /tmp/fmt
        return
    fi
    sleep 1
    case $2 in 512) ds=9 ;; 4096) ds=12 ;; esac
    nvme id-ns "$D2" >/tmp/idns 2>&1
    got=$(grep '(in use)' /tmp/idns | sed -n 's/^lbaf *\([0-9]*\) .*lbads:\([0-9]*\).*/\1 \2/p')
    t_eq "nvme format n2 --lbaf=$1: id-ns in-use format" "$got" "$1 $ds"
    t_eq "after format: n2 nsze" "$(field nsze </tmp/idns)" "$(printf '0x%x' $((N2_BYTES / $2)))"
    t_eq "after format: NSID 2 ($D2) logical block size" "$(blockdev --getss "$D2")" "$2"
    fio_verified "after format: $2 B writes verify on n2" --filename="$D2" --ioengine="$ENGINE" \
        --direct=1 --rw=randwrite --bs="$2" --iodepth=8 --size=1M --verify=crc32c --verify_fatal=1 --name=f
}
fmt 0 512
fmt 1 4096
