//! SDHCI v3.00 status register bits (facts §13.1, §13.8, §13.11), named as the SD Host
//! Controller specification names them. Linux's `sdhci.h` uses the same bit positions
//! (its 32-bit interrupt mask is the normal status in bits 15:0 and the error status in
//! bits 31:16; see [`IntStatus::linux_mask`]).

/// Normal Interrupt Status (0x30).
pub mod normal_int {
    /// End of the response (for R1b at the response, not after busy). Linux `SDHCI_INT_RESPONSE`.
    pub const CMD_COMPLETE: u16 = 1 << 0;
    /// End of a data transfer, or end of busy of an R1b command without data.
    /// Linux `SDHCI_INT_DATA_END`.
    pub const TRANSFER_COMPLETE: u16 = 1 << 1;
    pub const BLOCK_GAP: u16 = 1 << 2;
    /// SDMA boundary or an ADMA2 descriptor with the Int attribute completed.
    pub const DMA_INT: u16 = 1 << 3;
    pub const BUF_WRITE_READY: u16 = 1 << 4;
    /// PIO read block available; the only interrupt of a tuning command.
    pub const BUF_READ_READY: u16 = 1 << 5;
    pub const CARD_INSERTION: u16 = 1 << 6;
    pub const CARD_REMOVAL: u16 = 1 << 7;
    pub const CARD_INT: u16 = 1 << 8;
    /// Re-Tuning Event (v3).
    pub const RETUNE: u16 = 1 << 12;
    /// Read-only OR of every error status bit.
    pub const ERROR_INT: u16 = 1 << 15;
}

/// Error Interrupt Status (0x32).
pub mod error_int {
    /// The card did not answer within 64 clocks. Linux `SDHCI_INT_TIMEOUT`.
    pub const CMD_TIMEOUT: u16 = 1 << 0;
    /// Linux `SDHCI_INT_CRC`.
    pub const CMD_CRC: u16 = 1 << 1;
    pub const CMD_END_BIT: u16 = 1 << 2;
    pub const CMD_INDEX: u16 = 1 << 3;
    /// Read data, write CRC status or busy (R1b, after a write) did not come in time.
    pub const DATA_TIMEOUT: u16 = 1 << 4;
    /// Read data with a bad CRC16, or a negative write CRC status token.
    pub const DATA_CRC: u16 = 1 << 5;
    pub const DATA_END_BIT: u16 = 1 << 6;
    /// Linux `SDHCI_INT_BUS_POWER`.
    pub const CURRENT_LIMIT: u16 = 1 << 7;
    /// Details in the Auto CMD Error Status register ([`super::auto_cmd_err`]).
    pub const AUTO_CMD_ERR: u16 = 1 << 8;
    /// Details in the ADMA Error Status register ([`super::adma_err`]).
    pub const ADMA_ERR: u16 = 1 << 9;
    /// Tuning Error (v3).
    pub const TUNING_ERR: u16 = 1 << 10;
}

/// Auto CMD Error Status (0x3C).
pub mod auto_cmd_err {
    /// Auto CMD12 could not be issued because of an earlier error.
    pub const ACMD12_NOT_EXEC: u16 = 1 << 0;
    pub const TIMEOUT: u16 = 1 << 1;
    pub const CRC: u16 = 1 << 2;
    pub const END_BIT: u16 = 1 << 3;
    pub const INDEX: u16 = 1 << 4;
    /// A command was not issued because Auto CMD12 failed.
    pub const CMD_NOT_ISSUED: u16 = 1 << 7;
}

/// ADMA Error Status (0x54).
pub mod adma_err {
    /// [1:0]: the ADMA state when the error happened.
    pub const STATE_MASK: u8 = 0b11;
    /// Stopped (the error descriptor is the one before the ADMA System Address).
    pub const ST_STOP: u8 = 0b00;
    /// Fetching a descriptor (the ADMA System Address points at the bad descriptor).
    pub const ST_FDS: u8 = 0b01;
    /// Transferring data.
    pub const ST_TFR: u8 = 0b11;
    /// [2]: the descriptor table's length differs from block size × block count.
    pub const LENGTH_MISMATCH: u8 = 1 << 2;
}

/// ADMA2 descriptor attributes (facts §13.11).
pub mod adma2_attr {
    pub const VALID: u16 = 1 << 0;
    pub const END: u16 = 1 << 1;
    pub const INT: u16 = 1 << 2;
    pub const ACT_NOP: u16 = 0b00 << 4;
    pub const ACT_TRAN: u16 = 0b10 << 4;
    pub const ACT_LINK: u16 = 0b11 << 4;
    /// Linux `ADMA2_TRAN_VALID`.
    pub const TRAN_VALID: u16 = ACT_TRAN | VALID;
    /// Linux `ADMA2_NOP_END_VALID`: the terminating descriptor Linux appends.
    pub const NOP_END_VALID: u16 = ACT_NOP | END | VALID;
}

/// The Normal and Error Interrupt Status registers as a request left them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct IntStatus {
    pub normal: u16,
    pub error: u16,
}

impl IntStatus {
    /// Linux's combined mask: normal status in bits 15:0, error status in bits 31:16.
    pub fn linux_mask(&self) -> u32 {
        u32::from(self.normal) | u32::from(self.error) << 16
    }

    /// Any bit of `mask` set in the Error Interrupt Status.
    pub fn has_error(&self, mask: u16) -> bool {
        self.error & mask != 0
    }

    /// Any bit of `mask` set in the Normal Interrupt Status.
    pub fn has(&self, mask: u16) -> bool {
        self.normal & mask != 0
    }

    pub(super) fn raise(&mut self, normal: u16) {
        self.normal |= normal;
    }

    /// Set error bits; the Error Interrupt bit of the normal register follows.
    pub(super) fn raise_error(&mut self, error: u16) {
        self.error |= error;
        if self.error != 0 {
            self.normal |= normal_int::ERROR_INT;
        }
    }
}
