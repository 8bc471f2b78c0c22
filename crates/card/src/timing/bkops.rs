//! Background operations: the FTL's outstanding work (small-write log merges, SLC folds)
//! sets BKOPS_STATUS and, from level 2, URGENT_BKOPS. Host-started BKOPS works it off in
//! card time; a card left with critical (level 3) debt garbage-collects in the foreground
//! before the next write, which is how a small write can take half a second (seed 000).

use super::Nanos;
use crate::model::BkopsModel;

#[derive(Debug, Clone)]
pub struct Bkops {
    levels: [Nanos; 3],
    foreground_target: Nanos,
}

impl Bkops {
    pub fn new(m: &BkopsModel) -> Bkops {
        Bkops {
            levels: m.level_ns,
            foreground_target: m.foreground_target_ns,
        }
    }

    /// BKOPS_STATUS for this much outstanding work (a zero threshold disables its level).
    pub fn level(&self, outstanding: Nanos) -> u8 {
        let reached = |t: Nanos| t != 0 && outstanding >= t;
        match self.levels {
            [_, _, l3] if reached(l3) => 3,
            [_, l2, _] if reached(l2) => 2,
            [l1, _, _] if reached(l1) => 1,
            _ => 0,
        }
    }

    /// If the debt is critical, how much may be left after foreground collection.
    pub fn foreground_target(&self, debt: Nanos) -> Option<Nanos> {
        (self.level(debt) >= 3).then_some(self.foreground_target)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bkops() -> Bkops {
        Bkops::new(&BkopsModel {
            level_ns: [10, 20, 30],
            foreground_target_ns: 15,
        })
    }

    #[test]
    fn levels_follow_thresholds() {
        let b = bkops();
        assert_eq!(
            [0, 9, 10, 19, 20, 29, 30, 1000].map(|d| b.level(d)),
            [0, 0, 1, 1, 2, 2, 3, 3]
        );
        let off = Bkops::new(&BkopsModel::default());
        assert_eq!(off.level(u64::MAX), 0);
    }

    #[test]
    fn only_critical_debt_forces_foreground_collection() {
        let b = bkops();
        assert_eq!(b.foreground_target(29), None);
        assert_eq!(b.foreground_target(30), Some(15));
    }
}
