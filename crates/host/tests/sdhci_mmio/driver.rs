//! A small SDHCI host driver over the register interface, written the way Linux's
//! `drivers/mmc/host/sdhci.c` programs a controller: probe (version, capabilities, reset
//! all, default interrupts), `sdhci_set_clock` / `sdhci_set_power` / `sdhci_set_ios`,
//! `sdhci_send_command` (argument, transfer mode, command), its interrupt handling
//! (status read, write-1-to-clear, command then data interrupts), ADMA2 tables, SDMA
//! boundary restarts, PIO through the buffer port, error resets, and
//! `sdhci_execute_tuning`. Time is card time: waiting for an interrupt is running the
//! model to its next event. It implements `MmcHostOps`, so the MMC core's own bring-up
//! (`mmc_init_card`) runs on it.

use emmc_card::model::BusTiming;
use emmc_card::timing::Nanos;
use emmc_host::mmc::MmcHostOps;
use emmc_host::sdhci::mmio::layout::*;
use emmc_host::sdhci::{
    adma2_attr, error_int, normal_int, CommandOutcome, DataDirection, DmaSegment, IntStatus,
    MmcCommand, MmcIos, MmcRequest, PowerMode, ResponseType, SdhciCompletion, SdhciError,
    SdhciMmio, TuningError, MAX_TUNING_LOOP,
};

use super::guest::GuestMem;

pub const MEM_BASE: u64 = 0x4000_0000;
pub const MEM_SIZE: usize = 8 << 20;
/// Where the driver keeps its ADMA2 table.
pub const TABLE: u64 = MEM_BASE + 0x1000;
/// The driver's bounce buffer for a transfer's data.
pub const DATA: u64 = MEM_BASE + 0x10_0000;

/// Linux's 32-bit interrupt mask: normal status in [15:0], error status in [31:16].
pub const fn int(normal: u16) -> u32 {
    normal as u32
}
pub const fn err(error: u16) -> u32 {
    (error as u32) << 16
}
pub const INT_CMD_MASK: u32 = int(normal_int::CMD_COMPLETE)
    | err(error_int::CMD_TIMEOUT
        | error_int::CMD_CRC
        | error_int::CMD_END_BIT
        | error_int::CMD_INDEX);
pub const INT_DATA_MASK: u32 = int(normal_int::TRANSFER_COMPLETE
    | normal_int::DMA_INT
    | normal_int::BUF_READ_READY
    | normal_int::BUF_WRITE_READY)
    | err(error_int::DATA_TIMEOUT
        | error_int::DATA_CRC
        | error_int::DATA_END_BIT
        | error_int::ADMA_ERR);
pub const INT_AUTO_CMD: u32 = err(error_int::AUTO_CMD_ERR);
/// `sdhci_set_default_irqs`.
pub const DEFAULT_IER: u32 = err(error_int::CURRENT_LIMIT
    | error_int::DATA_END_BIT
    | error_int::DATA_CRC
    | error_int::DATA_TIMEOUT
    | error_int::CMD_INDEX
    | error_int::CMD_END_BIT
    | error_int::CMD_CRC
    | error_int::CMD_TIMEOUT)
    | int(normal_int::TRANSFER_COMPLETE | normal_int::CMD_COMPLETE);

/// How the driver moves data.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Xfer {
    Adma32,
    Adma64,
    Sdma,
    Pio,
}

pub struct Driver {
    pub mmio: SdhciMmio,
    pub mem: GuestMem,
    pub now: Nanos,
    pub xfer: Xfer,
    /// Use Auto CMD23 for requests with a CMD23 (Linux: v3 with ADMA or PIO).
    pub auto_cmd23: bool,
    /// Use Auto CMD12 for open-ended multi-block requests (a Linux quirk).
    pub auto_cmd12: bool,
    /// SDMA Buffer Boundary code (Linux: 7, 512 KiB).
    pub sdma_boundary: u16,
    /// Timeout Control value for data and busy commands (Linux computes one; 0xE here).
    pub timeout_count: u8,
    /// Set the Int attribute on every ADMA2 data descriptor.
    pub adma_int: bool,
    pub ier: u32,
    pub version: u16,
    pub caps: u32,
    pub caps1: u32,
    pub max_clk: u64,
    pub timeout_clk_khz: u64,
    ios: MmcIos,
    /// Every status the interrupt handler saw, OR'd.
    pub seen: u32,
    /// DMA Interrupts the handler took.
    pub dma_ints: u32,
    /// Buffer Read/Write Ready interrupts the handler took.
    pub pio_ints: u32,
    /// Offset of a transfer's data in the bounce buffer (to put SDMA chunks off a
    /// boundary).
    pub data_off: u64,
    /// When the last data command was written to the Command register.
    pub issued_at: Nanos,
}

impl Driver {
    /// Probe: `sdhci_setup_host` and `sdhci_init`.
    pub fn probe(mmio: SdhciMmio, xfer: Xfer) -> Driver {
        let now = mmio.now();
        let mut d = Driver {
            mmio,
            mem: GuestMem::new(MEM_BASE, MEM_SIZE),
            now,
            xfer,
            auto_cmd23: xfer != Xfer::Sdma,
            auto_cmd12: false,
            sdma_boundary: 7,
            timeout_count: 0xE,
            adma_int: false,
            ier: 0,
            version: 0,
            caps: 0,
            caps1: 0,
            max_clk: 0,
            timeout_clk_khz: 0,
            ios: MmcIos {
                clock: 0,
                bus_width: 1,
                timing: BusTiming::Legacy,
                power_mode: PowerMode::Off,
            },
            seen: 0,
            dma_ints: 0,
            pio_ints: 0,
            data_off: 0,
            issued_at: 0,
        };
        d.version = d.readw(SDHCI_HOST_VERSION);
        d.reset(SDHCI_RESET_ALL);
        d.caps = d.readl(SDHCI_CAPABILITIES);
        d.caps1 = d.readl(SDHCI_CAPABILITIES_1);
        d.max_clk = u64::from((d.caps & SDHCI_CLOCK_V3_BASE_MASK) >> 8) * 1_000_000;
        let t = u64::from(d.caps & SDHCI_TIMEOUT_CLK_MASK);
        d.timeout_clk_khz = if d.caps & SDHCI_TIMEOUT_CLK_UNIT != 0 {
            t * 1000
        } else {
            t
        };
        d.set_default_irqs();
        d
    }

    /// Where a transfer's data sits in guest memory.
    pub fn data(&self) -> u64 {
        DATA + self.data_off
    }

    // ---- register access ------------------------------------------------------------------

    pub fn read_bytes(&mut self, off: u64, buf: &mut [u8]) {
        self.mmio.read(self.now, off, buf, &self.mem);
    }
    pub fn write_bytes(&mut self, off: u64, buf: &[u8]) {
        self.mmio.write(self.now, off, buf, &self.mem);
    }
    pub fn readl(&mut self, off: u64) -> u32 {
        let mut b = [0; 4];
        self.read_bytes(off, &mut b);
        u32::from_le_bytes(b)
    }
    pub fn readw(&mut self, off: u64) -> u16 {
        let mut b = [0; 2];
        self.read_bytes(off, &mut b);
        u16::from_le_bytes(b)
    }
    pub fn readb(&mut self, off: u64) -> u8 {
        let mut b = [0; 1];
        self.read_bytes(off, &mut b);
        b[0]
    }
    pub fn writel(&mut self, v: u32, off: u64) {
        self.write_bytes(off, &v.to_le_bytes());
    }
    pub fn writew(&mut self, v: u16, off: u64) {
        self.write_bytes(off, &v.to_le_bytes());
    }
    pub fn writeb(&mut self, v: u8, off: u64) {
        self.write_bytes(off, &[v]);
    }

    /// Let card time pass to `t`.
    pub fn idle_to(&mut self, t: Nanos) {
        self.now = self.now.max(t);
        self.mmio.advance(self.now, &self.mem);
    }

    /// Run the model to its next event; `false` when nothing will happen by itself.
    pub fn step(&mut self) -> bool {
        match self.mmio.next_event() {
            Some(t) => {
                self.idle_to(t.max(self.now));
                true
            }
            None => false,
        }
    }

    /// Wait until a status bit of `mask` is set; returns the status (not acknowledged),
    /// or what there is when nothing more will happen.
    pub fn wait(&mut self, mask: u32) -> u32 {
        for _ in 0..1_000_000 {
            let st = self.readl(SDHCI_INT_STATUS);
            if st & mask != 0 || !self.step() {
                self.seen |= st;
                return st;
            }
        }
        panic!("interrupt {mask:#x} never came");
    }

    /// Acknowledge (write 1 to clear).
    pub fn ack(&mut self, bits: u32) {
        if bits != 0 {
            self.writel(bits, SDHCI_INT_STATUS);
        }
    }

    /// `sdhci_reset`: write the bits, poll until they clear.
    pub fn reset(&mut self, mask: u8) {
        self.writeb(mask, SDHCI_SOFTWARE_RESET);
        for _ in 0..100 {
            if self.readb(SDHCI_SOFTWARE_RESET) & mask == 0 {
                return;
            }
            let t = self.now + 10_000;
            self.idle_to(t);
        }
        panic!("reset {mask:#x} never completed");
    }

    pub fn set_ier(&mut self, ier: u32) {
        self.writel(ier, SDHCI_INT_ENABLE);
        self.writel(ier, SDHCI_SIGNAL_ENABLE);
    }

    fn set_default_irqs(&mut self) {
        self.ier = DEFAULT_IER;
        self.set_ier(self.ier);
    }

    /// `sdhci_set_transfer_irqs`.
    fn set_transfer_irqs(&mut self, dma: bool) {
        let pio = int(normal_int::BUF_READ_READY | normal_int::BUF_WRITE_READY);
        let dmas = int(normal_int::DMA_INT) | err(error_int::ADMA_ERR);
        self.ier = if dma {
            (self.ier & !pio) | dmas
        } else {
            (self.ier & !dmas) | pio
        };
        if self.auto_cmd23 || self.auto_cmd12 {
            self.ier |= INT_AUTO_CMD;
        }
        self.set_ier(self.ier);
    }

    // ---- bus setup ------------------------------------------------------------------------

    /// `sdhci_set_clock`.
    pub fn set_clock(&mut self, hz: u64) {
        let clk = self.readw(SDHCI_CLOCK_CONTROL);
        self.writew(clk & !SDHCI_CLOCK_CARD_EN, SDHCI_CLOCK_CONTROL);
        if hz == 0 {
            self.writew(0, SDHCI_CLOCK_CONTROL);
            return;
        }
        let div = if self.max_clk <= hz {
            1
        } else {
            let mut div = 2;
            while div < SDHCI_MAX_DIV_SPEC_300 && self.max_clk / div > hz {
                div += 2;
            }
            div
        };
        let mut clk = clock_with_divider((div / 2) as u16) | SDHCI_CLOCK_INT_EN;
        self.writew(clk, SDHCI_CLOCK_CONTROL);
        assert_ne!(
            self.readw(SDHCI_CLOCK_CONTROL) & SDHCI_CLOCK_INT_STABLE,
            0,
            "internal clock stable"
        );
        clk |= SDHCI_CLOCK_CARD_EN;
        self.writew(clk, SDHCI_CLOCK_CONTROL);
    }

    /// `sdhci_set_power_noreg` at 3.3 V (called only when the power changes).
    pub fn set_power(&mut self, on: bool) {
        self.writeb(0, SDHCI_POWER_CONTROL);
        if on {
            self.writeb(SDHCI_POWER_330 | SDHCI_POWER_ON, SDHCI_POWER_CONTROL);
        }
    }

    /// `sdhci_set_ios`.
    pub fn apply_ios(&mut self, ios: MmcIos) {
        if ios.power_mode == PowerMode::Off {
            self.writel(0, SDHCI_SIGNAL_ENABLE);
            self.reset(SDHCI_RESET_ALL);
            self.set_default_irqs();
        }
        if ios.clock != self.ios.clock || ios.clock == 0 {
            self.set_clock(ios.clock);
        }
        if (ios.power_mode == PowerMode::Off) != (self.ios.power_mode == PowerMode::Off) {
            self.set_power(ios.power_mode != PowerMode::Off);
        }
        let mut ctrl = self.readb(SDHCI_HOST_CONTROL);
        ctrl &= !(SDHCI_CTRL_4BITBUS | SDHCI_CTRL_8BITBUS);
        match ios.bus_width {
            8 => ctrl |= SDHCI_CTRL_8BITBUS,
            4 => ctrl |= SDHCI_CTRL_4BITBUS,
            _ => {}
        }
        if ios.timing == BusTiming::Legacy {
            ctrl &= !SDHCI_CTRL_HISPD;
        } else {
            ctrl |= SDHCI_CTRL_HISPD;
        }
        // SD Clock Enable off around the High Speed Enable change.
        let clk = self.readw(SDHCI_CLOCK_CONTROL);
        self.writew(clk & !SDHCI_CLOCK_CARD_EN, SDHCI_CLOCK_CONTROL);
        self.writeb(ctrl, SDHCI_HOST_CONTROL);
        let mut ctrl2 = self.readw(SDHCI_HOST_CONTROL2) & !SDHCI_CTRL_UHS_MASK;
        match ios.timing {
            BusTiming::Hs200 => ctrl2 |= SDHCI_CTRL_UHS_SDR104 | SDHCI_CTRL_VDD_180,
            BusTiming::Ddr52 => ctrl2 |= SDHCI_CTRL_UHS_DDR50,
            _ => {}
        }
        self.writew(ctrl2, SDHCI_HOST_CONTROL2);
        self.ios = ios;
        self.set_clock(ios.clock);
    }

    // ---- commands -------------------------------------------------------------------------

    /// The Command register flags Linux uses for a response type.
    pub fn flags(resp: ResponseType, data: bool) -> u16 {
        let mut f = match resp {
            ResponseType::None => SDHCI_CMD_RESP_NONE,
            ResponseType::R2 => SDHCI_CMD_RESP_LONG | SDHCI_CMD_CRC,
            ResponseType::R1b => SDHCI_CMD_RESP_SHORT_BUSY | SDHCI_CMD_CRC | SDHCI_CMD_INDEX,
            ResponseType::R1 | ResponseType::R5 => {
                SDHCI_CMD_RESP_SHORT | SDHCI_CMD_CRC | SDHCI_CMD_INDEX
            }
            ResponseType::R3 | ResponseType::R4 => SDHCI_CMD_RESP_SHORT,
        };
        if data {
            f |= SDHCI_CMD_DATA;
        }
        f
    }

    /// Wait (as `sdhci_send_command_retry`) until the inhibits in `mask` clear.
    fn wait_inhibit(&mut self, mask: u32) {
        for _ in 0..100_000 {
            if self.readl(SDHCI_PRESENT_STATE) & mask == 0 {
                return;
            }
            if !self.step() {
                let t = self.now + 1_000_000;
                self.idle_to(t);
            }
        }
        panic!("controller never released inhibit bits {mask:#x}");
    }

    /// `sdhci_read_rsp_136` and the short case.
    pub fn response(&mut self, resp: ResponseType) -> [u32; 4] {
        match resp {
            ResponseType::None => [0; 4],
            ResponseType::R2 => {
                let mut r = [0u32; 4];
                for (i, w) in r.iter_mut().enumerate() {
                    *w = self.readl(SDHCI_RESPONSE + (3 - i as u64) * 4);
                }
                for i in 0..4 {
                    r[i] <<= 8;
                    if i != 3 {
                        r[i] |= r[i + 1] >> 24;
                    }
                }
                r
            }
            _ => [self.readl(SDHCI_RESPONSE), 0, 0, 0],
        }
    }

    /// A command without data: argument, transfer mode (its Auto CMD bits cleared),
    /// command; then its interrupt (and Transfer Complete after an R1b busy). Returns the
    /// outcome with the status seen.
    pub fn command(&mut self, cmd: &MmcCommand, out_status: &mut IntStatus) -> CommandOutcome {
        let mut mask = SDHCI_CMD_INHIBIT;
        if cmd.busy {
            mask |= SDHCI_DATA_INHIBIT;
        }
        self.wait_inhibit(mask);
        self.writeb(self.timeout_count, SDHCI_TIMEOUT_CONTROL);
        self.writel(cmd.arg, SDHCI_ARGUMENT);
        let mode = self.readw(SDHCI_TRANSFER_MODE);
        self.writew(
            mode & !(SDHCI_TRNS_AUTO_CMD12 | SDHCI_TRNS_AUTO_CMD23),
            SDHCI_TRANSFER_MODE,
        );
        self.writew(
            sdhci_make_cmd(cmd.opcode, Self::flags(cmd.resp_type, false)),
            SDHCI_COMMAND,
        );
        let mut o = CommandOutcome {
            opcode: cmd.opcode,
            issued: true,
            auto: false,
            resp: [0; 4],
            error: None,
        };
        let st = self.wait(INT_CMD_MASK);
        self.ack(st & INT_CMD_MASK);
        note(out_status, st);
        if let Some(e) = cmd_error(st) {
            o.error = Some(e);
            self.reset(SDHCI_RESET_CMD);
            self.reset(SDHCI_RESET_DATA);
            return o;
        }
        o.resp = self.response(cmd.resp_type);
        if cmd.busy {
            let st = self.wait(int(normal_int::TRANSFER_COMPLETE) | err(error_int::DATA_TIMEOUT));
            self.ack(st & INT_DATA_MASK);
            note(out_status, st);
            if st & err(error_int::DATA_TIMEOUT) != 0 {
                o.error = Some(SdhciError::CmdTimeout);
                self.reset(SDHCI_RESET_CMD);
                self.reset(SDHCI_RESET_DATA);
            }
        }
        o
    }

    /// Send one command without data; its response or the error.
    pub fn send(&mut self, opcode: u8, arg: u32) -> Result<[u32; 4], SdhciError> {
        let cmd = MmcCommand::for_opcode(opcode, arg);
        let mut st = IntStatus::default();
        let o = self.command(&cmd, &mut st);
        o.error.map_or(Ok(o.resp), Err)
    }

    /// Lay the transfer's data out for the DMA: the table or the SDMA address.
    fn prepare_dma(&mut self, len: usize) {
        let mut ctrl = self.readb(SDHCI_HOST_CONTROL) & !SDHCI_CTRL_DMA_MASK;
        match self.xfer {
            Xfer::Adma32 | Xfer::Adma64 => {
                let wide = self.xfer == Xfer::Adma64;
                ctrl |= if wide {
                    SDHCI_CTRL_ADMA64
                } else {
                    SDHCI_CTRL_ADMA32
                };
                let mut descs = Vec::new();
                let mut at = 0usize;
                while at < len {
                    let n = (len - at).min(65_536);
                    let mut attr = adma2_attr::TRAN_VALID;
                    if self.adma_int {
                        attr |= adma2_attr::INT;
                    }
                    descs.push((attr, n, self.data() + at as u64));
                    at += n;
                }
                descs.push((adma2_attr::NOP_END_VALID, 0, 0));
                write_table(&self.mem, TABLE, wide, &descs);
                self.writel(TABLE as u32, SDHCI_ADMA_ADDRESS);
                if wide {
                    self.writel((TABLE >> 32) as u32, SDHCI_ADMA_ADDRESS_HI);
                }
            }
            Xfer::Sdma => {
                ctrl |= SDHCI_CTRL_SDMA;
                self.writel(self.data() as u32, SDHCI_DMA_ADDRESS);
            }
            Xfer::Pio => {}
        }
        self.writeb(ctrl, SDHCI_HOST_CONTROL);
        self.set_transfer_irqs(self.xfer != Xfer::Pio);
    }

    /// `sdhci_transfer_pio`: blocks while the buffer allows.
    fn transfer_pio(&mut self, read: bool, blksz: usize, done: &mut usize, len: usize) {
        let mask = if read {
            SDHCI_DATA_AVAILABLE
        } else {
            SDHCI_SPACE_AVAILABLE
        };
        while *done < len && self.readl(SDHCI_PRESENT_STATE) & mask != 0 {
            let at = self.data() + *done as u64;
            if read {
                let mut block = vec![0u8; blksz];
                for chunk in block.chunks_mut(4) {
                    let w = self.readl(SDHCI_BUFFER).to_le_bytes();
                    chunk.copy_from_slice(&w[..chunk.len()]);
                }
                self.mem.put(at, &block);
            } else {
                let block = self.mem.get(at, blksz);
                for chunk in block.chunks(4) {
                    let mut w = [0u8; 4];
                    w[..chunk.len()].copy_from_slice(chunk);
                    self.writel(u32::from_le_bytes(w), SDHCI_BUFFER);
                }
            }
            *done += blksz;
        }
    }

    /// `sdhci_request` to its end: a whole MMC request through the registers.
    pub fn request<S: DmaSegment>(&mut self, mrq: MmcRequest<'_, S>) -> SdhciCompletion {
        let MmcRequest {
            sbc,
            cmd,
            mut data,
            stop,
        } = mrq;
        let pending = |opcode| CommandOutcome {
            opcode,
            issued: false,
            auto: false,
            resp: [0; 4],
            error: None,
        };
        let mut out = SdhciCompletion {
            sbc: sbc.map(|c| pending(c.opcode)),
            cmd: pending(cmd.opcode),
            stop: stop.map(|c| pending(c.opcode)),
            data_error: None,
            bytes_xfered: 0,
            int_status: IntStatus::default(),
            auto_cmd_err: 0,
            adma_err: 0,
            start_ns: self.now,
            end_ns: self.now,
            busy_pending: false,
        };
        let multi = data
            .as_ref()
            .is_some_and(|d| d.blocks > 1 || matches!(cmd.opcode, 18 | 25));
        let acmd23 = sbc.is_some() && self.auto_cmd23 && multi && self.xfer != Xfer::Sdma;
        let acmd12 = sbc.is_none() && self.auto_cmd12 && multi;
        if let Some(s) = sbc.filter(|_| !acmd23) {
            let o = self.command(&s, &mut out.int_status);
            out.sbc = Some(o);
            if o.error.is_some() {
                out.end_ns = self.now;
                return out;
            }
        }
        let Some(d) = data.as_mut() else {
            out.cmd = self.command(&cmd, &mut out.int_status);
            out.end_ns = self.now;
            return out;
        };
        let blksz = d.blksz as usize;
        let len = blksz * d.blocks as usize;
        let read = d.direction == DataDirection::Read;
        if !read {
            let mut bytes = vec![0u8; len];
            let mut at = 0;
            for seg in d.sg.iter() {
                let n = seg.len().min(len - at);
                assert!(seg.read_at(0, &mut bytes[at..at + n]));
                at += n;
            }
            self.mem.put(self.data(), &bytes);
        }
        self.wait_inhibit(SDHCI_CMD_INHIBIT | SDHCI_DATA_INHIBIT);
        self.prepare_dma(len);
        self.writew(
            sdhci_make_blksz(self.sdma_boundary, d.blksz as u16),
            SDHCI_BLOCK_SIZE,
        );
        self.writew(d.blocks as u16, SDHCI_BLOCK_COUNT);
        self.writeb(self.timeout_count, SDHCI_TIMEOUT_CONTROL);
        let mut mode = SDHCI_TRNS_BLK_CNT_EN;
        if multi {
            mode |= SDHCI_TRNS_MULTI;
            if acmd12 {
                mode |= SDHCI_TRNS_AUTO_CMD12;
            } else if acmd23 {
                mode |= SDHCI_TRNS_AUTO_CMD23;
                self.writel(sbc.expect("acmd23 has an sbc").arg, SDHCI_ARGUMENT2);
            }
        }
        if read {
            mode |= SDHCI_TRNS_READ;
        }
        if self.xfer != Xfer::Pio {
            mode |= SDHCI_TRNS_DMA;
        }
        self.writel(cmd.arg, SDHCI_ARGUMENT);
        self.writew(mode, SDHCI_TRANSFER_MODE);
        self.issued_at = self.now;
        self.writew(
            sdhci_make_cmd(cmd.opcode, Self::flags(cmd.resp_type, true)),
            SDHCI_COMMAND,
        );
        out.cmd.issued = true;
        if let Some(s) = out.sbc.as_mut().filter(|_| acmd23) {
            s.issued = true;
            s.auto = true;
        }
        // The command's interrupt (or the Auto CMD23's error).
        let st = self.wait(INT_CMD_MASK | INT_AUTO_CMD);
        self.ack(st & (INT_CMD_MASK | INT_AUTO_CMD));
        note(&mut out.int_status, st);
        if st & INT_AUTO_CMD != 0 && st & int(normal_int::CMD_COMPLETE) == 0 {
            out.auto_cmd_err = self.readw(SDHCI_AUTO_CMD_STATUS);
            if let Some(s) = out.sbc.as_mut() {
                s.error = Some(auto_cmd_error(out.auto_cmd_err));
            }
            out.cmd.issued = false;
            self.reset(SDHCI_RESET_CMD);
            self.reset(SDHCI_RESET_DATA);
            out.end_ns = self.now;
            return out;
        }
        if let Some(e) = cmd_error(st) {
            out.cmd.error = Some(e);
            self.reset(SDHCI_RESET_CMD);
            self.reset(SDHCI_RESET_DATA);
            if e == SdhciError::CmdCrc {
                out.data_error = Some(SdhciError::DataCrc);
                self.send_stop(stop, &mut out);
            }
            out.end_ns = self.now;
            return out;
        }
        out.cmd.resp = self.response(cmd.resp_type);
        // The data interrupts.
        let mut done = 0usize;
        let mut xfered = 0u64;
        loop {
            let st = self.wait(INT_DATA_MASK | INT_AUTO_CMD);
            self.ack(st & (INT_DATA_MASK | INT_AUTO_CMD));
            note(&mut out.int_status, st);
            if let Some(e) = data_error(st) {
                let e = match e {
                    SdhciError::Adma(_) => {
                        out.adma_err = self.readb(SDHCI_ADMA_ERROR);
                        SdhciError::Adma(out.adma_err)
                    }
                    e => e,
                };
                out.data_error = Some(e);
                break;
            }
            if st & INT_AUTO_CMD != 0 {
                out.auto_cmd_err = self.readw(SDHCI_AUTO_CMD_STATUS);
                out.data_error = Some(match auto_cmd_error(out.auto_cmd_err) {
                    SdhciError::CmdTimeout => SdhciError::DataTimeout,
                    _ => SdhciError::DataCrc,
                });
                break;
            }
            if st & int(normal_int::BUF_READ_READY | normal_int::BUF_WRITE_READY) != 0 {
                self.pio_ints += 1;
                self.transfer_pio(read, blksz, &mut done, len);
            }
            if st & int(normal_int::DMA_INT) != 0 {
                self.dma_ints += 1;
                if self.xfer == Xfer::Sdma {
                    // Linux: the next boundary after what has moved.
                    let boundary = sdma_boundary_bytes(self.sdma_boundary);
                    let next = ((self.data() + xfered) & !(boundary - 1)) + boundary;
                    xfered = next - self.data();
                    self.writel(next as u32, SDHCI_DMA_ADDRESS);
                }
            }
            if st & int(normal_int::TRANSFER_COMPLETE) != 0 {
                break;
            }
            if st & (INT_DATA_MASK | INT_AUTO_CMD) == 0 {
                panic!("request CMD{} stalled: status {st:#x}", cmd.opcode);
            }
        }
        if out.data_error.is_some() {
            // __sdhci_finish_data_common: reset both lines after an error.
            self.reset(SDHCI_RESET_CMD);
            self.reset(SDHCI_RESET_DATA);
        } else {
            out.bytes_xfered = len as u64;
            if acmd12 {
                out.stop = Some(CommandOutcome {
                    opcode: 12,
                    issued: true,
                    auto: true,
                    resp: [self.readl(SDHCI_RESPONSE + 12), 0, 0, 0],
                    error: None,
                });
            }
            if read {
                let bytes = self.mem.get(self.data(), len);
                let mut at = 0;
                for seg in d.sg.iter_mut() {
                    let n = seg.len().min(len - at);
                    assert!(seg.write_at(0, &bytes[at..at + n]));
                    at += n;
                }
            }
        }
        if out.data_error.is_some() || (sbc.is_none() && !acmd12) {
            self.send_stop(stop, &mut out);
        }
        out.end_ns = self.now;
        out
    }

    fn send_stop(&mut self, stop: Option<MmcCommand>, out: &mut SdhciCompletion) {
        if let Some(s) = stop {
            let o = self.command(&s, &mut out.int_status);
            out.stop = Some(o);
        }
    }

    /// `sdhci_execute_tuning` for HS200.
    pub fn tune(&mut self) -> Result<u32, TuningError> {
        let mut ctrl2 = self.readw(SDHCI_HOST_CONTROL2);
        ctrl2 |= SDHCI_CTRL_EXEC_TUNING;
        self.writew(ctrl2, SDHCI_HOST_CONTROL2);
        self.set_ier(int(normal_int::BUF_READ_READY));
        let blksz: u16 = if self.ios.bus_width == 8 { 128 } else { 64 };
        let mut result = Err(TuningError::Failed {
            tries: MAX_TUNING_LOOP,
        });
        for tries in 1..=MAX_TUNING_LOOP {
            self.writew(sdhci_make_blksz(7, blksz), SDHCI_BLOCK_SIZE);
            self.writew(SDHCI_TRNS_READ, SDHCI_TRANSFER_MODE);
            self.wait_inhibit(SDHCI_CMD_INHIBIT | SDHCI_DATA_INHIBIT);
            self.writel(0, SDHCI_ARGUMENT);
            self.writew(
                sdhci_make_cmd(21, Self::flags(ResponseType::R1, true)),
                SDHCI_COMMAND,
            );
            // Linux waits 50 ms for Buffer Read Ready.
            let deadline = self.now + 50_000_000;
            let mut got = false;
            loop {
                let st = self.readl(SDHCI_INT_STATUS);
                if st & int(normal_int::BUF_READ_READY) != 0 {
                    self.ack(int(normal_int::BUF_READ_READY));
                    got = true;
                    break;
                }
                match self.mmio.next_event() {
                    Some(t) if t <= deadline => self.idle_to(t),
                    _ => break,
                }
            }
            if !got {
                self.idle_to(deadline);
                result = Err(TuningError::NoBufferReadReady { tries });
                self.reset(SDHCI_RESET_CMD);
                self.reset(SDHCI_RESET_DATA);
                break;
            }
            let ctrl2 = self.readw(SDHCI_HOST_CONTROL2);
            if ctrl2 & SDHCI_CTRL_EXEC_TUNING == 0 {
                if ctrl2 & SDHCI_CTRL_TUNED_CLK != 0 {
                    result = Ok(tries);
                }
                break;
            }
        }
        if result.is_err() {
            let ctrl2 = self.readw(SDHCI_HOST_CONTROL2);
            self.writew(
                ctrl2 & !(SDHCI_CTRL_EXEC_TUNING | SDHCI_CTRL_TUNED_CLK),
                SDHCI_HOST_CONTROL2,
            );
        }
        self.set_ier(self.ier);
        result
    }
}

/// What the handler keeps of a status read: everything, split as the registers are.
fn note(s: &mut IntStatus, st: u32) {
    s.normal |= st as u16;
    s.error |= (st >> 16) as u16;
}

/// A command error from a status (Linux: -ETIMEDOUT or -EILSEQ, named by the bit).
pub fn cmd_error(st: u32) -> Option<SdhciError> {
    let e = (st >> 16) as u16;
    if e & error_int::CMD_TIMEOUT != 0 {
        Some(SdhciError::CmdTimeout)
    } else if e & error_int::CMD_INDEX != 0 {
        Some(SdhciError::CmdIndex)
    } else if e & error_int::CMD_CRC != 0 {
        Some(SdhciError::CmdCrc)
    } else if e & error_int::CMD_END_BIT != 0 {
        Some(SdhciError::CmdEndBit)
    } else {
        None
    }
}

fn data_error(st: u32) -> Option<SdhciError> {
    let e = (st >> 16) as u16;
    if e & error_int::DATA_TIMEOUT != 0 {
        Some(SdhciError::DataTimeout)
    } else if e & (error_int::DATA_CRC | error_int::DATA_END_BIT) != 0 {
        Some(SdhciError::DataCrc)
    } else if e & error_int::ADMA_ERR != 0 {
        Some(SdhciError::Adma(0))
    } else {
        None
    }
}

fn auto_cmd_error(status: u16) -> SdhciError {
    if status & emmc_host::sdhci::auto_cmd_err::TIMEOUT != 0 {
        SdhciError::CmdTimeout
    } else {
        SdhciError::CmdCrc
    }
}

/// Write ADMA2 descriptors (attribute, length, address) at `at`.
pub fn write_table(mem: &GuestMem, at: u64, wide: bool, descs: &[(u16, usize, u64)]) {
    let size = if wide { 12 } else { 8 };
    for (i, &(attr, len, addr)) in descs.iter().enumerate() {
        let mut d = [0u8; 12];
        d[0..2].copy_from_slice(&attr.to_le_bytes());
        d[2..4].copy_from_slice(&((len % 65_536) as u16).to_le_bytes());
        if wide {
            d[4..12].copy_from_slice(&addr.to_le_bytes());
        } else {
            d[4..8].copy_from_slice(&(addr as u32).to_le_bytes());
        }
        mem.put(at + (i * size) as u64, &d[..size]);
    }
}

impl MmcHostOps for Driver {
    fn now(&self) -> Nanos {
        self.now
    }

    fn idle_until(&mut self, t: Nanos) {
        self.idle_to(t);
    }

    fn request<S: DmaSegment>(&mut self, mrq: MmcRequest<'_, S>) -> SdhciCompletion {
        Driver::request(self, mrq)
    }

    fn start_request<S: DmaSegment>(&mut self, mrq: MmcRequest<'_, S>) -> SdhciCompletion {
        // The controller waits for busy itself (Transfer Complete).
        Driver::request(self, mrq)
    }

    /// `card_busy`: DAT0 level, polled.
    fn wait_busy_until(&mut self, deadline: Option<Nanos>) -> bool {
        loop {
            if self.readl(SDHCI_PRESENT_STATE) & SDHCI_DATA_0_LVL_MASK != 0 {
                return true;
            }
            let Some(t) = self.mmio.next_event() else {
                return true;
            };
            if deadline.is_some_and(|d| t > d) {
                self.idle_to(deadline.expect("checked"));
                return false;
            }
            self.idle_to(t);
        }
    }

    fn busy_until(&self) -> Option<Nanos> {
        self.mmio.card().busy_until().filter(|&t| t > self.now)
    }

    fn set_ios(&mut self, ios: MmcIos) {
        self.apply_ios(ios);
    }

    fn ios(&self) -> MmcIos {
        self.ios
    }

    fn execute_tuning(&mut self) -> Result<u32, TuningError> {
        if self.ios.timing != BusTiming::Hs200 {
            return Ok(0);
        }
        self.tune()
    }

    fn max_busy_timeout_ms(&self) -> u32 {
        ((1u64 << 27) / self.timeout_clk_khz.max(1)) as u32
    }
}
