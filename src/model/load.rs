//! Finding and parsing device models. (Being written: see the model helper.)

use super::{DeviceModel, ModelError};

/// The model used when none is named.
pub const DEFAULT_MODEL: &str = "generic-emmc45";

/// Models compiled into the binary: (name, TOML text).
pub static BUILTIN_MODELS: &[(&str, &str)] = &[(
    "generic-emmc45",
    include_str!("../../device-models/generic-emmc45.toml"),
)];

pub fn builtin_model_names() -> Vec<&'static str> {
    BUILTIN_MODELS.iter().map(|(n, _)| *n).collect()
}

impl DeviceModel {
    /// Parse and validate a model from TOML text. `origin` names it in error messages.
    pub fn from_toml_str(origin: &str, text: &str) -> Result<DeviceModel, ModelError> {
        let model: DeviceModel = toml::from_str(text).map_err(|source| ModelError::Parse {
            name: origin.to_string(),
            source,
        })?;
        model.validate()?;
        Ok(model)
    }

    /// A built-in model by name, or a model file by path.
    pub fn load(name_or_path: &str) -> Result<DeviceModel, ModelError> {
        if let Some((name, text)) = BUILTIN_MODELS.iter().find(|(n, _)| *n == name_or_path) {
            return DeviceModel::from_toml_str(name, text);
        }
        let text = std::fs::read_to_string(name_or_path).map_err(|source| {
            if source.kind() == std::io::ErrorKind::NotFound {
                ModelError::NotFound(name_or_path.to_string())
            } else {
                ModelError::Io {
                    path: name_or_path.to_string(),
                    source,
                }
            }
        })?;
        DeviceModel::from_toml_str(name_or_path, &text)
    }
}
