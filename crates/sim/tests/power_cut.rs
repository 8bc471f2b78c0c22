//! The power-cut workload (issue 7): clean runs on an enhanced card with a cache and on a
//! legacy reliable-write card, and mutations of the store that the checker must catch,
//! each as its own kind of violation.

use emmc_card::ext_csd::EN_REL_WR;
use emmc_card::model::DeviceModel;
use emmc_card::store::{ImageLayout, Store, StoreError};
use emmc_sim::powercut::{
    run, run_wrapped, CutStore, PowerCutConfig, PowerCutReport, ViolationKind,
};

fn mem_config(cuts: u64, seed: u64) -> PowerCutConfig {
    PowerCutConfig {
        store: CutStore::Mem,
        ..PowerCutConfig::new(cuts, seed)
    }
}

/// Toshiba's model declares REL_WR_SEC_C = 16; run it with legacy reliable write so a
/// reliable write is 16 sectors that must land all or nothing.
fn legacy_model() -> DeviceModel {
    let mut m = DeviceModel::load("toshiba-mmc32g").unwrap();
    m.ext_csd.wr_rel_param &= !EN_REL_WR;
    assert_eq!(m.ext_csd.rel_wr_sec_c, 16);
    m
}

fn assert_clean(r: &PowerCutReport) {
    assert_eq!(r.violations.total(), 0, "{}", r.to_text());
    assert_eq!(r.unexpected_errors, 0, "{}", r.to_text());
    assert!(!r.failed());
}

#[test]
fn enhanced_card_with_cache_loses_nothing_durable_over_200_cuts() {
    let model = DeviceModel::load("generic-emmc45").unwrap();
    let r = run(&mem_config(200, 11), &model).unwrap();
    assert_clean(&r);
    assert_eq!(r.cuts, 200);
    assert_eq!(r.reliable_mode, "enhanced");
    // The run exercised what it claims to: cuts during programming and during reliable
    // writes, every kind of operation.
    assert!(r.cuts_while_busy > 100, "{}", r.to_text());
    assert!(r.cuts_in_reliable_write > 20, "{}", r.to_text());
    assert!(r.ops.flushes > 0 && r.ops.cache_switches > 0 && r.ops.packed_reliable_entries > 0);
    assert_eq!(r.sectors_checked, 200 * (4096 + 2 * 256));
}

#[test]
fn legacy_reliable_writes_are_atomic_as_a_whole_over_200_cuts() {
    let r = run(&mem_config(200, 12), &legacy_model()).unwrap();
    assert_clean(&r);
    assert_eq!(r.reliable_mode, "legacy");
    assert!(r.cuts_in_reliable_write > 20, "{}", r.to_text());
    assert!(
        r.ops.refused_as_expected > 0,
        "misaligned legacy reliable writes were tried and refused"
    );
}

#[test]
fn image_reopened_from_disk_after_every_cut_holds_the_durable_data() {
    let dir = tempfile::tempdir().unwrap();
    let config = PowerCutConfig {
        store: CutStore::Image,
        reopen_every: 1,
        image: Some(dir.path().join("card.img")),
        ..PowerCutConfig::new(40, 13)
    };
    let model = DeviceModel::load("generic-emmc45").unwrap();
    let r = run(&config, &model).unwrap();
    assert_clean(&r);
    assert_eq!(r.reopens, 40);
}

#[test]
fn same_seed_same_run() {
    let model = DeviceModel::load("generic-emmc45").unwrap();
    let a = run(&mem_config(30, 5), &model).unwrap();
    let b = run(&mem_config(30, 5), &model).unwrap();
    let c = run(&mem_config(30, 6), &model).unwrap();
    assert_eq!(a.operations, b.operations);
    assert_eq!(a.card_seconds, b.card_seconds);
    assert_ne!(
        (a.operations, a.card_seconds),
        (c.operations, c.card_seconds)
    );
}

// ---- mutations: a broken store must be caught, as the right kind ------------------------

/// How the broken store misbehaves on the data writes it selects.
#[derive(Clone, Copy)]
enum Breakage {
    /// Acknowledge the write but store nothing.
    Drop,
    /// Flip one byte in the middle of the first sector.
    FlipByte,
    /// Write the data one sector further on.
    Misdirect,
    /// Store all but the first sector of a multi-sector write.
    SkipFirstSector,
}

/// Passes writes through, except every `every`-th data write of at least `min_len` bytes
/// after the first `skip`, which it breaks.
struct BrokenStore {
    inner: Box<dyn Store + Send>,
    how: Breakage,
    seen: u64,
    skip: u64,
    every: u64,
    min_len: usize,
}

impl Store for BrokenStore {
    fn layout(&self) -> ImageLayout {
        self.inner.layout()
    }
    fn read_at(&mut self, offset: u64, buf: &mut [u8]) -> Result<(), StoreError> {
        self.inner.read_at(offset, buf)
    }
    fn write_at(&mut self, offset: u64, buf: &[u8]) -> Result<(), StoreError> {
        if buf.len() < self.min_len {
            return self.inner.write_at(offset, buf);
        }
        self.seen += 1;
        if self.seen <= self.skip || (self.seen - self.skip) % self.every != 0 {
            return self.inner.write_at(offset, buf);
        }
        match self.how {
            Breakage::Drop => Ok(()),
            Breakage::FlipByte => {
                let mut data = buf.to_vec();
                data[200] ^= 0x40;
                self.inner.write_at(offset, &data)
            }
            Breakage::Misdirect => self.inner.write_at(offset + 512, buf),
            Breakage::SkipFirstSector => self.inner.write_at(offset + 512, &buf[512..]),
        }
    }
    fn fill(&mut self, offset: u64, len: u64, byte: u8) -> Result<(), StoreError> {
        self.inner.fill(offset, len, byte)
    }
    fn sync(&mut self) -> Result<(), StoreError> {
        self.inner.sync()
    }
    fn load_card_state(&self) -> Option<toml::Table> {
        self.inner.load_card_state()
    }
    fn save_card_state(&mut self, state: &toml::Table) -> Result<(), StoreError> {
        self.inner.save_card_state(state)
    }
}

fn broken_run(model: &DeviceModel, how: Breakage, every: u64, min_len: usize) -> PowerCutReport {
    let mut wrap = |inner: Box<dyn Store + Send>| -> Box<dyn Store + Send> {
        Box::new(BrokenStore {
            inner,
            how,
            seen: 0,
            skip: 20,
            every,
            min_len,
        })
    };
    let r = run_wrapped(&mem_config(150, 21), model, &mut wrap).unwrap();
    assert!(r.failed(), "the checker missed a broken store");
    r
}

fn kinds(r: &PowerCutReport) -> Vec<ViolationKind> {
    r.first_violations.iter().map(|v| v.kind).collect()
}

#[test]
fn a_dropped_write_is_a_durable_write_missing() {
    // Without a cache every acknowledged write is durable: dropping one must show.
    let model = DeviceModel::load("sandisk-emmc45").unwrap();
    assert_eq!(model.ext_csd.cache_size, 0);
    let r = broken_run(&model, Breakage::Drop, 40, 512);
    assert!(r.violations.durable_lost > 0, "{}", r.to_text());
    assert_eq!(r.violations.corrupt, 0, "{}", r.to_text());
    assert_eq!(r.violations.outside_written, 0, "{}", r.to_text());
    assert!(kinds(&r).contains(&ViolationKind::DurableLost));
    assert!(r.first_violations.iter().all(|v| v.op > 0));
}

#[test]
fn a_flipped_byte_is_corrupt_data() {
    let model = DeviceModel::load("generic-emmc45").unwrap();
    let r = broken_run(&model, Breakage::FlipByte, 40, 512);
    assert!(r.violations.corrupt > 0, "{}", r.to_text());
    assert_eq!(r.violations.outside_written, 0, "{}", r.to_text());
    assert_eq!(r.violations.durable_lost, 0, "{}", r.to_text());
    // A corrupt sector is reported once, not again at every later cut.
    let mut seen = std::collections::HashSet::new();
    for v in &r.first_violations {
        if v.kind == ViolationKind::Corrupt {
            assert!(
                seen.insert(v.lba),
                "sector {} reported twice: {}",
                v.lba,
                r.to_text()
            );
        }
    }
}

#[test]
fn a_misdirected_write_changes_a_sector_outside_the_written_set() {
    let model = DeviceModel::load("generic-emmc45").unwrap();
    let r = broken_run(&model, Breakage::Misdirect, 40, 512);
    assert!(r.violations.outside_written > 0, "{}", r.to_text());
    assert!(kinds(&r).contains(&ViolationKind::OutsideWritten));
    assert_eq!(r.violations.corrupt, 0, "{}", r.to_text());
}

#[test]
fn a_reliable_write_landing_without_its_first_sector_is_torn() {
    // Every multi-sector write loses its first sector: a reliable write cut short then
    // lands sectors 1..k but not 0, which is not a prefix (enhanced), and a legacy one
    // lands 15 of its 16 sectors.
    for model in [DeviceModel::load("generic-emmc45").unwrap(), legacy_model()] {
        let r = broken_run(&model, Breakage::SkipFirstSector, 1, 1024);
        assert!(r.violations.torn_reliable > 0, "{}", r.to_text());
    }
}

#[test]
fn durable_writes_survive_the_host_losing_its_page_cache_too() {
    // Store writes the card never synced are dropped at every cut.
    for model in [
        DeviceModel::load("generic-emmc45").unwrap(),
        DeviceModel::load("sandisk-emmc45").unwrap(),
    ] {
        let config = PowerCutConfig {
            lose_unsynced: true,
            ..mem_config(100, 31)
        };
        let r = run(&config, &model).unwrap();
        assert_clean(&r);
        assert!(r.lose_unsynced);
    }
}

#[test]
fn writes_stopped_by_hpi_hold_exactly_the_sectors_the_card_reports() {
    // CORRECTLY_PRG_SECTORS_NUM sectors must be written (durable as the write's mode
    // says), the rest must keep their old data.
    for model in [DeviceModel::load("generic-emmc45").unwrap(), legacy_model()] {
        let config = PowerCutConfig {
            hpi_percent: 30,
            lose_unsynced: true,
            ..mem_config(150, 41)
        };
        let r = run(&config, &model).unwrap();
        assert_clean(&r);
        assert!(r.ops.hpi_interrupts > 50, "{}", r.to_text());
        assert!(r.ops.hpi_sectors_programmed > 0, "{}", r.to_text());
    }
}
