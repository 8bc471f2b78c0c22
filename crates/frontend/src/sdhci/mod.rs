//! `serve --transport sdhci` (docs/sdhci-transport.md): the card behind the register-level
//! SDHCI controller of emmc-host, as the PCI function of `crate::pci`, so that a guest's
//! own `sdhci-pci`, MMC core and `mmc_block` drive it through QEMU's `vfio-user-pci`.
//!
//! - `bar0.rs`: [`SdhciBar0`], the controller behind BAR0 (the SDHCI space and the PCI
//!   identity's vendor registers);
//! - `serve.rs`: the daemon: card, image, options, control socket, signals;
//! - `trace.rs`: `--trace`, the guest's commands as a block trace.

mod bar0;
pub mod serve;
pub mod trace;

pub use bar0::SdhciBar0;

#[cfg(test)]
mod tests;
