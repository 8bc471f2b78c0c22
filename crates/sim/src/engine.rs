//! Processes feeding the MMC block driver, in card time.
//!
//! A [`Process`] submits block requests at instants it chooses and reacts to their
//! completions (a reader waits for its data, a writeback flusher refills the queue). The
//! engine is a discrete-event loop: it runs the driver ([`MmcBlk::advance`]) up to the
//! next instant a process wants to act, hands completions back as they happen, and lets
//! processes submit at their instants. The card is simulated synchronously by the driver,
//! so a data transfer already under way may carry the driver's clock past a process's
//! instant; the process still submits with its own timestamp, and the scheduler sees the
//! request when the driver next looks, as the queue thread of a real driver would.

use emmc_card::timing::Nanos;
use emmc_host::blkdrv::{Advance, BlkCompletion, BlkData, MmcBlk};
use emmc_host::mmc::MmcHostOps;
use emmc_host::packing::BlkRequest;

use emmc_host::histogram::Histogram;

/// A source of block requests that reacts to completions.
pub trait Process {
    fn name(&self) -> &str;
    /// The I/O context this process's requests carry (completions are routed by it).
    fn ioc(&self) -> u32;
    /// When the process next wants to submit, if it does not wait for a completion.
    fn next_event(&self) -> Option<Nanos>;
    /// Submit what is due at `now` (the instant [`Process::next_event`] gave).
    fn act(&mut self, now: Nanos, ids: &mut u64, out: &mut Vec<BlkRequest>);
    /// A completion of (part of) one of this process's requests.
    fn complete(&mut self, c: &BlkCompletion);
    /// What the process measured.
    fn stats(&self) -> &ProcessStats;
    /// Bytes per second of each phase, for processes that run in phases (iozone's write
    /// and rewrite).
    fn phase_rates(&self) -> Option<(f64, f64)> {
        None
    }
}

/// What one process measured: bytes and per-request latency, per direction.
#[derive(Debug, Clone, Default)]
pub struct ProcessStats {
    pub reads: Histogram,
    pub writes: Histogram,
    pub others: Histogram,
    pub bytes_read: u64,
    pub bytes_written: u64,
    pub errors: u64,
    /// First submission and last completion.
    pub first_submit: Option<Nanos>,
    pub last_complete: Option<Nanos>,
    /// Every read and write that completed without error, in completion order: what
    /// `compare` draws its CDFs, time lines and scatter plots from.
    pub completed: Vec<Completed>,
}

/// One read or write a process saw complete, in card time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Completed {
    pub submitted: Nanos,
    pub completed: Nanos,
    pub lba: u64,
    pub sectors: u32,
    pub write: bool,
}

impl Completed {
    pub fn latency(&self) -> Nanos {
        self.completed.saturating_sub(self.submitted)
    }
}

/// Requests of a process still in progress, matched against completions by sector range
/// (the scheduler may have merged them; HPI may complete them in parts).
#[derive(Debug, Clone, Default)]
pub struct Outstanding {
    /// (request, submitted at, sectors still to complete).
    reqs: Vec<(BlkRequest, Nanos, u32)>,
}

impl Outstanding {
    pub fn push(&mut self, r: BlkRequest, at: Nanos) {
        self.reqs.push((r, at, r.sectors.max(1)));
    }

    pub fn len(&self) -> usize {
        self.reqs.len()
    }

    pub fn is_empty(&self) -> bool {
        self.reqs.is_empty()
    }

    /// Apply a completion; returns the requests it finished, with their submission time.
    pub fn complete(&mut self, c: &BlkCompletion) -> Vec<(BlkRequest, Nanos)> {
        let (lo, hi) = (c.req.lba, c.req.end().max(c.req.lba + 1));
        let mut done = Vec::new();
        self.reqs.retain_mut(|(r, at, left)| {
            let matches = r.op == c.req.op
                && if r.sectors == 0 {
                    r.id == c.req.id
                } else {
                    r.lba < hi && lo < r.end()
                };
            if !matches {
                return true;
            }
            let overlap = if r.sectors == 0 {
                1
            } else {
                (hi.min(r.end()) - lo.max(r.lba)) as u32
            };
            *left = left.saturating_sub(overlap);
            if *left == 0 {
                done.push((*r, *at));
                false
            } else {
                true
            }
        });
        done
    }
}

impl ProcessStats {
    /// Record the requests a completion finished.
    pub fn record(&mut self, done: &[(BlkRequest, Nanos)], c: &BlkCompletion) {
        use emmc_host::packing::BlkOp;
        for (r, at) in done {
            let latency = c.at.saturating_sub(*at);
            let bytes = u64::from(r.sectors) * 512;
            if c.result.is_err() {
                self.errors += 1;
                continue;
            }
            match r.op {
                BlkOp::Read => {
                    self.reads.record(latency);
                    self.bytes_read += bytes;
                }
                BlkOp::Write => {
                    self.writes.record(latency);
                    self.bytes_written += bytes;
                }
                _ => {
                    self.others.record(latency);
                    continue;
                }
            }
            self.completed.push(Completed {
                submitted: *at,
                completed: c.at,
                lba: r.lba,
                sectors: r.sectors,
                write: r.op == BlkOp::Write,
            });
        }
        if !done.is_empty() {
            self.last_complete = Some(self.last_complete.map_or(c.at, |t| t.max(c.at)));
        }
    }

    pub fn submitted(&mut self, at: Nanos) {
        self.first_submit.get_or_insert(at);
    }
}

/// How a run ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RunEnd {
    /// Card time when the run started and ended.
    pub start: Nanos,
    pub end: Nanos,
    /// Every process finished (false: the time limit stopped the run).
    pub finished: bool,
}

/// Run `procs` against `drv` until every process is done and the driver is idle, or
/// until card time `start + limit`.
pub fn run<H: MmcHostOps, D: BlkData>(
    drv: &mut MmcBlk<H, D>,
    procs: &mut [Box<dyn Process>],
    limit: Nanos,
) -> RunEnd {
    let start = drv.now();
    let stop = start.saturating_add(limit);
    let mut ids = 1u64;
    let mut out = Vec::new();
    loop {
        let next = procs.iter().filter_map(|p| p.next_event()).min();
        // With no process waiting for an instant, run the driver until it completes
        // something or runs out of work.
        let until = next.map_or(Nanos::MAX, |t| t.min(stop));
        let state = drv.advance(until);
        for c in drv.take_completions() {
            if let Some(p) = procs.iter_mut().find(|p| p.ioc() == c.req.ioc) {
                p.complete(&c);
            }
        }
        if state == Advance::Completed {
            if drv.now() >= stop && next.is_none_or(|t| t > stop) {
                return RunEnd {
                    start,
                    end: stop,
                    finished: false,
                };
            }
            continue;
        }
        match next {
            Some(t) if t <= stop => {
                for p in procs.iter_mut() {
                    if p.next_event() == Some(t) {
                        out.clear();
                        p.act(t, &mut ids, &mut out);
                        for r in out.drain(..) {
                            drv.submit(r, t);
                        }
                    }
                }
            }
            _ => {
                let finished = state == Advance::Idle && next.is_none();
                if finished || drv.now() >= stop {
                    let last = procs
                        .iter()
                        .filter_map(|p| p.stats().last_complete)
                        .max()
                        .unwrap_or(start);
                    return RunEnd {
                        start,
                        end: if finished { last.max(start) } else { stop },
                        finished,
                    };
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::blkbench::{driver, DriverSetup};
    use crate::procs::{BufferedWriter, SequentialReader};

    fn procs(t0: Nanos) -> Vec<Box<dyn Process>> {
        vec![
            Box::new(SequentialReader::new(
                "r",
                1,
                0,
                1 << 20,
                256,
                None,
                1,
                1_000_000,
                t0,
            )),
            Box::new(BufferedWriter::new(
                "w",
                2,
                1 << 21,
                1 << 20,
                128,
                None,
                32,
                8,
                false,
                t0,
            )),
        ]
    }

    #[test]
    fn a_time_limited_run_stops_at_its_limit_and_replays_exactly() {
        let m = emmc_card::model::DeviceModel::load("msm-emmc45-sdr50").unwrap();
        let once = || {
            let mut drv = driver(&m, &DriverSetup::default()).unwrap();
            let t0 = drv.now();
            let mut p = procs(t0);
            let end = run(&mut drv, &mut p, 500_000_000);
            let s: Vec<(u64, u64)> = p
                .iter()
                .map(|p| (p.stats().bytes_read, p.stats().bytes_written))
                .collect();
            (end, t0, s)
        };
        let (end, t0, s) = once();
        assert!(!end.finished);
        assert_eq!((end.start, end.end), (t0, t0 + 500_000_000));
        assert!(s[0].0 > 0 && s[1].1 > 0, "both made progress: {s:?}");
        assert_eq!(once().2, s, "deterministic");
    }
}
