//! The bus the registers set up, handed to the shared controller core as an [`MmcIos`]
//! (so the request-level model's bus rules — overspeed, width and rate mismatch, untuned
//! HS200, power cuts — apply unchanged): SD Bus Power (0x29), SDCLK from Clock Control
//! (0x2C: internal clock and SD clock enables, the v3 10-bit divider, or the Preset Value
//! the mode selects when Preset Value Enable is set), the data width (Host Control 1) and
//! the bus timing (High Speed Enable, UHS Mode Select).

use emmc_card::model::BusTiming;
use emmc_card::timing::Nanos;
use emmc_card::PowerDown;

use super::layout::*;
use super::{SdhciMmio, MIN_POWER_OFF_NS};
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
            power_mode: if self.bus_power {
                PowerMode::On
            } else {
                PowerMode::Off
            },
        }
    }

    /// Hand a changed bus to the shared core (a timing change forgets the tuning). The
    /// power is the supply as SD Bus Power writes left it, not the register (see
    /// `reset_all`). Power going off stops commands at once but cuts the card only once
    /// it has stayed off for [`MIN_POWER_OFF_NS`] (`supply_decay`); coming on after that
    /// power-cycles the card into idle, coming on sooner leaves it as it was.
    pub(super) fn apply_ios(&mut self) {
        let ios = self.register_ios();
        let was = self.host.ios();
        if ios == was {
            return;
        }
        let was_on = was.power_mode != PowerMode::Off;
        let is_on = ios.power_mode != PowerMode::Off;
        match (was_on, is_on) {
            (true, false) => {
                self.supply_falling = Some(self.now);
                self.host.set_ios_keeping_card(ios);
            }
            (false, true) if self.supply_falling.is_some() => {
                self.supply_falling = None;
                log::debug!("SDHCI: SD Bus Power off and on again within the power-off time");
                self.host.set_ios_keeping_card(ios);
            }
            _ => self.host.set_ios(&mut self.card, self.now, ios),
        }
    }

    /// Card time `now` has come: a supply off for [`MIN_POWER_OFF_NS`] has gone, and the
    /// card lost power when it went off.
    pub(super) fn supply_decay(&mut self, now: Nanos) {
        if let Some(since) = self.supply_falling {
            if now.saturating_sub(since) >= MIN_POWER_OFF_NS {
                self.supply_falling = None;
                log::debug!("SDHCI: bus power off");
                self.card.power_off(since, PowerDown::Sudden);
                self.host.tuned = false;
            }
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
