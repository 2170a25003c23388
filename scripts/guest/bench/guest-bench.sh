# shellcheck shell=dash
# Guest side of scripts/bench-guest.sh (busybox sh). /bench/config.sh (written
# by the host) sets KIND (nvme | virtio | nullb), RUNTIME, REPS, POINTS
# ("randread:1 randread:4 ..."), PREFILL (1 to fill the device first).
# For each point and repetition it prints:
#   @@VNVME-MARK p-POINT-REP-start@@ / -end@@  (the host samples CPU and counters)
#   @@RESULT POINT REP busy=PCT irqs=N ctx=N@@ (guest /proc/stat and /proc/interrupts deltas)
#   @@FIO-BEGIN POINT REP@@ ...fio JSON... @@FIO-END@@
. /bench/config.sh
mark() { echo "@@VNVME-MARK $1@@"; sleep "${2:-1.5}"; }
fail() { echo "@@BENCH-ERROR $*@@"; exit 1; }

case $KIND in
nvme)
    i=0
    while [ $i -lt 150 ]; do
        for b in /sys/block/nvme0n*; do
            [ "$(cat "$b/nsid" 2>/dev/null)" = 1 ] && dev=/dev/${b##*/}
        done
        [ -n "${dev:-}" ] && [ -b "$dev" ] && break
        usleep 100000
        i=$((i + 1))
    done
    irqpat='nvme0q'
    ;;
virtio)
    wait-dev /dev/vda 15
    dev=/dev/vda
    irqpat='virtio[0-9]*-(req|request)'
    ;;
nullb)
    modprobe null_blk nr_devices=1 queue_mode=2 irqmode=0 gb=1 bs=4096 submit_queues=2 \
        hw_queue_depth=256 || fail "modprobe null_blk"
    wait-dev /dev/nullb0 10
    dev=/dev/nullb0
    irqpat='NONE-no-irqs'
    ;;
esac
[ -b "${dev:-}" ] || fail "no block device for $KIND"
echo "bench device: $dev ($KIND), $(blockdev --getsize64 "$dev") bytes"
grep -E "$irqpat" /proc/interrupts | head -5

ENGINE=io_uring
fio --name=probe --filename="$dev" --ioengine=io_uring --direct=1 --rw=read --bs=4k --size=4k \
    >/dev/null 2>&1 || ENGINE=libaio
echo "@@INFO engine=$ENGINE fio=$(fio --version) kernel=$(uname -r) ncpu=$(nproc)@@"

if [ "$PREFILL" = 1 ]; then
    echo "prefill: sequential 128k writes over the whole device"
    fio --name=prefill --filename="$dev" --ioengine="$ENGINE" --direct=1 --rw=write --bs=128k \
        --iodepth=16 --size=100% --eta=never >/tmp/prefill.out 2>&1 || {
        cat /tmp/prefill.out
        fail "prefill"
    }
    grep -E '^ +write:' /tmp/prefill.out
fi

# cpu_ticks: "busy total" jiffies over all CPUs (busy = total - idle - iowait).
cpu_ticks() { awk '/^cpu / { t = 0; for (i = 2; i <= NF; i++) t += $i; print t - $5 - $6, t }' /proc/stat; }
irq_sum() { grep -E "$irqpat" /proc/interrupts | awk '{ for (i = 2; i <= NF; i++) if ($i ~ /^[0-9]+$/) s += $i; else break } END { print s + 0 }'; }
ctx() { awk '/^ctxt/ { print $2 }' /proc/stat; }

rep=1
while [ $rep -le "$REPS" ]; do
    for p in $POINTS; do
        rw=${p%%:*} qd=${p#*:}
        name="$rw-qd$qd"
        sleep 1
        # shellcheck disable=SC2046 # two numbers
        set -- $(cpu_ticks)
        b0=$1 t0=$2 i0=$(irq_sum) c0=$(ctx)
        mark "p-$name-$rep-start" 0
        fio --name="$name" --filename="$dev" --ioengine="$ENGINE" --direct=1 --rw="$rw" --bs=4k \
            --iodepth="$qd" --runtime="$RUNTIME" --time_based --norandommap --randrepeat=0 \
            --lat_percentiles=1 --output-format=json --output=/tmp/fio.json >/tmp/fio.err 2>&1
        frc=$?
        # shellcheck disable=SC2046 # two numbers
        set -- $(cpu_ticks)
        b1=$1 t1=$2 i1=$(irq_sum) c1=$(ctx)
        mark "p-$name-$rep-end"
        busy=$(awk -v b=$((b1 - b0)) -v t=$((t1 - t0)) 'BEGIN { if (t > 0) printf "%.1f", 100 * b / t; else print "nan" }')
        echo "@@RESULT $name $rep busy=$busy irqs=$((i1 - i0)) ctx=$((c1 - c0)) rc=$frc@@"
        [ $frc = 0 ] || cat /tmp/fio.err
        echo "@@FIO-BEGIN $name $rep@@"
        cat /tmp/fio.json
        echo "@@FIO-END@@"
    done
    rep=$((rep + 1))
done
echo "@@BENCH-DONE@@"
