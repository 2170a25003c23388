# shellcheck shell=dash
# fio write + verify (crc32c) with mixed block sizes and queue depths 1, 16, 64
# (three concurrent jobs on separate regions), on the 512 B and 4 KiB namespaces.
# fio_verify NAME DEV BSSPLIT JOBS...: JOBS are "qd:offset:size". Every byte written
# is read back and checked (fio_verified).
fio_verify() {
    _name=$1 _dev=$2 _bss=$3
    shift 3
    _jobs=""
    for j in "$@"; do
        _qd=${j%%:*} _rest=${j#*:}
        _jobs="$_jobs --name=qd$_qd --iodepth=$_qd --offset=${_rest%%:*} --size=${_rest#*:}"
    done
    # shellcheck disable=SC2086
    fio_verified "$_name" --filename="$_dev" --ioengine="$ENGINE" --direct=1 --rw=randwrite \
        --bssplit="$_bss" --verify=crc32c --verify_fatal=1 --do_verify=1 --randrepeat=0 $_jobs
}
fio_verify "fio verify=crc32c n1 (512 B LBA) bs 512B-128K, QD 1/16/64" "$D1" \
    512/10:4k/30:8k/15:16k/15:64k/15:128k/15 1:0:2M 16:8M:4M 64:24M:4M
fio_verify "fio verify=crc32c n2 (4 KiB LBA) bs 4K-128K, QD 1/16/64" "$D2" \
    4k/40:16k/20:64k/20:128k/20 1:0:2M 16:4M:4M 64:16M:4M
# A mixed read/write verify on one job: writes verified as they complete.
fio_verified "fio verify_backlog (interleaved write + verify), 4k QD16" --filename="$D1" \
    --ioengine="$ENGINE" --direct=1 --rw=randwrite --bs=4k --iodepth=16 --offset=48M --size=4M \
    --verify=crc32c --verify_backlog=64 --verify_fatal=1 --name=backlog
# SMART counts the writes.
w=$(nvme smart-log /dev/nvme0 | field host_write_commands)
if [ "${w:-0}" -gt 1000 ] 2>/dev/null; then
    t_pass "smart-log host_write_commands after fio: $w"
else
    t_fail "smart-log host_write_commands after fio: '$w'"
fi
