# mmc-utils' `mmc extcsd read` on the card (--jobs sdhci): CMD8 through the
# MMC_IOC_CMD ioctl. Prints the first lines of its output and how it ended; a
# failure is reported, not fatal (QEMU's eMMC is known to fail it).
# shellcheck shell=sh
dev=${GT_DEV:-/dev/mmcblk0}
bounded "${GT_BOUND:-30}" mmc extcsd read "$dev" >/tmp/extcsd.out 2>&1
rc=$?
lines=$(grep -c '' /tmp/extcsd.out)
head -n 40 /tmp/extcsd.out
[ "$lines" -le 41 ] || echo "... ($lines lines)"
echo "kernel log (mmc, last lines):"
dmesg | grep -E 'mmc[0-9]|mmcblk|sdhci|ioctl' | grep -v 'GT_' | tail -n 5 | sed 's/^/  /'
if [ "$rc" = 0 ]; then
    echo "EXTCSD-RESULT: read"
elif [ "$rc" = 124 ]; then
    echo "EXTCSD-RESULT: hung (no answer within ${GT_BOUND:-30} s)"
else
    echo "EXTCSD-RESULT: failed (mmc exit status $rc)"
fi
exit 0
