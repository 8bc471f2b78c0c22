//! Human-readable decoding of CID, CSD and EXT_CSD, in the manner of `mmc extcsd read`.
//! (Being written: see the registers helper.)

/// Render the three registers as text.
pub fn render(cid: &[u8; 16], csd: &[u8; 16], ext_csd: &[u8; 512]) -> String {
    let _ = (cid, csd, ext_csd);
    String::new()
}
