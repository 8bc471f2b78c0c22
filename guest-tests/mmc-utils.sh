#!/usr/bin/env bash
# mmc-utils in a guest against the card (serve --transport sdhci), across a power cycle
# of the daemon, each result checked against EXT_CSD as the guest reads it, the
# daemon's command log and `vhost-user-emmc inspect --image` afterwards.
#
#   guest-tests/mmc-utils.sh [--model M] [--no-build] [--keep]
#
# Boot 1 (run-guest-test.sh --jobs mmc-utils on a new image): RPMB write-key,
# read-counter, write-block, read-block (jobs/card-rpmb.sh); status get; writeprotect
# boot get/set; bootpart enable; cache disable/enable; bkops_en manual; gp create and
# enh_area set (one-time partitioning); sanitize (jobs/mmc-utils.sh). The daemon stops
# with the guest. Boot 2 (--jobs mmc-utils-after, the same image, a new daemon): the
# partitioning in effect, power-on write protection gone, the rest kept
# (jobs/mmc-utils.sh with GT_MMCU_BOOT=2). Then guest-tests/mmc-utils-checks.py. About
# a minute.
# Exit status: 0 pass, 1 a check failed, 2 setup error.
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(dirname "$HERE")
CACHE=${GUEST_CACHE:-$HERE/work}
BIN=${VHOST_USER_EMMC:-$REPO/target/release/vhost-user-emmc}
MODEL=generic-emmc45
BUILD=()
KEEP=0
while [[ $# -gt 0 ]]; do
    case $1 in
    --model) MODEL=${2:?--model needs a name}; shift 2 ;;
    --no-build) BUILD=(--no-build); shift ;;
    --keep) KEEP=1; shift ;;
    -h | --help) sed -n '2,/^set -euo/{/^set -euo/d;s/^# \{0,1\}//;p}' "$0"; exit 0 ;;
    *) echo "mmc-utils.sh: unknown option $1" >&2; exit 2 ;;
    esac
done
mkdir -p "$CACHE/runs"
WORK=$(mktemp -d "$CACHE/runs/mmc-utils.XXXXXX")
IMG=$WORK/card.img
finish() {
    if [[ $KEEP == 0 && ${1:-1} == 0 ]]; then rm -rf "$WORK"; else echo "kept: $WORK"; fi
}
run=("$HERE/run-guest-test.sh" --quiet --disk sdhci --model "$MODEL" --image "$IMG")
echo "== mmc-utils, boot 1: RPMB, status, boot write protection, bootpart, cache, bkops, partitioning, sanitize"
if ! "${run[@]}" "${BUILD[@]}" --jobs mmc-utils --save "$WORK/boot1"; then
    finish 1
    echo "mmc-utils: FAIL (the first boot failed)"
    exit 1
fi
echo "== mmc-utils, boot 2: a new daemon on the same image (the card power-cycled)"
if ! "${run[@]}" --no-build --jobs mmc-utils-after --save "$WORK/boot2"; then
    finish 1
    echo "mmc-utils: FAIL (the second boot failed)"
    exit 1
fi
"$BIN" inspect --image "$IMG" >"$WORK/inspect.txt"
echo "== mmc-utils checks (guest-tests/mmc-utils-checks.py)"
rc=0
python3 "$HERE/mmc-utils-checks.py" --boot1 "$WORK/boot1/data.log" --boot2 "$WORK/boot2/data.log" \
    --cmd-log "$WORK/boot1/cmd.log" --inspect "$WORK/inspect.txt" || rc=$?
finish "$rc"
if [[ $rc == 0 ]]; then echo "mmc-utils: PASS"; else echo "mmc-utils: FAIL"; fi
exit "$rc"
