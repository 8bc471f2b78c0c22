//! Issuing a command (the Command register's upper byte written): the inhibit rules,
//! the Command and Transfer Mode registers decoded into the command, its data phase and
//! its Auto CMD23/CMD12, then the card-side work started through `card_steps.rs` and the
//! DAT phase (`transfer.rs`) set up to reveal it.

use emmc_card::command::ResponseType;
use emmc_card::timing::Nanos;

use super::adma_walk::{self, AdmaChain, ChainEnd};
use super::card_steps::{self, Exchange};
use super::dma::DmaMemory;
use super::layout::*;
use super::transfer::{adma_gather, Arrivals, BusyWait, DatPhase, Engine, Failure};
use super::SdhciMmio;
use crate::mmc::MMC_CMD23_ARG_PACKED;
use crate::sdhci::{
    adma_err, error_int, hardware_timeout_ns, DataDirection, MmcCommand, SdhciError,
    MAX_BLOCK_COUNT, MAX_TUNING_LOOP,
};

/// A command on the CMD line, revealed at `at`: the Response registers it sets (`words`,
/// bit i for RESP[i]), and its status.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct CmdReveal {
    pub(super) at: Nanos,
    pub(super) words: u8,
    pub(super) response: [u32; 4],
    pub(super) normal: u16,
    pub(super) error: u16,
    pub(super) auto_cmd_err: u16,
}

impl CmdReveal {
    fn new(x: &Exchange, words: u8) -> CmdReveal {
        CmdReveal {
            at: x.at,
            words,
            response: x.response,
            normal: x.normal,
            error: x.error_bits,
            auto_cmd_err: x.auto_cmd_err,
        }
    }
}

/// How a transfer's data moves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    Pio,
    Sdma,
    /// ADMA2; `wide`: 64-bit (12-byte) descriptors.
    Adma {
        wide: bool,
    },
    /// DMA Select 01 (ADMA1, which a v3 controller need not have).
    Unsupported,
}

impl SdhciMmio {
    /// The Command register's upper byte was written: issue the command.
    pub(super) fn issue(&mut self, dma: &dyn DmaMemory) {
        let command = self.regs.command;
        let index = sdhci_get_cmd(command);
        let flags = command & 0xFF;
        if self.cmd.is_some() {
            self.refused(index, "Command Inhibit (CMD) is set");
            return;
        }
        let resp = flags & SDHCI_CMD_RESP_MASK;
        let data = flags & SDHCI_CMD_DATA != 0;
        if (data || resp == SDHCI_CMD_RESP_SHORT_BUSY) && self.dat.is_some() {
            if flags & SDHCI_CMD_TYPE_MASK == SDHCI_CMD_ABORTCMD {
                self.abort_data();
            } else {
                self.refused(index, "Command Inhibit (DAT) is set");
                return;
            }
        }
        let resp_type = match resp {
            SDHCI_CMD_RESP_NONE => ResponseType::None,
            SDHCI_CMD_RESP_LONG => ResponseType::R2,
            SDHCI_CMD_RESP_SHORT if flags & SDHCI_CMD_INDEX != 0 => ResponseType::R1,
            SDHCI_CMD_RESP_SHORT => ResponseType::R3,
            _ => ResponseType::R1b,
        };
        let words = match resp {
            SDHCI_CMD_RESP_NONE => 0,
            SDHCI_CMD_RESP_LONG => 0b1111,
            _ => 0b0001,
        };
        let cmd = MmcCommand {
            opcode: index,
            arg: self.regs.argument,
            resp_type,
            busy: resp == SDHCI_CMD_RESP_SHORT_BUSY,
            busy_timeout_ms: 0,
        };
        let prev_sbc = self.last_sbc.take();
        if index == 23 && !data {
            self.last_sbc = Some(cmd.arg);
        }
        if data && index == 21 && self.regs.host_control2 & SDHCI_CTRL_EXEC_TUNING != 0 {
            self.issue_tuning();
        } else if data {
            self.issue_data(cmd, prev_sbc, words, dma);
        } else {
            self.issue_plain(cmd, words);
        }
    }

    fn refused(&mut self, index: u8, why: &str) {
        self.bad_access(&format!("CMD{index} not issued: {why}"));
    }

    /// The data time-out per block from Timeout Control and TMCLK; none while the Data
    /// Timeout Error status is not enabled (the controller then waits as long as it takes).
    fn per_block_timeout(&self) -> Nanos {
        if self.ints.error_enable & error_int::DATA_TIMEOUT == 0 {
            return Nanos::MAX;
        }
        hardware_timeout_ns(
            self.regs.timeout_control & SDHCI_TIMEOUT_MASK,
            self.caps.timeout_clock_hz(),
        )
    }

    fn dma_mode(&self, transfer_mode: u16) -> Mode {
        if transfer_mode & SDHCI_TRNS_DMA == 0 {
            return Mode::Pio;
        }
        match self.regs.host_control & SDHCI_CTRL_DMA_MASK {
            SDHCI_CTRL_SDMA => Mode::Sdma,
            SDHCI_CTRL_ADMA32 => Mode::Adma { wide: false },
            SDHCI_CTRL_ADMA64 => Mode::Adma {
                wide: self.caps.has(SDHCI_CAN_64BIT),
            },
            _ => Mode::Unsupported,
        }
    }

    /// A command without data (with R1b: a DAT phase waiting for the busy).
    fn issue_plain(&mut self, cmd: MmcCommand, words: u8) {
        let mut d = DatPhase::new(cmd.opcode, self.per_block_timeout());
        let mut record = self.open_record(cmd.opcode, cmd.arg, cmd.resp_type);
        let x = card_steps::exchange(
            &mut self.host,
            &mut self.card,
            self.now,
            None,
            &cmd,
            None,
            &mut d.log,
            &mut d.injected,
        );
        self.cmd = Some(CmdReveal::new(&x, words));
        if let Some(r) = record.as_mut() {
            r.response = x.response[0];
            r.error = x.error;
        }
        if cmd.busy {
            d.record = record;
            if x.error.is_some() {
                d.failure = Some(Failure::quiet(x.at, None));
            } else {
                d.delivered = Some(x.at);
                d.busy = Some(BusyWait {
                    from: x.at,
                    checked: false,
                });
            }
            self.dat = Some(d);
        } else {
            if let Some(e) = d.log.take() {
                self.host.write_log(&e, x.at, None, false);
            }
            self.close_record(record, x.at, None);
        }
    }

    /// CMD21 while Execute Tuning is set: the controller reads the tuning block itself.
    fn issue_tuning(&mut self) {
        let blksz = self.regs.blksz() as usize;
        let record = self.open_record(21, self.regs.argument, ResponseType::R1);
        let (end, brr, intact) =
            card_steps::tuning_block(&mut self.host, &mut self.card, self.now, blksz);
        self.cmd = Some(CmdReveal {
            at: end,
            words: 0b0001,
            response: self.host.response,
            normal: 0,
            error: 0,
            auto_cmd_err: 0,
        });
        let mut d = DatPhase::new(21, Nanos::MAX);
        d.read = Some(true);
        d.blksz = blksz;
        d.blocks = 1;
        d.engine = Engine::Tuning { brr, intact };
        d.delivered = Some(end);
        d.record = record.map(|mut r| {
            r.response = self.host.response[0];
            r.data = Some((DataDirection::Read, blksz as u32, 1));
            r
        });
        self.dat = Some(d);
    }

    /// A tuning block came: the controller found its sampling point, or after
    /// [`MAX_TUNING_LOOP`] blocks gives up; either ends Execute Tuning.
    pub(super) fn tuning_result(&mut self, intact: bool) {
        if self.regs.host_control2 & SDHCI_CTRL_EXEC_TUNING == 0 {
            return;
        }
        self.tuning_tries += 1;
        if intact || self.tuning_tries >= MAX_TUNING_LOOP {
            self.host.tuned = intact;
            self.regs.host_control2 &= !SDHCI_CTRL_EXEC_TUNING;
            self.tuning_tries = 0;
        }
    }

    /// A command with data.
    fn issue_data(
        &mut self,
        cmd: MmcCommand,
        prev_sbc: Option<u32>,
        words: u8,
        dma: &dyn DmaMemory,
    ) {
        let tm = self.regs.transfer_mode;
        let read = tm & SDHCI_TRNS_READ != 0;
        let multi = tm & SDHCI_TRNS_MULTI != 0;
        let bce = tm & SDHCI_TRNS_BLK_CNT_EN != 0;
        let auto = tm & SDHCI_TRNS_AUTO_MASK;
        let mode = self.dma_mode(tm);
        let blksz = self.regs.blksz() as usize;
        // The ADMA2 engine fetches the table at the start.
        let chain = match mode {
            Mode::Adma { wide } => {
                let start = if wide {
                    self.regs.adma_address
                } else {
                    self.regs.adma_address & 0xFFFF_FFFF
                };
                Some(adma_walk::walk(dma, start, wide))
            }
            _ => None,
        };
        let blocks = if !multi {
            1
        } else if bce || chain.is_none() {
            u32::from(self.regs.block_count)
        } else {
            let total = chain.as_ref().map_or(0, |c| c.total);
            (total / blksz.max(1) as u64).min(u64::from(MAX_BLOCK_COUNT)) as u32
        };
        let refused = blksz == 0 || blksz > self.caps.max_block_len() as usize || blocks == 0;
        let per_block = self.per_block_timeout();
        let mut d = DatPhase::new(cmd.opcode, per_block);
        d.read = Some(read);
        d.blksz = blksz;
        d.blocks = blocks;
        d.budget = per_block.saturating_mul(u64::from(blocks.max(1)));
        d.counts_blocks = multi && bce;
        d.auto_cmd12 = multi && auto == SDHCI_TRNS_AUTO_CMD12 && !refused;
        let sbc = (multi && auto == SDHCI_TRNS_AUTO_CMD23)
            .then(|| MmcCommand::new(23, self.regs.sdma_address, ResponseType::R1));
        if sbc.is_some() || d.auto_cmd12 {
            self.ints.auto_cmd_err = 0;
        }
        let packed = sbc
            .map(|s| s.arg)
            .or(prev_sbc)
            .is_some_and(|a| a & MMC_CMD23_ARG_PACKED != 0);
        let dir = if read {
            DataDirection::Read
        } else {
            DataDirection::Write
        };
        let record = self.open_record(cmd.opcode, cmd.arg, cmd.resp_type);
        let x = card_steps::exchange(
            &mut self.host,
            &mut self.card,
            self.now,
            sbc,
            &cmd,
            Some((dir, blksz as u32, blocks, packed)),
            &mut d.log,
            &mut d.injected,
        );
        self.cmd = Some(CmdReveal::new(&x, words));
        d.record = record.map(|mut r| {
            r.sbc = sbc.map(|s| s.arg).or(prev_sbc);
            r.response = x.response[0];
            r.error = x.error;
            r.data = (!refused).then_some((dir, blksz as u32, blocks));
            r
        });
        let t0 = x.at;
        if !x.issued || x.error.is_some() {
            // sdhci_cmd_irq takes a data command's CRC error as the data's.
            let data_error = (x.error == Some(SdhciError::CmdCrc)).then_some(SdhciError::DataCrc);
            d.auto_cmd12 = false;
            d.failure = Some(Failure::quiet(t0, data_error));
        } else if refused {
            log::debug!(
                "CMD{}: {blocks} blocks of {blksz} bytes: nothing moves",
                cmd.opcode
            );
            d.delivered = Some(t0);
        } else {
            match (mode, chain.as_ref()) {
                (Mode::Unsupported, _) => {
                    log::debug!("CMD{}: DMA Select 01 (ADMA1) is not supported", cmd.opcode);
                    let status = adma_err::ST_STOP;
                    d.fail(Failure {
                        adma: Some((status, self.regs.adma_address)),
                        ..Failure::new(t0, error_int::ADMA_ERR, SdhciError::Adma(status))
                    });
                }
                _ if read => self.start_read(&mut d, t0, mode, chain.as_ref(), dma),
                _ => self.start_write(&mut d, t0, mode, chain.as_ref(), dma),
            }
        }
        self.dat = Some(d);
    }

    /// A read from `t0`: every block off the card now, then delivered as the mode does.
    fn start_read(
        &mut self,
        d: &mut DatPhase,
        t0: Nanos,
        mode: Mode,
        chain: Option<&AdmaChain>,
        dma: &dyn DmaMemory,
    ) {
        let bus = self.host.bus();
        let end = match card_steps::read_blocks(
            &mut self.host,
            &mut self.card,
            t0,
            d.opcode,
            d.blksz,
            d.blocks,
            d.per_block,
            d.budget,
            &mut d.injected,
            &mut self.buf,
        ) {
            Ok(end) => end,
            Err(f) => {
                d.fail(f);
                return;
            }
        };
        let arrivals = Arrivals::new(t0, end, bus, d.blksz, d.blocks);
        match (mode, chain) {
            (Mode::Pio, _) => {
                d.engine = Engine::PioRead {
                    arrivals,
                    next: 0,
                    pos: 0,
                    ready: false,
                    free_since: t0,
                }
            }
            (Mode::Sdma, _) => {
                d.engine = Engine::Sdma {
                    arrivals: Some(arrivals),
                    addr: self.regs.sdma_address,
                    boundary: self.regs.sdma_boundary(),
                    moved: 0,
                    pause_at: None,
                    paused: false,
                };
                self.sdma_read_chunk(d, t0, dma);
            }
            (Mode::Adma { wide }, Some(chain)) => self.adma_read(d, chain, arrivals, wide, dma),
            _ => {}
        }
        if d.failure.is_none() {
            self.after_data(d, end);
        }
    }

    /// A write from `t0`: the bus checked, then blocks to the card as the guest's memory
    /// or the Buffer Data Port supplies them.
    fn start_write(
        &mut self,
        d: &mut DatPhase,
        t0: Nanos,
        mode: Mode,
        chain: Option<&AdmaChain>,
        dma: &dyn DmaMemory,
    ) {
        match card_steps::write_start(
            &mut self.host,
            &mut self.card,
            t0,
            d.opcode,
            d.blksz,
            d.per_block,
            &mut d.injected,
        ) {
            Ok(garbled) => d.garbled = garbled,
            Err(f) => {
                d.fail(f);
                return;
            }
        }
        d.bus_free = t0;
        let len = d.len() as usize;
        self.buf.clear();
        match (mode, chain) {
            (Mode::Pio, _) => {
                self.buf.resize(d.blksz, 0);
                d.engine = Engine::PioWrite {
                    pos: 0,
                    ready: false,
                    free_at: t0,
                };
            }
            (Mode::Sdma, _) => {
                self.buf.resize(len, 0);
                d.engine = Engine::Sdma {
                    arrivals: None,
                    addr: self.regs.sdma_address,
                    boundary: self.regs.sdma_boundary(),
                    moved: 0,
                    pause_at: None,
                    paused: false,
                };
                self.sdma_write_chunk(d, t0, dma);
            }
            (Mode::Adma { wide }, Some(chain)) => {
                self.buf.resize(len, 0);
                let (avail, fault) = adma_gather(chain, len as u64, wide, &mut self.buf, dma);
                let blksz = d.blksz as u64;
                let upto = (avail / blksz) as u32;
                let bus = self.host.bus();
                let sent_ok = self.send_to_card(d, t0, 0, upto);
                // An Int descriptor's interrupt comes when the block holding its last byte
                // is out.
                let marks = chain
                    .int_marks
                    .iter()
                    .filter(|&&m| m <= u64::from(upto) * blksz)
                    .map(|&m| match m {
                        0 => t0,
                        m => t0.saturating_add(bus.write_ns(d.blksz, (m - 1) / blksz + 1)),
                    })
                    .collect();
                d.engine = Engine::Adma { marks, next: 0 };
                if sent_ok {
                    match fault {
                        Some((_, status, addr)) => d.fail(Failure {
                            adma: Some((status, addr)),
                            ..Failure::new(
                                d.bus_free,
                                error_int::ADMA_ERR,
                                SdhciError::Adma(status),
                            )
                        }),
                        None => {
                            if let ChainEnd::End { next } = chain.end {
                                d.adma_next = Some(next);
                            }
                        }
                    }
                }
            }
            _ => {}
        }
    }
}
