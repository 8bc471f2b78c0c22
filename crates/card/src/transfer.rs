//! Data commands and data phases: CMD8, 12, 14, 16, 17, 18, 19, 21, 23, 24, 25, 26, 27,
//! 30, 31, 42, 56; packed reads and writes; reliable write and forced programming; and
//! the block-level data API ([`Card::read_data`], [`Card::write_data`]). The state of a
//! data phase is the data part (`parts/data.rs`); RPMB frames go through `rpmb_io.rs`.

use super::one_or_many::OneOrMany;
use super::packed::{self, Direction, Header, HeaderError};
use super::partition::Partition;
use super::parts::busy::{OpKind, ProgramOp, Segment};
use super::parts::data::{Sbc, SectorRead, SectorWrite, Sink, Transfer};
use super::status::r1;
use super::{ext_csd, Card, CardState, DataError, Exec, Handled};
use crate::timing::{Cost, Nanos, ProgramTarget, SwitchKind};

const SECTOR: usize = 512;
/// An open-ended write is programmed in pieces of this size as it streams in, so that a
/// guest streaming blocks without end cannot make the card hold unbounded data.
const OPEN_ENDED_STAGING: usize = 8 << 20;

/// HS200 tuning block for a 4-bit bus (JESD84-B45 §6.6.5.1; facts §12.6).
const TUNING_BLOCK_4BIT: [u8; 64] = [
    0xff, 0x0f, 0xff, 0x00, 0xff, 0xcc, 0xc3, 0xcc, 0xc3, 0x3c, 0xcc, 0xff, 0xfe, 0xff, 0xfe, 0xef,
    0xff, 0xdf, 0xff, 0xdd, 0xff, 0xfb, 0xff, 0xfb, 0xbf, 0xff, 0x7f, 0xff, 0x77, 0xf7, 0xbd, 0xef,
    0xff, 0xf0, 0xff, 0xf0, 0x0f, 0xfc, 0xcc, 0x3c, 0xcc, 0x33, 0xcc, 0xcf, 0xff, 0xef, 0xff, 0xee,
    0xff, 0xfd, 0xff, 0xfd, 0xdf, 0xff, 0xbf, 0xff, 0xbb, 0xff, 0xf7, 0xff, 0xf7, 0x7f, 0x7b, 0xde,
];

/// HS200 tuning block for an 8-bit bus.
const TUNING_BLOCK_8BIT: [u8; 128] = [
    0xff, 0xff, 0x00, 0xff, 0xff, 0xff, 0x00, 0x00, 0xff, 0xff, 0xcc, 0xcc, 0xcc, 0x33, 0xcc, 0xcc,
    0xcc, 0x33, 0x33, 0xcc, 0xcc, 0xcc, 0xff, 0xff, 0xff, 0xee, 0xff, 0xff, 0xff, 0xee, 0xee, 0xff,
    0xff, 0xff, 0xdd, 0xff, 0xff, 0xff, 0xdd, 0xdd, 0xff, 0xff, 0xff, 0xbb, 0xff, 0xff, 0xff, 0xbb,
    0xbb, 0xff, 0xff, 0xff, 0x77, 0xff, 0xff, 0xff, 0x77, 0x77, 0xff, 0x77, 0xbb, 0xdd, 0xee, 0xff,
    0xff, 0xff, 0xff, 0x00, 0xff, 0xff, 0xff, 0x00, 0x00, 0xff, 0xff, 0xcc, 0xcc, 0xcc, 0x33, 0xcc,
    0xcc, 0xcc, 0x33, 0x33, 0xcc, 0xcc, 0xcc, 0xff, 0xff, 0xff, 0xee, 0xff, 0xff, 0xff, 0xee, 0xee,
    0xff, 0xff, 0xff, 0xdd, 0xff, 0xff, 0xff, 0xdd, 0xdd, 0xff, 0xff, 0xff, 0xbb, 0xff, 0xff, 0xff,
    0xbb, 0xbb, 0xff, 0xff, 0xff, 0x77, 0xff, 0xff, 0xff, 0x77, 0x77, 0xff, 0x77, 0xbb, 0xdd, 0xee,
];

impl Card {
    /// Decode a data address argument into a partition-relative LBA: sector addressing
    /// uses it as is; byte addressing needs 512-byte alignment.
    pub(super) fn address_to_lba(&self, arg: u32) -> Result<u64, u32> {
        if self.model.sector_addressing() {
            Ok(u64::from(arg))
        } else if arg % SECTOR as u32 != 0 {
            Err(r1::ADDRESS_MISALIGN)
        } else {
            Ok(u64::from(arg) / SECTOR as u64)
        }
    }

    /// Block length check for sector data in byte-addressed mode (READ_BL_PARTIAL and
    /// WRITE_BL_PARTIAL are 0: only whole 512-byte blocks).
    fn data_block_len_ok(&self) -> bool {
        self.model.sector_addressing() || self.data.block_len() == SECTOR as u32
    }

    fn cache_enabled(&self) -> bool {
        self.model.ext_csd.cache_size > 0 && self.regs.cache_on()
    }

    fn enhanced_reliable_write(&self) -> bool {
        self.model.ext_csd.wr_rel_param & ext_csd::EN_REL_WR != 0
    }

    /// Reliable-write granule for a transfer, or the R1 error a legacy card reports when
    /// the transfer breaks its rule (exactly REL_WR_SEC_C aligned blocks, or one block).
    fn reliable_granule(&self, lba: u64, count: u64) -> Result<u64, u32> {
        if self.enhanced_reliable_write() {
            return Ok(1);
        }
        let rel = u64::from(self.model.ext_csd.rel_wr_sec_c.max(1));
        if count == 1 {
            Ok(1)
        } else if count == rel && lba % rel == 0 {
            Ok(rel)
        } else {
            Err(r1::ADDRESS_MISALIGN)
        }
    }

    /// Start streaming the read buffer to the host, in blocks of `block_len`.
    pub(super) fn send_buffer(&mut self, block_len: usize) -> Handled {
        self.data.send(block_len);
        self.state = CardState::Data;
        Handled::R1
    }

    /// Send `bytes` to the host as one block.
    fn send_bytes(&mut self, bytes: &[u8]) -> Handled {
        self.data.send_bytes(bytes);
        self.state = CardState::Data;
        Handled::R1
    }

    // ---- register-like reads ----------------------------------------------------------

    pub(super) fn cmd8_send_ext_csd(&mut self, _x: &mut Exec) -> Handled {
        let e = self.ext_csd();
        self.send_bytes(&e)
    }

    pub(super) fn cmd16_set_blocklen(&mut self, x: &mut Exec) -> Handled {
        if let Err(e) = self.data.set_block_len(x.arg) {
            x.resp_status |= e;
        }
        Handled::R1
    }

    pub(super) fn cmd19_bustest_w(&mut self, _x: &mut Exec) -> Handled {
        self.data.set(Transfer::WriteBuffer {
            sink: Sink::BusTest,
            block_len: self.regs.bus_width_bytes(),
        });
        self.state = CardState::Btst;
        Handled::R1
    }

    pub(super) fn cmd14_bustest_r(&mut self, _x: &mut Exec) -> Handled {
        // Return the bitwise inverse of the pattern received with CMD19.
        self.data.send_bus_test_reply();
        self.state = CardState::Data;
        Handled::R1
    }

    pub(super) fn cmd21_send_tuning_block(&mut self, _x: &mut Exec) -> Handled {
        let hs200 = self.regs.hs_timing() & 0x0F == 2;
        let pattern: &[u8] = match self.regs.bus_width() {
            1 => &TUNING_BLOCK_4BIT,
            2 => &TUNING_BLOCK_8BIT,
            _ => return Handled::Illegal("CMD21 needs a 4- or 8-bit SDR bus"),
        };
        if !hs200 {
            return Handled::Illegal("CMD21 is only valid in HS200");
        }
        self.send_bytes(pattern)
    }

    pub(super) fn cmd30_send_write_prot(&mut self, x: &mut Exec) -> Handled {
        match self.write_protect_bits(x.arg, false) {
            Ok(bits) => self.send_bytes(&(bits as u32).to_be_bytes()),
            Err(e) => {
                x.resp_status |= e;
                Handled::R1
            }
        }
    }

    pub(super) fn cmd31_send_write_prot_type(&mut self, x: &mut Exec) -> Handled {
        match self.write_protect_bits(x.arg, true) {
            Ok(bits) => self.send_bytes(&bits.to_be_bytes()),
            Err(e) => {
                x.resp_status |= e;
                Handled::R1
            }
        }
    }

    pub(super) fn cmd56_gen_cmd(&mut self, x: &mut Exec) -> Handled {
        if x.arg & 1 != 0 {
            // Vendor data block: this card has nothing vendor-specific to say.
            self.data.fill_read_buf(SECTOR);
            self.send_buffer(SECTOR)
        } else {
            self.receive_buffer(Sink::GenCmd, SECTOR)
        }
    }

    fn receive_buffer(&mut self, sink: Sink, block_len: usize) -> Handled {
        self.data.set(Transfer::WriteBuffer { sink, block_len });
        self.state = CardState::Rcv;
        Handled::R1
    }

    pub(super) fn cmd26_program_cid(&mut self, _x: &mut Exec) -> Handled {
        self.receive_buffer(Sink::ProgramCid, 16)
    }

    pub(super) fn cmd27_program_csd(&mut self, _x: &mut Exec) -> Handled {
        self.receive_buffer(Sink::ProgramCsd, 16)
    }

    pub(super) fn cmd42_lock_unlock(&mut self, _x: &mut Exec) -> Handled {
        let len = self.data.block_len() as usize;
        self.receive_buffer(Sink::LockUnlock, len)
    }

    // ---- CMD23 and sector data --------------------------------------------------------

    pub(super) fn cmd23_set_block_count(&mut self, x: &mut Exec) -> Handled {
        self.data.set_block_count(x.arg);
        Handled::R1
    }

    pub(super) fn cmd17_read_single_block(&mut self, x: &mut Exec) -> Handled {
        self.start_read(x, Some(1))
    }

    pub(super) fn cmd18_read_multiple_block(&mut self, x: &mut Exec) -> Handled {
        match x.sbc {
            Some(sbc) if sbc.packed => self.start_packed_read(x, sbc),
            Some(sbc) if sbc.count > 0 => self.start_read(x, Some(u64::from(sbc.count))),
            _ => self.start_read(x, None),
        }
    }

    pub(super) fn cmd24_write_block(&mut self, x: &mut Exec) -> Handled {
        self.start_write(x, Some(1), None)
    }

    pub(super) fn cmd25_write_multiple_block(&mut self, x: &mut Exec) -> Handled {
        match x.sbc {
            Some(sbc) if sbc.count > 0 || sbc.packed => {
                let count = u64::from(sbc.count);
                self.start_write(x, Some(count), Some(sbc))
            }
            _ => self.start_write(x, None, None),
        }
    }

    /// The checks every sector data command makes at reception: block length, address
    /// alignment, and that the transfer starts (and, when its count is known, ends) inside
    /// the partition. Returns the partition-relative LBA or the R1 error bit.
    fn check_data_range(
        &self,
        arg: u32,
        partition: Partition,
        count: Option<u64>,
    ) -> Result<u64, u32> {
        if !self.data_block_len_ok() {
            return Err(r1::BLOCK_LEN_ERROR);
        }
        let lba = self.address_to_lba(arg)?;
        let extent = self.partitions.extent(partition);
        let in_range = match count {
            Some(n) => extent.translate(lba, n).is_some(),
            None => lba < extent.sectors,
        };
        if in_range {
            Ok(lba)
        } else {
            Err(r1::ADDRESS_OUT_OF_RANGE)
        }
    }

    fn start_read(&mut self, x: &mut Exec, count: Option<u64>) -> Handled {
        let partition = self.current_partition();
        if partition == Partition::Rpmb {
            return self.start_rpmb_read(x, count);
        }
        let lba = match self.check_data_range(x.arg, partition, count) {
            Ok(lba) => lba,
            Err(e) => {
                x.resp_status |= e;
                return Handled::R1;
            }
        };
        let extent = self.partitions.extent(partition);
        let pending_ns = match count {
            Some(n) => {
                self.timing
                    .read(self.now, extent.start + lba, n as u32)
                    .busy_ns
            }
            None => 0,
        };
        self.data.set(Transfer::ReadSectors(SectorRead {
            partition,
            pieces: OneOrMany::One((lba, count.unwrap_or(extent.sectors - lba))),
            piece: 0,
            done_in_piece: 0,
            bounded: count.is_some(),
            boot: false,
            pending_ns,
        }));
        self.state = CardState::Data;
        Handled::R1
    }

    fn start_write(&mut self, x: &mut Exec, count: Option<u64>, sbc: Option<Sbc>) -> Handled {
        let partition = self.current_partition();
        if partition == Partition::Rpmb {
            return self.start_rpmb_write(x, count, sbc);
        }
        let sbc = sbc.unwrap_or(Sbc::decode(0));
        if sbc.packed {
            return self.start_packed(x, sbc);
        }
        let lba = match self.check_data_range(x.arg, partition, count) {
            Ok(lba) => lba,
            Err(e) => {
                x.resp_status |= e;
                return Handled::R1;
            }
        };
        if let Some(n) = count {
            if self.is_write_protected(partition, lba, n) {
                x.resp_status |= r1::WP_VIOLATION;
                return Handled::R1;
            }
        }
        let mut granule = 1;
        if sbc.reliable {
            match self.reliable_granule(lba, count.unwrap_or(0)) {
                Ok(g) => granule = g,
                Err(e) => {
                    log::debug!(
                        "reliable write of {count:?} blocks at {lba} breaks the legacy rule (REL_WR_SEC_C {})",
                        self.model.ext_csd.rel_wr_sec_c
                    );
                    x.resp_status |= e;
                    return Handled::R1;
                }
            }
        }
        let target = if sbc.reliable || sbc.forced || !self.cache_enabled() {
            ProgramTarget::Medium
        } else {
            ProgramTarget::Cache
        };
        self.data.receive(Transfer::WriteSectors(SectorWrite::new(
            partition,
            lba,
            count,
            target,
            sbc.reliable,
            granule,
            false,
        )));
        self.state = CardState::Rcv;
        Handled::R1
    }

    // ---- packed commands ----------------------------------------------------------------

    fn clear_packed_status(&mut self) {
        self.regs.clear_packed_failure();
        self.data.set_packed_failure(false);
    }

    /// Report a failed packed command: `index` is the 1-based entry that failed (entries
    /// before it completed), or `None` when the whole command was rejected.
    fn packed_failed(&mut self, index: Option<usize>, why: &str) {
        log::debug!("packed command failed at entry {index:?}: {why}");
        self.stats.packed_failures += 1;
        self.data.set_packed_failure(true);
        self.regs.set_packed_failure(index);
    }

    /// CMD25 after CMD23 with the packed bit: receive header and data, check at the end.
    fn start_packed(&mut self, x: &mut Exec, sbc: Sbc) -> Handled {
        self.clear_packed_status();
        if sbc.count == 0 || sbc.reliable || sbc.forced || sbc.tag || sbc.reserved_set {
            self.packed_failed(
                None,
                "CMD23 of a packed command carries other flags or no blocks",
            );
            x.resp_status |= r1::ERROR;
            return Handled::R1;
        }
        let partition = self.current_partition();
        self.data.receive(Transfer::WriteSectors(SectorWrite::new(
            partition,
            0,
            Some(u64::from(sbc.count)),
            ProgramTarget::Medium,
            false,
            1,
            true,
        )));
        self.state = CardState::Rcv;
        Handled::R1
    }

    /// Check one packed entry: its absolute sector, or the R1 error that fails it.
    fn check_entry(
        &self,
        partition: Partition,
        e: &packed::Entry,
        write: bool,
    ) -> Result<(u64, u64), u32> {
        let lba = self.address_to_lba(e.address)?;
        let count = e.block_count();
        let abs = self
            .partitions
            .extent(partition)
            .translate(lba, count)
            .ok_or(r1::ADDRESS_OUT_OF_RANGE)?;
        if write {
            if self.is_write_protected(partition, lba, count) {
                return Err(r1::WP_VIOLATION);
            }
            if e.reliable() {
                self.reliable_granule(lba, count)?;
            }
        }
        Ok((abs, lba))
    }

    /// All blocks of a packed write arrived: validate the header, then program the entries
    /// up to the first one that fails. Nothing of a failing entry is written.
    fn finish_packed_write(&mut self, sw: &SectorWrite, x_after: &mut u32) {
        let header_blocks = 1u64;
        let announced = sw.received;
        let header = match Header::parse(
            self.data.write_buf(),
            Direction::Write,
            usize::from(self.model.ext_csd.max_packed_writes),
        )
        .and_then(|h| {
            let entries = h.data_blocks();
            if entries + header_blocks != announced {
                Err(HeaderError::CountMismatch {
                    entries,
                    header: header_blocks,
                    announced,
                })
            } else {
                Ok(h)
            }
        }) {
            Ok(h) => h,
            Err(HeaderError::WrongDirection {
                found: Direction::Read,
                ..
            }) if announced == header_blocks => {
                self.accept_packed_read_header();
                self.begin_op(0, OpKind::Busy);
                return;
            }
            Err(e) => {
                self.packed_failed(None, &e.to_string());
                *x_after |= r1::ERROR;
                self.begin_op(0, OpKind::Busy);
                return;
            }
        };
        let cache = self.cache_enabled();
        let mut segments = Vec::with_capacity(header.entries.len());
        let mut offset = header_blocks as usize * SECTOR;
        let injected = self.faults.take_packed_entry();
        for (i, e) in header.entries.iter().enumerate() {
            let checked = if injected == Some(i + 1) {
                Err(r1::ERROR)
            } else {
                self.check_entry(sw.partition, e, true)
            };
            match checked {
                Ok((abs, lba)) => {
                    let reliable = e.reliable();
                    let granule = if reliable {
                        self.reliable_granule(lba, e.block_count()).unwrap_or(1)
                    } else {
                        1
                    };
                    segments.push(Segment {
                        sector: abs,
                        count: e.block_count(),
                        buf_offset: offset,
                        target: if reliable || !cache {
                            ProgramTarget::Medium
                        } else {
                            ProgramTarget::Cache
                        },
                        reliable,
                        granule,
                    });
                    offset += e.block_count() as usize * SECTOR;
                }
                Err(bits) => {
                    self.packed_failed(Some(i + 1), &r1::describe(bits));
                    *x_after |= bits;
                    break;
                }
            }
        }
        self.stats.packed_writes += 1;
        self.start_program(
            ProgramOp {
                segments: segments.into(),
            },
            true,
            Cost::ZERO,
        );
    }

    /// A packed-read header arrived through CMD25: remember its entries for the CMD18.
    fn accept_packed_read_header(&mut self) {
        let partition = self.current_partition();
        match Header::parse(
            self.data.write_buf(),
            Direction::Read,
            usize::from(self.model.ext_csd.max_packed_reads),
        ) {
            Ok(h) => {
                for (i, e) in h.entries.iter().enumerate() {
                    if let Err(bits) = self.check_entry(partition, e, false) {
                        self.packed_failed(Some(i + 1), &r1::describe(bits));
                        self.regs.raise(bits);
                        self.data.store_packed_read(None);
                        return;
                    }
                }
                self.data.store_packed_read(Some(h.entries));
            }
            Err(e) => {
                self.packed_failed(None, &e.to_string());
                self.regs.raise(r1::ERROR);
                self.data.store_packed_read(None);
            }
        }
    }

    /// CMD18 after CMD23 with the packed bit: stream the entries of the stored header.
    fn start_packed_read(&mut self, x: &mut Exec, sbc: Sbc) -> Handled {
        let Some(entries) = self.data.take_packed_read() else {
            self.packed_failed(None, "packed CMD18 without a packed-read header");
            x.resp_status |= r1::ERROR;
            return Handled::R1;
        };
        let total: u64 = entries.iter().map(packed::Entry::block_count).sum();
        if total != u64::from(sbc.count) {
            self.packed_failed(None, "CMD23 count differs from the packed-read entries");
            x.resp_status |= r1::ERROR;
            return Handled::R1;
        }
        let partition = self.current_partition();
        let mut pieces = Vec::with_capacity(entries.len());
        let mut pending_ns = 0;
        for e in &entries {
            match self.check_entry(partition, e, false) {
                Ok((abs, lba)) => {
                    pieces.push((lba, e.block_count()));
                    pending_ns += self
                        .timing
                        .read(self.now, abs, e.block_count() as u32)
                        .busy_ns;
                }
                Err(bits) => {
                    x.resp_status |= bits;
                    return Handled::R1;
                }
            }
        }
        self.stats.packed_reads += 1;
        self.data.set(Transfer::ReadSectors(SectorRead {
            partition,
            pieces: pieces.into(),
            piece: 0,
            done_in_piece: 0,
            bounded: true,
            boot: false,
            pending_ns,
        }));
        self.state = CardState::Data;
        Handled::R1
    }

    // ---- CMD12 --------------------------------------------------------------------------

    pub(super) fn cmd12_stop_transmission(&mut self, x: &mut Exec) -> Handled {
        match self.state {
            CardState::Data => {
                self.data.stop();
                self.state = CardState::Tran;
                Handled::R1
            }
            CardState::Rcv => {
                let mut after = 0;
                self.finish_write(&mut after, true);
                x.after_status |= after;
                Handled::R1b
            }
            CardState::Prg if x.arg & 1 != 0 && self.hpi_carrier(12) => {
                self.high_priority_interrupt();
                Handled::R1b
            }
            _ => Handled::Illegal("CMD12 in prg without HPI"),
        }
    }

    // ---- the data API -------------------------------------------------------------------

    /// Receive data blocks from the host for the transfer in progress. `buf` holds whole
    /// blocks of [`Card::transfer_block_len`]. When the last block of a bounded transfer
    /// arrives the card starts programming (prg) and is busy until [`Card::busy_until`].
    pub fn write_data(&mut self, now: Nanos, buf: &[u8]) -> Result<(), DataError> {
        self.advance(now);
        let block_len = match (self.data.transfer(), self.state) {
            (Transfer::WriteSectors(_) | Transfer::WriteRpmb { .. }, CardState::Rcv) => SECTOR,
            (Transfer::WriteBuffer { block_len, .. }, CardState::Rcv | CardState::Btst) => {
                *block_len
            }
            _ => return Err(DataError::NoTransfer(self.state)),
        };
        if buf.is_empty() || buf.len() % block_len != 0 {
            return Err(DataError::BlockLength {
                len: buf.len(),
                block_len,
            });
        }
        match self.data.take() {
            Transfer::WriteSectors(sw) => self.write_sectors(sw, buf),
            Transfer::WriteRpmb { frames, reliable } => {
                if self.data.receive_rpmb_frames(frames, reliable, buf)? {
                    self.finish_rpmb_write(reliable);
                }
                Ok(())
            }
            Transfer::WriteBuffer { sink, block_len } => {
                if buf.len() != block_len {
                    self.data.set(Transfer::WriteBuffer { sink, block_len });
                    return Err(DataError::PastBlockCount);
                }
                self.finish_sink(sink, buf);
                Ok(())
            }
            other => {
                self.data.set(other);
                Err(DataError::NoTransfer(self.state))
            }
        }
    }

    fn write_sectors(&mut self, mut sw: SectorWrite, buf: &[u8]) -> Result<(), DataError> {
        let n = (buf.len() / SECTOR) as u64;
        if sw.overruns(n) {
            self.data.set(Transfer::WriteSectors(sw));
            return Err(DataError::PastBlockCount);
        }
        if sw.failed {
            let done = sw.received;
            self.data.set(Transfer::WriteSectors(sw));
            return Err(DataError::Stopped {
                blocks_done: done,
                status: "earlier block refused".into(),
            });
        }
        let mut accepted = n;
        let mut refusal = 0;
        if sw.count.is_none() {
            // Open-ended: each block is checked as it arrives.
            let extent = self.partitions.extent(sw.partition);
            let first = sw.lba + sw.buffered;
            for i in 0..n {
                let lba = first + i;
                if lba >= extent.sectors {
                    refusal = r1::ADDRESS_OUT_OF_RANGE;
                } else if self.is_write_protected(sw.partition, lba, 1) {
                    refusal = r1::WP_VIOLATION;
                }
                if refusal != 0 {
                    accepted = i;
                    break;
                }
            }
        }
        if self.store.keeps_data() || sw.packed {
            self.data.buffer(&buf[..accepted as usize * SECTOR]);
        }
        sw.accept(accepted);
        if refusal != 0 {
            self.regs.raise(refusal);
            sw.failed = true;
            let done = sw.received;
            self.data.set(Transfer::WriteSectors(sw));
            return Err(DataError::Stopped {
                blocks_done: done,
                status: r1::describe(refusal),
            });
        }
        if sw.count.is_none() && sw.buffered * SECTOR as u64 >= OPEN_ENDED_STAGING as u64 {
            // Program what has streamed in so far; the rest keeps coming.
            let op = self.program_op_for(&sw);
            sw.staged_cost += self.program_cost(&op, false);
            self.commit_program(&op, op.total_sectors());
            sw.staged();
            self.data.clear_write_buf();
        }
        let complete = sw.complete();
        self.data.set(Transfer::WriteSectors(sw));
        if complete {
            let mut after = 0;
            self.finish_write(&mut after, false);
            self.regs.raise(after);
        }
        Ok(())
    }

    fn program_op_for(&self, sw: &SectorWrite) -> ProgramOp {
        let extent = self.partitions.extent(sw.partition);
        ProgramOp {
            segments: OneOrMany::One(Segment {
                sector: extent.start + sw.lba,
                count: sw.buffered,
                buf_offset: 0,
                target: sw.target,
                reliable: sw.reliable,
                granule: sw.granule,
            }),
        }
    }

    /// The write phase ends (last block of a bounded transfer, or CMD12): program what
    /// arrived. `stopped` is true for CMD12.
    fn finish_write(&mut self, after: &mut u32, stopped: bool) {
        match self.data.take() {
            Transfer::WriteSectors(sw) if sw.packed => {
                if stopped && !sw.complete() {
                    self.packed_failed(None, "packed write stopped before all blocks arrived");
                    *after |= r1::ERROR;
                    self.begin_op(0, OpKind::Busy);
                } else {
                    self.finish_packed_write(&sw, after);
                }
            }
            Transfer::WriteSectors(sw) => {
                let op = self.program_op_for(&sw);
                self.start_program(op, false, sw.staged_cost);
            }
            Transfer::WriteRpmb { .. } => {
                log::debug!("RPMB write stopped before all frames arrived: ignored");
                *after |= r1::ERROR;
                self.begin_op(0, OpKind::Busy);
            }
            Transfer::WriteBuffer { .. } => {
                // Stopped before its single block arrived: nothing to do.
                self.begin_op(0, OpKind::Busy);
            }
            other => self.data.set(other),
        }
    }

    fn finish_sink(&mut self, sink: Sink, data: &[u8]) {
        match sink {
            Sink::BusTest => {
                self.data.keep_bus_test_pattern(data);
                // Stays in btst until CMD14.
                return;
            }
            Sink::GenCmd => {}
            Sink::ProgramCid => {
                // The CID is programmed once, by the manufacturer.
                self.regs.raise(r1::CID_CSD_OVERWRITE);
            }
            Sink::ProgramCsd => self.program_csd(data),
            Sink::LockUnlock => self.lock_unlock(data),
        }
        let cost = self.timing.switch(self.now, SwitchKind::Generic);
        self.begin_op(cost.busy_ns, OpKind::Busy);
    }

    /// CMD27: the registers part checks the block (see `Registers::program_csd`); a new
    /// byte 14 is saved.
    fn program_csd(&mut self, data: &[u8]) {
        if self.regs.program_csd(&self.model, data) {
            self.save_persistent();
        } else {
            self.regs.raise(r1::CID_CSD_OVERWRITE);
        }
    }

    /// Send data blocks of the transfer in progress to the host. `buf` holds whole blocks
    /// of [`Card::transfer_block_len`]. Returns the card-internal time the card needed
    /// before it could send them (access time plus internal read time), which the host
    /// model adds to bus time.
    pub fn read_data(&mut self, now: Nanos, buf: &mut [u8]) -> Result<Nanos, DataError> {
        self.advance(now);
        if !matches!(self.state, CardState::Data | CardState::Boot) {
            return Err(DataError::NoTransfer(self.state));
        }
        match self.data.take() {
            Transfer::ReadBuffer { block_len, pos } => {
                if self.data.send_from_buffer(block_len, pos, buf)? {
                    self.state = CardState::Tran;
                }
                Ok(0)
            }
            Transfer::ReadSectors(sr) => self.read_sectors(sr, buf),
            other => {
                self.data.set(other);
                Err(DataError::NoTransfer(self.state))
            }
        }
    }

    fn read_sectors(&mut self, mut sr: SectorRead, buf: &mut [u8]) -> Result<Nanos, DataError> {
        if buf.is_empty() || buf.len() % SECTOR != 0 {
            self.data.set(Transfer::ReadSectors(sr));
            return Err(DataError::BlockLength {
                len: buf.len(),
                block_len: SECTOR,
            });
        }
        let wanted = (buf.len() / SECTOR) as u64;
        if sr.bounded && wanted > sr.remaining() {
            self.data.set(Transfer::ReadSectors(sr));
            return Err(DataError::PastBlockCount);
        }
        let extent = self.partitions.extent(sr.partition);
        let mut cost = std::mem::take(&mut sr.pending_ns);
        let mut done = 0u64;
        while done < wanted {
            let Some((lba, n)) = sr.next_run(wanted - done) else {
                break;
            };
            let abs = extent.start + lba;
            let out = &mut buf[done as usize * SECTOR..(done + n) as usize * SECTOR];
            if let Err(e) = self.store.read_at(abs * SECTOR as u64, out) {
                log::error!("reading {n} sectors at image sector {abs}: {e}");
                self.regs.raise(r1::ERROR);
                self.data.set(Transfer::ReadSectors(sr));
                return Err(DataError::Stopped {
                    blocks_done: done,
                    status: "medium read failed".into(),
                });
            }
            self.cache.overlay(abs, out);
            if !sr.bounded {
                cost += self.timing.read(self.now, abs, n as u32).busy_ns;
            }
            done += n;
            sr.advance(n);
        }
        self.stats.sectors_read += done;
        if done < wanted {
            // An open-ended read ran off the end of the partition.
            self.data.set(Transfer::ReadSectors(sr));
            if self.state == CardState::Boot {
                return Err(DataError::Stopped {
                    blocks_done: done,
                    status: "end of boot partition".into(),
                });
            }
            self.regs.raise(r1::ADDRESS_OUT_OF_RANGE);
            return Err(DataError::Stopped {
                blocks_done: done,
                status: r1::describe(r1::ADDRESS_OUT_OF_RANGE),
            });
        }
        if sr.bounded && sr.finished() {
            self.state = CardState::Tran;
        } else {
            self.data.set(Transfer::ReadSectors(sr));
        }
        Ok(cost)
    }
}
