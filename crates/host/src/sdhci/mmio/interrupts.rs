//! The interrupt registers: Normal and Error Interrupt Status (0x30/0x32, write 1 to
//! clear), their Status Enable (0x34/0x36: a status bit is only latched while enabled)
//! and Signal Enable (0x38/0x3A: which latched bits drive the INTx line), the Force Event
//! registers (0x50/0x52) and the Auto CMD Error Status (0x3C) they also set.

use super::layout::{AUTO_CMD_ERR_MASK, ERROR_INT_MASK, NORMAL_INT_MASK};
use crate::sdhci::{error_int, normal_int};

/// Interrupt status, enables and signal enables; bounded state whatever the guest does
/// (a status bit set twice is set once).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(super) struct Interrupts {
    pub(super) normal: u16,
    pub(super) error: u16,
    pub(super) normal_enable: u16,
    pub(super) error_enable: u16,
    pub(super) normal_signal: u16,
    pub(super) error_signal: u16,
    /// Auto CMD Error Status (0x3C).
    pub(super) auto_cmd_err: u16,
}

impl Interrupts {
    /// Latch normal status bits (those enabled). ERROR_INT is never latched: it reads as
    /// the OR of the error status.
    pub(super) fn raise(&mut self, bits: u16) {
        self.normal |= bits & self.normal_enable & NORMAL_INT_MASK;
    }

    /// Latch error status bits (those enabled).
    pub(super) fn raise_error(&mut self, bits: u16) {
        self.error |= bits & self.error_enable & ERROR_INT_MASK;
    }

    /// Normal Interrupt Status as read: the latched bits and ERROR_INT.
    pub(super) fn normal_status(&self) -> u16 {
        let mut s = self.normal;
        if self.error != 0 {
            s |= normal_int::ERROR_INT;
        }
        s
    }

    /// Write 1 to clear (ERROR_INT is read-only: it clears with the error bits).
    pub(super) fn ack(&mut self, normal: u16, error: u16) {
        self.normal &= !(normal & NORMAL_INT_MASK);
        self.error &= !(error & ERROR_INT_MASK);
    }

    /// A Status Enable write: bits it disables clear from the status too.
    pub(super) fn set_enable(&mut self, normal: u16, error: u16) {
        self.normal_enable = normal & NORMAL_INT_MASK;
        self.error_enable = error & ERROR_INT_MASK;
        self.normal &= self.normal_enable;
        self.error &= self.error_enable;
    }

    pub(super) fn set_signal(&mut self, normal: u16, error: u16) {
        self.normal_signal = normal & NORMAL_INT_MASK;
        self.error_signal = error & ERROR_INT_MASK;
    }

    /// The INTx level: a latched, signal-enabled bit.
    pub(super) fn asserted(&self) -> bool {
        self.normal & self.normal_signal != 0 || self.error & self.error_signal != 0
    }

    /// Force Event for Error Interrupt Status (0x52).
    pub(super) fn force_error(&mut self, bits: u16) {
        self.raise_error(bits);
    }

    /// Force Event for Auto CMD Error Status (0x50): the bits and the Auto CMD Error
    /// interrupt.
    pub(super) fn force_auto_cmd(&mut self, bits: u16) {
        let bits = bits & AUTO_CMD_ERR_MASK;
        if bits != 0 {
            self.auto_cmd_err |= bits;
            self.raise_error(error_int::AUTO_CMD_ERR);
        }
    }

    /// Data-circuit status a Software Reset for DAT Line clears.
    pub(super) fn reset_data(&mut self) {
        self.normal &= !(normal_int::TRANSFER_COMPLETE
            | normal_int::BLOCK_GAP
            | normal_int::DMA_INT
            | normal_int::BUF_WRITE_READY
            | normal_int::BUF_READ_READY);
    }

    /// Command-circuit status a Software Reset for CMD Line clears.
    pub(super) fn reset_cmd(&mut self) {
        self.normal &= !normal_int::CMD_COMPLETE;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_enabled_bits_latch_and_only_signalled_ones_interrupt() {
        let mut i = Interrupts::default();
        i.raise(normal_int::CMD_COMPLETE);
        assert_eq!(i.normal_status(), 0, "not enabled: not latched");
        i.set_enable(0xFFFF, 0xFFFF);
        assert_eq!(i.normal_enable, NORMAL_INT_MASK, "reserved enables read 0");
        i.raise(normal_int::CMD_COMPLETE | normal_int::ERROR_INT);
        assert_eq!(i.normal_status(), normal_int::CMD_COMPLETE);
        assert!(!i.asserted());
        i.set_signal(normal_int::CMD_COMPLETE, 0);
        assert!(i.asserted());
        i.raise_error(error_int::CMD_TIMEOUT | 1 << 12);
        assert_eq!(i.error, error_int::CMD_TIMEOUT, "vendor bits read 0");
        assert_ne!(i.normal_status() & normal_int::ERROR_INT, 0);
        // W1C: ERROR_INT itself cannot be cleared, the error bits can.
        i.ack(normal_int::ERROR_INT, 0);
        assert_ne!(i.normal_status() & normal_int::ERROR_INT, 0);
        i.ack(normal_int::CMD_COMPLETE, error_int::CMD_TIMEOUT);
        assert_eq!((i.normal_status(), i.error), (0, 0));
        assert!(!i.asserted());
        // Disabling a status bit clears it.
        i.raise(normal_int::TRANSFER_COMPLETE);
        i.set_enable(0, 0xFFFF);
        assert_eq!(i.normal, 0);
        i.force_auto_cmd(0xFF);
        assert_eq!(i.auto_cmd_err, AUTO_CMD_ERR_MASK);
        assert_ne!(i.error & error_int::AUTO_CMD_ERR, 0);
    }
}
