//! The volatile cache and its durability bookkeeping.
//!
//! Writes accepted into the cache are acknowledged but not durable: they live only here
//! until they are destaged to the medium (the image) because the cache is full, or
//! flushed (FLUSH_CACHE, cache turned off, power-off notification, sleep). The image
//! therefore always holds exactly the durable state, and a power loss simply drops this
//! structure. Keys are absolute sectors in the image layout.
//!
//! Memory is bounded by the cache size the model advertises (CACHE_SIZE).

use std::collections::{HashMap, VecDeque};
use std::hash::{BuildHasherDefault, Hasher};

use crate::store::{Store, StoreError};

const SECTOR: usize = 512;

/// Multiplicative hash for sector numbers: the keys are plain integers chosen by the
/// guest, so SipHash's flooding resistance buys nothing (the map is bounded by the cache
/// capacity) and costs most of the write path.
#[derive(Default)]
struct SectorHasher(u64);

impl Hasher for SectorHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0.rotate_left(5) ^ u64::from(b)).wrapping_mul(0x517c_c1b7_2722_0a95);
        }
    }
    fn write_u64(&mut self, n: u64) {
        self.0 = (self.0.rotate_left(5) ^ n).wrapping_mul(0x517c_c1b7_2722_0a95);
    }
}

type SectorMap<V> = HashMap<u64, V, BuildHasherDefault<SectorHasher>>;

/// Sectors per cache line: the cache works in 4 KiB lines, each with a mask of the
/// sectors it holds, so a 4 KiB write is one map operation, not eight.
const LINE_SECTORS: u64 = 8;
const LINE_BYTES: usize = LINE_SECTORS as usize * SECTOR;

#[derive(Debug, Clone, Copy)]
struct Line {
    /// Bit i: sector (line · 8 + i) is dirty here.
    mask: u8,
    slot: u32,
}

/// The sector mask of `[sector, sector + count)` within the line starting at `line_start`.
fn mask_in_line(line_start: u64, sector: u64, count: u64) -> u8 {
    let end = sector.saturating_add(count);
    if end <= line_start || sector >= line_start + LINE_SECTORS {
        return 0;
    }
    let first = sector.max(line_start) - line_start;
    let last = end.min(line_start + LINE_SECTORS) - line_start;
    (((1u16 << last) - (1u16 << first)) & 0xFF) as u8
}

/// Runs of set bits in `mask` as (first bit, length).
fn mask_runs(mask: u8) -> impl Iterator<Item = (u64, u64)> {
    let mut m = mask;
    std::iter::from_fn(move || {
        if m == 0 {
            return None;
        }
        let first = m.trailing_zeros();
        let len = (m >> first).trailing_ones();
        m &= !(((1u16 << (first + len)) - (1u16 << first)) as u8);
        Some((u64::from(first), u64::from(len)))
    })
}

#[derive(Debug, Default)]
pub struct VolatileCache {
    /// Capacity in sectors.
    capacity: usize,
    /// Keep sector data (false with a store that keeps none: only the bookkeeping of
    /// which sectors are dirty remains, and slots stay empty).
    keeps_data: bool,
    /// Dirty sectors.
    dirty: usize,
    /// Line data, 4 KiB per slot; only the sectors in a line's mask are meaningful.
    slots: Vec<u8>,
    /// Line number (absolute sector / 8) → line.
    index: SectorMap<Line>,
    /// Lines in insertion order for destaging (oldest first). May hold stale entries of
    /// lines that were invalidated; they are skipped.
    order: VecDeque<u64>,
    free: Vec<u32>,
    /// Slots handed out so far.
    next_slot: u32,
    /// Destaged data not yet written: contiguous lines leave in one store write.
    combine: WriteCombine,
}

/// Lines destaged during one `insert`, gathered while they are contiguous on the medium
/// and written as one store write (a 128 KiB write into a full cache destages 32 lines;
/// 32 system calls cost more than the copy). Always empty between calls.
#[derive(Debug, Default)]
struct WriteCombine {
    /// First sector of `buf`.
    sector: u64,
    buf: Vec<u8>,
}

/// Most bytes gathered before a write.
const COMBINE_BYTES: usize = 1 << 20;

impl VolatileCache {
    pub fn new(capacity_sectors: u64, keeps_data: bool) -> VolatileCache {
        VolatileCache {
            capacity: usize::try_from(capacity_sectors).unwrap_or(usize::MAX),
            keeps_data,
            ..Default::default()
        }
    }

    /// Number of dirty (not yet durable) sectors.
    pub fn len(&self) -> usize {
        self.dirty
    }

    pub fn is_empty(&self) -> bool {
        self.dirty == 0
    }

    #[cfg(test)]
    pub fn contains(&self, sector: u64) -> bool {
        self.index
            .get(&(sector / LINE_SECTORS))
            .is_some_and(|l| l.mask & (1 << (sector % LINE_SECTORS)) != 0)
    }

    /// Lines touched by `[sector, sector + count)`: (line number, mask within it).
    fn lines(sector: u64, count: u64) -> impl Iterator<Item = (u64, u8)> {
        let first = sector / LINE_SECTORS;
        let last = (sector + count).div_ceil(LINE_SECTORS);
        (first..last).map(move |line| (line, mask_in_line(line * LINE_SECTORS, sector, count)))
    }

    /// How many sectors would have to be destaged to make room for `[sector, sector+count)`
    /// (write-back happens in whole lines, so a few more may actually go).
    pub fn evictions_needed(&self, sector: u64, count: u64) -> u64 {
        if self.capacity == 0 {
            return 0;
        }
        let new: u32 = Self::lines(sector, count)
            .map(|(line, mask)| {
                let present = self.index.get(&line).map_or(0, |l| l.mask);
                (mask & !present).count_ones()
            })
            .sum();
        (self.dirty + new as usize).saturating_sub(self.capacity) as u64
    }

    /// Copy cached sectors over `buf`, which holds `buf.len()/512` sectors from `sector`.
    pub fn overlay(&self, sector: u64, buf: &mut [u8]) {
        if self.dirty == 0 || !self.keeps_data {
            return;
        }
        let count = (buf.len() / SECTOR) as u64;
        for (line, mask) in Self::lines(sector, count) {
            let Some(l) = self.index.get(&line) else {
                continue;
            };
            for (bit, len) in mask_runs(mask & l.mask) {
                let s = line * LINE_SECTORS + bit;
                let at = (s - sector) as usize * SECTOR;
                let from = l.slot as usize * LINE_BYTES + bit as usize * SECTOR;
                let n = len as usize * SECTOR;
                buf[at..at + n].copy_from_slice(&self.slots[from..from + n]);
            }
        }
    }

    /// Put `count` sectors at `sector` into the cache, `data` holding them (ignored
    /// without data), destaging the oldest lines to `store` when full. Returns the number
    /// of sectors destaged.
    pub fn insert(
        &mut self,
        sector: u64,
        count: u64,
        data: &[u8],
        store: &mut dyn Store,
    ) -> Result<u64, StoreError> {
        let mut destaged = 0;
        for (line, mask) in Self::lines(sector, count) {
            let line_start = line * LINE_SECTORS;
            let existing = self.index.get(&line).copied();
            let new = (mask & !existing.map_or(0, |l| l.mask)).count_ones() as usize;
            while self.dirty + new > self.capacity && self.dirty > 0 {
                let before = self.dirty;
                destaged += self.destage_oldest(store, line)?;
                if self.dirty == before {
                    break;
                }
            }
            let slot = match self.index.get_mut(&line) {
                Some(l) => {
                    l.mask |= mask;
                    l.slot
                }
                None => {
                    let slot = match self.free.pop() {
                        Some(slot) => slot,
                        None => {
                            let slot = self.next_slot;
                            self.next_slot += 1;
                            if self.keeps_data {
                                self.slots.resize(self.slots.len() + LINE_BYTES, 0);
                            }
                            slot
                        }
                    };
                    self.index.insert(line, Line { mask, slot });
                    self.order.push_back(line);
                    slot
                }
            };
            self.dirty += new;
            if self.keeps_data {
                for (bit, len) in mask_runs(mask) {
                    let s = line_start + bit;
                    let from = (s - sector) as usize * SECTOR;
                    let n = len as usize * SECTOR;
                    if let Some(src) = data.get(from..from + n) {
                        let to = slot as usize * LINE_BYTES + bit as usize * SECTOR;
                        self.slots[to..to + n].copy_from_slice(src);
                    }
                }
            }
        }
        self.compact_order();
        self.write_combined(store)?;
        Ok(destaged)
    }

    /// Write what the destaged lines gathered. On failure their sectors go back into the
    /// cache (unless newer data for them is there), so nothing acknowledged is lost.
    fn write_combined(&mut self, store: &mut dyn Store) -> Result<(), StoreError> {
        if self.combine.buf.is_empty() {
            return Ok(());
        }
        let mut c = std::mem::take(&mut self.combine);
        // The store may take the buffer (and write it on a thread of its own).
        let result = store.write_owned(c.sector * SECTOR as u64, &mut c.buf);
        if result.is_err() {
            self.restore(c.sector, &c.buf);
        }
        c.buf.clear();
        self.combine = c;
        result
    }

    /// Put sectors whose write-back failed back into the cache, oldest first.
    fn restore(&mut self, sector: u64, data: &[u8]) {
        let count = (data.len() / SECTOR) as u64;
        for (line, mask) in Self::lines(sector, count)
            .collect::<Vec<_>>()
            .into_iter()
            .rev()
        {
            let present = self.index.get(&line).map_or(0, |l| l.mask);
            let missing = mask & !present;
            if missing == 0 {
                continue;
            }
            let slot = match self.index.get_mut(&line) {
                Some(l) => {
                    l.mask |= missing;
                    l.slot
                }
                None => {
                    let slot = self.free.pop().unwrap_or_else(|| {
                        self.next_slot += 1;
                        self.slots.resize(self.slots.len() + LINE_BYTES, 0);
                        self.next_slot - 1
                    });
                    self.index.insert(
                        line,
                        Line {
                            mask: missing,
                            slot,
                        },
                    );
                    self.order.push_front(line);
                    slot
                }
            };
            self.dirty += missing.count_ones() as usize;
            for (bit, len) in mask_runs(missing) {
                let from = ((line * LINE_SECTORS + bit) - sector) as usize * SECTOR;
                let to = slot as usize * LINE_BYTES + bit as usize * SECTOR;
                let n = len as usize * SECTOR;
                self.slots[to..to + n].copy_from_slice(&data[from..from + n]);
            }
        }
    }

    /// Write the oldest line (other than `keep`, the one being filled) back to the store.
    fn destage_oldest(&mut self, store: &mut dyn Store, keep: u64) -> Result<u64, StoreError> {
        let mut skipped = None;
        let mut result = Ok(0);
        while let Some(line) = self.order.pop_front() {
            if line == keep {
                skipped = Some(line);
                continue;
            }
            let Some(l) = self.index.get(&line).copied() else {
                continue;
            };
            if let Err(e) = self.write_line(store, line, l) {
                self.order.push_front(line);
                result = Err(e);
                break;
            }
            self.index.remove(&line);
            self.free.push(l.slot);
            let n = l.mask.count_ones() as usize;
            self.dirty -= n;
            result = Ok(n as u64);
            break;
        }
        if let Some(line) = skipped {
            self.order.push_front(line);
        }
        result
    }

    /// Hand a destaged line's sectors to the write combiner, writing what it holds first
    /// when they do not continue it.
    fn write_line(&mut self, store: &mut dyn Store, line: u64, l: Line) -> Result<(), StoreError> {
        if !self.keeps_data {
            return Ok(());
        }
        for (bit, len) in mask_runs(l.mask) {
            let sector = line * LINE_SECTORS + bit;
            let c = &self.combine;
            let continues = c.sector + (c.buf.len() / SECTOR) as u64 == sector;
            if !c.buf.is_empty() && (!continues || c.buf.len() >= COMBINE_BYTES) {
                self.write_combined(store)?;
            }
            if self.combine.buf.is_empty() {
                self.combine.sector = sector;
            }
            let from = l.slot as usize * LINE_BYTES + bit as usize * SECTOR;
            let n = len as usize * SECTOR;
            self.combine
                .buf
                .extend_from_slice(&self.slots[from..from + n]);
        }
        Ok(())
    }

    /// Drop stale lines from the order queue when it grows well past the live entries.
    fn compact_order(&mut self) {
        if self.order.len() > 2 * self.index.len() + 64 {
            let index = &self.index;
            let mut seen: SectorMap<()> = SectorMap::default();
            self.order
                .retain(|l| index.contains_key(l) && seen.insert(*l, ()).is_none());
        }
    }

    fn clear_mask(&mut self, line: u64, mask: u8) {
        if let Some(l) = self.index.get_mut(&line) {
            let gone = l.mask & mask;
            l.mask &= !mask;
            self.dirty -= gone.count_ones() as usize;
            if l.mask == 0 {
                let slot = l.slot;
                self.index.remove(&line);
                self.free.push(slot);
            }
        }
    }

    /// Forget cached sectors in `[sector, sector+count)` (they were overwritten on the
    /// medium or erased).
    pub fn invalidate(&mut self, sector: u64, count: u64) {
        if self.dirty == 0 || count == 0 {
            return;
        }
        let count = count.min(u64::MAX - sector);
        let lines_in_range = count / LINE_SECTORS + 2;
        if lines_in_range as usize > self.index.len() {
            let touched: Vec<u64> = self
                .index
                .keys()
                .copied()
                .filter(|&line| mask_in_line(line * LINE_SECTORS, sector, count) != 0)
                .collect();
            for line in touched {
                self.clear_mask(line, mask_in_line(line * LINE_SECTORS, sector, count));
            }
        } else {
            for (line, mask) in Self::lines(sector, count) {
                self.clear_mask(line, mask);
            }
        }
        self.compact_order();
    }

    /// Write every dirty sector to `store`, in sector order, coalescing runs. Returns the
    /// number of sectors written. On error the sectors not yet written stay cached.
    pub fn flush(&mut self, store: &mut dyn Store) -> Result<u64, StoreError> {
        let runs = self.dirty_runs();
        let mut buf: Vec<u8> = Vec::new();
        let mut written = 0u64;
        for (start, count) in runs {
            if self.keeps_data {
                buf.clear();
                buf.resize(count as usize * SECTOR, 0);
                self.overlay(start, &mut buf);
                store.write_owned(start * SECTOR as u64, &mut buf)?;
            }
            for (line, mask) in Self::lines(start, count) {
                self.clear_mask(line, mask);
            }
            written += count;
        }
        self.order.clear();
        Ok(written)
    }

    /// Power loss: everything cached is gone.
    pub fn drop_all(&mut self) {
        self.index.clear();
        self.order.clear();
        self.free.clear();
        self.slots = Vec::new();
        self.next_slot = 0;
        self.dirty = 0;
    }

    /// The dirty sectors as sorted runs `(first sector, count)`.
    pub fn dirty_runs(&self) -> Vec<(u64, u64)> {
        let mut lines: Vec<(u64, u8)> = self.index.iter().map(|(&k, l)| (k, l.mask)).collect();
        lines.sort_unstable();
        let mut runs: Vec<(u64, u64)> = Vec::new();
        for (line, mask) in lines {
            for (bit, len) in mask_runs(mask) {
                let s = line * LINE_SECTORS + bit;
                match runs.last_mut() {
                    Some((start, n)) if *start + *n == s => *n += len,
                    _ => runs.push((s, len)),
                }
            }
        }
        runs
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::{ImageLayout, MemStore};

    fn store() -> MemStore {
        MemStore::new(ImageLayout {
            boot_bytes: 0,
            rpmb_bytes: 0,
            user_bytes: 1 << 20,
        })
    }

    fn sector(fill: u8) -> Vec<u8> {
        vec![fill; SECTOR]
    }

    fn read(s: &mut MemStore, sector: u64) -> u8 {
        let mut b = [0u8; SECTOR];
        s.read_at(sector * 512, &mut b).unwrap();
        b[0]
    }

    #[test]
    fn cached_data_is_not_in_the_store_until_flushed() {
        let mut st = store();
        let mut c = VolatileCache::new(8, true);
        c.insert(5, 1, &sector(0xAB), &mut st).unwrap();
        assert_eq!(read(&mut st, 5), 0);
        let mut buf = vec![0u8; 1024];
        c.overlay(4, &mut buf);
        assert_eq!((buf[0], buf[512]), (0, 0xAB));
        assert_eq!(c.dirty_runs(), vec![(5, 1)]);
        assert_eq!(c.flush(&mut st).unwrap(), 1);
        assert_eq!(read(&mut st, 5), 0xAB);
        assert!(c.is_empty());
    }

    #[test]
    fn a_full_cache_destages_the_oldest_line() {
        let mut st = store();
        let mut c = VolatileCache::new(16, true);
        c.insert(8, 8, &[1u8; 4096], &mut st).unwrap();
        c.insert(16, 8, &[2u8; 4096], &mut st).unwrap();
        assert_eq!(c.evictions_needed(24, 1), 1);
        assert_eq!(
            c.evictions_needed(16, 8),
            0,
            "rewriting cached sectors needs no room"
        );
        assert_eq!(
            c.insert(24, 1, &sector(3), &mut st).unwrap(),
            8,
            "a whole line goes"
        );
        assert_eq!(read(&mut st, 8), 1, "oldest line was written back");
        assert_eq!(read(&mut st, 16), 0);
        assert!(!c.contains(8) && c.contains(16) && c.contains(24));
        assert_eq!(c.len(), 9);
    }

    #[test]
    fn overwrite_in_cache_keeps_one_copy_and_invalidate_forgets() {
        let mut st = store();
        let mut c = VolatileCache::new(4, true);
        c.insert(7, 1, &sector(1), &mut st).unwrap();
        c.insert(7, 1, &sector(2), &mut st).unwrap();
        assert_eq!(c.len(), 1);
        c.invalidate(0, 100);
        assert!(c.is_empty());
        c.insert(7, 1, &sector(3), &mut st).unwrap();
        c.invalidate(7, 1);
        assert_eq!(c.flush(&mut st).unwrap(), 0);
        assert_eq!(read(&mut st, 7), 0);
    }

    #[test]
    fn drop_all_loses_dirty_data() {
        let mut st = store();
        let mut c = VolatileCache::new(4, true);
        c.insert(1, 2, &[9u8; 1024], &mut st).unwrap();
        assert_eq!(c.dirty_runs(), vec![(1, 2)]);
        c.drop_all();
        assert!(c.is_empty());
        assert_eq!(c.flush(&mut st).unwrap(), 0);
        assert_eq!(read(&mut st, 1), 0);
    }

    #[test]
    fn line_masks_and_runs() {
        assert_eq!(mask_in_line(8, 10, 3), 0b0001_1100);
        assert_eq!(mask_in_line(8, 0, 100), 0xFF);
        assert_eq!(mask_in_line(8, 16, 4), 0);
        assert_eq!(mask_in_line(800, 0, 4), 0, "a range ending before the line");
        assert_eq!(
            mask_runs(0b1011_0110).collect::<Vec<_>>(),
            vec![(1, 2), (4, 2), (7, 1)]
        );
        assert_eq!(mask_runs(0xFF).collect::<Vec<_>>(), vec![(0, 8)]);
    }

    #[test]
    fn partial_lines_keep_exactly_their_sectors() {
        let mut st = store();
        let mut c = VolatileCache::new(64, true);
        // Sectors 6..11 straddle two lines.
        let data: Vec<u8> = (0..5 * 512).map(|i| (i / 512 + 1) as u8).collect();
        c.insert(6, 5, &data, &mut st).unwrap();
        assert_eq!(c.len(), 5);
        assert_eq!(c.dirty_runs(), vec![(6, 5)]);
        let mut buf = vec![0u8; 16 * 512];
        c.overlay(0, &mut buf);
        for s in 0..16 {
            let want = if (6..11).contains(&s) { s as u8 - 5 } else { 0 };
            assert_eq!(buf[s * 512], want, "sector {s}");
        }
        c.invalidate(7, 2);
        assert_eq!(c.dirty_runs(), vec![(6, 1), (9, 2)]);
        assert_eq!(c.flush(&mut st).unwrap(), 3);
        assert_eq!(
            (read(&mut st, 6), read(&mut st, 7), read(&mut st, 9)),
            (1, 0, 4)
        );
        assert!(c.is_empty());
    }

    #[test]
    fn without_data_only_the_bookkeeping_remains() {
        let mut st = store();
        let mut c = VolatileCache::new(16, false);
        c.insert(0, 8, &[], &mut st).unwrap();
        c.insert(8, 8, &[], &mut st).unwrap();
        assert_eq!(c.len(), 16);
        assert_eq!(
            c.insert(16, 8, &[], &mut st).unwrap(),
            8,
            "the oldest line goes"
        );
        assert_eq!(c.dirty_runs(), vec![(8, 16)]);
        assert!(c.slots.is_empty());
    }

    /// A store that records its writes and can be told to fail them.
    struct Recording {
        inner: MemStore,
        writes: Vec<(u64, usize)>,
        fail: bool,
    }

    impl Store for Recording {
        fn layout(&self) -> crate::store::ImageLayout {
            self.inner.layout()
        }
        fn read_at(&mut self, offset: u64, buf: &mut [u8]) -> Result<(), StoreError> {
            self.inner.read_at(offset, buf)
        }
        fn write_at(&mut self, offset: u64, buf: &[u8]) -> Result<(), StoreError> {
            if self.fail {
                return Err(StoreError::Io {
                    path: "test".into(),
                    source: std::io::Error::other("injected"),
                });
            }
            self.writes.push((offset, buf.len()));
            self.inner.write_at(offset, buf)
        }
        fn fill(&mut self, offset: u64, len: u64, byte: u8) -> Result<(), StoreError> {
            self.inner.fill(offset, len, byte)
        }
        fn sync(&mut self) -> Result<(), StoreError> {
            Ok(())
        }
        fn load_card_state(&self) -> Option<toml::Table> {
            None
        }
        fn save_card_state(&mut self, _: &toml::Table) -> Result<(), StoreError> {
            Ok(())
        }
    }

    #[test]
    fn contiguous_destaged_lines_leave_in_one_write() {
        let mut st = Recording {
            inner: store(),
            writes: Vec::new(),
            fail: false,
        };
        let mut c = VolatileCache::new(256, true);
        let old: Vec<u8> = (0..256 * 512).map(|i| (i / 512) as u8).collect();
        c.insert(0, 256, &old, &mut st).unwrap();
        assert!(st.writes.is_empty());
        assert_eq!(
            c.insert(1024, 256, &[7u8; 256 * 512], &mut st).unwrap(),
            256
        );
        assert_eq!(st.writes, vec![(0, 256 * 512)], "32 lines, one write");
        for s in [0u64, 100, 255] {
            assert_eq!(read(&mut st.inner, s), s as u8);
        }
    }

    #[test]
    fn a_failed_write_back_leaves_the_data_in_the_cache() {
        let mut st = Recording {
            inner: store(),
            writes: Vec::new(),
            fail: false,
        };
        let mut c = VolatileCache::new(64, true);
        let old: Vec<u8> = (0..64 * 512).map(|i| (i / 512) as u8 + 1).collect();
        c.insert(0, 64, &old, &mut st).unwrap();
        st.fail = true;
        assert!(c.insert(512, 16, &[9u8; 16 * 512], &mut st).is_err());
        st.fail = false;
        assert_eq!(
            c.len(),
            64 + 16,
            "the two destaged lines are back, the new ones in"
        );
        assert_eq!(c.flush(&mut st).unwrap(), 80);
        for s in 0..64u64 {
            assert_eq!(read(&mut st.inner, s), s as u8 + 1, "sector {s}");
        }
        assert_eq!(read(&mut st.inner, 512), 9);
    }

    #[test]
    fn order_queue_stays_bounded_under_churn() {
        let mut st = store();
        let mut c = VolatileCache::new(4, true);
        for i in 0..10_000u64 {
            c.insert(i % 3, 1, &sector(i as u8), &mut st).unwrap();
            c.invalidate(i % 3, 1);
        }
        assert!(c.order.len() <= 2 * c.index.len() + 65);
    }
}
