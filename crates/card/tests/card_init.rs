//! Bring-up: the Linux MMC core's init sequence reaches tran with the expected registers.

mod common;

use common::{ext, Host, RCA_ARG};
use emmc_card::{r1, CardState, Response};

#[test]
fn linux_init_sequence_reaches_tran_with_expected_registers() {
    let mut h = Host::new(common::model());
    assert_eq!(h.card.state(), CardState::Idle);
    assert_eq!(h.cmd(0, 0), None, "CMD0 has no response");
    // SD/SDIO probes in idle get no answer.
    assert_eq!(h.cmd(8, 0x1AA), None);
    assert_eq!(h.cmd(5, 0), None);
    assert_eq!(h.cmd(55, 0), None);
    // Inquiry CMD1 with argument 0: OCR with the busy bit clear, still idle.
    assert_eq!(h.cmd(1, 0), Some(Response::R3(0x40FF_8080)));
    assert_eq!(h.card.state(), CardState::Idle);
    // CMD1 with the host's window and sector mode: busy first, then ready.
    assert_eq!(h.cmd(1, 0x40FF_8080), Some(Response::R3(0x40FF_8080)));
    assert_eq!(h.cmd(1, 0x40FF_8080), Some(Response::R3(0xC0FF_8080)));
    assert_eq!(h.card.state(), CardState::Ready);
    let cid = match h.cmd(2, 0) {
        Some(Response::R2(cid)) => cid,
        other => panic!("CMD2: {other:?}"),
    };
    assert_eq!(cid[0], 0xAA, "MID");
    assert_eq!(&cid[3..9], b"EMU45A", "PNM");
    assert_eq!(cid[15] & 1, 1, "R2 ends with the end bit");
    assert_eq!(cid[15] >> 1, emmc_card::crc::crc7(&cid[..15]), "CID CRC7");
    // CMD3: the answer reports the state at reception (ident) and READY_FOR_DATA.
    assert_eq!(h.r1(3, RCA_ARG), 0x0000_0500);
    let csd = match h.cmd(9, RCA_ARG) {
        Some(Response::R2(csd)) => csd,
        other => panic!("CMD9: {other:?}"),
    };
    assert_eq!(csd[0] >> 6, 3, "CSD_STRUCTURE");
    assert_eq!((csd[0] >> 2) & 0xF, 4, "SPEC_VERS");
    assert_eq!(csd[15] >> 1, emmc_card::crc::crc7(&csd[..15]), "CSD CRC7");
    assert_eq!(h.r1(7, RCA_ARG), 0x0000_0700, "CMD7 answered in stby");
    assert_eq!(h.status(), 0x0000_0900, "idle tran status");
    let e = h.ext_csd();
    assert_eq!(e[ext::EXT_CSD_REV], 6);
    assert_eq!(e[194], 2, "CSD_STRUCTURE in EXT_CSD");
    assert_eq!(
        u32::from_le_bytes(e[212..216].try_into().unwrap()),
        15_269_888,
        "SEC_COUNT"
    );
    assert_eq!(e[196], 0x17, "DEVICE_TYPE");
    assert_eq!(e[226], 32, "BOOT_SIZE_MULT");
    assert_eq!(e[168], 32, "RPMB_SIZE_MULT");
    assert_eq!(e[500], 63, "MAX_PACKED_WRITES");
    assert_eq!(e[503], 0x01, "HPI_FEATURES");
    assert_eq!(e[502], 0x01, "BKOPS_SUPPORT");
    assert_eq!(
        u32::from_le_bytes(e[249..253].try_into().unwrap()),
        4096,
        "CACHE_SIZE"
    );
    // The switches Linux makes, each checked with CMD13.
    h.switch_ok(ext::ERASE_GROUP_DEF, 1);
    h.switch_ok(ext::POWER_OFF_NOTIFICATION, 1);
    h.switch_ok(ext::BUS_WIDTH, 2);
    h.switch_ok(ext::HS_TIMING, 1);
    h.switch_ok(ext::CACHE_CTRL, 1);
    h.switch_ok(ext::BKOPS_EN, 1);
    h.switch_ok(ext::HPI_MGMT, 1);
    h.switch_ok(ext::EXCEPTION_EVENTS_CTRL, 0x08);
    let e = h.ext_csd();
    assert_eq!(e[33], 1, "CACHE_CTRL reads back");
    assert_eq!(e[161], 1, "HPI_MGMT reads back");
    assert_eq!(e[163], 1, "BKOPS_EN reads back");
    assert_eq!(e[185], 1, "HS_TIMING reads back");
    assert_eq!(e[183], 0, "BUS_WIDTH is write-only and reads 0");
    assert_eq!(e[56], 0x08, "EXCEPTION_EVENTS_CTRL");
    assert_eq!(h.card.bus_config(), (1, 2));
    assert_eq!(h.card.state(), CardState::Tran);
    assert_eq!(h.status() & !r1::READY_FOR_DATA, 4 << 9);
}

#[test]
fn harness_init_and_a_read_write_round_trip() {
    let mut h = Host::ready(common::model());
    let data = common::pattern(7, 8);
    assert_eq!(h.write(1000, &data, 0) & r1::ERRORS, 0);
    assert_eq!(h.read(1000, 8), data);
}
