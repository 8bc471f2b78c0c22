# The card's EXT_CSD as the guest reads it (--jobs card), twice: the raw 512 bytes
# from the MMC core's debugfs file (a fresh CMD8, printed as hex), and mmc-utils'
# `mmc extcsd read` (CMD8 through the MMC_IOC_CMD ioctl). The host compares both with
# `vhost-user-emmc inspect` (sdhci-checks.py). Fails when either read fails.
# shellcheck shell=sh
dev=${GT_DEV:-/dev/mmcblk0}
mkdir -p /sys/kernel/debug
mount -t debugfs debugfs /sys/kernel/debug 2>/dev/null || true
rc=0
f=$(find /sys/kernel/debug/mmc0/ -path '*/mmc0:*/ext_csd' 2>/dev/null | head -n 1)
if [ -n "$f" ] && bounded "${GT_BOUND:-30}" cat "$f" >/tmp/ext_csd.hex; then
    echo "EXTCSD-HEX: $(grep -v '^bounded:' /tmp/ext_csd.hex | tr -d ' \n')"
else
    echo "no debugfs ext_csd ($f)"
    rc=1
fi
bounded "${GT_BOUND:-30}" mmc extcsd read "$dev" >/tmp/extcsd.out 2>&1 || rc=1
echo "MMC-EXTCSD-BEGIN"
cat /tmp/extcsd.out
echo "MMC-EXTCSD-END"
exit "$rc"
