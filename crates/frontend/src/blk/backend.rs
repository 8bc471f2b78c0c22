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

use std::io;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use vhost::vhost_user::message::{VhostUserProtocolFeatures, VhostUserVirtioFeatures};
use vhost_user_backend::{VhostUserBackend, VringRwLock, VringT};
use virtio_bindings::virtio_blk::*;
use virtio_bindings::virtio_config::VIRTIO_F_VERSION_1;
use virtio_bindings::virtio_ring::{VIRTIO_RING_F_EVENT_IDX, VIRTIO_RING_F_INDIRECT_DESC};
use virtio_queue::{QueueOwnedT, QueueT};
use vm_memory::{ByteValued, Bytes, GuestAddressSpace, GuestMemoryAtomic, GuestMemoryMmap};
use vmm_sys_util::epoll::EventSet;
use vmm_sys_util::event::{EventConsumer, EventNotifier};

use super::request::{parse, ParseError, Request, RequestKind};
use super::target::{CardTarget, SIZE_MAX};
use crate::pacing::{
    poll_window, ring_has_avail, ArrivalWatch, Clock, Completions, Pending, Polled, SpinMargin,
};
pub use crate::pacing::{Pacing, PacingStats, DEFAULT_SPIN, DEFAULT_SPIN_MAX};
use crate::serve::{config_bytes, ExitEvent};
pub use crate::trace::TraceSink;
use emmc_card::timing::Nanos;
use emmc_host::trace::Op;

/// One request queue, as a single-slot host has.
pub const NUM_QUEUES: usize = 1;
pub const QUEUE_SIZE: usize = 256;
/// epoll data value of the pacing timer (0..=NUM_QUEUES are the library's).
pub const TIMER_EVENT: u16 = NUM_QUEUES as u16 + 1;
/// Rounds of run-signal-spin in one wake-up before yielding to the event loop.
const MAX_DRIVE_ROUNDS: usize = 10_000;
/// Paced, a wait for a completion at least this long first ends the store's round: the
/// writes it held back are written (a few small ones) or handed to its writer thread,
/// whose copy is then most likely over before the completion is spun out. Woken within
/// the spin margin instead, the writer thread was often put on the device thread's CPU
/// and took it for a median of 100-170 µs (up to 550 µs), past the completion's instant
/// (docs/performance.md, issue 16's seventeenth and eighteenth sessions).
const HAND_OVER_ROOM: Duration = Duration::from_millis(1);
/// Paced, a shorter wait for a completion, but at least this long, first writes the
/// store's held writes if they are a few small ones (a few microseconds of copies), so
/// that they neither make that completion late nor delay the look for the client's next
/// request after it. Anything else waits for the end of the round (`handle_event`).
const WAIT_FOR_HELD_WRITES: Duration = Duration::from_micros(20);

struct Inner {
    target: CardTarget,
    mem: Option<GuestMemoryAtomic<GuestMemoryMmap>>,
    event_idx: bool,
    pacing: Pacing,
    clock: Option<Clock>,
    completions: Completions,
    trace: Option<TraceSink>,
    /// How long to watch the avail ring for the next request once the card is idle.
    poll: Duration,
    /// Requests made available while the thread spun, and when (paced only).
    watch: ArrivalWatch,
}

/// The vhost-user-blk backend around one card.
pub struct EmmcBlkBackend {
    inner: Mutex<Inner>,
    timer_fd: i32,
    config: Vec<u8>,
    features: u64,
    /// The worker's exit event. The library signals it when a session ends but never
    /// drains it, so every session gets a fresh one (see [`EmmcBlkBackend::restart`]).
    exit: ExitEvent,
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
    pub fn new(mut target: CardTarget, pacing: Pacing) -> io::Result<EmmcBlkBackend> {
        // Paced, the store's writer thread is woken only where it cannot delay a
        // completion: at the end of a round, or before a long wait (`HAND_OVER_ROOM`).
        target.hold_large_writes(pacing != Pacing::Off);
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
        let completions = Completions::new()?;
        let timer_fd = completions.timer_fd();
        Ok(EmmcBlkBackend {
            inner: Mutex::new(Inner {
                target,
                mem: None,
                event_idx: false,
                pacing,
                clock: None,
                completions,
                trace: None,
                poll: Duration::ZERO,
                watch: ArrivalWatch::default(),
            }),
            timer_fd,
            config: config.as_slice().to_vec(),
            features,
            exit: ExitEvent::new()?,
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
        self.inner
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .completions
            .set_spin(SpinMargin::new(min, max));
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
        inner.completions.log_summary();
        inner.target.shutdown();
        inner.flush_trace();
    }

    /// Forget the departed frontend and give the next one a freshly powered card.
    pub fn restart(&self) -> Result<(), emmc_host::mmc::MmcError> {
        self.exit.renew();
        let mut inner = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        inner.completions.end_session();
        inner.flush_trace();
        inner.clock = None;
        inner.watch.clear();
        inner.mem = None;
        inner.target.set_memory(None);
        inner.target.restart()
    }

    pub fn pacing_stats(&self) -> PacingStats {
        let inner = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        inner.completions.stats()
    }

    /// Run `f` on the card target (tests, statistics).
    pub fn with_target<R>(&self, f: impl FnOnce(&mut CardTarget) -> R) -> R {
        let mut inner = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        f(&mut inner.target)
    }
}

impl Inner {
    fn flush_trace(&mut self) {
        if let Some(result) = self.trace.as_mut().map(TraceSink::flush) {
            crate::trace::stop_on_error(&mut self.trace, result);
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

    /// Start the pacing clock at the card's present time, and say in the trace where
    /// that is on `CLOCK_MONOTONIC`, so that a client's own timestamps can be set beside
    /// the trace's card times (docs/trace-format.md).
    fn start_clock(&mut self) -> Clock {
        let clock = Clock::start(self.target.now(), self.pacing);
        if let Some(t) = self.trace.as_mut() {
            let text = crate::trace::clock_comment(t.trace_time(clock.card0), &clock);
            let result = t.comment(&text);
            crate::trace::stop_on_error(&mut self.trace, result);
        }
        self.clock = Some(clock);
        clock
    }

    /// Write the trace lines no request still in flight can precede.
    fn release_trace(&mut self) {
        let upto = self.target.oldest_arrival().unwrap_or(Nanos::MAX);
        if let Some(result) = self.trace.as_mut().map(|t| t.release(upto)) {
            crate::trace::stop_on_error(&mut self.trace, result);
        }
    }

    /// Take every available request from the queue and hand it to the card; then run
    /// the card.
    fn process_queue(&mut self, vring: &VringRwLock) -> io::Result<()> {
        let Some(atomic) = self.mem.clone() else {
            return Ok(());
        };
        let limits = self.target.limits();
        // Rounds that found nothing although the avail index promised more: one covers a
        // request that raced the re-enabled notification; more mean a corrupt ring.
        let mut empty_rounds = 0;
        loop {
            if self.event_idx {
                vring.disable_notification().map_err(io::Error::other)?;
            }
            let mem = atomic.memory();
            // Where this round starts, read only when a spin saw requests (no lock taken
            // on the common path).
            let next = self
                .watch
                .base()
                .map(|_| vring.get_ref().get_queue().next_avail());
            // A corrupt ring (avail index more than a ring ahead) is logged and taken as
            // empty, as the mmc transport does: an error here would end the worker
            // silently and leave the session without a queue.
            let chains: Vec<_> = match vring.get_mut().get_queue_mut().iter(mem.clone()) {
                Ok(iter) => iter.collect(),
                Err(e) => {
                    log::warn!("avail ring unusable: {e}");
                    Vec::new()
                }
            };
            if chains.is_empty() {
                empty_rounds += 1;
            }
            let mut parsed = Vec::with_capacity(chains.len());
            for (i, chain) in chains.into_iter().enumerate() {
                let arrival = match self.pacing {
                    Pacing::Realtime { .. } => {
                        // Made available while the thread spun: it arrived when a look
                        // first saw it.
                        let at = self.watch.arrival(next, i).unwrap_or_else(Instant::now);
                        let clock = match self.clock {
                            Some(clock) => clock,
                            None => self.start_clock(),
                        };
                        clock.card_at(at)
                    }
                    // Without pacing the wall clock plays no part: the card's own time
                    // is the arrival, and no clock is read per request.
                    Pacing::Off => self.target.now(),
                };
                parsed.push((chain.head_index(), arrival, parse(chain, &limits)));
            }
            self.watch.clear();
            // Without pacing the card runs through the whole round at once: its reads'
            // copies can start now, beside the submissions and the card model. Paced,
            // the device thread has the time.
            if self.pacing == Pacing::Off {
                let reads = parsed.iter().filter_map(|(_, _, r)| r.as_ref().ok());
                self.target.prefetch_reads(&mem, reads);
            }
            for (head, arrival, parsed) in parsed {
                match parsed {
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
                        self.completions.push(Pending {
                            queue: 0,
                            head,
                            len,
                            due: Instant::now(),
                            done_at: arrival,
                        });
                    }
                }
            }
            if !self.event_idx
                || !vring.enable_notification().map_err(io::Error::other)?
                || empty_rounds > 1
            {
                break;
            }
        }
        self.drive(vring)
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
                    self.target.next_event().map(|t| (t, clock.wall_at(t)))
                }
                _ => None,
            };
            match card_next {
                Some((card_t, t)) if t <= Instant::now() + self.completions.spin() => {
                    // The card's next event is within the spin margin: run the card to it
                    // now, so the work it does there (landing a program's data in the
                    // image, destaging the cache) is done before the instant instead of
                    // making the completion late; the completion is still signalled at
                    // its card time. Nothing else can happen meanwhile: requests that
                    // arrive are read after this handler, as they would be after a spin.
                    self.target.run_until(card_t);
                    self.finish(vring)?;
                    // The timer is armed once the loop ends (the card's events after this
                    // one are not known yet).
                    self.signal_due(vring)?;
                    let mem = self.mem.as_ref().map(GuestMemoryAtomic::memory);
                    while Instant::now() < t {
                        if let Some(mem) = &mem {
                            self.watch.look(vring, &**mem);
                        }
                        std::hint::spin_loop();
                    }
                }
                Some((_, t)) if t <= Instant::now() + 2 * self.completions.spin() => {
                    // The timer would fire in less than the margin, a wait shorter than
                    // a wake-up is allowed to take: the thread would sleep through the
                    // client's next request and take it only as late as it wakes (at
                    // QD8 with a client that sleeps, 72 µs after the completion that
                    // freed its slot instead of 30: docs/performance.md, issue 16's
                    // twelfth session). Spin instead, watching the ring, until the
                    // card's event is within the margin (the next round spins it out),
                    // or until a request is seen: then the loop takes it at once.
                    if self.spin_watching_until(vring, t - self.completions.spin()) {
                        return self.complete_due(vring, Some(t));
                    }
                }
                other => return self.complete_due(vring, other.map(|(_, t)| t)),
            }
        }
        log::warn!("the card kept asking to run again at once; yielding to the event loop");
        self.complete_due(vring, Some(Instant::now()))
    }

    /// Spin until `until`, watching the avail ring; stop early (`true`) once a look has
    /// seen requests, which the event loop then takes.
    fn spin_watching_until(&mut self, vring: &VringRwLock, until: Instant) -> bool {
        let mem = self.mem.as_ref().map(GuestMemoryAtomic::memory);
        while Instant::now() < until {
            if let Some(mem) = &mem {
                self.watch.look(vring, &**mem);
            }
            if self.watch.base().is_some() {
                return true;
            }
            std::hint::spin_loop();
        }
        self.watch.base().is_some()
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
        // Without pacing everything finished is due now: one clock read for the batch.
        let now = Instant::now();
        for f in finished {
            let len = if mem.write_obj(f.status, f.req.status).is_ok() {
                f.written + 1
            } else {
                0
            };
            self.trace(&f.req, f.arrival, f.at);
            let due = match (self.pacing, &self.clock) {
                (Pacing::Realtime { .. }, Some(clock)) => clock.wall_at(f.at),
                _ => now,
            };
            self.completions.push(Pending {
                queue: 0,
                head: f.head,
                len,
                due,
                done_at: f.at,
            });
        }
        self.release_trace();
        Ok(())
    }

    /// Signal what is due, then arm the timer for the next completion or `wake`.
    fn complete_due(&mut self, vring: &VringRwLock, wake: Option<Instant>) -> io::Result<()> {
        self.signal_due(vring)?;
        self.completions.arm(wake)
    }

    /// Signal every completion whose time has come, spinning out the last microseconds
    /// and watching the avail ring meanwhile.
    fn signal_due(&mut self, vring: &VringRwLock) -> io::Result<()> {
        // Paced, what the store holds back goes to the image while the thread waits for
        // a completion far enough off (`HAND_OVER_ROOM`, `WAIT_FOR_HELD_WRITES`);
        // otherwise at the round's end.
        if self.pacing != Pacing::Off {
            let wait = self
                .completions
                .first_due()
                .map(|due| due.saturating_duration_since(Instant::now()));
            match wait {
                Some(wait) if wait > HAND_OVER_ROOM => self.target.end_batch(),
                Some(wait) if wait > WAIT_FOR_HELD_WRITES => self.target.end_batch_here(),
                _ => {}
            }
        }
        let vrings = std::slice::from_ref(vring);
        let mem = self.mem.as_ref().map(GuestMemoryAtomic::memory);
        let watch = &mut self.watch;
        self.completions
            .signal_due_watching(vrings, self.event_idx, &mut || {
                if let Some(mem) = &mem {
                    watch.look(vring, &**mem);
                }
            })
    }
}

impl Inner {
    /// With nothing pending, spin on the avail ring for up to the poll window; take what
    /// arrives (each request found restarts the window).
    fn poll_for_more(&mut self, vring: &VringRwLock) -> io::Result<()> {
        let Some(atomic) = self.mem.clone() else {
            return Ok(());
        };
        poll_window(self.poll, || {
            if !self.completions.is_empty() {
                Ok(Polled::Done)
            } else if ring_has_avail(vring, &*atomic.memory()) {
                let took = self.process_queue(vring).map(|()| Polled::Took);
                self.target.end_batch();
                took
            } else {
                Ok(Polled::Nothing)
            }
        })
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
        crate::serve::check_memory_backing(&mem)?;
        let mut inner = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        inner.target.set_memory(Some(mem.clone()));
        inner.mem = Some(mem);
        Ok(())
    }

    fn get_config(&self, offset: u32, size: u32) -> Vec<u8> {
        config_bytes(&self.config, offset, size)
    }

    fn exit_event(&self, _thread_index: usize) -> Option<(EventConsumer, EventNotifier)> {
        self.exit.pair()
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
        let round = match device_event {
            0 => inner.process_queue(&vrings[0]),
            TIMER_EVENT => {
                inner.completions.timer_fired();
                inner.drive(&vrings[0])
            }
            other => return Err(io::Error::other(format!("unknown event {other}"))),
        };
        // A round that ended early on an error may have left reads' copies under way;
        // none may outlive the lock (the memory map may change once it is released).
        inner.target.settle_prefetches();
        round?;
        // The round's completions are signalled: the image gets its held-back writes
        // now, off the requests' way (each round the poll window takes ends the same).
        // Paced, after the look for the client's next request: a hand-over to the
        // writer thread costs the device thread a wake-up's system call (about 20 µs in
        // a profile of paced 128 KiB writes), by which the next request would be seen,
        // and the card started, later.
        let paced = inner.pacing != Pacing::Off;
        if !paced {
            inner.target.end_batch();
        }
        let more = inner.poll_for_more(&vrings[0]);
        if paced {
            inner.target.end_batch();
        }
        inner.target.settle_prefetches();
        more
    }
}
