//! A CFQ-like scheduler: the parts of Linux's Completely Fair Queueing (`cfq-iosched.c`,
//! 3.x, the scheduler seed 000 measured under) that decide how many writes a read waits
//! behind. Each process's sync requests (reads, sync writes) get their own queue; every
//! async request (buffered writeback) goes to one shared async queue. One queue at a
//! time is *active* and owns the device for a time slice.
//!
//! Modelled, with Linux's defaults ([`CfqTunables::default`]):
//!
//! - **Slices**: sync queues 100 ms (`slice_sync`), async 40 ms (`slice_async`); a slice
//!   starts when the queue's first request completes. An async queue is also expired after
//!   dispatching 16 requests (2 × `slice_async_rq` × (8 − prio 4)) while other queues wait.
//! - **Service order**: a queue that becomes busy, or is expired with requests left, is
//!   keyed `now + (busy queues − 1) × offset`, the offset being the difference to the
//!   longest slice (80 ms for a sync queue, 140 ms for the async one); the lowest key runs
//!   next. Async queues therefore wait longer for their turn.
//! - **Idling** (`slice_idle` 8 ms): when the active sync queue runs empty with nothing in
//!   flight, CFQ waits for its process's next request instead of switching — if the
//!   process's mean think time (decaying average of the gap between a completion and its
//!   next request, each sample capped at 2 × `slice_idle`) is at most `slice_idle`, and
//!   the queue is not *seeky* (`cfq_update_io_seektime`, `CFQQ_SEEKY`): of its last 32
//!   requests more than 4 were small (under 64 sectors) on a non-rotational queue (the
//!   MMC queue is one), or jumped more than 800 sectors on a rotational one — unless the
//!   queue has been *deep* (4 or more requests queued at once).
//! - **Preemption**: a sync request arriving while an async queue is active (or the
//!   active queue's slice is used) makes its queue active at once.
//! - **Dispatch limits** (`cfq_may_dispatch`): a sync queue that idles does not start while
//!   async requests are in the driver (drain); an async queue does not dispatch while sync
//!   requests are in the driver; a queue has at most `quantum / 2` = 4 requests in the
//!   driver (8 early in its slice while other queues wait, no limit when it is alone);
//!   with `low_latency`, the async queue may have only ⌊(now − last delayed sync) /
//!   slice_sync⌋ in the driver (1 when none), a *delayed sync* being a sync request that
//!   completed `fifo_expire_sync` (125 ms) or more after it was queued.
//! - **FIFO**: a request waiting longer than `fifo_expire` (sync 125 ms, async 250 ms) is
//!   dispatched before sector order.
//! - Requests dispatched (fetched by the driver) count as in the driver until
//!   [`IoScheduler::completed`]; [`IoScheduler::requeue`] takes them back.
//! - Flushes go straight to the dispatch list (the block layer's flush machinery bypasses
//!   the elevator); requeued requests go to its front.
//!
//! Not modelled: priorities other than the default best-effort 4, groups (blkio cgroups),
//! workload slices and `target_latency` scaling, `back_seek` penalties, close
//! cooperators, `hw_tag` detection (CFQ stops idling on queued hardware that keeps more
//! than 5 requests in flight; an MMC host with packing can).

use std::collections::{BTreeMap, HashMap, VecDeque};

use super::{try_merge, IoScheduler, MergeLimits};
use crate::packing::{BlkOp, BlkRequest};
use emmc_card::timing::Nanos;

const MS: Nanos = 1_000_000;

/// CFQ's tunables (`/sys/block/*/queue/iosched/`), Linux's defaults.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CfqTunables {
    /// `quantum`: requests a queue may have in the driver (half of it normally).
    pub quantum: u32,
    pub fifo_expire_sync_ns: Nanos,
    pub fifo_expire_async_ns: Nanos,
    pub slice_sync_ns: Nanos,
    pub slice_async_ns: Nanos,
    /// `slice_async_rq`: scales how many requests an async queue dispatches per slice.
    pub slice_async_rq: u32,
    /// `slice_idle`: how long to wait for a sync queue's next request (0: never idle).
    pub slice_idle_ns: Nanos,
    /// `low_latency`: ramp up the async queue's depth after sync I/O.
    pub low_latency: bool,
    /// The queue is non-rotational (`QUEUE_FLAG_NONROT`, which the MMC queue sets): a
    /// queue of small requests is seeky and does not idle.
    pub nonrot: bool,
}

impl Default for CfqTunables {
    fn default() -> Self {
        CfqTunables {
            quantum: 8,
            fifo_expire_sync_ns: 125 * MS,
            fifo_expire_async_ns: 250 * MS,
            slice_sync_ns: 100 * MS,
            slice_async_ns: 40 * MS,
            slice_async_rq: 2,
            slice_idle_ns: 8 * MS,
            low_latency: true,
            nonrot: true,
        }
    }
}

/// A seek on a rotational queue: more than 800 sectors away (`CFQQ_SEEK_THR`).
const CFQQ_SEEK_THR: u64 = 8 * 100;
/// A small request on a non-rotational queue: under 64 sectors (`CFQQ_SECT_THR_NONROT`).
const CFQQ_SECT_THR_NONROT: u32 = 2 * 32;

/// The default priority level of best-effort I/O (IOPRIO_NORM) and the number of levels.
const IOPRIO_NORM: u64 = 4;
const IOPRIO_BE_NR: u64 = 8;

#[derive(Debug)]
struct CfqQueue {
    sync: bool,
    ioc: u32,
    /// Queued requests by start sector (ties by id).
    sorted: BTreeMap<(u64, u64), BlkRequest>,
    /// Arrival order: (expiry, key).
    fifo: VecDeque<(Nanos, (u64, u64))>,
    /// Requests of this queue in the driver.
    dispatched: u32,
    on_rr: bool,
    rb_key: Nanos,
    slice_new: bool,
    slice_end: Nanos,
    slice_dispatch: u32,
    /// End of the last dispatched request: sector order continues from there.
    next_pos: u64,
    // Think time of the queue's process (sync queues).
    last_end_request: Option<Nanos>,
    ttime_mean: Nanos,
    ttime_samples: u32,
    idle_window: bool,
    /// One bit per request, newest lowest: a seek (or, non-rotational, a small request).
    seek_history: u32,
    /// End of the last request added (0: none yet).
    last_request_pos: u64,
    /// The queue held 4 or more requests at once (`cfq_cfqq_deep`).
    deep: bool,
}

impl CfqQueue {
    fn new(sync: bool, ioc: u32) -> CfqQueue {
        CfqQueue {
            sync,
            ioc,
            sorted: BTreeMap::new(),
            fifo: VecDeque::new(),
            dispatched: 0,
            on_rr: false,
            rb_key: 0,
            slice_new: true,
            slice_end: 0,
            slice_dispatch: 0,
            next_pos: 0,
            last_end_request: None,
            ttime_mean: 0,
            ttime_samples: 0,
            idle_window: sync,
            seek_history: 0,
            last_request_pos: 0,
            deep: false,
        }
    }

    fn is_empty(&self) -> bool {
        self.sorted.is_empty()
    }

    fn slice_used(&self, now: Nanos) -> bool {
        !self.slice_new && now >= self.slice_end
    }
}

/// The CFQ-like scheduler.
#[derive(Debug)]
pub struct Cfq {
    t: CfqTunables,
    limits: MergeLimits,
    queues: Vec<CfqQueue>,
    active: Option<usize>,
    /// The idle slice timer, armed on the active sync queue.
    idle_until: Option<Nanos>,
    /// Elevator requests in the driver: [async, sync].
    rq_in_flight: [u32; 2],
    last_delayed_sync: Option<Nanos>,
    /// Requests that go before anything the queues hold: requeued ones (with their
    /// queue) and flushes.
    dispatch_list: VecDeque<(BlkRequest, Option<usize>)>,
    /// Queue time of every queued or dispatched elevator request, by (id, first sector):
    /// pieces of one request share its id.
    queued_at: HashMap<(u64, u64), Nanos>,
    queued: usize,
}

impl Cfq {
    pub fn new(t: CfqTunables, limits: MergeLimits) -> Cfq {
        Cfq {
            t,
            limits,
            queues: Vec::new(),
            active: None,
            idle_until: None,
            rq_in_flight: [0, 0],
            last_delayed_sync: None,
            dispatch_list: VecDeque::new(),
            queued_at: HashMap::new(),
            queued: 0,
        }
    }

    pub fn tunables(&self) -> &CfqTunables {
        &self.t
    }

    /// The queue a request belongs to: its process's sync queue, or the async queue.
    fn queue_index(&mut self, req: &BlkRequest) -> usize {
        let sync = req.is_sync();
        let ioc = if sync { req.ioc } else { 0 };
        if let Some(i) = self
            .queues
            .iter()
            .position(|q| q.sync == sync && q.ioc == ioc)
        {
            return i;
        }
        self.queues.push(CfqQueue::new(sync, ioc));
        self.queues.len() - 1
    }

    fn busy_queues(&self) -> usize {
        self.queues.iter().filter(|q| q.on_rr).count()
    }

    fn busy_sync_queues(&self) -> usize {
        self.queues.iter().filter(|q| q.on_rr && q.sync).count()
    }

    /// `cfq_prio_slice` for the default priority.
    fn prio_slice(&self, sync: bool) -> Nanos {
        if sync {
            self.t.slice_sync_ns
        } else {
            self.t.slice_async_ns
        }
    }

    /// `cfq_slice_offset`: how far behind `now` a newly busy queue is keyed.
    fn slice_offset(&self, sync: bool) -> Nanos {
        let busy = self.busy_queues().saturating_sub(1) as u64;
        // The longest slice: a sync queue of the highest priority.
        let top = self
            .t
            .slice_sync_ns
            .saturating_add(self.t.slice_sync_ns / 5 * IOPRIO_NORM);
        busy.saturating_mul(top.saturating_sub(self.prio_slice(sync)))
    }

    /// Put a queue on the service tree (or move it) at `now`.
    fn service_tree_add(&mut self, i: usize, now: Nanos) {
        let key = now.saturating_add(self.slice_offset(self.queues[i].sync));
        let q = &mut self.queues[i];
        q.on_rr = true;
        q.rb_key = key;
    }

    fn should_idle(&self, q: &CfqQueue) -> bool {
        self.t.slice_idle_ns > 0 && q.sync && q.idle_window
    }

    /// `cfq_update_io_seektime`: a sync queue's seek history, one bit per request.
    fn update_seektime(&mut self, i: usize, req: &BlkRequest) {
        let nonrot = self.t.nonrot;
        let q = &mut self.queues[i];
        let sdist = if q.last_request_pos == 0 {
            0
        } else {
            req.lba.abs_diff(q.last_request_pos)
        };
        let seek = if nonrot {
            req.sectors < CFQQ_SECT_THR_NONROT
        } else {
            sdist > CFQQ_SEEK_THR
        };
        q.seek_history = (q.seek_history << 1) | u32::from(seek);
        q.last_request_pos = req.end();
    }

    /// `cfq_update_io_thinktime` and `cfq_update_idle_window` for a new request.
    fn update_thinktime(&mut self, i: usize, now: Nanos) {
        let cap = 2 * self.t.slice_idle_ns;
        let q = &mut self.queues[i];
        if !q.sync {
            return;
        }
        if q.sorted.len() + 1 >= 4 {
            q.deep = true;
        }
        // A seeky queue gains nothing from idling (CFQQ_SEEKY), unless it has been deep.
        if !q.deep && q.seek_history.count_ones() > 32 / 8 {
            q.idle_window = false;
            return;
        }
        if let Some(last) = q.last_end_request {
            let elapsed = now.saturating_sub(last).min(cap);
            q.ttime_mean = if q.ttime_samples == 0 {
                elapsed
            } else {
                (7 * q.ttime_mean + elapsed) / 8
            };
            q.ttime_samples = q.ttime_samples.saturating_add(1);
        }
        // Too few samples: keep idling (CFQ's default for a new sync queue).
        if q.ttime_samples >= 4 {
            q.idle_window = q.ttime_mean <= self.t.slice_idle_ns;
        }
    }

    /// `__cfq_slice_expired`: the active queue gives up the device.
    fn slice_expired(&mut self, now: Nanos) {
        self.idle_until = None;
        let Some(i) = self.active.take() else { return };
        if self.queues[i].is_empty() {
            self.queues[i].on_rr = false;
        } else {
            self.service_tree_add(i, now);
        }
    }

    fn set_active(&mut self, i: usize) {
        self.active = Some(i);
        self.idle_until = None;
        let q = &mut self.queues[i];
        q.slice_new = true;
        q.slice_dispatch = 0;
    }

    /// `cfq_should_preempt`: should queue `i`, which just got `req`, take over?
    fn should_preempt(&self, i: usize, req: &BlkRequest, now: Nanos) -> bool {
        let Some(a) = self.active else { return false };
        if a == i {
            return false;
        }
        let active = &self.queues[a];
        (req.is_sync() && !active.sync) || active.slice_used(now)
    }

    /// `cfq_select_queue`: the queue to dispatch from, if any should dispatch now.
    fn select_queue(&mut self, now: Nanos) -> Option<usize> {
        if let Some(a) = self.active {
            let q = &self.queues[a];
            let keep = if q.slice_used(now) {
                false
            } else if !q.is_empty() {
                return Some(a);
            } else if let Some(until) = self.idle_until {
                if now < until {
                    return None;
                }
                false
            } else {
                // Requests in flight on a queue that idles: wait for them before moving on.
                q.dispatched > 0 && self.should_idle(q)
            };
            if keep {
                return None;
            }
            self.slice_expired(now);
        }
        let next = self
            .queues
            .iter()
            .enumerate()
            .filter(|(_, q)| q.on_rr && !q.is_empty())
            .min_by_key(|(_, q)| q.rb_key)
            .map(|(i, _)| i)?;
        self.set_active(next);
        Some(next)
    }

    /// `cfq_slice_used_soon`.
    fn slice_used_soon(&self, q: &CfqQueue, now: Nanos) -> bool {
        q.slice_new
            || now.saturating_add(self.t.slice_idle_ns.saturating_mul(u64::from(q.dispatched)))
                > q.slice_end
    }

    /// `cfq_may_dispatch`.
    fn may_dispatch(&self, i: usize, now: Nanos) -> bool {
        let q = &self.queues[i];
        if self.should_idle(q) && self.rq_in_flight[0] > 0 {
            return false;
        }
        if self.rq_in_flight[1] > 0 && !q.sync {
            return false;
        }
        let mut max = (self.t.quantum / 2).max(1);
        if q.dispatched >= max {
            let promote_sync = q.sync && self.busy_sync_queues() == 1;
            let busy = self.busy_queues();
            if busy > 1 && self.slice_used_soon(q, now) && !promote_sync {
                return false;
            }
            max = if busy == 1 || promote_sync {
                u32::MAX
            } else {
                self.t.quantum
            };
        }
        if !q.sync && self.t.low_latency {
            let since = self
                .last_delayed_sync
                .map_or(Nanos::MAX, |t| now.saturating_sub(t));
            let mut depth = (since / self.t.slice_sync_ns.max(1)).min(u64::from(u32::MAX)) as u32;
            if depth == 0 && q.dispatched == 0 {
                depth = 1;
            }
            max = max.min(depth);
        }
        q.dispatched < max
    }

    /// The next request of queue `i`: an expired FIFO head, else the next in sector order.
    fn take_next(&mut self, i: usize, now: Nanos) -> Option<BlkRequest> {
        let q = &mut self.queues[i];
        while let Some(&(_, key)) = q.fifo.front() {
            if q.sorted.contains_key(&key) {
                break;
            }
            q.fifo.pop_front();
        }
        let key = match q.fifo.front() {
            Some(&(exp, key)) if exp <= now => key,
            _ => q
                .sorted
                .range((q.next_pos, 0)..)
                .next()
                .or_else(|| q.sorted.iter().next())
                .map(|(&k, _)| k)?,
        };
        let req = q.sorted.remove(&key)?;
        q.next_pos = req.end();
        Some(req)
    }

    fn activate(&mut self, i: usize) {
        self.queues[i].dispatched += 1;
        self.rq_in_flight[usize::from(self.queues[i].sync)] += 1;
    }
}

impl IoScheduler for Cfq {
    fn name(&self) -> &'static str {
        "cfq"
    }

    fn add(&mut self, req: BlkRequest, now: Nanos) {
        if req.op == BlkOp::Flush {
            self.dispatch_list.push_back((req, None));
            return;
        }
        let i = self.queue_index(&req);
        if self.queues[i].sync {
            self.update_seektime(i, &req);
        }
        self.update_thinktime(i, now);
        let expire = now.saturating_add(if req.is_sync() {
            self.t.fifo_expire_sync_ns
        } else {
            self.t.fifo_expire_async_ns
        });
        let limits = self.limits;
        let q = &mut self.queues[i];
        // Back merge, then front merge, with a queued request of this queue.
        let back = q
            .sorted
            .range(..(req.lba, 0))
            .next_back()
            .filter(|(_, p)| p.end() == req.lba)
            .map(|(&k, _)| k);
        let mut merged = false;
        if let Some(k) = back {
            let mut m = q.sorted[&k];
            if try_merge(&mut m, &req, &limits) {
                q.sorted.insert(k, m);
                merged = true;
            }
        }
        if !merged {
            let front = q
                .sorted
                .range((req.end(), 0)..)
                .next()
                .filter(|(_, n)| n.lba == req.end())
                .map(|(&k, _)| k);
            if let Some(k) = front {
                let mut m = q.sorted[&k];
                if try_merge(&mut m, &req, &limits) {
                    // The merged request starts earlier: re-key it, keep its FIFO place.
                    q.sorted.remove(&k);
                    let nk = (m.lba, m.id);
                    q.sorted.insert(nk, m);
                    if let Some(t) = self.queued_at.remove(&(k.1, k.0)) {
                        self.queued_at.insert((m.id, m.lba), t);
                    }
                    for e in q.fifo.iter_mut() {
                        if e.1 == k {
                            e.1 = nk;
                        }
                    }
                    merged = true;
                }
            }
        }
        if !merged {
            let key = (req.lba, req.id);
            q.sorted.insert(key, req);
            q.fifo.push_back((expire, key));
            self.queued_at.insert((req.id, req.lba), now);
            self.queued += 1;
        }
        if !self.queues[i].on_rr {
            self.service_tree_add(i, now);
        }
        // cfq_rq_enqueued
        if self.active == Some(i) {
            self.idle_until = None;
        } else if self.should_preempt(i, &req, now) {
            self.slice_expired(now);
            self.set_active(i);
            self.queues[i].rb_key = 0;
        }
    }

    fn dispatch(&mut self, now: Nanos) -> Option<BlkRequest> {
        if let Some((req, q)) = self.dispatch_list.pop_front() {
            if let Some(i) = q {
                self.activate(i);
            }
            return Some(req);
        }
        let i = self.select_queue(now)?;
        if !self.may_dispatch(i, now) {
            return None;
        }
        let req = self.take_next(i, now)?;
        self.queued -= 1;
        self.activate(i);
        let q = &mut self.queues[i];
        q.slice_dispatch += 1;
        // An async queue that dispatched its share while others wait is expired.
        let max_rq = 2 * self.t.slice_async_rq * (IOPRIO_BE_NR - IOPRIO_NORM) as u32;
        if !q.sync && q.slice_dispatch >= max_rq && self.busy_queues() > 1 {
            self.slice_expired(now);
        }
        Some(req)
    }

    fn requeue(&mut self, req: BlkRequest) {
        let q = if req.op == BlkOp::Flush {
            None
        } else {
            let i = self.queue_index(&req);
            let q = &mut self.queues[i];
            q.dispatched = q.dispatched.saturating_sub(1);
            let class = usize::from(q.sync);
            self.rq_in_flight[class] = self.rq_in_flight[class].saturating_sub(1);
            Some(i)
        };
        self.dispatch_list.push_front((req, q));
    }

    fn reinsert(&mut self, req: BlkRequest, now: Nanos) {
        if req.op == BlkOp::Flush {
            self.dispatch_list.push_front((req, None));
            return;
        }
        let i = self.queue_index(&req);
        let q = &mut self.queues[i];
        q.dispatched = q.dispatched.saturating_sub(1);
        let class = usize::from(q.sync);
        self.rq_in_flight[class] = self.rq_in_flight[class].saturating_sub(1);
        self.queued_at.remove(&(req.id, req.lba));
        self.add(req, now);
    }

    fn len(&self) -> usize {
        self.queued + self.dispatch_list.len()
    }

    fn next_event(&self, _now: Nanos) -> Option<Nanos> {
        self.idle_until
    }

    fn completed(&mut self, req: &BlkRequest, now: Nanos) {
        if req.op == BlkOp::Flush {
            return;
        }
        let i = self.queue_index(req);
        let sync = self.queues[i].sync;
        let q = &mut self.queues[i];
        q.dispatched = q.dispatched.saturating_sub(1);
        let class = usize::from(sync);
        self.rq_in_flight[class] = self.rq_in_flight[class].saturating_sub(1);
        let queued_at = self.queued_at.remove(&(req.id, req.lba));
        if sync {
            self.queues[i].last_end_request = Some(now);
            if queued_at.is_some_and(|t| now >= t.saturating_add(self.t.fifo_expire_sync_ns)) {
                self.last_delayed_sync = Some(now);
            }
        }
        if self.active == Some(i) {
            let slice = self.prio_slice(sync);
            let q = &mut self.queues[i];
            if q.slice_new {
                q.slice_end = now.saturating_add(slice);
                q.slice_new = false;
            }
            if q.slice_used(now) {
                self.slice_expired(now);
            } else if sync && q.is_empty() && q.dispatched == 0 && self.should_idle(&self.queues[i])
            {
                self.idle_until = Some(now.saturating_add(self.t.slice_idle_ns));
            }
        }
    }

    fn has_queued_read(&self) -> bool {
        self.queues
            .iter()
            .any(|q| q.sync && q.sorted.values().any(|r| r.op.is_read()))
            || self.dispatch_list.iter().any(|(r, _)| r.op.is_read())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LIMITS: MergeLimits = MergeLimits {
        max_sectors: 1024,
        max_segments: 128,
    };

    fn read(id: u64, lba: u64) -> BlkRequest {
        BlkRequest {
            ioc: 1,
            ..BlkRequest::new(id, BlkOp::Read, lba, 8)
        }
    }

    fn write(id: u64, lba: u64) -> BlkRequest {
        BlkRequest {
            ioc: 2,
            ..BlkRequest::new(id, BlkOp::Write, lba, 8)
        }
    }

    fn cfq() -> Cfq {
        Cfq::new(CfqTunables::default(), LIMITS)
    }

    #[test]
    fn a_read_preempts_the_async_queue_but_waits_for_writes_in_the_driver() {
        let mut s = cfq();
        for i in 0..10 {
            s.add(write(i, 1000 + i * 100), 0);
        }
        let w1 = s.dispatch(0).expect("async queue runs");
        assert_eq!(w1.op, BlkOp::Write);
        // A read arrives: its queue becomes active, but async requests are in the driver.
        s.add(read(100, 0), 1);
        assert_eq!(s.dispatch(1), None, "drain async before sync");
        s.completed(&w1, 5 * MS);
        let r = s.dispatch(5 * MS).expect("read goes next");
        assert_eq!(r.op, BlkOp::Read);
        assert_eq!(
            s.dispatch(5 * MS),
            None,
            "no async while sync is in the driver"
        );
    }

    #[test]
    fn an_idle_window_holds_the_device_for_a_quick_reader_and_times_out() {
        let mut s = cfq();
        s.add(read(1, 0), 0);
        s.add(write(50, 9000), 0);
        let r = s.dispatch(0).unwrap();
        assert_eq!(r.op, BlkOp::Read, "the sync queue was busy first");
        s.completed(&r, MS);
        assert_eq!(s.dispatch(MS), None, "idling for the reader");
        assert_eq!(s.next_event(MS), Some(MS + 8 * MS));
        // The reader comes back within slice_idle: served at once.
        s.add(read(2, 8), 3 * MS);
        let r2 = s.dispatch(3 * MS).unwrap();
        assert_eq!(r2.id, 2);
        s.completed(&r2, 4 * MS);
        assert_eq!(s.dispatch(5 * MS), None);
        // It does not come back: after slice_idle the async queue runs.
        let w = s.dispatch(4 * MS + 8 * MS).unwrap();
        assert_eq!(w.op, BlkOp::Write);
    }

    /// A reader issuing `n` reads of `sectors` at `stride` apart, each completing 1 ms
    /// after it is dispatched and the next arriving 0.3 ms later; then a write and one
    /// more read: is CFQ idling for the reader after that read?
    fn idles_after(t: CfqTunables, n: u64, sectors: u32, stride: u64) -> bool {
        let mut s = Cfq::new(t, LIMITS);
        let mut now = 0;
        let read = |id: u64| BlkRequest {
            ioc: 1,
            ..BlkRequest::new(id, BlkOp::Read, id * stride, sectors)
        };
        for i in 0..n {
            s.add(read(i), now);
            let r = s.dispatch(now).unwrap();
            now += MS;
            s.completed(&r, now);
            now += 300_000;
        }
        s.add(write(99, 9_000_000), now);
        s.add(read(n), now);
        let r = s.dispatch(now).unwrap();
        assert_eq!(r.op, BlkOp::Read);
        s.completed(&r, now + MS);
        s.dispatch(now + MS).is_none()
    }

    #[test]
    fn a_seeky_reader_does_not_hold_the_device_on_a_non_rotational_queue() {
        let t = CfqTunables::default();
        // 4 KiB reads: small on a non-rotational queue; after more than 4 of them CFQ
        // stops idling and the write goes at once.
        assert!(idles_after(t, 3, 8, 8), "too few samples: still idling");
        assert!(!idles_after(t, 10, 8, 8), "4 KiB reads are seeky");
        // 128 KiB sequential reads (seed 000's reader) keep their idle window.
        assert!(idles_after(t, 10, 256, 256));
        // On a rotational queue seeks are distance: 4 KiB reads in sequence idle,
        // 4 KiB reads 1 GiB apart do not.
        let rot = CfqTunables { nonrot: false, ..t };
        assert!(idles_after(rot, 10, 8, 8));
        assert!(!idles_after(rot, 10, 8, 2_000_000));
    }

    #[test]
    fn a_slow_reader_loses_its_idle_window() {
        let mut s = cfq();
        let mut now = 0;
        for i in 0..8 {
            s.add(read(i, i * 8), now);
            let r = s.dispatch(now).unwrap();
            now += MS;
            s.completed(&r, now);
            now += 30 * MS; // think time far above slice_idle
        }
        s.add(write(99, 5000), now);
        s.add(read(100, 64), now);
        let r = s.dispatch(now).unwrap();
        s.completed(&r, now + MS);
        assert_eq!(s.next_event(now + MS), None, "no idling for this reader");
    }

    #[test]
    fn async_depth_is_one_right_after_a_delayed_read_and_ramps_up() {
        let mut s = cfq();
        // A read that took 200 ms (> fifo_expire_sync) is a delayed sync.
        s.add(read(1, 0), 0);
        let r = s.dispatch(0).unwrap();
        s.completed(&r, 200 * MS);
        for i in 0..20 {
            s.add(write(10 + i, 1000 + i * 100), 200 * MS);
        }
        let t = 200 * MS + 9 * MS; // after the idle window
        let mut n = 0;
        while s.dispatch(t).is_some() {
            n += 1;
        }
        assert_eq!(n, 1, "depth 1 within slice_sync of the delayed read");
        let t2 = 200 * MS + 350 * MS;
        let mut m = 0;
        while s.dispatch(t2).is_some() {
            m += 1;
        }
        assert_eq!(
            m, 2,
            "depth 3 at 350 ms: 2 more besides the one in the driver"
        );
    }

    #[test]
    fn a_lone_async_queue_has_no_depth_limit_without_recent_delayed_syncs() {
        let mut s = cfq();
        for i in 0..40 {
            s.add(write(i, i * 100), 0);
        }
        let mut n = 0;
        while s.dispatch(0).is_some() {
            n += 1;
        }
        assert_eq!(n, 40, "the sole busy queue dispatches everything");
    }

    #[test]
    fn with_another_queue_busy_a_queue_has_half_the_quantum_in_the_driver() {
        let mut s = cfq();
        let sync_write = |id, ioc, lba| BlkRequest {
            sync: true,
            ioc,
            ..write(id, lba)
        };
        for i in 0..10 {
            s.add(sync_write(i, 1, i * 100), 0);
        }
        s.add(sync_write(50, 2, 90_000), 0);
        let mut n = 0;
        while s.dispatch(0).is_some() {
            n += 1;
        }
        assert_eq!(n, 4, "quantum / 2 while its slice has not started");
    }

    #[test]
    fn contiguous_requests_of_one_queue_merge_up_to_the_limits() {
        let mut s = cfq();
        for i in 0..200 {
            s.add(write(i, i * 8), 0);
        }
        let sizes: Vec<u32> = std::iter::from_fn(|| s.dispatch(0))
            .map(|r| r.sectors)
            .collect();
        assert_eq!(sizes, vec![1024, 576]);
        assert_eq!(s.len(), 0);
    }
}
