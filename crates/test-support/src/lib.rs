//! emmc-test-support: rigs that the integration tests of several crates share, so that
//! each has one home (issue 13).
//!
//! - `rpmb`: RPMB frames (facts §11.3–§11.5) built and taken apart at the fact sheet's
//!   offsets and signed with HMAC-SHA256 from the `hmac` and `sha2` crates, for
//!   `crates/card/tests/card_rpmb.rs` and the virtio-mmc driver's scenarios
//!   (`guest-tests/virtio-mmc/tests/common`).
//!
//! It is a dev-only crate: it appears only under `[dev-dependencies]` (tests/layering.rs
//! fails if a crate links it), and it depends on none of the workspace's crates, so what a
//! test checks with it never comes from the code under test.
//!
//! Rigs for one crate's own unit tests do not live here: a crate's `#[cfg(test)]` code
//! cannot use a helper crate that depends on that crate (cargo builds a second copy whose
//! types do not match). Those are `#[cfg(test)] mod testing` inside the crate:
//! `emmc-frontend`'s mock-virtqueue rig, `emmc-host`'s block-driver `drain`.

pub mod rpmb;
