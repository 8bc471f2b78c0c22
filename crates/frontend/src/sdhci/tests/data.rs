//! Bring-up and every data path, through BAR0 and INTx over the socket.

use emmc_card::CardState;
use emmc_host::sdhci::mmio::layout::*;

use super::driver::*;
use super::{pattern, within, Rig, LIMIT};

#[test]
fn bring_up_reaches_transfer_state_through_bar0_and_intx() {
    within(LIMIT, || {
        let rig = Rig::generic();
        let mut h = Host::connect(&rig);
        assert_eq!(rig.card(|c| c.state()), CardState::Idle);
        let up = h.bring_up();
        assert!(
            up.polls >= 2,
            "CMD1 answered busy first: {} polls",
            up.polls
        );
        let (cid, csd, ext) = rig.card(|c| (c.cid(), c.csd(), c.ext_csd()));
        assert_eq!(up.cid, r2_words(cid), "CID from the R2 response registers");
        assert_eq!(up.csd, r2_words(csd), "CSD");
        // EXT_CSD by CMD8 through the buffer port, as the card held it then: before the
        // switch to high speed (HS_TIMING, 185; BUS_WIDTH is write-only).
        let mut then = ext;
        then[185] = 0;
        assert_eq!(up.ext[..], then[..], "EXT_CSD");
        assert_eq!(ext[185], 1);
        assert_eq!(rig.card(|c| c.state()), CardState::Tran);
        assert_eq!(rig.card(|c| c.bus_config()), (1, 2), "high speed, 8 bits");
        let ios = rig.server.with_device(|d| d.mmio().ios());
        assert_eq!((ios.clock, ios.bus_width), (52_000_000, 8));
        let st = h.status();
        assert_eq!(emmc_card::r1::current_state(st), CardState::Tran.number());
        // Every command's completion came through the eventfd: 8 commands and 2 busy
        // ends at least, and the server signalled exactly what the guest took.
        assert!(h.signals >= 10, "{} signals", h.signals);
        assert_eq!(rig.server.stats().intx_signals, h.signals);
        assert_eq!(h.readl(SDHCI_INT_STATUS), 0, "all acknowledged");
        assert_eq!(rig.server.stats().refused, 0);
    });
}

/// Write then read back 1, 3 and 40 blocks by `mode`: the bytes in guest memory, in the
/// card, and nothing written outside the transfer's buffer.
fn round_trip(mode: Mode, lba0: u32, high: bool) {
    let rig = Rig::generic();
    let mut h = Host::connect(&rig);
    h.bring_up();
    let mut lba = lba0;
    let (mut dma_ints, mut pio_ints, mut pio_blocks) = (0, 0, 0);
    for blocks in [1u16, 3, 40] {
        let data = pattern(blocks as u8 ^ mode as u8, usize::from(blocks) * 512);
        let mut x = Xfer::rw(false, lba, blocks, mode);
        if high {
            (x.data, x.table) = (HIGH_DATA, HIGH_TABLE);
        }
        h.put(x.data, &data);
        h.block_count(&mut x).unwrap();
        let w = h
            .data(&x)
            .unwrap_or_else(|st| panic!("{mode:?} write {blocks}: {st:#x}"));
        assert_eq!(
            rig.peek(u64::from(lba), usize::from(blocks)),
            data,
            "{mode:?}: in the card"
        );
        assert_eq!(rig.card(|c| c.state()), CardState::Tran);

        x.read = true;
        x.opcode = if blocks > 1 { 18 } else { 17 };
        h.put(x.data, &vec![0xEE; data.len()]);
        h.block_count(&mut x).unwrap();
        let before = h.snapshot();
        let r = h
            .data(&x)
            .unwrap_or_else(|st| panic!("{mode:?} read {blocks}: {st:#x}"));
        assert_eq!(h.get(x.data, data.len()), data, "{mode:?}: in guest memory");
        let after = h.snapshot();
        let buf = file_offset(x.data) as usize..file_offset(x.data) as usize + data.len();
        let changed: Vec<usize> = (0..after.len())
            .filter(|&i| after[i] != before[i] && !buf.contains(&i))
            .take(4)
            .collect();
        assert!(
            changed.is_empty(),
            "{mode:?}: bytes outside the buffer: {changed:?}"
        );
        for d in [w, r] {
            assert_eq!(d.seen & ERRORS, 0);
            dma_ints += d.dma_ints;
            pio_ints += d.pio_ints;
            pio_blocks += d.pio_blocks;
        }
        lba += u32::from(blocks);
    }
    match mode {
        // 40 blocks are 20 KiB: 4 KiB boundaries crossed 4 times each way.
        Mode::Sdma => assert_eq!(dma_ints, 2 * 4),
        // Every block through the port, on Buffer Read / Write Ready interrupts (a read's
        // handler takes every block already buffered).
        Mode::Pio => {
            assert_eq!(pio_blocks, 2 * (1 + 3 + 40));
            assert!(pio_ints >= 2 * 3, "{pio_ints}");
        }
        _ => assert_eq!((dma_ints, pio_ints), (0, 0)),
    }
}

#[test]
fn adma2_32_bit_reads_and_writes_single_and_multi_block() {
    within(LIMIT, || round_trip(Mode::Adma32, 100, false));
}

#[test]
fn adma2_64_bit_reads_and_writes_above_4_gib() {
    within(LIMIT, || round_trip(Mode::Adma64, 200, true));
}

#[test]
fn sdma_reads_and_writes_restarting_at_each_boundary() {
    within(LIMIT, || round_trip(Mode::Sdma, 300, false));
}

#[test]
fn pio_reads_and_writes_through_the_buffer_port() {
    within(LIMIT, || round_trip(Mode::Pio, 400, false));
}

#[test]
fn auto_cmd23_sends_argument_2_before_the_transfer() {
    within(LIMIT, || {
        let rig = Rig::generic();
        let mut h = Host::connect(&rig);
        h.bring_up();
        let data = pattern(9, 8 * 512);
        // Argument 2 with Reliable Write (bit 31): the card sees it as CMD23's argument.
        let mut x = Xfer::rw(false, 1000, 8, Mode::Adma64);
        x.acmd23 = Some(1 << 31 | 8);
        h.put(x.data, &data);
        let cmds = rig.card(|c| c.stats().commands);
        h.data(&x).expect("reliable write");
        assert_eq!(
            rig.card(|c| c.stats().commands),
            cmds + 2,
            "CMD23 and CMD25"
        );
        assert_eq!(h.readl(SDHCI_ARGUMENT2), 1 << 31 | 8);
        assert_eq!(rig.peek(1000, 8), data);
        // The card closed the transfer at 8 blocks by itself: no CMD12, straight to tran.
        assert_eq!(rig.card(|c| c.state()), CardState::Tran);
        // A read with Auto-CMD23 ends in tran too.
        let mut x = Xfer::rw(true, 1000, 4, Mode::Adma32);
        x.acmd23 = Some(4);
        h.put(x.data, &[0; 2048]);
        h.data(&x).expect("read with Auto-CMD23");
        assert_eq!(h.get(x.data, 2048), data[..2048]);
        assert_eq!(
            rig.card(|c| c.state()),
            CardState::Tran,
            "closed by the count"
        );
        // Without Auto-CMD23 an open-ended read needs the guest's CMD12.
        let mut x = Xfer::rw(true, 1000, 2, Mode::Adma32);
        x.acmd23 = None;
        h.data(&x).expect("open-ended read");
        assert_eq!(rig.card(|c| c.state()), CardState::Data, "open-ended");
        h.stop().expect("CMD12");
        assert_eq!(rig.card(|c| c.state()), CardState::Tran);
    });
}
