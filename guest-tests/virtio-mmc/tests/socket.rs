//! The driver against the daemon over a real vhost-user socket:
//! `vhost-user-emmc serve --transport mmc --timing off`, started per test on a fresh image
//! in a temporary directory. The daemon binary comes from the workspace build
//! (`cargo build -p vhost-user-emmc`, which `cargo test --workspace` does) or
//! `$VHOST_USER_EMMC_BIN`.

mod common;

use std::time::{Duration, Instant};

use emmc_host::mmc::MmcHostOps;
use emmc_host::packing::PackingMode;
use emmc_host::sdhci::SdhciError;
use emmc_sim::blkbench::{driver, run_experiment_on, DriverSetup, Experiment};
use virtio_mmc_driver::daemon::Daemon;
use virtio_mmc_driver::{
    TransportError, VhostUserOptions, VhostUserTransport, VirtioMmcBlk, VirtioMmcHost,
};

fn daemon(model: &str) -> Daemon {
    Daemon::spawn(model, &[]).expect("the daemon starts")
}

fn attach(d: &Daemon) -> VirtioMmcHost {
    VirtioMmcHost::connect(d.socket_str()).expect("attach to the daemon")
}

#[test]
fn attaches_with_version_1_and_reads_the_config_space() {
    let d = daemon("generic-emmc45");
    let h = attach(&d);
    let f = h.transport().features();
    assert_ne!(f & (1 << 32), 0, "VIRTIO_F_VERSION_1 negotiated");
    let c = h.config();
    assert!(c.max_segs >= 1 && c.max_seg_size >= 512);
    assert!(c.max_req_size >= 512 * 1024 / 2, "{c:?}");
    assert!(c.max_blk_size >= 512);
    let caps = h.host_caps();
    assert_eq!(caps.bus_width, 8, "the model's host has 8 lines: {c:?}");
    assert!(caps.hpi && caps.bkops && caps.cache, "{c:?}");
}

#[test]
fn bring_up_reaches_tran_with_the_models_ext_csd() {
    let d = daemon("generic-emmc45");
    let m = common::model("generic-emmc45");
    let mut blk = common::bring_up(attach(&d), &m);
    // And the block API moves data.
    let data = common::pattern(0x42, 128 * 1024);
    blk.write(8192, &data).unwrap();
    blk.write_fua(16_384, &data[..8192]).unwrap();
    blk.flush().unwrap();
    let mut back = vec![0u8; data.len()];
    blk.read(8192, &mut back).unwrap();
    assert!(back == data, "read back what was written");
    let mut back = vec![0u8; 8192];
    blk.read(16_384, &mut back).unwrap();
    assert!(back == data[..8192]);
    blk.discard(0, 2048).unwrap();
    assert!(blk.driver().stats().flushes >= 1);
}

#[test]
fn user_boot_and_gp_partitions_keep_their_data() {
    let d = daemon("generic-emmc45");
    common::partitions(&mut attach(&d));
}

#[test]
fn a_packed_write_of_n_entries_reads_back() {
    let d = daemon("generic-emmc45");
    common::packed_write(&mut attach(&d), 24);
}

#[test]
fn the_block_driver_packs_queued_writes_through_the_socket() {
    let d = daemon("generic-emmc45");
    let m = common::model("generic-emmc45");
    common::packed_by_the_driver(attach(&d), &m, 16);
}

#[test]
fn hpi_interrupts_a_long_write_and_the_rest_is_reissued() {
    let d = daemon("toshiba-mmc32g");
    common::hpi_long_write(&mut attach(&d));
}

#[test]
fn the_block_drivers_hpi_policy_works_through_the_socket() {
    let d = daemon("toshiba-mmc32g");
    let m = common::model("toshiba-mmc32g");
    common::hpi_by_the_driver(attach(&d), &m);
}

#[test]
fn bkops_is_started_and_interrupted() {
    let d = daemon("toshiba-mmc32g");
    common::bkops_interrupted(&mut attach(&d));
}

#[test]
fn rpmb_key_counter_authenticated_write_and_read() {
    let d = daemon("generic-emmc45");
    common::rpmb(&mut attach(&d));
}

#[test]
fn an_illegal_command_shows_in_the_next_status() {
    let d = daemon("generic-emmc45");
    common::illegal_command(&mut attach(&d));
}

/// Random writes on a flash model until the card asks for urgent BKOPS: the device posts
/// EXCEPTION (URGENT_BKOPS in EXCEPTION_EVENTS_STATUS) and BKOPS_NEEDED on the event queue
/// the driver filled, as soon as a response carries EXCEPTION_EVENT.
#[test]
fn urgent_bkops_reaches_the_driver_as_events() {
    use emmc_card::ext_csd as ext;
    use emmc_card::r1;
    use emmc_frontend::mmc::proto::*;
    let d = daemon("toshiba-mmc32g");
    let mut h = attach(&d);
    common::init(&mut h);
    assert!(h.take_events().unwrap().is_empty(), "nothing to say yet");
    let data = common::pattern(0x5a, 4096);
    let mut x: u32 = 7;
    let mut raised = None;
    for i in 0..200_000u32 {
        x = x.wrapping_mul(1_103_515_245).wrapping_add(12_345);
        let addr = (x >> 4) % 60_000_000 / 8 * 8;
        let r = common::write_blocks(&mut h, addr, &data, 0);
        if r.resp.cmd.resp[0] & r1::EXCEPTION_EVENT != 0 {
            raised = Some(i);
            break;
        }
    }
    let writes = raised.expect("random writes made the card raise EXCEPTION_EVENT");
    let e = common::ext_csd(&mut h);
    assert!(
        e[ext::BKOPS_STATUS] >= 2,
        "after {writes} writes BKOPS_STATUS is {}",
        e[ext::BKOPS_STATUS]
    );
    let events = h.take_events().unwrap();
    let kinds: Vec<(u32, u32)> = events.iter().map(|e| (e.kind, e.val)).collect();
    let exception = events
        .iter()
        .find(|e| e.kind == EVENT_EXCEPTION)
        .unwrap_or_else(|| panic!("an EXCEPTION event: {kinds:?}"));
    assert_ne!(
        exception.val & u32::from(ext::EE_URGENT_BKOPS),
        0,
        "URGENT_BKOPS in {:#x}",
        exception.val
    );
    assert!(
        events
            .iter()
            .any(|e| e.kind == EVENT_BKOPS_NEEDED && e.val >= 2),
        "a BKOPS_NEEDED event: {kinds:?}"
    );
}

/// `--timing realtime` through the socket: a completion arrives when its card time has
/// elapsed on the wall clock, and IDLE_UNTIL waits for its card time.
#[test]
fn in_real_time_completions_wait_for_their_card_time() {
    let d = Daemon::spawn("generic-emmc45", &["--timing", "realtime"]).expect("the daemon starts");
    let mut h = attach(&d);
    common::init(&mut h);
    let data = common::pattern(0x11, 64 * 1024);
    let submitted = Instant::now();
    let r = common::write_blocks(&mut h, 4096, &data, 0);
    let wall = submitted.elapsed();
    let card = Duration::from_nanos(r.resp.end_ns - r.resp.start_ns);
    assert!(
        card > Duration::from_micros(200),
        "a 64 KiB write takes card time: {card:?}"
    );
    assert!(
        wall + Duration::from_micros(50) >= card,
        "completed after {wall:?} of wall time, {card:?} of card time"
    );
    // The write started no earlier in card time than it was sent in wall time, so from
    // its sending to the end of an idle up to card time `now + 30 ms` at least that much
    // card time must pass on the wall clock, however late either side runs.
    let now = h.now();
    h.idle_until(now + 30_000_000);
    let total = submitted.elapsed();
    let card_span = Duration::from_nanos(now + 30_000_000 - r.resp.start_ns);
    assert!(
        total + Duration::from_micros(50) >= card_span,
        "IDLE_UNTIL reached card time {card_span:?} after the write's start in {total:?}"
    );
    assert!(
        total < Duration::from_secs(2),
        "and not much more: {total:?}"
    );
    assert!(h.now() >= now + 30_000_000);
}

#[test]
fn malformed_requests_get_an_error_status_and_the_daemon_goes_on() {
    let mut d = daemon("generic-emmc45");
    common::malformed(&mut attach(&d));
    assert!(d.running());
}

/// Seed 000's lmdd write (64 KiB writeback requests and an fsync) on msm-emmc45-sdr50,
/// packing always and off: the block driver through the socket, in the device's card
/// time, against the simulator's in-process run.
#[test]
fn lmdd_write_through_the_socket_matches_the_simulator() {
    let m = common::real_driver_model("msm-emmc45-sdr50");
    let exp = Experiment::LmddWrite {
        bytes: 16 << 20,
        bs: 128,
        depth: 128,
        batch: 16,
    };
    let mut rates = Vec::new();
    for packing in [PackingMode::Always, PackingMode::Off] {
        let setup = DriverSetup {
            packing,
            ..DriverSetup::default()
        };
        let mut local = driver(&m, &setup).unwrap();
        let sim = run_experiment_on(&mut local, &exp);
        let d = daemon("msm-emmc45-sdr50");
        let mut drv = emmc_host::blkdrv::MmcBlk::probe(attach(&d), setup.blk_config(&m))
            .expect("probe over the socket");
        let sock = run_experiment_on(&mut drv, &exp);
        assert!(drv.host().error().is_none());
        let (s, w) = (sock.write.mb_per_s, sim.write.mb_per_s);
        eprintln!(
            "lmdd-write {packing:?}: socket {s:.3} MB/s ({} ops, {} packed), simulator {w:.3} MB/s ({} ops, {} packed)",
            sock.write.ops, sock.driver.packed_writes, sim.write.ops, sim.driver.packed_writes
        );
        assert_eq!(sock.write.ops, sim.write.ops);
        assert!(sim.write.ops > 0 && w > 0.0);
        assert!(
            (s - w).abs() <= 0.02 * w,
            "{packing:?}: socket {s:.3} MB/s vs simulator {w:.3} MB/s"
        );
        if packing == PackingMode::Always {
            assert!(sock.driver.packed_writes > 0, "packing happened");
        } else {
            assert_eq!(sock.driver.packed_writes, 0);
        }
        rates.push(s);
    }
    assert!(rates[0] > rates[1], "packing pays on this model: {rates:?}");
}

/// The daemon goes away: the next request is a transport error, not a panic or a hang,
/// and the MMC core sees commands that time out.
#[test]
fn a_vanished_daemon_is_a_clear_error() {
    let mut d = daemon("generic-emmc45");
    let t = VhostUserTransport::connect_with(
        d.socket_str(),
        VhostUserOptions {
            timeout: Duration::from_secs(20),
            ..VhostUserOptions::default()
        },
    )
    .unwrap();
    let mut h = VirtioMmcHost::new(t).unwrap();
    common::init(&mut h);
    d.kill();
    let start = Instant::now();
    let done = h.request(emmc_host::sdhci::MmcRequest::command(
        emmc_host::sdhci::MmcCommand::for_opcode(13, common::RCA_ARG),
    ));
    assert_eq!(done.cmd.error, Some(SdhciError::CmdTimeout));
    assert!(!done.cmd.issued);
    match h.error() {
        Some(TransportError::Disconnected(_)) | Some(TransportError::Notify(_)) => {}
        other => panic!("expected a disconnection, got {other:?}"),
    }
    assert!(start.elapsed() < Duration::from_secs(10), "noticed quickly");
    // Everything after fails at once with the same error.
    assert!(h.control(0, 0, 0).is_err());
    let blk = VirtioMmcBlk::probe(h, Default::default());
    assert!(blk.is_err());
}
