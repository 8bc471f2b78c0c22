//! The BKOPS policy: after the queue has been idle long enough, read BKOPS_STATUS and
//! start BKOPS without waiting at the policy's level (a request arriving stops it with
//! HPI); on an URGENT_BKOPS exception, run BKOPS to its end before the next request
//! (Linux's `mmc_start_bkops(card, true)`).

use crate::mmc::{mmc_get_ext_csd, mmc_send_status, mmc_switch_nowait, MmcHostOps};
use emmc_card::ext_csd as ext;
use emmc_card::timing::Nanos;

use super::queue::Active;
use super::{BlkData, MmcBlk};

impl<H: MmcHostOps, D: BlkData> MmcBlk<H, D> {
    pub(super) fn bkops_check_due(&self, idle_since: Nanos) -> Option<Nanos> {
        (self.f.bkops && self.cfg.bkops.enabled && !self.bkops_checked)
            .then(|| idle_since.saturating_add(self.cfg.bkops.idle_ns))
    }

    /// The queue has been idle long enough: read BKOPS_STATUS and start BKOPS without
    /// waiting if it is high enough.
    pub(super) fn idle_bkops(&mut self) {
        self.bkops_checked = true;
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
