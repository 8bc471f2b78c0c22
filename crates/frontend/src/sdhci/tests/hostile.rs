//! A hostile or broken guest: malformed messages, accesses out of range, descriptors
//! outside guest memory, interrupts never acknowledged, a client gone mid-transfer. The
//! spec's error each time, never a crash or a hang, and the next client is served.

use std::io::Write;
use std::time::Duration;

use emmc_card::CardState;
use emmc_host::sdhci::mmio::layout::*;
use emmc_host::sdhci::{adma2_attr, adma_err, error_int};

use super::driver::*;
use super::wire::{self, Wire};
use super::{pattern, within, Rig, LIMIT};

#[test]
fn malformed_messages_and_bad_region_accesses_are_refused_and_the_card_still_works() {
    within(LIMIT, || {
        let rig = Rig::generic();
        let mut w = Wire::connect(&rig.path);
        assert!(
            w.read(BAR0, SDHCI_HOST_VERSION, 2).is_none(),
            "memory space off"
        );
        assert!(w.write(CONFIG, 4, &0x0006u16.to_le_bytes()));
        let version = w.read(BAR0, SDHCI_HOST_VERSION, 2).expect("BAR0 decodes");
        assert_eq!(version[0] as u16, SDHCI_SPEC_300);
        // Outside BAR0 (4 KiB), odd sizes, unaligned, too long: all refused.
        for (offset, count) in [
            (0x1000u64, 4u32),
            (0xffe, 4),
            (u64::MAX - 1, 2),
            (SDHCI_CLOCK_CONTROL, 3),
            (SDHCI_CLOCK_CONTROL + 1, 2),
            (SDHCI_INT_STATUS, 16),
            (0, 0),
        ] {
            assert!(
                w.read(BAR0, offset, count).is_none(),
                "read {offset:#x}+{count}"
            );
            let data = vec![0xffu8; count as usize];
            assert!(!w.write(BAR0, offset, &data), "write {offset:#x}+{count}");
        }
        assert_eq!(
            w.read(BAR0, SDHCI_CLOCK_CONTROL, 2),
            Some(vec![0, 0]),
            "no refused write reached the controller"
        );
        assert!(w.read(CONFIG, 250, 8).is_none());
        assert!(w.read(3, 0, 4).is_none(), "an absent BAR");
        for command in [0u16, wire::DMA_READ, 99, u16::MAX] {
            assert!(w.call(command, &[], &[]).is_error(), "command {command}");
        }
        assert!(rig.server.stats().refused >= 15);
        assert_eq!(w.ids(), 0x5acc_8086, "still answering");
        drop(w);
        rig.sessions(1);

        // A VERSION too short for its own fields (the crate panics on it) and garbage:
        // each ends only its own session.
        let mut w = Wire::connect_bare(&rig.path);
        w.s.write_all(&wire::header(0, wire::VERSION, 0)).unwrap();
        w.s.write_all(&[0; 4]).unwrap();
        let mut buf = [0u8; 1];
        assert_eq!(std::io::Read::read(&mut w.s, &mut buf).unwrap_or(0), 0);
        drop(w);
        rig.sessions(2);
        let mut w = Wire::connect_bare(&rig.path);
        w.s.write_all(&[0xa5; 100]).unwrap();
        drop(w);
        rig.sessions(3);

        let mut h = Host::connect(&rig);
        h.bring_up();
        let data = pattern(1, 4 * 512);
        h.write_blocks(8, &data, Mode::Adma32).expect("write");
        assert_eq!(h.read_blocks(8, 4, Mode::Adma32).expect("read"), data);
    });
}

#[test]
fn adma_descriptors_outside_mapped_memory_are_adma_errors_and_nothing_lands_outside() {
    within(LIMIT, || {
        let rig = Rig::generic();
        let mut h = Host::connect(&rig);
        h.bring_up();
        let data = pattern(10, 8 * 512);
        h.write_blocks(600, &data, Mode::Adma64).expect("write");
        // Just past the low map: the memfd goes on there, but the client never mapped it.
        let outside = LOW + LOW_LEN + 0x1000;
        let adma_ier = |h: &mut Host| {
            let ier = h.readl(SDHCI_INT_ENABLE);
            assert_ne!(ier & err(error_int::ADMA_ERR), 0);
        };
        adma_ier(&mut h);

        // A read whose second descriptor points outside: ADMA error, ST_TFR, the data
        // before it delivered, not a byte anywhere else.
        h.put_descriptors(
            TABLE,
            true,
            &[
                (adma2_attr::TRAN_VALID, 2048, DATA),
                (adma2_attr::TRAN_VALID | adma2_attr::END, 2048, outside),
            ],
        );
        h.put(DATA, &[0; 4096]);
        let mut x = Xfer::rw(true, 600, 8, Mode::Adma64);
        x.acmd23 = Some(8);
        x.own_table = true;
        let before = h.snapshot();
        h.setup_data(&x);
        h.issue_data(&x);
        let st = h.wait_int(CMD_COMPLETE | ERRORS);
        assert_ne!(st & CMD_COMPLETE, 0);
        h.ack(CMD_COMPLETE);
        let st = h.wait_int(XFER_COMPLETE | ERRORS);
        assert_eq!(st & XFER_COMPLETE, 0, "{st:#x}");
        assert_ne!(st & err(error_int::ADMA_ERR), 0, "{st:#x}");
        assert_eq!(
            h.readb(SDHCI_ADMA_ERROR) & adma_err::STATE_MASK,
            adma_err::ST_TFR
        );
        assert_eq!(
            h.readl(SDHCI_ADMA_ADDRESS),
            (TABLE + 24) as u32,
            "the next descriptor"
        );
        let after = h.snapshot();
        let first = file_offset(DATA) as usize;
        assert_eq!(
            after[first..first + 2048],
            data[..2048],
            "what preceded the error"
        );
        let stray = (0..after.len())
            .filter(|&i| after[i] != before[i] && !(first..first + 2048).contains(&i))
            .count();
        assert_eq!(
            stray, 0,
            "bytes written outside the first descriptor's buffer"
        );
        h.recover();
        if rig.card(|c| c.state()) != CardState::Tran {
            h.stop().expect("CMD12");
        }

        // The table itself outside guest memory: ST_FDS, the descriptor's address.
        let mut x = Xfer::rw(true, 600, 8, Mode::Adma64);
        x.acmd23 = Some(8);
        (x.table, x.own_table) = (outside, true);
        let before = h.snapshot();
        h.setup_data(&x);
        h.issue_data(&x);
        let st = h.wait_int(XFER_COMPLETE | DATA_ERRORS);
        assert_ne!(st & err(error_int::ADMA_ERR), 0, "{st:#x}");
        assert_eq!(
            h.readb(SDHCI_ADMA_ERROR) & adma_err::STATE_MASK,
            adma_err::ST_FDS
        );
        assert_eq!(h.readl(SDHCI_ADMA_ADDRESS), outside as u32);
        assert!(h.snapshot() == before, "nothing written anywhere");
        h.recover();
        if rig.card(|c| c.state()) != CardState::Tran {
            h.stop().expect("CMD12");
        }

        // A write whose data is outside: an ADMA error, and the card keeps what it had.
        let mut x = Xfer::rw(false, 600, 8, Mode::Adma32);
        x.acmd23 = Some(8);
        x.data = outside;
        x.own_table = true;
        h.put_descriptors(
            TABLE,
            false,
            &[(adma2_attr::TRAN_VALID | adma2_attr::END, 4096, outside)],
        );
        let st = h.data(&x).expect_err("ADMA error");
        assert_ne!(st & err(error_int::ADMA_ERR), 0, "{st:#x}");
        if rig.card(|c| c.state()) != CardState::Tran {
            h.stop().expect("CMD12");
        }
        assert_eq!(rig.peek(600, 8), data, "nothing reached the card");
        // And the controller goes on.
        assert_eq!(h.read_blocks(600, 8, Mode::Adma64).expect("read"), data);
    });
}

#[test]
fn a_guest_that_never_unmasks_gets_register_reads_and_the_next_session_works() {
    within(LIMIT, || {
        let rig = Rig::generic();
        {
            let mut h = Host::connect(&rig);
            h.bring_up();
            let signals = rig.server.stats().intx_signals;
            // CMD13 after CMD13, never acknowledged, INTx never unmasked.
            for i in 0..50 {
                h.wait_present_clear(SDHCI_CMD_INHIBIT);
                h.issue(13, RCA, Resp::R1, false, 0);
                // Polled, as a guest without interrupts would.
                h.wait_present_clear(SDHCI_CMD_INHIBIT);
                let st = h.readl(SDHCI_INT_STATUS);
                assert_ne!(st & CMD_COMPLETE, 0, "answered ({i})");
                assert_eq!(h.present() & SDHCI_CARD_PRESENT, SDHCI_CARD_PRESENT);
            }
            assert_eq!(h.irq.wait(Duration::from_millis(50)), 1, "one signal");
            assert_eq!(h.irq.wait(Duration::from_millis(50)), 0, "then masked");
            assert_eq!(rig.server.stats().intx_signals, signals + 1);
            assert_eq!(h.readl(SDHCI_RESPONSE) >> 9 & 0xF, CardState::Tran.number());
        }
        rig.sessions(1);
        let mut h = Host::connect(&rig);
        h.bring_up();
        let data = pattern(2, 2 * 512);
        h.write_blocks(30, &data, Mode::Adma64).expect("write");
        assert_eq!(h.read_blocks(30, 2, Mode::Adma64).expect("read"), data);
    });
}

#[test]
fn a_client_gone_mid_transfer_leaves_a_power_cycled_card_for_the_next() {
    within(LIMIT, || {
        let rig = Rig::generic();
        let old = pattern(3, 4 * 512);
        {
            let mut h = Host::connect(&rig);
            h.bring_up();
            h.write_blocks(40, &old, Mode::Adma64).expect("write");
            // A PIO write of 4 blocks of which the guest supplies one, then leaves.
            let x = Xfer::rw(false, 40, 4, Mode::Pio);
            h.put(x.data, &pattern(4, 4 * 512));
            h.setup_data(&x);
            h.issue_data(&x);
            let st = h.wait_int(WRITE_READY);
            h.ack(st & (CMD_COMPLETE | WRITE_READY));
            for w in 0..128 {
                h.writel(0xdead_0000 | w, SDHCI_BUFFER);
            }
            h.wait_int(WRITE_READY);
            assert_eq!(rig.card(|c| c.state()), CardState::Rcv, "mid-transfer");
        }
        rig.sessions(1);
        assert_eq!(rig.card(|c| c.state()), CardState::Idle, "power-cycled");
        let power = rig.server.with_device(|d| d.mmio().ios().power_mode);
        assert_eq!(power, emmc_host::sdhci::PowerMode::Off, "SD Bus Power off");
        let mut h = Host::connect(&rig);
        assert_eq!(
            h.readl(SDHCI_INT_ENABLE),
            IER,
            "this client's probe, nothing older"
        );
        let up = h.bring_up();
        assert!(up.polls >= 2, "a fresh power-up");
        // The abandoned write's first block may or may not have been programmed (the
        // card had it); the blocks never sent are the old data.
        assert_eq!(rig.peek(41, 3), old[512..]);
        let new = pattern(5, 4 * 512);
        h.write_blocks(40, &new, Mode::Sdma).expect("write");
        assert_eq!(h.read_blocks(40, 4, Mode::Pio).expect("read"), new);
    });
}
