//! emmc-card: an eMMC 4.5 card (JESD84-B45, EXT_CSD_REV 6) as a library — the state
//! machine, its registers and partitions, RPMB, the timing models of real cards, the
//! sparse image it stores its data in, and the device models it is built from.
//!
//! Another VMM (cloud-hypervisor, crosvm, a test rig without QEMU) can drive a [`Card`]
//! directly. It must never depend on vhost, virtio, guest memory, clap, plotting or
//! terminal crates, nor on the host, simulator or frontend crates (tests/layering.rs):
//! everything above it depends on it, it on nothing of theirs.
//!
//! - the crate root and its modules: the card itself (below);
//! - [`timing`]: how long each card operation takes, in card time (bus, NAND, FTL, cache,
//!   BKOPS, erase), one module per phenomenon;
//! - [`store`]: the sparse image file and its metadata sidecar;
//! - [`model`]: device models (`device-models/*.toml`), loaded and validated;
//! - [`inspect`]: the registers decoded for people; [`crc`]: CRC7 and CRC16.
//!
//! # The card
//!
//! A [`Card`] is a pure, deterministic state machine. Its caller (the host controller
//! model, or a test) tells it the current card time with every call; the card never reads
//! a clock, starts no thread and does I/O only through its [`Store`]. Operations that keep
//! the card busy (programming, erase, CMD6, BKOPS, sanitize, sleep) last until a card-time
//! instant computed by its [`Timing`] model; any call at or after that instant finds them
//! complete, and HPI or a power loss before it finds them partly done.
//!
//! The bus protocol is split in three calls:
//! - [`Card::execute`] takes a command token and returns the response (or `None` when the
//!   card stays silent: illegal command, broadcast command, not addressed, CRC error);
//! - [`Card::read_data`] / [`Card::write_data`] move whole data blocks of the transfer the
//!   last adtc command started, in the card's current block length
//!   ([`Card::transfer_block_len`]).
//!
//! A card is a composition of owned parts (`parts/`), each holding its own state and the
//! rules that touch only that state: registers, partitions, data transfer, erase
//! sequence, pending faults, busy operation, protection; plus the RPMB engine
//! ([`rpmb`]) and the volatile cache (`cache`). The card itself keeps the orchestration:
//! command dispatch and the rules that span parts.
//!
//! Module map: `command` (the table), `ident` (identification, selection, status, sleep,
//! reset, power), `transfer` (data commands, packed commands, the data API), `rpmb_io`
//! (RPMB frames on the bus), `switch` (CMD6, driven by `ext_csd::rules`), `erase`,
//! `protect` (CMD28–31, CMD42), `operation` (busy operations, HPI, BKOPS, power loss,
//! cache write-back), `persist` (what survives power loss), `fault` (a fault plan's
//! entry points).

mod cache;
pub mod command;
pub mod crc;
mod erase;
pub mod ext_csd;
pub mod fault;
mod ident;
pub mod inspect;
pub mod model;
mod one_or_many;
mod operation;
pub mod packed;
pub mod partition;
mod parts;
mod persist;
mod protect;
pub mod registers;
pub mod rpmb;
mod rpmb_io;
pub mod status;
pub mod store;
mod switch;
pub mod timing;
mod transfer;

pub use command::{Command, Response};
pub use ident::PowerDown;
pub use partition::Partition;
pub use status::{r1, CardState};

use crate::model::DeviceModel;
use crate::store::{ImageLayout, Store, StoreError};
use crate::timing::{Nanos, Timing};

use cache::VolatileCache;
use ext_csd::EXT_CSD_LEN;
use parts::busy::Busy;
use parts::data::{DataTransfer, Sbc};
use parts::erase::EraseState;
use parts::faults::PendingFaults;
use parts::partitions::Partitions;
use parts::protection::Protection;
use parts::registers::Registers;
use persist::PersistentState;
use rpmb::Rpmb;

/// Errors building or reopening a card.
#[derive(Debug, thiserror::Error)]
pub enum CardError {
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("saved card state in the image sidecar is invalid: {0}")]
    BadState(String),
    #[error("general purpose partitions in the saved state do not fit the user area")]
    PartitionsDoNotFit,
}

/// Why a data block was not accepted or not delivered. The host sees these as data
/// timeouts or CRC-status errors; the card's status says why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DataError {
    #[error("no data transfer in progress (card is in {0})")]
    NoTransfer(CardState),
    #[error("{len} bytes is not a whole number of {block_len}-byte blocks")]
    BlockLength { len: usize, block_len: usize },
    #[error("more blocks than the transfer's block count")]
    PastBlockCount,
    #[error("card stopped the transfer after {blocks_done} blocks ({status})")]
    Stopped { blocks_done: u64, status: String },
}

/// Counters a test or a statistics page may want.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct CardStats {
    pub commands: u64,
    pub illegal_commands: u64,
    pub sectors_read: u64,
    pub sectors_written: u64,
    pub packed_writes: u64,
    pub packed_reads: u64,
    pub packed_failures: u64,
    pub hpi_interrupts: u64,
    pub flushes: u64,
    pub sectors_destaged: u64,
    pub erases: u64,
    /// Card time spent in background operations (BKOPS started by the host, up to their
    /// end or the HPI that stopped them).
    pub bkops_ns: u64,
}

/// The state of one command's execution, handed to its handler.
pub struct Exec {
    /// Card time at which the command arrived.
    pub now: Nanos,
    pub index: u8,
    pub arg: u32,
    /// Error/status bits reported in this command's own response (type "r").
    pub resp_status: u32,
    /// Bits detected during execution, visible from the next response on (type "x").
    pub after_status: u32,
    /// A CMD23 block count for this CMD18/CMD25.
    sbc: Option<Sbc>,
}

/// What a handler asks the dispatcher to send.
pub enum Handled {
    R1,
    R1b,
    R2([u8; 16]),
    R3(u32),
    R4(u32),
    R5(u32),
    /// A legal command that gets no response (broadcast, deselect, not addressed).
    NoResponse,
    /// Not legal here: no response, ILLEGAL_COMMAND in the next status.
    Illegal(&'static str),
}

/// An eMMC 4.5 card: its environment (device model, store, timing model, card time),
/// the bus state machine, and its parts.
pub struct Card {
    model: DeviceModel,
    store: Box<dyn Store + Send>,
    timing: Box<dyn Timing + Send>,
    /// Latest card time seen (calls with an earlier time are treated as this one).
    now: Nanos,

    // ---- the bus state machine
    state: CardState,
    /// CMD1 answers busy this many more times before power-up completes.
    ocr_busy_polls: u8,
    /// The previous command was CMD55.
    app_cmd: bool,

    // ---- the parts
    /// CID, CSD, EXT_CSD, BUS_WIDTH, RCA, R1 status bits.
    regs: Registers,
    /// The partition geometry in effect.
    partitions: Partitions,
    /// The data phase: CMD16/CMD23, the transfer, the write and read buffers.
    data: DataTransfer,
    /// The CMD35/36/38 sequence and the secure-trim marks.
    erase: EraseState,
    /// A fault plan's refusal or packed failure, waiting for its command.
    faults: PendingFaults,
    /// The operation keeping the card busy, and the background work owed.
    busy: Busy,
    /// Acknowledged writes that are not durable yet.
    cache: VolatileCache,
    /// Write-protect groups, boot-area protection, the CMD42 password and lock.
    protection: Protection,
    /// RPMB key, write counter, pending response.
    rpmb: Rpmb,
    stats: CardStats,
}

impl Card {
    /// The image layout a card of `model` needs.
    pub fn layout_for(model: &DeviceModel) -> ImageLayout {
        ImageLayout {
            boot_bytes: model.boot_partition_bytes(),
            rpmb_bytes: model.rpmb_bytes(),
            user_bytes: model.user_bytes(),
        }
    }

    /// A card of `model` on `store` with the timing model the model names. The card is
    /// powered on: persistent state is loaded from the store and the card is in idle.
    pub fn new(model: DeviceModel, store: Box<dyn Store + Send>) -> Result<Card, CardError> {
        let timing = crate::timing::from_model(&model);
        Card::with_timing(model, store, timing)
    }

    /// A card with an explicit timing model.
    pub fn with_timing(
        model: DeviceModel,
        store: Box<dyn Store + Send>,
        timing: Box<dyn Timing + Send>,
    ) -> Result<Card, CardError> {
        let layout = store.layout();
        let partitions = Partitions::new(layout).ok_or(CardError::PartitionsDoNotFit)?;
        let rpmb = Rpmb::new(layout.rpmb_bytes, Default::default());
        let cache = VolatileCache::new(model.cache_blocks(), store.keeps_data());
        let mut card = Card {
            regs: Registers::new(&model),
            model,
            store,
            timing,
            now: 0,
            state: CardState::Idle,
            ocr_busy_polls: 1,
            app_cmd: false,
            partitions,
            data: DataTransfer::default(),
            erase: EraseState::default(),
            faults: PendingFaults::default(),
            busy: Busy::default(),
            cache,
            protection: Protection::default(),
            rpmb,
            stats: CardStats::default(),
        };
        let saved = match card.store.load_card_state() {
            Some(table) => PersistentState::from_table(table).map_err(CardError::BadState)?,
            None => PersistentState::default(),
        };
        card.apply_persistent(saved)?;
        card.power_on_reset();
        Ok(card)
    }

    // ---- public API: the bus --------------------------------------------------------------

    /// Send a command token. `None` means the card did not respond.
    pub fn execute(&mut self, now: Nanos, cmd: Command) -> Option<Response> {
        self.execute_checked(now, cmd, true)
    }

    /// Send a command token whose CRC the card found wrong (`crc_ok == false`): the card
    /// ignores it and reports COM_CRC_ERROR in the next response.
    pub fn execute_checked(&mut self, now: Nanos, cmd: Command, crc_ok: bool) -> Option<Response> {
        self.advance(now);
        self.stats.commands += 1;
        let state = self.state;
        if state == CardState::Ina {
            return None;
        }
        if !crc_ok {
            self.regs.raise(r1::COM_CRC_ERROR);
            log::debug!("CMD{} arg {:#010x}: CRC error, ignored", cmd.index, cmd.arg);
            return None;
        }
        if state == CardState::Irq {
            // Any command ends interrupt mode; it is taken as the host's own R5.
            self.state = CardState::Stby;
            return None;
        }
        let sbc = self.data.take_block_count();
        let Some(spec) = command::spec(cmd.index) else {
            return self.illegal(cmd, "not an eMMC 4.5 command");
        };
        if !spec.legal.contains(state) {
            return self.illegal(cmd, "not legal in this state");
        }
        if self.protection.locked() && matches!(spec.class, 2 | 4 | 5 | 6) && cmd.index != 16 {
            return self.illegal(cmd, "card is locked");
        }
        if self.faults.refusal_pending()
            && matches!(
                spec.response,
                command::ResponseType::R1 | command::ResponseType::R1b
            )
        {
            return Some(self.refuse_with_fault(cmd, state));
        }
        let mut exec = Exec {
            now: self.now,
            index: cmd.index,
            arg: cmd.arg,
            resp_status: 0,
            after_status: 0,
            sbc: if matches!(cmd.index, 18 | 25) {
                sbc
            } else {
                None
            },
        };
        if self.erase.started() && !matches!(cmd.index, 13 | 35 | 36 | 38) {
            self.erase.reset_sequence();
            exec.resp_status |= r1::ERASE_RESET;
        }
        let app = std::mem::take(&mut self.app_cmd);
        let ready_for_data = self.ready_for_data();
        let handled = (spec.handler)(self, &mut exec);
        let status_of = |card: &mut Card, exec: &Exec| {
            let mut s = card.regs.take_reported()
                | exec.resp_status
                | (state.number() << r1::CURRENT_STATE_SHIFT);
            if ready_for_data {
                s |= r1::READY_FOR_DATA;
            }
            if card.exception_event() {
                s |= r1::EXCEPTION_EVENT;
            }
            if card.protection.locked() {
                s |= r1::DEVICE_IS_LOCKED;
            }
            if app || cmd.index == 55 {
                s |= r1::APP_CMD;
            }
            s
        };
        let response = match handled {
            Handled::Illegal(why) => return self.illegal(cmd, why),
            Handled::NoResponse => None,
            Handled::R1 => Some(Response::R1(status_of(self, &exec))),
            Handled::R1b => Some(Response::R1b(status_of(self, &exec))),
            Handled::R2(reg) => Some(Response::R2(reg)),
            Handled::R3(v) => Some(Response::R3(v)),
            Handled::R4(v) => Some(Response::R4(v)),
            Handled::R5(v) => Some(Response::R5(v)),
        };
        // "b" bits describe the previous command: any valid command clears them, whatever
        // its response (an R1 above has already reported them).
        self.regs.end_command(exec.after_status);
        if log::log_enabled!(log::Level::Trace) {
            log::trace!(
                "CMD{} {} arg {:#010x} in {} -> {:?}",
                cmd.index,
                spec.name,
                cmd.arg,
                state,
                response
            );
        }
        response
    }

    fn illegal(&mut self, cmd: Command, why: &str) -> Option<Response> {
        self.regs.raise(r1::ILLEGAL_COMMAND);
        self.stats.illegal_commands += 1;
        log::debug!(
            "CMD{} arg {:#010x} illegal in {}: {why}",
            cmd.index,
            cmd.arg,
            self.state
        );
        None
    }

    /// READY_FOR_DATA: the card can accept data (not busy programming).
    fn ready_for_data(&self) -> bool {
        !matches!(self.state, CardState::Prg | CardState::Dis) && !self.busy.is_busy()
    }

    /// R1 EXCEPTION_EVENT: an enabled EXCEPTION_EVENTS_STATUS bit is set. URGENT_BKOPS has
    /// no enable bit and is always reported.
    fn exception_event(&self) -> bool {
        let status = self.exception_events_status();
        let ctrl = self.regs.exception_events_ctrl();
        status & (ctrl | ext_csd::EE_URGENT_BKOPS) != 0
    }

    /// EXCEPTION_EVENTS_STATUS as the card reports it now.
    fn exception_events_status(&self) -> u16 {
        let mut s = 0;
        if self.bkops_level() >= 2 {
            s |= ext_csd::EE_URGENT_BKOPS;
        }
        if self.data.packed_failure() {
            s |= ext_csd::EE_PACKED_FAILURE;
        }
        s
    }

    /// Fill in the EXT_CSD bytes that reflect live card state.
    fn refresh_live_fields(&self, e: &mut [u8; ext_csd::EXT_CSD_LEN]) {
        ext_csd::write_le(
            e,
            ext_csd::EXCEPTION_EVENTS_STATUS,
            2,
            u32::from(self.exception_events_status()),
        );
        e[ext_csd::BKOPS_STATUS] = self.bkops_level();
        e[ext_csd::BOOT_WP_STATUS] = self.protection.boot_wp_status();
        let user = self.partitions.extent(Partition::User).sectors;
        ext_csd::write_le(
            e,
            ext_csd::SEC_COUNT,
            4,
            u32::try_from(user).unwrap_or(u32::MAX),
        );
        // Write-only fields read as zero.
        for offset in [
            ext_csd::FLUSH_CACHE,
            ext_csd::BKOPS_START,
            ext_csd::SANITIZE_START,
            ext_csd::BUS_WIDTH,
            ext_csd::TCASE_SUPPORT,
        ] {
            e[offset] = 0;
        }
    }

    /// Move card time forward to `now` and complete any operation that has finished (a
    /// host watching DAT0 busy does this; every other call does it implicitly).
    pub fn advance(&mut self, now: Nanos) {
        self.now = self.now.max(now);
        self.settle();
    }

    /// The frontend has ended a round of requests and signalled their completions: the
    /// store writes the image data it held back meanwhile ([`Store::end_batch`]). Nothing
    /// the card does or reports changes; only when the image file gets the data.
    pub fn end_batch(&mut self) {
        self.store.end_batch();
    }

    /// As [`Card::end_batch`], where a completion is due soon: the store writes what it
    /// holds only if that is quick, and hands nothing to a helper thread
    /// ([`Store::end_batch_here`]).
    pub fn end_batch_here(&mut self) {
        self.store.end_batch_here();
    }

    /// The frontend paces completions and ends its rounds only where a hand-over to the
    /// store's writer thread cannot delay one: the store may hold large writes back until
    /// then too ([`Store::hold_large_writes`]). Again, only when the image gets the data
    /// changes.
    pub fn hold_large_writes(&mut self, on: bool) {
        self.store.hold_large_writes(on);
    }

    /// The frontend will read these user-area ranges in this round, each as
    /// `(lba, dest, len)` into memory of its own: the store may start copying them
    /// there now ([`Store::prefetch`]). What the card reads and reports does not
    /// change; a range outside the user area is left alone.
    ///
    /// # Safety
    /// As [`Store::prefetch`]: each `dest..dest + len` stays valid for writes and
    /// untouched by the caller until the card's read into it, or
    /// [`Card::settle_prefetches`], has returned.
    pub unsafe fn prefetch_user_reads(&mut self, reads: &[(u64, *mut u8, usize)]) {
        let user = self.partitions.extent(Partition::User);
        let reads: Vec<store::PrefetchRead> = reads
            .iter()
            .filter(|&&(lba, _, len)| {
                let sectors = (len / 512) as u64;
                len % 512 == 0
                    && lba
                        .checked_add(sectors)
                        .is_some_and(|end| end <= user.sectors)
            })
            .map(|&(lba, dest, len)| store::PrefetchRead {
                offset: (user.start + lba) * 512,
                dest,
                len,
            })
            .collect();
        // SAFETY: the caller's promise is the one `Store::prefetch` asks for.
        unsafe { self.store.prefetch(&reads) };
    }

    /// Wait until every copy [`Card::prefetch_user_reads`] started is finished.
    pub fn settle_prefetches(&mut self) {
        self.store.settle_prefetches();
    }

    // ---- public API: observation --------------------------------------------------------

    pub fn state(&self) -> CardState {
        self.state
    }

    pub fn model(&self) -> &DeviceModel {
        &self.model
    }

    pub fn rca(&self) -> u16 {
        self.regs.rca()
    }

    /// Card time of the latest call.
    pub fn now(&self) -> Nanos {
        self.now
    }

    /// The instant the current busy operation ends (DAT0 is held low until then).
    pub fn busy_until(&self) -> Option<Nanos> {
        self.busy.until()
    }

    /// Block length of the data transfer in progress (the host's block size must match).
    pub fn transfer_block_len(&self) -> Option<usize> {
        self.data.transfer_block_len()
    }

    /// Blocks the data transfer in progress still moves before it ends by itself (single
    /// block commands, CMD23 counts, registers, RPMB frames); `None` when it runs until
    /// CMD12, or when there is no transfer. A host that clocks more blocks than this
    /// gets no more data, and no CRC status token for them.
    pub fn transfer_blocks_left(&self) -> Option<u64> {
        self.data.transfer_blocks_left()
    }

    pub fn cid(&self) -> [u8; 16] {
        self.regs.cid()
    }

    pub fn csd(&self) -> [u8; 16] {
        self.regs.csd()
    }

    /// EXT_CSD as CMD8 would return it now.
    pub fn ext_csd(&self) -> [u8; EXT_CSD_LEN] {
        let mut e = *self.regs.ext_csd();
        self.refresh_live_fields(&mut e);
        e
    }

    /// HS_TIMING and BUS_WIDTH as last switched, for the host model's bus checks.
    pub fn bus_config(&self) -> (u8, u8) {
        (self.regs.hs_timing(), self.regs.bus_width())
    }

    /// The partition PARTITION_ACCESS currently selects.
    pub fn current_partition(&self) -> Partition {
        self.regs.partition_access()
    }

    /// Size in sectors of a partition (0 if it does not exist).
    pub fn partition_sectors(&self, partition: Partition) -> u64 {
        self.partitions.extent(partition).sectors
    }

    pub fn stats(&self) -> &CardStats {
        &self.stats
    }

    /// Outstanding background work (garbage-collection debt) in card time.
    pub fn bkops_outstanding_ns(&self) -> Nanos {
        self.outstanding_background()
    }

    /// The card's timing model (for its counters; the card alone asks it for costs).
    pub fn timing(&self) -> &dyn Timing {
        self.timing.as_ref()
    }

    /// Add background work, as a timing model or a fault plan would.
    pub fn add_background_work(&mut self, ns: Nanos) {
        self.busy.add_background(ns);
    }

    /// Acknowledged writes that are not yet durable: sorted runs of (absolute sector in the
    /// image, count). Empty after a flush, and always empty with the cache off.
    pub fn volatile_sectors(&self) -> Vec<(u64, u64)> {
        self.cache.dirty_runs()
    }

    /// Absolute sector in the image of `lba` in `partition`.
    pub fn image_sector(&self, partition: Partition, lba: u64) -> Option<u64> {
        self.partitions.extent(partition).translate(lba, 1)
    }

    /// Read sectors straight from the card's media view (cache included), bypassing the
    /// bus: for tests, checkers and tools, never for a guest.
    pub fn peek(
        &mut self,
        partition: Partition,
        lba: u64,
        buf: &mut [u8],
    ) -> Result<(), StoreError> {
        let count = (buf.len() / 512) as u64;
        let Some(abs) = self.partitions.extent(partition).translate(lba, count) else {
            return Err(StoreError::OutOfBounds {
                offset: lba * 512,
                len: buf.len() as u64,
                size: self.partition_sectors(partition) * 512,
            });
        };
        self.store.read_at(abs * 512, buf)?;
        self.cache.overlay(abs, buf);
        Ok(())
    }
}

#[cfg(test)]
mod tests;
