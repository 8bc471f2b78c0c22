//! `serve --transport sdhci --trace FILE`: the commands the guest's own driver sent
//! through the SDHCI registers, as a block trace (docs/trace-format.md) in the same lines
//! the mmc transport writes for the same commands, so `simulate --workload trace` replays
//! what the guest did to the card.
//!
//! The register model records each command it completes ([`CommandRecord`]); after every
//! access the tracer drains them and hands each to the mmc transport's mapping
//! ([`CommandTracer`]). A CMD23 the guest issues by itself is a comment line, and its
//! argument goes with the data command issued next (as an Auto CMD23's does). Commands
//! complete out of arrival order (a CMD13 during a read's data phase completes first), so
//! lines are held until no command still in its DAT phase was issued earlier.

use std::io::Write;

use emmc_card::timing::Nanos;
use emmc_host::sdhci::mmio::CommandRecord;
use emmc_host::sdhci::SdhciMmio;
use emmc_host::trace::TraceWriter;

use crate::mmc::trace::{Command, CommandTracer, Order};

/// Turns the register model's completed commands into trace lines.
pub struct SdhciTracer<W: Write> {
    inner: CommandTracer<W>,
    /// The card takes sector addresses (a property of its model).
    sector_addressing: bool,
}

/// The trace's view of a record.
fn command<'a>(r: &'a CommandRecord, sector_addressing: bool) -> Command<'a> {
    let blocks = r
        .data
        .and_then(|(_, blksz, blocks)| (blksz == 512 && blocks > 0).then_some(blocks));
    Command {
        opcode: r.opcode,
        arg: r.arg,
        sbc: r.sbc,
        blocks,
        ok: r.succeeded(),
        partition: r.partition,
        sector_addressing,
        header: r.header.as_deref(),
        arrival: r.issued,
        done: r.done,
    }
}

impl<W: Write> SdhciTracer<W> {
    /// Trace `mmio`'s commands from now on into `out` (this turns its records on).
    pub fn new(out: TraceWriter<W>, mmio: &mut SdhciMmio) -> SdhciTracer<W> {
        mmio.set_command_records(true);
        SdhciTracer {
            inner: CommandTracer::new(out, Order::Completion),
            sector_addressing: mmio.card().model().sector_addressing(),
        }
    }

    /// Map the commands `mmio` completed since the last call, and write the lines no
    /// command still open can precede.
    pub fn drain(&mut self, mmio: &mut SdhciMmio) -> std::io::Result<()> {
        let open = mmio.oldest_open_record();
        for r in mmio.drain_command_records() {
            self.inner.command(&command(&r, self.sector_addressing))?;
        }
        self.inner
            .release(open.map_or(Nanos::MAX, |t| t.saturating_sub(1)))
    }

    /// Write everything held and flush (the session ended: nothing is open).
    pub fn flush(&mut self) -> std::io::Result<()> {
        self.inner.flush()
    }
}

#[cfg(test)]
mod tests {
    //! A guest driving the register model directly (ADMA2, as Linux's `sdhci` does with
    //! a v3 controller), its trace written to memory; each expected line is built from
    //! what the guest saw: when it wrote the Command register, and when Transfer
    //! Complete (or, without data or busy, Command Complete) came.

    use std::cell::RefCell;
    use std::io::Write;
    use std::rc::Rc;

    use emmc_card::ext_csd as ext;
    use emmc_card::model::DeviceModel;
    use emmc_card::packed::{Direction, Entry, Header, CMD23_PACKED, CMD23_RELIABLE_WRITE};
    use emmc_card::store::MemStore;
    use emmc_card::timing::Nanos;
    use emmc_card::Card;
    use emmc_host::sdhci::mmio::layout::*;
    use emmc_host::sdhci::{adma2_attr, normal_int, DmaError, DmaMemory};
    use emmc_host::sdhci::{SdhciConfig, SdhciMmio};
    use emmc_host::trace::TraceWriter;

    use super::SdhciTracer;

    const MEM_BASE: u64 = 0x1000_0000;
    const TABLE: u64 = MEM_BASE;
    const DATA: u64 = MEM_BASE + 0x1000;
    const RCA: u32 = 1 << 16;

    /// Guest memory: one region.
    struct Mem(RefCell<Vec<u8>>);

    impl Mem {
        fn range(&self, addr: u64, len: usize) -> Result<std::ops::Range<usize>, DmaError> {
            let start = addr
                .checked_sub(MEM_BASE)
                .ok_or(DmaError::NotMapped { addr, len })? as usize;
            let end = start + len;
            if end > self.0.borrow().len() {
                return Err(DmaError::NotMapped { addr, len });
            }
            Ok(start..end)
        }

        fn put(&self, addr: u64, bytes: &[u8]) {
            let r = self.range(addr, bytes.len()).unwrap();
            self.0.borrow_mut()[r].copy_from_slice(bytes);
        }
    }

    impl DmaMemory for Mem {
        fn read(&self, addr: u64, buf: &mut [u8]) -> Result<(), DmaError> {
            let r = self.range(addr, buf.len())?;
            buf.copy_from_slice(&self.0.borrow()[r]);
            Ok(())
        }

        fn write(&self, addr: u64, buf: &[u8]) -> Result<(), DmaError> {
            let r = self.range(addr, buf.len())?;
            self.0.borrow_mut()[r].copy_from_slice(buf);
            Ok(())
        }
    }

    /// A trace file in memory.
    #[derive(Clone, Default)]
    struct Shared(Rc<RefCell<Vec<u8>>>);

    impl Write for Shared {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.borrow_mut().extend_from_slice(buf);
            Ok(buf.len())
        }

        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    /// What the guest sees of one command: when it issued it, and when it completed.
    #[derive(Debug, Clone, Copy)]
    struct Seen {
        at: Nanos,
        done: Nanos,
        response: u32,
    }

    struct Guest {
        mmio: SdhciMmio,
        mem: Mem,
        now: Nanos,
        tracer: SdhciTracer<Shared>,
        out: Shared,
        origin: Nanos,
    }

    const R1: u16 = SDHCI_CMD_RESP_SHORT | SDHCI_CMD_CRC | SDHCI_CMD_INDEX;
    const R1B: u16 = SDHCI_CMD_RESP_SHORT_BUSY | SDHCI_CMD_CRC | SDHCI_CMD_INDEX;

    impl Guest {
        fn new() -> Guest {
            let m = DeviceModel::load("generic-emmc45").unwrap();
            let card = Card::new(m.clone(), Box::new(MemStore::new(Card::layout_for(&m)))).unwrap();
            let mut mmio = SdhciMmio::new(card, SdhciConfig::default(), &m.host);
            let out = Shared::default();
            let origin = mmio.now();
            let writer = TraceWriter::new(out.clone(), origin, "test").unwrap();
            let tracer = SdhciTracer::new(writer, &mut mmio);
            Guest {
                now: origin,
                mmio,
                mem: Mem(RefCell::new(vec![0; 1 << 20])),
                tracer,
                out,
                origin,
            }
        }

        fn read(&mut self, off: u64, len: usize) -> u64 {
            let mut b = [0u8; 8];
            self.mmio.read(self.now, off, &mut b[..len], &self.mem);
            self.tracer.drain(&mut self.mmio).unwrap();
            u64::from_le_bytes(b)
        }

        fn write(&mut self, off: u64, v: u64, len: usize) {
            self.mmio
                .write(self.now, off, &v.to_le_bytes()[..len], &self.mem);
            self.tracer.drain(&mut self.mmio).unwrap();
        }

        fn status(&mut self) -> u32 {
            self.read(SDHCI_INT_STATUS, 4) as u32
        }

        /// Run to the first status bit of `mask`; acknowledge those and any error, and
        /// return the status.
        fn wait(&mut self, mask: u32) -> u32 {
            loop {
                let st = self.status();
                if st & mask != 0 {
                    self.write(SDHCI_INT_STATUS, u64::from(st & (mask | 0xFFFF_0000)), 4);
                    return st;
                }
                let t = self
                    .mmio
                    .next_event()
                    .expect("the awaited interrupt never comes");
                self.now = self.now.max(t);
            }
        }

        fn idle(&mut self, ns: Nanos) {
            self.now += ns;
            self.mmio.advance(self.now, &self.mem);
            self.tracer.drain(&mut self.mmio).unwrap();
        }

        /// A command without data; with busy, until Transfer Complete.
        fn command(&mut self, opcode: u8, arg: u32, flags: u16) -> Seen {
            self.write(SDHCI_ARGUMENT, u64::from(arg), 4);
            self.write(SDHCI_TRANSFER_MODE, 0, 2);
            let at = self.now;
            self.write(SDHCI_COMMAND, u64::from(sdhci_make_cmd(opcode, flags)), 2);
            let st = self.wait(u32::from(normal_int::CMD_COMPLETE | normal_int::ERROR_INT));
            let response = self.read(SDHCI_RESPONSE, 4) as u32;
            if flags & SDHCI_CMD_RESP_MASK == SDHCI_CMD_RESP_SHORT_BUSY && st & 0xFFFF_0000 == 0 {
                self.wait(u32::from(
                    normal_int::TRANSFER_COMPLETE | normal_int::ERROR_INT,
                ));
            }
            Seen {
                at,
                done: self.now,
                response,
            }
        }

        /// A data command by ADMA2 over `DATA` (written first for a write); `auto23`: the
        /// CMD23 argument to send as Auto CMD23. `on_response` runs after Command
        /// Complete, before the data's end is awaited.
        fn data(
            &mut self,
            opcode: u8,
            arg: u32,
            blocks: u16,
            read: bool,
            auto23: Option<u32>,
            on_response: &mut dyn FnMut(&mut Guest),
        ) -> Seen {
            let len = usize::from(blocks) * 512;
            let mut desc = [0u8; 8];
            desc[0..2].copy_from_slice(&(adma2_attr::TRAN_VALID | adma2_attr::END).to_le_bytes());
            desc[2..4].copy_from_slice(&(len as u16).to_le_bytes());
            desc[4..8].copy_from_slice(&(DATA as u32).to_le_bytes());
            self.mem.put(TABLE, &desc);
            self.write(SDHCI_ADMA_ADDRESS, TABLE, 4);
            self.write(SDHCI_BLOCK_SIZE, u64::from(sdhci_make_blksz(7, 512)), 2);
            self.write(SDHCI_BLOCK_COUNT, u64::from(blocks), 2);
            let mut mode = SDHCI_TRNS_BLK_CNT_EN | SDHCI_TRNS_DMA;
            if blocks > 1 || matches!(opcode, 18 | 25) {
                mode |= SDHCI_TRNS_MULTI;
            }
            if read {
                mode |= SDHCI_TRNS_READ;
            }
            if let Some(sbc) = auto23 {
                mode |= SDHCI_TRNS_AUTO_CMD23;
                self.write(SDHCI_ARGUMENT2, u64::from(sbc), 4);
            }
            self.write(SDHCI_ARGUMENT, u64::from(arg), 4);
            self.write(SDHCI_TRANSFER_MODE, u64::from(mode), 2);
            let at = self.now;
            self.write(
                SDHCI_COMMAND,
                u64::from(sdhci_make_cmd(opcode, R1 | SDHCI_CMD_DATA)),
                2,
            );
            let st = self.wait(u32::from(normal_int::CMD_COMPLETE | normal_int::ERROR_INT));
            assert_eq!(st >> 16, 0, "CMD{opcode} answered");
            let response = self.read(SDHCI_RESPONSE, 4) as u32;
            on_response(self);
            let st = self.wait(u32::from(
                normal_int::TRANSFER_COMPLETE | normal_int::ERROR_INT,
            ));
            assert_eq!(st >> 16, 0, "CMD{opcode}'s data");
            Seen {
                at,
                done: self.now,
                response,
            }
        }

        /// Power, clock, interrupts, and the card to the transfer state at 25 MHz.
        fn bring_up(&mut self) {
            self.write(
                SDHCI_POWER_CONTROL,
                u64::from(SDHCI_POWER_330 | SDHCI_POWER_ON),
                1,
            );
            let base = (self.read(SDHCI_CAPABILITIES, 4) as u32 & SDHCI_CLOCK_V3_BASE_MASK) >> 8;
            let clock = |hz: u32| {
                let n = (base * 1_000_000).div_ceil(2 * hz);
                u64::from(clock_with_divider(n as u16) | SDHCI_CLOCK_INT_EN | SDHCI_CLOCK_CARD_EN)
            };
            self.write(SDHCI_CLOCK_CONTROL, clock(400_000), 2);
            self.write(SDHCI_INT_ENABLE, 0xFFFF_FFFF, 4);
            self.write(SDHCI_TIMEOUT_CONTROL, 0xE, 1);
            self.write(SDHCI_HOST_CONTROL, u64::from(SDHCI_CTRL_ADMA32), 1);
            self.command(0, 0, SDHCI_CMD_RESP_NONE);
            let mut ocr = 0;
            for _ in 0..100 {
                ocr = self.command(1, 0x40FF_8080, SDHCI_CMD_RESP_SHORT).response;
                if ocr & 1 << 31 != 0 {
                    break;
                }
                self.idle(1_000_000);
            }
            assert_ne!(ocr & 1 << 30, 0, "a sector-addressed card");
            self.command(2, 0, SDHCI_CMD_RESP_LONG | SDHCI_CMD_CRC);
            self.command(3, RCA, R1);
            self.command(7, RCA, R1B);
            self.write(SDHCI_CLOCK_CONTROL, clock(25_000_000), 2);
            let r = self.command(13, RCA, R1).response;
            assert_eq!((r >> 9) & 0xF, 4, "tran");
        }

        fn line(&self, s: Seen, op: &str, offset: u64, len: u64) -> String {
            let (a, d) = (s.at - self.origin, s.done - self.origin);
            format!("{a} {op} {offset} {len} {d}")
        }

        fn note(&self, s: Seen, opcode: u8, arg: u32) -> String {
            let (a, d) = (s.at - self.origin, s.done - self.origin);
            format!("# {a} CMD{opcode} arg=0x{arg:08x} {d}")
        }

        fn finish(mut self) -> String {
            self.tracer.flush().unwrap();
            let bytes = self.out.0.borrow().clone();
            String::from_utf8(bytes).unwrap()
        }
    }

    /// A session: bring-up, then each request the task names; the trace and the lines
    /// expected for the requests.
    fn traced_session() -> (String, Vec<String>) {
        let mut g = Guest::new();
        g.bring_up();
        let mut want = Vec::new();
        let none = &mut |_: &mut Guest| {};
        // A reliable write the guest announces with its own CMD23.
        let sbc = 8 | CMD23_RELIABLE_WRITE;
        let s = g.command(23, sbc, R1);
        want.push(g.note(s, 23, sbc));
        g.mem.put(DATA, &[0x5A; 4096]);
        let s = g.data(25, 1000, 8, false, None, none);
        want.push(g.line(s, "WF", 1000 * 512, 4096));
        // A read with Auto CMD23; a CMD13 sent during its data phase completes first, and
        // still comes after it.
        let mut cmd13 = None;
        let s = g.data(18, 1000, 16, true, Some(16), &mut |g| {
            cmd13 = Some(g.command(13, RCA, R1));
        });
        let cmd13 = cmd13.unwrap();
        assert!(cmd13.done < s.done, "the CMD13 completed inside the read");
        want.push(g.line(s, "R", 1000 * 512, 8192));
        want.push(g.note(cmd13, 13, RCA));
        // A packed write (Auto CMD23 with PACKED): 8 blocks at 2000, 4 reliable at 3000.
        let header = Header {
            direction: Direction::Write,
            entries: vec![Entry::new(8, 2000, false), Entry::new(4, 3000, true)],
        };
        g.mem.put(DATA, &header.encode());
        g.mem.put(DATA + 512, &[0xA5; 12 * 512]);
        let s = g.data(25, 2000, 13, false, Some(13 | CMD23_PACKED), none);
        want.push(g.line(s, "W", 2000 * 512, 4096));
        want.push(g.line(s, "WF", 3000 * 512, 2048));
        // A cache flush.
        let flush = 0x0300_0000 | (ext::FLUSH_CACHE as u32) << 16 | 1 << 8;
        let s = g.command(6, flush, R1B);
        want.push(g.line(s, "F", 0, 0));
        // A trim of sectors 4096..=4100.
        for (opcode, arg, flags) in [(35, 4096, R1), (36, 4100, R1)] {
            let s = g.command(opcode, arg, flags);
            want.push(g.note(s, opcode, arg));
        }
        let s = g.command(38, 1, R1B);
        assert_eq!(s.response & emmc_card::r1::ERRORS, 0);
        want.push(g.line(s, "D", 4096 * 512, 5 * 512));
        // boot1: the switch and a read there are comments.
        let boot1 = 0x0300_0000 | (ext::PARTITION_CONFIG as u32) << 16 | 1 << 8;
        let s = g.command(6, boot1, R1B);
        want.push(g.note(s, 6, boot1));
        let s = g.data(17, 0, 1, true, None, none);
        want.push(g.note(s, 17, 0));
        assert_eq!(
            g.mmio.card().current_partition(),
            emmc_card::Partition::Boot1
        );
        (g.finish(), want)
    }

    #[test]
    fn the_sdhci_trace_has_the_mmc_transports_lines_for_the_guests_commands() {
        let (text, want) = traced_session();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines[0], "# test");
        let tail = &lines[lines.len() - want.len()..];
        assert_eq!(tail, want.iter().map(String::as_str).collect::<Vec<_>>());
        // Bring-up: comments only, CMD0 first.
        let head = &lines[2..lines.len() - want.len()];
        assert!(
            head[0].starts_with("# 0 CMD0 arg=0x00000000 "),
            "{}",
            head[0]
        );
        assert!(head.iter().all(|l| l.starts_with("# ")), "{head:?}");
        // Arrival times never decrease.
        let arrivals: Vec<u64> = lines[2..]
            .iter()
            .map(|l| {
                let t = l.trim_start_matches("# ").split(' ').next().unwrap();
                t.parse().unwrap()
            })
            .collect();
        assert!(arrivals.windows(2).all(|w| w[0] <= w[1]), "{arrivals:?}");
    }

    #[test]
    fn the_sdhci_trace_replays_with_the_simulators_parser() {
        let (text, _) = traced_session();
        assert_eq!(
            crate::testing::trace_ops(&text),
            crate::testing::TRACED_SESSION_OPS
        );
    }
}
