//! The commands of the protection part: CMD28/29/30/31 (write-protect groups of the user
//! area and the general purpose partitions, temporary, power-on or permanent as USER_WP
//! selects) and CMD42 LOCK_UNLOCK's data block. The state and its rules are
//! `parts/protection.rs`; the card decodes addresses into groups, saves what persists
//! and goes busy.

use super::partition::Partition;
use super::parts::busy::OpKind;
use super::parts::protection::{LockOutcome, WpKind};
use super::status::r1;
use super::{ext_csd, Card, Exec, Handled};
use crate::timing::SwitchKind;

impl Card {
    /// Write-protect group size in sectors for `partition`, as ERASE_GROUP_DEF selects.
    pub(super) fn wp_group_sectors(&self, partition: Partition) -> u64 {
        if !partition.has_wp_groups() {
            return self.partition_sectors(partition).max(1);
        }
        if self.regs.hc_erase_groups() {
            self.model.hc_wp_group_sectors()
        } else {
            self.model.legacy_wp_group_sectors()
        }
        .max(1)
    }

    /// The whole user area refuses writes (CSD temporary or permanent write protection).
    pub fn user_area_write_protected(&self) -> bool {
        self.csd_write_protected()
    }

    /// Whole-card protection from the CSD.
    fn csd_write_protected(&self) -> bool {
        self.regs.csd_write_protected()
    }

    /// Would writing `[lba, lba+count)` of `partition` violate write protection?
    #[inline]
    pub(super) fn is_write_protected(&self, partition: Partition, lba: u64, count: u64) -> bool {
        self.protection
            .is_protected(partition, lba, count, self.csd_write_protected())
    }

    /// Decode a CMD28..31 address into (partition, group-aligned LBA, group size).
    fn wp_group_of(&self, x: &mut Exec) -> Option<(Partition, u64, u64)> {
        let partition = self.current_partition();
        if !partition.has_wp_groups() || !self.model.csd.wp_grp_enable {
            x.resp_status |= r1::ERROR;
            return None;
        }
        let lba = match self.address_to_lba(x.arg) {
            Ok(lba) if lba < self.partition_sectors(partition) => lba,
            Ok(_) => {
                x.resp_status |= r1::ADDRESS_OUT_OF_RANGE;
                return None;
            }
            Err(e) => {
                x.resp_status |= e;
                return None;
            }
        };
        let g = self.wp_group_sectors(partition);
        Some((partition, lba - lba % g, g))
    }

    pub(super) fn cmd28_set_write_prot(&mut self, x: &mut Exec) -> Handled {
        let Some((partition, start, g)) = self.wp_group_of(x) else {
            return Handled::R1b;
        };
        let kind = WpKind::for_user_wp(self.regs.user_wp());
        let sectors = g.min(self.partition_sectors(partition) - start);
        self.protection.set_group(partition, start, sectors, kind);
        if kind != WpKind::PowerOn {
            self.save_persistent();
        }
        let cost = self.timing.switch(self.now, SwitchKind::Generic);
        self.begin_op(cost.busy_ns, OpKind::Busy);
        Handled::R1b
    }

    pub(super) fn cmd29_clr_write_prot(&mut self, x: &mut Exec) -> Handled {
        let Some((partition, start, _)) = self.wp_group_of(x) else {
            return Handled::R1b;
        };
        match self.protection.clear_group(partition, start) {
            Ok(true) => self.save_persistent(),
            Ok(false) => {}
            Err(()) => x.after_status |= r1::WP_VIOLATION,
        }
        let cost = self.timing.switch(self.now, SwitchKind::Generic);
        self.begin_op(cost.busy_ns, OpKind::Busy);
        Handled::R1b
    }

    /// CMD30 (one bit per group, `types == false`) or CMD31 (two bits per group) for the 32
    /// groups starting at the group of `arg`; bit 0 / bits 1:0 describe the first group.
    pub(super) fn write_protect_bits(&mut self, arg: u32, types: bool) -> Result<u64, u32> {
        let mut x = Exec {
            now: self.now,
            index: 30,
            arg,
            resp_status: 0,
            after_status: 0,
            sbc: None,
        };
        let Some((partition, start, g)) = self.wp_group_of(&mut x) else {
            return Err(x.resp_status);
        };
        let size = self.partition_sectors(partition);
        Ok(self
            .protection
            .group_bits(partition, start, g, size, types, self.csd_write_protected()))
    }

    /// A CMD42 data block arrived (see `parts/protection.rs` for its format).
    pub(super) fn lock_unlock(&mut self, block: &[u8]) {
        let disabled = self.regs.user_wp() & ext_csd::PERM_PSWD_DIS != 0;
        match self.protection.lock_request(block, disabled) {
            Ok(outcome) => {
                if outcome == LockOutcome::ForcedErase {
                    log::info!(
                        "CMD42 forced erase: user data, password and temporary protection cleared"
                    );
                    self.erase_partition(Partition::User);
                    for i in 0..4 {
                        self.erase_partition(Partition::Gp(i));
                    }
                }
                self.save_persistent();
            }
            Err(why) => {
                log::debug!("CMD42: LOCK_UNLOCK_FAILED: {why}");
                self.regs.raise(r1::LOCK_UNLOCK_FAILED);
            }
        }
    }
}
