# mmc-utils against the card, in the two boots of guest-tests/mmc-utils.sh.
#
# GT_MMCU_BOOT=1 (the first; RPMB is jobs/card-rpmb.sh, run before this one): status,
# boot partition write protection (power-on, until the next power cycle), the boot
# partition enabled for boot, the cache off and on, BKOPS enabled, a general purpose
# partition and an enhanced user area (one-time partitioning: in effect only after the
# daemon's next power cycle, which guest-tests/mmc-utils.sh makes between the boots),
# sanitize.
# GT_MMCU_BOOT=2 (the daemon stopped and started on the same image since): the
# partitioning in effect (/dev/mmcblk0gp0, a smaller user area), power-on write
# protection gone, the one-time and non-volatile settings and the RPMB counter kept.
#
# Each step prints the command's output and, where it matters, EXT_CSD afterwards as a
# fresh CMD8 read through debugfs, in lines the host parses
# (guest-tests/mmc-utils-checks.py):
#   MMCU-STEP <name> rc=<rc>
#   MMCU-EXTCSD <name> <1024 hex digits>
#   MMCU-SIZE <user|gp0..gp3> <sectors>
# Fails (exit 1) only when it cannot run at all; the host judges the results.
# shellcheck shell=sh
dev=${GT_DEV:-/dev/mmcblk0}
b=${GT_BOUND:-60}
mkdir -p /sys/kernel/debug
mount -t debugfs debugfs /sys/kernel/debug 2>/dev/null || true
extcsd_file=$(find /sys/kernel/debug/mmc0/ -path '*/mmc0:*/ext_csd' 2>/dev/null | head -n 1)
[ -n "$extcsd_file" ] || {
    echo "no debugfs ext_csd"
    exit 1
}
extcsd() {
    echo "MMCU-EXTCSD $1 $(bounded "$b" cat "$extcsd_file" | grep -v '^bounded:' | tr -d ' \n')"
}
step() {
    name=$1
    shift
    echo "+ $*"
    bounded "$b" "$@" >/tmp/step.out 2>&1
    rc=$?
    grep -v '^bounded:' /tmp/step.out
    echo "MMCU-STEP $name rc=$rc"
}
# A 4 KiB direct write to a block device: MMCU-STEP <name> rc=0 when it went through.
write4k() {
    name=$1
    echo "+ dd of=$2 (4 KiB, O_DIRECT)"
    bounded "$b" dd if=/dev/zero of="$2" bs=4096 count=1 oflag=direct conv=fsync >/tmp/dd.out 2>&1
    rc=$?
    grep -v '^bounded:' /tmp/dd.out | tail -n 2
    echo "MMCU-STEP $name rc=$rc"
}

echo "MMCU-SIZE user $(cat "/sys/class/block/${dev##*/}/size")"
echo 0 >/sys/block/mmcblk0boot0/force_ro
echo 0 >/sys/block/mmcblk0boot1/force_ro

if [ "${GT_MMCU_BOOT:-1}" = 2 ]; then
    for p in gp0 gp1 gp2 gp3; do
        [ -e "/sys/class/block/mmcblk0$p/size" ] &&
            echo "MMCU-SIZE $p $(cat "/sys/class/block/mmcblk0$p/size")"
    done
    ls -l /dev/mmcblk0*
    step status mmc status get "$dev"
    step wp-get mmc writeprotect boot get "$dev"
    write4k write-boot0 /dev/mmcblk0boot0
    step rpmb-counter mmc rpmb read-counter /dev/mmcblk0rpmb
    extcsd after
    exit 0
fi

step status mmc status get "$dev"
extcsd start

step wp-get mmc writeprotect boot get "$dev"
# Power-on protection of boot partition 0 (area 1) only: mmcblk0boot0 refuses
# writes until the next power cycle, mmcblk0boot1 takes them.
step wp-set mmc writeprotect boot set "$dev" 0
step wp-get-after mmc writeprotect boot get "$dev"
extcsd wp-set
write4k write-boot0 /dev/mmcblk0boot0
write4k write-boot1 /dev/mmcblk0boot1

# Boot from boot partition 1 with boot acknowledge (PARTITION_CONFIG 0x48).
step bootpart mmc bootpart enable 1 1 "$dev"
extcsd bootpart

step cache-off mmc cache disable "$dev"
extcsd cache-off
step cache-on mmc cache enable "$dev"
extcsd cache-on

# mmc-utils names it bkops_en; manual (MANUAL_EN) is eMMC 4.5's one-time BKOPS_EN bit 0.
step bkops mmc bkops_en manual "$dev"
extcsd bkops

# One-time partitioning: GP1 of 8 MiB (-c: more settings follow), then an enhanced
# user area of 4 MiB at 0, which completes it (-y: PARTITION_SETTING_COMPLETED).
step gp-create mmc gp create -c 8192 1 0 0 "$dev"
step enh-area mmc enh_area set -y 0 4096 "$dev"
extcsd partitioning

step sanitize mmc sanitize "$dev"
step status-end mmc status get "$dev"
extcsd end
exit 0
