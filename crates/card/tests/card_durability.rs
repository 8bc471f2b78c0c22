//! Cache durability bookkeeping, power loss, HPI, BKOPS.

mod common;

use common::{ext, pattern, Host, RCA_ARG};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use emmc_card::store::{ImageLayout, MemStore, Store, StoreError};
use emmc_card::{r1, Card, CardState, Partition, PowerDown};

const RELIABLE: u32 = 1 << 31;
const FORCED: u32 = 1 << 24;

fn peek(h: &mut Host, lba: u64, blocks: usize) -> Vec<u8> {
    let mut buf = vec![0u8; blocks * 512];
    h.card.peek(Partition::User, lba, &mut buf).unwrap();
    buf
}

fn volatile(h: &Host) -> u64 {
    h.card.volatile_sectors().iter().map(|r| r.1).sum()
}

#[test]
fn cached_writes_are_acknowledged_but_volatile_until_flushed() {
    let mut h = Host::ready(common::model());
    let data = pattern(1, 8);
    h.write(100, &data, 0);
    assert_data_eq!(h.read(100, 8), data, "readable from the cache");
    assert_eq!(h.card.volatile_sectors().len(), 1);
    let runs = h.card.volatile_sectors();
    let abs = h.card.image_sector(Partition::User, 100).unwrap();
    assert_eq!(
        runs,
        vec![(abs, 8)],
        "bookkeeping names exactly the acknowledged sectors"
    );
    h.switch_ok(ext::FLUSH_CACHE, 1);
    assert!(h.card.volatile_sectors().is_empty(), "flushed");
    h.card.power_cycle(h.now, PowerDown::Sudden);
    h.init();
    assert_data_eq!(h.read(100, 8), data, "flushed data survives power loss");
}

#[test]
fn power_loss_drops_exactly_the_non_durable_writes() {
    let mut h = Host::ready(common::model());
    let old = pattern(9, 4);
    h.write(200, &old, FORCED);
    let cached = pattern(2, 4);
    h.write(200, &cached, 0);
    let reliable = pattern(3, 4);
    h.write(300, &reliable, RELIABLE);
    let forced = pattern(4, 4);
    h.write(400, &forced, FORCED);
    assert_eq!(volatile(&h), 4, "only the plain cached write is volatile");
    h.card.power_cycle(h.now, PowerDown::Sudden);
    h.init();
    assert_data_eq!(
        h.read(200, 4),
        old,
        "cached overwrite lost, old durable data intact"
    );
    assert_data_eq!(
        h.read(300, 4),
        reliable,
        "reliable write is durable on completion"
    );
    assert_data_eq!(
        h.read(400, 4),
        forced,
        "forced programming is durable on completion"
    );
}

#[test]
fn writes_with_the_cache_off_are_durable_and_turning_it_off_flushes() {
    let mut h = Host::ready(common::model());
    let a = pattern(5, 2);
    h.write(10, &a, 0);
    assert_eq!(volatile(&h), 2);
    h.switch_ok(ext::CACHE_CTRL, 0);
    assert_eq!(volatile(&h), 0, "cache written back before it reads as off");
    let b = pattern(6, 2);
    h.write(20, &b, 0);
    assert_eq!(volatile(&h), 0, "cache off: written straight through");
    h.card.power_cycle(h.now, PowerDown::Sudden);
    h.init();
    assert_data_eq!(h.read(10, 2), a);
    assert_data_eq!(h.read(20, 2), b);
}

#[test]
fn a_full_cache_destages_oldest_sectors_which_then_are_durable() {
    let mut h = Host::ready(common::model());
    let capacity = h.card.model().cache_blocks();
    assert_eq!(capacity, 1024, "512 KiB cache");
    let first = pattern(7, 64);
    h.write(0, &first, 0);
    for i in 1..=16u64 {
        h.write(i * 64, &pattern(8, 64), 0);
    }
    assert_eq!(volatile(&h), capacity, "cache stays at its capacity");
    assert!(h.card.stats().sectors_destaged >= 64);
    h.card.power_cycle(h.now, PowerDown::Sudden);
    h.init();
    assert_data_eq!(
        h.read(0, 64),
        first,
        "the oldest write was destaged to the medium"
    );
    assert!(
        h.read(16 * 64, 64).iter().all(|&b| b == 0),
        "the newest write was still cached and is lost"
    );
}

#[test]
fn clean_shutdown_and_power_off_notification_write_the_cache_back() {
    let mut h = Host::ready(common::model());
    let a = pattern(11, 4);
    h.write(50, &a, 0);
    h.switch_ok(ext::POWER_OFF_NOTIFICATION, 3);
    assert_eq!(volatile(&h), 0, "POWER_OFF_LONG flushes");
    let b = pattern(12, 4);
    h.write(60, &b, 0);
    h.card.power_cycle(h.now, PowerDown::Clean);
    h.init();
    assert_data_eq!(h.read(50, 4), a);
    assert_data_eq!(h.read(60, 4), b, "clean power-down flushes");
}

/// The generic model programs at 200 µs + 20 µs per block.
fn program_ns(blocks: u64) -> u64 {
    200_000 + 20_000 * blocks
}

fn start_long_write(h: &mut Host, lba: u64, data: &[u8], flags: u32) -> u64 {
    h.r1(23, (data.len() / 512) as u32 | flags);
    h.r1(25, h.addr(lba));
    h.card.write_data(h.now, data).unwrap();
    assert_eq!(h.card.state(), CardState::Prg);
    h.now
}

#[test]
fn hpi_interrupts_a_long_write_and_reports_correctly_programmed_sectors() {
    let mut h = Host::ready(common::model());
    h.switch_ok(ext::CACHE_CTRL, 0);
    let blocks = 1000u64;
    let data = pattern(20, blocks as usize);
    let start = start_long_write(&mut h, 0, &data, 0);
    let busy = program_ns(blocks);
    assert_eq!(h.card.busy_until(), Some(start + busy));
    // CMD13 without the HPI bit in prg: just status, still programming.
    h.now = start + busy / 4;
    let s = h.r1(13, RCA_ARG);
    assert_eq!((s >> 9) & 0xF, 7, "prg");
    assert_eq!(s & r1::READY_FOR_DATA, 0, "busy: not ready for data");
    // HPI (CMD13 with bit 0) at 40 % of the programming time.
    h.now = start + busy * 2 / 5 - 1000;
    let s = h.r1(13, RCA_ARG | 1);
    assert_eq!((s >> 9) & 0xF, 7, "HPI answered in prg");
    let expected = blocks * (h.now - start) / busy;
    h.wait_busy();
    assert_eq!(
        h.card.state(),
        CardState::Tran,
        "back in tran within OUT_OF_INTERRUPT_TIME"
    );
    let e = h.ext_csd();
    let done = u64::from(u32::from_le_bytes(
        e[ext::CORRECTLY_PRG_SECTORS_NUM..ext::CORRECTLY_PRG_SECTORS_NUM + 4]
            .try_into()
            .unwrap(),
    ));
    assert_eq!(done, expected, "CORRECTLY_PRG_SECTORS_NUM");
    assert!(done > 350 && done < 450, "{done}");
    assert_data_eq!(
        peek(&mut h, 0, done as usize),
        data[..done as usize * 512],
        "programmed prefix landed"
    );
    assert!(
        peek(&mut h, done, (blocks - done) as usize)
            .iter()
            .all(|&b| b == 0),
        "the rest did not"
    );
    assert_eq!(h.card.stats().hpi_interrupts, 1);
    // The driver re-issues the remainder from CORRECTLY_PRG_SECTORS_NUM.
    h.write(done, &data[done as usize * 512..], 0);
    assert_data_eq!(peek(&mut h, 0, blocks as usize), data);
}

#[test]
fn hpi_via_cmd12_when_hpi_features_says_so_and_not_when_disabled() {
    let mut model = common::model();
    model.ext_csd.hpi_features = 0x03;
    let mut h = Host::ready(model);
    h.switch_ok(ext::CACHE_CTRL, 0);
    let data = pattern(21, 200);
    let start = start_long_write(&mut h, 0, &data, 0);
    // CMD13 with the HPI bit is only a status request on a CMD12-HPI card.
    h.now = start + 10_000;
    h.r1(13, RCA_ARG | 1);
    assert_eq!(h.card.stats().hpi_interrupts, 0);
    let s = h.r1(12, RCA_ARG | 1);
    assert_eq!((s >> 9) & 0xF, 7);
    assert_eq!(h.card.stats().hpi_interrupts, 1);
    h.wait_busy();
    // HPI_MGMT off: CMD12 in prg is illegal and nothing is interrupted.
    let mut h = Host::ready({
        let mut m = common::model();
        m.ext_csd.hpi_features = 0x03;
        m
    });
    h.switch_ok(ext::HPI_MGMT, 0);
    let start = start_long_write(&mut h, 0, &data, 0);
    h.now = start + 10_000;
    assert_eq!(h.cmd(12, RCA_ARG | 1), None);
    assert_eq!(h.card.stats().hpi_interrupts, 0);
    h.wait_busy();
    assert_data_eq!(peek(&mut h, 0, 200), data, "the write completed");
}

#[test]
fn power_loss_during_programming_lands_a_prefix_and_respects_reliable_granules() {
    // Enhanced reliable write: any whole-sector prefix.
    let mut h = Host::ready(common::model());
    let data = pattern(30, 100);
    let start = start_long_write(&mut h, 0, &data, RELIABLE);
    let at = start + program_ns(100) / 2;
    h.card.power_cycle(at, PowerDown::Sudden);
    h.init();
    let got = peek(&mut h, 0, 100);
    let landed = got
        .chunks(512)
        .take_while(|c| c.iter().any(|&b| b != 0))
        .count();
    assert!(landed > 40 && landed < 60, "{landed}");
    assert_data_eq!(got[..landed * 512], data[..landed * 512]);
    assert!(
        got[landed * 512..].iter().all(|&b| b == 0),
        "no torn sector after the prefix"
    );

    // Legacy reliable write of REL_WR_SEC_C blocks: all or nothing.
    let mut model = common::model();
    model.ext_csd.wr_rel_param = 0x01;
    model.ext_csd.rel_wr_sec_c = 16;
    let mut h = Host::ready(model);
    let data = pattern(31, 16);
    let start = start_long_write(&mut h, 32, &data, RELIABLE);
    h.card
        .power_cycle(start + program_ns(16) * 9 / 10, PowerDown::Sudden);
    h.init();
    assert!(
        peek(&mut h, 32, 16).iter().all(|&b| b == 0),
        "interrupted legacy reliable write is atomic"
    );
    let start = start_long_write(&mut h, 32, &data, RELIABLE);
    h.card
        .power_cycle(start + program_ns(16), PowerDown::Sudden);
    h.init();
    assert_data_eq!(
        peek(&mut h, 32, 16),
        data,
        "completed before the cut: durable"
    );
}

#[test]
fn bkops_levels_follow_background_work_and_urgent_bkops_raises_the_exception() {
    let mut h = Host::ready(common::model());
    h.switch_ok(ext::CACHE_CTRL, 0);
    assert_eq!(h.ext_csd()[ext::BKOPS_STATUS], 0);
    // 2 µs of debt per programmed block: 25 000 blocks = 50 ms = level 1.
    let chunk = pattern(40, 2500);
    for i in 0..10u64 {
        h.write(i * 2500, &chunk, 0);
    }
    assert_eq!(h.card.bkops_outstanding_ns(), 50_000_000);
    let e = h.ext_csd();
    assert_eq!(e[ext::BKOPS_STATUS], 1);
    assert_eq!(h.status() & r1::EXCEPTION_EVENT, 0, "level 1 is not urgent");
    h.card.add_background_work(150_000_000);
    let e = h.ext_csd();
    assert_eq!(e[ext::BKOPS_STATUS], 2);
    assert_eq!(e[ext::EXCEPTION_EVENTS_STATUS] & 0x01, 0x01, "URGENT_BKOPS");
    assert_ne!(
        h.status() & r1::EXCEPTION_EVENT,
        0,
        "URGENT_BKOPS is always reported"
    );
    // BKOPS_START: busy for the outstanding work; HPI stops it part-way.
    let s = h.r1(6, 0x0300_0000 | (u32::from(ext::BKOPS_START) << 16) | 0x100);
    assert_eq!(s & r1::ERRORS, 0);
    let start = h.now;
    assert_eq!(h.card.busy_until(), Some(start + 100_000 + 200_000_000));
    h.now = start + 150_000_000;
    h.r1(13, RCA_ARG | 1);
    let worked = h.now - start - 100_000; // after the 100 µs CMD6 overhead
    h.wait_busy();
    let left = h.card.bkops_outstanding_ns();
    assert_eq!(left, 200_000_000 - worked, "HPI kept the unfinished work");
    assert_eq!(h.ext_csd()[ext::BKOPS_STATUS], 1);
    assert_eq!(h.status() & r1::EXCEPTION_EVENT, 0, "no longer urgent");
    // Run BKOPS to completion.
    h.r1b(6, 0x0300_0000 | (u32::from(ext::BKOPS_START) << 16) | 0x100);
    assert_eq!(h.card.bkops_outstanding_ns(), 0);
    assert_eq!(h.ext_csd()[ext::BKOPS_STATUS], 0);
}

#[test]
fn bkops_start_needs_bkops_en() {
    let mut h = Host::new(common::model());
    h.init_without_bkops();
    let s = h.switch(ext::BKOPS_START, 1);
    assert_ne!(s & r1::SWITCH_ERROR, 0);
}

/// A MemStore that counts data bytes written since the last `sync()`; with
/// `flush_only` it syncs only at `sync()`, not at `sync_program()` (what `serve
/// --image-sync flush` sets on the image).
struct SyncWatch {
    inner: MemStore,
    unsynced: Arc<AtomicU64>,
    flush_only: bool,
}

impl Store for SyncWatch {
    fn layout(&self) -> ImageLayout {
        self.inner.layout()
    }
    fn read_at(&mut self, offset: u64, buf: &mut [u8]) -> Result<(), StoreError> {
        self.inner.read_at(offset, buf)
    }
    fn write_at(&mut self, offset: u64, buf: &[u8]) -> Result<(), StoreError> {
        self.unsynced.fetch_add(buf.len() as u64, Ordering::SeqCst);
        self.inner.write_at(offset, buf)
    }
    fn fill(&mut self, offset: u64, len: u64, byte: u8) -> Result<(), StoreError> {
        self.inner.fill(offset, len, byte)
    }
    fn sync(&mut self) -> Result<(), StoreError> {
        self.unsynced.store(0, Ordering::SeqCst);
        self.inner.sync()
    }
    fn sync_program(&mut self) -> Result<(), StoreError> {
        if self.flush_only {
            Ok(())
        } else {
            self.sync()
        }
    }
    fn load_card_state(&self) -> Option<toml::Table> {
        self.inner.load_card_state()
    }
    fn save_card_state(&mut self, state: &toml::Table) -> Result<(), StoreError> {
        self.inner.save_card_state(state)
    }
}

/// A card brought up on a [`SyncWatch`] store, and the store's unsynced byte count.
fn watched_host(flush_only: bool) -> (Host, Arc<AtomicU64>) {
    let model = common::model();
    let unsynced = Arc::new(AtomicU64::new(0));
    let store = SyncWatch {
        inner: MemStore::new(Card::layout_for(&model)),
        unsynced: unsynced.clone(),
        flush_only,
    };
    let mut h = Host {
        card: Card::new(model, Box::new(store)).unwrap(),
        now: 0,
    };
    h.init();
    (h, unsynced)
}

#[test]
fn writes_acknowledged_as_durable_are_synced_to_the_image() {
    // Found by `simulate --workload power-cut --lose-unsynced`: reliable writes, forced
    // programming and writes with the cache off reached the image with pwrite only, so a
    // host power loss could take acknowledged durable data with the page cache.
    let (mut h, unsynced) = watched_host(false);
    let pending = || unsynced.load(Ordering::SeqCst);
    h.write(100, &pattern(1, 4), 0);
    assert_eq!(pending(), 0, "a cached write does not touch the image");
    h.write(200, &pattern(2, 4), RELIABLE);
    assert_eq!(pending(), 0, "reliable write synced when acknowledged");
    h.write(300, &pattern(3, 4), FORCED);
    assert_eq!(pending(), 0, "forced programming synced when acknowledged");
    h.switch_ok(ext::CACHE_CTRL, 0);
    h.write(400, &pattern(4, 4), 0);
    assert_eq!(
        pending(),
        0,
        "cache off: every write synced when acknowledged"
    );
}

/// `serve --image-sync flush`: the card asks the store to sync a durable program through
/// `sync_program`, which such a store defers to the next flush; FLUSH_CACHE still syncs.
#[test]
fn a_store_that_syncs_only_at_flushes_is_synced_by_flush_cache() {
    let (mut h, unsynced) = watched_host(true);
    let pending = || unsynced.load(Ordering::SeqCst);
    h.write(200, &pattern(2, 4), RELIABLE);
    assert_eq!(
        pending(),
        4 * 512,
        "the reliable write is in the image, not yet synced"
    );
    h.switch_ok(ext::FLUSH_CACHE, 1);
    assert_eq!(pending(), 0, "FLUSH_CACHE syncs it");
    assert_eq!(peek(&mut h, 200, 4), pattern(2, 4));
}

#[test]
fn rst_n_resets_the_card_only_once_rst_n_function_enables_it() {
    let mut h = Host::ready(common::model());
    let data = pattern(7, 4);
    h.write(500, &data, 0);
    assert!(
        !h.card.hardware_reset(h.now),
        "RST_n_FUNCTION 0: the signal is ignored"
    );
    assert_eq!(h.card.state(), CardState::Tran, "still selected");
    assert_eq!(volatile(&h), 4, "the cache is untouched");
    h.switch_ok(emmc_card::ext_csd::RST_N_FUNCTION as u8, 1);
    assert!(h.card.hardware_reset(h.now), "RST_n_FUNCTION 1: reset");
    assert_eq!(h.card.state(), CardState::Idle);
    assert_eq!(volatile(&h), 0, "the cache went with the reset");
    h.init();
    assert_eq!(h.read(500, 4), vec![0u8; 4 * 512], "never written back");
}
