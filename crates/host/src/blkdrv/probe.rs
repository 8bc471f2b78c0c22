//! `mmc_blk_probe`: bring the card up with the host's capabilities, decode once what the
//! driver uses of its EXT_CSD ([`Features`], Linux's `mmc_blk_alloc_req` and the card
//! quirks it reads), and set up the queue: scheduler, packing limits and mode, buffers.
//! Also `reprobe` after a power cycle under the driver.

use crate::mmc::{mmc_init_card, HostCaps, MmcCard, MmcError, MmcHostOps};
use crate::packing::{PackLimits, PackingMode, WritePackingControl};
use emmc_card::ext_csd as ext;

use super::bkops::BkopsState;
use super::hpi::HpiState;
use super::{BlkConfig, BlkData, BlkStats, MmcBlk, NoData};

/// Card features the driver uses, decoded once from the EXT_CSD (`mmc_blk_alloc_req`).
#[derive(Debug, Clone, Copy)]
pub(super) struct Features {
    pub(super) sectors: u64,
    pub(super) cache: bool,
    pub(super) hpi: bool,
    pub(super) hpi_cmd12: bool,
    pub(super) bkops: bool,
    /// MMC_BLK_REL_WR, and WR_REL_PARAM.EN_REL_WR.
    pub(super) rel_wr: bool,
    pub(super) enhanced_rel_wr: bool,
    pub(super) rel_sectors: u32,
    /// Packed commands usable at all (4.5 minimums, event enabled).
    pub(super) packed: bool,
    pub(super) erase_group: u64,
    pub(super) can_trim: bool,
    pub(super) can_discard: bool,
    pub(super) can_secure_erase: bool,
    pub(super) erased_zero: bool,
    pub(super) erase_timeout_mult: u64,
    pub(super) trim_mult: u64,
    pub(super) sec_erase_mult: u64,
    pub(super) sec_trim_mult: u64,
}

impl Features {
    pub(super) fn new(card: &MmcCard, caps: &HostCaps) -> Features {
        let e = &card.ext_csd;
        let rel_sectors = u32::from(e[ext::REL_WR_SEC_C]);
        let enhanced_rel_wr = e[ext::WR_REL_PARAM] & ext::EN_REL_WR != 0;
        let sec = e[ext::SEC_FEATURE_SUPPORT];
        let hc_group = u64::from(e[ext::HC_ERASE_GRP_SIZE]) * 1024;
        Features {
            sectors: card.sectors(),
            cache: e[ext::CACHE_CTRL] & ext::CACHE_EN != 0,
            hpi: e[ext::HPI_MGMT] & ext::HPI_EN != 0,
            hpi_cmd12: e[ext::HPI_FEATURES] & ext::HPI_IMPLEMENTATION_CMD12 != 0,
            bkops: e[ext::BKOPS_EN] & ext::BKOPS_MANUAL_EN != 0,
            rel_wr: enhanced_rel_wr || rel_sectors > 0,
            enhanced_rel_wr,
            rel_sectors: rel_sectors.max(1),
            packed: e[ext::MAX_PACKED_WRITES] >= 3
                && e[ext::MAX_PACKED_READS] >= 5
                && caps.packed_event
                && e[ext::EXCEPTION_EVENTS_CTRL] & ext::EE_PACKED_FAILURE as u8 != 0,
            erase_group: hc_group.max(1),
            can_trim: sec & ext::SEC_GB_CL_EN != 0,
            can_discard: e[ext::EXT_CSD_REV] >= 6,
            can_secure_erase: sec & ext::SECURE_ER_EN != 0,
            erased_zero: e[ext::ERASED_MEM_CONT] == 0,
            erase_timeout_mult: u64::from(e[ext::ERASE_TIMEOUT_MULT]).max(1),
            trim_mult: u64::from(e[ext::TRIM_MULT]).max(1),
            sec_erase_mult: u64::from(e[ext::SEC_ERASE_MULT]).max(1),
            sec_trim_mult: u64::from(e[ext::SEC_TRIM_MULT]).max(1),
        }
    }
}

/// The data buffer size for requests up to `sectors` (plus a header block).
fn buf_len(sectors: u32) -> usize {
    (sectors as usize + 1) * 512
}

impl<H: MmcHostOps> MmcBlk<H, NoData> {
    /// `mmc_blk_probe`: bring the card up with `cfg.caps` and set up the queue; requests
    /// carry no data.
    pub fn probe(host: H, cfg: BlkConfig) -> Result<MmcBlk<H>, MmcError> {
        MmcBlk::probe_with_data(host, cfg, NoData)
    }
}

impl<H: MmcHostOps, D: BlkData> MmcBlk<H, D> {
    /// `mmc_blk_probe` with request data moved through `data`.
    pub fn probe_with_data(mut host: H, cfg: BlkConfig, data: D) -> Result<Self, MmcError> {
        let card = mmc_init_card(&mut host, &cfg.caps)?;
        let (f, limits, packing) = Self::setup(&card, &cfg);
        let sched = cfg.elevator.build(cfg.merge_limits());
        Self::log_setup(&f, packing, sched.name());
        let now = host.now();
        let max = cfg.max_hw_sectors.max(cfg.max_sectors);
        Ok(MmcBlk {
            host,
            data,
            card,
            wpc: WritePackingControl::new(packing),
            cfg,
            f,
            sched,
            limits,
            cur: None,
            active: None,
            completions: Vec::new(),
            idle_since: Some(now),
            bkops: BkopsState::default(),
            hpi: HpiState::default(),
            writes_since_read: 0,
            reset_done: false,
            stats: BlkStats::default(),
            wbuf: vec![0; buf_len(max)],
            rbuf: vec![0; buf_len(max)],
            read_in_place: false,
        })
    }

    /// The card was power-cycled under the driver (its host went away and a new one
    /// came): bring it up again and start over with an empty queue, as a new probe would.
    /// Requests in the queue are dropped without completions.
    pub fn reprobe(&mut self) -> Result<(), MmcError> {
        self.card = mmc_init_card(&mut self.host, &self.cfg.caps)?;
        let (f, limits, packing) = Self::setup(&self.card, &self.cfg);
        self.sched = self.cfg.elevator.build(self.cfg.merge_limits());
        Self::log_setup(&f, packing, self.sched.name());
        self.f = f;
        self.limits = limits;
        self.wpc = WritePackingControl::new(packing);
        self.cur = None;
        self.active = None;
        self.completions.clear();
        self.idle_since = Some(self.host.now());
        self.bkops = BkopsState::default();
        self.hpi = HpiState::default();
        self.writes_since_read = 0;
        self.stats = BlkStats::default();
        Ok(())
    }

    /// What the card and the configuration allow: features, packing limits and mode.
    pub(super) fn setup(card: &MmcCard, cfg: &BlkConfig) -> (Features, PackLimits, PackingMode) {
        let f = Features::new(card, &cfg.caps);
        let e = &card.ext_csd;
        let packing = if f.packed && cfg.cmd23 {
            cfg.packing
        } else {
            PackingMode::Off
        };
        let limits = PackLimits {
            max_packed_writes: usize::from(e[ext::MAX_PACKED_WRITES]),
            max_packed_reads: if cfg.packed_reads {
                usize::from(e[ext::MAX_PACKED_READS])
            } else {
                0
            },
            // The header block and its segment count against the host's limits.
            max_sectors: u64::from(cfg.max_hw_sectors.saturating_sub(1)),
            max_segments: u64::from(cfg.max_segments.saturating_sub(1)),
            enhanced_reliable_write: f.enhanced_rel_wr,
            native_4k: e[ext::DATA_SECTOR_SIZE] == 1,
        };
        (f, limits, packing)
    }

    fn log_setup(f: &Features, packing: PackingMode, scheduler: &str) {
        log::info!(
            "mmcblk: {} sectors, cache {}, HPI {}, BKOPS {}, reliable write {}, packing {:?}, {}",
            f.sectors,
            f.cache,
            f.hpi,
            f.bkops,
            if f.enhanced_rel_wr {
                "enhanced"
            } else if f.rel_wr {
                "legacy"
            } else {
                "none"
            },
            packing,
            scheduler
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mmc::MmcHost;
    use crate::sdhci::SdhciConfig;
    use emmc_card::model::DeviceModel;
    use emmc_card::store::NullStore;
    use emmc_card::Card;

    /// The generic card brought up with its model's host capabilities.
    fn brought_up() -> (MmcCard, HostCaps) {
        let m = DeviceModel::load("generic-emmc45").unwrap();
        let caps = HostCaps::for_model(&m.host);
        let layout = Card::layout_for(&m);
        let card = Card::new(m.clone(), Box::new(NullStore::new(layout))).unwrap();
        let mut host = MmcHost::with_config(card, SdhciConfig::for_model(&m.host));
        (mmc_init_card(&mut host, &caps).unwrap(), caps)
    }

    #[test]
    fn features_follow_the_ext_csd_the_card_was_brought_up_with() {
        let (card, caps) = brought_up();
        let f = Features::new(&card, &caps);
        assert_eq!(f.sectors, card.sectors());
        assert!(
            f.cache && f.hpi && f.bkops,
            "bring-up enables what the card has"
        );
        assert_eq!(f.packed, caps.packed_event);
        assert_eq!(
            f.erase_group,
            u64::from(card.ext_csd[ext::HC_ERASE_GRP_SIZE]) * 1024
        );
    }

    #[test]
    fn reliable_write_is_enhanced_legacy_or_none() {
        let (mut card, caps) = brought_up();
        card.ext_csd[ext::WR_REL_PARAM] &= !ext::EN_REL_WR;
        card.ext_csd[ext::REL_WR_SEC_C] = 0;
        let f = Features::new(&card, &caps);
        assert!(!f.rel_wr && !f.enhanced_rel_wr);
        assert_eq!(f.rel_sectors, 1);
        card.ext_csd[ext::REL_WR_SEC_C] = 8;
        let f = Features::new(&card, &caps);
        assert!(f.rel_wr && !f.enhanced_rel_wr);
        assert_eq!(f.rel_sectors, 8);
        card.ext_csd[ext::WR_REL_PARAM] |= ext::EN_REL_WR;
        card.ext_csd[ext::REL_WR_SEC_C] = 0;
        let f = Features::new(&card, &caps);
        assert!(f.rel_wr && f.enhanced_rel_wr);
    }

    #[test]
    fn packed_commands_need_the_45_minimums_and_the_failure_event() {
        let (mut card, mut caps) = brought_up();
        caps.packed_event = true;
        card.ext_csd[ext::MAX_PACKED_WRITES] = 3;
        card.ext_csd[ext::MAX_PACKED_READS] = 5;
        card.ext_csd[ext::EXCEPTION_EVENTS_CTRL] |= ext::EE_PACKED_FAILURE as u8;
        assert!(Features::new(&card, &caps).packed);
        let mut no = card.clone();
        no.ext_csd[ext::MAX_PACKED_WRITES] = 2;
        assert!(!Features::new(&no, &caps).packed);
        let mut no = card.clone();
        no.ext_csd[ext::MAX_PACKED_READS] = 4;
        assert!(!Features::new(&no, &caps).packed);
        let mut no = card.clone();
        no.ext_csd[ext::EXCEPTION_EVENTS_CTRL] &= !(ext::EE_PACKED_FAILURE as u8);
        assert!(!Features::new(&no, &caps).packed);
        caps.packed_event = false;
        assert!(!Features::new(&card, &caps).packed);
    }

    #[test]
    fn erase_parameters_never_decode_to_zero() {
        let (mut card, caps) = brought_up();
        for field in [
            ext::HC_ERASE_GRP_SIZE,
            ext::ERASE_TIMEOUT_MULT,
            ext::TRIM_MULT,
            ext::SEC_ERASE_MULT,
            ext::SEC_TRIM_MULT,
        ] {
            card.ext_csd[field] = 0;
        }
        card.ext_csd[ext::EXT_CSD_REV] = 5;
        card.ext_csd[ext::ERASED_MEM_CONT] = 1;
        let f = Features::new(&card, &caps);
        assert_eq!(f.erase_group, 1);
        assert_eq!(
            (
                f.erase_timeout_mult,
                f.trim_mult,
                f.sec_erase_mult,
                f.sec_trim_mult
            ),
            (1, 1, 1, 1)
        );
        assert!(!f.can_discard && !f.erased_zero);
    }
}
