//! Backing storage for the card's physical areas.
//!
//! The card addresses its partitions; the store only sees byte offsets into one linear
//! space laid out as `boot1 | boot2 | RPMB | user (incl. general purpose partitions)`,
//! which is the layout QEMU's eMMC model uses, so raw images move between the two
//! (see `docs/image-format.md`). Persistent card state that is not data (EXT_CSD bytes
//! that survive power loss, the RPMB key and write counter, write protection,
//! partitioning) lives in a metadata sidecar the store reads and writes as an opaque
//! TOML table owned by the card.
//!
//! A store never holds the image in memory: a 32 GiB card runs in a few MiB.

mod handoff;
mod image;
mod mapped;
mod mem;
mod prefetch;
mod writer;

pub use image::{read_header, ImageHeader, ImageStore};
pub use mem::{MemStore, NullStore};
pub use prefetch::{PrefetchRead, MIN_PREFETCH_READS};

/// Sizes of the areas of one card, in bytes. All are multiples of 512.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ImageLayout {
    /// Each of the two boot partitions.
    pub boot_bytes: u64,
    /// The RPMB partition.
    pub rpmb_bytes: u64,
    /// The user area as shipped, out of which general purpose partitions are carved.
    pub user_bytes: u64,
}

impl ImageLayout {
    pub fn boot1_offset(&self) -> u64 {
        0
    }
    pub fn boot2_offset(&self) -> u64 {
        self.boot_bytes
    }
    pub fn rpmb_offset(&self) -> u64 {
        2 * self.boot_bytes
    }
    pub fn user_offset(&self) -> u64 {
        2 * self.boot_bytes + self.rpmb_bytes
    }
    /// Total image size in bytes.
    pub fn total_bytes(&self) -> u64 {
        self.user_offset() + self.user_bytes
    }
}

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("{path}: {source}")]
    Io {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("access of {len} bytes at offset {offset} is outside the {size}-byte image")]
    OutOfBounds { offset: u64, len: u64, size: u64 },
    #[error("{path}: image does not match the device model: {problem}")]
    Mismatch { path: String, problem: String },
    #[error("{path}: metadata sidecar: {problem}")]
    BadMetadata { path: String, problem: String },
    #[error("{path}: already exists")]
    Exists { path: String },
    /// A layout no image can have (sizes not multiples of 512, or a total that does not
    /// fit in a file offset); caught before any file is touched.
    #[error("{path}: unusable layout: {problem}")]
    BadLayout { path: String, problem: String },
}

/// What the card needs from its storage. Offsets are absolute in the layout above;
/// implementations reject any access that does not lie entirely inside the image.
pub trait Store {
    fn layout(&self) -> ImageLayout;
    /// Fill `buf` from `offset`. Never-written (sparse) ranges read as zero.
    fn read_at(&mut self, offset: u64, buf: &mut [u8]) -> Result<(), StoreError>;
    fn write_at(&mut self, offset: u64, buf: &[u8]) -> Result<(), StoreError>;
    /// Write `buf` at `offset`, as `write_at`, from a buffer the store may keep: it may
    /// take `buf`'s contents and leave another buffer in its place, so the caller must
    /// treat what `buf` holds afterwards as garbage (and clear it). On an error `buf` is
    /// as it was. A store that writes on a thread of its own (`ImageStore` with
    /// [`ImageStore::set_io_threads`]) saves the copy this way.
    fn write_owned(&mut self, offset: u64, buf: &mut Vec<u8>) -> Result<(), StoreError> {
        self.write_at(offset, buf)
    }
    /// The owner has ended a round of requests and signalled their completions: write
    /// what the store held back. A store may hold small `write_owned` writes back only
    /// once its owner has called this (an owner that never does sees every write go to
    /// the file at once); reads, syncs and fills still see every write made before them.
    /// A failure is reported by the next call, as the kernel reports a failed writeback.
    fn end_batch(&mut self) {}
    /// As `end_batch`, where the owner has a moment but a completion is due soon: write
    /// what the store holds on the caller's thread if that is quick (a few small
    /// writes), and otherwise keep holding it until the next `end_batch`. Nothing is
    /// handed to a helper thread, whose wake-up could take the owner's CPU until past the
    /// completion's instant.
    fn end_batch_here(&mut self) {
        self.end_batch();
    }
    /// The owner paces its completions against the clock and calls `end_batch` only
    /// where handing work to a helper thread cannot delay a completion: the store may
    /// then hold large `write_owned` writes back too, as it holds small ones, instead of
    /// handing each to its writer thread at once. (The owner would otherwise wake that
    /// thread in the last microseconds before a completion is due, and the thread may
    /// take its CPU then.) Off by default.
    fn hold_large_writes(&mut self, _on: bool) {}
    /// The owner will read these ranges in this round, each into its own buffer: a
    /// store may start the copies now on another thread ([`ImageStore`] with
    /// [`ImageStore::set_io_threads`] does, for rounds of [`MIN_PREFETCH_READS`] reads or
    /// more). A later `read_at` of exactly one of them into its buffer then finds the
    /// data there and returns; any other `read_at` reads as before. What `read_at`
    /// returns is the same either way: a write or fill of a range voids its prefetch.
    ///
    /// # Safety
    /// Each `dest..dest + len` must stay valid for writes, and the caller must neither
    /// read nor write those bytes, until a `read_at` into them has returned or
    /// `settle_prefetches` has.
    unsafe fn prefetch(&mut self, _reads: &[PrefetchRead]) {}
    /// Wait for every copy `prefetch` started, used or not. The owner calls it before it
    /// hands any buffer of the round back (publishes a completion) and before the
    /// memory may go away.
    fn settle_prefetches(&mut self) {}
    /// Set `len` bytes at `offset` to `byte`. For `byte == 0` implementations should
    /// deallocate (punch a hole) rather than write zeroes.
    fn fill(&mut self, offset: u64, len: u64, byte: u8) -> Result<(), StoreError>;
    /// Make everything written so far durable (fdatasync for files).
    fn sync(&mut self) -> Result<(), StoreError>;
    /// The card finished programming data it acknowledges as durable (a reliable write,
    /// forced programming, a write with the cache off): make it durable. Stores whose
    /// owner chose to sync only at cache flushes (`serve --image-sync flush`) leave it to
    /// the next `sync`.
    fn sync_program(&mut self) -> Result<(), StoreError> {
        self.sync()
    }
    /// The card's persistent state as last saved, or `None` for a fresh image.
    fn load_card_state(&self) -> Option<toml::Table>;
    /// Whether the store keeps data at all. A store that does not (the simulator's) lets
    /// the card skip copying data it would only throw away.
    fn keeps_data(&self) -> bool {
        true
    }
    /// Replace the card's persistent state durably (write, fsync, rename).
    fn save_card_state(&mut self, state: &toml::Table) -> Result<(), StoreError>;
}

/// Check that `[offset, offset + len)` lies within `size`; shared by the implementations.
pub fn check_bounds(offset: u64, len: u64, size: u64) -> Result<(), StoreError> {
    match offset.checked_add(len) {
        Some(end) if end <= size => Ok(()),
        _ => Err(StoreError::OutOfBounds { offset, len, size }),
    }
}

/// A scratch directory for the stores' tests: in /dev/shm (tmpfs) where there is one,
/// so that the image writer's mapping (`mapped.rs`, tmpfs only) is exercised.
#[cfg(test)]
pub(crate) fn scratch_dir() -> tempfile::TempDir {
    tempfile::tempdir_in("/dev/shm")
        .or_else(|_| tempfile::tempdir())
        .unwrap()
}

/// A scratch file of `len` bytes (sparse), opened for reading and writing, for the
/// stores' tests.
#[cfg(test)]
pub(crate) fn scratch_file(len: u64) -> (tempfile::TempDir, std::fs::File) {
    let dir = scratch_dir();
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open(dir.path().join("img"))
        .unwrap();
    f.set_len(len).unwrap();
    (dir, f)
}
