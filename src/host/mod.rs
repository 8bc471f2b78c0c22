//! The host side: what a host controller and its driver do to a card.
//!
//! - `mmc`: the MMC core operations (bring-up, switch, status, block transfers), named as
//!   in Linux;
//! - `packing`: which queued block requests form a packed command, and write packing
//!   control (seed 000).

pub mod mmc;
pub mod packing;
