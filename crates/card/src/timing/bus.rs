//! Time on the MMC bus: command and response tokens on the CMD line, data blocks on the
//! DAT lines, at the clock, width and data rate the host has set (JESD84-B45 §6.15;
//! facts §12.2–12.4).
//!
//! - A command or a short response is 48 bits, a long response (R2) 136, one bit per clock.
//! - A data block on each DAT line is a start bit, the data, a CRC16 and an end bit. With
//!   SDR a line carries one bit per clock; with DDR data and CRC use both edges (the start
//!   and end bits do not), so a block takes 4·B/W data clocks plus 16 CRC clocks
//!   (two interleaved CRC16s) plus 2.
//! - After a write block the card answers a CRC status token on DAT0 (start, 3 bits,
//!   end) NWR clocks after the block.
//!
//! Minimum gaps from the spec are included (NCR between command and response, NRC/NCC
//! before the next command, NAC before read data, NWR before write data); how long the
//! card takes beyond them is the card's timing model's business.

use super::Nanos;

/// Clocks from a command's end bit to its response's start bit (minimum).
pub const NCR_MIN: u64 = 2;
/// Clocks from a response's end bit to the next command (minimum).
pub const NRC_MIN: u64 = 8;
/// Clocks from a read command's end bit to the first data start bit (minimum).
pub const NAC_MIN: u64 = 2;
/// Clocks from a write command's response (or the previous block's CRC status) to write data.
pub const NWR_MIN: u64 = 2;
/// Clocks of the CRC status token after each written block (start, 3 status bits, end).
pub const CRC_STATUS_CLOCKS: u64 = 5;
/// Command token length in bits (= clocks).
pub const COMMAND_BITS: u64 = 48;
/// Short (R1/R1b/R3/R4/R5) and long (R2) response lengths.
pub const SHORT_RESPONSE_BITS: u64 = 48;
pub const LONG_RESPONSE_BITS: u64 = 136;

/// What follows a command on the CMD line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ResponseLength {
    None,
    Short,
    Long,
}

/// The bus as the host has configured it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Bus {
    /// Card clock in Hz (0: clock stopped).
    pub clock_hz: u64,
    /// Data lines: 1, 4 or 8.
    pub width: u8,
    /// Dual data rate on DAT (DDR52).
    pub ddr: bool,
}

impl Bus {
    /// The identification-mode bus: 400 kHz, one line.
    pub const IDENTIFICATION: Bus = Bus {
        clock_hz: 400_000,
        width: 1,
        ddr: false,
    };

    pub fn new(clock_hz: u64, width: u8, ddr: bool) -> Bus {
        Bus {
            clock_hz,
            width,
            ddr,
        }
    }

    /// Time of `clocks` card clocks, rounded up to whole nanoseconds.
    pub fn clocks_ns(&self, clocks: u64) -> Nanos {
        if self.clock_hz == 0 {
            return Nanos::MAX;
        }
        (u128::from(clocks) * 1_000_000_000).div_ceil(u128::from(self.clock_hz)) as Nanos
    }

    /// Clocks for a command token, its response and the gap before the next command.
    pub fn command_clocks(response: ResponseLength) -> u64 {
        COMMAND_BITS
            + match response {
                ResponseLength::None => NRC_MIN,
                ResponseLength::Short => NCR_MIN + SHORT_RESPONSE_BITS + NRC_MIN,
                ResponseLength::Long => NCR_MIN + LONG_RESPONSE_BITS + NRC_MIN,
            }
    }

    /// Bus time of one command exchange.
    pub fn command_ns(&self, response: ResponseLength) -> Nanos {
        self.clocks_ns(Self::command_clocks(response))
    }

    /// Clocks for one data block of `block_len` bytes on this bus.
    pub fn block_clocks(&self, block_len: usize) -> u64 {
        let width = u64::from(self.width.max(1));
        let bits_per_line = (8 * block_len as u64).div_ceil(width);
        if self.ddr {
            bits_per_line.div_ceil(2) + 16 + 2
        } else {
            bits_per_line + 16 + 2
        }
    }

    /// Bus time to read `blocks` blocks (the card's access time is not included).
    pub fn read_ns(&self, block_len: usize, blocks: u64) -> Nanos {
        self.clocks_ns(NAC_MIN + blocks * self.block_clocks(block_len))
    }

    /// Bus time to write `blocks` blocks, with the CRC status token after each.
    pub fn write_ns(&self, block_len: usize, blocks: u64) -> Nanos {
        self.clocks_ns(blocks * (NWR_MIN + self.block_clocks(block_len) + CRC_STATUS_CLOCKS))
    }

    /// Peak data rate in bytes per second for 512-byte blocks (for reports).
    pub fn peak_bytes_per_sec(&self) -> f64 {
        let ns = self.clocks_ns(self.block_clocks(512)) as f64;
        512.0 * 1e9 / ns
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn block_clocks_match_the_transfer_arithmetic_table() {
        // facts §12.3: clocks per 512-byte block.
        assert_eq!(Bus::new(26_000_000, 1, false).block_clocks(512), 4114);
        assert_eq!(Bus::new(52_000_000, 4, false).block_clocks(512), 1042);
        assert_eq!(Bus::new(52_000_000, 8, false).block_clocks(512), 530);
        assert_eq!(Bus::new(52_000_000, 8, true).block_clocks(512), 274);
        assert_eq!(Bus::new(200_000_000, 4, false).block_clocks(512), 1042);
    }

    #[test]
    fn block_times_match_the_table_within_rounding() {
        let per_block = |bus: Bus| bus.clocks_ns(bus.block_clocks(512));
        assert_eq!(per_block(Bus::new(26_000_000, 1, false)), 158_231); // 158 µs
        assert_eq!(per_block(Bus::new(52_000_000, 8, false)), 10_193); // 10.2 µs
        assert_eq!(per_block(Bus::new(200_000_000, 8, false)), 2_650); // 2.65 µs
        let hs200 = Bus::new(200_000_000, 8, false).peak_bytes_per_sec() / 1e6;
        assert!((hs200 - 193.2).abs() < 0.5, "{hs200}");
    }

    #[test]
    fn command_exchange_at_400_khz_takes_a_quarter_millisecond() {
        // 48 + NCR 2 + 48 + NRC 8 = 106 clocks of 2.5 µs.
        assert_eq!(
            Bus::IDENTIFICATION.command_ns(ResponseLength::Short),
            265_000
        );
        assert_eq!(
            Bus::IDENTIFICATION.command_ns(ResponseLength::None),
            140_000
        );
        assert!(
            Bus::IDENTIFICATION.command_ns(ResponseLength::Long)
                > Bus::IDENTIFICATION.command_ns(ResponseLength::Short)
        );
    }

    #[test]
    fn write_costs_more_than_read_per_block_and_a_stopped_clock_never_ends() {
        let bus = Bus::new(52_000_000, 8, false);
        assert!(bus.write_ns(512, 8) > bus.read_ns(512, 8));
        assert_eq!(Bus::new(0, 8, false).read_ns(512, 1), Nanos::MAX);
    }
}
