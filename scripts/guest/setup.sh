#!/usr/bin/env bash
# Fetch and build everything the guest tests need (idempotent; a second run
# only verifies): QEMU, the guest kernels and their initramfs images.
set -euo pipefail
g="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
case ${1:-} in
-h | --help)
    cat <<USAGE
Usage: ${0##*/} [--help]

Runs fetch-qemu.sh, fetch-kernels.sh and mkinitramfs.sh in turn. Cache:
\${VNVME_CACHE:-\$HOME/.cache/vnvme}. Then boot guests with boot.sh, or run
smoke.sh for the end-to-end check.
USAGE
    exit 0
    ;;
"") ;;
*) echo "usage: ${0##*/} [--help]" >&2; exit 2 ;;
esac
"$g/fetch-qemu.sh"
"$g/fetch-kernels.sh"
"$g/mkinitramfs.sh"
