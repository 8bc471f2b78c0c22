//! blkbench: drive a vhost-user-blk backend from outside a VM through libblkio's Rust
//! implementation (driver `virtio-blk-vhost-user`), one job after another, and print one
//! JSON object per job: IOPS, MB/s and completion latency percentiles.
//!
//! ```text
//! blkbench --socket SOCK --label NAME [--seconds S] [--span BYTES] [--latency-out FILE]
//!          [--poll] JOB...
//! JOB = randread|randwrite|read|write:BLOCKSIZE:QD   e.g. randread:4k:32
//! ```
//! With `--latency-out`, every completion latency of the first job is written one per
//! line in nanoseconds, in completion order, so that it can be compared request by request
//! with the latency the daemon modelled (`serve --latency-log`).
//!
//! With `--stamps-out`, every request of the first job is written as
//! `submit_ns wake_ns seen_ns` on `CLOCK_MONOTONIC`, in completion order: when it was
//! queued, when the client woke for it (0 if it did not sleep), and when `do_io` handed
//! it back. To stamp its wake-up the client then waits on libblkio's completion fd
//! itself, as QEMU's blkio driver does (`ppoll`, then `read`, then `do_io` for what is
//! there), instead of inside `do_io`. `ci/request-path.py` sets these stamps beside a
//! `serve --trace` of the same run (the trace says where its card time is on
//! `CLOCK_MONOTONIC`).
//!
//! ```text
//! blkbench --wake-probe-us GAP,... [--seconds S]
//! ```
//! measures the machine's own wake-up instead, with no backend: see [`wake`].
//!
//! ```text
//! blkbench --handover-probe BLOCKSIZE [--seconds S]
//! ```
//! measures how fast the machine hands freshly written blocks from one CPU to the other,
//! with no backend: see [`handover`].

use std::io::Write as _;
use std::mem::MaybeUninit;
use std::path::PathBuf;
use std::str::FromStr;
use std::time::{Duration, Instant};

use blkio::{Blkio, Blkioq, Completion, ReqFlags};
use clap::Parser;
use emmc_card::timing::prng::Prng;

mod handover;
mod wake;

#[derive(Debug, thiserror::Error)]
enum Error {
    #[error("libblkio: {0}")]
    Blkio(String),
    #[error("{job}: request failed with {ret}")]
    Request { job: String, ret: i32 },
    #[error("{0}: {1}")]
    Io(PathBuf, std::io::Error),
    #[error("wake-up probe: {0}")]
    Wake(std::io::Error),
    #[error("hand-over probe: {0}")]
    Handover(std::io::Error),
}

impl From<blkio::Error> for Error {
    fn from(e: blkio::Error) -> Self {
        Error::Blkio(e.message().to_string())
    }
}

/// One job: access pattern, block size and queue depth.
#[derive(Debug, Clone)]
struct Job {
    name: String,
    random: bool,
    write: bool,
    block: usize,
    qd: usize,
}

fn parse_size(s: &str) -> Result<usize, String> {
    let (digits, mult) = match s.chars().last() {
        Some('k' | 'K') => (&s[..s.len() - 1], 1 << 10),
        Some('m' | 'M') => (&s[..s.len() - 1], 1 << 20),
        Some('g' | 'G') => (&s[..s.len() - 1], 1 << 30),
        _ => (s, 1),
    };
    digits
        .parse::<usize>()
        .map(|v| v * mult)
        .map_err(|_| format!("bad size {s:?}"))
}

impl FromStr for Job {
    type Err = String;

    fn from_str(s: &str) -> Result<Job, String> {
        let parts: Vec<&str> = s.split(':').collect();
        let [kind, block, qd] = parts[..] else {
            return Err(format!("job {s:?} is not KIND:BLOCKSIZE:QD"));
        };
        let (random, write) = match kind {
            "randread" => (true, false),
            "randwrite" => (true, true),
            "read" => (false, false),
            "write" => (false, true),
            k => return Err(format!("unknown job kind {k:?}")),
        };
        let block = parse_size(block)?;
        let qd: usize = qd.parse().map_err(|_| format!("bad queue depth {qd:?}"))?;
        if block == 0 || block % 512 != 0 || qd == 0 {
            return Err(format!(
                "job {s:?}: the block size must be a multiple of 512 and qd at least 1"
            ));
        }
        Ok(Job {
            name: s.to_string(),
            random,
            write,
            block,
            qd,
        })
    }
}

#[derive(Debug, Parser)]
#[command(about = "Benchmark a vhost-user-blk backend through libblkio")]
struct Args {
    /// The backend's vhost-user socket.
    #[arg(long, required_unless_present_any = ["wake_probe_us", "wake_signaller", "handover_probe"])]
    socket: Option<PathBuf>,
    /// Name of the backend in the output.
    #[arg(long, default_value = "backend")]
    label: String,
    /// Run time of each job.
    #[arg(long, default_value_t = 5.0)]
    seconds: f64,
    /// Confine offsets to the first BYTES of the disk (e.g. 1g).
    #[arg(long, value_parser = parse_size)]
    span: Option<usize>,
    /// Write the first job's completion latencies here (ns, one per line).
    #[arg(long)]
    latency_out: Option<PathBuf>,
    /// Write each request of the first job as `submit_ns wake_ns seen_ns`
    /// (CLOCK_MONOTONIC, completion order; wake_ns 0 when the client did not sleep), and
    /// wait on the completion fd here instead of inside libblkio's `do_io`.
    #[arg(long)]
    stamps_out: Option<PathBuf>,
    /// Busy-poll for completions instead of sleeping until one is signalled, so that the
    /// client's own wake-up latency stays out of the measurement.
    #[arg(long)]
    poll: bool,
    /// Instead of jobs: measure how long this machine takes to wake a process that slept
    /// on an eventfd for each of these gaps (µs, separated by commas), for `--seconds`
    /// each, with no backend involved; one JSON object per gap.
    #[arg(long, value_delimiter = ',', conflicts_with_all = ["socket", "jobs"])]
    wake_probe_us: Vec<f64>,
    /// The probe's signalling process (started by `--wake-probe-us` itself).
    #[arg(long, hide = true)]
    wake_signaller: Option<String>,
    /// Instead of jobs: measure how fast this machine hands blocks of this size, freshly
    /// written on one CPU, to a thread on another that copies them out, for `--seconds`,
    /// and how fast that copying out goes on one CPU; one JSON object.
    #[arg(long, value_parser = parse_size, conflicts_with_all = ["socket", "jobs", "wake_probe_us"])]
    handover_probe: Option<usize>,
    /// Jobs, KIND:BLOCKSIZE:QD, run in order.
    #[arg(required_unless_present_any = ["wake_probe_us", "wake_signaller", "handover_probe"])]
    jobs: Vec<Job>,
}

#[derive(serde::Serialize)]
struct WakeResult {
    wake_gap_us: f64,
    wakeups: u64,
    p50_us: f64,
    p99_us: f64,
    max_us: f64,
}

#[derive(serde::Serialize)]
struct JobResult<'a> {
    label: &'a str,
    job: &'a str,
    requests: u64,
    seconds: f64,
    iops: f64,
    mb_per_s: f64,
    p50_us: f64,
    p99_us: f64,
    max_us: f64,
}

fn quantile_us(sorted: &[u64], q: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let i = ((q * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len()) - 1;
    sorted[i] as f64 / 1000.0
}

fn main() {
    let args = Args::parse();
    if let Some(spec) = &args.wake_signaller {
        if let Err(e) = wake::signaller(spec) {
            eprintln!("blkbench: {e}");
            std::process::exit(1);
        }
        return;
    }
    let result = if let Some(block) = args.handover_probe {
        run_handover_probe(block, args.seconds)
    } else if args.wake_probe_us.is_empty() {
        run(&args)
    } else {
        run_wake_probe(&args)
    };
    if let Err(e) = result {
        eprintln!("blkbench: {e}");
        std::process::exit(1);
    }
}

fn print_json(value: &impl serde::Serialize) -> Result<(), Error> {
    let line = serde_json::to_string(value).expect("plain numbers and strings serialise");
    let mut out = std::io::stdout().lock();
    writeln!(out, "{line}").map_err(|e| Error::Io("stdout".into(), e))
}

#[derive(serde::Serialize)]
struct HandoverResult {
    handover_block: usize,
    seconds: f64,
    #[serde(flatten)]
    rates: handover::Rates,
}

fn run_handover_probe(block: usize, seconds: f64) -> Result<(), Error> {
    let rates = handover::probe(block, seconds).map_err(Error::Handover)?;
    print_json(&HandoverResult {
        handover_block: block,
        seconds,
        rates,
    })
}

fn run_wake_probe(args: &Args) -> Result<(), Error> {
    for &gap_us in &args.wake_probe_us {
        if !(gap_us.is_finite() && gap_us >= 0.0) {
            return Err(Error::Wake(std::io::Error::other(format!(
                "gap {gap_us} µs is not a duration"
            ))));
        }
        let gap = Duration::from_secs_f64(gap_us / 1e6);
        let mut late = wake::probe(gap, args.seconds).map_err(Error::Wake)?;
        late.sort_unstable();
        print_json(&WakeResult {
            wake_gap_us: gap_us,
            wakeups: late.len() as u64,
            p50_us: quantile_us(&late, 0.5),
            p99_us: quantile_us(&late, 0.99),
            max_us: late.last().copied().unwrap_or(0) as f64 / 1000.0,
        })?;
    }
    Ok(())
}

fn run(args: &Args) -> Result<(), Error> {
    let socket = args
        .socket
        .as_ref()
        .expect("clap requires --socket with jobs");
    let mut b = Blkio::new("virtio-blk-vhost-user")?;
    b.set_str("path", &socket.to_string_lossy())?;
    b.connect()?;
    b.set_i32("num-queues", 1)?;
    let capacity = b.get_u64("capacity")? as usize;
    let mut started = b.start()?;
    let mut q = started
        .queues
        .pop()
        .ok_or_else(|| Error::Blkio("no queue".into()))?;
    let max_qd = args.jobs.iter().map(|j| j.qd).max().unwrap_or(1);
    let max_block = args.jobs.iter().map(|j| j.block).max().unwrap_or(4096);
    let region = b.alloc_mem_region(max_qd * max_block)?;
    b.map_mem_region(&region)?;
    let span = args.span.unwrap_or(capacity).min(capacity);
    let mut rng = Prng::new(0x9E37_79B9_7F4A_7C15);
    for (n, job) in args.jobs.iter().enumerate() {
        let stamps = (n == 0 && args.stamps_out.is_some()).then(Vec::new);
        let lat = run_job(&mut q, region.addr, job, span, args, &mut rng, stamps)?;
        if let (Some(stamps), Some(path)) = (&lat.stamps, &args.stamps_out) {
            let mut text = String::with_capacity(stamps.len() * 40);
            for s in stamps {
                text.push_str(&format!("{} {} {}\n", s.submit, s.wake, s.seen));
            }
            std::fs::write(path, text).map_err(|e| Error::Io(path.clone(), e))?;
        }
        if let (0, Some(path)) = (n, &args.latency_out) {
            let mut text = String::with_capacity(lat.requests.len() * 8);
            for l in &lat.requests {
                text.push_str(&format!("{l}\n"));
            }
            std::fs::write(path, text).map_err(|e| Error::Io(path.clone(), e))?;
        }
        let mut sorted = lat.requests;
        sorted.sort_unstable();
        let requests = sorted.len() as u64;
        let r = JobResult {
            label: &args.label,
            job: &job.name,
            requests,
            seconds: lat.seconds,
            iops: requests as f64 / lat.seconds,
            mb_per_s: requests as f64 * job.block as f64 / lat.seconds / 1e6,
            p50_us: quantile_us(&sorted, 0.5),
            p99_us: quantile_us(&sorted, 0.99),
            max_us: sorted.last().copied().unwrap_or(0) as f64 / 1000.0,
        };
        print_json(&r)?;
    }
    Ok(())
}

struct Latencies {
    /// Completion latency of every request, in completion order (ns).
    requests: Vec<u64>,
    seconds: f64,
    /// With `--stamps-out`: every request's stamps, in completion order.
    stamps: Option<Vec<Stamps>>,
}

/// One request as the client saw it, on `CLOCK_MONOTONIC` (ns).
#[derive(Debug, Clone, Copy)]
struct Stamps {
    /// Queued (`blkioq_read` / `blkioq_write`; it reaches the ring in the next `do_io`).
    submit: u64,
    /// The client's `ppoll` on the completion fd returned; 0 if it found the completion
    /// without sleeping.
    wake: u64,
    /// `do_io` returned it.
    seen: u64,
}

/// Sleep until libblkio's completion fd is readable and clear it, as libblkio's own wait
/// does; the instant `ppoll` returned.
fn wait_completion_fd(fd: std::os::fd::RawFd) -> std::io::Result<Instant> {
    let mut pfd = libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    loop {
        // SAFETY: one valid pollfd living across the call; no timeout, no signal mask.
        let ret = unsafe { libc::ppoll(&mut pfd, 1, std::ptr::null(), std::ptr::null()) };
        if ret >= 0 {
            break;
        }
        let e = std::io::Error::last_os_error();
        if e.kind() != std::io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
    let woke = Instant::now();
    let mut value = 0u64;
    // SAFETY: reads 8 bytes into a u64 that lives across the call. An eventfd that is not
    // readable (a spurious wake-up) fails with EAGAIN, which is harmless here.
    unsafe { libc::read(fd, (&mut value as *mut u64).cast(), 8) };
    Ok(woke)
}

/// Keep `job.qd` requests in flight for `seconds`, then drain.
fn run_job(
    q: &mut Blkioq,
    buffers: usize,
    job: &Job,
    span: usize,
    args: &Args,
    rng: &mut Prng,
    mut stamps: Option<Vec<Stamps>>,
) -> Result<Latencies, Error> {
    // With stamps, a sleeping client waits on the completion fd itself, so that it can
    // tell when it woke; libblkio then signals every completion (notifications stay on).
    let own_wait = match (&stamps, args.poll) {
        (Some(_), false) => {
            let fd = q
                .get_completion_fd()
                .ok_or_else(|| Error::Blkio("the queue has no completion fd".into()))?;
            q.set_completion_fd_enabled(true);
            Some(fd)
        }
        _ => None,
    };
    let min_completions = if args.poll || own_wait.is_some() {
        0
    } else {
        1
    };
    let slots = (span / job.block).max(1) as u64;
    let mut seq = 0u64;
    let mut next_offset = |rng: &mut Prng| -> u64 {
        let slot = if job.random {
            rng.below(slots)
        } else {
            seq = (seq + 1) % slots;
            seq
        };
        slot * job.block as u64
    };
    let submit = |q: &mut Blkioq, slot: usize, offset: u64| {
        let buf = buffers + slot * job.block;
        if job.write {
            q.write(offset, buf as *const u8, job.block, slot, ReqFlags::empty());
        } else {
            q.read(offset, buf as *mut u8, job.block, slot, ReqFlags::empty());
        }
    };
    let mut issued_at = vec![Instant::now(); job.qd];
    // `Instant` is CLOCK_MONOTONIC on Linux: one reading of both sets every stamp on it.
    let (anchor, anchor_ns) = (Instant::now(), wake::monotonic_ns());
    let mono = |at: Instant| anchor_ns + at.duration_since(anchor).as_nanos() as u64;
    let mut requests: Vec<u64> = Vec::with_capacity(1 << 20);
    let begin = Instant::now();
    let deadline = begin + Duration::from_secs_f64(args.seconds);
    for (slot, at) in issued_at.iter_mut().enumerate() {
        *at = Instant::now();
        submit(q, slot, next_offset(rng));
    }
    let mut completions: Vec<MaybeUninit<Completion>> =
        (0..job.qd).map(|_| MaybeUninit::uninit()).collect();
    let mut outstanding = job.qd;
    let mut woke = None;
    while outstanding > 0 {
        let n = q.do_io(&mut completions, min_completions, None, None)?;
        if let (0, Some(fd)) = (n, own_wait) {
            woke = Some(
                wait_completion_fd(fd)
                    .map_err(|e| Error::Blkio(format!("waiting on the completion fd: {e}")))?,
            );
            continue;
        }
        let now = Instant::now();
        for c in &completions[..n] {
            // SAFETY: do_io initialised the first `n` entries of `completions`.
            let c = unsafe { c.assume_init_ref() };
            if c.ret != 0 {
                return Err(Error::Request {
                    job: job.name.clone(),
                    ret: c.ret,
                });
            }
            let slot = c.user_data;
            requests.push(now.duration_since(issued_at[slot]).as_nanos() as u64);
            if let Some(stamps) = stamps.as_mut() {
                stamps.push(Stamps {
                    submit: mono(issued_at[slot]),
                    wake: woke.map_or(0, mono),
                    seen: mono(now),
                });
            }
            if now < deadline {
                issued_at[slot] = Instant::now();
                submit(q, slot, next_offset(rng));
            } else {
                outstanding -= 1;
            }
        }
        // The completions of one wake-up share its stamp; any later ones were found
        // without sleeping.
        woke = None;
    }
    Ok(Latencies {
        requests,
        seconds: begin.elapsed().as_secs_f64(),
        stamps,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn jobs_and_sizes_parse() {
        assert_eq!(parse_size("4k"), Ok(4096));
        assert_eq!(parse_size("1g"), Ok(1 << 30));
        assert_eq!(parse_size("512"), Ok(512));
        assert!(parse_size("x").is_err());
        let j: Job = "randwrite:128k:32".parse().unwrap();
        assert!(j.random && j.write && j.block == 128 << 10 && j.qd == 32);
        for bad in [
            "randread:4k",
            "trim:4k:1",
            "read:100:1",
            "read:4k:0",
            "read:4k:x",
        ] {
            assert!(bad.parse::<Job>().is_err(), "{bad}");
        }
    }

    #[test]
    fn quantiles_are_nearest_rank() {
        let v: Vec<u64> = (1..=100).map(|x| x * 1000).collect();
        assert_eq!(quantile_us(&v, 0.5), 50.0);
        assert_eq!(quantile_us(&v, 0.99), 99.0);
        assert_eq!(quantile_us(&[], 0.5), 0.0);
    }
}
