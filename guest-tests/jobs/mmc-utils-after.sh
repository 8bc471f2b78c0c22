# mmc-utils against the card, second boot: the daemon has been stopped and started on
# the same image since jobs/mmc-utils.sh ran (a power cycle). The partitioning of the
# first boot is in effect now (/dev/mmcblk0gp0, a smaller user area), power-on write
# protection is gone, the one-time and non-volatile settings and the RPMB counter
# remain. The same MMCU- lines as jobs/mmc-utils.sh.
# shellcheck shell=sh
dev=${GT_DEV:-/dev/mmcblk0}
b=${GT_BOUND:-60}
mkdir -p /sys/kernel/debug
mount -t debugfs debugfs /sys/kernel/debug 2>/dev/null || true
extcsd_file=$(find /sys/kernel/debug/mmc0/ -path '*/mmc0:*/ext_csd' 2>/dev/null | head -n 1)
step() {
    name=$1
    shift
    echo "+ $*"
    bounded "$b" "$@" >/tmp/step.out 2>&1
    rc=$?
    grep -v '^bounded:' /tmp/step.out
    echo "MMCU-STEP $name rc=$rc"
}
echo "MMCU-SIZE user $(cat /sys/class/block/mmcblk0/size)"
for p in gp0 gp1 gp2 gp3; do
    [ -e "/sys/class/block/mmcblk0$p/size" ] &&
        echo "MMCU-SIZE $p $(cat "/sys/class/block/mmcblk0$p/size")"
done
ls -l /dev/mmcblk0*
step status mmc status get "$dev"
step wp-get mmc writeprotect boot get "$dev"
echo 0 >/sys/block/mmcblk0boot0/force_ro
echo "+ dd of=/dev/mmcblk0boot0 (4 KiB, O_DIRECT)"
bounded "$b" dd if=/dev/zero of=/dev/mmcblk0boot0 bs=4096 count=1 oflag=direct conv=fsync >/tmp/dd.out 2>&1
echo "MMCU-STEP write-boot0 rc=$?"
step rpmb-counter mmc rpmb read-counter /dev/mmcblk0rpmb
echo "MMCU-EXTCSD after $(bounded "$b" cat "$extcsd_file" | grep -v '^bounded:' | tr -d ' \n')"
exit 0
