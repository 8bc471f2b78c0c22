//! CMD6 SWITCH: the four access modes over EXT_CSD, driven by the table of write rules
//! (`ext_csd/rules.rs`). The dispatcher finds the row of the field the byte belongs to,
//! applies the row's checks — reserved bits, allowed values, one-time rules, enable and
//! disable pairs, what the card must support — then the field's own check if it has one,
//! stores the value and carries out the field's effect.
//!
//! A write the field does not allow (read-only or reserved byte, reserved bits, a value
//! the card does not support, a one-time field already set) is refused with
//! SWITCH_ERROR, reported in the next status as the spec's "x" type requires, and
//! changes nothing.

use super::ext_csd::rules::{self, Check, Effect, Need, Store, WriteRule};
use super::partition::Partition;
use super::parts::busy::OpKind;
use super::parts::partitions;
use super::status::r1;
use super::{ext_csd as x, Card, Exec, Handled};
use crate::timing::{Cost, SwitchKind};

/// CMD6 access modes (argument bits 25:24).
const ACCESS_COMMAND_SET: u32 = 0;
const ACCESS_SET_BITS: u32 = 1;
const ACCESS_CLEAR_BITS: u32 = 2;
const ACCESS_WRITE_BYTE: u32 = 3;

/// What an accepted switch asks of the card afterwards: the kind of busy period the
/// timing model costs, the operation the card is busy with, extra cost (a write-back,
/// BKOPS), and whether the persistent state is saved.
struct Outcome {
    kind: SwitchKind,
    op: OpKind,
    extra: Cost,
    persist: bool,
}

impl Outcome {
    fn generic() -> Outcome {
        Outcome {
            kind: SwitchKind::Generic,
            op: OpKind::Busy,
            extra: Cost::ZERO,
            persist: false,
        }
    }
}

impl Card {
    pub(super) fn cmd6_switch(&mut self, e: &mut Exec) -> Handled {
        let access = (e.arg >> 24) & 0x3;
        let index = ((e.arg >> 16) & 0xFF) as usize;
        let value = ((e.arg >> 8) & 0xFF) as u8;
        let cmd_set = e.arg & 0x7;
        let result = if e.arg & 0xFC00_00F8 != 0 {
            Err("reserved argument bits set".to_string())
        } else if access == ACCESS_COMMAND_SET {
            if cmd_set == 0 {
                Ok(Outcome::generic())
            } else {
                Err(format!("command set {cmd_set} is not supported"))
            }
        } else {
            let old = self.regs.byte(index);
            let new = match access {
                ACCESS_SET_BITS => old | value,
                ACCESS_CLEAR_BITS => old & !value,
                ACCESS_WRITE_BYTE => value,
                _ => unreachable!("two-bit field"),
            };
            self.switch_field(index, old, new)
        };
        match result {
            Ok(outcome) => {
                if outcome.persist {
                    self.save_persistent();
                }
                let switch = self.timing.switch(self.now, outcome.kind);
                let cost = switch + outcome.extra;
                self.busy.add_background(cost.background_ns);
                let mut op = outcome.op;
                if let OpKind::Bkops { overhead_ns } = &mut op {
                    *overhead_ns = switch.busy_ns;
                }
                self.begin_op(cost.busy_ns, op);
            }
            Err(why) => {
                log::debug!("CMD6 {:#010x}: SWITCH_ERROR: {why}", e.arg);
                e.after_status |= r1::SWITCH_ERROR;
            }
        }
        Handled::R1b
    }

    /// Write `new` (computed from `old` by the access mode) into EXT_CSD[index], as the
    /// field's write rule allows.
    fn switch_field(&mut self, index: usize, old: u8, new: u8) -> Result<Outcome, String> {
        let Some((field, rule)) = rules::write_rule(index) else {
            return Err(if index >= x::PROPERTIES_SEGMENT {
                format!("EXT_CSD[{index}] is in the read-only properties segment")
            } else {
                format!("EXT_CSD[{index}] is read-only or reserved on a 4.5 card")
            });
        };
        let name = field.name;
        let byte = index - field.offset;
        self.check_rule(rule, byte, old, new)
            .map_err(|why| format!("{name}: {why}"))?;
        match rule.store {
            Store::Value => self.regs.set_byte(index, new),
            Store::Merge => self.regs.set_byte(index, old | new),
            Store::No => {}
        }
        let mut outcome = self.switch_effect(rule.effect, old, new);
        outcome.persist = rule.persist.applies(old, new);
        Ok(outcome)
    }

    /// The row's checks, in the table's column order; the first that fails says why.
    fn check_rule(&self, rule: &WriteRule, byte: usize, old: u8, new: u8) -> Result<(), String> {
        let reserved = new & !rule.bits.of_byte(byte);
        if reserved != 0 {
            return Err(format!(
                "bits {reserved:#04x} are reserved or not supported"
            ));
        }
        if !rule.values.allow(new) {
            return Err(format!("{new:#04x} is a reserved or unsupported value"));
        }
        if !rule.once.allow(old, new) {
            return Err(format!(
                "one-time programmable: {old:#04x} cannot become {new:#04x}"
            ));
        }
        for &(enable, disable) in rule.disables {
            if new & enable != 0 && (old | new) & disable != 0 {
                return Err(format!("enable bit {enable:#04x} is disabled"));
            }
        }
        for &(need, when) in rule.needs {
            if when.applies(old, new) && !self.meets(need) {
                return Err(match need {
                    Need::Bit(_, _, what) => format!("needs {what}"),
                    Need::Cache => "the card has no cache".into(),
                    Need::PartitioningOpen => {
                        "partitioning is not supported or already completed".into()
                    }
                    Need::BootConfigUnprotected => "boot configuration is protected".into(),
                });
            }
        }
        self.check_field(rule.check, byte, new)
    }

    fn meets(&self, need: Need) -> bool {
        match need {
            Need::Bit(offset, mask, _) => self.regs.byte(offset) & mask != 0,
            Need::Cache => self.regs.read_le(x::CACHE_SIZE, 4) != 0,
            Need::PartitioningOpen => {
                self.regs.byte(x::PARTITIONING_SUPPORT) & x::PARTITIONING_EN != 0
                    && !self.regs.partitioning_completed()
            }
            Need::BootConfigUnprotected => !self.regs.boot_config_protected(),
        }
    }

    /// The field-specific checks that need more than the register.
    fn check_field(&self, check: Check, byte: usize, new: u8) -> Result<(), String> {
        match check {
            Check::None => Ok(()),
            Check::ContextId => {
                let context = byte + 1;
                let max = usize::from(self.regs.byte(x::CONTEXT_CAPABILITIES) & 0x0F);
                if context > max {
                    return Err(format!("context {context} is beyond MAX_CONTEXT_ID {max}"));
                }
                Ok(())
            }
            Check::PartitionTypes => {
                let supported = self.regs.byte(x::EXT_SUPPORT);
                for nibble in [new & 0x0F, new >> 4] {
                    let ok = match nibble {
                        0 => true,
                        1 => supported & 1 != 0,
                        2 => supported & 2 != 0,
                        _ => false,
                    };
                    if !ok {
                        return Err(format!("partition type {nibble} is not supported"));
                    }
                }
                Ok(())
            }
            Check::PartitionExists => {
                let partition = Partition::from_access(new);
                if !self.partitions.exists(partition) {
                    return Err(format!("partition {} does not exist", partition.name()));
                }
                Ok(())
            }
            Check::PartitionSettings => {
                if new & 1 == 0 {
                    return Ok(());
                }
                partitions::check_settings(
                    self.model.hc_wp_group_sectors(),
                    self.regs.gp_size_mults(),
                    self.model.user_bytes() / 512,
                    u64::from(self.regs.read_le(x::ENH_SIZE_MULT, 3)),
                    u64::from(self.model.ext_csd.max_enh_size_mult),
                )
            }
            Check::BusMode => {
                if matches!(new, 5 | 6) {
                    let ddr = self.regs.byte(x::DEVICE_TYPE)
                        & (x::DEVICE_TYPE_DDR_52_1V8 | x::DEVICE_TYPE_DDR_52_1V2)
                        != 0;
                    if !ddr || self.regs.hs_timing() & 0x0F != 1 {
                        return Err("DDR needs DDR support and HS_TIMING high speed".into());
                    }
                }
                Ok(())
            }
            Check::Timing => {
                let device_type = self.regs.byte(x::DEVICE_TYPE);
                let timing = new & 0x0F;
                let driver = new >> 4;
                let ok = match timing {
                    0 => true,
                    1 => device_type & (x::DEVICE_TYPE_HS_26 | x::DEVICE_TYPE_HS_52) != 0,
                    2 => {
                        device_type & (x::DEVICE_TYPE_HS200_1V8 | x::DEVICE_TYPE_HS200_1V2) != 0
                            && matches!(self.regs.bus_width(), 1 | 2)
                    }
                    _ => false,
                };
                if !ok {
                    return Err(format!(
                        "HS_TIMING {timing} is not supported in this bus mode"
                    ));
                }
                // Type 0 is mandatory; any other must be a bit DRIVER_STRENGTH sets. Its
                // 8 bits describe types 0..=7: a type of 8..=15 is none the card has.
                let strengths = self.regs.byte(x::DRIVER_STRENGTH);
                let listed = 1u8
                    .checked_shl(u32::from(driver))
                    .is_some_and(|bit| strengths & bit != 0);
                if driver != 0 && !listed {
                    return Err(format!("driver strength type {driver} is not supported"));
                }
                Ok(())
            }
        }
    }

    /// What an accepted write does beyond storing its value.
    fn switch_effect(&mut self, effect: Effect, old: u8, new: u8) -> Outcome {
        let mut outcome = Outcome::generic();
        match effect {
            Effect::None => {}
            Effect::FlushCache => {
                if new & 1 != 0 {
                    outcome.extra = self.flush_cache();
                    outcome.op = OpKind::Flush;
                }
            }
            Effect::CacheOff => {
                if new == 0 && old & x::CACHE_EN != 0 {
                    // The cache is written back before it reads as off.
                    outcome.extra = self.flush_cache();
                    outcome.op = OpKind::Flush;
                }
            }
            Effect::PowerOffNotification => {
                if new == x::POWER_OFF_SHORT || new == x::POWER_OFF_LONG {
                    outcome.extra = self.flush_cache();
                    outcome.op = OpKind::Flush;
                    if new == x::POWER_OFF_LONG {
                        outcome.kind = SwitchKind::PowerOffLong;
                    }
                }
            }
            Effect::StartBkops => {
                // Busy until the outstanding background work is done (or HPI).
                outcome.op = OpKind::Bkops { overhead_ns: 0 };
                outcome.extra = Cost::busy(self.outstanding_background());
            }
            Effect::Sanitize => {
                self.purge_secure_trim_marks();
                outcome.kind = SwitchKind::Sanitize;
                outcome.op = OpKind::Sanitize;
            }
            Effect::BootWp => self.protection.latch_boot_wp(new),
            Effect::PartitionAccess => {
                if (new ^ old) & 0x07 != 0 {
                    outcome.kind = SwitchKind::PartitionAccess;
                }
            }
            Effect::BusWidth => self.regs.set_bus_width(new),
        }
        outcome
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::command::{Command, Response};
    use crate::ext_csd::fields::{field_at, Access};
    use crate::model::DeviceModel;
    use crate::store::MemStore;
    use crate::timing::Nanos;

    const RCA: u32 = 1 << 16;

    /// A card in tran, and card time.
    fn ready(model: DeviceModel) -> (Card, Nanos) {
        let layout = Card::layout_for(&model);
        let mut card = Card::new(model, Box::new(MemStore::new(layout))).unwrap();
        let mut now = 0;
        for (index, arg) in [
            (0u8, 0u32),
            (1, 0x40FF_8080),
            (1, 0x40FF_8080),
            (2, 0),
            (3, RCA),
            (7, RCA),
        ] {
            now += 1_000;
            card.execute(now, Command::new(index, arg));
        }
        assert_eq!(card.state(), crate::CardState::Tran);
        (card, now)
    }

    /// CMD6 with `access` on `index` := `value`, wait out the busy period, CMD13: whether
    /// the switch was accepted, and how long the card was busy.
    fn switch_busy(
        card: &mut Card,
        now: &mut Nanos,
        access: u32,
        index: usize,
        value: u8,
    ) -> (bool, Nanos) {
        let arg = access << 24 | (index as u32) << 16 | u32::from(value) << 8;
        *now += 1_000;
        let resp = card.execute(*now, Command::new(6, arg));
        assert!(matches!(resp, Some(Response::R1b(_))), "{resp:?}");
        let busy = card.busy_until().map_or(0, |end| end - *now);
        *now += busy + 1_000;
        match card.execute(*now, Command::new(13, RCA)) {
            Some(Response::R1(s)) => (s & r1::SWITCH_ERROR == 0, busy),
            other => panic!("CMD13: {other:?}"),
        }
    }

    fn switch(card: &mut Card, now: &mut Nanos, access: u32, index: usize, value: u8) -> bool {
        switch_busy(card, now, access, index, value).0
    }

    fn generic() -> DeviceModel {
        DeviceModel::load("generic-emmc45").unwrap()
    }

    #[test]
    fn a_refused_switch_changes_nothing_and_read_only_bytes_refuse_every_value() {
        let (mut card, mut now) = ready(generic());
        for index in 0..=255usize {
            let writable = field_at(index).is_some_and(|f| f.access != Access::R);
            for value in [0x00u8, 0x01, 0x80, 0xFF] {
                let before = (card.ext_csd(), card.bus_config());
                let accepted = switch(&mut card, &mut now, 3, index, value);
                if !accepted {
                    assert_eq!(
                        (card.ext_csd(), card.bus_config()),
                        before,
                        "EXT_CSD[{index}] := {value:#04x} was refused but changed the card"
                    );
                }
                assert!(
                    writable || !accepted,
                    "EXT_CSD[{index}] has no write rule but took {value:#04x}"
                );
                if accepted && index == x::PARTITION_CONFIG {
                    // Back to the user area for the next writes.
                    assert!(switch(&mut card, &mut now, 3, index, 0));
                }
            }
        }
    }

    #[test]
    fn write_only_fields_read_zero_and_merged_fields_only_gain_bits() {
        let (mut card, mut now) = ready(generic());
        assert!(switch(&mut card, &mut now, 3, x::BKOPS_EN, 1));
        for index in [
            x::FLUSH_CACHE,
            x::BKOPS_START,
            x::SANITIZE_START,
            x::TCASE_SUPPORT,
        ] {
            assert!(switch(&mut card, &mut now, 3, index, 1), "EXT_CSD[{index}]");
            assert_eq!(card.ext_csd()[index], 0, "EXT_CSD[{index}] is write-only");
        }
        assert!(switch(&mut card, &mut now, 3, x::BUS_WIDTH, 2));
        assert_eq!(card.ext_csd()[x::BUS_WIDTH], 0);
        assert_eq!(card.bus_config(), (0, 2), "the card remembers the width");

        assert!(switch(&mut card, &mut now, 3, x::BOOT_CONFIG_PROT, 0x01));
        assert!(switch(&mut card, &mut now, 3, x::BOOT_CONFIG_PROT, 0x10));
        assert!(switch(&mut card, &mut now, 2, x::BOOT_CONFIG_PROT, 0x11));
        assert_eq!(card.ext_csd()[x::BOOT_CONFIG_PROT], 0x11, "bits only set");
    }

    #[test]
    fn one_time_and_feature_gated_fields_follow_their_rows() {
        let (mut card, mut now) = ready(generic());
        // RST_n_FUNCTION: any of 0..=2 once, then fixed.
        assert!(!switch(&mut card, &mut now, 3, x::RST_N_FUNCTION, 3));
        assert!(switch(&mut card, &mut now, 3, x::RST_N_FUNCTION, 2));
        assert!(switch(&mut card, &mut now, 3, x::RST_N_FUNCTION, 2));
        assert!(!switch(&mut card, &mut now, 3, x::RST_N_FUNCTION, 1));
        // USER_WP: a disable bit cannot be cleared, and blocks its enable.
        assert!(switch(&mut card, &mut now, 3, x::USER_WP, x::US_PWR_WP_DIS));
        assert!(!switch(&mut card, &mut now, 3, x::USER_WP, 0));
        assert!(!switch(&mut card, &mut now, 1, x::USER_WP, x::US_PWR_WP_EN));
        // A card without a cache refuses cache control but not turning it off.
        let mut model = generic();
        model.ext_csd.cache_size = 0;
        let (mut card, mut now) = ready(model);
        assert!(!switch(&mut card, &mut now, 3, x::CACHE_CTRL, 1));
        assert!(switch(&mut card, &mut now, 3, x::CACHE_CTRL, 0));
        assert!(!switch(&mut card, &mut now, 3, x::FLUSH_CACHE, 0));
    }

    /// HS_TIMING's upper nibble selects a driver strength: type 0 always, another only if
    /// DRIVER_STRENGTH lists it; its eight bits list types 0..=7, so 8..=15 never are.
    #[test]
    fn hs_timing_takes_only_the_driver_strengths_the_card_lists() {
        let mut model = generic();
        model.ext_csd.driver_strength = 0x03; // types 0 and 1
        let (mut card, mut now) = ready(model);
        assert!(switch(&mut card, &mut now, 3, x::HS_TIMING, 0x01));
        assert!(switch(&mut card, &mut now, 3, x::HS_TIMING, 0x11));
        for refused in [0x21u8, 0x41, 0x81, 0x91, 0xF1] {
            assert!(
                !switch(&mut card, &mut now, 3, x::HS_TIMING, refused),
                "HS_TIMING := {refused:#04x}"
            );
            assert_eq!(card.ext_csd()[x::HS_TIMING], 0x11, "unchanged");
        }
    }

    #[test]
    fn a_partition_access_change_costs_a_partition_switch_and_boot_bits_persist() {
        let (mut card, mut now) = ready(generic());
        let (ok, access_change) = switch_busy(&mut card, &mut now, 3, x::PARTITION_CONFIG, 0x01);
        assert!(ok);
        assert_eq!(card.current_partition(), Partition::Boot1);
        let (ok, boot_bits_only) = switch_busy(&mut card, &mut now, 3, x::PARTITION_CONFIG, 0x09);
        assert!(ok);
        let (ok, generic_switch) = switch_busy(&mut card, &mut now, 3, x::ERASE_GROUP_DEF, 1);
        assert!(ok);
        assert_eq!(
            boot_bits_only, generic_switch,
            "no access change: a generic switch"
        );
        assert_ne!(
            access_change, generic_switch,
            "PARTITION_SWITCH_TIME, not GENERIC_CMD6_TIME"
        );
        assert!(
            !switch(&mut card, &mut now, 3, x::PARTITION_CONFIG, 0x04),
            "no GP1"
        );
        assert_eq!(card.current_partition(), Partition::Boot1);
        assert!(switch(&mut card, &mut now, 3, x::PARTITION_CONFIG, 0x48));
        card.power_cycle(now, crate::PowerDown::Clean);
        assert_eq!(
            card.ext_csd()[x::PARTITION_CONFIG],
            0x48,
            "boot bits survive"
        );
    }
}
