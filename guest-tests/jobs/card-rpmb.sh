# RPMB through mmc-utils (--jobs card): program the key, read the write counter, an
# authenticated write of one 256-byte frame at address 2, the counter again, an
# authenticated read of that frame with the key (mmc-utils checks the MAC) compared
# with what was written, and a read with a wrong key, which must fail the MAC check.
# shellcheck shell=sh
rpmb=/dev/mmcblk0rpmb
b=${GT_BOUND:-30}
[ -c "$rpmb" ] || {
    echo "no $rpmb"
    exit 1
}
printf 'guest-test-rpmb-key-0123456789ab' >/tmp/key
printf 'guest-test-rpmb-key-0123456789XX' >/tmp/badkey
i=0
: >/tmp/frame
while [ "$i" -lt 8 ]; do
    printf 'frame 2 of the guest test, 32 B!' >>/tmp/frame
    i=$((i + 1))
done
step() {
    echo "+ $*"
    bounded "$b" "$@" || {
        echo "RPMB-RESULT: failed at: $*"
        exit 1
    }
}
step mmc rpmb write-key "$rpmb" /tmp/key
step mmc rpmb read-counter "$rpmb"
step mmc rpmb write-block "$rpmb" 0x02 /tmp/frame /tmp/key
step mmc rpmb read-counter "$rpmb"
step mmc rpmb read-block "$rpmb" 0x02 1 /tmp/back /tmp/key
cmp /tmp/frame /tmp/back || {
    echo "RPMB-RESULT: the frame read back differs"
    exit 1
}
echo "frame 2 read back intact: $(head -c 32 /tmp/back)"
echo "+ mmc rpmb read-block $rpmb 0x02 1 /tmp/back2 <wrong key>"
if bounded "$b" mmc rpmb read-block "$rpmb" 0x02 1 /tmp/back2 /tmp/badkey; then
    echo "RPMB-RESULT: a read with the wrong key passed the MAC check"
    exit 1
fi
echo "RPMB-RESULT: key, counter, authenticated write and read ok; wrong key refused"
