# Discard and secure discard of a range each (--jobs card); the host finds the
# CMD35/CMD36/CMD38 sequences in the daemon's --cmd-log. A secure discard the kernel
# refuses is reported (DISCARD-RESULT), not a failure here: the host decides.
# shellcheck shell=sh
dev=${GT_DEV:-/dev/mmcblk0}
b=${GT_BOUND:-30}
q=/sys/block/${dev##*/}/queue
echo "queue: discard_granularity $(cat "$q/discard_granularity") discard_max_bytes $(cat "$q/discard_max_bytes") write_zeroes_max_bytes $(cat "$q/write_zeroes_max_bytes" 2>/dev/null)"
echo "+ blkdiscard -o $GT_DISCARD_OFFSET -l $GT_DISCARD_LEN $dev"
bounded "$b" blkdiscard -o "$GT_DISCARD_OFFSET" -l "$GT_DISCARD_LEN" "$dev"
echo "DISCARD-RESULT: discard rc=$?"
echo "+ blkdiscard -s -o $GT_SECDISCARD_OFFSET -l $GT_DISCARD_LEN $dev"
bounded "$b" blkdiscard -s -o "$GT_SECDISCARD_OFFSET" -l "$GT_DISCARD_LEN" "$dev"
echo "DISCARD-RESULT: secure rc=$?"
exit 0
