//! Where every model knob comes from, as the model files say it: the trailing comment of
//! each `key = value` line starts with one tag, then the reason.
//!
//! | tag | meaning |
//! |---|---|
//! | `[seed NNN]` | a fact seed NNN states about the card or host (CID bytes, a page size per the vendor) |
//! | `[fitted ROW, …]` | chosen so the model reaches those seed figures (ids of the fidelity table, [`fidelity_row_ids`]) |
//! | `[spec]` | set by the eMMC spec or `emmc45-facts` |
//! | `[linux]` | taken from Linux's source (sdhci's limits …) |
//! | `[assumed]` | chosen without a measurement; the reason says why this value |
//! | `[derived]` | follows from other values, which the reason names |
//!
//! [`knobs`] reads them (with `toml_edit`, which keeps comments) from a model, the models
//! it extends and its host profile with the profiles that extends, and gives each knob
//! the file that sets its value, as the loader merges them (`load.rs`). `name`,
//! `description` and the references (`extends`, `host = "NAME"`) are not knobs, but a
//! reference's comment must carry a tag too.

use std::fmt;

use toml_edit::{Document, Item, RawString, Table, Value};

use super::load::{Kind, Source, MAX_EXTENDS};
use super::{DeviceModel, ModelError, DEFAULT_HOST};

/// The fidelity table's row ids (issue 15), one a line: what `[fitted …]` may name.
pub const FIDELITY_ROWS: &str = include_str!("fidelity-rows.txt");

/// The ids of [`FIDELITY_ROWS`].
pub fn fidelity_row_ids() -> impl Iterator<Item = &'static str> {
    FIDELITY_ROWS
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
}

/// Where a knob's value comes from.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub enum Provenance {
    /// A fact the seed thread of this number states.
    Seed(u16),
    /// Chosen so the model reaches these seed figures (fidelity row ids).
    Fitted(Vec<String>),
    /// Set by the eMMC spec, or by emmc45-facts.
    Spec,
    /// Taken from Linux's source.
    Linux,
    /// Chosen without a measurement.
    Assumed,
    /// Follows from other values.
    Derived,
}

impl Provenance {
    /// The kinds, in the order summaries list them.
    pub const KINDS: [&'static str; 6] = ["seed", "fitted", "spec", "linux", "assumed", "derived"];

    /// The kind's name, without its argument: `seed`, `fitted`, ….
    pub fn kind(&self) -> &'static str {
        match self {
            Provenance::Seed(_) => "seed",
            Provenance::Fitted(_) => "fitted",
            Provenance::Spec => "spec",
            Provenance::Linux => "linux",
            Provenance::Assumed => "assumed",
            Provenance::Derived => "derived",
        }
    }

    /// A tag's text between its brackets, or what is wrong with it.
    pub fn parse(tag: &str) -> Result<Provenance, String> {
        let tag = tag.trim();
        let (word, arg) = match tag.split_once(' ') {
            Some((w, a)) => (w, Some(a.trim())),
            None => (tag, None),
        };
        match (word, arg) {
            ("seed", Some(n)) if n.len() == 3 && n.bytes().all(|b| b.is_ascii_digit()) => {
                Ok(Provenance::Seed(n.parse().expect("three digits")))
            }
            ("seed", _) => Err(format!(
                "[{tag}]: a seed is named by its three digits, as [seed 003]"
            )),
            ("fitted", Some(rows)) => {
                let rows: Vec<String> = rows.split(',').map(|r| r.trim().to_string()).collect();
                match rows.iter().find(|r| !is_row_id(r)) {
                    Some(bad) => Err(format!(
                        "[{tag}]: {bad:?} is not a fidelity row id (sNNN-card-measurement…)"
                    )),
                    None => Ok(Provenance::Fitted(rows)),
                }
            }
            ("fitted", None) => Err(format!(
                "[{tag}]: name the figures it was fitted to, as [fitted s003-toshiba-linear-32k]"
            )),
            ("spec", None) => Ok(Provenance::Spec),
            ("linux", None) => Ok(Provenance::Linux),
            ("assumed", None) => Ok(Provenance::Assumed),
            ("derived", None) => Ok(Provenance::Derived),
            _ => Err(format!(
                "unknown tag [{tag}]: expected [seed NNN], [fitted ROW, …], [spec], [linux], \
                 [assumed] or [derived]"
            )),
        }
    }
}

/// `s` + three digits + `-` + lower-case words joined by `-`.
fn is_row_id(id: &str) -> bool {
    let Some(rest) = id.strip_prefix('s') else {
        return false;
    };
    let (seed, rest) = rest.split_at(rest.len().min(3));
    seed.len() == 3
        && seed.bytes().all(|b| b.is_ascii_digit())
        && rest.len() > 1
        && rest.starts_with('-')
        && !rest.ends_with('-')
        && rest
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
}

impl fmt::Display for Provenance {
    /// The tag as written in a file, without brackets.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Provenance::Seed(n) => write!(f, "seed {n:03}"),
            Provenance::Fitted(rows) => write!(f, "fitted {}", rows.join(", ")),
            other => f.write_str(other.kind()),
        }
    }
}

/// One knob of a model: a leaf key as the loader resolves it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Knob {
    /// Dotted path in the resolved model: `timing.nand.program_page_ns`,
    /// `host.request_overhead_ns`.
    pub path: String,
    /// The value as written (`0x0E`, `"flash"`, `[0, 0, 0]`).
    pub value: String,
    pub kind: Provenance,
    /// The comment after the tag.
    pub reason: String,
    /// The file that sets the value: `device-models/…` for a built-in, else its path.
    pub file: String,
    /// Its line there (1-based).
    pub line: usize,
}

impl Knob {
    /// The table it sits in (`timing.nand`, `host`), `""` at the top.
    pub fn section(&self) -> &str {
        self.path.rsplit_once('.').map_or("", |(s, _)| s)
    }

    /// The key within its table.
    pub fn key(&self) -> &str {
        self.path.rsplit_once('.').map_or(&self.path, |(_, k)| k)
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ProvenanceError {
    #[error(transparent)]
    Model(#[from] ModelError),
    #[error("{file}: {message}")]
    Parse { file: String, message: String },
    #[error(
        "{file}:{line}: {key} has no provenance tag: its trailing comment must start with \
         [seed NNN], [fitted ROW, …], [spec], [linux], [assumed] or [derived], then the reason"
    )]
    MissingTag {
        file: String,
        key: String,
        line: usize,
    },
    #[error("{file}:{line}: {key}: {problem}")]
    BadTag {
        file: String,
        key: String,
        line: usize,
        problem: String,
    },
}

/// A model's knobs and the files they come from.
#[derive(Debug, Clone)]
pub struct ModelProvenance {
    /// The model's name and description, as loaded.
    pub name: String,
    pub description: String,
    /// The model's file, then each one it extends.
    pub files: Vec<String>,
    /// The host profile's name, its file, then each one it extends (empty for an inline
    /// `[host]` table without `extends`).
    pub host: String,
    pub host_files: Vec<String>,
    /// Card knobs in file order, then the host's (`host.…`). Keys a file leaves out take
    /// the defaults in `model/*.rs` and are not here.
    pub knobs: Vec<Knob>,
}

/// Every knob of a model (a built-in name or a model file's path), with its provenance.
pub fn knobs(name_or_path: &str) -> Result<Vec<Knob>, ProvenanceError> {
    Ok(model_provenance(name_or_path)?.knobs)
}

/// [`knobs`], with the files they come from.
pub fn model_provenance(name_or_path: &str) -> Result<ModelProvenance, ProvenanceError> {
    // Loading first reports a bad model (and an `extends` cycle) as the loader does.
    let model = DeviceModel::load(name_or_path)?;

    // The model's chain, the model's file first.
    let (chain, parsed) = extends_chain(Source::model_file(name_or_path)?, Kind::Model)?;

    // Base first, each file's keys over the ones below; the last `host` key wins whole.
    let mut card = Vec::new();
    let mut host_ref: Option<(HostRef, usize)> = None;
    for (i, file) in parsed.iter().enumerate().rev() {
        if let Some(h) = &file.host {
            host_ref = Some((h.clone(), i));
        }
        lay_over(
            &mut card,
            file.entries
                .iter()
                .filter(|k| !k.path.starts_with("host."))
                .cloned(),
        );
    }

    let (_, host_files, mut host) = match host_ref {
        None => host_chain(&chain[0], DEFAULT_HOST)?,
        Some((HostRef::Named(name), i)) => host_chain(&chain[i], &name)?,
        Some((HostRef::Inline(extends), i)) => {
            let (_, files, mut knobs) = match extends {
                Some(parent) => host_chain(&chain[i], &parent)?,
                None => (String::new(), Vec::new(), Vec::new()),
            };
            lay_over(
                &mut knobs,
                parsed[i].entries.iter().filter_map(|k| {
                    let key = k.path.strip_prefix("host.")?;
                    Some(Knob {
                        path: key.to_string(),
                        ..k.clone()
                    })
                }),
            );
            (model.host.name.clone(), files, knobs)
        }
    };
    for k in &mut host {
        k.path = format!("host.{}", k.path);
    }
    card.append(&mut host);
    Ok(ModelProvenance {
        name: model.name,
        description: model.description,
        files: parsed.into_iter().map(|f| f.file).collect(),
        host: model.host.name,
        host_files,
        knobs: card,
    })
}

/// A host profile's name, its files (the profile's first) and its knobs (paths without
/// `host.`), `reference` resolved from `from`.
/// `first` and the files its `extends` keys name, in that order, each parsed with its
/// tags (at most [`MAX_EXTENDS`] deep, as the loader goes).
fn extends_chain(
    first: Source,
    kind: Kind,
) -> Result<(Vec<Source>, Vec<TaggedFile>), ProvenanceError> {
    let mut parsed = vec![tagged_file(&first, kind)?];
    let mut chain = vec![first];
    while let Some(parent) = parsed.last().and_then(|f| f.extends.clone()) {
        if chain.len() > MAX_EXTENDS {
            break;
        }
        let source = chain.last().expect("one file").resolve(kind, &parent)?;
        parsed.push(tagged_file(&source, kind)?);
        chain.push(source);
    }
    Ok((chain, parsed))
}

fn host_chain(
    from: &Source,
    reference: &str,
) -> Result<(String, Vec<String>, Vec<Knob>), ProvenanceError> {
    let (chain, parsed) = extends_chain(from.resolve(Kind::Host, reference)?, Kind::Host)?;
    let mut knobs = Vec::new();
    for file in parsed.iter().rev() {
        lay_over(&mut knobs, file.entries.iter().cloned());
    }
    Ok((
        chain[0].origin.clone(),
        parsed.into_iter().map(|f| f.file).collect(),
        knobs,
    ))
}

/// Lay `top` over `base` as the loader's `overlay` does: a key replaces the same key
/// (in place), and everything under it or above it; a new key joins the end of its table.
fn lay_over(base: &mut Vec<Knob>, top: impl IntoIterator<Item = Knob>) {
    for knob in top {
        if let Some(same) = base.iter_mut().find(|k| k.path == knob.path) {
            *same = knob;
            continue;
        }
        let below = |a: &str, b: &str| {
            a.len() > b.len() && a.starts_with(b) && a[b.len()..].starts_with('.')
        };
        base.retain(|k| !below(&k.path, &knob.path) && !below(&knob.path, &k.path));
        match base.iter().rposition(|k| k.section() == knob.section()) {
            Some(i) => base.insert(i + 1, knob),
            None => base.push(knob),
        }
    }
}

/// How a model file names its host.
#[derive(Debug, Clone)]
enum HostRef {
    Named(String),
    /// An inline `[host]` table, and the profile it extends.
    Inline(Option<String>),
}

/// One file's tagged keys and references.
struct TaggedFile {
    file: String,
    entries: Vec<Knob>,
    extends: Option<String>,
    host: Option<HostRef>,
}

/// Read one model or host file: every leaf key's tag (checked), the knobs (every key but
/// `name`, `description` and the references), and the references.
fn tagged_file(source: &Source, kind: Kind) -> Result<TaggedFile, ProvenanceError> {
    let file = source.file_name(kind);
    let mut entries = tagged_keys(&source.text, &file)?;
    let text_of = |entries: &[Knob], path: &str| {
        entries
            .iter()
            .find(|k| k.path == path)
            .map(|k| k.value.trim_matches('"').to_string())
    };
    let extends = text_of(&entries, "extends");
    let host = match kind {
        Kind::Host => None,
        Kind::Model => match text_of(&entries, "host") {
            Some(name) => Some(HostRef::Named(name)),
            None if entries.iter().any(|k| k.path.starts_with("host.")) => {
                Some(HostRef::Inline(text_of(&entries, "host.extends")))
            }
            None => None,
        },
    };
    entries.retain(|k| !["extends", "host", "host.extends"].contains(&k.path.as_str()));
    Ok(TaggedFile {
        file,
        entries,
        extends,
        host,
    })
}

/// Every leaf key of a TOML text with its tag, `name` and `description` at the top
/// excepted (they carry no comment). Arrays are leaves; the keys of an inline table take
/// its trailing comment unless they have their own.
pub fn tagged_keys(text: &str, file: &str) -> Result<Vec<Knob>, ProvenanceError> {
    let doc = Document::parse(text).map_err(|e| ProvenanceError::Parse {
        file: file.to_string(),
        message: e.to_string(),
    })?;
    let mut walk = Walk {
        text,
        file,
        out: Vec::new(),
    };
    walk.table(doc.as_table(), "")?;
    Ok(walk.out)
}

struct Walk<'a> {
    text: &'a str,
    file: &'a str,
    out: Vec<Knob>,
}

impl Walk<'_> {
    fn raw<'r>(&'r self, r: &'r RawString) -> &'r str {
        r.as_str()
            .or_else(|| r.span().and_then(|s| self.text.get(s)))
            .unwrap_or("")
    }

    fn table(&mut self, table: &Table, prefix: &str) -> Result<(), ProvenanceError> {
        for (key, item) in table.iter() {
            let path = join(prefix, key);
            match item {
                Item::None => {}
                Item::Table(t) => self.table(t, &path)?,
                Item::ArrayOfTables(a) => {
                    for (i, t) in a.iter().enumerate() {
                        self.table(t, &format!("{path}[{i}]"))?;
                    }
                }
                Item::Value(_) if prefix.is_empty() && (key == "name" || key == "description") => {}
                Item::Value(v) => self.value(v, path, None)?,
            }
        }
        Ok(())
    }

    fn value(
        &mut self,
        value: &Value,
        path: String,
        outer: Option<(String, usize)>,
    ) -> Result<(), ProvenanceError> {
        let line = value.span().map_or(0, |s| line_of(self.text, s.start));
        let own = value
            .decor()
            .suffix()
            .map(|s| self.raw(s).trim().to_string())
            .filter(|c| c.starts_with('#'));
        let comment = own.map(|c| (c, line)).or(outer);
        if let Value::InlineTable(t) = value {
            for (key, v) in t.iter() {
                self.value(v, join(&path, key), comment.clone())?;
            }
            return Ok(());
        }
        let value_text = value
            .span()
            .and_then(|s| self.text.get(s))
            .unwrap_or("?")
            .trim()
            .to_string();
        let problem = |problem: String| ProvenanceError::BadTag {
            file: self.file.to_string(),
            key: path.clone(),
            line,
            problem,
        };
        let missing = || ProvenanceError::MissingTag {
            file: self.file.to_string(),
            key: path.clone(),
            line,
        };
        let Some((comment, _)) = comment else {
            return Err(missing());
        };
        let body = comment.trim_start_matches('#').trim_start();
        let Some(body) = body.strip_prefix('[') else {
            return Err(missing());
        };
        let Some((tag, reason)) = body.split_once(']') else {
            return Err(problem(format!("[{body}: the tag has no closing bracket")));
        };
        let kind = Provenance::parse(tag).map_err(problem)?;
        let reason = reason.trim();
        if reason.is_empty() {
            return Err(problem(format!("[{tag}] gives no reason")));
        }
        if reason.starts_with('[') {
            return Err(problem(format!(
                "more than one tag ([{tag}] {reason}): a knob has exactly one"
            )));
        }
        self.out.push(Knob {
            path,
            value: value_text,
            kind,
            reason: reason.to_string(),
            file: self.file.to_string(),
            line,
        });
        Ok(())
    }
}

fn join(prefix: &str, key: &str) -> String {
    if prefix.is_empty() {
        key.to_string()
    } else {
        format!("{prefix}.{key}")
    }
}

fn line_of(text: &str, offset: usize) -> usize {
    1 + text
        .as_bytes()
        .iter()
        .take(offset)
        .filter(|&&b| b == b'\n')
        .count()
}

/// Counts per kind, and which knobs were fitted to each figure.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Summary {
    /// Knobs per kind, in [`Provenance::KINDS`] order.
    pub counts: Vec<(&'static str, usize)>,
    /// Knobs per seed tag (`seed 003` → n).
    pub seeds: Vec<(u16, usize)>,
    /// Each figure a knob was fitted to, with those knobs (paths), in the order of
    /// [`FIDELITY_ROWS`] (ids not there after, alphabetically).
    pub fitted_figures: Vec<(String, Vec<String>)>,
}

impl Summary {
    pub fn of(knobs: &[Knob]) -> Summary {
        let counts = Provenance::KINDS
            .iter()
            .map(|kind| {
                (
                    *kind,
                    knobs.iter().filter(|k| k.kind.kind() == *kind).count(),
                )
            })
            .collect();
        let mut seeds = std::collections::BTreeMap::<u16, usize>::new();
        let mut figures = std::collections::BTreeMap::<String, Vec<String>>::new();
        for k in knobs {
            match &k.kind {
                Provenance::Seed(n) => *seeds.entry(*n).or_default() += 1,
                Provenance::Fitted(rows) => {
                    for r in rows {
                        figures.entry(r.clone()).or_default().push(k.path.clone());
                    }
                }
                _ => {}
            }
        }
        let order: Vec<&str> = fidelity_row_ids().collect();
        let mut fitted_figures: Vec<(String, Vec<String>)> = figures.into_iter().collect();
        fitted_figures.sort_by_key(|(row, _)| {
            (
                order.iter().position(|r| r == row).unwrap_or(order.len()),
                row.clone(),
            )
        });
        Summary {
            counts,
            seeds: seeds.into_iter().collect(),
            fitted_figures,
        }
    }

    pub fn count(&self, kind: &str) -> usize {
        self.counts
            .iter()
            .find(|(k, _)| *k == kind)
            .map_or(0, |(_, n)| *n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{builtin_model_names, BUILTIN_HOSTS, BUILTIN_MODELS};

    /// Every leaf key of every built-in model and host file (but `name` and
    /// `description`) has exactly one valid tag and a reason.
    #[test]
    fn every_builtin_key_carries_one_valid_provenance_tag() {
        let models = BUILTIN_MODELS
            .iter()
            .map(|(n, t)| (format!("device-models/{n}.toml"), t));
        let hosts = BUILTIN_HOSTS
            .iter()
            .map(|(n, t)| (format!("device-models/hosts/{n}.toml"), t));
        for (name, text) in models.chain(hosts) {
            let keys = tagged_keys(text, &name).unwrap_or_else(|e| panic!("{e}"));
            let lines = text
                .lines()
                .filter(|l| {
                    let l = l.trim();
                    !l.starts_with('#') && !l.starts_with('[') && l.contains('=')
                })
                .filter(|l| !l.starts_with("name =") && !l.starts_with("description ="))
                .count();
            assert_eq!(keys.len(), lines, "{name}: a key line was not read");
        }
    }

    /// `[fitted …]` names rows of the fidelity table only (the list in
    /// `fidelity-rows.txt`, copied from the table's ids).
    #[test]
    fn every_fitted_id_is_a_fidelity_row() {
        let rows: Vec<&str> = fidelity_row_ids().collect();
        assert!(rows.len() > 50, "{} rows", rows.len());
        for name in builtin_model_names() {
            for k in knobs(name).unwrap_or_else(|e| panic!("{e}")) {
                if let Provenance::Fitted(ids) = &k.kind {
                    for id in ids {
                        assert!(
                            rows.contains(&id.as_str()),
                            "{}:{}: {} is fitted to {id}, which is no fidelity row",
                            k.file,
                            k.line,
                            k.path
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn every_builtin_model_has_knobs_for_its_card_and_its_host() {
        for name in builtin_model_names() {
            let p = model_provenance(name).unwrap_or_else(|e| panic!("{e}"));
            let model = DeviceModel::load(name).unwrap();
            assert_eq!(p.host, model.host.name, "{name}");
            assert!(p.knobs.iter().any(|k| k.path.starts_with("cid.")), "{name}");
            assert!(
                p.knobs.iter().any(|k| k.path.starts_with("host.")),
                "{name}"
            );
            let mut paths: Vec<&str> = p.knobs.iter().map(|k| k.path.as_str()).collect();
            paths.sort();
            let n = paths.len();
            paths.dedup();
            assert_eq!(paths.len(), n, "{name}: a path twice");
        }
    }

    /// msm-emmc45-ddr50 states only `extends` and `host`: its knobs are msm-emmc45-sdr50's,
    /// from that file, but the host's bus mode, which comes from msm-sdcc-ddr50.
    #[test]
    fn knobs_come_from_the_file_that_sets_them() {
        let ddr = model_provenance("msm-emmc45-ddr50").unwrap();
        assert_eq!(
            ddr.files,
            [
                "device-models/msm-emmc45-ddr50.toml",
                "device-models/msm-emmc45-sdr50.toml"
            ]
        );
        assert_eq!(
            ddr.host_files,
            [
                "device-models/hosts/msm-sdcc-ddr50.toml",
                "device-models/hosts/msm-sdcc-sdr50.toml"
            ]
        );
        let knob = |p: &ModelProvenance, path: &str| {
            p.knobs
                .iter()
                .find(|k| k.path == path)
                .unwrap_or_else(|| panic!("{path}"))
                .clone()
        };
        let tprog = knob(&ddr, "timing.nand.program_page_ns");
        assert_eq!(tprog.file, "device-models/msm-emmc45-sdr50.toml");
        assert_eq!(tprog.value, "1130000");
        assert!(matches!(tprog.kind, Provenance::Fitted(_)));
        let timing = knob(&ddr, "host.timing");
        assert_eq!(
            (timing.file.as_str(), timing.value.as_str()),
            ("device-models/hosts/msm-sdcc-ddr50.toml", "\"ddr52\"")
        );
        let width = knob(&ddr, "host.bus_width");
        assert_eq!(width.file, "device-models/hosts/msm-sdcc-sdr50.toml");

        // sandisk-emmc45 replaces three NAND times of the SEM32G and keeps the rest.
        let s45 = model_provenance("sandisk-emmc45").unwrap();
        let tprog = knob(&s45, "timing.nand.program_page_ns");
        assert_eq!(
            (tprog.file.as_str(), tprog.value.as_str()),
            ("device-models/sandisk-emmc45.toml", "500000")
        );
        assert_eq!(
            knob(&s45, "timing.nand.page_bytes").file,
            "device-models/sandisk-sem32g.toml"
        );
        assert_eq!(
            knob(&s45, "timing.bkops.level_ns").kind,
            Provenance::Assumed
        );
        // A host file's `extends` brings sdhci's limits in from sdhci-hs52.
        let toshiba = model_provenance("toshiba-mmc32g").unwrap();
        let segs = knob(&toshiba, "host.max_segments");
        assert_eq!(segs.file, "device-models/hosts/sdhci-hs52.toml");
        assert_eq!(segs.kind, Provenance::Linux);
        assert!(segs.line > 1);
    }

    fn parse_one(text: &str) -> Result<Knob, ProvenanceError> {
        tagged_keys(text, "t.toml").map(|mut k| k.remove(0))
    }

    #[test]
    fn tags_parse_and_bad_ones_name_file_key_and_line() {
        let k = parse_one("[a]\nb = 5 # [seed 003] the card says so\n").unwrap();
        assert_eq!(
            (
                k.path.as_str(),
                k.value.as_str(),
                k.line,
                &k.kind,
                k.reason.as_str()
            ),
            ("a.b", "5", 2, &Provenance::Seed(3), "the card says so")
        );
        let k = parse_one("x = [1, 2] # [fitted s003-toshiba-linear-32k, s000-sdr50-lmdd-off] y\n")
            .unwrap();
        assert_eq!(
            k.kind,
            Provenance::Fitted(vec![
                "s003-toshiba-linear-32k".into(),
                "s000-sdr50-lmdd-off".into()
            ])
        );
        assert_eq!(k.value, "[1, 2]");
        assert_eq!(
            k.kind.to_string(),
            "fitted s003-toshiba-linear-32k, s000-sdr50-lmdd-off"
        );

        let missing = parse_one("name = \"n\"\n\n[t]\nk = 1 # assumed: why\n").unwrap_err();
        assert!(
            matches!(missing, ProvenanceError::MissingTag { ref key, line: 4, .. } if key == "t.k")
        );
        assert_eq!(
            missing.to_string().split(':').take(3).collect::<Vec<_>>(),
            ["t.toml", "4", " t.k has no provenance tag"]
        );
        assert!(matches!(
            parse_one("k = 1\n").unwrap_err(),
            ProvenanceError::MissingTag { .. }
        ));
        for (text, says) in [
            ("k = 1 # [guessed] why\n", "unknown tag [guessed]"),
            ("k = 1 # [seed 3] why\n", "three digits"),
            ("k = 1 # [fitted] why\n", "name the figures"),
            ("k = 1 # [fitted 15 MB/s] why\n", "not a fidelity row id"),
            ("k = 1 # [assumed]\n", "gives no reason"),
            ("k = 1 # [assumed] [spec] why\n", "more than one tag"),
            ("k = 1 # [assumed why\n", "no closing bracket"),
        ] {
            let err = parse_one(text).unwrap_err();
            assert!(
                matches!(&err, ProvenanceError::BadTag { key, line: 1, .. } if key == "k"),
                "{text}: {err}"
            );
            assert!(err.to_string().starts_with("t.toml:1: k: "), "{err}");
            assert!(err.to_string().contains(says), "{text}: {err}");
        }
    }

    /// The keys of an inline table take its comment unless they carry their own.
    #[test]
    fn inline_tables_and_arrays_are_read() {
        let text = "name = \"x\"\ndescription = \"y\"\n\
                    host = { extends = \"sdhci-hs52\", prepare_ns = 5 } # [assumed] a host\n\
                    levels = [\n  1,\n  2,\n] # [derived] from the host\n";
        let keys = tagged_keys(text, "t.toml").unwrap();
        let got: Vec<(&str, &str, usize)> = keys
            .iter()
            .map(|k| (k.path.as_str(), k.kind.kind(), k.line))
            .collect();
        assert_eq!(
            got,
            [
                ("host.extends", "assumed", 3),
                ("host.prepare_ns", "assumed", 3),
                ("levels", "derived", 4)
            ]
        );
    }

    /// A model file with an inline `[host]` table extending a built-in profile: the
    /// table's keys lie over the profile's.
    #[test]
    fn an_inline_host_table_lies_over_the_profile_it_extends() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("card.toml");
        std::fs::write(
            &path,
            "name = \"card\"\ndescription = \"d\"\n\
             extends = \"msm-emmc45-sdr50\" # [assumed] that card\n\
             [host]\nextends = \"msm-sdcc-sdr50\" # [assumed] that host\n\
             timing = \"ddr52\" # [seed 000] DDR\n\
             [timing.nand]\nerase_block_ns = 3500000 # [assumed] a slower erase\n",
        )
        .unwrap();
        let p = model_provenance(path.to_str().unwrap()).unwrap();
        let file = path.display().to_string();
        assert_eq!(
            p.files,
            [file.as_str(), "device-models/msm-emmc45-sdr50.toml"]
        );
        assert_eq!(p.host_files, ["device-models/hosts/msm-sdcc-sdr50.toml"]);
        let find = |path: &str| p.knobs.iter().find(|k| k.path == path).unwrap();
        assert_eq!(find("host.timing").file, file);
        assert_eq!(find("host.timing").kind, Provenance::Seed(0));
        assert_eq!(
            find("host.max_sectors_kb").file,
            "device-models/hosts/msm-sdcc-sdr50.toml"
        );
        assert_eq!(find("timing.nand.erase_block_ns").file, file);
        assert_eq!(
            find("timing.nand.dies").file,
            "device-models/msm-emmc45-sdr50.toml"
        );
        // A knob without a tag in that file is named with its line.
        std::fs::write(
            &path,
            "name = \"card\"\ndescription = \"d\"\nextends = \"ideal\" # [assumed] x\n\
             [cid]\npnm = \"ABCDEF\"\n",
        )
        .unwrap();
        let err = knobs(path.to_str().unwrap()).unwrap_err().to_string();
        assert!(
            err.contains(&format!("{file}:5: cid.pnm has no provenance tag")),
            "{err}"
        );
    }

    #[test]
    fn the_summary_counts_kinds_and_inverts_fitted_figures() {
        let knob = |path: &str, kind: Provenance| Knob {
            path: path.into(),
            value: "1".into(),
            kind,
            reason: "r".into(),
            file: "f".into(),
            line: 1,
        };
        let fitted = |ids: &[&str]| Provenance::Fitted(ids.iter().map(|s| s.to_string()).collect());
        let s = Summary::of(&[
            knob("a.x", fitted(&["s003-b", "s003-a", "s000-sdr50-lmdd-off"])),
            knob("a.y", fitted(&["s003-a"])),
            knob("a.z", Provenance::Seed(3)),
            knob("a.w", Provenance::Assumed),
        ]);
        assert_eq!(s.count("fitted"), 2);
        assert_eq!(s.count("seed"), 1);
        assert_eq!(s.count("linux"), 0);
        assert_eq!(s.seeds, [(3, 1)]);
        assert_eq!(
            s.fitted_figures,
            [
                ("s000-sdr50-lmdd-off".to_string(), vec!["a.x".to_string()]),
                (
                    "s003-a".to_string(),
                    vec!["a.x".to_string(), "a.y".to_string()]
                ),
                ("s003-b".to_string(), vec!["a.x".to_string()])
            ]
        );
    }
}
