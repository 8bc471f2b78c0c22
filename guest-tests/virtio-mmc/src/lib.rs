//! A userspace virtio-mmc driver (docs/virtio-mmc.md): it attaches to
//! `vhost-user-emmc serve --transport mmc` as the vhost-user frontend with the
//! `virtio-driver` crate and drives the emulated SDHCI host and card with the main crate's
//! MMC core and block driver.
//!
//! - [`transport`]: descriptor chains over a vhost-user socket ([`VhostUserTransport`]),
//!   or to an in-process device ([`loopback::Loopback`]) for unit tests;
//! - [`host`]: [`VirtioMmcHost`], Linux's `mmc_host_ops` over virtio-mmc
//!   ([`MmcHostOps`](emmc_host::mmc::MmcHostOps)), plus raw requests and
//!   hand-made chains for tests;
//! - [`block`]: [`VirtioMmcBlk`], the block driver `MmcBlk` over it;
//! - [`daemon`]: starting the daemon for tests and the benchmark.

pub mod block;
pub mod daemon;
pub mod host;
pub mod loopback;
pub mod transport;

pub use block::{BlockError, VirtioMmcBlk};
pub use host::{RawData, RawDesc, RawResponse, VirtioMmcHost};
pub use transport::{Desc, Transport, TransportError, VhostUserOptions, VhostUserTransport};
