//! One test per FTL mechanism, on a small card with round numbers:
//! 2 KiB pages (4 sectors), 2 planes → 4 KiB write units (8 sectors), 64 KiB AUs
//! (16 write units, 128 sectors).

use super::*;
use crate::model::{BufferAModel, SlcCacheModel, SpecialRegionModel, SubPageBufferModel};

const PAGE: u64 = 4;
const WU: u64 = 8;
const AU: u64 = 128;
const T_R: Nanos = 10;
const T_PROG: Nanos = 100;
const T_ERASE: Nanos = 1000;
/// Channel time of one page (2 KiB at 1 ns/KiB).
const XFER_PAGE: Nanos = 2;

fn nand_model() -> NandModel {
    NandModel {
        page_bytes: 2048,
        planes: 2,
        dies: 1,
        block_pages: 16,
        read_page_ns: T_R,
        read_page_slow_ns: 0,
        program_page_ns: T_PROG,
        program_page_slow_ns: 0,
        slc_program_page_ns: 0,
        erase_block_ns: T_ERASE,
        channel_ns_per_kib: 1,
        jitter_permille: 0,
    }
}

fn ftl_model() -> FtlModel {
    FtlModel {
        allocation_unit_bytes: AU * 512,
        open_aus_linear: 2,
        open_aus_random: 2,
        eviction: Eviction::Lru,
        random_writes: RandomWrites::WriteUnit,
        gc_copy: GcCopy::Copyback,
        sequential_write_ns: 0,
        reliable_write_ns: 0,
        coalesce_sub_page: false,
        spare_aus: 0,
        buffer_a: None,
        slc_cache: None,
        sub_page_buffer: None,
        special_region: None,
    }
}

/// Program of one write unit: its channel time plus tPROG.
const WU_PROGRAM: Nanos = 2 * XFER_PAGE + T_PROG;
/// Copy-back of one write unit: one multi-plane read and one program.
const WU_COPY: Nanos = T_R + T_PROG;

struct Card {
    ftl: Ftl,
    nand: Nand,
}

impl Card {
    fn new(m: FtlModel) -> Card {
        Card {
            ftl: Ftl::new(&m, &nand_model(), 64 * AU, 1),
            nand: Nand::new(&nand_model(), 1),
        }
    }

    fn write(&mut self, sector: u64, count: u64) -> Nanos {
        self.ftl.write(&mut self.nand, sector, count, false)
    }

    fn write_reliable(&mut self, sector: u64, count: u64) -> Nanos {
        self.ftl.write(&mut self.nand, sector, count, true)
    }

    /// Write AUs `aus` completely, one write unit at a time (a used card).
    fn fill(&mut self, aus: std::ops::Range<u64>) {
        for s in (aus.start * AU..aus.end * AU).step_by(WU as usize) {
            self.write(s, WU);
        }
    }

    fn counters(&self) -> FtlCounters {
        self.ftl.counters
    }
}

#[test]
fn writing_an_au_linearly_needs_no_garbage_collection() {
    let mut c = Card::new(ftl_model());
    let mut t = 0;
    for s in (0..AU).step_by(WU as usize) {
        t += c.write(s, WU);
    }
    assert_eq!(
        t,
        16 * WU_PROGRAM,
        "whole write units, nothing copied or erased"
    );
    let k = c.counters();
    assert_eq!((k.gc_runs, k.au_completions, k.au_opens), (0, 1, 1));
    assert_eq!(c.ftl.open_aus(), 0, "a completed AU is closed");
    // Rewriting it completely erases the old copy once, still without copying.
    let t2: Nanos = (0..AU).step_by(WU as usize).map(|s| c.write(s, WU)).sum();
    assert_eq!(t2, 16 * WU_PROGRAM + T_ERASE);
    assert_eq!(c.counters().gc_copied_units, 0);
}

#[test]
fn opening_one_au_too_many_collects_the_least_recently_written() {
    let mut c = Card::new(ftl_model());
    c.fill(0..3);
    c.write(0, WU); // AU 0 open, 1 of 16 write units rewritten
    c.write(AU, WU); // AU 1 open
    c.write(0, WU); // AU 0 written again: AU 1 is now the least recently written
    let t = c.write(2 * AU, WU); // a third AU: AU 1 must be collected
    assert_eq!(t, WU_PROGRAM + 15 * WU_COPY + T_ERASE);
    let k = c.counters();
    assert_eq!((k.au_evictions, k.gc_runs, k.gc_copied_units), (1, 1, 15));
    assert_eq!(k.gc_ns, 15 * WU_COPY + T_ERASE, "the collection's own time");
    // AU 0 stayed open: writing it costs no collection.
    assert_eq!(c.write(WU, WU), WU_PROGRAM);
}

#[test]
fn fifo_eviction_collects_the_first_opened_even_if_written_last() {
    let mut c = Card::new(FtlModel {
        eviction: Eviction::Fifo,
        ..ftl_model()
    });
    c.fill(0..3);
    c.write(0, WU);
    c.write(AU, WU);
    c.write(WU, WU); // AU 0 is written last but was opened first
    c.write(2 * AU, WU);
    // AU 1 survived: writing it again opens nothing.
    let opens = c.counters().au_opens;
    c.write(AU + WU, WU);
    assert_eq!(c.counters().au_opens, opens);
    c.write(2 * WU, WU);
    assert_eq!(c.counters().au_opens, opens + 1, "AU 0 was the victim");
}

#[test]
fn random_eviction_is_seeded_and_replays() {
    let run = |seed: u64| {
        let m = FtlModel {
            eviction: Eviction::Random,
            open_aus_linear: 4,
            ..ftl_model()
        };
        let mut ftl = Ftl::new(&m, &nand_model(), 64 * AU, seed);
        let mut nand = Nand::new(&nand_model(), seed);
        (0..200u64)
            .map(|i| ftl.write(&mut nand, (i * 7 % 12) * AU, WU, false))
            .collect::<Vec<_>>()
    };
    assert_eq!(run(5), run(5));
    assert_ne!(run(5), run(6));
}

#[test]
fn a_partly_written_write_unit_is_read_modify_written_only_if_it_holds_data() {
    let mut c = Card::new(ftl_model());
    // Fresh: nothing to read back.
    assert_eq!(c.write(0, PAGE), WU_PROGRAM);
    c.fill(1..2);
    // Half of a write unit holding data: read the other page, program the unit.
    assert_eq!(c.write(AU, PAGE), T_R + XFER_PAGE + WU_PROGRAM);
    assert_eq!(c.counters().read_modify_writes, 1);
}

#[test]
fn linear_only_aus_are_collected_when_written_below_their_write_position() {
    let mut c = Card::new(FtlModel {
        random_writes: RandomWrites::None,
        ..ftl_model()
    });
    c.fill(0..1);
    c.write(4 * WU, WU);
    c.write(5 * WU, WU);
    let t = c.write(2 * WU, WU); // backwards: collect (14 units copied), reopen, write
    assert_eq!(t, 14 * WU_COPY + T_ERASE + WU_PROGRAM);
    // A card that allows random writes at write-unit granularity just writes it.
    let mut r = Card::new(ftl_model());
    r.fill(0..1);
    r.write(4 * WU, WU);
    r.write(5 * WU, WU);
    assert_eq!(r.write(2 * WU, WU), WU_PROGRAM);
}

#[test]
fn random_use_is_limited_separately_within_the_open_aus() {
    let mut c = Card::new(FtlModel {
        open_aus_linear: 3,
        open_aus_random: 1,
        ..ftl_model()
    });
    c.fill(0..3);
    c.write(0, WU); // AU 0 opens at its start: linear
    c.write(3 * WU, WU); // away from its write position: AU 0 goes random
    c.write(AU, WU); // AU 1 linear
    let evictions = c.counters().au_evictions;
    let t = c.write(AU + 5 * WU, WU); // AU 1 goes random: AU 0 must leave the random pool
    assert_eq!(c.counters().au_evictions, evictions + 1);
    assert_eq!(t, WU_PROGRAM + 14 * WU_COPY + T_ERASE);
    // Linear use is unaffected: AU 2 opens without evicting (3 may be open).
    c.write(2 * AU, WU);
    assert_eq!(c.counters().au_evictions, evictions + 1);
}

fn buffer_a(rule: BufferARule) -> FtlModel {
    FtlModel {
        buffer_a: Some(BufferAModel {
            rule,
            run_limit_bytes: 4096,
            reliable_breaks_run: true,
            log_pages: 64,
            index_page: false,
            pages_per_au: 0,
        }),
        ..ftl_model()
    }
}

/// A small write within one page of a used AU: read the page, program it into the log.
const PAGE_RMW: Nanos = T_R + XFER_PAGE + XFER_PAGE + T_PROG;

#[test]
fn page_span_sends_writes_within_a_page_to_buffer_a_and_straddling_ones_to_buffer_b() {
    let mut c = Card::new(buffer_a(BufferARule::PageSpan));
    c.fill(0..6);
    // A used card: both open AUs are partly rewritten ones holding data.
    c.write(4 * AU, WU);
    c.write(5 * AU, WU);
    let a = c.counters().buffer_a_writes;
    assert_eq!(c.write(1, 2), PAGE_RMW, "inside page 0: buffer A");
    assert_eq!(c.counters().buffer_a_writes, a + 1);
    // 2 sectors straddling pages 0|1 of AU 1 (one write unit): buffer B, which opens
    // AU 1 and collects the least recently written open AU.
    let t = c.write(AU + PAGE - 1, 2);
    assert!(
        t > 10 * WU_COPY,
        "buffer B in an AU not open costs a collection: {t}"
    );
    assert_eq!(c.counters().buffer_a_writes, a + 1);
    // The same sectors split at the page boundary stay in buffer A.
    let t = c.write(2 * AU + PAGE - 1, 1) + c.write(2 * AU + PAGE, 1);
    assert_eq!(t, 2 * PAGE_RMW);
    assert_eq!(c.counters().buffer_a_writes, a + 3);
}

#[test]
fn an_open_au_takes_its_own_small_writes() {
    let mut c = Card::new(buffer_a(BufferARule::PageSpan));
    c.fill(0..1);
    c.write(4 * WU, WU); // AU 0 open
    let a = c.counters().buffer_a_writes;
    let t = c.write(1, 1);
    assert_eq!(c.counters().buffer_a_writes, a, "not buffer A");
    // Read-modify-write of write unit 0 in the open AU (both pages, one partly covered).
    assert_eq!(t, T_R + 2 * XFER_PAGE + WU_PROGRAM);
}

#[test]
fn consecutive_run_rule_joins_writes_unless_they_are_reliable() {
    let mut c = Card::new(buffer_a(BufferARule::ConsecutiveRun));
    c.fill(0..2);
    c.fill(2..6);
    // Two consecutive pieces across a page boundary: the second joins the run → buffer B.
    c.write(PAGE - 1, 1);
    let b = c.counters().buffer_b_writes;
    c.write(PAGE, 1);
    assert_eq!(c.counters().buffer_b_writes, b + 1);
    // The same with reliable writes: each stays in buffer A.
    let a = c.counters().buffer_a_writes;
    c.write_reliable(AU + PAGE - 1, 1);
    c.write_reliable(AU + PAGE, 1);
    assert_eq!(c.counters().buffer_a_writes, a + 2);
}

#[test]
fn run_length_rule_sends_runs_longer_than_the_limit_to_buffer_b() {
    let mut m = buffer_a(BufferARule::RunLength);
    m.buffer_a.as_mut().unwrap().run_limit_bytes = 2048; // 4 sectors
    let mut c = Card::new(m);
    c.fill(0..1);
    c.fill(1..5);
    // Four consecutive 1-sector writes: the run grows to the limit in buffer A …
    for i in 0..4 {
        c.write(i, 1);
    }
    assert_eq!(c.counters().buffer_a_writes, 4);
    // … the fifth makes it longer than the limit: buffer B, with the run's part of the
    // write unit moved along (the "entire 32KB getting pushed").
    let b = c.counters().buffer_b_writes;
    c.write(4, 1);
    assert_eq!(c.counters().buffer_b_writes, b + 1);
    assert_eq!(c.ftl.log_pages(), 0, "the run's log copies were superseded");
}

#[test]
fn a_full_small_write_log_merges_its_oldest_page() {
    let mut m = buffer_a(BufferARule::PageSpan);
    m.buffer_a.as_mut().unwrap().log_pages = 2;
    let mut c = Card::new(m);
    c.fill(0..8);
    c.fill(8..12);
    c.write(1, 1);
    c.write(AU + 1, 1);
    assert_eq!(c.ftl.log_pages(), 2);
    let t = c.write(2 * AU + 1, 1);
    assert_eq!(
        t,
        PAGE_RMW + WU_COPY,
        "the oldest page is merged into its AU"
    );
    assert_eq!(c.ftl.log_pages(), 2);
    assert_eq!(c.counters().log_merges, 1);
}

#[test]
fn too_many_log_pages_of_one_au_merge_that_au() {
    let mut m = buffer_a(BufferARule::PageSpan);
    m.buffer_a.as_mut().unwrap().pages_per_au = 3;
    let mut c = Card::new(m);
    c.fill(0..1);
    c.fill(1..5);
    for p in 0..3 {
        assert_eq!(c.write(p * PAGE + 1, 1), PAGE_RMW);
    }
    let t = c.write(3 * PAGE + 1, 1);
    assert_eq!(t, PAGE_RMW + 16 * WU_COPY + T_ERASE, "AU 0 rewritten");
    assert_eq!(c.ftl.log_pages(), 0);
}

/// Seed 003's linear small writes cost the same per write from 512 B to 8 KiB: the log
/// takes a page per small write, rewrites of a page already in the log included, so an
/// AU's merge comes after as many writes whether they land in one page or in many.
#[test]
fn rewrites_of_one_page_count_toward_the_au_merge_like_writes_of_new_pages() {
    let mut m = buffer_a(BufferARule::PageSpan);
    m.buffer_a.as_mut().unwrap().pages_per_au = 3;
    let mut c = Card::new(m);
    c.fill(0..1);
    c.fill(1..5);
    // Three small writes into page 0 of AU 0: one log page of data, three log writes.
    for i in 0..3 {
        assert_eq!(c.write(1 + i, 1), PAGE_RMW, "write {i}: no merge yet");
    }
    assert_eq!(c.ftl.log_pages(), 1);
    let t = c.write(4, 1);
    assert_eq!(
        t,
        PAGE_RMW + 16 * WU_COPY + T_ERASE,
        "the fourth merges AU 0"
    );
    assert_eq!(c.ftl.log_pages(), 0);
    // After the merge the count starts again.
    assert_eq!(c.write(5, 1), PAGE_RMW);
}

#[test]
fn index_pages_add_a_program_per_small_write() {
    let mut m = buffer_a(BufferARule::PageSpan);
    m.buffer_a.as_mut().unwrap().index_page = true;
    let mut c = Card::new(m);
    c.fill(0..1);
    c.fill(1..5);
    assert_eq!(c.write(1, 1), PAGE_RMW + XFER_PAGE + T_PROG);
}

fn coalescing() -> FtlModel {
    FtlModel {
        coalesce_sub_page: true,
        ..ftl_model()
    }
}

#[test]
fn sub_page_writes_wait_until_a_non_contiguous_write_or_a_full_page() {
    let mut c = Card::new(coalescing());
    assert_eq!(c.write(0, 1), 0, "held in RAM");
    assert_eq!(c.write(1, 1), 0, "contiguous: still held");
    let held = c.write(2, 2); // completes page 0: programmed once
    assert!(held > 0);
    assert_eq!(c.counters().coalesced_writes, 3);
    assert_eq!(c.write(9, 1), 0);
    let flushed = c.write(40, 1); // not contiguous: the pending piece is programmed now
    assert!(flushed > 0, "the non-contiguous write pays the flush");
    assert!(c.ftl.flush_pending(&mut c.nand) > 0);
    assert_eq!(c.ftl.flush_pending(&mut c.nand), 0);
}

/// The coalescing buffer as a temporary SLC page: 20 ns + 80 ns per KiB to program a
/// sub-page write into it, 7 ns to close it.
fn temp_page() -> FtlModel {
    FtlModel {
        coalesce_sub_page: true,
        sub_page_buffer: Some(SubPageBufferModel {
            program_ns: 20,
            program_ns_per_kib: 80,
            close_ns: 7,
        }),
        ..slc()
    }
}

#[test]
fn sub_page_writes_are_programmed_into_a_temporary_page_that_a_non_contiguous_write_closes() {
    let mut c = Card::new(temp_page());
    // 512 B: 1 ns on the channel, 20 + 40 ns of partial program.
    let small = 1 + 20 + 40;
    assert_eq!(c.write(0, 1), small, "in flash before the write completes");
    assert_eq!(
        c.write(1, 1),
        small,
        "a contiguous write is programmed there too"
    );
    assert_eq!(
        c.write(2, 2),
        XFER_PAGE + T_PROG,
        "the write completing the page programs the page whole, into the SLC cache"
    );
    assert_eq!(c.counters().temp_page_programs, 2);
    assert_eq!(c.counters().coalesced_writes, 3);
    assert_eq!(c.ftl.slc_aus(), 1);
    // 1.5 KiB would take 20 + 120 ns: never more than programming the whole page.
    assert_eq!(c.write(8, 3), XFER_PAGE + T_PROG);
    // A write elsewhere closes the temporary page: its sectors join the SLC cache as they
    // are, with no second program; only the new write is programmed.
    let programmed = c.nand.counters.pages_programmed;
    assert_eq!(c.write(AU + 1, 1), 7 + small);
    assert_eq!(c.nand.counters.pages_programmed, programmed + 1);
    assert_eq!(c.counters().temp_page_programs, 4);
    assert_eq!(
        c.ftl.flush_pending(&mut c.nand),
        7,
        "closing costs close_ns alone"
    );
    assert_eq!(
        c.ftl.slc_aus(),
        2,
        "the closed page of AU 1 is cached data to fold"
    );
    assert_eq!(c.ftl.flush_pending(&mut c.nand), 0);
}

fn slc() -> FtlModel {
    FtlModel {
        slc_cache: Some(SlcCacheModel {
            max_write_bytes: 8192,
            capacity_bytes: 16 * 2048,
            max_aus: 0,
        }),
        ..ftl_model()
    }
}

#[test]
fn random_writes_go_to_the_slc_cache_and_leave_fold_debt() {
    let mut c = Card::new(slc());
    c.fill(0..4);
    let opens = c.counters().au_opens;
    // A random write unit in three AUs: SLC, no AU opened.
    for au in 0..3 {
        assert_eq!(c.write(au * AU + 3 * WU, WU), 2 * XFER_PAGE + T_PROG);
    }
    assert_eq!(c.counters().au_opens, opens);
    assert_eq!(c.counters().slc_writes, 3);
    assert_eq!(c.ftl.slc_aus(), 3);
    let fold = 16 * WU_COPY + T_ERASE;
    assert_eq!(c.ftl.debt_ns(), 3 * fold);
    // Larger random writes bypass the cache.
    c.write(3 * AU + 4 * WU, 4 * WU);
    assert_eq!(c.counters().slc_writes, 3);
    // Background work folds whole AUs: 1.5 AUs' worth of time folds one, carries the rest.
    let done = c.ftl.work(&mut c.nand, fold + fold / 2);
    assert_eq!(done, fold + fold / 2);
    assert_eq!(c.ftl.slc_aus(), 2);
    c.ftl.work(&mut c.nand, fold / 2);
    assert_eq!(
        c.ftl.slc_aus(),
        1,
        "the carried half completes the second fold"
    );
    // With nothing left, background time is not used.
    c.ftl.work(&mut c.nand, fold);
    assert_eq!(c.ftl.work(&mut c.nand, fold), 0);
    assert_eq!(c.ftl.debt_ns(), 0);
}

#[test]
fn a_full_slc_cache_folds_its_oldest_au_in_the_foreground() {
    let mut c = Card::new(slc());
    c.fill(0..8);
    // 16 pages of capacity; each random write unit caches 2.
    for au in 0..8 {
        c.write(au * AU + 3 * WU, WU);
    }
    assert_eq!(c.ftl.slc_aus(), 8);
    let t = c.write(5 * WU, WU); // AU 0 again: 18 pages > 16
    assert_eq!(t, 2 * XFER_PAGE + T_PROG + 16 * WU_COPY + T_ERASE);
    assert_eq!(c.ftl.slc_aus(), 7);
}

/// A page rewritten while it is in the SLC cache supersedes its cached copy: it takes no
/// more of the cache (seed 003 -A writes 1 KiB again and again at the same 64 AUs with
/// no collection).
#[test]
fn rewriting_a_cached_page_takes_no_more_of_the_cache() {
    let mut c = Card::new(slc());
    c.fill(0..2);
    // 16 pages of capacity; the same write unit (2 pages) rewritten 20 times.
    for _ in 0..20 {
        assert_eq!(c.write(3 * WU, WU), 2 * XFER_PAGE + T_PROG);
    }
    assert_eq!(c.counters().gc_runs, 0, "nothing folded");
    assert_eq!(c.ftl.slc_aus(), 1);
    // New pages still fill it: 7 more write units of AU 1 fit, the 8th folds AU 0.
    for w in 0..7 {
        c.write(AU + (2 * w + 1) * WU, WU);
    }
    assert_eq!(c.counters().gc_runs, 0);
    c.write(AU + 15 * WU, WU);
    assert_eq!(c.counters().gc_runs, 1);
    assert_eq!(c.ftl.slc_aus(), 1);
}

/// The fold debt of an AU is what its fold would cost: an AU that held no data before
/// its cached write unit copies that unit and erases nothing; a full one copies all 16
/// and erases its old copy. BKOPS is charged the same.
#[test]
fn fold_debt_is_what_folding_each_cached_au_would_cost() {
    let mut c = Card::new(slc());
    c.fill(0..1);
    c.write(3 * WU, WU); // AU 0, full: cached
    c.write(AU + 3 * WU, WU); // AU 1, never written: cached
    assert_eq!(c.ftl.slc_aus(), 2);
    let full = 16 * WU_COPY + T_ERASE;
    assert_eq!(c.ftl.debt_ns(), full + WU_COPY);
    // A second write unit in the fresh AU adds one unit to its fold.
    c.write(AU + 7 * WU, WU);
    assert_eq!(c.ftl.debt_ns(), full + 2 * WU_COPY);
    // BKOPS folds the full AU first, then the fresh one, for what each cost.
    assert_eq!(c.ftl.work(&mut c.nand, full), full);
    assert_eq!(c.ftl.debt_ns(), 2 * WU_COPY);
    assert_eq!(c.ftl.work(&mut c.nand, 10 * full), 2 * WU_COPY);
    assert_eq!((c.ftl.slc_aus(), c.ftl.debt_ns()), (0, 0));
}

/// A cache that can hold data of `max_aus` AUs folds its oldest one before taking data
/// of one AU more, so scattered random writes pay a fold each instead of piling up debt.
#[test]
fn a_cache_holding_data_of_max_aus_folds_the_oldest_before_one_more() {
    let mut c = Card::new(FtlModel {
        slc_cache: Some(SlcCacheModel {
            max_write_bytes: 8192,
            capacity_bytes: 1 << 20,
            max_aus: 2,
        }),
        ..ftl_model()
    });
    c.fill(0..4);
    for au in 0..2 {
        c.write(au * AU + 3 * WU, WU);
    }
    assert_eq!(c.ftl.slc_aus(), 2);
    // A third AU: AU 0 is folded first (copy all 16 units, erase the old copy).
    let t = c.write(2 * AU + 3 * WU, WU);
    assert_eq!(t, 2 * XFER_PAGE + T_PROG + 16 * WU_COPY + T_ERASE);
    assert_eq!(c.ftl.slc_aus(), 2);
    assert_eq!(c.ftl.debt_ns(), 2 * (16 * WU_COPY + T_ERASE));
    // More data of an AU already cached folds nothing.
    assert_eq!(c.write(2 * AU + 5 * WU, WU), 2 * XFER_PAGE + T_PROG);
}

#[test]
fn work_until_stops_at_the_target() {
    let mut c = Card::new(slc());
    c.fill(0..4);
    for au in 0..4 {
        c.write(au * AU + 3 * WU, WU);
    }
    let fold = 16 * WU_COPY + T_ERASE;
    let t = c.ftl.work_until(&mut c.nand, 2 * fold);
    assert_eq!(t, 2 * fold);
    assert_eq!(c.ftl.debt_ns(), 2 * fold);
    assert_eq!(c.counters().foreground_ns, 2 * fold);
}

#[test]
fn a_stream_resumes_after_its_au_was_evicted() {
    // The SLC cache takes random writes; a write continuing an evicted AU's stream is
    // still sequential and goes to the AU (so too many open AUs keep collecting).
    let mut c = Card::new(FtlModel {
        open_aus_linear: 1,
        ..slc()
    });
    c.fill(0..2);
    c.write(0, WU); // AU 0 open, stream at WU 1
    c.write(AU, WU); // AU 1 evicts AU 0
    let slc_before = c.counters().slc_writes;
    c.write(WU, WU); // continues AU 0's stream
    assert_eq!(
        c.counters().slc_writes,
        slc_before,
        "sequential, not cached"
    );
}

#[test]
fn sequential_writes_to_the_au_pay_their_extra_time_once_per_command() {
    let mut c = Card::new(FtlModel {
        sequential_write_ns: 7,
        ..ftl_model()
    });
    assert_eq!(c.write(0, 2 * WU), 2 * WU_PROGRAM + 7);
    assert_eq!(c.write(2 * WU, WU), WU_PROGRAM + 7);
    c.write(AU + 5 * WU, WU); // a new AU's first write starts a stream too
    assert_eq!(c.write(AU + 2 * WU, WU), WU_PROGRAM, "random: no extra");
}

#[test]
fn unmapped_data_is_not_copied_and_empty_aus_are_erased() {
    let mut c = Card::new(ftl_model());
    c.fill(0..3);
    c.write(0, WU);
    c.write(AU, WU);
    // Trim half of AU 1: its collection copies 7 units instead of 15.
    c.ftl.unmap(&mut c.nand, AU + 8 * WU, 2 * AU, false);
    let t = c.write(2 * AU, WU); // evicts AU 0 (LRU) …
    assert_eq!(t, WU_PROGRAM + 15 * WU_COPY + T_ERASE);
    c.write(0, WU); // … and AU 0 back evicts AU 1
    assert_eq!(c.counters().gc_copied_units, 15 + 7);
    // A closed AU unmapped entirely is erased at once.
    let erases = c.nand.counters.blocks_erased;
    assert_eq!(c.ftl.unmap(&mut c.nand, 3 * AU, 3 * AU, false), 0);
    c.fill(5..6);
    assert_eq!(c.ftl.unmap(&mut c.nand, 5 * AU, 6 * AU, false), T_ERASE);
    assert!(c.nand.counters.blocks_erased > erases);
}

#[test]
fn purging_collects_every_au_the_range_touches() {
    let mut c = Card::new(ftl_model());
    c.fill(0..2);
    let t = c.ftl.unmap(&mut c.nand, WU, 2 * WU, true);
    assert_eq!(t, 15 * WU_COPY + T_ERASE);
    assert_eq!(c.counters().gc_runs, 1);
}

#[test]
fn a_special_region_is_page_mapped() {
    let mut c = Card::new(FtlModel {
        special_region: Some(SpecialRegionModel {
            offset_bytes: 0,
            length_bytes: AU * 512,
        }),
        ..ftl_model()
    });
    c.fill(1..2);
    // Random pages are as cheap as linear ones, and open no AU …
    assert_eq!(c.write(3 * PAGE, PAGE), XFER_PAGE + T_PROG);
    assert_eq!(c.ftl.open_aus(), 0);
    // … but a linear write unit costs two single-page programs, not one.
    assert_eq!(c.write(0, WU), 2 * (XFER_PAGE + T_PROG));
    assert_eq!(c.write(AU, WU), WU_PROGRAM, "outside: a normal AU write");
}

#[test]
fn erases_count_per_physical_au_and_write_amplification_shows_in_the_nand() {
    let mut c = Card::new(ftl_model());
    for _ in 0..3 {
        c.fill(0..1);
    }
    let (max, min, _) = c.ftl.pe_cycles();
    assert_eq!(
        (max, min),
        (1, 0),
        "each rewrite erases a different physical AU"
    );
    assert_eq!(c.nand.counters.pages_programmed, 3 * 16 * 2);
    // A collection programs pages the host did not write.
    c.fill(1..4);
    c.write(AU, WU);
    c.write(2 * AU, WU);
    c.write(3 * AU, WU);
    assert!(c.nand.counters.pages_programmed > (3 * 16 + 3 * 16 + 3) * 2);
}

#[test]
fn a_32_gib_card_keeps_its_state_small() {
    let nand = NandModel {
        page_bytes: 8192,
        planes: 2,
        dies: 2,
        ..nand_model()
    };
    let m = FtlModel {
        allocation_unit_bytes: 4 << 20,
        open_aus_linear: 7,
        open_aus_random: 7,
        buffer_a: Some(BufferAModel {
            rule: BufferARule::PageSpan,
            run_limit_bytes: 0,
            reliable_breaks_run: true,
            log_pages: 512,
            index_page: true,
            pages_per_au: 64,
        }),
        ..ftl_model()
    };
    let sectors = 32u64 << 30 >> 9;
    let mut ftl = Ftl::new(&m, &nand, sectors, 0);
    let mut n = Nand::new(&nand, 0);
    for i in 0..20_000u64 {
        let s = (i * 7919 * 64) % sectors;
        ftl.write(&mut n, s, 64, false);
    }
    let bytes = ftl.memory_bytes();
    assert!(bytes < 4 << 20, "{bytes} bytes of FTL state");
    // With tiny AUs the index is the largest part and still fits.
    let small = FtlModel {
        allocation_unit_bytes: 32 << 10,
        ..m
    };
    let ftl = Ftl::new(&small, &nand, sectors, 0);
    assert!(ftl.memory_bytes() < 16 << 20, "{}", ftl.memory_bytes());
}
