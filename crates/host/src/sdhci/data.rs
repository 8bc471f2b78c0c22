//! The data phase and DAT0 busy, as the controller and Linux's `sdhci_prepare_data`,
//! `sdhci_data_irq` and `sdhci_finish_data` see them: the request's geometry checked and
//! its ADMA2 table built before the command goes out, blocks read or written in bus and
//! card time through the table (or straight from a single plain segment), garbled blocks
//! on a mismatched bus, data and busy time-outs, and the fault plan's data effects.
//!
//! The card-facing steps are methods both controller models call: [`Run::data_start`]
//! (what the bus and the fault plan make of the phase before any block moves),
//! [`Run::receive_blocks`] (read blocks off the card), [`Run::send_blocks`] (write blocks
//! to it), [`Run::garble_read`] and [`Run::garble_write`]. They report a failure as a
//! [`DataFault`] and leave its waiting to the caller: the request-level model spends it
//! at once ([`Run::data_fault`]); the register-level model (`mmio/`) reveals it when the
//! guest's time reaches it, without running the card ahead.

use emmc_card::timing::{Bus, Nanos};
use emmc_card::DataError;

use super::adma;
use super::run::Run;
use super::{adma_err, error_int, DataDirection, DmaSegment, MmcData, SdhciError};
use crate::fault::Effect;

/// The v3 Block Count register is 16 bits wide.
pub const MAX_BLOCK_COUNT: u32 = 65_535;

/// How a data step failed, before the controller has spent the time it takes to notice.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum DataFault {
    /// No block comes (or no CRC status token): DATA_TIMEOUT `after` from now.
    Timeout { after: Nanos },
    /// A block failed its CRC on one side or the other; now is the instant it is known.
    Crc,
    /// Already raised and timed (a busy time-out while waiting in place).
    Raised(SdhciError),
}

/// What the bus makes of a data phase about to begin.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct DataStart {
    /// The card's block length for this transfer.
    pub(super) card_len: usize,
    /// Why every block would be garbage on the other side, if it would.
    pub(super) problem: Option<&'static str>,
}

impl Run<'_> {
    /// Check the request's geometry and build its ADMA2 table.
    pub(super) fn prepare_adma<S: DmaSegment>(&mut self, d: &MmcData<'_, S>) -> Result<(), u8> {
        let mismatch = adma_err::LENGTH_MISMATCH | adma_err::ST_TFR;
        if d.blksz == 0 || d.blksz > self.host.config.max_block_len {
            log::debug!("ADMA2: block size {} not supported", d.blksz);
            return Err(mismatch);
        }
        if d.blocks == 0 || d.blocks > MAX_BLOCK_COUNT {
            log::debug!(
                "ADMA2: {} blocks do not fit the 16-bit block count",
                d.blocks
            );
            return Err(mismatch);
        }
        let mut table = std::mem::take(&mut self.host.table);
        let built = adma::build_table(d.sg, &self.host.config.adma, &mut table);
        self.host.table = table;
        let total = built?;
        let wanted = u64::from(d.blksz) * u64::from(d.blocks);
        if total != wanted {
            log::debug!("ADMA2: table holds {total} bytes, transfer is {wanted}");
            return Err(mismatch);
        }
        Ok(())
    }

    /// Wait while the card holds DAT0 busy, at most `limit`. `false`: data time-out.
    pub(super) fn wait_busy(&mut self, limit: Nanos) -> bool {
        self.wait_busy_within(limit, limit)
    }

    /// Busy after data: allowed `budget` in all, the time-out firing `per_block` after the
    /// busy began when the budget is exceeded.
    pub(super) fn wait_busy_within(&mut self, per_block: Nanos, budget: Nanos) -> bool {
        let mut ok = true;
        if self.defer_now {
            self.out.busy_pending = self.card.busy_until().is_some_and(|end| end > self.now);
            self.card.advance(self.now);
            return true;
        }
        if let Some(end) = self.card.busy_until() {
            if end > self.now {
                let busy = end - self.now;
                if busy > budget {
                    log::debug!("busy of {busy} ns exceeds the {budget} ns time-out");
                    self.now = self.now.saturating_add(per_block);
                    self.out.int_status.raise_error(error_int::DATA_TIMEOUT);
                    ok = false;
                } else {
                    self.now = end;
                }
            }
        }
        self.card.advance(self.now);
        ok
    }

    fn data_timeout(&mut self, after: Nanos) -> SdhciError {
        self.now = self.now.saturating_add(after);
        self.card.advance(self.now);
        self.out.int_status.raise_error(error_int::DATA_TIMEOUT);
        SdhciError::DataTimeout
    }

    /// A CRC failure known now: the card catches up and DATA_CRC is raised.
    pub(super) fn data_crc(&mut self) -> SdhciError {
        self.card.advance(self.now);
        self.out.int_status.raise_error(error_int::DATA_CRC);
        SdhciError::DataCrc
    }

    fn adma_error(&mut self, status: u8) -> SdhciError {
        self.out.adma_err = status;
        self.out.int_status.raise_error(error_int::ADMA_ERR);
        SdhciError::Adma(status)
    }

    /// Spend a fault at once, as the request-level controller does: wait out a time-out,
    /// raise the status bits, and name the error.
    fn data_fault(&mut self, fault: DataFault) -> SdhciError {
        match fault {
            DataFault::Timeout { after } => self.data_timeout(after),
            DataFault::Crc => self.data_crc(),
            DataFault::Raised(e) => e,
        }
    }

    /// What the bus and the fault plan make of a data phase of `blksz`-byte blocks about
    /// to begin: the card must be transferring (else the host waits in vain), and a width,
    /// rate, speed or block size the card does not share garbles every block, as does a
    /// planned CRC error; a planned stall is a time-out. `tuning`: the block is a tuning
    /// block (exempt from the untuned-HS200 rule).
    pub(super) fn data_start(
        &mut self,
        read: bool,
        tuning: bool,
        blksz: usize,
        bus: &Bus,
        per_block: Nanos,
    ) -> Result<DataStart, DataFault> {
        let wait = |bus: &Bus| {
            if read {
                per_block
            } else {
                bus.write_ns(blksz, 1).saturating_add(per_block)
            }
        };
        let Some(card_len) = self.card.transfer_block_len() else {
            // The card started no transfer: no data, no CRC status token.
            log::debug!(
                "data phase: the card is not transferring ({})",
                self.card.state()
            );
            return Err(DataFault::Timeout { after: wait(bus) });
        };
        let mut problem = self.host.data_bus_problem(self.card, read, tuning);
        if problem.is_none() && card_len != blksz {
            problem = Some("block size differs from the card's");
        }
        match self.injected.data.take() {
            Some(Effect::DataCrc) => problem = Some("fault plan: data CRC error"),
            Some(_) => {
                // The data stalls: the card sends no block, or never answers the written one.
                log::debug!("data phase: fault plan stalls the data");
                return Err(DataFault::Timeout { after: wait(bus) });
            }
            None => {}
        }
        Ok(DataStart { card_len, problem })
    }

    pub(super) fn data_phase<S: DmaSegment>(
        &mut self,
        d: &mut MmcData<'_, S>,
        per_block: Nanos,
        budget: Nanos,
    ) -> Result<(), SdhciError> {
        let bus = self.host.bus();
        let blksz = d.blksz as usize;
        let blocks = u64::from(d.blocks);
        let len = blksz * d.blocks as usize;
        let read = d.direction == DataDirection::Read;
        let DataStart { card_len, problem } =
            match self.data_start(read, false, blksz, &bus, per_block) {
                Ok(start) => start,
                Err(fault) => return Err(self.data_fault(fault)),
            };
        // One plain-memory segment holding exactly the transfer: the DMA engine's view and
        // the card's are the same bytes, so skip the staging copy.
        let direct = problem.is_none() && d.sg.len() == 1 && d.sg[0].len() == len;
        if direct && !read {
            if let Some(data) = d.sg[0].as_slice() {
                return self
                    .send_blocks(data, blksz, blocks, &bus, per_block, budget)
                    .map_err(|f| self.data_fault(f));
            }
        }
        let mut staging = std::mem::take(&mut self.host.staging);
        let result = if read {
            match problem {
                Some(why) => {
                    let fault = self.garble_read(&mut staging, card_len, &bus, why);
                    Err(self.data_fault(fault))
                }
                None => self.read_blocks(d, &mut staging, len, &bus, per_block, budget),
            }
        } else {
            staging.resize(len, 0);
            match adma::gather(&self.host.table, d.sg, &mut staging[..len]) {
                Err(status) => Err(self.adma_error(status)),
                Ok(()) => match problem {
                    Some(why) => {
                        let fault = self.garble_write(blksz, &bus, why);
                        Err(self.data_fault(fault))
                    }
                    None => self
                        .send_blocks(&staging[..len], blksz, blocks, &bus, per_block, budget)
                        .map_err(|f| self.data_fault(f)),
                },
            }
        };
        self.host.staging = staging;
        result
    }

    /// The card sends its first block; the host cannot make sense of it.
    pub(super) fn garble_read(
        &mut self,
        staging: &mut Vec<u8>,
        card_len: usize,
        bus: &Bus,
        why: &str,
    ) -> DataFault {
        log::debug!("read data garbled: {why}");
        staging.resize(card_len, 0);
        let internal = self
            .card
            .read_data(self.now, &mut staging[..card_len])
            .unwrap_or(0);
        self.now = self
            .now
            .saturating_add(internal)
            .saturating_add(bus.read_ns(card_len, 1));
        DataFault::Crc
    }

    /// The host sends the first block; the card cannot make sense of it and answers a
    /// negative CRC status.
    pub(super) fn garble_write(&mut self, blksz: usize, bus: &Bus, why: &str) -> DataFault {
        log::debug!("write data garbled: {why}");
        self.now = self.now.saturating_add(bus.write_ns(blksz, 1));
        DataFault::Crc
    }

    fn read_blocks<S: DmaSegment>(
        &mut self,
        d: &mut MmcData<'_, S>,
        staging: &mut Vec<u8>,
        len: usize,
        bus: &Bus,
        per_block: Nanos,
        budget: Nanos,
    ) -> Result<(), SdhciError> {
        let blksz = d.blksz as usize;
        let direct = d.sg.len() == 1 && d.sg[0].len() == len && d.sg[0].as_mut_slice().is_some();
        let target: &mut [u8] = if direct {
            d.sg[0].as_mut_slice().expect("checked: plain memory")
        } else {
            staging.resize(len, 0);
            &mut staging[..len]
        };
        if let Err(fault) =
            self.receive_blocks(target, blksz, u64::from(d.blocks), bus, per_block, budget)
        {
            return Err(self.data_fault(fault));
        }
        if direct {
            return Ok(());
        }
        adma::scatter(&self.host.table, d.sg, &staging[..len])
            .map_err(|status| self.adma_error(status))
    }

    /// Read `blocks` blocks of `blksz` bytes off the card into `target` (the whole of it):
    /// the card's access and internal read time (plus any planned latency), planned bit
    /// flips, the time-out check against `budget`, then the bus time. On success now is
    /// the end of the last block.
    pub(super) fn receive_blocks(
        &mut self,
        target: &mut [u8],
        blksz: usize,
        blocks: u64,
        bus: &Bus,
        per_block: Nanos,
        budget: Nanos,
    ) -> Result<(), DataFault> {
        if let Some(left) = self.card.transfer_blocks_left().filter(|&l| l < blocks) {
            return Err(self.receive_short(target, blksz, left, bus, per_block));
        }
        match self.card.read_data(self.now, target) {
            Ok(internal) => {
                let internal = match self.injected.extra_busy.take() {
                    Some((ns, _)) => internal.saturating_add(ns),
                    None => internal,
                };
                if self.injected.bit_flips > 0 {
                    let flips = std::mem::take(&mut self.injected.bit_flips);
                    if let Some(f) = self.host.faults.as_deref_mut() {
                        let bits = target.len() as u64 * 8;
                        for _ in 0..flips {
                            let bit = f.draw(bits);
                            target[(bit / 8) as usize] ^= 1 << (bit % 8);
                        }
                        log::info!("fault: {flips} bits flipped in {} bytes read", target.len());
                    }
                }
                if internal > budget {
                    log::debug!("read access of {internal} ns exceeds the {budget} ns time-out");
                    return Err(DataFault::Timeout { after: per_block });
                }
                self.now = self
                    .now
                    .saturating_add(internal)
                    .saturating_add(bus.read_ns(blksz, blocks));
                self.card.advance(self.now);
                Ok(())
            }
            Err(DataError::Stopped { blocks_done, .. }) => {
                // The card stopped sending; the host waits for the next block in vain.
                let sent = bus.read_ns(blksz, blocks_done);
                Err(DataFault::Timeout {
                    after: sent.saturating_add(per_block),
                })
            }
            Err(e) => {
                log::debug!("read data: {e}");
                Err(DataFault::Timeout { after: per_block })
            }
        }
    }

    /// The host reads more blocks than the card's command sends (CMD17 with two blocks,
    /// say): the card sends its `left` and goes back to transfer state, and the host waits
    /// for the next block in vain.
    fn receive_short(
        &mut self,
        target: &mut [u8],
        blksz: usize,
        left: u64,
        bus: &Bus,
        per_block: Nanos,
    ) -> DataFault {
        log::debug!("read data: the card sends {left} block(s), the host expects more");
        let mut sent = 0;
        if left > 0 {
            if let Ok(internal) = self
                .card
                .read_data(self.now, &mut target[..left as usize * blksz])
            {
                self.now = self.now.saturating_add(internal);
                sent = left;
            }
        }
        DataFault::Timeout {
            after: bus.read_ns(blksz, sent).saturating_add(per_block),
        }
    }

    /// The host writes more blocks than the card's command takes (CMD24 with two
    /// blocks, say): the card takes its `left`, programs them and goes back to transfer
    /// state, and sends no CRC status token for the next block, which the host waits for
    /// in vain.
    fn send_short(
        &mut self,
        data: &[u8],
        blksz: usize,
        left: u64,
        bus: &Bus,
        per_block: Nanos,
    ) -> DataFault {
        log::debug!("write data: the card takes {left} block(s), the host sends more");
        if left > 0 {
            let sent = self.now.saturating_add(bus.write_ns(blksz, left));
            if self
                .card
                .write_data(sent, &data[..left as usize * blksz])
                .is_ok()
            {
                self.now = sent;
            }
        }
        self.now = self.now.saturating_add(bus.write_ns(blksz, 1));
        DataFault::Timeout { after: per_block }
    }

    /// Write `data` (`blocks` blocks of `blksz` bytes) to the card from now: the bus time
    /// with the CRC status tokens, the card's verdict, planned extra busy, then the busy
    /// wait (or, when deferred, its start). On success now is the end of the busy (or of
    /// the last block when the busy is deferred).
    pub(super) fn send_blocks(
        &mut self,
        data: &[u8],
        blksz: usize,
        blocks: u64,
        bus: &Bus,
        per_block: Nanos,
        budget: Nanos,
    ) -> Result<(), DataFault> {
        if let Some(left) = self.card.transfer_blocks_left().filter(|&l| l < blocks) {
            return Err(self.send_short(data, blksz, left, bus, per_block));
        }
        let sent = self.now.saturating_add(bus.write_ns(blksz, blocks));
        match self.card.write_data(sent, data) {
            Ok(()) => {
                self.now = sent;
                if let Some((ns, stuck)) = self.injected.extra_busy.take() {
                    self.card.extend_busy(ns, stuck);
                }
                if self.wait_busy_within(per_block, budget) {
                    Ok(())
                } else {
                    Err(DataFault::Raised(SdhciError::DataTimeout))
                }
            }
            Err(DataError::Stopped { blocks_done, .. }) => {
                // Negative CRC status on the first block the card refused.
                let n = (blocks_done + 1).min(blocks);
                self.now = self.now.saturating_add(bus.write_ns(blksz, n));
                Err(DataFault::Crc)
            }
            Err(DataError::NoTransfer(state)) => {
                log::debug!("write data: card in {state}");
                self.now = self.now.saturating_add(bus.write_ns(blksz, 1));
                Err(DataFault::Timeout { after: per_block })
            }
            Err(e) => {
                log::debug!("write data refused: {e}");
                self.now = self.now.saturating_add(bus.write_ns(blksz, 1));
                Err(DataFault::Crc)
            }
        }
    }
}
