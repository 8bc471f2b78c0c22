//! Replay Protected Memory Block. (Being written: see the RPMB helper.)

use hmac::{Hmac, Mac};
use serde::{Deserialize, Serialize};
use sha2::Sha256;

/// One RPMB data frame is one 512-byte block.
pub const FRAME_LEN: usize = 512;
/// RPMB addresses count 256-byte half sectors.
pub const HALF_SECTOR: usize = 256;

/// Length of the authentication key and of the MAC.
pub const KEY_LEN: usize = 32;
/// Length of the nonce.
pub const NONCE_LEN: usize = 16;
/// Length of the stuff bytes at the start of a frame.
pub const STUFF_LEN: usize = 196;

/// Offsets of the frame fields, counted from the first byte transferred (facts §11.3).
pub const KEY_MAC_OFFSET: usize = 196;
pub const DATA_OFFSET: usize = 228;
pub const NONCE_OFFSET: usize = 484;
pub const WRITE_COUNTER_OFFSET: usize = 500;
pub const ADDRESS_OFFSET: usize = 504;
pub const BLOCK_COUNT_OFFSET: usize = 506;
pub const RESULT_OFFSET: usize = 508;
pub const REQ_RESP_OFFSET: usize = 510;
/// Bytes of each frame the MAC covers: data through request/response type.
pub const MAC_INPUT_LEN: usize = FRAME_LEN - DATA_OFFSET;

// Request message types (host to device).
pub const AUTHENTICATION_KEY_PROGRAMMING: u16 = 0x0001;
pub const READ_WRITE_COUNTER: u16 = 0x0002;
pub const AUTHENTICATED_DATA_WRITE: u16 = 0x0003;
pub const AUTHENTICATED_DATA_READ: u16 = 0x0004;
pub const RESULT_READ: u16 = 0x0005;

// Response message types (device to host): the request type shifted into the high byte.
pub const AUTHENTICATION_KEY_PROGRAMMING_RESPONSE: u16 = 0x0100;
pub const READ_WRITE_COUNTER_RESPONSE: u16 = 0x0200;
pub const AUTHENTICATED_DATA_WRITE_RESPONSE: u16 = 0x0300;
pub const AUTHENTICATED_DATA_READ_RESPONSE: u16 = 0x0400;

// Operation results (low 7 bits), and the write-counter-expired flag ORed into them.
pub const OPERATION_OK: u16 = 0x00;
pub const GENERAL_FAILURE: u16 = 0x01;
pub const AUTHENTICATION_FAILURE: u16 = 0x02;
pub const COUNTER_FAILURE: u16 = 0x03;
pub const ADDRESS_FAILURE: u16 = 0x04;
pub const WRITE_FAILURE: u16 = 0x05;
pub const READ_FAILURE: u16 = 0x06;
pub const AUTHENTICATION_KEY_NOT_YET_PROGRAMMED: u16 = 0x07;
pub const WRITE_COUNTER_EXPIRED: u16 = 0x80;

/// The write counter value at which the counter has expired.
pub const WRITE_COUNTER_MAX: u32 = u32::MAX;
/// Most frames one authenticated data write may carry on an eMMC 4.5 device (256 B or
/// 512 B of data; 32 frames need EN_RPMB_REL_WR, an eMMC 5.1 feature).
pub const MAX_WRITE_FRAMES: usize = 2;

/// One RPMB data frame, decoded. Multi-byte fields are big-endian on the wire.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RpmbFrame {
    pub stuff: [u8; STUFF_LEN],
    /// The key (key programming request) or the MAC (last frame of a message).
    pub key_mac: [u8; KEY_LEN],
    pub data: [u8; HALF_SECTOR],
    pub nonce: [u8; NONCE_LEN],
    pub write_counter: u32,
    pub address: u16,
    pub block_count: u16,
    pub result: u16,
    pub req_resp: u16,
}

impl Default for RpmbFrame {
    fn default() -> RpmbFrame {
        RpmbFrame {
            stuff: [0; STUFF_LEN],
            key_mac: [0; KEY_LEN],
            data: [0; HALF_SECTOR],
            nonce: [0; NONCE_LEN],
            write_counter: 0,
            address: 0,
            block_count: 0,
            result: 0,
            req_resp: 0,
        }
    }
}

fn be16(bytes: &[u8; FRAME_LEN], at: usize) -> u16 {
    u16::from_be_bytes([bytes[at], bytes[at + 1]])
}

impl RpmbFrame {
    /// A zeroed frame carrying only the request/response type.
    pub fn with_type(req_resp: u16) -> RpmbFrame {
        RpmbFrame {
            req_resp,
            ..RpmbFrame::default()
        }
    }

    /// Decode a frame. Every byte pattern is a valid frame; nothing is checked here.
    pub fn parse(bytes: &[u8; FRAME_LEN]) -> RpmbFrame {
        let mut f = RpmbFrame::default();
        f.stuff.copy_from_slice(&bytes[..KEY_MAC_OFFSET]);
        f.key_mac
            .copy_from_slice(&bytes[KEY_MAC_OFFSET..DATA_OFFSET]);
        f.data.copy_from_slice(&bytes[DATA_OFFSET..NONCE_OFFSET]);
        f.nonce
            .copy_from_slice(&bytes[NONCE_OFFSET..WRITE_COUNTER_OFFSET]);
        f.write_counter = u32::from_be_bytes([
            bytes[WRITE_COUNTER_OFFSET],
            bytes[WRITE_COUNTER_OFFSET + 1],
            bytes[WRITE_COUNTER_OFFSET + 2],
            bytes[WRITE_COUNTER_OFFSET + 3],
        ]);
        f.address = be16(bytes, ADDRESS_OFFSET);
        f.block_count = be16(bytes, BLOCK_COUNT_OFFSET);
        f.result = be16(bytes, RESULT_OFFSET);
        f.req_resp = be16(bytes, REQ_RESP_OFFSET);
        f
    }

    /// Decode the first frame of `bytes`; `None` when fewer than 512 bytes are given.
    pub fn parse_slice(bytes: &[u8]) -> Option<RpmbFrame> {
        bytes
            .get(..FRAME_LEN)
            .and_then(|b| <&[u8; FRAME_LEN]>::try_from(b).ok())
            .map(RpmbFrame::parse)
    }

    /// Encode the frame as it travels on the bus.
    pub fn to_bytes(&self) -> [u8; FRAME_LEN] {
        let mut b = [0u8; FRAME_LEN];
        self.write_to(&mut b);
        b
    }

    /// Encode the frame into `out`.
    pub fn write_to(&self, out: &mut [u8; FRAME_LEN]) {
        out[..KEY_MAC_OFFSET].copy_from_slice(&self.stuff);
        out[KEY_MAC_OFFSET..DATA_OFFSET].copy_from_slice(&self.key_mac);
        out[DATA_OFFSET..NONCE_OFFSET].copy_from_slice(&self.data);
        out[NONCE_OFFSET..WRITE_COUNTER_OFFSET].copy_from_slice(&self.nonce);
        out[WRITE_COUNTER_OFFSET..ADDRESS_OFFSET]
            .copy_from_slice(&self.write_counter.to_be_bytes());
        out[ADDRESS_OFFSET..BLOCK_COUNT_OFFSET].copy_from_slice(&self.address.to_be_bytes());
        out[BLOCK_COUNT_OFFSET..RESULT_OFFSET].copy_from_slice(&self.block_count.to_be_bytes());
        out[RESULT_OFFSET..REQ_RESP_OFFSET].copy_from_slice(&self.result.to_be_bytes());
        out[REQ_RESP_OFFSET..].copy_from_slice(&self.req_resp.to_be_bytes());
    }
}

/// Encode `frames` back to back.
pub fn frames_to_bytes(frames: &[RpmbFrame]) -> Vec<u8> {
    frames.iter().flat_map(|f| f.to_bytes()).collect()
}

/// The response type that answers request type `req` (0x0001 → 0x0100, …).
pub const fn response_type(req: u16) -> u16 {
    req << 8
}

fn hmac_over(key: &[u8; KEY_LEN], frames: &[u8]) -> Hmac<Sha256> {
    // HMAC takes keys of any length, so this cannot fail.
    let mut mac = <Hmac<Sha256> as Mac>::new_from_slice(key).expect("HMAC accepts any key length");
    for frame in frames.chunks_exact(FRAME_LEN) {
        mac.update(&frame[DATA_OFFSET..]);
    }
    mac
}

/// The RPMB MAC: HMAC-SHA256 keyed with `key` over bytes 228..512 of each whole frame in
/// `frames`, in order. Trailing bytes that do not make a whole frame are ignored.
pub fn rpmb_mac(key: &[u8; KEY_LEN], frames: &[u8]) -> [u8; KEY_LEN] {
    hmac_over(key, frames).finalize().into_bytes().into()
}

/// Whether `mac` is the RPMB MAC of `frames` under `key` (compared in constant time).
pub fn rpmb_mac_matches(key: &[u8; KEY_LEN], frames: &[u8], mac: &[u8; KEY_LEN]) -> bool {
    hmac_over(key, frames).verify_slice(mac).is_ok()
}

/// Put the MAC of `frames` into the last frame's key/MAC field (the other frames' MAC
/// fields are left as they are; they are not covered by the MAC).
pub fn sign_frames(key: &[u8; KEY_LEN], frames: &mut [RpmbFrame]) {
    let mac = rpmb_mac(key, &frames_to_bytes(frames));
    if let Some(last) = frames.last_mut() {
        last.key_mac = mac;
    }
}

/// RPMB state that survives power loss; the card saves it in the image's sidecar.
///
/// In TOML the key is a 64-digit hex string (`key = "00ff…"`), absent until programmed.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RpmbPersistent {
    /// The authentication key, once programmed.
    #[serde(default, with = "hex_key", skip_serializing_if = "Option::is_none")]
    pub key: Option<[u8; KEY_LEN]>,
    #[serde(default)]
    pub write_counter: u32,
}

/// Serde for the key as a hex string rather than an array of 32 integers.
mod hex_key {
    use super::KEY_LEN;
    use serde::{de::Error as _, Deserialize, Deserializer, Serializer};

    const DIGITS: &[u8; 16] = b"0123456789abcdef";

    pub fn serialize<S: Serializer>(key: &Option<[u8; KEY_LEN]>, s: S) -> Result<S::Ok, S::Error> {
        match key {
            Some(key) => {
                let hex: String = key
                    .iter()
                    .flat_map(|b| [DIGITS[usize::from(b >> 4)], DIGITS[usize::from(b & 0xF)]])
                    .map(char::from)
                    .collect();
                s.serialize_str(&hex)
            }
            None => s.serialize_none(),
        }
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<[u8; KEY_LEN]>, D::Error> {
        match Option::<String>::deserialize(d)? {
            None => Ok(None),
            Some(s) => parse(&s).map(Some).ok_or_else(|| {
                D::Error::custom(format!(
                    "RPMB key must be {} hex digits, got {:?}",
                    2 * KEY_LEN,
                    s
                ))
            }),
        }
    }

    fn nibble(c: u8) -> Option<u8> {
        match c {
            b'0'..=b'9' => Some(c - b'0'),
            b'a'..=b'f' => Some(c - b'a' + 10),
            b'A'..=b'F' => Some(c - b'A' + 10),
            _ => None,
        }
    }

    pub(super) fn parse(s: &str) -> Option<[u8; KEY_LEN]> {
        let digits = s.as_bytes();
        if digits.len() != 2 * KEY_LEN {
            return None;
        }
        let mut key = [0u8; KEY_LEN];
        for (byte, pair) in key.iter_mut().zip(digits.chunks_exact(2)) {
            *byte = nibble(pair[0])? << 4 | nibble(pair[1])?;
        }
        Some(key)
    }
}

/// The RPMB partition's data in 256-byte half sectors, supplied by the card.
/// Methods return `false` when the medium failed (the frame then reports a failure).
pub trait RpmbMedium {
    fn read(&mut self, address: u16, buf: &mut [u8]) -> bool;
    fn write(&mut self, address: u16, data: &[u8]) -> bool;
}

/// Frames the card could not take at all (the card reports R1 ERROR).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RpmbBusError {
    #[error("RPMB transfer of {0} bytes is not a whole number of frames")]
    NotWholeFrames(usize),
}

#[derive(Debug, Clone)]
pub struct Rpmb {
    persistent: RpmbPersistent,
}

impl Rpmb {
    /// An RPMB partition of `size_bytes` (RPMB_SIZE_MULT × 128 KiB) with its saved state.
    pub fn new(size_bytes: u64, persistent: RpmbPersistent) -> Rpmb {
        let _ = size_bytes;
        Rpmb { persistent }
    }

    pub fn persistent(&self) -> &RpmbPersistent {
        &self.persistent
    }

    /// Forget the volatile state (pending request, last result) on power cycle or CMD0.
    pub fn reset_volatile(&mut self) {}

    /// A write transfer (CMD23 + CMD25) of whole frames completed; `reliable` is CMD23 bit 31.
    /// Returns `Ok(true)` when the persistent state changed and must be saved.
    pub fn write_frames(
        &mut self,
        frames: &[u8],
        reliable: bool,
        medium: &mut dyn RpmbMedium,
    ) -> Result<bool, RpmbBusError> {
        let _ = (frames, reliable, medium);
        Ok(false)
    }

    /// A read transfer (CMD23 + CMD18): fill `out` (whole frames) with the response to the
    /// pending request.
    pub fn read_frames(
        &mut self,
        out: &mut [u8],
        medium: &mut dyn RpmbMedium,
    ) -> Result<(), RpmbBusError> {
        let _ = (out, medium);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// HMAC-SHA256 computed straight with the hmac crate, independently of `rpmb_mac`.
    fn reference_mac(key: &[u8; 32], frames: &[u8]) -> [u8; 32] {
        let mut m = <Hmac<Sha256> as Mac>::new_from_slice(key).unwrap();
        for f in frames.chunks(512) {
            m.update(&f[228..512]);
        }
        m.finalize().into_bytes().into()
    }

    #[test]
    fn frame_fields_sit_at_the_documented_big_endian_offsets() {
        let mut raw = [0u8; 512];
        raw[0] = 0xAA;
        raw[195] = 0xAB;
        raw[196] = 0x11;
        raw[227] = 0x12;
        raw[228] = 0x21;
        raw[483] = 0x22;
        raw[484] = 0x31;
        raw[499] = 0x32;
        raw[500..504].copy_from_slice(&[0x01, 0x02, 0x03, 0x04]);
        raw[504..506].copy_from_slice(&[0x05, 0x06]);
        raw[506..508].copy_from_slice(&[0x07, 0x08]);
        raw[508..510].copy_from_slice(&[0x00, 0x83]);
        raw[510..512].copy_from_slice(&[0x03, 0x00]);
        let f = RpmbFrame::parse(&raw);
        assert_eq!((f.stuff[0], f.stuff[195]), (0xAA, 0xAB));
        assert_eq!((f.key_mac[0], f.key_mac[31]), (0x11, 0x12));
        assert_eq!((f.data[0], f.data[255]), (0x21, 0x22));
        assert_eq!((f.nonce[0], f.nonce[15]), (0x31, 0x32));
        assert_eq!(f.write_counter, 0x0102_0304);
        assert_eq!(f.address, 0x0506);
        assert_eq!(f.block_count, 0x0708);
        assert_eq!(f.result, WRITE_COUNTER_EXPIRED | COUNTER_FAILURE);
        assert_eq!(f.req_resp, AUTHENTICATED_DATA_WRITE_RESPONSE);
        assert_eq!(f.to_bytes(), raw);
    }

    #[test]
    fn frame_codec_round_trips_arbitrary_bytes() {
        let mut raw = [0u8; 512];
        let mut x: u32 = 0x1234_5678;
        for b in raw.iter_mut() {
            x = x.wrapping_mul(1_103_515_245).wrapping_add(12_345);
            *b = (x >> 16) as u8;
        }
        assert_eq!(RpmbFrame::parse(&raw).to_bytes(), raw);
        assert_eq!(RpmbFrame::parse_slice(&raw[..511]), None);
        assert_eq!(RpmbFrame::parse_slice(&raw), Some(RpmbFrame::parse(&raw)));
    }

    #[test]
    fn codes_match_the_spec_values() {
        assert_eq!(
            [
                AUTHENTICATION_KEY_PROGRAMMING,
                READ_WRITE_COUNTER,
                AUTHENTICATED_DATA_WRITE,
                AUTHENTICATED_DATA_READ,
                RESULT_READ
            ],
            [1, 2, 3, 4, 5]
        );
        assert_eq!(
            response_type(AUTHENTICATION_KEY_PROGRAMMING),
            AUTHENTICATION_KEY_PROGRAMMING_RESPONSE
        );
        assert_eq!(response_type(READ_WRITE_COUNTER), 0x0200);
        assert_eq!(response_type(AUTHENTICATED_DATA_WRITE), 0x0300);
        assert_eq!(response_type(AUTHENTICATED_DATA_READ), 0x0400);
        assert_eq!(
            [
                OPERATION_OK,
                GENERAL_FAILURE,
                AUTHENTICATION_FAILURE,
                COUNTER_FAILURE,
                ADDRESS_FAILURE,
                WRITE_FAILURE,
                READ_FAILURE,
                AUTHENTICATION_KEY_NOT_YET_PROGRAMMED,
                WRITE_COUNTER_EXPIRED
            ],
            [0, 1, 2, 3, 4, 5, 6, 7, 0x80]
        );
    }

    #[test]
    fn mac_covers_bytes_228_to_512_of_every_frame() {
        let key = [0x5Au8; 32];
        let mut frames = vec![0u8; 1024];
        for (i, b) in frames.iter_mut().enumerate() {
            *b = (i * 7) as u8;
        }
        let mac = rpmb_mac(&key, &frames);
        assert_eq!(mac, reference_mac(&key, &frames));
        assert!(rpmb_mac_matches(&key, &frames, &mac));
        // Stuff bytes and key/MAC field are not covered ...
        let mut other = frames.clone();
        other[0] ^= 1;
        other[512 + 227] ^= 1;
        assert_eq!(rpmb_mac(&key, &other), mac);
        // ... every byte from 228 on, in every frame, is.
        for at in [228, 511, 512 + 228, 1023] {
            let mut other = frames.clone();
            other[at] ^= 1;
            assert_ne!(rpmb_mac(&key, &other), mac, "byte {at}");
            assert!(!rpmb_mac_matches(&key, &other, &mac));
        }
        // A trailing partial frame is ignored, not a panic.
        let mut longer = frames.clone();
        longer.extend_from_slice(&[9; 300]);
        assert_eq!(rpmb_mac(&key, &longer), mac);
    }

    #[test]
    fn sign_frames_puts_the_mac_of_all_frames_in_the_last() {
        let key = [3u8; 32];
        let mut frames = vec![RpmbFrame::with_type(AUTHENTICATED_DATA_WRITE); 2];
        frames[0].data = [1; 256];
        frames[1].data = [2; 256];
        sign_frames(&key, &mut frames);
        assert_eq!(frames[0].key_mac, [0; 32]);
        let bytes = frames_to_bytes(&frames);
        assert_eq!(frames[1].key_mac, reference_mac(&key, &bytes));
    }

    #[test]
    fn persistent_key_round_trips_through_toml_as_hex() {
        let mut key = [0u8; 32];
        for (i, b) in key.iter_mut().enumerate() {
            *b = (i as u8).wrapping_mul(37) ^ 0xF0;
        }
        let p = RpmbPersistent {
            key: Some(key),
            write_counter: 0xDEAD_BEEF,
        };
        let text = toml::to_string(&p).unwrap();
        let expected: String = key.iter().map(|b| format!("{b:02x}")).collect();
        assert!(text.contains(&format!("key = \"{expected}\"")), "{text}");
        assert!(text.contains("write_counter = 3735928559"), "{text}");
        assert_eq!(toml::from_str::<RpmbPersistent>(&text).unwrap(), p);
        // Upper-case digits are accepted too.
        let upper = text.replace(&expected, &expected.to_uppercase());
        assert_eq!(toml::from_str::<RpmbPersistent>(&upper).unwrap(), p);
    }

    #[test]
    fn persistent_without_key_omits_it_and_reads_back() {
        let p = RpmbPersistent {
            key: None,
            write_counter: 7,
        };
        let text = toml::to_string(&p).unwrap();
        assert!(!text.contains("key"), "{text}");
        assert_eq!(toml::from_str::<RpmbPersistent>(&text).unwrap(), p);
        assert_eq!(
            toml::from_str::<RpmbPersistent>("").unwrap(),
            RpmbPersistent::default()
        );
    }

    #[test]
    fn persistent_rejects_malformed_keys_without_panicking() {
        for bad in [
            "key = \"abc\"",
            "key = 5",
            "key = [1, 2, 3]",
            &format!("key = \"{}\"", "g".repeat(64)),
            &format!("key = \"{}\"", "0".repeat(65)),
            // 64 bytes but not 64 characters: must not slice inside a character.
            &format!("key = \"{}\"", "é".repeat(32)),
        ] {
            assert!(toml::from_str::<RpmbPersistent>(bad).is_err(), "{bad}");
        }
    }
}
