//! `serve --transport mmc --trace FILE`: the guest's raw MMC requests as a block trace
//! (docs/trace-format.md), so that `simulate --workload trace` can replay what a guest
//! driver did to the card.
//!
//! A request that moved data on the user area is a line: CMD17/18 `R`, CMD24/25 `W` (`WF`
//! when its CMD23 carried the reliable-write bit); a packed write is one line per entry
//! at the request's arrival, and so is a packed read, at the arrival of the CMD18 that
//! reads its data (its header's CMD25 is a comment). CMD6 setting FLUSH_CACHE is `F 0 0`;
//! an erase, trim or discard (CMD35, CMD36, then CMD38) on the user area is `D` when CMD38
//! executes. Everything else — other commands, requests on other partitions (as
//! PARTITION_CONFIG selected when the request arrived), secure erase and trim, requests
//! that failed — is a comment, `# <arrival_ns> CMD<n> arg=0x<arg> <completion_ns>`.

use std::io::Write;

use super::proto::*;
use super::request::MmcReq;
use emmc_card::packed::{self, Direction, Entry, Header};
use emmc_card::timing::Nanos;
use emmc_card::Partition;
use emmc_host::trace::Op;
use emmc_host::trace::TraceWriter;

/// The most sectors one trace line may carry (the format's limit): longer erases are
/// split into lines of this size.
const MAX_LINE_SECTORS: u64 = 32_768;

/// One executed request as the tracer needs it.
#[derive(Debug, Clone, Copy)]
pub struct Traced<'a> {
    pub req: &'a MmcReq,
    /// The partition PARTITION_ACCESS selected when the request arrived.
    pub partition: Partition,
    /// The card takes sector addresses (else byte addresses).
    pub sector_addressing: bool,
    /// A packed command's header block (the first 512 bytes of its data), read from the
    /// guest's buffers.
    pub header: Option<&'a [u8; 512]>,
    /// The response the guest got.
    pub resp: &'a VirtioMmcResp,
    pub arrival: Nanos,
    /// The modelled end of the request: its completion, or the end of the busy it left.
    pub done: Nanos,
}

/// Turns executed virtio-mmc requests into trace lines.
pub struct MmcTracer<W: Write> {
    out: TraceWriter<W>,
    /// The erase group start (CMD35) and end (CMD36) addresses given since the last CMD38.
    erase_start: Option<u32>,
    erase_end: Option<u32>,
    /// A packed read's entries, from its header, until the CMD18 that reads the data.
    packed_read: Option<Vec<Entry>>,
}

/// The request went through without an error the guest could see.
fn succeeded(req: &MmcReq, resp: &VirtioMmcResp) -> bool {
    let r1_ok = |c: &VirtioMmcCmd, r: &VirtioMmcCmdResp| {
        !matches!(c.resp_type, RESP_R1 | RESP_R1B) || r.resp[0] & emmc_card::r1::ERRORS == 0
    };
    let h = &req.hdr;
    let data_ok =
        !req.has(REQ_F_DATA) || resp.bytes_xfered == u64::from(h.blksz) * u64::from(h.blocks);
    resp.status == STATUS_OK
        && resp.cmd.flags & RESP_F_ISSUED != 0
        && resp.sbc.error == ERR_NONE
        && resp.cmd.error == ERR_NONE
        && resp.stop.error == ERR_NONE
        && resp.data_error == ERR_NONE
        && r1_ok(&h.cmd, &resp.cmd)
        && data_ok
}

/// Parse a packed header block, whichever way it says the data goes.
fn parse_header(block: &[u8; 512]) -> Option<Header> {
    let direction = match block[1] {
        packed::HEADER_READ => Direction::Read,
        _ => Direction::Write,
    };
    Header::parse(block, direction, packed::MAX_ENTRIES_PER_BLOCK).ok()
}

impl<W: Write> MmcTracer<W> {
    pub fn new(out: TraceWriter<W>) -> MmcTracer<W> {
        MmcTracer {
            out,
            erase_start: None,
            erase_end: None,
            packed_read: None,
        }
    }

    /// The request as a comment line.
    fn note(&mut self, t: &Traced<'_>) -> std::io::Result<()> {
        let c = &t.req.hdr.cmd;
        self.out
            .note_command_now(t.arrival, c.opcode, c.arg, t.done)
    }

    fn bytes(t: &Traced<'_>, address: u32) -> u64 {
        if t.sector_addressing {
            u64::from(address) * 512
        } else {
            u64::from(address)
        }
    }

    fn entries(&mut self, t: &Traced<'_>, entries: &[Entry], read: bool) -> std::io::Result<()> {
        for e in entries {
            let op = match (read, e.reliable()) {
                (true, _) => Op::Read,
                (false, true) => Op::WriteReliable,
                (false, false) => Op::Write,
            };
            let offset = Self::bytes(t, e.address);
            self.out
                .record_now(t.arrival, op, offset, e.block_count() * 512, t.done)?;
        }
        Ok(())
    }

    /// Write one executed request's line(s) at once: the mmc transport executes requests
    /// one at a time in arrival order, so nothing earlier can still come.
    pub fn request(&mut self, t: &Traced<'_>) -> std::io::Result<()> {
        let req = t.req;
        let h = &req.hdr;
        let (opcode, arg) = (h.cmd.opcode, h.cmd.arg);
        let ok = succeeded(req, t.resp);
        let user = t.partition == Partition::User;
        let sbc = req.has(REQ_F_SBC).then_some(h.sbc.arg);
        let packed = sbc.is_some_and(|a| a & packed::CMD23_PACKED != 0);
        let data = req.has(REQ_F_DATA) && h.blksz == 512 && h.blocks > 0;
        match opcode {
            17 | 18 | 24 | 25 if ok && user && data => {
                let write = matches!(opcode, 24 | 25);
                if packed && write {
                    match t.header.and_then(parse_header) {
                        Some(header) if header.direction == Direction::Write => {
                            self.entries(t, &header.entries, false)
                        }
                        Some(header) => {
                            self.packed_read = Some(header.entries);
                            self.note(t)
                        }
                        None => self.note(t),
                    }
                } else if packed {
                    match self.packed_read.take() {
                        Some(entries) => self.entries(t, &entries, true),
                        None => self.note(t),
                    }
                } else {
                    let op = match (write, sbc) {
                        (false, _) => Op::Read,
                        (true, Some(a)) if a & packed::CMD23_RELIABLE_WRITE != 0 => {
                            Op::WriteReliable
                        }
                        (true, _) => Op::Write,
                    };
                    let len = u64::from(h.blocks) * 512;
                    self.out
                        .record_now(t.arrival, op, Self::bytes(t, arg), len, t.done)
                }
            }
            // SWITCH, WRITE_BYTE of FLUSH_CACHE with its FLUSH bit.
            6 if ok
                && (arg >> 24) & 0x3 == 3
                && (arg >> 16) & 0xFF == emmc_card::ext_csd::FLUSH_CACHE as u32
                && (arg >> 8) & 0x1 != 0 =>
            {
                self.out.record_now(t.arrival, Op::Flush, 0, 0, t.done)
            }
            35 | 36 => {
                if ok {
                    *if opcode == 35 {
                        &mut self.erase_start
                    } else {
                        &mut self.erase_end
                    } = Some(arg);
                }
                self.note(t)
            }
            38 => {
                let range = (self.erase_start.take(), self.erase_end.take());
                match range {
                    // Erase, trim, discard; secure erase and trim are comments, as the
                    // blk transport keeps SECURE_ERASE.
                    (Some(start), Some(end)) if ok && user && matches!(arg, 0 | 1 | 3) => {
                        let (first, last) =
                            (Self::bytes(t, start) / 512, Self::bytes(t, end) / 512);
                        if last < first {
                            return self.note(t);
                        }
                        let mut sector = first;
                        while sector <= last {
                            let n = (last - sector + 1).min(MAX_LINE_SECTORS);
                            self.out.record_now(
                                t.arrival,
                                Op::Discard,
                                sector * 512,
                                n * 512,
                                t.done,
                            )?;
                            sector += n;
                        }
                        Ok(())
                    }
                    _ => self.note(t),
                }
            }
            _ => self.note(t),
        }
    }

    /// Write everything out and flush.
    pub fn flush(&mut self) -> std::io::Result<()> {
        self.out.flush()
    }
}
