//! The BKOPS policy: after the queue has been idle long enough, read BKOPS_STATUS and
//! start BKOPS without waiting at the policy's level (a request arriving stops it with
//! HPI); on an URGENT_BKOPS exception, run BKOPS to its end before the next request
//! (Linux's `mmc_start_bkops(card, true)`).

use crate::mmc::{mmc_get_ext_csd, mmc_send_status, mmc_switch_nowait, MmcHostOps};
use emmc_card::ext_csd as ext;
use emmc_card::timing::Nanos;

use super::queue::Active;
use super::{BkopsPolicy, BlkData, MmcBlk};

/// What the driver knows of BKOPS between requests.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(super) struct BkopsState {
    /// BKOPS_STATUS was read since the queue went idle (once per idle period).
    pub(super) checked: bool,
    /// An URGENT_BKOPS exception is waiting for the queue thread.
    pub(super) urgent: bool,
}

impl BkopsState {
    /// When the idle check falls due for a queue idle since `idle_since`: never when the
    /// card has no manual BKOPS (`supported`), the policy is off, or it was done.
    pub(super) fn check_due(
        &self,
        supported: bool,
        policy: &BkopsPolicy,
        idle_since: Nanos,
    ) -> Option<Nanos> {
        (supported && policy.enabled && !self.checked)
            .then(|| idle_since.saturating_add(policy.idle_ns))
    }
}

impl<H: MmcHostOps, D: BlkData> MmcBlk<H, D> {
    pub(super) fn bkops_check_due(&self, idle_since: Nanos) -> Option<Nanos> {
        self.bkops
            .check_due(self.f.bkops, &self.cfg.bkops, idle_since)
    }

    /// The queue has been idle long enough: read BKOPS_STATUS and start BKOPS without
    /// waiting if it is high enough.
    pub(super) fn idle_bkops(&mut self) {
        self.bkops.checked = true;
        let level = match mmc_get_ext_csd(&mut self.host) {
            Ok(e) => e[ext::BKOPS_STATUS] & 0x03,
            Err(e) => {
                log::warn!("mmcblk: BKOPS_STATUS: {e}");
                return;
            }
        };
        if level < self.cfg.bkops.min_level.max(1) {
            return;
        }
        match mmc_switch_nowait(&mut self.host, ext::BKOPS_START, 1) {
            Ok(done) => {
                self.stats.bkops_started += 1;
                log::debug!("mmcblk: BKOPS started at level {level}");
                if done.busy_pending {
                    self.active = Some(Active::Bkops);
                }
            }
            Err(e) => log::warn!("mmcblk: BKOPS_START: {e}"),
        }
    }

    /// URGENT_BKOPS: run BKOPS to its end now (`mmc_start_bkops(card, true)` with the
    /// busy signal).
    pub(super) fn run_urgent_bkops(&mut self) {
        match mmc_switch_nowait(&mut self.host, ext::BKOPS_START, 1) {
            Ok(_) => {
                self.stats.bkops_started += 1;
                self.stats.bkops_urgent += 1;
                self.host.wait_busy_until(None);
                let _ = mmc_send_status(&mut self.host);
            }
            Err(e) => log::warn!("mmcblk: urgent BKOPS_START: {e}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_idle_check_falls_due_once_per_idle_period_when_card_and_policy_allow() {
        let policy = BkopsPolicy {
            enabled: true,
            idle_ns: 1_000,
            min_level: 2,
        };
        let mut s = BkopsState::default();
        assert_eq!(s.check_due(true, &policy, 5_000), Some(6_000));
        assert_eq!(s.check_due(true, &policy, u64::MAX), Some(u64::MAX));
        assert_eq!(s.check_due(false, &policy, 5_000), None);
        let off = BkopsPolicy {
            enabled: false,
            ..policy
        };
        assert_eq!(s.check_due(true, &off, 5_000), None);
        s.checked = true;
        assert_eq!(s.check_due(true, &policy, 5_000), None);
    }
}
