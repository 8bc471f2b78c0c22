//! What a card keeps across power loss besides data: the non-volatile EXT_CSD bytes,
//! the CSD's programmable bits, the password, the RPMB key and write counter, write
//! protection and partitioning. Saved as the `[card]` table of the image sidecar each time
//! one of them changes, so a killed daemon loses none of it.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::parts::protection::WpRecord;
use super::rpmb::{Rpmb, RpmbPersistent};
use super::status::r1;
use super::{Card, CardError, Partition};

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub(super) struct PersistentState {
    /// Non-volatile EXT_CSD bytes by offset (only those that differ from zero).
    ext_csd: BTreeMap<String, u8>,
    /// General purpose partitions in effect, in sectors (set at the power cycle after
    /// PARTITION_SETTING_COMPLETED).
    gp_sectors: [u64; 4],
    partitioning_applied: bool,
    /// CSD byte 14.
    csd_writable: u8,
    /// CMD42 password, hex.
    password: Option<String>,
    rpmb: RpmbPersistent,
    write_protect: Vec<WpRecord>,
    boot_wp_permanent: [bool; 2],
}

impl PersistentState {
    pub fn from_table(table: toml::Table) -> Result<PersistentState, String> {
        toml::Value::Table(table)
            .try_into()
            .map_err(|e: toml::de::Error| e.to_string())
    }

    fn to_table(&self) -> Result<toml::Table, String> {
        toml::Table::try_from(self).map_err(|e| e.to_string())
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn unhex(s: &str) -> Option<Vec<u8>> {
    if s.len() % 2 != 0 {
        return None;
    }
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(s.get(i..i + 2)?, 16).ok())
        .collect()
}

impl Card {
    /// Load saved state into a freshly built card.
    pub(super) fn apply_persistent(&mut self, s: PersistentState) -> Result<(), CardError> {
        for (key, &value) in &s.ext_csd {
            let offset: usize = key
                .parse()
                .map_err(|_| CardError::BadState(format!("EXT_CSD offset {key:?}")))?;
            self.regs
                .restore_non_volatile(offset, value)
                .map_err(CardError::BadState)?;
        }
        if !self
            .partitions
            .restore(s.partitioning_applied, s.gp_sectors)
        {
            return Err(CardError::PartitionsDoNotFit);
        }
        self.regs.set_csd_writable(&self.model, s.csd_writable);
        let password = match s.password {
            Some(h) => {
                Some(unhex(&h).ok_or_else(|| CardError::BadState("password is not hex".into()))?)
            }
            None => None,
        };
        self.rpmb = Rpmb::new(self.store.layout().rpmb_bytes, s.rpmb);
        self.protection
            .restore(&s.write_protect, s.boot_wp_permanent, password);
        self.apply_pending_partitioning();
        Ok(())
    }

    fn persistent_state(&self) -> PersistentState {
        let ext_csd = self.regs.non_volatile();
        PersistentState {
            ext_csd,
            gp_sectors: self.partitions.gp_sectors(),
            partitioning_applied: self.partitions.applied(),
            csd_writable: self.regs.csd_writable(),
            password: self.protection.password().map(hex),
            rpmb: self.rpmb.persistent().clone(),
            write_protect: self.protection.records(),
            boot_wp_permanent: self.protection.boot_permanent(),
        }
    }

    /// What the card keeps besides data, as `inspect --image` shows it: the partitions
    /// in effect, partitioning still to take effect, the RPMB key (whether it is
    /// programmed, never its value) and write counter, the password, and write protection.
    pub fn describe_saved_state(&self) -> String {
        use std::fmt::Write as _;
        let s = self.persistent_state();
        let mut out = String::from("Card state (kept with the image):\n");
        let kib = |p: Partition| self.partitions.extent(p).sectors / 2;
        let mut parts = format!(
            "user {} KiB, boot1 {} KiB, boot2 {} KiB, rpmb {} KiB",
            kib(Partition::User),
            kib(Partition::Boot1),
            kib(Partition::Boot2),
            kib(Partition::Rpmb)
        );
        for (i, sectors) in s.gp_sectors.iter().enumerate() {
            if *sectors > 0 {
                let _ = write!(parts, ", gp{} {} KiB", i + 1, sectors / 2);
            }
        }
        let _ = writeln!(out, "  partitions: {parts}");
        let partitioning = match (s.partitioning_applied, self.regs.partitioning_completed()) {
            (true, _) => "completed, in effect",
            (false, true) => "completed, takes effect at the next power-up",
            (false, false) => "not completed (the card as shipped)",
        };
        let _ = writeln!(out, "  partitioning: {partitioning}");
        let key = if s.rpmb.key.is_some() {
            "programmed"
        } else {
            "not programmed"
        };
        let _ = writeln!(
            out,
            "  RPMB: authentication key {key}, write counter {}",
            s.rpmb.write_counter
        );
        let password = if s.password.is_some() { "set" } else { "none" };
        let _ = writeln!(out, "  CMD42 password: {password}");
        let boot: Vec<String> = s
            .boot_wp_permanent
            .iter()
            .enumerate()
            .filter(|(_, p)| **p)
            .map(|(i, _)| format!("boot{}", i + 1))
            .collect();
        let boot = if boot.is_empty() {
            "none".to_string()
        } else {
            boot.join(", ")
        };
        let _ = writeln!(out, "  permanently write-protected boot partitions: {boot}");
        let _ = writeln!(
            out,
            "  write-protected groups (temporary, power-on, permanent): {}",
            s.write_protect.len()
        );
        out
    }

    /// Save the persistent state to the store now.
    pub(super) fn save_persistent(&mut self) {
        let result = self
            .persistent_state()
            .to_table()
            .map_err(|e| e.to_string())
            .and_then(|t| self.store.save_card_state(&t).map_err(|e| e.to_string()));
        if let Err(e) = result {
            log::error!("saving card state: {e}");
            self.regs.raise(r1::ERROR);
        }
    }

    /// Partitioning completed before the last power cycle takes effect now: the general
    /// purpose partitions appear and the user area (SEC_COUNT) shrinks.
    pub(super) fn apply_pending_partitioning(&mut self) {
        if self.partitions.applied() || !self.regs.partitioning_completed() {
            return;
        }
        let unit = self.model.hc_wp_group_sectors();
        let gp = self.regs.gp_size_mults().map(|m| m * unit);
        if self.partitions.apply(gp) {
            log::info!("partitioning takes effect: GP sectors {gp:?}");
            self.save_persistent();
        } else {
            log::error!("completed partitioning does not fit the user area; ignored");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hex_round_trips_and_rejects_garbage() {
        assert_eq!(
            unhex(&hex(&[0, 1, 0xab, 0xff])),
            Some(vec![0, 1, 0xab, 0xff])
        );
        assert_eq!(unhex("abc"), None);
        assert_eq!(unhex("zz"), None);
    }

    #[test]
    fn state_round_trips_through_toml() {
        let mut s = PersistentState::default();
        s.ext_csd.insert("179".into(), 0x08);
        s.password = Some("0102".into());
        s.gp_sectors = [1024, 0, 0, 0];
        s.partitioning_applied = true;
        let t = s.to_table().unwrap();
        let text = toml::to_string(&t).unwrap();
        let back: toml::Table = toml::from_str(&text).unwrap();
        assert_eq!(PersistentState::from_table(back).unwrap(), s);
    }

    #[test]
    fn the_saved_state_description_follows_the_state() {
        let model = crate::model::DeviceModel::load("generic-emmc45").unwrap();
        let layout = Card::layout_for(&model);
        let mut card = Card::new(model, Box::new(crate::store::MemStore::new(layout))).unwrap();
        let fresh = card.describe_saved_state();
        assert!(fresh.contains("partitioning: not completed"), "{fresh}");
        assert!(fresh.contains("RPMB: authentication key not programmed, write counter 0"));
        assert!(fresh.contains("CMD42 password: none"));
        assert!(!fresh.contains("gp1"));
        let s = PersistentState {
            gp_sectors: [16384, 0, 0, 0],
            partitioning_applied: true,
            rpmb: RpmbPersistent {
                key: Some([7; crate::rpmb::KEY_LEN]),
                write_counter: 3,
            },
            password: Some("0102".into()),
            boot_wp_permanent: [false, true],
            ..PersistentState::default()
        };
        card.apply_persistent(s).unwrap();
        let text = card.describe_saved_state();
        assert!(text.contains(", gp1 8192 KiB"), "{text}");
        assert!(
            text.contains("partitioning: completed, in effect"),
            "{text}"
        );
        assert!(text.contains("RPMB: authentication key programmed, write counter 3"));
        assert!(text.contains("CMD42 password: set"));
        assert!(text.contains("boot partitions: boot2"));
        assert!(!text.contains("0707"), "the key itself is never shown");
    }

    #[test]
    fn unknown_fields_in_saved_state_are_rejected() {
        let t: toml::Table = toml::from_str("bogus = 1").unwrap();
        assert!(PersistentState::from_table(t).is_err());
    }
}
