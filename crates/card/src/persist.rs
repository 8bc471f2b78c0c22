//! What a card keeps across power loss besides data: the non-volatile EXT_CSD bytes,
//! the CSD's programmable bits, the password, the RPMB key and write counter, write
//! protection and partitioning. Saved as the `[card]` table of the image sidecar each time
//! one of them changes, so a killed daemon loses none of it.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::partition::PartitionTable;
use super::protect::WpRecord;
use super::rpmb::{Rpmb, RpmbPersistent};
use super::status::r1;
use super::{ext_csd as x, registers, Card, CardError};

/// EXT_CSD bytes that survive a power cycle, with the mask of their non-volatile bits.
const NON_VOLATILE: &[(usize, usize, u8)] = &[
    (x::EXT_PARTITIONS_ATTRIBUTE, 2, 0xFF),
    (x::USE_NATIVE_SECTOR, 1, 0xFF),
    (x::VENDOR_SPECIFIC_FIELD, 64, 0xFF),
    (x::PERIODIC_WAKEUP, 1, 0xFF),
    (x::SEC_BAD_BLK_MGMNT, 1, 0xFF),
    // ENH_START_ADDR .. PARTITIONS_ATTRIBUTE (136..=156)
    (x::ENH_START_ADDR, 21, 0xFF),
    (x::RST_N_FUNCTION, 1, 0xFF),
    (x::BKOPS_EN, 1, 0xFF),
    (x::WR_REL_SET, 1, 0xFF),
    (x::FW_CONFIG, 1, 0xFF),
    (
        x::USER_WP,
        1,
        x::US_PERM_WP_EN | x::US_PERM_WP_DIS | x::CD_PERM_WP_DIS | x::PERM_PSWD_DIS,
    ),
    (
        x::BOOT_WP,
        1,
        x::B_PERM_WP_EN | x::B_PERM_WP_SEC_SEL | x::B_PERM_WP_DIS | x::B_SEC_WP_SEL,
    ),
    (x::BOOT_BUS_CONDITIONS, 1, 0xFF),
    (x::BOOT_CONFIG_PROT, 1, x::PERM_BOOT_CONFIG_PROT),
    (x::PARTITION_CONFIG, 1, 0x78),
];

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
            let mask = NON_VOLATILE
                .iter()
                .find(|(start, len, _)| (*start..start + len).contains(&offset))
                .map(|&(_, _, mask)| mask)
                .ok_or_else(|| {
                    CardError::BadState(format!("EXT_CSD[{offset}] is not a non-volatile byte"))
                })?;
            self.ext_csd[offset] = (self.ext_csd[offset] & !mask) | (value & mask);
        }
        if s.partitioning_applied {
            self.partitions = PartitionTable::new(&self.store.layout(), s.gp_sectors)
                .ok_or(CardError::PartitionsDoNotFit)?;
        }
        self.partitioning_applied = s.partitioning_applied;
        self.csd_writable = s.csd_writable & registers::CSD_WRITABLE_MASK;
        self.csd = registers::build_csd(&self.model, self.csd_writable);
        self.lock.password = match s.password {
            Some(h) => {
                Some(unhex(&h).ok_or_else(|| CardError::BadState("password is not hex".into()))?)
            }
            None => None,
        };
        self.rpmb = Rpmb::new(self.store.layout().rpmb_bytes, s.rpmb);
        self.protect.restore(&s.write_protect);
        self.protect.boot_permanent = s.boot_wp_permanent;
        self.apply_pending_partitioning();
        Ok(())
    }

    fn persistent_state(&self) -> PersistentState {
        let mut ext_csd = BTreeMap::new();
        for &(start, len, mask) in NON_VOLATILE {
            for offset in start..start + len {
                let v = self.ext_csd[offset] & mask;
                if v != 0 {
                    ext_csd.insert(offset.to_string(), v);
                }
            }
        }
        let gp_sectors = std::array::from_fn(|i| {
            self.partitions
                .extent(super::Partition::Gp(i as u8))
                .sectors
        });
        PersistentState {
            ext_csd,
            gp_sectors,
            partitioning_applied: self.partitioning_applied,
            csd_writable: self.csd_writable,
            password: self.lock.password.as_deref().map(hex),
            rpmb: self.rpmb.persistent().clone(),
            write_protect: self.protect.records(),
            boot_wp_permanent: self.protect.boot_permanent,
        }
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
            self.status |= r1::ERROR;
        }
    }

    /// Partitioning completed before the last power cycle takes effect now: the general
    /// purpose partitions appear and the user area (SEC_COUNT) shrinks.
    pub(super) fn apply_pending_partitioning(&mut self) {
        if self.partitioning_applied || self.ext_csd[x::PARTITION_SETTING_COMPLETED] & 1 == 0 {
            return;
        }
        let unit = self.model.hc_wp_group_sectors();
        let gp = self.gp_size_mults().map(|m| m * unit);
        match PartitionTable::new(&self.store.layout(), gp) {
            Some(table) => {
                log::info!("partitioning takes effect: GP sectors {gp:?}");
                self.partitions = table;
                self.partitioning_applied = true;
                self.save_persistent();
            }
            None => log::error!("completed partitioning does not fit the user area; ignored"),
        }
    }

    /// EXCEPTION_EVENTS_STATUS as the card reports it now.
    pub(super) fn exception_events_status(&self) -> u16 {
        let mut s = 0;
        if self.bkops_level() >= 2 {
            s |= x::EE_URGENT_BKOPS;
        }
        if self.packed_failure {
            s |= x::EE_PACKED_FAILURE;
        }
        s
    }

    /// Fill in the EXT_CSD bytes that reflect live card state.
    pub(super) fn refresh_live_fields(&self, e: &mut [u8; x::EXT_CSD_LEN]) {
        x::write_le(
            e,
            x::EXCEPTION_EVENTS_STATUS,
            2,
            u32::from(self.exception_events_status()),
        );
        e[x::BKOPS_STATUS] = self.bkops_level();
        e[x::BOOT_WP_STATUS] = self.boot_wp_status();
        let user = self.partitions.extent(super::Partition::User).sectors;
        x::write_le(e, x::SEC_COUNT, 4, u32::try_from(user).unwrap_or(u32::MAX));
        // Write-only fields read as zero.
        for offset in [
            x::FLUSH_CACHE,
            x::BKOPS_START,
            x::SANITIZE_START,
            x::BUS_WIDTH,
            x::TCASE_SUPPORT,
        ] {
            e[offset] = 0;
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
    fn unknown_fields_in_saved_state_are_rejected() {
        let t: toml::Table = toml::from_str("bogus = 1").unwrap();
        assert!(PersistentState::from_table(t).is_err());
    }
}
