use super::*;
use crate::model::builtin_model_names;
use crate::timing::EraseKind;

fn model(name: &str) -> DeviceModel {
    DeviceModel::load(name).unwrap()
}

fn program(t: &mut FlashTiming, sector: u64, count: u32, target: ProgramTarget) -> Nanos {
    t.program(
        0,
        &Program {
            sector,
            count,
            target,
            reliable: false,
            packed_entry: false,
        },
    )
    .busy_ns
}

#[test]
fn every_flash_builtin_builds_and_the_others_do_not() {
    let mut flash = 0;
    for name in builtin_model_names() {
        let m = model(name);
        let built = FlashTiming::new(&m);
        assert_eq!(built.is_some(), m.timing.as_flash().is_some(), "{name}");
        flash += usize::from(built.is_some());
    }
    assert!(flash >= 4);
}

#[test]
fn the_model_owns_its_debt_and_reports_no_background_cost() {
    let m = model("sandisk-sem32g");
    let mut t = FlashTiming::new(&m).unwrap();
    let user = t.user_start;
    let c = t.program(
        0,
        &Program {
            // One random 16 KiB page (a sub-page write would wait in the temporary page).
            sector: user + 12352,
            count: 32,
            target: ProgramTarget::Medium,
            reliable: false,
            packed_entry: false,
        },
    );
    assert_eq!(c.background_ns, 0);
    assert!(c.busy_ns > 0);
    assert!(
        t.background_debt().unwrap() > 0,
        "a random write left SLC fold debt"
    );
    assert_eq!(t.stats().ftl.slc_writes, 1);
}

#[test]
fn cached_writes_cost_ram_time_and_are_destaged_at_their_own_addresses() {
    let m = model("msm-emmc45-sdr50");
    let mut t = FlashTiming::new(&m).unwrap();
    let user = t.user_start;
    let f = m.timing.as_flash().unwrap();
    let cached = program(&mut t, user + 8192, 128, ProgramTarget::Cache);
    let ram = f.controller.write_command_ns + (128 * 512 * f.cache.accept_ns_per_kib) / 1024;
    assert_eq!(cached, ram);
    assert_eq!(
        t.stats().nand.pages_programmed,
        0,
        "nothing reached the NAND yet"
    );
    // Destaging writes the cached sectors (a 64 KiB write unit at the start of an AU),
    // whatever sector the card names.
    let destage = t.destage(0, 0, 128).busy_ns;
    let mut direct = FlashTiming::new(&m).unwrap();
    let same = direct.write_medium(user + 8192, 128, false);
    assert_eq!(destage, same);
    assert_eq!(t.stats().ftl.buffer_b_writes, 1);
    assert_eq!(t.destage(0, 0, 128).busy_ns, 0, "nothing left to destage");
    assert_eq!(t.flush(0).busy_ns, f.cache.flush_ns);
}

#[test]
fn boot_and_rpmb_writes_use_the_system_area_not_the_aus() {
    let m = model("toshiba-mmc32g");
    let mut t = FlashTiming::new(&m).unwrap();
    assert!(t.user_start > 0);
    let cost = program(&mut t, 16, 8, ProgramTarget::Medium);
    assert!(cost > 0);
    let s = t.stats();
    assert_eq!(s.open_aus, 0);
    assert_eq!(s.ftl.buffer_a_writes + s.ftl.buffer_b_writes, 0);
    assert_eq!(s.nand.slc_pages_programmed, 1);
}

#[test]
fn erase_durations_stay_within_the_advertised_timeouts() {
    let mut m = model("toshiba-mmc32g");
    m.timing.flash_mut().nand.erase_block_ns = 10_000_000_000; // a 10 s erase
    let mut t = FlashTiming::new(&m).unwrap();
    let user = t.user_start;
    for s in (0..8192u64 * 4).step_by(1024) {
        program(&mut t, user + s, 1024, ProgramTarget::Medium);
    }
    for kind in [EraseKind::Erase, EraseKind::Trim, EraseKind::SecureErase] {
        let op = Erase {
            kind,
            sector: user,
            count: 8192,
            groups: 8,
        };
        let limit = t.erase.limit(kind, 8).unwrap();
        let cost = t.erase(0, &op).busy_ns;
        assert!(cost <= limit, "{kind:?}: {cost} > {limit}");
    }
    // Sleep, HPI and switches come straight from the controller model, which validation
    // keeps within S_A_TIMEOUT, OUT_OF_INTERRUPT_TIME and GENERIC_CMD6_TIME.
    let c = &m.timing.as_flash().unwrap().controller;
    assert_eq!(t.sleep_awake(0).busy_ns, c.sleep_awake_ns);
    assert_eq!(t.hpi_exit(0), c.hpi_exit_ns);
    assert_eq!(t.switch(0, SwitchKind::Generic).busy_ns, c.switch_ns);
}

#[test]
fn trimming_before_rewriting_saves_the_collection() {
    let m = model("toshiba-mmc32g");
    let run = |trim: bool| {
        let mut t = FlashTiming::new(&m).unwrap();
        let user = t.user_start;
        let au = 8192;
        for s in (0..au * 10).step_by(1024) {
            program(&mut t, user + s, 1024, ProgramTarget::Medium);
        }
        if trim {
            t.erase(
                0,
                &Erase {
                    kind: EraseKind::Trim,
                    sector: user,
                    count: 10 * au,
                    groups: 80,
                },
            );
        }
        // Small rewrites in 8 AUs: the 8th collects an AU — with data, or trimmed.
        (0..8)
            .map(|i| program(&mut t, user + i * au, 64, ProgramTarget::Medium))
            .sum::<Nanos>()
    };
    let used = run(false);
    let trimmed = run(true);
    assert!(trimmed * 3 < used, "trimmed {trimmed} vs used {used}");
}

#[test]
fn critical_debt_makes_the_next_write_collect_in_the_foreground() {
    let mut m = model("sandisk-sem32g");
    let fold = {
        let f = m.timing.flash_mut();
        f.bkops.level_ns = [300_000_000, 600_000_000, 1_000_000_000];
        f.bkops.foreground_target_ns = 600_000_000;
        f.ftl.slc_cache.as_mut().unwrap().capacity_bytes = 1 << 30;
        FlashTiming::new(&m).unwrap().ftl.debt_ns()
    };
    assert_eq!(fold, 0);
    let mut t = FlashTiming::new(&m).unwrap();
    let user = t.user_start;
    let au = 4096;
    for i in 0..10 {
        for s in (0..au).step_by(1024) {
            program(&mut t, user + i * au + s, 1024, ProgramTarget::Medium);
        }
    }
    // Random 16 KiB page writes in four AUs: each leaves a fold (~0.29 s) behind.
    for i in 0..4 {
        program(&mut t, user + i * au + 128, 32, ProgramTarget::Medium);
    }
    assert_eq!(t.bkops_level(t.background_debt().unwrap()), 3);
    let debt = t.background_debt().unwrap();
    let stall = program(&mut t, user + 5 * au + 128, 32, ProgramTarget::Medium);
    assert!(
        stall > 500_000_000,
        "a write behind critical debt folds in the foreground: {stall} ns (debt {debt})"
    );
    assert!(t.background_debt().unwrap() <= 600_000_000 + 300_000_000);
    assert!(t.stats().ftl.foreground_ns > 0);
}

#[test]
fn same_model_same_requests_same_times() {
    let mut m = model("toshiba-mmc32g");
    m.timing.flash_mut().nand.jitter_permille = 50;
    let run = |m: &DeviceModel| {
        let mut t = FlashTiming::new(m).unwrap();
        let user = t.user_start;
        (0..500u64)
            .map(|i| {
                program(
                    &mut t,
                    user + (i * 7717) % 500_000,
                    16,
                    ProgramTarget::Medium,
                )
            })
            .collect::<Vec<_>>()
    };
    assert_eq!(run(&m), run(&m));
    let mut other = m.clone();
    other.timing.flash_mut().seed ^= 1;
    assert_ne!(run(&m), run(&other), "the seed drives the jitter");
}
