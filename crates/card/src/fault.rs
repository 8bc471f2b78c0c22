//! The card's side of fault injection (the host crate's `fault` module): the narrow entry points a fault
//! plan uses to make the card misbehave the way a real one does, each observable through
//! the spec's own channels (R1 bits, EXCEPTION_EVENTS_STATUS, PACKED_COMMAND_STATUS,
//! BKOPS_STATUS, DAT0 busy, EXT_CSD health fields, durability).

use super::command::Command;
use super::{r1, Card, CardState, PowerDown, Response};
use crate::timing::Nanos;

/// PRE_EOL_INFO (EXT_CSD[267], JESD84-B50; reserved in 4.5, read by Linux from
/// EXT_CSD_REV 7).
pub const PRE_EOL_INFO: usize = 267;
/// DEVICE_LIFE_TIME_EST_TYP_A (EXT_CSD[268]).
pub const DEVICE_LIFE_TIME_EST_TYP_A: usize = 268;
/// DEVICE_LIFE_TIME_EST_TYP_B (EXT_CSD[269]).
pub const DEVICE_LIFE_TIME_EST_TYP_B: usize = 269;

/// Background work added per step while raising the BKOPS level.
const BKOPS_STEP_NS: Nanos = 1_000_000;
/// Never add more than this much background work to reach a level.
const BKOPS_MAX_NS: Nanos = 3_600_000_000_000;

impl Card {
    /// Refuse the next R1/R1b command with `bits` (card status error bits) in its
    /// response: the command is not executed and the card stays in its state.
    pub fn inject_r1_error(&mut self, bits: u32) {
        self.faults.refuse_next(bits);
    }

    /// The dispatcher's side of [`Card::inject_r1_error`].
    pub(super) fn refuse_with_fault(&mut self, cmd: Command, state: CardState) -> Response {
        let bits = self.faults.take_refusal();
        log::info!(
            "fault: CMD{} arg {:#010x} refused with {}",
            cmd.index,
            cmd.arg,
            r1::describe(bits)
        );
        let mut s = self.regs.take_reported() | bits | (state.number() << r1::CURRENT_STATE_SHIFT);
        if self.ready_for_data() {
            s |= r1::READY_FOR_DATA;
        }
        if self.exception_event() {
            s |= r1::EXCEPTION_EVENT;
        }
        if self.protection.locked() {
            s |= r1::DEVICE_IS_LOCKED;
        }
        Response::R1(s)
    }

    /// Fail entry `index` (1-based) of the next packed write: the entries before it are
    /// programmed, PACKED_FAILURE is raised with PACKED_COMMAND_STATUS Error | Indexed
    /// Error and PACKED_FAILURE_INDEX = `index`, and ERROR appears in the next status.
    /// An index beyond the header's entries fails nothing.
    pub fn inject_packed_failure(&mut self, index: usize) {
        self.faults.fail_packed_entry(index);
    }

    /// Lengthen the current busy period (DAT0 low) by `ns`. `stuck`: the lengthened
    /// operation yields to HPI whatever its kind. Returns false when the card is not busy.
    pub fn extend_busy(&mut self, ns: Nanos, stuck: bool) -> bool {
        if !self.busy.extend(ns, stuck) {
            return false;
        }
        log::info!("fault: busy lengthened by {ns} ns (stuck: {stuck})");
        true
    }

    /// Add background work until BKOPS_STATUS reaches `level` (2: URGENT_BKOPS is raised
    /// in EXCEPTION_EVENTS_STATUS and R1 EXCEPTION_EVENT; 3: critical). Returns the work
    /// added. A card without BKOPS support reports nothing.
    pub fn raise_bkops_level(&mut self, level: u8) -> Nanos {
        let mut added: Nanos = 0;
        let mut step = BKOPS_STEP_NS;
        while self.bkops_level() < level && added < BKOPS_MAX_NS {
            self.add_background_work(step);
            added = added.saturating_add(step);
            step = step.saturating_mul(2);
        }
        log::info!(
            "fault: {added} ns of background work added, BKOPS_STATUS {}",
            self.bkops_level()
        );
        added
    }

    /// Set the health fields: DEVICE_LIFE_TIME_EST_TYP_A/B (0x01: 0–10 % of the life
    /// used … 0x0B: exceeded) and PRE_EOL_INFO (1 normal, 2 warning, 3 urgent).
    pub fn set_wear(&mut self, life_time_est_a: u8, life_time_est_b: u8, pre_eol_info: u8) {
        self.regs
            .set_byte(DEVICE_LIFE_TIME_EST_TYP_A, life_time_est_a);
        self.regs
            .set_byte(DEVICE_LIFE_TIME_EST_TYP_B, life_time_est_b);
        self.regs.set_byte(PRE_EOL_INFO, pre_eol_info);
        log::info!(
            "fault: wear: life time A {life_time_est_a:#04x}, B {life_time_est_b:#04x}, pre-EOL {pre_eol_info}"
        );
    }

    /// A sudden power loss at card time `at` (or at the card's latest time, if that is
    /// later): what was durable stays, the volatile cache and unfinished programming are
    /// lost as [`Card::power_off`] describes. `restore`: power returns at once and the card
    /// is in idle (the host must initialise it again); otherwise it stays off.
    pub fn sudden_power_loss(&mut self, at: Nanos, restore: bool) {
        let lost = self.cache.len();
        log::warn!(
            "fault: power loss at {at} ns, {lost} volatile sectors lost, power {}",
            if restore { "restored" } else { "stays off" }
        );
        if restore {
            self.power_cycle(at, PowerDown::Sudden);
        } else {
            self.power_off(at, PowerDown::Sudden);
        }
    }

    /// The EXT_CSD health byte at `offset` as it is stored (for tests and tools).
    pub fn ext_csd_byte(&self, offset: usize) -> u8 {
        self.regs.byte_or_zero(offset)
    }
}
