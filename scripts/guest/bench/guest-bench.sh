# shellcheck shell=dash
# Guest side of scripts/bench-guest.sh (busybox sh). /bench/config.sh (written
# by the host) sets RUNTIME, REPS, POINTS ("randread:1 randread:4 ..."),
# DEVS (the slots of this guest: "a" alone, or "a b" for a pair) and per slot
# S: KIND_S (nvme | virtio | nullb), SERIAL_S (the device's serial number: how
# the guest tells two devices apart), PREFILL_S (1 to fill the device first),
# PAUSE_S (1: ask the host to stop the device's server while the other device
# runs, for a server that spins when idle).
# Every repetition runs every point on every slot; with two slots the order
# alternates: a then b on odd repetitions, b then a on even ones, so drift
# cancels in the paired ratios. For each run it prints:
#   @@VNVME-MARK p-POINT-REP-SLOT-start@@ / -end@@  (the host samples CPU,
#       its own /proc/stat and vnvme's counters there)
#   @@RESULT POINT REP SLOT busy=PCT irqs=N ctx=N rc=N@@ (guest /proc/stat and
#       /proc/interrupts deltas)
#   @@FIO-BEGIN POINT REP SLOT@@ ...fio JSON... @@FIO-END@@
# and @@BENCH-PAUSE SLOT@@ / @@BENCH-RESUME SLOT@@ around the other slot's runs
# when PAUSE_SLOT=1.
# shellcheck disable=SC1091 # written by the host
. /bench/config.sh
mark() { echo "@@VNVME-MARK $1@@"; sleep "${2:-1.5}"; }
fail() { echo "@@BENCH-ERROR $*@@"; exit 1; }
get() { eval "echo \"\${$1:-}\""; }
# words FILE: the file's content with surrounding blanks removed (NVMe serials
# are padded with spaces; virtio's has no newline).
# shellcheck disable=SC2046,SC2005 # word splitting is the point
words() { echo $(cat "$1" 2>/dev/null); }

# find_dev SLOT: sets dev_SLOT and irq_SLOT (a /proc/interrupts pattern).
find_dev() {
    local s=$1 kind serial dev irqpat i b c
    kind=$(get "KIND_$s") serial=$(get "SERIAL_$s") dev="" irqpat=""
    case $kind in
    nvme)
        i=0
        while [ $i -lt 150 ]; do
            for b in /sys/block/nvme*n*; do
                [ "$(cat "$b/nsid" 2>/dev/null)" = 1 ] || continue
                # device/ is the controller, or the subsystem for a multipath disk: both have serial.
                [ -z "$serial" ] || [ "$(words "$b/device/serial")" = "$serial" ] || continue
                dev=/dev/${b##*/}
            done
            [ -n "$dev" ] && [ -b "$dev" ] && break
            usleep 100000
            i=$((i + 1))
        done
        for c in /sys/class/nvme/nvme*; do
            [ -z "$serial" ] || [ "$(words "$c/serial")" = "$serial" ] || continue
            irqpat="${c##*/}q"
            break
        done
        ;;
    virtio)
        i=0
        while [ $i -lt 150 ]; do
            for b in /sys/block/vd*; do
                [ -z "$serial" ] || [ "$(words "$b/serial")" = "$serial" ] || continue
                dev=/dev/${b##*/}
                c=$(readlink -f "$b/device")
                irqpat="${c##*/}-(req|request)"
            done
            [ -n "$dev" ] && [ -b "$dev" ] && break
            usleep 100000
            i=$((i + 1))
        done
        ;;
    nullb)
        modprobe null_blk nr_devices=1 queue_mode=2 irqmode=0 gb=1 bs=4096 submit_queues=2 \
            hw_queue_depth=256 || fail "modprobe null_blk"
        wait-dev /dev/nullb0 10
        dev=/dev/nullb0
        irqpat='NONE-no-irqs'
        ;;
    esac
    [ -b "$dev" ] || fail "no block device for slot $s ($kind, serial '$serial')"
    eval "dev_$s=$dev irq_$s='$irqpat'"
    echo "bench device $s: $dev ($kind, serial '$serial'), $(blockdev --getsize64 "$dev") bytes"
    grep -E "$irqpat" /proc/interrupts | head -5
}

for s in $DEVS; do find_dev "$s"; done
first=${DEVS%% *}
dev=$(get "dev_$first")

ENGINE=io_uring
fio --name=probe --filename="$dev" --ioengine=io_uring --direct=1 --rw=read --bs=4k --size=4k \
    >/dev/null 2>&1 || ENGINE=libaio
echo "@@INFO engine=$ENGINE fio=$(fio --version) kernel=$(uname -r) ncpu=$(nproc)@@"

# zbd_args SLOT: fio's zoned block device mode for a zoned device (writes go to
# the write pointers of at most 8 open zones; full zones are reset), else nothing.
zbd_args() {
    [ "$(get "ZONED_$1")" = 1 ] && echo "--zonemode=zbd --max_open_zones=8"
}

for s in $DEVS; do
    [ "$(get "PREFILL_$s")" = 1 ] || continue
    dev=$(get "dev_$s")
    echo "prefill $s ($dev): sequential 128k writes over the whole device"
    # shellcheck disable=SC2046 # zbd options, or none
    fio --name=prefill --filename="$dev" --ioengine="$ENGINE" --direct=1 --rw=write --bs=128k \
        --iodepth=16 --size=100% --eta=never $(zbd_args "$s") >/tmp/prefill.out 2>&1 || {
        cat /tmp/prefill.out
        fail "prefill $s"
    }
    grep -E '^ +write:' /tmp/prefill.out
done

# cpu_ticks: "busy total" jiffies over all CPUs (busy = total - idle - iowait).
cpu_ticks() { awk '/^cpu / { t = 0; for (i = 2; i <= NF; i++) t += $i; print t - $5 - $6, t }' /proc/stat; }
irq_sum() { grep -E "$1" /proc/interrupts | awk '{ for (i = 2; i <= NF; i++) if ($i ~ /^[0-9]+$/) s += $i; else break } END { print s + 0 }'; }
ctx() { awk '/^ctxt/ { print $2 }' /proc/stat; }

# only SLOT: pause every other slot whose server spins when idle, resume SLOT's.
paused=""
only() {
    local s
    for s in $DEVS; do
        if [ "$s" = "$1" ]; then
            case " $paused " in *" $s "*)
                echo "@@BENCH-RESUME $s@@"
                paused=$(for x in $paused; do [ "$x" = "$s" ] || printf " %s" "$x"; done)
                sleep 0.5 ;;
            esac
        elif [ "$(get "PAUSE_$s")" = 1 ]; then
            case " $paused " in *" $s "*) ;; *)
                echo "@@BENCH-PAUSE $s@@"
                paused="$paused $s"
                sleep 0.5 ;;
            esac
        fi
    done
}

# run SLOT POINT REP: one fio run on SLOT's device, between marks.
run() {
    local s=$1 p=$2 rep=$3 rw qd name dev irqpat b0 t0 i0 c0 b1 t1 i1 c1 frc busy
    rw=${p%%:*} qd=${p#*:}
    name="$rw-qd$qd"
    dev=$(get "dev_$s") irqpat=$(get "irq_$s")
    only "$s"
    sleep 1
    # shellcheck disable=SC2046 # two numbers
    set -- $(cpu_ticks)
    b0=$1 t0=$2 i0=$(irq_sum "$irqpat") c0=$(ctx)
    mark "p-$name-$rep-$s-start" 0
    # shellcheck disable=SC2046 # zbd options, or none
    fio --name="$name" --filename="$dev" --ioengine="$ENGINE" --direct=1 --rw="$rw" --bs=4k \
        --iodepth="$qd" --runtime="$RUNTIME" --time_based --norandommap --randrepeat=0 $(zbd_args "$s") \
        --lat_percentiles=1 --output-format=json --output=/tmp/fio.json >/tmp/fio.err 2>&1
    frc=$?
    # shellcheck disable=SC2046 # two numbers
    set -- $(cpu_ticks)
    b1=$1 t1=$2 i1=$(irq_sum "$irqpat") c1=$(ctx)
    mark "p-$name-$rep-$s-end"
    busy=$(awk -v b=$((b1 - b0)) -v t=$((t1 - t0)) 'BEGIN { if (t > 0) printf "%.1f", 100 * b / t; else print "nan" }')
    echo "@@RESULT $name $rep $s busy=$busy irqs=$((i1 - i0)) ctx=$((c1 - c0)) rc=$frc@@"
    [ $frc = 0 ] || cat /tmp/fio.err
    echo "@@FIO-BEGIN $name $rep $s@@"
    cat /tmp/fio.json
    echo "@@FIO-END@@"
}

reversed=""
for s in $DEVS; do reversed="$s $reversed"; done
rep=1
while [ $rep -le "$REPS" ]; do
    order=$DEVS
    [ $((rep % 2)) = 1 ] || order=$reversed
    for p in $POINTS; do
        for s in $order; do run "$s" "$p" "$rep"; done
    done
    rep=$((rep + 1))
done
for s in $paused; do echo "@@BENCH-RESUME $s@@"; done
echo "@@BENCH-DONE@@"
