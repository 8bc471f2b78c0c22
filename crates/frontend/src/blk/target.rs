//! The card behind the frontend: virtio-blk requests become block requests for the MMC
//! block driver ([`MmcBlk`]), which turns them into the MMC requests Linux's driver would
//! send — packed or not, reliable writes, FLUSH_CACHE, CMD35/36/38, HPI and BKOPS by its
//! policies — through the SDHCI controller model to the card, in card time.
//!
//! Requests are submitted at their arrival in card time and complete when the driver says
//! so; the backend decides how far card time may run (to the wall clock with realtime
//! pacing, to the end of the work without). The data moves between the driver's buffers
//! and the guest's through [`GuestData`], keyed by request id and sector.

use std::collections::HashMap;

use vm_memory::{
    Address, Bytes, GuestAddress, GuestAddressSpace, GuestMemory, GuestMemoryAtomic,
    GuestMemoryBackend, GuestMemoryLoadGuard, GuestMemoryMmap,
};

use super::request::{
    copy_to, Limits, Request, RequestKind, Segment, VIRTIO_BLK_ID_BYTES, VIRTIO_BLK_S_IOERR,
    VIRTIO_BLK_S_OK, VIRTIO_BLK_S_UNSUPP,
};
use emmc_card::ext_csd as ext;
use emmc_card::model::DeviceModel;
use emmc_card::registers::decode_cid;
use emmc_card::timing::Nanos;
use emmc_card::{Card, PowerDown};
use emmc_host::blkdrv::{Advance, BlkConfig, BlkData, BlkError, MmcBlk};
use emmc_host::histogram::Histogram;
use emmc_host::iosched::Elevator;
use emmc_host::mmc::{MmcError, MmcHost, MmcHostOps};
use emmc_host::packing::{BlkOp, BlkRequest, PackingMode};
use emmc_host::sdhci::SdhciConfig;

/// Scatter-gather limits advertised to the guest: at most 64 KiB per segment (an ADMA2
/// descriptor) and the host's segment count.
pub const SIZE_MAX: u32 = 65_536;
/// The most segments a request may have (Linux's sdhci: 128).
pub const SEG_MAX: u32 = 128;

/// What the card can do, as the frontend advertises it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Capabilities {
    pub discard: bool,
    pub write_zeroes: bool,
    /// Write zeroes by trim (erased memory reads zero): the device may unmap.
    pub write_zeroes_may_unmap: bool,
    pub secure_erase: bool,
    pub read_only: bool,
}

/// The host driver's policies for the frontend.
#[derive(Debug, Clone, PartialEq)]
pub struct DriverPolicy {
    pub packing: PackingMode,
    pub elevator: Elevator,
}

impl Default for DriverPolicy {
    /// Serve's defaults ([`BlkConfig::served`]).
    fn default() -> Self {
        let served = BlkConfig::served(&Default::default());
        DriverPolicy {
            packing: served.packing,
            elevator: served.elevator,
        }
    }
}

/// A request that finished: its virtqueue head, status, bytes written into the guest's
/// buffers (the status byte not included), and card times.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Finished {
    pub head: u16,
    pub status: u8,
    pub written: u32,
    pub arrival: Nanos,
    pub at: Nanos,
    pub req: Request,
}

/// A request in the driver.
#[derive(Debug)]
struct InFlight {
    head: u16,
    req: Request,
    arrival: Nanos,
    /// Sectors (data requests) or completions (others) still to come.
    left: u64,
    status: u8,
}

/// The driver's data path into guest memory, and the requests in flight.
#[derive(Default)]
pub struct GuestData {
    mem: Option<GuestMemoryAtomic<GuestMemoryMmap>>,
    reqs: HashMap<u64, InFlight>,
    /// The guest memory a slice handed out by `read_target`/`write_source` points into,
    /// held so that it stays mapped while the slice lives.
    held: Option<GuestMemoryLoadGuard<GuestMemoryMmap>>,
}

/// The guest addresses holding bytes `[offset, offset + len)` of a request's data, as
/// (address, range of those bytes).
fn guest_pieces(
    segs: &[Segment],
    offset: u64,
    len: usize,
) -> impl Iterator<Item = (GuestAddress, std::ops::Range<usize>)> + '_ {
    let mut skip = offset;
    let mut pos = 0usize;
    segs.iter().filter_map(move |s| {
        let seg_len = u64::from(s.len);
        if skip >= seg_len || pos == len {
            skip = skip.saturating_sub(seg_len);
            return None;
        }
        let n = ((seg_len - skip) as usize).min(len - pos);
        let piece = (s.addr.unchecked_add(skip), pos..pos + n);
        pos += n;
        skip = 0;
        Some(piece)
    })
}

/// Where bytes `[offset, offset + len)` of the data in `segs` lie in this process's
/// memory, when they are one contiguous piece of one region of `mem`.
fn contiguous_in(
    mem: &GuestMemoryMmap,
    segs: &[Segment],
    offset: u64,
    len: usize,
) -> Option<*mut u8> {
    let mut pieces = guest_pieces(segs, offset, len);
    let (first, r) = pieces.next()?;
    let mut end = first.checked_add(r.len() as u64)?;
    let mut covered = r.len();
    for (at, r) in pieces {
        if at != end {
            return None;
        }
        end = at.checked_add(r.len() as u64)?;
        covered += r.len();
    }
    if covered != len {
        return None;
    }
    Some(mem.get_slice(first, len).ok()?.ptr_guard_mut().as_ptr())
}

impl GuestData {
    /// The request `req` belongs to, the byte offset of `lba` in its data and the guest
    /// memory; `None` (and a log line) when it is gone.
    fn locate(
        &mut self,
        req: &BlkRequest,
        lba: u64,
    ) -> Option<(&mut InFlight, u64, GuestMemoryLoadGuard<GuestMemoryMmap>)> {
        let mem = self.mem.as_ref()?.memory();
        let f = self.reqs.get_mut(&req.id)?;
        let offset = lba.checked_sub(f.req.sector)? * 512;
        Some((f, offset, mem))
    }

    /// Where `req`'s data from `lba` on lies in this process's memory, when its `len`
    /// bytes are one contiguous piece of one guest memory region (a buffer the guest
    /// split into descriptors of at most 64 KiB usually is); the mapping is then held
    /// in `self.held`.
    fn contiguous(&mut self, req: &BlkRequest, lba: u64, len: usize) -> Option<*mut u8> {
        let (f, offset, mem) = self.locate(req, lba)?;
        let ptr = contiguous_in(&mem, &f.req.data, offset, len)?;
        self.held = Some(mem);
        Some(ptr)
    }

    fn unmapped(f: &mut InFlight, offset: u64) {
        log::warn!(
            "request {}: guest buffer at byte {offset} is not mapped any more",
            f.head
        );
        f.status = VIRTIO_BLK_S_IOERR;
    }
}

impl BlkData for GuestData {
    fn write_data(&mut self, req: &BlkRequest, lba: u64, buf: &mut [u8]) {
        let Some((f, offset, mem)) = self.locate(req, lba) else {
            buf.fill(0);
            return;
        };
        let len = buf.len();
        let ok = guest_pieces(&f.req.data, offset, len)
            .all(|(at, r)| mem.read_slice(&mut buf[r], at).is_ok());
        if !ok {
            buf.fill(0);
            Self::unmapped(f, offset);
        }
    }

    fn read_data(&mut self, req: &BlkRequest, lba: u64, buf: &[u8]) {
        let Some((f, offset, mem)) = self.locate(req, lba) else {
            return;
        };
        let ok = guest_pieces(&f.req.data, offset, buf.len())
            .all(|(at, r)| mem.write_slice(&buf[r], at).is_ok());
        if !ok {
            Self::unmapped(f, offset);
        }
    }

    fn read_target(&mut self, req: &BlkRequest, lba: u64, len: usize) -> Option<&mut [u8]> {
        let ptr = self.contiguous(req, lba, len)?;
        // SAFETY: `contiguous` checked that `len` bytes from `ptr` lie in one mapped guest
        // memory region, and `self.held` keeps that mapping alive for as long as this
        // borrow of `self`. The bytes are the request's device-writable buffer, which the
        // guest handed to the device until the request completes (virtio 1.2, 2.7.13):
        // nothing else in this process touches them meanwhile, and the card only stores
        // into them. A guest that writes its own buffer anyway only garbles its own data,
        // as it would with volatile copies.
        Some(unsafe { std::slice::from_raw_parts_mut(ptr, len) })
    }

    fn write_source(&mut self, req: &BlkRequest, lba: u64, len: usize) -> Option<&[u8]> {
        let ptr = self.contiguous(req, lba, len)?;
        // SAFETY: as in `read_target`: `len` mapped bytes kept mapped by `self.held`, the
        // request's device-readable buffer, which the card only copies from. A guest that
        // changes it during the request sends whatever the copy saw, as with a real DMA.
        Some(unsafe { std::slice::from_raw_parts(ptr, len) })
    }
}

/// The GET_ID string: manufacturer, product name and serial from the CID, NUL-padded.
pub fn serial_from_cid(cid: &[u8; 16], ext_csd_rev: u8) -> [u8; VIRTIO_BLK_ID_BYTES] {
    let f = decode_cid(cid, ext_csd_rev);
    let text = format!("EMMC{:02X}{}{:08X}", f.mid, f.pnm.trim(), f.psn);
    let mut id = [0u8; VIRTIO_BLK_ID_BYTES];
    for (d, s) in id
        .iter_mut()
        .zip(text.bytes().filter(u8::is_ascii_alphanumeric))
    {
        *d = s;
    }
    id
}

/// The card behind the frontend, driven by the MMC block driver.
pub struct CardTarget {
    drv: MmcBlk<MmcHost, GuestData>,
    /// Modelled latency (arrival to completion, card time) of reads and of writes.
    read_latency: Histogram,
    write_latency: Histogram,
    caps: Capabilities,
    limits: Limits,
    serial: [u8; VIRTIO_BLK_ID_BYTES],
    next_id: u64,
    finished: Vec<Finished>,
}

fn driver_config(model: &DeviceModel, policy: &DriverPolicy) -> BlkConfig {
    BlkConfig {
        packing: policy.packing,
        elevator: policy.elevator,
        ..BlkConfig::served(&model.host)
    }
}

impl CardTarget {
    /// Bring `card` up as Linux's driver would with the host of `model.host`.
    pub fn new(card: Card, model: &DeviceModel, policy: &DriverPolicy) -> Result<Self, MmcError> {
        CardTarget::with_cmd_log(card, model, policy, None)
    }

    /// [`CardTarget::new`] with a command log on the controller from the bring-up on.
    pub fn with_cmd_log(
        card: Card,
        model: &DeviceModel,
        policy: &DriverPolicy,
        cmd_log: Option<emmc_host::cmdlog::CmdLog>,
    ) -> Result<Self, MmcError> {
        let mut host = MmcHost::with_config(card, SdhciConfig::for_model(&model.host));
        host.sdhci.set_cmd_log(cmd_log);
        let cfg = driver_config(model, policy);
        let drv = MmcBlk::probe_with_data(host, cfg, GuestData::default())?;
        let cfg = drv.config();
        let e = drv.card().ext_csd;
        let sectors = drv.sectors();
        let features = e[ext::SEC_FEATURE_SUPPORT];
        let trim = features & ext::SEC_GB_CL_EN != 0;
        let caps = Capabilities {
            discard: true,
            write_zeroes: true,
            write_zeroes_may_unmap: trim && e[ext::ERASED_MEM_CONT] & 1 == 0,
            secure_erase: features & ext::SECURE_ER_EN != 0,
            read_only: drv.host().card.user_area_write_protected(),
        };
        let serial = serial_from_cid(&drv.host().card.cid(), e[ext::EXT_CSD_REV]);
        let max_range_sectors = u32::try_from(sectors.min(u64::from(u32::MAX))).unwrap_or(u32::MAX);
        Ok(CardTarget {
            limits: Limits {
                capacity: sectors,
                size_max: SIZE_MAX,
                seg_max: cfg.max_segments.min(SEG_MAX),
                // What a driver honouring seg_max and size_max can form; the MMC driver
                // splits it into requests of its max_sectors.
                max_sectors: cfg.max_segments.min(SEG_MAX) * (SIZE_MAX / 512),
                max_ranges: 1,
                max_range_sectors,
            },
            drv,
            read_latency: Histogram::new(),
            write_latency: Histogram::new(),
            caps,
            serial,
            next_id: 0,
            finished: Vec::new(),
        })
    }

    pub fn limits(&self) -> Limits {
        self.limits
    }

    pub fn capabilities(&self) -> Capabilities {
        self.caps
    }

    pub fn serial(&self) -> [u8; VIRTIO_BLK_ID_BYTES] {
        self.serial
    }

    pub fn card(&self) -> &Card {
        &self.drv.host().card
    }

    pub fn driver(&self) -> &MmcBlk<MmcHost, GuestData> {
        &self.drv
    }

    /// The guest memory the data path reads and writes.
    pub fn set_memory(&mut self, mem: Option<GuestMemoryAtomic<GuestMemoryMmap>>) {
        let data = self.drv.data_mut();
        data.mem = mem;
        // Let go of the mapping the last in-place transfer held: a departed guest's
        // memory must not stay mapped until the next session's first request.
        data.held = None;
    }

    /// The earliest arrival among the requests in the driver.
    pub fn oldest_arrival(&self) -> Option<Nanos> {
        self.drv.data().reqs.values().map(|f| f.arrival).min()
    }

    pub fn driver_mut(&mut self) -> &mut MmcBlk<MmcHost, GuestData> {
        &mut self.drv
    }

    /// Modelled latencies of reads and of writes since the daemon started.
    pub fn latencies(&self) -> (&Histogram, &Histogram) {
        (&self.read_latency, &self.write_latency)
    }

    /// Card time now.
    pub fn now(&self) -> Nanos {
        self.drv.now()
    }

    /// Requests submitted and not finished.
    pub fn in_flight(&self) -> usize {
        self.drv.data().reqs.len()
    }

    /// When the driver next has work of its own (see [`MmcBlk::next_event`]).
    pub fn next_event(&self) -> Option<Nanos> {
        self.drv.next_event()
    }

    fn finish_now(&mut self, head: u16, req: Request, arrival: Nanos, status: u8, written: u32) {
        self.finished.push(Finished {
            head,
            status,
            written,
            arrival,
            at: arrival.max(self.drv.now()),
            req,
        });
    }

    /// A checked request from the queue arrives at card time `arrival`. GET_ID and
    /// requests the card cannot take finish at once.
    pub fn submit<M: GuestMemory + ?Sized>(
        &mut self,
        mem: &M,
        head: u16,
        req: Request,
        arrival: Nanos,
    ) {
        // The driver's clock must reach the arrival first (as the block layer's would):
        // what was due before it runs, and the request cannot start before it arrived.
        if arrival > self.drv.now() {
            self.run_until(arrival);
        }
        // The driver may be past the arrival (it was busy with something it could not
        // interrupt, urgent BKOPS say): the request enters its queue then, but its latency
        // counts from when it arrived.
        let queued = arrival.max(self.drv.now());
        let writes = !matches!(
            req.kind,
            RequestKind::Read | RequestKind::GetId | RequestKind::Flush
        );
        if writes && self.caps.read_only {
            log::warn!("request {head}: the user area is write-protected");
            return self.finish_now(head, req, arrival, VIRTIO_BLK_S_IOERR, 0);
        }
        let (op, lba, sectors) = match req.kind {
            RequestKind::GetId => {
                let n = copy_to(mem, &req.data, &self.serial) as u32;
                return self.finish_now(head, req, arrival, VIRTIO_BLK_S_OK, n);
            }
            RequestKind::SecureErase if !self.caps.secure_erase => {
                return self.finish_now(head, req, arrival, VIRTIO_BLK_S_UNSUPP, 0);
            }
            RequestKind::Read => (BlkOp::Read, req.sector, req.data_len / 512),
            RequestKind::Write => (BlkOp::Write, req.sector, req.data_len / 512),
            RequestKind::Flush => (BlkOp::Flush, 0, 0),
            RequestKind::Discard | RequestKind::WriteZeroes | RequestKind::SecureErase => {
                let op = match req.kind {
                    RequestKind::Discard => BlkOp::Discard,
                    RequestKind::WriteZeroes => BlkOp::WriteZeroes,
                    _ => BlkOp::SecureErase,
                };
                // The parser allows one range (max_discard_seg = 1).
                let r = req.ranges[0];
                (op, r.sector, u64::from(r.sectors))
            }
        };
        self.next_id += 1;
        let id = self.next_id;
        let data_op = matches!(op, BlkOp::Read | BlkOp::Write);
        let segments = if data_op { req.data.len() as u32 } else { 1 };
        let block = BlkRequest {
            segments: segments.max(1),
            ..BlkRequest::new(id, op, lba, sectors as u32)
        };
        self.drv.data_mut().reqs.insert(
            id,
            InFlight {
                head,
                req,
                arrival,
                left: if data_op { sectors } else { 1 },
                status: VIRTIO_BLK_S_OK,
            },
        );
        self.drv.submit(block, queued);
    }

    /// The round's requests, before they are submitted: let the image start copying
    /// the reads among them into their guest buffers now, on its helper thread, while
    /// this thread submits them and runs the card model ([`Card::prefetch_user_reads`]);
    /// the card's own read of each then finds the data in place. Nothing the guest sees
    /// changes but the time it takes. The caller submits them and runs the card next
    /// ([`CardTarget::run_until`]), which waits for every copy before it returns, so no
    /// copy outlives the round or lands in a buffer already handed back. `mem` is the
    /// memory the requests were parsed in, which must stay mapped until then (the blk
    /// backend's map cannot change during a round: a memory update takes the lock the
    /// round holds).
    pub fn prefetch_reads<'a>(
        &mut self,
        mem: &GuestMemoryMmap,
        reqs: impl Iterator<Item = &'a Request>,
    ) {
        // Packed reads reach the guest through the driver's buffer (`read_data`), where
        // the card's reads would not meet the copies: only reads the card makes straight
        // into guest memory (`read_target`, for a request in one piece) are prefetched.
        if self.drv.config().packed_reads {
            return;
        }
        let mut targets: Vec<(u64, *mut u8, usize)> = reqs
            .filter(|r| r.kind == RequestKind::Read)
            .filter_map(|r| {
                let len = usize::try_from(r.data_len).ok()?;
                Some((r.sector, contiguous_in(mem, &r.data, 0, len)?, len))
            })
            .collect();
        if targets.len() < emmc_card::store::MIN_PREFETCH_READS {
            return;
        }
        // The elevator hands the card its reads in ascending sector order; the helper
        // starts from the other end, so that the two meet once rather than queue behind
        // each other (the card reads a range itself when it gets there first).
        targets.sort_unstable_by_key(|t| std::cmp::Reverse(t.0));
        // SAFETY: each pointer is the start of `len` bytes of one region of `mem`
        // (`contiguous_in`), which stays mapped for the round (the caller's promise
        // above); the bytes are
        // the device-writable buffer of a read the guest has handed to the device until
        // it completes. Nothing in this process touches them before the card reads into
        // them, since a read in one piece goes through `read_target` into that same
        // memory (packed reads are excluded above), and `run_until` settles every copy
        // before any completion of the round is taken (the backend settles them too when
        // a round ends early, before it releases the lock a memory update needs).
        unsafe { self.drv.host_mut().card.prefetch_user_reads(&targets) };
    }

    /// Run the driver up to card time `until` (`Nanos::MAX`: until every request has
    /// finished, without idling past the last). Finished requests are in
    /// [`CardTarget::take_finished`]. Copies started by [`CardTarget::prefetch_reads`]
    /// are finished when it returns.
    pub fn run_until(&mut self, until: Nanos) {
        loop {
            if until == Nanos::MAX && !self.drv.in_progress() {
                break;
            }
            let state = self.drv.advance(until);
            for c in self.drv.take_completions() {
                self.completed(c.req, c.at, c.result);
            }
            if state != Advance::Completed {
                break;
            }
        }
        self.drv.host_mut().card.settle_prefetches();
    }

    fn completed(&mut self, block: BlkRequest, at: Nanos, result: Result<(), BlkError>) {
        let data = self.drv.data_mut();
        let Some(f) = data.reqs.get_mut(&block.id) else {
            log::error!("completion of unknown request {}", block.id);
            return;
        };
        if let Err(e) = &result {
            log::warn!("request {}: {e}", f.head);
            f.status = match e {
                BlkError::NotSupported(_) => VIRTIO_BLK_S_UNSUPP,
                _ => VIRTIO_BLK_S_IOERR,
            };
        }
        let done = match block.op {
            BlkOp::Read | BlkOp::Write => u64::from(block.sectors),
            _ => 1,
        };
        f.left = f.left.saturating_sub(done);
        if f.left > 0 {
            return;
        }
        let f = data.reqs.remove(&block.id).expect("present above");
        let written = if f.req.kind == RequestKind::Read && f.status == VIRTIO_BLK_S_OK {
            f.req.data_len as u32
        } else {
            0
        };
        match f.req.kind {
            RequestKind::Read => self.read_latency.record(at.saturating_sub(f.arrival)),
            RequestKind::Write => self.write_latency.record(at.saturating_sub(f.arrival)),
            _ => {}
        }
        self.finished.push(Finished {
            head: f.head,
            status: f.status,
            written,
            arrival: f.arrival,
            at,
            req: f.req,
        });
    }

    /// Requests finished since the last call, in completion order.
    pub fn take_finished(&mut self) -> Vec<Finished> {
        std::mem::take(&mut self.finished)
    }

    /// Wait for every copy [`CardTarget::prefetch_reads`] started (`run_until` does it
    /// too; this is for a round that ends before the card ran).
    pub fn settle_prefetches(&mut self) {
        self.drv.host_mut().card.settle_prefetches();
    }

    /// Forget the requests of a frontend that went away.
    fn abandon_requests(&mut self) {
        self.settle_prefetches();
        let n = self.drv.data().reqs.len();
        if n > 0 {
            log::info!("{n} requests of the departed frontend are dropped");
        }
        self.drv.data_mut().reqs.clear();
        self.finished.clear();
    }

    /// The frontend went away: power the card down cleanly (cache written back, image
    /// synced) and bring it up again for the next one, as a rebooted machine would.
    pub fn restart(&mut self) -> Result<(), MmcError> {
        self.abandon_requests();
        // The plan applies to the guest's traffic, not to the backend's own bring-up.
        let faults = self.drv.host_mut().sdhci.take_fault_injector();
        self.shutdown();
        let host = self.drv.host_mut();
        let now = host.now();
        host.card.power_cycle(now, PowerDown::Clean);
        let result = self.drv.reprobe();
        self.drv.host_mut().sdhci.set_fault_injector(faults);
        result
    }

    /// Install a fault injector on the controller (`None` removes it). Bring-up has
    /// happened already: the plan sees the guest's requests.
    pub fn set_fault_injector(&mut self, faults: Option<emmc_host::fault::FaultInjector>) {
        self.drv.host_mut().sdhci.set_fault_injector(faults);
    }

    /// The controller's fault injector, to change its rules at run time.
    pub fn fault_injector_mut(&mut self) -> Option<&mut emmc_host::fault::FaultInjector> {
        self.drv.host_mut().sdhci.fault_injector_mut()
    }

    /// The daemon has ended a round of requests and signalled what finished: the image
    /// gets the small writes the store held back meanwhile.
    pub fn end_batch(&mut self) {
        self.drv.host_mut().card.end_batch();
    }

    /// As `end_batch`, where a completion is due soon: only quick writes of what the
    /// store held, no hand-over to its writer thread (`Card::end_batch_here`).
    pub fn end_batch_here(&mut self) {
        self.drv.host_mut().card.end_batch_here();
    }

    /// The daemon paces completions: the store may hold large writes back until the end
    /// of a round too (`Card::hold_large_writes`).
    pub fn hold_large_writes(&mut self, on: bool) {
        self.drv.host_mut().card.hold_large_writes(on);
    }

    /// Clean shutdown: write the cache back, notify power-off, make the image durable.
    pub fn shutdown(&mut self) {
        let host = self.drv.host_mut();
        if host.card.ext_csd()[ext::CACHE_CTRL] & ext::CACHE_EN != 0 {
            if let Err(e) = host.mmc_flush_cache() {
                log::warn!("flush at shutdown: {e}");
            }
        }
        let now = host.now();
        host.card.power_off(now, PowerDown::Clean);
        host.sdhci.flush_cmd_log();
    }
}
