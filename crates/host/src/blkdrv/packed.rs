//! Packed commands (eMMC 4.5): the packed header and data of a packed write, the two
//! requests of a packed read (header by CMD25, data by CMD18), and what a packed failure
//! leaves to do — Linux's `mmc_blk_packed_hdr_wrq_prep`, `mmc_blk_packed_err_check` and
//! `mmc_blk_end_packed_req`. Which requests form a packed command is
//! [`crate::packing`]'s.

use crate::mmc::{completion_result, MmcHostOps, MMC_CMD23_ARG_PACKED};
use crate::packing::{BlkOp, BlkRequest};
use crate::sdhci::{MmcCommand, MmcData, MmcRequest, ResponseType};
use emmc_card::packed;

use super::queue::{Active, Work};
use super::{BlkData, BlkError, MmcBlk};

impl<H: MmcHostOps, D: BlkData> MmcBlk<H, D> {
    pub(super) fn start_packed(&mut self, work: Work) {
        let Work::Packed { reqs, .. } = &work else {
            unreachable!("start_packed takes Packed work")
        };
        let write = reqs[0].op == BlkOp::Write;
        let total: u32 = reqs.iter().map(|r| r.sectors).sum();
        let header = packed::Header {
            direction: if write {
                packed::Direction::Write
            } else {
                packed::Direction::Read
            },
            entries: reqs
                .iter()
                .map(|r| {
                    packed::Entry::new(
                        r.sectors as u16,
                        self.card.address(r.lba),
                        write && r.fua && self.f.rel_wr,
                    )
                })
                .collect(),
        };
        self.wbuf[..512].copy_from_slice(&header.encode());
        if write {
            let mut at = 512;
            for r in reqs {
                let len = r.sectors as usize * 512;
                self.data.write_data(r, r.lba, &mut self.wbuf[at..at + len]);
                at += len;
            }
        }
        let address = self.card.address(reqs[0].lba);
        self.stats.mmc_requests += 1;
        let done = if write {
            self.stats.packed_writes += 1;
            let blocks = total + 1;
            let mut sg = [&self.wbuf[..blocks as usize * 512]];
            self.host.start_request(MmcRequest {
                sbc: Some(MmcCommand::new(
                    23,
                    MMC_CMD23_ARG_PACKED | blocks,
                    ResponseType::R1,
                )),
                cmd: MmcCommand::new(25, address, ResponseType::R1),
                data: Some(MmcData::write(512, blocks, &mut sg)),
                stop: Some(MmcCommand::new(12, 0, ResponseType::R1b)),
            })
        } else {
            // Packed read: the header by CMD25, then the entries by CMD18 (facts §7.4).
            self.stats.packed_reads += 1;
            self.stats.mmc_requests += 1;
            let mut sg = [&self.wbuf[..512]];
            let h = self.host.request(MmcRequest {
                sbc: Some(MmcCommand::new(
                    23,
                    MMC_CMD23_ARG_PACKED | 1,
                    ResponseType::R1,
                )),
                cmd: MmcCommand::new(25, address, ResponseType::R1),
                data: Some(MmcData::write(512, 1, &mut sg)),
                stop: Some(MmcCommand::new(12, 0, ResponseType::R1b)),
            });
            if completion_result(&h).is_err() {
                h
            } else {
                let len = total as usize * 512;
                let mut sg = [&mut self.rbuf[..len]];
                self.host.start_request(MmcRequest {
                    sbc: Some(MmcCommand::new(
                        23,
                        MMC_CMD23_ARG_PACKED | total,
                        ResponseType::R1,
                    )),
                    cmd: MmcCommand::new(18, address, ResponseType::R1),
                    data: Some(MmcData::read(512, total, &mut sg)),
                    stop: Some(MmcCommand::new(12, 0, ResponseType::R1)),
                })
            }
        };
        let busy = done.busy_pending;
        self.active = Some(Active::Rw {
            work,
            sectors: total,
            busy,
            done,
        });
    }

    /// A packed read's data arrived as the entries' data back to back.
    pub(super) fn deliver_packed_reads(&mut self, reqs: &[BlkRequest]) {
        if reqs.first().is_none_or(|r| r.op != BlkOp::Read) {
            return;
        }
        let mut at = 0;
        for r in reqs {
            let len = r.sectors as usize * 512;
            self.data.read_data(r, r.lba, &self.rbuf[at..at + len]);
            at += len;
        }
    }

    /// A packed command failed (`mmc_blk_packed_err_check`, `mmc_blk_end_packed_req`):
    /// the entries before PACKED_FAILURE_INDEX landed and complete; the command is sent
    /// again from the failed entry. Without an index the whole command is retried.
    pub(super) fn packed_failed(
        &mut self,
        reqs: Vec<BlkRequest>,
        retries: u32,
        pstatus: u8,
        index: usize,
    ) {
        let now = self.host.now();
        let first_failed = index.min(reqs.len());
        log::debug!(
            "mmcblk: packed command failed (status {pstatus:#04x}) at entry {}",
            first_failed + 1
        );
        self.deliver_packed_reads(&reqs[..first_failed]);
        for r in &reqs[..first_failed] {
            self.sched.completed(r, now);
            self.complete(*r, now);
        }
        let rest = reqs[first_failed..].to_vec();
        if rest.is_empty() {
            return;
        }
        if retries >= self.cfg.retries {
            for r in rest {
                self.sched.completed(&r, now);
                self.fail(r, now, BlkError::Packed { status: pstatus });
            }
            return;
        }
        self.stats.retries += 1;
        if rest.len() == 1 {
            self.start_rw(Work::Rw {
                req: rest[0],
                done: 0,
                retries: retries + 1,
            });
        } else {
            self.start_packed(Work::Packed {
                reqs: rest,
                retries: retries + 1,
            });
        }
    }
}
