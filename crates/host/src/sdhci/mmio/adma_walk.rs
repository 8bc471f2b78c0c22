//! The ADMA2 engine's walk over a descriptor table the guest built in its memory
//! (facts §13.11): 8-byte descriptors with 32-bit addresses, or 12-byte ("96-bit") ones
//! with 64-bit addresses; Valid, End and Int attributes; Tran, Link and Nop actions
//! (the reserved action 01 is a Nop); a length of 0 meaning 65 536 bytes. The walk reads
//! descriptors only through [`DmaMemory`] and stops at the first End, at a descriptor
//! that is not Valid or cannot be read, or after [`MAX_ADMA_DESCRIPTORS`] (a Link loop),
//! so a hostile table costs bounded time and memory.

use super::dma::DmaMemory;
use crate::sdhci::adma2_attr;

/// Descriptors one transfer may fetch (Tran, Link and Nop alike) before the engine gives
/// up with an ADMA error: far beyond Linux's 257, short of a loop's forever.
pub const MAX_ADMA_DESCRIPTORS: usize = 1 << 16;

/// The descriptor's action field (attribute bits [5:4]).
const ACT_MASK: u16 = 0b11 << 4;

/// One Tran descriptor: `len` bytes at `addr`, found at descriptor address `desc`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct AdmaSeg {
    pub(super) addr: u64,
    pub(super) len: u32,
    pub(super) desc: u64,
}

/// How the walk ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum ChainEnd {
    /// The End attribute; `next` is the address after that descriptor.
    End { next: u64 },
    /// The descriptor at `desc` is not Valid, cannot be read, or is one too many.
    Bad { desc: u64 },
}

/// A walked table: the Tran descriptors in order, where Int descriptors complete (byte
/// offsets into the transfer), and how it ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct AdmaChain {
    pub(super) segs: Vec<AdmaSeg>,
    pub(super) int_marks: Vec<u64>,
    pub(super) total: u64,
    pub(super) end: ChainEnd,
}

impl AdmaChain {
    /// The descriptor address after the one holding transfer byte `offset - 1` (where
    /// the engine stands once `offset` bytes have moved), or `fallback`.
    pub(super) fn desc_after(&self, offset: u64, desc_len: u64, fallback: u64) -> u64 {
        let mut at = 0u64;
        for s in &self.segs {
            at += u64::from(s.len);
            if at >= offset {
                return s.desc.wrapping_add(desc_len);
            }
        }
        fallback
    }
}

/// Bytes of one descriptor.
pub(super) fn desc_len(wide: bool) -> u64 {
    if wide {
        12
    } else {
        8
    }
}

/// Walk the table at `start`; `wide`: 64-bit (12-byte) descriptors.
pub(super) fn walk(mem: &dyn DmaMemory, start: u64, wide: bool) -> AdmaChain {
    let size = desc_len(wide);
    let mut chain = AdmaChain {
        segs: Vec::new(),
        int_marks: Vec::new(),
        total: 0,
        end: ChainEnd::Bad { desc: start },
    };
    let mut desc = start;
    for _ in 0..MAX_ADMA_DESCRIPTORS {
        let mut raw = [0u8; 12];
        let raw = &mut raw[..size as usize];
        if let Err(e) = mem.read(desc, raw) {
            log::debug!("ADMA2: descriptor at {desc:#x}: {e}");
            chain.end = ChainEnd::Bad { desc };
            return chain;
        }
        let attr = u16::from_le_bytes([raw[0], raw[1]]);
        let len = match u16::from_le_bytes([raw[2], raw[3]]) {
            0 => 65_536,
            n => u32::from(n),
        };
        let addr = if wide {
            u64::from_le_bytes(raw[4..12].try_into().expect("12-byte descriptor"))
        } else {
            u64::from(u32::from_le_bytes(
                raw[4..8].try_into().expect("8-byte descriptor"),
            ))
        };
        if attr & adma2_attr::VALID == 0 {
            log::debug!("ADMA2: descriptor at {desc:#x} ({attr:#06x}) is not valid");
            chain.end = ChainEnd::Bad { desc };
            return chain;
        }
        let mut next = desc.checked_add(size);
        match attr & ACT_MASK {
            adma2_attr::ACT_TRAN => {
                chain.segs.push(AdmaSeg { addr, len, desc });
                chain.total += u64::from(len);
            }
            adma2_attr::ACT_LINK => {
                next = Some(if wide { addr } else { addr & 0xFFFF_FFFF });
            }
            // Nop, and the reserved action 01, which v3 treats as a Nop.
            _ => {}
        }
        if attr & adma2_attr::INT != 0 {
            chain.int_marks.push(chain.total);
        }
        if attr & adma2_attr::END != 0 {
            chain.end = ChainEnd::End {
                next: desc.wrapping_add(size),
            };
            return chain;
        }
        let Some(n) = next else {
            chain.end = ChainEnd::Bad { desc };
            return chain;
        };
        desc = if wide { n } else { n & 0xFFFF_FFFF };
    }
    log::debug!("ADMA2: more than {MAX_ADMA_DESCRIPTORS} descriptors, giving up at {desc:#x}");
    chain.end = ChainEnd::Bad { desc };
    chain
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sdhci::mmio::dma::DmaError;
    use std::cell::RefCell;

    struct Mem(RefCell<Vec<u8>>);

    impl DmaMemory for Mem {
        fn read(&self, addr: u64, buf: &mut [u8]) -> Result<(), DmaError> {
            let m = self.0.borrow();
            let a = addr as usize;
            match m.get(a..a + buf.len()) {
                Some(s) if addr < 1 << 32 => {
                    buf.copy_from_slice(s);
                    Ok(())
                }
                _ => Err(DmaError::NotMapped {
                    addr,
                    len: buf.len(),
                }),
            }
        }
        fn write(&self, addr: u64, buf: &[u8]) -> Result<(), DmaError> {
            Err(DmaError::NotMapped {
                addr,
                len: buf.len(),
            })
        }
    }

    fn desc(mem: &Mem, at: usize, attr: u16, len: u16, addr: u64, wide: bool) {
        let mut m = mem.0.borrow_mut();
        m[at..at + 2].copy_from_slice(&attr.to_le_bytes());
        m[at + 2..at + 4].copy_from_slice(&len.to_le_bytes());
        if wide {
            m[at + 4..at + 12].copy_from_slice(&addr.to_le_bytes());
        } else {
            m[at + 4..at + 8].copy_from_slice(&(addr as u32).to_le_bytes());
        }
    }

    const TRAN: u16 = adma2_attr::TRAN_VALID;
    const LINK: u16 = adma2_attr::ACT_LINK | adma2_attr::VALID;

    #[test]
    fn tran_link_nop_and_end_in_both_widths() {
        for wide in [false, true] {
            let mem = Mem(RefCell::new(vec![0; 4096]));
            let d = desc_len(wide) as usize;
            desc(&mem, 0x100, TRAN, 512, 0x1000, wide);
            desc(&mem, 0x100 + d, TRAN | adma2_attr::INT, 0, 0x2000, wide);
            desc(&mem, 0x100 + 2 * d, LINK, 0, 0x400, wide);
            desc(&mem, 0x400, adma2_attr::VALID | 0b01 << 4, 0, 0, wide);
            desc(&mem, 0x400 + d, adma2_attr::NOP_END_VALID, 0, 0, wide);
            let c = walk(&mem, 0x100, wide);
            assert_eq!(c.total, 512 + 65_536, "length 0 is 64 KiB");
            assert_eq!(
                c.segs,
                [
                    AdmaSeg {
                        addr: 0x1000,
                        len: 512,
                        desc: 0x100
                    },
                    AdmaSeg {
                        addr: 0x2000,
                        len: 65_536,
                        desc: 0x100 + d as u64
                    }
                ]
            );
            assert_eq!(c.int_marks, [512 + 65_536]);
            assert_eq!(
                c.end,
                ChainEnd::End {
                    next: 0x400 + 2 * d as u64
                }
            );
            assert_eq!(c.desc_after(512, d as u64, 0), 0x100 + d as u64);
        }
    }

    #[test]
    fn invalid_unreadable_and_looping_tables_stop_with_the_bad_descriptor() {
        let mem = Mem(RefCell::new(vec![0; 4096]));
        desc(&mem, 0, TRAN, 512, 0x1000, false);
        desc(&mem, 8, TRAN & !adma2_attr::VALID, 512, 0x1000, false);
        let c = walk(&mem, 0, false);
        assert_eq!(c.end, ChainEnd::Bad { desc: 8 });
        assert_eq!(c.total, 512);
        // A table beyond memory.
        assert_eq!(
            walk(&mem, 1 << 40, true).end,
            ChainEnd::Bad { desc: 1 << 40 }
        );
        // A Link to itself: bounded, then given up.
        desc(&mem, 64, LINK, 0, 64, false);
        let c = walk(&mem, 64, false);
        assert_eq!(c.end, ChainEnd::Bad { desc: 64 });
        assert!(c.segs.is_empty());
        // Garbage (all ones) is a valid Link with End and Int: the chain ends at once.
        mem.0.borrow_mut()[128..136].fill(0xFF);
        let c = walk(&mem, 128, false);
        assert_eq!(c.end, ChainEnd::End { next: 136 });
        assert_eq!((c.total, c.int_marks.as_slice()), (0, &[0][..]));
        // A Link without End to unmapped memory: that descriptor is the bad one.
        desc(&mem, 256, LINK, 0, 0x8000_0000, false);
        assert_eq!(
            walk(&mem, 256, false).end,
            ChainEnd::Bad { desc: 0x8000_0000 }
        );
    }
}
