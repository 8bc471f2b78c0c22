//! `vhost-user-emmc simulate`: build the device, the workload, run, report.

use std::io::IsTerminal;

use super::device::{BlockDevice, CardDevice};
use super::flashbench::{self, AlignOptions, OpenAuOptions, PageSplit, Region};
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
    /// flashbench -a: read blocks of `--bs` before, across and after each alignment.
    AlignRead,
    /// flashbench -A: the same with writes.
    AlignWrite,
    /// flashbench -O: write `--open-au N` erase blocks interleaved, from `--erasesize`
    /// down to `--bs` per request (`--random` for random order inside each).
    OpenAu,
    /// flashbench -O -0 1 linear and random: write throughput against request size inside
    /// one erase block.
    SizeSweep,
}

impl WorkloadKind {
    fn is_flashbench(self) -> bool {
        matches!(
            self,
            WorkloadKind::AlignRead
                | WorkloadKind::AlignWrite
                | WorkloadKind::OpenAu
                | WorkloadKind::SizeSweep
        )
    }
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
    /// Write this many bytes of the region sequentially before the workload, so garbage
    /// collection finds valid data as on a used card.
    #[arg(long, default_value = "0", value_parser = parse_size)]
    pub precondition: u64,
    /// flashbench: tries per position (the fastest counts).
    #[arg(long, default_value_t = 8)]
    pub tries: u32,
    /// flashbench: number of erase blocks written interleaved (`open-au`).
    #[arg(long, default_value_t = 2)]
    pub open_au: u32,
    /// flashbench: random order inside each erase block.
    #[arg(long)]
    pub random: bool,
    /// flashbench: erase block (allocation unit) size.
    #[arg(long, default_value = "4M", value_parser = parse_size)]
    pub erasesize: u64,
    /// flashbench: smallest request size of `open-au` / `size-sweep` (default `--bs`).
    #[arg(long, value_parser = parse_size)]
    pub smallest: Option<u64>,
    /// flashbench: run the test once before the measured run (the thread's runs followed
    /// one another on a card in use).
    #[arg(long)]
    pub warm: bool,
    /// Host-side split of writes at this page size (seed 003's `page_size` mitigation).
    #[arg(long, value_parser = parse_size)]
    pub split: Option<u64>,
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

/// What a simulation produced: a workload report, or flashbench's tables.
pub enum Output {
    Report(Report),
    Flashbench(FlashbenchReport),
}

impl Output {
    pub fn to_text(&self) -> String {
        match self {
            Output::Report(r) => r.to_text(),
            Output::Flashbench(f) => f.to_text(),
        }
    }

    pub fn to_json(&self) -> String {
        match self {
            Output::Report(r) => r.to_json(),
            Output::Flashbench(f) => serde_json::to_string(f).expect("plain data"),
        }
    }
}

/// flashbench results and the card's flash counters afterwards.
#[derive(Debug, Clone, serde::Serialize)]
pub struct FlashbenchReport {
    pub model: String,
    pub workload: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub align: Option<flashbench::AlignResult>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub open_au: Option<flashbench::OpenAuResult>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub size_sweep: Option<flashbench::SizeSweep>,
    pub flash: Option<crate::timing::FlashStats>,
}

impl FlashbenchReport {
    pub fn to_text(&self) -> String {
        let mut out = format!("model {}  workload {}\n", self.model, self.workload);
        if let Some(a) = &self.align {
            out.push_str(&a.to_string());
        }
        if let Some(o) = &self.open_au {
            out.push_str(&o.to_string());
        }
        if let Some(s) = &self.size_sweep {
            out.push_str("linear\n");
            out.push_str(&s.linear.to_string());
            out.push_str("random\n");
            out.push_str(&s.random.to_string());
        }
        if let Some(f) = &self.flash {
            out.push_str(&super::report::flash_line(f));
        }
        out
    }
}

/// Write `bytes` of the region sequentially in 512 KiB requests.
fn precondition(
    device: &mut dyn BlockDevice,
    start: u64,
    span: u64,
    bytes: u64,
) -> Result<(), String> {
    let end = start + (bytes / 512).min(span);
    let mut lba = start;
    while lba < end {
        let n = 1024.min(end - lba) as u32;
        device.write(lba, n, false).map_err(|e| e.to_string())?;
        lba += u64::from(n);
    }
    Ok(())
}

/// Run a simulation and return its output.
pub fn simulate(args: &SimulateArgs) -> Result<Output, String> {
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
    if args.precondition > 0 {
        precondition(&mut device, start, span, args.precondition)?;
    }
    if args.workload.is_flashbench() {
        return run_flashbench(
            args,
            &model,
            &mut device,
            Region {
                start,
                sectors: span,
            },
        )
        .map(Output::Flashbench);
    }
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
        _ => unreachable!("flashbench workloads return above"),
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
    let stats = if let Some(page) = args.split {
        let mut split = PageSplit {
            inner: &mut device,
            page_sectors: (page / 512).max(1) as u32,
        };
        run(&mut split, workload.as_mut(), args.qd, &mut progress)
    } else {
        run(&mut device, workload.as_mut(), args.qd, &mut progress)
    }
    .map_err(|e| e.to_string())?;
    if show_progress {
        eprintln!();
    }
    let card = device.card();
    Ok(Output::Report(Report::new(
        &model.name,
        name,
        args.seed,
        args.qd,
        &stats,
        CardCounters::new(card.stats(), card.bkops_outstanding_ns()),
        card.timing().flash_stats(),
    )))
}

fn run_flashbench(
    args: &SimulateArgs,
    model: &DeviceModel,
    device: &mut CardDevice,
    region: Region,
) -> Result<FlashbenchReport, String> {
    let mut report = FlashbenchReport {
        model: model.name.clone(),
        workload: String::new(),
        align: None,
        open_au: None,
        size_sweep: None,
        flash: None,
    };
    let open = OpenAuOptions {
        open_aus: args.open_au,
        random: args.random,
        erasesize: args.erasesize,
        blocksize: args.bs,
        smallest: args.smallest,
        ..Default::default()
    };
    {
        let mut split;
        let dev: &mut dyn BlockDevice = match args.split {
            Some(page) => {
                split = PageSplit {
                    inner: device,
                    page_sectors: (page / 512).max(1) as u32,
                };
                &mut split
            }
            None => device,
        };
        match args.workload {
            WorkloadKind::AlignRead | WorkloadKind::AlignWrite => {
                let write = args.workload == WorkloadKind::AlignWrite;
                let o = AlignOptions {
                    blocksize: args.bs,
                    tries: args.tries,
                    write,
                    ..Default::default()
                };
                report.workload = format!(
                    "align-{} bs={} tries={}",
                    if write { "write" } else { "read" },
                    args.bs,
                    args.tries
                );
                if args.warm {
                    flashbench::align(dev, region, &o).map_err(|e| e.to_string())?;
                }
                report.align = Some(flashbench::align(dev, region, &o).map_err(|e| e.to_string())?);
            }
            WorkloadKind::OpenAu => {
                report.workload = format!(
                    "open-au {}{} erasesize={}",
                    args.open_au,
                    if args.random { " random" } else { "" },
                    args.erasesize
                );
                report.open_au =
                    Some(flashbench::open_au(dev, region, &open).map_err(|e| e.to_string())?);
            }
            WorkloadKind::SizeSweep => {
                report.workload = format!("size-sweep erasesize={}", args.erasesize);
                report.size_sweep =
                    Some(flashbench::size_sweep(dev, region, &open).map_err(|e| e.to_string())?);
            }
            _ => unreachable!("only flashbench workloads come here"),
        }
    }
    report.flash = device.card().timing().flash_stats();
    Ok(report)
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
