#!/usr/bin/env bash
# The project's test command: formatting, lints, every test tier that runs on this
# machine, the guest tests (real Linux guests under QEMU on `vnvme serve`,
# scripts/guest-tests.sh), the Debian package installed and removed
# (scripts/package-test.sh), libvirt starting a VM on vnvme (scripts/libvirt-test.sh)
# and a bounded fuzz run. Prints a tally per kind (Rust tests, guest checks, package
# and libvirt checks, fuzz targets) and one summary line at the end:
#   vnvme-tests: N passed, N failed, N skipped
# Every Rust test binary runs (--no-fail-fast); one that ends without a result line
# (a crash) counts as a failure and is named. A test that skips for want of
# something this machine lacks prints its reason and is counted once, as skipped,
# never as passed. Each fuzz target is one check: passed if it ran without a crash.
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
# Skips are recorded apart: Rust tests (`test_util::skip`: one line per skipped test),
# guest checks (guest-tests.sh counts its own), and notes about what this machine
# lacks (a tool that could not be fetched), which are not tests.
RUST_SKIPS="$LOG/skips-rust"
GUEST_SKIPS="$LOG/skips-guest"
NOTES="$LOG/notes"
: >"$RUST_SKIPS"
: >"$GUEST_SKIPS"
: >"$NOTES"
export VNVME_SKIP_LOG="$NOTES"

step() { printf '\n== %s\n' "$*"; }

step "rustfmt"
cargo fmt --all -- --check

step "clippy (-D warnings)"
cargo clippy --workspace --all-targets --locked --features vnvme/fault-injection -- -D warnings

step "clippy without default features (vnvme without the rbd: backend still builds)"
cargo clippy -p vnvme --no-default-features --all-targets --locked -- -D warnings

step "structure (the shipped binary links no test crate; import circles and wide structs no worse than scripts/structure-bound.json)"
python3 scripts/check-structure.py

step "results/ keeps summaries and histories (under 2 MB tracked, no raw profiler output); README.md at most 150 lines"
python3 - <<'PY'
import subprocess, os, sys
files = subprocess.run(["git", "ls-files", "-z", "results"], capture_output=True, check=True).stdout.split(b"\0")
files = [f.decode() for f in files if f]
size = sum(os.path.getsize(f) for f in files if os.path.exists(f))
raw = [f for f in files if "/raw/" in f or f.endswith((".annotate", ".callgrind", ".gz"))]
print(f"results/: {len(files)} files tracked, {size:,} bytes")
if raw:
    sys.exit(f"results/ tracks raw profiler output: {', '.join(raw[:5])}")
if size >= 2_000_000:
    sys.exit(f"results/ tracks {size:,} bytes, the bound is 2,000,000: keep tables and histories, not whole runs")
lines = sum(1 for _ in open("README.md", encoding="utf-8"))
print(f"README.md: {lines} lines")
if lines > 150:
    sys.exit(f"README.md has {lines} lines, the bound is 150: the detail belongs in docs/")
PY

step "promtool (Prometheus's checker, for the metrics tests; fetched once, cached)"
if ! bash scripts/lib/promtool.sh >/dev/null; then
    echo "promtool: could not be fetched; the metrics tests that need it skip" | tee -a "$NOTES"
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
# fault-injection: the crash and upgrade tests' hooks, in the test build only.
VNVME_SKIP_LOG="$RUST_SKIPS" cargo test --workspace --locked --no-fail-fast --features vnvme/fault-injection 2>&1 |
    tee "$LOG/test.out"
test_rc=${PIPESTATUS[0]}
set -e

# Guest tests: they fetch QEMU + kernels (cached after the first run; a failed
# fetch, e.g. no network, is a loud skip recorded in $VNVME_SKIP_LOG) and build
# vnvme in release. VNVME_GUEST_TESTS=0 skips them (also recorded).
# run_checks NAME SUMMARY SKIPS COMMAND...: a check script, its output teed to
# $LOG/NAME.out and its skips recorded in SKIPS; sets RUN_RC, RUN_PASSED, RUN_FAILED
# and RUN_SKIPPED from its last "SUMMARY: N passed, N failed, N skipped" line. A script
# that fails without that line counts as one failure, said in $LOG/missing.
run_checks() {
    local name=$1 summary=$2 skips=$3 line
    shift 3
    set +e
    VNVME_SKIP_LOG="$skips" "$@" 2>&1 | tee "$LOG/$name.out"
    RUN_RC=${PIPESTATUS[0]}
    set -e
    RUN_PASSED=0 RUN_FAILED=0 RUN_SKIPPED=0
    line=$(grep -E "^$summary: [0-9]+ passed, [0-9]+ failed, [0-9]+ skipped\$" "$LOG/$name.out" | tail -1 || true)
    if [ -n "$line" ]; then
        read -r RUN_PASSED RUN_FAILED RUN_SKIPPED < <(
            sed -E "s/^$summary: ([0-9]+) passed, ([0-9]+) failed, ([0-9]+) skipped/\1 \2 \3/" <<<"$line")
    fi
    if [ "$RUN_RC" -ne 0 ] && [ "$RUN_FAILED" -eq 0 ]; then
        RUN_FAILED=1
        echo "$1: failed without a summary line (exit $RUN_RC)" >>"$LOG/missing"
    fi
}

guest_rc=0 guest_passed=0 guest_failed=0 guest_skipped=0
if [ "${VNVME_GUEST_TESTS:-1}" = 0 ]; then
    echo "guest tests (scripts/guest-tests.sh): disabled by VNVME_GUEST_TESTS=0" >>"$NOTES"
else
    step "guest tests: Linux guests under QEMU 11.1 on vnvme serve (scripts/guest-tests.sh)"
    run_checks guest guest-tests "$GUEST_SKIPS" scripts/guest-tests.sh
    guest_rc=$RUN_RC guest_passed=$RUN_PASSED guest_failed=$RUN_FAILED guest_skipped=$RUN_SKIPPED
fi

# The Debian package: built, lintian-checked, installed with dpkg -i, used and
# purged (scripts/package-test.sh; its skips are recorded like the guests').
step "Debian package: build, lintian, dpkg -i, use, systemd in a container, purge (scripts/package-test.sh)"
run_checks package package-checks "$LOG/skips-package" scripts/package-test.sh
pkg_rc=$RUN_RC pkg_passed=$RUN_PASSED pkg_failed=$RUN_FAILED pkg_skipped=$RUN_SKIPPED

# libvirt starts a VM on vnvme (scripts/libvirt-test.sh): after the guest tests,
# which fetched QEMU and the kernels it boots.
step "libvirt: virsh define, start, suspend/resume, destroy, the next VM (scripts/libvirt-test.sh)"
run_checks libvirt libvirt-checks "$LOG/skips-package" scripts/libvirt-test.sh
lv_rc=$RUN_RC lv_passed=$RUN_PASSED lv_failed=$RUN_FAILED lv_skipped=$RUN_SKIPPED

fuzz_rc=0
if cargo metadata --format-version 1 --no-deps 2>/dev/null | grep -q '"name":"nvme-fuzz"'; then
    step "fuzz: ${FUZZ_SECONDS}s of structured fuzzing: controller, vfio-user and state restores (release, overflow checks on)"
    set +e
    cargo run --profile fuzz --locked -p nvme-fuzz --bin fuzz-run -- --seconds "$FUZZ_SECONDS" --quiet 2>&1 |
        tee "$LOG/fuzz.out"
    fuzz_rc=${PIPESTATUS[0]}
    set -e
fi

# Rust tests: sum the binaries' result lines; a binary that began (Running,
# Doc-tests) and printed no result line crashed or was killed: a failure, named.
read -r passed failed ignored crashed < <(awk -v crashes="$LOG/crashed" '
    /^     Running .* \(.*target\// || /^   Doc-tests / {
        if (open != "") { c++; print open > crashes }
        open = $0; sub(/^ +/, "", open)
    }
    /^test result:/ {
        for (i = 1; i <= NF; i++) {
            if ($(i+1) ~ /^passed/) p += $i
            if ($(i+1) ~ /^failed/) f += $i
            if ($(i+1) ~ /^ignored/) g += $i
        }
        open = ""
    }
    END {
        if (open != "") { c++; print open > crashes }
        print p+0, f+0, g+0, c+0
    }' "$LOG/test.out")
if [ "$test_rc" -ne 0 ] && [ "$failed" -eq 0 ] && [ "$crashed" -eq 0 ]; then
    # It failed before any test could (a build error): one failure, said so.
    echo "cargo test: exited $test_rc without a failed test (a build error? see above)" >>"$LOG/missing"
    failed=1
fi
# Each test that skipped returned early, so the harness counted it as passed.
rust_skipped=$(cut -f1 "$RUST_SKIPS" | sort -u | grep -c . || true)
passed=$((passed - rust_skipped))
failed=$((failed + crashed))

# Fuzz targets: one check each, passed when it ran and found nothing.
fuzz_passed=0 fuzz_failed=0
for t in controller vfio-user state; do
    l=$(grep -E "^fuzz: $t: [0-9]+ runs in" "$LOG/fuzz.out" 2>/dev/null | tail -1 || true)
    if [ -n "$l" ] && [[ $l == *" 0 crashes "* ]]; then
        fuzz_passed=$((fuzz_passed + 1))
    else
        fuzz_failed=$((fuzz_failed + 1))
        echo "fuzz target $t: ${l:-no summary line (the run did not finish)}" >>"$LOG/missing"
    fi
done

step "summary"
if [ -s "$RUST_SKIPS" ] || [ -s "$GUEST_SKIPS" ] || [ -s "$LOG/skips-package" ] || [ -s "$NOTES" ]; then
    echo "skipped (needs something this machine lacks):"
    cut -f1,2 "$RUST_SKIPS" | sort -u | sed 's/\t/: /; s/^/  SKIP rust: /'
    sed 's/^/  SKIP guest: /' "$GUEST_SKIPS"
    [ -f "$LOG/skips-package" ] && sed 's/\t/: /; s/^/  SKIP /' "$LOG/skips-package"
    sed 's/^/  NOTE: /' "$NOTES"
fi
# Each failed Rust test, named with its binary.
awk '/^     Running / { bin = $2 } /^   Doc-tests / { bin = "doc-tests " $2 }
     /^test .* \.\.\. FAILED$/ { t = $0; sub(/^test /, "", t); sub(/ \.\.\. FAILED$/, "", t); print bin ": " t }' "$LOG/test.out" >"$LOG/failed-tests"
if [ -s "$LOG/failed-tests" ]; then
    echo "failed rust tests:"
    sed 's/^/  FAILED: /' "$LOG/failed-tests"
fi
if [ -s "$LOG/crashed" ]; then
    echo "test binaries that ended without a result line (crashed or killed):"
    sed 's/^/  CRASHED: /' "$LOG/crashed"
fi
if [ -s "$LOG/missing" ]; then
    sed 's/^/  FAILED: /' "$LOG/missing"
fi
if [ "$fuzz_rc" -ne 0 ]; then
    echo "fuzz run FAILED (exit $fuzz_rc): see fuzz-artifacts/"
fi
if [ "$guest_rc" -ne 0 ]; then
    echo "guest tests FAILED (exit $guest_rc): $guest_failed failure(s), see the FAIL lines above"
fi
echo "  rust tests:   $passed passed, $failed failed ($crashed binaries crashed), $rust_skipped skipped, $ignored ignored"
echo "  guest checks: $guest_passed passed, $guest_failed failed, $guest_skipped skipped"
echo "  package:      $pkg_passed passed, $pkg_failed failed, $pkg_skipped skipped"
echo "  libvirt:      $lv_passed passed, $lv_failed failed, $lv_skipped skipped"
echo "  fuzz targets: $fuzz_passed passed, $fuzz_failed failed (${FUZZ_SECONDS}s in all)"
total_passed=$((passed + guest_passed + pkg_passed + lv_passed + fuzz_passed))
total_failed=$((failed + guest_failed + pkg_failed + lv_failed + fuzz_failed))
total_skipped=$((rust_skipped + guest_skipped + pkg_skipped + lv_skipped + ignored))
echo
echo "vnvme-tests: ${total_passed} passed, ${total_failed} failed, ${total_skipped} skipped"
if [ "$test_rc" -ne 0 ] || [ "$fuzz_rc" -ne 0 ] || [ "$guest_rc" -ne 0 ] || [ "$pkg_rc" -ne 0 ] || [ "$lv_rc" -ne 0 ] || [ "$total_failed" -ne 0 ]; then
    exit 1
fi
