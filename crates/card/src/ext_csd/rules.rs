//! The CMD6 write rules: a companion to [`FIELDS`](super::fields::FIELDS) with one row per
//! field the host may write, keyed by the field's offset (its first byte). A field
//! without a row — every `R` field, every reserved byte, the properties segment — refuses
//! CMD6.
//!
//! Each row says, in the order the card checks them:
//!
//! | column | meaning |
//! |---|---|
//! | `bits` | the bits the host may set in each byte; a 1 elsewhere is reserved (or a later revision's) and refused |
//! | `values` | the values the byte (or its sub-fields) may take |
//! | `once` | one-time programmable (`R/W`): fixed once non-zero, or bits that cannot be cleared once set |
//! | `disables` | (enable, disable) bit pairs: an enable is refused while its disable is set |
//! | `needs` | what the card must support or be in for the write: a property bit, a cache, partitioning still open, boot configuration unprotected — always, only for a non-zero value, or only when certain bits change |
//! | `check` | a rule that needs more than the register (the partition table, the bus mode) |
//! | `store` | where an accepted value goes: the byte itself, merged into it (bits only set), or nowhere (write-only triggers and fields whose only supported value is the default) |
//! | `persist` | whether the card saves its state afterwards (non-volatile fields) |
//! | `effect` | what the write does beyond storing: flush the cache, start BKOPS or sanitize, switch partition (PARTITION_SWITCH_TIME), latch boot protection, set the bus width |
//!
//! `switch.rs` interprets the table; nothing in it is specific to one field except the
//! [`Check`] and [`Effect`] variants, which name the field they belong to.

use super::fields::{field_at, Field};
use super::*;

/// Which bits of each of the field's bytes the host may set.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Bits {
    /// The same mask for every byte.
    All(u8),
    /// One mask per byte, lowest offset first.
    PerByte(&'static [u8]),
}

impl Bits {
    /// The writable bits of byte `byte` (0-based within the field).
    pub fn of_byte(self, byte: usize) -> u8 {
        match self {
            Bits::All(mask) => mask,
            Bits::PerByte(masks) => masks.get(byte).copied().unwrap_or(0),
        }
    }
}

/// Values a written byte may take.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Values {
    Any,
    /// At most this value.
    UpTo(u8),
    /// One of these values.
    OneOf(&'static [u8]),
    /// Each sub-field (mask) one of its values (in place, not shifted).
    Fields(&'static [(u8, &'static [u8])]),
}

impl Values {
    pub fn allow(self, value: u8) -> bool {
        match self {
            Values::Any => true,
            Values::UpTo(max) => value <= max,
            Values::OneOf(values) => values.contains(&value),
            Values::Fields(fields) => fields
                .iter()
                .all(|&(mask, values)| values.contains(&(value & mask))),
        }
    }
}

/// Writes a field does not allow to be undone.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Once {
    /// Writable any number of times.
    No,
    /// One-time programmable: once non-zero, the value cannot change.
    Fixed,
    /// These bits, once set, cannot be cleared.
    Sticky(u8),
}

impl Once {
    /// Whether going from `old` to `new` is allowed.
    pub fn allow(self, old: u8, new: u8) -> bool {
        match self {
            Once::No => true,
            Once::Fixed => old == 0 || new == old,
            Once::Sticky(bits) => old & bits & !new == 0,
        }
    }
}

/// A condition on the card for a write to be accepted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Need {
    /// A bit of another EXT_CSD field is set: a supported feature (properties, the
    /// read-only modes bytes) or an enabled mode. (offset, mask, what it means)
    Bit(usize, u8, &'static str),
    /// A volatile cache (CACHE_SIZE is not 0).
    Cache,
    /// Partitioning is supported (PARTITIONING_SUPPORT.PARTITIONING_EN) and not completed
    /// (PARTITION_SETTING_COMPLETED is 0).
    PartitioningOpen,
    /// The boot configuration is not protected (BOOT_CONFIG_PROT is 0).
    BootConfigUnprotected,
}

/// When a [`Need`] applies.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum When {
    Always,
    /// Only for a non-zero value (writing 0 is always allowed).
    NonZero,
    /// Only when the write changes one of these bits.
    Changes(u8),
}

impl When {
    pub fn applies(self, old: u8, new: u8) -> bool {
        match self {
            When::Always => true,
            When::NonZero => new != 0,
            When::Changes(bits) => (old ^ new) & bits != 0,
        }
    }
}

/// A field's rule that needs more of the card than this register.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Check {
    None,
    /// CONTEXT_CONF: the context a byte configures (its index + 1) is within
    /// CONTEXT_CAPABILITIES.MAX_CONTEXT_ID.
    ContextId,
    /// EXT_PARTITIONS_ATTRIBUTE: each GP partition's type is one EXT_SUPPORT lists.
    PartitionTypes,
    /// PARTITION_CONFIG: the partition PARTITION_ACCESS selects exists.
    PartitionExists,
    /// PARTITION_SETTING_COMPLETED := 1: the GP partitions fit the user area and the
    /// enhanced area MAX_ENH_SIZE_MULT.
    PartitionSettings,
    /// BUS_WIDTH: a DDR width needs DEVICE_TYPE DDR support and HS_TIMING high speed.
    BusMode,
    /// HS_TIMING: the timing is supported (DEVICE_TYPE) in the current bus mode, and the
    /// driver strength is a type DRIVER_STRENGTH lists.
    Timing,
}

/// Where an accepted value goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Store {
    /// The byte holds the new value.
    Value,
    /// Bits can only be set: the byte holds old | new.
    Merge,
    /// Nothing is stored: a write-only trigger (it reads 0), a value kept elsewhere
    /// (BUS_WIDTH), or a field whose only accepted value is its default.
    No,
}

/// Whether the card saves its persistent state after the write.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Persist {
    No,
    Yes,
    /// Only when the write changes one of these bits.
    Changes(u8),
}

impl Persist {
    pub fn applies(self, old: u8, new: u8) -> bool {
        match self {
            Persist::No => false,
            Persist::Yes => true,
            Persist::Changes(bits) => (old ^ new) & bits != 0,
        }
    }
}

/// What an accepted write does beyond storing its value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Effect {
    None,
    /// FLUSH_CACHE bit 0: write the cache back; busy for the write-back.
    FlushCache,
    /// CACHE_CTRL 1 → 0: the cache is written back before it reads as off.
    CacheOff,
    /// POWER_OFF_NOTIFICATION SHORT or LONG: write the cache back (LONG: within
    /// POWER_OFF_LONG_TIME).
    PowerOffNotification,
    /// BKOPS_START: busy for the outstanding background work (HPI may stop it).
    StartBkops,
    /// SANITIZE_START: purge what secure trim marked.
    Sanitize,
    /// BOOT_WP: power-on and permanent boot-area protection latch.
    BootWp,
    /// PARTITION_CONFIG: a PARTITION_ACCESS change takes PARTITION_SWITCH_TIME.
    PartitionAccess,
    /// BUS_WIDTH: the card remembers the width (the byte reads 0).
    BusWidth,
}

/// How CMD6 may write one field (see the module documentation for the columns).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct WriteRule {
    /// The field: its first byte, a [`FIELDS`](super::fields::FIELDS) row.
    pub offset: usize,
    pub bits: Bits,
    pub values: Values,
    pub once: Once,
    pub disables: &'static [(u8, u8)],
    pub needs: &'static [(Need, When)],
    pub check: Check,
    pub store: Store,
    pub persist: Persist,
    pub effect: Effect,
}

/// A row for the field at `offset` that accepts anything and only stores it.
const fn w(offset: usize) -> WriteRule {
    WriteRule {
        offset,
        bits: Bits::All(0xFF),
        values: Values::Any,
        once: Once::No,
        disables: &[],
        needs: &[],
        check: Check::None,
        store: Store::Value,
        persist: Persist::No,
        effect: Effect::None,
    }
}

impl WriteRule {
    const fn bits(self, mask: u8) -> WriteRule {
        WriteRule {
            bits: Bits::All(mask),
            ..self
        }
    }
    const fn bytes(self, masks: &'static [u8]) -> WriteRule {
        WriteRule {
            bits: Bits::PerByte(masks),
            ..self
        }
    }
    const fn values(self, values: Values) -> WriteRule {
        WriteRule { values, ..self }
    }
    const fn once(self, once: Once) -> WriteRule {
        WriteRule { once, ..self }
    }
    const fn disables(self, disables: &'static [(u8, u8)]) -> WriteRule {
        WriteRule { disables, ..self }
    }
    const fn needs(self, needs: &'static [(Need, When)]) -> WriteRule {
        WriteRule { needs, ..self }
    }
    const fn check(self, check: Check) -> WriteRule {
        WriteRule { check, ..self }
    }
    const fn store(self, store: Store) -> WriteRule {
        WriteRule { store, ..self }
    }
    const fn persist(self, persist: Persist) -> WriteRule {
        WriteRule { persist, ..self }
    }
    const fn effect(self, effect: Effect) -> WriteRule {
        WriteRule { effect, ..self }
    }
}

const CACHE: (Need, When) = (Need::Cache, When::Always);
const PARTITIONING_OPEN: (Need, When) = (Need::PartitioningOpen, When::Always);
const BKOPS_SUPPORT_BIT: Need = Need::Bit(BKOPS_SUPPORT, BKOPS_SUPPORTED, "BKOPS_SUPPORT");

use Effect as E;
use Need::Bit;
use When::{Always, Changes, NonZero};

/// Every field CMD6 may write on a 4.5 card, in offset order.
pub(crate) static WRITE_RULES: &[WriteRule] = &[
    // 5.0's barrier bit (1) is not a 4.5 bit.
    w(FLUSH_CACHE)
        .bits(0x01)
        .needs(&[CACHE])
        .store(Store::No)
        .effect(E::FlushCache),
    w(CACHE_CTRL)
        .bits(CACHE_EN)
        .needs(&[(Need::Cache, NonZero)])
        .effect(E::CacheOff),
    // 4 (SLEEP_NOTIFICATION) is 5.0.
    w(POWER_OFF_NOTIFICATION)
        .values(Values::UpTo(POWER_OFF_LONG))
        .effect(E::PowerOffNotification),
    w(CONTEXT_CONF).check(Check::ContextId),
    w(EXT_PARTITIONS_ATTRIBUTE)
        .needs(&[
            PARTITIONING_OPEN,
            (
                Bit(PARTITIONING_SUPPORT, EXT_ATTRIBUTE_EN, "EXT_ATTRIBUTE_EN"),
                Always,
            ),
        ])
        .check(Check::PartitionTypes)
        .persist(Persist::Yes),
    // URGENT_BKOPS (bit 0) has no enable: it is always reported. The high byte is
    // reserved.
    w(EXCEPTION_EVENTS_CTRL).bytes(&[
        (EE_DYNCAP_NEEDED | EE_SYSPOOL_EXHAUSTED | EE_PACKED_FAILURE) as u8,
        0x00,
    ]),
    // Dynamic capacity is not supported.
    w(CLASS_6_CTRL).bits(0x00).store(Store::No),
    // The card has no 4 KiB native sectors.
    w(USE_NATIVE_SECTOR).bits(0x00).store(Store::No),
    w(VENDOR_SPECIFIC_FIELD).persist(Persist::Yes),
    w(PERIODIC_WAKEUP).persist(Persist::Yes),
    w(TCASE_SUPPORT).store(Store::No),
    w(SEC_BAD_BLK_MGMNT)
        .bits(0x01)
        .needs(&[(
            Bit(SEC_FEATURE_SUPPORT, SEC_BD_BLK_EN, "SEC_BD_BLK_EN"),
            NonZero,
        )])
        .persist(Persist::Yes),
    w(ENH_START_ADDR)
        .needs(&[PARTITIONING_OPEN])
        .persist(Persist::Yes),
    w(ENH_SIZE_MULT)
        .needs(&[PARTITIONING_OPEN])
        .persist(Persist::Yes),
    w(GP_SIZE_MULT)
        .needs(&[PARTITIONING_OPEN])
        .persist(Persist::Yes),
    // Writing 0 while it is 0 is harmless whatever the card supports.
    w(PARTITION_SETTING_COMPLETED)
        .bits(0x01)
        .once(Once::Sticky(0x01))
        .needs(&[(Need::PartitioningOpen, NonZero)])
        .check(Check::PartitionSettings)
        .persist(Persist::Changes(0x01)),
    w(PARTITIONS_ATTRIBUTE)
        .bits(0x1F)
        .needs(&[
            PARTITIONING_OPEN,
            (
                Bit(PARTITIONING_SUPPORT, ENH_ATTRIBUTE_EN, "ENH_ATTRIBUTE_EN"),
                NonZero,
            ),
        ])
        .persist(Persist::Yes),
    w(HPI_MGMT)
        .bits(HPI_EN)
        .needs(&[(Bit(HPI_FEATURES, HPI_SUPPORT, "HPI_SUPPORT"), NonZero)]),
    w(RST_N_FUNCTION)
        .values(Values::UpTo(2))
        .once(Once::Fixed)
        .persist(Persist::Yes),
    // AUTO_EN (bit 1) is 5.0.
    w(BKOPS_EN)
        .bits(BKOPS_MANUAL_EN)
        .once(Once::Sticky(BKOPS_MANUAL_EN))
        .needs(&[(BKOPS_SUPPORT_BIT, NonZero)])
        .persist(Persist::Yes),
    w(BKOPS_START)
        .needs(&[
            (BKOPS_SUPPORT_BIT, Always),
            (Bit(BKOPS_EN, BKOPS_MANUAL_EN, "BKOPS_EN.MANUAL_EN"), Always),
        ])
        .store(Store::No)
        .effect(E::StartBkops),
    w(SANITIZE_START)
        .needs(&[(
            Bit(SEC_FEATURE_SUPPORT, SEC_SANITIZE, "SEC_SANITIZE"),
            Always,
        )])
        .store(Store::No)
        .effect(E::Sanitize),
    w(WR_REL_SET)
        .bits(0x1F)
        .needs(&[
            (Bit(WR_REL_PARAM, HS_CTRL_REL, "HS_CTRL_REL"), Always),
            PARTITIONING_OPEN,
        ])
        .persist(Persist::Yes),
    w(FW_CONFIG).bits(0x01).persist(Persist::Yes),
    // Enable bits may be cleared (they are power-on or one-time by their nature); the
    // disables may not.
    w(USER_WP)
        .bits(
            US_PWR_WP_EN
                | US_PERM_WP_EN
                | US_PWR_WP_DIS
                | US_PERM_WP_DIS
                | CD_PERM_WP_DIS
                | PERM_PSWD_DIS,
        )
        .once(Once::Sticky(
            US_PWR_WP_DIS | US_PERM_WP_DIS | CD_PERM_WP_DIS | PERM_PSWD_DIS,
        ))
        .disables(&[
            (US_PWR_WP_EN, US_PWR_WP_DIS),
            (US_PERM_WP_EN, US_PERM_WP_DIS),
        ])
        .persist(Persist::Yes),
    // Enable and disable bits stay set until a power cycle (PWR) or forever (PERM).
    w(BOOT_WP)
        .bits(!(1 << 5))
        .disables(&[(B_PERM_WP_EN, B_PERM_WP_DIS), (B_PWR_WP_EN, B_PWR_WP_DIS)])
        .store(Store::Merge)
        .persist(Persist::Yes)
        .effect(E::BootWp),
    w(ERASE_GROUP_DEF).bits(0x01),
    // Bus width 3 and timing mode 3 are reserved.
    w(BOOT_BUS_CONDITIONS)
        .bits(0x1F)
        .values(Values::Fields(&[
            (0x03, &[0, 1, 2]),
            (0x18, &[0x00, 0x08, 0x10]),
        ]))
        .needs(&[(Need::BootConfigUnprotected, Changes(0xFF))])
        .persist(Persist::Yes),
    // Protection can only be set; it clears by power cycle (PWR) or never (PERM).
    w(BOOT_CONFIG_PROT)
        .bits(PWR_BOOT_CONFIG_PROT | PERM_BOOT_CONFIG_PROT)
        .store(Store::Merge)
        .persist(Persist::Yes),
    // BOOT_PARTITION_ENABLE 0, 1, 2 or 7; bit 7 is reserved. The boot bits persist.
    w(PARTITION_CONFIG)
        .bits(0x7F)
        .values(Values::Fields(&[(0x38, &[0x00, 0x08, 0x10, 0x38])]))
        .needs(&[(Need::BootConfigUnprotected, Changes(0x78))])
        .check(Check::PartitionExists)
        .persist(Persist::Changes(0x78))
        .effect(E::PartitionAccess),
    // 1, 4, 8 bits SDR; 4, 8 bits DDR. Enhanced strobe (bit 7) is 5.1.
    w(BUS_WIDTH)
        .values(Values::OneOf(&[0, 1, 2, 5, 6]))
        .check(Check::BusMode)
        .store(Store::No)
        .effect(E::BusWidth),
    w(HS_TIMING).check(Check::Timing),
    w(POWER_CLASS).bits(0x0F),
    // Only the standard command set exists.
    w(CMD_SET).bits(0x00).store(Store::No),
];

/// The field containing byte `offset` and its write rule, if CMD6 may write it.
pub(crate) fn write_rule(offset: usize) -> Option<(&'static Field, &'static WriteRule)> {
    let field = field_at(offset)?;
    let rule = WRITE_RULES.iter().find(|r| r.offset == field.offset)?;
    Some((field, rule))
}

#[cfg(test)]
mod tests {
    use super::super::fields::{field_named, Access, FIELDS};
    use super::*;

    #[test]
    fn rules_are_in_offset_order_and_each_names_a_field() {
        for pair in WRITE_RULES.windows(2) {
            assert!(pair[0].offset < pair[1].offset, "{:?}", pair[1]);
        }
        for rule in WRITE_RULES {
            let field = field_at(rule.offset).expect("a field");
            assert_eq!(field.offset, rule.offset, "rules key a field's first byte");
            if let Bits::PerByte(masks) = rule.bits {
                assert_eq!(masks.len(), field.len, "{}", field.name);
            }
        }
    }

    #[test]
    fn exactly_the_fields_that_are_not_read_only_have_a_rule() {
        for field in FIELDS {
            let has_rule = WRITE_RULES.iter().any(|r| r.offset == field.offset);
            assert_eq!(has_rule, field.access != Access::R, "{}", field.name);
        }
        assert!(write_rule(PROPERTIES_SEGMENT).is_none());
        assert!(write_rule(0).is_none(), "reserved byte");
        assert!(write_rule(PACKED_FAILURE_INDEX).is_none());
    }

    #[test]
    fn every_byte_of_a_writable_field_finds_its_rule() {
        let (field, rule) = write_rule(GP_SIZE_MULT + 11).unwrap();
        assert_eq!((field.name, rule.offset), ("GP_SIZE_MULT", GP_SIZE_MULT));
        let (field, _) = write_rule(EXCEPTION_EVENTS_CTRL + 1).unwrap();
        assert_eq!(field.name, "EXCEPTION_EVENTS_CTRL");
        assert_eq!(
            write_rule(CONTEXT_CONF + 14).unwrap().0.name,
            "CONTEXT_CONF"
        );
        assert_eq!(
            write_rule(VENDOR_SPECIFIC_FIELD + 63).unwrap().0.name,
            "VENDOR_SPECIFIC_FIELD"
        );
    }

    #[test]
    fn storage_and_persistence_follow_the_access_type() {
        for rule in WRITE_RULES {
            let field = field_at(rule.offset).unwrap();
            match field.access {
                // Write-only fields read 0: nothing is stored, and they reset.
                Access::W | Access::WE | Access::WEP => {
                    assert_eq!(rule.store, Store::No, "{}", field.name)
                }
                _ => {}
            }
            if rule.store == Store::No {
                continue;
            }
            match field.access {
                // Kept over power loss: saved after every accepted write.
                Access::RW | Access::RWE | Access::Vendor | Access::Mixed => {
                    assert_ne!(rule.persist, Persist::No, "{}", field.name)
                }
                // Reset by power loss: never saved.
                _ => assert_eq!(rule.persist, Persist::No, "{}", field.name),
            }
        }
    }

    #[test]
    fn the_generic_columns_decide_as_documented() {
        assert!(Once::Fixed.allow(0, 2) && Once::Fixed.allow(1, 1));
        assert!(!Once::Fixed.allow(1, 2) && !Once::Fixed.allow(1, 0));
        assert!(Once::Sticky(0x18).allow(0x08, 0x09));
        assert!(!Once::Sticky(0x18).allow(0x09, 0x01));
        assert!(Once::No.allow(0xFF, 0));

        let boot = field_named("BOOT_BUS_CONDITIONS").unwrap().offset;
        let rule = write_rule(boot).unwrap().1;
        assert!(rule.values.allow(0x12));
        assert!(!rule.values.allow(0x03), "bus width 3 is reserved");
        assert!(!rule.values.allow(0x18), "timing mode 3 is reserved");
        assert!(Values::UpTo(3).allow(3) && !Values::UpTo(3).allow(4));
        assert!(Values::OneOf(&[0, 5]).allow(5) && !Values::OneOf(&[0, 5]).allow(4));

        assert!(!When::NonZero.applies(1, 0) && When::NonZero.applies(0, 1));
        assert!(When::Changes(0x78).applies(0x08, 0x10));
        assert!(!When::Changes(0x78).applies(0x08, 0x09));
        assert!(Persist::Changes(1).applies(0, 1) && !Persist::Changes(1).applies(0, 0));

        let ee = write_rule(EXCEPTION_EVENTS_CTRL).unwrap().1;
        assert_eq!(ee.bits.of_byte(0), 0x0E, "URGENT_BKOPS has no enable");
        assert_eq!(ee.bits.of_byte(1), 0x00);
        assert_eq!(Bits::All(0x1F).of_byte(7), 0x1F);
    }

    #[test]
    fn one_time_fields_are_the_specs() {
        let once = |name: &str| {
            write_rule(field_named(name).unwrap().offset)
                .unwrap()
                .1
                .once
        };
        assert_eq!(once("RST_n_FUNCTION"), Once::Fixed);
        assert_eq!(once("BKOPS_EN"), Once::Sticky(BKOPS_MANUAL_EN));
        assert_eq!(once("PARTITION_SETTING_COMPLETED"), Once::Sticky(1));
        assert_eq!(once("HS_TIMING"), Once::No);
    }
}
