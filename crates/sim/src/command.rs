//! `vhost-user-emmc simulate`: build the device, the workload, run, report.

use std::io::IsTerminal;

use super::blkbench::{
    run_experiment_logged, sweep, sweep_text, DriverReport, DriverSetup, Experiment, SweepRow,
};
use super::device::{BlockDevice, CardDevice};
use super::flashbench::{
    self, format_ns, AlignOptions, OpenAuOptions, PageSplit, Region, ScatterOptions,
};
use super::powercut::{CutStore, PowerCutConfig, PowerCutReport};
use super::report::{CardCounters, Report};
use super::workload::{run, Op, Pattern, Stream, Workload};
use emmc_card::model::DeviceModel;
use emmc_host::policy::{PackingArg, SchedulerArg};
use emmc_host::trace::Trace;

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
    /// flashbench -s --scatter-span=1: read `--bs` at each of `--count` consecutive block
    /// offsets, the fastest of `--tries` per offset (fast and slow MLC pages).
    Scatter,
    /// Through the MMC block driver: a buffered sequential writer (`lmdd of=file`), `--size`
    /// bytes in writeback requests of `--write-bs`, then fsync.
    LmddWrite,
    /// Through the MMC block driver: a sequential reader and a buffered writer at once for
    /// `--duration` (seed 000's parallel lmdd read and write).
    ParallelRw,
    /// Through the MMC block driver: iozone -i 0 -e, write and rewrite of a `--size` file
    /// in `--record` records (seed 004).
    IozoneWrite,
    /// Through the MMC core: normal, reliable, forced, packed writes, flushes and cache
    /// switches with unique sector contents; power cut at `--cuts` seeded instants, the
    /// image reopened, and every cut checked against what the spec promises
    /// (`docs/durability.md`). Exits non-zero on any violation.
    PowerCut,
}

impl WorkloadKind {
    fn is_driver(self) -> bool {
        matches!(
            self,
            WorkloadKind::LmddWrite | WorkloadKind::ParallelRw | WorkloadKind::IozoneWrite
        )
    }

    fn is_flashbench(self) -> bool {
        matches!(
            self,
            WorkloadKind::AlignRead
                | WorkloadKind::AlignWrite
                | WorkloadKind::OpenAu
                | WorkloadKind::SizeSweep
                | WorkloadKind::Scatter
        )
    }
}

/// Options of a `simulate` run.
#[derive(Debug, Clone, clap::Args)]
pub struct SimulateArgs {
    /// Built-in model name or path to a model TOML file.
    #[arg(long, default_value = emmc_card::model::DEFAULT_MODEL)]
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
    #[arg(long, default_value_t = 1, value_parser = at_least_one::<usize>)]
    pub qd: usize,
    /// Number of requests.
    #[arg(long, default_value_t = 10_000, value_parser = at_least_one::<u64>)]
    pub count: u64,
    /// Start of the region the workload covers (bytes).
    #[arg(long, default_value = "0", value_parser = parse_size)]
    pub offset: u64,
    /// Size of the region (bytes; default: to the end of the user area).
    #[arg(long, value_parser = parse_nonzero_size)]
    pub span: Option<u64>,
    /// Trace file for `--workload trace`.
    #[arg(long)]
    pub trace: Option<std::path::PathBuf>,
    /// Write this many bytes of the region sequentially before the workload, so garbage
    /// collection finds valid data as on a used card.
    #[arg(long, default_value = "0", value_parser = parse_size)]
    pub precondition: u64,
    /// flashbench: tries per position (the fastest counts).
    #[arg(long, default_value_t = 8, value_parser = at_least_one::<u32>)]
    pub tries: u32,
    /// flashbench: number of erase blocks written interleaved (`open-au`).
    #[arg(long, default_value_t = 2, value_parser = at_least_one::<u32>)]
    pub open_au: u32,
    /// flashbench: random order inside each erase block.
    #[arg(long)]
    pub random: bool,
    /// flashbench: erase block (allocation unit) size.
    #[arg(long, default_value = "4M", value_parser = parse_nonzero_size)]
    pub erasesize: u64,
    /// flashbench: smallest request size of `open-au` / `size-sweep` (default `--bs`).
    #[arg(long, value_parser = parse_nonzero_size)]
    pub smallest: Option<u64>,
    /// flashbench: run the test once before the measured run (the thread's runs followed
    /// one another on a card in use).
    #[arg(long)]
    pub warm: bool,
    /// Host-side split of writes at this page size (seed 003's `page_size` mitigation).
    #[arg(long, value_parser = parse_nonzero_size)]
    pub split: Option<u64>,
    /// Driver workloads: packing policy.
    #[arg(long, value_enum, default_value_t = PackingArg::Off)]
    pub packing: PackingArg,
    /// Driver workloads: write packing control threshold (`num_wr_reqs_to_start_packing`).
    #[arg(long, default_value_t = emmc_host::packing::DEFAULT_NUM_WR_REQS_TO_START_PACKING)]
    pub wr_threshold: u32,
    /// Driver workloads: I/O scheduler.
    #[arg(long, value_enum, default_value_t = SchedulerArg::Cfq)]
    pub scheduler: SchedulerArg,
    /// Driver workloads: run packing control at every threshold of a range,
    /// `wr-threshold=A..B`, and print read and write throughput for each.
    #[arg(long, value_parser = parse_sweep)]
    pub sweep: Option<(u32, u32)>,
    /// CFQ's `slice_idle` in microseconds (Linux's default 8000).
    #[arg(long, default_value_t = 8000)]
    pub slice_idle_us: u64,
    /// Driver workloads: interrupt long writes with HPI when a read arrives.
    #[arg(long)]
    pub hpi: bool,
    /// Driver workloads: no two-deep pipeline (prepare each request after the previous).
    #[arg(long)]
    pub no_pipeline: bool,
    /// Driver workloads: open-ended transfers (CMD18/CMD25 + CMD12) instead of CMD23.
    #[arg(long)]
    pub open_ended: bool,
    /// lmdd-write / iozone-write: bytes to write (default 64M / 10240k).
    #[arg(long, value_parser = parse_size)]
    pub size: Option<u64>,
    /// Driver workloads: size of the writeback requests (default: the queue's largest,
    /// `max_sectors_kb` of the model's `[host]`).
    #[arg(long, value_parser = parse_size)]
    pub write_bs: Option<u64>,
    /// parallel-rw / lmdd-write: writeback requests kept queued (`nr_requests`).
    #[arg(long, default_value_t = 128, value_parser = at_least_one::<usize>)]
    pub write_depth: usize,
    /// parallel-rw / lmdd-write: writeback requests submitted per plug.
    #[arg(long, default_value_t = 16, value_parser = at_least_one::<usize>)]
    pub write_batch: usize,
    /// iozone-write: record size.
    #[arg(long, default_value = "8192k", value_parser = parse_nonzero_size)]
    pub record: u64,
    /// parallel-rw: card time to run, in seconds.
    #[arg(long, default_value_t = 10.0)]
    pub duration: f64,
    /// parallel-rw: reader's request (readahead window) size.
    #[arg(long, default_value = "768k", value_parser = parse_size)]
    pub read_bs: u64,
    /// parallel-rw: the reader alone, without the writer (the baseline of the read loss).
    #[arg(long)]
    pub read_only: bool,
    /// parallel-rw: reader's windows in flight.
    #[arg(long, default_value_t = 1)]
    pub read_depth: usize,
    /// parallel-rw: reader's time consuming each window, in microseconds.
    #[arg(long, default_value_t = 10_000)]
    pub read_think_us: u64,
    /// power-cut: number of power cuts.
    #[arg(long, default_value_t = 1000, value_parser = at_least_one::<u64>)]
    pub cuts: u64,
    /// power-cut: where the card's data lives.
    #[arg(long, value_enum, default_value_t = CutStore::Image)]
    pub cut_store: CutStore,
    /// power-cut, image store: reopen the image from disk every this many cuts (0 = never;
    /// the cuts in between power-cycle the card on the open image).
    #[arg(long, default_value_t = 1)]
    pub reopen_every: u64,
    /// power-cut: image file to use (created; must not exist). Default: a temporary file,
    /// removed afterwards.
    #[arg(long)]
    pub image: Option<std::path::PathBuf>,
    /// power-cut: run the model with legacy reliable write (WR_REL_PARAM.EN_REL_WR cleared;
    /// REL_WR_SEC_C as the model says) instead of what it declares.
    #[arg(long)]
    pub legacy_reliable: bool,
    /// power-cut: the host loses power with the card — store writes the card did not
    /// sync (fdatasync) are dropped at every cut.
    #[arg(long)]
    pub lose_unsynced: bool,
    /// power-cut: percent of single writes interrupted by HPI while programming (the
    /// sectors CORRECTLY_PRG_SECTORS_NUM reports must be written, the rest untouched).
    #[arg(long, default_value_t = 0, value_parser = clap::value_parser!(u64).range(0..=100))]
    pub hpi_percent: u64,
    /// Print one JSON object instead of text.
    #[arg(long)]
    pub json: bool,
    /// Fault plan (TOML, docs/faults.md) applied once the card is up. Driver workloads
    /// (lmdd-write, parallel-rw, iozone-write) retry as Linux does; the direct workloads
    /// stop at the first error.
    #[arg(long)]
    pub fault_plan: Option<std::path::PathBuf>,
    /// Log every MMC command the emulated SDHCI controller sends (docs/trace-format.md,
    /// "MMC command log"): from power-on for the driver workloads, from the workload's
    /// start (after bring-up and preconditioning) for the direct ones.
    #[arg(long)]
    pub cmd_log: Option<std::path::PathBuf>,
}

/// A count that cannot be zero (`--count`, `--qd`, `--tries`, ...): a run of zero
/// requests, or zero in flight, describes nothing.
pub fn at_least_one<T>(s: &str) -> Result<T, String>
where
    T: std::str::FromStr + From<u8> + PartialOrd,
{
    let v: T = s
        .trim()
        .parse()
        .map_err(|_| format!("{s:?} is not a whole number"))?;
    if v < T::from(1) {
        return Err("must be at least 1".into());
    }
    Ok(v)
}

/// A size that cannot be zero (`--erasesize`, `--span`, `--record`, ...).
pub fn parse_nonzero_size(s: &str) -> Result<u64, String> {
    match parse_size(s)? {
        0 => Err("must be more than 0 bytes".into()),
        n => Ok(n),
    }
}

/// Parse `wr-threshold=A..B`.
pub fn parse_sweep(s: &str) -> Result<(u32, u32), String> {
    let range = s
        .strip_prefix("wr-threshold=")
        .ok_or_else(|| format!("{s:?}: only wr-threshold=A..B can be swept"))?;
    let (a, b) = range
        .split_once("..")
        .ok_or_else(|| format!("{range:?}: expected A..B"))?;
    let a: u32 = a
        .trim()
        .parse()
        .map_err(|_| format!("{a:?} is not a threshold"))?;
    let b: u32 = b
        .trim()
        .trim_start_matches('=')
        .parse()
        .map_err(|_| format!("{b:?} is not a threshold"))?;
    if a > b || b - a > 1000 {
        return Err(format!(
            "wr-threshold={a}..{b}: need A <= B, at most 1000 steps"
        ));
    }
    Ok((a, b))
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

/// What a simulation produced: a workload report, flashbench's tables, a driver run or a
/// threshold sweep.
pub enum Output {
    Report(Report),
    Flashbench(FlashbenchReport),
    Driver(Box<DriverReport>),
    PowerCut(Box<PowerCutReport>),
    Sweep {
        model: String,
        experiment: Experiment,
        rows: Vec<SweepRow>,
    },
}

impl Output {
    /// The run itself found a failure (a power-cut violation); the exit status says so.
    pub fn failed(&self) -> bool {
        matches!(self, Output::PowerCut(p) if p.failed())
    }

    pub fn to_text(&self) -> String {
        match self {
            Output::Report(r) => r.to_text(),
            Output::Flashbench(f) => f.to_text(),
            Output::Driver(d) => d.to_text(),
            Output::PowerCut(p) => p.to_text(),
            Output::Sweep {
                model,
                experiment,
                rows,
            } => sweep_text(model, experiment, rows),
        }
    }

    pub fn to_json(&self) -> String {
        match self {
            Output::Report(r) => r.to_json(),
            Output::Flashbench(f) => serde_json::to_string(f).expect("plain data"),
            Output::Driver(d) => d.to_json(),
            Output::PowerCut(p) => p.to_json(),
            Output::Sweep {
                model,
                experiment,
                rows,
            } => serde_json::json!({
                "model": model,
                "workload": experiment.name(),
                "sweep": rows,
            })
            .to_string(),
        }
    }
}

/// The driver set-up and experiment `args` ask for.
pub fn driver_run(
    args: &SimulateArgs,
    model: &DeviceModel,
) -> Result<(DriverSetup, Experiment), String> {
    let sectors = |bytes: u64, what: &str| -> Result<u32, String> {
        if bytes == 0 || bytes % 512 != 0 || bytes / 512 > 65_535 {
            return Err(format!(
                "{what} {bytes} must be a multiple of 512 up to 65535 sectors"
            ));
        }
        Ok((bytes / 512) as u32)
    };
    let packing = args.packing.mode(args.wr_threshold);
    let elevator = args.scheduler.elevator(args.slice_idle_us);
    let setup = DriverSetup {
        packing,
        elevator,
        hpi: emmc_host::blkdrv::HpiPolicy {
            enabled: args.hpi,
            ..Default::default()
        },
        pipeline: !args.no_pipeline,
        cmd23: !args.open_ended,
        ..DriverSetup::default()
    };
    // The writeback request size: the queue's largest unless given.
    let queue_bytes = u64::from(model.host.max_sectors_kb) * 1024;
    let write_bs = sectors(args.write_bs.unwrap_or(queue_bytes), "--write-bs")?;
    let exp = match args.workload {
        WorkloadKind::LmddWrite => Experiment::LmddWrite {
            bytes: args.size.unwrap_or(64 << 20),
            bs: write_bs,
            depth: args.write_depth.clamp(1, 4096),
            batch: args.write_batch.clamp(1, 4096),
        },
        WorkloadKind::ParallelRw => {
            if !(args.duration > 0.0 && args.duration <= 36_000.0) {
                return Err("--duration must be more than 0 and at most 36000 seconds".into());
            }
            if args.read_depth == 0 || args.read_depth > 64 {
                return Err("--read-depth must be 1..=64".into());
            }
            if args.read_think_us > 3_600_000_000 {
                return Err("--read-think-us must be at most an hour".into());
            }
            Experiment::ParallelRw {
                duration_ns: (args.duration * 1e9) as u64,
                read_bs: sectors(args.read_bs, "--read-bs")?,
                read_depth: args.read_depth,
                read_think_ns: args.read_think_us.saturating_mul(1000),
                write_bs,
                write_depth: args.write_depth.clamp(1, 4096),
                write_batch: args.write_batch.clamp(1, 4096),
                writer: !args.read_only,
            }
        }
        WorkloadKind::IozoneWrite => Experiment::IozoneWrite {
            file_bytes: args.size.unwrap_or(10240 * 1024),
            record_bytes: args.record,
            bs: write_bs,
        },
        _ => return Err("not a driver workload".into()),
    };
    if let Experiment::LmddWrite { bytes, .. }
    | Experiment::IozoneWrite {
        file_bytes: bytes, ..
    } = exp
    {
        if bytes == 0 || bytes > 16 << 30 {
            return Err("--size must be 1 byte to 16G".into());
        }
    }
    Ok((setup, exp))
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
    #[serde(skip_serializing_if = "Option::is_none")]
    pub scatter: Option<flashbench::ScatterResult>,
    pub flash: Option<emmc_card::timing::FlashStats>,
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
        if let Some(s) = &self.scatter {
            for (i, t) in s.read_ns.iter().enumerate() {
                out.push_str(&format!(
                    "{}\t{}\n",
                    i as u64 * s.blocksize,
                    format_ns(*t as f64)
                ));
            }
            let (fast, slow) = s.levels();
            out.push_str(&format!(
                "fast {}  slow {}  apart {}\n",
                format_ns(fast),
                format_ns(slow),
                format_ns(slow - fast)
            ));
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

/// The `--cmd-log` file, if asked for.
fn cmd_log(
    args: &SimulateArgs,
    origin: emmc_card::timing::Nanos,
    heading: &str,
) -> Result<Option<emmc_host::cmdlog::CmdLog>, String> {
    args.cmd_log
        .as_deref()
        .map(|p| emmc_host::cmdlog::CmdLog::create(p, origin, heading))
        .transpose()
}

/// Run a simulation and return its output.
pub fn simulate(args: &SimulateArgs) -> Result<Output, String> {
    let mut model = DeviceModel::load(&args.model).map_err(|e| e.to_string())?;
    let faults = emmc_host::fault::load_fault_plan(args.fault_plan.as_deref())?;
    if args.workload == WorkloadKind::PowerCut {
        if args.cmd_log.is_some() {
            return Err("--cmd-log does not apply to --workload power-cut".into());
        }
        if faults.is_some() {
            return Err(
                "--fault-plan does not apply to --workload power-cut, which cuts \
                        power at its own seeded instants"
                    .into(),
            );
        }
        if args.legacy_reliable {
            model.ext_csd.wr_rel_param &= !emmc_card::ext_csd::EN_REL_WR;
        }
        let config = PowerCutConfig {
            store: args.cut_store,
            reopen_every: args.reopen_every,
            image: args.image.clone(),
            lose_unsynced: args.lose_unsynced,
            hpi_percent: args.hpi_percent.min(100),
            ..PowerCutConfig::new(args.cuts, args.seed)
        };
        return super::powercut::run(&config, &model)
            .map(|r| Output::PowerCut(Box::new(r)))
            .map_err(|e| e.to_string());
    }
    if args.legacy_reliable {
        return Err("--legacy-reliable applies to --workload power-cut".into());
    }
    let model = model;
    if args.workload.is_driver() {
        let (setup, exp) = driver_run(args, &model)?;
        if let Some((a, b)) = args.sweep {
            if faults.is_some() {
                return Err("--fault-plan does not apply to --sweep".into());
            }
            if args.cmd_log.is_some() {
                return Err("--cmd-log does not apply to --sweep".into());
            }
            let rows = sweep(&model, &setup, &exp, a, b)?;
            return Ok(Output::Sweep {
                model: model.name.clone(),
                experiment: exp,
                rows,
            });
        }
        let heading = format!(
            "vhost-user-emmc simulate --workload {}, model {}: MMC command log",
            exp.name(),
            model.name
        );
        let cmd_log = cmd_log(args, 0, &heading)?;
        return run_experiment_logged(&model, &setup, &exp, faults, None, cmd_log)
            .map(|r| Output::Driver(Box::new(r)));
    }
    if args.sweep.is_some() {
        return Err("--sweep applies to lmdd-write, parallel-rw and iozone-write".into());
    }
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
    // After preconditioning: the plan sees the workload's commands.
    device.set_fault_injector(faults);
    let heading = format!(
        "vhost-user-emmc simulate --workload {}, model {}: MMC command log",
        clap::ValueEnum::to_possible_value(&args.workload)
            .map_or_else(String::new, |v| v.get_name().to_string()),
        model.name
    );
    device.set_cmd_log(cmd_log(args, device.card().now(), &heading)?);
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
    device.flush_cmd_log();
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
        scatter: None,
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
            WorkloadKind::Scatter => {
                if args.count == 0 || args.count > 1 << 20 {
                    return Err("--count (scatter positions) must be 1..=1048576".into());
                }
                let o = ScatterOptions {
                    blocksize: args.bs,
                    positions: args.count as u32,
                    tries: args.tries,
                    ..Default::default()
                };
                report.workload = format!(
                    "scatter bs={} positions={} tries={}",
                    args.bs, args.count, args.tries
                );
                report.scatter =
                    Some(flashbench::scatter(dev, region, &o).map_err(|e| e.to_string())?);
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
