//! Busy operations: the card is in prg (or dis) from the moment an operation starts until
//! the card-time instant its cost ends; HPI or a power loss can end it early. The busy
//! state itself is the busy part (`parts/busy.rs`); this is what the card does when an
//! operation starts, completes, is interrupted or is cut, and the cache write-back.
//!
//! Programming keeps the written data in the card's write buffer until the operation ends,
//! so an interrupted write lands exactly the prefix the elapsed time allowed, rounded down
//! to the granule its reliability mode promises to be atomic.

use super::parts::busy::{OpKind, ProgramOp};
use super::{r1, Card, CardState};
use crate::timing::{Cost, Nanos, Program, ProgramTarget};

impl Card {
    /// Start a busy operation of `busy_ns` now. The card enters prg unless it is in a
    /// state that stays (slp, stby after awake, dis).
    pub(super) fn begin_op(&mut self, busy_ns: Nanos, kind: OpKind) {
        self.busy.begin(self.now, busy_ns, kind);
        if matches!(
            self.state,
            CardState::Tran | CardState::Rcv | CardState::Data
        ) {
            self.state = CardState::Prg;
        }
        self.settle();
    }

    /// Complete the current operation if card time has reached its end.
    pub(super) fn settle(&mut self) {
        let Some(op) = self.busy.take_finished(self.now) else {
            return;
        };
        match op.kind {
            OpKind::Program(p) => {
                let total = p.total_sectors();
                self.commit_program(&p, total);
            }
            OpKind::Erase(e) => self.apply_erase(&e),
            OpKind::Bkops { overhead_ns } => {
                let elapsed = (op.end - op.start).saturating_sub(overhead_ns);
                self.work_off_background(op.start + overhead_ns, elapsed);
            }
            OpKind::Flush | OpKind::Sanitize | OpKind::Busy | OpKind::HpiExit => {}
        }
        self.state = match self.state {
            CardState::Prg => CardState::Tran,
            CardState::Dis => CardState::Stby,
            other => other,
        };
    }

    /// Program the first `sectors` sectors of `p` (in segment order) from the write buffer;
    /// a segment cut short lands only whole granules.
    pub(super) fn commit_program(&mut self, p: &ProgramOp, sectors: u64) {
        self.commit_segments(p, sectors, false);
    }

    fn commit_segments(&mut self, p: &ProgramOp, sectors: u64, medium_only: bool) {
        let mut left = sectors;
        let mut programmed_medium = false;
        for seg in p.segments.as_slice() {
            if left == 0 {
                break;
            }
            let mut n = seg.count.min(left);
            left -= n;
            if n < seg.count {
                n -= n % seg.granule.max(1);
            }
            if n == 0 {
                break;
            }
            if medium_only && seg.target != ProgramTarget::Medium {
                continue;
            }
            // Without a data-keeping store the write buffer holds no sector data.
            let data = match self
                .data
                .write_buf()
                .get(seg.buf_offset..seg.buf_offset + n as usize * 512)
            {
                Some(data) => data,
                None if !self.store.keeps_data() => &[],
                None => {
                    log::error!("write buffer holds less than the {n} sectors to program");
                    self.regs.raise(r1::ERROR);
                    return;
                }
            };
            let result = match seg.target {
                ProgramTarget::Medium => {
                    self.cache.invalidate(seg.sector, n);
                    programmed_medium = true;
                    self.store.write_at(seg.sector * 512, data)
                }
                ProgramTarget::Cache => self
                    .cache
                    .insert(seg.sector, n, data, self.store.as_mut())
                    .map(|destaged| self.stats.sectors_destaged += destaged),
            };
            if let Err(e) = result {
                log::error!(
                    "programming {n} sectors at image sector {}: {e}",
                    seg.sector
                );
                self.regs.raise(r1::ERROR);
                return;
            }
            self.stats.sectors_written += n;
        }
        // Programming that ends (or an HPI stops) with data on the medium: the host is
        // told it is durable (reliable write, forced programming, cache off), so it must
        // survive the host losing power too (docs/image-format.md, Durability). At a power
        // cut the card cannot promise anything more, so nothing is synced there.
        if programmed_medium && !medium_only {
            if let Err(e) = self.store.sync_program() {
                log::error!("syncing the image: {e}");
                self.regs.raise(r1::ERROR);
            }
        }
    }

    /// The cost of programming `p` now, including write-backs a full cache forces.
    pub(super) fn program_cost(&mut self, p: &ProgramOp, packed: bool) -> Cost {
        let mut cost = Cost::ZERO;
        let mut evictions = 0;
        for seg in p.segments.as_slice() {
            if seg.target == ProgramTarget::Cache {
                evictions += self.cache.evictions_needed(seg.sector, seg.count);
            }
            cost += self.timing.program(
                self.now,
                &Program {
                    sector: seg.sector,
                    count: u32::try_from(seg.count).unwrap_or(u32::MAX),
                    target: seg.target,
                    reliable: seg.reliable,
                    packed_entry: packed,
                },
            );
        }
        if evictions > 0 {
            let first = p.segments.as_slice().first().map_or(0, |s| s.sector);
            cost += self.timing.destage(
                self.now,
                first,
                u32::try_from(evictions).unwrap_or(u32::MAX),
            );
        }
        cost
    }

    /// Start programming `p`: the card goes busy for its cost.
    pub(super) fn start_program(&mut self, p: ProgramOp, packed: bool, extra: Cost) {
        let cost = self.program_cost(&p, packed) + extra;
        self.busy.add_background(cost.background_ns);
        self.begin_op(cost.busy_ns, OpKind::Program(p));
    }

    /// High Priority Interrupt: stop the current interruptible operation as soon as safely
    /// possible. Returns false if there was nothing HPI can interrupt (the card simply
    /// finishes what it is doing).
    pub(super) fn high_priority_interrupt(&mut self) -> bool {
        let Some(op) = self.busy.take_interruptible() else {
            return false;
        };
        let now = self.now;
        match &op.kind {
            OpKind::Program(p) => {
                let done = p.sectors_landed(op.sectors_done(p, now));
                self.commit_program(p, done);
                self.regs.set_correctly_programmed(done);
                log::debug!("HPI: {done} of {} sectors programmed", p.total_sectors());
            }
            OpKind::Erase(e) => {
                log::debug!("HPI: erase of {} sectors abandoned", e.erase.count);
            }
            OpKind::Bkops { overhead_ns } => {
                let work_start = op.start + overhead_ns;
                self.work_off_background(work_start, now.saturating_sub(work_start));
            }
            _ => {}
        }
        self.stats.hpi_interrupts += 1;
        let exit = self.timing.hpi_exit(now);
        self.begin_op(exit, OpKind::HpiExit);
        true
    }

    /// BKOPS ran for `elapsed` from `start`.
    fn work_off_background(&mut self, start: Nanos, elapsed: Nanos) {
        self.stats.bkops_ns = self.stats.bkops_ns.saturating_add(elapsed);
        let done = self.timing.background_work(start, elapsed);
        let own = if self.timing.background_debt().is_some() {
            // The model worked off its own debt; time left over goes to work added from
            // outside the model.
            elapsed.saturating_sub(done)
        } else {
            done
        };
        self.busy.work_off(own);
    }

    /// Outstanding background work: the timing model's own debt, if it keeps one, plus
    /// what the card accumulated.
    pub(super) fn outstanding_background(&self) -> Nanos {
        self.busy.outstanding(self.timing.background_debt())
    }

    /// Power is cut at card time `at`: operations that completed by then are in; a write
    /// being programmed lands the prefix it reached (rounded to its atomic granule); an
    /// erase in progress does not happen; the volatile cache is lost.
    pub(super) fn cut_power(&mut self, at: Nanos) {
        self.advance(at);
        if let Some(op) = self.busy.take() {
            if let OpKind::Program(p) = &op.kind {
                // Only what reached the medium survives; cached segments die with the cache.
                let done = op.sectors_done(p, self.now);
                self.commit_segments(p, done, true);
            }
        }
        if !self.cache.is_empty() {
            log::info!(
                "power loss: {} cached sectors were not durable and are lost",
                self.cache.len()
            );
        }
        self.cache.drop_all();
    }

    /// Write every cached sector back to the medium now (FLUSH_CACHE, cache off, sleep,
    /// power-off notification, CMD0). Returns the cost of doing so.
    pub(super) fn flush_cache(&mut self) -> Cost {
        let dirty = self.cache.len() as u64;
        let first = self.cache.dirty_runs().first().map_or(0, |r| r.0);
        match self.cache.flush(self.store.as_mut()) {
            Ok(n) => {
                self.stats.sectors_destaged += n;
                if n > 0 {
                    self.stats.flushes += 1;
                }
            }
            Err(e) => {
                log::error!("cache flush failed: {e}");
                self.regs.raise(r1::ERROR);
            }
        }
        if let Err(e) = self.store.sync() {
            log::error!("syncing the image: {e}");
            self.regs.raise(r1::ERROR);
        }
        let mut cost = self.timing.flush(self.now);
        if dirty > 0 {
            cost += self
                .timing
                .destage(self.now, first, u32::try_from(dirty).unwrap_or(u32::MAX));
        }
        cost
    }

    /// BKOPS_STATUS level of the outstanding background work.
    pub(super) fn bkops_level(&self) -> u8 {
        if self.model.ext_csd.bkops_support & 1 == 0 {
            return 0;
        }
        self.timing
            .bkops_level(self.outstanding_background())
            .min(3)
    }
}
