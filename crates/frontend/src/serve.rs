//! `vhost-user-emmc serve`: the daemon, for either transport.
//!
//! One card, one vhost-user socket, one frontend at a time. The socket is created
//! owner-only. While a frontend is attached, further connections are accepted only to be
//! closed, with a log line saying why. When the frontend leaves, the card is powered down
//! cleanly and up again, and the daemon waits for the next. SIGINT and SIGTERM write the
//! card's cache back, sync the image, remove the socket and exit.
//!
//! The transport decides what the socket serves: `blk` (the card's user area as a
//! vhost-user-blk device, through the backend's own MMC block driver; `blk/serve.rs`) or
//! `mmc` (raw MMC requests to the SDHCI host, docs/virtio-mmc.md; `mmc/serve.rs`). Both
//! share this lifecycle through [`ServedBackend`].

use std::os::fd::{AsRawFd, FromRawFd};
use std::os::unix::net::UnixListener;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use vhost::vhost_user::Listener;
use vhost_user_backend::{VhostUserBackend, VhostUserDaemon, VringRwLock};
use vm_memory::{
    GuestAddressSpace, GuestMemoryAtomic, GuestMemoryBackend, GuestMemoryMmap, GuestMemoryRegion,
};
use vmm_sys_util::epoll::EventSet;
use vmm_sys_util::event::{
    new_event_consumer_and_notifier, EventConsumer, EventFlag, EventNotifier,
};

use super::pacing::{Pacing, DEFAULT_SPIN, DEFAULT_SPIN_MAX};
use emmc_card::model::DeviceModel;
use emmc_card::store::{read_header, ImageStore};
use emmc_card::Card;
use emmc_host::policy::{PackingArg, SchedulerArg};

/// The eventfd pair each backend hands the daemon's worker (`exit_event`) so the daemon
/// can stop it; a new pair for every frontend session.
pub struct ExitEvent(std::sync::Mutex<(EventConsumer, EventNotifier)>);

impl ExitEvent {
    pub fn new() -> std::io::Result<ExitEvent> {
        Ok(ExitEvent(std::sync::Mutex::new(
            new_event_consumer_and_notifier(EventFlag::NONBLOCK)?,
        )))
    }

    /// A copy of the pair for a worker thread (`VhostUserBackend::exit_event`).
    pub fn pair(&self) -> Option<(EventConsumer, EventNotifier)> {
        let exit = self.0.lock().unwrap_or_else(|p| p.into_inner());
        Some((exit.0.try_clone().ok()?, exit.1.try_clone().ok()?))
    }

    /// A fresh pair for the next frontend: the departed one's worker has consumed the old.
    pub fn renew(&self) {
        match new_event_consumer_and_notifier(EventFlag::NONBLOCK) {
            Ok(fresh) => *self.0.lock().unwrap_or_else(|p| p.into_inner()) = fresh,
            Err(e) => log::error!("a fresh exit event for the next frontend: {e}"),
        }
    }
}

/// GET_CONFIG: `size` bytes of `config` at `offset`; a read outside it gets nothing, and a
/// log line says so.
pub fn config_bytes(config: &[u8], offset: u32, size: u32) -> Vec<u8> {
    let start = offset as usize;
    let end = start.saturating_add(size as usize);
    match config.get(start..end) {
        Some(bytes) => bytes.to_vec(),
        None => {
            log::warn!(
                "GET_CONFIG {offset}+{size} outside the {}-byte config space",
                config.len()
            );
            Vec::new()
        }
    }
}

/// `--timing`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum TimingArg {
    /// Complete each request when its card time has elapsed in wall time.
    Realtime,
    /// Complete each request as soon as it has been executed.
    Off,
}

/// `--transport`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum TransportArg {
    /// vhost-user-blk: the card's user area as a block device, through the backend's MMC
    /// block driver.
    #[default]
    Blk,
    /// virtio-mmc (docs/virtio-mmc.md): the guest's own MMC requests to the emulated
    /// SDHCI host and card.
    Mmc,
    /// vfio-user (docs/sdhci-transport.md): an SDHCI controller as a PCI function for
    /// QEMU's vfio-user-pci, driven by the guest's own sdhci-pci, MMC core and mmc_block.
    Sdhci,
}

/// `--image-sync`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum ImageSyncArg {
    /// fdatasync the image whenever the card finishes programming data it acknowledges
    /// as durable (reliable write, forced programming, cache off) and at every flush:
    /// acknowledged data survives the host losing power.
    #[default]
    Durable,
    /// fdatasync only at cache flushes and shutdown: durable programs reach the image
    /// file at once (they survive the daemon being killed) but not the disk until the
    /// next flush. Cacheless models on a slow disk keep their pacing.
    Flush,
}

/// `--image-io`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum ImageIoArg {
    /// Writes of 64 KiB and more that the card destages go to the image on a writer
    /// thread, overlapping the next request; smaller ones wait for the end of the round
    /// of requests (blk and mmc transports), after its completions are signalled, and go
    /// out together (reads, syncs and the card's durable programs wait for both:
    /// docs/durability.md); reads of 64 KiB and more are split over two threads; with
    /// `--timing off`, a blk round of four or more smaller reads has them copied into
    /// guest memory on a helper thread while the card model runs.
    /// For an image in tmpfs the writer thread copies those large writes, and the device
    /// thread its small round-end writes, into a shared mapping of the image
    /// (`madvise(MADV_POPULATE_WRITE)` first, once per page, so a full tmpfs is an error,
    /// not a crash), which copies at about 1.6 times `pwrite`'s rate; small reads of
    /// pages known to be allocated come out of it. Images on other filesystems, and
    /// kernels older than 5.14, get `pread`/`pwrite`.
    #[default]
    Threads,
    /// As `threads`, with `pread`/`pwrite` instead of the mapping (the daemon before it,
    /// for comparison).
    ThreadsPwrite,
    /// All image I/O on the device thread.
    Inline,
}

#[derive(Debug, Clone, clap::Args)]
pub struct ServeArgs {
    /// vhost-user socket to create.
    #[arg(long)]
    pub socket: PathBuf,
    /// Card image (`vhost-user-emmc image create` makes one). A missing image is an
    /// error unless `--create` is given.
    #[arg(long)]
    pub image: PathBuf,
    /// Create the image for the model when it does not exist (announced on stderr).
    #[arg(long)]
    pub create: bool,
    /// Built-in model name or model file (default: the image's model, or generic-emmc45).
    #[arg(long)]
    pub model: Option<String>,
    /// What the socket serves: a block device (blk), raw MMC requests (mmc), or an SDHCI
    /// controller as a vfio-user PCI function (sdhci).
    #[arg(long, value_enum, default_value_t = TransportArg::Blk)]
    pub transport: TransportArg,
    /// With sdhci: the PCI vendor and device ID the controller presents, which decide the
    /// slot Linux's sdhci-pci makes of it (docs/sdhci-transport.md, "PCI identities").
    #[arg(long, value_enum, default_value_t = crate::pci::PciIdentity::default())]
    pub pci_identity: crate::pci::PciIdentity,
    /// When the image is fdatasynced (docs/durability.md).
    #[arg(long, value_enum, default_value_t = ImageSyncArg::Durable)]
    pub image_sync: ImageSyncArg,
    /// Where image reads and writes run.
    #[arg(long, value_enum, default_value_t = ImageIoArg::Threads)]
    pub image_io: ImageIoArg,
    #[arg(long, value_enum, default_value = "realtime")]
    pub timing: TimingArg,
    /// Wall time per unit of card time with realtime pacing (2.0 = twice as slow).
    #[arg(long, default_value_t = 1.0)]
    pub time_scale: f64,
    /// Record every request with its arrival and completion in card time, in the trace
    /// format of docs/trace-format.md (replayable with `simulate --workload trace`). With
    /// mmc and sdhci, every data command on the user area is a line and every other
    /// command a comment.
    #[arg(long)]
    pub trace: Option<PathBuf>,
    /// Log every MMC command the emulated SDHCI controller sends to the card: argument,
    /// response, data, card-time duration and errors (docs/trace-format.md, "MMC command
    /// log").
    #[arg(long)]
    pub cmd_log: Option<PathBuf>,
    /// Microseconds to keep polling the queue for the next request once the card is idle
    /// (0: sleep at once). Trades CPU for the event loop's wake-up latency, like QEMU's
    /// iothread poll-max-ns.
    #[arg(long, default_value_t = 32)]
    pub poll_us: u64,
    /// Microseconds before a completion is due at which the pacing timer fires at least;
    /// the rest is spun.
    #[arg(long, default_value_t = DEFAULT_SPIN.as_micros() as u64)]
    pub spin_us: u64,
    /// The most the timer's margin grows to where the event loop wakes late (a loaded or
    /// virtualised host): it covers the 99th percentile of recent wake-ups. Equal to
    /// --spin-us (or below): a fixed margin.
    #[arg(long, default_value_t = DEFAULT_SPIN_MAX.as_micros() as u64)]
    pub spin_max_us: u64,
    /// Hold a CPU latency request (Linux PM QoS, /dev/cpu_dma_latency; root) of this many
    /// microseconds while serving: idle CPUs stay out of idle states that take longer to
    /// leave (0: they poll). On a virtual machine whose halted CPUs wake slowly this
    /// takes the machine's wake-up out of both the client's and the pacing timer's way
    /// (docs/performance.md); it applies to the whole machine and costs power, and on
    /// some virtual machines cross-CPU bandwidth.
    #[arg(long)]
    pub cpu_latency_us: Option<u32>,
    /// The host driver's write packing: packed commands always, under write packing
    /// control (seed 000) with `--wr-threshold`, or never. blk transport only (with mmc
    /// the guest's driver decides).
    #[arg(long, value_enum, default_value_t = PackingArg::Off)]
    pub packing: PackingArg,
    /// Write packing control's threshold (`num_wr_reqs_to_start_packing`).
    #[arg(long, default_value_t = emmc_host::packing::DEFAULT_NUM_WR_REQS_TO_START_PACKING)]
    pub wr_threshold: u32,
    /// The host driver's I/O scheduler [default: cfq, with Linux's defaults: reads
    /// (sync) before the guest's writeback (async), as seed 000's kernel scheduled them;
    /// noop keeps the guest's order]. blk transport only.
    #[arg(long, value_enum)]
    pub scheduler: Option<SchedulerArg>,
    /// CFQ's `slice_idle` in microseconds.
    #[arg(long, default_value_t = LINUX_SLICE_IDLE_US)]
    pub slice_idle_us: u64,
    /// Fault plan (TOML, docs/faults.md) applied to every command the controller sends
    /// once the card is served; a plan that fails validation stops the daemon.
    #[arg(long)]
    pub fault_plan: Option<PathBuf>,
    /// Control socket (JSON lines, owner-only): add and clear faults, cut power, read
    /// statistics while serving; `vhost-user-emmc control` talks to it.
    #[arg(long)]
    pub control: Option<PathBuf>,
}

/// Linux's CFQ `slice_idle` (8 ms).
const LINUX_SLICE_IDLE_US: u64 = 8000;

impl ServeArgs {
    /// The blk transport's I/O scheduler: `--scheduler`, or serve's default
    /// ([`emmc_host::blkdrv::BlkConfig::served`]), with `--slice-idle-us` for CFQ.
    pub fn elevator(&self) -> emmc_host::iosched::Elevator {
        use emmc_host::iosched::Elevator;
        match (
            self.scheduler,
            emmc_host::blkdrv::BlkConfig::served(&Default::default()).elevator,
        ) {
            (Some(s), _) => s.elevator(self.slice_idle_us),
            (None, Elevator::Cfq(served)) => Elevator::Cfq(emmc_host::iosched::CfqTunables {
                slice_idle_ns: self.slice_idle_us.min(10_000_000) * 1000,
                ..served
            }),
            (None, other) => other,
        }
    }

    /// `--timing` and `--time-scale`.
    pub fn pacing(&self) -> Pacing {
        match self.timing {
            TimingArg::Realtime => Pacing::Realtime {
                scale: self.time_scale,
            },
            TimingArg::Off => Pacing::Off,
        }
    }

    /// The daemon's pacing, with this thread's (and its future threads') timers made
    /// exact when completions follow the wall clock.
    pub fn start_pacing(&self) -> Pacing {
        let pacing = self.pacing();
        if pacing.is_realtime() {
            exact_timers();
        }
        pacing
    }
}

/// What the shared daemon lifecycle needs from a transport's backend.
pub trait ServedBackend:
    VhostUserBackend<Bitmap = (), Vring = VringRwLock>
    + super::control::Controlled
    + Send
    + Sync
    + 'static
{
    /// The pacing timer's fd, registered on every worker's epoll loop with
    /// [`ServedBackend::timer_event`].
    fn timer_fd(&self) -> i32;
    /// The epoll data value the backend's `handle_event` expects for the timer.
    fn timer_event(&self) -> u16;
    /// Clean shutdown: write the card's cache back and make the image durable.
    fn shutdown(&self);
    /// The frontend left: forget it and give the next one a freshly powered card.
    fn restart(&self) -> Result<(), String>;
}

/// `vhost-user-emmc serve`.
pub fn serve(args: &ServeArgs) -> Result<(), String> {
    if !(args.time_scale.is_finite() && args.time_scale > 0.0) {
        return Err(format!(
            "--time-scale {} must be a positive number",
            args.time_scale
        ));
    }
    // A bad plan stops the daemon before it touches the image or the socket.
    emmc_host::fault::load_fault_plan(args.fault_plan.as_deref())?;
    // Held until the daemon returns.
    let _cpu_latency = args
        .cpu_latency_us
        .map(super::cpu_latency::CpuLatencyRequest::hold)
        .transpose()
        .map_err(|e| e.to_string())?;
    match args.transport {
        TransportArg::Blk => super::blk::serve::serve_blk(args),
        TransportArg::Mmc => super::mmc::serve::serve_mmc(args),
        TransportArg::Sdhci => super::sdhci::serve::serve_sdhci(args),
    }
}

/// Options that belong to the blk transport's own block driver: with mmc and sdhci the
/// guest's driver sends every command.
pub fn refuse_blk_options(args: &ServeArgs) -> Result<(), String> {
    let mut given = Vec::new();
    if args.packing != PackingArg::Off {
        given.push("--packing");
    }
    if args.scheduler.is_some() {
        given.push("--scheduler");
    }
    if given.is_empty() {
        Ok(())
    } else {
        Err(format!(
            "{}: for --transport blk only (with mmc and sdhci the guest's driver sends \
             every command)",
            given.join(", ")
        ))
    }
}

/// Refuse guest memory whose regions map past the end of their files (both backends'
/// `update_memory`). mmap(2) accepts such a mapping, but touching its tail raises
/// SIGBUS: a frontend could kill the daemon with a memfd smaller than the region it
/// declares and a ring placed past the file's end. On refusal the memory is replaced by
/// an empty map, so nothing can reach the bad one before the session ends.
///
/// A frontend that shrinks its file after the check can still do it, as with any
/// vhost-user backend; that needs memfd seals to rule out (docs/robustness.md).
pub fn check_memory_backing(mem: &GuestMemoryAtomic<GuestMemoryMmap>) -> std::io::Result<()> {
    let problem = {
        let guard = mem.memory();
        let mut problem = None;
        for r in guard.iter() {
            let Some(fo) = r.file_offset() else {
                continue;
            };
            let meta = fo.file().metadata()?;
            if !meta.is_file() {
                continue;
            }
            let end = fo.start().checked_add(r.len());
            if end.is_none_or(|end| end > meta.len()) {
                problem = Some(format!(
                    "memory region at guest {:#x}: {} bytes from offset {} of a {}-byte file \
                     (past its end)",
                    r.start_addr().0,
                    r.len(),
                    fo.start(),
                    meta.len()
                ));
                break;
            }
        }
        problem
    };
    match problem {
        None => Ok(()),
        Some(p) => {
            log::warn!("refusing guest memory: {p}");
            mem.lock()
                .map_err(|_| std::io::Error::other("guest memory lock poisoned"))?
                .replace(GuestMemoryMmap::new());
            Err(std::io::Error::other(p))
        }
    }
}

/// The `--cmd-log` file, its times counted from card time `origin`.
pub fn open_cmd_log(
    args: &ServeArgs,
    origin: emmc_card::timing::Nanos,
    model: &str,
) -> Result<Option<emmc_host::cmdlog::CmdLog>, String> {
    args.cmd_log
        .as_deref()
        .map(|path| {
            let heading = format!(
                "vhost-user-emmc serve --transport {}, model {model}: MMC command log",
                match args.transport {
                    TransportArg::Blk => "blk",
                    TransportArg::Mmc => "mmc",
                    TransportArg::Sdhci => "sdhci",
                }
            );
            emmc_host::cmdlog::CmdLog::create(path, origin, &heading)
        })
        .transpose()
}

/// Open the image (or, with `--create`, create a missing one) and build the card on it.
pub fn open_card(args: &ServeArgs) -> Result<(Card, DeviceModel), String> {
    let existing = args.image.exists();
    let name = match (&args.model, existing) {
        (Some(m), _) => m.clone(),
        (None, true) => read_header(&args.image).map_err(|e| e.to_string())?.model,
        (None, false) => emmc_card::model::DEFAULT_MODEL.to_string(),
    };
    if !existing && !args.create {
        return Err(format!(
            "{}: no such image (make one with `vhost-user-emmc image create --model {name} {}`, \
             or add --create)",
            args.image.display(),
            args.image.display()
        ));
    }
    let model = DeviceModel::load(&name).map_err(|e| e.to_string())?;
    let layout = Card::layout_for(&model);
    let mut store = if existing {
        ImageStore::open(&args.image, layout, &model.name)
    } else {
        let store = ImageStore::create(&args.image, layout, &model.name);
        if store.is_ok() {
            eprintln!(
                "vhost-user-emmc: created {} for model {} ({} bytes, sparse)",
                args.image.display(),
                model.name,
                layout.total_bytes()
            );
        }
        store
    }
    .map_err(|e| format!("{}: {e}", args.image.display()))?;
    store.set_mapped_writes(args.image_io == ImageIoArg::Threads);
    store.set_sync_programs(args.image_sync == ImageSyncArg::Durable);
    store
        .set_io_threads(args.image_io != ImageIoArg::Inline)
        .map_err(|e| e.to_string())?;
    let card = Card::new(model.clone(), Box::new(store)).map_err(|e| e.to_string())?;
    Ok((card, model))
}

/// Bind the socket with permissions 0600 from the start.
fn bind_owner_only(path: &Path) -> Result<Listener, String> {
    // SAFETY: umask only changes this process's file-creation mask; it is restored at
    // once, and no other thread creates files in between (signal handling has not started).
    let old = unsafe { libc::umask(0o177) };
    let listener = Listener::new(path, true);
    // SAFETY: as above.
    unsafe { libc::umask(old) };
    listener.map_err(|e| format!("{}: {e}", path.display()))
}

/// How long a new connection waits for the attached frontend's session to end before it
/// is refused.
const RECONNECT_GRACE: std::time::Duration = std::time::Duration::from_millis(500);

/// While a frontend is attached, accept and close any other connection.
pub(crate) fn refuse_others(fd: i32, stop: Arc<AtomicBool>) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || {
        // SAFETY: dup returns a new descriptor for the same listening socket (or -1,
        // checked); the UnixListener below owns and closes that duplicate only.
        let dup = unsafe { libc::dup(fd) };
        if dup < 0 {
            log::warn!(
                "cannot watch for other frontends: {}",
                std::io::Error::last_os_error()
            );
            return;
        }
        // SAFETY: `dup` is a valid, owned listening socket descriptor.
        let listener = unsafe { UnixListener::from_raw_fd(dup) };
        while !stop.load(Ordering::Relaxed) {
            let mut pfd = libc::pollfd {
                fd: listener.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            };
            // SAFETY: one valid pollfd, its length is 1, and it outlives the call.
            let ready = unsafe { libc::poll(&mut pfd, 1, 100) };
            if ready > 0 && pfd.revents & libc::POLLIN != 0 {
                // A frontend that reconnects right after leaving (a restarted QEMU) may
                // arrive before its old session has wound down: give the session a grace
                // period to end and leave the connection for the next one if it does.
                let since = std::time::Instant::now();
                while !stop.load(Ordering::Relaxed) && since.elapsed() < RECONNECT_GRACE {
                    std::thread::sleep(std::time::Duration::from_millis(10));
                }
                if stop.load(Ordering::Relaxed) {
                    break;
                }
                if let Ok((stream, _)) = listener.accept() {
                    log::warn!(
                        "refusing a second frontend: the card is already attached to one \
                         (one frontend at a time, as one card sits in one slot)"
                    );
                    drop(stream);
                }
            }
        }
    })
}

/// Ask the kernel to fire this thread's timers on time rather than up to 50 µs late (the
/// default timer slack, which lets it batch wake-ups). Threads started afterwards — the
/// daemon's workers — inherit it.
pub fn exact_timers() {
    // SAFETY: PR_SET_TIMERSLACK takes one integer argument and changes nothing but this
    // thread's timer slack; the result is checked.
    let rc = unsafe { libc::prctl(libc::PR_SET_TIMERSLACK, 1 as libc::c_ulong, 0, 0, 0) };
    if rc != 0 {
        log::warn!(
            "timer slack stays at the default: {}",
            std::io::Error::last_os_error()
        );
    }
}

/// Serve `backend` on `socket` until a signal: one frontend at a time, the card restarted
/// between sessions, a clean shutdown on SIGINT / SIGTERM.
pub fn run_daemon<B: ServedBackend>(
    backend: Arc<B>,
    socket: &Path,
    control: Option<&Path>,
    model_name: &str,
) -> Result<(), String> {
    let control = control
        .map(|p| super::control::ControlSocket::spawn(p, backend.clone()))
        .transpose()?;
    let mut listener = bind_owner_only(socket)?;
    {
        let backend = backend.clone();
        let socket = socket.to_path_buf();
        let control_path = control.as_ref().map(|c| c.path().to_path_buf());
        let mut signals = signal_hook::iterator::Signals::new([
            signal_hook::consts::SIGINT,
            signal_hook::consts::SIGTERM,
        ])
        .map_err(|e| format!("signal handling: {e}"))?;
        std::thread::spawn(move || {
            if let Some(sig) = signals.forever().next() {
                log::info!("signal {sig}: writing the cache back and syncing the image");
                backend.shutdown();
                let _ = std::fs::remove_file(&socket);
                if let Some(p) = &control_path {
                    let _ = std::fs::remove_file(p);
                }
                std::process::exit(0);
            }
        });
    }
    eprintln!(
        "vhost-user-emmc: serving {model_name} on {}",
        socket.display()
    );
    loop {
        let mem = GuestMemoryAtomic::new(GuestMemoryMmap::new());
        let mut daemon = VhostUserDaemon::new("vhost-user-emmc".into(), backend.clone(), mem)
            .map_err(|e| format!("daemon: {e:?}"))?;
        daemon
            .start(&mut listener)
            .map_err(|e| format!("accepting a frontend: {e:?}"))?;
        log::info!("frontend attached");
        for handler in daemon.get_epoll_handlers() {
            handler
                .register_listener(
                    backend.timer_fd(),
                    EventSet::IN,
                    u64::from(backend.timer_event()),
                )
                .map_err(|e| format!("registering the pacing timer: {e}"))?;
        }
        let stop = Arc::new(AtomicBool::new(false));
        let refusing = refuse_others(listener.as_raw_fd(), stop.clone());
        let result = daemon.wait();
        stop.store(true, Ordering::Relaxed);
        let _ = refusing.join();
        match result {
            Ok(()) => log::info!("frontend detached"),
            Err(e) => log::info!("frontend detached: {e:?}"),
        }
        // A card that cannot be brought up again is the next frontend's problem to see
        // (its requests fail, and the driver's recovery re-initialises the card), not a
        // reason for the daemon to go: it would take the image's other sessions with it.
        if let Err(e) = backend.restart() {
            log::error!(
                "card restart after the frontend left: {e}; serving the next frontend \
                 anyway (its first failed request re-initialises the card)"
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn get_config_reads_inside_the_space_and_nothing_outside_it() {
        let config: Vec<u8> = (0..16).collect();
        assert_eq!(config_bytes(&config, 4, 4), [4, 5, 6, 7]);
        assert_eq!(config_bytes(&config, 0, 16), config);
        assert!(config_bytes(&config, 12, 8).is_empty(), "runs past the end");
        assert!(
            config_bytes(&config, u32::MAX, u32::MAX).is_empty(),
            "no overflow"
        );
    }

    #[test]
    fn each_session_gets_an_exit_event_of_its_own() {
        let exit = ExitEvent::new().unwrap();
        let (_, first) = exit.pair().unwrap();
        exit.renew();
        let (consumer, _) = exit.pair().unwrap();
        first.notify().unwrap();
        assert!(
            consumer.consume().is_err(),
            "the old pair does not stop the new worker"
        );
    }

    #[test]
    fn the_sdhci_transport_refuses_the_blk_drivers_options_before_touching_anything() {
        use clap::Parser;
        #[derive(Parser)]
        struct Cli {
            #[command(flatten)]
            serve: ServeArgs,
        }
        let dir = tempfile::tempdir().unwrap();
        let (socket, image) = (dir.path().join("s"), dir.path().join("img"));
        let cli = Cli::try_parse_from([
            "serve".as_ref(),
            "--transport".as_ref(),
            "sdhci".as_ref(),
            "--packing".as_ref(),
            "always".as_ref(),
            "--socket".as_ref(),
            socket.as_os_str(),
            "--image".as_ref(),
            image.as_os_str(),
        ])
        .unwrap();
        assert_eq!(cli.serve.pci_identity, crate::pci::PciIdentity::IntelApl);
        let e = serve(&cli.serve).unwrap_err();
        assert!(e.contains("--packing: for --transport blk only"), "{e}");
        assert!(!socket.exists() && !image.exists());
    }
}
