//! OCR: operating conditions, returned in R3 to CMD1.
use crate::model::DeviceModel;

/// Bit 31: power-up done (0 = still busy).
pub const OCR_POWER_UP_DONE: u32 = 1 << 31;
/// Bits 30:29 = 10b: sector access mode.
pub const OCR_ACCESS_MODE_SECTOR: u32 = 0b10 << 29;
/// 2.7–3.6 V window (bits 23:15) and 1.70–1.95 V (bit 7): a dual-voltage part.
pub const OCR_VOLTAGE_WINDOW: u32 = (0x1FF << 15) | (1 << 7);

/// The OCR the card reports; `powered_up` sets bit 31.
pub fn ocr(model: &DeviceModel, powered_up: bool) -> u32 {
    let mut ocr = OCR_VOLTAGE_WINDOW;
    if model.sector_addressing() {
        ocr |= OCR_ACCESS_MODE_SECTOR;
    }
    if powered_up {
        ocr |= OCR_POWER_UP_DONE;
    }
    ocr
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dual_voltage_sector_mode_ocr_matches_the_typical_values() {
        let model = DeviceModel::load("generic-emmc45").unwrap();
        assert_eq!(ocr(&model, false), 0x40FF_8080);
        assert_eq!(ocr(&model, true), 0xC0FF_8080);
    }
}
