//! Pacing shared by the frontends: card time against the wall clock, completions held
//! until their card time has come, and how early the pacing timer fires.
//!
//! With `--timing realtime` card time follows the wall clock ([`Clock`]) from the first
//! request of a session. Each completion — used ring entry and interrupt — waits in
//! [`Completions`] until the wall clock reaches its card time: a timerfd on the backend's
//! epoll loop fires shortly before and the loop spins out the last microseconds, so it
//! never sleeps in a handler.
//!
//! A completion is signalled by spinning out the last stretch before it is due; the timer
//! only has to wake the event loop, and the loop finish the work the wake-up brings, before
//! that stretch begins. How long it must be depends on how late the timer wakes us, which
//! on a virtualised or loaded host varies from tens of microseconds to several hundred,
//! and on that work (running the card to the completion's instant: a 128 KiB write's data
//! landing in the cache takes tens of microseconds). [`SpinMargin`] keeps how long after
//! its armed instant each recent wake-up was ready to signal, and sets the margin to cover
//! nearly all of them, between a floor and a ceiling the user chose: more margin costs CPU
//! (spinning), less lets the wake-up latency and the work show in the completions.

use std::collections::VecDeque;
use std::io;
use std::os::fd::AsRawFd;
use std::time::{Duration, Instant};

use vhost_user_backend::{VringRwLock, VringT};
use virtio_queue::QueueT;
use vm_memory::GuestMemory;
use vmm_sys_util::timerfd::TimerFd;

use emmc_card::timing::Nanos;
use emmc_host::histogram::Histogram;

/// The timer fires at least this early and the loop spins the rest: epoll wake-up
/// latency on a loaded machine is tens of microseconds.
pub const DEFAULT_SPIN: Duration = Duration::from_micros(150);
/// The most the margin grows to when wake-ups come late ([`SpinMargin`]).
pub const DEFAULT_SPIN_MAX: Duration = Duration::from_millis(1);

/// How completions relate to wall time.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Pacing {
    /// A completion is signalled when its card time has elapsed, times `scale`.
    Realtime { scale: f64 },
    /// Completions are signalled as soon as the card model has computed them.
    Off,
}

impl Pacing {
    pub fn is_realtime(&self) -> bool {
        matches!(self, Pacing::Realtime { .. })
    }
}

/// Card time ↔ wall time: `card0` at `wall0`, `scale` wall nanoseconds per card
/// nanosecond.
#[derive(Debug, Clone, Copy)]
pub struct Clock {
    pub wall0: Instant,
    pub card0: Nanos,
    pub scale: f64,
}

/// `CLOCK_MONOTONIC` now, in nanoseconds: the clock clients stamp their requests on.
pub fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec; CLOCK_MONOTONIC always exists.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

impl Clock {
    /// A clock on which card time `card0` is now.
    pub fn start(card0: Nanos, pacing: Pacing) -> Clock {
        Clock {
            wall0: Instant::now(),
            card0,
            scale: match pacing {
                Pacing::Realtime { scale } => scale,
                Pacing::Off => 1.0,
            },
        }
    }

    /// The clock's start on `CLOCK_MONOTONIC`, in nanoseconds: the clock a client reads,
    /// so that its own timestamps can be set beside the card times of a trace
    /// (`blkbench --stamps-out`, `ci/request-path.py`).
    pub fn wall0_monotonic_ns(&self) -> u64 {
        // `Instant` is CLOCK_MONOTONIC on Linux; the two readings below are a few tens of
        // nanoseconds apart.
        let now = Instant::now();
        let mono = monotonic_ns();
        mono.saturating_sub(now.saturating_duration_since(self.wall0).as_nanos() as u64)
    }

    pub fn card_at(&self, wall: Instant) -> Nanos {
        let elapsed = wall.saturating_duration_since(self.wall0).as_nanos() as f64;
        self.card0.saturating_add((elapsed / self.scale) as Nanos)
    }

    /// The wall instant of card time `card` (far-future card times saturate at about a
    /// century from the clock's start rather than overflowing `Instant`).
    pub fn wall_at(&self, card: Nanos) -> Instant {
        const FAR: Duration = Duration::from_secs(100 * 365 * 24 * 3600);
        let ns = (card.saturating_sub(self.card0) as f64 * self.scale) as u64;
        let d = Duration::from_nanos(ns).min(FAR);
        self.wall0.checked_add(d).unwrap_or(self.wall0 + FAR)
    }
}

/// Pacing bookkeeping: how late completions were signalled past their due time.
#[derive(Debug, Clone, Default)]
pub struct PacingStats {
    pub completed: u64,
    /// Lateness of each completion past its due time.
    pub late: Histogram,
    /// From each completion's due time to the return of the system call that signalled
    /// it (the eventfd write), or to the check that found the driver did not want a
    /// signal: the daemon's whole share of a completion's way to a sleeping client.
    pub signalled: Histogram,
    /// How late the pacing timer woke the loop past the instant it was armed for.
    pub wake_late: Histogram,
    /// The timer's margin at the end of the session.
    pub margin: Duration,
}

impl PacingStats {
    /// One line for the log.
    pub fn summary(&self) -> String {
        let us = |ns: u64| ns as f64 / 1e3;
        format!(
            "{} completions, lateness p50 {:.1} µs, p99 {:.1} µs, max {:.1} µs; \
             signalled p50 {:.1} µs, p99 {:.1} µs after due; \
             timer wake-ups late p50 {:.1} µs, p99 {:.1} µs; spin margin {:.0} µs",
            self.completed,
            us(self.late.quantile(0.5)),
            us(self.late.quantile(0.99)),
            us(self.late.max()),
            us(self.signalled.quantile(0.5)),
            us(self.signalled.quantile(0.99)),
            us(self.wake_late.quantile(0.5)),
            us(self.wake_late.quantile(0.99)),
            self.margin.as_secs_f64() * 1e6,
        )
    }
}

/// One used-ring entry waiting for its time.
#[derive(Debug, Clone, Copy)]
pub struct Pending {
    /// Index of the queue in the slice handed to [`Completions::complete_due`].
    pub queue: usize,
    pub head: u16,
    pub len: u32,
    pub due: Instant,
    /// Card time the model computed (for tests and statistics).
    pub done_at: Nanos,
}

/// Completions in due order, the pacing timer and its margin.
pub struct Completions {
    pending: VecDeque<Pending>,
    timer: TimerFd,
    stats: PacingStats,
    /// How early the timer fires before a completion is due; the rest is spun.
    spin: SpinMargin,
    /// When the armed timer should fire.
    armed: Option<Instant>,
    /// The instant the timer that woke the loop was armed for, until the loop is ready
    /// to signal (the margin must cover the wake-up and the work done on waking).
    woken: Option<Instant>,
    /// Due times of the completions on the used ring not yet signalled (kept between
    /// calls only for its allocation).
    dues: Vec<Instant>,
}

impl Completions {
    pub fn new() -> io::Result<Completions> {
        let timer = TimerFd::new()?;
        let timer_fd = timer.as_raw_fd();
        // Non-blocking: reading the expiry count after a spurious wake-up must not stall
        // the event loop.
        // SAFETY: fcntl on a descriptor this function owns (the timer), with F_GETFL and
        // F_SETFL only; the return values are checked.
        unsafe {
            let flags = libc::fcntl(timer_fd, libc::F_GETFL);
            if flags < 0 || libc::fcntl(timer_fd, libc::F_SETFL, flags | libc::O_NONBLOCK) < 0 {
                return Err(io::Error::last_os_error());
            }
        }
        Ok(Completions {
            pending: VecDeque::new(),
            timer,
            stats: PacingStats::default(),
            spin: SpinMargin::new(DEFAULT_SPIN, DEFAULT_SPIN_MAX),
            armed: None,
            woken: None,
            dues: Vec::new(),
        })
    }

    /// The pacing timer's fd, to register on the daemon's epoll loop.
    pub fn timer_fd(&self) -> i32 {
        self.timer.as_raw_fd()
    }

    pub fn set_spin(&mut self, spin: SpinMargin) {
        self.spin = spin;
    }

    /// The timer's current margin.
    pub fn spin(&self) -> Duration {
        self.spin.get()
    }

    pub fn is_empty(&self) -> bool {
        self.pending.is_empty()
    }

    /// When the first queued completion is due.
    pub fn first_due(&self) -> Option<Instant> {
        self.pending.front().map(|p| p.due)
    }

    /// Queue a completion, keeping due order (equal due times keep their order).
    pub fn push(&mut self, p: Pending) {
        let at = self.pending.partition_point(|q| q.due <= p.due);
        self.pending.insert(at, p);
    }

    /// The statistics so far, with the current margin.
    pub fn stats(&self) -> PacingStats {
        PacingStats {
            margin: self.spin.get(),
            ..self.stats.clone()
        }
    }

    /// Log the session's statistics and start afresh: pending completions are dropped
    /// (their frontend has gone) and the timer is disarmed.
    pub fn end_session(&mut self) {
        self.log_summary();
        self.stats = PacingStats::default();
        self.pending.clear();
        self.armed = None;
        self.woken = None;
        let _ = self.timer.clear();
    }

    /// The session's statistics in the log.
    pub fn log_summary(&mut self) {
        self.stats.margin = self.spin.get();
        if self.stats.completed > 0 {
            log::info!("session: {}", self.stats.summary());
        }
    }

    /// The timer fired: consume its expiry count and record how late it woke us. The
    /// margin learns at the next [`Completions::complete_due`], once the work done on
    /// waking (running the card to its event: landing a write's data, destaging the
    /// cache) is behind us too.
    pub fn timer_fired(&mut self) {
        // A spurious wake-up reads EAGAIN.
        let expired = self.timer.wait().is_ok_and(|n| n > 0);
        // Only a real expiry says how late the timer woke us (after a spurious wake-up,
        // or one whose timer was re-armed meanwhile, there is none), and only an expiry
        // disarms it: after a spurious wake-up it stays armed, and is cleared when
        // nothing is left to wait for.
        if !expired {
            return;
        }
        if let Some(armed) = self.armed.take() {
            let late = Instant::now().saturating_duration_since(armed);
            self.stats.wake_late.record(late.as_nanos() as u64);
            self.woken = Some(armed);
        }
    }

    /// The loop is ready to signal: teach the margin how long after the armed instant
    /// that was, if a timer expiry woke it.
    fn ready(&mut self) {
        if let Some(armed) = self.woken.take() {
            self.spin
                .observe(Instant::now().saturating_duration_since(armed));
        }
    }

    /// Signal every completion whose time has come (spinning out the last microseconds),
    /// then arm the timer for the next completion or `wake`, whichever is first.
    pub fn complete_due(
        &mut self,
        vrings: &[VringRwLock],
        event_idx: bool,
        wake: Option<Instant>,
    ) -> io::Result<()> {
        self.signal_due_watching(vrings, event_idx, &mut || {})?;
        self.arm(wake)
    }

    /// Signal every completion whose time has come (spinning out the last
    /// microseconds, calling `watch` on every turn to note requests made available
    /// meanwhile: [`ArrivalWatch`]), and leave the timer as it is: for a loop that goes
    /// on to run the card and then calls [`Completions::arm`].
    pub fn signal_due_watching(
        &mut self,
        vrings: &[VringRwLock],
        event_idx: bool,
        watch: &mut dyn FnMut(),
    ) -> io::Result<()> {
        // Bit q: queue q got used entries not yet notified; `dues`, their due times.
        let mut used = 0u64;
        let mut dues = std::mem::take(&mut self.dues);
        while let Some(p) = self.pending.front().copied() {
            let mut now = Instant::now();
            if p.due > now + self.spin.get() {
                break;
            }
            // What is done is notified before the wait for a later instant: a driver
            // that sleeps until it is notified would otherwise learn of a completion
            // only with the next one in the margin (at QD2 and more, a whole request
            // later).
            if now < p.due && used != 0 {
                notify(vrings, event_idx, used)?;
                self.record_signalled(&mut dues);
                used = 0;
            }
            self.ready();
            while now < p.due {
                watch();
                std::hint::spin_loop();
                now = Instant::now();
            }
            let late = now.saturating_duration_since(p.due).as_nanos() as u64;
            self.stats.late.record(late);
            self.stats.completed += 1;
            self.pending.pop_front();
            let Some(vring) = vrings.get(p.queue) else {
                log::error!("completion for queue {} that does not exist", p.queue);
                continue;
            };
            vring.add_used(p.head, p.len).map_err(io::Error::other)?;
            used |= 1u64.checked_shl(p.queue as u32).unwrap_or(0);
            dues.push(p.due);
            log::trace!(
                "completed {} on queue {} (card time {} ns)",
                p.head,
                p.queue,
                p.done_at
            );
        }
        notify(vrings, event_idx, used)?;
        self.record_signalled(&mut dues);
        self.dues = dues;
        // Woken for the card's own event, or early: the time the work took counts too.
        self.ready();
        Ok(())
    }

    /// The completions due at `dues` have just been signalled: how long after its due
    /// time each one was.
    fn record_signalled(&mut self, dues: &mut Vec<Instant>) {
        let now = Instant::now();
        for due in dues.drain(..) {
            let after = now.saturating_duration_since(due).as_nanos() as u64;
            self.stats.signalled.record(after);
        }
    }

    /// Arm the timer for the next completion or `wake`, whichever is first (the margin
    /// early); disarm it when there is neither.
    pub fn arm(&mut self, wake: Option<Instant>) -> io::Result<()> {
        let next = match (self.pending.front().map(|p| p.due), wake) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        match next {
            Some(t) => {
                let now = Instant::now();
                let wait = t
                    .saturating_duration_since(now)
                    .saturating_sub(self.spin.get())
                    .max(Duration::from_nanos(1));
                let at = now + wait;
                // A timer armed a little earlier (by at most an eighth of the wait) is
                // kept: it wakes the loop early, which arms it again. A far event that
                // moves on with every request (the card's idle work) then costs a
                // wake-up now and then instead of a system call per completion.
                if self
                    .armed
                    .is_some_and(|a| a <= at && at.duration_since(a) <= wait / 8)
                {
                    return Ok(());
                }
                self.timer.reset(wait, None)?;
                self.armed = Some(at);
            }
            // Disarming is a system call: skip it when nothing is armed, as on every
            // completion without pacing.
            None if self.armed.is_some() => {
                self.timer.clear()?;
                self.armed = None;
            }
            None => {}
        }
        Ok(())
    }
}

/// Signal the queues whose bit is set in `used` (those that got used entries), as the
/// driver asked: with `event_idx`, only when its used event has been passed.
fn notify(vrings: &[VringRwLock], event_idx: bool, used: u64) -> io::Result<()> {
    for (_, vring) in vrings
        .iter()
        .enumerate()
        .filter(|&(q, _)| used & 1u64.checked_shl(q as u32).unwrap_or(0) != 0)
    {
        if !event_idx || vring.needs_notification().map_err(io::Error::other)? {
            vring.signal_used_queue()?;
        }
    }
    Ok(())
}

/// Whether the driver has made chains available on `vring` that the device has not
/// taken yet. An avail index further ahead than the ring holds is a corrupt ring, not
/// work: taking chains from it fails (and is logged once per notification), so the poll
/// loops must not see it as work, or they spin on it — and log — until the index changes.
pub fn ring_has_avail<M: GuestMemory>(vring: &VringRwLock, mem: &M) -> bool {
    avail_ahead(vring, mem).is_some()
}

/// The device's next avail position and how many chains the driver has made available
/// past it; none when the queue is not ready, nothing is available, or the index is
/// corrupt (see [`ring_has_avail`]).
fn avail_ahead<M: GuestMemory>(vring: &VringRwLock, mem: &M) -> Option<(u16, u16)> {
    let guard = vring.get_ref();
    let queue = guard.get_queue();
    if !queue.ready() {
        return None;
    }
    let idx = queue
        .avail_idx(mem, std::sync::atomic::Ordering::Acquire)
        .ok()?;
    let next = queue.next_avail();
    let ahead = idx.0.wrapping_sub(next);
    (ahead != 0 && ahead <= queue.size()).then_some((next, ahead))
}

/// When the driver made requests available while the device thread was spinning (toward
/// a completion's instant or the card's next event) and so not taking them: each
/// request's arrival, for the card model and the trace, is the first look that saw it,
/// not the moment the spin ended and it was taken.
///
/// Only looks: taking requests during a spin would keep a busy device thread in one
/// call for as long as the driver keeps the queue full (docs/performance.md, issue 16's
/// eighth session). Without it, at QD8 with a polling client, the trace put requests
/// 1.0 ms (p50) and 1.8 ms (p99) after the completion that freed their slot; with it,
/// 2 µs (p50) (docs/performance.md, "Arrivals seen during the spin").
#[derive(Debug, Default)]
pub struct ArrivalWatch {
    /// The device's next avail position when the first look found requests.
    base: Option<u16>,
    /// (requests available past `base`, first seen), growing counts.
    seen: Vec<(u16, Instant)>,
}

impl ArrivalWatch {
    /// Look at `vring`'s avail index; note when more requests are available than the
    /// last look found.
    pub fn look<M: GuestMemory>(&mut self, vring: &VringRwLock, mem: &M) {
        // Nothing, or a corrupt index (taking it will say so): nothing to note.
        let Some((next, ahead)) = avail_ahead(vring, mem) else {
            return;
        };
        if self.base != Some(next) {
            self.base = Some(next);
            self.seen.clear();
        }
        if self.seen.last().is_none_or(|&(n, _)| ahead > n) {
            self.seen.push((ahead, Instant::now()));
        }
    }

    /// The avail position the requests seen so far count from (none: nothing seen).
    pub fn base(&self) -> Option<u16> {
        self.base
    }

    /// When the request at avail position `next + i` was first seen, `next` being the
    /// device's position before it takes this round (none: it was not seen by a look).
    pub fn arrival(&self, next: Option<u16>, i: usize) -> Option<Instant> {
        if next.is_none() || self.base != next {
            return None;
        }
        self.seen
            .iter()
            .find(|&&(n, _)| usize::from(n) > i)
            .map(|&(_, at)| at)
    }

    /// The round has been taken: what was seen is used.
    pub fn clear(&mut self) {
        self.base = None;
        self.seen.clear();
    }
}

/// What one look at the rings found, for [`poll_window`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Polled {
    /// Stop polling: there is a completion to signal.
    Done,
    /// Nothing new.
    Nothing,
    /// Requests found and taken: the window starts again.
    Took,
}

/// The poll window of both transports: with nothing pending, spin for up to `window`
/// looking for the next request (`look` checks the rings and takes what it finds); each
/// find restarts the window, a pending completion ends it.
pub fn poll_window(window: Duration, look: impl FnMut() -> io::Result<Polled>) -> io::Result<()> {
    poll_window_on(Instant::now, window, look)
}

/// [`poll_window`] on the clock `now` (the tests give it one that they step).
fn poll_window_on(
    mut now: impl FnMut() -> Instant,
    window: Duration,
    mut look: impl FnMut() -> io::Result<Polled>,
) -> io::Result<()> {
    if window.is_zero() {
        return Ok(());
    }
    let mut deadline = now() + window;
    while now() < deadline {
        match look()? {
            Polled::Done => break,
            Polled::Took => deadline = now() + window,
            Polled::Nothing => std::hint::spin_loop(),
        }
    }
    Ok(())
}

/// Wake-ups remembered.
const WINDOW: usize = 128;
/// The margin is recomputed after this many new wake-ups.
const REFRESH: u32 = 16;
/// The margin covers this share of the remembered wake-ups…
const COVER: f64 = 0.99;
/// …plus this much for what the observations miss (the client's own wake-up is not ours).
const HEADROOM: Duration = Duration::from_micros(20);

/// The pacing timer's margin: at least `min`, at most `max`, in between what the recent
/// wake-ups needed.
#[derive(Debug, Clone)]
pub struct SpinMargin {
    min: Duration,
    max: Duration,
    /// Lateness of the latest wake-ups, a ring of nanoseconds.
    recent: Vec<u64>,
    next: usize,
    since_refresh: u32,
    current: Duration,
}

impl SpinMargin {
    /// A margin that adapts between `min` and `max` (`max` below `min` counts as `min`:
    /// a fixed margin).
    pub fn new(min: Duration, max: Duration) -> SpinMargin {
        SpinMargin {
            min,
            max: max.max(min),
            recent: Vec::with_capacity(WINDOW),
            next: 0,
            since_refresh: 0,
            current: min,
        }
    }

    /// A margin that never changes.
    pub fn fixed(margin: Duration) -> SpinMargin {
        SpinMargin::new(margin, margin)
    }

    /// How early the timer should fire now.
    pub fn get(&self) -> Duration {
        self.current
    }

    pub fn bounds(&self) -> (Duration, Duration) {
        (self.min, self.max)
    }

    /// The loop was ready to signal `late` after the instant its timer was armed for:
    /// the timer's own lateness plus the work done on waking. The margin has to cover
    /// both, or a completion whose wake-up brings work (a 128 KiB write's data landing
    /// in the cache) is signalled late by that work.
    pub fn observe(&mut self, late: Duration) {
        if self.min == self.max {
            return;
        }
        let ns = u64::try_from(late.as_nanos()).unwrap_or(u64::MAX);
        if self.recent.len() < WINDOW {
            self.recent.push(ns);
        } else {
            self.recent[self.next] = ns;
        }
        self.next = (self.next + 1) % WINDOW;
        self.since_refresh += 1;
        // Until the window holds `REFRESH` wake-ups, each one refreshes the margin. A
        // daemon's first completions would otherwise all be paced with the starting
        // margin: a paced 128 KiB write brings 100–500 µs of work on waking, and the
        // first 12 of a run came 37–398 µs late, half of all the late ones in 6 s
        // (docs/performance.md, issue 16's seventeenth session).
        if self.since_refresh >= REFRESH || self.recent.len() < REFRESH as usize {
            self.since_refresh = 0;
            self.refresh();
        }
    }

    fn refresh(&mut self) {
        let mut sorted = self.recent.clone();
        sorted.sort_unstable();
        let rank = ((sorted.len() as f64 * COVER).ceil() as usize).clamp(1, sorted.len());
        let covered = Duration::from_nanos(sorted[rank - 1]) + HEADROOM;
        self.current = covered.clamp(self.min, self.max);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::Cell;

    /// A clock that moves 1 ms on each reading, from `start`, so that the window's
    /// arithmetic is tested without depending on how the machine schedules the test.
    fn stepping_clock(start: Instant) -> (impl FnMut() -> Instant, std::rc::Rc<Cell<u32>>) {
        let ticks = std::rc::Rc::new(Cell::new(0u32));
        let t = std::rc::Rc::clone(&ticks);
        let clock = move || {
            t.set(t.get() + 1);
            start + Duration::from_millis(u64::from(t.get()))
        };
        (clock, ticks)
    }

    #[test]
    fn the_poll_window_restarts_on_each_find_and_ends_at_a_completion() {
        let start = Instant::now();
        // A zero window never looks.
        poll_window_on(Instant::now, Duration::ZERO, || panic!("looked")).unwrap();
        // Nothing found: it gives up once the window has passed. The deadline is read at
        // 1 ms (21 ms), then each turn reads the clock once and looks once: the readings
        // at 2..=20 ms are before it.
        let (clock, ticks) = stepping_clock(start);
        let mut looks = 0;
        poll_window_on(clock, Duration::from_millis(20), || {
            looks += 1;
            Ok(Polled::Nothing)
        })
        .unwrap();
        assert_eq!(looks, 19);
        assert_eq!(ticks.get(), 21);
        // A find every 10 ms, three times, keeps a 15 ms window open 15 ms past the last.
        let (mut clock, ticks) = stepping_clock(start);
        let now = Cell::new(start);
        let mut finds = 0;
        let mut last = start;
        poll_window_on(
            || {
                now.set(clock());
                now.get()
            },
            Duration::from_millis(15),
            || {
                if finds < 3 && now.get() - last >= Duration::from_millis(10) {
                    finds += 1;
                    last = now.get();
                    return Ok(Polled::Took);
                }
                Ok(Polled::Nothing)
            },
        )
        .unwrap();
        assert_eq!(finds, 3);
        // Finds at the readings of 10, 20 and 30 ms; each restarts the window from the
        // next reading, the third from 31 ms to 46 ms, and the reading at 46 ms ends it.
        assert_eq!(last - start, Duration::from_millis(30));
        assert_eq!(ticks.get(), 46);
        // A completion ends it at once; an error comes back.
        let mut looks = 0;
        poll_window(Duration::from_secs(60), || {
            looks += 1;
            Ok(Polled::Done)
        })
        .unwrap();
        assert_eq!(looks, 1);
        let e = poll_window(Duration::from_secs(60), || Err(io::Error::other("x")));
        assert!(e.is_err());
    }

    /// Regression (hostile frontend, docs/robustness.md): an avail index more than a ring
    /// ahead made the poll loops spin and log until the index changed.
    #[test]
    fn a_corrupt_avail_index_is_not_work() {
        use vm_memory::{Bytes, GuestAddress, GuestMemoryAtomic, GuestMemoryMmap};
        let mem = GuestMemoryMmap::<()>::from_ranges(&[(GuestAddress(0), 0x10000)]).unwrap();
        let vring = VringRwLock::new(GuestMemoryAtomic::new(mem.clone()), 256).unwrap();
        vring.set_queue_size(256);
        vring.set_queue_info(0x1000, 0x2000, 0x3000).unwrap();
        vring.set_queue_ready(true);
        let set_idx = |idx: u16| mem.write_obj(idx, GuestAddress(0x2002)).unwrap();
        set_idx(0);
        assert!(!ring_has_avail(&vring, &mem), "nothing made available");
        set_idx(3);
        assert!(ring_has_avail(&vring, &mem), "three chains");
        set_idx(256);
        assert!(ring_has_avail(&vring, &mem), "a full ring");
        set_idx(257);
        assert!(!ring_has_avail(&vring, &mem), "more than the ring holds");
        set_idx(0x8000);
        assert!(!ring_has_avail(&vring, &mem), "far ahead");
    }

    const US: Duration = Duration::from_micros(1);

    /// Regression (issue 16): the margin covered only the timer's lateness, so a wake-up
    /// that brought work (a 128 KiB write landing in the cache) signalled its completion
    /// late by that work. Here each wake-up does 300 µs of work before it is ready.
    #[test]
    fn the_margin_grows_to_cover_the_work_a_wake_up_brings() {
        let mut c = Completions::new().unwrap();
        c.set_spin(SpinMargin::new(50 * US, 5000 * US));
        let mut woken = 0;
        for i in 0..1000u16 {
            if woken == 2 * REFRESH {
                break;
            }
            c.push(Pending {
                queue: 0,
                head: i,
                len: 1,
                due: Instant::now() + c.spin() + 2000 * US,
                done_at: 0,
            });
            c.complete_due(&[], false, None).unwrap();
            if c.armed.is_none() {
                // This thread stalled past the timer's instant: already signalled.
                assert!(c.is_empty());
                continue;
            }
            // Wait for the timer (armed for due − margin), then work before signalling.
            let mut fd = libc::pollfd {
                fd: c.timer_fd(),
                events: libc::POLLIN,
                revents: 0,
            };
            // SAFETY: poll(2) on one valid pollfd that lives across the call.
            assert_eq!(
                unsafe { libc::poll(&mut fd, 1, 5000) },
                1,
                "the timer fired"
            );
            c.timer_fired();
            std::thread::sleep(300 * US);
            c.complete_due(&[], false, None).unwrap();
            assert!(c.is_empty(), "signalled (on no queue) at its time");
            woken += 1;
        }
        assert_eq!(woken, 2 * REFRESH);
        // Every wake-up was ready at least 300 µs after its armed instant, so the margin
        // covers that plus headroom. Before, it followed the timer's own lateness, tens
        // of microseconds on a quiet machine.
        assert!(
            c.spin() >= 320 * US,
            "the work plus headroom, not the timer alone: {:?}",
            c.spin()
        );
    }

    /// Whether the timer is armed, from the kernel.
    fn timer_armed(c: &Completions) -> bool {
        // SAFETY: an all-zero itimerspec is a valid value for timerfd_gettime to overwrite.
        let mut spec: libc::itimerspec = unsafe { std::mem::zeroed() };
        // SAFETY: timerfd_gettime on the completions' own timer fd, into a local struct.
        assert_eq!(unsafe { libc::timerfd_gettime(c.timer_fd(), &mut spec) }, 0);
        spec.it_value.tv_sec != 0 || spec.it_value.tv_nsec != 0
    }

    /// Disarming is skipped when nothing is armed (it is a system call per round
    /// without pacing), so a wake-up must not forget a timer that is still armed.
    #[test]
    fn a_spurious_wake_up_keeps_the_timer_armed_until_nothing_is_left_to_wait_for() {
        let mut c = Completions::new().unwrap();
        assert!(!timer_armed(&c));
        c.complete_due(&[], false, None).unwrap();
        assert!(!timer_armed(&c), "nothing armed, nothing to wait for");
        c.push(Pending {
            queue: 0,
            head: 0,
            len: 1,
            due: Instant::now() + Duration::from_secs(60),
            done_at: 0,
        });
        c.complete_due(&[], false, None).unwrap();
        assert!(timer_armed(&c));
        // Woken with no expiry (the read finds none): still armed.
        c.timer_fired();
        assert!(c.armed.is_some() && timer_armed(&c));
        // The completion goes (its frontend left): the next round disarms the timer.
        c.pending.clear();
        c.complete_due(&[], false, None).unwrap();
        assert!(c.armed.is_none());
        assert!(!timer_armed(&c), "disarmed once nothing is left");
    }

    /// Two completions 50 ms apart, both within the margin: the first is notified at its
    /// own instant, before the thread waits for the second (a driver that sleeps until
    /// notified must not learn of it only with the second).
    #[test]
    fn each_completion_is_notified_before_the_wait_for_the_next_one() {
        use std::os::fd::{AsRawFd, FromRawFd};
        use vm_memory::{
            Bytes, GuestAddress, GuestAddressSpace, GuestMemoryAtomic, GuestMemoryMmap,
        };
        let mem = GuestMemoryAtomic::new(
            GuestMemoryMmap::<()>::from_ranges(&[(GuestAddress(0), 0x10_0000)]).unwrap(),
        );
        let queue = crate::testing::GuestQueue::new(&mem, 0x10000);
        let call = vmm_sys_util::eventfd::EventFd::new(libc::EFD_NONBLOCK).unwrap();
        // SAFETY: dup of an eventfd this test owns; the File owns the new descriptor.
        let dup = unsafe { libc::dup(call.as_raw_fd()) };
        assert!(dup >= 0);
        // SAFETY: `dup` is a fresh descriptor that nothing else owns.
        queue
            .vring
            .set_call(Some(unsafe { std::fs::File::from_raw_fd(dup) }));
        let mut c = Completions::new().unwrap();
        c.set_spin(SpinMargin::fixed(Duration::from_secs(1)));
        let first = Instant::now() + Duration::from_millis(5);
        for (head, due) in [(0, first), (1, first + Duration::from_millis(50))] {
            c.push(Pending {
                queue: 0,
                head,
                len: 1,
                due,
                done_at: 0,
            });
        }
        // Every turn of the spin: once the first completion is on the used ring, has it
        // been notified?
        let used_idx = GuestAddress(queue.used_ring + 2);
        let (mut notified, mut turns_after_first) = (0u64, 0u32);
        let mut late_turns = 0u32;
        c.signal_due_watching(std::slice::from_ref(&queue.vring), false, &mut || {
            if let Ok(n) = call.read() {
                notified += n;
            }
            if mem.memory().read_obj::<u16>(used_idx).unwrap() >= 1 {
                turns_after_first += 1;
                if notified == 0 {
                    late_turns += 1;
                }
            }
        })
        .unwrap();
        assert!(turns_after_first > 0, "the thread spun toward the second");
        assert_eq!(
            late_turns, 0,
            "{late_turns} of {turns_after_first} turns with the first completion on the \
             used ring had no notification for it"
        );
        notified += call.read().unwrap_or(0);
        assert_eq!(notified, 2, "one notification per completion");
        // Each signal is timed from its own due instant, after the lateness that
        // preceded it: the second one was not counted from the first's.
        let stats = c.stats();
        assert_eq!(
            stats.signalled.count(),
            2,
            "each completion's signal is timed"
        );
        assert!(stats.signalled.max() >= stats.late.max());
        assert!(
            stats.signalled.max() < 40_000_000,
            "signalled {} ns after due: timed from the wrong instant",
            stats.signalled.max()
        );
    }

    /// The time left on the timer, from the kernel.
    fn timer_left(c: &Completions) -> Duration {
        // SAFETY: an all-zero itimerspec is a valid value for timerfd_gettime to overwrite.
        let mut spec: libc::itimerspec = unsafe { std::mem::zeroed() };
        // SAFETY: timerfd_gettime on the completions' own timer fd, into a local struct.
        assert_eq!(unsafe { libc::timerfd_gettime(c.timer_fd(), &mut spec) }, 0);
        Duration::new(spec.it_value.tv_sec as u64, spec.it_value.tv_nsec as u32)
    }

    /// A far event that moves on a little with every request keeps the timer armed for
    /// the first one (one early wake-up instead of a system call each time); an earlier
    /// one, or one much later, arms it again.
    #[test]
    fn a_timer_armed_a_little_early_is_kept_and_an_earlier_or_much_later_event_rearms_it() {
        let mut c = Completions::new().unwrap();
        c.set_spin(SpinMargin::fixed(Duration::ZERO));
        let t0 = Instant::now();
        c.arm(Some(t0 + Duration::from_secs(60))).unwrap();
        let first = c.armed.unwrap();
        // 1 ms later: within an eighth of the wait, kept.
        c.arm(Some(
            t0 + Duration::from_secs(60) + Duration::from_millis(1),
        ))
        .unwrap();
        assert_eq!(c.armed, Some(first));
        assert!(timer_left(&c) <= Duration::from_secs(60));
        // Earlier: armed again.
        c.arm(Some(t0 + Duration::from_secs(30))).unwrap();
        assert!(c.armed.unwrap() < first);
        assert!(timer_left(&c) <= Duration::from_secs(30));
        // Much later (more than an eighth of the wait): armed again, later.
        c.arm(Some(t0 + Duration::from_secs(50))).unwrap();
        let later = c.armed.unwrap();
        assert!(later > t0 + Duration::from_secs(49));
        assert!(timer_left(&c) > Duration::from_secs(40));
    }

    #[test]
    fn the_margin_follows_the_recent_wake_up_lateness_within_its_bounds() {
        let mut m = SpinMargin::new(50 * US, 1000 * US);
        assert_eq!(m.get(), 50 * US, "it starts at the floor");
        for _ in 0..WINDOW {
            m.observe(300 * US);
        }
        assert_eq!(m.get(), 320 * US, "lateness plus headroom");
        for _ in 0..WINDOW {
            m.observe(10 * US);
        }
        assert_eq!(
            m.get(),
            50 * US,
            "back to the floor once wake-ups are prompt"
        );
        for _ in 0..WINDOW {
            m.observe(5000 * US);
        }
        assert_eq!(m.get(), 1000 * US, "never past the ceiling");
    }

    #[test]
    fn the_first_wake_ups_set_the_margin_at_once() {
        let mut m = SpinMargin::new(50 * US, 1000 * US);
        m.observe(400 * US);
        assert_eq!(m.get(), 420 * US, "the first wake-up is covered at once");
        for _ in 1..REFRESH {
            m.observe(10 * US);
        }
        assert_eq!(
            m.get(),
            420 * US,
            "a young window keeps its worst wake-up covered"
        );
        for _ in 0..WINDOW {
            m.observe(10 * US);
        }
        assert_eq!(
            m.get(),
            50 * US,
            "and forgets it as any other once it is full"
        );
    }

    #[test]
    fn a_single_outlier_does_not_raise_the_margin_but_a_few_percent_do() {
        let mut m = SpinMargin::new(50 * US, 1000 * US);
        for i in 0..WINDOW {
            m.observe(if i == 7 { 900 * US } else { 100 * US });
        }
        assert_eq!(
            m.get(),
            120 * US,
            "one wake-up in 128 is below the 99th percentile"
        );
        for i in 0..WINDOW {
            m.observe(if i % 32 == 0 { 400 * US } else { 100 * US });
        }
        assert_eq!(m.get(), 420 * US, "four in 128 are above it");
    }

    #[test]
    fn a_fixed_margin_ignores_wake_ups() {
        let mut m = SpinMargin::fixed(150 * US);
        for _ in 0..WINDOW {
            m.observe(800 * US);
        }
        assert_eq!(m.get(), 150 * US);
        let m = SpinMargin::new(200 * US, 100 * US);
        assert_eq!(m.bounds(), (200 * US, 200 * US));
    }
}
