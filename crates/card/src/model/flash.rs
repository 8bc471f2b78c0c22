//! The `[timing]` section: which timing model a card uses and its parameters.
//!
//! `model = "constant"` keeps the constant-cost parameters ([`ConstantTimingModel`]);
//! `model = "flash"` describes the card's insides — controller, NAND, flash translation
//! layer, volatile cache, background operations and the erase family — in sub-tables, each
//! read by the `timing` module that models that phenomenon. Times are nanoseconds (`_ns`),
//! sizes bytes (`_bytes`), as everywhere in the model files. The names follow the seed
//! thread's vocabulary: page, write unit, allocation unit (AU), open AU, buffer A/B.

use serde::{Deserialize, Serialize};

use super::ConstantTimingModel;

/// Which timing model, with its parameters (`[timing] model = "constant" | "flash"`).
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(tag = "model", rename_all = "lowercase")]
pub enum TimingModel {
    /// Every operation of a kind costs the same (`timing::ConstantTiming`).
    Constant(ConstantTimingModel),
    /// A NAND card behind a flash translation layer (`timing::FlashTiming`).
    Flash(Box<FlashTimingModel>),
}

impl Default for TimingModel {
    /// The ideal card: constant-cost timing with every cost zero.
    fn default() -> Self {
        TimingModel::Constant(ConstantTimingModel::default())
    }
}

impl TimingModel {
    pub fn as_constant(&self) -> Option<&ConstantTimingModel> {
        match self {
            TimingModel::Constant(c) => Some(c),
            TimingModel::Flash(_) => None,
        }
    }

    pub fn as_flash(&self) -> Option<&FlashTimingModel> {
        match self {
            TimingModel::Flash(f) => Some(f),
            TimingModel::Constant(_) => None,
        }
    }

    /// The flash parameters, for tests and tools that change one. A constant-cost model has
    /// none to change: asking for them is a mistake of the caller, and panics.
    pub fn flash_mut(&mut self) -> &mut FlashTimingModel {
        match self {
            TimingModel::Flash(f) => f,
            TimingModel::Constant(_) => panic!("not a flash timing model"),
        }
    }

    /// The constant-cost parameters, switching the model to constant-cost timing first if
    /// it was a flash model (for tests and tools that set costs directly).
    pub fn constant_mut(&mut self) -> &mut ConstantTimingModel {
        if let TimingModel::Flash(_) = self {
            *self = TimingModel::Constant(ConstantTimingModel::default());
        }
        match self {
            TimingModel::Constant(c) => c,
            TimingModel::Flash(_) => unreachable!("replaced above"),
        }
    }

    /// The model's name as written in `[timing] model`.
    pub fn kind(&self) -> &'static str {
        match self {
            TimingModel::Constant(_) => "constant",
            TimingModel::Flash(_) => "flash",
        }
    }
}

/// `[timing] model = "flash"`.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct FlashTimingModel {
    /// Seed of the model's pseudo-random number generator: the only source of randomness,
    /// so every run with the same model and the same requests replays exactly.
    #[serde(default)]
    pub seed: u64,
    pub controller: ControllerModel,
    pub nand: NandModel,
    pub ftl: FtlModel,
    #[serde(default)]
    pub cache: CacheTimingModel,
    #[serde(default)]
    pub bkops: BkopsModel,
    #[serde(default)]
    pub erase: EraseTimingModel,
}

/// `[timing.controller]`: the card controller's firmware time, outside the NAND.
#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct ControllerModel {
    /// Per read command (CMD17/CMD18, or each entry of a packed read): decoding,
    /// mapping lookup.
    pub read_command_ns: u64,
    /// Per write command (CMD24/CMD25) before its data is programmed.
    pub write_command_ns: u64,
    /// Per entry of a packed write, instead of `write_command_ns`.
    pub packed_entry_ns: u64,
    /// An ordinary CMD6 SWITCH (and CMD27/CMD42/CMD28-29 register programming).
    pub switch_ns: u64,
    /// A PARTITION_ACCESS change.
    pub partition_switch_ns: u64,
    /// CMD5 sleep or awake.
    pub sleep_awake_ns: u64,
    /// From HPI reception until the card leaves prg.
    pub hpi_exit_ns: u64,
    /// POWER_OFF_NOTIFICATION := POWER_OFF_LONG.
    pub power_off_ns: u64,
}

/// `[timing.nand]`: geometry and the times of the NAND primitives.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct NandModel {
    /// Page size ("buffer A" in the seed thread): the unit the NAND reads and programs.
    pub page_bytes: u64,
    /// Planes per die programmed (and read) together by multi-plane commands.
    pub planes: u64,
    /// Dies the controller stripes a write unit over. A write unit is
    /// page × planes × dies; a read unit is page × planes.
    pub dies: u64,
    /// Pages per erase block (per plane).
    pub block_pages: u64,
    /// tR: array to page register.
    pub read_page_ns: u64,
    /// tR of the slow (upper) pages of an MLC pair; 0 = no fast/slow alternation.
    #[serde(default)]
    pub read_page_slow_ns: u64,
    /// tPROG of a (multi-plane) page program.
    pub program_page_ns: u64,
    /// tPROG of the slow (upper) pages of an MLC pair; 0 = no fast/slow alternation.
    #[serde(default)]
    pub program_page_slow_ns: u64,
    /// tPROG in SLC mode (used by an SLC write cache); 0 = `program_page_ns`.
    #[serde(default)]
    pub slc_program_page_ns: u64,
    /// tBERS: one (multi-plane, multi-die) block erase.
    pub erase_block_ns: u64,
    /// Moving 1 KiB between the controller and a die, ECC included.
    pub channel_ns_per_kib: u64,
    /// Program times vary by up to ± this many thousandths (seeded, so reproducible).
    #[serde(default)]
    pub jitter_permille: u64,
}

/// What the card does with a write below (or away from) an open AU's write position.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum RandomWrites {
    /// Linear-only AUs: writing a lower address of an open AU garbage-collects it first.
    None,
    /// Random writes at write-unit granularity (partial write units are read-modify-write).
    #[default]
    WriteUnit,
}

/// Which open AU is garbage-collected when one more must be opened.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Eviction {
    /// The AU written least recently.
    #[default]
    Lru,
    /// The AU opened first.
    Fifo,
    /// Any open AU, chosen by the seeded generator.
    Random,
}

/// How garbage collection copies the valid data of an AU.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum GcCopy {
    /// On-chip copy-back: one multi-plane read and one program per write unit, no
    /// transfer through the controller.
    Copyback,
    /// Page by page through the controller (read, ECC, program).
    #[default]
    ThroughController,
}

/// `[timing.ftl]`: the flash translation layer.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct FtlModel {
    /// Allocation unit ("buffer B", "segment", erase block group): the unit the card maps
    /// and garbage-collects.
    pub allocation_unit_bytes: u64,
    /// AUs that can be open for writing at once (written linearly: Arnd Bergmann's
    /// "open AUs linear").
    pub open_aus_linear: u64,
    /// Of those, how many can be in random use — written away from their write position
    /// ("open AUs random"); at most `open_aus_linear`.
    pub open_aus_random: u64,
    #[serde(default)]
    pub eviction: Eviction,
    #[serde(default)]
    pub random_writes: RandomWrites,
    #[serde(default)]
    pub gc_copy: GcCopy,
    /// Extra time of a write that continues an AU's write position and is programmed
    /// straight into the AU (not into an SLC cache).
    #[serde(default)]
    pub sequential_write_ns: u64,
    /// Extra time of a reliable write (CMD23 bit 31).
    #[serde(default)]
    pub reliable_write_ns: u64,
    /// Sub-page writes wait in a page-sized RAM buffer; a non-contiguous write (or a full
    /// page) flushes it, so contiguous small writes fill a page before it is programmed.
    #[serde(default)]
    pub coalesce_sub_page: bool,
    /// Physical AUs beyond the logical ones (over-provisioning; 0 = just enough for the
    /// open AUs).
    #[serde(default)]
    pub spare_aus: u64,
    #[serde(default)]
    pub buffer_a: Option<BufferAModel>,
    #[serde(default)]
    pub slc_cache: Option<SlcCacheModel>,
    #[serde(default)]
    pub sub_page_buffer: Option<SubPageBufferModel>,
    #[serde(default)]
    pub special_region: Option<SpecialRegionModel>,
}

/// Which small writes go to buffer A; the rest go to buffer B (their AU).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum BufferARule {
    /// A write (each write-unit piece of it) inside one page goes to buffer A; one that
    /// touches two pages goes to buffer B, even if it is 1 KiB — what the seed 003
    /// measurements show: a write straddling an 8 KiB boundary stalls, the same write
    /// split at the boundary by the host does not.
    #[default]
    PageSpan,
    /// Consecutive writes join a run, and a run that touches two pages goes to buffer B:
    /// Toshiba's own account in seed 003 ("consecutive small (8k) writes are treated as
    /// one large sequential access"; "any consecutive write that exceeds 8K goes into the
    /// 4MB buffer"), which is why it advised reliable writes or reverse order.
    ConsecutiveRun,
    /// Consecutive writes join a run, and a run longer than `run_limit_bytes` goes to
    /// buffer B (seed 003's earlier reading: "the 4th consecutive 8KB block results in the
    /// entire 32KB getting pushed into the bigger 4MB buffer").
    RunLength,
}

/// `[timing.ftl.buffer_a]`: small writes go to a page-mapped small-write log ("buffer A")
/// instead of their AU ("buffer B").
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct BufferAModel {
    #[serde(default)]
    pub rule: BufferARule,
    /// For `rule = "run_length"`: the longest run that stays in buffer A.
    #[serde(default)]
    pub run_limit_bytes: u64,
    /// For the run rules: a reliable write is classified on its own, never as part of a
    /// run (Toshiba's advice in seed 003: write the 8 KiB pieces with reliable write).
    #[serde(default)]
    pub reliable_breaks_run: bool,
    /// Pages the small-write log holds before the oldest must be merged into its AU.
    pub log_pages: u64,
    /// Each small write also programs an index page of the log.
    #[serde(default)]
    pub index_page: bool,
    /// When one AU's small writes have taken more log pages than this since it was last
    /// merged (a rewrite of a page already in the log takes a new one), the AU is merged
    /// as a whole (rewritten with its log pages folded in); 0 = no per-AU limit.
    #[serde(default)]
    pub pages_per_au: u64,
}

/// `[timing.ftl.slc_cache]`: random writes go to an SLC-mode cache and are folded into
/// their AU later (background work, or when the AU is garbage-collected).
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct SlcCacheModel {
    /// Larger random writes bypass the cache and go straight to their AU.
    pub max_write_bytes: u64,
    /// Data the cache holds before its oldest AU must be folded in the foreground.
    pub capacity_bytes: u64,
    /// AUs the cache can hold data of at once: a random write to one AU more first folds
    /// the oldest in the foreground (0: as many as `capacity_bytes` holds). This bounds
    /// the fold debt, so scattered small writes cost a fold each instead of piling up
    /// work that a later write or an urgent BKOPS pays for all at once.
    #[serde(default)]
    pub max_aus: u64,
}

/// `[timing.ftl.sub_page_buffer]`: what the coalescing buffer of `coalesce_sub_page`
/// costs on a card without a volatile cache. Such a card must have a write in flash before
/// it completes, so the buffer is a temporary SLC-mode page: each sub-page write it takes
/// is programmed there (a partial-page program of the write's sectors, never dearer than
/// programming a whole SLC page), and a non-contiguous write closes it: the buffered
/// sectors become a page of the SLC cache without being programmed again. Needs
/// `coalesce_sub_page = true` and an `[timing.ftl.slc_cache]`. Without this table the
/// buffer is free RAM and a flush programs its page.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct SubPageBufferModel {
    /// Fixed time of a sub-page write programmed into the temporary page.
    pub program_ns: u64,
    /// Plus this per KiB of the write.
    pub program_ns_per_kib: u64,
    /// Closing the temporary page when a write does not continue it.
    pub close_ns: u64,
}

/// `[timing.ftl.special_region]`: a region (e.g. where a FAT lives) kept page-mapped:
/// random writes are fast, linear writes slower.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct SpecialRegionModel {
    /// Offset in the user area.
    pub offset_bytes: u64,
    pub length_bytes: u64,
}

/// `[timing.cache]`: the volatile cache's timing (the card keeps its contents).
#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct CacheTimingModel {
    /// Per write command accepted into the cache.
    pub accept_command_ns: u64,
    /// Per KiB copied into the cache.
    pub accept_ns_per_kib: u64,
    /// Fixed part of FLUSH_CACHE (destaging the dirty data is costed by the FTL).
    pub flush_ns: u64,
}

/// `[timing.bkops]`: background operations.
#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct BkopsModel {
    /// Outstanding background work at which BKOPS_STATUS reaches 1, 2 and 3
    /// (0 disables a level). Level 2 and up raise URGENT_BKOPS.
    pub level_ns: [u64; 3],
    /// At level 3 a write first garbage-collects in the foreground until this much
    /// outstanding work is left.
    pub foreground_target_ns: u64,
}

/// `[timing.erase]`: the erase family and sanitize, beyond the NAND erases they cause.
#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct EraseTimingModel {
    /// Mapping update per erase group erased, trimmed or discarded.
    pub group_ns: u64,
    /// Fixed part of SANITIZE.
    pub sanitize_ns: u64,
}
