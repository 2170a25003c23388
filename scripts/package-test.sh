#!/usr/bin/env bash
# The Debian package, checked the way a host gets it: built (scripts/package-deb.sh),
# lintian-clean (each override in contrib/debian/lintian-overrides says why), then
# installed on this machine with dpkg -i, used (vnvme --version, man -w vnvme-serve,
# the completions, the unit, a server dropping to the package's account answering
# `vnvme identify`), run under a real systemd (a Debian container booted with
# systemd-nspawn: the README's dpkg -i, example configuration and systemctl enable --now
# vnvme@vm1, identify, systemctl stop), and purged with nothing left behind. Prints one
# line per check
# (PASS, FAIL with the reason, SKIP with the reason) and ends with
#   package-checks: N passed, N failed, N skipped
# Exit 1 if any check failed. Needs root (dpkg -i); a host that has a vnvme package
# installed already is left alone (the install checks skip, saying so).
#
# Usage: scripts/package-test.sh [--no-build]
#   --no-build  package target/release/vnvme as it is (test.sh: the guest tests built it)
set -uo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
# shellcheck source=scripts/lib/packages.sh
source "$ROOT/scripts/lib/packages.sh"
BUILD_ARGS=()
while [ $# -gt 0 ]; do
    case "$1" in
        --no-build) BUILD_ARGS+=(--no-build); shift ;;
        -h|--help) sed -n '2,/^set -uo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
        *) bad_usage "unknown argument: $1" ;;
    esac
done

CHECKS=package
# shellcheck source=scripts/lib/checks.sh
source "$ROOT/scripts/lib/checks.sh"

TMP=$(mktemp -d)
INSTALLED=0
NSPAWN=
cleanup() {
    [ -n "${SERVER:-}" ] && kill "$SERVER" 2>/dev/null
    [ -n "${NSPAWN:-}" ] && kill "$NSPAWN" 2>/dev/null && wait "$NSPAWN" 2>/dev/null
    # An install this script made is never left behind, whatever failed.
    if [ "$INSTALLED" = 1 ]; then
        dpkg --purge vnvme >/dev/null 2>&1
        rm -f /etc/vnvme/vm1.conf
        rmdir /etc/vnvme 2>/dev/null
    fi
    rm -rf "$TMP"
}
trap cleanup EXIT

# ---- build
if ! deb=$("$ROOT/scripts/package-deb.sh" "${BUILD_ARGS[@]}" 2>"$TMP/build.log" | tail -1) || [ ! -f "$deb" ]; then
    fail "build (scripts/package-deb.sh)" "$(tail -5 "$TMP/build.log" | tr '\n' ' ')"
    summary
fi
pass "build: ${deb##*/}"

# ---- contents: what the package must carry, where Debian looks for it
dpkg-deb -c "$deb" | awk '{print $NF}' | sed 's#^\./#/#' >"$TMP/contents"
for f in /usr/bin/vnvme /lib/systemd/system/vnvme@.service /usr/share/man/man1/vnvme.1.gz \
    /usr/share/man/man1/vnvme-serve.1.gz /usr/share/man/man1/vnvme-ctl.1.gz \
    /usr/share/bash-completion/completions/vnvme /usr/share/zsh/vendor-completions/_vnvme \
    /usr/share/fish/vendor_completions.d/vnvme.fish /usr/share/doc/vnvme/copyright \
    /usr/share/doc/vnvme/changelog.Debian.gz /usr/share/doc/vnvme/examples/vm1.conf.example; do
    grep -qxF "$f" "$TMP/contents" || echo "$f" >>"$TMP/absent"
done
if [ -s "$TMP/absent" ]; then fail "contents" "missing: $(tr '\n' ' ' <"$TMP/absent")"; else pass "contents: binary, unit, man pages, completions, docs"; fi

# ---- lintian: errors, warnings and pedantic tags fail; overrides carry their reason
if ! (need_cmds lintian:lintian) >"$TMP/apt-lintian.log" 2>&1; then
    skip "lintian" "lintian could not be installed (see apt's log: $(tail -1 "$TMP/apt-lintian.log"))"
else
    lintian --pedantic --suppress-tags running-with-root-privileges "$deb" >"$TMP/lintian" 2>&1
    if grep -E '^[EWP]: ' "$TMP/lintian" >"$TMP/lintian-bad"; then
        fail "lintian --pedantic" "$(tr '\n' ' ' <"$TMP/lintian-bad")"
    else
        pass "lintian --pedantic: no error, warning or pedantic tag"
    fi
fi

# ---- install, use, purge
if [ "$(id -u)" -ne 0 ]; then
    skip "install" "dpkg -i needs root"
    summary
fi
if dpkg-query -W -f '${Status}' vnvme 2>/dev/null | grep -q 'installed'; then
    skip "install" "a vnvme package is installed on this host already; not replacing it"
    summary
fi
if ! (need_cmds man:man-db adduser:adduser) >"$TMP/apt-man.log" 2>&1; then
    skip "install" "man-db or adduser could not be installed (see apt's log: $(tail -1 "$TMP/apt-man.log"))"
    summary
fi
user_before=$(getent passwd vnvme || true)
if [ -n "$user_before" ]; then
    skip "install" "an account named vnvme exists already; the purge check would remove it"
    summary
fi

INSTALLED=1
if ! out=$(dpkg -i "$deb" 2>&1); then
    fail "dpkg -i" "$(tail -3 <<<"$out" | tr '\n' ' ')"
    summary
fi
pass "dpkg -i"
want=$("$ROOT/target/release/vnvme" --version)
check "vnvme --version from /usr/bin ($want)" bash -c "[ \"\$(/usr/bin/vnvme --version)\" = '$want' ]"
check "man -w vnvme-serve" bash -c '[ "$(man -w vnvme-serve)" = /usr/share/man/man1/vnvme-serve.1.gz ]'
check "man vnvme-serve renders its options" bash -c 'MANWIDTH=100 man vnvme-serve 2>/dev/null | grep -q -- "--socket"'
check "bash completion loads" bash -c 'source /usr/share/bash-completion/completions/vnvme && complete -p vnvme'
check "account vnvme (system user, group vnvme, no login)" bash -c \
    'u=$(getent passwd vnvme) && getent group vnvme >/dev/null && [ "$(cut -d: -f3 <<<"$u")" -lt 1000 ] && [ "$(cut -d: -f7 <<<"$u")" = /usr/sbin/nologin ]'
check "/etc/vnvme made" test -d /etc/vnvme
# The README's next line: the operator's configuration, from the example.
check "cp the example configuration to /etc/vnvme/vm1.conf" \
    cp /usr/share/doc/vnvme/examples/vm1.conf.example /etc/vnvme/vm1.conf
check "the unit starts the packaged binary" bash -c \
    'grep -q "^ExecStart=/usr/bin/vnvme " /lib/systemd/system/vnvme@.service && test -x /usr/bin/vnvme'
if command -v systemd-analyze >/dev/null; then
    cp /lib/systemd/system/vnvme@.service "$TMP/vnvme@vm1.service"
    check "systemd-analyze verify (installed unit)" bash -c \
        "out=\$(systemd-analyze verify --man=no '$TMP/vnvme@vm1.service' 2>&1) && [ -z \"\$out\" ] || { echo \"\$out\"; false; }"
    score=$(cd "$TMP" && systemd-analyze security --offline=yes "$TMP/vnvme@vm1.service" 2>/dev/null | tail -1)
    echo "  (systemd-analyze security --offline: ${score#→ })"
else
    skip "systemd-analyze verify" "systemd-analyze is not installed (Debian: systemd)"
fi
# The example configuration's account, in use: a server started as root drops to
# the package's user and serves.
sock="$TMP/vm1.sock"
/usr/bin/vnvme serve --socket "$sock" --ns ram:16M --user vnvme --once 2>"$TMP/serve.log" &
SERVER=$!
uid=$(id -u vnvme) euid=
for _ in $(seq 100); do
    euid=$(awk '/^Uid:/ {print $3}' "/proc/$SERVER/status" 2>/dev/null)
    [ -S "$sock" ] && [ "$euid" = "$uid" ] && break
    sleep 0.1
done
if [ "$euid" != "$uid" ]; then
    fail "serve --user vnvme" "the server runs as uid ${euid:-?}, not vnvme's $uid: $(tail -2 "$TMP/serve.log" | tr '\n' ' ')"
elif ! out=$(timeout 30 /usr/bin/vnvme identify --socket "$sock" 2>&1) || ! grep -q 'vnvme' <<<"$out"; then
    fail "serve --user vnvme" "identify: $(tail -2 <<<"$out" | tr '\n' ' '); server: $(tail -2 "$TMP/serve.log" | tr '\n' ' ')"
elif ! wait "$SERVER"; then
    fail "serve --user vnvme" "the server exited non-zero: $(tail -2 "$TMP/serve.log" | tr '\n' ' ')"
else
    pass "serve --user vnvme: runs as vnvme, identify answered, the server ended cleanly"
fi
SERVER=

# ---- the README's lines under a real systemd: a Debian container booted with
# systemd-nspawn (this host's PID 1 is not systemd), the package installed in it,
# the example configuration with a RAM namespace, systemctl enable --now vnvme@vm1.
systemd_checks() {
    local cache="$VNVME_CACHE/systemd-root" tarball root nspawn init out i
    tarball="$cache/bookworm-minbase-systemd.tar"
    if [ ! -s "$tarball" ]; then
        log "a Debian root with systemd for the container (debootstrap, once, cached)"
        mkdir -p "$cache"
        rm -rf "$cache/tmp"
        debootstrap --variant=minbase --include=systemd,systemd-sysv,dbus,adduser bookworm \
            "$cache/tmp" "$VNVME_DEBIAN_MIRROR" >"$TMP/debootstrap.log" 2>&1 ||
            { skip "systemd" "debootstrap failed: $(tail -1 "$TMP/debootstrap.log")"; return; }
        tar -C "$cache/tmp" -cf "$tarball.part" . && mv "$tarball.part" "$tarball"
        rm -rf "$cache/tmp"
    fi
    root="$TMP/root"
    mkdir -p "$root"
    tar -C "$root" -xf "$tarball"
    cp "$deb" "$root/root/vnvme.deb"
    systemd-nspawn -q -D "$root" --boot --register=no --keep-unit --console=passive \
        --machine="vnvme-pkg-$$" </dev/null >"$TMP/nspawn.log" 2>&1 &
    nspawn=$!
    NSPAWN=$nspawn
    for i in $(seq 100); do
        init=$(pgrep -P "$nspawn" | head -1)
        [ -n "$init" ] && nsenter -t "$init" -a systemctl is-system-running 2>/dev/null | grep -qE 'running|degraded' && break
        init=
        sleep 0.3
    done
    if [ -z "$init" ]; then
        fail "systemd in a container" "the container did not boot: $(tail -2 "$TMP/nspawn.log" | tr '\n' ' ')"
        return
    fi
    in_ct() { nsenter -t "$init" -a "$@"; }
    pass "systemd boots in a container (systemd-nspawn, Debian bookworm)"
    # The README, line by line (dpkg -i, the example configuration, systemctl).
    if out=$(in_ct bash -c 'dpkg -i /root/vnvme.deb &&
            cp /usr/share/doc/vnvme/examples/vm1.conf.example /etc/vnvme/vm1.conf &&
            sed -i "s#^VNVME_NS=.*#VNVME_NS=--ns ram:64M#" /etc/vnvme/vm1.conf &&
            systemctl enable --now vnvme@vm1' 2>&1) &&
        in_ct bash -c 'for i in $(seq 50); do [ -S /run/vnvme/vm1.sock ] && exit 0; sleep 0.1; done; exit 1'; then
        pass "systemctl enable --now vnvme@vm1: active, /run/vnvme/vm1.sock there"
    else
        fail "systemctl enable --now vnvme@vm1" "$(in_ct systemctl status vnvme@vm1 --no-pager 2>&1 | tail -3 | tr '\n' ' ') $out"
        return
    fi
    if out=$(in_ct vnvme identify --socket /run/vnvme/vm1.sock 2>&1) && grep -q 'vnvme' <<<"$out"; then
        pass "the unit's server answers vnvme identify"
    else
        fail "the unit's server answers vnvme identify" "$(tail -2 <<<"$out" | tr '\n' ' ')"
    fi
    out=$(in_ct bash -c 'stat -c %U /proc/$(systemctl show -p MainPID --value vnvme@vm1)' 2>&1)
    [ "$out" = vnvme ] && pass "the unit's server runs as vnvme (the example's --user)" ||
        fail "the unit's server runs as vnvme" "runs as $out"
    echo "  (systemd-analyze security vnvme@vm1, online: $(in_ct systemd-analyze security vnvme@vm1 2>/dev/null | tail -1 | sed 's/^→ //'))"
    out=$(in_ct bash -c 'systemctl stop vnvme@vm1; systemctl show -p Result --value vnvme@vm1; systemctl show -p ExecMainStatus --value vnvme@vm1' 2>&1)
    if [ "$(tr '\n' ' ' <<<"$out")" = "success 0 " ]; then
        pass "systemctl stop: the server ends cleanly (result success, exit 0)"
    else
        fail "systemctl stop" "$(tr '\n' ' ' <<<"$out")"
    fi
    in_ct systemctl poweroff >/dev/null 2>&1 || kill "$nspawn" 2>/dev/null
    wait "$nspawn" 2>/dev/null
    NSPAWN=
}
if ! (need_cmds systemd-nspawn:systemd-container debootstrap:debootstrap nsenter:util-linux) >"$TMP/apt-ns.log" 2>&1; then
    skip "systemd" "systemd-nspawn or debootstrap could not be installed ($(tail -1 "$TMP/apt-ns.log"))"
else
    systemd_checks
fi

# Purge: nothing the package put down, nor the account and directory it made, stays.
if ! out=$(dpkg --purge vnvme 2>&1); then
    fail "dpkg --purge" "$(tail -3 <<<"$out" | tr '\n' ' ')"
    summary
fi
INSTALLED=0
left=()
while read -r f; do
    [ -z "$f" ] || [ "${f: -1}" = / ] && continue
    [ -e "$f" ] && left+=("$f")
done <"$TMP/contents"
# The operator's file survives the purge (and with it the directory); then it goes.
if [ -f /etc/vnvme/vm1.conf ] && [ "$(ls -A /etc/vnvme)" = vm1.conf ]; then
    pass "dpkg --purge keeps the operator's /etc/vnvme/vm1.conf"
else
    fail "dpkg --purge keeps the operator's /etc/vnvme/vm1.conf" "$(ls -A /etc/vnvme 2>&1 | tr '\n' ' ')"
fi
rm -f /etc/vnvme/vm1.conf
rmdir /etc/vnvme 2>/dev/null
[ -e /etc/vnvme ] && left+=(/etc/vnvme)
getent passwd vnvme >/dev/null && left+=("account vnvme")
getent group vnvme >/dev/null && left+=("group vnvme")
dpkg-query -W -f '${Status}' vnvme 2>/dev/null | grep -q 'installed\|config-files' && left+=("dpkg status")
if [ ${#left[@]} -eq 0 ]; then
    pass "dpkg --purge leaves nothing ($(grep -c . "$TMP/contents") paths checked, account, group, /etc/vnvme)"
else
    fail "dpkg --purge leaves nothing" "left: ${left[*]}"
fi
summary
