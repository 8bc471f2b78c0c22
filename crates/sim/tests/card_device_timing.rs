//! What the served path (`CardDevice`: serve's block driver over the SDHCI controller
//! model) charges a block request, in every bus mode: exactly the controller's time for
//! the MMC request Linux's block driver builds (built by hand here with
//! `emmc_host::testing` and run on a bare controller), plus the host's preparation of the
//! block request (`prepare_ns`) and, after a write, the CMD13 status check
//! (`mmc_blk_err_check`) with its own per-request host time. Nothing else, and nothing
//! twice.

use emmc_card::command::ResponseType;
use emmc_card::model::{BusTiming, DeviceModel};
use emmc_card::store::NullStore;
use emmc_card::timing::bus::ResponseLength;
use emmc_card::Card;
use emmc_host::mmc::{HostCaps, MMC_RCA};
use emmc_host::sdhci::SdhciConfig;
use emmc_host::sdhci::{MmcCommand, MmcRequest};
use emmc_host::testing::{brought_up_with, read_request, write_request};
use emmc_sim::device::{BlockDevice, CardDevice};

fn model() -> DeviceModel {
    DeviceModel::load("generic-emmc45").unwrap()
}

/// `CardDevice` charges the controller's request (host overhead, CMD23 and CMD18/CMD25 or
/// CMD17/CMD24 exchanges, data on the bus, the card's access and programming time), the
/// preparation, and CMD13 after a write.
fn timing_matches_card_device(model: DeviceModel, config: SdhciConfig) {
    let mut dev = CardDevice::new(&model).unwrap();
    let layout = Card::layout_for(&model);
    let card = Card::new(model.clone(), Box::new(NullStore::new(layout))).unwrap();
    let mut s = brought_up_with(card, &HostCaps::for_model(&model.host), config);
    assert_eq!(s.host.bus(), dev.bus(), "same bus after bring-up");
    let ops: [(bool, u64, u32, bool); 14] = [
        (true, 0, 8, false),
        (true, 100, 1, false),
        (true, 200, 1, true),
        (true, 300, 2, false),
        (true, 400, 64, false),
        (true, 1000, 256, false),
        (true, 5000, 8, true),
        (false, 0, 1, false),
        (false, 0, 8, false),
        (false, 100, 2, false),
        (false, 400, 64, false),
        (false, 1000, 256, false),
        (false, 7, 3, false),
        (true, 9000, 1024, false),
    ];
    let mut buf = vec![0u8; 1024 * 512];
    for (is_write, lba, blocks, reliable) in ops {
        let len = blocks as usize * 512;
        let expected = if is_write {
            dev.write(lba, blocks, reliable).unwrap()
        } else {
            dev.read(lba, blocks).unwrap()
        };
        let done = if is_write {
            let mut sg = [&buf[..len]];
            s.request(write_request(lba, blocks, reliable, &mut sg))
        } else {
            let mut sg = [&mut buf[..len]];
            s.request(read_request(lba, blocks, &mut sg))
        };
        assert!(done.is_ok(), "{done:?}");
        let cmd13 = if is_write {
            model.host.request_overhead_ns + s.host.bus().command_ns(ResponseLength::Short)
        } else {
            0
        };
        if is_write {
            // The card's side of CMD13: the bare controller sends it too, so both cards
            // see the same commands.
            s.request(status_request());
        }
        assert_eq!(
            done.duration_ns() + model.host.prepare_ns + cmd13,
            expected,
            "{} of {blocks} at {lba} (reliable {reliable}) on {:?}",
            if is_write { "write" } else { "read" },
            model.host
        );
        assert_eq!(s.now, s.card.now());
    }
    assert_eq!(s.card.stats(), dev.card().stats());
}

/// CMD13 to the card at RCA 1, as `mmc_blk_err_check` sends it.
fn status_request() -> MmcRequest<'static, Vec<u8>> {
    MmcRequest::command(MmcCommand::new(
        13,
        u32::from(MMC_RCA) << 16,
        ResponseType::R1,
    ))
}

#[test]
fn timing_equals_card_device_for_reads_and_writes() {
    let mut m = model();
    m.host.request_overhead_ns = 35_000;
    m.host.prepare_ns = 120_000;
    timing_matches_card_device(m.clone(), SdhciConfig::for_model(&m.host));
    // Manual CMD23 costs the same exchange as Auto CMD23.
    timing_matches_card_device(
        m.clone(),
        SdhciConfig {
            auto_cmd23: false,
            ..SdhciConfig::for_model(&m.host)
        },
    );
}

#[test]
fn timing_equals_card_device_in_every_bus_mode() {
    for (timing, clock_hz, bus_width) in [
        (BusTiming::Legacy, 26_000_000, 1),
        (BusTiming::Hs, 52_000_000, 4),
        (BusTiming::Hs, 48_000_000, 8),
        (BusTiming::Ddr52, 52_000_000, 8),
        (BusTiming::Hs200, 200_000_000, 8),
        (BusTiming::Hs200, 150_000_000, 4),
    ] {
        let mut m = model();
        m.host.timing = timing;
        m.host.clock_hz = clock_hz;
        m.host.bus_width = bus_width;
        m.timing.constant_mut().read_block_ns = 3_000;
        timing_matches_card_device(m.clone(), SdhciConfig::for_model(&m.host));
    }
}
