//! Large image writes on a thread of their own, and large reads split over two.
//!
//! The cache destages up to 1 MiB at a time, and the system call that copies it into the
//! image's page cache takes about as long as everything else the daemon does for the
//! request. With the writer, that copy runs on a second thread while the device thread
//! goes on with the next request.
//!
//! Ordering and durability stay the image store's:
//! * a read, a small write or a fill of a range waits for the queued writes that overlap
//!   it, so every access sees the writes issued before it;
//! * `sync` and `sync_program` wait for every queued write before they return, so what
//!   the card acknowledges as durable (a cache flush, a durable program) is in the file
//!   and survives the daemon being killed;
//! * a write that fails on the thread is reported by the next call into the store, as the
//!   kernel reports a failed writeback at the next `fsync`.
//!
//! Small writes are held back while the owner processes a round of requests, once it
//! says it ends its rounds ([`Writer::end_batch`]): at the end of the round, after its
//! completions have been signalled, a few are written on the caller's thread and more
//! go to the writer thread together, for one hand-over instead of one each. They keep
//! the rules above: a read, fill or sync of their range writes them first, and a large
//! write is queued after them. An owner that paces its completions may have large
//! writes held back too ([`Writer::hold_large_writes`]): the rounds' ends are then the
//! only moments the writer thread is woken.
//!
//! Reads of 64 KiB and more are split in two, the second half read on another thread
//! while the caller reads the first (or by the caller, if that thread has not begun it
//! by then); the call returns when both are in.

use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;
use std::sync::atomic::AtomicU8;
use std::sync::mpsc;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::handoff::{self, COPIED, QUEUED};
use super::mapped::{MapError, MappedImage};

/// Writes shorter than this are done on the caller's thread (after the queued writes
/// they overlap): handing them over costs more than the copy.
pub const MIN_QUEUED_BYTES: usize = 64 << 10;

/// Bytes queued at most; a write beyond waits for room, so memory stays bounded.
const MAX_QUEUED_BYTES: usize = 8 << 20;

/// A round that held back fewer small writes than this writes them itself: a wake-up
/// of the writer thread costs more than a few `pwrite`s, and a paced device thread has
/// the time (with a polling client, waking the writer for one or two writes made the
/// daemon late by tens of microseconds at QD8: three threads on two CPUs).
const HAND_OVER_WRITES: usize = 8;

/// Small writes held back at most before they are handed over without waiting for the
/// round's end.
const MAX_STAGED_BYTES: usize = 1 << 20;

/// Writes held back at most, large ones included (`Writer::hold_large_writes`): as much
/// as the thread's queue holds.
const MAX_HELD_BYTES: usize = MAX_QUEUED_BYTES;

/// Emptied buffers kept for reuse.
const SPARE_BUFFERS: usize = 4;

struct Job {
    offset: u64,
    buf: Vec<u8>,
}

#[derive(Default)]
struct State {
    /// Queued or in-progress writes: (offset, length).
    pending: Vec<(u64, u64)>,
    pending_bytes: usize,
    /// The first write that failed since the last `take_error`.
    error: Option<io::Error>,
    spare: Vec<Vec<u8>>,
    /// Writes the thread copied into its mapping of the image (`mapped.rs`).
    mapped_writes: u64,
}

#[derive(Default)]
struct Shared {
    state: Mutex<State>,
    changed: Condvar,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic on the writer thread while it held the lock leaves plain data behind.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn wait<'a>(&self, guard: MutexGuard<'a, State>) -> MutexGuard<'a, State> {
        self.changed.wait(guard).unwrap_or_else(|p| p.into_inner())
    }
}

pub(super) fn overlaps((o, l): (u64, u64), offset: u64, len: u64) -> bool {
    o < offset.saturating_add(len) && offset < o.saturating_add(l)
}

/// A thread doing the jobs sent to it, in order; dropping it closes the channel and
/// waits for the thread to finish what it was sent.
pub(super) struct Worker<T> {
    name: &'static str,
    jobs: Option<mpsc::Sender<T>>,
    thread: Option<JoinHandle<()>>,
}

impl<T: Send + 'static> Worker<T> {
    /// Start a thread named `name` that does `work` for each job sent, in order. While
    /// jobs come close together it polls for the next one for [`POLL_BETWEEN_JOBS`]
    /// before it goes to sleep (`next_job`).
    pub(super) fn start(
        name: &'static str,
        mut work: impl FnMut(T) + Send + 'static,
    ) -> io::Result<Self> {
        let (tx, rx) = mpsc::channel::<T>();
        let thread = std::thread::Builder::new()
            .name(name.into())
            .spawn(move || {
                let mut streaming = false;
                while let Some(job) = next_job(&rx, POLL_BETWEEN_JOBS, &mut streaming) {
                    work(job);
                }
            })?;
        Ok(Worker {
            name,
            jobs: Some(tx),
            thread: Some(thread),
        })
    }

    /// Hand `job` over; false if the thread is gone.
    pub(super) fn send(&self, job: T) -> bool {
        self.jobs
            .as_ref()
            .is_some_and(|jobs| jobs.send(job).is_ok())
    }
}

impl<T> Drop for Worker<T> {
    fn drop(&mut self) {
        // Closing the channel ends the thread once it has done everything sent.
        self.jobs = None;
        if let Some(thread) = self.thread.take() {
            if thread.join().is_err() {
                log::error!("the {} thread panicked", self.name);
            }
        }
    }
}

/// How long a helper thread (writer, reader, prefetch) polls for its next job before it
/// sleeps, while jobs come as a stream. A job sent within the window starts at once
/// instead of after a wake-up of the thread, which on a virtual CPU takes tens of
/// microseconds, as long as the job (docs/performance.md, issue 16's seventh session):
/// - halves of large reads: both threads were idle 40% of the time, 1 MiB reads at
///   QD4 4.3 GB/s, 8.4-9.8 with the reader kept awake;
/// - prefetch batches: woken for each round, the helper began after the device thread
///   had read most of the round itself (4 KiB random reads, QD32: 293-306k → 323-489k
///   IOPS, QD8: 194-200k → 339-443k);
/// - writer hand-overs: the device thread saves the wake-up's system call, the client
///   a wake-up onto an idle CPU (4 KiB random writes, QD32: 247-289k → 297-376k IOPS).
const POLL_BETWEEN_JOBS: Duration = Duration::from_micros(50);

/// Jobs that come further apart than this are not a stream: the thread sleeps between
/// them without polling first.
const STREAM_GAP: Duration = Duration::from_millis(1);

/// The next job. While jobs come within [`STREAM_GAP`] of each other it is polled for up
/// to `spin` before the thread sleeps; once one has come later than that, the thread
/// sleeps until the next, so a paced device, whose requests are milliseconds apart,
/// costs no polling. None once the sender is gone and everything sent has been taken.
fn next_job<T>(jobs: &mpsc::Receiver<T>, spin: Duration, streaming: &mut bool) -> Option<T> {
    let since = Instant::now();
    if *streaming {
        loop {
            match jobs.try_recv() {
                Ok(job) => return Some(job),
                Err(mpsc::TryRecvError::Disconnected) => return None,
                Err(mpsc::TryRecvError::Empty) if since.elapsed() < spin => std::hint::spin_loop(),
                Err(mpsc::TryRecvError::Empty) => break,
            }
        }
    }
    let job = jobs.recv().ok();
    *streaming = !spin.is_zero() && since.elapsed() < STREAM_GAP;
    job
}

/// Copy a write into the mapping; false if it did not go there, and the caller writes
/// it with `pwrite` (which reports the filesystem's own error, if any). A mapping found
/// unusable says so in the log itself (`mapped.rs`).
fn write_mapped(m: &MappedImage, buf: &[u8], offset: u64) -> bool {
    match m.write_all_at(buf, offset) {
        Ok(()) => true,
        Err(e @ MapError::Failed(_)) => {
            log::debug!("image write at offset {offset} through pwrite: {e}");
            false
        }
        Err(_) => false,
    }
}

/// The image's writer thread and what it has been given.
pub struct Writer {
    shared: Arc<Shared>,
    worker: Worker<Vec<Job>>,
    /// The caller's own handle, for the small writes it does itself.
    file: File,
    /// The mapping the thread copies into, shared (`mapped.rs`): the caller's small
    /// writes go through it too, and reads of pages known to be allocated.
    map: Option<MappedImage>,
    /// Small writes held back until the round ends (`end_batch`).
    staged: Vec<Job>,
    staged_bytes: usize,
    /// The owner ends its rounds: small writes may be held back.
    batching: bool,
    /// Large writes are held back too once batching (`hold_large_writes`).
    hold_large: bool,
}

impl std::fmt::Debug for Writer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let s = self.shared.lock();
        f.debug_struct("Writer")
            .field("pending", &s.pending.len())
            .field("pending_bytes", &s.pending_bytes)
            .field("staged", &self.staged.len())
            .finish()
    }
}

impl Writer {
    /// Start a writer on its own handle of `file`. With `mapped`, the thread copies writes
    /// of [`MIN_QUEUED_BYTES`] and more, and the caller its round-end writes, into a
    /// mapping of the file (`mapped.rs`) where the kernel and the file's filesystem
    /// (tmpfs) allow it; they write with `pwrite` otherwise. (Small writes handed over
    /// to the thread keep `pwrite`: through the mapping there, `randwrite:4k:32` ran at
    /// 299k against 345k requests a second, five alternating runs each.)
    pub fn start(file: &File, mapped: bool) -> io::Result<Writer> {
        let own = file.try_clone()?;
        let file = file.try_clone()?;
        let map = match mapped.then(|| MappedImage::new(&file)) {
            Some(Ok(map)) => Some(map),
            Some(Err(e)) => {
                log::info!("{e}; image I/O goes through pread/pwrite");
                None
            }
            None => None,
        };
        let thread_map = map.clone();
        let shared = Arc::new(Shared::default());
        let on_thread = Arc::clone(&shared);
        let worker = Worker::start("image-writer", move |jobs: Vec<Job>| {
            let mut mapped_writes = 0;
            let results: Vec<io::Result<()>> = jobs
                .iter()
                .map(|job| {
                    let large = job.buf.len() >= MIN_QUEUED_BYTES;
                    if let Some(m) = thread_map.as_ref().filter(|_| large) {
                        if write_mapped(m, &job.buf, job.offset) {
                            mapped_writes += 1;
                            return Ok(());
                        }
                    }
                    file.write_all_at(&job.buf, job.offset)
                })
                .collect();
            let mut s = on_thread.lock();
            s.mapped_writes += mapped_writes;
            for (mut job, result) in jobs.into_iter().zip(results) {
                let len = job.buf.len() as u64;
                if let Some(i) = s.pending.iter().position(|&p| p == (job.offset, len)) {
                    s.pending.swap_remove(i);
                }
                s.pending_bytes -= job.buf.len();
                if let Err(e) = result {
                    log::error!("image write of {len} bytes at offset {}: {e}", job.offset);
                    s.error.get_or_insert(e);
                }
                // Only buffers of the size queued writes have are worth keeping: small
                // ones would stand in for a destage buffer and have to grow.
                if s.spare.len() < SPARE_BUFFERS && job.buf.capacity() >= MIN_QUEUED_BYTES {
                    job.buf.clear();
                    s.spare.push(job.buf);
                }
            }
            drop(s);
            on_thread.changed.notify_all();
        })?;
        Ok(Writer {
            shared,
            worker,
            file: own,
            map,
            staged: Vec::new(),
            staged_bytes: 0,
            batching: false,
            hold_large: false,
        })
    }

    /// Queue `buf` for writing at `offset` (bounds checked by the caller); returns an
    /// empty buffer for the caller to fill next. Small writes held back go first.
    pub fn submit(&mut self, offset: u64, buf: Vec<u8>) -> Vec<u8> {
        self.hand_over_staged();
        let mut spare = Vec::new();
        self.queue(vec![Job { offset, buf }], Some(&mut spare));
        spare
    }

    /// A buffer the thread has emptied, if it kept one, for the caller to fill next (as
    /// `submit` returns).
    pub fn spare_buffer(&self) -> Vec<u8> {
        self.shared.lock().spare.pop().unwrap_or_default()
    }

    /// Put `jobs` on the thread's queue, waiting for room; with `spare`, take a buffer
    /// the thread has emptied.
    fn queue(&self, jobs: Vec<Job>, spare: Option<&mut Vec<u8>>) {
        let len: usize = jobs.iter().map(|j| j.buf.len()).sum();
        let mut s = self.shared.lock();
        while s.pending_bytes > 0 && s.pending_bytes + len > MAX_QUEUED_BYTES {
            s = self.shared.wait(s);
        }
        // Two queued writes to one range would land in queue order anyway (one thread),
        // but a read waiting for the range must see both gone: keep each listed.
        s.pending
            .extend(jobs.iter().map(|j| (j.offset, j.buf.len() as u64)));
        s.pending_bytes += len;
        if let Some(spare) = spare {
            *spare = s.spare.pop().unwrap_or_default();
        }
        drop(s);
        if !self.worker.send(jobs) {
            // The thread is gone (it only ends when the writer is dropped): nothing
            // queued will be written, and nobody may wait for it. Record it so the next
            // call reports it.
            let mut s = self.shared.lock();
            s.pending.clear();
            s.pending_bytes = 0;
            s.error
                .get_or_insert_with(|| io::Error::other("the image writer thread has stopped"));
        }
    }

    /// Whether small writes may be held back: the owner has ended a round.
    pub fn batching(&self) -> bool {
        self.batching
    }

    /// Hold large writes back as small ones are, once batching, and hand them to the
    /// thread only at the end of a round ([`Writer::end_batch`]). For an owner that
    /// paces its completions: the card destages its cache as a write's programming
    /// ends, which the owner runs just before that write's completion is due. A
    /// hand-over there woke the thread, which was often put on the owner's CPU and took
    /// it for as long as its copy ran (a median of 100-170 µs, up to 550 µs; 800-900
    /// times in 5 s of paced 128 KiB writes), while the owner was spinning out the
    /// completion's last microseconds (docs/performance.md, issue 16's seventeenth and eighteenth
    /// sessions).
    pub fn hold_large_writes(&mut self, on: bool) {
        self.hold_large = on;
        if !on {
            self.hand_over_staged();
        }
    }

    /// Whether a write of `len` bytes is held back (`stage`) rather than queued.
    pub fn holds(&self, len: usize) -> bool {
        self.batching && (len < MIN_QUEUED_BYTES || self.hold_large)
    }

    /// Hold a write back until the round ends (bounds checked by the caller); see
    /// [`Writer::holds`].
    pub fn stage(&mut self, offset: u64, buf: Vec<u8>) {
        self.staged_bytes += buf.len();
        self.staged.push(Job { offset, buf });
        let most = if self.hold_large {
            MAX_HELD_BYTES
        } else {
            MAX_STAGED_BYTES
        };
        if self.staged_bytes >= most {
            self.hand_over_staged();
        }
    }

    /// The owner's round of requests has ended (and its completions are signalled):
    /// write the small writes held back, fewer than [`HAND_OVER_WRITES`] on this thread,
    /// more, or any large one, on the writer thread in one hand-over. From the first
    /// call on, small writes are held back.
    pub fn end_batch(&mut self) {
        self.batching = true;
        if self.for_the_thread() {
            self.hand_over_staged();
        } else {
            self.write_staged_here();
        }
    }

    /// As [`Writer::end_batch`], but what it would hand over stays held until the next
    /// `end_batch`: the owner has a moment, not the time for the thread's wake-up.
    pub fn end_batch_here(&mut self) {
        self.batching = true;
        if !self.for_the_thread() {
            self.write_staged_here();
        }
    }

    /// Whether the writes held back go to the thread at the end of the round: many, or
    /// a large one (the rest are written in their order, so all go one way).
    fn for_the_thread(&self) -> bool {
        self.staged.len() >= HAND_OVER_WRITES
            || self.staged.iter().any(|j| j.buf.len() >= MIN_QUEUED_BYTES)
    }

    /// Write the small writes held back on this thread, in order, each after the queued
    /// writes it overlaps: what a caller that has to wait for them anyway does.
    fn write_staged_here(&mut self) {
        self.staged_bytes = 0;
        let mut mapped = 0;
        for job in std::mem::take(&mut self.staged) {
            let len = job.buf.len() as u64;
            drop(self.wait_queued(job.offset, len));
            if self
                .map
                .as_ref()
                .is_some_and(|m| write_mapped(m, &job.buf, job.offset))
            {
                mapped += 1;
                continue;
            }
            if let Err(e) = self.file.write_all_at(&job.buf, job.offset) {
                // Reported at the next call into the store, as the thread's failures are.
                log::error!("image write of {len} bytes at offset {}: {e}", job.offset);
                self.shared.lock().error.get_or_insert(e);
            }
        }
        if mapped > 0 {
            self.shared.lock().mapped_writes += mapped;
        }
    }

    /// Queue the small writes held back, in the order they were made.
    fn hand_over_staged(&mut self) {
        if self.staged.is_empty() {
            return;
        }
        self.staged_bytes = 0;
        let jobs = std::mem::take(&mut self.staged);
        self.queue(jobs, None);
    }

    /// Wait until no queued write overlaps `[offset, offset + len)` (writing the
    /// held-back ones first if one does); then report a queued write that failed since
    /// the last report.
    pub fn wait_for(&mut self, offset: u64, len: u64) -> io::Result<()> {
        if self.staged_overlap(offset, len) {
            self.write_staged_here();
        }
        self.wait_queued(offset, len)
            .error
            .take()
            .map_or(Ok(()), Err)
    }

    /// Whether a write held back overlaps `[offset, offset + len)`.
    fn staged_overlap(&self, offset: u64, len: u64) -> bool {
        self.staged
            .iter()
            .any(|j| overlaps((j.offset, j.buf.len() as u64), offset, len))
    }

    /// Wait until no queued write overlaps `[offset, offset + len)`; returns the lock.
    fn wait_queued(&self, offset: u64, len: u64) -> MutexGuard<'_, State> {
        let mut s = self.shared.lock();
        while s.pending.iter().any(|&p| overlaps(p, offset, len)) {
            s = self.shared.wait(s);
        }
        s
    }

    /// Wait until every write held back or queued is in the file; then report as
    /// `wait_for` does.
    pub fn drain(&mut self) -> io::Result<()> {
        self.write_staged_here();
        let mut s = self.shared.lock();
        while !s.pending.is_empty() {
            s = self.shared.wait(s);
        }
        s.error.take().map_or(Ok(()), Err)
    }

    /// Whether a write held back or queued overlaps `[offset, offset + len)`.
    pub fn has_writes_in(&self, offset: u64, len: u64) -> bool {
        self.staged_overlap(offset, len)
            || self
                .shared
                .lock()
                .pending
                .iter()
                .any(|&p| overlaps(p, offset, len))
    }

    /// Writes copied into the mapping of the image so far (by the thread, or by the
    /// caller at the end of a round).
    pub fn mapped_writes(&self) -> u64 {
        self.shared.lock().mapped_writes
    }

    /// Reads copied out of the mapping of the image so far.
    pub fn mapped_reads(&self) -> u64 {
        self.map.as_ref().map_or(0, MappedImage::reads)
    }

    /// Copy `[offset, offset + len)` of the image into `dest` from the mapping, if every
    /// page of it is known to be allocated there (`MappedImage::read_at`); `false`
    /// otherwise. The caller has waited for the writes that overlap the range.
    ///
    /// # Safety
    /// As `MappedImage::read_at`: `dest..dest + len` is valid for writes and not part of
    /// the image's mapping.
    pub unsafe fn read_mapped(&self, dest: *mut u8, len: usize, offset: u64) -> bool {
        // SAFETY: the caller's promise is the one `read_at` asks for.
        self.map
            .as_ref()
            .is_some_and(|m| unsafe { m.read_at(dest, len, offset) })
    }

    /// `[offset, offset + len)` is about to be deallocated (no write to it is queued or
    /// held back): the mapping must populate its pages again before a copy into them.
    pub fn forget_allocated(&self, offset: u64, len: u64) {
        if let Some(m) = &self.map {
            m.forget(offset, len);
        }
    }

    /// The first write that failed since the last call, if any.
    pub fn take_error(&self) -> Option<io::Error> {
        self.shared.lock().error.take()
    }
}

impl Drop for Writer {
    fn drop(&mut self) {
        // The thread writes everything it was given before it ends (`Worker`'s drop).
        self.hand_over_staged();
    }
}

/// Reads of this size and more are split in two halves, one read on a helper thread
/// while the caller reads the other. With a helper that waited to be woken for each
/// half, 256 KiB was the floor (128 KiB reads got slower); with the helper kept awake
/// between halves and the caller reading a half the helper has not begun itself, 64
/// KiB reads gain too (QD4: 2.9-3.1 → 5.6-7.5 GB/s; docs/performance.md).
pub const MIN_SPLIT_READ_BYTES: usize = 64 << 10;

/// A second half of a read, for the helper.
struct HalfRead {
    /// Where the half goes: the caller's buffer, which outlives the copy (the caller
    /// takes the copy back, waiting for it if it is under way, before it returns).
    ptr: *mut u8,
    len: usize,
    offset: u64,
    state: Arc<AtomicU8>,
}

// SAFETY: the pointer is only dereferenced by the helper thread, through `pread` into
// `len` bytes the sending thread reserves for it, and only once the helper has claimed
// the copy (`handoff::begin`); the sender does not touch those bytes until it has taken
// the copy back (`handoff::withdraw`, which waits while the copy is under way).
unsafe impl Send for HalfRead {}

/// A thread that reads the second half of large reads, so that two `pread`s copy out of
/// the page cache at once (as a thread pool does for qemu-storage-daemon).
pub struct Reader {
    worker: Worker<HalfRead>,
    /// Tests hold this to keep the helper from beginning a half.
    #[cfg(test)]
    gate: Arc<Mutex<()>>,
}

impl std::fmt::Debug for Reader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Reader").finish_non_exhaustive()
    }
}

impl Reader {
    pub fn start(file: &File) -> io::Result<Reader> {
        let file = file.try_clone()?;
        #[cfg(test)]
        let gate = Arc::new(Mutex::new(()));
        #[cfg(test)]
        let held = Arc::clone(&gate);
        let worker = Worker::start("image-reader", move |job: HalfRead| {
            #[cfg(test)]
            let _open = held.lock();
            if !handoff::begin(&job.state) {
                return; // the caller read it itself
            }
            // SAFETY: `job.ptr..job.ptr + job.len` is the part of the caller's buffer
            // reserved for this half (see `read_exact_at`): valid for writes, and
            // untouched by anything else while the copy is COPYING.
            let half = unsafe { std::slice::from_raw_parts_mut(job.ptr, job.len) };
            let result = file.read_exact_at(half, job.offset);
            handoff::finish(&job.state, result.is_ok());
        })?;
        Ok(Reader {
            worker,
            #[cfg(test)]
            gate,
        })
    }

    /// Fill `buf` from `offset` of `file` (the store's own handle), the second half on
    /// the helper thread if it gets to it before the caller has read the first; the
    /// caller reads it itself otherwise (or if the helper's read failed, which reports
    /// the error).
    pub fn read_exact_at(&self, file: &File, buf: &mut [u8], offset: u64) -> io::Result<()> {
        // Split on a 4 KiB boundary, so that each half copies whole pages.
        let first_len = (buf.len() / 2) & !4095;
        let (first, second) = buf.split_at_mut(first_len);
        let second_offset = offset + first_len as u64;
        let state = Arc::new(AtomicU8::new(QUEUED));
        let sent = self.worker.send(HalfRead {
            ptr: second.as_mut_ptr(),
            len: second.len(),
            offset: second_offset,
            state: Arc::clone(&state),
        });
        let ours = file.read_exact_at(first, offset);
        // Take the second half back: from here on the helper does not touch it.
        let theirs = if sent && handoff::withdraw(&state) == COPIED {
            Ok(())
        } else {
            file.read_exact_at(second, second_offset)
        };
        ours.and(theirs)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::FileExt;

    fn file() -> (tempfile::TempDir, File) {
        crate::store::scratch_file(64 << 20)
    }

    #[test]
    fn queued_writes_land_in_order_and_drain_waits_for_them() {
        let (_d, f) = file();
        let mut w = Writer::start(&f, true).unwrap();
        // Many overlapping writes of one range: the last one issued must win.
        for i in 0..64u8 {
            w.submit(4096, vec![i; 1 << 20]);
        }
        w.drain().unwrap();
        let mut b = vec![0u8; 1 << 20];
        f.read_exact_at(&mut b, 4096).unwrap();
        assert!(b.iter().all(|&x| x == 63));
    }

    #[test]
    fn wait_for_returns_once_the_overlapping_writes_are_in_the_file() {
        let (_d, f) = file();
        let mut w = Writer::start(&f, true).unwrap();
        for k in 0..16u64 {
            w.submit(k << 20, vec![k as u8 + 1; 1 << 20]);
        }
        w.wait_for(15 << 20, 512).unwrap();
        let mut b = [0u8; 512];
        f.read_exact_at(&mut b, 15 << 20).unwrap();
        assert_eq!(b, [16u8; 512]);
    }

    /// A read-only handle: every write through it fails with EBADF.
    fn read_only_file() -> (tempfile::TempDir, File) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ro");
        std::fs::write(&path, b"x").unwrap();
        let f = File::open(&path).unwrap();
        (dir, f)
    }

    #[test]
    fn a_failed_write_is_reported_once() {
        let (_d, f) = read_only_file();
        let mut w = Writer::start(&f, true).unwrap();
        w.submit(0, vec![1; 4096]);
        assert!(w.drain().is_err());
        assert!(w.drain().is_ok(), "reported once");
    }

    #[test]
    fn a_split_read_fills_both_halves() {
        let (_d, f) = file();
        let data: Vec<u8> = (0..(1 << 20) + 4608).map(|i| (i % 251) as u8).collect();
        f.write_all_at(&data, 12345).unwrap();
        let r = Reader::start(&f).unwrap();
        let mut b = vec![0u8; data.len()];
        r.read_exact_at(&f, &mut b, 12345).unwrap();
        assert_eq!(b, data);
        // Past the end of the file: an error, not a short read.
        let mut tail = vec![0u8; 1 << 20];
        assert!(r.read_exact_at(&f, &mut tail, (64 << 20) - 4096).is_err());
    }

    #[test]
    fn a_helper_stops_polling_once_jobs_come_further_apart_than_a_stream() {
        let (tx, rx) = mpsc::channel();
        let sender = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(20));
            tx.send(1).unwrap();
            tx
        });
        let mut streaming = true;
        assert_eq!(next_job(&rx, POLL_BETWEEN_JOBS, &mut streaming), Some(1));
        assert!(!streaming, "a job 20 ms after the last is not a stream");
        let tx = sender.join().unwrap();
        // Without a window the thread never polls.
        tx.send(2).unwrap();
        assert_eq!(next_job(&rx, Duration::ZERO, &mut streaming), Some(2));
        assert!(!streaming);
        drop(tx);
        assert_eq!(next_job(&rx, POLL_BETWEEN_JOBS, &mut true), None);
    }

    #[test]
    fn a_half_the_helper_has_not_begun_is_read_by_the_caller() {
        let (_d, f) = file();
        let data: Vec<u8> = (0..512 << 10).map(|i| (i % 253) as u8).collect();
        f.write_all_at(&data, 4096).unwrap();
        let r = Reader::start(&f).unwrap();
        // The helper cannot begin: the caller must take its half back and read it,
        // not wait for a thread that is not coming.
        let held = r.gate.lock().unwrap();
        let (tx, rx) = mpsc::channel();
        std::thread::scope(|s| {
            s.spawn(|| {
                let mut b = vec![0u8; data.len()];
                r.read_exact_at(&f, &mut b, 4096).unwrap();
                tx.send(b).unwrap();
            });
            let got = rx.recv_timeout(std::time::Duration::from_secs(60));
            drop(held);
            assert!(got.expect("the caller waited for the helper") == data);
        });
        // With the helper free again, it takes halves as before.
        let mut b = vec![0u8; data.len()];
        r.read_exact_at(&f, &mut b, 4096).unwrap();
        assert!(b == data);
    }

    fn read(f: &File, offset: u64, len: usize) -> Vec<u8> {
        let mut b = vec![0u8; len];
        f.read_exact_at(&mut b, offset).unwrap();
        b
    }

    #[test]
    fn small_writes_wait_for_the_end_of_the_round_once_the_owner_ends_rounds() {
        let (_d, f) = file();
        let mut w = Writer::start(&f, true).unwrap();
        assert!(
            !w.batching(),
            "nothing is held back for an owner that never ends rounds"
        );
        w.end_batch();
        assert!(w.batching());
        w.stage(8192, vec![5; 4096]);
        assert_eq!(
            read(&f, 8192, 4096),
            vec![0; 4096],
            "held back until the round ends"
        );
        // One write: done on this thread, in the file when end_batch returns.
        w.end_batch();
        assert_eq!(read(&f, 8192, 4096), vec![5; 4096]);
        // A few (fewer than HAND_OVER_WRITES): the same.
        for i in 1..=3u8 {
            w.stage(u64::from(i) << 20, vec![i; 4096]);
        }
        w.end_batch();
        for i in 1..=3u8 {
            assert_eq!(read(&f, u64::from(i) << 20, 4096), vec![i; 4096]);
        }
        // Several: handed over together, in the order they were made.
        for i in 0..40u8 {
            w.stage(u64::from(i % 4) * 4096, vec![i; 4096]);
        }
        w.end_batch();
        w.drain().unwrap();
        for k in 0..4u64 {
            let last = (36 + k) as u8;
            assert_eq!(read(&f, k * 4096, 4096), vec![last; 4096], "block {k}");
        }
    }

    #[test]
    fn a_held_back_write_is_seen_by_a_wait_a_drain_a_large_write_and_the_drop() {
        let (_d, f) = file();
        let mut w = Writer::start(&f, true).unwrap();
        w.end_batch();
        // A wait for an overlapping range writes it first.
        w.stage(4096, vec![1; 4096]);
        w.wait_for(6000, 10).unwrap();
        assert_eq!(read(&f, 4096, 4096), vec![1; 4096]);
        // A drain writes them, in the order they were made.
        for v in [9, 8, 2] {
            w.stage(65536, vec![v; 512]);
        }
        w.drain().unwrap();
        assert_eq!(read(&f, 65536, 512), vec![2; 512]);
        // A large write made after it lands after it.
        w.stage(1 << 20, vec![3; 4096]);
        w.submit(1 << 20, vec![4; 128 << 10]);
        w.drain().unwrap();
        assert_eq!(read(&f, 1 << 20, 4096), vec![4; 4096]);
        // Dropping the writer writes what it held back.
        w.stage(2 << 20, vec![6; 4096]);
        w.stage(3 << 20, vec![7; 4096]);
        drop(w);
        assert_eq!(read(&f, 2 << 20, 4096), vec![6; 4096]);
        assert_eq!(read(&f, 3 << 20, 4096), vec![7; 4096]);
    }

    #[test]
    fn large_writes_are_held_for_the_round_only_when_the_owner_asks() {
        let (_d, f) = file();
        let mut w = Writer::start(&f, true).unwrap();
        const LARGE: usize = 128 << 10;
        w.hold_large_writes(true);
        assert!(
            !w.holds(LARGE),
            "nothing is held before the owner ends a round"
        );
        w.end_batch();
        assert!(w.holds(LARGE) && w.holds(4096));
        w.stage(1 << 20, vec![7; LARGE]);
        // Not handed over: the thread was given nothing, and the file has nothing.
        assert!(w.shared.lock().pending.is_empty());
        assert!(w.has_writes_in(1 << 20, 512));
        assert_eq!(read(&f, 1 << 20, LARGE), vec![0; LARGE]);
        // A small write held after it lands after it. With a completion due soon
        // (`end_batch_here`) neither is written or handed over; at the round's end both.
        w.stage(1 << 20, vec![8; 4096]);
        w.end_batch_here();
        assert!(w.shared.lock().pending.is_empty());
        assert_eq!(read(&f, 1 << 20, LARGE), vec![0; LARGE]);
        w.end_batch();
        w.drain().unwrap();
        let mut want = vec![8; 4096];
        want.resize(LARGE, 7);
        assert_eq!(read(&f, 1 << 20, LARGE), want);
        // A few small ones alone are written by `end_batch_here` itself.
        w.stage(5 << 20, vec![4; 4096]);
        w.end_batch_here();
        assert_eq!(read(&f, 5 << 20, 4096), vec![4; 4096]);
        // A wait for the range writes a held one first.
        w.stage(2 << 20, vec![9; LARGE]);
        w.wait_for((2 << 20) + 4096, 512).unwrap();
        assert_eq!(read(&f, 2 << 20, LARGE), vec![9; LARGE]);
        // Held ones are handed over once they reach the bound on held bytes.
        for k in 0..(MAX_HELD_BYTES / LARGE) as u64 {
            w.stage((8 << 20) + k * LARGE as u64, vec![1; LARGE]);
        }
        assert!(w.staged.is_empty(), "handed over at the bound");
        // Off again: what was held is handed over, and large writes are no longer held.
        w.stage(3 << 20, vec![2; LARGE]);
        w.hold_large_writes(false);
        assert!(w.staged.is_empty());
        assert!(!w.holds(LARGE) && w.holds(4096));
        w.drain().unwrap();
        assert_eq!(read(&f, 3 << 20, LARGE), vec![2; LARGE]);
    }

    #[test]
    fn a_round_end_write_that_fails_is_reported_by_the_next_call() {
        let (_d, f) = read_only_file();
        let mut w = Writer::start(&f, true).unwrap();
        w.end_batch();
        w.stage(0, vec![1; 4096]);
        w.end_batch();
        assert!(w.drain().is_err());
        assert!(w.drain().is_ok(), "reported once");
    }

    #[test]
    fn a_write_the_mapping_cannot_take_goes_through_pwrite() {
        let (_d, f) = file();
        let mut w = Writer::start(&f, true).unwrap();
        w.submit(0, vec![1; 1 << 20]);
        w.drain().unwrap();
        let first = w.mapped_writes();
        if super::super::mapped::populate_supported() && super::super::mapped::in_tmpfs(&f).is_ok()
        {
            assert_eq!(first, 1);
        }
        // The file shrinks under the mapping: its pages past the new end cannot be
        // populated, and the write goes through pwrite (which extends the file again).
        f.set_len(1 << 20).unwrap();
        w.submit(32 << 20, vec![2; 1 << 20]);
        w.drain().unwrap();
        assert_eq!(w.mapped_writes(), first, "not through the mapping");
        assert_eq!(read(&f, 32 << 20, 1 << 20), vec![2; 1 << 20]);
        // Without the mapping, nothing goes through one.
        let mut w = Writer::start(&f, false).unwrap();
        w.submit(0, vec![3; 1 << 20]);
        w.drain().unwrap();
        assert_eq!(w.mapped_writes(), 0);
        assert_eq!(read(&f, 0, 1 << 20), vec![3; 1 << 20]);
    }

    #[test]
    fn dropping_the_writer_writes_what_was_queued() {
        let (_d, f) = file();
        let mut w = Writer::start(&f, true).unwrap();
        w.submit(1 << 20, vec![7; 2 << 20]);
        drop(w);
        let mut b = vec![0u8; 2 << 20];
        f.read_exact_at(&mut b, 1 << 20).unwrap();
        assert!(b.iter().all(|&x| x == 7));
    }
}
