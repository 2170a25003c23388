# shellcheck shell=bash
# promtool, Prometheus's own checker, for the tests that validate what
# `vnvme serve --metrics` exposes (`promtool check metrics`). Debian ships it
# in the `prometheus` package; installing that package would also set up and
# start a Prometheus service, so the package is only downloaded (apt-get
# download, through the private apt state of scripts/lib/packages.sh, which
# leaves the host's apt untouched and takes no lock) and promtool extracted
# from it with dpkg-deb. It is a Go binary that needs only glibc.
#
# Source it (it sets nothing but the functions below; safe under set -euo
# pipefail), or run it: `bash scripts/lib/promtool.sh` fetches and prints the
# path, as vn_promtool does.
#
#   vn_promtool        print the path of a working promtool: one on PATH, else
#                      the cached one, fetched on the first call. Returns 1,
#                      saying why on stderr, when it cannot be had (no network,
#                      no apt). Progress goes to stderr, only the path to stdout.
#   vn_promtool_cache  print the cache path of the binary, fetched or not
#
# Cache: $VNVME_CACHE/promtool/bin/promtool (VNVME_CACHE defaults to
# ~/.cache/vnvme, as for scripts/guest); promtool/VERSION names the package.
# Suite: $VNVME_PROMTOOL_SUITE (default bookworm, whose apt state the guest
# scripts share). The Rust tests of crates/vnvme/src/metrics look in the same
# place.

vn_promtool_cache() {
    printf '%s/promtool/bin/promtool\n' "${VNVME_CACHE:-${HOME:?HOME is not set}/.cache/vnvme}"
}

vn_promtool() {
    local p
    if p=$(command -v promtool) && "$p" --version >/dev/null 2>&1; then
        printf '%s\n' "$p"
        return 0
    fi
    p=$(vn_promtool_cache) || return 1
    if [[ ! -x $p ]] || ! "$p" --version >/dev/null 2>&1; then
        # A process of its own: scripts/lib/packages.sh may exit, and errexit must
        # hold in the fetch whatever the caller's options.
        bash "${BASH_SOURCE[0]}" --fetch >&2 || {
            printf '%s\n' "[promtool.sh] error: could not fetch promtool: Debian's prometheus package" \
                "  could not be downloaded (is the Debian archive reachable?); see above" >&2
            return 1
        }
    fi
    printf '%s\n' "$p"
}

# _vn_promtool_fetch: download the prometheus package and put its promtool in
# the cache. Runs in its own bash process (see vn_promtool), with errexit.
_vn_promtool_fetch() {
    set -euo pipefail
    # shellcheck source=scripts/lib/packages.sh
    source "$(dirname "${BASH_SOURCE[0]}")/packages.sh"
    local suite=${VNVME_PROMTOOL_SUITE:-bookworm} bin dir tmp deb
    if ! command -v apt-get >/dev/null || ! command -v dpkg-deb >/dev/null; then
        die "apt-get and dpkg-deb are needed to fetch promtool (a Debian host)"
    fi
    bin=$(vn_promtool_cache)
    dir=${bin%/bin/promtool}
    mkdir -p "$dir/bin"
    tmp=$(mktemp -d "$dir/.fetch.XXXXXX")
    # shellcheck disable=SC2064 # $tmp is fixed now
    trap "rm -rf '$tmp'" EXIT
    papt_init "$suite" "$(suite_sources "$suite")"
    papt_update "$suite"
    if ! papt_download "$suite" "$tmp" prometheus; then
        # The lists may be older than the archive (a package superseded).
        log "downloading prometheus failed; refreshing the $suite package lists once"
        papt_update "$suite" force
        papt_download "$suite" "$tmp" prometheus ||
            die "apt-get download prometheus failed ($suite)"
    fi
    deb=$(find "$tmp" -maxdepth 1 -name 'prometheus_*.deb' | head -1)
    [[ -n $deb ]] || die "apt-get download left no prometheus .deb"
    dpkg-deb -x "$deb" "$tmp/root"
    [[ -x $tmp/root/usr/bin/promtool ]] || die "no usr/bin/promtool in ${deb##*/}"
    "$tmp/root/usr/bin/promtool" --version >/dev/null 2>&1 || die "the extracted promtool does not run"
    # Into place by rename, so a concurrent caller sees the old binary or the new one.
    mv "$tmp/root/usr/bin/promtool" "$bin.tmp.$$"
    mv -f "$bin.tmp.$$" "$bin"
    printf '%s\n' "${deb##*/}" >"$dir/VERSION"
    log "promtool from ${deb##*/}: $bin"
}

if [[ ${BASH_SOURCE[0]} == "$0" ]]; then
    if [[ ${1:-} == --fetch ]]; then
        _vn_promtool_fetch
    else
        vn_promtool
    fi
fi
