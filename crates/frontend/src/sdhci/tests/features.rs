//! R1b busy, HS200 tuning, a fault plan's errors, HPI, and card time against the wall
//! clock, through BAR0 and INTx over the socket.

use std::time::{Duration, Instant};

use emmc_card::CardState;
use emmc_host::fault::{FaultInjector, FaultPlan};
use emmc_host::sdhci::error_int;
use emmc_host::sdhci::mmio::layout::*;

use super::driver::*;
use super::{constant_model, model, pattern, within, Rig, LIMIT};
use crate::pacing::Pacing;
use crate::pci::PciIdentity;

const REALTIME: Pacing = Pacing::Realtime { scale: 1.0 };

/// The card time the server is at (the last access's or event's).
fn card_now(rig: &Rig) -> u64 {
    rig.server.with_device(|d| d.mmio().now())
}

#[test]
fn r1b_busy_holds_dat0_low_and_transfer_complete_comes_at_the_busy_end() {
    within(LIMIT, || {
        // Paced, so that the guest can look at Present State inside the busy.
        const SWITCH_NS: u64 = 150_000_000;
        let m = constant_model(|c| c.switch_ns = SWITCH_NS);
        let rig = Rig::start(&m, PciIdentity::default(), REALTIME);
        let mut h = Host::connect(&rig);
        h.bring_up();
        // CMD6 ERASE_GROUP_DEF = 1 as R1b.
        h.wait_present_clear(SDHCI_CMD_INHIBIT | SDHCI_DATA_INHIBIT);
        let issued_at = card_now(&rig);
        h.issue(6, 0x0300_0000 | 175 << 16 | 1 << 8, Resp::R1b, false, 0);
        let st = h.wait_int(CMD_COMPLETE | ERRORS);
        assert_eq!(st, CMD_COMPLETE, "the response, and nothing else yet");
        h.ack(CMD_COMPLETE);
        let p = h.present();
        assert_eq!(p & SDHCI_CMD_INHIBIT, 0, "the CMD line is free");
        assert_ne!(p & SDHCI_DATA_INHIBIT, 0, "the DAT line is not");
        assert_eq!(
            p & SDHCI_DATA_0_LVL_MASK,
            0,
            "DAT0 low while the card is busy"
        );
        assert_eq!(rig.card(|c| c.state()), CardState::Prg);
        let st = h.wait_int(XFER_COMPLETE | ERRORS);
        assert_eq!(st, XFER_COMPLETE);
        let (tc_at, busy_until) = rig
            .server
            .with_device(|d| (d.mmio().now(), d.mmio().card().busy_until()));
        assert!(
            tc_at >= issued_at + SWITCH_NS,
            "Transfer Complete at card time {tc_at}, the busy began at {issued_at}"
        );
        assert!(
            busy_until.is_none_or(|t| t <= tc_at),
            "the card's busy is over"
        );
        h.ack(XFER_COMPLETE);
        let p = h.present();
        assert_eq!(p & SDHCI_DATA_INHIBIT, 0);
        assert_ne!(p & SDHCI_DATA_0_LVL_MASK, 0, "DAT0 high again");
        assert_eq!(rig.card(|c| c.ext_csd()[175]), 1);
        assert_eq!(rig.card(|c| c.state()), CardState::Tran);
    });
}

#[test]
fn in_realtime_a_writes_transfer_complete_does_not_come_before_its_card_time() {
    within(LIMIT, || {
        // The card model's own figure for programming one write command.
        const PROGRAM_NS: u64 = 60_000_000;
        let m = constant_model(|c| c.program_command_ns = PROGRAM_NS);
        let rig = Rig::start(&m, PciIdentity::default(), REALTIME);
        let mut h = Host::connect(&rig);
        h.bring_up();
        let data = pattern(21, 512);
        let x = Xfer::rw(false, 50, 1, Mode::Adma64);
        h.put(x.data, &data);
        let start = Instant::now();
        let card_start = card_now(&rig);
        h.data(&x).expect("write");
        let waited = start.elapsed();
        let card_spent = card_now(&rig) - card_start;
        assert!(card_spent >= PROGRAM_NS, "card time {card_spent} ns");
        // Not earlier than the card's time on the wall clock (1 ms of slack for the
        // conversion between the two clocks; no upper bound: machines are noisy).
        assert!(
            waited + Duration::from_millis(1) >= Duration::from_nanos(PROGRAM_NS),
            "Transfer Complete after {waited:?}, the card programs for {PROGRAM_NS} ns"
        );
        assert_eq!(rig.peek(50, 1), data);
    });
}

/// Execute Tuning and CMD21 until the controller clears it: the tries, or None if it
/// gave up.
fn tune(h: &mut Host) -> Option<u32> {
    let ctrl2 = h.readw(SDHCI_HOST_CONTROL2);
    h.writew(ctrl2 | SDHCI_CTRL_EXEC_TUNING, SDHCI_HOST_CONTROL2);
    for tries in 1..=40 {
        h.wait_present_clear(SDHCI_CMD_INHIBIT | SDHCI_DATA_INHIBIT);
        h.writew(sdhci_make_blksz(7, 128), SDHCI_BLOCK_SIZE);
        h.issue(21, 0, Resp::R1, true, SDHCI_TRNS_READ);
        let st = h.wait_int(READ_READY | ERRORS);
        assert_eq!(
            st, READ_READY,
            "a tuning block raises Buffer Read Ready only"
        );
        h.ack(READ_READY);
        let ctrl2 = h.readw(SDHCI_HOST_CONTROL2);
        if ctrl2 & SDHCI_CTRL_EXEC_TUNING == 0 {
            return (ctrl2 & SDHCI_CTRL_TUNED_CLK != 0).then_some(tries);
        }
    }
    None
}

#[test]
fn hs200_tuning_by_cmd21_sets_sampling_clock_select() {
    within(LIMIT, || {
        let rig = Rig::start(&model("ideal"), PciIdentity::default(), Pacing::Off);
        let mut h = Host::connect(&rig);
        h.bring_up();
        h.switch(185, 2).expect("HS_TIMING HS200");
        let ctrl2 = h.readw(SDHCI_HOST_CONTROL2) & !SDHCI_CTRL_UHS_MASK;
        h.writew(
            ctrl2 | SDHCI_CTRL_UHS_SDR104 | SDHCI_CTRL_VDD_180,
            SDHCI_HOST_CONTROL2,
        );
        h.set_clock(200_000_000);
        assert_eq!(
            rig.server.with_device(|d| d.mmio().ios().clock),
            200_000_000
        );
        let cmds = rig.card(|c| c.stats().commands);
        assert_eq!(tune(&mut h), Some(1), "an intact block at the first try");
        assert_eq!(rig.card(|c| c.stats().commands), cmds + 1, "one CMD21");
        let data = pattern(3, 16 * 512);
        h.write_blocks(64, &data, Mode::Adma64)
            .expect("write at HS200");
        assert_eq!(h.read_blocks(64, 16, Mode::Adma64).expect("read"), data);

        // Back to the fixed sampling clock: a read at 200 MHz is a data CRC error.
        let ctrl2 = h.readw(SDHCI_HOST_CONTROL2);
        h.writew(ctrl2 & !SDHCI_CTRL_TUNED_CLK, SDHCI_HOST_CONTROL2);
        let st = h.read_blocks(64, 16, Mode::Adma64).expect_err("untuned");
        assert_ne!(st & err(error_int::DATA_CRC), 0, "{st:#x}");
        if rig.card(|c| c.state()) != CardState::Tran {
            h.stop().expect("CMD12");
        }
        assert_eq!(tune(&mut h), Some(1), "tuned again");
        assert_eq!(h.read_blocks(64, 16, Mode::Adma64).expect("read"), data);
    });
}

fn injector(text: &str) -> FaultInjector {
    FaultInjector::new(FaultPlan::from_toml_str(text).unwrap()).unwrap()
}

#[test]
fn a_fault_plans_crc_error_and_timeout_arrive_as_error_interrupts() {
    within(LIMIT, || {
        let rig = Rig::generic();
        let mut h = Host::connect(&rig);
        h.bring_up();
        let data = pattern(4, 8 * 512);
        h.write_blocks(500, &data, Mode::Adma64).expect("write");
        rig.server.with_device(|d| {
            d.mmio_mut().set_fault_injector(Some(injector(
                "[[rule]]\ncommand = 13\nnth = 1\neffect = { kind = \"cmd_crc\" }\n\
                 [[rule]]\ncommand = 13\nnth = 2\neffect = { kind = \"cmd_timeout\" }\n\
                 [[rule]]\ncommand = 18\nnth = 1\neffect = { kind = \"data_crc\" }\n\
                 [[rule]]\ncommand = 18\nnth = 2\neffect = { kind = \"data_timeout\" }\n",
            )))
        });
        let signals = h.signals;
        let st = h.cmd(13, RCA, Resp::R1).expect_err("CRC");
        assert_ne!(st & err(error_int::CMD_CRC), 0, "{st:#x}");
        assert_eq!(st & CMD_COMPLETE, 0);
        let st = h.cmd(13, RCA, Resp::R1).expect_err("timeout");
        assert_ne!(st & err(error_int::CMD_TIMEOUT), 0, "{st:#x}");
        assert!(h.signals >= signals + 2, "each error came by INTx");
        let recover = |h: &mut Host| {
            if rig.card(|c| c.state()) != CardState::Tran {
                h.stop().expect("CMD12");
            }
            assert_eq!(rig.card(|c| c.state()), CardState::Tran);
        };
        let st = h.read_blocks(500, 8, Mode::Adma64).expect_err("data CRC");
        assert_ne!(st & err(error_int::DATA_CRC), 0, "{st:#x}");
        assert_eq!(st & XFER_COMPLETE, 0);
        recover(&mut h);
        let before = card_now(&rig);
        let st = h
            .read_blocks(500, 8, Mode::Adma64)
            .expect_err("data timeout");
        assert_ne!(st & err(error_int::DATA_TIMEOUT), 0, "{st:#x}");
        let spent = card_now(&rig) - before;
        let limit = emmc_host::sdhci::hardware_timeout_ns(0xE, 52_000_000);
        assert!(
            spent >= limit,
            "{spent} ns: the controller's time-out is {limit} ns"
        );
        recover(&mut h);
        // The plan is spent: everything works again.
        assert_eq!(h.read_blocks(500, 8, Mode::Adma64).expect("read"), data);
        let fired: u64 = rig.server.with_device(|d| {
            let f = d.mmio().fault_injector().unwrap();
            (0..4).map(|i| f.fired(i)).sum()
        });
        assert_eq!(fired, 4);
    });
}

#[test]
fn hpi_during_a_long_write_ends_its_programming_early() {
    within(LIMIT, || {
        const PROGRAM_NS: u64 = 2_000_000_000;
        const HPI_EXIT_NS: u64 = 1_000_000;
        let m = constant_model(|c| {
            c.program_command_ns = PROGRAM_NS;
            c.hpi_exit_ns = HPI_EXIT_NS;
        });
        let rig = Rig::start(&m, PciIdentity::default(), REALTIME);
        let mut h = Host::connect(&rig);
        let up = h.bring_up();
        h.switch(161, 1).expect("HPI_MGMT: enable HPI");
        // HPI_FEATURES bit 1: the card takes HPI on CMD12, else on CMD13.
        let carrier = if up.ext[503] & 2 != 0 { 12 } else { 13 };
        let data = pattern(7, 16 * 512);
        let mut x = Xfer::rw(false, 2000, 16, Mode::Adma64);
        x.acmd23 = Some(16);
        h.put(x.data, &data);
        let start = Instant::now();
        h.setup_data(&x);
        h.issue_data(&x);
        h.wait_int(CMD_COMPLETE);
        h.ack(CMD_COMPLETE);
        // The data has gone out (16 blocks at 52 MHz, 8 bits: well under 1 ms); the card
        // programs for 2 s.
        let deadline = Instant::now() + WAIT;
        while rig.card(|c| c.state()) != CardState::Prg {
            assert!(
                Instant::now() < deadline,
                "the card never started programming"
            );
            std::thread::sleep(Duration::from_millis(1));
        }
        assert_eq!(
            h.readl(SDHCI_INT_STATUS) & XFER_COMPLETE,
            0,
            "still programming"
        );
        let p = h.present();
        assert_ne!(p & SDHCI_DATA_INHIBIT, 0);
        assert_eq!(p & (SDHCI_CMD_INHIBIT | SDHCI_DATA_0_LVL_MASK), 0);
        // HPI on the free CMD line while the DAT line is busy.
        let hpi_at = card_now(&rig);
        let resp = if carrier == 12 { Resp::R1b } else { Resp::R1 };
        h.issue(carrier, RCA | 1, resp, false, 0);
        let st = h.wait_int(CMD_COMPLETE | ERRORS);
        assert_eq!(st & ERRORS, 0, "{st:#x}");
        h.ack(CMD_COMPLETE);
        let st = h.wait_int(XFER_COMPLETE | ERRORS);
        assert_eq!(st & ERRORS, 0, "{st:#x}");
        h.ack(st);
        let ended = card_now(&rig);
        assert!(
            start.elapsed() < Duration::from_millis(1500),
            "ended by HPI, not by the 2 s programming: {:?}",
            start.elapsed()
        );
        assert!(
            ended >= hpi_at + HPI_EXIT_NS,
            "the card's HPI exit time passed"
        );
        assert_eq!(rig.card(|c| c.stats().hpi_interrupts), 1);
        assert_eq!(rig.card(|c| c.state()), CardState::Tran);
        assert_eq!(
            emmc_card::r1::current_state(h.status()),
            CardState::Tran.number()
        );
    });
}
