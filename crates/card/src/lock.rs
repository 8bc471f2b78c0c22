//! CMD42 LOCK_UNLOCK: password protection.
//!
//! The data block (CMD16 block length) is: byte 0 flags — bit 3 ERASE (forced erase),
//! bit 2 LOCK_UNLOCK, bit 1 CLR_PWD, bit 0 SET_PWD; byte 1 PWDS_LEN; then the password
//! (when replacing a password: old followed by new). A locked card accepts only the
//! basic (class 0), lock (class 7) and application (class 8) commands and CMD16; the
//! others are illegal. A card with a password powers up locked. Any failed request sets
//! LOCK_UNLOCK_FAILED and changes nothing.

use super::partition::Partition;
use super::status::r1;
use super::{ext_csd, Card};

const SET_PWD: u8 = 1 << 0;
const CLR_PWD: u8 = 1 << 1;
const LOCK_UNLOCK: u8 = 1 << 2;
const ERASE: u8 = 1 << 3;
/// Passwords are at most 16 bytes.
const MAX_PASSWORD: usize = 16;

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(super) struct LockState {
    pub password: Option<Vec<u8>>,
    pub locked: bool,
}

impl Card {
    pub(super) fn lock_unlock(&mut self, block: &[u8]) {
        match self.lock_request(block) {
            Ok(()) => self.save_persistent(),
            Err(why) => {
                log::debug!("CMD42: LOCK_UNLOCK_FAILED: {why}");
                self.regs.raise(r1::LOCK_UNLOCK_FAILED);
            }
        }
    }

    fn lock_request(&mut self, block: &[u8]) -> Result<(), &'static str> {
        if self.regs.user_wp() & ext_csd::PERM_PSWD_DIS != 0 {
            return Err("password protection is permanently disabled");
        }
        let flags = *block.first().ok_or("empty block")?;
        if flags & ERASE != 0 {
            if flags != ERASE {
                return Err("ERASE must be the only flag");
            }
            if !self.lock.locked {
                return Err("forced erase is only allowed on a locked card");
            }
            log::info!("CMD42 forced erase: user data, password and temporary protection cleared");
            self.erase_partition(Partition::User);
            for i in 0..4 {
                self.erase_partition(Partition::Gp(i));
            }
            self.protect.clear_temporary();
            self.lock = LockState::default();
            return Ok(());
        }
        let len = usize::from(*block.get(1).ok_or("no length byte")?);
        let pwd = block
            .get(2..2 + len)
            .ok_or("password longer than the block")?;
        let current = self.lock.password.clone();
        let matches_current = |p: &[u8]| current.as_deref() == Some(p);
        if flags & SET_PWD != 0 {
            let new = match &current {
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
            self.lock.password = Some(new.to_vec());
            // SET_PWD with LOCK_UNLOCK sets and locks at once.
            self.lock.locked = flags & LOCK_UNLOCK != 0;
            return Ok(());
        }
        if flags & CLR_PWD != 0 {
            if !matches_current(pwd) {
                return Err("password does not match");
            }
            self.lock = LockState::default();
            return Ok(());
        }
        if !matches_current(pwd) {
            return Err("password does not match or none is set");
        }
        self.lock.locked = flags & LOCK_UNLOCK != 0;
        Ok(())
    }
}
