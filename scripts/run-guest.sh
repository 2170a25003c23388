#!/usr/bin/env bash
# The main job: one command that fetches what is missing, builds vnvme, serves
# a controller over vfio-user and boots a real Linux guest on it under QEMU.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=scripts/lib/packages.sh
source "$here/lib/packages.sh"
# shellcheck source=scripts/lib/guest-host.sh
source "$here/lib/guest-host.sh"

usage() {
    cat <<EOF
Usage: ${0##*/} [--kernel K] [--ns SPEC]... [--workers N] [--poll MODE]
                [--accel A] [--fio-seconds S] [--no-fetch] [--no-build] [--help]
                [-- MORE VNVME SERVE ARGS...]

 1. fetches QEMU 11.1, the guest kernel and its initramfs if missing
    (scripts/guest/setup.sh pieces, cached in \${VNVME_CACHE:-~/.cache/vnvme})
 2. builds vnvme (cargo build --release -p vnvme)
 3. starts \`vnvme serve\` on a private socket (default namespace: serve's
    built-in ram:1G)
 4. boots the guest under QEMU with -device vfio-user-pci (guest RAM in a
    shared memfd backend) and shows, from inside the guest: nvme list,
    nvme id-ctrl with OACS decoded (bit 8: Doorbell Buffer Config), the nvme
    driver's kernel messages and a short fio 4k randread; then the guest
    powers off (the driver shuts the controller down: CC.SHN)
 5. prints the server's own counters: trapped doorbell writes and interrupts
    per I/O, over the fio run and in total, and what they mean

The server runs as an operator's would: serve's defaults but for the ones given.

  --kernel K        guest kernel: newest (default) | bookworm | KVER
  --ns SPEC         namespace, repeatable: ram:SIZE, null:SIZE, file:PATH:SIZE,
                    each with optional :lba=512|4096 (default: serve's ram:1G)
  --workers N       server I/O worker threads (default: serve's, inline (0) on
                    a host with 2 usable CPUs or fewer, else 1)
  --poll MODE       off | adaptive | always (default: serve's, adaptive)
  --accel A         auto | kvm | tcg (default: \$VNVME_ACCEL or auto: KVM only
                    if a probe boot works, else TCG)
  --fio-seconds S   fio runtime (default 5)
  --no-fetch        skip step 1; --no-build skips step 2 (uses \$VNVME_BIN or
                    target/release/vnvme)
  -- ARGS...        passed to \`vnvme serve\` as is (see vnvme serve --help),
                    e.g. -- --doorbells eventfd --queues 4

The server is stopped on every exit path. Logs (server log, serial console,
counters, the fetch's whole output) stay in a private directory printed at the
start and the end.
EOF
}

kernel=newest workers="" poll="" accel="${VNVME_ACCEL:-auto}" fio_s=5 fetch=1 build=1
nss=() extra=()
while [[ $# -gt 0 ]]; do
    case $1 in
    --kernel) kernel=$2; shift 2 ;;
    --ns) nss+=(--ns "$2"); shift 2 ;;
    --workers) workers=$2; shift 2 ;;
    --poll) poll=$2; shift 2 ;;
    --accel) accel=$2; shift 2 ;;
    --fio-seconds) fio_s=$2; shift 2 ;;
    --no-fetch) fetch=0; shift ;;
    --no-build) build=0; shift ;;
    -h | --help) usage; exit 0 ;;
    --) shift; extra=("$@"); break ;;
    *) usage >&2; exit 2 ;;
    esac
done
[[ $fio_s =~ ^[0-9]+$ && $fio_s -ge 1 ]] || die "--fio-seconds must be a whole number >= 1"
[[ -z $workers || $workers =~ ^[0-9]+$ ]] || die "--workers must be a number (0: inline)"
case $poll in "" | off | adaptive | always) ;; *) die "--poll must be off, adaptive or always" ;; esac

run=$(mktemp -d "${TMPDIR:-/tmp}/vnvme-run.XXXXXX")
chmod 700 "$run"
VN_PID=""
finish() {
    local rc=$?
    vn_term_pidfile "$run/qemu.pid"
    vn_serve_stop "$VN_PID"
    rm -f "$run/vnvme.sock"
    echo
    echo "logs: $run"
    echo "  serve.log   vnvme serve (--log info)"
    echo "  guest.log   the guest's serial console"
    echo "  stats.json  the server's counters at exit"
    [[ -s $run/fetch.log ]] && echo "  fetch.log   what fetching QEMU, the kernel and the initramfs printed"
    exit "$rc"
}
trap finish EXIT
trap 'exit 130' INT TERM
step() { printf '\n\033[1m== [%s] %s\033[0m\n' "$1" "$2"; }

# fetch CMD...: runs a fetch script with its whole output in fetch.log; the terminal
# gets the script's own lines (one per package set fetched, none per package) and any
# error or warning (not apt's package lists, whose names may hold those words), and
# on a failure the end of the log.
fetch() {
    local rc=0
    { "$@" 2>&1 || echo $? >"$run/fetch.rc"; } | tee -a "$run/fetch.log" |
        grep --line-buffered -aE '^\[[^]]+\] |^(E|W|Err):|error|warning|fail' |
        grep --line-buffered -avE '^\[[^]]+\] (extracting |resolving dependencies|apt update)|^ |^(Get|Hit|Ign):' ||
        true
    [[ -e $run/fetch.rc ]] && rc=$(cat "$run/fetch.rc")
    if [[ $rc -ne 0 ]]; then
        echo "${1##*/} failed (status $rc); the end of $run/fetch.log:"
        tail -n 30 "$run/fetch.log"
        exit "$rc"
    fi
}

echo "vnvme run-guest: kernel $kernel, logs in $run"
step 1/5 "QEMU 11.1, guest kernel '$kernel' and initramfs (fetched once, then cached)"
if [[ $fetch -eq 1 ]]; then
    fetch "$VNVME_GUEST_DIR/fetch-qemu.sh"
    fetch "$VNVME_GUEST_DIR/fetch-kernels.sh" "$kernel"
    fetch "$VNVME_GUEST_DIR/mkinitramfs.sh" "$kernel"
else
    echo "skipped (--no-fetch)"
fi

step 2/5 "build vnvme (release)"
if [[ $build -eq 1 ]]; then vn_build; else echo "skipped (--no-build): $VNVME_BIN"; fi
[[ -x $VNVME_BIN ]] || die "no vnvme binary at $VNVME_BIN"

step 3/5 "start vnvme serve"
sock="$run/vnvme.sock"
serve_args=(--once --stats-file "$run/stats.json" --log info)
[[ -n $workers ]] && serve_args+=(--workers "$workers")
[[ -n $poll ]] && serve_args+=(--poll "$poll")
serve_args+=("${nss[@]}" "${extra[@]}")
echo "$VNVME_BIN serve --socket $sock ${serve_args[*]}"
vn_serve_start "$run/serve.log" "$sock" "${serve_args[@]}" || die "vnvme serve did not start (see $run/serve.log)"
grep -a '^vnvme: serving' "$run/serve.log" || true

# The guest side. /init has loaded the nvme driver and waited for the
# controller; this runs in the guest's busybox sh.
cat >"$run/guest.sh" <<EOF
FIO_SECONDS=$fio_s
EOF
cat >>"$run/guest.sh" <<'EOF'
hdr() { printf '\n---- guest: %s\n' "$*"; }
mark() { echo "@@VNVME-MARK $1@@"; sleep "${2:-1.5}"; }
dev=/dev/nvme0n1
for b in /sys/block/nvme0n*; do [ "$(cat "$b/nsid" 2>/dev/null)" = 1 ] && dev=/dev/${b##*/}; done
wait-dev "$dev" 15 || { echo "no NVMe namespace appeared"; dmesg | grep -i nvme; exit 1; }

hdr "nvme list"
nvme list

hdr "nvme id-ctrl /dev/nvme0 (excerpt) and OACS decoded"
nvme id-ctrl /dev/nvme0 >/tmp/idctrl || exit 1
grep -E '^(vid|sn|mn|fr|mdts|ver|oacs|oncs|sqes|cqes|nn) ' /tmp/idctrl
oacs=$(awk -F: '$1 ~ /^oacs/ { gsub(/ /, "", $2); print $2 }' /tmp/idctrl)
echo "OACS = $oacs (Optional Admin Command Support):"
i=0
for name in "Security Send/Receive" "Format NVM" "Firmware Commit/Download" "Namespace Management" \
    "Device Self-test" "Directives" "NVMe-MI Send/Receive" "Virtualization Management" \
    "Doorbell Buffer Config" "Get LBA Status" "Command and Feature Lockdown"; do
    if [ $(((oacs >> i) & 1)) = 1 ]; then s=set; else s="-"; fi
    printf '  bit %2d  %-3s  %s\n' "$i" "$s" "$name"
    i=$((i + 1))
done
if [ $(((oacs >> 8) & 1)) = 1 ]; then
    echo "=> DBBUF (OACS bit 8, Doorbell Buffer Config) is SET: Linux's nvme driver gives the"
    echo "   controller shadow doorbell + EventIdx buffers and writes queue tails/heads there."
else
    echo "=> DBBUF (OACS bit 8) is NOT set: every doorbell write traps into the VMM."
fi

hdr "nvme driver kernel messages (dmesg | grep nvme)"
dmesg | grep -i nvme

engine=io_uring
fio --name=probe --filename="$dev" --ioengine=io_uring --direct=1 --rw=read --bs=4k --size=4k \
    >/dev/null 2>&1 || engine=libaio
hdr "fio: 4k random read, QD 16, $engine, direct, ${FIO_SECONDS}s on $dev"
sleep 1
mark fio-start 0
fio --name=randread --filename="$dev" --rw=randread --bs=4k --direct=1 --ioengine="$engine" \
    --iodepth=16 --runtime="$FIO_SECONDS" --time_based --norandommap --randrepeat=0 \
    --group_reporting --eta=never >/tmp/fio.out 2>&1
rc=$?
mark fio-end
grep -vE '^ *(lat \((usec|msec)\)|clat percentiles|\|)' /tmp/fio.out | sed '/^ *$/d'

hdr "clean shutdown: sync; the driver shuts the controller down (CC.SHN) at power-off"
sync
exit $rc
EOF

step 4/5 "boot the guest (kernel $kernel) with -device vfio-user-pci"
vn_device_args "$sock"
# In the background + wait, so that INT/TERM run the trap at once.
{
    rc=0
    "$VNVME_GUEST_DIR/boot.sh" --kernel "$kernel" --accel "$accel" --timeout 300 --run "$run/guest.sh" \
        -- -pidfile "$run/qemu.pid" "${VN_DEV_ARGS[@]}" || rc=$?
    echo "$rc" >"$run/boot.rc"
} 2>&1 | vn_watch "$run/marks" "$run/stats.json" | tee "$run/guest.log" | grep --line-buffered -av '@@VNVME-MARK' &
wait $! || true
guest_rc=$(cat "$run/boot.rc" 2>/dev/null || echo 125)

step 5/5 "server counters"
src=0
vn_serve_wait "$VN_PID" 15 || src=$?
if [[ $src -eq 124 ]]; then
    echo "vnvme serve still running 15 s after QEMU exited; stopping it"
    vn_serve_stop "$VN_PID"
fi
VN_PID=""
# The summary line ("N I/O commands, N admin; trapped I/O doorbell writes ..."), not
# the lines that follow it (polling, per namespace).
grep -a '^vnvme: [0-9]* I/O commands' "$run/serve.log" | tail -1 | sed 's/^vnvme: /total since the server started: /'
if grep -qa 'controller shut down' "$run/serve.log"; then
    echo "clean shutdown: $(grep -a 'controller shut down' "$run/serve.log" | tail -1 | sed 's/.*INFO //')"
fi
if vn_mark_deltas "$run/marks" fio-start fio-end; then
    # The modes as the serving line gives them: "inline: no workers" or "N worker(s)",
    # then --poll and --doorbells.
    modes=$(sed -n 's/^vnvme: serving .* (\(inline: no workers\|[0-9]* worker(s)\).*\(--poll [a-z]*, --doorbells [a-z]*\).*/\1, \2/p' \
        "$run/serve.log" | head -1)
    echo "during the fio run: $VN_IO I/O commands, $VN_DB trapped I/O doorbell writes = $(vn_ratio "$VN_DB" "$VN_IO") per I/O, $VN_IRQ interrupts = $(vn_ratio "$VN_IRQ" "$VN_IO") per I/O (${modes:-polling ${poll:-adaptive}})"
fi
# What the doorbell figure means, beside the README's 0.06 per command at QD 16.
polling=$(grep -a '^vnvme: adaptive polling chose to' "$run/serve.log" | tail -1 | sed 's/^vnvme: //')
[[ -n $polling ]] && echo "$polling"
choice=$(sed -n 's/^adaptive polling chose to \([a-z]*\).*/\1/p' <<<"$polling")
echo "what this means: with shadow doorbells the guest traps (a doorbell write QEMU passes to vnvme) only when EventIdx asks: seldom while the server spins (EventIdx left stale), up to once a command while it sleeps (EventIdx kept current: it must be woken, and fio here refills one command per completion). Adaptive polling runs whichever costs less CPU per command beside this guest and may switch during the run${choice:+ (at exit: $choice)}; the README's 0.06 per command at QD 16 is the mock-host bench, whose host submits 16 commands a ring."
echo
if [[ $guest_rc -eq 0 && $src -eq 0 ]]; then
    echo "run-guest: OK (guest script and server exited 0)"
else
    echo "run-guest: FAILED (guest status $guest_rc, server status $src)"
    exit 1
fi
