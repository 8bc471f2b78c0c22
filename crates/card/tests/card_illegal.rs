//! Illegal commands: in every reachable state, every command the fact sheet does not allow
//! there gets no response, changes neither the state nor any data, and is reported as
//! ILLEGAL_COMMAND (R1 bit 22, clear condition "b") in exactly the next status, then
//! clears (facts §1 introduction, §2, §3).
//!
//! The legality table here is written from the fact sheet (§1 "Accepted in" column, §2
//! notes), not read from the card's own command table, so a wrong row in the card is
//! caught rather than copied. `command_table_agrees_with_the_fact_sheet` compares the two
//! in both directions.

mod common;

use common::{ext, Host, RCA_ARG};
use emmc_card::{command, r1, CardState, Command, Partition, PowerDown, Response};

/// Sectors the fixtures fill with known data before anything is probed.
const USER_LBA: u64 = 2048;
const BOOT_LBA: u64 = 16;
const PATTERN_BLOCKS: usize = 8;
/// Where the prg fixture writes (forced programming, so it goes to the medium and takes
/// long enough to probe while busy).
const PRG_LBA: u64 = 40_000;
const PRG_BLOCKS: usize = 64;
/// Where the rcv fixture's open-ended write goes.
const RCV_LBA: u64 = 50_000;
/// CMD23 bit 24: forced programming (facts §1b).
const CMD23_FORCED: u32 = 1 << 24;

/// R1 CURRENT_STATE numbers (facts §2).
fn st(n: u32) -> u32 {
    n << 9
}
const RFD: u32 = r1::READY_FOR_DATA;
const ILLEGAL: u32 = r1::ILLEGAL_COMMAND;

/// Whether the fact sheet (§1) accepts command `index` in `state` on this card, with the
/// card configured as the fixtures leave it: high-speed (not HS200) timing, so CMD21 is
/// never legal (§1: "only valid while HS_TIMING = HS200"); HPI carried by CMD13
/// (HPI_FEATURES = 0x01), so CMD12 is not legal in prg (§1, §8: "CMD12-HPI outside prg is
/// just a STOP/illegal"; in prg CMD12 is only the HPI carrier when HPI_FEATURES[1] = 1).
/// Address-dependent rules (CMD7 with the own RCA, CMD5 direction, CMD0 arguments in slp)
/// are tested separately.
fn legal_per_facts(index: u8, state: CardState) -> bool {
    use CardState::*;
    let any_but_ina = !matches!(state, Ina);
    match index {
        0 => any_but_ina,
        // §1: idle → ready. Pre-idle is the power-up state (§2); a host that does not
        // boot goes on with CMD1 from there, as the card's own table also allows.
        1 => matches!(state, Idle | PreIdle),
        2 => state == Ready,
        3 => state == Ident,
        4 => state == Stby,
        5 => matches!(state, Stby | Slp),
        6 => state == Tran,
        7 => matches!(state, Stby | Tran | Data | Prg | Dis),
        8 => state == Tran,
        9 | 10 => state == Stby,
        12 => matches!(state, Data | Rcv),
        13 => matches!(state, Stby | Tran | Data | Rcv | Prg | Dis | Btst),
        14 => state == Btst,
        15 => matches!(state, Stby | Tran | Data | Rcv | Prg | Dis | Btst),
        16..=19 => state == Tran,
        21 => false,
        23..=31 => state == Tran,
        35 | 36 | 38 => state == Tran,
        39 | 40 => state == Stby,
        42 => state == Tran,
        55 => matches!(state, Stby | Tran | Data | Rcv | Prg | Dis),
        56 => state == Tran,
        // 11, 20 (stream, obsolete), 22, 32–34, 37, 41, 43–48 (CMDQ, 5.1), 49 (SET_TIME),
        // 50–54 (SDIO CMD52, protocol commands), 57–63 (SPI and reserved): no row in §1.
        _ => false,
    }
}

/// The states the sweep visits; `DataExtCsd` and `DataRead` are both the data state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Target {
    Idle,
    PreIdle,
    Ready,
    Ident,
    Stby,
    Tran,
    /// After CMD8, before the EXT_CSD block is read.
    DataExtCsd,
    /// After an open-ended CMD18, before any block is read.
    DataRead,
    /// After an open-ended CMD25, before any block is sent.
    Rcv,
    /// Programming a forced (medium) write, busy far beyond the probes.
    Prg,
    /// Deselected while programming.
    Dis,
    /// After CMD19, before the pattern is sent.
    Btst,
    Slp,
    Ina,
}

const TARGETS: [Target; 14] = [
    Target::Idle,
    Target::PreIdle,
    Target::Ready,
    Target::Ident,
    Target::Stby,
    Target::Tran,
    Target::DataExtCsd,
    Target::DataRead,
    Target::Rcv,
    Target::Prg,
    Target::Dis,
    Target::Btst,
    Target::Slp,
    Target::Ina,
];

impl Target {
    fn state(self) -> CardState {
        match self {
            Target::Idle => CardState::Idle,
            Target::PreIdle => CardState::PreIdle,
            Target::Ready => CardState::Ready,
            Target::Ident => CardState::Ident,
            Target::Stby => CardState::Stby,
            Target::Tran => CardState::Tran,
            Target::DataExtCsd | Target::DataRead => CardState::Data,
            Target::Rcv => CardState::Rcv,
            Target::Prg => CardState::Prg,
            Target::Dis => CardState::Dis,
            Target::Btst => CardState::Btst,
            Target::Slp => CardState::Slp,
            Target::Ina => CardState::Ina,
        }
    }
}

/// A card in a chosen state, with known data in the user area and boot partition 1.
struct Fixture {
    h: Host,
    user: Vec<u8>,
    boot: Vec<u8>,
    /// Data of the prg fixture's write (lands once busy ends).
    prg_data: Vec<u8>,
}

/// One command at 10 ns after the previous one, so that busy periods (hundreds of µs)
/// outlast any number of probes.
fn tick(h: &mut Host, index: u8, arg: u32) -> Option<Response> {
    h.now += 10;
    h.card.execute(h.now, Command::new(index, arg))
}

fn status_word(r: Option<Response>) -> Option<u32> {
    match r {
        Some(Response::R1(s)) | Some(Response::R1b(s)) => Some(s),
        _ => None,
    }
}

/// A card after the Linux init with patterns written through the bus.
fn prepared() -> Fixture {
    let mut h = Host::ready(common::model());
    let user = common::pattern(0x51, PATTERN_BLOCKS);
    let boot = common::pattern(0xB1, PATTERN_BLOCKS);
    h.select_partition(Partition::Boot1);
    assert_eq!(h.write(BOOT_LBA, &boot, 0) & r1::ERRORS, 0);
    h.select_partition(Partition::User);
    assert_eq!(h.write(USER_LBA, &user, 0) & r1::ERRORS, 0);
    assert_eq!(
        h.status(),
        st(4) | RFD,
        "clean tran status after the fixture writes"
    );
    Fixture {
        h,
        user,
        boot,
        prg_data: common::pattern(0x77, PRG_BLOCKS),
    }
}

/// From tran back to ready through CMD0 and the CMD1 loop.
fn to_ready(h: &mut Host) {
    assert_eq!(h.cmd(0, 0), None);
    for _ in 0..10 {
        if let Some(Response::R3(ocr)) = h.cmd(1, 0x40FF_8080) {
            if ocr & (1 << 31) != 0 {
                assert_eq!(h.card.state(), CardState::Ready);
                return;
            }
        }
    }
    panic!("CMD1 never finished power-up");
}

fn enter(t: Target) -> Fixture {
    let mut f = prepared();
    let h = &mut f.h;
    match t {
        Target::Tran => {}
        Target::Idle => assert_eq!(h.cmd(0, 0), None),
        Target::PreIdle => assert_eq!(h.cmd(0, 0xF0F0_F0F0), None),
        Target::Ready => to_ready(h),
        Target::Ident => {
            to_ready(h);
            assert!(matches!(h.cmd(2, 0), Some(Response::R2(_))));
        }
        Target::Stby => assert_eq!(h.cmd(7, 0), None),
        Target::DataExtCsd => assert_eq!(h.r1(8, 0), st(4) | RFD),
        Target::DataRead => assert_eq!(h.r1(18, USER_LBA as u32), st(4) | RFD),
        Target::Rcv => assert_eq!(h.r1(25, RCV_LBA as u32), st(4) | RFD),
        Target::Prg | Target::Dis => {
            assert_eq!(h.r1(23, PRG_BLOCKS as u32 | CMD23_FORCED), st(4) | RFD);
            assert_eq!(h.r1(25, PRG_LBA as u32), st(4) | RFD);
            h.card
                .write_data(h.now, &f.prg_data)
                .expect("forced write accepted");
            let end = h
                .card
                .busy_until()
                .expect("programming keeps the card busy");
            assert!(
                end > h.now + 100_000,
                "the prg fixture needs a long busy period, got {} ns",
                end - h.now
            );
            if t == Target::Dis {
                assert_eq!(tick(h, 7, 0), None, "CMD7 deselect in prg has no response");
            }
        }
        Target::Btst => assert_eq!(h.r1(19, 0), st(4) | RFD),
        Target::Slp => {
            assert_eq!(h.cmd(7, 0), None);
            assert_eq!(h.r1b(5, RCA_ARG | 1 << 15), st(3) | RFD);
        }
        Target::Ina => assert_eq!(h.cmd(15, RCA_ARG), None),
    }
    assert_eq!(f.h.card.state(), t.state(), "fixture for {t:?}");
    f
}

/// Check the patterns written by `prepared` are byte-exact.
fn data_unchanged(f: &mut Fixture) -> Result<(), String> {
    let mut buf = vec![0u8; PATTERN_BLOCKS * 512];
    f.h.card
        .peek(Partition::User, USER_LBA, &mut buf)
        .map_err(|e| e.to_string())?;
    if buf != f.user {
        return Err("user-area pattern changed".into());
    }
    f.h.card
        .peek(Partition::Boot1, BOOT_LBA, &mut buf)
        .map_err(|e| e.to_string())?;
    if buf != f.boot {
        return Err("boot1 pattern changed".into());
    }
    Ok(())
}

fn expect_eq(errors: &mut Vec<String>, what: String, got: Option<u32>, want: u32) {
    if got != Some(want) {
        errors.push(format!(
            "{what}: got {}, want {want:#010x}",
            got.map_or("no R1".to_string(), |g| format!("{g:#010x}"))
        ));
    }
}

/// After a probe in `t`: the next status-bearing legal command shows exactly
/// ILLEGAL_COMMAND added to the clean status, the one after does not, and the interrupted
/// transfer or operation carries on as if nothing happened.
fn check_after_probe(t: Target, f: &mut Fixture, label: &str, errors: &mut Vec<String>) {
    let h = &mut f.h;
    match t {
        Target::Tran
        | Target::Stby
        | Target::DataExtCsd
        | Target::DataRead
        | Target::Rcv
        | Target::Prg
        | Target::Dis
        | Target::Btst => {
            let base = match t {
                Target::Tran => st(4) | RFD,
                Target::Stby => st(3) | RFD,
                Target::DataExtCsd | Target::DataRead => st(5) | RFD,
                Target::Rcv => st(6) | RFD,
                // Busy programming: READY_FOR_DATA is 0 (§3 bit 8).
                Target::Prg => st(7),
                Target::Dis => st(8),
                Target::Btst => st(9) | RFD,
                _ => unreachable!(),
            };
            let first = status_word(tick(h, 13, RCA_ARG));
            expect_eq(
                errors,
                format!("{label}: next CMD13"),
                first,
                base | ILLEGAL,
            );
            let second = status_word(tick(h, 13, RCA_ARG));
            expect_eq(errors, format!("{label}: CMD13 after"), second, base);
        }
        Target::Ident => {
            let first = status_word(tick(h, 3, RCA_ARG));
            expect_eq(
                errors,
                format!("{label}: CMD3"),
                first,
                st(2) | RFD | ILLEGAL,
            );
            let second = status_word(tick(h, 13, RCA_ARG));
            expect_eq(
                errors,
                format!("{label}: CMD13 in stby"),
                second,
                st(3) | RFD,
            );
        }
        Target::Slp => {
            // In slp only CMD0 and CMD5 (awake) are legal; CMD5's R1b is the next status.
            let first = status_word(tick(h, 5, RCA_ARG));
            expect_eq(
                errors,
                format!("{label}: CMD5 awake"),
                first,
                st(10) | RFD | ILLEGAL,
            );
            h.wait_busy();
            let second = status_word(tick(h, 13, RCA_ARG));
            expect_eq(
                errors,
                format!("{label}: CMD13 in stby"),
                second,
                st(3) | RFD,
            );
        }
        Target::Idle | Target::PreIdle | Target::Ready => {
            // No command legal here answers with an R1. The next legal command (CMD1 or
            // CMD2) clears the bit (clear condition "b"), so CMD3 is clean.
            if t != Target::Ready {
                for _ in 0..10 {
                    match tick(h, 1, 0x40FF_8080) {
                        Some(Response::R3(ocr)) if ocr & (1 << 31) != 0 => break,
                        Some(Response::R3(_)) => {}
                        other => {
                            errors.push(format!("{label}: CMD1 answered {other:?}"));
                            return;
                        }
                    }
                }
            }
            if !matches!(tick(h, 2, 0), Some(Response::R2(_))) {
                errors.push(format!("{label}: CMD2 got no R2 afterwards"));
                return;
            }
            let first = status_word(tick(h, 3, RCA_ARG));
            expect_eq(errors, format!("{label}: CMD3"), first, st(2) | RFD);
        }
        Target::Ina => {
            if tick(h, 13, RCA_ARG).is_some() {
                errors.push(format!("{label}: ina answered CMD13"));
            }
            h.card.power_cycle(h.now, PowerDown::Clean);
            h.init();
            let s = status_word(tick(h, 13, RCA_ARG));
            expect_eq(
                errors,
                format!("{label}: CMD13 after power cycle"),
                s,
                st(4) | RFD,
            );
        }
    }
    resume(t, f, label, errors);
}

/// The transfer or operation the probe interrupted goes on unharmed.
fn resume(t: Target, f: &mut Fixture, label: &str, errors: &mut Vec<String>) {
    let h = &mut f.h;
    match t {
        Target::DataExtCsd => {
            let mut buf = [0u8; 512];
            match h.card.read_data(h.now, &mut buf) {
                Ok(_) if buf == h.card.ext_csd() => {}
                other => errors.push(format!("{label}: EXT_CSD block after probe: {other:?}")),
            }
        }
        Target::DataRead => {
            let mut buf = vec![0u8; 512];
            let r = h.card.read_data(h.now, &mut buf);
            if r.is_err() || buf[..] != f.user[..512] {
                errors.push(format!("{label}: read block after probe: {r:?}"));
            }
            status_word(tick(h, 12, 0));
        }
        Target::Rcv => {
            let block = common::pattern(0x99, 1);
            if let Err(e) = h.card.write_data(h.now, &block) {
                errors.push(format!("{label}: write block after probe: {e}"));
                return;
            }
            status_word(tick(h, 12, 0));
            h.wait_busy();
            // Any command after the busy period lets the card finish programming.
            let _ = tick(h, 13, RCA_ARG);
            let mut back = vec![0u8; 512];
            h.card.peek(Partition::User, RCV_LBA, &mut back).unwrap();
            if back != block {
                errors.push(format!("{label}: open-ended write did not land"));
            }
        }
        Target::Prg | Target::Dis => {
            h.wait_busy();
            h.now += 1;
            let _ = tick(h, 13, RCA_ARG);
            let want = if t == Target::Prg {
                CardState::Tran
            } else {
                CardState::Stby
            };
            if h.card.state() != want {
                errors.push(format!("{label}: after busy: {}", h.card.state()));
            }
            let mut back = vec![0u8; PRG_BLOCKS * 512];
            h.card.peek(Partition::User, PRG_LBA, &mut back).unwrap();
            if back != f.prg_data {
                errors.push(format!("{label}: the write being programmed did not land"));
            }
        }
        Target::Btst => {
            // 8-bit bus (set by init): 8 pattern bytes, CMD14 returns them inverted.
            let pattern = [0x55u8, 0xAA, 0, 0, 0, 0, 0, 0];
            if let Err(e) = h.card.write_data(h.now, &pattern) {
                errors.push(format!("{label}: bus-test pattern refused: {e}"));
                return;
            }
            let s = status_word(tick(h, 14, 0));
            expect_eq(errors, format!("{label}: CMD14"), s, st(9) | RFD);
            let mut back = [0u8; 8];
            let r = h.card.read_data(h.now, &mut back);
            if r.is_err() || back != pattern.map(|b| !b) {
                errors.push(format!("{label}: CMD14 pattern {back:02x?} ({r:?})"));
            }
        }
        _ => {}
    }
}

#[test]
fn illegal_commands_in_every_state_get_no_response_and_flag_only_the_next_status() {
    let mut errors = Vec::new();
    let mut probes = 0;
    for t in TARGETS {
        for index in 0u8..=63 {
            if legal_per_facts(index, t.state()) {
                continue;
            }
            probes += 1;
            let label = format!("CMD{index} in {t:?}");
            let mut f = enter(t);
            let illegal_before = f.h.card.stats().illegal_commands;
            let resp = tick(&mut f.h, index, RCA_ARG);
            if resp.is_some() {
                errors.push(format!("{label}: answered {resp:?}"));
            }
            if f.h.card.state() != t.state() {
                errors.push(format!("{label}: state became {}", f.h.card.state()));
                continue;
            }
            if matches!(t, Target::Idle | Target::PreIdle | Target::Ready)
                && f.h.card.stats().illegal_commands != illegal_before + 1
            {
                // No R1 can show it in these states; the card's own count must.
                errors.push(format!("{label}: not counted as an illegal command"));
            }
            check_after_probe(t, &mut f, &label, &mut errors);
            if let Err(e) = data_unchanged(&mut f) {
                errors.push(format!("{label}: {e}"));
            }
        }
    }
    assert!(probes > 600, "sweep ran only {probes} probes");
    assert!(
        errors.is_empty(),
        "{} of {probes} probes misbehaved:\n{}",
        errors.len(),
        errors.join("\n")
    );
}

#[test]
fn command_table_agrees_with_the_fact_sheet() {
    // The card's table may list a state where only the handler can tell (CMD12 in prg is
    // legal only as HPI carrier; CMD21 in tran only in HS200); those are checked by
    // behaviour in the sweep. Everything else must match in both directions.
    let states = TARGETS.map(Target::state);
    let mut errors = Vec::new();
    for index in 0u8..=63 {
        for &state in &states {
            let table = command::spec(index).is_some_and(|s| s.legal.contains(state));
            let facts = legal_per_facts(index, state);
            let handler_decides =
                matches!((index, state), (12, CardState::Prg) | (21, CardState::Tran));
            if table != facts && !handler_decides {
                errors.push(format!(
                    "CMD{index} in {state}: card table {table}, fact sheet {facts}"
                ));
            }
        }
    }
    assert!(errors.is_empty(), "{}", errors.join("\n"));
}

#[test]
fn sd_and_sdio_probes_in_idle_are_silent_and_flagged_as_illegal() {
    // Facts §1 notes and §14 step 2: CMD5, CMD8, CMD52 and CMD55 in idle get no answer.
    for (index, arg) in [(5u8, 0u32), (8, 0x1AA), (52, 0x8000_0C08), (55, 0)] {
        let mut f = enter(Target::Idle);
        let before = f.h.card.stats().illegal_commands;
        assert_eq!(tick(&mut f.h, index, arg), None, "CMD{index} in idle");
        assert_eq!(f.h.card.state(), CardState::Idle, "CMD{index}");
        assert_eq!(f.h.card.stats().illegal_commands, before + 1, "CMD{index}");
        // Identification goes on normally afterwards.
        to_ready(&mut f.h);
        assert!(matches!(f.h.cmd(2, 0), Some(Response::R2(_))));
        assert_eq!(f.h.r1(3, RCA_ARG), st(2) | RFD, "CMD3 after CMD{index}");
        data_unchanged(&mut f).unwrap();
    }
}

#[test]
fn cmd21_is_illegal_outside_hs200_and_answered_in_hs200() {
    let mut f = enter(Target::Tran);
    assert_eq!(
        f.h.card.bus_config(),
        (1, 2),
        "init leaves HS timing, 8-bit bus"
    );
    assert_eq!(tick(&mut f.h, 21, 0), None, "CMD21 in high-speed timing");
    assert_eq!(f.h.card.state(), CardState::Tran);
    assert_eq!(f.h.status(), st(4) | RFD | ILLEGAL);
    assert_eq!(f.h.status(), st(4) | RFD);
    // Control: with HS200 selected the same command is answered with the 128-byte
    // 8-bit tuning block (facts §12.6), so the refusal above was about the timing.
    f.h.switch_ok(ext::HS_TIMING, 2);
    assert_eq!(f.h.r1(21, 0), st(4) | RFD);
    let mut block = [0u8; 128];
    f.h.card
        .read_data(f.h.now, &mut block)
        .expect("tuning block");
    assert_eq!(&block[..4], &[0xff, 0xff, 0x00, 0xff]);
    assert_eq!(f.h.status(), st(4) | RFD);
    data_unchanged(&mut f).unwrap();
}

#[test]
fn cmd12_in_tran_is_illegal() {
    let mut f = enter(Target::Tran);
    for arg in [0u32, RCA_ARG, RCA_ARG | 1] {
        assert_eq!(tick(&mut f.h, 12, arg), None, "CMD12({arg:#x}) in tran");
        assert_eq!(f.h.card.state(), CardState::Tran);
        assert_eq!(f.h.status(), st(4) | RFD | ILLEGAL, "CMD12({arg:#x})");
        assert_eq!(f.h.status(), st(4) | RFD);
    }
    data_unchanged(&mut f).unwrap();
}

#[test]
fn cmd7_with_own_rca_while_selected_is_illegal() {
    // §1: own RCA selects only from stby (→ tran) and dis (→ prg).
    for t in [Target::Tran, Target::DataExtCsd, Target::Prg] {
        let mut f = enter(t);
        assert_eq!(tick(&mut f.h, 7, RCA_ARG), None, "CMD7 own RCA in {t:?}");
        assert_eq!(f.h.card.state(), t.state(), "{t:?}");
        let mut errors = Vec::new();
        check_after_probe(t, &mut f, &format!("CMD7 own RCA in {t:?}"), &mut errors);
        assert!(errors.is_empty(), "{}", errors.join("\n"));
        data_unchanged(&mut f).unwrap();
    }
}

#[test]
fn argument_dependent_illegal_commands() {
    let cases: [(Target, u8, u32, &str); 4] = [
        // §1/§10.6: CMD5 wakes only from slp and sleeps only from stby.
        (Target::Stby, 5, RCA_ARG, "CMD5 awake in stby"),
        (Target::Slp, 5, RCA_ARG | 1 << 15, "CMD5 sleep in slp"),
        // §10.6: in slp only CMD0 with 0 or 0xF0F0F0F0 is accepted.
        (
            Target::Slp,
            0,
            0x1234_5678,
            "CMD0 with another argument in slp",
        ),
        // §8: HPI is carried by CMD13 on this card (HPI_FEATURES = 0x01); CMD12 with the
        // HPI flag in prg is not an HPI and not a legal stop.
        (
            Target::Prg,
            12,
            RCA_ARG | 1,
            "CMD12 with the HPI flag in prg",
        ),
    ];
    for (t, index, arg, label) in cases {
        let mut f = enter(t);
        assert_eq!(tick(&mut f.h, index, arg), None, "{label}");
        assert_eq!(f.h.card.state(), t.state(), "{label}");
        let mut errors = Vec::new();
        check_after_probe(t, &mut f, label, &mut errors);
        assert!(errors.is_empty(), "{}", errors.join("\n"));
        data_unchanged(&mut f).unwrap();
    }
}

#[test]
fn several_illegal_commands_in_a_row_are_reported_once() {
    let mut f = enter(Target::Tran);
    for index in [11u8, 20, 49, 63] {
        assert_eq!(tick(&mut f.h, index, 0), None);
    }
    assert_eq!(f.h.status(), st(4) | RFD | ILLEGAL);
    assert_eq!(f.h.status(), st(4) | RFD);
}

#[test]
fn illegal_command_is_reported_in_the_next_data_command_response_too() {
    // The "next response" is whatever legal R1 comes next, not only CMD13; and the
    // command carrying the flag still executes normally.
    let mut f = enter(Target::Tran);
    assert_eq!(tick(&mut f.h, 3, RCA_ARG), None);
    assert_eq!(f.h.r1(17, USER_LBA as u32), st(4) | RFD | ILLEGAL);
    let mut block = vec![0u8; 512];
    f.h.card.read_data(f.h.now, &mut block).unwrap();
    assert_eq!(block[..], f.user[..512]);
    assert_eq!(f.h.status(), st(4) | RFD);
}

#[test]
fn command_with_crc_error_is_ignored_and_reported_as_com_crc_error_next() {
    let mut f = enter(Target::Tran);
    // A CMD7 deselect with a bad CRC must not deselect.
    let r =
        f.h.card
            .execute_checked(f.h.now + 10, Command::new(7, 0), false);
    f.h.now += 10;
    assert_eq!(r, None);
    assert_eq!(f.h.card.state(), CardState::Tran);
    assert_eq!(f.h.status(), st(4) | RFD | r1::COM_CRC_ERROR);
    assert_eq!(f.h.status(), st(4) | RFD);
    // A write with a bad CRC starts no transfer and writes nothing.
    let r =
        f.h.card
            .execute_checked(f.h.now + 10, Command::new(24, USER_LBA as u32), false);
    f.h.now += 10;
    assert_eq!(r, None);
    assert_eq!(f.h.card.state(), CardState::Tran);
    assert!(f.h.card.write_data(f.h.now, &[0u8; 512]).is_err());
    assert_eq!(f.h.status(), st(4) | RFD | r1::COM_CRC_ERROR);
    assert_eq!(f.h.status(), st(4) | RFD);
    data_unchanged(&mut f).unwrap();
}

#[test]
fn foreign_rca_cmd13_gets_no_response_and_no_error_bit() {
    for t in [Target::Tran, Target::Stby] {
        let mut f = enter(t);
        let before = f.h.card.stats().illegal_commands;
        assert_eq!(tick(&mut f.h, 13, 2 << 16), None, "{t:?}");
        assert_eq!(tick(&mut f.h, 13, 0), None, "RCA 0 in {t:?}");
        assert_eq!(f.h.card.state(), t.state());
        assert_eq!(f.h.card.stats().illegal_commands, before);
        let base = if t == Target::Tran { st(4) } else { st(3) } | RFD;
        assert_eq!(
            status_word(tick(&mut f.h, 13, RCA_ARG)),
            Some(base),
            "{t:?}"
        );
    }
}

#[test]
fn inactive_card_answers_nothing_until_a_power_cycle() {
    let mut f = enter(Target::Ina);
    for index in 0u8..=63 {
        for arg in [0u32, RCA_ARG, 0xF0F0_F0F0] {
            assert_eq!(
                tick(&mut f.h, index, arg),
                None,
                "CMD{index}({arg:#x}) in ina"
            );
            assert_eq!(f.h.card.state(), CardState::Ina);
        }
    }
    data_unchanged(&mut f).unwrap();
    f.h.card.power_cycle(f.h.now, PowerDown::Clean);
    assert_eq!(f.h.card.state(), CardState::Idle);
    f.h.init();
    assert_eq!(
        f.h.status(),
        st(4) | RFD,
        "no error survives the power cycle"
    );
    data_unchanged(&mut f).unwrap();
}

/// Facts §3 clear condition "b": ILLEGAL_COMMAND and COM_CRC_ERROR relate to the previous
/// command and are cleared once a valid command is received. CMD39 FAST_IO (legal in
/// stby, facts §1) answers with an R4, which carries no status, so the bit is never seen
/// — but it is still cleared, and the CMD13 after CMD39 must be clean.
fn flag_then_cmd39_then_status(f: &mut Fixture, raise: impl Fn(&mut Host)) -> Option<u32> {
    raise(&mut f.h);
    assert!(
        matches!(tick(&mut f.h, 39, RCA_ARG), Some(Response::R4(_))),
        "CMD39 in stby answers R4"
    );
    status_word(tick(&mut f.h, 13, RCA_ARG))
}

#[test]
fn illegal_flag_is_cleared_by_a_valid_command_whose_response_has_no_status() {
    let mut f = enter(Target::Stby);
    let s = flag_then_cmd39_then_status(&mut f, |h| {
        assert_eq!(tick(h, 6, 0x03B7_0200), None, "CMD6 is illegal in stby");
    });
    assert_eq!(
        s,
        Some(st(3) | RFD),
        "ILLEGAL_COMMAND must not outlive the valid CMD39"
    );
}

#[test]
fn crc_error_flag_is_cleared_by_a_valid_command_whose_response_has_no_status() {
    let mut f = enter(Target::Stby);
    let s = flag_then_cmd39_then_status(&mut f, |h| {
        h.now += 10;
        let r = h
            .card
            .execute_checked(h.now, Command::new(13, RCA_ARG), false);
        assert_eq!(r, None, "a command with a CRC error gets no response");
    });
    assert_eq!(
        s,
        Some(st(3) | RFD),
        "COM_CRC_ERROR must not outlive the valid CMD39"
    );
}

/// CMD16 + CMD42 with a lock/unlock data block (byte 0 flags, byte 1 length, password).
fn lock_unlock(h: &mut Host, flags: u8, password: &[u8]) {
    let mut block = vec![flags, password.len() as u8];
    block.extend_from_slice(password);
    let s = h.r1(16, block.len() as u32);
    assert_eq!(s & r1::ERRORS, 0, "CMD16: {}", r1::describe(s));
    let s = h.r1(42, 0);
    assert_eq!(s & r1::ERRORS, 0, "CMD42: {}", r1::describe(s));
    h.card.write_data(h.now, &block).expect("CMD42 block");
    h.wait_busy();
    assert_eq!(h.status() & r1::LOCK_UNLOCK_FAILED, 0);
    assert_eq!(h.r1(16, 512) & r1::ERRORS, 0);
}

#[test]
fn block_write_erase_and_protection_commands_are_illegal_while_locked() {
    // A password-locked card takes only the basic, lock and application commands (and
    // CMD16); class 2, 4, 5 and 6 commands are illegal there.
    let mut f = enter(Target::Tran);
    lock_unlock(&mut f.h, 0x05, b"pass"); // SET_PWD | LOCK_UNLOCK
    let locked = st(4) | RFD | r1::DEVICE_IS_LOCKED;
    assert_eq!(
        f.h.status(),
        locked,
        "DEVICE_IS_LOCKED follows the lock state"
    );
    let u = USER_LBA as u32;
    for (index, arg) in [
        (17u8, u),
        (18, u),
        (23, 1),
        (24, u),
        (25, u),
        (35, u),
        (36, u),
        (38, 0),
        (28, u),
        (29, u),
        (30, u),
        (31, u),
    ] {
        assert_eq!(tick(&mut f.h, index, arg), None, "CMD{index} while locked");
        assert_eq!(f.h.card.state(), CardState::Tran, "CMD{index}");
        assert_eq!(f.h.status(), locked | ILLEGAL, "CMD{index} while locked");
        assert_eq!(f.h.status(), locked);
    }
    data_unchanged(&mut f).unwrap();
    // Unlocked, the same read works again.
    lock_unlock(&mut f.h, 0x00, b"pass");
    assert_eq!(f.h.status(), st(4) | RFD);
    assert_eq!(f.h.read(USER_LBA, PATTERN_BLOCKS), f.user);
}
