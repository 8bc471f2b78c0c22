//! The DAT line: one data transfer or busy wait at a time ([`DatPhase`]), its engine
//! (PIO through the Buffer Data Port, SDMA with buffer-boundary pauses, ADMA2 over a
//! walked descriptor table), and the instants at which it changes registers: Buffer
//! Read/Write Ready per block, DMA Interrupt at an SDMA boundary or an Int descriptor,
//! the Auto CMD12 response, an error, Transfer Complete at the end of the data or of the
//! card's busy.
//!
//! The card side runs eagerly (`card_steps.rs`): a read's blocks all come off the card
//! when the command's response ends, into a controller buffer that holds the whole
//! transfer; a write's blocks go to the card as soon as the guest has supplied them (all
//! at once for ADMA2, up to each SDMA boundary, one block at a time for PIO). What the
//! guest sees follows the card's timing and its own pace: a PIO block is readable once it
//! has arrived and the one before it has been read out; an SDMA chunk reaches memory once
//! it has arrived and the guest has restarted the DMA.

use emmc_card::timing::{Bus, Nanos};

use super::adma_walk::{desc_len, AdmaChain, ChainEnd};
use super::card_steps;
use super::dma::{in_address_space, DmaMemory};
use super::records::CommandRecord;
use super::SdhciMmio;
use crate::cmdlog::CmdEntry;
use crate::sdhci::inject::PendingFaults;
use crate::sdhci::{adma_err, auto_cmd_err, error_int, normal_int, SdhciError};

/// When a read's blocks reach the controller: block `k` at `base + read_ns(blksz, k+1)`,
/// the last at the read's end.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Arrivals {
    start: Nanos,
    base: Nanos,
    bus: Bus,
    blksz: u64,
}

impl Arrivals {
    /// A read that began at `start` and whose last of `blocks` blocks was in at `end`.
    pub(super) fn new(start: Nanos, end: Nanos, bus: Bus, blksz: usize, blocks: u32) -> Arrivals {
        Arrivals {
            start,
            base: end.saturating_sub(bus.read_ns(blksz, u64::from(blocks))),
            bus,
            blksz: blksz.max(1) as u64,
        }
    }

    /// Block `k` (from 0) is in.
    pub(super) fn block(&self, k: u64) -> Nanos {
        self.base
            .saturating_add(self.bus.read_ns(self.blksz as usize, k + 1))
            .max(self.start)
    }

    /// The first `bytes` bytes are in.
    pub(super) fn bytes(&self, bytes: u64) -> Nanos {
        if bytes == 0 {
            self.start
        } else {
            self.block((bytes - 1) / self.blksz)
        }
    }
}

/// How the data moves between the controller and the guest.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Engine {
    /// Nothing moves: an R1b busy, or a data command whose geometry the controller
    /// refuses.
    None,
    /// A tuning block, consumed by the controller itself.
    Tuning { brr: bool, intact: bool },
    /// Blocks read out through the Buffer Data Port: block `next` is readable once it
    /// has arrived and the one before was read out (`free_since`).
    PioRead {
        arrivals: Arrivals,
        next: u32,
        pos: usize,
        ready: bool,
        free_since: Nanos,
    },
    /// Blocks written in through the Buffer Data Port, one block buffer free at `free_at`.
    PioWrite {
        pos: usize,
        ready: bool,
        free_at: Nanos,
    },
    /// SDMA: `moved` bytes are done, `addr` is the next address; at a boundary the engine
    /// pauses (DMA Interrupt at `pause_at`) until the guest writes the address again.
    Sdma {
        arrivals: Option<Arrivals>,
        addr: u32,
        boundary: u64,
        moved: u64,
        pause_at: Option<Nanos>,
        paused: bool,
    },
    /// ADMA2: DMA Interrupts of Int descriptors at `marks[next..]`.
    Adma { marks: Vec<Nanos>, next: usize },
}

/// An error ending the phase at `at`, without Transfer Complete.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Failure {
    pub(super) at: Nanos,
    /// Error Interrupt Status bits.
    pub(super) error: u16,
    pub(super) auto_cmd_err: u16,
    /// ADMA Error Status and the ADMA System Address to show with it.
    pub(super) adma: Option<(u8, u64)>,
    /// For the command log: the error Linux would store in `mmc_data.error`.
    pub(super) data_error: Option<SdhciError>,
}

impl Failure {
    pub(super) fn new(at: Nanos, error: u16, data_error: SdhciError) -> Failure {
        Failure {
            at,
            error,
            auto_cmd_err: 0,
            adma: None,
            data_error: Some(data_error),
        }
    }

    /// The phase ends at `at` with nothing to raise (the command's own error said it).
    pub(super) fn quiet(at: Nanos, data_error: Option<SdhciError>) -> Failure {
        Failure {
            at,
            error: 0,
            auto_cmd_err: 0,
            adma: None,
            data_error,
        }
    }
}

/// The Auto CMD12 response, to reveal at `at` (Response register 0x1C, Auto CMD errors).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct StopReveal {
    pub(super) at: Nanos,
    pub(super) response: u32,
    pub(super) error_bits: u16,
    pub(super) auto_cmd_err: u16,
}

/// Waiting for the card to release DAT0 after `from`; the data time-out fires
/// `per_block` after `from` when the busy then reaches past the budget.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct BusyWait {
    pub(super) from: Nanos,
    pub(super) checked: bool,
}

/// What the DAT line is doing.
#[derive(Debug)]
pub(super) struct DatPhase {
    /// The command that started it.
    pub(super) opcode: u8,
    /// `Some(true)` read, `Some(false)` write, `None` no data (busy).
    pub(super) read: Option<bool>,
    pub(super) blksz: usize,
    pub(super) blocks: u32,
    pub(super) engine: Engine,
    /// All data is where it goes (reads: in guest memory or read out; writes: on the
    /// card) at this instant.
    pub(super) delivered: Option<Nanos>,
    /// Write blocks handed to the card, and when the bus is free for the next.
    pub(super) sent: u32,
    pub(super) bus_free: Nanos,
    /// A write's blocks will be garbage on the card's side.
    pub(super) garbled: Option<&'static str>,
    pub(super) failure: Option<Failure>,
    pub(super) auto_cmd12: bool,
    pub(super) auto_stop: Option<StopReveal>,
    pub(super) busy: Option<BusyWait>,
    pub(super) per_block: Nanos,
    pub(super) budget: Nanos,
    /// Count the Block Count register down to 0 at the end (multi-block with BCE).
    pub(super) counts_blocks: bool,
    /// ADMA System Address once the transfer completes.
    pub(super) adma_next: Option<u64>,
    /// The command log entry of the phase's last command, written when it ends.
    pub(super) log: Option<CmdEntry>,
    pub(super) injected: PendingFaults,
    /// The record of the command that started the phase, completed when it ends.
    pub(super) record: Option<CommandRecord>,
}

impl DatPhase {
    pub(super) fn new(opcode: u8, per_block: Nanos) -> DatPhase {
        DatPhase {
            opcode,
            read: None,
            blksz: 0,
            blocks: 0,
            engine: Engine::None,
            delivered: None,
            sent: 0,
            bus_free: 0,
            garbled: None,
            failure: None,
            auto_cmd12: false,
            auto_stop: None,
            busy: None,
            per_block,
            budget: per_block,
            counts_blocks: false,
            adma_next: None,
            log: None,
            injected: PendingFaults::default(),
            record: None,
        }
    }

    pub(super) fn len(&self) -> u64 {
        self.blksz as u64 * u64::from(self.blocks)
    }

    /// A failure of the data, with Auto CMD12 Not Executed when one was due.
    pub(super) fn fail(&mut self, mut f: Failure) {
        if self.auto_cmd12 {
            f.auto_cmd_err |= auto_cmd_err::ACMD12_NOT_EXEC;
            f.error |= error_int::AUTO_CMD_ERR;
        }
        if self.failure.is_none() {
            self.failure = Some(f);
        }
    }
}

/// Which of a phase's events comes next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum DatEvent {
    Engine,
    Stop,
    Fail,
    BusyCheck,
    Done,
}

impl SdhciMmio {
    /// The next instant the DAT phase changes a register by itself (not counting what
    /// waits for the guest), and which change.
    fn dat_next(&self) -> Option<(Nanos, DatEvent)> {
        let d = self.dat.as_ref()?;
        let mut best: Option<(Nanos, DatEvent)> = None;
        let mut consider = |t: Option<Nanos>, e: DatEvent| {
            if let Some(t) = t.filter(|&t| t != Nanos::MAX) {
                if best.is_none_or(|(b, _)| t < b) {
                    best = Some((t, e));
                }
            }
        };
        let engine = match &d.engine {
            Engine::PioRead {
                arrivals,
                next,
                ready: false,
                free_since,
                ..
            } if *next < d.blocks => Some(arrivals.block(u64::from(*next)).max(*free_since)),
            Engine::PioWrite {
                ready: false,
                free_at,
                ..
            } if d.sent < d.blocks => Some(*free_at),
            Engine::Sdma { pause_at, .. } => *pause_at,
            Engine::Adma { marks, next } => marks.get(*next).copied(),
            _ => None,
        };
        consider(engine, DatEvent::Engine);
        consider(d.auto_stop.map(|s| s.at), DatEvent::Stop);
        consider(d.failure.map(|f| f.at), DatEvent::Fail);
        if d.failure.is_none() && d.auto_stop.is_none() {
            if let Some(delivered) = d.delivered {
                match d.busy {
                    None => consider(Some(delivered), DatEvent::Done),
                    Some(b) => {
                        let end = self
                            .card
                            .busy_until()
                            .unwrap_or(0)
                            .max(b.from)
                            .max(delivered);
                        consider(Some(end), DatEvent::Done);
                        if !b.checked && d.per_block != Nanos::MAX {
                            consider(
                                Some(b.from.saturating_add(d.per_block)),
                                DatEvent::BusyCheck,
                            );
                        }
                    }
                }
            }
        }
        best
    }

    /// The instant of the DAT phase's next change by itself.
    pub(super) fn dat_next_instant(&self) -> Option<Nanos> {
        self.dat_next().map(|(t, _)| t)
    }

    /// Take the DAT phase's next change if it is due by `limit`; whether one was.
    pub(super) fn dat_step(&mut self, limit: Nanos) -> bool {
        let Some((t, event)) = self.dat_next() else {
            return false;
        };
        if t > limit {
            return false;
        }
        let Some(mut d) = self.dat.take() else {
            return false;
        };
        self.card.advance(t);
        let keep = match event {
            DatEvent::Engine => {
                self.engine_event(&mut d);
                true
            }
            DatEvent::Stop => {
                if let Some(s) = d.auto_stop.take() {
                    self.regs.response[3] = s.response;
                    self.ints.auto_cmd_err |= s.auto_cmd_err;
                    self.ints.raise_error(s.error_bits);
                }
                true
            }
            DatEvent::BusyCheck => {
                if let Some(b) = d.busy.as_mut() {
                    b.checked = true;
                    let limit = b.from.saturating_add(d.budget);
                    if self.card.busy_until().is_some_and(|end| end > limit) {
                        log::debug!("CMD{}: busy beyond the data time-out", d.opcode);
                        d.fail(Failure::new(
                            t,
                            error_int::DATA_TIMEOUT,
                            SdhciError::DataTimeout,
                        ));
                    }
                }
                true
            }
            DatEvent::Fail => {
                let f = d.failure.take().expect("the event was a failure");
                self.ints.raise_error(f.error);
                self.ints.auto_cmd_err |= f.auto_cmd_err;
                if let Some((status, addr)) = f.adma {
                    self.regs.adma_error = status;
                    self.regs.adma_address = addr;
                }
                self.end_log(&mut d, t, f.data_error);
                false
            }
            DatEvent::Done => {
                self.complete(&mut d, t);
                false
            }
        };
        if keep {
            self.dat = Some(d);
        } else {
            self.shrink_buffer();
        }
        true
    }

    fn engine_event(&mut self, d: &mut DatPhase) {
        match &mut d.engine {
            Engine::PioRead { ready, .. } => {
                *ready = true;
                self.ints.raise(normal_int::BUF_READ_READY);
            }
            Engine::PioWrite { ready, .. } => {
                *ready = true;
                self.ints.raise(normal_int::BUF_WRITE_READY);
            }
            Engine::Sdma {
                pause_at,
                paused,
                addr,
                ..
            } => {
                *pause_at = None;
                *paused = true;
                self.regs.sdma_address = *addr;
                self.ints.raise(normal_int::DMA_INT);
            }
            Engine::Adma { next, .. } => {
                *next += 1;
                self.ints.raise(normal_int::DMA_INT);
            }
            Engine::None | Engine::Tuning { .. } => {}
        }
    }

    /// The phase ends well at `t`.
    fn complete(&mut self, d: &mut DatPhase, t: Nanos) {
        match d.engine {
            Engine::Tuning { brr, intact } => {
                if brr {
                    self.ints.raise(normal_int::BUF_READ_READY);
                }
                self.tuning_result(intact);
            }
            _ => {
                self.ints.raise(normal_int::TRANSFER_COMPLETE);
                if d.counts_blocks {
                    self.regs.block_count = 0;
                }
                if let Some(next) = d.adma_next {
                    self.regs.adma_address = next;
                }
                if let Engine::Sdma { addr, .. } = d.engine {
                    self.regs.sdma_address = addr;
                }
            }
        }
        self.end_log(d, t, None);
    }

    /// Write the phase's held command log entry and complete its command record: it
    /// lasted until `end`.
    pub(super) fn end_log(&mut self, d: &mut DatPhase, end: Nanos, data_error: Option<SdhciError>) {
        self.close_record(d.record.take(), end, data_error);
        if let Some(e) = d.log.take() {
            let data_error = if e.data.is_some() { data_error } else { None };
            self.host.write_log(&e, end, data_error, false);
        }
    }

    /// Give back a transfer buffer a large transfer grew.
    pub(super) fn shrink_buffer(&mut self) {
        if self.buf.capacity() > 1 << 20 {
            self.buf = Vec::new();
        }
    }

    // ---- reads ---------------------------------------------------------------------------

    /// Deliver a read's data (already in `self.buf`) by ADMA2 along `chain`, from `start`;
    /// the blocks arrive as `arrivals` says.
    pub(super) fn adma_read(
        &mut self,
        d: &mut DatPhase,
        chain: &AdmaChain,
        arrivals: Arrivals,
        wide: bool,
        dma: &dyn DmaMemory,
    ) {
        let len = d.len();
        let size = desc_len(wide);
        let mut moved = 0u64;
        let mut fault = None;
        for seg in &chain.segs {
            if moved >= len {
                break;
            }
            let n = u64::from(seg.len).min(len - moved);
            let bytes = &self.buf[moved as usize..(moved + n) as usize];
            if !in_address_space(seg.addr, bytes.len()) || dma.write(seg.addr, bytes).is_err() {
                log::debug!("ADMA2: write of {n} bytes at {:#x} failed", seg.addr);
                fault = Some((moved, adma_err::ST_TFR, seg.desc.wrapping_add(size)));
                break;
            }
            moved += n;
        }
        let fault = fault.or_else(|| chain_fault(chain, len, size));
        let until = fault.map_or(len, |(at, _, _)| at);
        let marks = chain
            .int_marks
            .iter()
            .filter(|&&m| m <= until)
            .map(|&m| arrivals.bytes(m))
            .collect();
        d.engine = Engine::Adma { marks, next: 0 };
        match fault {
            Some((at, status, addr)) => d.fail(Failure {
                adma: Some((status, addr)),
                ..Failure::new(
                    arrivals.bytes(at),
                    error_int::ADMA_ERR,
                    SdhciError::Adma(status),
                )
            }),
            None => {
                d.delivered = Some(arrivals.bytes(len));
                if let ChainEnd::End { next } = chain.end {
                    d.adma_next = Some(next);
                }
            }
        }
    }

    /// Move the next SDMA chunk of a read to guest memory at `at` (the start, or when the
    /// guest restarted the DMA).
    pub(super) fn sdma_read_chunk(&mut self, d: &mut DatPhase, at: Nanos, dma: &dyn DmaMemory) {
        let len = d.len();
        let Engine::Sdma {
            arrivals: Some(arrivals),
            addr,
            boundary,
            moved,
            pause_at,
            paused,
        } = &mut d.engine
        else {
            return;
        };
        let room = *boundary - u64::from(*addr) % *boundary;
        let n = room.min(len - *moved);
        let bytes = &self.buf[*moved as usize..(*moved + n) as usize];
        if dma.write(u64::from(*addr), bytes).is_err() {
            log::warn!("SDMA: write of {n} bytes at {addr:#x} outside guest memory, dropped");
        }
        *moved += n;
        *addr = addr.wrapping_add(n as u32);
        *paused = false;
        let t = at.max(arrivals.bytes(*moved));
        if *moved < len {
            *pause_at = Some(t);
        } else {
            d.delivered = Some(t);
        }
    }

    /// One byte read from the Buffer Data Port.
    pub(super) fn pio_read_byte(&mut self) -> u8 {
        let now = self.now;
        let Some(d) = self.dat.as_mut() else {
            self.bad_access("Buffer Data Port read with no transfer");
            return 0;
        };
        let (blksz, blocks) = (d.blksz, d.blocks);
        let Engine::PioRead {
            next,
            pos,
            ready,
            free_since,
            ..
        } = &mut d.engine
        else {
            self.bad_access("Buffer Data Port read outside a PIO read");
            return 0;
        };
        if !*ready {
            self.bad_access("Buffer Data Port read while Buffer Read Enable is 0");
            return 0;
        }
        let b = self
            .buf
            .get(*next as usize * blksz + *pos)
            .copied()
            .unwrap_or(0);
        *pos += 1;
        if *pos == blksz {
            *pos = 0;
            *ready = false;
            *next += 1;
            *free_since = now;
            if *next == blocks {
                d.delivered = Some(now);
            }
        }
        b
    }

    // ---- writes --------------------------------------------------------------------------

    /// One byte written to the Buffer Data Port; a full block goes to the card.
    pub(super) fn pio_write_byte(&mut self, b: u8) {
        let Some(mut d) = self.dat.take() else {
            self.bad_access("Buffer Data Port write with no transfer");
            return;
        };
        let full = match &mut d.engine {
            Engine::PioWrite { pos, ready, .. } if *ready && d.failure.is_none() => {
                self.buf[*pos] = b;
                *pos += 1;
                if *pos == d.blksz {
                    *pos = 0;
                    *ready = false;
                    true
                } else {
                    false
                }
            }
            Engine::PioWrite { .. } => {
                self.bad_access("Buffer Data Port write while Buffer Write Enable is 0");
                false
            }
            _ => {
                self.bad_access("Buffer Data Port write outside a PIO write");
                false
            }
        };
        if full {
            let at = self.now;
            let upto = d.sent + 1;
            if self.send_to_card(&mut d, at, 0, upto) {
                if let Engine::PioWrite { free_at, .. } = &mut d.engine {
                    *free_at = d.bus_free;
                }
            }
        }
        self.dat = Some(d);
    }

    /// Fetch the next SDMA chunk of a write from guest memory at `at` and send the blocks
    /// it completes.
    pub(super) fn sdma_write_chunk(&mut self, d: &mut DatPhase, at: Nanos, dma: &dyn DmaMemory) {
        let len = d.len();
        let Engine::Sdma {
            addr,
            boundary,
            moved,
            paused,
            ..
        } = &mut d.engine
        else {
            return;
        };
        let room = *boundary - u64::from(*addr) % *boundary;
        let n = room.min(len - *moved);
        let range = *moved as usize..(*moved + n) as usize;
        if dma
            .read(u64::from(*addr), &mut self.buf[range.clone()])
            .is_err()
        {
            log::warn!("SDMA: read of {n} bytes at {addr:#x} outside guest memory, zeros sent");
            self.buf[range].fill(0);
        }
        *moved += n;
        *addr = addr.wrapping_add(n as u32);
        *paused = false;
        let fetched = *moved;
        let upto = (fetched / d.blksz as u64) as u32;
        let base = d.sent as usize * d.blksz;
        let ok = self.send_to_card(d, at, base, upto);
        if ok && fetched < len {
            let when = at.max(d.bus_free);
            if let Engine::Sdma { pause_at, .. } = &mut d.engine {
                *pause_at = Some(when);
            }
        }
    }

    /// Send blocks `d.sent..upto` to the card from `at` (or when the bus is free), taken
    /// from `self.buf[from..]`. The last block of the transfer carries the fault plan's
    /// pending busy effects, and its end starts what follows the data.
    pub(super) fn send_to_card(
        &mut self,
        d: &mut DatPhase,
        at: Nanos,
        from: usize,
        upto: u32,
    ) -> bool {
        if upto <= d.sent || d.failure.is_some() {
            return d.failure.is_none();
        }
        let start = at.max(d.bus_free);
        let n = (upto - d.sent) as usize;
        let last = upto == d.blocks;
        let data = &self.buf[from..from + n * d.blksz];
        if d.sent == 0 {
            if let Some(r) = d.record.as_mut().filter(|r| r.packed_write()) {
                r.header = data
                    .get(..512)
                    .and_then(|h| h.try_into().ok())
                    .map(Box::new);
            }
        }
        let injected = if last { Some(&mut d.injected) } else { None };
        match card_steps::send_blocks(
            &mut self.host,
            &mut self.card,
            start,
            d.opcode,
            data,
            d.blksz,
            d.per_block,
            d.budget,
            injected,
            d.garbled.take(),
        ) {
            Ok(end) => {
                d.sent = upto;
                d.bus_free = end;
                if last {
                    self.write_done(d);
                }
                true
            }
            Err(f) => {
                d.fail(f);
                false
            }
        }
    }

    /// All of a write's blocks are on the card: tell the fault plan, send the Auto CMD12
    /// if the transfer asked for one, and wait for the card's busy.
    fn write_done(&mut self, d: &mut DatPhase) {
        self.host.note_written(d.len());
        d.delivered = Some(d.bus_free);
        self.after_data(d, d.bus_free);
    }

    /// The data is done on the card's side at `at`: Auto CMD12 if asked for, then the
    /// busy wait (R1b, or a write's programming).
    pub(super) fn after_data(&mut self, d: &mut DatPhase, at: Nanos) {
        let mut from = at;
        if d.auto_cmd12 {
            let (stop, error) =
                card_steps::auto_cmd12(&mut self.host, &mut self.card, at, &mut d.log);
            from = stop.at;
            d.auto_stop = Some(stop);
            if let Some(e) = error {
                // sdhci_cmd_irq takes an Auto CMD12 error as the data's.
                let data_error = if e == SdhciError::CmdTimeout {
                    SdhciError::DataTimeout
                } else {
                    SdhciError::DataCrc
                };
                d.failure = Some(Failure::quiet(stop.at, Some(data_error)));
                return;
            }
        }
        d.busy = Some(BusyWait {
            from,
            checked: false,
        });
    }

    /// The guest wrote the SDMA System Address's top byte: a paused SDMA goes on there.
    pub(super) fn sdma_restart(&mut self, dma: &dyn DmaMemory) {
        let Some(mut d) = self.dat.take() else {
            return;
        };
        if let Engine::Sdma {
            paused: true, addr, ..
        } = &mut d.engine
        {
            *addr = self.regs.sdma_address;
            let now = self.now;
            if d.read == Some(true) {
                self.sdma_read_chunk(&mut d, now, dma);
            } else {
                self.sdma_write_chunk(&mut d, now, dma);
            }
        }
        self.dat = Some(d);
    }

    /// An Abort command ends the data phase at once: nothing more moves, no Transfer
    /// Complete (the guest resets the DAT line next).
    pub(super) fn abort_data(&mut self) {
        if let Some(mut d) = self.dat.take() {
            log::debug!("CMD{}: data phase aborted", d.opcode);
            let now = self.now;
            self.end_log(&mut d, now, Some(SdhciError::DataTimeout));
            self.shrink_buffer();
        }
    }
}

/// What a walked chain says about a transfer of `len` bytes once its bytes are moved: too
/// short (a bad descriptor, or End too early) or too long (End after more than `len`).
/// Returns the byte offset of the error, the ADMA Error Status and the address to show.
fn chain_fault(chain: &AdmaChain, len: u64, size: u64) -> Option<(u64, u8, u64)> {
    match chain.end {
        ChainEnd::Bad { desc } if chain.total < len => Some((chain.total, adma_err::ST_FDS, desc)),
        ChainEnd::End { next } if chain.total != len => {
            let at = chain.total.min(len);
            Some((
                at,
                adma_err::LENGTH_MISMATCH | adma_err::ST_TFR,
                chain.desc_after(at, size, next),
            ))
        }
        _ => None,
    }
}

/// ADMA2 for a write: gather the transfer's bytes along `chain` into `buf` (as far as the
/// chain and guest memory allow); returns how many bytes came and the fault that stopped
/// it, if one did.
pub(super) fn adma_gather(
    chain: &AdmaChain,
    len: u64,
    wide: bool,
    buf: &mut [u8],
    dma: &dyn DmaMemory,
) -> (u64, Option<(u64, u8, u64)>) {
    let size = desc_len(wide);
    let mut moved = 0u64;
    for seg in &chain.segs {
        if moved >= len {
            break;
        }
        let n = u64::from(seg.len).min(len - moved);
        let dst = &mut buf[moved as usize..(moved + n) as usize];
        if !in_address_space(seg.addr, dst.len()) || dma.read(seg.addr, dst).is_err() {
            log::debug!("ADMA2: read of {n} bytes at {:#x} failed", seg.addr);
            return (
                moved,
                Some((moved, adma_err::ST_TFR, seg.desc.wrapping_add(size))),
            );
        }
        moved += n;
    }
    (moved, chain_fault(chain, len, size))
}
