//! Device models: one TOML file per card (`device-models/*.toml`), deserialised into
//! [`DeviceModel`] and validated before a card is built from it.
//!
//! A model is two profiles. The card profile (`[cid]`, `[csd]`, `[ext_csd]`, `[timing]`)
//! is what the card does, in card time. The host profile (`host = "NAME"`, a file of
//! `device-models/hosts/`) is the host that measured it: the controller's bus and limits,
//! and that host's software time ([`HostProfile`]). `extends = "MODEL"` takes another
//! model and states only what differs (`load.rs`).
//!
//! Field names follow the register the value ends up in (CID, CSD, EXT_CSD field names in
//! lower case) so that a model file can be read beside the JEDEC tables. Values are the raw
//! register encodings; the comments in the model files give the decoded meaning and the
//! source of every number.

mod flash;
mod load;
pub mod provenance;
mod validate;

pub use flash::{
    BkopsModel, BufferAModel, BufferARule, CacheTimingModel, ControllerModel, EraseTimingModel,
    Eviction, FlashTimingModel, FtlModel, GcCopy, NandModel, RandomWrites, SlcCacheModel,
    SpecialRegionModel, SubPageBufferModel, TimingModel,
};
pub use load::{
    builtin_host_names, builtin_model_names, BUILTIN_HOSTS, BUILTIN_MODELS, DEFAULT_HOST,
    DEFAULT_MODEL,
};

use serde::{Deserialize, Serialize};

/// Everything that describes one card.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct DeviceModel {
    /// Short name, e.g. `generic-emmc45`; recorded in images made from this model.
    pub name: String,
    /// One line for `vhost-user-emmc models`.
    pub description: String,
    pub cid: CidModel,
    pub csd: CsdModel,
    pub ext_csd: ExtCsdModel,
    /// The host profile the card was calibrated with (`host = "NAME"` in the file, a
    /// built-in profile or a path; or an inline `[host]` table).
    pub host: HostProfile,
    /// Costs of card operations: `[timing] model = "constant"` or `"flash"`. Absent, the
    /// card is ideal (constant-cost, every cost zero).
    #[serde(default)]
    pub timing: TimingModel,
}

/// Card Identification register contents.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct CidModel {
    /// MID, JEDEC manufacturer id.
    pub mid: u8,
    /// CBX: device type.
    pub cbx: Cbx,
    /// OID, OEM/application id.
    pub oid: u8,
    /// PNM, product name: exactly six ASCII characters.
    pub pnm: String,
    /// PRV, product revision as "n.m" (each 0..=9), stored as BCD.
    pub prv: String,
    /// PSN, serial number.
    pub psn: u32,
    /// MDT, manufacturing date as "YYYY-MM". With EXT_CSD_REV 6 the year must be 2010..=2025.
    pub mdt: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Cbx {
    /// 00: removable device.
    Removable,
    /// 01: BGA (discrete embedded).
    Bga,
    /// 10: package on package.
    Pop,
}

/// Card Specific Data register contents (eMMC layout, CSD_STRUCTURE 3 "see EXT_CSD").
/// C_SIZE and C_SIZE_MULT are derived from the user-area size and are not part of a model.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct CsdModel {
    /// TAAC: asynchronous read access time, raw encoding ([6:3] multiplier, [2:0] unit).
    pub taac: u8,
    /// NSAC: clock-dependent read access time in units of 100 clocks.
    pub nsac: u8,
    /// TRAN_SPEED: raw encoding; 0x32 = 26 MHz.
    pub tran_speed: u8,
    /// CCC: supported command classes, bit n = class n.
    pub ccc: u16,
    /// R2W_FACTOR: write time = read time × 2^R2W_FACTOR.
    pub r2w_factor: u8,
    /// ERASE_GRP_SIZE / ERASE_GRP_MULT: legacy erase group = (SIZE+1)·(MULT+1) write blocks.
    pub erase_grp_size: u8,
    pub erase_grp_mult: u8,
    /// WP_GRP_SIZE: legacy write-protect group = (WP_GRP_SIZE+1) erase groups.
    pub wp_grp_size: u8,
    /// WP_GRP_ENABLE: group write protection supported.
    pub wp_grp_enable: bool,
    /// VDD_R_CURR_MIN, VDD_R_CURR_MAX, VDD_W_CURR_MIN, VDD_W_CURR_MAX (3-bit codes).
    #[serde(default = "default_vdd_curr")]
    pub vdd_r_curr_min: u8,
    #[serde(default = "default_vdd_curr")]
    pub vdd_r_curr_max: u8,
    #[serde(default = "default_vdd_curr")]
    pub vdd_w_curr_min: u8,
    #[serde(default = "default_vdd_curr")]
    pub vdd_w_curr_max: u8,
}

fn default_vdd_curr() -> u8 {
    7
}

/// EXT_CSD properties (read-only segment) and the power-on defaults of the few persistent
/// host-writable fields a vendor may preset. Raw register encodings throughout.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct ExtCsdModel {
    /// EXT_CSD_REV [192]; this project emulates eMMC 4.5, so it must be 6.
    pub ext_csd_rev: u8,
    /// SEC_COUNT [212]: user-area size in 512-byte sectors as shipped (before any general
    /// purpose partitions are carved out of it). > 4 194 304 means sector addressing.
    pub sec_count: u32,
    /// BOOT_SIZE_MULT [226]: each boot partition is value × 128 KiB (0: none).
    pub boot_size_mult: u8,
    /// RPMB_SIZE_MULT [168]: RPMB partition is value × 128 KiB (0: none).
    pub rpmb_size_mult: u8,
    /// HC_ERASE_GRP_SIZE [224]: value × 512 KiB.
    pub hc_erase_grp_size: u8,
    /// HC_WP_GRP_SIZE [221]: value × HC erase groups.
    pub hc_wp_grp_size: u8,
    /// ERASE_TIMEOUT_MULT [223], TRIM_MULT [232]: × 300 ms per erase group.
    pub erase_timeout_mult: u8,
    pub trim_mult: u8,
    /// SEC_ERASE_MULT [230], SEC_TRIM_MULT [229].
    pub sec_erase_mult: u8,
    pub sec_trim_mult: u8,
    /// SEC_FEATURE_SUPPORT [231]: bit0 SECURE_ER_EN, bit2 SEC_BD_BLK_EN, bit4 SEC_GB_CL_EN, bit6 SEC_SANITIZE.
    pub sec_feature_support: u8,
    /// REL_WR_SEC_C [222]: legacy reliable-write granularity in sectors.
    pub rel_wr_sec_c: u8,
    /// WR_REL_PARAM [166]: bit0 HS_CTRL_REL, bit2 EN_REL_WR.
    pub wr_rel_param: u8,
    /// CACHE_SIZE [249..252]: volatile cache size in kibibits (0: no cache).
    pub cache_size: u32,
    /// MAX_PACKED_WRITES [500], MAX_PACKED_READS [501].
    pub max_packed_writes: u8,
    pub max_packed_reads: u8,
    /// HPI_FEATURES [503]: bit0 HPI_SUPPORT, bit1 HPI_IMPLEMENTATION (0 CMD13, 1 CMD12).
    pub hpi_features: u8,
    /// BKOPS_SUPPORT [502]: bit0 supported.
    pub bkops_support: u8,
    /// DEVICE_TYPE [196]: bit0 HS26, bit1 HS52, bit2 DDR52 1.8/3 V, bit3 DDR52 1.2 V, bit4 HS200 1.8 V, bit5 HS200 1.2 V.
    pub device_type: u8,
    /// DRIVER_STRENGTH [197]: bit n = driver type n supported.
    pub driver_strength: u8,
    /// GENERIC_CMD6_TIME [248], POWER_OFF_LONG_TIME [247], PARTITION_SWITCH_TIME [199],
    /// OUT_OF_INTERRUPT_TIME [198]: × 10 ms.
    pub generic_cmd6_time: u8,
    pub power_off_long_time: u8,
    pub partition_switch_time: u8,
    pub out_of_interrupt_time: u8,
    /// S_A_TIMEOUT [217]: sleep/awake timeout = 100 ns × 2^value (1..=0x17).
    pub s_a_timeout: u8,
    /// ERASED_MEM_CONT [181]: 0 erased data reads 0x00, 1 reads 0xFF.
    pub erased_mem_cont: u8,
    /// PARTITIONING_SUPPORT [160]: bit0 PARTITIONING_EN, bit1 ENH_ATTRIBUTE_EN, bit2 EXT_ATTRIBUTE_EN.
    pub partitioning_support: u8,
    /// MAX_ENH_SIZE_MULT [157..159].
    pub max_enh_size_mult: u32,
    /// BOOT_INFO [228]: bit0 ALT_BOOT_MODE, bit1 DDR_BOOT_MODE, bit2 HS_BOOT_MODE.
    #[serde(default)]
    pub boot_info: u8,
    /// S_CMD_SET [504]: bit0 standard MMC command set.
    #[serde(default = "one")]
    pub s_cmd_set: u8,
    /// Power classes: PWR_CL_52_195 [200], PWR_CL_26_195 [201], PWR_CL_52_360 [202],
    /// PWR_CL_26_360 [203], PWR_CL_200_195 [236], PWR_CL_200_360 [237],
    /// PWR_CL_DDR_52_195 [238], PWR_CL_DDR_52_360 [239].
    #[serde(default)]
    pub pwr_cl_52_195: u8,
    #[serde(default)]
    pub pwr_cl_26_195: u8,
    #[serde(default)]
    pub pwr_cl_52_360: u8,
    #[serde(default)]
    pub pwr_cl_26_360: u8,
    #[serde(default)]
    pub pwr_cl_200_195: u8,
    #[serde(default)]
    pub pwr_cl_200_360: u8,
    #[serde(default)]
    pub pwr_cl_ddr_52_195: u8,
    #[serde(default)]
    pub pwr_cl_ddr_52_360: u8,
    /// MIN_PERF_* [205..210], [234], [235] (0: not defined).
    #[serde(default)]
    pub min_perf_r_4_26: u8,
    #[serde(default)]
    pub min_perf_w_4_26: u8,
    #[serde(default)]
    pub min_perf_r_8_26_4_52: u8,
    #[serde(default)]
    pub min_perf_w_8_26_4_52: u8,
    #[serde(default)]
    pub min_perf_r_8_52: u8,
    #[serde(default)]
    pub min_perf_w_8_52: u8,
    #[serde(default)]
    pub min_perf_ddr_r_8_52: u8,
    #[serde(default)]
    pub min_perf_ddr_w_8_52: u8,
    /// ACC_SIZE [225], S_C_VCC [220], S_C_VCCQ [219], INI_TIMEOUT_AP [241].
    #[serde(default)]
    pub acc_size: u8,
    #[serde(default)]
    pub s_c_vcc: u8,
    #[serde(default)]
    pub s_c_vccq: u8,
    #[serde(default)]
    pub ini_timeout_ap: u8,
    /// Context and data-tag properties: CONTEXT_CAPABILITIES [496], LARGE_UNIT_SIZE_M1 [495],
    /// TAG_RES_SIZE [497], TAG_UNIT_SIZE [498], DATA_TAG_SUPPORT [499], EXT_SUPPORT [494].
    #[serde(default)]
    pub context_capabilities: u8,
    #[serde(default)]
    pub large_unit_size_m1: u8,
    #[serde(default)]
    pub tag_res_size: u8,
    #[serde(default)]
    pub tag_unit_size: u8,
    #[serde(default)]
    pub data_tag_support: u8,
    #[serde(default)]
    pub ext_support: u8,
    /// Power-on value of BOOT_PARTITION_ENABLE/BOOT_ACK in PARTITION_CONFIG [179] bits 6:3
    /// on a fresh image (vendors ship some parts boot-enabled).
    #[serde(default)]
    pub partition_config: u8,
}

fn one() -> u8 {
    1
}

/// Bus timing mode after bring-up.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum BusTiming {
    /// Backward-compatible timing, up to 26 MHz.
    Legacy,
    /// High speed SDR, up to 52 MHz.
    Hs,
    /// High speed DDR, up to 52 MHz, 4 or 8 lines.
    Ddr52,
    /// HS200, up to 200 MHz, 4 or 8 lines.
    Hs200,
}

/// A host profile (`device-models/hosts/*.toml`, or a `[host]` table in a model): the host
/// a card is driven by in the simulator and the blk transport, and was measured behind.
///
/// Its numbers are of two kinds:
/// - **the controller**: `clock_hz`, `bus_width`, `timing` (the bus after bring-up) and the
///   controller's limits `max_hw_sectors_kb`, `max_segments`. The emulated SDHCI offers
///   them on every transport, whoever the host driver is.
/// - **the host software**: `request_overhead_ns`, `prepare_ns` and the block queue's
///   `max_sectors_kb` — the block layer and driver of the host that measured the seed
///   figures. They are charged in card time only where this process models the host
///   (the blk transport, the simulator). Where a real driver is the host (the guest's
///   kernel, the Rust virtio-mmc driver), its own time is real and must not be charged
///   twice: such a frontend uses [`HostProfile::controller_only`].
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct HostProfile {
    /// The profile's name (`device-models/hosts/NAME.toml`); "inline" for a `[host]`
    /// table written into a model.
    pub name: String,
    /// One line for `vhost-user-emmc models`.
    pub description: String,
    /// Card clock after bring-up, in Hz (controller).
    pub clock_hz: u64,
    /// Data lines: 1, 4 or 8 (controller).
    pub bus_width: u8,
    /// Bus timing mode after bring-up (controller).
    pub timing: BusTiming,
    /// Host software time per MMC request outside the bus: interrupt, register set-up,
    /// completion. Charged by the controller model to every MMC request, the CMD13 after
    /// a write included, only where this process is the host.
    pub request_overhead_ns: u64,
    /// Host software time per block request (the caller's system call, the block layer,
    /// the MMC block driver's request set-up, DMA mapping): charged once per block
    /// request by the block driver, overlapped with the previous request's transfer by
    /// its two-deep pipeline when the next request is already queued, not otherwise.
    pub prepare_ns: u64,
    /// The block queue's largest request (`max_sectors_kb`; host software).
    pub max_sectors_kb: u32,
    /// The controller's largest MMC request (`max_req_size`, and `max_blk_count` blocks), KiB.
    pub max_hw_sectors_kb: u32,
    /// Scatter-gather segments per request (`max_segs`; controller).
    pub max_segments: u32,
}

impl Default for HostProfile {
    /// The values a profile states nothing about: Linux's sdhci with ADMA2 (128 segments,
    /// 512 KiB requests) in high speed SDR at 52 MHz on 8 lines, with no software time.
    fn default() -> Self {
        HostProfile {
            name: "inline".into(),
            description: String::new(),
            clock_hz: 52_000_000,
            bus_width: 8,
            timing: BusTiming::Hs,
            request_overhead_ns: 0,
            prepare_ns: 0,
            max_sectors_kb: 512,
            max_hw_sectors_kb: 512,
            max_segments: 128,
        }
    }
}

impl HostProfile {
    /// The controller of this profile without the measuring host's software time: what a
    /// frontend offers when a real driver is the host and brings its own time.
    pub fn controller_only(&self) -> HostProfile {
        HostProfile {
            request_overhead_ns: 0,
            prepare_ns: 0,
            ..self.clone()
        }
    }
}

/// Parameters of the constant-cost timing model: every operation of a kind costs the same
/// card time. All figures in nanoseconds. The default (all zero) is an ideal card.
#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct ConstantTimingModel {
    /// Access time from the end of a read command to the first data block.
    pub read_access_ns: u64,
    /// Per 512-byte block read from the medium (internal, not bus time).
    pub read_block_ns: u64,
    /// Fixed cost of programming one write command to the medium.
    pub program_command_ns: u64,
    /// Per 512-byte block programmed to the medium.
    pub program_block_ns: u64,
    /// Per 512-byte block accepted into the volatile cache.
    pub cache_block_ns: u64,
    /// Fixed cost of a cache flush, plus `program_block_ns` per dirty block destaged.
    pub flush_ns: u64,
    /// Per erase group erased, trimmed or discarded.
    pub erase_group_ns: u64,
    /// Busy time of an ordinary CMD6 SWITCH.
    pub switch_ns: u64,
    /// Busy time of a PARTITION_ACCESS change.
    pub partition_switch_ns: u64,
    /// Busy time of CMD5 sleep or awake.
    pub sleep_awake_ns: u64,
    /// Time from HPI reception until the card leaves prg.
    pub hpi_exit_ns: u64,
    /// Busy time of SANITIZE_START.
    pub sanitize_ns: u64,
    /// Background work (garbage collection debt) each programmed block leaves behind,
    /// worked off by BKOPS.
    pub background_work_per_block_ns: u64,
    /// BKOPS_STATUS thresholds on outstanding background work: level 1, 2 and 3.
    pub bkops_level_ns: [u64; 3],
}

/// Errors found while loading or validating a model. Messages name the field.
#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    #[error("device model {name:?}: {source}")]
    Parse {
        name: String,
        #[source]
        source: toml::de::Error,
    },
    #[error("device model {name:?}: {field}: {problem}")]
    Invalid {
        name: String,
        field: &'static str,
        problem: String,
    },
    #[error("no device model {0:?}: not a built-in model ({list}) and no such file", list = builtin_model_names().join(", "))]
    NotFound(String),
    #[error("reading device model {path}: {source}")]
    Io {
        path: String,
        #[source]
        source: std::io::Error,
    },
}

impl DeviceModel {
    /// Sector (block) addressing is mandatory above 2 GiB and used nowhere else.
    pub fn sector_addressing(&self) -> bool {
        self.ext_csd.sec_count > 4_194_304
    }

    /// Size of each of the two boot partitions in bytes.
    pub fn boot_partition_bytes(&self) -> u64 {
        u64::from(self.ext_csd.boot_size_mult) * 128 * 1024
    }

    /// Size of the RPMB partition in bytes.
    pub fn rpmb_bytes(&self) -> u64 {
        u64::from(self.ext_csd.rpmb_size_mult) * 128 * 1024
    }

    /// Size of the user area as shipped (SEC_COUNT × 512).
    pub fn user_bytes(&self) -> u64 {
        u64::from(self.ext_csd.sec_count) * 512
    }

    /// High-capacity erase group in 512-byte sectors.
    pub fn hc_erase_group_sectors(&self) -> u64 {
        u64::from(self.ext_csd.hc_erase_grp_size) * 1024
    }

    /// High-capacity write-protect group in 512-byte sectors.
    pub fn hc_wp_group_sectors(&self) -> u64 {
        self.hc_erase_group_sectors() * u64::from(self.ext_csd.hc_wp_grp_size)
    }

    /// Legacy (CSD) erase group in 512-byte sectors.
    pub fn legacy_erase_group_sectors(&self) -> u64 {
        (u64::from(self.csd.erase_grp_size) + 1) * (u64::from(self.csd.erase_grp_mult) + 1)
    }

    /// Legacy (CSD) write-protect group in 512-byte sectors.
    pub fn legacy_wp_group_sectors(&self) -> u64 {
        self.legacy_erase_group_sectors() * (u64::from(self.csd.wp_grp_size) + 1)
    }

    /// Volatile cache capacity in 512-byte blocks (CACHE_SIZE is in kibibits).
    pub fn cache_blocks(&self) -> u64 {
        u64::from(self.ext_csd.cache_size) * 1024 / 8 / 512
    }
}
