//! Data and busy time-outs, computed the way Linux computes them: the MMC core derives a
//! data time-out from the card's CSD (`mmc_set_data_timeout`), and the SDHCI driver turns
//! it into a Timeout Control count (`sdhci_target_timeout`, `sdhci_calc_timeout`), which
//! the controller counts in TMCLK cycles: 2^(13+count) of them (facts §13.1, offset 0x2E).

use emmc_card::registers::decode_csd;
use emmc_card::timing::Nanos;

use super::{DataDirection, SdhciHost};

/// Timeout Control counts 0..=0xE are defined; Linux never programs more than 0xE.
pub const MAX_TIMEOUT_COUNT: u8 = 0xE;

/// Linux's request watchdog when no hardware time-out applies (`sdhci_mod_timer`: 10 s).
pub const SOFTWARE_TIMEOUT_NS: Nanos = 10_000_000_000;

/// `mmc_set_data_timeout()` for an MMC card: 10 × (TAAC + NSAC·100 clocks) for reads, and
/// that times 2^R2W_FACTOR for writes (facts §12.4). Returns `(timeout_ns, timeout_clks)`.
///
/// TAAC is decoded with the card model's CSD decoder, which truncates to whole
/// nanoseconds where Linux rounds up; the two differ only for the 1 ns unit.
pub fn mmc_data_timeout(csd: &[u8; 16], direction: DataDirection) -> (u64, u32) {
    let f = decode_csd(csd);
    let mut mult: u64 = 10;
    if direction == DataDirection::Write {
        mult <<= f.r2w_factor.min(7);
    }
    let taac_ns = f.taac_ns().unwrap_or(0);
    let clks = u64::from(f.nsac) * 100 * mult;
    (taac_ns * mult, clks.min(u64::from(u32::MAX)) as u32)
}

/// `sdhci_target_timeout()`: the wanted time-out in microseconds, rounded up. For a
/// command without data it is the command's busy time-out (ms); for data, `timeout_ns`
/// plus `timeout_clks` at the bus clock the driver set (`clock_hz`, 0 = ignore clocks).
pub fn target_timeout_us(data: Option<(u64, u32)>, busy_timeout_ms: u32, clock_hz: u64) -> u64 {
    match data {
        None => u64::from(busy_timeout_ms) * 1000,
        Some((timeout_ns, timeout_clks)) => {
            let mut us = timeout_ns.div_ceil(1000);
            if clock_hz != 0 && timeout_clks != 0 {
                us += (1_000_000 * u64::from(timeout_clks)).div_ceil(clock_hz);
            }
            us
        }
    }
}

/// `sdhci_calc_timeout()`: the smallest count whose time-out reaches `target_us`, with
/// Linux's integer arithmetic, and whether the target was too big for the controller (then
/// the count is 0xE). A target of 0 means "unspecified": 0xE, too big.
pub fn calc_timeout_count(target_us: u64, timeout_clk_khz: u64) -> (u8, bool) {
    if target_us == 0 {
        return (MAX_TIMEOUT_COUNT, true);
    }
    let khz = timeout_clk_khz.max(1);
    let mut count: u8 = 0;
    let mut current_us = (1u64 << 13) * 1000 / khz;
    while current_us < target_us {
        count += 1;
        current_us <<= 1;
        if count > MAX_TIMEOUT_COUNT {
            break;
        }
    }
    if count > MAX_TIMEOUT_COUNT {
        (MAX_TIMEOUT_COUNT, true)
    } else {
        (count, false)
    }
}

/// What the controller's counter measures for `count`: 2^(13+count) TMCLK cycles.
pub fn hardware_timeout_ns(count: u8, timeout_clk_hz: u64) -> Nanos {
    let cycles = 1u128 << (13 + u32::from(count.min(MAX_TIMEOUT_COUNT)));
    (cycles * 1_000_000_000).div_ceil(u128::from(timeout_clk_hz.max(1))) as Nanos
}

/// `(timeout_ns, timeout_clks)` for reads and for writes.
type DataTimeouts = [(u64, u32); 2];

/// The data time-outs Linux derives from a card's CSD, for reads and for writes, decoded
/// once per CSD (as the MMC core decodes the CSD at bring-up) rather than per request.
#[derive(Debug, Clone, Default)]
pub(super) struct CsdTimeouts {
    /// The CSD they were computed from, and the time-outs.
    cached: Option<([u8; 16], DataTimeouts)>,
}

impl CsdTimeouts {
    /// [`mmc_data_timeout`] for a transfer in `direction` on a card whose CSD is `csd`.
    #[inline]
    pub(super) fn get(&mut self, csd: [u8; 16], direction: DataDirection) -> (u64, u32) {
        let timeouts = match self.cached {
            Some((cached, t)) if cached == csd => t,
            _ => {
                let t = [
                    mmc_data_timeout(&csd, DataDirection::Read),
                    mmc_data_timeout(&csd, DataDirection::Write),
                ];
                self.cached = Some((csd, t));
                t
            }
        };
        timeouts[usize::from(direction == DataDirection::Write)]
    }
}

impl SdhciHost {
    /// Linux's `mmc->max_busy_timeout` in ms: 2^27 TMCLK cycles, 0 (no limit) when the
    /// hardware time-out may be disabled. A longer CMD6 busy is polled instead of waited
    /// for with R1b.
    pub fn max_busy_timeout_ms(&self) -> u32 {
        if self.config.disable_hw_timeout {
            return 0;
        }
        ((1u64 << 27) / (self.config.timeout_clock_hz / 1000).max(1)).min(u64::from(u32::MAX))
            as u32
    }

    /// The time-out the controller applies for a target of `target_us`.
    pub(super) fn effective_timeout_ns(&self, target_us: u64) -> Nanos {
        let (count, too_big) = calc_timeout_count(target_us, self.config.timeout_clock_hz / 1000);
        if too_big && self.config.disable_hw_timeout {
            if target_us == 0 {
                SOFTWARE_TIMEOUT_NS
            } else {
                target_us.saturating_mul(1000)
            }
        } else {
            hardware_timeout_ns(count, self.config.timeout_clock_hz)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generic_csd_gives_linux_read_and_write_timeouts() {
        // TAAC 0x0E = 1 ms, NSAC 1 = 100 clocks, R2W_FACTOR 2 (facts §5.4 example CSD).
        let csd = [
            0xd0, 0x0e, 0x01, 0x32, 0x0f, 0x59, 0x03, 0xff, 0xff, 0xff, 0xff, 0xef, 0x8a, 0x40,
            0x00, 0x25,
        ];
        assert_eq!(
            mmc_data_timeout(&csd, DataDirection::Read),
            (10_000_000, 1000)
        );
        assert_eq!(
            mmc_data_timeout(&csd, DataDirection::Write),
            (40_000_000, 4000)
        );
    }

    #[test]
    fn count_is_the_smallest_power_of_two_reaching_the_target() {
        // 52 MHz TMCLK: count 0 is 8192 cycles = 157 µs (Linux's integer µs).
        assert_eq!(calc_timeout_count(157, 52_000), (0, false));
        assert_eq!(calc_timeout_count(158, 52_000), (1, false));
        // 40.08 ms needs 2^21 cycles: count 8.
        let target = target_timeout_us(Some((40_000_000, 4000)), 0, 52_000_000);
        assert_eq!(target, 40_077);
        assert_eq!(calc_timeout_count(target, 52_000), (8, false));
        assert_eq!(hardware_timeout_ns(8, 52_000_000), 40_329_847);
        // Beyond 2^27 cycles Linux settles for 0xE and says so.
        assert_eq!(calc_timeout_count(3_000_000, 52_000), (0xE, true));
        assert_eq!(calc_timeout_count(0, 52_000), (0xE, true));
        assert_eq!(hardware_timeout_ns(0xE, 52_000_000), 2_581_110_154);
    }

    #[test]
    fn csd_timeouts_are_decoded_once_per_csd() {
        let generic = [
            0xd0, 0x0e, 0x01, 0x32, 0x0f, 0x59, 0x03, 0xff, 0xff, 0xff, 0xff, 0xef, 0x8a, 0x40,
            0x00, 0x25,
        ];
        let mut t = CsdTimeouts::default();
        assert_eq!(t.cached, None);
        assert_eq!(t.get(generic, DataDirection::Write), (40_000_000, 4000));
        assert_eq!(t.get(generic, DataDirection::Read), (10_000_000, 1000));
        assert_eq!(t.cached.map(|(csd, _)| csd), Some(generic));
        // A card with R2W_FACTOR 3 instead of 2: decoded again, not served from the cache.
        let mut slower = generic;
        slower[12] = (generic[12] & !0x1c) | 3 << 2;
        assert_eq!(t.get(slower, DataDirection::Write), (80_000_000, 8000));
        assert_eq!(
            t.get(slower, DataDirection::Read),
            mmc_data_timeout(&slower, DataDirection::Read)
        );
        assert_eq!(t.cached.map(|(csd, _)| csd), Some(slower));
    }

    #[test]
    fn busy_timeouts_come_from_milliseconds() {
        assert_eq!(target_timeout_us(None, 100, 52_000_000), 100_000);
        assert_eq!(target_timeout_us(Some((1_500, 0)), 7, 0), 2);
    }
}
