//! Human-readable decoding of CID, CSD and EXT_CSD, in the manner of `mmc extcsd read`: one
//! line per field with its name, position, raw value in hex and meaning.
//!
//! ```text
//!   PNM [103:56]: 0x454d55343541  "EMU45A"
//!   SEC_COUNT [212]: 0x00e90000  R         15269888 sectors = 7456 MiB, sector addressing
//! ```
//!
//! CID/CSD positions are bit ranges; EXT_CSD positions are the field's first byte, followed
//! by its access type. Reserved EXT_CSD bytes are not listed one by one; any that is not 0
//! (which a REV-6 device must never show) is reported at the end.

use std::fmt::Write as _;

use crate::ext_csd::fields::{field_at, human_bytes, human_ns, FIELDS};
use crate::ext_csd::{
    build_ext_csd, read_le, EXT_CSD_LEN, EXT_CSD_REV, PROPERTIES_SEGMENT, SEC_COUNT,
};
use crate::model::DeviceModel;
use crate::registers::{build_cid, build_csd, decode_cid, decode_csd};

/// Render the three registers as text.
pub fn render(cid: &[u8; 16], csd: &[u8; 16], ext_csd: &[u8; 512]) -> String {
    let mut out = String::new();
    render_cid(&mut out, cid, ext_csd[EXT_CSD_REV]);
    out.push('\n');
    render_csd(&mut out, csd, ext_csd);
    out.push('\n');
    render_ext_csd(&mut out, ext_csd);
    out
}

/// Render the registers of a fresh card of `model` (CSD programmable bits all 0).
pub fn render_model(model: &DeviceModel) -> String {
    render(
        &build_cid(&model.cid, model.ext_csd.ext_csd_rev),
        &build_csd(model, 0),
        &build_ext_csd(model),
    )
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// One line: `  NAME [position]: raw  meaning`.
fn line(out: &mut String, name: &str, position: &str, raw: String, meaning: &str) {
    let _ = if meaning.is_empty() {
        writeln!(out, "  {name} [{position}]: {raw}")
    } else {
        writeln!(out, "  {name} [{position}]: {raw}  {meaning}")
    };
}

fn crc_text(ok: bool) -> &'static str {
    if ok {
        "ok"
    } else {
        "MISMATCH (register corrupt)"
    }
}

fn render_cid(out: &mut String, cid: &[u8; 16], ext_csd_rev: u8) {
    let f = decode_cid(cid, ext_csd_rev);
    let _ = writeln!(out, "CID: {}", hex(cid));
    line(
        out,
        "MID",
        "127:120",
        format!("{:#04x}", f.mid),
        "manufacturer id",
    );
    line(out, "CBX", "113:112", format!("{:#x}", f.cbx), f.cbx_text());
    line(
        out,
        "OID",
        "111:104",
        format!("{:#04x}", f.oid),
        "OEM/application id",
    );
    line(
        out,
        "PNM",
        "103:56",
        format!("0x{}", hex(&cid[3..9])),
        &format!("{:?}", f.pnm),
    );
    line(
        out,
        "PRV",
        "55:48",
        format!("{:#04x}", f.prv),
        &f.prv_text(),
    );
    line(
        out,
        "PSN",
        "47:16",
        format!("{:#010x}", f.psn),
        &f.psn.to_string(),
    );
    let date = if (1..=12).contains(&f.month) {
        format!("{}-{:02}", f.year, f.month)
    } else {
        format!("{} with invalid month {}", f.year, f.month)
    };
    line(out, "MDT", "15:8", format!("{:#04x}", f.mdt), &date);
    line(
        out,
        "CRC",
        "7:1",
        format!("{:#04x}", f.crc),
        crc_text(f.crc_ok),
    );
}

fn render_csd(out: &mut String, csd: &[u8; 16], ext_csd: &[u8; EXT_CSD_LEN]) {
    const R_MIN_MA: [&str; 8] = ["0.5", "1", "5", "10", "25", "35", "60", "100"];
    const R_MAX_MA: [&str; 8] = ["1", "5", "10", "25", "35", "45", "80", "200"];
    let f = decode_csd(csd);
    let _ = writeln!(out, "CSD: {}", hex(csd));
    let structure = match f.csd_structure {
        3 => "version coded in EXT_CSD CSD_STRUCTURE".to_string(),
        v => format!("CSD version 1.{v}"),
    };
    line(
        out,
        "CSD_STRUCTURE",
        "127:126",
        format!("{:#x}", f.csd_structure),
        &structure,
    );
    let spec = if f.spec_vers == 4 {
        "4.x and later"
    } else {
        "before 4.0"
    };
    line(
        out,
        "SPEC_VERS",
        "125:122",
        format!("{:#x}", f.spec_vers),
        spec,
    );
    let taac = f.taac_ns().map_or("reserved".into(), human_ns);
    line(out, "TAAC", "119:112", format!("{:#04x}", f.taac), &taac);
    line(
        out,
        "NSAC",
        "111:104",
        format!("{:#04x}", f.nsac),
        &format!("{} clocks", u32::from(f.nsac) * 100),
    );
    let tran = f.tran_speed_khz().map_or("reserved".into(), |khz| {
        if khz % 1000 == 0 {
            format!("{} MHz", khz / 1000)
        } else {
            format!("{khz} kHz")
        }
    });
    line(
        out,
        "TRAN_SPEED",
        "103:96",
        format!("{:#04x}", f.tran_speed),
        &tran,
    );
    let classes: Vec<String> = (0..12)
        .filter(|c| f.ccc & (1 << c) != 0)
        .map(|c| c.to_string())
        .collect();
    line(
        out,
        "CCC",
        "95:84",
        format!("{:#05x}", f.ccc),
        &format!("classes {}", classes.join(", ")),
    );
    let block = |v: u8| human_bytes(1u64 << v);
    line(
        out,
        "READ_BL_LEN",
        "83:80",
        format!("{:#x}", f.read_bl_len),
        &block(f.read_bl_len),
    );
    for (name, bit, value) in [
        ("READ_BL_PARTIAL", "79", f.read_bl_partial),
        ("WRITE_BLK_MISALIGN", "78", f.write_blk_misalign),
        ("READ_BLK_MISALIGN", "77", f.read_blk_misalign),
        ("DSR_IMP", "76", f.dsr_imp),
    ] {
        line(out, name, bit, format!("{:#x}", u8::from(value)), "");
    }
    line(out, "C_SIZE", "73:62", format!("{:#05x}", f.c_size), "");
    for (name, bits, value, table) in [
        ("VDD_R_CURR_MIN", "61:59", f.vdd_r_curr_min, &R_MIN_MA),
        ("VDD_R_CURR_MAX", "58:56", f.vdd_r_curr_max, &R_MAX_MA),
        ("VDD_W_CURR_MIN", "55:53", f.vdd_w_curr_min, &R_MIN_MA),
        ("VDD_W_CURR_MAX", "52:50", f.vdd_w_curr_max, &R_MAX_MA),
    ] {
        let ma = format!("{} mA", table[usize::from(value & 7)]);
        line(out, name, bits, format!("{value:#x}"), &ma);
    }
    let sectors = u64::from(read_le(ext_csd, SEC_COUNT, 4));
    let capacity = if f.c_size == 0xFFF && f.c_size_mult == 7 && sectors > 4_194_304 {
        "sector addressing: capacity from EXT_CSD SEC_COUNT".to_string()
    } else {
        format!("capacity {}", human_bytes(f.capacity_bytes()))
    };
    line(
        out,
        "C_SIZE_MULT",
        "49:47",
        format!("{:#x}", f.c_size_mult),
        &capacity,
    );
    line(
        out,
        "ERASE_GRP_SIZE",
        "46:42",
        format!("{:#04x}", f.erase_grp_size),
        "",
    );
    let erase_blocks = (u64::from(f.erase_grp_size) + 1) * (u64::from(f.erase_grp_mult) + 1);
    let erase_bytes = erase_blocks << f.write_bl_len;
    line(
        out,
        "ERASE_GRP_MULT",
        "41:37",
        format!("{:#04x}", f.erase_grp_mult),
        &format!(
            "legacy erase group {erase_blocks} write blocks = {}",
            human_bytes(erase_bytes)
        ),
    );
    let wp_groups = u64::from(f.wp_grp_size) + 1;
    line(
        out,
        "WP_GRP_SIZE",
        "36:32",
        format!("{:#04x}", f.wp_grp_size),
        &format!(
            "legacy WP group {wp_groups} erase groups = {}",
            human_bytes(wp_groups * erase_bytes)
        ),
    );
    let supported = if f.wp_grp_enable {
        "group write protection"
    } else {
        "no group write protection"
    };
    line(
        out,
        "WP_GRP_ENABLE",
        "31",
        format!("{:#x}", u8::from(f.wp_grp_enable)),
        supported,
    );
    line(
        out,
        "DEFAULT_ECC",
        "30:29",
        format!("{:#x}", f.default_ecc),
        "",
    );
    line(
        out,
        "R2W_FACTOR",
        "28:26",
        format!("{:#x}", f.r2w_factor),
        &format!("write time = {} × read time", 1u32 << f.r2w_factor),
    );
    line(
        out,
        "WRITE_BL_LEN",
        "25:22",
        format!("{:#x}", f.write_bl_len),
        &block(f.write_bl_len),
    );
    line(
        out,
        "WRITE_BL_PARTIAL",
        "21",
        format!("{:#x}", u8::from(f.write_bl_partial)),
        "",
    );
    line(
        out,
        "CONTENT_PROT_APP",
        "16",
        format!("{:#x}", u8::from(f.content_prot_app)),
        "",
    );
    line(
        out,
        "FILE_FORMAT_GRP",
        "15",
        format!("{:#x}", u8::from(f.file_format_grp)),
        "",
    );
    let copy = if f.copy { "copy" } else { "original" };
    line(out, "COPY", "14", format!("{:#x}", u8::from(f.copy)), copy);
    let protected = |on: bool| {
        if on {
            "write protected"
        } else {
            "not protected"
        }
    };
    line(
        out,
        "PERM_WRITE_PROTECT",
        "13",
        format!("{:#x}", u8::from(f.perm_write_protect)),
        protected(f.perm_write_protect),
    );
    line(
        out,
        "TMP_WRITE_PROTECT",
        "12",
        format!("{:#x}", u8::from(f.tmp_write_protect)),
        protected(f.tmp_write_protect),
    );
    line(
        out,
        "FILE_FORMAT",
        "11:10",
        format!("{:#x}", f.file_format),
        "",
    );
    line(
        out,
        "ECC",
        "9:8",
        format!("{:#x}", f.ecc),
        if f.ecc == 0 { "none" } else { "" },
    );
    line(
        out,
        "CRC",
        "7:1",
        format!("{:#04x}", f.crc),
        crc_text(f.crc_ok),
    );
}

/// The raw value of an EXT_CSD field: a little-endian number for fields of up to 4 bytes,
/// the bytes in offset order for longer ones.
fn ext_csd_raw(bytes: &[u8]) -> String {
    if bytes.len() <= 4 {
        let value = bytes
            .iter()
            .rev()
            .fold(0u32, |acc, &b| acc << 8 | u32::from(b));
        return format!("0x{value:0width$x}", width = 2 * bytes.len());
    }
    if bytes.iter().all(|&b| b == 0) {
        return format!("00 × {}", bytes.len());
    }
    bytes
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect::<Vec<_>>()
        .join(" ")
}

fn render_ext_csd(out: &mut String, ext_csd: &[u8; EXT_CSD_LEN]) {
    let rev = ext_csd[EXT_CSD_REV];
    let _ = writeln!(out, "EXT_CSD: revision {rev}");
    let _ = writeln!(out, " Modes segment [0-191]");
    for field in FIELDS {
        if field.offset == PROPERTIES_SEGMENT {
            let _ = writeln!(out, " Properties segment [192-511]");
        }
        let raw = ext_csd_raw(field.bytes(ext_csd));
        let _ = writeln!(
            out,
            "  {} [{}]: {:<10} {:<8} {}",
            field.name,
            field.offset,
            raw,
            field.access_code(),
            field.meaning(ext_csd)
        );
    }
    let stray: Vec<String> = (0..EXT_CSD_LEN)
        .filter(|&offset| field_at(offset).is_none() && ext_csd[offset] != 0)
        .map(|offset| format!("[{offset}]={:#04x}", ext_csd[offset]))
        .collect();
    if stray.is_empty() {
        let _ = writeln!(out, " Reserved bytes: all 0");
    } else {
        let _ = writeln!(
            out,
            " Reserved bytes that are not 0 (must read 0 on REV 6): {}",
            stray.join(" ")
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// STROBE_SUPPORT, a [5.1] byte: reserved on REV 6.
    const STROBE_SUPPORT: usize = 184;

    fn generic_text() -> String {
        render_model(&DeviceModel::load("generic-emmc45").unwrap())
    }

    fn line_of<'a>(text: &'a str, prefix: &str) -> &'a str {
        text.lines()
            .find(|l| l.trim_start().starts_with(prefix))
            .unwrap_or_else(|| panic!("no line starting with {prefix:?} in\n{text}"))
    }

    #[test]
    fn generic_model_renders_its_key_values() {
        let text = generic_text();
        assert!(
            line_of(&text, "SEC_COUNT [212]: 0x00e90000").contains("15269888 sectors = 7456 MiB"),
            "{text}"
        );
        assert!(text.contains("EXT_CSD_REV [192]: 0x06"), "{text}");
        assert!(line_of(&text, "EXT_CSD_REV [192]").contains("eMMC 4.5/4.51"));
        assert!(line_of(&text, "PNM [103:56]").contains("\"EMU45A\""));
        assert!(line_of(&text, "MDT [15:8]: 0x1b").contains("2024-01"));
        assert!(line_of(&text, "PSN [47:16]: 0x12345678").contains("305419896"));
        assert!(line_of(&text, "TRAN_SPEED [103:96]: 0x32").contains("26 MHz"));
        assert!(line_of(&text, "TAAC [119:112]: 0x0e").contains("1 ms"));
        assert!(line_of(&text, "CCC [95:84]: 0x0f5").contains("classes 0, 2, 4, 5, 6, 7"));
        assert!(line_of(&text, "C_SIZE_MULT").contains("SEC_COUNT"));
        assert!(line_of(&text, "BOOT_SIZE_MULT [226]: 0x20").contains("2 × 4 MiB"));
        assert!(line_of(&text, "RPMB_SIZE_MULT [168]: 0x20").contains("4 MiB"));
        assert!(line_of(&text, "DEVICE_TYPE [196]: 0x17")
            .contains("HS200 1.8V | DDR52 1.8/3V | HS52 | HS26"));
        assert!(line_of(&text, "GENERIC_CMD6_TIME [248]: 0x0a").contains("100 ms"));
        assert!(line_of(&text, "CACHE_SIZE [249]: 0x00001000").contains("512 KiB"));
        assert!(line_of(&text, "WR_REL_PARAM [166]: 0x05").contains("enhanced reliable write"));
        assert!(line_of(&text, "PARTITION_CONFIG [179]: 0x00").contains("R/W/E & R/W/E_P"));
        assert!(line_of(&text, "CONTEXT_CONF [37]: 00 × 15").contains("all 15 contexts closed"));
        assert!(text.contains("Reserved bytes: all 0"), "{text}");
        // Two CRC lines, both good.
        assert_eq!(text.matches("  CRC [7:1]: ").count(), 2);
        assert!(!text.contains("MISMATCH"));
    }

    #[test]
    fn every_ext_csd_field_has_exactly_one_line() {
        let text = generic_text();
        for field in FIELDS {
            let prefix = format!("  {} [{}]: ", field.name, field.offset);
            assert_eq!(text.matches(&prefix).count(), 1, "{prefix}");
        }
    }

    #[test]
    fn stray_reserved_bytes_and_bad_crcs_are_reported() {
        let model = DeviceModel::load("generic-emmc45").unwrap();
        let mut cid = build_cid(&model.cid, 6);
        cid[3] ^= 0x20;
        let csd = build_csd(&model, 0);
        let mut ext_csd = build_ext_csd(&model);
        ext_csd[STROBE_SUPPORT] = 1;
        let text = render(&cid, &csd, &ext_csd);
        assert!(line_of(&text, "CRC [7:1]").contains("MISMATCH"), "{text}");
        assert!(text.contains("must read 0 on REV 6): [184]=0x01"), "{text}");
        assert_eq!(ext_csd[SEC_COUNT + 2], 0xE9);
    }

    #[test]
    fn byte_addressed_capacity_is_shown_from_the_csd() {
        let mut model = DeviceModel::load("generic-emmc45").unwrap();
        model.ext_csd.sec_count = 256 * 1024;
        model.ext_csd.max_enh_size_mult = 0;
        let text = render_model(&model);
        assert!(
            line_of(&text, "C_SIZE_MULT [49:47]: 0x4").contains("capacity 128 MiB"),
            "{text}"
        );
        assert!(line_of(&text, "SEC_COUNT [212]").contains("byte addressing"));
    }
}
