//! `models --explain MODEL`: every knob of a model with the provenance its file gives it
//! (`emmc_card::model::provenance`), grouped by table, then how many knobs of each kind
//! there are and which knobs were fitted to each seed figure.

use emmc_card::model::provenance::{model_provenance, Knob, ModelProvenance, Provenance, Summary};
use serde_json::{json, Map, Value};

pub fn run(model: &str, as_json: bool) -> Result<String, String> {
    let p = model_provenance(model).map_err(|e| e.to_string())?;
    Ok(if as_json {
        format!("{:#}", to_json(&p))
    } else {
        to_text(&p)
    })
}

/// The first file of the group a knob belongs to: the model's own, or the host profile's.
fn home<'a>(p: &'a ModelProvenance, k: &Knob) -> &'a str {
    let files = if k.path.starts_with("host.") {
        &p.host_files
    } else {
        &p.files
    };
    files.first().map_or("", String::as_str)
}

fn to_text(p: &ModelProvenance) -> String {
    let mut out = format!("{}: {}\n", p.name, p.description);
    out += &format!("model files: {}\n", p.files.join(" ← "));
    if p.host_files.is_empty() {
        out += &format!("host {}: inline [host] table\n", p.host);
    } else {
        out += &format!("host {}: {}\n", p.host, p.host_files.join(" ← "));
    }
    out += "tags: [seed NNN] a fact the seed states; [fitted ROW, …] set to reach those seed \
            figures; [spec] eMMC spec or emmc45-facts; [linux] Linux's source; [assumed] no \
            measurement; [derived] follows from other values. Keys the files leave out take \
            their defaults and are not listed.\n";

    let mut sections: Vec<&str> = Vec::new();
    for k in &p.knobs {
        if !sections.contains(&k.section()) {
            sections.push(k.section());
        }
    }
    for section in sections {
        let knobs: Vec<&Knob> = p.knobs.iter().filter(|k| k.section() == section).collect();
        let width = knobs
            .iter()
            .map(|k| k.key().chars().count() + 3 + k.value.chars().count())
            .max()
            .unwrap_or(0)
            .min(40);
        let tag_width = knobs
            .iter()
            .map(|k| k.kind.to_string().chars().count() + 2)
            .filter(|w| *w <= 14)
            .max()
            .unwrap_or(0);
        out += &format!("\n[{section}]\n");
        for k in knobs {
            let setting = format!("{} = {}", k.key(), k.value);
            let tag = format!("[{}]", k.kind);
            out += &format!("  {setting:<width$}  {tag:<tag_width$}  {}", k.reason);
            if k.file != home(p, k) {
                out += &format!("  ({}:{})", k.file, k.line);
            }
            out += "\n";
        }
    }

    let s = Summary::of(&p.knobs);
    let seeds: Vec<String> = s
        .seeds
        .iter()
        .map(|(n, c)| format!("seed {n:03}: {c}"))
        .collect();
    let counts: Vec<String> = s
        .counts
        .iter()
        .map(|(kind, n)| match *kind {
            "seed" if !seeds.is_empty() => format!("{n} seed ({})", seeds.join(", ")),
            _ => format!("{n} {kind}"),
        })
        .collect();
    out += &format!(
        "\nsummary: {} knobs: {}\n",
        p.knobs.len(),
        counts.join(", ")
    );
    out += &format!(
        "fitted: {} knobs set to reach {} seed figures\n",
        s.count("fitted"),
        s.fitted_figures.len()
    );
    if !s.fitted_figures.is_empty() {
        out += "fitted figures (fidelity row ← the knobs fitted to it):\n";
        for (row, knobs) in &s.fitted_figures {
            out += &format!("  {row} ← {}\n", knobs.join(", "));
        }
    }
    out
}

fn to_json(p: &ModelProvenance) -> Value {
    let knobs: Vec<Value> = p
        .knobs
        .iter()
        .map(|k| {
            let (seed, fitted) = match &k.kind {
                Provenance::Seed(n) => (json!(n), json!([])),
                Provenance::Fitted(rows) => (Value::Null, json!(rows)),
                _ => (Value::Null, json!([])),
            };
            json!({
                "path": k.path,
                "value": k.value,
                "kind": k.kind.kind(),
                "tag": k.kind.to_string(),
                "seed": seed,
                "fitted": fitted,
                "reason": k.reason,
                "file": k.file,
                "line": k.line,
            })
        })
        .collect();
    let s = Summary::of(&p.knobs);
    let counts: Map<String, Value> = s
        .counts
        .iter()
        .map(|(k, n)| (k.to_string(), json!(n)))
        .collect();
    let seeds: Map<String, Value> = s
        .seeds
        .iter()
        .map(|(n, c)| (format!("{n:03}"), json!(c)))
        .collect();
    let figures: Map<String, Value> = s
        .fitted_figures
        .iter()
        .map(|(row, knobs)| (row.clone(), json!(knobs)))
        .collect();
    json!({
        "model": p.name,
        "description": p.description,
        "files": p.files,
        "host": p.host,
        "host_files": p.host_files,
        "knobs": knobs,
        "summary": {
            "knobs": p.knobs.len(),
            "counts": counts,
            "seeds": seeds,
            "fitted_knobs": s.count("fitted"),
            "fitted_figures": figures,
        },
    })
}
