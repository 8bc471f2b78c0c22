//! The fidelity table (`vhost-user-emmc fidelity`, docs/fidelity.md): every seed figure,
//! measured on its simulated card the way the seed measured it. Each row must be within
//! its tolerance (`ok`) or inside the error band of its documented gap (`gap`); a model
//! change that moves a row out of either fails here, with the whole table printed.

use emmc_sim::fidelity::{run_rows, text, Selection, Status, ROWS};

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
}
