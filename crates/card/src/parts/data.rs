//! The data-transfer part: the data phase in progress and everything the card keeps for
//! it.
//!
//! Owns the CMD16 block length, a CMD23 block count waiting for its CMD18/CMD25, the
//! [`Transfer`] in progress (sectors to stream or receive, a register-like buffer, RPMB
//! frames), the write buffer (data received and kept until it is programmed) and the read
//! buffer (data prepared for a register-like read), the entries of a packed-read header
//! waiting for its CMD18, and whether the last packed command failed
//! (EXCEPTION_EVENTS_STATUS.PACKED_FAILURE). It streams its buffers and counts blocks; the
//! card decides what a transfer reads or programs, where, and for how long.

use crate::one_or_many::OneOrMany;
use crate::packed;
use crate::partition::Partition;
use crate::status::r1;
use crate::timing::{Cost, Nanos, ProgramTarget};
use crate::DataError;

/// Data blocks of sector transfers and RPMB frames.
const SECTOR: usize = 512;

/// A CMD23 SET_BLOCK_COUNT argument, decoded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Sbc {
    pub count: u16,
    pub reliable: bool,
    pub packed: bool,
    pub tag: bool,
    pub context_id: u8,
    pub forced: bool,
    /// Bits 23:16 are reserved and must be zero.
    pub reserved_set: bool,
}

impl Sbc {
    pub fn decode(arg: u32) -> Sbc {
        Sbc {
            count: (arg & packed::CMD23_BLOCK_COUNT_MASK) as u16,
            reliable: arg & packed::CMD23_RELIABLE_WRITE != 0,
            packed: arg & packed::CMD23_PACKED != 0,
            tag: arg & packed::CMD23_TAG_REQUEST != 0,
            context_id: ((arg >> packed::CMD23_CONTEXT_ID_SHIFT) & 0xF) as u8,
            forced: arg & packed::CMD23_FORCED_PROGRAMMING != 0,
            reserved_set: arg & 0x00FF_0000 != 0,
        }
    }
}

/// Sectors to stream to the host from one partition, possibly in several pieces (packed
/// read entries).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct SectorRead {
    pub partition: Partition,
    /// (partition-relative LBA, count) pieces, in transfer order.
    pub pieces: OneOrMany<(u64, u64)>,
    pub piece: usize,
    pub done_in_piece: u64,
    /// Ends by itself after the last piece (CMD23 count or single block); otherwise runs
    /// until CMD12 and fails at the partition's end.
    pub bounded: bool,
    /// Boot-mode streaming: stops quietly at the end of the partition.
    pub boot: bool,
    /// Card-internal read time not yet reported to the host.
    pub pending_ns: Nanos,
}

impl SectorRead {
    /// Sectors of the pieces not yet sent.
    pub fn remaining(&self) -> u64 {
        self.pieces.as_slice()[self.piece..]
            .iter()
            .map(|p| p.1)
            .sum::<u64>()
            - self.done_in_piece
    }

    /// The next run to send, at most `max` sectors within the current piece:
    /// (partition-relative LBA, sectors); `None` after the last piece.
    #[inline]
    pub fn next_run(&self, max: u64) -> Option<(u64, u64)> {
        let &(lba, count) = self.pieces.as_slice().get(self.piece)?;
        Some((
            lba + self.done_in_piece,
            (count - self.done_in_piece).min(max),
        ))
    }

    /// `n` sectors of the current piece were sent.
    #[inline]
    pub fn advance(&mut self, n: u64) {
        self.done_in_piece += n;
        if self.done_in_piece == self.pieces.as_slice()[self.piece].1 {
            self.piece += 1;
            self.done_in_piece = 0;
        }
    }

    /// Every piece was sent.
    pub fn finished(&self) -> bool {
        self.piece == self.pieces.as_slice().len()
    }
}

/// Sectors arriving from the host for one partition.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct SectorWrite {
    pub partition: Partition,
    /// Partition-relative LBA of the first sector still in the write buffer.
    pub lba: u64,
    /// Total blocks of a bounded transfer (`None`: open-ended, until CMD12).
    pub count: Option<u64>,
    /// Blocks received so far.
    pub received: u64,
    /// Blocks received since the write buffer was last programmed (the write buffer holds
    /// their data when the store keeps data, or for a packed command's header).
    pub buffered: u64,
    pub target: ProgramTarget,
    pub reliable: bool,
    pub granule: u64,
    /// A packed command: the write buffer starts with the header.
    pub packed: bool,
    /// Cost of pieces of an open-ended write already programmed while it streamed.
    pub staged_cost: Cost,
    /// The card refused a block (out of range, write protected); the rest is ignored.
    pub failed: bool,
}

impl SectorWrite {
    /// A write of `count` blocks (`None`: open-ended) to `partition` from `lba`.
    pub fn new(
        partition: Partition,
        lba: u64,
        count: Option<u64>,
        target: ProgramTarget,
        reliable: bool,
        granule: u64,
        packed: bool,
    ) -> SectorWrite {
        SectorWrite {
            partition,
            lba,
            count,
            received: 0,
            buffered: 0,
            target,
            reliable,
            granule,
            packed,
            staged_cost: Cost::ZERO,
            failed: false,
        }
    }

    /// `n` more blocks would exceed a bounded transfer's count.
    #[inline]
    pub fn overruns(&self, n: u64) -> bool {
        self.count.is_some_and(|count| self.received + n > count)
    }

    /// `n` blocks were accepted into the write buffer.
    #[inline]
    pub fn accept(&mut self, n: u64) {
        self.received += n;
        self.buffered += n;
    }

    /// The buffered blocks were programmed (an open-ended write's piece): the buffer
    /// starts after them.
    pub fn staged(&mut self) {
        self.lba += self.buffered;
        self.buffered = 0;
    }

    /// A bounded transfer received its last block.
    #[inline]
    pub fn complete(&self) -> bool {
        self.count == Some(self.received)
    }
}

/// Single-block writes that are not sector data.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Sink {
    ProgramCid,
    ProgramCsd,
    LockUnlock,
    BusTest,
    GenCmd,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Transfer {
    None,
    ReadSectors(SectorRead),
    /// Card → host from the card's read buffer, in blocks of `block_len`.
    ReadBuffer {
        block_len: usize,
        pos: usize,
    },
    WriteSectors(SectorWrite),
    WriteBuffer {
        sink: Sink,
        block_len: usize,
    },
    WriteRpmb {
        frames: u64,
        reliable: bool,
    },
}

impl Transfer {
    /// The block length the host must use (`cmd16_block_len` for a buffer sized by CMD16).
    pub fn block_len(&self, cmd16_block_len: usize) -> Option<usize> {
        match self {
            Transfer::None => None,
            Transfer::ReadSectors(_) | Transfer::WriteSectors(_) | Transfer::WriteRpmb { .. } => {
                Some(SECTOR)
            }
            Transfer::ReadBuffer { block_len, .. } | Transfer::WriteBuffer { block_len, .. } => {
                Some(*block_len)
            }
        }
        .map(|l| if l == 0 { cmd16_block_len } else { l })
    }

    /// Boot-mode streaming of a partition of `sectors` from its start.
    pub fn boot(partition: Partition, sectors: u64) -> Transfer {
        Transfer::ReadSectors(SectorRead {
            partition,
            pieces: OneOrMany::One((0, sectors)),
            piece: 0,
            done_in_piece: 0,
            bounded: false,
            boot: true,
            pending_ns: 0,
        })
    }
}

/// The card's data-transfer state (see the module documentation).
pub(crate) struct DataTransfer {
    /// CMD16 SET_BLOCKLEN.
    block_len: u32,
    /// CMD23 SET_BLOCK_COUNT, for the next command only.
    sbc: Option<Sbc>,
    transfer: Transfer,
    /// Data received for the current write (and kept until it is programmed).
    write_buf: Vec<u8>,
    /// Data prepared for the current register-like read.
    read_buf: Vec<u8>,
    /// A packed-read header's entries, waiting for their CMD18.
    packed_read: Option<Vec<packed::Entry>>,
    /// EXCEPTION_EVENTS_STATUS.PACKED_FAILURE: the last packed command failed.
    packed_failure: bool,
}

impl Default for DataTransfer {
    fn default() -> DataTransfer {
        DataTransfer {
            block_len: SECTOR as u32,
            sbc: None,
            transfer: Transfer::None,
            write_buf: Vec::new(),
            read_buf: Vec::new(),
            packed_read: None,
            packed_failure: false,
        }
    }
}

impl DataTransfer {
    /// CMD0 or power-on: the block length returns to 512, and a pending block count, the
    /// transfer and a stored packed-read header are dropped.
    pub fn reset(&mut self) {
        self.block_len = SECTOR as u32;
        self.sbc = None;
        self.transfer = Transfer::None;
        self.packed_read = None;
    }

    // ---- CMD16 and CMD23 ----------------------------------------------------------------

    #[inline]
    pub fn block_len(&self) -> u32 {
        self.block_len
    }

    /// CMD16: 1..=512 bytes, or BLOCK_LEN_ERROR and no change.
    pub fn set_block_len(&mut self, len: u32) -> Result<(), u32> {
        if len == 0 || len > SECTOR as u32 {
            return Err(r1::BLOCK_LEN_ERROR);
        }
        self.block_len = len;
        Ok(())
    }

    /// CMD23: the count applies to the next command only.
    pub fn set_block_count(&mut self, arg: u32) {
        self.sbc = Some(Sbc::decode(arg));
    }

    /// The block count for the command being executed (whatever it is, it uses it up).
    #[inline]
    pub fn take_block_count(&mut self) -> Option<Sbc> {
        self.sbc.take()
    }

    // ---- the transfer -------------------------------------------------------------------

    pub fn transfer(&self) -> &Transfer {
        &self.transfer
    }

    /// The host's block length for the transfer in progress.
    pub fn transfer_block_len(&self) -> Option<usize> {
        self.transfer.block_len(self.block_len as usize)
    }

    /// Blocks the transfer in progress still moves before it ends by itself: a single
    /// block command's one, what is left of a CMD23 count, of a register or RPMB frame
    /// count. `None` for an open-ended transfer (until CMD12) or none at all.
    pub fn transfer_blocks_left(&self) -> Option<u64> {
        match &self.transfer {
            Transfer::None => None,
            Transfer::ReadSectors(sr) => sr.bounded.then(|| sr.remaining()),
            Transfer::ReadBuffer { pos, .. } => {
                let block_len = self.transfer_block_len().unwrap_or(SECTOR).max(1);
                Some((self.read_buf.len().saturating_sub(*pos) / block_len) as u64)
            }
            Transfer::WriteSectors(sw) => sw.count.map(|c| c.saturating_sub(sw.received)),
            Transfer::WriteBuffer { .. } => Some(1),
            Transfer::WriteRpmb { frames, .. } => {
                Some(frames.saturating_sub((self.write_buf.len() / SECTOR) as u64))
            }
        }
    }

    /// Take the transfer out to work on it (put it back with [`DataTransfer::set`]).
    #[inline]
    pub fn take(&mut self) -> Transfer {
        std::mem::replace(&mut self.transfer, Transfer::None)
    }

    #[inline]
    pub fn set(&mut self, transfer: Transfer) {
        self.transfer = transfer;
    }

    /// End the transfer (CMD12 in data, deselect).
    pub fn stop(&mut self) {
        self.transfer = Transfer::None;
    }

    /// Start receiving sectors or RPMB frames: the write buffer starts empty.
    pub fn receive(&mut self, transfer: Transfer) {
        self.write_buf.clear();
        self.transfer = transfer;
    }

    // ---- the read buffer ----------------------------------------------------------------

    /// Send `bytes` to the host as one block.
    pub fn send_bytes(&mut self, bytes: &[u8]) {
        self.read_buf.clear();
        self.read_buf.extend_from_slice(bytes);
        self.send(bytes.len());
    }

    /// Send the read buffer as filled by [`DataTransfer::fill_read_buf`], in blocks of
    /// `block_len`.
    pub fn send(&mut self, block_len: usize) {
        self.transfer = Transfer::ReadBuffer { block_len, pos: 0 };
    }

    /// The read buffer, `len` zero bytes, for the caller to fill.
    pub fn fill_read_buf(&mut self, len: usize) -> &mut [u8] {
        self.read_buf.clear();
        self.read_buf.resize(len, 0);
        &mut self.read_buf
    }

    /// CMD19's pattern arrived: keep it for CMD14.
    pub fn keep_bus_test_pattern(&mut self, data: &[u8]) {
        self.read_buf.clear();
        self.read_buf.extend_from_slice(data);
    }

    /// CMD14: send back the bitwise inverse of CMD19's pattern (one 0xFF byte if none).
    pub fn send_bus_test_reply(&mut self) {
        for b in &mut self.read_buf {
            *b = !*b;
        }
        let len = self.read_buf.len().max(1);
        self.read_buf.resize(len, 0xFF);
        self.send(len);
    }

    /// Stream the read buffer from `pos` into `buf` (whole blocks of `block_len`), the
    /// transfer having been taken out. Returns true when the buffer has been sent in
    /// full; otherwise the transfer is back in place, advanced or (on error) unchanged.
    pub fn send_from_buffer(
        &mut self,
        block_len: usize,
        pos: usize,
        buf: &mut [u8],
    ) -> Result<bool, DataError> {
        if buf.is_empty() || buf.len() % block_len != 0 {
            self.transfer = Transfer::ReadBuffer { block_len, pos };
            return Err(DataError::BlockLength {
                len: buf.len(),
                block_len,
            });
        }
        let end = pos + buf.len();
        if end > self.read_buf.len() {
            self.transfer = Transfer::ReadBuffer { block_len, pos };
            return Err(DataError::PastBlockCount);
        }
        buf.copy_from_slice(&self.read_buf[pos..end]);
        if end < self.read_buf.len() {
            self.transfer = Transfer::ReadBuffer {
                block_len,
                pos: end,
            };
            Ok(false)
        } else {
            Ok(true)
        }
    }

    // ---- the write buffer ---------------------------------------------------------------

    #[inline]
    pub fn write_buf(&self) -> &[u8] {
        &self.write_buf
    }

    /// Keep received data until it is programmed.
    #[inline]
    pub fn buffer(&mut self, data: &[u8]) {
        self.write_buf.extend_from_slice(data);
    }

    /// The buffered data was programmed.
    pub fn clear_write_buf(&mut self) {
        self.write_buf.clear();
    }

    /// RPMB frames arrived for a transfer of `frames` frames (taken out). Returns true
    /// when the last one is in the write buffer (the transfer is over); otherwise the
    /// transfer is back in place. More frames than announced are refused, changing
    /// nothing.
    pub fn receive_rpmb_frames(
        &mut self,
        frames: u64,
        reliable: bool,
        buf: &[u8],
    ) -> Result<bool, DataError> {
        let have = (self.write_buf.len() / SECTOR) as u64;
        let n = (buf.len() / SECTOR) as u64;
        if have + n > frames {
            self.transfer = Transfer::WriteRpmb { frames, reliable };
            return Err(DataError::PastBlockCount);
        }
        self.write_buf.extend_from_slice(buf);
        if have + n == frames {
            Ok(true)
        } else {
            self.transfer = Transfer::WriteRpmb { frames, reliable };
            Ok(false)
        }
    }

    // ---- packed commands ----------------------------------------------------------------

    pub fn packed_failure(&self) -> bool {
        self.packed_failure
    }

    pub fn set_packed_failure(&mut self, failed: bool) {
        self.packed_failure = failed;
    }

    /// Keep (or, with `None`, drop) a packed-read header's entries for the next CMD18.
    pub fn store_packed_read(&mut self, entries: Option<Vec<packed::Entry>>) {
        self.packed_read = entries;
    }

    /// The stored packed-read entries, used up by the CMD18 that asks for them.
    pub fn take_packed_read(&mut self) -> Option<Vec<packed::Entry>> {
        self.packed_read.take()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read(pieces: Vec<(u64, u64)>) -> SectorRead {
        SectorRead {
            partition: Partition::User,
            pieces: pieces.into(),
            piece: 0,
            done_in_piece: 0,
            bounded: true,
            boot: false,
            pending_ns: 0,
        }
    }

    #[test]
    fn cmd23_argument_decodes_into_its_flags() {
        let s = Sbc::decode(1 << 31 | 1 << 29 | 5 << 25 | 1 << 24 | 1 << 16 | 300);
        assert_eq!(
            s,
            Sbc {
                count: 300,
                reliable: true,
                packed: false,
                tag: true,
                context_id: 5,
                forced: true,
                reserved_set: true,
            }
        );
        assert!(Sbc::decode(1 << 30).packed);
        assert_eq!(Sbc::decode(0xFFFF).count, 0xFFFF);
    }

    #[test]
    fn block_length_and_block_count() {
        let mut d = DataTransfer::default();
        assert_eq!(d.set_block_len(0), Err(r1::BLOCK_LEN_ERROR));
        assert_eq!(d.set_block_len(513), Err(r1::BLOCK_LEN_ERROR));
        assert_eq!(d.block_len(), 512);
        d.set_block_len(16).unwrap();
        assert_eq!(d.block_len(), 16);

        d.set_block_count(8);
        assert_eq!(d.take_block_count().map(|s| s.count), Some(8));
        assert_eq!(d.take_block_count(), None, "a count serves one command");

        d.set_block_count(8);
        d.set(Transfer::WriteBuffer {
            sink: Sink::LockUnlock,
            block_len: 0,
        });
        d.store_packed_read(Some(vec![packed::Entry::new(1, 0, false)]));
        d.reset();
        assert_eq!(d.block_len(), 512);
        assert_eq!(d.take_block_count(), None);
        assert_eq!(d.transfer(), &Transfer::None);
        assert_eq!(d.take_packed_read(), None);
    }

    #[test]
    fn the_hosts_block_length_follows_the_transfer() {
        let mut d = DataTransfer::default();
        assert_eq!(d.transfer_block_len(), None);
        d.set(Transfer::boot(Partition::Boot1, 8));
        assert_eq!(d.transfer_block_len(), Some(512));
        d.set_block_len(16).unwrap();
        d.set(Transfer::WriteBuffer {
            sink: Sink::LockUnlock,
            block_len: 0,
        });
        assert_eq!(d.transfer_block_len(), Some(16), "0 means CMD16's length");
        d.send_bytes(&[1, 2, 3, 4]);
        assert_eq!(d.transfer_block_len(), Some(4));
        d.stop();
        assert_eq!(d.transfer_block_len(), None);
    }

    #[test]
    fn a_buffer_streams_in_whole_blocks_and_ends_at_its_last_byte() {
        let mut d = DataTransfer::default();
        d.send_bytes(&[1, 2, 3, 4, 5, 6, 7, 8]);
        d.send(4);
        let mut two = [0u8; 2];
        let Transfer::ReadBuffer { block_len, pos } = d.take() else {
            panic!()
        };
        assert_eq!(
            d.send_from_buffer(block_len, pos, &mut two),
            Err(DataError::BlockLength {
                len: 2,
                block_len: 4
            })
        );
        let mut block = [0u8; 4];
        let Transfer::ReadBuffer { block_len, pos } = d.take() else {
            panic!("the transfer is back after an error")
        };
        assert_eq!(d.send_from_buffer(block_len, pos, &mut block), Ok(false));
        assert_eq!(block, [1, 2, 3, 4]);
        let Transfer::ReadBuffer { block_len, pos } = d.take() else {
            panic!()
        };
        let mut eight = [0u8; 8];
        assert_eq!(
            d.send_from_buffer(block_len, pos, &mut eight),
            Err(DataError::PastBlockCount)
        );
        let Transfer::ReadBuffer { block_len, pos } = d.take() else {
            panic!()
        };
        assert_eq!(d.send_from_buffer(block_len, pos, &mut block), Ok(true));
        assert_eq!(block, [5, 6, 7, 8]);
        assert_eq!(d.transfer(), &Transfer::None);
    }

    #[test]
    fn bus_test_reply_is_the_inverted_pattern() {
        let mut d = DataTransfer::default();
        d.send_bus_test_reply();
        assert_eq!(d.transfer_block_len(), Some(1), "no pattern: one 0xFF byte");
        assert_eq!(d.read_buf, [0xFF]);
        d.keep_bus_test_pattern(&[0x5A, 0x0F, 0x00, 0xFF]);
        d.send_bus_test_reply();
        assert_eq!(d.read_buf, [0xA5, 0xF0, 0xFF, 0x00]);
        assert_eq!(d.transfer_block_len(), Some(4));
    }

    #[test]
    fn rpmb_frames_accumulate_up_to_the_announced_count() {
        let mut d = DataTransfer::default();
        d.receive(Transfer::WriteRpmb {
            frames: 2,
            reliable: true,
        });
        let frame = [7u8; 512];
        let Transfer::WriteRpmb { frames, reliable } = d.take() else {
            panic!()
        };
        assert_eq!(d.receive_rpmb_frames(frames, reliable, &frame), Ok(false));
        let t = d.take();
        assert_eq!(
            t,
            Transfer::WriteRpmb {
                frames: 2,
                reliable: true
            }
        );
        assert_eq!(
            d.receive_rpmb_frames(2, true, &[0u8; 1024]),
            Err(DataError::PastBlockCount)
        );
        assert_eq!(d.write_buf().len(), 512, "a refused block changes nothing");
        d.take();
        assert_eq!(d.receive_rpmb_frames(2, true, &frame), Ok(true));
        assert_eq!(d.transfer(), &Transfer::None);
        assert_eq!(d.write_buf().len(), 1024);
        d.receive(Transfer::None);
        assert!(d.write_buf().is_empty(), "a new transfer starts empty");
    }

    #[test]
    fn a_sector_read_walks_its_pieces_in_order() {
        let mut r = read(vec![(10, 3), (100, 2)]);
        assert_eq!(r.remaining(), 5);
        assert_eq!(r.next_run(8), Some((10, 3)));
        r.advance(2);
        assert_eq!(r.remaining(), 3);
        assert_eq!(r.next_run(8), Some((12, 1)));
        r.advance(1);
        assert_eq!(r.next_run(1), Some((100, 1)));
        r.advance(1);
        assert!(!r.finished());
        r.advance(1);
        assert!(r.finished());
        assert_eq!(r.next_run(8), None);
        assert_eq!(r.remaining(), 0);
    }

    #[test]
    fn a_sector_write_counts_blocks_against_its_count() {
        let mut w = SectorWrite::new(
            Partition::User,
            100,
            Some(4),
            ProgramTarget::Cache,
            false,
            1,
            false,
        );
        assert!(!w.overruns(4) && w.overruns(5));
        w.accept(3);
        assert!(w.overruns(2) && !w.complete());
        w.accept(1);
        assert!(w.complete());
        let mut open = SectorWrite::new(
            Partition::User,
            100,
            None,
            ProgramTarget::Medium,
            false,
            1,
            false,
        );
        assert!(!open.overruns(u64::MAX / 2));
        open.accept(16);
        open.staged();
        assert_eq!((open.lba, open.buffered, open.received), (116, 0, 16));
        assert!(!open.complete());
    }
}
