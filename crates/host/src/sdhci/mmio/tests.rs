//! Unit tests of the register-level model (the driver-level tests are in crates/host/tests/sdhci_mmio/).
