#!/usr/bin/env bash
# Real NBD servers for the nbd:// tests: qemu-nbd and qemu-img (Debian's qemu-utils,
# from the suite the guest tests take QEMU from) and nbdkit with its basic plugins
# (memory among them). The packages and every library they need are downloaded
# through the private apt state of scripts/lib/packages.sh and extracted into the cache,
# never installed; wrappers run each program through the extracted root's own
# dynamic loader, so host paths (sockets, images) work unchanged.
#
#   scripts/fetch-nbd-servers.sh     fetch once (cached), verify, print the bin dir
#
# Result: $VNVME_CACHE/nbd-servers/current/bin/{qemu-nbd,qemu-img,nbdkit}, and
# NBDKIT_PLUGINS=$VNVME_CACHE/nbd-servers/current/plugins (nbdkit takes a plugin by
# its path there, e.g. "$NBDKIT_PLUGINS/nbdkit-memory-plugin.so size=64M").
# Exit 1, saying why, when the packages cannot be had (no network).
set -euo pipefail
# Standard output is the bin directory and nothing else (callers read it as a path):
# what the tools below print (apt-get's progress among it) goes to stderr.
exec 3>&1 1>&2
# shellcheck source=scripts/lib/packages.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib/packages.sh"

suite="${VNVME_QEMU_SUITE:-trixie-backports}"
dir="$VNVME_CACHE/nbd-servers"

verify() {
    local b=$1/bin
    "$b/qemu-nbd" --version 2>/dev/null | grep -q 'qemu-nbd' &&
        "$b/qemu-img" --version 2>/dev/null | grep -q '^qemu-img' &&
        "$b/nbdkit" --version 2>/dev/null | grep -q '^nbdkit' &&
        [[ -e $1/plugins/nbdkit-memory-plugin.so ]]
}

if [[ -e $dir/current/.complete ]] && verify "$dir/current"; then
    printf '%s\n' "$dir/current/bin" >&3
    exit 0
fi

need_cmds dpkg-deb:dpkg apt-get:apt
name="qemu-$suite"
papt_init "$name" "$(suite_sources "$suite")"
papt_update "$name"
list=$(mktemp)
trap 'rm -f "$list"' EXIT
papt_fetch_closure "$name" "$list" -t "$suite" qemu-utils nbdkit ||
    die "could not download qemu-utils and nbdkit from $suite"
ver=$(dpkg-deb -f "$(grep '/qemu-utils_' "$list")" Version)
kver=$(dpkg-deb -f "$(grep '/nbdkit_' "$list")" Version)
dest="$dir/qemu-utils-${ver//[:~]/_}-nbdkit-${kver//[:~]/_}"
rm -rf "$dest.tmp"
extract_debs "$dest.tmp/root" "$list"
relativize_symlinks "$dest.tmp/root"
root="$dest.tmp/root"
loader=$(find_loader "$root") || die "no ld-linux in the extracted packages"
mkdir -p "$dest.tmp/bin"
for prog in qemu-nbd qemu-img nbdkit; do
    [[ -x $root/usr/bin/$prog || -x $root/usr/sbin/$prog ]] || die "$prog is not in the packages"
    path=usr/bin/$prog
    [[ -x $root/$path ]] || path=usr/sbin/$prog
    # shellcheck disable=SC2016 # $R is expanded by the generated wrapper
    cat >"$dest.tmp/bin/$prog" <<EOF
#!/bin/sh
R=\$(dirname "\$(dirname "\$(readlink -f "\$0")")")/root
exec "\$R/${loader#"$root/"}" --inhibit-cache --library-path "$(lib_path '$R')" \\
    --argv0 "\$0" "\$R/$path" "\$@"
EOF
    chmod +x "$dest.tmp/bin/$prog"
done
ln -s root/usr/lib/x86_64-linux-gnu/nbdkit/plugins "$dest.tmp/plugins"
printf 'qemu-utils %s\nnbdkit %s\n' "$ver" "$kver" >"$dest.tmp/VERSION"
rm -rf "$dest"
mv "$dest.tmp" "$dest"
verify "$dest" || die "the extracted qemu-nbd, qemu-img or nbdkit do not run ($dest)"
touch "$dest/.complete"
ln -sfn "${dest##*/}" "$dir/current.tmp"
mv -T "$dir/current.tmp" "$dir/current"
log "qemu-utils $ver and nbdkit $kver in $dir/current"
printf '%s\n' "$dir/current/bin" >&3
