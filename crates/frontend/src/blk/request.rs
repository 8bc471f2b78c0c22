//! virtio-blk requests out of descriptor chains (virtio 1.2 §5.2.6).
//!
//! A chain is a device-readable byte stream followed by a device-writable one; the
//! layout of descriptors inside each is free (VIRTIO_F_ANY_LAYOUT is implied by
//! VERSION_1). The 16-byte header is the start of the readable stream, the status byte
//! the last byte of the writable stream. Everything is checked before any data moves:
//! descriptor order, that every descriptor lies inside guest memory, lengths, the
//! sector range, and the limits the device advertised. The guest is hostile: a defect
//! gives the status the spec prescribes (IOERR, or UNSUPP for an unknown type) and a log
//! line, never a panic and never an access outside the guest's regions.

use virtio_queue::{desc::split::Descriptor, DescriptorChain};
use vm_memory::{Address, Bytes, GuestAddress, GuestMemory, Permissions};

use emmc_host::sdhci::DmaSegment;

/// Request types (virtio 1.2 §5.2.6).
pub const VIRTIO_BLK_T_IN: u32 = 0;
pub const VIRTIO_BLK_T_OUT: u32 = 1;
pub const VIRTIO_BLK_T_FLUSH: u32 = 4;
pub const VIRTIO_BLK_T_GET_ID: u32 = 8;
pub const VIRTIO_BLK_T_DISCARD: u32 = 11;
pub const VIRTIO_BLK_T_WRITE_ZEROES: u32 = 13;
pub const VIRTIO_BLK_T_SECURE_ERASE: u32 = 14;

/// Status values.
pub const VIRTIO_BLK_S_OK: u8 = 0;
pub const VIRTIO_BLK_S_IOERR: u8 = 1;
pub const VIRTIO_BLK_S_UNSUPP: u8 = 2;

/// Length of the GET_ID string.
pub const VIRTIO_BLK_ID_BYTES: usize = 20;
/// Size of one discard / write-zeroes / secure-erase range.
pub const RANGE_BYTES: usize = 16;
const HEADER_BYTES: u64 = 16;
const SECTOR: u64 = 512;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RequestKind {
    Read,
    Write,
    Flush,
    GetId,
    Discard,
    WriteZeroes,
    SecureErase,
}

/// A discard / write-zeroes / secure-erase range.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Range {
    pub sector: u64,
    pub sectors: u32,
    /// Write zeroes: the device may unmap.
    pub unmap: bool,
}

/// One contiguous piece of guest memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Segment {
    pub addr: GuestAddress,
    pub len: u32,
}

/// A checked request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Request {
    pub kind: RequestKind,
    pub sector: u64,
    /// Data segments (read: device-writable; write / ranges: device-readable).
    pub data: Vec<Segment>,
    pub data_len: u64,
    /// Ranges for discard, write zeroes and secure erase.
    pub ranges: Vec<Range>,
    pub status: GuestAddress,
}

/// Why a chain is not a valid request. `status` is where the status byte can be written,
/// when the chain has one.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{problem}")]
pub struct ParseError {
    pub status: Option<GuestAddress>,
    pub code: u8,
    pub problem: String,
}

/// What the device advertised; requests beyond are refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Capacity in 512-byte sectors.
    pub capacity: u64,
    /// Largest data segment (VIRTIO_BLK_F_SIZE_MAX).
    pub size_max: u32,
    /// Most data segments (VIRTIO_BLK_F_SEG_MAX).
    pub seg_max: u32,
    /// Largest read/write in sectors (the host's maximum request).
    pub max_sectors: u32,
    /// Most ranges per discard/write-zeroes/secure-erase request, and sectors per range.
    pub max_ranges: u32,
    pub max_range_sectors: u32,
}

/// Parse and check a descriptor chain.
pub fn parse<M>(chain: DescriptorChain<M>, limits: &Limits) -> Result<Request, ParseError>
where
    M: std::ops::Deref + Clone,
    M::Target: GuestMemory,
{
    let mem = chain.memory();
    // The chain's device-readable and device-writable parts, in chain order; each later
    // becomes the request's data in place (the header skipped, the status byte cut off).
    let mut readable: Vec<Segment> = Vec::new();
    let mut writable: Vec<Segment> = Vec::new();
    let mut out_of_order = false;
    let mut outside: Option<Descriptor> = None;
    let mut count = 0u32;
    for desc in chain.clone() {
        count += 1;
        let access = if desc.is_write_only() {
            Permissions::Write
        } else {
            Permissions::Read
        };
        if desc.len() > 0 && !mem.check_range(desc.addr(), desc.len() as usize, access) {
            outside = Some(desc);
        }
        let seg = Segment {
            addr: desc.addr(),
            len: desc.len(),
        };
        if desc.is_write_only() {
            writable.push(seg);
        } else {
            if !writable.is_empty() {
                out_of_order = true;
            }
            readable.push(seg);
        }
    }
    // The status byte: the last byte of the last writable descriptor.
    let status = writable
        .iter()
        .rev()
        .find(|d| d.len > 0)
        .and_then(|d| d.addr.checked_add(u64::from(d.len) - 1))
        .filter(|&a| mem.check_range(a, 1, Permissions::Write));
    let fail = |code: u8, problem: String| ParseError {
        status,
        code,
        problem,
    };
    if count == 0 {
        return Err(fail(VIRTIO_BLK_S_IOERR, "empty descriptor chain".into()));
    }
    if status.is_none() {
        return Err(fail(
            VIRTIO_BLK_S_IOERR,
            "no device-writable status byte".into(),
        ));
    }
    if let Some(d) = outside {
        return Err(fail(
            VIRTIO_BLK_S_IOERR,
            format!(
                "descriptor {:#x}+{} lies outside guest memory",
                d.addr().raw_value(),
                d.len()
            ),
        ));
    }
    if out_of_order {
        return Err(fail(
            VIRTIO_BLK_S_IOERR,
            "a device-readable descriptor follows a device-writable one".into(),
        ));
    }
    // The header: the first 16 readable bytes.
    let readable_len: u64 = readable.iter().map(|s| u64::from(s.len)).sum();
    if readable_len < HEADER_BYTES {
        return Err(fail(
            VIRTIO_BLK_S_IOERR,
            format!("header needs 16 readable bytes, chain has {readable_len}"),
        ));
    }
    let mut header = [0u8; HEADER_BYTES as usize];
    if !copy_from(mem, &readable, 0, &mut header) {
        return Err(fail(VIRTIO_BLK_S_IOERR, "header unreadable".into()));
    }
    let kind_raw = u32::from_le_bytes(header[0..4].try_into().expect("4 bytes"));
    let sector = u64::from_le_bytes(header[8..16].try_into().expect("8 bytes"));
    // Device-readable data: everything after the header.
    skip(&mut readable, HEADER_BYTES);
    let after_header = readable;
    let out_len = readable_len - HEADER_BYTES;
    // Device-writable data: everything before the status byte.
    let writable_len: u64 = writable.iter().map(|s| u64::from(s.len)).sum();
    truncate(&mut writable, writable_len - 1);
    let in_segs = writable;
    let in_len = writable_len - 1;

    let kind = match kind_raw {
        VIRTIO_BLK_T_IN => RequestKind::Read,
        VIRTIO_BLK_T_OUT => RequestKind::Write,
        VIRTIO_BLK_T_FLUSH => RequestKind::Flush,
        VIRTIO_BLK_T_GET_ID => RequestKind::GetId,
        VIRTIO_BLK_T_DISCARD => RequestKind::Discard,
        VIRTIO_BLK_T_WRITE_ZEROES => RequestKind::WriteZeroes,
        VIRTIO_BLK_T_SECURE_ERASE => RequestKind::SecureErase,
        other => {
            return Err(fail(
                VIRTIO_BLK_S_UNSUPP,
                format!("request type {other} is not supported"),
            ))
        }
    };
    let mut request = Request {
        kind,
        sector,
        data: Vec::new(),
        data_len: 0,
        ranges: Vec::new(),
        status: status.expect("checked above"),
    };
    match kind {
        RequestKind::Read | RequestKind::Write => {
            let (segs, len, stray) = if kind == RequestKind::Read {
                (in_segs, in_len, out_len)
            } else {
                (after_header, out_len, in_len)
            };
            if stray != 0 {
                return Err(fail(
                    VIRTIO_BLK_S_IOERR,
                    format!("{stray} data bytes in the wrong direction"),
                ));
            }
            if len == 0 || len % SECTOR != 0 {
                return Err(fail(
                    VIRTIO_BLK_S_IOERR,
                    format!("data length {len} is not a whole number of sectors"),
                ));
            }
            let sectors = len / SECTOR;
            if sectors > u64::from(limits.max_sectors) {
                return Err(fail(
                    VIRTIO_BLK_S_IOERR,
                    format!(
                        "{sectors} sectors exceed the maximum request of {}",
                        limits.max_sectors
                    ),
                ));
            }
            // size_max is advice for the driver (Linux honours it, libblkio does not):
            // the ADMA2 table splits a longer segment into 32 KiB descriptors exactly as
            // the sdhci driver would, so only the segment count is a hard limit.
            if segs.len() > limits.seg_max as usize {
                return Err(fail(
                    VIRTIO_BLK_S_IOERR,
                    format!(
                        "{} data segments exceed the advertised seg_max of {}",
                        segs.len(),
                        limits.seg_max
                    ),
                ));
            }
            if sector
                .checked_add(sectors)
                .is_none_or(|end| end > limits.capacity)
            {
                return Err(fail(
                    VIRTIO_BLK_S_IOERR,
                    format!(
                        "sectors {sector}+{sectors} beyond capacity {}",
                        limits.capacity
                    ),
                ));
            }
            request.data = segs;
            request.data_len = len;
        }
        RequestKind::Flush => {
            if out_len != 0 || in_len != 0 {
                return Err(fail(VIRTIO_BLK_S_IOERR, "flush carries data".into()));
            }
        }
        RequestKind::GetId => {
            if out_len != 0 || in_len == 0 {
                return Err(fail(
                    VIRTIO_BLK_S_IOERR,
                    "GET_ID needs a device-writable buffer".into(),
                ));
            }
            request.data = in_segs;
            request.data_len = in_len;
        }
        RequestKind::Discard | RequestKind::WriteZeroes | RequestKind::SecureErase => {
            if in_len != 0 || out_len == 0 || out_len % RANGE_BYTES as u64 != 0 {
                return Err(fail(
                    VIRTIO_BLK_S_IOERR,
                    format!("{out_len} bytes of ranges is not a whole number of 16-byte ranges"),
                ));
            }
            let n = out_len / RANGE_BYTES as u64;
            if n > u64::from(limits.max_ranges) {
                return Err(fail(
                    VIRTIO_BLK_S_IOERR,
                    format!("{n} ranges exceed the maximum {}", limits.max_ranges),
                ));
            }
            for i in 0..n {
                let mut raw = [0u8; RANGE_BYTES];
                if !copy_from(mem, &after_header, i * RANGE_BYTES as u64, &mut raw) {
                    return Err(fail(VIRTIO_BLK_S_IOERR, "range unreadable".into()));
                }
                let range = Range {
                    sector: u64::from_le_bytes(raw[0..8].try_into().expect("8 bytes")),
                    sectors: u32::from_le_bytes(raw[8..12].try_into().expect("4 bytes")),
                    unmap: u32::from_le_bytes(raw[12..16].try_into().expect("4 bytes")) & 1 != 0,
                };
                let flags = u32::from_le_bytes(raw[12..16].try_into().expect("4 bytes"));
                if flags & !1 != 0 || (range.unmap && kind != RequestKind::WriteZeroes) {
                    return Err(fail(
                        VIRTIO_BLK_S_UNSUPP,
                        format!("range flags {flags:#x} not supported"),
                    ));
                }
                if range.sectors == 0 || range.sectors > limits.max_range_sectors {
                    return Err(fail(
                        VIRTIO_BLK_S_IOERR,
                        format!("range of {} sectors", range.sectors),
                    ));
                }
                if range
                    .sector
                    .checked_add(u64::from(range.sectors))
                    .is_none_or(|end| end > limits.capacity)
                {
                    return Err(fail(
                        VIRTIO_BLK_S_IOERR,
                        format!("range {}+{} beyond capacity", range.sector, range.sectors),
                    ));
                }
                request.ranges.push(range);
            }
        }
    }
    Ok(request)
}

/// Drop the first `n` bytes of `segs`, and empty segments.
fn skip(segs: &mut Vec<Segment>, n: u64) {
    let mut left = n;
    segs.retain_mut(|s| {
        let len = u64::from(s.len);
        if left >= len {
            left -= len;
            return false;
        }
        s.addr = s.addr.unchecked_add(left);
        s.len = (len - left) as u32;
        left = 0;
        true
    });
}

/// Keep only the first `n` bytes of `segs`, without empty segments.
fn truncate(segs: &mut Vec<Segment>, n: u64) {
    let mut left = n;
    segs.retain_mut(|s| {
        let take = u64::from(s.len).min(left);
        left -= take;
        s.len = take as u32;
        take > 0
    });
}

/// The segments of `segs` from byte `offset` on, the first one shortened.
fn from_offset(segs: &[Segment], offset: u64) -> impl Iterator<Item = Segment> + '_ {
    let mut left = offset;
    segs.iter().filter_map(move |s| {
        let len = u64::from(s.len);
        if left >= len {
            left -= len;
            return None;
        }
        let seg = Segment {
            addr: s.addr.unchecked_add(left),
            len: (len - left) as u32,
        };
        left = 0;
        Some(seg)
    })
}

/// Copy `dst.len()` bytes starting `offset` bytes into `segs` from guest memory.
fn copy_from<M: GuestMemory + ?Sized>(
    mem: &M,
    segs: &[Segment],
    offset: u64,
    dst: &mut [u8],
) -> bool {
    let mut pos = 0usize;
    for s in from_offset(segs, offset) {
        if pos == dst.len() {
            break;
        }
        let n = (s.len as usize).min(dst.len() - pos);
        if mem.read_slice(&mut dst[pos..pos + n], s.addr).is_err() {
            return false;
        }
        pos += n;
    }
    pos == dst.len()
}

/// A data segment in guest memory, as the SDHCI model's DMA engine sees it.
pub struct GuestSegment<'m, M: GuestMemory + ?Sized> {
    pub mem: &'m M,
    pub seg: Segment,
}

impl<M: GuestMemory + ?Sized> DmaSegment for GuestSegment<'_, M> {
    fn len(&self) -> usize {
        self.seg.len as usize
    }

    fn read_at(&self, offset: usize, dst: &mut [u8]) -> bool {
        offset
            .checked_add(dst.len())
            .is_some_and(|end| end <= self.seg.len as usize)
            && self
                .mem
                .read_slice(dst, self.seg.addr.unchecked_add(offset as u64))
                .is_ok()
    }

    fn write_at(&mut self, offset: usize, src: &[u8]) -> bool {
        offset
            .checked_add(src.len())
            .is_some_and(|end| end <= self.seg.len as usize)
            && self
                .mem
                .write_slice(src, self.seg.addr.unchecked_add(offset as u64))
                .is_ok()
    }
}

/// Write `bytes` into device-writable `segs` (GET_ID); returns how many fit.
pub fn copy_to<M: GuestMemory + ?Sized>(mem: &M, segs: &[Segment], bytes: &[u8]) -> usize {
    let mut pos = 0usize;
    for s in segs {
        if pos == bytes.len() {
            break;
        }
        let n = (s.len as usize).min(bytes.len() - pos);
        if mem.write_slice(&bytes[pos..pos + n], s.addr).is_err() {
            break;
        }
        pos += n;
    }
    pos
}

#[cfg(test)]
mod tests {
    use super::*;
    use virtio_queue::desc::{split::Descriptor as SplitDescriptor, RawDescriptor};
    use virtio_queue::mock::MockSplitQueue;
    use vm_memory::GuestMemoryMmap;

    const F_WRITE: u16 = 2; // VRING_DESC_F_WRITE

    fn mem() -> GuestMemoryMmap {
        GuestMemoryMmap::from_ranges(&[(GuestAddress(0), 0x10_0000)]).unwrap()
    }

    fn limits() -> Limits {
        Limits {
            capacity: 1000,
            size_max: 65536,
            seg_max: 4,
            max_sectors: 1024,
            max_ranges: 2,
            max_range_sectors: 500,
        }
    }

    fn header(m: &GuestMemoryMmap, at: u64, kind: u32, sector: u64) {
        let mut h = [0u8; 16];
        h[0..4].copy_from_slice(&kind.to_le_bytes());
        h[8..16].copy_from_slice(&sector.to_le_bytes());
        m.write_slice(&h, GuestAddress(at)).unwrap();
    }

    fn d(addr: u64, len: u32, flags: u16) -> RawDescriptor {
        RawDescriptor::from(SplitDescriptor::new(addr, len, flags, 0))
    }

    fn parse_chain(m: &GuestMemoryMmap, descs: &[RawDescriptor]) -> Result<Request, ParseError> {
        let q = MockSplitQueue::new(m, 16);
        let chain = q.build_desc_chain(descs).unwrap();
        parse(chain, &limits())
    }

    #[test]
    fn a_read_with_split_header_and_data_parses() {
        let m = mem();
        header(&m, 0x1000, VIRTIO_BLK_T_IN, 10);
        // Header split over two descriptors; data in two; status alone.
        let r = parse_chain(
            &m,
            &[
                d(0x1000, 8, 0),
                d(0x1008, 8, 0),
                d(0x2000, 512, F_WRITE),
                d(0x3000, 512, F_WRITE),
                d(0x4000, 1, F_WRITE),
            ],
        )
        .unwrap();
        assert_eq!(r.kind, RequestKind::Read);
        assert_eq!(r.sector, 10);
        assert_eq!(r.data_len, 1024);
        assert_eq!(r.data.len(), 2);
        assert_eq!(r.status, GuestAddress(0x4000));
    }

    #[test]
    fn status_may_share_a_descriptor_with_the_data() {
        let m = mem();
        header(&m, 0x1000, VIRTIO_BLK_T_IN, 0);
        let r = parse_chain(&m, &[d(0x1000, 16, 0), d(0x2000, 513, F_WRITE)]).unwrap();
        assert_eq!(
            r.data,
            vec![Segment {
                addr: GuestAddress(0x2000),
                len: 512
            }]
        );
        assert_eq!(r.status, GuestAddress(0x2200));
    }

    #[test]
    fn writes_and_ranges_parse() {
        let m = mem();
        header(&m, 0x1000, VIRTIO_BLK_T_OUT, 5);
        let r = parse_chain(&m, &[d(0x1000, 16 + 1024, 0), d(0x4000, 1, F_WRITE)]).unwrap();
        assert_eq!((r.kind, r.data_len), (RequestKind::Write, 1024));
        assert_eq!(r.data[0].addr, GuestAddress(0x1010));
        header(&m, 0x1000, VIRTIO_BLK_T_WRITE_ZEROES, 0);
        let mut range = [0u8; 16];
        range[0..8].copy_from_slice(&100u64.to_le_bytes());
        range[8..12].copy_from_slice(&8u32.to_le_bytes());
        range[12..16].copy_from_slice(&1u32.to_le_bytes());
        m.write_slice(&range, GuestAddress(0x1010)).unwrap();
        let r = parse_chain(&m, &[d(0x1000, 32, 0), d(0x4000, 1, F_WRITE)]).unwrap();
        assert_eq!(
            r.ranges,
            vec![Range {
                sector: 100,
                sectors: 8,
                unmap: true
            }]
        );
    }

    #[test]
    fn every_defect_gets_its_status_and_no_access_outside_memory() {
        let m = mem();
        /// (what, request type, sector, chain, expected status; None = not reportable)
        type Case = (&'static str, u32, u64, Vec<RawDescriptor>, Option<u8>);
        let cases: Vec<Case> = vec![
            (
                "no status byte",
                VIRTIO_BLK_T_IN,
                0,
                vec![d(0x1000, 16, 0)],
                None,
            ),
            (
                "short header",
                VIRTIO_BLK_T_IN,
                0,
                vec![d(0x1000, 8, 0), d(0x4000, 1, F_WRITE)],
                Some(VIRTIO_BLK_S_IOERR),
            ),
            (
                "unknown type",
                99,
                0,
                vec![d(0x1000, 16, 0), d(0x4000, 1, F_WRITE)],
                Some(VIRTIO_BLK_S_UNSUPP),
            ),
            (
                "read data readable",
                VIRTIO_BLK_T_IN,
                0,
                vec![d(0x1000, 16 + 512, 0), d(0x4000, 513, F_WRITE)],
                Some(VIRTIO_BLK_S_IOERR),
            ),
            (
                "write data writable",
                VIRTIO_BLK_T_OUT,
                0,
                vec![d(0x1000, 16, 0), d(0x4000, 513, F_WRITE)],
                Some(VIRTIO_BLK_S_IOERR),
            ),
            (
                "partial sector",
                VIRTIO_BLK_T_IN,
                0,
                vec![d(0x1000, 16, 0), d(0x4000, 301, F_WRITE)],
                Some(VIRTIO_BLK_S_IOERR),
            ),
            (
                "beyond capacity",
                VIRTIO_BLK_T_IN,
                999,
                vec![d(0x1000, 16, 0), d(0x4000, 1025, F_WRITE)],
                Some(VIRTIO_BLK_S_IOERR),
            ),
            (
                "sector overflow",
                VIRTIO_BLK_T_IN,
                u64::MAX,
                vec![d(0x1000, 16, 0), d(0x4000, 513, F_WRITE)],
                Some(VIRTIO_BLK_S_IOERR),
            ),
            (
                "outside memory",
                VIRTIO_BLK_T_IN,
                0,
                vec![
                    d(0x1000, 16, 0),
                    d(0xFFFF_0000, 512, F_WRITE),
                    d(0x4000, 1, F_WRITE),
                ],
                Some(VIRTIO_BLK_S_IOERR),
            ),
            (
                "readable after writable",
                VIRTIO_BLK_T_IN,
                0,
                vec![
                    d(0x1000, 16, 0),
                    d(0x2000, 512, F_WRITE),
                    d(0x3000, 512, 0),
                    d(0x4000, 1, F_WRITE),
                ],
                Some(VIRTIO_BLK_S_IOERR),
            ),
            (
                "too many segments",
                VIRTIO_BLK_T_IN,
                0,
                (0..5)
                    .map(|i| d(0x2000 + i * 0x1000, 512, F_WRITE))
                    .chain([d(0x9000, 1, F_WRITE)])
                    .collect::<Vec<_>>()
                    .into_iter()
                    .rev()
                    .chain([d(0x1000, 16, 0)])
                    .rev()
                    .collect(),
                Some(VIRTIO_BLK_S_IOERR),
            ),
            (
                "flush with data",
                VIRTIO_BLK_T_FLUSH,
                0,
                vec![d(0x1000, 16 + 512, 0), d(0x4000, 1, F_WRITE)],
                Some(VIRTIO_BLK_S_IOERR),
            ),
            (
                "range not 16 bytes",
                VIRTIO_BLK_T_DISCARD,
                0,
                vec![d(0x1000, 16 + 10, 0), d(0x4000, 1, F_WRITE)],
                Some(VIRTIO_BLK_S_IOERR),
            ),
        ];
        for (what, kind, sector, descs, want) in cases {
            header(&m, 0x1000, kind, sector);
            let err = parse_chain(&m, &descs).expect_err(what);
            match want {
                None => assert_eq!(err.status, None, "{what}"),
                Some(code) => {
                    assert_eq!(err.code, code, "{what}: {}", err.problem);
                    assert!(err.status.is_some(), "{what}: status must be reportable");
                }
            }
        }
    }

    #[test]
    fn guest_segments_refuse_accesses_past_their_end() {
        let m = mem();
        let mut s = GuestSegment {
            mem: &m,
            seg: Segment {
                addr: GuestAddress(0x1000),
                len: 16,
            },
        };
        let mut buf = [0u8; 8];
        assert!(s.read_at(8, &mut buf));
        assert!(!s.read_at(9, &mut buf));
        assert!(!s.write_at(usize::MAX, &buf));
        let mut edge = GuestSegment {
            mem: &m,
            seg: Segment {
                addr: GuestAddress(0x10_0000 - 4),
                len: 8,
            },
        };
        assert!(!edge.write_at(0, &buf), "segment running off guest memory");
    }
}
