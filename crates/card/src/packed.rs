//! Packed commands (JESD84-B45 §6.6.29): the header block that describes several writes
//! (or reads) carried by one CMD23-bounded CMD25 (CMD18) transfer.
//!
//! Header (one 512-byte block for 512-byte sectors; little-endian words):
//! byte 0 version (1), byte 1 R/W (1 read, 2 write), byte 2 number of entries N, bytes 3–7
//! zero; entry i (1-based) at byte 8·i: its CMD23 argument (block count in [15:0], bit 31
//! reliable write, bit 29 tag request), then its CMD18/CMD25 argument (start address).

/// CMD23 argument bits.
pub const CMD23_RELIABLE_WRITE: u32 = 1 << 31;
pub const CMD23_PACKED: u32 = 1 << 30;
pub const CMD23_TAG_REQUEST: u32 = 1 << 29;
pub const CMD23_CONTEXT_ID_SHIFT: u32 = 25;
pub const CMD23_FORCED_PROGRAMMING: u32 = 1 << 24;
pub const CMD23_BLOCK_COUNT_MASK: u32 = 0xFFFF;

pub const HEADER_VERSION: u8 = 0x01;
pub const HEADER_READ: u8 = 0x01;
pub const HEADER_WRITE: u8 = 0x02;
/// Entries that fit in one 512-byte header after the 8-byte preamble.
pub const MAX_ENTRIES_PER_BLOCK: usize = 63;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Direction {
    Read,
    Write,
}

/// One packed entry: the CMD23 argument and the start address it would have had alone.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Entry {
    pub cmd23_arg: u32,
    pub address: u32,
}

impl Entry {
    pub fn new(block_count: u16, address: u32, reliable: bool) -> Entry {
        let mut cmd23_arg = u32::from(block_count);
        if reliable {
            cmd23_arg |= CMD23_RELIABLE_WRITE;
        }
        Entry { cmd23_arg, address }
    }

    pub fn block_count(&self) -> u64 {
        u64::from(self.cmd23_arg & CMD23_BLOCK_COUNT_MASK)
    }

    pub fn reliable(&self) -> bool {
        self.cmd23_arg & CMD23_RELIABLE_WRITE != 0
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Header {
    pub direction: Direction,
    pub entries: Vec<Entry>,
}

/// Why a header is malformed. These are reported as a packed failure without an index.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HeaderError {
    #[error("header is {0} bytes, shorter than one block")]
    Short(usize),
    #[error("version {0:#04x}, expected 0x01")]
    Version(u8),
    #[error("R/W byte {0:#04x} is neither read (1) nor write (2)")]
    Direction(u8),
    #[error("R/W byte says {found:?} but the command is a {expected:?}")]
    WrongDirection {
        found: Direction,
        expected: Direction,
    },
    #[error("0 entries: a packed command needs at least one")]
    NoEntries,
    #[error("{count} entries exceed the card's maximum of {max}")]
    TooManyEntries { count: usize, max: usize },
    #[error("reserved header bytes 3..8 are not zero")]
    Reserved,
    #[error("entry {index}: CMD23 argument {arg:#010x} is not a plain block count (packed or reserved bits set)")]
    EntryArgument { index: usize, arg: u32 },
    #[error("entry {index}: block count 0")]
    EmptyEntry { index: usize },
    #[error("entries carry {entries} blocks plus {header} header blocks, but CMD23 announced {announced}")]
    CountMismatch {
        entries: u64,
        header: u64,
        announced: u64,
    },
}

impl Header {
    /// Parse and validate a header block. `max_entries` is MAX_PACKED_WRITES or
    /// MAX_PACKED_READS for `expected`'s direction.
    pub fn parse(
        block: &[u8],
        expected: Direction,
        max_entries: usize,
    ) -> Result<Header, HeaderError> {
        if block.len() < 512 {
            return Err(HeaderError::Short(block.len()));
        }
        if block[0] != HEADER_VERSION {
            return Err(HeaderError::Version(block[0]));
        }
        let direction = match block[1] {
            HEADER_READ => Direction::Read,
            HEADER_WRITE => Direction::Write,
            other => return Err(HeaderError::Direction(other)),
        };
        if direction != expected {
            return Err(HeaderError::WrongDirection {
                found: direction,
                expected,
            });
        }
        let count = usize::from(block[2]);
        if count == 0 {
            return Err(HeaderError::NoEntries);
        }
        let max = max_entries.min(MAX_ENTRIES_PER_BLOCK);
        if count > max {
            return Err(HeaderError::TooManyEntries { count, max });
        }
        if block[3..8].iter().any(|&b| b != 0) {
            return Err(HeaderError::Reserved);
        }
        let word = |at: usize| {
            u32::from_le_bytes([block[at], block[at + 1], block[at + 2], block[at + 3]])
        };
        let allowed = CMD23_BLOCK_COUNT_MASK | CMD23_RELIABLE_WRITE | CMD23_TAG_REQUEST;
        let mut entries = Vec::with_capacity(count);
        for index in 1..=count {
            let arg = word(8 * index);
            if arg & !allowed != 0
                || (direction == Direction::Read && arg & CMD23_RELIABLE_WRITE != 0)
            {
                return Err(HeaderError::EntryArgument { index, arg });
            }
            let entry = Entry {
                cmd23_arg: arg,
                address: word(8 * index + 4),
            };
            if entry.block_count() == 0 {
                return Err(HeaderError::EmptyEntry { index });
            }
            entries.push(entry);
        }
        Ok(Header { direction, entries })
    }

    /// Total data blocks the entries carry.
    pub fn data_blocks(&self) -> u64 {
        self.entries.iter().map(Entry::block_count).sum()
    }

    /// Encode into one 512-byte header block (for drivers and tests).
    pub fn encode(&self) -> [u8; 512] {
        let mut block = [0u8; 512];
        block[0] = HEADER_VERSION;
        block[1] = match self.direction {
            Direction::Read => HEADER_READ,
            Direction::Write => HEADER_WRITE,
        };
        block[2] = self.entries.len().min(MAX_ENTRIES_PER_BLOCK) as u8;
        for (i, e) in self.entries.iter().take(MAX_ENTRIES_PER_BLOCK).enumerate() {
            let at = 8 * (i + 1);
            block[at..at + 4].copy_from_slice(&e.cmd23_arg.to_le_bytes());
            block[at + 4..at + 8].copy_from_slice(&e.address.to_le_bytes());
        }
        block
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn header(n: usize) -> Header {
        Header {
            direction: Direction::Write,
            entries: (0..n)
                .map(|i| Entry::new(8, 100 * i as u32, i == 1))
                .collect(),
        }
    }

    #[test]
    fn encode_then_parse_round_trips() {
        let h = header(3);
        let block = h.encode();
        assert_eq!(
            u32::from_le_bytes(block[0..4].try_into().unwrap()),
            3 << 16 | 0x02 << 8 | 0x01
        );
        assert_eq!(Header::parse(&block, Direction::Write, 63).unwrap(), h);
        assert_eq!(h.data_blocks(), 24);
        assert!(h.entries[1].reliable());
    }

    #[test]
    fn each_malformation_is_named() {
        let good = header(2).encode();
        let mut b = good;
        b[0] = 2;
        assert_eq!(
            Header::parse(&b, Direction::Write, 63),
            Err(HeaderError::Version(2))
        );
        let mut b = good;
        b[1] = 3;
        assert_eq!(
            Header::parse(&b, Direction::Write, 63),
            Err(HeaderError::Direction(3))
        );
        assert!(matches!(
            Header::parse(&good, Direction::Read, 63),
            Err(HeaderError::WrongDirection { .. })
        ));
        let mut b = good;
        b[2] = 0;
        assert_eq!(
            Header::parse(&b, Direction::Write, 63),
            Err(HeaderError::NoEntries)
        );
        assert_eq!(
            Header::parse(&good, Direction::Write, 1),
            Err(HeaderError::TooManyEntries { count: 2, max: 1 })
        );
        let mut b = good;
        b[5] = 1;
        assert_eq!(
            Header::parse(&b, Direction::Write, 63),
            Err(HeaderError::Reserved)
        );
        let mut b = good;
        b[8 + 3] |= 0x40; // packed bit inside an entry
        assert!(matches!(
            Header::parse(&b, Direction::Write, 63),
            Err(HeaderError::EntryArgument { index: 1, .. })
        ));
        let mut b = good;
        b[16] = 0;
        assert_eq!(
            Header::parse(&b, Direction::Write, 63),
            Err(HeaderError::EmptyEntry { index: 2 })
        );
        assert_eq!(
            Header::parse(&good[..100], Direction::Write, 63),
            Err(HeaderError::Short(100))
        );
    }
}
