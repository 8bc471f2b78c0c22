//! The bus the registers set up, handed to the shared controller core as an [`MmcIos`]
//! (so the request-level model's bus rules — overspeed, width and rate mismatch, untuned
//! HS200, power cuts — apply unchanged): SD Bus Power (0x29), SDCLK from Clock Control
//! (0x2C: internal clock and SD clock enables, the v3 10-bit divider, or the Preset Value
//! the mode selects when Preset Value Enable is set), the data width (Host Control 1) and
//! the bus timing (High Speed Enable, UHS Mode Select).

use emmc_card::model::BusTiming;

use super::layout::*;
use super::SdhciMmio;
use crate::sdhci::{MmcIos, PowerMode};

impl SdhciMmio {
    /// SDCLK as the registers make it (0: stopped).
    pub(super) fn sd_clock_hz(&self) -> u64 {
        let c = self.regs.clock_control;
        if c & SDHCI_CLOCK_INT_EN == 0 || c & SDHCI_CLOCK_CARD_EN == 0 {
            return 0;
        }
        let n = if self.regs.host_control2 & SDHCI_CTRL_PRESET_VAL_ENABLE != 0 {
            self.caps.presets[self.preset_index()] & SDHCI_PRESET_SDCLK_FREQ_MASK
        } else {
            clock_divider(c)
        };
        let base = self.caps.base_clock_hz();
        if n == 0 {
            base
        } else {
            base / (2 * u64::from(n))
        }
    }

    /// Which Preset Value register applies: a UHS mode's with 1.8 V signalling, else high
    /// speed or default speed by High Speed Enable.
    pub(super) fn preset_index(&self) -> usize {
        let hc2 = self.regs.host_control2;
        if hc2 & SDHCI_CTRL_VDD_180 != 0 {
            match hc2 & SDHCI_CTRL_UHS_MASK {
                SDHCI_CTRL_UHS_SDR12 => return 3,
                SDHCI_CTRL_UHS_SDR25 => return 4,
                SDHCI_CTRL_UHS_SDR50 => return 5,
                SDHCI_CTRL_UHS_SDR104 => return 6,
                SDHCI_CTRL_UHS_DDR50 => return 7,
                _ => {}
            }
        }
        if self.regs.host_control & SDHCI_CTRL_HISPD != 0 {
            2
        } else {
            1
        }
    }

    /// The bus timing: UHS Mode Select SDR104 is HS200 and DDR50 is DDR52 (as Linux
    /// programs them for eMMC), whatever the signalling voltage; otherwise High Speed
    /// Enable chooses high speed or backward-compatible timing.
    fn timing(&self) -> BusTiming {
        match self.regs.host_control2 & SDHCI_CTRL_UHS_MASK {
            SDHCI_CTRL_UHS_SDR104 => BusTiming::Hs200,
            SDHCI_CTRL_UHS_DDR50 => BusTiming::Ddr52,
            _ if self.regs.host_control & SDHCI_CTRL_HISPD != 0 => BusTiming::Hs,
            _ => BusTiming::Legacy,
        }
    }

    /// The bus the registers describe.
    pub(super) fn register_ios(&self) -> MmcIos {
        let hc1 = self.regs.host_control;
        let bus_width = if hc1 & SDHCI_CTRL_8BITBUS != 0 {
            8
        } else if hc1 & SDHCI_CTRL_4BITBUS != 0 {
            4
        } else {
            1
        };
        MmcIos {
            clock: self.sd_clock_hz(),
            bus_width,
            timing: self.timing(),
            power_mode: if self.regs.power_control & SDHCI_POWER_ON != 0 {
                PowerMode::On
            } else {
                PowerMode::Off
            },
        }
    }

    /// Hand a changed bus to the shared core (power going off cuts the card; coming on
    /// power-cycles it into idle; a timing change forgets the tuning).
    pub(super) fn apply_ios(&mut self) {
        let ios = self.register_ios();
        if ios != self.host.ios() {
            self.host.set_ios(&mut self.card, self.now, ios);
        }
    }

    /// Whether Power Control value `v` selects a voltage the capabilities offer.
    pub(super) fn voltage_supported(&self, v: u8) -> bool {
        let bit = match v & SDHCI_POWER_VOLTAGE_MASK {
            SDHCI_POWER_330 => SDHCI_CAN_VDD_330,
            SDHCI_POWER_300 => SDHCI_CAN_VDD_300,
            SDHCI_POWER_180 => SDHCI_CAN_VDD_180,
            _ => return false,
        };
        self.caps.has(bit)
    }
}
