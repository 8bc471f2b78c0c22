//! A small test host: drives a `Card` the way the Linux MMC core would, with card time
//! advancing by waiting out every busy period. Shared by the card's integration tests.
#![allow(dead_code)]

use emmc_card::model::DeviceModel;
use emmc_card::store::MemStore;
use emmc_card::timing::Nanos;
use emmc_card::{r1, Card, CardState, Command, Partition, Response};

pub const RCA: u32 = 1;
pub const RCA_ARG: u32 = RCA << 16;

/// EXT_CSD offsets used by the tests (mirrors of the card's constants, so a test catches
/// a constant that moved).
pub mod ext {
    pub const FLUSH_CACHE: u8 = 32;
    pub const CACHE_CTRL: u8 = 33;
    pub const POWER_OFF_NOTIFICATION: u8 = 34;
    pub const PACKED_FAILURE_INDEX: usize = 35;
    pub const PACKED_COMMAND_STATUS: usize = 36;
    pub const EXCEPTION_EVENTS_STATUS: usize = 54;
    pub const EXCEPTION_EVENTS_CTRL: u8 = 56;
    pub const GP_SIZE_MULT: u8 = 143;
    pub const PARTITION_SETTING_COMPLETED: u8 = 155;
    pub const HPI_MGMT: u8 = 161;
    pub const BKOPS_EN: u8 = 163;
    pub const BKOPS_START: u8 = 164;
    pub const SANITIZE_START: u8 = 165;
    pub const BOOT_WP: u8 = 173;
    pub const BOOT_WP_STATUS: usize = 174;
    pub const ERASE_GROUP_DEF: u8 = 175;
    pub const PARTITION_CONFIG: u8 = 179;
    pub const BUS_WIDTH: u8 = 183;
    pub const HS_TIMING: u8 = 185;
    pub const EXT_CSD_REV: usize = 192;
    pub const SEC_COUNT: usize = 212;
    pub const CORRECTLY_PRG_SECTORS_NUM: usize = 242;
    pub const BKOPS_STATUS: usize = 246;
}

pub fn model() -> DeviceModel {
    DeviceModel::load("generic-emmc45").expect("default model loads")
}

pub fn card_with(model: DeviceModel) -> Card {
    let layout = Card::layout_for(&model);
    Card::new(model, Box::new(MemStore::new(layout))).expect("card builds")
}

/// A test host around one card.
pub struct Host {
    pub card: Card,
    pub now: Nanos,
}

impl Host {
    pub fn new(model: DeviceModel) -> Host {
        Host {
            card: card_with(model),
            now: 0,
        }
    }

    /// A card brought to tran by the Linux init sequence.
    pub fn ready(model: DeviceModel) -> Host {
        let mut h = Host::new(model);
        h.init();
        h
    }

    pub fn cmd(&mut self, index: u8, arg: u32) -> Option<Response> {
        self.now += 1_000;
        self.card.execute(self.now, Command::new(index, arg))
    }

    /// Send a command that must answer with an R1/R1b; return its status.
    pub fn r1(&mut self, index: u8, arg: u32) -> u32 {
        match self.cmd(index, arg) {
            Some(Response::R1(s)) | Some(Response::R1b(s)) => s,
            other => panic!("CMD{index} arg {arg:#x}: expected R1, got {other:?}"),
        }
    }

    /// Wait (advance card time) until the card is no longer busy.
    pub fn wait_busy(&mut self) {
        if let Some(end) = self.card.busy_until() {
            self.now = self.now.max(end);
        }
        self.card.advance(self.now);
    }

    /// R1b command, then wait for busy to end.
    pub fn r1b(&mut self, index: u8, arg: u32) -> u32 {
        let s = self.r1(index, arg);
        self.wait_busy();
        s
    }

    pub fn status(&mut self) -> u32 {
        self.r1(13, RCA_ARG)
    }

    pub fn state(&mut self) -> u32 {
        (self.status() & r1::CURRENT_STATE_MASK) >> r1::CURRENT_STATE_SHIFT
    }

    /// CMD6 write byte, wait, then CMD13: returns the CMD13 status (SWITCH_ERROR shows there).
    pub fn switch(&mut self, index: u8, value: u8) -> u32 {
        let arg = 0x0300_0000 | u32::from(index) << 16 | u32::from(value) << 8;
        let s = self.r1b(6, arg);
        assert_eq!(
            s & r1::ERRORS,
            0,
            "CMD6 response to {index}:={value} has errors: {}",
            r1::describe(s)
        );
        self.status()
    }

    pub fn switch_ok(&mut self, index: u8, value: u8) {
        let s = self.switch(index, value);
        assert_eq!(
            s & (r1::SWITCH_ERROR | r1::ERRORS),
            0,
            "switch {index}:={value}: {}",
            r1::describe(s)
        );
    }

    /// The Linux MMC core's bring-up: CMD0, CMD1 until ready (sector mode), CMD2, CMD3,
    /// CMD9, CMD7, CMD8, then 8-bit bus, HS timing, cache, BKOPS and HPI on.
    pub fn init(&mut self) {
        self.init_with(true);
    }

    /// The bring-up without enabling BKOPS (BKOPS_EN is one-time programmable).
    pub fn init_without_bkops(&mut self) {
        self.init_with(false);
    }

    fn init_with(&mut self, bkops: bool) {
        assert_eq!(self.cmd(0, 0), None);
        let ocr_probe = self.cmd(1, 0);
        assert!(matches!(ocr_probe, Some(Response::R3(_))));
        assert_eq!(self.cmd(0, 0), None);
        let mut polls = 0;
        loop {
            polls += 1;
            assert!(polls < 100, "CMD1 never reported power-up done");
            match self.cmd(1, 0x40FF_8080) {
                Some(Response::R3(ocr)) if ocr & (1 << 31) != 0 => break,
                Some(Response::R3(_)) => continue,
                other => panic!("CMD1: {other:?}"),
            }
        }
        assert!(matches!(self.cmd(2, 0), Some(Response::R2(_))));
        assert_eq!(self.r1(3, RCA_ARG) & !r1::DEVICE_IS_LOCKED, 0x0000_0500);
        assert!(matches!(self.cmd(9, RCA_ARG), Some(Response::R2(_))));
        self.r1(7, RCA_ARG);
        let _ = self.ext_csd();
        self.switch_ok(ext::ERASE_GROUP_DEF, 1);
        self.switch_ok(ext::POWER_OFF_NOTIFICATION, 1);
        self.switch_ok(ext::BUS_WIDTH, 2);
        self.switch_ok(ext::HS_TIMING, 1);
        let ext_csd = self.ext_csd();
        if bkops && ext_csd[502] & 1 != 0 && ext_csd[ext::BKOPS_EN as usize] == 0 {
            // BKOPS_EN is one-time; Linux leaves it to user space, tests turn it on.
            self.switch_ok(ext::BKOPS_EN, 1);
        }
        if ext_csd[503] & 1 != 0 {
            self.switch_ok(ext::HPI_MGMT, 1);
        }
        if u32::from_le_bytes(ext_csd[249..253].try_into().unwrap()) > 0 {
            self.switch_ok(ext::CACHE_CTRL, 1);
        }
        if ext_csd[500] >= 3 {
            self.switch_ok(ext::EXCEPTION_EVENTS_CTRL, 0x08);
        }
        assert_eq!(self.card.state(), CardState::Tran);
    }

    /// CMD8: read EXT_CSD.
    pub fn ext_csd(&mut self) -> [u8; 512] {
        let s = self.r1(8, 0);
        assert_eq!(s & r1::ERRORS, 0, "CMD8: {}", r1::describe(s));
        let mut buf = [0u8; 512];
        self.card
            .read_data(self.now, &mut buf)
            .expect("EXT_CSD data");
        buf
    }

    pub fn select_partition(&mut self, p: Partition) {
        let cfg = self.ext_csd()[ext::PARTITION_CONFIG as usize];
        let value = (cfg & !0x07) | access_bits(p);
        self.switch_ok(ext::PARTITION_CONFIG, value);
    }

    /// Address argument for `lba` (sector or byte addressing).
    pub fn addr(&self, lba: u64) -> u32 {
        if self.card.model().sector_addressing() {
            lba as u32
        } else {
            (lba * 512) as u32
        }
    }

    /// CMD23 + CMD25 (closed-ended) write, waiting for programming to end. Returns the
    /// CMD25 response status.
    pub fn write(&mut self, lba: u64, data: &[u8], cmd23_flags: u32) -> u32 {
        let blocks = (data.len() / 512) as u32;
        let s = self.r1(23, blocks | cmd23_flags);
        assert_eq!(s & r1::ERRORS, 0, "CMD23: {}", r1::describe(s));
        let s = self.r1(25, self.addr(lba));
        if s & r1::ERRORS == 0 {
            self.card
                .write_data(self.now, data)
                .expect("write data accepted");
            self.wait_busy();
        }
        s
    }

    /// CMD25 without CMD23, ended by CMD12.
    pub fn write_open_ended(&mut self, lba: u64, data: &[u8]) -> u32 {
        let s = self.r1(25, self.addr(lba));
        if s & r1::ERRORS == 0 {
            self.card
                .write_data(self.now, data)
                .expect("write data accepted");
            self.r1b(12, 0);
        }
        s
    }

    /// CMD24 single block.
    pub fn write_single(&mut self, lba: u64, block: &[u8]) -> u32 {
        let s = self.r1(24, self.addr(lba));
        if s & r1::ERRORS == 0 {
            self.card
                .write_data(self.now, block)
                .expect("block accepted");
            self.wait_busy();
        }
        s
    }

    /// CMD23 + CMD18 read.
    pub fn read(&mut self, lba: u64, blocks: usize) -> Vec<u8> {
        let s = self.r1(23, blocks as u32);
        assert_eq!(s & r1::ERRORS, 0);
        let s = self.r1(18, self.addr(lba));
        assert_eq!(s & r1::ERRORS, 0, "CMD18 at {lba}: {}", r1::describe(s));
        let mut buf = vec![0u8; blocks * 512];
        self.card.read_data(self.now, &mut buf).expect("read data");
        assert_eq!(self.card.state(), CardState::Tran);
        buf
    }

    /// CMD18 ended by CMD12.
    pub fn read_open_ended(&mut self, lba: u64, blocks: usize) -> Vec<u8> {
        let s = self.r1(18, self.addr(lba));
        assert_eq!(s & r1::ERRORS, 0);
        let mut buf = vec![0u8; blocks * 512];
        self.card.read_data(self.now, &mut buf).expect("read data");
        self.r1(12, 0);
        buf
    }

    /// CMD17 single block.
    pub fn read_single(&mut self, lba: u64) -> Vec<u8> {
        let s = self.r1(17, self.addr(lba));
        assert_eq!(s & r1::ERRORS, 0);
        let mut buf = vec![0u8; 512];
        self.card.read_data(self.now, &mut buf).expect("read data");
        buf
    }

    /// CMD35/36/38 with `arg`, waiting for the erase.
    pub fn erase(&mut self, start: u64, end: u64, arg: u32) -> u32 {
        let a = self.addr(start);
        let b = self.addr(end);
        assert_eq!(self.r1(35, a) & r1::ERRORS, 0);
        assert_eq!(self.r1(36, b) & r1::ERRORS, 0);
        self.r1b(38, arg);
        self.status()
    }
}

/// Compare data without printing kilobytes on failure: name the first differing byte.
#[macro_export]
macro_rules! assert_data_eq {
    ($left:expr, $right:expr $(, $($msg:tt)+)?) => {{
        let (l, r): (&[u8], &[u8]) = (&$left[..], &$right[..]);
        if l != r {
            let at = l.iter().zip(r).position(|(a, b)| a != b).unwrap_or(l.len().min(r.len()));
            panic!(
                "data differs{}: lengths {} / {}, first difference at byte {} (sector {}): {:?} vs {:?}",
                { let _m = String::new(); $( let _m = format!(" ({})", format!($($msg)+)); )? _m },
                l.len(), r.len(), at, at / 512, l.get(at), r.get(at)
            );
        }
    }};
}

pub fn access_bits(p: Partition) -> u8 {
    match p {
        Partition::User => 0,
        Partition::Boot1 => 1,
        Partition::Boot2 => 2,
        Partition::Rpmb => 3,
        Partition::Gp(n) => 4 + n,
    }
}

/// Deterministic test data: each sector carries its tag and index.
pub fn pattern(tag: u8, blocks: usize) -> Vec<u8> {
    let mut v = vec![0u8; blocks * 512];
    for (i, b) in v.iter_mut().enumerate() {
        *b = tag
            .wrapping_mul(31)
            .wrapping_add((i / 512) as u8)
            .wrapping_add((i % 251) as u8);
    }
    v
}
