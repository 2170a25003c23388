#!/usr/bin/env bash
# libvirt's domain XML schemas and xmllint, for the test that validates the
# libvirt example in docs/USAGE.md (crates/vnvme/tests/service_files.rs). Debian ships
# the schemas in libvirt0 and xmllint in libxml2-utils; both are only downloaded
# (through the private apt state of scripts/lib/packages.sh, leaving the host's apt
# alone) and extracted, never installed. Cached.
#
#   bash scripts/lib/libvirt-schemas.sh   prints the directory ROOT, with
#                                         ROOT/usr/bin/xmllint and
#                                         ROOT/usr/share/libvirt/schemas/domain.rng;
#                                         fetches on the first call. Exit 1, saying
#                                         why on stderr, when it cannot.
#
# Cache: $VNVME_CACHE/libvirt-schemas (VNVME_CACHE defaults to ~/.cache/vnvme).
set -euo pipefail
# shellcheck source=scripts/lib/packages.sh
source "$(dirname "${BASH_SOURCE[0]}")/packages.sh"

root="${VNVME_CACHE:-${HOME:?HOME is not set}/.cache/vnvme}/libvirt-schemas"
ok() { [[ -x $root/usr/bin/xmllint && -s $root/usr/share/libvirt/schemas/domain.rng ]] &&
    "$root/usr/bin/xmllint" --version >/dev/null 2>&1; }
if ! ok; then
    command -v apt-get >/dev/null && command -v dpkg-deb >/dev/null ||
        die "apt-get and dpkg-deb are needed to fetch libvirt's schemas (a Debian host)"
    suite=bookworm
    mkdir -p "$root"
    tmp=$(mktemp -d "$(dirname "$root")/.libvirt-fetch.XXXXXX")
    # shellcheck disable=SC2064 # $tmp is fixed now
    trap "rm -rf '$tmp'" EXIT
    papt_init "$suite" "$(suite_sources "$suite")"
    papt_update "$suite"
    if ! papt_download "$suite" "$tmp" libvirt0 libxml2-utils; then
        log "downloading failed; refreshing the $suite package lists once"
        papt_update "$suite" force
        papt_download "$suite" "$tmp" libvirt0 libxml2-utils || die "apt-get download libvirt0 libxml2-utils failed"
    fi
    for deb in "$tmp"/*.deb; do dpkg-deb -x "$deb" "$tmp/root"; done
    rm -rf "$root"
    mv "$tmp/root" "$root"
    ok || die "the extracted xmllint or schemas do not work ($root)"
    log "libvirt schemas and xmllint in $root"
fi
printf '%s\n' "$root"
