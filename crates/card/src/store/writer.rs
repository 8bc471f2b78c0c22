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
//! Reads of 256 KiB and more are split in two, the second half read on another thread
//! while the caller reads the first; the call returns when both are in.

use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;
use std::sync::mpsc;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;

/// Writes shorter than this are done on the caller's thread (after the queued writes
/// they overlap): handing them over costs more than the copy.
pub const MIN_QUEUED_BYTES: usize = 64 << 10;

/// Bytes queued at most; a write beyond waits for room, so memory stays bounded.
const MAX_QUEUED_BYTES: usize = 8 << 20;

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

fn overlaps((o, l): (u64, u64), offset: u64, len: u64) -> bool {
    o < offset.saturating_add(len) && offset < o.saturating_add(l)
}

/// A thread doing the jobs sent to it, in order; dropping it closes the channel and
/// waits for the thread to finish what it was sent.
struct Worker<T> {
    name: &'static str,
    jobs: Option<mpsc::Sender<T>>,
    thread: Option<JoinHandle<()>>,
}

impl<T: Send + 'static> Worker<T> {
    fn start(name: &'static str, mut work: impl FnMut(T) + Send + 'static) -> io::Result<Self> {
        let (tx, rx) = mpsc::channel::<T>();
        let thread = std::thread::Builder::new()
            .name(name.into())
            .spawn(move || rx.into_iter().for_each(&mut work))?;
        Ok(Worker {
            name,
            jobs: Some(tx),
            thread: Some(thread),
        })
    }

    /// Hand `job` over; false if the thread is gone.
    fn send(&self, job: T) -> bool {
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

/// The image's writer thread and what it has been given.
pub struct Writer {
    shared: Arc<Shared>,
    worker: Worker<Job>,
}

impl std::fmt::Debug for Writer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let s = self.shared.lock();
        f.debug_struct("Writer")
            .field("pending", &s.pending.len())
            .field("pending_bytes", &s.pending_bytes)
            .finish()
    }
}

impl Writer {
    /// Start a writer on its own handle of `file`.
    pub fn start(file: &File) -> io::Result<Writer> {
        let file = file.try_clone()?;
        let shared = Arc::new(Shared::default());
        let on_thread = Arc::clone(&shared);
        let worker = Worker::start("image-writer", move |mut job: Job| {
            let result = file.write_all_at(&job.buf, job.offset);
            let len = job.buf.len() as u64;
            let mut s = on_thread.lock();
            if let Some(i) = s.pending.iter().position(|&p| p == (job.offset, len)) {
                s.pending.swap_remove(i);
            }
            s.pending_bytes -= job.buf.len();
            if let Err(e) = result {
                log::error!("image write of {len} bytes at offset {}: {e}", job.offset);
                s.error.get_or_insert(e);
            }
            if s.spare.len() < SPARE_BUFFERS {
                job.buf.clear();
                s.spare.push(job.buf);
            }
            drop(s);
            on_thread.changed.notify_all();
        })?;
        Ok(Writer { shared, worker })
    }

    /// Queue `buf` for writing at `offset` (bounds checked by the caller); returns an
    /// empty buffer for the caller to fill next.
    pub fn submit(&self, offset: u64, buf: Vec<u8>) -> Vec<u8> {
        let len = buf.len();
        let mut s = self.shared.lock();
        while s.pending_bytes > 0 && s.pending_bytes + len > MAX_QUEUED_BYTES {
            s = self.shared.wait(s);
        }
        // Two queued writes to one range would land in queue order anyway (one thread),
        // but a read waiting for the range must see both gone: keep each listed.
        s.pending.push((offset, len as u64));
        s.pending_bytes += len;
        let spare = s.spare.pop().unwrap_or_default();
        drop(s);
        if !self.worker.send(Job { offset, buf }) {
            // The thread is gone (it only ends when the writer is dropped): nothing will
            // write this. Record it so the next call reports it.
            let mut s = self.shared.lock();
            if let Some(i) = s.pending.iter().position(|&p| p == (offset, len as u64)) {
                s.pending.swap_remove(i);
            }
            s.pending_bytes -= len;
            s.error
                .get_or_insert_with(|| io::Error::other("the image writer thread has stopped"));
        }
        spare
    }

    /// Wait until no queued write overlaps `[offset, offset + len)`; then report a
    /// queued write that failed since the last report.
    pub fn wait_for(&self, offset: u64, len: u64) -> io::Result<()> {
        let mut s = self.shared.lock();
        while s.pending.iter().any(|&p| overlaps(p, offset, len)) {
            s = self.shared.wait(s);
        }
        s.error.take().map_or(Ok(()), Err)
    }

    /// Wait until every queued write is in the file; then report as `wait_for` does.
    pub fn drain(&self) -> io::Result<()> {
        let mut s = self.shared.lock();
        while !s.pending.is_empty() {
            s = self.shared.wait(s);
        }
        s.error.take().map_or(Ok(()), Err)
    }

    /// The first write that failed since the last call, if any.
    pub fn take_error(&self) -> Option<io::Error> {
        self.shared.lock().error.take()
    }
}

/// Reads of this size and more are split in two halves, one read on a helper thread
/// while the caller reads the other. Measured: 1 MiB reads at QD4 4.1-4.3 → 6.6-6.7
/// GB/s; splitting 128 KiB reads too made them slower (3.3-3.4 → 2.9-3.0 GB/s at QD1),
/// the hand-over costing more than half a copy.
pub const MIN_SPLIT_READ_BYTES: usize = 256 << 10;

/// A second half of a read, for the helper.
struct HalfRead {
    /// Where the half goes: the caller's buffer, which outlives the read (the caller
    /// waits for `done` before it returns).
    ptr: *mut u8,
    len: usize,
    offset: u64,
    done: mpsc::SyncSender<io::Result<()>>,
}

// SAFETY: the pointer is only dereferenced by the helper thread, through `pread` into
// `len` bytes the sending thread reserves for it and does not touch until it has the
// result (see `Reader::read_exact_at`).
unsafe impl Send for HalfRead {}

/// A thread that reads the second half of large reads, so that two `pread`s copy out of
/// the page cache at once (as a thread pool does for qemu-storage-daemon).
pub struct Reader {
    worker: Worker<HalfRead>,
}

impl std::fmt::Debug for Reader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Reader").finish_non_exhaustive()
    }
}

impl Reader {
    pub fn start(file: &File) -> io::Result<Reader> {
        let file = file.try_clone()?;
        let worker = Worker::start("image-reader", move |job: HalfRead| {
            // SAFETY: `job.ptr..job.ptr + job.len` is the part of the caller's buffer
            // reserved for this half (see `read_exact_at`): valid for writes, written by
            // nothing else until the caller has the result.
            let half = unsafe { std::slice::from_raw_parts_mut(job.ptr, job.len) };
            let result = file.read_exact_at(half, job.offset);
            // The caller waits for this; if it is gone, nothing is left to tell.
            let _ = job.done.send(result);
        })?;
        Ok(Reader { worker })
    }

    /// Fill `buf` from `offset` of `file` (the store's own handle), the second half on
    /// the helper thread.
    pub fn read_exact_at(&self, file: &File, buf: &mut [u8], offset: u64) -> io::Result<()> {
        // Split on a 4 KiB boundary, so that each half copies whole pages.
        let first_len = (buf.len() / 2) & !4095;
        let (first, second) = buf.split_at_mut(first_len);
        let (done_tx, done_rx) = mpsc::sync_channel(1);
        let job = HalfRead {
            ptr: second.as_mut_ptr(),
            len: second.len(),
            offset: offset + first_len as u64,
            done: done_tx,
        };
        let sent = self.worker.send(job);
        let ours = file.read_exact_at(first, offset);
        let theirs = if sent {
            // The helper answers every job; a closed channel means it died mid-read.
            done_rx
                .recv()
                .unwrap_or_else(|_| Err(io::Error::other("the image reader thread stopped")))
        } else {
            file.read_exact_at(second, offset + first_len as u64)
        };
        ours.and(theirs)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::FileExt;

    fn file() -> (tempfile::TempDir, File) {
        let dir = tempfile::tempdir().unwrap();
        let f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(dir.path().join("img"))
            .unwrap();
        f.set_len(64 << 20).unwrap();
        (dir, f)
    }

    #[test]
    fn queued_writes_land_in_order_and_drain_waits_for_them() {
        let (_d, f) = file();
        let w = Writer::start(&f).unwrap();
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
        let w = Writer::start(&f).unwrap();
        for k in 0..16u64 {
            w.submit(k << 20, vec![k as u8 + 1; 1 << 20]);
        }
        w.wait_for(15 << 20, 512).unwrap();
        let mut b = [0u8; 512];
        f.read_exact_at(&mut b, 15 << 20).unwrap();
        assert_eq!(b, [16u8; 512]);
    }

    #[test]
    fn a_failed_write_is_reported_once() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ro");
        std::fs::write(&path, b"x").unwrap();
        // A read-only handle: every write fails with EBADF.
        let f = File::open(&path).unwrap();
        let w = Writer::start(&f).unwrap();
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
    fn dropping_the_writer_writes_what_was_queued() {
        let (_d, f) = file();
        let w = Writer::start(&f).unwrap();
        w.submit(1 << 20, vec![7; 2 << 20]);
        drop(w);
        let mut b = vec![0u8; 2 << 20];
        f.read_exact_at(&mut b, 1 << 20).unwrap();
        assert!(b.iter().all(|&x| x == 7));
    }
}
