//! Sparse raw image file plus metadata sidecar (format described in `docs/image-format.md`).
//!
//! `PATH` is a raw file laid out `boot1 | boot2 | RPMB | user`, exactly `total_bytes()`
//! long and sparse: it is created with `set_len`, never written in full, and erased
//! ranges are given back to the filesystem by punching holes. `PATH.emmc.toml` records
//! the model and layout the image was made for (`[image]`) and the card's persistent
//! state (`[card]`, opaque to the store), and is replaced atomically.
//!
//! Data goes through `pread`/`pwrite` on one open file; nothing of the image is held in
//! memory and no buffer larger than [`FILL_CHUNK`] is ever allocated. With
//! [`ImageStore::set_io_threads`], large writes handed over with `write_owned` go to
//! the file on a writer thread (`writer.rs`), at most 8 MiB of them at a time, copied
//! into a mapping of the image where the kernel allows (`mapped.rs`); small ones wait for
//! the end of the owner's round ([`Store::end_batch`]) and are copied into the same
//! mapping, small reads of pages it knows to be allocated are copied out of it, and large
//! reads are split over two threads.

use std::ffi::OsString;
use std::fs::{self, File, OpenOptions};
use std::io::{ErrorKind, Write};
use std::os::unix::fs::FileExt;
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::prefetch::{PrefetchRead, Prefetcher, MIN_PREFETCH_READS};
use super::writer::{Reader, Writer, MIN_QUEUED_BYTES, MIN_SPLIT_READ_BYTES};
use super::{check_bounds, ImageLayout, Store, StoreError};

/// The sidecar format this build reads and writes.
const FORMAT: i64 = 1;

/// Suffix appended to the image path to name the sidecar.
const SIDECAR_SUFFIX: &str = ".emmc.toml";

/// Suffix appended to the sidecar path for the file written before the atomic rename.
const TMP_SUFFIX: &str = ".tmp";

/// Largest buffer used to write repeated bytes (`fill` with a non-zero byte, or zeroes
/// where holes cannot be punched).
const FILL_CHUNK: u64 = 1 << 20;

/// First line of every sidecar the store writes.
const SIDECAR_HEADER: &str = "# vhost-user-emmc card image metadata (docs/image-format.md).\n\
     # Rewritten by the daemon whenever card state changes: comments are not kept.\n\n";

/// What a sidecar says about the image it describes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ImageHeader {
    /// Name of the device model the image was created for.
    pub model: String,
    /// Sizes of the areas, as created.
    pub layout: ImageLayout,
}

/// A card image on disk: `PATH` holds the areas in the layout of `ImageLayout`,
/// `PATH.emmc.toml` holds the layout, the model name and the card's persistent state.
#[derive(Debug)]
pub struct ImageStore {
    layout: ImageLayout,
    /// `layout.total_bytes()`, checked to fit a file offset.
    size: u64,
    model: String,
    path: PathBuf,
    sidecar: PathBuf,
    file: File,
    card_state: Option<toml::Table>,
    /// fdatasync when the card finishes a durable program (`sync_program`); false: only
    /// at `sync` (cache flushes, shutdown).
    sync_programs: bool,
    /// fdatasyncs done.
    syncs: u64,
    /// Large writes go to the file on this thread (`set_io_threads`).
    writer: Option<Writer>,
    /// The writer thread copies large writes into a mapping of the image
    /// (`set_mapped_writes`; on by default).
    mapped_writes: bool,
    /// Large writes are held back as small ones are (`Store::hold_large_writes`).
    hold_large_writes: bool,
    /// Large reads are split with this thread (`set_io_threads` too).
    reader: Option<Reader>,
    /// A round's smaller reads are copied ahead on this thread (`set_io_threads` too).
    prefetcher: Option<Prefetcher>,
}

/// The `[image]` table, in the order it is written.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct ImageSection {
    format: i64,
    model: String,
    boot_bytes: u64,
    rpmb_bytes: u64,
    user_bytes: u64,
}

impl ImageSection {
    fn new(layout: ImageLayout, model: &str) -> Self {
        ImageSection {
            format: FORMAT,
            model: model.to_owned(),
            boot_bytes: layout.boot_bytes,
            rpmb_bytes: layout.rpmb_bytes,
            user_bytes: layout.user_bytes,
        }
    }

    fn layout(&self) -> ImageLayout {
        ImageLayout {
            boot_bytes: self.boot_bytes,
            rpmb_bytes: self.rpmb_bytes,
            user_bytes: self.user_bytes,
        }
    }
}

/// The whole sidecar as written: `[image]` first, then `[card]` if there is state.
#[derive(Serialize)]
struct SidecarOut<'a> {
    image: &'a ImageSection,
    #[serde(skip_serializing_if = "Option::is_none")]
    card: Option<&'a toml::Table>,
}

/// A parsed and checked sidecar.
#[derive(Debug)]
struct Sidecar {
    image: ImageSection,
    card: Option<toml::Table>,
}

/// Read the model name and layout recorded in the sidecar of the image at `path`, so a
/// caller can pick the device model before opening the image. Checks the sidecar's
/// syntax, format and layout; does not look at the image file.
pub fn read_header(path: &Path) -> Result<ImageHeader, StoreError> {
    // The image itself first: a mistyped path is a missing image, not a missing sidecar.
    fs::metadata(path).map_err(|e| io_error(path, e))?;
    let sidecar = read_sidecar(&sidecar_path(path))?;
    Ok(ImageHeader {
        layout: sidecar.image.layout(),
        model: sidecar.image.model,
    })
}

impl ImageStore {
    /// Whether a durable program (reliable write, forced programming, cache off) is
    /// fdatasynced when it ends (the default), or only at the next cache flush or
    /// shutdown (`serve --image-sync flush`: the data is in the file at once, so it
    /// survives the daemon being killed, but not the host losing power before that sync).
    pub fn set_sync_programs(&mut self, on: bool) {
        self.sync_programs = on;
    }

    /// fdatasyncs done so far.
    pub fn syncs(&self) -> u64 {
        self.syncs
    }

    /// Write what `write_owned` hands over in 64 KiB or more on a thread of its own, and
    /// read 64 KiB and more in two halves at once, one on a second thread (`serve`
    /// does); or do everything on the caller's thread (the default). Switching off waits
    /// for the queued writes.
    pub fn set_io_threads(&mut self, on: bool) -> Result<(), StoreError> {
        match (on, self.writer.is_some()) {
            (true, false) => {
                let mut writer =
                    Writer::start(&self.file, self.mapped_writes).map_err(|e| self.io(e))?;
                writer.hold_large_writes(self.hold_large_writes);
                self.writer = Some(writer);
                self.reader = Some(Reader::start(&self.file).map_err(|e| self.io(e))?);
                self.prefetcher = Some(Prefetcher::start(&self.file).map_err(|e| self.io(e))?);
            }
            (false, true) => {
                self.writer = None;
                self.reader = None;
                self.prefetcher = None;
            }
            _ => {}
        }
        Ok(())
    }

    /// Whether the writer thread `set_io_threads` starts copies large writes into a
    /// shared mapping of the image (the default, where the kernel can populate one ahead
    /// of a write: `mapped.rs`) or writes them with `pwrite`. Call before
    /// `set_io_threads`; a running writer keeps its way.
    pub fn set_mapped_writes(&mut self, on: bool) {
        self.mapped_writes = on;
    }

    /// Writes copied into the mapping of the image so far (`mapped.rs`).
    pub fn mapped_writes(&self) -> u64 {
        self.writer.as_ref().map_or(0, Writer::mapped_writes)
    }

    /// Reads copied out of the mapping of the image so far: small reads of pages known
    /// to be allocated there.
    pub fn mapped_reads(&self) -> u64 {
        self.writer.as_ref().map_or(0, Writer::mapped_reads)
    }

    /// Before the file's `[offset, offset + len)` changes: void the copies of it
    /// prefetched for this round.
    fn invalidate_prefetch(&mut self, offset: u64, len: u64) {
        if let Some(p) = &mut self.prefetcher {
            p.invalidate(offset, len);
        }
    }

    /// Before an access of `[offset, offset + len)`: wait for the queued writes it
    /// overlaps, and report a queued write that failed.
    fn settle_range(&mut self, offset: u64, len: u64) -> Result<(), StoreError> {
        if let Some(w) = &mut self.writer {
            w.wait_for(offset, len)
                .map_err(|e| io_error(&self.path, e))?;
        }
        Ok(())
    }

    /// Wait for every held-back and queued write; report one that failed.
    fn settle_all(&mut self) -> Result<(), StoreError> {
        if let Some(w) = &mut self.writer {
            w.drain().map_err(|e| io_error(&self.path, e))?;
        }
        Ok(())
    }

    /// Create a new sparse image and its sidecar. Fails if either exists.
    pub fn create(path: &Path, layout: ImageLayout, model_name: &str) -> Result<Self, StoreError> {
        let size = checked_total(&layout).map_err(|problem| StoreError::BadLayout {
            path: display(path),
            problem,
        })?;
        let sidecar = sidecar_path(path);
        if exists(&sidecar)? {
            return Err(StoreError::Exists {
                path: display(&sidecar),
            });
        }
        // create_new: the check for an existing image and its creation are one step.
        let file = match OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .open(path)
        {
            Ok(file) => file,
            Err(e) if e.kind() == ErrorKind::AlreadyExists => {
                return Err(StoreError::Exists {
                    path: display(path),
                })
            }
            Err(e) => return Err(io_error(path, e)),
        };
        let image = ImageSection::new(layout, model_name);
        let made = file
            .set_len(size)
            .and_then(|()| file.sync_all())
            .map_err(|e| io_error(path, e))
            .and_then(|()| write_sidecar(&sidecar, &image, None));
        if let Err(e) = made {
            // Leave nothing half made behind, so that the same create can be retried.
            // The sidecar did not exist when we started, so one there now is ours.
            let _ = fs::remove_file(path);
            let _ = fs::remove_file(&sidecar);
            let _ = fs::remove_file(tmp_path(&sidecar));
            return Err(e);
        }
        Ok(ImageStore {
            layout,
            size,
            model: model_name.to_owned(),
            path: path.to_owned(),
            sidecar,
            file,
            card_state: None,
            sync_programs: true,
            syncs: 0,
            writer: None,
            mapped_writes: true,
            hold_large_writes: false,
            reader: None,
            prefetcher: None,
        })
    }

    /// Open an existing image, checking that it was made for this layout and model.
    pub fn open(path: &Path, layout: ImageLayout, model_name: &str) -> Result<Self, StoreError> {
        let size = checked_total(&layout).map_err(|problem| StoreError::BadLayout {
            path: display(path),
            problem,
        })?;
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .open(path)
            .map_err(|e| io_error(path, e))?;
        let sidecar = sidecar_path(path);
        let Sidecar { image, card } = read_sidecar(&sidecar)?;

        let mut problems = Vec::new();
        if image.model != model_name {
            problems.push(format!(
                "made for model {}, opened as {}",
                image.model, model_name
            ));
        }
        let recorded = image.layout();
        let areas = [
            (
                "each boot partition",
                recorded.boot_bytes,
                layout.boot_bytes,
            ),
            ("RPMB partition", recorded.rpmb_bytes, layout.rpmb_bytes),
            ("user area", recorded.user_bytes, layout.user_bytes),
        ];
        for (area, in_sidecar, in_model) in areas {
            if in_sidecar != in_model {
                problems.push(format!(
                    "{area} is {} in the sidecar, {} in the model",
                    human_size(in_sidecar),
                    human_size(in_model)
                ));
            }
        }
        if !problems.is_empty() {
            return Err(StoreError::Mismatch {
                path: display(path),
                problem: problems.join("; "),
            });
        }

        let actual = file.metadata().map_err(|e| io_error(path, e))?.len();
        if actual != size {
            return Err(StoreError::Mismatch {
                path: display(path),
                problem: format!(
                    "image file is {} ({actual} bytes), the layout needs {} ({size} bytes)",
                    human_size(actual),
                    human_size(size)
                ),
            });
        }

        Ok(ImageStore {
            layout,
            size,
            model: model_name.to_owned(),
            path: path.to_owned(),
            sidecar,
            file,
            card_state: card,
            sync_programs: true,
            syncs: 0,
            writer: None,
            mapped_writes: true,
            hold_large_writes: false,
            reader: None,
            prefetcher: None,
        })
    }

    /// The image file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The metadata sidecar (`PATH.emmc.toml`).
    pub fn sidecar_path(&self) -> &Path {
        &self.sidecar
    }

    /// The device model the image was made for.
    pub fn model(&self) -> &str {
        &self.model
    }

    fn io(&self, e: std::io::Error) -> StoreError {
        io_error(&self.path, e)
    }

    /// Deallocate `[offset, offset + len)`, which the caller has bounds-checked.
    /// Returns the raw OS error so the caller can tell "not supported" apart.
    fn punch_hole(&self, offset: u64, len: u64) -> std::io::Result<()> {
        let too_big = || std::io::Error::from(ErrorKind::InvalidInput);
        let off = libc::off_t::try_from(offset).map_err(|_| too_big())?;
        let len = libc::off_t::try_from(len).map_err(|_| too_big())?;
        let fd = self.file.as_raw_fd();
        loop {
            // SAFETY: fallocate takes only integers and touches no memory of ours; `fd`
            // is the descriptor of `self.file`, which stays open for the whole call.
            let rc = unsafe {
                libc::fallocate(
                    fd,
                    libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
                    off,
                    len,
                )
            };
            if rc == 0 {
                return Ok(());
            }
            let err = std::io::Error::last_os_error();
            if err.kind() != ErrorKind::Interrupted {
                return Err(err);
            }
        }
    }

    /// Write `len` copies of `byte` from `offset` (caller has bounds-checked), through a
    /// buffer of at most `FILL_CHUNK` bytes.
    fn write_repeated(&self, offset: u64, len: u64, byte: u8) -> Result<(), StoreError> {
        let chunk = len.min(FILL_CHUNK) as usize;
        let buf = vec![byte; chunk];
        let mut done = 0u64;
        while done < len {
            let n = (len - done).min(chunk as u64) as usize;
            self.file
                .write_all_at(&buf[..n], offset + done)
                .map_err(|e| self.io(e))?;
            done += n as u64;
        }
        Ok(())
    }
}

impl Store for ImageStore {
    fn layout(&self) -> ImageLayout {
        self.layout
    }

    fn read_at(&mut self, offset: u64, buf: &mut [u8]) -> Result<(), StoreError> {
        check_bounds(offset, buf.len() as u64, self.size)?;
        if let Some(p) = &mut self.prefetcher {
            if p.take(offset, buf.as_mut_ptr(), buf.len()) {
                return Ok(());
            }
        }
        self.settle_range(offset, buf.len() as u64)?;
        if buf.len() < MIN_SPLIT_READ_BYTES {
            if let Some(w) = &self.writer {
                // SAFETY: `buf` is the caller's memory, valid for writes, not the image's
                // mapping.
                if unsafe { w.read_mapped(buf.as_mut_ptr(), buf.len(), offset) } {
                    return Ok(());
                }
            }
        }
        match &self.reader {
            Some(r) if buf.len() >= MIN_SPLIT_READ_BYTES => {
                r.read_exact_at(&self.file, buf, offset)
            }
            _ => self.file.read_exact_at(buf, offset),
        }
        .map_err(|e| self.io(e))
    }

    fn write_at(&mut self, offset: u64, buf: &[u8]) -> Result<(), StoreError> {
        check_bounds(offset, buf.len() as u64, self.size)?;
        self.invalidate_prefetch(offset, buf.len() as u64);
        self.settle_range(offset, buf.len() as u64)?;
        self.file.write_all_at(buf, offset).map_err(|e| self.io(e))
    }

    fn write_owned(&mut self, offset: u64, buf: &mut Vec<u8>) -> Result<(), StoreError> {
        check_bounds(offset, buf.len() as u64, self.size)?;
        self.invalidate_prefetch(offset, buf.len() as u64);
        match &mut self.writer {
            // Large writes are queued; small ones wait for the end of the round
            // (`end_batch`) once the owner ends rounds, and large ones too if the owner
            // asked for it (`hold_large_writes`).
            Some(w) if buf.len() >= MIN_QUEUED_BYTES || w.batching() => {
                if let Some(e) = w.take_error() {
                    return Err(io_error(&self.path, e));
                }
                let data = std::mem::take(buf);
                if w.holds(data.len()) {
                    let large = data.len() >= MIN_QUEUED_BYTES;
                    w.stage(offset, data);
                    if large {
                        *buf = w.spare_buffer();
                    }
                } else {
                    *buf = w.submit(offset, data);
                }
                Ok(())
            }
            _ => self.write_at(offset, buf),
        }
    }

    fn fill(&mut self, offset: u64, len: u64, byte: u8) -> Result<(), StoreError> {
        check_bounds(offset, len, self.size)?;
        self.invalidate_prefetch(offset, len);
        self.settle_range(offset, len)?;
        if len == 0 {
            return Ok(());
        }
        if byte == 0 {
            // The mapping must not copy into these pages again without populating them:
            // once deallocated, they need space the filesystem may not have.
            if let Some(w) = &self.writer {
                w.forget_allocated(offset, len);
            }
            match self.punch_hole(offset, len) {
                Ok(()) => return Ok(()),
                // The filesystem cannot punch holes: store the zeroes instead.
                Err(e) if matches!(e.raw_os_error(), Some(libc::EOPNOTSUPP | libc::ENOSYS)) => {}
                Err(e) => return Err(self.io(e)),
            }
        }
        self.write_repeated(offset, len, byte)
    }

    fn end_batch(&mut self) {
        if let Some(w) = &mut self.writer {
            w.end_batch();
        }
    }

    fn end_batch_here(&mut self) {
        if let Some(w) = &mut self.writer {
            w.end_batch_here();
        }
    }

    fn hold_large_writes(&mut self, on: bool) {
        self.hold_large_writes = on;
        if let Some(w) = &mut self.writer {
            w.hold_large_writes(on);
        }
    }

    unsafe fn prefetch(&mut self, reads: &[PrefetchRead]) {
        let Some(p) = &mut self.prefetcher else {
            return;
        };
        // Only what the file already holds in full: no write of the range may still be
        // held back or queued (a read waits for those, and so would the copy).
        let writer = &self.writer;
        let size = self.size;
        let reads: Vec<PrefetchRead> = reads
            .iter()
            .copied()
            .filter(|r| {
                r.len > 0
                    && r.len < MIN_SPLIT_READ_BYTES
                    && check_bounds(r.offset, r.len as u64, size).is_ok()
                    && !writer
                        .as_ref()
                        .is_some_and(|w| w.has_writes_in(r.offset, r.len as u64))
            })
            .collect();
        if reads.len() >= MIN_PREFETCH_READS {
            // SAFETY: the caller's promise (`Store::prefetch`) is the one `issue` needs:
            // the buffers stay valid and untouched until `read_at` (which `take`s them)
            // or `settle_prefetches` returns.
            unsafe { p.issue(&reads) };
        }
    }

    fn settle_prefetches(&mut self) {
        if let Some(p) = &mut self.prefetcher {
            p.settle();
        }
    }

    fn sync(&mut self) -> Result<(), StoreError> {
        self.settle_all()?;
        self.syncs += 1;
        self.file.sync_data().map_err(|e| self.io(e))
    }

    fn sync_program(&mut self) -> Result<(), StoreError> {
        // Without the fdatasync the data must still be in the file before the card
        // acknowledges it, so that it survives the daemon being killed.
        self.settle_all()?;
        if self.sync_programs {
            self.sync()
        } else {
            Ok(())
        }
    }

    fn load_card_state(&self) -> Option<toml::Table> {
        self.card_state.clone()
    }

    fn save_card_state(&mut self, state: &toml::Table) -> Result<(), StoreError> {
        let image = ImageSection::new(self.layout, &self.model);
        write_sidecar(&self.sidecar, &image, Some(state))?;
        self.card_state = Some(state.clone());
        Ok(())
    }
}

/// `PATH` + `.emmc.toml`.
fn sidecar_path(image: &Path) -> PathBuf {
    append_suffix(image, SIDECAR_SUFFIX)
}

/// `PATH.emmc.toml` + `.tmp`.
fn tmp_path(sidecar: &Path) -> PathBuf {
    append_suffix(sidecar, TMP_SUFFIX)
}

fn append_suffix(path: &Path, suffix: &str) -> PathBuf {
    let mut name = OsString::from(path.as_os_str());
    name.push(suffix);
    PathBuf::from(name)
}

fn display(path: &Path) -> String {
    path.display().to_string()
}

fn io_error(path: &Path, source: std::io::Error) -> StoreError {
    StoreError::Io {
        path: display(path),
        source,
    }
}

/// Whether anything (even a dangling symlink) is at `path`.
fn exists(path: &Path) -> Result<bool, StoreError> {
    match fs::symlink_metadata(path) {
        Ok(_) => Ok(true),
        Err(e) if e.kind() == ErrorKind::NotFound => Ok(false),
        Err(e) => Err(io_error(path, e)),
    }
}

/// The image size for `layout`, if the layout is one an image can have: every area a
/// whole number of 512-byte sectors and the total a valid file offset.
fn checked_total(layout: &ImageLayout) -> Result<u64, String> {
    for (name, value) in [
        ("boot_bytes", layout.boot_bytes),
        ("rpmb_bytes", layout.rpmb_bytes),
        ("user_bytes", layout.user_bytes),
    ] {
        if value % 512 != 0 {
            return Err(format!("{name} = {value} is not a multiple of 512"));
        }
    }
    layout
        .boot_bytes
        .checked_mul(2)
        .and_then(|b| b.checked_add(layout.rpmb_bytes))
        .and_then(|b| b.checked_add(layout.user_bytes))
        .filter(|&total| total <= i64::MAX as u64)
        .ok_or_else(|| "the total size does not fit in a file offset".to_owned())
}

/// `8 GiB`, `512 KiB`, or the exact byte count when no binary unit divides it.
fn human_size(bytes: u64) -> String {
    const UNITS: [(u64, &str); 4] = [
        (1 << 40, "TiB"),
        (1 << 30, "GiB"),
        (1 << 20, "MiB"),
        (1 << 10, "KiB"),
    ];
    for (unit, name) in UNITS {
        if bytes >= unit && bytes % unit == 0 {
            return format!("{} {name}", bytes / unit);
        }
    }
    format!("{bytes} bytes")
}

fn bad_metadata(sidecar: &Path, problem: impl Into<String>) -> StoreError {
    StoreError::BadMetadata {
        path: display(sidecar),
        problem: problem.into(),
    }
}

/// Read, parse and check a sidecar: syntax, top-level keys, format, `[image]` fields,
/// layout sanity. Does not compare against any model.
fn read_sidecar(sidecar: &Path) -> Result<Sidecar, StoreError> {
    let text = match fs::read_to_string(sidecar) {
        Ok(text) => text,
        Err(e) if e.kind() == ErrorKind::NotFound => {
            return Err(bad_metadata(
                sidecar,
                "missing (an image is only usable with its sidecar; copy both)",
            ))
        }
        Err(e) if e.kind() == ErrorKind::InvalidData => {
            return Err(bad_metadata(sidecar, "not UTF-8 text"))
        }
        Err(e) => return Err(io_error(sidecar, e)),
    };
    let mut doc: toml::Table = text
        .parse()
        .map_err(|e: toml::de::Error| bad_metadata(sidecar, format!("not valid TOML: {e}")))?;

    if let Some(key) = doc.keys().find(|k| *k != "image" && *k != "card") {
        return Err(bad_metadata(
            sidecar,
            format!("unknown top-level key `{key}` (only [image] and [card] belong here)"),
        ));
    }
    let image = match doc.remove("image") {
        Some(toml::Value::Table(t)) => t,
        Some(_) => return Err(bad_metadata(sidecar, "`image` is not a table")),
        None => return Err(bad_metadata(sidecar, "no [image] table")),
    };
    // The format first: a later format may have other fields, and saying "format 2"
    // is more useful than complaining about them.
    match image.get("format") {
        Some(toml::Value::Integer(FORMAT)) => {}
        Some(toml::Value::Integer(other)) => {
            return Err(bad_metadata(
                sidecar,
                format!("format {other}, but this build reads only format {FORMAT}"),
            ))
        }
        Some(_) => return Err(bad_metadata(sidecar, "[image] format is not an integer")),
        None => return Err(bad_metadata(sidecar, "[image] has no format")),
    }
    let image: ImageSection = toml::Value::Table(image)
        .try_into()
        .map_err(|e: toml::de::Error| bad_metadata(sidecar, format!("[image]: {e}")))?;
    checked_total(&image.layout())
        .map_err(|problem| bad_metadata(sidecar, format!("[image] layout: {problem}")))?;

    let card = match doc.remove("card") {
        Some(toml::Value::Table(t)) => Some(t),
        Some(_) => return Err(bad_metadata(sidecar, "`card` is not a table")),
        None => None,
    };
    Ok(Sidecar { image, card })
}

/// Replace the sidecar atomically and durably: write `SIDECAR.tmp`, fsync it, rename it
/// over the sidecar, fsync the directory. A crash at any point leaves either the old or
/// the new sidecar in place, never a mix.
fn write_sidecar(
    sidecar: &Path,
    image: &ImageSection,
    card: Option<&toml::Table>,
) -> Result<(), StoreError> {
    let body = toml::to_string(&SidecarOut { image, card })
        .map_err(|e| bad_metadata(sidecar, format!("cannot write card state: {e}")))?;
    let tmp = tmp_path(sidecar);
    {
        let mut f = OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .open(&tmp)
            .map_err(|e| io_error(&tmp, e))?;
        f.write_all(SIDECAR_HEADER.as_bytes())
            .and_then(|()| f.write_all(body.as_bytes()))
            .and_then(|()| f.sync_all())
            .map_err(|e| io_error(&tmp, e))?;
    }
    fs::rename(&tmp, sidecar).map_err(|e| io_error(sidecar, e))?;
    let dir = match sidecar.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|e| io_error(dir, e))
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::MetadataExt;

    use super::*;

    const SECTOR: usize = 512;

    /// Small but with every area present and distinct sizes, so that an offset mix-up
    /// between areas shows.
    fn layout() -> ImageLayout {
        ImageLayout {
            boot_bytes: 128 * 1024,
            rpmb_bytes: 256 * 1024,
            user_bytes: 8 << 20,
        }
    }

    const MODEL: &str = "generic-emmc45";

    fn new_image(dir: &tempfile::TempDir) -> (PathBuf, ImageStore) {
        let path = dir.path().join("card.img");
        let store = ImageStore::create(&path, layout(), MODEL).unwrap();
        (path, store)
    }

    fn pattern(seed: u8, len: usize) -> Vec<u8> {
        (0..len)
            .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed) | 1)
            .collect()
    }

    fn read(store: &mut ImageStore, offset: u64, len: usize) -> Vec<u8> {
        let mut buf = vec![0xA5; len];
        store.read_at(offset, &mut buf).unwrap();
        buf
    }

    #[test]
    fn with_write_behind_every_access_sees_the_writes_before_it() {
        for mapped in [true, false] {
            let writes = write_behind_keeps_every_access_in_order(mapped);
            if !mapped {
                assert_eq!(writes, 0, "pwrite only");
            } else if super::super::mapped::populate_supported() && Path::new("/dev/shm").is_dir() {
                // The eight 256 KiB writes and the two of 1 MiB.
                assert_eq!(writes, 10, "large writes go through the mapping");
            }
        }
    }

    /// The body of the test above, the writer copying into a mapping of the image or
    /// not; returns how many writes it copied into the mapping.
    fn write_behind_keeps_every_access_in_order(mapped: bool) -> u64 {
        let dir = crate::store::scratch_dir();
        let (path, mut store) = new_image(&dir);
        store.set_mapped_writes(mapped);
        store.set_io_threads(true).unwrap();
        let user = layout().user_offset();
        // Large writes queue; the caller gets back a buffer whose contents it must not use.
        for k in 0..8u8 {
            let mut buf = pattern(k, 256 << 10);
            store
                .write_owned(user + u64::from(k) * (256 << 10), &mut buf)
                .unwrap();
        }
        // A read of a queued range waits for it.
        assert_eq!(
            read(&mut store, user + 7 * (256 << 10), 4096),
            pattern(7, 4096)
        );
        // A small write over a queued range lands after it, a fill too.
        let mut big = pattern(20, 1 << 20);
        store.write_owned(user + (2 << 20), &mut big).unwrap();
        store
            .write_at(user + (2 << 20) + 512, &[0xEE; 512])
            .unwrap();
        let mut big = pattern(21, 1 << 20);
        store.write_owned(user + (3 << 20), &mut big).unwrap();
        store.fill(user + (3 << 20), 4096, 0).unwrap();
        store.sync().unwrap();
        // A read large enough to be split over two threads.
        let mut whole = pattern(20, 1 << 20);
        whole[512..1024].fill(0xEE);
        assert_eq!(read(&mut store, user + (2 << 20), 1 << 20), whole);
        // After sync everything is in the file, read through a handle of its own.
        let file = File::open(&path).unwrap();
        let mut b = vec![0u8; 1024];
        file.read_exact_at(&mut b, user + (2 << 20)).unwrap();
        assert_eq!(&b[..512], &pattern(20, 512)[..]);
        assert_eq!(&b[512..], &[0xEE; 512][..]);
        let mut z = vec![1u8; 4096 + 512];
        file.read_exact_at(&mut z, user + (3 << 20)).unwrap();
        assert!(
            z[..4096].iter().all(|&x| x == 0),
            "the fill came after the write"
        );
        assert_eq!(&z[4096..], &pattern(21, 1 << 20)[4096..4096 + 512]);
        store.mapped_writes()
    }

    #[test]
    fn a_durable_program_waits_for_the_queued_writes_even_without_an_fdatasync() {
        let dir = tempfile::tempdir().unwrap();
        let (path, mut store) = new_image(&dir);
        store.set_io_threads(true).unwrap();
        store.set_sync_programs(false);
        let user = layout().user_offset();
        let mut buf = pattern(3, 4 << 20);
        store.write_owned(user, &mut buf).unwrap();
        store.sync_program().unwrap();
        assert_eq!(store.syncs(), 0, "no fdatasync asked for");
        let file = File::open(&path).unwrap();
        let mut b = vec![0u8; 4096];
        file.read_exact_at(&mut b, user + (4 << 20) - 4096).unwrap();
        assert_eq!(b, pattern(3, 4 << 20)[(4 << 20) - 4096..]);
    }

    #[test]
    fn write_owned_refuses_a_range_outside_the_image_and_keeps_the_buffer() {
        let dir = tempfile::tempdir().unwrap();
        let (_path, mut store) = new_image(&dir);
        store.set_io_threads(true).unwrap();
        let mut buf = pattern(1, 128 << 10);
        let end = layout().total_bytes();
        assert!(matches!(
            store.write_owned(end - 4096, &mut buf),
            Err(StoreError::OutOfBounds { .. })
        ));
        assert_eq!(
            buf,
            pattern(1, 128 << 10),
            "an error leaves the buffer as it was"
        );
    }

    #[test]
    fn small_writes_held_back_for_the_round_are_read_back_and_synced() {
        let dir = tempfile::tempdir().unwrap();
        let (path, mut store) = new_image(&dir);
        store.set_io_threads(true).unwrap();
        store.end_batch();
        let user = layout().user_offset();
        let in_file = |off: u64| {
            let mut b = vec![0u8; 4096];
            File::open(&path)
                .unwrap()
                .read_exact_at(&mut b, off)
                .unwrap();
            b
        };
        let mut buf = pattern(3, 4096);
        store.write_owned(user, &mut buf).unwrap();
        assert_eq!(
            in_file(user),
            vec![0; 4096],
            "held back until the round ends"
        );
        // A read of the range sees it all the same.
        let mut back = vec![0u8; 4096];
        store.read_at(user, &mut back).unwrap();
        assert_eq!(back, pattern(3, 4096));
        // A durable program puts it in the file before the card acknowledges it.
        let mut buf = pattern(4, 4096);
        store.write_owned(user + 8192, &mut buf).unwrap();
        store.sync_program().unwrap();
        assert_eq!(in_file(user + 8192), pattern(4, 4096));
        // The end of the round writes it.
        let mut buf = pattern(5, 4096);
        store.write_owned(user + 16384, &mut buf).unwrap();
        store.end_batch();
        assert_eq!(in_file(user + 16384), pattern(5, 4096));
    }

    #[test]
    fn a_paced_owner_has_large_writes_held_for_the_round_too() {
        let dir = tempfile::tempdir().unwrap();
        let (path, mut store) = new_image(&dir);
        // Asked before the writer thread exists: the thread starts holding.
        store.hold_large_writes(true);
        store.set_io_threads(true).unwrap();
        let user = layout().user_offset();
        let in_file = |off: u64, len: usize| {
            let mut b = vec![0u8; len];
            File::open(&path)
                .unwrap()
                .read_exact_at(&mut b, off)
                .unwrap();
            b
        };
        const LARGE: usize = 128 << 10;
        // Before the owner ends a round, a large write is queued as before.
        let mut buf = pattern(1, LARGE);
        store.write_owned(user, &mut buf).unwrap();
        store.sync().unwrap();
        assert_eq!(in_file(user, LARGE), pattern(1, LARGE));
        store.end_batch();
        let mut buf = pattern(2, LARGE);
        store.write_owned(user + (1 << 20), &mut buf).unwrap();
        assert_eq!(
            in_file(user + (1 << 20), LARGE),
            vec![0; LARGE],
            "held back until the round ends"
        );
        // A read of the range sees it all the same.
        let mut back = vec![0u8; LARGE];
        store.read_at(user + (1 << 20), &mut back).unwrap();
        assert_eq!(back, pattern(2, LARGE));
        // A sync (a cache flush) puts it in the file before the card acknowledges it.
        let mut buf = pattern(3, LARGE);
        store.write_owned(user + (2 << 20), &mut buf).unwrap();
        store.sync().unwrap();
        assert_eq!(in_file(user + (2 << 20), LARGE), pattern(3, LARGE));
        // The end of the round hands it to the writer thread.
        let mut buf = pattern(4, LARGE);
        store.write_owned(user + (3 << 20), &mut buf).unwrap();
        store.end_batch();
        store.sync().unwrap();
        assert_eq!(in_file(user + (3 << 20), LARGE), pattern(4, LARGE));
        // Off again: queued at once, and nothing stays held.
        let mut buf = pattern(5, LARGE);
        store.write_owned(user + (4 << 20), &mut buf).unwrap();
        store.hold_large_writes(false);
        let mut buf = pattern(6, LARGE);
        store.write_owned(user + (5 << 20), &mut buf).unwrap();
        let writer = store.writer.as_mut().unwrap();
        writer.wait_for(user + (4 << 20), 2 << 20).unwrap();
        assert_eq!(in_file(user + (4 << 20), LARGE), pattern(5, LARGE));
        assert_eq!(in_file(user + (5 << 20), LARGE), pattern(6, LARGE));
    }

    #[test]
    fn prefetched_reads_are_what_a_read_at_the_cards_moment_gives() {
        let dir = tempfile::tempdir().unwrap();
        let (_path, mut store) = new_image(&dir);
        store.set_io_threads(true).unwrap();
        let user = layout().user_offset();
        let old = pattern(1, 6 * 4096);
        store.write_at(user, &old).unwrap();
        // A write queued on the writer thread: its range is not prefetched.
        let mut queued = pattern(2, 64 << 10);
        store.write_owned(user + (1 << 20), &mut queued).unwrap();
        let mut bufs = vec![vec![0u8; 4096]; 7];
        let offsets: Vec<u64> = (0..6)
            .map(|i| user + i * 4096)
            .chain([user + (1 << 20)])
            .collect();
        let reads: Vec<PrefetchRead> = bufs
            .iter_mut()
            .zip(&offsets)
            .map(|(b, &offset)| PrefetchRead {
                offset,
                dest: b.as_mut_ptr(),
                len: 4096,
            })
            .collect();
        // SAFETY: the buffers outlive the round (settled below) and are only touched by
        // `read_at`.
        unsafe { store.prefetch(&reads) };
        if let Some(p) = &store.prefetcher {
            p.wait_for_helper();
        }
        // After the copies landed: a write, a held-back write and a fill of three of
        // the ranges; the card's reads must see them, not the copies.
        let new = pattern(9, 4096);
        store.write_at(user + 4096, &new).unwrap();
        store.end_batch();
        let mut held = pattern(10, 4096);
        store.write_owned(user + 2 * 4096, &mut held).unwrap();
        store.fill(user + 3 * 4096, 4096, 0).unwrap();
        for (b, &offset) in bufs.iter_mut().zip(&offsets) {
            store.read_at(offset, b).unwrap();
        }
        store.settle_prefetches();
        assert!(bufs[0] == old[..4096], "untouched: the copy stands");
        assert!(bufs[1] == pattern(9, 4096), "written after the copy");
        assert!(bufs[2] == pattern(10, 4096), "held back after the copy");
        assert!(bufs[3] == vec![0u8; 4096], "filled after the copy");
        assert!(bufs[4] == old[4 * 4096..5 * 4096], "untouched");
        assert!(
            bufs[6] == pattern(2, 4096),
            "queued before: read after it landed"
        );
    }

    /// Bytes allocated to the file on disk (st_blocks is in 512-byte units).
    fn allocated(path: &Path) -> u64 {
        fs::metadata(path).unwrap().blocks() * 512
    }

    #[test]
    fn durable_programs_sync_unless_the_store_syncs_only_at_flushes() {
        let dir = tempfile::tempdir().unwrap();
        let (path, mut store) = new_image(&dir);
        let user = layout().user_offset();
        store.write_at(user, &pattern(1, SECTOR)).unwrap();
        store.sync_program().unwrap();
        assert_eq!(
            store.syncs(),
            1,
            "by default a durable program is fdatasynced"
        );
        store.set_sync_programs(false);
        store.write_at(user, &pattern(2, SECTOR)).unwrap();
        store.sync_program().unwrap();
        assert_eq!(store.syncs(), 1, "--image-sync flush: not at the program");
        store.sync().unwrap();
        assert_eq!(store.syncs(), 2, "a flush still syncs");
        // What was written is in the file whatever the policy (a killed daemon keeps it).
        drop(store);
        let mut again = ImageStore::open(&path, layout(), MODEL).unwrap();
        assert_eq!(read(&mut again, user, SECTOR), pattern(2, SECTOR));
    }

    fn problem(err: StoreError) -> String {
        match err {
            StoreError::Mismatch { problem, .. } | StoreError::BadMetadata { problem, .. } => {
                problem
            }
            other => panic!("expected Mismatch or BadMetadata, got {other:?}"),
        }
    }

    #[test]
    fn round_trip_at_start_and_end_of_every_area_survives_reopen() {
        let dir = tempfile::tempdir().unwrap();
        let (path, mut store) = new_image(&dir);
        let l = layout();
        let areas = [
            (l.boot1_offset(), l.boot_bytes),
            (l.boot2_offset(), l.boot_bytes),
            (l.rpmb_offset(), l.rpmb_bytes),
            (l.user_offset(), l.user_bytes),
        ];
        let mut seed = 0u8;
        for &(start, len) in &areas {
            store.write_at(start, &pattern(seed, SECTOR)).unwrap();
            store
                .write_at(start + len - SECTOR as u64, &pattern(seed + 1, SECTOR))
                .unwrap();
            seed += 2;
        }
        store.sync().unwrap();
        drop(store);

        let mut store = ImageStore::open(&path, l, MODEL).unwrap();
        let raw = File::open(&path).unwrap();
        let mut seed = 0u8;
        for &(start, len) in &areas {
            let last = start + len - SECTOR as u64;
            assert_eq!(read(&mut store, start, SECTOR), pattern(seed, SECTOR));
            assert_eq!(read(&mut store, last, SECTOR), pattern(seed + 1, SECTOR));
            // And the bytes sit at those absolute offsets of the raw file, which is what
            // makes the image usable by QEMU.
            let mut direct = vec![0u8; SECTOR];
            raw.read_exact_at(&mut direct, last).unwrap();
            assert_eq!(direct, pattern(seed + 1, SECTOR));
            seed += 2;
        }
        // A read spanning the boundary between two areas sees both.
        let both = read(&mut store, l.rpmb_offset() - 4, 8);
        assert_eq!(&both[..4], &pattern(3, SECTOR)[SECTOR - 4..]);
        assert_eq!(&both[4..], &pattern(4, SECTOR)[..4]);
    }

    #[test]
    fn holes_read_as_zero() {
        let dir = tempfile::tempdir().unwrap();
        let (_path, mut store) = new_image(&dir);
        let l = layout();
        assert!(read(&mut store, 0, 4096).iter().all(|&b| b == 0));
        store
            .write_at(l.user_offset() + 4096, &[0x77; 512])
            .unwrap();
        let around = read(&mut store, l.user_offset(), 3 * 4096);
        assert!(around[..4096].iter().all(|&b| b == 0));
        assert!(around[4096..4608].iter().all(|&b| b == 0x77));
        assert!(around[4608..].iter().all(|&b| b == 0));
        let end = l.total_bytes();
        assert!(read(&mut store, end - 65536, 65536).iter().all(|&b| b == 0));
    }

    #[test]
    fn create_refuses_existing_image_or_sidecar_and_leaves_them_alone() {
        let dir = tempfile::tempdir().unwrap();
        let (path, mut store) = new_image(&dir);
        store.write_at(0, &[0x42; 512]).unwrap();
        drop(store);
        let sidecar_before = fs::read(sidecar_path(&path)).unwrap();

        let other = ImageLayout {
            user_bytes: 16 << 20,
            ..layout()
        };
        let err = ImageStore::create(&path, other, "other-model").unwrap_err();
        assert!(matches!(err, StoreError::Exists { .. }), "{err:?}");
        assert_eq!(fs::metadata(&path).unwrap().len(), layout().total_bytes());
        assert_eq!(fs::read(sidecar_path(&path)).unwrap(), sidecar_before);
        let mut store = ImageStore::open(&path, layout(), MODEL).unwrap();
        assert_eq!(read(&mut store, 0, 512), vec![0x42; 512]);

        // A sidecar without its image blocks creation too, and no image appears.
        let lone = dir.path().join("lone.img");
        fs::write(sidecar_path(&lone), "stale").unwrap();
        let err = ImageStore::create(&lone, layout(), MODEL).unwrap_err();
        assert!(matches!(err, StoreError::Exists { ref path } if path.ends_with(".emmc.toml")));
        assert!(!lone.exists());
    }

    #[test]
    fn create_rejects_unusable_layouts_before_touching_the_disk() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("bad.img");
        let odd = ImageLayout {
            user_bytes: 1000,
            ..layout()
        };
        let huge = ImageLayout {
            boot_bytes: u64::MAX - 511,
            ..layout()
        };
        for bad in [odd, huge] {
            let err = ImageStore::create(&path, bad, MODEL).unwrap_err();
            assert!(matches!(err, StoreError::BadLayout { .. }), "{err:?}");
            assert!(!path.exists());
            assert!(!sidecar_path(&path).exists());
        }
    }

    #[test]
    fn open_detects_wrong_file_size() {
        let dir = tempfile::tempdir().unwrap();
        let (path, store) = new_image(&dir);
        drop(store);
        let grown = layout().total_bytes() + 512;
        File::options()
            .write(true)
            .open(&path)
            .unwrap()
            .set_len(grown)
            .unwrap();
        let msg = problem(ImageStore::open(&path, layout(), MODEL).unwrap_err());
        assert!(msg.contains(&grown.to_string()), "{msg}");
        assert!(msg.contains(&layout().total_bytes().to_string()), "{msg}");
    }

    #[test]
    fn open_detects_wrong_model() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("card.img");
        drop(ImageStore::create(&path, layout(), "toshiba-mmc32g").unwrap());
        let err = ImageStore::open(&path, layout(), MODEL).unwrap_err();
        assert!(matches!(err, StoreError::Mismatch { .. }), "{err:?}");
        assert_eq!(
            problem(err),
            "made for model toshiba-mmc32g, opened as generic-emmc45"
        );
    }

    #[test]
    fn open_detects_wrong_layout_and_names_the_area() {
        let dir = tempfile::tempdir().unwrap();
        let (path, store) = new_image(&dir);
        drop(store);
        let bigger_user = ImageLayout {
            user_bytes: 16 << 20,
            ..layout()
        };
        assert_eq!(
            problem(ImageStore::open(&path, bigger_user, MODEL).unwrap_err()),
            "user area is 8 MiB in the sidecar, 16 MiB in the model"
        );
        let other_rpmb = ImageLayout {
            rpmb_bytes: 128 * 1024,
            ..layout()
        };
        assert_eq!(
            problem(ImageStore::open(&path, other_rpmb, MODEL).unwrap_err()),
            "RPMB partition is 256 KiB in the sidecar, 128 KiB in the model"
        );
        let other_boot = ImageLayout {
            boot_bytes: 512 * 1024,
            ..layout()
        };
        let msg = problem(ImageStore::open(&path, other_boot, MODEL).unwrap_err());
        assert!(
            msg.contains("boot partition is 128 KiB in the sidecar, 512 KiB"),
            "{msg}"
        );
    }

    #[test]
    fn a_missing_image_is_named_before_its_sidecar() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("missing.img");
        let err = read_header(&path).unwrap_err();
        assert!(
            matches!(&err, StoreError::Io { source, .. } if source.kind() == ErrorKind::NotFound),
            "{err:?}"
        );
        assert!(err.to_string().starts_with(&display(&path)), "{err}");
    }

    #[test]
    fn open_detects_missing_and_corrupt_sidecar() {
        let dir = tempfile::tempdir().unwrap();
        let (path, store) = new_image(&dir);
        drop(store);
        let sidecar = sidecar_path(&path);
        let good = fs::read_to_string(&sidecar).unwrap();

        fs::remove_file(&sidecar).unwrap();
        let err = ImageStore::open(&path, layout(), MODEL).unwrap_err();
        assert!(matches!(err, StoreError::BadMetadata { .. }), "{err:?}");
        assert!(problem(err).contains("missing"));

        fs::write(&sidecar, "[image\nformat = = 1\n").unwrap();
        let msg = problem(ImageStore::open(&path, layout(), MODEL).unwrap_err());
        assert!(msg.contains("not valid TOML"), "{msg}");

        fs::write(&sidecar, good.replace("user_bytes", "user_bites")).unwrap();
        let msg = problem(ImageStore::open(&path, layout(), MODEL).unwrap_err());
        assert!(msg.contains("user_bites"), "{msg}");

        fs::write(&sidecar, good.replace("[image]", "[imgae]")).unwrap();
        let msg = problem(ImageStore::open(&path, layout(), MODEL).unwrap_err());
        assert!(msg.contains("imgae"), "{msg}");

        fs::write(&sidecar, &good).unwrap();
        ImageStore::open(&path, layout(), MODEL).unwrap();
    }

    #[test]
    fn open_detects_format_mismatch() {
        let dir = tempfile::tempdir().unwrap();
        let (path, store) = new_image(&dir);
        drop(store);
        let sidecar = sidecar_path(&path);
        let good = fs::read_to_string(&sidecar).unwrap();
        assert!(good.contains("format = 1\n"), "{good}");
        fs::write(&sidecar, good.replace("format = 1\n", "format = 2\n")).unwrap();
        let err = ImageStore::open(&path, layout(), MODEL).unwrap_err();
        assert!(matches!(err, StoreError::BadMetadata { .. }), "{err:?}");
        let msg = problem(err);
        assert!(
            msg.contains("format 2") && msg.contains("format 1"),
            "{msg}"
        );
        let err = read_header(&path).unwrap_err();
        assert!(problem(err).contains("format 2"));
    }

    #[test]
    fn read_header_reports_model_and_layout_without_being_told() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("card.img");
        drop(ImageStore::create(&path, layout(), "toshiba-mmc32g").unwrap());
        let header = read_header(&path).unwrap();
        assert_eq!(
            header,
            ImageHeader {
                model: "toshiba-mmc32g".into(),
                layout: layout(),
            }
        );
        ImageStore::open(&path, header.layout, &header.model).unwrap();
    }

    #[test]
    fn out_of_bounds_and_overflowing_accesses_are_rejected_and_write_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let (path, mut store) = new_image(&dir);
        let size = layout().total_bytes();
        let before = allocated(&path);
        let mut buf = [0u8; 8];
        let oob = |r: Result<(), StoreError>| {
            assert!(matches!(r, Err(StoreError::OutOfBounds { .. })), "{r:?}");
        };
        // Straddling the end, starting at the end, far past it, and wrapping around u64.
        for offset in [size - 4, size, size + 4096, u64::MAX - 2, u64::MAX] {
            oob(store.read_at(offset, &mut buf));
            oob(store.write_at(offset, &[0xEE; 8]));
            oob(store.fill(offset, 8, 0xEE));
            oob(store.fill(offset, 8, 0));
        }
        oob(store.fill(1, u64::MAX, 0xEE));
        oob(store.fill(1, u64::MAX, 0));
        oob(store.fill(0, size + 1, 0xEE));
        store.sync().unwrap();
        assert_eq!(fs::metadata(&path).unwrap().len(), size);
        assert_eq!(allocated(&path), before);
        assert_eq!(read(&mut store, size - 8, 8), vec![0u8; 8]);
        // The very end is reachable, and empty accesses at the end are fine.
        store.write_at(size - 8, &[1; 8]).unwrap();
        store.read_at(size, &mut []).unwrap();
        store.fill(size, 0, 0xEE).unwrap();
        assert_eq!(fs::metadata(&path).unwrap().len(), size);
    }

    #[test]
    fn fill_zero_deallocates_and_reads_back_zero() {
        let dir = tempfile::tempdir().unwrap();
        let (path, mut store) = new_image(&dir);
        let start = layout().user_offset() + (1 << 20);
        let len: u64 = 2 << 20;
        store.write_at(start, &vec![0xAB; len as usize]).unwrap();
        store.write_at(start + len, &[0xCD; 512]).unwrap();
        store.sync().unwrap();
        let written = allocated(&path);
        assert!(written >= len, "only {written} bytes allocated");

        store.fill(start, len, 0).unwrap();
        store.sync().unwrap();
        let after = allocated(&path);
        assert!(
            after + len <= written,
            "fill(0) freed only {} bytes of {len}",
            written - after
        );
        assert!(read(&mut store, start, len as usize)
            .iter()
            .all(|&b| b == 0));
        assert_eq!(read(&mut store, start + len, 512), vec![0xCD; 512]);
    }

    #[test]
    fn small_reads_and_writes_use_the_mapping_and_a_zero_fill_is_not_allocated_again() {
        let dir = crate::store::scratch_dir();
        let (path, mut store) = new_image(&dir);
        store.set_io_threads(true).unwrap();
        let user = layout().user_offset();
        // A large write maps and populates its window; a small one at the end of a
        // round and small reads then use the same pages.
        let mut big = pattern(3, 1 << 20);
        store.write_owned(user, &mut big).unwrap();
        store.end_batch();
        let mut small = pattern(4, 4096);
        store.write_owned(user + 8192, &mut small).unwrap();
        store.end_batch();
        let mut expect = pattern(3, 16384);
        expect[8192..12288].copy_from_slice(&pattern(4, 4096));
        assert_eq!(read(&mut store, user, 16384), expect);
        let mapping = super::super::mapped::populate_supported()
            && super::super::mapped::in_tmpfs(&store.file).is_ok();
        if mapping {
            assert_eq!(store.mapped_writes(), 2, "both writes through the mapping");
            assert_eq!(store.mapped_reads(), 1, "the read out of it");
        }
        // A zero fill gives the pages back; reading them must not take them again
        // (a read through the mapping of a hole would).
        let held = allocated(&path);
        store.fill(user, 1 << 20, 0).unwrap();
        let freed = allocated(&path);
        assert!(
            freed + (1 << 20) <= held,
            "{held} then {freed} bytes allocated"
        );
        assert!(read(&mut store, user, 16384).iter().all(|&b| b == 0));
        assert_eq!(
            allocated(&path),
            freed,
            "a read allocated the punched pages"
        );
        // And a write there afterwards lands (populating the page again).
        let mut again = pattern(5, 4096);
        store.write_owned(user + 4096, &mut again).unwrap();
        store.end_batch();
        assert_eq!(read(&mut store, user + 4096, 4096), pattern(5, 4096));
    }

    #[test]
    fn fill_zero_on_unaligned_range_zeroes_exactly_that_range() {
        let dir = tempfile::tempdir().unwrap();
        let (_path, mut store) = new_image(&dir);
        let base = layout().user_offset();
        store.write_at(base, &vec![0x5A; 3 << 20]).unwrap();
        store.fill(base + 1000, (2 << 20) + 1234, 0).unwrap();
        let back = read(&mut store, base, 3 << 20);
        let end = 1000 + (2 << 20) + 1234;
        assert!(back[..1000].iter().all(|&b| b == 0x5A));
        assert!(back[1000..end].iter().all(|&b| b == 0));
        assert!(back[end..].iter().all(|&b| b == 0x5A));
    }

    #[test]
    fn zero_writing_fallback_zeroes_exactly_the_range() {
        // The path taken where the filesystem cannot punch holes (EOPNOTSUPP).
        let dir = tempfile::tempdir().unwrap();
        let (_path, mut store) = new_image(&dir);
        let base = layout().user_offset();
        let len = FILL_CHUNK * 2 + 700;
        store
            .write_at(base, &vec![0x5A; (len + 1024) as usize])
            .unwrap();
        store.write_repeated(base + 512, len, 0).unwrap();
        let back = read(&mut store, base, (len + 1024) as usize);
        let end = 512 + len as usize;
        assert!(back[..512].iter().all(|&b| b == 0x5A));
        assert!(back[512..end].iter().all(|&b| b == 0));
        assert!(back[end..].iter().all(|&b| b == 0x5A));
    }

    #[test]
    fn fill_ff_reads_back_ff_and_leaves_neighbours_untouched() {
        let dir = tempfile::tempdir().unwrap();
        let (_path, mut store) = new_image(&dir);
        let base = layout().user_offset();
        let len = FILL_CHUNK * 2 + 4096 + 17; // several chunks, unaligned end
        let total = (len + 2 * 4096) as usize;
        store.write_at(base, &pattern(9, total)).unwrap();
        store.fill(base + 4096, len, 0xFF).unwrap();
        let back = read(&mut store, base, total);
        let want = pattern(9, total);
        let end = 4096 + len as usize;
        assert_eq!(back[..4096], want[..4096]);
        assert!(back[4096..end].iter().all(|&b| b == 0xFF));
        assert_eq!(back[end..], want[end..]);
        // Up to the last byte of the image.
        let size = layout().total_bytes();
        store.fill(size - 3, 3, 0xFF).unwrap();
        assert_eq!(read(&mut store, size - 4, 4), vec![0, 0xFF, 0xFF, 0xFF]);
    }

    fn state(counter: i64) -> toml::Table {
        let mut rpmb = toml::Table::new();
        rpmb.insert("write_counter".into(), toml::Value::Integer(counter));
        rpmb.insert("key".into(), toml::Value::String("00ff".repeat(16)));
        let mut t = toml::Table::new();
        t.insert("rpmb".into(), toml::Value::Table(rpmb));
        t.insert("boot_wp".into(), toml::Value::Boolean(true));
        t
    }

    #[test]
    fn card_state_round_trips_through_reopen_and_keeps_image_table() {
        let dir = tempfile::tempdir().unwrap();
        let (path, store) = new_image(&dir);
        assert_eq!(store.load_card_state(), None);
        drop(store);
        assert_eq!(
            ImageStore::open(&path, layout(), MODEL)
                .unwrap()
                .load_card_state(),
            None
        );

        let mut store = ImageStore::open(&path, layout(), MODEL).unwrap();
        store.save_card_state(&state(7)).unwrap();
        assert_eq!(store.load_card_state(), Some(state(7)));
        store.save_card_state(&state(8)).unwrap();
        drop(store);

        let store = ImageStore::open(&path, layout(), MODEL).unwrap();
        assert_eq!(store.load_card_state(), Some(state(8)));
        assert_eq!(
            read_header(&path).unwrap(),
            ImageHeader {
                model: MODEL.into(),
                layout: layout(),
            }
        );
        assert!(!tmp_path(&sidecar_path(&path)).exists());
    }

    #[test]
    fn crash_before_rename_leaves_old_state_readable() {
        let dir = tempfile::tempdir().unwrap();
        let (path, mut store) = new_image(&dir);
        store.save_card_state(&state(1)).unwrap();
        drop(store);
        let tmp = tmp_path(&sidecar_path(&path));

        // Crashed after writing the new sidecar in full but before the rename...
        let image = ImageSection::new(layout(), MODEL);
        let newer = toml::to_string(&SidecarOut {
            image: &image,
            card: Some(&state(2)),
        })
        .unwrap();
        fs::write(&tmp, newer).unwrap();
        let store = ImageStore::open(&path, layout(), MODEL).unwrap();
        assert_eq!(store.load_card_state(), Some(state(1)));
        drop(store);

        // ...or halfway through writing it.
        fs::write(&tmp, "[image]\nformat = 1\nmod").unwrap();
        let mut store = ImageStore::open(&path, layout(), MODEL).unwrap();
        assert_eq!(store.load_card_state(), Some(state(1)));

        // The next save goes through despite the stale file.
        store.save_card_state(&state(3)).unwrap();
        drop(store);
        let store = ImageStore::open(&path, layout(), MODEL).unwrap();
        assert_eq!(store.load_card_state(), Some(state(3)));
        assert!(!tmp.exists());
    }

    #[test]
    fn a_32_gib_image_is_created_sparse() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("big.img");
        let big = ImageLayout {
            boot_bytes: 4 << 20,
            rpmb_bytes: 4 << 20,
            user_bytes: 32 << 30,
        };
        let mut store = ImageStore::create(&path, big, "big-card").unwrap();
        let size = big.total_bytes();
        assert_eq!(fs::metadata(&path).unwrap().len(), size);
        store.write_at(0, &[0x11; 512]).unwrap();
        store.write_at(size - 512, &[0x22; 512]).unwrap();
        store.sync().unwrap();
        // Two sectors, rounded up to filesystem blocks, plus some metadata blocks.
        let used = allocated(&path);
        assert!(used <= 1 << 20, "{used} bytes allocated for two sectors");
        drop(store);

        let mut store = ImageStore::open(&path, big, "big-card").unwrap();
        assert_eq!(read(&mut store, size - 512, 512), vec![0x22; 512]);
        assert_eq!(read(&mut store, size / 2, 512), vec![0; 512]);
    }
}
