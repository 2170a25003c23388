#!/usr/bin/env bash
# Fetch guest kernels from Debian: vmlinuz plus the module subset the guest
# needs (with dependencies from modules.dep), decompressed for busybox insmod.
set -euo pipefail
# shellcheck source=scripts/lib/packages.sh
source "$(dirname "${BASH_SOURCE[0]}")/../lib/packages.sh"

DEFAULT_MODULES="nvme nvme_core virtio_pci virtio_blk null_blk ext4"
OPTIONAL_MODULES="crc32c_generic crc32c_intel btrfs"

usage() {
    cat <<EOF
Usage: ${0##*/} [--refresh] [--help] [bookworm|newest]...

Fetches Debian's generic amd64 kernel image (linux-image-*-amd64) and keeps
vmlinuz plus the modules the guest needs and their modules.dep dependencies:
  bookworm  newest linux-image-6.1.0-*-amd64 of bookworm (+updates, security)
  newest    newest linux-image-*-amd64 of sid and trixie-backports
Default: both.

Modules: \$VNVME_GUEST_MODULES (default: $DEFAULT_MODULES),
plus, when the kernel has them: $OPTIONAL_MODULES.
Modules are stored uncompressed, with modules.load (insmod order) and a
modules.dep for that subset.

Cache: \$VNVME_CACHE/kernels/KVER/{vmlinuz,lib/modules/KVER,KVER,PACKAGE}
       \$VNVME_CACHE/kernels/{bookworm,newest} -> KVER
(VNVME_CACHE=${VNVME_CACHE}). A second run only verifies.
  --refresh   re-read the archive and fetch again even if cached
EOF
}

refresh=0
which=()
while [[ $# -gt 0 ]]; do
    case $1 in
    --refresh) refresh=1; shift ;;
    -h | --help) usage; exit 0 ;;
    bookworm | newest) which+=("$1"); shift ;;
    *) usage >&2; exit 2 ;;
    esac
done
[[ ${#which[@]} -gt 0 ]] || which=(bookworm newest)
modules="${VNVME_GUEST_MODULES:-$DEFAULT_MODULES}"
kroot="$VNVME_CACHE/kernels"

# verify DIR: vmlinuz, module files and load list are present.
verify() {
    local d=$1 kver m
    [[ -e $d/.complete && -s $d/vmlinuz && -s $d/KVER ]] || return 1
    # Fetched for another module list: fetch again.
    [[ $(cat "$d/MODULES" 2>/dev/null) == "$modules + $OPTIONAL_MODULES" ]] || return 1
    kver=$(cat "$d/KVER")
    [[ -s $d/lib/modules/$kver/modules.load && -s $d/lib/modules/$kver/modules.dep ]] || return 1
    while read -r m; do
        [[ -s $d/lib/modules/$kver/$m ]] || { log "missing $m"; return 1; }
    done <"$d/lib/modules/$kver/modules.load"
    printf '%s\n' "$kver"
}

# newest_image APTNAME: name of the kernel package behind the highest version
# of the linux-image-amd64 metapackage known to that apt state.
newest_image() {
    local name=$1 ver
    local v
    ver=""
    for v in $(papt "$name" apt-cache madison linux-image-amd64 | awk -F'|' '{gsub(/ /, "", $2); print $2}'); do
        if [[ -z $ver ]] || dpkg --compare-versions "$v" gt "$ver"; then ver=$v; fi
    done
    [[ -n $ver ]] || die "no linux-image-amd64 in $name"
    papt "$name" apt-cache show "linux-image-amd64=$ver" |
        sed -n 's/^Depends: //p' | head -1 | tr ',' '\n' |
        sed -n 's/^ *\(linux-image-[^ ]*\).*/\1/p' | head -1
}

# module_order MODDIR WANTED...: print module paths (as in modules.dep) in a
# valid load order, dependencies first. Built-in modules are skipped.
module_order() {
    local dir=$1
    shift
    awk -v want="$*" -v opt="$OPTIONAL_MODULES" '
        function base(p,   b) { b = p; sub(/.*\//, "", b); sub(/\.ko(\.(xz|zst|gz))?$/, "", b); gsub(/-/, "_", b); return b }
        function visit(p,   n, i, d) {
            if (p in seen) return
            seen[p] = 1
            n = split(deps[p], d, " ")
            for (i = 1; i <= n; i++) visit(d[i])
            print p
        }
        FILENAME ~ /modules\.builtin$/ { builtin[base($0)] = 1; next }
        {
            p = $1; sub(/:$/, "", p)
            deps[p] = ""
            for (i = 2; i <= NF; i++) deps[p] = deps[p] " " $i
            path[base(p)] = p
        }
        END {
            n = split(want, w, " ")
            for (i = 1; i <= n; i++) {
                m = w[i]; gsub(/-/, "_", m)
                if (m in path) visit(path[m])
                else if (!(m in builtin)) { print "missing module: " m > "/dev/stderr"; bad = 1 }
            }
            n = split(opt, w, " ")
            for (i = 1; i <= n; i++) if (w[i] in path) visit(path[w[i]])
            exit bad
        }' "$dir/modules.builtin" "$dir/modules.dep"
}

# kernel_pkgs APTNAME PKG: PKG plus the packages of the same kernel ABI it
# depends on (newer Debian kernels are split into linux-binary-*,
# linux-modules-* and linux-base-*).
kernel_pkgs() {
    local name=$1 abi=${2#linux-image-} queue=("$2") seen=" " p d
    while [[ ${#queue[@]} -gt 0 ]]; do
        p=${queue[0]}
        queue=("${queue[@]:1}")
        [[ $seen == *" $p "* ]] && continue
        seen+="$p "
        printf '%s\n' "$p"
        for d in $(papt "$name" apt-cache show "$p" | sed -n '/^\(Pre-\)\?Depends: /{s/^[^:]*: //;p}' |
            sed 's/[,|]/\n/g' | awk '{print $1}'); do
            [[ $d == linux-*-"$abi" ]] && queue+=("$d")
        done
    done
}

fetch_one() {
    local alias=$1 name pkg deb tmp kver mdir
    if [[ $refresh -eq 0 ]] && kver=$(verify "$kroot/$alias"); then
        log "cached: $alias -> $kver"
        return 0
    fi
    case $alias in
    bookworm) name=bookworm; papt_init "$name" "$(suite_sources bookworm)" ;;
    newest) name=newest-kernel
        papt_init "$name" "$(suite_sources sid; suite_sources trixie-backports)" ;;
    esac
    papt_update "$name" "$([[ $refresh -eq 1 ]] && echo force)"
    pkg=$(newest_image "$name")
    [[ -n $pkg ]] || die "could not find the kernel package for $alias"
    log "$alias: $pkg"

    local dl="$kroot/.download"
    mkdir -p "$dl"
    local pkgs p debs=()
    mapfile -t pkgs < <(kernel_pkgs "$name" "$pkg")
    log "$alias: downloading ${pkgs[*]}"
    papt_download "$name" "$dl" "${pkgs[@]}"
    for p in "${pkgs[@]}"; do
        debs+=("$(find "$dl" -name "${p}_*.deb" -printf '%T@ %p\n' | sort -n | tail -1 | cut -d' ' -f2-)")
    done

    tmp="$kroot/.tmp-$alias"
    rm -rf "$tmp"
    mkdir -p "$tmp/x"
    for deb in "${debs[@]}"; do
        log "extracting ${deb##*/}"
        dpkg-deb -x "$deb" "$tmp/x"
    done
    mdir=$(dirname "$(find "$tmp/x" -name modules.order | head -1)")
    [[ -d $mdir ]] || die "no modules.order in ${debs[*]}"
    kver=${mdir##*/}
    # modules.dep is generated at install time by depmod; do the same here.
    if [[ ! -e $tmp/x/lib/modules && -d $tmp/x/usr/lib/modules ]]; then
        mkdir -p "$tmp/x/lib"
        ln -s ../usr/lib/modules "$tmp/x/lib/modules"
    fi
    log "depmod $kver"
    depmod -b "$tmp/x" "$kver"
    local order
    read -ra mods <<<"$modules"
    order=$(module_order "$mdir" "${mods[@]}") || die "module resolution failed for $kver"
    log "modules for $kver: $(printf '%s\n' "$order" | sed 's|.*/||' | tr '\n' ' ')"
    local out="$tmp/out" f
    mkdir -p "$out/lib/modules/$kver"
    f=$(find "$tmp/x" \( -name "vmlinuz-$kver" -o -path "*/modules/$kver/vmlinuz" \) -type f | head -1)
    [[ -n $f ]] || die "no vmlinuz for $kver"
    cp "$f" "$out/vmlinuz"
    cp "$mdir/modules.builtin" "$out/lib/modules/$kver/"
    : >"$out/lib/modules/$kver/modules.load"
    while read -r f; do
        mkdir -p "$out/lib/modules/$kver/$(dirname "$f")"
        case $f in
        *.ko.xz) xz -dc "$mdir/$f" >"$out/lib/modules/$kver/${f%.xz}" ;;
        *.ko.zst) zstd -q -dc "$mdir/$f" >"$out/lib/modules/$kver/${f%.zst}" ;;
        *.ko.gz) gzip -dc "$mdir/$f" >"$out/lib/modules/$kver/${f%.gz}" ;;
        *) cp "$mdir/$f" "$out/lib/modules/$kver/$f" ;;
        esac
        printf '%s\n' "${f%.ko*}.ko" >>"$out/lib/modules/$kver/modules.load"
    done <<<"$order"
    # modules.dep for the kept (uncompressed) subset, so modprobe works too.
    awk 'NR == FNR { keep[$1 ":"] = 1; next }
         { gsub(/\.ko\.(xz|zst|gz)/, ".ko") }
         $1 in keep' "$out/lib/modules/$kver/modules.load" "$mdir/modules.dep" \
        >"$out/lib/modules/$kver/modules.dep"
    printf '%s\n' "$kver" >"$out/KVER"
    printf '%s\n' "${debs[@]##*/}" >"$out/PACKAGE"
    printf '%s\n' "$modules + $OPTIONAL_MODULES" >"$out/MODULES"
    touch "$out/.complete"

    rm -rf "${kroot:?}/$kver"
    mv "$out" "$kroot/$kver"
    rm -rf "$tmp"
    ln -sfn "$kver" "$kroot/$alias.tmp"
    mv -T "$kroot/$alias.tmp" "$kroot/$alias"
    verify "$kroot/$alias" >/dev/null || die "verification failed for $alias"
    rm -f "${debs[@]}" # large; only vmlinuz and the module subset are kept
    log "ready: $alias -> $kver ($(du -sh "$kroot/$kver" | cut -f1))"
}

need_cmds dpkg-deb:dpkg apt-get:apt xz:xz-utils zstd:zstd depmod:kmod
mkdir -p "$kroot"
for k in "${which[@]}"; do fetch_one "$k"; done
