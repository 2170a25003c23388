#!/usr/bin/env bash
# Build SPDK with its vfio-user NVMe-oF target: the peer that scripts/bench-vfio-user.sh
# measures vnvme against (issue 50), plus SPDK's own NVMe tools (spdk_nvme_perf,
# spdk_nvme_identify) and its vfio-user compliance test (nvme_compliance).
#
# Not part of the build or of scripts/test.sh, and CI cannot run it: SPDK and its
# submodules cannot be fetched there, so the caller gives every source tree.
#
# Usage:
#
#   scripts/build-spdk-peer.sh --spdk SRC[@REF] --dpdk SRC[@REF] --libvfio-user SRC[@REF]
#                              --build-dir DIR [--jobs N] [--no-apt] [-- CONFIGURE_ARGS...]
#
#   SRC is either a source directory (copied as it is, .git left out) or a git directory
#   (bare or not) followed by @REF, the commit, tag or branch to take (git archive).
#   Known to work: SPDK master 3230130e6a (v26.09-pre), DPDK from SPDK's fork at branch
#   spdk-23.11 (DPDK 23.11.0; the commit SPDK pins may be newer), libvfio-user at the
#   commit SPDK pins (f922ada35b3e). Debian 12's own DPDK 22.11 is refused by this SPDK.
#
#   --build-dir DIR  where everything goes: DIR/src is the SPDK tree (DPDK in src/dpdk,
#                    libvfio-user in src/libvfio-user, SPDK's submodule places), built
#                    in place; DIR/tools holds helper commands for the build
#   --jobs N         make -j N (default 2); every compile runs at nice 19
#   --no-apt         do not install missing Debian packages, only name them and stop
#   -- ARGS          extra arguments for SPDK's ./configure
#
# Idempotent: a step already done (tree extracted, patches applied, configured with the
# same arguments, built) is skipped. A build directory holding other sources is refused.
#
# Local changes to the SPDK tree (written down here, applied only when needed):
#   - lib/env_dpdk/env.mk: rte_argparse is dropped from DPDK_LIB_LIST when the DPDK tree
#     has no lib/argparse (DPDK 23.11 has none; SPDK master lists it unconditionally).
#   - test/nvme/compliance/nvme_compliance.c: --no-huge, --mem-size MB and --no-pci, so
#     the compliance test runs without hugepages like the other tools (upstream it only
#     takes -g and -r and needs hugepages).
#   - isa-l/autogen.sh: a placeholder when the isa-l submodule is absent. SPDK's configure
#     insists the file exists, then leaves ISA-L out when nasm is missing; nasm is hidden
#     from configure (DIR/tools/nasm) so ISA-L, crypto and compression stay out.
#
# Running it (no hugepages needed; SPDK's client looks for the socket DIR/cntrl):
#
#   src/build/bin/nvmf_tgt --no-huge -s 1024 --no-pci -m 0x1 -r /tmp/spdk.sock &
#   rpc="src/scripts/rpc.py -s /tmp/spdk.sock"
#   $rpc nvmf_create_transport -t VFIOUSER
#   $rpc bdev_null_create null0 65536 4096              # MiB, block size
#   $rpc nvmf_create_subsystem nqn.2019-07.io.spdk:cnode0 -a -s SPDK0001 -m 32
#   $rpc nvmf_subsystem_add_ns nqn.2019-07.io.spdk:cnode0 null0
#   mkdir -p /tmp/vfu
#   $rpc nvmf_subsystem_add_listener nqn.2019-07.io.spdk:cnode0 -t VFIOUSER -a /tmp/vfu -s 0
#   trid='trtype:VFIOUSER traddr:/tmp/vfu subnqn:nqn.2019-07.io.spdk:cnode0'
#   src/build/bin/spdk_nvme_identify --no-huge -s 1024 -r "$trid"
#   src/build/bin/spdk_nvme_perf --no-huge -s 1024 -c 0x2 -q 16 -o 4096 -w randread -t 3 -r "$trid"
#   src/test/nvme/compliance/nvme_compliance --no-huge --mem-size 1024 --no-pci -r "$trid"
#
# (spdk_nvme_perf and the target both poll: give them different cores, -c and -m.)
set -euo pipefail

die() { printf 'build-spdk-peer: %s\n' "$*" >&2; exit 1; }
log() { printf 'build-spdk-peer: %s\n' "$*" >&2; }

usage() { sed -n '2,/^set -euo/{/^set -euo/d;s/^# \{0,1\}//;p}' "$0"; }

spdk_src="" dpdk_src="" vfu_src="" build="" jobs=2 use_apt=1
configure_extra=()
while (($#)); do
    case $1 in
        --spdk) spdk_src=${2:?--spdk needs a value}; shift 2 ;;
        --dpdk) dpdk_src=${2:?--dpdk needs a value}; shift 2 ;;
        --libvfio-user) vfu_src=${2:?--libvfio-user needs a value}; shift 2 ;;
        --build-dir) build=${2:?--build-dir needs a value}; shift 2 ;;
        --jobs | -j) jobs=${2:?--jobs needs a value}; shift 2 ;;
        --no-apt) use_apt=0; shift ;;
        -h | --help) usage; exit 0 ;;
        --) shift; configure_extra=("$@"); break ;;
        *) die "unknown argument '$1' (see --help)" ;;
    esac
done
[[ -n $spdk_src && -n $dpdk_src && -n $vfu_src && -n $build ]] ||
    die "--spdk, --dpdk, --libvfio-user and --build-dir are all required (see --help)"
[[ $jobs =~ ^[1-9][0-9]*$ ]] || die "--jobs wants a positive number, not '$jobs'"

# ---------------------------------------------------------------- the sources given
# describe SRC[@REF]: one line naming what was taken (the commit when known).
describe() {
    local spec=$1 dir ref commit
    if [[ $spec == *@* && ! -d $spec ]]; then
        dir=$(git_dir "${spec%@*}") || return 1
        ref=${spec##*@}
        commit=$(git --git-dir="$dir" rev-parse --verify -q "$ref^{commit}") ||
            die "no commit '$ref' in ${spec%@*}"
        printf 'git %s %s\n' "$ref" "$commit"
    else
        [[ -d $spec ]] || die "'$spec' is neither a directory nor GITDIR@REF"
        if git -C "$spec" rev-parse --verify -q 'HEAD^{commit}' >/dev/null 2>&1 &&
            [[ $(git -C "$spec" rev-parse --show-toplevel 2>/dev/null) == "$(cd "$spec" && pwd -P)" ]]; then
            printf 'dir checkout %s%s\n' "$(git -C "$spec" rev-parse HEAD)" \
                "$(git -C "$spec" diff --quiet HEAD 2>/dev/null || echo ' (with local changes)')"
        else
            printf 'dir (no git information)\n'
        fi
    fi
}
# git_dir DIR: DIR itself when it is a git directory, DIR/.git for a checkout.
git_dir() {
    if git --git-dir="$1" rev-parse --git-dir >/dev/null 2>&1; then
        printf '%s\n' "$1"
    elif git --git-dir="$1/.git" rev-parse --git-dir >/dev/null 2>&1; then
        printf '%s\n' "$1/.git"
    else
        die "'$1' is not a git directory"
    fi
}
# unpack SRC[@REF] DEST: DEST becomes a copy of the tree, without .git.
unpack() {
    local spec=$1 dest=$2
    mkdir -p "$dest"
    if [[ $spec == *@* && ! -d $spec ]]; then
        git --git-dir="$(git_dir "${spec%@*}")" archive --format=tar "${spec##*@}" | tar -x -C "$dest"
    else
        tar -C "$spec" --exclude=.git -cf - . | tar -x -C "$dest"
    fi
}

spdk_desc=$(describe "$spdk_src") || exit 1
dpdk_desc=$(describe "$dpdk_src") || exit 1
vfu_desc=$(describe "$vfu_src") || exit 1
sources=$(printf 'spdk: %s\ndpdk: %s\nlibvfio-user: %s\n' "$spdk_desc" "$dpdk_desc" "$vfu_desc")
mkdir -p "$build"
build=$(cd "$build" && pwd)
src="$build/src"
stamps="$build/stamps"
tools="$build/tools"
mkdir -p "$stamps" "$tools"

# ---------------------------------------------------------------- 1. build dependencies
# Debian package names; the build needs their headers, libraries and commands.
packages=(gcc g++ make patch pkgconf meson ninja-build python3 python3-pyelftools
    python3-yaml python3-jinja2 python3-tabulate libaio-dev liburing-dev uuid-dev
    libssl-dev libnuma-dev libjson-c-dev libcmocka-dev libcunit1-dev libncurses-dev
    libfuse3-dev libkeyutils-dev)
if command -v dpkg-query >/dev/null; then
    missing=()
    for p in "${packages[@]}"; do
        dpkg-query -W -f='${Status}\n' "$p" 2>/dev/null | grep -q 'install ok installed' ||
            missing+=("$p")
    done
    if ((${#missing[@]})); then
        if ((use_apt)) && [[ $(id -u) == 0 ]] && command -v apt-get >/dev/null; then
            log "installing ${missing[*]}"
            DEBIAN_FRONTEND=noninteractive apt-get install -y -q "${missing[@]}"
        else
            die "missing Debian packages: ${missing[*]} (apt-get install them, as root)"
        fi
    fi
else
    log "not a Debian system: make sure the equivalents of these are installed: ${packages[*]}"
fi

# The build runs python3 scripts that import yaml, jinja2, tabulate and elftools. A
# python3 first on PATH without them (pyenv, a venv) is replaced, for the build only, by
# the system one that has them.
py_ok() { "$1" -c 'import yaml, jinja2, tabulate, elftools' 2>/dev/null; }
rm -f "$tools/python3"
if ! py_ok python3; then
    py_ok /usr/bin/python3 ||
        die "no python3 with the modules yaml, jinja2, tabulate and elftools"
    ln -s /usr/bin/python3 "$tools/python3"
    log "using /usr/bin/python3 for the build ($(command -v python3) lacks its modules)"
fi
# Hide nasm from configure: with nasm >= 2.14 it would build ISA-L, whose sources are
# not given (see the top of this file).
printf '#!/bin/sh\nexit 127\n' >"$tools/nasm"
chmod +x "$tools/nasm"
export PATH="$tools:$PATH"

# ---------------------------------------------------------------- 2. source trees
if [[ -e $stamps/extracted ]]; then
    [[ $(cat "$stamps/extracted") == "$sources" ]] ||
        die "$build holds other sources (see $stamps/extracted); use another --build-dir"
    log "sources already extracted in $src"
else
    [[ ! -e $src ]] || die "$src exists but was not made by this script; remove it or use another --build-dir"
    log "extracting the sources into $src"
    rm -rf "$src.tmp"
    unpack "$spdk_src" "$src.tmp"
    [[ -x $src.tmp/configure && -d $src.tmp/lib/nvmf ]] || die "$spdk_src is not an SPDK tree"
    rm -rf "$src.tmp/dpdk" "$src.tmp/libvfio-user"
    unpack "$dpdk_src" "$src.tmp/dpdk"
    [[ -f $src.tmp/dpdk/VERSION && -d $src.tmp/dpdk/lib/eal ]] || die "$dpdk_src is not a DPDK tree"
    unpack "$vfu_src" "$src.tmp/libvfio-user"
    [[ -f $src.tmp/libvfio-user/include/libvfio-user.h ]] || die "$vfu_src is not a libvfio-user tree"
    mv "$src.tmp" "$src"
    printf '%s\n' "$sources" >"$stamps/extracted"
fi
# The libvfio-user commit SPDK pins, when SPDK came from git, for the record.
if [[ $spdk_src == *@* && ! -d $spdk_src ]]; then
    pinned=$(git --git-dir="$(git_dir "${spdk_src%@*}")" ls-tree "${spdk_src##*@}" libvfio-user |
        awk '{print $3}')
    [[ -z $pinned ]] || grep -q "$pinned" <<<"$sources" ||
        log "note: this SPDK pins libvfio-user $pinned, not the one given"
fi

# ---------------------------------------------------------------- 3. local changes
cd "$src"
if [[ ! -d dpdk/lib/argparse ]] && grep -q 'rte_argparse' lib/env_dpdk/env.mk; then
    log "env.mk: dropping rte_argparse (this DPDK has no such library)"
    sed -i 's/[[:space:]]*rte_argparse\b//' lib/env_dpdk/env.mk
fi
if ! grep -q 'no-huge' test/nvme/compliance/nvme_compliance.c; then
    log "nvme_compliance: adding --no-huge, --mem-size and --no-pci"
    patch -p1 --forward --no-backup-if-mismatch <<'EOF' || die "the nvme_compliance patch no longer applies"
--- a/test/nvme/compliance/nvme_compliance.c
+++ b/test/nvme/compliance/nvme_compliance.c
@@ -1430,6 +1430,12 @@
 	{"trid", required_argument, NULL, OPTION_TRID},
 #define OPTION_SINGLE_FILE_SEGMENTS 'g'
 	{"single-file-segments", no_argument, NULL, OPTION_SINGLE_FILE_SEGMENTS},
+#define OPTION_MEM_SIZE 258
+	{"mem-size", required_argument, NULL, OPTION_MEM_SIZE},
+#define OPTION_NO_HUGE 256
+	{"no-huge", no_argument, NULL, OPTION_NO_HUGE},
+#define OPTION_NO_PCI 257
+	{"no-pci", no_argument, NULL, OPTION_NO_PCI},
 };
 
 static int
@@ -1444,6 +1450,19 @@
 	case 'r':
 		g_trid_str = optarg;
 		break;
+	case OPTION_MEM_SIZE:
+		opts->mem_size = spdk_strtol(optarg, 10);
+		if (opts->mem_size < 0) {
+			fprintf(stderr, "invalid memory size '%s'\n", optarg);
+			return -1;
+		}
+		break;
+	case OPTION_NO_HUGE:
+		opts->no_huge = true;
+		break;
+	case OPTION_NO_PCI:
+		opts->no_pci = true;
+		break;
 	default:
 		SPDK_ERRLOG("Unknown op '%c'\n", op);
 		return -1;
@@ -1477,6 +1496,9 @@
 {
 	spdk_nvme_transport_id_usage(stdout, SPDK_NVME_TRID_USAGE_OPT_MANDATORY);
 	printf("  -g, --single-file-segments       force creating just one hugetlbfs file\n");
+	printf("      --mem-size <MB>              DPDK memory size in MB (required with --no-huge)\n");
+	printf("      --no-huge                    run without hugepages\n");
+	printf("      --no-pci                     do not scan/probe PCI devices\n");
 }
 
 int
EOF
fi
if [[ ! -e isa-l/autogen.sh ]]; then
    mkdir -p isa-l
    printf '#!/bin/sh\n# Placeholder from build-spdk-peer.sh: the isa-l submodule is not present.\necho "no isa-l sources" >&2\nexit 1\n' >isa-l/autogen.sh
    chmod +x isa-l/autogen.sh
fi

# ---------------------------------------------------------------- 4. configure
configure_args=(--with-vfio-user --without-crypto --without-isal-crypto
    --without-vhost --without-virtio --disable-unit-tests)
if pkg-config --exists liburing; then
    configure_args+=(--with-uring)
else
    log "no liburing: only the aio bdev will be there for files (no --with-uring)"
fi
configure_args+=("${configure_extra[@]}")
if [[ -e $stamps/configured && -e mk/config.mk &&
    $(cat "$stamps/configured") == "${configure_args[*]}" ]]; then
    log "already configured with: ${configure_args[*]}"
else
    rm -f "$stamps/configured" "$stamps/built"
    log "configuring: ./configure ${configure_args[*]}"
    nice -n 19 ./configure "${configure_args[@]}"
    grep -q '^CONFIG_VFIO_USER?=y' mk/config.mk || die "configure did not enable vfio-user"
    printf '%s\n' "${configure_args[*]}" >"$stamps/configured"
fi

# ---------------------------------------------------------------- 5. build
# The version string carries SPDK's commit when it is known (the tree has no .git).
spdk_commit=$(sed -n 's/^spdk: .* \([0-9a-f]\{40\}\).*/\1/p' "$stamps/extracted")
outputs=(build/bin/nvmf_tgt build/bin/spdk_nvme_perf build/bin/spdk_nvme_identify
    test/nvme/compliance/nvme_compliance)
all_there() { local f; for f in "${outputs[@]}"; do [[ -x $f ]] || return 1; done; }
if [[ -e $stamps/built ]] && all_there; then
    log "already built"
else
    log "building (make -j$jobs at nice 19)"
    start=$SECONDS
    nice -n 19 make -j"$jobs" SPDK_GIT_COMMIT="${spdk_commit:0:10}"
    all_there || die "the build finished without ${outputs[*]}"
    log "built in $(((SECONDS - start) / 60)) min $(((SECONDS - start) % 60)) s"
    touch "$stamps/built"
fi

# ---------------------------------------------------------------- 6. what was built
printf 'nvmf_tgt            %s\n' "$src/build/bin/nvmf_tgt"
printf 'spdk_nvme_perf      %s\n' "$src/build/bin/spdk_nvme_perf"
printf 'spdk_nvme_identify  %s\n' "$src/build/bin/spdk_nvme_identify"
printf 'nvme_compliance     %s\n' "$src/test/nvme/compliance/nvme_compliance"
printf 'rpc.py              %s\n' "$src/scripts/rpc.py"
printf 'SPDK version        %s\n' "$("$src/build/bin/nvmf_tgt" --version 2>/dev/null | head -n1)"
printf 'DPDK version        %s\n' "$(cat "$src/dpdk/VERSION")"
sed 's/^/source /' "$stamps/extracted"
