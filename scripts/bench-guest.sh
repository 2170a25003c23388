#!/usr/bin/env bash
# Guest benchmark: the same guest kernel + initramfs booted on QEMU's nvme
# (with and without ioeventfd), virtio-blk (with and without an iothread),
# vnvme over vfio-user-pci in each doorbell and polling mode (also with
# QEMU's x-no-posted-writes=on), and the guest's own null_blk (the ceiling).
# fio 4 KiB randread at QD 1, 4, 16, 64 and randwrite at QD 16, --reps times
# (default 5), interleaved.
#
# Paired design (the default for vnvme devices): a host this noisy (±25 %
# within a run) cannot say "ahead" or "behind" from one run, so each vnvme
# device is booted in ONE guest together with a reference device (--reference,
# default qemu-nvme), and every repetition of every point runs on both, one
# after the other (reference first on odd repetitions, vnvme first on even
# ones, so drift cancels). The report gives the per-repetition ratios
# vnvme/reference of IOPS and of device-side CPU per I/O as a median with an
# interval (seeded bootstrap 90 % interval of the median with >= 5 pairs,
# else min–max) and a verdict: "ahead" or "behind" only when the whole
# interval is on one side of 1.0, else "level (inside the noise)". --pair A:B
# compares any two devices the same way (ratio B/A). Every run is checked for
# disturbance (host /proc/stat around it: steal > 5 %, or > 0.2 CPUs busy with
# something other than QEMU, vnvme and the --neighbour), flagged in the tables,
# and the intervals are given with and without flagged repetitions.
#
# Writes JSON, markdown and an SVG chart under results/guest-bench/<UTC
# timestamp>/. A benchmark, not a test: never run by scripts/test.sh.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
COMMAND_LINE="$0 $*"
# shellcheck source=scripts/lib/packages.sh
source "$here/lib/packages.sh"
# shellcheck source=scripts/lib/guest-host.sh
source "$here/lib/guest-host.sh"

ALL_QEMU="qemu-nvme qemu-nvme-ioeventfd virtio-blk virtio-blk-iothread"
# The zone size of the zoned devices (qemu-nvme-zns, vnvme-zns).
ZNS_ZONE=8M

usage() {
    cat <<EOF
Usage: ${0##*/} [--kernel K] [--accel A] [--runtime S] [--reps N] [--size SIZE]
                [--devices LIST] [--reference DEV|none] [--pair A:B[,C:D]]
                [--neighbour] [--points LIST] [--out DIR] [--no-fetch] [--no-build]

Devices (--devices, comma separated; default: all of them):
  qemu-nvme             -device nvme (QEMU's NVMe; ioeventfd=off, its default)
  qemu-nvme-ioeventfd   -device nvme,ioeventfd=on
  virtio-blk            -device virtio-blk-pci (ioeventfd on, 1 queue per vCPU)
  virtio-blk-iothread   the same with -object iothread (iothread=iot0)
    all four on -drive file=/dev/shm/<tmp>.img,format=raw,cache=none,aio=io_uring:
    a RAM-backed file (tmpfs; one per device of a guest). If the host's tmpfs
    refuses O_DIRECT, cache=writeback is used instead, and the JSON says so.
  vnvme-<doorbells>-<poll>  \`vnvme serve --ns ram:SIZE --workers 1\` (sparse RAM
    namespace) over -device vfio-user-pci, for every --doorbells mode the binary
    offers (trapped, eventfd, mapped; mapped polls, so only with --poll always)
    and every --poll mode (off, adaptive, always). The guest enables shadow
    doorbells in every case (Linux has no knob to turn DBBUF off).
  vnvme-inline-<poll>   the same with --workers 0 (inline: the server's own
    thread runs the queues) and trapped doorbells, poll off and adaptive
  vnvme-noshadow-off    --no-shadow-doorbells (OACS bit 8 hidden): the guest
    writes every doorbell register; the baseline for what shadow doorbells save
  vnvme-...-base        any of the vnvme devices above (before -nopost) with -base
    appended runs on the --baseline binary: --pair vnvme-inline-adaptive-base:vnvme-inline-adaptive
    measures a change to vnvme itself, the two builds side by side
  vnvme-...-nopost      any of the vnvme devices above with -nopost appended
    (e.g. vnvme-trapped-adaptive-nopost): QEMU's vfio-user-pci with
    x-no-posted-writes=on, so QEMU waits for the server's reply to every MMIO
    write (a doorbell write then costs a round trip, as with Cloud Hypervisor);
    the default list has vnvme-trapped-off-nopost and vnvme-trapped-adaptive-nopost
  null_blk              no device: modprobe null_blk queue_mode=2 irqmode=0
                        (completes in the submitting context; the guest's ceiling)
  --devices polling     = vnvme-trapped-off,vnvme-trapped-adaptive, each beside
                          the reference, plus --pair vnvme-trapped-off:vnvme-trapped-adaptive
                          (adaptive polling against none; add --neighbour for a busy host)
  --devices nopost      = vnvme-trapped-off,vnvme-trapped-adaptive and their -nopost variants
  --devices pi          = qemu-nvme-pi beside vnvme-pi in one guest, paired:
                          type 1 protection information in 8 bytes of metadata
                          per 512-byte block (QEMU: nvme-ns ms=8,pi=1 on a tmpfs
                          file, metadata after the data; vnvme: ram:SIZE:ms=8:pi=1,
                          default doorbells and polling). The guest's integrity
                          layer generates and verifies every block's PI, each
                          device checks guard and reference tag.
  --devices pi64        = qemu-nvme-pi64 beside vnvme-pi64, paired: the same
                          with the 64-bit guard format, 16 bytes of metadata per
                          512-byte block (QEMU: ms=16,pi=1,pif=2; vnvme:
                          ram:SIZE:ms=16:pi=1:guard=64): CRC-64/NVME guards and
                          48-bit reference tags
  --devices zns         = qemu-nvme-zns beside vnvme-zns in one guest, paired:
                          zoned namespaces of 8M zones (QEMU: nvme-ns zoned=true on
                          a tmpfs file; vnvme: ram:SIZE:zoned=8M, default doorbells
                          and polling). fio runs in --zonemode=zbd (writes at the
                          write pointers, at most 8 zones open; full zones reset
                          by fio), randread anywhere
  Backends (the file backend against QEMU on the same kind of file; run alone,
  one guest per device, never paired):
  qemu-nvme-disk        -device nvme on a file on disk (--disk-dir), cache=none,
                        aio=io_uring
  vnvme-file-tmpfs      \`vnvme serve --ns file:/dev/shm/<tmp>.img\` (io_uring,
                        O_DIRECT when the file system allows it), trapped
                        doorbells, --poll adaptive, 1 worker
  vnvme-file-disk       the same on the disk file
  vnvme-chain-tmpfs     nvme:// chain: a front \`vnvme serve --ns nvme://back.sock\`
                        in front of a back \`vnvme serve --ns file:/dev/shm/...
                        --doorbells eventfd\` (the front kicks the back's worker):
                        its overhead against vnvme-file-tmpfs (the direct path);
                        vnvme µs/IO counts both processes
  --devices backends    = qemu-nvme,qemu-nvme-disk,vnvme-file-tmpfs,vnvme-file-disk,
                          vnvme-chain-tmpfs
  Network storage (the same server, image and size for QEMU and vnvme; every
  QEMU, vnvme's included, is the one of scripts/fetch-qemu-rbd.sh: the same QEMU
  with its block-rbd module; run alone, never paired):
  qemu-nvme-nbd         -device nvme on -blockdev driver=nbd (QEMU's NBD client)
  virtio-blk-nbd        -device virtio-blk-pci on the same
  vnvme-nbd             \`vnvme serve --ns nbd+unix:///?socket=...\`, trapped
                        doorbells, --poll adaptive, 1 worker
  vnvme-nbd-off         the same with --poll off (no spinning between requests)
    all three on qemu-nbd (Debian's, scripts/fetch-nbd-servers.sh) serving a raw
    file on tmpfs (--cache=writeback, --aio=threads; fresh for every device)
  qemu-nvme-rbd         -device nvme on -blockdev driver=rbd (QEMU's librbd driver)
  virtio-blk-rbd        -device virtio-blk-pci on the same
  vnvme-rbd             \`vnvme serve --ns rbd:rbd/IMAGE:...\`, the same modes
  vnvme-rbd-off         the same with --poll off
    all three on an image of a single-node Ceph cluster (scripts/ceph-cluster.sh:
    one monitor, one OSD on memstore) started for the run, as client.vnvme
    (profile rbd), librbd's default cache settings; a fresh image per device
  --devices netstore    = all eight
  The NBD server's and the cluster's CPU is not counted (the same for both sides).

Paired runs. Every vnvme RAM device (vnvme-<doorbells>-<poll>[-nopost],
inline, noshadow) is booted in one guest beside the --reference device (both
attached; the guest tells them apart by serial number), and every repetition
of every point runs on both: reference first on odd repetitions, vnvme first
on even ones. Only one device is busy at a time, so each run's CPU is its own
device's. A vnvme server that spins when idle (--poll always) is stopped
(SIGSTOP) while the other device of its guest runs, so its spinning does not
slow the other device. The report gives, per point, the ratios vnvme/reference
of IOPS (higher is better) and of device-side CPU µs per I/O (the vnvme
process + QEMU's non-vCPU threads; lower is better) over the repetitions: the
median, an interval (a seeded bootstrap 90 % interval of the median with >= 5
pairs, else min–max) and a verdict, "ahead" / "behind" only when the whole
interval is above / below 1.0, else "level (inside the noise)".
  --reference DEV  qemu-nvme (default), qemu-nvme-ioeventfd, virtio-blk,
                 virtio-blk-iothread, or none: every device alone in its guest
                 (no ratios; the design before pairs)
  --pair A:B     also boot A and B together and report B/A (comma separated
                 for several); A and B: any of the four QEMU tmpfs devices or
                 vnvme RAM devices. With --pair and no --devices, only the pairs
                 run. E.g. adaptive polling against none on a busy host:
                   --devices polling --neighbour
  --neighbour    a CPU-bound process (python3 busy loop, unpinned) on the host
                 during every guest (started before it boots, killed after it
                 ends); its CPU is not counted as other load
Disturbed runs: the host's /proc/stat is read at the start and end mark of
every run; a run is flagged when steal > 5 % of the machine's CPU time, or
when more than 0.2 CPUs were busy with anything but QEMU, vnvme and the
neighbour; a pair is flagged when either run is. Flagged runs stay in the
tables (marked); the ratio table gives the interval and verdict over all pairs
and over the unflagged ones.

Every device is filled first with sequential 128 KiB writes (so reads hit
allocated memory), except null_blk. Points (--points): randread:1 randread:4
randread:16 randread:64 randwrite:16 (4 KiB, direct, io_uring, --runtime
seconds each, --reps times, interleaved). Collected per run: fio's IOPS,
mean and p99 completion latency (lat_ns, JSON), guest CPU busy (/proc/stat in
the guest, all vCPUs), guest interrupts per I/O (/proc/interrupts), CPU time
per I/O of the vnvme process and of QEMU's non-vCPU threads
(/proc/PID/task/*/schedstat between marks), for vnvme its own counters
(--stats-file: trapped doorbell writes and interrupts per I/O), and the host's
steal and other load.

  --kernel K     guest kernel (default newest)
  --accel A      auto | kvm | tcg (default: \$VNVME_ACCEL or auto)
  --runtime S    seconds per point (default 3)
  --reps N       repetitions of every point (default 5; fewer than 5 gives
                 min–max intervals only)
  --size SIZE    device size (default 256M)
  --out DIR      output directory (default results/guest-bench/<UTC timestamp>)
  --disk-dir D   where the "disk" image lives (default target/bench-disk in the
                 checkout; must not be tmpfs)
  --no-fetch     do not fetch QEMU / the kernel / build the initramfs
  --no-build     do not build vnvme (use target/release/vnvme as it is)
  --baseline BIN the vnvme binary that -base devices run (an older build)

Under TCG (no usable KVM) the whole --devices list takes about 1.5 h.
EOF
}

kernel=newest accel="${VNVME_ACCEL:-auto}" runtime=3 reps=5 size=256M devices="" out="" fetch=1 build=1
reference=qemu-nvme neighbour=0 pair_list=() baseline=""
disk_dir="$VNVME_ROOT/target/bench-disk"
points="randread:1 randread:4 randread:16 randread:64 randwrite:16"
while [[ $# -gt 0 ]]; do
    case $1 in
    --kernel) kernel=$2; shift 2 ;;
    --accel) accel=$2; shift 2 ;;
    --runtime) runtime=$2; shift 2 ;;
    --reps) reps=$2; shift 2 ;;
    --size) size=$2; shift 2 ;;
    --devices) devices=${2//,/ }; shift 2 ;;
    --points) points=${2//,/ }; shift 2 ;;
    --out) out=$2; shift 2 ;;
    --disk-dir) disk_dir=$2; shift 2 ;;
    --reference) reference=$2; shift 2 ;;
    --pair) read -r -a _p <<<"${2//,/ }"; pair_list+=("${_p[@]}"); shift 2 ;;
    --neighbour | --neighbor) neighbour=1; shift ;;
    --no-fetch) fetch=0; shift ;;
    --no-build) build=0; shift ;;
    --baseline) baseline=$2; shift 2 ;;
    -h | --help) usage; exit 0 ;;
    *) usage >&2; exit 2 ;;
    esac
done
need_cmds python3:python3
[[ $reps =~ ^[1-9][0-9]*$ ]] || die "--reps must be a number >= 1"
[[ $runtime =~ ^[1-9][0-9]*$ ]] || die "--runtime must be a whole number of seconds >= 1"
case $reference in
qemu-nvme | qemu-nvme-ioeventfd | virtio-blk | virtio-blk-iothread | none) ;;
*) die "--reference must be qemu-nvme, qemu-nvme-ioeventfd, virtio-blk, virtio-blk-iothread or none" ;;
esac

T0=$(date +%s)
stamp=$(date -u +%Y%m%dT%H%M%SZ)
[[ -n $out ]] || out="$VNVME_ROOT/results/guest-bench/$stamp"
mkdir -p "$out"
out=$(cd "$out" && pwd)
if [[ -e $out/raw ]]; then
    # An earlier run's raw logs would sit beside this one's (and block their gzip).
    log "$out holds an earlier run: its raw/ is replaced, its reports overwritten"
    rm -rf "$out/raw"
fi
work=$(mktemp -d "${TMPDIR:-/tmp}/vnvme-guest-bench.XXXXXX")
# One RAM image per slot of a guest (a: the first device, b: the second of a pair).
img="/dev/shm/vnvme-bench.$$.img" img_b="/dev/shm/vnvme-bench.$$.b.img"
mkdir -p "$disk_dir"
disk_img="$(cd "$disk_dir" && pwd)/vnvme-bench.$$.img"
VN_PID="" cur_qemu_pidfile="" BACK_PID="" NBD_PID="" CEPH_DIR="" NEIGH_PID=""
SERVER_PIDS=()
stop_servers() { # every vnvme server of the current guest (a paused one is resumed first)
    local pid
    for pid in "${SERVER_PIDS[@]}"; do
        kill -CONT "$pid" 2>/dev/null || true
        vn_serve_stop "$pid"
    done
    SERVER_PIDS=()
    vn_serve_stop "$BACK_PID"
    BACK_PID=""
}
stop_neighbour() {
    [[ -n $NEIGH_PID ]] || return 0
    kill "$NEIGH_PID" 2>/dev/null || true
    wait "$NEIGH_PID" 2>/dev/null || true
    NEIGH_PID=""
}
cleanup() {
    vn_term_pidfile "$cur_qemu_pidfile"
    stop_servers
    stop_neighbour
    [[ -z $NBD_PID ]] || { kill "$NBD_PID" 2>/dev/null; wait "$NBD_PID" 2>/dev/null; }
    [[ -z $CEPH_DIR ]] || "$here/ceph-cluster.sh" stop "$CEPH_DIR" >/dev/null 2>&1
    rm -f "$img" "$img_b" "$disk_img"
    rm -rf "$work" # raw data is copied to $out/raw per guest
    rmdir "$out" 2>/dev/null || true # nothing written (an early error)
}
trap cleanup EXIT
trap 'exit 130' INT TERM

log "results in $out (work files in $work, removed at exit)"
if [[ $fetch -eq 1 ]]; then
    "$VNVME_GUEST_DIR/fetch-qemu.sh"
    "$VNVME_GUEST_DIR/fetch-kernels.sh" "$kernel"
    "$VNVME_GUEST_DIR/mkinitramfs.sh" "$kernel"
fi
[[ $build -eq 0 ]] || vn_build
[[ -x $VNVME_BIN ]] || die "no vnvme binary at $VNVME_BIN"
baseline_bin=""
if [[ -n $baseline ]]; then
    [[ -x $baseline ]] || die "--baseline $baseline is not an executable"
    # A copy: a rebuild of the checkout during the run must not change it.
    baseline_bin="$work/vnvme-baseline"
    cp "$baseline" "$baseline_bin"
fi
if [[ $accel == auto ]]; then
    "$VNVME_GUEST_DIR/boot.sh" --kernel "$kernel" --accel auto --timeout 120 --cmd true >"$work/accel.log" 2>&1 || true
    accel=$(grep -o 'accel [a-z]*' "$work/accel.log" | head -1 | cut -d' ' -f2)
    [[ -n $accel ]] || accel=tcg
fi

# vnvme modes this binary offers.
help=$("$VNVME_BIN" serve --help)
db_modes=(trapped)
if grep -q -- '--doorbells' <<<"$help"; then
    db_modes=()
    for m in trapped eventfd mapped; do grep -q -- "$m" <<<"$(grep -A3 -- '--doorbells' <<<"$help")" && db_modes+=("$m"); done
fi
has_serial=0
grep -q -- '--serial' <<<"$help" && has_serial=1
vnvme_devs=()
for d in "${db_modes[@]}"; do
    for p in off adaptive always; do
        [[ $d == mapped && $p != always ]] && continue
        vnvme_devs+=("vnvme-$d-$p")
    done
done
# Inline mode (--workers 0: the server's own thread runs the queues), when offered.
if grep -q -- 'inline' <<<"$(grep -A3 -- '--workers' <<<"$help")"; then
    vnvme_devs+=(vnvme-inline-off vnvme-inline-adaptive)
fi
# Shadow doorbells hidden (OACS bit 8 clear): the guest writes every doorbell register.
grep -q -- '--no-shadow-doorbells' <<<"$help" && vnvme_devs=(vnvme-noshadow-off "${vnvme_devs[@]}")
# A client without posted writes (QEMU's x-no-posted-writes=on).
vnvme_devs+=(vnvme-trapped-off-nopost vnvme-trapped-adaptive-nopost)
if [[ -z $devices ]]; then
    # --pair alone runs only the pairs.
    [[ ${#pair_list[@]} -gt 0 ]] || devices="$ALL_QEMU ${vnvme_devs[*]} null_blk"
fi
[[ $devices != backends ]] || devices="qemu-nvme qemu-nvme-disk vnvme-file-tmpfs vnvme-file-disk vnvme-chain-tmpfs"
[[ $devices != netstore ]] || devices="qemu-nvme-nbd virtio-blk-nbd vnvme-nbd vnvme-nbd-off qemu-nvme-rbd virtio-blk-rbd vnvme-rbd vnvme-rbd-off"
[[ $devices != nopost ]] || devices="vnvme-trapped-off vnvme-trapped-adaptive vnvme-trapped-off-nopost vnvme-trapped-adaptive-nopost"
if [[ $devices == zns ]]; then
    devices=""
    pair_list+=(qemu-nvme-zns:vnvme-zns)
fi
if [[ $devices == pi ]]; then
    devices=""
    pair_list+=(qemu-nvme-pi:vnvme-pi)
fi
if [[ $devices == pi64 ]]; then
    devices=""
    pair_list+=(qemu-nvme-pi64:vnvme-pi64)
fi
if [[ $devices == polling ]]; then
    devices="vnvme-trapped-off vnvme-trapped-adaptive"
    pair_list+=(vnvme-trapped-off:vnvme-trapped-adaptive)
fi

# vnvme_ram_dev NAME: a vnvme device on a RAM namespace (vnvme-<doorbells>-<poll>[-nopost]):
# sets vr_dbm, vr_poll, vr_nopost. These and the four QEMU tmpfs devices can share a guest.
vnvme_ram_dev() {
    local rest=${1#vnvme-}
    [[ $1 == vnvme-* ]] || return 1
    vr_nopost=0 vr_base=0
    if [[ $rest == *-nopost ]]; then vr_nopost=1 rest=${rest%-nopost}; fi
    if [[ $rest == *-base ]]; then vr_base=1 rest=${rest%-base}; fi
    vr_dbm=${rest%-*} vr_poll=${rest##*-}
    [[ $rest == *-* ]] || return 1
    case $vr_dbm in trapped | eventfd | mapped | inline | noshadow) ;; *) return 1 ;; esac
    case $vr_poll in off | adaptive | always) ;; *) return 1 ;; esac
}
pairable() {
    case $1 in
    qemu-nvme | qemu-nvme-ioeventfd | virtio-blk | virtio-blk-iothread | qemu-nvme-zns | vnvme-zns) return 0 ;;
    qemu-nvme-pi | vnvme-pi | qemu-nvme-pi64 | vnvme-pi64) return 0 ;;
    esac
    vnvme_ram_dev "$1"
}
# The guests, one per entry: "DEV" (alone) or "A+B" (a pair: ratio B/A).
guests=()
for dev in $devices; do
    if [[ $reference != none ]] && vnvme_ram_dev "$dev"; then
        guests+=("$reference+$dev")
    else
        guests+=("$dev")
    fi
done
for p in "${pair_list[@]}"; do
    [[ $p == *:* ]] || die "--pair $p: expected A:B"
    a=${p%%:*} b=${p#*:}
    if ! pairable "$a" || ! pairable "$b"; then
        die "--pair $p: A and B must be QEMU tmpfs devices or vnvme RAM devices (see --help)"
    fi
    [[ $a != "$b" ]] || die "--pair $p: A and B are the same device"
    [[ $has_serial == 1 || $a != vnvme-* || $b != vnvme-* ]] || die "--pair $p: two vnvme devices in one guest need vnvme serve --serial"
    guests+=("$a+$b")
done
[[ ${#guests[@]} -gt 0 ]] || die "nothing to run"
npoints=$(wc -w <<<"$points")

# Network storage: the servers, a QEMU with block-rbd (for every device of such a
# run, so QEMU is the same on both sides), a Ceph cluster for the run.
nbd_bin="" ceph_bin="" rbd_env=()
if [[ " $devices " == *-nbd\ * || " $devices " == *-rbd\ * ]]; then
    VNVME_QEMU=$("$here/fetch-qemu-rbd.sh") || die "could not fetch QEMU with block-rbd"
    export VNVME_QEMU
fi
if [[ " $devices " == *-nbd\ * ]]; then
    nbd_bin=$("$here/fetch-nbd-servers.sh") || die "could not fetch qemu-nbd"
fi
if [[ " $devices " == *-rbd\ * ]]; then
    ceph_bin=$("$here/fetch-ceph.sh") || die "could not fetch Ceph"
    CEPH_DIR="$work/ceph"
    "$here/ceph-cluster.sh" start "$CEPH_DIR" >"$work/ceph-start.log" 2>&1 ||
        die "the Ceph cluster did not start ($(tail -1 "$work/ceph-start.log"))"
    # shellcheck disable=SC1091 # generated by fetch-ceph.sh
    rbd_env=(env "$(. "$ceph_bin/../env.sh" && printf 'VNVME_LIBRBD=%s' "$VNVME_LIBRBD")"
        "$(. "$ceph_bin/../env.sh" && printf 'LD_LIBRARY_PATH=%s' "$LD_LIBRARY_PATH")")
fi

# QEMU's drives: tmpfs files; O_DIRECT if tmpfs takes it.
bytes=$(numfmt --from=iec "$size")
truncate -s "$bytes" "$img"
if dd if=/dev/zero of="$img" bs=4096 count=1 oflag=direct conv=notrunc status=none 2>/dev/null; then
    drive_cache="cache=none,aio=io_uring"
else
    drive_cache="cache=writeback,aio=io_uring"
fi
drive_of() { echo "file=$1,if=none,id=$2,format=raw,$drive_cache"; } # IMAGE ID
drive=$(drive_of "$img" d0)
[[ $(stat -f -c %T "$disk_dir") != tmpfs ]] || die "--disk-dir $disk_dir is tmpfs; the disk runs need a disk"
drive_disk="file=$disk_img,if=none,id=d0,format=raw,cache=none,aio=io_uring"

qemu_bin=${VNVME_QEMU:-$VNVME_GUEST_DIR/qemu}
qemu_ver=$("$qemu_bin" --version | head -1)
if [[ " ${guests[*]} " == *-nopost* ]] && ! "$qemu_bin" -device vfio-user-pci,help 2>/dev/null | grep -q 'x-no-posted-writes'; then
    die "this QEMU's vfio-user-pci has no x-no-posted-writes property (needed by the -nopost devices)"
fi
kver=$(cat "$(kernel_dir "$kernel")/KVER")
neigh_desc=""
[[ $neighbour == 0 ]] || neigh_desc="one CPU-bound process on the host during every guest (python3 -c 'while True: pass', unpinned, nice 0; started before the boot, killed after the guest ends)"
design="single: one guest per device, no pairs"
[[ " ${guests[*]}" != *+* ]] || design="paired: each pair's two devices attached to one guest; every repetition of every point runs on both, the first device of the pair first on odd repetitions and the second first on even ones; a vnvme server that spins when idle (--poll always) is stopped (SIGSTOP) while the other device runs"
# The host's description comes from the reports' shared module, so every
# benchmark describes a machine the same way; it prints "CPU (N cpus)".
host_desc=$(python3 - "$VNVME_ROOT/scripts/lib" "$out/meta.json" "$stamp" "$qemu_ver" "$accel" "$kver" \
    "$VNVME_BIN" "$runtime" "$reps" "$size" "$points" "$drive" "$img" "$(stat -f -c %T "$disk_dir")" \
    "$reference" "$neigh_desc" "$design" "$COMMAND_LINE" "$baseline_bin" "${guests[@]}" <<'EOF'
import json, os, sys
(lib, out, stamp, qemu, accel, kver, vnvme_bin, runtime, reps, size, points, drive, img, disk_fs,
 reference, neighbour, design, command, baseline_bin, *guests) = sys.argv[1:]
sys.path.insert(0, lib)
from vnvme_report import DISTURBED_OTHER_CPUS, DISTURBED_STEAL, BOOTSTRAP_MIN_PAIRS, host, machine, version
h = host()
json.dump({
    "machine": machine(os.path.dirname(os.path.dirname(lib.rstrip("/")))),
    "timestamp_utc": stamp,
    "command": command.replace(os.path.dirname(lib.rstrip("/")) + "/", "scripts/"),
    "qemu": qemu,
    "accel": accel,
    "guest_kernel": kver,
    "guest": "2 vCPUs, 1 GiB (memory-backend-memfd, share=on), q35",
    "host_cpu": h["cpu_model"],
    "host_cpus": h["cpus_usable"],
    "host_kernel": h["kernel"],
    "clk_tck": os.sysconf("SC_CLK_TCK"),
    "vnvme": version(vnvme_bin),
    "vnvme_baseline": version(baseline_bin) if baseline_bin else None,
    "runtime_s": json.loads(runtime),
    "reps": json.loads(reps),
    "size": size,
    "points": points.split(),
    "qemu_drive": drive.replace(img, "/dev/shm/<tmp>.img"),
    "disk_fs": disk_fs,
    "reference": reference,
    "guests": guests,
    "design": design,
    "neighbour": neighbour,
    "disturbance": {"steal_above": DISTURBED_STEAL, "other_cpus_above": DISTURBED_OTHER_CPUS,
                    "source": "host /proc/stat at the start and end mark of every run; other load = busy CPU "
                              "time (without steal) minus the CPU time of QEMU, the vnvme servers and the "
                              "neighbour (schedstat), over the wall time"},
    "interval": f"with >= {BOOTSTRAP_MIN_PAIRS} pairs: seeded percentile bootstrap 90 % interval of the median "
                "of the paired ratios; else min-max of the ratios",
    "note": "TCG: the guest's CPUs are emulated, so these numbers mostly measure TCG, not the devices." if accel == "tcg" else "",
}, open(out, "w"), indent=2)
print(f"{h['cpu_model']} ({h['cpus_usable']} cpus)")
EOF
)
echo "QEMU: $qemu_ver ($qemu_bin); accel $accel; guest kernel $kver; host CPU: $host_desc"
echo "vnvme: $("$VNVME_BIN" --version 2>/dev/null | head -1) ($VNVME_BIN)"
[[ -z $baseline ]] || echo "vnvme baseline (-base devices): $("$baseline_bin" --version 2>/dev/null | head -1) ($baseline)"
[[ $accel != tcg ]] || echo "NOTE: TCG (no usable KVM here): the guest CPUs are emulated; these numbers mostly measure TCG."
echo "knobs: --reps $reps --runtime $runtime --size $size --points '${points// /,}' --reference $reference" \
    "--neighbour $([[ $neighbour == 1 ]] && echo on || echo off) --kernel $kernel --accel $accel; drive: $drive_cache"
echo "guests (one boot each; A+B = a pair, ratio B/A): ${guests[*]}"
[[ $neighbour == 0 ]] || echo "neighbour: $neigh_desc"

# bench_watch DIR GUESTDIR PIDFILE...: copy stdin (the guest's console) to
# stdout and act on its lines. At a "@@VNVME-MARK NAME@@" it saves into DIR
# (see scripts/lib/guest-host.sh for the protocol of the marks):
#   NAME.host    the host's /proc/stat (vn_cpu_ticks: busy steal total) and the time
#   NAME.pids    "LABEL PID" per PIDFILE (LABEL: its name without .pid)
#   NAME.cpu     "PID TID NS COMM" per thread of those processes (schedstat)
#   NAME.stats0-S / NAME.stats1-S  copies of slot S's --stats-file, at once and 0.7 s later
# "@@BENCH-PAUSE S@@" / "@@BENCH-RESUME S@@" stop / continue slot S's server.
bench_watch() {
    local dir=$1 gd=$2 line name f s sig have
    shift 2
    mkdir -p "$dir"
    while IFS= read -r line; do
        printf '%s\n' "$line"
        if [[ $line =~ @@BENCH-(PAUSE|RESUME)\ ([ab])@@ ]]; then
            sig=STOP
            [[ ${BASH_REMATCH[1]} == PAUSE ]] || sig=CONT
            f="$gd/vnvme-${BASH_REMATCH[2]}.pid"
            if [[ -s $f ]] && kill -"$sig" "$(cat "$f")" 2>/dev/null; then
                printf '[host] SIG%s to vnvme server %s\n' "$sig" "${BASH_REMATCH[2]}"
            fi
            continue
        fi
        [[ $line =~ @@VNVME-MARK\ ([A-Za-z0-9_.-]+)@@ ]] || continue
        name=${BASH_REMATCH[1]}
        printf '%s %s\n' "$(vn_cpu_ticks)" "$(date +%s.%N)" >"$dir/$name.host"
        vn_mark_processes "$dir/$name" "$@"
        # cat, not cp: the server replaces the file by rename twice a second.
        have=0
        for s in a b; do
            [[ -f $gd/stats-$s.json ]] || continue
            cat "$gd/stats-$s.json" >"$dir/$name.stats0-$s"
            have=1
        done
        [[ $have == 1 ]] || continue
        sleep 0.7
        for s in a b; do
            [[ ! -f $gd/stats-$s.json ]] || cat "$gd/stats-$s.json" >"$dir/$name.stats1-$s"
        done
    done
}

# slot_vfio_args SOCKET IDX [nopost]: vn_device_args on root port rpIDX.
slot_vfio_args() {
    local a
    vn_device_args "$1" "${3:-}"
    for a in "${VN_DEV_ARGS[@]}"; do
        a=${a//id=rp0,chassis=1/id=rp$2,chassis=$(($2 + 1))}
        qargs+=("${a//\"bus\":\"rp0\"/\"bus\":\"rp$2\"}")
    done
}

# setup_slot DEV SLOT IDX DIR: the QEMU arguments of device DEV as slot SLOT
# (a or b; IDX 0 or 1: root port rpIDX, drive dIDX) of the guest in DIR
# (appended to qargs), its lines in DIR/config.sh and DIR/slots.tsv, and its
# vnvme server(s), started (pid in DIR/vnvme-SLOT.pid). Returns 1 on failure.
setup_slot() {
    local dev=$1 s=$2 i=$3 d=$4 kind=nvme desc backing serve=() serial pause=0 sim=$img base=0 zoned=0
    serial="bench-$s"
    [[ $s == a ]] || sim=$img_b
    local sdrive rp="bus=rp$i"
    sdrive=$(drive_of "$sim" "d$i")
    case $dev in
    qemu-nvme | qemu-nvme-ioeventfd | virtio-blk | virtio-blk-iothread | qemu-nvme-disk | qemu-nvme-zns | qemu-nvme-pi | qemu-nvme-pi64)
        qargs+=(-device "pcie-root-port,id=rp$i,chassis=$((i + 1))")
        local img_bytes=$bytes
        case $dev in
        qemu-nvme-pi)
            qargs+=(-drive "$sdrive" -device "nvme,serial=$serial,id=nvp$i,$rp"
                -device "nvme-ns,drive=d$i,bus=nvp$i,nsid=1,ms=8,pi=1")
            # Its metadata follows the data in the image: 8 bytes per 512.
            img_bytes=$((bytes / 512 * 520))
            desc="QEMU nvme, type 1 PI (ms=8,pi=1)" backing="$drive_cache, tmpfs file" ;;
        qemu-nvme-pi64)
            qargs+=(-drive "$sdrive" -device "nvme,serial=$serial,id=nvp$i,$rp"
                -device "nvme-ns,drive=d$i,bus=nvp$i,nsid=1,ms=16,pi=1,pif=2")
            # Its metadata follows the data in the image: 16 bytes per 512.
            img_bytes=$((bytes / 512 * 528))
            desc="QEMU nvme, type 1 PI, 64-bit guard (ms=16,pi=1,pif=2)" backing="$drive_cache, tmpfs file" ;;
        qemu-nvme-zns)
            qargs+=(-drive "$sdrive" -device "nvme,serial=$serial,id=nvz$i,$rp"
                -device "nvme-ns,drive=d$i,bus=nvz$i,nsid=1,zoned=true,zoned.zone_size=$ZNS_ZONE,zoned.zone_capacity=$ZNS_ZONE")
            zoned=1 desc="QEMU nvme, zoned ($ZNS_ZONE zones)" backing="$drive_cache, tmpfs file" ;;
        qemu-nvme)
            qargs+=(-drive "$sdrive" -device "nvme,serial=$serial,drive=d$i,$rp")
            desc="QEMU nvme" backing="$drive_cache, tmpfs file" ;;
        qemu-nvme-ioeventfd)
            qargs+=(-drive "$sdrive" -device "nvme,serial=$serial,drive=d$i,$rp,ioeventfd=on")
            desc="QEMU nvme, ioeventfd=on" backing="$drive_cache, tmpfs file" ;;
        virtio-blk)
            qargs+=(-drive "$sdrive" -device "virtio-blk-pci,drive=d$i,$rp,serial=$serial")
            kind=virtio desc="QEMU virtio-blk-pci" backing="$drive_cache, tmpfs file" ;;
        virtio-blk-iothread)
            qargs+=(-object "iothread,id=iot$i" -drive "$sdrive" -device "virtio-blk-pci,drive=d$i,$rp,serial=$serial,iothread=iot$i")
            kind=virtio desc="QEMU virtio-blk-pci, iothread" backing="$drive_cache, tmpfs file" ;;
        qemu-nvme-disk)
            qargs+=(-drive "$drive_disk" -device "nvme,serial=$serial,drive=d0,bus=rp0")
            desc="QEMU nvme" backing="cache=none,aio=io_uring, file on disk" ;;
        esac
        # A fresh (sparse) image for every QEMU device; the guest fills it first.
        rm -f "$sim"
        truncate -s "$img_bytes" "$sim"
        if [[ $dev == qemu-nvme-disk ]]; then
            rm -f "$disk_img"
            truncate -s "$bytes" "$disk_img"
        fi ;;
    vnvme-file-tmpfs | vnvme-file-disk | vnvme-chain-tmpfs)
        local f=$img where=tmpfs
        [[ $dev != *-disk ]] || f=$disk_img where=disk
        rm -f "$f"
        truncate -s "$bytes" "$f"
        serve=(--workers 1 --poll adaptive --once --stats-file "$d/stats-$s.json" --log info)
        if [[ $dev == vnvme-chain-* ]]; then
            # The back end: a plain file namespace, serving the front (not --once:
            # stopped after the run).
            vn_serve_start "$d/back.log" "$d/back.sock" --ns "file:$f" --workers 1 --poll adaptive \
                --doorbells eventfd --log info || { echo "FAILED: $dev: back server did not start"; return 1; }
            BACK_PID=$VN_PID
            echo "$BACK_PID" >"$d/vnvme-back.pid"
            serve=(--ns "nvme://$d/back.sock" "${serve[@]}")
            desc="vnvme nvme:// -> vnvme file ($where), doorbells trapped, poll adaptive"
        else
            serve=(--ns "file:$f" "${serve[@]}")
            desc="vnvme file backend, doorbells trapped, poll adaptive"
        fi
        slot_vfio_args "$d/vnvme-$s.sock" "$i"
        backing="file on $where" ;;
    qemu-nvme-nbd | virtio-blk-nbd | vnvme-nbd | vnvme-nbd-off)
        # qemu-nbd on a fresh raw tmpfs file, for this device only.
        rm -f "$img"
        truncate -s "$bytes" "$img"
        "$nbd_bin/qemu-nbd" --format raw --shared 8 --persistent --cache=writeback --aio=threads \
            --socket "$d/nbd.sock" "$img" >"$d/qemu-nbd.log" 2>&1 &
        NBD_PID=$!
        local k
        for ((k = 0; k < 100; k++)); do [[ -S $d/nbd.sock ]] && break; sleep 0.1; done
        [[ -S $d/nbd.sock ]] || { echo "FAILED: $dev: qemu-nbd did not start"; return 1; }
        backing="qemu-nbd $("$nbd_bin/qemu-nbd" --version | head -1 | awk '{print $2}'), raw file on tmpfs"
        local bd=(-blockdev "driver=nbd,node-name=d0,server.type=unix,server.path=$d/nbd.sock")
        case $dev in
        qemu-nvme-nbd)
            qargs+=(-device "pcie-root-port,id=rp0,chassis=1" "${bd[@]}" -device "nvme,serial=$serial,drive=d0,bus=rp0")
            desc="QEMU nvme, QEMU's NBD client" ;;
        virtio-blk-nbd)
            qargs+=(-device "pcie-root-port,id=rp0,chassis=1" "${bd[@]}" -device "virtio-blk-pci,drive=d0,bus=rp0,serial=$serial")
            kind=virtio desc="QEMU virtio-blk-pci, QEMU's NBD client" ;;
        vnvme-nbd*)
            local poll=adaptive
            [[ $dev != *-off ]] || poll=off
            serve=(--ns "nbd+unix:///?socket=$d/nbd.sock" --workers 1 --poll "$poll" --once --stats-file "$d/stats-$s.json" --log info)
            slot_vfio_args "$d/vnvme-$s.sock" "$i"
            desc="vnvme nbd:// backend, doorbells trapped, poll $poll" ;;
        esac ;;
    qemu-nvme-rbd | virtio-blk-rbd | vnvme-rbd | vnvme-rbd-off)
        CEPH_CONF=$CEPH_DIR/ceph.conf "$ceph_bin/rbd" rm --no-progress rbd/bench >/dev/null 2>&1 || true
        CEPH_CONF=$CEPH_DIR/ceph.conf "$ceph_bin/rbd" create --size "$size" rbd/bench ||
            { echo "FAILED: $dev: rbd create"; return 1; }
        local cver qver
        cver=$(head -1 "$ceph_bin/../VERSION" 2>/dev/null | sed 's/^ceph //')
        qver=$(grep '^librbd1' "$(dirname "$(dirname "$(readlink -f "$VNVME_QEMU")")")/VERSION" 2>/dev/null | cut -d' ' -f2)
        backing="single-node Ceph $cver (memstore OSD), image rbd/bench; librbd: QEMU's $qver, vnvme's ${cver%% *}"
        local bd=(-blockdev "driver=rbd,node-name=d0,pool=rbd,image=bench,conf=$CEPH_DIR/ceph.conf,user=vnvme,cache.direct=off")
        case $dev in
        qemu-nvme-rbd)
            qargs+=(-device "pcie-root-port,id=rp0,chassis=1" "${bd[@]}" -device "nvme,serial=$serial,drive=d0,bus=rp0")
            desc="QEMU nvme, QEMU's rbd driver" ;;
        virtio-blk-rbd)
            qargs+=(-device "pcie-root-port,id=rp0,chassis=1" "${bd[@]}" -device "virtio-blk-pci,drive=d0,bus=rp0,serial=$serial")
            kind=virtio desc="QEMU virtio-blk-pci, QEMU's rbd driver" ;;
        vnvme-rbd*)
            local poll=adaptive
            [[ $dev != *-off ]] || poll=off
            serve=(--ns "rbd:rbd/bench:conf=$CEPH_DIR/ceph.conf:id=vnvme:keyring=$CEPH_DIR/ceph.client.vnvme.keyring"
                --workers 1 --poll "$poll" --once --stats-file "$d/stats-$s.json" --log info)
            slot_vfio_args "$d/vnvme-$s.sock" "$i"
            desc="vnvme rbd: backend, doorbells trapped, poll $poll" ;;
        esac ;;
    vnvme-pi)
        # vnvme's defaults, as the main table's "vnvme (default)", with type 1 PI.
        serve=(--ns "ram:$size:ms=8:pi=1" --once --stats-file "$d/stats-$s.json" --log info)
        slot_vfio_args "$d/vnvme-$s.sock" "$i"
        desc="vnvme, type 1 PI (ms=8:pi=1), default doorbells and polling" backing="ram:$size:ms=8:pi=1 (vnvme RAM namespace, metadata in memory)" ;;
    vnvme-pi64)
        # The same with the 64-bit guard format.
        serve=(--ns "ram:$size:ms=16:pi=1:guard=64" --once --stats-file "$d/stats-$s.json" --log info)
        slot_vfio_args "$d/vnvme-$s.sock" "$i"
        desc="vnvme, type 1 PI, 64-bit guard (ms=16:pi=1:guard=64), default doorbells and polling" backing="ram:$size:ms=16:pi=1:guard=64 (vnvme RAM namespace, metadata in memory)" ;;
    vnvme-zns)
        # vnvme's defaults, as the main table's "vnvme (default)", on a zoned RAM namespace.
        serve=(--ns "ram:$size:zoned=$ZNS_ZONE" --once --stats-file "$d/stats-$s.json" --log info)
        slot_vfio_args "$d/vnvme-$s.sock" "$i"
        zoned=1 desc="vnvme, zoned ($ZNS_ZONE zones), default doorbells and polling" backing="ram:$size:zoned=$ZNS_ZONE (vnvme RAM namespace)" ;;
    vnvme-*)
        vnvme_ram_dev "$dev" || die "unknown device $dev"
        local dbm=$vr_dbm workers=1 extra=""
        if [[ $dbm == inline ]]; then
            # No worker threads: the server's main thread runs the queues itself.
            workers=0 dbm=trapped extra=", inline (0 workers)"
        fi
        serve=(--ns "ram:$size" --workers "$workers" --poll "$vr_poll" --once --stats-file "$d/stats-$s.json" --log info)
        if [[ $dbm == noshadow ]]; then
            serve+=(--no-shadow-doorbells)
            dbm=trapped extra=", shadow doorbells off"
        fi
        grep -q -- '--doorbells' <<<"$help" && serve+=(--doorbells "$dbm")
        if [[ $vr_base == 1 ]]; then
            [[ -n $baseline ]] || die "$dev runs on --baseline, and none was given"
            base=1 extra="$extra; baseline build"
        fi
        if [[ $vr_nopost == 1 ]]; then
            slot_vfio_args "$d/vnvme-$s.sock" "$i" nopost
            extra="$extra; QEMU vfio-user-pci x-no-posted-writes=on"
        else
            slot_vfio_args "$d/vnvme-$s.sock" "$i"
        fi
        # A server that spins when idle is stopped while the other device runs.
        [[ $vr_poll != always ]] || pause=1
        desc="vnvme, doorbells $dbm, poll $vr_poll$extra" backing="ram:$size (vnvme RAM namespace)" ;;
    null_blk)
        kind=nullb desc="guest null_blk (irqmode=0)" backing="none (in-guest null_blk)" serial="" ;;
    *) die "unknown device $dev" ;;
    esac
    if [[ ${#serve[@]} -gt 0 ]]; then
        if [[ $has_serial == 1 ]]; then serve+=(--serial "$serial"); else serial=VNVME0001; fi
        local wrap=("${VN_WRAP[@]}")
        [[ $dev != vnvme-rbd* ]] || VN_WRAP=("${rbd_env[@]}" "${wrap[@]}")
        local bin=$VNVME_BIN
        [[ $base != 1 ]] || VNVME_BIN=$baseline_bin
        vn_serve_start "$d/serve-$s.log" "$d/vnvme-$s.sock" "${serve[@]}" || { VN_WRAP=("${wrap[@]}"); VNVME_BIN=$bin; echo "FAILED: $dev: server did not start"; return 1; }
        VN_WRAP=("${wrap[@]}") VNVME_BIN=$bin
        SERVER_PIDS+=("$VN_PID")
        echo "$VN_PID" >"$d/vnvme-$s.pid"
        grep -a '^vnvme: serving' "$d/serve-$s.log" | sed "s/^/  $s: /"
        # What the server actually opened (backend kind, engine, LBA, cache), from its
        # own startup line, for the record (the back end's for a chain).
        local ns_line
        ns_line=$(grep -a -m1 '^vnvme: namespace 1:' "$d/back.log" 2>/dev/null || grep -a -m1 '^vnvme: namespace 1:' "$d/serve-$s.log")
        [[ -z $ns_line ]] || backing="$backing; server: ${ns_line#vnvme: namespace 1: }"
    fi
    local prefill=1
    [[ $kind != nullb ]] || prefill=0
    printf 'KIND_%s=%s\nSERIAL_%s=%s\nPREFILL_%s=%s\nPAUSE_%s=%s\nZONED_%s=%s\n' "$s" "$kind" "$s" "$serial" \
        "$s" "$prefill" "$s" "$pause" "$s" "$zoned" >>"$d/config.sh"
    printf '%s\t%s\t%s\t%s\t%s\t%s\n' "$s" "$dev" "$desc" "$backing" "$serial" "$pause" >>"$d/slots.tsv"
}

# run_guest GUEST: boot one guest with GUEST's device(s) ("DEV" or "A+B") and
# run every point --reps times on each; raw data to $out/raw/GUEST/.
run_guest() {
    local g=$1 d="$work/$1" devs=() slots=() i t0 rc s tmo
    IFS=+ read -r -a devs <<<"$g"
    slots=(a b)
    slots=("${slots[@]:0:${#devs[@]}}")
    mkdir -p "$d"
    t0=$(date +%s)
    qargs=() SERVER_PIDS=()
    cat >"$d/config.sh" <<EOF
RUNTIME=$runtime
REPS=$reps
POINTS="$points"
DEVS="${slots[*]}"
EOF
    : >"$d/slots.tsv"
    echo
    echo "== $g"
    for i in "${!devs[@]}"; do
        setup_slot "${devs[$i]}" "${slots[$i]}" "$i" "$d" || { stop_servers; return 1; }
    done
    # Image paths are this machine's: the record says which kind of file it was.
    python3 - "$g" "$neighbour" "$d/slots.tsv" "${qargs[@]}" <<'EOF' |
import json, sys
g, neighbour, slots, *qargs = sys.argv[1:]
rows = [l.rstrip("\n").split("\t") for l in open(slots) if l.strip()]
print(json.dumps({
    "guest": g, "design": "paired" if len(rows) == 2 else "single", "neighbour": neighbour == "1",
    "slots": [{"slot": r[0], "device": r[1], "desc": r[2], "backing": r[3], "serial": r[4],
               "paused_when_idle": r[5] == "1"} for r in rows],
    "qemu_args": qargs}))
EOF
        sed "s|$disk_img|<disk-dir>/<tmp>.img|g; s|$img_b|/dev/shm/<tmp>.b.img|g; s|$img|/dev/shm/<tmp>.img|g; s|$work/|<work>/|g" >"$d/device.json"
    while IFS=$'\t' read -r s dev desc backing _; do
        echo "  $s: $dev: $desc [$backing]"
    done <"$d/slots.tsv"
    if [[ $neighbour == 1 ]]; then
        python3 -c 'while True: pass' &
        NEIGH_PID=$!
        echo "$NEIGH_PID" >"$d/neighbour.pid"
        echo "  neighbour: pid $NEIGH_PID (CPU-bound)"
    fi
    # Bounded: boot and prefill, then every run with its marks (about runtime + 5 s).
    tmo=$((900 + ${#devs[@]} * reps * npoints * (runtime + 8)))
    cur_qemu_pidfile="$d/qemu.pid"
    # In the background + wait, so that INT/TERM run the trap at once.
    {
        brc=0
        "$VNVME_GUEST_DIR/boot.sh" --kernel "$kernel" --accel "$accel" --timeout "$tmo" \
            --append "vnvme.skip=null_blk" --run "$VNVME_GUEST_DIR/bench/guest-bench.sh" \
            --add "$d/config.sh:/bench/config.sh" -- -pidfile "$d/qemu.pid" "${qargs[@]}" || brc=$?
        echo "$brc" >"$d/boot.rc"
    } 2>&1 | bench_watch "$d/marks" "$d" "$d/qemu.pid" "$d/vnvme-a.pid" "$d/vnvme-b.pid" "$d/vnvme-back.pid" \
        "$d/neighbour.pid" >"$d/serial.log" &
    wait $! || true
    rc=$(cat "$d/boot.rc" 2>/dev/null || echo 125)
    cur_qemu_pidfile=""
    stop_neighbour
    for s in "${slots[@]}"; do
        [[ -s $d/vnvme-$s.pid ]] || continue
        kill -CONT "$(cat "$d/vnvme-$s.pid")" 2>/dev/null || true
        vn_serve_wait "$(cat "$d/vnvme-$s.pid")" 10 || true
        sed -n 's/^vnvme: //p' "$d/serve-$s.log" | tail -1 | sed "s/^/  server $s: /"
    done
    stop_servers
    if [[ -n $NBD_PID ]]; then
        kill "$NBD_PID" 2>/dev/null
        wait "$NBD_PID" 2>/dev/null
        NBD_PID=""
    fi
    grep -a '@@RESULT' "$d/serial.log" | sed 's/^/  /; s/@@//g' || true
    if [[ $rc -ne 0 ]] || ! grep -qa '@@BENCH-DONE@@' "$d/serial.log"; then
        echo "  FAILED: $g (boot.sh status $rc; serial log $d/serial.log)"
        grep -a 'BENCH-ERROR' "$d/serial.log" || tail -n 20 "$d/serial.log"
    fi
    echo "  $g: $(($(date +%s) - t0)) s"
    mkdir -p "$out/raw/$g"
    cp -r "$d/serial.log" "$d/device.json" "$d/marks" "$out/raw/$g/" 2>/dev/null || true
    # Server logs name the work directory (sockets, files): keep it out of the results.
    local log
    for log in serve-a.log serve-b.log back.log; do
        [[ ! -f $d/$log ]] || sed "s|$work|<work>|g; s|$disk_img|<disk>.img|g" "$d/$log" >"$out/raw/$g/$log"
    done
    return 0
}

# What else is running (this machine may be shared): before the first guest and
# after each one, the busiest processes (program names, not where they live).
snapshot() {
    {
        echo "# $1 $(date -u '+%Y-%m-%d %H:%M:%S UTC')"
        echo "loadavg: $(cat /proc/loadavg)"
        ps -eo pid,pcpu,etime,args --sort=-pcpu | head -8 | sed -E 's#(^|[ =:])/([^ /]+/)*#\1#g' | cut -c1-200
    } >>"$out/environment.txt"
}
snapshot start
for g in "${guests[@]}"; do
    run_guest "$g"
    snapshot "after $g"
done
python3 "$here/bench-guest.py" "$out"
# Keep the raw data small: gzip the logs, one tarball per guest for the marks.
gzip -9f "$out"/raw/*/serial.log "$out"/raw/*/serve*.log 2>/dev/null || true
for m in "$out"/raw/*/marks; do
    [[ -d $m ]] && tar -C "$(dirname "$m")" -czf "$m.tar.gz" marks && rm -r "$m"
done
python3 "$here/bench-guest.py" "$out" >/dev/null # still readable
echo
log "$(($(date +%s) - T0)) s; results: $out/{results.md,results.json,chart.svg}"
