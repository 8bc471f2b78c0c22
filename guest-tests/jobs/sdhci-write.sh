# Direct writes to the card (--jobs sdhci), growing: one 4 KiB write (8 sectors), one
# 64 KiB write (one ADMA segment at the queue's max_segment_size), 1 MiB sequential
# writes (requests of max_sectors_kb, 512 KiB), 4 KiB random writes at queue depth 16;
# each read back or timed; stops at the first that fails
# or hangs. Runs last: QEMU's eMMC is known to leave writes hanging ("Card stuck
# being busy"), and then nothing else gets through to the card. Each wait is
# bounded; the outcome is reported, not fatal.
# shellcheck shell=sh
dev=${GT_DEV:-/dev/mmcblk0}
bound=${GT_BOUND:-30}
runtime=${GT_RUNTIME:-10}

# Runs a bounded fio write job; prints its summary lines and returns its status
# (124: still running at the bound).
write_job() {
    name=$1
    shift
    bounded "$bound" fio --name="$name" --filename="$dev" --direct=1 --buffer_pattern=0x5a "$@" \
        >/tmp/write.out 2>&1
    rc=$?
    grep -E 'write:|clat \(|err=|bounded:' /tmp/write.out | grep -v 'groupid=' | sed "s/^/$name: /"
    return "$rc"
}
# 0 when the block at 1 MiB reads back as the 0x5a pattern.
read_back() {
    bounded "$bound" dd if="$dev" of=/tmp/back bs=4096 skip=256 count=1 >/dev/null 2>&1 &&
        [ -s /tmp/back ] && [ -z "$(od -v -An -tx1 /tmp/back | tr -d ' \n5a')" ]
}
report() {
    echo "kernel log (mmc, last lines):"
    dmesg | grep -E 'mmc[0-9]|mmcblk|sdhci' | grep -v 'GT_' | tail -n 6 | sed 's/^/  /'
    echo "in flight on ${dev##*/} (read write): $(cat "/sys/class/block/${dev##*/}/inflight")"
    echo "WRITE-RESULT: $*"
    exit 0
}
outcome() {
    case $1 in
    0) return 0 ;;
    124) report "$2 hung (no completion within $bound s)" ;;
    *) report "$2 failed (fio exit status $1)" ;;
    esac
}

write_job write-4k --rw=write --bs=4k --size=4k --offset=1m --ioengine=psync
outcome $? "a 4 KiB write"
if read_back; then echo "write-4k: read back intact"; else report "a 4 KiB write completed, read back differs"; fi
write_job write-64k --rw=write --bs=64k --size=64k --offset=2m --ioengine=psync
outcome $? "a 64 KiB write"
write_job write-seq-1m --rw=write --bs=1m --size=8m --offset=64m --ioengine=psync
outcome $? "1 MiB sequential writes"
write_job write-rand-4k-qd16 --rw=randwrite --bs=4k --size=256m --offset=128m --ioengine=libaio \
    --iodepth=16 --time_based=1 --runtime="$runtime"
outcome $? "4 KiB random writes at queue depth 16"
report "all completed"
