//! What the driver is configured with and what it reports: the host's capabilities and
//! queue limits ([`BlkConfig`]), the HPI and BKOPS policies, the retry budget
//! (`MMC_BLK_RETRY`), the errors a block request completes with, and the counters of what
//! the driver did.

use std::collections::BTreeMap;

use crate::iosched::{Elevator, MergeLimits};
use crate::mmc::{HostCaps, MmcError};
use crate::packing::{BlkOp, BlkRequest, PackingMode, PackingStats};
use emmc_card::timing::Nanos;
use serde::Serialize;

/// Linux retries a request this many times after errors it may retry (`MMC_BLK_RETRY`).
pub const MMC_BLK_RETRIES: u32 = 5;

/// HPI policy: when to interrupt the card for a read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HpiPolicy {
    /// Interrupt writes for reads at all (BKOPS is always interrupted when HPI is on).
    pub enabled: bool,
    /// Only writes of at least this many sectors (a packed write always qualifies).
    pub min_write_sectors: u32,
    /// Only once the read has waited this long (the "wait threshold" of seed 000's
    /// foreground HPI): an HPI at the very start of programming lands nothing, and the
    /// interrupted write comes back whole.
    pub min_wait_ns: Nanos,
}

impl Default for HpiPolicy {
    fn default() -> Self {
        HpiPolicy {
            enabled: false,
            min_write_sectors: 128,
            min_wait_ns: 5_000_000,
        }
    }
}

/// BKOPS policy: when to start background operations.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BkopsPolicy {
    pub enabled: bool,
    /// Start after the queue has been idle this long.
    pub idle_ns: Nanos,
    /// ... and BKOPS_STATUS is at least this level (1–3).
    pub min_level: u8,
}

impl Default for BkopsPolicy {
    fn default() -> Self {
        BkopsPolicy {
            enabled: true,
            idle_ns: 1_000_000_000,
            min_level: 1,
        }
    }
}

/// Everything the driver is configured with: host capabilities, queue limits, policies.
#[derive(Debug, Clone, PartialEq)]
pub struct BlkConfig {
    /// What bring-up may switch the card to and enable.
    pub caps: HostCaps,
    /// Write packing (MMC_CAP2_PACKED_WR, and MMC_CAP2_PACKED_WR_CONTROL for controlled).
    pub packing: PackingMode,
    /// Packed reads (MMC_CAP2_PACKED_RD) where the card has MAX_PACKED_READS.
    pub packed_reads: bool,
    /// Closed-ended transfers with CMD23 (MMC_BLK_CMD23); off: open-ended with CMD12.
    pub cmd23: bool,
    /// Two-deep pipeline: prepare the next request while one is on the bus.
    pub pipeline: bool,
    /// Host time to prepare one block request for the card.
    pub prepare_ns: Nanos,
    /// Queue limits: segments and sectors of one block request (the scheduler merges up
    /// to them; `max_sectors_kb`).
    pub max_segments: u32,
    pub max_sectors: u32,
    /// The host's largest MMC request in sectors (min of `max_blk_count` and
    /// `max_req_size`): what a packed command, header included, may hold.
    pub max_hw_sectors: u32,
    pub elevator: Elevator,
    /// The scheduler merges contiguous requests. Off when requests arrive already merged
    /// and must complete one by one (the vhost-user-blk frontend: the guest's block layer
    /// merged them).
    pub merge: bool,
    pub hpi: HpiPolicy,
    pub bkops: BkopsPolicy,
    /// Retries after errors that may be retried.
    pub retries: u32,
}

impl Default for BlkConfig {
    /// An SDHCI host as Linux drives it: 128 ADMA2 segments, 512 KiB requests, CMD23, the
    /// pipeline, no packing, CFQ.
    fn default() -> Self {
        BlkConfig {
            caps: HostCaps::default(),
            packing: PackingMode::Off,
            packed_reads: false,
            cmd23: true,
            pipeline: true,
            prepare_ns: 0,
            max_segments: 128,
            max_sectors: 1024,
            max_hw_sectors: 1024,
            elevator: Elevator::Cfq(Default::default()),
            merge: true,
            hpi: HpiPolicy::default(),
            bkops: BkopsPolicy::default(),
            retries: MMC_BLK_RETRIES,
        }
    }
}

impl BlkConfig {
    /// A configuration for the host of a device model's `[host]` section.
    pub fn for_model(host: &emmc_card::model::HostProfile) -> BlkConfig {
        let max_sectors = host.max_sectors_kb.saturating_mul(2).clamp(8, 65_535);
        BlkConfig {
            caps: HostCaps::for_model(host),
            prepare_ns: host.prepare_ns,
            max_sectors,
            max_hw_sectors: host.max_hw_sectors_kb.saturating_mul(2).clamp(8, 65_535),
            max_segments: host.max_segments.max(1),
            ..BlkConfig::default()
        }
    }

    /// The driver `serve` runs in front of the card (the vhost-user-blk transport) and
    /// the simulator measures through: the model's host with serve's policies: no
    /// packing, CFQ with Linux's defaults, and no merging (each virtio request completes
    /// on its own). One place, so the figures the calibration tests hold are the figures
    /// a guest gets.
    ///
    /// CFQ, not noop, because of where the requests wait (docs/host-driver.md, "serve's
    /// defaults and seed 000"). A guest's virtio-blk queue is as deep as its virtqueue
    /// (QEMU's vhost-user-blk: 128), so a guest's writeback sits in the daemon's
    /// scheduler, not in the guest's: the daemon's scheduler is where Linux's MMC stack
    /// had CFQ, above a queue thread that takes two requests. Noop keeps arrival order,
    /// and a guest's read waits behind every write it finds (1.8 MB/s in seed 000's
    /// parallel read and write, whatever packing does). CFQ tells them apart by what the
    /// daemon knows of a virtio request: a read is sync (a process waits for it), a
    /// write async (writeback; virtio-blk carries no sync flag); a read preempts the
    /// writes and waits only for those already in the driver, as in seed 000.
    ///
    /// Idling as Linux's CFQ idles on the MMC queue (non-rotational): after a read, CFQ
    /// waits up to 8 ms for the reader's next read before it serves the writes, but not
    /// for a *seeky* reader (more than 4 of its last 32 requests under 32 KiB). Without
    /// that rule a guest's QD1 random 4 KiB read/write mix on generic-emmc45 saw its
    /// 0.1-0.26 ms writes wait 8.06 ms each behind the idle window, since the daemon
    /// cannot tell the guest's direct writes (sync in the guest) from writeback.
    pub fn served(host: &emmc_card::model::HostProfile) -> BlkConfig {
        BlkConfig {
            packing: PackingMode::Off,
            elevator: Elevator::Cfq(Default::default()),
            merge: false,
            ..BlkConfig::for_model(host)
        }
    }

    pub(super) fn merge_limits(&self) -> MergeLimits {
        if !self.merge {
            return MergeLimits {
                max_sectors: 0,
                max_segments: 0,
            };
        }
        MergeLimits {
            max_sectors: u64::from(self.max_sectors),
            max_segments: u64::from(self.max_segments),
        }
    }
}

/// Why a block request failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BlkError {
    #[error("{sectors} sectors at {lba} are not inside the {size}-sector device")]
    OutOfRange { lba: u64, sectors: u32, size: u64 },
    #[error("{0:?} is not supported by this card")]
    NotSupported(BlkOp),
    #[error("MMC: {0}")]
    Mmc(#[from] MmcError),
    #[error("packed command failed: PACKED_COMMAND_STATUS {status:#04x}")]
    Packed { status: u8 },
}

/// A block request (or the part of one a partial completion covers) finished.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BlkCompletion {
    /// The request; `lba` and `sectors` say which part completed.
    pub req: BlkRequest,
    /// Card time of the completion.
    pub at: Nanos,
    pub result: Result<(), BlkError>,
}

/// Counters of what the driver did.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct BlkStats {
    /// Seed 000's write packing statistics: every packed-list build for a write with
    /// packing enabled (1 = nothing joined it), and why it stopped.
    pub write_packing: PackingStats,
    /// The same for packed reads.
    pub read_packing: PackingStats,
    /// MMC data requests sent (a packed command counts once, a packed read twice).
    pub mmc_requests: u64,
    pub packed_writes: u64,
    pub packed_reads: u64,
    /// Write requests fetched between two reads (blktrace's "writes before a read").
    pub writes_before_read: BTreeMap<u32, u64>,
    pub hpi: u64,
    /// Sectors handed back to the scheduler after HPI.
    pub hpi_requeued_sectors: u64,
    pub bkops_started: u64,
    pub bkops_urgent: u64,
    pub flushes: u64,
    pub erases: u64,
    /// Reliable-write MMC requests (legacy splits count each piece).
    pub reliable_writes: u64,
    pub retries: u64,
    pub failed: u64,
    /// Card re-initialisations after it stopped answering (`mmc_blk_reset`).
    pub resets: u64,
    /// MMC reads and writes whose data went straight between the card and the request's
    /// own memory ([`super::BlkData::read_target`], [`super::BlkData::write_source`]),
    /// not through the driver's buffer.
    pub in_place: u64,
}
