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
//!
//! The mapping is [`CommandTracer`]'s, fed one executed command at a time as a
//! transport-neutral [`Command`]: [`MmcTracer`] makes one of each virtio-mmc request, and
//! `serve --transport sdhci` of each command the register-level controller completes
//! (`crate::sdhci::trace`).

use std::io::Write;

use super::proto::*;
use super::request::MmcReq;
use emmc_card::packed::{self, Direction, Entry, Header};
use emmc_card::timing::Nanos;
use emmc_card::Partition;
use emmc_host::trace::{Op, TraceWriter};

/// The most sectors one trace line may carry (the format's limit): longer erases are
/// split into lines of this size.
const MAX_LINE_SECTORS: u64 = 32_768;

/// One executed MMC command as the trace needs it, whichever transport carried it.
#[derive(Debug, Clone, Copy)]
pub struct Command<'a> {
    pub opcode: u8,
    pub arg: u32,
    /// The argument of the CMD23 that went with it (a data command's block count).
    pub sbc: Option<u32>,
    /// Its data phase in 512-byte blocks (`None`: no data phase, none of that block size,
    /// or no blocks).
    pub blocks: Option<u32>,
    /// It went through without an error the guest could see, with all its data.
    pub ok: bool,
    /// The partition PARTITION_ACCESS selected when it arrived.
    pub partition: Partition,
    /// The card takes sector addresses (else byte addresses).
    pub sector_addressing: bool,
    /// A packed write's header block (the first 512 bytes of its data).
    pub header: Option<&'a [u8; 512]>,
    pub arrival: Nanos,
    /// The modelled end of the command: its completion, or the end of the busy it left.
    pub done: Nanos,
}

/// When lines may be written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Order {
    /// Commands come in arrival order (the mmc transport executes one request at a
    /// time): each line is written at once.
    Arrival,
    /// Commands come as they complete, which need not be in arrival order: lines are
    /// held until [`CommandTracer::release`] says nothing earlier can still come.
    Completion,
}

/// Turns executed MMC commands into trace lines (docs/trace-format.md).
pub struct CommandTracer<W: Write> {
    out: TraceWriter<W>,
    order: Order,
    /// The erase group start (CMD35) and end (CMD36) addresses given since the last CMD38.
    erase_start: Option<u32>,
    erase_end: Option<u32>,
    /// A packed read's entries, from its header, until the CMD18 that reads the data.
    packed_read: Option<Vec<Entry>>,
}

/// Parse a packed header block, whichever way it says the data goes.
fn parse_header(block: &[u8; 512]) -> Option<Header> {
    let direction = match block[1] {
        packed::HEADER_READ => Direction::Read,
        _ => Direction::Write,
    };
    Header::parse(block, direction, packed::MAX_ENTRIES_PER_BLOCK).ok()
}

impl<W: Write> CommandTracer<W> {
    pub fn new(out: TraceWriter<W>, order: Order) -> CommandTracer<W> {
        CommandTracer {
            out,
            order,
            erase_start: None,
            erase_end: None,
            packed_read: None,
        }
    }

    fn line(&mut self, c: &Command<'_>, op: Op, offset: u64, length: u64) -> std::io::Result<()> {
        match self.order {
            Order::Arrival => self.out.record_now(c.arrival, op, offset, length, c.done),
            Order::Completion => {
                self.out.record(c.arrival, op, offset, length, c.done);
                Ok(())
            }
        }
    }

    /// The command as a comment line.
    fn note(&mut self, c: &Command<'_>) -> std::io::Result<()> {
        match self.order {
            Order::Arrival => self
                .out
                .note_command_now(c.arrival, c.opcode, c.arg, c.done),
            Order::Completion => {
                self.out.note_command(c.arrival, c.opcode, c.arg, c.done);
                Ok(())
            }
        }
    }

    fn bytes(c: &Command<'_>, address: u32) -> u64 {
        if c.sector_addressing {
            u64::from(address) * 512
        } else {
            u64::from(address)
        }
    }

    fn entries(&mut self, c: &Command<'_>, entries: &[Entry], read: bool) -> std::io::Result<()> {
        for e in entries {
            let op = match (read, e.reliable()) {
                (true, _) => Op::Read,
                (false, true) => Op::WriteReliable,
                (false, false) => Op::Write,
            };
            let offset = Self::bytes(c, e.address);
            self.line(c, op, offset, e.block_count() * 512)?;
        }
        Ok(())
    }

    /// The line(s) of one executed command.
    pub fn command(&mut self, c: &Command<'_>) -> std::io::Result<()> {
        let (opcode, arg, ok) = (c.opcode, c.arg, c.ok);
        let user = c.partition == Partition::User;
        let packed = c.sbc.is_some_and(|a| a & packed::CMD23_PACKED != 0);
        match (opcode, c.blocks) {
            (17 | 18 | 24 | 25, Some(blocks)) if ok && user => {
                let write = matches!(opcode, 24 | 25);
                if packed && write {
                    match c.header.and_then(parse_header) {
                        Some(header) if header.direction == Direction::Write => {
                            self.entries(c, &header.entries, false)
                        }
                        Some(header) => {
                            self.packed_read = Some(header.entries);
                            self.note(c)
                        }
                        None => self.note(c),
                    }
                } else if packed {
                    match self.packed_read.take() {
                        Some(entries) => self.entries(c, &entries, true),
                        None => self.note(c),
                    }
                } else {
                    let op = match (write, c.sbc) {
                        (false, _) => Op::Read,
                        (true, Some(a)) if a & packed::CMD23_RELIABLE_WRITE != 0 => {
                            Op::WriteReliable
                        }
                        (true, _) => Op::Write,
                    };
                    let len = u64::from(blocks) * 512;
                    self.line(c, op, Self::bytes(c, arg), len)
                }
            }
            // SWITCH, WRITE_BYTE of FLUSH_CACHE with its FLUSH bit.
            (6, _)
                if ok
                    && (arg >> 24) & 0x3 == 3
                    && (arg >> 16) & 0xFF == emmc_card::ext_csd::FLUSH_CACHE as u32
                    && (arg >> 8) & 0x1 != 0 =>
            {
                self.line(c, Op::Flush, 0, 0)
            }
            (35 | 36, _) => {
                if ok {
                    *if opcode == 35 {
                        &mut self.erase_start
                    } else {
                        &mut self.erase_end
                    } = Some(arg);
                }
                self.note(c)
            }
            (38, _) => {
                let range = (self.erase_start.take(), self.erase_end.take());
                match range {
                    // Erase, trim, discard; secure erase and trim are comments, as the
                    // blk transport keeps SECURE_ERASE.
                    (Some(start), Some(end)) if ok && user && matches!(arg, 0 | 1 | 3) => {
                        let (first, last) =
                            (Self::bytes(c, start) / 512, Self::bytes(c, end) / 512);
                        if last < first {
                            return self.note(c);
                        }
                        let mut sector = first;
                        while sector <= last {
                            let n = (last - sector + 1).min(MAX_LINE_SECTORS);
                            self.line(c, Op::Discard, sector * 512, n * 512)?;
                            sector += n;
                        }
                        Ok(())
                    }
                    _ => self.note(c),
                }
            }
            _ => self.note(c),
        }
    }

    /// Write every held line that arrived at or before `upto` ([`Order::Completion`]).
    /// A comment line, written at once ([`TraceWriter::comment`]).
    pub fn comment(&mut self, text: &str) -> std::io::Result<()> {
        self.out.comment(text)
    }

    /// Card time `at` as the trace writes it ([`TraceWriter::trace_time`]).
    pub fn trace_time(&self, at: Nanos) -> Nanos {
        self.out.trace_time(at)
    }

    pub fn release(&mut self, upto: Nanos) -> std::io::Result<()> {
        self.out.release(upto)
    }

    /// Write everything out and flush.
    pub fn flush(&mut self) -> std::io::Result<()> {
        self.out.flush()
    }
}

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
    inner: CommandTracer<W>,
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

impl<W: Write> MmcTracer<W> {
    pub fn new(out: TraceWriter<W>) -> MmcTracer<W> {
        MmcTracer {
            inner: CommandTracer::new(out, Order::Arrival),
        }
    }

    /// Write one executed request's line(s) at once: the mmc transport executes requests
    /// one at a time in arrival order, so nothing earlier can still come.
    pub fn request(&mut self, t: &Traced<'_>) -> std::io::Result<()> {
        let req = t.req;
        let h = &req.hdr;
        let data = req.has(REQ_F_DATA) && h.blksz == 512 && h.blocks > 0;
        self.inner.command(&Command {
            opcode: h.cmd.opcode,
            arg: h.cmd.arg,
            sbc: req.has(REQ_F_SBC).then_some(h.sbc.arg),
            blocks: data.then_some(h.blocks),
            ok: succeeded(req, t.resp),
            partition: t.partition,
            sector_addressing: t.sector_addressing,
            header: t.header,
            arrival: t.arrival,
            done: t.done,
        })
    }

    /// Write everything out and flush.
    pub fn flush(&mut self) -> std::io::Result<()> {
        self.inner.flush()
    }

    /// A comment line, written at once.
    pub fn comment(&mut self, text: &str) -> std::io::Result<()> {
        self.inner.comment(text)
    }

    /// Card time `at` as the trace writes it.
    pub fn trace_time(&self, at: Nanos) -> Nanos {
        self.inner.trace_time(at)
    }
}
