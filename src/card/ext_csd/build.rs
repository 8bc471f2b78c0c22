//! Initial EXT_CSD contents from a device model. (Being written: see the registers helper.)
use super::EXT_CSD_LEN;
use crate::model::DeviceModel;

/// The EXT_CSD of a fresh card of this model: every property byte from the model, modes
/// bytes at their power-on defaults.
pub fn build_ext_csd(model: &DeviceModel) -> [u8; EXT_CSD_LEN] {
    let _ = model;
    [0u8; EXT_CSD_LEN]
}
