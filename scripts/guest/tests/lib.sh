# shellcheck shell=dash
# Guest-side helpers for the vnvme guest tests (busybox sh). Sourced by the
# suite scripts in this directory, which boot.sh places under /tests.
#
# Result lines, parsed by scripts/guest-tests.sh on the host:
#   PASS: name[: detail]    FAIL: name[: detail]    SKIP: name: reason
# Marks ("@@VNVME-MARK NAME@@", see scripts/lib/guest-host.sh) make the host
# snapshot the server's counters.

T_FAILED=0

t_pass() { echo "PASS: $*"; }
t_fail() { echo "FAIL: $*"; T_FAILED=$((T_FAILED + 1)); }
t_skip() { echo "SKIP: $*"; }

# t_run NAME CMD...: PASS if CMD succeeds, else FAIL with the tail of its output.
t_run() {
    _n=$1
    shift
    if "$@" >/tmp/t_run.out 2>&1; then
        t_pass "$_n"
    else
        t_fail "$_n (exit $?: $*)"
        tail -n 25 /tmp/t_run.out | sed 's/^/    | /'
    fi
}

# now_cs: the guest's uptime in centiseconds (what the kernel's timers run on).
now_cs() {
    read -r _up _ </proc/uptime
    echo "${_up%.*}${_up#*.}"
}

# t_eq NAME GOT WANT: PASS if the two strings are equal.
t_eq() {
    if [ "$2" = "$3" ]; then t_pass "$1: $2"; else t_fail "$1: got '$2', want '$3'"; fi
}

# dd_read DEV BS SKIP COUNT OUT: reads COUNT blocks of BS bytes at block SKIP of
# DEV (direct I/O) into OUT; fails, saying why, unless dd succeeded and OUT holds
# every byte (a failed read must never pass as data, e.g. as "all zeroes").
dd_read() {
    rm -f "$5"
    if ! dd if="$1" of="$5" bs="$2" skip="$3" count="$4" iflag=direct 2>/tmp/dd_read.err; then
        echo "dd read of $1 failed: $(tail -n 1 /tmp/dd_read.err)"
        return 1
    fi
    _got=$(wc -c <"$5")
    if [ "$_got" -ne $(($2 * $4)) ]; then
        echo "dd read of $1: $_got bytes, want $(($2 * $4))"
        return 1
    fi
}

# dd_write IN DEV BS SEEK: writes IN to DEV at block SEEK (direct I/O); fails,
# saying why, unless dd wrote all of it.
dd_write() {
    if ! dd if="$1" of="$2" bs="$3" seek="$4" oflag=direct conv=notrunc 2>/tmp/dd_write.err; then
        echo "dd write to $2 failed: $(tail -n 1 /tmp/dd_write.err)"
        return 1
    fi
}

# mark NAME [SECS]: ask the host for a counter snapshot, then stay idle SECS
# (default 1.5, enough for the host's delayed copy of the stats file).
mark() {
    echo "@@VNVME-MARK $1@@"
    sleep "${2:-1.5}"
}

# ctrl_live CTRL [SECS]: wait until /sys/class/nvme/CTRL/state is "live".
ctrl_live() {
    _i=0
    while [ "$_i" -lt "$((${2:-15} * 10))" ]; do
        [ "$(cat "/sys/class/nvme/$1/state" 2>/dev/null)" = live ] && return 0
        usleep 100000
        _i=$((_i + 1))
    done
    echo "controller $1 state: $(cat "/sys/class/nvme/$1/state" 2>/dev/null || echo missing)"
    return 1
}

# fio_engine DEV: io_uring if it works in this guest, else libaio (sets ENGINE).
fio_engine() {
    ENGINE=io_uring
    fio --name=probe --filename="$1" --ioengine=io_uring --direct=1 --rw=read --bs=4k \
        --size=4k >/dev/null 2>&1 || ENGINE=libaio
    echo "fio engine: $ENGINE"
}

# fio_rw_bytes FILE: "READ WRITE", the bytes the first job of fio's JSON output
# read and wrote (with --group_reporting, all the jobs).
fio_rw_bytes() {
    awk '/"read" : \{/ { m = "r" } /"write" : \{/ { m = "w" }
        /"io_bytes"/ && m != "" { v = $3; gsub(/[^0-9]/, "", v)
            if (m == "r" && r == "") r = v; if (m == "w" && w == "") w = v; m = "" }
        END { print r + 0, w + 0 }' "$1"
}

# fio_verified NAME FIO-ARGS...: a fio write + verify job, bounded by its size and
# never by time (a run that hits a time limit before its writes end skips the verify
# phase and still exits 0), that passes only if fio succeeded, found no bad block,
# and read back, to verify, every byte it wrote.
fio_verified() {
    _n=$1
    shift
    if fio "$@" --group_reporting --eta=never --output-format=json --output=/tmp/fio.json \
        >/tmp/fio.err 2>&1 && ! grep -q 'verify: bad' /tmp/fio.json /tmp/fio.err; then
        # shellcheck disable=SC2046 # two numbers
        set -- $(fio_rw_bytes /tmp/fio.json)
        if [ "$2" -gt 0 ] && [ "$1" -eq "$2" ]; then
            t_pass "$_n: wrote and verified $(($2 >> 10)) KiB"
            return 0
        fi
        t_fail "$_n: wrote $2 bytes and verified $1: the verify phase did not read back all of it"
    else
        t_fail "$_n"
    fi
    tail -n 30 /tmp/fio.err /tmp/fio.json | sed 's/^/    | /'
}

# fio_json_field FILE KEY: first numeric value of "KEY" in fio's JSON output.
fio_json_field() {
    grep -o "\"$2\" : [0-9.e+-]*" "$1" | head -1 | awk '{print $3}'
}

# field NAME: the value of "NAME : VALUE" in nvme-cli output on stdin.
field() { awk -F: -v k="$1" '{ gsub(/[ \t]+$/, "", $1) } $1 == k { gsub(/^[ \t]+|[ \t]+$/, "", $2); print $2; exit }'; }

# ns_dev NSID: the block device of namespace NSID on nvme0. Linux names block
# devices by instance, not by NSID, and newer kernels scan namespaces in
# parallel, so /dev/nvme0n2 need not be NSID 2.
ns_dev() {
    for _b in /sys/block/nvme0n*; do
        [ "$(cat "$_b/nsid" 2>/dev/null)" = "$1" ] && { echo "/dev/${_b##*/}"; return 0; }
    done
    return 1
}

# wait_ns COUNT [SECS]: wait until NSIDs 1..COUNT have block devices, then set
# D1, D2, ... to them.
wait_ns() {
    _i=0
    while [ "$_i" -lt "$((${2:-15} * 10))" ]; do
        _ok=1 _n=1
        while [ "$_n" -le "$1" ]; do
            _d=$(ns_dev "$_n") && [ -b "$_d" ] || _ok=0
            eval "D$_n=\$_d"
            _n=$((_n + 1))
        done
        [ "$_ok" = 1 ] && return 0
        usleep 100000
        _i=$((_i + 1))
    done
    echo "namespaces present: $(echo /sys/block/nvme*)"
    return 1
}

# probe_or_exit COUNT: the suite's start: nvme0 live and NSIDs 1..COUNT present
# (D1.. set), or a FAIL with the kernel's nvme messages and exit 1.
probe_or_exit() {
    if ! ctrl_live nvme0 15 || ! wait_ns "$1" 15; then
        t_fail "controller probe: namespaces 1-$1 did not appear"
        dmesg | grep -i nvme | tail -20
        exit 1
    fi
}

# zone_conds DEV: one line per zone of zoned DEV, "COND WPTR" as blkzone reports
# them (the condition in decimal, the write pointer offset in its zone in hex).
zone_conds() {
    blkzone report "$1" | sed -n 's/.*wptr \(0x[0-9a-f]*\).*zcond: *\([0-9]*\).*/\2 \1/p'
}
