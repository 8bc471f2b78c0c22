//! CSD. (Being written: see the registers helper.)
use crate::model::DeviceModel;

/// Byte 14 of the CSD (bits 15:8) holds the host-programmable bits (CMD27):
/// FILE_FORMAT_GRP, COPY, PERM_WRITE_PROTECT, TMP_WRITE_PROTECT, FILE_FORMAT, ECC.
pub const CSD_WRITABLE_MASK: u8 = 0xFF;
/// PERM_WRITE_PROTECT (CSD bit 13) within byte 14.
pub const CSD_PERM_WRITE_PROTECT: u8 = 1 << 5;
/// TMP_WRITE_PROTECT (CSD bit 12) within byte 14.
pub const CSD_TMP_WRITE_PROTECT: u8 = 1 << 4;

/// The CSD register for `model` with `writable` as byte 14 (the CMD27-programmable bits).
pub fn build_csd(model: &DeviceModel, writable: u8) -> [u8; 16] {
    let _ = (model, writable);
    [0u8; 16]
}
