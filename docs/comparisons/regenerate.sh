#!/usr/bin/env bash
# Regenerates the worked examples of docs/comparisons.md: the tables, JSON and plots in
# docs/comparisons/open-aus/ and docs/comparisons/packing/. Deterministic: the same
# code gives the same files.
set -euo pipefail
cd "$(dirname "$0")/../.."
cargo build --release --quiet
bin=target/release/vhost-user-emmc
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# Twelve sequential writers, each in its own 64 MiB region, 64 KiB requests round-robin:
# more streams than the Toshiba keeps AUs open (7), fewer than the SanDisk (20).
python3 - >"$work/streams12.trace" <<'PY'
for k in range(200):
    for s in range(12):
        print(0, "W", s * 64 * 2**20 + k * 65536, 65536)
PY
"$bin" compare --models toshiba-mmc32g,sandisk-sem32g,generic-emmc45 \
    --trace "$work/streams12.trace" --qd 1 --out docs/comparisons/open-aus

# Seed 000: a reader and a buffered writer at once on the msm card, under each packing policy.
"$bin" compare --models msm-emmc45-sdr50 --workload parallel-rw --duration 10 \
    --policy packing=off,always,controlled --out docs/comparisons/packing
