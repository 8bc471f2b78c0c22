//! RPMB frames as a host builds and reads them (facts §11.3–§11.5): 512 bytes, fields
//! big-endian at the fact sheet's offsets, the MAC an HMAC-SHA256 over bytes 228..512 of
//! every frame of a request or response.
//!
//! Nothing here uses emmc-card's RPMB code (its frame codec, its MAC helper): the MAC
//! comes from the `hmac` and `sha2` crates directly, so a test that signs its requests and
//! checks the card's responses with these helpers does not trust the code it tests.

use hmac::{Hmac, Mac};
use sha2::Sha256;

// ---- frame layout (facts §11.3: offsets from the first byte sent; fields big-endian)

/// Bytes in one frame.
pub const FRAME: usize = 512;
/// Key (key programming request) or MAC, 32 bytes.
pub const KEY_MAC: usize = 196;
/// Data, 256 bytes; the MAC covers the frame from here to its end.
pub const DATA: usize = 228;
/// Nonce, 16 bytes.
pub const NONCE: usize = 484;
/// Write counter, 4 bytes.
pub const COUNTER: usize = 500;
/// Half-sector address, 2 bytes.
pub const ADDRESS: usize = 504;
/// Block count, 2 bytes.
pub const BLOCK_COUNT: usize = 506;
/// Result, 2 bytes.
pub const RESULT: usize = 508;
/// Request or response type, 2 bytes.
pub const REQ_RESP: usize = 510;

// ---- request and response types (facts §11.4)

/// Authentication key programming request.
pub const REQ_KEY: u16 = 0x0001;
/// Reading of the write counter value, request.
pub const REQ_COUNTER: u16 = 0x0002;
/// Authenticated data write request.
pub const REQ_WRITE: u16 = 0x0003;
/// Authenticated data read request.
pub const REQ_READ: u16 = 0x0004;
/// Result read request.
pub const REQ_RESULT: u16 = 0x0005;
/// Authentication key programming response.
pub const RESP_KEY: u16 = 0x0100;
/// Reading of the write counter value, response.
pub const RESP_COUNTER: u16 = 0x0200;
/// Authenticated data write response.
pub const RESP_WRITE: u16 = 0x0300;
/// Authenticated data read response.
pub const RESP_READ: u16 = 0x0400;

// ---- results (facts §11.4; bit 7 flags an expired write counter)

/// Operation OK.
pub const OK: u16 = 0x00;
/// General failure.
pub const GENERAL_FAILURE: u16 = 0x01;
/// Authentication failure (the MAC did not verify).
pub const AUTH_FAILURE: u16 = 0x02;
/// Counter failure (the counter did not match).
pub const COUNTER_FAILURE: u16 = 0x03;
/// Address failure (out of range or misaligned).
pub const ADDRESS_FAILURE: u16 = 0x04;
/// Write failure.
pub const WRITE_FAILURE: u16 = 0x05;
/// Authentication key not yet programmed.
pub const KEY_NOT_PROGRAMMED: u16 = 0x07;

/// A zeroed frame carrying request type `req`, as raw bytes.
pub fn frame(req: u16) -> [u8; FRAME] {
    let mut f = [0u8; FRAME];
    f[REQ_RESP..].copy_from_slice(&req.to_be_bytes());
    f
}

/// The big-endian 16-bit field at `at` of a frame's bytes.
pub fn be16(frame: &[u8], at: usize) -> u16 {
    u16::from_be_bytes([frame[at], frame[at + 1]])
}

/// One frame as raw bytes, with builders for a request's fields and getters for a
/// response's.
#[derive(Clone)]
pub struct Frame(pub [u8; FRAME]);

impl Frame {
    /// A zeroed frame carrying request type `req`.
    pub fn request(req: u16) -> Frame {
        Frame(frame(req))
    }
    fn put16(&mut self, at: usize, v: u16) {
        self.0[at..at + 2].copy_from_slice(&v.to_be_bytes());
    }
    /// The key of a key programming request, in the key/MAC field.
    pub fn with_key(mut self, key: &[u8; 32]) -> Frame {
        self.0[KEY_MAC..DATA].copy_from_slice(key);
        self
    }
    /// The nonce field.
    pub fn with_nonce(mut self, nonce: &[u8; 16]) -> Frame {
        self.0[NONCE..COUNTER].copy_from_slice(nonce);
        self
    }
    /// The write counter field.
    pub fn with_counter(mut self, counter: u32) -> Frame {
        self.0[COUNTER..ADDRESS].copy_from_slice(&counter.to_be_bytes());
        self
    }
    /// The half-sector address field.
    pub fn with_address(mut self, address: u16) -> Frame {
        self.put16(ADDRESS, address);
        self
    }
    /// The block count field.
    pub fn with_block_count(mut self, n: u16) -> Frame {
        self.put16(BLOCK_COUNT, n);
        self
    }
    /// The 256 data bytes.
    pub fn with_data(mut self, data: &[u8; 256]) -> Frame {
        self.0[DATA..NONCE].copy_from_slice(data);
        self
    }
    /// The key/MAC field.
    pub fn mac(&self) -> [u8; 32] {
        self.0[KEY_MAC..DATA].try_into().unwrap()
    }
    /// The 256 data bytes.
    pub fn data(&self) -> &[u8] {
        &self.0[DATA..NONCE]
    }
    /// The nonce field.
    pub fn nonce(&self) -> [u8; 16] {
        self.0[NONCE..COUNTER].try_into().unwrap()
    }
    /// The write counter field.
    pub fn counter(&self) -> u32 {
        u32::from_be_bytes(self.0[COUNTER..ADDRESS].try_into().unwrap())
    }
    /// The half-sector address field.
    pub fn address(&self) -> u16 {
        be16(&self.0, ADDRESS)
    }
    /// The block count field.
    pub fn block_count(&self) -> u16 {
        be16(&self.0, BLOCK_COUNT)
    }
    /// The result field.
    pub fn result(&self) -> u16 {
        be16(&self.0, RESULT)
    }
    /// The request/response type field.
    pub fn resp(&self) -> u16 {
        be16(&self.0, REQ_RESP)
    }
}

impl AsRef<[u8]> for Frame {
    fn as_ref(&self) -> &[u8] {
        &self.0
    }
}

/// HMAC-SHA256 with `key` over bytes 228..512 of each frame, in order (facts §11.3).
/// A frame is anything that reads as its 512 bytes: a [`Frame`], an array, a `Vec`.
pub fn mac_over<F: AsRef<[u8]>>(key: &[u8; 32], frames: &[F]) -> [u8; 32] {
    let mut m = <Hmac<Sha256> as Mac>::new_from_slice(key).unwrap();
    for f in frames {
        m.update(&f.as_ref()[DATA..FRAME]);
    }
    m.finalize().into_bytes().into()
}

/// Puts the MAC of all `frames` into the last one, as a host signs a request.
pub fn sign(key: &[u8; 32], frames: &mut [Frame]) {
    let mac = mac_over(key, frames);
    frames.last_mut().unwrap().0[KEY_MAC..DATA].copy_from_slice(&mac);
}

/// Asserts that the MAC in the last of `frames` is the MAC of all of them under `key`.
pub fn assert_mac(key: &[u8; 32], frames: &[Frame], what: &str) {
    assert_eq!(
        frames.last().unwrap().mac(),
        mac_over(key, frames),
        "{what}: MAC does not verify"
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `hmac.new(b"\x0b" * 32, a[228:] + b[228:], hashlib.sha256)` for the two frames below.
    const EXPECTED_TWO_FRAME_MAC: [u8; 32] = [
        0x05, 0x0D, 0xA9, 0x13, 0xE2, 0xD8, 0x67, 0x53, 0xCF, 0xA9, 0x52, 0x65, 0x79, 0xE2, 0x09,
        0xDA, 0x12, 0x92, 0x9E, 0x09, 0x33, 0xCB, 0x82, 0x7F, 0x5F, 0x45, 0x22, 0xE2, 0x0C, 0xCC,
        0x1D, 0x04,
    ];

    #[test]
    fn builders_and_getters_use_the_fact_sheet_offsets_big_endian() {
        let f = Frame::request(REQ_WRITE)
            .with_counter(0x0102_0304)
            .with_address(0x0506)
            .with_block_count(0x0708)
            .with_nonce(&[0x33; 16])
            .with_data(&[0x44; 256]);
        assert_eq!(&f.0[COUNTER..COUNTER + 4], &[1, 2, 3, 4]);
        assert_eq!(&f.0[ADDRESS..ADDRESS + 2], &[5, 6]);
        assert_eq!(&f.0[BLOCK_COUNT..BLOCK_COUNT + 2], &[7, 8]);
        assert_eq!(&f.0[REQ_RESP..], &[0x00, 0x03]);
        assert!(f.0[..KEY_MAC].iter().all(|&b| b == 0), "stuff bytes");
        assert_eq!(
            (f.counter(), f.address(), f.block_count(), f.resp()),
            (0x0102_0304, 0x0506, 0x0708, REQ_WRITE)
        );
        assert_eq!((f.nonce(), f.data()), ([0x33; 16], &[0x44u8; 256][..]));
        assert_eq!(f.0, {
            let mut raw = frame(REQ_WRITE);
            raw[COUNTER..BLOCK_COUNT + 2].copy_from_slice(&[1, 2, 3, 4, 5, 6, 7, 8]);
            raw[NONCE..COUNTER].fill(0x33);
            raw[DATA..NONCE].fill(0x44);
            raw
        });
    }

    /// The MAC against a value computed outside Rust (Python's `hmac` module), so the
    /// helper's byte range and chaining are pinned independently of the crates it uses.
    #[test]
    fn the_mac_covers_bytes_228_to_512_of_every_frame_in_order() {
        let key = [0x0B; 32];
        let a = Frame::request(REQ_WRITE)
            .with_counter(7)
            .with_data(&[0xAA; 256]);
        let mut b = Frame::request(REQ_WRITE)
            .with_counter(7)
            .with_data(&[0x55; 256]);
        b.0[..DATA].fill(0xFF); // outside the MAC
        let two = mac_over(&key, &[a.clone(), b.clone()]);
        assert_eq!(two, EXPECTED_TWO_FRAME_MAC);
        assert_ne!(two, mac_over(&key, &[b.clone(), a.clone()]), "order counts");
        let raw: Vec<Vec<u8>> = vec![a.0.to_vec(), b.0.to_vec()];
        assert_eq!(mac_over(&key, &raw), two, "raw bytes sign the same");
        let mut signed = vec![a, b];
        sign(&key, &mut signed);
        assert_eq!(signed[1].mac(), two);
        assert_mac(&key, &signed, "signed here");
    }
}
