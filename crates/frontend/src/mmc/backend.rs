//! The virtio-mmc device over vhost-user: three queues, configuration space, pacing.
//!
//! On every notification the device takes what is available on the request queue, then
//! on the control queue, and executes each in that order on the single-slot host
//! ([`MmcDevice`]), each starting at its arrival in card time or when the one before
//! ended. With realtime pacing card time follows the wall clock (scaled by
//! `--time-scale`) from the first request of a session, and each completion — used ring
//! entry and interrupt — is signalled when the wall clock reaches its card time (a
//! completion's `end_ns`, a control request's `now_ns`), through the pacing timer shared
//! with the blk transport ([`Completions`]). Without pacing completions go out at once.
//! Events a request raises are written into a buffer from the event queue at once and
//! used together with the request's completion.

use std::io;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use vhost::vhost_user::message::{VhostUserProtocolFeatures, VhostUserVirtioFeatures};
use vhost_user_backend::{VhostUserBackend, VringRwLock, VringT};
use virtio_bindings::virtio_config::VIRTIO_F_VERSION_1;
use virtio_bindings::virtio_ring::{VIRTIO_RING_F_EVENT_IDX, VIRTIO_RING_F_INDIRECT_DESC};
use virtio_queue::{QueueOwnedT, QueueT};
use vm_memory::{
    ByteValued, GuestAddressSpace, GuestMemoryAtomic, GuestMemoryLoadGuard, GuestMemoryMmap,
};
use vmm_sys_util::epoll::EventSet;
use vmm_sys_util::event::{EventConsumer, EventNotifier};

use super::device::MmcDevice;
use super::proto::*;
use super::request::{
    answer_control, answer_request, parse_control, parse_event_buffer, parse_request, put,
    refuse_control, refuse_request,
};
use super::trace::{MmcTracer, Traced};
use crate::pacing::{
    poll_window, ring_has_avail, Clock, Completions, Pacing, PacingStats, Pending, Polled,
    SpinMargin,
};
use crate::serve::{config_bytes, ExitEvent};
use crate::trace::{stop_on_error, TraceSink};
use emmc_card::timing::Nanos;

/// The trace `serve --trace` writes.
type Tracer = MmcTracer<std::io::BufWriter<std::fs::File>>;

pub const QUEUE_SIZE: usize = 256;
/// epoll data value of the pacing timer (0..=NUM_QUEUES are the library's).
pub const TIMER_EVENT: u16 = NUM_QUEUES as u16 + 1;

type Mem = GuestMemoryLoadGuard<GuestMemoryMmap>;

struct Inner {
    device: MmcDevice,
    mem: Option<GuestMemoryAtomic<GuestMemoryMmap>>,
    event_idx: bool,
    pacing: Pacing,
    clock: Option<Clock>,
    completions: Completions,
    /// How long to watch the avail rings for the next request once nothing is pending.
    poll: Duration,
    /// Events dropped for want of an event buffer, this session.
    events_dropped: u64,
    trace: Option<Tracer>,
}

/// The virtio-mmc backend around one card.
pub struct EmmcMmcBackend {
    inner: Mutex<Inner>,
    timer_fd: i32,
    config: Vec<u8>,
    features: u64,
    /// The worker's exit event; fresh for every session (see the blk backend).
    exit: ExitEvent,
}

impl EmmcMmcBackend {
    pub fn new(device: MmcDevice, pacing: Pacing) -> io::Result<EmmcMmcBackend> {
        let features = 1u64 << VIRTIO_F_VERSION_1
            | 1 << VIRTIO_RING_F_EVENT_IDX
            | 1 << VIRTIO_RING_F_INDIRECT_DESC
            | VhostUserVirtioFeatures::PROTOCOL_FEATURES.bits();
        let config = device.config().as_slice().to_vec();
        let completions = Completions::new()?;
        let timer_fd = completions.timer_fd();
        Ok(EmmcMmcBackend {
            inner: Mutex::new(Inner {
                device,
                mem: None,
                event_idx: false,
                pacing,
                clock: None,
                completions,
                poll: Duration::ZERO,
                events_dropped: 0,
                trace: None,
            }),
            timer_fd,
            config,
            features,
            exit: ExitEvent::new()?,
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The pacing timer's fd, to register on the daemon's epoll loop with [`TIMER_EVENT`].
    pub fn timer_fd(&self) -> i32 {
        self.timer_fd
    }

    /// See `EmmcBlkBackend::set_poll`.
    pub fn set_poll(&self, window: Duration) {
        self.lock().poll = window;
    }

    /// See `EmmcBlkBackend::set_spin`.
    pub fn set_spin(&self, min: Duration, max: Duration) {
        self.lock().completions.set_spin(SpinMargin::new(min, max));
    }

    pub fn pacing_stats(&self) -> PacingStats {
        self.lock().completions.stats()
    }

    /// Card time now.
    pub fn card_now(&self) -> Nanos {
        self.lock().device.now()
    }

    /// Record every request, with its arrival and completion in card time, in the trace
    /// format (`serve --trace`; see [`super::trace`]).
    pub fn set_trace(&self, trace: TraceSink) {
        self.lock().trace = Some(MmcTracer::new(trace));
    }

    /// Run `f` on the device (tests, statistics).
    pub fn with_device<R>(&self, f: impl FnOnce(&mut MmcDevice) -> R) -> R {
        f(&mut self.lock().device)
    }

    /// Write back the card's cache and make the image durable (clean shutdown).
    pub fn shutdown(&self) {
        let mut inner = self.lock();
        inner.completions.log_summary();
        inner.device.shutdown();
        inner.flush_trace();
    }

    /// Forget the departed frontend and give the next one a card powered down and up.
    pub fn restart(&self) {
        self.exit.renew();
        let mut inner = self.lock();
        inner.completions.end_session();
        if inner.events_dropped > 0 {
            log::info!(
                "session: {} events dropped without an event buffer",
                inner.events_dropped
            );
        }
        inner.events_dropped = 0;
        inner.flush_trace();
        inner.clock = None;
        inner.mem = None;
        inner.device.restart();
    }
}

/// Take every chain available on `vring` (none when the queue is not set up or its ring
/// is corrupt, which is logged).
fn take_chains(vring: &VringRwLock, mem: &Mem) -> Vec<virtio_queue::DescriptorChain<Mem>> {
    let mut guard = vring.get_mut();
    let queue = guard.get_queue_mut();
    if !queue.ready() {
        return Vec::new();
    }
    match queue.iter(mem.clone()) {
        Ok(iter) => iter.collect(),
        Err(e) => {
            log::warn!("avail ring unusable: {e}");
            Vec::new()
        }
    }
}

/// The first block of a request's data in guest memory (a packed command's header).
fn first_block(mem: &Mem, req: &super::request::MmcReq) -> Option<[u8; 512]> {
    let mut block = [0u8; 512];
    let mut at = 0;
    for seg in &req.data {
        if at == block.len() {
            break;
        }
        let n = (seg.len as usize).min(block.len() - at);
        vm_memory::Bytes::read_slice(&**mem, &mut block[at..at + n], seg.addr).ok()?;
        at += n;
    }
    (at == block.len()).then_some(block)
}

impl Inner {
    fn flush_trace(&mut self) {
        if let Some(result) = self.trace.as_mut().map(Tracer::flush) {
            stop_on_error(&mut self.trace, result);
        }
    }

    /// Write the trace line(s) of an executed request.
    fn trace_request(
        &mut self,
        mem: &Mem,
        req: &super::request::MmcReq,
        partition: emmc_card::Partition,
        arrival: Nanos,
        done: &super::device::Executed,
    ) {
        let Some(tracer) = self.trace.as_mut() else {
            return;
        };
        let packed_write = req.has(REQ_F_SBC)
            && req.hdr.sbc.arg & emmc_card::packed::CMD23_PACKED != 0
            && req.has(REQ_F_WRITE)
            && req.has(REQ_F_DATA);
        let header = packed_write.then(|| first_block(mem, req)).flatten();
        let end = if done.resp.flags & RESP_F_BUSY_PENDING != 0 {
            done.done_at.max(done.resp.busy_until_ns)
        } else {
            done.done_at
        };
        let traced = Traced {
            req,
            partition,
            sector_addressing: self.device.card().model().sector_addressing(),
            header: header.as_ref(),
            resp: &done.resp,
            arrival,
            done: end,
        };
        let result = tracer.request(&traced);
        stop_on_error(&mut self.trace, result);
    }

    /// Card time of a request arriving now.
    fn arrival(&mut self) -> Nanos {
        let clock = match self.clock {
            Some(clock) => clock,
            None => self.start_clock(),
        };
        match self.pacing {
            Pacing::Realtime { .. } => clock.card_at(Instant::now()),
            Pacing::Off => self.device.now(),
        }
    }

    /// Start the clock at the card's present time; paced, say in the trace where that
    /// is on `CLOCK_MONOTONIC`, as the blk transport does (docs/trace-format.md).
    fn start_clock(&mut self) -> Clock {
        let clock = Clock::start(self.device.now(), self.pacing);
        if let (Pacing::Realtime { .. }, Some(t)) = (self.pacing, self.trace.as_mut()) {
            let text = crate::trace::clock_comment(t.trace_time(clock.card0), &clock);
            let result = t.comment(&text);
            stop_on_error(&mut self.trace, result);
        }
        self.clock = Some(clock);
        clock
    }

    /// When a completion at card time `t` is due on the wall clock.
    fn due(&self, t: Nanos) -> Instant {
        match (self.pacing, &self.clock) {
            (Pacing::Realtime { .. }, Some(clock)) => clock.wall_at(t),
            _ => Instant::now(),
        }
    }

    /// Take what is available on the request queue, then on the control queue, execute
    /// it in that order, and signal what is due.
    fn process(&mut self, vrings: &[VringRwLock]) -> io::Result<()> {
        let Some(atomic) = self.mem.clone() else {
            return Ok(());
        };
        let (requestq, controlq) = (&vrings[REQUEST_QUEUE], &vrings[CONTROL_QUEUE]);
        // Rounds that found nothing although the avail index promised more: one covers a
        // request that raced the re-enabled notification; more mean a corrupt ring.
        let mut empty_rounds = 0;
        loop {
            if self.event_idx {
                for q in [requestq, controlq] {
                    if q.get_ref().get_queue().ready() {
                        q.disable_notification().map_err(io::Error::other)?;
                    }
                }
            }
            let mem = atomic.memory();
            let requests = take_chains(requestq, &mem);
            let controls = take_chains(controlq, &mem);
            let took = !(requests.is_empty() && controls.is_empty());
            for chain in requests {
                self.request(vrings, &mem, chain);
            }
            for chain in controls {
                self.control(&mem, chain);
            }
            let mut more = took;
            if self.event_idx {
                more = false;
                for q in [requestq, controlq] {
                    if q.get_ref().get_queue().ready() {
                        more |= q.enable_notification().map_err(io::Error::other)?;
                    }
                }
            }
            if !took {
                empty_rounds += 1;
            }
            if !more || empty_rounds > 1 {
                break;
            }
        }
        self.completions.complete_due(vrings, self.event_idx, None)
    }

    fn request(
        &mut self,
        vrings: &[VringRwLock],
        mem: &Mem,
        chain: virtio_queue::DescriptorChain<Mem>,
    ) {
        let head = chain.head_index();
        let arrival = self.arrival();
        match parse_request(chain, &self.device.limits()) {
            Ok(req) => {
                let partition = self.device.card().current_partition();
                let done = self.device.request(&**mem, &req, arrival);
                if self.trace.is_some() {
                    self.trace_request(mem, &req, partition, arrival, &done);
                }
                let len = answer_request(&**mem, &req, &done);
                let due = self.due(done.done_at);
                self.completions.push(Pending {
                    queue: REQUEST_QUEUE,
                    head,
                    len,
                    due,
                    done_at: done.done_at,
                });
                for ev in done.events {
                    self.post_event(vrings, mem, ev, due);
                }
            }
            Err(e) => {
                log::warn!("request {head}: {}", e.problem);
                let len = refuse_request(&**mem, &e);
                self.completions.push(Pending {
                    queue: REQUEST_QUEUE,
                    head,
                    len,
                    due: Instant::now(),
                    done_at: arrival,
                });
            }
        }
    }

    fn control(&mut self, mem: &Mem, chain: virtio_queue::DescriptorChain<Mem>) {
        let head = chain.head_index();
        let arrival = self.arrival();
        let (len, done_at, due) = match parse_control(chain) {
            Ok(c) => {
                let out = self.device.control(&c.req, arrival);
                let len = answer_control(&**mem, &c, &out);
                (len, out.now_ns, self.due(out.now_ns))
            }
            Err(e) => {
                log::warn!("control request {head}: {}", e.problem);
                let len = refuse_control(&**mem, &e, self.device.now());
                (len, arrival, Instant::now())
            }
        };
        self.completions.push(Pending {
            queue: CONTROL_QUEUE,
            head,
            len,
            due,
            done_at,
        });
    }

    /// Write `ev` into the next event buffer; it is used when `due` comes (with the
    /// request that raised it). Without a buffer the event is dropped.
    fn post_event(&mut self, vrings: &[VringRwLock], mem: &Mem, ev: VirtioMmcEvent, due: Instant) {
        let eventq = &vrings[EVENT_QUEUE];
        loop {
            let chain = {
                let mut guard = eventq.get_mut();
                let queue = guard.get_queue_mut();
                if queue.ready() {
                    queue.pop_descriptor_chain(mem.clone())
                } else {
                    None
                }
            };
            let Some(chain) = chain else {
                self.events_dropped += 1;
                log::info!(
                    "event {} (val {:#x}) dropped: no buffer on the event queue",
                    ev.kind,
                    ev.val
                );
                return;
            };
            let head = chain.head_index();
            match parse_event_buffer(chain) {
                Ok(addr) => {
                    let len = if put(&**mem, ev, addr) {
                        std::mem::size_of::<VirtioMmcEvent>() as u32
                    } else {
                        0
                    };
                    self.completions.push(Pending {
                        queue: EVENT_QUEUE,
                        head,
                        len,
                        due,
                        done_at: ev.at_ns,
                    });
                    return;
                }
                Err(problem) => {
                    log::warn!("event buffer {head}: {problem}");
                    self.completions.push(Pending {
                        queue: EVENT_QUEUE,
                        head,
                        len: 0,
                        due: Instant::now(),
                        done_at: ev.at_ns,
                    });
                }
            }
        }
    }

    /// With nothing pending, spin on the request and control rings for up to the poll
    /// window; take what arrives (each find restarts the window).
    fn poll_for_more(&mut self, vrings: &[VringRwLock]) -> io::Result<()> {
        let Some(atomic) = self.mem.clone() else {
            return Ok(());
        };
        poll_window(self.poll, || {
            let mem = atomic.memory();
            if !self.completions.is_empty() {
                Ok(Polled::Done)
            } else if ring_has_avail(&vrings[REQUEST_QUEUE], &*mem)
                || ring_has_avail(&vrings[CONTROL_QUEUE], &*mem)
            {
                let took = self.process(vrings).map(|()| Polled::Took);
                self.device.host_mut().card.end_batch();
                took
            } else {
                Ok(Polled::Nothing)
            }
        })
    }
}

impl VhostUserBackend for EmmcMmcBackend {
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
        self.lock().event_idx = enabled;
    }

    fn update_memory(&self, mem: GuestMemoryAtomic<GuestMemoryMmap>) -> io::Result<()> {
        crate::serve::check_memory_backing(&mem)?;
        self.lock().mem = Some(mem);
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
        if vrings.len() < NUM_QUEUES {
            return Err(io::Error::other(format!(
                "{} vrings, the device has {NUM_QUEUES}",
                vrings.len()
            )));
        }
        let mut inner = self.lock();
        match device_event {
            0 | 1 => inner.process(vrings)?,
            // New event buffers: they wait until an event needs one.
            2 => {}
            TIMER_EVENT => {
                inner.completions.timer_fired();
                let event_idx = inner.event_idx;
                inner.completions.complete_due(vrings, event_idx, None)?;
            }
            other => return Err(io::Error::other(format!("unknown event {other}"))),
        }
        // The round's completions are signalled: the image gets its held-back writes.
        inner.device.host_mut().card.end_batch();
        inner.poll_for_more(vrings)
    }
}
