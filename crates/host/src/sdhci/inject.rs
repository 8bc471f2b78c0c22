//! The fault plan at the controller: every command is offered to the injector before it
//! goes on the bus ([`Run::consult_faults`]); a command-level bus error comes back to the
//! exchange, card-level effects are applied to the card at once, and data-phase and busy
//! effects wait in [`PendingFaults`] for the step they act on.

use emmc_card::timing::Nanos;

use super::run::Run;
use super::{DataDirection, MmcCommand, SdhciError};
use crate::fault::{self, CommandInfo, Effect};

/// Injected effects waiting for the data phase or the busy they act on.
#[derive(Debug, Clone, Default, PartialEq)]
pub(super) struct PendingFaults {
    /// A data CRC error or a stalled transfer for the data phase (the first that fired).
    pub(super) data: Option<Effect>,
    /// Bits to flip in the data read.
    pub(super) bit_flips: u32,
    /// Extra busy or access time, and whether it yields to HPI (stuck busy).
    pub(super) extra_busy: Option<(Nanos, bool)>,
}

impl PendingFaults {
    pub(super) fn add_extra_busy(&mut self, ns: Nanos) {
        let (prev, stuck) = self.extra_busy.unwrap_or((0, false));
        self.extra_busy = Some((prev.saturating_add(ns), stuck));
    }
}

impl Run<'_> {
    /// Offer the command to the fault injector; apply the card-level effects that fire,
    /// keep the data-phase ones, and return a command-level bus error to produce.
    pub(super) fn consult_faults(&mut self, cmd: &MmcCommand) -> Option<SdhciError> {
        let info = self.command_info(cmd);
        let effects = self.host.faults.as_deref_mut()?.on_command(&info);
        let mut bus = None;
        for effect in effects {
            match effect {
                Effect::CmdCrc => bus = bus.or(Some(SdhciError::CmdCrc)),
                Effect::CmdTimeout => bus = bus.or(Some(SdhciError::CmdTimeout)),
                Effect::CmdEndBit => bus = bus.or(Some(SdhciError::CmdEndBit)),
                Effect::DataCrc | Effect::DataTimeout => {
                    self.injected.data = self.injected.data.take().or(Some(effect));
                }
                Effect::BitFlip { bits } => {
                    self.injected.bit_flips = self.injected.bit_flips.saturating_add(bits)
                }
                Effect::R1Error { .. } => self.card.inject_r1_error(effect.r1_bits()),
                Effect::PackedFailure { index } => {
                    self.card.inject_packed_failure(index as usize);
                }
                Effect::StuckBusy { max_ns } => {
                    let ns = max_ns.unwrap_or(fault::plan::STUCK_BUSY_DEFAULT_MAX_NS);
                    self.injected.extra_busy = Some((ns, true));
                }
                Effect::Latency { ns } => self.injected.add_extra_busy(ns),
                Effect::GcStorm { ns, work_ns } => {
                    self.card.add_background_work(work_ns.unwrap_or(ns));
                    self.injected.add_extra_busy(ns);
                }
                Effect::UrgentBkops { level } => {
                    self.card.raise_bkops_level(level);
                }
                Effect::WearOut {
                    life_time_est_a,
                    life_time_est_b,
                    pre_eol_info,
                } => self
                    .card
                    .set_wear(life_time_est_a, life_time_est_b, pre_eol_info),
                Effect::PowerLoss { at_ns, restore } => {
                    let at = at_ns.unwrap_or(self.now).min(self.now);
                    self.card.sudden_power_loss(at, restore);
                    self.host.tuned = false;
                }
            }
        }
        bus
    }

    /// What the fault injector is told about a command.
    fn command_info(&self, cmd: &MmcCommand) -> CommandInfo {
        let (direction, bytes, blocks, packed) = match self.data_cmd {
            Some((dir, blksz, blocks, packed)) => (
                match dir {
                    DataDirection::Read => fault::Direction::Read,
                    DataDirection::Write => fault::Direction::Write,
                },
                u64::from(blksz) * u64::from(blocks),
                u64::from(blocks),
                packed,
            ),
            None => (fault::Direction::None, 0, 0, false),
        };
        let opcode = cmd.opcode & 0x3F;
        let lba = match opcode {
            17 | 18 | 24 | 25 if !packed => Some(blocks.max(1)),
            35 | 36 => Some(1),
            _ => None,
        }
        .map(|count| {
            let lba = if self.card.model().sector_addressing() {
                u64::from(cmd.arg)
            } else {
                u64::from(cmd.arg) / 512
            };
            (lba, count)
        });
        CommandInfo {
            opcode,
            arg: cmd.arg,
            direction,
            lba,
            bytes,
            now: self.now,
            packed,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn extra_busy_adds_up_and_a_stuck_busy_stays_stuck() {
        let mut p = PendingFaults::default();
        p.add_extra_busy(1_000);
        p.add_extra_busy(2_000);
        assert_eq!(p.extra_busy, Some((3_000, false)));
        // Latency on top of a stuck busy lengthens it and it still yields only to HPI.
        let mut stuck = PendingFaults {
            extra_busy: Some((5_000, true)),
            ..PendingFaults::default()
        };
        stuck.add_extra_busy(Nanos::MAX);
        assert_eq!(stuck.extra_busy, Some((Nanos::MAX, true)));
        assert!(stuck.data.is_none() && stuck.bit_flips == 0);
    }
}
