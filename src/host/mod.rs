//! The host side: what a host controller and its driver do to a card.
//!
//! - `sdhci`: the SDHCI v3.00 controller that executes one MMC request on the bus;
//! - `mmc`: the MMC core operations (bring-up, switch, status, block transfers), named as
//!   in Linux, sending every command through the controller;
//! - `blkdrv`: the MMC block driver (Linux's `block.c`/`queue.c`): request queue,
//!   two-deep pipeline, packing, reliable write, flush, discard, HPI and BKOPS policies;
//! - `iosched`: the I/O scheduler models (noop, deadline, CFQ-like) that order block
//!   requests;
//! - `packing`: which queued block requests form a packed command, and write packing
//!   control (seed 000).

pub mod blkdrv;
pub mod cmdlog;
pub mod iosched;
pub mod mmc;
pub mod packing;
pub mod sdhci;
