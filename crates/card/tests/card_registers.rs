//! CMD6 over EXT_CSD, write protection, lock/unlock, sleep, reset, bus test and tuning.

mod common;

use common::{ext, pattern, Host, RCA_ARG};
use emmc_card::{r1, CardState, Partition, PowerDown, Response};

fn switch_arg(mode: u32, index: u8, value: u8) -> u32 {
    mode << 24 | u32::from(index) << 16 | u32::from(value) << 8
}

#[test]
fn switch_errors_for_read_only_bytes_bad_values_and_unsupported_features() {
    let mut h = Host::ready(common::model());
    let before = h.ext_csd();
    let cases: &[(u8, u8, &str)] = &[
        (192, 7, "EXT_CSD_REV is in the properties segment"),
        (212, 0, "SEC_COUNT"),
        (255, 0, "last properties byte"),
        (
            160,
            0,
            "PARTITIONING_SUPPORT is read-only in the modes segment",
        ),
        (35, 1, "PACKED_FAILURE_INDEX is read-only"),
        (ext::BUS_WIDTH, 3, "BUS_WIDTH 3 is reserved"),
        (ext::BUS_WIDTH, 0x86, "enhanced strobe is 5.1"),
        (ext::HS_TIMING, 3, "HS400 is 5.0"),
        (ext::HS_TIMING, 0x21, "driver type 2 is not supported"),
        (ext::POWER_OFF_NOTIFICATION, 4, "sleep notification is 5.0"),
        (ext::CACHE_CTRL, 3, "CACHE_CTRL has one bit"),
        (ext::FLUSH_CACHE, 2, "barrier is 5.0"),
        (ext::PARTITION_CONFIG, 0x80, "reserved bit 7"),
        (ext::PARTITION_CONFIG, 4, "GP1 does not exist"),
        (
            ext::PARTITION_CONFIG,
            0x18,
            "BOOT_PARTITION_ENABLE 3 is reserved",
        ),
        (
            ext::EXCEPTION_EVENTS_CTRL,
            0x01,
            "URGENT_BKOPS has no enable bit",
        ),
        (ext::ERASE_GROUP_DEF, 2, "one bit"),
        (ext::BKOPS_EN, 0, "BKOPS_EN is one-time"),
        (ext::BKOPS_EN, 2, "AUTO_EN is 5.0"),
        (162, 3, "RST_n_FUNCTION 3 is reserved"),
        (191, 1, "only command set 0"),
        (15, 1, "CMDQ_MODE_EN is 5.1"),
    ];
    for &(index, value, why) in cases {
        let s = h.switch(index, value);
        assert_ne!(s & r1::SWITCH_ERROR, 0, "{why}: {}", r1::describe(s));
        assert_eq!(
            h.status() & r1::SWITCH_ERROR,
            0,
            "{why}: SWITCH_ERROR clears once read"
        );
        assert_eq!(h.card.state(), CardState::Tran);
    }
    assert_eq!(h.ext_csd(), before, "refused switches changed nothing");
    // Command-set mode with set 0 is accepted; another set is not.
    assert_eq!(h.r1b(6, 0), 0x0000_0900);
    assert_eq!(h.status() & r1::SWITCH_ERROR, 0);
    h.r1b(6, 1);
    assert_ne!(h.status() & r1::SWITCH_ERROR, 0);
}

#[test]
fn switch_access_modes_set_clear_and_write_bits() {
    let mut h = Host::ready(common::model());
    // EXCEPTION_EVENTS_CTRL starts at 0x08 after init.
    h.r1b(6, switch_arg(1, ext::EXCEPTION_EVENTS_CTRL, 0x02));
    assert_eq!(h.ext_csd()[56], 0x0A, "set bits");
    h.r1b(6, switch_arg(2, ext::EXCEPTION_EVENTS_CTRL, 0x08));
    assert_eq!(h.ext_csd()[56], 0x02, "clear bits");
    h.r1b(6, switch_arg(3, ext::EXCEPTION_EVENTS_CTRL, 0x04));
    assert_eq!(h.ext_csd()[56], 0x04, "write byte");
    assert_eq!(h.status() & r1::SWITCH_ERROR, 0);
}

#[test]
fn soft_reset_returns_the_volatile_ext_csd_fields_to_their_defaults() {
    let mut h = Host::ready(common::model());
    h.switch_ok(ext::PARTITION_CONFIG, 0x09); // boot enable 1, access boot1
    let e = h.ext_csd();
    assert_eq!((e[33], e[161], e[175], e[185], e[179]), (1, 1, 1, 1, 0x09));
    h.init();
    let e = h.ext_csd();
    assert_eq!((e[33], e[161]), (1, 1), "init turned them on again");
    h.cmd(0, 0);
    // After CMD0 and re-identification without the switches:
    h.cmd(1, 0x40FF_8080);
    h.cmd(1, 0x40FF_8080);
    h.cmd(2, 0);
    h.r1(3, RCA_ARG);
    h.r1(7, RCA_ARG);
    let e = h.ext_csd();
    assert_eq!(e[33], 0, "CACHE_CTRL");
    assert_eq!(e[161], 0, "HPI_MGMT");
    assert_eq!(e[175], 0, "ERASE_GROUP_DEF");
    assert_eq!(e[185], 0, "HS_TIMING");
    assert_eq!(e[56], 0, "EXCEPTION_EVENTS_CTRL");
    assert_eq!(
        e[179], 0x08,
        "PARTITION_ACCESS resets, BOOT_PARTITION_ENABLE stays"
    );
    assert_eq!(e[163], 1, "BKOPS_EN is non-volatile");
    assert_eq!(h.card.bus_config(), (0, 0));
}

#[test]
fn boot_partition_write_protection_power_on_and_permanent() {
    let mut h = Host::ready(common::model());
    let data = pattern(1, 1);
    // Power-on protection of boot area 2 only (B_SEC_WP_SEL + B_PWR_WP_SEC_SEL).
    h.switch_ok(ext::BOOT_WP, 0x80 | 0x02 | 0x01);
    assert_eq!(h.ext_csd()[ext::BOOT_WP_STATUS], 0b0100);
    h.select_partition(Partition::Boot2);
    assert_ne!(h.write(0, &data, 0) & r1::WP_VIOLATION, 0);
    h.select_partition(Partition::Boot1);
    assert_eq!(h.write(0, &data, 0) & r1::ERRORS, 0, "boot1 still writable");
    // A power cycle ends power-on protection.
    h.card.power_cycle(h.now, PowerDown::Clean);
    h.init();
    assert_eq!(h.ext_csd()[ext::BOOT_WP_STATUS], 0);
    h.select_partition(Partition::Boot2);
    assert_eq!(h.write(0, &data, 0) & r1::ERRORS, 0);
    // Permanent protection of both areas survives power cycles.
    h.switch_ok(ext::BOOT_WP, 0x04);
    assert_eq!(h.ext_csd()[ext::BOOT_WP_STATUS], 0b1010);
    h.card.power_cycle(h.now, PowerDown::Sudden);
    h.init();
    assert_eq!(h.ext_csd()[ext::BOOT_WP_STATUS], 0b1010);
    h.select_partition(Partition::Boot1);
    assert_ne!(h.write(0, &pattern(2, 1), 0) & r1::WP_VIOLATION, 0);
    // Erasing a protected boot area skips it.
    let s = h.erase(0, 0, 0x0000_0001);
    assert_ne!(s & r1::WP_ERASE_SKIP, 0);
    let mut buf = vec![0u8; 512];
    h.card.peek(Partition::Boot1, 0, &mut buf).unwrap();
    assert_data_eq!(buf, data);
    // Power-on protection can be disabled until the next cycle.
    let mut h = Host::ready(common::model());
    h.switch_ok(ext::BOOT_WP, 0x40);
    assert_ne!(
        h.switch(ext::BOOT_WP, 0x41) & r1::SWITCH_ERROR,
        0,
        "B_PWR_WP_DIS blocks B_PWR_WP_EN"
    );
}

#[test]
fn write_protect_groups_temporary_power_on_and_permanent() {
    let mut h = Host::ready(common::model());
    let group = 1024u64; // HC WP group with ERASE_GROUP_DEF=1
    let data = pattern(3, 1);
    // Temporary protection of group 2.
    h.r1b(28, h.addr(2 * group + 5));
    assert_ne!(h.write(2 * group, &data, 0) & r1::WP_VIOLATION, 0);
    assert_eq!(h.write(3 * group, &data, 0) & r1::ERRORS, 0);
    // CMD30: bit 0 describes the group of the address.
    assert_eq!(h.r1(30, h.addr(group)) & r1::ERRORS, 0);
    let mut bits = [0u8; 4];
    h.card.read_data(h.now, &mut bits).unwrap();
    assert_eq!(u32::from_be_bytes(bits), 0b10);
    // Power-on protection (USER_WP.US_PWR_WP_EN) of group 4, permanent of group 6.
    h.switch_ok(171, 0x01);
    h.r1b(28, h.addr(4 * group));
    h.switch_ok(171, 0x04);
    h.r1b(28, h.addr(6 * group));
    h.switch_ok(171, 0x00);
    h.r1(31, h.addr(2 * group));
    let mut types = [0u8; 8];
    h.card.read_data(h.now, &mut types).unwrap();
    assert_eq!(
        u64::from_be_bytes(types),
        0b11_00_10_00_01,
        "temporary, power-on, permanent"
    );
    // CMD29 clears only temporary protection.
    h.r1b(29, h.addr(2 * group));
    assert_eq!(h.write(2 * group, &data, 0) & r1::ERRORS, 0);
    h.r1b(29, h.addr(6 * group));
    assert_ne!(
        h.status() & r1::WP_VIOLATION,
        0,
        "permanent protection cannot be cleared"
    );
    // Temporary and permanent survive power loss; power-on does not.
    h.r1b(28, h.addr(2 * group));
    h.card.power_cycle(h.now, PowerDown::Sudden);
    h.init();
    assert_ne!(
        h.write(2 * group, &data, 0) & r1::WP_VIOLATION,
        0,
        "temporary persists"
    );
    assert_eq!(
        h.write(4 * group, &data, 0) & r1::ERRORS,
        0,
        "power-on is gone"
    );
    assert_ne!(
        h.write(6 * group, &data, 0) & r1::WP_VIOLATION,
        0,
        "permanent persists"
    );
    // An erase across protected groups skips them.
    let s = h.erase(group, 3 * group - 1, 0);
    assert_ne!(s & r1::WP_ERASE_SKIP, 0);
}

#[test]
fn csd_temporary_write_protect_covers_the_whole_card() {
    let mut h = Host::ready(common::model());
    let mut csd = match h.cmd(7, 0) {
        None => {
            // Deselected; read the CSD in stby.
            match h.cmd(9, RCA_ARG) {
                Some(Response::R2(csd)) => csd,
                other => panic!("{other:?}"),
            }
        }
        other => panic!("{other:?}"),
    };
    h.r1(7, RCA_ARG);
    csd[14] |= 1 << 4; // TMP_WRITE_PROTECT
    assert_eq!(h.r1(27, 0) & r1::ERRORS, 0);
    h.card.write_data(h.now, &csd).unwrap();
    h.wait_busy();
    assert_eq!(h.status() & r1::CID_CSD_OVERWRITE, 0);
    assert_ne!(h.write(0, &pattern(1, 1), 0) & r1::WP_VIOLATION, 0);
    // Changing a read-only CSD bit is refused.
    csd[3] ^= 1;
    h.r1(27, 0);
    h.card.write_data(h.now, &csd).unwrap();
    h.wait_busy();
    assert_ne!(h.status() & r1::CID_CSD_OVERWRITE, 0);
    // CMD26: the CID is programmed once, at the factory.
    h.r1(26, 0);
    h.card.write_data(h.now, &[0u8; 16]).unwrap();
    h.wait_busy();
    assert_ne!(h.status() & r1::CID_CSD_OVERWRITE, 0);
}

fn cmd42(h: &mut Host, block: &[u8]) -> u32 {
    assert_eq!(h.r1(16, block.len() as u32) & r1::ERRORS, 0);
    assert_eq!(h.r1(42, 0) & r1::ERRORS, 0);
    h.card.write_data(h.now, block).unwrap();
    h.wait_busy();
    h.status()
}

#[test]
fn lock_unlock_with_a_password() {
    let mut h = Host::ready(common::model());
    let data = pattern(4, 1);
    h.write(7, &data, 1 << 24);
    // Set password "abcd" and lock.
    let s = cmd42(&mut h, &[0x05, 4, b'a', b'b', b'c', b'd']);
    assert_eq!(s & r1::LOCK_UNLOCK_FAILED, 0);
    assert_ne!(s & r1::DEVICE_IS_LOCKED, 0);
    // Locked: data commands are illegal.
    assert_eq!(h.cmd(17, 7), None);
    assert_ne!(h.status() & r1::ILLEGAL_COMMAND, 0);
    // Wrong password fails.
    let s = cmd42(&mut h, &[0x00, 4, b'a', b'b', b'c', b'x']);
    assert_ne!(s & r1::LOCK_UNLOCK_FAILED, 0);
    assert_ne!(s & r1::DEVICE_IS_LOCKED, 0);
    // A card with a password powers up locked.
    h.card.power_cycle(h.now, PowerDown::Sudden);
    h.init();
    assert_ne!(h.status() & r1::DEVICE_IS_LOCKED, 0);
    let s = cmd42(&mut h, &[0x00, 4, b'a', b'b', b'c', b'd']);
    assert_eq!(s & (r1::DEVICE_IS_LOCKED | r1::LOCK_UNLOCK_FAILED), 0);
    assert_data_eq!(h.read_single(7), data);
    // Forced erase of a locked card clears data and password.
    cmd42(&mut h, &[0x04, 4, b'a', b'b', b'c', b'd']);
    let s = cmd42(&mut h, &[0x08]);
    assert_eq!(s & (r1::DEVICE_IS_LOCKED | r1::LOCK_UNLOCK_FAILED), 0);
    assert!(h.read_single(7).iter().all(|&b| b == 0));
    assert_ne!(
        cmd42(&mut h, &[0x04, 4, b'a', b'b', b'c', b'd']) & r1::LOCK_UNLOCK_FAILED,
        0,
        "no password any more"
    );
}

#[test]
fn sleep_awake_and_inactive() {
    let mut h = Host::ready(common::model());
    let data = pattern(5, 2);
    h.write(9, &data, 0);
    // Sleep needs stby: deselect first.
    assert_eq!(h.cmd(5, RCA_ARG | 0x8000), None, "CMD5 is illegal in tran");
    assert_eq!(h.cmd(7, 0), None);
    assert_eq!(h.card.state(), CardState::Stby);
    assert!(matches!(h.cmd(5, RCA_ARG | 0x8000), Some(Response::R1b(_))));
    h.wait_busy();
    assert_eq!(h.card.state(), CardState::Slp);
    assert!(
        h.card.volatile_sectors().is_empty(),
        "the cache is written back on the way to sleep"
    );
    assert_eq!(h.cmd(13, RCA_ARG), None, "nothing but CMD0/CMD5 in slp");
    assert_eq!(h.cmd(0, 0x1234), None);
    assert_eq!(h.card.state(), CardState::Slp);
    assert!(matches!(h.cmd(5, RCA_ARG), Some(Response::R1b(_))));
    h.wait_busy();
    assert_eq!(h.card.state(), CardState::Stby);
    h.r1(7, RCA_ARG);
    assert_data_eq!(h.read(9, 2), data);
    // CMD15 makes the card inactive until a power cycle.
    h.cmd(7, 0);
    assert_eq!(h.cmd(15, RCA_ARG), None);
    assert_eq!(h.card.state(), CardState::Ina);
    assert_eq!(h.cmd(0, 0), None);
    assert_eq!(h.cmd(1, 0x40FF_8080), None);
    assert_eq!(h.card.state(), CardState::Ina);
    h.card.power_cycle(h.now, PowerDown::Clean);
    h.init();
    assert_data_eq!(h.read(9, 2), data);
}

#[test]
fn bus_test_returns_the_inverted_pattern_and_hs200_tuning_the_spec_block() {
    let mut h = Host::new(common::model());
    h.init();
    // After the 8-bit switch: CMD19 with the 8-byte pattern, CMD14 returns its inverse.
    assert_eq!(h.r1(19, 0) & r1::ERRORS, 0);
    assert_eq!(h.card.state(), CardState::Btst);
    h.card
        .write_data(h.now, &[0x55, 0xAA, 0, 0, 0, 0, 0, 0])
        .unwrap();
    assert_eq!(h.r1(14, 0) & r1::ERRORS, 0);
    let mut back = [0u8; 8];
    h.card.read_data(h.now, &mut back).unwrap();
    assert_eq!(back, [0xAA, 0x55, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF]);
    assert_eq!(h.card.state(), CardState::Tran);
    // CMD21 is illegal outside HS200.
    assert_eq!(h.cmd(21, 0), None);
    assert_ne!(h.status() & r1::ILLEGAL_COMMAND, 0);
    h.switch_ok(ext::HS_TIMING, 0);
    h.switch_ok(ext::HS_TIMING, 2);
    assert_eq!(h.r1(21, 0) & r1::ERRORS, 0);
    let mut block = [0u8; 128];
    h.card.read_data(h.now, &mut block).unwrap();
    assert_eq!(
        &block[..8],
        &[0xff, 0xff, 0x00, 0xff, 0xff, 0xff, 0x00, 0x00]
    );
    assert_eq!(
        &block[120..],
        &[0xff, 0x77, 0x77, 0xff, 0x77, 0xbb, 0xdd, 0xee]
    );
    // 4-bit bus: the 64-byte block.
    h.switch_ok(ext::HS_TIMING, 0);
    h.switch_ok(ext::BUS_WIDTH, 1);
    h.switch_ok(ext::HS_TIMING, 2);
    h.r1(21, 0);
    let mut block = [0u8; 64];
    h.card.read_data(h.now, &mut block).unwrap();
    assert_eq!(
        &block[..8],
        &[0xff, 0x0f, 0xff, 0x00, 0xff, 0xcc, 0xc3, 0xcc]
    );
    assert_eq!(block[63], 0xde);
    // DDR needs high speed timing first.
    assert_ne!(h.switch(ext::BUS_WIDTH, 6) & r1::SWITCH_ERROR, 0);
}

#[test]
fn gp_partitioning_is_one_time_and_takes_effect_after_a_power_cycle() {
    let mut h = Host::ready(common::model());
    h.switch_ok(ext::GP_SIZE_MULT + 3, 4); // GP2 = 4 groups
    h.switch_ok(ext::PARTITION_SETTING_COMPLETED, 1);
    assert_ne!(
        h.switch(ext::GP_SIZE_MULT, 1) & r1::SWITCH_ERROR,
        0,
        "settings are frozen"
    );
    assert_ne!(
        h.switch(ext::PARTITION_CONFIG, 5) & r1::SWITCH_ERROR,
        0,
        "GP2 not there yet"
    );
    h.card.power_cycle(h.now, PowerDown::Sudden);
    h.init();
    assert_eq!(h.card.partition_sectors(Partition::Gp(1)), 4 * 1024);
    h.switch_ok(ext::PARTITION_CONFIG, 5);
    let data = pattern(6, 3);
    h.write(4 * 1024 - 3, &data, 0);
    assert_data_eq!(h.read(4 * 1024 - 3, 3), data);
    assert_ne!(
        h.switch(ext::PARTITION_SETTING_COMPLETED, 0) & r1::SWITCH_ERROR,
        0
    );
    // Too large: refused at PARTITION_SETTING_COMPLETED.
    let mut h = Host::ready(common::model());
    h.switch_ok(ext::GP_SIZE_MULT, 0xFF);
    h.switch_ok(ext::GP_SIZE_MULT + 1, 0xFF);
    assert_ne!(
        h.switch(ext::PARTITION_SETTING_COMPLETED, 1) & r1::SWITCH_ERROR,
        0
    );
}
