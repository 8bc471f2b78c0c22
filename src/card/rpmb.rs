//! Replay Protected Memory Block. (Being written: see the RPMB helper.)

use serde::{Deserialize, Serialize};

/// One RPMB data frame is one 512-byte block.
pub const FRAME_LEN: usize = 512;
/// RPMB addresses count 256-byte half sectors.
pub const HALF_SECTOR: usize = 256;

/// RPMB state that survives power loss; the card saves it in the image's sidecar.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RpmbPersistent {
    /// The authentication key, once programmed.
    pub key: Option<[u8; 32]>,
    pub write_counter: u32,
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
