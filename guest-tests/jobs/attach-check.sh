# The check of run-guest-test.sh --socket (job set attach): a daemon the user started
# serves a disk or card image the harness knows nothing of, so the check leaves its data
# as it found it. The disk must have appeared (guest-init.sh waits for GT_DEV); then the
# guest reads GT_ATTACH_SIZE bytes at GT_ATTACH_OFFSET and keeps them, writes that
# region with checksummed blocks and reads them back (fio, O_DIRECT, crc32c), writes
# the saved bytes back (O_DIRECT, fsync) and compares them with a fresh read.
# GT_ATTACH_WRITE=0: read the region only. The last line is "RESULT ok: ..." or
# "RESULT FAIL: ...", which the harness prints.
# shellcheck shell=sh
dev=${GT_DEV:-/dev/vda}
name=${dev##*/}
size=${GT_ATTACH_SIZE:-1048576}
off=${GT_ATTACH_OFFSET:-67108864}
write=${GT_ATTACH_WRITE:-1}
orig=/tmp/attach-orig
back=/tmp/attach-back

result() {
    echo "RESULT $*"
}
# A byte count in MiB when it is whole MiB, else KiB.
human() {
    if [ $(($1 % 1048576)) -eq 0 ]; then echo "$(($1 / 1048576)) MiB"; else echo "$(($1 / 1024)) KiB"; fi
}

[ -b "$dev" ] || {
    result "FAIL: no $dev in the guest"
    exit 1
}
sectors=$(cat "/sys/class/block/$name/size")
bytes=$((sectors * 512))
echo "$dev: $sectors sectors of 512 B ($(human "$bytes"))"
# The card behind an SDHCI controller: what the MMC core read from it, and the bus.
for card in /sys/bus/mmc/devices/*; do
    [ -r "$card/name" ] || continue
    host=/sys/class/mmc_host/${card##*/}
    host=${host%:*}
    echo "card ${card##*/}: $(cat "$card/type") '$(cat "$card/name")'," \
        "manfid $(cat "$card/manfid" 2>/dev/null), date $(cat "$card/date" 2>/dev/null)," \
        "on $(readlink -f "$host/device" | sed 's|.*/||')" \
        "($(basename "$(readlink -f "$host/device/driver")"))"
done
mkdir -p /sys/kernel/debug
mount -t debugfs debugfs /sys/kernel/debug 2>/dev/null || true
for ios in /sys/kernel/debug/mmc*/ios; do
    [ -r "$ios" ] || continue
    echo "bus (${ios#/sys/kernel/debug/}): $(grep -E '^(actual clock|bus width|timing spec|signal voltage):' "$ios" |
        sed 's/:[[:space:]]*/ /' | tr '\n' ',' | sed 's/,$//; s/,/, /g')"
done

case $size$off in *[!0-9]*)
    result "FAIL: GT_ATTACH_SIZE and GT_ATTACH_OFFSET must be byte counts"
    exit 1
    ;;
esac
if [ "$size" -le 0 ] || [ $((size % 65536)) -ne 0 ] || [ $((off % 4096)) -ne 0 ]; then
    result "FAIL: GT_ATTACH_SIZE must be a multiple of 64 KiB and GT_ATTACH_OFFSET of 4 KiB"
    exit 1
fi
# A small disk: the region moves to its middle.
if [ $((off + size)) -gt "$bytes" ]; then
    off=$((bytes / 2 / 65536 * 65536))
    [ $((off + size)) -le "$bytes" ] || {
        result "FAIL: $dev ($bytes bytes) is smaller than the $(human "$size") region"
        exit 1
    }
fi
region="$(human "$size") at $(human "$off")"

# 1. Read the region (and keep it).
if ! dd if="$dev" of="$orig" bs=65536 iflag=direct,skip_bytes,count_bytes \
    skip="$off" count="$size" 2>/tmp/attach-dd.err ||
    [ "$(wc -c <"$orig")" -ne "$size" ]; then
    cat /tmp/attach-dd.err
    result "FAIL: reading $region of $dev failed; nothing was written"
    exit 1
fi
echo "read $region"
if [ "$write" = 0 ]; then
    result "ok: $dev is there and $region reads (GT_ATTACH_WRITE=0: nothing written)"
    exit 0
fi

# 2. Write checksummed blocks and read them back.
rc=0
fio --name=attach --filename="$dev" --direct=1 --ioengine=psync --rw=write --bs=64k \
    --offset="$off" --size="$size" --verify=crc32c --do_verify=1 --verify_fatal=1 \
    --verify_state_save=0 --randrepeat=0 >/tmp/attach-fio.out 2>&1 || rc=$?
if [ "$rc" = 0 ] && grep -q 'err= *0' /tmp/attach-fio.out; then
    echo "fio wrote and verified $region:"
    grep -E '^ *(WRITE|READ):' /tmp/attach-fio.out | sed "s/^ */  /"
    verify=ok
else
    cat /tmp/attach-fio.out
    echo "fio write+verify failed (exit status $rc)"
    verify=failed
fi

# 3. Put the original bytes back, whatever fio did, and check them.
restored=failed
if dd if="$orig" of="$dev" bs=65536 oflag=direct,seek_bytes seek="$off" \
    conv=notrunc,fsync 2>/tmp/attach-dd.err; then
    if dd if="$dev" of="$back" bs=65536 iflag=direct,skip_bytes,count_bytes \
        skip="$off" count="$size" 2>>/tmp/attach-dd.err && cmp -s "$orig" "$back"; then
        restored=ok
        echo "the original $(human "$size") written back and read back equal"
    fi
fi
[ "$restored" = ok ] || {
    cat /tmp/attach-dd.err
    echo "writing the original bytes back failed or they read back different"
}

if [ "$verify" = ok ] && [ "$restored" = ok ]; then
    result "ok: $dev is there, $region written, read back and verified, original data restored"
    exit 0
fi
result "FAIL: write+verify $verify, restoring the original data $restored ($region of $dev)"
exit 1
