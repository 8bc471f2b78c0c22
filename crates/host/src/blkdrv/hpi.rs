//! The HPI policy: when to interrupt the card's programming (a long or packed write when
//! a read has waited long enough, BKOPS when any request arrives), `mmc_interrupt_hpi`
//! itself, and what the interrupted request leaves to do (CORRECTLY_PRG_SECTORS_NUM:
//! what landed completes, the rest goes back to the scheduler).

use crate::mmc::{mmc_get_ext_csd, mmc_send_status, r1_state, MmcError, MmcHostOps, MMC_RCA};
use crate::packing::{BlkOp, BlkRequest};
use crate::sdhci::{MmcCommand, MmcRequest, ResponseType, SdhciError};
use emmc_card::ext_csd as ext;
use emmc_card::timing::Nanos;
use emmc_card::CardState;

use super::queue::{Active, Work};
use super::{BlkData, MmcBlk};

/// The arrivals the HPI policy waits on: the earliest arrival of a read not yet fetched,
/// and of any request, while the card was busy, and whether the prepared request has had
/// its HPI already.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(super) struct HpiState {
    read_since: Option<Nanos>,
    any_since: Option<Nanos>,
    /// The prepared request already had its HPI.
    done_for_cur: bool,
}

impl HpiState {
    /// A request arrived at `at`.
    pub(super) fn arrived(&mut self, at: Nanos, read: bool) {
        self.any_since.get_or_insert(at);
        if read {
            self.read_since.get_or_insert(at);
        }
    }

    /// The queue thread fetched and prepared a request; `queued_read`: a read is still
    /// queued, `queue_empty`: nothing is.
    pub(super) fn fetched(&mut self, queued_read: bool, queue_empty: bool) {
        if !queued_read {
            self.read_since = None;
        }
        if queue_empty {
            self.any_since = None;
        }
        self.done_for_cur = false;
    }

    /// An HPI was sent: the read that asked for it has had its chance.
    pub(super) fn interrupted(&mut self) {
        self.read_since = None;
        self.done_for_cur = true;
    }

    /// Since when a read has waited for the card: the earliest queued read, or the
    /// prepared request if it is a read (`prepared_read`: when it was fetched) that has
    /// not had its HPI yet.
    pub(super) fn read_waiting_since(&self, prepared_read: Option<Nanos>) -> Option<Nanos> {
        let prepared = prepared_read.filter(|_| !self.done_for_cur);
        match (self.read_since, prepared) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }
}

impl<H: MmcHostOps, D: BlkData> MmcBlk<H, D> {
    /// When the HPI policy wants the card interrupted (the arrival that asks for it), if
    /// that is no later than `until`.
    pub(super) fn hpi_due(&self, until: Nanos) -> Option<Nanos> {
        if !self.f.hpi {
            return None;
        }
        let at = match self.active.as_ref()? {
            Active::Bkops => self.hpi.any_since?,
            Active::Rw { work, busy, .. } => {
                if !*busy || !self.cfg.hpi.enabled {
                    return None;
                }
                let long = match work {
                    Work::Packed { reqs, .. } => reqs[0].op == BlkOp::Write,
                    Work::Rw { req, .. } => {
                        req.op == BlkOp::Write && req.sectors >= self.cfg.hpi.min_write_sectors
                    }
                    Work::Special(_) => false,
                };
                if !long {
                    return None;
                }
                // A read waiting in the scheduler, or already fetched by the pipeline.
                let fetched = self.cur.as_ref().and_then(|c| {
                    let read = match &c.work {
                        Work::Rw { req, .. } => req.op.is_read(),
                        Work::Packed { reqs, .. } => reqs[0].op.is_read(),
                        Work::Special(_) => false,
                    };
                    read.then_some(c.fetched_at)
                });
                let arrived = self.hpi.read_waiting_since(fetched)?;
                arrived.saturating_add(self.cfg.hpi.min_wait_ns)
            }
        };
        (at <= until).then_some(at)
    }

    /// `mmc_interrupt_hpi`, then what the interrupted operation leaves to do.
    pub(super) fn interrupt(&mut self) {
        let Some(active) = self.active.take() else {
            return;
        };
        // The read that asked for it has had its chance: another HPI needs another read
        // (with a scheduler that does not put the read first, writes queued before it
        // would otherwise be interrupted one after the other).
        self.hpi.interrupted();
        match self.mmc_interrupt_hpi() {
            Ok(true) => self.stats.hpi += 1,
            Ok(false) => {}
            Err(e) => log::warn!("mmcblk: HPI failed: {e}"),
        }
        self.host.wait_busy_until(None);
        let (work, sectors) = match active {
            Active::Bkops => return,
            Active::Rw { work, sectors, .. } => (work, sectors),
        };
        let prg = match mmc_get_ext_csd(&mut self.host) {
            Ok(e) => ext::read_le(&e, ext::CORRECTLY_PRG_SECTORS_NUM, 4).min(sectors),
            Err(e) => {
                self.rw_error(work, e);
                return;
            }
        };
        let now = self.host.now();
        let reqs: Vec<(BlkRequest, u32)> = match &work {
            // Only the piece on the card counts; earlier pieces completed already.
            Work::Rw { req, done, .. } => vec![(*req, *done)],
            Work::Packed { reqs, .. } => reqs.iter().map(|r| (*r, 0)).collect(),
            Work::Special(_) => return,
        };
        let mut landed = u64::from(prg);
        let mut back = Vec::new();
        for (req, already) in reqs {
            let left = u64::from(req.sectors - already);
            let take = landed.min(left);
            landed -= take;
            let done_total = already + take as u32;
            if done_total == req.sectors {
                self.sched.completed(&req, now);
                self.complete(req, now);
                continue;
            }
            if done_total > 0 {
                self.complete(
                    BlkRequest {
                        sectors: done_total,
                        ..req
                    },
                    now,
                );
            }
            let rest = req.sectors - done_total;
            back.push(BlkRequest {
                lba: req.lba + u64::from(done_total),
                sectors: rest,
                segments: rest.div_ceil(8).max(1),
                ..req
            });
        }
        for r in &back {
            self.stats.hpi_requeued_sectors += u64::from(r.sectors);
            self.sched.reinsert(*r, now);
        }
        log::debug!(
            "mmcblk: HPI after {prg} sectors, {} requests given back",
            back.len()
        );
    }

    /// Send HPI if the card is programming: CMD13 first (Linux skips HPI outside prg),
    /// then the HPI command, then wait until the card leaves prg. `Ok(true)` if sent.
    fn mmc_interrupt_hpi(&mut self) -> Result<bool, MmcError> {
        let status = mmc_send_status(&mut self.host)?;
        if r1_state(status) != CardState::Prg.number() {
            return Ok(false);
        }
        let arg = u32::from(MMC_RCA) << 16 | 1;
        let cmd = if self.f.hpi_cmd12 {
            MmcCommand::new(12, arg, ResponseType::R1b)
        } else {
            MmcCommand::new(13, arg, ResponseType::R1)
        };
        let done = self.host.start_request(MmcRequest::command(cmd));
        match done.error() {
            None | Some(SdhciError::CmdCrc) => {}
            Some(error) => {
                return Err(MmcError::Host {
                    cmd: cmd.opcode,
                    error,
                })
            }
        }
        self.host.wait_busy_until(None);
        Ok(true)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_earliest_arrivals_count_until_a_fetch_takes_them() {
        let mut s = HpiState::default();
        s.arrived(100, false);
        s.arrived(200, true);
        s.arrived(300, true);
        assert_eq!((s.any_since, s.read_since), (Some(100), Some(200)));
        // A read still queued keeps its arrival, a queue not yet empty keeps any.
        s.fetched(true, false);
        assert_eq!((s.any_since, s.read_since), (Some(100), Some(200)));
        s.fetched(false, true);
        assert_eq!((s.any_since, s.read_since), (None, None));
    }

    #[test]
    fn a_read_waits_from_the_earlier_of_queue_and_prepared_request_until_its_hpi() {
        let mut s = HpiState::default();
        assert_eq!(s.read_waiting_since(None), None);
        assert_eq!(s.read_waiting_since(Some(500)), Some(500));
        s.arrived(700, true);
        assert_eq!(s.read_waiting_since(Some(500)), Some(500));
        assert_eq!(s.read_waiting_since(Some(900)), Some(700));
        assert_eq!(s.read_waiting_since(None), Some(700));
        // After an HPI neither the queued read nor the prepared one asks again ...
        s.interrupted();
        assert_eq!(s.read_waiting_since(Some(500)), None);
        // ... until a new read arrives, or the next request is prepared.
        s.arrived(1_000, true);
        assert_eq!(s.read_waiting_since(Some(500)), Some(1_000));
        s.fetched(false, false);
        assert_eq!(s.read_waiting_since(Some(1_200)), Some(1_200));
    }
}
