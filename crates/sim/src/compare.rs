//! `vhost-user-emmc compare`: the same work through every card model × driver policy in
//! the simulator, side by side.
//!
//! The work is a block trace (`serve --trace`, replayed at its own instants through the
//! MMC block driver) or one of the simulator's workloads (fio-like jobs, or the seed
//! experiments lmdd-write, parallel-rw, iozone-write). Each model × policy is a fresh card
//! and a fresh driver; runs are independent and deterministic, so they run on as many
//! threads as there are cores and print in the order asked for. The result is one table
//! (text), one JSON document, and with `--out DIR` the plots of [`super::plot`].

use std::fmt::Write as _;
use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use serde::Serialize;

use super::blkbench::{run_experiment_full, stop_name, DriverReport, DriverSetup, Experiment};
use super::command::{driver_run, parse_size, SimulateArgs};
use super::engine::Completed;
use super::flashbench::format_ns;
use super::plot;
use super::report::LatencySummary;
use super::workload::{Op, Pattern};
use emmc_card::model::DeviceModel;
use emmc_card::timing::Nanos;
use emmc_host::packing::DEFAULT_NUM_WR_REQS_TO_START_PACKING;
use emmc_host::policy::{PackingArg, SchedulerArg};
use emmc_host::trace::Trace;

/// The work `compare` runs when it is not given a trace.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum CompareWorkload {
    /// fio rw=read with direct I/O: `--count` requests of `--bs`, `--qd` in flight.
    SeqRead,
    /// fio rw=write.
    SeqWrite,
    /// fio rw=randread over the whole user area.
    RandRead,
    /// fio rw=randwrite over the whole user area.
    RandWrite,
    /// A buffered sequential writer and its fsync (seed 000), `--size` bytes.
    LmddWrite,
    /// A sequential reader and a buffered writer at once for `--duration` (seed 000).
    ParallelRw,
    /// iozone -i 0 -e (seed 004), a `--size` file.
    IozoneWrite,
}

impl CompareWorkload {
    fn simulate_name(self) -> &'static str {
        match self {
            CompareWorkload::LmddWrite => "lmdd-write",
            CompareWorkload::ParallelRw => "parallel-rw",
            CompareWorkload::IozoneWrite => "iozone-write",
            _ => "",
        }
    }
}

/// Options of `vhost-user-emmc compare`.
#[derive(Debug, Clone, clap::Args)]
pub struct CompareArgs {
    /// Card models, comma-separated: built-in names or model files.
    #[arg(long, value_delimiter = ',', required = true)]
    pub models: Vec<String>,
    /// Driver policies, `KEY=V1,V2,...`; repeat for more keys (every combination runs).
    /// Keys: packing (off, always, controlled), wr-threshold (requests), scheduler (noop,
    /// deadline, cfq), hpi (on, off), pipeline (on, off).
    #[arg(long = "policy", value_name = "KEY=V1,V2,...")]
    pub policies: Vec<String>,
    /// The work, unless a trace is given.
    #[arg(
        long,
        value_enum,
        required_unless_present = "trace",
        conflicts_with = "trace"
    )]
    pub workload: Option<CompareWorkload>,
    /// A block trace (docs/trace-format.md), e.g. from `serve --trace`, replayed through
    /// the block driver at its own instants.
    #[arg(long)]
    pub trace: Option<PathBuf>,
    /// fio workloads: request size.
    #[arg(long, default_value = "4k", value_parser = parse_size)]
    pub bs: u64,
    /// Requests in flight: fio's iodepth (default 1); for a trace, the bound on its
    /// open-loop replay (default 256).
    #[arg(long)]
    pub qd: Option<usize>,
    /// fio workloads: number of requests.
    #[arg(long, default_value_t = 2000)]
    pub count: u64,
    /// lmdd-write / iozone-write: bytes to write (simulate's defaults otherwise).
    #[arg(long, value_parser = parse_size)]
    pub size: Option<u64>,
    /// parallel-rw: card time to run, in seconds.
    #[arg(long, default_value_t = 5.0)]
    pub duration: f64,
    /// Seed of the workload's random offsets.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// The I/O scheduler where no policy names one (default: serve's, CFQ, for traces
    /// and fio workloads — they are measured through serve's driver —, and CFQ for the
    /// seed experiments).
    #[arg(long, value_enum)]
    pub scheduler: Option<SchedulerArg>,
    /// A stall is a time over this many milliseconds in which requests were outstanding
    /// and none completed.
    #[arg(long, default_value_t = 100.0)]
    pub stall_ms: f64,
    /// Write the table, the JSON and the plots (PNG and SVG) into this directory.
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Print the JSON document instead of the table.
    #[arg(long)]
    pub json: bool,
    /// Runs at once (default: the number of cores).
    #[arg(long)]
    pub jobs: Option<usize>,
}

/// One driver policy: its label and the driver set-up.
#[derive(Debug, Clone, PartialEq)]
pub struct Policy {
    pub label: String,
    pub setup: DriverSetup,
}

const POLICY_KEYS: [&str; 5] = ["packing", "wr-threshold", "scheduler", "hpi", "pipeline"];

fn on_off(v: &str) -> Result<bool, String> {
    match v {
        "on" | "true" | "1" => Ok(true),
        "off" | "false" | "0" => Ok(false),
        _ => Err(format!("{v:?} is not on or off")),
    }
}

/// Every combination of the `--policy KEY=V1,V2` values over `base`, in the order given
/// (the first key varies slowest). The label always names the packing mode.
pub fn policies(specs: &[String], base: &DriverSetup) -> Result<Vec<Policy>, String> {
    let mut keys: Vec<(&str, Vec<&str>)> = Vec::new();
    for spec in specs {
        let (key, values) = spec
            .split_once('=')
            .ok_or_else(|| format!("--policy {spec:?}: expected KEY=V1,V2,..."))?;
        let key = key.trim();
        if !POLICY_KEYS.contains(&key) {
            return Err(format!(
                "--policy {spec:?}: unknown key {key:?} (one of {})",
                POLICY_KEYS.join(", ")
            ));
        }
        if keys.iter().any(|(k, _)| *k == key) {
            return Err(format!("--policy: {key} given twice"));
        }
        let values: Vec<&str> = values.split(',').map(str::trim).collect();
        if values.iter().any(|v| v.is_empty()) {
            return Err(format!("--policy {spec:?}: an empty value"));
        }
        keys.push((key, values));
    }
    let mut combos: Vec<Vec<(&str, &str)>> = vec![Vec::new()];
    for (key, values) in &keys {
        combos = combos
            .into_iter()
            .flat_map(|c| {
                values.iter().map(move |v| {
                    let mut c = c.clone();
                    c.push((*key, *v));
                    c
                })
            })
            .collect();
    }
    combos
        .into_iter()
        .map(|combo| policy(&combo, base))
        .collect()
}

fn policy(combo: &[(&str, &str)], base: &DriverSetup) -> Result<Policy, String> {
    use emmc_host::packing::PackingMode;
    let mut setup = base.clone();
    let mut packing: Option<PackingArg> = None;
    let mut threshold = match base.packing {
        PackingMode::Controlled { threshold } => threshold,
        _ => DEFAULT_NUM_WR_REQS_TO_START_PACKING,
    };
    for &(key, v) in combo {
        match key {
            "packing" => {
                packing = Some(match v {
                    "off" => PackingArg::Off,
                    "always" => PackingArg::Always,
                    "controlled" => PackingArg::Controlled,
                    _ => return Err(format!("packing={v}: off, always or controlled")),
                })
            }
            "wr-threshold" => {
                threshold = v
                    .parse()
                    .ok()
                    .filter(|&t| t <= 10_000)
                    .ok_or_else(|| format!("wr-threshold={v}: a number up to 10000"))?
            }
            "scheduler" => {
                let s = match v {
                    "noop" => SchedulerArg::Noop,
                    "deadline" => SchedulerArg::Deadline,
                    "cfq" => SchedulerArg::Cfq,
                    _ => return Err(format!("scheduler={v}: noop, deadline or cfq")),
                };
                setup.elevator = s.elevator(8000);
            }
            "hpi" => setup.hpi.enabled = on_off(v).map_err(|e| format!("hpi: {e}"))?,
            "pipeline" => setup.pipeline = on_off(v).map_err(|e| format!("pipeline: {e}"))?,
            _ => unreachable!("keys checked by policies()"),
        }
    }
    setup.packing = match packing {
        Some(p) => p.mode(threshold),
        None => match setup.packing {
            PackingMode::Controlled { .. } => PackingMode::Controlled { threshold },
            m => m,
        },
    };
    let mut label = match setup.packing {
        PackingMode::Off => "packing=off".to_string(),
        PackingMode::Always => "packing=always".to_string(),
        PackingMode::Controlled { threshold } => format!("packing=controlled({threshold})"),
    };
    for &(key, v) in combo {
        if key != "packing" && key != "wr-threshold" {
            let _ = write!(label, " {key}={v}");
        }
    }
    Ok(Policy { label, setup })
}

/// Times in which requests were outstanding and none completed, longer than a threshold.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Stalls {
    pub threshold_ms: f64,
    pub count: u64,
    pub longest_ms: f64,
    pub total_ms: f64,
}

/// Stalls over `threshold` in a run's completions: between two consecutive completions
/// (or from the first submission), the time in which at least one request was waiting.
pub fn stalls(completed: &[Completed], threshold: Nanos) -> Stalls {
    let mut by_end: Vec<(Nanos, Nanos)> = completed
        .iter()
        .map(|c| (c.completed, c.submitted))
        .collect();
    by_end.sort_unstable();
    // The earliest submission among the requests completing at or after each position:
    // while one of them was submitted, something was outstanding.
    let mut oldest = vec![Nanos::MAX; by_end.len() + 1];
    for i in (0..by_end.len()).rev() {
        oldest[i] = oldest[i + 1].min(by_end[i].1);
    }
    let mut out = Stalls {
        threshold_ms: threshold as f64 / 1e6,
        ..Stalls::default()
    };
    let mut prev: Option<Nanos> = None;
    for (i, &(end, _)) in by_end.iter().enumerate() {
        let start = prev.map_or(oldest[i], |p| p.max(oldest[i]));
        let gap = end.saturating_sub(start);
        if gap > threshold {
            out.count += 1;
            out.longest_ms = out.longest_ms.max(gap as f64 / 1e6);
            out.total_ms += gap as f64 / 1e6;
        }
        prev = Some(end);
    }
    out
}

/// One model under one policy.
#[derive(Debug, Clone, Serialize)]
pub struct Run {
    pub policy: String,
    /// Model and policy, as the legends of the plots name them.
    pub label: String,
    #[serde(flatten)]
    pub report: DriverReport,
    pub stalls: Stalls,
    /// Garbage collection: copying valid data and erasing, foreground or in BKOPS (flash
    /// timing models; absent for constant-cost ones).
    pub gc_ms: Option<f64>,
    /// Card time in BKOPS.
    pub bkops_ms: f64,
    /// Background work the card did in the foreground because it had become critical.
    pub foreground_background_ms: Option<f64>,
    pub write_amplification: Option<f64>,
}

/// What `compare` produced.
#[derive(Debug, Clone, Serialize)]
pub struct Comparison {
    pub workload: String,
    pub models: Vec<String>,
    pub policies: Vec<String>,
    pub runs: Vec<Run>,
}

/// Build one run's record from its driver report.
fn run_record(model: &str, policy: &Policy, report: DriverReport, threshold: Nanos) -> Run {
    let stalls = stalls(&report.completed, threshold);
    let flash = report.flash.as_ref();
    Run {
        policy: policy.label.clone(),
        label: format!("{model} · {}", policy.label),
        stalls,
        gc_ms: flash.map(|f| f.ftl.gc_ns as f64 / 1e6),
        bkops_ms: report.card.bkops_ms,
        foreground_background_ms: flash.map(|f| f.ftl.foreground_ns as f64 / 1e6),
        write_amplification: flash.map(|f| f.write_amplification),
        report,
    }
}

/// The experiment `args` describe.
fn experiment(args: &CompareArgs, first_model: &DeviceModel) -> Result<Experiment, String> {
    if let Some(path) = &args.trace {
        let file = std::fs::File::open(path).map_err(|e| format!("{}: {e}", path.display()))?;
        let trace = Trace::parse(std::io::BufReader::new(file))
            .map_err(|e| format!("{}: {e}", path.display()))?;
        if trace.is_empty() {
            return Err(format!("{}: no requests", path.display()));
        }
        let qd = args.qd.unwrap_or(256);
        if qd == 0 || qd > 65_536 {
            return Err("--qd must be 1..=65536".into());
        }
        let name = path.file_name().map_or_else(
            || path.display().to_string(),
            |n| n.to_string_lossy().into(),
        );
        return Ok(Experiment::Replay { trace, qd, name });
    }
    let workload = args.workload.ok_or("--workload or --trace")?;
    let (op, pattern) = match workload {
        CompareWorkload::SeqRead => (Op::Read, Pattern::Sequential),
        CompareWorkload::SeqWrite => (Op::Write, Pattern::Sequential),
        CompareWorkload::RandRead => (Op::Read, Pattern::Random),
        CompareWorkload::RandWrite => (Op::Write, Pattern::Random),
        _ => {
            // The seed experiments take simulate's own options and defaults.
            #[derive(clap::Parser)]
            struct Simulate {
                #[command(flatten)]
                args: SimulateArgs,
            }
            let mut argv = vec![
                "simulate".to_string(),
                "--workload".into(),
                workload.simulate_name().into(),
                "--duration".into(),
                args.duration.to_string(),
            ];
            if let Some(size) = args.size {
                argv.extend(["--size".into(), size.to_string()]);
            }
            let sim =
                <Simulate as clap::Parser>::try_parse_from(argv).map_err(|e| e.to_string())?;
            return driver_run(&sim.args, first_model).map(|(_, exp)| exp);
        }
    };
    if args.bs == 0 || args.bs % 512 != 0 || args.bs / 512 > 65_535 {
        return Err(format!(
            "--bs {} must be a multiple of 512 up to 65535 sectors",
            args.bs
        ));
    }
    let qd = args.qd.unwrap_or(1);
    if qd == 0 || qd > 1024 {
        return Err("--qd must be 1..=1024".into());
    }
    if args.count == 0 || args.count > 100_000_000 {
        return Err("--count must be 1..=100000000".into());
    }
    Ok(Experiment::Job {
        op,
        pattern,
        bs: (args.bs / 512) as u32,
        qd,
        count: args.count,
        seed: args.seed,
    })
}

/// How far a comparison has got, for a progress bar on another thread.
#[derive(Debug, Default)]
pub struct Progress {
    /// Runs to do and done.
    pub runs: AtomicU64,
    pub runs_done: AtomicU64,
    /// Requests to do over all runs (0: the work has no request count, progress goes by
    /// runs) and requests done.
    pub requests: AtomicU64,
    pub requests_done: Arc<AtomicU64>,
    /// The last run finished.
    pub last: Mutex<String>,
}

/// Run every model × policy, reporting into `progress` as runs go.
pub fn compare(args: &CompareArgs, progress: &Progress) -> Result<Comparison, String> {
    let mut models = Vec::new();
    for name in &args.models {
        models.push(DeviceModel::load(name).map_err(|e| format!("model {name}: {e}"))?);
    }
    if models.is_empty() {
        return Err("--models names no model".into());
    }
    if !(args.stall_ms.is_finite() && args.stall_ms > 0.0 && args.stall_ms < 3.6e6) {
        return Err("--stall-ms must be above 0 and under an hour".into());
    }
    let exp = experiment(args, &models[0])?;
    let seed_experiment = matches!(
        exp,
        Experiment::LmddWrite { .. }
            | Experiment::ParallelRw { .. }
            | Experiment::IozoneWrite { .. }
    );
    // The seed experiments are Linux's own processes on Linux's block layer (CFQ,
    // merging); traces and fio jobs stand for a guest's requests, measured through what
    // serve runs (BlkConfig::served).
    let mut base = if seed_experiment {
        DriverSetup {
            elevator: SchedulerArg::Cfq.elevator(8000),
            ..DriverSetup::default()
        }
    } else {
        DriverSetup::served()
    };
    if let Some(scheduler) = args.scheduler {
        base.elevator = scheduler.elevator(8000);
    }
    let policies = policies(&args.policies, &base)?;
    let threshold = (args.stall_ms * 1e6) as Nanos;
    let cells: Vec<(usize, usize)> = (0..models.len())
        .flat_map(|m| (0..policies.len()).map(move |p| (m, p)))
        .collect();
    let results: Mutex<Vec<Option<Result<Run, String>>>> = Mutex::new(vec![None; cells.len()]);
    let next = AtomicUsize::new(0);
    progress.runs.store(cells.len() as u64, Ordering::Relaxed);
    let per_run = match &exp {
        Experiment::Job { count, .. } => *count,
        Experiment::Replay { trace, .. } => trace.len() as u64,
        _ => 0,
    };
    progress
        .requests
        .store(per_run * cells.len() as u64, Ordering::Relaxed);
    let threads = args
        .jobs
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
        .clamp(1, cells.len());
    std::thread::scope(|s| {
        for _ in 0..threads {
            s.spawn(|| loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                let Some(&(m, p)) = cells.get(i) else { break };
                let (model, policy) = (&models[m], &policies[p]);
                let counter = Some(Arc::clone(&progress.requests_done));
                let run = run_experiment_full(model, &policy.setup, &exp, None, counter)
                    .map(|r| run_record(&model.name, policy, r, threshold))
                    .map_err(|e| format!("{} · {}: {e}", model.name, policy.label));
                results.lock().unwrap_or_else(|e| e.into_inner())[i] = Some(run);
                *progress.last.lock().unwrap_or_else(|e| e.into_inner()) =
                    format!("{} · {}", model.name, policy.label);
                progress.runs_done.fetch_add(1, Ordering::Relaxed);
            });
        }
    });
    let runs = results
        .into_inner()
        .unwrap_or_else(|e| e.into_inner())
        .into_iter()
        .map(|r| r.unwrap_or_else(|| Err("a run did not finish".into())))
        .collect::<Result<Vec<Run>, String>>()?;
    Ok(Comparison {
        workload: exp.name(),
        models: models.iter().map(|m| m.name.clone()).collect(),
        policies: policies.into_iter().map(|p| p.label).collect(),
        runs,
    })
}

fn read_of(r: &Run) -> &LatencySummary {
    &r.report.read
}

fn write_of(r: &Run) -> &LatencySummary {
    &r.report.write
}

fn ms(v: f64) -> String {
    format!("{v:.1}")
}

fn lat(us: f64, ops: u64) -> String {
    if ops == 0 {
        "—".into()
    } else {
        format_ns(us * 1000.0)
    }
}

impl Comparison {
    /// The side-by-side table: one column per run, one row per figure.
    pub fn to_text(&self) -> String {
        let runs = &self.runs;
        let mut rows: Vec<(String, Vec<String>)> = Vec::new();
        let mut row = |name: &str, f: &dyn Fn(&Run) -> String| {
            rows.push((name.to_string(), runs.iter().map(f).collect()));
        };
        row("card time (s)", &|r| format!("{:.3}", r.report.card_time_s));
        for (dir, pick) in [
            ("read", read_of as fn(&Run) -> &LatencySummary),
            ("write", write_of),
        ] {
            if runs.iter().all(|r| pick(r).ops == 0) {
                continue;
            }
            row(&format!("{dir} MB/s"), &|r| {
                format!("{:.2}", pick(r).mb_per_s)
            });
            row(&format!("{dir} IOPS"), &|r| format!("{:.0}", pick(r).iops));
            row(&format!("{dir} latency p50"), &|r| {
                lat(pick(r).p50_us, pick(r).ops)
            });
            row(&format!("{dir} latency p99"), &|r| {
                lat(pick(r).p99_us, pick(r).ops)
            });
            row(&format!("{dir} latency p99.9"), &|r| {
                lat(pick(r).p999_us, pick(r).ops)
            });
            row(&format!("{dir} latency max"), &|r| {
                lat(pick(r).max_us, pick(r).ops)
            });
        }
        let threshold = runs.first().map_or(0.0, |r| r.stalls.threshold_ms);
        row(&format!("stalls > {threshold} ms"), &|r| {
            r.stalls.count.to_string()
        });
        row("  longest (ms)", &|r| ms(r.stalls.longest_ms));
        row("  total (ms)", &|r| ms(r.stalls.total_ms));
        let opt = |v: Option<f64>, f: fn(f64) -> String| v.map_or("—".into(), f);
        row("GC time (ms)", &|r| opt(r.gc_ms, ms));
        row("BKOPS time (ms)", &|r| ms(r.bkops_ms));
        row("critical bg work (ms)", &|r| {
            opt(r.foreground_background_ms, ms)
        });
        row("write amplification", &|r| {
            opt(r.write_amplification, |v| format!("{v:.2}"))
        });
        row("packed writes", &|r| {
            r.report.driver.packed_writes.to_string()
        });
        row("packed entries mean", &|r| {
            let (n, sum) = r
                .report
                .write_packing
                .packed
                .iter()
                .fold((0u64, 0u64), |(n, s), &(k, v)| (n + v, s + k as u64 * v));
            if n == 0 {
                "—".into()
            } else {
                format!("{:.2}", sum as f64 / n as f64)
            }
        });
        row("packed entries max", &|r| {
            r.report
                .write_packing
                .packed
                .iter()
                .map(|&(k, _)| k)
                .max()
                .map_or("—".into(), |k| k.to_string())
        });
        // The packing histogram in buckets (the whole of it is in the JSON and the plot).
        if runs
            .iter()
            .any(|r| !r.report.write_packing.packed.is_empty())
        {
            for (lo, hi) in [(1, 1), (2, 4), (5, 16), (17, usize::MAX)] {
                let name = match (lo, hi) {
                    (1, 1) => "  packs of 1".to_string(),
                    (lo, usize::MAX) => format!("  packs of {lo}+"),
                    (lo, hi) => format!("  packs of {lo}–{hi}"),
                };
                row(&name, &|r| {
                    r.report
                        .write_packing
                        .packed
                        .iter()
                        .filter(|&&(k, _)| (lo..=hi).contains(&k))
                        .map(|&(_, v)| v)
                        .sum::<u64>()
                        .to_string()
                });
            }
        }
        // Every stop reason any run saw, one row each.
        let mut reasons: Vec<_> = runs
            .iter()
            .flat_map(|r| r.report.write_packing.stop_reasons.iter().map(|&(k, _)| k))
            .collect();
        reasons.sort();
        reasons.dedup();
        for reason in reasons {
            row(&format!("  stop: {}", stop_name(reason)), &|r| {
                r.report
                    .write_packing
                    .stop_reasons
                    .iter()
                    .find(|&&(k, _)| k == reason)
                    .map_or(0, |&(_, v)| v)
                    .to_string()
            });
        }
        row("HPI", &|r| r.report.driver.hpi.to_string());
        row("BKOPS started", &|r| {
            (r.report.driver.bkops_started + r.report.driver.bkops_urgent).to_string()
        });
        row("errors", &|r| {
            r.report
                .processes
                .iter()
                .map(|p| p.errors)
                .sum::<u64>()
                .to_string()
        });

        let name_w = rows
            .iter()
            .map(|(n, _)| n.chars().count())
            .max()
            .unwrap_or(0);
        let heads: Vec<(String, String)> = runs
            .iter()
            .map(|r| (r.report.model.clone(), r.policy.clone()))
            .collect();
        let widths: Vec<usize> = (0..runs.len())
            .map(|i| {
                rows.iter()
                    .map(|(_, v)| v[i].chars().count())
                    .chain([heads[i].0.chars().count(), heads[i].1.chars().count()])
                    .max()
                    .unwrap_or(0)
            })
            .collect();
        let mut out = format!("workload {}\n\n", self.workload);
        for line in 0..2 {
            let _ = write!(out, "{:name_w$}", "");
            for (i, h) in heads.iter().enumerate() {
                let text = if line == 0 { &h.0 } else { &h.1 };
                let _ = write!(out, "  {text:>w$}", w = widths[i]);
            }
            out.push('\n');
        }
        for (name, values) in &rows {
            let _ = write!(out, "{name:name_w$}");
            for (i, v) in values.iter().enumerate() {
                let _ = write!(out, "  {v:>w$}", w = widths[i]);
            }
            out.push('\n');
        }
        out
    }

    pub fn to_json(&self) -> String {
        serde_json::to_string_pretty(self).expect("a comparison is plain data")
    }
}

/// The runs as the plots take them: every completed read and write, and the packing
/// histogram.
pub fn plot_series(c: &Comparison) -> Vec<plot::Series> {
    c.runs
        .iter()
        .map(|r| plot::Series {
            label: r.label.clone(),
            samples: r
                .report
                .completed
                .iter()
                .map(|d| plot::Sample {
                    submit_ns: d.submitted,
                    complete_ns: d.completed,
                    offset: d.lba * 512,
                    len: d.sectors.saturating_mul(512),
                    write: d.write,
                })
                .collect(),
            packing: r.report.write_packing.packed.clone(),
        })
        .collect()
}

/// Write `compare.txt`, `compare.json` and the plots (PNG and SVG) into `dir`; returns
/// the files.
pub fn write_out(c: &Comparison, dir: &Path) -> Result<Vec<PathBuf>, String> {
    std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let mut files = Vec::new();
    for (name, text) in [("compare.txt", c.to_text()), ("compare.json", c.to_json())] {
        let path = dir.join(name);
        std::fs::write(&path, text).map_err(|e| format!("{}: {e}", path.display()))?;
        files.push(path);
    }
    match plot::write_plots(dir, &c.workload, &plot_series(c)) {
        Ok(plots) => files.extend(plots),
        // Nothing completed (every request failed, say): the table says so; no plots.
        Err(plot::PlotError::NoSamples) => {
            log::warn!("compare: no request completed, so no plots");
        }
        Err(e) => return Err(format!("plots: {e}")),
    }
    Ok(files)
}

/// `vhost-user-emmc compare`: run, print, write `--out`. On a terminal, a progress bar
/// on stderr counts requests (or runs, for work without a request count); elsewhere
/// nothing is drawn.
pub fn run_command(args: &CompareArgs) -> Result<String, String> {
    let progress = Progress::default();
    let finished = std::sync::atomic::AtomicBool::new(false);
    let result = std::thread::scope(|s| {
        if std::io::stderr().is_terminal() {
            s.spawn(|| draw_progress(&progress, &finished));
        }
        let r = compare(args, &progress);
        finished.store(true, Ordering::Relaxed);
        r
    });
    let c = result?;
    if let Some(dir) = &args.out {
        write_out(&c, dir)?;
    }
    Ok(if args.json { c.to_json() } else { c.to_text() })
}

/// Redraw the progress bar from `progress` until `finished`.
fn draw_progress(progress: &Progress, finished: &std::sync::atomic::AtomicBool) {
    let style = indicatif::ProgressStyle::with_template(
        "{elapsed_precise} [{bar:30}] {pos}/{len} {prefix}  {msg}",
    )
    .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar())
    .progress_chars("=> ");
    let bar = indicatif::ProgressBar::new(0).with_style(style);
    while !finished.load(Ordering::Relaxed) {
        std::thread::sleep(std::time::Duration::from_millis(100));
        if progress.runs.load(Ordering::Relaxed) == 0 {
            continue; // still loading models and the trace
        }
        let requests = progress.requests.load(Ordering::Relaxed);
        if requests > 0 {
            bar.set_prefix("requests");
            bar.set_length(requests);
            bar.set_position(progress.requests_done.load(Ordering::Relaxed));
        } else {
            bar.set_prefix("runs");
            bar.set_length(progress.runs.load(Ordering::Relaxed));
            bar.set_position(progress.runs_done.load(Ordering::Relaxed));
        }
        let last = progress.last.lock().map(|l| l.clone()).unwrap_or_default();
        if !last.is_empty() {
            bar.set_message(format!("last done: {last}"));
        }
    }
    bar.finish_and_clear();
}

#[cfg(test)]
mod tests;
