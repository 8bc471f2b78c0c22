//! What the controller says about itself: Capabilities (0x40, 0x44), Maximum Current
//! (0x48) and the Preset Value registers (0x60–0x6F), made from the device model's host
//! profile (its controller part: clock, width, bus timing) and the [`SdhciConfig`]
//! (time-out clock, largest block, 64-bit ADMA2). All read-only for the guest.

use emmc_card::model::{BusTiming, HostProfile};

use super::layout::*;
use crate::sdhci::SdhciConfig;

/// The controller's read-only self-description. The fields are the raw register values;
/// a server may adjust them after [`Capabilities::for_profile`] (say, to offer SDMA only)
/// before handing them to [`SdhciMmio::set_capabilities`](super::SdhciMmio::set_capabilities).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Capabilities {
    /// Capabilities [31:0] (0x40).
    pub caps: u32,
    /// Capabilities [63:32] (0x44).
    pub caps1: u32,
    /// Maximum Current Capabilities (0x48).
    pub max_current: u32,
    /// Preset Value registers 0x60, 0x62, … 0x6E.
    pub presets: [u16; 8],
}

/// SDCLK of each Preset Value register, in register order (see the module documentation
/// of `mmio`, "Decisions"): initialization 400 kHz, default speed 26 MHz, high speed
/// 52 MHz, SDR12 25 MHz, SDR25 50 MHz, SDR50 100 MHz, SDR104 (HS200) 200 MHz, DDR50
/// (DDR52) 52 MHz.
const PRESET_HZ: [u64; 8] = [
    400_000,
    26_000_000,
    52_000_000,
    25_000_000,
    50_000_000,
    100_000_000,
    200_000_000,
    52_000_000,
];

/// Maximum current advertised for each supported voltage: 800 mA.
const MAX_CURRENT_MA: u32 = 800;

impl Capabilities {
    /// An eMMC-only SDHCI 3.00 controller for `host`'s bus: base clock = the profile's
    /// clock (whole MHz), 8-bit support when the profile's bus is 8 lines wide, ADMA2 and
    /// SDMA, high speed, 3.3 V and 1.8 V, 64-bit system bus when `config.adma.addr64`,
    /// an embedded slot; SDR104 + SDR50 (with "use tuning for SDR50") when the profile
    /// runs HS200, DDR50 when it runs DDR52.
    pub fn for_profile(host: &HostProfile, config: &SdhciConfig) -> Capabilities {
        let base_mhz = (host.clock_hz / 1_000_000).clamp(1, 255) as u32;
        let timeout = encode_timeout_clock(config.timeout_clock_hz);
        let max_block = match config.max_block_len {
            0..=512 => 0,
            513..=1024 => 1,
            _ => 2,
        };
        let mut caps = timeout
            | base_mhz << SDHCI_CLOCK_V3_BASE_SHIFT
            | max_block << SDHCI_MAX_BLOCK_SHIFT
            | SDHCI_CAN_DO_ADMA2
            | SDHCI_CAN_DO_HISPD
            | SDHCI_CAN_DO_SDMA
            | SDHCI_CAN_VDD_330
            | SDHCI_CAN_VDD_180
            | SDHCI_SLOT_TYPE_EMBEDDED << SDHCI_SLOT_TYPE_SHIFT;
        if host.bus_width == 8 {
            caps |= SDHCI_CAN_DO_8BIT;
        }
        if config.adma.addr64 {
            caps |= SDHCI_CAN_64BIT;
        }
        let caps1 = match host.timing {
            BusTiming::Hs200 => SDHCI_SUPPORT_SDR104 | SDHCI_SUPPORT_SDR50 | SDHCI_USE_SDR50_TUNING,
            BusTiming::Ddr52 => SDHCI_SUPPORT_DDR50,
            BusTiming::Legacy | BusTiming::Hs => 0,
        };
        let current = MAX_CURRENT_MA / SDHCI_MAX_CURRENT_MULTIPLIER;
        let max_current =
            current << SDHCI_MAX_CURRENT_330_SHIFT | current << SDHCI_MAX_CURRENT_180_SHIFT;
        let base_hz = u64::from(base_mhz) * 1_000_000;
        let presets = PRESET_HZ.map(|hz| preset_divider(base_hz, hz));
        Capabilities {
            caps,
            caps1,
            max_current,
            presets,
        }
    }

    /// The base clock for SDCLK (Capabilities [15:8], MHz).
    pub fn base_clock_hz(&self) -> u64 {
        u64::from((self.caps & SDHCI_CLOCK_V3_BASE_MASK) >> SDHCI_CLOCK_V3_BASE_SHIFT) * 1_000_000
    }

    /// TMCLK, the data time-out counter's clock (Capabilities [7:0]).
    pub fn timeout_clock_hz(&self) -> u64 {
        let n = u64::from(self.caps & SDHCI_TIMEOUT_CLK_MASK);
        if self.caps & SDHCI_TIMEOUT_CLK_UNIT != 0 {
            n * 1_000_000
        } else {
            n * 1000
        }
    }

    /// The largest block (Capabilities [17:16]).
    pub fn max_block_len(&self) -> u32 {
        512 << ((self.caps & SDHCI_MAX_BLOCK_MASK) >> SDHCI_MAX_BLOCK_SHIFT).min(2)
    }

    pub fn has(&self, bit: u32) -> bool {
        self.caps & bit != 0
    }

    /// Capabilities as one 64-bit register, as the specification lays it out.
    pub fn as_u64(&self) -> u64 {
        u64::from(self.caps1) << 32 | u64::from(self.caps)
    }
}

/// Capabilities [7:0]: TMCLK in MHz when it is at least 1 MHz (1..=63), else in kHz.
fn encode_timeout_clock(hz: u64) -> u32 {
    if hz >= 1_000_000 {
        (hz / 1_000_000).clamp(1, 63) as u32 | SDHCI_TIMEOUT_CLK_UNIT
    } else {
        (hz / 1000).clamp(1, 63) as u32
    }
}

/// The Preset Value for `hz` from `base_hz`: divider N with base / (2N) ≤ hz (N = 0 for
/// the base clock itself), driver type B, divided clock mode.
fn preset_divider(base_hz: u64, hz: u64) -> u16 {
    if base_hz <= hz {
        return 0;
    }
    let n = base_hz.div_ceil(2 * hz.max(1)).clamp(1, 1023);
    n as u16 & SDHCI_PRESET_SDCLK_FREQ_MASK
}

#[cfg(test)]
mod tests {
    use super::*;

    fn profile(name: &str) -> HostProfile {
        emmc_card::model::DeviceModel::load(name)
            .unwrap()
            .host
            .controller_only()
    }

    #[test]
    fn the_generic_host_is_an_8_bit_52_mhz_adma2_controller() {
        let c = Capabilities::for_profile(&profile("generic-emmc45"), &SdhciConfig::default());
        assert_eq!(c.base_clock_hz(), 52_000_000);
        assert_eq!(c.timeout_clock_hz(), 52_000_000);
        assert_eq!(c.max_block_len(), 2048);
        for bit in [
            SDHCI_CAN_DO_8BIT,
            SDHCI_CAN_DO_ADMA2,
            SDHCI_CAN_DO_SDMA,
            SDHCI_CAN_DO_HISPD,
            SDHCI_CAN_VDD_330,
            SDHCI_CAN_VDD_180,
            SDHCI_CAN_64BIT,
        ] {
            assert!(c.has(bit), "{bit:#x}");
        }
        assert!(!c.has(SDHCI_CAN_DO_ADMA1) && !c.has(SDHCI_CAN_VDD_300));
        assert_eq!(c.caps >> SDHCI_SLOT_TYPE_SHIFT, SDHCI_SLOT_TYPE_EMBEDDED);
        assert_eq!(c.caps1, 0, "HS at 52 MHz: no UHS modes");
        // 200 mA units of 4 mA at 3.3 V and 1.8 V.
        assert_eq!(c.max_current, 200 | 200 << 16);
        // Presets from 52 MHz: 400 kHz is N = 65, 26 MHz N = 1, 52 MHz the base clock.
        assert_eq!(c.presets[0], 65);
        assert_eq!(c.presets[1], 1);
        assert_eq!(c.presets[2], 0);
        assert_eq!(c.presets[7], 0);
    }

    #[test]
    fn hs200_and_ddr52_profiles_advertise_their_uhs_modes() {
        let hs200 = Capabilities::for_profile(&profile("ideal"), &SdhciConfig::default());
        assert_eq!(hs200.base_clock_hz(), 200_000_000);
        assert_eq!(
            hs200.caps1,
            SDHCI_SUPPORT_SDR104 | SDHCI_SUPPORT_SDR50 | SDHCI_USE_SDR50_TUNING
        );
        // 52 MHz from 200: N = 2 (50 MHz); SDR104 the base clock.
        assert_eq!(hs200.presets[2], 2);
        assert_eq!(hs200.presets[6], 0);
        let ddr = Capabilities::for_profile(&profile("msm-emmc45-ddr50"), &SdhciConfig::default());
        assert_eq!(ddr.caps1, SDHCI_SUPPORT_DDR50);
        assert_eq!(ddr.base_clock_hz(), 50_000_000);
        let narrow = SdhciConfig {
            adma: crate::sdhci::AdmaLimits {
                addr64: false,
                ..SdhciConfig::default().adma
            },
            timeout_clock_hz: 33_000,
            max_block_len: 512,
            ..SdhciConfig::default()
        };
        let c = Capabilities::for_profile(&profile("generic-emmc45"), &narrow);
        assert!(!c.has(SDHCI_CAN_64BIT));
        assert_eq!(c.timeout_clock_hz(), 33_000);
        assert_eq!(c.max_block_len(), 512);
    }
}
