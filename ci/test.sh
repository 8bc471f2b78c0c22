#!/usr/bin/env bash
# The project's test command: formatting, lints, then every test (unit, integration,
# property tests). Run from anywhere; exits non-zero on the first failure.
set -euo pipefail
cd "$(dirname "$0")/.."

echo "== cargo fmt --check"
cargo fmt --all -- --check

echo "== cargo clippy --workspace --all-targets -- -D warnings"
cargo clippy --workspace --all-targets -- -D warnings

echo "== cargo test --workspace"
cargo test --workspace --all-targets

echo "== selfcheck (release build, default model)"
cargo run --release --quiet -- selfcheck

echo "ci/test.sh: all passed"
