//! Identification, selection, status, sleep and reset: CMD0, 1, 2, 3, 4, 5, 7, 9, 10, 13,
//! 15, 39, 40, 55 — and power-on, power loss and clean shutdown.

use super::parts::busy::OpKind;
use super::parts::data::Transfer;
use super::status::r1;
use super::{registers, Card, CardState, Exec, Handled, Partition};
use crate::timing::Nanos;

/// CMD0 arguments.
const GO_IDLE_STATE: u32 = 0x0000_0000;
const GO_PRE_IDLE_STATE: u32 = 0xF0F0_F0F0;
const BOOT_INITIATION: u32 = 0xFFFF_FFFA;

/// CMD12/CMD13 argument bit 0: this is an HPI.
const HPI_FLAG: u32 = 1;

/// How power goes away.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PowerDown {
    /// The host flushed and notified (or the daemon shuts down cleanly): the cache is
    /// written back first.
    Clean,
    /// Power is cut: whatever was not durable is lost.
    Sudden,
}

impl Card {
    fn rca_matches(&self, arg: u32) -> bool {
        self.regs.rca_matches(arg)
    }

    /// Reset of the fields that a power cycle, RST_n and CMD0 return to their defaults
    /// (EXT_CSD access types ending in `_P`), and of the volatile command state.
    pub(super) fn soft_reset(&mut self) {
        self.regs.soft_reset();
        self.app_cmd = false;
        self.data.reset();
        self.erase.reset_sequence();
        self.ocr_busy_polls = 1;
        self.rpmb.reset_volatile();
    }

    /// Power-on: everything volatile returns to its default, power-on write protection
    /// ends, and the card starts in idle.
    pub(super) fn power_on_reset(&mut self) {
        self.soft_reset();
        // R/W/C_P bits: cleared by a power cycle only.
        self.regs.power_on_reset();
        self.protection.power_on_reset();
        self.busy.clear();
        self.state = CardState::Idle;
    }

    /// Take power away at card time `at` and give it back: a clean shutdown writes the
    /// cache back first; a sudden one loses what was not durable (see `cut_power`).
    /// Persistent state reloads as a real card's would; partitioning completed before the
    /// cycle takes effect now.
    pub fn power_cycle(&mut self, at: Nanos, how: PowerDown) {
        self.power_off(at, how);
        self.apply_pending_partitioning();
        self.power_on_reset();
    }

    /// Take power away at `at` (see [`Card::power_cycle`]); the card stays off (inactive)
    /// until [`Card::power_cycle`] or a new card is built on the store.
    pub fn power_off(&mut self, at: Nanos, how: PowerDown) {
        match how {
            PowerDown::Clean => {
                self.advance(at.max(self.busy_until().unwrap_or(0)));
                self.flush_cache();
            }
            PowerDown::Sudden => self.cut_power(at),
        }
        self.save_persistent();
        self.state = CardState::Ina;
    }

    /// A pulse on RST_n at card time `at` (a host's hardware reset, e.g. SDHCI Power
    /// Control bit 4 on Intel's eMMC controllers). It acts only while RST_n_FUNCTION is 1
    /// (permanently enabled); otherwise the card ignores the signal, as the spec says.
    /// An acting reset returns the card to idle with its power on: programming under way
    /// and the volatile cache are lost as on a sudden power loss (the spec lets the cache
    /// go), persistent state reloads. Returns whether the card was reset.
    pub fn hardware_reset(&mut self, at: Nanos) -> bool {
        if self.regs.byte_or_zero(crate::ext_csd::RST_N_FUNCTION) & 0x3 != 1 {
            log::debug!("RST_n at {at} ns ignored: RST_n_FUNCTION is not 1");
            return false;
        }
        log::info!(
            "RST_n at {at} ns: hardware reset, {} volatile sectors dropped",
            self.cache.len()
        );
        self.power_cycle(at, PowerDown::Sudden);
        true
    }

    // ---- the commands -------------------------------------------------------------------

    pub(super) fn cmd0_go_idle_state(&mut self, x: &mut Exec) -> Handled {
        match (self.state, x.arg) {
            (CardState::Slp, GO_IDLE_STATE | GO_PRE_IDLE_STATE) => {}
            (CardState::Slp, _) => {
                return Handled::Illegal("only CMD0(0) or CMD0(0xF0F0F0F0) wakes a sleeping card")
            }
            (CardState::PreIdle, BOOT_INITIATION) => {
                self.start_boot();
                return Handled::NoResponse;
            }
            _ => {}
        }
        // A software reset ends whatever was going on. Programming in flight completes
        // (the card is not powered down); cached data is written back, since CMD0 resets
        // CACHE_EN and nothing would flush it later.
        if let Some(end) = self.busy.until() {
            self.advance(end);
            self.busy.clear();
        }
        self.flush_cache();
        self.soft_reset();
        self.state = if x.arg == GO_PRE_IDLE_STATE {
            CardState::PreIdle
        } else {
            CardState::Idle
        };
        Handled::NoResponse
    }

    pub(super) fn cmd1_send_op_cond(&mut self, x: &mut Exec) -> Handled {
        let ocr = registers::ocr(&self.model, false);
        if x.arg == 0 {
            // Inquiry (Linux's first CMD1): report the OCR, start nothing.
            return Handled::R3(ocr);
        }
        let window = registers::OCR_VOLTAGE_WINDOW;
        if x.arg & window == 0 {
            log::info!(
                "CMD1 arg {:#010x}: no common voltage, card goes inactive",
                x.arg
            );
            self.state = CardState::Ina;
            return Handled::NoResponse;
        }
        if self.ocr_busy_polls > 0 {
            self.ocr_busy_polls -= 1;
            return Handled::R3(ocr);
        }
        self.state = CardState::Ready;
        Handled::R3(registers::ocr(&self.model, true))
    }

    pub(super) fn cmd2_all_send_cid(&mut self, _x: &mut Exec) -> Handled {
        self.state = CardState::Ident;
        Handled::R2(self.regs.cid())
    }

    pub(super) fn cmd3_set_relative_addr(&mut self, x: &mut Exec) -> Handled {
        let rca = (x.arg >> 16) as u16;
        if rca == 0 {
            // RCA 0 is reserved for "deselect all".
            x.resp_status |= r1::ERROR;
            return Handled::R1;
        }
        self.regs.set_rca(rca);
        self.state = CardState::Stby;
        Handled::R1
    }

    pub(super) fn cmd4_set_dsr(&mut self, _x: &mut Exec) -> Handled {
        // DSR_IMP is 0: the driver stage register is not implemented, the command is
        // accepted and has no effect.
        Handled::NoResponse
    }

    pub(super) fn cmd5_sleep_awake(&mut self, x: &mut Exec) -> Handled {
        if !self.rca_matches(x.arg) {
            return Handled::NoResponse;
        }
        let sleep = x.arg & (1 << 15) != 0;
        match (self.state, sleep) {
            (CardState::Stby, true) => {
                // VCC may be removed in sleep: write the cache back on the way in.
                let flush = self.flush_cache();
                let cost = self.timing.sleep_awake(self.now) + flush;
                self.state = CardState::Slp;
                self.begin_op(cost.busy_ns, OpKind::Busy);
                Handled::R1b
            }
            (CardState::Slp, false) => {
                let cost = self.timing.sleep_awake(self.now);
                self.state = CardState::Stby;
                self.begin_op(cost.busy_ns, OpKind::Busy);
                Handled::R1b
            }
            _ => Handled::Illegal("CMD5 direction does not match the state"),
        }
    }

    pub(super) fn cmd7_select_deselect_card(&mut self, x: &mut Exec) -> Handled {
        let own = self.rca_matches(x.arg) && self.regs.rca() != 0;
        match (self.state, own) {
            (CardState::Stby, true) => {
                self.state = CardState::Tran;
                Handled::R1
            }
            (CardState::Dis, true) => {
                self.state = CardState::Prg;
                Handled::R1b
            }
            (CardState::Stby, false) | (CardState::Dis, false) => Handled::NoResponse,
            (CardState::Tran | CardState::Data, false) => {
                self.data.stop();
                self.state = CardState::Stby;
                Handled::NoResponse
            }
            (CardState::Prg, false) => {
                self.state = CardState::Dis;
                Handled::NoResponse
            }
            _ => Handled::Illegal("CMD7 with own RCA while already selected"),
        }
    }

    pub(super) fn cmd9_send_csd(&mut self, x: &mut Exec) -> Handled {
        if !self.rca_matches(x.arg) {
            return Handled::NoResponse;
        }
        Handled::R2(self.regs.csd())
    }

    pub(super) fn cmd10_send_cid(&mut self, x: &mut Exec) -> Handled {
        if !self.rca_matches(x.arg) {
            return Handled::NoResponse;
        }
        Handled::R2(self.regs.cid())
    }

    /// Whether HPI is enabled and carried by command `index` (12 or 13).
    pub(super) fn hpi_carrier(&self, index: u8) -> bool {
        self.regs.hpi_carrier(index)
    }

    pub(super) fn cmd13_send_status(&mut self, x: &mut Exec) -> Handled {
        if !self.rca_matches(x.arg) {
            return Handled::NoResponse;
        }
        if x.arg & HPI_FLAG != 0 && self.state == CardState::Prg && self.hpi_carrier(13) {
            self.high_priority_interrupt();
        }
        Handled::R1
    }

    pub(super) fn cmd15_go_inactive_state(&mut self, x: &mut Exec) -> Handled {
        if self.rca_matches(x.arg) {
            self.state = CardState::Ina;
        }
        Handled::NoResponse
    }

    pub(super) fn cmd39_fast_io(&mut self, x: &mut Exec) -> Handled {
        if !self.rca_matches(x.arg) {
            return Handled::NoResponse;
        }
        // A memory device has no I/O registers: reads return 0, writes are ignored.
        let reg = (x.arg >> 8) & 0x7f;
        Handled::R4((u32::from(self.regs.rca()) << 16) | (reg << 8))
    }

    pub(super) fn cmd40_go_irq_state(&mut self, _x: &mut Exec) -> Handled {
        // The card has no interrupt source; it waits in irq until the host ends it with
        // any command (taken as the host's own R5).
        self.state = CardState::Irq;
        Handled::NoResponse
    }

    pub(super) fn cmd55_app_cmd(&mut self, x: &mut Exec) -> Handled {
        if !self.rca_matches(x.arg) {
            return Handled::NoResponse;
        }
        // eMMC defines no application commands: the next command is executed as a regular
        // one, with APP_CMD set in its status.
        self.app_cmd = true;
        Handled::R1
    }

    /// CMD0(0xFFFFFFFA) in pre-idle: stream the boot partition BOOT_PARTITION_ENABLE names.
    fn start_boot(&mut self) {
        let enable = self.regs.boot_partition_enable();
        let partition = match enable {
            1 => Partition::Boot1,
            2 => Partition::Boot2,
            7 => Partition::User,
            _ => {
                log::debug!("boot initiation with no boot partition enabled: no boot data");
                return;
            }
        };
        if !self.partitions.exists(partition) {
            return;
        }
        let sectors = self.partition_sectors(partition);
        self.data.set(Transfer::boot(partition, sectors));
        self.state = CardState::Boot;
    }
}
