# shellcheck shell=dash
# Native NVMe multipath over two controllers of one NVM subsystem: two `vnvme
# serve` processes (--cntlid 1 and 2, the same --serial and the same image file),
# each a vfio-user-pci device of this guest. Linux joins them into one subsystem
# and one namespace head with two paths. Checked: the subsystem and its
# controllers' IDs, CMIC and NMIC as nvme-cli reads them, fio verify through the
# head with each I/O policy, data written through one path read through the
# other, ANA taking a path out of service and back, and the host killing the
# second controller's serving process under fio verify (@@VNVME-HOST mp-crash@@:
# its keeper starts another, the guest resets the controller): no I/O error, and
# both paths carry I/O again. With MP_KILL=1 (the multipath-kill suite, no
# keeper), the process killed for good (@@VNVME-HOST mp-kill@@).
. /tests/lib.sh
. /tests/config.sh
echo "== guest-tests multipath suite: Linux $(uname -r)"
if ! ctrl_live nvme0 20 || ! ctrl_live nvme1 20; then
    t_fail "two controllers: nvme0 and nvme1 did not both come up"
    dmesg | grep -i nvme | tail -20
    exit 1
fi
# The namespace head: nvme<subsystem>n1; its paths nvme<subsystem>c<ctrl>n1 have
# no device node of their own.
head=""
i=0
while [ $i -lt 100 ] && [ -z "$head" ]; do
    for b in /sys/block/nvme*n1; do
        case ${b##*/} in *c*) ;; nvme*) [ -b "/dev/${b##*/}" ] && head=/dev/${b##*/} ;; esac
    done
    [ -n "$head" ] || usleep 100000
    i=$((i + 1))
done
if [ -z "$head" ]; then
    t_fail "no namespace head appeared ($(ls /sys/block | tr '\n' ' '))"
    exit 1
fi
subsys=$(ls -d /sys/class/nvme-subsystem/nvme-subsys* | head -1)
t_eq "one subsystem, both controllers in it ($subsys)" \
    "$(ls -d /sys/class/nvme-subsystem/nvme-subsys* | wc -l) $(ls "$subsys" | grep -c '^nvme[0-9]*$')" "1 2"
t_eq "controller IDs" "$(cat /sys/class/nvme/nvme*/cntlid | sort -n | tr '\n' ' ')" "${CNTLIDS:-1 2 }"
t_eq "one namespace head ($head) over two path devices" "$(ls /sys/block | grep -c 'c[0-9]*n1$')" 2
nvme list-subsys >/tmp/ls 2>&1
t_eq "nvme list-subsys: two live paths" "$(grep -c ' live' /tmp/ls)" 2
nvme id-ctrl /dev/nvme1 >/tmp/idc 2>&1
nvme id-ns "$head" >/tmp/idn 2>&1
t_eq "nvme id-ctrl cmic (several controllers, ANA reporting), id-ns nmic (shared), anagrpid" \
    "$(field cmic </tmp/idc) $(field nmic </tmp/idn) $(field anagrpid </tmp/idn)" "0xa 0x1 1"
t_eq "namespace size through the head" "$(blockdev --getsize64 "$head" 2>&1)" "$N1_BYTES"
fio_engine "$head"
fio_verified "fio randwrite QD 16 + crc32c verify through the head (iopolicy $(cat "$subsys/iopolicy"))" \
    --filename="$head" --ioengine="$ENGINE" --direct=1 --rw=randwrite --bs=4k --iodepth=16 --size=16M \
    --verify=crc32c --verify_fatal=1 --name=mp
echo round-robin >"$subsys/iopolicy"
fio_verified "fio randwrite QD 16 + crc32c verify through the head (iopolicy round-robin)" \
    --filename="$head" --ioengine="$ENGINE" --direct=1 --rw=randwrite --bs=4k --iodepth=16 --offset=16M \
    --size=16M --verify=crc32c --verify_fatal=1 --name=mprr
# One block through each controller: I/O passthrough on its own character
# device, which goes to that controller only. What one wrote, the other reads.
dd if=/dev/urandom of=/tmp/blk bs=4096 count=1 2>/dev/null
# Controller "1" and "2": the lower CNTLID and the higher.
c1=/dev/nvme0 c2=/dev/nvme1
first=$(cat /sys/class/nvme/nvme*/cntlid | sort -n | head -1)
for c in /sys/class/nvme/nvme*; do
    if [ "$(cat "$c/cntlid")" = "$first" ]; then c1=/dev/${c##*/}; else c2=/dev/${c##*/}; fi
done
if nvme io-passthru "$c1" --namespace-id=1 --opcode=0x01 --data-len=4096 --input-file=/tmp/blk \
    --cdw10=40000 --cdw12=7 --write >/tmp/o 2>&1 &&
    nvme io-passthru "$c2" --namespace-id=1 --opcode=0x02 --data-len=4096 --cdw10=40000 --cdw12=7 \
        --read --raw-binary >/tmp/blk.back 2>>/tmp/o &&
    cmp -s /tmp/blk /tmp/blk.back; then
    t_pass "written through controller 1 ($c1), read back through controller 2 ($c2)"
else
    t_fail "write through $c1, read through $c2: $(head -3 /tmp/o | tr '\n' ' ')"
fi
# Reservations between two hosts: each controller's host names itself (Host
# Identifier 0xa1.. through controller 1, 0xb2.. through controller 2), and
# nvme-cli's resv-* commands go down each controller's char device.
printf '\241\241\241\241\241\241\241\241' >/tmp/hid1
printf '\262\262\262\262\262\262\262\262' >/tmp/hid2
resv_ok() { "$@" >/tmp/o 2>&1 || { echo "  $*: $(head -2 /tmp/o | tr '\n' ' ')"; return 1; }; }
# io_status CTRL OPCODE: a one-block write (01h) or read (02h) through CTRL; its output.
io_status() {
    if [ "$2" = 1 ]; then
        nvme io-passthru "$1" --namespace-id=1 --opcode=0x01 --data-len=512 --input-file=/tmp/blk \
            --cdw10=40000 --cdw12=0 --write 2>&1
    else
        nvme io-passthru "$1" --namespace-id=1 --opcode=0x02 --data-len=512 --cdw10=40000 --cdw12=0 \
            --read --raw-binary 2>&1 >/dev/null
    fi
}
conflict() { io_status "$1" "$2" | grep -qi 'conflict'; }
if resv_ok nvme set-feature "$c1" -f 0x81 -l 8 -d /tmp/hid1 && resv_ok nvme set-feature "$c2" -f 0x81 -l 8 -d /tmp/hid2 &&
    resv_ok nvme resv-register "$c1" -n 1 --nrkey=0xaaaa --rrega=0 &&
    resv_ok nvme resv-register "$c2" -n 1 --nrkey=0xbbbb --rrega=0 &&
    resv_ok nvme resv-acquire "$c1" -n 1 --crkey=0xaaaa --rtype=1 --racqa=0; then
    t_pass "nvme resv-register through both controllers, resv-acquire Write Exclusive through controller 1"
else
    t_fail "reservation set-up failed"
fi
if conflict "$c2" 1 && ! conflict "$c2" 2 && ! conflict "$c1" 1; then
    t_pass "Write Exclusive held by host 1: host 2's write gets Reservation Conflict, its read and host 1's write go"
else
    t_fail "under Write Exclusive: host 2 write: $(io_status "$c2" 1 | head -1); read: $(io_status "$c2" 2 | head -1); host 1 write: $(io_status "$c1" 1 | head -1)"
fi
nvme resv-report "$c2" -n 1 2>&1 | head -20
nvme resv-report "$c2" -n 1 -d 255 -b >/tmp/rep 2>/tmp/rep.err || echo "resv-report: $(head -3 /tmp/rep.err)"
t_eq "nvme resv-report through controller 2: type, registered controllers, the holder's CNTLID" \
    "$(od -An -tu1 -j4 -N1 /tmp/rep | tr -d ' ') $(od -An -tu2 -j5 -N2 /tmp/rep | tr -d ' ') \
$(od -An -tu1 -j24 -N3 /tmp/rep | awk '{ print $1 + 256 * $2, $3 }')" "1 2 1 1"
# Host 2 preempts and aborts host 1: Exclusive Access is host 2's, host 1 may not
# even read, and host 1's controller has a notification for it.
if resv_ok nvme resv-acquire "$c2" -n 1 --crkey=0xbbbb --prkey=0xaaaa --rtype=2 --racqa=2 &&
    conflict "$c1" 2 && ! conflict "$c2" 1; then
    t_pass "host 2 preempts and aborts host 1 (Exclusive Access): host 1's read conflicts, host 2 writes"
else
    t_fail "preempt and abort: host 1 read: $(io_status "$c1" 2 | head -1); host 2 write: $(io_status "$c2" 1 | head -1)"
fi
i=0
kind=""
while [ $i -lt 20 ] && [ "${kind:-0}" = 0 ]; do
    nvme get-log "$c1" -i 0x80 -l 64 -b >/tmp/nlog 2>/dev/null
    kind=$(od -An -tu1 -j8 -N1 /tmp/nlog | tr -d ' ')
    [ "${kind:-0}" = 0 ] && usleep 100000
    i=$((i + 1))
done
t_eq "controller 1's reservation notification log: registration preempted, namespace 1" \
    "$kind $(od -An -tu4 -j12 -N4 /tmp/nlog | tr -d ' ')" "1 1"
if resv_ok nvme resv-release "$c2" -n 1 --crkey=0xbbbb --rtype=2 --rrela=1 && ! conflict "$c1" 1; then
    t_pass "nvme resv-release --rrela=1 (clear) through controller 2: host 1 writes again"
else
    t_fail "clear: host 1 write: $(io_status "$c1" 1 | head -1)"
fi
# Namespace Management and Attachment in the subsystem's pool (--pool, 64 MiB):
# the guest makes a shared namespace through controller 1 and attaches it to both
# controllers; Linux finds it on each by the notice each controller raises (a
# second head, two paths), I/O goes through it, then it is detached from
# controller 2 and deleted; the operator does the same from the host through
# controller 2 (vnvme ctl). Capacity follows in TNVMCAP/UNVMCAP.
# paths_of NSID: how many path devices namespace NSID has.
paths_of() { ls /sys/block | grep -c "c[0-9]*n$1\$"; }
# paths_wait NSID N: namespace NSID has N path devices within 20 s.
paths_wait() {
    _i=0
    while [ $_i -lt 200 ]; do
        [ "$(paths_of "$1")" = "$2" ] && return 0
        usleep 100000
        _i=$((_i + 1))
    done
    return 1
}
capacity() { nvme id-ctrl "$c1" 2>/dev/null | tr -d ',' | awk -F: '$1 ~ /^(tnvmcap|unvmcap)/ { gsub(/ /, "", $2); printf "%s ", $2 }'; }
nvme id-ctrl "$c1" >/tmp/idc 2>&1
if [ $(( $(field oacs </tmp/idc) & 8 )) -eq 0 ]; then
    t_skip "namespace management: OACS bit 3 clear (oacs $(field oacs </tmp/idc))"
else
    t_eq "id-ctrl: OACS Namespace Management, TNVMCAP and UNVMCAP the pool's 64 MiB" "$(capacity)" "67108864 67108864 "
    nvme create-ns "$c1" --nsze=16384 --ncap=16384 --flbas=0 --nmic=1 >/tmp/o 2>&1
    t_eq "nvme create-ns through controller 1 (8 MiB, shared): NSID 2" "$(grep -o 'nsid:[0-9]*' /tmp/o)" "nsid:2"
    t_eq "UNVMCAP down by 8 MiB" "$(capacity)" "67108864 58720256 "
    t_eq "nvme list-ns --all: NSIDs 1 and 2 allocated; only 1 active" \
        "$(nvme list-ns "$c1" --all 2>&1 | grep -c ':0x[12]$') $(nvme list-ns "$c1" 2>&1 | grep -c ':0x[12]$')" "2 1"
    nvme attach-ns "$c1" --namespace-id=2 --controllers=1,2 >/tmp/o 2>&1 || cat /tmp/o
    if paths_wait 2 2; then
        t_pass "nvme attach-ns 2 to controllers 1,2: Linux finds it through both (two paths)"
    else
        t_fail "after attach-ns: $(paths_of 2) paths of NSID 2 ($(ls /sys/block | tr '\n' ' '); $(head -2 /tmp/o))"
    fi
    h2=${head%n1}n2
    t_eq "nvme list-ctrl of namespace 2: both controllers" \
        "$(nvme list-ctrl "$c1" --namespace-id=2 2>&1 | grep -c '^\[ *[0-9]*\]:0x[12]$')" 2
    t_eq "id-ns of the new head: 16384 blocks, shared" "$(nvme id-ns "$h2" 2>&1 | field nsze) $(nvme id-ns "$h2" 2>&1 | field nmic)" "0x4000 0x1"
    fio_verified "fio randwrite + verify through the new namespace's head" \
        --filename="$h2" --ioengine="$ENGINE" --direct=1 --rw=randwrite --bs=4k --iodepth=8 --size=8M \
        --verify=crc32c --verify_fatal=1 --name=nsm
    # Format NVM through the head (one path carries it): 4 KiB blocks, data kept.
    # It is the namespace's format on both controllers: the head and both paths
    # come to 4 KiB blocks (the other controller's from its notice).
    nvme format "$h2" --lbaf=1 --force >/tmp/o 2>&1 || cat /tmp/o
    lbs2() { cat /sys/block/${h2#/dev/}/queue/logical_block_size /sys/block/nvme*c*n2/queue/logical_block_size 2>&1 | tr '\n' ' '; }
    _i=0
    while [ "$(lbs2)" != "4096 4096 4096 " ] && [ $_i -lt 200 ]; do
        usleep 100000
        _i=$((_i + 1))
    done
    t_eq "nvme format of NSID 2 to 4 KiB blocks through one path: the head's and both paths' block size" \
        "$(lbs2)" "4096 4096 4096 "
    fio_verified "fio randwrite + verify through the head in its new format" \
        --filename="$h2" --ioengine="$ENGINE" --direct=1 --rw=randwrite --bs=4k --iodepth=8 --size=8M \
        --verify=crc32c --verify_fatal=1 --name=nsm4k
    nvme detach-ns "$c1" --namespace-id=2 --controllers=2 >/tmp/o 2>&1 || cat /tmp/o
    if paths_wait 2 1; then
        t_pass "nvme detach-ns 2 from controller 2: one path left"
    else
        t_fail "after detach-ns: $(paths_of 2) paths of NSID 2"
    fi
    nvme create-ns "$c1" --nsze=200000 --ncap=200000 --flbas=0 --nmic=1 >/tmp/o 2>&1
    t_eq "create-ns beyond the capacity left: Namespace Insufficient Capacity" "$(grep -ci 'insufficient capacity' /tmp/o)" 1
    nvme create-ns "$c1" --nsze=16 --ncap=8 --flbas=0 >/tmp/o 2>&1
    t_eq "create-ns with NCAP below NSZE: Thin Provisioning Not Supported" "$(grep -ci 'thin provisioning' /tmp/o)" 1
    nvme delete-ns "$c1" --namespace-id=2 >/tmp/o 2>&1 || cat /tmp/o
    if paths_wait 2 0; then
        t_pass "nvme delete-ns 2: gone from the guest"
    else
        t_fail "after delete-ns: $(paths_of 2) paths of NSID 2"
    fi
    t_eq "UNVMCAP back to 64 MiB" "$(capacity)" "67108864 67108864 "
    if [ "${DEVICE:-vnvme}" = vnvme ]; then
        # The operator, through controller 2's control socket: ns.create 4M and
        # ns.attach to both. Linux hears of it from each controller's notice.
        echo "@@VNVME-HOST ns-create@@"
        if paths_wait 2 2; then
            t_pass "vnvme ctl ns.create + ns.attach 1,2 on the host: the guest finds it through both paths"
        else
            t_fail "after the host's ns.create/attach: $(paths_of 2) paths of NSID 2"
        fi
        t_eq "its size through the head" "$(blockdev --getsize64 "${head%n1}n2" 2>&1)" 4194304
        echo "@@VNVME-HOST ns-delete@@"
        if paths_wait 2 0; then
            t_pass "vnvme ctl ns.delete on the host: gone from the guest"
        else
            t_fail "after the host's ns.delete: $(paths_of 2) paths of NSID 2"
        fi
    fi
fi
# The path device of controller 2 (nvme<subsystem>c<controller>n1), whose
# ana_state and I/O counters sysfs shows.
p2=$(ls -d /sys/block/nvme*c"${c2#/dev/nvme}"n1 2>/dev/null | head -1)
p1=$(ls -d /sys/block/nvme*c"${c1#/dev/nvme}"n1 2>/dev/null | head -1)
# ana_wait PATH STATE: PATH's ana_state becomes STATE within 20 s.
ana_wait() {
    _i=0
    while [ $_i -lt 200 ]; do
        [ "$(cat "$1/ana_state" 2>/dev/null)" = "$2" ] && return 0
        usleep 100000
        _i=$((_i + 1))
    done
    return 1
}
# writes_of PATH: the writes completed through one path (sysfs stat, field 5).
writes_of() { awk '{ print $5 }' "$1/stat" 2>/dev/null; }
# round_robin LABEL OFFSET NAME: fio randwrite QD 16 + verify of 16 MiB at OFFSET
# through the head; controller 2's path must carry more than 100 of the writes.
round_robin() {
    rr_before=$(writes_of "$p2")
    fio_verified "$1: fio randwrite QD 16 + verify through the head (round-robin)" \
        --filename="$head" --ioengine="$ENGINE" --direct=1 --rw=randwrite --bs=4k --iodepth=16 --offset="$2" \
        --size=16M --verify=crc32c --verify_fatal=1 --name="$3"
    rr_n=$(($(writes_of "$p2") - rr_before))
    if [ "$rr_n" -gt 100 ]; then
        t_pass "$1: round-robin writes through controller 2 ($rr_n)"
    else
        t_fail "$1: $rr_n writes through controller 2 (want > 100)"
    fi
}
if [ "${MP_KILL:-0}" = 1 ]; then
    :
elif [ "${DEVICE:-vnvme}" != vnvme ]; then
    # Another device (the multipath-qemu comparison): what a host reads of ANA;
    # the host side changes vnvme's states only.
    t_eq "ANA: both paths optimized" "$(cat "$p1/ana_state" "$p2/ana_state" 2>&1 | tr '\n' ' ')" \
        "optimized optimized "
    nvme ana-log "$c2" >/tmp/ana 2>&1
    cat /tmp/ana
    t_eq "nvme ana-log of controller 2 (succeeds)" "$(grep -c 'ngrps' /tmp/ana)" 1
    t_skip "taking a path out of service and back: the host sets vnvme's ANA states only"
elif [ -z "$p2" ] || [ -z "$p1" ]; then
    t_fail "the path devices of controllers 1 and 2 ($c1 $c2): $(ls /sys/block | tr '\n' ' ')"
else
    t_eq "ANA: both paths optimized, group 1 ($p1 $p2)" \
        "$(cat "$p1/ana_state" "$p2/ana_state" "$p1/ana_grpid" | tr '\n' ' ')" "optimized optimized 1 "
    nvme ana-log "$c2" >/tmp/ana 2>&1
    cat /tmp/ana
    ana_field() { awk -F: -v k="$1" '{ gsub(/[ \t]/, "") } $1 == k { print $2; exit }' /tmp/ana; }
    t_eq "nvme ana-log of controller 2: groups, the first's ID, state and NSID" \
        "$(ana_field ngrps) $(ana_field grpid) $(ana_field state) $(ana_field nsid)" "1 1 optimized 1"
    # The operator takes controller 2's path out of service (vnvme ctl ana.set
    # inaccessible): the controller tells the host (an ANA Change notice), the
    # host reads the ANA log and sends everything down controller 1.
    echo "@@VNVME-HOST ana-inaccessible@@"
    if ana_wait "$p2" inaccessible; then
        t_pass "ana.set inaccessible on controller 2: its path reads inaccessible, controller 1's $(cat "$p1/ana_state")"
    else
        t_fail "controller 2's path did not become inaccessible (ana_state $(cat "$p2/ana_state"))"
    fi
    before=$(writes_of "$p2")
    fio_verified "path 2 inaccessible: fio randwrite QD 16 + verify through the head (round-robin)" \
        --filename="$head" --ioengine="$ENGINE" --direct=1 --rw=randwrite --bs=4k --iodepth=16 --offset=32M \
        --size=16M --verify=crc32c --verify_fatal=1 --name=mpana
    t_eq "path 2 inaccessible: writes through it meanwhile" "$(($(writes_of "$p2") - before))" 0
    echo "@@VNVME-HOST ana-optimized@@"
    if ana_wait "$p2" optimized; then
        t_pass "ana.set optimized: controller 2's path is back"
    else
        t_fail "controller 2's path did not come back (ana_state $(cat "$p2/ana_state"))"
    fi
    round_robin "path 2 back" 48M mpana2
    # Controller 2's process replaced by a new one (vnvme ctl upgrade, issued by the
    # host two seconds in) under I/O through the head: the hand-over moves its
    # queues and the commands in flight, so neither QEMU nor the guest sees it (no
    # reset, no timeout, no I/O error), and controller 1 serves on meanwhile.
    before=$(dmesg | wc -l)
    (sleep 2; echo "@@VNVME-HOST mp-upgrade@@") &
    fio_verified "controller 2's process upgraded under fio randwrite QD 16 + verify through the head" \
        --filename="$head" --ioengine="$ENGINE" --direct=1 --rw=randwrite --bs=4k --iodepth=16 --offset=0 \
        --size=16M --loops=4 --verify=crc32c --verify_fatal=1 --name=mpupgrade
    wait
    if dmesg | tail -n +$((before + 1)) | grep -E "$(basename "$c2")[:, ]" | grep -qiE 'reset|timeout|abort'; then
        t_fail "controller 2 across the upgrade: $(dmesg | tail -n +$((before + 1)) | grep -E "$(basename "$c2")[:, ]" | head -3)"
    else
        t_pass "across controller 2's upgrade: no reset, timeout or abort of it in the kernel log"
    fi
    round_robin "after the upgrade" 16M mpupgraded
    # Controller 2's serving process killed under I/O (SIGKILL: no warning, its
    # queues and the commands it held die with it) and restarted by its keeper
    # (vnvme serve --restart-on-crash), which held the VMM's connection: QEMU sees
    # nothing; the stand-in reports Persistent Internal Error through the guest's
    # Asynchronous Event Request (and CSTS.CFS), and the guest
    # resets the controller. Meanwhile the writes it had are retried through
    # controller 1: fio goes on with no error, and afterwards both paths carry
    # I/O again.
    before=$(dmesg | wc -l)
    (sleep 2; echo "@@VNVME-HOST mp-crash@@") &
    fio_verified "controller 2's process killed and restarted under fio randwrite QD 16 + verify through the head" \
        --filename="$head" --ioengine="$ENGINE" --direct=1 --rw=randwrite --bs=4k --iodepth=16 --offset=64M \
        --size=32M --loops=4 --verify=crc32c --verify_fatal=1 --name=mpcrash
    wait
    echo "== kernel messages since the kill"
    dmesg | tail -n +$((before + 1)) | grep -i nvme | tail -20
    # The stand-in completes the guest's Asynchronous Event Request with
    # Persistent Internal Error, and Linux resets the controller on it at once
    # (not after its I/O timeout, when it would read CSTS.CFS).
    if dmesg | tail -n +$((before + 1)) | grep -q "$(basename "$c2"): resetting controller due to persistent internal error"; then
        t_pass "the stand-in's Persistent Internal Error event made the guest reset controller 2 at once"
    elif dmesg | tail -n +$((before + 1)) | grep -q "$(basename "$c2"): .*CSTS=0x3"; then
        t_fail "controller 2 was reset only after an I/O timeout (CSTS.CFS), not on the stand-in's event"
    else
        t_fail "no reset of controller 2 in the kernel log"
    fi
    if ctrl_live "$(basename "$c2")" 120; then
        t_pass "controller 2 is live again after the restart ($(cat /sys/class/nvme/nvme*/state | tr '\n' ' '))"
    else
        t_fail "controller 2 did not come back (states: $(cat /sys/class/nvme/nvme*/state | tr '\n' ' '))"
    fi
    ana_wait "$p2" optimized || t_fail "controller 2's path is not optimized after the restart ($(cat "$p2/ana_state"))"
    round_robin "after the restart" 96M mpafter
fi
if [ "${MP_KILL:-0}" = 1 ]; then
    # Path loss: the host kills controller 2's process. Writes go on; the I/O the
    # dead path had is retried on the live one.
    before=$(dmesg | wc -l)
    # The kernel's own account of the requests that failed: the nvme and block
    # completion tracepoints (printed below when fio sees an error).
    tr=/sys/kernel/tracing
    [ -d $tr/events ] || mount -t tracefs tracefs $tr 2>/dev/null
    echo 1 >$tr/events/nvme/nvme_complete_rq/enable 2>/dev/null
    echo 1 >$tr/events/block/block_rq_complete/enable 2>/dev/null
    echo 1 >$tr/events/block/block_bio_complete/enable 2>/dev/null
    echo 1 >$tr/events/block/block_rq_error/enable 2>/dev/null
    echo 1 >$tr/tracing_on 2>/dev/null
    echo "@@VNVME-HOST mp-kill@@"
    fio_verified "controller 2's process killed: fio randwrite QD 16 + verify through the head goes on" \
        --filename="$head" --ioengine="$ENGINE" --direct=1 --rw=randwrite --bs=4k --iodepth=16 --offset=32M \
        --size=32M --verify=crc32c --verify_fatal=1 --name=mpkill
    live=$(cat /sys/class/nvme/nvme*/state | tr '\n' ' ')
    t_eq "after the kill: one controller live (states: $live)" "$(echo "$live" | grep -o 'live' | wc -l)" 1
    echo 0 >$tr/tracing_on 2>/dev/null
    echo "== kernel messages since the kill"
    dmesg | tail -n +$((before + 1)) | tail -40
    echo "== failed completions (trace)"
    grep -E 'status=0x[1-9a-f]|block_rq_error|\[-?[1-9][0-9]*\]$' $tr/trace 2>/dev/null | head -60
fi
if dmesg | grep -E "${head#/dev/}[:, ]" | grep -qiE 'I/O error|blk_update_request|Buffer I/O'; then
    t_fail "guest kernel log: I/O errors on the namespace head"
else
    t_pass "guest kernel log: no I/O error on the namespace head"
fi
echo "== multipath suite: $T_FAILED failure(s)"
[ "$T_FAILED" -eq 0 ]
