//! Fuzz target bodies (issue 7, "Hostile input"; `docs/robustness.md`).
//!
//! Each function turns arbitrary bytes into input for the real code a guest (or a device
//! model file) reaches, and asserts what must hold whatever the input: no panic, parsers
//! answer with errors, no access outside the addressed partition, the image or the guest
//! memory the request was given, and the card's reported state is one of the spec's.
//! `fuzz/` wraps each in a cargo-fuzz target; `crates/frontend/tests/fuzz_corpus.rs` runs them on stable
//! over the committed seeds and a seeded random corpus.
//!
//! A body panics (assertion) on a violated invariant; that is what the fuzzer reports.

use vm_memory::{Bytes, GuestAddress, GuestMemory, GuestMemoryMmap, Permissions};

use emmc_card::model::DeviceModel;
use emmc_card::packed::{Direction, Header};
use emmc_card::rpmb::{self, Rpmb, RpmbFrame, RpmbMedium, RpmbPersistent};
use emmc_card::store::{ImageLayout, MemStore, Store, StoreError};
use emmc_card::timing::Nanos;
use emmc_card::{r1, Card, Command, Response};

/// A fuzz target body.
pub type Body = fn(&[u8]);

/// Every target, by the name its cargo-fuzz target and corpus directory carry.
pub const TARGETS: &[(&str, Body)] = &[
    ("card_commands", card_commands),
    ("packed_header", packed_header),
    ("rpmb_frames", rpmb_frames),
    ("blk_chain", blk_chain),
    ("mmc_chain", mmc_chain),
    ("model_toml", model_toml),
];

/// Longest input a body looks at; more is ignored so one input stays cheap.
const MAX_INPUT: usize = 4096;

/// Bytes taken off the front of the input; zeros once it runs out.
struct Input<'a> {
    data: &'a [u8],
}

impl<'a> Input<'a> {
    fn new(data: &'a [u8]) -> Input<'a> {
        Input::with_cap(data, MAX_INPUT)
    }
    fn with_cap(data: &'a [u8], cap: usize) -> Input<'a> {
        Input {
            data: &data[..data.len().min(cap)],
        }
    }
    fn is_empty(&self) -> bool {
        self.data.is_empty()
    }
    fn u8(&mut self) -> u8 {
        match self.data.split_first() {
            Some((&b, rest)) => {
                self.data = rest;
                b
            }
            None => 0,
        }
    }
    fn u16(&mut self) -> u16 {
        u16::from_le_bytes([self.u8(), self.u8()])
    }
    fn u32(&mut self) -> u32 {
        u32::from_le_bytes([self.u8(), self.u8(), self.u8(), self.u8()])
    }
    fn u64(&mut self) -> u64 {
        u64::from(self.u32()) | u64::from(self.u32()) << 32
    }
    /// Up to `n` bytes (fewer when the input runs out).
    fn bytes(&mut self, n: usize) -> &'a [u8] {
        let n = n.min(self.data.len());
        let (head, rest) = self.data.split_at(n);
        self.data = rest;
        head
    }
}

// ---- a store that checks the card's accesses --------------------------------------------

/// A `MemStore` that asserts every access lies inside one area of the layout (boot1,
/// boot2, RPMB, user): the card must never address past a partition or the image, and
/// must never let one access straddle two areas.
struct CheckedStore {
    inner: MemStore,
    layout: ImageLayout,
}

impl CheckedStore {
    fn new(layout: ImageLayout) -> CheckedStore {
        CheckedStore {
            inner: MemStore::new(layout),
            layout,
        }
    }

    fn check(&self, what: &str, offset: u64, len: u64) {
        let l = &self.layout;
        let areas = [
            (l.boot1_offset(), l.boot_bytes),
            (l.boot2_offset(), l.boot_bytes),
            (l.rpmb_offset(), l.rpmb_bytes),
            (l.user_offset(), l.user_bytes),
        ];
        let end = offset.checked_add(len);
        let inside = areas.iter().any(|&(start, size)| {
            offset >= start && end.is_some_and(|e| e <= start + size) && size > 0
        });
        assert!(
            inside || len == 0,
            "card {what} of {len} bytes at image offset {offset} is not inside one area of {l:?}"
        );
    }
}

impl Store for CheckedStore {
    fn layout(&self) -> ImageLayout {
        self.layout
    }
    fn read_at(&mut self, offset: u64, buf: &mut [u8]) -> Result<(), StoreError> {
        self.check("read", offset, buf.len() as u64);
        self.inner.read_at(offset, buf)
    }
    fn write_at(&mut self, offset: u64, buf: &[u8]) -> Result<(), StoreError> {
        self.check("write", offset, buf.len() as u64);
        self.inner.write_at(offset, buf)
    }
    fn fill(&mut self, offset: u64, len: u64, byte: u8) -> Result<(), StoreError> {
        self.check("fill", offset, len);
        self.inner.fill(offset, len, byte)
    }
    fn sync(&mut self) -> Result<(), StoreError> {
        self.inner.sync()
    }
    fn load_card_state(&self) -> Option<toml::Table> {
        self.inner.load_card_state()
    }
    fn save_card_state(&mut self, state: &toml::Table) -> Result<(), StoreError> {
        self.inner.save_card_state(state)
    }
}

/// The default model shrunk to 64 MiB (byte addressing, small sparse store), or 4 GiB
/// (sector addressing) when `big`.
fn small_model(big: bool) -> DeviceModel {
    let mut m = DeviceModel::load("generic-emmc45").expect("built-in model loads");
    m.ext_csd.sec_count = if big { 8 << 20 } else { 128 << 10 };
    m
}

fn checked_card(model: DeviceModel) -> Card {
    let layout = Card::layout_for(&model);
    Card::new(model, Box::new(CheckedStore::new(layout))).expect("card builds")
}

/// A card and the card time, as a host drives it.
struct Bus {
    card: Card,
    now: Nanos,
}

const RCA_ARG: u32 = 1 << 16;

impl Bus {
    fn cmd(&mut self, index: u8, arg: u32) -> Option<Response> {
        self.now += 1_000;
        let resp = self.card.execute(self.now, Command::new(index, arg));
        check_response(index, resp);
        resp
    }

    fn wait_busy(&mut self) {
        if let Some(end) = self.card.busy_until() {
            self.now = self.now.max(end);
        }
        self.card.advance(self.now);
    }

    /// Linux's bring-up to tran: CMD0, CMD1 until ready, CMD2, CMD3, CMD7, bus width and
    /// HS timing (without the asserts of the test host: a broken card fails later checks).
    fn bring_up(&mut self) {
        self.cmd(0, 0);
        for _ in 0..100 {
            if let Some(Response::R3(ocr)) = self.cmd(1, 0x40FF_8080) {
                if ocr & (1 << 31) != 0 {
                    break;
                }
            }
        }
        self.cmd(2, 0);
        self.cmd(3, RCA_ARG);
        self.cmd(7, RCA_ARG);
        for (index, value) in [(175u32, 1u32), (183, 2), (185, 1), (33, 1)] {
            self.cmd(6, 0x0300_0000 | index << 16 | value << 8);
            self.wait_busy();
        }
    }

    fn switch(&mut self, index: u8, value: u8) {
        self.cmd(
            6,
            0x0300_0000 | u32::from(index) << 16 | u32::from(value) << 8,
        );
        self.wait_busy();
    }

    /// Write `data` (whole blocks) into the current transfer; the card may refuse.
    fn write(&mut self, data: &[u8]) {
        self.now += 1_000;
        let _ = self.card.write_data(self.now, data);
    }
}

/// What holds for any response: an R1's CURRENT_STATE names a state a response can
/// report (idle … slp; ina and irq never answer with R1).
fn check_response(index: u8, resp: Option<Response>) {
    if let Some(Response::R1(s) | Response::R1b(s)) = resp {
        let state = (s & r1::CURRENT_STATE_MASK) >> r1::CURRENT_STATE_SHIFT;
        assert!(
            state <= 10,
            "CMD{index}: R1 {s:#010x} reports state {state}, not a spec state"
        );
    }
}

// ---- card command sequences ----------------------------------------------------------------

/// Card command sequences: commands with arbitrary indices and arguments (some with a
/// bad CRC), data blocks written and read in the card's block length or not, time passing,
/// waits for busy and power cycles, from idle or from tran. Invariants: no panic; every
/// store access inside one area of the image (`CheckedStore`); every R1 names a spec
/// state; card time never goes backwards.
pub fn card_commands(data: &[u8]) {
    let mut input = Input::new(data);
    let flags = input.u8();
    let mut bus = Bus {
        card: checked_card(small_model(flags & 1 != 0)),
        now: 0,
    };
    if flags & 2 != 0 {
        bus.bring_up();
    }
    let mut ops = 0;
    let mut card_time = bus.card.now();
    while !input.is_empty() && ops < 256 {
        ops += 1;
        match input.u8() % 10 {
            0..=2 => {
                let index = input.u8() % 64;
                let arg = input.u32();
                bus.cmd(index, arg);
            }
            3 => {
                // A data block in the card's block length (or a ragged one).
                let blocks = usize::from(input.u8() % 4);
                let block_len = bus.card.transfer_block_len().unwrap_or(512);
                let ragged = usize::from(input.u8() % 2);
                let n = blocks * block_len + ragged;
                let mut buf = input.bytes(n).to_vec();
                buf.resize(n, 0xA5);
                bus.write(&buf);
            }
            4 => {
                let blocks = usize::from(input.u8() % 4);
                let block_len = bus.card.transfer_block_len().unwrap_or(512);
                let mut buf = vec![0u8; blocks * block_len];
                bus.now += 1_000;
                if let Ok(access) = bus.card.read_data(bus.now, &mut buf) {
                    // The card's access time: the host waits it out.
                    bus.now = bus.now.saturating_add(access);
                }
            }
            5 => bus.wait_busy(),
            6 => {
                bus.now += u64::from(input.u16()) * 1_000;
                bus.card.advance(bus.now);
            }
            7 => {
                // A command whose CRC the card found wrong: silent, COM_CRC_ERROR next.
                let index = input.u8() % 64;
                let arg = input.u32();
                bus.now += 1_000;
                assert!(bus
                    .card
                    .execute_checked(bus.now, Command::new(index, arg), false)
                    .is_none());
            }
            8 => {
                let how = if input.u8() & 1 == 0 {
                    emmc_card::PowerDown::Clean
                } else {
                    emmc_card::PowerDown::Sudden
                };
                bus.now += 1_000;
                bus.card.power_cycle(bus.now, how);
            }
            _ => {
                // A CMD6 write byte: reaches EXT_CSD fields quickly.
                let index = input.u8();
                let value = input.u8();
                bus.switch(index, value);
            }
        }
        assert!(bus.card.now() >= card_time, "card time went backwards");
        card_time = bus.card.now();
    }
}

// ---- packed command headers ----------------------------------------------------------------

/// Packed headers: the parser on any 512-byte block, both directions and any maximum,
/// then the block as the header of a packed write (and read) the card executes.
/// Invariants: no panic; an accepted header has 1..=max entries, no empty entry, and
/// encodes back to a block that parses to the same header; the card's packed command
/// stays inside the user area (`CheckedStore`).
pub fn packed_header(data: &[u8]) {
    let mut input = Input::new(data);
    let max = usize::from(input.u8());
    let mut block = input.bytes(512).to_vec();
    let short = block.len() < 512;
    for dir in [Direction::Read, Direction::Write] {
        match Header::parse(&block, dir, max) {
            Ok(h) => {
                assert!(!short, "a short header block was accepted");
                assert!(!h.entries.is_empty() && h.entries.len() <= max.min(63));
                assert!(h.entries.iter().all(|e| e.block_count() > 0));
                let again = Header::parse(&h.encode(), dir, max).expect("encoded header parses");
                assert_eq!(again.entries, h.entries);
                assert_eq!(again.direction, h.direction);
            }
            Err(e) => {
                let _ = e.to_string();
            }
        }
    }
    block.resize(512, 0);
    // Through the card: CMD23 with PACKED, then CMD25 (or CMD18 after a header write).
    let mut bus = Bus {
        card: checked_card(small_model(input.u8() & 1 != 0)),
        now: 0,
    };
    bus.bring_up();
    bus.switch(2, 63); // nothing: index 2 is reserved (a refused switch is fine too)
    let blocks = u32::from(input.u8() % 16) + 1;
    let write = block[1] != 1;
    bus.cmd(23, 1 << 30 | blocks);
    if write {
        bus.cmd(25, 0);
        bus.write(&block);
        for _ in 1..blocks {
            let mut data = input.bytes(512).to_vec();
            data.resize(512, 0x5A);
            bus.write(&data);
        }
        bus.cmd(12, 0);
        bus.wait_busy();
    } else {
        // A packed read: the header goes out with a packed write of one block first.
        bus.cmd(25, 0);
        bus.write(&block);
        bus.wait_busy();
        bus.cmd(23, blocks);
        bus.cmd(18, 0);
        let mut buf = vec![0u8; 512];
        for _ in 0..blocks {
            bus.now += 1_000;
            if bus.card.read_data(bus.now, &mut buf).is_err() {
                break;
            }
        }
        bus.cmd(12, 0);
        bus.wait_busy();
    }
    bus.cmd(13, RCA_ARG);
}

// ---- RPMB frames ----------------------------------------------------------------------------

/// An RPMB partition in memory that asserts every access lies inside it.
struct CheckedMedium {
    data: Vec<u8>,
}

impl CheckedMedium {
    fn range(&self, address: u16, len: usize) -> std::ops::Range<usize> {
        let start = usize::from(address) * rpmb::HALF_SECTOR;
        assert!(
            start + len <= self.data.len(),
            "RPMB access of {len} bytes at half sector {address} beyond the {}-byte partition",
            self.data.len()
        );
        start..start + len
    }
}

impl RpmbMedium for CheckedMedium {
    fn read(&mut self, address: u16, buf: &mut [u8]) -> bool {
        let r = self.range(address, buf.len());
        buf.copy_from_slice(&self.data[r]);
        true
    }
    fn write(&mut self, address: u16, data: &[u8]) -> bool {
        let r = self.range(address, data.len());
        self.data[r].copy_from_slice(data);
        true
    }
}

const FUZZ_KEY: [u8; rpmb::KEY_LEN] = [0x42; rpmb::KEY_LEN];

/// RPMB frames: a sequence of write transfers (arbitrary frames, or frames signed with a
/// known key and the current write counter so authenticated writes get past the MAC) and
/// read transfers of any length, on the RPMB state machine with an in-memory partition.
/// Invariants: no panic; a transfer that is not whole frames is refused; every medium
/// access inside the partition; the write counter only grows, and only by 1 per
/// authenticated write; responses are whole frames with a response type (0x01xx) or 0.
pub fn rpmb_frames(data: &[u8]) {
    let mut input = Input::new(data);
    let flags = input.u8();
    let size = (u64::from(flags % 4) + 1) * 128 * 1024;
    let persistent = RpmbPersistent {
        key: (flags & 4 != 0).then_some(FUZZ_KEY),
        write_counter: if flags & 8 != 0 { u32::MAX - 1 } else { 0 },
    };
    let mut rpmb = Rpmb::new(size, persistent);
    let mut medium = CheckedMedium {
        data: vec![0; size as usize],
    };
    let mut ops = 0;
    while !input.is_empty() && ops < 32 {
        ops += 1;
        let op = input.u8();
        let counter_before = rpmb.persistent().write_counter;
        match op % 4 {
            0 | 1 => {
                // Arbitrary frames, optionally signed (op & 4) with the counter (op & 8).
                let count = usize::from(input.u8() % 3) + 1;
                let ragged = op & 0x10 != 0;
                let mut frames: Vec<RpmbFrame> = (0..count)
                    .map(|_| {
                        let mut raw = [0u8; rpmb::FRAME_LEN];
                        let head = input.bytes(16);
                        // Fuzzed bytes go to the tail (the fields), the rest is data.
                        raw[rpmb::FRAME_LEN - head.len()..].copy_from_slice(head);
                        let mut f = RpmbFrame::parse(&raw);
                        if op & 0x40 == 0 {
                            // Mostly the five request types, so the fuzzer starts deep.
                            f.req_resp %= 6;
                        }
                        f
                    })
                    .collect();
                if op & 8 != 0 {
                    for f in &mut frames {
                        f.write_counter = rpmb.persistent().write_counter;
                    }
                }
                if op & 4 != 0 {
                    rpmb::sign_frames(&FUZZ_KEY, &mut frames);
                }
                let mut bytes = rpmb::frames_to_bytes(&frames);
                if ragged {
                    bytes.truncate(bytes.len() - 1);
                }
                let reliable = op & 0x20 != 0;
                match rpmb.write_frames(&bytes, reliable, &mut medium) {
                    Ok(_) => assert!(!ragged, "a ragged RPMB transfer was taken"),
                    Err(e) => {
                        assert!(ragged, "whole frames refused: {e}");
                    }
                }
            }
            2 => {
                let count = usize::from(input.u8() % 4);
                let ragged = usize::from(op & 0x10 != 0);
                let mut out = vec![0u8; count * rpmb::FRAME_LEN + ragged];
                match rpmb.read_frames(&mut out, &mut medium) {
                    Ok(()) => {
                        assert!(ragged == 0 && count > 0, "a ragged RPMB read was answered");
                        for chunk in out.chunks_exact(rpmb::FRAME_LEN) {
                            let f = RpmbFrame::parse_slice(chunk).expect("whole frame");
                            assert_eq!(
                                f.req_resp & 0x00FF,
                                0,
                                "response type {:#06x} is not a request type << 8",
                                f.req_resp
                            );
                        }
                    }
                    Err(_) => assert!(ragged == 1 || count == 0, "whole-frame read refused"),
                }
            }
            _ => rpmb.reset_volatile(),
        }
        let after = rpmb.persistent().write_counter;
        assert!(
            after == counter_before || after == counter_before + 1,
            "write counter went {counter_before} -> {after}"
        );
    }
}

// ---- guest memory for the chain targets -------------------------------------------------------

/// Guest memory of two 16 KiB regions with a hole between them, filled from the input.
const REGION: u64 = 0x4000;
const REGION2: u64 = 0x1_0000;

fn guest_memory(fill: &[u8]) -> GuestMemoryMmap {
    let mem = GuestMemoryMmap::from_ranges(&[
        (GuestAddress(0), REGION as usize),
        (GuestAddress(REGION2), REGION as usize),
    ])
    .expect("guest memory");
    if !fill.is_empty() {
        // Repeat the fill pattern over both regions.
        for base in [0, REGION2] {
            let mut at = 0u64;
            while at < REGION {
                let n = (fill.len() as u64).min(REGION - at);
                mem.write_slice(&fill[..n as usize], GuestAddress(base + at))
                    .expect("inside");
                at += n;
            }
        }
    }
    mem
}

/// A guest address from 16 fuzzed bits: mostly inside the two regions, near their edges
/// and in the hole, sometimes anywhere.
fn guest_addr(input: &mut Input) -> GuestAddress {
    let sel = input.u8();
    let off = u64::from(input.u16());
    GuestAddress(match sel % 8 {
        0..=2 => off % REGION,
        3..=4 => REGION2 + off % REGION,
        5 => REGION - 64 + off % 128,
        6 => REGION2 + REGION - 64 + off % 128,
        _ => u64::from(input.u32()) << 32 | off << 8,
    })
}

fn inside(mem: &GuestMemoryMmap, addr: GuestAddress, len: u64, access: Permissions) -> bool {
    len == 0 || mem.check_range(addr, len as usize, access)
}

/// Snapshot both regions.
fn snapshot(mem: &GuestMemoryMmap) -> Vec<u8> {
    let mut out = vec![0u8; 2 * REGION as usize];
    let (a, b) = out.split_at_mut(REGION as usize);
    mem.read_slice(a, GuestAddress(0)).expect("inside");
    mem.read_slice(b, GuestAddress(REGION2)).expect("inside");
    out
}

/// Assert that only bytes inside `writable` ranges changed between two snapshots.
fn only_written_inside(before: &[u8], after: &[u8], writable: &[(GuestAddress, u64)]) {
    for (i, (x, y)) in before.iter().zip(after).enumerate() {
        if x == y {
            continue;
        }
        let gpa = if (i as u64) < REGION {
            i as u64
        } else {
            REGION2 + i as u64 - REGION
        };
        assert!(
            writable
                .iter()
                .any(|&(a, len)| gpa >= a.0 && gpa - a.0 < len),
            "guest byte {gpa:#x} changed outside every device-writable descriptor"
        );
    }
}

// ---- vhost-user-blk descriptor chains ------------------------------------------------------------

/// vhost-user-blk chains: a split virtqueue whose descriptor table (including indirect
/// tables, loops, out-of-memory addresses) and guest memory come from the input, popped
/// with virtio-queue and parsed by `frontend::blk::request::parse`. Invariants: no panic;
/// an accepted request has every data segment inside guest memory with the right
/// permission, data_len their sum, a read/write inside the capacity and the advertised
/// limits, ranges within limits, and the status byte writable; a refusal names a status
/// byte only where one can be written; GET_ID's copy writes only into the data segments.
pub fn blk_chain(data: &[u8]) {
    use crate::blk::request::{self, Limits, RequestKind};
    use virtio_queue::{Queue, QueueT};

    let mut input = Input::new(data);
    let limits = Limits {
        capacity: u64::from(input.u16()) * 8,
        size_max: 4096,
        seg_max: 8,
        max_sectors: 256,
        max_ranges: 4,
        max_range_sectors: 1 << 16,
    };
    let ndesc = usize::from(input.u8() % 16) + 1;
    // Descriptor table at 0, avail ring at 0x400, used ring at 0x800; everything else of
    // both regions carries the fill pattern from the input's tail.
    let mut table = Vec::with_capacity(ndesc * 16);
    for _ in 0..ndesc {
        let addr = guest_addr(&mut input).0;
        let len = match input.u8() % 4 {
            0 => u32::from(input.u8()),
            1 => 16,
            2 => 512 * u32::from(input.u8() % 9),
            _ => input.u32(),
        };
        let flags = u16::from(input.u8() & 0x7); // NEXT, WRITE, INDIRECT
        let next = u16::from(input.u8()) % (ndesc as u16 + 1);
        table.extend_from_slice(&addr.to_le_bytes());
        table.extend_from_slice(&len.to_le_bytes());
        table.extend_from_slice(&flags.to_le_bytes());
        table.extend_from_slice(&next.to_le_bytes());
    }
    let head = u16::from(input.u8()) % ndesc as u16;
    let mem = guest_memory(input.bytes(MAX_INPUT));
    mem.write_slice(&table, GuestAddress(0)).expect("inside");
    // avail: flags, idx = 1, ring[0] = head.
    mem.write_obj(0u16, GuestAddress(0x400)).expect("inside");
    mem.write_obj(1u16, GuestAddress(0x402)).expect("inside");
    mem.write_obj(head, GuestAddress(0x404)).expect("inside");
    mem.write_obj(0u16, GuestAddress(0x800)).expect("inside");
    mem.write_obj(0u16, GuestAddress(0x802)).expect("inside");

    let mut queue = Queue::new(16).expect("queue");
    queue.set_size(16);
    queue.set_desc_table_address(Some(0), Some(0));
    queue.set_avail_ring_address(Some(0x400), Some(0));
    queue.set_used_ring_address(Some(0x800), Some(0));
    queue.set_ready(true);
    let Some(chain) = queue.pop_descriptor_chain(&mem) else {
        return;
    };
    match request::parse(chain, &limits) {
        Ok(req) => {
            let writable = matches!(req.kind, RequestKind::Read | RequestKind::GetId);
            let access = if writable {
                Permissions::Write
            } else {
                Permissions::Read
            };
            let mut sum = 0u64;
            for s in &req.data {
                assert!(
                    inside(&mem, s.addr, u64::from(s.len), access),
                    "accepted segment {:#x}+{} outside guest memory",
                    s.addr.0,
                    s.len
                );
                sum += u64::from(s.len);
            }
            assert_eq!(sum, req.data_len, "data_len is not the segments' sum");
            assert!(inside(&mem, req.status, 1, Permissions::Write));
            if matches!(req.kind, RequestKind::Read | RequestKind::Write) {
                assert_eq!(req.data_len % 512, 0, "read/write not whole sectors");
                let sectors = req.data_len / 512;
                assert!(
                    req.sector
                        .checked_add(sectors)
                        .is_some_and(|end| end <= limits.capacity),
                    "accepted {sectors} sectors at {} beyond capacity {}",
                    req.sector,
                    limits.capacity
                );
                assert!(sectors <= u64::from(limits.max_sectors));
                assert!(req.data.len() <= limits.seg_max as usize);
            }
            assert!(req.ranges.len() <= limits.max_ranges as usize);
            for r in &req.ranges {
                assert!(r.sectors <= limits.max_range_sectors);
                assert!(
                    r.sector
                        .checked_add(u64::from(r.sectors))
                        .is_some_and(|end| end <= limits.capacity),
                    "accepted range beyond capacity"
                );
            }
            if req.kind == RequestKind::GetId {
                let before = snapshot(&mem);
                let n = request::copy_to(&mem, &req.data, &[0x77; request::VIRTIO_BLK_ID_BYTES]);
                assert!(n <= request::VIRTIO_BLK_ID_BYTES);
                let ranges: Vec<_> = req
                    .data
                    .iter()
                    .map(|s| (s.addr, u64::from(s.len)))
                    .collect();
                only_written_inside(&before, &snapshot(&mem), &ranges);
            }
        }
        Err(e) => {
            if let Some(status) = e.status {
                assert!(inside(&mem, status, 1, Permissions::Write));
            }
            assert!(
                e.code == request::VIRTIO_BLK_S_IOERR || e.code == request::VIRTIO_BLK_S_UNSUPP
            );
        }
    }
}

// ---- virtio-mmc descriptor chains ------------------------------------------------------------------

/// virtio-mmc chains: descriptor lists and guest memory from the input, checked by
/// `parse_request_descs` / `parse_control_descs` / `parse_event_descs`, and each accepted
/// request or control request executed by an `MmcDevice` (SDHCI host and card) on that
/// memory, several per input so the card leaves idle. Invariants: no panic; accepted
/// descriptors lie inside guest memory; the device writes guest memory only inside the
/// chain's device-writable descriptors; the card's store accesses stay inside one area.
pub fn mmc_chain(data: &[u8]) {
    use crate::mmc::device::MmcDevice;
    use crate::mmc::proto::*;
    use crate::mmc::request::*;

    let mut input = Input::new(data);
    let model = small_model(false);
    let card = checked_card(model.clone());
    let mut device = MmcDevice::new(card, &model);
    let limits = device.limits();
    let mem = guest_memory(&[]);
    let mut arrival: Nanos = 0;
    let mut rounds = 0;
    while !input.is_empty() && rounds < 24 {
        rounds += 1;
        let kind = input.u8();
        arrival += u64::from(input.u16()) * 100;
        // A well-formed skeleton, then fuzzed deviations, so both paths are reached.
        let mut descs: Vec<ChainDesc> = Vec::new();
        let shape = input.u8();
        if kind % 3 == 0 {
            // Control request: r24 then w40, or fuzz.
            let req = VirtioMmcCtrlReq {
                kind: u32::from(input.u8() % 10),
                arg0: input.u64() % (1 << 40),
                arg1: input.u64(),
                ..Default::default()
            };
            let at = GuestAddress(0x100);
            mem.write_obj(req, at).expect("inside");
            descs.push(ChainDesc::new(at, CTRL_REQ_LEN, false));
            descs.push(ChainDesc::new(GuestAddress(0x200), CTRL_RESP_LEN, true));
        } else {
            let mut hdr = VirtioMmcReqHdr::default();
            let flags = input.u32();
            hdr.flags = flags & (REQ_F_ALL | if shape & 0x80 != 0 { u32::MAX } else { 0 });
            hdr.cmd.opcode = input.u8() % 64;
            hdr.cmd.resp_type = input.u8() % 6;
            hdr.cmd.flags = input.u8() & 1;
            hdr.cmd.arg = input.u32();
            hdr.sbc.opcode = 23;
            hdr.sbc.resp_type = RESP_R1;
            hdr.sbc.arg = input.u32();
            hdr.stop.opcode = 12;
            hdr.stop.resp_type = RESP_R1B;
            hdr.stop.flags = CMD_F_BUSY;
            hdr.blksz = [512, 512, 8, 4096, 0, 513][usize::from(input.u8() % 6)];
            hdr.blocks = u32::from(input.u8() % 8);
            hdr.timeout_ns = u64::from(input.u16()) * 1_000;
            let at = GuestAddress(0x100);
            mem.write_obj(hdr, at).expect("inside");
            descs.push(ChainDesc::new(at, HDR_LEN, false));
            let data_write = hdr.flags & REQ_F_WRITE == 0;
            let nseg = usize::from(input.u8() % 4);
            let total = u64::from(hdr.blksz) * u64::from(hdr.blocks);
            for i in 0..nseg {
                let len = if i + 1 == nseg {
                    total
                        .saturating_sub(512 * i as u64)
                        .min(u64::from(u32::MAX)) as u32
                } else {
                    512
                };
                descs.push(ChainDesc::new(
                    GuestAddress(REGION2 + 0x1000 * i as u64),
                    len,
                    data_write,
                ));
            }
            descs.push(ChainDesc::new(GuestAddress(0x300), RESP_LEN, true));
        }
        // Deviations: replace, add or drop descriptors with fuzzed ones.
        for _ in 0..(shape % 4) {
            let what = input.u8();
            let d = ChainDesc::new(
                guest_addr(&mut input),
                if what & 0x10 != 0 {
                    input.u32()
                } else {
                    u32::from(input.u16() % 1024)
                },
                what & 0x20 != 0,
            );
            let at = usize::from(what) % (descs.len() + 1);
            match what % 3 {
                0 if at < descs.len() => descs[at] = d,
                1 => descs.insert(at.min(descs.len()), d),
                _ if at < descs.len() => {
                    descs.remove(at);
                }
                _ => {}
            }
        }
        let writable: Vec<(GuestAddress, u64)> = descs
            .iter()
            .filter(|d| d.writable)
            .map(|d| (d.addr, u64::from(d.len)))
            .collect();
        let before = snapshot(&mem);
        if kind % 3 == 0 {
            match parse_control_descs(&mem, &descs) {
                Ok(c) => {
                    assert!(inside(
                        &mem,
                        c.resp,
                        u64::from(CTRL_RESP_LEN),
                        Permissions::Write
                    ));
                    let out = device.control(&c.req, arrival);
                    answer_control(&mem, &c, &out);
                }
                Err(e) => {
                    refuse_control(&mem, &e, arrival);
                }
            }
        } else if kind % 3 == 1 {
            match parse_request_descs(&mem, &descs, &limits) {
                Ok(req) => {
                    for s in &req.data {
                        assert!(
                            inside(&mem, s.addr, u64::from(s.len), Permissions::Read),
                            "accepted data segment outside guest memory"
                        );
                    }
                    assert!(inside(
                        &mem,
                        req.resp,
                        u64::from(RESP_LEN),
                        Permissions::Write
                    ));
                    let done = device.request(&mem, &req, arrival);
                    answer_request(&mem, &req, &done);
                    arrival = arrival.max(done.done_at);
                }
                Err(e) => {
                    refuse_request(&mem, &e);
                }
            }
        } else {
            let _ = parse_event_descs(&mem, &descs);
        }
        only_written_inside(&before, &snapshot(&mem), &writable);
    }
}

// ---- device-model TOML --------------------------------------------------------------------------------

/// Device-model TOML: arbitrary text, or a built-in model with one line replaced by
/// fuzzed text, loaded and validated; a model that loads builds a card (on a store that
/// checks accesses) that comes up to tran and serves a few reads and writes. Invariants:
/// no panic; a model that validates yields a working card.
pub fn model_toml(data: &[u8]) {
    // Device models are up to 12 KB of TOML.
    let mut input = Input::with_cap(data, 16 * 1024);
    let mode = input.u8();
    let text = if mode & 1 == 0 {
        String::from_utf8_lossy(input.bytes(16 * 1024)).into_owned()
    } else {
        // A built-in model with line n replaced by the rest of the input.
        let names = emmc_card::model::builtin_model_names();
        let name = names[usize::from(input.u8()) % names.len()];
        let base = emmc_card::model::BUILTIN_MODELS
            .iter()
            .find(|(n, _)| *n == name)
            .map_or("", |(_, text)| *text);
        let mut lines: Vec<String> = base.lines().map(str::to_owned).collect();
        let n = usize::from(input.u16()) % lines.len().max(1);
        let replacement = String::from_utf8_lossy(input.bytes(MAX_INPUT)).into_owned();
        if n < lines.len() {
            lines[n] = replacement;
        } else {
            lines.push(replacement);
        }
        lines.join("\n")
    };
    let Ok(model) = DeviceModel::from_toml_str("fuzz", &text) else {
        return;
    };
    // Keep the fuzzer's cards small enough to build fast (sizes are validated already).
    let mut model = model;
    model.ext_csd.sec_count = model.ext_csd.sec_count.min(8 << 20);
    let layout = Card::layout_for(&model);
    let Ok(card) = Card::new(model, Box::new(CheckedStore::new(layout))) else {
        return;
    };
    let mut bus = Bus { card, now: 0 };
    bus.bring_up();
    bus.cmd(23, 8);
    bus.cmd(25, 0);
    bus.write(&[0x33; 4096]);
    bus.wait_busy();
    bus.cmd(23, 8);
    bus.cmd(18, 0);
    let mut buf = [0u8; 512];
    for _ in 0..8 {
        bus.now += 1_000;
        if bus.card.read_data(bus.now, &mut buf).is_err() {
            break;
        }
    }
    bus.wait_busy();
    bus.cmd(13, RCA_ARG);
}
