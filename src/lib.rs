//! vhost-user-emmc: an eMMC 4.5 card behind an emulated SDHCI host, served to QEMU guests
//! over vhost-user, with timing models of real cards.
//!
//! Layers, each depending only on those below it (see `docs/architecture.md`):
//! - [`card`]: the eMMC 4.5 device — states, commands, registers, partitions, RPMB,
//!   packed commands, HPI, BKOPS, cache and durability bookkeeping;
//! - [`timing`]: how long each card operation takes, in card time;
//! - [`store`]: the sparse image and its metadata sidecar;
//! - [`model`]: device models loaded from `device-models/*.toml`;
//! - [`host`]: what a host driver does to a card (the Linux MMC core's operations).

pub mod card;
pub mod crc;
pub mod fault;
pub mod frontend;
pub mod fuzzing;
pub mod host;
pub mod inspect;
pub mod model;
pub mod selfcheck;
pub mod sim;
pub mod store;
pub mod timing;
