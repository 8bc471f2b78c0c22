# Linux's own MMC test suite, mmc_test (drivers/mmc/core/mmc_test.c), against the card
# (--jobs mmc-test): the card is unbound from mmc_block and bound to mmc_test, and each
# case runs on its own through debugfs (echo N > .../test), so that each gets its own
# time and a case that hangs is named. The host parses the lines below into the
# per-case table (guest-tests/mmc-test-table.py):
#   MMCTEST-LIST-BEGIN ... testlist ("N:\tname") ... MMCTEST-LIST-END
#   MMCTEST-CASES N N ...         (the cases this run takes, in order)
#   MMCTEST-CASE N start=T        (guest uptime, s)
#   MMCTEST-CASE-END N rc=RC end=T
#   MMCTEST-KLOG-BEGIN N ... the kernel's lines for case N ... MMCTEST-KLOG-END N
#   MMCTEST-RESULT-BEGIN N ... debugfs test file (result and transfer lines) ... MMCTEST-RESULT-END N
# The module is /lib/modules/extra/mmc_test.ko (guest-tests/mmc-test-build.sh), unless
# the kernel has mmc_test built in. GT_MMCTEST_CASES: "all" or a comma list of case
# numbers; GT_MMCTEST_BOUND: seconds one case may take before the job gives up.
# shellcheck shell=sh
bound=${GT_MMCTEST_BOUND:-600}
mkdir -p /sys/kernel/debug
mount -t debugfs debugfs /sys/kernel/debug 2>/dev/null || true

if [ ! -d /sys/bus/mmc/drivers/mmc_test ]; then
    insmod /lib/modules/extra/mmc_test.ko || {
        echo "MMCTEST-ERROR insmod /lib/modules/extra/mmc_test.ko failed"
        exit 1
    }
fi
card=
for d in /sys/bus/mmc/devices/*; do
    [ -e "$d" ] && card=${d##*/} && break
done
[ -n "$card" ] || {
    echo "MMCTEST-ERROR no card on the MMC bus"
    exit 1
}
host=${card%%:*}
# The card's capacity in sectors (mmc_test puts its test area in the middle of it), read
# while mmc_block still holds the card.
dev=${GT_DEV:-/dev/mmcblk0}
echo "MMCTEST-CAPACITY $(cat "/sys/class/block/${dev##*/}/size" 2>/dev/null)"
# The bus the MMC core chose (debugfs ios: "timing spec: 8 (mmc DDR52)", "actual clock:
# 52000000 Hz", "bus width: 3 (8 bits)"), for the model's prediction of the performance
# cases (guest-tests/mmc-test-vs-model.py).
ios=/sys/kernel/debug/$host/ios
echo "MMCTEST-BUS timing=$(sed -n 's/^timing spec:[[:space:]]*//p' "$ios" 2>/dev/null);" \
    "clock=$(sed -n 's/^actual clock:[[:space:]]*\([0-9]*\).*/\1/p' "$ios" 2>/dev/null);" \
    "width=$(sed -n 's/^bus width:[[:space:]]*[0-9]* (\([0-9]*\) bits)/\1/p' "$ios" 2>/dev/null)"
if [ -e "/sys/bus/mmc/devices/$card/driver" ]; then
    drv=$(basename "$(readlink "/sys/bus/mmc/devices/$card/driver")")
    if [ "$drv" != mmc_test ]; then
        echo "unbinding $card from $drv"
        echo "$card" >"/sys/bus/mmc/drivers/$drv/unbind" || {
            echo "MMCTEST-ERROR cannot unbind $card from $drv"
            exit 1
        }
    fi
fi
if [ ! -e "/sys/bus/mmc/drivers/mmc_test/$card" ]; then
    echo "binding $card to mmc_test"
    echo "$card" >/sys/bus/mmc/drivers/mmc_test/bind || {
        echo "MMCTEST-ERROR cannot bind $card to mmc_test"
        exit 1
    }
fi
dir=/sys/kernel/debug/$host/$card
[ -w "$dir/test" ] || {
    echo "MMCTEST-ERROR no $dir/test (is debugfs there, did mmc_test bind?)"
    exit 1
}
echo "MMCTEST-CARD $card $(cat "/sys/bus/mmc/devices/$card/name" 2>/dev/null) on $host"
echo "MMCTEST-LIST-BEGIN"
cat "$dir/testlist"
echo "MMCTEST-LIST-END"

cases=${GT_MMCTEST_CASES:-all}
if [ "$cases" = all ]; then
    # Every case but 0 ("Run all tests").
    cases=$(sed -n 's/^\([1-9][0-9]*\):.*/\1/p' "$dir/testlist")
else
    cases=$(echo "$cases" | tr ',' ' ')
fi
echo "MMCTEST-CASES $(echo "$cases" | tr '\n' ' ')"
rc=0
for n in $cases; do
    # The kernel log lines this case adds: everything after this mark.
    echo "mmc-test job: case $n begins" >/dev/kmsg
    echo "MMCTEST-CASE $n start=$(cut -d' ' -f1 /proc/uptime)"
    # The write returns when the case has run (mmc_test runs it in the writer's context).
    bounded "$bound" sh -c "echo $n >$dir/test" >/tmp/case.out 2>&1
    case_rc=$?
    echo "MMCTEST-CASE-END $n rc=$case_rc end=$(cut -d' ' -f1 /proc/uptime)"
    # Progress on the console (the results go to the host at the end of the job).
    echo "guest: mmc-test: case $n: $(dmesg | sed -n "/mmc-test job: case $n begins/,\$p" |
        sed -n 's/.*: Result: //p' | tail -n 1)" >/dev/console
    echo "MMCTEST-KLOG-BEGIN $n"
    dmesg | sed -n "/mmc-test job: case $n begins/,\$p" | grep -E "$host|mmc_test"
    echo "MMCTEST-KLOG-END $n"
    if [ "$case_rc" = 124 ]; then
        # The case still holds the host: nothing after it can run.
        cat /tmp/case.out
        echo "MMCTEST-HUNG $n after $bound s"
        rc=1
        break
    fi
    echo "MMCTEST-RESULT-BEGIN $n"
    cat "$dir/test"
    echo "MMCTEST-RESULT-END $n"
done
# Give the card back to mmc_block for the jobs after this one.
if echo "$card" >/sys/bus/mmc/drivers/mmc_test/unbind 2>/dev/null; then
    echo "$card" >/sys/bus/mmc/drivers/mmcblk/bind 2>/dev/null || true
fi
exit "$rc"
