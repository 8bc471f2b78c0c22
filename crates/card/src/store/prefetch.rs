//! The reads of a round started early, on a helper thread.
//!
//! With a deep queue and no pacing, the device thread is the daemon's bottleneck, and a
//! third of its time goes into the `pread` that copies each small read out of the
//! image's page cache. The owner knows every read of a round before the card model
//! runs it, so the image store can hand those copies to a helper thread at the start of
//! the round, straight into the reads' final buffers (guest memory), while the device
//! thread goes on with the card model. When the card then reads the range,
//! [`Prefetcher::take`] says whether the copy already there may stand.
//!
//! What keeps the result exactly what a `pread` at the card's own moment would give:
//! * a read is prefetched only if no write held back or queued overlaps it then, so the
//!   file already holds everything written before it;
//! * every later store write, fill or held-back write of an overlapping range makes the
//!   prefetch void ([`Prefetcher::invalidate`]) before the file changes; the card then
//!   reads the range itself;
//! * [`Prefetcher::take`] withdraws a copy the helper has not begun (the caller reads
//!   the range itself) and waits for one under way, whether it stands or not, so a late
//!   copy can never land on top of the card's own read; a copy that failed is simply
//!   redone by the caller (which reports the error as before);
//! * [`Prefetcher::settle`] does the same for every copy of the round, taken or not: the
//!   owner calls it before any completion of the round is published, so nothing is
//!   written into a buffer the guest has been given back, or into memory that may be
//!   unmapped.

use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;
use std::sync::atomic::AtomicU8;
use std::sync::Arc;

use super::handoff::{self, withdraw, COPIED, QUEUED};
use super::writer::{overlaps, Worker};

/// A read the owner will make in this round: `len` bytes of the image at `offset`, into
/// the memory at `dest`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PrefetchRead {
    pub offset: u64,
    pub dest: *mut u8,
    pub len: usize,
}

/// Rounds with fewer prefetchable reads than this read everything on the device thread:
/// one read alone (a QD1 client) would wait for the helper's wake-up instead of saving
/// anything.
pub const MIN_PREFETCH_READS: usize = 4;

/// One round's copies for the helper, with their states.
struct Batch {
    reads: Vec<PrefetchRead>,
    states: Arc<[AtomicU8]>,
}

// SAFETY: the pointers are only written through by the helper thread, with `pread` into
// `len` bytes the owner promised (`Prefetcher::issue`) to keep valid and untouched while
// the copy may be under way; the helper starts a copy only by moving its state from
// QUEUED to COPYING, and the owner waits for COPYING to end (`take`, `settle`).
unsafe impl Send for Batch {}

/// A copy of this round as the owner's thread sees it: its destination only as an
/// address to compare (this thread never writes through it, so the prefetcher stays
/// `Send`).
#[derive(Debug, Clone, Copy)]
struct Issued {
    offset: u64,
    dest: u64,
    len: u64,
    /// Index in the round's states.
    index: usize,
    /// No write has touched the range since, and nobody has used the copy yet.
    usable: bool,
}

/// The helper thread and this round's copies.
pub struct Prefetcher {
    worker: Worker<Batch>,
    /// This round's copies by destination address (their memory never overlaps).
    issued: Vec<Issued>,
    states: Option<Arc<[AtomicU8]>>,
}

impl std::fmt::Debug for Prefetcher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Prefetcher")
            .field("issued", &self.issued.len())
            .finish_non_exhaustive()
    }
}

impl Prefetcher {
    /// Start the helper on its own handle of `file`.
    pub fn start(file: &File) -> io::Result<Prefetcher> {
        let file = file.try_clone()?;
        let worker = Worker::start("image-prefetch", move |batch: Batch| {
            for (read, state) in batch.reads.iter().zip(batch.states.iter()) {
                if !handoff::begin(state) {
                    continue; // withdrawn
                }
                // SAFETY: `read.dest` and the `len` bytes after it are memory the owner
                // keeps valid and does not touch while this copy is COPYING (`issue`'s
                // contract; `take` and `settle` wait for it to end).
                let dest = unsafe { std::slice::from_raw_parts_mut(read.dest, read.len) };
                let result = file.read_exact_at(dest, read.offset);
                if let Err(e) = &result {
                    log::debug!(
                        "prefetch of {} bytes at offset {}: {e}; the card reads it itself",
                        read.len,
                        read.offset
                    );
                }
                handoff::finish(state, result.is_ok());
            }
        })?;
        Ok(Prefetcher {
            worker,
            issued: Vec::new(),
            states: None,
        })
    }

    /// Start copying `reads` on the helper thread, in order (bounds and overlapping
    /// writes checked by the caller). A read whose memory overlaps another's is left to
    /// the card. At most one batch per round: a second call before
    /// [`Prefetcher::settle`] is ignored.
    ///
    /// # Safety
    /// Each read's `dest..dest + len` must be valid for writes until the caller has
    /// called [`Prefetcher::take`] for memory overlapping it, or
    /// [`Prefetcher::settle`]; and the caller must neither read nor write those bytes
    /// before then.
    pub unsafe fn issue(&mut self, reads: &[PrefetchRead]) {
        if self.states.is_some() {
            return;
        }
        // Reads into shared memory (a guest's own doing) are the card's alone: in address
        // order, each read is compared with the one reaching furthest before it.
        let mut by_dest: Vec<usize> = (0..reads.len()).collect();
        by_dest.sort_unstable_by_key(|&i| reads[i].dest as usize);
        let mut shared = vec![false; reads.len()];
        let mut furthest: Option<(usize, usize)> = None; // (end, index)
        for &i in &by_dest {
            let start = reads[i].dest as usize;
            if let Some((_, j)) = furthest.filter(|&(end, _)| start < end) {
                shared[i] = true;
                shared[j] = true;
            }
            let end = start.saturating_add(reads[i].len);
            if furthest.is_none_or(|(e, _)| end > e) {
                furthest = Some((end, i));
            }
        }
        // The helper works in the caller's order; `issued` is kept by address.
        let ordered: Vec<PrefetchRead> = reads
            .iter()
            .zip(&shared)
            .filter_map(|(&r, &shared)| (!shared).then_some(r))
            .collect();
        let states: Arc<[AtomicU8]> = ordered.iter().map(|_| AtomicU8::new(QUEUED)).collect();
        self.issued = ordered
            .iter()
            .enumerate()
            .map(|(index, r)| Issued {
                offset: r.offset,
                dest: r.dest as u64,
                len: r.len as u64,
                index,
                usable: true,
            })
            .collect();
        self.issued.sort_unstable_by_key(|i| i.dest);
        self.states = Some(Arc::clone(&states));
        if !self.worker.send(Batch {
            reads: ordered,
            states,
        }) {
            // The thread is gone: nothing will be copied.
            self.withdraw_all();
        }
    }

    /// Whether any copy of this round is outstanding.
    #[cfg(test)]
    pub fn is_idle(&self) -> bool {
        self.states.is_none()
    }

    /// The range `[offset, offset + len)` is about to change in the file: copies of it
    /// made or under way are void.
    pub fn invalidate(&mut self, offset: u64, len: u64) {
        for i in &mut self.issued {
            if overlaps((i.offset, i.len), offset, len) {
                i.usable = false;
            }
        }
    }

    /// The card reads `len` bytes at `offset` into `dest`: true if a copy of this round
    /// put exactly that range there and it stands (the caller then has the data); false
    /// if the caller must read it itself. Either way, no copy into that memory is under
    /// way, or will start, when this returns. A copy is used once.
    pub fn take(&mut self, offset: u64, dest: *mut u8, len: usize) -> bool {
        let Some(states) = &self.states else {
            return false;
        };
        let (dest, len) = (dest as u64, len as u64);
        // The copies whose memory meets [dest, dest + len): `issued` is sorted by
        // address and its ranges do not overlap, so they are consecutive.
        let first = self
            .issued
            .partition_point(|i| i.dest.saturating_add(i.len) <= dest);
        let mut stands = false;
        for i in self.issued[first..]
            .iter_mut()
            .take_while(|i| i.dest < dest.saturating_add(len))
        {
            let s = withdraw(&states[i.index]);
            stands = (i.offset, i.dest, i.len) == (offset, dest, len) && i.usable && s == COPIED;
            i.usable = false;
        }
        stands
    }

    /// End the round: withdraw the copies not begun, wait for those under way; forget
    /// them all.
    pub fn settle(&mut self) {
        if self.states.is_some() {
            self.withdraw_all();
            self.issued.clear();
            self.states = None;
        }
    }

    fn withdraw_all(&self) {
        if let Some(states) = &self.states {
            for state in states.iter() {
                withdraw(state);
            }
        }
    }
}

impl Drop for Prefetcher {
    fn drop(&mut self) {
        // Nothing may be copied into memory after its owner has let go of it.
        self.settle();
    }
}

#[cfg(test)]
impl Prefetcher {
    /// Wait until the helper has dealt with every copy of the round (tests: so that a
    /// copy is known to have landed before the test changes the file).
    pub fn wait_for_helper(&self) {
        if let Some(states) = &self.states {
            for state in states.iter() {
                while !handoff::settled(state) {
                    std::thread::yield_now();
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(bytes: &[u8]) -> (tempfile::TempDir, File) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("img");
        std::fs::write(&path, bytes).unwrap();
        let f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(&path)
            .unwrap();
        (dir, f)
    }

    fn pattern(len: usize) -> Vec<u8> {
        (0..len).map(|i| (i * 7 % 251) as u8).collect()
    }

    fn read(offset: u64, dest: &mut [u8]) -> PrefetchRead {
        PrefetchRead {
            offset,
            dest: dest.as_mut_ptr(),
            len: dest.len(),
        }
    }

    #[test]
    fn a_taken_copy_holds_the_file_data() {
        let data = pattern(64 << 10);
        let (_d, f) = file(&data);
        let mut p = Prefetcher::start(&f).unwrap();
        let mut bufs = vec![vec![0u8; 4096]; 6];
        let reads: Vec<_> = bufs
            .iter_mut()
            .enumerate()
            .map(|(i, b)| read(i as u64 * 8192, b))
            .collect();
        // SAFETY: the buffers outlive `p`'s round (settled below) and are only touched
        // after `take`.
        unsafe { p.issue(&reads) };
        p.wait_for_helper();
        for (i, r) in reads.iter().enumerate() {
            assert!(p.take(r.offset, r.dest, r.len), "read {i} stands");
        }
        p.settle();
        for (i, b) in bufs.iter().enumerate() {
            let at = i * 8192;
            assert_eq!(&b[..], &data[at..at + 4096], "read {i}");
        }
        assert!(p.is_idle());
    }

    #[test]
    fn a_write_of_the_range_voids_the_copy_and_a_copy_is_used_once() {
        let (_d, f) = file(&pattern(16 << 10));
        let mut p = Prefetcher::start(&f).unwrap();
        let mut a = vec![0u8; 4096];
        let mut b = vec![0u8; 4096];
        let (ra, rb) = (read(0, &mut a), read(8192, &mut b));
        // SAFETY: as above.
        unsafe { p.issue(&[ra, rb]) };
        p.wait_for_helper();
        p.invalidate(4095, 2);
        assert!(!p.take(ra.offset, ra.dest, ra.len), "overlapped by a write");
        assert!(p.take(rb.offset, rb.dest, rb.len), "untouched");
        assert!(!p.take(rb.offset, rb.dest, rb.len), "already used");
        p.settle();
    }

    #[test]
    fn a_read_of_part_of_the_copy_is_the_callers_and_voids_it() {
        let (_d, f) = file(&pattern(16 << 10));
        let mut p = Prefetcher::start(&f).unwrap();
        let mut a = vec![0u8; 8192];
        let r = read(0, &mut a);
        // SAFETY: as above.
        unsafe { p.issue(&[r]) };
        p.wait_for_helper();
        // The first half of the memory, with its own offset: not the copy.
        assert!(!p.take(0, r.dest, 4096));
        // And the whole, after that: the caller may have changed the memory.
        assert!(!p.take(r.offset, r.dest, r.len));
        p.settle();
        assert!(p.is_idle());
    }

    #[test]
    fn a_failed_copy_leaves_the_read_to_the_caller() {
        let (_d, f) = file(&pattern(4096));
        let mut p = Prefetcher::start(&f).unwrap();
        let mut a = vec![0u8; 4096];
        // Past the end of the file: read_exact_at fails.
        let r = read(8192, &mut a);
        // SAFETY: as above.
        unsafe { p.issue(&[r]) };
        p.wait_for_helper();
        assert!(!p.take(r.offset, r.dest, r.len));
        p.settle();
    }

    #[test]
    fn reads_into_shared_memory_are_left_to_the_caller() {
        let (_d, f) = file(&pattern(16 << 10));
        let mut p = Prefetcher::start(&f).unwrap();
        let mut a = vec![0u8; 16384];
        // `whole` covers `first` and `last`, which do not meet each other.
        let whole = read(0, &mut a);
        let (first, last) = (read(8192, &mut a[..4096]), read(12288, &mut a[12288..]));
        let mut b = vec![0u8; 4096];
        let other = read(4096, &mut b);
        // SAFETY: as above.
        unsafe { p.issue(&[whole, first, last, other]) };
        p.wait_for_helper();
        assert!(!p.take(whole.offset, whole.dest, whole.len));
        assert!(!p.take(first.offset, first.dest, first.len));
        assert!(!p.take(last.offset, last.dest, last.len));
        assert!(
            p.take(other.offset, other.dest, other.len),
            "its own memory"
        );
        p.settle();
        assert!(
            a.iter().all(|&x| x == 0),
            "nothing was copied into shared memory"
        );
    }

    #[test]
    fn once_take_or_settle_returns_nothing_lands_in_the_memory() {
        let (_d, f) = file(&pattern(1 << 20));
        for _ in 0..50 {
            let mut p = Prefetcher::start(&f).unwrap();
            let mut bufs = vec![vec![0u8; 64 << 10]; 8];
            let reads: Vec<_> = bufs
                .iter_mut()
                .enumerate()
                .map(|(i, b)| read(i as u64 * (64 << 10), b))
                .collect();
            // SAFETY: as above.
            unsafe { p.issue(&reads) };
            // Race the helper: the first half taken at once (withdrawn or waited for),
            // the rest left to `settle`; then mark every buffer and see the marks stay.
            let mut used = Vec::new();
            for r in &reads[..4] {
                used.push(p.take(r.offset, r.dest, r.len));
            }
            for (b, &u) in bufs.iter_mut().zip(&used) {
                if !u {
                    b.fill(0xAA);
                }
            }
            p.settle();
            for b in &mut bufs[4..] {
                b.fill(0xAA);
            }
            drop(p);
            for (i, b) in bufs.iter().enumerate() {
                let kept = i < 4 && used[i];
                assert!(
                    kept || b.iter().all(|&x| x == 0xAA),
                    "buffer {i} written after"
                );
            }
        }
    }
}
