//! `vhost-user-emmc simulate`: build the device, the workload, run, report.

use std::io::IsTerminal;

use super::device::{BlockDevice, CardDevice};
use super::report::{CardCounters, Report};
use super::trace::Trace;
use super::workload::{run, Op, Pattern, Stream, Workload};
use crate::model::DeviceModel;

/// The block workloads `simulate` knows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum WorkloadKind {
    SeqWrite,
    SeqRead,
    RandWrite,
    RandRead,
    /// Replay a trace file (`--trace`).
    Trace,
}

/// Options of a `simulate` run.
#[derive(Debug, Clone, clap::Args)]
pub struct SimulateArgs {
    /// Built-in model name or path to a model TOML file.
    #[arg(long, default_value = crate::model::DEFAULT_MODEL)]
    pub model: String,
    #[arg(long, value_enum)]
    pub workload: WorkloadKind,
    /// Seed of every random choice (workload offsets; the timing model has its own in the model file).
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Request size (bytes; k, M, G suffixes).
    #[arg(long, default_value = "4k", value_parser = parse_size)]
    pub bs: u64,
    /// Requests kept in flight.
    #[arg(long, default_value_t = 1)]
    pub qd: usize,
    /// Number of requests.
    #[arg(long, default_value_t = 10_000)]
    pub count: u64,
    /// Start of the region the workload covers (bytes).
    #[arg(long, default_value = "0", value_parser = parse_size)]
    pub offset: u64,
    /// Size of the region (bytes; default: to the end of the user area).
    #[arg(long, value_parser = parse_size)]
    pub span: Option<u64>,
    /// Trace file for `--workload trace`.
    #[arg(long)]
    pub trace: Option<std::path::PathBuf>,
    /// Print one JSON object instead of text.
    #[arg(long)]
    pub json: bool,
}

/// Parse sizes like `4096`, `4k`, `64K`, `1M`, `2G` (binary multiples).
pub fn parse_size(s: &str) -> Result<u64, String> {
    let s = s.trim();
    let (digits, mult) = match s.char_indices().last() {
        Some((i, c)) if c.is_ascii_alphabetic() => {
            let m = match c.to_ascii_lowercase() {
                'k' => 1u64 << 10,
                'm' => 1 << 20,
                'g' => 1 << 30,
                _ => return Err(format!("{s:?}: unknown size suffix {c:?} (k, M, G)")),
            };
            (&s[..i], m)
        }
        _ => (s, 1),
    };
    digits
        .parse::<u64>()
        .ok()
        .and_then(|n| n.checked_mul(mult))
        .ok_or_else(|| format!("{s:?} is not a size"))
}

/// Run a simulation and return its report.
pub fn simulate(args: &SimulateArgs) -> Result<Report, String> {
    let model = DeviceModel::load(&args.model).map_err(|e| e.to_string())?;
    let mut device = CardDevice::new(&model).map_err(|e| e.to_string())?;
    if args.bs == 0 || args.bs % 512 != 0 || args.bs / 512 > 65_535 {
        return Err(format!(
            "--bs {} must be a multiple of 512 up to 65535 sectors",
            args.bs
        ));
    }
    if args.offset % 512 != 0 {
        return Err("--offset must be a multiple of 512".into());
    }
    let block = (args.bs / 512) as u32;
    let start = args.offset / 512;
    let size = device.sectors();
    if start >= size {
        return Err(format!(
            "--offset is beyond the {}-byte user area",
            size * 512
        ));
    }
    let span = args
        .span
        .map_or(size - start, |b| (b / 512).min(size - start));
    let stream = |op, pattern| Stream::new(op, pattern, block, start, span, args.count, args.seed);
    let (mut workload, name): (Box<dyn Workload>, String) = match args.workload {
        WorkloadKind::SeqWrite => (
            Box::new(stream(Op::Write, Pattern::Sequential)),
            format!("seq-write bs={}", args.bs),
        ),
        WorkloadKind::SeqRead => (
            Box::new(stream(Op::Read, Pattern::Sequential)),
            format!("seq-read bs={}", args.bs),
        ),
        WorkloadKind::RandWrite => (
            Box::new(stream(Op::Write, Pattern::Random)),
            format!("rand-write bs={}", args.bs),
        ),
        WorkloadKind::RandRead => (
            Box::new(stream(Op::Read, Pattern::Random)),
            format!("rand-read bs={}", args.bs),
        ),
        WorkloadKind::Trace => {
            let path = args
                .trace
                .as_ref()
                .ok_or("--workload trace needs --trace FILE")?;
            let file = std::fs::File::open(path).map_err(|e| format!("{}: {e}", path.display()))?;
            let trace = Trace::parse(std::io::BufReader::new(file))
                .map_err(|e| format!("{}: {e}", path.display()))?;
            (Box::new(trace), format!("trace {}", path.display()))
        }
    };
    let total = workload.len_hint();
    let show_progress = std::io::stderr().is_terminal() && !args.json;
    let mut progress = |done: u64| {
        if show_progress {
            match total {
                Some(t) if t > 0 => eprint!(
                    "\r{done}/{t} requests ({:.0}%)",
                    100.0 * done as f64 / t as f64
                ),
                _ => eprint!("\r{done} requests"),
            }
        }
    };
    let stats =
        run(&mut device, workload.as_mut(), args.qd, &mut progress).map_err(|e| e.to_string())?;
    if show_progress {
        eprintln!();
    }
    let card = device.card();
    Ok(Report::new(
        &model.name,
        name,
        args.seed,
        args.qd,
        &stats,
        CardCounters::new(card.stats(), card.bkops_outstanding_ns()),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse_with_binary_suffixes_and_reject_garbage() {
        assert_eq!(parse_size("4096"), Ok(4096));
        assert_eq!(parse_size("4k"), Ok(4096));
        assert_eq!(parse_size("64K"), Ok(65536));
        assert_eq!(parse_size("1M"), Ok(1 << 20));
        assert_eq!(parse_size("2G"), Ok(2 << 30));
        assert!(parse_size("4x").is_err());
        assert!(parse_size("k").is_err());
        assert!(parse_size("99999999999G").is_err());
    }
}
