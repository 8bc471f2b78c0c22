# Seed 000 in a guest (guest-tests/seed000-rw.sh): what decides how deep the guest
# fills the daemon's queue and how its writeback behaves. Prints only; never fails.
# shellcheck shell=sh
q=/sys/block/${GT_DEV##*/}/queue
echo "scheduler: $(cat "$q/scheduler" 2>/dev/null)"
echo "nr_requests: $(cat "$q/nr_requests" 2>/dev/null)"
echo "max_sectors_kb: $(cat "$q/max_sectors_kb" 2>/dev/null)"
echo "read_ahead_kb: $(cat "$q/read_ahead_kb" 2>/dev/null)"
for f in dirty_ratio dirty_background_ratio dirty_bytes dirty_background_bytes dirty_expire_centisecs; do
    echo "vm.$f: $(cat "/proc/sys/vm/$f" 2>/dev/null)"
done
echo "MemTotal: $(grep MemTotal /proc/meminfo | tr -s ' ' | cut -d' ' -f2-)"
exit 0
