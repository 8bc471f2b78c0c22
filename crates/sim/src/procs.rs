//! The processes of the packing experiments (seed 000, seed 004), as the block layer sees
//! their I/O:
//!
//! - [`BufferedWriter`]: a process writing a large file through the page cache (`lmdd
//!   of=file`): the writeback flusher submits async writes of the queue's request size,
//!   in plugged batches, keeping the queue at `nr_requests` — writes are always
//!   backlogged. Optionally a final `fsync` (a flush).
//! - [`SequentialReader`]: a process reading a large file (`lmdd if=file`): each read is
//!   a readahead window submitted as one sync request; `depth` windows are in flight
//!   (1: the reader waits for every window; 2: asynchronous readahead keeps one window
//!   ahead); after each completion the process spends `think_ns` consuming the data
//!   before the next window is asked for.
//! - [`FileRewriter`]: iozone's write/rewrite test with `-e` (fsync included): the file
//!   fits the page cache, so its dirty data all reaches the queue at the fsync, then the
//!   flush; the rewrite writes the same sectors again.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use emmc_card::timing::Nanos;
use emmc_host::blkdrv::BlkCompletion;
use emmc_host::packing::{BlkOp, BlkRequest};

use super::engine::{Outstanding, Process, ProcessStats};
use super::workload::{Op, Request, Workload};

/// Segments of a request whose data lies in separate 4 KiB pages.
fn page_segments(sectors: u32) -> u32 {
    sectors.div_ceil(8).max(1)
}

/// A buffered sequential writer and its writeback.
#[derive(Debug, Clone)]
pub struct BufferedWriter {
    name: String,
    ioc: u32,
    /// Next sector to write, first sector past the region, region start (wraps).
    next: u64,
    start: u64,
    end: u64,
    /// Request size in sectors.
    bs: u32,
    /// Sectors still to write (`u64::MAX`: until the run stops).
    left: u64,
    /// Requests kept queued or in flight (`nr_requests`).
    depth: usize,
    /// Requests submitted in one plug.
    batch: usize,
    fsync: bool,
    flushed: bool,
    flush_outstanding: bool,
    /// When the flusher next submits (None: waits for completions).
    wake: Option<Nanos>,
    out: Outstanding,
    stats: ProcessStats,
}

impl BufferedWriter {
    /// A writer of `bytes` (None: unbounded) in requests of `bs` sectors over
    /// `[start, start + span)`, writeback keeping `depth` requests queued, plugging
    /// `batch` at a time; `fsync` flushes at the end.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        name: &str,
        ioc: u32,
        start: u64,
        span: u64,
        bs: u32,
        bytes: Option<u64>,
        depth: usize,
        batch: usize,
        fsync: bool,
        at: Nanos,
    ) -> BufferedWriter {
        let bs = bs.max(1);
        BufferedWriter {
            name: name.to_string(),
            ioc,
            next: start,
            start,
            end: start + span.max(u64::from(bs)),
            bs,
            left: bytes.map_or(u64::MAX, |b| b.div_ceil(512)),
            depth: depth.max(1),
            batch: batch.clamp(1, depth.max(1)),
            fsync,
            flushed: false,
            flush_outstanding: false,
            wake: Some(at),
            out: Outstanding::default(),
            stats: ProcessStats::default(),
        }
    }

    fn refill_due(&self) -> bool {
        self.left > 0 && self.out.len() + self.batch <= self.depth
    }
}

impl Process for BufferedWriter {
    fn name(&self) -> &str {
        &self.name
    }

    fn ioc(&self) -> u32 {
        self.ioc
    }

    fn next_event(&self) -> Option<Nanos> {
        self.wake
    }

    fn act(&mut self, now: Nanos, ids: &mut u64, out: &mut Vec<BlkRequest>) {
        self.wake = None;
        self.stats.submitted(now);
        if self.left == 0 {
            if self.fsync && !self.flushed && self.out.is_empty() {
                self.flushed = true;
                self.flush_outstanding = true;
                let r = BlkRequest {
                    sync: true,
                    ioc: self.ioc,
                    ..BlkRequest::new(*ids, BlkOp::Flush, 0, 0)
                };
                *ids += 1;
                self.out.push(r, now);
                out.push(r);
            }
            return;
        }
        let room = self.depth - self.out.len();
        for _ in 0..room {
            if self.left == 0 {
                break;
            }
            if self.next + u64::from(self.bs) > self.end {
                self.next = self.start;
            }
            let n = u64::from(self.bs).min(self.left) as u32;
            let r = BlkRequest {
                ioc: self.ioc,
                segments: page_segments(n),
                ..BlkRequest::new(*ids, BlkOp::Write, self.next, n)
            };
            *ids += 1;
            self.next += u64::from(n);
            self.left -= u64::from(n);
            self.out.push(r, now);
            out.push(r);
        }
    }

    fn complete(&mut self, c: &BlkCompletion) {
        let done = self.out.complete(c);
        self.stats.record(&done, c);
        if done.iter().any(|(r, _)| r.op == BlkOp::Flush) {
            self.flush_outstanding = false;
        }
        if self.wake.is_none()
            && (self.refill_due()
                || (self.left == 0 && self.fsync && !self.flushed && self.out.is_empty()))
        {
            self.wake = Some(c.at);
        }
    }

    fn stats(&self) -> &ProcessStats {
        &self.stats
    }
}

/// A sequential reader with readahead.
#[derive(Debug, Clone)]
pub struct SequentialReader {
    name: String,
    ioc: u32,
    next: u64,
    start: u64,
    end: u64,
    bs: u32,
    left: u64,
    think_ns: Nanos,
    /// Instants at which consumed windows free a slot for the next request.
    wakes: Vec<Nanos>,
    out: Outstanding,
    stats: ProcessStats,
}

impl SequentialReader {
    /// A reader of `bytes` (None: unbounded) in windows of `bs` sectors over
    /// `[start, start + span)`, `depth` windows in flight, `think_ns` per window.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        name: &str,
        ioc: u32,
        start: u64,
        span: u64,
        bs: u32,
        bytes: Option<u64>,
        depth: usize,
        think_ns: Nanos,
        at: Nanos,
    ) -> SequentialReader {
        let bs = bs.max(1);
        let depth = depth.max(1);
        SequentialReader {
            name: name.to_string(),
            ioc,
            next: start,
            start,
            end: start + span.max(u64::from(bs)),
            bs,
            left: bytes.map_or(u64::MAX, |b| b.div_ceil(512)),
            think_ns,
            wakes: vec![at; depth],
            out: Outstanding::default(),
            stats: ProcessStats::default(),
        }
    }
}

impl Process for SequentialReader {
    fn name(&self) -> &str {
        &self.name
    }

    fn ioc(&self) -> u32 {
        self.ioc
    }

    fn next_event(&self) -> Option<Nanos> {
        if self.left == 0 {
            return None;
        }
        self.wakes.iter().copied().min()
    }

    fn act(&mut self, now: Nanos, ids: &mut u64, out: &mut Vec<BlkRequest>) {
        self.stats.submitted(now);
        while let Some(pos) = self.wakes.iter().position(|&t| t <= now) {
            self.wakes.swap_remove(pos);
            if self.left == 0 {
                continue;
            }
            if self.next + u64::from(self.bs) > self.end {
                self.next = self.start;
            }
            let n = u64::from(self.bs).min(self.left) as u32;
            let r = BlkRequest {
                ioc: self.ioc,
                segments: page_segments(n),
                ..BlkRequest::new(*ids, BlkOp::Read, self.next, n)
            };
            *ids += 1;
            self.next += u64::from(n);
            self.left -= u64::from(n);
            self.out.push(r, now);
            out.push(r);
        }
    }

    fn complete(&mut self, c: &BlkCompletion) {
        let done = self.out.complete(c);
        self.stats.record(&done, c);
        for _ in &done {
            self.wakes.push(c.at.saturating_add(self.think_ns));
        }
    }

    fn stats(&self) -> &ProcessStats {
        &self.stats
    }
}

/// iozone's write and rewrite of one file with fsync.
#[derive(Debug, Clone)]
pub struct FileRewriter {
    name: String,
    ioc: u32,
    start: u64,
    file_sectors: u64,
    bs: u32,
    /// 0: write, 1: rewrite, 2: done.
    phase: usize,
    /// Start and end (fsync done) of each phase.
    pub phases: [(Nanos, Nanos); 2],
    /// Time to copy one record into the page cache (per phase, before writeback).
    copy_ns: Nanos,
    writes_sent: bool,
    flush_sent: bool,
    wake: Option<Nanos>,
    out: Outstanding,
    stats: ProcessStats,
}

impl FileRewriter {
    /// A file of `file_bytes` at `start`, written back in requests of `bs` sectors;
    /// `copy_ns` of process time to dirty it.
    pub fn new(
        name: &str,
        ioc: u32,
        start: u64,
        file_bytes: u64,
        bs: u32,
        copy_ns: Nanos,
        at: Nanos,
    ) -> FileRewriter {
        FileRewriter {
            name: name.to_string(),
            ioc,
            start,
            file_sectors: file_bytes.div_ceil(512).max(1),
            bs: bs.max(1),
            phase: 0,
            phases: [(at, at); 2],
            copy_ns,
            writes_sent: false,
            flush_sent: false,
            wake: Some(at),
            out: Outstanding::default(),
            stats: ProcessStats::default(),
        }
    }

    /// Throughput of the write (0) and rewrite (1) phases in bytes per second.
    pub fn phase_bytes_per_sec(&self, phase: usize) -> f64 {
        let (a, b) = self.phases[phase.min(1)];
        if b <= a {
            return 0.0;
        }
        (self.file_sectors * 512) as f64 / ((b - a) as f64 / 1e9)
    }

    pub fn finished(&self) -> bool {
        self.phase >= 2
    }
}

impl Process for FileRewriter {
    fn name(&self) -> &str {
        &self.name
    }

    fn ioc(&self) -> u32 {
        self.ioc
    }

    fn next_event(&self) -> Option<Nanos> {
        self.wake
    }

    fn act(&mut self, now: Nanos, ids: &mut u64, out: &mut Vec<BlkRequest>) {
        self.wake = None;
        if self.phase >= 2 {
            return;
        }
        self.stats.submitted(now);
        let (begun, _) = self.phases[self.phase];
        if !self.writes_sent && now < begun.saturating_add(self.copy_ns) {
            // The process is still copying records into the page cache.
            self.wake = Some(begun.saturating_add(self.copy_ns));
            return;
        }
        if !self.writes_sent {
            // fsync: writeback of the whole file; the flush once it has landed.
            self.writes_sent = true;
            let mut lba = self.start;
            let end = self.start + self.file_sectors;
            while lba < end {
                let n = u64::from(self.bs).min(end - lba) as u32;
                let r = BlkRequest {
                    ioc: self.ioc,
                    segments: page_segments(n),
                    ..BlkRequest::new(*ids, BlkOp::Write, lba, n)
                };
                *ids += 1;
                lba += u64::from(n);
                self.out.push(r, now);
                out.push(r);
            }
        } else if !self.flush_sent && self.out.is_empty() {
            let f = BlkRequest {
                sync: true,
                ioc: self.ioc,
                ..BlkRequest::new(*ids, BlkOp::Flush, 0, 0)
            };
            *ids += 1;
            self.flush_sent = true;
            self.out.push(f, now);
            out.push(f);
        }
    }

    fn complete(&mut self, c: &BlkCompletion) {
        let done = self.out.complete(c);
        self.stats.record(&done, c);
        if !self.out.is_empty() {
            return;
        }
        if !self.flush_sent {
            self.wake = Some(c.at);
            return;
        }
        self.phases[self.phase].1 = c.at;
        self.phase += 1;
        self.flush_sent = false;
        self.writes_sent = false;
        if self.phase < 2 {
            self.phases[self.phase] = (c.at, c.at);
            self.wake = Some(c.at);
        }
    }

    fn phase_rates(&self) -> Option<(f64, f64)> {
        self.finished()
            .then(|| (self.phase_bytes_per_sec(0), self.phase_bytes_per_sec(1)))
    }

    fn stats(&self) -> &ProcessStats {
        &self.stats
    }
}

/// Block requests from a [`Workload`] fed to the driver as fio or a traced guest would:
/// each request is submitted at its trace time (if it has one) once one of `qd` slots is
/// free; a request without a time goes as soon as a slot frees (a closed loop, fio's
/// `iodepth`). With a trace and a large `qd` this is an open-loop replay: what arrived in
/// the trace arrives at the same instants here, whatever the card does with it.
pub struct Feeder {
    name: String,
    ioc: u32,
    source: Box<dyn Workload + Send>,
    /// The next request, taken from `source` but not yet submitted.
    next: Option<Request>,
    /// Trace times count from here (the card time the run started).
    origin: Nanos,
    /// Instants at which a slot is (or becomes) free; as many entries as free slots.
    free: Vec<Nanos>,
    /// Writes are marked sync (O_DIRECT, as fio issues them); false: as a virtio-blk
    /// frontend hands them over (the daemon's requests).
    sync_writes: bool,
    /// Counts finished requests for a progress bar on another thread.
    progress: Option<Arc<AtomicU64>>,
    out: Outstanding,
    stats: ProcessStats,
}

impl Feeder {
    /// Count every finished request into `progress`.
    pub fn counting(mut self, progress: Option<Arc<AtomicU64>>) -> Feeder {
        self.progress = progress;
        self
    }

    /// Feed `source` with `qd` slots from card time `origin`.
    pub fn new(
        name: &str,
        ioc: u32,
        mut source: Box<dyn Workload + Send>,
        qd: usize,
        origin: Nanos,
        sync_writes: bool,
    ) -> Feeder {
        let next = source.next_request();
        Feeder {
            name: name.to_string(),
            ioc,
            source,
            next,
            origin,
            free: vec![origin; qd.max(1)],
            sync_writes,
            progress: None,
            out: Outstanding::default(),
            stats: ProcessStats::default(),
        }
    }

    fn due(&self, r: &Request) -> Nanos {
        r.at.map_or(self.origin, |t| self.origin.saturating_add(t))
    }

    fn block_request(&self, id: u64, r: &Request) -> BlkRequest {
        let (op, fua) = match r.op {
            Op::Read => (BlkOp::Read, false),
            Op::Write => (BlkOp::Write, false),
            Op::WriteReliable => (BlkOp::Write, true),
            Op::Flush => (BlkOp::Flush, false),
            Op::Discard => (BlkOp::Discard, false),
        };
        let (lba, sectors) = if op == BlkOp::Flush {
            (0, 0)
        } else {
            (r.lba, r.sectors)
        };
        let mut b = BlkRequest {
            ioc: self.ioc,
            fua,
            ..BlkRequest::new(id, op, lba, sectors)
        };
        if op == BlkOp::Write && (fua || self.sync_writes) {
            b.sync = true;
        }
        b
    }
}

impl Process for Feeder {
    fn name(&self) -> &str {
        &self.name
    }

    fn ioc(&self) -> u32 {
        self.ioc
    }

    fn next_event(&self) -> Option<Nanos> {
        let r = self.next.as_ref()?;
        let slot = self.free.iter().copied().min()?;
        Some(slot.max(self.due(r)))
    }

    fn act(&mut self, now: Nanos, ids: &mut u64, out: &mut Vec<BlkRequest>) {
        self.stats.submitted(now);
        while let Some(r) = self.next {
            if self.due(&r) > now {
                break;
            }
            let Some(pos) = self.free.iter().position(|&t| t <= now) else {
                break;
            };
            self.free.swap_remove(pos);
            let b = self.block_request(*ids, &r);
            *ids += 1;
            self.out.push(b, now);
            out.push(b);
            self.next = self.source.next_request();
        }
    }

    fn complete(&mut self, c: &BlkCompletion) {
        let done = self.out.complete(c);
        self.stats.record(&done, c);
        for _ in &done {
            self.free.push(c.at);
        }
        if let Some(p) = &self.progress {
            p.fetch_add(done.len() as u64, Ordering::Relaxed);
        }
    }

    fn stats(&self) -> &ProcessStats {
        &self.stats
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::run;
    use emmc_host::blkdrv::BlkError;

    fn done(req: BlkRequest, at: Nanos) -> BlkCompletion {
        BlkCompletion {
            req,
            at,
            result: Ok(()),
        }
    }

    #[test]
    fn writeback_fills_the_queue_refills_by_plugs_and_fsyncs_last() {
        let mut w = BufferedWriter::new(
            "w",
            2,
            1000,
            1 << 20,
            128,
            Some(20 * 64 * 1024),
            8,
            4,
            true,
            0,
        );
        let mut ids = 1;
        let mut out = Vec::new();
        assert_eq!(w.next_event(), Some(0));
        w.act(0, &mut ids, &mut out);
        assert_eq!(out.len(), 8, "the queue is filled to its depth");
        assert!(out
            .iter()
            .all(|r| r.op == BlkOp::Write && !r.sync && r.ioc == 2));
        assert_eq!(out[1].lba, out[0].lba + 128, "sequential");
        // Three completions free 3 slots: fewer than a plug, no refill yet.
        for r in &out[..3] {
            w.complete(&done(*r, 10));
        }
        assert_eq!(w.next_event(), None);
        w.complete(&done(out[3], 11));
        assert_eq!(w.next_event(), Some(11), "a plug's worth of room");
        let first = out.clone();
        out.clear();
        w.act(11, &mut ids, &mut out);
        assert_eq!(out.len(), 4);
        // Finish everything: 20 writes in all, then one flush.
        let mut pending: Vec<BlkRequest> = first[4..].iter().chain(out.iter()).copied().collect();
        let mut t = 20;
        let mut flushes = 0;
        while let Some(r) = pending.pop() {
            w.complete(&done(r, t));
            t += 1;
            if let Some(at) = w.next_event() {
                let mut more = Vec::new();
                w.act(at, &mut ids, &mut more);
                flushes += more.iter().filter(|r| r.op == BlkOp::Flush).count();
                pending.extend(more);
            }
        }
        assert_eq!(w.stats().bytes_written, 20 * 64 * 1024);
        assert_eq!(w.stats().writes.count(), 20);
        assert_eq!(flushes, 1);
    }

    #[test]
    fn a_reader_thinks_after_each_window_and_merged_or_split_completions_count_once() {
        let mut r = SequentialReader::new("r", 1, 0, 1 << 20, 256, None, 1, 5_000, 0);
        let mut ids = 1;
        let mut out = Vec::new();
        r.act(0, &mut ids, &mut out);
        assert_eq!(out.len(), 1);
        let win = out[0];
        assert!(win.is_sync());
        // The driver completes it in two halves (a split): one window done.
        r.complete(&done(
            BlkRequest {
                sectors: 128,
                ..win
            },
            100,
        ));
        assert_eq!(r.next_event(), None, "half a window: still waiting");
        r.complete(&done(
            BlkRequest {
                lba: 128,
                sectors: 128,
                ..win
            },
            200,
        ));
        assert_eq!(r.next_event(), Some(5_200), "think time after the window");
        assert_eq!(r.stats().reads.count(), 1);
        assert_eq!(r.stats().bytes_read, 256 * 512);
        assert_eq!(r.stats().reads.max(), 200);
    }

    #[test]
    fn failed_requests_count_as_errors_not_bytes() {
        let mut r = SequentialReader::new("r", 1, 0, 1 << 20, 8, Some(4096), 1, 0, 0);
        let mut ids = 1;
        let mut out = Vec::new();
        r.act(0, &mut ids, &mut out);
        r.complete(&BlkCompletion {
            req: out[0],
            at: 5,
            result: Err(BlkError::NotSupported(BlkOp::Read)),
        });
        assert_eq!(r.stats().errors, 1);
        assert_eq!(r.stats().bytes_read, 0);
    }

    #[test]
    fn iozone_writes_back_the_file_then_flushes_then_rewrites() {
        let m = emmc_card::model::DeviceModel::load("generic-emmc45").unwrap();
        let mut drv = crate::blkbench::driver(&m, &Default::default()).unwrap();
        let t0 = drv.now();
        let mut procs: Vec<Box<dyn crate::engine::Process>> = vec![Box::new(FileRewriter::new(
            "iozone",
            3,
            0,
            1 << 20,
            1024,
            1_000,
            t0,
        ))];
        let end = run(&mut drv, &mut procs, 3600 * 1_000_000_000);
        assert!(end.finished);
        let (w, rw) = procs[0].phase_rates().expect("both phases ran");
        assert!(w > 0.0 && rw > 0.0);
        assert_eq!(procs[0].stats().bytes_written, 2 << 20);
        assert_eq!(procs[0].stats().others.count(), 2, "one flush per phase");
    }
}
