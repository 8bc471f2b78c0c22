#!/usr/bin/env bash
# Fuzz the guest-facing parsers (docs/robustness.md).
#
#   ci/fuzz.sh [--seconds N] [--stable] [target...]
#
# With a nightly toolchain and cargo-fuzz (installed from crates.io when missing and
# possible), each target runs under libFuzzer for N seconds (default 600) on a scratch
# copy of its committed seeds (fuzz/work/<target>; fuzz/corpus stays as committed);
# crashes land in fuzz/artifacts/<target>/. Without them — or with --stable — the stable
# corpus runner (crates/frontend/tests/fuzz_corpus.rs) runs each target instead, with an iteration count
# scaled to N. Prints per target: executions, coverage and features when known, crashes.
# Targets: card_commands packed_header rpmb_frames blk_chain mmc_chain model_toml.
# Exit status is non-zero when any target crashed.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2

seconds=600
stable=0
targets=()
while [[ $# -gt 0 ]]; do
    case $1 in
    --seconds)
        seconds=$2
        shift 2
        ;;
    --stable)
        stable=1
        shift
        ;;
    -h | --help)
        sed -n '2,13p' "$0"
        exit 0
        ;;
    -*)
        echo "ci/fuzz.sh: unknown option $1" >&2
        exit 2
        ;;
    *)
        targets+=("$1")
        shift
        ;;
    esac
done
all=(card_commands packed_header rpmb_frames blk_chain mmc_chain model_toml)
[[ ${#targets[@]} -eq 0 ]] && targets=("${all[@]}")
for t in "${targets[@]}"; do
    [[ " ${all[*]} " == *" $t "* ]] || {
        echo "ci/fuzz.sh: unknown target $t (one of: ${all[*]})" >&2
        exit 2
    }
done

have_libfuzzer() {
    rustup run nightly rustc --version >/dev/null 2>&1 || return 1
    if ! cargo +nightly fuzz --version >/dev/null 2>&1; then
        echo "== a nightly toolchain is here but cargo-fuzz is not: installing it from crates.io" >&2
        echo "   (cargo install cargo-fuzz, into ~/.cargo/bin; a minute or two, once)" >&2
        if ! cargo install --quiet cargo-fuzz >/dev/null 2>&1; then
            echo "== cargo install cargo-fuzz failed: falling back to the stable corpus runner" >&2
            return 1
        fi
    fi
    cargo +nightly fuzz --version >/dev/null 2>&1
}

failed=0
if [[ $stable == 0 ]] && have_libfuzzer; then
    mkdir -p fuzz/work
    echo "== libFuzzer (cargo +nightly fuzz), ${seconds} s per target"
    # cargo-fuzz builds one target or all of them.
    build=()
    [[ ${#targets[@]} -eq 1 ]] && build=("${targets[0]}")
    if ! (cd fuzz && cargo +nightly fuzz build -O -a "${build[@]}" >work/build.log 2>&1); then
        tail -20 fuzz/work/build.log
        exit 1
    fi
    printf '%-14s %12s %8s %8s %8s  %s\n' target execs exec/s cov ft crashes
    for t in "${targets[@]}"; do
        work=fuzz/work/$t
        mkdir -p "$work" "fuzz/artifacts/$t"
        log=fuzz/work/$t.log
        stamp=fuzz/work/$t.start
        touch "$stamp"
        # The scratch corpus first (libFuzzer adds there), the seeds second (read only).
        (cd fuzz && cargo +nightly fuzz run -O -a "$t" "work/$t" "corpus/$t" -- \
            -max_total_time="$seconds" -print_final_stats=1 -rss_limit_mb=4096 \
            >"work/$t.log" 2>&1)
        rc=$?
        execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
        rate=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log" | tail -1)
        last=$(grep -E '^#[0-9]+' "$log" | tail -1)
        cov=$(sed -n 's/.* cov: \([0-9]*\).*/\1/p' <<<"$last")
        ft=$(sed -n 's/.* ft: \([0-9]*\).*/\1/p' <<<"$last")
        crashes=$(find "fuzz/artifacts/$t" -type f -newer "$stamp" 2>/dev/null | wc -l)
        if [[ $rc != 0 ]]; then
            failed=1
            crashes="$crashes (exit $rc; see $log)"
        fi
        printf '%-14s %12s %8s %8s %8s  %s\n' "$t" "${execs:-?}" "${rate:-?}" "${cov:-?}" \
            "${ft:-?}" "$crashes"
    done
else
    # About 200 inputs a second per target in a debug build: scale to the time asked for.
    iterations=$((seconds * 200))
    echo "== stable corpus runner (crates/frontend/tests/fuzz_corpus.rs), ${iterations} inputs per target"
    cargo test --quiet -p emmc-frontend --test fuzz_corpus --no-run 2>&1 | tail -1
    printf '%-14s %12s %8s  %s\n' target inputs seconds result
    for t in "${targets[@]}"; do
        start=$(date +%s)
        if out=$(FUZZ_ITERATIONS=$iterations cargo test --quiet -p emmc-frontend --test fuzz_corpus -- \
            --exact "$t" --nocapture 2>&1); then
            result=ok
        else
            result="FAILED:"$'\n'"$(grep -E 'failing input|panicked|assert' <<<"$out" | head -5)"
            failed=1
        fi
        inputs=$(sed -n "s/^$t: \([0-9]*\) inputs.*/\1/p" <<<"$out")
        printf '%-14s %12s %8s  %s\n' "$t" "${inputs:-?}" $(($(date +%s) - start)) "$result"
    done
fi
exit $failed
