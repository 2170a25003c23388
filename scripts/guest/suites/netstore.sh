# shellcheck shell=bash
# Sourced by scripts/guest-tests.sh: network storage: the netstore and outage suites (NBD servers, a Ceph cluster).
# Functions only; they use its helpers (result, suite_boot, write_config, ...) and
# its variables ($work, $here, $VNVME_BIN, ...).

# net_server_start LOG SOCKET PROG ARGS...: start an NBD server in the background
# and wait for its socket; sets NET_PID. Returns 1 (log tail printed) if it never
# appeared.
net_server_start() {
    local log=$1 sock=$2 i
    shift 2
    rm -f "$sock"
    "$@" </dev/null >"$log" 2>&1 &
    NET_PID=$!
    NET_PIDS+=("$NET_PID")
    for ((i = 0; i < 200; i++)); do
        [[ -S $sock ]] && return 0
        kill -0 "$NET_PID" 2>/dev/null || break
        sleep 0.1
    done
    tail -n 5 "$log" | sed 's/^/    | /'
    return 1
}

# ext4_host_check KERNEL TAG RAW WHAT: the guest's ext4 on a namespace (its
# @@VNVME-EXT4-TAG line), read from RAW, a raw copy of the image WHAT: e2fsck is
# clean and the file's checksum matches the guest's.
ext4_host_check() {
    local k=$1 tag=$2 raw=$3 what=$4 d line path sum_guest sum_host
    d=$(dirname "$raw")
    line=$(grep -a -o "@@VNVME-EXT4-$tag [^@]*@@" "$d/guest.log" | tail -1)
    if [[ -z $line ]]; then
        result FAIL "$k" "host ext4 check on $what: the guest printed no checksum"
        return
    fi
    line=${line#@@VNVME-EXT4-"$tag" }
    line=${line%@@}
    path=${line%% *}
    sum_guest=${line#* }
    if e2fsck -fn "$raw" >"$raw.e2fsck" 2>&1; then
        result PASS "$k" "host: e2fsck -fn on $what's ext4 is clean"
    else
        result FAIL "$k" "host: e2fsck -fn on $what's ext4 reports problems ($raw.e2fsck)"
    fi
    sum_host=$(debugfs -R "cat $path" "$raw" 2>/dev/null | sha256sum | cut -d' ' -f1)
    if [[ $sum_host == "$sum_guest" ]]; then
        result PASS "$k" "host: $path in $what matches the guest's sha256 ${sum_guest:0:16}..."
    else
        result FAIL "$k" "host: $path in $what: sha256 $sum_host != guest $sum_guest"
    fi
}

# ceph_for_tests DIR: a running Ceph test cluster (scripts/test.sh's, from
# VNVME_TEST_CEPH_DIR, or one started in DIR, which cleanup stops); sets CEPH_DIR,
# or returns 1 with the reason on stderr.
ceph_for_tests() {
    if [[ -n ${VNVME_TEST_CEPH_DIR:-} ]]; then
        CEPH_DIR=$VNVME_TEST_CEPH_DIR
        return
    fi
    CEPH_OWN=$1
    "$here/ceph-cluster.sh" start "$1" >/dev/null || return 1
    CEPH_DIR=$1
}

suite_netstore() {
    local k=$1
    local d="$work/$k-netstore" t0 bin plugins line ceph="" cbin="" rbd_args=() n3=0
    mkdir -p "$d"
    t0=$(date +%s)
    echo
    echo "== [$k] network storage suite: namespaces on qemu-nbd (qcow2), nbdkit (memory) and Ceph RBD"
    if ! bin=$("$here/fetch-nbd-servers.sh" 2>"$d/fetch.log"); then
        result SKIP "$k" "network storage suite: qemu-nbd and nbdkit could not be fetched ($(tail -1 "$d/fetch.log"))"
        return
    fi
    plugins="$(dirname "$bin")/plugins"
    if ! "$bin/qemu-img" create -q -f qcow2 "$d/n1.qcow2" 64M >"$d/qemu-img.log" 2>&1; then
        result FAIL "$k" "qemu-img create: $(tail -1 "$d/qemu-img.log")"
        return
    fi
    if ! net_server_start "$d/qemu-nbd.log" "$d/qnbd.sock" "$bin/qemu-nbd" --format qcow2 \
        --shared 8 --persistent --discard unmap --socket "$d/qnbd.sock" "$d/n1.qcow2"; then
        result FAIL "$k" "qemu-nbd did not start ($d/qemu-nbd.log)"
        net_servers_stop
        return
    fi
    if ! net_server_start "$d/nbdkit.log" "$d/kit.sock" "$bin/nbdkit" --foreground \
        --unix "$d/kit.sock" "$plugins/nbdkit-memory-plugin.so" size=32M; then
        result FAIL "$k" "nbdkit did not start ($d/nbdkit.log)"
        net_servers_stop
        return
    fi
    # n3: an RBD image on the Ceph test cluster, as client.vnvme (profile rbd).
    if ! cbin=$("$here/fetch-ceph.sh" 2>"$d/ceph-fetch.log"); then
        result SKIP "$k" "network storage suite, rbd namespace: Ceph could not be fetched ($(tail -1 "$d/ceph-fetch.log"))"
    elif ! ceph_for_tests "$work/ceph" 2>"$d/ceph-start.log"; then
        result SKIP "$k" "network storage suite, rbd namespace: the Ceph test cluster did not start ($(tail -1 "$d/ceph-start.log"))"
    else
        ceph=$CEPH_DIR
        CEPH_CONF=$ceph/ceph.conf "$cbin/rbd" rm --no-progress rbd/guest-netstore >/dev/null 2>&1
        if CEPH_CONF=$ceph/ceph.conf "$cbin/rbd" create --size 64M rbd/guest-netstore 2>"$d/rbd.log"; then
            rbd_args=(--ns "rbd:rbd/guest-netstore:conf=$ceph/ceph.conf:id=vnvme:keyring=$ceph/ceph.client.vnvme.keyring")
            n3=$((64 << 20))
        else
            result FAIL "$k" "rbd create on the test cluster: $(tail -1 "$d/rbd.log")"
        fi
    fi
    write_config "$d/config.sh" VNVMEGT0006 $((64 << 20)) 512 $((32 << 20)) 512 "$n3" 512
    # librbd from the cached Ceph packages, for the server only.
    local wrap=("${VN_WRAP[@]}")
    if [[ $n3 -gt 0 ]]; then
        VN_WRAP=(env "$(. "$cbin/../env.sh" && printf 'VNVME_LIBRBD=%s' "$VNVME_LIBRBD")"
            "$(. "$cbin/../env.sh" && printf 'LD_LIBRARY_PATH=%s' "$LD_LIBRARY_PATH")" "${wrap[@]}")
    fi
    suite_boot "$k" "$d" netstore netstore.sh --timeout 300 -- \
        --ns "nbd+unix:///?socket=$d/qnbd.sock" --ns "nbd+unix:///?socket=$d/kit.sock" \
        "${rbd_args[@]}" --workers 2 --serial VNVMEGT0006
    local booted=$?
    VN_WRAP=("${wrap[@]}")
    net_servers_stop
    [[ $booted -eq 0 ]] || return
    line=$(grep -ac '^vnvme: namespace [12]: nbd:nbd+unix' "$d/serve.log")
    if [[ $line -eq 2 ]]; then
        result PASS "$k" "server log: both namespaces on NBD ($(grep -a '^vnvme: namespace 1: nbd' "$d/serve.log" | sed 's/.*(//; s/)$//'))"
    else
        result FAIL "$k" "server log: $line namespaces opened on NBD, want 2 ($d/serve.log)"
    fi

    # The images, from the host, with their servers gone (qemu-nbd) or through
    # Ceph's own tool: intact, and holding the guest's ext4 files.
    if "$bin/qemu-img" check -q "$d/n1.qcow2" >"$d/check.log" 2>&1; then
        result PASS "$k" "host: qemu-img check on the qcow2 image qemu-nbd served is clean"
    else
        result FAIL "$k" "host: qemu-img check: $(head -3 "$d/check.log" | tr '\n' ' ')"
    fi
    if ! (need_cmds e2fsck:e2fsprogs debugfs:e2fsprogs) >"$d/apt.log" 2>&1; then
        result SKIP "$k" "host ext4 checks on the images: e2fsprogs missing ($d/apt.log)"
    else
        if "$bin/qemu-img" convert -f qcow2 -O raw "$d/n1.qcow2" "$d/n1.raw" >"$d/convert.log" 2>&1; then
            ext4_host_check "$k" n1 "$d/n1.raw" "the qcow2 image"
        else
            result FAIL "$k" "qemu-img convert of the qcow2 image: $(tail -1 "$d/convert.log")"
        fi
        if [[ $n3 -gt 0 ]]; then
            if CEPH_CONF=$ceph/ceph.conf "$cbin/rbd" export --no-progress rbd/guest-netstore "$d/n3.raw" \
                >"$d/export.log" 2>&1; then
                ext4_host_check "$k" n3 "$d/n3.raw" "the RBD image (rbd export)"
            else
                result FAIL "$k" "rbd export of the guest's image: $(tail -1 "$d/export.log")"
            fi
        fi
    fi
    [[ -z $ceph ]] || CEPH_CONF=$ceph/ceph.conf "$cbin/rbd" rm --no-progress rbd/guest-netstore >/dev/null 2>&1
    rm -f "$d/n1.qcow2" "$d/n1.raw" "$d/n3.raw"
    echo "  [$k] network storage suite: $(($(date +%s) - t0)) s"
}

# net_servers_stop: stop the NBD servers net_server_start started.
# outage_action DIR ACTION: what the outage suite's guest asks the host for
# (@@VNVME-HOST ACTION@@, run by vn_watch in the background). The servers' PIDs
# are in files, so a restarted one is found by the next action and the cleanup.
outage_action() {
    local d=$OUTAGE_DIR pid
    case $2 in
    nbd-restart)
        pid=$(cat "$d/qemu-nbd.pid")
        kill -KILL "$pid" 2>/dev/null
        sleep 2.1
        rm -f "$d/qnbd.sock"
        "$OUTAGE_BIN/qemu-nbd" --format qcow2 --shared 8 --persistent --discard unmap \
            --cache=writethrough --socket "$d/qnbd.sock" "$d/n1.qcow2" </dev/null >>"$d/qemu-nbd.log" 2>&1 &
        echo $! >"$d/qemu-nbd.pid"
        echo "[host] qemu-nbd (pid $pid) SIGKILLed, a new one (pid $!) on its socket 2.1 s later"
        ;;
    nbdkit-pause)
        pid=$(cat "$d/nbdkit.pid")
        kill -STOP "$pid"
        sleep 10
        kill -CONT "$pid"
        echo "[host] nbdkit (pid $pid) SIGSTOPped for 10 s, then SIGCONTed"
        ;;
    osds-pause)
        # The cluster stops answering for 15 s: both OSDs stopped at once, so
        # neither reports the other down and the placement groups keep their
        # two-OSD acting sets. (Pausing the last OSD of an acting set instead hits
        # a Ceph 16.2 bug: a placement group that an op finds past its read lease
        # on resuming stays "laggy" for good, though the lease is renewed; every op
        # waits "for readable" and no client, QEMU's included, gets an answer.)
        local p0 p1
        p0=$(cat "$OUTAGE_CEPH/run/osd.0.pid") p1=$(cat "$OUTAGE_CEPH/run/osd.1.pid")
        kill -STOP "$p0" "$p1"
        sleep 15
        kill -CONT "$p0" "$p1"
        echo "[host] osd.0 and osd.1 (pids $p0 $p1) SIGSTOPped for 15 s, then SIGCONTed"
        ;;
    osd-lose)
        pid=$(cat "$OUTAGE_CEPH/run/osd.1.pid")
        kill -KILL "$pid"
        echo "[host] osd.1 (pid $pid) SIGKILLed for good"
        ;;
    *) echo "[host] unknown action $2" ;;
    esac
}

# outage_servers_stop: the outage suite's servers, by their PID files.
outage_servers_stop() {
    local f
    for f in "$OUTAGE_DIR/qemu-nbd.pid" "$OUTAGE_DIR/nbdkit.pid"; do
        [[ -s $f ]] && kill -CONT "$(cat "$f")" 2>/dev/null && kill "$(cat "$f")" 2>/dev/null
    done
    outage_ceph_stop
    return 0
}

# outage_ceph_start DIR: a fresh cluster of two OSDs in DIR (pool rbd size 2,
# min_size 1, heartbeats shortened), with a 64 MiB image rbd/outage; OUTAGE_CEPH set.
outage_ceph_start() {
    OUTAGE_CEPH=$1
    rm -rf "$OUTAGE_CEPH"
    VNVME_CEPH_OSDS=2 "$here/ceph-cluster.sh" start "$OUTAGE_CEPH" >"$OUTAGE_CEPH.log" 2>&1 &&
        CEPH_CONF=$OUTAGE_CEPH/ceph.conf "$OUTAGE_CBIN/rbd" create --size 64M rbd/outage >>"$OUTAGE_CEPH.log" 2>&1
}

outage_ceph_stop() {
    [[ -n ${OUTAGE_CEPH:-} ]] || return 0
    local i
    for i in 0 1; do
        kill -CONT "$(cat "$OUTAGE_CEPH/run/osd.$i.pid" 2>/dev/null)" 2>/dev/null
    done
    "$here/ceph-cluster.sh" stop "$OUTAGE_CEPH" >>"$OUTAGE_CEPH.log" 2>&1
    # The daemons' logs stay with the suite's (what the cluster did in an outage).
    rm -rf "$OUTAGE_CEPH-logs"
    cp -r "$OUTAGE_CEPH/log" "$OUTAGE_CEPH-logs" 2>/dev/null
    rm -rf "$OUTAGE_CEPH"
    OUTAGE_CEPH=""
}

# outage_row DIR: "fio OK|FAIL, ext4 OK|FAIL, kernel log clean|ERRORS, longest I/O
# N ms, longest ext4 round M ms" from a boot of the outage suite.
outage_row() {
    local g=$1/guest.log fio ext4 klog stall rbd
    if ! grep -aq '^== outage suite: ' "$g"; then
        echo "the guest never finished: $(grep -ao 'guest ended without a status after [0-9.]*s' "$g" | tail -1 ||
            echo 'no status')$(grep -a '^\[host\] ' "$g" | tail -1 | sed 's/^\[host\]/; the last host action:/')"
        return
    fi
    fio=$(grep -aq '^PASS: fio randwrite + crc32c verify on n1' "$g" && echo "fio verify ok" || echo "fio FAILED")
    ext4=$(grep -aq '^PASS: ext4 on n2 through' "$g" && echo "ext4 ok" || echo "ext4 FAILED")
    klog=$(grep -aq '^PASS: guest kernel log: no I/O error' "$g" && echo "kernel log clean" ||
        echo "kernel log: errors")
    stall=$(grep -ao '@@VNVME-STALL [0-9]* [0-9]*@@' "$g" | tail -1 | tr -d '@' | awk '{printf "longest I/O %d ms, longest ext4 round %d ms", $2 / 1e6, $3 * 10}')
    if grep -aq 'NSID 1..3' "$g"; then
        rbd=$(grep -aq '^PASS: fio randwrite + crc32c verify on n3' "$g" && echo "rbd fio verify ok" || echo "rbd fio FAILED")
        rbd="$rbd ($(grep -ao '@@VNVME-STALL-RBD [0-9]*@@' "$g" | tail -1 | tr -d '@' | awk '{printf "longest I/O %d ms", $2 / 1e6}'))"
    else
        rbd="no rbd namespace"
    fi
    echo "$fio, $ext4, $rbd, $klog, ${stall:-no figures}"
}

# The outage suite: qemu-nbd restarted (2.1 s down) and nbdkit paused (10 s)
# under a guest running fio verify and an ext4 loop (scripts/guest/tests/outage.sh),
# once on vnvme and once on QEMU's own nvme device with QEMU's NBD client
# (reconnect-delay=20), the control. vnvme's run counts; QEMU's is reported.
suite_outage() {
    local k=$1 d="$work/$k-outage" t0 plugins
    mkdir -p "$d/vnvme" "$d/qemu"
    t0=$(date +%s)
    echo
    echo "== [$k] outage suite: qemu-nbd restarted and nbdkit paused under fio verify and ext4, vnvme and QEMU"
    if ! OUTAGE_BIN=$("$here/fetch-nbd-servers.sh" 2>"$d/fetch.log"); then
        result SKIP "$k" "outage suite: qemu-nbd and nbdkit could not be fetched ($(tail -1 "$d/fetch.log"))"
        return
    fi
    OUTAGE_DIR=$d
    plugins="$(dirname "$OUTAGE_BIN")/plugins"
    if ! "$OUTAGE_BIN/qemu-img" create -q -f qcow2 "$d/n1.qcow2" 64M >"$d/qemu-img.log" 2>&1; then
        result FAIL "$k" "qemu-img create: $(tail -1 "$d/qemu-img.log")"
        return
    fi
    # Write-through: a SIGKILLed qemu-nbd's write-back cache would lose writes it
    # had acknowledged (the guest flushes nothing under fio --direct), whoever the
    # client.
    if ! net_server_start "$d/qemu-nbd.log" "$d/qnbd.sock" "$OUTAGE_BIN/qemu-nbd" --format qcow2 \
        --shared 8 --persistent --discard unmap --cache=writethrough --socket "$d/qnbd.sock" "$d/n1.qcow2"; then
        result FAIL "$k" "qemu-nbd did not start ($d/qemu-nbd.log)"
        net_servers_stop
        return
    fi
    echo "$NET_PID" >"$d/qemu-nbd.pid"
    if ! net_server_start "$d/nbdkit.log" "$d/kit.sock" "$OUTAGE_BIN/nbdkit" --foreground \
        --unix "$d/kit.sock" "$plugins/nbdkit-memory-plugin.so" size=32M; then
        result FAIL "$k" "nbdkit did not start ($d/nbdkit.log)"
        outage_servers_stop
        net_servers_stop
        return
    fi
    echo "$NET_PID" >"$d/nbdkit.pid"
    NET_PIDS=()
    # n3: an RBD image on a fresh cluster of two OSDs, per boot (one is lost).
    local n3=0 rbd_args=() wrap=("${VN_WRAP[@]}") ceph_env=()
    OUTAGE_CEPH=""
    if ! OUTAGE_CBIN=$("$here/fetch-ceph.sh" 2>"$d/ceph-fetch.log"); then
        result SKIP "$k" "outage suite, rbd namespace: Ceph could not be fetched ($(tail -1 "$d/ceph-fetch.log"))"
    elif ! outage_ceph_start "$d/ceph-vnvme"; then
        result FAIL "$k" "outage suite: the two-OSD Ceph cluster did not start ($(tail -1 "$d/ceph-vnvme.log"))"
    else
        n3=$((64 << 20))
        rbd_args=(--ns "rbd:rbd/outage:conf=$OUTAGE_CEPH/ceph.conf:id=vnvme:keyring=$OUTAGE_CEPH/ceph.client.vnvme.keyring")
        ceph_env=("$(. "$OUTAGE_CBIN/../env.sh" && printf 'VNVME_LIBRBD=%s' "$VNVME_LIBRBD")"
            "$(. "$OUTAGE_CBIN/../env.sh" && printf 'LD_LIBRARY_PATH=%s' "$LD_LIBRARY_PATH")")
        VN_WRAP=(env "${ceph_env[@]}" "${wrap[@]}")
    fi
    VN_HOST_ACTION=outage_action
    write_config "$d/vnvme/config.sh" VNVMEGT0009 $((64 << 20)) 512 $((32 << 20)) 512 "$n3" 512
    suite_boot "$k" "$d/vnvme" outage outage.sh --timeout 300 -- \
        --ns "nbd+unix:///?socket=$d/qnbd.sock" --ns "nbd+unix:///?socket=$d/kit.sock" "${rbd_args[@]}" \
        --workers 0 --serial VNVMEGT0009
    VN_WRAP=("${wrap[@]}")
    outage_ceph_stop
    if grep -aq 're-established after' "$d/vnvme/serve.log"; then
        result PASS "$k" "server log: $(grep -a 're-established after' "$d/vnvme/serve.log" | head -1 | sed 's/.*NBD connection/NBD connection/')"
    else
        result FAIL "$k" "server log: the NBD connection to the restarted qemu-nbd was never re-established"
    fi

    # The control: QEMU's own nvme device on the same servers (and its rbd driver
    # on a fresh cluster like vnvme's). Its guest takes about 80 s; the bound is
    # shorter than vnvme's, since the control's result is reported, not counted.
    local qemu_rbd=() qemu_bin=""
    n3=0
    if [[ -n ${OUTAGE_CBIN:-} ]] && qemu_bin=$("$here/fetch-qemu-rbd.sh" 2>"$d/qemu-rbd-fetch.log") &&
        outage_ceph_start "$d/ceph-qemu"; then
        n3=$((64 << 20))
        qemu_rbd=(-blockdev "driver=rbd,node-name=q3,pool=rbd,image=outage,conf=$OUTAGE_CEPH/ceph.conf,user=vnvme"
            -device nvme-ns,drive=q3,bus=nv0,nsid=3)
    else
        echo "  [$k qemu] no rbd namespace for QEMU (QEMU with block-rbd or the cluster unavailable)"
    fi
    write_config "$d/qemu/config.sh" QEMUOUTAGE0 $((64 << 20)) 512 $((32 << 20)) 512 "$n3" 512
    guest_adds "$d/qemu/config.sh"
    {
        local brc=0
        VNVME_QEMU=${qemu_bin:-${VNVME_QEMU:-}} "$here/guest/boot.sh" --kernel "$k" --accel "$accel" \
            --run "$tests_dir/outage.sh" "${GUEST_ADDS[@]}" --timeout 200 -- -pidfile "$d/qemu/qemu.pid" \
            -blockdev "driver=nbd,node-name=q1,server.type=unix,server.path=$d/qnbd.sock,reconnect-delay=20" \
            -blockdev "driver=nbd,node-name=q2,server.type=unix,server.path=$d/kit.sock,reconnect-delay=20" \
            -device nvme,id=nv0,serial=QEMUOUTAGE0 -device nvme-ns,drive=q1,bus=nv0,nsid=1 \
            -device nvme-ns,drive=q2,bus=nv0,nsid=2 "${qemu_rbd[@]}" || brc=$?
        echo "$brc" >"$d/qemu/boot.rc"
    } 2>&1 | vn_watch "$d/qemu/marks" "" | tee "$d/qemu/guest.log" |
        grep --line-buffered -E '^(PASS|FAIL|SKIP): |^== |^\[host\]' | sed -u "s/^/  [$k qemu] /"
    VN_HOST_ACTION=""
    outage_servers_stop
    echo "  [$k] outage table (the same outages, the same servers, one run; QEMU: its nvme device, its NBD client with reconnect-delay=20 and its rbd driver):"
    echo "    vnvme (nbd://, hold 25 s):  $(outage_row "$d/vnvme")"
    echo "    QEMU nvme (NBD client):    $(outage_row "$d/qemu")"
    echo "  [$k] outage suite: $(($(date +%s) - t0)) s"
}

net_servers_stop() {
    local p
    for p in "${NET_PIDS[@]}"; do
        kill "$p" 2>/dev/null && wait "$p" 2>/dev/null
    done
    NET_PIDS=()
}
