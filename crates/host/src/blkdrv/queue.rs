//! The request queue and its thread, as Linux's `queue.c` (`mmc_queue_thread`) and the
//! dispatch half of `block.c` run it: block requests arrive (`blk_queue_bio`, split to
//! the queue limits), the scheduler orders them, the thread fetches one
//! (`blk_fetch_request`), builds a packed list around it, prepares it and starts it on
//! the card, fetching the next while one is on the bus (the two-deep pipeline).
//! [`MmcBlk::advance`] is that thread run in card time.

use std::cell::RefCell;

use crate::mmc::MmcHostOps;
use crate::packing::{prep_packed_list, BlkOp, BlkRequest, PackedList, StopReason};
use crate::sdhci::SdhciCompletion;
use emmc_card::timing::Nanos;

use super::{BlkCompletion, BlkData, BlkError, MmcBlk};

/// How [`MmcBlk::advance`] stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Advance {
    /// Completions are waiting in [`MmcBlk::take_completions`].
    Completed,
    /// Card time reached the instant asked for.
    Reached,
    /// Nothing to do until a new request arrives; time did not move.
    Idle,
}

/// Work the queue thread took from the scheduler.
#[derive(Debug, Clone)]
pub(super) enum Work {
    /// One read or write; `done` sectors of it have completed (legacy reliable-write
    /// pieces), `retries` counts errors so far.
    Rw {
        req: BlkRequest,
        done: u32,
        retries: u32,
    },
    /// A packed read or write of two or more requests.
    Packed { reqs: Vec<BlkRequest>, retries: u32 },
    /// Flush, discard, secure erase, write zeroes: run synchronously.
    Special(BlkRequest),
}

impl Work {
    pub(super) fn is_special(&self) -> bool {
        matches!(self, Work::Special(_))
    }
}

#[derive(Debug)]
pub(super) struct Prepared {
    pub(super) work: Work,
    /// When the queue thread fetched it, and when its preparation is done.
    pub(super) fetched_at: Nanos,
    pub(super) ready_at: Nanos,
}

/// What is on the card now.
#[derive(Debug)]
pub(super) enum Active {
    /// A read/write MMC request whose data phase is over; `sectors` of `work` are in it.
    Rw {
        work: Work,
        sectors: u32,
        /// The card still holds busy (programming).
        busy: bool,
        /// R1 of the command, checked when the request finishes.
        done: SdhciCompletion,
    },
    /// BKOPS started without waiting.
    Bkops,
}

impl<H: MmcHostOps, D: BlkData> MmcBlk<H, D> {
    /// Requests queued in the scheduler, prepared or on the card.
    pub fn in_progress(&self) -> bool {
        !self.sched.is_empty()
            || self.cur.is_some()
            || matches!(self.active, Some(Active::Rw { .. }))
    }

    /// Completions since the last call.
    pub fn take_completions(&mut self) -> Vec<BlkCompletion> {
        std::mem::take(&mut self.completions)
    }

    /// A block request arrives at card time `now` (`blk_queue_bio`): checked, split to
    /// the queue limits, handed to the scheduler. A request the device cannot hold
    /// completes at once with an error.
    pub fn submit(&mut self, req: BlkRequest, now: Nanos) {
        let data = req.op != BlkOp::Flush;
        let inside = req
            .lba
            .checked_add(u64::from(req.sectors))
            .is_some_and(|end| end <= self.f.sectors);
        if data && (req.sectors == 0 || !inside) {
            let size = self.f.sectors;
            self.fail(
                req,
                now,
                BlkError::OutOfRange {
                    lba: req.lba,
                    sectors: req.sectors,
                    size,
                },
            );
            return;
        }
        self.idle_since = None;
        self.bkops.checked = false;
        self.hpi.arrived(now, req.op.is_read());
        let split = matches!(req.op, BlkOp::Read | BlkOp::Write);
        if !split || req.sectors <= self.cfg.max_sectors {
            self.sched.add(req, now);
            return;
        }
        // blk_queue_split: pieces of at most max_sectors, each completing on its own
        // (they keep the request's id; their sectors tell them apart).
        let mut lba = req.lba;
        let mut left = req.sectors;
        while left > 0 {
            let n = left.min(self.cfg.max_sectors);
            self.sched.add(
                BlkRequest {
                    lba,
                    sectors: n,
                    segments: n.div_ceil(8).max(1),
                    ..req
                },
                now,
            );
            lba += u64::from(n);
            left -= n;
        }
    }

    /// Run the driver up to card time `until`. Stops early when requests complete
    /// ([`Advance::Completed`]) or when there is nothing to do ([`Advance::Idle`]). A
    /// transfer that cannot be interrupted may carry card time past `until`.
    pub fn advance(&mut self, until: Nanos) -> Advance {
        loop {
            if !self.completions.is_empty() {
                return Advance::Completed;
            }
            if let Some(active) = &self.active {
                let busy = match active {
                    Active::Rw { busy, .. } => *busy,
                    Active::Bkops => true,
                };
                if busy {
                    if let Some(t) = self.hpi_due(until) {
                        let at = t.max(self.host.now());
                        if !self.host.wait_busy_until(Some(at)) {
                            self.interrupt();
                            continue;
                        }
                    } else if !self.host.wait_busy_until(Some(until)) {
                        return Advance::Reached;
                    }
                }
                self.finish_active();
                continue;
            }
            if self.bkops.urgent {
                self.bkops.urgent = false;
                self.run_urgent_bkops();
                continue;
            }
            if let Some(cur) = &self.cur {
                if cur.ready_at > until {
                    self.host.idle_until(until);
                    return Advance::Reached;
                }
                let ready = cur.ready_at;
                self.host.idle_until(ready);
                let cur = self.cur.take().expect("checked");
                let start = self.host.now();
                let special = cur.work.is_special();
                self.start(cur.work);
                if self.cfg.pipeline && !special && self.active.is_some() {
                    self.fetch(start);
                }
                continue;
            }
            let now = self.host.now();
            if now > until {
                return Advance::Reached;
            }
            if self.fetch(now) {
                continue;
            }
            if let Some(t) = self.sched.next_event(now) {
                if t <= until {
                    self.host.idle_until(t.max(now));
                    continue;
                }
                self.host.idle_until(until);
                return Advance::Reached;
            }
            if !self.sched.is_empty() {
                // Requests the scheduler holds back until a completion; nothing is in
                // flight, so fetch them anyway (a scheduler must not stall an idle queue).
                log::warn!(
                    "mmcblk: scheduler holds {} requests on an idle queue",
                    self.sched.len()
                );
                if let Some(req) = self.sched.dispatch(Nanos::MAX) {
                    self.prepare_fetched(req, now);
                    continue;
                }
            }
            let idle_since = *self.idle_since.get_or_insert(now);
            if let Some(t) = self.bkops_check_due(idle_since) {
                if t <= until {
                    self.host.idle_until(t);
                    self.idle_bkops();
                    continue;
                }
            }
            if until == Nanos::MAX {
                return Advance::Idle;
            }
            self.host.idle_until(until);
            return Advance::Reached;
        }
    }

    /// The card time at which [`MmcBlk::advance`] would next have something to do on its
    /// own, without a new request: the end of the card's busy, a prepared request being
    /// ready, an HPI falling due, the scheduler's timer, the idle BKOPS check. `None` when
    /// only a new request can wake it. A caller running in real time advances to now,
    /// then sleeps until this.
    pub fn next_event(&self) -> Option<Nanos> {
        let now = self.host.now();
        if !self.completions.is_empty() || self.bkops.urgent {
            return Some(now);
        }
        if self.active.is_some() {
            let busy_end = self.host.busy_until().unwrap_or(now);
            let hpi = self.hpi_due(Nanos::MAX).unwrap_or(Nanos::MAX);
            return Some(busy_end.min(hpi).max(now));
        }
        if let Some(cur) = &self.cur {
            return Some(cur.ready_at.max(now));
        }
        if !self.sched.is_empty() {
            return Some(self.sched.next_event(now).unwrap_or(now).max(now));
        }
        let idle_since = self.idle_since.unwrap_or(now);
        self.bkops_check_due(idle_since).map(|t| t.max(now))
    }

    /// `blk_fetch_request` at card time `at`, the packing decision, and preparation.
    fn fetch(&mut self, at: Nanos) -> bool {
        let Some(req) = self.sched.dispatch(at) else {
            self.wpc.on_fetch(None);
            return false;
        };
        self.prepare_fetched(req, at);
        true
    }

    fn note_fetched(&mut self, req: &BlkRequest) {
        match req.op {
            BlkOp::Read => {
                *self
                    .stats
                    .writes_before_read
                    .entry(self.writes_since_read)
                    .or_default() += 1;
                self.writes_since_read = 0;
            }
            BlkOp::Write => self.writes_since_read += 1,
            _ => {}
        }
    }

    fn prepare_fetched(&mut self, req: BlkRequest, at: Nanos) {
        self.wpc.on_fetch(Some(&req));
        self.note_fetched(&req);
        let work = match req.op {
            BlkOp::Read | BlkOp::Write => {
                let sched = RefCell::new(&mut self.sched);
                let list = prep_packed_list(
                    req,
                    &self.limits,
                    &mut self.wpc,
                    &mut || sched.borrow_mut().dispatch(at),
                    &mut |r| sched.borrow_mut().requeue(r),
                );
                self.record_packing(&list);
                for r in &list.requests[1..] {
                    self.note_fetched(r);
                }
                if list.requests.len() > 1 {
                    Work::Packed {
                        reqs: list.requests,
                        retries: 0,
                    }
                } else {
                    Work::Rw {
                        req,
                        done: 0,
                        retries: 0,
                    }
                }
            }
            _ => Work::Special(req),
        };
        self.hpi
            .fetched(self.sched.has_queued_read(), self.sched.is_empty());
        let entries = match &work {
            Work::Packed { reqs, .. } => reqs.len() as u64,
            _ => 1,
        };
        self.cur = Some(Prepared {
            work,
            fetched_at: at,
            ready_at: at.saturating_add(self.cfg.prepare_ns.saturating_mul(entries)),
        });
    }

    /// Seed 000 counted every list build that got past the checks that disable packing.
    fn record_packing(&mut self, list: &PackedList) {
        if matches!(list.stop, StopReason::NotEnabled | StopReason::NotPackable) {
            return;
        }
        if list.requests[0].op.is_read() {
            self.stats.read_packing.record(list);
        } else {
            self.stats.write_packing.record(list);
        }
    }

    /// Start prepared work on the card.
    fn start(&mut self, work: Work) {
        match work {
            Work::Special(req) => self.issue_special(req),
            Work::Rw { .. } => self.start_rw(work),
            Work::Packed { .. } => self.start_packed(work),
        }
    }
}
