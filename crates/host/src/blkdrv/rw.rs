//! Reads and writes (`mmc_blk_rw_rq_prep`, `mmc_blk_issue_rw_rq`): one MMC request per
//! block request, closed-ended with CMD23 or open-ended with CMD12, FUA as reliable write
//! (split into pieces by the legacy rule, `mmc_apply_rel_rw`), the data moved through
//! the driver's buffers.

use crate::mmc::{MmcHostOps, MMC_CMD23_ARG_REL_WR};
use crate::packing::{BlkOp, BlkRequest};
use crate::sdhci::{MmcCommand, MmcData, MmcRequest, ResponseType};

use super::queue::{Active, Work};
use super::{BlkData, MmcBlk};

impl<H: MmcHostOps, D: BlkData> MmcBlk<H, D> {
    /// How many sectors of a (remaining) write go in the next MMC request: all of them,
    /// or a legacy reliable-write piece (`mmc_apply_rel_rw`).
    fn piece(&self, req: &BlkRequest, lba: u64, left: u32) -> u32 {
        let rel = req.op == BlkOp::Write && req.fua && self.f.rel_wr && self.cfg.cmd23;
        if !rel || self.f.enhanced_rel_wr {
            return left;
        }
        let rs = self.f.rel_sectors;
        if lba % u64::from(rs) != 0 {
            1
        } else if left > rs {
            rs
        } else if left < rs {
            1
        } else {
            left
        }
    }

    pub(super) fn start_rw(&mut self, work: Work) {
        let Work::Rw { req, done, .. } = work else {
            unreachable!("start_rw takes Rw work")
        };
        let lba = req.lba + u64::from(done);
        let left = req.sectors - done;
        let n = self.piece(&req, lba, left);
        let write = req.op == BlkOp::Write;
        let rel = write && req.fua && self.f.rel_wr && self.cfg.cmd23;
        let address = self.card.address(lba);
        let multi = n > 1 || rel;
        let len = n as usize * 512;
        let (sbc, cmd, stop) = if multi && self.cfg.cmd23 {
            let flags = if rel { MMC_CMD23_ARG_REL_WR } else { 0 };
            let opcode = if write { 25 } else { 18 };
            (
                Some(MmcCommand::new(23, n | flags, ResponseType::R1)),
                MmcCommand::new(opcode, address, ResponseType::R1),
                Some(MmcCommand::new(
                    12,
                    0,
                    if write {
                        ResponseType::R1b
                    } else {
                        ResponseType::R1
                    },
                )),
            )
        } else if multi {
            let opcode = if write { 25 } else { 18 };
            (
                None,
                MmcCommand::new(opcode, address, ResponseType::R1),
                Some(MmcCommand::new(
                    12,
                    0,
                    if write {
                        ResponseType::R1b
                    } else {
                        ResponseType::R1
                    },
                )),
            )
        } else {
            let opcode = if write { 24 } else { 17 };
            (
                None,
                MmcCommand::new(opcode, address, ResponseType::R1),
                None,
            )
        };
        if rel {
            self.stats.reliable_writes += 1;
        }
        self.stats.mmc_requests += 1;
        let done_c = if write {
            self.data
                .write_data(&req, lba, &mut self.wbuf[512..512 + len]);
            let mut sg = [&self.wbuf[512..512 + len]];
            self.host.start_request(MmcRequest {
                sbc,
                cmd,
                data: Some(MmcData::write(512, n, &mut sg)),
                stop,
            })
        } else {
            let mut sg = [&mut self.rbuf[..len]];
            self.host.start_request(MmcRequest {
                sbc,
                cmd,
                data: Some(MmcData::read(512, n, &mut sg)),
                stop,
            })
        };
        let busy = done_c.busy_pending;
        self.active = Some(Active::Rw {
            work,
            sectors: n,
            busy,
            done: done_c,
        });
    }
}
