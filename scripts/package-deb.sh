#!/usr/bin/env bash
# Builds the Debian package: vnvme in release, its man pages (vnvme manpages) and
# shell completions (vnvme completions) generated from the command-line definitions,
# then cargo-deb (fetched once with `cargo install --locked`, cached) with the
# metadata in crates/vnvme/Cargo.toml. Prints the .deb's path on its last line.
#
# Usage: scripts/package-deb.sh [--no-build] [--out DIR]
#   --no-build  package target/release/vnvme as it is
#   --out DIR   where the .deb goes (default target/debian)
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
# shellcheck source=scripts/lib/log.sh
source "$ROOT/scripts/lib/log.sh"
BUILD=1
OUT="$ROOT/target/debian"
while [ $# -gt 0 ]; do
    case "$1" in
        --no-build) BUILD=0; shift ;;
        --out) OUT=$2; shift 2 ;;
        -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
        *) bad_usage "unknown argument: $1" ;;
    esac
done

# The packager, pinned; built once into the cache.
CARGO_DEB_VERSION=3.8.0
CACHE="${VNVME_CACHE:-${HOME:?HOME is not set}/.cache/vnvme}"
TOOLS="$CACHE/tools/cargo-deb-$CARGO_DEB_VERSION"
if ! "$TOOLS/bin/cargo-deb" --version 2>/dev/null | grep -q "$CARGO_DEB_VERSION"; then
    log "fetching cargo-deb $CARGO_DEB_VERSION (cargo install --locked; once, cached)"
    cargo install --quiet --locked --version "$CARGO_DEB_VERSION" --root "$TOOLS" cargo-deb >&2
fi
command -v dpkg-deb >/dev/null || die "dpkg-deb is needed (Debian: dpkg)"

cd "$ROOT"
if [ "$BUILD" = 1 ]; then
    log "building vnvme (release)"
    cargo build --quiet --release --locked -p vnvme >&2
fi
BIN="$ROOT/target/release/vnvme"
[ -x "$BIN" ] || die "$BIN is missing (build it, or drop --no-build)"

ASSETS="$ROOT/target/release/deb-assets"
rm -rf "$ASSETS"
mkdir -p "$ASSETS/man" "$ASSETS/completions"
"$BIN" manpages --out "$ASSETS/man" >/dev/null
gzip -9n "$ASSETS"/man/*.1
"$BIN" completions bash >"$ASSETS/completions/vnvme.bash"
"$BIN" completions zsh >"$ASSETS/completions/_vnvme"
"$BIN" completions fish >"$ASSETS/completions/vnvme.fish"

mkdir -p "$OUT"
log "packaging with cargo-deb $CARGO_DEB_VERSION"
# --no-build: the binary above; cargo-deb strips it (the release profile keeps
# line tables for the benchmarks' profiles) and computes Depends with dpkg-shlibdeps
# when it is there.
deb=$("$TOOLS/bin/cargo-deb" -p vnvme --no-build --strip --output "$OUT" | tail -1)
[ -f "$deb" ] || die "cargo-deb did not report a package (got: $deb)"
echo "$deb"
