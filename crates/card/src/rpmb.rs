//! Replay Protected Memory Block (RPMB) protocol engine of an eMMC 4.5 card.
//!
//! The card moves frames; this module answers them. After the host selects the RPMB
//! partition, each CMD23(N) + CMD25 hands [`Rpmb::write_frames`] N 512-byte request
//! frames, and each CMD23(N) + CMD18 asks [`Rpmb::read_frames`] for N response frames.
//! [`RpmbFrame`], the code constants, [`rpmb_mac`] and [`sign_frames`] form a public
//! codec for anyone who builds or checks frames (tests, the card, a guest driver).
//!
//! # Requests
//!
//! | Request | Frames (CMD23 count) | Answer |
//! |---|---|---|
//! | key programming `0x0001` | 1, reliable write | result register (`0x0100`, result; no MAC) |
//! | read write counter `0x0002` | 1 | next CMD18(1): `0x0200`, nonce, counter, result, MAC |
//! | authenticated data write `0x0003` | 1 or 2, reliable write | result register (`0x0300`, counter, address, result, MAC) |
//! | authenticated data read `0x0004` | 1 | next CMD18(N): N × `0x0400` with data, nonce, address, block count N, result; MAC in the last over all N |
//! | result read `0x0005` | 1 | next CMD18(1): the result register |
//!
//! Authenticated writes are checked in this order, the first failure giving the result,
//! and write nothing unless all pass: key programmed (else `0x07`); reliable write, 1 or
//! 2 frames, block count field equal to the frame count, every frame of type `0x0003`
//! (else `0x01`); counter not expired (else `0x05`); address + count within the partition
//! (else `0x04`); MAC over all frames, from the last (else `0x02`); counter field equal to
//! the device counter (else `0x03`); the medium write (else `0x05`). Success writes the
//! data and increments the counter by one, whatever the frame count. Address, count and
//! counter are taken from the first frame (hosts such as OP-TEE fill them in every frame).
//! When the counter is `0xFFFF_FFFF` every response carries the expired flag `0x80`.
//!
//! # Decisions on points the fact sheet leaves open (§11.4, §11.5, §15)
//!
//! * **Second key programming** → general failure `0x01`, key unchanged. JESD84-B51
//!   §6.6.22.4.1 (as quoted in public Q&A threads) gives write failure only when
//!   programming itself fails and general failure for "some other error"; real cards
//!   reported in NXP community threads answer `0x0001` to a repeated `mmc rpmb write-key`,
//!   and OP-TEE's RPMB emulator does the same. QEMU's model answers write failure; it is
//!   the outlier.
//! * **Key programming without CMD23 bit 31 or with a count other than 1** → general
//!   failure (JESD84-B51 §6.6.22.4.1). mmc-utils, u-boot and OP-TEE all set bit 31 for key
//!   programming and data writes and not for the other requests, so the flag is required
//!   for those two and ignored for the rest.
//! * **More than 2 frames in one authenticated write** → general failure. Without
//!   EN_RPMB_REL_WR (an eMMC 5.1 bit, WR_REL_PARAM bit 4) the transfer is 256 B or 512 B
//!   (mmc-utils' WR_REL_PARAM decoding; Linux sizes RPMB writes from the same bit).
//! * **Authenticated read block count**: mmc-utils leaves the request's field 0 and lets
//!   CMD23 give the count, OP-TEE fills it in; QEMU accepts both. So do we: a field of 0
//!   or equal to N is accepted, any other value answers N general-failure frames.
//! * **CMD18 with no pending request** (nothing requested since reset, the response
//!   already read, or a write-type request not followed by a result read request) → N
//!   frames of type `0x0000` with general failure. Responses are read once; the result
//!   register itself stays readable through further result read requests until the next
//!   write-type request or [`Rpmb::reset_volatile`].
//! * **CMD18 count that does not fit the request** (not 1 for counter/result reads; not
//!   matching a non-zero block count of a data read) → every frame is a general failure
//!   of the pending response type, and the request is consumed. A single-frame request
//!   (types `0x0002`, `0x0004`, `0x0005`) sent in several frames is refused the same way.
//! * **Unknown request types** (including the eMMC 5.1 device-configuration requests
//!   `0x0006`/`0x0007`) → the result register becomes a general failure, of response type
//!   `request << 8` for one-byte types and `0x0000` otherwise (QEMU also answers general
//!   failure). Like any request, it cancels a pending read response.
//! * **Medium failures**: a data write reads the old half sectors first, writes the new
//!   ones, and on failure puts the old ones back, so the result is write failure `0x05`
//!   with the counter unchanged and no torn data (reliable-write semantics). If the old
//!   data cannot be read first, the write is not attempted (`0x05`); if restoring fails,
//!   an error is logged. A data read whose medium read fails answers read failure `0x06`
//!   in every frame, with zeroed data and a MAC.
//! * **No key**: counter reads, data reads and data writes answer `0x07` with no MAC.
//!
//! Guest input is hostile: every byte pattern parses, lengths that are not a whole,
//! non-zero number of frames are [`RpmbBusError::NotWholeFrames`] (state untouched),
//! anything else becomes a result code in a frame, and every refusal logs a warning.

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

/// The RPMB partition of a card's image as an [`RpmbMedium`]: half sector `address` is
/// at byte `start_byte + 256 × address` of `store`, and nothing exists past `size_bytes`.
pub(crate) struct StoreArea<'a> {
    store: &'a mut dyn crate::store::Store,
    start_byte: u64,
    size_bytes: u64,
}

impl<'a> StoreArea<'a> {
    /// The partition at `extent` (in sectors) of `store`.
    pub fn new(
        store: &'a mut dyn crate::store::Store,
        extent: crate::partition::Extent,
    ) -> StoreArea<'a> {
        StoreArea {
            store,
            start_byte: extent.start * 512,
            size_bytes: extent.sectors * 512,
        }
    }

    fn range(&self, address: u16, len: usize) -> Option<u64> {
        let offset = u64::from(address) * HALF_SECTOR as u64;
        (offset + len as u64 <= self.size_bytes).then_some(self.start_byte + offset)
    }
}

impl RpmbMedium for StoreArea<'_> {
    fn read(&mut self, address: u16, buf: &mut [u8]) -> bool {
        match self.range(address, buf.len()) {
            Some(at) => self.store.read_at(at, buf).is_ok(),
            None => false,
        }
    }
    fn write(&mut self, address: u16, data: &[u8]) -> bool {
        match self.range(address, data.len()) {
            Some(at) => self.store.write_at(at, data).is_ok(),
            None => false,
        }
    }
}

/// Frames the card could not take at all (the card reports R1 ERROR).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RpmbBusError {
    #[error("RPMB transfer of {0} bytes is not a whole number of frames")]
    NotWholeFrames(usize),
}

/// The response the next read transfer (CMD18) carries.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Pending {
    /// No request waits for a response.
    Nothing,
    /// A read write-counter request.
    Counter { nonce: [u8; NONCE_LEN] },
    /// An authenticated data read request.
    DataRead {
        nonce: [u8; NONCE_LEN],
        address: u16,
        /// The request's block count field: 0 (count taken from CMD23) or the count.
        block_count: u16,
    },
    /// A result read request: the result register.
    ResultRead,
    /// A request that was already refused when it was written.
    Refused {
        req_resp: u16,
        nonce: [u8; NONCE_LEN],
    },
}

#[derive(Debug, Clone)]
pub struct Rpmb {
    persistent: RpmbPersistent,
    /// Partition size in 256-byte half sectors (at most 65 536, as addresses are 16 bits).
    half_sectors: u32,
    pending: Pending,
    /// The response to the last write-type request, returned by a result read request.
    result_register: Option<RpmbFrame>,
}

impl Rpmb {
    /// An RPMB partition of `size_bytes` (RPMB_SIZE_MULT × 128 KiB) with its saved state.
    /// Sizes beyond the 16 MiB a 16-bit half-sector address reaches are capped.
    pub fn new(size_bytes: u64, persistent: RpmbPersistent) -> Rpmb {
        let max = u64::from(u16::MAX) + 1;
        let half_sectors = (size_bytes / HALF_SECTOR as u64).min(max);
        Rpmb {
            persistent,
            half_sectors: u32::try_from(half_sectors).unwrap_or(u32::from(u16::MAX) + 1),
            pending: Pending::Nothing,
            result_register: None,
        }
    }

    pub fn persistent(&self) -> &RpmbPersistent {
        &self.persistent
    }

    /// Partition size in 256-byte half sectors.
    pub fn half_sectors(&self) -> u32 {
        self.half_sectors
    }

    /// Forget the volatile state (pending request, last result) on power cycle or CMD0.
    pub fn reset_volatile(&mut self) {
        self.pending = Pending::Nothing;
        self.result_register = None;
    }

    /// A write transfer (CMD23 + CMD25) of whole frames completed; `reliable` is CMD23 bit 31.
    /// Returns `Ok(true)` when the persistent state changed and must be saved.
    pub fn write_frames(
        &mut self,
        frames: &[u8],
        reliable: bool,
        medium: &mut dyn RpmbMedium,
    ) -> Result<bool, RpmbBusError> {
        let first = whole_frames(frames)?;
        let count = frames.len() / FRAME_LEN;
        // A new request supersedes whatever response was still waiting to be read.
        self.pending = Pending::Nothing;
        match first.req_resp {
            AUTHENTICATION_KEY_PROGRAMMING => Ok(self.program_key(&first, count, reliable)),
            AUTHENTICATED_DATA_WRITE => Ok(self.data_write(frames, &first, reliable, medium)),
            READ_WRITE_COUNTER | AUTHENTICATED_DATA_READ | RESULT_READ => {
                self.pending = if count != 1 {
                    log::warn!(
                        "RPMB: request {:#06x} in {count} frames refused (must be one frame)",
                        first.req_resp
                    );
                    Pending::Refused {
                        req_resp: response_type(first.req_resp),
                        nonce: first.nonce,
                    }
                } else {
                    match first.req_resp {
                        READ_WRITE_COUNTER => Pending::Counter { nonce: first.nonce },
                        AUTHENTICATED_DATA_READ => Pending::DataRead {
                            nonce: first.nonce,
                            address: first.address,
                            block_count: first.block_count,
                        },
                        _ => Pending::ResultRead,
                    }
                };
                Ok(false)
            }
            unknown => {
                log::warn!("RPMB: unknown request type {unknown:#06x} refused (general failure)");
                let mut response = RpmbFrame::with_type(if unknown <= 0xFF {
                    response_type(unknown)
                } else {
                    0
                });
                response.result = self.status(GENERAL_FAILURE);
                self.result_register = Some(response);
                Ok(false)
            }
        }
    }

    /// A read transfer (CMD23 + CMD18): fill `out` (whole frames) with the response to the
    /// pending request.
    pub fn read_frames(
        &mut self,
        out: &mut [u8],
        medium: &mut dyn RpmbMedium,
    ) -> Result<(), RpmbBusError> {
        whole_frames(out)?;
        let count = out.len() / FRAME_LEN;
        let pending = std::mem::replace(&mut self.pending, Pending::Nothing);
        let single = |frame: RpmbFrame| {
            if count == 1 {
                vec![frame]
            } else {
                log::warn!(
                    "RPMB: response {:#06x} read as {count} frames (must be one): general failure",
                    frame.req_resp
                );
                let mut refused = RpmbFrame::with_type(frame.req_resp);
                refused.nonce = frame.nonce;
                refused.result = GENERAL_FAILURE | (frame.result & WRITE_COUNTER_EXPIRED);
                vec![refused; count]
            }
        };
        let frames = match pending {
            Pending::Nothing => {
                log::warn!("RPMB: read of {count} frames with no request pending: general failure");
                vec![self.failure(0, [0; NONCE_LEN]); count]
            }
            Pending::Refused { req_resp, nonce } => vec![self.failure(req_resp, nonce); count],
            Pending::Counter { nonce } => single(self.counter_response(nonce)),
            Pending::ResultRead => single(self.result_register.clone().unwrap_or_else(|| {
                log::warn!("RPMB: result read with no write-type request since reset");
                self.failure(0, [0; NONCE_LEN])
            })),
            Pending::DataRead {
                nonce,
                address,
                block_count,
            } => self.data_read(count, nonce, address, block_count, medium),
        };
        for (chunk, frame) in out.chunks_exact_mut(FRAME_LEN).zip(&frames) {
            if let Ok(chunk) = <&mut [u8; FRAME_LEN]>::try_from(chunk) {
                frame.write_to(chunk);
            }
        }
        Ok(())
    }

    /// `result` with the write-counter-expired flag added when the counter has expired.
    fn status(&self, result: u16) -> u16 {
        if self.persistent.write_counter == WRITE_COUNTER_MAX {
            result | WRITE_COUNTER_EXPIRED
        } else {
            result
        }
    }

    fn failure(&self, req_resp: u16, nonce: [u8; NONCE_LEN]) -> RpmbFrame {
        let mut frame = RpmbFrame::with_type(req_resp);
        frame.nonce = nonce;
        frame.result = self.status(GENERAL_FAILURE);
        frame
    }

    fn program_key(&mut self, request: &RpmbFrame, count: usize, reliable: bool) -> bool {
        let mut response = RpmbFrame::with_type(AUTHENTICATION_KEY_PROGRAMMING_RESPONSE);
        let (result, changed) = if count != 1 || !reliable {
            log::warn!(
                "RPMB: key programming refused: {count} frames, reliable write {reliable} \
                 (needs one frame with CMD23 bit 31)"
            );
            (GENERAL_FAILURE, false)
        } else if self.persistent.key.is_some() {
            log::warn!("RPMB: key programming refused: the key is already programmed");
            (GENERAL_FAILURE, false)
        } else {
            log::info!("RPMB: authentication key programmed");
            self.persistent.key = Some(request.key_mac);
            (OPERATION_OK, true)
        };
        response.result = self.status(result);
        self.result_register = Some(response);
        changed
    }

    fn data_write(
        &mut self,
        frames: &[u8],
        first: &RpmbFrame,
        reliable: bool,
        medium: &mut dyn RpmbMedium,
    ) -> bool {
        let count = frames.len() / FRAME_LEN;
        let mut response = RpmbFrame::with_type(AUTHENTICATED_DATA_WRITE_RESPONSE);
        response.address = first.address;
        let mut changed = false;
        let result = match self.persistent.key {
            None => {
                log::warn!("RPMB: authenticated write refused: no key programmed");
                AUTHENTICATION_KEY_NOT_YET_PROGRAMMED
            }
            Some(key) => {
                let result = self.check_write(frames, first, reliable, &key);
                if result == OPERATION_OK {
                    if write_half_sectors(medium, first.address, count, frames) {
                        self.persistent.write_counter += 1;
                        changed = true;
                        log::debug!(
                            "RPMB: wrote {count} half sectors at {}, counter now {}",
                            first.address,
                            self.persistent.write_counter
                        );
                        OPERATION_OK
                    } else {
                        log::warn!(
                            "RPMB: authenticated write at {} failed on the medium",
                            first.address
                        );
                        WRITE_FAILURE
                    }
                } else {
                    result
                }
            }
        };
        response.write_counter = self.persistent.write_counter;
        response.result = self.status(result);
        if let Some(key) = self.persistent.key {
            response.key_mac = rpmb_mac(&key, &response.to_bytes());
        }
        self.result_register = Some(response);
        changed
    }

    /// Everything an authenticated write must pass before data is written, in the order
    /// the checks are made; the first failing check gives the result.
    fn check_write(
        &self,
        frames: &[u8],
        first: &RpmbFrame,
        reliable: bool,
        key: &[u8; KEY_LEN],
    ) -> u16 {
        let count = frames.len() / FRAME_LEN;
        let same_type = frames.chunks_exact(FRAME_LEN).all(|f| {
            RpmbFrame::parse_slice(f).is_some_and(|f| f.req_resp == AUTHENTICATED_DATA_WRITE)
        });
        let mac = frames
            .len()
            .checked_sub(FRAME_LEN)
            .and_then(|last| RpmbFrame::parse_slice(&frames[last..]))
            .map(|last| last.key_mac)
            .unwrap_or([0; KEY_LEN]);
        let end = u32::from(first.address) + u32::try_from(count).unwrap_or(u32::MAX);
        if !reliable || count > MAX_WRITE_FRAMES || usize::from(first.block_count) != count {
            log::warn!(
                "RPMB: authenticated write refused: {count} frames, block count field {}, \
                 reliable write {reliable} (needs 1 or 2 frames, matching count, CMD23 bit 31)",
                first.block_count
            );
            GENERAL_FAILURE
        } else if !same_type {
            log::warn!("RPMB: authenticated write refused: frames of mixed request types");
            GENERAL_FAILURE
        } else if self.persistent.write_counter == WRITE_COUNTER_MAX {
            log::warn!("RPMB: authenticated write refused: write counter expired");
            WRITE_FAILURE
        } else if end > self.half_sectors {
            log::warn!(
                "RPMB: authenticated write refused: half sectors {}..{end} outside the {} \
                 of the partition",
                first.address,
                self.half_sectors
            );
            ADDRESS_FAILURE
        } else if !rpmb_mac_matches(key, frames, &mac) {
            log::warn!("RPMB: authenticated write refused: MAC mismatch");
            AUTHENTICATION_FAILURE
        } else if first.write_counter != self.persistent.write_counter {
            log::warn!(
                "RPMB: authenticated write refused: counter {} but the device is at {}",
                first.write_counter,
                self.persistent.write_counter
            );
            COUNTER_FAILURE
        } else {
            OPERATION_OK
        }
    }

    fn counter_response(&self, nonce: [u8; NONCE_LEN]) -> RpmbFrame {
        let mut response = RpmbFrame::with_type(READ_WRITE_COUNTER_RESPONSE);
        response.nonce = nonce;
        match self.persistent.key {
            None => {
                log::warn!("RPMB: counter read refused: no key programmed");
                response.result = self.status(AUTHENTICATION_KEY_NOT_YET_PROGRAMMED);
            }
            Some(key) => {
                response.write_counter = self.persistent.write_counter;
                response.result = self.status(OPERATION_OK);
                response.key_mac = rpmb_mac(&key, &response.to_bytes());
            }
        }
        response
    }

    fn data_read(
        &self,
        count: usize,
        nonce: [u8; NONCE_LEN],
        address: u16,
        block_count: u16,
        medium: &mut dyn RpmbMedium,
    ) -> Vec<RpmbFrame> {
        let mut data = vec![0u8; count * HALF_SECTOR];
        let end = u32::from(address) + u32::try_from(count).unwrap_or(u32::MAX);
        let result = if self.persistent.key.is_none() {
            log::warn!("RPMB: authenticated read refused: no key programmed");
            AUTHENTICATION_KEY_NOT_YET_PROGRAMMED
        } else if block_count != 0 && usize::from(block_count) != count {
            log::warn!(
                "RPMB: authenticated read refused: request asked for {block_count} frames, \
                 CMD18 reads {count}"
            );
            GENERAL_FAILURE
        } else if end > self.half_sectors {
            log::warn!(
                "RPMB: authenticated read refused: half sectors {address}..{end} outside the \
                 {} of the partition",
                self.half_sectors
            );
            ADDRESS_FAILURE
        } else if !medium.read(address, &mut data) {
            log::warn!("RPMB: authenticated read at {address} failed on the medium");
            data.fill(0);
            READ_FAILURE
        } else {
            OPERATION_OK
        };
        let mut frames: Vec<RpmbFrame> = data
            .chunks_exact(HALF_SECTOR)
            .map(|chunk| {
                let mut frame = RpmbFrame::with_type(AUTHENTICATED_DATA_READ_RESPONSE);
                frame.data.copy_from_slice(chunk);
                frame.nonce = nonce;
                frame.address = address;
                frame.block_count = u16::try_from(count).unwrap_or(u16::MAX);
                frame.result = self.status(result);
                frame
            })
            .collect();
        if let Some(key) = self.persistent.key {
            sign_frames(&key, &mut frames);
        }
        frames
    }
}

/// The first frame of a transfer, or the bus error for a length that is not whole frames.
fn whole_frames(bytes: &[u8]) -> Result<RpmbFrame, RpmbBusError> {
    let first = RpmbFrame::parse_slice(bytes);
    match first {
        Some(first) if bytes.len() % FRAME_LEN == 0 => Ok(first),
        _ => {
            log::warn!(
                "RPMB: transfer of {} bytes refused: not a whole number of frames",
                bytes.len()
            );
            Err(RpmbBusError::NotWholeFrames(bytes.len()))
        }
    }
}

/// Write the data of `count` frames to consecutive half sectors from `address`, all or
/// nothing: the old contents are read first and put back if the write fails.
fn write_half_sectors(
    medium: &mut dyn RpmbMedium,
    address: u16,
    count: usize,
    frames: &[u8],
) -> bool {
    let mut old = vec![0u8; count * HALF_SECTOR];
    if !medium.read(address, &mut old) {
        return false;
    }
    let new: Vec<u8> = frames
        .chunks_exact(FRAME_LEN)
        .flat_map(|f| f[DATA_OFFSET..NONCE_OFFSET].iter().copied())
        .collect();
    if medium.write(address, &new) {
        return true;
    }
    if !medium.write(address, &old) {
        log::error!(
            "RPMB: could not restore half sectors {address}..+{count} after a failed write; \
             their contents may be torn"
        );
    }
    false
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

    // ---- the protocol engine ----

    const KEY: [u8; 32] = [0x42; 32];
    /// 128 KiB: 512 half sectors.
    const SIZE: u64 = 128 * 1024;

    /// An RPMB partition over a Vec, with injectable failures.
    struct VecMedium {
        data: Vec<u8>,
        fail_reads: bool,
        /// Fail this many writes from now on ...
        fail_writes: usize,
        /// ... after writing their first half sector (a torn write).
        tear: bool,
    }

    impl VecMedium {
        fn new() -> VecMedium {
            VecMedium {
                data: (0..SIZE).map(|i| (i % 251) as u8).collect(),
                fail_reads: false,
                fail_writes: 0,
                tear: false,
            }
        }
        fn half(&self, address: usize) -> &[u8] {
            &self.data[address * 256..(address + 1) * 256]
        }
    }

    impl RpmbMedium for VecMedium {
        fn read(&mut self, address: u16, buf: &mut [u8]) -> bool {
            let start = usize::from(address) * 256;
            match self.data.get(start..start + buf.len()) {
                Some(src) if !self.fail_reads => {
                    buf.copy_from_slice(src);
                    true
                }
                _ => false,
            }
        }
        fn write(&mut self, address: u16, data: &[u8]) -> bool {
            let start = usize::from(address) * 256;
            let Some(dst) = self.data.get_mut(start..start + data.len()) else {
                return false;
            };
            if self.fail_writes > 0 {
                self.fail_writes -= 1;
                if self.tear {
                    dst[..256].copy_from_slice(&data[..256]);
                }
                return false;
            }
            dst.copy_from_slice(data);
            true
        }
    }

    #[test]
    fn the_store_area_maps_half_sectors_inside_the_partition_only() {
        use crate::partition::Extent;
        use crate::store::{ImageLayout, MemStore, Store};
        let mut store = MemStore::new(ImageLayout {
            boot_bytes: 0,
            rpmb_bytes: 128 << 10,
            user_bytes: 1 << 20,
        });
        let extent = Extent {
            start: 8,
            sectors: 4,
        };
        let mut area = StoreArea::new(&mut store, extent);
        assert!(area.write(1, &[0xAB; HALF_SECTOR]));
        assert!(area.write(7, &[0xCD; HALF_SECTOR]), "the last half sector");
        assert!(!area.write(8, &[0; HALF_SECTOR]), "past the partition");
        assert!(
            !area.write(7, &[0; 2 * HALF_SECTOR]),
            "running past its end"
        );
        let mut half = [0u8; HALF_SECTOR];
        assert!(area.read(1, &mut half));
        assert_eq!(half, [0xAB; HALF_SECTOR]);
        assert!(!area.read(8, &mut half));
        let mut raw = [0u8; 512];
        store.read_at(8 * 512, &mut raw).unwrap();
        assert_eq!((raw[255], raw[256], raw[511]), (0, 0xAB, 0xAB));
        store.read_at(11 * 512 + 256, &mut half).unwrap();
        assert_eq!(half, [0xCD; HALF_SECTOR]);
    }

    fn fresh() -> (Rpmb, VecMedium) {
        (Rpmb::new(SIZE, RpmbPersistent::default()), VecMedium::new())
    }

    fn keyed(counter: u32) -> (Rpmb, VecMedium) {
        let persistent = RpmbPersistent {
            key: Some(KEY),
            write_counter: counter,
        };
        (Rpmb::new(SIZE, persistent), VecMedium::new())
    }

    fn send(rpmb: &mut Rpmb, m: &mut VecMedium, frames: &[RpmbFrame], reliable: bool) -> bool {
        rpmb.write_frames(&frames_to_bytes(frames), reliable, m)
            .unwrap()
    }

    fn receive(rpmb: &mut Rpmb, m: &mut VecMedium, n: usize) -> Vec<RpmbFrame> {
        let mut out = vec![0xEEu8; n * 512];
        rpmb.read_frames(&mut out, m).unwrap();
        out.chunks(512)
            .map(|c| RpmbFrame::parse_slice(c).unwrap())
            .collect()
    }

    fn result_read(rpmb: &mut Rpmb, m: &mut VecMedium) -> RpmbFrame {
        assert!(!send(rpmb, m, &[RpmbFrame::with_type(RESULT_READ)], false));
        receive(rpmb, m, 1).remove(0)
    }

    fn program_key(rpmb: &mut Rpmb, m: &mut VecMedium, key: [u8; 32]) -> (bool, RpmbFrame) {
        let mut f = RpmbFrame::with_type(AUTHENTICATION_KEY_PROGRAMMING);
        f.key_mac = key;
        let changed = send(rpmb, m, &[f], true);
        (changed, result_read(rpmb, m))
    }

    fn write_request(address: u16, counter: u32, data: &[[u8; 256]]) -> Vec<RpmbFrame> {
        let mut frames: Vec<RpmbFrame> = data
            .iter()
            .map(|d| {
                let mut f = RpmbFrame::with_type(AUTHENTICATED_DATA_WRITE);
                f.data = *d;
                f.address = address;
                f.write_counter = counter;
                f.block_count = data.len() as u16;
                f
            })
            .collect();
        sign_frames(&KEY, &mut frames);
        frames
    }

    /// Send an authenticated write and fetch its result; returns (persist?, response).
    fn write(rpmb: &mut Rpmb, m: &mut VecMedium, frames: &[RpmbFrame]) -> (bool, RpmbFrame) {
        let changed = send(rpmb, m, frames, true);
        (changed, result_read(rpmb, m))
    }

    fn read_request(address: u16, nonce: [u8; 16], block_count: u16) -> RpmbFrame {
        let mut f = RpmbFrame::with_type(AUTHENTICATED_DATA_READ);
        f.address = address;
        f.nonce = nonce;
        f.block_count = block_count;
        f
    }

    fn assert_mac_verifies(frames: &[RpmbFrame]) {
        let bytes = frames_to_bytes(frames);
        assert_eq!(
            frames.last().unwrap().key_mac,
            reference_mac(&KEY, &bytes),
            "MAC does not verify"
        );
    }

    #[test]
    fn key_programming_succeeds_once_and_a_second_attempt_fails() {
        let (mut rpmb, mut m) = fresh();
        let (changed, r) = program_key(&mut rpmb, &mut m, KEY);
        assert!(changed);
        assert_eq!(r.req_resp, AUTHENTICATION_KEY_PROGRAMMING_RESPONSE);
        assert_eq!(r.result, OPERATION_OK);
        assert_eq!(rpmb.persistent().key, Some(KEY));

        let (changed, r) = program_key(&mut rpmb, &mut m, [7; 32]);
        assert!(!changed);
        assert_eq!(r.req_resp, AUTHENTICATION_KEY_PROGRAMMING_RESPONSE);
        assert_eq!(r.result, GENERAL_FAILURE);
        assert_eq!(rpmb.persistent().key, Some(KEY));
    }

    #[test]
    fn key_programming_needs_one_frame_with_reliable_write() {
        let (mut rpmb, mut m) = fresh();
        let mut f = RpmbFrame::with_type(AUTHENTICATION_KEY_PROGRAMMING);
        f.key_mac = KEY;
        assert!(!send(&mut rpmb, &mut m, &[f.clone()], false));
        assert_eq!(result_read(&mut rpmb, &mut m).result, GENERAL_FAILURE);
        assert!(!send(&mut rpmb, &mut m, &[f.clone(), f.clone()], true));
        assert_eq!(result_read(&mut rpmb, &mut m).result, GENERAL_FAILURE);
        assert_eq!(rpmb.persistent().key, None);
    }

    #[test]
    fn counter_read_before_key_reports_key_not_programmed() {
        let (mut rpmb, mut m) = fresh();
        let mut req = RpmbFrame::with_type(READ_WRITE_COUNTER);
        req.nonce = [9; 16];
        assert!(!send(&mut rpmb, &mut m, &[req], false));
        let r = receive(&mut rpmb, &mut m, 1).remove(0);
        assert_eq!(r.req_resp, READ_WRITE_COUNTER_RESPONSE);
        assert_eq!(r.result, AUTHENTICATION_KEY_NOT_YET_PROGRAMMED);
    }

    #[test]
    fn counter_read_after_key_echoes_nonce_with_a_verifying_mac() {
        let (mut rpmb, mut m) = fresh();
        program_key(&mut rpmb, &mut m, KEY);
        let nonce: [u8; 16] = core::array::from_fn(|i| i as u8 + 1);
        let mut req = RpmbFrame::with_type(READ_WRITE_COUNTER);
        req.nonce = nonce;
        send(&mut rpmb, &mut m, &[req], false);
        let r = receive(&mut rpmb, &mut m, 1).remove(0);
        assert_eq!(r.req_resp, READ_WRITE_COUNTER_RESPONSE);
        assert_eq!(r.result, OPERATION_OK);
        assert_eq!(r.write_counter, 0);
        assert_eq!(r.nonce, nonce);
        assert_mac_verifies(&[r]);
    }

    #[test]
    fn authenticated_write_of_one_frame_lands_and_increments_the_counter() {
        let (mut rpmb, mut m) = keyed(0);
        let (changed, r) = write(&mut rpmb, &mut m, &write_request(3, 0, &[[0xA5; 256]]));
        assert!(changed, "a successful write must be persisted");
        assert_eq!(r.req_resp, AUTHENTICATED_DATA_WRITE_RESPONSE);
        assert_eq!(r.result, OPERATION_OK);
        assert_eq!(r.write_counter, 1);
        assert_eq!(r.address, 3);
        assert_mac_verifies(&[r]);
        assert_eq!(m.half(3), &[0xA5; 256][..]);
        assert_eq!(m.half(4), VecMedium::new().half(4));
        assert_eq!(rpmb.persistent().write_counter, 1);
    }

    #[test]
    fn authenticated_write_of_two_frames_lands_and_increments_the_counter_once() {
        let (mut rpmb, mut m) = keyed(41);
        let frames = write_request(10, 41, &[[1; 256], [2; 256]]);
        let (changed, r) = write(&mut rpmb, &mut m, &frames);
        assert!(changed);
        assert_eq!(
            (r.result, r.write_counter, r.address),
            (OPERATION_OK, 42, 10)
        );
        assert_mac_verifies(&[r]);
        assert_eq!(m.half(10), &[1; 256][..]);
        assert_eq!(m.half(11), &[2; 256][..]);
        assert_eq!(rpmb.persistent().write_counter, 42);
    }

    #[test]
    fn bad_mac_is_authentication_failure_and_writes_nothing() {
        let (mut rpmb, mut m) = keyed(0);
        let before = m.data.clone();
        let mut frames = write_request(0, 0, &[[1; 256], [2; 256]]);
        frames[0].data[17] ^= 1;
        let (changed, r) = write(&mut rpmb, &mut m, &frames);
        assert!(!changed);
        assert_eq!(r.result, AUTHENTICATION_FAILURE);
        assert_eq!(r.write_counter, 0);
        assert_mac_verifies(&[r]);
        assert_eq!(m.data, before);
        assert_eq!(rpmb.persistent().write_counter, 0);
    }

    #[test]
    fn wrong_counter_is_counter_failure() {
        let (mut rpmb, mut m) = keyed(5);
        let before = m.data.clone();
        for stale in [4, 6, 0] {
            let (changed, r) = write(&mut rpmb, &mut m, &write_request(0, stale, &[[1; 256]]));
            assert!(!changed);
            assert_eq!(r.result, COUNTER_FAILURE, "counter {stale}");
            assert_eq!(r.write_counter, 5);
        }
        assert_eq!(m.data, before);
    }

    #[test]
    fn out_of_range_address_or_count_is_address_failure() {
        let (mut rpmb, mut m) = keyed(0);
        let before = m.data.clone();
        for (address, frames) in [(511u16, 2usize), (512, 1), (0xFFFF, 1), (0xFFFF, 2)] {
            let data = vec![[3u8; 256]; frames];
            let (changed, r) = write(&mut rpmb, &mut m, &write_request(address, 0, &data));
            assert!(!changed);
            assert_eq!(r.result, ADDRESS_FAILURE, "{frames} at {address}");
            assert_eq!(r.address, address);
        }
        assert_eq!(m.data, before);
        // The last half sector itself is in range.
        let (_, r) = write(&mut rpmb, &mut m, &write_request(511, 0, &[[3; 256]]));
        assert_eq!(r.result, OPERATION_OK);
        assert_eq!(m.half(511), &[3; 256][..]);
    }

    #[test]
    fn more_than_two_frames_mismatched_count_or_no_reliable_write_is_general_failure() {
        let (mut rpmb, mut m) = keyed(0);
        let before = m.data.clone();
        let three = write_request(0, 0, &[[1; 256]; 3]);
        assert_eq!(write(&mut rpmb, &mut m, &three).1.result, GENERAL_FAILURE);
        let mut miscounted = write_request(0, 0, &[[1; 256]; 2]);
        for f in &mut miscounted {
            f.block_count = 1;
        }
        sign_frames(&KEY, &mut miscounted);
        assert_eq!(
            write(&mut rpmb, &mut m, &miscounted).1.result,
            GENERAL_FAILURE
        );
        // The first frame's type decides the request; the others must agree with it.
        let mut mixed = write_request(0, 0, &[[1; 256]; 2]);
        mixed[1].req_resp = AUTHENTICATED_DATA_READ;
        sign_frames(&KEY, &mut mixed);
        assert_eq!(write(&mut rpmb, &mut m, &mixed).1.result, GENERAL_FAILURE);
        let one = write_request(0, 0, &[[1; 256]]);
        assert!(!send(&mut rpmb, &mut m, &one, false));
        assert_eq!(result_read(&mut rpmb, &mut m).result, GENERAL_FAILURE);
        assert_eq!(m.data, before);
        assert_eq!(rpmb.persistent().write_counter, 0);
    }

    #[test]
    fn write_without_key_is_key_not_programmed() {
        let (mut rpmb, mut m) = fresh();
        let before = m.data.clone();
        let (changed, r) = write(&mut rpmb, &mut m, &write_request(0, 0, &[[1; 256]]));
        assert!(!changed);
        assert_eq!(r.req_resp, AUTHENTICATED_DATA_WRITE_RESPONSE);
        assert_eq!(r.result, AUTHENTICATION_KEY_NOT_YET_PROGRAMMED);
        assert_eq!(r.key_mac, [0; 32]);
        assert_eq!(m.data, before);
    }

    #[test]
    fn medium_write_failure_is_write_failure_and_leaves_old_data() {
        let (mut rpmb, mut m) = keyed(0);
        let before = m.data.clone();
        m.fail_writes = 1;
        m.tear = true;
        let (changed, r) = write(&mut rpmb, &mut m, &write_request(8, 0, &[[1; 256]; 2]));
        assert!(!changed);
        assert_eq!(r.result, WRITE_FAILURE);
        assert_eq!(r.write_counter, 0);
        assert_mac_verifies(&[r]);
        assert_eq!(m.data, before, "the torn half sector must be restored");
        assert_eq!(rpmb.persistent().write_counter, 0);
        // A medium that cannot even be read before the write also fails the write.
        m.fail_reads = true;
        let (_, r) = write(&mut rpmb, &mut m, &write_request(8, 0, &[[1; 256]]));
        assert_eq!(r.result, WRITE_FAILURE);
        assert_eq!(m.data, before);
    }

    #[test]
    fn medium_read_failure_in_authenticated_read_is_read_failure() {
        let (mut rpmb, mut m) = keyed(0);
        m.fail_reads = true;
        send(&mut rpmb, &mut m, &[read_request(0, [1; 16], 0)], false);
        let frames = receive(&mut rpmb, &mut m, 2);
        for f in &frames {
            assert_eq!(f.req_resp, AUTHENTICATED_DATA_READ_RESPONSE);
            assert_eq!(f.result, READ_FAILURE);
            assert_eq!(f.data, [0; 256]);
        }
        assert_mac_verifies(&frames);
    }

    #[test]
    fn authenticated_read_returns_written_data_with_nonce_address_count_and_mac() {
        let (mut rpmb, mut m) = keyed(0);
        let data: Vec<[u8; 256]> = (0..2u8)
            .map(|i| core::array::from_fn(|j| (j as u8).wrapping_mul(3) ^ i))
            .collect();
        assert!(write(&mut rpmb, &mut m, &write_request(4, 0, &data)).0);
        let nonce: [u8; 16] = core::array::from_fn(|i| 0xC0 | i as u8);
        // Block count field 0 (mmc-utils) and equal to the CMD18 count (OP-TEE) both work.
        for field in [0, 2] {
            assert!(!send(
                &mut rpmb,
                &mut m,
                &[read_request(4, nonce, field)],
                false
            ));
            let frames = receive(&mut rpmb, &mut m, 2);
            for (f, d) in frames.iter().zip(&data) {
                assert_eq!(f.req_resp, AUTHENTICATED_DATA_READ_RESPONSE);
                assert_eq!(f.result, OPERATION_OK);
                assert_eq!(&f.data, d);
                assert_eq!(f.nonce, nonce);
                assert_eq!(f.address, 4);
                assert_eq!(f.block_count, 2);
            }
            assert_eq!(
                frames[0].key_mac, [0; 32],
                "only the last frame has the MAC"
            );
            assert_mac_verifies(&frames);
        }
        // A single frame read.
        send(&mut rpmb, &mut m, &[read_request(5, nonce, 0)], false);
        let frames = receive(&mut rpmb, &mut m, 1);
        assert_eq!(frames[0].data, data[1]);
        assert_mac_verifies(&frames);
    }

    #[test]
    fn authenticated_read_failures_carry_their_result_codes() {
        let (mut rpmb, mut m) = fresh();
        send(&mut rpmb, &mut m, &[read_request(0, [1; 16], 0)], false);
        let frames = receive(&mut rpmb, &mut m, 1);
        assert_eq!(frames[0].result, AUTHENTICATION_KEY_NOT_YET_PROGRAMMED);

        let (mut rpmb, mut m) = keyed(0);
        send(&mut rpmb, &mut m, &[read_request(511, [1; 16], 0)], false);
        let frames = receive(&mut rpmb, &mut m, 2);
        assert!(frames.iter().all(|f| f.result == ADDRESS_FAILURE));
        assert!(frames.iter().all(|f| f.data == [0; 256]));
        assert_mac_verifies(&frames);

        // The request asked for 3 frames but CMD18 reads 2.
        send(&mut rpmb, &mut m, &[read_request(0, [1; 16], 3)], false);
        let frames = receive(&mut rpmb, &mut m, 2);
        assert!(frames.iter().all(|f| f.result == GENERAL_FAILURE));
        assert!(frames.iter().all(|f| f.data == [0; 256]));
    }

    #[test]
    fn expired_counter_refuses_writes_with_the_expired_flag() {
        let (mut rpmb, mut m) = keyed(WRITE_COUNTER_MAX);
        let before = m.data.clone();
        let frames = write_request(0, WRITE_COUNTER_MAX, &[[1; 256]]);
        let (changed, r) = write(&mut rpmb, &mut m, &frames);
        assert!(!changed);
        assert_eq!(r.result, WRITE_FAILURE | WRITE_COUNTER_EXPIRED);
        assert_eq!(r.write_counter, WRITE_COUNTER_MAX);
        assert_mac_verifies(&[r]);
        assert_eq!(m.data, before);
        // Reads still work and say the counter has expired.
        send(
            &mut rpmb,
            &mut m,
            &[RpmbFrame::with_type(READ_WRITE_COUNTER)],
            false,
        );
        let r = receive(&mut rpmb, &mut m, 1).remove(0);
        assert_eq!(r.result, OPERATION_OK | WRITE_COUNTER_EXPIRED);
        assert_eq!(r.write_counter, WRITE_COUNTER_MAX);
        // The write that reaches the last value succeeds and reports expiry.
        let (mut rpmb, mut m) = keyed(WRITE_COUNTER_MAX - 1);
        let frames = write_request(0, WRITE_COUNTER_MAX - 1, &[[1; 256]]);
        let (changed, r) = write(&mut rpmb, &mut m, &frames);
        assert!(changed);
        assert_eq!(r.result, OPERATION_OK | WRITE_COUNTER_EXPIRED);
    }

    #[test]
    fn reset_volatile_forgets_a_pending_read_request_and_the_last_result() {
        let (mut rpmb, mut m) = keyed(0);
        send(&mut rpmb, &mut m, &[read_request(0, [1; 16], 0)], false);
        rpmb.reset_volatile();
        let r = receive(&mut rpmb, &mut m, 1).remove(0);
        assert_eq!(r.req_resp, 0);
        assert_eq!(r.result, GENERAL_FAILURE);
        assert_eq!(r.data, [0; 256]);

        assert!(send(
            &mut rpmb,
            &mut m,
            &write_request(0, 0, &[[1; 256]]),
            true
        ));
        rpmb.reset_volatile();
        let r = result_read(&mut rpmb, &mut m);
        assert_eq!((r.req_resp, r.result), (0, GENERAL_FAILURE));
        // Persistent state survives.
        assert_eq!(rpmb.persistent().write_counter, 1);
    }

    #[test]
    fn read_with_no_pending_request_is_general_failure_and_responses_are_read_once() {
        let (mut rpmb, mut m) = keyed(0);
        let r = receive(&mut rpmb, &mut m, 3);
        assert!(r
            .iter()
            .all(|f| f.req_resp == 0 && f.result == GENERAL_FAILURE));
        send(
            &mut rpmb,
            &mut m,
            &[RpmbFrame::with_type(READ_WRITE_COUNTER)],
            false,
        );
        assert_eq!(receive(&mut rpmb, &mut m, 1)[0].result, OPERATION_OK);
        assert_eq!(receive(&mut rpmb, &mut m, 1)[0].result, GENERAL_FAILURE);
        // A write response is only available through a result read request.
        send(&mut rpmb, &mut m, &write_request(0, 0, &[[1; 256]]), true);
        assert_eq!(receive(&mut rpmb, &mut m, 1)[0].result, GENERAL_FAILURE);
        assert_eq!(result_read(&mut rpmb, &mut m).result, OPERATION_OK);
        // ... as often as asked.
        assert_eq!(result_read(&mut rpmb, &mut m).write_counter, 1);
    }

    #[test]
    fn unknown_request_type_is_general_failure_in_the_result_register() {
        let (mut rpmb, mut m) = keyed(0);
        for (req, resp) in [(0x0006u16, 0x0600u16), (0x0000, 0x0000), (0xABCD, 0x0000)] {
            assert!(!send(&mut rpmb, &mut m, &[RpmbFrame::with_type(req)], true));
            let r = result_read(&mut rpmb, &mut m);
            assert_eq!(
                (r.req_resp, r.result),
                (resp, GENERAL_FAILURE),
                "{req:#06x}"
            );
        }
    }

    #[test]
    fn single_frame_requests_and_responses_in_several_frames_are_general_failure() {
        let (mut rpmb, mut m) = keyed(0);
        let mut req = RpmbFrame::with_type(READ_WRITE_COUNTER);
        req.nonce = [5; 16];
        // Counter response read as 2 frames.
        send(&mut rpmb, &mut m, &[req.clone()], false);
        let r = receive(&mut rpmb, &mut m, 2);
        assert!(r.iter().all(|f| f.result == GENERAL_FAILURE
            && f.req_resp == READ_WRITE_COUNTER_RESPONSE
            && f.write_counter == 0));
        // Counter request written as 2 frames.
        send(&mut rpmb, &mut m, &[req.clone(), req], false);
        let r = receive(&mut rpmb, &mut m, 1).remove(0);
        assert_eq!(
            (r.req_resp, r.result),
            (READ_WRITE_COUNTER_RESPONSE, GENERAL_FAILURE)
        );
        assert_eq!(r.nonce, [5; 16]);
        // Data read request written as 2 frames.
        let rr = read_request(0, [1; 16], 0);
        send(&mut rpmb, &mut m, &[rr.clone(), rr], false);
        let r = receive(&mut rpmb, &mut m, 2);
        assert!(r
            .iter()
            .all(|f| f.result == GENERAL_FAILURE && f.data == [0; 256]));
    }

    #[test]
    fn lengths_that_are_not_whole_frames_are_bus_errors() {
        let (mut rpmb, mut m) = keyed(0);
        send(
            &mut rpmb,
            &mut m,
            &[RpmbFrame::with_type(READ_WRITE_COUNTER)],
            false,
        );
        for len in [0usize, 1, 511, 513, 1023] {
            let frames = vec![0u8; len];
            assert_eq!(
                rpmb.write_frames(&frames, true, &mut m),
                Err(RpmbBusError::NotWholeFrames(len))
            );
            let mut out = vec![0u8; len];
            assert_eq!(
                rpmb.read_frames(&mut out, &mut m),
                Err(RpmbBusError::NotWholeFrames(len))
            );
        }
        // Refused transfers leave the pending request alone.
        assert_eq!(
            receive(&mut rpmb, &mut m, 1)[0].req_resp,
            READ_WRITE_COUNTER_RESPONSE
        );
    }

    #[test]
    fn partition_size_sets_the_address_range() {
        assert_eq!(
            Rpmb::new(128 * 1024, RpmbPersistent::default()).half_sectors(),
            512
        );
        assert_eq!(Rpmb::new(0, RpmbPersistent::default()).half_sectors(), 0);
        assert_eq!(
            Rpmb::new(1 << 40, RpmbPersistent::default()).half_sectors(),
            65536
        );
    }

    proptest::proptest! {
        /// Hostile input: any frames, any flags, any read sizes — results, never panics.
        #[test]
        fn garbage_frames_never_panic(
            ops in proptest::collection::vec(
                (
                    proptest::collection::vec(proptest::num::u8::ANY, 1..1600),
                    0u16..8,
                    proptest::bool::ANY,
                    1usize..4,
                    proptest::bool::ANY,
                ),
                1..12,
            ),
            keyed_start in proptest::bool::ANY,
        ) {
            let (mut rpmb, mut m) = if keyed_start { keyed(u32::MAX - 1) } else { fresh() };
            for (bytes, req, reliable, read_n, fail) in ops {
                let mut bytes = bytes;
                let whole = bytes.len() / 512 * 512;
                if whole > 0 && bytes.len() % 3 != 0 {
                    // Mostly whole frames, every one with a plausible request type.
                    bytes.truncate(whole);
                    for frame in bytes.chunks_exact_mut(512) {
                        frame[REQ_RESP_OFFSET..].copy_from_slice(&req.to_be_bytes());
                    }
                }
                m.fail_reads = fail;
                m.fail_writes = usize::from(fail);
                let w = rpmb.write_frames(&bytes, reliable, &mut m);
                proptest::prop_assert_eq!(w.is_err(), bytes.is_empty() || bytes.len() % 512 != 0);
                let mut out = vec![0u8; read_n * 512];
                proptest::prop_assert!(rpmb.read_frames(&mut out, &mut m).is_ok());
            }
        }
    }
}
