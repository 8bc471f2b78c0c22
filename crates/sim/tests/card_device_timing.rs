//! The SDHCI controller model charges a block request exactly what the simulator's
//! direct `CardDevice` charges, in every bus mode: the requests here are built by hand as
//! Linux's block driver builds them (`emmc_host::testing`), and run on the controller
//! without `CardDevice`.

use emmc_card::model::{BusTiming, DeviceModel};
use emmc_card::store::NullStore;
use emmc_card::Card;
use emmc_host::mmc::HostCaps;
use emmc_host::sdhci::SdhciConfig;
use emmc_host::testing::{brought_up_with, read_request, write_request};
use emmc_sim::device::{BlockDevice, CardDevice};

fn model() -> DeviceModel {
    DeviceModel::load("generic-emmc45").unwrap()
}

/// The controller charges a block request exactly what the simulator's direct
/// `CardDevice` charges: host overhead, CMD23 and CMD18/CMD25 (or CMD17/CMD24) exchanges,
/// data on the bus, the card's access and programming time.
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
        assert_eq!(
            done.duration_ns(),
            expected,
            "{} of {blocks} at {lba} (reliable {reliable}) on {:?}",
            if is_write { "write" } else { "read" },
            model.host
        );
        assert_eq!(s.now, s.card.now());
    }
    assert_eq!(s.card.stats(), dev.card().stats());
}

#[test]
fn timing_equals_card_device_for_reads_and_writes() {
    let mut m = model();
    m.host.request_overhead_ns = 35_000;
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
