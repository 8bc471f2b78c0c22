//! The flash translation layer: where a write goes and what it costs, following Arnd
//! Bergmann's account of eMMC/SD internals in seed 003.
//!
//! The user area is cut into **allocation units** (AUs). A card keeps a few AUs *open*
//! for writing; each open AU is being rewritten into a fresh physical AU. Opening one AU
//! too many garbage-collects another (the victim: least recently written, first opened,
//! or random): the valid data it did not receive is copied into its new physical AU and
//! its old physical AU is erased — "many milliseconds". An AU written completely is closed
//! without copying. Writes to an open AU away from its write position put it in *random*
//! use, which only some of the open AUs may be in at once; cards with linear-only AUs
//! garbage-collect the AU instead when a write goes below its write position.
//!
//! Inside an AU the card programs whole **write units** (page × planes × dies); a write
//! that covers part of a write unit is read-modify-write. Commands are handled in
//! write-unit pieces. Before a piece reaches its AU ("buffer B") it may be taken by:
//!
//! * a **sub-page coalescing buffer** (SanDisk): a write inside one page waits in RAM;
//!   a non-contiguous write flushes it, contiguous writes fill the page first;
//! * **buffer A** (Toshiba): a piece inside one page, of an AU that is not open, goes to
//!   a page-mapped small-write log (read-modify-write of the page); a piece touching two
//!   pages goes to buffer B. Variants join consecutive writes into runs first (Toshiba's
//!   own account), which a reliable write breaks. When the log is full its oldest page
//!   is merged; when one AU has too many pages in it, that AU is merged whole;
//! * an **SLC cache** (SanDisk): random writes are programmed in SLC mode without
//!   opening their AU, and folded into it when it is garbage-collected, by background
//!   operations, or when the cache is full.
//!
//! Each AU remembers where its last write ended, across evictions: a write continuing
//! there, continuing the previous command, or starting the AU is sequential; any other
//! is random.
//!
//! The small-write log and the SLC data are the card's *background debt*: BKOPS works it
//! off; when it is critical, writes work it off in the foreground first.
//!
//! State is kept per touched AU only (a dense 4-byte index per AU, then a slab of touched
//! AUs with one bit per write unit), so a 32 GiB card needs a few hundred KiB.

use std::collections::{HashMap, VecDeque};

use super::nand::{Nand, PageKind};
use super::prng::Prng;
use super::Nanos;
use crate::model::{BufferARule, Eviction, FtlModel, GcCopy, NandModel, RandomWrites};

const SECTOR: u64 = 512;
const NONE: u32 = u32::MAX;
const NO_SLOT: u8 = u8::MAX;

/// What the FTL has done since power-on.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct FtlCounters {
    /// Write pieces programmed into the small-write log (buffer A).
    pub buffer_a_writes: u64,
    /// Write units programmed straight into their AU (buffer B).
    pub buffer_b_writes: u64,
    /// Of those, read-modify-write of a partly written write unit.
    pub read_modify_writes: u64,
    /// Write pieces programmed into the SLC cache.
    pub slc_writes: u64,
    /// Sub-page writes held in the coalescing buffer.
    pub coalesced_writes: u64,
    /// Of those, programmed into the temporary page (`[timing.ftl.sub_page_buffer]`).
    pub temp_page_programs: u64,
    pub au_opens: u64,
    /// Open AUs closed because another had to be opened.
    pub au_evictions: u64,
    /// Closes that copied data (garbage collection, SLC fold).
    pub gc_runs: u64,
    pub gc_copied_units: u64,
    /// Time those closes, folds and log merges took: copying valid data and erasing the
    /// old physical AU (foreground or in BKOPS).
    pub gc_ns: u64,
    /// Closes of AUs written completely (nothing to copy).
    pub au_completions: u64,
    /// Small-write log pages merged into their AU.
    pub log_merges: u64,
    /// Background work done by BKOPS.
    pub background_ns: u64,
    /// Background work done in the foreground because it had become critical.
    pub foreground_ns: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    Free,
    Linear,
    Random,
}

#[derive(Debug, Clone, Copy)]
struct AuState {
    /// Physical AU holding the AU's data, or NONE if it never had any.
    phys: u32,
    slot: u8,
    /// Sector offset in the AU just after its last write: where a linear stream would
    /// continue. Kept when the AU is closed, so a stream resumes after an eviction.
    ptr: u64,
    /// Pages of this AU's data in the SLC cache (0: none; the AU needs no fold).
    slc_pages: u64,
    /// Pages of this AU in the small-write log.
    log_pages: u64,
    /// Log pages this AU's small writes have taken since its log pages were last
    /// merged, superseded ones included: the log is written in order, so a small write
    /// rewriting a page already in the log takes a new log page all the same.
    log_writes: u64,
    /// This AU's share of the fold debt: what folding its cached data would cost now.
    fold_ns: Nanos,
}

#[derive(Debug, Clone, Copy)]
struct Slot {
    au: u32,
    mode: Mode,
    last_use: u64,
    opened: u64,
    new_phys: u32,
}

const FREE_SLOT: Slot = Slot {
    au: NONE,
    mode: Mode::Free,
    last_use: 0,
    opened: 0,
    new_phys: NONE,
};

/// The SLC cache: which AUs have data in it, oldest first.
#[derive(Debug)]
struct SlcCache {
    /// Random writes up to this many sectors go to the cache.
    max_write: u64,
    capacity_pages: u64,
    pages: u64,
    /// AUs in the order they first got cached data (entries of folded AUs are skipped).
    aus: VecDeque<u32>,
    count: u64,
    /// AUs the cache can hold data of at once (u64::MAX: as many as fit).
    max_aus: u64,
}

/// Geometry in 512-byte sectors.
#[derive(Debug, Clone, Copy)]
struct Geometry {
    page: u64,
    wu: u64,
    au: u64,
    au_wus: u64,
    /// Pages per write unit.
    wu_pages: u64,
    /// u64 words of one per-AU bitmap (one bit per write unit).
    words: usize,
}

/// Buffer A parameters in sectors.
#[derive(Debug, Clone, Copy)]
struct BufferA {
    rule: BufferARule,
    run_limit: u64,
    reliable_breaks_run: bool,
    index_page: bool,
    /// An AU with more pages than this in the log is merged as a whole.
    pages_per_au: u64,
}

/// The page-mapped small-write log: which pages it holds, oldest first.
#[derive(Debug, Default)]
struct SmallLog {
    capacity: usize,
    map: HashMap<u64, u64>,
    fifo: VecDeque<(u64, u64)>,
    seq: u64,
}

impl SmallLog {
    fn new(capacity: usize) -> SmallLog {
        SmallLog {
            capacity,
            map: HashMap::with_capacity(capacity + 1),
            fifo: VecDeque::with_capacity(2 * capacity + 32),
            seq: 0,
        }
    }

    fn len(&self) -> usize {
        self.map.len()
    }

    /// Record `page`; returns true if it was not in the log already.
    fn insert(&mut self, page: u64) -> bool {
        self.seq += 1;
        let new = self.map.insert(page, self.seq).is_none();
        self.fifo.push_back((page, self.seq));
        if self.fifo.len() > 2 * self.capacity + 16 {
            let map = &self.map;
            self.fifo.retain(|(p, s)| map.get(p) == Some(s));
        }
        new
    }

    fn remove(&mut self, page: u64) -> bool {
        self.map.remove(&page).is_some()
    }

    fn contains(&self, page: u64) -> bool {
        self.map.contains_key(&page)
    }

    fn oldest(&mut self) -> Option<u64> {
        while let Some(&(p, s)) = self.fifo.front() {
            if self.map.get(&p) == Some(&s) {
                return Some(p);
            }
            self.fifo.pop_front();
        }
        None
    }
}

/// A sub-page write waiting in the coalescing buffer: sectors `[lo, hi)` of one page.
#[derive(Debug, Clone, Copy)]
struct Pending {
    lo: u64,
    hi: u64,
}

/// Where `au_write` puts a piece.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum SlcPath {
    /// Random pieces small enough into the SLC cache (if any), the rest into their AU.
    Auto,
    /// Into the SLC cache, programmed there.
    Program,
    /// Into the SLC cache, already in SLC-mode flash (a closed temporary page).
    Admit,
}

/// `[timing.ftl.sub_page_buffer]`.
#[derive(Debug, Clone, Copy)]
struct TempPage {
    program_ns: Nanos,
    program_ns_per_kib: Nanos,
    close_ns: Nanos,
}

/// How the pieces of one command are classified, per AU.
#[derive(Debug, Clone, Copy)]
struct CmdState {
    au: u64,
    random: bool,
    direct_sequential: bool,
    len: u64,
}

#[derive(Debug)]
pub struct Ftl {
    g: Geometry,
    total: u64,
    /// AUs open at once (in any use), and how many of them may be in random use.
    open_linear: usize,
    open_random: usize,
    eviction: Eviction,
    linear_only: bool,
    copyback: bool,
    sequential_write_ns: Nanos,
    reliable_write_ns: Nanos,
    coalesce: bool,
    /// What the coalescing buffer costs when it is a temporary SLC page.
    temp_page: Option<TempPage>,
    buffer_a: Option<BufferA>,
    slc: Option<SlcCache>,
    special: Option<(u64, u64)>,

    au_index: Vec<u32>,
    states: Vec<AuState>,
    /// Per touched AU: write units holding data.
    valid: Vec<u64>,
    /// Per touched AU with an SLC cache: pages whose newest copy is in the cache
    /// (`cached_words` words each).
    cached: Vec<u64>,
    cached_words: usize,
    slots: Vec<Slot>,
    /// Per slot: write units programmed into the new physical AU this session.
    direct: Vec<u64>,
    phys_free: VecDeque<u32>,
    phys_erases: Vec<u32>,

    log: Option<SmallLog>,
    log_row: u64,
    pending: Option<Pending>,
    /// Buffer A's current run of consecutive writes, and whether its tail is in buffer A.
    run: (u64, u64),
    run_in_a: bool,
    /// End of the previous host write (a write starting here continues a stream).
    last_end: u64,
    tick: u64,
    rng: Prng,

    copy_unit_estimate: Nanos,
    /// Erasing an AU's old physical copy after it was rewritten.
    erase_au_estimate: Nanos,
    /// Sum of the cached AUs' `fold_ns`.
    fold_debt: Nanos,
    debt: Nanos,
    carry: Nanos,
    pub counters: FtlCounters,
}

fn bit(words: &[u64], i: u64) -> bool {
    words[(i / 64) as usize] & (1 << (i % 64)) != 0
}

fn set_bit(words: &mut [u64], i: u64, on: bool) {
    let w = &mut words[(i / 64) as usize];
    if on {
        *w |= 1 << (i % 64);
    } else {
        *w &= !(1 << (i % 64));
    }
}

impl Ftl {
    /// An FTL over `total_sectors` of user area.
    pub fn new(m: &FtlModel, nand: &NandModel, total_sectors: u64, seed: u64) -> Ftl {
        let page = (nand.page_bytes / SECTOR).max(1);
        let wu_pages = nand.planes.max(1) * nand.dies.max(1);
        let wu = page * wu_pages;
        let au = (m.allocation_unit_bytes / SECTOR).max(wu);
        let au_wus = au / wu;
        let words = au_wus.div_ceil(64) as usize;
        let g = Geometry {
            page,
            wu,
            au,
            au_wus,
            wu_pages,
            words,
        };
        let n_aus = total_sectors.div_ceil(au);
        let open_linear = m.open_aus_linear.clamp(1, 127) as usize;
        let open_random = (m.open_aus_random as usize).min(open_linear);
        let slots = open_linear;
        let n_phys = n_aus + m.spare_aus.max(slots as u64 + 2);
        let est = Nand::new(nand, 0);
        let copy_unit_estimate = est.copy_write_unit_estimate(m.gc_copy == GcCopy::Copyback);
        let erase_au_estimate = est.erase_estimate(au * SECTOR);
        let touched_hint = (n_aus as usize).min(1024);
        Ftl {
            g,
            total: total_sectors,
            open_linear,
            open_random,
            eviction: m.eviction,
            linear_only: m.random_writes == RandomWrites::None,
            copyback: m.gc_copy == GcCopy::Copyback,
            sequential_write_ns: m.sequential_write_ns,
            reliable_write_ns: m.reliable_write_ns,
            coalesce: m.coalesce_sub_page,
            temp_page: m.sub_page_buffer.as_ref().map(|b| TempPage {
                program_ns: b.program_ns,
                program_ns_per_kib: b.program_ns_per_kib,
                close_ns: b.close_ns,
            }),
            buffer_a: m.buffer_a.as_ref().map(|a| BufferA {
                rule: a.rule,
                run_limit: (a.run_limit_bytes / SECTOR).max(1),
                reliable_breaks_run: a.reliable_breaks_run,
                index_page: a.index_page,
                pages_per_au: if a.pages_per_au == 0 {
                    u64::MAX
                } else {
                    a.pages_per_au
                },
            }),
            slc: m.slc_cache.as_ref().map(|c| SlcCache {
                max_write: c.max_write_bytes / SECTOR,
                capacity_pages: (c.capacity_bytes / nand.page_bytes.max(512)).max(1),
                pages: 0,
                aus: VecDeque::with_capacity(64),
                count: 0,
                max_aus: if c.max_aus == 0 { u64::MAX } else { c.max_aus },
            }),
            special: m.special_region.as_ref().map(|r| {
                let start = r.offset_bytes / SECTOR;
                (start, start + r.length_bytes / SECTOR)
            }),
            au_index: vec![NONE; n_aus as usize],
            states: Vec::with_capacity(touched_hint),
            valid: Vec::with_capacity(touched_hint * words),
            cached: Vec::new(),
            cached_words: if m.slc_cache.is_some() {
                (au / page).div_ceil(64) as usize
            } else {
                0
            },
            slots: vec![FREE_SLOT; slots],
            direct: vec![0; slots * words],
            phys_free: (0..n_phys as u32).collect(),
            phys_erases: vec![0; n_phys as usize],
            log: m
                .buffer_a
                .as_ref()
                .map(|a| SmallLog::new(a.log_pages.max(1) as usize)),
            log_row: 0,
            pending: None,
            run: (u64::MAX, u64::MAX),
            run_in_a: false,
            last_end: u64::MAX,
            tick: 0,
            rng: Prng::new(seed ^ 0x4654_4C00),
            copy_unit_estimate,
            erase_au_estimate,
            fold_debt: 0,
            debt: 0,
            carry: 0,
            counters: FtlCounters::default(),
        }
    }

    pub fn total_sectors(&self) -> u64 {
        self.total
    }

    pub fn allocation_unit_sectors(&self) -> u64 {
        self.g.au
    }

    pub fn write_unit_sectors(&self) -> u64 {
        self.g.wu
    }

    /// Outstanding background work (small-write log merges and SLC folds), card time.
    pub fn debt_ns(&self) -> Nanos {
        self.debt
    }

    /// Number of AUs open now.
    pub fn open_aus(&self) -> usize {
        self.slots.iter().filter(|s| s.mode != Mode::Free).count()
    }

    /// Erase count of the most and of the least erased physical AU, and the mean. Every
    /// erase block of a physical AU is erased with it, so these are per-block P/E cycles.
    pub fn pe_cycles(&self) -> (u32, u32, f64) {
        let max = self.phys_erases.iter().copied().max().unwrap_or(0);
        let min = self.phys_erases.iter().copied().min().unwrap_or(0);
        let sum: u64 = self.phys_erases.iter().map(|&n| u64::from(n)).sum();
        let mean = sum as f64 / self.phys_erases.len().max(1) as f64;
        (max, min, mean)
    }

    /// Heap bytes the FTL's state occupies (for the memory bound of large cards).
    pub fn memory_bytes(&self) -> usize {
        use std::mem::size_of;
        self.au_index.capacity() * size_of::<u32>()
            + self.states.capacity() * size_of::<AuState>()
            + (self.valid.capacity() + self.direct.capacity() + self.cached.capacity())
                * size_of::<u64>()
            + self.slots.capacity() * size_of::<Slot>()
            + self.phys_free.capacity() * size_of::<u32>()
            + self.phys_erases.capacity() * size_of::<u32>()
            + self.log.as_ref().map_or(0, |l| {
                l.map.capacity() * (2 * size_of::<u64>() + 8) + l.fifo.capacity() * 16
            })
            + self
                .slc
                .as_ref()
                .map_or(0, |c| c.aus.capacity() * size_of::<u32>())
    }

    /// AUs that hold data in the SLC cache.
    pub fn slc_aus(&self) -> u64 {
        self.slc.as_ref().map_or(0, |c| c.count)
    }

    /// Pages in the small-write log.
    pub fn log_pages(&self) -> usize {
        self.log.as_ref().map_or(0, SmallLog::len)
    }

    // ---- state helpers -------------------------------------------------------------------

    fn state_index(&mut self, au: u64) -> usize {
        let i = self.au_index[au as usize];
        if i != NONE {
            return i as usize;
        }
        let idx = self.states.len();
        self.states.push(AuState {
            phys: NONE,
            slot: NO_SLOT,
            ptr: 0,
            slc_pages: 0,
            log_pages: 0,
            log_writes: 0,
            fold_ns: 0,
        });
        self.valid.extend(std::iter::repeat_n(0, self.g.words));
        self.cached
            .extend(std::iter::repeat_n(0, self.cached_words));
        self.au_index[au as usize] = idx as u32;
        idx
    }

    fn valid_words(&self, idx: usize) -> &[u64] {
        &self.valid[idx * self.g.words..(idx + 1) * self.g.words]
    }

    fn valid_words_mut(&mut self, idx: usize) -> &mut [u64] {
        let w = self.g.words;
        &mut self.valid[idx * w..(idx + 1) * w]
    }

    fn slot_words(v: &[u64], slot: usize, words: usize) -> &[u64] {
        &v[slot * words..(slot + 1) * words]
    }

    /// Does the write unit holding `sector` hold data?
    fn has_data(&self, sector: u64) -> bool {
        let au = sector / self.g.au;
        match self.au_index.get(au as usize) {
            Some(&i) if i != NONE => bit(
                self.valid_words(i as usize),
                (sector % self.g.au) / self.g.wu,
            ),
            _ => false,
        }
    }

    fn mark_valid(&mut self, sector: u64) {
        let au = sector / self.g.au;
        let idx = self.state_index(au);
        let w = (sector % self.g.au) / self.g.wu;
        set_bit(self.valid_words_mut(idx), w, true);
        self.reprice(idx);
    }

    /// What folding this AU's cached data would cost now: copying the valid write units
    /// its new physical AU does not hold yet, and erasing its old physical AU if it has
    /// one. An AU that held little data folds quickly (a fresh card's random writes).
    fn fold_estimate(&self, idx: usize) -> Nanos {
        let st = &self.states[idx];
        if st.slc_pages == 0 {
            return 0;
        }
        let valid = self.valid_words(idx);
        let units: u64 = if st.slot == NO_SLOT {
            valid.iter().map(|v| u64::from(v.count_ones())).sum()
        } else {
            let placed = Self::slot_words(&self.direct, st.slot as usize, self.g.words);
            valid
                .iter()
                .zip(placed)
                .map(|(v, p)| u64::from((v & !p).count_ones()))
                .sum()
        };
        let erase = if st.phys == NONE {
            0
        } else {
            self.erase_au_estimate
        };
        units * self.copy_unit_estimate + erase
    }

    /// Bring this AU's share of the fold debt up to date after its data changed.
    fn reprice(&mut self, idx: usize) {
        let new = self.fold_estimate(idx);
        let old = std::mem::replace(&mut self.states[idx].fold_ns, new);
        self.fold_debt = self.fold_debt - old + new;
    }

    fn is_open(&self, au: u64) -> bool {
        match self.au_index.get(au as usize) {
            Some(&i) if i != NONE => self.states[i as usize].slot != NO_SLOT,
            _ => false,
        }
    }

    /// Are the first `n` bits of `words` all set?
    fn all_set(words: &[u64], n: u64) -> bool {
        let full = (n / 64) as usize;
        words[..full].iter().all(|&w| w == u64::MAX)
            && (n % 64 == 0 || words[full] & ((1u64 << (n % 64)) - 1) == (1u64 << (n % 64)) - 1)
    }

    fn count_mode(&self, mode: Mode) -> usize {
        self.slots.iter().filter(|s| s.mode == mode).count()
    }

    /// The open AU to close: among those in `mode`, or among all open ones.
    fn victim(&mut self, mode: Option<Mode>) -> usize {
        let fits = |s: &Slot| s.mode != Mode::Free && mode.is_none_or(|m| s.mode == m);
        let pick = match self.eviction {
            Eviction::Lru => self
                .slots
                .iter()
                .enumerate()
                .filter(|(_, s)| fits(s))
                .min_by_key(|(_, s)| s.last_use)
                .map(|(i, _)| i),
            Eviction::Fifo => self
                .slots
                .iter()
                .enumerate()
                .filter(|(_, s)| fits(s))
                .min_by_key(|(_, s)| s.opened)
                .map(|(i, _)| i),
            Eviction::Random => {
                let n = self.slots.iter().filter(|s| fits(s)).count() as u64;
                let k = self.rng.below(n.max(1));
                self.slots
                    .iter()
                    .enumerate()
                    .filter(|(_, s)| fits(s))
                    .nth(k as usize)
                    .map(|(i, _)| i)
            }
        };
        pick.expect("a full pool has a victim")
    }

    // ---- the write path ------------------------------------------------------------------

    /// Program `count` sectors at user-area sector `start`; returns the card time.
    pub fn write(&mut self, nand: &mut Nand, start: u64, count: u64, reliable: bool) -> Nanos {
        if count == 0 {
            return 0;
        }
        let end = (start + count).min(self.total);
        let mut t = 0;
        if let Some((rs, re)) = self.special {
            if start >= rs && end <= re {
                t += self.flush_pending(nand);
                t += self.page_mapped_write(nand, start, end);
                self.finish_command(&mut t, reliable, false);
                self.run = (start, end);
                self.run_in_a = false;
                self.last_end = end;
                return t;
            }
        }
        let mut cmd = CmdState {
            au: u64::MAX,
            random: false,
            direct_sequential: false,
            len: count,
        };
        let mut s = start;
        while s < end {
            let e = end.min((s / self.g.wu + 1) * self.g.wu);
            t += self.write_piece(nand, s, e, reliable, &mut cmd);
            s = e;
        }
        self.finish_command(&mut t, reliable, cmd.direct_sequential);
        self.last_end = end;
        t
    }

    fn finish_command(&mut self, t: &mut Nanos, reliable: bool, direct_sequential: bool) {
        if direct_sequential {
            *t += self.sequential_write_ns;
        }
        if reliable {
            *t += self.reliable_write_ns;
        }
        self.refresh_debt();
    }

    fn write_piece(
        &mut self,
        nand: &mut Nand,
        mut s: u64,
        e: u64,
        reliable: bool,
        cmd: &mut CmdState,
    ) -> Nanos {
        let mut t = 0;
        let ps = self.g.page;
        let page = s / ps;
        let sub_page = page == (e - 1) / ps && e - s < ps;

        if self.coalesce {
            if let Some(p) = self.pending {
                if s == p.hi && (p.lo / ps == page) {
                    if sub_page {
                        // Contiguous within the same page: keep filling.
                        self.counters.coalesced_writes += 1;
                        if e % ps == 0 && p.lo % ps == 0 {
                            // The page is full: program it as one page.
                            self.pending = None;
                            return self.program_small(nand, p.lo, e);
                        }
                        self.pending = Some(Pending { lo: p.lo, hi: e });
                        return self.temp_page_program(nand, s, e);
                    }
                    // Contiguous but running past the page: it joins this write.
                    self.pending = None;
                    s = p.lo;
                } else {
                    t += self.flush_pending(nand);
                }
            }
            let page = s / ps;
            if page == (e - 1) / ps && e - s < ps {
                self.counters.coalesced_writes += 1;
                self.pending = Some(Pending { lo: s, hi: e });
                return t + self.temp_page_program(nand, s, e);
            }
        }

        if let Some(a) = self.buffer_a {
            // Runs join consecutive writes for the run rules; the card classifies each
            // write unit on its own, so a run never crosses one.
            let joins = a.rule != BufferARule::PageSpan
                && s == self.run.1
                && s % self.g.wu != 0
                && !(reliable && a.reliable_breaks_run);
            let run_start = if joins { self.run.0 } else { s };
            self.run = (run_start, e);
            let small = match a.rule {
                BufferARule::PageSpan => page == (e - 1) / ps,
                BufferARule::ConsecutiveRun => run_start / ps == (e - 1) / ps,
                BufferARule::RunLength => page == (e - 1) / ps && e - run_start <= a.run_limit,
            };
            // An AU that is open takes its own small writes (its buffer B holds its data).
            let in_a = small && !self.is_open(s / self.g.au);
            if in_a {
                self.run_in_a = true;
                return t + self.small_write(nand, s, e, a.index_page);
            }
            if joins && self.run_in_a {
                // The run leaves buffer A: its part in this write unit goes to buffer B
                // with this write, superseding the log's copies.
                let wu_start = s / self.g.wu * self.g.wu;
                let from = run_start.max(wu_start);
                if from < s {
                    for p in from / ps..s.div_ceil(ps) {
                        self.log_remove(p);
                    }
                    s = from;
                }
            }
            self.run_in_a = false;
        }

        t + self.au_write(nand, s, e, cmd, SlcPath::Auto)
    }

    /// Program the coalescing buffer's page, if any. A temporary page already holds its
    /// sectors in flash: closing it makes them a page of the SLC cache, with no program.
    pub fn flush_pending(&mut self, nand: &mut Nand) -> Nanos {
        let Some(p) = self.pending.take() else {
            return 0;
        };
        let t = match self.temp_page {
            Some(tp) => {
                let mut cmd = CmdState {
                    au: u64::MAX,
                    random: true,
                    direct_sequential: false,
                    len: p.hi - p.lo,
                };
                tp.close_ns + self.au_write(nand, p.lo, p.hi, &mut cmd, SlcPath::Admit)
            }
            None => self.program_small(nand, p.lo, p.hi),
        };
        self.refresh_debt();
        t
    }

    /// A sub-page write entering the coalescing buffer: with a temporary page, it is
    /// programmed there before the write completes (the card has no volatile cache) — a
    /// partial-page program of its sectors, never dearer than programming a whole SLC
    /// page. Without one, the buffer is RAM and costs nothing.
    fn temp_page_program(&mut self, nand: &mut Nand, s: u64, e: u64) -> Nanos {
        let Some(tp) = self.temp_page else {
            return 0;
        };
        self.counters.temp_page_programs += 1;
        let bytes = (e - s) * SECTOR;
        let per_kib = u128::from(bytes) * u128::from(tp.program_ns_per_kib) / 1024;
        let t_prog = tp
            .program_ns
            .saturating_add(Nanos::try_from(per_kib).unwrap_or(Nanos::MAX));
        nand.program_partial_slc(bytes, t_prog)
    }

    /// A sub-page piece leaving the coalescing buffer: into the SLC cache if there is one,
    /// else into its AU.
    fn program_small(&mut self, nand: &mut Nand, lo: u64, hi: u64) -> Nanos {
        let mut cmd = CmdState {
            au: u64::MAX,
            random: true,
            direct_sequential: false,
            len: hi - lo,
        };
        let path = if self.slc.is_some() {
            SlcPath::Program
        } else {
            SlcPath::Auto
        };
        self.au_write(nand, lo, hi, &mut cmd, path)
    }

    /// Buffer A: read-modify-write of the page into the small-write log.
    fn small_write(&mut self, nand: &mut Nand, s: u64, e: u64, index_page: bool) -> Nanos {
        let ps = self.g.page;
        let page = s / ps;
        let full = s == page * ps && e == (page + 1) * ps;
        let mut t = 0;
        if !full && self.has_data(s) {
            t += nand.read_pages(1, page % 2);
        }
        t += nand.program_pages(1, PageKind::Mlc { row: self.log_row });
        self.log_row += 1;
        if index_page {
            t += nand.program_pages(1, PageKind::Mlc { row: self.log_row });
            self.log_row += 1;
        }
        self.mark_valid(s);
        self.counters.buffer_a_writes += 1;
        let idx = self.state_index(s / self.g.au);
        self.states[idx].log_writes += 1;
        let log = self.log.as_mut().expect("buffer A has a log");
        let new_page = log.insert(page);
        let full = log.len() > log.capacity;
        if new_page {
            self.states[idx].log_pages += 1;
        }
        if self.states[idx].log_writes > self.buffer_a.map_or(u64::MAX, |a| a.pages_per_au) {
            // This AU's small writes have taken too much of the log: merge the AU as a
            // whole. Counted in writes, not in distinct pages: seed 003's linear small
            // writes cost the same ~4.9 ms whatever their size (512 B to 8 KiB), so the
            // merges come as often per write for sixteen 512 B writes into one page as
            // for 8 KiB writes into sixteen.
            t += self.merge_au(nand, (s / self.g.au) as u32);
        } else if full {
            t += self.merge_oldest_log_page(nand);
        }
        t
    }

    /// Drop `page` from the small-write log (its data was superseded or merged).
    fn log_remove(&mut self, page: u64) {
        let Some(log) = self.log.as_mut() else {
            return;
        };
        if log.remove(page) {
            let au = page * self.g.page / self.g.au;
            let i = self.au_index[au as usize];
            if i != NONE {
                let st = &mut self.states[i as usize];
                st.log_pages = st.log_pages.saturating_sub(1);
                if st.log_pages == 0 {
                    st.log_writes = 0;
                }
            }
        }
    }

    /// Merge the small-write log's oldest page into its AU.
    fn merge_oldest_log_page(&mut self, nand: &mut Nand) -> Nanos {
        let Some(page) = self.log.as_mut().and_then(SmallLog::oldest) else {
            return 0;
        };
        self.log_remove(page);
        self.merge_log_page(nand, page)
    }

    /// Rewrite an AU with all its small-write log pages folded in.
    fn merge_au(&mut self, nand: &mut Nand, au: u32) -> Nanos {
        let first = u64::from(au) * self.g.au / self.g.page;
        let pages = self.g.au / self.g.page;
        if self.log.as_ref().is_some_and(|l| l.len() > 0) {
            for p in first..first + pages {
                if self.log.as_ref().is_some_and(|l| l.contains(p)) {
                    self.log_remove(p);
                }
            }
        }
        self.counters.log_merges += 1;
        self.fold(nand, au)
    }

    fn merge_log_page(&mut self, nand: &mut Nand, page: u64) -> Nanos {
        self.counters.log_merges += 1;
        let row = (page * self.g.page % self.g.au) / self.g.wu;
        let t = nand.copy_write_unit(self.copyback, row);
        self.counters.gc_ns += t;
        t
    }

    /// A write in a page-mapped special region: each page read-modify-written on its own.
    fn page_mapped_write(&mut self, nand: &mut Nand, s: u64, e: u64) -> Nanos {
        let ps = self.g.page;
        let mut t = 0;
        let mut p = s / ps;
        while p * ps < e {
            let lo = (p * ps).max(s);
            let hi = ((p + 1) * ps).min(e);
            let full = lo == p * ps && hi == (p + 1) * ps;
            if !full && self.has_data(lo) {
                t += nand.read_pages(1, p % 2);
            }
            t += nand.program_pages(1, PageKind::Mlc { row: p });
            self.mark_valid(lo);
            self.counters.buffer_a_writes += 1;
            p += 1;
        }
        t
    }

    /// Buffer B: a piece of one write unit into its AU (or into the SLC cache).
    fn au_write(
        &mut self,
        nand: &mut Nand,
        s: u64,
        e: u64,
        cmd: &mut CmdState,
        path: SlcPath,
    ) -> Nanos {
        let g = self.g;
        let au = s / g.au;
        let off = s % g.au;
        let off_end = off + (e - s);
        let mut t = 0;
        let idx = self.state_index(au);
        if cmd.au != au {
            // A command continues a stream if it starts where the AU's last write ended,
            // where the previous command ended, or at the start of the AU.
            cmd.au = au;
            cmd.random = !(off == self.states[idx].ptr || s == self.last_end || off == 0);
        }
        let use_slc = match &self.slc {
            Some(c) => path != SlcPath::Auto || (cmd.random && cmd.len <= c.max_write),
            None => false,
        };
        let w = off / g.wu;
        if use_slc && path == SlcPath::Admit {
            t += self.slc_admit(nand, idx, s, e);
        } else if use_slc {
            t += self.slc_write(nand, idx, s, e);
        } else {
            let mut slot = self.states[idx].slot;
            if slot == NO_SLOT {
                let (sl, c) = self.open(nand, au, idx, off);
                slot = sl;
                t += c;
            } else if self.linear_only && off < self.states[idx].ptr {
                // Linear-only AU written below its write position: collect it, start over.
                t += self.close(nand, slot as usize);
                let (sl, c) = self.open(nand, au, idx, off);
                slot = sl;
                t += c;
            }
            let si = slot as usize;
            if cmd.random && self.slots[si].mode == Mode::Linear {
                t += self.make_random(nand, si);
            }
            let wu_lo = w * g.wu;
            let full = off == wu_lo && off_end == wu_lo + g.wu;
            if !full && bit(self.valid_words(idx), w) {
                let covered = (0..g.wu_pages)
                    .filter(|&p| {
                        let lo = wu_lo + p * g.page;
                        off <= lo && off_end >= lo + g.page
                    })
                    .count() as u64;
                t += nand.read_pages(g.wu_pages - covered, w);
                self.counters.read_modify_writes += 1;
            }
            t += nand.program_write_unit(PageKind::Mlc { row: w });
            let words = g.words;
            set_bit(&mut self.direct[si * words..(si + 1) * words], w, true);
            if !cmd.random {
                cmd.direct_sequential = true;
            }
            self.counters.buffer_b_writes += 1;
            self.tick += 1;
            self.slots[si].last_use = self.tick;
        }
        set_bit(self.valid_words_mut(idx), w, true);
        self.reprice(idx);
        if self.log.as_ref().is_some_and(|l| l.len() > 0) {
            // Pages this write covers completely supersede their small-write log copies.
            for p in s.div_ceil(g.page)..e / g.page {
                self.log_remove(p);
            }
        }
        self.states[idx].ptr = off_end;
        // Written completely and all of it in place: close without copying.
        let slot = self.states[idx].slot;
        if slot != NO_SLOT {
            let si = slot as usize;
            let d = Self::slot_words(&self.direct, si, g.words);
            if Self::all_set(d, g.au_wus) {
                t += self.close(nand, si);
            }
        }
        t
    }

    /// Program the pages of `[s, e)` in SLC mode (read-modify-write of partial pages).
    fn slc_write(&mut self, nand: &mut Nand, idx: usize, s: u64, e: u64) -> Nanos {
        let g = self.g;
        let w = (s % g.au) / g.wu;
        let first = s / g.page;
        let last = (e - 1) / g.page;
        let pages = last - first + 1;
        let partial = (first..=last)
            .filter(|&p| !(s <= p * g.page && e >= (p + 1) * g.page))
            .count() as u64;
        let mut t = 0;
        if partial > 0 && bit(self.valid_words(idx), w) {
            t += nand.read_pages(partial, w);
        }
        t += nand.program_pages(pages, PageKind::Slc);
        self.counters.slc_writes += 1;
        t + self.slc_admit(nand, idx, s, e)
    }

    /// Sectors `s..e` of AU state `idx`, now in SLC-mode flash, become cached pages: the
    /// AU's copy of their write unit is superseded, and a full cache folds its oldest AU.
    fn slc_admit(&mut self, nand: &mut Nand, idx: usize, s: u64, e: u64) -> Nanos {
        let g = self.g;
        let w = (s % g.au) / g.wu;
        let first = s / g.page;
        let last = (e - 1) / g.page;
        let mut t = 0;
        let slot = self.states[idx].slot;
        if slot != NO_SLOT {
            // The newest copy of this write unit is now in the cache, not in the new AU.
            let si = slot as usize;
            let words = g.words;
            set_bit(&mut self.direct[si * words..(si + 1) * words], w, false);
        }
        let au = (s / g.au) as u32;
        // A page rewritten while cached supersedes its older copy there (the cache
        // reclaims superseded copies on its own): only new pages take up capacity.
        let cw = self.cached_words;
        let au_first = u64::from(au) * (g.au / g.page);
        let mut new_pages = 0;
        for p in first..=last {
            let words = &mut self.cached[idx * cw..(idx + 1) * cw];
            if !bit(words, p - au_first) {
                set_bit(words, p - au_first, true);
                new_pages += 1;
            }
        }
        let c = self.slc.as_mut().expect("SLC write without an SLC cache");
        if self.states[idx].slc_pages == 0 {
            c.aus.push_back(au);
            c.count += 1;
        }
        self.states[idx].slc_pages += new_pages;
        c.pages += new_pages;
        if c.pages > c.capacity_pages || c.count > c.max_aus {
            // The cache is full, or holds data of as many AUs as it can track: fold its
            // oldest AU now (a write unit of this AU stays cached until it is folded).
            if let Some(oldest) = self.oldest_slc_au() {
                t += self.fold(nand, oldest);
            }
        }
        t
    }

    /// The AU that has had data in the SLC cache longest.
    fn oldest_slc_au(&mut self) -> Option<u32> {
        let c = self.slc.as_mut()?;
        while let Some(&au) = c.aus.front() {
            let i = self.au_index[au as usize];
            if i != NONE && self.states[i as usize].slc_pages > 0 {
                return Some(au);
            }
            c.aus.pop_front();
        }
        None
    }

    /// Fold an AU's cached data back into it: close it if open, else rewrite it.
    fn fold(&mut self, nand: &mut Nand, au: u32) -> Nanos {
        let idx = self.au_index[au as usize] as usize;
        let slot = self.states[idx].slot;
        if slot != NO_SLOT {
            return self.close(nand, slot as usize);
        }
        let mut t = 0;
        let mut copied = 0;
        for i in 0..self.g.au_wus {
            if bit(self.valid_words(idx), i) {
                t += nand.copy_write_unit(self.copyback, i);
                copied += 1;
            }
        }
        let new_phys = self
            .phys_free
            .pop_front()
            .expect("spare physical AUs for a fold");
        t += self.retire(nand, idx, new_phys);
        self.counters.gc_runs += 1;
        self.counters.gc_copied_units += copied;
        self.counters.gc_ns += t;
        t
    }

    /// The AU's data now lives in `new_phys`: erase its old physical AU and forget any
    /// cached copies.
    fn retire(&mut self, nand: &mut Nand, idx: usize, new_phys: u32) -> Nanos {
        let mut t = 0;
        let old = self.states[idx].phys;
        if old != NONE {
            t += nand.erase(self.g.au * SECTOR);
            self.phys_erases[old as usize] += 1;
            self.phys_free.push_back(old);
        }
        self.states[idx].phys = new_phys;
        let cached = std::mem::take(&mut self.states[idx].slc_pages);
        let cw = self.cached_words;
        self.cached[idx * cw..(idx + 1) * cw].fill(0);
        self.fold_debt -= std::mem::take(&mut self.states[idx].fold_ns);
        if cached > 0 {
            if let Some(c) = self.slc.as_mut() {
                c.pages -= cached.min(c.pages);
                c.count -= 1;
            }
        }
        t
    }

    /// Open `au` for writing at sector offset `off`, evicting an open AU if as many are
    /// open as the card can keep.
    fn open(&mut self, nand: &mut Nand, au: u64, idx: usize, off: u64) -> (u8, Nanos) {
        let mut t = 0;
        if self.open_aus() >= self.open_linear {
            let v = self.victim(None);
            self.counters.au_evictions += 1;
            t += self.close(nand, v);
        }
        let slot = self
            .slots
            .iter()
            .position(|s| s.mode == Mode::Free)
            .expect("a free slot after eviction");
        let new_phys = self
            .phys_free
            .pop_front()
            .expect("spare physical AUs for every open slot");
        self.tick += 1;
        self.slots[slot] = Slot {
            au: au as u32,
            mode: Mode::Linear,
            last_use: self.tick,
            opened: self.tick,
            new_phys,
        };
        let w = self.g.words;
        self.direct[slot * w..(slot + 1) * w].fill(0);
        self.states[idx].slot = slot as u8;
        self.states[idx].ptr = off;
        self.counters.au_opens += 1;
        (slot as u8, t)
    }

    /// Move an open AU to random use, evicting a random-use AU if that pool is full.
    fn make_random(&mut self, nand: &mut Nand, slot: usize) -> Nanos {
        let mut t = 0;
        if self.open_random == 0 {
            return 0;
        }
        if self.count_mode(Mode::Random) >= self.open_random {
            let v = self.victim(Some(Mode::Random));
            self.counters.au_evictions += 1;
            t += self.close(nand, v);
        }
        self.slots[slot].mode = Mode::Random;
        t
    }

    /// Close an open AU: copy the valid data it did not receive (garbage collection, SLC
    /// fold) into its new physical AU and erase the old one.
    fn close(&mut self, nand: &mut Nand, slot: usize) -> Nanos {
        let sl = self.slots[slot];
        let idx = self.au_index[sl.au as usize] as usize;
        let words = self.g.words;
        let mut t = 0;
        let mut copied = 0;
        for i in 0..self.g.au_wus {
            let valid = bit(self.valid_words(idx), i);
            let placed = bit(Self::slot_words(&self.direct, slot, words), i);
            if valid && !placed {
                t += nand.copy_write_unit(self.copyback, i);
                copied += 1;
            }
        }
        t += self.retire(nand, idx, sl.new_phys);
        self.states[idx].slot = NO_SLOT;
        self.slots[slot] = FREE_SLOT;
        if copied > 0 {
            self.counters.gc_runs += 1;
            self.counters.gc_copied_units += copied;
            self.counters.gc_ns += t;
        } else {
            self.counters.au_completions += 1;
        }
        t
    }

    // ---- background debt -----------------------------------------------------------------

    fn refresh_debt(&mut self) {
        let log = self.log.as_ref().map_or(0, |l| l.len() as u64) * self.copy_unit_estimate;
        self.debt = log + self.fold_debt;
    }

    /// The next piece of background work and its estimated cost: the oldest small-write
    /// log page, else the AU that has had data in the SLC cache longest.
    fn next_item(&mut self) -> Option<(Option<u32>, Nanos)> {
        if let Some(log) = self.log.as_mut() {
            if log.oldest().is_some() {
                return Some((None, self.copy_unit_estimate));
            }
        }
        let au = self.oldest_slc_au()?;
        let idx = self.au_index[au as usize] as usize;
        Some((Some(au), self.states[idx].fold_ns))
    }

    fn do_item(&mut self, nand: &mut Nand, item: Option<u32>) -> Nanos {
        match item {
            None => self.merge_oldest_log_page(nand),
            Some(au) => self.fold(nand, au),
        }
    }

    /// BKOPS ran for `budget`: work off debt; returns the part of `budget` used. Work on an
    /// item cut short carries over to the next call.
    pub fn work(&mut self, nand: &mut Nand, budget: Nanos) -> Nanos {
        let mut avail = budget.saturating_add(self.carry);
        self.carry = 0;
        while let Some((item, est)) = self.next_item() {
            if est > avail {
                self.carry = avail;
                avail = 0;
                break;
            }
            self.do_item(nand, item);
            avail -= est;
        }
        self.refresh_debt();
        let done = budget.saturating_sub(avail);
        self.counters.background_ns += done;
        done
    }

    /// Work off debt in the foreground until at most `target` is left; returns the time.
    pub fn work_until(&mut self, nand: &mut Nand, target: Nanos) -> Nanos {
        let mut t = 0;
        while self.debt > target {
            let Some((item, _)) = self.next_item() else {
                break;
            };
            t += self.do_item(nand, item);
            self.refresh_debt();
        }
        self.counters.foreground_ns += t;
        t
    }

    // ---- erase family --------------------------------------------------------------------

    /// Forget the data of `[start, end)` (whole write units only); AUs left without data
    /// are erased, and with `purge` every other AU touched is garbage-collected so no old
    /// copy of the data survives. Returns the NAND time.
    pub fn unmap(&mut self, nand: &mut Nand, start: u64, end: u64, purge: bool) -> Nanos {
        let end = end.min(self.total);
        if start >= end {
            return 0;
        }
        let g = self.g;
        let mut t = 0;
        if let Some(p) = self.pending {
            if p.lo < end && p.hi > start {
                self.pending = None;
            }
        }
        if self.log.as_ref().is_some_and(|l| l.len() > 0) {
            let (first, last) = (start.div_ceil(g.page), end / g.page);
            if last - first.min(last) <= 4 * self.log.as_ref().map_or(0, |l| l.capacity) as u64 {
                for p in first..last {
                    self.log_remove(p);
                }
            } else {
                let pages: Vec<u64> = self
                    .log
                    .as_ref()
                    .map(|l| {
                        l.map
                            .keys()
                            .copied()
                            .filter(|p| (first..last).contains(p))
                            .collect()
                    })
                    .unwrap_or_default();
                for p in pages {
                    self.log_remove(p);
                }
            }
        }
        let mut au = start / g.au;
        while au * g.au < end {
            let au_start = au * g.au;
            let lo = start.max(au_start) - au_start;
            let hi = end.min(au_start + g.au) - au_start;
            let w_lo = lo.div_ceil(g.wu);
            let w_hi = hi / g.wu;
            let i = self.au_index[au as usize];
            if i != NONE {
                let idx = i as usize;
                let slot = self.states[idx].slot;
                for w in w_lo..w_hi {
                    set_bit(self.valid_words_mut(idx), w, false);
                }
                self.reprice(idx);
                let empty = self.valid_words(idx).iter().all(|&x| x == 0);
                if slot != NO_SLOT {
                    if empty || purge {
                        t += self.close(nand, slot as usize);
                    }
                } else if empty {
                    t += self.retire(nand, idx, NONE);
                } else if purge {
                    t += self.fold(nand, au as u32);
                }
            }
            au += 1;
        }
        self.refresh_debt();
        t
    }
}

impl Nand {
    /// Expected time of `copy_write_unit` (fast and slow pages averaged), without doing it.
    pub fn copy_write_unit_estimate(&self, copyback: bool) -> Nanos {
        let mut probe = self.clone();
        let a = probe.copy_write_unit(copyback, 0);
        let b = probe.copy_write_unit(copyback, 1);
        (a + b) / 2
    }

    /// Expected time of `erase(bytes)`, without doing it.
    pub fn erase_estimate(&self, bytes: u64) -> Nanos {
        self.clone().erase(bytes)
    }
}

#[cfg(test)]
mod tests;
