//! Behaviour of the SDHCI model: bring-up, errors the bus produces, ADMA2, time-outs,
//! tuning. (The card time it charges is compared with the simulator's direct device in
//! crates/sim/tests/card_device_timing.rs.)

use super::*;
use crate::mmc::{HostCaps, MmcHost, MMC_RCA};
use crate::testing::{brought_up_with, r1, read_request, write_request};
use emmc_card::model::DeviceModel;
use emmc_card::store::MemStore;
use emmc_card::timing::bus::{ResponseLength, COMMAND_BITS};
use emmc_card::timing::{Bus, Nanos};
use emmc_card::{r1, Card, CardState, Partition};

const RCA_ARG: u32 = (MMC_RCA as u32) << 16;

fn model() -> DeviceModel {
    DeviceModel::load("generic-emmc45").unwrap()
}

fn mem_card(model: DeviceModel) -> Card {
    let layout = Card::layout_for(&model);
    Card::new(model, Box::new(MemStore::new(layout))).unwrap()
}

fn brought_up(model: DeviceModel, caps: &HostCaps) -> Sdhci {
    brought_up_with(mem_card(model), caps, SdhciConfig::default())
}

fn pattern(seed: u8, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| {
            (i as u32)
                .wrapping_mul(31)
                .wrapping_add(u32::from(seed) * 7) as u8
        })
        .collect()
}

fn write(s: &mut Sdhci, lba: u64, data: &[u8]) -> SdhciCompletion {
    let mut sg = [data];
    s.request(write_request(
        lba,
        (data.len() / 512) as u32,
        false,
        &mut sg,
    ))
}

fn read(s: &mut Sdhci, lba: u64, buf: &mut [u8]) -> SdhciCompletion {
    let blocks = (buf.len() / 512) as u32;
    let mut sg = [buf];
    s.request(read_request(lba, blocks, &mut sg))
}

fn status(s: &mut Sdhci) -> u32 {
    let done = s.command(r1(ResponseType::R1, 13, RCA_ARG));
    assert!(done.is_ok(), "CMD13: {done:?}");
    done.cmd.resp[0]
}

fn peek(s: &mut Sdhci, lba: u64, blocks: usize) -> Vec<u8> {
    let mut buf = vec![0u8; blocks * 512];
    s.card.peek(Partition::User, lba, &mut buf).unwrap();
    buf
}

// ---- bring-up ---------------------------------------------------------------------------

#[test]
fn linux_init_sequence_reaches_tran_at_52mhz_on_8_lines() {
    let mut host = MmcHost::new(mem_card(model()));
    host.mmc_init_card(&HostCaps::default()).unwrap();
    assert_eq!(host.card.state(), CardState::Tran);
    assert_eq!(
        host.sdhci.ios(),
        MmcIos {
            clock: 52_000_000,
            bus_width: 8,
            timing: BusTiming::Hs,
            power_mode: PowerMode::On,
        }
    );
    assert_eq!(host.sdhci.actual_clock(), 52_000_000);
    assert_eq!(
        host.card.bus_config(),
        (1, 2),
        "HS_TIMING 1, BUS_WIDTH 8-bit"
    );
    // Identification ran at 400 kHz: CMD0, two CMD1, CMD2 (R2), CMD3, CMD9 (R2), CMD7 and
    // the 512-byte EXT_CSD on one line take well over 5 ms of bus time alone.
    let id = Bus::IDENTIFICATION;
    let floor = id.command_ns(ResponseLength::None)
        + 4 * id.command_ns(ResponseLength::Short)
        + 2 * id.command_ns(ResponseLength::Long)
        + id.read_ns(512, 1);
    assert!(host.now > floor, "{} <= {floor}", host.now);
}

#[test]
fn bring_up_selects_ddr52_and_hs200_with_the_host_following() {
    let ddr = brought_up(
        model(),
        &HostCaps {
            ddr: true,
            ..HostCaps::default()
        },
    );
    assert_eq!(ddr.card.bus_config(), (1, 6));
    assert_eq!(ddr.ios().timing, BusTiming::Ddr52);
    assert!(ddr.host.bus().ddr);

    let mut hs200 = brought_up(
        model(),
        &HostCaps {
            hs200: true,
            ..HostCaps::default()
        },
    );
    assert_eq!(hs200.card.bus_config(), (2, 2));
    assert_eq!(hs200.ios().clock, 200_000_000);
    assert_eq!(hs200.ios().timing, BusTiming::Hs200);
    assert!(hs200.host.tuned());
    let data = pattern(3, 4096);
    assert!(write(&mut hs200, 64, &data).is_ok());
    let mut back = vec![0u8; 4096];
    assert!(read(&mut hs200, 64, &mut back).is_ok());
    assert_eq!(back, data);
}

// ---- command errors ---------------------------------------------------------------------

#[test]
fn illegal_command_gives_command_timeout_after_the_response_window() {
    let mut s = brought_up(model(), &HostCaps::default());
    let bus = s.host.bus();
    // CMD11 (stream read) has no row in the eMMC 4.5 table.
    let done = s.command(r1(ResponseType::R1, 11, 0));
    assert_eq!(done.cmd.error, Some(SdhciError::CmdTimeout));
    assert!(done.int_status.has_error(error_int::CMD_TIMEOUT));
    assert!(done.int_status.has(normal_int::ERROR_INT));
    assert!(!done.int_status.has(normal_int::CMD_COMPLETE));
    assert_eq!(
        done.duration_ns(),
        bus.clocks_ns(COMMAND_BITS + NCR_MAX),
        "command token plus 64 clocks"
    );
    // An addressed command in the wrong state is as silent: CMD3 in tran.
    let done = s.command(r1(ResponseType::R1, 3, RCA_ARG));
    assert_eq!(done.cmd.error, Some(SdhciError::CmdTimeout));
    assert_ne!(status(&mut s) & r1::ILLEGAL_COMMAND, 0);
}

#[test]
fn clock_above_the_card_timing_gives_cmd_crc_then_card_crc_errors() {
    let caps = HostCaps {
        high_speed: false,
        ..HostCaps::default()
    };
    let mut s = brought_up(model(), &caps);
    assert_eq!(s.card.bus_config().0, 0, "backward-compatible timing");
    assert_eq!(s.ios().clock, 26_000_000);
    let ios = s.ios();

    // 52 MHz on a 26 MHz card: the card executes, the host cannot read the response.
    s.set_ios(MmcIos {
        clock: 52_000_000,
        ..ios
    });
    let done = s.command(r1(ResponseType::R1, 13, RCA_ARG));
    assert_eq!(done.cmd.error, Some(SdhciError::CmdCrc));
    assert!(done.int_status.has_error(error_int::CMD_CRC));
    assert!(!done.int_status.has(normal_int::CMD_COMPLETE));
    // An Auto CMD23 the host cannot read is an Auto CMD error; the command stays unsent.
    let mut buf = vec![0u8; 1024];
    let done = read(&mut s, 0, &mut buf);
    let sbc = done.sbc.unwrap();
    assert!(sbc.auto && sbc.error == Some(SdhciError::CmdCrc));
    assert!(done.int_status.has_error(error_int::AUTO_CMD_ERR));
    assert_eq!(done.auto_cmd_err, auto_cmd_err::CRC);
    assert!(!done.cmd.issued);
    // A data command's CMD_CRC is a data error: nothing moves, the stop goes out (and
    // reaches the card, whose answer the host cannot read either).
    let mut buf = vec![0u8; 1024];
    let mut sg = [&mut buf[..]];
    let done = s.request(MmcRequest {
        sbc: None,
        cmd: r1(ResponseType::R1, 18, 0),
        data: Some(MmcData::read(512, 2, &mut sg)),
        stop: Some(r1(ResponseType::R1, 12, 0)),
    });
    assert_eq!(done.cmd.error, Some(SdhciError::CmdCrc));
    assert_eq!(done.data_error, Some(SdhciError::DataCrc));
    assert_eq!(done.bytes_xfered, 0);
    assert!(done.stop.is_some_and(|o| o.issued));
    assert_eq!(s.card.state(), CardState::Tran);

    // 200 MHz: the card cannot sample the command either.
    s.set_ios(MmcIos {
        clock: 200_000_000,
        ..ios
    });
    let done = s.command(r1(ResponseType::R1, 13, RCA_ARG));
    assert_eq!(done.cmd.error, Some(SdhciError::CmdTimeout));
    s.set_ios(ios);
    let st = status(&mut s);
    assert_ne!(st & r1::COM_CRC_ERROR, 0, "the card saw a bad CRC: {st:#x}");
    assert_eq!(s.card.state(), CardState::Tran);

    // After HS_TIMING := 1 the same 52 MHz is fine.
    let mut s = brought_up(model(), &HostCaps::default());
    assert!(s.command(r1(ResponseType::R1, 13, RCA_ARG)).is_ok());
    let ios = s.ios();
    s.set_ios(MmcIos {
        clock: 100_000_000,
        ..ios
    });
    assert_eq!(
        s.command(r1(ResponseType::R1, 13, RCA_ARG)).cmd.error,
        Some(SdhciError::CmdCrc)
    );
}

#[test]
fn response_type_mismatch_is_an_end_bit_or_index_error() {
    let mut s = brought_up(model(), &HostCaps::default());
    // CMD13 answers 48 bits; expecting 136 finds no end bit where it should be.
    let done = s.command(r1(ResponseType::R2, 13, RCA_ARG));
    assert_eq!(done.cmd.error, Some(SdhciError::CmdEndBit));
    assert!(done.int_status.has_error(error_int::CMD_END_BIT));
    // A command with no response expected costs the token and the gap, whatever the card.
    let bus = s.host.bus();
    let done = s.command(r1(ResponseType::None, 13, RCA_ARG));
    assert!(done.is_ok());
    assert_eq!(done.duration_ns(), bus.command_ns(ResponseLength::None));
    // Out-of-range opcodes are cut to the register's 6 bits, not a panic.
    let done = s.command(r1(ResponseType::R1, 13 | 0xC0, RCA_ARG));
    assert!(done.is_ok());
}

#[test]
fn r2_is_kept_as_linux_and_the_response_registers_keep_it() {
    let mut s = brought_up(model(), &HostCaps::default());
    let csd = s.card.csd();
    // Deselect (CMD7 to RCA 0 gives no response) and read the CSD in stby.
    assert!(s.command(r1(ResponseType::None, 7, 0)).is_ok());
    let done = s.command(r1(ResponseType::R2, 9, RCA_ARG));
    assert!(done.is_ok(), "{done:?}");
    let be = |i: usize| u32::from_be_bytes([csd[i], csd[i + 1], csd[i + 2], csd[i + 3]]);
    assert_eq!(done.cmd.resp, [be(0), be(4), be(8), be(12) & !0xFF]);
    // facts §13.9: RESP[119:0] = register bits 127:8.
    let regs = s.host.response_registers();
    assert_eq!(regs[0], be(11));
    assert_eq!(regs[3], be(0) >> 8);
}

// ---- data bus errors --------------------------------------------------------------------

#[test]
fn width_mismatch_gives_data_crc_and_the_card_takes_nothing() {
    let mut s = brought_up(model(), &HostCaps::default());
    let old = pattern(1, 4096);
    assert!(write(&mut s, 100, &old).is_ok());
    let ios = s.ios();
    s.set_ios(MmcIos {
        bus_width: 4,
        ..ios
    });

    let mut back = vec![0u8; 4096];
    let done = read(&mut s, 100, &mut back);
    assert_eq!(done.data_error, Some(SdhciError::DataCrc));
    assert!(done.int_status.has_error(error_int::DATA_CRC));
    assert!(!done.int_status.has(normal_int::TRANSFER_COMPLETE));
    assert_eq!(done.bytes_xfered, 0);
    assert!(back.iter().all(|&b| b == 0), "nothing reaches host memory");
    assert_eq!(s.card.state(), CardState::Tran, "the stop ended the read");

    let new = pattern(2, 4096);
    let done = write(&mut s, 100, &new);
    assert_eq!(done.data_error, Some(SdhciError::DataCrc));
    assert_eq!(done.bytes_xfered, 0);
    s.idle(1_000_000_000);
    assert_eq!(s.card.state(), CardState::Tran);
    assert_eq!(peek(&mut s, 100, 8), old, "the card took none of it");

    s.set_ios(ios);
    assert!(read(&mut s, 100, &mut back).is_ok());
    assert_eq!(back, old);
}

#[test]
fn a_data_command_the_card_refuses_ends_in_a_data_timeout() {
    let mut s = brought_up(model(), &HostCaps::default());
    let size = s.card.partition_sectors(Partition::User);
    let mut buf = vec![0u8; 1024];
    let done = read(&mut s, size - 1, &mut buf);
    assert!(done.cmd.ok(), "the response carries the error bit");
    assert_ne!(done.cmd.resp[0] & r1::ADDRESS_OUT_OF_RANGE, 0);
    assert_eq!(done.data_error, Some(SdhciError::DataTimeout));
    assert!(done.int_status.has_error(error_int::DATA_TIMEOUT));
    assert_eq!(s.card.state(), CardState::Tran);
}

// ---- auto commands ----------------------------------------------------------------------

/// Write then read 16 blocks with one way of sending CMD23/CMD12; returns what a test
/// compares: request times, card state, data read back, data on the medium, counters.
fn round_trip(config: SdhciConfig, with_sbc: bool) -> (Nanos, Nanos, Vec<u8>, Vec<u8>, u64) {
    let mut s = brought_up_with(mem_card(model()), &HostCaps::default(), config);
    let data = pattern(9, 16 * 512);
    let sbc = |n: u32| with_sbc.then(|| r1(ResponseType::R1, 23, n));
    let mut sg = [&data[..]];
    let w = s.request(MmcRequest {
        sbc: sbc(16),
        cmd: r1(ResponseType::R1, 25, 300),
        data: Some(MmcData::write(512, 16, &mut sg)),
        stop: Some(r1(ResponseType::R1b, 12, 0)),
    });
    assert!(w.is_ok(), "{w:?}");
    let mut back = vec![0u8; 16 * 512];
    let mut sg = [&mut back[..]];
    let r = s.request(MmcRequest {
        sbc: sbc(16),
        cmd: r1(ResponseType::R1, 18, 300),
        data: Some(MmcData::read(512, 16, &mut sg)),
        stop: Some(r1(ResponseType::R1, 12, 0)),
    });
    assert!(r.is_ok(), "{r:?}");
    assert_eq!(r.bytes_xfered, 16 * 512);
    let auto23 = s.host.config().auto_cmd23 && with_sbc;
    let auto12 = s.host.config().auto_cmd12 && !with_sbc;
    for done in [&w, &r] {
        assert_eq!(done.sbc.is_some_and(|o| o.auto), auto23);
        assert_eq!(done.stop.is_some_and(|o| o.auto), auto12);
        assert_eq!(done.stop.is_some_and(|o| o.issued), !with_sbc);
    }
    assert_eq!(s.card.state(), CardState::Tran);
    let medium = peek(&mut s, 300, 16);
    (
        w.duration_ns(),
        r.duration_ns(),
        back,
        medium,
        s.card.stats().sectors_written,
    )
}

#[test]
fn auto_cmd12_and_auto_cmd23_match_manual_commands() {
    let manual = SdhciConfig {
        auto_cmd12: false,
        auto_cmd23: false,
        ..SdhciConfig::default()
    };
    let auto = SdhciConfig {
        auto_cmd12: true,
        auto_cmd23: true,
        ..SdhciConfig::default()
    };
    let data = pattern(9, 16 * 512);
    let manual23 = round_trip(manual.clone(), true);
    let auto23 = round_trip(auto.clone(), true);
    let manual12 = round_trip(manual, false);
    let auto12 = round_trip(auto, false);
    assert_eq!(manual23, auto23);
    assert_eq!(manual12, auto12);
    for r in [&manual23, &manual12] {
        assert_eq!(r.2, data);
        assert_eq!(r.3, data);
    }
}

// ---- ADMA2 ------------------------------------------------------------------------------

#[test]
fn adma_length_mismatch_is_an_adma_error_with_nothing_written() {
    let mut s = brought_up(model(), &HostCaps::default());
    let before = s.card.stats().commands;
    for sg_len in [3 * 512, 5 * 512, 4 * 512 - 1] {
        let data = pattern(4, sg_len);
        let mut sg = [&data[..]];
        let done = s.request(write_request(500, 4, false, &mut sg));
        assert!(done.int_status.has_error(error_int::ADMA_ERR), "{sg_len}");
        assert_eq!(done.adma_err, adma_err::LENGTH_MISMATCH | adma_err::ST_TFR);
        assert_eq!(done.data_error, Some(SdhciError::Adma(done.adma_err)));
        assert!(!done.cmd.issued && !done.sbc.unwrap().issued);
        assert_eq!(done.bytes_xfered, 0);
    }
    assert_eq!(s.card.stats().commands, before, "nothing reached the card");
    assert!(peek(&mut s, 500, 5).iter().all(|&b| b == 0));
}

#[test]
fn block_counts_and_sizes_the_registers_cannot_hold_are_refused() {
    let mut s = brought_up(model(), &HostCaps::default());
    // 65 536 blocks: the 16-bit Block Count register cannot say it.
    let big = vec![0xA5u8; 65_536 * 512];
    let mut sg: Vec<&[u8]> = big.chunks(65_536).collect();
    let done = s.request(write_request(0, 65_536, false, &mut sg));
    assert!(done.int_status.has_error(error_int::ADMA_ERR));
    assert_ne!(done.adma_err & adma_err::LENGTH_MISMATCH, 0);
    assert!(!done.cmd.issued);
    assert!(peek(&mut s, 0, 4).iter().all(|&b| b == 0));

    let mut empty: [&mut [u8]; 0] = [];
    let mut small = vec![0u8; 512];
    let mut huge = vec![0u8; 4096];
    let cases: [(u32, u32, &mut [&mut [u8]]); 3] = [
        (512, 0, &mut empty),
        (0, 1, &mut [&mut small[..]]),
        (4096, 1, &mut [&mut huge[..]]),
    ];
    for (blksz, blocks, sg) in cases {
        let done = s.request(MmcRequest {
            sbc: None,
            cmd: r1(ResponseType::R1, 17, 0),
            data: Some(MmcData::read(blksz, blocks, sg)),
            stop: None,
        });
        assert!(
            done.int_status.has_error(error_int::ADMA_ERR),
            "{blksz}×{blocks}"
        );
        assert!(!done.is_ok());
    }
    assert_eq!(s.card.state(), CardState::Tran);
}

#[test]
fn more_descriptors_than_the_table_holds_is_an_adma_error() {
    let mut s = brought_up(model(), &HostCaps::default());
    // 300 one-block segments need 300 Tran descriptors + the terminator > 257.
    let data = pattern(5, 300 * 512);
    let mut sg: Vec<&[u8]> = data.chunks(512).collect();
    let done = s.request(write_request(0, 300, false, &mut sg));
    assert_eq!(done.adma_err, adma_err::ST_FDS);
    assert!(!done.cmd.issued);
    // 256 segments fit exactly.
    let mut sg: Vec<&[u8]> = data[..256 * 512].chunks(512).collect();
    assert!(s.request(write_request(0, 256, false, &mut sg)).is_ok());
    // So do 300 blocks in a few large segments.
    let mut sg: Vec<&[u8]> = data.chunks(65_536).collect();
    assert!(s.request(write_request(0, 300, false, &mut sg)).is_ok());
    assert_eq!(peek(&mut s, 0, 300), data);
}

#[test]
fn a_request_split_over_odd_segments_round_trips() {
    let mut s = brought_up(model(), &HostCaps::default());
    let data = pattern(6, 9 * 512);
    // Blocks straddle segments; a few segments sit at unaligned bus addresses.
    let sizes = [1usize, 511, 513, 7, 1000, 3, 2573];
    assert_eq!(sizes.iter().sum::<usize>(), data.len());
    let mut owned: Vec<Vec<u8>> = Vec::new();
    let mut at = 0;
    for n in sizes {
        owned.push(data[at..at + n].to_vec());
        at += n;
    }
    let mut sg: Vec<DmaBuf> = owned
        .iter_mut()
        .enumerate()
        .map(|(i, b)| DmaBuf {
            addr: 0x10_0000 * (i as u64 + 1) + i as u64,
            buf: b.as_mut_slice(),
        })
        .collect();
    assert!(s.request(write_request(2000, 9, false, &mut sg)).is_ok());
    assert_eq!(peek(&mut s, 2000, 9), data);

    let mut back: Vec<Vec<u8>> = [100usize, 2000, 1, 2507]
        .iter()
        .map(|&n| vec![0u8; n])
        .collect();
    let mut sg: Vec<&mut [u8]> = back.iter_mut().map(|b| b.as_mut_slice()).collect();
    let done = s.request(read_request(2000, 9, &mut sg));
    assert!(done.is_ok(), "{done:?}");
    assert_eq!(done.bytes_xfered, data.len() as u64);
    assert_eq!(back.concat(), data);

    // Reading into memory the DMA may not write is an ADMA error, not a panic.
    let ro = vec![0u8; 512];
    let mut sg = [&ro[..]];
    let done = s.request(read_request(2000, 1, &mut sg));
    assert!(done.int_status.has_error(error_int::ADMA_ERR));
    assert_eq!(done.bytes_xfered, 0);
}

/// mmc_test's "Proper xfer_size" cases (mmc_test_broken_transfer): a single-block command
/// with two blocks of data, and CMD13 with one. The card moves the one block its command
/// asks for (or none), the host waits in vain for the rest and reports a data time-out
/// (the error mmc_test_check_broken_result wants), and the card is back in transfer state
/// for the next command rather than waiting for data that never comes.
#[test]
fn more_blocks_than_the_command_moves_time_out_and_leave_the_card_in_tran() {
    let mut s = brought_up(model(), &HostCaps::default());
    let old = pattern(1, 1024);
    assert!(write(&mut s, 40, &old).is_ok());

    // CMD24 with two blocks: the first is written, the second is never acknowledged.
    let data = pattern(2, 1024);
    let mut sg = [&data[..]];
    let done = s.request(MmcRequest {
        sbc: None,
        cmd: r1(ResponseType::R1, 24, 40),
        data: Some(MmcData::write(512, 2, &mut sg)),
        stop: None,
    });
    assert_eq!(done.data_error, Some(SdhciError::DataTimeout), "{done:?}");
    assert_eq!(done.bytes_xfered, 0);
    assert_ne!(s.card.state(), CardState::Rcv);
    let back = peek(&mut s, 40, 2);
    assert_eq!(
        &back[..512],
        &data[..512],
        "the block CMD24 takes is written"
    );
    assert_eq!(&back[512..], &old[512..], "the extra block is not");

    // CMD17 with two blocks: one comes, then nothing.
    let mut buf = vec![0u8; 1024];
    let mut sg = [&mut buf[..]];
    let done = s.request(MmcRequest {
        sbc: None,
        cmd: r1(ResponseType::R1, 17, 40),
        data: Some(MmcData::read(512, 2, &mut sg)),
        stop: None,
    });
    assert_eq!(done.data_error, Some(SdhciError::DataTimeout), "{done:?}");
    assert_eq!(done.bytes_xfered, 0);
    assert_eq!(s.card.state(), CardState::Tran);

    // CMD8 with two blocks: the EXT_CSD block comes, then nothing.
    let mut buf = vec![0u8; 1024];
    let mut sg = [&mut buf[..]];
    let done = s.request(MmcRequest {
        sbc: None,
        cmd: r1(ResponseType::R1, 8, 0),
        data: Some(MmcData::read(512, 2, &mut sg)),
        stop: None,
    });
    assert_eq!(done.data_error, Some(SdhciError::DataTimeout), "{done:?}");
    assert_eq!(s.card.state(), CardState::Tran);

    // CMD13 with a block to read: an R1, no data.
    let mut buf = vec![0u8; 512];
    let mut sg = [&mut buf[..]];
    let done = s.request(MmcRequest {
        sbc: None,
        cmd: r1(ResponseType::R1, 13, RCA_ARG),
        data: Some(MmcData::read(512, 1, &mut sg)),
        stop: None,
    });
    assert!(done.cmd.error.is_none(), "{done:?}");
    assert_eq!(done.data_error, Some(SdhciError::DataTimeout));

    // The card takes the next command: the data is where the plain write put it.
    let st = status(&mut s);
    assert_eq!(st & r1::ILLEGAL_COMMAND, 0, "status {st:#x}");
    let mut back = vec![0u8; 512];
    assert!(read(&mut s, 40, &mut back).is_ok());
    assert_eq!(back, data[..512]);
}

// ---- time-outs and busy -----------------------------------------------------------------
// ---- time-outs and busy -----------------------------------------------------------------

#[test]
fn data_timeout_when_the_card_programs_longer_than_the_computed_timeout() {
    let mut m = model();
    m.timing.constant_mut().program_command_ns = 10_000_000_000; // 10 s
    let caps = HostCaps {
        cache: false,
        ..HostCaps::default()
    };
    let mut s = brought_up(m, &caps);
    let bus = s.host.bus();
    let data = pattern(7, 512);
    let start = s.now;
    let done = write(&mut s, 10, &data);
    assert_eq!(done.data_error, Some(SdhciError::DataTimeout));
    assert!(done.int_status.has_error(error_int::DATA_TIMEOUT));
    assert!(!done.int_status.has(normal_int::TRANSFER_COMPLETE));
    assert_eq!(done.bytes_xfered, 0);
    // TAAC 1 ms, NSAC 100 clocks, R2W_FACTOR 2: 40 ms + 4000 clocks → count 8 at 52 MHz.
    let (ns, clks) = mmc_data_timeout(&s.card.csd(), DataDirection::Write);
    assert_eq!((ns, clks), (40_000_000, 4000));
    let count = calc_timeout_count(target_timeout_us(Some((ns, clks)), 0, 52_000_000), 52_000);
    assert_eq!(count, (8, false));
    let timeout = hardware_timeout_ns(8, 52_000_000);
    let data_end = start + bus.command_ns(ResponseLength::Short) + bus.write_ns(512, 1);
    assert_eq!(
        done.end_ns,
        data_end + timeout,
        "time stops at the time-out"
    );
    assert!(s.card.busy_until().unwrap() > done.end_ns);
    assert_eq!(s.card.state(), CardState::Prg);
}

#[test]
fn read_access_longer_than_the_timeout_is_a_data_timeout() {
    let mut m = model();
    m.timing.constant_mut().read_access_ns = 1_000_000_000;
    let mut s = brought_up(m, &HostCaps::default());
    let bus = s.host.bus();
    // Reads: 10 × (1 ms + 100 clocks) = 10.02 ms → count 6 (10.08 ms) at 52 MHz.
    let (ns, clks) = mmc_data_timeout(&s.card.csd(), DataDirection::Read);
    let (count, _) = calc_timeout_count(target_timeout_us(Some((ns, clks)), 0, 52_000_000), 52_000);
    assert_eq!(count, 6);
    let start = s.now;
    let mut buf = vec![0u8; 512];
    let done = read(&mut s, 0, &mut buf);
    assert_eq!(done.data_error, Some(SdhciError::DataTimeout));
    assert!(done.int_status.has_error(error_int::DATA_TIMEOUT));
    assert_eq!(
        done.end_ns,
        start + bus.command_ns(ResponseLength::Short) + hardware_timeout_ns(6, 52_000_000)
    );

    // The counter restarts at every block: 8 blocks may take 8 time-outs of internal
    // read time in all (5 ms each here), though not one block's worth up front.
    let mut m = model();
    m.timing.constant_mut().read_access_ns = 0;
    m.timing.constant_mut().read_block_ns = 5_000_000;
    let mut s = brought_up(m, &HostCaps::default());
    let mut buf = vec![0u8; 8 * 512];
    assert!(read(&mut s, 0, &mut buf).is_ok());
    let mut buf = vec![0u8; 512];
    let mut m = model();
    m.timing.constant_mut().read_access_ns = 11_000_000;
    let mut s = brought_up(m, &HostCaps::default());
    assert_eq!(
        read(&mut s, 0, &mut buf).data_error,
        Some(SdhciError::DataTimeout)
    );
}

#[test]
fn r1b_busy_waiting_ends_at_the_cards_busy_end() {
    let mut m = model();
    m.timing.constant_mut().switch_ns = 5_000_000;
    let mut s = brought_up(m, &HostCaps::default());
    let bus = s.host.bus();
    let start = s.now;
    let arg = 0x0300_0000 | (emmc_card::ext_csd::ERASE_GROUP_DEF as u32) << 16 | 1 << 8;
    let done = s.command(r1(ResponseType::R1b, 6, arg).with_busy_timeout(100));
    assert!(done.is_ok(), "{done:?}");
    assert!(done
        .int_status
        .has(normal_int::CMD_COMPLETE | normal_int::TRANSFER_COMPLETE));
    let response_end = start + bus.command_ns(ResponseLength::Short);
    assert_eq!(done.end_ns, response_end + 5_000_000);
    assert_eq!(s.card.busy_until(), None);
    assert_eq!(s.card.state(), CardState::Tran);

    // A busy longer than the command's busy time-out stops at the time-out.
    let mut m = model();
    m.timing.constant_mut().switch_ns = 90_000_000;
    let mut s = brought_up(m, &HostCaps::default());
    let start = s.now;
    let done = s.command(r1(ResponseType::R1b, 6, arg).with_busy_timeout(10));
    assert!(done.cmd.ok());
    assert!(done.int_status.has_error(error_int::DATA_TIMEOUT));
    let (count, _) = calc_timeout_count(10_000, 52_000);
    assert_eq!(
        done.end_ns,
        start + bus.command_ns(ResponseLength::Short) + hardware_timeout_ns(count, 52_000_000)
    );
    assert_eq!(s.card.state(), CardState::Prg);
}

#[test]
fn long_cmd6_busy_is_polled_when_the_controller_cannot_wait_that_long() {
    // FLUSH_CACHE allows 10 min, beyond 2^27 TMCLK cycles: Linux sends R1 and polls.
    let mut m = model();
    m.timing.constant_mut().flush_ns = 3_000_000_000;
    let mut host = MmcHost::new(mem_card(m));
    host.mmc_init_card(&HostCaps::default()).unwrap();
    assert_eq!(host.sdhci.max_busy_timeout_ms(), 2581);
    let start = host.now;
    host.mmc_flush_cache().unwrap();
    assert!(host.now >= start + 3_000_000_000);
    assert_eq!(host.card.state(), CardState::Tran);
}

// ---- tuning -----------------------------------------------------------------------------

#[test]
fn hs200_tuning_succeeds_at_200mhz_on_8_lines() {
    let caps = HostCaps {
        hs200: true,
        ..HostCaps::default()
    };
    let mut s = brought_up(model(), &caps);
    assert_eq!(s.host.actual_clock(), 200_000_000);
    assert_eq!(s.ios().bus_width, 8);
    assert!(s.host.tuned());
    let data = pattern(8, 8 * 512);
    assert!(write(&mut s, 8, &data).is_ok());

    // Losing the tuning (timing changed and back) makes reads unreliable...
    let ios = s.ios();
    s.set_ios(MmcIos {
        timing: BusTiming::Hs,
        ..ios
    });
    s.set_ios(ios);
    assert!(!s.host.tuned());
    let mut back = vec![0u8; data.len()];
    assert_eq!(
        read(&mut s, 8, &mut back).data_error,
        Some(SdhciError::DataCrc)
    );
    // ...until tuning runs again: one CMD21 with the 128-byte block does it.
    let start = s.now;
    assert_eq!(s.execute_tuning(), Ok(1));
    let bus = s.host.bus();
    assert_eq!(
        s.now - start,
        bus.command_ns(ResponseLength::Short) + bus.read_ns(128, 1)
    );
    assert!(read(&mut s, 8, &mut back).is_ok());
    assert_eq!(back, data);

    // On the wrong width the tuning block never arrives intact: Linux's 40 tries fail.
    s.set_ios(MmcIos {
        bus_width: 4,
        ..ios
    });
    assert_eq!(s.execute_tuning(), Err(TuningError::Failed { tries: 40 }));
    assert!(!s.host.tuned());
}

// ---- power ------------------------------------------------------------------------------

#[test]
fn power_off_cuts_the_card_and_power_up_brings_it_back_to_idle() {
    let mut host = MmcHost::new(mem_card(model()));
    host.mmc_init_card(&HostCaps::default()).unwrap();
    host.mmc_power_off();
    assert_eq!(host.card.state(), CardState::Ina);
    assert!(matches!(
        host.mmc_send_status(),
        Err(crate::mmc::MmcError::Timeout(13))
    ));
    host.mmc_init_card(&HostCaps::default()).unwrap();
    assert_eq!(host.card.state(), CardState::Tran);
    assert_eq!(host.sdhci.ios().power_mode, PowerMode::On);
}

#[test]
fn a_stopped_clock_sends_nothing() {
    let mut s = brought_up(model(), &HostCaps::default());
    let ios = s.ios();
    s.set_ios(MmcIos { clock: 0, ..ios });
    let before = s.card.stats().commands;
    let done = s.command(r1(ResponseType::R1, 13, RCA_ARG));
    assert_eq!(done.cmd.error, Some(SdhciError::CmdTimeout));
    assert_eq!(done.duration_ns(), 0);
    assert_eq!(s.card.stats().commands, before);
}

#[test]
fn divided_clock_gives_what_sdhci_calc_clk_gives() {
    let host = |hz| {
        let mut h = SdhciHost::new(SdhciConfig {
            sd_clock: SdClock::Divided {
                base_hz: 200_000_000,
            },
            ..SdhciConfig::default()
        });
        let mut card = mem_card(model());
        h.set_ios(
            &mut card,
            0,
            MmcIos {
                clock: hz,
                ..MmcIos::IDENTIFICATION
            },
        );
        h.actual_clock()
    };
    assert_eq!(host(400_000), 400_000);
    assert_eq!(host(52_000_000), 50_000_000);
    assert_eq!(host(26_000_000), 25_000_000);
    assert_eq!(host(200_000_000), 200_000_000);
    assert_eq!(host(50_000), 200_000_000 / 2046);
}

/// `start_request` returns when programming begins; the owner waits for it, or stops
/// waiting at a deadline, and the card time is exactly what `request` would have given.
#[test]
fn start_request_leaves_the_programming_busy_to_the_caller() {
    let mut m = model();
    m.ext_csd.cache_size = 0;
    m.timing = emmc_card::model::TimingModel::Constant(emmc_card::model::ConstantTimingModel {
        program_command_ns: 5_000_000,
        ..Default::default()
    });
    let data = pattern(3, 64 * 512);
    // The whole request at once, for reference.
    let mut a = brought_up(m.clone(), &HostCaps::default());
    let t0 = a.now;
    let whole = write(&mut a, 100, &data);
    assert!(whole.is_ok() && !whole.busy_pending);
    let total = a.now - t0;
    // The same request started: it returns at the start of the busy.
    let mut b = brought_up(m, &HostCaps::default());
    let t0 = b.now;
    let mut sg = [&data[..]];
    let started = b.start_request(write_request(100, 64, false, &mut sg));
    assert!(started.is_ok() && started.busy_pending);
    let busy_start = b.now;
    assert_eq!(
        total - (busy_start - t0),
        5_000_000,
        "what is left is the programming"
    );
    assert_eq!(b.card.state(), emmc_card::CardState::Prg);
    // Not released before the deadline; released at its end afterwards.
    assert!(!b.wait_busy_until(Some(busy_start + 1_000_000)));
    assert_eq!(b.now, busy_start + 1_000_000);
    assert!(b.wait_busy_until(None));
    assert_eq!(b.now - t0, total);
    assert_eq!(peek(&mut b, 100, 64), data);
}
