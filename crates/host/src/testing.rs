//! Helpers shared by emmc-host's own unit tests (`blkdrv/tests.rs`, `fault/tests.rs`,
//! `sdhci/tests.rs`) and, through the `test-support` feature, by the tests of the crates
//! above (`emmc-sim`'s `card_device_timing.rs`). Never part of a normal build.
//!
//! A module of this crate rather than part of the `emmc-test-support` crate: the helpers
//! take this crate's types, and its unit tests cannot use a helper crate that depends on
//! emmc-host (cargo would build a second emmc-host whose `MmcBlk` is another type).

use crate::blkdrv::{Advance, BlkCompletion, BlkData, MmcBlk};
use crate::mmc::{HostCaps, MmcHost, MmcHostOps, MMC_CMD23_ARG_REL_WR};
use crate::sdhci::{DmaSegment, MmcCommand, MmcData, MmcRequest, Sdhci, SdhciConfig};
use emmc_card::command::ResponseType;
use emmc_card::timing::Nanos;
use emmc_card::Card;

/// Runs the block driver until it goes idle, collecting every completion on the way;
/// panics if it never does.
pub fn drain<H: MmcHostOps, D: BlkData>(d: &mut MmcBlk<H, D>) -> Vec<BlkCompletion> {
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

/// A card brought up by the MMC core through the controller, handed to an `Sdhci`.
pub fn brought_up_with(card: Card, caps: &HostCaps, config: SdhciConfig) -> Sdhci {
    let mut host = MmcHost::with_config(card, config);
    host.mmc_init_card(caps).expect("bring-up");
    Sdhci {
        card: host.card,
        now: host.now,
        host: host.sdhci,
    }
}

pub fn r1(resp: ResponseType, opcode: u8, arg: u32) -> MmcCommand {
    MmcCommand::new(opcode, arg, resp)
}

/// How Linux's block driver asks for a write: CMD24 for one plain block, otherwise
/// CMD23 (+ flags) and CMD25, with a CMD12 stop for the error path.
pub fn write_request<'a, S: DmaSegment>(
    lba: u64,
    blocks: u32,
    reliable: bool,
    sg: &'a mut [S],
) -> MmcRequest<'a, S> {
    if blocks == 1 && !reliable {
        MmcRequest {
            sbc: None,
            cmd: r1(ResponseType::R1, 24, lba as u32),
            data: Some(MmcData::write(512, 1, sg)),
            stop: None,
        }
    } else {
        let flags = if reliable { MMC_CMD23_ARG_REL_WR } else { 0 };
        MmcRequest {
            sbc: Some(r1(ResponseType::R1, 23, blocks | flags)),
            cmd: r1(ResponseType::R1, 25, lba as u32),
            data: Some(MmcData::write(512, blocks, sg)),
            stop: Some(r1(ResponseType::R1b, 12, 0)),
        }
    }
}

/// CMD17 for one block, otherwise CMD23 + CMD18 (stop for the error path).
pub fn read_request<'a, S: DmaSegment>(
    lba: u64,
    blocks: u32,
    sg: &'a mut [S],
) -> MmcRequest<'a, S> {
    if blocks == 1 {
        MmcRequest {
            sbc: None,
            cmd: r1(ResponseType::R1, 17, lba as u32),
            data: Some(MmcData::read(512, 1, sg)),
            stop: None,
        }
    } else {
        MmcRequest {
            sbc: Some(r1(ResponseType::R1, 23, blocks)),
            cmd: r1(ResponseType::R1, 18, lba as u32),
            data: Some(MmcData::read(512, blocks, sg)),
            stop: Some(r1(ResponseType::R1, 12, 0)),
        }
    }
}
