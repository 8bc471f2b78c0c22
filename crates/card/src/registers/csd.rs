//! CSD: card-specific data in the eMMC layout (CSD_STRUCTURE 3, "version in EXT_CSD"),
//! returned in R2 to CMD9 (facts §5.2). Bit n of the register is bit n % 8 of byte
//! 15 − n / 8.
use crate::crc::crc7;
use crate::model::DeviceModel;

/// Byte 14 of the CSD (bits 15:8) holds the host-programmable bits (CMD27):
/// FILE_FORMAT_GRP, COPY, PERM_WRITE_PROTECT, TMP_WRITE_PROTECT, FILE_FORMAT, ECC.
///
/// In the MMC/eMMC layout every bit of 15:8 is programmable: FILE_FORMAT_GRP, COPY,
/// PERM_WRITE_PROTECT and FILE_FORMAT are R/W (one-time), TMP_WRITE_PROTECT and ECC are
/// R/W/E (facts §5.2; the MultiMediaCard CSD tables agree). QEMU masks byte 14 with 0xFC
/// because in the SD layout bits 9:8 are reserved; eMMC keeps ECC there.
pub const CSD_WRITABLE_MASK: u8 = 0xFF;
/// FILE_FORMAT_GRP (CSD bit 15) within byte 14. One-time programmable.
pub const CSD_FILE_FORMAT_GRP: u8 = 1 << 7;
/// COPY (CSD bit 14) within byte 14. One-time programmable.
pub const CSD_COPY: u8 = 1 << 6;
/// PERM_WRITE_PROTECT (CSD bit 13) within byte 14.
pub const CSD_PERM_WRITE_PROTECT: u8 = 1 << 5;
/// TMP_WRITE_PROTECT (CSD bit 12) within byte 14.
pub const CSD_TMP_WRITE_PROTECT: u8 = 1 << 4;
/// FILE_FORMAT (CSD bits 11:10) within byte 14. One-time programmable.
pub const CSD_FILE_FORMAT: u8 = 0b11 << 2;
/// ECC (CSD bits 9:8) within byte 14. Erasable (R/W/E).
pub const CSD_ECC: u8 = 0b11;
/// The bits of byte 14 whose access type is R/W, i.e. programmable once; TMP_WRITE_PROTECT
/// and ECC (R/W/E) may be changed any number of times.
pub const CSD_ONE_TIME_PROGRAMMABLE: u8 =
    CSD_FILE_FORMAT_GRP | CSD_COPY | CSD_PERM_WRITE_PROTECT | CSD_FILE_FORMAT;

/// READ_BL_LEN and WRITE_BL_LEN: 2^9 = 512-byte blocks.
const BL_LEN_512: u32 = 9;

fn put(r: &mut [u8; 16], hi: u32, lo: u32, value: u32) {
    for bit in lo..=hi {
        let (byte, shift) = (15 - (bit / 8) as usize, bit % 8);
        if value >> (bit - lo) & 1 != 0 {
            r[byte] |= 1 << shift;
        } else {
            r[byte] &= !(1 << shift);
        }
    }
}

fn get(r: &[u8; 16], hi: u32, lo: u32) -> u32 {
    (lo..=hi).rev().fold(0, |acc, bit| {
        let (byte, shift) = (15 - (bit / 8) as usize, bit % 8);
        acc << 1 | u32::from(r[byte] >> shift & 1)
    })
}

/// The CSD register for `model` with `writable` as byte 14 (the CMD27-programmable bits).
///
/// C_SIZE/C_SIZE_MULT come from [`DeviceModel::csd_c_size`]: (0xFFF, 7) for a
/// sector-addressed device, otherwise the exact encoding of SEC_COUNT. For a model that
/// failed validation (no exact encoding) the conventional (0xFFF, 7) is used.
pub fn build_csd(model: &DeviceModel, writable: u8) -> [u8; 16] {
    let csd = &model.csd;
    let (c_size, c_size_mult) = model.csd_c_size().unwrap_or((0xFFF, 7));
    let mut r = [0u8; 16];
    put(&mut r, 127, 126, 3); // CSD_STRUCTURE: version coded in EXT_CSD
    put(&mut r, 125, 122, 4); // SPEC_VERS: 4.x
    put(&mut r, 119, 112, u32::from(csd.taac));
    put(&mut r, 111, 104, u32::from(csd.nsac));
    put(&mut r, 103, 96, u32::from(csd.tran_speed));
    put(&mut r, 95, 84, u32::from(csd.ccc & 0xFFF));
    put(&mut r, 83, 80, BL_LEN_512); // READ_BL_LEN
                                     // READ_BL_PARTIAL, WRITE_BLK_MISALIGN, READ_BLK_MISALIGN, DSR_IMP (79:76) are 0.
    put(&mut r, 73, 62, u32::from(c_size));
    put(&mut r, 61, 59, u32::from(csd.vdd_r_curr_min & 7));
    put(&mut r, 58, 56, u32::from(csd.vdd_r_curr_max & 7));
    put(&mut r, 55, 53, u32::from(csd.vdd_w_curr_min & 7));
    put(&mut r, 52, 50, u32::from(csd.vdd_w_curr_max & 7));
    put(&mut r, 49, 47, u32::from(c_size_mult));
    put(&mut r, 46, 42, u32::from(csd.erase_grp_size & 31));
    put(&mut r, 41, 37, u32::from(csd.erase_grp_mult & 31));
    put(&mut r, 36, 32, u32::from(csd.wp_grp_size & 31));
    put(&mut r, 31, 31, u32::from(csd.wp_grp_enable));
    // DEFAULT_ECC (30:29) is 0.
    put(&mut r, 28, 26, u32::from(csd.r2w_factor & 7));
    put(&mut r, 25, 22, BL_LEN_512); // WRITE_BL_LEN
                                     // WRITE_BL_PARTIAL (21), CONTENT_PROT_APP (16) are 0.
    r[14] = writable & CSD_WRITABLE_MASK;
    r[15] = crc7(&r[..15]) << 1 | 1;
    r
}

/// The fields of a CSD register (eMMC layout), decoded; raw encodings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CsdFields {
    pub csd_structure: u8,
    pub spec_vers: u8,
    pub taac: u8,
    pub nsac: u8,
    pub tran_speed: u8,
    pub ccc: u16,
    pub read_bl_len: u8,
    pub read_bl_partial: bool,
    pub write_blk_misalign: bool,
    pub read_blk_misalign: bool,
    pub dsr_imp: bool,
    pub c_size: u16,
    pub vdd_r_curr_min: u8,
    pub vdd_r_curr_max: u8,
    pub vdd_w_curr_min: u8,
    pub vdd_w_curr_max: u8,
    pub c_size_mult: u8,
    pub erase_grp_size: u8,
    pub erase_grp_mult: u8,
    pub wp_grp_size: u8,
    pub wp_grp_enable: bool,
    pub default_ecc: u8,
    pub r2w_factor: u8,
    pub write_bl_len: u8,
    pub write_bl_partial: bool,
    pub content_prot_app: bool,
    pub file_format_grp: bool,
    pub copy: bool,
    pub perm_write_protect: bool,
    pub tmp_write_protect: bool,
    pub file_format: u8,
    pub ecc: u8,
    /// CRC7 as stored (bits 7:1).
    pub crc: u8,
    /// Whether the stored CRC7 matches bits 127:8 and bit 0 is 1.
    pub crc_ok: bool,
}

/// TAAC/TRAN_SPEED multipliers [6:3] in tenths (facts §5.3); index 0 is reserved.
const TAAC_TENTHS: [u32; 16] = [
    0, 10, 12, 13, 15, 20, 25, 30, 35, 40, 45, 50, 55, 60, 70, 80,
];
/// MMC uses 2.6 and 5.2 where SD uses 2.5 and 5.0.
const TRAN_TENTHS: [u32; 16] = [
    0, 10, 12, 13, 15, 20, 26, 30, 35, 40, 45, 52, 55, 60, 70, 80,
];

impl CsdFields {
    /// TAAC in nanoseconds, `None` for the reserved multiplier 0.
    pub fn taac_ns(&self) -> Option<u64> {
        let tenths = TAAC_TENTHS[usize::from(self.taac >> 3 & 0x0F)];
        (tenths != 0).then(|| u64::from(tenths) * 10u64.pow(u32::from(self.taac & 7)) / 10)
    }

    /// TRAN_SPEED in kHz (one bit per clock per line), `None` for reserved encodings.
    pub fn tran_speed_khz(&self) -> Option<u32> {
        let tenths = TRAN_TENTHS[usize::from(self.tran_speed >> 3 & 0x0F)];
        let unit = self.tran_speed & 7;
        (tenths != 0 && unit <= 3).then(|| tenths * 100 * 10u32.pow(u32::from(unit)) / 10)
    }

    /// (C_SIZE+1)·2^(C_SIZE_MULT+2)·2^READ_BL_LEN bytes. For a sector-addressed device this
    /// is the 1 GiB "see EXT_CSD" value, not the capacity.
    pub fn capacity_bytes(&self) -> u64 {
        (u64::from(self.c_size) + 1)
            << (u32::from(self.c_size_mult) + 2 + u32::from(self.read_bl_len))
    }
}

/// Decode a CSD in the eMMC layout.
pub fn decode_csd(csd: &[u8; 16]) -> CsdFields {
    let g = |hi, lo| get(csd, hi, lo);
    CsdFields {
        csd_structure: g(127, 126) as u8,
        spec_vers: g(125, 122) as u8,
        taac: g(119, 112) as u8,
        nsac: g(111, 104) as u8,
        tran_speed: g(103, 96) as u8,
        ccc: g(95, 84) as u16,
        read_bl_len: g(83, 80) as u8,
        read_bl_partial: g(79, 79) != 0,
        write_blk_misalign: g(78, 78) != 0,
        read_blk_misalign: g(77, 77) != 0,
        dsr_imp: g(76, 76) != 0,
        c_size: g(73, 62) as u16,
        vdd_r_curr_min: g(61, 59) as u8,
        vdd_r_curr_max: g(58, 56) as u8,
        vdd_w_curr_min: g(55, 53) as u8,
        vdd_w_curr_max: g(52, 50) as u8,
        c_size_mult: g(49, 47) as u8,
        erase_grp_size: g(46, 42) as u8,
        erase_grp_mult: g(41, 37) as u8,
        wp_grp_size: g(36, 32) as u8,
        wp_grp_enable: g(31, 31) != 0,
        default_ecc: g(30, 29) as u8,
        r2w_factor: g(28, 26) as u8,
        write_bl_len: g(25, 22) as u8,
        write_bl_partial: g(21, 21) != 0,
        content_prot_app: g(16, 16) != 0,
        file_format_grp: g(15, 15) != 0,
        copy: g(14, 14) != 0,
        perm_write_protect: g(13, 13) != 0,
        tmp_write_protect: g(12, 12) != 0,
        file_format: g(11, 10) as u8,
        ecc: g(9, 8) as u8,
        crc: g(7, 1) as u8,
        crc_ok: csd[15] == crc7(&csd[..15]) << 1 | 1,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::CsdModel;

    fn hex(bytes: &[u8]) -> String {
        bytes.iter().map(|b| format!("{b:02x}")).collect()
    }

    /// facts §5.4: TAAC 0x0E, NSAC 1, TRAN_SPEED 0x32, CCC 0x0F5, VDD currents 7/7/7/7,
    /// ERASE_GRP 31/31, WP_GRP_SIZE 15, WP_GRP_ENABLE 1, R2W 2, on a > 2 GiB device.
    fn example() -> DeviceModel {
        let mut model = DeviceModel::load("generic-emmc45").unwrap();
        model.csd = CsdModel {
            taac: 0x0E,
            nsac: 1,
            tran_speed: 0x32,
            ccc: 0x0F5,
            r2w_factor: 2,
            erase_grp_size: 31,
            erase_grp_mult: 31,
            wp_grp_size: 15,
            wp_grp_enable: true,
            vdd_r_curr_min: 7,
            vdd_r_curr_max: 7,
            vdd_w_curr_min: 7,
            vdd_w_curr_max: 7,
        };
        model.ext_csd.sec_count = 15_269_888;
        model
    }

    #[test]
    fn csd_matches_the_facts_example_bytes() {
        assert_eq!(
            hex(&build_csd(&example(), 0)),
            "d00e01320f5903ffffffffef8a400025"
        );
    }

    #[test]
    fn csd_decodes_back_to_the_model() {
        let f = decode_csd(&build_csd(&example(), 0));
        assert_eq!((f.csd_structure, f.spec_vers), (3, 4));
        assert_eq!(
            (f.taac, f.nsac, f.tran_speed, f.ccc),
            (0x0E, 1, 0x32, 0x0F5)
        );
        assert_eq!((f.read_bl_len, f.write_bl_len), (9, 9));
        assert_eq!((f.c_size, f.c_size_mult), (0xFFF, 7));
        assert_eq!(
            (
                f.vdd_r_curr_min,
                f.vdd_r_curr_max,
                f.vdd_w_curr_min,
                f.vdd_w_curr_max
            ),
            (7, 7, 7, 7)
        );
        assert_eq!(
            (f.erase_grp_size, f.erase_grp_mult, f.wp_grp_size),
            (31, 31, 15)
        );
        assert!(f.wp_grp_enable);
        assert_eq!(f.r2w_factor, 2);
        assert!(!f.read_bl_partial && !f.write_blk_misalign && !f.read_blk_misalign);
        assert!(!f.dsr_imp && !f.write_bl_partial && !f.content_prot_app);
        assert!(f.crc_ok);
        assert_eq!(f.taac_ns(), Some(1_000_000));
        assert_eq!(f.tran_speed_khz(), Some(26_000));
        assert_eq!(f.capacity_bytes(), 1 << 30);
    }

    #[test]
    fn writable_byte_is_masked_and_covered_by_the_crc() {
        let model = example();
        let csd = build_csd(&model, CSD_TMP_WRITE_PROTECT | CSD_COPY);
        assert_eq!(csd[14], 0x50);
        let f = decode_csd(&csd);
        assert!(f.tmp_write_protect && f.copy && !f.perm_write_protect);
        assert!(f.crc_ok);
        assert_ne!(csd[15], build_csd(&model, 0)[15]);
        // Every bit of 15:8 is programmable in the eMMC layout.
        let all = decode_csd(&build_csd(&model, 0xFF));
        assert!(all.file_format_grp && all.perm_write_protect);
        assert_eq!((all.file_format, all.ecc), (3, 3));
        assert_eq!(
            CSD_ONE_TIME_PROGRAMMABLE | CSD_TMP_WRITE_PROTECT | CSD_ECC,
            0xFF
        );
    }

    #[test]
    fn byte_addressed_capacity_is_exact() {
        let mut model = example();
        for sectors in [256 * 1024u32, 2 * 1024 * 1024, 1024, 4 * 4096] {
            model.ext_csd.sec_count = sectors;
            let f = decode_csd(&build_csd(&model, 0));
            assert_eq!(f.capacity_bytes(), u64::from(sectors) * 512, "{sectors}");
        }
    }
}
