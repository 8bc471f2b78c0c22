//! Moving descriptor chains to a virtio-mmc device and back.
//!
//! A [`Transport`] owns memory the device can reach and runs one descriptor chain at a
//! time on a queue: the caller lays out the header, data and response in [`Transport::mem`],
//! names them as [`Desc`]s, and gets the used length back once the device has used the
//! chain. [`VhostUserTransport`] does that over a vhost-user socket with the
//! `virtio-driver` crate (the daemon `vhost-user-emmc serve --transport mmc`);
//! [`crate::loopback::Loopback`] is an in-process device for unit tests.

use std::collections::{HashMap, VecDeque};
use std::fs::File;
use std::os::unix::io::{AsRawFd, FromRawFd};
use std::sync::Arc;
use std::time::{Duration, Instant};

use emmc_frontend::mmc::proto::{
    VirtioMmcConfig, VirtioMmcCtrlReq, VirtioMmcCtrlResp, VirtioMmcEvent, CONTROL_QUEUE,
    EVENT_QUEUE, NUM_QUEUES,
};
use memmap2::MmapMut;
use virtio_driver::virtqueue::{Virtqueue, VirtqueueLayout};
use virtio_driver::{
    iovec, EventFd, QueueNotifier, VhostUser, VirtioFeatureFlags, VirtioTransport,
};
use vm_memory::ByteValued;

/// One descriptor of a chain: `len` bytes at `offset` in the transport's memory
/// ([`Transport::mem`]), readable or writable by the device.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Desc {
    pub offset: usize,
    pub len: u32,
    /// Device-writable (the device fills it); else device-readable.
    pub writable: bool,
}

impl Desc {
    pub fn readable(offset: usize, len: u32) -> Desc {
        Desc {
            offset,
            len,
            writable: false,
        }
    }

    pub fn writable(offset: usize, len: u32) -> Desc {
        Desc {
            offset,
            len,
            writable: true,
        }
    }
}

/// `Err(OutOfBounds)` for the first descriptor of `chain` not inside `size` bytes.
pub fn check_bounds(chain: &[Desc], size: usize) -> Result<(), TransportError> {
    match chain.iter().find(|d| {
        d.offset
            .checked_add(d.len as usize)
            .is_none_or(|end| end > size)
    }) {
        Some(d) => Err(TransportError::OutOfBounds {
            offset: d.offset,
            len: d.len,
            size,
        }),
        None => Ok(()),
    }
}

/// Why the transport could not carry a chain. The device's own verdict on a request
/// (`status` IOERR, an R1 error bit) is not an error here.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TransportError {
    #[error("cannot attach to {path}: {reason}")]
    Connect { path: String, reason: String },
    #[error("vhost-user set-up: {0}")]
    Setup(String),
    #[error("the device did not offer VIRTIO_F_VERSION_1")]
    NoVersion1,
    #[error("the device is gone (socket closed): {0}")]
    Disconnected(String),
    #[error("no completion on queue {queue} after {waited:?}")]
    Timeout { queue: usize, waited: Duration },
    #[error("queue {queue} has no free descriptors for a chain of {descs}")]
    QueueFull { queue: usize, descs: usize },
    #[error("descriptor {offset:#x}+{len} lies outside the {size}-byte shared memory")]
    OutOfBounds {
        offset: usize,
        len: u32,
        size: usize,
    },
    #[error("queue {0} does not exist")]
    NoSuchQueue(usize),
    #[error("the device broke the protocol: {0}")]
    Protocol(String),
    #[error("notify: {0}")]
    Notify(String),
}

/// Something that carries virtio-mmc descriptor chains to a device.
pub trait Transport {
    /// The device's configuration space, as read at attach time.
    fn config(&self) -> VirtioMmcConfig;
    /// Memory shared with the device for request chains (headers, data, responses).
    fn mem(&mut self) -> &mut [u8];
    fn mem_ref(&self) -> &[u8];
    /// Make one chain of `mem` ranges available on `queue`, notify the device and wait
    /// until it has used the chain; the used length (bytes the device wrote).
    fn run(&mut self, queue: usize, chain: &[Desc]) -> Result<u32, TransportError>;
    /// One control request on the control queue, in memory of the transport's own.
    fn control(&mut self, req: &VirtioMmcCtrlReq) -> Result<VirtioMmcCtrlResp, TransportError>;
    /// Events the device delivered on the event queue since the last call (the buffers
    /// are given back to the device).
    fn take_events(&mut self) -> Result<Vec<VirtioMmcEvent>, TransportError>;
}

/// Options for attaching to a vhost-user socket.
#[derive(Debug, Clone)]
pub struct VhostUserOptions {
    /// Entries of each virtqueue (a power of two the device accepts).
    pub queue_size: u16,
    /// Negotiate VIRTIO_RING_F_EVENT_IDX when offered.
    pub event_idx: bool,
    /// Busy-poll the used ring this long before sleeping on the call eventfd.
    pub spin: Duration,
    /// Give up on a chain after this long without a completion.
    pub timeout: Duration,
    /// Bytes of shared memory for request chains (at least the device's `max_req_size`
    /// plus room for a header and a response is taken in any case).
    pub mem_size: usize,
    /// Event buffers kept on the event queue.
    pub event_buffers: usize,
    /// Kick on every chain, even where the device asked not to be notified.
    pub always_kick: bool,
}

impl Default for VhostUserOptions {
    fn default() -> Self {
        VhostUserOptions {
            queue_size: 256,
            event_idx: true,
            spin: Duration::from_micros(50),
            timeout: Duration::from_secs(60),
            mem_size: 4 << 20,
            event_buffers: 16,
            always_kick: false,
        }
    }
}

/// The configuration space as plain bytes (no alignment demand on the transport's
/// buffer); decoded into [`VirtioMmcConfig`].
#[repr(C)]
#[derive(Clone, Copy)]
struct RawConfig([u8; std::mem::size_of::<VirtioMmcConfig>()]);

// SAFETY: a byte array: any bit pattern is valid, no padding, no pointers.
unsafe impl virtio_driver::ByteValued for RawConfig {}

/// The virtqueues' per-request data: none (headers and responses live in `mem`).
type NoReqData = ();

/// Room before the request area: control request and response, event buffers.
const CTRL_REQ_OFF: usize = 0;
const CTRL_RESP_OFF: usize = 64;
const EVENT_OFF: usize = 128;
const EVENT_STRIDE: usize = 32;

/// A virtio-mmc device behind a vhost-user socket, attached with `virtio-driver`'s
/// vhost-user transport. The driver's memory is one memfd mapped into the device with
/// `VHOST_USER_ADD_MEM_REG`: a small area for control requests and event buffers, then
/// the request area returned by [`Transport::mem`].
pub struct VhostUserTransport {
    // Field order matters: the queues point into the vhost transport's ring memory and are
    // dropped before it.
    queues: Vec<Virtqueue<'static, NoReqData>>,
    kick: Vec<Box<dyn QueueNotifier>>,
    call: Vec<Arc<EventFd>>,
    /// Completions taken off a used ring while waiting for another chain: (id, len).
    done: Vec<VecDeque<(u16, u32)>>,
    /// Used-ring entries consumed per queue (to find each entry's length).
    consumed: Vec<u16>,
    /// Event buffers on the event queue: chain id → offset.
    event_bufs: HashMap<u16, usize>,
    mmap: MmapMut,
    _mem_file: File,
    /// Where the request area starts in `mmap`.
    req_base: usize,
    vhost: VhostUser<RawConfig, NoReqData>,
    cfg: VirtioMmcConfig,
    features: u64,
    opts: VhostUserOptions,
    path: String,
}

fn setup_err(what: &str) -> impl Fn(std::io::Error) -> TransportError + '_ {
    move |e| TransportError::Setup(format!("{what}: {e}"))
}

impl VhostUserTransport {
    /// Attach to the device at `path` with default options.
    pub fn connect(path: &str) -> Result<VhostUserTransport, TransportError> {
        VhostUserTransport::connect_with(path, VhostUserOptions::default())
    }

    /// Attach to the device at `path`: negotiate VERSION_1 (and EVENT_IDX), read the
    /// configuration space, set up the three virtqueues, map the driver's memory and
    /// queue the event buffers.
    pub fn connect_with(
        path: &str,
        opts: VhostUserOptions,
    ) -> Result<VhostUserTransport, TransportError> {
        let mut wanted = VirtioFeatureFlags::VERSION_1;
        if opts.event_idx {
            wanted |= VirtioFeatureFlags::RING_EVENT_IDX;
        }
        let mut vhost =
            VhostUser::<RawConfig, NoReqData>::new(path, wanted.bits()).map_err(|e| {
                TransportError::Connect {
                    path: path.to_string(),
                    reason: e.to_string(),
                }
            })?;
        let features = VirtioTransport::get_features(&vhost);
        let flags = VirtioFeatureFlags::from_bits_truncate(features);
        if !flags.contains(VirtioFeatureFlags::VERSION_1) {
            return Err(TransportError::NoVersion1);
        }
        if let Some(n) = VirtioTransport::max_queues(&vhost) {
            if n < NUM_QUEUES {
                return Err(TransportError::Setup(format!(
                    "the device has {n} queues, virtio-mmc needs {NUM_QUEUES}"
                )));
            }
        }
        let raw = VirtioTransport::get_config(&vhost).map_err(setup_err("GET_CONFIG"))?;
        let mut cfg = VirtioMmcConfig::default();
        cfg.as_mut_slice().copy_from_slice(&raw.0);
        log::info!("virtio-mmc at {path}: features {features:#x}, config {cfg:?}");

        let layout = VirtqueueLayout::new::<NoReqData>(NUM_QUEUES, opts.queue_size.into(), flags)
            .map_err(setup_err("virtqueue layout"))?;
        let translators: Vec<_> = (0..NUM_QUEUES)
            .map(|_| VirtioTransport::iova_translator(&vhost))
            .collect();
        let ring_mem = VirtioTransport::alloc_queue_mem(&mut vhost, &layout)
            .map_err(setup_err("ring memory"))?;
        let ring_ptr = ring_mem.as_mut_ptr();
        let mut queues = Vec::with_capacity(NUM_QUEUES);
        for (i, tr) in translators.into_iter().enumerate() {
            // SAFETY: `alloc_queue_mem` returned `NUM_QUEUES * end_offset` bytes of a memfd
            // mapping owned by `vhost`; queue `i` gets its own disjoint slice of it. The
            // mapping's address does not change when `vhost` moves, and the queues are
            // dropped before `vhost` (field order of `VhostUserTransport`), so the slice
            // outlives every use.
            let slice: &'static mut [u8] = unsafe {
                std::slice::from_raw_parts_mut(
                    ring_ptr.add(i * layout.end_offset),
                    layout.end_offset,
                )
            };
            queues.push(
                Virtqueue::new(tr, slice, opts.queue_size, flags)
                    .map_err(setup_err("virtqueue"))?,
            );
        }
        VirtioTransport::setup_queues(&mut vhost, &queues).map_err(setup_err("queue set-up"))?;

        // The driver's memory: control area, event buffers, then the request area.
        let req_base = 4096
            .max(EVENT_OFF + opts.event_buffers * EVENT_STRIDE)
            .next_multiple_of(4096);
        let req_len = opts
            .mem_size
            .max(cfg.max_req_size as usize + 8192)
            .next_multiple_of(4096);
        let total = req_base + req_len;
        // SAFETY: memfd_create with a NUL-terminated name and no flags has no memory-safety
        // preconditions; the result is checked below.
        let fd = unsafe { libc::memfd_create(c"virtio-mmc-driver".as_ptr(), libc::MFD_CLOEXEC) };
        if fd < 0 {
            return Err(TransportError::Setup(format!(
                "memfd_create: {}",
                std::io::Error::last_os_error()
            )));
        }
        // SAFETY: `fd` is a new descriptor that nothing else owns.
        let mem_file = unsafe { File::from_raw_fd(fd) };
        mem_file
            .set_len(total as u64)
            .map_err(setup_err("driver memory size"))?;
        // SAFETY: the memfd is private to this process and the device; the device writes
        // only into buffers a chain made writable, and this driver reads them only after
        // the chain was used (the used ring's index is loaded with Acquire ordering).
        let mut mmap = unsafe { MmapMut::map_mut(&mem_file) }.map_err(setup_err("mmap"))?;
        VirtioTransport::map_mem_region(
            &mut vhost,
            mmap.as_mut_ptr() as usize,
            total,
            mem_file.as_raw_fd(),
            0,
        )
        .map_err(setup_err("ADD_MEM_REG"))?;

        let kick = (0..NUM_QUEUES)
            .map(|q| VirtioTransport::get_submission_notifier(&vhost, q))
            .collect();
        let call = (0..NUM_QUEUES)
            .map(|q| VirtioTransport::get_completion_fd(&vhost, q))
            .collect();
        for q in queues.iter_mut() {
            q.set_used_notif_enabled(true);
        }
        let mut t = VhostUserTransport {
            queues,
            kick,
            call,
            done: (0..NUM_QUEUES).map(|_| VecDeque::new()).collect(),
            consumed: vec![0; NUM_QUEUES],
            event_bufs: HashMap::new(),
            mmap,
            _mem_file: mem_file,
            req_base,
            vhost,
            cfg,
            features,
            opts,
            path: path.to_string(),
        };
        for i in 0..t.opts.event_buffers {
            t.post_event_buffer(EVENT_OFF + i * EVENT_STRIDE)?;
        }
        if t.opts.event_buffers > 0 {
            t.notify(EVENT_QUEUE)?;
        }
        Ok(t)
    }

    /// The negotiated virtio features.
    pub fn features(&self) -> u64 {
        self.features
    }

    pub fn options(&self) -> &VhostUserOptions {
        &self.opts
    }

    /// Change how long to busy-poll before sleeping (the benchmark spins longer).
    pub fn set_spin(&mut self, spin: Duration) {
        self.opts.spin = spin;
    }

    fn post_event_buffer(&mut self, off: usize) -> Result<(), TransportError> {
        let len = std::mem::size_of::<VirtioMmcEvent>() as u32;
        self.mmap[off..off + len as usize].fill(0);
        let id = self.add_abs(EVENT_QUEUE, &[Desc::writable(off, len)])?;
        self.event_bufs.insert(id, off);
        Ok(())
    }

    /// Make a chain whose offsets are relative to the whole mapping available.
    fn add_abs(&mut self, queue: usize, chain: &[Desc]) -> Result<u16, TransportError> {
        let base = self.mmap.as_mut_ptr();
        check_bounds(chain, self.mmap.len())?;
        let vq = self
            .queues
            .get_mut(queue)
            .ok_or(TransportError::NoSuchQueue(queue))?;
        vq.add_request(|_, add| {
            for d in chain {
                add(
                    iovec {
                        // SAFETY (pointer arithmetic): checked above to lie in the mapping.
                        iov_base: unsafe { base.add(d.offset) }.cast(),
                        iov_len: d.len as usize,
                    },
                    d.writable,
                )?;
            }
            Ok(())
        })
        .map_err(|_| TransportError::QueueFull {
            queue,
            descs: chain.len(),
        })
    }

    fn notify(&mut self, queue: usize) -> Result<(), TransportError> {
        if self.queues[queue].avail_notif_needed() || self.opts.always_kick {
            self.kick[queue]
                .notify()
                .map_err(|e| TransportError::Notify(e.to_string()))?;
        }
        Ok(())
    }

    /// Make a chain of request-area ranges available on `queue` and notify the device;
    /// its chain id. Wait for it with [`VhostUserTransport::wait`].
    pub fn submit(&mut self, queue: usize, chain: &[Desc]) -> Result<u16, TransportError> {
        let abs: Vec<Desc> = chain
            .iter()
            .map(|d| Desc {
                offset: d.offset.saturating_add(self.req_base),
                ..*d
            })
            .collect();
        check_bounds(chain, self.mmap.len() - self.req_base)?;
        let id = self.add_abs(queue, &abs)?;
        self.notify(queue)?;
        Ok(id)
    }

    /// Take one used chain off `queue`'s used ring: (chain id, used length).
    fn pop_used(&mut self, queue: usize) -> Option<(u16, u32)> {
        let vq = &mut self.queues[queue];
        let qsize = usize::from(vq.queue_size());
        let used = vq.device_area_ptr();
        let mut it = vq.completions();
        if !it.has_next() {
            return None;
        }
        let slot = usize::from(self.consumed[queue]) % qsize;
        // SAFETY: the used ring (`struct virtq_used`: le16 flags, le16 idx, then
        // `queue_size` elements of le32 id, le32 len) starts at `device_area_ptr` in the
        // ring memory this transport owns; `slot < queue_size`, so the element lies inside
        // it, 4-byte aligned. `has_next` loaded the used index with Acquire ordering, so
        // the element the device published before it is visible, and the device does not
        // rewrite it before the driver makes more buffers available.
        let len = unsafe {
            u32::from_le(std::ptr::read_volatile(
                used.add(4 + 8 * slot + 4).cast::<u32>(),
            ))
        };
        let c = it.next()?;
        self.consumed[queue] = self.consumed[queue].wrapping_add(1);
        Some((c.id, len))
    }

    /// Wait for any chain on `queue` to be used: (chain id, used length).
    pub fn wait(&mut self, queue: usize) -> Result<(u16, u32), TransportError> {
        if queue >= NUM_QUEUES {
            return Err(TransportError::NoSuchQueue(queue));
        }
        if let Some(c) = self.done[queue].pop_front() {
            return Ok(c);
        }
        let start = Instant::now();
        let mut last_probe = start;
        loop {
            if let Some(c) = self.pop_used(queue) {
                return Ok(c);
            }
            let waited = start.elapsed();
            if waited < self.opts.spin {
                std::hint::spin_loop();
                continue;
            }
            if waited > self.opts.timeout {
                return Err(TransportError::Timeout { queue, waited });
            }
            self.sleep_on_call(queue, Duration::from_millis(20))?;
            if last_probe.elapsed() >= Duration::from_millis(200) {
                last_probe = Instant::now();
                self.probe_alive()?;
            }
        }
    }

    /// Wait for the chain `id` on `queue`, keeping other completions for later.
    fn wait_for(&mut self, queue: usize, id: u16) -> Result<u32, TransportError> {
        if let Some(i) = self.done[queue].iter().position(|&(d, _)| d == id) {
            let (_, len) = self.done[queue].remove(i).expect("found");
            return Ok(len);
        }
        let start = Instant::now();
        let mut last_probe = start;
        loop {
            while let Some((d, len)) = self.pop_used(queue) {
                if d == id {
                    return Ok(len);
                }
                self.done[queue].push_back((d, len));
            }
            let waited = start.elapsed();
            if waited < self.opts.spin {
                std::hint::spin_loop();
                continue;
            }
            if waited > self.opts.timeout {
                return Err(TransportError::Timeout { queue, waited });
            }
            self.sleep_on_call(queue, Duration::from_millis(20))?;
            if last_probe.elapsed() >= Duration::from_millis(200) {
                last_probe = Instant::now();
                self.probe_alive()?;
            }
        }
    }

    /// Sleep until the device signals `queue`'s call eventfd or `max` passes.
    fn sleep_on_call(&mut self, queue: usize, max: Duration) -> Result<(), TransportError> {
        let fd = self.call[queue].as_raw_fd();
        let mut pfd = libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd for a descriptor this transport owns.
        let n = unsafe { libc::poll(&mut pfd, 1, max.as_millis() as libc::c_int) };
        if n > 0 && pfd.revents & libc::POLLIN != 0 {
            // Readable: the read does not block and clears the counter.
            let _ = self.call[queue].read();
        }
        Ok(())
    }

    /// A vhost-user round trip (GET_CONFIG): fails when the daemon has gone away.
    fn probe_alive(&self) -> Result<(), TransportError> {
        VirtioTransport::get_config(&self.vhost)
            .map(|_| ())
            .map_err(|e| TransportError::Disconnected(format!("{}: {e}", self.path)))
    }
}

impl Transport for VhostUserTransport {
    fn config(&self) -> VirtioMmcConfig {
        self.cfg
    }

    fn mem(&mut self) -> &mut [u8] {
        &mut self.mmap[self.req_base..]
    }

    fn mem_ref(&self) -> &[u8] {
        &self.mmap[self.req_base..]
    }

    fn run(&mut self, queue: usize, chain: &[Desc]) -> Result<u32, TransportError> {
        let id = self.submit(queue, chain)?;
        self.wait_for(queue, id)
    }

    fn control(&mut self, req: &VirtioMmcCtrlReq) -> Result<VirtioMmcCtrlResp, TransportError> {
        let rlen = std::mem::size_of::<VirtioMmcCtrlReq>();
        let slen = std::mem::size_of::<VirtioMmcCtrlResp>();
        self.mmap[CTRL_REQ_OFF..CTRL_REQ_OFF + rlen].copy_from_slice(req.as_slice());
        self.mmap[CTRL_RESP_OFF..CTRL_RESP_OFF + slen].fill(0);
        let id = self.add_abs(
            CONTROL_QUEUE,
            &[
                Desc::readable(CTRL_REQ_OFF, rlen as u32),
                Desc::writable(CTRL_RESP_OFF, slen as u32),
            ],
        )?;
        self.notify(CONTROL_QUEUE)?;
        let used = self.wait_for(CONTROL_QUEUE, id)?;
        if (used as usize) < slen {
            return Err(TransportError::Protocol(format!(
                "control request {} used {used} bytes, its response has {slen}",
                req.kind
            )));
        }
        let mut resp = VirtioMmcCtrlResp::default();
        resp.as_mut_slice()
            .copy_from_slice(&self.mmap[CTRL_RESP_OFF..CTRL_RESP_OFF + slen]);
        Ok(resp)
    }

    fn take_events(&mut self) -> Result<Vec<VirtioMmcEvent>, TransportError> {
        let mut out = Vec::new();
        let len = std::mem::size_of::<VirtioMmcEvent>();
        let mut used = Vec::new();
        while let Some(c) = self.done[EVENT_QUEUE].pop_front() {
            used.push(c);
        }
        while let Some(c) = self.pop_used(EVENT_QUEUE) {
            used.push(c);
        }
        let reposted = !used.is_empty();
        // Read every used buffer before putting any back: reposting hands out the
        // descriptors just freed, whose ids later entries of `used` still name.
        let mut free = Vec::with_capacity(used.len());
        for (id, n) in used {
            let Some(off) = self.event_bufs.remove(&id) else {
                return Err(TransportError::Protocol(format!(
                    "event queue used unknown chain {id}"
                )));
            };
            if n as usize >= len {
                let mut ev = VirtioMmcEvent::default();
                ev.as_mut_slice()
                    .copy_from_slice(&self.mmap[off..off + len]);
                out.push(ev);
            } else {
                log::warn!("event buffer used with {n} bytes");
            }
            free.push(off);
        }
        for off in free {
            self.post_event_buffer(off)?;
        }
        if reposted {
            self.notify(EVENT_QUEUE)?;
        }
        Ok(out)
    }
}
