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
//!
//! # Files
//!
//! One concern each, named after the parts of `block.c` and `queue.c` they stand for:
//!
//! - `config.rs`: [`BlkConfig`], [`HpiPolicy`], [`BkopsPolicy`], [`BlkStats`],
//!   [`BlkError`], [`BlkCompletion`];
//! - `probe.rs`: `mmc_blk_probe` and the card features the driver decodes once;
//! - `queue.rs`: the request queue, fetching and preparing (`mmc_queue_thread`,
//!   `blk_fetch_request`), the two-deep pipeline and [`MmcBlk::advance`];
//! - `rw.rs`: reads and writes (`mmc_blk_rw_rq_prep`, `mmc_apply_rel_rw`);
//! - `packed.rs`: packed commands and packed failures;
//! - `complete.rs`: checking a finished request, completion, error recovery and reset
//!   (`mmc_blk_err_check`, `mmc_blk_cmd_recovery`, `mmc_blk_reset`);
//! - `special.rs`: flush, discard, secure erase, write zeroes (`mmc_erase`);
//! - `hpi.rs`: the HPI policy and `mmc_interrupt_hpi`;
//! - `bkops.rs`: idle and urgent BKOPS.
//!
//! [`mmc_init_card`]: crate::mmc::mmc_init_card
//! [`Elevator`]: crate::iosched::Elevator
//! [`prep_packed_list`]: crate::packing::prep_packed_list

mod bkops;
mod complete;
mod config;
mod hpi;
mod packed;
mod probe;
mod queue;
mod rw;
mod special;

use crate::iosched::IoScheduler;
use crate::mmc::{MmcCard, MmcHostOps};
use crate::packing::{BlkRequest, PackLimits, WritePackingControl};
use emmc_card::timing::Nanos;

use bkops::BkopsState;
use hpi::HpiState;
use probe::Features;
use queue::{Active, Prepared};

pub use config::{
    BkopsPolicy, BlkCompletion, BlkConfig, BlkError, BlkStats, HpiPolicy, MMC_BLK_RETRIES,
};
pub use queue::Advance;

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
    /// What the BKOPS policy knows between requests.
    bkops: BkopsState,
    /// Arrivals the HPI policy waits on.
    hpi: HpiState,
    writes_since_read: u32,
    /// The card was reset for an error and no request has succeeded since: a second
    /// failure does not reset it again (Linux's `md->reset_done`).
    reset_done: bool,
    stats: BlkStats,
    /// Write data: room for a 512-byte packed header followed by the data.
    wbuf: Vec<u8>,
    rbuf: Vec<u8>,
    /// The read on the card went straight into the data's own memory
    /// ([`BlkData::read_target`]): nothing to copy when it completes.
    read_in_place: bool,
}

/// Where the data of block requests comes from and goes to. A request is identified by
/// its `id` (pieces of one request share it: queue splits, HPI remainders) and the data
/// by sector, so an implementation maps `(id, lba)` to its buffers.
pub trait BlkData {
    /// Fill `buf` with the data to write for `req`'s sectors from `lba` on.
    fn write_data(&mut self, req: &BlkRequest, lba: u64, buf: &mut [u8]);
    /// `buf` holds what the card returned for `req`'s sectors from `lba` on.
    fn read_data(&mut self, req: &BlkRequest, lba: u64, buf: &[u8]);
    /// Memory the card may read `req`'s sectors from `lba` on into directly: `len` bytes
    /// in one piece, the data's own (a guest's buffer). The read then needs no
    /// `read_data`. `None`: through the driver's buffer.
    fn read_target(&mut self, _req: &BlkRequest, _lba: u64, _len: usize) -> Option<&mut [u8]> {
        None
    }
    /// The same for a write: `len` bytes of `req`'s data from `lba` on, to send as they
    /// are instead of copying them with `write_data`.
    fn write_source(&mut self, _req: &BlkRequest, _lba: u64, _len: usize) -> Option<&[u8]> {
        None
    }
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

impl<H: MmcHostOps, D: BlkData> MmcBlk<H, D> {
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
}

#[cfg(test)]
mod tests;
