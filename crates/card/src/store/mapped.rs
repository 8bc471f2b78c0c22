//! Image writes copied into a shared mapping of the image, and small reads copied out.
//!
//! A `pwrite` of 1 MiB into the page cache takes the file's lock and looks every page up
//! on its own; on this project's machines it copies at about 5 GB/s, while a `memcpy` into
//! pages of the same file that are already mapped runs at 8–9 GB/s (docs/performance.md,
//! issue 16's ninth session). The writer thread therefore keeps a few windows of the image
//! mapped (`MAP_SHARED`) and copies a large write into them. The device thread's own small
//! writes (those it does at the end of a round) use the same windows, through a clone of
//! the same `MappedImage`: a `pwrite` of 4 KiB costs about 1.1 µs there, a copy into a
//! page already populated about 0.45 µs (tenth session).
//!
//! Each window remembers which of its pages it has populated. A copy into those needs no
//! system call at all; only the others are populated first. A page leaves that set before
//! the store deallocates it ([`MappedImage::forget`], called before a hole is punched), so
//! the next copy populates it again. The same set lets a small read be copied out of the
//! mapping ([`MappedImage::read_at`]) where every page it covers is known to be allocated:
//! reading a hole through a shared mapping of a tmpfs file would allocate it (checked in
//! the ninth session), so a read touches no other page and maps no window, and goes to
//! `pread` instead.
//!
//! The data lands in the same page cache a `pwrite` fills, so nothing else changes:
//! `pread` sees it at once, `fdatasync` on the image makes it durable, and it survives the
//! daemon being killed.
//!
//! A store on a full filesystem must report an error, not die: a store into a mapped page
//! that cannot be allocated raises SIGBUS. Every copy is therefore preceded by
//! `madvise(MADV_POPULATE_WRITE)` on its pages (Linux 5.14), which allocates them and
//! reports a failure as an error instead. On such an error the caller writes with
//! `pwrite`, which returns the filesystem's own error (ENOSPC, EIO). A kernel without
//! `MADV_POPULATE_WRITE`, or a file that cannot be mapped shared and writable, turns the
//! mapping off for good.
//!
//! Only for images in tmpfs. There a page, once populated, never needs space again: the
//! copy into it cannot fault. On a disk filesystem the page can be written back between
//! the populate and the copy, and the next store into it asks the filesystem again
//! (`page_mkwrite`): a copy-on-write filesystem (btrfs, or xfs on a shared extent) needs
//! new space for it, a journal that has failed refuses it, and either is a SIGBUS in the
//! middle of the copy. Images on other filesystems are written with `pwrite`, as before;
//! the gain was measured on tmpfs, where the benchmarks and the guest tests keep their
//! images.
//!
//! What is not covered: another process truncating the image file, or punching holes in
//! it, while the daemon runs (the image is the daemon's; a truncated image is a broken one
//! either way).
//!
//! Memory: at most [`MAX_WINDOWS`] windows of [`WINDOW_BYTES`] are mapped, shared by all
//! clones, with one bit per page beside each (128 bytes a window). Their pages
//! are page cache the image's writes fill anyway; they count in the daemon's resident size
//! while mapped (up to 1 GiB), but are not its own memory.
//!
//! Which windows: a window is mapped when a write first needs it. Once the budget is
//! full, a write to a window that is not mapped replaces one only if that one has not
//! been written for [`COLD_AFTER`]; otherwise the write goes through `pwrite`. A stream
//! over more of the image than the budget maps therefore keeps the windows it mapped
//! first and writes the rest with `pwrite`: replacing the least recently used window on
//! every miss would fill and tear down page tables for each write, slower than `pwrite`
//! alone (measured: 3.8 against 4.5 k writes of 1 MiB per second over a 2 GiB span).

use std::fs::File;
use std::io;
use std::os::unix::io::AsRawFd;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Bytes of the image one window maps (its offset is a multiple of this).
pub const WINDOW_BYTES: u64 = 4 << 20;

/// Windows mapped at most (1 GiB of the image).
pub const MAX_WINDOWS: usize = 256;

/// A mapped window not written for this long may be replaced by another.
pub const COLD_AFTER: Duration = Duration::from_secs(1);

/// `statfs`'s type of tmpfs (linux/magic.h).
const TMPFS_MAGIC: u64 = 0x0102_1994;

/// Why a write did not go through the mapping: the caller writes it with `pwrite`.
#[derive(Debug, thiserror::Error)]
pub enum MapError {
    /// The image cannot be mapped for writing here: the kernel has no
    /// `MADV_POPULATE_WRITE`, or the file refuses a shared writable mapping. The mapping
    /// is off from now on.
    #[error("the image cannot be mapped for writing: {0}")]
    Unsupported(io::Error),
    /// A window's pages could not be allocated (a full filesystem, a range past the end
    /// of the file): `pwrite` reports what it is.
    #[error("{0}")]
    Failed(io::Error),
    /// Every window is mapped and none has gone cold: this write goes through `pwrite`.
    #[error("every mapped window is in use")]
    NoRoom,
}

/// One mapped window of the image. It is unmapped when the last handle to it goes: a
/// window the budget gives up stays mapped until a copy still using it has finished.
struct Window {
    /// Offset in the image of the window's first byte.
    base: u64,
    ptr: NonNull<u8>,
    len: usize,
    /// One bit per page: the page is known to be allocated in the file and mapped
    /// writable here (populated through this window), so a copy into it or out of it
    /// cannot fault on space the filesystem lacks, nor allocate a hole.
    allocated: Box<[AtomicU64]>,
}

// SAFETY: the mapping belongs to the window alone and is unmapped once, when the window
// is dropped; copies into it are ordered by the store's own rules (one range is never
// written by two threads at once), and its bits are atomics.
unsafe impl Send for Window {}
// SAFETY: as above; `&Window` gives out only its address and atomic bits.
unsafe impl Sync for Window {}

impl Window {
    /// The window's pages that `[start, start + n)` (offsets in the window) touches.
    fn pages(&self, start: usize, n: usize) -> std::ops::Range<usize> {
        let page = page_size() as usize;
        start / page..(start + n).div_ceil(page)
    }

    fn all_allocated(&self, pages: std::ops::Range<usize>) -> bool {
        pages
            .into_iter()
            .all(|p| self.allocated[p / 64].load(Ordering::Acquire) & (1 << (p % 64)) != 0)
    }

    fn mark_allocated(&self, pages: std::ops::Range<usize>, on: bool) {
        for p in pages {
            let bit = 1u64 << (p % 64);
            if on {
                self.allocated[p / 64].fetch_or(bit, Ordering::Release);
            } else {
                self.allocated[p / 64].fetch_and(!bit, Ordering::Release);
            }
        }
    }
}

impl Drop for Window {
    fn drop(&mut self) {
        // SAFETY: the mapping `MappedImage::window` made with this address and length,
        // unmapped once (the window is being dropped, so no copy into it is running).
        let rc = unsafe { libc::munmap(self.ptr.as_ptr().cast(), self.len) };
        if rc != 0 {
            log::warn!(
                "unmapping the image window at offset {}: {}",
                self.base,
                io::Error::last_os_error()
            );
        }
    }
}

struct Slot {
    window: Arc<Window>,
    /// When it was last written to.
    used: Instant,
}

struct Inner {
    file: File,
    /// The file's size when the mapping started: no window reaches past it.
    size: u64,
    window_bytes: u64,
    max_windows: usize,
    cold_after: Duration,
    windows: Mutex<Vec<Slot>>,
    /// The mapping has been found unusable here (`MapError::Unsupported`).
    off: AtomicBool,
    /// Writes copied through the mapping, and bytes; reads copied out of it.
    writes: AtomicU64,
    bytes: AtomicU64,
    reads: AtomicU64,
}

/// Windows of one image file, mapped for writing. Clones share the windows, so what one
/// thread has populated another copies into without asking the kernel again.
#[derive(Clone)]
pub struct MappedImage {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for MappedImage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MappedImage")
            .field("size", &self.inner.size)
            .field("windows", &self.slots().len())
            .field("writes", &self.inner.writes.load(Ordering::Relaxed))
            .finish()
    }
}

impl MappedImage {
    /// Map windows of `file` (its own handle) as writes need them; refused (with the
    /// reason) for a file outside tmpfs.
    pub fn new(file: &File) -> io::Result<MappedImage> {
        in_tmpfs(file)?;
        Self::with_windows(file, WINDOW_BYTES, MAX_WINDOWS, COLD_AFTER)
    }

    /// As `new`, with windows of `window_bytes` (a multiple of the page size), at most
    /// `max_windows` of them, replaceable once not written for `cold_after`.
    pub fn with_windows(
        file: &File,
        window_bytes: u64,
        max_windows: usize,
        cold_after: Duration,
    ) -> io::Result<MappedImage> {
        let file = file.try_clone()?;
        let size = file.metadata()?.len();
        Ok(MappedImage {
            inner: Arc::new(Inner {
                file,
                size,
                window_bytes: window_bytes.max(page_size()),
                max_windows: max_windows.max(1),
                windows: Mutex::new(Vec::new()),
                cold_after,
                off: AtomicBool::new(false),
                writes: AtomicU64::new(0),
                bytes: AtomicU64::new(0),
                reads: AtomicU64::new(0),
            }),
        })
    }

    /// Writes copied through the mapping so far, and their bytes.
    #[cfg(test)]
    pub fn copied(&self) -> (u64, u64) {
        (
            self.inner.writes.load(Ordering::Relaxed),
            self.inner.bytes.load(Ordering::Relaxed),
        )
    }

    /// Reads copied out of the mapping so far.
    pub fn reads(&self) -> u64 {
        self.inner.reads.load(Ordering::Relaxed)
    }

    fn slots(&self) -> std::sync::MutexGuard<'_, Vec<Slot>> {
        // A panic while the list was held leaves it consistent (every step is one push,
        // swap_remove or field store), so a poisoned lock is still usable.
        self.inner
            .windows
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Copy `buf` to `offset` of the image. On an error nothing is known about what
    /// reached the file: the caller writes the whole of `buf` again with `pwrite`.
    ///
    /// Pages this mapping has populated before are copied into at once; others are
    /// populated first (`MADV_POPULATE_WRITE`), one system call for the piece of the
    /// write in each window.
    pub fn write_all_at(&self, buf: &[u8], offset: u64) -> Result<(), MapError> {
        let end = self.range_end(offset, buf.len())?;
        let mut at = offset;
        while at < end {
            let base = at - at % self.inner.window_bytes;
            let window = self.window(base, true)?;
            let start = (at - base) as usize;
            let n = ((end - at) as usize).min(window.len - start);
            let done = (at - offset) as usize;
            // SAFETY: `start + n <= window.len` (n is capped by it), so the range lies in
            // the window's live mapping (`window` keeps it mapped).
            let dest = unsafe { window.ptr.as_ptr().add(start) };
            let pages = window.pages(start, n);
            if !window.all_allocated(pages.clone()) {
                if let Err(e) = populate_for_write(dest, n) {
                    if let MapError::Unsupported(why) = &e {
                        self.turn_off(why);
                    }
                    return Err(e);
                }
                window.mark_allocated(pages, true);
            }
            // SAFETY: `dest..dest + n` is inside the mapping and its pages are allocated
            // and mapped writable (populated just now or before, and not deallocated
            // since: `forget` clears them first; a truncation of the file by another
            // process could still remove them: see the module's notes);
            // `buf[done..done + n]` is in bounds (`done + n <= buf.len()`), and guest
            // buffers and the mapping do not overlap (the mapping is ours).
            unsafe { std::ptr::copy_nonoverlapping(buf.as_ptr().add(done), dest, n) };
            at += n as u64;
        }
        self.inner.writes.fetch_add(1, Ordering::Relaxed);
        self.inner
            .bytes
            .fetch_add(buf.len() as u64, Ordering::Relaxed);
        Ok(())
    }

    /// Copy `[offset, offset + len)` of the image into `dest` if every page of it is
    /// known to be allocated in a window that is mapped now; `false` (nothing copied)
    /// otherwise, and the caller reads with `pread`. A read never maps a window or
    /// touches a page not known to be allocated: reading a hole of a tmpfs file through
    /// a shared mapping would allocate it.
    ///
    /// # Safety
    /// `dest..dest + len` is valid for writes and does not overlap the image's mapping.
    pub unsafe fn read_at(&self, dest: *mut u8, len: usize, offset: u64) -> bool {
        let Ok(end) = self.range_end(offset, len) else {
            return false;
        };
        let base = offset - offset % self.inner.window_bytes;
        // One window only: a read across two goes to pread.
        if end > base + self.inner.window_bytes {
            return false;
        }
        let Ok(window) = self.window(base, false) else {
            return false;
        };
        let start = (offset - base) as usize;
        if start + len > window.len || !window.all_allocated(window.pages(start, len)) {
            return false;
        }
        // SAFETY: `start + len <= window.len`, so the source lies in the live mapping
        // (`window` keeps it mapped), and its pages are allocated; the caller vouches for
        // `dest`.
        unsafe { std::ptr::copy_nonoverlapping(window.ptr.as_ptr().add(start), dest, len) };
        self.inner.reads.fetch_add(1, Ordering::Relaxed);
        true
    }

    /// `[offset, offset + len)` of the file is about to be deallocated (a hole punched):
    /// its pages are no longer known to be allocated, so the next copy into them
    /// populates them again.
    pub fn forget(&self, offset: u64, len: u64) {
        let end = offset.saturating_add(len);
        for slot in self.slots().iter() {
            let w = &slot.window;
            let (lo, hi) = (offset.max(w.base), end.min(w.base + w.len as u64));
            if lo < hi {
                w.mark_allocated(w.pages((lo - w.base) as usize, (hi - lo) as usize), false);
            }
        }
    }

    /// The mapping cannot be used here: every clone goes to `pread`/`pwrite` from now
    /// on (`write_all_at` answers `Unsupported`, `read_at` false), and the log says so
    /// once.
    fn turn_off(&self, why: &io::Error) {
        if !self.inner.off.swap(true, Ordering::Relaxed) {
            log::info!("the image cannot be mapped for writing: {why}; image I/O goes through pread/pwrite");
        }
    }

    fn range_end(&self, offset: u64, len: usize) -> Result<u64, MapError> {
        offset
            .checked_add(len as u64)
            .filter(|&end| end <= self.inner.size)
            .ok_or_else(|| MapError::Failed(io::Error::from(io::ErrorKind::InvalidInput)))
    }

    /// The window mapping `base` (a multiple of the window size). With `map`, mapped now
    /// if needed, in place of the least recently used one if that has gone cold, and
    /// marked used; without, only a window already mapped.
    fn window(&self, base: u64, map: bool) -> Result<Arc<Window>, MapError> {
        let inner = &*self.inner;
        if inner.off.load(Ordering::Relaxed) {
            return Err(MapError::Unsupported(io::Error::from(
                io::ErrorKind::Unsupported,
            )));
        }
        let mut slots = self.slots();
        if let Some(slot) = slots.iter_mut().find(|s| s.window.base == base) {
            if map {
                slot.used = Instant::now();
            }
            return Ok(Arc::clone(&slot.window));
        }
        if !map {
            return Err(MapError::NoRoom);
        }
        let now = Instant::now();
        if slots.len() >= inner.max_windows {
            let oldest = (0..slots.len())
                .min_by_key(|&i| slots[i].used)
                .expect("at least one window");
            if now.duration_since(slots[oldest].used) < inner.cold_after {
                return Err(MapError::NoRoom);
            }
            // Unmapped when the last copy using it lets go.
            slots.swap_remove(oldest);
        }
        let len = (inner.size - base).min(inner.window_bytes) as usize;
        let offset = libc::off_t::try_from(base)
            .map_err(|_| MapError::Failed(io::Error::from(io::ErrorKind::InvalidInput)))?;
        // SAFETY: a new shared mapping chosen by the kernel (no address given), of the
        // file's own pages; nothing of ours is touched. It is unmapped by the window's
        // `drop` only.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                inner.file.as_raw_fd(),
                offset,
            )
        };
        if ptr == libc::MAP_FAILED {
            let e = io::Error::last_os_error();
            self.turn_off(&e);
            return Err(MapError::Unsupported(e));
        }
        let ptr = NonNull::new(ptr.cast::<u8>()).expect("mmap does not return null");
        let pages = len.div_ceil(page_size() as usize);
        let window = Arc::new(Window {
            base,
            ptr,
            len,
            allocated: (0..pages.div_ceil(64)).map(|_| AtomicU64::new(0)).collect(),
        });
        slots.push(Slot {
            window: Arc::clone(&window),
            used: now,
        });
        Ok(window)
    }
}

/// Ok if `file` lives in tmpfs (see the module's notes); an `Unsupported` error naming
/// its filesystem otherwise.
pub fn in_tmpfs(file: &File) -> io::Result<()> {
    // SAFETY: all-zero bytes are a valid `statfs` (integers only).
    let mut st: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: fstatfs writes only into `st`, which is valid and ours; the descriptor is
    // `file`'s, open for the whole call.
    if unsafe { libc::fstatfs(file.as_raw_fd(), &mut st) } != 0 {
        return Err(io::Error::last_os_error());
    }
    // The type of `f_type` differs between C libraries; the magic fits any of them.
    let magic = st.f_type as u64;
    if magic == TMPFS_MAGIC {
        Ok(())
    } else {
        Err(io::Error::new(
            io::ErrorKind::Unsupported,
            format!("the image is not in tmpfs (filesystem magic {magic:#x})"),
        ))
    }
}

/// Allocate and map writable the pages of `ptr..ptr + len`, so that a copy into them
/// cannot fault on a page the filesystem has no room for.
fn populate_for_write(ptr: *mut u8, len: usize) -> Result<(), MapError> {
    let page = page_size() as usize;
    let start = ptr as usize & !(page - 1);
    let end = ptr as usize + len;
    loop {
        // SAFETY: madvise only changes how the kernel backs our own mapping's pages (the
        // range lies in a window `window` mapped); it touches no memory of ours.
        let rc = unsafe {
            libc::madvise(
                start as *mut libc::c_void,
                end - start,
                libc::MADV_POPULATE_WRITE,
            )
        };
        if rc == 0 {
            return Ok(());
        }
        let e = io::Error::last_os_error();
        match e.raw_os_error() {
            Some(libc::EINTR) => continue,
            Some(libc::EINVAL) => return Err(MapError::Unsupported(e)),
            _ => return Err(MapError::Failed(e)),
        }
    }
}

/// Whether this kernel can populate a mapping ahead of a write (`MADV_POPULATE_WRITE`,
/// Linux 5.14): probed on one anonymous page.
#[cfg(test)]
pub fn populate_supported() -> bool {
    let page = page_size() as usize;
    // SAFETY: a new private anonymous mapping of one page, unmapped below; nothing of
    // ours is touched.
    let ptr = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            page,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    if ptr == libc::MAP_FAILED {
        return false;
    }
    let ok = populate_for_write(ptr.cast(), page).is_ok();
    // SAFETY: the mapping made above, unmapped once.
    unsafe { libc::munmap(ptr, page) };
    ok
}

fn page_size() -> u64 {
    // SAFETY: sysconf reads a constant of the system.
    let n = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    u64::try_from(n).ok().filter(|&n| n > 0).unwrap_or(4096)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::FileExt;

    use crate::store::scratch_file as file;

    fn read(f: &File, offset: u64, len: usize) -> Vec<u8> {
        let mut b = vec![0u8; len];
        f.read_exact_at(&mut b, offset).unwrap();
        b
    }

    /// Skip where the kernel has no MADV_POPULATE_WRITE (before 5.14); say so.
    fn supported(r: Result<(), MapError>) -> bool {
        match r {
            Ok(()) => true,
            Err(MapError::Unsupported(e)) if !populate_supported() => {
                eprintln!("skipped: {e}");
                false
            }
            Err(e) => panic!("{e}"),
        }
    }

    #[test]
    fn writes_across_windows_and_at_the_end_of_the_file_land_where_pread_sees_them() {
        // Windows of 64 KiB, at most two, replaceable at once: a write over three windows
        // replaces one mid-way, and the last window is cut short by the end of the file.
        let size = (256 << 10) + 4096;
        let (_d, f) = file(size);
        let m = MappedImage::with_windows(&f, 64 << 10, 2, Duration::ZERO).unwrap();
        let data: Vec<u8> = (0..(160 << 10)).map(|i| (i % 251) as u8 + 1).collect();
        if !supported(m.write_all_at(&data, 40_000)) {
            return;
        }
        assert_eq!(read(&f, 40_000, data.len()), data);
        assert_eq!(read(&f, 40_000 - 512, 512), vec![0; 512], "nothing before");
        assert!(m.slots().len() <= 2, "{} windows", m.slots().len());
        let tail = vec![9u8; 8192];
        m.write_all_at(&tail, size - 8192).unwrap();
        assert_eq!(read(&f, size - 8192, 8192), tail);
        assert_eq!(m.copied(), (2, data.len() as u64 + 8192));
        // pwrite and the mapping see each other's data: one page cache.
        f.write_all_at(&[7; 512], 40_000).unwrap();
        m.write_all_at(&[8; 512], 40_512).unwrap();
        assert_eq!(read(&f, 40_000, 1024), [[7; 512], [8; 512]].concat());
    }

    #[test]
    fn a_write_past_the_end_of_the_file_is_refused_and_writes_nothing() {
        let (_d, f) = file(1 << 20);
        let m = MappedImage::with_windows(&f, 64 << 10, 4, COLD_AFTER).unwrap();
        let r = m.write_all_at(&[1; 8192], (1 << 20) - 4096);
        assert!(matches!(r, Err(MapError::Failed(_))), "{r:?}");
        assert!(matches!(
            m.write_all_at(&[1; 1], u64::MAX),
            Err(MapError::Failed(_))
        ));
        assert_eq!(read(&f, (1 << 20) - 4096, 4096), vec![0; 4096]);
        assert_eq!(m.copied(), (0, 0));
    }

    /// Bytes of `f` the filesystem has allocated.
    fn allocated(f: &File) -> u64 {
        use std::os::unix::fs::MetadataExt;
        f.metadata().unwrap().blocks() * 512
    }

    fn punch(f: &File, offset: u64, len: u64) {
        // SAFETY: fallocate takes only integers; the descriptor is `f`'s, open throughout.
        let rc = unsafe {
            libc::fallocate(
                f.as_raw_fd(),
                libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
                offset as libc::off_t,
                len as libc::off_t,
            )
        };
        assert_eq!(rc, 0, "{}", io::Error::last_os_error());
    }

    #[test]
    fn reads_come_from_the_mapping_only_where_pages_are_known_allocated() {
        let (_d, f) = file(1 << 20);
        let m = MappedImage::with_windows(&f, 256 << 10, 4, COLD_AFTER).unwrap();
        let mut b = vec![0xAAu8; 8192];
        // SAFETY (all `read_at` calls below): `b` is ours, valid for writes, not mapped.
        // No window is mapped yet: nothing is read, nothing is mapped or allocated.
        assert!(!unsafe { m.read_at(b.as_mut_ptr(), 4096, 0) });
        assert_eq!(m.slots().len(), 0);
        if !supported(m.write_all_at(&[5; 4096], 8192)) {
            return;
        }
        let held = allocated(&f);
        // A hole beside the written page, in a mapped window: not read, not allocated.
        assert!(!unsafe { m.read_at(b.as_mut_ptr(), 8192, 4096) });
        assert!(!unsafe { m.read_at(b.as_mut_ptr(), 4096, 64 << 10) });
        assert_eq!(allocated(&f), held, "a read allocated a hole");
        assert_eq!(b, vec![0xAA; 8192], "nothing copied");
        // The written page itself, whole or in part.
        assert!(unsafe { m.read_at(b.as_mut_ptr(), 4096, 8192) });
        assert_eq!(&b[..4096], &[5; 4096][..]);
        assert!(unsafe { m.read_at(b.as_mut_ptr(), 512, 8192 + 1024) });
        assert_eq!(m.reads(), 2);
        // Another handle of the mapping sees what this one populated.
        let other = m.clone();
        assert!(unsafe { other.read_at(b.as_mut_ptr(), 4096, 8192) });
        // Past the end of the file, or across two windows: pread's business.
        assert!(!unsafe { m.read_at(b.as_mut_ptr(), 4096, (1 << 20) - 2048) });
        m.write_all_at(&[6; 8192], (256 << 10) - 4096).unwrap();
        assert!(!unsafe { m.read_at(b.as_mut_ptr(), 8192, (256 << 10) - 4096) });
    }

    #[test]
    fn a_page_forgotten_before_its_hole_is_punched_is_populated_again_and_not_read() {
        let (_d, f) = file(1 << 20);
        let m = MappedImage::with_windows(&f, 256 << 10, 4, COLD_AFTER).unwrap();
        if !supported(m.write_all_at(&[7; 16384], 0)) {
            return;
        }
        let before = allocated(&f);
        m.forget(4096, 4096);
        punch(&f, 4096, 4096);
        assert!(allocated(&f) < before, "the hole was punched");
        let mut b = vec![1u8; 4096];
        // SAFETY: `b` is ours, valid for writes, not mapped.
        assert!(
            !unsafe { m.read_at(b.as_mut_ptr(), 4096, 4096) },
            "a hole now"
        );
        assert!(allocated(&f) < before, "and reading did not fill it");
        // SAFETY: as above.
        assert!(
            unsafe { m.read_at(b.as_mut_ptr(), 4096, 8192) },
            "its neighbour"
        );
        // A write populates the page again, and the page is readable from the mapping.
        m.write_all_at(&[8; 4096], 4096).unwrap();
        assert_eq!(allocated(&f), before);
        // SAFETY: as above.
        assert!(unsafe { m.read_at(b.as_mut_ptr(), 4096, 4096) });
        assert_eq!(b, vec![8; 4096]);
        assert_eq!(read(&f, 4096, 4096), vec![8; 4096]);
    }

    #[test]
    fn a_file_that_cannot_be_mapped_for_writing_says_so_instead_of_faulting() {
        let dir = crate::store::scratch_dir();
        let path = dir.path().join("ro");
        std::fs::write(&path, vec![0u8; 8192]).unwrap();
        let f = File::open(&path).unwrap();
        // Read-only: the window cannot be mapped writable.
        let m = MappedImage::with_windows(&f, WINDOW_BYTES, MAX_WINDOWS, COLD_AFTER).unwrap();
        let r = m.write_all_at(&[1; 4096], 0);
        assert!(matches!(r, Err(MapError::Unsupported(_))), "{r:?}");
        assert_eq!(std::fs::read(&path).unwrap(), vec![0u8; 8192]);
    }

    #[test]
    fn a_file_shrunk_under_the_mapping_gives_an_error_not_sigbus() {
        // The pages beyond the new end cannot be populated: an error, which the writer
        // answers with a pwrite (that then extends the file, as a pwrite does).
        let (_d, f) = file(1 << 20);
        let m = MappedImage::with_windows(&f, 1 << 20, 1, COLD_AFTER).unwrap();
        if !supported(m.write_all_at(&[1; 4096], 0)) {
            return;
        }
        f.set_len(64 << 10).unwrap();
        let r = m.write_all_at(&[2; 4096], 512 << 10);
        assert!(matches!(r, Err(MapError::Failed(_))), "{r:?}");
    }

    #[test]
    fn a_full_budget_gives_way_only_to_windows_gone_cold() {
        let (_d, f) = file(1 << 20);
        // Two windows that never go cold within the test: the third is refused, and a
        // write to a mapped one still goes through.
        let m = MappedImage::with_windows(&f, 64 << 10, 2, Duration::from_secs(3600)).unwrap();
        if !supported(m.write_all_at(&[1; 4096], 0)) {
            return;
        }
        m.write_all_at(&[2; 4096], 64 << 10).unwrap();
        let r = m.write_all_at(&[3; 4096], 128 << 10);
        assert!(matches!(r, Err(MapError::NoRoom)), "{r:?}");
        assert_eq!(read(&f, 128 << 10, 4096), vec![0; 4096]);
        m.write_all_at(&[4; 4096], 4096).unwrap();
        assert_eq!(m.slots().len(), 2);
        // Once they have gone cold, the least recently written one gives way.
        let m = MappedImage::with_windows(&f, 64 << 10, 2, Duration::from_millis(5)).unwrap();
        m.write_all_at(&[5; 4096], 0).unwrap();
        m.write_all_at(&[6; 4096], 64 << 10).unwrap();
        std::thread::sleep(Duration::from_millis(10));
        m.write_all_at(&[7; 4096], 128 << 10).unwrap();
        let bases: Vec<u64> = m.slots().iter().map(|s| s.window.base).collect();
        assert!(
            bases.contains(&(128 << 10)) && !bases.contains(&0),
            "{bases:?}"
        );
        assert_eq!(read(&f, 128 << 10, 4096), vec![7; 4096]);
    }

    #[test]
    fn only_an_image_in_tmpfs_is_mapped() {
        // The store's tests keep their files in /dev/shm where it exists; the build
        // directory is usually on a disk filesystem.
        let (_d, shm) = file(1 << 20);
        let here = tempfile::tempfile_in(env!("CARGO_MANIFEST_DIR")).unwrap();
        for f in [&shm, &here] {
            // SAFETY: as in `in_tmpfs`.
            let mut st: libc::statfs = unsafe { std::mem::zeroed() };
            // SAFETY: as in `in_tmpfs`.
            assert_eq!(unsafe { libc::fstatfs(f.as_raw_fd(), &mut st) }, 0);
            let tmpfs = st.f_type as u64 == TMPFS_MAGIC;
            let made = MappedImage::new(f);
            assert_eq!(made.is_ok(), tmpfs, "{made:?}");
            if let Err(e) = made {
                assert_eq!(e.kind(), io::ErrorKind::Unsupported);
                assert!(e.to_string().contains("not in tmpfs"), "{e}");
            }
        }
    }
}
