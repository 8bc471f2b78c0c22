//! Completion and error recovery: checking a finished MMC request (`mmc_blk_err_check`:
//! its R1, CMD13 after a write, exception events), completing the block request or the
//! next reliable-write piece, and after an error getting the card back to tran
//! (`mmc_blk_cmd_recovery`), retrying up to the budget, and re-initialising a card that no
//! longer answers (`mmc_blk_reset`).

use crate::mmc::{
    check_r1, completion_result, mmc_get_ext_csd, mmc_init_card, mmc_send_status, mmc_switch,
    r1_state, MmcError, MmcHostOps, MMC_RCA,
};
use crate::packing::{BlkOp, BlkRequest};
use crate::sdhci::{MmcCommand, ResponseType};
use emmc_card::ext_csd as ext;
use emmc_card::timing::Nanos;
use emmc_card::{r1, CardState};

use super::bkops::BkopsState;
use super::queue::{Active, Work};
use super::{BlkCompletion, BlkData, BlkError, MmcBlk};

/// CMD13 and its R1 as the card sent it, error bits included (`get_card_status`).
fn mmc_get_status<H: MmcHostOps>(host: &mut H) -> Result<u32, MmcError> {
    let cmd = MmcCommand::new(13, u32::from(MMC_RCA) << 16, ResponseType::R1);
    crate::mmc::mmc_wait_for_cmd(host, cmd).map(|r| r[0])
}

impl<H: MmcHostOps, D: BlkData> MmcBlk<H, D> {
    pub(super) fn fail(&mut self, req: BlkRequest, at: Nanos, e: BlkError) {
        log::debug!("mmcblk: request {} failed: {e}", req.id);
        self.stats.failed += 1;
        self.completions.push(BlkCompletion {
            req,
            at,
            result: Err(e),
        });
    }

    pub(super) fn complete(&mut self, req: BlkRequest, at: Nanos) {
        // `mmc_blk_reset_success`: the card works again; a later error may reset it.
        self.reset_done = false;
        self.completions.push(BlkCompletion {
            req,
            at,
            result: Ok(()),
        });
    }

    /// The request on the card is done (busy over): check it, complete or retry.
    pub(super) fn finish_active(&mut self) {
        let Some(active) = self.active.take() else {
            return;
        };
        let (work, sectors, done) = match active {
            Active::Bkops => {
                log::debug!("mmcblk: BKOPS finished");
                return;
            }
            Active::Rw {
                work,
                sectors,
                done,
                ..
            } => (work, sectors, done),
        };
        let write = match &work {
            Work::Rw { req, .. } => req.op == BlkOp::Write,
            Work::Packed { reqs, .. } => reqs[0].op == BlkOp::Write,
            Work::Special(_) => false,
        };
        if let Err(e) = completion_result(&done) {
            // mmc_blk_err_check: error bits in the command's own R1 (an address error, a
            // refused command) abort the request whatever the data phase did: no data
            // moved, and a retry would be refused again.
            let e = if done.cmd.ok() && done.cmd.resp[0] & r1::ERRORS != 0 {
                MmcError::Status {
                    cmd: done.cmd.opcode,
                    status: done.cmd.resp[0],
                }
            } else {
                e
            };
            self.rw_error(work, e);
            return;
        }
        // mmc_blk_err_check: after a write the card must be back in tran and ready; the
        // R1 of a read's command tells of exceptions too.
        let status = if write {
            match mmc_get_status(&mut self.host) {
                Ok(s) => s,
                Err(e) => {
                    self.rw_error(work, e);
                    return;
                }
            }
        } else {
            done.cmd.resp[0] & !r1::ERRORS
        };
        let packed_failure = self.check_exception(status, matches!(work, Work::Packed { .. }));
        if let (Some((pstatus, index)), Work::Packed { reqs, retries }) = (packed_failure, &work) {
            self.packed_failed(reqs.clone(), *retries, pstatus, index);
            return;
        }
        if let Err(e) = check_r1(13, status) {
            self.rw_error(work, e);
            return;
        }
        self.rw_done(work, sectors);
    }

    /// `mmc_blk_issue_rw_rq` after a good completion.
    fn rw_done(&mut self, work: Work, sectors: u32) {
        let now = self.host.now();
        match work {
            Work::Rw {
                req,
                done,
                retries: _,
            } => {
                if req.op == BlkOp::Read && !self.read_in_place {
                    let lba = req.lba + u64::from(done);
                    let len = sectors as usize * 512;
                    self.data.read_data(&req, lba, &self.rbuf[..len]);
                }
                let done = done + sectors;
                if done < req.sectors {
                    // More pieces of a legacy reliable write: start the next at once.
                    self.start_rw(Work::Rw {
                        req,
                        done,
                        retries: 0,
                    });
                    return;
                }
                if req.op == BlkOp::Write && req.fua && !(self.f.rel_wr && self.cfg.cmd23) {
                    // FUA without reliable write: the block layer's post-flush.
                    if let Err(e) = self.flush_cache() {
                        let at = self.host.now();
                        self.sched.completed(&req, at);
                        self.fail(req, at, e.into());
                        return;
                    }
                }
                let at = self.host.now();
                self.sched.completed(&req, at);
                self.complete(req, at);
            }
            Work::Packed { reqs, .. } => {
                self.deliver_packed_reads(&reqs);
                for r in reqs {
                    self.sched.completed(&r, now);
                    self.complete(r, now);
                }
            }
            Work::Special(_) => {}
        }
    }

    /// `mmc_blk_cmd_recovery` and the retry decision.
    pub(super) fn rw_error(&mut self, work: Work, e: MmcError) {
        let retryable = matches!(
            e,
            MmcError::Host { .. } | MmcError::Timeout(_) | MmcError::Data(_)
        );
        log::debug!("mmcblk: request error {e}");
        // Get the card back to tran: a stop if it is still sending or receiving.
        match mmc_send_status(&mut self.host) {
            Ok(status) => {
                let state = r1_state(status);
                if state == CardState::Data.number() || state == CardState::Rcv.number() {
                    let _ = crate::mmc::mmc_wait_for_cmd(
                        &mut self.host,
                        MmcCommand::new(12, 0, ResponseType::R1b),
                    );
                }
            }
            // The card does not answer CMD13 at all (it lost power, or its RCA):
            // `mmc_blk_reset` re-initialises it once, then the request is retried.
            Err(status_error) if !self.reset_done => self.reset_card(&status_error),
            Err(_) => {}
        }
        self.host.wait_busy_until(None);
        let now = self.host.now();
        match work {
            Work::Rw { req, done, retries } if retryable && retries < self.cfg.retries => {
                self.stats.retries += 1;
                self.start_rw(Work::Rw {
                    req,
                    done,
                    retries: retries + 1,
                });
            }
            Work::Packed { reqs, retries } if retryable && retries < self.cfg.retries => {
                self.stats.retries += 1;
                self.start_packed(Work::Packed {
                    reqs,
                    retries: retries + 1,
                });
            }
            Work::Rw { req, .. } => {
                self.sched.completed(&req, now);
                self.fail(req, now, e.into());
            }
            Work::Packed { reqs, .. } => {
                for r in reqs {
                    self.sched.completed(&r, now);
                    self.fail(r, now, e.clone().into());
                }
            }
            Work::Special(_) => {}
        }
    }

    /// `mmc_blk_reset` → `mmc_hw_reset`: write the cache back if the card still takes
    /// commands, then bring it up again from idle with the same capabilities. Data the
    /// card had only in its volatile cache is lost if it had lost power, as on hardware.
    fn reset_card(&mut self, why: &MmcError) {
        log::warn!("mmcblk: the card does not answer ({why}); re-initialising it");
        self.reset_done = true;
        self.stats.resets += 1;
        if self.f.cache {
            let _ = mmc_switch(&mut self.host, &self.card, ext::FLUSH_CACHE, 1);
        }
        match mmc_init_card(&mut self.host, &self.cfg.caps) {
            Ok(card) => {
                let (f, limits, _) = Self::setup(&card, &self.cfg);
                self.card = card;
                self.f = f;
                self.limits = limits;
                self.bkops = BkopsState::default();
            }
            Err(e) => log::error!("mmcblk: re-initialising the card failed: {e}"),
        }
    }

    /// R1 EXCEPTION_EVENT: read EXT_CSD to find out which. URGENT_BKOPS is noted for
    /// the queue thread; a packed failure is returned as (PACKED_COMMAND_STATUS, 0-based
    /// index of the first failed entry).
    fn check_exception(&mut self, status: u32, packed: bool) -> Option<(u8, usize)> {
        if status & r1::EXCEPTION_EVENT == 0 {
            return None;
        }
        let e = match mmc_get_ext_csd(&mut self.host) {
            Ok(e) => e,
            Err(err) => {
                log::warn!("mmcblk: EXT_CSD after an exception event: {err}");
                return None;
            }
        };
        let events = u16::from(e[ext::EXCEPTION_EVENTS_STATUS]);
        if events & ext::EE_URGENT_BKOPS != 0 && self.f.bkops && self.cfg.bkops.enabled {
            self.bkops.urgent = true;
        }
        if packed && events & ext::EE_PACKED_FAILURE != 0 {
            let pstatus = e[ext::PACKED_COMMAND_STATUS];
            let index = if pstatus & ext::PACKED_STATUS_INDEXED_ERROR != 0 {
                usize::from(e[ext::PACKED_FAILURE_INDEX]).saturating_sub(1)
            } else {
                0
            };
            return Some((pstatus, index));
        }
        None
    }
}
