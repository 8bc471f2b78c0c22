//! Fault plans end to end: the injector in the SDHCI model, a card behind it, and Linux's
//! block driver on top. Every effect is checked the way a driver would observe it.

use super::*;
use crate::blkdrv::{Advance, BkopsPolicy, BlkConfig, BlkError, HpiPolicy, MmcBlk};
use crate::iosched::Elevator;
use crate::mmc::{HostCaps, MmcError, MmcHost, MMC_RCA};
use crate::packing::{BlkOp, BlkRequest, PackingMode};
use crate::sdhci::{
    error_int, MmcCommand, MmcData, MmcRequest, ResponseType, SdhciCompletion, SdhciConfig,
    SdhciError,
};
use crate::testing::drain;
use emmc_card::model::DeviceModel;
use emmc_card::store::{MemStore, NullStore};
use emmc_card::timing::Nanos;
use emmc_card::{ext_csd as ext, r1, Card, Partition};

const MS: Nanos = 1_000_000;

fn model(name: &str) -> DeviceModel {
    DeviceModel::load(name).unwrap()
}

fn bare_host(m: &DeviceModel, keep_data: bool) -> MmcHost {
    let layout = Card::layout_for(m);
    let card = if keep_data {
        Card::new(m.clone(), Box::new(MemStore::new(layout))).unwrap()
    } else {
        Card::new(m.clone(), Box::new(NullStore::new(layout))).unwrap()
    };
    MmcHost::with_config(card, SdhciConfig::for_model(&m.host))
}

fn host(m: &DeviceModel) -> MmcHost {
    let mut h = bare_host(m, true);
    h.mmc_init_card(&HostCaps::for_model(&m.host)).unwrap();
    h
}

fn injector(text: &str) -> FaultInjector {
    FaultInjector::new(FaultPlan::from_toml_str(text).unwrap()).unwrap()
}

fn install(h: &mut MmcHost, text: &str) {
    h.sdhci.set_fault_injector(Some(injector(text)));
}

fn send_status(h: &mut MmcHost) -> SdhciCompletion {
    h.mmc_wait_for_req(MmcRequest::command(MmcCommand::new(
        13,
        u32::from(MMC_RCA) << 16,
        ResponseType::R1,
    )))
}

fn read(h: &mut MmcHost, lba: u64, blocks: u32, buf: &mut [u8]) -> SdhciCompletion {
    let mut sg = [buf];
    h.mmc_wait_for_req(MmcRequest {
        sbc: Some(MmcCommand::new(23, blocks, ResponseType::R1)),
        cmd: MmcCommand::new(18, lba as u32, ResponseType::R1),
        data: Some(MmcData::read(512, blocks, &mut sg)),
        stop: Some(MmcCommand::new(12, 0, ResponseType::R1)),
    })
}

fn write(h: &mut MmcHost, lba: u64, data: &[u8]) -> SdhciCompletion {
    let blocks = (data.len() / 512) as u32;
    let mut sg = [data];
    let done = h.mmc_wait_for_req(MmcRequest {
        sbc: Some(MmcCommand::new(23, blocks, ResponseType::R1)),
        cmd: MmcCommand::new(25, lba as u32, ResponseType::R1),
        data: Some(MmcData::write(512, blocks, &mut sg)),
        stop: Some(MmcCommand::new(12, 0, ResponseType::R1b)),
    });
    h.mmc_wait_busy();
    done
}

fn peek(h: &mut MmcHost, lba: u64, sectors: usize) -> Vec<u8> {
    let mut buf = vec![0u8; sectors * 512];
    h.card.peek(Partition::User, lba, &mut buf).unwrap();
    buf
}

fn quiet(m: &DeviceModel) -> BlkConfig {
    BlkConfig {
        bkops: BkopsPolicy {
            enabled: false,
            ..Default::default()
        },
        elevator: Elevator::Noop,
        ..BlkConfig::for_model(&m.host)
    }
}

fn req(id: u64, op: BlkOp, lba: u64, sectors: u32) -> BlkRequest {
    BlkRequest::new(id, op, lba, sectors)
}

#[test]
fn command_errors_show_as_the_controller_reports_them() {
    let m = model("generic-emmc45");
    for (kind, error, bit) in [
        ("cmd_crc", SdhciError::CmdCrc, error_int::CMD_CRC),
        (
            "cmd_timeout",
            SdhciError::CmdTimeout,
            error_int::CMD_TIMEOUT,
        ),
        ("cmd_end_bit", SdhciError::CmdEndBit, error_int::CMD_END_BIT),
    ] {
        let mut h = host(&m);
        install(
            &mut h,
            &format!("[[rule]]\ncommand = 13\nnth = 2\neffect = {{ kind = \"{kind}\" }}\n"),
        );
        assert!(
            send_status(&mut h).is_ok(),
            "{kind}: the first CMD13 is clean"
        );
        let done = send_status(&mut h);
        assert_eq!(done.cmd.error, Some(error), "{kind}");
        assert!(
            done.int_status.has_error(bit),
            "{kind}: {:?}",
            done.int_status
        );
        let next = send_status(&mut h);
        assert!(next.is_ok(), "{kind}: only the second CMD13 fails");
        let crc_reported = next.cmd.resp[0] & r1::COM_CRC_ERROR != 0;
        // Only a command the card could not read leaves COM_CRC_ERROR behind.
        assert_eq!(crc_reported, kind == "cmd_timeout", "{kind}");
    }
}

#[test]
fn data_crc_on_a_read_delivers_nothing_and_on_a_write_writes_nothing() {
    let m = model("generic-emmc45");
    let mut h = host(&m);
    assert!(write(&mut h, 100, &[0x5A; 8 * 512]).is_ok());
    install(
        &mut h,
        "[[rule]]\ncommand = [18, 25]\nevery = 2\neffect = { kind = \"data_crc\" }\n",
    );
    // Every second data command fails: a clean read, a failing read.
    let mut buf = vec![0xEE; 8 * 512];
    assert!(read(&mut h, 100, 8, &mut buf).is_ok());
    assert!(buf.iter().all(|&b| b == 0x5A));
    let mut buf = vec![0xEE; 8 * 512];
    let done = read(&mut h, 100, 8, &mut buf);
    assert_eq!(done.data_error, Some(SdhciError::DataCrc));
    assert!(done.int_status.has_error(error_int::DATA_CRC));
    assert_eq!(done.bytes_xfered, 0);
    assert!(
        buf.iter().all(|&b| b == 0xEE),
        "nothing reached host memory"
    );
    // A clean write, then a failing one that lands nothing.
    assert!(write(&mut h, 200, &[0x11; 8 * 512]).is_ok());
    let done = write(&mut h, 300, &[0x22; 8 * 512]);
    assert_eq!(done.data_error, Some(SdhciError::DataCrc));
    assert!(peek(&mut h, 300, 8).iter().all(|&b| b == 0));
    assert!(peek(&mut h, 200, 8).iter().all(|&b| b == 0x11));
    // The card is back in tran after the stop: the next command works.
    let status = send_status(&mut h);
    assert!(status.is_ok());
    assert_eq!(crate::mmc::r1_state(status.cmd.resp[0]), 4, "tran");
}

#[test]
fn data_timeout_stalls_the_transfer_for_the_time_out() {
    let m = model("generic-emmc45");
    let mut h = host(&m);
    install(
        &mut h,
        "[[rule]]\ndirection = \"read\"\nnth = 1\neffect = { kind = \"data_timeout\" }\n",
    );
    let mut buf = vec![0u8; 4 * 512];
    let done = read(&mut h, 0, 4, &mut buf);
    assert_eq!(done.data_error, Some(SdhciError::DataTimeout));
    assert!(done.int_status.has_error(error_int::DATA_TIMEOUT));
    let clean = read(&mut h, 0, 4, &mut buf);
    assert!(clean.is_ok());
    assert!(
        done.duration_ns() > clean.duration_ns() + MS,
        "the host waited for its time-out: {} vs {}",
        done.duration_ns(),
        clean.duration_ns()
    );
}

#[test]
fn an_lba_range_rule_hits_only_transfers_touching_it() {
    let m = model("generic-emmc45");
    let mut h = host(&m);
    install(
        &mut h,
        "[[rule]]\nlba = { start = 1000, end = 1008 }\neffect = { kind = \"data_crc\" }\n",
    );
    let mut buf = vec![0u8; 8 * 512];
    assert!(read(&mut h, 0, 8, &mut buf).is_ok());
    assert!(read(&mut h, 992, 8, &mut buf).is_ok(), "ends just before");
    assert!(!read(&mut h, 996, 8, &mut buf).is_ok(), "overlaps");
    assert!(!read(&mut h, 1007, 8, &mut buf).is_ok(), "overlaps the end");
    assert!(read(&mut h, 1008, 8, &mut buf).is_ok(), "starts at the end");
}

#[test]
fn an_r1_error_refuses_the_command_and_the_driver_fails_it_without_retrying() {
    let m = model("generic-emmc45");
    let mut h = host(&m);
    install(
        &mut h,
        "[[rule]]\ncommand = 25\nnth = 1\neffect = { kind = \"r1_error\", bits = [\"WP_VIOLATION\", \"ERROR\"] }\n",
    );
    let done = write(&mut h, 64, &[0x77; 4 * 512]);
    assert!(done.cmd.ok());
    assert_eq!(
        done.cmd.resp[0] & r1::ERRORS,
        r1::WP_VIOLATION | r1::ERROR,
        "{}",
        r1::describe(done.cmd.resp[0])
    );
    assert!(
        peek(&mut h, 64, 4).iter().all(|&b| b == 0),
        "nothing written"
    );
    assert_eq!(
        send_status(&mut h).cmd.resp[0] & (r1::WP_VIOLATION | r1::ERROR),
        0,
        "the bits were cleared on read"
    );

    let mut d = MmcBlk::probe(host(&m), quiet(&m)).unwrap();
    d.host_mut().sdhci.set_fault_injector(Some(injector(
        "[[rule]]\ncommand = 18\nnth = 1\neffect = { kind = \"r1_error\", bits = [\"ADDRESS_OUT_OF_RANGE\"] }\n",
    )));
    d.submit(req(1, BlkOp::Read, 0, 8), d.now());
    let done = drain(&mut d);
    assert!(
        matches!(
            done[0].result,
            Err(BlkError::Mmc(MmcError::Status { cmd: 18, status })) if status & r1::ADDRESS_OUT_OF_RANGE != 0
        ),
        "{done:?}"
    );
    assert_eq!(
        d.stats().retries,
        0,
        "mmc_blk_err_check aborts on R1 errors"
    );
    // The device keeps serving.
    d.submit(req(2, BlkOp::Read, 0, 8), d.now());
    assert!(drain(&mut d)[0].result.is_ok());
}

#[test]
fn the_driver_retries_a_transient_data_crc_and_reports_a_persistent_one() {
    let m = model("generic-emmc45");
    let mut d = MmcBlk::probe(host(&m), quiet(&m)).unwrap();
    d.host_mut().sdhci.set_fault_injector(Some(injector(
        "[[rule]]\ncommand = 25\nnth = 1\neffect = { kind = \"data_crc\" }\n",
    )));
    d.submit(req(1, BlkOp::Write, 64, 8), d.now());
    let done = drain(&mut d);
    assert!(done[0].result.is_ok(), "{done:?}");
    assert_eq!(d.stats().retries, 1);
    let faults = d.host_mut().sdhci.fault_injector_mut().unwrap();
    assert_eq!(faults.fired(0), 1);
    faults.clear();
    let mut rule = Rule::new(Effect::DataCrc);
    rule.direction = Some(Direction::Write);
    faults.add_rule(rule).unwrap();
    d.submit(req(2, BlkOp::Write, 128, 8), d.now());
    let done = drain(&mut d);
    assert!(
        matches!(
            done[0].result,
            Err(BlkError::Mmc(MmcError::Host {
                error: SdhciError::DataCrc,
                ..
            }))
        ),
        "{done:?}"
    );
    let retries = u64::from(d.config().retries);
    assert_eq!(d.stats().retries, 1 + retries);
    assert_eq!(d.stats().failed, 1);
    assert!(peek(d.host_mut(), 128, 8).iter().all(|&b| b == 0));
}

#[test]
fn a_packed_entry_failure_surfaces_with_its_index() {
    let m = model("msm-emmc45-sdr50");
    for index in [2u64, 3] {
        let cfg = BlkConfig {
            packing: PackingMode::Always,
            retries: 0,
            ..quiet(&m)
        };
        let mut d = MmcBlk::probe(host(&m), cfg).unwrap();
        d.host_mut()
            .sdhci
            .set_fault_injector(Some(injector(&format!(
                "[[rule]]\nnth = 1\neffect = {{ kind = \"packed_failure\", index = {index} }}\n"
            ))));
        // One write goes alone, the next three in one packed command.
        for (i, lba) in [0u64, 100, 200, 300].iter().enumerate() {
            d.submit(req(i as u64 + 1, BlkOp::Write, *lba, 16), 0);
        }
        let done = drain(&mut d);
        assert_eq!(d.host().card.stats().packed_failures, 1);
        let ok: Vec<u64> = {
            let mut v: Vec<u64> = done
                .iter()
                .filter(|c| c.result.is_ok())
                .map(|c| c.req.id)
                .collect();
            v.sort_unstable();
            v
        };
        // The requests sent before the packed command, then the entries before the
        // failed one.
        let packed = *d.stats().write_packing.entries.keys().max().unwrap() as u64;
        let alone = 4 - packed;
        let want: Vec<u64> = (1..alone + index).collect();
        assert_eq!(ok, want, "index {index}: {done:?}");
        let e = d.host_mut().mmc_get_ext_csd().unwrap();
        assert_eq!(e[ext::PACKED_FAILURE_INDEX], index as u8);
        assert_eq!(
            e[ext::PACKED_COMMAND_STATUS],
            ext::PACKED_STATUS_ERROR | ext::PACKED_STATUS_INDEXED_ERROR
        );
    }
}

fn hpi_config(m: &DeviceModel, hpi: bool) -> BlkConfig {
    BlkConfig {
        hpi: HpiPolicy {
            enabled: hpi,
            min_write_sectors: 1,
            min_wait_ns: 0,
        },
        ..quiet(m)
    }
}

#[test]
fn stuck_busy_is_released_by_hpi_or_holds_until_its_limit() {
    let mut m = model("msm-emmc45-sdr50");
    m.ext_csd.cache_size = 0;
    let plan = "[[rule]]\ncommand = 25\nnth = 1\neffect = { kind = \"stuck_busy\", max_ns = 10_000_000_000 }\n";
    let mut read_done = Vec::new();
    for hpi in [true, false] {
        let mut d = MmcBlk::probe(host(&m), hpi_config(&m, hpi)).unwrap();
        d.host_mut().sdhci.set_fault_injector(Some(injector(plan)));
        let t0 = d.now();
        d.submit(req(1, BlkOp::Write, 10_000, 64), t0);
        assert_eq!(d.advance(t0 + MS), Advance::Reached);
        assert!(
            d.host().card.busy_until().unwrap() > t0 + 5_000 * MS,
            "the card is stuck busy"
        );
        d.submit(req(2, BlkOp::Read, 500_000, 8), t0 + MS);
        let done = drain(&mut d);
        assert!(done.iter().all(|c| c.result.is_ok()), "{done:?}");
        assert_eq!(d.stats().hpi, u64::from(hpi));
        read_done.push(done.iter().find(|c| c.req.id == 2).unwrap().at - t0);
    }
    assert!(
        read_done[0] < 100 * MS,
        "HPI released it: {} ns",
        read_done[0]
    );
    assert!(
        read_done[1] >= 10_000 * MS,
        "without HPI the read waits out the stuck busy: {} ns",
        read_done[1]
    );
}

#[test]
fn stuck_busy_beyond_the_busy_time_out_is_a_data_timeout() {
    let m = model("generic-emmc45");
    let mut h = host(&m);
    install(
        &mut h,
        "[[rule]]\ncommand = 25\nnth = 1\neffect = { kind = \"stuck_busy\", max_ns = 100_000_000_000 }\n",
    );
    let done = write(&mut h, 0, &[1; 8 * 512]);
    assert_eq!(done.data_error, Some(SdhciError::DataTimeout));
    assert!(done.int_status.has_error(error_int::DATA_TIMEOUT));
}

#[test]
fn latency_and_gc_storms_lengthen_the_busy_by_exactly_their_time() {
    let m = model("generic-emmc45");
    let data = vec![3u8; 8 * 512];
    let mut base = host(&m);
    let clean = write(&mut base, 0, &data).duration_ns();

    let mut h = host(&m);
    install(
        &mut h,
        "[[rule]]\ncommand = 25\neffect = { kind = \"latency\", ns = 5_000_000 }\n",
    );
    let slow = write(&mut h, 0, &data);
    assert!(slow.is_ok());
    assert_eq!(slow.duration_ns(), clean + 5 * MS);

    let mut h = host(&m);
    let debt = h.card.bkops_outstanding_ns();
    install(
        &mut h,
        "[[rule]]\ncommand = 25\neffect = { kind = \"gc_storm\", ns = 7_000_000, work_ns = 300_000_000 }\n",
    );
    let storm = write(&mut h, 0, &data);
    assert!(storm.is_ok());
    assert_eq!(storm.duration_ns(), clean + 7 * MS);
    assert!(h.card.bkops_outstanding_ns() >= debt + 300 * MS);
}

#[test]
fn urgent_bkops_raises_the_exception_event() {
    let m = model("generic-emmc45");
    let mut h = host(&m);
    assert_eq!(send_status(&mut h).cmd.resp[0] & r1::EXCEPTION_EVENT, 0);
    install(
        &mut h,
        "[[rule]]\ncommand = 13\nnth = 1\neffect = { kind = \"urgent_bkops\" }\n",
    );
    let done = send_status(&mut h);
    assert_ne!(done.cmd.resp[0] & r1::EXCEPTION_EVENT, 0);
    let e = h.mmc_get_ext_csd().unwrap();
    assert!(
        e[ext::BKOPS_STATUS] >= 2,
        "BKOPS_STATUS {}",
        e[ext::BKOPS_STATUS]
    );
    assert_ne!(
        ext::read_le(&e, ext::EXCEPTION_EVENTS_STATUS, 2) as u16 & ext::EE_URGENT_BKOPS,
        0
    );
}

#[test]
fn the_driver_runs_urgent_bkops_when_the_plan_raises_it() {
    let m = model("generic-emmc45");
    let cfg = BlkConfig {
        bkops: BkopsPolicy {
            enabled: true,
            idle_ns: 3_600_000 * MS,
            ..Default::default()
        },
        ..quiet(&m)
    };
    let mut d = MmcBlk::probe(host(&m), cfg).unwrap();
    d.host_mut().sdhci.set_fault_injector(Some(injector(
        "[[rule]]\ncommand = 25\nnth = 1\neffect = { kind = \"urgent_bkops\", level = 3 }\n",
    )));
    d.submit(req(1, BlkOp::Write, 0, 8), d.now());
    let done = drain(&mut d);
    assert!(done[0].result.is_ok());
    assert_eq!(d.stats().bkops_urgent, 1);
}

#[test]
fn wear_out_moves_the_life_time_estimates_and_pre_eol_info() {
    let m = model("generic-emmc45");
    let mut h = host(&m);
    install(
        &mut h,
        "[[rule]]\ncommand = 8\nnth = 1\neffect = { kind = \"wear_out\", life_time_est_a = 10, life_time_est_b = 3, pre_eol_info = 2 }\n",
    );
    let e = h.mmc_get_ext_csd().unwrap();
    assert_eq!(e[emmc_card::fault::DEVICE_LIFE_TIME_EST_TYP_A], 10);
    assert_eq!(e[emmc_card::fault::DEVICE_LIFE_TIME_EST_TYP_B], 3);
    assert_eq!(e[emmc_card::fault::PRE_EOL_INFO], 2);
}

#[test]
fn bit_flips_corrupt_the_delivered_data_not_the_medium() {
    let m = model("generic-emmc45");
    let mut h = host(&m);
    let pattern: Vec<u8> = (0..8 * 512).map(|i| (i * 7) as u8).collect();
    assert!(write(&mut h, 40, &pattern).is_ok());
    install(
        &mut h,
        "seed = 3\n[[rule]]\nnth = 1\neffect = { kind = \"bit_flip\", bits = 1 }\n",
    );
    let mut buf = vec![0u8; 8 * 512];
    let done = read(&mut h, 40, 8, &mut buf);
    assert!(done.is_ok(), "a flip the card's ECC missed is silent");
    let flipped: u32 = buf
        .iter()
        .zip(&pattern)
        .map(|(a, b)| (a ^ b).count_ones())
        .sum();
    assert_eq!(flipped, 1);
    assert!(read(&mut h, 40, 8, &mut buf).is_ok());
    assert_eq!(buf, pattern, "the medium is intact");
}

#[test]
fn power_loss_at_an_instant_drops_exactly_the_non_durable_data() {
    let m = model("generic-emmc45");
    let mut h = host(&m);
    assert!(write(&mut h, 0, &[0x11; 64 * 512]).is_ok());
    h.mmc_flush_cache().unwrap();
    assert!(write(&mut h, 1000, &[0x22; 64 * 512]).is_ok());
    assert!(write(&mut h, 0, &[0x33; 8 * 512]).is_ok());
    let volatile = h.card.volatile_sectors();
    assert!(!volatile.is_empty(), "the cache holds acknowledged writes");
    let is_volatile = |abs: u64| volatile.iter().any(|&(s, n)| s <= abs && abs < s + n);
    let at = h.now;
    install(
        &mut h,
        &format!("[[rule]]\neffect = {{ kind = \"power_loss\", at_ns = {at} }}\n"),
    );
    let done = send_status(&mut h);
    assert_eq!(
        done.cmd.error,
        Some(SdhciError::CmdTimeout),
        "the card is in idle"
    );
    assert!(h.card.volatile_sectors().is_empty());
    let mut dropped = 0;
    for lba in (0..64).chain(1000..1064) {
        let newest = match lba {
            0..8 => 0x33,
            8..64 => 0x11,
            _ => 0x22,
        };
        let durable = if lba < 64 { 0x11 } else { 0 };
        let abs = h.card.image_sector(Partition::User, lba).unwrap();
        let want = if is_volatile(abs) {
            dropped += 1;
            durable
        } else {
            newest
        };
        let got = peek(&mut h, lba, 1);
        assert!(
            got.iter().all(|&b| b == want),
            "lba {lba}: want {want:#x}, got {:#x}",
            got[0]
        );
    }
    assert_eq!(
        dropped,
        volatile.iter().map(|&(_, n)| n).sum::<u64>(),
        "every volatile sector was one of the writes"
    );
    // Once only: the card can be brought up again and serves.
    h.mmc_init_card(&HostCaps::for_model(&m.host)).unwrap();
    assert!(send_status(&mut h).is_ok());
}

fn faulted_run(seed: u64) -> Vec<Injection> {
    let m = model("generic-emmc45");
    let mut h = bare_host(&m, false);
    h.mmc_init_card(&HostCaps::for_model(&m.host)).unwrap();
    let mut d = MmcBlk::probe(h, quiet(&m)).unwrap();
    d.host_mut()
        .sdhci
        .set_fault_injector(Some(injector(&format!(
            "seed = {seed}\n[[rule]]\nprobability = 0.2\neffect = {{ kind = \"data_crc\" }}\n"
        ))));
    for i in 0..64u64 {
        d.submit(req(i, BlkOp::Write, i * 64, 8), d.now());
        let done = drain(&mut d);
        assert!(
            done.iter().all(|c| c.result.is_ok()),
            "retries absorb p = 0.2"
        );
    }
    d.host().sdhci.fault_injector().unwrap().history().to_vec()
}

#[test]
fn the_same_seed_replays_the_same_faults_and_another_seed_does_not() {
    let a = faulted_run(21);
    let b = faulted_run(21);
    let c = faulted_run(22);
    assert!(!a.is_empty());
    assert_eq!(a, b);
    assert_ne!(a, c);
}

#[test]
fn every_example_plan_loads() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/faults");
    let mut n = 0;
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "toml") {
            let plan = FaultPlan::load(&path).unwrap_or_else(|e| panic!("{e}"));
            assert!(!plan.rules.is_empty(), "{}", path.display());
            FaultInjector::new(plan).unwrap();
            n += 1;
        }
    }
    assert!(n >= 4, "{n} example plans");
}

#[test]
fn power_loss_during_programming_lands_the_prefix_that_elapsed() {
    use crate::mmc::MmcHostOps;
    let mut m = model("msm-emmc45-sdr50");
    m.ext_csd.cache_size = 0;
    let mut h = host(&m);
    let data = vec![0x6Cu8; 64 * 512];
    let mut sg = [&data[..]];
    let done = h.start_request(MmcRequest {
        sbc: Some(MmcCommand::new(23, 64, ResponseType::R1)),
        cmd: MmcCommand::new(25, 5000, ResponseType::R1),
        data: Some(MmcData::write(512, 64, &mut sg)),
        stop: Some(MmcCommand::new(12, 0, ResponseType::R1b)),
    });
    assert!(done.is_ok() && done.busy_pending);
    let (start, end) = (done.end_ns, h.card.busy_until().unwrap());
    assert!(end > start + 1000);
    let at = start + (end - start) / 2;
    install(
        &mut h,
        &format!("[[rule]]\neffect = {{ kind = \"power_loss\", at_ns = {at} }}\n"),
    );
    // The host looks again only after the programming would have ended.
    h.now = end;
    assert_eq!(send_status(&mut h).cmd.error, Some(SdhciError::CmdTimeout));
    let landed = (0..64)
        .take_while(|&i| peek(&mut h, 5000 + i, 1).iter().all(|&b| b == 0x6C))
        .count();
    assert!((31..=32).contains(&landed), "{landed} of 64 sectors landed");
    for i in landed as u64..64 {
        assert!(
            peek(&mut h, 5000 + i, 1).iter().all(|&b| b == 0),
            "sector {i} after the cut is untouched"
        );
    }
}

/// After a power cut the card is back in idle with no RCA: every command of the next
/// request goes unanswered. The driver re-initialises the card once (`mmc_blk_reset`) and
/// the request then succeeds, as Linux's block driver recovers a card that was reset.
#[test]
fn after_a_power_loss_the_driver_resets_the_card_and_carries_on() {
    let m = model("generic-emmc45");
    let mut d = MmcBlk::probe(host(&m), quiet(&m)).unwrap();
    d.submit(req(1, BlkOp::Write, 64, 8), d.now());
    assert!(drain(&mut d)[0].result.is_ok());
    let at = d.now() + MS;
    d.host_mut()
        .sdhci
        .set_fault_injector(Some(injector(&format!(
            "[[rule]]\neffect = {{ kind = \"power_loss\", at_ns = {at} }}\n"
        ))));
    crate::mmc::MmcHostOps::idle_until(d.host_mut(), at + MS);
    d.submit(req(2, BlkOp::Write, 128, 8), d.now());
    let done = drain(&mut d);
    assert!(done[0].result.is_ok(), "{done:?}");
    assert_eq!(d.stats().resets, 1, "one re-initialisation");
    // The card works on without further resets.
    d.submit(req(3, BlkOp::Read, 128, 8), d.now());
    assert!(drain(&mut d)[0].result.is_ok());
    assert_eq!(d.stats().resets, 1);
}
