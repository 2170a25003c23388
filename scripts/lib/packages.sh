# shellcheck shell=bash
# Fetching into the cache, for every script that needs a Debian package, a kernel
# or QEMU (scripts/guest/*.sh, the fetch-*.sh scripts, bench-cost.sh, the tool
# fetchers in scripts/lib/). Source it; do not execute it. It sources log.sh
# (log, die, bad_usage).
#
# Everything fetched lives under $VNVME_CACHE (default ~/.cache/vnvme).
# Debian packages are resolved and downloaded by apt itself, using a private
# apt state per suite (own sources.list, lists, archives and an *empty* dpkg
# status file), so the host's apt configuration and installed packages are
# never touched (except for a few host tools, installed only when missing).

VNVME_CACHE="${VNVME_CACHE:-${HOME:?HOME is not set}/.cache/vnvme}"
# The Debian archive the host's own apt uses (first "debian" and "debian-security"
# URIs in its sources), unless given explicitly.
host_apt_uri() { # SUFFIX: "debian" or "debian-security"
    local want=$1 f
    for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.list /etc/apt/sources.list.d/*.sources; do
        [[ -r $f ]] || continue
        awk -v want="/$want" '{
            for (i = 1; i <= NF; i++) if ($i ~ /^(https?|ftp):\/\//) {
                u = $i; sub(/\/+$/, "", u)
                if (substr(u, length(u) - length(want) + 1) == want) { print u; exit }
            }
        }' "$f"
    done | { read -r first || true; printf '%s' "$first"; }
}
VNVME_DEBIAN_MIRROR="${VNVME_DEBIAN_MIRROR:-$(host_apt_uri debian)}"
VNVME_DEBIAN_SECURITY_MIRROR="${VNVME_DEBIAN_SECURITY_MIRROR:-$(host_apt_uri debian-security)}"
# shellcheck source=scripts/lib/log.sh
source "$(dirname "${BASH_SOURCE[0]}")/log.sh"
[[ -n $VNVME_DEBIAN_MIRROR ]] || die "no Debian archive found in /etc/apt sources; set VNVME_DEBIAN_MIRROR"
VNVME_DEBIAN_SECURITY_MIRROR="${VNVME_DEBIAN_SECURITY_MIRROR:-$VNVME_DEBIAN_MIRROR-security}"
VNVME_KEYRING="${VNVME_KEYRING:-/usr/share/keyrings/debian-archive-keyring.gpg}"
# The guest tooling (boot.sh, fetch-qemu.sh, rootfs/, ...).
# shellcheck disable=SC2034 # used by the scripts that source this file
VNVME_GUEST_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")/../guest" && pwd)"

# need_cmds CMD:PKG... -- apt-get install the packages whose command is missing.
need_cmds() {
    local spec missing=()
    for spec in "$@"; do
        command -v "${spec%%:*}" >/dev/null 2>&1 || missing+=("${spec#*:}")
    done
    [[ ${#missing[@]} -eq 0 ]] && return 0
    [[ $(id -u) -eq 0 ]] || die "missing host tools (${missing[*]}); run as root or install them"
    log "installing host packages: ${missing[*]}"
    # Another apt (an unattended upgrade, a parallel install) may hold the dpkg lock:
    # wait for it, bounded, rather than fail.
    local lock=(-o DPkg::Lock::Timeout=300)
    if ! DEBIAN_FRONTEND=noninteractive apt-get "${lock[@]}" install -y --no-install-recommends "${missing[@]}"; then
        apt-get "${lock[@]}" update
        DEBIAN_FRONTEND=noninteractive apt-get "${lock[@]}" install -y --no-install-recommends "${missing[@]}"
    fi
}

# ---------------------------------------------------------------------------
# Private apt state: papt_init NAME "SOURCES.LIST LINES"; papt NAME apt-get ...
# ---------------------------------------------------------------------------
papt_dir() { printf '%s/apt/%s' "$VNVME_CACHE" "$1"; }

papt_init() {
    local name=$1 sources=$2 d
    d=$(papt_dir "$name")
    mkdir -p "$d/state/lists/partial" "$d/cache/archives/partial" "$d/etc/sources.list.d" \
        "$d/etc/preferences.d"
    [[ -e $d/status ]] || : >"$d/status"
    if [[ ! -f $d/etc/sources.list ]] || [[ "$(cat "$d/etc/sources.list")" != "$sources" ]]; then
        printf '%s\n' "$sources" >"$d/etc/sources.list"
        rm -f "$d/.updated"
    fi
}

# papt NAME COMMAND [ARGS...]: run apt-get/apt-cache against the private state.
papt() {
    local name=$1 cmd=$2 d
    shift 2
    d=$(papt_dir "$name")
    local opts=(
        -o "Dir::Etc::SourceList=$d/etc/sources.list"
        -o "Dir::Etc::SourceParts=$d/etc/sources.list.d"
        -o "Dir::Etc::Preferences=$d/etc/preferences"
        -o "Dir::Etc::PreferencesParts=$d/etc/preferences.d"
        -o "Dir::State=$d/state"
        -o "Dir::State::Lists=$d/state/lists"
        -o "Dir::State::status=$d/status"
        -o "Dir::Cache=$d/cache"
        -o "Dir::Cache::Archives=$d/cache/archives"
        -o "APT::Architecture=amd64"
        -o "APT::Architectures::=amd64"
        -o "APT::Install-Recommends=false"
        -o "APT::Install-Suggests=false"
        -o "Acquire::Languages=none"
        -o "Debug::NoLocking=true"
    )
    # apt drops privileges to _apt, which cannot write below root's $HOME.
    [[ $(id -u) -eq 0 ]] && opts+=(-o "APT::Sandbox::User=root")
    "$cmd" "${opts[@]}" "$@"
}

# papt_update NAME [force]: refresh the private package lists (once).
papt_update() {
    local d
    d=$(papt_dir "$1")
    if [[ ! -e $d/.updated || ${2:-} == force ]]; then
        log "apt update ($1)"
        papt "$1" apt-get -q update
        touch "$d/.updated"
    fi
}

# papt_fetch_closure NAME OUTLIST [APT-ARGS...] PKG...: download PKG and its
# full Depends closure (as if nothing were installed) into the private archive
# dir, and write the list of .deb files to OUTLIST. Already downloaded files
# are reused, so an interrupted run resumes.
papt_fetch_closure() {
    local name=$1 out=$2 d sim
    shift 2
    d=$(papt_dir "$name")
    log "resolving dependencies ($name): $*"
    sim=$(papt "$name" apt-get -q -s install "$@") || die "apt could not resolve: $*"
    # "Inst PKG (VERSION SUITE [ARCH])" -> archive file name as apt stores it.
    awk -v dir="$d/cache/archives" '$1 == "Inst" {
            v = $3; sub(/^\(/, "", v); gsub(/:/, "%3a", v)
            for (i = 3; i <= NF; i++) if ($i ~ /^\[[a-z0-9]+\]\)$/) a = $i
            gsub(/[\[\])]/, "", a)
            print dir "/" $2 "_" v "_" a ".deb" }' <<<"$sim" >"$out"
    [[ -s $out ]] || die "apt resolved nothing for: $*"
    log "downloading $(wc -l <"$out") packages ($name)"
    papt "$name" apt-get -q -y -d install "$@" >&2
    local f
    while read -r f; do [[ -s $f ]] || die "missing download: $f"; done <"$out"
}

# papt_download NAME DESTDIR PKG...: apt-get download single packages (no deps).
papt_download() {
    local name=$1 dest=$2
    shift 2
    mkdir -p "$dest"
    (cd "$dest" && papt "$name" apt-get -q download "$@") >&2
}

# extract_debs ROOT LISTFILE: dpkg-deb -x every .deb of LISTFILE into ROOT.
extract_debs() {
    local root=$1 list=$2 f n=0 total
    total=$(wc -l <"$list")
    mkdir -p "$root"
    while read -r f; do
        n=$((n + 1))
        log "$(printf 'extracting %3d/%d %s' "$n" "$total" "${f##*/}")"
        dpkg-deb -x "$f" "$root"
    done <"$list"
}

# find_loader ROOT: path of the x86-64 dynamic loader inside an extracted root.
find_loader() {
    local p
    for p in lib64/ld-linux-x86-64.so.2 usr/lib64/ld-linux-x86-64.so.2 \
        lib/x86_64-linux-gnu/ld-linux-x86-64.so.2 usr/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2; do
        if [[ -e $1/$p ]]; then
            printf '%s\n' "$1/$p"
            return 0
        fi
    done
    return 1
}

# lib_path ROOT: library search path for binaries of an extracted root.
lib_path() {
    printf '%s' "$1/lib/x86_64-linux-gnu:$1/usr/lib/x86_64-linux-gnu:$1/lib:$1/usr/lib:$1/lib64:$1/usr/lib64"
}

# kernel_dir NAME: cache dir of a fetched kernel (NAME: bookworm|newest|KVER).
kernel_dir() { printf '%s/kernels/%s' "$VNVME_CACHE" "$1"; }

# relativize_symlinks ROOT: absolute symlinks inside an extracted package tree
# point at the host's /usr; re-point them inside ROOT (relative targets).
relativize_symlinks() {
    local root=$1 l t
    while IFS= read -r -d '' l; do
        t=$(readlink "$l")
        ln -sfn "$(realpath -m --relative-to="$(dirname "$l")" "$root$t")" "$l"
    done < <(find "$root" -type l -lname '/*' -print0)
}

# suite_sources SUITE: sources.list lines for a Debian suite (backports suites
# come with their base suite).
suite_sources() {
    local s=$1 opt="[signed-by=$VNVME_KEYRING]"
    case $s in
    *-backports) printf 'deb %s %s %s main\n' "$opt" "$VNVME_DEBIAN_MIRROR" "${s%-backports}" ;;
    esac
    printf 'deb %s %s %s main\n' "$opt" "$VNVME_DEBIAN_MIRROR" "$s"
    case $s in
    bookworm | trixie)
        printf 'deb %s %s %s-updates main\n' "$opt" "$VNVME_DEBIAN_MIRROR" "$s"
        printf 'deb %s %s %s-security main\n' "$opt" "$VNVME_DEBIAN_SECURITY_MIRROR" "$s"
        ;;
    esac
}
