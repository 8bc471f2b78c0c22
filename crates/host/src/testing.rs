//! Helpers shared by emmc-host's own unit tests (`blkdrv/tests.rs`, `fault/tests.rs`).
//!
//! A `#[cfg(test)]` module of this crate rather than part of the `emmc-test-support`
//! crate: the helpers take the block driver's types, and this crate's unit tests cannot
//! use a helper crate that depends on emmc-host (cargo would build a second emmc-host
//! whose `MmcBlk` is another type).

use crate::blkdrv::{Advance, BlkCompletion, BlkData, MmcBlk};
use crate::mmc::MmcHostOps;
use emmc_card::timing::Nanos;

/// Runs the block driver until it goes idle, collecting every completion on the way;
/// panics if it never does.
pub(crate) fn drain<H: MmcHostOps, D: BlkData>(d: &mut MmcBlk<H, D>) -> Vec<BlkCompletion> {
    let mut all = Vec::new();
    for _ in 0..100_000 {
        let s = d.advance(Nanos::MAX);
        all.extend(d.take_completions());
        if s == Advance::Idle {
            return all;
        }
    }
    panic!("the driver never went idle");
}
