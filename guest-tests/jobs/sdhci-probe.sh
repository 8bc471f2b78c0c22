# What the guest sees of an SDHCI controller on PCI and its eMMC (--jobs sdhci):
# the kernel's messages, the block devices, the card's registers as the MMC core
# read them, and the bus settings it chose. Fails only when there is no card.
# shellcheck shell=sh
dev=${GT_DEV:-/dev/mmcblk0}
echo "kernel log (mmc, sdhci):"
dmesg | grep -E 'mmc[0-9]|mmcblk|sdhci' | grep -v 'GT_' | sed 's/^/  /'
echo "block devices:"
# shellcheck disable=SC2012 # device names, listed for the reader
ls -l /dev/mmcblk* 2>&1 | sed 's/^/  /'
for card in /sys/bus/mmc/devices/*; do
    [ -d "$card" ] || continue
    echo "card ${card##*/}:"
    for f in type name manfid oemid date rev hwrev fwrev cid csd preferred_erase_size \
        erase_size ocr rca dsr raw_rpmb_size_mult rel_sectors; do
        [ -r "$card/$f" ] && echo "  $f: $(cat "$card/$f" 2>/dev/null)"
    done
done
# The bus the core settled on: clock, width, timing (debugfs).
mkdir -p /sys/kernel/debug
mount -t debugfs debugfs /sys/kernel/debug 2>/dev/null || true
for ios in /sys/kernel/debug/mmc*/ios; do
    [ -r "$ios" ] || continue
    echo "${ios#/sys/kernel/debug/}:"
    sed 's/^/  /' "$ios"
done
for host in /sys/class/mmc_host/mmc*; do
    [ -d "$host" ] && echo "host ${host##*/}: $(readlink -f "$host/device" | sed 's|.*/||') driver $(basename "$(readlink -f "$host/device/driver")")"
done
[ -b "$dev" ] || {
    echo "no $dev"
    exit 1
}
echo "$dev: $(cat "/sys/class/block/${dev##*/}/size") sectors; queue: $(cat "/sys/block/${dev##*/}/queue/max_sectors_kb") KiB max request, $(cat "/sys/block/${dev##*/}/queue/max_segments") segments"
