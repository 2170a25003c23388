# shellcheck shell=bash
# The scripts' one logging convention: messages go to stderr as "[script] message",
# errors as "[script] error: message"; stdout is left for what a script produces
# (tables, paths, JSON). Sourced by packages.sh and host.sh, so every script that
# sources either has it. (scripts/lib/vnvme_report.py's log() does the same for Python.)
#
#   log MESSAGE...        a message
#   die MESSAGE...        an error, then exit 1
#   bad_usage MESSAGE...  an error in the command line, then exit 2

log() { printf '[%s] %s\n' "${0##*/}" "$*" >&2; }
die() {
    printf '[%s] error: %s\n' "${0##*/}" "$*" >&2
    exit 1
}
bad_usage() {
    printf '[%s] error: %s\n' "${0##*/}" "$*" >&2
    exit 2
}
