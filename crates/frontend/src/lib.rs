//! emmc-frontend: how guests reach the card, and the daemon that serves it (`serve`).
//! `blk` serves the card's user area as a vhost-user-blk device through the host crate's
//! block driver; `mmc` carries the guest's own MMC requests to the emulated SDHCI host
//! (virtio-mmc). Both pace completions to the wall clock (`pacing`), record traces
//! (`trace`) and answer the control socket (`control`).
//!
//! It depends on the card and host crates, vhost-user and virtio; never on the simulator,
//! plotting or terminal crates (tests/layering.rs): the daemon's serving path links none
//! of them.
//!
//! `fuzzing` holds the fuzz targets' bodies (the card's command and frame parsers, and
//! this crate's descriptor-chain parsers), for `fuzz/` and the stable corpus test.

pub mod blk;
pub mod control;
pub mod cpu_latency;
pub mod fuzzing;
pub mod mmc;
pub mod pacing;
pub mod pci;
pub mod sdhci;
pub mod serve;
pub mod trace;

#[cfg(test)]
mod testing;
