//! Resets: the Software Reset register's three (0x2F: all, CMD line, DAT line; they clear
//! themselves at once) and the device reset a PCI function reset or the server asks for.

use emmc_card::model::BusTiming;
use emmc_card::PowerDown;

use super::interrupts::Interrupts;
use super::layout::*;
use super::registers::RegisterFile;
use super::SdhciMmio;
use crate::sdhci::{MmcIos, PowerMode, SdhciError};

impl SdhciMmio {
    /// Software Reset bits written.
    pub(super) fn software_reset(&mut self, bits: u8) {
        if bits & SDHCI_RESET_ALL != 0 {
            self.reset_all();
            return;
        }
        if bits & SDHCI_RESET_CMD != 0 {
            self.reset_cmd_line();
        }
        if bits & SDHCI_RESET_DATA != 0 {
            self.reset_data_line();
        }
    }

    /// Software Reset for CMD Line: the command in flight is forgotten (the card has it
    /// already), Command Inhibit (CMD) and Command Complete clear.
    fn reset_cmd_line(&mut self) {
        self.cmd = None;
        self.ints.reset_cmd();
    }

    /// Software Reset for DAT Line: the data phase or busy wait is dropped (the card keeps
    /// whatever it was doing: DAT0 stays low while it is busy), the buffer empties, and
    /// the data interrupts clear.
    fn reset_data_line(&mut self) {
        if let Some(mut d) = self.dat.take() {
            log::debug!("CMD{}: DAT line reset", d.opcode);
            let now = self.now;
            self.end_log(&mut d, now, Some(SdhciError::DataTimeout));
        }
        self.shrink_buffer();
        self.ints.reset_data();
        self.regs.block_gap &= !0x03;
    }

    /// Software Reset for All: both lines, every register but the capabilities, presets
    /// and version to its power-on value. The Power Control register reads 0 afterwards,
    /// but the card keeps its supply until the driver writes SD Bus Power off: an
    /// embedded card's supply does not follow a controller reset (Linux's
    /// `sdhci_intel_set_power` says so of Intel's controllers, and its runtime resume
    /// resets all and expects the card still selected). The clock stops, so the card
    /// only waits.
    pub(super) fn reset_all(&mut self) {
        self.reset_data_line();
        self.cmd = None;
        self.clear_registers();
        self.apply_ios();
    }

    fn clear_registers(&mut self) {
        self.regs = RegisterFile::default();
        self.ints = Interrupts::default();
        self.tuning_tries = 0;
        self.last_sbc = None;
    }

    /// A device (PCI function) reset: everything to its power-on value, and the card
    /// powered down and up again cleanly (its cache written back first). SD Bus Power is
    /// off afterwards, as after power-on: the guest's driver powers the bus up again.
    pub fn reset(&mut self) {
        self.cmd = None;
        self.bus_power = false;
        self.supply_falling = None;
        if let Some(mut d) = self.dat.take() {
            let now = self.now;
            self.end_log(&mut d, now, Some(SdhciError::DataTimeout));
        }
        self.buf = Vec::new();
        self.clear_registers();
        self.card.power_cycle(self.now, PowerDown::Clean);
        self.bus_off();
    }

    /// The shared core's bus set to what power-on registers say (no power, no clock),
    /// without touching the card.
    pub(super) fn bus_off(&mut self) {
        self.host.ios = MmcIos {
            clock: 0,
            bus_width: 1,
            timing: BusTiming::Legacy,
            power_mode: PowerMode::Off,
        };
        self.host.actual_clock = 0;
        self.host.tuned = false;
    }
}
