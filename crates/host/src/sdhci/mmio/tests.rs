//! Unit tests of the register-level model: when results become visible, and its parts.
//! The driver-level tests are in `crates/host/tests/sdhci_mmio/`.

use super::layout::*;
use super::transfer::Arrivals;
use super::*;
use crate::sdhci::{error_int, normal_int};
use emmc_card::model::DeviceModel;
use emmc_card::store::MemStore;
use emmc_card::timing::bus::ResponseLength;
use emmc_card::timing::Bus;

fn controller() -> SdhciMmio {
    let m = DeviceModel::load("generic-emmc45").unwrap();
    let card = Card::new(m.clone(), Box::new(MemStore::new(Card::layout_for(&m)))).unwrap();
    SdhciMmio::new(card, SdhciConfig::default(), &m.host)
}

fn w16(s: &mut SdhciMmio, off: u64, v: u16) {
    let now = s.now();
    s.write(now, off, &v.to_le_bytes(), &NoDmaMemory);
}

fn w8(s: &mut SdhciMmio, off: u64, v: u8) {
    let now = s.now();
    s.write(now, off, &[v], &NoDmaMemory);
}

fn r32(s: &mut SdhciMmio, at: Nanos, off: u64) -> u32 {
    let mut b = [0; 4];
    s.read(at, off, &mut b, &NoDmaMemory);
    u32::from_le_bytes(b)
}

/// CMD1 (SEND_OP_COND, R3) with a sector-mode argument, written at `at` as a driver
/// writes it: the argument, then the command register.
fn send_cmd1(s: &mut SdhciMmio, at: Nanos) {
    s.write(
        at,
        SDHCI_ARGUMENT,
        &0x40FF_8080u32.to_le_bytes(),
        &NoDmaMemory,
    );
    w16(s, SDHCI_COMMAND, sdhci_make_cmd(1, SDHCI_CMD_RESP_SHORT));
}

/// Bus power on, 400 kHz, every interrupt enabled.
fn powered() -> SdhciMmio {
    let mut s = controller();
    w8(
        &mut s,
        SDHCI_POWER_CONTROL,
        SDHCI_POWER_330 | SDHCI_POWER_ON,
    );
    w16(
        &mut s,
        SDHCI_CLOCK_CONTROL,
        clock_with_divider(65) | SDHCI_CLOCK_INT_EN | SDHCI_CLOCK_CARD_EN,
    );
    let now = s.now();
    s.write(now, SDHCI_INT_ENABLE, &[0xFF; 4], &NoDmaMemory);
    s.write(now, SDHCI_SIGNAL_ENABLE, &[0xFF; 4], &NoDmaMemory);
    s
}

#[test]
fn the_controller_can_move_to_the_servers_device_thread() {
    fn send<T: Send>() {}
    send::<SdhciMmio>();
}

#[test]
fn a_response_is_revealed_at_its_end_and_not_before() {
    let mut s = powered();
    assert_eq!(s.ios().clock, 400_000);
    let t0 = s.now();
    w16(&mut s, SDHCI_COMMAND, sdhci_make_cmd(0, 0));
    let bus = Bus::new(400_000, 1, false);
    let cmd0_end = t0 + bus.command_ns(ResponseLength::None);
    assert_eq!(s.next_event(), Some(cmd0_end));
    assert_ne!(
        r32(&mut s, cmd0_end - 1, SDHCI_PRESENT_STATE) & SDHCI_CMD_INHIBIT,
        0
    );
    assert_eq!(r32(&mut s, cmd0_end - 1, SDHCI_INT_STATUS), 0);
    assert!(!s.irq_asserted());
    assert_eq!(
        r32(&mut s, cmd0_end, SDHCI_INT_STATUS),
        u32::from(normal_int::CMD_COMPLETE)
    );
    assert!(s.irq_asserted());
    s.write(cmd0_end, SDHCI_INT_STATUS, &[0xFF; 4], &NoDmaMemory);
    assert!(!s.irq_asserted());
    // CMD1 (R3): the response registers change only at the response's end.
    let t1 = s.now();
    send_cmd1(&mut s, t1);
    let end = t1 + bus.command_ns(ResponseLength::Short);
    assert_eq!(r32(&mut s, end - 1, SDHCI_RESPONSE), 0);
    assert_eq!(r32(&mut s, end, SDHCI_RESPONSE) & 0x00FF_FFFF, 0x00FF_8080);
    assert_eq!(s.next_event(), None, "nothing more will happen by itself");
    // A command the card ignores times out after its 64 clocks.
    s.write(end, SDHCI_INT_STATUS, &[0xFF; 4], &NoDmaMemory);
    w16(
        &mut s,
        SDHCI_COMMAND,
        sdhci_make_cmd(11, SDHCI_CMD_RESP_SHORT | SDHCI_CMD_CRC | SDHCI_CMD_INDEX),
    );
    let timeout = end + bus.clocks_ns(48 + crate::sdhci::NCR_MAX);
    assert_eq!(s.next_event(), Some(timeout));
    let st = r32(&mut s, timeout, SDHCI_INT_STATUS);
    assert_eq!(
        st,
        u32::from(normal_int::ERROR_INT) | u32::from(error_int::CMD_TIMEOUT) << 16
    );
}

#[test]
fn arrivals_spread_a_read_over_its_blocks() {
    let bus = Bus::new(52_000_000, 8, false);
    let start = 1_000;
    let end = start + 50_000 + bus.read_ns(512, 4);
    let a = Arrivals::new(start, end, bus, 512, 4);
    assert_eq!(a.block(3), end, "the last block ends the read");
    assert_eq!(a.block(0), start + 50_000 + bus.read_ns(512, 1));
    assert_eq!(a.bytes(0), start);
    assert_eq!(a.bytes(512), a.block(0));
    assert_eq!(a.bytes(513), a.block(1));
    assert!(a.block(0) < a.block(1) && a.block(1) < a.block(2));
}

#[test]
fn a_reset_clears_the_registers_but_not_the_capabilities() {
    let mut s = powered();
    let caps = *s.capabilities();
    s.reset();
    assert_eq!(s.capabilities(), &caps);
    assert_eq!(r32(&mut s, 0, SDHCI_INT_ENABLE), 0);
    assert_eq!(
        r32(&mut s, 0, SDHCI_HOST_CONTROL) & 0xFFFF,
        0,
        "HC1 and power"
    );
    assert_eq!(s.ios().power_mode, crate::sdhci::PowerMode::Off);
    assert_eq!(s.card().state(), emmc_card::CardState::Idle);
    // Capabilities a server narrows apply at once.
    let mut narrow = caps;
    narrow.caps &= !SDHCI_CAN_DO_ADMA2;
    s.set_capabilities(narrow);
    assert_eq!(r32(&mut s, 0, SDHCI_CAPABILITIES) & SDHCI_CAN_DO_ADMA2, 0);
}

#[test]
fn command_records_are_off_until_asked_for_and_say_what_each_command_did() {
    let mut s = powered();
    w16(&mut s, SDHCI_COMMAND, sdhci_make_cmd(0, 0));
    assert_eq!(s.drain_command_records().count(), 0, "off by default");
    s.set_command_records(true);
    let t0 = s.now() + 1_000_000;
    s.advance(t0, &NoDmaMemory);
    send_cmd1(&mut s, t0);
    let bus = Bus::new(400_000, 1, false);
    let end = t0 + bus.command_ns(ResponseLength::Short);
    // Written when the card's side is done, ahead of what the guest has seen.
    let records: Vec<_> = s.drain_command_records().collect();
    assert_eq!(records.len(), 1);
    let r = &records[0];
    assert_eq!(
        (r.opcode, r.arg, r.issued, r.done),
        (1, 0x40FF_8080, t0, end)
    );
    assert_eq!(r.partition, emmc_card::Partition::User);
    assert!(r.succeeded() && r.data.is_none() && r.sbc.is_none());
    assert_eq!(s.oldest_open_record(), None);
    // A command the card ignores fails.
    s.advance(end, &NoDmaMemory);
    w16(
        &mut s,
        SDHCI_COMMAND,
        sdhci_make_cmd(11, SDHCI_CMD_RESP_SHORT | SDHCI_CMD_CRC | SDHCI_CMD_INDEX),
    );
    let r = s.drain_command_records().next().unwrap();
    assert_eq!(r.error, Some(crate::sdhci::SdhciError::CmdTimeout));
    assert!(!r.succeeded());
    s.set_command_records(false);
    assert_eq!(s.drain_command_records().count(), 0);
}
