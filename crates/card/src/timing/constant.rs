//! The constant-cost model: every operation of a kind costs the same, whatever the card
//! did before. Enough to exercise busy states, HPI and BKOPS; the flash models replace it
//! where the history of writes matters. With all parameters zero it is an ideal card.

use super::{Cost, Erase, Nanos, Program, ProgramTarget, SwitchKind, Timing};
use crate::model::ConstantTimingModel;

#[derive(Debug, Clone)]
pub struct ConstantTiming {
    p: ConstantTimingModel,
}

impl ConstantTiming {
    pub fn new(p: ConstantTimingModel) -> Self {
        ConstantTiming { p }
    }

    fn per_block(per: u64, count: u64) -> Nanos {
        per.saturating_mul(count)
    }
}

impl Timing for ConstantTiming {
    fn read(&mut self, _now: Nanos, _sector: u64, count: u32) -> Cost {
        Cost::busy(
            self.p
                .read_access_ns
                .saturating_add(Self::per_block(self.p.read_block_ns, count.into())),
        )
    }

    fn program(&mut self, _now: Nanos, op: &Program) -> Cost {
        match op.target {
            ProgramTarget::Cache => {
                Cost::busy(Self::per_block(self.p.cache_block_ns, op.count.into()))
            }
            ProgramTarget::Medium => Cost {
                busy_ns: self
                    .p
                    .program_command_ns
                    .saturating_add(Self::per_block(self.p.program_block_ns, op.count.into())),
                background_ns: Self::per_block(
                    self.p.background_work_per_block_ns,
                    op.count.into(),
                ),
            },
        }
    }

    fn destage(&mut self, _now: Nanos, _sector: u64, count: u32) -> Cost {
        Cost {
            busy_ns: Self::per_block(self.p.program_block_ns, count.into()),
            background_ns: Self::per_block(self.p.background_work_per_block_ns, count.into()),
        }
    }

    fn flush(&mut self, _now: Nanos) -> Cost {
        Cost::busy(self.p.flush_ns)
    }

    fn erase(&mut self, _now: Nanos, op: &Erase) -> Cost {
        Cost::busy(Self::per_block(self.p.erase_group_ns, op.groups.max(1)))
    }

    fn switch(&mut self, _now: Nanos, kind: SwitchKind) -> Cost {
        Cost::busy(match kind {
            SwitchKind::Generic | SwitchKind::PowerOffLong => self.p.switch_ns,
            SwitchKind::PartitionAccess => self.p.partition_switch_ns,
            SwitchKind::Sanitize => self.p.sanitize_ns,
        })
    }

    fn sleep_awake(&mut self, _now: Nanos) -> Cost {
        Cost::busy(self.p.sleep_awake_ns)
    }

    fn hpi_exit(&mut self, _now: Nanos) -> Nanos {
        self.p.hpi_exit_ns
    }

    fn bkops_level(&self, outstanding_ns: Nanos) -> u8 {
        let [l1, l2, l3] = self.p.bkops_level_ns;
        // A zero threshold disables that level: an ideal card never needs BKOPS.
        let reached = |t: u64| t != 0 && outstanding_ns >= t;
        if reached(l3) {
            3
        } else if reached(l2) {
            2
        } else if reached(l1) {
            1
        } else {
            0
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn model() -> ConstantTimingModel {
        ConstantTimingModel {
            program_command_ns: 100,
            program_block_ns: 10,
            cache_block_ns: 1,
            background_work_per_block_ns: 5,
            bkops_level_ns: [50, 100, 200],
            ..Default::default()
        }
    }

    #[test]
    fn medium_program_costs_command_plus_blocks_and_leaves_debt() {
        let mut t = ConstantTiming::new(model());
        let c = t.program(
            0,
            &Program {
                sector: 0,
                count: 8,
                target: ProgramTarget::Medium,
                reliable: false,
                packed_entry: false,
            },
        );
        assert_eq!(c.busy_ns, 180);
        assert_eq!(c.background_ns, 40);
    }

    #[test]
    fn cached_program_leaves_no_debt() {
        let mut t = ConstantTiming::new(model());
        let c = t.program(
            0,
            &Program {
                sector: 0,
                count: 8,
                target: ProgramTarget::Cache,
                reliable: false,
                packed_entry: false,
            },
        );
        assert_eq!(c, Cost::busy(8));
    }

    #[test]
    fn bkops_levels_follow_thresholds() {
        let t = ConstantTiming::new(model());
        assert_eq!(t.bkops_level(0), 0);
        assert_eq!(t.bkops_level(49), 0);
        assert_eq!(t.bkops_level(50), 1);
        assert_eq!(t.bkops_level(150), 2);
        assert_eq!(t.bkops_level(200), 3);
        let ideal = ConstantTiming::new(ConstantTimingModel::default());
        assert_eq!(ideal.bkops_level(u64::MAX), 0);
    }
}
