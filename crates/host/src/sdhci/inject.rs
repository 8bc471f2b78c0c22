//! The fault plan at the controller: every command is offered to the injector before it
//! goes on the bus ([`Run::consult_faults`]); a command-level bus error comes back to the
//! exchange, card-level effects are applied to the card at once, and data-phase and busy
//! effects wait in the request in flight for the step they act on.

use emmc_card::timing::Nanos;

use super::run::Run;
use super::{DataDirection, MmcCommand, SdhciError};
use crate::fault::{self, CommandInfo, Effect};

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
                    self.data_fault = self.data_fault.take().or(Some(effect));
                }
                Effect::BitFlip { bits } => self.bit_flips = self.bit_flips.saturating_add(bits),
                Effect::R1Error { .. } => self.card.inject_r1_error(effect.r1_bits()),
                Effect::PackedFailure { index } => {
                    self.card.inject_packed_failure(index as usize);
                }
                Effect::StuckBusy { max_ns } => {
                    let ns = max_ns.unwrap_or(fault::plan::STUCK_BUSY_DEFAULT_MAX_NS);
                    self.extra_busy = Some((ns, true));
                }
                Effect::Latency { ns } => self.add_extra_busy(ns),
                Effect::GcStorm { ns, work_ns } => {
                    self.card.add_background_work(work_ns.unwrap_or(ns));
                    self.add_extra_busy(ns);
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

    fn add_extra_busy(&mut self, ns: Nanos) {
        let (prev, stuck) = self.extra_busy.unwrap_or((0, false));
        self.extra_busy = Some((prev.saturating_add(ns), stuck));
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
