//! The controller's configuration and the bus settings the driver chooses: Linux's
//! `struct mmc_ios` and `sdhci_set_ios`, the SD clock the controller makes of a requested
//! clock (`sdhci_calc_clk`), and whether what the host drives matches what the card is
//! set to — the source of the bus errors for overspeed, width, data rate and untuned
//! HS200 (see the module documentation, "Decisions").

use emmc_card::model::{BusTiming, HostProfile};
use emmc_card::timing::{Bus, Nanos};
use emmc_card::{Card, PowerDown};

use super::tuning::TUNING_NEEDED_ABOVE_HZ;
use super::{AdmaLimits, SdhciHost};

/// Linux's `ios.power_mode`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PowerMode {
    Off,
    Up,
    On,
}

/// Bus settings the driver chooses (`struct mmc_ios`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MmcIos {
    /// Requested card clock in Hz (0: SD clock stopped).
    pub clock: u64,
    /// Data lines: 1, 4 or 8 (anything else is 1: Host Control 1 encodes only these).
    pub bus_width: u8,
    pub timing: BusTiming,
    pub power_mode: PowerMode,
}

impl MmcIos {
    /// Powered, 400 kHz, one line, backward-compatible timing: card identification.
    pub const IDENTIFICATION: MmcIos = MmcIos {
        clock: 400_000,
        bus_width: 1,
        timing: BusTiming::Legacy,
        power_mode: PowerMode::On,
    };
}

/// How SDCLK is made from the requested clock.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SdClock {
    /// The requested clock exactly (a platform clock set through the host's own clock
    /// driver, as many SoC SDHCI glue drivers do).
    Exact,
    /// The v3 10-bit divided clock mode: base / 1 or base / (2N), the smallest divisor not
    /// above the request (`sdhci_calc_clk`).
    Divided { base_hz: u64 },
}

/// The controller's capabilities and the choices its Linux driver makes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SdhciConfig {
    pub sd_clock: SdClock,
    /// TMCLK, the data time-out counter's clock (Capabilities [7:0]).
    pub timeout_clock_hz: u64,
    /// Largest block size (Capabilities [17:16]: 512, 1024 or 2048).
    pub max_block_len: u32,
    pub adma: AdmaLimits,
    /// Auto CMD12 for multi-block transfers without CMD23 (Linux `SDHCI_AUTO_CMD12`, set
    /// only by a quirk).
    pub auto_cmd12: bool,
    /// Auto CMD23 for requests with a CMD23 (Linux `SDHCI_AUTO_CMD23`: v3 hosts using ADMA).
    pub auto_cmd23: bool,
    /// The controller may switch its data time-out off for targets beyond its counter
    /// (Linux `SDHCI_QUIRK2_DISABLE_HW_TIMEOUT`); the driver's software timer then applies.
    pub disable_hw_timeout: bool,
    /// Host time per request before its first command.
    pub request_overhead_ns: Nanos,
}

impl Default for SdhciConfig {
    /// An eMMC-only v3 host with 64-bit ADMA2: exact clock, TMCLK 52 MHz (as QEMU's
    /// default capabilities), 2048-byte blocks, Linux's 257-descriptor table, Auto CMD23.
    fn default() -> Self {
        SdhciConfig {
            sd_clock: SdClock::Exact,
            timeout_clock_hz: 52_000_000,
            max_block_len: 2048,
            adma: AdmaLimits {
                table_len: 128 * 2 + 1,
                max_len: 65_536,
                addr64: true,
            },
            auto_cmd12: false,
            auto_cmd23: true,
            disable_hw_timeout: false,
            request_overhead_ns: 0,
        }
    }
}

impl SdhciConfig {
    /// The default controller with a model's per-request host overhead.
    pub fn for_model(host: &HostProfile) -> SdhciConfig {
        SdhciConfig {
            request_overhead_ns: host.request_overhead_ns,
            ..SdhciConfig::default()
        }
    }
}

impl SdhciHost {
    pub fn ios(&self) -> MmcIos {
        self.ios
    }

    /// The SDCLK the controller makes of the requested clock (Linux `actual_clock`).
    pub fn actual_clock(&self) -> u64 {
        self.actual_clock
    }

    /// The bus as the current ios drive it.
    pub fn bus(&self) -> Bus {
        Bus::new(
            self.actual_clock,
            self.ios.bus_width,
            self.ios.timing == BusTiming::Ddr52,
        )
    }

    pub(super) fn sdclk(&self, requested: u64) -> u64 {
        match self.config.sd_clock {
            SdClock::Exact => requested,
            SdClock::Divided { base_hz } => {
                if requested == 0 {
                    0
                } else if base_hz <= requested {
                    base_hz
                } else {
                    let mut div = 2;
                    while div < 2046 && base_hz / div > requested {
                        div += 2;
                    }
                    base_hz / div
                }
            }
        }
    }

    /// Apply the driver's bus settings. Power going off cuts the card's power; power coming
    /// back power-cycles it into idle. A timing change or power loss forgets the tuning.
    pub fn set_ios(&mut self, card: &mut Card, now: Nanos, ios: MmcIos) {
        let mut ios = ios;
        if !matches!(ios.bus_width, 1 | 4 | 8) {
            ios.bus_width = 1;
        }
        let was_on = self.ios.power_mode != PowerMode::Off;
        let is_on = ios.power_mode != PowerMode::Off;
        if was_on && !is_on {
            log::debug!("SDHCI: bus power off");
            card.power_off(now, PowerDown::Sudden);
            self.tuned = false;
        } else if !was_on && is_on {
            log::debug!("SDHCI: bus power on");
            card.power_cycle(now, PowerDown::Sudden);
            self.tuned = false;
        }
        if ios.timing != self.ios.timing {
            self.tuned = false;
        }
        self.ios = ios;
        self.actual_clock = self.sdclk(ios.clock);
        log::trace!(
            "SDHCI ios: {} Hz (actual {}), {}-bit, {:?}, {:?}",
            ios.clock,
            self.actual_clock,
            ios.bus_width,
            ios.timing,
            ios.power_mode
        );
    }

    /// Apply bus settings without touching the card's power, whatever `ios.power_mode`
    /// says: for a controller that decides itself when the card's supply has really gone
    /// (the register-level model's power-off time). Commands see the new power mode.
    pub(crate) fn set_ios_keeping_card(&mut self, ios: MmcIos) {
        let mut ios = ios;
        if !matches!(ios.bus_width, 1 | 4 | 8) {
            ios.bus_width = 1;
        }
        if ios.timing != self.ios.timing {
            self.tuned = false;
        }
        self.ios = ios;
        self.actual_clock = self.sdclk(ios.clock);
    }

    /// The clock the card's HS_TIMING allows.
    fn card_max_clock(card: &Card) -> u64 {
        let (hs_timing, bus_width) = card.bus_config();
        match hs_timing & 0x0F {
            0 => 26_000_000,
            1 => {
                let device_type = card.model().ext_csd.device_type;
                let ddr = matches!(bus_width & 0x0F, 5 | 6);
                if ddr || device_type & emmc_card::ext_csd::DEVICE_TYPE_HS_52 != 0 {
                    52_000_000
                } else {
                    26_000_000
                }
            }
            _ => 200_000_000,
        }
    }

    /// 0: within the card's timing; 1: the host cannot sample the card; 2: neither side
    /// can sample the other.
    pub(super) fn overspeed(&self, card: &Card) -> u8 {
        let max = Self::card_max_clock(card);
        if self.actual_clock <= max {
            0
        } else if self.actual_clock <= 2 * max {
            1
        } else {
            2
        }
    }

    /// Why data blocks would be garbage on the other side, if they would.
    pub(super) fn data_bus_problem(
        &self,
        card: &Card,
        read: bool,
        tuning: bool,
    ) -> Option<&'static str> {
        let (_, bus_width) = card.bus_config();
        let (width, ddr) = match bus_width & 0x0F {
            1 => (4, false),
            2 => (8, false),
            5 => (4, true),
            6 => (8, true),
            _ => (1, false),
        };
        if width != self.ios.bus_width {
            return Some("bus width differs from the card's BUS_WIDTH");
        }
        if ddr != (self.ios.timing == BusTiming::Ddr52) {
            return Some("data rate differs from the card's BUS_WIDTH");
        }
        if self.overspeed(card) > 0 {
            return Some("clock above the card's timing");
        }
        if read
            && !tuning
            && self.ios.timing == BusTiming::Hs200
            && self.actual_clock > TUNING_NEEDED_ABOVE_HZ
            && !self.tuned
        {
            return Some("HS200 sampling point not tuned");
        }
        None
    }
}
