//! CID. (Being written: see the registers helper.)
use crate::model::CidModel;

/// The CID register for `model`; `ext_csd_rev` decides the MDT year encoding.
pub fn build_cid(model: &CidModel, ext_csd_rev: u8) -> [u8; 16] {
    let _ = (model, ext_csd_rev);
    [0u8; 16]
}
