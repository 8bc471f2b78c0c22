//! Validation of device models: the range of every raw register value and the consistency
//! rules between them. Each problem names the model key it concerns (`section.key`, as in
//! the TOML file) and says what would be acceptable, so that a model can be fixed without
//! reading this code. Facts cited are from `shared/reference/emmc45-facts.md` ("facts §n").
//!
//! Also here: the few derived encodings that both validation and the register builders need
//! (PRV, MDT, C_SIZE), so that "valid" and "encodable" cannot drift apart. They live in the
//! model layer because the card layer depends on the model, not the other way round.

use super::{
    BufferARule, CidModel, ConstantTimingModel, DeviceModel, FlashTimingModel, HostProfile,
    ModelError, RandomWrites, TimingModel,
};

/// The only EXT_CSD revision this project emulates: eMMC 4.5/4.51 (facts §6.2).
const EMULATED_EXT_CSD_REV: u8 = 6;
/// Largest RPMB_SIZE_MULT: 128 × 128 KiB = 16 MiB (facts §11.1).
const MAX_RPMB_SIZE_MULT: u8 = 128;
/// Entries that fit in one 512-byte packed-command header after its 8-byte preamble (facts §7.2).
const MAX_PACKED_ENTRIES: u8 = 63;
/// Largest S_A_TIMEOUT: 100 ns × 2^0x17 ≈ 838.9 ms (facts §6.2).
const MAX_S_A_TIMEOUT: u8 = 0x17;
/// Largest value of a 3-byte EXT_CSD field (MAX_ENH_SIZE_MULT).
const MAX_3_BYTES: u32 = 0x00FF_FFFF;
/// Byte-addressed devices are at most 2 GiB = 4 194 304 sectors (facts §4, §6.2).
const BYTE_ADDRESSING_LIMIT_SECTORS: u32 = 4_194_304;

const MS: u64 = 1_000_000;

/// Nanoseconds as milliseconds for messages: "100 ms", "6.554 ms".
fn ms(ns: u64) -> String {
    if ns % MS == 0 {
        format!("{} ms", ns / MS)
    } else {
        format!("{:.3} ms", ns as f64 / MS as f64)
    }
}

/// A problem found: the model key and what is wrong with it.
type Problem = (&'static str, String);

fn ensure(ok: bool, field: &'static str, problem: impl FnOnce() -> String) -> Result<(), Problem> {
    if ok {
        Ok(())
    } else {
        Err((field, problem()))
    }
}

/// `value` may only set bits in `allowed`; `meaning` names the defined bits for the message.
fn only_bits(value: u8, allowed: u8, field: &'static str, meaning: &str) -> Result<(), Problem> {
    let extra = value & !allowed;
    ensure(extra == 0, field, || {
        let bits: Vec<String> = (0..8)
            .filter(|b| extra & (1 << b) != 0)
            .map(|b| b.to_string())
            .collect();
        format!(
            "{value:#04x} sets undefined bit(s) {}; only {meaning} are defined for eMMC 4.5",
            bits.join(", ")
        )
    })
}

impl HostProfile {
    /// What can be checked of a host profile without the card: bus width and the queue
    /// limits. The bus mode and clock are checked against the card's DEVICE_TYPE by
    /// [`DeviceModel::validate`]. Field names are those of a model's `host`.
    pub fn validate(&self) -> Result<(), ModelError> {
        self.check_bus_width()
            .and_then(|()| self.check_limits())
            .map_err(|(field, problem)| ModelError::Invalid {
                name: self.name.clone(),
                field,
                problem,
            })
    }

    fn check_bus_width(&self) -> Result<(), Problem> {
        ensure(
            matches!(self.bus_width, 1 | 4 | 8),
            "host.bus_width",
            || format!("{} lines: the bus has 1, 4 or 8 data lines", self.bus_width),
        )
    }

    fn check_limits(&self) -> Result<(), Problem> {
        let h = self;
        // CMD23's block count is 16 bits: 32 MiB at most per request.
        ensure(
            (4..=32_767).contains(&h.max_sectors_kb),
            "host.max_sectors_kb",
            || format!("{} KiB: a request holds 4..=32767 KiB", h.max_sectors_kb),
        )?;
        ensure(
            (4..=32_767).contains(&h.max_hw_sectors_kb) && h.max_hw_sectors_kb >= h.max_sectors_kb,
            "host.max_hw_sectors_kb",
            || {
                format!(
                    "{} KiB: 4..=32767 KiB and at least max_sectors_kb ({})",
                    h.max_hw_sectors_kb, h.max_sectors_kb
                )
            },
        )?;
        ensure(
            (1..=4096).contains(&h.max_segments),
            "host.max_segments",
            || format!("{}: 1..=4096 segments", h.max_segments),
        )
    }
}

impl DeviceModel {
    /// Check ranges and consistency; every problem names its field.
    pub fn validate(&self) -> Result<(), ModelError> {
        self.check()
            .map_err(|(field, problem)| ModelError::Invalid {
                name: self.name.clone(),
                field,
                problem,
            })
    }

    /// C_SIZE and C_SIZE_MULT for the CSD (READ_BL_LEN 9). With sector addressing the
    /// capacity lives in SEC_COUNT and the CSD carries the conventional (0xFFF, 7). A
    /// byte-addressed user area must be exactly (C_SIZE+1)·2^(C_SIZE_MULT+2) sectors, since
    /// hosts size such a device from the CSD; `None` when it cannot be (facts §5.2).
    pub fn csd_c_size(&self) -> Option<(u16, u8)> {
        if self.sector_addressing() {
            return Some((0xFFF, 7));
        }
        let sectors = u64::from(self.ext_csd.sec_count);
        (0u8..=7).find_map(|mult| {
            let unit = 1u64 << (mult + 2);
            let blocks = sectors / unit;
            (sectors % unit == 0 && (1..=4096).contains(&blocks))
                .then(|| ((blocks - 1) as u16, mult))
        })
    }

    fn check(&self) -> Result<(), Problem> {
        ensure(!self.name.trim().is_empty(), "name", || {
            "must not be empty (it is recorded in images made from the model)".into()
        })?;
        self.check_cid()?;
        self.check_csd()?;
        self.check_ext_csd()?;
        self.check_sizes()?;
        self.check_host()?;
        self.check_timing()
    }

    /// The host section must describe a bus the card supports.
    fn check_host(&self) -> Result<(), Problem> {
        use super::BusTiming;
        use crate::ext_csd as x;
        let h = &self.host;
        h.check_bus_width()?;
        let device_type = self.ext_csd.device_type;
        let (max_hz, supported) = match h.timing {
            BusTiming::Legacy => (26_000_000, true),
            BusTiming::Hs => (
                if device_type & x::DEVICE_TYPE_HS_52 != 0 {
                    52_000_000
                } else {
                    26_000_000
                },
                device_type & (x::DEVICE_TYPE_HS_26 | x::DEVICE_TYPE_HS_52) != 0,
            ),
            BusTiming::Ddr52 => (
                52_000_000,
                device_type & (x::DEVICE_TYPE_DDR_52_1V8 | x::DEVICE_TYPE_DDR_52_1V2) != 0
                    && h.bus_width != 1,
            ),
            BusTiming::Hs200 => (
                200_000_000,
                device_type & (x::DEVICE_TYPE_HS200_1V8 | x::DEVICE_TYPE_HS200_1V2) != 0
                    && h.bus_width != 1,
            ),
        };
        ensure(supported, "host.timing", || {
            format!(
                "{:?} with {} lines is not supported by DEVICE_TYPE {device_type:#04x}",
                h.timing, h.bus_width
            )
        })?;
        ensure(
            h.clock_hz > 0 && h.clock_hz <= max_hz,
            "host.clock_hz",
            || format!("{} Hz: {:?} allows 1..={max_hz} Hz", h.clock_hz, h.timing),
        )?;
        h.check_limits()
    }

    fn check_cid(&self) -> Result<(), Problem> {
        let cid = &self.cid;
        ensure(
            cid.pnm.len() == 6 && cid.pnm.bytes().all(|c| (0x20..=0x7E).contains(&c)),
            "cid.pnm",
            || {
                format!(
                    "{:?} is not 6 printable ASCII characters (PNM is 6 bytes; pad with spaces)",
                    cid.pnm
                )
            },
        )?;
        ensure(cid.prv_bcd().is_some(), "cid.prv", || {
            format!(
                "{:?} is not \"n.m\" with one decimal digit each (PRV is two BCD nibbles)",
                cid.prv
            )
        })?;
        let Some((year, month)) = cid.mdt_year_month() else {
            return Err((
                "cid.mdt",
                format!("{:?} is not \"YYYY-MM\" with month 1..=12", cid.mdt),
            ));
        };
        let rev = self.ext_csd.ext_csd_rev;
        ensure(mdt_year_code(year, rev).is_some(), "cid.mdt", || {
            let range = if rev > 4 {
                "2010..=2025"
            } else {
                "1997..=2012"
            };
            format!(
                "year {year} (month {month}) cannot be encoded in MDT with EXT_CSD_REV {rev}: \
                 the 4-bit year code covers {range} (facts §5.1)"
            )
        })
    }

    fn check_csd(&self) -> Result<(), Problem> {
        let csd = &self.csd;
        ensure(csd.taac & 0x80 == 0, "csd.taac", || {
            format!("{:#04x}: bit 7 is reserved", csd.taac)
        })?;
        ensure(csd.taac & 0x78 != 0, "csd.taac", || {
            format!(
                "{:#04x}: the time value [6:3] is 0, which is reserved (e.g. 0x0E = 1.0 ms)",
                csd.taac
            )
        })?;
        ensure(csd.tran_speed & 0x80 == 0, "csd.tran_speed", || {
            format!("{:#04x}: bit 7 is reserved", csd.tran_speed)
        })?;
        ensure(csd.tran_speed & 0x07 <= 3, "csd.tran_speed", || {
            format!(
                "{:#04x}: rate unit {} is reserved (0..=3: 100 kbit/s .. 100 Mbit/s)",
                csd.tran_speed,
                csd.tran_speed & 7
            )
        })?;
        ensure(csd.tran_speed & 0x78 != 0, "csd.tran_speed", || {
            format!(
                "{:#04x}: the time value [6:3] is 0, which is reserved (0x32 = 26 MHz)",
                csd.tran_speed
            )
        })?;
        ensure(csd.ccc <= 0xFFF, "csd.ccc", || {
            format!("{:#x} does not fit the 12-bit CCC field", csd.ccc)
        })?;
        ensure(csd.ccc & 1 != 0, "csd.ccc", || {
            format!(
                "{:#05x} lacks class 0 (basic commands), which every device supports",
                csd.ccc
            )
        })?;
        for (field, value) in [
            ("csd.erase_grp_size", csd.erase_grp_size),
            ("csd.erase_grp_mult", csd.erase_grp_mult),
            ("csd.wp_grp_size", csd.wp_grp_size),
        ] {
            ensure(value <= 31, field, || {
                format!("{value} does not fit the 5-bit field (at most 31)")
            })?;
        }
        for (field, value) in [
            ("csd.r2w_factor", csd.r2w_factor),
            ("csd.vdd_r_curr_min", csd.vdd_r_curr_min),
            ("csd.vdd_r_curr_max", csd.vdd_r_curr_max),
            ("csd.vdd_w_curr_min", csd.vdd_w_curr_min),
            ("csd.vdd_w_curr_max", csd.vdd_w_curr_max),
        ] {
            ensure(value <= 7, field, || {
                format!("{value} does not fit the 3-bit field (at most 7)")
            })?;
        }
        Ok(())
    }

    fn check_ext_csd(&self) -> Result<(), Problem> {
        let e = &self.ext_csd;
        ensure(
            e.ext_csd_rev == EMULATED_EXT_CSD_REV,
            "ext_csd.ext_csd_rev",
            || {
                format!(
                    "{} is not supported: this project emulates eMMC 4.5, EXT_CSD_REV 6",
                    e.ext_csd_rev
                )
            },
        )?;

        // DEVICE_TYPE: bits 6-7 (HS400) are [5.0]. A device of the MMC 4.x family supports
        // at least HS26; older Linux accepted only 0x01 and 0x03 and, once DDR/HS200 came,
        // only combinations that include HS52|HS26 (EXT_CSD_CARD_TYPE_SDR_ALL and friends).
        // DDR52 runs in HS timing at 52 MHz and HS200 is entered from HS, so both need HS52.
        only_bits(
            e.device_type,
            0x3F,
            "ext_csd.device_type",
            "bits 0-5 (HS26, HS52, DDR52 1.8/3V, DDR52 1.2V, HS200 1.8V, HS200 1.2V; \
             HS400 bits 6-7 are [5.0])",
        )?;
        ensure(e.device_type & 0x01 != 0, "ext_csd.device_type", || {
            format!(
                "{:#04x} lacks bit 0 (HS26): every eMMC 4.x device supports high speed at 26 MHz",
                e.device_type
            )
        })?;
        ensure(
            e.device_type & 0x3C == 0 || e.device_type & 0x02 != 0,
            "ext_csd.device_type",
            || {
                format!(
                    "{:#04x} sets DDR52/HS200 bits without bit 1 (HS52); DDR52 runs at 52 MHz \
                     in HS timing and HS200 is entered from it",
                    e.device_type
                )
            },
        )?;
        ensure(
            e.driver_strength & 0x01 != 0,
            "ext_csd.driver_strength",
            || {
                format!(
                    "{:#04x} lacks bit 0: driver type 0 is mandatory",
                    e.driver_strength
                )
            },
        )?;
        only_bits(
            e.driver_strength,
            0x1F,
            "ext_csd.driver_strength",
            "bits 0-4 (driver types 0-4)",
        )?;

        ensure(
            (1..=MAX_S_A_TIMEOUT).contains(&e.s_a_timeout),
            "ext_csd.s_a_timeout",
            || {
                format!(
                    "{:#04x} is outside 0x01..=0x17 (100 ns × 2^value, at most ≈ 838.9 ms)",
                    e.s_a_timeout
                )
            },
        )?;
        ensure(
            e.generic_cmd6_time >= 1,
            "ext_csd.generic_cmd6_time",
            || {
                "0 leaves hosts without a CMD6 busy time-out; REV 6 devices define it (× 10 ms)"
                    .into()
            },
        )?;

        // HPI, BKOPS, packed commands, reliable write.
        only_bits(
            e.hpi_features,
            0x03,
            "ext_csd.hpi_features",
            "bits 0-1 (HPI_SUPPORT, HPI_IMPLEMENTATION)",
        )?;
        ensure(e.hpi_features != 0x02, "ext_csd.hpi_features", || {
            "0x02 names a carrier (CMD12) for HPI without HPI_SUPPORT (bit 0)".into()
        })?;
        ensure(
            e.hpi_features & 0x01 == 0 || e.out_of_interrupt_time >= 1,
            "ext_csd.out_of_interrupt_time",
            || {
                "0 (not defined) while HPI is supported; hosts use it as the HPI busy time-out (× 10 ms)".into()
            },
        )?;
        only_bits(
            e.bkops_support,
            0x01,
            "ext_csd.bkops_support",
            "bit 0 (SUPPORTED)",
        )?;
        for (field, value) in [
            ("ext_csd.max_packed_writes", e.max_packed_writes),
            ("ext_csd.max_packed_reads", e.max_packed_reads),
        ] {
            ensure(value <= MAX_PACKED_ENTRIES, field, || {
                format!(
                    "{value} is above {MAX_PACKED_ENTRIES}: a 512-byte packed header holds at most 63 entries"
                )
            })?;
        }
        ensure(e.rel_wr_sec_c >= 1, "ext_csd.rel_wr_sec_c", || {
            "0: the reliable-write granularity must be at least 1 sector".into()
        })?;
        only_bits(
            e.wr_rel_param,
            0x05,
            "ext_csd.wr_rel_param",
            "bits 0 and 2 (HS_CTRL_REL, EN_REL_WR; EN_RPMB_REL_WR bit 4 is [5.1])",
        )?;

        // Erase family.
        ensure(e.erased_mem_cont <= 1, "ext_csd.erased_mem_cont", || {
            format!(
                "{} is neither 0 (erased reads 0x00) nor 1 (erased reads 0xFF)",
                e.erased_mem_cont
            )
        })?;
        only_bits(
            e.sec_feature_support,
            0x55,
            "ext_csd.sec_feature_support",
            "bits 0, 2, 4, 6 (SECURE_ER_EN, SEC_BD_BLK_EN, SEC_GB_CL_EN, SEC_SANITIZE)",
        )?;
        ensure(
            e.hc_erase_grp_size == 0 || e.erase_timeout_mult >= 1,
            "ext_csd.erase_timeout_mult",
            || {
                "0 (not defined) although HC erase groups exist; the erase time-out is 300 ms × value per group".into()
            },
        )?;
        ensure(
            e.sec_feature_support & 0x10 == 0 || e.trim_mult >= 1,
            "ext_csd.trim_mult",
            || {
                "0 although trim is supported (SEC_GB_CL_EN); the trim time-out is 300 ms × value per group".into()
            },
        )?;
        ensure(
            e.sec_feature_support & 0x01 == 0 || e.sec_erase_mult >= 1,
            "ext_csd.sec_erase_mult",
            || "0 although secure erase is supported (SECURE_ER_EN)".into(),
        )?;
        ensure(
            e.sec_feature_support & 0x11 != 0x11 || e.sec_trim_mult >= 1,
            "ext_csd.sec_trim_mult",
            || "0 although secure trim is supported (SECURE_ER_EN and SEC_GB_CL_EN)".into(),
        )?;

        // Partitioning.
        only_bits(
            e.partitioning_support,
            0x07,
            "ext_csd.partitioning_support",
            "bits 0-2 (PARTITIONING_EN, ENH_ATTRIBUTE_EN, EXT_ATTRIBUTE_EN)",
        )?;
        ensure(
            e.partitioning_support & 0x06 == 0 || e.partitioning_support & 0x01 != 0,
            "ext_csd.partitioning_support",
            || {
                format!(
                    "{:#04x} sets attribute bits without PARTITIONING_EN (bit 0); attributes are \
                     only configured while partitioning",
                    e.partitioning_support
                )
            },
        )?;
        ensure(
            e.max_enh_size_mult <= MAX_3_BYTES,
            "ext_csd.max_enh_size_mult",
            || format!("{:#x} does not fit the 3-byte field", e.max_enh_size_mult),
        )?;
        ensure(
            e.max_enh_size_mult == 0 || e.partitioning_support & 0x02 != 0,
            "ext_csd.max_enh_size_mult",
            || {
                format!(
                    "{} but partitioning_support lacks ENH_ATTRIBUTE_EN (bit 1): there is no \
                     enhanced area to bound",
                    e.max_enh_size_mult
                )
            },
        )?;
        only_bits(
            e.ext_support,
            0x03,
            "ext_csd.ext_support",
            "bits 0-1 (system code, non-persistent)",
        )?;
        ensure(
            e.ext_support == 0 || e.partitioning_support & 0x04 != 0,
            "ext_csd.ext_support",
            || "extended partition types need EXT_ATTRIBUTE_EN (partitioning_support bit 2)".into(),
        )?;

        // Boot configuration.
        only_bits(
            e.partition_config,
            0x78,
            "ext_csd.partition_config",
            "bits 3-6 (BOOT_PARTITION_ENABLE, BOOT_ACK; PARTITION_ACCESS is 0 at power-on)",
        )?;
        let boot_enable = (e.partition_config >> 3) & 0x07;
        ensure(
            matches!(boot_enable, 0 | 1 | 2 | 7),
            "ext_csd.partition_config",
            || {
                format!(
                    "{:#04x}: BOOT_PARTITION_ENABLE {boot_enable} is reserved (0 none, 1 boot 1, \
                     2 boot 2, 7 user area)",
                    e.partition_config
                )
            },
        )?;
        ensure(
            !matches!(boot_enable, 1 | 2) || e.boot_size_mult > 0,
            "ext_csd.partition_config",
            || {
                format!(
                    "{:#04x} enables boot partition {boot_enable} but boot_size_mult is 0 (no boot partitions)",
                    e.partition_config
                )
            },
        )?;
        only_bits(
            e.boot_info,
            0x07,
            "ext_csd.boot_info",
            "bits 0-2 (ALT_BOOT_MODE, DDR_BOOT_MODE, HS_BOOT_MODE)",
        )?;

        // Small property fields.
        ensure(e.s_cmd_set == 0x01, "ext_csd.s_cmd_set", || {
            format!(
                "{:#04x}: only the standard MMC command set (0x01) is emulated",
                e.s_cmd_set
            )
        })?;
        ensure(e.acc_size <= 0x0F, "ext_csd.acc_size", || {
            format!("{:#04x}: bits 7-4 are reserved", e.acc_size)
        })?;
        for (field, value) in [
            ("ext_csd.s_c_vcc", e.s_c_vcc),
            ("ext_csd.s_c_vccq", e.s_c_vccq),
        ] {
            ensure(value <= 0x0D, field, || {
                format!("{value:#04x} is above 0x0D (1 µA × 2^value; 0 = not defined)")
            })?;
        }
        ensure(
            e.context_capabilities & 0x80 == 0,
            "ext_csd.context_capabilities",
            || format!("{:#04x}: bit 7 is reserved", e.context_capabilities),
        )?;
        only_bits(
            e.data_tag_support,
            0x01,
            "ext_csd.data_tag_support",
            "bit 0 (SYSTEM_DATA_TAG_SUPPORT)",
        )?;
        Ok(())
    }

    fn check_sizes(&self) -> Result<(), Problem> {
        let e = &self.ext_csd;
        ensure(e.sec_count > 0, "ext_csd.sec_count", || {
            "0: the user area must hold at least one sector".into()
        })?;
        ensure(self.csd_c_size().is_some(), "ext_csd.sec_count", || {
            format!(
                "{} sectors is byte-addressed (at most {BYTE_ADDRESSING_LIMIT_SECTORS} sectors = \
                 2 GiB) but cannot be written exactly as (C_SIZE+1)·2^(C_SIZE_MULT+2)·512 B with \
                 C_SIZE ≤ 4095 and C_SIZE_MULT ≤ 7 (so at most 1 GiB), and hosts size \
                 byte-addressed devices from the CSD; choose such a size or more than \
                 {BYTE_ADDRESSING_LIMIT_SECTORS} sectors",
                e.sec_count
            )
        })?;
        ensure(
            e.rpmb_size_mult <= MAX_RPMB_SIZE_MULT,
            "ext_csd.rpmb_size_mult",
            || {
                format!(
                    "{} is above the maximum {MAX_RPMB_SIZE_MULT} (16 MiB)",
                    e.rpmb_size_mult
                )
            },
        )?;
        let partitioning = e.partitioning_support & 0x01 != 0;
        ensure(
            !partitioning || e.hc_wp_grp_size >= 1,
            "ext_csd.hc_wp_grp_size",
            || {
                "0 although partitioning is supported: general purpose and enhanced areas are \
                sized in HC write-protect groups"
                    .into()
            },
        )?;
        ensure(
            (!partitioning && e.hc_wp_grp_size == 0) || e.hc_erase_grp_size >= 1,
            "ext_csd.hc_erase_grp_size",
            || {
                "0 although partitioning or HC write protection is used: both are sized in \
                HC erase groups"
                    .into()
            },
        )?;
        // A user area that ends inside an erase group would leave a group that cannot be
        // erased whole, and general purpose partitions are carved from it in whole WP groups.
        // Without HC erase groups (HC_ERASE_GRP_SIZE 0) there is nothing to align to.
        let group = self.hc_erase_group_sectors();
        ensure(
            group == 0 || u64::from(e.sec_count) % group == 0,
            "ext_csd.sec_count",
            || {
                format!(
                    "{} sectors is not a multiple of the HC erase group ({} sectors = {} KiB)",
                    e.sec_count,
                    group,
                    group / 2
                )
            },
        )?;
        let max_enhanced = u64::from(e.max_enh_size_mult) * self.hc_wp_group_sectors();
        ensure(
            max_enhanced <= u64::from(e.sec_count),
            "ext_csd.max_enh_size_mult",
            || {
                format!(
                    "{} HC WP groups ({} sectors) exceed the user area ({} sectors)",
                    e.max_enh_size_mult, max_enhanced, e.sec_count
                )
            },
        )?;
        ensure(e.cache_size % 4 == 0, "ext_csd.cache_size", || {
            format!(
                "{} kibibits is not a whole number of 512-byte blocks (use a multiple of 4)",
                e.cache_size
            )
        })
    }

    /// Busy times must stay within the limits the EXT_CSD advertises, or a host that
    /// trusts them times the card out; a flash model's geometry must also hang together.
    fn check_timing(&self) -> Result<(), Problem> {
        match &self.timing {
            TimingModel::Constant(t) => self.check_constant_timing(t),
            TimingModel::Flash(f) => self.check_flash_timing(f),
        }
    }

    /// A busy time against an EXT_CSD limit.
    fn limit(field: &'static str, cost: u64, limit_ns: u64, what: &str) -> Result<(), Problem> {
        ensure(cost <= limit_ns, field, || {
            format!(
                "{cost} ns ({}) exceeds the {} the device advertises in {what}; a host \
                 would time the operation out",
                ms(cost),
                ms(limit_ns)
            )
        })
    }

    /// The limits every model's CMD6, HPI, sleep and erase times must keep.
    fn check_busy_limits(&self, f: &BusyFields) -> Result<(), Problem> {
        let e = &self.ext_csd;
        let cmd6_ns = u64::from(e.generic_cmd6_time) * 10 * MS;
        Self::limit(f.switch.0, f.switch.1, cmd6_ns, "GENERIC_CMD6_TIME")?;
        if e.partition_switch_time > 0 {
            let ns = u64::from(e.partition_switch_time) * 10 * MS;
            Self::limit(
                f.partition_switch.0,
                f.partition_switch.1,
                ns,
                "PARTITION_SWITCH_TIME",
            )?;
        } else {
            Self::limit(
                f.partition_switch.0,
                f.partition_switch.1,
                cmd6_ns,
                "GENERIC_CMD6_TIME (PARTITION_SWITCH_TIME is 0)",
            )?;
        }
        if e.hpi_features & 0x01 != 0 {
            let ns = u64::from(e.out_of_interrupt_time) * 10 * MS;
            Self::limit(f.hpi_exit.0, f.hpi_exit.1, ns, "OUT_OF_INTERRUPT_TIME")?;
        }
        if (1..=MAX_S_A_TIMEOUT).contains(&e.s_a_timeout) {
            let ns = 100u64 << e.s_a_timeout;
            Self::limit(f.sleep_awake.0, f.sleep_awake.1, ns, "S_A_TIMEOUT")?;
        }
        if e.hc_erase_grp_size > 0 && e.erase_timeout_mult > 0 {
            let ns = u64::from(e.erase_timeout_mult) * 300 * MS;
            Self::limit(f.erase_group.0, f.erase_group.1, ns, "ERASE_TIMEOUT_MULT")?;
        }
        if e.trim_mult > 0 {
            let ns = u64::from(e.trim_mult) * 300 * MS;
            Self::limit(f.erase_group.0, f.erase_group.1, ns, "TRIM_MULT")?;
        }
        if let Some((field, ns)) = f.power_off {
            if e.power_off_long_time > 0 {
                let limit = u64::from(e.power_off_long_time) * 10 * MS;
                Self::limit(field, ns, limit, "POWER_OFF_LONG_TIME")?;
            }
        }
        Ok(())
    }

    fn check_bkops_levels(field: &'static str, levels: &[u64; 3]) -> Result<(), Problem> {
        let nonzero: Vec<u64> = levels.iter().copied().filter(|&n| n != 0).collect();
        ensure(nonzero.windows(2).all(|w| w[0] <= w[1]), field, || {
            format!("{levels:?}: the non-zero thresholds for levels 1, 2, 3 must not decrease")
        })
    }

    fn check_constant_timing(&self, t: &ConstantTimingModel) -> Result<(), Problem> {
        Self::check_bkops_levels("timing.bkops_level_ns", &t.bkops_level_ns)?;
        self.check_busy_limits(&BusyFields {
            switch: ("timing.switch_ns", t.switch_ns),
            partition_switch: ("timing.partition_switch_ns", t.partition_switch_ns),
            hpi_exit: ("timing.hpi_exit_ns", t.hpi_exit_ns),
            sleep_awake: ("timing.sleep_awake_ns", t.sleep_awake_ns),
            erase_group: ("timing.erase_group_ns", t.erase_group_ns),
            power_off: None,
        })
    }

    fn check_flash_timing(&self, f: &FlashTimingModel) -> Result<(), Problem> {
        let c = &f.controller;
        self.check_busy_limits(&BusyFields {
            switch: ("timing.controller.switch_ns", c.switch_ns),
            partition_switch: (
                "timing.controller.partition_switch_ns",
                c.partition_switch_ns,
            ),
            hpi_exit: ("timing.controller.hpi_exit_ns", c.hpi_exit_ns),
            sleep_awake: ("timing.controller.sleep_awake_ns", c.sleep_awake_ns),
            erase_group: ("timing.erase.group_ns", f.erase.group_ns),
            power_off: Some(("timing.controller.power_off_ns", c.power_off_ns)),
        })?;
        Self::check_bkops_levels("timing.bkops.level_ns", &f.bkops.level_ns)?;
        let l3 = f.bkops.level_ns[2];
        ensure(
            l3 == 0 || f.bkops.foreground_target_ns < l3,
            "timing.bkops.foreground_target_ns",
            || {
                format!(
                    "{} is not below the level-3 threshold {l3}: foreground collection would \
                     never bring the debt out of the critical level",
                    f.bkops.foreground_target_ns
                )
            },
        )?;

        let n = &f.nand;
        ensure(
            n.page_bytes.is_power_of_two() && (512..=65536).contains(&n.page_bytes),
            "timing.nand.page_bytes",
            || format!("{} is not a power of two from 512 to 65536", n.page_bytes),
        )?;
        ensure((1..=8).contains(&n.planes), "timing.nand.planes", || {
            format!("{} is not 1..=8", n.planes)
        })?;
        ensure((1..=16).contains(&n.dies), "timing.nand.dies", || {
            format!("{} is not 1..=16", n.dies)
        })?;
        ensure(
            (1..=4096).contains(&n.block_pages),
            "timing.nand.block_pages",
            || format!("{} is not 1..=4096", n.block_pages),
        )?;
        ensure(
            n.read_page_slow_ns == 0 || n.read_page_slow_ns >= n.read_page_ns,
            "timing.nand.read_page_slow_ns",
            || {
                format!(
                    "{} is below read_page_ns {}: the slow page of an MLC pair is not faster",
                    n.read_page_slow_ns, n.read_page_ns
                )
            },
        )?;
        ensure(
            n.program_page_slow_ns == 0 || n.program_page_slow_ns >= n.program_page_ns,
            "timing.nand.program_page_slow_ns",
            || {
                format!(
                    "{} is below program_page_ns {}: the slow page of an MLC pair is not faster",
                    n.program_page_slow_ns, n.program_page_ns
                )
            },
        )?;
        ensure(
            n.jitter_permille <= 500,
            "timing.nand.jitter_permille",
            || format!("{} is above 500 (±50%)", n.jitter_permille),
        )?;

        let t = &f.ftl;
        let wu = n.page_bytes * n.planes * n.dies;
        ensure(
            t.allocation_unit_bytes >= wu && t.allocation_unit_bytes % wu == 0,
            "timing.ftl.allocation_unit_bytes",
            || {
                format!(
                    "{} is not a whole number of write units of {wu} bytes \
                     (nand.page_bytes × planes × dies)",
                    t.allocation_unit_bytes
                )
            },
        )?;
        ensure(
            t.allocation_unit_bytes <= self.user_bytes(),
            "timing.ftl.allocation_unit_bytes",
            || {
                format!(
                    "{} is larger than the {}-byte user area",
                    t.allocation_unit_bytes,
                    self.user_bytes()
                )
            },
        )?;
        let aus = self.user_bytes().div_ceil(t.allocation_unit_bytes);
        ensure(
            aus + t.spare_aus < u64::from(u32::MAX),
            "timing.ftl.spare_aus",
            || format!("{} AUs plus {} spare do not fit 32 bits", aus, t.spare_aus),
        )?;
        ensure(
            (1..=64).contains(&t.open_aus_linear),
            "timing.ftl.open_aus_linear",
            || format!("{} is not 1..=64", t.open_aus_linear),
        )?;
        ensure(
            t.open_aus_random <= t.open_aus_linear,
            "timing.ftl.open_aus_random",
            || {
                format!(
                    "{} is above open_aus_linear {}: AUs in random use are some of the open AUs",
                    t.open_aus_random, t.open_aus_linear
                )
            },
        )?;
        ensure(
            t.random_writes == RandomWrites::None || t.open_aus_random >= 1,
            "timing.ftl.open_aus_random",
            || "0, but random_writes = \"write_unit\" needs at least one AU in random use".into(),
        )?;
        if let Some(a) = &t.buffer_a {
            ensure(a.log_pages >= 1, "timing.ftl.buffer_a.log_pages", || {
                "0: the small-write log must hold at least one page".into()
            })?;
            ensure(
                a.rule != BufferARule::RunLength
                    || (a.run_limit_bytes >= 512 && a.run_limit_bytes % 512 == 0),
                "timing.ftl.buffer_a.run_limit_bytes",
                || {
                    format!(
                        "{} with rule = \"run_length\": give a whole number of 512-byte sectors",
                        a.run_limit_bytes
                    )
                },
            )?;
        }
        if let Some(c) = &t.slc_cache {
            ensure(
                c.max_write_bytes >= 512 && c.max_write_bytes % 512 == 0,
                "timing.ftl.slc_cache.max_write_bytes",
                || {
                    format!(
                        "{} is not a whole number of 512-byte sectors",
                        c.max_write_bytes
                    )
                },
            )?;
        }
        if t.sub_page_buffer.is_some() {
            ensure(
                t.coalesce_sub_page && t.slc_cache.is_some(),
                "timing.ftl.sub_page_buffer",
                || {
                    "needs coalesce_sub_page = true and an [timing.ftl.slc_cache]: it prices the \
                     coalescing buffer, whose closed pages join the SLC cache"
                        .into()
                },
            )?;
        }
        if let Some(r) = &t.special_region {
            ensure(
                r.length_bytes > 0
                    && r.offset_bytes % 512 == 0
                    && r.length_bytes % 512 == 0
                    && r.offset_bytes.saturating_add(r.length_bytes) <= self.user_bytes(),
                "timing.ftl.special_region",
                || {
                    format!(
                        "offset {} + length {} is not a non-empty, sector-aligned range inside \
                         the {}-byte user area",
                        r.offset_bytes,
                        r.length_bytes,
                        self.user_bytes()
                    )
                },
            )?;
        }
        Ok(())
    }
}

/// The model keys holding the busy times that EXT_CSD limits bound, and their values.
struct BusyFields {
    switch: (&'static str, u64),
    partition_switch: (&'static str, u64),
    hpi_exit: (&'static str, u64),
    sleep_awake: (&'static str, u64),
    erase_group: (&'static str, u64),
    power_off: Option<(&'static str, u64)>,
}

impl CidModel {
    /// PRV as its BCD byte ("6.2" → 0x62), or `None` if not "n.m" with single digits.
    pub fn prv_bcd(&self) -> Option<u8> {
        let (n, m) = self.prv.split_once('.')?;
        let digit = |s: &str| match s.as_bytes() {
            [d @ b'0'..=b'9'] => Some(d - b'0'),
            _ => None,
        };
        Some(digit(n)? << 4 | digit(m)?)
    }

    /// MDT as (year, month) from "YYYY-MM", or `None` if malformed or the month is not 1..=12.
    pub fn mdt_year_month(&self) -> Option<(u16, u8)> {
        let (y, m) = self.mdt.split_once('-')?;
        if y.len() != 4 || m.len() != 2 || !(y.bytes().chain(m.bytes())).all(|c| c.is_ascii_digit())
        {
            return None;
        }
        let year: u16 = y.parse().ok()?;
        let month: u8 = m.parse().ok()?;
        (1..=12).contains(&month).then_some((year, month))
    }

    /// The MDT byte (month in [7:4], year code in [3:0]) as encoded for `ext_csd_rev`, or
    /// `None` if the date is malformed or its year has no code.
    pub fn mdt_byte(&self, ext_csd_rev: u8) -> Option<u8> {
        let (year, month) = self.mdt_year_month()?;
        Some(month << 4 | mdt_year_code(year, ext_csd_rev)?)
    }
}

/// MDT year code: base 1997; with EXT_CSD_REV > 4 codes 0–12 mean 2013–2025 and 13–15 mean
/// 2010–2012 (facts §5.1; Linux adds 16 to years before 2010 when REV ≥ 5).
fn mdt_year_code(year: u16, ext_csd_rev: u8) -> Option<u8> {
    let code = if ext_csd_rev > 4 {
        match year {
            2013..=2025 => year - 2013,
            2010..=2012 => year - 1997,
            _ => return None,
        }
    } else {
        match year {
            1997..=2012 => year - 1997,
            _ => return None,
        }
    };
    Some(code as u8)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A model key and an edit that makes a valid model break a rule about it.
    type Breakage = (&'static str, fn(&mut DeviceModel));

    fn generic() -> DeviceModel {
        DeviceModel::load("generic-emmc45").unwrap()
    }

    fn generic_text() -> &'static str {
        super::super::BUILTIN_MODELS
            .iter()
            .find(|(n, _)| *n == "generic-emmc45")
            .unwrap()
            .1
    }

    /// Validate `model` and return the error message, which must name `field`.
    fn rejects(model: &DeviceModel, field: &str) -> String {
        let err = model.validate().expect_err("model should be rejected");
        match &err {
            ModelError::Invalid { field: f, .. } => assert_eq!(*f, field, "{err}"),
            other => panic!("unexpected error {other}"),
        }
        let message = err.to_string();
        assert!(message.contains(field), "{message}");
        message
    }

    #[test]
    fn generic_model_is_valid() {
        generic().validate().unwrap();
    }

    #[test]
    fn unknown_field_is_rejected_naming_it() {
        let text = generic_text().replace("[ext_csd]\n", "[ext_csd]\nsec_counts = 5\n");
        let err = DeviceModel::from_toml_str("test", &text).unwrap_err();
        assert!(matches!(err, ModelError::Parse { .. }), "{err}");
        assert!(err.to_string().contains("sec_counts"), "{err}");
    }

    #[test]
    fn out_of_range_rpmb_size_mult_is_rejected_naming_it() {
        let text = generic_text().replace("rpmb_size_mult = 32", "rpmb_size_mult = 200");
        let err = DeviceModel::from_toml_str("test", &text).unwrap_err();
        assert_eq!(
            err.to_string(),
            "device model \"test\": ext_csd.rpmb_size_mult: 200 is above the maximum 128 (16 MiB)"
        );
    }

    #[test]
    fn value_too_wide_for_its_toml_type_is_rejected_naming_it() {
        let text = generic_text().replace("boot_size_mult = 32", "boot_size_mult = 256");
        let err = DeviceModel::from_toml_str("test", &text).unwrap_err();
        assert!(err.to_string().contains("boot_size_mult"), "{err}");
    }

    #[test]
    fn inconsistent_byte_addressed_size_is_rejected_naming_it() {
        let mut m = generic();
        // 1.5 GiB: byte-addressed, but above what C_SIZE/C_SIZE_MULT can express at 512 B.
        m.ext_csd.sec_count = 3 * 1024 * 1024;
        let message = rejects(&m, "ext_csd.sec_count");
        assert!(message.contains("C_SIZE"), "{message}");
        // Not a power-of-two multiple that fits: 4097 × 4 sectors.
        m.ext_csd.sec_count = 4097 * 4;
        m.ext_csd.hc_erase_grp_size = 0;
        m.ext_csd.hc_wp_grp_size = 0;
        m.ext_csd.partitioning_support = 0;
        m.ext_csd.max_enh_size_mult = 0;
        rejects(&m, "ext_csd.sec_count");
    }

    #[test]
    fn byte_addressed_sizes_that_the_csd_can_express_are_accepted() {
        let mut m = generic();
        m.ext_csd.sec_count = 2 * 1024 * 1024; // exactly 1 GiB
        m.ext_csd.max_enh_size_mult = 0;
        m.validate().unwrap();
        assert_eq!(m.csd_c_size(), Some((4095, 7)));
        m.ext_csd.sec_count = 256 * 1024; // 128 MiB
        assert_eq!(m.csd_c_size(), Some((4095, 4)));
        m.validate().unwrap();
        m.ext_csd.sec_count = 4_194_305; // just above 2 GiB: sector addressing
        assert_eq!(m.csd_c_size(), Some((0xFFF, 7)));
    }

    #[test]
    fn user_area_must_be_whole_hc_erase_groups() {
        let mut m = generic();
        m.ext_csd.sec_count += 512;
        let message = rejects(&m, "ext_csd.sec_count");
        assert!(message.contains("HC erase group"), "{message}");
    }

    #[test]
    fn cid_text_fields_are_checked() {
        let mut m = generic();
        m.cid.pnm = "EMU45".into();
        rejects(&m, "cid.pnm");
        m.cid.pnm = "EMU45\u{e9}".into();
        rejects(&m, "cid.pnm");
        let mut m = generic();
        m.cid.prv = "1.10".into();
        rejects(&m, "cid.prv");
        let mut m = generic();
        m.cid.mdt = "2024-13".into();
        rejects(&m, "cid.mdt");
        m.cid.mdt = "2026-01".into();
        let message = rejects(&m, "cid.mdt");
        assert!(message.contains("2010..=2025"), "{message}");
        m.cid.mdt = "2010-12".into();
        m.validate().unwrap();
    }

    #[test]
    fn csd_fields_are_checked_against_their_widths() {
        let cases: [Breakage; 8] = [
            ("csd.taac", |m| m.csd.taac = 0x06),
            ("csd.tran_speed", |m| m.csd.tran_speed = 0x34),
            ("csd.ccc", |m| m.csd.ccc = 0x10F5),
            ("csd.ccc", |m| m.csd.ccc = 0x0F4),
            ("csd.erase_grp_size", |m| m.csd.erase_grp_size = 32),
            ("csd.wp_grp_size", |m| m.csd.wp_grp_size = 32),
            ("csd.r2w_factor", |m| m.csd.r2w_factor = 8),
            ("csd.vdd_w_curr_max", |m| m.csd.vdd_w_curr_max = 8),
        ];
        for (field, break_it) in cases {
            let mut m = generic();
            break_it(&mut m);
            rejects(&m, field);
        }
    }

    #[test]
    fn ext_csd_property_rules() {
        let cases: [Breakage; 22] = [
            ("ext_csd.ext_csd_rev", |m| m.ext_csd.ext_csd_rev = 7),
            ("ext_csd.device_type", |m| m.ext_csd.device_type = 0x57),
            ("ext_csd.device_type", |m| m.ext_csd.device_type = 0x02),
            ("ext_csd.device_type", |m| m.ext_csd.device_type = 0x15),
            ("ext_csd.driver_strength", |m| {
                m.ext_csd.driver_strength = 0x02
            }),
            ("ext_csd.s_a_timeout", |m| m.ext_csd.s_a_timeout = 0),
            ("ext_csd.s_a_timeout", |m| m.ext_csd.s_a_timeout = 0x18),
            ("ext_csd.hpi_features", |m| m.ext_csd.hpi_features = 0x02),
            ("ext_csd.hpi_features", |m| m.ext_csd.hpi_features = 0x05),
            ("ext_csd.max_packed_writes", |m| {
                m.ext_csd.max_packed_writes = 64
            }),
            ("ext_csd.max_packed_reads", |m| {
                m.ext_csd.max_packed_reads = 64
            }),
            ("ext_csd.rel_wr_sec_c", |m| m.ext_csd.rel_wr_sec_c = 0),
            ("ext_csd.wr_rel_param", |m| m.ext_csd.wr_rel_param = 0x15),
            ("ext_csd.erased_mem_cont", |m| m.ext_csd.erased_mem_cont = 2),
            ("ext_csd.partitioning_support", |m| {
                m.ext_csd.partitioning_support = 0x0F
            }),
            ("ext_csd.partitioning_support", |m| {
                m.ext_csd.partitioning_support = 0x06
            }),
            ("ext_csd.cache_size", |m| m.ext_csd.cache_size = 4094),
            ("ext_csd.partition_config", |m| {
                m.ext_csd.partition_config = 0x01
            }),
            ("ext_csd.partition_config", |m| {
                m.ext_csd.partition_config = 3 << 3
            }),
            ("ext_csd.sec_feature_support", |m| {
                m.ext_csd.sec_feature_support = 0x02
            }),
            ("ext_csd.s_cmd_set", |m| m.ext_csd.s_cmd_set = 0x03),
            ("ext_csd.generic_cmd6_time", |m| {
                m.ext_csd.generic_cmd6_time = 0
            }),
        ];
        for (field, break_it) in cases {
            let mut m = generic();
            break_it(&mut m);
            rejects(&m, field);
        }
    }

    #[test]
    fn group_sizes_are_required_where_used() {
        let mut m = generic();
        m.ext_csd.hc_wp_grp_size = 0;
        rejects(&m, "ext_csd.hc_wp_grp_size");
        let mut m = generic();
        m.ext_csd.hc_erase_grp_size = 0;
        rejects(&m, "ext_csd.hc_erase_grp_size");
        // Without partitioning and HC write protection neither is needed.
        m.ext_csd.hc_wp_grp_size = 0;
        m.ext_csd.partitioning_support = 0;
        m.ext_csd.max_enh_size_mult = 0;
        m.validate().unwrap();
    }

    #[test]
    fn boot_enable_needs_boot_partitions() {
        let mut m = generic();
        m.ext_csd.partition_config = 1 << 3 | 1 << 6;
        m.validate().unwrap();
        m.ext_csd.boot_size_mult = 0;
        rejects(&m, "ext_csd.partition_config");
        m.ext_csd.partition_config = 7 << 3;
        m.validate().unwrap();
    }

    #[test]
    fn enhanced_area_rules() {
        let mut m = generic();
        m.ext_csd.partitioning_support = 0x01;
        rejects(&m, "ext_csd.max_enh_size_mult");
        let mut m = generic();
        m.ext_csd.max_enh_size_mult = 14_913; // one HC WP group more than the user area
        rejects(&m, "ext_csd.max_enh_size_mult");
    }

    #[test]
    fn timing_rules() {
        let mut m = generic();
        m.timing.constant_mut().bkops_level_ns = [50, 0, 40];
        rejects(&m, "timing.bkops_level_ns");
        m.timing.constant_mut().bkops_level_ns = [0, 50, 50];
        m.validate().unwrap();
        let mut m = generic();
        m.timing.constant_mut().sleep_awake_ns = 7_000_000; // S_A_TIMEOUT 0x10 ≈ 6.55 ms
        rejects(&m, "timing.sleep_awake_ns");
        let mut m = generic();
        m.timing.constant_mut().switch_ns = 100 * MS + 1;
        rejects(&m, "timing.switch_ns");
        let mut m = generic();
        m.timing.constant_mut().hpi_exit_ns = 101 * MS;
        rejects(&m, "timing.hpi_exit_ns");
        let mut m = generic();
        m.timing.constant_mut().erase_group_ns = 301 * MS;
        rejects(&m, "timing.erase_group_ns");
    }

    fn toshiba() -> DeviceModel {
        DeviceModel::load("toshiba-mmc32g").unwrap()
    }

    #[test]
    fn flash_timing_rules_name_their_field() {
        toshiba().validate().unwrap();
        type FlashBreakage = (&'static str, fn(&mut FlashTimingModel));
        let cases: [FlashBreakage; 18] = [
            ("timing.nand.page_bytes", |f| f.nand.page_bytes = 3000),
            ("timing.nand.page_bytes", |f| f.nand.page_bytes = 256),
            ("timing.nand.planes", |f| f.nand.planes = 0),
            ("timing.nand.dies", |f| f.nand.dies = 17),
            ("timing.nand.block_pages", |f| f.nand.block_pages = 0),
            ("timing.nand.read_page_slow_ns", |f| {
                f.nand.read_page_slow_ns = f.nand.read_page_ns - 1
            }),
            ("timing.nand.program_page_slow_ns", |f| {
                f.nand.program_page_slow_ns = 1
            }),
            ("timing.nand.jitter_permille", |f| {
                f.nand.jitter_permille = 501
            }),
            ("timing.ftl.allocation_unit_bytes", |f| {
                f.ftl.allocation_unit_bytes = 3 << 20 | 4096
            }),
            ("timing.ftl.open_aus_linear", |f| f.ftl.open_aus_linear = 0),
            ("timing.ftl.open_aus_random", |f| f.ftl.open_aus_random = 8),
            ("timing.ftl.open_aus_random", |f| f.ftl.open_aus_random = 0),
            ("timing.ftl.buffer_a.log_pages", |f| {
                f.ftl.buffer_a.as_mut().unwrap().log_pages = 0
            }),
            ("timing.controller.sleep_awake_ns", |f| {
                f.controller.sleep_awake_ns = 7_000_000
            }),
            ("timing.controller.power_off_ns", |f| {
                f.controller.power_off_ns = 601 * MS
            }),
            ("timing.erase.group_ns", |f| f.erase.group_ns = 301 * MS),
            ("timing.bkops.level_ns", |f| f.bkops.level_ns = [3, 2, 1]),
            ("timing.bkops.foreground_target_ns", |f| {
                f.bkops.foreground_target_ns = f.bkops.level_ns[2]
            }),
        ];
        for (field, break_it) in cases {
            let mut m = toshiba();
            break_it(m.timing.flash_mut());
            rejects(&m, field);
        }
        let mut m = toshiba();
        let b = m.timing.flash_mut().ftl.buffer_a.as_mut().unwrap();
        b.rule = BufferARule::RunLength;
        b.run_limit_bytes = 1000;
        rejects(&m, "timing.ftl.buffer_a.run_limit_bytes");
        let mut m = DeviceModel::load("sandisk-sem32g").unwrap();
        m.timing
            .flash_mut()
            .ftl
            .slc_cache
            .as_mut()
            .unwrap()
            .max_write_bytes = 100;
        rejects(&m, "timing.ftl.slc_cache.max_write_bytes");
        let mut m = toshiba();
        m.timing.flash_mut().ftl.sub_page_buffer = Some(crate::model::SubPageBufferModel {
            program_ns: 1,
            program_ns_per_kib: 1,
            close_ns: 1,
        });
        rejects(&m, "timing.ftl.sub_page_buffer");
        let mut m = toshiba();
        m.timing.flash_mut().ftl.special_region = Some(crate::model::SpecialRegionModel {
            offset_bytes: m.user_bytes() - 512,
            length_bytes: 1024,
        });
        rejects(&m, "timing.ftl.special_region");
    }

    #[test]
    fn host_queue_limits_must_fit_a_cmd23_request() {
        let base = DeviceModel::load("msm-emmc45-sdr50").unwrap();
        type Break = fn(&mut crate::model::HostProfile);
        let cases: Vec<(&str, Break)> = vec![
            ("host.max_sectors_kb", |h| h.max_sectors_kb = 0),
            ("host.max_sectors_kb", |h| h.max_sectors_kb = 40_000),
            ("host.max_hw_sectors_kb", |h| {
                h.max_hw_sectors_kb = h.max_sectors_kb - 1
            }),
            ("host.max_segments", |h| h.max_segments = 0),
        ];
        for (field, break_it) in cases {
            let mut m = base.clone();
            break_it(&mut m.host);
            rejects(&m, field);
        }
    }

    #[test]
    fn timing_model_is_a_tagged_choice_with_no_unknown_keys() {
        let text = super::super::BUILTIN_MODELS
            .iter()
            .find(|(n, _)| *n == "toshiba-mmc32g")
            .unwrap()
            .1;
        let typo = text.replace("[timing.nand]\n", "[timing.nand]\npage_byte = 1\n");
        let err = DeviceModel::from_toml_str("test", &typo).unwrap_err();
        assert!(err.to_string().contains("page_byte"), "{err}");
        let unknown = text.replace("model = \"flash\"", "model = \"magnetic\"");
        let err = DeviceModel::from_toml_str("test", &unknown).unwrap_err();
        assert!(err.to_string().contains("magnetic"), "{err}");
        // Constant-cost keys are not flash keys.
        let mixed = text.replace(
            "[timing.controller]\n",
            "read_access_ns = 5\n[timing.controller]\n",
        );
        let err = DeviceModel::from_toml_str("test", &mixed).unwrap_err();
        assert!(err.to_string().contains("read_access_ns"), "{err}");
        // A [timing] without a model names what is missing.
        let untagged = generic_text().replace("model = \"constant\"", "");
        let err = DeviceModel::from_toml_str("test", &untagged).unwrap_err();
        assert!(err.to_string().contains("model"), "{err}");
    }

    #[test]
    fn prv_and_mdt_encodings() {
        let mut cid = generic().cid;
        cid.prv = "6.2".into();
        assert_eq!(cid.prv_bcd(), Some(0x62));
        cid.mdt = "2024-01".into();
        assert_eq!(cid.mdt_byte(6), Some(0x1B));
        cid.mdt = "2013-12".into();
        assert_eq!(cid.mdt_byte(6), Some(0xC0));
        cid.mdt = "2012-04".into();
        assert_eq!(cid.mdt_byte(6), Some(0x4F));
        assert_eq!(cid.mdt_byte(4), Some(0x4F));
        cid.mdt = "2000-04".into();
        assert_eq!(cid.mdt_byte(6), None);
        assert_eq!(cid.mdt_byte(4), Some(0x43));
        cid.mdt = "24-01".into();
        assert_eq!(cid.mdt_year_month(), None);
    }
}
