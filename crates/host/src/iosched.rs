//! I/O schedulers in front of the MMC block driver: the order in which queued block
//! requests reach the card, which decides how many writes sit between two reads — the
//! quantity write packing control watches (seed 000).
//!
//! The block layer's merging happens on insertion: a request that continues the previous
//! one in the same direction (back merge) or precedes it (front merge) is folded in while
//! the result stays within the driver's segment and sector limits.

use std::collections::{BTreeMap, VecDeque};

use super::packing::{BlkOp, BlkRequest};
use emmc_card::timing::Nanos;

mod cfq;
pub use cfq::{Cfq, CfqTunables};

/// What merging may build.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MergeLimits {
    pub max_sectors: u64,
    pub max_segments: u64,
}

/// Merge `b` into `a` if they are contiguous, of one kind, and fit the limits.
fn try_merge(a: &mut BlkRequest, b: &BlkRequest, limits: &MergeLimits) -> bool {
    let mergeable = matches!(a.op, BlkOp::Read | BlkOp::Write) && a.op == b.op && a.fua == b.fua;
    let sectors = u64::from(a.sectors) + u64::from(b.sectors);
    let segments = u64::from(a.segments) + u64::from(b.segments);
    if !mergeable
        || sectors > limits.max_sectors
        || segments > limits.max_segments
        || sectors > 65_535
    {
        return false;
    }
    if a.lba + u64::from(a.sectors) == b.lba {
        a.sectors = sectors as u32;
        a.segments = segments as u32;
        true
    } else if b.lba + u64::from(b.sectors) == a.lba {
        a.lba = b.lba;
        a.sectors = sectors as u32;
        a.segments = segments as u32;
        true
    } else {
        false
    }
}

/// An I/O scheduler.
pub trait IoScheduler: Send {
    fn name(&self) -> &'static str;
    /// Queue a request that arrived at `now` (merging where possible).
    fn add(&mut self, req: BlkRequest, now: Nanos);
    /// The next request for the driver at `now`, if the scheduler wants one dispatched.
    fn dispatch(&mut self, now: Nanos) -> Option<BlkRequest>;
    /// Give a fetched request back; it is dispatched next.
    fn requeue(&mut self, req: BlkRequest);
    fn len(&self) -> usize;
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// When a scheduler holding requests back (idling) wants to be asked again.
    fn next_event(&self, _now: Nanos) -> Option<Nanos> {
        None
    }
    /// The driver finished a request at `now` (schedulers that idle on sync I/O use it).
    fn completed(&mut self, _req: &BlkRequest, _now: Nanos) {}
    /// A read is queued and not yet dispatched (the driver's HPI policy asks).
    fn has_queued_read(&self) -> bool;
    /// Take back a dispatched request to be scheduled again as if it had just arrived (its
    /// in-driver accounting undone): the remainder of a write interrupted by HPI, which
    /// should not go ahead of the read that caused the interruption. By default it is
    /// requeued at the front.
    fn reinsert(&mut self, req: BlkRequest, _now: Nanos) {
        self.requeue(req);
    }
}

/// Which scheduler, with its tunables (Linux's `elevator=`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Elevator {
    Noop,
    Deadline(DeadlineTunables),
    Cfq(CfqTunables),
}

impl Elevator {
    pub fn build(&self, limits: MergeLimits) -> Box<dyn IoScheduler> {
        match *self {
            Elevator::Noop => Box::new(Noop::new(limits)),
            Elevator::Deadline(t) => Box::new(Deadline::new(t, limits)),
            Elevator::Cfq(t) => Box::new(Cfq::new(t, limits)),
        }
    }

    pub fn name(&self) -> &'static str {
        match self {
            Elevator::Noop => "noop",
            Elevator::Deadline(_) => "deadline",
            Elevator::Cfq(_) => "cfq",
        }
    }
}

/// First come, first served, with merging: Linux's noop.
#[derive(Debug)]
pub struct Noop {
    queue: VecDeque<BlkRequest>,
    limits: MergeLimits,
}

impl Noop {
    pub fn new(limits: MergeLimits) -> Noop {
        Noop {
            queue: VecDeque::new(),
            limits,
        }
    }
}

impl IoScheduler for Noop {
    fn name(&self) -> &'static str {
        "noop"
    }
    fn add(&mut self, req: BlkRequest, _now: Nanos) {
        if let Some(last) = self.queue.back_mut() {
            if try_merge(last, &req, &self.limits) {
                return;
            }
        }
        self.queue.push_back(req);
    }
    fn dispatch(&mut self, _now: Nanos) -> Option<BlkRequest> {
        self.queue.pop_front()
    }
    fn requeue(&mut self, req: BlkRequest) {
        self.queue.push_front(req);
    }
    fn len(&self) -> usize {
        self.queue.len()
    }
    fn has_queued_read(&self) -> bool {
        self.queue.iter().any(|r| r.op.is_read())
    }
    fn reinsert(&mut self, req: BlkRequest, _now: Nanos) {
        self.queue.push_back(req);
    }
}

/// Tunables of the deadline scheduler (Linux's defaults).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeadlineTunables {
    pub read_expire_ns: Nanos,
    pub write_expire_ns: Nanos,
    /// Requests dispatched in one direction, in sector order, before choosing again.
    pub fifo_batch: u32,
    /// Times reads may be preferred over waiting writes before writes get a batch.
    pub writes_starved: u32,
}

impl Default for DeadlineTunables {
    fn default() -> Self {
        DeadlineTunables {
            read_expire_ns: 500_000_000,
            write_expire_ns: 5_000_000_000,
            fifo_batch: 16,
            writes_starved: 2,
        }
    }
}

#[derive(Debug, Default)]
struct DirQueue {
    /// By start sector (ties by arrival id).
    sorted: BTreeMap<(u64, u64), BlkRequest>,
    /// Arrival order with deadline: (expires, sector key).
    fifo: VecDeque<(Nanos, (u64, u64))>,
}

impl DirQueue {
    fn is_empty(&self) -> bool {
        self.sorted.is_empty()
    }

    fn insert(&mut self, req: BlkRequest, expires: Nanos, limits: &MergeLimits) {
        // Back merge onto the request ending where this one starts.
        if let Some((&key, prev)) = self.sorted.range(..(req.lba, u64::MAX)).next_back() {
            if prev.lba + u64::from(prev.sectors) == req.lba {
                let mut merged = *prev;
                if try_merge(&mut merged, &req, limits) {
                    self.sorted.insert(key, merged);
                    return;
                }
            }
        }
        let key = (req.lba, req.id);
        self.sorted.insert(key, req);
        self.fifo.push_back((expires, key));
    }

    /// Oldest request still queued, with its deadline.
    fn fifo_head(&mut self) -> Option<(Nanos, (u64, u64))> {
        while let Some(&(exp, key)) = self.fifo.front() {
            if self.sorted.contains_key(&key) {
                return Some((exp, key));
            }
            self.fifo.pop_front();
        }
        None
    }

    fn take(&mut self, key: (u64, u64)) -> Option<BlkRequest> {
        self.sorted.remove(&key)
    }

    /// The next request at or after `from` in sector order.
    fn next_from(&self, from: u64) -> Option<(u64, u64)> {
        self.sorted.range((from, 0)..).next().map(|(&k, _)| k)
    }
}

/// Linux's deadline scheduler: reads preferred, requests dispatched in sector-sorted
/// batches, and a per-request deadline that wins over sorting once it expires.
#[derive(Debug)]
pub struct Deadline {
    t: DeadlineTunables,
    limits: MergeLimits,
    reads: DirQueue,
    writes: DirQueue,
    /// Direction of the current batch (true = write), position and count.
    batch_write: bool,
    batch_next: Option<u64>,
    batch_count: u32,
    starved: u32,
    /// Requests that flushes and discards must not overtake, kept in order.
    others: VecDeque<BlkRequest>,
    requeued: VecDeque<BlkRequest>,
}

impl Deadline {
    pub fn new(t: DeadlineTunables, limits: MergeLimits) -> Deadline {
        Deadline {
            t,
            limits,
            reads: DirQueue::default(),
            writes: DirQueue::default(),
            batch_write: false,
            batch_next: None,
            batch_count: 0,
            starved: 0,
            others: VecDeque::new(),
            requeued: VecDeque::new(),
        }
    }

    fn queue(&mut self, write: bool) -> &mut DirQueue {
        if write {
            &mut self.writes
        } else {
            &mut self.reads
        }
    }
}

impl IoScheduler for Deadline {
    fn name(&self) -> &'static str {
        "deadline"
    }

    fn add(&mut self, req: BlkRequest, now: Nanos) {
        match req.op {
            BlkOp::Read => {
                let exp = now.saturating_add(self.t.read_expire_ns);
                self.reads.insert(req, exp, &self.limits);
            }
            BlkOp::Write => {
                let exp = now.saturating_add(self.t.write_expire_ns);
                self.writes.insert(req, exp, &self.limits);
            }
            _ => self.others.push_back(req),
        }
    }

    fn dispatch(&mut self, now: Nanos) -> Option<BlkRequest> {
        if let Some(r) = self.requeued.pop_front() {
            return Some(r);
        }
        // Flushes and discards go once the data queued before them has gone (a simple
        // barrier: they wait for both directions to drain).
        if self.reads.is_empty() && self.writes.is_empty() {
            return self.others.pop_front();
        }
        // Continue the current batch in sector order.
        if self.batch_count < self.t.fifo_batch {
            if let Some(from) = self.batch_next {
                let write = self.batch_write;
                if let Some(key) = self.queue(write).next_from(from) {
                    let req = self.queue(write).take(key)?;
                    self.batch_count += 1;
                    self.batch_next = Some(req.lba + u64::from(req.sectors));
                    return Some(req);
                }
            }
        }
        // Choose a direction: reads unless writes have starved long enough.
        let write = if !self.reads.is_empty() {
            if !self.writes.is_empty() && self.starved >= self.t.writes_starved {
                true
            } else {
                if !self.writes.is_empty() {
                    self.starved += 1;
                }
                false
            }
        } else {
            true
        };
        if write {
            self.starved = 0;
        }
        let q = self.queue(write);
        let key = match q.fifo_head() {
            Some((exp, key)) if exp <= now => key,
            Some((_, fifo_key)) => q.next_from(0).unwrap_or(fifo_key),
            None => return None,
        };
        let req = self.queue(write).take(key)?;
        self.batch_write = write;
        self.batch_count = 1;
        self.batch_next = Some(req.lba + u64::from(req.sectors));
        Some(req)
    }

    fn requeue(&mut self, req: BlkRequest) {
        self.requeued.push_front(req);
    }

    fn len(&self) -> usize {
        self.reads.sorted.len() + self.writes.sorted.len() + self.others.len() + self.requeued.len()
    }

    fn has_queued_read(&self) -> bool {
        !self.reads.is_empty() || self.requeued.iter().any(|r| r.op.is_read())
    }

    fn reinsert(&mut self, req: BlkRequest, now: Nanos) {
        self.add(req, now);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LIMITS: MergeLimits = MergeLimits {
        max_sectors: 1024,
        max_segments: 128,
    };

    fn req(id: u64, op: BlkOp, lba: u64, sectors: u32) -> BlkRequest {
        BlkRequest {
            segments: 1,
            ..BlkRequest::new(id, op, lba, sectors)
        }
    }

    fn drain(s: &mut dyn IoScheduler, now: Nanos) -> Vec<BlkRequest> {
        std::iter::from_fn(|| s.dispatch(now)).collect()
    }

    #[test]
    fn noop_keeps_arrival_order_and_merges_contiguous_requests() {
        let mut s = Noop::new(LIMITS);
        s.add(req(1, BlkOp::Write, 100, 8), 0);
        s.add(req(2, BlkOp::Write, 108, 8), 0);
        s.add(req(3, BlkOp::Read, 0, 8), 0);
        s.add(req(4, BlkOp::Write, 50, 8), 0);
        let out = drain(&mut s, 0);
        assert_eq!(
            out.iter()
                .map(|r| (r.id, r.lba, r.sectors))
                .collect::<Vec<_>>(),
            vec![(1, 100, 16), (3, 0, 8), (4, 50, 8)]
        );
    }

    #[test]
    fn merging_respects_limits_and_kinds() {
        let mut a = req(1, BlkOp::Write, 0, 1000);
        assert!(
            !try_merge(&mut a, &req(2, BlkOp::Write, 1000, 100), &LIMITS),
            "max sectors"
        );
        assert!(
            !try_merge(&mut a, &req(2, BlkOp::Read, 1000, 8), &LIMITS),
            "direction"
        );
        let mut fua = req(3, BlkOp::Write, 0, 8);
        fua.fua = true;
        assert!(
            !try_merge(&mut fua, &req(4, BlkOp::Write, 8, 8), &LIMITS),
            "FUA with plain"
        );
        let mut f = req(5, BlkOp::Flush, 0, 0);
        assert!(!try_merge(&mut f, &req(6, BlkOp::Flush, 0, 0), &LIMITS));
        let mut b = req(7, BlkOp::Read, 8, 8);
        assert!(
            try_merge(&mut b, &req(8, BlkOp::Read, 0, 8), &LIMITS),
            "front merge"
        );
        assert_eq!((b.lba, b.sectors), (0, 16));
    }

    #[test]
    fn deadline_prefers_reads_but_gives_writes_a_batch_after_two_read_batches() {
        let t = DeadlineTunables {
            fifo_batch: 2,
            ..Default::default()
        };
        let mut s = Deadline::new(t, LIMITS);
        for i in 0..6 {
            s.add(req(i, BlkOp::Read, 10_000 + i * 100, 8), 0);
        }
        for i in 0..4 {
            s.add(req(100 + i, BlkOp::Write, i * 100, 8), 0);
        }
        let order: Vec<&str> = drain(&mut s, 0)
            .iter()
            .map(|r| if r.op == BlkOp::Read { "R" } else { "W" })
            .collect();
        assert_eq!(
            order,
            vec!["R", "R", "R", "R", "W", "W", "R", "R", "W", "W"]
        );
    }

    #[test]
    fn deadline_batches_in_sector_order_and_expired_requests_jump_the_sort() {
        let mut s = Deadline::new(DeadlineTunables::default(), LIMITS);
        s.add(req(1, BlkOp::Write, 900, 8), 0);
        s.add(req(2, BlkOp::Write, 100, 8), 1);
        s.add(req(3, BlkOp::Write, 500, 8), 2);
        let lbas: Vec<u64> = drain(&mut s, 10).iter().map(|r| r.lba).collect();
        assert_eq!(lbas, vec![100, 500, 900], "sorted while nothing expired");
        s.add(req(4, BlkOp::Write, 900, 8), 0);
        s.add(req(5, BlkOp::Write, 100, 8), 1);
        let first = s.dispatch(6_000_000_000).unwrap();
        assert_eq!(first.lba, 900, "the expired oldest request goes first");
    }

    #[test]
    fn deadline_holds_flushes_until_data_queued_before_them_is_gone_and_requeues_first() {
        let mut s = Deadline::new(DeadlineTunables::default(), LIMITS);
        s.add(req(1, BlkOp::Write, 0, 8), 0);
        s.add(req(2, BlkOp::Flush, 0, 0), 0);
        s.add(req(3, BlkOp::Read, 64, 8), 0);
        let first = s.dispatch(0).unwrap();
        s.requeue(first);
        assert_eq!(s.dispatch(0).unwrap().id, first.id, "requeued goes first");
        let rest: Vec<u64> = drain(&mut s, 0).iter().map(|r| r.id).collect();
        assert_eq!(*rest.last().unwrap(), 2, "the flush goes after the data");
        assert!(s.is_empty());
    }
}
