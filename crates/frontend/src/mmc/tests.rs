//! The virtio-mmc backend in process: mock split queues in guest memory, requests built
//! as a guest's MMC driver would (Linux's bring-up, CMD23-framed transfers, START_ONLY),
//! and hostile chains a guest should not send.

use std::time::{Duration, Instant};

use vhost_user_backend::{VhostUserBackend, VringRwLock, VringT};
use vm_memory::{
    ByteValued, Bytes, GuestAddress, GuestAddressSpace, GuestMemoryAtomic, GuestMemoryMmap,
};

use super::backend::{EmmcMmcBackend, TIMER_EVENT};
use super::device::{MmcDevice, CARD_TIME_LIMIT};
use super::proto::*;
use super::request::{CTRL_REQ_LEN, CTRL_RESP_LEN, EVENT_LEN, HDR_LEN, RESP_LEN};
use crate::pacing::Pacing;
use crate::testing::{
    self, guest_memory, handle_event, mem_card, GuestQueue, GUEST_MEMORY, QUEUE_LEN,
};
use emmc_card::ext_csd as ext;
use emmc_card::model::DeviceModel;
use emmc_card::{r1, CardState};
use emmc_host::sdhci::{error_int, normal_int};

const RCA: u32 = 1 << 16;
/// Linux's CMD1 argument.
const HOST_OCR: u32 = 0x40FF_8080;

struct Rig {
    backend: EmmcMmcBackend,
    mem: GuestMemoryAtomic<GuestMemoryMmap>,
    /// One per virtqueue, queue `q`'s structures at 0x10000 × (q + 1).
    rings: Vec<GuestQueue>,
    /// Guest memory handed out for headers, data and responses.
    next_buf: u64,
}

/// The rigs' card, with BKOPS levels the event tests reach with a few ms of work.
fn model(program_ns: u64) -> DeviceModel {
    let mut m = testing::model(program_ns);
    m.timing.constant_mut().bkops_level_ns = [1_000_000, 2_000_000, 1_000_000_000_000];
    m
}

/// A response's R1 CURRENT_STATE.
fn state(r1: u32) -> u32 {
    (r1 & r1::CURRENT_STATE_MASK) >> r1::CURRENT_STATE_SHIFT
}

fn cmd(opcode: u8, arg: u32, resp_type: u8) -> VirtioMmcCmd {
    VirtioMmcCmd {
        opcode,
        resp_type,
        arg,
        ..Default::default()
    }
}

fn hdr(c: VirtioMmcCmd) -> VirtioMmcReqHdr {
    VirtioMmcReqHdr {
        cmd: c,
        ..Default::default()
    }
}

impl Rig {
    fn new(model: DeviceModel, pacing: Pacing) -> Rig {
        let backend =
            EmmcMmcBackend::new(MmcDevice::new(mem_card(&model), &model), pacing).unwrap();
        let mem = guest_memory(&backend);
        let rings = (0..NUM_QUEUES as u64)
            .map(|q| GuestQueue::new(&mem, 0x10000 * (q + 1)))
            .collect();
        Rig {
            backend,
            mem,
            rings,
            next_buf: 0x10_0000,
        }
    }

    /// Negotiate VIRTIO_RING_F_EVENT_IDX, as Linux's virtio core does.
    fn with_event_idx(self) -> Rig {
        self.backend.set_event_idx(true);
        for r in &self.rings {
            r.vring.set_queue_event_idx(true);
        }
        self
    }

    /// `len` bytes of fresh guest memory, 8-byte aligned.
    fn alloc(&mut self, len: u64) -> u64 {
        let at = self.next_buf;
        self.next_buf = (self.next_buf + len + 7) & !7;
        assert!(self.next_buf < GUEST_MEMORY, "test guest memory exhausted");
        at
    }

    fn vrings(&self) -> Vec<VringRwLock> {
        self.rings.iter().map(|r| r.vring.clone()).collect()
    }

    /// Put a chain of (addr, len, writable) descriptors on queue `q` and publish it.
    fn push(&mut self, q: usize, descs: &[(u64, u32, bool)]) -> u16 {
        self.rings[q].push(descs)
    }

    fn kick(&self, q: u16) {
        handle_event(&self.backend, q, &self.vrings());
    }

    fn tick(&self) {
        handle_event(&self.backend, TIMER_EVENT, &self.vrings());
    }

    /// Used-ring entries of queue `q` added since the last call: (id, len).
    fn used(&mut self, q: usize) -> Vec<(u32, u32)> {
        self.rings[q].used()
    }

    fn put<T: ByteValued>(&mut self, obj: T) -> u64 {
        let at = self.alloc(std::mem::size_of::<T>() as u64);
        self.mem.memory().write_obj(obj, GuestAddress(at)).unwrap();
        at
    }

    fn get<T: ByteValued>(&self, at: u64) -> T {
        self.mem.memory().read_obj(GuestAddress(at)).unwrap()
    }

    /// Queue a request with these data buffers (addr, len), without kicking; returns the
    /// response's address.
    fn stage(&mut self, h: VirtioMmcReqHdr, data: &[(u64, u32)]) -> u64 {
        let write = h.flags & REQ_F_WRITE != 0;
        let hdr_at = self.put(h);
        let resp_at = self.alloc(u64::from(RESP_LEN));
        let mut chain = vec![(hdr_at, HDR_LEN, false)];
        chain.extend(data.iter().map(|&(a, l)| (a, l, !write)));
        chain.push((resp_at, RESP_LEN, true));
        self.push(REQUEST_QUEUE, &chain);
        resp_at
    }

    /// Send a request and return its response (it must complete at once: no pacing, or
    /// the caller ticks).
    fn request(&mut self, h: VirtioMmcReqHdr, data: &[(u64, u32)]) -> VirtioMmcResp {
        let at = self.stage(h, data);
        self.kick(REQUEST_QUEUE as u16);
        let used = self.used(REQUEST_QUEUE);
        assert_eq!(used.len(), 1, "CMD{} completed", h.cmd.opcode);
        let resp: VirtioMmcResp = self.get(at);
        assert_eq!(resp.status, STATUS_OK, "CMD{}", h.cmd.opcode);
        resp
    }

    fn command(&mut self, opcode: u8, arg: u32, resp_type: u8) -> VirtioMmcResp {
        self.request(hdr(cmd(opcode, arg, resp_type)), &[])
    }

    /// CMD13's R1, which must have been answered.
    fn status(&mut self) -> u32 {
        let r = self.command(13, RCA, RESP_R1);
        assert_eq!(r.cmd.error, ERR_NONE, "CMD13 answered");
        r.cmd.resp[0]
    }

    fn stage_control(&mut self, kind: u32, arg0: u64, arg1: u64) -> u64 {
        let req_at = self.put(VirtioMmcCtrlReq {
            kind,
            reserved: 0,
            arg0,
            arg1,
        });
        let resp_at = self.alloc(u64::from(CTRL_RESP_LEN));
        self.push(
            CONTROL_QUEUE,
            &[
                (req_at, CTRL_REQ_LEN, false),
                (resp_at, CTRL_RESP_LEN, true),
            ],
        );
        resp_at
    }

    fn control(&mut self, kind: u32, arg0: u64, arg1: u64) -> VirtioMmcCtrlResp {
        let at = self.stage_control(kind, arg0, arg1);
        self.kick(CONTROL_QUEUE as u16);
        let used = self.used(CONTROL_QUEUE);
        assert_eq!(used.len(), 1, "control {kind} completed at once");
        assert_eq!(used[0].1, CTRL_RESP_LEN, "control {kind}");
        self.get(at)
    }

    fn set_ios(&mut self, clock: u64, width: u8, timing: u8, power: u8) {
        let arg1 = u64::from(width) | u64::from(timing) << 8 | u64::from(power) << 16;
        let r = self.control(CTRL_SET_IOS, clock, arg1);
        assert_eq!(r.status, STATUS_OK, "SET_IOS {clock} {arg1:#x}");
    }

    /// CMD6 WRITE_BYTE as R1b, then CMD13 without SWITCH_ERROR.
    fn switch(&mut self, index: usize, value: u8) {
        let arg = 0x0300_0000 | (index as u32) << 16 | u32::from(value) << 8;
        let r = self.command(6, arg, RESP_R1B);
        assert_eq!(r.cmd.error, ERR_NONE, "CMD6 {index}={value}");
        assert_eq!(r.cmd.resp[0] & r1::ERRORS, 0, "CMD6 {index}={value}");
        let s = self.status();
        assert_eq!(s & r1::SWITCH_ERROR, 0, "CMD6 {index}={value}");
    }

    /// CMD8 into one 512-byte buffer.
    fn ext_csd(&mut self) -> [u8; 512] {
        let buf = self.alloc(512);
        let h = VirtioMmcReqHdr {
            flags: REQ_F_DATA,
            blksz: 512,
            blocks: 1,
            ..hdr(cmd(8, 0, RESP_R1))
        };
        let r = self.request(h, &[(buf, 512)]);
        assert_eq!(r.data_error, ERR_NONE);
        assert_eq!(r.bytes_xfered, 512);
        let mut e = [0u8; 512];
        self.mem
            .memory()
            .read_slice(&mut e, GuestAddress(buf))
            .unwrap();
        e
    }

    /// Linux's `mmc_init_card` sequence through raw requests, ending in tran state on an
    /// 8-bit bus in high speed at 52 MHz with the cache on.
    fn bring_up(&mut self) -> [u8; 512] {
        self.set_ios(400_000, 1, TIMING_LEGACY, POWER_UP);
        self.set_ios(400_000, 1, TIMING_LEGACY, POWER_ON);
        let r = self.command(0, 0, RESP_NONE);
        assert_eq!(r.cmd.flags & RESP_F_ISSUED, RESP_F_ISSUED);
        let mut ocr = 0;
        for _ in 0..100 {
            let r = self.command(1, HOST_OCR, RESP_R3);
            assert_eq!(r.cmd.error, ERR_NONE, "CMD1 answered");
            ocr = r.cmd.resp[0];
            if ocr & 1 << 31 != 0 {
                break;
            }
        }
        assert_ne!(ocr & 1 << 31, 0, "power-up done");
        assert_ne!(ocr & 1 << 30, 0, "sector addressing for a 4 GiB card");
        let cid = self.command(2, 0, RESP_R2);
        assert_eq!(cid.cmd.error, ERR_NONE);
        let want = self.backend.with_device(|d| d.card().cid());
        assert_eq!(
            cid.cmd.resp[0].to_be_bytes(),
            want[0..4],
            "R2 bits 127:96 in resp[0]"
        );
        assert_eq!(cid.cmd.resp[3] & 0xFF, 0, "the CRC byte reads 0");
        let r = self.command(3, RCA, RESP_R1);
        assert_eq!(r.cmd.error, ERR_NONE);
        assert_eq!(state(r.cmd.resp[0]), CardState::Ident.number());
        let csd = self.command(9, RCA, RESP_R2);
        assert_eq!(csd.cmd.error, ERR_NONE);
        let r = self.command(7, RCA, RESP_R1B);
        assert_eq!(r.cmd.error, ERR_NONE);
        assert_eq!(state(r.cmd.resp[0]), CardState::Stby.number());
        let e = self.ext_csd();
        self.switch(ext::HS_TIMING, 1);
        self.set_ios(52_000_000, 1, TIMING_HS, POWER_ON);
        self.switch(ext::BUS_WIDTH, 2);
        self.set_ios(52_000_000, 8, TIMING_HS, POWER_ON);
        if ext::read_le(&e, ext::CACHE_SIZE, 4) > 0 {
            self.switch(ext::CACHE_CTRL, ext::CACHE_EN);
        }
        e
    }
}

fn fill(len: usize, seed: u32) -> Vec<u8> {
    (0..len as u32)
        .map(|i| (i.wrapping_mul(7).wrapping_add(seed) % 251) as u8)
        .collect()
}

#[test]
fn linux_like_bring_up_reaches_tran_and_reads_the_ext_csd() {
    let mut rig = Rig::new(model(0), Pacing::Off);
    let e = rig.bring_up();
    assert_eq!(ext::read_le(&e, ext::SEC_COUNT, 4), 8 << 20);
    let want = rig.backend.with_device(|d| d.card().ext_csd());
    assert_eq!(e[ext::EXT_CSD_REV], want[ext::EXT_CSD_REV]);
    let s = rig.status();
    assert_eq!(state(s), CardState::Tran.number());
    assert_eq!(s & r1::ERRORS, 0);
    assert_ne!(s & r1::READY_FOR_DATA, 0);
    let e = rig.ext_csd();
    assert_eq!(e[ext::HS_TIMING], 1);
    assert_eq!(e[ext::CACHE_CTRL], ext::CACHE_EN);
}

#[test]
fn a_cmd25_write_and_cmd18_read_with_cmd23_round_trip() {
    let mut rig = Rig::new(model(0), Pacing::Off);
    rig.bring_up();
    let data = fill(8192, 3);
    // Blocks straddle buffers, one of them at an unaligned address (ADMA2 bounce).
    let (a, b) = (rig.alloc(3001) + 1, rig.alloc(8192));
    rig.mem
        .memory()
        .write_slice(&data[..3000], GuestAddress(a))
        .unwrap();
    rig.mem
        .memory()
        .write_slice(&data[3000..], GuestAddress(b))
        .unwrap();
    let write = VirtioMmcReqHdr {
        flags: REQ_F_SBC | REQ_F_DATA | REQ_F_WRITE,
        sbc: cmd(23, 16, RESP_R1),
        blksz: 512,
        blocks: 16,
        ..hdr(cmd(25, 1000, RESP_R1))
    };
    let at = rig.stage(write, &[(a, 3000), (b, 5192)]);
    rig.kick(REQUEST_QUEUE as u16);
    let used = rig.used(REQUEST_QUEUE);
    assert_eq!(used.len(), 1);
    assert_eq!(used[0].1, RESP_LEN, "no data written back");
    let r: VirtioMmcResp = rig.get(at);
    assert_eq!(r.status, STATUS_OK);
    assert_eq!((r.data_error, r.bytes_xfered), (ERR_NONE, 8192));
    assert_eq!(r.cmd.error, ERR_NONE);
    assert_eq!(r.cmd.resp[0] & r1::ERRORS, 0);
    assert_eq!(r.sbc.opcode, 23);
    assert_ne!(r.sbc.flags & RESP_F_ISSUED, 0);
    assert_ne!(
        r.sbc.flags & RESP_F_AUTO,
        0,
        "a v3 host with ADMA sends CMD23 as Auto CMD23"
    );
    assert_ne!(r.int_status & u32::from(normal_int::TRANSFER_COMPLETE), 0);
    assert_eq!(r.int_status >> 16, 0, "no error interrupt");
    assert!(r.end_ns > r.start_ns);
    assert_eq!(
        rig.backend
            .with_device(|d| d.card().stats().sectors_written),
        16
    );

    let back = rig.alloc(8192);
    let read = VirtioMmcReqHdr {
        flags: REQ_F_SBC | REQ_F_DATA,
        sbc: cmd(23, 16, RESP_R1),
        blksz: 512,
        blocks: 16,
        ..hdr(cmd(18, 1000, RESP_R1))
    };
    let at = rig.stage(read, &[(back, 4096), (back + 4096, 4096)]);
    rig.kick(REQUEST_QUEUE as u16);
    let used = rig.used(REQUEST_QUEUE);
    assert_eq!(used.len(), 1);
    assert_eq!(used[0].1, 8192 + RESP_LEN, "read data plus the response");
    let r: VirtioMmcResp = rig.get(at);
    assert_eq!((r.data_error, r.bytes_xfered), (ERR_NONE, 8192));
    let mut got = vec![0u8; 8192];
    rig.mem
        .memory()
        .read_slice(&mut got, GuestAddress(back))
        .unwrap();
    assert!(got == data, "the read returns what was written");
    assert_eq!(state(rig.status()), CardState::Tran.number());
}

#[test]
fn start_only_returns_at_the_busy_start_and_wait_busy_waits_it_out() {
    let mut m = model(5_000_000); // 5 ms to program
    m.ext_csd.cache_size = 0;
    let mut rig = Rig::new(m, Pacing::Off);
    rig.bring_up();
    let buf = rig.alloc(4096);
    let write = VirtioMmcReqHdr {
        flags: REQ_F_SBC | REQ_F_DATA | REQ_F_WRITE | REQ_F_START_ONLY,
        sbc: cmd(23, 8, RESP_R1),
        blksz: 512,
        blocks: 8,
        ..hdr(cmd(25, 64, RESP_R1))
    };
    let r = rig.request(write, &[(buf, 4096)]);
    assert_eq!(r.flags & RESP_F_BUSY_PENDING, RESP_F_BUSY_PENDING);
    assert!(
        r.busy_until_ns >= r.end_ns + 5_000_000,
        "busy until {} after completing at {}",
        r.busy_until_ns,
        r.end_ns
    );
    let busy = rig.control(CTRL_CARD_BUSY, 0, 0);
    assert_eq!((busy.val0, busy.busy_until_ns), (1, r.busy_until_ns));
    let s = rig.status();
    assert_eq!(state(s), CardState::Prg.number(), "programming");
    assert_eq!(s & r1::READY_FOR_DATA, 0);
    let early = rig.control(CTRL_WAIT_BUSY, r.end_ns + 1_000_000, 0);
    assert_eq!(early.val0, 0, "not released by the deadline");
    assert_eq!(early.now_ns, r.end_ns + 1_000_000);
    let waited = rig.control(CTRL_WAIT_BUSY, u64::MAX, 0);
    assert_eq!(waited.val0, 1);
    assert_eq!(waited.now_ns, r.busy_until_ns);
    assert_eq!(waited.busy_until_ns, 0);
    assert_eq!(rig.control(CTRL_CARD_BUSY, 0, 0).val0, 0);
    assert_eq!(state(rig.status()), CardState::Tran.number());

    // Without START_ONLY the same write waits for its programming.
    let write = VirtioMmcReqHdr {
        flags: REQ_F_SBC | REQ_F_DATA | REQ_F_WRITE,
        ..write
    };
    let r = rig.request(write, &[(buf, 4096)]);
    assert_eq!(r.flags & RESP_F_BUSY_PENDING, 0);
    assert_eq!(r.busy_until_ns, 0);
    assert!(r.end_ns - r.start_ns >= 5_000_000);
}

#[test]
fn an_illegal_command_shows_as_illegal_command_in_the_next_cmd13() {
    let mut rig = Rig::new(model(0), Pacing::Off);
    rig.bring_up();
    // CMD2 is not legal in tran: the card stays silent.
    let r = rig.command(2, 0, RESP_R2);
    assert_eq!(r.cmd.error, ERR_CMD_TIMEOUT);
    assert_ne!(r.int_status & u32::from(error_int::CMD_TIMEOUT) << 16, 0);
    let s = rig.status();
    assert_ne!(s & r1::ILLEGAL_COMMAND, 0, "R1 {s:#010x}");
    assert_eq!(s & r1::ILLEGAL_COMMAND, r1::ILLEGAL_COMMAND);
    let s = rig.status();
    assert_eq!(s & r1::ILLEGAL_COMMAND, 0, "cleared once reported");
}

#[test]
fn malformed_requests_get_ioerr_or_unsupp_never_reach_the_card_and_the_device_serves_on() {
    let mut rig = Rig::new(model(0), Pacing::Off);
    rig.bring_up();
    let cfg = rig.backend.with_device(|d| d.config());
    let read = |blksz: u32, blocks: u32| VirtioMmcReqHdr {
        flags: REQ_F_DATA,
        blksz,
        blocks,
        ..hdr(cmd(18, 0, RESP_R1))
    };
    let write = |blksz: u32, blocks: u32| VirtioMmcReqHdr {
        flags: REQ_F_DATA | REQ_F_WRITE,
        ..read(blksz, blocks)
    };
    let buf = rig.alloc(u64::from(cfg.max_req_size) + 4096);
    let seg = cfg.max_seg_size;
    let many: Vec<(u64, u32, bool)> = (0..=u64::from(cfg.max_segs))
        .map(|i| (buf + 512 * i, 512, true))
        .collect();
    let full: Vec<(u64, u32, bool)> = (0..u64::from(cfg.max_req_size / seg) + 1)
        .map(|i| (buf + u64::from(seg) * i, seg, true))
        .collect();
    struct Case {
        what: &'static str,
        hdr: VirtioMmcReqHdr,
        /// Between the header and the response.
        data: Vec<(u64, u32, bool)>,
        status: u32,
    }
    let case = |what, hdr, data, status| Case {
        what,
        hdr,
        data,
        status,
    };
    let cases = vec![
        case(
            "unknown flag",
            VirtioMmcReqHdr {
                flags: 1 << 7,
                ..hdr(cmd(13, RCA, RESP_R1))
            },
            vec![],
            STATUS_UNSUPP,
        ),
        case(
            "read buffer device-readable",
            read(512, 1),
            vec![(buf, 512, false)],
            STATUS_IOERR,
        ),
        case(
            "write buffer device-writable",
            write(512, 1),
            vec![(buf, 512, true)],
            STATUS_IOERR,
        ),
        case(
            "more than max_segs buffers",
            read(512, cfg.max_segs + 1),
            many,
            STATUS_IOERR,
        ),
        case(
            "a buffer longer than max_seg_size",
            read(512, 2 * seg / 512),
            vec![(buf, 2 * seg, true)],
            STATUS_IOERR,
        ),
        case(
            "buffers shorter than blksz × blocks",
            read(512, 2),
            vec![(buf, 512, true)],
            STATUS_IOERR,
        ),
        case(
            "buffers longer than blksz × blocks",
            read(512, 1),
            vec![(buf, 512, true), (buf + 512, 4, true)],
            STATUS_IOERR,
        ),
        case("blksz 0", read(0, 1), vec![], STATUS_IOERR),
        case(
            "blksz above max_blk_size",
            read(cfg.max_blk_size + 1, 1),
            vec![(buf, cfg.max_blk_size + 1, true)],
            STATUS_IOERR,
        ),
        case("blocks 0", read(512, 0), vec![], STATUS_IOERR),
        case(
            "blocks above max_blk_count",
            read(1, cfg.max_blk_count + 1),
            vec![],
            STATUS_IOERR,
        ),
        case(
            "more than max_req_size bytes",
            read(512, cfg.max_req_size / 512 + 1),
            full,
            STATUS_IOERR,
        ),
        case("resp_type 5", hdr(cmd(13, RCA, 5)), vec![], STATUS_IOERR),
        case(
            "opcode 64",
            hdr(cmd(64, RCA, RESP_R1)),
            vec![],
            STATUS_IOERR,
        ),
        case(
            "sbc opcode 200",
            VirtioMmcReqHdr {
                flags: REQ_F_SBC,
                sbc: cmd(200, 1, RESP_R1),
                ..hdr(cmd(13, RCA, RESP_R1))
            },
            vec![],
            STATUS_IOERR,
        ),
        case(
            "stop resp_type 9",
            VirtioMmcReqHdr {
                flags: REQ_F_STOP,
                stop: cmd(12, 0, 9),
                ..hdr(cmd(13, RCA, RESP_R1))
            },
            vec![],
            STATUS_IOERR,
        ),
        case(
            "DATA with no response",
            VirtioMmcReqHdr {
                cmd: cmd(18, 0, RESP_NONE),
                ..read(512, 1)
            },
            vec![(buf, 512, true)],
            STATUS_IOERR,
        ),
        case(
            "a buffer outside guest memory",
            read(512, 1),
            vec![(0x7FFF_0000, 512, true)],
            STATUS_IOERR,
        ),
        case(
            "data buffers without DATA",
            hdr(cmd(13, RCA, RESP_R1)),
            vec![(buf, 512, true)],
            STATUS_IOERR,
        ),
    ];
    let commands = |rig: &Rig| rig.backend.with_device(|d| d.card().stats().commands);
    let before = commands(&rig);
    for c in cases {
        let hdr_at = rig.put(c.hdr);
        let resp_at = rig.alloc(u64::from(RESP_LEN));
        rig.mem
            .memory()
            .write_obj(0xEEEE_EEEEu32, GuestAddress(resp_at))
            .unwrap();
        let mut chain = vec![(hdr_at, HDR_LEN, false)];
        chain.extend(c.data);
        chain.push((resp_at, RESP_LEN, true));
        rig.push(REQUEST_QUEUE, &chain);
        rig.kick(REQUEST_QUEUE as u16);
        let used = rig.used(REQUEST_QUEUE);
        assert_eq!(used.len(), 1, "{}: the chain is returned", c.what);
        assert_eq!(
            used[0].1, RESP_LEN,
            "{}: only the response is written",
            c.what
        );
        let r: VirtioMmcResp = rig.get(resp_at);
        assert_eq!(r.status, c.status, "{}", c.what);
        assert_eq!(r.cmd, VirtioMmcCmdResp::default(), "{}", c.what);
    }
    // Chains whose header or response is wrong.
    let h = rig.put(hdr(cmd(13, RCA, RESP_R1)));
    let resp = rig.alloc(256);
    /// (what, chain, used length: the response written or nothing)
    type Shape = (&'static str, Vec<(u64, u32, bool)>, u32);
    let shapes: Vec<Shape> = vec![
        (
            "short header",
            vec![(h, 40, false), (resp, RESP_LEN, true)],
            RESP_LEN,
        ),
        (
            "writable header",
            vec![(h, HDR_LEN, true), (resp, RESP_LEN, true)],
            RESP_LEN,
        ),
        (
            "long response",
            vec![(h, HDR_LEN, false), (resp, RESP_LEN + 8, true)],
            RESP_LEN,
        ),
        ("header only", vec![(h, HDR_LEN, false)], 0),
        (
            "short response",
            vec![(h, HDR_LEN, false), (resp, RESP_LEN - 1, true)],
            0,
        ),
        (
            "readable response",
            vec![(h, HDR_LEN, false), (resp, RESP_LEN, false)],
            0,
        ),
        (
            "response outside guest memory",
            vec![(h, HDR_LEN, false), (0x7FFF_0000, RESP_LEN, true)],
            0,
        ),
    ];
    for (what, chain, len) in shapes {
        rig.mem
            .memory()
            .write_obj(0xEEEE_EEEEu32, GuestAddress(resp))
            .unwrap();
        rig.push(REQUEST_QUEUE, &chain);
        rig.kick(REQUEST_QUEUE as u16);
        let used = rig.used(REQUEST_QUEUE);
        assert_eq!(used.len(), 1, "{what}: the chain is returned");
        assert_eq!(used[0].1, len, "{what}");
        let status: u32 = rig.get(resp);
        if len > 0 {
            assert_eq!(status, STATUS_IOERR, "{what}");
        } else if what != "response outside guest memory" {
            assert_eq!(status, 0xEEEE_EEEE, "{what}: nothing written");
        }
    }
    assert_eq!(commands(&rig), before, "nothing reached the card");
    // Still serving.
    assert_eq!(state(rig.status()), CardState::Tran.number());
}

#[test]
fn control_requests_set_and_report_ios_time_and_card_detect() {
    let mut rig = Rig::new(model(0), Pacing::Off);
    let t = rig.control(CTRL_GET_TIME, 0, 0);
    assert_eq!(t.status, STATUS_OK);
    rig.set_ios(26_000_000, 4, TIMING_HS, POWER_ON);
    let ios = rig.control(CTRL_GET_IOS, 0, 0);
    assert_eq!(ios.val0, 26_000_000);
    assert_eq!(
        ios.val1,
        4 | u64::from(TIMING_HS) << 8 | u64::from(POWER_ON) << 16
    );
    let cd = rig.control(CTRL_GET_CD_RO, 0, 0);
    assert_eq!(cd.val0, CD_PRESENT, "present, not write-protected");
    let later = t.now_ns + 7_000_000;
    let idle = rig.control(CTRL_IDLE_UNTIL, later, 0);
    assert_eq!((idle.status, idle.now_ns), (STATUS_OK, later));
    assert_eq!(rig.control(CTRL_GET_TIME, 0, 0).now_ns, later);
    let far = rig.control(CTRL_IDLE_UNTIL, u64::MAX, 0);
    assert_eq!(
        far.status, STATUS_IOERR,
        "the card's clock is not thrown to the end"
    );
    assert_eq!(far.now_ns, later);
    let tuning = rig.control(CTRL_EXECUTE_TUNING, 0, 0);
    assert_eq!(
        (tuning.status, tuning.val0),
        (STATUS_OK, 0),
        "no tuning outside HS200"
    );
    for (what, kind, arg0, arg1, status) in [
        ("unknown kind", 99, 0, 0, STATUS_UNSUPP),
        (
            "bus width 3",
            CTRL_SET_IOS,
            400_000,
            3 | 2 << 16,
            STATUS_IOERR,
        ),
        (
            "timing 7",
            CTRL_SET_IOS,
            400_000,
            1 | 7 << 8 | 2 << 16,
            STATUS_IOERR,
        ),
        ("power 3", CTRL_SET_IOS, 400_000, 1 | 3 << 16, STATUS_IOERR),
        (
            "above f_max",
            CTRL_SET_IOS,
            1 << 40,
            1 | 2 << 16,
            STATUS_IOERR,
        ),
        ("below f_min", CTRL_SET_IOS, 1000, 1 | 2 << 16, STATUS_IOERR),
        (
            "reserved bits",
            CTRL_SET_IOS,
            400_000,
            1 | 2 << 16 | 1 << 30,
            STATUS_IOERR,
        ),
    ] {
        assert_eq!(rig.control(kind, arg0, arg1).status, status, "{what}");
    }
    assert_eq!(
        rig.control(CTRL_GET_IOS, 0, 0).val0,
        26_000_000,
        "unchanged"
    );
    // A malformed control chain.
    let req = rig.put(VirtioMmcCtrlReq::default());
    let resp = rig.alloc(u64::from(CTRL_RESP_LEN));
    rig.push(
        CONTROL_QUEUE,
        &[(req, CTRL_REQ_LEN - 8, false), (resp, CTRL_RESP_LEN, true)],
    );
    rig.kick(CONTROL_QUEUE as u16);
    assert_eq!(rig.used(CONTROL_QUEUE).len(), 1);
    let r: VirtioMmcCtrlResp = rig.get(resp);
    assert_eq!(r.status, STATUS_IOERR);
}

#[test]
fn power_off_through_set_ios_is_a_power_cut() {
    let mut rig = Rig::new(model(0), Pacing::Off);
    rig.bring_up();
    // A write into the volatile cache, never flushed.
    let buf = rig.alloc(512);
    rig.mem
        .memory()
        .write_slice(&[0xA5; 512], GuestAddress(buf))
        .unwrap();
    let w = VirtioMmcReqHdr {
        flags: REQ_F_DATA | REQ_F_WRITE,
        blksz: 512,
        blocks: 1,
        ..hdr(cmd(24, 10, RESP_R1))
    };
    let r = rig.request(w, &[(buf, 512)]);
    assert_eq!(r.data_error, ERR_NONE);
    assert!(!rig
        .backend
        .with_device(|d| d.card().volatile_sectors().is_empty()));
    rig.set_ios(0, 1, TIMING_LEGACY, POWER_OFF);
    let r = rig.command(13, RCA, RESP_R1);
    assert_eq!(r.cmd.error, ERR_CMD_TIMEOUT, "no power, no answer");
    rig.bring_up();
    let back = rig.alloc(512);
    let rd = VirtioMmcReqHdr {
        flags: REQ_F_DATA,
        blksz: 512,
        blocks: 1,
        ..hdr(cmd(17, 10, RESP_R1))
    };
    let r = rig.request(rd, &[(back, 512)]);
    assert_eq!(r.data_error, ERR_NONE);
    let mut got = [0xFFu8; 512];
    rig.mem
        .memory()
        .read_slice(&mut got, GuestAddress(back))
        .unwrap();
    assert_eq!(got, [0u8; 512], "the cached write was lost with the power");
}

#[test]
fn realtime_pacing_holds_completions_until_their_card_time() {
    let mut m = model(20_000_000); // 20 ms to program
    m.ext_csd.cache_size = 0;
    let mut rig = Rig::new(m, Pacing::Realtime { scale: 1.0 });
    // Bring-up completes in real time too: wait for each step.
    let wait = |rig: &mut Rig, q: usize| -> Duration {
        let t0 = Instant::now();
        loop {
            assert!(t0.elapsed() < Duration::from_secs(5), "never completed");
            rig.tick();
            if !rig.used(q).is_empty() {
                return t0.elapsed();
            }
            std::thread::sleep(Duration::from_micros(200));
        }
    };
    rig.stage_control(CTRL_GET_TIME, 0, 0);
    rig.kick(CONTROL_QUEUE as u16);
    wait(&mut rig, CONTROL_QUEUE);
    // Straight to a write: CMD0, CMD1 ×2, CMD2, CMD3, CMD7 at 400 kHz take milliseconds.
    for (op, arg, rt) in [
        (0, 0, RESP_NONE),
        (1, HOST_OCR, RESP_R3),
        (1, HOST_OCR, RESP_R3),
        (2, 0, RESP_R2),
        (3, RCA, RESP_R1),
        (7, RCA, RESP_R1B),
    ] {
        rig.stage(hdr(cmd(op, arg, rt)), &[]);
        rig.kick(REQUEST_QUEUE as u16);
        wait(&mut rig, REQUEST_QUEUE);
    }
    let buf = rig.alloc(512);
    let w = VirtioMmcReqHdr {
        flags: REQ_F_DATA | REQ_F_WRITE,
        blksz: 512,
        blocks: 1,
        ..hdr(cmd(24, 0, RESP_R1))
    };
    let start = Instant::now();
    let at = rig.stage(w, &[(buf, 512)]);
    rig.kick(REQUEST_QUEUE as u16);
    assert!(
        rig.used(REQUEST_QUEUE).is_empty(),
        "not before its card time"
    );
    wait(&mut rig, REQUEST_QUEUE);
    let took = start.elapsed();
    let r: VirtioMmcResp = rig.get(at);
    assert_eq!((r.status, r.data_error), (STATUS_OK, ERR_NONE));
    assert!(r.end_ns - r.start_ns >= 20_000_000);
    assert!(
        took >= Duration::from_millis(20),
        "completed after {took:?}, the card took {} ns",
        r.end_ns - r.start_ns
    );
    // IDLE_UNTIL completes when its card time has come.
    let now = rig.backend.card_now();
    rig.stage_control(CTRL_IDLE_UNTIL, now + 15_000_000, 0);
    let start = Instant::now();
    rig.kick(CONTROL_QUEUE as u16);
    assert!(rig.used(CONTROL_QUEUE).is_empty());
    wait(&mut rig, CONTROL_QUEUE);
    assert!(start.elapsed() >= Duration::from_millis(14));
    let stats = rig.backend.pacing_stats();
    assert!(stats.completed >= 9);
    assert!(stats.wake_late.count() >= 1, "the timer fired");
}

/// Paced, the mmc transport's trace says where its card time is on CLOCK_MONOTONIC, as
/// the blk transport's does: each request's arrival, taken there, falls between the
/// instants the driver read just before and just after making it available.
#[test]
fn a_paced_trace_places_its_card_time_on_the_monotonic_clock() {
    use crate::pacing::monotonic_ns;
    let mut rig = Rig::new(model(0), Pacing::Realtime { scale: 1.0 });
    let file = tempfile::NamedTempFile::new().unwrap();
    rig.backend
        .set_trace(crate::trace::open(file.path(), rig.backend.card_now(), "test").unwrap());
    let mut kicked = Vec::new();
    for (op, arg, rt) in [(0, 0, RESP_NONE), (1, HOST_OCR, RESP_R3)] {
        rig.stage(hdr(cmd(op, arg, rt)), &[]);
        let before = monotonic_ns();
        rig.kick(REQUEST_QUEUE as u16);
        kicked.push((before, monotonic_ns()));
        let t0 = Instant::now();
        while rig.used(REQUEST_QUEUE).is_empty() {
            assert!(
                t0.elapsed() < Duration::from_secs(5),
                "CMD{op} never completed"
            );
            rig.tick();
            std::thread::sleep(Duration::from_micros(200));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    rig.backend.shutdown();
    let text = std::fs::read_to_string(file.path()).unwrap();
    let anchors = crate::trace::clock_anchors(&text);
    assert_eq!(anchors.len(), 1, "one clock line per session:\n{text}");
    let (card0, mono0) = anchors[0];
    // CMD0 and CMD1 have no trace operation: each is a comment `# <time> CMDn ...`.
    let arrivals: Vec<u64> = text
        .lines()
        .filter_map(|l| l.strip_prefix("# "))
        .filter(|l| {
            l.split_whitespace()
                .nth(1)
                .is_some_and(|w| w.starts_with("CMD"))
        })
        .map(|l| l.split_whitespace().next().unwrap().parse().unwrap())
        .collect();
    assert_eq!(arrivals.len(), 2, "{text}");
    for (at, (before, after)) in arrivals.into_iter().zip(kicked) {
        let arrival = mono0 + (at - card0);
        assert!(
            before <= arrival && arrival <= after,
            "arrival at {arrival} ns on CLOCK_MONOTONIC, made available between {before} \
             and {after}"
        );
    }
}

#[test]
fn urgent_bkops_posts_an_exception_and_a_bkops_event_once() {
    let mut rig = Rig::new(model(0), Pacing::Off);
    rig.bring_up();
    let ev: Vec<u64> = (0..3).map(|_| rig.alloc(u64::from(EVENT_LEN))).collect();
    for &e in &ev {
        rig.push(EVENT_QUEUE, &[(e, EVENT_LEN, true)]);
    }
    rig.kick(EVENT_QUEUE as u16);
    assert!(rig.used(EVENT_QUEUE).is_empty(), "buffers wait for events");
    rig.backend
        .with_device(|d| d.host_mut().card.add_background_work(3_000_000));
    let s = rig.status();
    assert_ne!(s & r1::EXCEPTION_EVENT, 0, "R1 {s:#010x}");
    let used = rig.used(EVENT_QUEUE);
    assert_eq!(used.iter().map(|u| u.1).collect::<Vec<_>>(), [EVENT_LEN; 2]);
    let exception: VirtioMmcEvent = rig.get(ev[0]);
    assert_eq!(exception.kind, EVENT_EXCEPTION);
    assert_eq!(
        exception.val & u32::from(ext::EE_URGENT_BKOPS),
        u32::from(ext::EE_URGENT_BKOPS)
    );
    let bkops: VirtioMmcEvent = rig.get(ev[1]);
    assert_eq!((bkops.kind, bkops.val), (EVENT_BKOPS_NEEDED, 2));
    assert_eq!(bkops.at_ns, exception.at_ns);
    // Still raised: no new events.
    assert_ne!(rig.status() & r1::EXCEPTION_EVENT, 0);
    assert!(
        rig.used(EVENT_QUEUE).is_empty(),
        "one event per rising edge"
    );
    // The driver runs BKOPS to the end; the exception clears.
    rig.switch(ext::BKOPS_EN, ext::BKOPS_MANUAL_EN);
    rig.switch(ext::BKOPS_START, 1);
    let w = rig.control(CTRL_WAIT_BUSY, u64::MAX, 0);
    assert_eq!(w.val0, 1);
    assert_eq!(rig.status() & r1::EXCEPTION_EVENT, 0);
    // Raised again: the last buffer takes the exception; BKOPS_NEEDED is dropped.
    rig.backend
        .with_device(|d| d.host_mut().card.add_background_work(3_000_000));
    assert_ne!(rig.status() & r1::EXCEPTION_EVENT, 0);
    assert_eq!(rig.used(EVENT_QUEUE).len(), 1);
    assert_eq!(rig.get::<VirtioMmcEvent>(ev[2]).kind, EVENT_EXCEPTION);
    assert_eq!(state(rig.status()), CardState::Tran.number(), "serving on");
}

#[test]
fn config_space_describes_the_host() {
    let rig = Rig::new(model(0), Pacing::Off);
    let bytes = rig.backend.get_config(0, 48);
    let c = *VirtioMmcConfig::from_slice(&bytes).unwrap();
    assert_eq!(c.caps & CAP_8_BIT_DATA, CAP_8_BIT_DATA);
    assert_eq!(c.caps & CAP_MMC_HIGHSPEED, CAP_MMC_HIGHSPEED);
    assert_eq!(
        c.caps & CAP2_HS200,
        0,
        "generic-emmc45's host runs high speed"
    );
    assert_eq!(c.caps & CAP_AUTO_CMD23, CAP_AUTO_CMD23);
    assert_eq!((c.max_segs, c.max_seg_size), (128, 65_536));
    assert_eq!((c.max_blk_size, c.max_blk_count), (2048, 65_535));
    assert_eq!(c.max_req_size, 512 * 1024);
    assert_eq!(c.f_max, 52_000_000);
    assert!(c.max_busy_timeout_ms > 0);
    assert_eq!(rig.backend.get_config(40, 4), c.ocr_avail.to_le_bytes());
    assert!(rig.backend.get_config(40, 16).is_empty(), "outside");
    assert!(rig.backend.get_config(u32::MAX, u32::MAX).is_empty());
    assert_eq!(rig.backend.num_queues(), 3);
    let f = rig.backend.features();
    for bit in [28u32, 29, 32] {
        assert_ne!(f & (1 << bit), 0, "feature bit {bit}");
    }
}

#[test]
fn with_event_idx_requests_and_control_requests_are_served_as_without() {
    let mut rig = Rig::new(model(0), Pacing::Off).with_event_idx();
    rig.bring_up();
    // Several requests and a control request in one notification.
    let a = rig.stage(hdr(cmd(13, RCA, RESP_R1)), &[]);
    let b = rig.stage(hdr(cmd(13, RCA, RESP_R1)), &[]);
    let c = rig.stage_control(CTRL_GET_TIME, 0, 0);
    rig.kick(REQUEST_QUEUE as u16);
    assert_eq!(rig.used(REQUEST_QUEUE).len(), 2);
    assert_eq!(
        rig.used(CONTROL_QUEUE).len(),
        1,
        "taken on the same notification"
    );
    let (ra, rb): (VirtioMmcResp, VirtioMmcResp) = (rig.get(a), rig.get(b));
    assert_eq!(state(ra.cmd.resp[0]), CardState::Tran.number());
    assert!(rb.start_ns >= ra.end_ns, "one at a time, in order");
    let t: VirtioMmcCtrlResp = rig.get(c);
    assert!(t.now_ns >= rb.end_ns, "the control request ran after both");
    // The device re-armed notifications: avail_event follows what it consumed.
    let m = rig.mem.memory();
    let r = &rig.rings[REQUEST_QUEUE];
    let avail_event: u16 = m
        .read_obj(GuestAddress(r.used_ring + 4 + 8 * u64::from(QUEUE_LEN)))
        .unwrap();
    assert_eq!(avail_event, r.next_avail);
}

#[test]
fn a_corrupt_avail_index_neither_hangs_nor_panics_the_device() {
    for event_idx in [false, true] {
        let mut rig = Rig::new(model(0), Pacing::Off);
        if event_idx {
            rig = rig.with_event_idx();
        }
        // The driver claims 1000 more chains than the ring holds.
        let r = &rig.rings[REQUEST_QUEUE];
        rig.mem
            .memory()
            .write_obj(1000u16, GuestAddress(r.avail + 2))
            .unwrap();
        rig.kick(REQUEST_QUEUE as u16);
        assert!(rig.used(REQUEST_QUEUE).is_empty(), "event_idx {event_idx}");
        // The control queue still works.
        assert_eq!(rig.control(CTRL_GET_TIME, 0, 0).status, STATUS_OK);
    }
}

#[test]
fn card_time_never_runs_to_the_end_of_its_range() {
    let mut rig = Rig::new(model(0), Pacing::Off);
    rig.bring_up();
    // A guest that idled its card for a century and a half, an hour at a time.
    rig.backend
        .with_device(|d| d.host_mut().now = CARD_TIME_LIMIT - 1000);
    let r = rig.control(CTRL_IDLE_UNTIL, CARD_TIME_LIMIT, 0);
    assert_eq!(r.status, STATUS_IOERR);
    assert_eq!(
        rig.control(CTRL_IDLE_UNTIL, CARD_TIME_LIMIT - 1, 0).status,
        STATUS_OK
    );
    // This one still runs, and takes the card past the limit…
    let s = rig.command(13, RCA, RESP_R1);
    assert!(s.end_ns >= CARD_TIME_LIMIT);
    // …so the next is refused.
    let commands = rig.backend.with_device(|d| d.card().stats().commands);
    let at = rig.stage(hdr(cmd(13, RCA, RESP_R1)), &[]);
    rig.kick(REQUEST_QUEUE as u16);
    assert_eq!(rig.used(REQUEST_QUEUE).len(), 1);
    assert_eq!(rig.get::<VirtioMmcResp>(at).status, STATUS_IOERR);
    assert_eq!(
        rig.backend.with_device(|d| d.card().stats().commands),
        commands,
        "nothing reached the card"
    );
}

#[test]
fn a_new_session_finds_the_cache_written_back_and_the_host_reset() {
    let mut rig = Rig::new(model(0), Pacing::Off);
    rig.bring_up();
    let buf = rig.alloc(512);
    rig.mem
        .memory()
        .write_slice(&[0x3C; 512], GuestAddress(buf))
        .unwrap();
    let w = VirtioMmcReqHdr {
        flags: REQ_F_DATA | REQ_F_WRITE,
        blksz: 512,
        blocks: 1,
        ..hdr(cmd(24, 20, RESP_R1))
    };
    assert_eq!(rig.request(w, &[(buf, 512)]).data_error, ERR_NONE);
    assert!(!rig
        .backend
        .with_device(|d| d.card().volatile_sectors().is_empty()));
    // The frontend leaves; the daemon restarts the card for the next one.
    rig.backend.restart();
    assert!(
        rig.backend
            .with_device(|d| d.card().volatile_sectors().is_empty()),
        "the cache was written back"
    );
    assert_eq!(
        rig.backend.with_device(|d| d.card().state()),
        CardState::Idle
    );
    // The next frontend (same rings here) maps its memory and finds reset settings.
    rig.backend.update_memory(rig.mem.clone()).unwrap();
    let ios = rig.control(CTRL_GET_IOS, 0, 0);
    assert_eq!(ios.val0, 400_000);
    assert_eq!(
        ios.val1,
        1 | u64::from(TIMING_LEGACY) << 8 | u64::from(POWER_ON) << 16
    );
    rig.bring_up();
    let back = rig.alloc(512);
    let rd = VirtioMmcReqHdr {
        flags: REQ_F_DATA,
        blksz: 512,
        blocks: 1,
        ..hdr(cmd(17, 20, RESP_R1))
    };
    assert_eq!(rig.request(rd, &[(back, 512)]).data_error, ERR_NONE);
    let mut got = [0u8; 512];
    rig.mem
        .memory()
        .read_slice(&mut got, GuestAddress(back))
        .unwrap();
    assert_eq!(got, [0x3C; 512], "the write survived the session change");
}

#[test]
fn shutdown_writes_the_cache_back() {
    let mut rig = Rig::new(model(0), Pacing::Off);
    rig.bring_up();
    let buf = rig.alloc(4096);
    let w = VirtioMmcReqHdr {
        flags: REQ_F_SBC | REQ_F_DATA | REQ_F_WRITE,
        sbc: cmd(23, 8, RESP_R1),
        blksz: 512,
        blocks: 8,
        ..hdr(cmd(25, 800, RESP_R1))
    };
    assert_eq!(rig.request(w, &[(buf, 4096)]).data_error, ERR_NONE);
    assert!(!rig
        .backend
        .with_device(|d| d.card().volatile_sectors().is_empty()));
    rig.backend.shutdown();
    assert!(rig
        .backend
        .with_device(|d| d.card().volatile_sectors().is_empty()));
}

/// Requests made available together run one after another on the single slot, each
/// completion signalled at its own card time.
#[test]
fn in_real_time_queued_requests_start_when_the_one_before_ended() {
    let mut rig = Rig::new(model(0), Pacing::Realtime { scale: 1.0 });
    // IDLE_UNTIL 10 ms, then CMD0, then IDLE_UNTIL 20 ms: one notification.
    let t0 = rig.backend.card_now();
    let a = rig.stage_control(CTRL_IDLE_UNTIL, t0 + 10_000_000, 0);
    let start = Instant::now();
    rig.kick(CONTROL_QUEUE as u16);
    let r = rig.stage(hdr(cmd(0, 0, RESP_NONE)), &[]);
    rig.kick(REQUEST_QUEUE as u16);
    let b = rig.stage_control(CTRL_IDLE_UNTIL, t0 + 20_000_000, 0);
    rig.kick(CONTROL_QUEUE as u16);
    let mut seen = Vec::new();
    while seen.len() < 3 {
        assert!(start.elapsed() < Duration::from_secs(5), "never completed");
        rig.tick();
        for q in [CONTROL_QUEUE, REQUEST_QUEUE] {
            for _ in rig.used(q) {
                seen.push((q, start.elapsed()));
            }
        }
        std::thread::sleep(Duration::from_micros(200));
    }
    let ra: VirtioMmcCtrlResp = rig.get(a);
    let rr: VirtioMmcResp = rig.get(r);
    let rb: VirtioMmcCtrlResp = rig.get(b);
    assert_eq!(ra.now_ns, t0 + 10_000_000);
    assert!(
        rr.start_ns >= ra.now_ns,
        "CMD0 waited for the idle before it"
    );
    assert_eq!(rb.now_ns, t0 + 20_000_000);
    assert_eq!(
        seen.iter().map(|s| s.0).collect::<Vec<_>>(),
        [CONTROL_QUEUE, REQUEST_QUEUE, CONTROL_QUEUE],
        "completions in card-time order"
    );
    assert!(seen[0].1 >= Duration::from_millis(10), "{seen:?}");
    assert!(seen[2].1 >= Duration::from_millis(20), "{seen:?}");
}

#[test]
fn injected_faults_reach_the_guest_as_the_controller_reports_them() {
    let mut rig = Rig::new(model(0), Pacing::Off);
    rig.bring_up();
    let plan = emmc_host::fault::FaultPlan::from_toml_str(
        "[[rule]]\ncommand = 18\nnth = 1\neffect = { kind = \"data_crc\" }\n\
         [[rule]]\ncommand = 13\nnth = 1\neffect = { kind = \"cmd_timeout\" }\n",
    )
    .unwrap();
    rig.backend.with_device(|d| {
        d.set_fault_injector(Some(emmc_host::fault::FaultInjector::new(plan).unwrap()))
    });
    let back = rig.alloc(4096);
    let read = VirtioMmcReqHdr {
        flags: REQ_F_SBC | REQ_F_DATA,
        sbc: cmd(23, 8, RESP_R1),
        blksz: 512,
        blocks: 8,
        ..hdr(cmd(18, 0, RESP_R1))
    };
    let at = rig.stage(read, &[(back, 4096)]);
    rig.kick(REQUEST_QUEUE as u16);
    rig.used(REQUEST_QUEUE);
    let r: VirtioMmcResp = rig.get(at);
    assert_eq!((r.data_error, r.bytes_xfered), (ERR_DATA_CRC, 0));
    assert_ne!(r.int_status >> 16 & u32::from(error_int::DATA_CRC), 0);
    // The CMD13 the plan corrupts goes unanswered; the card reports COM_CRC_ERROR next.
    let at = rig.stage(hdr(cmd(13, 1 << 16, RESP_R1)), &[]);
    rig.kick(REQUEST_QUEUE as u16);
    rig.used(REQUEST_QUEUE);
    let r: VirtioMmcResp = rig.get(at);
    assert_eq!(r.cmd.error, ERR_CMD_TIMEOUT);
    assert_ne!(rig.status() & r1::COM_CRC_ERROR, 0);
    // A session restart keeps the plan (its rules fired already) and the device serves.
    rig.backend.with_device(|d| {
        d.restart();
        assert_eq!(d.fault_injector_mut().map(|f| f.history().len()), Some(2));
    });
}

/// A guest driver's traffic with `serve --trace` on: bring-up, a reliable CMD23+CMD25
/// write, a CMD23+CMD18 read, a packed write, a cache flush, a CMD13, a trim, and a read
/// of boot1. Returns the trace and the card-time origin it counts from, and each
/// request's (start, end) in card time.
fn traced_session() -> (String, Vec<(u64, u64)>) {
    let mut rig = Rig::new(model(0), Pacing::Off);
    let file = tempfile::NamedTempFile::new().unwrap();
    let origin = rig.backend.card_now();
    rig.backend
        .set_trace(crate::trace::open(file.path(), origin, "test").unwrap());
    rig.bring_up();
    let mut times = Vec::new();
    let mut span = |r: &VirtioMmcResp| times.push((r.start_ns - origin, r.end_ns - origin));

    let buf = rig.alloc(8192);
    let write = VirtioMmcReqHdr {
        flags: REQ_F_SBC | REQ_F_DATA | REQ_F_WRITE,
        sbc: cmd(23, 8 | emmc_card::packed::CMD23_RELIABLE_WRITE, RESP_R1),
        blksz: 512,
        blocks: 8,
        ..hdr(cmd(25, 1000, RESP_R1))
    };
    let r = rig.request(write, &[(buf, 4096)]);
    assert_eq!(r.bytes_xfered, 4096);
    span(&r);
    let read = VirtioMmcReqHdr {
        flags: REQ_F_SBC | REQ_F_DATA,
        sbc: cmd(23, 16, RESP_R1),
        blksz: 512,
        blocks: 16,
        ..hdr(cmd(18, 1000, RESP_R1))
    };
    let r = rig.request(read, &[(buf, 8192)]);
    assert_eq!(r.bytes_xfered, 8192);
    span(&r);
    // Packed write: a header and two entries, 8 blocks at 2000 and 4 reliable at 3000.
    use emmc_card::packed::{Direction, Entry, Header, CMD23_PACKED};
    let header = Header {
        direction: Direction::Write,
        entries: vec![Entry::new(8, 2000, false), Entry::new(4, 3000, true)],
    };
    let packed = rig.alloc(13 * 512);
    rig.mem
        .memory()
        .write_slice(&header.encode(), GuestAddress(packed))
        .unwrap();
    let write = VirtioMmcReqHdr {
        flags: REQ_F_SBC | REQ_F_DATA | REQ_F_WRITE,
        sbc: cmd(23, 13 | CMD23_PACKED, RESP_R1),
        blksz: 512,
        blocks: 13,
        ..hdr(cmd(25, 2000, RESP_R1))
    };
    let r = rig.request(write, &[(packed, 13 * 512)]);
    assert_eq!(r.bytes_xfered, 13 * 512);
    assert_eq!(r.cmd.resp[0] & r1::ERRORS, 0);
    span(&r);
    let r = rig.command(
        6,
        0x0300_0000 | (ext::FLUSH_CACHE as u32) << 16 | 1 << 8,
        RESP_R1B,
    );
    assert_eq!(r.cmd.error, ERR_NONE);
    span(&r);
    let r = rig.command(13, RCA, RESP_R1);
    span(&r);
    // Trim sectors 4096..=4100.
    for (op, arg, resp) in [(35, 4096, RESP_R1), (36, 4100, RESP_R1), (38, 1, RESP_R1B)] {
        let r = rig.command(op, arg, resp);
        assert_eq!(r.cmd.resp[0] & r1::ERRORS, 0, "CMD{op}");
        span(&r);
    }
    // A read of boot1 is no user-area request.
    rig.switch(ext::PARTITION_CONFIG, 1);
    let read = VirtioMmcReqHdr {
        flags: REQ_F_DATA,
        blksz: 512,
        blocks: 1,
        ..hdr(cmd(17, 0, RESP_R1))
    };
    let r = rig.request(read, &[(buf, 512)]);
    assert_eq!(r.bytes_xfered, 512);
    span(&r);
    rig.backend.shutdown();
    (std::fs::read_to_string(file.path()).unwrap(), times)
}

#[test]
fn the_mmc_trace_has_a_line_per_user_area_request_and_comments_for_the_rest() {
    let (text, t) = traced_session();
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines[0], "# test");
    // Bring-up is commands without data on the user area, or CMD8: all comments.
    let first = lines
        .iter()
        .position(|l| !l.starts_with('#'))
        .expect("data lines");
    assert!(lines[2..first]
        .iter()
        .all(|l| l.starts_with("# ") && l.contains(" CMD")));
    assert!(lines[2..first]
        .iter()
        .any(|l| l.contains(" CMD8 arg=0x00000000 ")));
    let want = [
        format!("{} WF 512000 4096 {}", t[0].0, t[0].1),
        format!("{} R 512000 8192 {}", t[1].0, t[1].1),
        format!("{} W 1024000 4096 {}", t[2].0, t[2].1),
        format!("{} WF 1536000 2048 {}", t[2].0, t[2].1),
        format!("{} F 0 0 {}", t[3].0, t[3].1),
        format!("# {} CMD13 arg=0x00010000 {}", t[4].0, t[4].1),
        format!("# {} CMD35 arg=0x00001000 {}", t[5].0, t[5].1),
        format!("# {} CMD36 arg=0x00001004 {}", t[6].0, t[6].1),
        format!("{} D 2097152 2560 {}", t[7].0, t[7].1),
    ];
    assert_eq!(lines[first..first + want.len()], want, "{text}");
    // The partition switch and its CMD13 are comments, and so is the read of boot1.
    let rest = &lines[first + want.len()..];
    assert_eq!(rest.len(), 3, "{text}");
    assert!(rest[0].contains(" CMD6 arg=0x03b30100 "), "{text}");
    assert!(rest[1].contains(" CMD13 arg=0x00010000 "), "{text}");
    assert_eq!(
        rest[2],
        format!("# {} CMD17 arg=0x00000000 {}", t[8].0, t[8].1)
    );
}

#[test]
fn the_mmc_trace_replays_with_the_simulators_parser() {
    let (text, _) = traced_session();
    assert_eq!(
        crate::testing::trace_ops(&text),
        crate::testing::TRACED_SESSION_OPS
    );
}

/// The guest's own driver is the host on this transport, so the host profile's software
/// time (request overhead: interrupt, set-up, completion of the host that measured the
/// seed figures) is not charged again in card time: a command takes the card and bus
/// time alone, whatever the profile says. The blk transport, whose driver this process
/// models, does charge it (`blk::tests`, `emmc_sim::device` tests).
#[test]
fn the_host_profiles_software_time_is_not_charged_to_a_real_driver() {
    let took = |overhead_ns: u64| {
        let mut m = model(0);
        m.host.request_overhead_ns = overhead_ns;
        m.host.prepare_ns = overhead_ns;
        let mut rig = Rig::new(m, Pacing::Off);
        let r = rig.command(0, 0, RESP_NONE);
        r.end_ns - r.start_ns
    };
    let plain = took(0);
    assert!(plain > 0, "CMD0 takes its bus time");
    assert_eq!(took(5_000_000), plain);
}
