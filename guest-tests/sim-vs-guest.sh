#!/usr/bin/env bash
# Simulated vs measured: run fio jobs in a QEMU guest against `vhost-user-emmc serve`
# (run-guest-test.sh, one job per boot on a fresh image), keep the daemon's request
# trace, replay the job's requests in the simulator for the same model, and compare
# fio's bandwidth and completion-latency p50 with the simulator's (fidelity.py; the p50
# with the guest's own turnaround added, measured from the same boot's trace).
# Fails when a checked figure differs by more than the tolerance (10% by default).
#
# See guest-tests/README.md ("Simulated vs measured") and docs/fidelity.md.
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(dirname "$HERE")

usage() {
    cat <<'EOF'
Usage: guest-tests/sim-vs-guest.sh [options]

For each model, boots a guest per fio job (jobs/fidelity-*.fio) on a fresh image
served by vhost-user-emmc serve --trace, then replays each job's requests from the
trace in the simulator and compares fio's figures with the simulator's.

Options:
  --models LIST      models to compare, comma separated
                     (default generic-emmc45,toshiba-mmc32g)
  --no-overhead      skip the `ideal` model's run (zero card time: what the guest
                     measures there is its own per-request overhead)
  --tolerance PCT    largest difference allowed (default 10)
  --out DIR          keep the runs (data.log, serve.trace, console.log per boot) and
                     results.json here (default: a temporary directory, removed on
                     success)
  --markdown         print the table as Markdown
  --no-build         use the existing release build
  --bin PATH         the vhost-user-emmc binary (implies --no-build)
  --cache DIR        run-guest-test.sh's cache (kernel, initramfs)
  --no-install       never call apt-get
  -h, --help         this text

Environment: GUEST_IMAGE_DIR where the disk images go (default /dev/shm: the
daemon syncs every durable write, and a slow fdatasync makes its completions late);
RUST_LOG for the daemon (default info: its pacing lateness is printed per boot).

Exit status: 0 every checked figure agrees, 1 a figure differs or a run failed,
2 usage or setup error.
EOF
}

die() {
    printf 'sim-vs-guest: error: %s\n' "$*" >&2
    exit 2
}

MODELS=generic-emmc45,toshiba-mmc32g
OVERHEAD=1
TOLERANCE=10
OUT=
MARKDOWN=()
BUILD=1
BIN=$REPO/target/release/vhost-user-emmc
PASS=()
while [[ $# -gt 0 ]]; do
    case $1 in
    --models) [[ $# -ge 2 ]] || die "--models needs a value"; MODELS=$2; shift 2 ;;
    --no-overhead) OVERHEAD=0; shift ;;
    --tolerance) [[ $# -ge 2 ]] || die "--tolerance needs a value"; TOLERANCE=$2; shift 2 ;;
    --out) [[ $# -ge 2 ]] || die "--out needs a value"; OUT=$2; shift 2 ;;
    --markdown) MARKDOWN=(--markdown); shift ;;
    --no-build) BUILD=0; shift ;;
    --bin) [[ $# -ge 2 ]] || die "--bin needs a value"; BIN=$2; BUILD=0; shift 2 ;;
    --cache) [[ $# -ge 2 ]] || die "--cache needs a value"; PASS+=(--cache "$2"); shift 2 ;;
    --no-install) PASS+=(--no-install); shift ;;
    -h | --help) usage; exit 0 ;;
    *) usage >&2; die "unknown option: $1" ;;
    esac
done

# What runs for each model: the jobs (one boot each), and the rows shown but not
# checked, because the guest's own per-request overhead under TCG is as large as the
# card time there (see the job files).
declare -A JOBS=(
    [generic-emmc45]="fidelity-seqwrite fidelity-seqread fidelity-randwrite"
    [toshiba-mmc32g]="fidelity-seqwrite fidelity-seqread fidelity-randwrite-512k fidelity-randwrite"
)
INFO=(--info 'ideal:*' --info '*:fid-randread-4k' --info '*:fid-randwrite-4k')
# Sizes: 128 sequential 1 MiB requests, 128 random 512 KiB ones, 400 random 4 KiB ones.
# fio's bandwidth counts from its own start, and the guest's first I/O under TCG reaches
# the daemon up to 60 ms later (code translated for the first time, the buffer's huge
# page faulted in); the simulator counts from the first request's arrival. With 32
# I/Os of 1 MiB (0.7 s of reads on generic-emmc45) that alone was up to 8%; with 128,
# a few percent at most.
FIO_VARS=(--fio-var GT_FID_SEQ_SIZE=128m --fio-var GT_FID_RAND_IOS=400 --fio-var GT_FID_RAND_BIG_IOS=128)
# The disk image lives on tmpfs: a card without a cache (toshiba-mmc32g) makes every
# write durable, and the daemon's fdatasync of the image on the project's ext4 disk
# delayed completions by 0.4 ms at the median (up to 12 ms), time no card model has.
IMAGE_DIR=${GUEST_IMAGE_DIR:-/dev/shm}

IFS=, read -r -a models <<<"$MODELS"
for m in "${models[@]}"; do
    [[ -n ${JOBS[$m]:-} ]] || die "no fidelity jobs for model '$m' (known: ${!JOBS[*]})"
done

T0=$SECONDS
if [[ $BUILD == 1 ]]; then
    echo "== cargo build --release"
    cargo build --release --quiet --manifest-path "$REPO/Cargo.toml" || die "cargo build --release failed"
fi
[[ -x $BIN ]] || die "no vhost-user-emmc binary at $BIN"

if [[ -z $OUT ]]; then
    mkdir -p "$HERE/work"
    OUT=$(mktemp -d "$HERE/work/fidelity.XXXXXX")
    KEEP_OUT=0
else
    mkdir -p "$OUT"
    OUT=$(cd "$OUT" && pwd)
    KEEP_OUT=1
fi

runs=()
failed=()
# One guest boot: model, directory name, job files (comma separated).
boot() {
    local model=$1 name=$2 jobs=$3
    echo "== $model: $jobs"
    rm -rf "${OUT:?}/$name"
    if RUST_LOG=${RUST_LOG:-info} guest-tests/run-guest-test.sh --quiet --no-build --disk vhost-user-blk --bin "$BIN" --model "$model" \
        --jobs fidelity --fio-var "GT_JOBS=$jobs" "${FIO_VARS[@]}" "${PASS[@]}" \
        --image-dir "$IMAGE_DIR" \
        --save "$OUT/$name" >"$OUT/$name.log" 2>&1; then
        echo "   passed ($(tail -n 2 "$OUT/$name.log" | head -n 1 | sed 's/^== //'))"
        # The daemon's pacing: how late it signalled completions past their card time.
        grep -o 'session: .*lateness.*' "$OUT/$name.log" | sed 's/^/   daemon /' || true
        runs+=(--run "$model=$OUT/$name")
    else
        tail -n 30 "$OUT/$name.log"
        failed+=("$model $jobs: the guest test failed (log: $OUT/$name.log)")
    fi
}

cd "$REPO"
if [[ $OVERHEAD == 1 ]]; then
    # The ideal card takes no time for anything but its bus transfer, and its timing
    # has no state, so all its jobs share one boot.
    boot ideal ideal fidelity-seqwrite,fidelity-seqread,fidelity-randwrite,fidelity-randread
fi
for m in "${models[@]}"; do
    for job in ${JOBS[$m]}; do
        boot "$m" "$m-$job" "$job"
    done
done

echo
rc=0
if [[ ${#runs[@]} -gt 0 ]]; then
    python3 "$HERE/fidelity.py" --bin "$BIN" --tolerance "$TOLERANCE" "${INFO[@]}" \
        "${MARKDOWN[@]}" --json "$OUT/results.json" "${runs[@]}" || rc=$?
fi
for f in "${failed[@]}"; do echo "FAIL: $f"; done
[[ ${#failed[@]} == 0 ]] || rc=1
echo "sim-vs-guest: $((SECONDS - T0)) s"
if [[ $rc == 0 && $KEEP_OUT == 0 ]]; then
    rm -rf "$OUT"
else
    echo "sim-vs-guest: runs kept in $OUT"
fi
if [[ $rc == 0 ]]; then
    echo "sim-vs-guest: passed"
else
    echo "sim-vs-guest: FAILED"
fi
exit "$rc"
