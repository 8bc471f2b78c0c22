//! The 512-byte Extended CSD register: offsets and bit names as JESD84-B45 spells them,
//! the field table (access type, size, meaning) used by CMD6 and by `inspect`, the
//! companion table of CMD6 write rules (`rules`), and the initial contents built from a
//! device model.

mod build;
pub mod fields;
pub(crate) mod rules;

pub use build::build_ext_csd;

/// Size of the register in bytes.
pub const EXT_CSD_LEN: usize = 512;

// ---- Modes segment [0..191] -------------------------------------------------------------
pub const FLUSH_CACHE: usize = 32;
pub const CACHE_CTRL: usize = 33;
pub const POWER_OFF_NOTIFICATION: usize = 34;
pub const PACKED_FAILURE_INDEX: usize = 35;
pub const PACKED_COMMAND_STATUS: usize = 36;
/// CONTEXT_CONF[1..15] at 37..=51 (byte 37 = context 1).
pub const CONTEXT_CONF: usize = 37;
pub const EXT_PARTITIONS_ATTRIBUTE: usize = 52;
pub const EXCEPTION_EVENTS_STATUS: usize = 54;
pub const EXCEPTION_EVENTS_CTRL: usize = 56;
pub const DYNCAP_NEEDED: usize = 58;
pub const CLASS_6_CTRL: usize = 59;
pub const INI_TIMEOUT_EMU: usize = 60;
pub const DATA_SECTOR_SIZE: usize = 61;
pub const USE_NATIVE_SECTOR: usize = 62;
pub const NATIVE_SECTOR_SIZE: usize = 63;
/// VENDOR_SPECIFIC_FIELD at 64..=127.
pub const VENDOR_SPECIFIC_FIELD: usize = 64;
pub const PROGRAM_CID_CSD_DDR_SUPPORT: usize = 130;
pub const PERIODIC_WAKEUP: usize = 131;
pub const TCASE_SUPPORT: usize = 132;
pub const SEC_BAD_BLK_MGMNT: usize = 134;
pub const ENH_START_ADDR: usize = 136;
pub const ENH_SIZE_MULT: usize = 140;
/// GP_SIZE_MULT_1..4 at 143..=154, three bytes each, LSB first.
pub const GP_SIZE_MULT: usize = 143;
pub const PARTITION_SETTING_COMPLETED: usize = 155;
pub const PARTITIONS_ATTRIBUTE: usize = 156;
pub const MAX_ENH_SIZE_MULT: usize = 157;
pub const PARTITIONING_SUPPORT: usize = 160;
pub const HPI_MGMT: usize = 161;
pub const RST_N_FUNCTION: usize = 162;
pub const BKOPS_EN: usize = 163;
pub const BKOPS_START: usize = 164;
pub const SANITIZE_START: usize = 165;
pub const WR_REL_PARAM: usize = 166;
pub const WR_REL_SET: usize = 167;
pub const RPMB_SIZE_MULT: usize = 168;
pub const FW_CONFIG: usize = 169;
pub const USER_WP: usize = 171;
pub const BOOT_WP: usize = 173;
pub const BOOT_WP_STATUS: usize = 174;
pub const ERASE_GROUP_DEF: usize = 175;
pub const BOOT_BUS_CONDITIONS: usize = 177;
pub const BOOT_CONFIG_PROT: usize = 178;
pub const PARTITION_CONFIG: usize = 179;
pub const ERASED_MEM_CONT: usize = 181;
pub const BUS_WIDTH: usize = 183;
pub const HS_TIMING: usize = 185;
pub const POWER_CLASS: usize = 187;
pub const CMD_SET_REV: usize = 189;
pub const CMD_SET: usize = 191;

// ---- Properties segment [192..511] (read-only) -----------------------------------------
/// First byte of the read-only properties segment; CMD6 at or above it is a SWITCH_ERROR.
pub const PROPERTIES_SEGMENT: usize = 192;
pub const EXT_CSD_REV: usize = 192;
pub const CSD_STRUCTURE: usize = 194;
pub const DEVICE_TYPE: usize = 196;
pub const DRIVER_STRENGTH: usize = 197;
pub const OUT_OF_INTERRUPT_TIME: usize = 198;
pub const PARTITION_SWITCH_TIME: usize = 199;
pub const PWR_CL_52_195: usize = 200;
pub const PWR_CL_26_195: usize = 201;
pub const PWR_CL_52_360: usize = 202;
pub const PWR_CL_26_360: usize = 203;
pub const MIN_PERF_R_4_26: usize = 205;
pub const MIN_PERF_W_4_26: usize = 206;
pub const MIN_PERF_R_8_26_4_52: usize = 207;
pub const MIN_PERF_W_8_26_4_52: usize = 208;
pub const MIN_PERF_R_8_52: usize = 209;
pub const MIN_PERF_W_8_52: usize = 210;
pub const SEC_COUNT: usize = 212;
pub const S_A_TIMEOUT: usize = 217;
pub const S_C_VCCQ: usize = 219;
pub const S_C_VCC: usize = 220;
pub const HC_WP_GRP_SIZE: usize = 221;
pub const REL_WR_SEC_C: usize = 222;
pub const ERASE_TIMEOUT_MULT: usize = 223;
pub const HC_ERASE_GRP_SIZE: usize = 224;
pub const ACC_SIZE: usize = 225;
pub const BOOT_SIZE_MULT: usize = 226;
pub const BOOT_INFO: usize = 228;
pub const SEC_TRIM_MULT: usize = 229;
pub const SEC_ERASE_MULT: usize = 230;
pub const SEC_FEATURE_SUPPORT: usize = 231;
pub const TRIM_MULT: usize = 232;
pub const MIN_PERF_DDR_R_8_52: usize = 234;
pub const MIN_PERF_DDR_W_8_52: usize = 235;
pub const PWR_CL_200_195: usize = 236;
pub const PWR_CL_200_360: usize = 237;
pub const PWR_CL_DDR_52_195: usize = 238;
pub const PWR_CL_DDR_52_360: usize = 239;
pub const INI_TIMEOUT_AP: usize = 241;
pub const CORRECTLY_PRG_SECTORS_NUM: usize = 242;
pub const BKOPS_STATUS: usize = 246;
pub const POWER_OFF_LONG_TIME: usize = 247;
pub const GENERIC_CMD6_TIME: usize = 248;
pub const CACHE_SIZE: usize = 249;
pub const EXT_SUPPORT: usize = 494;
pub const LARGE_UNIT_SIZE_M1: usize = 495;
pub const CONTEXT_CAPABILITIES: usize = 496;
pub const TAG_RES_SIZE: usize = 497;
pub const TAG_UNIT_SIZE: usize = 498;
pub const DATA_TAG_SUPPORT: usize = 499;
pub const MAX_PACKED_WRITES: usize = 500;
pub const MAX_PACKED_READS: usize = 501;
pub const BKOPS_SUPPORT: usize = 502;
pub const HPI_FEATURES: usize = 503;
pub const S_CMD_SET: usize = 504;

// ---- Bit values -------------------------------------------------------------------------
/// EXCEPTION_EVENTS_STATUS / EXCEPTION_EVENTS_CTRL bits.
pub const EE_URGENT_BKOPS: u16 = 1 << 0;
pub const EE_DYNCAP_NEEDED: u16 = 1 << 1;
pub const EE_SYSPOOL_EXHAUSTED: u16 = 1 << 2;
pub const EE_PACKED_FAILURE: u16 = 1 << 3;
/// PACKED_COMMAND_STATUS bits.
pub const PACKED_STATUS_ERROR: u8 = 1 << 0;
pub const PACKED_STATUS_INDEXED_ERROR: u8 = 1 << 1;
/// WR_REL_PARAM bits.
pub const HS_CTRL_REL: u8 = 1 << 0;
pub const EN_REL_WR: u8 = 1 << 2;
/// SEC_FEATURE_SUPPORT bits.
pub const SECURE_ER_EN: u8 = 1 << 0;
pub const SEC_BD_BLK_EN: u8 = 1 << 2;
pub const SEC_GB_CL_EN: u8 = 1 << 4;
pub const SEC_SANITIZE: u8 = 1 << 6;
/// HPI_FEATURES bits.
pub const HPI_SUPPORT: u8 = 1 << 0;
pub const HPI_IMPLEMENTATION_CMD12: u8 = 1 << 1;
/// DEVICE_TYPE bits.
pub const DEVICE_TYPE_HS_26: u8 = 1 << 0;
pub const DEVICE_TYPE_HS_52: u8 = 1 << 1;
pub const DEVICE_TYPE_DDR_52_1V8: u8 = 1 << 2;
pub const DEVICE_TYPE_DDR_52_1V2: u8 = 1 << 3;
pub const DEVICE_TYPE_HS200_1V8: u8 = 1 << 4;
pub const DEVICE_TYPE_HS200_1V2: u8 = 1 << 5;
/// PARTITIONING_SUPPORT bits.
pub const PARTITIONING_EN: u8 = 1 << 0;
pub const ENH_ATTRIBUTE_EN: u8 = 1 << 1;
pub const EXT_ATTRIBUTE_EN: u8 = 1 << 2;
/// BOOT_WP bits.
pub const B_PWR_WP_EN: u8 = 1 << 0;
pub const B_PWR_WP_SEC_SEL: u8 = 1 << 1;
pub const B_PERM_WP_EN: u8 = 1 << 2;
pub const B_PERM_WP_SEC_SEL: u8 = 1 << 3;
pub const B_PERM_WP_DIS: u8 = 1 << 4;
pub const B_PWR_WP_DIS: u8 = 1 << 6;
pub const B_SEC_WP_SEL: u8 = 1 << 7;
/// USER_WP bits.
pub const US_PWR_WP_EN: u8 = 1 << 0;
pub const US_PERM_WP_EN: u8 = 1 << 2;
pub const US_PWR_WP_DIS: u8 = 1 << 3;
pub const US_PERM_WP_DIS: u8 = 1 << 4;
pub const CD_PERM_WP_DIS: u8 = 1 << 6;
pub const PERM_PSWD_DIS: u8 = 1 << 7;
/// BOOT_CONFIG_PROT bits.
pub const PWR_BOOT_CONFIG_PROT: u8 = 1 << 0;
pub const PERM_BOOT_CONFIG_PROT: u8 = 1 << 4;
/// BKOPS_EN bits.
pub const BKOPS_MANUAL_EN: u8 = 1 << 0;
/// BKOPS_SUPPORT bit.
pub const BKOPS_SUPPORTED: u8 = 1 << 0;
/// CACHE_CTRL bit.
pub const CACHE_EN: u8 = 1 << 0;
/// HPI_MGMT bit.
pub const HPI_EN: u8 = 1 << 0;
/// POWER_OFF_NOTIFICATION values.
pub const NO_POWER_NOTIFICATION: u8 = 0;
pub const POWERED_ON: u8 = 1;
pub const POWER_OFF_SHORT: u8 = 2;
pub const POWER_OFF_LONG: u8 = 3;

/// Read a little-endian multi-byte field.
pub fn read_le(ext_csd: &[u8; EXT_CSD_LEN], offset: usize, len: usize) -> u32 {
    ext_csd[offset..offset + len]
        .iter()
        .rev()
        .fold(0u32, |acc, &b| (acc << 8) | u32::from(b))
}

/// Write a little-endian multi-byte field.
pub fn write_le(ext_csd: &mut [u8; EXT_CSD_LEN], offset: usize, len: usize, value: u32) {
    for (i, byte) in ext_csd[offset..offset + len].iter_mut().enumerate() {
        *byte = (value >> (8 * i)) as u8;
    }
}
