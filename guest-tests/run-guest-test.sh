#!/usr/bin/env bash
# Boot a Linux guest under QEMU (TCG) on the card and check what it does with it.
# By default (--disk sdhci) the daemon serves an SDHCI controller over vfio-user to
# QEMU 11.1, the guest's own sdhci-pci, MMC core and mmc_block drive the card, and
# the guest checks EXT_CSD, fio with verification, RPMB, discard, flush, CRC errors
# and a power cut. --disk vhost-user-blk boots on a vhost-user-blk disk served by a
# backend (vhost-user-emmc by default) and runs fio with a latency floor from the
# model; --disk qemu-sdhci is QEMU's own SDHCI controller and eMMC (the baseline);
# --disk virtio-mmc the daemon's virtio-mmc transport on a generic vhost-user device.
# --socket PATH boots the same guest against a daemon the user started (no build, no
# image, no daemon of its own) and checks that the disk works.
#
# Run as root on Debian bookworm; installs what it needs (QEMU 10 from
# bookworm-backports, one pinned Debian kernel package, busybox-static, fio,
# mmc-utils; QEMU 11.1 in a trixie root through guest-tests/qemu11.sh when asked
# for) and caches downloads and the initramfs under $GUEST_CACHE.
# See guest-tests/README.md, or run with --help.
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(dirname "$HERE")

# The guest kernel: one exact Debian package, so every run boots the same kernel.
# (bookworm's point-release kernel; also in bookworm-security.) Override with
# GUEST_KERNEL_PKG=linux-image-6.1.0-NN-amd64 if it has left the mirror.
KERNEL_PKG_PINNED=linux-image-6.1.0-50-amd64
# --kernel 6.12: trixie's point-release kernel (signed image, modules xz-compressed),
# fetched with the apt of the trixie root guest-tests/qemu11.sh builds. When it has
# left trixie's main archive, pass --kernel linux-image-6.12.NN+deb13-amd64 or
# update this pin.
KERNEL_PKG_PINNED_TRIXIE=linux-image-6.12.117+deb13-amd64
# Modules /init loads (with their dependencies, from modules.dep): the virtio
# stack, and the MMC stack for an SDHCI controller on PCI (--disk qemu-sdhci;
# sdhci-pci pulls in cqhci). Without such a controller the MMC modules load and
# find nothing.
GUEST_MODULES=(virtio virtio_ring virtio_pci_modern_dev virtio_pci_legacy_dev virtio_pci virtio_blk
    mmc_core mmc_block sdhci sdhci-pci)
# Bump when the initramfs layout changes, to invalidate cached builds.
INITRAMFS_FORMAT=2
# The virtio device ID QEMU's vhost-user-test-device-pci gives the virtio-mmc
# device (--disk virtio-mmc); docs/virtio-mmc.md says why 21.
VIRTIO_MMC_ID_DEFAULT=21

usage() {
    cat <<'EOF'
Usage: guest-tests/run-guest-test.sh [options]

Boots a Debian kernel under QEMU (TCG, no KVM) on the card — by default an SDHCI
controller the daemon serves over vfio-user, which the guest's own MMC stack
drives (--disk sdhci) —, runs the job set in the guest, prints a summary and exits
non-zero on any fio or verification error, failed check, guest I/O error, timeout,
backend death, or a completion latency below the expected minimum.

Check a daemon you started yourself (nothing is built, no image is created, the
daemon is left running):
  --socket PATH               boot the guest against the socket of your own
                              `vhost-user-emmc serve` and check the disk: it
                              appears, and 1 MiB at 64 MiB is read and saved,
                              written with checksummed blocks and read back
                              (fio), then written back as it was and compared
                              (--fio-var GT_ATTACH_WRITE=0: read only;
                              GT_ATTACH_OFFSET, GT_ATTACH_SIZE: the region, in
                              bytes) [GUEST_SOCKET]
  --transport sdhci|blk       what the socket is, as you passed it to serve:
                              sdhci for `serve --transport sdhci` (vfio-user,
                              QEMU 11.1, the guest's MMC stack on /dev/mmcblk0),
                              blk for `serve` without --transport (vhost-user-blk,
                              /dev/vda). The same as --disk sdhci or --disk
                              vhost-user-blk; one of them is needed with --socket

Options (environment variable in brackets):
  --disk vhost-user-blk|sdhci|qemu-sdhci|virtio-mmc
                              what the guest gets [GUEST_DISK]:
                              sdhci (default): vhost-user-emmc serve --transport sdhci, an
                              SDHCI controller on QEMU's vfio-user-pci that the
                              guest's sdhci-pci, MMC core and mmc_block drive
                              (job set card: /dev/mmcblk0 and its partitions,
                              EXT_CSD, fio, RPMB, discard, flush, CRC errors, a
                              power cut);
                              vhost-user-blk: /dev/vda from --backend (job set quick);
                              qemu-sdhci: QEMU's own sdhci-pci and emmc devices on a
                              raw image, no daemon (the baseline the project's
                              SDHCI transport is compared with; job set sdhci);
                              virtio-mmc: vhost-user-emmc serve --transport mmc
                              on QEMU's vhost-user-test-device-pci (job set
                              virtio-mmc: the guest enumerates the device).
                              Both need QEMU 11.1 and default to --qemu 11
  --pci-identity ID           PCI identity for --disk sdhci (default: the
                              daemon's, intel-apl) [GUEST_PCI_IDENTITY]
  --virtio-id N               virtio device ID for --disk virtio-mmc (default 21)
                              [GUEST_VIRTIO_ID]
  --backend emmc|qsd          emmc: vhost-user-emmc serve (default); qsd:
                              qemu-storage-daemon on a raw file [GUEST_BACKEND]
  --model M                   device model for the emmc backend
                              (default generic-emmc45) [GUEST_MODEL]
  --jobs quick|full|faults|fidelity|seed000|sdhci|virtio-mmc|card|card-stall|sdhci-perf|mmc-test
                              job set: quick (CI, about 1 min of fio),
                              full (larger, adds queue depth 8), faults
                              (data CRC errors and a power cut injected through
                              the daemon's control socket while fio runs; fio
                              must report EIO and the durable data survive), or
                              fidelity (the jobs guest-tests/sim-vs-guest.sh
                              compares with the simulator, all in one boot;
                              that script runs them one per boot), seed000
                              (seed 000's parallel read and write: a direct
                              reader beside a buffered writer, for
                              guest-tests/seed000-rw.sh; the daemon's statistics
                              at the start and end of the run go to --save);
                              sdhci and
                              virtio-mmc go with the --disk of that name;
                              card (the default of --disk sdhci), card-stall
                              (write stalls through mmc_block, for
                              toshiba-mmc32g) and sdhci-perf (random and
                              sequential figures) with --disk sdhci; mmc-test
                              (Linux's own MMC test suite, mmc_test.ko, built
                              by guest-tests/mmc-test-build.sh for the guest's
                              kernel: every case, a per-case table, failing on
                              a case whose result is worse than
                              guest-tests/mmc-test-expected.txt lists) with
                              --disk sdhci or qemu-sdhci (report only); pick
                              cases with --fio-var GT_MMCTEST_CASES=1,2,27;
                              mmc-utils and mmc-utils-after (the two boots of
                              guest-tests/mmc-utils.sh, with --image); attach
                              (the only set of --socket)
                              (default: quick, or the disk's own set) [GUEST_JOBS]
  --expect-min-write-lat-us N fail if any fio write completes faster than N us
                              (derive N from the model; 0 = no check)
                              [GUEST_EXPECT_MIN_WRITE_LAT_US]
  --expect-min-read-lat-us N  the same for reads [GUEST_EXPECT_MIN_READ_LAT_US]
  --serve-args 'ARGS'         more options for the emmc backend's serve, e.g.
                              '--packing always' (words split on spaces)
                              [GUEST_SERVE_ARGS]
  --backend-cmd TEMPLATE      command that serves a vhost-user-blk socket;
                              @SOCK@ @IMAGE@ @MODEL@ @BIN@ @TRACE@ are replaced
                              [GUEST_BACKEND_CMD]
  --image-cmd TEMPLATE        command that creates the disk image (same
                              placeholders, plus @SIZE@) [GUEST_IMAGE_CMD]
  --image-size SIZE           raw image size for qsd and qemu-sdhci (default 1G)
                              [GUEST_IMAGE_SIZE]
  --image PATH                the card's image: used as it is if it exists (a card
                              an earlier run left: its partitioning, RPMB key,
                              EXT_CSD settings), else created there; kept after
                              the run either way (guest-tests/mmc-utils.sh boots
                              twice on one image) [GUEST_IMAGE]
  --image-dir DIR             put the disk image in DIR instead of the run
                              directory, e.g. /dev/shm: on a file system where
                              fdatasync is slow the daemon's syncs of durable
                              writes delay its completions [GUEST_IMAGE_DIR]
  --bin PATH                  vhost-user-emmc binary (default: the repo's
                              target/release build) [VHOST_USER_EMMC]
  --no-build                  do not run cargo build --release first (cargo
                              prints its progress; the first build takes minutes)
  --kernel 6.1|6.12|PACKAGE   guest kernel: 6.1 (default), bookworm's
                              linux-image-6.1.0-50-amd64; 6.12, trixie's
                              linux-image-6.12.117+deb13-amd64 (fetched with the
                              apt of guest-tests/qemu11.sh's trixie root, which
                              it builds if missing); or an exact Debian
                              linux-image-*-amd64 package name (+deb13: trixie)
                              [GUEST_KERNEL; GUEST_KERNEL_PKG overrides 6.1's]
  --kernel-build DIR          boot your own kernel: DIR is its build directory
                              (arch/x86/boot/bzImage, .config, its modules are
                              installed from it with make modules_install); for
                              --jobs mmc-test, mmc_test comes from that tree
                              (built in, its mmc_test.ko, or built against it)
                              [GUEST_KERNEL_BUILD]
  --qemu 10|11|PATH           10 (default): qemu-system-x86_64 from PATH, QEMU 10
                              installed from bookworm-backports; 11: QEMU 11.1 from
                              trixie-backports, run in a Debian trixie root that
                              guest-tests/qemu11.sh builds once (about 5 min) under
                              the cache; PATH: another QEMU binary [GUEST_QEMU]
  --fio-var NAME=VALUE        override a GT_* job variable (repeatable), e.g.
                              --fio-var GT_RUNTIME=10
  --timeout SEC               kill the guest after SEC seconds
                              (default 200 quick, 600 full) [GUEST_TIMEOUT]
  --cache DIR                 downloads, kernel, initramfs, run directories
                              (default guest-tests/work) [GUEST_CACHE]
  --no-install                never call apt-get; fail if something is missing
                              [GUEST_NO_INSTALL=1]
  --summary-json FILE         also write the parsed results as JSON
  --save DIR                  copy the results port's log (data.log), the
                              daemon's trace (serve.trace, emmc backend) and
                              the console log into DIR, pass or fail
  --keep                      keep the run directory (logs, image) on success
                              (--jobs faults keeps its logs, not the image, always)
  --quiet                     do not stream the guest console
  -h, --help                  this text

Exit status: 0 pass, 1 test failure, 2 setup or usage error.
EOF
}

log() { printf '== %s\n' "$*"; }
warn() { printf 'run-guest-test: %s\n' "$*" >&2; }
die() {
    warn "error: $*"
    exit 2
}

# ---------------------------------------------------------------- options
DISK=${GUEST_DISK:-}
USER_SOCKET=${GUEST_SOCKET:-}
VIRTIO_ID=${GUEST_VIRTIO_ID:-$VIRTIO_MMC_ID_DEFAULT}
PCI_IDENTITY=${GUEST_PCI_IDENTITY:-}
BACKEND=${GUEST_BACKEND:-emmc}
MODEL=${GUEST_MODEL:-generic-emmc45}
JOBSET=${GUEST_JOBS:-}
EXPECT_WRITE_US=${GUEST_EXPECT_MIN_WRITE_LAT_US:-0}
EXPECT_READ_US=${GUEST_EXPECT_MIN_READ_LAT_US:-0}
BACKEND_CMD=${GUEST_BACKEND_CMD:-}
SERVE_ARGS=${GUEST_SERVE_ARGS:-}
IMAGE_CMD=${GUEST_IMAGE_CMD:-}
IMAGE_SIZE=${GUEST_IMAGE_SIZE:-1G}
IMAGE_DIR=${GUEST_IMAGE_DIR:-}
USER_IMAGE=${GUEST_IMAGE:-}
BIN=${VHOST_USER_EMMC:-$REPO/target/release/vhost-user-emmc}
BUILD=1
TIMEOUT=${GUEST_TIMEOUT:-}
CACHE=${GUEST_CACHE:-$HERE/work}
INSTALL=1
[[ ${GUEST_NO_INSTALL:-0} == 1 ]] && INSTALL=0
SUMMARY_JSON=
SAVE_DIR=
KEEP=0
QUIET=0
KERNEL=${GUEST_KERNEL:-6.1}
KERNEL_BUILD=${GUEST_KERNEL_BUILD:-}
QEMU=${GUEST_QEMU:-}
GUEST_MEM=${GUEST_MEM:-512M}
GUEST_SMP=${GUEST_SMP:-1}
FIO_VARS=()

need_arg() { [[ $# -ge 2 && -n $2 ]] || die "$1 needs a value"; }
while [[ $# -gt 0 ]]; do
    case $1 in
    --disk) need_arg "$@"; DISK=$2; shift 2 ;;
    --socket) need_arg "$@"; USER_SOCKET=$2; shift 2 ;;
    --transport)
        need_arg "$@"
        case $2 in
        sdhci) DISK=sdhci ;;
        blk | vhost-user-blk) DISK=vhost-user-blk ;;
        *) die "--transport must be sdhci or blk (serve's --transport of the socket), not '$2'" ;;
        esac
        shift 2
        ;;
    --virtio-id) need_arg "$@"; VIRTIO_ID=$2; shift 2 ;;
    --pci-identity) need_arg "$@"; PCI_IDENTITY=$2; shift 2 ;;
    --backend) need_arg "$@"; BACKEND=$2; shift 2 ;;
    --model) need_arg "$@"; MODEL=$2; shift 2 ;;
    --jobs) need_arg "$@"; JOBSET=$2; shift 2 ;;
    --expect-min-write-lat-us) need_arg "$@"; EXPECT_WRITE_US=$2; shift 2 ;;
    --expect-min-read-lat-us) need_arg "$@"; EXPECT_READ_US=$2; shift 2 ;;
    --backend-cmd) need_arg "$@"; BACKEND_CMD=$2; shift 2 ;;
    --serve-args) need_arg "$@"; SERVE_ARGS=$2; shift 2 ;;
    --image-cmd) need_arg "$@"; IMAGE_CMD=$2; shift 2 ;;
    --image-size) need_arg "$@"; IMAGE_SIZE=$2; shift 2 ;;
    --image-dir) need_arg "$@"; IMAGE_DIR=$2; shift 2 ;;
    --image) need_arg "$@"; USER_IMAGE=$2; shift 2 ;;
    --bin) need_arg "$@"; BIN=$2; shift 2 ;;
    --no-build) BUILD=0; shift ;;
    --qemu) need_arg "$@"; QEMU=$2; shift 2 ;;
    --kernel) need_arg "$@"; KERNEL=$2; shift 2 ;;
    --kernel-build) need_arg "$@"; KERNEL_BUILD=$2; shift 2 ;;
    --fio-var) need_arg "$@"; FIO_VARS+=("$2"); shift 2 ;;
    --timeout) need_arg "$@"; TIMEOUT=$2; shift 2 ;;
    --cache) need_arg "$@"; CACHE=$2; shift 2 ;;
    --no-install) INSTALL=0; shift ;;
    --summary-json) need_arg "$@"; SUMMARY_JSON=$2; shift 2 ;;
    --save) need_arg "$@"; SAVE_DIR=$2; shift 2 ;;
    --keep) KEEP=1; shift ;;
    --quiet) QUIET=1; shift ;;
    -h | --help) usage; exit 0 ;;
    *) usage >&2; die "unknown option: $1" ;;
    esac
done

is_number() { [[ $1 =~ ^[0-9]+([.][0-9]+)?$ ]]; }
if [[ -n $USER_IMAGE ]]; then
    mkdir -p "$(dirname "$USER_IMAGE")" || die "--image: cannot create the directory of $USER_IMAGE"
    USER_IMAGE=$(cd "$(dirname "$USER_IMAGE")" && pwd -P)/$(basename "$USER_IMAGE")
fi
is_number "$EXPECT_WRITE_US" || die "--expect-min-write-lat-us: not a number: $EXPECT_WRITE_US"
is_number "$EXPECT_READ_US" || die "--expect-min-read-lat-us: not a number: $EXPECT_READ_US"
[[ $VIRTIO_ID =~ ^[0-9]+$ ]] || die "--virtio-id: not a number: $VIRTIO_ID"
# The kernel package and the Debian suite it comes from.
case $KERNEL in
6.1) KERNEL_PKG=${GUEST_KERNEL_PKG:-$KERNEL_PKG_PINNED} ;;
6.12) KERNEL_PKG=$KERNEL_PKG_PINNED_TRIXIE ;;
linux-image-*-amd64) KERNEL_PKG=$KERNEL ;;
*) die "--kernel must be 6.1, 6.12 or a linux-image-*-amd64 package name, not '$KERNEL'" ;;
esac
[[ $KERNEL_PKG =~ ^linux-image-[0-9][A-Za-z0-9.+~-]*-amd64$ ]] || die "not a kernel package name: $KERNEL_PKG"
KERNEL_SUITE=bookworm
[[ $KERNEL_PKG != *+deb13-* ]] || KERNEL_SUITE=trixie
if [[ -n $KERNEL_BUILD ]]; then
    KERNEL_BUILD=$(cd "$KERNEL_BUILD" 2>/dev/null && pwd) || die "--kernel-build: no directory $KERNEL_BUILD"
    [[ -f $KERNEL_BUILD/arch/x86/boot/bzImage && -f $KERNEL_BUILD/include/config/kernel.release ]] ||
        die "--kernel-build $KERNEL_BUILD: no arch/x86/boot/bzImage or include/config/kernel.release (build the kernel there first: make bzImage modules)"
    KERNEL_PKG="your kernel in $KERNEL_BUILD"
    KERNEL_SUITE=build
fi

# --socket: a daemon the user started. The socket's transport must be said; the job set
# is attach; nothing is built or created, and the daemon is neither started nor stopped.
if [[ -n $USER_SOCKET ]]; then
    case $DISK in
    sdhci | vhost-user-blk) ;;
    "") die "--socket needs the socket's transport: --transport sdhci (serve --transport sdhci) or --transport blk (serve without --transport)" ;;
    *) die "--socket checks the socket of serve --transport sdhci or blk, not --disk $DISK" ;;
    esac
    [[ -z $JOBSET || $JOBSET == attach ]] || die "--socket runs the attach check only, not --jobs $JOBSET"
    [[ -z $BACKEND_CMD && -z $IMAGE_CMD && -z $SERVE_ARGS && -z $IMAGE_DIR && -z $USER_IMAGE ]] ||
        die "--socket boots on your daemon: --backend-cmd, --image-cmd, --serve-args, --image-dir and --image do not apply"
    if ! [[ -S $USER_SOCKET ]]; then
        [[ -e $USER_SOCKET ]] && die "$USER_SOCKET is not a socket"
        die "no socket at $USER_SOCKET: start the daemon first (vhost-user-emmc serve$([[ $DISK == sdhci ]] && echo ' --transport sdhci') --socket $USER_SOCKET --image IMAGE)"
    fi
    # By its real directory: QEMU 11.1 runs in a root where that directory is bound.
    sock_dir=$(cd "$(dirname "$USER_SOCKET")" && pwd -P) || die "cannot resolve the directory of $USER_SOCKET"
    [[ $sock_dir != / ]] || die "put the socket in a directory, not in / (QEMU 11.1's root binds that directory)"
    USER_SOCKET=$sock_dir/$(basename "$USER_SOCKET")
    ((${#USER_SOCKET} < 108)) || die "socket path too long for a unix socket: $USER_SOCKET"
    JOBSET=attach
    BACKEND=user
    BUILD=0
fi

# Without --disk: sdhci, unless the other options are the vhost-user-blk path's (another
# backend, or one of its job sets).
if [[ -z $DISK ]]; then
    case $BACKEND:$BACKEND_CMD:$JOBSET in
    emmc::quick | emmc::full | emmc::faults | emmc::fidelity | emmc::seed000) DISK=vhost-user-blk ;;
    emmc::*) DISK=sdhci ;;
    *) DISK=vhost-user-blk ;;
    esac
fi

# The disk decides the default job set and which QEMU: QEMU's own eMMC and the
# generic vhost-user device are in QEMU 11.1, not 10.
case $DISK in
vhost-user-blk) : "${JOBSET:=quick}" ;;
qemu-sdhci | virtio-mmc | sdhci)
    if [[ $DISK == sdhci ]]; then : "${JOBSET:=card}"; else : "${JOBSET:=${DISK#qemu-}}"; fi
    : "${QEMU:=11}"
    [[ $QEMU != 10 ]] || die "--disk $DISK needs QEMU 11.1 (--qemu 11)"
    ;;
*) die "--disk must be vhost-user-blk, sdhci, qemu-sdhci or virtio-mmc, not '$DISK'" ;;
esac
QEMU11=0
case $QEMU in
10) QEMU= ;;
11) QEMU11=1 ;;
esac

# The job sets: which job files run, and the sizes and runtimes they read as
# ${GT_*}. The quick set keeps the whole run (boot included) around 1.5 minutes
# under TCG with a fast backend; every time-based job stops after GT_RUNTIME s.
declare -A GT
case $JOBSET in
quick)
    GT=([GT_JOBS]="verify,randrw,seq" [GT_VERIFY_SIZE]=2m [GT_VERIFY_SEQ_SIZE]=8m
        [GT_RANDRW_SPAN]=64m [GT_SEQ_SIZE]=16m [GT_RUNTIME]=5)
    : "${TIMEOUT:=200}"
    ;;
full)
    GT=([GT_JOBS]="verify,randrw,seq,qd" [GT_VERIFY_SIZE]=32m [GT_VERIFY_SEQ_SIZE]=64m
        [GT_RANDRW_SPAN]=256m [GT_SEQ_SIZE]=256m [GT_RUNTIME]=20)
    : "${TIMEOUT:=600}"
    ;;
faults)
    # Injected faults and a power cut while fio runs (see fault_driver below).
    GT=([GT_JOBS]="faults-prep,faults-io,faults-verify" [GT_FAULT_OFFSET]=512m
        [GT_FAULT_SIZE]=16m [GT_SCRATCH_OFFSET]=640m [GT_SCRATCH_SIZE]=64m [GT_RUNTIME]=8)
    : "${TIMEOUT:=200}"
    [[ $BACKEND == emmc ]] || die "--jobs faults needs the emmc backend (its control socket)"
    ;;
fidelity)
    # Simulated vs measured: large sequential requests and small random ones at queue
    # depth 1 (guest-tests/sim-vs-guest.sh runs each in a boot of its own).
    GT=([GT_JOBS]="fidelity-seqwrite,fidelity-seqread,fidelity-randwrite,fidelity-randwrite-512k,fidelity-randread"
        [GT_FID_SEQ_SIZE]=128m [GT_FID_RAND_IOS]=400 [GT_FID_RAND_BIG_IOS]=128 [GT_HUGEPAGES]=16)
    : "${TIMEOUT:=300}"
    ;;
seed000)
    # Seed 000's parallel read and write (guest-tests/seed000-rw.sh): the guest's
    # queue settings, the reader alone, then the reader beside a buffered writer.
    GT=([GT_JOBS]="seed000-info,seed000-read,seed000-rw" [GT_S0_RUNTIME]=10
        [GT_S0_ALONE_RUNTIME]=4 [GT_S0_READ_SPAN]=384m [GT_S0_WRITE_OFFSET]=512m
        [GT_S0_WRITE_SPAN]=2g)
    : "${TIMEOUT:=300}"
    [[ $BACKEND == emmc ]] || die "--jobs seed000 needs the emmc backend (its control socket)"
    ;;
sdhci)
    # QEMU's in-process sdhci-pci + emmc (--disk qemu-sdhci): what the guest sees
    # (kernel log, block devices, bus settings), 4 KiB random reads at queue depth 16
    # and 1 MiB sequential reads, EXT_CSD through mmc-utils, then one direct write,
    # each wait bounded: QEMU's card is known to hang writes and CMD8 through the
    # ioctl, and a hung write must not hang the run.
    GT=([GT_JOBS]="sdhci-probe,sdhci-mmio,sdhci-randread,sdhci-seqread,sdhci-extcsd,sdhci-write"
        [GT_DEV]=/dev/mmcblk0 [GT_SDHCI_SPAN]=512m [GT_SDHCI_SEQ_SIZE]=64m
        [GT_RUNTIME]=10 [GT_BOUND]=20)
    : "${TIMEOUT:=240}"
    [[ $DISK == qemu-sdhci ]] || die "--jobs sdhci needs --disk qemu-sdhci"
    ;;
virtio-mmc)
    # No driver in the guest claims the device: the guest enumerates it.
    GT=([GT_JOBS]="virtio-mmc-enum" [GT_DEV]=none [GT_VIRTIO_ID]=$VIRTIO_ID)
    : "${TIMEOUT:=120}"
    [[ $DISK == virtio-mmc ]] || die "--jobs virtio-mmc needs --disk virtio-mmc"
    ;;
card)
    # The daemon's SDHCI controller (--disk sdhci), each feature through the guest's
    # own MMC stack: what the guest sees and the bus it chose, EXT_CSD byte by byte
    # against inspect, fio verify on the user area and boot partition 0, RPMB, discard
    # and secure discard, fsync as FLUSH_CACHE, write CRC errors from the fault plan
    # retried, and a power cut from the control socket while fio runs (the
    # faults-* jobs; see power_cut_driver). The host checks the daemon's command log
    # (sdhci-checks.py).
    GT=([GT_JOBS]="sdhci-probe,card-extcsd,verify,card-boot-unlock,card-boot,card-rpmb,card-discard,card-fsync,card-crc,faults-prep,faults-io,faults-verify"
        [GT_DEV]=/dev/mmcblk0 [GT_BOUND]=30 [GT_VERIFY_SIZE]=2m [GT_VERIFY_SEQ_SIZE]=8m
        [GT_DISCARD_OFFSET]=$((300 * 1024 * 1024)) [GT_SECDISCARD_OFFSET]=$((304 * 1024 * 1024))
        [GT_DISCARD_LEN]=$((1024 * 1024)) [GT_FSYNC_OFFSET]=320m
        [GT_CRC_OFFSET]=384m [GT_CRC_SIZE]=2m
        [GT_FAULT_OFFSET]=512m [GT_FAULT_SIZE]=8m [GT_SCRATCH_OFFSET]=640m
        [GT_SCRATCH_SIZE]=64m [GT_RUNTIME]=6)
    : "${TIMEOUT:=400}"
    [[ $DISK == sdhci ]] || die "--jobs card needs --disk sdhci"
    ;;
card-stall)
    GT=([GT_JOBS]="sdhci-probe,card-stall" [GT_DEV]=/dev/mmcblk0
        [GT_STALL_OFFSET]=$((256 * 1024 * 1024))
        [GT_STALL_OFFSET_CROSS]=$((256 * 1024 * 1024 + 8192 - 512)))
    : "${TIMEOUT:=300}"
    [[ $DISK == sdhci ]] || die "--jobs card-stall needs --disk sdhci"
    ;;
mmc-test)
    # Linux's MMC test suite against the card: mmc_block lets go of it, mmc_test binds,
    # and every case runs on its own (jobs/mmc-test.sh). The performance cases write
    # and read a 4 MiB area in the middle of the card and run 10 s random phases; on
    # QEMU's card (--disk qemu-sdhci) the write cases end in the host's timeouts.
    GT=([GT_JOBS]="sdhci-probe,mmc-test" [GT_DEV]=/dev/mmcblk0 [GT_MMCTEST_CASES]=all
        [GT_MMCTEST_BOUND]=600)
    # All 51 cases took 1506 s of guest time on generic-emmc45 (2 cores, TCG, a build
    # running beside it).
    : "${TIMEOUT:=3000}"
    [[ $DISK == sdhci || $DISK == qemu-sdhci ]] || die "--jobs mmc-test needs --disk sdhci or qemu-sdhci"
    ;;
mmc-utils | mmc-utils-after)
    # guest-tests/mmc-utils.sh: mmc-utils against the card in two boots on one image
    # (--image), the daemon power-cycled between them (jobs/mmc-utils.sh says what each
    # boot does).
    if [[ $JOBSET == mmc-utils ]]; then
        GT=([GT_JOBS]="sdhci-probe,card-rpmb,mmc-utils" [GT_MMCU_BOOT]=1)
    else
        GT=([GT_JOBS]="sdhci-probe,mmc-utils" [GT_MMCU_BOOT]=2)
    fi
    GT+=([GT_DEV]=/dev/mmcblk0 [GT_BOUND]=60)
    : "${TIMEOUT:=300}"
    [[ $DISK == sdhci ]] || die "--jobs $JOBSET needs --disk sdhci"
    ;;
sdhci-perf)
    # The figures guest-tests/sdhci-vs-qemu.sh puts beside QEMU's in-process card.
    GT=([GT_JOBS]="sdhci-probe,sdhci-mmio,sdhci-randread,sdhci-seqread,sdhci-seqwrite"
        [GT_DEV]=/dev/mmcblk0 [GT_SDHCI_SPAN]=512m [GT_SDHCI_SEQ_SIZE]=64m
        [GT_SDHCI_WRITE_OFFSET]=640m [GT_RUNTIME]=10)
    : "${TIMEOUT:=240}"
    [[ $DISK == sdhci ]] || die "--jobs sdhci-perf needs --disk sdhci"
    ;;
attach)
    # --socket: the disk appears; a region read, written and verified, then restored.
    GT=([GT_JOBS]="attach-check" [GT_ATTACH_OFFSET]=$((64 * 1024 * 1024))
        [GT_ATTACH_SIZE]=$((1024 * 1024)) [GT_ATTACH_WRITE]=1)
    [[ $DISK != sdhci ]] || GT[GT_DEV]=/dev/mmcblk0
    : "${TIMEOUT:=180}"
    [[ -n $USER_SOCKET ]] || die "--jobs attach goes with --socket PATH"
    ;;
*) die "--jobs must be quick, full, faults, fidelity, seed000, sdhci, virtio-mmc, card, card-stall, sdhci-perf, mmc-test, mmc-utils, mmc-utils-after or attach, not '$JOBSET'" ;;
esac
case $JOBSET in
sdhci | virtio-mmc | card | card-stall | sdhci-perf | mmc-test | mmc-utils | mmc-utils-after | attach) ;;
*) [[ $DISK == vhost-user-blk ]] || die "--disk $DISK runs --jobs ${DISK#qemu-} only" ;;
esac
for kv in "${FIO_VARS[@]}"; do
    [[ $kv =~ ^(GT_[A-Z0-9_]+)=([A-Za-z0-9_,.:/+-]+)$ ]] ||
        die "--fio-var wants GT_NAME=value (letters, digits and _,.:/+- only): $kv"
    GT[${BASH_REMATCH[1]}]=${BASH_REMATCH[2]}
done
[[ $TIMEOUT =~ ^[0-9]+$ ]] || die "--timeout: not a whole number of seconds: $TIMEOUT"
[[ $SERVE_ARGS =~ ^[A-Za-z0-9_,.:/=\ -]*$ ]] ||
    die "--serve-args: letters, digits, spaces and _,.:/=- only: $SERVE_ARGS"
[[ -z $SERVE_ARGS || $BACKEND == emmc ]] || die "--serve-args needs the emmc backend"
IFS=, read -r -a JOB_FILES <<<"${GT[GT_JOBS]}"
# fio jobs (jobs/NAME.fio) and shell jobs (jobs/NAME.sh), for the checks.
FIO_JOBS=()
SH_JOBS=()
for job in "${JOB_FILES[@]}"; do
    if [[ -f $HERE/jobs/$job.fio ]]; then
        FIO_JOBS+=("$job")
    elif [[ -f $HERE/jobs/$job.sh ]]; then
        SH_JOBS+=("$job")
    else
        die "no job file $HERE/jobs/$job.fio or $HERE/jobs/$job.sh"
    fi
done

[[ $BACKEND == user ]] || case $DISK in
qemu-sdhci)
    # No backend process: QEMU serves the raw image itself.
    BACKEND=none
    : "${IMAGE_CMD:=truncate -s @SIZE@ @IMAGE@}"
    ;;
virtio-mmc)
    [[ $BACKEND == emmc ]] || die "--disk virtio-mmc needs the emmc backend"
    # RUST_LOG=info: the daemon logs each frontend session (attached, detached).
    : "${BACKEND_CMD:=env RUST_LOG=info @BIN@ serve --transport mmc --socket @SOCK@ --model @MODEL@ --image @IMAGE@ --timing realtime --control @CONTROL@ @SERVE_ARGS@}"
    ;;
sdhci)
    [[ $BACKEND == emmc ]] || die "--disk sdhci needs the emmc backend"
    # The command log is what the host checks the guest's commands in; the fault
    # plan (job set card) fails some writes' data CRC.
    : "${BACKEND_CMD:=env RUST_LOG=info @BIN@ serve --transport sdhci @PCI_IDENTITY@ --socket @SOCK@ --model @MODEL@ --image @IMAGE@ --timing realtime --cmd-log @CMDLOG@ --control @CONTROL@ @FAULT_PLAN@ @SERVE_ARGS@}"
    ;;
esac
case $BACKEND in
none | user) ;;
emmc)
    # The faults set keeps the daemon's command log too: what the card saw around the
    # power cut, in the run directory a failure leaves behind.
    cmdlog_opt=
    [[ $JOBSET != faults ]] || cmdlog_opt=" --cmd-log @CMDLOG@"
    : "${BACKEND_CMD:=@BIN@ serve --socket @SOCK@ --model @MODEL@ --image @IMAGE@ --timing realtime --trace @TRACE@ --control @CONTROL@$cmdlog_opt @SERVE_ARGS@}"
    : "${IMAGE_CMD:=@BIN@ image create --model @MODEL@ @IMAGE@}"
    ;;
qsd)
    : "${BACKEND_CMD:=qemu-storage-daemon --blockdev driver=file,node-name=disk,filename=@IMAGE@ --export type=vhost-user-blk,id=exp,node-name=disk,addr.type=unix,addr.path=@SOCK@,writable=on}"
    : "${IMAGE_CMD:=truncate -s @SIZE@ @IMAGE@}"
    ;;
*) die "--backend must be emmc or qsd, not '$BACKEND'" ;;
esac

# Time: each long step says how long it took, and "[elapsed N s]" is the time since the
# script started.
T0=$SECONDS
elapsed() { echo "[elapsed $((SECONDS - T0)) s]"; }
STEP_T0=$SECONDS
step_start() { STEP_T0=$SECONDS; }
step_took() { echo "$((SECONDS - STEP_T0)) s"; }

# ---------------------------------------------------------------- packages
APT_UPDATED=0
apt_update_once() {
    if [[ $APT_UPDATED == 0 ]]; then
        log "apt-get update"
        apt-get update -q >"$CACHE/apt.log" 2>&1 || {
            tail -n 20 "$CACHE/apt.log" >&2
            die "apt-get update failed"
        }
        APT_UPDATED=1
    fi
}
pkg_version() {
    dpkg-query -W -f='${Status} ${Version}\n' "$1" 2>/dev/null |
        awk '$1 == "install" && $3 == "installed" { print $4 }'
}
# QEMU 10 (vhost-user-blk with memory-backend-memfd works on 7.2 too, but the
# project tests against the version bookworm-backports ships).
qemu_ok() {
    local v
    v=$(pkg_version "$1")
    [[ -n $v ]] && dpkg --compare-versions "$v" ge 1:10.0
}

install_packages() {
    local plain=() bpo=() p
    # mmc-utils: the guest's `mmc` (EXT_CSD, RPMB); a small binary. gcc and libc6-dev
    # build the guest's static mmio-probe.
    for p in busybox-static fio cpio kmod mmc-utils gcc libc6-dev; do
        [[ -n $(pkg_version "$p") ]] || plain+=("$p")
    done
    command -v python3 >/dev/null || plain+=(python3)
    # --jobs mmc-test builds mmc_test.ko (guest-tests/mmc-test-build.sh): make, and what
    # the unpacked linux-kbuild tools link against.
    if [[ $JOBSET == mmc-test ]]; then
        for p in make libelf1 libssl3; do
            [[ -n $(pkg_version "$p") ]] || plain+=("$p")
        done
    fi
    # xz: trixie's kernel modules are .ko.xz.
    [[ $KERNEL_SUITE != trixie ]] || command -v xz >/dev/null || plain+=(xz-utils)
    [[ -n $QEMU ]] || qemu_ok qemu-system-x86 || bpo+=(qemu-system-x86)
    if [[ $BACKEND == qsd ]] && ! qemu_ok qemu-utils; then bpo+=(qemu-utils); fi
    [[ ${#plain[@]} -gt 0 || ${#bpo[@]} -gt 0 ]] || return 0

    if [[ $INSTALL == 0 || $EUID != 0 ]]; then
        die "missing packages: ${plain[*]} ${bpo[*]} (run as root without --no-install," \
            "or install them: apt-get install ${plain[*]}; apt-get install -t bookworm-backports ${bpo[*]})"
    fi
    if [[ ${#bpo[@]} -gt 0 ]] &&
        ! grep -rqs '^[^#]*bookworm-backports' /etc/apt/sources.list /etc/apt/sources.list.d/; then
        log "adding bookworm-backports to apt sources"
        echo "deb http://deb.debian.org/debian bookworm-backports main" >/etc/apt/sources.list.d/bpo.list
        APT_UPDATED=0
    fi
    apt_update_once
    export DEBIAN_FRONTEND=noninteractive
    if [[ ${#plain[@]} -gt 0 ]]; then
        log "apt-get install ${plain[*]}"
        apt-get install -y -q --no-install-recommends "${plain[@]}" >"$CACHE/apt.log" 2>&1 || {
            tail -n 20 "$CACHE/apt.log" >&2
            die "apt-get install ${plain[*]} failed"
        }
    fi
    if [[ ${#bpo[@]} -gt 0 ]]; then
        log "apt-get install -t bookworm-backports ${bpo[*]}"
        apt-get install -y -q --no-install-recommends -t bookworm-backports "${bpo[@]}" \
            >"$CACHE/apt.log" 2>&1 || {
            tail -n 20 "$CACHE/apt.log" >&2
            die "apt-get install -t bookworm-backports ${bpo[*]} failed"
        }
        for p in "${bpo[@]}"; do qemu_ok "$p" || die "$p from bookworm-backports is older than 10.0"; done
    fi
}

# ---------------------------------------------------------------- kernel
# Sets KVER, VMLINUZ, KROOT (the unpacked package, with modules.dep).
fetch_kernel() {
    local kdir=$CACHE/kernel/$KERNEL_PKG deb
    KVER=${KERNEL_PKG#linux-image-}
    KROOT=$kdir/root
    VMLINUZ=$KROOT/boot/vmlinuz-$KVER
    KERNEL_FROM_CACHE=1
    if [[ -f $kdir/.ready && -f $VMLINUZ ]]; then
        return 0
    fi
    KERNEL_FROM_CACHE=0
    log "fetching the guest kernel $KERNEL_PKG ($KERNEL_SUITE) $(elapsed)"
    [[ $INSTALL == 1 ]] || die "kernel $KERNEL_PKG not in $kdir and --no-install given"
    if [[ $KERNEL_SUITE == trixie ]]; then
        fetch_trixie_kernel "$kdir"
        return 0
    fi
    if ! apt-cache show "$KERNEL_PKG" >/dev/null 2>&1; then
        apt_update_once
    fi
    if ! apt-cache show "$KERNEL_PKG" >/dev/null 2>&1; then
        warn "the pinned guest kernel package $KERNEL_PKG is not on the mirror any more."
        warn "kernels the mirror has now:"
        apt-cache search --names-only '^linux-image-6\.1\.0-[0-9]+-amd64$' | sort -V | sed 's/^/    /' >&2 || true
        die "pick one, then set GUEST_KERNEL_PKG=<name> or update KERNEL_PKG_PINNED in $0"
    fi
    rm -rf "$kdir"
    mkdir -p "$kdir/dl"
    (cd "$kdir/dl" && apt-get -q -o APT::Sandbox::User=root download "$KERNEL_PKG" >/dev/null) ||
        die "apt-get download $KERNEL_PKG failed (is it still on the mirror? set GUEST_KERNEL_PKG to override)"
    deb=$(find "$kdir/dl" -name "${KERNEL_PKG}_*.deb" | head -n 1)
    [[ -n $deb ]] || die "apt-get download left no .deb for $KERNEL_PKG"
    unpack_kernel "$kdir" "$deb"
}

# --kernel-build: the user's kernel. Its image is copied and its modules are installed
# from the build directory (make modules_install, stripped) into the cache (which QEMU
# 11.1's root can see), again whenever the kernel image is newer than the last copy.
fetch_kernel_build() {
    local kdir stamp image=$KERNEL_BUILD/arch/x86/boot/bzImage
    KVER=$(cat "$KERNEL_BUILD/include/config/kernel.release")
    kdir=$CACHE/kernel/build-$(printf '%s' "$KERNEL_BUILD" | sha256sum | cut -c1-12)
    KROOT=$kdir/root
    VMLINUZ=$kdir/bzImage
    stamp="$KVER $(stat -c %Y "$image")"
    KERNEL_FROM_CACHE=1
    if [[ -f $kdir/.ready && -f $VMLINUZ && $(cat "$kdir/.ready") == "$stamp" ]]; then
        return 0
    fi
    KERNEL_FROM_CACHE=0
    rm -rf "$kdir"
    mkdir -p "$KROOT"
    cp "$image" "$VMLINUZ"
    if grep -q '^CONFIG_MODULES=y' "$KERNEL_BUILD/.config"; then
        log "installing the modules of $KERNEL_BUILD (make modules_install) $(elapsed)"
        make -s -C "$KERNEL_BUILD" modules_install INSTALL_MOD_PATH="$KROOT" INSTALL_MOD_STRIP=1 \
            DEPMOD=/bin/true >"$kdir/modules_install.log" 2>&1 || {
            tail -n 20 "$kdir/modules_install.log" >&2
            die "make modules_install in $KERNEL_BUILD failed"
        }
    fi
    mkdir -p "$KROOT/lib/modules/$KVER"
    touch "$KROOT/lib/modules/$KVER/modules.builtin"
    [[ -f $KERNEL_BUILD/modules.builtin ]] && cp "$KERNEL_BUILD/modules.builtin" "$KROOT/lib/modules/$KVER/"
    depmod -b "$KROOT" "$KVER" || die "depmod on the modules of $KERNEL_BUILD failed"
    echo "$stamp" >"$kdir/.ready"
}

# Unpacks the kernel package DEB into KDIR/root and writes its modules.dep (the
# package leaves that to its postinst).
unpack_kernel() {
    local kdir=$1 deb=$2
    dpkg -x "$deb" "$KROOT"
    rm -f "$deb"
    # trixie's packages are /usr-merged (usr/lib/modules); lib -> usr/lib as on a
    # merged system, for depmod -b and the paths below.
    if [[ -d $KROOT/usr/lib/modules && ! -e $KROOT/lib ]]; then
        ln -s usr/lib "$KROOT/lib"
    fi
    [[ -f $VMLINUZ ]] || die "$KERNEL_PKG has no boot/vmlinuz-$KVER"
    [[ -d $KROOT/lib/modules/$KVER ]] || die "$KERNEL_PKG has no lib/modules/$KVER"
    depmod -b "$KROOT" "$KVER" || die "depmod on $KERNEL_PKG failed"
    touch "$kdir/.ready"
}

# A trixie kernel: bookworm's apt has neither trixie's package lists nor, on every
# point release, its archive keys, so the trixie root's apt downloads it.
fetch_trixie_kernel() {
    local kdir=$1 deb
    GUEST_CACHE=$CACHE "$HERE/qemu11.sh" install || die "building the trixie root (for $KERNEL_PKG) failed"
    rm -rf "$kdir"
    mkdir -p "$kdir/dl"
    GUEST_CACHE=$CACHE "$HERE/qemu11.sh" download "$kdir/dl" "$KERNEL_PKG" ||
        die "apt-get download $KERNEL_PKG in the trixie root failed (has it left trixie's archive? pass --kernel linux-image-6.12.NN+deb13-amd64 or update KERNEL_PKG_PINNED_TRIXIE)"
    deb=$(find "$kdir/dl" -name "${KERNEL_PKG}_*.deb" | head -n 1)
    [[ -n $deb ]] || die "apt-get download left no .deb for $KERNEL_PKG"
    unpack_kernel "$kdir" "$deb"
}

# Prints the module files (relative to lib/modules/KVER) to load, dependencies first.
module_load_order() {
    local moddir=$KROOT/lib/modules/$KVER
    local -A seen=()
    local -a order=()
    add_module_path() {
        local path=$1 dep deps
        [[ -z ${seen[$path]:-} ]] || return 0
        seen[$path]=1
        read -r -a deps < <(awk -v m="$path:" '$1 == m { $1 = ""; print }' "$moddir/modules.dep")
        for dep in "${deps[@]}"; do
            add_module_path "$dep"
        done
        order+=("$path")
    }
    local name path
    for name in "${GUEST_MODULES[@]}"; do
        # Debian's 6.1 modules are plain .ko; trixie's are .ko.xz.
        path=$(awk -F: -v name="$name" '{
                n = split($1, parts, "/"); base = parts[n]
                sub(/\.(xz|zst|gz)$/, "", base)
                if (base == name ".ko") { print $1; exit }
            }' "$moddir/modules.dep")
        if [[ -z $path ]]; then
            if grep -q "/$name.ko$" "$moddir/modules.builtin"; then
                continue # built into this kernel
            fi
            if [[ -n $KERNEL_BUILD ]]; then
                # Your kernel may leave out what another disk needs (virtio for sdhci).
                warn "module $name is not in your kernel (neither a module nor built in); not loaded"
                continue
            fi
            die "module $name is neither in modules.dep nor built into $KVER"
        fi
        add_module_path "$path"
    done
    printf '%s\n' "${order[@]}"
}

# ---------------------------------------------------------------- initramfs
# Sets INITRD. Cached by the hash of everything that goes in.
build_initramfs() {
    local fio mmc busybox key modules root lib f
    fio=$(command -v fio) || die "fio not found"
    mmc=$(command -v mmc) || die "mmc (mmc-utils) not found"
    busybox=/bin/busybox
    [[ -x $busybox ]] || die "$busybox (busybox-static) not found"
    if ldd "$busybox" >/dev/null 2>&1; then
        die "$busybox is dynamically linked: install busybox-static"
    fi
    modules=$(module_load_order)
    key=$({
        echo "format $INITRAMFS_FORMAT kernel $KERNEL_PKG"
        dpkg-query -W fio busybox-static mmc-utils 2>/dev/null
        echo "$modules"
        cat "$HERE/guest-init.sh" "$HERE/guest-bounded.sh" "$HERE/mmio-probe.c" "$HERE"/jobs/*.fio "$HERE"/jobs/*.sh
        sha256sum "$fio" "$mmc" "$busybox"
        [[ -z $MMC_TEST_KO || $MMC_TEST_KO == built-in ]] || sha256sum "$MMC_TEST_KO"
    } | sha256sum | cut -c1-16)
    INITRD=$CACHE/initramfs/initramfs-$KVER-$key.cpio
    INITRD_FROM_CACHE=1
    if [[ -f $INITRD ]]; then
        return 0
    fi
    INITRD_FROM_CACHE=0
    log "building the initramfs $(elapsed)"
    mkdir -p "$CACHE/initramfs"
    # One cached initramfs per kernel; older builds for this kernel (and those of
    # the format before the kernel was in the name) go.
    find "$CACHE/initramfs" -maxdepth 1 \( -name "initramfs-$KVER-*" -o -regex '.*/initramfs-[0-9a-f]*\.cpio' \) -delete
    root=$(mktemp -d "$CACHE/initramfs/root.XXXXXX")
    mkdir -p "$root"/{bin,sbin,usr/bin,usr/sbin,usr/lib/fio,lib64,lib/modules,proc,sys,dev,tmp,jobs,etc}
    cp "$busybox" "$root/bin/busybox"
    install -m 0755 "$HERE/guest-init.sh" "$root/init"
    install -m 0755 "$HERE/guest-bounded.sh" "$root/usr/bin/bounded"
    # mmio-probe: the guest's MMIO round trip (jobs/sdhci-mmio.sh), static.
    gcc -O2 -static -o "$root/usr/bin/mmio-probe" "$HERE/mmio-probe.c" ||
        die "cannot build guest-tests/mmio-probe.c (gcc and libc6-dev are needed)"
    # Modules, flat, and the order to insmod them in.
    : >"$root/modules.load"
    while read -r f; do
        [[ -n $f ]] || continue
        # Uncompressed: busybox's insmod hands the file to init_module as it is.
        case $f in
        *.ko.xz) xz -dc "$KROOT/lib/modules/$KVER/$f" >"$root/lib/modules/$(basename "$f" .xz)" ;;
        *.ko.zst) zstd -q -dc "$KROOT/lib/modules/$KVER/$f" >"$root/lib/modules/$(basename "$f" .zst)" ;;
        *.ko.gz) gzip -dc "$KROOT/lib/modules/$KVER/$f" >"$root/lib/modules/$(basename "$f" .gz)" ;;
        *) cp "$KROOT/lib/modules/$KVER/$f" "$root/lib/modules/" ;;
        esac || die "cannot unpack module $f"
        basename "${f%.ko*}.ko" >>"$root/modules.load"
    done <<<"$modules"
    # fio and mmc, and every shared library they load (in /usr/lib/fio: a wrapper
    # runs each with LD_LIBRARY_PATH=/usr/lib/fio).
    for f in "$fio" "$mmc"; do
        cp "$f" "$root/usr/bin/$(basename "$f").bin"
        while read -r lib; do
            [[ -n $lib ]] || continue
            cp -L "$lib" "$root/usr/lib/fio/"
        done < <(ldd "$f" | awk '$2 == "=>" && $3 ~ /^\// { print $3 }')
        printf '#!/bin/sh\nLD_LIBRARY_PATH=/usr/lib/fio exec /usr/bin/%s.bin "$@"\n' "$(basename "$f")" \
            >"$root/usr/bin/$(basename "$f")"
        chmod 0755 "$root/usr/bin/$(basename "$f")"
    done
    cp -L /lib64/ld-linux-x86-64.so.2 "$root/lib64/"
    # mmc_test (--jobs mmc-test): loaded by jobs/mmc-test.sh once the card is up.
    if [[ -n $MMC_TEST_KO && $MMC_TEST_KO != built-in ]]; then
        mkdir -p "$root/lib/modules/extra"
        cp "$MMC_TEST_KO" "$root/lib/modules/extra/mmc_test.ko"
    fi
    cp "$HERE"/jobs/*.fio "$HERE"/jobs/*.sh "$root/jobs/"
    (cd "$root" && find . -mindepth 1 | LC_ALL=C sort | cpio -o -H newc -R 0:0 --quiet) >"$INITRD.tmp"
    mv "$INITRD.tmp" "$INITRD"
    rm -rf "$root"
}

# ---------------------------------------------------------------- processes
QEMU_PID=
BACKEND_PID=
WORK=
IMAGE=
IMAGE_TMPDIR=
# True while PID is a running (not zombie) process.
alive() {
    local stat
    [[ -n $1 ]] || return 1
    stat=$(cat "/proc/$1/stat" 2>/dev/null) || return 1
    stat=${stat##*) }
    [[ ${stat:0:1} != Z ]]
}
stop_pid() {
    local pid=$1 i
    [[ -n $pid ]] || return 0
    if alive "$pid"; then
        kill -TERM "$pid" 2>/dev/null || true
        for ((i = 0; i < 50; i++)); do
            alive "$pid" || break
            sleep 0.1
        done
        alive "$pid" && kill -KILL "$pid" 2>/dev/null
    fi
    wait "$pid" 2>/dev/null || true
}
# Deleting the image can take seconds after a run that wrote a lot (the host
# file system settles the written data), so runs do it before the final timing.
remove_image() {
    [[ $KEEP == 0 && -n $IMAGE && -z $USER_IMAGE ]] || return 0
    rm -f "$IMAGE" "$IMAGE".*
    [[ -z $IMAGE_TMPDIR ]] || rmdir "$IMAGE_TMPDIR" 2>/dev/null || true
}
# shellcheck disable=SC2317 # invoked by the EXIT trap
cleanup() {
    local rc=$?
    trap - EXIT INT TERM
    [[ -z ${FAULT_PID:-} ]] || kill "$FAULT_PID" 2>/dev/null || true
    stop_pid "$QEMU_PID"
    stop_pid "$BACKEND_PID"
    if [[ -n $WORK && -d $WORK ]]; then
        if [[ $KEEP == 1 ]]; then
            warn "run directory kept: $WORK"
            [[ -z $IMAGE_TMPDIR ]] || warn "image kept: $IMAGE"
        else
            remove_image
            if [[ $rc == 0 && $JOBSET == faults ]]; then
                # The fault summary named these logs; the command log and the request
                # trace are large and only wanted after a failure.
                rm -f "${CMDLOG:-}" "${TRACE:-}"
            elif [[ $rc == 0 ]]; then
                rm -rf "$WORK"
            else
                warn "logs kept in $WORK (console.log, data.log, backend.log)"
            fi
        fi
    fi
    exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# Replaces the @NAME@ placeholders, shell-quoting each value.
expand_template() {
    local t=$1
    t=${t//@SOCK@/$(printf '%q' "$SOCK")}
    t=${t//@IMAGE@/$(printf '%q' "$IMAGE")}
    t=${t//@MODEL@/$(printf '%q' "$MODEL")}
    t=${t//@BIN@/$(printf '%q' "$BIN")}
    t=${t//@SIZE@/$(printf '%q' "$IMAGE_SIZE")}
    t=${t//@TRACE@/$(printf '%q' "$TRACE")}
    t=${t//@CONTROL@/$(printf '%q' "$CONTROL")}
    t=${t//@CMDLOG@/$(printf '%q' "$CMDLOG")}
    local opt=
    [[ -z $PCI_IDENTITY ]] || opt="--pci-identity $(printf '%q' "$PCI_IDENTITY")"
    t=${t//@PCI_IDENTITY@/$opt}
    opt=
    [[ ! -s ${FAULT_PLAN:-} ]] || opt="--fault-plan $(printf '%q' "$FAULT_PLAN")"
    t=${t//@FAULT_PLAN@/$opt}
    t=${t//@SERVE_ARGS@/$SERVE_ARGS}
    printf '%s' "$t"
}

# ---------------------------------------------------------------- faults
# The fault set's host side: once the guest starts faults-io, make every read of the
# first half of the durable region fail its data CRC for 3 s, then clear that and cut
# the card's power, all through the daemon's control socket while fio runs.
control() { "$BIN" control --socket "$CONTROL" "$@"; }
# Wait (at most the run's timeout) until the guest starts job $1.
wait_for_job() {
    local i
    for ((i = 0; i < TIMEOUT * 10; i++)); do
        grep -q "^@@GT-JOB-START $1@@" "$DATA" 2>/dev/null && return 0
        sleep 0.1
    done
    echo "the guest never started $1"
    return 1
}
fault_driver() {
    local start end
    exec >>"$WORK/control.log" 2>&1
    wait_for_job faults-io || return 1
    start=$(($(size_bytes "${GT[GT_FAULT_OFFSET]}") / 512))
    end=$((start + $(size_bytes "${GT[GT_FAULT_SIZE]}") / 1024))
    sleep 2
    echo "reads of sectors $start..$end fail their data CRC"
    control add-fault "name = \"guest test\"
direction = \"read\"
lba = { start = $start, end = $end }
effect = { kind = \"data_crc\" }" || return 1
    sleep 3
    # The rules, how often each fired and the last injections: hundreds of lines, kept
    # in faults.json for fault_summary.
    echo "rules and injections so far: faults.json"
    control faults >"$WORK/faults.json" || return 1
    control clear-faults || return 1
    echo "power cut"
    control power-cut || return 1
    # The session's statistics, while it lasts (a new session starts them afresh).
    sleep 2
    control stats >"$WORK/stats.json" || return 1
}
# A size with an optional k/m/g suffix, in bytes.
size_bytes() {
    local v=$1
    case $v in
    *k) echo $((${v%k} * 1024)) ;;
    *m) echo $((${v%m} * 1024 * 1024)) ;;
    *g) echo $((${v%g} * 1024 * 1024 * 1024)) ;;
    *) echo "$v" ;;
    esac
}
# The card set's power cut (--disk sdhci): once the guest runs faults-io (writes and
# reads, continue_on_error), cut the card's power through the control socket; the
# daemon keeps serving and the guest's MMC core must bring the card back.
power_cut_driver() {
    exec >>"$WORK/control.log" 2>&1
    wait_for_job faults-io || return 1
    sleep 2
    echo "power cut at $(date +%T.%N)"
    control power-cut || return 1
    sleep 3
    control stats >"$WORK/stats.json" || return 1
    python3 -c 'import json,sys; s=json.load(open(sys.argv[1])); print("stats after the cut:", json.dumps(s.get("transport", {})), "injections", json.dumps(s.get("faults", {}).get("injections_total")))' "$WORK/stats.json" || true
}
# Job set seed000: the daemon's statistics when the guest starts seed000-rw and
# GT_S0_RUNTIME seconds later (card time follows the wall clock), so the packing
# histogram and the card-time window are those of the run. fio itself ends later: the
# last close of the disk writes the guest's dirty pages back.
stats_driver() {
    exec >>"$WORK/control.log" 2>&1
    wait_for_job seed000-rw || return 1
    control stats >"$WORK/stats-start.json" || return 1
    sleep "${GT[GT_S0_RUNTIME]}"
    control stats >"$WORK/stats-end.json" || return 1
}
# After the run (--jobs faults): what was injected, what the daemon's driver did, what
# the guest saw, from faults.json and stats.json (the control socket), the daemon's log,
# fio's results (parse-fio.py's summary JSON) and the guest's kernel log. Prints a few
# lines; fails unless faults were injected, the daemon reset the card after the power
# cut, and the guest saw I/O errors. (parse-fio.py checks that they are EIO only and
# that faults-verify read every durable block back intact.)
fault_summary() {
    python3 - "$WORK" "$1" "$DATA" "$BACKEND_LOG" "$(($(size_bytes "${GT[GT_FAULT_SIZE]}") / 65536))" <<'PY'
import json, os, re, sys
work, summary_path, data_path, backend_path = sys.argv[1:5]
blocks = int(sys.argv[5])  # faults-prep's 64 KiB blocks, which faults-verify reads back
problems = []

def n(count, word):
    """'1 time', '2 times', '? times'."""
    if count is None:
        return f"? {word}s"
    return f"{count} {word}" + ("" if count == 1 else "s")

def load(name):
    try:
        with open(os.path.join(work, name), encoding="utf-8") as f:
            return json.load(f)
    except (OSError, ValueError):
        return None

faults, stats, summary = load("faults.json"), load("stats.json"), None
try:
    with open(summary_path, encoding="utf-8") as f:
        summary = json.load(f)
except (OSError, ValueError):
    pass

# Injected: the rule's fire count while it was active (injections_total counts every
# injection since the daemon started, the same here: the job adds one rule).
if faults is not None:
    injected = sum(int(r.get("fired", 0)) for r in faults.get("rules", []))
elif stats is not None:
    injected = int(stats["faults"]["injections_total"])
else:
    injected = None
if stats is not None:
    driver = stats.get("transport", {}).get("driver", {})
    retries, resets = driver.get("retries"), driver.get("resets")
else:
    retries = resets = None
if not injected:
    problems.append("no faults were injected")
if resets is None or resets < 1:
    problems.append("the daemon did not reset the card after the power cut")
print(f"injected:     {n(injected, 'read data CRC error')} (faults-io's durable region, "
      "for 3 s), then 1 power cut")
print(f"daemon:       its MMC driver retried {n(retries, 'time')}, re-initialised the card "
      f"{n(resets, 'time')} after the cut")

# What reached the guest: the requests the daemon failed (one warning each), fio's errors.
with open(backend_path, encoding="utf-8", errors="replace") as f:
    failed_requests = sum(1 for line in f if "data CRC error" in line)
rows = (summary or {}).get("jobs", [])
io_errors = sum(int(r.get("error", 0)) for r in rows if r.get("file") == "faults-io")
verify = [r for r in rows if r.get("file") == "faults-verify" and r.get("dir") == "read"]
with open(data_path, encoding="utf-8", errors="replace") as f:
    text = f.read()
dmesg = text.split("@@GT-DMESG-BEGIN@@", 1)[-1].split("@@GT-DMESG-END@@", 1)[0] \
    if "@@GT-DMESG-BEGIN@@" in text else ""
kernel_io = sum(1 for line in dmesg.splitlines() if re.search(r"I/O error", line))
if io_errors == 0:
    problems.append("the guest saw no I/O errors")
print(f"guest saw:    {n(io_errors, 'failed read')} (fio's EIO in faults-io; the daemon "
      f"failed {n(failed_requests, 'request')} with a data CRC error; the kernel logged "
      f"{n(kernel_io, 'I/O error line')}, rate-limited)")
# parse-fio.py decides (verify_fatal: the first bad or unreadable block stops fio); this
# line only reports it.
verify_failed = any(f.startswith("faults-verify.fio:") for f in (summary or {}).get("failures", []))
if verify:
    v = verify[0]
    ok = not verify_failed and not v.get("error") and v.get("ios") == blocks
    state = "intact" if ok else "NOT all read back intact (parse-fio.py's FAILED lines above)"
    print(f"durable data: faults-verify read {v.get('ios')} of {blocks} blocks back after "
          f"the cut: {state}")
else:
    print("durable data: faults-verify has no results")
for p in problems:
    print(f"problem:      {p}")
sys.exit(1 if problems else 0)
PY
}

# ---------------------------------------------------------------- main
mkdir -p "$CACHE" || die "cannot create the cache directory $CACHE"
CACHE=$(cd "$CACHE" && pwd)
install_packages
# QEMU_CMD: the command that runs QEMU, its arguments follow.
if [[ $QEMU11 == 1 ]]; then
    # QEMU 11.1 from the trixie root, chrooted with the cache (kernel, initramfs,
    # run directories: sockets, images, logs) and the image directory bound at
    # their own paths.
    if [[ $INSTALL == 1 ]]; then
        step_start
        GUEST_CACHE=$CACHE "$HERE/qemu11.sh" install || die "building the QEMU 11.1 root failed"
        ((SECONDS - STEP_T0 < 5)) || log "QEMU 11.1 root built in $(step_took) $(elapsed)"
    fi
    GUEST_CACHE=$CACHE "$HERE/qemu11.sh" check ||
        die "no QEMU 11.1 root under $CACHE/qemu11 (run guest-tests/qemu11.sh install, or drop --no-install)"
    QEMU_CMD=(env GUEST_CACHE="$CACHE" "$HERE/qemu11.sh" run --bind "$CACHE")
    [[ -z $IMAGE_DIR ]] || QEMU_CMD+=(--bind "$IMAGE_DIR")
    [[ -z $USER_IMAGE ]] || QEMU_CMD+=(--bind "$(dirname "$USER_IMAGE")")
    # --socket: the directory of the user's socket.
    [[ -z $USER_SOCKET ]] || QEMU_CMD+=(--bind "$(dirname "$USER_SOCKET")")
    QEMU_CMD+=(--)
else
    : "${QEMU:=qemu-system-x86_64}"
    command -v "$QEMU" >/dev/null || die "$QEMU not found"
    QEMU_CMD=("$QEMU")
fi
command -v python3 >/dev/null || die "python3 not found"
log "QEMU: $("${QEMU_CMD[@]}" --version | head -n 1) $(elapsed)"

if [[ $BACKEND == emmc && ( $BACKEND_CMD == *@BIN@* || $IMAGE_CMD == *@BIN@* ) ]]; then
    if [[ $BUILD == 1 ]]; then
        command -v cargo >/dev/null || die "cargo not found (or pass --no-build --bin PATH)"
        # cargo prints what it compiles; a build from scratch takes minutes.
        log "building vhost-user-emmc: cargo build --release (its progress follows) $(elapsed)"
        step_start
        cargo build --release --manifest-path "$REPO/Cargo.toml" || die "cargo build --release failed"
        log "build done in $(step_took) $(elapsed)"
    fi
    [[ -x $BIN ]] || die "no vhost-user-emmc binary at $BIN"
    if ! "$BIN" serve --help >/dev/null 2>&1; then
        die "$BIN has no 'serve' subcommand yet; try --backend qsd to test the harness"
    fi
fi

step_start
if [[ -n $KERNEL_BUILD ]]; then fetch_kernel_build; else fetch_kernel; fi
if [[ $KERNEL_FROM_CACHE == 1 ]]; then
    log "kernel: $KERNEL_PKG (cached) $(elapsed)"
elif [[ -n $KERNEL_BUILD ]]; then
    log "kernel: $KERNEL_PKG (image copied, modules installed in $(step_took)) $(elapsed)"
else
    log "kernel: $KERNEL_PKG (fetched and unpacked in $(step_took)) $(elapsed)"
fi
# --jobs mmc-test: mmc_test.ko for this kernel (cached; "built-in" when the kernel has it).
MMC_TEST_KO=
if [[ $JOBSET == mmc-test ]]; then
    step_start
    mkdir -p "$CACHE/mmc-test"
    if [[ -n $KERNEL_BUILD ]]; then
        MMC_TEST_KO=$(GUEST_CACHE=$CACHE "$HERE/mmc-test-build.sh" --kernel-build "$KERNEL_BUILD" \
            --out "$CACHE/mmc-test/mmc_test-build.ko") || die "building mmc_test.ko for $KERNEL_BUILD failed"
    else
        [[ $INSTALL == 1 || -n $(find "$CACHE/mmc-test" -name mmc_test.ko -path "*/$KVER-*" 2>/dev/null) ]] ||
            die "mmc_test.ko for $KVER is not in $CACHE/mmc-test and --no-install given"
        MMC_TEST_KO=$(GUEST_CACHE=$CACHE "$HERE/mmc-test-build.sh" --vmlinuz "$VMLINUZ" \
            --out "$CACHE/mmc-test/mmc_test-$KVER.ko") || die "building mmc_test.ko for $KVER failed"
    fi
    log "mmc_test: $MMC_TEST_KO ($(step_took)) $(elapsed)"
fi
step_start
build_initramfs
if [[ $INITRD_FROM_CACHE == 1 ]]; then
    log "initramfs: $INITRD ($(du -h "$INITRD" | cut -f1), cached) $(elapsed)"
else
    log "initramfs: $INITRD ($(du -h "$INITRD" | cut -f1), built in $(step_took)) $(elapsed)"
fi

mkdir -p "$CACHE/runs"
WORK=$(mktemp -d "$CACHE/runs/run.XXXXXX")
# The daemon's request trace: each request's modelled latency, the floor for fio's.
TRACE=$WORK/serve.trace
SOCK=$WORK/vhost.sock
# The daemon's control socket (faults, power cuts, statistics).
CONTROL=$WORK/control.sock
# --disk sdhci: every MMC command the guest sent, and the fault plan of the card set.
CMDLOG=$WORK/cmd.log
FAULT_PLAN=
if [[ $JOBSET == card ]]; then
    FAULT_PLAN=$WORK/faults.toml
    crc_start=$(($(size_bytes "${GT[GT_CRC_OFFSET]}") / 512))
    crc_end=$((crc_start + $(size_bytes "${GT[GT_CRC_SIZE]}") / 512))
    cat >"$FAULT_PLAN" <<EOF
# run-guest-test.sh --jobs card: in card-crc.fio's region, every 25th write's data
# CRC fails, six times. Sparse on purpose: after an error Linux 6.1 writes the
# request again one sector at a time, and a denser rule (every 7th) fails one of
# those single-sector writes often enough to exhaust mmc_block's retries (EIO).
[[rule]]
name = "write data CRC in card-crc's region"
direction = "write"
lba = { start = $crc_start, end = $crc_end }
every = 25
count = 6
effect = { kind = "data_crc" }
EOF
fi
IMAGE=$WORK/disk.img
if [[ $BACKEND == user ]]; then
    # --socket: the user's daemon and image; this run neither creates nor removes one.
    SOCK=$USER_SOCKET
    IMAGE=
elif [[ -n $USER_IMAGE ]]; then
    IMAGE=$USER_IMAGE
elif [[ -n $IMAGE_DIR ]]; then
    IMAGE_TMPDIR=$(mktemp -d "$IMAGE_DIR/guest-test-image.XXXXXX") || die "cannot create a directory in $IMAGE_DIR"
    IMAGE=$IMAGE_TMPDIR/disk.img
fi
CONSOLE=$WORK/console.log
DATA=$WORK/data.log
BACKEND_LOG=$WORK/backend.log
# sun_path holds 107 bytes and a NUL.
((${#SOCK} < 108)) || die "socket path too long for a unix socket ($SOCK): use a shorter --cache"

if [[ $BACKEND == user ]]; then
    log "your daemon's socket: $SOCK ($([[ $DISK == sdhci ]] && echo 'serve --transport sdhci, vfio-user' || echo 'serve, vhost-user-blk')); no image or daemon of this run's own"
elif [[ -n $USER_IMAGE && -e $USER_IMAGE ]]; then
    log "image: $USER_IMAGE as it is (--image; kept after the run)"
else
    cmd=$(expand_template "$IMAGE_CMD")
    log "image: $cmd"
    bash -c "$cmd" >"$WORK/image.log" 2>&1 || {
        cat "$WORK/image.log" >&2
        die "creating the image failed"
    }
fi

: >"$BACKEND_LOG"
if [[ $BACKEND != none && $BACKEND != user ]]; then
    cmd=$(expand_template "$BACKEND_CMD")
    log "backend: $cmd"
    bash -c "exec $cmd" >"$BACKEND_LOG" 2>&1 </dev/null &
    BACKEND_PID=$!
    for ((i = 0; i < 300; i++)); do
        [[ -S $SOCK ]] && break
        alive "$BACKEND_PID" || break
        sleep 0.1
    done
    if ! [[ -S $SOCK ]] || ! alive "$BACKEND_PID"; then
        cat "$BACKEND_LOG" >&2
        warn "FAIL: the backend did not come up (no socket at $SOCK after 30 s, or it exited)"
        exit 1
    fi
fi

# iomem=relaxed: jobs/sdhci-mmio.sh maps the controller's BAR0 while sdhci-pci holds it
# (Debian's kernels refuse that by default, CONFIG_IO_STRICT_DEVMEM).
append="console=ttyS0 quiet panic=-1 iomem=relaxed"
for k in "${!GT[@]}"; do append+=" $k=${GT[$k]}"; done
log "guest: ${GT[GT_JOBS]} (set $JOBSET), timeout ${TIMEOUT} s"
qemu=("${QEMU_CMD[@]}"
    -accel tcg -machine "pc,memory-backend=mem" -cpu max -smp "$GUEST_SMP" -m "$GUEST_MEM"
    -object "memory-backend-memfd,id=mem,size=$GUEST_MEM,share=on"
    -nodefaults -no-user-config -display none -no-reboot
    -kernel "$VMLINUZ" -initrd "$INITRD" -append "$append"
    -serial "file:$CONSOLE" -serial "file:$DATA")
case $DISK in
vhost-user-blk)
    qemu+=(-chardev "socket,id=c0,path=$SOCK" -device "vhost-user-blk-pci,chardev=c0,num-queues=1")
    ;;
qemu-sdhci)
    # SDHCI 3.00 (the default, 2, is what QEMU calls SD spec 2.00) and the card on
    # its SD bus; the image is the user area (no boot or RPMB partitions).
    qemu+=(-drive "if=none,id=card,file=$IMAGE,format=raw"
        -device "sdhci-pci,sd-spec-version=3" -device "emmc,drive=card,bus=sd-bus")
    ;;
virtio-mmc)
    # The three queues and the 48-byte struct virtio_mmc_config of
    # docs/virtio-mmc.md; the device ID lives only here. QEMU traces each
    # vhost-user message it sends and receives, to show the session.
    qemu+=(-chardev "socket,id=mmc0,path=$SOCK"
        -device "vhost-user-test-device-pci,chardev=mmc0,virtio-id=$VIRTIO_ID,num_vqs=3,config_size=48"
        -trace vhost_user_write -trace vhost_user_read)
    ;;
sdhci)
    # The daemon's controller as a PCI function; guest RAM is the shared memfd above,
    # which the daemon maps for the controller's DMA.
    qemu+=(-device "{\"driver\":\"vfio-user-pci\",\"socket\":{\"type\":\"unix\",\"path\":\"$SOCK\"}}")
    ;;
esac
log "QEMU: ${qemu[*]}"
: >"$CONSOLE"
# The timeout command is a second guard: it stops QEMU even if this script is
# killed without running its trap.
timeout -k 10 "$((TIMEOUT + 30))" "${qemu[@]}" >"$WORK/qemu.log" 2>&1 </dev/null &
QEMU_PID=$!
TAIL_PID=
if [[ $QUIET == 0 ]]; then
    # Stops by itself when QEMU exits.
    tail -n +1 -f --pid="$QEMU_PID" "$CONSOLE" | tr -d '\r' &
    TAIL_PID=$!
fi

failures=()
FAULT_PID=
if [[ $JOBSET == faults ]]; then
    fault_driver &
    FAULT_PID=$!
elif [[ $JOBSET == card ]]; then
    power_cut_driver &
    FAULT_PID=$!
elif [[ $JOBSET == seed000 ]]; then
    stats_driver &
    FAULT_PID=$!
fi
boot_start=$SECONDS
backend_gone_at=
while alive "$QEMU_PID"; do
    if [[ $BACKEND != none && $BACKEND != user && -z $backend_gone_at ]] && ! alive "$BACKEND_PID"; then
        backend_gone_at=$SECONDS
    fi
    # A backend may exit when QEMU disconnects at the end; give QEMU a moment to
    # finish, and judge from the end marker below.
    if [[ -n $backend_gone_at ]] && ((SECONDS - backend_gone_at > 5)); then
        failures+=("the backend exited while the guest was running")
        stop_pid "$QEMU_PID"
        break
    fi
    if ((SECONDS - boot_start > TIMEOUT)); then
        failures+=("timeout: the guest did not finish within $TIMEOUT s$([[ $BACKEND != user ]] || echo " (is your daemon serving another VM, or stopped?)")")
        stop_pid "$QEMU_PID"
        break
    fi
    sleep 0.5
done
qemu_rc=0
wait "$QEMU_PID" 2>/dev/null || qemu_rc=$?
QEMU_PID=
[[ -z $TAIL_PID ]] || wait "$TAIL_PID" 2>/dev/null || true
guest_time=$((SECONDS - boot_start))
if [[ ${#failures[@]} -gt 0 ]]; then
    log "QEMU stopped after $guest_time s"
else
    log "QEMU exited with status $qemu_rc after $guest_time s"
fi
if [[ $qemu_rc != 0 && ${#failures[@]} == 0 ]]; then
    failures+=("QEMU exited with status $qemu_rc")
    sed 's/^/qemu: /' "$WORK/qemu.log" >&2
    [[ $BACKEND != user ]] ||
        failures+=("QEMU could not use $SOCK: is the daemon running, is the socket $([[ $DISK == sdhci ]] && echo "serve --transport sdhci's (vfio-user)" || echo "serve's vhost-user-blk one (no --transport)") as --transport says, and is it not serving another VM?")
fi

if [[ -n $FAULT_PID ]]; then
    fault_rc=0
    wait "$FAULT_PID" 2>/dev/null || fault_rc=$?
    FAULT_PID=
    # The faults set's control output is hundreds of lines: it stays in control.log and
    # faults.json (fault_summary below), shown only when the driver failed.
    if [[ $JOBSET != faults ]]; then
        sed 's/^/control: /' "$WORK/control.log"
    elif [[ $fault_rc != 0 ]]; then
        echo "--- control.log (the fault driver; last 30 lines)"
        tail -n 30 "$WORK/control.log" | sed 's/^/control: /'
    fi
    if [[ $fault_rc != 0 ]]; then
        if [[ $JOBSET == seed000 ]]; then
            failures+=("the daemon's statistics could not be read (control.log above)")
        else
            failures+=("the fault driver could not inject its faults (control.log above)")
        fi
    fi
fi

# The backend: alive is fine (we stop it now); exited is fine only if the guest
# got to the end and the backend's status was 0.
reached_end=0
grep -q '^@@GT-END@@' "$DATA" 2>/dev/null && reached_end=1
if [[ $BACKEND == none || $BACKEND == user ]]; then
    :
elif alive "$BACKEND_PID"; then
    stop_pid "$BACKEND_PID"
else
    backend_rc=0
    wait "$BACKEND_PID" 2>/dev/null || backend_rc=$?
    if [[ $backend_rc != 0 ]]; then
        failures+=("the backend died with status $backend_rc")
    elif [[ $reached_end == 0 ]]; then
        failures+=("the backend exited before the guest finished")
    fi
fi
BACKEND_PID=
if [[ $DISK == sdhci && $BACKEND != user ]]; then
    # The card's registers as the daemon left them in the image (the guest has shut
    # down, the daemon has written its cache back): sdhci-checks.py compares the
    # guest's EXT_CSD with these and with the model's.
    "$BIN" inspect --image "$IMAGE" >"$WORK/inspect-after.txt" 2>&1 ||
        failures+=("vhost-user-emmc inspect --image failed")
fi
remove_image
if grep -qiE 'panicked at|segmentation fault|core dumped' "$BACKEND_LOG"; then
    failures+=("the backend log shows a crash (see below)")
fi
# The daemon's banner is not worth showing. The faults set's daemon warns once per failed
# request and about the power cut: what the run injected, counted by fault_summary and
# left out here (all of it stays in backend.log). Anything else the daemon logs is shown.
backend_expected='^$|^vhost-user-emmc: serving '
[[ $JOBSET != faults ]] ||
    backend_expected+='|MMC: CMD(17|18): data CRC error$|fault: power loss at|control: sudden power loss|mmcblk: the card does not answer .*re-initialising it$'
backend_shown=$(grep -vE "$backend_expected" "$BACKEND_LOG" || true)
if [[ $BACKEND != none && $BACKEND != user ]] && [[ ${#failures[@]} -gt 0 || -n $backend_shown ]]; then
    left_out=$(grep -cE "$backend_expected" "$BACKEND_LOG" || true)
    if [[ $JOBSET == faults ]]; then
        echo "--- backend log (last 20 lines, without $left_out expected lines: the injected faults; all of it in $BACKEND_LOG)"
    else
        echo "--- backend log (last 20 lines)"
    fi
    [[ -z $backend_shown ]] || tail -n 20 <<<"$backend_shown"
fi

if [[ $DISK == sdhci && $BACKEND != user ]]; then
    echo
    log "the card through the guest's MMC stack (sdhci-checks.py)"
    checks_rc=0
    "$BIN" inspect --model "$MODEL" >"$WORK/inspect-model.txt" 2>&1 || true
    python3 "$HERE/sdhci-checks.py" --jobs "$JOBSET" --data "$DATA" --cmd-log "$CMDLOG" \
        --inspect-model "$WORK/inspect-model.txt" --inspect-after "$WORK/inspect-after.txt" \
        --gt "$(for k in "${!GT[@]}"; do printf '%s=%s ' "$k" "${GT[$k]}"; done)" \
        --summary-json "$WORK/sdhci-checks.json" || checks_rc=$?
    [[ $checks_rc == 0 ]] || failures+=("the card checks failed (sdhci-checks.py above)")
    if [[ -n $SAVE_DIR ]]; then
        mkdir -p "$SAVE_DIR"
        cp "$WORK/sdhci-checks.json" "$CMDLOG" "$SAVE_DIR/" 2>/dev/null || true
    fi
fi
if [[ $DISK == virtio-mmc ]]; then
    # The session: QEMU's trace of the vhost-user messages, and the daemon's log.
    echo
    log "vhost-user session (QEMU's trace, the daemon's log)"
    session_rc=0
    python3 "$HERE/vhost-user-trace.py" "$WORK/qemu.log" || session_rc=$?
    [[ $session_rc == 0 ]] || failures+=("QEMU and the daemon did not negotiate (QEMU's trace above)")
    grep -E 'frontend (attached|detached)|virtio-mmc' "$BACKEND_LOG" | sed 's/^/daemon: /'
    grep -q 'frontend attached' "$BACKEND_LOG" ||
        failures+=("the daemon's log shows no frontend session")
fi

echo
case $BACKEND in
none) log "results ($DISK, set $JOBSET)" ;;
user) log "results ($DISK, your daemon on $SOCK, set $JOBSET)" ;;
*) log "results ($DISK, $BACKEND backend, model $MODEL, set $JOBSET)" ;;
esac
expect_errors=
[[ $JOBSET != faults ]] || expect_errors=faults-io
# The card set's power cut: the guest may recover (mmc_blk resets the card) or pass
# EIO up; either is fine, other errors are not.
allow_errors=
[[ $JOBSET != card ]] || allow_errors=faults-io
# QEMU's eMMC is known to fail writes and CMD8 through the ioctl: its mmc0 and
# mmcblk0 errors are what the sdhci jobs report, not failures of the run.
dmesg_allow=
[[ $DISK != qemu-sdhci ]] || dmesg_allow='mmc0|mmcblk0'
# jobs/mmc-utils.sh writes to the boot partition it has just write-protected: the
# write must fail, and the kernel says so.
[[ $JOBSET != mmc-utils ]] || dmesg_allow='I/O error, dev mmcblk0boot0, sector 0 op 0x1:\(WRITE\)'
fio_jobs=$(IFS=,; echo "${FIO_JOBS[*]}")
sh_jobs=$(IFS=,; echo "${SH_JOBS[*]}")
parse=(python3 "$HERE/parse-fio.py" "$DATA" --jobs "$fio_jobs" --sh-jobs "$sh_jobs"
    --dmesg-allow "$dmesg_allow"
    --expect-errors "$expect_errors" --allow-errors "$allow_errors"
    --expect-min-write-lat-us "$EXPECT_WRITE_US" --expect-min-read-lat-us "$EXPECT_READ_US"
    --summary-json "${SUMMARY_JSON:-$WORK/summary.json}")
[[ -s $TRACE ]] && parse+=(--model-trace "$TRACE")
parse_rc=0
"${parse[@]}" || parse_rc=$?
if [[ -n $SAVE_DIR ]]; then
    mkdir -p "$SAVE_DIR"
    cp "$DATA" "$SAVE_DIR/data.log"
    tr -d '\r' <"$CONSOLE" >"$SAVE_DIR/console.log"
    [[ ! -f $TRACE ]] || cp "$TRACE" "$SAVE_DIR/serve.trace"
    [[ ! -f $CMDLOG ]] || cp "$CMDLOG" "$SAVE_DIR/cmd.log"
    # The daemon's log: fidelity.py reads its pacing summary (the `session:` line).
    [[ ! -s $BACKEND_LOG ]] || cp "$BACKEND_LOG" "$SAVE_DIR/backend.log"
    for f in stats-start.json stats-end.json; do
        [[ ! -f $WORK/$f ]] || cp "$WORK/$f" "$SAVE_DIR/$f"
    done
    log "saved data.log, console.log$([[ -f $TRACE ]] && echo ', serve.trace')$([[ -s $BACKEND_LOG ]] && echo ', backend.log') in $SAVE_DIR"
fi
if [[ $JOBSET == faults ]]; then
    echo
    log "faults (full output kept in $WORK: control.log and faults.json from the control socket, stats.json, backend.log, console.log, data.log)"
    summary_rc=0
    fault_summary "${SUMMARY_JSON:-$WORK/summary.json}" || summary_rc=$?
    [[ $summary_rc == 0 ]] || failures+=("the faults were not injected, or did not reach the guest (faults summary above)")
    if [[ $parse_rc == 0 && ${#failures[@]} == 0 ]]; then
        echo "faults: PASS"
    else
        echo "faults: FAIL (why: below)"
    fi
fi
if [[ $JOBSET == mmc-test ]]; then
    # Linux's mmc_test: the per-case table; on the daemon's card every case must do at
    # least as well as guest-tests/mmc-test-expected.txt says (QEMU's card is reported).
    echo
    log "mmc_test (guest-tests/mmc-test-table.py)"
    table=(python3 "$HERE/mmc-test-table.py" "$DATA" --markdown "$WORK/mmc-test.md"
        --json "$WORK/mmc-test.json" --model "$MODEL")
    if [[ $DISK == sdhci ]]; then
        table+=(--expect "$HERE/mmc-test-expected.txt"
            --title "mmc_test on serve --transport sdhci, model $MODEL, $KVER")
    else
        table+=(--title "mmc_test on QEMU's sdhci-pci + emmc, $KVER")
    fi
    table_rc=0
    "${table[@]}" || table_rc=$?
    if [[ $table_rc != 0 ]]; then
        failures+=("mmc_test: $([[ $DISK == sdhci ]] && echo 'a case did worse than guest-tests/mmc-test-expected.txt says' || echo 'the job did not run') (table above)")
    fi
    if [[ -n $SAVE_DIR ]]; then
        cp "$WORK/mmc-test.md" "$WORK/mmc-test.json" "$SAVE_DIR/" 2>/dev/null || true
    fi
fi
if [[ $JOBSET == attach ]]; then
    echo
    attach_result=$(tr -d '\r' <"$DATA" | grep -a '^RESULT ' | tail -n 1 | sed 's/^RESULT //' || true)
    attach_ran=1
    if [[ -z $attach_result ]]; then
        attach_ran=0
        attach_result="FAIL: the guest did not get to run the check (see below)"
    fi
    [[ $attach_result == ok:* ]] || failures+=("the check of your daemon's disk failed")
    attach_detail=${attach_result#ok: }
    attach_detail=${attach_detail#FAIL: }
    if [[ $parse_rc == 0 && ${#failures[@]} == 0 ]]; then
        attach_result="PASS: $attach_detail"
    else
        attach_result="FAIL: $attach_detail"
    fi
    log "your daemon on $SOCK ($([[ $DISK == sdhci ]] && echo 'sdhci, vfio-user' || echo 'blk, vhost-user-blk')): $attach_result"
    if [[ -S $SOCK ]]; then
        if [[ $attach_ran == 0 ]]; then
            echo "its socket is still there; this run neither started nor stopped the daemon"
        elif [[ ${GT[GT_ATTACH_WRITE]} == 0 ]]; then
            echo "its socket is still there; this run neither started nor stopped the daemon (the guest only read)"
        else
            echo "its socket is still there; this run neither started nor stopped the daemon (the guest's test writes went through it, then the original data)"
        fi
    else
        echo "its socket is gone (has the daemon exited?); this run did not start or stop the daemon"
    fi
fi

echo
if [[ $parse_rc != 0 || ${#failures[@]} -gt 0 ]]; then
    for f in "${failures[@]}"; do echo "FAIL: $f"; done
    [[ $parse_rc == 0 ]] || echo "FAIL: fio checks failed (above)"
    if [[ $reached_end == 0 ]]; then
        echo "--- guest console (last 30 lines)"
        tr -d '\r' <"$CONSOLE" | tail -n 30
    fi
    log "guest test FAILED: $((SECONDS - T0)) s in all, of which the guest $guest_time s"
    echo "guest-test: 0 passed, 1 failed"
    exit 1
fi
log "guest test passed: $((SECONDS - T0)) s in all, of which the guest $guest_time s"
echo "guest-test: 1 passed, 0 failed"
exit 0
