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
        mmc_apply_rel_rw(self.f.rel_sectors, lba, left)
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
        let len = n as usize * 512;
        let (sbc, cmd, stop) = rw_commands(write, n, address, rel, self.cfg.cmd23);
        if rel {
            self.stats.reliable_writes += 1;
        }
        self.stats.mmc_requests += 1;
        // The data moves between the card and the request's own memory when that is one
        // piece; otherwise through the driver's buffers.
        let done_c = if write {
            let source: &[u8] = match self.data.write_source(&req, lba, len) {
                Some(data) => {
                    self.stats.in_place += 1;
                    data
                }
                None => {
                    self.data
                        .write_data(&req, lba, &mut self.wbuf[512..512 + len]);
                    &self.wbuf[512..512 + len]
                }
            };
            let mut sg = [source];
            self.host.start_request(MmcRequest {
                sbc,
                cmd,
                data: Some(MmcData::write(512, n, &mut sg)),
                stop,
            })
        } else {
            let target = self.data.read_target(&req, lba, len);
            self.read_in_place = target.is_some();
            let target: &mut [u8] = match target {
                Some(memory) => {
                    self.stats.in_place += 1;
                    memory
                }
                None => &mut self.rbuf[..len],
            };
            let mut sg = [target];
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

/// `mmc_apply_rel_rw`: the next piece of a legacy reliable write at `lba` with `left`
/// sectors to go, REL_WR_SEC_C being `rel_sectors`: an address not aligned to it goes one
/// block at a time, more than REL_WR_SEC_C blocks go in REL_WR_SEC_C pieces, fewer in
/// single blocks.
fn mmc_apply_rel_rw(rel_sectors: u32, lba: u64, left: u32) -> u32 {
    if lba % u64::from(rel_sectors) != 0 {
        1
    } else if left > rel_sectors {
        rel_sectors
    } else if left < rel_sectors {
        1
    } else {
        left
    }
}

/// The commands of one read or write of `n` blocks at `address` (`mmc_blk_rw_rq_prep`):
/// SET_BLOCK_COUNT (with the reliable-write flag for `rel`), the command and the stop
/// (R1b after a write) for more than one block or a reliable write, closed-ended with
/// `cmd23`, else open-ended; CMD17/CMD24 alone for one block.
fn rw_commands(
    write: bool,
    n: u32,
    address: u32,
    rel: bool,
    cmd23: bool,
) -> (Option<MmcCommand>, MmcCommand, Option<MmcCommand>) {
    let multi = n > 1 || rel;
    if !multi {
        let opcode = if write { 24 } else { 17 };
        return (
            None,
            MmcCommand::new(opcode, address, ResponseType::R1),
            None,
        );
    }
    let flags = if rel { MMC_CMD23_ARG_REL_WR } else { 0 };
    let sbc = cmd23.then(|| MmcCommand::new(23, n | flags, ResponseType::R1));
    let opcode = if write { 25 } else { 18 };
    let stop_resp = if write {
        ResponseType::R1b
    } else {
        ResponseType::R1
    };
    (
        sbc,
        MmcCommand::new(opcode, address, ResponseType::R1),
        Some(MmcCommand::new(12, 0, stop_resp)),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn legacy_reliable_write_pieces_follow_mmc_apply_rel_rw() {
        // REL_WR_SEC_C = 8.
        assert_eq!(mmc_apply_rel_rw(8, 3, 20), 1, "unaligned: one block");
        assert_eq!(mmc_apply_rel_rw(8, 8, 20), 8, "more: REL_WR_SEC_C");
        assert_eq!(mmc_apply_rel_rw(8, 16, 8), 8, "exactly REL_WR_SEC_C");
        assert_eq!(mmc_apply_rel_rw(8, 16, 5), 1, "fewer: single blocks");
        assert_eq!(mmc_apply_rel_rw(1, 7, 20), 1, "REL_WR_SEC_C 1");
    }

    #[test]
    fn one_block_is_cmd17_or_cmd24_and_more_are_closed_or_open_ended() {
        let (sbc, cmd, stop) = rw_commands(false, 1, 0x100, false, true);
        assert_eq!((sbc, cmd.opcode, cmd.arg, stop), (None, 17, 0x100, None));
        let (sbc, cmd, stop) = rw_commands(true, 1, 0x100, false, true);
        assert_eq!((sbc, cmd.opcode, stop), (None, 24, None));
        let (sbc, cmd, stop) = rw_commands(true, 16, 0x100, false, true);
        assert_eq!(sbc.map(|c| (c.opcode, c.arg)), Some((23, 16)));
        assert_eq!((cmd.opcode, cmd.arg), (25, 0x100));
        let stop = stop.expect("a stop for a failed transfer");
        assert_eq!(
            (stop.opcode, stop.resp_type, stop.busy),
            (12, ResponseType::R1b, true)
        );
        let (sbc, cmd, stop) = rw_commands(false, 16, 0x100, false, false);
        assert_eq!((sbc, cmd.opcode), (None, 18));
        assert_eq!(
            stop.map(|c| (c.opcode, c.resp_type)),
            Some((12, ResponseType::R1))
        );
        // A reliable write of one block is still a CMD23-bounded CMD25.
        let (sbc, cmd, _) = rw_commands(true, 1, 0x100, true, true);
        assert_eq!(sbc.map(|c| c.arg), Some(MMC_CMD23_ARG_REL_WR | 1));
        assert_eq!(cmd.opcode, 25);
    }
}
