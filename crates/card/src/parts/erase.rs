//! The erase part: the CMD35/CMD36/CMD38 sequence in progress and the sectors secure trim
//! has marked.
//!
//! Owns the sequence's start and end (partition-relative LBAs, each set only by its own
//! command in order) and the runs of absolute sectors that secure trim step 1 marked,
//! which step 2 or SANITIZE_START purge. What an erase covers, what write protection
//! skips and how long it takes is the card's (`erase.rs`).

use crate::timing::Erase;

/// An erase operation in progress: the timing model's view and the sector runs (absolute)
/// that will be erased when it completes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct EraseOp {
    pub erase: Erase,
    pub runs: Vec<(u64, u64)>,
}

/// The card's erase state (see the module documentation).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct EraseState {
    start: Option<u64>,
    end: Option<u64>,
    /// Runs (absolute sector, count) marked by secure trim step 1.
    marks: Vec<(u64, u64)>,
}

impl EraseState {
    /// A sequence has begun (CMD35 accepted).
    #[inline]
    pub fn started(&self) -> bool {
        self.start.is_some()
    }

    /// Drop the sequence (another command came between, an error, CMD0).
    pub fn reset_sequence(&mut self) {
        self.start = None;
        self.end = None;
    }

    /// CMD35: a new sequence starts at `lba`, or none if the address was refused.
    pub fn set_start(&mut self, lba: Option<u64>) {
        self.reset_sequence();
        self.start = lba;
    }

    /// Whether CMD36 comes in order: after CMD35, before another CMD36.
    pub fn accepts_end(&self) -> bool {
        self.start.is_some() && self.end.is_none()
    }

    /// CMD36 (in order): the sequence ends at `lba`, or is dropped if the address was
    /// refused.
    pub fn set_end(&mut self, lba: Option<u64>) {
        match lba {
            Some(lba) => self.end = Some(lba),
            None => self.reset_sequence(),
        }
    }

    /// CMD38 uses the sequence up: (start, end) if both were set.
    pub fn take_range(&mut self) -> Option<(u64, u64)> {
        let range = self.start.zip(self.end);
        self.reset_sequence();
        range
    }

    /// Secure trim step 1 completed on `runs`.
    pub fn mark(&mut self, runs: &[(u64, u64)]) {
        self.marks.extend_from_slice(runs);
    }

    /// Everything marked so far, for step 2 or sanitize to purge.
    pub fn take_marks(&mut self) -> Vec<(u64, u64)> {
        std::mem::take(&mut self.marks)
    }
}

/// The whole erase groups of `group` sectors containing `[start, end]`, clipped to a
/// partition of `sectors`: (first, last) sector, both inclusive.
pub(crate) fn whole_groups(start: u64, end: u64, group: u64, sectors: u64) -> (u64, u64) {
    (
        start - start % group,
        ((end / group + 1) * group).min(sectors) - 1,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sequence_is_start_then_end_then_erase() {
        let mut e = EraseState::default();
        assert!(!e.started() && !e.accepts_end());
        assert_eq!(e.take_range(), None);
        e.set_start(Some(10));
        assert!(e.started() && e.accepts_end());
        assert_eq!(e.take_range(), None, "CMD38 before CMD36");
        assert!(!e.started(), "and the sequence is gone");

        e.set_start(Some(10));
        e.set_end(Some(20));
        assert!(!e.accepts_end(), "a second CMD36 is out of order");
        assert_eq!(e.take_range(), Some((10, 20)));
        assert_eq!(e.take_range(), None);

        e.set_start(Some(10));
        e.set_end(None);
        assert!(!e.started(), "a refused end address drops the sequence");
        e.set_start(Some(1));
        e.set_start(None);
        assert!(!e.started(), "a refused start address leaves no sequence");
        e.set_start(Some(1));
        e.reset_sequence();
        assert!(!e.accepts_end());
    }

    #[test]
    fn marks_accumulate_until_purged() {
        let mut e = EraseState::default();
        e.mark(&[(100, 8)]);
        e.set_start(Some(3));
        e.mark(&[(200, 1), (300, 2)]);
        assert_eq!(e.take_marks(), vec![(100, 8), (200, 1), (300, 2)]);
        assert!(e.take_marks().is_empty());
        assert!(e.started(), "marks and the sequence are independent");
    }

    #[test]
    fn whole_groups_cover_the_range_and_stop_at_the_partition_end() {
        assert_eq!(whole_groups(10, 20, 8, 1000), (8, 23));
        assert_eq!(whole_groups(8, 15, 8, 1000), (8, 15));
        assert_eq!(whole_groups(0, 0, 1024, 1000), (0, 999));
        assert_eq!(whole_groups(995, 999, 8, 1000), (992, 999));
    }
}
