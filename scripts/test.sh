#!/usr/bin/env bash
# The project's test command: formatting, lints, every test tier that runs on this
# machine, and a bounded fuzz run. Prints one summary line at the end:
#   vnvme-tests: N passed, N failed, N skipped
# Skips are tests that need something this machine lacks; each prints its reason.
set -euo pipefail
cd "$(dirname "$0")/.."

FUZZ_SECONDS="${VNVME_FUZZ_SECONDS:-60}"
LOG="$(mktemp -d)"
trap 'rm -rf "$LOG"' EXIT
export VNVME_SKIP_LOG="$LOG/skips"
: >"$VNVME_SKIP_LOG"

step() { printf '\n== %s\n' "$*"; }

step "rustfmt"
cargo fmt --all -- --check

step "clippy (-D warnings)"
cargo clippy --workspace --all-targets --locked -- -D warnings

step "cargo test (unit, mock-host, in-process tiers)"
set +e
cargo test --workspace --locked 2>&1 | tee "$LOG/test.out"
test_rc=${PIPESTATUS[0]}
set -e

fuzz_rc=0
if cargo metadata --format-version 1 --no-deps 2>/dev/null | grep -q '"name":"nvme-fuzz"'; then
    step "fuzz: ${FUZZ_SECONDS}s of structured controller fuzzing (release)"
    set +e
    cargo run --release --locked -p nvme-fuzz --bin fuzz-run -- --seconds "$FUZZ_SECONDS"
    fuzz_rc=$?
    set -e
fi

# Sum the per-binary "test result:" lines into one.
read -r passed failed ignored < <(awk '
    /^test result:/ {
        for (i = 1; i <= NF; i++) {
            if ($(i+1) ~ /^passed/) p += $i
            if ($(i+1) ~ /^failed/) f += $i
            if ($(i+1) ~ /^ignored/) g += $i
        }
    }
    END { print p+0, f+0, g+0 }' "$LOG/test.out")
skips=$(wc -l <"$VNVME_SKIP_LOG")
if [ "$skips" -gt 0 ]; then
    step "skipped tests (need something this machine lacks)"
    sed 's/^/  SKIP: /' "$VNVME_SKIP_LOG"
fi
if [ "$fuzz_rc" -ne 0 ]; then
    echo "fuzz run FAILED (exit $fuzz_rc): see fuzz-artifacts/"
    failed=$((failed + 1))
fi
echo
echo "vnvme-tests: ${passed} passed, ${failed} failed, $((ignored + skips)) skipped"
if [ "$test_rc" -ne 0 ] || [ "$fuzz_rc" -ne 0 ]; then
    exit 1
fi
