#!/usr/bin/env bash
# A private single-node Ceph cluster for the rbd:// tests: one monitor on
# 127.0.0.1 (free ports picked at deploy time, msgr v2 and v1), one OSD on memstore
# (objects in memory, saved into DIR when the OSD stops cleanly), no manager,
# cephx on, and a pool `rbd` (size 1, application rbd). With VNVME_CEPH_OSDS=2 at
# deploy time: two OSDs and the pool replicated on both (size 2, min_size 1, so
# one OSD can go and I/O goes on), with heartbeats shortened (an OSD that stops
# answering is marked down after about 4 s instead of 20) for the outage tests. Everything (conf,
# keyrings, mon/osd data, logs, pid files, admin sockets, crash dumps) lives in
# DIR; nothing under /etc/ceph, /var/lib/ceph or /var/run/ceph is used. The
# binaries come from scripts/fetch-ceph.sh (fetched on first use, cached).
#
#   scripts/ceph-cluster.sh start DIR    deploy (first time) and start the daemons,
#                                        wait until rbd I/O works; nothing to do
#                                        when the cluster already runs
#   scripts/ceph-cluster.sh stop DIR     stop the daemons (TERM, KILL after a bound);
#                                        DIR keeps the data for the next start (an
#                                        OSD that crashed or was killed loses it: the
#                                        next start then fails, saying so)
#   scripts/ceph-cluster.sh status DIR   daemons and `ceph health detail`
#
# Clients: DIR/ceph.conf (mon_host, keyring paths) and DIR/env.sh, which exports
# CEPH_CONF, VNVME_CEPH_ID=vnvme (the user client.vnvme, caps: mon 'profile rbd',
# osd 'profile rbd pool=rbd'), VNVME_CEPH_KEYRING, VNVME_CEPH_POOL=rbd. The `ceph`,
# `rbd`, `rados` wrappers of fetch-ceph.sh's bin dir act as client.admin by
# default (keyring DIR/ceph.client.admin.keyring), e.g.
#   CEPH_CONF=DIR/ceph.conf "$(scripts/fetch-ceph.sh)"/ceph -s
# For librbd in a host process source also $VNVME_CACHE/ceph/current/env.sh.
# Removing DIR (after stop) discards the cluster.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=scripts/lib/packages.sh
source "$here/lib/packages.sh"

usage() { die "usage: ${0##*/} start|stop|status DIR"; }
[[ $# -eq 2 ]] || usage
cmd=$1
D=$(realpath -m "$2")
conf=$D/ceph.conf

# Seconds: for the whole start, and for each daemon to exit on TERM before KILL.
start_timeout=${VNVME_CEPH_START_TIMEOUT:-90}
# OSDs: what the cluster was deployed with, else what a new deploy gets.
osds() {
    if [[ -s $D/osds ]]; then cat "$D/osds"; else echo "${VNVME_CEPH_OSDS:-1}"; fi
}
stop_timeout=${VNVME_CEPH_STOP_TIMEOUT:-20}

# daemon_pid NAME: the pid of DIR's daemon NAME (mon.a, osd.0) when it runs.
# The pid file is ours; the process must still be a ceph daemon of this conf.
daemon_pid() {
    local pf=$D/run/$1.pid pid
    [[ -s $pf ]] || return 1
    pid=$(<"$pf")
    [[ $pid =~ ^[0-9]+$ ]] && [[ -r /proc/$pid/cmdline ]] || return 1
    tr '\0' '\n' <"/proc/$pid/cmdline" 2>/dev/null | grep -qxF "$conf" || return 1
    printf '%s\n' "$pid"
}

bin_dir() {
    [[ -n ${B:-} ]] && return 0
    B=$("$here/fetch-ceph.sh") || die "ceph is not available (scripts/fetch-ceph.sh failed)"
}

# Client commands as client.admin, bounded: an unreachable monitor must not hang us.
ceph_() { timeout 60 "$B/ceph" -c "$conf" --connect-timeout 30 "$@"; }
rbd_() { timeout 60 "$B/rbd" -c "$conf" --client_mount_timeout 30 --rados_osd_op_timeout 30 "$@"; }

free_port() {
    python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

write_conf() { # FSID V2PORT V1PORT
    local root
    root=$(readlink -f "$B/../root")
    local lib=$root/usr/lib/x86_64-linux-gnu
    cat >"$conf" <<EOF
# Single-node test cluster made by scripts/ceph-cluster.sh; everything under $D.
[global]
fsid = $1
mon_host = [v2:127.0.0.1:$2,v1:127.0.0.1:$3]
auth_cluster_required = cephx
auth_service_required = cephx
auth_client_required = cephx
auth_allow_insecure_global_id_reclaim = false
ms_bind_ipv4 = true
ms_bind_ipv6 = false
run_dir = $D/run
crash_dir = $D/crash
log_file = $D/log/\$cluster-\$name.log
log_to_stderr = false
err_to_stderr = true
mon_cluster_log_file = $D/log/\$cluster.log
admin_socket = $D/run/\$cluster-\$name.asok
plugin_dir = $lib/ceph
erasure_code_dir = $lib/ceph/erasure-code
osd_class_dir = $lib/rados-classes
osd_pool_default_size = 1
osd_pool_default_min_size = 1
osd_pool_default_pg_num = 8
osd_pool_default_pgp_num = 8
osd_pool_default_pg_autoscale_mode = off
osd_crush_chooseleaf_type = 0
mon_allow_pool_size_one = true
mon_allow_pool_delete = true
mon_warn_on_pool_no_redundancy = false

[mon]
mon_data = $D/mon/\$cluster-\$id
keyring = \$mon_data/keyring
mon_memory_target = 268435456
rocksdb_cache_size = 67108864
# No manager in this cluster (pools, rbd and I/O do not need one): its absence
# is not a health warning here.
mon_mgr_mkfs_grace = 315360000
mon_data_avail_warn = 5
mon_data_avail_crit = 2

[osd]
osd_data = $D/osd/\$cluster-\$id
keyring = \$osd_data/keyring
public_addr = 127.0.0.1
cluster_addr = 127.0.0.1
osd_objectstore = memstore
# The store's capacity as the OSD reports it; memory is used only as data is written.
memstore_device_bytes = 4294967296
# A clean shutdown writes the memstore out to osd_data (kept across stop/start).
osd_fast_shutdown = false
osd_crush_initial_weight = 1
osd_memory_target = 939524096
osd_op_num_shards = 2
osd_op_num_threads_per_shard = 2
ms_async_op_threads = 2

$(if [[ $(osds) -gt 1 ]]; then cat <<EOS
# Two OSDs (outage tests): one that stops answering is marked down after ~4 s.
osd_heartbeat_interval = 1
osd_heartbeat_grace = 4
mon_osd_adjust_heartbeat_grace = false
mon_osd_min_down_reporters = 1
mon_osd_reporter_subtree_level = osd
EOS
fi)

[client]
keyring = $D/\$cluster.\$name.keyring
log_file = $D/log/\$cluster-\$name.log
admin_socket =
EOF
}

at() { "$B/ceph-authtool" "$@" >/dev/null; }

deploy() {
    log "deploying a new cluster in $D"
    rm -rf "$D/mon" "$D/osd" "$D/run" "$D/log" "$D/crash" "$D"/*.keyring "$D/.deployed" "$D/osds"
    local n=${VNVME_CEPH_OSDS:-1} i
    [[ $n =~ ^[12]$ ]] || die "VNVME_CEPH_OSDS=$n: 1 or 2"
    echo "$n" >"$D/osds"
    mkdir -p "$D/mon/ceph-a" "$D/run" "$D/log" "$D/crash"
    for ((i = 0; i < n; i++)); do mkdir -p "$D/osd/ceph-$i"; done
    local fsid p2 p1
    fsid=$(cat /proc/sys/kernel/random/uuid)
    p2=$(free_port)
    p1=$(free_port)
    while [[ $p1 == "$p2" ]]; do p1=$(free_port); done
    write_conf "$fsid" "$p2" "$p1"

    # Every key up front, all in the monitor's initial keyring: no auth
    # commands against the running cluster.
    local mk=$D/mon.keyring
    at "$mk" --create-keyring --gen-key -n mon. --cap mon 'allow *'
    at "$D/ceph.client.admin.keyring" --create-keyring --gen-key -n client.admin \
        --cap mon 'allow *' --cap osd 'allow *' --cap mgr 'allow *' --cap mds 'allow *'
    at "$D/ceph.client.vnvme.keyring" --create-keyring --gen-key -n client.vnvme \
        --cap mon 'profile rbd' --cap osd 'profile rbd pool=rbd'
    for ((i = 0; i < n; i++)); do
        at "$D/osd/ceph-$i/keyring" --create-keyring --gen-key -n "osd.$i" \
            --cap mon 'allow profile osd' --cap mgr 'allow profile osd' --cap osd 'allow *'
    done
    local k
    for k in "$D/ceph.client.admin.keyring" "$D/ceph.client.vnvme.keyring" "$D"/osd/ceph-*/keyring; do
        at "$mk" --import-keyring "$k"
    done
    chmod 600 "$D"/*.keyring "$D"/osd/ceph-*/keyring

    "$B/monmaptool" -c "$conf" --create --fsid "$fsid" \
        --addv a "[v2:127.0.0.1:$p2,v1:127.0.0.1:$p1]" "$D/monmap" >/dev/null
    "$B/ceph-mon" -c "$conf" --mkfs -i a --monmap "$D/monmap" --keyring "$mk" ||
        die "ceph-mon --mkfs failed; see $D/log/ceph-mon.a.log"
    local osd_uuid
    for ((i = 0; i < n; i++)); do
        osd_uuid=$(cat /proc/sys/kernel/random/uuid)
        "$B/ceph-osd" -c "$conf" --no-mon-config --mkfs -i "$i" --osd-uuid "$osd_uuid" >"$D/log/osd-mkfs.out" 2>&1 ||
            die "ceph-osd --mkfs failed; see $D/log/osd-mkfs.out and $D/log/ceph-osd.$i.log"
        printf '%s\n' "$osd_uuid" >"$D/osd/ceph-$i/vnvme-uuid"
        touch "$D/osd/ceph-$i/vnvme-clean"
    done

    cat >"$D/env.sh" <<EOF
# Source this for a client of the test cluster in $D (client.vnvme, pool rbd).
export CEPH_CONF='$conf'
export VNVME_CEPH_ID=vnvme
export VNVME_CEPH_NAME=client.vnvme
export VNVME_CEPH_KEYRING='$D/ceph.client.vnvme.keyring'
export VNVME_CEPH_POOL=rbd
EOF
}

# run_daemon NAME PROG ARGS...: start a daemon in the foreground mode (-f), in the
# background of this script, in its own session; record its pid.
run_daemon() {
    local name=$1 prog=$2
    shift 2
    rm -f "$D/run/$name.pid"
    # The pid file is written by the process that then becomes the daemon.
    # shellcheck disable=SC2016 # expanded by sh -c
    setsid sh -c 'echo $$ >"$0"; exec "$@"' "$D/run/$name.pid" "$B/$prog" -f -c "$conf" "$@" \
        </dev/null >>"$D/log/$name.out" 2>&1 9>&- &
    local i
    for ((i = 0; i < 50; i++)); do [[ -s $D/run/$name.pid ]] && break; sleep 0.1; done
}

start() {
    mkdir -p "$D"
    local mon osd i n
    n=$(osds)
    mon=$(daemon_pid mon.a || true)
    osd=$(daemon_pid osd.0 || true)
    if [[ -n $mon && -n $osd && -e $D/.ready ]]; then
        log "already running in $D (mon.a pid $mon, osd.0 pid $osd, $n OSD(s))"
        bin_dir
        ceph_ health || true
        return 0
    fi
    bin_dir
    local deadline=$((SECONDS + start_timeout))
    rm -f "$D/.ready"
    if [[ ! -e $D/.deployed ]]; then
        # Nothing, or what an interrupted deploy left: start from scratch.
        [[ -z $mon && -z $osd ]] || stop
        mon='' osd=''
        deploy
    fi
    if [[ -z $mon ]]; then
        run_daemon mon.a ceph-mon -i a
        log "mon.a started (pid $(<"$D/run/mon.a.pid"))"
    fi
    if [[ ! -e $D/.deployed ]]; then
        # The OSDs must exist in the osdmap before they can boot.
        local id
        for ((i = 0; i < n; i++)); do
            id=$(ceph_ osd new "$(<"$D/osd/ceph-$i/vnvme-uuid")" "$i") ||
                die "ceph osd new failed; see $D/log/ceph-mon.a.log"
            [[ $id == "$i" ]] || die "ceph osd new gave osd.$id, not osd.$i"
        done
    fi
    for ((i = 0; i < n; i++)); do
        daemon_pid "osd.$i" >/dev/null && continue
        # The memstore is in memory: what osd_data holds is what the last clean
        # stop saved. After a crash or a KILL it is stale, and serving it would
        # hand out old data.
        [[ -e $D/osd/ceph-$i/vnvme-clean ]] ||
            die "osd.$i of $D did not stop cleanly: its data is lost; run '${0##*/} stop $D', remove $D and start again"
        rm -f "$D/osd/ceph-$i/vnvme-clean"
        run_daemon "osd.$i" ceph-osd -i "$i"
        log "osd.$i started (pid $(<"$D/run/osd.$i.pid"))"
    done
    if [[ ! -e $D/.deployed ]]; then
        {
            ceph_ osd pool create rbd 8 8 replicated &&
                ceph_ osd pool set rbd size "$n" --yes-i-really-mean-it &&
                ceph_ osd pool set rbd min_size 1
        } >/dev/null || die "could not create the pool rbd; see $D/log/ceph-mon.a.log"
        rbd_ pool init rbd || die "rbd pool init failed; see $D/log"
        touch "$D/.deployed"
    fi
    # Ready when an image can be made and removed (the OSD is up, the PGs active).
    local probe=rbd/probe-$$ quick=(timeout 20 "$B/rbd" -c "$conf" --client_mount_timeout 10
        --rados_osd_op_timeout 10)
    until "${quick[@]}" create --size 16M "$probe" 2>/dev/null &&
        "${quick[@]}" rm --no-progress "$probe" 2>/dev/null; do
        daemon_pid mon.a >/dev/null || die "mon.a exited; see $D/log/ceph-mon.a.log and $D/log/mon.a.out"
        for ((i = 0; i < n; i++)); do
            daemon_pid "osd.$i" >/dev/null || die "osd.$i exited; see $D/log/ceph-osd.$i.log and $D/log/osd.$i.out"
        done
        ((SECONDS < deadline)) || die "the cluster in $D serves no I/O after ${start_timeout}s; see $D/log"
        sleep 1
    done
    touch "$D/.ready"
    log "ready in $D (CEPH_CONF=$conf; client env: $D/env.sh)"
}

# stop_daemon NAME: TERM, then KILL after stop_timeout seconds.
stop_daemon() {
    local name=$1 pid i
    pid=$(daemon_pid "$name") || { rm -f "$D/run/$name.pid"; return 0; }
    log "stopping $name (pid $pid)"
    kill -TERM "$pid" 2>/dev/null || true
    for ((i = 0; i < stop_timeout * 10; i++)); do
        kill -0 "$pid" 2>/dev/null || break
        sleep 0.1
    done
    if kill -0 "$pid" 2>/dev/null; then
        log "$name did not exit in ${stop_timeout}s; killing it"
        kill -KILL "$pid" 2>/dev/null || true
        for ((i = 0; i < 50; i++)); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
        [[ $name == osd.* ]] && log "warning: the memstore of $name was not saved; remove $D to start afresh"
    elif [[ $name == osd.* ]]; then
        touch "$D/osd/ceph-${name#osd.}/vnvme-clean"
    fi
    rm -f "$D/run/$name.pid"
}

stop() {
    [[ -d $D ]] || { log "no cluster in $D"; return 0; }
    rm -f "$D/.ready"
    local i
    for ((i = $(osds) - 1; i >= 0; i--)); do stop_daemon "osd.$i"; done
    stop_daemon mon.a
    log "stopped ($D)"
}

status() {
    local n p rc=0 i names=(mon.a)
    for ((i = 0; i < $(osds); i++)); do names+=("osd.$i"); done
    for n in "${names[@]}"; do
        if p=$(daemon_pid "$n"); then
            printf '%s: running (pid %s)\n' "$n" "$p"
        else
            printf '%s: not running\n' "$n"
            rc=1
        fi
    done
    if daemon_pid mon.a >/dev/null; then
        bin_dir
        ceph_ health detail || rc=1
    fi
    return "$rc"
}

# One start at a time per DIR (the daemons do not inherit the lock's fd).
lock() {
    mkdir -p "$D"
    exec 9>"$D/.lock"
    flock -w "$start_timeout" 9 || die "another start holds $D/.lock"
}

case $cmd in
start) lock && start ;;
stop) stop ;;
status) status ;;
*) usage ;;
esac
