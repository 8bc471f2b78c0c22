//! The stored registers: what the guest wrote (through each register's write mask) and
//! what the controller put there for it to read (the revealed response, ADMA error
//! status and address). Status, present state, capabilities and the buffer data port are
//! computed where they are read (`access.rs`, `present.rs`, `interrupts.rs`).

use super::layout::*;

/// Registers that hold a value, at their power-on (Software Reset for All) values: 0.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(super) struct RegisterFile {
    /// 0x00: SDMA System Address / Argument 2.
    pub(super) sdma_address: u32,
    /// 0x04: block size [11:0] and SDMA boundary [14:12].
    pub(super) block_size: u16,
    /// 0x06.
    pub(super) block_count: u16,
    /// 0x08.
    pub(super) argument: u32,
    /// 0x0C.
    pub(super) transfer_mode: u16,
    /// 0x0E: the last value written.
    pub(super) command: u16,
    /// 0x10..0x1F as the last revealed responses left them.
    pub(super) response: [u32; 4],
    /// 0x28.
    pub(super) host_control: u8,
    /// 0x29.
    pub(super) power_control: u8,
    /// 0x2A, 0x2B: kept, no effect on an embedded slot.
    pub(super) block_gap: u8,
    pub(super) wakeup: u8,
    /// 0x2C without Internal Clock Stable, which reads as Internal Clock Enable.
    pub(super) clock_control: u16,
    /// 0x2E.
    pub(super) timeout_control: u8,
    /// 0x3E without Sampling Clock Select, which reads from the tuning state.
    pub(super) host_control2: u16,
    /// 0x54.
    pub(super) adma_error: u8,
    /// 0x58..0x5F.
    pub(super) adma_address: u64,
}

/// Write masks of the plain read/write registers.
pub(super) const BLOCK_SIZE_WRITABLE: u16 = SDHCI_BLOCK_SIZE_MASK | SDHCI_SDMA_BOUNDARY_MASK;
pub(super) const POWER_WRITABLE: u8 = SDHCI_POWER_ON | SDHCI_POWER_VOLTAGE_MASK;
pub(super) const BLOCK_GAP_WRITABLE: u8 = 0x0F;
pub(super) const WAKEUP_WRITABLE: u8 = 0x07;
/// Internal Clock Enable, SD Clock Enable and the 10-bit divider; Clock Generator Select
/// needs a clock multiplier this controller does not have.
pub(super) const CLOCK_WRITABLE: u16 =
    SDHCI_CLOCK_INT_EN | SDHCI_CLOCK_CARD_EN | SDHCI_DIV_MASK << SDHCI_DIVIDER_SHIFT | 0xC0;
/// Host Control 2 without Sampling Clock Select (the controller's to set).
pub(super) const HOST_CONTROL2_WRITABLE: u16 = SDHCI_CTRL2_MASK & !SDHCI_CTRL_TUNED_CLK;

/// Byte `i` (0 = least significant) of `v`.
pub(super) fn byte_of(v: u64, i: u64) -> u8 {
    (v >> (8 * i)) as u8
}

/// `v` with byte `i` replaced by `b`, only where `mask` allows.
pub(super) fn with_byte(v: u64, i: u64, b: u8, mask: u64) -> u64 {
    let lane = (0xFFu64 << (8 * i)) & mask;
    (v & !lane) | ((u64::from(b) << (8 * i)) & lane)
}

impl RegisterFile {
    /// Block size in bytes.
    pub(super) fn blksz(&self) -> u32 {
        u32::from(self.block_size & SDHCI_BLOCK_SIZE_MASK)
    }

    /// SDMA buffer boundary in bytes.
    pub(super) fn sdma_boundary(&self) -> u64 {
        sdma_boundary_bytes(
            (self.block_size & SDHCI_SDMA_BOUNDARY_MASK) >> SDHCI_SDMA_BOUNDARY_SHIFT,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bytes_go_where_the_mask_lets_them() {
        assert_eq!(byte_of(0x1122_3344, 2), 0x22);
        assert_eq!(with_byte(0x1122_3344, 1, 0xAB, 0xFFFF_FFFF), 0x1122_AB44);
        assert_eq!(with_byte(0x1122_3344, 1, 0xAB, 0x0F00), 0x1122_3B44);
        let r = RegisterFile {
            block_size: sdhci_make_blksz(7, 512),
            ..RegisterFile::default()
        };
        assert_eq!((r.blksz(), r.sdma_boundary()), (512, 512 * 1024));
    }
}
