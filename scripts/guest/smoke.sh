#!/usr/bin/env bash
# Smoke test of the guest tooling: boot each kernel with QEMU's own emulated
# NVMe controller and exercise it with nvme-cli, fio and ext4.
set -euo pipefail
# shellcheck source=scripts/lib/packages.sh
source "$(dirname "${BASH_SOURCE[0]}")/../lib/packages.sh"

usage() {
    cat <<EOF
Usage: ${0##*/} [--no-fetch] [--accel A] [--help] [KERNEL...]

Fetches what is missing (fetch-qemu.sh, fetch-kernels.sh, mkinitramfs.sh;
skip with --no-fetch), then boots each KERNEL (default: bookworm newest) with
  -device nvme (QEMU's emulated controller, 1 GiB sparse raw image)
and runs in the guest: nvme list, nvme id-ctrl, a 5 s fio 4k randread
(direct=1, io_uring, libaio as fallback), mkfs.ext4 + mount + fsck.ext4.
Prints the wall-clock time of each boot; exits non-zero if any boot failed.
  --accel A   passed to boot.sh (auto | kvm | tcg)
EOF
}

fetch=1 accel="${VNVME_ACCEL:-auto}"
kernels=()
while [[ $# -gt 0 ]]; do
    case $1 in
    --no-fetch) fetch=0; shift ;;
    --accel) accel=$2; shift 2 ;;
    -h | --help) usage; exit 0 ;;
    -*) usage >&2; exit 2 ;;
    *) kernels+=("$1"); shift ;;
    esac
done
[[ ${#kernels[@]} -gt 0 ]] || kernels=(bookworm newest)

g=$VNVME_GUEST_DIR
if [[ $fetch -eq 1 ]]; then
    "$g/fetch-qemu.sh"
    "$g/fetch-kernels.sh" "${kernels[@]}"
    "$g/mkinitramfs.sh" "${kernels[@]}"
    # Decide the accelerator before timing the boots (the KVM probe is cached).
    if [[ $accel == auto ]]; then
        "$g/boot.sh" --kernel "${kernels[0]}" --cmd true >/dev/null 2>&1 || true
    fi
fi

work=$(mktemp -d "${TMPDIR:-/tmp}/vnvme-smoke.XXXXXX")
trap 'rm -rf "$work"' EXIT
truncate -s 1G "$work/nvme.img"

cat >"$work/smoke.sh" <<'EOF'
set -e
wait-dev /dev/nvme0n1 10
echo "== nvme list"
nvme list
echo "== nvme id-ctrl /dev/nvme0 | head"
nvme id-ctrl /dev/nvme0 | head
echo "== fio 4k randread, 5 s"
fio_job() {
    fio --name=randread --filename=/dev/nvme0n1 --rw=randread --bs=4k --direct=1 \
        --ioengine="$1" --iodepth=16 --runtime=5 --time_based --group_reporting --eta=never
}
fio_job io_uring || { echo "io_uring failed, trying libaio"; fio_job libaio; }
echo "== ext4"
mkfs.ext4 -q -F /dev/nvme0n1
mount -t ext4 /dev/nvme0n1 /mnt
echo hello >/mnt/hello
sync
umount /mnt
fsck.ext4 -f -n /dev/nvme0n1
echo "== smoke OK"
EOF

declare -A result
rc=0
for k in "${kernels[@]}"; do
    start=$(date +%s%N)
    set +e
    "$g/boot.sh" --kernel "$k" --accel "$accel" --timeout 300 --run "$work/smoke.sh" -- \
        -drive "file=$work/nvme.img,if=none,id=d0,format=raw" -device nvme,serial=vnvme-smoke,drive=d0
    s=$?
    set -e
    ms=$((($(date +%s%N) - start) / 1000000))
    result[$k]="status $s, $((ms / 1000)).$(printf '%03d' $((ms % 1000)))s, $(cat "$(kernel_dir "$k")/KVER")"
    [[ $s -eq 0 ]] || rc=1
done
echo
for k in "${kernels[@]}"; do log "$k: ${result[$k]}"; done
exit "$rc"
