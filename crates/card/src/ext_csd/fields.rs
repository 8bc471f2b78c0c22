//! The EXT_CSD field table: every field an eMMC 4.5 (EXT_CSD_REV 6) device defines, with its
//! offset, size, access type and a decoder for its meaning (facts §6.1, §6.2). Bytes not in
//! the table are reserved on REV 6 (including every `[5.0]`/`[5.1]` field) and read 0.
//!
//! CMD6 uses [`field_at`] to find the field a byte belongs to, and the companion table of
//! write rules (`ext_csd/rules.rs`, keyed by the same fields) to decide what writing it
//! does; `inspect` walks [`FIELDS`] to print the register the way `mmc extcsd read` does.

use super::*;

/// Access types, named after the spec's codes (facts §6 legend).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    /// R: read only.
    R,
    /// W: one-time programmable, not readable.
    W,
    /// R/W: one-time programmable, readable.
    RW,
    /// W/E: writable many times, kept over power loss, not readable.
    WE,
    /// R/W/E: writable many times, kept over power loss, readable.
    RWE,
    /// R/W/C_P: writable only after being cleared by power loss or RST_n (not by CMD0).
    RWCP,
    /// R/W/E_P: writable many times, reset by power loss, RST_n and CMD0.
    RWEP,
    /// W/E_P: writable many times, reset by power loss, RST_n and CMD0; reads 0.
    WEP,
    /// Different bits have different types (see [`Field::access_code`]).
    Mixed,
    /// VENDOR_SPECIFIC_FIELD: behaviour defined by the vendor.
    Vendor,
}

impl Access {
    /// The spec's spelling, e.g. `R/W/E_P`.
    pub fn code(self) -> &'static str {
        match self {
            Access::R => "R",
            Access::W => "W",
            Access::RW => "R/W",
            Access::WE => "W/E",
            Access::RWE => "R/W/E",
            Access::RWCP => "R/W/C_P",
            Access::RWEP => "R/W/E_P",
            Access::WEP => "W/E_P",
            Access::Mixed => "mixed",
            Access::Vendor => "vendor",
        }
    }
}

/// One EXT_CSD field.
#[derive(Debug)]
pub struct Field {
    /// Field name as JESD84-B45 spells it.
    pub name: &'static str,
    /// First byte.
    pub offset: usize,
    /// Size in bytes; multi-byte fields are little-endian.
    pub len: usize,
    pub access: Access,
    /// Decoded meaning of the field's bytes (`len` of them, lowest offset first).
    pub describe: fn(&[u8]) -> String,
}

impl Field {
    /// One past the last byte.
    pub fn end(&self) -> usize {
        self.offset + self.len
    }

    /// Whether `offset` is one of this field's bytes.
    pub fn contains(&self, offset: usize) -> bool {
        (self.offset..self.end()).contains(&offset)
    }

    /// The field's bytes in `ext_csd`.
    pub fn bytes<'a>(&self, ext_csd: &'a [u8; EXT_CSD_LEN]) -> &'a [u8] {
        &ext_csd[self.offset..self.end()]
    }

    /// The field's value (little-endian) if it is at most 4 bytes long.
    pub fn value(&self, ext_csd: &[u8; EXT_CSD_LEN]) -> Option<u32> {
        (self.len <= 4).then(|| read_le(ext_csd, self.offset, self.len))
    }

    /// The decoded meaning of the field's bytes in `ext_csd`.
    pub fn meaning(&self, ext_csd: &[u8; EXT_CSD_LEN]) -> String {
        (self.describe)(self.bytes(ext_csd))
    }

    /// The spec's access code; for [`Access::Mixed`] fields the per-bit combination.
    pub fn access_code(&self) -> &'static str {
        match (self.access, self.offset) {
            (Access::Mixed, USER_WP) => "R/W, R/W/C_P & R/W/E_P",
            (Access::Mixed, BOOT_WP) => "R/W & R/W/C_P",
            (Access::Mixed, BOOT_CONFIG_PROT) => "R/W & R/W/C_P",
            (Access::Mixed, PARTITION_CONFIG) => "R/W/E & R/W/E_P",
            (access, _) => access.code(),
        }
    }
}

/// The field containing byte `offset`, or `None` for a reserved byte.
pub fn field_at(offset: usize) -> Option<&'static Field> {
    let i = FIELDS.partition_point(|f| f.end() <= offset);
    FIELDS.get(i).filter(|f| f.contains(offset))
}

/// The field called `name` (as the spec spells it).
pub fn field_named(name: &str) -> Option<&'static Field> {
    FIELDS.iter().find(|f| f.name == name)
}

// ---- Formatting helpers (shared with `inspect`) -----------------------------------------

/// A size in the largest binary unit that divides it exactly: "4 MiB", "7456 MiB", "1536 B".
pub(crate) fn human_bytes(bytes: u64) -> String {
    for (unit, name) in [(1u64 << 30, "GiB"), (1 << 20, "MiB"), (1 << 10, "KiB")] {
        if bytes >= unit && bytes % unit == 0 {
            return format!("{} {name}", bytes / unit);
        }
    }
    format!("{bytes} B")
}

/// A duration given in nanoseconds: "100 ms", "6.55 ms", "1 s".
pub(crate) fn human_ns(ns: u64) -> String {
    const UNITS: [(u64, &str); 3] = [(1_000_000_000, "s"), (1_000_000, "ms"), (1_000, "µs")];
    for (unit, name) in UNITS {
        if ns >= unit {
            return if ns % unit == 0 {
                format!("{} {name}", ns / unit)
            } else {
                let text = format!("{:.2}", ns as f64 / unit as f64);
                format!(
                    "{} {name}",
                    text.trim_end_matches('0').trim_end_matches('.')
                )
            };
        }
    }
    format!("{ns} ns")
}

fn le(b: &[u8]) -> u64 {
    b.iter().rev().fold(0, |acc, &x| acc << 8 | u64::from(x))
}

/// The names of the set bits, joined with " | "; undefined set bits are named by number.
fn flags(value: u64, names: &[(u32, &str)], none: &str) -> String {
    let mut parts = Vec::new();
    let mut known = 0u64;
    for &(bit, name) in names {
        known |= 1 << bit;
        if value & (1 << bit) != 0 {
            parts.push(name.to_string());
        }
    }
    for bit in 0..64 {
        if value & !known & (1 << bit) != 0 {
            parts.push(format!("reserved bit {bit}"));
        }
    }
    if parts.is_empty() {
        none.to_string()
    } else {
        parts.join(" | ")
    }
}

fn on_off(b: &[u8], on: &str, off: &str) -> String {
    let text = if b[0] & 1 != 0 { on } else { off };
    if b[0] & !1 != 0 {
        format!("{text} (reserved bits {:#04x})", b[0] & !1)
    } else {
        text.to_string()
    }
}

fn times_10ms(b: &[u8]) -> String {
    match b[0] {
        0 => "not defined".into(),
        v => human_ns(u64::from(v) * 10_000_000),
    }
}

fn times_100ms(b: &[u8]) -> String {
    match b[0] {
        0 => "not defined".into(),
        v => human_ns(u64::from(v) * 100_000_000),
    }
}

fn times_300ms(b: &[u8]) -> String {
    match b[0] {
        0 => "not defined".into(),
        v => format!("{} per erase group", human_ns(u64::from(v) * 300_000_000)),
    }
}

fn power_class(b: &[u8]) -> String {
    format!("8-bit class {}, 4-bit class {}", b[0] >> 4, b[0] & 0x0F)
}

fn min_perf(b: &[u8]) -> String {
    match b[0] {
        0 => "not defined".into(),
        v => format!("performance class {v:#04x}"),
    }
}

fn sleep_current(b: &[u8]) -> String {
    match b[0] {
        0 => "not defined".into(),
        v @ 1..=13 => format!("{} µA", 1u32 << v),
        v => format!("reserved ({v:#04x})"),
    }
}

fn sector_size(b: &[u8]) -> String {
    match b[0] {
        0 => "512 B".into(),
        1 => "4 KiB".into(),
        v => format!("reserved ({v})"),
    }
}

fn hc_wp_groups(b: &[u8]) -> String {
    format!("{} × HC write-protect group", le(b))
}

fn sectors(n: u64) -> String {
    if n == 1 {
        "1 sector".into()
    } else {
        format!("{n} sectors")
    }
}

fn plain(b: &[u8]) -> String {
    le(b).to_string()
}

fn multiplier_of_erase_timeout(b: &[u8]) -> String {
    match b[0] {
        0 => "not defined".into(),
        v => format!("300 ms × ERASE_TIMEOUT_MULT × {v} per erase group"),
    }
}

fn partition_access(v: u8) -> &'static str {
    match v & 7 {
        0 => "user area",
        1 => "boot partition 1",
        2 => "boot partition 2",
        3 => "RPMB",
        4 => "GP1",
        5 => "GP2",
        6 => "GP3",
        _ => "GP4",
    }
}

fn context_conf(b: &[u8]) -> String {
    let open: Vec<String> = b
        .iter()
        .enumerate()
        .filter(|(_, &c)| c != 0)
        .map(|(i, &c)| {
            let direction = ["closed", "write-only", "read-only", "read/write"][usize::from(c & 3)];
            let mut text = format!("context {}: {direction}", i + 1);
            if c & 0x04 != 0 {
                text += &format!(", large unit ×{}", ((c >> 3) & 7) + 1);
            }
            if c >> 6 != 0 {
                text += &format!(", reliability mode {}", c >> 6);
            }
            text
        })
        .collect();
    if open.is_empty() {
        "all 15 contexts closed".into()
    } else {
        open.join("; ")
    }
}

fn ext_partitions_attribute(b: &[u8]) -> String {
    let v = le(b);
    if v == 0 {
        return "all general purpose partitions default".into();
    }
    (0..4)
        .map(|gp| {
            let kind = match (v >> (4 * gp)) & 0xF {
                0 => "default".to_string(),
                1 => "system code".to_string(),
                2 => "non-persistent".to_string(),
                k => format!("reserved ({k})"),
            };
            format!("GP{}: {kind}", gp + 1)
        })
        .collect::<Vec<_>>()
        .join(", ")
}

fn gp_size_mult(b: &[u8]) -> String {
    let sizes: Vec<String> = b
        .chunks(3)
        .enumerate()
        .map(|(i, c)| format!("GP{} {}", i + 1, le(c)))
        .collect();
    format!("{} (× HC write-protect group)", sizes.join(", "))
}

fn periodic_wakeup(b: &[u8]) -> String {
    let period = b[0] & 0x1F;
    match b[0] >> 5 {
        0 => "no periodic wake-up".into(),
        unit @ 1..=5 => {
            let unit = ["months", "weeks", "days", "hours", "minutes"][usize::from(unit - 1)];
            format!("every {period} {unit}")
        }
        unit => format!("reserved unit {unit}"),
    }
}

fn boot_wp_status(b: &[u8]) -> String {
    let state = |s: u8| match s & 3 {
        0 => "not protected",
        1 => "power-on protected",
        2 => "permanently protected",
        _ => "reserved",
    };
    format!("boot 1 {}, boot 2 {}", state(b[0]), state(b[0] >> 2))
}

fn boot_bus_conditions(b: &[u8]) -> String {
    let v = b[0];
    let width = match v & 3 {
        0 => "x1 (SDR) / x4 (DDR)",
        1 => "x4",
        2 => "x8",
        _ => "reserved width",
    };
    let mode = match (v >> 3) & 3 {
        0 => "SDR backward-compatible",
        1 => "SDR high speed",
        2 => "DDR",
        _ => "reserved mode",
    };
    let after = if v & 0x04 != 0 {
        "retained after boot"
    } else {
        "reset to x1 SDR after boot"
    };
    format!("{width}, {mode}, {after}")
}

fn partition_config(b: &[u8]) -> String {
    let v = b[0];
    let boot = match (v >> 3) & 7 {
        0 => "not boot enabled".to_string(),
        1 => "boot from boot partition 1".to_string(),
        2 => "boot from boot partition 2".to_string(),
        7 => "boot from user area".to_string(),
        n => format!("reserved BOOT_PARTITION_ENABLE {n}"),
    };
    let ack = if v & 0x40 != 0 { ", BOOT_ACK" } else { "" };
    let reserved = if v & 0x80 != 0 {
        ", reserved bit 7"
    } else {
        ""
    };
    format!("access {}, {boot}{ack}{reserved}", partition_access(v))
}

fn bus_width(b: &[u8]) -> String {
    match b[0] {
        0 => "1-bit".into(),
        1 => "4-bit SDR".into(),
        2 => "8-bit SDR".into(),
        5 => "4-bit DDR".into(),
        6 => "8-bit DDR".into(),
        v => format!("reserved ({v:#04x})"),
    }
}

fn hs_timing(b: &[u8]) -> String {
    let timing = match b[0] & 0x0F {
        0 => "backward-compatible".to_string(),
        1 => "high speed".to_string(),
        2 => "HS200".to_string(),
        3 => "HS400 [5.0]".to_string(),
        t => format!("reserved timing {t}"),
    };
    format!("{timing}, driver type {}", b[0] >> 4)
}

fn ext_csd_rev(b: &[u8]) -> String {
    match b[0] {
        0 => "MMC 4.0".into(),
        1 => "MMC 4.1".into(),
        2 => "MMC 4.2".into(),
        3 => "MMC 4.3".into(),
        4 => "obsolete".into(),
        5 => "eMMC 4.41".into(),
        6 => "eMMC 4.5/4.51".into(),
        7 => "eMMC 5.0/5.01".into(),
        8 => "eMMC 5.1".into(),
        v => format!("reserved ({v})"),
    }
}

fn device_type(b: &[u8]) -> String {
    flags(
        u64::from(b[0]),
        &[
            (7, "HS400 1.2V [5.0]"),
            (6, "HS400 1.8V [5.0]"),
            (5, "HS200 1.2V"),
            (4, "HS200 1.8V"),
            (3, "DDR52 1.2V"),
            (2, "DDR52 1.8/3V"),
            (1, "HS52"),
            (0, "HS26"),
        ],
        "backward-compatible timing only",
    )
}

fn driver_strength(b: &[u8]) -> String {
    let types: Vec<String> = (0..8)
        .filter(|t| b[0] & (1 << t) != 0)
        .map(|t| t.to_string())
        .collect();
    if types.is_empty() {
        "none listed (type 0 assumed)".into()
    } else {
        format!("driver type(s) {}", types.join(", "))
    }
}

fn sec_count(b: &[u8]) -> String {
    let sectors = le(b);
    let addressing = if sectors > 4_194_304 {
        "sector addressing"
    } else {
        "byte addressing"
    };
    format!(
        "{sectors} sectors = {}, {addressing}",
        human_bytes(sectors * 512)
    )
}

fn s_a_timeout(b: &[u8]) -> String {
    match b[0] {
        0 => "not defined".into(),
        v @ 1..=0x17 => human_ns(100u64 << v),
        v => format!("reserved ({v:#04x})"),
    }
}

fn acc_size(b: &[u8]) -> String {
    match b[0] & 0x0F {
        0 => "not defined".into(),
        v => format!("super-page {}", human_bytes(512u64 << (v - 1))),
    }
}

fn bkops_status(b: &[u8]) -> String {
    match b[0] & 3 {
        0 => "no operations required".into(),
        1 => "operations outstanding (non-critical)".into(),
        2 => "operations outstanding (performance impacted)".into(),
        _ => "operations outstanding (critical)".into(),
    }
}

fn cache_size(b: &[u8]) -> String {
    match le(b) {
        0 => "no cache".into(),
        kibit => format!("{kibit} Kibit = {}", human_bytes(kibit * 128)),
    }
}

fn hpi_features(b: &[u8]) -> String {
    match b[0] & 3 {
        0 => "HPI not supported".into(),
        1 => "HPI via CMD13".into(),
        3 => "HPI via CMD12".into(),
        _ => "HPI_IMPLEMENTATION without HPI_SUPPORT (invalid)".into(),
    }
}

fn size_x128k(b: &[u8], none: &str, prefix: &str) -> String {
    match b[0] {
        0 => none.into(),
        v => format!("{prefix}{}", human_bytes(u64::from(v) * 128 * 1024)),
    }
}

const fn f(
    name: &'static str,
    offset: usize,
    len: usize,
    access: Access,
    describe: fn(&[u8]) -> String,
) -> Field {
    Field {
        name,
        offset,
        len,
        access,
        describe,
    }
}

use Access::*;

/// Every EXT_CSD field of an eMMC 4.5 device, in offset order.
pub static FIELDS: &[Field] = &[
    // ---- Modes segment ------------------------------------------------------------------
    f("FLUSH_CACHE", FLUSH_CACHE, 1, WEP, |b| {
        if b[0] & 1 != 0 {
            "flush requested".into()
        } else {
            "write-only: bit 0 flushes the volatile cache".into()
        }
    }),
    f("CACHE_CTRL", CACHE_CTRL, 1, RWEP, |b| {
        on_off(b, "cache on", "cache off")
    }),
    f(
        "POWER_OFF_NOTIFICATION",
        POWER_OFF_NOTIFICATION,
        1,
        RWEP,
        |b| match b[0] {
            0 => "NO_POWER_NOTIFICATION".into(),
            1 => "POWERED_ON".into(),
            2 => "POWER_OFF_SHORT".into(),
            3 => "POWER_OFF_LONG".into(),
            4 => "SLEEP_NOTIFICATION [5.0]".into(),
            v => format!("reserved ({v})"),
        },
    ),
    f(
        "PACKED_FAILURE_INDEX",
        PACKED_FAILURE_INDEX,
        1,
        R,
        |b| match b[0] {
            0 => "none".into(),
            v => format!("entry {v} failed first"),
        },
    ),
    f("PACKED_COMMAND_STATUS", PACKED_COMMAND_STATUS, 1, R, |b| {
        flags(
            u64::from(b[0]),
            &[(0, "Error"), (1, "Indexed Error")],
            "no error",
        )
    }),
    f("CONTEXT_CONF", CONTEXT_CONF, 15, RWEP, context_conf),
    f(
        "EXT_PARTITIONS_ATTRIBUTE",
        EXT_PARTITIONS_ATTRIBUTE,
        2,
        RW,
        ext_partitions_attribute,
    ),
    f(
        "EXCEPTION_EVENTS_STATUS",
        EXCEPTION_EVENTS_STATUS,
        2,
        R,
        |b| {
            flags(
                le(b),
                &[
                    (0, "URGENT_BKOPS"),
                    (1, "DYNCAP_NEEDED"),
                    (2, "SYSPOOL_EXHAUSTED"),
                    (3, "PACKED_FAILURE"),
                ],
                "none",
            )
        },
    ),
    f(
        "EXCEPTION_EVENTS_CTRL",
        EXCEPTION_EVENTS_CTRL,
        2,
        RWEP,
        |b| {
            flags(
                le(b),
                &[
                    (1, "DYNCAP_EVENT_EN"),
                    (2, "SYSPOOL_EVENT_EN"),
                    (3, "PACKED_EVENT_EN"),
                ],
                "no events enabled",
            )
        },
    ),
    f("DYNCAP_NEEDED", DYNCAP_NEEDED, 1, R, |b| match b[0] {
        0 => "none".into(),
        v => format!("release {v} write-protect groups"),
    }),
    f("CLASS_6_CTRL", CLASS_6_CTRL, 1, RWEP, |b| match b[0] {
        0 => "class 6 commands do write protection".into(),
        1 => "class 6 commands release groups (dynamic capacity)".into(),
        v => format!("reserved ({v})"),
    }),
    f("INI_TIMEOUT_EMU", INI_TIMEOUT_EMU, 1, R, times_100ms),
    f("DATA_SECTOR_SIZE", DATA_SECTOR_SIZE, 1, R, sector_size),
    f("USE_NATIVE_SECTOR", USE_NATIVE_SECTOR, 1, RW, |b| {
        on_off(
            b,
            "native sector size (after power cycle)",
            "512 B emulation",
        )
    }),
    f("NATIVE_SECTOR_SIZE", NATIVE_SECTOR_SIZE, 1, R, sector_size),
    f(
        "VENDOR_SPECIFIC_FIELD",
        VENDOR_SPECIFIC_FIELD,
        64,
        Vendor,
        |b| match b.iter().filter(|&&x| x != 0).count() {
            0 => "all zero".into(),
            n => format!("{n} non-zero bytes"),
        },
    ),
    f(
        "PROGRAM_CID_CSD_DDR_SUPPORT",
        PROGRAM_CID_CSD_DDR_SUPPORT,
        1,
        R,
        |b| on_off(b, "CMD26/CMD27 allowed in DDR", "CMD26/CMD27 in SDR only"),
    ),
    f("PERIODIC_WAKEUP", PERIODIC_WAKEUP, 1, RWE, periodic_wakeup),
    f("TCASE_SUPPORT", TCASE_SUPPORT, 1, WEP, |b| {
        format!("write-only case temperature hint ({})", b[0])
    }),
    f("SEC_BAD_BLK_MGMNT", SEC_BAD_BLK_MGMNT, 1, RW, |b| {
        on_off(
            b,
            "secure bad-block management on",
            "secure bad-block management off",
        )
    }),
    f("ENH_START_ADDR", ENH_START_ADDR, 4, RW, |b| {
        format!("{} (sectors if sector-addressed, else bytes)", le(b))
    }),
    f("ENH_SIZE_MULT", ENH_SIZE_MULT, 3, RW, hc_wp_groups),
    f("GP_SIZE_MULT", GP_SIZE_MULT, 12, RW, gp_size_mult),
    f(
        "PARTITION_SETTING_COMPLETED",
        PARTITION_SETTING_COMPLETED,
        1,
        RW,
        |b| on_off(b, "partitioning completed", "partitioning not completed"),
    ),
    f("PARTITIONS_ATTRIBUTE", PARTITIONS_ATTRIBUTE, 1, RW, |b| {
        flags(
            u64::from(b[0]),
            &[
                (0, "ENH_USR"),
                (1, "ENH_1"),
                (2, "ENH_2"),
                (3, "ENH_3"),
                (4, "ENH_4"),
            ],
            "no enhanced areas",
        )
    }),
    f("MAX_ENH_SIZE_MULT", MAX_ENH_SIZE_MULT, 3, R, hc_wp_groups),
    f("PARTITIONING_SUPPORT", PARTITIONING_SUPPORT, 1, R, |b| {
        flags(
            u64::from(b[0]),
            &[
                (0, "PARTITIONING_EN"),
                (1, "ENH_ATTRIBUTE_EN"),
                (2, "EXT_ATTRIBUTE_EN"),
            ],
            "no partitioning",
        )
    }),
    f("HPI_MGMT", HPI_MGMT, 1, RWEP, |b| {
        on_off(b, "HPI enabled", "HPI disabled")
    }),
    f("RST_n_FUNCTION", RST_N_FUNCTION, 1, RW, |b| match b[0] {
        0 => "RST_n temporarily disabled".into(),
        1 => "RST_n permanently enabled".into(),
        2 => "RST_n permanently disabled".into(),
        v => format!("reserved ({v})"),
    }),
    f("BKOPS_EN", BKOPS_EN, 1, RW, |b| {
        flags(
            u64::from(b[0]),
            &[(0, "MANUAL_EN")],
            "background operations not enabled",
        )
    }),
    f("BKOPS_START", BKOPS_START, 1, WEP, |_| {
        "write-only: starts background operations".into()
    }),
    f("SANITIZE_START", SANITIZE_START, 1, WEP, |_| {
        "write-only: starts a sanitize operation".into()
    }),
    f("WR_REL_PARAM", WR_REL_PARAM, 1, R, |b| {
        flags(
            u64::from(b[0]),
            &[
                (0, "HS_CTRL_REL (WR_REL_SET writable)"),
                (2, "EN_REL_WR (enhanced reliable write)"),
            ],
            "legacy reliable write, WR_REL_SET fixed",
        )
    }),
    f("WR_REL_SET", WR_REL_SET, 1, RW, |b| {
        flags(
            u64::from(b[0]),
            &[
                (0, "WR_DATA_REL_USR"),
                (1, "WR_DATA_REL_1"),
                (2, "WR_DATA_REL_2"),
                (3, "WR_DATA_REL_3"),
                (4, "WR_DATA_REL_4"),
            ],
            "no area protects old data on power loss",
        )
    }),
    f("RPMB_SIZE_MULT", RPMB_SIZE_MULT, 1, R, |b| {
        size_x128k(b, "no RPMB partition", "")
    }),
    f("FW_CONFIG", FW_CONFIG, 1, RW, |b| {
        on_off(b, "firmware update disabled", "firmware update allowed")
    }),
    f("USER_WP", USER_WP, 1, Mixed, |b| {
        flags(
            u64::from(b[0]),
            &[
                (0, "US_PWR_WP_EN"),
                (2, "US_PERM_WP_EN"),
                (3, "US_PWR_WP_DIS"),
                (4, "US_PERM_WP_DIS"),
                (6, "CD_PERM_WP_DIS"),
                (7, "PERM_PSWD_DIS"),
            ],
            "none",
        )
    }),
    f("BOOT_WP", BOOT_WP, 1, Mixed, |b| {
        flags(
            u64::from(b[0]),
            &[
                (0, "B_PWR_WP_EN"),
                (1, "B_PWR_WP_SEC_SEL"),
                (2, "B_PERM_WP_EN"),
                (3, "B_PERM_WP_SEC_SEL"),
                (4, "B_PERM_WP_DIS"),
                (6, "B_PWR_WP_DIS"),
                (7, "B_SEC_WP_SEL"),
            ],
            "none",
        )
    }),
    f("BOOT_WP_STATUS", BOOT_WP_STATUS, 1, R, boot_wp_status),
    f("ERASE_GROUP_DEF", ERASE_GROUP_DEF, 1, RWEP, |b| {
        on_off(b, "high-capacity group sizes", "legacy (CSD) group sizes")
    }),
    f(
        "BOOT_BUS_CONDITIONS",
        BOOT_BUS_CONDITIONS,
        1,
        RWE,
        boot_bus_conditions,
    ),
    f("BOOT_CONFIG_PROT", BOOT_CONFIG_PROT, 1, Mixed, |b| {
        flags(
            u64::from(b[0]),
            &[(0, "PWR_BOOT_CONFIG_PROT"), (4, "PERM_BOOT_CONFIG_PROT")],
            "not protected",
        )
    }),
    f(
        "PARTITION_CONFIG",
        PARTITION_CONFIG,
        1,
        Mixed,
        partition_config,
    ),
    f("ERASED_MEM_CONT", ERASED_MEM_CONT, 1, R, |b| {
        on_off(b, "erased memory reads 0xFF", "erased memory reads 0x00")
    }),
    f("BUS_WIDTH", BUS_WIDTH, 1, WEP, bus_width),
    f("HS_TIMING", HS_TIMING, 1, RWEP, hs_timing),
    f("POWER_CLASS", POWER_CLASS, 1, RWEP, |b| {
        format!("power class {}", b[0])
    }),
    f("CMD_SET_REV", CMD_SET_REV, 1, R, |b| match b[0] {
        0 => "standard command set v4.0".into(),
        v => format!("reserved ({v})"),
    }),
    f("CMD_SET", CMD_SET, 1, RWEP, |b| match b[0] {
        0 => "standard MMC command set".into(),
        v => format!("command set {v}"),
    }),
    // ---- Properties segment -------------------------------------------------------------
    f("EXT_CSD_REV", EXT_CSD_REV, 1, R, ext_csd_rev),
    f("CSD_STRUCTURE", CSD_STRUCTURE, 1, R, |b| match b[0] {
        v @ 0..=2 => format!("CSD version 1.{v}"),
        v => format!("reserved ({v})"),
    }),
    f("DEVICE_TYPE", DEVICE_TYPE, 1, R, device_type),
    f("DRIVER_STRENGTH", DRIVER_STRENGTH, 1, R, driver_strength),
    f(
        "OUT_OF_INTERRUPT_TIME",
        OUT_OF_INTERRUPT_TIME,
        1,
        R,
        times_10ms,
    ),
    f(
        "PARTITION_SWITCH_TIME",
        PARTITION_SWITCH_TIME,
        1,
        R,
        times_10ms,
    ),
    f("PWR_CL_52_195", PWR_CL_52_195, 1, R, power_class),
    f("PWR_CL_26_195", PWR_CL_26_195, 1, R, power_class),
    f("PWR_CL_52_360", PWR_CL_52_360, 1, R, power_class),
    f("PWR_CL_26_360", PWR_CL_26_360, 1, R, power_class),
    f("MIN_PERF_R_4_26", MIN_PERF_R_4_26, 1, R, min_perf),
    f("MIN_PERF_W_4_26", MIN_PERF_W_4_26, 1, R, min_perf),
    f("MIN_PERF_R_8_26_4_52", MIN_PERF_R_8_26_4_52, 1, R, min_perf),
    f("MIN_PERF_W_8_26_4_52", MIN_PERF_W_8_26_4_52, 1, R, min_perf),
    f("MIN_PERF_R_8_52", MIN_PERF_R_8_52, 1, R, min_perf),
    f("MIN_PERF_W_8_52", MIN_PERF_W_8_52, 1, R, min_perf),
    f("SEC_COUNT", SEC_COUNT, 4, R, sec_count),
    f("S_A_TIMEOUT", S_A_TIMEOUT, 1, R, s_a_timeout),
    f("S_C_VCCQ", S_C_VCCQ, 1, R, sleep_current),
    f("S_C_VCC", S_C_VCC, 1, R, sleep_current),
    f("HC_WP_GRP_SIZE", HC_WP_GRP_SIZE, 1, R, |b| match b[0] {
        0 => "no high-capacity write protection".into(),
        v => format!("{v} × HC erase group"),
    }),
    f("REL_WR_SEC_C", REL_WR_SEC_C, 1, R, |b| sectors(le(b))),
    f("ERASE_TIMEOUT_MULT", ERASE_TIMEOUT_MULT, 1, R, times_300ms),
    f("HC_ERASE_GRP_SIZE", HC_ERASE_GRP_SIZE, 1, R, |b| {
        match b[0] {
            0 => "no high-capacity erase groups".into(),
            v => human_bytes(u64::from(v) * 512 * 1024),
        }
    }),
    f("ACC_SIZE", ACC_SIZE, 1, R, acc_size),
    f("BOOT_SIZE_MULT", BOOT_SIZE_MULT, 1, R, |b| {
        size_x128k(b, "no boot partitions", "2 × ")
    }),
    f("BOOT_INFO", BOOT_INFO, 1, R, |b| {
        flags(
            u64::from(b[0]),
            &[
                (0, "ALT_BOOT_MODE"),
                (1, "DDR_BOOT_MODE"),
                (2, "HS_BOOT_MODE"),
            ],
            "no boot modes",
        )
    }),
    f(
        "SEC_TRIM_MULT",
        SEC_TRIM_MULT,
        1,
        R,
        multiplier_of_erase_timeout,
    ),
    f(
        "SEC_ERASE_MULT",
        SEC_ERASE_MULT,
        1,
        R,
        multiplier_of_erase_timeout,
    ),
    f("SEC_FEATURE_SUPPORT", SEC_FEATURE_SUPPORT, 1, R, |b| {
        flags(
            u64::from(b[0]),
            &[
                (0, "SECURE_ER_EN"),
                (2, "SEC_BD_BLK_EN"),
                (4, "SEC_GB_CL_EN"),
                (6, "SEC_SANITIZE"),
            ],
            "none",
        )
    }),
    f("TRIM_MULT", TRIM_MULT, 1, R, times_300ms),
    f("MIN_PERF_DDR_R_8_52", MIN_PERF_DDR_R_8_52, 1, R, min_perf),
    f("MIN_PERF_DDR_W_8_52", MIN_PERF_DDR_W_8_52, 1, R, min_perf),
    f("PWR_CL_200_195", PWR_CL_200_195, 1, R, power_class),
    f("PWR_CL_200_360", PWR_CL_200_360, 1, R, power_class),
    f("PWR_CL_DDR_52_195", PWR_CL_DDR_52_195, 1, R, power_class),
    f("PWR_CL_DDR_52_360", PWR_CL_DDR_52_360, 1, R, power_class),
    f("INI_TIMEOUT_AP", INI_TIMEOUT_AP, 1, R, times_100ms),
    f(
        "CORRECTLY_PRG_SECTORS_NUM",
        CORRECTLY_PRG_SECTORS_NUM,
        4,
        R,
        |b| sectors(le(b)),
    ),
    f("BKOPS_STATUS", BKOPS_STATUS, 1, R, bkops_status),
    f("POWER_OFF_LONG_TIME", POWER_OFF_LONG_TIME, 1, R, times_10ms),
    f("GENERIC_CMD6_TIME", GENERIC_CMD6_TIME, 1, R, times_10ms),
    f("CACHE_SIZE", CACHE_SIZE, 4, R, cache_size),
    f("EXT_SUPPORT", EXT_SUPPORT, 1, R, |b| {
        flags(
            u64::from(b[0]),
            &[(0, "system code"), (1, "non-persistent")],
            "no extended partition types",
        )
    }),
    f("LARGE_UNIT_SIZE_M1", LARGE_UNIT_SIZE_M1, 1, R, |b| {
        format!("large unit {} MiB", u32::from(b[0]) + 1)
    }),
    f("CONTEXT_CAPABILITIES", CONTEXT_CAPABILITIES, 1, R, |b| {
        format!(
            "MAX_CONTEXT_ID {}, LARGE_UNIT_MAX_MULTIPLIER_M1 {}",
            b[0] & 0x0F,
            (b[0] >> 4) & 7
        )
    }),
    f("TAG_RES_SIZE", TAG_RES_SIZE, 1, R, plain),
    f("TAG_UNIT_SIZE", TAG_UNIT_SIZE, 1, R, |b| {
        format!("2^{} sectors", b[0])
    }),
    f("DATA_TAG_SUPPORT", DATA_TAG_SUPPORT, 1, R, |b| {
        on_off(
            b,
            "system data tag supported",
            "system data tag not supported",
        )
    }),
    f("MAX_PACKED_WRITES", MAX_PACKED_WRITES, 1, R, |b| {
        match b[0] {
            0 => "packed writes not supported".into(),
            v => format!("{v} entries"),
        }
    }),
    f("MAX_PACKED_READS", MAX_PACKED_READS, 1, R, |b| match b[0] {
        0 => "packed reads not supported".into(),
        v => format!("{v} entries"),
    }),
    f("BKOPS_SUPPORT", BKOPS_SUPPORT, 1, R, |b| {
        on_off(b, "background operations supported", "not supported")
    }),
    f("HPI_FEATURES", HPI_FEATURES, 1, R, hpi_features),
    f("S_CMD_SET", S_CMD_SET, 1, R, |b| {
        flags(u64::from(b[0]), &[(0, "standard MMC")], "none")
    }),
];

#[cfg(test)]
mod tests {
    use super::*;

    /// (name, value) of every `pub const NAME: usize = N;` in ext_csd/mod.rs.
    fn offset_constants() -> Vec<(String, usize)> {
        include_str!("mod.rs")
            .lines()
            .filter_map(|line| {
                let rest = line.strip_prefix("pub const ")?;
                let (name, rest) = rest.split_once(": usize = ")?;
                let value = rest.strip_suffix(';')?.parse().ok()?;
                Some((name.to_string(), value))
            })
            .filter(|(name, _)| name != "EXT_CSD_LEN" && name != "PROPERTIES_SEGMENT")
            .collect()
    }

    #[test]
    fn offsets_are_strictly_increasing_and_fields_do_not_overlap() {
        for pair in FIELDS.windows(2) {
            assert!(
                pair[0].end() <= pair[1].offset,
                "{} [{}..{}) overlaps or precedes {} [{}]",
                pair[0].name,
                pair[0].offset,
                pair[0].end(),
                pair[1].name,
                pair[1].offset
            );
        }
        assert!(FIELDS.iter().all(|f| f.len >= 1 && f.end() <= EXT_CSD_LEN));
    }

    #[test]
    fn every_offset_constant_is_in_the_table() {
        let constants = offset_constants();
        assert!(
            constants.len() > 90,
            "parsed only {} constants",
            constants.len()
        );
        for (name, offset) in constants {
            let field = FIELDS
                .iter()
                .find(|f| f.name.eq_ignore_ascii_case(&name))
                .unwrap_or_else(|| panic!("{name} is not in FIELDS"));
            assert_eq!(field.offset, offset, "{name}");
        }
    }

    #[test]
    fn every_field_has_an_offset_constant() {
        let constants = offset_constants();
        for field in FIELDS {
            assert!(
                constants
                    .iter()
                    .any(|(n, o)| n.eq_ignore_ascii_case(field.name) && *o == field.offset),
                "{} has no constant in ext_csd/mod.rs",
                field.name
            );
        }
    }

    #[test]
    fn properties_segment_is_read_only_and_modes_fields_are_below_it() {
        for field in FIELDS {
            if field.offset >= PROPERTIES_SEGMENT {
                assert_eq!(field.access, Access::R, "{}", field.name);
            } else {
                assert!(field.end() <= PROPERTIES_SEGMENT, "{}", field.name);
            }
        }
    }

    #[test]
    fn field_at_finds_every_byte_of_a_field_and_nothing_else() {
        assert_eq!(field_at(SEC_COUNT).unwrap().name, "SEC_COUNT");
        assert_eq!(field_at(SEC_COUNT + 3).unwrap().name, "SEC_COUNT");
        assert_eq!(field_at(CONTEXT_CONF + 14).unwrap().name, "CONTEXT_CONF");
        assert_eq!(field_at(GP_SIZE_MULT + 11).unwrap().name, "GP_SIZE_MULT");
        assert_eq!(field_at(0).map(|f| f.name), None);
        assert_eq!(field_at(193).map(|f| f.name), None);
        assert_eq!(field_at(511).map(|f| f.name), None);
        assert_eq!(field_at(600).map(|f| f.name), None);
        for offset in 0..EXT_CSD_LEN {
            let by_scan = FIELDS.iter().find(|f| f.contains(offset));
            assert_eq!(
                field_at(offset).map(|f| f.name),
                by_scan.map(|f| f.name),
                "{offset}"
            );
        }
    }

    #[test]
    fn access_types_follow_the_spec() {
        let access = |name| field_named(name).unwrap().access;
        assert_eq!(access("FLUSH_CACHE"), Access::WEP);
        assert_eq!(access("CACHE_CTRL"), Access::RWEP);
        assert_eq!(access("HPI_MGMT"), Access::RWEP);
        assert_eq!(access("RST_n_FUNCTION"), Access::RW);
        assert_eq!(access("BOOT_BUS_CONDITIONS"), Access::RWE);
        assert_eq!(access("PARTITION_CONFIG"), Access::Mixed);
        assert_eq!(access("ERASED_MEM_CONT"), Access::R);
        assert_eq!(
            field_named("PARTITION_CONFIG").unwrap().access_code(),
            "R/W/E & R/W/E_P"
        );
        assert_eq!(field_named("BUS_WIDTH").unwrap().access_code(), "W/E_P");
    }

    #[test]
    fn descriptions_decode_units() {
        let d = |name, bytes: &[u8]| (field_named(name).unwrap().describe)(bytes);
        assert_eq!(d("BOOT_SIZE_MULT", &[32]), "2 × 4 MiB");
        assert_eq!(d("RPMB_SIZE_MULT", &[128]), "16 MiB");
        assert_eq!(
            d("DEVICE_TYPE", &[0x17]),
            "HS200 1.8V | DDR52 1.8/3V | HS52 | HS26"
        );
        assert_eq!(d("GENERIC_CMD6_TIME", &[0x0A]), "100 ms");
        assert_eq!(d("POWER_OFF_LONG_TIME", &[0x3C]), "600 ms");
        assert_eq!(d("S_A_TIMEOUT", &[0x10]), "6.55 ms");
        assert_eq!(d("S_A_TIMEOUT", &[0x17]), "838.86 ms");
        assert_eq!(d("TRIM_MULT", &[1]), "300 ms per erase group");
        assert_eq!(d("HC_ERASE_GRP_SIZE", &[1]), "512 KiB");
        assert_eq!(d("CACHE_SIZE", &[0, 0x10, 0, 0]), "4096 Kibit = 512 KiB");
        assert_eq!(
            d("SEC_COUNT", &[0, 0, 0xE9, 0]),
            "15269888 sectors = 7456 MiB, sector addressing"
        );
        assert!(d("WR_REL_PARAM", &[0x05]).contains("enhanced reliable write"));
        assert_eq!(d("HPI_FEATURES", &[0x01]), "HPI via CMD13");
        assert_eq!(d("HPI_FEATURES", &[0x03]), "HPI via CMD12");
        assert_eq!(
            d("PARTITION_CONFIG", &[0x48]),
            "access user area, boot from boot partition 1, BOOT_ACK"
        );
        assert_eq!(d("EXT_CSD_REV", &[6]), "eMMC 4.5/4.51");
        assert_eq!(d("PACKED_COMMAND_STATUS", &[0x03]), "Error | Indexed Error");
        assert_eq!(d("SEC_FEATURE_SUPPORT", &[0x57]).matches('|').count(), 4);
        assert!(d("SEC_FEATURE_SUPPORT", &[0x57]).contains("reserved bit 1"));
        assert_eq!(
            d(
                "CONTEXT_CONF",
                &[0, 3, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0x45]
            ),
            "context 2: read/write; context 15: write-only, large unit ×1, reliability mode 1"
        );
        assert_eq!(
            d("GP_SIZE_MULT", &[1, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0]),
            "GP1 1, GP2 256, GP3 0, GP4 0 (× HC write-protect group)"
        );
    }

    #[test]
    fn human_units() {
        assert_eq!(human_bytes(1536), "1536 B");
        assert_eq!(human_bytes(4 << 20), "4 MiB");
        assert_eq!(human_bytes(3 << 30), "3 GiB");
        assert_eq!(human_ns(1_000), "1 µs");
        assert_eq!(human_ns(1_500), "1.5 µs");
        assert_eq!(human_ns(999), "999 ns");
        assert_eq!(human_ns(2_000_000_000), "2 s");
    }
}
