//! Register accesses, byte lane by byte lane: an access of 1, 2, 4 or 8 bytes at any
//! offset inside the 256-byte space is the same as its bytes in ascending order, each
//! going to the register that holds it (so a dword at 0x30 reads both interrupt status
//! registers, and a dword written at 0x0C sets Transfer Mode before it issues the
//! command). What a write sets off — the command, a software reset, a new bus setting, an
//! SDMA restart — happens once the whole access is in, in that fixed order: bus, SDMA,
//! command, reset.

use super::dma::DmaMemory;
use super::layout::*;
use super::registers::*;
use super::SdhciMmio;

/// What a write access set off, done once all its bytes are in.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(super) struct Effects {
    /// Host Control 1/2, Power or Clock Control changed: hand the bus to the core.
    ios: bool,
    /// SDMA System Address [31:24] written: a paused SDMA goes on.
    sdma_restart: bool,
    /// Command [15:8] written: issue.
    issue: bool,
    /// Software Reset bits.
    reset: u8,
    /// A Status Enable byte written (bits it disables clear from the status).
    enables: bool,
    /// RST_n released after a pulse (Power Control bit 4 from 1 to 0).
    rst_n_pulse: bool,
}

/// Whether an access of `len` bytes at `offset` is one the model serves.
pub(super) fn valid_access(offset: u64, len: usize) -> bool {
    matches!(len, 1 | 2 | 4 | 8)
        && offset
            .checked_add(len as u64)
            .is_some_and(|end| end <= SDHCI_REGS_LEN)
}

impl SdhciMmio {
    /// One byte of the register space as read now.
    pub(super) fn read_byte(&mut self, off: u64, present: u32) -> u8 {
        let r = &self.regs;
        match off {
            0x00..=0x03 => byte_of(u64::from(r.sdma_address), off),
            0x04..=0x05 => byte_of(u64::from(r.block_size), off - 0x04),
            0x06..=0x07 => byte_of(u64::from(r.block_count), off - 0x06),
            0x08..=0x0B => byte_of(u64::from(r.argument), off - 0x08),
            0x0C..=0x0D => byte_of(u64::from(r.transfer_mode), off - 0x0C),
            0x0E..=0x0F => byte_of(u64::from(r.command), off - 0x0E),
            0x10..=0x1F => {
                let i = (off - 0x10) as usize;
                byte_of(u64::from(r.response[i / 4]), (i % 4) as u64)
            }
            0x20..=0x23 => self.pio_read_byte(),
            0x24..=0x27 => byte_of(u64::from(present), off - 0x24),
            0x28 => r.host_control,
            0x29 => r.power_control,
            0x2A => r.block_gap,
            0x2B => r.wakeup,
            0x2C..=0x2D => {
                let mut c = r.clock_control;
                if c & SDHCI_CLOCK_INT_EN != 0 {
                    c |= SDHCI_CLOCK_INT_STABLE;
                }
                byte_of(u64::from(c), off - 0x2C)
            }
            0x2E => r.timeout_control,
            0x30..=0x31 => byte_of(u64::from(self.ints.normal_status()), off - 0x30),
            0x32..=0x33 => byte_of(u64::from(self.ints.error), off - 0x32),
            0x34..=0x35 => byte_of(u64::from(self.ints.normal_enable), off - 0x34),
            0x36..=0x37 => byte_of(u64::from(self.ints.error_enable), off - 0x36),
            0x38..=0x39 => byte_of(u64::from(self.ints.normal_signal), off - 0x38),
            0x3A..=0x3B => byte_of(u64::from(self.ints.error_signal), off - 0x3A),
            0x3C..=0x3D => byte_of(u64::from(self.ints.auto_cmd_err), off - 0x3C),
            0x3E..=0x3F => {
                let mut hc2 = r.host_control2;
                if self.host.tuned {
                    hc2 |= SDHCI_CTRL_TUNED_CLK;
                }
                byte_of(u64::from(hc2), off - 0x3E)
            }
            0x40..=0x47 => byte_of(self.caps.as_u64(), off - 0x40),
            0x48..=0x4B => byte_of(u64::from(self.caps.max_current), off - 0x48),
            0x54 => r.adma_error,
            0x58..=0x5F => {
                let addr = if self.caps.has(SDHCI_CAN_64BIT) {
                    r.adma_address
                } else {
                    r.adma_address & 0xFFFF_FFFF
                };
                byte_of(addr, off - 0x58)
            }
            0x60..=0x6F => {
                let i = (off - 0x60) as usize;
                byte_of(u64::from(self.caps.presets[i / 2]), (i % 2) as u64)
            }
            0xFC => u8::from(self.ints.asserted()),
            0xFE..=0xFF => byte_of(u64::from(SDHCI_SPEC_300), off - 0xFE),
            // Software Reset reads 0 (done at once), Force Event is write-only, the rest
            // is reserved.
            _ => 0,
        }
    }

    /// One byte written; what it sets off is noted in `fx`.
    pub(super) fn write_byte(&mut self, off: u64, b: u8, fx: &mut Effects) {
        let dat_busy = self.dat.is_some();
        let r = &mut self.regs;
        match off {
            0x00..=0x03 => {
                r.sdma_address = with_byte(u64::from(r.sdma_address), off, b, u64::MAX) as u32;
                fx.sdma_restart |= off == 0x03;
            }
            // Block Size, Block Count and Transfer Mode are write-protected while
            // Command Inhibit (DAT) is set.
            0x04..=0x05 if !dat_busy => {
                r.block_size = with_byte(
                    u64::from(r.block_size),
                    off - 0x04,
                    b,
                    u64::from(BLOCK_SIZE_WRITABLE),
                ) as u16;
            }
            0x06..=0x07 if !dat_busy => {
                r.block_count = with_byte(u64::from(r.block_count), off - 0x06, b, u64::MAX) as u16;
            }
            0x08..=0x0B => {
                r.argument = with_byte(u64::from(r.argument), off - 0x08, b, u64::MAX) as u32;
            }
            0x0C..=0x0D if !dat_busy => {
                r.transfer_mode = with_byte(
                    u64::from(r.transfer_mode),
                    off - 0x0C,
                    b,
                    u64::from(SDHCI_TRNS_MASK),
                ) as u16;
            }
            0x0E..=0x0F => {
                r.command = with_byte(
                    u64::from(r.command),
                    off - 0x0E,
                    b,
                    u64::from(SDHCI_CMD_MASK),
                ) as u16;
                fx.issue |= off == 0x0F;
            }
            0x20..=0x23 => self.pio_write_byte(b),
            0x28 => {
                let mut v = b;
                if !self.caps.has(SDHCI_CAN_DO_8BIT) {
                    v &= !SDHCI_CTRL_8BITBUS;
                }
                self.regs.host_control = v;
                fx.ios = true;
            }
            0x29 => {
                let mut v = b & POWER_WRITABLE;
                if v & SDHCI_POWER_ON != 0 && !self.voltage_supported(v) {
                    // SD Bus Power cannot be set at a voltage the slot does not offer.
                    v &= !SDHCI_POWER_ON;
                }
                if self.rst_n_in_power_control {
                    v |= b & SDHCI_POWER_RST_N;
                    let was = self.regs.power_control & SDHCI_POWER_RST_N != 0;
                    fx.rst_n_pulse |= was && b & SDHCI_POWER_RST_N == 0;
                }
                self.regs.power_control = v;
                self.bus_power = v & SDHCI_POWER_ON != 0;
                fx.ios = true;
            }
            0x2A => r.block_gap = b & BLOCK_GAP_WRITABLE,
            0x2B => r.wakeup = b & WAKEUP_WRITABLE,
            0x2C..=0x2D => {
                r.clock_control = with_byte(
                    u64::from(r.clock_control),
                    off - 0x2C,
                    b,
                    u64::from(CLOCK_WRITABLE),
                ) as u16;
                fx.ios = true;
            }
            0x2E => r.timeout_control = b & SDHCI_TIMEOUT_MASK,
            0x2F => fx.reset |= b & (SDHCI_RESET_ALL | SDHCI_RESET_CMD | SDHCI_RESET_DATA),
            0x30..=0x31 => self.ints.ack(u16::from(b) << (8 * (off - 0x30)), 0),
            0x32..=0x33 => self.ints.ack(0, u16::from(b) << (8 * (off - 0x32))),
            0x34..=0x37 => {
                let i = &mut self.ints;
                let mut both = u64::from(i.normal_enable) | u64::from(i.error_enable) << 16;
                both = with_byte(both, off - 0x34, b, u64::MAX);
                i.normal_enable = both as u16;
                i.error_enable = (both >> 16) as u16;
                fx.enables = true;
            }
            0x38..=0x3B => {
                let i = &mut self.ints;
                let mut both = u64::from(i.normal_signal) | u64::from(i.error_signal) << 16;
                both = with_byte(both, off - 0x38, b, u64::MAX);
                i.set_signal(both as u16, (both >> 16) as u16);
            }
            0x3E..=0x3F => {
                let old = r.host_control2;
                r.host_control2 = with_byte(
                    u64::from(old),
                    off - 0x3E,
                    b,
                    u64::from(HOST_CONTROL2_WRITABLE),
                ) as u16;
                if off == 0x3E {
                    if b & SDHCI_CTRL_TUNED_CLK as u8 == 0 {
                        // Sampling Clock Select written 0: back to the fixed clock.
                        self.host.tuned = false;
                    }
                    if old & SDHCI_CTRL_EXEC_TUNING == 0
                        && u16::from(b) & SDHCI_CTRL_EXEC_TUNING != 0
                    {
                        // A tuning sequence starts from the fixed clock.
                        self.host.tuned = false;
                        self.tuning_tries = 0;
                    }
                }
                fx.ios = true;
            }
            0x50..=0x51 => self.ints.force_auto_cmd(u16::from(b) << (8 * (off - 0x50))),
            0x52..=0x53 => self.ints.force_error(u16::from(b) << (8 * (off - 0x52))),
            // The upper dword only with 64-bit addressing.
            0x58..=0x5F if off < 0x5C || self.caps.has(SDHCI_CAN_64BIT) => {
                r.adma_address = with_byte(r.adma_address, off - 0x58, b, u64::MAX);
            }
            // Read-only, reserved, or write-protected now.
            _ => {}
        }
    }

    /// Do what a write access set off, once all its bytes are in.
    pub(super) fn apply_effects(&mut self, fx: Effects, dma: &dyn DmaMemory) {
        if fx.enables {
            let (n, e) = (self.ints.normal_enable, self.ints.error_enable);
            self.ints.set_enable(n, e);
        }
        if fx.ios {
            self.apply_ios();
        }
        if fx.rst_n_pulse {
            self.card.hardware_reset(self.now);
        }
        if fx.sdma_restart {
            self.sdma_restart(dma);
        }
        if fx.issue {
            self.issue(dma);
        }
        if fx.reset != 0 {
            self.software_reset(fx.reset);
        }
    }
}
