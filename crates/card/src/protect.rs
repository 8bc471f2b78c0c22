//! Write protection: CMD28/29/30/31 write-protect groups of the user area and the general
//! purpose partitions (temporary, power-on or permanent, as USER_WP selects), boot-area
//! protection (BOOT_WP power-on and permanent), and whole-card protection from the CSD
//! (TMP_WRITE_PROTECT, PERM_WRITE_PROTECT).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::operation::OpKind;
use super::partition::Partition;
use super::status::r1;
use super::{ext_csd, Card, Exec, Handled};
use crate::timing::SwitchKind;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub(super) enum WpKind {
    /// Cleared by CMD29; survives power cycles.
    Temporary,
    /// Cleared by the next power cycle.
    PowerOn,
    /// Forever.
    Permanent,
}

impl WpKind {
    /// CMD31 encoding: 01 temporary, 10 power-on, 11 permanent.
    fn code(self) -> u64 {
        match self {
            WpKind::Temporary => 1,
            WpKind::PowerOn => 2,
            WpKind::Permanent => 3,
        }
    }
}

/// One protected write-protect group, as saved in the image sidecar.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct WpRecord {
    pub partition: u8,
    pub start: u64,
    pub sectors: u64,
    pub kind: WpKind,
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(super) struct WriteProtect {
    /// (partition index, first sector of the group) → (sectors, kind).
    groups: BTreeMap<(u8, u64), (u64, WpKind)>,
    /// Largest group ever recorded, to bound overlap searches.
    max_group: u64,
    pub boot_power_on: [bool; 2],
    pub boot_permanent: [bool; 2],
}

impl WriteProtect {
    pub fn power_on_reset(&mut self) {
        self.groups.retain(|_, (_, kind)| *kind != WpKind::PowerOn);
        self.boot_power_on = [false; 2];
    }

    fn set(&mut self, partition: Partition, start: u64, sectors: u64, kind: WpKind) {
        let key = (partition.access_bits(), start);
        match self.groups.get(&key) {
            Some((_, WpKind::Permanent)) => {}
            _ => {
                self.groups.insert(key, (sectors, kind));
                self.max_group = self.max_group.max(sectors);
            }
        }
    }

    /// The kind of protection covering `lba`, if any.
    fn kind_at(&self, partition: Partition, lba: u64) -> Option<WpKind> {
        self.overlapping(partition, lba, 1)
            .next()
            .map(|(_, _, k)| k)
    }

    /// Protected groups overlapping `[lba, lba+count)`.
    fn overlapping(
        &self,
        partition: Partition,
        lba: u64,
        count: u64,
    ) -> impl Iterator<Item = (u64, u64, WpKind)> + '_ {
        let p = partition.access_bits();
        let end = lba.saturating_add(count);
        let floor = lba.saturating_sub(self.max_group);
        self.groups
            .range((p, floor)..(p, end))
            .map(|(&(_, start), &(len, kind))| (start, len, kind))
            .filter(move |&(start, len, _)| start + len > lba)
    }

    pub fn records(&self) -> Vec<WpRecord> {
        self.groups
            .iter()
            .filter(|(_, (_, kind))| *kind != WpKind::PowerOn)
            .map(|(&(partition, start), &(sectors, kind))| WpRecord {
                partition,
                start,
                sectors,
                kind,
            })
            .collect()
    }

    pub fn restore(&mut self, records: &[WpRecord]) {
        for r in records {
            self.set(
                Partition::from_access(r.partition),
                r.start,
                r.sectors,
                r.kind,
            );
        }
    }

    /// Forget temporary protection (CMD42 forced erase).
    pub fn clear_temporary(&mut self) {
        self.groups
            .retain(|_, (_, kind)| *kind != WpKind::Temporary);
    }
}

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
    pub(super) fn is_write_protected(&self, partition: Partition, lba: u64, count: u64) -> bool {
        match partition {
            Partition::Rpmb => false,
            Partition::Boot1 | Partition::Boot2 => {
                let i = usize::from(partition == Partition::Boot2);
                self.csd_write_protected()
                    || self.protect.boot_power_on[i]
                    || self.protect.boot_permanent[i]
            }
            Partition::User | Partition::Gp(_) => {
                self.csd_write_protected()
                    || self
                        .protect
                        .overlapping(partition, lba, count)
                        .next()
                        .is_some()
            }
        }
    }

    /// BOOT_WP_STATUS: per boot area 0 none, 1 power-on, 2 permanent.
    pub(super) fn boot_wp_status(&self) -> u8 {
        (0..2).fold(0u8, |acc, i| {
            let s = if self.protect.boot_permanent[i] {
                2
            } else if self.protect.boot_power_on[i] {
                1
            } else {
                0
            };
            acc | (s << (2 * i))
        })
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
        let user_wp = self.regs.user_wp();
        let kind = if user_wp & ext_csd::US_PERM_WP_EN != 0 {
            WpKind::Permanent
        } else if user_wp & ext_csd::US_PWR_WP_EN != 0 {
            WpKind::PowerOn
        } else {
            WpKind::Temporary
        };
        let sectors = g.min(self.partition_sectors(partition) - start);
        self.protect.set(partition, start, sectors, kind);
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
        match self.protect.kind_at(partition, start) {
            Some(WpKind::Temporary) => {
                self.protect
                    .groups
                    .remove(&(partition.access_bits(), start));
                self.save_persistent();
            }
            Some(_) => x.after_status |= r1::WP_VIOLATION,
            None => {}
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
        let mut bits = 0u64;
        for i in 0..32u64 {
            let lba = start + i * g;
            if lba >= size {
                break;
            }
            let kind = if self.csd_write_protected() {
                Some(WpKind::Permanent)
            } else {
                self.protect.kind_at(partition, lba)
            };
            if let Some(kind) = kind {
                bits |= if types {
                    kind.code() << (2 * i)
                } else {
                    1 << i
                };
            }
        }
        Ok(bits)
    }
}
