//! The host side: what a host controller and its driver do to a card. `mmc` holds the MMC
//! core operations (bring-up, switch, status, block transfers) named as in Linux.

pub mod mmc;
