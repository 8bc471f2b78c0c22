//! The pending-faults part: what a fault plan has asked the card to do to a command that
//! has not arrived yet.
//!
//! Owns the R1 error bits the next R1/R1b command is refused with, and the entry of the
//! next packed write that fails. Both are used up by the command they hit; neither is
//! affected by resets, since the fault plan, not the card, decides when they end.

use crate::status::r1;

/// The card's pending faults (see the module documentation).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct PendingFaults {
    r1: u32,
    packed_index: Option<usize>,
}

impl PendingFaults {
    /// Refuse the next R1/R1b command with `bits` (only error bits are kept; they add up).
    pub fn refuse_next(&mut self, bits: u32) {
        self.r1 |= bits & r1::ERRORS;
    }

    #[inline]
    pub fn refusal_pending(&self) -> bool {
        self.r1 != 0
    }

    /// The refusal's bits, used up.
    pub fn take_refusal(&mut self) -> u32 {
        std::mem::take(&mut self.r1)
    }

    /// Fail entry `index` (1-based) of the next packed write.
    pub fn fail_packed_entry(&mut self, index: usize) {
        self.packed_index = Some(index);
    }

    /// The entry the next packed write fails at, used up by that write.
    pub fn take_packed_entry(&mut self) -> Option<usize> {
        self.packed_index.take()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_refusal_keeps_only_error_bits_and_is_used_once() {
        let mut f = PendingFaults::default();
        assert!(!f.refusal_pending());
        f.refuse_next(r1::READY_FOR_DATA | r1::APP_CMD);
        assert!(!f.refusal_pending(), "status flags are not errors");
        f.refuse_next(r1::ERROR);
        f.refuse_next(r1::WP_VIOLATION | r1::SWITCH_ERROR);
        assert!(f.refusal_pending());
        assert_eq!(f.take_refusal(), r1::ERROR | r1::WP_VIOLATION);
        assert!(!f.refusal_pending());
        assert_eq!(f.take_refusal(), 0);
    }

    #[test]
    fn a_packed_failure_hits_one_packed_write() {
        let mut f = PendingFaults::default();
        assert_eq!(f.take_packed_entry(), None);
        f.fail_packed_entry(1);
        f.fail_packed_entry(3);
        assert_eq!(f.take_packed_entry(), Some(3));
        assert_eq!(f.take_packed_entry(), None);
    }
}
