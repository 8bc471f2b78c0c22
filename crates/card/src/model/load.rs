//! Finding and parsing device models: built-in models compiled into the binary, or a TOML
//! file by path. Parsing rejects unknown keys (`deny_unknown_fields`); validation follows.
//!
//! Two references are resolved before a model is typed:
//! - `extends = "MODEL"` (a built-in model, or a file path relative to the file that names
//!   it): the other model's tables are the base and this file's keys replace theirs, table
//!   by table, key by key (arrays and the `host` key whole). `name` and `description` are
//!   never inherited. A chain may be [`MAX_EXTENDS`] deep.
//! - `host = "PROFILE"` (a built-in host profile, `device-models/hosts/`, or a path): the
//!   profile's table becomes the model's `[host]`. An inline `[host]` table may itself say
//!   `extends = "PROFILE"` and override keys. No `host` at all means [`DEFAULT_HOST`].
//!
//! Text given without a file ([`DeviceModel::from_toml_str`]) may name built-ins only, so
//! a fuzzer or a control message cannot make the loader read files.

use std::path::{Path, PathBuf};

use super::{DeviceModel, HostProfile, ModelError};

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

/// The host profile of a model that names none.
pub const DEFAULT_HOST: &str = "sdhci-hs52";

/// Host profiles compiled into the binary: (name, TOML text).
pub static BUILTIN_HOSTS: &[(&str, &str)] = &[
    (
        "sdhci-hs52",
        include_str!("../../../../device-models/hosts/sdhci-hs52.toml"),
    ),
    (
        "sdhci-hs200",
        include_str!("../../../../device-models/hosts/sdhci-hs200.toml"),
    ),
    (
        "seed003-toshiba-host",
        include_str!("../../../../device-models/hosts/seed003-toshiba-host.toml"),
    ),
    (
        "seed003-sandisk-host",
        include_str!("../../../../device-models/hosts/seed003-sandisk-host.toml"),
    ),
    (
        "marvell-sdhci-2012",
        include_str!("../../../../device-models/hosts/marvell-sdhci-2012.toml"),
    ),
    (
        "msm-sdcc-sdr50",
        include_str!("../../../../device-models/hosts/msm-sdcc-sdr50.toml"),
    ),
    (
        "msm-sdcc-ddr50",
        include_str!("../../../../device-models/hosts/msm-sdcc-ddr50.toml"),
    ),
];

/// How many files an `extends` chain may pass through.
pub const MAX_EXTENDS: usize = 8;

pub fn builtin_model_names() -> Vec<&'static str> {
    BUILTIN_MODELS.iter().map(|(n, _)| *n).collect()
}

pub fn builtin_host_names() -> Vec<&'static str> {
    BUILTIN_HOSTS.iter().map(|(n, _)| *n).collect()
}

/// What a model or host file is: its text, the name errors give it, and the directory
/// its relative references start from (`None` for a built-in or for bare text).
pub(super) struct Source {
    pub(super) origin: String,
    pub(super) text: String,
    dir: Option<PathBuf>,
}

/// The two kinds of file a reference can name.
#[derive(Clone, Copy)]
pub(super) enum Kind {
    Model,
    Host,
}

impl Kind {
    fn builtins(self) -> &'static [(&'static str, &'static str)] {
        match self {
            Kind::Model => BUILTIN_MODELS,
            Kind::Host => BUILTIN_HOSTS,
        }
    }

    /// The key a reference to this kind is written under, for error messages.
    fn key(self) -> &'static str {
        match self {
            Kind::Model => "extends",
            Kind::Host => "host",
        }
    }
}

impl Source {
    /// The file a reader opens it as: `device-models/…` for a built-in, else its path.
    pub(super) fn file_name(&self, kind: Kind) -> String {
        let builtin = self.dir.is_none() && kind.builtins().iter().any(|(n, _)| *n == self.origin);
        match (builtin, kind) {
            (true, Kind::Model) => format!("device-models/{}.toml", self.origin),
            (true, Kind::Host) => format!("device-models/hosts/{}.toml", self.origin),
            (false, _) => self.origin.clone(),
        }
    }

    fn builtin(name: &str, text: &str) -> Source {
        Source {
            origin: name.to_string(),
            text: text.to_string(),
            dir: None,
        }
    }

    fn file(path: &Path) -> Result<Source, std::io::Error> {
        Ok(Source {
            origin: path.display().to_string(),
            text: std::fs::read_to_string(path)?,
            dir: Some(path.parent().unwrap_or(Path::new(".")).to_path_buf()),
        })
    }

    /// The file `reference` names from this source: a built-in of `kind` by name, else a
    /// path (relative to this file's directory) when this source is a file.
    pub(super) fn resolve(&self, kind: Kind, reference: &str) -> Result<Source, ModelError> {
        if let Some((name, text)) = kind.builtins().iter().find(|(n, _)| *n == reference) {
            return Ok(Source::builtin(name, text));
        }
        let invalid = |problem: String| ModelError::Invalid {
            name: self.origin.clone(),
            field: kind.key(),
            problem,
        };
        let names = kind.builtins().iter().map(|(n, _)| *n).collect::<Vec<_>>();
        let Some(dir) = &self.dir else {
            return Err(invalid(format!(
                "{reference:?} is not a built-in ({})",
                names.join(", ")
            )));
        };
        let path = dir.join(reference);
        Source::file(&path).map_err(|e| {
            invalid(format!(
                "{reference:?} is not a built-in ({}) and {} cannot be read: {e}",
                names.join(", "),
                path.display()
            ))
        })
    }

    fn table(&self) -> Result<toml::Table, ModelError> {
        toml::from_str(&self.text).map_err(|source| ModelError::Parse {
            name: self.origin.clone(),
            source,
        })
    }

    /// `table` (this file's, or a table inside it) with its `extends` chain merged in,
    /// `seen` holding the origins already on the chain.
    fn extend(
        &self,
        mut table: toml::Table,
        kind: Kind,
        seen: &mut Vec<String>,
    ) -> Result<toml::Table, ModelError> {
        let Some(parent) = table.remove("extends") else {
            return Ok(table);
        };
        let invalid = |problem: String| ModelError::Invalid {
            name: self.origin.clone(),
            field: "extends",
            problem,
        };
        let reference = parent
            .as_str()
            .ok_or_else(|| invalid(format!("{parent} is not a name or a path")))?;
        let source = self.resolve(kind, reference)?;
        if seen.contains(&source.origin) || seen.len() >= MAX_EXTENDS {
            return Err(invalid(format!(
                "{reference:?} makes a chain {} (at most {MAX_EXTENDS} files, no cycles)",
                seen.join(" → ")
            )));
        }
        seen.push(source.origin.clone());
        let mut base = source.extend(source.table()?, kind, seen)?;
        base.remove("name");
        base.remove("description");
        overlay(&mut base, table);
        Ok(base)
    }

    /// The model's table, both references resolved: ready to be typed.
    fn model_table(&self) -> Result<toml::Table, ModelError> {
        let mut table = self.extend(self.table()?, Kind::Model, &mut vec![self.origin.clone()])?;
        let host = match table.remove("host") {
            None => self.resolve(Kind::Host, DEFAULT_HOST)?.host_table()?,
            Some(toml::Value::String(reference)) => {
                self.resolve(Kind::Host, &reference)?.host_table()?
            }
            // An inline table resolves its own `extends` from this file's place.
            Some(toml::Value::Table(inline)) => self.extend(inline, Kind::Host, &mut Vec::new())?,
            Some(other) => {
                return Err(ModelError::Invalid {
                    name: self.origin.clone(),
                    field: "host",
                    problem: format!("{other} is not a host profile's name, path or table"),
                })
            }
        };
        table.insert("host".into(), toml::Value::Table(host));
        Ok(table)
    }

    /// A host profile file's table with its `extends` chain merged in.
    fn host_table(&self) -> Result<toml::Table, ModelError> {
        let mut table = self.extend(self.table()?, Kind::Host, &mut vec![self.origin.clone()])?;
        // A named profile carries its name even where a parent gave none.
        table
            .entry("name")
            .or_insert_with(|| toml::Value::String(self.origin.clone()));
        Ok(table)
    }

    /// Parse, resolve, type and validate.
    fn model(&self) -> Result<DeviceModel, ModelError> {
        let table = self.model_table()?;
        let model: DeviceModel = table.try_into().map_err(|source| ModelError::Parse {
            name: self.origin.clone(),
            source,
        })?;
        // Name the origin (a file path, or the built-in name) as parse errors do, so the
        // message says which file to fix.
        model.validate().map_err(|e| match e {
            ModelError::Invalid { field, problem, .. } => ModelError::Invalid {
                name: self.origin.clone(),
                field,
                problem,
            },
            other => other,
        })?;
        Ok(model)
    }
}

/// Lay `top` over `base`: tables merge key by key, everything else (values, arrays, and
/// the `host` reference, which names one profile) replaces what was there.
fn overlay(base: &mut toml::Table, top: toml::Table) {
    for (key, value) in top {
        match (base.get_mut(&key), value) {
            (Some(toml::Value::Table(below)), toml::Value::Table(above)) if key != "host" => {
                overlay(below, above)
            }
            (_, value) => {
                base.insert(key, value);
            }
        }
    }
}

impl HostProfile {
    /// A built-in host profile by name, or a host profile file by path, checked as far as
    /// it can be without a card (the bus mode against the card's DEVICE_TYPE is checked
    /// with the model that names it).
    pub fn load(name_or_path: &str) -> Result<HostProfile, ModelError> {
        let here = Source {
            origin: "command line".into(),
            text: String::new(),
            dir: Some(PathBuf::from(".")),
        };
        let source = here
            .resolve(Kind::Host, name_or_path)
            .map_err(|e| match e {
                ModelError::Invalid { .. } if !Path::new(name_or_path).exists() => {
                    ModelError::NotFound(name_or_path.to_string())
                }
                other => other,
            })?;
        let host: HostProfile =
            source
                .host_table()?
                .try_into()
                .map_err(|error| ModelError::Parse {
                    name: source.origin.clone(),
                    source: error,
                })?;
        host.validate().map_err(|e| match e {
            ModelError::Invalid { field, problem, .. } => ModelError::Invalid {
                name: source.origin.clone(),
                field,
                problem,
            },
            other => other,
        })?;
        Ok(host)
    }
}

impl DeviceModel {
    /// Parse and validate a model from TOML text. `origin` names it in error messages.
    /// `extends` and `host` may name built-ins only (there is no file to start a path from).
    pub fn from_toml_str(origin: &str, text: &str) -> Result<DeviceModel, ModelError> {
        Source::builtin(origin, text).model()
    }

    /// A built-in model by name, or a model file by path.
    pub fn load(name_or_path: &str) -> Result<DeviceModel, ModelError> {
        Source::model_file(name_or_path)?.model()
    }
}

impl Source {
    /// The file [`DeviceModel::load`] reads for `name_or_path`: a built-in by name, else a
    /// file by path.
    pub(super) fn model_file(name_or_path: &str) -> Result<Source, ModelError> {
        if let Some((name, text)) = BUILTIN_MODELS.iter().find(|(n, _)| *n == name_or_path) {
            return Ok(Source::builtin(name, text));
        }
        let source = Source::file(Path::new(name_or_path)).map_err(|source| {
            if source.kind() == std::io::ErrorKind::NotFound {
                ModelError::NotFound(name_or_path.to_string())
            } else {
                ModelError::Io {
                    path: name_or_path.to_string(),
                    source,
                }
            }
        })?;
        Ok(Source {
            origin: name_or_path.to_string(),
            ..source
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::HostProfile;

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

    // Every value's comment, with its provenance tag: `provenance.rs`'s tests.

    #[test]
    fn a_missing_model_names_the_built_in_ones() {
        let err = DeviceModel::load("/nonexistent/model.toml").unwrap_err();
        assert!(matches!(err, ModelError::NotFound(_)), "{err}");
        assert!(err.to_string().contains(DEFAULT_MODEL), "{err}");
    }

    fn constant(m: &DeviceModel) -> &crate::model::ConstantTimingModel {
        match &m.timing {
            crate::model::TimingModel::Constant(c) => c,
            crate::model::TimingModel::Flash(_) => panic!("not a constant-cost model"),
        }
    }

    /// Every built-in model names a built-in host profile, every profile is some model's,
    /// and a profile's name key is the name it is found by.
    #[test]
    fn every_builtin_host_profile_is_named_and_used() {
        let models: Vec<DeviceModel> = builtin_model_names()
            .into_iter()
            .map(|n| DeviceModel::load(n).unwrap())
            .collect();
        for host in builtin_host_names() {
            assert!(
                models.iter().any(|m| m.host.name == host),
                "host profile {host} is no built-in model's"
            );
        }
        for m in &models {
            assert!(
                builtin_host_names().contains(&m.host.name.as_str()),
                "{}: host {:?}",
                m.name,
                m.host.name
            );
            assert!(!m.host.description.is_empty(), "{}", m.host.name);
        }
    }

    /// msm-emmc45-ddr50 extends msm-emmc45-sdr50 and names another host profile, which
    /// itself extends the SDR one: the same card, the same host but for the bus mode.
    #[test]
    fn a_model_that_extends_another_is_that_card_with_what_it_states() {
        let sdr = DeviceModel::load("msm-emmc45-sdr50").unwrap();
        let ddr = DeviceModel::load("msm-emmc45-ddr50").unwrap();
        assert_eq!(ddr.name, "msm-emmc45-ddr50");
        assert_ne!(ddr.description, sdr.description);
        assert_eq!(
            (&ddr.cid, &ddr.csd, &ddr.ext_csd),
            (&sdr.cid, &sdr.csd, &sdr.ext_csd)
        );
        assert_eq!(ddr.timing, sdr.timing);
        assert_eq!(
            (sdr.host.timing, ddr.host.timing),
            (crate::model::BusTiming::Hs, crate::model::BusTiming::Ddr52)
        );
        assert_eq!(
            ddr.host,
            HostProfile {
                name: "msm-sdcc-ddr50".into(),
                description: ddr.host.description.clone(),
                timing: crate::model::BusTiming::Ddr52,
                ..sdr.host.clone()
            }
        );
    }

    /// Tables merge key by key, arrays and values replace, and the rest is the base's.
    #[test]
    fn extends_replaces_keys_and_arrays_and_keeps_the_rest() {
        let generic = DeviceModel::load("generic-emmc45").unwrap();
        let text = r#"
            name = "tuned"
            description = "generic-emmc45 with a slower access"
            extends = "generic-emmc45"
            [cid]
            pnm = "TUNED1"
            [timing]
            read_access_ns = 150000
            bkops_level_ns = [60000000, 300000000, 900000000]
        "#;
        let m = DeviceModel::from_toml_str("tuned", text).unwrap();
        assert_eq!(m.name, "tuned");
        assert_eq!(m.cid.pnm, "TUNED1");
        assert_eq!(m.cid.psn, generic.cid.psn);
        assert_eq!(m.ext_csd, generic.ext_csd);
        assert_eq!(m.host, generic.host);
        let (t, g) = (constant(&m), constant(&generic));
        assert_eq!(t.read_access_ns, 150_000);
        assert_eq!(t.bkops_level_ns, [60_000_000, 300_000_000, 900_000_000]);
        assert_eq!(t.program_command_ns, g.program_command_ns);
    }

    #[test]
    fn name_and_description_are_never_inherited() {
        let err = DeviceModel::from_toml_str(
            "child",
            "extends = \"generic-emmc45\"\ndescription = \"no name\"\n",
        )
        .unwrap_err();
        assert!(matches!(err, ModelError::Parse { .. }), "{err}");
        assert!(err.to_string().contains("name"), "{err}");
    }

    /// Text without a file may name built-ins only: a fuzzer or a control message cannot
    /// make the loader open files.
    #[test]
    fn text_without_a_file_names_built_ins_only() {
        for (key, text) in [
            ("extends", "name = \"x\"\ndescription = \"x\"\nextends = \"/etc/hostname\"\n"),
            ("host", "name = \"x\"\ndescription = \"x\"\nextends = \"ideal\"\nhost = \"/etc/hostname\"\n"),
        ] {
            let err = DeviceModel::from_toml_str("text", text).unwrap_err();
            match &err {
                ModelError::Invalid { field, problem, .. } => {
                    assert_eq!(*field, key, "{err}");
                    assert!(problem.contains("not a built-in"), "{err}");
                }
                other => panic!("{other}"),
            }
        }
    }

    /// A model file names a host profile file beside it; the profile extends a built-in
    /// one. An inline `[host]` table may extend a profile too.
    #[test]
    fn files_name_host_profiles_beside_them_and_inline_tables_extend_profiles() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(
            dir.path().join("myhost.toml"),
            "description = \"msm with a slower stack\"\nextends = \"msm-sdcc-sdr50\"\nrequest_overhead_ns = 300000\n",
        )
        .unwrap();
        let card = dir.path().join("card.toml");
        std::fs::write(
            &card,
            "name = \"card\"\ndescription = \"msm's card\"\nextends = \"msm-emmc45-sdr50\"\nhost = \"myhost.toml\"\n",
        )
        .unwrap();
        let m = DeviceModel::load(card.to_str().unwrap()).unwrap();
        let msm = DeviceModel::load("msm-emmc45-sdr50").unwrap();
        assert_eq!(m.host.request_overhead_ns, 300_000);
        assert_eq!(m.host.max_hw_sectors_kb, msm.host.max_hw_sectors_kb);
        assert!(m.host.name.ends_with("myhost.toml"), "{}", m.host.name);
        assert_eq!(m.timing, msm.timing);

        let inline = "name = \"x\"\ndescription = \"x\"\nextends = \"msm-emmc45-sdr50\"\n\
                      [host]\nextends = \"msm-sdcc-sdr50\"\ntiming = \"ddr52\"\n";
        let m = DeviceModel::from_toml_str("inline", inline).unwrap();
        let ddr = DeviceModel::load("msm-emmc45-ddr50").unwrap();
        assert_eq!(m.host.timing, ddr.host.timing);
        assert_eq!(
            m.host.controller_only(),
            HostProfile {
                name: m.host.name.clone(),
                description: m.host.description.clone(),
                ..ddr.host.controller_only()
            }
        );
    }

    #[test]
    fn a_model_without_a_host_gets_the_default_profile() {
        let (_, text) = BUILTIN_MODELS
            .iter()
            .find(|(n, _)| *n == "toshiba-mmc32g")
            .unwrap();
        let text: Vec<&str> = text.lines().filter(|l| !l.starts_with("host =")).collect();
        let m = DeviceModel::from_toml_str("no host", &text.join("\n")).unwrap();
        assert_eq!(m.host.name, DEFAULT_HOST);
        assert_eq!(m.host.request_overhead_ns, 0);
    }

    #[test]
    fn an_extends_cycle_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        for (me, other) in [("a", "b"), ("b", "a")] {
            std::fs::write(
                dir.path().join(format!("{me}.toml")),
                format!("name = \"{me}\"\ndescription = \"{me}\"\nextends = \"{other}.toml\"\n"),
            )
            .unwrap();
        }
        let err = DeviceModel::load(dir.path().join("a.toml").to_str().unwrap()).unwrap_err();
        match &err {
            ModelError::Invalid { field, problem, .. } => {
                assert_eq!(*field, "extends");
                assert!(problem.contains("no cycles"), "{err}");
            }
            other => panic!("{other}"),
        }
    }

    #[test]
    fn a_host_profile_loads_alone_by_name_or_path() {
        let ddr = HostProfile::load("msm-sdcc-ddr50").unwrap();
        assert_eq!(ddr.name, "msm-sdcc-ddr50");
        assert_eq!(ddr.timing, crate::model::BusTiming::Ddr52);
        assert_eq!(
            ddr.max_hw_sectors_kb, 4096,
            "from msm-sdcc-sdr50, which it extends"
        );
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("wide.toml");
        std::fs::write(&path, "extends = \"sdhci-hs52\"\nbus_width = 16\n").unwrap();
        let err = HostProfile::load(path.to_str().unwrap()).unwrap_err();
        assert!(err.to_string().contains("host.bus_width"), "{err}");
        let err = HostProfile::load("no-such-host").unwrap_err();
        assert!(matches!(err, ModelError::NotFound(_)), "{err}");
    }
}
