//! Stores that keep no file: a sparse in-memory store for tests and a null store for the
//! simulator, which models time and not data.

use std::collections::HashMap;

use super::{check_bounds, ImageLayout, Store, StoreError};

const CHUNK: u64 = 4096;

/// Sparse in-memory store: only written 4 KiB chunks take memory.
#[derive(Debug, Clone)]
pub struct MemStore {
    layout: ImageLayout,
    chunks: HashMap<u64, Box<[u8; CHUNK as usize]>>,
    card_state: Option<toml::Table>,
    /// Number of `sync` calls, for tests of durability bookkeeping.
    pub syncs: u64,
}

impl MemStore {
    pub fn new(layout: ImageLayout) -> Self {
        MemStore {
            layout,
            chunks: HashMap::new(),
            card_state: None,
            syncs: 0,
        }
    }

    /// Bytes of chunk storage in use.
    pub fn resident_bytes(&self) -> u64 {
        self.chunks.len() as u64 * CHUNK
    }

    /// Walk `[offset, offset+len)` chunk by chunk: (chunk index, offset in chunk, range in caller buffer).
    fn pieces(
        offset: u64,
        len: usize,
    ) -> impl Iterator<Item = (u64, usize, std::ops::Range<usize>)> {
        let mut done = 0usize;
        std::iter::from_fn(move || {
            if done >= len {
                return None;
            }
            let abs = offset + done as u64;
            let chunk = abs / CHUNK;
            let within = (abs % CHUNK) as usize;
            let n = (CHUNK as usize - within).min(len - done);
            let range = done..done + n;
            done += n;
            Some((chunk, within, range))
        })
    }
}

impl Store for MemStore {
    fn layout(&self) -> ImageLayout {
        self.layout
    }

    fn read_at(&mut self, offset: u64, buf: &mut [u8]) -> Result<(), StoreError> {
        check_bounds(offset, buf.len() as u64, self.layout.total_bytes())?;
        for (chunk, within, range) in Self::pieces(offset, buf.len()) {
            let n = range.len();
            match self.chunks.get(&chunk) {
                Some(data) => buf[range].copy_from_slice(&data[within..within + n]),
                None => buf[range].fill(0),
            }
        }
        Ok(())
    }

    fn write_at(&mut self, offset: u64, buf: &[u8]) -> Result<(), StoreError> {
        check_bounds(offset, buf.len() as u64, self.layout.total_bytes())?;
        for (chunk, within, range) in Self::pieces(offset, buf.len()) {
            let n = range.len();
            let data = self
                .chunks
                .entry(chunk)
                .or_insert_with(|| Box::new([0u8; CHUNK as usize]));
            data[within..within + n].copy_from_slice(&buf[range]);
        }
        Ok(())
    }

    fn fill(&mut self, offset: u64, len: u64, byte: u8) -> Result<(), StoreError> {
        check_bounds(offset, len, self.layout.total_bytes())?;
        let len = usize::try_from(len).map_err(|_| StoreError::OutOfBounds {
            offset,
            len,
            size: self.layout.total_bytes(),
        })?;
        for (chunk, within, range) in Self::pieces(offset, len) {
            let n = range.len();
            if byte == 0 && n == CHUNK as usize {
                self.chunks.remove(&chunk);
                continue;
            }
            if byte == 0 && !self.chunks.contains_key(&chunk) {
                continue;
            }
            let data = self
                .chunks
                .entry(chunk)
                .or_insert_with(|| Box::new([0u8; CHUNK as usize]));
            data[within..within + n].fill(byte);
        }
        Ok(())
    }

    fn sync(&mut self) -> Result<(), StoreError> {
        self.syncs += 1;
        Ok(())
    }

    fn load_card_state(&self) -> Option<toml::Table> {
        self.card_state.clone()
    }

    fn save_card_state(&mut self, state: &toml::Table) -> Result<(), StoreError> {
        self.card_state = Some(state.clone());
        Ok(())
    }
}

/// Keeps nothing: reads return zeroes, writes vanish. For the simulator, whose results
/// depend on the timing model and not on data.
#[derive(Debug, Clone)]
pub struct NullStore {
    layout: ImageLayout,
    card_state: Option<toml::Table>,
}

impl NullStore {
    pub fn new(layout: ImageLayout) -> Self {
        NullStore {
            layout,
            card_state: None,
        }
    }
}

impl Store for NullStore {
    fn layout(&self) -> ImageLayout {
        self.layout
    }
    fn read_at(&mut self, offset: u64, buf: &mut [u8]) -> Result<(), StoreError> {
        check_bounds(offset, buf.len() as u64, self.layout.total_bytes())?;
        buf.fill(0);
        Ok(())
    }
    fn keeps_data(&self) -> bool {
        false
    }
    fn write_at(&mut self, offset: u64, buf: &[u8]) -> Result<(), StoreError> {
        check_bounds(offset, buf.len() as u64, self.layout.total_bytes())
    }
    fn fill(&mut self, offset: u64, len: u64, _byte: u8) -> Result<(), StoreError> {
        check_bounds(offset, len, self.layout.total_bytes())
    }
    fn sync(&mut self) -> Result<(), StoreError> {
        Ok(())
    }
    fn load_card_state(&self) -> Option<toml::Table> {
        self.card_state.clone()
    }
    fn save_card_state(&mut self, state: &toml::Table) -> Result<(), StoreError> {
        self.card_state = Some(state.clone());
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn layout() -> ImageLayout {
        ImageLayout {
            boot_bytes: 128 * 1024,
            rpmb_bytes: 128 * 1024,
            user_bytes: 1 << 20,
        }
    }

    #[test]
    fn mem_store_round_trips_across_chunks_and_reads_holes_as_zero() {
        let mut s = MemStore::new(layout());
        let data: Vec<u8> = (0..10_000u32).map(|i| i as u8).collect();
        s.write_at(1000, &data).unwrap();
        let mut back = vec![0xAA; 10_000];
        s.read_at(1000, &mut back).unwrap();
        assert_eq!(back, data);
        let mut hole = [0xAAu8; 16];
        s.read_at(200_000, &mut hole).unwrap();
        assert_eq!(hole, [0u8; 16]);
    }

    #[test]
    fn mem_store_fill_zero_deallocates_and_rejects_out_of_bounds() {
        let mut s = MemStore::new(layout());
        s.write_at(0, &[1u8; 8192]).unwrap();
        s.fill(0, 8192, 0).unwrap();
        assert_eq!(s.resident_bytes(), 0);
        s.fill(10, 5, 0xff).unwrap();
        let mut b = [0u8; 20];
        s.read_at(0, &mut b).unwrap();
        assert_eq!(&b[8..17], &[0, 0, 0xff, 0xff, 0xff, 0xff, 0xff, 0, 0]);
        let end = layout().total_bytes();
        assert!(s.write_at(end - 4, &[0u8; 8]).is_err());
        assert!(s.read_at(u64::MAX - 2, &mut b).is_err());
    }
}
