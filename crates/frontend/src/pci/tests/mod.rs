//! The PCI function over a real socket: a fake device behind BAR0, the `vfio_user`
//! client for what a well-behaved VMM does, and raw messages (`wire.rs`) for what a
//! hostile one does (the crate's client reads a success reply even after an error).

mod hostile;
mod session;
mod wire;

use std::fs::File;
use std::os::fd::{AsRawFd, FromRawFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use vmm_sys_util::epoll::{ControlOperation, Epoll, EpollEvent, EventSet};
use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};

use super::{DmaMemory, PciMmio, PciOptions, PciServer};
use crate::pacing::{Pacing, SpinMargin};
use emmc_card::timing::Nanos;

/// The fake device's registers (BAR0, 256 bytes, little-endian).
pub(crate) mod reg {
    /// Any width, read back as written.
    pub const SCRATCH: u64 = 0x00;
    /// DMA source and destination bus addresses (8 bytes each).
    pub const SRC: u64 = 0x08;
    pub const DST: u64 = 0x10;
    /// Bytes to copy (4).
    pub const LEN: u64 = 0x18;
    /// Card time from GO to the copy and its interrupt (4, nanoseconds).
    pub const DELAY: u64 = 0x1c;
    /// Any write starts the copy (4).
    pub const GO: u64 = 0x20;
    /// DONE and DMA_ERROR; write 1 to clear (4). The line is asserted while it is not 0.
    pub const STATUS: u64 = 0x24;
    /// The card time of this access (8, read-only).
    pub const NOW: u64 = 0x28;
    /// Any write sets DONE at once (4).
    pub const RAISE: u64 = 0x30;
    pub const DONE: u32 = 1;
    pub const DMA_ERROR: u32 = 2;
}

/// What the fake device saw, for the tests to look at while it is served.
#[derive(Debug, Default)]
pub(crate) struct FakeLog {
    /// (write, offset, length) of every BAR access.
    pub accesses: Vec<(bool, u64, usize)>,
    pub resets: u32,
    pub power_cycles: u32,
    /// The `now` of every call, to check card time never goes back.
    pub times: Vec<Nanos>,
    pub copies: u32,
}

/// A register that copies `LEN` bytes from `SRC` to `DST` by DMA `DELAY` ns of card time
/// after `GO`, then raises its interrupt.
pub(crate) struct Fake {
    regs: [u8; 256],
    status: u32,
    due: Option<Nanos>,
    log: Arc<Mutex<FakeLog>>,
}

impl Fake {
    fn new(log: Arc<Mutex<FakeLog>>) -> Fake {
        Fake {
            regs: [0; 256],
            status: 0,
            due: None,
            log,
        }
    }

    fn u64_at(&self, at: u64) -> u64 {
        let at = at as usize;
        u64::from_le_bytes(self.regs[at..at + 8].try_into().unwrap())
    }

    fn u32_at(&self, at: u64) -> u32 {
        let at = at as usize;
        u32::from_le_bytes(self.regs[at..at + 4].try_into().unwrap())
    }

    fn seen(&self, now: Nanos) {
        self.log.lock().unwrap().times.push(now);
    }

    fn copy(&mut self, dma: &dyn DmaMemory) {
        let mut buf = vec![0; self.u32_at(reg::LEN) as usize];
        let result = dma
            .read(self.u64_at(reg::SRC), &mut buf)
            .and_then(|()| dma.write(self.u64_at(reg::DST), &buf));
        self.status |= reg::DONE;
        if result.is_err() {
            self.status |= reg::DMA_ERROR;
        }
        self.log.lock().unwrap().copies += 1;
    }
}

fn touches(offset: u64, len: usize, reg: u64) -> bool {
    offset <= reg && reg < offset + len as u64
}

impl PciMmio for Fake {
    fn read(&mut self, now: Nanos, offset: u64, data: &mut [u8], _dma: &dyn DmaMemory) {
        self.seen(now);
        self.log
            .lock()
            .unwrap()
            .accesses
            .push((false, offset, data.len()));
        self.regs[reg::STATUS as usize..][..4].copy_from_slice(&self.status.to_le_bytes());
        self.regs[reg::NOW as usize..][..8].copy_from_slice(&now.to_le_bytes());
        let at = offset as usize;
        data.copy_from_slice(&self.regs[at..at + data.len()]);
    }

    fn write(&mut self, now: Nanos, offset: u64, data: &[u8], _dma: &dyn DmaMemory) {
        self.seen(now);
        self.log
            .lock()
            .unwrap()
            .accesses
            .push((true, offset, data.len()));
        if touches(offset, data.len(), reg::STATUS) {
            let mut w1c = [0u8; 4];
            let from = reg::STATUS.saturating_sub(offset) as usize;
            let n = data.len().min(4);
            w1c[..n].copy_from_slice(&data[from..from + n]);
            self.status &= !u32::from_le_bytes(w1c);
            return;
        }
        let at = offset as usize;
        self.regs[at..at + data.len()].copy_from_slice(data);
        if touches(offset, data.len(), reg::GO) {
            self.due = Some(now + u64::from(self.u32_at(reg::DELAY)));
        }
        if touches(offset, data.len(), reg::RAISE) {
            self.status |= reg::DONE;
        }
    }

    fn advance(&mut self, now: Nanos, dma: &dyn DmaMemory) {
        self.seen(now);
        if self.due.is_some_and(|d| d <= now) {
            self.due = None;
            self.copy(dma);
        }
    }

    fn next_event(&self) -> Option<Nanos> {
        self.due
    }

    fn irq_asserted(&self) -> bool {
        self.status != 0
    }

    fn reset(&mut self) {
        self.regs = [0; 256];
        self.status = 0;
        self.due = None;
        self.log.lock().unwrap().resets += 1;
    }

    fn power_cycle(&mut self, now: Nanos) {
        self.seen(now);
        self.regs = [0; 256];
        self.status = 0;
        self.due = None;
        self.log.lock().unwrap().power_cycles += 1;
    }
}

/// A server on a socket in a private directory, serving sessions on its own thread
/// until the rig is dropped.
pub(crate) struct Rig {
    pub server: Arc<PciServer<Fake>>,
    pub log: Arc<Mutex<FakeLog>>,
    pub path: PathBuf,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
    _dir: tempfile::TempDir,
}

impl Rig {
    pub fn start(pacing: Pacing) -> Rig {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("pci.sock");
        let listener = UnixListener::bind(&path).unwrap();
        let log = Arc::new(Mutex::new(FakeLog::default()));
        let options = PciOptions {
            identity: crate::pci::identity::PciIdentity::Generic,
            pacing,
            spin: SpinMargin::fixed(Duration::from_micros(200)),
        };
        let server =
            Arc::new(PciServer::from_listener(listener, Fake::new(log.clone()), options).unwrap());
        let stop = Arc::new(AtomicBool::new(false));
        let thread = {
            let (server, stop) = (server.clone(), stop.clone());
            std::thread::spawn(move || server.serve(&stop).unwrap())
        };
        Rig {
            server,
            log,
            path,
            stop,
            thread: Some(thread),
            _dir: dir,
        }
    }

    pub fn client(&self) -> vfio_user::Client {
        vfio_user::Client::new(&self.path).unwrap()
    }

    pub fn wire(&self) -> wire::Wire {
        wire::Wire::connect(&self.path)
    }

    /// Wait until `n` sessions have ended.
    pub fn sessions(&self, n: u64) {
        wait_for(|| self.server.stats().sessions >= n, "sessions to end");
    }
}

impl Drop for Rig {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        // Wake the accept with a client that leaves at once.
        let _ = UnixStream::connect(&self.path);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Poll `cond` for up to five seconds.
pub(crate) fn wait_for(mut cond: impl FnMut() -> bool, what: &str) {
    let until = Instant::now() + Duration::from_secs(5);
    while !cond() {
        assert!(Instant::now() < until, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// An eventfd, and the same one as a raw descriptor to send.
pub(crate) struct Irq {
    pub fd: EventFd,
    epoll: Epoll,
}

impl Irq {
    pub fn new() -> Irq {
        let fd = EventFd::new(EFD_NONBLOCK).unwrap();
        let epoll = Epoll::new().unwrap();
        epoll
            .ctl(
                ControlOperation::Add,
                fd.as_raw_fd(),
                EpollEvent::new(EventSet::IN, 0),
            )
            .unwrap();
        Irq { fd, epoll }
    }

    pub fn raw(&self) -> i32 {
        self.fd.as_raw_fd()
    }

    /// How many signals arrive within `timeout` (0 if none).
    pub fn wait(&self, timeout: Duration) -> u64 {
        let mut ev = [EpollEvent::default()];
        let n = self
            .epoll
            .wait(timeout.as_millis() as i32, &mut ev)
            .unwrap();
        if n == 0 {
            return 0;
        }
        self.fd.read().unwrap_or(0)
    }
}

/// A memfd of `len` bytes.
pub(crate) fn memfd(len: u64) -> File {
    let name = c"pci-test";
    // SAFETY: memfd_create with a NUL-terminated name and no flags; the result is
    // checked before it is used.
    let fd = unsafe { libc::memfd_create(name.as_ptr(), 0) };
    assert!(fd >= 0, "memfd_create: {}", std::io::Error::last_os_error());
    // SAFETY: `fd` is a new descriptor that nothing else owns.
    let f = unsafe { File::from_raw_fd(fd) };
    f.set_len(len).unwrap();
    f
}
