//! The register-level SDHCI model driven through its registers by a small driver written
//! the way Linux's `sdhci.c` programs a controller (`driver.rs`), over guest memory that
//! records every DMA write (`guest.rs`): bring-up, every data path, busy, tuning, errors,
//! resets, hostile guests, and the card time against the request-level model.

mod driver;
mod guest;

use driver::*;
use emmc_card::model::DeviceModel;
use emmc_card::store::MemStore;
use emmc_card::{Card, CardState, Partition};
use emmc_host::mmc::{mmc_init_card, HostCaps, MmcCard, MmcHostOps};
use emmc_host::sdhci::mmio::layout::*;
use emmc_host::sdhci::mmio::MIN_POWER_OFF_NS;
use emmc_host::sdhci::{
    error_int, normal_int, BusTiming, MmcCommand, MmcData, MmcIos, MmcRequest, PowerMode,
    ResponseType, SdhciConfig, SdhciError, SdhciMmio,
};

fn model(name: &str) -> DeviceModel {
    DeviceModel::load(name).unwrap()
}

fn card(m: &DeviceModel) -> Card {
    Card::new(m.clone(), Box::new(MemStore::new(Card::layout_for(m)))).unwrap()
}

fn controller(m: &DeviceModel) -> SdhciMmio {
    SdhciMmio::new(card(m), SdhciConfig::default(), &m.host)
}

/// A driver probed on a fresh controller and card of model `m`.
fn probed(m: &DeviceModel, xfer: Xfer) -> Driver {
    Driver::probe(controller(m), xfer)
}

/// Brought up by the MMC core's own `mmc_init_card` over the register driver.
fn brought_up(m: &DeviceModel, xfer: Xfer) -> (Driver, MmcCard) {
    let mut d = probed(m, xfer);
    let card = mmc_init_card(&mut d, &HostCaps::for_model(&m.host)).expect("bring-up");
    (d, card)
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

fn peek(d: &mut Driver, lba: u64, blocks: usize) -> Vec<u8> {
    let mut buf = vec![0u8; blocks * 512];
    d.mmio
        .card_mut()
        .peek(Partition::User, lba, &mut buf)
        .unwrap();
    buf
}

fn r1(opcode: u8, arg: u32) -> MmcCommand {
    MmcCommand::for_opcode(opcode, arg)
}

/// CMD23 + CMD25 (CMD24 for one block), as mmc_block asks.
fn write(d: &mut Driver, lba: u64, data: &[u8]) -> emmc_host::sdhci::SdhciCompletion {
    let blocks = (data.len() / 512) as u32;
    let mut sg = [data];
    if blocks == 1 {
        d.request(MmcRequest {
            sbc: None,
            cmd: r1(24, lba as u32),
            data: Some(MmcData::write(512, 1, &mut sg)),
            stop: None,
        })
    } else {
        d.request(MmcRequest {
            sbc: Some(r1(23, blocks)),
            cmd: r1(25, lba as u32),
            data: Some(MmcData::write(512, blocks, &mut sg)),
            stop: Some(MmcCommand::new(12, 0, ResponseType::R1b)),
        })
    }
}

fn read(d: &mut Driver, lba: u64, buf: &mut [u8]) -> emmc_host::sdhci::SdhciCompletion {
    let blocks = (buf.len() / 512) as u32;
    let mut sg = [buf];
    if blocks == 1 {
        d.request(MmcRequest {
            sbc: None,
            cmd: r1(17, lba as u32),
            data: Some(MmcData::read(512, 1, &mut sg)),
            stop: None,
        })
    } else {
        d.request(MmcRequest {
            sbc: Some(r1(23, blocks)),
            cmd: r1(18, lba as u32),
            data: Some(MmcData::read(512, blocks, &mut sg)),
            stop: Some(r1(12, 0)),
        })
    }
}

const RCA: u32 = 1 << 16;

fn status(d: &mut Driver) -> u32 {
    d.send(13, RCA).expect("CMD13")[0]
}

// ---- bring-up -----------------------------------------------------------------------------

#[test]
fn the_mmc_core_brings_the_card_up_through_the_registers() {
    for (name, width, timing_reg) in [
        ("generic-emmc45", 8, 0u16),
        ("msm-emmc45-ddr50", 8, SDHCI_CTRL_UHS_DDR50),
        ("ideal", 8, SDHCI_CTRL_UHS_SDR104),
    ] {
        let m = model(name);
        let (mut d, card) = brought_up(&m, Xfer::Adma64);
        assert_eq!(d.mmio.card().state(), CardState::Tran, "{name}");
        assert_eq!(d.mmio.ios().bus_width, width, "{name}");
        assert_eq!(
            d.readw(SDHCI_HOST_CONTROL2) & SDHCI_CTRL_UHS_MASK,
            timing_reg,
            "{name}"
        );
        assert_eq!(card.ext_csd, d.mmio.card().ext_csd(), "{name}");
        let data = pattern(1, 8 * 512);
        assert!(write(&mut d, 40, &data).is_ok(), "{name}");
        let mut back = vec![0u8; data.len()];
        let done = read(&mut d, 40, &mut back);
        assert!(done.is_ok(), "{name}: {done:?}");
        assert_eq!(back, data, "{name}");
        assert_eq!(peek(&mut d, 40, 8), data, "{name}");
    }
}

/// Power on, 400 kHz, one line: the state `mmc_power_up` leaves.
fn powered(d: &mut Driver) {
    d.apply_ios(MmcIos {
        clock: 400_000,
        bus_width: 1,
        timing: BusTiming::Legacy,
        power_mode: PowerMode::On,
    });
}

/// Issue a command through the registers without waiting (argument, transfer mode,
/// command), as `sdhci_send_command` does.
fn issue(d: &mut Driver, opcode: u8, arg: u32, resp: ResponseType, data: bool, mode: u16) {
    d.writel(arg, SDHCI_ARGUMENT);
    d.writew(mode, SDHCI_TRANSFER_MODE);
    d.writew(
        sdhci_make_cmd(opcode, Driver::flags(resp, data)),
        SDHCI_COMMAND,
    );
}

/// Run the model until `pred` holds on the interrupt status (not acknowledged); the
/// status, or panic if it never does.
fn until(d: &mut Driver, what: &str, pred: impl Fn(u32) -> bool) -> u32 {
    for _ in 0..100_000 {
        let st = d.readl(SDHCI_INT_STATUS);
        if pred(st) {
            return st;
        }
        assert!(
            d.step(),
            "{what}: nothing more will happen (status {st:#x})"
        );
    }
    panic!("{what}: never");
}

fn present(d: &mut Driver) -> u32 {
    d.readl(SDHCI_PRESENT_STATE)
}

const EMBEDDED_CARD: u32 = SDHCI_CARD_PRESENT
    | SDHCI_CD_STABLE
    | SDHCI_CD_LVL
    | SDHCI_WRITE_PROTECT
    | SDHCI_DATA_LVL_MASK
    | SDHCI_CMD_LVL;

/// generic-emmc45 with constant timing: `f` sets its costs.
fn constant_model(f: impl FnOnce(&mut emmc_card::model::ConstantTimingModel)) -> DeviceModel {
    let mut m = model("generic-emmc45");
    f(m.timing.constant_mut());
    m
}

// ---- the register file at power-on ---------------------------------------------------------

#[test]
fn power_on_registers_capabilities_and_version() {
    let m = model("generic-emmc45");
    let mut d = probed(&m, Xfer::Adma64);
    assert_eq!(d.version & 0xFF, SDHCI_SPEC_300);
    assert_eq!(d.max_clk, 52_000_000);
    assert_eq!(d.timeout_clk_khz, 52_000);
    for bit in [
        SDHCI_CAN_DO_8BIT,
        SDHCI_CAN_DO_ADMA2,
        SDHCI_CAN_DO_SDMA,
        SDHCI_CAN_DO_HISPD,
        SDHCI_CAN_VDD_330,
        SDHCI_CAN_VDD_180,
        SDHCI_CAN_64BIT,
    ] {
        assert_ne!(d.caps & bit, 0, "{bit:#x}");
    }
    assert_eq!(
        d.caps & SDHCI_MAX_BLOCK_MASK,
        2 << SDHCI_MAX_BLOCK_SHIFT,
        "2048-byte blocks"
    );
    assert_eq!(d.caps1, 0, "HS at 52 MHz: no UHS modes");
    assert_eq!(d.readl(SDHCI_MAX_CURRENT), 200 | 200 << 16);
    assert_eq!(present(&mut d), EMBEDDED_CARD);
    // Everything else starts at 0: bus power off, clock off.
    for off in [
        SDHCI_DMA_ADDRESS,
        SDHCI_BLOCK_SIZE,
        SDHCI_ARGUMENT,
        SDHCI_TRANSFER_MODE,
        SDHCI_RESPONSE,
        SDHCI_RESPONSE + 12,
        SDHCI_HOST_CONTROL,
        SDHCI_CLOCK_CONTROL,
        SDHCI_AUTO_CMD_STATUS,
        SDHCI_ADMA_ERROR,
        SDHCI_ADMA_ADDRESS,
        SDHCI_ADMA_ADDRESS_HI,
    ] {
        assert_eq!(d.readl(off), 0, "{off:#x}");
    }
    assert_eq!(d.readw(SDHCI_SLOT_INT_STATUS), 0);
    assert_eq!(d.readl(SDHCI_INT_STATUS), 0);
    assert_eq!(d.readl(SDHCI_INT_ENABLE), DEFAULT_IER);
    assert!(!d.mmio.irq_asserted());
    // Read-only registers stay as they are.
    d.writel(0, SDHCI_CAPABILITIES);
    d.writel(0xFFFF_FFFF, SDHCI_PRESENT_STATE);
    d.writew(0x1234, SDHCI_HOST_VERSION);
    assert_eq!(d.readl(SDHCI_CAPABILITIES), d.caps);
    assert_eq!(present(&mut d), EMBEDDED_CARD);
    assert_eq!(d.readw(SDHCI_HOST_VERSION), d.version);
    // Without power or clock nothing goes out: every command times out, at once.
    let t = d.now;
    assert_eq!(d.send(0, 0).err(), Some(SdhciError::CmdTimeout));
    assert_eq!(d.send(1, 0).err(), Some(SdhciError::CmdTimeout));
    assert_eq!(d.now, t);
    assert_eq!(
        d.mmio.card().stats().commands,
        0,
        "nothing reached the card"
    );
}

// ---- bring-up by hand ------------------------------------------------------------------------

#[test]
fn bring_up_by_hand_reaches_transfer_state() {
    let m = model("generic-emmc45");
    let mut d = probed(&m, Xfer::Pio);
    powered(&mut d);
    assert_eq!(d.mmio.ios().clock, 400_000);
    d.send(0, 0).unwrap();
    // CMD1 with Linux's OCR until the card says it is powered up.
    let mut ocr = 0;
    for _ in 0..10 {
        ocr = d.send(1, 0x40FF_8080).unwrap()[0];
        if ocr & 1 << 31 != 0 {
            break;
        }
        let t = d.now + 1_000_000;
        d.idle_to(t);
    }
    assert_ne!(ocr & 1 << 31, 0, "power-up done: {ocr:#x}");
    // R2: the driver's shift gives the register with its CRC byte 0, as Linux keeps it.
    let cid = d.send(2, 0).unwrap();
    let reg = d.mmio.card().cid();
    let be = |i: usize| u32::from_be_bytes([reg[i], reg[i + 1], reg[i + 2], reg[i + 3]]);
    assert_eq!(cid, [be(0), be(4), be(8), be(12) & !0xFF]);
    // The Response registers hold bits 127:8: RESP[31:0] = register bytes 11..14.
    assert_eq!(d.readl(SDHCI_RESPONSE), be(11));
    d.send(3, RCA).unwrap();
    let csd = d.send(9, RCA).unwrap();
    assert_eq!(csd[0] >> 24, u32::from(d.mmio.card().csd()[0]));
    d.send(7, RCA).unwrap();
    assert_eq!(d.mmio.card().state(), CardState::Tran);

    // EXT_CSD by PIO and by ADMA2: the same 512 bytes the card holds.
    let mut ext = vec![0u8; 512];
    let mut sg = [&mut ext[..]];
    let done = d.request(MmcRequest {
        sbc: None,
        cmd: r1(8, 0),
        data: Some(MmcData::read(512, 1, &mut sg)),
        stop: None,
    });
    assert!(done.is_ok(), "{done:?}");
    assert!(d.pio_ints >= 1);
    assert_eq!(ext[..], d.mmio.card().ext_csd()[..]);
    d.xfer = Xfer::Adma32;
    let mut ext2 = vec![0u8; 512];
    let mut sg = [&mut ext2[..]];
    assert!(d
        .request(MmcRequest {
            sbc: None,
            cmd: r1(8, 0),
            data: Some(MmcData::read(512, 1, &mut sg)),
            stop: None,
        })
        .is_ok());
    assert_eq!(ext2, ext);

    // CMD6 BUS_WIDTH 8, the host follows; HS_TIMING, the clock goes up.
    let switch = |index: u32, value: u32| 0x0300_0000 | index << 16 | value << 8;
    d.send(6, switch(183, 2)).unwrap();
    let mut ios = d.mmio.ios();
    ios.bus_width = 8;
    d.apply_ios(ios);
    d.send(6, switch(185, 1)).unwrap();
    ios.timing = BusTiming::Hs;
    ios.clock = 52_000_000;
    d.apply_ios(ios);
    assert_eq!(d.mmio.ios().clock, 52_000_000);
    assert_eq!(
        d.readb(SDHCI_HOST_CONTROL) & (SDHCI_CTRL_8BITBUS | SDHCI_CTRL_HISPD),
        SDHCI_CTRL_8BITBUS | SDHCI_CTRL_HISPD
    );
    assert_eq!(d.mmio.card().bus_config(), (1, 2));
    let st = status(&mut d);
    assert_eq!(emmc_card::r1::current_state(st), CardState::Tran.number());
    // Data at the new width and speed.
    let data = pattern(2, 4 * 512);
    assert!(write(&mut d, 7, &data).is_ok());
    assert_eq!(peek(&mut d, 7, 4), data);
}

// ---- every data path ----------------------------------------------------------------------

#[test]
fn reads_and_writes_round_trip_by_every_data_path() {
    let m = model("generic-emmc45");
    let mut lba = 100;
    for xfer in [Xfer::Adma32, Xfer::Adma64, Xfer::Sdma, Xfer::Pio] {
        for (auto23, auto12, with_sbc) in [
            (true, false, true),
            (false, false, true),
            (false, true, false),
            (false, false, false),
        ] {
            if auto23 && xfer == Xfer::Sdma {
                continue;
            }
            let (mut d, _) = brought_up(&m, xfer);
            (d.dma_ints, d.pio_ints) = (0, 0);
            d.auto_cmd23 = auto23;
            d.auto_cmd12 = auto12;
            if xfer == Xfer::Sdma {
                // 4 KiB boundaries, and data 256 bytes past one: chunks end mid-block.
                d.sdma_boundary = 0;
                d.data_off = 0x100;
            }
            let what = format!("{xfer:?} auto23 {auto23} auto12 {auto12} sbc {with_sbc}");
            for blocks in [1u32, 3, 40] {
                let data = pattern(blocks as u8, blocks as usize * 512);
                let sbc = (with_sbc && blocks > 1).then(|| r1(23, blocks));
                let (wr, rd) = if blocks > 1 { (25, 18) } else { (24, 17) };
                let stop = |resp| (blocks > 1).then(|| MmcCommand::new(12, 0, resp));
                let mut sg = [&data[..]];
                let w = d.request(MmcRequest {
                    sbc,
                    cmd: r1(wr, lba),
                    data: Some(MmcData::write(512, blocks, &mut sg)),
                    stop: stop(ResponseType::R1b),
                });
                assert!(w.is_ok(), "{what} write {blocks}: {w:?}");
                assert_eq!(w.bytes_xfered, data.len() as u64);
                assert_eq!(
                    w.sbc.is_some_and(|s| s.auto),
                    auto23 && with_sbc && blocks > 1,
                    "{what}"
                );
                assert_eq!(
                    w.stop.is_some_and(|s| s.auto),
                    auto12 && !with_sbc && blocks > 1,
                    "{what}"
                );
                let mut back = vec![0u8; data.len()];
                let mut sg = [&mut back[..]];
                let r = d.request(MmcRequest {
                    sbc,
                    cmd: r1(rd, lba),
                    data: Some(MmcData::read(512, blocks, &mut sg)),
                    stop: stop(ResponseType::R1),
                });
                assert!(r.is_ok(), "{what} read {blocks}: {r:?}");
                assert_eq!(back, data, "{what} read {blocks}");
                assert_eq!(
                    peek(&mut d, u64::from(lba), blocks as usize),
                    data,
                    "{what}"
                );
                assert_eq!(d.mmio.card().state(), CardState::Tran, "{what}");
                lba += blocks;
            }
            match xfer {
                // 40 blocks at 0x100 past a 4 KiB boundary cross 5 boundaries each way.
                Xfer::Sdma => assert_eq!(d.dma_ints, 2 * 5, "{what}"),
                Xfer::Pio => assert_eq!(d.pio_ints, 2 * (1 + 3 + 40), "{what}"),
                _ => assert_eq!(d.dma_ints, 0, "{what}"),
            }
        }
    }
}

#[test]
fn sdma_waits_at_each_boundary_until_the_guest_writes_the_address() {
    let m = model("generic-emmc45");
    let (mut d, _) = brought_up(&m, Xfer::Sdma);
    let data = pattern(5, 24 * 512);
    assert!(write(&mut d, 300, &data).is_ok());
    d.mem.put(DATA, &[0u8; 24 * 512]);
    // 12 KiB read with 4 KiB boundaries, by hand.
    d.writeb(
        SDHCI_CTRL_8BITBUS | SDHCI_CTRL_HISPD | SDHCI_CTRL_SDMA,
        SDHCI_HOST_CONTROL,
    );
    d.set_ier(DEFAULT_IER | int(normal_int::DMA_INT));
    d.writel(DATA as u32, SDHCI_DMA_ADDRESS);
    d.writew(sdhci_make_blksz(0, 512), SDHCI_BLOCK_SIZE);
    d.writew(24, SDHCI_BLOCK_COUNT);
    d.writel(24, SDHCI_ARGUMENT);
    d.writew(
        sdhci_make_cmd(23, Driver::flags(ResponseType::R1, false)),
        SDHCI_COMMAND,
    );
    until(&mut d, "CMD23", |s| s & int(normal_int::CMD_COMPLETE) != 0);
    d.ack(int(normal_int::CMD_COMPLETE));
    let mode = SDHCI_TRNS_DMA | SDHCI_TRNS_BLK_CNT_EN | SDHCI_TRNS_MULTI | SDHCI_TRNS_READ;
    issue(&mut d, 18, 300, ResponseType::R1, true, mode);
    let st = until(&mut d, "first boundary", |s| {
        s & int(normal_int::DMA_INT) != 0
    });
    assert_eq!(st & int(normal_int::TRANSFER_COMPLETE), 0);
    assert_eq!(
        d.readl(SDHCI_DMA_ADDRESS),
        (DATA + 4096) as u32,
        "paused at the boundary"
    );
    assert_eq!(d.mem.get(DATA, 4096), data[..4096]);
    assert!(d.mem.get(DATA + 4096, 4096).iter().all(|&b| b == 0));
    d.ack(st & int(normal_int::CMD_COMPLETE | normal_int::DMA_INT));
    // The engine waits for the guest however long it takes.
    let t = d.now + 1_000_000_000;
    d.idle_to(t);
    assert_eq!(d.readl(SDHCI_INT_STATUS), 0);
    assert_ne!(present(&mut d) & SDHCI_DATA_INHIBIT, 0);
    // Restarting elsewhere puts the next chunk there.
    let elsewhere = DATA + 0x10_0000;
    d.writel(elsewhere as u32, SDHCI_DMA_ADDRESS);
    let st = until(&mut d, "second boundary", |s| {
        s & int(normal_int::DMA_INT) != 0
    });
    assert_eq!(d.mem.get(elsewhere, 4096), data[4096..8192]);
    d.ack(st);
    d.writel((elsewhere + 4096) as u32, SDHCI_DMA_ADDRESS);
    let st = until(&mut d, "end", |s| {
        s & int(normal_int::TRANSFER_COMPLETE) != 0
    });
    assert_eq!(
        st & int(normal_int::DMA_INT),
        0,
        "no boundary after the last chunk"
    );
    assert_eq!(d.mem.get(elsewhere + 4096, 4096), data[8192..]);
    assert_eq!(d.readl(SDHCI_DMA_ADDRESS), (elsewhere + 8192) as u32);
    assert_eq!(present(&mut d) & (SDHCI_DATA_INHIBIT | SDHCI_DOING_READ), 0);
    assert_eq!(d.readw(SDHCI_BLOCK_COUNT), 0, "counted down");
}

#[test]
fn adma_int_descriptors_raise_dma_interrupts() {
    let m = model("generic-emmc45");
    for xfer in [Xfer::Adma32, Xfer::Adma64] {
        let (mut d, _) = brought_up(&m, xfer);
        d.adma_int = true;
        let data = pattern(6, 256 * 512);
        assert!(write(&mut d, 1000, &data).is_ok());
        let mut back = vec![0u8; data.len()];
        assert!(read(&mut d, 1000, &mut back).is_ok());
        assert_eq!(back, data);
        // 128 KiB each way in two 64 KiB descriptors with Int.
        assert_eq!(d.dma_ints, 4, "{xfer:?}");
        assert_eq!(
            d.readl(SDHCI_ADMA_ADDRESS),
            (TABLE + 3 * if xfer == Xfer::Adma64 { 12 } else { 8 }) as u32,
            "past the End descriptor"
        );
    }
}

// ---- busy -----------------------------------------------------------------------------------

#[test]
fn r1b_busy_holds_the_dat_line_until_the_card_releases_it() {
    let m = constant_model(|c| {
        c.switch_ns = 5_000_000;
        c.erase_group_ns = 3_000_000;
    });
    let (mut d, _) = brought_up(&m, Xfer::Adma64);
    let bus = emmc_card::timing::Bus::new(52_000_000, 8, false);
    let short = bus.command_ns(emmc_card::timing::bus::ResponseLength::Short);
    // CMD6 (R1b): Command Complete at the response, the DAT line busy until the card's
    // busy ends, then Transfer Complete.
    let start = d.now;
    let arg = 0x0300_0000 | (emmc_card::ext_csd::ERASE_GROUP_DEF as u32) << 16 | 1 << 8;
    issue(&mut d, 6, arg, ResponseType::R1b, false, 0);
    assert_ne!(
        present(&mut d) & (SDHCI_CMD_INHIBIT | SDHCI_DATA_INHIBIT),
        0
    );
    let st = until(&mut d, "response", |s| {
        s & int(normal_int::CMD_COMPLETE) != 0
    });
    assert_eq!(d.now, start + short);
    assert_eq!(st & int(normal_int::TRANSFER_COMPLETE), 0);
    let p = present(&mut d);
    assert_eq!(p & SDHCI_CMD_INHIBIT, 0, "the CMD line is free");
    assert_ne!(p & (SDHCI_DATA_INHIBIT | SDHCI_DAT_LINE_ACTIVE), 0);
    assert_eq!(p & SDHCI_DATA_0_LVL_MASK, 0, "DAT0 low while busy");
    assert_eq!(d.mmio.next_event(), Some(start + short + 5_000_000));
    d.ack(int(normal_int::CMD_COMPLETE));
    let st = until(&mut d, "busy end", |s| {
        s & int(normal_int::TRANSFER_COMPLETE) != 0
    });
    assert_eq!(st, int(normal_int::TRANSFER_COMPLETE));
    assert_eq!(d.now, start + short + 5_000_000, "at the card's busy end");
    let p = present(&mut d);
    assert_eq!(p & (SDHCI_DATA_INHIBIT | SDHCI_DAT_LINE_ACTIVE), 0);
    assert_ne!(p & SDHCI_DATA_0_LVL_MASK, 0);
    d.ack(st);

    // The same switch sent as R1 (Linux's polled busy): no DAT inhibit, DAT0 low.
    let start = d.now;
    issue(&mut d, 6, arg, ResponseType::R1, false, 0);
    until(&mut d, "response", |s| {
        s & int(normal_int::CMD_COMPLETE) != 0
    });
    d.ack(int(normal_int::CMD_COMPLETE));
    let p = present(&mut d);
    assert_eq!(p & SDHCI_DATA_INHIBIT, 0);
    assert_eq!(p & SDHCI_DATA_0_LVL_MASK, 0);
    assert!(d.wait_busy_until(None));
    assert_eq!(d.now, start + short + 5_000_000);
    assert_eq!(
        d.readl(SDHCI_INT_STATUS),
        0,
        "nothing to say when DAT0 rises"
    );

    // CMD38 erase: R1b again, through the driver.
    d.send(35, 2048).unwrap();
    d.send(36, 4095).unwrap();
    let before = d.now;
    d.send(38, 0).unwrap();
    assert!(d.now >= before + short + 3_000_000);
    assert_eq!(d.mmio.card().state(), CardState::Tran);
    assert_ne!(present(&mut d) & SDHCI_DATA_0_LVL_MASK, 0);
}

#[test]
fn a_busy_beyond_the_data_timeout_is_a_data_timeout() {
    let m = constant_model(|c| c.switch_ns = 90_000_000);
    let (mut d, _) = brought_up(&m, Xfer::Adma64);
    // Count 6 at 52 MHz: 2^19 cycles = 10.08 ms.
    d.timeout_count = 6;
    let start = d.now;
    let arg = 0x0300_0000 | (emmc_card::ext_csd::ERASE_GROUP_DEF as u32) << 16 | 1 << 8;
    let mut st = Default::default();
    let o = d.command(&MmcCommand::new(6, arg, ResponseType::R1b), &mut st);
    assert_eq!(o.error, Some(SdhciError::CmdTimeout), "Linux's -ETIMEDOUT");
    assert_ne!(st.error & error_int::DATA_TIMEOUT, 0);
    let short = emmc_card::timing::Bus::new(52_000_000, 8, false)
        .command_ns(emmc_card::timing::bus::ResponseLength::Short);
    assert_eq!(
        d.now,
        start + short + emmc_host::sdhci::hardware_timeout_ns(6, 52_000_000)
    );
    assert_eq!(
        d.mmio.card().state(),
        CardState::Prg,
        "the card is still busy"
    );
    assert_eq!(present(&mut d) & SDHCI_DATA_0_LVL_MASK, 0);
    // With the Data Timeout status disabled the controller waits it out.
    d.wait_busy_until(None);
    d.set_ier(DEFAULT_IER & !err(error_int::DATA_TIMEOUT));
    let start = d.now;
    let o = d.command(&MmcCommand::new(6, arg, ResponseType::R1b), &mut st);
    assert_eq!(o.error, None);
    assert_eq!(d.now, start + short + 90_000_000);
}

// ---- tuning ---------------------------------------------------------------------------------

#[test]
fn hs200_tuning_sets_sampling_clock_select() {
    let m = model("ideal");
    let (mut d, _) = brought_up(&m, Xfer::Adma64);
    assert_eq!(d.mmio.ios().clock, 200_000_000);
    let hc2 = d.readw(SDHCI_HOST_CONTROL2);
    assert_eq!(hc2 & SDHCI_CTRL_UHS_MASK, SDHCI_CTRL_UHS_SDR104);
    assert_eq!(
        hc2 & (SDHCI_CTRL_EXEC_TUNING | SDHCI_CTRL_TUNED_CLK),
        SDHCI_CTRL_TUNED_CLK
    );
    let data = pattern(3, 16 * 512);
    assert!(write(&mut d, 64, &data).is_ok());
    // Back to the fixed sampling clock: reads at 200 MHz are garbage.
    d.writew(hc2 & !SDHCI_CTRL_TUNED_CLK, SDHCI_HOST_CONTROL2);
    assert_eq!(d.readw(SDHCI_HOST_CONTROL2) & SDHCI_CTRL_TUNED_CLK, 0);
    let mut back = vec![0u8; data.len()];
    assert_eq!(
        read(&mut d, 64, &mut back).data_error,
        Some(SdhciError::DataCrc)
    );
    // Tuning again: one CMD21 and its 128-byte block, Buffer Read Ready only.
    let start = d.now;
    assert_eq!(d.tune(), Ok(1));
    let bus = emmc_card::timing::Bus::new(200_000_000, 8, false);
    assert_eq!(
        d.now - start,
        bus.command_ns(emmc_card::timing::bus::ResponseLength::Short) + bus.read_ns(128, 1)
    );
    assert_ne!(d.readw(SDHCI_HOST_CONTROL2) & SDHCI_CTRL_TUNED_CLK, 0);
    assert!(read(&mut d, 64, &mut back).is_ok());
    assert_eq!(back, data);
    // On 4 lines the card's 8-bit tuning block never arrives intact: 40 tries, fixed clock.
    let mut ios = d.mmio.ios();
    ios.bus_width = 4;
    d.apply_ios(ios);
    assert_eq!(
        d.tune(),
        Err(emmc_host::sdhci::TuningError::Failed { tries: 40 })
    );
    assert_eq!(
        d.readw(SDHCI_HOST_CONTROL2) & (SDHCI_CTRL_EXEC_TUNING | SDHCI_CTRL_TUNED_CLK),
        0
    );
}

// ---- faults ---------------------------------------------------------------------------------

fn injector(text: &str) -> emmc_host::fault::FaultInjector {
    emmc_host::fault::FaultInjector::new(emmc_host::fault::FaultPlan::from_toml_str(text).unwrap())
        .unwrap()
}

#[test]
fn a_fault_plans_errors_arrive_as_error_interrupts() {
    let m = model("generic-emmc45");
    let (mut d, _) = brought_up(&m, Xfer::Adma64);
    let data = pattern(4, 8 * 512);
    assert!(write(&mut d, 500, &data).is_ok());
    d.mmio.set_fault_injector(Some(injector(
        "[[rule]]\ncommand = 13\nnth = 1\neffect = { kind = \"cmd_crc\" }\n\
         [[rule]]\ncommand = 13\nnth = 2\neffect = { kind = \"cmd_timeout\" }\n\
         [[rule]]\ncommand = 18\nnth = 1\neffect = { kind = \"data_crc\" }\n\
         [[rule]]\ncommand = 18\nnth = 2\neffect = { kind = \"data_timeout\" }\n\
         [[rule]]\ncommand = 25\nnth = 1\neffect = { kind = \"data_crc\" }\n",
    )));
    let mut st = Default::default();
    let o = d.command(&r1(13, RCA), &mut st);
    assert_eq!(o.error, Some(SdhciError::CmdCrc));
    assert_ne!(st.error & error_int::CMD_CRC, 0);
    let mut st = Default::default();
    let o = d.command(&r1(13, RCA), &mut st);
    assert_eq!(o.error, Some(SdhciError::CmdTimeout));
    assert_ne!(st.error & error_int::CMD_TIMEOUT, 0);
    // The card saw a corrupted command.
    assert_ne!(status(&mut d) & emmc_card::r1::COM_CRC_ERROR, 0);
    let mut back = vec![0u8; data.len()];
    let r = read(&mut d, 500, &mut back);
    assert_eq!(r.data_error, Some(SdhciError::DataCrc));
    assert_ne!(r.int_status.error & error_int::DATA_CRC, 0);
    assert!(
        r.stop.is_some_and(|s| s.issued),
        "Linux's stop after a data error"
    );
    let before = d.now;
    let r = read(&mut d, 500, &mut back);
    assert_eq!(r.data_error, Some(SdhciError::DataTimeout));
    assert!(d.now - before >= emmc_host::sdhci::hardware_timeout_ns(0xE, 52_000_000));
    let w = write(&mut d, 500, &pattern(9, 8 * 512));
    assert_eq!(w.data_error, Some(SdhciError::DataCrc));
    assert_eq!(peek(&mut d, 500, 8), data, "the card took nothing");
    // The plan is spent: everything works again.
    assert!(read(&mut d, 500, &mut back).is_ok());
    assert_eq!(back, data);
    let f = d.mmio.fault_injector().unwrap();
    assert_eq!((0..5).map(|i| f.fired(i)).sum::<u64>(), 5);
}

// ---- HPI ------------------------------------------------------------------------------------

#[test]
fn hpi_by_cmd13_ends_a_long_write_early() {
    let mut m = constant_model(|c| {
        c.program_command_ns = 2_000_000_000;
        c.hpi_exit_ns = 1_000_000;
    });
    m.ext_csd.cache_size = 0;
    let (mut d, _) = brought_up(&m, Xfer::Adma64);
    let data = pattern(7, 16 * 512);
    d.mem.put(DATA, &data);
    // CMD23 + CMD25 by ADMA2, by hand.
    d.writeb(
        SDHCI_CTRL_8BITBUS | SDHCI_CTRL_HISPD | SDHCI_CTRL_ADMA64,
        SDHCI_HOST_CONTROL,
    );
    write_table(
        &d.mem,
        TABLE,
        true,
        &[
            (emmc_host::sdhci::adma2_attr::TRAN_VALID, data.len(), DATA),
            (emmc_host::sdhci::adma2_attr::NOP_END_VALID, 0, 0),
        ],
    );
    d.writel(TABLE as u32, SDHCI_ADMA_ADDRESS);
    d.writel(0, SDHCI_ADMA_ADDRESS_HI);
    d.writew(sdhci_make_blksz(7, 512), SDHCI_BLOCK_SIZE);
    d.writew(16, SDHCI_BLOCK_COUNT);
    d.writel(16, SDHCI_ARGUMENT2);
    let mode = SDHCI_TRNS_DMA | SDHCI_TRNS_BLK_CNT_EN | SDHCI_TRNS_MULTI | SDHCI_TRNS_AUTO_CMD23;
    issue(&mut d, 25, 2000, ResponseType::R1, true, mode);
    until(&mut d, "response", |s| {
        s & int(normal_int::CMD_COMPLETE) != 0
    });
    d.ack(int(normal_int::CMD_COMPLETE));
    // Let the data go out; the card programs for 2 s.
    let t = d.now + 1_000_000;
    d.idle_to(t);
    assert_eq!(d.mmio.card().state(), CardState::Prg);
    assert_eq!(
        d.readl(SDHCI_INT_STATUS),
        0,
        "no Transfer Complete while programming"
    );
    let p = present(&mut d);
    assert_ne!(p & SDHCI_DATA_INHIBIT, 0);
    assert_eq!(p & (SDHCI_CMD_INHIBIT | SDHCI_DATA_0_LVL_MASK), 0);
    // HPI: CMD13 with bit 0 set, on the free CMD line while the DAT line is busy.
    let hpi_at = d.now;
    issue(&mut d, 13, RCA | 1, ResponseType::R1, false, 0);
    until(&mut d, "HPI response", |s| {
        s & int(normal_int::CMD_COMPLETE) != 0
    });
    d.ack(int(normal_int::CMD_COMPLETE));
    let st = until(&mut d, "write end", |s| {
        s & int(normal_int::TRANSFER_COMPLETE) != 0
    });
    assert_eq!(st & 0xFFFF_0000, 0);
    let short = emmc_card::timing::Bus::new(52_000_000, 8, false)
        .command_ns(emmc_card::timing::bus::ResponseLength::Short);
    assert_eq!(
        d.now,
        hpi_at + short + 1_000_000,
        "the card left prg after its HPI exit time"
    );
    assert_eq!(d.mmio.card().stats().hpi_interrupts, 1);
    assert_eq!(d.mmio.card().state(), CardState::Tran);
}

// ---- resets ---------------------------------------------------------------------------------

#[test]
fn software_resets_clear_the_command_and_data_lines() {
    let m = model("generic-emmc45");
    let (mut d, _) = brought_up(&m, Xfer::Pio);
    // A PIO read the guest abandons: Buffer Read Ready, then a DAT line reset.
    d.writew(sdhci_make_blksz(7, 512), SDHCI_BLOCK_SIZE);
    d.writew(4, SDHCI_BLOCK_COUNT);
    issue(
        &mut d,
        18,
        0,
        ResponseType::R1,
        true,
        SDHCI_TRNS_BLK_CNT_EN | SDHCI_TRNS_MULTI | SDHCI_TRNS_READ,
    );
    let st = until(&mut d, "first block", |s| {
        s & int(normal_int::BUF_READ_READY) != 0
    });
    assert_ne!(
        present(&mut d) & (SDHCI_DATA_AVAILABLE | SDHCI_DOING_READ),
        0
    );
    let _ = d.readl(SDHCI_BUFFER);
    d.reset(SDHCI_RESET_DATA);
    assert_eq!(
        present(&mut d) & (SDHCI_DATA_INHIBIT | SDHCI_DATA_AVAILABLE | SDHCI_DOING_READ),
        0
    );
    assert_eq!(
        d.readl(SDHCI_INT_STATUS) & int(normal_int::BUF_READ_READY),
        0,
        "the DAT line's status went with it"
    );
    assert_ne!(st & int(normal_int::CMD_COMPLETE), 0);
    assert_eq!(d.readl(SDHCI_BUFFER), 0);
    let t = d.now + 100_000_000;
    d.idle_to(t);
    assert_eq!(
        d.readl(SDHCI_INT_STATUS) & int(normal_int::TRANSFER_COMPLETE),
        0
    );
    // The card still sends: the guest stops it.
    d.ack(0xFFFF_FFFF);
    d.send(12, 0).unwrap();
    assert_eq!(d.mmio.card().state(), CardState::Tran);
    // A command reset before the response: no Command Complete ever, the line is free.
    issue(&mut d, 13, RCA, ResponseType::R1, false, 0);
    assert_ne!(present(&mut d) & SDHCI_CMD_INHIBIT, 0);
    d.reset(SDHCI_RESET_CMD);
    assert_eq!(present(&mut d) & SDHCI_CMD_INHIBIT, 0);
    let t = d.now + 10_000_000;
    d.idle_to(t);
    assert_eq!(d.readl(SDHCI_INT_STATUS), 0);
    assert_eq!(status(&mut d) & 0x1E00, 4 << 9, "tran");
    // Reset all: registers back to 0; the card keeps its supply and its state (Linux's
    // runtime resume resets all and goes on with the card selected).
    let power = d.readb(SDHCI_POWER_CONTROL);
    d.reset(SDHCI_RESET_ALL);
    assert_eq!(d.readb(SDHCI_POWER_CONTROL), 0);
    assert_eq!(d.readw(SDHCI_CLOCK_CONTROL), 0);
    assert_eq!(d.readl(SDHCI_INT_ENABLE), 0);
    assert_eq!(d.mmio.card().state(), CardState::Tran, "still powered");
    // The driver programs power and clock again: the card answers where it was.
    d.writeb(power, SDHCI_POWER_CONTROL);
    d.set_ier(u32::MAX);
    d.set_clock(400_000);
    assert_eq!(status(&mut d) & 0x1E00, 4 << 9, "tran, not re-initialised");
    // Writing SD Bus Power off is what cuts the card (once the power-off time passed).
    d.writeb(0, SDHCI_POWER_CONTROL);
    let t = d.mmio.now() + MIN_POWER_OFF_NS;
    d.idle_to(t);
    assert_eq!(d.mmio.card().state(), CardState::Ina);
}

#[test]
fn device_reset_returns_power_on_values_and_a_cleanly_cycled_card() {
    let m = model("generic-emmc45");
    let (mut d, _) = brought_up(&m, Xfer::Adma64);
    let data = pattern(8, 8 * 512);
    assert!(write(&mut d, 77, &data).is_ok());
    assert!(
        !d.mmio.card().volatile_sectors().is_empty(),
        "in the card's cache"
    );
    d.mmio.reset();
    assert!(d.mmio.card().volatile_sectors().is_empty(), "written back");
    assert_eq!(d.mmio.card().state(), CardState::Idle);
    assert_eq!(d.readl(SDHCI_INT_ENABLE), 0);
    assert_eq!(d.readb(SDHCI_POWER_CONTROL), 0);
    assert_eq!(present(&mut d), EMBEDDED_CARD);
    assert_eq!(d.mmio.ios().power_mode, PowerMode::Off);
    // A new driver brings it up again and finds the data.
    let mmio = std::mem::replace(&mut d.mmio, controller(&m));
    let mut d = Driver::probe(mmio, Xfer::Adma32);
    mmc_init_card(&mut d, &HostCaps::for_model(&m.host)).unwrap();
    let mut back = vec![0u8; data.len()];
    assert!(read(&mut d, 77, &mut back).is_ok());
    assert_eq!(back, data);
}

/// Intel's eMMC controllers pulse RST_n with Power Control bit 4; the card acts on it only
/// once RST_n_FUNCTION is 1. Without the option the bit is reserved.
#[test]
fn power_control_bit_4_pulses_rst_n_where_the_controller_has_it() {
    let m = model("generic-emmc45");
    let (mut d, _) = brought_up(&m, Xfer::Adma64);
    let on = d.readb(SDHCI_POWER_CONTROL);
    d.writeb(on | SDHCI_POWER_RST_N, SDHCI_POWER_CONTROL);
    assert_eq!(d.readb(SDHCI_POWER_CONTROL), on, "reserved: reads 0");
    d.writeb(on, SDHCI_POWER_CONTROL);
    assert_eq!(d.mmio.card().state(), CardState::Tran);

    d.mmio.set_rst_n_in_power_control(true);
    let pulse = |d: &mut Driver| {
        d.writeb(on | SDHCI_POWER_RST_N, SDHCI_POWER_CONTROL);
        assert_eq!(d.readb(SDHCI_POWER_CONTROL), on | SDHCI_POWER_RST_N);
        d.writeb(on, SDHCI_POWER_CONTROL);
    };
    pulse(&mut d);
    assert_eq!(
        d.mmio.card().state(),
        CardState::Tran,
        "RST_n_FUNCTION 0: ignored"
    );
    assert!(d.send(6, (3 << 24) | (162 << 16) | (1 << 8)).is_ok());
    while d.mmio.card().busy_until().is_some_and(|t| t > d.mmio.now()) {
        let t = d.mmio.card().busy_until().unwrap();
        d.idle_to(t);
    }
    pulse(&mut d);
    assert_eq!(d.mmio.card().state(), CardState::Idle, "reset by RST_n");
    mmc_init_card(&mut d, &HostCaps::for_model(&m.host)).expect("up again");
}

// ---- hostile guests -------------------------------------------------------------------------

use emmc_host::sdhci::{adma2_attr, adma_err};

/// Set up an ADMA2 transfer of `blocks` 512-byte blocks at `lba` from the table at
/// `table` (64-bit descriptors), issue it with Auto CMD23, and run it to its end: the
/// status that ended it.
fn adma_by_hand(d: &mut Driver, read: bool, lba: u32, blocks: u16, table: u64) -> u32 {
    d.ack(0xFFFF_FFFF);
    d.writeb(
        SDHCI_CTRL_8BITBUS | SDHCI_CTRL_HISPD | SDHCI_CTRL_ADMA64,
        SDHCI_HOST_CONTROL,
    );
    d.set_ier(
        DEFAULT_IER | int(normal_int::DMA_INT) | err(error_int::ADMA_ERR | error_int::AUTO_CMD_ERR),
    );
    d.writel(table as u32, SDHCI_ADMA_ADDRESS);
    d.writel((table >> 32) as u32, SDHCI_ADMA_ADDRESS_HI);
    d.writew(sdhci_make_blksz(7, 512), SDHCI_BLOCK_SIZE);
    d.writew(blocks, SDHCI_BLOCK_COUNT);
    d.writel(u32::from(blocks), SDHCI_ARGUMENT2);
    let mut mode =
        SDHCI_TRNS_DMA | SDHCI_TRNS_BLK_CNT_EN | SDHCI_TRNS_MULTI | SDHCI_TRNS_AUTO_CMD23;
    if read {
        mode |= SDHCI_TRNS_READ;
    }
    issue(
        d,
        if read { 18 } else { 25 },
        lba,
        ResponseType::R1,
        true,
        mode,
    );
    until(d, "transfer end", |s| {
        s & (int(normal_int::TRANSFER_COMPLETE)
            | err(error_int::ADMA_ERR | error_int::DATA_TIMEOUT | error_int::DATA_CRC))
            != 0
    })
}

/// After an error: Linux's recovery (reset both lines, CMD12), and the card in tran.
fn recover(d: &mut Driver) {
    d.ack(0xFFFF_FFFF);
    d.reset(SDHCI_RESET_CMD);
    d.reset(SDHCI_RESET_DATA);
    d.wait_busy_until(None);
    if d.mmio.card().state() != CardState::Tran {
        d.send(12, 0).unwrap();
    }
    d.wait_busy_until(None);
    assert_eq!(d.mmio.card().state(), CardState::Tran);
}

#[test]
fn adma_descriptors_outside_memory_are_adma_errors_and_nothing_lands_outside() {
    let m = model("generic-emmc45");
    let (mut d, _) = brought_up(&m, Xfer::Adma64);
    let data = pattern(10, 8 * 512);
    assert!(write(&mut d, 600, &data).is_ok());
    let outside = MEM_BASE + MEM_SIZE as u64 + 0x1000;
    let refused = *d.mem.refused.borrow();
    d.mem.writes.borrow_mut().clear();
    // A read whose second descriptor points past the guest's memory.
    write_table(
        &d.mem,
        TABLE,
        true,
        &[
            (adma2_attr::TRAN_VALID, 2048, DATA),
            (adma2_attr::TRAN_VALID, 2048, outside),
            (adma2_attr::NOP_END_VALID, 0, 0),
        ],
    );
    let st = adma_by_hand(&mut d, true, 600, 8, TABLE);
    assert_ne!(st & err(error_int::ADMA_ERR), 0, "{st:#x}");
    assert_eq!(st & int(normal_int::TRANSFER_COMPLETE), 0);
    assert_eq!(d.readb(SDHCI_ADMA_ERROR), adma_err::ST_TFR);
    assert_eq!(
        d.readl(SDHCI_ADMA_ADDRESS),
        (TABLE + 24) as u32,
        "the next descriptor"
    );
    assert_eq!(
        d.mem.get(DATA, 2048),
        data[..2048],
        "what precedes the error moved"
    );
    assert!(*d.mem.refused.borrow() > refused);
    let inside =
        |&(a, n): &(u64, usize)| a >= MEM_BASE && a + n as u64 <= MEM_BASE + MEM_SIZE as u64;
    assert!(d.mem.writes.borrow().iter().all(inside));
    assert_eq!(
        present(&mut d) & SDHCI_DATA_INHIBIT,
        0,
        "the DAT phase ended"
    );
    recover(&mut d);

    // The table itself outside memory: ST_FDS at the table's address.
    let st = adma_by_hand(&mut d, true, 600, 8, outside);
    assert_ne!(st & err(error_int::ADMA_ERR), 0);
    assert_eq!(d.readb(SDHCI_ADMA_ERROR), adma_err::ST_FDS);
    assert_eq!(d.readl(SDHCI_ADMA_ADDRESS), outside as u32);
    assert_eq!(d.readl(SDHCI_ADMA_ADDRESS_HI), (outside >> 32) as u32);
    recover(&mut d);

    // A write whose third descriptor is not Valid: the first two blocks reach the card,
    // then the ADMA error; the guest's CMD12 ends the write.
    d.mem.put(DATA, &pattern(11, 8 * 512));
    write_table(
        &d.mem,
        TABLE,
        true,
        &[
            (adma2_attr::TRAN_VALID, 512, DATA),
            (adma2_attr::TRAN_VALID, 512, DATA + 512),
            (adma2_attr::ACT_TRAN, 3072, DATA + 1024),
            (adma2_attr::NOP_END_VALID, 0, 0),
        ],
    );
    let st = adma_by_hand(&mut d, false, 600, 8, TABLE);
    assert_ne!(st & err(error_int::ADMA_ERR), 0);
    assert_eq!(d.readb(SDHCI_ADMA_ERROR), adma_err::ST_FDS);
    assert_eq!(d.readl(SDHCI_ADMA_ADDRESS), (TABLE + 24) as u32);
    assert_eq!(
        d.mmio.card().state(),
        CardState::Rcv,
        "waiting for the rest"
    );
    recover(&mut d);
    let mut expect = pattern(11, 1024);
    expect.extend_from_slice(&data[1024..]);
    assert!(
        peek(&mut d, 600, 8) == expect,
        "two blocks written, the rest as it was"
    );
    // A write from memory outside: nothing of it reaches the card.
    write_table(
        &d.mem,
        TABLE,
        true,
        &[(adma2_attr::TRAN_VALID | adma2_attr::END, 4096, outside)],
    );
    let st = adma_by_hand(&mut d, false, 600, 8, TABLE);
    assert_ne!(st & err(error_int::ADMA_ERR), 0);
    assert_eq!(d.readb(SDHCI_ADMA_ERROR), adma_err::ST_TFR);
    recover(&mut d);
    assert!(peek(&mut d, 600, 8) == expect);
}

#[test]
fn garbage_and_empty_descriptor_tables_end_in_errors_not_hangs() {
    let m = model("generic-emmc45");
    let (mut d, _) = brought_up(&m, Xfer::Adma64);
    let data = pattern(12, 8 * 512);
    assert!(write(&mut d, 700, &data).is_ok());
    // Only the End: a length mismatch.
    write_table(&d.mem, TABLE, true, &[(adma2_attr::NOP_END_VALID, 0, 0)]);
    let st = adma_by_hand(&mut d, true, 700, 8, TABLE);
    assert_ne!(st & err(error_int::ADMA_ERR), 0);
    assert_eq!(
        d.readb(SDHCI_ADMA_ERROR),
        adma_err::LENGTH_MISMATCH | adma_err::ST_TFR
    );
    recover(&mut d);
    // Longer than the transfer: a length mismatch too, once the data has moved.
    write_table(
        &d.mem,
        TABLE,
        true,
        &[(adma2_attr::TRAN_VALID | adma2_attr::END, 8192, DATA)],
    );
    let st = adma_by_hand(&mut d, true, 700, 8, TABLE);
    assert_ne!(st & err(error_int::ADMA_ERR), 0);
    assert_eq!(d.mem.get(DATA, 4096), data);
    recover(&mut d);
    // A Link to itself: the engine gives up.
    write_table(
        &d.mem,
        TABLE,
        true,
        &[(adma2_attr::ACT_LINK | adma2_attr::VALID, 0, TABLE)],
    );
    let st = adma_by_hand(&mut d, false, 700, 8, TABLE);
    assert_ne!(st & err(error_int::ADMA_ERR), 0);
    assert_eq!(d.readb(SDHCI_ADMA_ERROR), adma_err::ST_FDS);
    recover(&mut d);
    // Random tables: every transfer ends, in Transfer Complete or an error.
    let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
    let mut rand = move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    for round in 0..200 {
        let mut garbage = vec![0u8; 256];
        for b in garbage.iter_mut() {
            *b = rand() as u8;
        }
        // Addresses pointing into memory half of the time.
        for i in 0..(256 / 12) {
            if rand() % 2 == 0 {
                let a = MEM_BASE + rand() % (MEM_SIZE as u64);
                garbage[i * 12 + 4..i * 12 + 12].copy_from_slice(&a.to_le_bytes());
            }
        }
        d.mem.put(TABLE, &garbage);
        let read = round % 2 == 0;
        let st = adma_by_hand(&mut d, read, 800, 8, TABLE);
        assert_ne!(st, 0, "round {round}");
        recover(&mut d);
    }
    let _ = status(&mut d);
    let mut back = vec![0u8; data.len()];
    assert!(read(&mut d, 700, &mut back).is_ok());
    assert_eq!(back, data, "the card and the controller still work");
}

#[test]
fn a_block_count_of_0_or_a_block_size_beyond_the_maximum_moves_nothing() {
    let m = model("generic-emmc45");
    let (mut d, _) = brought_up(&m, Xfer::Adma64);
    d.mem.writes.borrow_mut().clear();
    write_table(
        &d.mem,
        TABLE,
        true,
        &[(adma2_attr::TRAN_VALID | adma2_attr::END, 4096, DATA)],
    );
    for (blksz, count) in [(512u16, 0u16), (0, 8), (4000, 1)] {
        d.ack(0xFFFF_FFFF);
        d.writel(TABLE as u32, SDHCI_ADMA_ADDRESS);
        d.writew(sdhci_make_blksz(7, blksz), SDHCI_BLOCK_SIZE);
        d.writew(count, SDHCI_BLOCK_COUNT);
        let mode = SDHCI_TRNS_DMA | SDHCI_TRNS_BLK_CNT_EN | SDHCI_TRNS_MULTI | SDHCI_TRNS_READ;
        let start = d.now;
        issue(&mut d, 18, 0, ResponseType::R1, true, mode);
        let st = until(&mut d, "end", |s| {
            s & int(normal_int::TRANSFER_COMPLETE) != 0
        });
        let short = emmc_card::timing::Bus::new(52_000_000, 8, false)
            .command_ns(emmc_card::timing::bus::ResponseLength::Short);
        assert_eq!(
            d.now,
            start + short,
            "{blksz}×{count}: right after the response"
        );
        assert_eq!(st & 0xFFFF_0000, 0);
        assert!(d.mem.writes.borrow().is_empty(), "{blksz}×{count}");
        recover(&mut d);
    }
}

#[test]
fn odd_unaligned_and_reserved_accesses() {
    let m = model("generic-emmc45");
    let mut d = probed(&m, Xfer::Adma64);
    powered(&mut d);
    // Sizes other than 1, 2, 4, 8 and accesses past 0xFF: 0 and no effect.
    for (off, len) in [
        (0x24u64, 3usize),
        (0x40, 16),
        (0xFE, 4),
        (0xFF, 2),
        (0x100, 1),
        (u64::MAX, 4),
    ] {
        let mut buf = vec![0xAAu8; len];
        d.read_bytes(off, &mut buf);
        assert!(buf.iter().all(|&b| b == 0), "{off:#x}+{len}");
    }
    d.write_bytes(0xFE, &[0xFF; 4]);
    d.write_bytes(0x28, &[0xFF; 3]);
    assert_eq!(d.readb(SDHCI_HOST_CONTROL), 0, "a 3-byte write is ignored");
    // Any alignment: byte lanes of the registers they cover.
    let mut q = [0u8; 8];
    d.read_bytes(SDHCI_CAPABILITIES, &mut q);
    assert_eq!(
        u64::from_le_bytes(q),
        u64::from(d.caps1) << 32 | u64::from(d.caps)
    );
    let mut w = [0u8; 2];
    d.read_bytes(SDHCI_CAPABILITIES + 1, &mut w);
    assert_eq!(u16::from_le_bytes(w), (d.caps >> 8) as u16);
    d.writel(0x1234_5678, SDHCI_ARGUMENT);
    d.write_bytes(SDHCI_ARGUMENT + 1, &[0xAB, 0xCD]);
    assert_eq!(d.readl(SDHCI_ARGUMENT), 0x12CD_AB78);
    let mut w = [0u8; 4];
    d.read_bytes(SDHCI_ARGUMENT + 2, &mut w);
    assert_eq!(w, [0xCD, 0x12, 0, 0]);
    // Reserved registers and bits read 0 and keep nothing.
    for off in [0x4Cu64, 0x70, 0x80, 0xE0, 0xF0] {
        d.writel(0xFFFF_FFFF, off);
        assert_eq!(d.readl(off), 0, "{off:#x}");
    }
    d.writew(0xFFFF, 0x56);
    assert_eq!(d.readw(0x56), 0);
    d.writeb(0xFF, 0x55);
    assert_eq!(d.readb(0x55), 0);
    d.writew(0xFFFF, SDHCI_TRANSFER_MODE);
    assert_eq!(d.readw(SDHCI_TRANSFER_MODE), SDHCI_TRNS_MASK);
    d.writew(0, SDHCI_TRANSFER_MODE);
    d.writew(0xFFFF, SDHCI_BLOCK_SIZE);
    assert_eq!(d.readw(SDHCI_BLOCK_SIZE), 0x7FFF);
    d.writew(0xFFFF, SDHCI_HOST_CONTROL2);
    assert_eq!(
        d.readw(SDHCI_HOST_CONTROL2),
        0xC07F,
        "v4 bits and Sampling Clock Select"
    );
    d.writew(0, SDHCI_HOST_CONTROL2);
    d.writel(0xFFFF_FFFF, SDHCI_INT_ENABLE);
    assert_eq!(d.readl(SDHCI_INT_ENABLE), 0x07FF_11FF);
    d.writel(DEFAULT_IER, SDHCI_INT_ENABLE);
    // A dword write at 0x0C: Transfer Mode, then the command it issues.
    d.writel(0, SDHCI_ARGUMENT);
    let cmd0 = u32::from(sdhci_make_cmd(0, 0)) << 16;
    d.writel(cmd0, SDHCI_TRANSFER_MODE);
    let st = until(&mut d, "CMD0", |s| s & int(normal_int::CMD_COMPLETE) != 0);
    // The interrupt status as one dword, acknowledged as one.
    d.ack(st);
    assert_eq!(d.readl(SDHCI_INT_STATUS), 0);
    // The Error Interrupt bit is read-only: forced errors set it, clearing it alone
    // does nothing.
    d.writew(error_int::DATA_CRC, SDHCI_SET_INT_ERROR);
    let st = d.readl(SDHCI_INT_STATUS);
    assert_eq!(st, int(normal_int::ERROR_INT) | err(error_int::DATA_CRC));
    d.writew(normal_int::ERROR_INT, SDHCI_INT_STATUS);
    assert_eq!(d.readl(SDHCI_INT_STATUS), st);
    d.ack(err(error_int::DATA_CRC));
    assert_eq!(d.readl(SDHCI_INT_STATUS), 0);
    // Force Event for Auto CMD errors.
    d.set_ier(DEFAULT_IER | INT_AUTO_CMD);
    d.writew(0x9F, SDHCI_SET_ACMD12_ERROR);
    assert_eq!(d.readw(SDHCI_AUTO_CMD_STATUS), 0x9F);
    assert_ne!(d.readl(SDHCI_INT_STATUS) & INT_AUTO_CMD, 0);
    assert!(d.mmio.irq_asserted());
    assert_eq!(d.readw(SDHCI_SLOT_INT_STATUS), 1);
    // The buffer port with no transfer: 0, and writes go nowhere.
    assert_eq!(d.readl(SDHCI_BUFFER), 0);
    d.writel(0xDEAD_BEEF, SDHCI_BUFFER);
    // An unsupported voltage keeps the bus off.
    d.writeb(SDHCI_POWER_300 | SDHCI_POWER_ON, SDHCI_POWER_CONTROL);
    assert_eq!(d.readb(SDHCI_POWER_CONTROL), SDHCI_POWER_300);
    assert_eq!(d.mmio.ios().power_mode, PowerMode::Off);
}

#[test]
fn a_guest_that_never_acknowledges_interrupts_keeps_working() {
    let m = model("generic-emmc45");
    let (mut d, _) = brought_up(&m, Xfer::Adma64);
    let data = pattern(13, 4 * 512);
    d.mem.put(DATA, &data);
    // Writes from DATA, reads to elsewhere.
    write_table(
        &d.mem,
        TABLE,
        true,
        &[(adma2_attr::TRAN_VALID | adma2_attr::END, 2048, DATA)],
    );
    let read_table = TABLE + 0x100;
    write_table(
        &d.mem,
        read_table,
        true,
        &[(
            adma2_attr::TRAN_VALID | adma2_attr::END,
            2048,
            DATA + 0x1_0000,
        )],
    );
    d.ack(0xFFFF_FFFF);
    let size = format!("{:?}", d.mmio).len();
    for i in 0..300u32 {
        // Commands and transfers one after the other, watching only the inhibits.
        d.wait_busy_until(None);
        let p = present(&mut d);
        assert_eq!(p & (SDHCI_CMD_INHIBIT | SDHCI_DATA_INHIBIT), 0, "round {i}");
        if i % 3 == 0 {
            issue(&mut d, 13, RCA, ResponseType::R1, false, 0);
        } else {
            let read = i % 3 == 1;
            let table = if read { read_table } else { TABLE };
            d.writel(table as u32, SDHCI_ADMA_ADDRESS);
            d.writew(sdhci_make_blksz(7, 512), SDHCI_BLOCK_SIZE);
            d.writew(4, SDHCI_BLOCK_COUNT);
            d.writel(4, SDHCI_ARGUMENT2);
            let mut mode =
                SDHCI_TRNS_DMA | SDHCI_TRNS_BLK_CNT_EN | SDHCI_TRNS_MULTI | SDHCI_TRNS_AUTO_CMD23;
            if read {
                mode |= SDHCI_TRNS_READ;
            }
            issue(
                &mut d,
                if read { 18 } else { 25 },
                900,
                ResponseType::R1,
                true,
                mode,
            );
        }
        while present(&mut d) & (SDHCI_CMD_INHIBIT | SDHCI_DATA_INHIBIT) != 0 {
            assert!(d.step(), "round {i} stuck");
        }
        assert!(d.mmio.irq_asserted());
    }
    let st = d.readl(SDHCI_INT_STATUS);
    assert_eq!(
        st,
        int(normal_int::CMD_COMPLETE | normal_int::TRANSFER_COMPLETE),
        "the same bits, set once"
    );
    assert!(format!("{:?}", d.mmio).len() <= size + 64, "no growth");
    assert!(peek(&mut d, 900, 4) == data);
    assert!(
        d.mem.get(DATA + 0x1_0000, 2048) == data,
        "the reads brought it back"
    );
    assert_eq!(d.mmio.card().state(), CardState::Tran);
}

#[test]
fn a_command_written_while_command_inhibit_is_set_is_ignored() {
    let m = constant_model(|c| c.switch_ns = 5_000_000);
    let (mut d, _) = brought_up(&m, Xfer::Adma64);
    d.ack(0xFFFF_FFFF);
    let before = d.mmio.card().stats().commands;
    issue(&mut d, 13, RCA, ResponseType::R1, false, 0);
    // A second command at the same instant: the CMD line is busy.
    issue(&mut d, 7, 0, ResponseType::None, false, 0);
    let st = until(&mut d, "CMD13", |s| s & int(normal_int::CMD_COMPLETE) != 0);
    assert_eq!(st, int(normal_int::CMD_COMPLETE));
    assert_eq!(d.mmio.card().stats().commands, before + 1);
    assert_eq!(
        d.mmio.card().state(),
        CardState::Tran,
        "CMD7 never reached the card"
    );
    assert_eq!(d.readl(SDHCI_RESPONSE) & 0x1E00, 4 << 9, "CMD13's response");
    d.ack(st);
    // While an R1b busy holds the DAT line, a data command is not issued, a CMD13 is.
    let arg = 0x0300_0000 | (emmc_card::ext_csd::ERASE_GROUP_DEF as u32) << 16 | 1 << 8;
    issue(&mut d, 6, arg, ResponseType::R1b, false, 0);
    until(&mut d, "CMD6", |s| s & int(normal_int::CMD_COMPLETE) != 0);
    d.ack(int(normal_int::CMD_COMPLETE));
    let before = d.mmio.card().stats().commands;
    d.writew(sdhci_make_blksz(7, 512), SDHCI_BLOCK_SIZE);
    issue(&mut d, 17, 0, ResponseType::R1, true, SDHCI_TRNS_READ);
    assert_eq!(d.mmio.card().stats().commands, before, "CMD17 refused");
    issue(&mut d, 13, RCA, ResponseType::R1, false, 0);
    until(&mut d, "CMD13 during busy", |s| {
        s & int(normal_int::CMD_COMPLETE) != 0
    });
    assert_eq!(d.readl(SDHCI_RESPONSE) & 0x1E00, 7 << 9, "prg");
    until(&mut d, "busy end", |s| {
        s & int(normal_int::TRANSFER_COMPLETE) != 0
    });
}

#[test]
fn sd_and_sdio_probing_commands_time_out() {
    let m = model("generic-emmc45");
    let mut d = probed(&m, Xfer::Adma64);
    powered(&mut d);
    d.send(0, 0).unwrap();
    // mmc_rescan's order: SDIO (CMD5), SD (CMD8, CMD55 + ACMD41), then MMC (CMD1).
    let mut st = Default::default();
    for cmd in [
        MmcCommand::new(5, 0, ResponseType::R4),
        MmcCommand::new(8, 0x1AA, ResponseType::R1),
        MmcCommand::new(55, 0, ResponseType::R1),
        MmcCommand::new(41, 0, ResponseType::R3),
    ] {
        let o = d.command(&cmd, &mut st);
        assert_eq!(o.error, Some(SdhciError::CmdTimeout), "CMD{}", cmd.opcode);
    }
    assert_ne!(st.error & error_int::CMD_TIMEOUT, 0);
    assert_eq!(d.mmio.card().state(), CardState::Idle);
    assert_ne!(d.send(1, 0).unwrap()[0], 0, "an eMMC answers CMD1");
}

#[test]
fn no_clock_or_no_power_means_command_timeouts() {
    let m = model("generic-emmc45");
    let (mut d, _) = brought_up(&m, Xfer::Adma64);
    let clk = d.readw(SDHCI_CLOCK_CONTROL);
    d.writew(clk & !SDHCI_CLOCK_CARD_EN, SDHCI_CLOCK_CONTROL);
    let t = d.now;
    let before = d.mmio.card().stats().commands;
    assert_eq!(d.send(13, RCA).err(), Some(SdhciError::CmdTimeout));
    assert_eq!((d.now, d.mmio.card().stats().commands), (t, before));
    d.writew(clk, SDHCI_CLOCK_CONTROL);
    assert!(d.send(13, RCA).is_ok());
    // Power off: commands time out at once; the card loses power once the supply has
    // been off for the power-off time; power on brings it back to idle.
    let on = d.readb(SDHCI_POWER_CONTROL);
    d.writeb(0, SDHCI_POWER_CONTROL);
    let off_at = d.mmio.now();
    assert_eq!(
        d.mmio.next_event(),
        Some(off_at + MIN_POWER_OFF_NS),
        "the supply's end is an event of its own"
    );
    assert_eq!(d.send(13, RCA).err(), Some(SdhciError::CmdTimeout));
    d.idle_to(off_at + MIN_POWER_OFF_NS);
    assert_eq!(d.mmio.card().state(), CardState::Ina);
    d.writeb(on, SDHCI_POWER_CONTROL);
    assert_eq!(d.mmio.card().state(), CardState::Idle);
}

/// Linux clears Power Control before every new power setting, and a runtime resume
/// resets all and sets the power again: a supply off for less than the power-off time
/// leaves the card where it was.
#[test]
fn a_power_glitch_shorter_than_the_power_off_time_keeps_the_card_selected() {
    let m = model("generic-emmc45");
    let (mut d, _) = brought_up(&m, Xfer::Adma64);
    let data = pattern(4, 8 * 512);
    assert!(write(&mut d, 900, &data).is_ok());
    let on = d.readb(SDHCI_POWER_CONTROL);
    d.writeb(0, SDHCI_POWER_CONTROL);
    let t = d.mmio.now() + MIN_POWER_OFF_NS / 2;
    d.idle_to(t);
    d.writeb(on, SDHCI_POWER_CONTROL);
    d.idle_to(t + 10 * MIN_POWER_OFF_NS);
    assert_eq!(d.mmio.card().state(), CardState::Tran, "never lost power");
    assert!(
        !d.mmio.card().volatile_sectors().is_empty(),
        "the cache is still there"
    );
    let mut back = vec![0u8; data.len()];
    assert!(read(&mut d, 900, &mut back).is_ok());
    assert_eq!(back, data);
    // Off for the whole power-off time: the cache is gone with the power.
    d.writeb(0, SDHCI_POWER_CONTROL);
    let t = d.mmio.now() + MIN_POWER_OFF_NS;
    d.idle_to(t);
    assert_eq!(d.mmio.card().state(), CardState::Ina);
    assert!(d.mmio.card().volatile_sectors().is_empty());
}

#[test]
fn stopping_the_clock_in_the_middle_of_a_pio_write_times_out() {
    let m = model("generic-emmc45");
    let (mut d, _) = brought_up(&m, Xfer::Pio);
    d.set_ier(DEFAULT_IER | int(normal_int::BUF_WRITE_READY));
    d.writew(sdhci_make_blksz(7, 512), SDHCI_BLOCK_SIZE);
    d.writew(2, SDHCI_BLOCK_COUNT);
    d.writel(2, SDHCI_ARGUMENT2);
    let mode = SDHCI_TRNS_BLK_CNT_EN | SDHCI_TRNS_MULTI | SDHCI_TRNS_AUTO_CMD23;
    issue(&mut d, 25, 50, ResponseType::R1, true, mode);
    let st = until(&mut d, "space", |s| {
        s & int(normal_int::BUF_WRITE_READY) != 0
    });
    d.ack(st);
    for _ in 0..128 {
        d.writel(0x5A5A_5A5A, SDHCI_BUFFER);
    }
    until(&mut d, "space again", |s| {
        s & int(normal_int::BUF_WRITE_READY) != 0
    });
    let clk = d.readw(SDHCI_CLOCK_CONTROL);
    d.writew(clk & !SDHCI_CLOCK_CARD_EN, SDHCI_CLOCK_CONTROL);
    let card_now = d.mmio.card().now();
    for _ in 0..128 {
        d.writel(0xA5A5_A5A5, SDHCI_BUFFER);
    }
    let st = until(&mut d, "time-out", |s| {
        s & err(error_int::DATA_TIMEOUT) != 0
    });
    assert_eq!(st & int(normal_int::TRANSFER_COMPLETE), 0);
    assert!(
        d.mmio.card().now() < card_now + 10_000_000_000,
        "the card's time is sane"
    );
    d.writew(clk, SDHCI_CLOCK_CONTROL);
    recover(&mut d);
    assert!(d.send(13, RCA).is_ok());
}

// ---- time -----------------------------------------------------------------------------------

/// CMD23 + `opcode` (CMD25 or CMD18) at sector 4000 over `sg`, as mmc_block sends it.
fn closed<'a, S: emmc_host::sdhci::DmaSegment>(
    opcode: u8,
    blocks: u32,
    sg: &'a mut [S],
) -> MmcRequest<'a, S> {
    let (data, stop) = if opcode == 25 {
        (
            MmcData::write(512, blocks, sg),
            MmcCommand::new(12, 0, ResponseType::R1b),
        )
    } else {
        (MmcData::read(512, blocks, sg), r1(12, 0))
    };
    MmcRequest {
        sbc: Some(r1(23, blocks)),
        cmd: r1(opcode, 4000),
        data: Some(data),
        stop: Some(stop),
    }
}

/// A plain multi-block write and read cost the same card time through the registers as
/// through the request-level model (which charges no request overhead here), from the
/// command's issue to Transfer Complete.
#[test]
fn multi_block_transfers_cost_what_the_request_level_model_charges() {
    let mut m = constant_model(|c| {
        c.read_access_ns = 150_000;
        c.read_block_ns = 20_000;
        c.program_command_ns = 1_000_000;
        c.program_block_ns = 50_000;
    });
    m.ext_csd.cache_size = 0;
    let caps = HostCaps::for_model(&m.host);
    let mut reference = emmc_host::mmc::MmcHost::with_config(card(&m), SdhciConfig::default());
    reference.mmc_init_card(&caps).unwrap();
    for xfer in [Xfer::Adma32, Xfer::Adma64] {
        let (mut d, _) = brought_up(&m, xfer);
        for blocks in [2u32, 16, 128] {
            let data = pattern(blocks as u8, blocks as usize * 512);
            let mut sg = [&data[..]];
            let want = reference.mmc_wait_for_req(closed(25, blocks, &mut sg));
            assert!(want.is_ok());
            let mut sg = [&data[..]];
            let got = d.request(closed(25, blocks, &mut sg));
            assert!(got.is_ok());
            assert_eq!(
                got.end_ns - d.issued_at,
                want.duration_ns(),
                "{xfer:?} write of {blocks} blocks"
            );
            let mut back = vec![0u8; data.len()];
            let mut sg = [&mut back[..]];
            let want = reference.mmc_wait_for_req(closed(18, blocks, &mut sg));
            let mut back2 = vec![0u8; data.len()];
            let mut sg = [&mut back2[..]];
            let got = d.request(closed(18, blocks, &mut sg));
            assert!(got.is_ok() && want.is_ok());
            assert_eq!(
                got.end_ns - d.issued_at,
                want.duration_ns(),
                "{xfer:?} read of {blocks} blocks"
            );
            assert_eq!(back, data);
            assert_eq!(back2, data);
        }
    }
}

// ---- the command log ------------------------------------------------------------------------

#[derive(Clone, Default)]
struct Shared(std::sync::Arc<std::sync::Mutex<Vec<u8>>>);

impl std::io::Write for Shared {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[test]
fn the_command_log_records_register_level_commands() {
    let m = model("generic-emmc45");
    let (mut d, _) = brought_up(&m, Xfer::Adma64);
    let out = Shared::default();
    let log = emmc_host::cmdlog::CmdLog::new(Box::new(out.clone()), 0, "test").unwrap();
    d.mmio.set_cmd_log(Some(log));
    assert!(write(&mut d, 10, &pattern(1, 16 * 512)).is_ok());
    let _ = status(&mut d);
    d.mmio.flush_cmd_log();
    let text = String::from_utf8(out.0.lock().unwrap().clone()).unwrap();
    let lines: Vec<&str> = text.lines().filter(|l| !l.starts_with('#')).collect();
    assert_eq!(lines.len(), 3, "{text}");
    assert!(
        lines[0].contains("CMD23") && lines[0].contains("auto"),
        "{text}"
    );
    assert!(
        lines[1].contains("CMD25") && lines[1].contains("data=write:16x512"),
        "{text}"
    );
    assert!(lines[2].contains("CMD13"), "{text}");
}

// ---- the block driver on top ----------------------------------------------------------------

use emmc_host::blkdrv::{Advance, BkopsPolicy, BlkConfig, BlkData, MmcBlk};
use emmc_host::packing::{BlkOp, BlkRequest, PackingMode};
use std::collections::HashMap;

/// Each request's data, by id (first sector, bytes).
#[derive(Default)]
struct Buffers(HashMap<u64, (u64, Vec<u8>)>);

impl Buffers {
    fn range(&mut self, req: &BlkRequest, lba: u64, len: usize) -> &mut [u8] {
        let (first, buf) = self.0.get_mut(&req.id).expect("a known request");
        let at = (lba - *first) as usize * 512;
        &mut buf[at..at + len]
    }
}

impl BlkData for Buffers {
    fn write_data(&mut self, req: &BlkRequest, lba: u64, buf: &mut [u8]) {
        buf.copy_from_slice(self.range(req, lba, buf.len()));
    }
    fn read_data(&mut self, req: &BlkRequest, lba: u64, buf: &[u8]) {
        self.range(req, lba, buf.len()).copy_from_slice(buf);
    }
}

fn drain(b: &mut MmcBlk<Driver, Buffers>) -> Vec<emmc_host::blkdrv::BlkCompletion> {
    let mut all = Vec::new();
    for _ in 0..100_000 {
        let s = b.advance(emmc_card::timing::Nanos::MAX);
        all.extend(b.take_completions());
        if s == Advance::Idle {
            return all;
        }
    }
    panic!("the block driver never went idle");
}

/// Linux's MMC block driver model (packing, packed reads, CMD23, flush, discard) runs
/// its requests through the registers.
#[test]
fn the_block_driver_runs_on_the_register_level_controller() {
    let m = model("generic-emmc45");
    let cfg = BlkConfig {
        packing: PackingMode::Always,
        packed_reads: true,
        merge: false,
        bkops: BkopsPolicy {
            enabled: false,
            ..Default::default()
        },
        ..BlkConfig::for_model(&m.host)
    };
    let mut b = MmcBlk::probe_with_data(probed(&m, Xfer::Adma64), cfg, Buffers::default()).unwrap();
    let layout: Vec<(u64, u64, u32)> = (0..16u64).map(|i| (i + 1, 8192 + i * 24, 8)).collect();
    for &(id, lba, n) in &layout {
        b.data_mut()
            .0
            .insert(id, (lba, pattern(id as u8, n as usize * 512)));
        b.submit(BlkRequest::new(id, BlkOp::Write, lba, n), 0);
    }
    let done = drain(&mut b);
    assert!(done.iter().all(|c| c.result.is_ok()), "{done:?}");
    assert!(b.stats().packed_writes > 0, "writes were packed");
    assert!(
        !b.host().mmio.card().volatile_sectors().is_empty(),
        "the writes sit in the cache"
    );
    b.submit(BlkRequest::new(50, BlkOp::Flush, 0, 0), b.now());
    assert!(drain(&mut b).iter().all(|c| c.result.is_ok()));
    assert!(
        b.host().mmio.card().volatile_sectors().is_empty(),
        "flushed"
    );
    let now = b.now();
    for &(id, lba, n) in &layout {
        b.data_mut()
            .0
            .insert(100 + id, (lba, vec![0; n as usize * 512]));
        b.submit(BlkRequest::new(100 + id, BlkOp::Read, lba, n), now);
    }
    assert!(drain(&mut b).iter().all(|c| c.result.is_ok()));
    assert!(b.stats().packed_reads > 0, "reads were packed");
    for &(id, _, n) in &layout {
        assert!(
            b.data().0[&(100 + id)].1 == pattern(id as u8, n as usize * 512),
            "request {id}"
        );
    }
}
