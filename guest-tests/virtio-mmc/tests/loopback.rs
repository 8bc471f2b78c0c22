//! The driver against the in-process device (`Loopback`): the encoding of requests,
//! responses, ios and time, without a daemon. The same card and SDHCI model run on both
//! sides of the comparison, so everything must agree exactly.

use emmc_card::model::DeviceModel;
use emmc_host::packing::PackingMode;
use emmc_sim::blkbench::{driver, run_experiment_on, DriverSetup, Experiment};
use virtio_mmc_driver::loopback::Loopback;
use virtio_mmc_driver::{VirtioMmcBlk, VirtioMmcHost};

fn model(name: &str) -> DeviceModel {
    DeviceModel::load(name).unwrap()
}

fn host(m: &DeviceModel) -> VirtioMmcHost<Loopback> {
    VirtioMmcHost::new(Loopback::for_model(m).unwrap()).unwrap()
}

#[test]
fn bring_up_over_the_wire_format_reaches_the_same_card_state_and_time() {
    let m = model("generic-emmc45");
    let setup = DriverSetup::default();
    let local = driver(&m, &setup).unwrap();
    let blk = VirtioMmcBlk::probe(host(&m), setup.blk_config(&m)).unwrap();
    assert_eq!(blk.driver().card().ext_csd, local.card().ext_csd);
    assert_eq!(blk.driver().card().csd, local.card().csd);
    assert_eq!(blk.driver().now(), local.now(), "card time after bring-up");
    assert!(blk.host().stats().requests > 10);
    assert_eq!(blk.host().stats().refused, 0);
}

#[test]
fn block_writes_read_back_over_the_wire_format() {
    let m = model("generic-emmc45");
    let mut blk = VirtioMmcBlk::probe(host(&m), DriverSetup::default().blk_config(&m)).unwrap();
    let data: Vec<u8> = (0..64 * 1024).map(|i| (i * 7 + i / 512) as u8).collect();
    blk.write(2048, &data).unwrap();
    blk.write_fua(4096, &data[..4096]).unwrap();
    blk.flush().unwrap();
    let mut back = vec![0u8; data.len()];
    blk.read(2048, &mut back).unwrap();
    assert_eq!(back, data);
    let mut back = vec![0u8; 4096];
    blk.read(4096, &mut back).unwrap();
    assert_eq!(back, data[..4096]);
    blk.discard(0, 1024).unwrap();
}

#[test]
fn lmdd_write_over_the_wire_format_takes_exactly_the_in_process_card_time() {
    let m = common::real_driver_model("msm-emmc45-sdr50");
    let exp = Experiment::LmddWrite {
        bytes: 8 << 20,
        bs: 128,
        depth: 128,
        batch: 16,
    };
    for packing in [PackingMode::Off, PackingMode::Always] {
        let setup = DriverSetup {
            packing,
            ..DriverSetup::default()
        };
        let mut local = driver(&m, &setup).unwrap();
        let want = run_experiment_on(&mut local, &exp);
        let mut blk = emmc_host::blkdrv::MmcBlk::probe(host(&m), setup.blk_config(&m)).unwrap();
        let got = run_experiment_on(&mut blk, &exp);
        eprintln!(
            "{packing:?}: {} ops, {:.3} s, {:.2} MB/s, {} packed",
            got.write.ops, got.card_time_s, got.write.mb_per_s, got.driver.packed_writes
        );
        assert_eq!(got.write.ops, want.write.ops, "{packing:?}");
        assert!(got.write.ops > 0);
        assert_eq!(got.card_time_s, want.card_time_s, "{packing:?}");
        assert_eq!(got.driver, want.driver, "{packing:?}");
    }
}

// ---- the socket tests' scenarios, against the in-process device ------------------------

mod common;

fn lb(name: &str) -> VirtioMmcHost<Loopback> {
    host(&model(name))
}

#[test]
fn scenario_bring_up() {
    let m = model("generic-emmc45");
    common::bring_up(host(&m), &m);
}

#[test]
fn scenario_partitions() {
    common::partitions(&mut lb("generic-emmc45"));
}

#[test]
fn scenario_packed_write() {
    common::packed_write(&mut lb("generic-emmc45"), 10);
}

#[test]
fn scenario_packed_by_the_driver() {
    let m = model("generic-emmc45");
    common::packed_by_the_driver(host(&m), &m, 12);
}

#[test]
fn scenario_hpi_long_write() {
    common::hpi_long_write(&mut lb("toshiba-mmc32g"));
}

#[test]
fn scenario_hpi_by_the_driver() {
    let m = model("toshiba-mmc32g");
    common::hpi_by_the_driver(host(&m), &m);
}

#[test]
fn scenario_bkops_interrupted() {
    common::bkops_interrupted(&mut lb("toshiba-mmc32g"));
}

#[test]
fn scenario_rpmb() {
    common::rpmb(&mut lb("generic-emmc45"));
}

#[test]
fn scenario_illegal_command() {
    common::illegal_command(&mut lb("generic-emmc45"));
}

#[test]
fn scenario_malformed() {
    common::malformed(&mut lb("generic-emmc45"));
}

// ---- the daemon's answers to malformed control chains (docs/virtio-mmc.md) ----------------

#[test]
fn a_malformed_control_chain_is_answered_ioerr_where_it_has_room_else_used_with_length_0() {
    use emmc_frontend::mmc::proto::*;
    use virtio_mmc_driver::host::UNTOUCHED;
    use virtio_mmc_driver::RawDesc;
    use vm_memory::ByteValued;

    let mut h = lb("generic-emmc45");
    let resp_len = std::mem::size_of::<VirtioMmcCtrlResp>() as u32;
    let req = VirtioMmcCtrlReq {
        kind: CTRL_IDLE_UNTIL,
        arg0: h.control(CTRL_GET_TIME, 0, 0).unwrap().now_ns + 1_000_000,
        ..Default::default()
    };
    let before = h.control(CTRL_GET_TIME, 0, 0).unwrap().now_ns;
    // Wrong shape, but the last descriptor can take a result: IOERR, and nothing done.
    for descs in [
        vec![
            RawDesc::Readable(req.as_slice().to_vec()),
            RawDesc::Writable(8),
            RawDesc::Writable(resp_len),
        ],
        vec![
            RawDesc::Readable(req.as_slice()[..16].to_vec()),
            RawDesc::Writable(resp_len),
        ],
    ] {
        let out = h.raw_chain(CONTROL_QUEUE, &descs).unwrap();
        assert_eq!(out.used_len, resp_len);
        let mut r = VirtioMmcCtrlResp::default();
        r.as_mut_slice()
            .copy_from_slice(out.writable.last().unwrap());
        assert_eq!(r.status, STATUS_IOERR);
        assert_eq!(r.now_ns, before, "the card time, not advanced");
    }
    // No room for a result: used with length 0, nothing written.
    let out = h
        .raw_chain(
            CONTROL_QUEUE,
            &[
                RawDesc::Readable(req.as_slice().to_vec()),
                RawDesc::Writable(resp_len - 1),
            ],
        )
        .unwrap();
    assert_eq!(out.used_len, 0);
    assert!(out.writable.iter().flatten().all(|&b| b == UNTOUCHED));
    assert_eq!(h.control(CTRL_GET_TIME, 0, 0).unwrap().now_ns, before);
    // The well-formed chain does what it says.
    let out = h
        .raw_chain(
            CONTROL_QUEUE,
            &[
                RawDesc::Readable(req.as_slice().to_vec()),
                RawDesc::Writable(resp_len),
            ],
        )
        .unwrap();
    assert_eq!(out.used_len, resp_len);
    assert_eq!(h.control(CTRL_GET_TIME, 0, 0).unwrap().now_ns, req.arg0);
}

// ---- write data the driver cannot read -----------------------------------------------------

/// A piece of host memory; an unreadable one fails every DMA read (an unmapped page).
struct Seg {
    bytes: Vec<u8>,
    readable: bool,
}

impl emmc_host::sdhci::DmaSegment for Seg {
    fn len(&self) -> usize {
        self.bytes.len()
    }

    fn read_at(&self, offset: usize, dst: &mut [u8]) -> bool {
        let src = self.bytes.get(offset..offset + dst.len());
        match src.filter(|_| self.readable) {
            Some(src) => {
                dst.copy_from_slice(src);
                true
            }
            None => false,
        }
    }

    fn write_at(&mut self, _offset: usize, _src: &[u8]) -> bool {
        false
    }
}

#[test]
fn write_data_that_cannot_be_read_is_an_adma_error_and_never_reaches_the_card() {
    use emmc_host::mmc::MmcHostOps;
    use emmc_host::sdhci::{
        adma_err, error_int, normal_int, DataDirection, MmcCommand, MmcData, MmcRequest,
        ResponseType, SdhciError,
    };

    let mut h = lb("generic-emmc45");
    common::init(&mut h);
    let lba = 300;
    let before = common::read_blocks(&mut h, lba, 1).bytes();
    let st0 = common::status(&mut h);
    let (sent, now) = (h.stats().requests, h.now());
    let mut sg = [
        Seg {
            bytes: vec![0x5A; 256],
            readable: true,
        },
        Seg {
            bytes: vec![0xC3; 256],
            readable: false,
        },
    ];
    let done = h.request(MmcRequest {
        sbc: None,
        cmd: MmcCommand::new(24, lba, ResponseType::R1),
        data: Some(MmcData {
            blksz: 512,
            blocks: 1,
            direction: DataDirection::Write,
            sg: &mut sg,
            timeout_ns: 0,
            timeout_clks: 0,
        }),
        stop: None,
    });
    // What the SDHCI model reports when its DMA cannot read host memory.
    assert_eq!(done.data_error, Some(SdhciError::Adma(adma_err::ST_TFR)));
    assert_eq!(done.adma_err, adma_err::ST_TFR);
    assert!(done.int_status.has_error(error_int::ADMA_ERR));
    assert!(done.int_status.has(normal_int::ERROR_INT));
    assert_eq!(done.bytes_xfered, 0);
    assert!(!done.cmd.issued, "CMD24 not sent");
    assert_eq!(h.stats().requests, sent, "nothing went to the device");
    assert_eq!((done.start_ns, done.end_ns, h.now()), (now, now, now));
    assert_eq!(common::status(&mut h), st0, "the card saw nothing");
    assert_eq!(common::read_blocks(&mut h, lba, 1).bytes(), before);
    // With every byte readable the same request writes.
    sg[1].readable = true;
    let done = h.request(MmcRequest {
        sbc: None,
        cmd: MmcCommand::new(24, lba, ResponseType::R1),
        data: Some(MmcData {
            blksz: 512,
            blocks: 1,
            direction: DataDirection::Write,
            sg: &mut sg,
            timeout_ns: 0,
            timeout_clks: 0,
        }),
        stop: None,
    });
    assert_eq!(done.data_error, None);
    assert!(done.cmd.issued);
    let mut want = vec![0x5A; 256];
    want.extend([0xC3; 256]);
    h.wait_busy_until(None);
    assert_eq!(common::read_blocks(&mut h, lba, 1).bytes(), want);
}
