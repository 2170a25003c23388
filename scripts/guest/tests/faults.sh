# shellcheck shell=dash
# The faults suite (scripts/guest-tests.sh, one boot): the host injects backend
# failures (`--ns ...:fault=RULE`) and the guest sees the NVMe statuses, the logs
# and the SMART warning they must produce, and keeps working around them.
#   n1: ram, reads of LBAs 2048..2055 fail with a media error (EIO)
#       and its first three reads of LBAs 16384..16391 find the storage
#       unreachable (Namespace Not Ready)
#   n2: ram, writes to LBAs 4096..4103 fail with "no space" (ENOSPC)
. /tests/lib.sh
echo "== guest-tests faults suite: Linux $(uname -r)"
probe_or_exit 2
t_pass "controller probe: nvme0 live, NSID 1/2 = $D1 $D2"

# A read of a failing block: an I/O error for the reader, a medium error in dmesg.
if dd if="$D1" of=/dev/null bs=512 skip=2050 count=1 iflag=direct 2>/tmp/dd.err; then
    t_fail "read of an injected media error succeeded"
else
    t_pass "read of LBA 2050 fails: $(grep -v records /tmp/dd.err | head -1)"
fi
if dmesg | grep -qiE 'medium error|Unrecovered Read Error'; then
    t_pass "guest kernel: $(dmesg | grep -iE 'medium error|Unrecovered Read Error' | head -1 | sed 's/^\[[^]]*\] //')"
else
    t_fail "guest kernel logged no medium error for the failed read"
    dmesg | tail -20
fi
# Next to it, everything works.
t_run "reads outside the failing range succeed" dd if="$D1" of=/dev/null bs=4096 count=256 iflag=direct

# SMART / Health: reliability degraded (critical warning bit 2), media errors counted.
if nvme smart-log /dev/nvme0 >/tmp/smart 2>&1; then
    cw=$(field critical_warning </tmp/smart)
    me=$(field media_errors </tmp/smart)
    if [ $((cw & 4)) = 4 ] && [ "${me:-0}" -ge 1 ] 2>/dev/null; then
        t_pass "smart-log: critical_warning $cw (bit 2: reliability degraded), media_errors $me"
    else
        t_fail "smart-log: critical_warning $cw media_errors $me, want bit 2 set and >= 1"
        cat /tmp/smart
    fi
else
    t_fail "nvme smart-log"
fi

# Error Information log: the failed read, with its LBA and namespace.
if nvme error-log /dev/nvme0 -e 4 >/tmp/elog 2>&1; then
    if grep -qiE 'lba[[:space:]]*:[[:space:]]*(0x80[0-7]|205[0-5])' /tmp/elog &&
        grep -qiE 'nsid[[:space:]]*:[[:space:]]*(0x1|1)$' /tmp/elog; then
        t_pass "error-log: an entry for namespace 1 at the failing LBA ($(grep -iE 'status_field' /tmp/elog | head -1 | tr -s ' \t' ' '))"
    else
        t_fail "error-log: no entry for namespace 1 at LBA 2048..2055"
        head -40 /tmp/elog
    fi
else
    t_fail "nvme error-log"
fi

# A write the backend has no space for: Capacity Exceeded, ENOSPC for the writer.
dd if=/dev/urandom of=/tmp/blk bs=4096 count=1 2>/dev/null
if dd if=/tmp/blk of="$D2" bs=4096 seek=512 count=1 oflag=direct 2>/tmp/dd.err; then
    t_fail "write into an injected ENOSPC range succeeded"
else
    t_pass "write to LBA 4096 fails: $(grep -v records /tmp/dd.err | head -1)"
fi
if dmesg | grep -qiE 'space allocation error|Capacity Exceeded'; then
    t_pass "guest kernel: $(dmesg | grep -iE 'space allocation error|Capacity Exceeded' | head -1 | sed 's/^\[[^]]*\] //')"
else
    t_fail "guest kernel logged no space allocation error for the failed write"
    dmesg | tail -20
fi
t_run "writes outside the failing range succeed" dd if=/tmp/blk of="$D2" bs=4096 seek=0 count=1 oflag=direct

# Storage unreachable for three tries: Namespace Not Ready, with a Command Retry
# Delay. Linux enabled Advanced Command Retry (Host Behavior Support) because
# Identify Controller reports CRDT1 (1 s), so it waits that long before each retry
# and the read succeeds on the fourth try, about 3 s later, with no error. Without
# the delay its retries would come at once and the read would end within
# milliseconds (the host log checks that the guest enabled it).
errs0=$(dmesg | grep -ciE 'I/O error|Not Ready|blk_update_request')
t0=$(now_cs)
if dd if="$D1" of=/dev/null bs=512 skip=16384 count=1 iflag=direct 2>/tmp/dd.err; then
    dt=$(($(now_cs) - t0))
    if [ "$dt" -ge 270 ]; then
        t_pass "read through three Namespace Not Ready completions: succeeded after $((dt * 10)) ms (three 1 s retry delays)"
    else
        t_fail "read through three Namespace Not Ready completions took $((dt * 10)) ms: the guest did not wait the retry delay"
    fi
else
    t_fail "read through three Namespace Not Ready completions failed: $(grep -v records /tmp/dd.err | head -1)"
fi
errs1=$(dmesg | grep -ciE 'I/O error|Not Ready|blk_update_request')
if [ "$errs1" = "$errs0" ]; then
    t_pass "guest kernel logged nothing for the retried read"
else
    t_fail "guest kernel logged $((errs1 - errs0)) error line(s) for a read that succeeded on retry"
    dmesg | tail -10
fi

# The controller stays healthy: a short verified fio run away from the faults.
fio_engine "$D1"
fio_verified "fio verify after the failures (n1, 8 MiB from 4 MiB)" --name=after --filename="$D1" \
    --ioengine="$ENGINE" --direct=1 --rw=randwrite --bs=4k --iodepth=16 --offset=4M --size=8M \
    --verify=crc32c --do_verify=1 --verify_fatal=1
state=$(cat /sys/class/nvme/nvme0/state)
t_eq "controller state after the faults" "$state" live
echo "== faults suite: $T_FAILED failure(s)"
[ "$T_FAILED" -eq 0 ]
