//! The vfio-user server: the socket, one client's session after another, and what each
//! session leaves behind when it ends.

use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::fs::{DirBuilderExt, FileTypeExt, PermissionsExt};
use std::os::unix::net::UnixListener;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use super::device::PciMmio;
use super::function::{irqs, regions, Backend, Function, PciOptions, PciStats, Session};
use super::timer;
use emmc_card::timing::Nanos;

/// Why the server could not start or go on.
#[derive(Debug, thiserror::Error)]
pub enum PciError {
    #[error("{path}: {source}")]
    Socket {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("BAR0 of {0} bytes: it must be a power of two from 16 bytes to 2 GiB")]
    Bar0Size(u64),
    #[error("starting a session: {0}")]
    Session(#[source] std::io::Error),
    #[error("accepting a client: {0}")]
    Accept(#[source] std::io::Error),
}

/// How a session ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SessionEnd {
    /// The client closed the connection.
    Closed,
    /// The connection failed or a message could not be handled as a whole (the
    /// `vfio_user` server stops at the first such error); the text says what.
    Dropped(String),
    /// The message loop panicked (the `vfio_user` crate does on some malformed
    /// messages); the session was ended as if the client had gone.
    Panicked(String),
}

/// A vfio-user server for one PCI function whose BAR0 is `D`.
pub struct PciServer<D: PciMmio> {
    function: Arc<Function<D>>,
    server: vfio_user::Server,
    /// A second handle on the listening socket, to refuse other clients during a session.
    listener: OwnedFd,
    options: PciOptions,
    /// The socket path this server created (removed when it is dropped).
    path: Option<PathBuf>,
    /// The summary line of the last session that ended.
    last_session: std::sync::Mutex<Option<String>>,
}

impl<D: PciMmio> PciServer<D> {
    /// Create the socket at `path` (owner-only; a stale socket there is replaced, any
    /// other file refused) and serve `device` on it.
    pub fn bind(path: &Path, device: D, options: PciOptions) -> Result<PciServer<D>, PciError> {
        let listener = bind_owner_only(path).map_err(|source| PciError::Socket {
            path: path.to_path_buf(),
            source,
        })?;
        let mut server = PciServer::from_listener(listener, device, options)?;
        server.path = Some(path.to_path_buf());
        Ok(server)
    }

    /// Serve `device` on a socket the caller bound.
    pub fn from_listener(
        listener: UnixListener,
        device: D,
        options: PciOptions,
    ) -> Result<PciServer<D>, PciError> {
        let bar0_size = device.bar0_size();
        if !(bar0_size.is_power_of_two() && (16..=1 << 31).contains(&bar0_size)) {
            return Err(PciError::Bar0Size(bar0_size));
        }
        let spare = listener.try_clone().map_err(PciError::Session)?;
        let server = vfio_user::Server::from_owned_fd(
            OwnedFd::from(listener),
            true,
            irqs(),
            regions(bar0_size),
        );
        Ok(PciServer {
            function: Arc::new(Function::new(device, &options)),
            server,
            listener: OwnedFd::from(spare),
            options,
            path: None,
            last_session: std::sync::Mutex::new(None),
        })
    }

    /// Accept one client and serve it until it leaves; then unmap its DMA regions, drop
    /// its eventfds and power-cycle the device. Errors only when no client can be
    /// accepted or a session cannot start; whatever a client does ends its own session.
    pub fn serve_session(&self) -> Result<SessionEnd, PciError> {
        let session = Arc::new(Session::new().map_err(PciError::Session)?);
        self.function.lock().begin_session(session.clone());
        let timer = timer::spawn(
            self.function.clone(),
            session.clone(),
            self.options.spin.clone(),
        )
        .map_err(PciError::Session)?;
        let mut backend = Backend {
            function: self.function.clone(),
            session: session.clone(),
            listener: Some(self.listener.as_raw_fd()),
            refusing: None,
            first_message: true,
        };
        let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            self.server.run(&mut backend)
        }));
        session.stop();
        let _ = timer.join();
        backend.detached();
        let end = match outcome {
            Ok(Ok(())) => SessionEnd::Closed,
            Ok(Err(vfio_user::Error::SocketAccept(e))) => return Err(PciError::Accept(e)),
            Ok(Err(e)) => SessionEnd::Dropped(e.to_string()),
            Err(panic) => SessionEnd::Panicked(
                panic
                    .downcast_ref::<&str>()
                    .map(|s| s.to_string())
                    .or_else(|| panic.downcast_ref::<String>().cloned())
                    .unwrap_or_else(|| "a panic".into()),
            ),
        };
        match &end {
            SessionEnd::Closed => log::info!("vfio-user client detached"),
            SessionEnd::Dropped(why) => log::warn!("vfio-user client dropped: {why}"),
            SessionEnd::Panicked(why) => {
                log::error!("vfio-user session ended by a panic in its message loop: {why}")
            }
        }
        let mut inner = self.function.lock();
        if let Some(summary) = inner.take_summary() {
            log::info!("pci session: {summary}");
            *self.last_session.lock().unwrap_or_else(|p| p.into_inner()) = Some(summary);
        }
        inner.end_session();
        Ok(end)
    }

    /// Serve clients one after another until `stop` is set (it is read between
    /// sessions: a server waiting for a client goes on waiting).
    pub fn serve(&self, stop: &AtomicBool) -> Result<(), PciError> {
        while !stop.load(Ordering::SeqCst) {
            self.serve_session()?;
        }
        Ok(())
    }

    /// Run `f` on the device, between two register accesses.
    pub fn with_device<R>(&self, f: impl FnOnce(&mut D) -> R) -> R {
        f(&mut self.function.lock().device)
    }

    pub fn stats(&self) -> PciStats {
        self.function.lock().stats.clone()
    }

    /// The `pci session:` line of the last session that ended: its length, the BAR
    /// accesses and how long each took, the client's round trip, the guest's answer to
    /// an interrupt and the timer thread's wake-ups.
    pub fn last_session(&self) -> Option<String> {
        self.last_session
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// A handle on the function for other threads (a control socket, a signal handler).
    pub fn handle(&self) -> PciHandle<D> {
        PciHandle {
            function: self.function.clone(),
        }
    }

    /// DMA maps held now: all of them, and those the device can reach.
    pub fn dma_maps(&self) -> (usize, usize) {
        self.function.lock().dma.count()
    }
}

/// The function as other threads reach it: between two register accesses, under the
/// same lock.
pub struct PciHandle<D: PciMmio> {
    function: Arc<Function<D>>,
}

impl<D: PciMmio> Clone for PciHandle<D> {
    fn clone(&self) -> Self {
        PciHandle {
            function: self.function.clone(),
        }
    }
}

impl<D: PciMmio> PciHandle<D> {
    /// Run `f` on the device at the current card time, after what was due by then has
    /// run; then set the line, and wake the timer thread if `f` made an event sooner.
    pub fn with_device_now<R>(&self, f: impl FnOnce(&mut D, Nanos) -> R) -> R {
        let mut inner = self.function.lock();
        let now = inner.time.current();
        inner.advance(now);
        let r = f(&mut inner.device, now);
        inner.update_intx();
        inner.wake_if_sooner();
        r
    }

    pub fn stats(&self) -> PciStats {
        self.function.lock().stats.clone()
    }

    /// The summary line of the session in progress, so far (None between clients).
    pub fn live_session(&self) -> Option<String> {
        self.function.lock().summary()
    }

    /// Log the summary of the session in progress, if there is one whose end has not
    /// logged it (the daemon is stopping with a client attached, or before the
    /// message thread has seen the client go); returns the line logged.
    pub fn log_live_session(&self, why: &str) -> Option<String> {
        let summary = self.function.lock().take_summary()?;
        log::info!("pci session ({why}): {summary}");
        Some(summary)
    }
}

impl<D: PciMmio> Drop for PciServer<D> {
    fn drop(&mut self) {
        if let Some(p) = &self.path {
            let _ = std::fs::remove_file(p);
        }
    }
}

/// Bind a Unix socket at `path` that only its owner can connect to, with no moment at
/// which it is reachable with wider permissions: it is bound in a private directory,
/// restricted, then renamed into place.
fn bind_owner_only(path: &Path) -> std::io::Result<UnixListener> {
    match std::fs::symlink_metadata(path) {
        Ok(m) if m.file_type().is_socket() => std::fs::remove_file(path)?,
        Ok(_) => {
            return Err(std::io::Error::new(
                std::io::ErrorKind::AlreadyExists,
                "exists and is not a socket",
            ))
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(e),
    }
    let parent = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    };
    let name = path
        .file_name()
        .ok_or_else(|| std::io::Error::other("no file name"))?;
    let mut private = parent.join(format!(
        ".{}.{}",
        name.to_string_lossy(),
        std::process::id()
    ));
    private.as_mut_os_string().push(".d");
    std::fs::DirBuilder::new().mode(0o700).create(&private)?;
    let inner = private.join("sock");
    let result = (|| {
        let listener = UnixListener::bind(&inner)?;
        std::fs::set_permissions(&inner, std::fs::Permissions::from_mode(0o600))?;
        std::fs::rename(&inner, path)?;
        Ok(listener)
    })();
    let _ = std::fs::remove_file(&inner);
    let _ = std::fs::remove_dir(&private);
    result
}
