//! Data path: every partition, closed- and open-ended transfers, reliable write rules,
//! packed commands, the erase family.

mod common;

use common::{ext, pattern, Host};
use emmc_card::packed::{Direction, Entry, Header};
use emmc_card::{r1, CardState, Partition, PowerDown};

const RELIABLE: u32 = 1 << 31;
const PACKED: u32 = 1 << 30;
const FORCED: u32 = 1 << 24;

fn peek(h: &mut Host, p: Partition, lba: u64, blocks: usize) -> Vec<u8> {
    let mut buf = vec![0u8; blocks * 512];
    h.card.peek(p, lba, &mut buf).unwrap();
    buf
}

/// Partition GP1 = 2 WP groups, GP3 = 1, completed, power-cycled, re-initialised.
fn with_gp_partitions(h: &mut Host) {
    h.switch_ok(ext::GP_SIZE_MULT, 2);
    h.switch_ok(ext::GP_SIZE_MULT + 6, 1);
    h.switch_ok(ext::PARTITION_SETTING_COMPLETED, 1);
    // Not in effect before the power cycle.
    assert_eq!(h.card.partition_sectors(Partition::Gp(0)), 0);
    h.card.power_cycle(h.now, PowerDown::Clean);
    h.init();
}

#[test]
fn read_write_verify_on_every_partition_closed_open_and_single() {
    let mut h = Host::ready(common::model());
    with_gp_partitions(&mut h);
    let group = 1024; // HC WP group: 1 × 512 KiB
    assert_eq!(h.card.partition_sectors(Partition::Gp(0)), 2 * group);
    assert_eq!(h.card.partition_sectors(Partition::Gp(1)), 0);
    assert_eq!(h.card.partition_sectors(Partition::Gp(2)), group);
    let e = h.ext_csd();
    let sec_count = u32::from_le_bytes(e[ext::SEC_COUNT..ext::SEC_COUNT + 4].try_into().unwrap());
    assert_eq!(
        u64::from(sec_count),
        15_269_888 - 3 * group,
        "SEC_COUNT shrinks by the GP sizes"
    );

    let parts = [
        Partition::User,
        Partition::Boot1,
        Partition::Boot2,
        Partition::Gp(0),
        Partition::Gp(2),
    ];
    for (tag, &p) in parts.iter().enumerate() {
        h.select_partition(p);
        let last = h.card.partition_sectors(p) - 1;
        let tag = tag as u8 * 3;
        let a = pattern(tag, 16);
        let b = pattern(tag + 1, 5);
        let c = pattern(tag + 2, 1);
        assert_eq!(h.write(0, &a, 0) & r1::ERRORS, 0, "{p:?}");
        assert_eq!(h.write_open_ended(last - 4, &b) & r1::ERRORS, 0, "{p:?}");
        assert_eq!(h.write_single(100, &c) & r1::ERRORS, 0, "{p:?}");
        assert_data_eq!(h.read(0, 16), a, "{p:?} closed-ended");
        assert_data_eq!(h.read_open_ended(last - 4, 5), b, "{p:?} open-ended");
        assert_data_eq!(h.read_single(100), c, "{p:?} single");
    }
    // Each partition kept its own data: they do not alias.
    for (tag, &p) in parts.iter().enumerate() {
        assert_data_eq!(peek(&mut h, p, 0, 16), pattern(tag as u8 * 3, 16), "{p:?}");
    }
}

#[test]
fn transfers_past_the_partition_end_report_address_out_of_range() {
    let mut h = Host::ready(common::model());
    h.select_partition(Partition::Boot1);
    let size = h.card.partition_sectors(Partition::Boot1);
    // Closed-ended: refused in the response itself, no data phase, nothing written.
    h.r1(23, 4);
    let s = h.r1(25, h.addr(size - 2));
    assert_ne!(s & r1::ADDRESS_OUT_OF_RANGE, 0);
    assert_eq!(h.card.state(), CardState::Tran);
    // Open-ended read running off the end: data stops, CMD12 reports it.
    h.r1(18, h.addr(size - 2));
    let mut buf = vec![0u8; 4 * 512];
    let err = h.card.read_data(h.now, &mut buf).unwrap_err();
    assert!(
        matches!(err, emmc_card::DataError::Stopped { blocks_done: 2, .. }),
        "{err:?}"
    );
    let s = h.r1(12, 0);
    assert_ne!(s & r1::ADDRESS_OUT_OF_RANGE, 0, "{}", r1::describe(s));
    assert_eq!(
        h.status() & r1::ADDRESS_OUT_OF_RANGE,
        0,
        "cleared once reported"
    );
    // Open-ended write running off the end: the blocks inside land, the rest is refused.
    h.r1(25, h.addr(size - 1));
    let data = pattern(9, 3);
    assert!(h.card.write_data(h.now, &data).is_err());
    let s = h.r1b(12, 0);
    assert_ne!(s & r1::ADDRESS_OUT_OF_RANGE, 0, "{}", r1::describe(s));
    assert_data_eq!(peek(&mut h, Partition::Boot1, size - 1, 1), data[..512]);
}

#[test]
fn legacy_reliable_write_accepts_only_rel_wr_sec_c_aligned_or_single_blocks() {
    let mut model = common::model();
    model.ext_csd.wr_rel_param = 0x01; // legacy: EN_REL_WR clear
    model.ext_csd.rel_wr_sec_c = 8;
    let mut h = Host::ready(model);
    let before = peek(&mut h, Partition::User, 0, 32);
    for (lba, blocks) in [(0u64, 4usize), (4, 8), (8, 16), (3, 8)] {
        let s = h.write(lba, &pattern(1, blocks), RELIABLE);
        assert_ne!(
            s & r1::ADDRESS_MISALIGN,
            0,
            "{blocks} blocks at {lba}: {}",
            r1::describe(s)
        );
        assert_eq!(h.card.state(), CardState::Tran, "no data phase");
    }
    assert_data_eq!(
        peek(&mut h, Partition::User, 0, 32),
        before,
        "rejected writes wrote nothing"
    );
    assert_eq!(
        h.write(8, &pattern(2, 8), RELIABLE) & r1::ERRORS,
        0,
        "8 aligned blocks"
    );
    assert_eq!(
        h.write(21, &pattern(3, 1), RELIABLE) & r1::ERRORS,
        0,
        "one block anywhere"
    );
    assert_data_eq!(peek(&mut h, Partition::User, 8, 8), pattern(2, 8));
    assert_data_eq!(peek(&mut h, Partition::User, 21, 1), pattern(3, 1));
}

#[test]
fn enhanced_reliable_write_takes_any_size_and_alignment() {
    let mut h = Host::ready(common::model());
    assert_eq!(h.write(3, &pattern(4, 13), RELIABLE) & r1::ERRORS, 0);
    assert_data_eq!(peek(&mut h, Partition::User, 3, 13), pattern(4, 13));
    assert!(
        h.card.volatile_sectors().is_empty(),
        "reliable writes are durable on completion"
    );
}

fn packed_write(h: &mut Host, entries: &[(u64, usize, bool)], tag: u8) -> (u32, Vec<Vec<u8>>) {
    let header = Header {
        direction: Direction::Write,
        entries: entries
            .iter()
            .map(|&(lba, n, rel)| Entry::new(n as u16, h.addr(lba), rel))
            .collect(),
    };
    let mut data = header.encode().to_vec();
    let mut payloads = Vec::new();
    for (i, &(_, n, _)) in entries.iter().enumerate() {
        let p = pattern(tag.wrapping_add(i as u8), n);
        data.extend_from_slice(&p);
        payloads.push(p);
    }
    let total = data.len() / 512;
    h.r1(23, PACKED | total as u32);
    let first = h.addr(entries[0].0);
    let s = h.r1(25, first);
    assert_eq!(s & r1::ERRORS, 0, "{}", r1::describe(s));
    h.card.write_data(h.now, &data).unwrap();
    h.wait_busy();
    (h.status(), payloads)
}

#[test]
fn packed_write_of_n_entries_lands_block_by_block() {
    let mut h = Host::ready(common::model());
    let entries = [
        (5000u64, 8usize, false),
        (100, 1, false),
        (7000, 16, true),
        (2, 3, false),
        (9000, 64, false),
    ];
    let (status, payloads) = packed_write(&mut h, &entries, 40);
    assert_eq!(
        status & (r1::ERRORS | r1::EXCEPTION_EVENT),
        0,
        "{}",
        r1::describe(status)
    );
    for (&(lba, n, _), p) in entries.iter().zip(&payloads) {
        for b in 0..n {
            assert_data_eq!(
                peek(&mut h, Partition::User, lba + b as u64, 1),
                p[b * 512..(b + 1) * 512],
                "entry at {lba}, block {b}"
            );
        }
    }
    let e = h.ext_csd();
    assert_eq!(e[ext::PACKED_COMMAND_STATUS], 0);
    assert_eq!(h.card.stats().packed_writes, 1);
    // The reliable entry went straight to the medium; the others sit in the cache.
    let volatile: u64 = h.card.volatile_sectors().iter().map(|r| r.1).sum();
    assert_eq!(volatile, 8 + 1 + 3 + 64);
}

#[test]
fn packed_write_entry_failure_reports_its_index_and_writes_only_earlier_entries() {
    let mut h = Host::ready(common::model());
    let size = h.card.partition_sectors(Partition::User);
    let entries = [
        (10u64, 4usize, false),
        (20, 4, false),
        (size - 2, 4, false),
        (30, 4, false),
    ];
    let before = peek(&mut h, Partition::User, 30, 4);
    let (status, payloads) = packed_write(&mut h, &entries, 80);
    assert_ne!(
        status & r1::EXCEPTION_EVENT,
        0,
        "PACKED_EVENT_EN raises EXCEPTION_EVENT"
    );
    assert_ne!(
        status & r1::ADDRESS_OUT_OF_RANGE,
        0,
        "{}",
        r1::describe(status)
    );
    let e = h.ext_csd();
    assert_eq!(e[ext::PACKED_COMMAND_STATUS], 0x03, "error + indexed error");
    assert_eq!(e[ext::PACKED_FAILURE_INDEX], 3);
    assert_eq!(
        e[ext::EXCEPTION_EVENTS_STATUS] & 0x08,
        0x08,
        "PACKED_FAILURE"
    );
    assert_data_eq!(peek(&mut h, Partition::User, 10, 4), payloads[0]);
    assert_data_eq!(peek(&mut h, Partition::User, 20, 4), payloads[1]);
    assert_data_eq!(
        peek(&mut h, Partition::User, 30, 4),
        before,
        "entries after the failure not written"
    );
    // The next packed command clears the failure.
    let (status, _) = packed_write(&mut h, &[(40, 1, false), (50, 1, false)], 90);
    assert_eq!(status & r1::EXCEPTION_EVENT, 0);
    assert_eq!(h.ext_csd()[ext::PACKED_COMMAND_STATUS], 0);
}

#[test]
fn every_malformed_packed_header_fails_the_whole_command_and_writes_nothing() {
    let good = Header {
        direction: Direction::Write,
        entries: vec![Entry::new(2, 200, false), Entry::new(2, 300, false)],
    }
    .encode();
    let mut cases: Vec<(&str, [u8; 512], u32)> = Vec::new();
    let mut b = good;
    b[0] = 2;
    cases.push(("version", b, 5));
    let mut b = good;
    b[1] = 0x03;
    cases.push(("R/W byte", b, 5));
    let mut b = good;
    b[2] = 0;
    cases.push(("zero entries", b, 5));
    let mut b = good;
    b[2] = 64;
    cases.push(("more entries than MAX_PACKED_WRITES", b, 5));
    let mut b = good;
    b[4] = 1;
    cases.push(("reserved bytes", b, 5));
    let mut b = good;
    b[11] |= 0x40;
    cases.push(("packed bit in an entry", b, 5));
    let mut b = good;
    b[8] = 0;
    b[9] = 0;
    cases.push(("empty entry", b, 5));
    cases.push(("block count mismatch", good, 6));
    for (what, header, total) in cases {
        let mut h = Host::ready(common::model());
        let before = peek(&mut h, Partition::User, 200, 120);
        let mut data = header.to_vec();
        data.extend_from_slice(&pattern(3, total as usize - 1));
        h.r1(23, PACKED | total);
        assert_eq!(h.r1(25, 200) & r1::ERRORS, 0, "{what}");
        h.card.write_data(h.now, &data).unwrap();
        h.wait_busy();
        let s = h.status();
        assert_ne!(s & r1::EXCEPTION_EVENT, 0, "{what}: {}", r1::describe(s));
        let e = h.ext_csd();
        assert_eq!(
            e[ext::PACKED_COMMAND_STATUS],
            0x01,
            "{what}: error without index"
        );
        assert_eq!(e[ext::EXCEPTION_EVENTS_STATUS] & 0x08, 0x08, "{what}");
        assert_data_eq!(
            peek(&mut h, Partition::User, 200, 120),
            before,
            "{what}: nothing written"
        );
        assert!(
            h.card.volatile_sectors().is_empty(),
            "{what}: nothing cached"
        );
    }
}

#[test]
fn packed_read_streams_the_entries_in_header_order() {
    let mut h = Host::ready(common::model());
    let a = pattern(1, 4);
    let b = pattern(2, 2);
    h.write(500, &a, 0);
    h.write(60, &b, 0);
    let header = Header {
        direction: Direction::Read,
        entries: vec![Entry::new(4, 500, false), Entry::new(2, 60, false)],
    };
    h.r1(23, PACKED | 1);
    assert_eq!(h.r1(25, 500) & r1::ERRORS, 0);
    h.card.write_data(h.now, &header.encode()).unwrap();
    h.wait_busy();
    h.r1(23, PACKED | 6);
    assert_eq!(h.r1(18, 500) & r1::ERRORS, 0);
    let mut buf = vec![0u8; 6 * 512];
    h.card.read_data(h.now, &mut buf).unwrap();
    assert_data_eq!(&buf[..2048], &a[..]);
    assert_data_eq!(&buf[2048..], &b[..]);
    assert_eq!(h.card.state(), CardState::Tran);
    // A packed CMD18 whose count does not match the header fails without data.
    h.r1(23, PACKED | 1);
    h.r1(25, 500);
    h.card.write_data(h.now, &header.encode()).unwrap();
    h.wait_busy();
    h.r1(23, PACKED | 5);
    assert_ne!(h.r1(18, 500) & r1::ERROR, 0);
    assert_eq!(h.card.state(), CardState::Tran);
}

#[test]
fn erase_trim_discard_and_sanitize_leave_the_erased_pattern_where_the_spec_says() {
    let mut h = Host::ready(common::model());
    let group = 1024u64;
    let fill = |h: &mut Host| {
        for g in 0..3 {
            h.write(g * group, &pattern(g as u8 + 1, group as usize), FORCED);
        }
    };
    // Erase acts on whole erase groups containing the range.
    fill(&mut h);
    let s = h.erase(group + 10, group + 20, 0x0000_0000);
    assert_eq!(s & r1::ERRORS, 0, "{}", r1::describe(s));
    assert_data_eq!(
        peek(&mut h, Partition::User, 0, group as usize),
        pattern(1, group as usize)
    );
    assert!(peek(&mut h, Partition::User, group, group as usize)
        .iter()
        .all(|&b| b == 0));
    assert_data_eq!(peek(&mut h, Partition::User, 2 * group, 1), pattern(3, 1));
    // Trim and discard act on exactly the sectors given.
    for arg in [0x0000_0001u32, 0x0000_0003] {
        fill(&mut h);
        h.erase(5, 9, arg);
        assert_data_eq!(
            peek(&mut h, Partition::User, 4, 1),
            pattern(1, 5)[2048..2560]
        );
        assert!(
            peek(&mut h, Partition::User, 5, 5).iter().all(|&b| b == 0),
            "arg {arg:#x}"
        );
        assert_data_eq!(
            peek(&mut h, Partition::User, 10, 1),
            pattern(1, 11)[5120..5632]
        );
    }
    // Secure erase: whole groups.
    fill(&mut h);
    h.erase(0, 0, 0x8000_0000);
    assert!(peek(&mut h, Partition::User, 0, group as usize)
        .iter()
        .all(|&b| b == 0));
    // Secure trim: step 1 only marks, step 2 purges.
    fill(&mut h);
    h.erase(7, 8, 0x8000_0001);
    assert_data_eq!(
        peek(&mut h, Partition::User, 7, 2),
        pattern(1, 9)[3584..4608],
        "marked, not yet purged"
    );
    h.erase(7, 8, 0x8000_8000);
    assert!(peek(&mut h, Partition::User, 7, 2).iter().all(|&b| b == 0));
    // Sanitize purges what a secure trim marked.
    fill(&mut h);
    h.erase(30, 30, 0x8000_0001);
    h.switch_ok(ext::SANITIZE_START, 1);
    assert!(peek(&mut h, Partition::User, 30, 1).iter().all(|&b| b == 0));
    // Erasing cached data: the cached copy must not come back on flush.
    h.write(40, &pattern(5, 1), 0);
    assert!(!h.card.volatile_sectors().is_empty());
    h.erase(40, 40, 0x0000_0001);
    h.switch_ok(ext::FLUSH_CACHE, 1);
    assert!(peek(&mut h, Partition::User, 40, 1).iter().all(|&b| b == 0));
}

#[test]
fn erased_memory_reads_ff_when_erased_mem_cont_says_so() {
    let mut model = common::model();
    model.ext_csd.erased_mem_cont = 1;
    let mut h = Host::ready(model);
    assert_eq!(h.ext_csd()[181], 1);
    h.write(0, &pattern(1, 4), FORCED);
    h.erase(1, 2, 0x0000_0001);
    let got = peek(&mut h, Partition::User, 0, 4);
    assert_data_eq!(&got[..512], &pattern(1, 4)[..512]);
    assert!(got[512..1536].iter().all(|&b| b == 0xFF));
    assert_data_eq!(&got[1536..], &pattern(1, 4)[1536..]);
}

#[test]
fn erase_sequence_errors() {
    let mut h = Host::ready(common::model());
    let s = h.r1(38, 0);
    assert_ne!(s & r1::ERASE_SEQ_ERROR, 0, "CMD38 without CMD35/36");
    h.wait_busy();
    let s = h.r1(36, 10);
    assert_ne!(s & r1::ERASE_SEQ_ERROR, 0, "CMD36 without CMD35");
    h.r1(35, 10);
    let s = h.r1(17, 0);
    assert_ne!(
        s & r1::ERASE_RESET,
        0,
        "another command resets the sequence"
    );
    let mut b = [0u8; 512];
    h.card.read_data(h.now, &mut b).unwrap();
    let s = h.r1(38, 0);
    assert_ne!(s & r1::ERASE_SEQ_ERROR, 0);
    h.wait_busy();
    h.r1(35, 20);
    h.r1(36, 10);
    h.r1b(38, 0);
    assert_ne!(h.status() & r1::ERASE_PARAM, 0, "end before start");
    let size = h.card.partition_sectors(Partition::User);
    assert_ne!(h.r1(35, size as u32) & r1::ADDRESS_OUT_OF_RANGE, 0);
}
