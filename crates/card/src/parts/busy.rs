//! The busy-operation part: what keeps the card busy (DAT0 low) and until when, and the
//! background work it owes.
//!
//! Owns the current [`Operation`] — its kind (programming, erase, flush, BKOPS, sanitize,
//! a register switch, the exit from an HPI), start and end in card time — and the
//! outstanding background work the card accumulated. It decides when an operation has
//! ended, which ones HPI may interrupt, and how much of a write had landed by a given
//! instant; what completing, interrupting or cutting an operation does to the data is the
//! card's (`operation.rs`).

use super::erase::EraseOp;
use crate::one_or_many::OneOrMany;
use crate::timing::{Nanos, ProgramTarget};

/// One contiguous piece of a write: `count` sectors at absolute image sector `sector`,
/// whose data starts at `buf_offset` in the card's write buffer. A packed write has one
/// segment per entry, each with its own reliability.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Segment {
    pub sector: u64,
    pub count: u64,
    pub buf_offset: usize,
    pub target: ProgramTarget,
    /// Reliable write (CMD23 bit 31): durable on completion and atomic per `granule`.
    pub reliable: bool,
    /// Sectors that land or fail together when programming is cut short.
    pub granule: u64,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ProgramOp {
    pub segments: OneOrMany<Segment>,
}

impl ProgramOp {
    pub fn total_sectors(&self) -> u64 {
        self.segments.as_slice().iter().map(|s| s.count).sum()
    }

    /// How many of the first `done` sectors (in segment order) land when programming stops
    /// there: a segment cut short keeps only whole granules, and nothing after it lands.
    pub fn sectors_landed(&self, done: u64) -> u64 {
        let mut left = done;
        let mut landed = 0;
        for seg in self.segments.as_slice() {
            let n = seg.count.min(left);
            left -= n;
            if n < seg.count {
                landed += n - n % seg.granule.max(1);
                break;
            }
            landed += n;
        }
        landed
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum OpKind {
    Program(ProgramOp),
    /// Erase family; the erase takes effect when the operation completes.
    Erase(EraseOp),
    /// FLUSH_CACHE and other cache write-backs: the dirty sectors were written when the
    /// flush started, so nothing remains to do at its end.
    Flush,
    /// Manual BKOPS working off outstanding background work, after `overhead_ns` of
    /// CMD6 handling.
    Bkops {
        overhead_ns: Nanos,
    },
    Sanitize,
    /// Any other busy period (CMD6, CMD5, CMD28/29, CMD7 dis→prg, RPMB programming).
    Busy,
    /// The card leaving prg after an HPI.
    HpiExit,
}

impl OpKind {
    /// Operations HPI may interrupt: programming, erase, BKOPS and sanitize. Cache flushes
    /// and register switches are not interruptible.
    fn interruptible(&self) -> bool {
        matches!(
            self,
            OpKind::Program(_) | OpKind::Erase(_) | OpKind::Bkops { .. } | OpKind::Sanitize
        )
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Operation {
    pub kind: OpKind,
    pub start: Nanos,
    pub end: Nanos,
    /// Lengthened by a fault plan's stuck busy: HPI may end it whatever its kind.
    pub stuck: bool,
}

impl Operation {
    /// Sectors of program operation `p` (this operation's) done by `at`, in proportion to
    /// the elapsed share of its busy time ([`ProgramOp::sectors_landed`] rounds a partial
    /// segment down to its granule).
    pub fn sectors_done(&self, p: &ProgramOp, at: Nanos) -> u64 {
        let total = p.total_sectors();
        let span = self.end - self.start;
        if span == 0 || at >= self.end {
            return total;
        }
        let elapsed = at.saturating_sub(self.start);
        (u128::from(total) * u128::from(elapsed) / u128::from(span)) as u64
    }
}

/// The card's busy state (see the module documentation).
#[derive(Debug, Default)]
pub(crate) struct Busy {
    op: Option<Operation>,
    /// Background work accumulated by the card (costs of models without their own debt,
    /// and work added from outside) and not yet worked off.
    outstanding_ns: Nanos,
}

impl Busy {
    /// An operation of `busy_ns` starts at `now`, replacing any current one.
    pub fn begin(&mut self, now: Nanos, busy_ns: Nanos, kind: OpKind) {
        self.op = Some(Operation {
            kind,
            start: now,
            end: now.saturating_add(busy_ns),
            stuck: false,
        });
    }

    #[inline]
    pub fn is_busy(&self) -> bool {
        self.op.is_some()
    }

    /// The instant the current operation ends.
    #[inline]
    pub fn until(&self) -> Option<Nanos> {
        self.op.as_ref().map(|op| op.end)
    }

    /// The current operation if it has ended by `now` (it is then no longer current).
    #[inline]
    pub fn take_finished(&mut self, now: Nanos) -> Option<Operation> {
        if self.op.as_ref().is_some_and(|op| now >= op.end) {
            self.op.take()
        } else {
            None
        }
    }

    /// The current operation, whatever its state (power loss).
    pub fn take(&mut self) -> Option<Operation> {
        self.op.take()
    }

    /// Forget the current operation (power-on, CMD0 after it completed).
    pub fn clear(&mut self) {
        self.op = None;
    }

    /// HPI: the current operation if HPI may interrupt it (it is then no longer current);
    /// `None` if there is none or it must run to its end.
    pub fn take_interruptible(&mut self) -> Option<Operation> {
        match &self.op {
            Some(op) if op.kind.interruptible() || op.stuck => self.op.take(),
            _ => None,
        }
    }

    /// Lengthen the current operation by `ns`; `stuck` lets HPI end it whatever its kind.
    /// False when the card is not busy.
    pub fn extend(&mut self, ns: Nanos, stuck: bool) -> bool {
        let Some(op) = self.op.as_mut() else {
            return false;
        };
        op.end = op.end.saturating_add(ns);
        op.stuck |= stuck;
        true
    }

    /// Background work left behind by an operation or added from outside.
    #[inline]
    pub fn add_background(&mut self, ns: Nanos) {
        self.outstanding_ns = self.outstanding_ns.saturating_add(ns);
    }

    /// BKOPS did `ns` of the card's own background work.
    pub fn work_off(&mut self, ns: Nanos) {
        self.outstanding_ns = self.outstanding_ns.saturating_sub(ns);
    }

    /// All outstanding background work: the timing model's own debt (`model_debt`, if it
    /// keeps one) plus what the card accumulated.
    pub fn outstanding(&self, model_debt: Option<Nanos>) -> Nanos {
        model_debt.unwrap_or(0).saturating_add(self.outstanding_ns)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn segment(count: u64, granule: u64) -> Segment {
        Segment {
            sector: 0,
            count,
            buf_offset: 0,
            target: ProgramTarget::Medium,
            reliable: granule > 1,
            granule,
        }
    }

    fn program(segments: Vec<Segment>) -> ProgramOp {
        ProgramOp {
            segments: segments.into(),
        }
    }

    #[test]
    fn an_operation_ends_at_its_instant_and_not_before() {
        let mut b = Busy::default();
        assert!(!b.is_busy() && b.until().is_none());
        b.begin(100, 50, OpKind::Busy);
        assert_eq!(b.until(), Some(150));
        assert!(b.take_finished(149).is_none());
        assert!(b.is_busy());
        let op = b.take_finished(150).unwrap();
        assert_eq!((op.start, op.end, op.kind), (100, 150, OpKind::Busy));
        assert!(!b.is_busy());
        b.begin(u64::MAX - 1, 10, OpKind::Flush);
        assert_eq!(b.until(), Some(u64::MAX), "the end saturates");
    }

    #[test]
    fn hpi_interrupts_only_programming_erase_bkops_sanitize_or_a_stuck_operation() {
        let mut b = Busy::default();
        assert!(b.take_interruptible().is_none());
        for kind in [OpKind::Flush, OpKind::Busy, OpKind::HpiExit] {
            b.begin(0, 10, kind.clone());
            assert!(b.take_interruptible().is_none(), "{kind:?}");
            assert!(b.is_busy(), "{kind:?} keeps running");
        }
        b.begin(0, 10, OpKind::Flush);
        assert!(b.extend(0, false));
        assert!(b.take_interruptible().is_none());
        assert!(b.extend(5, true));
        assert_eq!(b.until(), Some(15));
        assert!(b.take_interruptible().is_some(), "a stuck flush yields");
        for kind in [
            OpKind::Program(program(vec![segment(1, 1)])),
            OpKind::Bkops { overhead_ns: 3 },
            OpKind::Sanitize,
        ] {
            b.begin(0, 10, kind.clone());
            assert_eq!(b.take_interruptible().map(|op| op.kind), Some(kind));
            assert!(!b.is_busy());
        }
        assert!(!b.extend(5, false), "not busy");
    }

    #[test]
    fn the_landed_prefix_is_proportional_to_elapsed_time_in_whole_granules() {
        let p = program(vec![segment(8, 1), segment(16, 8)]);
        let op = Operation {
            kind: OpKind::Program(p.clone()),
            start: 1000,
            end: 1240,
            stuck: false,
        };
        assert_eq!(op.sectors_done(&p, 1000), 0);
        assert_eq!(op.sectors_done(&p, 1100), 10);
        assert_eq!(op.sectors_done(&p, 1239), 23);
        assert_eq!(op.sectors_done(&p, 5000), 24);
        assert_eq!(p.sectors_landed(10), 8, "2 of a granule of 8 do not land");
        assert_eq!(p.sectors_landed(16), 16);
        assert_eq!(p.sectors_landed(23), 16);
        assert_eq!(p.sectors_landed(24), 24);
        assert_eq!(p.sectors_landed(5), 5);
        let instant = Operation { end: 1000, ..op };
        assert_eq!(
            instant.sectors_done(&p, 1000),
            24,
            "a zero-length program is done"
        );
    }

    #[test]
    fn outstanding_work_adds_the_models_debt_and_saturates() {
        let mut b = Busy::default();
        b.add_background(100);
        b.add_background(u64::MAX);
        assert_eq!(b.outstanding(None), u64::MAX);
        b.work_off(u64::MAX - 40);
        assert_eq!(b.outstanding(None), 40);
        assert_eq!(b.outstanding(Some(2)), 42);
        b.work_off(1000);
        assert_eq!(b.outstanding(Some(7)), 7);
    }
}
