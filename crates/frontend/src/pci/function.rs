//! The function's state, shared by the message thread and the timer thread, and the
//! `ServerBackend` the `vfio_user` server drives.

use std::io;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::Instant;

use vfio_bindings::bindings::vfio::{
    vfio_region_info, VFIO_IRQ_INFO_AUTOMASKED, VFIO_IRQ_INFO_EVENTFD, VFIO_IRQ_INFO_MASKABLE,
    VFIO_IRQ_INFO_NORESIZE, VFIO_PCI_BAR0_REGION_INDEX, VFIO_PCI_CONFIG_REGION_INDEX,
    VFIO_PCI_INTX_IRQ_INDEX, VFIO_PCI_NUM_IRQS, VFIO_PCI_NUM_REGIONS, VFIO_REGION_INFO_FLAG_READ,
    VFIO_REGION_INFO_FLAG_WRITE,
};
use vfio_user::{DmaMapFlags, DmaUnmapFlags, IrqInfo, ServerBackend, ServerRegion};
use vmm_sys_util::epoll::{ControlOperation, Epoll, EpollEvent, EventSet};
use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};

use super::config::{ConfigSpace, CONFIG_SIZE};
use super::device::PciMmio;
use super::dma::{DmaMap, Mapped};
use super::identity::PciIdentity;
use super::intx::{Intx, IrqRequest};
use super::session_times::{AccessTimes, SessionSummary, TimerTimes};
use crate::pacing::{Clock, Pacing, SpinMargin, DEFAULT_SPIN, DEFAULT_SPIN_MAX};
use emmc_card::timing::Nanos;

/// How the function is presented and paced.
#[derive(Debug, Clone)]
pub struct PciOptions {
    pub identity: PciIdentity,
    /// `--timing realtime` (card time follows the wall clock, times the scale) or `off`
    /// (each event of the device runs at once).
    pub pacing: Pacing,
    /// How early the timer thread wakes before an event and spins the rest.
    pub spin: SpinMargin,
}

impl Default for PciOptions {
    fn default() -> PciOptions {
        PciOptions {
            identity: PciIdentity::default(),
            pacing: Pacing::Realtime { scale: 1.0 },
            spin: SpinMargin::new(DEFAULT_SPIN, DEFAULT_SPIN_MAX),
        }
    }
}

/// Counters over the function's life (all sessions).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PciStats {
    /// Sessions that ended (clients that came and went).
    pub sessions: u64,
    pub bar_reads: u64,
    pub bar_writes: u64,
    pub config_reads: u64,
    pub config_writes: u64,
    /// Times the INTx trigger eventfd was written.
    pub intx_signals: u64,
    /// Device resets the client asked for.
    pub resets: u64,
    /// DMA maps that came without a descriptor.
    pub maps_ignored: u64,
    /// Requests refused with an error reply.
    pub refused: u64,
    /// Events the timer thread ran (`advance` calls it made).
    pub timer_events: u64,
}

/// Card time for the device: the wall clock from the session's first message, or (with
/// `--timing off`) the time of the last event run. Never goes back.
#[derive(Debug)]
pub(crate) struct CardTime {
    pacing: Pacing,
    clock: Option<Clock>,
    last: Nanos,
}

impl CardTime {
    fn new(pacing: Pacing) -> CardTime {
        CardTime {
            pacing,
            clock: None,
            last: 0,
        }
    }

    /// Card time now; a realtime clock starts here if the session has none yet.
    pub(crate) fn now(&mut self) -> Nanos {
        if self.pacing.is_realtime() {
            let (last, pacing) = (self.last, self.pacing);
            let clock = self.clock.get_or_insert_with(|| Clock::start(last, pacing));
            self.last = self.last.max(clock.card_at(Instant::now()));
        }
        self.last
    }

    /// Card time now, without starting a clock: between sessions it stands where the last
    /// one left it.
    pub(crate) fn current(&mut self) -> Nanos {
        if let Some(clock) = self.clock {
            self.last = self.last.max(clock.card_at(Instant::now()));
        }
        self.last
    }

    /// `--timing off`: card time jumps to `t` (if it is not past it already).
    pub(crate) fn reach(&mut self, t: Nanos) -> Nanos {
        self.last = self.last.max(t);
        self.last
    }

    /// The session's clock, once it has started.
    pub(crate) fn clock(&self) -> Option<Clock> {
        self.clock
    }

    pub(crate) fn pacing(&self) -> Pacing {
        self.pacing
    }

    /// The client left: the next session starts a clock of its own where this one ended.
    fn end_session(&mut self) -> Nanos {
        if let Some(c) = self.clock.take() {
            self.last = self.last.max(c.card_at(Instant::now()));
        }
        self.last
    }
}

/// Everything the two threads share, behind one lock.
pub(crate) struct Inner<D> {
    pub(crate) device: D,
    pub(crate) config: ConfigSpace,
    pub(crate) dma: DmaMap,
    pub(crate) intx: Intx,
    pub(crate) time: CardTime,
    /// The card time the timer thread sleeps until (None: until woken).
    pub(crate) armed: Option<Nanos>,
    pub(crate) stats: PciStats,
    /// The current session's register accesses and interrupts, timed.
    pub(crate) times: AccessTimes,
    /// What the current session's timer thread measured, as of its last pass.
    pub(crate) timer_times: TimerTimes,
    /// When the current session's client sent its first message and the INTx signals
    /// before it; taken by the one who logs its summary (the session's end, or a
    /// signal that stops the daemon first). None while the server waits for a client.
    pub(crate) summary_due: Option<(Instant, u64)>,
    bar0_size: u64,
    /// The session being served, to wake its timer thread from other threads.
    pub(crate) session: Option<Arc<Session>>,
}

impl<D: PciMmio> Inner<D> {
    /// Run what the device has due by `now`, then set the line.
    pub(crate) fn advance(&mut self, now: Nanos) {
        let dma = self.dma.access(self.config.bus_master());
        self.device.advance(now, &dma);
        self.update_intx();
    }

    /// Set the INTx line and the status register from the device.
    pub(crate) fn update_intx(&mut self) {
        let line = self.device.irq_asserted();
        self.config.set_interrupt_status(line);
        if self.intx.update(line, self.config.intx_disabled()) {
            self.stats.intx_signals += 1;
            self.times.signalled();
        }
    }

    /// Wake the session's timer thread if the device's next event is sooner than the one
    /// it waits for.
    pub(crate) fn wake_if_sooner(&self) {
        if let (Some(next), Some(session)) = (self.device.next_event(), &self.session) {
            if self.armed.is_none_or(|armed| next < armed) {
                session.wake();
            }
        }
    }

    /// Run events due at or before `now`, so an access sees the device as of its own
    /// time even when the timer thread has not caught up.
    fn run_due(&mut self, now: Nanos) {
        if self.device.next_event().is_some_and(|t| t <= now) {
            self.advance(now);
        }
    }

    fn check_bar(&self, offset: u64, len: usize) -> Result<(), String> {
        if !matches!(len, 1 | 2 | 4 | 8) {
            return Err(format!("BAR0 access of {len} bytes (1, 2, 4 or 8)"));
        }
        if offset % len as u64 != 0 {
            return Err(format!(
                "BAR0 access of {len} bytes at {offset:#x}: unaligned"
            ));
        }
        if offset
            .checked_add(len as u64)
            .is_none_or(|end| end > self.bar0_size)
        {
            return Err(format!(
                "BAR0 access of {len} bytes at {offset:#x}: outside its {} bytes",
                self.bar0_size
            ));
        }
        if !self.config.memory_enabled() {
            return Err(format!(
                "BAR0 access at {offset:#x} with memory space disabled or out of D0"
            ));
        }
        Ok(())
    }

    fn bar_read(&mut self, offset: u64, data: &mut [u8]) -> Result<(), String> {
        self.check_bar(offset, data.len())?;
        let now = self.time.now();
        self.run_due(now);
        let dma = self.dma.access(self.config.bus_master());
        self.device.read(now, offset, data, &dma);
        self.update_intx();
        self.stats.bar_reads += 1;
        Ok(())
    }

    fn bar_write(&mut self, offset: u64, data: &[u8]) -> Result<(), String> {
        self.check_bar(offset, data.len())?;
        let now = self.time.now();
        self.run_due(now);
        let dma = self.dma.access(self.config.bus_master());
        self.device.write(now, offset, data, &dma);
        self.update_intx();
        self.stats.bar_writes += 1;
        Ok(())
    }

    fn config_read(&mut self, offset: u64, data: &mut [u8]) -> Result<(), String> {
        if !ConfigSpace::contains(offset, data.len()) {
            return Err(format!(
                "config read of {} bytes at {offset:#x}: outside its {CONFIG_SIZE} bytes",
                data.len()
            ));
        }
        self.config.set_interrupt_status(self.device.irq_asserted());
        self.config.read(offset as usize, data);
        self.stats.config_reads += 1;
        Ok(())
    }

    fn config_write(&mut self, offset: u64, data: &[u8]) -> Result<(), String> {
        if !ConfigSpace::contains(offset, data.len()) {
            return Err(format!(
                "config write of {} bytes at {offset:#x}: outside its {CONFIG_SIZE} bytes",
                data.len()
            ));
        }
        self.config.write(offset as usize, data);
        // Clearing Interrupt Disable lets a pending line signal.
        self.update_intx();
        self.stats.config_writes += 1;
        Ok(())
    }

    /// VFIO_USER_DEVICE_RESET: the device and the configuration space to their reset
    /// values. The DMA map and the interrupt descriptors stay (they are the client's
    /// IOMMU and eventfds, not the function's); a pending auto-mask drops with the line.
    fn reset(&mut self) {
        self.device.reset();
        self.config.reset();
        self.intx.device_reset();
        self.update_intx();
        self.stats.resets += 1;
    }

    /// A session begins (its server waits for a client): its times start afresh.
    pub(crate) fn begin_session(&mut self, session: Arc<Session>) {
        self.session = Some(session);
        self.times = AccessTimes::default();
        self.timer_times = TimerTimes::default();
        self.summary_due = None;
    }

    /// The session's client sent its first message: the session's wall time starts.
    fn client_arrived(&mut self) {
        self.summary_due = Some((Instant::now(), self.stats.intx_signals));
    }

    /// The session's summary line, once: None if it was already taken (or no session
    /// began).
    pub(crate) fn take_summary(&mut self) -> Option<String> {
        let line = self.summary();
        self.summary_due = None;
        line
    }

    /// The session's summary line so far, if a client is attached and its summary has
    /// not been taken.
    pub(crate) fn summary(&self) -> Option<String> {
        let (started, signals_before) = self.summary_due?;
        Some(
            SessionSummary {
                wall: started.elapsed(),
                accesses: &self.times,
                timer: &self.timer_times,
                intx_signals: self.stats.intx_signals - signals_before,
            }
            .to_string(),
        )
    }

    /// The client left: its maps and descriptors go, the card is power-cycled and the
    /// function is as after reset.
    pub(crate) fn end_session(&mut self) {
        self.session = None;
        let now = self.time.end_session();
        self.dma.clear();
        self.intx = Intx::default();
        self.device.power_cycle(now);
        self.config.reset();
        self.armed = None;
        self.stats.sessions += 1;
    }
}

/// The function: its state behind the lock.
pub(crate) struct Function<D> {
    inner: Mutex<Inner<D>>,
}

impl<D: PciMmio> Function<D> {
    pub(crate) fn new(device: D, options: &PciOptions) -> Function<D> {
        let bar0_size = device.bar0_size();
        Function {
            inner: Mutex::new(Inner {
                config: ConfigSpace::new(&options.identity.ids(), bar0_size),
                device,
                dma: DmaMap::default(),
                intx: Intx::default(),
                time: CardTime::new(options.pacing),
                armed: None,
                stats: PciStats::default(),
                times: AccessTimes::default(),
                timer_times: TimerTimes::default(),
                summary_due: None,
                bar0_size,
                session: None,
            }),
        }
    }

    /// The lock. A thread that panicked holding it (a device model's bug) leaves the
    /// state as it was; the other thread goes on with it rather than panicking too.
    pub(crate) fn lock(&self) -> MutexGuard<'_, Inner<D>> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// The regions of a VFIO PCI device: BAR0 and the configuration space; BARs 1 to 5, the
/// expansion ROM and VGA are absent (size 0, no access).
pub(crate) fn regions(bar0_size: u64) -> Vec<ServerRegion> {
    (0..VFIO_PCI_NUM_REGIONS)
        .map(|index| {
            let size = match index {
                VFIO_PCI_BAR0_REGION_INDEX => bar0_size,
                VFIO_PCI_CONFIG_REGION_INDEX => CONFIG_SIZE as u64,
                _ => 0,
            };
            let flags = if size > 0 {
                VFIO_REGION_INFO_FLAG_READ | VFIO_REGION_INFO_FLAG_WRITE
            } else {
                0
            };
            ServerRegion {
                region_info: vfio_region_info {
                    argsz: std::mem::size_of::<vfio_region_info>() as u32,
                    flags,
                    index,
                    cap_offset: 0,
                    size,
                    offset: 0,
                },
                sparse_areas: Vec::new(),
                mmap_fd: None,
            }
        })
        .collect()
}

/// The interrupt indexes of a VFIO PCI device: INTx with one vector, maskable and masked
/// when it fires; MSI, MSI-X, error and request with none (as the kernel reports them for
/// a function without those capabilities).
pub(crate) fn irqs() -> Vec<IrqInfo> {
    (0..VFIO_PCI_NUM_IRQS)
        .map(|index| {
            if index == VFIO_PCI_INTX_IRQ_INDEX {
                IrqInfo {
                    index,
                    flags: VFIO_IRQ_INFO_EVENTFD
                        | VFIO_IRQ_INFO_MASKABLE
                        | VFIO_IRQ_INFO_AUTOMASKED,
                    count: 1,
                }
            } else {
                IrqInfo {
                    index,
                    flags: VFIO_IRQ_INFO_EVENTFD | VFIO_IRQ_INFO_NORESIZE,
                    count: 0,
                }
            }
        })
        .collect()
}

/// Epoll data of the timer thread's descriptors.
pub(crate) const WAKE: u64 = 0;
pub(crate) const TIMER: u64 = 1;
pub(crate) const UNMASK: u64 = 2;

/// What the message thread and the timer thread of one client's session share besides
/// the function: the timer thread's epoll set, its wake-up eventfd and the stop flag.
pub(crate) struct Session {
    pub(crate) epoll: Epoll,
    pub(crate) wake: EventFd,
    pub(crate) stop: AtomicBool,
}

impl Session {
    pub(crate) fn new() -> io::Result<Session> {
        let epoll = Epoll::new()?;
        let wake = EventFd::new(EFD_NONBLOCK)?;
        epoll.ctl(
            ControlOperation::Add,
            std::os::fd::AsRawFd::as_raw_fd(&wake),
            EpollEvent::new(EventSet::IN, WAKE),
        )?;
        Ok(Session {
            epoll,
            wake,
            stop: AtomicBool::new(false),
        })
    }

    /// Wake the timer thread (it recomputes what to wait for).
    pub(crate) fn wake(&self) {
        if let Err(e) = self.wake.write(1) {
            log::warn!("waking the timer thread: {e}");
        }
    }

    /// Stop the timer thread.
    pub(crate) fn stop(&self) {
        self.stop.store(true, Ordering::SeqCst);
        self.wake();
    }
}

/// The `ServerBackend` of one session: the message thread's side.
pub(crate) struct Backend<D> {
    pub(crate) function: Arc<Function<D>>,
    pub(crate) session: Arc<Session>,
    /// The listening socket, to refuse other clients once this one is attached.
    pub(crate) listener: Option<i32>,
    pub(crate) refusing: Option<(Arc<AtomicBool>, JoinHandle<()>)>,
    /// No message has come yet.
    pub(crate) first_message: bool,
}

impl<D: PciMmio> Backend<D> {
    /// A message arrived: the client is attached, so other clients are refused from now
    /// on (one at a time, as the other transports).
    fn attached(&mut self) {
        if std::mem::take(&mut self.first_message) {
            self.function.lock().client_arrived();
        }
        if self.refusing.is_none() {
            if let Some(fd) = self.listener {
                let stop = Arc::new(AtomicBool::new(false));
                let handle = crate::serve::refuse_others(fd, stop.clone());
                self.refusing = Some((stop, handle));
            }
        }
    }

    /// The session is over: stop refusing others.
    pub(crate) fn detached(&mut self) {
        if let Some((stop, handle)) = self.refusing.take() {
            stop.store(true, Ordering::Relaxed);
            let _ = handle.join();
        }
    }

    /// Wake the timer thread if the device's next event comes before what it waits for.
    fn wake_if_sooner(&self, inner: &Inner<D>) {
        if let Some(next) = inner.device.next_event() {
            if inner.armed.is_none_or(|armed| next < armed) {
                self.session.wake();
            }
        }
    }

    fn refuse(&self, inner: &mut Inner<D>, why: String) -> io::Error {
        log::warn!("vfio-user: {why}");
        inner.stats.refused += 1;
        io::Error::new(io::ErrorKind::InvalidInput, why)
    }

    /// Watch the unmask eventfd a SET_IRQS registers, or stop watching the one it replaces.
    fn watch_unmask(
        &self,
        add: Option<&std::fs::File>,
        remove: Option<&std::fs::File>,
    ) -> io::Result<()> {
        use std::os::fd::AsRawFd;
        if let Some(f) = remove {
            let _ = self.session.epoll.ctl(
                ControlOperation::Delete,
                f.as_raw_fd(),
                EpollEvent::default(),
            );
        }
        if let Some(f) = add {
            self.session.epoll.ctl(
                ControlOperation::Add,
                f.as_raw_fd(),
                EpollEvent::new(EventSet::IN, UNMASK),
            )?;
        }
        Ok(())
    }
}

impl<D: PciMmio> ServerBackend for Backend<D> {
    fn region_read(&mut self, region: u32, offset: u64, data: &mut [u8]) -> io::Result<()> {
        let start = Instant::now();
        self.attached();
        let mut inner = self.function.lock();
        let result = match region {
            VFIO_PCI_BAR0_REGION_INDEX => inner.bar_read(offset, data).map(|()| {
                inner.times.access(start, true);
            }),
            VFIO_PCI_CONFIG_REGION_INDEX => inner.config_read(offset, data),
            _ => Err(format!("read of region {region}, which is absent")),
        };
        log::trace!("read region {region} {offset:#x} {data:02x?}");
        match result {
            Ok(()) => {
                self.wake_if_sooner(&inner);
                Ok(())
            }
            Err(why) => Err(self.refuse(&mut inner, why)),
        }
    }

    fn region_write(&mut self, region: u32, offset: u64, data: &[u8]) -> io::Result<()> {
        let start = Instant::now();
        self.attached();
        let mut inner = self.function.lock();
        log::trace!("write region {region} {offset:#x} {data:02x?}");
        let result = match region {
            VFIO_PCI_BAR0_REGION_INDEX => inner.bar_write(offset, data).map(|()| {
                inner.times.access(start, false);
            }),
            VFIO_PCI_CONFIG_REGION_INDEX => inner.config_write(offset, data),
            _ => Err(format!("write to region {region}, which is absent")),
        };
        match result {
            Ok(()) => {
                self.wake_if_sooner(&inner);
                Ok(())
            }
            Err(why) => Err(self.refuse(&mut inner, why)),
        }
    }

    fn dma_map(
        &mut self,
        flags: DmaMapFlags,
        offset: u64,
        address: u64,
        size: u64,
        fd: Option<std::fs::File>,
    ) -> io::Result<()> {
        self.attached();
        let mut inner = self.function.lock();
        match inner.dma.map(flags, offset, address, size, fd) {
            Ok(Mapped::Shared) => {
                log::debug!("DMA map: {size:#x} bytes at {address:#x}");
                Ok(())
            }
            Ok(Mapped::Ignored) => {
                inner.stats.maps_ignored += 1;
                log::info!(
                    "DMA map of {size:#x} bytes at {address:#x} without a file descriptor: \
                     ignored, the device cannot reach it (share guest memory, e.g. \
                     memory-backend-memfd)"
                );
                Ok(())
            }
            Err(e) => Err(self.refuse(&mut inner, e.to_string())),
        }
    }

    fn dma_unmap(&mut self, flags: DmaUnmapFlags, address: u64, size: u64) -> io::Result<()> {
        self.attached();
        // Under the lock: once the reply is sent, no device access reaches the memory.
        let mut inner = self.function.lock();
        match inner.dma.unmap(flags, address, size) {
            Ok(()) => {
                log::debug!("DMA unmap: {size:#x} bytes at {address:#x}");
                Ok(())
            }
            Err(e) => Err(self.refuse(&mut inner, e.to_string())),
        }
    }

    fn reset(&mut self) -> io::Result<()> {
        self.attached();
        let mut inner = self.function.lock();
        log::info!("device reset");
        inner.reset();
        self.wake_if_sooner(&inner);
        Ok(())
    }

    fn set_irqs(
        &mut self,
        index: u32,
        flags: u32,
        start: u32,
        count: u32,
        fds: Vec<std::fs::File>,
    ) -> io::Result<()> {
        self.attached();
        let mut inner = self.function.lock();
        let req = match IrqRequest::parse(index, flags, start, count, fds) {
            Ok(r) => r,
            Err(e) => return Err(self.refuse(&mut inner, e.to_string())),
        };
        log::debug!("SET_IRQS {req:?}");
        if let IrqRequest::UnmaskFd(Some(f)) = &req {
            if !inner.intx.is_enabled() {
                let why = "SET_IRQS: unmask eventfd while INTx is not enabled".to_string();
                return Err(self.refuse(&mut inner, why));
            }
            if let Err(e) = self.watch_unmask(Some(f), None) {
                let why = format!("SET_IRQS: cannot watch the unmask eventfd: {e}");
                return Err(self.refuse(&mut inner, why));
            }
        }
        match inner.intx.apply(req) {
            Ok(replaced) => {
                let _ = self.watch_unmask(None, replaced.as_ref());
                // Enabling or unmasking lets a pending line signal.
                inner.update_intx();
                Ok(())
            }
            Err(why) => Err(self.refuse(&mut inner, format!("SET_IRQS: {why}"))),
        }
    }
}
