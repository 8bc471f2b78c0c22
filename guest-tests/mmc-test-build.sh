#!/usr/bin/env bash
# Builds Linux's MMC host test driver, mmc_test.ko (drivers/mmc/core/mmc_test.c,
# CONFIG_MMC_TEST), for the kernel a guest boots. Debian's kernels are built without it.
#
#   guest-tests/mmc-test-build.sh --vmlinuz PATH --out FILE [--cache DIR]
#       A Debian kernel (the guest tests' own): the kernel's exact source version is read
#       from the image's version string ("... Debian 6.1.176-1 ..."); mmc_test.c and the
#       drivers/mmc/core headers it includes come from Debian's linux-source package of
#       that version, and the module is built against linux-headers of the same version
#       (and its -common and linux-kbuild packages), all fetched with apt-get download into
#       the cache and unpacked there, never installed. The module is cached by kernel
#       release and source version; the sources are deleted once it is built.
#   guest-tests/mmc-test-build.sh --kernel-build DIR --out FILE
#       A kernel you built (DIR is its build directory, with .config and
#       Module.symvers): CONFIG_MMC_TEST=y needs no module (FILE is not written and the
#       script prints "built-in"); =m uses DIR/drivers/mmc/core/mmc_test.ko if it is
#       there; otherwise mmc_test.c of that tree is built against it out of tree.
#
# Prints the path of the module (or "built-in") on stdout; progress goes to stderr.
# Needs make and the compiler the kernel was built with (gcc-12 for bookworm's). Exit
# status 0 built, 2 setup error.
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
CACHE=${GUEST_CACHE:-$HERE/work}
VMLINUZ=
KBUILD=
OUT=

say() { printf 'mmc-test-build: %s\n' "$*" >&2; }
die() {
    say "$*"
    exit 2
}
usage() { sed -n '2,/^set -euo/{/^set -euo/d;s/^# \{0,1\}//;p}' "$0"; }

while [[ $# -gt 0 ]]; do
    case $1 in
    --vmlinuz) VMLINUZ=${2:?--vmlinuz needs a path}; shift 2 ;;
    --kernel-build) KBUILD=${2:?--kernel-build needs a directory}; shift 2 ;;
    --out) OUT=${2:?--out needs a file}; shift 2 ;;
    --cache) CACHE=${2:?--cache needs a directory}; shift 2 ;;
    -h | --help) usage; exit 0 ;;
    *) die "unknown option $1 (see --help)" ;;
    esac
done
[[ -n $OUT ]] || die "--out FILE is needed"
[[ -n $VMLINUZ || -n $KBUILD ]] || die "--vmlinuz PATH or --kernel-build DIR is needed"
[[ -z $VMLINUZ || -z $KBUILD ]] || die "--vmlinuz and --kernel-build go one at a time"

# The files of drivers/mmc/core that mmc_test.c includes with "..." (it uses the MMC
# core's private helpers), found in the source rather than listed, so a kernel that
# adds one still builds.
local_includes() {
    sed -n 's/^#include "\([^"]*\)".*/\1/p' "$1"
}

# Builds SRC/mmc_test.c (with its local headers) against the kernel build directory
# KDIR into OUT.
build_out_of_tree() {
    local src=$1 kdir=$2 out=$3 work h
    [[ -f $src/mmc_test.c ]] || die "$src/mmc_test.c not found"
    work=$(mktemp -d "${TMPDIR:-/tmp}/mmc-test-build.XXXXXX")
    cp "$src/mmc_test.c" "$work/"
    for h in $(local_includes "$src/mmc_test.c"); do
        cp "$src/$h" "$work/" || die "mmc_test.c includes $h, not in $src"
    done
    echo 'obj-m := mmc_test.o' >"$work/Kbuild"
    say "make -C $kdir M=$work modules"
    if ! make -C "$kdir" M="$work" modules >"$work/build.log" 2>&1; then
        tail -n 30 "$work/build.log" >&2
        rm -rf "$work"
        die "building mmc_test.ko against $kdir failed (log above)"
    fi
    if grep -q 'WARNING: modpost: .*undefined' "$work/build.log"; then
        grep 'WARNING: modpost' "$work/build.log" >&2
        rm -rf "$work"
        die "mmc_test.ko needs symbols $kdir does not export"
    fi
    mkdir -p "$(dirname "$out")"
    cp "$work/mmc_test.ko" "$out.tmp"
    mv "$out.tmp" "$out"
    rm -rf "$work"
}

# ------------------------------------------------------------------ --kernel-build
if [[ -n $KBUILD ]]; then
    KBUILD=$(cd "$KBUILD" && pwd) || die "no directory $KBUILD"
    [[ -f $KBUILD/.config ]] || die "$KBUILD has no .config: give the kernel's build directory"
    case $(sed -n 's/^CONFIG_MMC_TEST=//p' "$KBUILD/.config") in
    y)
        say "CONFIG_MMC_TEST=y in $KBUILD/.config: mmc_test is built into the kernel"
        echo built-in
        exit 0
        ;;
    m)
        if [[ -f $KBUILD/drivers/mmc/core/mmc_test.ko ]]; then
            cp "$KBUILD/drivers/mmc/core/mmc_test.ko" "$OUT"
            say "using $KBUILD/drivers/mmc/core/mmc_test.ko"
            echo "$OUT"
            exit 0
        fi
        ;;
    esac
    [[ -f $KBUILD/Module.symvers ]] || die "$KBUILD has no Module.symvers: build the kernel (make) first"
    grep -q '^CONFIG_MMC=[ym]' "$KBUILD/.config" || die "$KBUILD/.config has no CONFIG_MMC"
    # An O= build keeps its sources behind the "source" link.
    src=$KBUILD
    [[ -f $src/drivers/mmc/core/mmc_test.c || ! -e $KBUILD/source ]] || src=$(cd "$KBUILD/source" && pwd)
    build_out_of_tree "$src/drivers/mmc/core" "$KBUILD" "$OUT"
    say "built mmc_test.ko out of tree against $KBUILD"
    echo "$OUT"
    exit 0
fi

# ------------------------------------------------------------------ a Debian kernel
[[ -f $VMLINUZ ]] || die "no kernel image $VMLINUZ"
# The bzImage header's kernel_version field (a pointer at 0x20e, offset by 0x200) holds
# "6.1.0-50-amd64 (debian-kernel@lists.debian.org) #1 SMP PREEMPT_DYNAMIC Debian
# 6.1.176-1 (2026-07-02)": the release and the Debian source version.
read -r KREL SRCVER < <(python3 - "$VMLINUZ" <<'EOF'
import re, struct, sys
data = open(sys.argv[1], "rb").read(65536)
if data[0x202:0x206] != b"HdrS":
    sys.exit("not a bzImage")
ptr = struct.unpack_from("<H", data, 0x20E)[0] + 0x200
text = data[ptr:data.index(b"\0", ptr)].decode("ascii", "replace")
m = re.search(r"Debian (\S+)", text)
print(text.split()[0], m.group(1) if m else "")
EOF
) || die "cannot read the kernel version from $VMLINUZ"
[[ -n $SRCVER ]] || die "$VMLINUZ ($KREL) carries no Debian version: not a Debian kernel; use --kernel-build"
# 6.1.176-1 -> linux-source-6.1; 6.12.117-1 -> linux-source-6.12.
SRCPKG=linux-source-$(sed -E 's/^([0-9]+\.[0-9]+).*/\1/' <<<"$SRCVER")
DIR=$CACHE/mmc-test/$KREL-$SRCVER
KEY=$( (echo "$KREL $SRCVER"; cat "$0") | sha256sum | cut -c1-16)
if [[ -f $DIR/mmc_test.ko && $(cat "$DIR/.key" 2>/dev/null) == "$KEY" ]]; then
    cp "$DIR/mmc_test.ko" "$OUT"
    say "mmc_test.ko for $KREL (Debian $SRCVER), cached"
    echo "$OUT"
    exit 0
fi
case $SRCVER in
*deb13* | 6.12.*) die "$KREL is a trixie kernel: its headers need trixie's compiler (gcc-14), which bookworm does not have; build mmc_test.ko for it yourself and use --kernel-build, or boot the default 6.1 kernel" ;;
esac
command -v make >/dev/null || die "make is needed (apt-get install make)"
command -v apt-get >/dev/null || die "apt-get is needed"

rm -rf "$DIR"
mkdir -p "$DIR/dl" "$DIR/root"
# apt-get download, after an apt-get update if the package lists do not have the
# packages (a fresh machine), once.
UPDATED=0
download() {
    if ! (cd "$DIR/dl" && apt-get -q -o APT::Sandbox::User=root download "$@" >"$DIR/apt.log" 2>&1); then
        if [[ $UPDATED == 0 && $EUID == 0 ]]; then
            UPDATED=1
            say "apt-get update"
            apt-get update -q >"$DIR/apt.log" 2>&1 || true
            download "$@"
            return
        fi
        tail -n 5 "$DIR/apt.log" >&2
        die "apt-get download $* failed (is Debian $SRCVER still on the mirror? as root, apt-get update first)"
    fi
}
say "fetching linux-headers-$KREL and $SRCPKG at $SRCVER (about 150 MB)"
download "linux-headers-$KREL=$SRCVER" "$SRCPKG=$SRCVER"
# The headers package's own dependencies at the same version: the -common headers
# and linux-kbuild (the compiler package is a dependency on gcc, checked below).
deps=()
while read -r dep; do
    deps+=("$dep=$SRCVER")
done < <(dpkg-deb -f "$DIR/dl/linux-headers-${KREL}_${SRCVER}_"*.deb Depends | tr ',' '\n' |
    sed -nE 's/^ *(linux-(headers|kbuild)-[^ ]+).*/\1/p')
[[ ${#deps[@]} -gt 0 ]] && download "${deps[@]}"
for deb in "$DIR"/dl/linux-headers-*.deb "$DIR"/dl/linux-kbuild-*.deb; do
    dpkg -x "$deb" "$DIR/root"
done
HDIR=$DIR/root/usr/src/linux-headers-$KREL
[[ -f $HDIR/Makefile ]] || die "linux-headers-$KREL has no usr/src/linux-headers-$KREL/Makefile"
# The headers' Makefile includes the -common tree by its installed path; point it at the
# unpacked one.
sed -i "s|include /usr/src/|include $DIR/root/usr/src/|" "$HDIR/Makefile"
cc=$(sed -nE 's/^CC = .*\)(gcc-[0-9]+)$/\1/p' "$HDIR/.kernelvariables" 2>/dev/null || true)
[[ -z $cc ]] || command -v "$cc" >/dev/null || die "the kernel was built with $cc, which is not installed"
# Only drivers/mmc/core of the source tree is unpacked.
say "unpacking drivers/mmc/core from $SRCPKG"
dpkg-deb --fsys-tarfile "$DIR"/dl/"$SRCPKG"_*.deb |
    tar -xO "./usr/src/$SRCPKG.tar.xz" |
    tar -xJ -C "$DIR/root" --wildcards "$SRCPKG/drivers/mmc/core/*" ||
    die "cannot unpack drivers/mmc/core from $SRCPKG"
build_out_of_tree "$DIR/root/$SRCPKG/drivers/mmc/core" "$HDIR" "$DIR/mmc_test.ko"
rm -rf "$DIR/dl" "$DIR/root"
echo "$KEY" >"$DIR/.key"
cp "$DIR/mmc_test.ko" "$OUT"
say "built mmc_test.ko for $KREL (Debian $SRCVER)"
echo "$OUT"
