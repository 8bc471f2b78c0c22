//! The virtio-mmc frontend: raw MMC requests over vhost-user, executed by the SDHCI host
//! model and the card (docs/virtio-mmc.md).
//!
//! `proto.rs` is the wire format, `request.rs` turns descriptor chains into checked
//! requests, `device.rs` executes them on the host and card in card time, `backend.rs`
//! is the `VhostUserBackend` (queues, configuration space, pacing) and `serve.rs` the
//! daemon entry point.

pub mod backend;
pub mod device;
pub mod proto;
pub mod request;
pub mod serve;
pub mod trace;

#[cfg(test)]
mod tests;
