#!/usr/bin/env bash
# Build a guest initramfs per kernel: busybox, fio, nvme-cli, e2fsprogs,
# blkzone (util-linux) and mkfs.btrfs (with their shared libraries, from
# bookworm packages), trixie's fio as /usr/bin/fio-fdp (Flexible Data
# Placement; its own loader and libraries under /opt/fio-trixie), the kernel's
# modules and the /init of scripts/guest/rootfs.
set -euo pipefail
# shellcheck source=scripts/lib/packages.sh
source "$(dirname "${BASH_SOURCE[0]}")/../lib/packages.sh"

usage() {
    cat <<EOF
Usage: ${0##*/} [--rebuild] [--help] [KERNEL...]

KERNEL: bookworm, newest (see fetch-kernels.sh) or a kernel release fetched
into \$VNVME_CACHE/kernels. Default: bookworm newest.

1. Once: downloads busybox-static, fio, nvme-cli, e2fsprogs, util-linux,
   btrfs-progs and their
   dependency closure from bookworm, extracts them, and stages the binaries
   plus exactly the shared libraries they need (ELF NEEDED entries resolved by
   the packaged ld-linux --list) into \$VNVME_CACHE/userland/bookworm.
   Likewise, once: trixie's fio (new enough for fdp=1, fdp_pli=) and exactly
   the libraries it needs, with trixie's own ld-linux, under /opt/fio-trixie,
   plus /usr/bin/fio-fdp, a wrapper running it through that loader:
   \$VNVME_CACHE/userland/fio-trixie. /usr/bin/fio stays bookworm's.
2. Per kernel: userland + fio-fdp + kernel modules (+ modules.load, the
   insmod order) + scripts/guest/rootfs (/init, helpers) -> newc cpio,
   zstd-compressed: \$VNVME_CACHE/initramfs/KVER.cpio.zst. Rebuilt only when
   an input changed.

/init loads the modules, waits for NVMe controllers, runs /guest-run.sh (which
boot.sh appends as a second cpio archive), prints VNVME_GUEST_EXIT=<status>
and powers off.
  --rebuild   rebuild the userland, fio-fdp and the initramfs even if up to date
EOF
}

rebuild=0
kernels=()
while [[ $# -gt 0 ]]; do
    case $1 in
    --rebuild) rebuild=1; shift ;;
    -h | --help) usage; exit 0 ;;
    -*) usage >&2; exit 2 ;;
    *) kernels+=("$1"); shift ;;
    esac
done
[[ ${#kernels[@]} -gt 0 ]] || kernels=(bookworm newest)

USERLAND_PKGS=(busybox-static fio nvme-cli e2fsprogs util-linux btrfs-progs)
# Binaries taken from the packages (path inside the extracted tree).
USERLAND_BINS=(bin/busybox usr/bin/fio usr/sbin/nvme sbin/mke2fs sbin/e2fsck
    sbin/tune2fs sbin/dumpe2fs sbin/resize2fs sbin/debugfs sbin/blkzone sbin/mkfs.btrfs)
uldir="$VNVME_CACHE/userland/bookworm"
rootfs_src="$VNVME_GUEST_DIR/rootfs"
# A second fio, new enough for Flexible Data Placement (fdp=1, fdp_pli=; the
# bookworm one has neither), from trixie: /usr/bin/fio stays bookworm's. It
# comes with trixie's own loader and libraries under /$FDP_PREFIX, apart from
# bookworm's libc, and runs through the /usr/bin/fio-fdp wrapper.
FDP_SUITE=trixie
FDP_PKGS=(fio)
FDP_BIN=usr/bin/fio
FDP_PREFIX=opt/fio-$FDP_SUITE
fdpdir="$VNVME_CACHE/userland/fio-$FDP_SUITE"

# What the staged userland is made of: a change restages it.
userland_inputs() {
    printf '%s\n' "${USERLAND_PKGS[@]}" "${USERLAND_BINS[@]}" | sha256sum | cut -d' ' -f1
}

# stage_needed X LOADER LIBDIR BIN...: copy into LIBDIR the shared libraries
# the binaries BIN (paths inside the extracted tree X) need, their ELF NEEDED
# closure as the packaged LOADER resolves it within X. Static BINs are skipped.
stage_needed() {
    local x=$1 loader=$2 dest=$3 b f libs lp
    shift 3
    # Standard dirs first, then any other dir holding libraries (RUNPATHs like
    # /usr/lib/x86_64-linux-gnu/ceph point at the host, not at the tree).
    lp="$(lib_path "$x")$(find "$x" -name '*.so*' -printf ':%h' | tr ':' '\n' | sort -u | tr '\n' ':')"
    for b in "$@"; do
        "$loader" --verify "$x/$b" >/dev/null 2>&1 || continue # static
        libs=$("$loader" --inhibit-cache --library-path "${lp%:}" --list "$x/$b")
        if grep 'not found' <<<"$libs" >&2; then die "$b: unresolved libraries"; fi
        while read -r f; do
            [[ $f == "$x"/* ]] || die "$b: library outside the package tree: $f"
            [[ ${f##*/} == ld-linux-x86-64.so.2 ]] && continue
            cp -L "$f" "$dest/${f##*/}"
        done < <(awk '$2 == "=>" && $3 ~ /^\// {print $3}' <<<"$libs")
    done
}

# check_staged ROOT LIBDIR BIN...: the staged binaries ROOT/BIN resolve every
# library inside LIBDIR alone, with the loader staged at ROOT/lib64.
check_staged() {
    local root=$1 libdir=$2 ld b libs
    shift 2
    ld="$root/lib64/ld-linux-x86-64.so.2"
    for b in "$@"; do
        "$ld" --verify "$root/$b" >/dev/null 2>&1 || continue # static
        libs=$("$ld" --inhibit-cache --library-path "$libdir" --list "$root/$b")
        if grep -E 'not found' <<<"$libs" >&2; then die "staged $b: unresolved libraries"; fi
    done
}

stage_userland() {
    if [[ $rebuild -eq 0 && -e $uldir/.complete && $(cat "$uldir/.inputs" 2>/dev/null) == "$(userland_inputs)" ]]; then
        log "userland: cached ($uldir)"
        return 0
    fi
    papt_init bookworm "$(suite_sources bookworm)"
    papt_update bookworm
    local list tmp x st loader b
    tmp="$uldir.tmp"
    rm -rf "$tmp"
    mkdir -p "$tmp"
    list="$tmp/packages.list"
    papt_fetch_closure bookworm "$list" "${USERLAND_PKGS[@]}"
    x="$tmp/x"
    st="$tmp/root"
    extract_debs "$x" "$list"
    relativize_symlinks "$x"
    loader=$(find_loader "$x") || die "no ld-linux in bookworm packages"

    log "staging binaries and their libraries"
    mkdir -p "$st/lib64" "$st/lib/x86_64-linux-gnu" "$st/etc" "$st/bin" "$st/sbin" "$st/usr/bin" "$st/usr/sbin"
    cp -L "$loader" "$st/lib64/ld-linux-x86-64.so.2"
    for b in "${USERLAND_BINS[@]}"; do
        [[ -f $x/$b ]] || die "$b not found in the extracted packages"
        cp -L "$x/$b" "$st/$b"
    done
    ln -s mke2fs "$st/sbin/mkfs.ext4"
    ln -s e2fsck "$st/sbin/fsck.ext4"
    cp "$x/etc/mke2fs.conf" "$st/etc/"
    # glibc dlopens libgcc_s for thread cancellation/unwinding.
    cp -L "$x/lib/x86_64-linux-gnu/libgcc_s.so.1" "$st/lib/x86_64-linux-gnu/"
    stage_needed "$x" "$loader" "$st/lib/x86_64-linux-gnu" "${USERLAND_BINS[@]}"
    check_staged "$st" "$st/lib/x86_64-linux-gnu" "${USERLAND_BINS[@]}"
    # busybox applets for everything the packages do not provide.
    local a
    while read -r a; do
        [[ -e $st/$a || -L $st/$a ]] && continue
        mkdir -p "$st/$(dirname "$a")"
        ln -s "$(realpath -m --relative-to="$st/$(dirname "$a")" "$st/bin/busybox")" "$st/$a"
    done < <("$st/bin/busybox" --list-full)
    sed 's|.*/||' "$list" >"$st/.packages"
    rm -rf "$x"
    rm -rf "$uldir"
    mv "$tmp" "$uldir"
    userland_inputs >"$uldir/.inputs"
    sha256sum "$uldir/root/.packages" | cut -d' ' -f1 >"$uldir/.complete"
    papt bookworm apt-get clean # the .debs are no longer needed
    log "userland: staged $(du -sh "$uldir/root" | cut -f1) ($(find "$uldir/root" -type f | wc -l) files)"
}

# fdp_wrapper DIR: the /usr/bin/fio-fdp script for the tree staged at DIR.
fdp_wrapper() {
    cat <<EOF
#!/bin/sh
# fio from Debian $FDP_SUITE (Flexible Data Placement: fdp=1, fdp_pli=), run
# by its own loader with its own libraries; /usr/bin/fio is bookworm's.
d='$1'
exec "\$d/lib64/ld-linux-x86-64.so.2" --inhibit-cache --library-path "\$d/lib/x86_64-linux-gnu" "\$d/$FDP_BIN" "\$@"
EOF
}

# What the staged FDP fio is made of: a change restages it.
fdp_inputs() {
    { printf '%s\n' "$FDP_SUITE" "${FDP_PKGS[@]}" "$FDP_BIN" "$FDP_PREFIX"; fdp_wrapper "/$FDP_PREFIX"; } |
        sha256sum | cut -d' ' -f1
}

# Like stage_userland, for the FDP fio: $fdpdir/root holds /$FDP_PREFIX (the
# binary, trixie's loader and the libraries it needs) and /usr/bin/fio-fdp.
stage_fio_fdp() {
    if [[ $rebuild -eq 0 && -e $fdpdir/.complete && $(cat "$fdpdir/.inputs" 2>/dev/null) == "$(fdp_inputs)" ]]; then
        log "fio-fdp: cached ($fdpdir)"
        return 0
    fi
    papt_init "$FDP_SUITE" "$(suite_sources "$FDP_SUITE")"
    papt_update "$FDP_SUITE"
    local list tmp x st t loader l opt out
    tmp="$fdpdir.tmp"
    rm -rf "$tmp"
    mkdir -p "$tmp"
    list="$tmp/packages.list"
    papt_fetch_closure "$FDP_SUITE" "$list" "${FDP_PKGS[@]}"
    x="$tmp/x"
    st="$tmp/root"
    t="$st/$FDP_PREFIX"
    extract_debs "$x" "$list"
    relativize_symlinks "$x"
    loader=$(find_loader "$x") || die "no ld-linux in $FDP_SUITE packages"

    log "staging $FDP_SUITE's fio and its libraries under /$FDP_PREFIX"
    mkdir -p "$t/lib64" "$t/lib/x86_64-linux-gnu" "$t/${FDP_BIN%/*}" "$st/usr/bin"
    cp -L "$loader" "$t/lib64/ld-linux-x86-64.so.2"
    [[ -f $x/$FDP_BIN ]] || die "$FDP_BIN not found in the extracted $FDP_SUITE packages"
    cp -L "$x/$FDP_BIN" "$t/$FDP_BIN"
    # glibc dlopens libgcc_s for thread cancellation/unwinding (trixie ships
    # it below usr/, bookworm below lib/).
    for l in usr/lib lib; do
        [[ -e $x/$l/x86_64-linux-gnu/libgcc_s.so.1 ]] || continue
        cp -L "$x/$l/x86_64-linux-gnu/libgcc_s.so.1" "$t/lib/x86_64-linux-gnu/"
        break
    done
    [[ -e $t/lib/x86_64-linux-gnu/libgcc_s.so.1 ]] || die "no libgcc_s.so.1 in the $FDP_SUITE packages"
    stage_needed "$x" "$loader" "$t/lib/x86_64-linux-gnu" "$FDP_BIN"
    check_staged "$t" "$t/lib/x86_64-linux-gnu" "$FDP_BIN"
    fdp_wrapper "/$FDP_PREFIX" >"$st/usr/bin/fio-fdp"
    chmod 755 "$st/usr/bin/fio-fdp"
    # The wrapper's own command line on the staged tree: it runs, and its fio
    # knows the FDP options ("No such command" otherwise).
    fdp_wrapper "$t" >"$tmp/fio-fdp.host"
    sh "$tmp/fio-fdp.host" --version >/dev/null || die "the staged fio-fdp does not run"
    for opt in fdp fdp_pli; do
        out=$(sh "$tmp/fio-fdp.host" --cmdhelp="$opt" 2>&1) || true
        if [[ -z $out ]] || grep -qi 'no such command' <<<"$out"; then
            die "$FDP_SUITE's fio has no $opt option"
        fi
    done
    rm -f "$tmp/fio-fdp.host"
    sed 's|.*/||' "$list" >"$tmp/packages"
    rm -rf "$x"
    rm -rf "$fdpdir"
    mv "$tmp" "$fdpdir"
    fdp_inputs >"$fdpdir/.inputs"
    sha256sum "$fdpdir/packages" | cut -d' ' -f1 >"$fdpdir/.complete"
    papt "$FDP_SUITE" apt-get clean # the .debs are no longer needed
    log "fio-fdp: staged $(du -sh "$fdpdir/root" | cut -f1) ($(find "$fdpdir/root" -type f | wc -l) files)"
}

build_one() {
    local k=$1 kd kver out stamp want work
    kd=$(kernel_dir "$k")
    [[ -e $kd/.complete ]] || die "kernel $k not fetched; run fetch-kernels.sh"
    kver=$(cat "$kd/KVER")
    out="$VNVME_CACHE/initramfs/$kver.cpio.zst"
    stamp="$out.inputs"
    want=$({
        cat "$uldir/.complete" "$fdpdir/.complete" "$kd/PACKAGE" "$kd/lib/modules/$kver/modules.load" "${BASH_SOURCE[0]}"
        (cd "$rootfs_src" && find . -type f | LC_ALL=C sort | xargs sha256sum)
    } | sha256sum | cut -d' ' -f1)
    if [[ $rebuild -eq 0 && -s $out && -f $stamp && $(cat "$stamp") == "$want" ]] && zstd -q -t "$out"; then
        log "initramfs for $kver: up to date ($out)"
        return 0
    fi
    log "building initramfs for $kver"
    mkdir -p "$VNVME_CACHE/initramfs"
    work=$(mktemp -d "$VNVME_CACHE/initramfs/.work.XXXXXX")
    # shellcheck disable=SC2064
    trap "rm -rf '$work'" RETURN
    cp -a "$uldir/root/." "$work/"
    rm -f "$work/.packages"
    cp -a "$fdpdir/root/." "$work/"
    mkdir -p "$work/lib/modules"
    cp -a "$kd/lib/modules/$kver" "$work/lib/modules/"
    cp -a "$rootfs_src/." "$work/"
    mkdir -p "$work/proc" "$work/sys" "$work/dev" "$work/tmp" "$work/run" "$work/mnt" "$work/root"
    (cd "$work" && find . -mindepth 1 | LC_ALL=C sort |
        cpio -o -H newc -R 0:0 --reproducible --quiet) | zstd -q -T0 -12 >"$out.tmp"
    # Extra archives go *before* this one (boot.sh does so): an uncompressed
    # cpio is padded to 512 bytes by cpio, so the concatenation stays aligned.
    mv "$out.tmp" "$out"
    printf '%s\n' "$want" >"$stamp"
    log "initramfs for $kver: $out ($(du -h "$out" | cut -f1))"
}

need_cmds cpio:cpio zstd:zstd dpkg-deb:dpkg apt-get:apt realpath:coreutils
stage_userland
stage_fio_fdp
for k in "${kernels[@]}"; do build_one "$k"; done
