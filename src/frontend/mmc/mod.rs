//! The virtio-mmc frontend: raw MMC requests over vhost-user, executed by the SDHCI host
//! model and the card (docs/virtio-mmc.md).

pub mod proto;
