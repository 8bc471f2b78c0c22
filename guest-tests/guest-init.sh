#!/bin/busybox sh
# /init of the guest test initramfs (busybox ash, run as PID 1).
#
# run-guest-test.sh copies this file to /init, next to busybox, the virtio
# modules, fio and its libraries, and the job files under /jobs. It passes its
# settings on the kernel command line as NAME=value words, which the kernel
# hands to /init as environment variables:
#   GT_JOBS         jobs to run, comma separated: /jobs/NAME.fio (fio) or
#                   /jobs/NAME.sh (a busybox sh script)
#   GT_DEV          the disk (default /dev/vda; "none": no disk to wait for)
#   GT_HUGEPAGES    reserve this many 2 MiB huge pages (for fio's mem=shmhuge)
#   GT_*            sizes and runtimes that the job files use as ${GT_...}
#
# The console (ttyS0) shows progress. Results go to the second serial port
# (ttyS1), which carries nothing else, between markers the host parses:
#   @@GT-BEGIN@@
#   @@GT-FIO-BEGIN <job>@@ ... fio JSON ... @@GT-FIO-END <job> rc=<rc>@@
#   @@GT-SH-BEGIN <job>@@ ... the script's output ... @@GT-SH-END <job> rc=<rc>@@
#   @@GT-DMESG-BEGIN@@ ... kernel log ... @@GT-DMESG-END@@
#   @@GT-END@@
# A run that does not reach @@GT-END@@ has failed. At the end the guest powers
# off, which makes QEMU exit.
# shellcheck shell=sh

/bin/busybox mkdir -p /bin /sbin /usr/bin /usr/sbin /proc /sys /dev /tmp
/bin/busybox --install -s
export PATH=/bin:/sbin:/usr/bin:/usr/sbin
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev 2>/dev/null || true

say() { echo "guest: $*"; }
fail() {
    say "FATAL: $*"
    echo "@@GT-FATAL $*@@" >&3 2>/dev/null || true
    sync
    poweroff -f
}

DATA=/dev/ttyS1
[ -c "$DATA" ] || DATA=/dev/console
: "${GT_DEV:=/dev/vda}"
export GT_DEV
# One open file for all results; raw mode so the tty adds no carriage returns.
exec 3>"$DATA"
stty -F "$DATA" raw -echo 2>/dev/null || true

say "up after $(cut -d' ' -f1 /proc/uptime) s; kernel $(uname -r)"

# Load the virtio stack in dependency order (the harness computed the order from
# modules.dep).
while read -r mod; do
    [ -n "$mod" ] || continue
    insmod "/lib/modules/$mod" || fail "insmod $mod failed"
done </modules.load

if [ "$GT_DEV" != none ]; then
    i=0
    while [ ! -b "$GT_DEV" ]; do
        i=$((i + 1))
        [ "$i" -le 300 ] || fail "$GT_DEV did not appear within 30 s"
        sleep 0.1
    done
    say "$GT_DEV: $(cat "/sys/class/block/${GT_DEV##*/}/size") sectors of 512 B"
    # The queue limits decide how the block layer splits fio's I/Os into requests.
    q=/sys/block/${GT_DEV##*/}/queue
    say "$GT_DEV queue: max_sectors_kb $(cat "$q/max_sectors_kb") max_hw_sectors_kb $(cat "$q/max_hw_sectors_kb") max_segments $(cat "$q/max_segments") max_segment_size $(cat "$q/max_segment_size")"
fi

# Huge pages for fio's buffers (mem=shmhuge in the fidelity jobs), when asked for.
if [ -n "${GT_HUGEPAGES:-}" ]; then
    echo "$GT_HUGEPAGES" >/proc/sys/vm/nr_hugepages
    say "huge pages: $(cat /proc/sys/vm/nr_hugepages) of 2 MiB"
fi

echo "@@GT-BEGIN@@" >&3
cd /tmp || fail "no /tmp"
for job in $(echo "$GT_JOBS" | tr ',' ' '); do
    if [ -f "/jobs/$job.sh" ]; then
        # A shell job: its output goes to the console and the results port; it
        # bounds its own waits (a stuck device must not stop the jobs after it).
        say "sh $job.sh (t=$(cut -d' ' -f1 /proc/uptime) s)"
        echo "@@GT-JOB-START $job@@" >&3
        rc=0
        sh "/jobs/$job.sh" >"/tmp/$job.out" 2>&1 || rc=$?
        sed "s/^/guest: $job: /" "/tmp/$job.out"
        {
            echo "@@GT-SH-BEGIN $job@@"
            cat "/tmp/$job.out"
            echo "@@GT-SH-END $job rc=$rc@@"
        } >&3
        say "sh $job.sh exited $rc"
        continue
    fi
    [ -f "/jobs/$job.fio" ] || fail "no job file /jobs/$job.fio or /jobs/$job.sh"
    say "fio $job.fio (t=$(cut -d' ' -f1 /proc/uptime) s)"
    echo "@@GT-JOB-START $job@@" >&3
    fio --eta=never --output-format=json --output="/tmp/$job.json" "/jobs/$job.fio" \
        2>"/tmp/$job.err" &
    fio_pid=$!
    # While fio runs, say every 30 s how many requests the disk holds, so that a
    # hang (the host's time limit) shows whether I/O is stuck in the device.
    t=0
    while kill -0 "$fio_pid" 2>/dev/null && [ -d "/proc/$fio_pid" ] &&
        ! grep -q '^State:.*Z' "/proc/$fio_pid/status" 2>/dev/null; do
        sleep 1
        t=$((t + 1))
        if [ $((t % 30)) -eq 0 ]; then
            say "fio $job still running after $t s; ${GT_DEV##*/} requests in flight (read write): $(cat "/sys/class/block/${GT_DEV##*/}/inflight")"
        fi
    done
    rc=0
    wait "$fio_pid" || rc=$?
    # fio's own error messages (verify failures, I/O errors) go to stderr.
    if [ -s "/tmp/$job.err" ]; then
        sed "s/^/guest: fio $job: /" "/tmp/$job.err"
    fi
    {
        echo "@@GT-FIO-BEGIN $job@@"
        cat "/tmp/$job.json" 2>/dev/null
        echo
        echo "@@GT-FIO-END $job rc=$rc@@"
    } >&3
    say "fio $job.fio exited $rc"
done

echo "@@GT-DMESG-BEGIN@@" >&3
dmesg >&3
echo "@@GT-DMESG-END@@" >&3
echo "@@GT-END@@" >&3
say "done after $(cut -d' ' -f1 /proc/uptime) s; powering off"
sync
poweroff -f
