# shellcheck shell=dash
# The main guest suite (scripts/guest-tests.sh, one boot per kernel). The host
# serves one controller with six namespaces (see config.sh, written by the
# host): n1 RAM with 512 B LBAs, n2 RAM with 4 KiB LBAs, n3 file-backed, n4 a
# zoned namespace on a file, n5 a file with type 1 protection information, n6 a
# file with type 1 protection information in the 64-bit guard format, all in an
# endurance group with flexible data placement (4 reclaim unit handles),
# and runs the server with --poll off so the doorbell counters reflect EventIdx.
. /tests/lib.sh
. /tests/config.sh
echo "== guest-tests main suite: Linux $(uname -r)"
probe_or_exit 6
t_pass "controller probe: nvme0 live, NSID 1/2/3/4/5/6 = $D1 $D2 $D3 $D4 $D5 $D6"
PI_DEV=$D5
PI64_DEV=$D6
FDP_DEV=$D1
fio_engine "$D1"
for t in nvme-cli multi-ns dsm fio-verify format ext4 zns pi pi64 fdp reset reload doorbells; do
    echo "== $t"
    # shellcheck disable=SC1090
    . "/tests/$t.sh"
done
echo "== kernel messages (nvme)"
dmesg | grep -iE 'nvme|blk_update|I/O error' | tail -30
# The errors pi.sh and pi64.sh caused on purpose (their bad blocks, on n5 and n6)
# are their own checks.
if dmesg | grep -v "${PI_DEV#/dev/}[:, ]" | grep -v "${PI64_DEV#/dev/}[:, ]" | grep -qiE 'I/O error|timeout|blk_update_request|Buffer I/O'; then
    t_fail "guest kernel log: I/O errors or timeouts (see above)"
else
    t_pass "guest kernel log: no I/O errors or timeouts"
fi
echo "== main suite: $T_FAILED failure(s)"
[ "$T_FAILED" -eq 0 ]
