//! The block driver against the in-process SDHCI model and card: command shapes as Linux
//! sends them, every policy, and hostile requests.

use super::special::{
    ERASE_TIMEOUT_UNIT_MS, MMC_DISCARD_ARG, MMC_SECURE_ERASE_ARG, MMC_SECURE_TRIM1_ARG,
    MMC_SECURE_TRIM2_ARG, MMC_TRIM_ARG,
};
use super::*;
use crate::iosched::{CfqTunables, Elevator};
use crate::mmc::{HostCaps, MmcError, MmcHost, MMC_CMD23_ARG_PACKED, MMC_CMD23_ARG_REL_WR};
use crate::packing::{BlkOp, PackingMode, StopReason};
use crate::sdhci::{
    CommandOutcome, DmaSegment, IntStatus, MmcIos, MmcRequest, SdhciCompletion, SdhciConfig,
    SdhciError,
};
use crate::testing::drain;
use emmc_card::ext_csd as ext;
use emmc_card::model::DeviceModel;
use emmc_card::store::{MemStore, NullStore};
use emmc_card::Card;

const MS: Nanos = 1_000_000;

/// One MMC request as the host saw it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Rec {
    sbc: Option<u32>,
    opcode: u8,
    arg: u32,
    blocks: u32,
    stop: bool,
}

/// An `MmcHostOps` that records every request and can fail the next data requests with
/// a data CRC error before they reach the card.
struct Recorder {
    inner: MmcHost,
    log: Vec<Rec>,
    fail_data: u32,
}

impl Recorder {
    fn record<S: DmaSegment>(&mut self, mrq: &MmcRequest<'_, S>) -> Option<SdhciCompletion> {
        self.log.push(Rec {
            sbc: mrq.sbc.map(|c| c.arg),
            opcode: mrq.cmd.opcode,
            arg: mrq.cmd.arg,
            blocks: mrq.data.as_ref().map_or(0, |d| d.blocks),
            stop: mrq.stop.is_some(),
        });
        if mrq.data.is_some() && self.fail_data > 0 && mrq.cmd.opcode != 8 {
            self.fail_data -= 1;
            let now = self.inner.now;
            let ok = |opcode| CommandOutcome {
                opcode,
                issued: true,
                auto: false,
                resp: [0x900, 0, 0, 0],
                error: None,
            };
            return Some(SdhciCompletion {
                sbc: mrq.sbc.map(|c| ok(c.opcode)),
                cmd: ok(mrq.cmd.opcode),
                stop: None,
                data_error: Some(SdhciError::DataCrc),
                bytes_xfered: 0,
                int_status: IntStatus::default(),
                auto_cmd_err: 0,
                adma_err: 0,
                start_ns: now,
                end_ns: now,
                busy_pending: false,
            });
        }
        None
    }

    fn data(&self) -> Vec<Rec> {
        self.log
            .iter()
            .copied()
            .filter(|r| matches!(r.opcode, 17 | 18 | 24 | 25))
            .collect()
    }

    fn clear(&mut self) {
        self.log.clear();
    }
}

impl MmcHostOps for Recorder {
    fn now(&self) -> Nanos {
        self.inner.now()
    }
    fn idle_until(&mut self, t: Nanos) {
        self.inner.idle_until(t)
    }
    fn request<S: DmaSegment>(&mut self, mrq: MmcRequest<'_, S>) -> SdhciCompletion {
        if let Some(c) = self.record(&mrq) {
            return c;
        }
        MmcHostOps::request(&mut self.inner, mrq)
    }
    fn start_request<S: DmaSegment>(&mut self, mrq: MmcRequest<'_, S>) -> SdhciCompletion {
        if let Some(c) = self.record(&mrq) {
            return c;
        }
        self.inner.start_request(mrq)
    }
    fn busy_until(&self) -> Option<Nanos> {
        self.inner.busy_until()
    }
    fn wait_busy_until(&mut self, deadline: Option<Nanos>) -> bool {
        self.inner.wait_busy_until(deadline)
    }
    fn set_ios(&mut self, ios: MmcIos) {
        MmcHostOps::set_ios(&mut self.inner, ios)
    }
    fn ios(&self) -> MmcIos {
        MmcHostOps::ios(&self.inner)
    }
    fn execute_tuning(&mut self) -> Result<u32, crate::sdhci::TuningError> {
        MmcHostOps::execute_tuning(&mut self.inner)
    }
    fn max_busy_timeout_ms(&self) -> u32 {
        self.inner.max_busy_timeout_ms()
    }
}

fn model(name: &str) -> DeviceModel {
    DeviceModel::load(name).unwrap()
}

fn mem_host(m: &DeviceModel) -> MmcHost {
    let layout = Card::layout_for(m);
    let card = Card::new(m.clone(), Box::new(MemStore::new(layout))).unwrap();
    MmcHost::with_config(card, SdhciConfig::for_model(&m.host))
}

fn null_host(m: &DeviceModel) -> MmcHost {
    let layout = Card::layout_for(m);
    let card = Card::new(m.clone(), Box::new(NullStore::new(layout))).unwrap();
    MmcHost::with_config(card, SdhciConfig::for_model(&m.host))
}

fn quiet(cfg: BlkConfig) -> BlkConfig {
    BlkConfig {
        bkops: BkopsPolicy {
            enabled: false,
            ..Default::default()
        },
        elevator: Elevator::Noop,
        ..cfg
    }
}

fn recorded(m: &DeviceModel, cfg: BlkConfig) -> MmcBlk<Recorder> {
    let host = Recorder {
        inner: mem_host(m),
        log: Vec::new(),
        fail_data: 0,
    };
    let mut d = MmcBlk::probe(host, cfg).unwrap();
    d.host_mut().clear();
    d
}

fn req(id: u64, op: BlkOp, lba: u64, sectors: u32) -> BlkRequest {
    BlkRequest::new(id, op, lba, sectors)
}

fn write_fua(id: u64, lba: u64, sectors: u32) -> BlkRequest {
    BlkRequest {
        fua: true,
        sync: true,
        ..req(id, BlkOp::Write, lba, sectors)
    }
}

#[test]
fn bring_up_follows_the_host_capabilities_and_enables_what_the_card_has() {
    let m = model("msm-emmc45-ddr50");
    let d = MmcBlk::probe(null_host(&m), quiet(BlkConfig::for_model(&m.host))).unwrap();
    let ios = MmcHostOps::ios(d.host());
    assert_eq!((ios.bus_width, ios.timing), (8, BusTimingAlias::Ddr52));
    let e = &d.card().ext_csd;
    assert_eq!(e[ext::CACHE_CTRL] & ext::CACHE_EN, ext::CACHE_EN);
    assert_eq!(e[ext::HPI_MGMT] & ext::HPI_EN, ext::HPI_EN);
    assert_eq!(
        e[ext::BKOPS_EN] & ext::BKOPS_MANUAL_EN,
        ext::BKOPS_MANUAL_EN
    );
    assert_ne!(
        u16::from(e[ext::EXCEPTION_EVENTS_CTRL]) & ext::EE_PACKED_FAILURE,
        0
    );
    // A host with 4 lines, no DDR and no cache capability.
    let caps = HostCaps {
        bus_width: 4,
        ddr: false,
        cache: false,
        ..HostCaps::for_model(&m.host)
    };
    let d = MmcBlk::probe(
        null_host(&m),
        quiet(BlkConfig {
            caps,
            ..BlkConfig::for_model(&m.host)
        }),
    )
    .unwrap();
    let ios = MmcHostOps::ios(d.host());
    assert_eq!((ios.bus_width, ios.timing), (4, BusTimingAlias::Hs));
    assert_eq!(d.card().ext_csd[ext::CACHE_CTRL] & ext::CACHE_EN, 0);
}

use emmc_card::model::BusTiming as BusTimingAlias;

#[test]
fn reads_and_writes_are_closed_ended_with_cmd23_and_writes_are_checked_with_cmd13() {
    let m = model("generic-emmc45");
    let mut d = recorded(&m, quiet(BlkConfig::default()));
    d.submit(req(1, BlkOp::Write, 1000, 16), 0);
    d.submit(req(2, BlkOp::Read, 5000, 8), 0);
    d.submit(req(3, BlkOp::Write, 9000, 1), 0);
    d.submit(req(4, BlkOp::Read, 9000, 1), 0);
    let done = drain(&mut d);
    assert_eq!(done.len(), 4);
    assert!(done.iter().all(|c| c.result.is_ok()));
    let data = d.host().data();
    assert_eq!(
        data.iter()
            .map(|r| (r.sbc, r.opcode, r.blocks))
            .collect::<Vec<_>>(),
        vec![
            (Some(16), 25, 16),
            (Some(8), 18, 8),
            (None, 24, 1),
            (None, 17, 1)
        ]
    );
    // Every write is followed by a CMD13 before the next data command.
    let log = &d.host().log;
    for (i, r) in log.iter().enumerate() {
        if matches!(r.opcode, 24 | 25) {
            assert_eq!(log[i + 1].opcode, 13, "{log:?}");
        }
    }
}

#[test]
fn open_ended_transfers_stop_with_cmd12() {
    let m = model("generic-emmc45");
    let mut d = recorded(
        &m,
        quiet(BlkConfig {
            cmd23: false,
            ..BlkConfig::default()
        }),
    );
    d.submit(req(1, BlkOp::Write, 1000, 16), 0);
    d.submit(req(2, BlkOp::Read, 1000, 16), 0);
    assert!(drain(&mut d).iter().all(|c| c.result.is_ok()));
    let data = d.host().data();
    assert!(data.iter().all(|r| r.sbc.is_none() && r.stop));
    assert_eq!(
        data.iter().map(|r| r.opcode).collect::<Vec<_>>(),
        vec![25, 18]
    );
}

#[test]
fn fua_is_an_enhanced_reliable_write_in_one_request() {
    let m = model("generic-emmc45");
    assert_ne!(m.ext_csd.wr_rel_param & ext::EN_REL_WR, 0);
    let mut d = recorded(&m, quiet(BlkConfig::default()));
    d.submit(write_fua(1, 4, 20), 0);
    assert!(drain(&mut d)[0].result.is_ok());
    let data = d.host().data();
    assert_eq!(data.len(), 1);
    assert_eq!(data[0].sbc, Some(MMC_CMD23_ARG_REL_WR | 20));
    assert_eq!(d.stats().reliable_writes, 1);
    assert_eq!(d.stats().flushes, 0, "a reliable write needs no flush");
}

#[test]
fn legacy_reliable_write_is_split_as_linux_splits_it() {
    let mut m = model("generic-emmc45");
    m.ext_csd.wr_rel_param &= !ext::EN_REL_WR;
    m.ext_csd.rel_wr_sec_c = 8;
    let mut d = recorded(&m, quiet(BlkConfig::default()));
    // Sectors 4..24: 4 unaligned single blocks, then 8 and 8.
    d.submit(write_fua(1, 4, 20), 0);
    let done = drain(&mut d);
    assert_eq!(done.len(), 1, "one completion for the whole request");
    assert!(done[0].result.is_ok(), "{:?}", done[0].result);
    let pieces: Vec<(u32, u32)> = d
        .host()
        .data()
        .iter()
        .map(|r| (r.arg, r.sbc.unwrap() & !MMC_CMD23_ARG_REL_WR))
        .collect();
    assert_eq!(
        pieces,
        vec![(4, 1), (5, 1), (6, 1), (7, 1), (8, 8), (16, 8)]
    );
    assert!(d
        .host()
        .data()
        .iter()
        .all(|r| r.sbc.unwrap() & MMC_CMD23_ARG_REL_WR != 0));
    // Fewer than REL_WR_SEC_C blocks at an aligned address go one at a time.
    d.host_mut().clear();
    d.submit(write_fua(2, 32, 3), 0);
    drain(&mut d);
    assert_eq!(d.host().data().len(), 3);
}

#[test]
fn fua_without_reliable_write_is_followed_by_a_cache_flush() {
    let mut m = model("msm-emmc45-sdr50");
    m.ext_csd.wr_rel_param &= !ext::EN_REL_WR;
    m.ext_csd.rel_wr_sec_c = 0;
    let mut d = recorded(&m, quiet(BlkConfig::for_model(&m.host)));
    d.submit(write_fua(1, 64, 16), 0);
    assert!(drain(&mut d)[0].result.is_ok());
    assert_eq!(d.host().data()[0].sbc, Some(16), "no reliable write bit");
    let last = d
        .host()
        .log
        .iter()
        .rev()
        .find(|r| r.opcode == 6)
        .copied()
        .unwrap();
    assert_eq!((last.arg >> 16) & 0xFF, ext::FLUSH_CACHE as u32);
    assert_eq!(d.stats().flushes, 1);
}

#[test]
fn flush_is_flush_cache_and_empties_the_volatile_cache() {
    let m = model("msm-emmc45-sdr50");
    let mut d = MmcBlk::probe(mem_host(&m), quiet(BlkConfig::for_model(&m.host))).unwrap();
    d.submit(req(1, BlkOp::Write, 64, 16), 0);
    drain(&mut d);
    assert!(!d.host().card.volatile_sectors().is_empty());
    d.submit(
        BlkRequest {
            sync: true,
            ..req(2, BlkOp::Flush, 0, 0)
        },
        d.now(),
    );
    assert!(drain(&mut d)[0].result.is_ok());
    assert!(d.host().card.volatile_sectors().is_empty());
    assert_eq!(d.stats().flushes, 1);
}

fn erase_cmds(log: &[Rec]) -> Vec<(u32, u32, u32)> {
    let mut out = Vec::new();
    for w in log.windows(3) {
        if w[0].opcode == 35 && w[1].opcode == 36 && w[2].opcode == 38 {
            out.push((w[0].arg, w[1].arg, w[2].arg));
        }
    }
    out
}

#[test]
fn discard_uses_the_45_discard_argument_on_exactly_the_sectors() {
    let m = model("generic-emmc45");
    let mut d = recorded(&m, quiet(BlkConfig::default()));
    d.submit(req(1, BlkOp::Discard, 100, 50), 0);
    assert!(drain(&mut d)[0].result.is_ok());
    assert_eq!(erase_cmds(&d.host().log), vec![(100, 149, MMC_DISCARD_ARG)]);
}

#[test]
fn secure_erase_is_group_aligned_or_secure_trim_and_refused_without_support() {
    let mut m = model("generic-emmc45");
    let g = u32::from(m.ext_csd.hc_erase_grp_size) * 1024;
    // With trim: an unaligned range is secure-trimmed (steps 1 and 2).
    let mut d = recorded(&m, quiet(BlkConfig::default()));
    d.submit(req(1, BlkOp::SecureErase, 100, 50), 0);
    assert!(drain(&mut d)[0].result.is_ok());
    let cmds = erase_cmds(&d.host().log);
    assert_eq!(cmds[0], (100, 149, MMC_SECURE_TRIM1_ARG));
    assert_eq!(cmds[1].2, MMC_SECURE_TRIM2_ARG);
    // Without trim: secure erase shrunk to whole erase groups.
    m.ext_csd.sec_feature_support = ext::SECURE_ER_EN;
    let mut d = recorded(&m, quiet(BlkConfig::default()));
    d.submit(req(2, BlkOp::SecureErase, 100, 3 * g), 0);
    assert!(drain(&mut d)[0].result.is_ok());
    assert_eq!(
        erase_cmds(&d.host().log),
        vec![(g, 3 * g - 1, MMC_SECURE_ERASE_ARG)]
    );
    // A range holding no whole group erases nothing and succeeds.
    d.host_mut().clear();
    d.submit(req(3, BlkOp::SecureErase, 1, 10), d.now());
    assert!(drain(&mut d)[0].result.is_ok());
    assert!(erase_cmds(&d.host().log).is_empty());
    // Without secure erase: refused.
    m.ext_csd.sec_feature_support = 0;
    let mut d = recorded(&m, quiet(BlkConfig::default()));
    d.submit(req(4, BlkOp::SecureErase, 0, 8), 0);
    assert_eq!(
        drain(&mut d)[0].result,
        Err(BlkError::NotSupported(BlkOp::SecureErase))
    );
}

#[test]
fn a_long_discard_is_split_so_each_cmd38_fits_the_busy_timeout() {
    let m = model("generic-emmc45");
    let mut d = recorded(&m, quiet(BlkConfig::default()));
    let g = 1024 * u64::from(m.ext_csd.hc_erase_grp_size);
    let per_group = ERASE_TIMEOUT_UNIT_MS * u64::from(m.ext_csd.trim_mult.max(1));
    let max_groups = u64::from(d.host().max_busy_timeout_ms()) / per_group;
    assert!(max_groups >= 1);
    let sectors = (3 * max_groups + 1) * g;
    d.submit(req(1, BlkOp::Discard, 0, sectors as u32), 0);
    assert!(drain(&mut d)[0].result.is_ok());
    let cmds = erase_cmds(&d.host().log);
    assert_eq!(cmds.len(), 4);
    for (from, to, _) in &cmds {
        assert!(u64::from(to - from + 1) <= max_groups * g);
    }
}

#[test]
fn write_zeroes_trims_when_erased_memory_reads_zero() {
    let m = model("generic-emmc45");
    assert_eq!(m.ext_csd.erased_mem_cont, 0);
    let mut d = recorded(&m, quiet(BlkConfig::default()));
    d.submit(req(1, BlkOp::WriteZeroes, 64, 16), 0);
    assert!(drain(&mut d)[0].result.is_ok());
    assert_eq!(erase_cmds(&d.host().log), vec![(64, 79, MMC_TRIM_ARG)]);
    assert!(d.host().data().is_empty());
}

fn pattern_host(m: &DeviceModel, lba: u64, sectors: usize) -> MmcHost {
    let mut h = mem_host(m);
    h.mmc_init_card(&HostCaps::for_model(&m.host)).unwrap();
    h.mmc_write_blocks(lba, &vec![0xA5; sectors * 512], 0)
        .unwrap();
    if m.ext_csd.cache_size > 0 {
        h.mmc_flush_cache().unwrap();
    }
    h
}

#[test]
fn packed_writes_carry_a_header_and_every_entry_lands() {
    let m = model("msm-emmc45-sdr50");
    let cfg = quiet(BlkConfig {
        packing: PackingMode::Always,
        ..BlkConfig::for_model(&m.host)
    });
    let h = pattern_host(&m, 0, 512);
    let mut d = MmcBlk::probe(
        Recorder {
            inner: h,
            log: Vec::new(),
            fail_data: 0,
        },
        cfg,
    )
    .unwrap();
    d.host_mut().clear();
    // Four non-contiguous writes queued at once: one fetched alone, then three packed.
    for (i, lba) in [0u64, 100, 200, 300].iter().enumerate() {
        d.submit(req(i as u64 + 1, BlkOp::Write, *lba, 16), 0);
    }
    let done = drain(&mut d);
    assert_eq!(done.len(), 4);
    assert!(done.iter().all(|c| c.result.is_ok()));
    let data = d.host().data();
    let packed: Vec<&Rec> = data
        .iter()
        .filter(|r| r.sbc.is_some_and(|a| a & MMC_CMD23_ARG_PACKED != 0))
        .collect();
    assert_eq!(packed.len(), 1, "{data:?}");
    let entries = d.stats().write_packing.entries.clone();
    let n = *entries.keys().max().unwrap() as u32;
    assert!(n >= 2);
    assert_eq!(packed[0].sbc, Some(MMC_CMD23_ARG_PACKED | (n * 16 + 1)));
    assert_eq!(packed[0].blocks, n * 16 + 1, "header block + data");
    assert_eq!(d.stats().packed_writes, 1);
    // Every entry landed: the pattern is gone.
    let mut back = vec![0u8; 16 * 512];
    for lba in [0u64, 100, 200, 300] {
        d.host_mut().inner.mmc_read_blocks(lba, &mut back).unwrap();
        assert!(back.iter().all(|&b| b == 0), "entry at {lba}");
    }
}

#[test]
fn packing_stats_count_every_attempt_like_seed_000() {
    let m = model("msm-emmc45-sdr50");
    let cfg = quiet(BlkConfig {
        packing: PackingMode::Always,
        ..BlkConfig::for_model(&m.host)
    });
    let mut d = MmcBlk::probe(null_host(&m), cfg).unwrap();
    // A write alone (1 entry, empty queue), then a read stops a pack (wrong direction).
    d.submit(req(1, BlkOp::Write, 0, 16), 0);
    drain(&mut d);
    for i in 0..3 {
        d.submit(req(10 + i, BlkOp::Write, 1000 + i * 100, 16), d.now());
    }
    d.submit(req(20, BlkOp::Read, 50_000, 16), d.now());
    drain(&mut d);
    let s = &d.stats().write_packing;
    assert_eq!(s.entries.get(&1), Some(&1), "{s:?}");
    assert_eq!(s.entries.get(&3), Some(&1), "{s:?}");
    assert_eq!(s.stop_reasons.get(&StopReason::EmptyQueue), Some(&1));
    assert_eq!(s.stop_reasons.get(&StopReason::WrongDirection), Some(&1));
    assert!(
        d.stats().read_packing.entries.is_empty(),
        "reads are not counted without packed reads"
    );
}

#[test]
fn write_packing_control_keeps_packing_off_while_reads_come_between_writes() {
    let m = model("msm-emmc45-sdr50");
    let run = |mode| {
        let cfg = quiet(BlkConfig {
            packing: mode,
            ..BlkConfig::for_model(&m.host)
        });
        let mut d = MmcBlk::probe(null_host(&m), cfg).unwrap();
        // Rounds of 4 writes then a read: never more than 4 writes between reads.
        for round in 0..10u64 {
            for i in 0..4 {
                d.submit(
                    req(round * 10 + i, BlkOp::Write, round * 1000 + i * 64, 16),
                    d.now(),
                );
            }
            d.submit(
                req(round * 10 + 9, BlkOp::Read, 900_000 + round * 64, 16),
                d.now(),
            );
            drain(&mut d);
        }
        // Then a long run of writes alone.
        for i in 0..40u64 {
            d.submit(req(500 + i, BlkOp::Write, 200_000 + i * 64, 16), d.now());
        }
        drain(&mut d);
        d.stats().packed_writes
    };
    let controlled_before = {
        let cfg = quiet(BlkConfig {
            packing: PackingMode::Controlled { threshold: 17 },
            ..BlkConfig::for_model(&m.host)
        });
        let mut d = MmcBlk::probe(null_host(&m), cfg).unwrap();
        for round in 0..10u64 {
            for i in 0..4 {
                d.submit(
                    req(round * 10 + i, BlkOp::Write, round * 1000 + i * 64, 16),
                    d.now(),
                );
            }
            d.submit(
                req(round * 10 + 9, BlkOp::Read, 900_000 + round * 64, 16),
                d.now(),
            );
            drain(&mut d);
        }
        d.stats().packed_writes
    };
    assert_eq!(controlled_before, 0, "reads keep the count below 17");
    assert!(run(PackingMode::Always) > run(PackingMode::Controlled { threshold: 17 }));
    assert!(
        run(PackingMode::Controlled { threshold: 17 }) > 0,
        "40 writes alone turn packing on"
    );
    assert_eq!(run(PackingMode::Off), 0);
}

/// Write packing control switching within one run (seed 000's design): every read burst
/// turns packing off and resets the count; every write run longer than the threshold
/// turns it on again when its 18th write is fetched (the count must pass 17), so each
/// cycle sends 17 writes alone and packs the 18th with the rest.
#[test]
fn write_packing_control_switches_on_for_each_long_write_run_and_off_at_each_read_burst() {
    let m = model("msm-emmc45-sdr50");
    let cfg = quiet(BlkConfig {
        packing: PackingMode::Controlled { threshold: 17 },
        ..BlkConfig::for_model(&m.host)
    });
    let mut d = MmcBlk::probe(null_host(&m), cfg).unwrap();
    let mut id = 0;
    let mut next = |op, lba| {
        id += 1;
        req(id, op, lba, 128)
    };
    let mut previous = d.stats().clone();
    for cycle in 0..5u64 {
        // A run of 40 queued 64 KiB writes...
        let base = cycle * 100_000;
        for i in 0..40 {
            let r = next(BlkOp::Write, base + i * 128);
            d.submit(r, d.now());
        }
        drain(&mut d);
        assert!(
            d.packing_control().wr_packing_enabled,
            "cycle {cycle}: 40 writes turn packing on"
        );
        // ... then a burst of 4 reads.
        for i in 0..4 {
            let r = next(BlkOp::Read, 5_000_000 + base + i * 128);
            d.submit(r, d.now());
        }
        drain(&mut d);
        assert!(
            !d.packing_control().wr_packing_enabled,
            "cycle {cycle}: a read turns packing off"
        );
        let s = d.stats();
        let packed = s.packed_writes - previous.packed_writes;
        let requests = s.mmc_requests - previous.mmc_requests;
        // 4 reads, the writes fetched before the count passed 17 (one at a time), and
        // the packed commands holding the rest.
        let alone = requests - 4 - packed;
        assert!(packed > 0, "cycle {cycle}: the write run was packed");
        assert_eq!(
            alone, 17,
            "cycle {cycle}: writes sent alone before packing came on ({packed} packed)"
        );
        previous = s.clone();
    }
}

#[test]
fn the_pipeline_hides_preparation_behind_the_previous_transfer() {
    let m = model("msm-emmc45-sdr50");
    let time = |pipeline| {
        let cfg = quiet(BlkConfig {
            pipeline,
            prepare_ns: 500_000,
            ..BlkConfig::for_model(&m.host)
        });
        let mut d = MmcBlk::probe(null_host(&m), cfg).unwrap();
        let t0 = d.now();
        for i in 0..20u64 {
            d.submit(req(i, BlkOp::Write, i * 128, 128), t0);
        }
        let done = drain(&mut d);
        done.iter().map(|c| c.at).max().unwrap() - t0
    };
    let (with, without) = (time(true), time(false));
    // 19 of the 20 preparations overlap a transfer (each transfer is longer than 0.5 ms).
    let saved = without - with;
    assert!(
        (19 * 500_000..=20 * 500_000).contains(&saved),
        "saved {saved} ns"
    );
}

/// A model whose writes program straight to NAND for a long time (cache off).
fn slow_write_model() -> DeviceModel {
    let mut m = model("msm-emmc45-sdr50");
    m.ext_csd.cache_size = 0;
    m
}

#[test]
fn hpi_interrupts_a_long_write_for_a_read_and_requeues_the_rest() {
    let m = slow_write_model();
    let cfg = BlkConfig {
        hpi: HpiPolicy {
            enabled: true,
            min_write_sectors: 128,
            min_wait_ns: 0,
        },
        elevator: Elevator::Cfq(CfqTunables::default()),
        ..quiet(BlkConfig::for_model(&m.host))
    };
    let h = pattern_host(&m, 10_000, 1024);
    let mut d = MmcBlk::probe(h, cfg).unwrap();
    let t0 = d.now();
    d.submit(req(1, BlkOp::Write, 10_000, 1024), t0);
    // Run into the programming of the write, then a read arrives.
    let st = d.advance(t0 + MS);
    assert_eq!(st, Advance::Reached);
    let arrive = d.now().max(t0 + MS);
    d.submit(
        BlkRequest {
            ioc: 1,
            ..req(2, BlkOp::Read, 500_000, 8)
        },
        arrive,
    );
    let done = drain(&mut d);
    assert_eq!(d.stats().hpi, 1);
    assert!(d.stats().hpi_requeued_sectors > 0);
    let read_done = done.iter().find(|c| c.req.id == 2).unwrap().at;
    let write_done = done
        .iter()
        .filter(|c| c.req.op == BlkOp::Write)
        .map(|c| c.at)
        .max()
        .unwrap();
    assert!(
        read_done < write_done,
        "the read went before the rest of the write"
    );
    let first_write_piece = done.iter().find(|c| c.req.id == 1).unwrap().at;
    assert!(
        read_done < first_write_piece + 10 * MS,
        "the read waited only for the interrupted piece"
    );
    // Every sector of the write completed, in parts.
    let written: u32 = done
        .iter()
        .filter(|c| c.req.op == BlkOp::Write)
        .map(|c| c.req.sectors)
        .sum();
    assert_eq!(written, 1024);
    let mut back = vec![0u8; 1024 * 512];
    d.host_mut().mmc_read_blocks(10_000, &mut back).unwrap();
    assert!(back.iter().all(|&b| b == 0), "the whole write landed");
    // Without the policy the read waits for the whole write.
    let cfg = quiet(BlkConfig::for_model(&m.host));
    let mut d = MmcBlk::probe(null_host(&m), cfg).unwrap();
    let t0 = d.now();
    d.submit(req(1, BlkOp::Write, 10_000, 1024), t0);
    d.advance(t0 + MS);
    d.submit(req(2, BlkOp::Read, 500_000, 8), d.now().max(t0 + MS));
    let done = drain(&mut d);
    assert_eq!(d.stats().hpi, 0);
    let w = done.iter().find(|c| c.req.id == 1).unwrap().at;
    let r = done.iter().find(|c| c.req.id == 2).unwrap().at;
    assert!(w < r);
}

fn bkops_cfg(m: &DeviceModel) -> BlkConfig {
    BlkConfig {
        bkops: BkopsPolicy {
            enabled: true,
            idle_ns: 50 * MS,
            min_level: 1,
        },
        elevator: Elevator::Noop,
        ..BlkConfig::for_model(&m.host)
    }
}

#[test]
fn bkops_starts_after_idle_time_and_a_request_stops_it_with_hpi() {
    let m = model("msm-emmc45-sdr50");
    let mut d = MmcBlk::probe(null_host(&m), bkops_cfg(&m)).unwrap();
    let level1 = m.timing.as_flash().unwrap().bkops.level_ns[0];
    d.host_mut().card.add_background_work(level1 + 100 * MS);
    let t0 = d.now();
    assert_eq!(d.advance(t0 + 40 * MS), Advance::Reached);
    assert_eq!(d.stats().bkops_started, 0, "not idle long enough");
    assert_eq!(d.advance(t0 + 60 * MS), Advance::Reached);
    assert_eq!(d.stats().bkops_started, 1);
    let before = d.host().card.bkops_outstanding_ns();
    d.submit(req(1, BlkOp::Read, 0, 8), t0 + 80 * MS);
    let done = drain(&mut d);
    assert!(done[0].result.is_ok());
    assert_eq!(d.stats().hpi, 1, "BKOPS stopped for the read");
    assert!(
        done[0].at < t0 + 80 * MS + 10 * MS,
        "the read did not wait for BKOPS"
    );
    assert!(
        d.host().card.bkops_outstanding_ns() < before,
        "BKOPS did some work"
    );
    // Stopped by the HPI, then started again once idle and run to the end (drain): the
    // card spent as long in BKOPS as the work it had.
    let ran = d.host().card.stats().bkops_ns;
    assert!(
        ran.abs_diff(level1 + 100 * MS) < MS,
        "BKOPS time counted: {ran} ns"
    );
}

#[test]
fn bkops_below_the_level_is_not_started() {
    let m = model("msm-emmc45-sdr50");
    let cfg = BlkConfig {
        bkops: BkopsPolicy {
            min_level: 2,
            ..bkops_cfg(&m).bkops
        },
        ..bkops_cfg(&m)
    };
    let mut d = MmcBlk::probe(null_host(&m), cfg).unwrap();
    let level1 = m.timing.as_flash().unwrap().bkops.level_ns[0];
    d.host_mut().card.add_background_work(level1 + MS);
    let t0 = d.now();
    d.advance(t0 + 200 * MS);
    assert_eq!(d.stats().bkops_started, 0);
}

#[test]
fn urgent_bkops_runs_before_the_next_request() {
    let m = model("msm-emmc45-sdr50");
    let mut d = MmcBlk::probe(null_host(&m), bkops_cfg(&m)).unwrap();
    let level2 = m.timing.as_flash().unwrap().bkops.level_ns[1];
    d.host_mut().card.add_background_work(level2 + MS);
    let t0 = d.now();
    d.submit(req(1, BlkOp::Write, 0, 8), t0);
    d.submit(req(2, BlkOp::Write, 64, 8), t0);
    let done = drain(&mut d);
    assert!(done.iter().all(|c| c.result.is_ok()));
    assert!(d.stats().bkops_urgent >= 1);
    assert!(d.host().card.bkops_outstanding_ns() < level2);
}

#[test]
fn crc_errors_are_retried_and_fail_after_the_retry_budget() {
    let m = model("generic-emmc45");
    let mut d = recorded(&m, quiet(BlkConfig::default()));
    d.host_mut().fail_data = 3;
    d.submit(req(1, BlkOp::Write, 64, 8), 0);
    let done = drain(&mut d);
    assert!(done[0].result.is_ok());
    assert_eq!(d.stats().retries, 3);
    assert_eq!(d.host().data().len(), 4);
    d.host_mut().fail_data = 100;
    d.submit(req(2, BlkOp::Read, 64, 8), d.now());
    let done = drain(&mut d);
    assert!(matches!(
        done[0].result,
        Err(BlkError::Mmc(MmcError::Host {
            error: SdhciError::DataCrc,
            ..
        }))
    ));
    assert_eq!(d.stats().retries, 3 + MMC_BLK_RETRIES as u64);
    assert_eq!(d.stats().failed, 1);
}

#[test]
fn a_packed_entry_that_fails_completes_the_ones_before_it() {
    let m = model("msm-emmc45-sdr50");
    let cfg = quiet(BlkConfig {
        packing: PackingMode::Always,
        ..BlkConfig::for_model(&m.host)
    });
    let mut h = mem_host(&m);
    h.mmc_init_card(&HostCaps::for_model(&m.host)).unwrap();
    // Write-protect the group holding sector 1_000_000 (CMD28).
    h.mmc_send_r1(28, 1_000_000).unwrap();
    let mut d = MmcBlk::probe(h, cfg).unwrap();
    d.submit(req(1, BlkOp::Write, 0, 16), 0);
    d.submit(req(2, BlkOp::Write, 100, 16), 0);
    d.submit(req(3, BlkOp::Write, 1_000_000, 16), 0);
    d.submit(req(4, BlkOp::Write, 300, 16), 0);
    let done = drain(&mut d);
    let ok = |id| {
        done.iter()
            .find(|c| c.req.id == id)
            .is_some_and(|c| c.result.is_ok())
    };
    assert!(ok(1) && ok(2), "{done:?}");
    assert!(!ok(3), "the protected entry fails");
    // As in Linux: the command is sent again from the failed entry until the retries run
    // out (mmc_blk_abort_packed_req), which fails the entries after it too.
    assert!(!ok(4));
    assert_eq!(d.stats().packed_writes, 1 + u64::from(MMC_BLK_RETRIES));
    assert_eq!(done.len(), 4);
}

#[test]
fn hostile_requests_complete_with_errors_and_never_panic() {
    let m = model("generic-emmc45");
    let mut d = MmcBlk::probe(null_host(&m), quiet(BlkConfig::default())).unwrap();
    let size = d.sectors();
    let bad = [
        req(1, BlkOp::Read, size, 1),
        req(2, BlkOp::Write, u64::MAX, 8),
        req(3, BlkOp::Write, size - 4, 8),
        req(4, BlkOp::Read, 0, 0),
        req(5, BlkOp::Discard, u64::MAX - 1, u32::MAX),
        req(6, BlkOp::WriteZeroes, 0, 0),
    ];
    for r in bad {
        d.submit(r, 0);
    }
    let done = drain(&mut d);
    assert_eq!(done.len(), bad.len());
    assert!(done
        .iter()
        .all(|c| matches!(c.result, Err(BlkError::OutOfRange { .. }))));
    // A huge request is split to the queue limits and completes.
    d.submit(req(7, BlkOp::Write, 0, 65_535), d.now());
    d.submit(req(8, BlkOp::Read, 0, 65_535), d.now());
    let done = drain(&mut d);
    let sectors: u64 = done.iter().map(|c| u64::from(c.req.sectors)).sum();
    assert_eq!(sectors, 2 * 65_535);
    assert!(done.iter().all(|c| c.result.is_ok()));
}

#[test]
fn cfq_gives_reads_priority_over_queued_writeback() {
    let m = model("msm-emmc45-sdr50");
    let cfg = BlkConfig {
        elevator: Elevator::Cfq(CfqTunables::default()),
        bkops: BkopsPolicy {
            enabled: false,
            ..Default::default()
        },
        ..BlkConfig::for_model(&m.host)
    };
    let mut d = MmcBlk::probe(null_host(&m), cfg).unwrap();
    let t0 = d.now();
    for i in 0..32u64 {
        d.submit(
            BlkRequest {
                ioc: 2,
                ..req(i, BlkOp::Write, 100_000 + i * 1000, 128)
            },
            t0,
        );
    }
    let read = BlkRequest {
        ioc: 1,
        ..req(100, BlkOp::Read, 0, 8)
    };
    d.advance(t0 + MS);
    d.take_completions();
    d.submit(read, t0 + MS);
    let done = drain(&mut d);
    let pos = done.iter().position(|c| c.req.id == 100).unwrap();
    assert!(pos <= 3, "the read waited for {pos} writes");
}

#[test]
fn hs200_bring_up_tunes_and_transfers() {
    let m = model("ideal");
    assert_eq!(m.host.timing, BusTimingAlias::Hs200);
    let mut d = MmcBlk::probe(null_host(&m), quiet(BlkConfig::for_model(&m.host))).unwrap();
    assert_eq!(MmcHostOps::ios(d.host()).timing, BusTimingAlias::Hs200);
    assert!(d.host().sdhci.tuned(), "tuning ran before the first read");
    d.submit(req(1, BlkOp::Read, 0, 64), 0);
    assert!(drain(&mut d)[0].result.is_ok());
}

mod hostile {
    use super::*;
    use proptest::prelude::*;

    fn op() -> impl Strategy<Value = BlkOp> {
        prop_oneof![
            Just(BlkOp::Read),
            Just(BlkOp::Write),
            Just(BlkOp::Flush),
            Just(BlkOp::Discard),
            Just(BlkOp::SecureErase),
            Just(BlkOp::WriteZeroes),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(24))]
        /// Any mix of requests, in range or not, under any packing mode and scheduler:
        /// nothing panics and every request completes exactly once (in parts at most).
        #[test]
        fn any_requests_complete(
            reqs in proptest::collection::vec((op(), any::<u64>(), any::<u32>(), any::<bool>()), 1..16),
            mode in 0u32..3,
            sched in 0u32..3,
        ) {
            let m = model("msm-emmc45-sdr50");
            let cfg = BlkConfig {
                packing: match mode {
                    0 => PackingMode::Off,
                    1 => PackingMode::Always,
                    _ => PackingMode::Controlled { threshold: 1 },
                },
                elevator: match sched {
                    0 => Elevator::Noop,
                    1 => Elevator::Deadline(Default::default()),
                    _ => Elevator::Cfq(Default::default()),
                },
                hpi: HpiPolicy { enabled: true, min_write_sectors: 8, min_wait_ns: 0 },
                ..BlkConfig::for_model(&m.host)
            };
            let mut d = MmcBlk::probe(null_host(&m), cfg).unwrap();
            let size = d.sectors();
            let mut expected = 0u64;
            for (i, (op, lba, sectors, fua)) in reqs.iter().enumerate() {
                // Half the requests land inside the device, half anywhere.
                let (lba, sectors) = if i % 2 == 0 {
                    (lba % size, (sectors % 2048).min((size - lba % size) as u32))
                } else {
                    (*lba, *sectors)
                };
                let r = BlkRequest {
                    fua: *fua && *op == BlkOp::Write,
                    ..BlkRequest::new(i as u64, *op, lba, sectors)
                };
                expected += u64::from(if *op == BlkOp::Flush { 0 } else { sectors });
                d.submit(r, d.now());
            }
            let done = drain(&mut d);
            let flushes = done.iter().filter(|c| c.req.op == BlkOp::Flush).count();
            prop_assert_eq!(flushes, reqs.iter().filter(|r| r.0 == BlkOp::Flush).count());
            let got: u64 = done
                .iter()
                .filter(|c| c.req.op != BlkOp::Flush)
                .map(|c| u64::from(c.req.sectors))
                .sum();
            // Every sector asked for completed (or failed) once.
            prop_assert_eq!(got, expected);
        }
    }
}

#[test]
fn packed_reads_send_the_header_by_cmd25_then_the_data_by_cmd18() {
    let m = model("msm-emmc45-sdr50");
    let cfg = quiet(BlkConfig {
        packing: PackingMode::Always,
        packed_reads: true,
        ..BlkConfig::for_model(&m.host)
    });
    let mut h = mem_host(&m);
    h.mmc_init_card(&HostCaps::for_model(&m.host)).unwrap();
    for (i, lba) in [0u64, 100, 200].iter().enumerate() {
        h.mmc_write_blocks(*lba, &vec![i as u8 + 1; 8 * 512], 0)
            .unwrap();
    }
    let mut d = MmcBlk::probe(
        Recorder {
            inner: h,
            log: Vec::new(),
            fail_data: 0,
        },
        cfg,
    )
    .unwrap();
    d.host_mut().clear();
    for (i, lba) in [0u64, 100, 200].iter().enumerate() {
        d.submit(req(i as u64 + 1, BlkOp::Read, *lba, 8), 0);
    }
    let done = drain(&mut d);
    assert!(done.iter().all(|c| c.result.is_ok()), "{done:?}");
    assert_eq!(d.stats().packed_reads, 1);
    let log = d.host().data();
    let hdr = log
        .iter()
        .position(|r| r.opcode == 25 && r.sbc == Some(MMC_CMD23_ARG_PACKED | 1))
        .expect("header write");
    let data = log[hdr + 1];
    assert_eq!(data.opcode, 18);
    let n = data.blocks;
    assert!(n >= 16, "at least two entries: {n}");
    assert_eq!(data.sbc, Some(MMC_CMD23_ARG_PACKED | n));
    assert_eq!(n, 24, "the three reads in one command");
    assert_eq!(d.stats().read_packing.entries.get(&3), Some(&1));
    // The entries came back in header order, back to back.
    for (i, chunk) in d.rbuf[..24 * 512].chunks(8 * 512).enumerate() {
        assert!(chunk.iter().all(|&b| b == i as u8 + 1), "entry {}", i + 1);
    }
}

#[test]
fn hpi_also_serves_a_read_the_pipeline_already_fetched() {
    let m = slow_write_model();
    let cfg = BlkConfig {
        hpi: HpiPolicy {
            enabled: true,
            min_write_sectors: 64,
            min_wait_ns: 0,
        },
        ..quiet(BlkConfig::for_model(&m.host))
    };
    let mut d = MmcBlk::probe(null_host(&m), cfg).unwrap();
    let t0 = d.now();
    // The write and the read queued together: the read is fetched while the write is on
    // the card, before the write's programming begins.
    d.submit(req(1, BlkOp::Write, 10_000, 128), t0);
    d.submit(req(2, BlkOp::Read, 500_000, 8), t0);
    let done = drain(&mut d);
    assert_eq!(d.stats().hpi, 1);
    let r = done.iter().find(|c| c.req.id == 2).unwrap().at;
    let w = done
        .iter()
        .filter(|c| c.req.id == 1)
        .map(|c| c.at)
        .max()
        .unwrap();
    assert!(r < w);
}

#[test]
fn hpi_waits_for_the_read_to_have_waited_its_threshold() {
    let m = slow_write_model();
    let run = |min_wait_ns| {
        let cfg = BlkConfig {
            hpi: HpiPolicy {
                enabled: true,
                min_write_sectors: 64,
                min_wait_ns,
            },
            ..quiet(BlkConfig::for_model(&m.host))
        };
        let mut d = MmcBlk::probe(null_host(&m), cfg).unwrap();
        let t0 = d.now();
        d.submit(req(1, BlkOp::Write, 10_000, 128), t0);
        d.submit(req(2, BlkOp::Read, 500_000, 8), t0);
        drain(&mut d);
        (d.stats().hpi, d.stats().hpi_requeued_sectors)
    };
    let (n0, back0) = run(0);
    let (n1, back1) = run(2_000_000);
    assert_eq!((n0, n1), (1, 1));
    assert!(back1 < back0, "later HPI, more landed: {back0} vs {back1}");
    assert_eq!(
        run(1_000_000_000).0,
        0,
        "the write ends before the threshold"
    );
}

/// Request data as a byte pattern per request: what the frontend does with guest memory.
#[derive(Default)]
struct Buffers {
    /// id → (first sector, bytes): the data to write, or the buffer a read fills.
    reqs: std::collections::HashMap<u64, (u64, Vec<u8>)>,
}

impl Buffers {
    fn add(&mut self, id: u64, lba: u64, data: Vec<u8>) {
        self.reqs.insert(id, (lba, data));
    }

    fn range(&mut self, req: &BlkRequest, lba: u64, len: usize) -> &mut [u8] {
        let (first, buf) = self.reqs.get_mut(&req.id).expect("a known request");
        let at = (lba - *first) as usize * 512;
        &mut buf[at..at + len]
    }
}

impl BlkData for Buffers {
    fn write_data(&mut self, req: &BlkRequest, lba: u64, buf: &mut [u8]) {
        buf.copy_from_slice(self.range(req, lba, buf.len()));
    }

    fn read_data(&mut self, req: &BlkRequest, lba: u64, buf: &[u8]) {
        self.range(req, lba, buf.len()).copy_from_slice(buf);
    }
}

fn pattern(seed: u64, sectors: u32) -> Vec<u8> {
    (0..sectors as u64 * 512)
        .map(|i| (i / 512 * 31 + i % 512 + seed * 7) as u8)
        .collect()
}

#[test]
fn data_moves_through_packed_writes_packed_reads_and_split_requests() {
    let m = model("generic-emmc45");
    let cfg = BlkConfig {
        packing: PackingMode::Always,
        packed_reads: true,
        merge: false,
        ..quiet(BlkConfig::for_model(&m.host))
    };
    let mut d = MmcBlk::probe_with_data(mem_host(&m), cfg, Buffers::default()).unwrap();
    // Small writes that pack, and one larger than a request may be (split).
    let mut layout: Vec<(u64, u64, u32)> = (0..24u64).map(|i| (i + 1, 4096 + i * 40, 8)).collect();
    layout.push((100, 100_000, 3000));
    for &(id, lba, n) in &layout {
        d.data_mut().add(id, lba, pattern(id, n));
        d.submit(req(id, BlkOp::Write, lba, n), 0);
    }
    let done = drain(&mut d);
    assert!(done.iter().all(|c| c.result.is_ok()));
    let written: u32 = done.iter().map(|c| c.req.sectors).sum();
    assert_eq!(
        written,
        24 * 8 + 3000,
        "every sector completed exactly once"
    );
    assert!(d.stats().packed_writes > 0, "writes were packed");
    // Read it all back, packed where the driver packs reads.
    let now = d.now();
    for &(id, lba, n) in &layout {
        d.data_mut().add(1000 + id, lba, vec![0; n as usize * 512]);
        d.submit(req(1000 + id, BlkOp::Read, lba, n), now);
    }
    assert!(drain(&mut d).iter().all(|c| c.result.is_ok()));
    assert!(d.stats().packed_reads > 0, "reads were packed");
    for &(id, _, n) in &layout {
        assert_eq!(
            d.data().reqs[&(1000 + id)].1,
            pattern(id, n),
            "request {id}"
        );
    }
}

#[test]
fn next_event_says_when_the_driver_has_work_of_its_own() {
    let m = model("toshiba-mmc32g");
    let mut d = MmcBlk::probe(mem_host(&m), quiet(BlkConfig::for_model(&m.host))).unwrap();
    assert_eq!(d.next_event(), None, "an idle queue waits for requests");
    let t0 = d.now();
    d.submit(req(1, BlkOp::Write, 0, 8), t0);
    // Step in real-time fashion: advance to the next event only, never past it.
    let mut steps = 0;
    let done_at = loop {
        let t = d.next_event().expect("work in flight has a next event");
        assert!(t >= d.now());
        d.advance(t);
        steps += 1;
        if let Some(c) = d.take_completions().pop() {
            break c.at;
        }
        assert!(steps < 1000, "no progress");
    };
    // The same request run straight through completes at the same card time.
    let mut e = MmcBlk::probe(mem_host(&m), quiet(BlkConfig::for_model(&m.host))).unwrap();
    let t1 = e.now();
    e.submit(req(1, BlkOp::Write, 0, 8), t1);
    let straight = drain(&mut e)[0].at;
    assert_eq!(done_at - t0, straight - t1);
    assert!(
        done_at - t0 > 1_000_000,
        "a toshiba small write takes milliseconds"
    );
}

/// Reads per second, in MB/s, of a reader (128 KiB at queue depth 1, the next asked for
/// 0.3 ms after each completes) beside writeback that keeps 128 writes of 64 KiB queued
/// (a guest's full virtqueue), for `secs` of card time; `writer: false`, the reader alone.
fn reader_beside_writeback(m: &DeviceModel, cfg: BlkConfig, writer: bool, secs: u64) -> f64 {
    const THINK: Nanos = 300_000;
    let mut d = MmcBlk::probe(null_host(m), cfg).unwrap();
    let t0 = d.now();
    let end = t0 + secs * 1000 * MS;
    let mut next_id = 0u64;
    let mut id = || {
        next_id += 1;
        next_id
    };
    let mut write_lba = 2_000_000u64;
    if writer {
        for _ in 0..128 {
            d.submit(req(id(), BlkOp::Write, write_lba, 128), t0);
            write_lba += 128;
        }
    }
    let mut read_lba = 0u64;
    let mut read_left = 256u64;
    let mut read_bytes = 0u64;
    let mut next_read = None;
    d.submit(req(id(), BlkOp::Read, read_lba, 256), t0);
    loop {
        let until = next_read.unwrap_or(end).min(end);
        let state = d.advance(until);
        for c in d.take_completions() {
            c.result.expect("no errors");
            if c.req.op == BlkOp::Read {
                read_left -= u64::from(c.req.sectors);
                if read_left == 0 {
                    read_bytes += 256 * 512;
                    read_left = 256;
                    read_lba += 256;
                    next_read = Some(c.at + THINK);
                }
            } else if c.req.op == BlkOp::Write && c.at < end {
                d.submit(req(id(), BlkOp::Write, write_lba, 128), c.at);
                write_lba += 128;
            }
        }
        let now = d.now();
        if now >= end {
            break;
        }
        if let Some(t) = next_read {
            if now >= t || state == Advance::Idle {
                d.submit(req(id(), BlkOp::Read, read_lba, 256), now.max(t));
                next_read = None;
            }
        }
    }
    read_bytes as f64 / secs as f64 / 1e6
}

/// Seed 000's parallel read and write as a guest hands it to serve: the reader keeps
/// most of its rate under serve's default driver (CFQ: a read is sync and preempts the
/// async writeback, waiting only for the writes in the driver), and loses nearly all of
/// it under noop, which serves the deep queue in arrival order (docs/host-driver.md,
/// "serve's defaults and seed 000"). Fails if `BlkConfig::served` stops separating reads
/// from writeback.
#[test]
fn served_defaults_keep_a_reader_going_beside_a_deep_writeback_queue() {
    let m = model("msm-emmc45-sdr50");
    let served = BlkConfig::served(&m.host);
    let alone = reader_beside_writeback(&m, served.clone(), false, 2);
    let beside = reader_beside_writeback(&m, served.clone(), true, 2);
    let noop = BlkConfig {
        elevator: Elevator::Noop,
        ..served
    };
    let beside_noop = reader_beside_writeback(&m, noop, true, 2);
    assert!(alone > 15.0, "the reader alone: {alone:.1} MB/s");
    assert!(
        beside >= 0.6 * alone,
        "serve's defaults: the reader got {beside:.1} MB/s beside writeback, {alone:.1} alone"
    );
    assert!(
        beside_noop <= 0.2 * alone,
        "noop: the reader got {beside_noop:.1} MB/s beside writeback, {alone:.1} alone"
    );
}
