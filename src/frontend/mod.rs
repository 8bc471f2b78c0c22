//! Frontends: how guests reach the card. `blk` serves it as a vhost-user-blk device.

pub mod blk;
