//! Finding and parsing device models: built-in models compiled into the binary, or a TOML
//! file by path. Parsing rejects unknown keys (`deny_unknown_fields`); validation follows.

use super::{DeviceModel, ModelError};

/// The model used when none is named.
pub const DEFAULT_MODEL: &str = "generic-emmc45";

/// Models compiled into the binary: (name, TOML text).
pub static BUILTIN_MODELS: &[(&str, &str)] = &[
    (
        "generic-emmc45",
        include_str!("../../../../device-models/generic-emmc45.toml"),
    ),
    (
        "toshiba-mmc32g",
        include_str!("../../../../device-models/toshiba-mmc32g.toml"),
    ),
    (
        "sandisk-sem32g",
        include_str!("../../../../device-models/sandisk-sem32g.toml"),
    ),
    (
        "sandisk-emmc45",
        include_str!("../../../../device-models/sandisk-emmc45.toml"),
    ),
    (
        "msm-emmc45-sdr50",
        include_str!("../../../../device-models/msm-emmc45-sdr50.toml"),
    ),
    (
        "msm-emmc45-ddr50",
        include_str!("../../../../device-models/msm-emmc45-ddr50.toml"),
    ),
    (
        "ideal",
        include_str!("../../../../device-models/ideal.toml"),
    ),
];

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
        // Name the origin (a file path, or the built-in name) as parse errors do, so the
        // message says which file to fix.
        model.validate().map_err(|e| match e {
            ModelError::Invalid { field, problem, .. } => ModelError::Invalid {
                name: origin.to_string(),
                field,
                problem,
            },
            other => other,
        })?;
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_builtin_model_loads_and_validates() {
        assert!(builtin_model_names().contains(&DEFAULT_MODEL));
        for name in builtin_model_names() {
            let model = DeviceModel::load(name).unwrap_or_else(|e| panic!("{e}"));
            assert_eq!(
                model.name, name,
                "a built-in model's name key must match its name"
            );
        }
    }

    /// Model files document every value: each `key = value` line except the name and the
    /// description carries a comment giving the meaning and the source of the number.
    #[test]
    fn every_builtin_model_value_carries_a_comment() {
        for (name, text) in BUILTIN_MODELS {
            for (n, line) in text.lines().enumerate() {
                let line = line.trim();
                if line.starts_with('#') || line.starts_with('[') || !line.contains('=') {
                    continue;
                }
                let key = line.split('=').next().unwrap().trim();
                if key == "name" || key == "description" {
                    continue;
                }
                assert!(
                    line.contains('#'),
                    "{name}.toml line {}: `{line}` has no comment with its source",
                    n + 1
                );
            }
        }
    }

    #[test]
    fn a_missing_model_names_the_built_in_ones() {
        let err = DeviceModel::load("/nonexistent/model.toml").unwrap_err();
        assert!(matches!(err, ModelError::NotFound(_)), "{err}");
        assert!(err.to_string().contains(DEFAULT_MODEL), "{err}");
    }
}
