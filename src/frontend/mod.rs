//! Frontends: how guests reach the card. `blk` serves it as a vhost-user-blk device;
//! `mmc` carries raw MMC requests to the emulated SDHCI host (virtio-mmc).

pub mod blk;
pub mod control;
pub mod mmc;
pub mod pacing;
pub mod serve;
pub mod trace;
