//! The 128-bit identification registers (CID, CSD) and the OCR, built from a device model.
//! CID and CSD are 16 bytes MSB first (byte 0 = bits 127:120) ending with CRC7 << 1 | 1,
//! exactly the 127 bits an R2 response carries after its header.

mod cid;
mod csd;
mod ocr;

pub use cid::{build_cid, decode_cid, CidFields};
pub use csd::{
    build_csd, decode_csd, CsdFields, CSD_COPY, CSD_ECC, CSD_FILE_FORMAT, CSD_FILE_FORMAT_GRP,
    CSD_ONE_TIME_PROGRAMMABLE, CSD_PERM_WRITE_PROTECT, CSD_TMP_WRITE_PROTECT, CSD_WRITABLE_MASK,
};
pub use ocr::{ocr, OCR_ACCESS_MODE_SECTOR, OCR_POWER_UP_DONE, OCR_VOLTAGE_WINDOW};
