//! The protection part: write protection and password lock.
//!
//! Owns the write-protected groups of the user area and GP partitions (CMD28/29, each
//! temporary, power-on or permanent), the boot areas' power-on and permanent protection
//! (BOOT_WP), and the CMD42 password and lock state. Whole-card protection from the CSD
//! (TMP_ / PERM_WRITE_PROTECT) lives in the registers part; callers pass it in.
//!
//! # CMD42 LOCK_UNLOCK
//!
//! The data block (CMD16 block length) is: byte 0 flags — bit 3 ERASE (forced erase),
//! bit 2 LOCK_UNLOCK, bit 1 CLR_PWD, bit 0 SET_PWD; byte 1 PWDS_LEN; then the password
//! (when replacing a password: old followed by new). A locked card accepts only the
//! basic (class 0), lock (class 7) and application (class 8) commands and CMD16; the
//! others are illegal. A card with a password powers up locked. Any failed request sets
//! LOCK_UNLOCK_FAILED and changes nothing.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::ext_csd as x;
use crate::partition::Partition;

const SET_PWD: u8 = 1 << 0;
const CLR_PWD: u8 = 1 << 1;
const LOCK_UNLOCK: u8 = 1 << 2;
const ERASE: u8 = 1 << 3;
/// Passwords are at most 16 bytes.
const MAX_PASSWORD: usize = 16;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub(crate) enum WpKind {
    /// Cleared by CMD29; survives power cycles.
    Temporary,
    /// Cleared by the next power cycle.
    PowerOn,
    /// Forever.
    Permanent,
}

impl WpKind {
    /// The protection CMD28 sets under USER_WP: permanent if US_PERM_WP_EN, power-on if
    /// US_PWR_WP_EN, temporary otherwise.
    pub fn for_user_wp(user_wp: u8) -> WpKind {
        if user_wp & x::US_PERM_WP_EN != 0 {
            WpKind::Permanent
        } else if user_wp & x::US_PWR_WP_EN != 0 {
            WpKind::PowerOn
        } else {
            WpKind::Temporary
        }
    }

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
pub(crate) struct WpRecord {
    pub partition: u8,
    pub start: u64,
    pub sectors: u64,
    pub kind: WpKind,
}

/// What an accepted CMD42 request asks of the card beyond this part.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum LockOutcome {
    /// The password or lock state changed.
    Changed,
    /// Forced erase: password and temporary protection are gone; the card must erase
    /// the user area and the GP partitions.
    ForcedErase,
}

/// The card's protection state (see the module documentation).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Protection {
    /// (partition index, first sector of the group) → (sectors, kind).
    groups: BTreeMap<(u8, u64), (u64, WpKind)>,
    /// Largest group ever recorded, to bound overlap searches.
    max_group: u64,
    boot_power_on: [bool; 2],
    boot_permanent: [bool; 2],
    /// CMD42 password.
    password: Option<Vec<u8>>,
    locked: bool,
}

impl Protection {
    /// Power-on: power-on protection ends, and a card with a password is locked.
    pub fn power_on_reset(&mut self) {
        self.groups.retain(|_, (_, kind)| *kind != WpKind::PowerOn);
        self.boot_power_on = [false; 2];
        self.locked = self.password.is_some();
    }

    #[inline]
    pub fn locked(&self) -> bool {
        self.locked
    }

    // ---- write protection ---------------------------------------------------------------

    /// Would writing `[lba, lba+count)` of `partition` violate write protection?
    /// `csd_protected`: the CSD protects the whole card (all but RPMB).
    #[inline]
    pub fn is_protected(
        &self,
        partition: Partition,
        lba: u64,
        count: u64,
        csd_protected: bool,
    ) -> bool {
        match partition {
            Partition::Rpmb => false,
            Partition::Boot1 | Partition::Boot2 => {
                let i = usize::from(partition == Partition::Boot2);
                csd_protected || self.boot_power_on[i] || self.boot_permanent[i]
            }
            Partition::User | Partition::Gp(_) => {
                csd_protected || self.overlapping(partition, lba, count).next().is_some()
            }
        }
    }

    /// Protect the group of `sectors` at `start` (CMD28). A permanent group stays as it
    /// is.
    pub fn set_group(&mut self, partition: Partition, start: u64, sectors: u64, kind: WpKind) {
        let key = (partition.access_bits(), start);
        match self.groups.get(&key) {
            Some((_, WpKind::Permanent)) => {}
            _ => {
                self.groups.insert(key, (sectors, kind));
                self.max_group = self.max_group.max(sectors);
            }
        }
    }

    /// CMD29 on the group at `start`: temporary protection is removed (`Ok(true)`: the
    /// saved state changes); power-on or permanent protection cannot be (`Err`:
    /// WP_VIOLATION); an unprotected group is left alone (`Ok(false)`).
    pub fn clear_group(&mut self, partition: Partition, start: u64) -> Result<bool, ()> {
        match self.kind_at(partition, start) {
            Some(WpKind::Temporary) => {
                self.groups.remove(&(partition.access_bits(), start));
                Ok(true)
            }
            Some(_) => Err(()),
            None => Ok(false),
        }
    }

    /// CMD30 (one bit per group, `types == false`) or CMD31 (two bits per group) for the
    /// 32 groups of `group` sectors from `start`, in a partition of `size` sectors; groups
    /// past its end read 0.
    pub fn group_bits(
        &self,
        partition: Partition,
        start: u64,
        group: u64,
        size: u64,
        types: bool,
        csd_protected: bool,
    ) -> u64 {
        let mut bits = 0u64;
        for i in 0..32u64 {
            let lba = start + i * group;
            if lba >= size {
                break;
            }
            let kind = if csd_protected {
                Some(WpKind::Permanent)
            } else {
                self.kind_at(partition, lba)
            };
            if let Some(kind) = kind {
                bits |= if types {
                    kind.code() << (2 * i)
                } else {
                    1 << i
                };
            }
        }
        bits
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

    /// A BOOT_WP write `value` was accepted: B_PWR_WP_EN and B_PERM_WP_EN protect the
    /// boot area B_SEC_WP_SEL and the matching *_SEC_SEL bit name, or both.
    pub fn latch_boot_wp(&mut self, value: u8) {
        let areas = |sel: u8| -> [bool; 2] {
            if value & x::B_SEC_WP_SEL != 0 {
                let second = value & sel != 0;
                [!second, second]
            } else {
                [true, true]
            }
        };
        if value & x::B_PWR_WP_EN != 0 {
            for (i, on) in areas(x::B_PWR_WP_SEC_SEL).into_iter().enumerate() {
                self.boot_power_on[i] |= on;
            }
        }
        if value & x::B_PERM_WP_EN != 0 {
            for (i, on) in areas(x::B_PERM_WP_SEC_SEL).into_iter().enumerate() {
                self.boot_permanent[i] |= on;
            }
        }
    }

    /// BOOT_WP_STATUS: per boot area 0 none, 1 power-on, 2 permanent.
    pub fn boot_wp_status(&self) -> u8 {
        (0..2).fold(0u8, |acc, i| {
            let s = if self.boot_permanent[i] {
                2
            } else if self.boot_power_on[i] {
                1
            } else {
                0
            };
            acc | (s << (2 * i))
        })
    }

    // ---- password lock ------------------------------------------------------------------

    /// A CMD42 data block. `password_disabled`: USER_WP.PERM_PSWD_DIS. On error nothing
    /// changed and the card reports LOCK_UNLOCK_FAILED.
    pub fn lock_request(
        &mut self,
        block: &[u8],
        password_disabled: bool,
    ) -> Result<LockOutcome, &'static str> {
        if password_disabled {
            return Err("password protection is permanently disabled");
        }
        let flags = *block.first().ok_or("empty block")?;
        if flags & ERASE != 0 {
            if flags != ERASE {
                return Err("ERASE must be the only flag");
            }
            if !self.locked {
                return Err("forced erase is only allowed on a locked card");
            }
            self.clear_temporary();
            self.password = None;
            self.locked = false;
            return Ok(LockOutcome::ForcedErase);
        }
        let len = usize::from(*block.get(1).ok_or("no length byte")?);
        let pwd = block
            .get(2..2 + len)
            .ok_or("password longer than the block")?;
        let matches_current = self.password.as_deref() == Some(pwd);
        if flags & SET_PWD != 0 {
            let new = match &self.password {
                None => pwd,
                Some(old) => {
                    if !pwd.starts_with(old) {
                        return Err("old password does not match");
                    }
                    &pwd[old.len()..]
                }
            };
            if new.is_empty() || new.len() > MAX_PASSWORD {
                return Err("new password must be 1..=16 bytes");
            }
            if flags & CLR_PWD != 0 {
                return Err("SET_PWD and CLR_PWD together");
            }
            self.password = Some(new.to_vec());
            // SET_PWD with LOCK_UNLOCK sets and locks at once.
            self.locked = flags & LOCK_UNLOCK != 0;
            return Ok(LockOutcome::Changed);
        }
        if flags & CLR_PWD != 0 {
            if !matches_current {
                return Err("password does not match");
            }
            self.password = None;
            self.locked = false;
            return Ok(LockOutcome::Changed);
        }
        if !matches_current {
            return Err("password does not match or none is set");
        }
        self.locked = flags & LOCK_UNLOCK != 0;
        Ok(LockOutcome::Changed)
    }

    /// Forget temporary protection (CMD42 forced erase).
    fn clear_temporary(&mut self) {
        self.groups
            .retain(|_, (_, kind)| *kind != WpKind::Temporary);
    }

    // ---- persistence --------------------------------------------------------------------

    /// The groups that survive power loss (temporary and permanent).
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

    pub fn boot_permanent(&self) -> [bool; 2] {
        self.boot_permanent
    }

    pub fn password(&self) -> Option<&[u8]> {
        self.password.as_deref()
    }

    /// Load the saved state into a freshly built card.
    pub fn restore(
        &mut self,
        records: &[WpRecord],
        boot_permanent: [bool; 2],
        password: Option<Vec<u8>>,
    ) {
        self.password = password;
        for r in records {
            self.set_group(
                Partition::from_access(r.partition),
                r.start,
                r.sectors,
                r.kind,
            );
        }
        self.boot_permanent = boot_permanent;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const USER: Partition = Partition::User;

    fn block(flags: u8, pwd: &[u8]) -> Vec<u8> {
        let mut b = vec![0u8; 512];
        b[0] = flags;
        b[1] = pwd.len() as u8;
        b[2..2 + pwd.len()].copy_from_slice(pwd);
        b
    }

    #[test]
    fn cmd28_kind_follows_user_wp() {
        assert_eq!(WpKind::for_user_wp(0), WpKind::Temporary);
        assert_eq!(WpKind::for_user_wp(x::US_PWR_WP_EN), WpKind::PowerOn);
        assert_eq!(
            WpKind::for_user_wp(x::US_PWR_WP_EN | x::US_PERM_WP_EN),
            WpKind::Permanent
        );
    }

    #[test]
    fn groups_protect_exactly_their_sectors() {
        let mut p = Protection::default();
        p.set_group(USER, 1024, 1024, WpKind::Temporary);
        assert!(p.is_protected(USER, 1024, 1, false));
        assert!(p.is_protected(USER, 2047, 1, false));
        assert!(
            p.is_protected(USER, 1000, 25, false),
            "a range ending inside"
        );
        assert!(!p.is_protected(USER, 1000, 24, false));
        assert!(!p.is_protected(USER, 2048, 100, false));
        assert!(!p.is_protected(Partition::Gp(0), 1024, 1, false));
        assert!(
            p.is_protected(USER, 0, 1, true),
            "the CSD protects everything"
        );
        assert!(!p.is_protected(Partition::Rpmb, 0, 1, true), "but RPMB");
    }

    #[test]
    fn only_temporary_groups_clear_and_power_on_groups_end_at_power_on() {
        let mut p = Protection::default();
        p.set_group(USER, 0, 8, WpKind::Temporary);
        p.set_group(USER, 8, 8, WpKind::PowerOn);
        p.set_group(USER, 16, 8, WpKind::Permanent);
        p.set_group(USER, 16, 8, WpKind::Temporary);
        assert_eq!(
            p.clear_group(USER, 16),
            Err(()),
            "permanent stays permanent"
        );
        assert_eq!(p.clear_group(USER, 8), Err(()));
        assert_eq!(p.clear_group(USER, 0), Ok(true));
        assert_eq!(p.clear_group(USER, 0), Ok(false));
        assert!(!p.is_protected(USER, 0, 8, false));

        let saved = p.records();
        assert_eq!(saved.len(), 1, "power-on groups are not saved: {saved:?}");
        p.power_on_reset();
        assert!(!p.is_protected(USER, 8, 1, false));
        assert!(p.is_protected(USER, 16, 1, false));

        let mut back = Protection::default();
        back.restore(&saved, [false, true], None);
        assert_eq!(back.records(), saved);
        assert!(back.is_protected(Partition::Boot2, 0, 1, false));
    }

    #[test]
    fn cmd30_and_cmd31_bits_describe_32_groups_from_the_first() {
        let mut p = Protection::default();
        p.set_group(USER, 0, 8, WpKind::Temporary);
        p.set_group(USER, 16, 8, WpKind::PowerOn);
        p.set_group(USER, 24, 8, WpKind::Permanent);
        assert_eq!(p.group_bits(USER, 0, 8, 1 << 20, false, false), 0b1101);
        assert_eq!(
            p.group_bits(USER, 0, 8, 1 << 20, true, false),
            0b11_10_00_01
        );
        assert_eq!(p.group_bits(USER, 8, 8, 1 << 20, false, false), 0b110);
        assert_eq!(
            p.group_bits(USER, 0, 8, 24, false, false),
            0b101,
            "groups past the end read 0"
        );
        assert_eq!(p.group_bits(USER, 0, 8, 16, true, true), 0b1111);
    }

    #[test]
    fn boot_protection_latches_the_selected_areas() {
        let mut p = Protection::default();
        p.latch_boot_wp(x::B_SEC_WP_SEL | x::B_PWR_WP_EN | x::B_PWR_WP_SEC_SEL);
        assert_eq!(p.boot_wp_status(), 0b01_00, "power-on, boot area 2 only");
        p.latch_boot_wp(x::B_PERM_WP_EN);
        assert_eq!(p.boot_wp_status(), 0b10_10, "permanent, both areas");
        p.power_on_reset();
        assert_eq!(p.boot_wp_status(), 0b10_10);
        assert_eq!(p.boot_permanent(), [true, true]);

        let mut q = Protection::default();
        q.latch_boot_wp(x::B_PWR_WP_EN);
        assert!(q.is_protected(Partition::Boot1, 0, 1, false));
        q.power_on_reset();
        assert_eq!(q.boot_wp_status(), 0);
    }

    #[test]
    fn password_set_lock_unlock_replace_and_clear() {
        let mut p = Protection::default();
        assert_eq!(
            p.lock_request(&block(0, b"ab"), false),
            Err("password does not match or none is set")
        );
        assert_eq!(
            p.lock_request(&block(SET_PWD | LOCK_UNLOCK, b"ab"), false),
            Ok(LockOutcome::Changed)
        );
        assert!(p.locked());
        assert!(p.lock_request(&block(0, b"xy"), false).is_err());
        assert!(p.locked(), "a failed request changes nothing");
        p.lock_request(&block(0, b"ab"), false).unwrap();
        assert!(!p.locked());
        // Replace: old followed by new.
        p.lock_request(&block(SET_PWD, b"abcd"), false).unwrap();
        assert_eq!(p.password(), Some(&b"cd"[..]));
        assert!(p
            .lock_request(&block(SET_PWD | CLR_PWD, b"cd"), false)
            .is_err());
        assert!(p.lock_request(&block(CLR_PWD, b"ab"), false).is_err());
        p.power_on_reset();
        assert!(p.locked(), "a card with a password powers up locked");
        p.lock_request(&block(CLR_PWD, b"cd"), false).unwrap();
        assert!(!p.locked() && p.password().is_none());
        assert!(p
            .lock_request(&block(SET_PWD, &[1; 17]), false)
            .unwrap_err()
            .contains("1..=16"));
        assert!(p.lock_request(&block(SET_PWD, b"ab"), true).is_err());
        assert!(p.lock_request(&[], false).is_err());
    }

    #[test]
    fn forced_erase_needs_a_locked_card_and_clears_temporary_protection() {
        let mut p = Protection::default();
        p.set_group(USER, 0, 8, WpKind::Temporary);
        p.set_group(USER, 8, 8, WpKind::Permanent);
        assert!(p.lock_request(&block(ERASE, b""), false).is_err());
        p.lock_request(&block(SET_PWD | LOCK_UNLOCK, b"pw"), false)
            .unwrap();
        assert!(p
            .lock_request(&block(ERASE | LOCK_UNLOCK, b""), false)
            .is_err());
        assert_eq!(
            p.lock_request(&block(ERASE, b""), false),
            Ok(LockOutcome::ForcedErase)
        );
        assert!(!p.locked() && p.password().is_none());
        assert!(!p.is_protected(USER, 0, 8, false));
        assert!(p.is_protected(USER, 8, 8, false));
    }
}
