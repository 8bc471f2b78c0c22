//! Timing of the card's volatile cache. The card keeps the cached data (`card/cache.rs`);
//! this module keeps only where it is, oldest first, so that destaging — when the cache
//! is full or flushed — is costed by the FTL at the right addresses. Accepting a write
//! into the cache costs controller time and a RAM copy, no NAND time.

use std::collections::VecDeque;

use super::Nanos;
use crate::model::CacheTimingModel;

#[derive(Debug, Clone)]
pub struct CacheTiming {
    m: CacheTimingModel,
    /// Cached runs (absolute sector, sectors), oldest first.
    runs: VecDeque<(u64, u64)>,
    dirty: u64,
}

impl CacheTiming {
    pub fn new(m: &CacheTimingModel) -> CacheTiming {
        CacheTiming {
            m: m.clone(),
            runs: VecDeque::with_capacity(64),
            dirty: 0,
        }
    }

    /// Sectors the cache holds as far as timing knows.
    pub fn dirty_sectors(&self) -> u64 {
        self.dirty
    }

    /// A write of `count` sectors at `sector` accepted into the cache.
    pub fn accept(&mut self, sector: u64, count: u64) -> Nanos {
        match self.runs.back_mut() {
            Some((s, n)) if *s + *n == sector => *n += count,
            _ => self.runs.push_back((sector, count)),
        }
        self.dirty += count;
        self.m.accept_command_ns + (count * 512 * self.m.accept_ns_per_kib).div_ceil(1024)
    }

    /// Take the oldest run of at most `max` sectors out of the cache.
    pub fn pop_oldest(&mut self, max: u64) -> Option<(u64, u64)> {
        let (s, n) = self.runs.front_mut()?;
        let k = (*n).min(max);
        let at = *s;
        *s += k;
        *n -= k;
        if *n == 0 {
            self.runs.pop_front();
        }
        self.dirty -= k;
        Some((at, k))
    }

    /// Fixed part of a cache flush.
    pub fn flush(&self) -> Nanos {
        self.m.flush_ns
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepting_costs_command_and_copy_time() {
        let mut c = CacheTiming::new(&CacheTimingModel {
            accept_command_ns: 100,
            accept_ns_per_kib: 50,
            flush_ns: 7,
        });
        assert_eq!(c.accept(0, 8), 100 + 200);
        assert_eq!(c.flush(), 7);
    }

    #[test]
    fn destaging_takes_the_oldest_runs_first_and_splits_them() {
        let mut c = CacheTiming::new(&CacheTimingModel::default());
        c.accept(100, 8);
        c.accept(108, 8); // contiguous: merges
        c.accept(500, 4);
        assert_eq!(c.dirty_sectors(), 20);
        assert_eq!(c.pop_oldest(10), Some((100, 10)));
        assert_eq!(c.pop_oldest(100), Some((110, 6)));
        assert_eq!(c.pop_oldest(100), Some((500, 4)));
        assert_eq!(c.pop_oldest(100), None);
        assert_eq!(c.dirty_sectors(), 0);
    }
}
