//! The packing experiments of seed 000 and seed 004 as simulator workloads, run through
//! the MMC block driver ([`emmc_host::blkdrv`]) with processes feeding it in card time
//! ([`super::engine`]):
//!
//! - `lmdd-write`: one buffered sequential writer (`lmdd of=file`) and its final fsync;
//! - `parallel-rw`: one sequential reader and one buffered sequential writer at once
//!   (seed 000's "parallel lmdd read and write"), for a fixed card time;
//! - `iozone-write`: iozone's write and rewrite of one file with fsync (seed 004).
//!
//! Each reports read and write throughput and latency separately, the packing histogram
//! and stop reasons as seed 000 printed them, the driver's counters, the card's and the
//! FTL's — as text or JSON.

use std::sync::atomic::AtomicU64;
use std::sync::Arc;

use serde::Serialize;

use super::engine::Completed;
use super::engine::{run, Process, ProcessStats};
use super::procs::{BufferedWriter, Feeder, FileRewriter, SequentialReader};
use super::report::{flash_line, CardCounters, LatencySummary};
use super::workload::{Op, Pattern, Stream};
use emmc_card::model::DeviceModel;
use emmc_card::store::NullStore;
use emmc_card::timing::{FlashStats, Nanos};
use emmc_card::Card;
use emmc_host::blkdrv::{BkopsPolicy, BlkConfig, BlkData, BlkStats, HpiPolicy, MmcBlk};
use emmc_host::iosched::Elevator;
use emmc_host::mmc::{MmcHost, MmcHostOps};
use emmc_host::packing::{PackingMode, StopReason};
use emmc_host::sdhci::SdhciConfig;
use emmc_host::trace::Trace;

const SEC: Nanos = 1_000_000_000;

/// How the driver is set up for a run: the knobs the experiments vary.
#[derive(Debug, Clone, PartialEq)]
pub struct DriverSetup {
    pub packing: PackingMode,
    pub elevator: Elevator,
    pub hpi: HpiPolicy,
    pub bkops: BkopsPolicy,
    /// The two-deep pipeline (seed 001).
    pub pipeline: bool,
    /// Closed-ended transfers with CMD23.
    pub cmd23: bool,
    /// The scheduler merges contiguous requests (off where each request must complete on
    /// its own, as serve's virtio requests do).
    pub merge: bool,
}

impl Default for DriverSetup {
    fn default() -> Self {
        DriverSetup {
            packing: PackingMode::Off,
            elevator: Elevator::Cfq(Default::default()),
            hpi: HpiPolicy::default(),
            bkops: BkopsPolicy::default(),
            pipeline: true,
            cmd23: true,
            merge: true,
        }
    }
}

/// A card of `model` on a data-less store behind the SDHCI model, with the block driver
/// configured by the model's `[host]` section and `setup`.
pub fn driver(model: &DeviceModel, setup: &DriverSetup) -> Result<MmcBlk<MmcHost>, String> {
    driver_with_cmd_log(model, setup, None)
}

/// [`driver`] with a command log on the controller from power-on (its times count from
/// the card's start).
pub fn driver_with_cmd_log(
    model: &DeviceModel,
    setup: &DriverSetup,
    cmd_log: Option<emmc_host::cmdlog::CmdLog>,
) -> Result<MmcBlk<MmcHost>, String> {
    let layout = Card::layout_for(model);
    let card =
        Card::new(model.clone(), Box::new(NullStore::new(layout))).map_err(|e| e.to_string())?;
    let mut host = MmcHost::with_config(card, SdhciConfig::for_model(&model.host));
    host.sdhci.set_cmd_log(cmd_log);
    MmcBlk::probe(host, setup.blk_config(model)).map_err(|e| format!("bring-up: {e}"))
}

impl DriverSetup {
    /// The policies `serve` runs its driver with ([`BlkConfig::served`]): what a replay of
    /// a guest's trace, or a fio job standing in for a guest, is measured through.
    pub fn served() -> DriverSetup {
        let served = BlkConfig::served(&Default::default());
        DriverSetup {
            packing: served.packing,
            elevator: served.elevator,
            hpi: served.hpi,
            bkops: served.bkops,
            pipeline: served.pipeline,
            cmd23: served.cmd23,
            merge: served.merge,
        }
    }

    /// The block driver's configuration: the model's `[host]` section with this setup's
    /// policies. A driver on another transport of the same card (virtio-mmc) probes with
    /// it to run the same experiment.
    pub fn blk_config(&self, model: &DeviceModel) -> BlkConfig {
        BlkConfig {
            packing: self.packing,
            elevator: self.elevator,
            hpi: self.hpi,
            bkops: self.bkops,
            pipeline: self.pipeline,
            cmd23: self.cmd23,
            merge: self.merge,
            ..BlkConfig::for_model(&model.host)
        }
    }
}

/// What the workload is made of.
#[derive(Debug, Clone, PartialEq)]
pub enum Experiment {
    /// Write `bytes` sequentially through writeback in requests of `bs` sectors, then
    /// fsync; writeback keeps `depth` requests queued, submitting `batch` per plug.
    LmddWrite {
        bytes: u64,
        bs: u32,
        depth: usize,
        batch: usize,
    },
    /// A reader and a writer at once for `duration_ns` of card time.
    ParallelRw {
        duration_ns: Nanos,
        read_bs: u32,
        read_depth: usize,
        read_think_ns: Nanos,
        write_bs: u32,
        write_depth: usize,
        write_batch: usize,
        /// Run the writer (false: the reader alone, the baseline of the read loss).
        writer: bool,
    },
    /// iozone -i 0 -e: write then rewrite a file of `file_bytes`, records of `record_bytes`.
    IozoneWrite {
        file_bytes: u64,
        record_bytes: u64,
        bs: u32,
    },
    /// fio with direct I/O: `count` requests of `bs` sectors, `qd` in flight, sequential
    /// or random over the whole user area.
    Job {
        op: Op,
        pattern: Pattern,
        bs: u32,
        qd: usize,
        count: u64,
        seed: u64,
    },
    /// A block trace replayed through the driver at its own instants, at most `qd` in
    /// flight (`name` says where it came from).
    Replay {
        trace: Trace,
        qd: usize,
        name: String,
    },
}

impl Experiment {
    pub fn name(&self) -> String {
        match self {
            Experiment::LmddWrite { bytes, bs, .. } => {
                format!("lmdd-write size={} bs={}", bytes, u64::from(*bs) * 512)
            }
            Experiment::ParallelRw {
                duration_ns,
                read_bs,
                read_depth,
                read_think_ns,
                write_bs,
                writer,
                ..
            } => format!(
                "parallel-rw duration={:.1}s read-bs={} read-depth={} read-think={}us write-bs={}{}",
                *duration_ns as f64 / 1e9,
                u64::from(*read_bs) * 512,
                read_depth,
                read_think_ns / 1000,
                u64::from(*write_bs) * 512,
                if *writer { "" } else { " (reader alone)" }
            ),
            Experiment::IozoneWrite {
                file_bytes,
                record_bytes,
                ..
            } => format!(
                "iozone-write -s {}k -r {}k -e",
                file_bytes / 1024,
                record_bytes / 1024
            ),
            Experiment::Job {
                op,
                pattern,
                bs,
                qd,
                count,
                ..
            } => format!(
                "{}{} bs={} qd={qd} count={count}",
                match pattern {
                    Pattern::Sequential => "seq-",
                    Pattern::Random => "rand-",
                },
                if op.is_write() { "write" } else { "read" },
                u64::from(*bs) * 512
            ),
            Experiment::Replay { trace, qd, name } => {
                format!("trace {name} ({} requests, qd {qd})", trace.len())
            }
        }
    }
}

/// One process's figures.
#[derive(Debug, Clone, Serialize)]
pub struct ProcessReport {
    pub name: String,
    pub read: LatencySummary,
    pub write: LatencySummary,
    pub errors: u64,
}

impl ProcessReport {
    fn new(name: &str, s: &ProcessStats, elapsed_ns: Nanos) -> ProcessReport {
        ProcessReport {
            name: name.to_string(),
            read: LatencySummary::new(&s.reads, s.bytes_read, elapsed_ns),
            write: LatencySummary::new(&s.writes, s.bytes_written, elapsed_ns),
            errors: s.errors,
        }
    }
}

/// Packing statistics as seed 000 printed them.
#[derive(Debug, Clone, Serialize)]
pub struct PackingReport {
    /// "Packed N reqs - M times", for every N seen.
    pub packed: Vec<(usize, u64)>,
    /// "stopped packing due to the following reasons".
    pub stop_reasons: Vec<(StopReason, u64)>,
    /// Write requests fetched between two reads (blktrace's view).
    pub writes_before_read: Vec<(u32, u64)>,
}

/// The result of one run.
#[derive(Debug, Clone, Serialize)]
pub struct DriverReport {
    pub model: String,
    pub workload: String,
    pub scheduler: String,
    pub packing: String,
    pub card_time_s: f64,
    /// Reads and writes of all processes together.
    pub read: LatencySummary,
    pub write: LatencySummary,
    pub processes: Vec<ProcessReport>,
    /// iozone: write and rewrite throughput in KB/s (1000 bytes), as iozone prints them.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub iozone_kb_per_s: Option<(f64, f64)>,
    pub write_packing: PackingReport,
    pub driver: BlkStats,
    pub card: CardCounters,
    pub flash: Option<FlashStats>,
    /// Faults the `--fault-plan` injected (absent without a plan).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub faults_injected: Option<u64>,
    /// Every read and write that completed (not in the JSON: `compare` plots them).
    #[serde(skip)]
    pub completed: Vec<Completed>,
}

fn mode_name(m: PackingMode) -> String {
    match m {
        PackingMode::Off => "off".into(),
        PackingMode::Always => "always".into(),
        PackingMode::Controlled { threshold } => format!("controlled (threshold {threshold})"),
    }
}

/// What a workload measured, on any host: the processes' figures and the driver's.
#[derive(Debug, Clone, Serialize)]
pub struct WorkloadReport {
    pub workload: String,
    pub card_time_s: f64,
    /// Reads and writes of all processes together.
    pub read: LatencySummary,
    pub write: LatencySummary,
    pub processes: Vec<ProcessReport>,
    /// iozone: write and rewrite throughput in KB/s (1000 bytes).
    pub iozone_kb_per_s: Option<(f64, f64)>,
    pub driver: BlkStats,
    /// Every read and write that completed, by process, each in completion order.
    #[serde(skip)]
    pub completed: Vec<Completed>,
}

/// Run one experiment on a driver already brought up, whatever its host: the in-process
/// SDHCI model ([`run_experiment`]) or a virtio-mmc transport. The experiment's regions
/// follow the driver's device size; time is the host's card time.
pub fn run_experiment_on<H: MmcHostOps, D: BlkData>(
    drv: &mut MmcBlk<H, D>,
    exp: &Experiment,
) -> WorkloadReport {
    run_experiment_counted(drv, exp, None)
}

/// [`run_experiment_on`], counting the requests of a `Job` or `Replay` as they complete
/// into `progress` (for a progress bar on another thread).
pub fn run_experiment_counted<H: MmcHostOps, D: BlkData>(
    drv: &mut MmcBlk<H, D>,
    exp: &Experiment,
    progress: Option<Arc<AtomicU64>>,
) -> WorkloadReport {
    let t0 = drv.now();
    let size = drv.sectors();
    // Regions: the reader from the start of the user area, writers from a quarter in.
    let write_start = (size / 4) / 8192 * 8192;
    let span = (size / 4).max(8192);
    let mut iozone: Option<usize> = None;
    let (mut procs, limit): (Vec<Box<dyn Process>>, Nanos) = match *exp {
        Experiment::LmddWrite {
            bytes,
            bs,
            depth,
            batch,
        } => (
            vec![Box::new(BufferedWriter::new(
                "lmdd-write",
                2,
                write_start,
                span,
                bs,
                Some(bytes),
                depth,
                batch,
                true,
                t0,
            ))],
            3600 * SEC,
        ),
        Experiment::ParallelRw {
            duration_ns,
            read_bs,
            read_depth,
            read_think_ns,
            write_bs,
            write_depth,
            write_batch,
            writer,
        } => (
            vec![
                Box::new(SequentialReader::new(
                    "lmdd-read",
                    1,
                    0,
                    span,
                    read_bs,
                    None,
                    read_depth,
                    read_think_ns,
                    t0,
                )),
                Box::new(BufferedWriter::new(
                    "lmdd-write",
                    2,
                    write_start,
                    span,
                    write_bs,
                    if writer { None } else { Some(0) },
                    write_depth,
                    write_batch,
                    false,
                    t0,
                )),
            ],
            duration_ns,
        ),
        Experiment::IozoneWrite {
            file_bytes,
            record_bytes,
            bs,
        } => {
            iozone = Some(0);
            // Copying a record into the page cache: ~1 GB/s on the host CPU (assumed);
            // small against the writeback, included as iozone -e includes it.
            let copy = file_bytes.max(record_bytes) / 1000;
            (
                vec![Box::new(FileRewriter::new(
                    "iozone",
                    3,
                    write_start,
                    file_bytes,
                    bs,
                    copy,
                    t0,
                ))],
                3600 * SEC,
            )
        }
        Experiment::Job {
            op,
            pattern,
            bs,
            qd,
            count,
            seed,
        } => {
            let stream = Stream::new(op, pattern, bs, 0, size, count, seed);
            (
                vec![Box::new(
                    Feeder::new("fio", 4, Box::new(stream), qd, t0, true).counting(progress),
                )],
                24 * 3600 * SEC,
            )
        }
        Experiment::Replay { ref trace, qd, .. } => (
            vec![Box::new(
                Feeder::new("replay", 5, Box::new(trace.clone()), qd, t0, false).counting(progress),
            )],
            24 * 3600 * SEC,
        ),
    };
    let end = run(drv, &mut procs, limit);
    // From the first submission: a trace may start with idle time before its first request.
    let first = procs
        .iter()
        .filter_map(|p| p.stats().first_submit)
        .min()
        .unwrap_or(end.start)
        .clamp(end.start, end.end);
    let elapsed = end.end.saturating_sub(first).max(1);
    let mut all = ProcessStats::default();
    let mut reports = Vec::new();
    let mut completed = Vec::new();
    for p in &procs {
        let s = p.stats();
        completed.extend_from_slice(&s.completed);
        all.reads.merge(&s.reads);
        all.writes.merge(&s.writes);
        all.bytes_read += s.bytes_read;
        all.bytes_written += s.bytes_written;
        all.errors += s.errors;
        reports.push(ProcessReport::new(p.name(), s, elapsed));
    }
    let iozone_kb_per_s = iozone
        .and_then(|i| procs[i].phase_rates())
        .map(|(w, rw)| (w / 1000.0, rw / 1000.0));
    WorkloadReport {
        workload: exp.name(),
        card_time_s: elapsed as f64 / 1e9,
        read: LatencySummary::new(&all.reads, all.bytes_read, elapsed),
        write: LatencySummary::new(&all.writes, all.bytes_written, elapsed),
        processes: reports,
        iozone_kb_per_s,
        driver: drv.stats().clone(),
        completed,
    }
}

/// Run one experiment on a fresh card of `model`.
pub fn run_experiment(
    model: &DeviceModel,
    setup: &DriverSetup,
    exp: &Experiment,
) -> Result<DriverReport, String> {
    run_experiment_with_faults(model, setup, exp, None)
}

/// [`run_experiment`] with a fault injector on the controller once the card is up.
pub fn run_experiment_with_faults(
    model: &DeviceModel,
    setup: &DriverSetup,
    exp: &Experiment,
    faults: Option<emmc_host::fault::FaultInjector>,
) -> Result<DriverReport, String> {
    run_experiment_full(model, setup, exp, faults, None)
}

/// [`run_experiment_with_faults`], counting completed requests into `progress` as
/// [`run_experiment_counted`] does.
pub fn run_experiment_full(
    model: &DeviceModel,
    setup: &DriverSetup,
    exp: &Experiment,
    faults: Option<emmc_host::fault::FaultInjector>,
    progress: Option<Arc<AtomicU64>>,
) -> Result<DriverReport, String> {
    run_experiment_logged(model, setup, exp, faults, progress, None)
}

/// [`run_experiment_full`] with a command log from the card's power-on.
pub fn run_experiment_logged(
    model: &DeviceModel,
    setup: &DriverSetup,
    exp: &Experiment,
    faults: Option<emmc_host::fault::FaultInjector>,
    progress: Option<Arc<AtomicU64>>,
    cmd_log: Option<emmc_host::cmdlog::CmdLog>,
) -> Result<DriverReport, String> {
    let mut drv = driver_with_cmd_log(model, setup, cmd_log)?;
    drv.host_mut().sdhci.set_fault_injector(faults);
    let w = run_experiment_counted(&mut drv, exp, progress);
    drv.host_mut().sdhci.flush_cmd_log();
    let faults_injected = drv
        .host()
        .sdhci
        .fault_injector()
        .map(|f| f.history().len() as u64);
    let st = w.driver;
    let card = &drv.host().card;
    Ok(DriverReport {
        model: model.name.clone(),
        workload: w.workload,
        scheduler: setup.elevator.name().to_string(),
        packing: mode_name(setup.packing),
        card_time_s: w.card_time_s,
        read: w.read,
        write: w.write,
        processes: w.processes,
        iozone_kb_per_s: w.iozone_kb_per_s,
        write_packing: PackingReport {
            packed: st
                .write_packing
                .entries
                .iter()
                .map(|(&k, &v)| (k, v))
                .collect(),
            stop_reasons: st
                .write_packing
                .stop_reasons
                .iter()
                .map(|(&k, &v)| (k, v))
                .collect(),
            writes_before_read: st
                .writes_before_read
                .iter()
                .map(|(&k, &v)| (k, v))
                .collect(),
        },
        driver: st,
        card: CardCounters::new(card.stats(), card.bkops_outstanding_ns()),
        flash: card.timing().flash_stats(),
        faults_injected,
        completed: w.completed,
    })
}

impl DriverReport {
    pub fn to_json(&self) -> String {
        serde_json::to_string(self).expect("a report is plain data")
    }

    pub fn to_text(&self) -> String {
        let mut out = format!(
            "model {}  workload {}\nscheduler {}  packing {}  {:.3} s of card time\n",
            self.model, self.workload, self.scheduler, self.packing, self.card_time_s
        );
        if let Some(n) = self.faults_injected {
            out.push_str(&format!(
                "fault plan: {n} faults injected, {} retries, {} requests failed\n",
                self.driver.retries, self.driver.failed
            ));
        }
        out.push_str(
            "                 ops      MB/s        IOPS   mean µs    p50 µs    p99 µs  p99.9 µs    max µs\n",
        );
        for p in &self.processes {
            for (dir, l) in [("read", &p.read), ("write", &p.write)] {
                if l.ops == 0 {
                    continue;
                }
                out.push_str(&format!(
                    "{:<10} {:<5} {:>6} {:>9.2} {:>11.0} {:>9.1} {:>9.1} {:>9.1} {:>9.1} {:>9.1}\n",
                    p.name,
                    dir,
                    l.ops,
                    l.mb_per_s,
                    l.iops,
                    l.mean_us,
                    l.p50_us,
                    l.p99_us,
                    l.p999_us,
                    l.max_us
                ));
            }
        }
        if let Some((w, rw)) = self.iozone_kb_per_s {
            out.push_str(&format!(
                "iozone: write {w:.0} KB/s, rewrite {rw:.0} KB/s\n"
            ));
        }
        let p = &self.write_packing;
        if !p.packed.is_empty() {
            out.push_str("write packing statistics:\n");
            for (n, c) in &p.packed {
                out.push_str(&format!("Packed {n} reqs - {c} times\n"));
            }
            out.push_str("stopped packing due to the following reasons:\n");
            for (r, c) in &p.stop_reasons {
                out.push_str(&format!("{c} times: {}\n", stop_name(*r)));
            }
        }
        if !p.writes_before_read.is_empty() {
            let max = p
                .writes_before_read
                .iter()
                .map(|(k, _)| *k)
                .max()
                .unwrap_or(0);
            let reads: u64 = p.writes_before_read.iter().map(|(_, c)| c).sum();
            let writes: u64 = p
                .writes_before_read
                .iter()
                .map(|(k, c)| u64::from(*k) * c)
                .sum();
            out.push_str(&format!(
                "writes fetched before a read: mean {:.1}, max {max}\n",
                writes as f64 / reads.max(1) as f64
            ));
        }
        let d = &self.driver;
        out.push_str(&format!(
            "driver: {} MMC data requests, {} packed writes, {} packed reads, {} reliable writes, {} flushes, {} erases, {} HPI ({} sectors given back), {} BKOPS ({} urgent), {} retries, {} failed\n",
            d.mmc_requests, d.packed_writes, d.packed_reads, d.reliable_writes, d.flushes, d.erases, d.hpi, d.hpi_requeued_sectors, d.bkops_started, d.bkops_urgent, d.retries, d.failed
        ));
        let c = &self.card;
        out.push_str(&format!(
            "card: {} commands, {} sectors written, {} destaged from cache, {} packed writes, {} HPI, {:.1} ms background work outstanding\n",
            c.commands, c.sectors_written, c.sectors_destaged, c.packed_writes, c.hpi_interrupts, c.bkops_outstanding_ms
        ));
        if let Some(f) = &self.flash {
            out.push_str(&flash_line(f));
        }
        out
    }
}

/// Seed 000's words for each stop reason.
pub fn stop_name(r: StopReason) -> &'static str {
    match r {
        StopReason::NotEnabled => "packing not enabled",
        StopReason::NotPackable => "request not packable",
        StopReason::EmptyQueue => "empty queue",
        StopReason::WrongDirection => "wrong data direction",
        StopReason::FlushOrDiscard => "flush or discard",
        StopReason::MaxEntries => "reached max packed entries",
        StopReason::MaxSectors => "exceeds max sectors",
        StopReason::MaxSegments => "exceeds max segments",
        StopReason::ReliableWrite => "reliable write",
        StopReason::Misaligned4k => "4K misalignment",
    }
}

/// One row of a threshold sweep.
#[derive(Debug, Clone, Serialize)]
pub struct SweepRow {
    pub wr_threshold: u32,
    pub read_mb_per_s: f64,
    pub write_mb_per_s: f64,
    pub read_p99_us: f64,
    pub packed_commands: u64,
}

/// `--sweep wr-threshold=A..B`: the same experiment under packing control at every
/// threshold from `a` to `b`.
pub fn sweep(
    model: &DeviceModel,
    setup: &DriverSetup,
    exp: &Experiment,
    a: u32,
    b: u32,
) -> Result<Vec<SweepRow>, String> {
    (a..=b)
        .map(|t| {
            let s = DriverSetup {
                packing: PackingMode::Controlled { threshold: t },
                ..setup.clone()
            };
            let r = run_experiment(model, &s, exp)?;
            Ok(SweepRow {
                wr_threshold: t,
                read_mb_per_s: r.read.mb_per_s,
                write_mb_per_s: r.write.mb_per_s,
                read_p99_us: r.read.p99_us,
                packed_commands: r.driver.packed_writes,
            })
        })
        .collect()
}

pub fn sweep_text(model: &str, exp: &Experiment, rows: &[SweepRow]) -> String {
    let mut out = format!(
        "model {model}  workload {}  packing controlled\nwr-threshold  read MB/s  write MB/s  read p99 µs  packed writes\n",
        exp.name()
    );
    for r in rows {
        out.push_str(&format!(
            "{:>12} {:>10.2} {:>11.2} {:>12.0} {:>14}\n",
            r.wr_threshold, r.read_mb_per_s, r.write_mb_per_s, r.read_p99_us, r.packed_commands
        ));
    }
    out
}
