#!/usr/bin/env bash
# The project's test command: formatting, lints, every Rust test (unit, integration,
# property, over-a-real-socket), the self-check, then the guest boot-and-fio tests.
# Run from anywhere; exits non-zero on the first failure.
#
#   ci/test.sh              everything (the guest tests need root the first time: they
#                           apt-get install QEMU 10, a Debian kernel, busybox-static, fio,
#                           mmc-utils, and build QEMU 11.1's trixie root; the fuzz smoke
#                           run installs cargo-fuzz with `cargo install` when a nightly
#                           toolchain is present and cargo-fuzz is not, and says so)
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

# Issue 15: every timing mechanism switched off in turn must break the calibration or
# fidelity test named for it (docs/fidelity.md). A copy of HEAD under target/ablation/.
echo "== mechanism ablation: each mechanism off, its named test must fail (about 3 min)"
python3 ci/mechanism-ablation.py

echo "== fuzz smoke run: 8 s per target (libFuzzer with a nightly toolchain and cargo-fuzz,"
echo "   which is installed from crates.io if missing; else the stable corpus runner)"
ci/fuzz.sh --seconds 8

echo "== selfcheck (release build, default model)"
cargo run --release --quiet -- selfcheck

# Issue 7: power cut at seeded instants, the image reopened, every cut checked
# (docs/durability.md). Exits non-zero on any violation. A few seconds each.
echo "== power-cut (release): 500 cuts, generic-emmc45, image reopened after every cut, unsynced writes lost"
cargo run --release --quiet -- simulate --workload power-cut --cuts 500 --seed 7 --lose-unsynced
echo "== power-cut (release): 500 cuts, toshiba-mmc32g with legacy reliable write, HPI"
cargo run --release --quiet -- simulate --workload power-cut --cuts 500 --seed 8 \
    --model toshiba-mmc32g --legacy-reliable --cut-store mem --hpi-percent 10

if [[ $guest == 1 ]]; then
    echo "== guest boot-and-fio: default model (generic-emmc45)"
    guest-tests/run-guest-test.sh --quiet --disk vhost-user-blk
    # A model whose small writes take milliseconds: the guest must see at least that.
    echo "== guest boot-and-fio: toshiba-mmc32g (latency floor from the model)"
    guest-tests/run-guest-test.sh --quiet --no-build --disk vhost-user-blk --model toshiba-mmc32g
    # Faults through the control socket while fio runs: EIO in the guest, a power cut
    # the host driver recovers from, the durable data intact.
    echo "== guest boot-and-fio: injected faults and a power cut (generic-emmc45)"
    guest-tests/run-guest-test.sh --quiet --no-build --disk vhost-user-blk --jobs faults
    # Seed 000 with serve's defaults (docs/host-driver.md, "serve's defaults and seed
    # 000"): a direct reader beside a buffered writer, packing off, always, controlled;
    # the reader must keep ~24 MB/s, halve, and come back. Three boots of 10 s runs,
    # about 3.5 minutes.
    echo "== guest seed 000: parallel read and write, msm-emmc45-sdr50, three packing modes"
    guest-tests/seed000-rw.sh --no-build
    # Simulated vs measured (docs/fidelity.md): fio's bandwidth and p50 in the guest
    # against the simulator's replay of the daemon's trace (p50 plus the guest's own
    # turnaround, measured from the same trace), both models, within 10%.
    # Eight guest boots, about 2.5 minutes.
    echo "== guest simulated vs measured: generic-emmc45, toshiba-mmc32g (±10%)"
    guest-tests/sim-vs-guest.sh --no-build
    # Issue 14: the guest's own sdhci-pci, MMC core and mmc_block drive the daemon's
    # SDHCI controller over QEMU 11.1's vfio-user-pci (the first run builds QEMU 11.1's
    # trixie root, about 5 minutes, and fetches trixie's kernel). About 40 s each.
    echo "== guest sdhci (vfio-user): card set, bookworm's 6.1"
    guest-tests/run-guest-test.sh --quiet --no-build --disk sdhci
    echo "== guest sdhci (vfio-user): card set, trixie's 6.12"
    guest-tests/run-guest-test.sh --quiet --no-build --disk sdhci --kernel 6.12
    # Issue 18: Linux's own MMC test suite (mmc_test.ko, built for the guest's kernel from
    # Debian's source of that version) and mmc-utils, both on the daemon's SDHCI card.
    # All 51 cases take about 26 minutes under TCG (1579 s of guest time in a clean-clone
    # run): mmc_test's performance cases move several GiB and run 10 s per size.
    echo "== guest sdhci (vfio-user): Linux's mmc_test, every case against guest-tests/mmc-test-expected.txt"
    guest-tests/run-guest-test.sh --quiet --no-build --disk sdhci --jobs mmc-test
    echo "== guest sdhci (vfio-user): mmc-utils across a power cycle of the daemon, checked against inspect --image"
    guest-tests/mmc-utils.sh --no-build
    echo "== guest sdhci (vfio-user): toshiba-mmc32g write stalls through mmc_block"
    guest-tests/run-guest-test.sh --quiet --no-build --disk sdhci --model toshiba-mmc32g --jobs card-stall
    echo "== guest virtio-mmc: serve --transport mmc on vhost-user-test-device-pci"
    guest-tests/run-guest-test.sh --quiet --no-build --disk virtio-mmc
    echo "== guest sdhci vs QEMU's in-process sdhci-pci + emmc (ideal model, 5 s per job)"
    guest-tests/sdhci-vs-qemu.sh --no-build --runtime 5
fi

echo "== guest-tests/test_parse_fio.py"
python3 guest-tests/test_parse_fio.py
echo "== guest-tests/test_sdhci_checks.py"
python3 guest-tests/test_sdhci_checks.py
echo "== guest-tests/test_fidelity.py"
python3 guest-tests/test_fidelity.py
echo "== guest-tests/test_mmc_test_table.py"
python3 guest-tests/test_mmc_test_table.py
echo "== guest-tests/test_mmc_utils_checks.py"
python3 guest-tests/test_mmc_utils_checks.py
echo "== guest-tests/test_mmc_test_build.py"
python3 guest-tests/test_mmc_test_build.py

echo "ci/test.sh: all passed"
