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

#[derive(Debug, Default)]
pub struct VolatileCache {
    /// Capacity in sectors.
    capacity: usize,
    /// Keep sector data (false with a store that keeps none: only the bookkeeping of
    /// which sectors are dirty remains, and slots stay empty).
    keeps_data: bool,
    /// Sector data, one 512-byte slot each; grows up to `capacity` slots.
    slots: Vec<u8>,
    /// Absolute sector → slot.
    index: SectorMap<u32>,
    /// Insertion order for destaging (oldest first). May hold stale keys that were
    /// invalidated; they are skipped.
    order: VecDeque<u64>,
    free: Vec<u32>,
    /// Slots handed out so far.
    next_slot: u32,
}

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
        self.index.len()
    }

    pub fn is_empty(&self) -> bool {
        self.index.is_empty()
    }

    #[cfg(test)]
    pub fn contains(&self, sector: u64) -> bool {
        self.index.contains_key(&sector)
    }

    /// How many sectors would have to be destaged to make room for `[sector, sector+count)`.
    pub fn evictions_needed(&self, sector: u64, count: u64) -> u64 {
        if self.capacity == 0 {
            return 0;
        }
        let new = (sector..sector + count)
            .filter(|s| !self.index.contains_key(s))
            .count();
        (self.len() + new).saturating_sub(self.capacity) as u64
    }

    /// Copy cached sectors over `buf`, which holds `buf.len()/512` sectors from `sector`.
    pub fn overlay(&self, sector: u64, buf: &mut [u8]) {
        if self.index.is_empty() || !self.keeps_data {
            return;
        }
        for (i, chunk) in buf.chunks_exact_mut(SECTOR).enumerate() {
            if let Some(&slot) = self.index.get(&(sector + i as u64)) {
                chunk.copy_from_slice(self.slot(slot));
            }
        }
    }

    /// Data of a slot (empty without data).
    fn slot(&self, slot: u32) -> &[u8] {
        let at = slot as usize * SECTOR;
        self.slots.get(at..at + SECTOR).unwrap_or(&[])
    }

    fn fill_slot(&mut self, slot: u32, data: &[u8]) {
        let at = slot as usize * SECTOR;
        if let Some(s) = self.slots.get_mut(at..at + SECTOR) {
            s.copy_from_slice(data);
        }
    }

    /// Put `count` sectors at `sector` into the cache, `data` holding them (ignored
    /// without data), destaging the oldest sectors to `store` when full. Returns the number
    /// of sectors destaged.
    pub fn insert(
        &mut self,
        sector: u64,
        count: u64,
        data: &[u8],
        store: &mut dyn Store,
    ) -> Result<u64, StoreError> {
        let mut destaged = 0;
        for i in 0..count {
            let s = sector + i;
            let chunk = data
                .get(i as usize * SECTOR..(i as usize + 1) * SECTOR)
                .unwrap_or(&[]);
            if let Some(&slot) = self.index.get(&s) {
                self.fill_slot(slot, chunk);
                continue;
            }
            if self.index.len() >= self.capacity {
                destaged += self.destage_oldest(store)?;
            }
            let slot = match self.free.pop() {
                Some(slot) => slot,
                None => {
                    let slot = self.next_slot;
                    self.next_slot += 1;
                    if self.keeps_data {
                        self.slots.resize(self.slots.len() + SECTOR, 0);
                    }
                    slot
                }
            };
            self.fill_slot(slot, chunk);
            self.index.insert(s, slot);
            self.order.push_back(s);
        }
        self.compact_order();
        Ok(destaged)
    }

    fn destage_oldest(&mut self, store: &mut dyn Store) -> Result<u64, StoreError> {
        while let Some(s) = self.order.pop_front() {
            if let Some(slot) = self.index.remove(&s) {
                let result = if self.keeps_data {
                    store.write_at(s * SECTOR as u64, self.slot(slot))
                } else {
                    Ok(())
                };
                if let Err(e) = result {
                    // Keep the data: it is still not durable.
                    self.index.insert(s, slot);
                    self.order.push_front(s);
                    return Err(e);
                }
                self.free.push(slot);
                return Ok(1);
            }
        }
        Ok(0)
    }

    /// Drop stale keys from the order queue when it grows well past the live entries.
    fn compact_order(&mut self) {
        if self.order.len() > 2 * self.index.len() + 64 {
            let index = &self.index;
            let mut seen: SectorMap<()> = SectorMap::default();
            self.order
                .retain(|s| index.contains_key(s) && seen.insert(*s, ()).is_none());
        }
    }

    /// Forget cached sectors in `[sector, sector+count)` (they were overwritten on the
    /// medium or erased).
    pub fn invalidate(&mut self, sector: u64, count: u64) {
        if self.index.is_empty() || count == 0 {
            return;
        }
        let end = sector.saturating_add(count);
        if count as usize > self.index.len() {
            let mut gone = Vec::new();
            self.index.retain(|&s, slot| {
                let keep = s < sector || s >= end;
                if !keep {
                    gone.push(*slot);
                }
                keep
            });
            self.free.extend(gone);
        } else {
            for s in sector..end {
                if let Some(slot) = self.index.remove(&s) {
                    self.free.push(slot);
                }
            }
        }
        self.compact_order();
    }

    /// Write every dirty sector to `store`, in sector order, coalescing runs. Returns the
    /// number of sectors written. On error the sectors not yet written stay cached.
    pub fn flush(&mut self, store: &mut dyn Store) -> Result<u64, StoreError> {
        let mut sectors: Vec<u64> = self.index.keys().copied().collect();
        sectors.sort_unstable();
        let mut run: Vec<u8> = Vec::new();
        let mut written = 0u64;
        let mut i = 0;
        while i < sectors.len() {
            let start = sectors[i];
            let mut j = i;
            run.clear();
            while j < sectors.len() && sectors[j] == start + (j - i) as u64 {
                run.extend_from_slice(self.slot(self.index[&sectors[j]]));
                j += 1;
            }
            if self.keeps_data {
                store.write_at(start * SECTOR as u64, &run)?;
            }
            for s in &sectors[i..j] {
                if let Some(slot) = self.index.remove(s) {
                    self.free.push(slot);
                }
            }
            written += (j - i) as u64;
            i = j;
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
    }

    /// The dirty sectors as sorted runs `(first sector, count)`.
    pub fn dirty_runs(&self) -> Vec<(u64, u64)> {
        let mut sectors: Vec<u64> = self.index.keys().copied().collect();
        sectors.sort_unstable();
        let mut runs: Vec<(u64, u64)> = Vec::new();
        for s in sectors {
            match runs.last_mut() {
                Some((start, n)) if *start + *n == s => *n += 1,
                _ => runs.push((s, 1)),
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
    fn a_full_cache_destages_the_oldest_sector() {
        let mut st = store();
        let mut c = VolatileCache::new(2, true);
        c.insert(1, 1, &sector(1), &mut st).unwrap();
        c.insert(2, 1, &sector(2), &mut st).unwrap();
        assert_eq!(c.evictions_needed(3, 1), 1);
        assert_eq!(c.evictions_needed(2, 1), 0);
        assert_eq!(c.insert(3, 1, &sector(3), &mut st).unwrap(), 1);
        assert_eq!(read(&mut st, 1), 1, "oldest sector was written back");
        assert_eq!(read(&mut st, 2), 0);
        assert!(!c.contains(1) && c.contains(2) && c.contains(3));
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
