//! Requests without data transfer by the queue's reads and writes, run synchronously
//! with the pipeline drained: flush (CMD6 FLUSH_CACHE), discard, secure erase and write
//! zeroes — Linux's `mmc_blk_issue_flush`, `mmc_blk_issue_discard_rq`,
//! `mmc_blk_issue_secdiscard_rq` and the core's `mmc_erase`.

use crate::mmc::{check_r1, completion_result, mmc_send_status, mmc_switch, MmcError, MmcHostOps};
use crate::packing::{BlkOp, BlkRequest};
use crate::sdhci::{MmcCommand, MmcData, MmcRequest, ResponseType};
use emmc_card::ext_csd as ext;

use super::{BlkData, BlkError, MmcBlk};

/// CMD38 arguments (facts §1c).
pub(super) const MMC_ERASE_ARG: u32 = 0x0000_0000;
pub(super) const MMC_TRIM_ARG: u32 = 0x0000_0001;
pub(super) const MMC_DISCARD_ARG: u32 = 0x0000_0003;
pub(super) const MMC_SECURE_ERASE_ARG: u32 = 0x8000_0000;
pub(super) const MMC_SECURE_TRIM1_ARG: u32 = 0x8000_0001;
pub(super) const MMC_SECURE_TRIM2_ARG: u32 = 0x8000_8000;

/// Linux's erase time-out unit (`mmc_mmc_erase_timeout`: 300 ms × multiplier × groups).
pub(super) const ERASE_TIMEOUT_UNIT_MS: u64 = 300;

impl<H: MmcHostOps, D: BlkData> MmcBlk<H, D> {
    pub(super) fn flush_cache(&mut self) -> Result<(), MmcError> {
        if !self.f.cache {
            return Ok(());
        }
        self.stats.flushes += 1;
        mmc_switch(&mut self.host, &self.card, ext::FLUSH_CACHE, 1)
    }

    /// Flush and the erase family run synchronously, the pipeline drained before them.
    pub(super) fn issue_special(&mut self, req: BlkRequest) {
        let result = match req.op {
            BlkOp::Flush => self.flush_cache().map_err(BlkError::from),
            BlkOp::Discard => {
                let arg = if self.f.can_discard {
                    MMC_DISCARD_ARG
                } else if self.f.can_trim {
                    MMC_TRIM_ARG
                } else {
                    MMC_ERASE_ARG
                };
                self.mmc_erase(req.lba, u64::from(req.sectors), arg)
            }
            BlkOp::SecureErase => {
                if !self.f.can_secure_erase {
                    Err(BlkError::NotSupported(req.op))
                } else if self.f.can_trim && !self.group_aligned(req.lba, u64::from(req.sectors)) {
                    self.mmc_erase(req.lba, u64::from(req.sectors), MMC_SECURE_TRIM1_ARG)
                        .and_then(|()| {
                            self.mmc_erase(req.lba, u64::from(req.sectors), MMC_SECURE_TRIM2_ARG)
                        })
                } else {
                    self.mmc_erase(req.lba, u64::from(req.sectors), MMC_SECURE_ERASE_ARG)
                }
            }
            BlkOp::WriteZeroes => {
                if self.f.erased_zero && self.f.can_trim {
                    self.mmc_erase(req.lba, u64::from(req.sectors), MMC_TRIM_ARG)
                } else {
                    self.write_zeroes(req.lba, req.sectors)
                }
            }
            BlkOp::Read | BlkOp::Write => unreachable!("data requests are not special"),
        };
        let now = self.host.now();
        self.sched.completed(&req, now);
        match result {
            Ok(()) => self.complete(req, now),
            Err(e) => self.fail(req, now, e),
        }
    }

    fn group_aligned(&self, from: u64, nr: u64) -> bool {
        from % self.f.erase_group == 0 && nr % self.f.erase_group == 0
    }

    /// Write zeroes by writing them, in requests of the queue's size.
    fn write_zeroes(&mut self, lba: u64, sectors: u32) -> Result<(), BlkError> {
        let mut at = lba;
        let mut left = sectors;
        while left > 0 {
            let n = left.min(self.cfg.max_sectors);
            let len = n as usize * 512;
            self.wbuf[512..512 + len].fill(0);
            let mut sg = [&self.wbuf[512..512 + len]];
            let done = self.host.request(MmcRequest {
                sbc: Some(MmcCommand::new(23, n, ResponseType::R1)),
                cmd: MmcCommand::new(25, self.card.address(at), ResponseType::R1),
                data: Some(MmcData::write(512, n, &mut sg)),
                stop: Some(MmcCommand::new(12, 0, ResponseType::R1b)),
            });
            self.stats.mmc_requests += 1;
            completion_result(&done)?;
            check_r1(13, mmc_send_status(&mut self.host)?)?;
            at += u64::from(n);
            left -= n;
        }
        Ok(())
    }

    /// `mmc_erase`: erase (and secure erase) shrunk to whole erase groups; trim and
    /// discard exactly; each CMD38 limited to what the host's busy time-out allows.
    fn mmc_erase(&mut self, from: u64, nr: u64, arg: u32) -> Result<(), BlkError> {
        let g = self.f.erase_group;
        let (from, nr) = if matches!(arg, MMC_ERASE_ARG | MMC_SECURE_ERASE_ARG) {
            match whole_groups(from, nr, g) {
                Some(range) => range,
                None => return Ok(()),
            }
        } else {
            (from, nr)
        };
        let mult = match arg {
            MMC_ERASE_ARG => self.f.erase_timeout_mult,
            MMC_SECURE_ERASE_ARG => self.f.erase_timeout_mult * self.f.sec_erase_mult,
            MMC_SECURE_TRIM1_ARG | MMC_SECURE_TRIM2_ARG => {
                self.f.erase_timeout_mult * self.f.sec_trim_mult
            }
            _ => self.f.trim_mult,
        };
        let per_group_ms = ERASE_TIMEOUT_UNIT_MS * mult;
        let max_busy = u64::from(self.host.max_busy_timeout_ms());
        let max_groups = if max_busy == 0 {
            u64::MAX
        } else {
            (max_busy / per_group_ms).max(1)
        };
        if arg == MMC_SECURE_TRIM2_ARG {
            return self.erase_cmds(from, from, arg, per_group_ms);
        }
        let mut at = from;
        let end = from + nr;
        while at < end {
            let (to, groups) = next_cmd38(at, end, g, max_groups);
            self.erase_cmds(at, to - 1, arg, per_group_ms * groups)?;
            at = to;
        }
        Ok(())
    }

    fn erase_cmds(
        &mut self,
        from: u64,
        to: u64,
        arg: u32,
        timeout_ms: u64,
    ) -> Result<(), BlkError> {
        use crate::mmc::mmc_send_r1;
        self.stats.erases += 1;
        mmc_send_r1(&mut self.host, 35, self.card.address(from))?;
        mmc_send_r1(&mut self.host, 36, self.card.address(to))?;
        let cmd = MmcCommand::new(38, arg, ResponseType::R1b)
            .with_busy_timeout(timeout_ms.min(u64::from(u32::MAX)) as u32);
        let done = self.host.start_request(MmcRequest::command(cmd));
        completion_result(&done)?;
        self.host.wait_busy_until(None);
        check_r1(13, mmc_send_status(&mut self.host)?)?;
        Ok(())
    }
}

/// The part of `nr` sectors from `from` that erase and secure erase act on: whole erase
/// groups of `group` sectors (`mmc_erase` rounds the start up and the length down), `None`
/// when not one whole group is inside.
fn whole_groups(from: u64, nr: u64, group: u64) -> Option<(u64, u64)> {
    let (mut from, mut nr) = (from, nr);
    let rem = from % group;
    if rem != 0 {
        let skip = group - rem;
        if nr <= skip {
            return None;
        }
        from += skip;
        nr -= skip;
    }
    nr -= nr % group;
    (nr != 0).then_some((from, nr))
}

/// The next CMD38 of an erase from sector `at` to before `end`: at most `max_groups`
/// erase groups of `group` sectors, ending at an erase-group boundary unless the range
/// ends first. Returns where it ends (exclusive) and how many groups it touches, which
/// its busy time-out is counted in.
fn next_cmd38(at: u64, end: u64, group: u64, max_groups: u64) -> (u64, u64) {
    let group_end = (at / group)
        .saturating_add(max_groups)
        .saturating_mul(group);
    let to = end.min(group_end);
    (to, (to - 1) / group - at / group + 1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn erase_keeps_only_whole_erase_groups() {
        assert_eq!(whole_groups(0, 3072, 1024), Some((0, 3072)));
        assert_eq!(whole_groups(100, 3000, 1024), Some((1024, 2048)));
        assert_eq!(whole_groups(1024, 2047, 1024), Some((1024, 1024)));
        assert_eq!(
            whole_groups(100, 924, 1024),
            None,
            "ends at the first boundary"
        );
        assert_eq!(
            whole_groups(100, 1500, 1024),
            None,
            "no whole group after it"
        );
        assert_eq!(whole_groups(5, 7, 1), Some((5, 7)));
    }

    #[test]
    fn each_cmd38_covers_at_most_max_groups_and_stops_on_a_boundary() {
        // Three groups per CMD38 from the middle of group 0: it ends with group 2.
        assert_eq!(next_cmd38(100, 10_000, 1024, 3), (3072, 3));
        assert_eq!(next_cmd38(3072, 10_000, 1024, 3), (6144, 3));
        // The range ends first: a partial group counts as one.
        assert_eq!(next_cmd38(6144, 6200, 1024, 3), (6200, 1));
        assert_eq!(next_cmd38(1000, 1100, 1024, 3), (1100, 2));
        // No busy limit.
        assert_eq!(next_cmd38(0, 1 << 40, 1024, u64::MAX), (1 << 40, 1 << 30));
    }
}
