//! The data phase and DAT0 busy, as the controller and Linux's `sdhci_prepare_data`,
//! `sdhci_data_irq` and `sdhci_finish_data` see them: the request's geometry checked and
//! its ADMA2 table built before the command goes out, blocks read or written in bus and
//! card time through the table (or straight from a single plain segment), garbled blocks
//! on a mismatched bus, data and busy time-outs, and the fault plan's data effects.

use emmc_card::timing::{Bus, Nanos};
use emmc_card::DataError;

use super::adma;
use super::run::Run;
use super::{adma_err, error_int, DataDirection, DmaSegment, MmcData, SdhciError};
use crate::fault::Effect;

/// The v3 Block Count register is 16 bits wide.
pub const MAX_BLOCK_COUNT: u32 = 65_535;

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

    fn data_crc(&mut self) -> SdhciError {
        self.card.advance(self.now);
        self.out.int_status.raise_error(error_int::DATA_CRC);
        SdhciError::DataCrc
    }

    fn adma_error(&mut self, status: u8) -> SdhciError {
        self.out.adma_err = status;
        self.out.int_status.raise_error(error_int::ADMA_ERR);
        SdhciError::Adma(status)
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
        let Some(card_len) = self.card.transfer_block_len() else {
            // The card started no transfer: no data, no CRC status token.
            log::debug!(
                "data phase: the card is not transferring ({})",
                self.card.state()
            );
            let wait = if read {
                per_block
            } else {
                bus.write_ns(blksz, 1).saturating_add(per_block)
            };
            return Err(self.data_timeout(wait));
        };
        let mut problem = self.host.data_bus_problem(self.card, read, false);
        if problem.is_none() && card_len != blksz {
            problem = Some("block size differs from the card's");
        }
        match self.injected.data.take() {
            Some(Effect::DataCrc) => problem = Some("fault plan: data CRC error"),
            Some(_) => {
                // The data stalls: the card sends no block, or never answers the written one.
                log::debug!("data phase: fault plan stalls the data");
                let wait = if read {
                    per_block
                } else {
                    bus.write_ns(blksz, 1).saturating_add(per_block)
                };
                return Err(self.data_timeout(wait));
            }
            None => {}
        }
        // One plain-memory segment holding exactly the transfer: the DMA engine's view and
        // the card's are the same bytes, so skip the staging copy.
        let direct = problem.is_none() && d.sg.len() == 1 && d.sg[0].len() == len;
        if direct && !read {
            if let Some(data) = d.sg[0].as_slice() {
                return self.write_blocks(data, blksz, blocks, &bus, per_block, budget);
            }
        }
        let mut staging = std::mem::take(&mut self.host.staging);
        let result = if read {
            match problem {
                Some(why) => self.garbled_read(&mut staging, card_len, &bus, why),
                None => self.read_blocks(d, &mut staging, len, &bus, per_block, budget),
            }
        } else {
            staging.resize(len, 0);
            match adma::gather(&self.host.table, d.sg, &mut staging[..len]) {
                Err(status) => Err(self.adma_error(status)),
                Ok(()) => match problem {
                    Some(why) => {
                        log::debug!("write data garbled: {why}");
                        self.now = self.now.saturating_add(bus.write_ns(blksz, 1));
                        Err(self.data_crc())
                    }
                    None => {
                        self.write_blocks(&staging[..len], blksz, blocks, &bus, per_block, budget)
                    }
                },
            }
        };
        self.host.staging = staging;
        result
    }

    /// The card sends its first block; the host cannot make sense of it.
    fn garbled_read(
        &mut self,
        staging: &mut Vec<u8>,
        card_len: usize,
        bus: &Bus,
        why: &str,
    ) -> Result<(), SdhciError> {
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
        Err(self.data_crc())
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
                    return Err(self.data_timeout(per_block));
                }
                self.now = self
                    .now
                    .saturating_add(internal)
                    .saturating_add(bus.read_ns(blksz, u64::from(d.blocks)));
                self.card.advance(self.now);
                if direct {
                    return Ok(());
                }
                adma::scatter(&self.host.table, d.sg, &staging[..len])
                    .map_err(|status| self.adma_error(status))
            }
            Err(DataError::Stopped { blocks_done, .. }) => {
                // The card stopped sending; the host waits for the next block in vain.
                let sent = bus.read_ns(blksz, blocks_done);
                Err(self.data_timeout(sent.saturating_add(per_block)))
            }
            Err(e) => {
                log::debug!("read data: {e}");
                Err(self.data_timeout(per_block))
            }
        }
    }

    fn write_blocks(
        &mut self,
        data: &[u8],
        blksz: usize,
        blocks: u64,
        bus: &Bus,
        per_block: Nanos,
        budget: Nanos,
    ) -> Result<(), SdhciError> {
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
                    Err(SdhciError::DataTimeout)
                }
            }
            Err(DataError::Stopped { blocks_done, .. }) => {
                // Negative CRC status on the first block the card refused.
                let n = (blocks_done + 1).min(blocks);
                self.now = self.now.saturating_add(bus.write_ns(blksz, n));
                Err(self.data_crc())
            }
            Err(DataError::NoTransfer(state)) => {
                log::debug!("write data: card in {state}");
                self.now = self.now.saturating_add(bus.write_ns(blksz, 1));
                Err(self.data_timeout(per_block))
            }
            Err(e) => {
                log::debug!("write data refused: {e}");
                self.now = self.now.saturating_add(bus.write_ns(blksz, 1));
                Err(self.data_crc())
            }
        }
    }
}
