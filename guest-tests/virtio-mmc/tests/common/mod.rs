//! Scenarios written against any virtio-mmc transport: the daemon's socket
//! (`tests/socket.rs`) and the in-process device (`tests/loopback.rs`) run the same ones.
//! Raw requests are built here field by field; the MMC core of the main crate brings the
//! card up.
#![allow(dead_code)]

use emmc_card::ext_csd as ext;
use emmc_card::model::DeviceModel;
use emmc_card::packed::{Direction, Entry, Header};
use emmc_card::r1;
use emmc_frontend::mmc::proto::*;
use emmc_host::blkdrv::{BlkConfig, HpiPolicy};
use emmc_host::iosched::Elevator;
use emmc_host::mmc::{mmc_init_card, r1_state, MmcCard, MmcHostOps};
use emmc_host::packing::{BlkOp, PackingMode};
use emmc_host::sdhci::PowerMode;
use emmc_test_support::rpmb::{
    be16, frame, mac_over as mac, ADDRESS, BLOCK_COUNT, COUNTER, DATA, KEY_MAC, NONCE, REQ_RESP,
    RESULT,
};
use virtio_mmc_driver::host::UNTOUCHED;
use virtio_mmc_driver::{RawData, RawDesc, RawResponse, Transport, VirtioMmcBlk, VirtioMmcHost};
use vm_memory::ByteValued;

pub const RCA_ARG: u32 = 1 << 16;
/// CURRENT_STATE numbers.
pub const TRAN: u32 = 4;
pub const PRG: u32 = 7;

pub fn model(name: &str) -> DeviceModel {
    DeviceModel::load(name).expect("model loads")
}

/// `name` as the simulator must run it to stand for this driver: the driver is the host,
/// so the measuring host's software time (request overhead, preparation) is not charged
/// in card time, as the mmc transport does not charge it (`HostProfile::controller_only`).
pub fn real_driver_model(name: &str) -> DeviceModel {
    let m = model(name);
    DeviceModel {
        host: m.host.controller_only(),
        ..m
    }
}

pub fn cmd(opcode: u8, resp_type: u8, arg: u32) -> VirtioMmcCmd {
    VirtioMmcCmd {
        opcode,
        resp_type,
        flags: if resp_type == RESP_R1B { CMD_F_BUSY } else { 0 },
        arg,
        ..Default::default()
    }
}

/// A request header of one command without data.
pub fn hdr(c: VirtioMmcCmd) -> VirtioMmcReqHdr {
    VirtioMmcReqHdr {
        cmd: c,
        ..Default::default()
    }
}

pub fn send<T: Transport>(h: &mut VirtioMmcHost<T>, opcode: u8, rt: u8, arg: u32) -> RawResponse {
    h.raw_request(&hdr(cmd(opcode, rt, arg)), RawData::None)
        .expect("transport")
}

/// CMD13's R1.
pub fn status<T: Transport>(h: &mut VirtioMmcHost<T>) -> u32 {
    let r = send(h, 13, RESP_R1, RCA_ARG);
    assert_eq!(r.resp.status, STATUS_OK);
    assert_eq!(r.resp.cmd.error, ERR_NONE, "CMD13 answered");
    r.r1()
}

/// CMD6 write-byte as R1b (the device waits for the busy); its R1, then CMD13's.
pub fn switch<T: Transport>(h: &mut VirtioMmcHost<T>, index: usize, value: u8) -> (u32, u32) {
    let arg = 0x0300_0000 | (index as u32) << 16 | u32::from(value) << 8;
    let r = send(h, 6, RESP_R1B, arg);
    assert_eq!(r.resp.status, STATUS_OK);
    (r.r1(), status(h))
}

pub fn ext_csd<T: Transport>(h: &mut VirtioMmcHost<T>) -> [u8; 512] {
    let hd = VirtioMmcReqHdr {
        flags: REQ_F_DATA,
        blksz: 512,
        blocks: 1,
        ..hdr(cmd(8, RESP_R1, 0))
    };
    let r = h
        .raw_request(&hd, RawData::Read(&[512]))
        .expect("transport");
    assert_eq!(r.resp.status, STATUS_OK);
    assert_eq!(r.resp.data_error, ERR_NONE);
    r.bytes().try_into().expect("512 bytes")
}

/// CMD23(blocks | flags) + CMD25 + data, run to the end of programming.
pub fn write_blocks<T: Transport>(
    h: &mut VirtioMmcHost<T>,
    addr: u32,
    data: &[u8],
    cmd23_flags: u32,
) -> RawResponse {
    let blocks = (data.len() / 512) as u32;
    let hd = VirtioMmcReqHdr {
        flags: REQ_F_SBC | REQ_F_DATA | REQ_F_WRITE,
        sbc: cmd(23, RESP_R1, blocks | cmd23_flags),
        blksz: 512,
        blocks,
        ..hdr(cmd(25, RESP_R1, addr))
    };
    let segs = segments(h, data);
    let r = h
        .raw_request(&hd, RawData::Write(&segs))
        .expect("transport");
    assert_eq!(r.resp.status, STATUS_OK, "write accepted by the device");
    r
}

/// CMD23(blocks) + CMD18.
pub fn read_blocks<T: Transport>(h: &mut VirtioMmcHost<T>, addr: u32, blocks: u32) -> RawResponse {
    let hd = VirtioMmcReqHdr {
        flags: REQ_F_SBC | REQ_F_DATA,
        sbc: cmd(23, RESP_R1, blocks),
        blksz: 512,
        blocks,
        ..hdr(cmd(18, RESP_R1, addr))
    };
    let n = blocks as usize * 512;
    let max = h.config().max_seg_size as usize;
    let lens: Vec<usize> = (0..n).step_by(max).map(|at| max.min(n - at)).collect();
    let r = h.raw_request(&hd, RawData::Read(&lens)).expect("transport");
    assert_eq!(r.resp.status, STATUS_OK);
    r
}

/// `data` cut into buffers of the device's largest segment.
pub fn segments<'a, T: Transport>(h: &VirtioMmcHost<T>, data: &'a [u8]) -> Vec<&'a [u8]> {
    data.chunks(h.config().max_seg_size as usize).collect()
}

pub fn pattern(tag: u8, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| tag ^ (i as u8).wrapping_mul(31) ^ (i >> 9) as u8)
        .collect()
}

/// The card brought up by the MMC core (Linux's `mmc_init_card`) with the host's caps.
pub fn init<T: Transport>(h: &mut VirtioMmcHost<T>) -> MmcCard {
    let caps = h.host_caps();
    let card = mmc_init_card(h, &caps).expect("bring-up");
    assert_eq!(r1_state(status(h)), TRAN);
    card
}

fn select<T: Transport>(h: &mut VirtioMmcHost<T>, access: u8) -> (u32, u32) {
    let cfg = ext_csd(h)[ext::PARTITION_CONFIG];
    switch(h, ext::PARTITION_CONFIG, (cfg & !7) | access)
}

// ---- scenarios ------------------------------------------------------------------------

/// Bring-up through the block driver reaches tran with the EXT_CSD an in-process bring-up
/// of the same model reads, and the model's geometry.
pub fn bring_up<T: Transport>(h: VirtioMmcHost<T>, m: &DeviceModel) -> VirtioMmcBlk<T> {
    use emmc_sim::blkbench::{driver, DriverSetup};
    let setup = DriverSetup::default();
    let local = driver(m, &setup).expect("in-process driver");
    let mut blk = VirtioMmcBlk::probe(h, setup.blk_config(m)).expect("probe over virtio-mmc");
    let got = blk.driver().card().ext_csd;
    let want = local.card().ext_csd;
    let differ: Vec<usize> = (0..512).filter(|&i| got[i] != want[i]).collect();
    assert!(differ.is_empty(), "EXT_CSD bytes differ at {differ:?}");
    assert_eq!(
        ext::read_le(&got, ext::SEC_COUNT, 4) as u64,
        m.user_bytes() / 512,
        "SEC_COUNT is the model's user area"
    );
    assert_eq!(got[ext::EXT_CSD_REV], m.ext_csd.ext_csd_rev);
    assert_eq!(blk.driver().card().csd, local.card().csd);
    let st = status(blk.host_mut());
    assert_eq!(r1_state(st), TRAN, "tran after bring-up: {st:#x}");
    assert_eq!(st & r1::ERRORS, 0);
    assert_eq!(blk.host().stats().refused, 0);
    blk
}

/// User area, both boot partitions and a general purpose partition made by partitioning
/// (which takes effect after a power cycle) each keep their own data.
pub fn partitions<T: Transport>(h: &mut VirtioMmcHost<T>) {
    init(h);
    let e = ext_csd(h);
    let boot_sectors = u32::from(e[ext::BOOT_SIZE_MULT]) * 256;
    assert!(boot_sectors > 0, "the model has boot partitions");
    let (u, b1, b2) = (
        pattern(0x11, 4096),
        pattern(0x22, 4096),
        pattern(0x33, 4096),
    );
    write_blocks(h, 100, &u, 0);
    for (access, data) in [(1u8, &b1), (2, &b2)] {
        let (r, st) = select(h, access);
        assert_eq!(r & r1::ERRORS, 0);
        assert_eq!(st & r1::SWITCH_ERROR, 0, "PARTITION_ACCESS {access}");
        write_blocks(h, 100, data, 0);
        // The boot partition ends where BOOT_SIZE_MULT says.
        let r = read_blocks(h, boot_sectors, 1);
        let st = status(h);
        assert_ne!(
            (r.resp.cmd.resp[0] | r.resp.stop.resp[0] | st) & r1::ADDRESS_OUT_OF_RANGE,
            0,
            "a read past boot partition {access} is out of range"
        );
    }
    // No GP partition yet: selecting one is refused.
    let (_, st) = select(h, 4);
    assert_ne!(st & r1::SWITCH_ERROR, 0, "GP1 does not exist yet");
    select(h, 0);
    for (access, data) in [(0u8, &u), (1, &b1), (2, &b2)] {
        select(h, access);
        assert_eq!(&read_blocks(h, 100, 8).bytes(), data, "partition {access}");
    }
    select(h, 0);
    // GP1 of one write-protect group: GP_SIZE_MULT_1 = 1, then PARTITION_SETTING_COMPLETED.
    let (r, st) = switch(h, ext::GP_SIZE_MULT, 1);
    assert_eq!(
        (r | st) & (r1::ERRORS | r1::SWITCH_ERROR),
        0,
        "GP_SIZE_MULT"
    );
    let (r, st) = switch(h, ext::PARTITION_SETTING_COMPLETED, 1);
    assert_eq!(
        (r | st) & (r1::ERRORS | r1::SWITCH_ERROR),
        0,
        "SETTING_COMPLETED"
    );
    switch(h, ext::FLUSH_CACHE, 1);
    // Power cycle: the new geometry takes effect.
    let mut ios = h.ios();
    ios.power_mode = PowerMode::Off;
    ios.clock = 0;
    h.set_ios(ios);
    assert_eq!(h.ios().power_mode, PowerMode::Off);
    init(h);
    let e = ext_csd(h);
    assert_eq!(e[ext::GP_SIZE_MULT], 1);
    let (_, st) = select(h, 4);
    assert_eq!(st & r1::SWITCH_ERROR, 0, "GP1 exists after the power cycle");
    let g = pattern(0x44, 8192);
    write_blocks(h, 8, &g, 0);
    assert_eq!(read_blocks(h, 8, 16).bytes(), g, "GP1 data");
    for (access, data) in [(0u8, &u), (1, &b1), (2, &b2)] {
        select(h, access);
        assert_eq!(
            &read_blocks(h, 100, 8).bytes(),
            data,
            "partition {access} after the power cycle"
        );
    }
    select(h, 0);
}

/// One packed write of `n` entries by hand (header block, CMD23 with the packed bit),
/// each entry read back alone.
pub fn packed_write<T: Transport>(h: &mut VirtioMmcHost<T>, n: usize) {
    init(h);
    let e = ext_csd(h);
    assert!(usize::from(e[ext::MAX_PACKED_WRITES]) >= n);
    let per = 8u32;
    let entries: Vec<Entry> = (0..n)
        .map(|i| Entry::new(per as u16, 20_000 + 64 * i as u32, false))
        .collect();
    let header = Header {
        direction: Direction::Write,
        entries: entries.clone(),
    }
    .encode();
    let mut data = header.to_vec();
    for i in 0..n {
        data.extend(pattern(i as u8 + 1, per as usize * 512));
    }
    let total = 1 + per * n as u32;
    let r = write_blocks(h, entries[0].address, &data, 1 << 30);
    assert_eq!(r.resp.cmd.error, ERR_NONE);
    assert_eq!(r.resp.data_error, ERR_NONE);
    assert_eq!(r.resp.bytes_xfered, u64::from(total) * 512);
    let st = status(h);
    assert_eq!(st & (r1::ERRORS | r1::EXCEPTION_EVENT), 0, "{st:#x}");
    assert_eq!(ext_csd(h)[ext::PACKED_COMMAND_STATUS], 0);
    for (i, en) in entries.iter().enumerate() {
        assert_eq!(
            read_blocks(h, en.address, per).bytes(),
            pattern(i as u8 + 1, per as usize * 512),
            "entry {i}"
        );
    }
}

/// The block driver packs `n` queued writes into one packed command; all read back.
pub fn packed_by_the_driver<T: Transport>(h: VirtioMmcHost<T>, m: &DeviceModel, n: usize) {
    let cfg = BlkConfig {
        packing: PackingMode::Always,
        elevator: Elevator::Noop,
        ..BlkConfig::for_model(&m.host)
    };
    let mut blk = VirtioMmcBlk::probe(h, cfg).expect("probe");
    let lba = |i: usize| 50_000 + 100 * i as u64;
    for i in 0..n {
        blk.submit(
            BlkOp::Write,
            lba(i),
            16,
            false,
            Some(&pattern(0x50 + i as u8, 16 * 512)),
        )
        .unwrap();
    }
    let done = blk.run().unwrap();
    assert_eq!(done.len(), n);
    assert!(done.iter().all(|d| d.result.is_ok()));
    let st = blk.driver().stats().clone();
    assert!(st.packed_writes >= 1, "{st:?}");
    let largest = *st.write_packing.entries.keys().max().unwrap();
    assert!(largest >= n - 1, "packed {largest} of {n}: {st:?}");
    for i in 0..n {
        let mut back = vec![0u8; 16 * 512];
        blk.read(lba(i), &mut back).unwrap();
        assert_eq!(back, pattern(0x50 + i as u8, 16 * 512), "request {i}");
    }
}

/// A long write started with START_ONLY is interrupted by HPI half-way through its
/// programming; CORRECTLY_PRG_SECTORS_NUM says what landed and the rest is written again.
pub fn hpi_long_write<T: Transport>(h: &mut VirtioMmcHost<T>) {
    init(h);
    let e = ext_csd(h);
    assert_ne!(e[ext::HPI_MGMT] & 1, 0, "HPI enabled by bring-up");
    let blocks = 2048u32.min(h.config().max_req_size / 512);
    let addr = 300_000;
    let data = pattern(0x77, blocks as usize * 512);
    let hd = VirtioMmcReqHdr {
        flags: REQ_F_SBC | REQ_F_DATA | REQ_F_WRITE | REQ_F_START_ONLY,
        sbc: cmd(23, RESP_R1, blocks),
        blksz: 512,
        blocks,
        ..hdr(cmd(25, RESP_R1, addr))
    };
    let segs = segments(h, &data);
    let r = h
        .raw_request(&hd, RawData::Write(&segs))
        .expect("transport");
    assert_eq!(r.resp.status, STATUS_OK);
    assert_ne!(r.resp.flags & RESP_F_BUSY_PENDING, 0, "still programming");
    let (start, busy_end) = (r.resp.end_ns, r.resp.busy_until_ns);
    assert!(
        busy_end > start + 1_000_000,
        "a long programming busy: {start}..{busy_end}"
    );
    assert_eq!(h.busy_until(), Some(busy_end));
    // Half-way through, HPI (CMD12 or CMD13 with bit 0, as HPI_FEATURES says).
    h.idle_until(start + (busy_end - start) / 2);
    let st = status(h);
    assert_eq!(r1_state(st), PRG, "programming: {st:#x}");
    let hpi_op = if e[ext::HPI_FEATURES] & 2 != 0 {
        12
    } else {
        13
    };
    let r = send(h, hpi_op, RESP_R1, RCA_ARG | 1);
    assert_eq!(r.resp.cmd.error, ERR_NONE, "HPI answered");
    assert!(h.wait_busy_until(None));
    let left_prg = h.now();
    assert!(
        left_prg < busy_end,
        "HPI ended the programming early: {left_prg} vs {busy_end}"
    );
    assert_eq!(r1_state(status(h)), TRAN);
    let e = ext_csd(h);
    let landed = ext::read_le(&e, ext::CORRECTLY_PRG_SECTORS_NUM, 4);
    assert!(
        landed > 0 && landed < blocks,
        "part of the write landed: {landed} of {blocks}"
    );
    // Re-issue the remainder, then the whole range reads back.
    let rest = &data[landed as usize * 512..];
    write_blocks(h, addr + landed, rest, 0);
    assert_eq!(status(h) & r1::ERRORS, 0);
    let back = read_blocks(h, addr, blocks).bytes();
    assert!(back == data, "the write and its remainder read back");
}

/// Random small writes leave merge debt; BKOPS started with START_ONLY is interrupted by
/// HPI and the debt it worked off shows in BKOPS_STATUS's time.
pub fn bkops_interrupted<T: Transport>(h: &mut VirtioMmcHost<T>) {
    init(h);
    let e = ext_csd(h);
    assert_ne!(e[ext::BKOPS_EN] & 1, 0, "BKOPS enabled by bring-up");
    let mut level = 0;
    let data = pattern(0x99, 4096);
    let mut x: u32 = 12345;
    for i in 0..4000 {
        x = x.wrapping_mul(1_103_515_245).wrapping_add(12345);
        let addr = (x >> 4) % 8_000_000 / 8 * 8;
        write_blocks(h, addr, &data, 0);
        if i % 50 == 49 {
            level = ext_csd(h)[ext::BKOPS_STATUS];
            if level >= 1 {
                break;
            }
        }
    }
    assert!(level >= 1, "random writes left BKOPS work (level {level})");
    let arg = 0x0300_0000 | (ext::BKOPS_START as u32) << 16 | 1 << 8;
    let hd = VirtioMmcReqHdr {
        flags: REQ_F_START_ONLY,
        ..hdr(cmd(6, RESP_R1B, arg))
    };
    let r = h.raw_request(&hd, RawData::None).expect("transport");
    assert_eq!(r.resp.cmd.error, ERR_NONE);
    assert_ne!(r.resp.flags & RESP_F_BUSY_PENDING, 0, "BKOPS holds busy");
    let (start, end) = (r.resp.end_ns, r.resp.busy_until_ns);
    assert!(end > start + 1_000_000, "BKOPS takes time: {start}..{end}");
    h.idle_until(start + (end - start) / 4);
    assert_eq!(r1_state(status(h)), PRG);
    let hpi_op = if e[ext::HPI_FEATURES] & 2 != 0 {
        12
    } else {
        13
    };
    send(h, hpi_op, RESP_R1, RCA_ARG | 1);
    assert!(h.wait_busy_until(None));
    assert!(h.now() < end, "BKOPS interrupted before its end");
    assert_eq!(r1_state(status(h)), TRAN);
    let after = ext_csd(h)[ext::BKOPS_STATUS];
    assert!(after <= level, "BKOPS_STATUS {level} → {after}");
    // Started again and left to finish, it clears the level.
    switch(h, ext::BKOPS_START, 1);
    assert_eq!(ext_csd(h)[ext::BKOPS_STATUS], 0, "BKOPS ran to completion");
}

/// The block driver's HPI policy interrupts a long write for a read and re-queues the rest.
pub fn hpi_by_the_driver<T: Transport>(h: VirtioMmcHost<T>, m: &DeviceModel) {
    let cfg = BlkConfig {
        hpi: HpiPolicy {
            enabled: true,
            min_write_sectors: 128,
            min_wait_ns: 0,
        },
        elevator: Elevator::Noop,
        ..BlkConfig::for_model(&m.host)
    };
    let mut blk = VirtioMmcBlk::probe(h, cfg).expect("probe");
    let w = pattern(0x3C, 1024 * 512);
    let wid = blk
        .submit(BlkOp::Write, 10_000, 1024, false, Some(&w))
        .unwrap();
    // Into the write's programming, then a read arrives.
    let t = blk.driver().now() + 5_000_000;
    blk.driver_mut().advance(t);
    let rid = blk.submit(BlkOp::Read, 500_000, 8, false, None).unwrap();
    let done = blk.run().unwrap();
    let st = blk.driver().stats().clone();
    assert_eq!(st.hpi, 1, "{st:?}");
    assert!(st.hpi_requeued_sectors > 0);
    let at = |id| done.iter().find(|d| d.id == id).unwrap().at;
    assert!(
        at(rid) < at(wid),
        "the read went before the rest of the write"
    );
    let mut back = vec![0u8; w.len()];
    blk.read(10_000, &mut back).unwrap();
    assert!(back == w, "the interrupted write landed whole");
}

// ---- RPMB (facts §11.3–§11.5; frames and MACs from emmc_test_support::rpmb, as in
// crates/card/tests/card_rpmb.rs) ----------------------------------------------------------

fn rpmb_send<T: Transport>(h: &mut VirtioMmcHost<T>, frames: &[u8], rel: bool) {
    let r = write_blocks(h, 0, frames, if rel { 1 << 31 } else { 0 });
    assert_eq!(r.resp.cmd.error, ERR_NONE);
    assert_eq!(r.resp.data_error, ERR_NONE);
}

fn rpmb_result<T: Transport>(h: &mut VirtioMmcHost<T>) -> Vec<u8> {
    rpmb_send(h, &frame(0x0005), false);
    read_blocks(h, 0, 1).bytes()
}

/// Key programming, the write counter, an authenticated write and read, all MACs checked
/// here; a write with a wrong MAC fails authentication.
pub fn rpmb<T: Transport>(h: &mut VirtioMmcHost<T>) {
    init(h);
    let key: [u8; 32] = *b"virtio-mmc driver's RPMB test k!";
    select(h, 3);
    // Program the key.
    let mut f = frame(0x0001);
    f[KEY_MAC..DATA].copy_from_slice(&key);
    rpmb_send(h, &f, true);
    let r = rpmb_result(h);
    assert_eq!(be16(&r, REQ_RESP), 0x0100);
    assert_eq!(be16(&r, RESULT), 0, "key programmed");
    // Read the counter with a nonce.
    let nonce: [u8; 16] = std::array::from_fn(|i| i as u8 * 7 + 1);
    let mut f = frame(0x0002);
    f[NONCE..COUNTER].copy_from_slice(&nonce);
    rpmb_send(h, &f, false);
    let r = read_blocks(h, 0, 1).bytes();
    assert_eq!(be16(&r, REQ_RESP), 0x0200);
    assert_eq!(be16(&r, RESULT), 0);
    assert_eq!(&r[NONCE..COUNTER], &nonce);
    assert_eq!(&r[KEY_MAC..DATA], &mac(&key, &[&r]), "counter response MAC");
    let counter = u32::from_be_bytes(r[COUNTER..ADDRESS].try_into().unwrap());
    assert_eq!(counter, 0);
    // Authenticated write of one half-sector at address 5.
    let payload: [u8; 256] = std::array::from_fn(|i| (i as u8) ^ 0x5A);
    let mut f = frame(0x0003);
    f[DATA..NONCE].copy_from_slice(&payload);
    f[COUNTER..ADDRESS].copy_from_slice(&counter.to_be_bytes());
    f[ADDRESS..BLOCK_COUNT].copy_from_slice(&5u16.to_be_bytes());
    f[BLOCK_COUNT..RESULT].copy_from_slice(&1u16.to_be_bytes());
    let m = mac(&key, &[&f]);
    f[KEY_MAC..DATA].copy_from_slice(&m);
    rpmb_send(h, &f, true);
    let r = rpmb_result(h);
    assert_eq!(be16(&r, REQ_RESP), 0x0300);
    assert_eq!(be16(&r, RESULT), 0, "authenticated write");
    assert_eq!(
        u32::from_be_bytes(r[COUNTER..ADDRESS].try_into().unwrap()),
        1
    );
    assert_eq!(&r[KEY_MAC..DATA], &mac(&key, &[&r]), "write result MAC");
    // A write signed with another key fails authentication; the counter stays.
    let mut bad = f;
    bad[COUNTER..ADDRESS].copy_from_slice(&1u32.to_be_bytes());
    let m = mac(&[0xA5; 32], &[&bad]);
    bad[KEY_MAC..DATA].copy_from_slice(&m);
    rpmb_send(h, &bad, true);
    let r = rpmb_result(h);
    assert_eq!(be16(&r, RESULT) & 0x7F, 0x02, "AUTH_FAILURE");
    assert_eq!(
        u32::from_be_bytes(r[COUNTER..ADDRESS].try_into().unwrap()),
        1
    );
    // Authenticated read of address 5.
    let nonce2: [u8; 16] = [0xC3; 16];
    let mut f = frame(0x0004);
    f[NONCE..COUNTER].copy_from_slice(&nonce2);
    f[ADDRESS..BLOCK_COUNT].copy_from_slice(&5u16.to_be_bytes());
    rpmb_send(h, &f, false);
    let r = read_blocks(h, 0, 1).bytes();
    assert_eq!(be16(&r, REQ_RESP), 0x0400);
    assert_eq!(be16(&r, RESULT), 0);
    assert_eq!(&r[DATA..NONCE], &payload, "the authenticated data");
    assert_eq!(&r[NONCE..COUNTER], &nonce2);
    assert_eq!(&r[KEY_MAC..DATA], &mac(&key, &[&r]), "read response MAC");
    select(h, 0);
}

/// A command the card does not take in tran: no response, ILLEGAL_COMMAND in the next
/// status and only there.
pub fn illegal_command<T: Transport>(h: &mut VirtioMmcHost<T>) {
    init(h);
    // CMD2 (ALL_SEND_CID) is legal only in ready.
    let r = send(h, 2, RESP_R2, 0);
    assert_eq!(r.resp.status, STATUS_OK, "well-formed: the device ran it");
    assert_eq!(r.resp.cmd.error, ERR_CMD_TIMEOUT, "the card did not answer");
    let st = status(h);
    assert_ne!(st & r1::ILLEGAL_COMMAND, 0, "ILLEGAL_COMMAND in {st:#x}");
    assert_eq!(r1_state(st), TRAN);
    let st = status(h);
    assert_eq!(st & r1::ILLEGAL_COMMAND, 0, "cleared after it was read");
}

/// Malformed chains get IOERR/UNSUPP (or used length 0 without room for a response),
/// nothing reaches the card, and the device goes on serving.
pub fn malformed<T: Transport>(h: &mut VirtioMmcHost<T>) {
    init(h);
    let resp_len = std::mem::size_of::<VirtioMmcResp>() as u32;
    let st0 = status(h);
    let base = hdr(cmd(13, RESP_R1, RCA_ARG));
    let status_of = |out: &virtio_mmc_driver::host::RawChainOutcome| {
        let mut r = VirtioMmcResp::default();
        r.as_mut_slice()
            .copy_from_slice(out.writable.last().expect("a response buffer"));
        r
    };
    let check = |h: &mut VirtioMmcHost<T>, what: &str, descs: Vec<RawDesc>, want: u32| {
        let out = h.raw_chain(REQUEST_QUEUE, &descs).expect("transport");
        let r = status_of(&out);
        assert_eq!(r.status, want, "{what}: status");
        assert!(
            out.used_len >= 4 && out.used_len <= resp_len,
            "{what}: used {}",
            out.used_len
        );
        assert_eq!(r.cmd.flags & RESP_F_ISSUED, 0, "{what}: nothing was issued");
        // Still serving, and the card saw nothing (no error bits, same state).
        let st = status(h);
        assert_eq!(st, st0, "{what}: card status");
    };
    let hb = base.as_slice().to_vec();
    check(
        h,
        "header too short",
        vec![
            RawDesc::Readable(hb[..40].to_vec()),
            RawDesc::Writable(resp_len),
        ],
        STATUS_IOERR,
    );
    check(
        h,
        "header device-writable",
        vec![RawDesc::Writable(80), RawDesc::Writable(resp_len)],
        STATUS_IOERR,
    );
    let mut x = base;
    x.flags = 1 << 7;
    check(
        h,
        "unknown flag",
        vec![
            RawDesc::Readable(x.as_slice().to_vec()),
            RawDesc::Writable(resp_len),
        ],
        STATUS_UNSUPP,
    );
    let mut x = base;
    x.cmd.opcode = 64;
    check(
        h,
        "opcode 64",
        vec![
            RawDesc::Readable(x.as_slice().to_vec()),
            RawDesc::Writable(resp_len),
        ],
        STATUS_IOERR,
    );
    let mut x = base;
    x.cmd.resp_type = 5;
    check(
        h,
        "resp_type 5",
        vec![
            RawDesc::Readable(x.as_slice().to_vec()),
            RawDesc::Writable(resp_len),
        ],
        STATUS_IOERR,
    );
    let rd = VirtioMmcReqHdr {
        flags: REQ_F_SBC | REQ_F_DATA,
        sbc: cmd(23, RESP_R1, 1),
        blksz: 512,
        blocks: 1,
        ..hdr(cmd(18, RESP_R1, 0))
    };
    check(
        h,
        "data shorter than blksz × blocks",
        vec![
            RawDesc::Readable(rd.as_slice().to_vec()),
            RawDesc::Writable(256),
            RawDesc::Writable(resp_len),
        ],
        STATUS_IOERR,
    );
    check(
        h,
        "read into a device-readable buffer",
        vec![
            RawDesc::Readable(rd.as_slice().to_vec()),
            RawDesc::Readable(vec![0; 512]),
            RawDesc::Writable(resp_len),
        ],
        STATUS_IOERR,
    );
    let mut x = rd;
    x.blocks = 0;
    check(
        h,
        "zero blocks",
        vec![
            RawDesc::Readable(x.as_slice().to_vec()),
            RawDesc::Writable(resp_len),
        ],
        STATUS_IOERR,
    );
    let mut x = rd;
    x.cmd.resp_type = RESP_NONE;
    check(
        h,
        "data without a response",
        vec![
            RawDesc::Readable(x.as_slice().to_vec()),
            RawDesc::Writable(512),
            RawDesc::Writable(resp_len),
        ],
        STATUS_IOERR,
    );
    let mut x = base;
    x.flags = REQ_F_DATA | REQ_F_WRITE;
    x.blksz = 512;
    x.blocks = 1;
    check(
        h,
        "data flag without data buffers",
        vec![
            RawDesc::Readable(x.as_slice().to_vec()),
            RawDesc::Writable(resp_len),
        ],
        STATUS_IOERR,
    );
    // No room for a response: used length 0, the buffer untouched.
    for (what, descs) in [
        ("response missing", vec![RawDesc::Readable(hb.clone())]),
        (
            "response too short",
            vec![RawDesc::Readable(hb.clone()), RawDesc::Writable(64)],
        ),
    ] {
        let out = h.raw_chain(REQUEST_QUEUE, &descs).expect("transport");
        assert_eq!(out.used_len, 0, "{what}");
        assert!(
            out.writable.iter().flatten().all(|&b| b == UNTOUCHED),
            "{what}: nothing written"
        );
        assert_eq!(status(h), st0, "{what}: still serving");
    }
    // An unknown control request.
    let r = h.control(99, 0, 0).expect("transport");
    assert_eq!(r.status, STATUS_UNSUPP);
    // And a real request still works.
    let d = pattern(0xE1, 1024);
    write_blocks(h, 4242, &d, 0);
    assert_eq!(read_blocks(h, 4242, 2).bytes(), d);
}
