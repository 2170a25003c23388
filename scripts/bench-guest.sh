#!/usr/bin/env bash
# Guest benchmark: the same guest kernel + initramfs booted on QEMU's nvme
# (with and without ioeventfd), virtio-blk (with and without an iothread),
# vnvme over vfio-user-pci in each doorbell and polling mode, and the guest's
# own null_blk (the ceiling). fio 4 KiB randread at QD 1, 4, 16, 64 and
# randwrite at QD 16, each repeated. Writes JSON, markdown and an SVG chart
# under results/guest-bench/<UTC timestamp>/. A benchmark, not a test: never
# run by scripts/test.sh.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=scripts/guest/lib.sh
source "$here/guest/lib.sh"
# shellcheck source=scripts/guest/host-lib.sh
source "$here/guest/host-lib.sh"

ALL_QEMU="qemu-nvme qemu-nvme-ioeventfd virtio-blk virtio-blk-iothread"

usage() {
    cat <<EOF
Usage: ${0##*/} [--kernel K] [--accel A] [--runtime S] [--reps N] [--size SIZE]
                [--devices LIST] [--points LIST] [--out DIR] [--no-fetch] [--no-build]

Devices (--devices, comma separated; default: all of them):
  qemu-nvme             -device nvme (QEMU's NVMe; ioeventfd=off, its default)
  qemu-nvme-ioeventfd   -device nvme,ioeventfd=on
  virtio-blk            -device virtio-blk-pci (ioeventfd on, 1 queue per vCPU)
  virtio-blk-iothread   the same with -object iothread (iothread=iot0)
    all four on -drive file=/dev/shm/<tmp>.img,format=raw,cache=none,aio=io_uring:
    a RAM-backed file (tmpfs). If the host's tmpfs refuses O_DIRECT, cache=writeback
    is used instead, and the JSON says so.
  vnvme-<doorbells>-<poll>  \`vnvme serve --ns ram:SIZE --workers 1\` (sparse RAM
    namespace) over -device vfio-user-pci, for every --doorbells mode the binary
    offers (trapped, eventfd, mapped; mapped polls, so only with --poll always)
    and every --poll mode (off, adaptive, always). The guest enables shadow
    doorbells in every case (Linux has no knob to turn DBBUF off).
  vnvme-inline-<poll>   the same with --workers 0 (inline: the server's own
    thread runs the queues) and trapped doorbells, poll off and adaptive
  vnvme-noshadow-off    --no-shadow-doorbells (OACS bit 8 hidden): the guest
    writes every doorbell register; the baseline for what shadow doorbells save
  null_blk              no device: modprobe null_blk queue_mode=2 irqmode=0
                        (completes in the submitting context; the guest's ceiling)
  Backends (the file backend against QEMU on the same kind of file):
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
  with its block-rbd module):
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

Every device is filled first with sequential 128 KiB writes (so reads hit
allocated memory), except null_blk. Points (--points): randread:1 randread:4
randread:16 randread:64 randwrite:16 (4 KiB, direct, io_uring, --runtime
seconds each, --reps times, interleaved). Collected per point: fio's IOPS,
mean and p99 completion latency (lat_ns, JSON), guest CPU busy (/proc/stat in
the guest, all vCPUs), guest interrupts per I/O (/proc/interrupts), CPU time
per I/O of the vnvme process and of QEMU's non-vCPU threads
(/proc/PID/task/*/schedstat between marks), and for vnvme its own counters
(--stats-file: trapped doorbell writes and interrupts per I/O).

  --kernel K     guest kernel (default newest)
  --accel A      auto | kvm | tcg (default: \$VNVME_ACCEL or auto)
  --runtime S    seconds per point (default 3)
  --reps N       repetitions of every point (default 2)
  --size SIZE    device size (default 256M)
  --out DIR      output directory (default results/guest-bench/<UTC timestamp>)
  --disk-dir D   where the "disk" image lives (default target/bench-disk in the
                 checkout; must not be tmpfs)
EOF
}

kernel=newest accel="${VNVME_ACCEL:-auto}" runtime=3 reps=2 size=256M devices="" out="" fetch=1 build=1
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
    --no-fetch) fetch=0; shift ;;
    --no-build) build=0; shift ;;
    -h | --help) usage; exit 0 ;;
    *) usage >&2; exit 2 ;;
    esac
done
need_cmds python3:python3

T0=$(date +%s)
stamp=$(date -u +%Y%m%dT%H%M%SZ)
[[ -n $out ]] || out="$VNVME_ROOT/results/guest-bench/$stamp"
mkdir -p "$out"
out=$(cd "$out" && pwd)
work=$(mktemp -d "${TMPDIR:-/tmp}/vnvme-guest-bench.XXXXXX")
img="/dev/shm/vnvme-bench.$$.img"
mkdir -p "$disk_dir"
disk_img="$(cd "$disk_dir" && pwd)/vnvme-bench.$$.img"
VN_PID="" cur_qemu_pidfile="" BACK_PID="" NBD_PID="" CEPH_DIR=""
cleanup() {
    vn_term_pidfile "$cur_qemu_pidfile"
    vn_serve_stop "$VN_PID"
    vn_serve_stop "$BACK_PID"
    [[ -z $NBD_PID ]] || { kill "$NBD_PID" 2>/dev/null; wait "$NBD_PID" 2>/dev/null; }
    [[ -z $CEPH_DIR ]] || "$here/ceph-cluster.sh" stop "$CEPH_DIR" >/dev/null 2>&1
    rm -f "$img" "$disk_img"
    rm -rf "$work" # raw data is copied to $out/raw per device
}
trap cleanup EXIT
trap 'exit 130' INT TERM

echo "bench-guest: results in $out (work files in $work, removed at exit)"
if [[ $fetch -eq 1 ]]; then
    "$VNVME_GUEST_DIR/fetch-qemu.sh"
    "$VNVME_GUEST_DIR/fetch-kernels.sh" "$kernel"
    "$VNVME_GUEST_DIR/mkinitramfs.sh" "$kernel"
fi
[[ $build -eq 0 ]] || vn_build
[[ -x $VNVME_BIN ]] || die "no vnvme binary at $VNVME_BIN"
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
[[ -n $devices ]] || devices="$ALL_QEMU ${vnvme_devs[*]} null_blk"
[[ $devices != backends ]] || devices="qemu-nvme qemu-nvme-disk vnvme-file-tmpfs vnvme-file-disk vnvme-chain-tmpfs"
[[ $devices != netstore ]] || devices="qemu-nvme-nbd virtio-blk-nbd vnvme-nbd vnvme-nbd-off qemu-nvme-rbd virtio-blk-rbd vnvme-rbd vnvme-rbd-off"

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

# QEMU's drive: a tmpfs file; O_DIRECT if tmpfs takes it.
bytes=$(numfmt --from=iec "$size")
truncate -s "$bytes" "$img"
if dd if=/dev/zero of="$img" bs=4096 count=1 oflag=direct conv=notrunc status=none 2>/dev/null; then
    drive_cache="cache=none,aio=io_uring"
else
    drive_cache="cache=writeback,aio=io_uring"
fi
drive="file=$img,if=none,id=d0,format=raw,$drive_cache"
[[ $(stat -f -c %T "$disk_dir") != tmpfs ]] || die "--disk-dir $disk_dir is tmpfs; the disk runs need a disk"
drive_disk="file=$disk_img,if=none,id=d0,format=raw,cache=none,aio=io_uring"

qemu_ver=$("${VNVME_QEMU:-$VNVME_GUEST_DIR/qemu}" --version | head -1)
kver=$(cat "$(kernel_dir "$kernel")/KVER")
# The host's description comes from the reports' shared module, so both
# benchmarks describe a machine the same way; it prints "CPU (N cpus)".
host_desc=$(python3 - "$VNVME_ROOT/scripts/lib" "$out/meta.json" "$stamp" "$qemu_ver" "$accel" "$kver" \
    "$VNVME_BIN" "$runtime" "$reps" "$size" "$points" "$drive" "$img" "$(stat -f -c %T "$disk_dir")" <<'EOF'
import json, sys
lib, out, stamp, qemu, accel, kver, vnvme_bin, runtime, reps, size, points, drive, img, disk_fs = sys.argv[1:]
sys.path.insert(0, lib)
from vnvme_report import host, version
h = host()
json.dump({
    "timestamp_utc": stamp,
    "qemu": qemu,
    "accel": accel,
    "guest_kernel": kver,
    "guest": "2 vCPUs, 1 GiB (memory-backend-memfd, share=on), q35",
    "host_cpu": h["cpu_model"],
    "host_cpus": h["cpus_usable"],
    "host_kernel": h["kernel"],
    "vnvme": version(vnvme_bin),
    "runtime_s": json.loads(runtime),
    "reps": json.loads(reps),
    "size": size,
    "points": points.split(),
    "qemu_drive": drive.replace(img, "/dev/shm/<tmp>.img"),
    "disk_fs": disk_fs,
    "note": "TCG: the guest's CPUs are emulated, so these numbers mostly measure TCG, not the devices." if accel == "tcg" else "",
}, open(out, "w"), indent=2)
print(f"{h['cpu_model']} ({h['cpus_usable']} cpus)")
EOF
)
echo "QEMU: $qemu_ver; accel $accel; guest kernel $kver; host CPU: $host_desc"
[[ $accel != tcg ]] || echo "NOTE: TCG (no usable KVM here): the guest CPUs are emulated; these numbers mostly measure TCG."
echo "devices: $devices"

run_device() { # NAME
    local dev=$1 d="$work/$1" kind=nvme desc backing qargs=() serve=() t0 rc
    mkdir -p "$d"
    t0=$(date +%s)
    qargs=(-device pcie-root-port,id=rp0,chassis=1)
    case $dev in
    qemu-nvme)
        qargs+=(-drive "$drive" -device nvme,serial=bench,drive=d0,bus=rp0)
        desc="QEMU nvme" backing="$drive_cache, tmpfs file" ;;
    qemu-nvme-ioeventfd)
        qargs+=(-drive "$drive" -device nvme,serial=bench,drive=d0,bus=rp0,ioeventfd=on)
        desc="QEMU nvme, ioeventfd=on" backing="$drive_cache, tmpfs file" ;;
    virtio-blk)
        qargs+=(-drive "$drive" -device virtio-blk-pci,drive=d0,bus=rp0)
        kind=virtio desc="QEMU virtio-blk-pci" backing="$drive_cache, tmpfs file" ;;
    virtio-blk-iothread)
        qargs+=(-object iothread,id=iot0 -drive "$drive" -device virtio-blk-pci,drive=d0,bus=rp0,iothread=iot0)
        kind=virtio desc="QEMU virtio-blk-pci, iothread" backing="$drive_cache, tmpfs file" ;;
    qemu-nvme-disk)
        qargs+=(-drive "$drive_disk" -device nvme,serial=bench,drive=d0,bus=rp0)
        desc="QEMU nvme" backing="cache=none,aio=io_uring, file on disk" ;;
    vnvme-file-tmpfs | vnvme-file-disk | vnvme-chain-tmpfs)
        local f=$img where=tmpfs
        [[ $dev != *-disk ]] || f=$disk_img where=disk
        rm -f "$f"
        truncate -s "$bytes" "$f"
        serve=(--workers 1 --poll adaptive --once --stats-file "$d/stats.json" --log info)
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
        vn_device_args "$d/vnvme.sock"
        qargs=("${VN_DEV_ARGS[@]}")
        backing="file on $where" ;;
    qemu-nvme-nbd | virtio-blk-nbd | vnvme-nbd | vnvme-nbd-off)
        # qemu-nbd on a fresh raw tmpfs file, for this device only.
        rm -f "$img"
        truncate -s "$bytes" "$img"
        "$nbd_bin/qemu-nbd" --format raw --shared 8 --persistent --cache=writeback --aio=threads \
            --socket "$d/nbd.sock" "$img" >"$d/qemu-nbd.log" 2>&1 &
        NBD_PID=$!
        local i
        for ((i = 0; i < 100; i++)); do [[ -S $d/nbd.sock ]] && break; sleep 0.1; done
        [[ -S $d/nbd.sock ]] || { echo "FAILED: $dev: qemu-nbd did not start"; return 1; }
        backing="qemu-nbd $("$nbd_bin/qemu-nbd" --version | head -1 | awk '{print $2}'), raw file on tmpfs"
        local bd=(-blockdev "driver=nbd,node-name=d0,server.type=unix,server.path=$d/nbd.sock")
        case $dev in
        qemu-nvme-nbd) qargs+=("${bd[@]}" -device nvme,serial=bench,drive=d0,bus=rp0) desc="QEMU nvme, QEMU's NBD client" ;;
        virtio-blk-nbd) qargs+=("${bd[@]}" -device virtio-blk-pci,drive=d0,bus=rp0) kind=virtio desc="QEMU virtio-blk-pci, QEMU's NBD client" ;;
        vnvme-nbd*)
            local poll=adaptive
            [[ $dev != *-off ]] || poll=off
            serve=(--ns "nbd+unix:///?socket=$d/nbd.sock" --workers 1 --poll "$poll" --once --stats-file "$d/stats.json" --log info)
            vn_device_args "$d/vnvme.sock"
            qargs=("${VN_DEV_ARGS[@]}")
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
        qemu-nvme-rbd) qargs+=("${bd[@]}" -device nvme,serial=bench,drive=d0,bus=rp0) desc="QEMU nvme, QEMU's rbd driver" ;;
        virtio-blk-rbd) qargs+=("${bd[@]}" -device virtio-blk-pci,drive=d0,bus=rp0) kind=virtio desc="QEMU virtio-blk-pci, QEMU's rbd driver" ;;
        vnvme-rbd*)
            local poll=adaptive
            [[ $dev != *-off ]] || poll=off
            serve=(--ns "rbd:rbd/bench:conf=$CEPH_DIR/ceph.conf:id=vnvme:keyring=$CEPH_DIR/ceph.client.vnvme.keyring"
                --workers 1 --poll "$poll" --once --stats-file "$d/stats.json" --log info)
            vn_device_args "$d/vnvme.sock"
            qargs=("${VN_DEV_ARGS[@]}")
            desc="vnvme rbd: backend, doorbells trapped, poll $poll" ;;
        esac ;;
    vnvme-*)
        local rest=${dev#vnvme-} dbm poll
        dbm=${rest%-*} poll=${rest##*-}
        local workers=1 shadow=""
        if [[ $dbm == inline ]]; then
            # No worker threads: the server's main thread runs the queues itself.
            workers=0 dbm=trapped shadow=", inline (0 workers)"
        fi
        serve=(--ns "ram:$size" --workers "$workers" --poll "$poll" --once --stats-file "$d/stats.json" --log info)
        if [[ $dbm == noshadow ]]; then
            serve+=(--no-shadow-doorbells)
            dbm=trapped shadow=", shadow doorbells off"
        fi
        grep -q -- '--doorbells' <<<"$help" && serve+=(--doorbells "$dbm")
        vn_device_args "$d/vnvme.sock"
        qargs=("${VN_DEV_ARGS[@]}")
        desc="vnvme, doorbells $dbm, poll $poll$shadow" backing="ram:$size (vnvme RAM namespace)" ;;
    null_blk)
        kind=nullb desc="guest null_blk (irqmode=0)" backing="none (in-guest null_blk)" ;;
    *) die "unknown device $dev" ;;
    esac
    local prefill=1
    [[ $kind == nullb ]] && prefill=0
    cat >"$d/config.sh" <<EOF
KIND=$kind
RUNTIME=$runtime
REPS=$reps
POINTS="$points"
PREFILL=$prefill
EOF
    if [[ $dev == vnvme-* ]]; then
        local wrap=("${VN_WRAP[@]}")
        [[ $dev != vnvme-rbd* ]] || VN_WRAP=("${rbd_env[@]}" "${wrap[@]}")
        vn_serve_start "$d/serve.log" "$d/vnvme.sock" "${serve[@]}" || { VN_WRAP=("${wrap[@]}"); echo "FAILED: $dev: server did not start"; return 1; }
        VN_WRAP=("${wrap[@]}")
        echo "$VN_PID" >"$d/vnvme.pid"
        grep -a '^vnvme: serving' "$d/serve.log" | sed 's/^/  /'
        # What the server actually opened (backend kind, engine, LBA, cache), from its
        # own startup line, for the record (the back end's for a chain).
        local ns_line
        ns_line=$(grep -a -m1 '^vnvme: namespace 1:' "${d}/back.log" 2>/dev/null || grep -a -m1 '^vnvme: namespace 1:' "$d/serve.log")
        [[ -z $ns_line ]] || backing="$backing; server: ${ns_line#vnvme: namespace 1: }"
    fi
    # Image paths are this machine's: the record says which kind of file it was.
    python3 -c 'import json, sys; print(json.dumps({"device": sys.argv[1], "desc": sys.argv[2], "backing": sys.argv[3], "qemu_args": sys.argv[4:]}))' \
        "$dev" "$desc" "$backing" "${qargs[@]}" |
        sed "s|$disk_img|<disk-dir>/<tmp>.img|g; s|$img|/dev/shm/<tmp>.img|g; s|$work/|<work>/|g" >"$d/device.json"
    if [[ $dev == vnvme-* || $dev == *-nbd || $dev == *-rbd ]]; then
        :
    else
        # A fresh (sparse) image for every QEMU device; the guest fills it first.
        rm -f "$img" "$disk_img"
        truncate -s "$bytes" "$img"
        truncate -s "$bytes" "$disk_img"
    fi
    echo
    echo "== $dev: $desc [$backing]"
    cur_qemu_pidfile="$d/qemu.pid"
    # In the background + wait, so that INT/TERM run the trap at once.
    {
        brc=0
        "$VNVME_GUEST_DIR/boot.sh" --kernel "$kernel" --accel "$accel" --timeout 1200 \
            --append "vnvme.skip=null_blk" --run "$VNVME_GUEST_DIR/bench/guest-bench.sh" \
            --add "$d/config.sh:/bench/config.sh" -- -pidfile "$d/qemu.pid" "${qargs[@]}" || brc=$?
        echo "$brc" >"$d/boot.rc"
    } 2>&1 | vn_watch "$d/marks" "$d/stats.json" "$d/qemu.pid" "$d/vnvme.pid" "$d/vnvme-back.pid" >"$d/serial.log" &
    wait $! || true
    rc=$(cat "$d/boot.rc" 2>/dev/null || echo 125)
    cur_qemu_pidfile=""
    if [[ $dev == vnvme-* ]]; then
        vn_serve_wait "$VN_PID" 10 || vn_serve_stop "$VN_PID"
        VN_PID=""
        if [[ -n $BACK_PID ]]; then
            vn_serve_stop "$BACK_PID"
            BACK_PID=""
        fi
        sed -n 's/^vnvme: //p' "$d/serve.log" | tail -1 | sed 's/^/  server: /'
    fi
    if [[ -n $NBD_PID ]]; then
        kill "$NBD_PID" 2>/dev/null
        wait "$NBD_PID" 2>/dev/null
        NBD_PID=""
    fi
    grep -a '@@RESULT' "$d/serial.log" | sed 's/^/  /; s/@@//g' || true
    if [[ $rc -ne 0 ]] || ! grep -qa '@@BENCH-DONE@@' "$d/serial.log"; then
        echo "  FAILED: $dev (boot.sh status $rc; serial log $d/serial.log)"
        grep -a 'BENCH-ERROR' "$d/serial.log" || tail -n 20 "$d/serial.log"
    fi
    echo "  $dev: $(($(date +%s) - t0)) s"
    mkdir -p "$out/raw/$dev"
    cp -r "$d/serial.log" "$d/device.json" "$d/marks" "$out/raw/$dev/" 2>/dev/null || true
    # Server logs name the work directory (sockets, files): keep it out of the results.
    local log
    for log in serve.log back.log; do
        [[ ! -f $d/$log ]] || sed "s|$work|<work>|g; s|$disk_img|<disk>.img|g" "$d/$log" >"$out/raw/$dev/$log"
    done
    return 0
}

for dev in $devices; do
    run_device "$dev"
done
python3 "$VNVME_GUEST_DIR/bench/report.py" "$out"
# Keep the raw data small: gzip the logs, one tarball per device for the marks.
gzip -9 "$out"/raw/*/serial.log "$out"/raw/*/serve.log 2>/dev/null || true
for m in "$out"/raw/*/marks; do
    [[ -d $m ]] && tar -C "$(dirname "$m")" -czf "$m.tar.gz" marks && rm -r "$m"
done
python3 "$VNVME_GUEST_DIR/bench/report.py" "$out" >/dev/null # still readable
echo
echo "bench-guest: $(($(date +%s) - T0)) s; results: $out/{results.md,results.json,chart.svg}"
