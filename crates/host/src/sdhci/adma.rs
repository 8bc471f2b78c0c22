//! ADMA2: the descriptor table the driver builds from a request's scatter-gather list, and
//! the controller's walk over it (facts §13.11).
//!
//! The table is built as Linux's `sdhci_adma_table_pre()` builds it: per segment, an
//! alignment descriptor through the driver's bounce buffer when the segment's bus address
//! is not 4-byte aligned, then Tran descriptors of at most `max_len` bytes (a longer
//! segment is cut into 32 KiB pieces first, as Linux does), then one Nop+End terminator.
//! The controller model then checks the whole chain before any data moves (see
//! `Sdhci` module docs, "ADMA2").

use super::regs::{adma2_attr, adma_err};

/// One scatter-gather segment of host memory the controller's DMA reads (writes to the
/// card) or writes (reads from the card). The simulator passes plain byte slices; a
/// vhost-user frontend passes guest-memory segments that know their guest address.
pub trait DmaSegment {
    /// Length in bytes.
    fn len(&self) -> usize;

    fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Bus address of the first byte, when the segment has one (for ADMA2 address and
    /// alignment rules); `None` for host memory the model need not place.
    fn dma_addr(&self) -> Option<u64> {
        None
    }

    /// Copy `dst.len()` bytes from `offset` (DMA read of host memory). `false`: the memory
    /// cannot be read, which the controller reports as an ADMA error.
    fn read_at(&self, offset: usize, dst: &mut [u8]) -> bool;

    /// Copy `src` to `offset` (DMA write to host memory). `false`: not writable.
    fn write_at(&mut self, offset: usize, src: &[u8]) -> bool;

    /// The segment as plain host memory, when it is (lets a one-segment transfer skip the
    /// controller's staging copy; guest memory returns `None`).
    fn as_slice(&self) -> Option<&[u8]> {
        None
    }

    /// The segment as writable plain host memory, when it is.
    fn as_mut_slice(&mut self) -> Option<&mut [u8]> {
        None
    }
}

fn range(len: usize, offset: usize, n: usize) -> Option<std::ops::Range<usize>> {
    let end = offset.checked_add(n)?;
    (end <= len).then_some(offset..end)
}

/// Copy `dst.len()` bytes of `src` from `offset`, if they are all there.
fn copy_out(src: &[u8], offset: usize, dst: &mut [u8]) -> bool {
    match range(src.len(), offset, dst.len()) {
        Some(r) => {
            dst.copy_from_slice(&src[r]);
            true
        }
        None => false,
    }
}

impl DmaSegment for &mut [u8] {
    fn len(&self) -> usize {
        <[u8]>::len(self)
    }
    fn as_slice(&self) -> Option<&[u8]> {
        Some(self)
    }
    fn as_mut_slice(&mut self) -> Option<&mut [u8]> {
        Some(self)
    }
    fn read_at(&self, offset: usize, dst: &mut [u8]) -> bool {
        copy_out(self, offset, dst)
    }
    fn write_at(&mut self, offset: usize, src: &[u8]) -> bool {
        match range(<[u8]>::len(self), offset, src.len()) {
            Some(r) => {
                self[r].copy_from_slice(src);
                true
            }
            None => false,
        }
    }
}

/// Read-only memory: fine as the source of a write to the card; a read into it fails.
impl DmaSegment for &[u8] {
    fn len(&self) -> usize {
        <[u8]>::len(self)
    }
    fn as_slice(&self) -> Option<&[u8]> {
        Some(self)
    }
    fn read_at(&self, offset: usize, dst: &mut [u8]) -> bool {
        copy_out(self, offset, dst)
    }
    fn write_at(&mut self, _offset: usize, _src: &[u8]) -> bool {
        false
    }
}

impl DmaSegment for Vec<u8> {
    fn len(&self) -> usize {
        Vec::len(self)
    }
    fn read_at(&self, offset: usize, dst: &mut [u8]) -> bool {
        copy_out(self, offset, dst)
    }
    fn write_at(&mut self, offset: usize, src: &[u8]) -> bool {
        let mut slice: &mut [u8] = &mut self[..];
        slice.write_at(offset, src)
    }
    fn as_slice(&self) -> Option<&[u8]> {
        Some(&self[..])
    }
    fn as_mut_slice(&mut self) -> Option<&mut [u8]> {
        Some(&mut self[..])
    }
}

/// A byte slice at a bus address, for requests whose ADMA2 addressing matters.
#[derive(Debug)]
pub struct DmaBuf<'a> {
    pub addr: u64,
    pub buf: &'a mut [u8],
}

impl DmaSegment for DmaBuf<'_> {
    fn len(&self) -> usize {
        self.buf.len()
    }
    fn dma_addr(&self) -> Option<u64> {
        Some(self.addr)
    }
    fn read_at(&self, offset: usize, dst: &mut [u8]) -> bool {
        copy_out(self.buf, offset, dst)
    }
    fn write_at(&mut self, offset: usize, src: &[u8]) -> bool {
        let mut buf: &mut [u8] = self.buf;
        buf.write_at(offset, src)
    }
}

/// ADMA2 limits of the controller and its driver.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AdmaLimits {
    /// Descriptors in the table, terminator included (Linux: 128 segments × 2 + 1).
    pub table_len: usize,
    /// Longest Tran descriptor in bytes (v3: 65 536, encoded as length 0).
    pub max_len: u32,
    /// 64-bit (96-bit descriptor) addressing; with 32-bit addressing every byte of a
    /// segment must lie below 4 GiB.
    pub addr64: bool,
}

/// Data-address alignment of ADMA2 (Linux `SDHCI_ADMA2_ALIGN`).
pub const ADMA2_ALIGN: u64 = 4;

/// How Linux cuts a segment longer than the descriptor limit.
const SPLIT_LEN: usize = 32 * 1024;

/// One descriptor of the table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AdmaDesc {
    pub attr: u16,
    /// Bytes this descriptor moves (0 for the terminator); the 16-bit field holds it
    /// modulo 65 536.
    pub len: u32,
    /// Which scatter-gather segment, and where in it, the bytes come from or go to.
    pub seg: usize,
    pub offset: usize,
}

/// Build the table for `sg` into `table`; `Err` is the ADMA Error Status a controller
/// walking such a table reports.
pub fn build_table<S: DmaSegment>(
    sg: &[S],
    limits: &AdmaLimits,
    table: &mut Vec<AdmaDesc>,
) -> Result<u64, u8> {
    table.clear();
    let max_len = (limits.max_len.clamp(4, 65_536)) as usize;
    let mut total: u64 = 0;
    for (i, seg) in sg.iter().enumerate() {
        let len = seg.len();
        if len == 0 {
            continue;
        }
        if let Some(addr) = seg.dma_addr() {
            let last = addr.checked_add(len as u64 - 1);
            let reachable = match last {
                None => false,
                Some(last) => limits.addr64 || last <= u64::from(u32::MAX),
            };
            if !reachable {
                log::debug!("ADMA2: segment {i} at {addr:#x}+{len} is not addressable");
                return Err(adma_err::ST_FDS);
            }
        }
        let mut offset = 0usize;
        // Unaligned head through the bounce buffer.
        if let Some(addr) = seg.dma_addr() {
            let head = ((ADMA2_ALIGN - addr % ADMA2_ALIGN) % ADMA2_ALIGN) as usize;
            let head = head.min(len);
            if head > 0 {
                push(table, limits, i, 0, head)?;
                offset = head;
            }
        }
        while len - offset > max_len {
            push(table, limits, i, offset, SPLIT_LEN)?;
            offset += SPLIT_LEN;
        }
        if len > offset {
            push(table, limits, i, offset, len - offset)?;
        }
        total += len as u64;
    }
    if table.len() + 1 > limits.table_len {
        return Err(adma_err::ST_FDS);
    }
    table.push(AdmaDesc {
        attr: adma2_attr::NOP_END_VALID,
        len: 0,
        seg: 0,
        offset: 0,
    });
    Ok(total)
}

fn push(
    table: &mut Vec<AdmaDesc>,
    limits: &AdmaLimits,
    seg: usize,
    offset: usize,
    len: usize,
) -> Result<(), u8> {
    // Room for this descriptor and the terminator.
    if table.len() + 2 > limits.table_len {
        log::debug!(
            "ADMA2: more than {} descriptors needed",
            limits.table_len.saturating_sub(1)
        );
        return Err(adma_err::ST_FDS);
    }
    table.push(AdmaDesc {
        attr: adma2_attr::TRAN_VALID,
        len: len as u32,
        seg,
        offset,
    });
    Ok(())
}

/// Controller → memory: spread `src` over the Tran descriptors in order.
pub fn scatter<S: DmaSegment>(table: &[AdmaDesc], sg: &mut [S], src: &[u8]) -> Result<(), u8> {
    let mut pos = 0usize;
    for d in table.iter().filter(|d| d.attr & adma2_attr::ACT_TRAN != 0) {
        let n = d.len as usize;
        let chunk = src.get(pos..pos + n).ok_or(adma_err::ST_TFR)?;
        let seg = sg.get_mut(d.seg).ok_or(adma_err::ST_TFR)?;
        if !seg.write_at(d.offset, chunk) {
            return Err(adma_err::ST_TFR);
        }
        pos += n;
    }
    Ok(())
}

/// Memory → controller: collect the Tran descriptors' bytes into `dst`.
pub fn gather<S: DmaSegment>(table: &[AdmaDesc], sg: &[S], dst: &mut [u8]) -> Result<(), u8> {
    let mut pos = 0usize;
    for d in table.iter().filter(|d| d.attr & adma2_attr::ACT_TRAN != 0) {
        let n = d.len as usize;
        let chunk = dst.get_mut(pos..pos + n).ok_or(adma_err::ST_TFR)?;
        let seg = sg.get(d.seg).ok_or(adma_err::ST_TFR)?;
        if !seg.read_at(d.offset, chunk) {
            return Err(adma_err::ST_TFR);
        }
        pos += n;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const LINUX: AdmaLimits = AdmaLimits {
        table_len: 257,
        max_len: 65_536,
        addr64: false,
    };

    #[test]
    fn segments_up_to_64_kib_take_one_descriptor_each_plus_the_terminator() {
        let mut a = vec![0u8; 65_536];
        let mut b = vec![0u8; 512];
        let sg: [&mut [u8]; 2] = [&mut a, &mut b];
        let mut t = Vec::new();
        assert_eq!(build_table(&sg, &LINUX, &mut t), Ok(66_048));
        assert_eq!(t.len(), 3);
        assert_eq!(t[0].len, 65_536, "encoded as length 0");
        assert_eq!(t[2].attr, adma2_attr::NOP_END_VALID);
    }

    #[test]
    fn long_and_unaligned_segments_need_more_descriptors() {
        let mut big = vec![0u8; 65_537];
        let mut odd = vec![0u8; 100];
        let sg = [
            DmaBuf {
                addr: 0x1000,
                buf: &mut big,
            },
            DmaBuf {
                addr: 0x2001,
                buf: &mut odd,
            },
        ];
        let mut t = Vec::new();
        assert_eq!(build_table(&sg, &LINUX, &mut t), Ok(65_637));
        let lens: Vec<u32> = t.iter().map(|d| d.len).collect();
        assert_eq!(lens, [32_768, 32_769, 3, 97, 0]);
    }

    #[test]
    fn table_overflow_and_high_addresses_are_adma_errors() {
        let mut bufs: Vec<Vec<u8>> = (0..300).map(|_| vec![0u8; 4]).collect();
        let sg: Vec<&mut [u8]> = bufs.iter_mut().map(|b| b.as_mut_slice()).collect();
        let mut t = Vec::new();
        assert_eq!(build_table(&sg, &LINUX, &mut t), Err(adma_err::ST_FDS));
        let mut high = vec![0u8; 8];
        let sg = [DmaBuf {
            addr: 0xFFFF_FFFC,
            buf: &mut high,
        }];
        assert_eq!(build_table(&sg, &LINUX, &mut t), Err(adma_err::ST_FDS));
        let wide = AdmaLimits {
            addr64: true,
            ..LINUX
        };
        assert_eq!(build_table(&sg, &wide, &mut t), Ok(8));
    }
}
