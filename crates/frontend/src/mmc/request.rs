//! virtio-mmc descriptor chains → checked requests, and the answers written back into
//! them (docs/virtio-mmc.md, "Request queue", "Control queue", "Event queue").
//!
//! A request chain is one device-readable descriptor holding the 80-byte header, the data
//! buffers (one descriptor each, device-readable for a write, device-writable for a read),
//! and one device-writable descriptor of 112 bytes for the response, last. Everything is
//! checked before anything reaches the card: descriptor directions and lengths, that every
//! descriptor lies inside guest memory, the flags, the commands' opcodes and response
//! types, and the data geometry against the limits in the configuration space. The guest
//! is hostile: a defect is a [`ParseError`] carrying the status to report (IOERR, or
//! UNSUPP for unknown flags) and where the response can be written, if anywhere.
//!
//! The checks work on a plain list of descriptors ([`ChainDesc`]) and guest memory
//! (`parse_*_descs`); `parse_request` / `parse_control` / `parse_event_buffer` take them
//! off a virtqueue's descriptor chain. The backend and the driver's in-process loopback
//! device both go through them, and both answer with [`answer_request`],
//! [`refuse_request`], [`answer_control`] and [`refuse_control`].

use virtio_queue::{desc::split::Descriptor, DescriptorChain};
use vm_memory::{Address, ByteValued, Bytes, GuestAddress, GuestMemory, Permissions};

use super::device::Executed;
use super::proto::*;
use emmc_card::timing::Nanos;
use emmc_host::sdhci::DmaSegment;

/// Wire sizes of the structures a chain carries.
pub const HDR_LEN: u32 = std::mem::size_of::<VirtioMmcReqHdr>() as u32;
pub const RESP_LEN: u32 = std::mem::size_of::<VirtioMmcResp>() as u32;
pub const CTRL_REQ_LEN: u32 = std::mem::size_of::<VirtioMmcCtrlReq>() as u32;
pub const CTRL_RESP_LEN: u32 = std::mem::size_of::<VirtioMmcCtrlResp>() as u32;
pub const EVENT_LEN: u32 = std::mem::size_of::<VirtioMmcEvent>() as u32;

/// The highest CMD index (the Command register keeps 6 bits).
pub const MAX_OPCODE: u8 = 63;

/// What the device advertised in its configuration space; requests beyond are refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    pub max_seg_size: u32,
    pub max_segs: u32,
    pub max_blk_size: u32,
    pub max_blk_count: u32,
    pub max_req_size: u32,
}

impl Limits {
    pub fn from_config(c: &VirtioMmcConfig) -> Limits {
        Limits {
            max_seg_size: c.max_seg_size,
            max_segs: c.max_segs,
            max_blk_size: c.max_blk_size,
            max_blk_count: c.max_blk_count,
            max_req_size: c.max_req_size,
        }
    }
}

/// One data buffer in guest memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Segment {
    pub addr: GuestAddress,
    pub len: u32,
}

/// A checked request: the header, its data buffers (empty without `REQ_F_DATA`) and
/// where the response goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MmcReq {
    pub hdr: VirtioMmcReqHdr,
    pub data: Vec<Segment>,
    pub resp: GuestAddress,
}

impl MmcReq {
    pub fn has(&self, flag: u32) -> bool {
        self.hdr.flags & flag != 0
    }
}

/// A checked control request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CtrlReq {
    pub req: VirtioMmcCtrlReq,
    pub resp: GuestAddress,
}

/// Why a chain is not a valid request. `resp` is where the response can be written, when
/// the chain ends in a writable descriptor large enough to hold one.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{problem}")]
pub struct ParseError {
    pub resp: Option<GuestAddress>,
    pub status: u32,
    pub problem: String,
}

/// One descriptor of a chain as the checks see it: where it is, how long, and which way.
/// [`parse_request`] and friends take them off a virtqueue; an in-process device (the
/// driver's loopback) builds them itself and calls the `*_descs` checks directly.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChainDesc {
    pub addr: GuestAddress,
    pub len: u32,
    /// Device-writable; else device-readable.
    pub writable: bool,
}

impl ChainDesc {
    pub fn new(addr: GuestAddress, len: u32, writable: bool) -> ChainDesc {
        ChainDesc {
            addr,
            len,
            writable,
        }
    }
}

impl From<Descriptor> for ChainDesc {
    fn from(d: Descriptor) -> ChainDesc {
        ChainDesc {
            addr: d.addr(),
            len: d.len(),
            writable: d.is_write_only(),
        }
    }
}

fn chain_descs<M>(chain: DescriptorChain<M>) -> Vec<ChainDesc>
where
    M: std::ops::Deref + Clone,
    M::Target: GuestMemory,
{
    chain.map(ChainDesc::from).collect()
}

/// The first descriptor that does not lie inside guest memory with the access its
/// direction needs.
fn outside<'d, M: GuestMemory + ?Sized>(mem: &M, descs: &'d [ChainDesc]) -> Option<&'d ChainDesc> {
    descs.iter().find(|d| {
        let access = if d.writable {
            Permissions::Write
        } else {
            Permissions::Read
        };
        d.len != 0 && !mem.check_range(d.addr, d.len as usize, access)
    })
}

/// Where a response of `len` bytes can go: the last descriptor, when it is device-writable,
/// at least `len` long and inside guest memory.
fn response_slot<M: GuestMemory + ?Sized>(
    mem: &M,
    descs: &[ChainDesc],
    len: u32,
) -> Option<GuestAddress> {
    let last = descs.last()?;
    (last.writable
        && last.len >= len
        && mem.check_range(last.addr, len as usize, Permissions::Write))
    .then_some(last.addr)
}

fn outside_problem(d: &ChainDesc) -> String {
    format!(
        "descriptor {:#x}+{} lies outside guest memory",
        d.addr.raw_value(),
        d.len
    )
}

fn direction(d: &ChainDesc) -> &'static str {
    if d.writable {
        "device-writable"
    } else {
        "device-readable"
    }
}

/// Check one command of the header.
fn check_cmd(which: &str, c: &VirtioMmcCmd) -> Result<(), String> {
    if c.opcode > MAX_OPCODE {
        return Err(format!("{which}: opcode {} above {MAX_OPCODE}", c.opcode));
    }
    if response_type(c.resp_type).is_none() {
        return Err(format!("{which}: response type {} unknown", c.resp_type));
    }
    Ok(())
}

/// Parse and check a request chain.
pub fn parse_request<M>(chain: DescriptorChain<M>, limits: &Limits) -> Result<MmcReq, ParseError>
where
    M: std::ops::Deref + Clone,
    M::Target: GuestMemory,
{
    let mem = chain.memory();
    parse_request_descs(mem, &chain_descs(chain.clone()), limits)
}

/// Check a request chain given as its descriptors in `mem`.
pub fn parse_request_descs<M: GuestMemory + ?Sized>(
    mem: &M,
    descs: &[ChainDesc],
    limits: &Limits,
) -> Result<MmcReq, ParseError> {
    let resp = response_slot(mem, descs, RESP_LEN);
    let fail = |status: u32, problem: String| ParseError {
        resp,
        status,
        problem,
    };
    let ioerr = |problem: String| fail(STATUS_IOERR, problem);
    if let Some(d) = outside(mem, descs) {
        return Err(ioerr(outside_problem(d)));
    }
    if descs.len() < 2 {
        return Err(ioerr(format!(
            "a request needs a header and a response, the chain has {} descriptors",
            descs.len()
        )));
    }
    let (first, last) = (descs[0], descs[descs.len() - 1]);
    if first.writable || first.len != HDR_LEN {
        return Err(ioerr(format!(
            "the first descriptor must be the device-readable {HDR_LEN}-byte header \
             ({} bytes, {})",
            first.len,
            direction(&first)
        )));
    }
    if !last.writable || last.len != RESP_LEN {
        return Err(ioerr(format!(
            "the last descriptor must be the device-writable {RESP_LEN}-byte response \
             ({} bytes, {})",
            last.len,
            direction(&last)
        )));
    }
    let hdr: VirtioMmcReqHdr = mem
        .read_obj(first.addr)
        .map_err(|e| ioerr(format!("header unreadable: {e}")))?;
    if hdr.flags & !REQ_F_ALL != 0 {
        return Err(fail(
            STATUS_UNSUPP,
            format!("request flags {:#x} not supported", hdr.flags & !REQ_F_ALL),
        ));
    }
    check_cmd("cmd", &hdr.cmd).map_err(ioerr)?;
    if hdr.flags & REQ_F_SBC != 0 {
        check_cmd("sbc", &hdr.sbc).map_err(ioerr)?;
    }
    if hdr.flags & REQ_F_STOP != 0 {
        check_cmd("stop", &hdr.stop).map_err(ioerr)?;
    }
    let middle = &descs[1..descs.len() - 1];
    let mut data = Vec::new();
    if hdr.flags & REQ_F_DATA == 0 {
        if !middle.is_empty() {
            return Err(ioerr(format!(
                "{} data buffers in a request without DATA",
                middle.len()
            )));
        }
    } else {
        if hdr.cmd.resp_type == RESP_NONE {
            return Err(ioerr(format!(
                "CMD{} carries data but expects no response",
                hdr.cmd.opcode
            )));
        }
        if hdr.blksz == 0 || hdr.blksz > limits.max_blk_size {
            return Err(ioerr(format!(
                "block size {} outside 1..={}",
                hdr.blksz, limits.max_blk_size
            )));
        }
        if hdr.blocks == 0 || hdr.blocks > limits.max_blk_count {
            return Err(ioerr(format!(
                "block count {} outside 1..={}",
                hdr.blocks, limits.max_blk_count
            )));
        }
        let total = u64::from(hdr.blksz) * u64::from(hdr.blocks);
        if total > u64::from(limits.max_req_size) {
            return Err(ioerr(format!(
                "{total} data bytes exceed max_req_size {}",
                limits.max_req_size
            )));
        }
        let write = hdr.flags & REQ_F_WRITE != 0;
        if let Some(d) = middle.iter().find(|d| d.writable == write) {
            return Err(ioerr(format!(
                "a data buffer of a {} is {}",
                if write { "write" } else { "read" },
                direction(d)
            )));
        }
        if middle.len() > limits.max_segs as usize {
            return Err(ioerr(format!(
                "{} data buffers exceed max_segs {}",
                middle.len(),
                limits.max_segs
            )));
        }
        if let Some(d) = middle.iter().find(|d| d.len > limits.max_seg_size) {
            return Err(ioerr(format!(
                "a data buffer of {} bytes exceeds max_seg_size {}",
                d.len, limits.max_seg_size
            )));
        }
        let buffers: u64 = middle.iter().map(|d| u64::from(d.len)).sum();
        if buffers != total {
            return Err(ioerr(format!(
                "data buffers hold {buffers} bytes, {} × {} blocks is {total}",
                hdr.blksz, hdr.blocks
            )));
        }
        data = middle
            .iter()
            .map(|d| Segment {
                addr: d.addr,
                len: d.len,
            })
            .collect();
    }
    Ok(MmcReq {
        hdr,
        data,
        resp: last.addr,
    })
}

/// Parse and check a control chain: the 24-byte request, then the 40-byte response.
pub fn parse_control<M>(chain: DescriptorChain<M>) -> Result<CtrlReq, ParseError>
where
    M: std::ops::Deref + Clone,
    M::Target: GuestMemory,
{
    let mem = chain.memory();
    parse_control_descs(mem, &chain_descs(chain.clone()))
}

/// Check a control chain given as its descriptors in `mem`.
pub fn parse_control_descs<M: GuestMemory + ?Sized>(
    mem: &M,
    descs: &[ChainDesc],
) -> Result<CtrlReq, ParseError> {
    let resp = response_slot(mem, descs, CTRL_RESP_LEN);
    let ioerr = |problem: String| ParseError {
        resp,
        status: STATUS_IOERR,
        problem,
    };
    if let Some(d) = outside(mem, descs) {
        return Err(ioerr(outside_problem(d)));
    }
    let shape_ok = descs.len() == 2
        && !descs[0].writable
        && descs[0].len == CTRL_REQ_LEN
        && descs[1].writable
        && descs[1].len == CTRL_RESP_LEN;
    if !shape_ok {
        let shape: Vec<String> = descs
            .iter()
            .map(|d| format!("{}{}", if d.writable { "w" } else { "r" }, d.len))
            .collect();
        return Err(ioerr(format!(
            "a control request is r{CTRL_REQ_LEN} then w{CTRL_RESP_LEN}, the chain is [{}]",
            shape.join(" ")
        )));
    }
    let req: VirtioMmcCtrlReq = mem
        .read_obj(descs[0].addr)
        .map_err(|e| ioerr(format!("control request unreadable: {e}")))?;
    Ok(CtrlReq {
        req,
        resp: descs[1].addr,
    })
}

/// Where an event buffer from the eventq can take an event: its first descriptor, when it
/// is device-writable, at least 24 bytes and inside guest memory.
pub fn parse_event_buffer<M>(chain: DescriptorChain<M>) -> Result<GuestAddress, String>
where
    M: std::ops::Deref + Clone,
    M::Target: GuestMemory,
{
    let mem = chain.memory();
    let first: Vec<ChainDesc> = chain.clone().take(1).map(ChainDesc::from).collect();
    parse_event_descs(mem, &first)
}

/// Check an event buffer given as its descriptors in `mem` (only the first counts).
pub fn parse_event_descs<M: GuestMemory + ?Sized>(
    mem: &M,
    descs: &[ChainDesc],
) -> Result<GuestAddress, String> {
    let Some(first) = descs.first() else {
        return Err("empty event buffer".into());
    };
    if !first.writable || first.len < EVENT_LEN {
        return Err(format!(
            "an event buffer is a device-writable descriptor of at least {EVENT_LEN} bytes \
             ({} bytes, {})",
            first.len,
            direction(first)
        ));
    }
    if !mem.check_range(first.addr, EVENT_LEN as usize, Permissions::Write) {
        return Err(outside_problem(first));
    }
    Ok(first.addr)
}

// ---- answers --------------------------------------------------------------------------------

/// Write `obj` to guest memory at `addr`; `false` (and a log line) when it cannot be.
pub fn put<M: GuestMemory + ?Sized, T: ByteValued>(mem: &M, obj: T, addr: GuestAddress) -> bool {
    match mem.write_obj(obj, addr) {
        Ok(()) => true,
        Err(e) => {
            log::warn!("writing a result at {:#x}: {e}", addr.0);
            false
        }
    }
}

/// Write an executed request's response into its chain; the used length (read data and
/// the response, or 0 when the response could not be written).
pub fn answer_request<M: GuestMemory + ?Sized>(mem: &M, req: &MmcReq, done: &Executed) -> u32 {
    if put(mem, done.resp, req.resp) {
        done.data_len + RESP_LEN
    } else {
        0
    }
}

/// Answer a refused request chain with its status where the chain has room for a
/// response; the used length (0 when it has none).
pub fn refuse_request<M: GuestMemory + ?Sized>(mem: &M, e: &ParseError) -> u32 {
    let answer = VirtioMmcResp {
        status: e.status,
        ..Default::default()
    };
    e.resp
        .filter(|&addr| put(mem, answer, addr))
        .map_or(0, |_| RESP_LEN)
}

/// Write a control request's result into its chain; the used length.
pub fn answer_control<M: GuestMemory + ?Sized>(
    mem: &M,
    req: &CtrlReq,
    out: &VirtioMmcCtrlResp,
) -> u32 {
    if put(mem, *out, req.resp) {
        CTRL_RESP_LEN
    } else {
        0
    }
}

/// Answer a refused control chain with its status (and the card time `now`) where the
/// chain has room for a result; the used length (0 when it has none).
pub fn refuse_control<M: GuestMemory + ?Sized>(mem: &M, e: &ParseError, now: Nanos) -> u32 {
    let answer = VirtioMmcCtrlResp {
        status: e.status,
        now_ns: now,
        ..Default::default()
    };
    e.resp
        .filter(|&addr| put(mem, answer, addr))
        .map_or(0, |_| CTRL_RESP_LEN)
}

/// A data buffer in guest memory as the SDHCI model's DMA engine sees it: its guest
/// address is its bus address, so ADMA2's alignment rules apply to it.
pub struct GuestDma<'m, M: GuestMemory + ?Sized> {
    pub mem: &'m M,
    pub seg: Segment,
}

impl<M: GuestMemory + ?Sized> GuestDma<'_, M> {
    fn at(&self, offset: usize, n: usize) -> Option<GuestAddress> {
        let end = offset.checked_add(n)?;
        (end <= self.seg.len as usize).then(|| self.seg.addr.unchecked_add(offset as u64))
    }
}

impl<M: GuestMemory + ?Sized> DmaSegment for GuestDma<'_, M> {
    fn len(&self) -> usize {
        self.seg.len as usize
    }

    fn dma_addr(&self) -> Option<u64> {
        Some(self.seg.addr.raw_value())
    }

    fn read_at(&self, offset: usize, dst: &mut [u8]) -> bool {
        self.at(offset, dst.len())
            .is_some_and(|a| self.mem.read_slice(dst, a).is_ok())
    }

    fn write_at(&mut self, offset: usize, src: &[u8]) -> bool {
        self.at(offset, src.len())
            .is_some_and(|a| self.mem.write_slice(src, a).is_ok())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use virtio_queue::desc::{split::Descriptor as SplitDescriptor, RawDescriptor};
    use virtio_queue::mock::MockSplitQueue;
    use vm_memory::GuestMemoryMmap;

    const F_WRITE: u16 = 2;

    fn mem() -> GuestMemoryMmap {
        GuestMemoryMmap::from_ranges(&[(GuestAddress(0), 0x10_0000)]).unwrap()
    }

    fn limits() -> Limits {
        Limits {
            max_seg_size: 4096,
            max_segs: 4,
            max_blk_size: 512,
            max_blk_count: 64,
            max_req_size: 16384,
        }
    }

    fn d(addr: u64, len: u32, flags: u16) -> RawDescriptor {
        RawDescriptor::from(SplitDescriptor::new(addr, len, flags, 0))
    }

    fn parse(m: &GuestMemoryMmap, descs: &[RawDescriptor]) -> Result<MmcReq, ParseError> {
        let q = MockSplitQueue::new(m, 16);
        let chain = q.build_desc_chain(descs).unwrap();
        parse_request(chain, &limits())
    }

    fn read_hdr(flags: u32, blksz: u32, blocks: u32) -> VirtioMmcReqHdr {
        VirtioMmcReqHdr {
            flags,
            cmd: VirtioMmcCmd {
                opcode: 18,
                resp_type: RESP_R1,
                ..Default::default()
            },
            blksz,
            blocks,
            ..Default::default()
        }
    }

    #[test]
    fn a_read_with_blocks_straddling_buffers_parses() {
        let m = mem();
        m.write_obj(read_hdr(REQ_F_DATA, 512, 3), GuestAddress(0x1000))
            .unwrap();
        let r = parse(
            &m,
            &[
                d(0x1000, HDR_LEN, 0),
                d(0x2001, 1000, F_WRITE),
                d(0x3000, 536, F_WRITE),
                d(0x4000, RESP_LEN, F_WRITE),
            ],
        )
        .unwrap();
        assert_eq!(r.hdr.blocks, 3);
        assert_eq!(
            r.data,
            vec![
                Segment {
                    addr: GuestAddress(0x2001),
                    len: 1000
                },
                Segment {
                    addr: GuestAddress(0x3000),
                    len: 536
                }
            ]
        );
        assert_eq!(r.resp, GuestAddress(0x4000));
    }

    #[test]
    fn a_command_without_data_parses_and_its_header_is_read_little_endian() {
        let m = mem();
        let mut h = VirtioMmcReqHdr::default();
        h.cmd.opcode = 13;
        h.cmd.resp_type = RESP_R1;
        h.cmd.arg = 0x0001_0000;
        m.write_slice(h.as_slice(), GuestAddress(0x1000)).unwrap();
        let r = parse(&m, &[d(0x1000, HDR_LEN, 0), d(0x4000, RESP_LEN, F_WRITE)]).unwrap();
        assert_eq!((r.hdr.cmd.opcode, r.hdr.cmd.arg), (13, 0x0001_0000));
        assert!(r.data.is_empty());
    }

    #[test]
    fn a_chain_too_short_for_a_response_has_nowhere_to_report() {
        let m = mem();
        m.write_obj(read_hdr(0, 0, 0), GuestAddress(0x1000))
            .unwrap();
        for descs in [
            vec![d(0x1000, HDR_LEN, 0)],
            vec![d(0x1000, HDR_LEN, 0), d(0x4000, RESP_LEN - 1, F_WRITE)],
            vec![d(0x1000, HDR_LEN, 0), d(0x4000, RESP_LEN, 0)],
        ] {
            let e = parse(&m, &descs).unwrap_err();
            assert_eq!(e.resp, None, "{}", e.problem);
            assert_eq!(e.status, STATUS_IOERR);
        }
    }

    #[test]
    fn guest_dma_refuses_accesses_past_its_end_and_reports_its_address() {
        let m = mem();
        let mut s = GuestDma {
            mem: &m,
            seg: Segment {
                addr: GuestAddress(0x1002),
                len: 16,
            },
        };
        assert_eq!(s.dma_addr(), Some(0x1002));
        let mut buf = [0u8; 8];
        assert!(s.read_at(8, &mut buf));
        assert!(!s.read_at(9, &mut buf));
        assert!(!s.write_at(usize::MAX, &buf));
        let mut edge = GuestDma {
            mem: &m,
            seg: Segment {
                addr: GuestAddress(0x10_0000 - 4),
                len: 8,
            },
        };
        assert!(!edge.write_at(0, &buf), "buffer running off guest memory");
    }
}
