#!/usr/bin/env bash
# Ceph (Debian bookworm's 16.2.x) for the rbd:// tests: the monitor and OSD daemons,
# the admin tools (ceph-authtool, monmaptool, rbd, rados, the `ceph` CLI), librbd /
# librados with their headers, and the python3 rados/rbd bindings. The packages and
# every library they need are downloaded through the private apt state of
# scripts/lib/packages.sh and extracted into the cache, never installed. Bookworm is
# the host's own suite: its Python modules are built for the host's python3.11 and
# its librbd runs against the host's glibc.
#
#   scripts/fetch-ceph.sh      fetch once (cached), verify, print the bin dir
#
# Result, in $VNVME_CACHE/ceph/current (a symlink to the version's directory):
#   bin/{ceph-mon,ceph-osd,ceph-authtool,monmaptool,rbd,rados}
#                 run through the extracted root's own dynamic loader
#   bin/ceph      the Python CLI, run by the host's python3 (3.11)
#   env.sh        for a host process that dlopens librbd or imports rados/rbd:
#                 VNVME_LIBRBD (librbd.so.1), VNVME_CEPH_ROOT, VNVME_CEPH_INCLUDE,
#                 VNVME_CEPH_PLUGINS (ceph's private lib dir: plugin_dir,
#                 erasure_code_dir, rados-classes), VNVME_CEPH_PYTHON,
#                 LD_LIBRARY_PATH and PYTHONPATH (prepended)
#   root/         the extracted packages (include/rados, include/rbd)
#   hostlib/      the extracted shared libraries minus glibc's own, as symlinks:
#                 what LD_LIBRARY_PATH gives a process run by the host's loader
# scripts/ceph-cluster.sh runs a single-node cluster with these.
# Exit 1, saying why, when the packages cannot be had (no network).
set -euo pipefail
# Standard output is the bin directory and nothing else (callers read it as a path):
# what the tools below print (apt-get's progress among it) goes to stderr.
exec 3>&1 1>&2
# shellcheck source=scripts/lib/packages.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib/packages.sh"

suite=bookworm
dir="$VNVME_CACHE/ceph"
pkgs=(ceph-mon ceph-osd ceph-common librbd-dev librbd1 librados2 librados-dev
    python3-rados python3-rbd)

# The host's python3 for the CLI and the bindings: Debian's own when present (a
# python3 earlier on PATH, e.g. pyenv's, may be another build), else the first on PATH.
host_python() {
    local p
    for p in "${VNVME_PYTHON3:-}" /usr/bin/python3 "$(command -v python3 || true)"; do
        [[ -n $p && -x $p ]] || continue
        "$p" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 11))' 2>/dev/null || continue
        printf '%s\n' "$p"
        return 0
    done
    return 1
}

verify() {
    local d=$1 b=$1/bin
    "$b/ceph-mon" --version 2>/dev/null | grep -q '^ceph version 16\.' &&
        "$b/ceph-osd" --version 2>/dev/null | grep -q '^ceph version 16\.' &&
        "$b/rbd" --version 2>/dev/null | grep -q '^ceph version 16\.' &&
        [[ -x $b/ceph-authtool && -x $b/monmaptool && -x $b/rados && -x $b/ceph ]] &&
        [[ -e $d/root/usr/include/rbd/librbd.h && -e $d/root/usr/include/rados/librados.h ]] &&
        # The host's python3 imports the bindings (the ceph CLI's rados among them).
        (
            # shellcheck source=/dev/null
            . "$d/env.sh" && [[ -e $VNVME_LIBRBD ]] &&
                "$VNVME_CEPH_PYTHON" -c 'import rados, rbd, ceph_argparse' 2>/dev/null
        )
}

if [[ -e $dir/current/.complete ]] && verify "$dir/current"; then
    printf '%s\n' "$dir/current/bin" >&3
    exit 0
fi

need_cmds dpkg-deb:dpkg apt-get:apt
python=$(host_python) || die "no python3.11 on the host (bookworm's ceph modules are built for 3.11); set VNVME_PYTHON3"
papt_init "$suite" "$(suite_sources "$suite")"
(papt_update "$suite") || die "could not update the $suite package lists (is the Debian archive reachable?)"
list=$(mktemp)
trap 'rm -f "$list"' EXIT
# papt_fetch_closure exits on failure: run it in a subshell, and once more after
# refreshing the lists (they may name packages the archive has since replaced).
if ! (papt_fetch_closure "$suite" "$list" "${pkgs[@]}"); then
    log "download failed; refreshing the $suite package lists once"
    (papt_update "$suite" force) || die "could not update the $suite package lists (is the Debian archive reachable?)"
    (papt_fetch_closure "$suite" "$list" "${pkgs[@]}") ||
        die "could not download ceph (${pkgs[*]}) from $suite"
fi
ver=$(dpkg-deb -f "$(grep '/ceph-osd_' "$list")" Version)
dest="$dir/${ver//[:~]/_}"
rm -rf "$dest.tmp"
root="$dest.tmp/root"
extract_debs "$root" "$list"
relativize_symlinks "$root"
loader=$(find_loader "$root") || die "no ld-linux in the extracted packages"
arch=x86_64-linux-gnu
plugins=usr/lib/$arch/ceph
[[ -e $root/$plugins/libceph-common.so.2 ]] || die "no $plugins/libceph-common.so.2 in the packages"
[[ -e $root/usr/lib/$arch/librbd.so.1 ]] || die "no usr/lib/$arch/librbd.so.1 in the packages"
[[ -d $root/usr/lib/$arch/rados-classes ]] || die "no usr/lib/$arch/rados-classes in the packages"

# hostlib: every extracted shared library except glibc's own (the host's loader
# must keep the host's libc), for LD_LIBRARY_PATH of host processes.
glibc_files=$(dpkg-deb --fsys-tarfile "$(grep '/libc6_' "$list")" | tar -t | sed 's#.*/##' | sort -u)
mkdir -p "$dest.tmp/hostlib"
for f in "$root"/lib/"$arch"/*.so* "$root"/usr/lib/"$arch"/*.so*; do
    n=${f##*/}
    [[ -f $f && ! -e $dest.tmp/hostlib/$n ]] || continue
    grep -qxF "$n" <<<"$glibc_files" && continue
    ln -s "../root/${f#"$root/"}" "$dest.tmp/hostlib/$n"
done

mkdir -p "$dest.tmp/bin"
for prog in ceph-mon ceph-osd ceph-authtool monmaptool rbd rados; do
    [[ -x $root/usr/bin/$prog ]] || die "$prog is not in the packages"
    # shellcheck disable=SC2016 # $R is expanded by the generated wrapper
    cat >"$dest.tmp/bin/$prog" <<EOF
#!/bin/sh
R=\$(dirname "\$(dirname "\$(readlink -f "\$0")")")/root
exec "\$R/${loader#"$root/"}" --inhibit-cache --library-path "\$R/$plugins:$(lib_path '$R')" \\
    --argv0 "\$0" "\$R/usr/bin/$prog" "\$@"
EOF
    chmod +x "$dest.tmp/bin/$prog"
done
[[ -e $root/usr/bin/ceph ]] || die "the ceph CLI is not in the packages"
# shellcheck disable=SC2016 # $D and $R are expanded by the generated wrapper
cat >"$dest.tmp/bin/ceph" <<EOF
#!/bin/sh
D=\$(dirname "\$(dirname "\$(readlink -f "\$0")")")
R=\$D/root
PYTHONPATH="\$R/usr/lib/python3/dist-packages\${PYTHONPATH:+:\$PYTHONPATH}" \\
LD_LIBRARY_PATH="\$D/hostlib:\$R/$plugins\${LD_LIBRARY_PATH:+:\$LD_LIBRARY_PATH}" \\
    exec "$python" "\$R/usr/bin/ceph" "\$@"
EOF
chmod +x "$dest.tmp/bin/ceph"

cat >"$dest.tmp/env.sh" <<EOF
# Source this (sh or bash) for a host process that dlopens librbd / librados or
# imports the python3 rados and rbd modules ($ver, from $suite).
export VNVME_CEPH_VERSION='$ver'
export VNVME_CEPH_ROOT='$dest/root'
export VNVME_CEPH_BIN='$dest/bin'
export VNVME_LIBRBD='$dest/root/usr/lib/$arch/librbd.so.1'
export VNVME_LIBRADOS='$dest/root/usr/lib/$arch/librados.so.2'
export VNVME_CEPH_INCLUDE='$dest/root/usr/include'
export VNVME_CEPH_PLUGINS='$dest/root/$plugins'
export VNVME_CEPH_CLASSES='$dest/root/usr/lib/$arch/rados-classes'
export VNVME_CEPH_PYTHON='$python'
export LD_LIBRARY_PATH="$dest/hostlib:$dest/root/$plugins\${LD_LIBRARY_PATH:+:\$LD_LIBRARY_PATH}"
export PYTHONPATH="$dest/root/usr/lib/python3/dist-packages\${PYTHONPATH:+:\$PYTHONPATH}"
EOF
printf 'ceph %s (%s)\n' "$ver" "$suite" >"$dest.tmp/VERSION"
rm -rf "$dest"
mv "$dest.tmp" "$dest"
verify "$dest" || die "the extracted ceph does not run ($dest)"
touch "$dest/.complete"
ln -sfn "${dest##*/}" "$dir/current.tmp"
mv -T "$dir/current.tmp" "$dir/current"
log "ceph $ver in $dir/current"
printf '%s\n' "$dir/current/bin" >&3
