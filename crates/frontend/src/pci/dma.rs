//! The client's DMA map: guest memory the device may reach, by bus address.
//!
//! VFIO_USER_DMA_MAP with a file descriptor maps `size` bytes of that file from
//! `offset` into this process (MAP_SHARED, through vm-memory's `MmapRegion`, so the
//! mapping is unmapped when the region is dropped) and places it at bus address
//! `address`. A map without a descriptor would need the client to serve
//! VFIO_USER_DMA_READ/WRITE messages, which the `vfio_user` crate does not offer: it is
//! remembered (so that its unmap succeeds) but gives the device nothing, and a log line
//! says so.
//!
//! Maps may not overlap; an unmap names exactly one earlier map (its address and size),
//! or all of them with VFIO_DMA_UNMAP_FLAG_ALL. A device access must lie entirely inside
//! one map that allows its direction.

use std::collections::BTreeMap;
use std::fs::File;

use vfio_user::{DmaMapFlags, DmaUnmapFlags};
use vm_memory::mmap::MmapRegionBuilder;
use vm_memory::{Bytes, FileOffset, GuestAddress, GuestRegionMmap, MemoryRegionAddress};

use super::device::{DmaError, DmaMemory};

/// Maps one client may hold at once (each is an mmap of this process).
pub const MAX_MAPS: usize = 1024;

/// VFIO_DMA_UNMAP_FLAG_GET_DIRTY_BITMAP, as QEMU and the kernel number it.
const UNMAP_DIRTY_BITMAP: u32 = 1 << 0;
/// VFIO_DMA_UNMAP_FLAG_ALL, as QEMU and the kernel number it. (`vfio_user` 0.1.7 names
/// bit 1 `GET_DIRTY_PAGE_INFO` and bit 2 `UNMAP_ALL`; QEMU sends bit 1 to unmap all.)
const UNMAP_ALL: u32 = 1 << 1;

/// A refused map or unmap.
#[derive(Debug, thiserror::Error)]
pub enum DmaMapError {
    #[error("DMA map of {size:#x} bytes at {addr:#x}: {why}")]
    Map { addr: u64, size: u64, why: String },
    #[error("DMA unmap of {size:#x} bytes at {addr:#x}: {why}")]
    Unmap { addr: u64, size: u64, why: String },
}

/// What a successful map did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mapped {
    /// The device can reach it.
    Shared,
    /// No descriptor came with it: remembered, not reachable.
    Ignored,
}

struct Map {
    size: u64,
    /// None for a map that came without a descriptor.
    region: Option<GuestRegionMmap<()>>,
    read: bool,
    write: bool,
}

/// The maps of the current client, by bus address.
#[derive(Default)]
pub struct DmaMap {
    maps: BTreeMap<u64, Map>,
}

impl DmaMap {
    /// VFIO_USER_DMA_MAP.
    pub fn map(
        &mut self,
        flags: DmaMapFlags,
        offset: u64,
        addr: u64,
        size: u64,
        fd: Option<File>,
    ) -> Result<Mapped, DmaMapError> {
        let refuse = |why: String| DmaMapError::Map { addr, size, why };
        let bits = flags.bits();
        let read = bits & DmaMapFlags::READ.bits() != 0;
        let write = bits & DmaMapFlags::WRITE.bits() != 0;
        if bits & !DmaMapFlags::READ_WRITE.bits() != 0 {
            return Err(refuse(format!("unknown flags {bits:#x}")));
        }
        if !read && !write {
            return Err(refuse("neither readable nor writable".into()));
        }
        if size == 0 {
            return Err(refuse("empty".into()));
        }
        let Some(end) = addr.checked_add(size) else {
            return Err(refuse("past the end of the bus address space".into()));
        };
        if self.maps.len() >= MAX_MAPS {
            return Err(refuse(format!("{MAX_MAPS} maps already")));
        }
        if let Some((&b, m)) = self.maps.range(..end).next_back() {
            if b + m.size > addr {
                return Err(refuse(format!(
                    "overlaps the map of {:#x} bytes at {b:#x}",
                    m.size
                )));
            }
        }
        let Some(file) = fd else {
            self.maps.insert(
                addr,
                Map {
                    size,
                    region: None,
                    read,
                    write,
                },
            );
            return Ok(Mapped::Ignored);
        };
        // A mapping past the end of its file raises SIGBUS when touched: refuse it.
        let meta = file.metadata().map_err(|e| refuse(e.to_string()))?;
        if !meta.is_file() {
            return Err(refuse(
                "the descriptor is not a regular file (memfd)".into(),
            ));
        }
        if offset.checked_add(size).is_none_or(|e| e > meta.len()) {
            return Err(refuse(format!(
                "offset {offset:#x} + size runs past the {:#x}-byte file",
                meta.len()
            )));
        }
        let len = usize::try_from(size).map_err(|_| refuse("too large".into()))?;
        let mut prot = 0;
        if read {
            prot |= libc::PROT_READ;
        }
        if write {
            prot |= libc::PROT_WRITE;
        }
        let mapping = MmapRegionBuilder::new(len)
            .with_file_offset(FileOffset::new(file, offset))
            .with_mmap_prot(prot)
            .with_mmap_flags(libc::MAP_SHARED)
            .build()
            .map_err(|e| refuse(format!("mmap: {e}")))?;
        let region = GuestRegionMmap::new(mapping, GuestAddress(addr))
            .ok_or_else(|| refuse("past the end of the bus address space".into()))?;
        self.maps.insert(
            addr,
            Map {
                size,
                region: Some(region),
                read,
                write,
            },
        );
        Ok(Mapped::Shared)
    }

    /// VFIO_USER_DMA_UNMAP: exactly one earlier map, or all of them.
    pub fn unmap(&mut self, flags: DmaUnmapFlags, addr: u64, size: u64) -> Result<(), DmaMapError> {
        let bits = flags.bits();
        let refuse = |why: String| DmaMapError::Unmap { addr, size, why };
        if bits & UNMAP_DIRTY_BITMAP != 0 {
            return Err(refuse("dirty page tracking is not supported".into()));
        }
        if bits & !UNMAP_ALL != 0 {
            return Err(refuse(format!("unknown flags {bits:#x}")));
        }
        if bits & UNMAP_ALL != 0 {
            self.clear();
            return Ok(());
        }
        match self.maps.get(&addr) {
            Some(m) if m.size == size => {
                self.maps.remove(&addr);
                Ok(())
            }
            Some(m) => Err(refuse(format!(
                "the map at that address has {:#x} bytes",
                m.size
            ))),
            None => Err(refuse("no map starts there".into())),
        }
    }

    /// Forget every map (the client left).
    pub fn clear(&mut self) {
        self.maps.clear();
    }

    /// How many maps are held, and how many of them the device can reach.
    pub fn count(&self) -> (usize, usize) {
        let shared = self.maps.values().filter(|m| m.region.is_some()).count();
        (self.maps.len(), shared)
    }

    /// The device's view, allowed to master the bus or not.
    pub fn access(&self, enabled: bool) -> DmaAccess<'_> {
        DmaAccess { map: self, enabled }
    }

    /// The map holding all of `[addr, addr + len)` and the offset of `addr` in it.
    fn find(&self, addr: u64, len: usize, write: bool) -> Result<(&Map, u64), DmaError> {
        let not_mapped = DmaError::NotMapped { addr, len };
        let (&base, m) = self.maps.range(..=addr).next_back().ok_or(not_mapped)?;
        let off = addr - base;
        if off.checked_add(len as u64).is_none_or(|end| end > m.size) || m.region.is_none() {
            return Err(not_mapped);
        }
        if (write && !m.write) || (!write && !m.read) {
            return Err(DmaError::NotPermitted { addr, len, write });
        }
        Ok((m, off))
    }
}

/// [`DmaMemory`] over a [`DmaMap`].
pub struct DmaAccess<'a> {
    map: &'a DmaMap,
    enabled: bool,
}

impl DmaMemory for DmaAccess<'_> {
    fn read(&self, addr: u64, buf: &mut [u8]) -> Result<(), DmaError> {
        if buf.is_empty() {
            return Ok(());
        }
        if !self.enabled {
            return Err(DmaError::Disabled { addr });
        }
        let (m, off) = self.map.find(addr, buf.len(), false)?;
        let region = m.region.as_ref().ok_or(DmaError::NotMapped {
            addr,
            len: buf.len(),
        })?;
        region
            .read_slice(buf, MemoryRegionAddress(off))
            .map_err(|_| DmaError::NotMapped {
                addr,
                len: buf.len(),
            })
    }

    fn write(&self, addr: u64, buf: &[u8]) -> Result<(), DmaError> {
        if buf.is_empty() {
            return Ok(());
        }
        if !self.enabled {
            return Err(DmaError::Disabled { addr });
        }
        let (m, off) = self.map.find(addr, buf.len(), true)?;
        let region = m.region.as_ref().ok_or(DmaError::NotMapped {
            addr,
            len: buf.len(),
        })?;
        region
            .write_slice(buf, MemoryRegionAddress(off))
            .map_err(|_| DmaError::NotMapped {
                addr,
                len: buf.len(),
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Seek, SeekFrom, Write};

    fn file(len: u64) -> File {
        let mut f = tempfile::tempfile().unwrap();
        f.set_len(len).unwrap();
        f.write_all(&[0xaa; 16]).unwrap();
        f
    }

    const RW: DmaMapFlags = DmaMapFlags::READ_WRITE;

    #[test]
    fn the_device_reads_and_writes_the_file_by_bus_address() {
        let mut m = DmaMap::default();
        let f = file(0x2000);
        let mut view = f.try_clone().unwrap();
        assert_eq!(
            m.map(RW, 0x1000, 0x10_0000, 0x1000, Some(f)).unwrap(),
            Mapped::Shared
        );
        let dma = m.access(true);
        dma.write(0x10_0ffc, &[1, 2, 3, 4]).unwrap();
        let mut back = [0; 4];
        dma.read(0x10_0ffc, &mut back).unwrap();
        assert_eq!(back, [1, 2, 3, 4]);
        view.seek(SeekFrom::Start(0x1ffc)).unwrap();
        let mut in_file = [0; 4];
        view.read_exact(&mut in_file).unwrap();
        assert_eq!(in_file, [1, 2, 3, 4], "MAP_SHARED: the file sees the write");
        // One byte past the end, one before the start, across the end.
        assert!(matches!(
            dma.read(0x10_1000, &mut back[..1]),
            Err(DmaError::NotMapped { .. })
        ));
        assert!(matches!(
            dma.read(0x0f_ffff, &mut back[..1]),
            Err(DmaError::NotMapped { .. })
        ));
        assert!(matches!(
            dma.write(0x10_0ffe, &[0; 4]),
            Err(DmaError::NotMapped { .. })
        ));
        assert!(matches!(
            dma.read(u64::MAX, &mut back),
            Err(DmaError::NotMapped { .. })
        ));
        assert!(matches!(
            m.access(false).read(0x10_0000, &mut back),
            Err(DmaError::Disabled { .. })
        ));
    }

    #[test]
    fn an_access_spanning_two_adjacent_maps_fails() {
        let mut m = DmaMap::default();
        m.map(RW, 0, 0x1000, 0x1000, Some(file(0x1000))).unwrap();
        m.map(RW, 0, 0x2000, 0x1000, Some(file(0x1000))).unwrap();
        let dma = m.access(true);
        dma.write(0x1ff8, &[0; 8]).unwrap();
        dma.write(0x2000, &[0; 8]).unwrap();
        assert!(dma.write(0x1ffc, &[0; 8]).is_err());
    }

    #[test]
    fn overlapping_empty_and_oversized_maps_are_refused() {
        let mut m = DmaMap::default();
        m.map(RW, 0, 0x4000, 0x2000, Some(file(0x2000))).unwrap();
        for (addr, size) in [
            (0x3000, 0x2000),
            (0x5fff, 1),
            (0x4800, 0x100),
            (0x0, 0x10000),
        ] {
            assert!(
                m.map(RW, 0, addr, size, Some(file(0x10000))).is_err(),
                "{addr:#x}"
            );
        }
        assert!(
            m.map(RW, 0, 0x6000, 0, Some(file(0x1000))).is_err(),
            "empty"
        );
        assert!(
            m.map(RW, 0, u64::MAX - 0xfff, 0x2000, None).is_err(),
            "wraps"
        );
        assert!(
            m.map(RW, 0x1000, 0x8000, 0x1000, Some(file(0x1800)))
                .is_err(),
            "past EOF"
        );
        assert!(m
            .map(DmaMapFlags::empty(), 0, 0x8000, 0x1000, Some(file(0x1000)))
            .is_err());
        assert!(m
            .map(
                DmaMapFlags::from_bits_retain(8) | RW,
                0,
                0x8000,
                0x1000,
                None
            )
            .is_err());
        assert!(
            m.map(RW, 0x800, 0x8000, 0x100, Some(file(0x1000))).is_err(),
            "unaligned offset"
        );
        assert_eq!(m.count(), (1, 1));
        m.map(RW, 0, 0x6000, 0x1000, Some(file(0x1000))).unwrap();
        assert_eq!(m.count(), (2, 2), "adjacent is fine");
    }

    #[test]
    fn a_read_only_map_refuses_device_writes() {
        let mut m = DmaMap::default();
        m.map(DmaMapFlags::READ, 0, 0x1000, 0x1000, Some(file(0x1000)))
            .unwrap();
        let dma = m.access(true);
        let mut b = [0; 2];
        dma.read(0x1000, &mut b).unwrap();
        assert_eq!(b, [0xaa, 0xaa]);
        assert!(matches!(
            dma.write(0x1000, &b),
            Err(DmaError::NotPermitted { write: true, .. })
        ));
    }

    #[test]
    fn maps_without_a_file_are_remembered_but_unreachable() {
        let mut m = DmaMap::default();
        assert_eq!(m.map(RW, 0, 0x1000, 0x1000, None).unwrap(), Mapped::Ignored);
        assert!(m.access(true).read(0x1000, &mut [0; 4]).is_err());
        assert!(
            m.map(RW, 0, 0x1800, 0x1000, Some(file(0x1000))).is_err(),
            "overlap"
        );
        m.unmap(DmaUnmapFlags::empty(), 0x1000, 0x1000).unwrap();
        assert_eq!(m.count(), (0, 0));
    }

    #[test]
    fn unmap_is_exact_or_all() {
        let mut m = DmaMap::default();
        m.map(RW, 0, 0x1000, 0x1000, Some(file(0x1000))).unwrap();
        m.map(RW, 0, 0x4000, 0x1000, Some(file(0x1000))).unwrap();
        let none = DmaUnmapFlags::empty();
        assert!(m.unmap(none, 0x1000, 0x800).is_err(), "part of a map");
        assert!(m.unmap(none, 0x0, 0x10000).is_err(), "more than a map");
        assert!(m.unmap(none, 0x2000, 0x1000).is_err(), "nothing there");
        assert!(
            m.unmap(DmaUnmapFlags::from_bits_retain(1), 0x1000, 0x1000)
                .is_err(),
            "dirty"
        );
        m.unmap(none, 0x1000, 0x1000).unwrap();
        assert!(m.access(true).read(0x1000, &mut [0; 1]).is_err(), "gone");
        assert_eq!(m.count(), (1, 1));
        m.unmap(DmaUnmapFlags::from_bits_retain(UNMAP_ALL), 0, 0)
            .unwrap();
        assert_eq!(m.count(), (0, 0));
    }
}
