# The virtio-mmc device as the guest enumerates it (--jobs virtio-mmc): QEMU's
# vhost-user-test-device-pci with the daemon's mmc transport behind it. No Linux
# driver claims the device ID, so the guest lists it and binds nothing. Then the
# guest reads the device's configuration space (struct virtio_mmc_config), which
# QEMU fetches from the daemon (GET_CONFIG), and prints it. Fails when no virtio
# device with ID GT_VIRTIO_ID is there, when a driver took it, or when the
# configuration cannot be read.
# shellcheck shell=sh
want=$(printf '0x%04x' "${GT_VIRTIO_ID:?}")
pci_want=$(printf '0x%04x' $((0x1040 + GT_VIRTIO_ID)))
echo "PCI functions (vendor device class driver):"
for d in /sys/bus/pci/devices/*; do
    drv=-
    [ -e "$d/driver" ] && drv=$(basename "$(readlink -f "$d/driver")")
    echo "  ${d##*/} $(cat "$d/vendor") $(cat "$d/device") $(cat "$d/class") $drv"
done
echo "virtio devices (device vendor status driver features):"
found=0
for v in /sys/bus/virtio/devices/*; do
    [ -d "$v" ] || continue
    drv=-
    [ -e "$v/driver" ] && drv=$(basename "$(readlink -f "$v/driver")")
    echo "  ${v##*/} $(cat "$v/device") $(cat "$v/vendor") $(cat "$v/status" 2>/dev/null) $drv $(cat "$v/features" 2>/dev/null)"
    echo "    on $(readlink -f "$v" | sed 's|/virtio[0-9]*$||; s|.*/||'), modalias $(cat "$v/modalias")"
    if [ "$(cat "$v/device")" = "$want" ]; then
        found=1
        if [ "$drv" != - ]; then
            echo "the device is bound to $drv: that driver claims ID ${GT_VIRTIO_ID}"
            exit 1
        fi
    fi
done
dmesg | grep -iE 'virtio' | sed 's/^/  kernel: /'
if [ "$found" = 0 ]; then
    echo "no virtio device $want (PCI device ID $pci_want)"
    exit 1
fi
echo "VIRTIO-MMC: device $want on PCI 1af4:${pci_want#0x}, no driver bound"

# The configuration space, read by hand. virtio-pci holds the BARs (and the
# kernel's IO_STRICT_DEVMEM keeps /dev/mem off them) until it lets go of the PCI
# function; memory decoding stays on.
pci=
for d in /sys/bus/pci/devices/*; do
    [ "$(cat "$d/vendor") $(cat "$d/device")" = "0x1af4 $pci_want" ] && pci=$d
done
echo "${pci##*/}" >/sys/bus/pci/drivers/virtio-pci/unbind || exit 1
byte() { od -An -tu1 -j "$1" -N 1 "$pci/config" | tr -d ' '; }
le32() { od -An -tu4 -j "$1" -N 4 "$pci/config" | tr -d ' '; }
# Walk the capability list for the virtio-pci DEVICE_CFG capability (vendor
# capability 0x09 with cfg_type 4): its BAR, offset and length.
cap=$(byte 52)
bar='' off='' len=''
while [ "${cap:-0}" -ne 0 ]; do
    if [ "$(byte "$cap")" -eq 9 ] && [ "$(byte $((cap + 3)))" -eq 4 ]; then
        bar=$(byte $((cap + 4)))
        off=$(le32 $((cap + 8)))
        len=$(le32 $((cap + 12)))
        break
    fi
    cap=$(byte $((cap + 1)))
done
[ -n "$bar" ] || {
    echo "no virtio DEVICE_CFG capability"
    exit 1
}
base=$(sed -n "$((bar + 1))p" "$pci/resource" | cut -d' ' -f1)
echo "device configuration: BAR$bar $base + $off, $len bytes"
w() { devmem $((base + off + $1)) 32; }
[ "$len" -ge 48 ] || {
    echo "configuration space of $len bytes, not 48"
    exit 1
}
printf 'virtio_mmc_config: caps %#x max_seg_size %d max_segs %d max_blk_size %d max_blk_count %d\n' \
    "$(($(w 4) << 32 | $(w 0)))" "$(w 8)" "$(w 12)" "$(w 16)" "$(w 20)"
printf 'virtio_mmc_config: max_req_size %d max_busy_timeout_ms %d f_min %d f_max %d ocr_avail %#x\n' \
    "$(w 24)" "$(w 28)" "$(w 32)" "$(w 36)" "$(w 40)"
[ "$(($(w 36)))" -gt 0 ] || {
    echo "f_max reads 0: no configuration from the daemon"
    exit 1
}
