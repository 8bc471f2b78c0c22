//! Sparse raw image file plus metadata sidecar (format described in `docs/image-format.md`).
//!
//! `PATH` is a raw file laid out `boot1 | boot2 | RPMB | user`, exactly `total_bytes()`
//! long and sparse: it is created with `set_len`, never written in full, and erased
//! ranges are given back to the filesystem by punching holes. `PATH.emmc.toml` records
//! the model and layout the image was made for (`[image]`) and the card's persistent
//! state (`[card]`, opaque to the store), and is replaced atomically.
//!
//! Data goes through `pread`/`pwrite` on one open file; nothing of the image is held in
//! memory and no buffer larger than [`FILL_CHUNK`] is ever allocated.

use std::ffi::OsString;
use std::fs::{self, File, OpenOptions};
use std::io::{ErrorKind, Write};
use std::os::unix::fs::FileExt;
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

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
    let sidecar = read_sidecar(&sidecar_path(path))?;
    Ok(ImageHeader {
        layout: sidecar.image.layout(),
        model: sidecar.image.model,
    })
}

impl ImageStore {
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
        self.file.read_exact_at(buf, offset).map_err(|e| self.io(e))
    }

    fn write_at(&mut self, offset: u64, buf: &[u8]) -> Result<(), StoreError> {
        check_bounds(offset, buf.len() as u64, self.size)?;
        self.file.write_all_at(buf, offset).map_err(|e| self.io(e))
    }

    fn fill(&mut self, offset: u64, len: u64, byte: u8) -> Result<(), StoreError> {
        check_bounds(offset, len, self.size)?;
        if len == 0 {
            return Ok(());
        }
        if byte == 0 {
            match self.punch_hole(offset, len) {
                Ok(()) => return Ok(()),
                // The filesystem cannot punch holes: store the zeroes instead.
                Err(e) if matches!(e.raw_os_error(), Some(libc::EOPNOTSUPP | libc::ENOSYS)) => {}
                Err(e) => return Err(self.io(e)),
            }
        }
        self.write_repeated(offset, len, byte)
    }

    fn sync(&mut self) -> Result<(), StoreError> {
        self.file.sync_data().map_err(|e| self.io(e))
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
