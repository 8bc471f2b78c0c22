//! The host side: what a host controller and its driver do to a card. `sdhci` is the
//! SDHCI v3.00 controller that executes one MMC request on the bus; `mmc` holds the MMC
//! core operations (bring-up, switch, status, block transfers) named as in Linux, sending
//! every command through the controller.

pub mod mmc;
pub mod sdhci;
