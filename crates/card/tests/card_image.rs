//! Image persistence across reopen, and image/model checks. (The command line's image
//! tests are the binary's: tests/cli_image.rs at the top of the workspace.)

mod common;

use std::path::Path;

use common::{ext, pattern, Host};
use emmc_card::model::DeviceModel;
use emmc_card::store::ImageStore;
use emmc_card::{r1, Card, Partition, PowerDown};

fn open(model: &DeviceModel, path: &Path, create: bool) -> Host {
    let layout = Card::layout_for(model);
    let store = if create {
        ImageStore::create(path, layout, &model.name).unwrap()
    } else {
        ImageStore::open(path, layout, &model.name).unwrap()
    };
    Host {
        card: Card::new(model.clone(), Box::new(store)).unwrap(),
        now: 0,
    }
}

#[test]
fn data_and_persistent_state_survive_reopening_the_image() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("card.img");
    let model = common::model();
    let user = pattern(1, 16);
    let boot = pattern(2, 4);
    let gp = pattern(3, 2);
    {
        let mut h = open(&model, &path, true);
        h.init();
        h.write(12345, &user, 0);
        h.switch_ok(ext::FLUSH_CACHE, 1);
        h.select_partition(Partition::Boot1);
        h.write(0, &boot, 1 << 31);
        h.select_partition(Partition::User);
        h.switch_ok(ext::PARTITION_CONFIG, 0x08); // boot from boot1
        h.switch_ok(ext::BOOT_WP, 0x80 | 0x08 | 0x04); // boot2 permanently protected
        h.r1b(28, 4096); // temporary WP of the group at 4096
        h.switch_ok(ext::GP_SIZE_MULT, 1);
        h.switch_ok(ext::PARTITION_SETTING_COMPLETED, 1);
        let written = pattern(4, 1);
        h.write(9, &written, 0); // cached and never flushed: the daemon is killed
                                 // A killed daemon: no clean shutdown, the card object just disappears.
    }
    {
        let mut h = open(&model, &path, false);
        h.init();
        assert_eq!(
            h.card.partition_sectors(Partition::Gp(0)),
            1024,
            "partitioning took effect at power-on"
        );
        assert_data_eq!(h.read(12345, 16), user, "flushed user data");
        assert!(
            h.read(9, 1).iter().all(|&b| b == 0),
            "unflushed cached data is gone"
        );
        let e = h.ext_csd();
        assert_eq!(
            e[ext::PARTITION_CONFIG as usize],
            0x08,
            "boot enable kept, access reset"
        );
        assert_eq!(
            e[ext::BOOT_WP_STATUS],
            0b1000,
            "boot2 permanent protection kept"
        );
        assert_eq!(e[163], 1, "BKOPS_EN kept");
        assert_ne!(
            h.write(4096, &pattern(5, 1), 0) & r1::WP_VIOLATION,
            0,
            "temporary WP kept"
        );
        h.select_partition(Partition::Boot1);
        assert_data_eq!(h.read(0, 4), boot, "reliable boot write");
        h.select_partition(Partition::Gp(0));
        assert_eq!(h.write(1022, &gp, 0) & r1::ERRORS, 0);
        h.card.power_off(h.now, PowerDown::Clean);
    }
    let mut h = open(&model, &path, false);
    h.init();
    h.select_partition(Partition::Gp(0));
    assert_data_eq!(h.read(1022, 2), gp, "clean shutdown flushed the cache");
}

#[test]
fn opening_an_image_with_another_model_is_refused_with_the_reason() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("card.img");
    let model = common::model();
    ImageStore::create(&path, Card::layout_for(&model), &model.name).unwrap();
    let mut other = model.clone();
    other.ext_csd.sec_count *= 2;
    let err = ImageStore::open(&path, Card::layout_for(&other), &model.name).unwrap_err();
    assert!(err.to_string().contains("user area"), "{err}");
    let err = ImageStore::open(&path, Card::layout_for(&model), "toshiba-mmc32g").unwrap_err();
    assert!(err.to_string().contains("toshiba-mmc32g"), "{err}");
}
