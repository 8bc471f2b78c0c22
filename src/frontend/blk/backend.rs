//! The vhost-user-blk device: virtqueue handling, configuration space, and pacing.
//!
//! Requests taken from the queue are submitted to the card's host driver
//! ([`CardTarget`]) at their arrival in card time. With realtime pacing card time follows
//! the wall clock (scaled by `--time-scale`): on every kick and timer wake-up the driver
//! runs up to now, so a request that arrives while the card is busy waits in the driver's
//! queue exactly as on hardware (and may be packed with others); each completion — used
//! ring entry and interrupt — is signalled when its card time has come. A timerfd on the
//! backend's epoll loop fires shortly before the next completion or the driver's next
//! event (the card's busy end, a scheduler timer, BKOPS) and the loop spins out the last
//! microseconds, so it never sleeps in a handler. Without pacing the driver runs each
//! batch to its end at once and completes it immediately.

use std::collections::VecDeque;
use std::io;
use std::os::fd::AsRawFd;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use vhost::vhost_user::message::{VhostUserProtocolFeatures, VhostUserVirtioFeatures};
use vhost_user_backend::{VhostUserBackend, VringRwLock, VringT};
use virtio_bindings::virtio_blk::*;
use virtio_bindings::virtio_config::VIRTIO_F_VERSION_1;
use virtio_bindings::virtio_ring::{VIRTIO_RING_F_EVENT_IDX, VIRTIO_RING_F_INDIRECT_DESC};
use virtio_queue::QueueOwnedT;
use virtio_queue::QueueT;
use vm_memory::{ByteValued, Bytes, GuestAddressSpace, GuestMemoryAtomic, GuestMemoryMmap};
use vmm_sys_util::epoll::EventSet;
use vmm_sys_util::event::{
    new_event_consumer_and_notifier, EventConsumer, EventFlag, EventNotifier,
};
use vmm_sys_util::timerfd::TimerFd;

use super::pacing::SpinMargin;
use super::request::{parse, ParseError, Request, RequestKind};
use super::target::{CardTarget, SIZE_MAX};
use crate::sim::histogram::Histogram;
use crate::sim::trace::TraceWriter;
use crate::sim::workload::Op;
use crate::timing::Nanos;

/// Where `serve --trace` writes.
pub type TraceSink = TraceWriter<std::io::BufWriter<std::fs::File>>;

/// One request queue, as a single-slot host has.
pub const NUM_QUEUES: usize = 1;
pub const QUEUE_SIZE: usize = 256;
/// epoll data value of the pacing timer (0..=NUM_QUEUES are the library's).
pub const TIMER_EVENT: u16 = NUM_QUEUES as u16 + 1;
/// The timer fires at least this early and the loop spins the rest: epoll wake-up
/// latency on a loaded machine is tens of microseconds.
pub const DEFAULT_SPIN: Duration = Duration::from_micros(150);
/// The most the margin grows to when wake-ups come late ([`SpinMargin`]).
pub const DEFAULT_SPIN_MAX: Duration = Duration::from_millis(1);
/// Rounds of run-signal-spin in one wake-up before yielding to the event loop.
const MAX_DRIVE_ROUNDS: usize = 10_000;

/// How completions relate to wall time.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Pacing {
    /// A completion is signalled when its card time has elapsed, times `scale`.
    Realtime { scale: f64 },
    /// Completions are signalled as soon as the card model has computed them.
    Off,
}

/// Card time ↔ wall time.
#[derive(Debug, Clone, Copy)]
struct Clock {
    wall0: Instant,
    card0: Nanos,
    scale: f64,
}

impl Clock {
    fn card_at(&self, wall: Instant) -> Nanos {
        let elapsed = wall.saturating_duration_since(self.wall0).as_nanos() as f64;
        self.card0 + (elapsed / self.scale) as Nanos
    }

    fn wall_at(&self, card: Nanos) -> Instant {
        let ns = (card.saturating_sub(self.card0) as f64 * self.scale) as u64;
        self.wall0 + Duration::from_nanos(ns)
    }
}

#[derive(Debug, Clone, Copy)]
struct Pending {
    head: u16,
    len: u32,
    due: Instant,
    /// Card time the model computed (for tests and statistics).
    done_at: Nanos,
}

/// Pacing bookkeeping: how late completions were signalled past their due time.
#[derive(Debug, Clone, Default)]
pub struct PacingStats {
    pub completed: u64,
    /// Lateness of each completion past its due time.
    pub late: Histogram,
    /// How late the pacing timer woke the loop past the instant it was armed for.
    pub wake_late: Histogram,
    /// The timer's margin at the end of the session.
    pub margin: Duration,
}

impl PacingStats {
    /// One line for the log.
    fn summary(&self) -> String {
        let us = |ns: u64| ns as f64 / 1e3;
        format!(
            "{} completions, lateness p50 {:.1} µs, p99 {:.1} µs, max {:.1} µs; \
             timer wake-ups late p50 {:.1} µs, p99 {:.1} µs; spin margin {:.0} µs",
            self.completed,
            us(self.late.quantile(0.5)),
            us(self.late.quantile(0.99)),
            us(self.late.max()),
            us(self.wake_late.quantile(0.5)),
            us(self.wake_late.quantile(0.99)),
            self.margin.as_secs_f64() * 1e6,
        )
    }
}

struct Inner {
    target: CardTarget,
    mem: Option<GuestMemoryAtomic<GuestMemoryMmap>>,
    event_idx: bool,
    pacing: Pacing,
    clock: Option<Clock>,
    pending: VecDeque<Pending>,
    timer: TimerFd,
    stats: PacingStats,
    trace: Option<TraceSink>,
    /// How long to watch the avail ring for the next request once the card is idle.
    poll: Duration,
    /// How early the timer fires before a completion is due; the rest is spun.
    spin: SpinMargin,
    /// When the armed timer should fire.
    armed: Option<Instant>,
}

/// The vhost-user-blk backend around one card.
pub struct EmmcBlkBackend {
    inner: Mutex<Inner>,
    timer_fd: i32,
    config: Vec<u8>,
    features: u64,
    /// The worker's exit event. The library signals it when a session ends but never
    /// drains it, so every session gets a fresh one (see [`EmmcBlkBackend::restart`]).
    exit: Mutex<(EventConsumer, EventNotifier)>,
}

/// virtio_blk_config (virtio 1.2 §5.2.4), little-endian.
#[derive(Debug, Clone, Copy, Default)]
#[repr(C, packed)]
struct BlkConfig {
    capacity: u64,
    size_max: u32,
    seg_max: u32,
    cylinders: u16,
    heads: u8,
    sectors: u8,
    blk_size: u32,
    physical_block_exp: u8,
    alignment_offset: u8,
    min_io_size: u16,
    opt_io_size: u32,
    writeback: u8,
    unused0: u8,
    num_queues: u16,
    max_discard_sectors: u32,
    max_discard_seg: u32,
    discard_sector_alignment: u32,
    max_write_zeroes_sectors: u32,
    max_write_zeroes_seg: u32,
    write_zeroes_may_unmap: u8,
    unused1: [u8; 3],
    max_secure_erase_sectors: u32,
    max_secure_erase_seg: u32,
    secure_erase_sector_alignment: u32,
}

// SAFETY: BlkConfig is plain data (integers and byte arrays, packed, no padding), so any
// byte pattern is a valid value.
unsafe impl ByteValued for BlkConfig {}

impl EmmcBlkBackend {
    pub fn new(target: CardTarget, pacing: Pacing) -> io::Result<EmmcBlkBackend> {
        let limits = target.limits();
        let caps = target.capabilities();
        let mut features = 1u64 << VIRTIO_F_VERSION_1
            | 1 << VIRTIO_RING_F_EVENT_IDX
            | 1 << VIRTIO_RING_F_INDIRECT_DESC
            | VhostUserVirtioFeatures::PROTOCOL_FEATURES.bits()
            | 1 << VIRTIO_BLK_F_SIZE_MAX
            | 1 << VIRTIO_BLK_F_SEG_MAX
            | 1 << VIRTIO_BLK_F_BLK_SIZE
            | 1 << VIRTIO_BLK_F_FLUSH
            | 1 << VIRTIO_BLK_F_WRITE_ZEROES;
        if caps.discard {
            features |= 1 << VIRTIO_BLK_F_DISCARD;
        }
        if caps.secure_erase {
            features |= 1 << VIRTIO_BLK_F_SECURE_ERASE;
        }
        if caps.read_only {
            features |= 1 << VIRTIO_BLK_F_RO;
        }
        let max_range = limits.max_range_sectors;
        let config = BlkConfig {
            capacity: limits.capacity.to_le(),
            size_max: SIZE_MAX.to_le(),
            seg_max: limits.seg_max.to_le(),
            blk_size: 512u32.to_le(),
            num_queues: (NUM_QUEUES as u16).to_le(),
            writeback: 1,
            max_discard_sectors: max_range.to_le(),
            max_discard_seg: limits.max_ranges.to_le(),
            discard_sector_alignment: 1u32.to_le(),
            max_write_zeroes_sectors: max_range.to_le(),
            max_write_zeroes_seg: limits.max_ranges.to_le(),
            write_zeroes_may_unmap: u8::from(caps.write_zeroes_may_unmap),
            max_secure_erase_sectors: max_range.to_le(),
            max_secure_erase_seg: limits.max_ranges.to_le(),
            secure_erase_sector_alignment: 1u32.to_le(),
            ..Default::default()
        };
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
        Ok(EmmcBlkBackend {
            inner: Mutex::new(Inner {
                target,
                mem: None,
                event_idx: false,
                pacing,
                clock: None,
                pending: VecDeque::new(),
                timer,
                stats: PacingStats::default(),
                trace: None,
                poll: Duration::ZERO,
                spin: SpinMargin::new(DEFAULT_SPIN, DEFAULT_SPIN_MAX),
                armed: None,
            }),
            timer_fd,
            config: config.as_slice().to_vec(),
            features,
            exit: Mutex::new(new_event_consumer_and_notifier(EventFlag::NONBLOCK)?),
        })
    }

    /// The pacing timer's fd, to register on the daemon's epoll loop with [`TIMER_EVENT`].
    pub fn timer_fd(&self) -> i32 {
        self.timer_fd
    }

    /// After the last completion, keep watching the avail ring for this long before going
    /// back to sleep (as QEMU's iothreads poll, 32 µs by default): a closed-loop client's
    /// next request then starts without the event loop's wake-up latency.
    pub fn set_poll(&self, window: Duration) {
        self.inner.lock().unwrap_or_else(|p| p.into_inner()).poll = window;
    }

    /// Fire the pacing timer at least `min` and at most `max` before a completion is due,
    /// as late as recent wake-ups have been, and spin the rest: more costs CPU, less lets
    /// the event loop's wake-up latency show in the completions. `max` ≤ `min`: always
    /// `min`.
    pub fn set_spin(&self, min: Duration, max: Duration) {
        self.inner.lock().unwrap_or_else(|p| p.into_inner()).spin = SpinMargin::new(min, max);
    }

    /// Record every request, with its arrival and completion in card time, in the trace
    /// format (`serve --trace`).
    pub fn set_trace(&self, trace: TraceSink) {
        self.inner.lock().unwrap_or_else(|p| p.into_inner()).trace = Some(trace);
    }

    /// Card time now.
    pub fn card_now(&self) -> Nanos {
        self.inner
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .target
            .now()
    }

    /// Write back the card's cache and make the image durable (clean shutdown).
    pub fn shutdown(&self) {
        let mut inner = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        inner.stats.margin = inner.spin.get();
        if inner.stats.completed > 0 {
            log::info!("session: {}", inner.stats.summary());
        }
        inner.target.shutdown();
        inner.flush_trace();
    }

    /// Forget the departed frontend and give the next one a freshly powered card.
    pub fn restart(&self) -> Result<(), crate::host::mmc::MmcError> {
        match new_event_consumer_and_notifier(EventFlag::NONBLOCK) {
            Ok(fresh) => *self.exit.lock().unwrap_or_else(|p| p.into_inner()) = fresh,
            Err(e) => log::error!("a fresh exit event for the next frontend: {e}"),
        }
        let mut inner = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        inner.stats.margin = inner.spin.get();
        if inner.stats.completed > 0 {
            log::info!("session: {}", inner.stats.summary());
        }
        inner.stats = PacingStats::default();
        inner.armed = None;
        inner.pending.clear();
        inner.flush_trace();
        inner.clock = None;
        inner.mem = None;
        inner.target.set_memory(None);
        let _ = inner.timer.clear();
        inner.target.restart()
    }

    pub fn pacing_stats(&self) -> PacingStats {
        let inner = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        PacingStats {
            margin: inner.spin.get(),
            ..inner.stats.clone()
        }
    }

    /// Run `f` on the card target (tests, statistics).
    pub fn with_target<R>(&self, f: impl FnOnce(&mut CardTarget) -> R) -> R {
        let mut inner = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        f(&mut inner.target)
    }
}

impl Inner {
    fn flush_trace(&mut self) {
        if let Some(Err(e)) = self.trace.as_mut().map(TraceSink::flush) {
            log::error!("trace: {e}; tracing stops");
            self.trace = None;
        }
    }

    fn trace(&mut self, req: &Request, arrival: Nanos, done: Nanos) {
        let Some(t) = self.trace.as_mut() else {
            return;
        };
        let offset = req.sector * 512;
        let ranged = |kind: &str| {
            let sectors: u64 = req.ranges.iter().map(|r| u64::from(r.sectors)).sum();
            format!("{kind} {} sectors", sectors)
        };
        match req.kind {
            RequestKind::Read => t.record(arrival, Op::Read, offset, req.data_len, done),
            RequestKind::Write => t.record(arrival, Op::Write, offset, req.data_len, done),
            RequestKind::Flush => t.record(arrival, Op::Flush, 0, 0, done),
            RequestKind::Discard if req.ranges.len() == 1 => {
                let r = req.ranges[0];
                let (start, len) = (r.sector * 512, u64::from(r.sectors) * 512);
                t.record(arrival, Op::Discard, start, len, done)
            }
            RequestKind::Discard => t.note(arrival, &ranged("DISCARD"), done),
            RequestKind::WriteZeroes => t.note(arrival, &ranged("WRITE_ZEROES"), done),
            RequestKind::SecureErase => t.note(arrival, &ranged("SECURE_ERASE"), done),
            RequestKind::GetId => t.note(arrival, "GET_ID", done),
        }
    }

    /// Write the trace lines no request still in flight can precede.
    fn release_trace(&mut self) {
        let upto = self.target.oldest_arrival().unwrap_or(Nanos::MAX);
        if let Some(Err(e)) = self.trace.as_mut().map(|t| t.release(upto)) {
            log::error!("trace: {e}; tracing stops");
            self.trace = None;
        }
    }

    /// Take every available request from the queue and hand it to the card; then run
    /// the card.
    fn process_queue(&mut self, vring: &VringRwLock) -> io::Result<()> {
        let Some(atomic) = self.mem.clone() else {
            return Ok(());
        };
        let limits = self.target.limits();
        loop {
            if self.event_idx {
                vring.disable_notification().map_err(io::Error::other)?;
            }
            let mem = atomic.memory();
            let chains: Vec<_> = vring
                .get_mut()
                .get_queue_mut()
                .iter(mem.clone())
                .map_err(io::Error::other)?
                .collect();
            for chain in chains {
                let head = chain.head_index();
                let now = Instant::now();
                let clock = *self.clock.get_or_insert(Clock {
                    wall0: now,
                    card0: self.target.now(),
                    scale: match self.pacing {
                        Pacing::Realtime { scale } => scale,
                        Pacing::Off => 1.0,
                    },
                });
                let arrival = match self.pacing {
                    Pacing::Realtime { .. } => clock.card_at(now),
                    Pacing::Off => self.target.now(),
                };
                match parse(chain, &limits) {
                    Ok(req) => self.target.submit(&*mem, head, req, arrival),
                    Err(ParseError {
                        status,
                        code,
                        problem,
                    }) => {
                        log::warn!("request {head}: {problem}");
                        let len = status
                            .filter(|&addr| mem.write_obj(code, addr).is_ok())
                            .map_or(0, |_| 1);
                        self.queue_completion(Pending {
                            head,
                            len,
                            due: now,
                            done_at: arrival,
                        });
                    }
                }
            }
            if !self.event_idx || !vring.enable_notification().map_err(io::Error::other)? {
                break;
            }
        }
        self.drive(vring)
    }

    /// Keep completions in due order.
    fn queue_completion(&mut self, p: Pending) {
        let at = self.pending.partition_point(|q| q.due <= p.due);
        self.pending.insert(at, p);
    }

    /// Run the card up to now (realtime) or to the end of its work (no pacing), queue
    /// what finished for completion at its time, signal what is due, and arm the timer
    /// for whichever comes next: a completion or the card's own next event.
    fn drive(&mut self, vring: &VringRwLock) -> io::Result<()> {
        for _ in 0..MAX_DRIVE_ROUNDS {
            let until = match (self.pacing, &self.clock) {
                (Pacing::Realtime { .. }, Some(clock)) => clock.card_at(Instant::now()),
                (Pacing::Realtime { .. }, None) => return self.complete_due(vring, None),
                (Pacing::Off, _) => Nanos::MAX,
            };
            self.target.run_until(until);
            self.finish(vring)?;
            let card_next = match (self.pacing, &self.clock) {
                (Pacing::Realtime { .. }, Some(clock)) => {
                    self.target.next_event().map(|t| clock.wall_at(t))
                }
                _ => None,
            };
            match card_next {
                Some(t) if t <= Instant::now() + self.spin.get() => {
                    self.complete_due(vring, None)?;
                    while Instant::now() < t {
                        std::hint::spin_loop();
                    }
                }
                other => return self.complete_due(vring, other),
            }
        }
        log::warn!("the card kept asking to run again at once; yielding to the event loop");
        self.complete_due(vring, Some(Instant::now()))
    }

    /// Requests the card finished: status byte, trace, and a completion due at their card
    /// time.
    fn finish(&mut self, _vring: &VringRwLock) -> io::Result<()> {
        let finished = self.target.take_finished();
        if finished.is_empty() {
            return Ok(());
        }
        let Some(atomic) = self.mem.clone() else {
            return Ok(());
        };
        let mem = atomic.memory();
        for f in finished {
            let len = if mem.write_obj(f.status, f.req.status).is_ok() {
                f.written + 1
            } else {
                0
            };
            self.trace(&f.req, f.arrival, f.at);
            let due = match (self.pacing, &self.clock) {
                (Pacing::Realtime { .. }, Some(clock)) => clock.wall_at(f.at),
                _ => Instant::now(),
            };
            self.queue_completion(Pending {
                head: f.head,
                len,
                due,
                done_at: f.at,
            });
        }
        self.release_trace();
        Ok(())
    }

    /// Signal every completion whose time has come (spinning out the last microseconds),
    /// then arm the timer for the next completion or `wake`, whichever is first.
    fn complete_due(&mut self, vring: &VringRwLock, wake: Option<Instant>) -> io::Result<()> {
        let mut used = false;
        while let Some(p) = self.pending.front().copied() {
            let now = Instant::now();
            if p.due > now + self.spin.get() {
                break;
            }
            while Instant::now() < p.due {
                std::hint::spin_loop();
            }
            let late = Instant::now().saturating_duration_since(p.due).as_nanos() as u64;
            self.stats.late.record(late);
            self.stats.completed += 1;
            vring.add_used(p.head, p.len).map_err(io::Error::other)?;
            used = true;
            self.pending.pop_front();
            log::trace!("completed {} (card time {} ns)", p.head, p.done_at);
        }
        if used && (!self.event_idx || vring.needs_notification().map_err(io::Error::other)?) {
            vring.signal_used_queue()?;
        }
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
                self.timer.reset(wait, None)?;
                self.armed = Some(now + wait);
            }
            None => {
                self.timer.clear()?;
                self.armed = None;
            }
        }
        Ok(())
    }
}

impl Inner {
    /// With nothing pending, spin on the avail ring for up to the poll window; take what
    /// arrives (each request found restarts the window).
    fn poll_for_more(&mut self, vring: &VringRwLock) -> io::Result<()> {
        if self.poll.is_zero() {
            return Ok(());
        }
        let Some(atomic) = self.mem.clone() else {
            return Ok(());
        };
        let mut deadline = Instant::now() + self.poll;
        while self.pending.is_empty() && Instant::now() < deadline {
            let mem = atomic.memory();
            let arrived = {
                let guard = vring.get_ref();
                let queue = guard.get_queue();
                queue.ready()
                    && queue
                        .avail_idx(&*mem, std::sync::atomic::Ordering::Acquire)
                        .is_ok_and(|idx| idx.0 != queue.next_avail())
            };
            if arrived {
                self.process_queue(vring)?;
                deadline = Instant::now() + self.poll;
            } else {
                std::hint::spin_loop();
            }
        }
        Ok(())
    }
}

impl VhostUserBackend for EmmcBlkBackend {
    type Bitmap = ();
    type Vring = VringRwLock;

    fn num_queues(&self) -> usize {
        NUM_QUEUES
    }

    fn max_queue_size(&self) -> usize {
        QUEUE_SIZE
    }

    fn features(&self) -> u64 {
        self.features
    }

    fn protocol_features(&self) -> VhostUserProtocolFeatures {
        VhostUserProtocolFeatures::CONFIG
            | VhostUserProtocolFeatures::MQ
            | VhostUserProtocolFeatures::REPLY_ACK
            | VhostUserProtocolFeatures::CONFIGURE_MEM_SLOTS
    }

    fn set_event_idx(&self, enabled: bool) {
        self.inner
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .event_idx = enabled;
    }

    fn update_memory(&self, mem: GuestMemoryAtomic<GuestMemoryMmap>) -> io::Result<()> {
        let mut inner = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        inner.target.set_memory(Some(mem.clone()));
        inner.mem = Some(mem);
        Ok(())
    }

    fn get_config(&self, offset: u32, size: u32) -> Vec<u8> {
        let start = offset as usize;
        let end = start.saturating_add(size as usize);
        match self.config.get(start..end) {
            Some(bytes) => bytes.to_vec(),
            None => {
                log::warn!(
                    "GET_CONFIG {offset}+{size} outside the {}-byte config space",
                    self.config.len()
                );
                Vec::new()
            }
        }
    }

    fn exit_event(&self, _thread_index: usize) -> Option<(EventConsumer, EventNotifier)> {
        let exit = self.exit.lock().unwrap_or_else(|p| p.into_inner());
        let consumer = exit.0.try_clone().ok()?;
        let notifier = exit.1.try_clone().ok()?;
        Some((consumer, notifier))
    }

    fn handle_event(
        &self,
        device_event: u16,
        evset: EventSet,
        vrings: &[VringRwLock],
        _thread_id: usize,
    ) -> io::Result<()> {
        if evset != EventSet::IN {
            return Err(io::Error::other(format!("unexpected events {evset:?}")));
        }
        let mut inner = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        match device_event {
            0 => inner.process_queue(&vrings[0])?,
            TIMER_EVENT => {
                // Consume the expiry count; a spurious wake-up reads EAGAIN.
                let expired = inner.timer.wait().is_ok_and(|n| n > 0);
                // Only a real expiry says how late the timer woke us (after a spurious
                // wake-up, or one whose timer was re-armed meanwhile, there is none).
                if let Some(armed) = inner.armed.take().filter(|_| expired) {
                    let late = Instant::now().saturating_duration_since(armed);
                    inner.stats.wake_late.record(late.as_nanos() as u64);
                    inner.spin.observe(late);
                }
                inner.drive(&vrings[0])?
            }
            other => return Err(io::Error::other(format!("unknown event {other}"))),
        }
        inner.poll_for_more(&vrings[0])
    }
}
