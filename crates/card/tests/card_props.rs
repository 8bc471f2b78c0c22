//! Property tests of the card as a whole.
//!
//! (a) Any sequence of commands, data phases and time steps a (hostile) guest can produce
//!     leaves the card answering with well-formed R1 words and never panics.
//! (b) Data commands aimed at the selected partition, with addresses and counts chosen
//!     to land at, past and around its ends (and to overflow 32-bit arithmetic), never
//!     change a byte of any other partition (facts §11.1: each physical partition has its
//!     own address space; access beyond its size ⇒ OUT_OF_RANGE).

mod common;

use common::{ext, Host, RCA_ARG};
use emmc_card::rpmb::{self, RpmbFrame};
use emmc_card::{r1, CardState, Command, Partition, PowerDown, Response};
use proptest::prelude::*;

// ---- (a) no panics -------------------------------------------------------------------

#[derive(Debug, Clone)]
enum Op {
    Cmd {
        index: u8,
        arg: u32,
    },
    /// A command whose CRC the card finds wrong.
    BadCrc {
        index: u8,
        arg: u32,
    },
    Read {
        len: usize,
    },
    Write {
        len: usize,
        seed: u8,
    },
    Advance {
        ns: u64,
    },
    /// Advance to the end of the current busy period, if any.
    WaitBusy,
    PowerCycle {
        sudden: bool,
    },
    /// CMD0, CMD1, CMD2, CMD3, CMD7: back to tran from wherever the card wandered.
    Reinit,
}

fn index_strategy() -> impl Strategy<Value = u8> {
    prop_oneof![
        1 => 0u8..64,
        3 => prop::sample::select(vec![
            0u8, 1, 2, 3, 5, 6, 7, 8, 12, 13, 14, 15, 16, 17, 18, 19, 21, 23, 24, 25, 26, 27, 28,
            29, 30, 31, 35, 36, 38, 40, 42, 55, 56,
        ]),
    ]
}

fn arg_strategy() -> impl Strategy<Value = u32> {
    prop_oneof![
        2 => any::<u32>(),
        3 => prop::sample::select(vec![RCA_ARG, RCA_ARG | 1, RCA_ARG | 1 << 15, 2 << 16]),
        3 => 0u32..16,
        2 => 0u32..70_000,
        1 => 15_200_000u32..15_300_000,
        // CMD6-shaped: access mode, index, value.
        2 => (0u32..4, 0u32..256, 0u32..256).prop_map(|(a, i, v)| a << 24 | i << 16 | v << 8),
        2 => prop::sample::select(vec![
            0u32,
            0xF0F0_F0F0,
            0xFFFF_FFFA,
            0x40FF_8080,
            512,
            0x8000_0000,
            0x8000_0001,
            0x8000_8000,
            u32::MAX,
        ]),
        // CMD23-shaped: count and flags.
        1 => (
            1u32..=65535,
            prop::sample::select(vec![0u32, 1 << 31, 1 << 30, 1 << 29, 1 << 24, 3 << 25]),
        )
            .prop_map(|(c, f)| c | f),
    ]
}

fn len_strategy() -> impl Strategy<Value = usize> {
    prop_oneof![
        0usize..1100,
        (1usize..=8).prop_map(|b| b * 512),
        prop::sample::select(vec![4usize, 8, 16, 64, 128, 512]),
    ]
}

fn op_strategy() -> impl Strategy<Value = Op> {
    prop_oneof![
        8 => (index_strategy(), arg_strategy()).prop_map(|(index, arg)| Op::Cmd { index, arg }),
        1 => (index_strategy(), arg_strategy()).prop_map(|(index, arg)| Op::BadCrc { index, arg }),
        3 => len_strategy().prop_map(|len| Op::Read { len }),
        3 => (len_strategy(), any::<u8>()).prop_map(|(len, seed)| Op::Write { len, seed }),
        2 => prop_oneof![0u64..2_000, 0u64..3_000_000, 0u64..2_000_000_000]
            .prop_map(|ns| Op::Advance { ns }),
        1 => Just(Op::WaitBusy),
        1 => any::<bool>().prop_map(|sudden| Op::PowerCycle { sudden }),
        1 => Just(Op::Reinit),
    ]
}

/// R1 bits that are reserved or kept 0 on a 4.5 card (facts §3): 18/17 (stream
/// commands, obsolete), 14 (legacy ECC disabled), 4 and 3:0.
const R1_MUST_BE_ZERO: u32 = 1 << 18 | 1 << 17 | 1 << 14 | 0x1F;

/// The identification and selection steps, tolerant of whatever state the card is in.
fn rough_init(h: &mut Host) {
    for (index, arg) in [
        (0u8, 0u32),
        (1, 0x40FF_8080),
        (1, 0x40FF_8080),
        (2, 0),
        (3, RCA_ARG),
        (7, RCA_ARG),
    ] {
        h.now += 1_000;
        let _ = h.card.execute(h.now, Command::new(index, arg));
    }
}

fn data_bytes(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| seed.wrapping_add((i as u8).wrapping_mul(7)))
        .collect()
}

fn run_random_ops(ops: &[Op]) -> Result<(), TestCaseError> {
    let mut h = Host::ready(common::model());
    for (step, op) in ops.iter().enumerate() {
        match *op {
            Op::Cmd { index, arg } => {
                h.now += 100;
                // The state the command will be received in: known unless a busy period
                // ends exactly now (the card then settles first).
                let settles = h.card.busy_until().is_some_and(|end| end <= h.now);
                let before = h.card.state();
                let resp = h.card.execute(h.now, Command::new(index, arg));
                if let Some(Response::R1(s) | Response::R1b(s)) = resp {
                    prop_assert_eq!(
                        s & R1_MUST_BE_ZERO,
                        0,
                        "step {}: CMD{} R1 {:#010x} has reserved bits",
                        step,
                        index,
                        s
                    );
                    let reported = (s & r1::CURRENT_STATE_MASK) >> r1::CURRENT_STATE_SHIFT;
                    prop_assert!(reported <= 10, "step {step}: state field {reported}");
                    if !settles {
                        prop_assert_eq!(
                            reported,
                            before.number(),
                            "step {}: CMD{} received in {} reports state {}",
                            step,
                            index,
                            before,
                            reported
                        );
                    }
                }
            }
            Op::BadCrc { index, arg } => {
                h.now += 100;
                let resp = h
                    .card
                    .execute_checked(h.now, Command::new(index, arg), false);
                prop_assert_eq!(
                    resp,
                    None,
                    "step {}: answered a command with a bad CRC",
                    step
                );
            }
            Op::Read { len } => {
                h.now += 100;
                let mut buf = vec![0u8; len];
                let _ = h.card.read_data(h.now, &mut buf);
            }
            Op::Write { len, seed } => {
                h.now += 100;
                let _ = h.card.write_data(h.now, &data_bytes(len, seed));
            }
            Op::Advance { ns } => h.now += ns,
            Op::WaitBusy => h.wait_busy(),
            Op::PowerCycle { sudden } => {
                let how = if sudden {
                    PowerDown::Sudden
                } else {
                    PowerDown::Clean
                };
                h.card.power_cycle(h.now, how);
                prop_assert_eq!(h.card.state(), CardState::Idle);
                rough_init(&mut h);
            }
            Op::Reinit => rough_init(&mut h),
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 160, ..ProptestConfig::default() })]

    /// (a) Random commands, arguments, data phases and time steps from tran: never a
    /// panic, and every R1 is well formed and reports the state the command found.
    #[test]
    fn random_bus_traffic_never_panics_and_r1_stays_well_formed(
        ops in prop::collection::vec(op_strategy(), 1..200)
    ) {
        run_random_ops(&ops)?;
    }
}

// ---- (b) partition isolation ---------------------------------------------------------

/// Sectors filled and checked at each end of every partition.
const EDGE: u64 = 128;
/// GP_SIZE_MULT_1..4 in units of HC_WP_GRP_SIZE × HC_ERASE_GRP_SIZE × 512 KiB (= 1024
/// sectors on the default model).
const GP_MULTS: [u8; 4] = [1, 2, 1, 1];

/// An address relative to the selected partition's size, resolved when the op runs.
#[derive(Debug, Clone, Copy)]
enum Addr {
    FromStart(u32),
    /// size − k (saturating).
    FromEnd(u32),
    /// size + k.
    PastEnd(u32),
    /// u32::MAX − k: overflows any 32-bit end computation.
    NearMax(u32),
    Any(u32),
}

impl Addr {
    fn resolve(self, size: u64) -> u32 {
        let size = size as u32;
        match self {
            Addr::FromStart(k) => k,
            Addr::FromEnd(k) => size.saturating_sub(k),
            Addr::PastEnd(k) => size.saturating_add(k),
            Addr::NearMax(k) => u32::MAX - k,
            Addr::Any(a) => a,
        }
    }
}

fn addr_strategy() -> impl Strategy<Value = Addr> {
    prop_oneof![
        1 => (0u32..80).prop_map(Addr::FromStart),
        4 => (0u32..80).prop_map(Addr::FromEnd),
        2 => prop_oneof![0u32..80, 0u32..70_000].prop_map(Addr::PastEnd),
        1 => (0u32..70_000).prop_map(Addr::NearMax),
        1 => any::<u32>().prop_map(Addr::Any),
    ]
}

/// CMD23 argument flags worth mixing in (facts §1b): reliable write, forced
/// programming, packed, tag, and reserved bits that must be refused.
fn cmd23_flags() -> impl Strategy<Value = u32> {
    prop::sample::select(vec![
        0u32,
        0,
        0,
        1 << 31,
        1 << 24,
        1 << 30,
        1 << 29,
        1 << 31 | 1 << 24,
        0x00FF_0000,
    ])
}

fn block_count() -> impl Strategy<Value = u16> {
    prop_oneof![4 => 1u16..=8, 1 => Just(65535u16), 1 => Just(0u16), 1 => any::<u16>()]
}

#[derive(Debug, Clone)]
enum DOp {
    /// A whole write: optional CMD23, CMD24 (single) or CMD25, `send` blocks of data in
    /// one or two pieces (refusals ignored), then CMD12 if `stop`.
    WriteTx {
        sbc: Option<(u16, u32)>,
        single: bool,
        addr: Addr,
        send: usize,
        split: bool,
        stop: bool,
        fill: u8,
    },
    /// A whole read: optional CMD23, CMD17 or CMD18, `take` blocks, then CMD12 if `stop`.
    ReadTx {
        sbc: Option<u16>,
        single: bool,
        addr: Addr,
        take: usize,
        stop: bool,
    },
    /// CMD35, CMD36, CMD38.
    EraseTx {
        start: Addr,
        end: Addr,
        arg: u32,
    },
    /// A packed write (facts §7.3): CMD23(packed | 1 + Σ counts), CMD25, header, data.
    PackedWriteTx {
        entries: Vec<(u16, Addr, bool)>,
        fill: u8,
    },
    /// Single commands and data phases, for sequences no driver would send.
    Cmd23 {
        count: u16,
        flags: u32,
    },
    /// CMD24/25/17/18/35/36/28/29/30/31 with an address.
    Addressed {
        index: u8,
        addr: Addr,
    },
    Cmd12,
    Cmd38 {
        arg: u32,
    },
    Cmd13 {
        hpi: bool,
    },
    Write {
        blocks: usize,
        fill: u8,
    },
    /// A packed-command header block (facts §7.2) with entries near the ends.
    PackedHeader {
        read: bool,
        entries: Vec<(u16, Addr, bool)>,
    },
    Read {
        blocks: usize,
    },
    Advance {
        ns: u64,
    },
    WaitBusy,
}

const ERASE_ARGS: [u32; 7] = [0, 1, 3, 0x8000_0000, 0x8000_0001, 0x8000_8000, 0x0000_8003];

fn packed_entries() -> impl Strategy<Value = Vec<(u16, Addr, bool)>> {
    prop::collection::vec((1u16..=4, addr_strategy(), any::<bool>()), 1..4)
}

fn dop_strategy() -> impl Strategy<Value = DOp> {
    prop_oneof![
        8 => (
            prop::option::of((block_count(), cmd23_flags())),
            any::<bool>(),
            addr_strategy(),
            0usize..=9,
            any::<bool>(),
            prop::bool::weighted(0.7),
            1u8..=255,
        )
            .prop_map(|(sbc, single, addr, send, split, stop, fill)| DOp::WriteTx {
                sbc,
                single,
                addr,
                send,
                split,
                stop,
                fill,
            }),
        3 => (
            prop::option::of(block_count()),
            any::<bool>(),
            addr_strategy(),
            0usize..=9,
            prop::bool::weighted(0.8),
        )
            .prop_map(|(sbc, single, addr, take, stop)| DOp::ReadTx {
                sbc,
                single,
                addr,
                take,
                stop,
            }),
        3 => (addr_strategy(), addr_strategy(), prop::sample::select(ERASE_ARGS.to_vec()))
            .prop_map(|(start, end, arg)| DOp::EraseTx { start, end, arg }),
        2 => (packed_entries(), 1u8..=255)
            .prop_map(|(entries, fill)| DOp::PackedWriteTx { entries, fill }),
        1 => (block_count(), cmd23_flags())
            .prop_map(|(count, flags)| DOp::Cmd23 { count, flags }),
        3 => (
            prop::sample::select(vec![24u8, 25, 17, 18, 35, 36, 28, 29, 30, 31]),
            addr_strategy(),
        )
            .prop_map(|(index, addr)| DOp::Addressed { index, addr }),
        1 => Just(DOp::Cmd12),
        1 => prop::sample::select(ERASE_ARGS.to_vec()).prop_map(|arg| DOp::Cmd38 { arg }),
        1 => any::<bool>().prop_map(|hpi| DOp::Cmd13 { hpi }),
        2 => (1usize..=8, 1u8..=255).prop_map(|(blocks, fill)| DOp::Write { blocks, fill }),
        1 => (any::<bool>(), packed_entries())
            .prop_map(|(read, entries)| DOp::PackedHeader { read, entries }),
        1 => (1usize..=8).prop_map(|blocks| DOp::Read { blocks }),
        2 => prop_oneof![0u64..1_000, 0u64..5_000_000].prop_map(|ns| DOp::Advance { ns }),
        1 => Just(DOp::WaitBusy),
    ]
}

fn packed_header(read: bool, entries: &[(u16, Addr, bool)], size: u64) -> Vec<u8> {
    let mut h = vec![0u8; 512];
    h[0] = 1;
    h[1] = if read { 1 } else { 2 };
    h[2] = entries.len() as u8;
    for (i, &(count, addr, reliable)) in entries.iter().enumerate() {
        let at = 8 * (i + 1);
        let arg = u32::from(count) | if reliable { 1 << 31 } else { 0 };
        h[at..at + 4].copy_from_slice(&arg.to_le_bytes());
        h[at + 4..at + 8].copy_from_slice(&addr.resolve(size).to_le_bytes());
    }
    h
}

const DATA_PARTITIONS: [Partition; 7] = [
    Partition::User,
    Partition::Boot1,
    Partition::Boot2,
    Partition::Gp(0),
    Partition::Gp(1),
    Partition::Gp(2),
    Partition::Gp(3),
];

fn tag(p: Partition) -> u8 {
    0x10 + p.access_bits()
}

/// The two ranges checked in partition `p`: the first and the last `EDGE` sectors.
fn edges(h: &Host, p: Partition) -> [(u64, u64); 2] {
    let size = h.card.partition_sectors(p);
    [(0, EDGE), (size - EDGE, EDGE)]
}

fn peek(h: &mut Host, p: Partition, lba: u64, count: u64) -> Vec<u8> {
    let mut buf = vec![0u8; count as usize * 512];
    h.card.peek(p, lba, &mut buf).expect("peek in range");
    buf
}

const RPMB_KEY: [u8; 32] = [0x5A; 32];

/// Program the RPMB key and put authenticated data at both ends of the RPMB partition,
/// so that a stray write or erase there would show.
fn fill_rpmb(h: &mut Host) {
    h.select_partition(Partition::Rpmb);
    let send = |h: &mut Host, frames: &[RpmbFrame]| {
        let n = frames.len() as u32;
        assert_eq!(h.r1(23, n | 1 << 31) & r1::ERRORS, 0);
        assert_eq!(h.r1(25, 0) & r1::ERRORS, 0);
        h.card
            .write_data(h.now, &rpmb::frames_to_bytes(frames))
            .unwrap();
        h.wait_busy();
    };
    let mut key = RpmbFrame::with_type(rpmb::AUTHENTICATION_KEY_PROGRAMMING);
    key.key_mac = RPMB_KEY;
    send(h, &[key]);
    let halves = h.card.partition_sectors(Partition::Rpmb) as u16 * 2;
    for (counter, address) in [(0u32, 0u16), (1, halves - 2)] {
        let mut frames: Vec<RpmbFrame> = (0..2u8)
            .map(|i| {
                let mut f = RpmbFrame::with_type(rpmb::AUTHENTICATED_DATA_WRITE);
                f.data = [0xC0 | i; 256];
                f.write_counter = counter;
                f.address = address;
                f.block_count = 2;
                f
            })
            .collect();
        rpmb::sign_frames(&RPMB_KEY, &mut frames);
        send(h, &frames);
    }
    assert!(peek(h, Partition::Rpmb, 0, 1)
        .iter()
        .all(|&b| b & 0xC0 == 0xC0));
}

/// A card with four GP partitions (partitioning completed, power-cycled, re-initialised)
/// and known data at both ends of every partition, including RPMB.
fn partitioned_card() -> Host {
    let mut h = Host::ready(common::model());
    for (i, mult) in GP_MULTS.iter().enumerate() {
        h.switch_ok(ext::GP_SIZE_MULT + 3 * i as u8, *mult);
    }
    h.switch_ok(ext::PARTITION_SETTING_COMPLETED, 1);
    h.card.power_cycle(h.now, PowerDown::Clean);
    h.init();
    for (i, mult) in GP_MULTS.iter().enumerate() {
        assert_eq!(
            h.card.partition_sectors(Partition::Gp(i as u8)),
            u64::from(*mult) * 1024,
            "GP{} size",
            i + 1
        );
    }
    for p in DATA_PARTITIONS {
        h.select_partition(p);
        for (lba, count) in edges(&h, p) {
            let data = common::pattern(tag(p), count as usize);
            assert_eq!(
                h.write(lba, &data, 0) & r1::ERRORS,
                0,
                "fill {p:?} at {lba}"
            );
        }
    }
    fill_rpmb(&mut h);
    h.select_partition(Partition::User);
    h
}

/// One command 100 ns after the previous one; the response does not matter here.
fn send(h: &mut Host, index: u8, arg: u32) {
    h.now += 100;
    let _ = h.card.execute(h.now, Command::new(index, arg));
}

fn run_dop(h: &mut Host, op: &DOp, size: u64) {
    match op {
        DOp::WriteTx {
            sbc,
            single,
            addr,
            send: blocks,
            split,
            stop,
            fill,
        } => {
            if let Some((count, flags)) = sbc {
                send(h, 23, u32::from(*count) | flags);
            }
            send(h, if *single { 24 } else { 25 }, addr.resolve(size));
            let data = vec![*fill; blocks * 512];
            let cut = if *split { blocks / 2 * 512 } else { 0 };
            for piece in [&data[..cut], &data[cut..]] {
                if !piece.is_empty() {
                    h.now += 100;
                    let _ = h.card.write_data(h.now, piece);
                }
            }
            if *stop {
                send(h, 12, 0);
            }
        }
        DOp::ReadTx {
            sbc,
            single,
            addr,
            take,
            stop,
        } => {
            if let Some(count) = sbc {
                send(h, 23, u32::from(*count));
            }
            send(h, if *single { 17 } else { 18 }, addr.resolve(size));
            if *take > 0 {
                h.now += 100;
                let _ = h.card.read_data(h.now, &mut vec![0u8; take * 512]);
            }
            if *stop {
                send(h, 12, 0);
            }
        }
        DOp::EraseTx { start, end, arg } => {
            send(h, 35, start.resolve(size));
            send(h, 36, end.resolve(size));
            send(h, 38, *arg);
        }
        DOp::PackedWriteTx { entries, fill } => {
            let blocks: u32 = entries.iter().map(|e| u32::from(e.0)).sum();
            send(h, 23, 1 << 30 | (1 + blocks));
            send(h, 25, entries[0].1.resolve(size));
            let mut data = packed_header(false, entries, size);
            data.resize(data.len() + blocks as usize * 512, *fill);
            h.now += 100;
            let _ = h.card.write_data(h.now, &data);
        }
        DOp::Cmd23 { count, flags } => send(h, 23, u32::from(*count) | flags),
        DOp::Addressed { index, addr } => send(h, *index, addr.resolve(size)),
        DOp::Cmd12 => send(h, 12, 0),
        DOp::Cmd38 { arg } => send(h, 38, *arg),
        DOp::Cmd13 { hpi } => send(h, 13, RCA_ARG | u32::from(*hpi)),
        DOp::Write { blocks, fill } => {
            h.now += 100;
            let _ = h.card.write_data(h.now, &vec![*fill; blocks * 512]);
        }
        DOp::PackedHeader { read, entries } => {
            h.now += 100;
            let _ = h
                .card
                .write_data(h.now, &packed_header(*read, entries, size));
        }
        DOp::Read { blocks } => {
            h.now += 100;
            let _ = h.card.read_data(h.now, &mut vec![0u8; blocks * 512]);
        }
        DOp::Advance { ns } => h.now += ns,
        DOp::WaitBusy => h.wait_busy(),
    }
}

fn run_isolation(selected: Partition, ops: &[(DOp, bool)]) -> Result<(), TestCaseError> {
    let mut h = partitioned_card();
    let rpmb_size = h.card.partition_sectors(Partition::Rpmb);
    let rpmb_before = [
        peek(&mut h, Partition::Rpmb, 0, EDGE),
        peek(&mut h, Partition::Rpmb, rpmb_size - EDGE, EDGE),
    ];
    h.select_partition(selected);
    let size = h.card.partition_sectors(selected);
    for (op, wait) in ops {
        run_dop(&mut h, op, size);
        if *wait {
            // Most drivers wait out busy before the next request; some sequences don't.
            h.wait_busy();
        }
    }
    // Let whatever is being programmed or erased finish.
    h.wait_busy();
    h.now += 1;
    let _ = h.card.execute(h.now, Command::new(13, RCA_ARG));
    prop_assert_eq!(h.card.current_partition(), selected);
    for p in DATA_PARTITIONS {
        if p == selected {
            continue;
        }
        for (lba, count) in edges(&h, p) {
            let want = common::pattern(tag(p), count as usize);
            let got = peek(&mut h, p, lba, count);
            if got != want {
                let bad = (0..count as usize)
                    .find(|&i| got[i * 512..(i + 1) * 512] != want[i * 512..(i + 1) * 512])
                    .unwrap();
                return Err(TestCaseError::fail(format!(
                    "{p:?} sector {} changed while {selected:?} was selected",
                    lba + bad as u64
                )));
            }
        }
    }
    prop_assert!(
        peek(&mut h, Partition::Rpmb, 0, EDGE) == rpmb_before[0]
            && peek(&mut h, Partition::Rpmb, rpmb_size - EDGE, EDGE) == rpmb_before[1],
        "RPMB changed while {:?} was selected",
        selected
    );
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 128, ..ProptestConfig::default() })]

    /// (b) Data commands in one partition never touch another partition's bytes.
    #[test]
    fn data_commands_never_change_other_partitions(
        selected in prop::sample::select(DATA_PARTITIONS.to_vec()),
        ops in prop::collection::vec((dop_strategy(), prop::bool::weighted(0.75)), 1..120),
    ) {
        run_isolation(selected, &ops)?;
    }
}

/// Deterministic companions of (b): at the end of every data partition a write that
/// runs past the end is refused (OUT_OF_RANGE, facts §3 bit 31 and §11.1), an open-ended
/// write stops at the last sector, and the neighbours keep their bytes.
#[test]
fn writes_at_each_partition_end_stop_at_the_boundary() {
    let mut h = partitioned_card();
    for p in DATA_PARTITIONS {
        h.select_partition(p);
        let size = h.card.partition_sectors(p);
        let last = (size - 1) as u32;
        let tran = 4 << 9 | r1::READY_FOR_DATA;
        // Closed-ended, one block too many: refused in the CMD25 response, no data phase.
        assert_eq!(h.r1(23, 2), tran, "{p:?}");
        assert_eq!(h.r1(25, last), tran | r1::ADDRESS_OUT_OF_RANGE, "{p:?}");
        assert_eq!(h.card.state(), CardState::Tran, "{p:?}");
        // Single block at the size: refused.
        assert_eq!(
            h.r1(24, size as u32),
            tran | r1::ADDRESS_OUT_OF_RANGE,
            "{p:?}"
        );
        assert_eq!(h.r1(17, u32::MAX), tran | r1::ADDRESS_OUT_OF_RANGE, "{p:?}");
        // Open-ended from the last sector: the first block lands, the second is refused.
        let data = common::pattern(0xE0, 2);
        assert_eq!(h.r1(25, last), tran, "{p:?}");
        h.card
            .write_data(h.now, &data[..512])
            .expect("last sector accepted");
        assert!(
            h.card.write_data(h.now, &data[512..]).is_err(),
            "{p:?}: past the end"
        );
        let s = h.r1b(12, 0);
        assert_ne!(s & r1::ADDRESS_OUT_OF_RANGE, 0, "{p:?}: CMD12 {s:#010x}");
        h.status();
        assert_eq!(peek(&mut h, p, size - 1, 1), data[..512], "{p:?}");
    }
    // Every partition's first sectors and all but the last sector of its end kept their
    // fill: nothing spilled into a neighbour.
    for p in DATA_PARTITIONS {
        let size = h.card.partition_sectors(p);
        let want = common::pattern(tag(p), EDGE as usize);
        assert_eq!(peek(&mut h, p, 0, EDGE), want, "{p:?} start");
        let end = peek(&mut h, p, size - EDGE, EDGE);
        let keep = (EDGE as usize - 1) * 512;
        assert_eq!(end[..keep], want[..keep], "{p:?} end");
    }
}
