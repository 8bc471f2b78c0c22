//! A small SDHCI register driver over the `vfio_user` client, programming BAR0 the way
//! Linux's `sdhci.c` does (reset, clock, power, argument / transfer mode / command, W1C
//! status, ADMA2 tables, SDMA boundary restarts, PIO through the buffer port) and taking
//! its interrupts the way QEMU delivers them: the INTx eventfd fires, the handler reads
//! and acknowledges the status, then the client unmasks INTx (VFIO auto-masked it).
//!
//! Guest memory is one memfd: its first 8 MiB mapped at [`LOW`], the next 4 MiB at
//! [`HIGH`] (above 4 GiB, for 64-bit descriptors), the last 4 MiB never mapped.

use std::fs::File;
use std::os::fd::{AsRawFd, FromRawFd};
use std::os::unix::fs::FileExt;
use std::time::{Duration, Instant};

use vfio_bindings::bindings::vfio::{
    VFIO_IRQ_SET_ACTION_TRIGGER, VFIO_IRQ_SET_ACTION_UNMASK, VFIO_IRQ_SET_DATA_EVENTFD,
    VFIO_IRQ_SET_DATA_NONE,
};
use vmm_sys_util::epoll::{ControlOperation, Epoll, EpollEvent, EventSet};
use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};

use emmc_host::sdhci::mmio::layout::*;
use emmc_host::sdhci::{adma2_attr, error_int, normal_int};

use super::Rig;
use crate::pci::config::{COMMAND_MASTER, COMMAND_MEMORY};

pub const BAR0: u32 = 0;
pub const CONFIG: u32 = 7;

/// The memfd behind guest memory.
pub const MEMFD_LEN: u64 = 16 << 20;
/// Guest (bus) address of the memfd's first 8 MiB.
pub const LOW: u64 = 0x4000_0000;
pub const LOW_LEN: u64 = 8 << 20;
/// Guest address of the memfd's next 4 MiB.
pub const HIGH: u64 = 0x1_8000_0000;
pub const HIGH_LEN: u64 = 4 << 20;
/// Where the driver keeps its ADMA2 table and its data, below and above 4 GiB.
pub const TABLE: u64 = LOW + 0x1000;
pub const DATA: u64 = LOW + 0x10_0000;
pub const HIGH_TABLE: u64 = HIGH + 0x1000;
pub const HIGH_DATA: u64 = HIGH + 0x10_0000;

/// The card's relative address.
pub const RCA: u32 = 1 << 16;
/// Linux's CMD1 argument: sector mode, 2.7–3.6 V and 1.7–1.95 V.
pub const OCR_ARG: u32 = 0x40FF_8080;

/// How long any single wait may take before the test fails.
pub const WAIT: Duration = Duration::from_secs(5);

/// Linux's 32-bit view of the interrupt status: normal in [15:0], error in [31:16].
pub const fn int(normal: u16) -> u32 {
    normal as u32
}
pub const fn err(error: u16) -> u32 {
    (error as u32) << 16
}
pub const CMD_ERRORS: u32 = err(error_int::CMD_TIMEOUT
    | error_int::CMD_CRC
    | error_int::CMD_END_BIT
    | error_int::CMD_INDEX);
pub const DATA_ERRORS: u32 = err(error_int::DATA_TIMEOUT
    | error_int::DATA_CRC
    | error_int::DATA_END_BIT
    | error_int::ADMA_ERR
    | error_int::AUTO_CMD_ERR);
pub const ERRORS: u32 = CMD_ERRORS | DATA_ERRORS;
pub const CMD_COMPLETE: u32 = int(normal_int::CMD_COMPLETE);
pub const XFER_COMPLETE: u32 = int(normal_int::TRANSFER_COMPLETE);
pub const DMA_INT: u32 = int(normal_int::DMA_INT);
pub const READ_READY: u32 = int(normal_int::BUF_READ_READY);
pub const WRITE_READY: u32 = int(normal_int::BUF_WRITE_READY);
/// Everything the driver enables and signals.
pub const IER: u32 = CMD_COMPLETE | XFER_COMPLETE | DMA_INT | READ_READY | WRITE_READY | ERRORS;

/// The response a command expects.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Resp {
    None,
    R1,
    R1b,
    R2,
    R3,
}

impl Resp {
    /// The Command register's flags, as Linux sets them.
    fn flags(self) -> u16 {
        match self {
            Resp::None => SDHCI_CMD_RESP_NONE,
            Resp::R1 => SDHCI_CMD_RESP_SHORT | SDHCI_CMD_CRC | SDHCI_CMD_INDEX,
            Resp::R1b => SDHCI_CMD_RESP_SHORT_BUSY | SDHCI_CMD_CRC | SDHCI_CMD_INDEX,
            Resp::R2 => SDHCI_CMD_RESP_LONG | SDHCI_CMD_CRC,
            Resp::R3 => SDHCI_CMD_RESP_SHORT,
        }
    }
}

/// How the data moves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    Pio,
    Sdma,
    Adma32,
    Adma64,
}

/// One data command.
#[derive(Debug, Clone, Copy)]
pub struct Xfer {
    pub opcode: u8,
    pub arg: u32,
    pub blksz: u16,
    pub blocks: u16,
    pub read: bool,
    pub mode: Mode,
    /// Auto-CMD23 with this argument (Argument 2).
    pub acmd23: Option<u32>,
    /// Where the data is in guest memory.
    pub data: u64,
    /// Where the ADMA2 table goes.
    pub table: u64,
    /// The test wrote its own ADMA2 table at `table`: leave it.
    pub own_table: bool,
}

impl Xfer {
    /// A read (CMD17/18) or write (CMD24/25) of `blocks` sectors at `lba`, below 4 GiB.
    pub fn rw(read: bool, lba: u32, blocks: u16, mode: Mode) -> Xfer {
        let opcode = match (read, blocks > 1) {
            (true, false) => 17,
            (true, true) => 18,
            (false, false) => 24,
            (false, true) => 25,
        };
        Xfer {
            opcode,
            arg: lba,
            blksz: 512,
            blocks,
            read,
            mode,
            acmd23: None,
            data: DATA,
            table: TABLE,
            own_table: false,
        }
    }

    pub fn multi(&self) -> bool {
        self.blocks > 1 || matches!(self.opcode, 18 | 25)
    }

    pub fn len(&self) -> usize {
        usize::from(self.blksz) * usize::from(self.blocks)
    }
}

/// What a transfer saw.
#[derive(Debug, Default, Clone, Copy)]
pub struct Done {
    /// Every status bit the handler took, OR'd.
    pub seen: u32,
    pub dma_ints: u32,
    pub pio_ints: u32,
    /// Blocks moved through the Buffer Data Port.
    pub pio_blocks: u32,
}

/// The INTx eventfd, waited on with a time-out.
pub struct Irq {
    pub fd: EventFd,
    epoll: Epoll,
}

impl Irq {
    pub fn new() -> Irq {
        let fd = EventFd::new(EFD_NONBLOCK).unwrap();
        let epoll = Epoll::new().unwrap();
        epoll
            .ctl(
                ControlOperation::Add,
                fd.as_raw_fd(),
                EpollEvent::new(EventSet::IN, 0),
            )
            .unwrap();
        Irq { fd, epoll }
    }

    /// Signals that arrive within `timeout` (0 if none).
    pub fn wait(&self, timeout: Duration) -> u64 {
        let mut ev = [EpollEvent::default()];
        let ms = timeout.as_millis().clamp(1, i32::MAX as u128) as i32;
        match self.epoll.wait(ms, &mut ev) {
            Ok(0) | Err(_) => 0,
            Ok(_) => self.fd.read().unwrap_or(0),
        }
    }
}

/// A memfd of `len` bytes.
pub fn memfd(len: u64) -> File {
    // SAFETY: memfd_create with a NUL-terminated name and no flags; checked before use.
    let fd = unsafe { libc::memfd_create(c"sdhci-guest".as_ptr(), 0) };
    assert!(fd >= 0, "memfd_create: {}", std::io::Error::last_os_error());
    // SAFETY: `fd` is a new descriptor nothing else owns.
    let f = unsafe { File::from_raw_fd(fd) };
    f.set_len(len).unwrap();
    f
}

/// The memfd offset of guest address `addr`.
pub fn file_offset(addr: u64) -> u64 {
    if (LOW..LOW + LOW_LEN).contains(&addr) {
        addr - LOW
    } else if (HIGH..HIGH + HIGH_LEN).contains(&addr) {
        addr - HIGH + LOW_LEN
    } else {
        panic!("{addr:#x} is not guest memory")
    }
}

/// The guest: its driver, its memory, its interrupt line.
pub struct Host {
    pub c: vfio_user::Client,
    pub irq: Irq,
    pub mem: File,
    /// INTx is masked (it fired and the handler has not unmasked yet).
    masked: bool,
    /// INTx signals taken.
    pub signals: u64,
    pub caps: u32,
    pub max_clk: u64,
    /// SDMA Buffer Boundary code (0: 4 KiB, so multi-block transfers cross some).
    pub sdma_boundary: u16,
    pub timeout_count: u8,
}

impl Host {
    /// Connect as QEMU does: map guest memory, enable memory space and bus mastering,
    /// give INTx an eventfd; then probe as `sdhci_setup_host` does.
    pub fn connect(rig: &Rig) -> Host {
        let mut c = vfio_user::Client::new(&rig.path).unwrap();
        let mem = memfd(MEMFD_LEN);
        c.dma_map(0, LOW, LOW_LEN, mem.as_raw_fd()).unwrap();
        c.dma_map(LOW_LEN, HIGH, HIGH_LEN, mem.as_raw_fd()).unwrap();
        c.region_write(CONFIG, 4, &(COMMAND_MEMORY | COMMAND_MASTER).to_le_bytes())
            .unwrap();
        let irq = Irq::new();
        let flags = VFIO_IRQ_SET_DATA_EVENTFD | VFIO_IRQ_SET_ACTION_TRIGGER;
        c.set_irqs(0, flags, 0, 1, &[irq.fd.as_raw_fd()]).unwrap();
        let mut h = Host {
            c,
            irq,
            mem,
            masked: false,
            signals: 0,
            caps: 0,
            max_clk: 0,
            sdma_boundary: 0,
            timeout_count: 0xE,
        };
        assert_eq!(h.readw(SDHCI_HOST_VERSION) & 0xFF, SDHCI_SPEC_300);
        h.reset(SDHCI_RESET_ALL);
        h.caps = h.readl(SDHCI_CAPABILITIES);
        h.max_clk =
            u64::from((h.caps & SDHCI_CLOCK_V3_BASE_MASK) >> SDHCI_CLOCK_V3_BASE_SHIFT) * 1_000_000;
        assert!(h.max_clk > 0, "a base clock: caps {:#x}", h.caps);
        h.set_ier(IER);
        h
    }

    // ---- guest memory ---------------------------------------------------------------

    pub fn put(&self, addr: u64, data: &[u8]) {
        self.mem.write_all_at(data, file_offset(addr)).unwrap();
    }

    pub fn get(&self, addr: u64, len: usize) -> Vec<u8> {
        let mut b = vec![0u8; len];
        self.mem.read_exact_at(&mut b, file_offset(addr)).unwrap();
        b
    }

    /// The whole memfd, mapped or not.
    pub fn snapshot(&self) -> Vec<u8> {
        let mut b = vec![0u8; MEMFD_LEN as usize];
        self.mem.read_exact_at(&mut b, 0).unwrap();
        b
    }

    // ---- BAR0 -------------------------------------------------------------------------

    pub fn read(&mut self, off: u64, buf: &mut [u8]) {
        self.c.region_read(BAR0, off, buf).unwrap();
    }
    pub fn write(&mut self, off: u64, buf: &[u8]) {
        self.c.region_write(BAR0, off, buf).unwrap();
    }
    pub fn readl(&mut self, off: u64) -> u32 {
        let mut b = [0; 4];
        self.read(off, &mut b);
        u32::from_le_bytes(b)
    }
    pub fn readw(&mut self, off: u64) -> u16 {
        let mut b = [0; 2];
        self.read(off, &mut b);
        u16::from_le_bytes(b)
    }
    pub fn readb(&mut self, off: u64) -> u8 {
        let mut b = [0; 1];
        self.read(off, &mut b);
        b[0]
    }
    pub fn writel(&mut self, v: u32, off: u64) {
        self.write(off, &v.to_le_bytes());
    }
    pub fn writew(&mut self, v: u16, off: u64) {
        self.write(off, &v.to_le_bytes());
    }
    pub fn writeb(&mut self, v: u8, off: u64) {
        self.write(off, &[v]);
    }

    pub fn present(&mut self) -> u32 {
        self.readl(SDHCI_PRESENT_STATE)
    }

    // ---- interrupts -------------------------------------------------------------------

    pub fn set_ier(&mut self, ier: u32) {
        self.writel(ier, SDHCI_INT_ENABLE);
        self.writel(ier, SDHCI_SIGNAL_ENABLE);
    }

    /// VFIO_IRQ_SET_ACTION_UNMASK, as QEMU sends at the guest's EOI.
    pub fn unmask(&mut self) {
        let flags = VFIO_IRQ_SET_DATA_NONE | VFIO_IRQ_SET_ACTION_UNMASK;
        self.c.set_irqs(0, flags, 0, 1, &[]).unwrap();
        self.masked = false;
    }

    /// Wait until a status bit of `mask` is set, taking the status only when INTx
    /// fires (as a guest's handler runs only on its line); the status, not acknowledged.
    /// A signal that brings nothing of `mask` is the guest's EOI: unmask and wait on.
    /// Fails after [`WAIT`].
    pub fn wait_int(&mut self, mask: u32) -> u32 {
        let deadline = Instant::now() + WAIT;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                let st = self.readl(SDHCI_INT_STATUS);
                panic!(
                    "no interrupt {mask:#x} within {WAIT:?}: status {st:#x}, present {:#x}, \
                     INTx masked {}",
                    self.present(),
                    self.masked
                );
            }
            if !self.masked {
                let n = self.irq.wait(left);
                if n == 0 {
                    continue;
                }
                self.signals += n;
                self.masked = true;
            }
            let st = self.readl(SDHCI_INT_STATUS);
            if st & mask != 0 {
                return st;
            }
            self.unmask();
        }
    }

    /// Acknowledge (write 1 to clear), then unmask if INTx fired: the guest's EOI.
    pub fn ack(&mut self, bits: u32) {
        if bits != 0 {
            self.writel(bits, SDHCI_INT_STATUS);
        }
        if self.masked {
            self.unmask();
        }
    }

    /// `sdhci_reset`: the bits clear by themselves.
    pub fn reset(&mut self, mask: u8) {
        self.writeb(mask, SDHCI_SOFTWARE_RESET);
        let deadline = Instant::now() + WAIT;
        while self.readb(SDHCI_SOFTWARE_RESET) & mask != 0 {
            assert!(Instant::now() < deadline, "reset {mask:#x} never completed");
        }
    }

    /// After an error: acknowledge everything, reset the CMD and DAT lines.
    pub fn recover(&mut self) {
        self.ack(0xFFFF_FFFF);
        self.reset(SDHCI_RESET_CMD);
        self.reset(SDHCI_RESET_DATA);
    }

    /// Poll Present State until the bits of `mask` clear.
    pub fn wait_present_clear(&mut self, mask: u32) {
        let deadline = Instant::now() + WAIT;
        while self.present() & mask != 0 {
            assert!(Instant::now() < deadline, "inhibit {mask:#x} never cleared");
            std::thread::sleep(Duration::from_micros(200));
        }
    }

    // ---- bus setup --------------------------------------------------------------------

    /// `sdhci_set_clock`: the smallest even divider not above `hz`.
    pub fn set_clock(&mut self, hz: u64) {
        let clk = self.readw(SDHCI_CLOCK_CONTROL);
        self.writew(clk & !SDHCI_CLOCK_CARD_EN, SDHCI_CLOCK_CONTROL);
        let div = if self.max_clk <= hz {
            1
        } else {
            let mut div = 2;
            while div < SDHCI_MAX_DIV_SPEC_300 && self.max_clk / div > hz {
                div += 2;
            }
            div
        };
        let clk = clock_with_divider((div / 2) as u16) | SDHCI_CLOCK_INT_EN;
        self.writew(clk, SDHCI_CLOCK_CONTROL);
        assert_ne!(
            self.readw(SDHCI_CLOCK_CONTROL) & SDHCI_CLOCK_INT_STABLE,
            0,
            "internal clock stable"
        );
        self.writew(clk | SDHCI_CLOCK_CARD_EN, SDHCI_CLOCK_CONTROL);
    }

    /// SD Bus Power at 3.3 V.
    pub fn power_on(&mut self) {
        self.writeb(0, SDHCI_POWER_CONTROL);
        self.writeb(SDHCI_POWER_330 | SDHCI_POWER_ON, SDHCI_POWER_CONTROL);
    }

    /// Host Control: bus width and High Speed Enable, keeping the DMA select.
    pub fn set_bus(&mut self, width: u8, hispd: bool) {
        let mut ctrl = self.readb(SDHCI_HOST_CONTROL);
        ctrl &= !(SDHCI_CTRL_4BITBUS | SDHCI_CTRL_8BITBUS | SDHCI_CTRL_HISPD);
        ctrl |= match width {
            8 => SDHCI_CTRL_8BITBUS,
            4 => SDHCI_CTRL_4BITBUS,
            _ => 0,
        };
        if hispd {
            ctrl |= SDHCI_CTRL_HISPD;
        }
        self.writeb(ctrl, SDHCI_HOST_CONTROL);
    }

    // ---- commands ---------------------------------------------------------------------

    /// `sdhci_read_rsp_136` for R2: the register with its CRC byte 0, most significant
    /// word first, as Linux keeps it.
    pub fn response(&mut self, resp: Resp) -> [u32; 4] {
        match resp {
            Resp::None => [0; 4],
            Resp::R2 => {
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

    /// Write argument, transfer mode and command without waiting.
    pub fn issue(&mut self, opcode: u8, arg: u32, resp: Resp, data: bool, mode: u16) {
        self.writel(arg, SDHCI_ARGUMENT);
        self.writew(mode, SDHCI_TRANSFER_MODE);
        let mut flags = resp.flags();
        if data {
            flags |= SDHCI_CMD_DATA;
        }
        self.writew(sdhci_make_cmd(opcode, flags), SDHCI_COMMAND);
    }

    /// A command without data, to its end (Transfer Complete after an R1b busy): the
    /// response, or the error status (the lines reset, as Linux does).
    pub fn cmd(&mut self, opcode: u8, arg: u32, resp: Resp) -> Result<[u32; 4], u32> {
        let mut inhibit = SDHCI_CMD_INHIBIT;
        if resp == Resp::R1b {
            inhibit |= SDHCI_DATA_INHIBIT;
        }
        self.wait_present_clear(inhibit);
        self.writeb(self.timeout_count, SDHCI_TIMEOUT_CONTROL);
        self.issue(opcode, arg, resp, false, 0);
        let st = self.wait_int(CMD_COMPLETE | CMD_ERRORS);
        if st & CMD_ERRORS != 0 {
            self.recover();
            return Err(st);
        }
        self.ack(CMD_COMPLETE);
        let r = self.response(resp);
        if resp == Resp::R1b {
            let st = self.wait_int(XFER_COMPLETE | DATA_ERRORS);
            if st & DATA_ERRORS != 0 {
                self.recover();
                return Err(st);
            }
            self.ack(XFER_COMPLETE);
        }
        Ok(r)
    }

    /// CMD6 SWITCH (write byte) of EXT_CSD `index` to `value`, R1b.
    pub fn switch(&mut self, index: u8, value: u8) -> Result<u32, u32> {
        let arg = 0x0300_0000 | u32::from(index) << 16 | u32::from(value) << 8;
        self.cmd(6, arg, Resp::R1b).map(|r| r[0])
    }

    /// CMD13: the card status.
    pub fn status(&mut self) -> u32 {
        self.cmd(13, RCA, Resp::R1).expect("CMD13")[0]
    }

    // ---- data -------------------------------------------------------------------------

    /// An ADMA2 table for `len` bytes at `data` (one descriptor per 64 KiB, End on the
    /// last).
    pub fn adma_table(&self, x: &Xfer) {
        let wide = x.mode == Mode::Adma64;
        let mut descs = Vec::new();
        let mut at = 0usize;
        while at < x.len() {
            let n = (x.len() - at).min(65_536);
            descs.push((adma2_attr::TRAN_VALID, n, x.data + at as u64));
            at += n;
        }
        if let Some(last) = descs.last_mut() {
            last.0 |= adma2_attr::END;
        }
        self.put_descriptors(x.table, wide, &descs);
    }

    /// Write ADMA2 descriptors (attribute, length, address) at `at`.
    pub fn put_descriptors(&self, at: u64, wide: bool, descs: &[(u16, usize, u64)]) {
        let size = if wide { 12 } else { 8 };
        for (i, &(attr, len, addr)) in descs.iter().enumerate() {
            let mut d = [0u8; 12];
            d[0..2].copy_from_slice(&attr.to_le_bytes());
            d[2..4].copy_from_slice(&((len % 65_536) as u16).to_le_bytes());
            if wide {
                d[4..12].copy_from_slice(&addr.to_le_bytes());
            } else {
                d[4..8].copy_from_slice(&u32::try_from(addr).unwrap().to_le_bytes());
            }
            self.put(at + (i * size) as u64, &d[..size]);
        }
    }

    /// Program everything of a data command but the Command register: DMA select and
    /// address, block size and count, Argument 2, time-out, argument, transfer mode.
    pub fn setup_data(&mut self, x: &Xfer) {
        self.wait_present_clear(SDHCI_CMD_INHIBIT | SDHCI_DATA_INHIBIT);
        let mut ctrl = self.readb(SDHCI_HOST_CONTROL) & !SDHCI_CTRL_DMA_MASK;
        match x.mode {
            Mode::Pio => {}
            Mode::Sdma => {
                ctrl |= SDHCI_CTRL_SDMA;
                self.writel(u32::try_from(x.data).unwrap(), SDHCI_DMA_ADDRESS);
            }
            Mode::Adma32 | Mode::Adma64 => {
                if !x.own_table {
                    self.adma_table(x);
                }
                ctrl |= if x.mode == Mode::Adma64 {
                    SDHCI_CTRL_ADMA64
                } else {
                    SDHCI_CTRL_ADMA32
                };
                self.writel(x.table as u32, SDHCI_ADMA_ADDRESS);
                self.writel((x.table >> 32) as u32, SDHCI_ADMA_ADDRESS_HI);
            }
        }
        self.writeb(ctrl, SDHCI_HOST_CONTROL);
        self.writew(
            sdhci_make_blksz(self.sdma_boundary, x.blksz),
            SDHCI_BLOCK_SIZE,
        );
        self.writew(x.blocks, SDHCI_BLOCK_COUNT);
        self.writeb(self.timeout_count, SDHCI_TIMEOUT_CONTROL);
        let mut mode = SDHCI_TRNS_BLK_CNT_EN;
        if x.multi() {
            mode |= SDHCI_TRNS_MULTI;
        }
        if let Some(a2) = x.acmd23 {
            mode |= SDHCI_TRNS_AUTO_CMD23;
            self.writel(a2, SDHCI_ARGUMENT2);
        }
        if x.read {
            mode |= SDHCI_TRNS_READ;
        }
        if x.mode != Mode::Pio {
            mode |= SDHCI_TRNS_DMA;
        }
        self.writel(x.arg, SDHCI_ARGUMENT);
        self.writew(mode, SDHCI_TRANSFER_MODE);
    }

    /// A data command to its end, its data taken from / left in guest memory at
    /// `x.data`. `Err` is the status of the error that ended it (after Linux's recovery:
    /// both lines reset).
    pub fn data(&mut self, x: &Xfer) -> Result<Done, u32> {
        self.setup_data(x);
        self.issue_data(x);
        self.finish_data(x)
    }

    /// The Command register of a data command set up by [`Host::setup_data`].
    pub fn issue_data(&mut self, x: &Xfer) {
        self.writew(
            sdhci_make_cmd(x.opcode, Resp::R1.flags() | SDHCI_CMD_DATA),
            SDHCI_COMMAND,
        );
    }

    /// The interrupts of a data command already issued.
    pub fn finish_data(&mut self, x: &Xfer) -> Result<Done, u32> {
        let mut done = Done::default();
        let st = self.wait_int(CMD_COMPLETE | ERRORS);
        done.seen |= st;
        if st & CMD_COMPLETE == 0 {
            self.recover();
            return Err(st);
        }
        self.ack(CMD_COMPLETE);
        let blksz = usize::from(x.blksz);
        let mut moved = 0usize;
        let mut sdma_next = x.data;
        loop {
            let st = self.wait_int(XFER_COMPLETE | DMA_INT | READ_READY | WRITE_READY | ERRORS);
            done.seen |= st;
            self.ack(st & (XFER_COMPLETE | DMA_INT | READ_READY | WRITE_READY));
            if st & ERRORS != 0 {
                self.recover();
                return Err(st);
            }
            if st & (READ_READY | WRITE_READY) != 0 {
                done.pio_ints += 1;
                let before = moved;
                self.pio(x, blksz, &mut moved);
                done.pio_blocks += ((moved - before) / blksz) as u32;
            }
            if st & DMA_INT != 0 {
                done.dma_ints += 1;
                if x.mode == Mode::Sdma {
                    // Linux: on to the next boundary.
                    let boundary = sdma_boundary_bytes(self.sdma_boundary);
                    sdma_next = (sdma_next & !(boundary - 1)) + boundary;
                    self.writel(sdma_next as u32, SDHCI_DMA_ADDRESS);
                }
            }
            if st & XFER_COMPLETE != 0 {
                return Ok(done);
            }
        }
    }

    /// `sdhci_transfer_pio`: whole blocks through the Buffer Data Port, 4 bytes a time,
    /// while Present State says the buffer allows.
    fn pio(&mut self, x: &Xfer, blksz: usize, moved: &mut usize) {
        let ready = if x.read {
            SDHCI_DATA_AVAILABLE
        } else {
            SDHCI_SPACE_AVAILABLE
        };
        while *moved < x.len() && self.present() & ready != 0 {
            let at = x.data + *moved as u64;
            if x.read {
                let mut block = vec![0u8; blksz];
                for chunk in block.chunks_mut(4) {
                    let w = self.readl(SDHCI_BUFFER).to_le_bytes();
                    chunk.copy_from_slice(&w[..chunk.len()]);
                }
                self.put(at, &block);
            } else {
                let block = self.get(at, blksz);
                for chunk in block.chunks(4) {
                    let mut w = [0u8; 4];
                    w[..chunk.len()].copy_from_slice(chunk);
                    self.writel(u32::from_le_bytes(w), SDHCI_BUFFER);
                }
            }
            *moved += blksz;
        }
    }

    /// CMD12 (R1b) if the card is still in a data state, as Linux's recovery sends it.
    pub fn stop(&mut self) -> Result<[u32; 4], u32> {
        self.cmd(12, 0, Resp::R1b)
    }

    // ---- bring-up -----------------------------------------------------------------------

    /// Power, one line at 400 kHz, CMD0, CMD1 until the card is powered up: the CMD1
    /// polls it took.
    pub fn identify_start(&mut self) -> u32 {
        self.power_on();
        self.set_bus(1, false);
        self.set_clock(400_000);
        self.cmd(0, 0, Resp::None).expect("CMD0");
        for polls in 1..=200 {
            let ocr = self.cmd(1, OCR_ARG, Resp::R3).expect("CMD1")[0];
            if ocr & 1 << 31 != 0 {
                return polls;
            }
        }
        panic!("the card never finished powering up");
    }

    /// The whole bring-up to transfer state at 8 bits, 52 MHz high speed; what it read:
    /// (CID, CSD, EXT_CSD, CMD1 polls).
    pub fn bring_up(&mut self) -> BroughtUp {
        let polls = self.identify_start();
        let cid = self.cmd(2, 0, Resp::R2).expect("CMD2");
        self.cmd(3, RCA, Resp::R1).expect("CMD3");
        let csd = self.cmd(9, RCA, Resp::R2).expect("CMD9");
        self.cmd(7, RCA, Resp::R1).expect("CMD7");
        let mut x = Xfer::rw(true, 0, 1, Mode::Pio);
        x.opcode = 8;
        self.data(&x).expect("CMD8");
        let ext = self.get(x.data, 512);
        self.switch(183, 2).expect("BUS_WIDTH 8");
        self.set_bus(8, false);
        self.switch(185, 1).expect("HS_TIMING high speed");
        self.set_bus(8, true);
        self.set_clock(52_000_000);
        BroughtUp {
            cid,
            csd,
            ext,
            polls,
        }
    }

    /// Write `data` at `lba` (CMD24/25 with Auto-CMD23 when several blocks, CMD12 none)
    /// by `mode`, from DATA.
    pub fn write_blocks(&mut self, lba: u32, data: &[u8], mode: Mode) -> Result<Done, u32> {
        let blocks = (data.len() / 512) as u16;
        let mut x = Xfer::rw(false, lba, blocks, mode);
        self.block_count(&mut x)?;
        self.put(x.data, data);
        self.data(&x)
    }

    /// A multi-block transfer's CMD23 as Linux sends it: Auto-CMD23 (Argument 2) with
    /// ADMA2 and PIO, a CMD23 of its own with SDMA (whose address register is Argument 2).
    pub fn block_count(&mut self, x: &mut Xfer) -> Result<(), u32> {
        if x.blocks > 1 {
            if x.mode == Mode::Sdma {
                self.cmd(23, u32::from(x.blocks), Resp::R1)?;
            } else {
                x.acmd23 = Some(u32::from(x.blocks));
            }
        }
        Ok(())
    }

    /// Read `blocks` at `lba` into DATA by `mode`; the bytes.
    pub fn read_blocks(&mut self, lba: u32, blocks: u16, mode: Mode) -> Result<Vec<u8>, u32> {
        let mut x = Xfer::rw(true, lba, blocks, mode);
        self.block_count(&mut x)?;
        self.put(x.data, &vec![0xEE; x.len()]);
        self.data(&x)?;
        Ok(self.get(x.data, x.len()))
    }
}

/// What the bring-up read from the card.
pub struct BroughtUp {
    pub cid: [u32; 4],
    pub csd: [u32; 4],
    pub ext: Vec<u8>,
    pub polls: u32,
}

/// A card register (CID, CSD) as the R2 words Linux keeps: big-endian words, the CRC
/// byte 0.
pub fn r2_words(reg: [u8; 16]) -> [u32; 4] {
    let be = |i: usize| u32::from_be_bytes([reg[i], reg[i + 1], reg[i + 2], reg[i + 3]]);
    [be(0), be(4), be(8), be(12) & !0xFF]
}
