# Boot partition 0 is read-only to the block layer until force_ro is cleared
# (--jobs card, before card-boot.fio).
# shellcheck shell=sh
ro=/sys/block/mmcblk0boot0/force_ro
[ -w "$ro" ] || {
    echo "no $ro"
    exit 1
}
echo 0 >"$ro" || exit 1
echo "mmcblk0boot0: force_ro $(cat "$ro"), $(cat /sys/block/mmcblk0boot0/size) sectors"
