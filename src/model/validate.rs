//! Validation of device models. (Being written: see the model helper.)

use super::{DeviceModel, ModelError};

impl DeviceModel {
    /// Check ranges and consistency; every problem names its field.
    pub fn validate(&self) -> Result<(), ModelError> {
        Ok(())
    }
}
