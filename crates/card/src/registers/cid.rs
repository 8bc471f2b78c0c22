//! CID: card identification, returned in R2 to CMD2 and CMD10 (facts §5.1).
//!
//! | Bits    | Field | Encoding                                             |
//! |---------|-------|------------------------------------------------------|
//! | 127:120 | MID   | manufacturer id                                      |
//! | 113:112 | CBX   | 0 removable, 1 BGA, 2 PoP                            |
//! | 111:104 | OID   | OEM/application id                                   |
//! | 103:56  | PNM   | 6 ASCII characters, first in 103:96                  |
//! | 55:48   | PRV   | BCD n.m                                              |
//! | 47:16   | PSN   | serial number                                        |
//! | 15:8    | MDT   | month in 15:12, year code in 11:8                    |
//! | 7:1     | CRC   | CRC7 over bits 127:8                                 |
use crate::crc::crc7;
use crate::model::{Cbx, CidModel};

/// The CID register for `model`; `ext_csd_rev` decides the MDT year encoding.
///
/// The model is expected to have passed validation; should it not have, malformed text
/// fields are encoded best-effort (PNM space-padded or cut to 6 bytes, PRV and MDT 0)
/// rather than panicking.
pub fn build_cid(model: &CidModel, ext_csd_rev: u8) -> [u8; 16] {
    let mut r = [0u8; 16];
    r[0] = model.mid;
    r[1] = match model.cbx {
        Cbx::Removable => 0b00,
        Cbx::Bga => 0b01,
        Cbx::Pop => 0b10,
    };
    r[2] = model.oid;
    let pnm = model.pnm.as_bytes();
    for (i, byte) in r[3..9].iter_mut().enumerate() {
        *byte = pnm.get(i).copied().unwrap_or(b' ');
    }
    r[9] = model.prv_bcd().unwrap_or(0);
    r[10..14].copy_from_slice(&model.psn.to_be_bytes());
    r[14] = model.mdt_byte(ext_csd_rev).unwrap_or(0);
    r[15] = crc7(&r[..15]) << 1 | 1;
    r
}

/// The fields of a CID register, decoded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CidFields {
    /// MID.
    pub mid: u8,
    /// CBX (2 bits).
    pub cbx: u8,
    /// OID.
    pub oid: u8,
    /// PNM, non-printable bytes shown as '.'.
    pub pnm: String,
    /// PRV, raw BCD byte.
    pub prv: u8,
    /// PSN.
    pub psn: u32,
    /// MDT, raw byte.
    pub mdt: u8,
    /// Manufacturing month from MDT [15:12] (1 = January).
    pub month: u8,
    /// Manufacturing year decoded from MDT [11:8] for the EXT_CSD_REV given to [`decode_cid`].
    pub year: u16,
    /// CRC7 as stored (bits 7:1).
    pub crc: u8,
    /// Whether the stored CRC7 matches bits 127:8 and bit 0 is 1.
    pub crc_ok: bool,
}

impl CidFields {
    /// PRV as "n.m".
    pub fn prv_text(&self) -> String {
        format!("{}.{}", self.prv >> 4, self.prv & 0x0F)
    }

    /// CBX meaning.
    pub fn cbx_text(&self) -> &'static str {
        match self.cbx {
            0 => "removable device",
            1 => "BGA (discrete embedded)",
            2 => "PoP",
            _ => "reserved",
        }
    }
}

/// Decode a CID. `ext_csd_rev` selects the year mapping: base 1997, and with REV > 4 codes
/// 0–12 mean 2013–2025 (Linux adds 16 to years before 2010 when REV ≥ 5).
pub fn decode_cid(cid: &[u8; 16], ext_csd_rev: u8) -> CidFields {
    let pnm = cid[3..9]
        .iter()
        .map(|&b| {
            if (0x20..=0x7E).contains(&b) {
                char::from(b)
            } else {
                '.'
            }
        })
        .collect();
    let mut year = 1997 + u16::from(cid[14] & 0x0F);
    if ext_csd_rev > 4 && year < 2010 {
        year += 16;
    }
    CidFields {
        mid: cid[0],
        cbx: cid[1] & 0x03,
        oid: cid[2],
        pnm,
        prv: cid[9],
        psn: u32::from_be_bytes([cid[10], cid[11], cid[12], cid[13]]),
        mdt: cid[14],
        month: cid[14] >> 4,
        year,
        crc: cid[15] >> 1,
        crc_ok: cid[15] == crc7(&cid[..15]) << 1 | 1,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn example() -> CidModel {
        // facts §5.4: MID 0xAA, CBX BGA, OID 0, "EMU45A", PRV 1.0, PSN 0x12345678, Jan 2024.
        CidModel {
            mid: 0xAA,
            cbx: Cbx::Bga,
            oid: 0x00,
            pnm: "EMU45A".into(),
            prv: "1.0".into(),
            psn: 0x1234_5678,
            mdt: "2024-01".into(),
        }
    }

    fn hex(bytes: &[u8]) -> String {
        bytes.iter().map(|b| format!("{b:02x}")).collect()
    }

    #[test]
    fn cid_matches_the_facts_example_bytes() {
        assert_eq!(
            hex(&build_cid(&example(), 6)),
            "aa0100454d5534354110123456781bfb"
        );
    }

    #[test]
    fn cid_decodes_back_to_the_model() {
        let cid = build_cid(&example(), 6);
        let f = decode_cid(&cid, 6);
        assert_eq!(f.mid, 0xAA);
        assert_eq!(f.cbx, 1);
        assert_eq!(f.cbx_text(), "BGA (discrete embedded)");
        assert_eq!(f.oid, 0);
        assert_eq!(f.pnm, "EMU45A");
        assert_eq!(f.prv_text(), "1.0");
        assert_eq!(f.psn, 0x1234_5678);
        assert_eq!((f.year, f.month), (2024, 1));
        assert!(f.crc_ok);
        // The same code read with an old EXT_CSD_REV means 2008.
        assert_eq!(decode_cid(&cid, 4).year, 2008);
    }

    #[test]
    fn mdt_year_codes_cover_2010_to_2025_on_rev_6() {
        let mut model = example();
        for year in 2010..=2025u16 {
            model.mdt = format!("{year}-12");
            let f = decode_cid(&build_cid(&model, 6), 6);
            assert_eq!((f.year, f.month), (year, 12), "{year}");
        }
        model.mdt = "2013-01".into();
        assert_eq!(build_cid(&model, 6)[14], 0x10);
        model.mdt = "2010-01".into();
        assert_eq!(build_cid(&model, 6)[14], 0x1D);
    }

    #[test]
    fn cbx_and_crc_follow_the_fields() {
        let mut model = example();
        model.cbx = Cbx::Pop;
        let cid = build_cid(&model, 6);
        assert_eq!(cid[1], 0x02);
        assert!(decode_cid(&cid, 6).crc_ok);
        let mut corrupted = cid;
        corrupted[5] ^= 1;
        assert!(!decode_cid(&corrupted, 6).crc_ok);
    }

    #[test]
    fn malformed_text_is_encoded_without_panicking() {
        let mut model = example();
        model.pnm = "AB".into();
        model.prv = "x".into();
        model.mdt = "soon".into();
        let cid = build_cid(&model, 6);
        assert_eq!(&cid[3..9], b"AB    ");
        assert_eq!(cid[9], 0);
        assert_eq!(cid[14], 0);
    }
}
