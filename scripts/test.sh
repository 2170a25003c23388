#!/usr/bin/env bash
# The project's test command: formatting, lints, every test tier that runs on this
# machine, the guest tests (real Linux guests under QEMU on `vnvme serve`,
# scripts/guest-tests.sh) and a bounded fuzz run. Prints one summary line at the end:
#   vnvme-tests: N passed, N failed, N skipped
# Skips are tests that need something this machine lacks; each prints its reason.
set -euo pipefail
cd "$(dirname "$0")/.."

FUZZ_SECONDS="${VNVME_FUZZ_SECONDS:-60}"
LOG="$(mktemp -d)"
ceph_dir=""
cleanup() {
    [ -z "$ceph_dir" ] || bash scripts/ceph-cluster.sh stop "$ceph_dir" >/dev/null 2>&1 || true
    rm -rf "$LOG"
}
trap cleanup EXIT
export VNVME_SKIP_LOG="$LOG/skips"
: >"$VNVME_SKIP_LOG"

step() { printf '\n== %s\n' "$*"; }

step "rustfmt"
cargo fmt --all -- --check

step "clippy (-D warnings)"
cargo clippy --workspace --all-targets --locked -- -D warnings

step "clippy without default features (vnvme without the rbd: backend still builds)"
cargo clippy -p vnvme --no-default-features --all-targets --locked -- -D warnings

step "promtool (Prometheus's checker, for the metrics tests; fetched once, cached)"
if ! bash scripts/lib/promtool.sh >/dev/null; then
    echo "promtool: could not be fetched; the metrics tests will skip their promtool check" |
        tee -a "$VNVME_SKIP_LOG"
fi

# One Ceph cluster (a monitor, an OSD on memstore) for every rbd: test, the guest
# suite's included; without it (no network for the packages) those tests skip,
# each saying why.
step "Ceph test cluster (scripts/ceph-cluster.sh; packages fetched once, cached)"
ceph_dir="$LOG/ceph" # stopped on exit, even after a failed start
if bash scripts/ceph-cluster.sh start "$ceph_dir"; then
    export VNVME_TEST_CEPH_DIR="$ceph_dir"
else
    echo "Ceph test cluster: could not start; each rbd: test says so as it skips"
fi

step "cargo test (unit, in-process host, in-process driver tiers)"
set +e
cargo test --workspace --locked 2>&1 | tee "$LOG/test.out"
test_rc=${PIPESTATUS[0]}
set -e

# Guest tests: they fetch QEMU + kernels (cached after the first run; a failed
# fetch, e.g. no network, is a loud skip recorded in $VNVME_SKIP_LOG) and build
# vnvme in release. VNVME_GUEST_TESTS=0 skips them (also recorded).
guest_rc=0 guest_passed=0 guest_failed=0
if [ "${VNVME_GUEST_TESTS:-1}" = 0 ]; then
    echo "guest tests (scripts/guest-tests.sh): disabled by VNVME_GUEST_TESTS=0" >>"$VNVME_SKIP_LOG"
else
    step "guest tests: Linux guests under QEMU 11.1 on vnvme serve (scripts/guest-tests.sh)"
    set +e
    scripts/guest-tests.sh 2>&1 | tee "$LOG/guest.out"
    guest_rc=${PIPESTATUS[0]}
    set -e
    line=$(grep -E '^guest-tests: [0-9]+ passed, [0-9]+ failed, [0-9]+ skipped$' "$LOG/guest.out" | tail -1 || true)
    if [ -n "$line" ]; then
        read -r guest_passed guest_failed < <(sed -E 's/^guest-tests: ([0-9]+) passed, ([0-9]+) failed.*/\1 \2/' <<<"$line")
        # Its skips are already lines in $VNVME_SKIP_LOG, counted below.
    fi
    if [ "$guest_rc" -ne 0 ] && [ "$guest_failed" -eq 0 ]; then
        guest_failed=1 # it failed without a summary line
    fi
fi

fuzz_rc=0
if cargo metadata --format-version 1 --no-deps 2>/dev/null | grep -q '"name":"nvme-fuzz"'; then
    step "fuzz: ${FUZZ_SECONDS}s of structured fuzzing, controller and vfio-user (release, overflow checks on)"
    set +e
    cargo run --profile fuzz --locked -p nvme-fuzz --bin fuzz-run -- --seconds "$FUZZ_SECONDS" --quiet
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
if [ "$guest_rc" -ne 0 ]; then
    echo "guest tests FAILED (exit $guest_rc): $guest_failed failure(s), see the FAIL lines above"
fi
passed=$((passed + guest_passed))
failed=$((failed + guest_failed))
echo
echo "vnvme-tests: ${passed} passed, ${failed} failed, $((ignored + skips)) skipped"
if [ "$test_rc" -ne 0 ] || [ "$fuzz_rc" -ne 0 ] || [ "$guest_rc" -ne 0 ]; then
    exit 1
fi
