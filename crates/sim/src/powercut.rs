//! `simulate --workload power-cut`: seeded MMC-level writes through the MMC core and the
//! SDHCI model, power cut at seeded card-time instants (often in the middle of a busy
//! program), the card powered up again on the same store — reopened from the image file
//! every `reopen_every` cuts — and the medium checked against an independent model of what
//! the eMMC 4.5 spec (and `docs/card.md`) promises.
//!
//! The checker never asks the card what is durable. It derives, from the operations the
//! host saw acknowledged, for every sector of the working window the versions allowed on
//! the medium after the cut:
//!
//! - the last *durable* version: written by an acknowledged reliable write, a forced
//!   programming write, a write while the host had the cache off, or any acknowledged write
//!   followed by an acknowledged FLUSH_CACHE or CACHE_CTRL 1 → 0;
//! - every later version that may have reached the medium: acknowledged cached writes (the
//!   card may have written them back, or not) and the write in flight at the cut.
//!
//! A reliable write in flight at the cut must land as the spec promises for its mode:
//! enhanced (WR_REL_PARAM.EN_REL_WR = 1) each sector old or new and, as `docs/card.md`
//! promises, the new sectors a prefix; legacy all or nothing. Each sector carries a tag
//! (version, sector, checksummed body) so the checker can tell which version survived.
//!
//! Violations, by kind: a durable write missing (the sector holds an older version), a
//! reliable write torn beyond its granule, a sector outside the written set changed (a
//! guard sector, data of another sector, a version that was never allowed there, or a store
//! write outside the window), and content that is no version at all (corrupt).

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use emmc_card::model::DeviceModel;
use emmc_card::store::{ImageLayout, ImageStore, MemStore, Store, StoreError};
use emmc_card::timing::prng::Prng;
use emmc_card::{ext_csd as ext, packed, r1, Card, Partition, PowerDown};
use emmc_host::mmc::{
    completion_result, HostCaps, MmcError, MmcHost, MmcHostOps, MMC_CMD23_ARG_PACKED,
    MMC_CMD23_ARG_REL_WR,
};
use emmc_host::sdhci::{MmcCommand, MmcData, MmcRequest, ResponseType, SdhciConfig};

/// CMD23 bit 24: forced programming (bypass the cache).
const CMD23_FORCED_PROGRAMMING: u32 = packed::CMD23_FORCED_PROGRAMMING;

/// Version 0: the sector was never written (reads as zeros).
const NEVER_WRITTEN: u64 = 0;
/// The sector was found corrupt at an earlier cut (and reported then): neither the garbage
/// nor whatever version replaces it is reported again.
const FOUND_CORRUPT: u64 = u64::MAX;
/// A version is `op id * VERSIONS_PER_OP + entry index`.
const VERSIONS_PER_OP: u64 = 64;
/// Packed entries per packed write, at most.
const MAX_PACKED_ENTRIES: u64 = 6;

/// First sector of the working window in the user area (4 MiB in).
const WINDOW_BASE: u64 = 8192;
/// Sectors the workload writes into.
const WINDOW_SPAN: u64 = 4096;
/// Sectors on either side of the window that nothing may write; checked after every cut.
const GUARD: u64 = 256;

const TAG_MAGIC: &[u8; 8] = b"PWRCUT45";

/// Where the card's data lives during the run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum CutStore {
    /// A sparse image file, reopened from disk every `reopen_every` cuts.
    Image,
    /// In memory: the card is power-cycled on the same store after every cut.
    Mem,
}

/// A power-cut run.
#[derive(Debug, Clone)]
pub struct PowerCutConfig {
    pub cuts: u64,
    pub seed: u64,
    pub store: CutStore,
    /// Image store: drop the card and reopen the image from disk every this many cuts
    /// (the cuts in between power-cycle the card on the open store). 0 = never.
    pub reopen_every: u64,
    /// The image file (a temporary one when `None`; it is removed afterwards).
    pub image: Option<PathBuf>,
    /// Most complete operations between two cuts.
    pub max_ops_per_cut: u64,
    /// The host loses power with the card: store writes the card did not `sync()` are
    /// dropped at every cut, as the host's page cache would be.
    pub lose_unsynced: bool,
    /// Percent of the complete single writes interrupted by HPI at a seeded instant of
    /// their programming (0: none, and the seeded sequence is that of a run without HPI).
    pub hpi_percent: u64,
}

impl PowerCutConfig {
    pub fn new(cuts: u64, seed: u64) -> PowerCutConfig {
        PowerCutConfig {
            cuts,
            seed,
            store: CutStore::Image,
            reopen_every: 1,
            image: None,
            max_ops_per_cut: 24,
            lose_unsynced: false,
            hpi_percent: 0,
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum PowerCutError {
    #[error("store: {0}")]
    Store(#[from] StoreError),
    #[error("card: {0}")]
    Card(#[from] emmc_card::CardError),
    #[error("card bring-up after cut {cut}: {error}")]
    BringUp { cut: u64, error: MmcError },
    #[error("{0}")]
    Config(String),
}

/// Kinds of violation the checker reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ViolationKind {
    /// The sector holds a version older than its last durable one.
    DurableLost,
    /// A reliable write in flight at the cut landed beyond its atomic granule.
    TornReliable,
    /// A sector nothing wrote (or not with this version) changed.
    OutsideWritten,
    /// The sector holds no version of any write.
    Corrupt,
}

#[derive(Debug, Clone, serde::Serialize)]
pub struct Violation {
    pub kind: ViolationKind,
    /// 1-based cut after which it was found.
    pub cut: u64,
    /// The operation concerned (the durable write, the torn write, the writer found).
    pub op: u64,
    /// User-area sector.
    pub lba: u64,
    pub detail: String,
}

#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct ViolationCounts {
    pub durable_lost: u64,
    pub torn_reliable: u64,
    pub outside_written: u64,
    pub corrupt: u64,
}

impl ViolationCounts {
    pub fn total(&self) -> u64 {
        self.durable_lost + self.torn_reliable + self.outside_written + self.corrupt
    }

    fn add(&mut self, kind: ViolationKind) {
        match kind {
            ViolationKind::DurableLost => self.durable_lost += 1,
            ViolationKind::TornReliable => self.torn_reliable += 1,
            ViolationKind::OutsideWritten => self.outside_written += 1,
            ViolationKind::Corrupt => self.corrupt += 1,
        }
    }
}

/// Operations issued, by kind.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct OpCounts {
    pub writes: u64,
    pub reliable_writes: u64,
    pub forced_writes: u64,
    pub packed_writes: u64,
    pub packed_reliable_entries: u64,
    pub flushes: u64,
    pub cache_switches: u64,
    /// Legacy reliable writes that break the REL_WR_SEC_C rule, refused as they must be.
    pub refused_as_expected: u64,
    /// Writes interrupted by HPI while programming, and the sectors CORRECTLY_PRG_SECTORS_NUM
    /// reported for them.
    pub hpi_interrupts: u64,
    pub hpi_sectors_programmed: u64,
}

#[derive(Debug, Clone, serde::Serialize)]
pub struct PowerCutReport {
    pub model: String,
    pub seed: u64,
    pub store: CutStore,
    pub reopen_every: u64,
    pub lose_unsynced: bool,
    pub reliable_mode: &'static str,
    pub cuts: u64,
    /// Cuts that came while the card was busy (programming, flushing, switching).
    pub cuts_while_busy: u64,
    /// Cuts that came while a reliable write was being programmed.
    pub cuts_in_reliable_write: u64,
    /// Image reopened from disk this many times.
    pub reopens: u64,
    pub operations: u64,
    pub ops: OpCounts,
    /// Operations that failed although the workload only issues valid ones.
    pub unexpected_errors: u64,
    pub first_errors: Vec<String>,
    pub violations: ViolationCounts,
    pub first_violations: Vec<Violation>,
    pub sectors_checked: u64,
    pub check_seconds: f64,
    pub wall_seconds: f64,
    pub card_seconds: f64,
}

impl PowerCutReport {
    /// The run found something wrong.
    pub fn failed(&self) -> bool {
        self.violations.total() > 0 || self.unexpected_errors > 0
    }

    pub fn to_text(&self) -> String {
        use std::fmt::Write;
        let mut s = String::new();
        let _ = writeln!(
            s,
            "power-cut: model {}, seed {}, {:?} store (reopened {} times){}, {} reliable write",
            self.model,
            self.seed,
            self.store,
            self.reopens,
            if self.lose_unsynced {
                ", unsynced store writes lost at each cut"
            } else {
                ""
            },
            self.reliable_mode
        );
        let _ = writeln!(
            s,
            "  cuts {} ({} while busy, {} inside a reliable write), operations {}",
            self.cuts, self.cuts_while_busy, self.cuts_in_reliable_write, self.operations
        );
        let o = &self.ops;
        let _ = writeln!(
            s,
            "  writes {} (reliable {}, forced {}), packed {} ({} reliable entries), flushes {}, cache switches {}, refused as expected {}, HPI {} ({} sectors programmed)",
            o.writes,
            o.reliable_writes,
            o.forced_writes,
            o.packed_writes,
            o.packed_reliable_entries,
            o.flushes,
            o.cache_switches,
            o.refused_as_expected,
            o.hpi_interrupts,
            o.hpi_sectors_programmed
        );
        let v = &self.violations;
        let _ = writeln!(
            s,
            "  violations {} (durable lost {}, torn reliable {}, outside written set {}, corrupt {})",
            v.total(),
            v.durable_lost,
            v.torn_reliable,
            v.outside_written,
            v.corrupt
        );
        for x in &self.first_violations {
            let _ = writeln!(
                s,
                "    {:?} after cut {}: op {}, sector {}: {}",
                x.kind, x.cut, x.op, x.lba, x.detail
            );
        }
        let _ = writeln!(s, "  unexpected errors {}", self.unexpected_errors);
        for e in &self.first_errors {
            let _ = writeln!(s, "    {e}");
        }
        let rate = if self.check_seconds > 0.0 {
            self.sectors_checked as f64 / self.check_seconds
        } else {
            0.0
        };
        let _ = writeln!(
            s,
            "  checked {} sectors in {:.2} s ({:.0} sectors/s, {:.0} cuts/s overall); wall {:.2} s, card time {:.2} s",
            self.sectors_checked,
            self.check_seconds,
            rate,
            self.cuts as f64 / self.wall_seconds.max(1e-9),
            self.wall_seconds,
            self.card_seconds
        );
        s
    }

    pub fn to_json(&self) -> String {
        serde_json::to_string(self).expect("plain data")
    }
}

// ---- sector tags ----------------------------------------------------------------------

fn body_word(version: u64, lba: u64) -> u64 {
    let mut z = version
        .wrapping_mul(0x9E37_79B9_7F4A_7C15)
        .wrapping_add(lba.rotate_left(32));
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z ^ (z >> 31)
}

/// The 512 bytes version `version` writes to user sector `lba`.
pub fn tag_sector(version: u64, lba: u64, out: &mut [u8]) {
    out[..8].copy_from_slice(TAG_MAGIC);
    out[8..16].copy_from_slice(&version.to_le_bytes());
    out[16..24].copy_from_slice(&lba.to_le_bytes());
    let w = body_word(version, lba);
    for (i, chunk) in out[24..512].chunks_exact_mut(8).enumerate() {
        chunk.copy_from_slice(&w.wrapping_add(i as u64).to_le_bytes());
    }
}

/// What a sector holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Found {
    /// A whole, intact tag: `version` written for sector `lba`.
    Version { version: u64, lba: u64 },
    /// Neither zeros nor an intact tag.
    Garbage,
}

pub fn decode_sector(buf: &[u8]) -> Found {
    if buf[..8] != TAG_MAGIC[..] {
        return if buf.iter().all(|&b| b == 0) {
            Found::Version {
                version: NEVER_WRITTEN,
                lba: u64::MAX,
            }
        } else {
            Found::Garbage
        };
    }
    let version = u64::from_le_bytes(buf[8..16].try_into().expect("8 bytes"));
    let lba = u64::from_le_bytes(buf[16..24].try_into().expect("8 bytes"));
    let w = body_word(version, lba);
    let intact = buf[24..512].chunks_exact(8).enumerate().all(|(i, c)| {
        u64::from_le_bytes(c.try_into().expect("8 bytes")) == w.wrapping_add(i as u64)
    });
    if intact {
        Found::Version { version, lba }
    } else {
        Found::Garbage
    }
}

// ---- the checker's model ----------------------------------------------------------------

/// A reliable write (or packed entry) in flight at the cut and the granule its mode makes
/// atomic: 1 for enhanced reliable write (plus the prefix rule), its whole length for
/// legacy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct InFlightReliable {
    pub version: u64,
    pub lba: u64,
    pub count: u64,
    pub granule: u64,
}

/// What the spec allows on the medium, per sector of the window, from the acknowledged
/// operations alone.
#[derive(Debug, Clone)]
pub struct Expectation {
    /// First sector of the window (user-area LBA).
    pub first: u64,
    /// Last durable version per sector.
    durable: Vec<u64>,
    /// Versions after the durable one that may have reached the medium.
    maybe: Vec<Vec<u64>>,
    /// Sectors with a non-empty `maybe`.
    pending: Vec<u64>,
    in_flight: Vec<InFlightReliable>,
}

impl Expectation {
    pub fn new(first: u64, sectors: u64) -> Expectation {
        Expectation {
            first,
            durable: vec![NEVER_WRITTEN; sectors as usize],
            maybe: vec![Vec::new(); sectors as usize],
            pending: Vec::new(),
            in_flight: Vec::new(),
        }
    }

    pub fn sectors(&self) -> u64 {
        self.durable.len() as u64
    }

    fn index(&self, lba: u64) -> usize {
        (lba - self.first) as usize
    }

    /// An acknowledged write that is durable on acknowledgement.
    pub fn durable_write(&mut self, version: u64, lba: u64, count: u64) {
        for s in lba..lba + count {
            let i = self.index(s);
            self.durable[i] = version;
            self.maybe[i].clear();
        }
    }

    /// A write that may or may not be on the medium: acknowledged into the cache, or in
    /// flight at the cut.
    pub fn volatile_write(&mut self, version: u64, lba: u64, count: u64) {
        for s in lba..lba + count {
            let i = self.index(s);
            if self.maybe[i].is_empty() {
                self.pending.push(s);
            }
            self.maybe[i].push(version);
        }
    }

    /// A reliable write in flight at the cut: its sectors may be new, within its rule.
    pub fn reliable_in_flight(&mut self, w: InFlightReliable) {
        self.volatile_write(w.version, w.lba, w.count);
        self.in_flight.push(w);
    }

    /// An acknowledged FLUSH_CACHE (or cache turned off): every acknowledged write is
    /// durable.
    pub fn flushed(&mut self) {
        for s in std::mem::take(&mut self.pending) {
            let i = self.index(s);
            if let Some(&last) = self.maybe[i].last() {
                self.durable[i] = last;
            }
            self.maybe[i].clear();
        }
    }

    /// Check the medium (`data`: the window's sectors after power-up) and record
    /// violations; then what is there becomes the durable state for the next round.
    pub fn check(&mut self, cut: u64, data: &[u8], guard: (u64, u64), out: &mut Findings) {
        let mut found = Vec::with_capacity(self.durable.len());
        for (i, sector) in data.chunks_exact(512).enumerate() {
            let lba = self.first + i as u64;
            let f = decode_sector(sector);
            found.push(f);
            let in_guard = lba < guard.0 || lba >= guard.1;
            let (version, tagged_lba) = match f {
                // Reported when first found; still the old content until a write lands.
                Found::Garbage if self.durable[i] == FOUND_CORRUPT => continue,
                Found::Garbage => {
                    out.push(Violation {
                        kind: ViolationKind::Corrupt,
                        cut,
                        op: self.durable[i] / VERSIONS_PER_OP,
                        lba,
                        detail: format!("no intact version (durable: version {})", self.durable[i]),
                    });
                    continue;
                }
                Found::Version { version, lba } => (version, lba),
            };
            if version != NEVER_WRITTEN && tagged_lba != lba {
                out.push(Violation {
                    kind: ViolationKind::OutsideWritten,
                    cut,
                    op: version / VERSIONS_PER_OP,
                    lba,
                    detail: format!("holds version {version} written for sector {tagged_lba}"),
                });
                continue;
            }
            if in_guard && version != NEVER_WRITTEN {
                out.push(Violation {
                    kind: ViolationKind::OutsideWritten,
                    cut,
                    op: version / VERSIONS_PER_OP,
                    lba,
                    detail: format!("guard sector holds version {version}"),
                });
                continue;
            }
            let durable = self.durable[i];
            if version == durable || self.maybe[i].contains(&version) || durable == FOUND_CORRUPT {
                continue;
            }
            if version < durable {
                out.push(Violation {
                    kind: ViolationKind::DurableLost,
                    cut,
                    op: durable / VERSIONS_PER_OP,
                    lba,
                    detail: format!(
                        "durable version {durable} missing, found older version {version}"
                    ),
                });
            } else {
                out.push(Violation {
                    kind: ViolationKind::OutsideWritten,
                    cut,
                    op: version / VERSIONS_PER_OP,
                    lba,
                    detail: format!(
                        "version {version} was never allowed here (durable {durable}, maybe {:?})",
                        self.maybe[i]
                    ),
                });
            }
        }
        for w in std::mem::take(&mut self.in_flight) {
            let new: Vec<bool> = (w.lba..w.lba + w.count)
                .map(|s| {
                    matches!(found[self.index(s)], Found::Version { version, .. } if version == w.version)
                })
                .collect();
            let landed = new.iter().take_while(|&&n| n).count() as u64;
            let prefix = new[landed as usize..].iter().all(|&n| !n);
            if !prefix || landed % w.granule.max(1) != 0 {
                out.push(Violation {
                    kind: ViolationKind::TornReliable,
                    cut,
                    op: w.version / VERSIONS_PER_OP,
                    lba: w.lba,
                    detail: format!(
                        "{} of {} sectors new ({}), granule {}",
                        new.iter().filter(|&&n| n).count(),
                        w.count,
                        new.iter()
                            .map(|&n| if n { '1' } else { '0' })
                            .collect::<String>(),
                        w.granule
                    ),
                });
            }
        }
        for (i, f) in found.into_iter().enumerate() {
            self.durable[i] = match f {
                Found::Version { version, .. } => version,
                Found::Garbage => FOUND_CORRUPT,
            };
            self.maybe[i].clear();
        }
        self.pending.clear();
    }
}

/// Violations found so far: counts and the first few.
#[derive(Debug, Clone, Default)]
pub struct Findings {
    pub counts: ViolationCounts,
    pub first: Vec<Violation>,
}

const FIRST_VIOLATIONS: usize = 10;

impl Findings {
    pub fn push(&mut self, v: Violation) {
        self.counts.add(v.kind);
        if self.first.len() < FIRST_VIOLATIONS {
            self.first.push(v);
        }
    }
}

// ---- the store watch ------------------------------------------------------------------

/// Store writes that fell outside the working window (absolute image byte ranges).
pub type StrayWrites = Arc<Mutex<Vec<(u64, u64)>>>;

/// Data written to the store but not yet made durable by `sync()`: what a host crash or
/// power loss would take with the host's page cache. Sector-addressed (absolute image
/// sectors).
pub type Unsynced = Arc<Mutex<std::collections::BTreeMap<u64, Box<[u8]>>>>;

/// Passes everything to the store and records data writes outside `[lo, hi)`: the
/// workload writes only inside its window, so any such write changed a sector outside the
/// written set. Reading the rest of a multi-GiB user area after every cut would be too slow;
/// this catches the same thing where it happens.
///
/// With `unsynced`, it also plays the host's page cache: data writes stay there until the
/// card calls `sync()` (fdatasync on an image), and the run drops them at every cut, as a
/// power loss of the whole host would.
struct WatchedStore {
    inner: Box<dyn Store + Send>,
    lo: u64,
    hi: u64,
    stray: StrayWrites,
    unsynced: Option<Unsynced>,
}

impl WatchedStore {
    fn note(&self, offset: u64, len: u64) {
        if len > 0 && (offset < self.lo || offset + len > self.hi) {
            self.stray.lock().expect("not poisoned").push((offset, len));
        }
    }
}

impl Store for WatchedStore {
    fn layout(&self) -> ImageLayout {
        self.inner.layout()
    }
    fn read_at(&mut self, offset: u64, buf: &mut [u8]) -> Result<(), StoreError> {
        self.inner.read_at(offset, buf)?;
        if let Some(unsynced) = &self.unsynced {
            let pending = unsynced.lock().expect("not poisoned");
            if offset % 512 == 0 && !pending.is_empty() {
                let first = offset / 512;
                for (&sector, data) in pending.range(first..first + (buf.len() / 512) as u64) {
                    let at = ((sector - first) * 512) as usize;
                    buf[at..at + 512].copy_from_slice(data);
                }
            }
        }
        Ok(())
    }
    fn write_at(&mut self, offset: u64, buf: &[u8]) -> Result<(), StoreError> {
        self.note(offset, buf.len() as u64);
        match &self.unsynced {
            Some(unsynced) if offset % 512 == 0 && buf.len() % 512 == 0 => {
                emmc_card::store::check_bounds(
                    offset,
                    buf.len() as u64,
                    self.layout().total_bytes(),
                )?;
                let mut pending = unsynced.lock().expect("not poisoned");
                for (i, sector) in buf.chunks_exact(512).enumerate() {
                    pending.insert(offset / 512 + i as u64, sector.into());
                }
                Ok(())
            }
            _ => self.inner.write_at(offset, buf),
        }
    }
    fn fill(&mut self, offset: u64, len: u64, byte: u8) -> Result<(), StoreError> {
        self.note(offset, len);
        if let Some(unsynced) = &self.unsynced {
            // Treated as durable at once (the workload does not erase).
            let mut pending = unsynced.lock().expect("not poisoned");
            let first = offset / 512;
            let keys: Vec<u64> = pending
                .range(first..(offset + len).div_ceil(512))
                .map(|(&k, _)| k)
                .collect();
            for k in keys {
                pending.remove(&k);
            }
        }
        self.inner.fill(offset, len, byte)
    }
    fn sync(&mut self) -> Result<(), StoreError> {
        if let Some(unsynced) = &self.unsynced {
            let pending = std::mem::take(&mut *unsynced.lock().expect("not poisoned"));
            for (sector, data) in pending {
                self.inner.write_at(sector * 512, &data)?;
            }
        }
        self.inner.sync()
    }
    fn load_card_state(&self) -> Option<toml::Table> {
        self.inner.load_card_state()
    }
    fn keeps_data(&self) -> bool {
        self.inner.keeps_data()
    }
    fn save_card_state(&mut self, state: &toml::Table) -> Result<(), StoreError> {
        self.inner.save_card_state(state)
    }
}

// ---- the workload ---------------------------------------------------------------------

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum WriteMode {
    Normal,
    Reliable,
    Forced,
}

#[derive(Debug, Clone, Copy)]
struct Entry {
    lba: u64,
    count: u64,
    reliable: bool,
}

#[derive(Debug, Clone)]
enum Op {
    Write {
        lba: u64,
        count: u64,
        mode: WriteMode,
        /// A legacy reliable write that breaks the REL_WR_SEC_C rule: must be refused.
        refused: bool,
    },
    Packed(Vec<Entry>),
    Flush,
    CacheCtrl(bool),
}

/// What the host knows about the card it drives.
struct Caps {
    has_cache: bool,
    enhanced: bool,
    rel_wr_sec_c: u64,
    packed: bool,
}

fn gen_op(rng: &mut Prng, caps: &Caps, cache_on: bool) -> Op {
    let lo = WINDOW_BASE;
    let place = |rng: &mut Prng, count: u64| lo + rng.below(WINDOW_SPAN - count + 1);
    let normal_count = |rng: &mut Prng| {
        if rng.below(4) == 0 {
            1 + rng.below(256)
        } else {
            1 + rng.below(32)
        }
    };
    let r = rng.below(100);
    match r {
        0..=39 => {
            let count = normal_count(rng);
            Op::Write {
                lba: place(rng, count),
                count,
                mode: WriteMode::Normal,
                refused: false,
            }
        }
        40..=54 => {
            if caps.enhanced {
                let count = 1 + rng.below(64);
                Op::Write {
                    lba: place(rng, count),
                    count,
                    mode: WriteMode::Reliable,
                    refused: false,
                }
            } else {
                let rel = caps.rel_wr_sec_c.max(1);
                let pick = rng.below(10);
                if pick < 3 || rel == 1 {
                    Op::Write {
                        lba: place(rng, 1),
                        count: 1,
                        mode: WriteMode::Reliable,
                        refused: false,
                    }
                } else if pick < 9 {
                    let lba = place(rng, rel) / rel * rel;
                    Op::Write {
                        lba: lba.max(lo.div_ceil(rel) * rel),
                        count: rel,
                        mode: WriteMode::Reliable,
                        refused: false,
                    }
                } else {
                    // Misaligned: the card must refuse it and write nothing.
                    let lba = (place(rng, rel + 1) / rel * rel).max(lo.div_ceil(rel) * rel) + 1;
                    Op::Write {
                        lba,
                        count: rel,
                        mode: WriteMode::Reliable,
                        refused: true,
                    }
                }
            }
        }
        55..=61 => {
            let count = normal_count(rng);
            Op::Write {
                lba: place(rng, count),
                count,
                mode: WriteMode::Forced,
                refused: false,
            }
        }
        62..=76 if caps.packed => {
            let n = 2 + rng.below(MAX_PACKED_ENTRIES - 1);
            let mut entries: Vec<Entry> = Vec::new();
            while (entries.len() as u64) < n {
                let reliable = rng.below(3) == 0;
                let (count, lba) = if reliable && !caps.enhanced {
                    let rel = caps.rel_wr_sec_c.max(1);
                    if rng.below(2) == 0 {
                        (1, place(rng, 1))
                    } else {
                        (
                            rel,
                            (place(rng, rel) / rel * rel).max(lo.div_ceil(rel) * rel),
                        )
                    }
                } else {
                    let count = 1 + rng.below(16);
                    (count, place(rng, count))
                };
                let overlaps = entries
                    .iter()
                    .any(|e| lba < e.lba + e.count && e.lba < lba + count);
                if !overlaps {
                    entries.push(Entry {
                        lba,
                        count,
                        reliable,
                    });
                }
            }
            Op::Packed(entries)
        }
        77..=86 if caps.has_cache => Op::Flush,
        87..=91 if caps.has_cache => Op::CacheCtrl(!cache_on),
        _ => {
            let count = normal_count(rng);
            Op::Write {
                lba: place(rng, count),
                count,
                mode: WriteMode::Normal,
                refused: false,
            }
        }
    }
}

fn tagged(versions: impl Iterator<Item = (u64, u64, u64)>) -> Vec<u8> {
    let mut data = Vec::new();
    for (version, lba, count) in versions {
        for s in lba..lba + count {
            let at = data.len();
            data.resize(at + 512, 0);
            tag_sector(version, s, &mut data[at..]);
        }
    }
    data
}

fn address(card_sector_addressing: bool, lba: u64) -> u32 {
    if card_sector_addressing {
        lba as u32
    } else {
        (lba * 512) as u32
    }
}

/// Start `op` on the card: send its commands and data and return as soon as its final
/// busy period begins (the programming, the flush), as Linux's busy-polling path does.
fn start_op(host: &mut MmcHost, op: &Op, id: u64, sector_addr: bool) -> Result<(), MmcError> {
    match op {
        Op::Write {
            lba, count, mode, ..
        } => {
            let flags = match mode {
                WriteMode::Normal => 0,
                WriteMode::Reliable => MMC_CMD23_ARG_REL_WR,
                WriteMode::Forced => CMD23_FORCED_PROGRAMMING,
            };
            let data = tagged(std::iter::once((id * VERSIONS_PER_OP, *lba, *count)));
            let blocks = *count as u32;
            let mut sg = [&data[..]];
            let done = host.start_request(MmcRequest {
                sbc: Some(MmcCommand::new(23, blocks | flags, ResponseType::R1)),
                cmd: MmcCommand::new(25, address(sector_addr, *lba), ResponseType::R1),
                data: Some(MmcData::write(512, blocks, &mut sg)),
                stop: Some(MmcCommand::new(12, 0, ResponseType::R1b)),
            });
            completion_result(&done)
        }
        Op::Packed(entries) => {
            let header = packed::Header {
                direction: packed::Direction::Write,
                entries: entries
                    .iter()
                    .map(|e| {
                        packed::Entry::new(e.count as u16, address(sector_addr, e.lba), e.reliable)
                    })
                    .collect(),
            };
            let mut data = header.encode().to_vec();
            data.extend(tagged(
                entries
                    .iter()
                    .enumerate()
                    .map(|(i, e)| (id * VERSIONS_PER_OP + i as u64, e.lba, e.count)),
            ));
            let blocks = (data.len() / 512) as u32;
            let mut sg = [&data[..]];
            let done = host.start_request(MmcRequest {
                sbc: Some(MmcCommand::new(
                    23,
                    MMC_CMD23_ARG_PACKED | blocks,
                    ResponseType::R1,
                )),
                cmd: MmcCommand::new(25, address(sector_addr, entries[0].lba), ResponseType::R1),
                data: Some(MmcData::write(512, blocks, &mut sg)),
                stop: Some(MmcCommand::new(12, 0, ResponseType::R1b)),
            });
            completion_result(&done)
        }
        Op::Flush | Op::CacheCtrl(_) => {
            let (index, value) = match op {
                Op::Flush => (ext::FLUSH_CACHE, 1u8),
                Op::CacheCtrl(on) => (ext::CACHE_CTRL, u8::from(*on)),
                _ => unreachable!("matched above"),
            };
            let arg = 0x0300_0000 | (index as u32) << 16 | u32::from(value) << 8;
            let done = host.start_request(MmcRequest::command(MmcCommand::new(
                6,
                arg,
                ResponseType::R1b,
            )));
            completion_result(&done)
        }
    }
}

/// HPI during programming, as Linux's `mmc_interrupt_hpi`: CMD13 first (no HPI outside
/// prg), then CMD12 or CMD13 with the HPI bit, wait for busy, check the status, and read
/// CORRECTLY_PRG_SECTORS_NUM. `None` when the card had finished programming already (the
/// write is then complete and acknowledged by the status that follows).
fn interrupt_write(host: &mut MmcHost, hpi_cmd12: bool) -> Result<Option<u64>, MmcError> {
    let status = host.mmc_send_status()?;
    if emmc_host::mmc::r1_state(status) != emmc_card::CardState::Prg.number() {
        host.mmc_wait_busy();
        return Ok(None);
    }
    let arg = u32::from(emmc_host::mmc::MMC_RCA) << 16 | 1;
    let cmd = if hpi_cmd12 {
        MmcCommand::new(12, arg, ResponseType::R1b)
    } else {
        MmcCommand::new(13, arg, ResponseType::R1)
    };
    let done = host.start_request(MmcRequest::command(cmd));
    // Programming may end between the CMD13 and the HPI: then CMD13-HPI is a plain
    // status (not prg) and CMD12-HPI is illegal (no response), and
    // CORRECTLY_PRG_SECTORS_NUM still describes an older interrupt.
    let prg = emmc_card::CardState::Prg.number();
    let interrupted = if hpi_cmd12 {
        done.cmd.issued && done.cmd.error.is_none()
    } else {
        completion_result(&done)?;
        emmc_host::mmc::r1_state(done.cmd.resp[0]) == prg
    };
    if !interrupted {
        // Reads (and clears) an ILLEGAL_COMMAND the stray CMD12 left.
        host.mmc_wait_busy();
        let _ = host.mmc_send_status();
        return Ok(None);
    }
    finish_op(host)?;
    let e = host.mmc_get_ext_csd()?;
    Ok(Some(u64::from(ext::read_le(
        &e,
        ext::CORRECTLY_PRG_SECTORS_NUM,
        4,
    ))))
}

/// Wait for the busy to end and check the status, as `card_busy_detect` does: the
/// operation is acknowledged when this returns `Ok`.
fn finish_op(host: &mut MmcHost) -> Result<(), MmcError> {
    host.mmc_wait_busy();
    let status = host.mmc_send_status()?;
    if status & r1::ERRORS != 0 {
        return Err(MmcError::Status { cmd: 13, status });
    }
    Ok(())
}

/// Files of a temporary image, removed when dropped.
struct TempImage {
    path: PathBuf,
    sidecar: Option<PathBuf>,
    remove: bool,
}

impl Drop for TempImage {
    fn drop(&mut self) {
        if self.remove {
            let _ = std::fs::remove_file(&self.path);
            if let Some(s) = &self.sidecar {
                let _ = std::fs::remove_file(s);
            }
        }
    }
}

/// A wrapper applied to every store the run opens (tests use it to break the store).
pub type StoreWrap<'a> = &'a mut dyn FnMut(Box<dyn Store + Send>) -> Box<dyn Store + Send>;

/// Run the power-cut workload on `model`.
pub fn run(config: &PowerCutConfig, model: &DeviceModel) -> Result<PowerCutReport, PowerCutError> {
    run_wrapped(config, model, &mut |s| s)
}

/// [`run`] with every store passed through `wrap` first.
pub fn run_wrapped(
    config: &PowerCutConfig,
    model: &DeviceModel,
    wrap: StoreWrap<'_>,
) -> Result<PowerCutReport, PowerCutError> {
    let wall = Instant::now();
    let layout = Card::layout_for(model);
    let user_sectors = layout.user_bytes / 512;
    if user_sectors < WINDOW_BASE + WINDOW_SPAN + GUARD {
        return Err(PowerCutError::Config(format!(
            "model {}: user area too small for the power-cut window",
            model.name
        )));
    }
    let caps = Caps {
        has_cache: model.ext_csd.cache_size > 0,
        enhanced: model.ext_csd.wr_rel_param & ext::EN_REL_WR != 0,
        rel_wr_sec_c: u64::from(model.ext_csd.rel_wr_sec_c.max(1)),
        packed: model.ext_csd.max_packed_writes >= 2,
    };
    let sector_addr = model.sector_addressing();
    let stray: StrayWrites = Arc::default();
    let unsynced: Option<Unsynced> = config.lose_unsynced.then(Arc::default);
    let lo = layout.user_offset() + WINDOW_BASE * 512;
    let hi = lo + WINDOW_SPAN * 512;
    let mut open_store = |store: Box<dyn Store + Send>| -> Box<dyn Store + Send> {
        Box::new(WatchedStore {
            inner: wrap(store),
            lo,
            hi,
            stray: stray.clone(),
            unsynced: unsynced.clone(),
        })
    };

    let mut temp = None;
    let image_path = match config.store {
        CutStore::Mem => None,
        CutStore::Image => Some(match &config.image {
            Some(p) => p.clone(),
            None => std::env::temp_dir().join(format!(
                "vhost-user-emmc-power-cut-{}-{}.img",
                std::process::id(),
                config.seed
            )),
        }),
    };
    let store: Box<dyn Store + Send> = match &image_path {
        None => Box::new(MemStore::new(layout)),
        Some(path) => {
            let created = ImageStore::create(path, layout, &model.name)?;
            temp = Some(TempImage {
                path: path.clone(),
                sidecar: Some(created.sidecar_path().to_path_buf()),
                remove: config.image.is_none(),
            });
            Box::new(created)
        }
    };
    let card = Card::new(model.clone(), open_store(store))?;
    let sdhci = SdhciConfig::for_model(&model.host);
    let host_caps = HostCaps {
        cache: true,
        ..HostCaps::for_model(&model.host)
    };
    let mut host = MmcHost::with_config(card, sdhci.clone());
    let ext_csd = host
        .mmc_init_card(&host_caps)
        .map_err(|error| PowerCutError::BringUp { cut: 0, error })?;
    let mut cache_on = ext_csd[ext::CACHE_CTRL] & ext::CACHE_EN != 0;
    let hpi_enabled = ext_csd[ext::HPI_MGMT] & 1 != 0;
    let hpi_cmd12 = ext_csd[ext::HPI_FEATURES] & ext::HPI_IMPLEMENTATION_CMD12 != 0;

    let mut rng = Prng::new(config.seed);
    let mut expect = Expectation::new(WINDOW_BASE - GUARD, WINDOW_SPAN + 2 * GUARD);
    let guard = (WINDOW_BASE, WINDOW_BASE + WINDOW_SPAN);
    let mut findings = Findings::default();
    let mut report = PowerCutReport {
        model: model.name.clone(),
        seed: config.seed,
        store: config.store,
        reopen_every: config.reopen_every,
        lose_unsynced: config.lose_unsynced,
        reliable_mode: if caps.enhanced { "enhanced" } else { "legacy" },
        cuts: 0,
        cuts_while_busy: 0,
        cuts_in_reliable_write: 0,
        reopens: 0,
        operations: 0,
        ops: OpCounts::default(),
        unexpected_errors: 0,
        first_errors: Vec::new(),
        violations: ViolationCounts::default(),
        first_violations: Vec::new(),
        sectors_checked: 0,
        check_seconds: 0.0,
        wall_seconds: 0.0,
        card_seconds: 0.0,
    };
    let mut next_id = 1u64;
    let mut window = vec![0u8; (expect.sectors() * 512) as usize];

    for cut in 1..=config.cuts {
        let complete = 1 + rng.below(config.max_ops_per_cut.max(1));
        let idle_cut = rng.below(100) < 15;
        let n = if idle_cut { complete } else { complete + 1 };
        let mut in_reliable = false;
        for k in 0..n {
            let last = !idle_cut && k + 1 == n;
            let op = gen_op(&mut rng, &caps, cache_on);
            let id = next_id;
            next_id += 1;
            report.operations += 1;
            count_op(&mut report.ops, &op);
            let started = start_op(&mut host, &op, id, sector_addr);
            if last {
                // Cut power somewhere in the operation's busy period (or right away).
                let now = host.now();
                let end = host.busy_until().unwrap_or(now);
                if end > now {
                    report.cuts_while_busy += 1;
                }
                let at = now + rng.below(end - now + 1);
                host.idle_until(at);
                if started.is_ok() {
                    in_reliable = in_flight(&mut expect, &op, id, &caps);
                }
                break;
            }
            if config.hpi_percent > 0
                && hpi_enabled
                && started.is_ok()
                && matches!(op, Op::Write { refused: false, .. })
                && rng.below(100) < config.hpi_percent
            {
                let now = host.now();
                let end = host.busy_until().unwrap_or(now);
                host.idle_until(now + rng.below(end - now + 1));
                match interrupt_write(&mut host, hpi_cmd12) {
                    Ok(Some(programmed)) => {
                        report.ops.hpi_interrupts += 1;
                        report.ops.hpi_sectors_programmed += programmed;
                        acknowledged_prefix(&mut expect, &op, id, programmed, &caps, cache_on);
                        continue;
                    }
                    // Programming had ended: the write completes as usual below.
                    Ok(None) => {}
                    Err(e) => {
                        report.unexpected_errors += 1;
                        if report.first_errors.len() < FIRST_VIOLATIONS {
                            report
                                .first_errors
                                .push(format!("cut {cut}, op {id} HPI: {e}"));
                        }
                        host.mmc_wait_busy();
                        let _ = host.mmc_send_status();
                        in_flight(&mut expect, &op, id, &caps);
                        expect.in_flight.clear();
                        continue;
                    }
                }
            }
            let result = started.and_then(|()| finish_op(&mut host));
            if result.is_err() {
                // Recovery as Linux's: wait for busy, then CMD13 reads (and clears) the
                // error bits a refused command left for the next response.
                host.mmc_wait_busy();
                let _ = host.mmc_send_status();
            }
            match (&op, result) {
                (Op::Write { refused: true, .. }, Err(_)) => report.ops.refused_as_expected += 1,
                (_, Err(e)) => {
                    report.unexpected_errors += 1;
                    if report.first_errors.len() < FIRST_VIOLATIONS {
                        report
                            .first_errors
                            .push(format!("cut {cut}, op {id} {op:?}: {e}"));
                    }
                    // Not acknowledged: no promise, but the data may have landed.
                    in_flight(&mut expect, &op, id, &caps);
                    expect.in_flight.clear();
                }
                (op, Ok(())) => {
                    if matches!(op, Op::Write { refused: true, .. }) {
                        report.unexpected_errors += 1;
                        if report.first_errors.len() < FIRST_VIOLATIONS {
                            report.first_errors.push(format!(
                                "cut {cut}, op {id}: legacy reliable write against REL_WR_SEC_C accepted"
                            ));
                        }
                    }
                    acknowledged(&mut expect, op, id, &caps, &mut cache_on);
                }
            }
        }
        if in_reliable {
            report.cuts_in_reliable_write += 1;
        }
        report.cuts += 1;
        host.mmc_power_off();
        if let Some(unsynced) = &unsynced {
            // The host loses power too: what the card never synced is gone.
            unsynced.lock().expect("not poisoned").clear();
        }
        let mut card = host.into_card();
        report.card_seconds = card.now() as f64 / 1e9;

        let reopen = matches!(config.store, CutStore::Image)
            && config.reopen_every > 0
            && cut % config.reopen_every == 0;
        if reopen {
            let now = card.now();
            drop(card);
            let path = image_path.as_ref().expect("image store");
            let store = ImageStore::open(path, layout, &model.name)?;
            card = Card::new(model.clone(), open_store(Box::new(store)))?;
            card.advance(now);
            report.reopens += 1;
        }

        let t = Instant::now();
        card.peek(Partition::User, expect.first, &mut window)?;
        expect.check(cut, &window, guard, &mut findings);
        for (offset, len) in stray.lock().expect("not poisoned").drain(..) {
            findings.push(Violation {
                kind: ViolationKind::OutsideWritten,
                cut,
                op: next_id - 1,
                lba: offset.saturating_sub(layout.user_offset()) / 512,
                detail: format!(
                    "store write of {len} bytes at image offset {offset}, outside the window"
                ),
            });
        }
        report.sectors_checked += expect.sectors();
        report.check_seconds += t.elapsed().as_secs_f64();

        if cut < config.cuts {
            if !reopen {
                // Power comes back to the same card on the same store (a fresh controller
                // model starts with bus power on, so it would not power the card up).
                let now = card.now();
                card.power_cycle(now, PowerDown::Sudden);
            }
            host = MmcHost::with_config(card, sdhci.clone());
            let ext_csd = host
                .mmc_init_card(&host_caps)
                .map_err(|error| PowerCutError::BringUp { cut, error })?;
            cache_on = ext_csd[ext::CACHE_CTRL] & ext::CACHE_EN != 0;
        } else {
            drop(card);
            break;
        }
    }
    drop(temp);
    report.violations = findings.counts;
    report.first_violations = findings.first;
    report.wall_seconds = wall.elapsed().as_secs_f64();
    Ok(report)
}

fn count_op(c: &mut OpCounts, op: &Op) {
    match op {
        Op::Write { mode, .. } => {
            c.writes += 1;
            match mode {
                WriteMode::Reliable => c.reliable_writes += 1,
                WriteMode::Forced => c.forced_writes += 1,
                WriteMode::Normal => {}
            }
        }
        Op::Packed(entries) => {
            c.packed_writes += 1;
            c.packed_reliable_entries += entries.iter().filter(|e| e.reliable).count() as u64;
        }
        Op::Flush => c.flushes += 1,
        Op::CacheCtrl(_) => c.cache_switches += 1,
    }
}

/// The spec's promise for an acknowledged operation.
fn acknowledged(expect: &mut Expectation, op: &Op, id: u64, caps: &Caps, cache_on: &mut bool) {
    let cached = caps.has_cache && *cache_on;
    match op {
        Op::Write {
            lba, count, mode, ..
        } => {
            let v = id * VERSIONS_PER_OP;
            if *mode != WriteMode::Normal || !cached {
                expect.durable_write(v, *lba, *count);
            } else {
                expect.volatile_write(v, *lba, *count);
            }
        }
        Op::Packed(entries) => {
            for (i, e) in entries.iter().enumerate() {
                let v = id * VERSIONS_PER_OP + i as u64;
                if e.reliable || !cached {
                    expect.durable_write(v, e.lba, e.count);
                } else {
                    expect.volatile_write(v, e.lba, e.count);
                }
            }
        }
        Op::Flush => expect.flushed(),
        Op::CacheCtrl(on) => {
            if !on {
                expect.flushed();
            }
            *cache_on = *on;
        }
    }
}

/// A write HPI stopped after `programmed` sectors: those are written (durable as the
/// write's mode makes them), the rest must keep their old data.
fn acknowledged_prefix(
    expect: &mut Expectation,
    op: &Op,
    id: u64,
    programmed: u64,
    caps: &Caps,
    cache_on: bool,
) {
    if let Op::Write {
        lba, count, mode, ..
    } = op
    {
        let n = programmed.min(*count);
        let v = id * VERSIONS_PER_OP;
        if *mode != WriteMode::Normal || !(caps.has_cache && cache_on) {
            expect.durable_write(v, *lba, n);
        } else {
            expect.volatile_write(v, *lba, n);
        }
    }
}

/// The spec's promise for an operation in flight at the cut. Returns whether it was a
/// reliable write.
fn in_flight(expect: &mut Expectation, op: &Op, id: u64, caps: &Caps) -> bool {
    let granule = |count: u64| if caps.enhanced { 1 } else { count };
    match op {
        Op::Write { refused: true, .. } => false,
        Op::Write {
            lba, count, mode, ..
        } => {
            let v = id * VERSIONS_PER_OP;
            if *mode == WriteMode::Reliable {
                expect.reliable_in_flight(InFlightReliable {
                    version: v,
                    lba: *lba,
                    count: *count,
                    granule: granule(*count),
                });
                true
            } else {
                expect.volatile_write(v, *lba, *count);
                false
            }
        }
        Op::Packed(entries) => {
            let mut any = false;
            for (i, e) in entries.iter().enumerate() {
                let v = id * VERSIONS_PER_OP + i as u64;
                if e.reliable {
                    any = true;
                    expect.reliable_in_flight(InFlightReliable {
                        version: v,
                        lba: e.lba,
                        count: e.count,
                        granule: granule(e.count),
                    });
                } else {
                    expect.volatile_write(v, e.lba, e.count);
                }
            }
            any
        }
        // A flush or cache switch not acknowledged promises nothing new.
        Op::Flush | Op::CacheCtrl(_) => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const FIRST: u64 = 100;

    /// The window's medium with `versions[i]` in sector `FIRST + i` (0 = zeros).
    fn medium(versions: &[u64]) -> Vec<u8> {
        let mut data = vec![0u8; versions.len() * 512];
        for (i, &v) in versions.iter().enumerate() {
            if v != NEVER_WRITTEN {
                tag_sector(v, FIRST + i as u64, &mut data[i * 512..(i + 1) * 512]);
            }
        }
        data
    }

    fn check(e: &mut Expectation, versions: &[u64]) -> Findings {
        let mut f = Findings::default();
        let n = versions.len() as u64;
        e.check(1, &medium(versions), (FIRST, FIRST + n), &mut f);
        f
    }

    #[test]
    fn tags_round_trip_and_any_flipped_byte_is_garbage() {
        let mut s = [0u8; 512];
        tag_sector(77, 5, &mut s);
        assert_eq!(
            decode_sector(&s),
            Found::Version {
                version: 77,
                lba: 5
            }
        );
        for at in [0, 9, 17, 24, 300, 511] {
            let mut t = s;
            t[at] ^= 1;
            assert_ne!(
                decode_sector(&t),
                Found::Version {
                    version: 77,
                    lba: 5
                },
                "byte {at}"
            );
        }
        assert_eq!(
            decode_sector(&[0u8; 512]),
            Found::Version {
                version: NEVER_WRITTEN,
                lba: u64::MAX
            }
        );
    }

    #[test]
    fn cached_writes_may_be_lost_durable_ones_may_not() {
        let mut e = Expectation::new(FIRST, 4);
        e.durable_write(64, FIRST, 2);
        e.volatile_write(128, FIRST + 1, 2);
        // Cached data lost everywhere, or landed: both fine.
        assert_eq!(check(&mut e, &[64, 64, 0, 0]).counts.total(), 0);
        let mut e = Expectation::new(FIRST, 4);
        e.durable_write(64, FIRST, 2);
        e.volatile_write(128, FIRST + 1, 2);
        assert_eq!(check(&mut e, &[64, 128, 128, 0]).counts.total(), 0);
        // The durable write missing.
        let mut e = Expectation::new(FIRST, 4);
        e.durable_write(64, FIRST, 2);
        let f = check(&mut e, &[64, 0, 0, 0]);
        assert_eq!(f.counts.durable_lost, 1);
        assert_eq!(f.first[0].op, 1);
        assert_eq!(f.first[0].lba, FIRST + 1);
    }

    #[test]
    fn a_flush_makes_cached_writes_durable_and_older_versions_cannot_come_back() {
        let mut e = Expectation::new(FIRST, 2);
        e.volatile_write(64, FIRST, 2);
        e.volatile_write(128, FIRST, 1);
        e.flushed();
        let f = check(&mut e, &[64, 64]);
        assert_eq!(
            f.counts.durable_lost, 1,
            "sector 0 must hold the newest version"
        );
        // A reliable write after a cached one: the cached copy must not resurface.
        let mut e = Expectation::new(FIRST, 1);
        e.volatile_write(64, FIRST, 1);
        e.durable_write(128, FIRST, 1);
        assert_eq!(check(&mut e, &[64]).counts.durable_lost, 1);
    }

    #[test]
    fn enhanced_reliable_write_in_flight_must_land_a_prefix() {
        let w = InFlightReliable {
            version: 192,
            lba: FIRST,
            count: 4,
            granule: 1,
        };
        for (medium, torn) in [
            ([0, 0, 0, 0], false),
            ([192, 192, 0, 0], false),
            ([192, 192, 192, 192], false),
            ([0, 192, 192, 0], true),
            ([192, 0, 192, 0], true),
        ] {
            let mut e = Expectation::new(FIRST, 4);
            e.reliable_in_flight(w);
            let f = check(&mut e, &medium);
            assert_eq!(f.counts.torn_reliable, u64::from(torn), "{medium:?}");
            assert_eq!(f.counts.total(), u64::from(torn), "{medium:?}");
        }
    }

    #[test]
    fn legacy_reliable_write_in_flight_is_all_or_nothing() {
        let w = InFlightReliable {
            version: 192,
            lba: FIRST,
            count: 4,
            granule: 4,
        };
        for (medium, torn) in [
            ([0, 0, 0, 0], false),
            ([192, 192, 192, 192], false),
            ([192, 192, 192, 0], true),
        ] {
            let mut e = Expectation::new(FIRST, 4);
            e.reliable_in_flight(w);
            assert_eq!(check(&mut e, &medium).counts.torn_reliable, u64::from(torn));
        }
    }

    #[test]
    fn guard_sectors_and_misplaced_data_are_outside_the_written_set() {
        let mut e = Expectation::new(FIRST, 3);
        let mut f = Findings::default();
        let mut data = medium(&[64, 0, 0]);
        // Sector 2 holds the data written for sector 1.
        tag_sector(64, FIRST + 1, &mut data[1024..1536]);
        e.volatile_write(64, FIRST + 1, 1);
        // Sector 0 is a guard sector: the window is sectors 1..3.
        e.check(1, &data, (FIRST + 1, FIRST + 3), &mut f);
        assert_eq!(f.counts.outside_written, 2, "{:?}", f.first);
        // A version never written to the sector.
        let mut e = Expectation::new(FIRST, 1);
        assert_eq!(check(&mut e, &[640]).counts.outside_written, 1);
    }

    #[test]
    fn what_was_found_is_the_baseline_of_the_next_round() {
        let mut e = Expectation::new(FIRST, 1);
        e.volatile_write(64, FIRST, 1);
        assert_eq!(check(&mut e, &[64]).counts.total(), 0);
        // 64 landed, so losing it now is losing durable data.
        assert_eq!(check(&mut e, &[0]).counts.durable_lost, 1);
    }
}
