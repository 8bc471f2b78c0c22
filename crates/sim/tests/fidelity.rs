//! The fidelity table (`vhost-user-emmc fidelity`, docs/fidelity.md): every seed figure,
//! measured on its simulated card the way the seed measured it. Each row must be within
//! its tolerance (`ok`) or inside the error band of its documented gap (`gap`); a model
//! change that moves a row out of either fails here, with the whole table printed.

use emmc_sim::fidelity::{markdown, run_rows, text, Selection, Status, ROWS};

const DOC: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/fidelity.md");
const BEGIN: &str = "<!-- fidelity:begin (vhost-user-emmc fidelity --markdown) -->\n";
const END: &str = "<!-- fidelity:end -->";

#[test]
fn every_seed_figure_is_within_tolerance_or_its_documented_gap() {
    let rows = Selection::default().rows();
    assert_eq!(rows.len(), ROWS.len());
    let jobs = std::thread::available_parallelism().map_or(1, |n| n.get());
    let started = std::time::Instant::now();
    let results = run_rows(&rows, jobs);
    let table = text(&results);
    eprintln!(
        "{table}\n(measured in {:.1} s)",
        started.elapsed().as_secs_f64()
    );
    let failed: Vec<&str> = results
        .iter()
        .filter(|r| r.status == Status::Fail)
        .map(|r| r.row.id)
        .collect();
    assert!(
        failed.is_empty(),
        "{} rows outside their tolerance and documented gap: {failed:?}\n\n{table}",
        failed.len()
    );
    check_doc(&markdown(&results));
}

/// docs/fidelity.md shows what `vhost-user-emmc fidelity --markdown` prints today, not a
/// table from an earlier model. `UPDATE_FIDELITY_DOC=1` rewrites its block instead.
fn check_doc(generated: &str) {
    let doc = std::fs::read_to_string(DOC).expect("docs/fidelity.md");
    let start = doc.find(BEGIN).expect("the begin marker") + BEGIN.len();
    let end = doc[start..].find(END).expect("the end marker") + start;
    let block = doc[start..end].trim();
    if std::env::var_os("UPDATE_FIDELITY_DOC").is_some() {
        let new = format!("{}\n{}\n{}", &doc[..start], generated.trim(), &doc[end..]);
        std::fs::write(DOC, new).expect("write docs/fidelity.md");
        return;
    }
    assert!(
        block == generated.trim(),
        "docs/fidelity.md's table differs from `vhost-user-emmc fidelity --markdown`; \
         regenerate it: UPDATE_FIDELITY_DOC=1 cargo test -p emmc-sim --test fidelity"
    );
}
