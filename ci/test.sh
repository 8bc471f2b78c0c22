#!/usr/bin/env bash
# The project's test command: formatting, lints, every Rust test (unit, integration,
# property, over-a-real-socket), the self-check, then the guest boot-and-fio tests.
# Run from anywhere; exits non-zero on the first failure.
#
#   ci/test.sh              everything (the guest tests need root the first time: they
#                           apt-get install QEMU 10, a Debian kernel, busybox-static, fio)
#   ci/test.sh --no-guest   everything but the guest tests
set -euo pipefail
cd "$(dirname "$0")/.."

guest=1
case ${1:-} in
--no-guest) guest=0 ;;
"") ;;
*)
    echo "usage: ci/test.sh [--no-guest]" >&2
    exit 2
    ;;
esac

echo "== cargo fmt --check"
cargo fmt --all -- --check

echo "== cargo clippy --workspace --all-targets -- -D warnings"
cargo clippy --workspace --all-targets -- -D warnings

echo "== cargo test --workspace"
cargo test --workspace --all-targets

echo "== fuzz smoke run: 8 s per target (libFuzzer on nightly, else the stable runner)"
ci/fuzz.sh --seconds 8

echo "== selfcheck (release build, default model)"
cargo run --release --quiet -- selfcheck

if [[ $guest == 1 ]]; then
    echo "== guest boot-and-fio: default model (generic-emmc45)"
    guest-tests/run-guest-test.sh --quiet
    # A model whose small writes take milliseconds: the guest must see at least that.
    echo "== guest boot-and-fio: toshiba-mmc32g (latency floor from the model)"
    guest-tests/run-guest-test.sh --quiet --no-build --model toshiba-mmc32g
fi

echo "== guest-tests/test_parse_fio.py"
python3 guest-tests/test_parse_fio.py

echo "ci/test.sh: all passed"
