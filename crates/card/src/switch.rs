//! CMD6 SWITCH: the four access modes over EXT_CSD, and what writing each host-writable
//! field does. A write the field does not allow (read-only byte, reserved bits, a value
//! the card does not support, a one-time field already set) is refused with SWITCH_ERROR,
//! reported in the next status as the spec's "x" type requires, and changes nothing.

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

/// What a successful field write asks the card to do afterwards.
struct Effect {
    kind: SwitchKind,
    op: OpKind,
    extra: Cost,
    persist: bool,
}

impl Effect {
    fn generic() -> Effect {
        Effect {
            kind: SwitchKind::Generic,
            op: OpKind::Busy,
            extra: Cost::ZERO,
            persist: false,
        }
    }

    fn persistent() -> Effect {
        Effect {
            persist: true,
            ..Effect::generic()
        }
    }
}

type SwitchResult = Result<Effect, String>;

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
                Ok(Effect::generic())
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
            Ok(effect) => {
                if effect.persist {
                    self.save_persistent();
                }
                let switch = self.timing.switch(self.now, effect.kind);
                let cost = switch + effect.extra;
                self.busy.add_background(cost.background_ns);
                let mut op = effect.op;
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

    /// Write `new` (computed from `old` by the access mode) into EXT_CSD[index].
    fn switch_field(&mut self, index: usize, old: u8, new: u8) -> SwitchResult {
        let m = &self.model.ext_csd;
        let partitioning_open = m.partitioning_support & x::PARTITIONING_EN != 0
            && self.regs.byte(x::PARTITION_SETTING_COMPLETED) & 1 == 0;
        match index {
            x::FLUSH_CACHE => {
                if new & !1 != 0 {
                    return Err("only bit 0 (FLUSH) exists on a 4.5 card".into());
                }
                if m.cache_size == 0 {
                    return Err("the card has no cache".into());
                }
                if new == 0 {
                    return Ok(Effect::generic());
                }
                let extra = self.flush_cache();
                Ok(Effect {
                    op: OpKind::Flush,
                    extra,
                    ..Effect::generic()
                })
            }
            x::CACHE_CTRL => {
                if new & !x::CACHE_EN != 0 {
                    return Err("CACHE_CTRL has only CACHE_EN".into());
                }
                if m.cache_size == 0 && new != 0 {
                    return Err("the card has no cache".into());
                }
                let mut effect = Effect::generic();
                if new == 0 && old & x::CACHE_EN != 0 {
                    // The cache is written back before it reads as off.
                    effect.extra = self.flush_cache();
                    effect.op = OpKind::Flush;
                }
                self.regs.set_byte(index, new);
                Ok(effect)
            }
            x::POWER_OFF_NOTIFICATION => {
                if new > x::POWER_OFF_LONG {
                    return Err(format!("POWER_OFF_NOTIFICATION {new} is not a 4.5 value"));
                }
                let mut effect = Effect::generic();
                if new == x::POWER_OFF_SHORT || new == x::POWER_OFF_LONG {
                    effect.extra = self.flush_cache();
                    effect.op = OpKind::Flush;
                    if new == x::POWER_OFF_LONG {
                        effect.kind = SwitchKind::PowerOffLong;
                    }
                }
                self.regs.set_byte(index, new);
                Ok(effect)
            }
            x::EXCEPTION_EVENTS_CTRL => {
                let allowed =
                    (x::EE_DYNCAP_NEEDED | x::EE_SYSPOOL_EXHAUSTED | x::EE_PACKED_FAILURE) as u8;
                if new & !allowed != 0 {
                    return Err(format!(
                        "EXCEPTION_EVENTS_CTRL bits {:#04x} are not defined for 4.5",
                        new & !allowed
                    ));
                }
                self.regs.set_byte(index, new);
                Ok(Effect::generic())
            }
            i if i == x::EXCEPTION_EVENTS_CTRL + 1 => {
                if new != 0 {
                    return Err("EXCEPTION_EVENTS_CTRL high byte is reserved".into());
                }
                Ok(Effect::generic())
            }
            x::CLASS_6_CTRL => {
                if new != 0 {
                    return Err("dynamic capacity is not supported".into());
                }
                Ok(Effect::generic())
            }
            i if (x::CONTEXT_CONF..x::CONTEXT_CONF + 15).contains(&i) => {
                let context = i - x::CONTEXT_CONF + 1;
                let max = usize::from(m.context_capabilities & 0x0F);
                if context > max {
                    return Err(format!("context {context} is beyond MAX_CONTEXT_ID {max}"));
                }
                self.regs.set_byte(index, new);
                Ok(Effect::generic())
            }
            x::EXT_PARTITIONS_ATTRIBUTE | 53 => {
                if !partitioning_open || m.partitioning_support & x::EXT_ATTRIBUTE_EN == 0 {
                    return Err("extended partition attributes are not settable".into());
                }
                for nibble in [new & 0x0F, new >> 4] {
                    let ok = match nibble {
                        0 => true,
                        1 => m.ext_support & 1 != 0,
                        2 => m.ext_support & 2 != 0,
                        _ => false,
                    };
                    if !ok {
                        return Err(format!("partition type {nibble} is not supported"));
                    }
                }
                self.regs.set_byte(index, new);
                Ok(Effect::persistent())
            }
            x::USE_NATIVE_SECTOR => {
                if new != 0 {
                    return Err("the card has no 4 KiB native sectors".into());
                }
                Ok(Effect::generic())
            }
            i if (x::VENDOR_SPECIFIC_FIELD..x::VENDOR_SPECIFIC_FIELD + 64).contains(&i) => {
                self.regs.set_byte(index, new);
                Ok(Effect::persistent())
            }
            x::PERIODIC_WAKEUP => {
                self.regs.set_byte(index, new);
                Ok(Effect::persistent())
            }
            x::TCASE_SUPPORT => Ok(Effect::generic()),
            x::SEC_BAD_BLK_MGMNT => {
                if new & !1 != 0 || (new != 0 && m.sec_feature_support & x::SEC_BD_BLK_EN == 0) {
                    return Err("secure bad-block management is not supported".into());
                }
                self.regs.set_byte(index, new);
                Ok(Effect::persistent())
            }
            i if (x::ENH_START_ADDR..x::PARTITION_SETTING_COMPLETED).contains(&i)
                || i == x::PARTITIONS_ATTRIBUTE =>
            {
                if !partitioning_open {
                    return Err("partitioning is not supported or already completed".into());
                }
                if i == x::PARTITIONS_ATTRIBUTE
                    && (new & !0x1F != 0
                        || (new != 0 && m.partitioning_support & x::ENH_ATTRIBUTE_EN == 0))
                {
                    return Err("enhanced attributes are not supported".into());
                }
                self.regs.set_byte(index, new);
                Ok(Effect::persistent())
            }
            x::PARTITION_SETTING_COMPLETED => {
                if new & !1 != 0 {
                    return Err("PARTITION_SETTING_COMPLETED has only bit 0".into());
                }
                if new == 0 {
                    return if old == 0 {
                        Ok(Effect::generic())
                    } else {
                        Err("partitioning is one-time".into())
                    };
                }
                if !partitioning_open {
                    return Err("partitioning is not supported or already completed".into());
                }
                self.check_partition_settings()?;
                self.regs.set_byte(index, 1);
                Ok(Effect::persistent())
            }
            x::HPI_MGMT => {
                if new & !x::HPI_EN != 0 || (new != 0 && m.hpi_features & x::HPI_SUPPORT == 0) {
                    return Err("HPI is not supported".into());
                }
                self.regs.set_byte(index, new);
                Ok(Effect::generic())
            }
            x::RST_N_FUNCTION => {
                if new > 2 {
                    return Err(format!("RST_n_FUNCTION {new} is reserved"));
                }
                if old != 0 && new != old {
                    return Err("RST_n_FUNCTION is one-time programmable".into());
                }
                self.regs.set_byte(index, new);
                Ok(Effect::persistent())
            }
            x::BKOPS_EN => {
                if new & !x::BKOPS_MANUAL_EN != 0 {
                    return Err("only MANUAL_EN exists on a 4.5 card".into());
                }
                if new != 0 && m.bkops_support & 1 == 0 {
                    return Err("BKOPS is not supported".into());
                }
                if old & x::BKOPS_MANUAL_EN != 0 && new == 0 {
                    return Err("BKOPS_EN is one-time programmable".into());
                }
                self.regs.set_byte(index, new);
                Ok(Effect::persistent())
            }
            x::BKOPS_START => {
                if m.bkops_support & 1 == 0 || self.regs.byte(x::BKOPS_EN) & x::BKOPS_MANUAL_EN == 0
                {
                    return Err("BKOPS_START needs BKOPS_SUPPORT and BKOPS_EN".into());
                }
                // Busy until the outstanding background work is done (or HPI).
                Ok(Effect {
                    op: OpKind::Bkops { overhead_ns: 0 },
                    extra: Cost::busy(self.outstanding_background()),
                    ..Effect::generic()
                })
            }
            x::SANITIZE_START => {
                if m.sec_feature_support & x::SEC_SANITIZE == 0 {
                    return Err("sanitize is not supported".into());
                }
                self.purge_secure_trim_marks();
                Ok(Effect {
                    kind: SwitchKind::Sanitize,
                    op: OpKind::Sanitize,
                    ..Effect::generic()
                })
            }
            x::WR_REL_SET => {
                if m.wr_rel_param & x::HS_CTRL_REL == 0 || !partitioning_open || new & !0x1F != 0 {
                    return Err("WR_REL_SET is not host-programmable now".into());
                }
                self.regs.set_byte(index, new);
                Ok(Effect::persistent())
            }
            x::FW_CONFIG => {
                if new & !1 != 0 {
                    return Err("FW_CONFIG has only Update_Disable".into());
                }
                self.regs.set_byte(index, new);
                Ok(Effect::persistent())
            }
            x::USER_WP => self.switch_user_wp(old, new),
            x::BOOT_WP => self.switch_boot_wp(old, new),
            x::ERASE_GROUP_DEF => {
                if new & !1 != 0 {
                    return Err("ERASE_GROUP_DEF has only bit 0".into());
                }
                self.regs.set_byte(index, new);
                Ok(Effect::generic())
            }
            x::BOOT_BUS_CONDITIONS => {
                if new & !0x1F != 0 || new & 0x03 == 3 || (new >> 3) & 0x03 == 3 {
                    return Err(format!("BOOT_BUS_CONDITIONS {new:#04x} is reserved"));
                }
                if self.boot_config_protected() && new != old {
                    return Err("boot configuration is protected".into());
                }
                self.regs.set_byte(index, new);
                Ok(Effect::persistent())
            }
            x::BOOT_CONFIG_PROT => {
                let allowed = x::PWR_BOOT_CONFIG_PROT | x::PERM_BOOT_CONFIG_PROT;
                if new & !allowed != 0 {
                    return Err("BOOT_CONFIG_PROT reserved bits".into());
                }
                // Protection bits can only be set; they clear by power cycle (PWR) or never.
                self.regs.set_byte(index, old | new);
                Ok(Effect::persistent())
            }
            x::PARTITION_CONFIG => self.switch_partition_config(old, new),
            x::BUS_WIDTH => {
                let ddr = matches!(new, 5 | 6);
                if !matches!(new, 0 | 1 | 2 | 5 | 6) {
                    return Err(format!("BUS_WIDTH {new:#04x} is not a 4.5 bus mode"));
                }
                if ddr {
                    let ddr_cap = m.device_type
                        & (x::DEVICE_TYPE_DDR_52_1V8 | x::DEVICE_TYPE_DDR_52_1V2)
                        != 0;
                    if !ddr_cap || self.regs.byte(x::HS_TIMING) & 0x0F != 1 {
                        return Err("DDR needs DDR support and HS_TIMING high speed".into());
                    }
                }
                self.regs.set_bus_width(new);
                Ok(Effect::generic())
            }
            x::HS_TIMING => {
                let timing = new & 0x0F;
                let driver = new >> 4;
                let ok = match timing {
                    0 => true,
                    1 => m.device_type & (x::DEVICE_TYPE_HS_26 | x::DEVICE_TYPE_HS_52) != 0,
                    2 => {
                        m.device_type & (x::DEVICE_TYPE_HS200_1V8 | x::DEVICE_TYPE_HS200_1V2) != 0
                            && matches!(self.regs.bus_width(), 1 | 2)
                    }
                    _ => false,
                };
                if !ok {
                    return Err(format!(
                        "HS_TIMING {timing} is not supported in this bus mode"
                    ));
                }
                if driver != 0 && m.driver_strength & (1 << driver) == 0 {
                    return Err(format!("driver strength type {driver} is not supported"));
                }
                self.regs.set_byte(index, new);
                Ok(Effect::generic())
            }
            x::POWER_CLASS => {
                if new > 0x0F {
                    return Err("POWER_CLASS is a 4-bit class".into());
                }
                self.regs.set_byte(index, new);
                Ok(Effect::generic())
            }
            x::CMD_SET => {
                if new != 0 {
                    return Err("only the standard command set exists".into());
                }
                Ok(Effect::generic())
            }
            i if i >= x::PROPERTIES_SEGMENT => Err(format!(
                "EXT_CSD[{i}] is in the read-only properties segment"
            )),
            i => Err(format!(
                "EXT_CSD[{i}] is read-only or reserved on a 4.5 card"
            )),
        }
    }

    fn boot_config_protected(&self) -> bool {
        self.regs.boot_config_protected()
    }

    fn switch_partition_config(&mut self, old: u8, new: u8) -> SwitchResult {
        if new & 0x80 != 0 {
            return Err("PARTITION_CONFIG bit 7 is reserved".into());
        }
        let partition = Partition::from_access(new);
        if !self.partitions.exists(partition) {
            return Err(format!("partition {} does not exist", partition.name()));
        }
        let enable = (new >> 3) & 0x7;
        if !matches!(enable, 0 | 1 | 2 | 7) {
            return Err(format!("BOOT_PARTITION_ENABLE {enable} is reserved"));
        }
        let boot_bits = 0x78;
        if (new ^ old) & boot_bits != 0 && self.boot_config_protected() {
            return Err("boot configuration is protected".into());
        }
        self.regs.set_byte(x::PARTITION_CONFIG, new);
        let mut effect = Effect {
            persist: (new ^ old) & boot_bits != 0,
            ..Effect::generic()
        };
        if (new ^ old) & 0x07 != 0 {
            effect.kind = SwitchKind::PartitionAccess;
        }
        Ok(effect)
    }

    fn switch_user_wp(&mut self, old: u8, new: u8) -> SwitchResult {
        use x::{
            CD_PERM_WP_DIS, PERM_PSWD_DIS, US_PERM_WP_DIS, US_PERM_WP_EN, US_PWR_WP_DIS,
            US_PWR_WP_EN,
        };
        let defined = US_PWR_WP_EN
            | US_PERM_WP_EN
            | US_PWR_WP_DIS
            | US_PERM_WP_DIS
            | CD_PERM_WP_DIS
            | PERM_PSWD_DIS;
        if new & !defined != 0 {
            return Err("USER_WP reserved bits".into());
        }
        // One-time and until-power-cycle bits cannot be cleared by the host.
        let sticky = US_PWR_WP_DIS | US_PERM_WP_DIS | CD_PERM_WP_DIS | PERM_PSWD_DIS;
        if old & sticky & !new != 0 {
            return Err("USER_WP disable bits cannot be cleared".into());
        }
        let dis = new | old;
        if new & US_PWR_WP_EN != 0 && dis & US_PWR_WP_DIS != 0 {
            return Err("power-on write protection is disabled".into());
        }
        if new & US_PERM_WP_EN != 0 && dis & US_PERM_WP_DIS != 0 {
            return Err("permanent write protection is disabled".into());
        }
        self.regs.set_byte(x::USER_WP, new);
        Ok(Effect::persistent())
    }

    fn switch_boot_wp(&mut self, old: u8, new: u8) -> SwitchResult {
        use x::{B_PERM_WP_DIS, B_PERM_WP_EN, B_PWR_WP_DIS, B_PWR_WP_EN};
        if new & (1 << 5) != 0 {
            return Err("BOOT_WP bit 5 is reserved".into());
        }
        if new & B_PERM_WP_EN != 0 && (old | new) & B_PERM_WP_DIS != 0 {
            return Err("permanent boot write protection is disabled".into());
        }
        if new & B_PWR_WP_EN != 0 && (old | new) & B_PWR_WP_DIS != 0 {
            return Err("power-on boot write protection is disabled".into());
        }
        self.protection.latch_boot_wp(new);
        // Enable and disable bits stay set until a power cycle (PWR) or forever (PERM).
        self.regs.set_byte(x::BOOT_WP, old | new);
        Ok(Effect::persistent())
    }

    /// Check GP/enhanced sizes before PARTITION_SETTING_COMPLETED is accepted.
    fn check_partition_settings(&self) -> Result<(), String> {
        partitions::check_settings(
            self.model.hc_wp_group_sectors(),
            self.regs.gp_size_mults(),
            self.model.user_bytes() / 512,
            u64::from(self.regs.read_le(x::ENH_SIZE_MULT, 3)),
            u64::from(self.model.ext_csd.max_enh_size_mult),
        )
    }
}
