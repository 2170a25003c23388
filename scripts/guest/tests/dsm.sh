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
