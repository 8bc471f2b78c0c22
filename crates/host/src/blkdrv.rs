//! The MMC block driver inside the backend: what Linux's `drivers/mmc/card/block.c` and
//! `queue.c` (v3.7–v4.10, the releases with packed commands) do between block requests
//! and MMC requests, named so the two read side by side.
//!
//! - **Bring-up** by capability ([`mmc_init_card`]): bus width and timing within the
//!   host's capabilities, cache on, HPI, BKOPS and the packed-failure event when the card
//!   supports them.
//! - **Request queue** (`mmc_queue`): block requests go through an I/O scheduler
//!   ([`Elevator`]) that merges them up to the queue limits; the queue thread fetches them
//!   (`blk_fetch_request`) and runs a **two-deep pipeline**: while one MMC request is on
//!   the bus, the next is fetched and prepared (`prepare_ns`, the host's per-request work:
//!   block layer, `mmc_blk_rw_rq_prep`, DMA mapping), so preparation overlaps the
//!   previous transfer (seed 001). When a fetch finds nothing, the thread waits for the
//!   request on the bus before fetching again (v3.7–3.9 behaviour).
//! - **Reads and writes** (`mmc_blk_rw_rq_prep`): CMD23-bounded CMD18/CMD25 (CMD17/CMD24
//!   for one block), or open-ended with CMD12 when `cmd23` is off; after a write, busy is
//!   waited for and CMD13 checks the status (`mmc_blk_err_check`).
//! - **FUA** as reliable write (CMD23 bit 31) when the card has it: enhanced reliable write
//!   takes any request; the legacy rule (`mmc_apply_rel_rw`) splits it: an address not
//!   aligned to REL_WR_SEC_C goes one block at a time, more than REL_WR_SEC_C blocks go in
//!   REL_WR_SEC_C pieces, fewer in single blocks — each piece its own MMC request. Without
//!   reliable write (or without CMD23) a FUA write is followed by FLUSH_CACHE.
//! - **Flush** as CMD6 FLUSH_CACHE when the cache is on.
//! - **Discard** (`mmc_blk_issue_discard_rq`): CMD35/36/38 with the 4.5 discard argument,
//!   else trim, else erase — erase shrunk to whole erase groups (`mmc_erase`); every
//!   CMD38 covers at most the groups whose time-out fits the host's busy time-out.
//!   **Secure erase**: secure trim (steps 1 and 2) when the card trims and the range is not
//!   group-aligned, else secure erase; refused when the card has no secure erase.
//!   **Write zeroes**: trim when erased memory reads 0 and the card trims, else written.
//! - **Packing** ([`prep_packed_list`]) with write packing control off / always /
//!   controlled, packed writes (one CMD23+CMD25 with a header) and, when the host allows,
//!   packed reads (header by CMD25, data by CMD18); statistics as seed 000's.
//! - **HPI policy**: when a read arrives while the card is programming a long write or a
//!   packed write, or any request arrives during BKOPS, send HPI (after a CMD13 finds the
//!   card in prg), read CORRECTLY_PRG_SECTORS_NUM, complete what landed and give the rest
//!   back to the scheduler as a new request.
//! - **BKOPS policy**: after the queue has been idle for `idle_ns`, read BKOPS_STATUS and
//!   start BKOPS (without waiting) at `min_level` or above; a request arriving stops it with
//!   HPI. An URGENT_BKOPS exception (R1 bit 6, then EXCEPTION_EVENTS_STATUS) runs BKOPS to
//!   completion before the next request, as Linux's `mmc_start_bkops(card, true)`.
//! - **Errors** (`mmc_blk_cmd_recovery`): after a controller error, CMD13 and, if the card
//!   is still in data/rcv, CMD12; the request is retried up to `retries` times, then
//!   completed with an error. R1 error bits fail it at once. A packed failure completes
//!   the entries before PACKED_FAILURE_INDEX and retries from it.
//!
//! The policies are written against [`MmcHostOps`], so the same code drives the in-process
//! SDHCI model ([`crate::mmc::MmcHost`]) and any other transport of MMC requests.
//! The driver runs in card time: [`MmcBlk::advance`] moves it forward to a given instant,
//! stopping early when block requests complete, so a simulator can interleave processes
//! with it.

use std::cell::RefCell;
use std::collections::BTreeMap;

use serde::Serialize;

use super::iosched::{Elevator, IoScheduler, MergeLimits};
use super::mmc::{
    check_r1, completion_result, mmc_get_ext_csd, mmc_init_card, mmc_send_status, mmc_switch,
    mmc_switch_nowait, r1_state, HostCaps, MmcCard, MmcError, MmcHostOps, MMC_CMD23_ARG_PACKED,
    MMC_CMD23_ARG_REL_WR, MMC_RCA,
};
use super::packing::{
    prep_packed_list, BlkOp, BlkRequest, PackLimits, PackedList, PackingMode, PackingStats,
    StopReason, WritePackingControl,
};
use super::sdhci::{MmcCommand, MmcData, MmcRequest, ResponseType, SdhciCompletion, SdhciError};
use emmc_card::ext_csd as ext;
use emmc_card::packed;
use emmc_card::timing::Nanos;
use emmc_card::{r1, CardState};

/// CMD38 arguments (facts §1c).
const MMC_ERASE_ARG: u32 = 0x0000_0000;
const MMC_TRIM_ARG: u32 = 0x0000_0001;
const MMC_DISCARD_ARG: u32 = 0x0000_0003;
const MMC_SECURE_ERASE_ARG: u32 = 0x8000_0000;
const MMC_SECURE_TRIM1_ARG: u32 = 0x8000_0001;
const MMC_SECURE_TRIM2_ARG: u32 = 0x8000_8000;

/// Linux's erase time-out unit (`mmc_mmc_erase_timeout`: 300 ms × multiplier × groups).
const ERASE_TIMEOUT_UNIT_MS: u64 = 300;
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

    fn merge_limits(&self) -> MergeLimits {
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

/// How [`MmcBlk::advance`] stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Advance {
    /// Completions are waiting in [`MmcBlk::take_completions`].
    Completed,
    /// Card time reached the instant asked for.
    Reached,
    /// Nothing to do until a new request arrives; time did not move.
    Idle,
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
}

/// Card features the driver uses, decoded once from the EXT_CSD (`mmc_blk_alloc_req`).
#[derive(Debug, Clone, Copy)]
struct Features {
    sectors: u64,
    cache: bool,
    hpi: bool,
    hpi_cmd12: bool,
    bkops: bool,
    /// MMC_BLK_REL_WR, and WR_REL_PARAM.EN_REL_WR.
    rel_wr: bool,
    enhanced_rel_wr: bool,
    rel_sectors: u32,
    /// Packed commands usable at all (4.5 minimums, event enabled).
    packed: bool,
    erase_group: u64,
    can_trim: bool,
    can_discard: bool,
    can_secure_erase: bool,
    erased_zero: bool,
    erase_timeout_mult: u64,
    trim_mult: u64,
    sec_erase_mult: u64,
    sec_trim_mult: u64,
}

impl Features {
    fn new(card: &MmcCard, caps: &HostCaps) -> Features {
        let e = &card.ext_csd;
        let rel_sectors = u32::from(e[ext::REL_WR_SEC_C]);
        let enhanced_rel_wr = e[ext::WR_REL_PARAM] & ext::EN_REL_WR != 0;
        let sec = e[ext::SEC_FEATURE_SUPPORT];
        let hc_group = u64::from(e[ext::HC_ERASE_GRP_SIZE]) * 1024;
        Features {
            sectors: card.sectors(),
            cache: e[ext::CACHE_CTRL] & ext::CACHE_EN != 0,
            hpi: e[ext::HPI_MGMT] & ext::HPI_EN != 0,
            hpi_cmd12: e[ext::HPI_FEATURES] & ext::HPI_IMPLEMENTATION_CMD12 != 0,
            bkops: e[ext::BKOPS_EN] & ext::BKOPS_MANUAL_EN != 0,
            rel_wr: enhanced_rel_wr || rel_sectors > 0,
            enhanced_rel_wr,
            rel_sectors: rel_sectors.max(1),
            packed: e[ext::MAX_PACKED_WRITES] >= 3
                && e[ext::MAX_PACKED_READS] >= 5
                && caps.packed_event
                && e[ext::EXCEPTION_EVENTS_CTRL] & ext::EE_PACKED_FAILURE as u8 != 0,
            erase_group: hc_group.max(1),
            can_trim: sec & ext::SEC_GB_CL_EN != 0,
            can_discard: e[ext::EXT_CSD_REV] >= 6,
            can_secure_erase: sec & ext::SECURE_ER_EN != 0,
            erased_zero: e[ext::ERASED_MEM_CONT] == 0,
            erase_timeout_mult: u64::from(e[ext::ERASE_TIMEOUT_MULT]).max(1),
            trim_mult: u64::from(e[ext::TRIM_MULT]).max(1),
            sec_erase_mult: u64::from(e[ext::SEC_ERASE_MULT]).max(1),
            sec_trim_mult: u64::from(e[ext::SEC_TRIM_MULT]).max(1),
        }
    }
}

/// Work the queue thread took from the scheduler.
#[derive(Debug, Clone)]
enum Work {
    /// One read or write; `done` sectors of it have completed (legacy reliable-write
    /// pieces), `retries` counts errors so far.
    Rw {
        req: BlkRequest,
        done: u32,
        retries: u32,
    },
    /// A packed read or write of two or more requests.
    Packed { reqs: Vec<BlkRequest>, retries: u32 },
    /// Flush, discard, secure erase, write zeroes: run synchronously.
    Special(BlkRequest),
}

impl Work {
    fn is_special(&self) -> bool {
        matches!(self, Work::Special(_))
    }
}

#[derive(Debug)]
struct Prepared {
    work: Work,
    /// When the queue thread fetched it, and when its preparation is done.
    fetched_at: Nanos,
    ready_at: Nanos,
}

/// What is on the card now.
#[derive(Debug)]
enum Active {
    /// A read/write MMC request whose data phase is over; `sectors` of `work` are in it.
    Rw {
        work: Work,
        sectors: u32,
        /// The card still holds busy (programming).
        busy: bool,
        /// R1 of the command, checked when the request finishes.
        done: SdhciCompletion,
    },
    /// BKOPS started without waiting.
    Bkops,
}

/// The MMC block driver: a card behind an [`MmcHostOps`], its request queue and policies,
/// moving request data through `D`.
pub struct MmcBlk<H: MmcHostOps, D: BlkData = NoData> {
    host: H,
    data: D,
    card: MmcCard,
    cfg: BlkConfig,
    f: Features,
    sched: Box<dyn IoScheduler>,
    wpc: WritePackingControl,
    limits: PackLimits,
    cur: Option<Prepared>,
    active: Option<Active>,
    completions: Vec<BlkCompletion>,
    /// When the queue last went idle (nothing queued, prepared or on the card).
    idle_since: Option<Nanos>,
    bkops_checked: bool,
    urgent_bkops: bool,
    /// Earliest arrival of a read not yet fetched, and of any request, while the card
    /// was busy (for HPI).
    read_since: Option<Nanos>,
    any_since: Option<Nanos>,
    /// The prepared request already had its HPI.
    hpi_done_for_cur: bool,
    writes_since_read: u32,
    /// The card was reset for an error and no request has succeeded since: a second
    /// failure does not reset it again (Linux's `md->reset_done`).
    reset_done: bool,
    stats: BlkStats,
    /// Write data: room for a 512-byte packed header followed by the data.
    wbuf: Vec<u8>,
    rbuf: Vec<u8>,
}

/// Where the data of block requests comes from and goes to. A request is identified by
/// its `id` (pieces of one request share it: queue splits, HPI remainders) and the data
/// by sector, so an implementation maps `(id, lba)` to its buffers.
pub trait BlkData {
    /// Fill `buf` with the data to write for `req`'s sectors from `lba` on.
    fn write_data(&mut self, req: &BlkRequest, lba: u64, buf: &mut [u8]);
    /// `buf` holds what the card returned for `req`'s sectors from `lba` on.
    fn read_data(&mut self, req: &BlkRequest, lba: u64, buf: &[u8]);
}

/// No data: writes carry zeroes and reads are dropped (the simulator's store keeps no
/// data anyway).
#[derive(Debug, Clone, Copy, Default)]
pub struct NoData;

impl BlkData for NoData {
    fn write_data(&mut self, _req: &BlkRequest, _lba: u64, buf: &mut [u8]) {
        buf.fill(0);
    }

    fn read_data(&mut self, _req: &BlkRequest, _lba: u64, _buf: &[u8]) {}
}

/// CMD13 and its R1 as the card sent it, error bits included (`get_card_status`).
fn mmc_get_status<H: MmcHostOps>(host: &mut H) -> Result<u32, MmcError> {
    let cmd = MmcCommand::new(13, u32::from(MMC_RCA) << 16, ResponseType::R1);
    super::mmc::mmc_wait_for_cmd(host, cmd).map(|r| r[0])
}

/// The data buffer size for requests up to `sectors` (plus a header block).
fn buf_len(sectors: u32) -> usize {
    (sectors as usize + 1) * 512
}

impl<H: MmcHostOps> MmcBlk<H, NoData> {
    /// `mmc_blk_probe`: bring the card up with `cfg.caps` and set up the queue; requests
    /// carry no data.
    pub fn probe(host: H, cfg: BlkConfig) -> Result<MmcBlk<H>, MmcError> {
        MmcBlk::probe_with_data(host, cfg, NoData)
    }
}

impl<H: MmcHostOps, D: BlkData> MmcBlk<H, D> {
    /// `mmc_blk_probe` with request data moved through `data`.
    pub fn probe_with_data(mut host: H, cfg: BlkConfig, data: D) -> Result<Self, MmcError> {
        let card = mmc_init_card(&mut host, &cfg.caps)?;
        let (f, limits, packing) = Self::setup(&card, &cfg);
        let sched = cfg.elevator.build(cfg.merge_limits());
        Self::log_setup(&f, packing, sched.name());
        let now = host.now();
        let max = cfg.max_hw_sectors.max(cfg.max_sectors);
        Ok(MmcBlk {
            host,
            data,
            card,
            wpc: WritePackingControl::new(packing),
            cfg,
            f,
            sched,
            limits,
            cur: None,
            active: None,
            completions: Vec::new(),
            idle_since: Some(now),
            bkops_checked: false,
            urgent_bkops: false,
            read_since: None,
            any_since: None,
            hpi_done_for_cur: false,
            writes_since_read: 0,
            reset_done: false,
            stats: BlkStats::default(),
            wbuf: vec![0; buf_len(max)],
            rbuf: vec![0; buf_len(max)],
        })
    }

    /// The card was power-cycled under the driver (its host went away and a new one
    /// came): bring it up again and start over with an empty queue, as a new probe would.
    /// Requests in the queue are dropped without completions.
    pub fn reprobe(&mut self) -> Result<(), MmcError> {
        self.card = mmc_init_card(&mut self.host, &self.cfg.caps)?;
        let (f, limits, packing) = Self::setup(&self.card, &self.cfg);
        self.sched = self.cfg.elevator.build(self.cfg.merge_limits());
        Self::log_setup(&f, packing, self.sched.name());
        self.f = f;
        self.limits = limits;
        self.wpc = WritePackingControl::new(packing);
        self.cur = None;
        self.active = None;
        self.completions.clear();
        self.idle_since = Some(self.host.now());
        self.bkops_checked = false;
        self.urgent_bkops = false;
        self.read_since = None;
        self.any_since = None;
        self.hpi_done_for_cur = false;
        self.writes_since_read = 0;
        self.stats = BlkStats::default();
        Ok(())
    }

    /// What the card and the configuration allow: features, packing limits and mode.
    fn setup(card: &MmcCard, cfg: &BlkConfig) -> (Features, PackLimits, PackingMode) {
        let f = Features::new(card, &cfg.caps);
        let e = &card.ext_csd;
        let packing = if f.packed && cfg.cmd23 {
            cfg.packing
        } else {
            PackingMode::Off
        };
        let limits = PackLimits {
            max_packed_writes: usize::from(e[ext::MAX_PACKED_WRITES]),
            max_packed_reads: if cfg.packed_reads {
                usize::from(e[ext::MAX_PACKED_READS])
            } else {
                0
            },
            // The header block and its segment count against the host's limits.
            max_sectors: u64::from(cfg.max_hw_sectors.saturating_sub(1)),
            max_segments: u64::from(cfg.max_segments.saturating_sub(1)),
            enhanced_reliable_write: f.enhanced_rel_wr,
            native_4k: e[ext::DATA_SECTOR_SIZE] == 1,
        };
        (f, limits, packing)
    }

    fn log_setup(f: &Features, packing: PackingMode, scheduler: &str) {
        log::info!(
            "mmcblk: {} sectors, cache {}, HPI {}, BKOPS {}, reliable write {}, packing {:?}, {}",
            f.sectors,
            f.cache,
            f.hpi,
            f.bkops,
            if f.enhanced_rel_wr {
                "enhanced"
            } else if f.rel_wr {
                "legacy"
            } else {
                "none"
            },
            packing,
            scheduler
        );
    }

    /// The data path.
    pub fn data(&self) -> &D {
        &self.data
    }

    pub fn data_mut(&mut self) -> &mut D {
        &mut self.data
    }

    pub fn host(&self) -> &H {
        &self.host
    }

    pub fn host_mut(&mut self) -> &mut H {
        &mut self.host
    }

    pub fn card(&self) -> &MmcCard {
        &self.card
    }

    pub fn config(&self) -> &BlkConfig {
        &self.cfg
    }

    pub fn stats(&self) -> &BlkStats {
        &self.stats
    }

    /// The write packing control state (seed 000's counters).
    pub fn packing_control(&self) -> &WritePackingControl {
        &self.wpc
    }

    /// Device size in sectors.
    pub fn sectors(&self) -> u64 {
        self.f.sectors
    }

    pub fn now(&self) -> Nanos {
        self.host.now()
    }

    /// Requests queued in the scheduler, prepared or on the card.
    pub fn in_progress(&self) -> bool {
        !self.sched.is_empty()
            || self.cur.is_some()
            || matches!(self.active, Some(Active::Rw { .. }))
    }

    /// Completions since the last call.
    pub fn take_completions(&mut self) -> Vec<BlkCompletion> {
        std::mem::take(&mut self.completions)
    }

    fn fail(&mut self, req: BlkRequest, at: Nanos, e: BlkError) {
        log::debug!("mmcblk: request {} failed: {e}", req.id);
        self.stats.failed += 1;
        self.completions.push(BlkCompletion {
            req,
            at,
            result: Err(e),
        });
    }

    fn complete(&mut self, req: BlkRequest, at: Nanos) {
        // `mmc_blk_reset_success`: the card works again; a later error may reset it.
        self.reset_done = false;
        self.completions.push(BlkCompletion {
            req,
            at,
            result: Ok(()),
        });
    }

    /// A block request arrives at card time `now` (`blk_queue_bio`): checked, split to
    /// the queue limits, handed to the scheduler. A request the device cannot hold
    /// completes at once with an error.
    pub fn submit(&mut self, req: BlkRequest, now: Nanos) {
        let data = req.op != BlkOp::Flush;
        let inside = req
            .lba
            .checked_add(u64::from(req.sectors))
            .is_some_and(|end| end <= self.f.sectors);
        if data && (req.sectors == 0 || !inside) {
            let size = self.f.sectors;
            self.fail(
                req,
                now,
                BlkError::OutOfRange {
                    lba: req.lba,
                    sectors: req.sectors,
                    size,
                },
            );
            return;
        }
        self.idle_since = None;
        self.bkops_checked = false;
        self.any_since.get_or_insert(now);
        if req.op.is_read() {
            self.read_since.get_or_insert(now);
        }
        let split = matches!(req.op, BlkOp::Read | BlkOp::Write);
        if !split || req.sectors <= self.cfg.max_sectors {
            self.sched.add(req, now);
            return;
        }
        // blk_queue_split: pieces of at most max_sectors, each completing on its own
        // (they keep the request's id; their sectors tell them apart).
        let mut lba = req.lba;
        let mut left = req.sectors;
        while left > 0 {
            let n = left.min(self.cfg.max_sectors);
            self.sched.add(
                BlkRequest {
                    lba,
                    sectors: n,
                    segments: n.div_ceil(8).max(1),
                    ..req
                },
                now,
            );
            lba += u64::from(n);
            left -= n;
        }
    }

    /// Run the driver up to card time `until`. Stops early when requests complete
    /// ([`Advance::Completed`]) or when there is nothing to do ([`Advance::Idle`]). A
    /// transfer that cannot be interrupted may carry card time past `until`.
    pub fn advance(&mut self, until: Nanos) -> Advance {
        loop {
            if !self.completions.is_empty() {
                return Advance::Completed;
            }
            if let Some(active) = &self.active {
                let busy = match active {
                    Active::Rw { busy, .. } => *busy,
                    Active::Bkops => true,
                };
                if busy {
                    if let Some(t) = self.hpi_due(until) {
                        let at = t.max(self.host.now());
                        if !self.host.wait_busy_until(Some(at)) {
                            self.interrupt();
                            continue;
                        }
                    } else if !self.host.wait_busy_until(Some(until)) {
                        return Advance::Reached;
                    }
                }
                self.finish_active();
                continue;
            }
            if self.urgent_bkops {
                self.urgent_bkops = false;
                self.run_urgent_bkops();
                continue;
            }
            if let Some(cur) = &self.cur {
                if cur.ready_at > until {
                    self.host.idle_until(until);
                    return Advance::Reached;
                }
                let ready = cur.ready_at;
                self.host.idle_until(ready);
                let cur = self.cur.take().expect("checked");
                let start = self.host.now();
                let special = cur.work.is_special();
                self.start(cur.work);
                if self.cfg.pipeline && !special && self.active.is_some() {
                    self.fetch(start);
                }
                continue;
            }
            let now = self.host.now();
            if now > until {
                return Advance::Reached;
            }
            if self.fetch(now) {
                continue;
            }
            if let Some(t) = self.sched.next_event(now) {
                if t <= until {
                    self.host.idle_until(t.max(now));
                    continue;
                }
                self.host.idle_until(until);
                return Advance::Reached;
            }
            if !self.sched.is_empty() {
                // Requests the scheduler holds back until a completion; nothing is in
                // flight, so fetch them anyway (a scheduler must not stall an idle queue).
                log::warn!(
                    "mmcblk: scheduler holds {} requests on an idle queue",
                    self.sched.len()
                );
                if let Some(req) = self.sched.dispatch(Nanos::MAX) {
                    self.prepare_fetched(req, now);
                    continue;
                }
            }
            let idle_since = *self.idle_since.get_or_insert(now);
            if let Some(t) = self.bkops_check_due(idle_since) {
                if t <= until {
                    self.host.idle_until(t);
                    self.idle_bkops();
                    continue;
                }
            }
            if until == Nanos::MAX {
                return Advance::Idle;
            }
            self.host.idle_until(until);
            return Advance::Reached;
        }
    }

    /// The card time at which [`MmcBlk::advance`] would next have something to do on its
    /// own, without a new request: the end of the card's busy, a prepared request being
    /// ready, an HPI falling due, the scheduler's timer, the idle BKOPS check. `None` when
    /// only a new request can wake it. A caller running in real time advances to now,
    /// then sleeps until this.
    pub fn next_event(&self) -> Option<Nanos> {
        let now = self.host.now();
        if !self.completions.is_empty() || self.urgent_bkops {
            return Some(now);
        }
        if self.active.is_some() {
            let busy_end = self.host.busy_until().unwrap_or(now);
            let hpi = self.hpi_due(Nanos::MAX).unwrap_or(Nanos::MAX);
            return Some(busy_end.min(hpi).max(now));
        }
        if let Some(cur) = &self.cur {
            return Some(cur.ready_at.max(now));
        }
        if !self.sched.is_empty() {
            return Some(self.sched.next_event(now).unwrap_or(now).max(now));
        }
        let idle_since = self.idle_since.unwrap_or(now);
        self.bkops_check_due(idle_since).map(|t| t.max(now))
    }

    // ---- fetching and preparing --------------------------------------------------------

    /// `blk_fetch_request` at card time `at`, the packing decision, and preparation.
    fn fetch(&mut self, at: Nanos) -> bool {
        let Some(req) = self.sched.dispatch(at) else {
            self.wpc.on_fetch(None);
            return false;
        };
        self.prepare_fetched(req, at);
        true
    }

    fn note_fetched(&mut self, req: &BlkRequest) {
        match req.op {
            BlkOp::Read => {
                *self
                    .stats
                    .writes_before_read
                    .entry(self.writes_since_read)
                    .or_default() += 1;
                self.writes_since_read = 0;
            }
            BlkOp::Write => self.writes_since_read += 1,
            _ => {}
        }
    }

    fn prepare_fetched(&mut self, req: BlkRequest, at: Nanos) {
        self.wpc.on_fetch(Some(&req));
        self.note_fetched(&req);
        let work = match req.op {
            BlkOp::Read | BlkOp::Write => {
                let sched = RefCell::new(&mut self.sched);
                let list = prep_packed_list(
                    req,
                    &self.limits,
                    &mut self.wpc,
                    &mut || sched.borrow_mut().dispatch(at),
                    &mut |r| sched.borrow_mut().requeue(r),
                );
                self.record_packing(&list);
                for r in &list.requests[1..] {
                    self.note_fetched(r);
                }
                if list.requests.len() > 1 {
                    Work::Packed {
                        reqs: list.requests,
                        retries: 0,
                    }
                } else {
                    Work::Rw {
                        req,
                        done: 0,
                        retries: 0,
                    }
                }
            }
            _ => Work::Special(req),
        };
        if !self.sched.has_queued_read() {
            self.read_since = None;
        }
        if self.sched.is_empty() {
            self.any_since = None;
        }
        let entries = match &work {
            Work::Packed { reqs, .. } => reqs.len() as u64,
            _ => 1,
        };
        self.hpi_done_for_cur = false;
        self.cur = Some(Prepared {
            work,
            fetched_at: at,
            ready_at: at.saturating_add(self.cfg.prepare_ns.saturating_mul(entries)),
        });
    }

    /// Seed 000 counted every list build that got past the checks that disable packing.
    fn record_packing(&mut self, list: &PackedList) {
        if matches!(list.stop, StopReason::NotEnabled | StopReason::NotPackable) {
            return;
        }
        if list.requests[0].op.is_read() {
            self.stats.read_packing.record(list);
        } else {
            self.stats.write_packing.record(list);
        }
    }

    // ---- issuing -----------------------------------------------------------------------

    /// Start prepared work on the card.
    fn start(&mut self, work: Work) {
        match work {
            Work::Special(req) => self.issue_special(req),
            Work::Rw { .. } => self.start_rw(work),
            Work::Packed { .. } => self.start_packed(work),
        }
    }

    /// How many sectors of a (remaining) write go in the next MMC request: all of them,
    /// or a legacy reliable-write piece (`mmc_apply_rel_rw`).
    fn piece(&self, req: &BlkRequest, lba: u64, left: u32) -> u32 {
        let rel = req.op == BlkOp::Write && req.fua && self.f.rel_wr && self.cfg.cmd23;
        if !rel || self.f.enhanced_rel_wr {
            return left;
        }
        let rs = self.f.rel_sectors;
        if lba % u64::from(rs) != 0 {
            1
        } else if left > rs {
            rs
        } else if left < rs {
            1
        } else {
            left
        }
    }

    fn start_rw(&mut self, work: Work) {
        let Work::Rw { req, done, .. } = work else {
            unreachable!("start_rw takes Rw work")
        };
        let lba = req.lba + u64::from(done);
        let left = req.sectors - done;
        let n = self.piece(&req, lba, left);
        let write = req.op == BlkOp::Write;
        let rel = write && req.fua && self.f.rel_wr && self.cfg.cmd23;
        let address = self.card.address(lba);
        let multi = n > 1 || rel;
        let len = n as usize * 512;
        let (sbc, cmd, stop) = if multi && self.cfg.cmd23 {
            let flags = if rel { MMC_CMD23_ARG_REL_WR } else { 0 };
            let opcode = if write { 25 } else { 18 };
            (
                Some(MmcCommand::new(23, n | flags, ResponseType::R1)),
                MmcCommand::new(opcode, address, ResponseType::R1),
                Some(MmcCommand::new(
                    12,
                    0,
                    if write {
                        ResponseType::R1b
                    } else {
                        ResponseType::R1
                    },
                )),
            )
        } else if multi {
            let opcode = if write { 25 } else { 18 };
            (
                None,
                MmcCommand::new(opcode, address, ResponseType::R1),
                Some(MmcCommand::new(
                    12,
                    0,
                    if write {
                        ResponseType::R1b
                    } else {
                        ResponseType::R1
                    },
                )),
            )
        } else {
            let opcode = if write { 24 } else { 17 };
            (
                None,
                MmcCommand::new(opcode, address, ResponseType::R1),
                None,
            )
        };
        if rel {
            self.stats.reliable_writes += 1;
        }
        self.stats.mmc_requests += 1;
        let done_c = if write {
            self.data
                .write_data(&req, lba, &mut self.wbuf[512..512 + len]);
            let mut sg = [&self.wbuf[512..512 + len]];
            self.host.start_request(MmcRequest {
                sbc,
                cmd,
                data: Some(MmcData::write(512, n, &mut sg)),
                stop,
            })
        } else {
            let mut sg = [&mut self.rbuf[..len]];
            self.host.start_request(MmcRequest {
                sbc,
                cmd,
                data: Some(MmcData::read(512, n, &mut sg)),
                stop,
            })
        };
        let busy = done_c.busy_pending;
        self.active = Some(Active::Rw {
            work,
            sectors: n,
            busy,
            done: done_c,
        });
    }

    fn start_packed(&mut self, work: Work) {
        let Work::Packed { reqs, .. } = &work else {
            unreachable!("start_packed takes Packed work")
        };
        let write = reqs[0].op == BlkOp::Write;
        let total: u32 = reqs.iter().map(|r| r.sectors).sum();
        let header = packed::Header {
            direction: if write {
                packed::Direction::Write
            } else {
                packed::Direction::Read
            },
            entries: reqs
                .iter()
                .map(|r| {
                    packed::Entry::new(
                        r.sectors as u16,
                        self.card.address(r.lba),
                        write && r.fua && self.f.rel_wr,
                    )
                })
                .collect(),
        };
        self.wbuf[..512].copy_from_slice(&header.encode());
        if write {
            let mut at = 512;
            for r in reqs {
                let len = r.sectors as usize * 512;
                self.data.write_data(r, r.lba, &mut self.wbuf[at..at + len]);
                at += len;
            }
        }
        let address = self.card.address(reqs[0].lba);
        self.stats.mmc_requests += 1;
        let done = if write {
            self.stats.packed_writes += 1;
            let blocks = total + 1;
            let mut sg = [&self.wbuf[..blocks as usize * 512]];
            self.host.start_request(MmcRequest {
                sbc: Some(MmcCommand::new(
                    23,
                    MMC_CMD23_ARG_PACKED | blocks,
                    ResponseType::R1,
                )),
                cmd: MmcCommand::new(25, address, ResponseType::R1),
                data: Some(MmcData::write(512, blocks, &mut sg)),
                stop: Some(MmcCommand::new(12, 0, ResponseType::R1b)),
            })
        } else {
            // Packed read: the header by CMD25, then the entries by CMD18 (facts §7.4).
            self.stats.packed_reads += 1;
            self.stats.mmc_requests += 1;
            let mut sg = [&self.wbuf[..512]];
            let h = self.host.request(MmcRequest {
                sbc: Some(MmcCommand::new(
                    23,
                    MMC_CMD23_ARG_PACKED | 1,
                    ResponseType::R1,
                )),
                cmd: MmcCommand::new(25, address, ResponseType::R1),
                data: Some(MmcData::write(512, 1, &mut sg)),
                stop: Some(MmcCommand::new(12, 0, ResponseType::R1b)),
            });
            if completion_result(&h).is_err() {
                h
            } else {
                let len = total as usize * 512;
                let mut sg = [&mut self.rbuf[..len]];
                self.host.start_request(MmcRequest {
                    sbc: Some(MmcCommand::new(
                        23,
                        MMC_CMD23_ARG_PACKED | total,
                        ResponseType::R1,
                    )),
                    cmd: MmcCommand::new(18, address, ResponseType::R1),
                    data: Some(MmcData::read(512, total, &mut sg)),
                    stop: Some(MmcCommand::new(12, 0, ResponseType::R1)),
                })
            }
        };
        let busy = done.busy_pending;
        self.active = Some(Active::Rw {
            work,
            sectors: total,
            busy,
            done,
        });
    }

    // ---- finishing ---------------------------------------------------------------------

    /// The request on the card is done (busy over): check it, complete or retry.
    fn finish_active(&mut self) {
        let Some(active) = self.active.take() else {
            return;
        };
        let (work, sectors, done) = match active {
            Active::Bkops => {
                log::debug!("mmcblk: BKOPS finished");
                return;
            }
            Active::Rw {
                work,
                sectors,
                done,
                ..
            } => (work, sectors, done),
        };
        let write = match &work {
            Work::Rw { req, .. } => req.op == BlkOp::Write,
            Work::Packed { reqs, .. } => reqs[0].op == BlkOp::Write,
            Work::Special(_) => false,
        };
        if let Err(e) = completion_result(&done) {
            // mmc_blk_err_check: error bits in the command's own R1 (an address error, a
            // refused command) abort the request whatever the data phase did: no data
            // moved, and a retry would be refused again.
            let e = if done.cmd.ok() && done.cmd.resp[0] & r1::ERRORS != 0 {
                MmcError::Status {
                    cmd: done.cmd.opcode,
                    status: done.cmd.resp[0],
                }
            } else {
                e
            };
            self.rw_error(work, e);
            return;
        }
        // mmc_blk_err_check: after a write the card must be back in tran and ready; the
        // R1 of a read's command tells of exceptions too.
        let status = if write {
            match mmc_get_status(&mut self.host) {
                Ok(s) => s,
                Err(e) => {
                    self.rw_error(work, e);
                    return;
                }
            }
        } else {
            done.cmd.resp[0] & !r1::ERRORS
        };
        let packed_failure = self.check_exception(status, matches!(work, Work::Packed { .. }));
        if let (Some((pstatus, index)), Work::Packed { reqs, retries }) = (packed_failure, &work) {
            self.packed_failed(reqs.clone(), *retries, pstatus, index);
            return;
        }
        if let Err(e) = check_r1(13, status) {
            self.rw_error(work, e);
            return;
        }
        self.rw_done(work, sectors);
    }

    /// `mmc_blk_issue_rw_rq` after a good completion.
    fn rw_done(&mut self, work: Work, sectors: u32) {
        let now = self.host.now();
        match work {
            Work::Rw {
                req,
                done,
                retries: _,
            } => {
                if req.op == BlkOp::Read {
                    let lba = req.lba + u64::from(done);
                    let len = sectors as usize * 512;
                    self.data.read_data(&req, lba, &self.rbuf[..len]);
                }
                let done = done + sectors;
                if done < req.sectors {
                    // More pieces of a legacy reliable write: start the next at once.
                    self.start_rw(Work::Rw {
                        req,
                        done,
                        retries: 0,
                    });
                    return;
                }
                if req.op == BlkOp::Write && req.fua && !(self.f.rel_wr && self.cfg.cmd23) {
                    // FUA without reliable write: the block layer's post-flush.
                    if let Err(e) = self.flush_cache() {
                        let at = self.host.now();
                        self.sched.completed(&req, at);
                        self.fail(req, at, e.into());
                        return;
                    }
                }
                let at = self.host.now();
                self.sched.completed(&req, at);
                self.complete(req, at);
            }
            Work::Packed { reqs, .. } => {
                self.deliver_packed_reads(&reqs);
                for r in reqs {
                    self.sched.completed(&r, now);
                    self.complete(r, now);
                }
            }
            Work::Special(_) => {}
        }
    }

    /// A packed read's data arrived as the entries' data back to back.
    fn deliver_packed_reads(&mut self, reqs: &[BlkRequest]) {
        if reqs.first().is_none_or(|r| r.op != BlkOp::Read) {
            return;
        }
        let mut at = 0;
        for r in reqs {
            let len = r.sectors as usize * 512;
            self.data.read_data(r, r.lba, &self.rbuf[at..at + len]);
            at += len;
        }
    }

    /// A packed command failed (`mmc_blk_packed_err_check`, `mmc_blk_end_packed_req`):
    /// the entries before PACKED_FAILURE_INDEX landed and complete; the command is sent
    /// again from the failed entry. Without an index the whole command is retried.
    fn packed_failed(&mut self, reqs: Vec<BlkRequest>, retries: u32, pstatus: u8, index: usize) {
        let now = self.host.now();
        let first_failed = index.min(reqs.len());
        log::debug!(
            "mmcblk: packed command failed (status {pstatus:#04x}) at entry {}",
            first_failed + 1
        );
        self.deliver_packed_reads(&reqs[..first_failed]);
        for r in &reqs[..first_failed] {
            self.sched.completed(r, now);
            self.complete(*r, now);
        }
        let rest = reqs[first_failed..].to_vec();
        if rest.is_empty() {
            return;
        }
        if retries >= self.cfg.retries {
            for r in rest {
                self.sched.completed(&r, now);
                self.fail(r, now, BlkError::Packed { status: pstatus });
            }
            return;
        }
        self.stats.retries += 1;
        if rest.len() == 1 {
            self.start_rw(Work::Rw {
                req: rest[0],
                done: 0,
                retries: retries + 1,
            });
        } else {
            self.start_packed(Work::Packed {
                reqs: rest,
                retries: retries + 1,
            });
        }
    }

    /// `mmc_blk_cmd_recovery` and the retry decision.
    fn rw_error(&mut self, work: Work, e: MmcError) {
        let retryable = matches!(
            e,
            MmcError::Host { .. } | MmcError::Timeout(_) | MmcError::Data(_)
        );
        log::debug!("mmcblk: request error {e}");
        // Get the card back to tran: a stop if it is still sending or receiving.
        match mmc_send_status(&mut self.host) {
            Ok(status) => {
                let state = r1_state(status);
                if state == CardState::Data.number() || state == CardState::Rcv.number() {
                    let _ = super::mmc::mmc_wait_for_cmd(
                        &mut self.host,
                        MmcCommand::new(12, 0, ResponseType::R1b),
                    );
                }
            }
            // The card does not answer CMD13 at all (it lost power, or its RCA):
            // `mmc_blk_reset` re-initialises it once, then the request is retried.
            Err(status_error) if !self.reset_done => self.reset_card(&status_error),
            Err(_) => {}
        }
        self.host.wait_busy_until(None);
        let now = self.host.now();
        match work {
            Work::Rw { req, done, retries } if retryable && retries < self.cfg.retries => {
                self.stats.retries += 1;
                self.start_rw(Work::Rw {
                    req,
                    done,
                    retries: retries + 1,
                });
            }
            Work::Packed { reqs, retries } if retryable && retries < self.cfg.retries => {
                self.stats.retries += 1;
                self.start_packed(Work::Packed {
                    reqs,
                    retries: retries + 1,
                });
            }
            Work::Rw { req, .. } => {
                self.sched.completed(&req, now);
                self.fail(req, now, e.into());
            }
            Work::Packed { reqs, .. } => {
                for r in reqs {
                    self.sched.completed(&r, now);
                    self.fail(r, now, e.clone().into());
                }
            }
            Work::Special(_) => {}
        }
    }

    /// `mmc_blk_reset` → `mmc_hw_reset`: write the cache back if the card still takes
    /// commands, then bring it up again from idle with the same capabilities. Data the
    /// card had only in its volatile cache is lost if it had lost power, as on hardware.
    fn reset_card(&mut self, why: &MmcError) {
        log::warn!("mmcblk: the card does not answer ({why}); re-initialising it");
        self.reset_done = true;
        self.stats.resets += 1;
        if self.f.cache {
            let _ = mmc_switch(&mut self.host, &self.card, ext::FLUSH_CACHE, 1);
        }
        match mmc_init_card(&mut self.host, &self.cfg.caps) {
            Ok(card) => {
                let (f, limits, _) = Self::setup(&card, &self.cfg);
                self.card = card;
                self.f = f;
                self.limits = limits;
                self.bkops_checked = false;
                self.urgent_bkops = false;
            }
            Err(e) => log::error!("mmcblk: re-initialising the card failed: {e}"),
        }
    }

    /// R1 EXCEPTION_EVENT: read EXT_CSD to find out which. URGENT_BKOPS is noted for
    /// the queue thread; a packed failure is returned as (PACKED_COMMAND_STATUS, 0-based
    /// index of the first failed entry).
    fn check_exception(&mut self, status: u32, packed: bool) -> Option<(u8, usize)> {
        if status & r1::EXCEPTION_EVENT == 0 {
            return None;
        }
        let e = match mmc_get_ext_csd(&mut self.host) {
            Ok(e) => e,
            Err(err) => {
                log::warn!("mmcblk: EXT_CSD after an exception event: {err}");
                return None;
            }
        };
        let events = u16::from(e[ext::EXCEPTION_EVENTS_STATUS]);
        if events & ext::EE_URGENT_BKOPS != 0 && self.f.bkops && self.cfg.bkops.enabled {
            self.urgent_bkops = true;
        }
        if packed && events & ext::EE_PACKED_FAILURE != 0 {
            let pstatus = e[ext::PACKED_COMMAND_STATUS];
            let index = if pstatus & ext::PACKED_STATUS_INDEXED_ERROR != 0 {
                usize::from(e[ext::PACKED_FAILURE_INDEX]).saturating_sub(1)
            } else {
                0
            };
            return Some((pstatus, index));
        }
        None
    }

    // ---- special requests ----------------------------------------------------------------

    fn flush_cache(&mut self) -> Result<(), MmcError> {
        if !self.f.cache {
            return Ok(());
        }
        self.stats.flushes += 1;
        mmc_switch(&mut self.host, &self.card, ext::FLUSH_CACHE, 1)
    }

    /// Flush and the erase family run synchronously, the pipeline drained before them.
    fn issue_special(&mut self, req: BlkRequest) {
        let result = match req.op {
            BlkOp::Flush => self.flush_cache().map_err(BlkError::from),
            BlkOp::Discard => {
                let arg = if self.f.can_discard {
                    MMC_DISCARD_ARG
                } else if self.f.can_trim {
                    MMC_TRIM_ARG
                } else {
                    MMC_ERASE_ARG
                };
                self.mmc_erase(req.lba, u64::from(req.sectors), arg)
            }
            BlkOp::SecureErase => {
                if !self.f.can_secure_erase {
                    Err(BlkError::NotSupported(req.op))
                } else if self.f.can_trim && !self.group_aligned(req.lba, u64::from(req.sectors)) {
                    self.mmc_erase(req.lba, u64::from(req.sectors), MMC_SECURE_TRIM1_ARG)
                        .and_then(|()| {
                            self.mmc_erase(req.lba, u64::from(req.sectors), MMC_SECURE_TRIM2_ARG)
                        })
                } else {
                    self.mmc_erase(req.lba, u64::from(req.sectors), MMC_SECURE_ERASE_ARG)
                }
            }
            BlkOp::WriteZeroes => {
                if self.f.erased_zero && self.f.can_trim {
                    self.mmc_erase(req.lba, u64::from(req.sectors), MMC_TRIM_ARG)
                } else {
                    self.write_zeroes(req.lba, req.sectors)
                }
            }
            BlkOp::Read | BlkOp::Write => unreachable!("data requests are not special"),
        };
        let now = self.host.now();
        self.sched.completed(&req, now);
        match result {
            Ok(()) => self.complete(req, now),
            Err(e) => self.fail(req, now, e),
        }
    }

    fn group_aligned(&self, from: u64, nr: u64) -> bool {
        from % self.f.erase_group == 0 && nr % self.f.erase_group == 0
    }

    /// Write zeroes by writing them, in requests of the queue's size.
    fn write_zeroes(&mut self, lba: u64, sectors: u32) -> Result<(), BlkError> {
        let mut at = lba;
        let mut left = sectors;
        while left > 0 {
            let n = left.min(self.cfg.max_sectors);
            let len = n as usize * 512;
            self.wbuf[512..512 + len].fill(0);
            let mut sg = [&self.wbuf[512..512 + len]];
            let done = self.host.request(MmcRequest {
                sbc: Some(MmcCommand::new(23, n, ResponseType::R1)),
                cmd: MmcCommand::new(25, self.card.address(at), ResponseType::R1),
                data: Some(MmcData::write(512, n, &mut sg)),
                stop: Some(MmcCommand::new(12, 0, ResponseType::R1b)),
            });
            self.stats.mmc_requests += 1;
            completion_result(&done)?;
            check_r1(13, mmc_send_status(&mut self.host)?)?;
            at += u64::from(n);
            left -= n;
        }
        Ok(())
    }

    /// `mmc_erase`: erase (and secure erase) shrunk to whole erase groups; trim and
    /// discard exactly; each CMD38 limited to what the host's busy time-out allows.
    fn mmc_erase(&mut self, from: u64, nr: u64, arg: u32) -> Result<(), BlkError> {
        let g = self.f.erase_group;
        let (mut from, mut nr) = (from, nr);
        if matches!(arg, MMC_ERASE_ARG | MMC_SECURE_ERASE_ARG) {
            let rem = from % g;
            if rem != 0 {
                let skip = g - rem;
                if nr <= skip {
                    return Ok(());
                }
                from += skip;
                nr -= skip;
            }
            nr -= nr % g;
            if nr == 0 {
                return Ok(());
            }
        }
        let mult = match arg {
            MMC_ERASE_ARG => self.f.erase_timeout_mult,
            MMC_SECURE_ERASE_ARG => self.f.erase_timeout_mult * self.f.sec_erase_mult,
            MMC_SECURE_TRIM1_ARG | MMC_SECURE_TRIM2_ARG => {
                self.f.erase_timeout_mult * self.f.sec_trim_mult
            }
            _ => self.f.trim_mult,
        };
        let per_group_ms = ERASE_TIMEOUT_UNIT_MS * mult;
        let max_busy = u64::from(self.host.max_busy_timeout_ms());
        let max_groups = if max_busy == 0 {
            u64::MAX
        } else {
            (max_busy / per_group_ms).max(1)
        };
        if arg == MMC_SECURE_TRIM2_ARG {
            return self.erase_cmds(from, from, arg, per_group_ms);
        }
        let mut at = from;
        let end = from + nr;
        while at < end {
            // At most max_groups erase groups per CMD38.
            let group_end = (at / g).saturating_add(max_groups).saturating_mul(g);
            let to = end.min(group_end);
            let groups = (to - 1) / g - at / g + 1;
            self.erase_cmds(at, to - 1, arg, per_group_ms * groups)?;
            at = to;
        }
        Ok(())
    }

    fn erase_cmds(
        &mut self,
        from: u64,
        to: u64,
        arg: u32,
        timeout_ms: u64,
    ) -> Result<(), BlkError> {
        use super::mmc::mmc_send_r1;
        self.stats.erases += 1;
        mmc_send_r1(&mut self.host, 35, self.card.address(from))?;
        mmc_send_r1(&mut self.host, 36, self.card.address(to))?;
        let cmd = MmcCommand::new(38, arg, ResponseType::R1b)
            .with_busy_timeout(timeout_ms.min(u64::from(u32::MAX)) as u32);
        let done = self.host.start_request(MmcRequest::command(cmd));
        completion_result(&done)?;
        self.host.wait_busy_until(None);
        check_r1(13, mmc_send_status(&mut self.host)?)?;
        Ok(())
    }

    // ---- HPI -------------------------------------------------------------------------------

    /// When the HPI policy wants the card interrupted (the arrival that asks for it), if
    /// that is no later than `until`.
    fn hpi_due(&self, until: Nanos) -> Option<Nanos> {
        if !self.f.hpi {
            return None;
        }
        let at = match self.active.as_ref()? {
            Active::Bkops => self.any_since?,
            Active::Rw { work, busy, .. } => {
                if !*busy || !self.cfg.hpi.enabled {
                    return None;
                }
                let long = match work {
                    Work::Packed { reqs, .. } => reqs[0].op == BlkOp::Write,
                    Work::Rw { req, .. } => {
                        req.op == BlkOp::Write && req.sectors >= self.cfg.hpi.min_write_sectors
                    }
                    Work::Special(_) => false,
                };
                if !long {
                    return None;
                }
                // A read waiting in the scheduler, or already fetched by the pipeline.
                let fetched = self.cur.as_ref().and_then(|c| {
                    let read = match &c.work {
                        Work::Rw { req, .. } => req.op.is_read(),
                        Work::Packed { reqs, .. } => reqs[0].op.is_read(),
                        Work::Special(_) => false,
                    };
                    (read && !self.hpi_done_for_cur).then_some(c.fetched_at)
                });
                let arrived = match (self.read_since, fetched) {
                    (Some(a), Some(b)) => a.min(b),
                    (a, b) => a.or(b)?,
                };
                arrived.saturating_add(self.cfg.hpi.min_wait_ns)
            }
        };
        (at <= until).then_some(at)
    }

    /// `mmc_interrupt_hpi`, then what the interrupted operation leaves to do.
    fn interrupt(&mut self) {
        let Some(active) = self.active.take() else {
            return;
        };
        // The read that asked for it has had its chance: another HPI needs another read
        // (with a scheduler that does not put the read first, writes queued before it
        // would otherwise be interrupted one after the other).
        self.read_since = None;
        self.hpi_done_for_cur = true;
        match self.mmc_interrupt_hpi() {
            Ok(true) => self.stats.hpi += 1,
            Ok(false) => {}
            Err(e) => log::warn!("mmcblk: HPI failed: {e}"),
        }
        self.host.wait_busy_until(None);
        let (work, sectors) = match active {
            Active::Bkops => return,
            Active::Rw { work, sectors, .. } => (work, sectors),
        };
        let prg = match mmc_get_ext_csd(&mut self.host) {
            Ok(e) => ext::read_le(&e, ext::CORRECTLY_PRG_SECTORS_NUM, 4).min(sectors),
            Err(e) => {
                self.rw_error(work, e);
                return;
            }
        };
        let now = self.host.now();
        let reqs: Vec<(BlkRequest, u32)> = match &work {
            // Only the piece on the card counts; earlier pieces completed already.
            Work::Rw { req, done, .. } => vec![(*req, *done)],
            Work::Packed { reqs, .. } => reqs.iter().map(|r| (*r, 0)).collect(),
            Work::Special(_) => return,
        };
        let mut landed = u64::from(prg);
        let mut back = Vec::new();
        for (req, already) in reqs {
            let left = u64::from(req.sectors - already);
            let take = landed.min(left);
            landed -= take;
            let done_total = already + take as u32;
            if done_total == req.sectors {
                self.sched.completed(&req, now);
                self.complete(req, now);
                continue;
            }
            if done_total > 0 {
                self.complete(
                    BlkRequest {
                        sectors: done_total,
                        ..req
                    },
                    now,
                );
            }
            let rest = req.sectors - done_total;
            back.push(BlkRequest {
                lba: req.lba + u64::from(done_total),
                sectors: rest,
                segments: rest.div_ceil(8).max(1),
                ..req
            });
        }
        for r in &back {
            self.stats.hpi_requeued_sectors += u64::from(r.sectors);
            self.sched.reinsert(*r, now);
        }
        log::debug!(
            "mmcblk: HPI after {prg} sectors, {} requests given back",
            back.len()
        );
    }

    /// Send HPI if the card is programming: CMD13 first (Linux skips HPI outside prg),
    /// then the HPI command, then wait until the card leaves prg. `Ok(true)` if sent.
    fn mmc_interrupt_hpi(&mut self) -> Result<bool, MmcError> {
        let status = mmc_send_status(&mut self.host)?;
        if r1_state(status) != CardState::Prg.number() {
            return Ok(false);
        }
        let arg = u32::from(MMC_RCA) << 16 | 1;
        let cmd = if self.f.hpi_cmd12 {
            MmcCommand::new(12, arg, ResponseType::R1b)
        } else {
            MmcCommand::new(13, arg, ResponseType::R1)
        };
        let done = self.host.start_request(MmcRequest::command(cmd));
        match done.error() {
            None | Some(SdhciError::CmdCrc) => {}
            Some(error) => {
                return Err(MmcError::Host {
                    cmd: cmd.opcode,
                    error,
                })
            }
        }
        self.host.wait_busy_until(None);
        Ok(true)
    }

    // ---- BKOPS -------------------------------------------------------------------------

    fn bkops_check_due(&self, idle_since: Nanos) -> Option<Nanos> {
        (self.f.bkops && self.cfg.bkops.enabled && !self.bkops_checked)
            .then(|| idle_since.saturating_add(self.cfg.bkops.idle_ns))
    }

    /// The queue has been idle long enough: read BKOPS_STATUS and start BKOPS without
    /// waiting if it is high enough.
    fn idle_bkops(&mut self) {
        self.bkops_checked = true;
        let level = match mmc_get_ext_csd(&mut self.host) {
            Ok(e) => e[ext::BKOPS_STATUS] & 0x03,
            Err(e) => {
                log::warn!("mmcblk: BKOPS_STATUS: {e}");
                return;
            }
        };
        if level < self.cfg.bkops.min_level.max(1) {
            return;
        }
        match mmc_switch_nowait(&mut self.host, ext::BKOPS_START, 1) {
            Ok(done) => {
                self.stats.bkops_started += 1;
                log::debug!("mmcblk: BKOPS started at level {level}");
                if done.busy_pending {
                    self.active = Some(Active::Bkops);
                }
            }
            Err(e) => log::warn!("mmcblk: BKOPS_START: {e}"),
        }
    }

    /// URGENT_BKOPS: run BKOPS to its end now (`mmc_start_bkops(card, true)` with the
    /// busy signal).
    fn run_urgent_bkops(&mut self) {
        match mmc_switch_nowait(&mut self.host, ext::BKOPS_START, 1) {
            Ok(_) => {
                self.stats.bkops_started += 1;
                self.stats.bkops_urgent += 1;
                self.host.wait_busy_until(None);
                let _ = mmc_send_status(&mut self.host);
            }
            Err(e) => log::warn!("mmcblk: urgent BKOPS_START: {e}"),
        }
    }
}

#[cfg(test)]
mod tests;
