# shellcheck shell=dash
# Dataset Management (deallocate), through nvme-cli and through the block
# layer (blkdiscard). The namespace reports DLFEAT: deallocated blocks read 0.
dlfeat=$(nvme id-ns "$D1" | field dlfeat)
dd if=/dev/urandom of=/tmp/pat bs=4096 count=1 2>/dev/null
dd if=/dev/zero of=/tmp/zero bs=4096 count=1 2>/dev/null
ok=1
nvme write "$D1" --start-block=2048 --block-count=7 --data-size=4096 --data=/tmp/pat >/tmp/o 2>&1 || ok=0
nvme read "$D1" --start-block=2048 --block-count=7 --data-size=4096 --data=/tmp/rd >>/tmp/o 2>&1 || ok=0
if [ $ok = 1 ] && cmp -s /tmp/pat /tmp/rd; then
    t_pass "nvme write + nvme read: 8 blocks round trip"
else
    t_fail "nvme write + nvme read: 8 blocks round trip"
    cat /tmp/o
fi
if nvme dsm "$D1" --namespace-id=1 --ad --slbs=2048 --blocks=8 >/tmp/o 2>&1; then
    t_pass "nvme dsm --ad (deallocate 8 blocks)"
    nvme read "$D1" --start-block=2048 --block-count=7 --data-size=4096 --data=/tmp/rd >/dev/null 2>&1
    if [ $((dlfeat & 7)) = 1 ]; then
        if cmp -s /tmp/zero /tmp/rd; then
            t_pass "deallocated blocks read as zeroes (dlfeat $dlfeat)"
        else
            t_fail "deallocated blocks read as zeroes (dlfeat $dlfeat)"
        fi
    else
        t_skip "deallocated read-back: dlfeat $dlfeat does not promise zeroes"
    fi
else
    t_fail "nvme dsm --ad"
    cat /tmp/o
fi
# Kernel discard path: 1 MiB written with direct I/O, discarded, read back.
dd if=/dev/urandom of=/tmp/mib bs=65536 count=16 2>/dev/null
dd if=/dev/zero of=/tmp/zmib bs=65536 count=16 2>/dev/null
disc=$(cat "/sys/block/${D1#/dev/}/queue/discard_max_bytes")
if ! { dd_write /tmp/mib "$D1" 65536 64 && dd_read "$D1" 65536 64 16 /tmp/rmib; } >/tmp/o 2>&1 ||
    ! cmp -s /tmp/mib /tmp/rmib; then
    t_fail "1 MiB of random data to discard did not read back: $(cat /tmp/o)"
elif [ "${disc:-0}" -gt 0 ] && blkdiscard -o 4194304 -l 1048576 "$D1" >/tmp/o 2>&1; then
    if ! dd_read "$D1" 65536 64 16 /tmp/rmib >/tmp/o 2>&1; then
        t_fail "blkdiscard 1 MiB: read back: $(cat /tmp/o)"
    elif cmp -s /tmp/zmib /tmp/rmib; then
        t_pass "blkdiscard 1 MiB: reads back zeroes"
    else
        t_fail "blkdiscard 1 MiB: reads back zeroes"
    fi
else
    t_fail "blkdiscard (discard_max_bytes $disc)"
    cat /tmp/o
fi
# Copy (NVM Copy, descriptor format 0h) through nvme-cli: Identify says so (ONCS
# bit 8, OCFS bit 0, MSSRL/MCL/MSRC), and two ranges of 4 blocks, second half first,
# land one after another at SDLBA (--blocks is the 0's based NLB field).
oncs=$(nvme id-ctrl "$D1" | field oncs)
nvme id-ns "$D1" >/tmp/idns 2>&1
mssrl=$(field mssrl </tmp/idns) mcl=$(field mcl </tmp/idns) msrc=$(field msrc </tmp/idns)
if [ $(((oncs >> 8) & 1)) = 1 ] && [ "${mssrl:-0}" -gt 0 ] && [ "${mcl:-0}" -gt 0 ]; then
    t_pass "id-ctrl oncs $oncs: Copy (bit 8); id-ns mssrl $mssrl, mcl $mcl, msrc $msrc"
else
    t_fail "Copy not advertised: oncs ${oncs:-?}, mssrl ${mssrl:-?}, mcl ${mcl:-?}, msrc ${msrc:-?}"
fi
{ dd if=/tmp/pat bs=2048 skip=1 count=1 && dd if=/tmp/pat bs=2048 count=1; } >/tmp/want 2>/dev/null
# copy_two DEV WHAT: /tmp/pat written at LBA 6144 of DEV, then copied second half
# first to SDLBA 8192, reads back as /tmp/want.
copy_two() {
    local ok=1
    nvme write "$1" --start-block=6144 --block-count=7 --data-size=4096 --data=/tmp/pat >/tmp/o 2>&1 || ok=0
    nvme copy "$1" --sdlba=8192 --slbs=6148,6144 --blocks=3,3 >>/tmp/o 2>&1 || ok=0
    nvme read "$1" --start-block=8192 --block-count=7 --data-size=4096 --data=/tmp/rd >>/tmp/o 2>&1 || ok=0
    if [ $ok = 1 ] && cmp -s /tmp/want /tmp/rd; then
        t_pass "nvme copy$2: two ranges of 4 blocks land in order at SDLBA 8192"
    else
        t_fail "nvme copy$2: two ranges of 4 blocks land in order at SDLBA 8192"
        cat /tmp/o
    fi
}
copy_two "$D1" ""
# On the file-backed namespace the controller copies inside the image file
# (copy_file_range) instead of reading and writing.
copy_two "$D3" " on the file namespace (inside the file)"
# One range past MSSRL: Command Size Limit Exceeded, nothing written.
if nvme copy "$D1" --sdlba=8192 --slbs=0 --blocks="${mssrl:-1}" >/tmp/o 2>&1; then
    t_fail "nvme copy of MSSRL + 1 blocks was accepted"
elif grep -qi 'size limit\|0x183\|0x4183' /tmp/o; then
    t_pass "nvme copy of MSSRL + 1 blocks: $(grep -io 'command size limit[^(]*' /tmp/o | head -1)"
else
    t_fail "nvme copy of MSSRL + 1 blocks failed otherwise: $(cat /tmp/o)"
fi
