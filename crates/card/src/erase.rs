//! The erase family: CMD35 ERASE_GROUP_START, CMD36 ERASE_GROUP_END, CMD38 ERASE with
//! erase, trim, discard, secure erase and both secure-trim steps; sanitize's purge.
//!
//! Erase and secure erase act on whole erase groups (HC_ERASE_GRP_SIZE when
//! ERASE_GROUP_DEF is set, the CSD's legacy group otherwise) containing the range; trim
//! and discard act on exactly the sectors given. Erased sectors read back as
//! ERASED_MEM_CONT says. Write-protected groups are skipped with WP_ERASE_SKIP. The erase
//! takes effect when its busy period ends; an HPI abandons it. The sequence and the
//! secure-trim marks are the erase part (`parts/erase.rs`).

use super::partition::Partition;
use super::parts::busy::OpKind;
use super::parts::erase::{whole_groups, EraseOp};
use super::status::r1;
use super::{ext_csd, Card, Exec, Handled};
use crate::timing::{Erase, EraseKind};

/// CMD38 arguments.
pub const ERASE_ARG: u32 = 0x0000_0000;
pub const TRIM_ARG: u32 = 0x0000_0001;
pub const DISCARD_ARG: u32 = 0x0000_0003;
pub const SECURE_ERASE_ARG: u32 = 0x8000_0000;
pub const SECURE_TRIM1_ARG: u32 = 0x8000_0001;
pub const SECURE_TRIM2_ARG: u32 = 0x8000_8000;

impl Card {
    /// Erase group size in sectors, as ERASE_GROUP_DEF selects.
    pub(super) fn erase_group_sectors(&self) -> u64 {
        if self.regs.hc_erase_groups() {
            self.model.hc_erase_group_sectors()
        } else {
            self.model.legacy_erase_group_sectors()
        }
        .max(1)
    }

    fn erase_address(&self, x: &mut Exec) -> Option<u64> {
        let partition = self.current_partition();
        if partition == Partition::Rpmb {
            x.resp_status |= r1::ERROR;
            return None;
        }
        match self.address_to_lba(x.arg) {
            Ok(lba) if lba < self.partition_sectors(partition) => Some(lba),
            Ok(_) => {
                x.resp_status |= r1::ADDRESS_OUT_OF_RANGE;
                None
            }
            Err(e) => {
                x.resp_status |= e;
                None
            }
        }
    }

    pub(super) fn cmd35_erase_group_start(&mut self, x: &mut Exec) -> Handled {
        let lba = self.erase_address(x);
        self.erase.set_start(lba);
        Handled::R1
    }

    pub(super) fn cmd36_erase_group_end(&mut self, x: &mut Exec) -> Handled {
        if !self.erase.accepts_end() {
            x.resp_status |= r1::ERASE_SEQ_ERROR;
            self.erase.reset_sequence();
            return Handled::R1;
        }
        let lba = self.erase_address(x);
        self.erase.set_end(lba);
        Handled::R1
    }

    pub(super) fn cmd38_erase(&mut self, x: &mut Exec) -> Handled {
        let Some((start, end)) = self.erase.take_range() else {
            x.resp_status |= r1::ERASE_SEQ_ERROR;
            return Handled::R1b;
        };
        let features = self.model.ext_csd.sec_feature_support;
        let trim = features & ext_csd::SEC_GB_CL_EN != 0;
        let secure = features & ext_csd::SECURE_ER_EN != 0;
        let kind = match x.arg {
            ERASE_ARG => Some(EraseKind::Erase),
            TRIM_ARG if trim => Some(EraseKind::Trim),
            DISCARD_ARG => Some(EraseKind::Discard),
            SECURE_ERASE_ARG if secure => Some(EraseKind::SecureErase),
            SECURE_TRIM1_ARG if secure && trim => Some(EraseKind::SecureTrim1),
            SECURE_TRIM2_ARG if secure && trim => Some(EraseKind::SecureTrim2),
            _ => None,
        };
        let Some(kind) = kind else {
            log::debug!(
                "CMD38 arg {:#010x}: not an erase type this card supports",
                x.arg
            );
            x.after_status |= r1::ERASE_PARAM;
            return Handled::R1b;
        };
        if end < start {
            x.after_status |= r1::ERASE_PARAM;
            return Handled::R1b;
        }
        let partition = self.current_partition();
        let extent = self.partitions.extent(partition);
        let (first, last) = match kind {
            EraseKind::Erase | EraseKind::SecureErase => {
                whole_groups(start, end, self.erase_group_sectors(), extent.sectors)
            }
            _ => (start, end),
        };
        // Split into runs that skip write-protected sectors (by WP group).
        let mut runs: Vec<(u64, u64)> = Vec::new();
        let mut skipped = false;
        let step = self.wp_group_sectors(partition).max(1);
        let mut lba = first;
        while lba <= last {
            let piece_end = ((lba / step + 1) * step).min(last + 1);
            if self.is_write_protected(partition, lba, piece_end - lba) {
                skipped = true;
            } else {
                match runs.last_mut() {
                    Some((s, n)) if *s + *n == extent.start + lba => *n += piece_end - lba,
                    _ => runs.push((extent.start + lba, piece_end - lba)),
                }
            }
            lba = piece_end;
        }
        if skipped {
            x.after_status |= r1::WP_ERASE_SKIP;
        }
        let g = self.erase_group_sectors();
        let count = last - first + 1;
        let erase = Erase {
            kind,
            sector: extent.start + first,
            count,
            groups: last / g - first / g + 1,
        };
        let runs = if kind == EraseKind::SecureTrim2 {
            self.erase.take_marks()
        } else {
            runs
        };
        self.stats.erases += 1;
        let cost = self.timing.erase(self.now, &erase);
        self.busy.add_background(cost.background_ns);
        self.begin_op(cost.busy_ns, OpKind::Erase(EraseOp { erase, runs }));
        Handled::R1b
    }

    /// The erase completed: change the data.
    pub(super) fn apply_erase(&mut self, op: &EraseOp) {
        if op.erase.kind == EraseKind::SecureTrim1 {
            // Step 1 only marks the sectors; step 2 (or sanitize) purges them.
            self.erase.mark(&op.runs);
            return;
        }
        self.erase_runs(&op.runs);
    }

    fn erase_runs(&mut self, runs: &[(u64, u64)]) {
        let pattern = if self.model.ext_csd.erased_mem_cont & 1 != 0 {
            0xFF
        } else {
            0x00
        };
        for &(sector, count) in runs {
            self.cache.invalidate(sector, count);
            if let Err(e) = self.store.fill(sector * 512, count * 512, pattern) {
                log::error!("erasing {count} sectors at image sector {sector}: {e}");
                self.regs.raise(r1::ERROR);
            }
        }
    }

    /// SANITIZE_START purges what secure trim marked.
    pub(super) fn purge_secure_trim_marks(&mut self) {
        let marks = self.erase.take_marks();
        self.erase_runs(&marks);
    }

    /// Erase a whole partition (CMD42 forced erase).
    pub(super) fn erase_partition(&mut self, partition: Partition) {
        let e = self.partitions.extent(partition);
        if e.exists() {
            self.erase_runs(&[(e.start, e.sectors)]);
        }
    }
}
