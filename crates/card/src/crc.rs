//! The two CRCs of the MMC bus: CRC7 on commands, responses and the CID/CSD registers,
//! and CRC16-CCITT (one per DAT line) on data blocks.

/// CRC7 with polynomial x^7 + x^3 + 1 and initial value 0, over whole bytes MSB first.
/// The on-wire byte is `crc7(..) << 1 | 1`.
pub fn crc7(bytes: &[u8]) -> u8 {
    let mut crc: u8 = 0;
    for &byte in bytes {
        for bit in (0..8).rev() {
            let inbit = (byte >> bit) & 1;
            let top = (crc >> 6) & 1;
            crc = (crc << 1) & 0x7f;
            if inbit ^ top != 0 {
                crc ^= 0x09;
            }
        }
    }
    crc
}

/// CRC16-CCITT with polynomial x^16 + x^12 + x^5 + 1 and initial value 0, MSB first.
pub fn crc16(bytes: &[u8]) -> u16 {
    let mut crc: u16 = 0;
    for &byte in bytes {
        crc ^= u16::from(byte) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
        }
    }
    crc
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame_crc(frame: [u8; 5]) -> u8 {
        crc7(&frame) << 1 | 1
    }

    #[test]
    fn crc7_matches_command_test_vectors() {
        // Vectors from the facts sheet §12.7.
        assert_eq!(frame_crc([0x40, 0, 0, 0, 0]), 0x95);
        assert_eq!(frame_crc([0x41, 0x40, 0xff, 0x80, 0x80]), 0x89);
        assert_eq!(frame_crc([0x42, 0, 0, 0, 0]), 0x4d);
        assert_eq!(frame_crc([0x43, 0, 1, 0, 0]), 0x7f);
        assert_eq!(frame_crc([0x47, 0, 1, 0, 0]), 0xdd);
        assert_eq!(frame_crc([0x48, 0, 0, 0, 0]), 0xc3);
        assert_eq!(frame_crc([0x4d, 0, 1, 0, 0]), 0x53);
        assert_eq!(frame_crc([0x46, 0x03, 0xb7, 0x02, 0]), 0x17);
        assert_eq!(frame_crc([0x0d, 0, 0, 0x09, 0]), 0x3f);
        assert_eq!(frame_crc([0x03, 0, 0, 0x05, 0]), 0xfb);
    }

    #[test]
    fn crc16_matches_data_test_vectors() {
        assert_eq!(crc16(&[0u8; 512]), 0x0000);
        assert_eq!(crc16(&[0xffu8; 512]), 0x7fa1);
    }
}
