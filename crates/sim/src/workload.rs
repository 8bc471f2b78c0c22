//! Block-level workloads and the runner that plays them against a [`BlockDevice`] in card
//! time, with a fixed queue depth.
//!
//! Queue depth is modelled as a closed loop: request *i* is submitted when request
//! *i − qd* completes (or at its trace time, if later). The card serves one request at a
//! time, as a single-slot host does, so deeper queues raise latency (time spent waiting)
//! but not throughput — until a host driver that overlaps requests sits in between.

use super::device::{BlockDevice, IoError};
use emmc_card::timing::prng::Prng;
use emmc_card::timing::Nanos;
use emmc_host::histogram::Histogram;
use emmc_host::trace::Trace;
pub use emmc_host::trace::{Op, Request};

/// A source of requests.
pub trait Workload {
    fn next_request(&mut self) -> Option<Request>;
    /// Number of requests, when known (for progress reports).
    fn len_hint(&self) -> Option<u64> {
        None
    }
}

/// A trace replays its requests in order, each at its own time.
impl Workload for Trace {
    fn next_request(&mut self) -> Option<Request> {
        Trace::next_request(self)
    }

    fn len_hint(&self) -> Option<u64> {
        Some(self.len() as u64)
    }
}

/// Sequential, random or mixed streams of fixed-size requests.
#[derive(Debug, Clone)]
pub struct Stream {
    op: Op,
    pattern: Pattern,
    /// Block size in sectors.
    block: u32,
    /// First LBA and size of the region the stream covers, in sectors.
    start: u64,
    span: u64,
    count: u64,
    issued: u64,
    next_seq: u64,
    rng: Prng,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pattern {
    Sequential,
    /// Uniform over block-aligned offsets of the span.
    Random,
}

impl Stream {
    /// `count` requests of `block` sectors over `[start, start + span)`.
    pub fn new(
        op: Op,
        pattern: Pattern,
        block: u32,
        start: u64,
        span: u64,
        count: u64,
        seed: u64,
    ) -> Stream {
        Stream {
            op,
            pattern,
            block: block.max(1),
            start,
            span: span.max(u64::from(block.max(1))),
            count,
            issued: 0,
            next_seq: 0,
            rng: Prng::new(seed),
        }
    }
}

impl Workload for Stream {
    fn next_request(&mut self) -> Option<Request> {
        if self.issued == self.count {
            return None;
        }
        self.issued += 1;
        let slots = self.span / u64::from(self.block);
        let slot = match self.pattern {
            Pattern::Sequential => {
                let s = self.next_seq % slots;
                self.next_seq += 1;
                s
            }
            Pattern::Random => self.rng.below(slots),
        };
        Some(Request {
            at: None,
            op: self.op,
            lba: self.start + slot * u64::from(self.block),
            sectors: self.block,
        })
    }

    fn len_hint(&self) -> Option<u64> {
        Some(self.count)
    }
}

/// What a run measured.
#[derive(Debug, Clone, Default)]
pub struct RunStats {
    pub reads: Histogram,
    pub writes: Histogram,
    pub others: Histogram,
    pub bytes_read: u64,
    pub bytes_written: u64,
    /// Card time from the first submission to the last completion.
    pub elapsed_ns: Nanos,
    pub errors: u64,
}

impl RunStats {
    pub fn requests(&self) -> u64 {
        self.reads.count() + self.writes.count() + self.others.count()
    }
}

/// Play `workload` against `device` at queue depth `qd`. `progress` is called now and
/// then with the number of requests done.
pub fn run(
    device: &mut dyn BlockDevice,
    workload: &mut dyn Workload,
    qd: usize,
    progress: &mut dyn FnMut(u64),
) -> Result<RunStats, IoError> {
    let qd = qd.max(1);
    let mut slots: Vec<Nanos> = vec![device.now(); qd];
    let mut stats = RunStats::default();
    let start = device.now();
    let mut done = 0u64;
    while let Some(req) = workload.next_request() {
        let slot = (done % qd as u64) as usize;
        let submit = slots[slot].max(req.at.map_or(0, |t| start + t));
        if device.now() < submit {
            device.idle(submit - device.now());
        }
        let result = match req.op {
            Op::Read => device.read(req.lba, req.sectors),
            Op::Write => device.write(req.lba, req.sectors, false),
            Op::WriteReliable => device.write(req.lba, req.sectors, true),
            Op::Flush => device.flush(),
            Op::Discard => device.discard(req.lba, req.sectors),
        };
        match result {
            Ok(_) => {
                let latency = device.now() - submit;
                let bytes = u64::from(req.sectors) * 512;
                match req.op {
                    Op::Read => {
                        stats.reads.record(latency);
                        stats.bytes_read += bytes;
                    }
                    Op::Write | Op::WriteReliable => {
                        stats.writes.record(latency);
                        stats.bytes_written += bytes;
                    }
                    Op::Flush | Op::Discard => stats.others.record(latency),
                }
            }
            Err(e @ IoError::OutOfRange { .. }) => return Err(e),
            Err(e) => {
                log::warn!("{req:?}: {e}");
                stats.errors += 1;
            }
        }
        slots[slot] = device.now();
        done += 1;
        if done % 65_536 == 0 {
            progress(done);
        }
    }
    stats.elapsed_ns = device.now() - start;
    progress(done);
    Ok(stats)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::CardDevice;
    use emmc_card::model::DeviceModel;

    fn device(program_ns: u64) -> CardDevice {
        let mut m = DeviceModel::load("generic-emmc45").unwrap();
        m.timing = emmc_card::model::TimingModel::Constant(emmc_card::model::ConstantTimingModel {
            program_command_ns: program_ns,
            ..Default::default()
        });
        m.ext_csd.cache_size = 0;
        CardDevice::new(&m).unwrap()
    }

    #[test]
    fn sequential_stream_walks_the_span_and_wraps() {
        let mut s = Stream::new(Op::Write, Pattern::Sequential, 8, 100, 24, 5, 0);
        let lbas: Vec<u64> = std::iter::from_fn(|| s.next_request())
            .map(|r| r.lba)
            .collect();
        assert_eq!(lbas, vec![100, 108, 116, 100, 108]);
    }

    #[test]
    fn random_stream_is_aligned_inside_the_span_and_replays_by_seed() {
        let lbas = |seed| {
            let mut s = Stream::new(Op::Read, Pattern::Random, 8, 1000, 8000, 200, seed);
            std::iter::from_fn(move || s.next_request())
                .map(|r| r.lba)
                .collect::<Vec<_>>()
        };
        let a = lbas(3);
        assert!(a
            .iter()
            .all(|&l| (1000..9000).contains(&l) && (l - 1000) % 8 == 0));
        assert_eq!(a, lbas(3));
        assert_ne!(a, lbas(4));
    }

    #[test]
    fn queue_depth_raises_latency_not_throughput_on_a_serial_card() {
        let run_at = |qd| {
            let mut dev = device(1_000_000);
            let mut s = Stream::new(Op::Write, Pattern::Sequential, 8, 0, 1 << 20, 100, 0);
            run(&mut dev, &mut s, qd, &mut |_| {}).unwrap()
        };
        let one = run_at(1);
        let four = run_at(4);
        assert_eq!(one.elapsed_ns, four.elapsed_ns, "same total card time");
        assert_eq!(one.bytes_written, 100 * 4096);
        let p50_1 = one.writes.quantile(0.5);
        let p50_4 = four.writes.quantile(0.5);
        assert!(
            p50_4 > 3 * p50_1,
            "qd4 waits behind 3 others: {p50_1} vs {p50_4}"
        );
    }

    #[test]
    fn trace_times_hold_requests_back() {
        struct Timed(Vec<Request>);
        impl Workload for Timed {
            fn next_request(&mut self) -> Option<Request> {
                (!self.0.is_empty()).then(|| self.0.remove(0))
            }
        }
        let mut dev = device(0);
        let mut w = Timed(vec![
            Request {
                at: Some(0),
                op: Op::Read,
                lba: 0,
                sectors: 8,
            },
            Request {
                at: Some(10_000_000),
                op: Op::Read,
                lba: 8,
                sectors: 8,
            },
        ]);
        let stats = run(&mut dev, &mut w, 1, &mut |_| {}).unwrap();
        assert!(stats.elapsed_ns >= 10_000_000);
        assert!(
            stats.reads.max() < 1_000_000,
            "the second read did not wait for the first"
        );
    }
}
