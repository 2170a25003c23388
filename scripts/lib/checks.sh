# shellcheck shell=bash
# The tally of a check script (scripts/package-test.sh, scripts/libvirt-test.sh): one
# line per check and a summary line test.sh reads. Source it after setting CHECKS
# (the kind, e.g. "package"); the summary line is "$CHECKS-checks: N passed, N
# failed, N skipped".
#
#   pass NAME            a check passed
#   fail NAME WHY        a check failed, and why
#   skip NAME WHY        a check could not run here (also into $VNVME_SKIP_LOG)
#   check NAME CMD...    PASS if CMD succeeds, else FAIL with the end of its output
#   summary              the summary line, then exit (1 if anything failed)

passed=0 failed=0 skipped=0
pass() { echo "PASS $CHECKS: $1"; passed=$((passed + 1)); }
fail() { echo "FAIL $CHECKS: $1: $2"; failed=$((failed + 1)); }
skip() {
    echo "SKIP $CHECKS: $1: $2"
    skipped=$((skipped + 1))
    [ -n "${VNVME_SKIP_LOG:-}" ] && printf '%s: %s\t%s\n' "$CHECKS" "$1" "$2" >>"$VNVME_SKIP_LOG"
}
check() {
    local name=$1 out
    shift
    if out=$("$@" 2>&1); then pass "$name"; else fail "$name" "$(tail -3 <<<"$out" | tr '\n' ' ')"; fi
}
summary() {
    echo "$CHECKS-checks: $passed passed, $failed failed, $skipped skipped"
    [ "$failed" -eq 0 ]
    exit
}
